// Conformance oracle: runs raw SSE bodies through the REAL `@ag-ui/client` 1.0.0 pipeline
// (transport parse → CompatibilityBoundary → enforceEvents → transformChunks → verifyEvents →
// defaultApplyEvents) and reports whether each passed and what it folded to.
//
// Usage: node tests/node/agui-fold.mjs <cases.json>
//
// Input:  {"cases":[{"name","threadId","bodies":["<raw SSE text of response 1>", ...]}]}
// Output (stdout, one JSON document):
//   {"results":[{"name","ok","error","failedBody","errors","messages","state","warnings","custom"}]}
//   (`custom`: every CUSTOM event an app's `onCustomEvent` subscriber got, as {name, value}, in
//   order: how an app reads, e.g., the broker's `agui-fanout.gap`)
//
// How: a small relay (node:http on 127.0.0.1:0) answers every POST with
// `Content-Type: text/event-stream` and the bytes of the body being played. Each case gets a fresh
// `HttpAgent` (no initial messages, state `{}`, the case's threadId) pointed at the relay; each
// body is one `agent.runAgent()` on that SAME agent, so messages and state carry over from body
// to body as they do for a client whose connection was re-established, while the client builds a
// fresh verifier and chunk transformer per response, as it always does.
//
// Facts of the 1.0.0 client this relies on (read from its shipped sources):
// - `agent.threadId` only goes into the outgoing RunAgentInput; nothing compares it with events.
// - `runAgent()` sends the agent's messages as input but does not add anything to
//   `agent.messages` by itself; only events change them (RUN_STARTED.input.messages are
//   appended when their ids are new).
// - `runAgent()` throws before sending when the agent has pending interrupts (a RUN_FINISHED with
//   an interrupt outcome) that the input's `resume` does not cover. A reconnect is not a new run,
//   so such interrupts are covered with `status: "cancelled"` entries; that only changes the
//   request the relay ignores.
//
// `console.warn` lines are captured per case (the client's warnings: stripped properties, dropped
// events, failed patches, ...); `console.error` and `console.log` are kept off stdout.

import fs from "node:fs";
import http from "node:http";
import { format } from "node:util";
import { HttpAgent } from "@ag-ui/client";

const file = process.argv[2];
if (!file) {
  process.stderr.write("usage: agui-fold.mjs <cases.json>\n");
  process.exit(2);
}
const { cases } = JSON.parse(fs.readFileSync(file, "utf8"));

let warnings = [];
console.warn = (...args) => {
  warnings.push(format(...args));
};
// "Agent execution failed: ..." for every failed run: reported in `errors` instead.
console.error = () => {};
console.log = (...args) => {
  process.stderr.write(format(...args) + "\n");
};

// The relay: answers each POST with the body being played.
let currentBody = "";
let requests = 0;
const server = http.createServer((req, res) => {
  requests += 1;
  req.resume();
  req.on("end", () => {
    const bytes = Buffer.from(currentBody, "utf8");
    res.writeHead(200, {
      "Content-Type": "text/event-stream",
      "Cache-Control": "no-cache",
      "Content-Length": String(bytes.length),
    });
    res.end(bytes);
  });
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const url = `http://127.0.0.1:${server.address().port}/agent`;

const results = [];
for (const c of cases) {
  warnings = [];
  const agent = new HttpAgent({
    url,
    threadId: c.threadId,
    initialMessages: [],
    initialState: {},
  });
  const errors = [];
  const custom = [];
  agent.subscribe({
    onCustomEvent: ({ event }) => {
      custom.push({ name: event.name, value: event.value });
    },
  });
  for (const [index, body] of c.bodies.entries()) {
    currentBody = body;
    const before = requests;
    const resume = agent.pendingInterrupts.map((i) => ({
      interruptId: i.id,
      status: "cancelled",
    }));
    try {
      await agent.runAgent(resume.length > 0 ? { resume } : undefined);
    } catch (e) {
      errors.push({ body: index, error: e instanceof Error ? e.message : String(e) });
    }
    if (requests !== before + 1) {
      errors.push({ body: index, error: `harness: the relay got ${requests - before} requests` });
    }
  }
  results.push({
    name: c.name,
    ok: errors.length === 0,
    error: errors.length > 0 ? errors[0].error : null,
    failedBody: errors.length > 0 ? errors[0].body : null,
    errors,
    messages: agent.messages,
    state: agent.state === undefined ? null : agent.state,
    warnings,
    custom,
  });
}

server.closeAllConnections();
server.close();
process.stdout.write(JSON.stringify({ results }) + "\n", () => process.exit(0));
