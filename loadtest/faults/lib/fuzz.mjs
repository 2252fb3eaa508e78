// Fuzzed HTTP/1.1 requests, generated from a fixed seed (runs are comparable): broken request
// lines, oversized URIs and headers, bodies that are not what their type says, invalid events,
// bad ids, methods and producer headers, and subscribes with ids a browser could send back
// (malformed, foreign, 64 KiB long). Written raw, one per connection.
//
// What an answer must be (PROTOCOL §2, issue 13 item 8): every error is the JSON error shape,
// even those produced below the router (bad request line, headers too large, URI too long); a
// subscribe is never refused for its id (a browser EventSource stops for good after a non-200);
// nothing is a 500.

/** What the fuzzer publishes first to thread "fz": a running run with state `{"arr": [1, 2]}`. */
export const FUZZ_SETUP = [
  { type: "RUN_STARTED", threadId: "fz", runId: "fz-run" },
  { type: "STATE_SNAPSHOT", snapshot: { arr: [1, 2] } },
];

/** mulberry32: a small seeded PRNG, good enough to vary inputs reproducibly. */
export function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const CRLF = "\r\n";

/** A request: request line, headers (array of [name, value]), body (string or Buffer). */
function request(method, target, headers = [], body = null) {
  const lines = [`${method} ${target} HTTP/1.1`, "Host: 127.0.0.1", "Connection: close"];
  for (const [k, v] of headers) lines.push(`${k}: ${v}`);
  const bodyBuf = body === null ? null : Buffer.isBuffer(body) ? body : Buffer.from(body, "utf8");
  if (bodyBuf !== null && !headers.some(([k]) => /^(content-length|transfer-encoding)$/i.test(k))) {
    lines.push(`Content-Length: ${bodyBuf.length}`);
  }
  const head = Buffer.from(lines.join(CRLF) + CRLF + CRLF, "latin1");
  return bodyBuf === null ? head : Buffer.concat([head, bodyBuf]);
}

/**
 * `count` fuzz cases, `{kind, subscribe, invalid, bytes}`: the kinds in turn, each with random
 * details. `subscribe` marks requests an EventSource could make (a GET of a valid thread's
 * events with whatever id it last received): their answer must be `200 text/event-stream`.
 * `invalid` marks publishes whose every event is invalid: they must not be answered 2xx
 * (issue 13 items 7 and 8: a text/event-stream ingest answered `200 {"count":0}` to garbage;
 * `/arr/01` and `__proto__` paths, which JavaScript and other clients apply differently).
 */
