// The memory target: a broker's peak RSS must stay within a bound computed from its
// configuration and what the experiment opened, never grow with what clients send or hold.
//
//   bound = idle RSS (measured at start) + BASE_ALLOWANCE
//         + subscriber connections × (queue.max_bytes + PER_CONNECTION_OVERHEAD)
//         + other connections × PER_CONNECTION_OVERHEAD
//         + bodies budget
//         + threads × FOLD_FACTOR × the fold's size (the /snapshot JSON)
//
// This is the broker's own formula (docs/ARCHITECTURE.md "Memory"): connections × the
// per-connection bound (the queue's byte bound; drains and preludes share the thread's bytes,
// so they add no per-connection copy) + the node's budget for request bodies in flight
// (`limits.bodies_in_flight_bytes`) + folds.

/**
 * The configuration every broker of the suite runs with, passed as `AGUI_*` variables (today's
 * defaults from config/default.toml, written out so the bound uses the values the broker has).
 */
export const BROKER_CONFIG = {
  queueMaxEvents: 4096,
  queueMaxBytes: 4_194_304,
  maxEventBytes: 1_048_576,
  maxBodyBytes: 16_777_216,
  bodiesBudgetBytes: 67_108_864, // limits.bodies_in_flight_bytes (its default)
  sseRetryMs: 2000,
  shutdownDrain: "5s",
};

/** The `AGUI_*` environment for `BROKER_CONFIG`. */
export function brokerEnv(config = BROKER_CONFIG) {
  const env = {
    AGUI_QUEUE__MAX_EVENTS: String(config.queueMaxEvents),
    AGUI_QUEUE__MAX_BYTES: String(config.queueMaxBytes),
    AGUI_LIMITS__MAX_EVENT_BYTES: String(config.maxEventBytes),
    AGUI_LIMITS__MAX_BODY_BYTES: String(config.maxBodyBytes),
    AGUI_SSE__RETRY_MS: String(config.sseRetryMs),
    AGUI_SHUTDOWN__DRAIN: config.shutdownDrain,
  };
  if (config.bodiesBudgetBytes !== null) env.AGUI_LIMITS__BODIES_IN_FLIGHT_BYTES = String(config.bodiesBudgetBytes);
  return env;
}

/** Runtime, allocator arenas and buffers that grow once under load: a fixed allowance. */
export const BASE_ALLOWANCE = 32 * 1024 * 1024;
/** A connection's own state besides its queue: socket buffers in user space, parser, task. */
export const PER_CONNECTION_OVERHEAD = 64 * 1024;
/** A fold is held a few times (the hub's, the ingest's copy, a prelude being built). */
export const FOLD_FACTOR = 4;

/**
 * The bound for one broker process, in bytes, and how it was made (for the notes).
 *
 * @param {object} o
 * @param {number} o.idleRss the process's RSS right after start
 * @param {number} o.subscribers subscriber connections it may hold
 * @param {number} o.others other connections (publishers, bodies, slowloris, fuzz)
 * @param {number} o.threads threads it follows
 * @param {number} o.foldBytes the largest thread's `/snapshot` JSON size
 */
export function memoryBound({ idleRss, subscribers, others, threads, foldBytes }, config = BROKER_CONFIG) {
  const bodies = config.bodiesBudgetBytes ?? config.maxBodyBytes;
  const parts = {
    idle: idleRss,
    allowance: BASE_ALLOWANCE,
    subscribers: subscribers * (config.queueMaxBytes + PER_CONNECTION_OVERHEAD),
    others: others * PER_CONNECTION_OVERHEAD,
    bodies,
    folds: threads * FOLD_FACTOR * foldBytes,
  };
  const bound = Object.values(parts).reduce((a, b) => a + b, 0);
  return { bound, parts };
}

/** Bytes as MiB with one decimal. */
export function mib(bytes) {
  return `${(bytes / 1048576).toFixed(1)} MiB`;
}
