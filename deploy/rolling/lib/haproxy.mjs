// HAProxy (Debian's package) in front of the broker slots, as an Ingress or a cloud load balancer
// is in front of the pods: health checks on `/readyz` (a draining node answers 503 and leaves
// the rotation, a started one joins once ready), `leastconn` (the algorithm for long-lived
// connections), each request balanced on its own (`http-server-close`), a connection refused
// retried on another server (`redispatch`: a browser's `EventSource` must never see the
// balancer's own 503). Every broker slot is in the configuration from the start and
// health-checked: a slot where nothing listens is DOWN, so HAProxy sends no client to a broker
// before its `/readyz` passed, as Kubernetes sends none to a pod before it is ready. (A server
// taken out of maintenance with `set server … state ready` counts as UP before its first check,
// and clients sent to it meanwhile get the balancer's 503.) A slot scaled in is put in
// maintenance with the runtime API once its broker exited.

import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

/** The backend's name in the config. */
const BACKEND = "brokers";

export class HaProxy {
  /**
   * @param {import("../../../loadtest/faults/lib/procs.mjs").Procs} procs
   * @param {number} port the frontend's port
   * @param {number[]} slots every broker slot's port (`b1`…)
   * @param {number} active slots with a broker from the start (the others are DOWN until one
   *   listens there)
   */
  constructor(procs, port, slots, active) {
    Object.assign(this, { procs, port, slots, active });
    this.base = `http://127.0.0.1:${port}`;
    this.socket = path.join(procs.dir, "haproxy.sock");
    this.config = path.join(procs.dir, "haproxy.cfg");
  }

  /** The configuration file's text. */
  render() {
    const servers = this.slots.map(
      (port, i) => `  server b${i + 1} 127.0.0.1:${port} check`,
    );
    return [
      "global",
      `  stats socket ${this.socket} mode 600 level admin`,
      "  maxconn 4000", // needs 2 × maxconn file descriptors (both sides)
      "defaults",
      "  mode http",
      "  timeout connect 2s",
      "  timeout client 60s", // above sse.heartbeat (15 s): idle streams stay open
      "  timeout server 60s",
      "  timeout http-request 10s",
      "  retries 3",
      "  option redispatch 1",
      "  option http-server-close",
      "frontend fe",
      `  bind 127.0.0.1:${this.port}`,
      `  default_backend ${BACKEND}`,
      `backend ${BACKEND}`,
      "  balance leastconn",
      "  option httpchk GET /readyz",
      "  http-check expect status 200",
      // A check answered within 2 s counts (a loaded machine's /readyz can take over 500 ms;
      // Kubernetes' readiness probe allows 1 s by default); 2 failures 1 s apart take a server
      // out, within the broker's shutdown.drain (5 s).
      "  timeout check 2s",
      "  default-server inter 1s fall 2 rise 2",
      ...servers,
      "",
    ].join("\n");
  }

  /**
   * Writes the config and starts HAProxy in the foreground; resolves once its runtime API
   * answers and the slots without a broker are DOWN (servers start UP until checked).
   */
  async start() {
    fs.writeFileSync(this.config, this.render());
    this.child = this.procs.spawn("haproxy", "haproxy", ["-db", "-f", this.config]);
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      if (this.child.exitCode !== null) throw new Error("haproxy exited at start (see haproxy.log)");
      if (fs.existsSync(this.socket) && (await this.command("show info").catch(() => "")).includes("Name: HAProxy")) {
        const states = await this.states();
        if (this.slots.every((_, i) => i < this.active || states[`b${i + 1}`] === "DOWN")) return this;
      }
      await sleep(100);
    }
    throw new Error("haproxy: runtime API not open, or empty slots not DOWN, within 15 s");
  }

  /** One runtime API command; resolves to its answer. */
  command(line) {
    return new Promise((resolve, reject) => {
      const conn = net.createConnection(this.socket);
      let out = "";
      conn.setEncoding("utf8");
      conn.on("connect", () => conn.end(`${line}\n`));
      conn.on("data", (d) => (out += d));
      conn.on("end", () => resolve(out));
      conn.on("error", reject);
      conn.setTimeout(5000, () => conn.destroy(new Error(`haproxy: ${line}: timeout`)));
    });
  }

  /** Takes slot `i` out of rotation (maintenance). */
  async remove(i) {
    const out = await this.command(`set server ${BACKEND}/b${i + 1} state maint`);
    if (out.trim()) throw new Error(`haproxy remove b${i + 1}: ${out}`);
  }

  /** `{b1: "UP", …}`: each server's operational state as HAProxy's checks see it. */
  async states() {
    const csv = await this.command("show stat");
    const out = {};
    for (const line of csv.split("\n")) {
      const f = line.split(",");
      if (f[0] === BACKEND && /^b\d+$/.test(f[1])) out[f[1]] = f[17];
    }
    return out;
  }

  /**
   * Waits until every slot in `indices` is `UP` at once (at most `ms`); resolves to the slots
   * still not `UP` at the end (empty when all are).
   */
  async waitAllUp(indices, ms) {
    const deadline = Date.now() + ms;
    for (;;) {
      const states = await this.states();
      const down = indices.filter((i) => states[`b${i + 1}`] !== "UP").map((i) => `b${i + 1} ${states[`b${i + 1}`]}`);
      if (down.length === 0 || Date.now() >= deadline) return down;
      await sleep(100);
    }
  }

  /** Waits until slot `i` is `UP` in HAProxy (its `/readyz` passed `rise` checks). */
  async waitUp(i, ms = 30_000) {
    const deadline = Date.now() + ms;
    while (Date.now() < deadline) {
      if ((await this.states())[`b${i + 1}`] === "UP") return;
      await sleep(100);
    }
    throw new Error(`haproxy: b${i + 1} not UP within ${ms / 1000} s`);
  }
}
