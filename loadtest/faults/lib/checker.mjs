// The checker: per subscriber, what producers had acknowledged against what the subscriber
// received. Pure functions over plain data, so they are tested on their own
// (checker.test.mjs).
//
// Counted events are the producers' numbered `CUSTOM` events: never coalesced and restated by
// no snapshot, so each one is either received or lost. For one subscriber and one producer:
//
// - duplicated: every arrival of a number after its first;
// - reordered: a first arrival whose number is below one that arrived earlier;
// - never acknowledged: a number received that no 2xx answer acknowledged;
// - lost: an acknowledged number never received. It is "lost with a signal" when, between the
//   received events around it (the highest number below it and the lowest above it, or the end
//   of what was received), the client got something that tells it it missed events: a prelude
//   (`RUN_STARTED` marked `prelude`), a bridge mark (an id ending `-bridge`) or a broker gap
//   event (a `CUSTOM` named `agui-fanout…`). Otherwise "lost silently";
// - lost though in the log: a lost number the log still holds at the end (read back from the
//   broker with `?from=start`): Redis did not lose it, the broker skipped it;
// - rolled back: a number received that the log no longer holds (a failover lost it).

/**
 * Checks one subscriber.
 *
 * @param {object} o
 * @param {Array<{seq: number|null, producer: string|null, signal: string|null}>} o.items what
 *   the subscriber received, in order, over all its connections
 * @param {string[]} o.producers the producers whose events it should receive (its thread's)
 * @param {Map<string, Map<number, object>>} o.acked producer → acknowledged numbers
 * @param {Map<string, Set<number>>|null} o.inLog producer → numbers the log holds at the end
 *   (null: unknown)
 * @returns {{lostSilently, lostSignalled, lostInLog, duplicated, reordered, neverAcked,
 *   rolledBack, samples, contexts}} counts, a few example numbers per count for the notes, and
 *   for a few `lostInLog` numbers what the subscriber received around them (ids and signals:
 *   whether its prelude was at the log's fork point or further on)
 */
export function checkSubscriber({ items, producers, acked, inLog }) {
  const out = {
    lostSilently: 0,
    lostSignalled: 0,
    lostInLog: 0,
    duplicated: 0,
    reordered: 0,
    neverAcked: 0,
    rolledBack: 0,
    samples: {},
    contexts: [],
  };
  const sample = (key, value) => {
    const list = (out.samples[key] ??= []);
    if (list.length < 5) list.push(value);
  };
  const signals = [];
  items.forEach((item, index) => {
    if (item.signal) signals.push(index);
  });
  // True when a signal arrived strictly between item indices `lo` and `hi`.
  const signalBetween = (lo, hi) => {
    const [a, b] = lo <= hi ? [lo, hi] : [hi, lo];
    return signals.some((s) => s > a && s < b);
  };

  for (const producer of producers) {
    const ack = acked.get(producer) ?? new Map();
    const log = inLog?.get(producer) ?? null;
    const first = new Map(); // number → index of its first arrival
    let highest = -Infinity;
    items.forEach((item, index) => {
      if (item.producer !== producer || item.seq === null) return;
      const n = item.seq;
      if (first.has(n)) {
        out.duplicated += 1;
        sample("duplicated", n);
        return;
      }
      first.set(n, index);
      if (n < highest) {
        out.reordered += 1;
        sample("reordered", n);
      }
      highest = Math.max(highest, n);
      if (!ack.has(n)) {
        out.neverAcked += 1;
        sample("neverAcked", n);
      }
      if (log && !log.has(n)) {
        out.rolledBack += 1;
        sample("rolledBack", n);
      }
    });
    const received = [...first.keys()].sort((a, b) => a - b);
    for (const n of [...ack.keys()].sort((a, b) => a - b)) {
      if (first.has(n)) continue;
      const below = lastBelow(received, n);
      const above = firstAbove(received, n);
      const lo = below === null ? -1 : first.get(below);
      const hi = above === null ? items.length : first.get(above);
      if (signalBetween(lo, hi)) {
        out.lostSignalled += 1;
        sample("lostSignalled", n);
      } else {
        out.lostSilently += 1;
        sample("lostSilently", n);
      }
      if (log?.has(n)) {
        out.lostInLog += 1;
        sample("lostInLog", n);
        if (out.contexts.length < 3) {
          // A prelude's first event carries no id: name the id its stream starts at (the
          // first id after the signal), which tells a fork-point prelude from one at the head.
          const between = items.slice(lo + 1, hi).flatMap((i, k, rest) => {
            if (!i.signal) return [];
            const at = i.id || rest.slice(k + 1).find((j) => j.id)?.id || "no id";
            return [`${i.signal} at ${at}`];
          });
          out.contexts.push(
            `seq ${n} (in the log): received before it ${items[lo]?.id ?? "nothing"}, then ${between.join(", ") || "no signal"}, next received ${items[hi]?.id ?? "nothing"}`,
          );
        }
      }
    }
  }
  return out;
}

/** The greatest element of sorted `list` below `n`, or null. */
function lastBelow(list, n) {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (list[mid] < n) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 ? list[lo - 1] : null;
}

/** The least element of sorted `list` above `n`, or null. */
function firstAbove(list, n) {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (list[mid] <= n) lo = mid + 1;
    else hi = mid;
  }
  return lo < list.length ? list[lo] : null;
}

/** Sums the counts of several `checkSubscriber` results (samples merged, a few kept). */
export function sumChecks(results) {
  const total = {
    lostSilently: 0,
    lostSignalled: 0,
    lostInLog: 0,
    duplicated: 0,
    reordered: 0,
    neverAcked: 0,
    rolledBack: 0,
    samples: {},
    contexts: [],
  };
  for (const r of results) {
    for (const key of Object.keys(total)) {
      if (key === "samples" || key === "contexts") continue;
      total[key] += r[key];
    }
    for (const c of r.contexts ?? []) if (total.contexts.length < 5) total.contexts.push(c);
    for (const [key, values] of Object.entries(r.samples)) {
      const list = (total.samples[key] ??= []);
      for (const v of values) if (list.length < 5 && !list.includes(v)) list.push(v);
    }
  }
  return total;
}

/** True when `a` and `b` are the same JSON value (object key order ignored). */
export function sameJson(a, b) {
  return canonical(a) === canonical(b);
}

function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value && typeof value === "object") {
    return `{${Object.keys(value)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(value ?? null);
}
