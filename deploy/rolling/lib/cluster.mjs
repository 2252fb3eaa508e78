// A private Redis Cluster for the rolling-deploy test: `masters` primaries with one replica each,
// `redis-server --cluster-enabled yes` children on fixed loopback ports (the cluster bus on
// `--cluster-port`, inside the test's own port range), joined with
// `redis-cli --cluster create … --cluster-replicas 1`. No persistence: a killed master's
// unreplicated writes are lost, which is the loss the broker must signal with a reset.

import fs from "node:fs";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { execFile } from "node:child_process";
import { redisCli } from "../../../loadtest/faults/lib/procs.mjs";

/** Runs `redis-cli args…` (no `-p`); resolves to stdout, rejects on a non-zero exit. */
function cli(args, ms = 30_000) {
  return new Promise((resolve, reject) => {
    execFile("redis-cli", args, { timeout: ms }, (error, stdout, stderr) => {
      if (error) reject(new Error(`redis-cli ${args.join(" ")}: ${error.message}\n${stdout}${stderr}`));
      else resolve(stdout);
    });
  });
}

/** One parsed line of `CLUSTER NODES`. */
function parseNodes(text) {
  return text
    .split("\n")
    .filter(Boolean)
    .map((line) => {
      const f = line.split(" ");
      return {
        id: f[0],
        port: Number(f[1].split(/[:@]/)[1]),
        flags: f[2].split(","),
        masterId: f[3],
        slots: f.slice(8),
      };
    });
}

