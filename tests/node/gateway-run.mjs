// The real, unmodified `@ag-ui/client` 1.0.0 `HttpAgent` running against the broker's run
// gateway (`POST /v1/agents/{name}`, PROTOCOL §11), as a browser page would: one agent, one
// `runAgent()` per step, messages and state carried over from step to step.
//
// Usage: node tests/node/gateway-run.mjs <plan.json>
//
// Input:  {"url": "<broker>/v1/agents/<name>", "threadId", "headers"?: {...},
//          "steps": [{"user"?: "text",            // a user message added before the run
//                     "resume"?: "resolved"|"cancelled", // answer every pending interrupt
//                     "abortAfter"?: n}]}          // abortRun() after the n-th event
// Output (stdout, one JSON document):
//   {"steps": [{"ok", "error", "events": [<event>...], "messages", "state",
//               "pendingInterrupts"}]}
//
// `ok` is false when `runAgent()` rejected (a failed verify, a non-2xx answer, an abort); a run
// that ends with RUN_ERROR resolves on the 1.0 client and its events say so.

import fs from "node:fs";
import { format } from "node:util";
import { HttpAgent } from "@ag-ui/client";

const file = process.argv[2];
if (!file) {
  process.stderr.write("usage: gateway-run.mjs <plan.json>\n");
  process.exit(2);
}
const plan = JSON.parse(fs.readFileSync(file, "utf8"));

const warnings = [];
console.warn = (...args) => warnings.push(format(...args));
console.error = (...args) => warnings.push(format(...args));
console.log = (...args) => process.stderr.write(format(...args) + "\n");

const agent = new HttpAgent({
  url: plan.url,
  threadId: plan.threadId,
  headers: plan.headers ?? {},
  initialMessages: [],
  initialState: {},
});

const steps = [];
let n = 0;
for (const step of plan.steps) {
  n += 1;
  if (step.user) {
    agent.addMessage({ id: `u-${plan.threadId}-${n}`, role: "user", content: step.user });
  }
  const events = [];
  const params = {};
  if (step.resume) {
    params.resume = agent.pendingInterrupts.map((i) => ({
      interruptId: i.id,
      status: step.resume,
      payload: step.resume === "resolved" ? { approved: true } : undefined,
    }));
  }
  let ok = true;
  let error = null;
  try {
    await agent.runAgent(params, {
      onEvent({ event }) {
        events.push(event);
        if (step.abortAfter && events.length === step.abortAfter) {
          agent.abortRun();
        }
      },
    });
  } catch (e) {
    ok = false;
    error = e instanceof Error ? e.message : String(e);
  }
  steps.push({
    ok,
    error,
    events,
    messages: agent.messages,
    state: agent.state === undefined ? null : agent.state,
    pendingInterrupts: agent.pendingInterrupts,
  });
}

process.stdout.write(JSON.stringify({ steps, warnings }) + "\n", () => process.exit(0));
