// A Redis primary/replica failover that loses the primary's tail. Two nodes reach Redis through
// a proxy (what a Sentinel-aware client, a DNS switch or a cloud endpoint does). The replica
// (`replica-serve-stale-data yes`) is cut off (its replication link partitioned), so the
// events acknowledged next reach only the primary and the subscribers; then the primary is killed, the proxy switches to the replica
// (for 1 s a stale replica: reads answered, writes refused) and the replica is promoted. The
// meta hash was replicated, so the epoch stays the same while the log lost its tail.
//
// What Redis lost it lost, but every client must end with the log's fold: a subscriber holding
// events the new log never had must be told (a prelude) and restated, never "resumed exactly"
// from a position the log never held (issue 13 item 1: its text stayed `aaaabbbbc` while the
// log said `aaaac`, silently and for good).

import { setTimeout as sleep } from "node:timers/promises";
import { Balancer } from "../lib/net.mjs";
import { Redis } from "../lib/procs.mjs";
import { Producer } from "../lib/producer.mjs";
import { finish, opened, samplePeaks, subscribe } from "../lib/scenario.mjs";
import { cluster, until } from "./common.mjs";

export default {
  name: "redis-failover",
  fault: "Redis primary killed with an unreplicated tail; the stale replica is promoted",
  async run(ctx) {
    const { subscribers: n, seconds } = ctx.params;
    const primary = await Redis.start(ctx.procs, "redis-primary");
    // The replication link goes through a proxy of its own, so that it can be partitioned:
    // what the primary sends then never reaches the replica.
    const link = await new Balancer([`127.0.0.1:${primary.port}`]).listen();
    ctx.defer(() => link.close());
    const replica = await Redis.start(ctx.procs, "redis-replica", [
      "--replicaof", "127.0.0.1", String(link.port), "--replica-serve-stale-data", "yes",
    ]);
    let linked = false;
    for (let i = 0; i < 100 && !linked; i++) {
      linked = /master_link_status:up/.test(await replica.cli("info", "replication"));
      if (!linked) await sleep(100);
    }
    if (!linked) throw new Error("the replica did not link to the primary within 10 s");
    const proxy = await new Balancer([`127.0.0.1:${primary.port}`]).listen();
    ctx.defer(() => proxy.close());
    const { nodes, lb } = await cluster(ctx, { redisUrl: `redis://${proxy.addr}` });
    ctx.defer(samplePeaks(nodes));

    const thread = "failover";
    const producer = await new Producer({ name: "p-failover", base: () => lb.base, thread }).start({ intervalMs: 20 });
    await until(() => producer.acked.size > 0);
    const subs = subscribe(n, lb.base, thread);
    ctx.defer(() => subs.forEach((s) => s.close()));
    await opened(subs);

    await sleep(1500);
    const ackedBefore = producer.acked.size;
    link.freeze();
    ctx.log("replication partitioned: what is acknowledged now reaches the primary only");
    await sleep(1500);
    const lostTail = producer.acked.size - ackedBefore;
    await primary.kill();
    link.cutAll();
    proxy.setBackends([`127.0.0.1:${replica.port}`], { cut: true });
    ctx.log(`primary killed (~${lostTail} counted events only it had); proxy on the stale replica`);
    await sleep(1000);
    await replica.cli("replicaof", "no", "one");
    ctx.log("replica promoted");
    await sleep(Math.max(0, seconds * 1000 - 4000));
    await producer.stop();

    return finish({
      ctx,
      base: lb.base,
      brokers: nodes,
      producers: [producer],
      subscribers: subs,
      memory: { subscribers: n, others: 2 },
      settleMs: 30_000,
      notes: [`about ${lostTail} counted events were acknowledged while replication was partitioned (the tail Redis lost)`],
    });
  },
};
