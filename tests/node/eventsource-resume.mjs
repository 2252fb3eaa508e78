// Real-client resume test: the npm `eventsource` package (a WHATWG-compliant EventSource for
// Node) follows a thread through a TCP proxy that cuts the connection mid-stream several times.
// The EventSource must reconnect by itself with `Last-Event-ID` and end up with every event
// exactly once, in order (PROTOCOL §4.1, §4.2).
//
// Usage: node tests/node/eventsource-resume.mjs <broker base URL> <thread id> [events]
//
// The script publishes the events itself (fetch, straight to the broker, in small batches while
// the client is being cut) and exits 0 on success, 1 with a message on stderr otherwise. A JSON
// summary is printed on stdout.

import net from "node:net";
import { EventSource } from "eventsource";

const [base, thread, countArg] = process.argv.slice(2);
if (!base || !thread) {
  console.error("usage: eventsource-resume.mjs <broker base URL> <thread id> [events]");
  process.exit(2);
}
const TOTAL = Number(countArg ?? 500);
const BATCH = 10;
const BATCH_PAUSE_MS = 10;
const TIMEOUT_MS = 25_000;
// Cut the client connection when the bytes forwarded (all connections together) reach these
// fractions of the bytes the whole thread takes once.
const CUT_FRACTIONS = [0.2, 0.5, 0.8];

function fail(message) {
  console.error(`eventsource-resume: FAIL: ${message}`);
  process.exit(1);
}

// ---------------------------------------------------------------------------------------------
// The events: RUN_STARTED, CUSTOM × (TOTAL - 2) numbered by `value.seq`, RUN_FINISHED: a valid
// AG-UI run whose events never coalesce (PROTOCOL §5 only merges content and state deltas).

const runId = `run-${Date.now()}`;
const events = [];
events.push({ type: "RUN_STARTED", threadId: thread, runId });
for (let seq = 1; seq < TOTAL - 1; seq++) {
  events.push({ type: "CUSTOM", name: "seq", value: { seq, pad: "x".repeat(seq % 17) } });
}
events.push({ type: "RUN_FINISHED", threadId: thread, runId });
// The broker re-serialises compactly, keeping key order: what JSON.stringify gives here.
const expected = events.map((e) => JSON.stringify(e));
// `id: <8 hex>-<ms>-<seq>\ndata: <json>\n\n`; the id length depends on the backend (~12–30).
const expectedBytes = expected.reduce((n, json) => n + json.length + 40, 0);
const cutPoints = CUT_FRACTIONS.map((f) => Math.floor(f * expectedBytes));

// ---------------------------------------------------------------------------------------------
// Client state (read by the proxy to check each reconnect's Last-Event-ID).

const received = []; // { id, data }
let lastIdReceived = null;

// ---------------------------------------------------------------------------------------------
// The proxy: forwards client ↔ broker, records each request's Last-Event-ID, and destroys the
// client connection once the forwarded response bytes reach the next cut point (the cut falls
// inside a chunk, usually inside a frame).

const upstream = new URL(base);
const upstreamPort = Number(upstream.port || 80);
const upstreamHost = upstream.hostname;
const connections = []; // { lastEventId (header or null), lastIdAtConnect, cutAfterBytes }
let forwarded = 0;
let nextCut = 0;
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

const proxy = net.createServer((client) => {
  const conn = { lastEventId: null, lastIdAtConnect: lastIdReceived, cut: false };
  connections.push(conn);
  const broker = net.connect(upstreamPort, upstreamHost);
  sockets.add(client);
  sockets.add(broker);
  let head = "";
  let headDone = false;
  client.on("data", (chunk) => {
    if (!headDone) {
      head += chunk.toString("latin1");
      const end = head.indexOf("\r\n\r\n");
      if (end >= 0) {
        headDone = true;
        conn.lastEventId = parseLastEventId(head.slice(0, end));
        // Every message of the previous connection was dispatched before the EventSource
        // scheduled this reconnect (same event loop): this is the last id it received.
        conn.lastIdAtConnect = lastIdReceived;
      }
    }
    broker.write(chunk);
  });
  broker.on("data", (chunk) => {
    if (conn.cut) return;
    const cut = cutPoints[nextCut];
    if (cut !== undefined && forwarded + chunk.length >= cut) {
      const keep = Math.max(0, cut - forwarded);
      forwarded += keep;
      nextCut += 1;
      conn.cut = true;
      conn.cutAfterBytes = forwarded;
      client.write(chunk.subarray(0, keep), () => {
        client.destroy();
        broker.destroy();
      });
      return;
    }
    forwarded += chunk.length;
    client.write(chunk);
  });
  const close = () => {
    client.destroy();
    broker.destroy();
    sockets.delete(client);
    sockets.delete(broker);
  };
  client.on("error", close);
  broker.on("error", close);
  client.on("close", close);
  broker.on("close", close);
});