/** Redis Cluster's slot of a key whose hash tag is `tag`: CRC16 (XMODEM) of the tag mod 16384. */
export function keySlot(tag) {
  let crc = 0;
  for (const byte of Buffer.from(tag, "utf8")) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

/** True when `slot` is in one of `ranges` (`"0-5460"`, `"5461"`). */
function servesSlot(ranges, slot) {
  return ranges.some((r) => {
    if (r.startsWith("[")) return false; // a migrating/importing slot marker
    const [lo, hi = lo] = r.split("-").map(Number);
    return slot >= lo && slot <= hi;
  });
}

export class RedisCluster {
  /**
   * @param {import("../../../loadtest/faults/lib/procs.mjs").Procs} procs
   * @param {number[]} ports the nodes' client ports (the first `ports.length / 2` start as
   *   primaries); each node's bus port is its port + `busOffset`
   */
  constructor(procs, ports, busOffset) {
    this.procs = procs;
    this.nodes = ports.map((port) => ({ port, bus: port + busOffset, child: null }));
  }

  /** Starts every node, creates the cluster and waits (60 s at most) until all agree it is ok. */
  async start() {
    for (const node of this.nodes) {
      const dir = path.join(this.procs.dir, `redis-${node.port}`);
      fs.mkdirSync(dir, { recursive: true });
      node.child = this.procs.spawn(`redis-${node.port}`, "redis-server", [
        "--port", String(node.port), "--bind", "127.0.0.1",
        "--cluster-enabled", "yes", "--cluster-port", String(node.bus),
        "--cluster-node-timeout", "3000",
        "--save", "", "--appendonly", "no", "--dir", dir,
      ]);
    }
    for (const node of this.nodes) {
      await this.until(async () => (await this.tryCli(node.port, ["PING"])) === "PONG", `node ${node.port} answers PING`);
    }
    await cli([
      "--cluster", "create", ...this.nodes.map((n) => `127.0.0.1:${n.port}`),
      "--cluster-replicas", "1", "--cluster-yes",
    ]);
    await this.waitOk();
  }

  /** The seed list the brokers get (`AGUI_REDIS_URL`). */
  get seeds() {
    return this.nodes.map((n) => `redis://127.0.0.1:${n.port}`).join(",");
  }

  /** `redis-cli -p port args…`, null on any error. */
  async tryCli(port, args) {
    try {
      return await redisCli(port, args, 3000);
    } catch {
      return null;
    }
  }

  /** Waits until `cond()` is true (every 200 ms), at most `ms`; throws naming `what`. */
  async until(cond, what, ms = 60_000) {
    const deadline = Date.now() + ms;
    while (Date.now() < deadline) {
      if (await cond()) return;
      await sleep(200);
    }
    throw new Error(`redis cluster: ${what} not within ${ms / 1000} s`);
  }

  /** The running nodes. */
  get alive() {
    return this.nodes.filter((n) => n.child && n.child.exitCode === null && n.child.signalCode === null);
  }

  /** Waits until every running node says `cluster_state:ok` with all 16384 slots served. */
  async waitOk(ms = 60_000) {
    for (const node of this.alive) {
      await this.until(async () => {
        const info = (await this.tryCli(node.port, ["CLUSTER", "INFO"])) ?? "";
        return info.includes("cluster_state:ok") && info.includes("cluster_slots_ok:16384");
      }, `cluster ok on ${node.port}`, ms);
    }
  }

  /** `CLUSTER NODES` as the first running node that answers sees it. */
  async topology() {
    for (const node of this.alive) {
      const text = await this.tryCli(node.port, ["CLUSTER", "NODES"]);
      if (text) return parseNodes(text);
    }
    throw new Error("redis cluster: no node answers CLUSTER NODES");
  }

  /** `{tag: port}`: the primary serving the slot of each hash tag `{tag}` now (one query). */
  async mastersOf(tags) {
    const nodes = await this.topology();
    const out = {};
    for (const tag of tags) {
      const slot = keySlot(tag);
      const master = nodes.find((n) => n.flags.includes("master") && !n.flags.includes("fail") && servesSlot(n.slots, slot));
      if (!master) throw new Error(`redis cluster: no primary serves slot ${slot}`);
      out[tag] = master.port;
    }
    return out;
  }

  /** Port of a live replica of the primary on `masterPort`. */
  async replicaOf(masterPort) {
    const nodes = await this.topology();
    const master = nodes.find((n) => n.port === masterPort);
    const replica = nodes.find((n) => n.masterId === master.id && !n.flags.some((f) => f.startsWith("fail")));
    if (!replica) throw new Error(`redis cluster: ${masterPort} has no live replica`);
    return replica.port;
  }

  /**
   * `CLUSTER FAILOVER` on the replica at `replicaPort` (a manual, coordinated failover: the
   * primary stops taking writes until the replica caught up) and waits until it is primary.
   */
  async manualFailover(replicaPort) {
    const reply = await redisCli(replicaPort, ["CLUSTER", "FAILOVER"]);
    if (reply !== "OK") throw new Error(`CLUSTER FAILOVER on ${replicaPort}: ${reply}`);
    await this.until(async () => ((await this.tryCli(replicaPort, ["ROLE"])) ?? "").startsWith("master"), `${replicaPort} promoted`, 30_000);
    await this.waitOk();
  }

  /** Waits until the replica on `port` is a primary and the cluster is ok again. */
  async waitPromoted(port) {
    await this.until(async () => ((await this.tryCli(port, ["ROLE"])) ?? "").startsWith("master"), `${port} promoted`, 60_000);
    await this.waitOk();
  }

  /**
   * Leaves the primary on `masterPort` with writes its replica on `replicaPort` lacks, for
   * certain: the replica is stopped (SIGSTOP, so it cannot reconnect), then the primary drops
   * its replica links (`CLIENT KILL TYPE replica`); what the primary acknowledges from then on
   * reaches only its backlog. Resolves to the primary's replication offset at the cut; `thaw`
   * must follow within the cluster node timeout (3 s) or the replica is flagged as failed.
   */
  async cutReplication(masterPort, replicaPort) {
    const replica = this.nodes.find((n) => n.port === replicaPort);
    process.kill(replica.child.pid, "SIGSTOP");
    await redisCli(masterPort, ["CLIENT", "KILL", "TYPE", "replica"]);
    return this.replOffset(masterPort);
  }

  /** Lets the replica stopped by `cutReplication` run again. */
  thaw(replicaPort) {
    const replica = this.nodes.find((n) => n.port === replicaPort);
    process.kill(replica.child.pid, "SIGCONT");
  }

  /** `master_repl_offset` of the node on `port` (bytes of replication stream it produced). */
  async replOffset(port) {
    const text = await redisCli(port, ["INFO", "replication"]);
    const m = /^master_repl_offset:(\d+)/m.exec(text);
    if (!m) throw new Error(`redis ${port}: no master_repl_offset in INFO replication`);
    return Number(m[1]);
  }

  /** SIGKILL of the node on `port` (a crashed primary); its replica is promoted by the cluster. */
  async kill(port) {
    const node = this.nodes.find((n) => n.port === port);
    const child = node.child;
    process.kill(child.pid, "SIGKILL");
    await child.exited;
    node.child = null;
  }
}
