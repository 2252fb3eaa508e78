// Event ids as the broker writes them (PROTOCOL §1): `<epoch>-<ms>-<seq>`, the epoch 8 lowercase
// hex digits, then the log position (the memory log uses `0-<n>`). Clients treat ids as opaque
// except for one question this package must answer: has the thread's stream reached a given id?

interface ParsedId {
  epoch: string;
  ms: bigint;
  seq: bigint;
}

function parse(id: string): ParsedId | undefined {
  const m = /^([0-9a-f]{8})-([0-9]+)-([0-9]+)$/.exec(id);
  if (!m) return undefined;
  return { epoch: m[1]!, ms: BigInt(m[2]!), seq: BigInt(m[3]!) };
}

/**
 * Compares two event ids of one thread: negative when `a` is before `b`, 0 when equal,
 * positive after; `undefined` when they cannot be ordered (another epoch, a bridge mark, not
 * an id of the broker's form).
 */
export function compareIds(a: string, b: string): number | undefined {
  const x = parse(a);
  const y = parse(b);
  if (!x || !y || x.epoch !== y.epoch) return undefined;
  if (x.ms !== y.ms) return x.ms < y.ms ? -1 : 1;
  if (x.seq !== y.seq) return x.seq < y.seq ? -1 : 1;
  return 0;
}
