// A real Prometheus (Debian's package) scraping the brokers with deploy/prometheus's alert rules.
// Targets come from a file (`file_sd_configs`) rewritten on each scale step, as Kubernetes
// service discovery lists the pods that exist. The rules are the real file with every duration
// (`for:` and range selectors) divided by `SPEED` so that a bounded test sees alerts fire and
// resolve: `for: 2m` becomes `for: 4s`, `[5m]` becomes `[10s]`; scrapes and rule evaluations
// run every second. Nothing else in the rules changes. The alerts are read from
// `/api/v1/alerts` every 500 ms and kept as a timeline.

import fs from "node:fs";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { execFileSync } from "node:child_process";
import { ROOT } from "../../../loadtest/faults/lib/deps.mjs";

/** The factor every duration of the rules is divided by. */
export const SPEED = 30;

const UNIT_S = { s: 1, m: 60, h: 3600, d: 86400 };

/** `"2m"` → `"4s"` (divided by `SPEED`, whole seconds, at least 1 s). */
function shorten(value, unit) {
  const seconds = Math.max(1, Math.round((Number(value) * UNIT_S[unit]) / SPEED));
  return `${seconds}s`;
}

/**
 * The rules file's text with every `for:` duration and every range selector `[…]` shortened;
 * throws when a duration it does not understand is left (so a new form is not missed silently).
 */
export function shortenRules(text) {
  const out = text
    .replace(/^(\s*for:\s*)(\d+)([smhd])\s*$/gm, (_, head, v, u) => `${head}${shorten(v, u)}`)
    .replace(/\[(\d+)([smhd])\]/g, (_, v, u) => `[${shorten(v, u)}]`);
  const left = out
    .split("\n")
    .filter((l) => !/^\s*#/.test(l))
    .find((l) => (/^\s*for:/.test(l) && !/^\s*for:\s*\d+s\s*$/.test(l)) || /\[(?!\d+s\])[^\]]*\]/.test(l));
  if (left) throw new Error(`rules: a duration not shortened: ${left.trim()}`);
  return out;
}

export class Prometheus {
  /**
   * @param {import("../../../loadtest/faults/lib/procs.mjs").Procs} procs
   * @param {number} port its web port
   */
  constructor(procs, port) {
    Object.assign(this, { procs, port });
    this.base = `http://127.0.0.1:${port}`;
    this.dir = path.join(procs.dir, "prometheus");
    this.targetsFile = path.join(this.dir, "targets.json");
    this.rulesFile = path.join(this.dir, "agui-fanout.rules.yml");
    /** `alertname/instance` → `{pending, firing, resolved}` (ms timestamps, per episode). */
    this.episodes = [];
    this.open = new Map();
  }

  /** Writes config, targets and the shortened rules (checked by promtool), starts Prometheus. */
  async start(targets) {
    fs.mkdirSync(path.join(this.dir, "data"), { recursive: true });
    const real = fs.readFileSync(path.join(ROOT, "deploy/prometheus/agui-fanout.rules.yml"), "utf8");
    fs.writeFileSync(this.rulesFile, shortenRules(real));
    execFileSync("promtool", ["check", "rules", this.rulesFile], { stdio: "pipe" });
    this.setTargets(targets);
    const config = path.join(this.dir, "prometheus.yml");
    fs.writeFileSync(
      config,
      [
        "global:",
        "  scrape_interval: 1s",
        "  scrape_timeout: 900ms",
        "  evaluation_interval: 1s",
        "rule_files:",
        `  - ${this.rulesFile}`,
        "scrape_configs:",
        "  - job_name: agui-fanout", // the job AguiFanoutDown names
        "    file_sd_configs:",
        `      - files: [${this.targetsFile}]`,
        "",
      ].join("\n"),
    );
    this.child = this.procs.spawn("prometheus", "prometheus", [
      `--config.file=${config}`,
      `--storage.tsdb.path=${path.join(this.dir, "data")}`,
      `--web.listen-address=127.0.0.1:${this.port}`,
      "--storage.tsdb.retention.time=1h",
    ]);
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (this.child.exitCode !== null) throw new Error("prometheus exited at start (see prometheus.log)");
      try {
        if ((await fetch(`${this.base}/-/ready`)).ok) return this;
      } catch {
        // Not listening yet.
      }
      await sleep(200);
    }
    throw new Error("prometheus not ready within 30 s");
  }

  /** Replaces the scrape targets (`host:port` strings); Prometheus picks the file up itself. */
  setTargets(targets) {
    const tmp = `${this.targetsFile}.tmp`;
    fs.writeFileSync(tmp, JSON.stringify([{ targets }]));
    fs.renameSync(tmp, this.targetsFile);
  }

  /** Polls `/api/v1/alerts` every 500 ms until the returned stop is called. */
  watch() {
    let stopped = false;
    const loop = (async () => {
      while (!stopped) {
        await this.poll().catch(() => {});
        await sleep(500);
      }
    })();
    return async () => {
      stopped = true;
      await loop;
      await this.poll().catch(() => {});
    };
  }

  async poll() {
    const res = await fetch(`${this.base}/api/v1/alerts`, { signal: AbortSignal.timeout(2000) });
    const body = await res.json();
    const now = Date.now();
    const seen = new Set();
    for (const a of body.data.alerts) {
      const key = `${a.labels.alertname} ${a.labels.instance ?? a.labels.cause ?? ""}`.trim();
      seen.add(key);
      let ep = this.open.get(key);
      if (!ep) {
        ep = { key, alertname: a.labels.alertname, instance: a.labels.instance ?? null, pending: now, firing: null, resolved: null };
        this.open.set(key, ep);
        this.episodes.push(ep);
      }
      if (a.state === "firing" && ep.firing === null) ep.firing = now;
    }
    for (const [key, ep] of this.open) {
      if (!seen.has(key)) {
        ep.resolved = now;
        this.open.delete(key);
      }
    }
  }

  /** One instant query's result vector. */
  async query(expr) {
    const url = `${this.base}/api/v1/query?query=${encodeURIComponent(expr)}`;
    const body = await (await fetch(url, { signal: AbortSignal.timeout(5000) })).json();
    return body.data.result;
  }
}
