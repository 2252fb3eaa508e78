// The fault suite's driver: runs each experiment (its own redis-server and broker processes on
// loopback, bounded in count and time), judges its targets, writes the table.
//
// Usage: node loadtest/faults/faults.mjs [--long] [--only a,b] [--out DIR] [--record]
//                                        [--strict] [--binary PATH]
// (loadtest/faults/run.sh builds the binary and installs the clients first; use it.)
//
// Exit code: 0 when every target is met or waived (waivers.txt), 1 when one is missed, 2 on a
// usage or set-up error.

import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { ROOT } from "./lib/deps.mjs";
import { killEverything, Procs } from "./lib/procs.mjs";
import { judge, markdown, readWaivers } from "./lib/report.mjs";

/** The experiments, in the order they run (each is experiments/<name>.mjs). */
const NAMES = [
  "kill9-node",
  "sigterm-drain",
  "redis-restart-empty",
  "redis-pause",
  "stalled-resume",
  "hostile-input",
  "redis-failover",
];

/** Each experiment's size in the short form (CI, about 3 minutes in all) and the long form. */
const FORMS = {
  short: {
    "kill9-node": { subscribers: 6, seconds: 6 },
    "sigterm-drain": { subscribers: 6, during: 4, seconds: 12 },
    "redis-restart-empty": { subscribers: 6, seconds: 7 },
    "redis-pause": { subscribers: 3, pauseSeconds: 10, seconds: 14 },
    "stalled-resume": { full: 20, overflow: 4, fullMiB: 3.5, overflowMiB: 6 },
    "hostile-input": { endless: 20, endlessMiB: 8, slow: 4, slowloris: 20, fuzz: 200, seconds: 12 },
    "redis-failover": { subscribers: 6, seconds: 7 },
  },
  long: {
    "kill9-node": { subscribers: 20, seconds: 20 },
    "sigterm-drain": { subscribers: 20, during: 10, seconds: 25 },
    "redis-restart-empty": { subscribers: 20, seconds: 15 },
    "redis-pause": { subscribers: 10, pauseSeconds: 10, seconds: 20 },
    "stalled-resume": { full: 50, overflow: 10, fullMiB: 3.5, overflowMiB: 8 },
    "hostile-input": { endless: 20, endlessMiB: 15, slow: 10, slowloris: 50, fuzz: 2000, seconds: 30 },
    "redis-failover": { subscribers: 20, seconds: 15 },
  },
};
/** Hard limit of one experiment, set-up and checks included. */
const EXPERIMENT_LIMIT_MS = { short: 120_000, long: 300_000 };

const { values: args } = parseArgs({
  options: {
    long: { type: "boolean", default: false },
    only: { type: "string" },
    out: { type: "string" },
    record: { type: "boolean", default: false },
    strict: { type: "boolean", default: false },
    binary: { type: "string", default: path.join(ROOT, "target/debug/agui-fanout") },
  },
});
const form = args.long ? "long" : "short";
const out = path.resolve(args.out ?? path.join(ROOT, "loadtest/results", `faults-${form}`));
const binary = path.resolve(args.binary);
if (!fs.existsSync(binary)) {
  console.error(`faults: no broker binary at ${binary} (cargo build first, or --binary)`);
  process.exit(2);
}
const names = args.only ? args.only.split(",") : NAMES;
const unknown = names.filter((n) => !NAMES.includes(n));
if (unknown.length > 0) {
  console.error(`faults: unknown experiment(s) ${unknown.join(", ")}; known: ${NAMES.join(", ")}`);
  process.exit(2);
}
const chosen = [];
for (const name of NAMES.filter((n) => names.includes(n))) {
  chosen.push((await import(`./experiments/${name}.mjs`)).default);
}

// Nothing outlives the run: every child is killed on exit, whatever the way out.
process.on("exit", killEverything);
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => {
    killEverything();
    process.exit(130);
  });
}

