// Redis paused (SIGSTOP) for 10 s, longer than the broker's operation timeout, then resumed.
// Two producers publish meanwhile, each to its own thread: one with idempotency headers, one
// without. Both retry every `503` after its `Retry-After`, as documented; a `503` means nothing
// was appended, so neither may leave a duplicate (issue 13 item 4: the append scripts the
// timed-out requests had sent ran when Redis resumed). Streams stay open through the pause.

import { setTimeout as sleep } from "node:timers/promises";
import { Producer } from "../lib/producer.mjs";
import { finish, opened, samplePeaks, subscribe } from "../lib/scenario.mjs";
import { cluster, until } from "./common.mjs";

export default {
  name: "redis-pause",
  fault: "Redis paused 10 s (SIGSTOP); producers with and without idempotency headers retry their 503s",
  async run(ctx) {
    const { subscribers: n, pauseSeconds, seconds } = ctx.params;
    const { redis, nodes, lb } = await cluster(ctx, { count: 1 });
    ctx.defer(samplePeaks(nodes));
    // Only counted events: whichever event is in flight when Redis stops is one the checker
    // sees twice if it is appended twice.
    const pattern = ["custom"];
    const producers = [
      new Producer({ name: "p-idem", base: () => lb.base, thread: "pause-idem", idempotent: true, pattern }),
      new Producer({ name: "p-plain", base: () => lb.base, thread: "pause-plain", idempotent: false, pattern }),
    ];
    for (const p of producers) await p.start({ intervalMs: 20 });
    await until(() => producers.every((p) => p.acked.size > 0));
    const subs = producers.flatMap((p) => subscribe(n, lb.base, p.thread));
    ctx.defer(() => subs.forEach((s) => s.close()));
    await opened(subs);

    await sleep(1500);
    ctx.log(`redis paused for ${pauseSeconds} s`);
    redis.pause();
    await sleep(pauseSeconds * 1000);
    redis.resume();
    ctx.log("redis resumed");
    await sleep(Math.max(0, seconds * 1000 - 1500 - pauseSeconds * 1000));
    await Promise.all(producers.map((p) => p.stop()));

    return finish({
      ctx,
      base: lb.base,
      brokers: nodes,
      producers,
      subscribers: subs,
      memory: { subscribers: subs.length, others: 4 },
      settleMs: 30_000,
    });
  },
};
