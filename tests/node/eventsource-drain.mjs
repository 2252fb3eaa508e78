// Real-client drain test (PROTOCOL §9): the npm `eventsource` package (a WHATWG-compliant
// EventSource for Node) follows a thread through the SIGTERM drain of node A, with node B on the
// same Redis. Between the client and the nodes sits a load balancer that only checks TCP (the
// worst case): each new connection goes to A while A accepts connections, then to B. So after
// A's drain ends the client's stream, its reconnects keep landing on the draining A until A
// stops listening: each must be answered in a way that makes an EventSource come back (200,
// a short `retry:`, no `id:`), never with an error status that would close it for good.
//
// Checked: every published event arrives exactly once, in order; the EventSource is never
// CLOSED; every answer is 200 (a connection A's closing listener drops unanswered is a network
// error the EventSource retries: allowed on A after SIGTERM only); A answered at least one reconnect during its drain, with no id;
// every `retry:` A sent after SIGTERM is at most 1.5 × retryMs; every reconnect carried the
// last id received; the client ends up on B.
//
// Usage: node tests/node/eventsource-drain.mjs <base A> <base B> <pid A> <thread> <events> <retryMs>
// Exits 0 on success (a JSON summary on stdout), 1 with a message on stderr otherwise.

import net from "node:net";
import { EventSource } from "eventsource";

const [baseA, baseB, pidArg, thread, countArg, retryArg] = process.argv.slice(2);
if (!retryArg) {
  console.error("usage: eventsource-drain.mjs <base A> <base B> <pid A> <thread> <events> <retryMs>");
  process.exit(2);
}
const PID_A = Number(pidArg);
const TOTAL = Number(countArg);
const RETRY_MS = Number(retryArg);
const BATCH = 5;
const BATCH_PAUSE_MS = 25;
// SIGTERM to A once this many events were received.
const TERM_AFTER = Math.floor(TOTAL / 4);
const TIMEOUT_MS = 30_000;

function fail(message) {
  console.error(`eventsource-drain: FAIL: ${message}`);
  process.exit(1);
}

// RUN_STARTED, CUSTOM × (TOTAL - 2) numbered by `value.seq`, RUN_FINISHED: never coalesced.
const runId = `run-${Date.now()}`;
const events = [{ type: "RUN_STARTED", threadId: thread, runId }];
for (let seq = 1; seq < TOTAL - 1; seq++) events.push({ type: "CUSTOM", name: "seq", value: { seq } });
events.push({ type: "RUN_FINISHED", threadId: thread, runId });
const expected = events.map((e) => JSON.stringify(e));

const received = [];
let lastIdReceived = null;
let termAt = null;

// ---------------------------------------------------------------------------------------------
// The load balancer: a new connection goes to A while A accepts connections, else to B. Each
// response is watched: status line, `retry:` values, whether any `id:` came.

const nodes = { A: new URL(baseA), B: new URL(baseB) };
const connections = [];
const sockets = new Set();

function parseLastEventId(head) {
  for (const line of head.split("\r\n").slice(1)) {
    const colon = line.indexOf(":");
    if (colon > 0 && line.slice(0, colon).trim().toLowerCase() === "last-event-id") {
      return line.slice(colon + 1).trim();
    }
  }
  return null;
}

function connectTo(name) {
  return new Promise((resolve, reject) => {
    const s = net.connect(Number(nodes[name].port), nodes[name].hostname);
    s.once("connect", () => resolve(s));
    s.once("error", reject);
  });
}

