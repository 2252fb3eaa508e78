// The processes an experiment starts: private `redis-server`s and broker nodes on loopback.
//
// Every child is registered in one `Procs` owned by the experiment; `Procs.stopAll()` kills
// what is still running (SIGKILL: nothing here persists data), and the suite calls it after
// each experiment and again at exit, so nothing outlives the run. Each child's output goes to
// a log file in the experiment's output folder.

import { spawn, execFile } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

/** Every `Procs` alive, so that an exit handler can kill their children synchronously. */
const LIVE = new Set();

/** Kills every registered child of every `Procs` (SIGKILL), synchronously: for `exit`. */
export function killEverything() {
  for (const procs of LIVE) procs.killNow();
}

/** A free TCP port on 127.0.0.1 (probed by binding port 0; a race is retried by callers). */
export async function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** The children of one experiment. */
export class Procs {
  /** @param {string} dir folder for the children's log files (created). */
  constructor(dir) {
    this.dir = dir;
    fs.mkdirSync(dir, { recursive: true });
    this.children = new Set();
    LIVE.add(this);
  }

  /**
   * Starts `cmd args` with stdout and stderr appended to `<dir>/<name>.log`; returns the child
   * (with `exited`, a promise of `{code, signal}`).
   */
  spawn(name, cmd, args, env = {}) {
    const log = fs.openSync(path.join(this.dir, `${name}.log`), "a");
    const child = spawn(cmd, args, {
      env: { ...process.env, ...env },
      stdio: ["ignore", log, log],
    });
    fs.closeSync(log);
    child.exited = new Promise((resolve) => {
      child.on("exit", (code, signal) => {
        this.children.delete(child);
        resolve({ code, signal });
      });
      child.on("error", (error) => {
        this.children.delete(child);
        resolve({ code: null, signal: null, error });
      });
    });
    this.children.add(child);
    return child;
  }

  /** Kills every child still running (SIGCONT first, so a stopped one can die) and reaps it. */
  async stopAll() {
    const waits = [];
    for (const child of this.children) {
      try {
        process.kill(child.pid, "SIGCONT");
        process.kill(child.pid, "SIGKILL");
      } catch {
        // Already gone.
      }
      waits.push(child.exited);
    }
    await Promise.all(waits);
    LIVE.delete(this);
  }

