// Real parts for the package's tests: the agui-fanout binary as a broker (`serve`), as the demo
// agent (`demo-agent`) and as the token issuer (`token`), each a child process; plus readers of
// the broker's own view of a thread (`/snapshot`, the raw log with `?from=start`).
//
// The binary is $AGUI_FANOUT_BIN (tests/client_js.rs passes the one cargo built), else
// target/debug/agui-fanout of this repository.

import { spawn } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { FanoutAgent, readSse } from "@agui-fanout/client";

const here = path.dirname(fileURLToPath(import.meta.url));
export const BIN =
  process.env.AGUI_FANOUT_BIN ?? path.resolve(here, "../../../target/debug/agui-fanout");

/** The brokers' working directory: empty, so that no `config/default.toml` is read and only
 * the environment configures them. */
const workDir = fs.mkdtempSync(path.join(os.tmpdir(), "agui-fanout-js-"));

/** Children to kill when the test process ends, whatever happened. */
const children = new Set();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
  fs.rmSync(workDir, { recursive: true, force: true });
});

/** A TCP port free right now on 127.0.0.1. */
export async function freePort() {
  const server = net.createServer();
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address();
  server.close();
  await once(server, "close");
  return port;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls `f` every 20 ms until it returns truthy or `ms` passed; returns its last value. `what`
 * names what is awaited (a function: called for the message, with the state at the timeout).
 */
export async function until(f, ms = 10_000, what = "condition") {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) {
      const detail = typeof what === "function" ? what() : what;
      throw new Error(`timed out after ${ms} ms waiting for ${detail}`);
    }
    await sleep(20);
  }
}

function track(child) {
  children.add(child);
  child.once("exit", () => children.delete(child));
  return child;
}

/**
 * `agui-fanout demo-agent` on a free port; resolves once it printed its address.
 * @returns {{url: string, child: import("node:child_process").ChildProcess, kill(): void}}
 */
export async function startDemoAgent(args = []) {
  const child = track(
    spawn(BIN, ["demo-agent", "--listen", "127.0.0.1:0", ...args], {
      env: { ...process.env, AGUI_LOG: "warn" },
      stdio: ["ignore", "pipe", "inherit"],
    }),
  );
  const lines = readline.createInterface({ input: child.stdout });
  const [first] = await once(lines, "line");
  const prefix = "demo agent listening on ";
  if (!first.startsWith(prefix)) throw new Error(`unexpected demo-agent line: ${first}`);
  lines.on("line", () => {});
  return { url: first.slice(prefix.length), child, kill: () => child.kill("SIGKILL") };
}

/**
 * `agui-fanout serve` on `port` (a free one by default) with `env` added; resolves once
 * `/healthz` answers. `stop()` SIGKILLs it and waits for the exit.
 */
export async function startBroker(env = {}, port) {
  port ??= await freePort();
  const child = track(
    spawn(BIN, ["serve", "--listen", `127.0.0.1:${port}`], {
      cwd: workDir,
      env: {
        ...process.env,
        AGUI_LOG: process.env.TEST_AGUI_LOG ?? "warn",
        AGUI_SSE__RETRY_MS: "100",
        AGUI_SHUTDOWN__DRAIN: "300ms",
        ...env,
      },
      stdio: ["ignore", process.env.TEST_AGUI_LOG ? "inherit" : "ignore", "inherit"],
    }),
  );
  const base = `http://127.0.0.1:${port}`;
  await until(
    async () => {
      if (child.exitCode !== null) throw new Error(`broker exited with ${child.exitCode}`);
      try {
        return (await fetch(`${base}/healthz`)).ok;
      } catch {
        return false;
      }
    },
    10_000,
    "the broker's /healthz",
  );
  return {
    base,
    port,
    child,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGKILL");
      await once(child, "exit");
    },
  };
}

