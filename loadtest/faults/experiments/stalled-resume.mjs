// Subscribers that stop reading (a stalled tab, a network blip) while producers publish several
// MiB, then all read again at once; one healthy subscriber per thread reads throughout. Three
// threads, each stalled differently:
//
// - "stall-full": its stalled subscribers' queues fill to about half their byte bound, no more
//   (no reset): at the resume every one drains a full backlog at once. Peak RSS through the
//   stall and the resume must stay within the memory formula (issue 13 item 5: the drain copied
//   every pending frame into a buffer per connection).
// - "stall": its stalled subscribers overflow and are reset (PROTOCOL §5); the run ends during
//   the stall, so the bridge closes it. The events dropped with the backlog may be lost, with a
//   signal the client can read; the fold must end at the log's.
// - "stall-custom": counted events only (progress notes, say) and the run still going at the
//   resume: a reset's bridge has nothing to restate but must still tell that events were
//   skipped (issue 13 item 3: the one-event bridge carried a plain id).

import { setTimeout as sleep } from "node:timers/promises";
import { mib } from "../lib/memory.mjs";
import { Producer } from "../lib/producer.mjs";
import { finish, opened, samplePeaks, snapshot, subscribe } from "../lib/scenario.mjs";
import { node } from "./common.mjs";

/** The `agui_resets_total` and `agui_disconnects_total` series of a broker's /metrics. */
async function resetCounts(base) {
  try {
    const text = await (await fetch(`${base}/metrics`)).text();
    return text
      .split("\n")
      .filter((l) => /^agui_(resets|disconnects)_total\{/.test(l) && !/ 0$/.test(l))
      .join(", ");
  } catch {
    return "metrics unavailable";
  }
}

export default {
  name: "stalled-resume",
  fault: "stalled subscribers (queues half full, or overflowing) resume at once (memory backend)",
  async run(ctx) {
    const { full: n, overflow: k, fullMiB, overflowMiB } = ctx.params;
    const broker = await node(ctx, "node-a").start();
    ctx.defer(samplePeaks([broker]));
    const padBytes = 4000;
    // Mostly counted events (large), with text and state between them for the fold check.
    const mixed = ["custom", "custom", "custom", "text", "custom", "custom", "custom", "state"];
    const threads = [
      { thread: "stall-full", pattern: mixed, stalled: n, mebibytes: fullMiB, closeBeforeResume: true },
      { thread: "stall", pattern: mixed, stalled: k, mebibytes: overflowMiB, closeBeforeResume: true },
      { thread: "stall-custom", pattern: ["custom"], stalled: k, mebibytes: overflowMiB, closeBeforeResume: false },
    ];
    const producers = [];
    const healthy = [];
    const stalled = [];
    for (const t of threads) {
      const p = new Producer({ name: `p-${t.thread}`, base: () => broker.base, thread: t.thread, padBytes, pattern: t.pattern });
      if (!(await p.openRun())) throw new Error(`${p.name} could not open its run`);
      producers.push(p);
      healthy.push(...subscribe(1, broker.base, t.thread, "healthy"));
      stalled.push(subscribe(t.stalled, broker.base, t.thread, "stalled"));
    }
    const subs = stalled.flat();
    ctx.defer(() => [...healthy, ...subs].forEach((s) => s.close()));
    for (const s of subs) s.pause();
    await opened([...healthy, ...subs]);
    ctx.log(`${subs.length} subscribers stalled; publishing ${threads.map((t) => `${t.mebibytes} MiB to ${t.thread}`).join(", ")}`);
    await Promise.all(
      producers.map(async (p, i) => {
        const perStep = (padBytes * p.pattern.filter((x) => x === "custom").length) / p.pattern.length;
        await p.runSteps({ intervalMs: 0, steps: Math.ceil((threads[i].mebibytes * 1048576) / perStep) });
        if (threads[i].closeBeforeResume) await p.closeRun();
        const last = (await snapshot(broker.base, p.thread))?.lastEventId;
        await healthy[i].waitFor(last, 20_000);
      }),
    );
    await sleep(500);
    const before = broker.status().VmRSS ?? 0;
    const beforePeak = broker.notePeak();
    ctx.log(`resuming; RSS ${mib(before)}, peak so far ${mib(beforePeak)}`);
    for (const s of subs) s.resume();
    await sleep(2000);
    for (const [i, p] of producers.entries()) if (!threads[i].closeBeforeResume) await p.closeRun();
    // Which stalled subscribers were reset: those that did not get every counted event.
    const resets = stalled.map(
      (group, i) => group.filter((s) => new Set(s.items().map((x) => x.seq).filter((x) => x !== null)).size < producers[i].acked.size).length,
    );
    const resetNote = threads.map((t, i) => `${t.thread} ${resets[i]} of ${t.stalled}`).join(", ");

    const row = await finish({
      ctx,
      base: broker.base,
      brokers: [broker],
      producers,
      subscribers: [...healthy, ...subs],
      allowLostInLog: true,
      memory: { subscribers: healthy.length + subs.length, others: producers.length },
      settleMs: 30_000,
      notes: [
        `RSS before the resume ${mib(before)} (peak so far ${mib(beforePeak)})`,
        `stalled subscribers reset (missed events): ${resetNote}; broker counters: ${await resetCounts(broker.base)}`,
      ],
    });
    row.notes.push(`peak RSS rose by ${mib(broker.peakRss - beforePeak)} at the resume`);
    return row;
  },
};
