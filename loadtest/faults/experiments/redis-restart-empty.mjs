// Redis restarted empty (no persistence: a crash, a `FLUSHALL`, a new instance) under two nodes
// while a producer publishes and subscribers follow. The producer retries its 503s, finds the
// thread empty (409: a log must start with `RUN_STARTED`) and opens a new run, as an agent
// would. What Redis lost it lost; but every event acknowledged in the new epoch is in the log,
// so a subscriber must get all of them (issue 13 item 2: it was put at the new log's head), and
// its fold must be the new log's, not the dead epoch's (item 1).

import { setTimeout as sleep } from "node:timers/promises";
import { Producer } from "../lib/producer.mjs";
import { finish, opened, samplePeaks, subscribe } from "../lib/scenario.mjs";
import { cluster, until } from "./common.mjs";

export default {
  name: "redis-restart-empty",
  fault: "Redis killed and restarted empty under two nodes",
  async run(ctx) {
    const { subscribers: n, seconds } = ctx.params;
    const { redis, nodes, lb } = await cluster(ctx);
    ctx.defer(samplePeaks(nodes));
    const thread = "restart";
    const producer = await new Producer({ name: "p-restart", base: () => lb.base, thread }).start({ intervalMs: 20 });
    await until(() => producer.acked.size > 0);
    const subs = subscribe(n, lb.base, thread);
    ctx.defer(() => subs.forEach((s) => s.close()));
    await opened(subs);

    await sleep(1500);
    ctx.log("redis killed");
    await redis.kill();
    await sleep(1000);
    await redis.restart();
    ctx.log("redis restarted empty");
    await sleep(Math.max(0, seconds * 1000 - 2500));
    await producer.stop();

    return finish({
      ctx,
      base: lb.base,
      brokers: nodes,
      producers: [producer],
      subscribers: subs,
      memory: { subscribers: n, others: 2 },
      expectReconnects: true,
      settleMs: 30_000,
    });
  },
};
