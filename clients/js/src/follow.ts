// Following one thread's log (`GET /v1/threads/{threadId}/events`, PROTOCOL §2 "Subscribe")
// through any number of connections: what an `EventSource` does, over fetch streaming (so that
// every reconnect can carry a fresh token in a header), in batches that a reconnect can never
// split.
//
// A batch ends at each frame that carries an `id:`. Live events carry one each; a prelude or a
// bridge carries one only on its last event (and a bridge also on its first), so a prelude is
// always handed over whole, and a connection cut inside one hands over nothing of it: the
// reconnect with the last complete id gets it again (PROTOCOL §3, §5).

import type { BaseEvent } from "@ag-ui/client";
import { readSse } from "./sse.js";
import { jwtExpiryMs, resolveToken, type TokenSource } from "./token.js";

/** The metadata key of the broker's marks (PROTOCOL §5 "Prelude"). */
export const FANOUT_METADATA_KEY = "agui-fanout";

/** Whether `event` is the `RUN_STARTED` that opens a prelude (PROTOCOL §5, §4.3). */
export function isPreludeStart(event: BaseEvent): boolean {
  if (event.type !== "RUN_STARTED") return false;
  const meta = (event as { metadata?: Record<string, unknown> }).metadata;
  const mark = meta?.[FANOUT_METADATA_KEY] as { prelude?: unknown } | undefined;
  return mark?.prelude === true;
}

/** Events up to and including one numbered frame. */
export interface Batch {
  /** The events, in stream order (at least one). */
  events: BaseEvent[];
  /** The id of the batch's last frame: where a reconnect resumes after it. */
  id: string;
}

/** What a connection attempt came to; for an app's "reconnecting…" indicator. */
export type ConnectionState =
  | { state: "open"; lastEventId?: string }
  | { state: "closed"; reason: "ended" | "refresh" | "error"; error?: unknown }
  | { state: "waiting"; delayMs: number; error?: unknown };

/** How a [`ThreadFollower`] reaches the broker. */
export interface FollowerOptions {
  /** The broker's base URL, e.g. `https://broker.example` (no trailing path). */
  url: string;
  threadId: string;
  /** Extra request headers, read at every connection. */
  headers: () => Record<string, string>;
  token?: TokenSource;
  fetch: (url: string, init: RequestInit) => Promise<Response>;
  /** Reconnect delay until the broker's `retry:` says otherwise, ms. */
  retryMs: number;
  /** Longest delay between failed attempts (they back off exponentially up to it), ms. */
  maxRetryMs: number;
  /** Reconnect this long before a token's `exp` (at most half its remaining life), ms. */
  refreshMarginMs: number;
  /** Told about every connection change. */
  onConnection?: (state: ConnectionState) => void;
  /** Told about every comment line (`: agui-fanout: …`, for people; never parsed). */
  onComment?: (text: string) => void;
}

/** An error the follower cannot get past by reconnecting (a 4xx other than a refreshed 401). */
export class FollowError extends Error {
  constructor(
    message: string,
    /** The HTTP status, when the broker answered one. */
    readonly status?: number,
    /** The broker's JSON error body (`{"error": {"code", "message", …}}`), when it sent one. */
    readonly payload?: unknown,
  ) {
    super(message);
    this.name = "FollowError";
  }
}

/** Statuses worth another attempt later: the broker or a proxy is busy, starting or away. */
function retryable(status: number): boolean {
  return status === 408 || status === 425 || status === 429 || status >= 500;
}

/** Waits `ms`, or until `signal` aborts. */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done);
  });
}

async function errorOf(response: Response): Promise<FollowError> {
  const text = await response.text().catch(() => "");
  let payload: unknown = text;
  try {
    payload = JSON.parse(text);
  } catch {
    // Not JSON: keep the text.
  }
  const detail = (payload as { error?: { code?: string; message?: string } })?.error;
  const what = detail?.code ? `${detail.code}: ${detail.message ?? ""}` : text.slice(0, 200);
  return new FollowError(`HTTP ${response.status} from the broker (${what})`, response.status, payload);
}

/**
 * One thread's event stream across reconnects. [`next`] hands out [`Batch`]es in log order;
 * the follower reconnects by itself with the last handed-out id (`Last-Event-ID`), waiting
 * the broker's `retry:`, backing off while attempts fail, and, with a token function,
 * reconnecting with a fresh token before the current one's `exp` (and once more on a 401).
 * Nothing is handed out twice and nothing is skipped: the broker resumes exactly after an id
 * it holds, and answers any other id with a prelude (PROTOCOL §4).
 */
export class ThreadFollower {
  /** The id of the last batch handed out: where the next connection resumes. */
  lastId: string | undefined;
  private readonly closer = new AbortController();
  private readonly source: AsyncGenerator<Batch>;
  private readonly returned: Batch[] = [];
  private retryMs: number;

  constructor(
    private readonly opts: FollowerOptions,
    startId: string | undefined,
  ) {
    this.lastId = startId;
    this.retryMs = opts.retryMs;
    this.source = this.batches();
  }

  /** Whether [`close`] was called. */
  get closed(): boolean {
    return this.closer.signal.aborted;
  }

  /**
   * The next batch; `undefined` once closed.
   * @throws FollowError when the broker refuses the stream for good (400, 401 after a
   * refresh, 403, 404).
   */
  async next(): Promise<Batch | undefined> {
    const back = this.returned.shift();
    if (back) return back;
    if (this.closed) return undefined;
    const r = await this.source.next();
    return r.done ? undefined : r.value;
  }