/** An HS256 token from `agui-fanout token` (PROTOCOL §9). */
export async function issueToken(secret, { subscribe = [], publish = [], ttl = "1h" } = {}) {
  const args = ["token", "--secret", secret, "--ttl", ttl];
  for (const s of subscribe) args.push("--subscribe", s);
  for (const p of publish) args.push("--publish", p);
  const child = spawn(BIN, args, { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  const [code] = await once(child, "exit");
  if (code !== 0) throw new Error(`agui-fanout token exited with ${code}`);
  return out.trim();
}

/** A thread id no other test uses. */
export function threadId(tag) {
  return `t-js-${tag}-${Math.random().toString(16).slice(2, 10)}`;
}

/** `GET /v1/threads/{thread}/snapshot`: the broker's fold of the thread. */
export async function snapshot(base, thread, token) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const r = await fetch(`${base}/v1/threads/${thread}/snapshot`, { headers });
  if (!r.ok) throw new Error(`snapshot: HTTP ${r.status} ${await r.text()}`);
  return r.json();
}

/**
 * The snapshot once it stands for `lastId`. A node that follows the thread answers from its own
 * fold, which its tail brings up to the log a moment after a publish returns: the snapshot is
 * not read-your-writes.
 */
export async function snapshotAt(base, thread, lastId, token) {
  let last;
  await until(
    async () => {
      last = await snapshot(base, thread, token);
      return last.lastEventId === lastId;
    },
    10_000,
    () => `the snapshot at ${lastId} (it stands for ${last?.lastEventId})`,
  );
  return last;
}

/** Waits until the thread's run (another than `previousRunId`) has ended in the log; returns
 * the snapshot. */
export async function runEnded(base, thread, token, previousRunId, ms = 20_000) {
  return until(
    async () => {
      const s = await snapshot(base, thread, token);
      return s.run && s.run.status !== "running" && s.run.runId !== previousRunId ? s : null;
    },
    ms,
    "the run's end in the log",
  );
}

/**
 * The thread's log as the broker holds it: `GET …/events?from=start` read up to `lastId`
 * (every event of an untrimmed log, each with its id). Returns `[{id, event}]`.
 */
export async function readLog(base, thread, lastId, token) {
  const headers = { Accept: "text/event-stream" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), 10_000);
  const r = await fetch(`${base}/v1/threads/${thread}/events?from=start`, { headers, signal: ac.signal });
  const out = [];
  try {
    for await (const item of readSse(r.body)) {
      if (item.kind !== "frame") continue;
      out.push({ id: item.frame.id, event: JSON.parse(item.frame.data) });
      if (item.frame.id === lastId) break;
    }
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
  return out;
}

/** The agent's view: what tests compare with the broker's fold. */
export function view(agent) {
  return { messages: agent.messages, state: agent.state };
}

/** The fields that tell one event from another (the client's pipeline adds defaults to others). */
export function essence(event) {
  const keys = ["type", "runId", "messageId", "toolCallId", "stepName", "name", "delta", "snapshot", "value", "content", "outcome"];
  return Object.fromEntries(keys.filter((k) => event[k] !== undefined).map((k) => [k, event[k]]));
}

/**
 * One run of the demo agent published straight to the thread, without the gateway: the agent's
 * SSE answer piped into `POST /v1/threads/{thread}/events` as an SSE ingest (PROTOCOL §2
 * Publish). Resolves with the broker's reply (`{count, firstId, lastId}`); rejects when the
 * broker does not take the stream whole (e.g. it died mid-run).
 */
export async function publishDemoRun(base, demoUrl, thread, { token, runId, messages = [], state, resume } = {}) {
  runId ??= `run-${Math.random().toString(16).slice(2, 10)}`;
  const input = { threadId: thread, runId, messages, tools: [], context: [], forwardedProps: {} };
  if (state !== undefined) input.state = state;
  if (resume !== undefined) input.resume = resume;
  const agent = await fetch(demoUrl, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify(input),
  });
  if (!agent.ok) throw new Error(`demo agent: HTTP ${agent.status}`);
  const headers = { "Content-Type": "text/event-stream" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(`${base}/v1/threads/${thread}/events`, {
    method: "POST",
    headers,
    body: agent.body,
    duplex: "half",
  });
  const reply = await r.json();
  if (!r.ok) throw new Error(`publish: HTTP ${r.status} ${JSON.stringify(reply)}`);
  return reply;
}

/**
 * A FanoutAgent that `t` stops when it ends, whatever happened: a follow left running would
 * keep reconnecting, and the test process would never exit.
 */
export function fanoutAgent(t, config) {
  const agent = new FanoutAgent(config);
  t.after(() => agent.abortRun());
  return agent;
}