const proxy = net.createServer(async (client) => {
  client.pause();
  const conn = {
    node: "A",
    afterTerm: termAt !== null,
    lastEventId: null,
    lastIdAtConnect: lastIdReceived,
    status: null,
    retries: [],
    ids: 0,
  };
  connections.push(conn);
  let upstream;
  try {
    upstream = await connectTo("A");
  } catch {
    conn.node = "B";
    try {
      upstream = await connectTo("B");
    } catch (e) {
      fail(`neither node accepts connections: ${e}`);
    }
  }
  sockets.add(client);
  sockets.add(upstream);
  let head = "";
  let headDone = false;
  client.on("data", (chunk) => {
    if (!headDone) {
      head += chunk.toString("latin1");
      const end = head.indexOf("\r\n\r\n");
      if (end >= 0) {
        headDone = true;
        conn.lastEventId = parseLastEventId(head.slice(0, end));
        conn.lastIdAtConnect = lastIdReceived;
      }
    }
    upstream.write(chunk);
  });
  let answer = "";
  upstream.on("data", (chunk) => {
    // Only the start of each response is kept whole (status line, first frames); afterwards
    // lines are scanned for `retry:` and `id:` as they pass.
    answer += chunk.toString("utf8");
    if (conn.status === null) {
      const eol = answer.indexOf("\r\n");
      if (eol >= 0) conn.status = Number(answer.slice(9, 12));
    }
    const lines = answer.split("\n");
    answer = lines.pop();
    for (const line of lines) {
      if (line.startsWith("retry:")) conn.retries.push(Number(line.slice(6).trim()));
      if (line.startsWith("id:")) conn.ids += 1;
    }
    client.write(chunk);
  });
  const close = () => {
    client.destroy();
    upstream.destroy();
    sockets.delete(client);
    sockets.delete(upstream);
  };
  for (const s of [client, upstream]) {
    s.on("error", close);
    s.on("close", close);
  }
  client.resume();
});

await new Promise((resolve, reject) => {
  proxy.once("error", reject);
  proxy.listen(0, "127.0.0.1", resolve);
});
const proxyUrl = `http://127.0.0.1:${proxy.address().port}`;

// ---------------------------------------------------------------------------------------------
// The client.

function idKey(id) {
  const m = /^([0-9a-f]{8})-(\d+)-(\d+)$/.exec(id);
  if (!m) fail(`malformed event id ${JSON.stringify(id)}`);
  return { epoch: m[1], ms: BigInt(m[2]), seq: BigInt(m[3]) };
}

function idLess(a, b) {
  const x = idKey(a);
  const y = idKey(b);
  if (x.epoch !== y.epoch) fail(`epoch changed between ids ${a} and ${b}`);
  return x.ms < y.ms || (x.ms === y.ms && x.seq < y.seq);
}

let finish;
const done = new Promise((resolve) => {
  finish = resolve;
});
let opened;
const firstOpen = new Promise((resolve) => {
  opened = resolve;
});
const errors = [];

const source = new EventSource(`${proxyUrl}/v1/threads/${encodeURIComponent(thread)}/events`);
source.onopen = () => opened();
source.onerror = (e) => {
  errors.push(e?.message ?? String(e));
  if (source.readyState === EventSource.CLOSED) {
    fail(`the EventSource gave up (readyState CLOSED): ${e?.message ?? e} (code ${e?.code})`);
  }
};
source.onmessage = (msg) => {
  const i = received.length;
  if (!msg.lastEventId) fail(`event #${i} has no id`);
  if (lastIdReceived !== null && !idLess(lastIdReceived, msg.lastEventId)) {
    fail(`ids not strictly increasing: ${lastIdReceived} then ${msg.lastEventId} (event #${i})`);
  }
  if (msg.data !== expected[i]) {
    const seen = expected.indexOf(msg.data);
    const what = seen >= 0 && seen < i ? `a duplicate of event #${seen}` : seen > i ? `event #${seen} (a gap)` : "not published";
    fail(`event #${i} is ${what}: got ${msg.data}, expected ${expected[i]}`);
  }
  received.push(msg.lastEventId);
  lastIdReceived = msg.lastEventId;
  if (received.length === TERM_AFTER) {
    termAt = Date.now();
    process.kill(PID_A, "SIGTERM");
  }
  if (received.length === expected.length) finish();
};