await new Promise((resolve, reject) => {
  proxy.once("error", reject);
  proxy.listen(0, "127.0.0.1", resolve);
});
const proxyUrl = `http://127.0.0.1:${proxy.address().port}`;

// ---------------------------------------------------------------------------------------------
// Ids: `<epoch>-<ms>-<seq>`, compared within one epoch.

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

// ---------------------------------------------------------------------------------------------
// Subscribe, then publish while the proxy cuts the client.

let finish;
const done = new Promise((resolve) => {
  finish = resolve;
});
let opened;
const firstOpen = new Promise((resolve) => {
  opened = resolve;
});
let opens = 0;
const errors = [];

const source = new EventSource(`${proxyUrl}/v1/threads/${encodeURIComponent(thread)}/events`);
source.onopen = () => {
  opens += 1;
  opened();
};
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
  if (i >= expected.length) {
    fail(`more events than published: #${i} ${msg.data}`);
  }
  if (msg.data !== expected[i]) {
    const dup = expected.indexOf(msg.data);
    const what =
      dup >= 0 && dup < i
        ? `a duplicate of event #${dup}`
        : dup > i
          ? `event #${dup} (a gap: #${i}..#${dup - 1} missing)`
          : "not a published event";
    fail(`event #${i} is ${what}: got ${msg.data}, expected ${expected[i]}`);
  }
  received.push({ id: msg.lastEventId, data: msg.data });
  lastIdReceived = msg.lastEventId;
  if (received.length === expected.length) finish();
};

const timer = setTimeout(() => {
  fail(
    `timed out after ${TIMEOUT_MS} ms with ${received.length} of ${expected.length} events ` +
      `(last id ${lastIdReceived}, ${connections.length} connections, ${nextCut} cuts, ` +
      `errors: ${JSON.stringify(errors.slice(-5))})`,
  );
}, TIMEOUT_MS);

await firstOpen;

const publishUrl = `${base}/v1/threads/${encodeURIComponent(thread)}/events`;
for (let i = 0; i < events.length; i += BATCH) {
  const batch = events.slice(i, i + BATCH);
  const resp = await fetch(publishUrl, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(batch),
  });
  const text = await resp.text();
  if (resp.status !== 200) fail(`publish of events #${i}.. answered ${resp.status}: ${text}`);
  const reply = JSON.parse(text);
  if (reply.count !== batch.length) fail(`publish of events #${i}.. acknowledged ${text}`);
  await new Promise((r) => setTimeout(r, BATCH_PAUSE_MS));
}

await done;
clearTimeout(timer);
source.close();

// ---------------------------------------------------------------------------------------------
// Checks on the reconnects.

const reconnects = connections.slice(1);
if (nextCut < CUT_FRACTIONS.length) {
  fail(`only ${nextCut} of ${CUT_FRACTIONS.length} cuts happened (${forwarded} bytes forwarded)`);
}
if (reconnects.length < 2) {
  fail(`expected at least 2 reconnects, saw ${reconnects.length}`);
}
if (connections[0].lastEventId !== null) {
  fail(`the first connection sent Last-Event-ID ${connections[0].lastEventId}`);
}
reconnects.forEach((c, k) => {
  if (c.lastIdAtConnect === null) {
    fail(`reconnect #${k + 1} happened before any event was received`);
  }
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
    firstId: received[0].id,
    lastId: lastIdReceived,
    connections: connections.length,
    opens,
    cuts: connections.filter((c) => c.cut).map((c) => c.cutAfterBytes),
    reconnectIds: reconnects.map((c) => c.lastEventId),
  }),
);
process.exit(0);
