// The fold check: what each subscriber received, run through the real `@ag-ui/client` 1.0
// pipeline (tests/node/agui-fold.mjs: transport parse, verifyEvents, the reducer), must fold to
// what the log itself folds to (the thread read back with `?from=start`, through the same
// client), once the subscriber caught up with the log; and the broker's `/snapshot` must be
// that fold too. (Comparing clients with `/snapshot` alone is not enough: after a failover
// that lost a tail, a node's cached fold can agree with its clients and not with the log.)
//
// A client's connections become the client's runs as PROTOCOL §4.5 says (and as
// tests/common/agui_client.rs `client_streams` does): a connection that begins with a prelude
// starts a new stream, any other continues the previous one (an exact resume).

import { execFile } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { NODE_DIR } from "./deps.mjs";
import { sameJson } from "./checker.mjs";

/** The bodies one client has to accept, from its connections' items. */
export function clientBodies(conns) {
  const bodies = [];
  for (const conn of conns) {
    const body = conn.items.map((i) => `data: ${i.data}\n\n`).join("");
    const prelude = conn.items[0]?.signal === "prelude";
    if (bodies.length === 0 || prelude) bodies.push(body);
    else bodies[bodies.length - 1] += body;
  }
  return bodies;
}

/**
 * Folds every subscriber's stream, and each thread's log as read back from the broker, with the
 * real client. Each subscriber's fold is compared with its thread's log fold (or, when the log
 * could not be read back, with the broker's `/snapshot`); each `/snapshot` with the log fold.
 * Returns `{clients: [{name, ok, reason}], snapshots: [{name, ok, reason}]}`.
 *
 * @param {Array<{name, thread, conns}>} subscribers
 * @param {Map<string, object>} snapshots thread → `/snapshot` JSON
 * @param {Map<string, string>} logBodies thread → the log's SSE text (`?from=start`)
 * @param {string} dir where the cases file is written
 */
export async function foldCheck(subscribers, snapshots, logBodies, dir) {
  const cases = subscribers.map((s) => ({ name: s.name, threadId: s.thread, bodies: clientBodies(s.conns) }));
  for (const [thread, body] of logBodies) cases.push({ name: `log:${thread}`, threadId: thread, bodies: [body] });
  const file = path.join(dir, "fold-cases.json");
  fs.writeFileSync(file, JSON.stringify({ cases }));
  const stdout = await new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [path.join(NODE_DIR, "agui-fold.mjs"), file],
      { timeout: 120_000, maxBuffer: 256 * 1024 * 1024 },
      (error, out, err) => (error ? reject(new Error(`agui-fold.mjs: ${error.message}\n${err}`)) : resolve(out)),
    );
  });
  const { results } = JSON.parse(stdout);
  const byName = new Map(results.map((r) => [r.name, r]));
  // The reference of a thread: the log's fold when it was read back and the client took it.
  const reference = (thread) => {
    const log = byName.get(`log:${thread}`);
    if (log?.ok) return { what: "log", state: log.state, messages: log.messages };
    const snap = snapshots.get(thread);
    return snap ? { what: "/snapshot", state: snap.state, messages: snap.messages } : null;
  };
  const clients = subscribers.map((s) => {
    const r = byName.get(s.name);
    const ref = reference(s.thread);
    if (!ref) return { name: s.name, ok: false, reason: "nothing to compare with (no log, no snapshot)" };
    if (!r.ok) return { name: s.name, ok: false, reason: `the client refused a stream: ${r.error}` };
    return compare(s.name, r, ref);
  });
  const snapshotChecks = [];
  for (const [thread, snap] of snapshots) {
    const log = byName.get(`log:${thread}`);
    if (!log?.ok) continue;
    snapshotChecks.push(compare(thread, snap, { what: "log", state: log.state, messages: log.messages }));
  }
  return { clients, snapshots: snapshotChecks };
}

/** `{name, ok, reason}`: whether `got` has the reference's state and messages. */
function compare(name, got, ref) {
  if (!sameJson(got.state, ref.state)) {
    return { name, ok: false, reason: `state ${short(got.state)} ≠ ${ref.what} ${short(ref.state)}` };
  }
  if (!sameJson(got.messages, ref.messages)) {
    return { name, ok: false, reason: `messages ${short(texts(got.messages))} ≠ ${ref.what} ${short(texts(ref.messages))}` };
  }
  return { name, ok: true, reason: null };
}

/** The messages' lengths, for a readable note (`m1: 112 chars`). */
function texts(messages) {
  return (messages ?? []).map((m) => `${m.id}: ${typeof m.content === "string" ? `${m.content.length} chars` : m.role}`);
}

function short(value) {
  const s = JSON.stringify(value);
  return s.length > 120 ? `${s.slice(0, 60)}…${s.slice(-50)}` : s;
}
