// Real-client authentication test (PROTOCOL §8): the npm `eventsource` package (a WHATWG-compliant
// EventSource for Node) with its token in `?access_token=`, as a browser's native EventSource
// must carry it.
//
// 1. A refused token: the EventSource gets an error and stays closed (no retry after a 401).
// 2. A token that expires while events flow: the client receives every event published before
//    the expiry; the broker ends the stream at the expiry; the EventSource reconnects by
//    itself with the same URL and `Last-Event-ID`, is refused (401), and stays closed.
//
// Usage: node tests/node/eventsource-auth.mjs <base URL> <thread> <publish token>
//          <refused token> <short-lived subscribe token>
// Exits 0 on success (a JSON summary on stdout), 1 with a message on stderr otherwise.

import { EventSource } from "eventsource";

const [base, thread, publishToken, refusedToken, shortToken] = process.argv.slice(2);
if (!shortToken) {
  console.error("usage: eventsource-auth.mjs <base> <thread> <publish> <refused> <short>");
  process.exit(2);
}
const TIMEOUT_MS = 20_000;

function fail(message) {
  console.error(`eventsource-auth: FAIL: ${message}`);
  process.exit(1);
}

const url = (token) =>
  `${base}/v1/threads/${thread}/events?from=start&access_token=${encodeURIComponent(token)}`;

async function publish(event) {
  const resp = await fetch(`${base}/v1/threads/${thread}/events`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${publishToken}` },
    body: JSON.stringify(event),
  });
  if (resp.status !== 200) fail(`publish: ${resp.status} ${await resp.text()}`);
}

/// Resolves once `es` is closed for good (readyState CLOSED after an error).
function closed(es) {
  return new Promise((resolve) => {
    es.addEventListener("error", () => {
      if (es.readyState === EventSource.CLOSED) resolve();
    });
  });
}

const timer = setTimeout(() => fail(`not done within ${TIMEOUT_MS} ms`), TIMEOUT_MS);

// 1. Refused.
const refused = new EventSource(url(refusedToken));
let refusedMessages = 0;
refused.onmessage = () => refusedMessages++;
await closed(refused);
if (refusedMessages !== 0) fail(`a refused client got ${refusedMessages} events`);

// 2. Expiring while events flow.
await publish({ type: "RUN_STARTED", threadId: thread, runId: "r1" });
const es = new EventSource(url(shortToken));
const seen = [];
let opens = 0;
let lastId = null;
es.onopen = () => opens++;
es.onmessage = (m) => {
  seen.push(JSON.parse(m.data));
  lastId = m.lastEventId;
};
const done = closed(es);
let published = 1;
let stop = false;
const pump = (async () => {
  while (!stop) {
    await publish({ type: "CUSTOM", name: "tick", value: published });
    published++;
    await new Promise((r) => setTimeout(r, 100));
  }
})();
const started = Date.now();
await done;
const endedAfterMs = Date.now() - started;
stop = true;
await pump;
clearTimeout(timer);

const ticks = seen.filter((e) => e.type === "CUSTOM").map((e) => e.value);
for (let i = 0; i < ticks.length; i++) {
  if (ticks[i] !== i + 1) fail(`tick ${i + 1} missing or out of order: ${ticks.join(",")}`);
}
if (seen[0]?.type !== "RUN_STARTED") fail(`first event ${JSON.stringify(seen[0])}`);
if (ticks.length < 5) fail(`only ${ticks.length} events before the expiry`);
if (opens !== 1) fail(`${opens} opens: the reconnect after the expiry must be refused`);
console.log(
  JSON.stringify({ ok: true, events: seen.length, ticks: ticks.length, endedAfterMs, lastId }),
);
process.exit(0);
