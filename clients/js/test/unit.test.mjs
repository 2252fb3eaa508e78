// The package without a broker: the SSE reader (WHATWG HTML §9.2.6), event-id order, JWT `exp`,
// and the follower's reconnect rules against a scripted fetch.

import assert from "node:assert/strict";
import test from "node:test";
import {
  FollowError,
  SseParser,
  ThreadFollower,
  compareIds,
  isPreludeStart,
  jwtExpiryMs,
  readSse,
} from "@agui-fanout/client";

const wire =
  "retry: 100\n\n: agui-fanout: Last-Event-ID not resumable (trimmed), starting at the head\n" +
  'data: {"type":"RUN_STARTED","threadId":"t","runId":"r"}\n\n' +
  'data: {"type":"STATE_SNAPSHOT","snapshot":{}}\nid: 0badcafe-0-7\n\n' +
  'id: 0badcafe-0-8\ndata: {"a":\ndata: 1}\n\n' +
  "id: x\n\n" +
  ":\n" +
  'data: {"cut":';

function framesOf(items) {
  return items.filter((i) => i.kind === "frame").map((i) => i.frame);
}

test("the SSE parser gives the same items however the stream is split", () => {
  const whole = new SseParser().push(wire);
  assert.deepEqual(whole, [
    { kind: "retry", ms: 100 },
    { kind: "comment", text: "agui-fanout: Last-Event-ID not resumable (trimmed), starting at the head" },
    { kind: "frame", frame: { data: '{"type":"RUN_STARTED","threadId":"t","runId":"r"}' } },
    { kind: "frame", frame: { data: '{"type":"STATE_SNAPSHOT","snapshot":{}}', id: "0badcafe-0-7" } },
    { kind: "frame", frame: { data: '{"a":\n1}', id: "0badcafe-0-8" } },
    { kind: "comment", text: "" },
  ]);
  for (let size = 1; size < 12; size++) {
    const p = new SseParser();
    const got = [];
    for (let i = 0; i < wire.length; i += size) got.push(...p.push(wire.slice(i, i + size)));
    assert.deepEqual(got, whole, `chunks of ${size}`);
  }
});

test("CRLF and CR end lines too, also when a CRLF is split across chunks", () => {
  const crlf = "id: 1\r\ndata: a\r\n\r\ndata: b\r\r";
  const p = new SseParser();
  const got = [...p.push("id: 1\r"), ...p.push("\ndata: a\r\n\r"), ...p.push("\ndata: b\r\r")];
  assert.deepEqual(framesOf(got), [{ data: "a", id: "1" }, { data: "b" }]);
  assert.deepEqual(framesOf(new SseParser().push(crlf)), framesOf(got));
});

test("readSse decodes UTF-8 split inside a character and drops an unterminated frame", async () => {
  const bytes = new TextEncoder().encode('data: {"delta":"héllo €"}\nid: 1\n\ndata: {"x"');
  const body = new ReadableStream({
    start(c) {
      for (const b of bytes) c.enqueue(new Uint8Array([b]));
      c.close();
    },
  });
  const items = [];
  for await (const i of readSse(body)) items.push(i);
  assert.deepEqual(framesOf(items), [{ data: '{"delta":"héllo €"}', id: "1" }]);
});

test("event ids order within an epoch only; bridge marks and other epochs do not order", () => {
  assert.equal(compareIds("53cafd13-0-9", "53cafd13-0-10"), -1);
  assert.equal(compareIds("53cafd13-1764500000001-0", "53cafd13-1764500000000-5"), 1);
  assert.equal(compareIds("53cafd13-0-10", "53cafd13-0-10"), 0);
  assert.equal(compareIds("53cafd13-0-10", "0badcafe-0-10"), undefined);
  assert.equal(compareIds("53cafd13-0-10-bridge", "53cafd13-0-10"), undefined);
});

test("the JWT exp claim is read (ms); anything else is no expiry", () => {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const jwt = (claims) => `${b64({ alg: "HS256" })}.${b64(claims)}.sig`;
  assert.equal(jwtExpiryMs(jwt({ exp: 1764500000, agui: { subscribe: ["*"] } })), 1764500000000);
  assert.equal(jwtExpiryMs(jwt({ sub: "x" })), undefined);
  assert.equal(jwtExpiryMs("not-a-jwt"), undefined);
  assert.equal(jwtExpiryMs("a.%%%.c"), undefined);
});

test("only a RUN_STARTED with the broker's prelude mark is a prelude start", () => {
  const start = { type: "RUN_STARTED", threadId: "t", runId: "r" };
  assert.equal(isPreludeStart({ ...start, metadata: { "agui-fanout": { prelude: true } } }), true);
  assert.equal(isPreludeStart(start), false);
  assert.equal(isPreludeStart({ ...start, metadata: { "agui-fanout": { prelude: "yes" } } }), false);
  assert.equal(isPreludeStart({ type: "CUSTOM", metadata: { "agui-fanout": { prelude: true } } }), false);
});

