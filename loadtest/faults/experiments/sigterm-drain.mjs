// SIGTERM drain of one of two nodes (a rolling deploy): the node keeps answering for
// `shutdown.drain` (5 s) while its streams end at jittered moments; the balancer keeps sending
// it new connections until it stops accepting (as a Service does until readiness propagates),
// so reconnecting subscribers and tabs opened during the drain meet the draining node. Once the
// node has exited it is started again (the new pod). Every subscriber must end with every
// event, and no answer may stop an EventSource (issue 13 item 6: a `503` during the drain does).

import { setTimeout as sleep } from "node:timers/promises";
import { Producer } from "../lib/producer.mjs";
import { finish, opened, samplePeaks, subscribe } from "../lib/scenario.mjs";
import { cluster, until } from "./common.mjs";

export default {
  name: "sigterm-drain",
  fault: "SIGTERM (5 s drain) of one of two nodes, new tabs open during the drain, node restarted",
  async run(ctx) {
    const { subscribers: n, during, seconds } = ctx.params;
    const { nodes, lb } = await cluster(ctx);
    const [a, b] = nodes;
    ctx.defer(samplePeaks(nodes));
    const thread = "drain";
    const producer = await new Producer({ name: "p-drain", base: () => lb.base, thread }).start({ intervalMs: 20 });
    await until(() => producer.acked.size > 0);
    const subs = subscribe(n, lb.base, thread);
    ctx.defer(() => subs.forEach((s) => s.close()));
    await opened(subs);

    await sleep(1500);
    const t0 = Date.now();
    ctx.log(`SIGTERM ${a.name}`);
    a.sigterm();
    await sleep(1000);
    // Tabs opened during the drain: the balancer sends every other one to the draining node.
    const late = subscribe(during, lb.base, thread, "late");
    ctx.defer(() => late.forEach((s) => s.close()));
    const exit = await a.waitExit(20_000);
    ctx.log(`${a.name} exited ${(Date.now() - t0) / 1000} s after SIGTERM (${JSON.stringify(exit)})`);
    await a.start();
    ctx.log(`${a.name} restarted on ${a.addr}`);
    await sleep(Math.max(0, seconds * 1000 - (Date.now() - t0)));
    await producer.stop();

    return finish({
      ctx,
      base: b.base,
      brokers: nodes,
      producers: [producer],
      subscribers: [...subs, ...late],
      memory: { subscribers: n + during, others: 2 },
      expectReconnects: true,
      settleMs: 40_000,
      notes: [`${a.name} exited ${exit.timedOut ? "only when killed, 20 s after SIGTERM" : `with ${JSON.stringify(exit)}`}`],
    });
  },
};
