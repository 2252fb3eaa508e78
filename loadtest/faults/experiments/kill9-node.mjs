// kill -9 of one of two nodes on one Redis while a producer publishes through the balancer and
// subscribers follow the thread on both nodes; the killed node comes back 1 s later on the same
// address. Subscribers cut by the kill reconnect (EventSource, after `retry:`) through the
// balancer with `Last-Event-ID` and must resume exactly (PROTOCOL §4.2): nothing lost,
// duplicated or reordered.

import { setTimeout as sleep } from "node:timers/promises";
import { Producer } from "../lib/producer.mjs";
import { finish, opened, samplePeaks, subscribe } from "../lib/scenario.mjs";
import { cluster, until } from "./common.mjs";

export default {
  name: "kill9-node",
  fault: "kill -9 of one of two nodes (one Redis), restarted 1 s later",
  async run(ctx) {
    const { subscribers: n, seconds } = ctx.params;
    const { nodes, lb } = await cluster(ctx);
    const [a, b] = nodes;
    ctx.defer(samplePeaks(nodes));
    const thread = "kill9";
    const producer = await new Producer({ name: "p-kill9", base: () => lb.base, thread }).start({ intervalMs: 20 });
    await until(() => producer.acked.size > 0);
    const subs = subscribe(n, lb.base, thread);
    ctx.defer(() => subs.forEach((s) => s.close()));
    await opened(subs);

    await sleep(1500);
    ctx.log(`kill -9 ${a.name}`);
    await a.kill9();
    await sleep(1000);
    await a.start();
    ctx.log(`${a.name} restarted on ${a.addr}`);
    await sleep(Math.max(0, seconds * 1000 - 2500));
    await producer.stop();

    return finish({
      ctx,
      base: b.base,
      brokers: nodes,
      producers: [producer],
      subscribers: subs,
      memory: { subscribers: n, others: 2 },
      expectReconnects: true,
    });
  },
};