const timer = setTimeout(() => {
  fail(
    `timed out after ${TIMEOUT_MS} ms with ${received.length} of ${expected.length} events ` +
      `(${connections.length} connections: ${JSON.stringify(connections.map((c) => [c.node, c.status]))}, ` +
      `errors: ${JSON.stringify(errors.slice(-5))})`,
  );
}, TIMEOUT_MS);

await firstOpen;

// The producer publishes to B all along (it is not the node being drained).
const publishUrl = `${baseB}/v1/threads/${encodeURIComponent(thread)}/events`;
for (let i = 0; i < events.length; i += BATCH) {
  const batch = events.slice(i, i + BATCH);
  const resp = await fetch(publishUrl, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(batch),
  });
  const text = await resp.text();
  if (resp.status !== 200) fail(`publish of events #${i}.. answered ${resp.status}: ${text}`);
  await new Promise((r) => setTimeout(r, BATCH_PAUSE_MS));
}

await done;
clearTimeout(timer);
source.close();

// ---------------------------------------------------------------------------------------------
// Checks on the connections.

if (termAt === null) fail("node A was never sent SIGTERM");
// A connection the kernel queued on A's listening socket just as A closed it gets no answer
// at all (reset or closed, whatever the server does: a TCP-only balancer's race). For an
// EventSource that is a network error, after which it reconnects (WHATWG "reestablish the
// connection"), unlike an error status: allowed, but only on A after SIGTERM.
const unanswered = connections.filter((c) => c.status === null);
for (const c of unanswered) {
  if (!(c.node === "A" && c.afterTerm)) fail(`a connection got no answer: ${JSON.stringify(c)}`);
}
const refused = connections.filter((c) => c.status !== 200 && c.status !== null);
if (refused.length > 0) {
  fail(`answers other than 200: ${JSON.stringify(refused)}`);
}
// Reconnects that A answered after SIGTERM: A's drain answer (200, `retry:`, no id).
const drainAnswers = connections.filter((c) => c.node === "A" && c.afterTerm && c.status === 200);
if (drainAnswers.length === 0) fail("no reconnect reached A during its drain");
for (const c of drainAnswers) {
  if (c.ids !== 0) fail(`A's drain answer carried ${c.ids} ids: ${JSON.stringify(c)}`);
  if (c.retries.length === 0) fail(`A's drain answer carried no retry: ${JSON.stringify(c)}`);
}
// Every `retry:` A sent: the first of each stream (retry_ms), the end of the stream the drain
// cut, and the drain answers, all short.
const cut = connections.filter((c) => c.node === "A" && !c.afterTerm).at(-1);
if (cut.retries.length < 2) fail(`the stream A's drain ended sent no retry: ${JSON.stringify(cut)}`);
const drainRetries = connections.filter((c) => c.node === "A").flatMap((c) => c.retries);
for (const r of drainRetries) {
  if (!(r <= 1.5 * RETRY_MS)) fail(`a retry of ${r} ms from A (retry_ms ${RETRY_MS})`);
}
const last = connections[connections.length - 1];
if (last.node !== "B") fail(`the client did not end up on B: ${JSON.stringify(last)}`);
connections.slice(1).forEach((c, k) => {
  if (c.lastEventId !== c.lastIdAtConnect) {
    fail(
      `reconnect #${k + 1} sent Last-Event-ID ${JSON.stringify(c.lastEventId)}, ` +
        `but the last id received was ${c.lastIdAtConnect}`,
    );
  }
});

for (const s of sockets) s.destroy();
proxy.close();
console.log(
  JSON.stringify({
    ok: true,
    events: received.length,
    lastId: lastIdReceived,
    connections: connections.length,
    drainAnswers: drainAnswers.length,
    unanswered: unanswered.length,
    drainRetries,
    nodes: connections.map((c) => c.node).join(""),
  }),
);
process.exit(0);
