// What every experiment does around its fault: open subscribers, let them catch up with the
// log, read the log back, and turn all of it into one row of the table with its targets.

import fs from "node:fs";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { checkSubscriber, sumChecks } from "./checker.mjs";
import { foldCheck } from "./fold.mjs";
import { memoryBound, mib } from "./memory.mjs";
import { classify, Subscriber } from "./subscriber.mjs";

/** Opens `n` subscribers of `thread` with `?from=start` (the whole log: every ack is expected). */
export function subscribe(n, base, thread, prefix = "s") {
  return Array.from({ length: n }, (_, i) =>
    new Subscriber({
      name: `${prefix}${i + 1}-${thread}`,
      url: `${base}/v1/threads/${thread}/events?from=start`,
      thread,
    }).start(),
  );
}

/** Waits until every subscriber has an open connection (or `ms` pass). */
export async function opened(subscribers, ms = 15_000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline && subscribers.some((s) => s.conns.length === 0)) await sleep(50);
}

/** GET `/snapshot`, `null` when it fails. */
export async function snapshot(base, thread) {
  try {
    const res = await fetch(`${base}/v1/threads/${thread}/snapshot`, { signal: AbortSignal.timeout(10_000) });
    return res.ok ? await res.json() : null;
  } catch {
    return null;
  }
}

/**
 * Waits until every subscriber received its thread's last event (the snapshot's
 * `lastEventId`), at most `ms`. Returns the snapshots and the subscribers that did not.
 */
export async function settle(subscribers, base, threads, ms) {
  const snapshots = new Map();
  for (const thread of threads) {
    let snap = null;
    for (let i = 0; i < 20 && !snap; i++) {
      snap = await snapshot(base, thread);
      if (!snap) await sleep(500);
    }
    if (snap) snapshots.set(thread, snap);
  }
  const behind = [];
  await Promise.all(
    subscribers.map(async (s) => {
      const last = snapshots.get(s.thread)?.lastEventId;
      if (!last || !(await s.waitFor(last, ms))) behind.push(s.name);
    }),
  );
  return { snapshots, behind };
}

/**
 * Reads a thread's log back from the broker (`?from=start`, a fresh stream read from the log
 * itself, until `lastId`) and returns `{log, body}`: producer → numbers it holds, and the raw
 * SSE text (what the log folds to, for the fold check); `log` is `null` (with a reason) when
 * the answer was not the plain log (a prelude, a comment saying it was trimmed, a timeout).
 */
export async function readLog(base, thread, lastId, ms = 15_000) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), ms);
  try {
    const res = await fetch(`${base}/v1/threads/${thread}/events?from=start`, { signal: controller.signal });
    if (res.status !== 200) return { log: null, reason: `log read answered ${res.status}` };
    const decoder = new TextDecoder();
    let text = "";
    let body = "";
    const log = new Map();
    for await (const chunk of res.body) {
      text += decoder.decode(chunk, { stream: true });
      let end;
      while ((end = text.indexOf("\n\n")) >= 0) {
        const frame = text.slice(0, end);
        text = text.slice(end + 2);
        body += `${frame}\n\n`;
        let id = "";
        const data = [];
        for (const line of frame.split("\n")) {
          if (line.startsWith("id: ")) id = line.slice(4);
          else if (line.startsWith("data: ")) data.push(line.slice(6));
        }
        if (data.length === 0) continue;
        const item = classify(id, data.join("\n"));
        if (item.signal) return { log: null, reason: `log read got a ${item.signal}` };
        if (item.seq !== null) {
          if (!log.has(item.producer)) log.set(item.producer, new Set());
          log.get(item.producer).add(item.seq);
        }
        if (id === lastId) return { log, body, reason: null };
      }
    }
    return { log: null, reason: "log read ended early" };
  } catch (error) {
    return { log: null, reason: `log read: ${error.name}` };
  } finally {
    clearTimeout(timer);
    controller.abort();
  }
}