fs.rmSync(out, { recursive: true, force: true });
fs.mkdirSync(out, { recursive: true });
const started = Date.now();
const log = (msg) => console.error(`[faults ${((Date.now() - started) / 1000).toFixed(1)}s] ${msg}`);

const rows = [];
for (const experiment of chosen) {
  const dir = path.join(out, experiment.name);
  const procs = new Procs(dir);
  const deferred = [];
  const ctx = {
    name: experiment.name,
    out: dir,
    procs,
    binary,
    form,
    params: FORMS[form][experiment.name],
    log: (msg) => log(`${experiment.name}: ${msg}`),
    defer: (fn) => deferred.push(fn),
  };
  log(`${experiment.name}: ${experiment.fault}`);
  const t0 = Date.now();
  let row;
  let timer;
  try {
    const limit = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${EXPERIMENT_LIMIT_MS[form] / 1000} s`)), EXPERIMENT_LIMIT_MS[form]);
    });
    row = await Promise.race([experiment.run(ctx), limit]);
  } catch (error) {
    log(`${experiment.name}: ERROR ${error.stack ?? error}`);
    row = { targets: [{ name: "experiment ran", value: String(error.message ?? error), ok: false }], notes: [] };
  } finally {
    clearTimeout(timer);
    for (const fn of deferred.reverse()) {
      try {
        await fn();
      } catch {
        // Best effort: the processes are killed below anyway.
      }
    }
    await procs.stopAll();
  }
  row.name = experiment.name;
  row.fault = experiment.fault;
  row.seconds = (Date.now() - t0) / 1000;
  rows.push(row);
  const misses = row.targets.filter((t) => !t.ok).map((t) => `${t.name}=${t.value}`);
  log(`${experiment.name}: done in ${row.seconds.toFixed(1)} s; ${misses.length === 0 ? "all targets met" : `missed: ${misses.join(", ")}`}`);
}

const waivers = args.strict ? [] : readWaivers(path.join(ROOT, "loadtest/faults/waivers.txt"));
const failing = judge(rows, waivers);
const git = (...a) => {
  try {
    return execFileSync("git", a, { cwd: ROOT, encoding: "utf8" }).trim();
  } catch {
    return "unknown";
  }
};
const meta = {
  form,
  commit: git("log", "-1", "--format=%h").slice(0, 100),
  // The last commit that changed what the broker is built from: the suite's own commits do not.
  brokerCommit: git("log", "-1", "--format=%h (%s)", "--", "src", "Cargo.toml", "Cargo.lock", "config").slice(0, 140),
  dirty: git("status", "--porcelain", "--untracked-files=no") !== "",
  date: new Date().toISOString().slice(0, 16).replace("T", " ") + " UTC",
  binary: path.relative(ROOT, binary),
  cpus: os.cpus().length,
  seconds: (Date.now() - started) / 1000,
};
const md = markdown({ rows, meta });
fs.writeFileSync(path.join(out, "RESULTS.md"), md);
fs.writeFileSync(path.join(out, "results.json"), JSON.stringify({ meta, rows }, null, 2));
if (args.record) fs.writeFileSync(path.join(ROOT, "loadtest/faults/RESULTS.md"), md);
log(`results in ${path.relative(ROOT, out)}/RESULTS.md${args.record ? " and loadtest/faults/RESULTS.md" : ""}`);
for (const row of rows) {
  for (const t of row.targets) if (!t.ok && t.verdict.startsWith("waived")) log(`waived: ${row.name}: ${t.name} = ${t.value}`);
  for (const t of row.targets) {
    if (t.verdict.startsWith("pass (waived")) log(`met though waived (remove the waiver once it stays met): ${row.name}: ${t.name}`);
  }
}
if (failing.length > 0) {
  log(`FAILED: ${failing.length} target(s) missed:\n  ${failing.join("\n  ")}`);
  process.exit(1);
}
log(`all ${rows.length} experiment(s) met their targets${waivers.length > 0 ? " (or are waived)" : ""}`);
process.exit(0);