  /** Puts a batch back, to be the next one [`next`] returns. */
  unshift(batch: Batch): void {
    this.returned.unshift(batch);
  }

  /** Stops following: aborts the open request; [`next`] returns `undefined` from then on. */
  close(): void {
    this.closer.abort();
    // Runs the generator's `finally` (cancels the body reader) once it is not busy.
    void this.source.return(undefined).catch(() => {});
  }

  private url(): string {
    const base = this.opts.url.replace(/\/+$/, "");
    return `${base}/v1/threads/${encodeURIComponent(this.opts.threadId)}/events`;
  }

  /** The delay before the `failures`-th consecutive failed attempt is retried, ms. */
  private backoff(failures: number): number {
    const grown = this.retryMs * 2 ** Math.min(failures - 1, 16);
    const capped = Math.min(Math.max(this.opts.maxRetryMs, this.retryMs), grown);
    // Jitter (½× to 1×), so that clients cut at once do not all come back at once.
    return Math.round(capped * (0.5 + Math.random() / 2));
  }

  private async wait(delayMs: number, error?: unknown): Promise<void> {
    this.opts.onConnection?.({ state: "waiting", delayMs, error });
    await sleep(delayMs, this.closer.signal);
  }

  private async *batches(): AsyncGenerator<Batch> {
    let failures = 0;
    // A 401 is answered by one refresh of a token function, then a new attempt.
    let refreshedAfter401 = false;
    while (!this.closed) {
      let token: string | undefined;
      try {
        token = await resolveToken(this.opts.token);
      } catch (error) {
        failures++;
        await this.wait(this.backoff(failures), error);
        continue;
      }
      if (this.closed) return;
      const conn = new AbortController();
      const onClose = () => conn.abort();
      this.closer.signal.addEventListener("abort", onClose);
      let refreshTimer: ReturnType<typeof setTimeout> | undefined;
      let refreshing = false;
      try {
        const headers: Record<string, string> = {
          ...this.opts.headers(),
          Accept: "text/event-stream",
        };
        if (token !== undefined) headers["Authorization"] = `Bearer ${token}`;
        if (this.lastId !== undefined) headers["Last-Event-ID"] = this.lastId;
        let response: Response;
        try {
          response = await this.opts.fetch(this.url(), {
            method: "GET",
            headers,
            cache: "no-store",
            signal: conn.signal,
          });
        } catch (error) {
          if (this.closed) return;
          failures++;
          await this.wait(this.backoff(failures), error);
          continue;
        }
        if (response.status === 401 && typeof this.opts.token === "function" && !refreshedAfter401) {
          refreshedAfter401 = true;
          await response.body?.cancel().catch(() => {});
          continue;
        }
        if (!response.ok) {
          const error = await errorOf(response);
          if (!retryable(response.status)) throw error;
          failures++;
          const after = Number(response.headers.get("retry-after"));
          const delay = Number.isFinite(after) && after > 0 ? after * 1000 : this.backoff(failures);
          await this.wait(delay, error);
          continue;
        }
        if (!response.body) throw new FollowError("the broker's answer has no body", response.status);
        refreshedAfter401 = false;
        failures = 0;
        this.opts.onConnection?.({ state: "open", lastEventId: this.lastId });
        const exp = typeof this.opts.token === "function" && token ? jwtExpiryMs(token) : undefined;
        if (exp !== undefined) {
          const left = exp - Date.now();
          const margin = Math.min(this.opts.refreshMarginMs, left / 2);
          refreshTimer = setTimeout(() => {
            refreshing = true;
            conn.abort();
          }, Math.max(0, left - margin));
        }
        let pending: BaseEvent[] = [];
        let streamError: unknown;
        try {
          for await (const item of readSse(response.body)) {
            if (item.kind === "retry") {
              this.retryMs = item.ms;
            } else if (item.kind === "comment") {
              if (item.text !== "") this.opts.onComment?.(item.text);
            } else {
              let event: unknown;
              try {
                event = JSON.parse(item.frame.data);
              } catch {
                throw new FollowError(`an SSE frame that is not JSON: ${item.frame.data.slice(0, 120)}`);
              }
              if (typeof event !== "object" || event === null || typeof (event as BaseEvent).type !== "string") {
                throw new FollowError(`an SSE frame that is not an AG-UI event: ${item.frame.data.slice(0, 120)}`);
              }
              pending.push(event as BaseEvent);
              if (item.frame.id !== undefined) {
                const batch: Batch = { events: pending, id: item.frame.id };
                pending = [];
                this.lastId = batch.id;
                yield batch;
              }
            }
          }
        } catch (error) {
          if (error instanceof FollowError) throw error;
          streamError = error;
        }
        if (this.closed) return;
        if (refreshing) {
          // The token is about to expire: straight back with a fresh one and the last id.
          this.opts.onConnection?.({ state: "closed", reason: "refresh" });
          continue;
        }
        this.opts.onConnection?.({
          state: "closed",
          reason: streamError === undefined ? "ended" : "error",
          error: streamError,
        });
        await this.wait(this.retryMs);
      } finally {
        clearTimeout(refreshTimer);
        this.closer.signal.removeEventListener("abort", onClose);
        conn.abort();
      }
    }
  }
}