export function fuzzCases(count, seed = 13) {
  const rand = prng(seed);
  const int = (n) => Math.floor(rand() * n);
  const pick = (list) => list[int(list.length)];
  const printable = (n) => Array.from({ length: n }, () => String.fromCharCode(33 + int(94))).join("");
  const bytes = (n) => Buffer.from(Array.from({ length: n }, () => int(256)));
  const publish = (type, body, extra = []) =>
    request("POST", "/v1/threads/fz/events", [["Content-Type", type], ...extra], body);
  const bogusIds = () => [
    "",
    "-",
    "0",
    "ffffffff-999999999999999-99",
    "00000000-0-0",
    "deadbeef-1-1-bridge",
    "zz-1-1",
    printable(1 + int(200)),
    "x".repeat(4096),
    "é-ü-€",
    `${"9".repeat(40)}-0-1`,
  ];
  const kinds = [
    ["garbage", () => Buffer.concat([bytes(1 + int(2000)), Buffer.from(CRLF + CRLF)])],
    ["bad request line", () =>
      Buffer.from(pick(["GET\r\n\r\n", "GET /healthz HTTP/9.9\r\n\r\n", "G@T / HTTP/1.1\r\n\r\n",
        "GET /healthz HTTP/1.1 extra\r\nHost: x\r\n\r\n", " / HTTP/1.1\r\n\r\n", "GET  HTTP/1.1\r\n\r\n"]), "latin1")],
    ["URI too long", () => request("GET", `/v1/threads/${"a".repeat(65536)}/events`)],
    ["header too large", () => request("GET", "/healthz", [["X-Big", "b".repeat(100 * 1024)]])],
    ["too many headers", () => request("GET", "/healthz", Array.from({ length: 200 }, (_, i) => [`X-H${i}`, "v"]))],
    ["invalid header", () => Buffer.from(`GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n`, "latin1")],
    ["subscribe: bogus Last-Event-ID", () =>
      request("GET", "/v1/threads/fz-sub/events", [["Accept", "text/event-stream"], ["Last-Event-ID", pick(bogusIds())]]), true],
    ["subscribe: bogus ?lastEventId", () =>
      request("GET", `/v1/threads/fz-sub/events?lastEventId=${encodeURIComponent(pick(bogusIds()))}`, [["Accept", "text/event-stream"]]), true],
    ["subscribe: 64 KiB ?lastEventId", () =>
      request("GET", `/v1/threads/fz-sub/events?lastEventId=${"7".repeat(65536)}`, [["Accept", "text/event-stream"]]), true],
    ["invalid JSON", () => publish("application/json", pick(["{", "[1,", "nul", "{\"type\":}", bytes(50).toString("latin1"), "\u0000"]))],
    ["wrong content type", () => publish(pick(["text/plain", "application/xml", "multipart/form-data", "", "application/json-seq"]), "{}")],
    // Every one of these is invalid; the thread "fz" runs a run whose state is {"arr": [1, 2]}
    // (see FUZZ_SETUP), so a delta is refused for its path, not for the thread's order.
    ["invalid event", () =>
      publish("application/json", pick([
        '{"type":"NOPE"}', '{"type":"TEXT_MESSAGE_CONTENT"}', "42", "null", "[null,1]", "[]",
        '{"type":"RUN_STARTED","threadId":"fz","runId":null}',
        '{"type":"RUN_STARTED","threadId":"other","runId":"r"}', '{"type":"CUSTOM","name":"x","value":1,"timestamp":1.5}',
        '{"type":"STATE_DELTA","delta":[{"op":"add","path":"/arr/01","value":1}]}',
        '{"type":"STATE_DELTA","delta":[{"op":"add","path":"/__proto__","value":{"polluted":1}}]}',
      ])), false, true],
    ["invalid SSE ingest", () =>
      publish("text/event-stream", pick(["garbage", "{\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":1}", "data: {bad}\n\n",
        "data: {\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":1}", bytes(300).toString("latin1")])), false, true],
    ["invalid NDJSON", () => publish("application/x-ndjson", pick(["{}\n{", "\n\n\n", "[1]\n", "{\"type\":\"NOPE\"}\n"]))],
    ["deep JSON", () => publish("application/json", "[".repeat(20000) + "]".repeat(20000))],
    ["huge Content-Length", () =>
      request("POST", "/v1/threads/fz/events", [["Content-Type", "application/json"], ["Content-Length", pick(["99999999999", "-1", "abc", "1 2"])]], "{}")],
    ["bad method", () => request(pick(["PUT", "DELETE", "PATCH", "TRACE", "FOO", "CONNECT"]), pick(["/v1/threads/fz/events", "/healthz", "/v1/threads/fz/snapshot"]))],
    ["unknown route", () => request("GET", pick(["/", "/v2/threads/x/events", "/v1/threads", "/v1/threads/x", "/v1/threads/x/events/y", `/${printable(30)}`].map((p) => p.replace(/[ #?]/g, ""))))],
    ["bad thread id", () => request(pick(["GET", "POST"]), `/v1/threads/${pick(["a%20b", "%00", "a".repeat(129), "..", "%E2%82%AC", "a/b"])}/events`)],
    ["bad producer headers", () =>
      publish("application/json", "{\"type\":\"CUSTOM\",\"name\":\"x\",\"value\":1}",
        pick([[["X-Producer-Id", "p"]], [["X-Producer-Seq", "1"]], [["X-Producer-Id", "p"], ["X-Producer-Seq", "-1"]],
          [["X-Producer-Id", "p"], ["X-Producer-Seq", "18446744073709551616"]], [["X-Producer-Id", "bad id!"], ["X-Producer-Seq", "1"]]]))],
    ["bad query", () => request("GET", `/v1/threads/fz/events?${pick(["from=elsewhere", "lastEventId=%ZZ", "from", "%%%", "from=start&from=x"])}`)],
  ];
  const cases = [];
  for (let i = 0; i < count; i++) {
    const [kind, make, subscribe = false, invalid = false] = kinds[i % kinds.length];
    cases.push({ kind, subscribe, invalid, bytes: make() });
  }
  return cases;
}

/**
 * Judges one answer: `{errorNotJson, serverError, fatal, noAnswer, acceptedInvalid}` flags.
 * An error answer (status ≥ 400) must carry `{"error": {"code": …}}`; a subscribe must be
 * answered `200 text/event-stream`; an invalid publish must not be answered 2xx.
 */
export function judgeAnswer(c, answer) {
  const flags = {
    errorNotJson: false,
    serverError: false,
    fatal: false,
    noAnswer: answer.status === null,
    acceptedInvalid: c.invalid && answer.status !== null && answer.status < 300,
  };
  if (answer.status !== null && answer.status >= 400) {
    let shaped = false;
    try {
      shaped = typeof JSON.parse(answer.body)?.error?.code === "string";
    } catch {
      shaped = false;
    }
    flags.errorNotJson = !shaped;
    flags.serverError = answer.status >= 500 && answer.status !== 503;
  }
  if (c.subscribe) {
    const type = answer.headers?.["content-type"] ?? "";
    flags.fatal = answer.status !== null && (answer.status !== 200 || !type.startsWith("text/event-stream"));
  }
  return flags;
}
