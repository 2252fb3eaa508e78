// What one step of the rolling-deploy test did to clients, from what they recorded: the faults
// suite's checker (loadtest/faults/lib/checker.mjs) run over the events acknowledged during the
// step, the answers that would stop a browser's EventSource, the longest time a subscriber (and
// the producers) went without a new event, connections per broker, and the alerts Prometheus
// raised. Plus the table in Markdown.

import { checkSubscriber, sumChecks } from "../../../loadtest/faults/lib/checker.mjs";
import { Producer } from "../../../loadtest/faults/lib/producer.mjs";
import { Subscriber } from "../../../loadtest/faults/lib/subscriber.mjs";

/** A faults-suite producer that also notes when each counted event was acknowledged. */
export class TimedProducer extends Producer {
  async publish(event, seq = null) {
    const ok = await super.publish(event, seq);
    if (ok && seq !== null) this.acked.get(seq).at = Date.now();
    return ok;
  }
}

/** A faults-suite subscriber (npm `eventsource`) that also notes each event's arrival time. */
export class TimedSubscriber extends Subscriber {
  open(url) {
    super.open(url);
    // Registered after the base class's listener, so the item it pushed is the last one.
    this.es.addEventListener("message", () => {
      const item = this.conns.at(-1)?.items.at(-1);
      if (item) item.at = Date.now();
    });
  }
}