  /** `stopAll` without waiting, for the process's `exit` handler. */
  killNow() {
    for (const child of this.children) {
      try {
        process.kill(child.pid, "SIGCONT");
        process.kill(child.pid, "SIGKILL");
      } catch {
        // Already gone.
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Redis

/** Runs `redis-cli -p <port> args…` and returns its stdout (trimmed); rejects after `ms`. */
export function redisCli(port, args, ms = 5000) {
  return new Promise((resolve, reject) => {
    execFile(
      "redis-cli",
      ["-h", "127.0.0.1", "-p", String(port), ...args],
      { timeout: ms },
      (error, stdout, stderr) => {
        if (error) reject(new Error(`redis-cli ${args.join(" ")}: ${error.message} ${stderr}`));
        else resolve(stdout.trim());
      },
    );
  });
}

/**
 * A private `redis-server` on `127.0.0.1:<port>`, no persistence: a restart comes back empty.
 * `extra` are more command-line options (e.g. `["--replicaof", "127.0.0.1", "6400"]`).
 */
export class Redis {
  constructor(procs, name, port, extra = []) {
    this.procs = procs;
    this.name = name;
    this.port = port;
    this.extra = extra;
    this.child = null;
    this.url = `redis://127.0.0.1:${port}`;
  }

  /** Starts a server on a free port and waits until it answers PING. */
  static async start(procs, name, extra = []) {
    for (let attempt = 0; attempt < 5; attempt++) {
      const redis = new Redis(procs, name, await freePort(), extra);
      if (await redis.spawnAndWait()) return redis;
    }
    throw new Error(`${name}: could not start redis-server`);
  }

  async spawnAndWait() {
    const dir = path.join(this.procs.dir, `${this.name}-data`);
    fs.mkdirSync(dir, { recursive: true });
    this.child = this.procs.spawn(this.name, "redis-server", [
      "--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
      "--dir", dir, ...this.extra,
    ]);
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline) {
      if (this.child.exitCode !== null || this.child.signalCode !== null) return false;
      if (await this.ping()) return true;
      await sleep(50);
    }
    return false;
  }

  /** True when the server answers PING within 1 s. */
  async ping() {
    try {
      return (await redisCli(this.port, ["ping"], 1000)) === "PONG";
    } catch {
      return false;
    }
  }

  /** `redis-cli` against this server. */
  cli(...args) {
    return redisCli(this.port, args);
  }

  /** SIGKILL and reap: the data is gone. */
  async kill() {
    if (!this.child) return;
    const child = this.child;
    this.child = null;
    try {
      process.kill(child.pid, "SIGCONT");
      process.kill(child.pid, "SIGKILL");
    } catch {
      // Already gone.
    }
    await child.exited;
  }

  /** Starts again, empty, on the same port. */
  async restart() {
    await this.kill();
    for (let attempt = 0; attempt < 20; attempt++) {
      if (await this.spawnAndWait()) return;
      await sleep(100);
    }
    throw new Error(`${this.name}: could not restart on port ${this.port}`);
  }

  /** SIGSTOP: connections stay open, nothing answers. */
  pause() {
    process.kill(this.child.pid, "SIGSTOP");
  }

  /** SIGCONT. */
  resume() {
    process.kill(this.child.pid, "SIGCONT");
  }
}

// ---------------------------------------------------------------------------------------------
// Broker nodes

/** Strips ANSI colour codes (the broker's log may be coloured). */
const plain = (s) => s.replace(/\x1b\[[0-9;]*m/g, "");

/** One `agui-fanout serve` process. */
export class Broker {
  /**
   * @param {object} o
   * @param {Procs} o.procs
   * @param {string} o.name
   * @param {string} o.binary path of `agui-fanout`
   * @param {string} [o.redisUrl] empty: the memory backend
   * @param {object} [o.env] more `AGUI_*` settings
   * @param {number} [o.port] 0: a free port chosen by the kernel
   */
  constructor({ procs, name, binary, redisUrl = "", env = {}, port = 0 }) {
    Object.assign(this, { procs, name, binary, redisUrl, env, port });
    this.child = null;
    this.addr = null;
    this.base = null;
    this.baselineRss = null;
    this.peakRss = 0;
    this.starts = 0;
  }

  /** Starts the node and waits until it logs its address (30 s at most). */
  async start() {
    this.starts += 1;
    const name = `${this.name}-${this.starts}`;
    const listen = `127.0.0.1:${this.port}`;
    this.logFile = path.join(this.procs.dir, `${name}.log`);
    // Only what this start writes counts (the file may hold an earlier run's lines).
    const offset = fs.existsSync(this.logFile) ? fs.statSync(this.logFile).size : 0;
    this.child = this.procs.spawn(name, this.binary, ["serve", "--listen", listen], {
      AGUI_LOG: "info",
      AGUI_REDIS_URL: this.redisUrl,
      NO_COLOR: "1",
      ...this.env,
    });
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      const text = plain(fs.readFileSync(this.logFile).subarray(offset).toString("utf8"));
      const match = /listening addr=([0-9.]+:[0-9]+)/.exec(text);
      if (match) {
        this.addr = match[1];
        this.port = Number(this.addr.split(":")[1]);
        this.base = `http://${this.addr}`;
        // Idle RSS right after start: the memory formula's fixed part is measured, not guessed.
        const rss = this.status().VmRSS;
        if (this.baselineRss === null) this.baselineRss = rss;
        return this;
      }
      if (this.child.exitCode !== null || this.child.signalCode !== null) {
        throw new Error(`${name} exited before listening:\n${text.slice(-2000)}`);
      }
      await sleep(50);
    }
    throw new Error(`${name} did not report its address within 30 s`);
  }

  /** True while the process runs. */
  get running() {
    return this.child !== null && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** `/proc/<pid>/status` memory lines in bytes (`VmRSS`, `VmHWM`), `{}` when gone. */
  status() {
    if (!this.child) return {};
    try {
      const text = fs.readFileSync(`/proc/${this.child.pid}/status`, "utf8");
      const out = {};
      for (const key of ["VmRSS", "VmHWM"]) {
        const m = new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(text);
        if (m) out[key] = Number(m[1]) * 1024;
      }
      return out;
    } catch {
      return {};
    }
  }

  /** Reads the process's peak RSS (`VmHWM`, the kernel's high-water mark) into `peakRss`. */
  notePeak() {
    const { VmHWM } = this.status();
    if (VmHWM) this.peakRss = Math.max(this.peakRss, VmHWM);
    return this.peakRss;
  }

  /** SIGKILL (after noting its peak RSS) and reap. */
  async kill9() {
    this.notePeak();
    const child = this.child;
    process.kill(child.pid, "SIGKILL");
    await child.exited;
  }

  /** SIGTERM: the node drains (PROTOCOL §9) and exits by itself. */
  sigterm() {
    this.notePeak();
    process.kill(this.child.pid, "SIGTERM");
  }

  /** Waits up to `ms` for the process to exit; SIGKILL after that. Returns how it ended. */
  async waitExit(ms) {
    const child = this.child;
    const timer = sleep(ms).then(() => "timeout");
    const how = await Promise.race([child.exited, timer]);
    if (how === "timeout") {
      this.notePeak();
      process.kill(child.pid, "SIGKILL");
      await child.exited;
      return { timedOut: true };
    }
    return how;
  }

  /** Notes the peak, then SIGTERM and wait (SIGKILL after `ms`). */
  async stop(ms = 20_000) {
    if (!this.running) return;
    this.sigterm();
    await this.waitExit(ms);
  }
}