/** Notes every running broker's peak RSS every 200 ms until the returned stop is called. */
export function samplePeaks(brokers) {
  const timer = setInterval(() => {
    for (const b of brokers) if (b.running) b.notePeak();
  }, 200);
  return () => clearInterval(timer);
}

/**
 * Everything an experiment measured, turned into its row.
 *
 * @param {object} o
 * @param {object} o.ctx the experiment's context (`out`, `log`)
 * @param {string} o.base a live broker (or balancer) to read snapshots and the log from
 * @param {import("./procs.mjs").Broker[]} o.brokers every node it ran (peak RSS)
 * @param {import("./producer.mjs").Producer[]} o.producers
 * @param {Subscriber[]} o.subscribers the subscribers the checker judges
 * @param {boolean} [o.allowLostInLog] resets may skip counted events (with a signal)
 * @param {boolean} [o.expectReconnects] the fault must have cut some subscriber (else the
 *   experiment tested nothing)
 * @param {number} [o.settleMs]
 * @param {object} o.memory `{subscribers, others}`: connections per broker for the bound
 * @param {Array<{name, value, ok}>} [o.extra] experiment-specific targets
 * @param {Array<{status, contentType}>} [o.extraFatal] fatal answers to subscribes made
 *   outside the judged subscribers (the fuzzer's)
 * @param {string[]} [o.notes]
 */