/** A fetch that answers each request with the next scripted reply and records the requests. */
function scriptedFetch(replies) {
  const requests = [];
  const fetch = async (url, init) => {
    requests.push({ url, headers: { ...init.headers } });
    const reply = replies.shift();
    if (!reply) return new Promise(() => {}); // no more: hang, as a quiet stream does
    if (reply.status && reply.status !== 200) {
      return new Response(JSON.stringify({ error: { code: reply.code ?? "x", message: "m" } }), {
        status: reply.status,
        headers: { "Content-Type": "application/json" },
      });
    }
    const body = new ReadableStream({
      start(c) {
        c.enqueue(new TextEncoder().encode(reply.body));
        c.close(); // the connection ends here, a frame cut or not
      },
    });
    return new Response(body, { headers: { "Content-Type": "text/event-stream" } });
  };
  return { fetch, requests };
}

function follower(replies, token) {
  const script = scriptedFetch(replies);
  const f = new ThreadFollower(
    {
      url: "http://broker.test/",
      threadId: "t:1",
      headers: () => ({ "x-app": "1" }),
      token,
      fetch: script.fetch,
      retryMs: 5,
      maxRetryMs: 20,
      refreshMarginMs: 1000,
    },
    undefined,
  );
  return { f, requests: script.requests };
}

const marked = '{"type":"RUN_STARTED","threadId":"t:1","runId":"r","metadata":{"agui-fanout":{"prelude":true}}}';

test("a connection cut inside a prelude hands out none of it; the reconnect's prelude comes whole", async () => {
  const { f, requests } = follower([
    { body: `retry: 5\n\ndata: ${marked}\n\ndata: {"type":"MESSAGES_SNAPSHOT","messages":[]}\n\ndata: {"type":"STATE_SNA` },
    {
      body:
        `data: ${marked}\n\ndata: {"type":"MESSAGES_SNAPSHOT","messages":[]}\n\n` +
        'id: 0badcafe-0-4\ndata: {"type":"STATE_SNAPSHOT","snapshot":{}}\n\n' +
        'id: 0badcafe-0-5\ndata: {"type":"CUSTOM","name":"x","value":1}\n\n',
    },
    { body: 'id: 0badcafe-0-6\ndata: {"type":"RUN_FINISHED","threadId":"t:1","runId":"r"}\n\n' },
  ]);
  const a = await f.next();
  assert.deepEqual(a.events.map((e) => e.type), ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"]);
  assert.equal(a.id, "0badcafe-0-4");
  assert.equal(isPreludeStart(a.events[0]), true);
  const b = await f.next();
  assert.deepEqual([b.id, b.events.length], ["0badcafe-0-5", 1]);
  const c = await f.next();
  assert.equal(c.events[0].type, "RUN_FINISHED");
  f.close();
  assert.equal(await f.next(), undefined);
  assert.equal(requests[0].url, "http://broker.test/v1/threads/t%3A1/events");
  assert.equal(requests[0].headers["Last-Event-ID"], undefined);
  assert.equal(requests[1].headers["Last-Event-ID"], undefined, "nothing of the cut prelude counted");
  assert.equal(requests[2].headers["Last-Event-ID"], "0badcafe-0-5");
  assert.equal(requests[2].headers["x-app"], "1");
});

test("a 401 gets one fresh token; a 503 is retried; a 403 ends the follow", async () => {
  let n = 0;
  const token = async () => `tok-${++n}`;
  const { f, requests } = follower(
    [
      { status: 401, code: "unauthorized" },
      { status: 503, code: "backend_unavailable" },
      { body: 'id: 0badcafe-0-1\ndata: {"type":"RUN_STARTED","threadId":"t:1","runId":"r"}\n\n' },
      { status: 401, code: "unauthorized" },
      { status: 401, code: "unauthorized" },
    ],
    token,
  );
  const a = await f.next();
  assert.equal(a.id, "0badcafe-0-1");
  await assert.rejects(f.next(), (e) => e instanceof FollowError && e.status === 401);
  assert.deepEqual(
    requests.map((r) => r.headers.Authorization),
    ["Bearer tok-1", "Bearer tok-2", "Bearer tok-3", "Bearer tok-4", "Bearer tok-5"],
  );
  const forbidden = follower([{ status: 403, code: "forbidden" }], "fixed");
  await assert.rejects(forbidden.f.next(), (e) => e.status === 403 && e.payload.error.code === "forbidden");
  assert.equal(forbidden.requests.length, 1, "no retry after a 403");
});
