// Topologies the experiments share: broker nodes on one private Redis behind a balancer.

import { setTimeout as sleep } from "node:timers/promises";
import { Balancer } from "../lib/net.mjs";
import { Broker, Redis } from "../lib/procs.mjs";
import { brokerEnv } from "../lib/memory.mjs";

/** A broker node of this experiment (not started). */
export function node(ctx, name, redisUrl = "", env = {}) {
  return new Broker({ procs: ctx.procs, name, binary: ctx.binary, redisUrl, env: { ...brokerEnv(), ...env } });
}

/**
 * `count` nodes on one private Redis (or on `redisUrl`), all started, behind a balancer that
 * browsers and producers go through. Returns `{redis, nodes, lb}`.
 */
export async function cluster(ctx, { count = 2, redisUrl = null } = {}) {
  const redis = redisUrl ? null : await Redis.start(ctx.procs, "redis");
  const url = redisUrl ?? redis.url;
  const nodes = [];
  for (let i = 0; i < count; i++) nodes.push(await node(ctx, `node-${"abcdefgh"[i]}`, url).start());
  const lb = await new Balancer(nodes.map((n) => n.addr)).listen();
  ctx.defer(() => lb.close());
  return { redis, nodes, lb };
}

/** Waits until `cond()` is true (checked every 20 ms), at most `ms`; returns whether it was. */
export async function until(cond, ms = 10_000) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) return false;
    await sleep(20);
  }
  return true;
}