export async function finish(o) {
  const { ctx, base, brokers, producers, subscribers } = o;
  const notes = [...(o.notes ?? [])];
  const threads = [...new Set(subscribers.map((s) => s.thread))];
  const { snapshots, behind } = await settle(subscribers, base, threads, o.settleMs ?? 30_000);
  for (const b of brokers) if (b.running) b.notePeak();
  if (behind.length > 0) notes.push(`${behind.length} subscriber(s) never reached the log's last id`);

  // The log as it is at the end: what Redis (or the memory log) holds.
  const inLog = new Map();
  const logBodies = new Map();
  let logKnown = true;
  for (const thread of threads) {
    const snap = snapshots.get(thread);
    const { log, body, reason } = snap?.lastEventId
      ? await readLog(base, thread, snap.lastEventId)
      : { log: null, reason: "no snapshot" };
    if (!log) {
      logKnown = false;
      notes.push(`log of ${thread} not read back (${reason})`);
    } else {
      for (const [p, seqs] of log) inLog.set(p, seqs);
      logBodies.set(thread, body);
    }
  }

  // What each subscriber received, without the payloads, for whoever reads a failure.
  const received = subscribers.map((s) => ({
    name: s.name,
    answers: s.answers.map((a) => `${a.status} ${a.contentType}`),
    conns: s.conns.map((c) =>
      c.items.map((i) => [i.id, i.seq ?? i.signal ?? (i.data.match(/"type":"(\w+)"/)?.[1] ?? "?")]),
    ),
  }));
  fs.writeFileSync(path.join(ctx.out, "received.json"), JSON.stringify(received));

  const acked = new Map(producers.map((p) => [p.name, p.acked]));
  const checks = subscribers.map((s) =>
    checkSubscriber({
      items: s.items(),
      producers: producers.filter((p) => p.thread === s.thread).map((p) => p.name),
      acked,
      inLog: logKnown ? inLog : null,
    }),
  );
  const sum = sumChecks(checks);
  const { clients: folds, snapshots: snapshotFolds } = await foldCheck(subscribers, snapshots, logBodies, ctx.out);
  const diverged = folds.filter((f) => !f.ok);
  for (const f of diverged.slice(0, 3)) notes.push(`fold of ${f.name}: ${f.reason}`);
  if (diverged.length > 3) notes.push(`… and ${diverged.length - 3} more diverged folds`);
  const staleSnapshots = snapshotFolds.filter((f) => !f.ok);
  for (const f of staleSnapshots) notes.push(`/snapshot of ${f.name}: ${f.reason}`);

  const reconnects = subscribers.reduce((n, s) => n + Math.max(0, s.conns.length - 1), 0);
  const cut = subscribers.filter((s) => s.conns.length > 1).length;
  notes.push(`${cut} of ${subscribers.length} subscribers reconnected (${reconnects} reconnects in all)`);
  const fatal = [...subscribers.flatMap((s) => s.fatal), ...(o.extraFatal ?? [])];
  if (fatal.length > 0) {
    const kinds = {};
    for (const f of fatal) {
      const key = `${f.status} ${f.contentType.split(";")[0] || "no type"}`;
      kinds[key] = (kinds[key] ?? 0) + 1;
    }
    notes.push(`fatal answers: ${Object.entries(kinds).map(([k, n]) => `${n}× ${k}`).join(", ")}`);
  }
  for (const [key, values] of Object.entries(sum.samples)) {
    if (key !== "neverAcked" || sum.neverAcked > 0) notes.push(`${key} e.g. seq ${values.join(", ")}`);
  }
  if (sum.rolledBack > 0) notes.push(`${sum.rolledBack} received event(s) the final log no longer holds (rolled back)`);
  for (const p of producers) {
    const st = p.stats;
    const statuses = Object.entries(st.status).map(([k, n]) => `${n}×${k}`).join(" ");
    notes.push(
      `producer ${p.name}${p.idempotent ? "" : " (no idempotency headers)"}: ${p.acked.size} acked, ${p.unacked.length} given up; ` +
        `answers ${statuses}; ${st.transportErrors} transport errors; ${st.resyncs} new runs/messages after 409` +
        (p.failed ? `; FAILED: ${p.failed}` : ""),
    );
  }

  // Peak RSS against the bound, per broker process.
  const foldBytes = Math.max(1024, ...[...snapshots.values()].map((s) => JSON.stringify(s).length));
  let peak = 0;
  let worst = null;
  for (const b of brokers) {
    if (b.baselineRss === null) continue;
    const { bound, parts } = memoryBound({
      idleRss: b.baselineRss,
      subscribers: o.memory.subscribers,
      others: o.memory.others,
      threads: threads.length,
      foldBytes,
    });
    if (b.peakRss > peak) peak = b.peakRss;
    const over = b.peakRss - bound;
    if (worst === null || over > worst.over) worst = { broker: b.name, peak: b.peakRss, bound, parts, over };
  }

  const targets = [
    { name: "lost silently", value: sum.lostSilently, ok: sum.lostSilently === 0 },
    { name: "duplicated", value: sum.duplicated, ok: sum.duplicated === 0 },
    { name: "reordered", value: sum.reordered, ok: sum.reordered === 0 },
    { name: "fatal answers", value: fatal.length, ok: fatal.length === 0 },
    { name: "folds diverged", value: diverged.length, ok: diverged.length === 0 },
    { name: "snapshots unlike the log", value: staleSnapshots.length, ok: staleSnapshots.length === 0 },
    {
      name: "peak RSS",
      value: worst ? `${mib(worst.peak)} ${worst.over <= 0 ? "≤" : ">"} ${mib(worst.bound)}` : "unknown",
      ok: worst !== null && worst.over <= 0,
    },
    ...(o.allowLostInLog
      ? []
      : [{ name: "lost though in the log", value: sum.lostInLog, ok: logKnown && sum.lostInLog === 0 }]),
    ...(o.extra ?? []),
  ];
  if (o.expectReconnects) {
    targets.push({ name: "the fault cut subscribers (sanity)", value: cut, ok: cut > 0 });
  }
  for (const p of producers) {
    if (p.failed) targets.push({ name: `producer ${p.name} ran`, value: p.failed, ok: false });
  }
  return {
    acknowledged: producers.reduce((n, p) => n + p.acked.size, 0),
    subscribers: subscribers.length,
    ...sum,
    fatal: fatal.length,
    diverged: diverged.length,
    peakRss: peak,
    bound: worst?.bound ?? null,
    boundParts: worst?.parts ?? null,
    logKnown,
    targets,
    notes,
  };
}
