// Bearer tokens for the broker (PROTOCOL §8): a fixed string, or a function the app gives that
// returns a fresh one; and the one claim this package reads, `exp`, to reconnect before it.

/** A token, or an (async) function returning a fresh one; called before every connection. */
export type TokenSource = string | (() => string | Promise<string>);

/**
 * The `exp` claim of a JWT (RFC 7519 §4.1.4), in milliseconds since the Unix epoch, or
 * `undefined` when the token has none or is not a JWT this can read. The signature is not
 * checked: the broker checks it; this only schedules a reconnect.
 */
export function jwtExpiryMs(token: string): number | undefined {
  const parts = token.split(".");
  if (parts.length !== 3) return undefined;
  try {
    const b64 = parts[1]!.replace(/-/g, "+").replace(/_/g, "/");
    const padded = b64 + "=".repeat((4 - (b64.length % 4)) % 4);
    const bytes = Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
    const claims: unknown = JSON.parse(new TextDecoder().decode(bytes));
    if (typeof claims !== "object" || claims === null) return undefined;
    const exp = (claims as { exp?: unknown }).exp;
    return typeof exp === "number" && Number.isFinite(exp) ? exp * 1000 : undefined;
  } catch {
    return undefined;
  }
}

/** Resolves a [`TokenSource`] to a token (`undefined`: send none). */
export async function resolveToken(source: TokenSource | undefined): Promise<string | undefined> {
  if (source === undefined) return undefined;
  if (typeof source === "string") return source;
  return await source();
}