/** `agui_connections` of a broker's `/metrics`, null when it does not answer. */
export async function connections(broker) {
  try {
    const text = await (await fetch(`${broker.base}/metrics`, { signal: AbortSignal.timeout(3000) })).text();
    const m = /^agui_connections(?:\{[^}]*\})? (\S+)$/m.exec(text);
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

/** The median of `values` (0 when empty). */
function median(values) {
  if (values.length === 0) return 0;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/**
 * Counts for one step: `window` is `{start, end, seqs: Map(producer → [from, to])}` (counted
 * events with `from < seq <= to` were published during the step). `inLog` is producer → the
 * numbers the log holds at the end (null: unknown).
 */
export function measureStep({ window, producers, subscribers, inLog }) {
  const inStep = (p, seq) => {
    const [from, to] = window.seqs.get(p);
    return seq > from && seq <= to;
  };
  const acked = new Map();
  const producerGaps = [];
  for (const p of producers) {
    const mine = new Map([...p.acked].filter(([seq]) => inStep(p.name, seq)));
    acked.set(p.name, mine);
    const times = [...mine.values()].map((a) => a.at).filter(Boolean).sort((a, b) => a - b);
    producerGaps.push(longestGap(times, window));
  }
  const checks = [];
  const gaps = [];
  let signals = 0;
  for (const s of subscribers) {
    const producer = producers.find((p) => p.thread === s.thread);
    const items = s
      .items()
      .filter((i) => (i.seq !== null && i.producer === producer.name && inStep(producer.name, i.seq)) || i.signal);
    signals += items.filter((i) => i.signal && i.at >= window.start && i.at < window.end).length;
    checks.push(checkSubscriber({ items, producers: [producer.name], acked, inLog }));
    const seen = new Set();
    const times = [];
    for (const i of items) {
      if (i.seq === null || seen.has(i.seq)) continue;
      seen.add(i.seq);
      times.push(i.at);
    }
    gaps.push(longestGap(times.sort((a, b) => a - b), window));
  }
  const sum = sumChecks(checks);
  const strict = { skippedSilently: 0, rollbackUnsignalled: 0, lostByLog: 0 };
  if (inLog) {
    for (const s of subscribers) {
      const producer = producers.find((p) => p.thread === s.thread);
      const items = s.items().filter((i) => (i.seq !== null && i.producer === producer.name) || i.signal);
      const got = strictCheck({ items, acked: acked.get(producer.name), log: inLog.get(producer.name) ?? new Set(), inStep: (n) => inStep(producer.name, n) });
      for (const k of Object.keys(strict)) strict[k] += got[k];
    }
  }
  const stops = subscribers.flatMap((s) =>
    s.answers.filter(
      (a) => a.at >= window.start && a.at < window.end && (a.status !== 200 || !a.contentType.startsWith("text/event-stream")),
    ),
  );
  const reconnects = subscribers.reduce(
    (n, s) => n + s.conns.filter((c) => c.at >= window.start && c.at < window.end).length,
    0,
  );
  return {
    acknowledged: [...acked.values()].reduce((n, m) => n + m.size, 0),
    ...sum,
    ...strict,
    signals,
    stops: stops.length,
    stopSamples: stops.slice(0, 3).map((a) => `${a.status} ${a.contentType}`),
    reconnects,
    gapWorst: Math.max(0, ...gaps),
    gapMedian: median(gaps),
    producerGap: Math.max(0, ...producerGaps),
  };
}

/**
 * The subscriber against the log read back at the end (what the brief of the rolling test
 * asks: the received sequence equals the log's, and a departure from it is signalled).
 * `items` are one subscriber's items of one producer and the signals, in arrival order.
 * - skippedSilently: a number of the step the log holds, never received, with no signal
 *   (prelude, bridge mark, gap event) between its received neighbours;
 * - rollbackUnsignalled: a received number the log no longer holds (a failover lost it) that
 *   is followed by a received number the log holds with no signal in between (the client was
 *   left holding an event the log does not have);
 * - lostByLog: acknowledged in the step, not in the log, never received (Redis lost it before
 *   any broker delivered it: the log is consistent, nothing to signal).
 */
export function strictCheck({ items, acked, log, inStep }) {
  const out = { skippedSilently: 0, rollbackUnsignalled: 0, lostByLog: 0 };
  const first = new Map();
  items.forEach((item, index) => {
    if (item.seq !== null && !first.has(item.seq)) first.set(item.seq, index);
  });
  // signalsBefore[i]: signals among items[0..i), so "a signal strictly between a and b" is O(1).
  const signalsBefore = [0];
  for (const item of items) signalsBefore.push(signalsBefore.at(-1) + (item.signal ? 1 : 0));
  const signalBetween = (a, b) => signalsBefore[Math.max(a, b)] - signalsBefore[Math.min(a, b) + 1] > 0;
  const received = [...first.keys()].sort((a, b) => a - b);
  let k = 0; // received[k - 1] < n <= received[k] as n grows
  for (const n of [...log].filter(inStep).sort((a, b) => a - b)) {
    while (k < received.length && received[k] < n) k += 1;
    if (first.has(n)) continue;
    const lo = k === 0 ? -1 : first.get(received[k - 1]);
    const hi = k === received.length ? items.length : first.get(received[k]);
    if (!signalBetween(lo, hi)) out.skippedSilently += 1;
  }
  // nextInLog[i]: index of the first item at or after i whose number the log holds (-1: none).
  const nextInLog = new Array(items.length + 1).fill(-1);
  for (let i = items.length - 1; i >= 0; i--) {
    nextInLog[i] = items[i].seq !== null && log.has(items[i].seq) ? i : nextInLog[i + 1];
  }
  for (const [n, index] of first) {
    if (!inStep(n) || log.has(n)) continue;
    const next = nextInLog[index + 1];
    if (next !== -1 && !signalBetween(index, next)) out.rollbackUnsignalled += 1;
  }
  for (const n of acked.keys()) if (inStep(n) && !log.has(n) && !first.has(n)) out.lostByLog += 1;
  return out;
}

/**
 * The longest time in `window` without an event (sorted `times`), counting from the window's
 * start to the first and from the last to its end (in ms).
 */
function longestGap(times, window) {
  const inside = times.filter((t) => t >= window.start && t < window.end);
  let prev = window.start;
  let worst = 0;
  for (const t of inside) {
    worst = Math.max(worst, t - prev);
    prev = t;
  }
  return Math.max(worst, window.end - prev);
}

const s1 = (ms) => (ms / 1000).toFixed(1);

/** The Markdown table of every step's row (and the whole run's). */
export function table(rows) {
  const head =
    "| step | acknowledged | lost (with reset/gap signal) | lost silently | lost though in the log | in the log, skipped without a signal | received, rolled back by Redis without a signal | lost by Redis before delivery | duplicated | reordered | answers stopping an EventSource | longest gap, worst subscriber / median (s) | longest producer wait (s) | reconnects | connections per broker after (max/min) | alerts (fired → resolved) |";
  const sep = `|${head.split("|").slice(1, -1).map(() => "---").join("|")}|`;
  const lines = rows.map((r) => {
    const conns = r.conns ? `${r.conns.join(" / ")} (${r.ratio === null ? "n/a" : r.ratio.toFixed(2)})` : "";
    return `| ${r.name} | ${r.acknowledged} | ${r.lostSignalled} | ${r.lostSilently} | ${r.lostInLog} | ${r.skippedSilently} | ${r.rollbackUnsignalled} | ${r.lostByLog} | ${r.duplicated} | ${r.reordered} | ${r.stops} | ${s1(r.gapWorst)} / ${s1(r.gapMedian)} | ${s1(r.producerGap)} | ${r.reconnects} | ${conns} | ${r.alerts ?? ""} |`;
  });
  return [head, sep, ...lines].join("\n");
}
