// Drives an AG-UI agent with the REAL `@ag-ui/client` 1.0.0 `HttpAgent`, unmodified: the whole
// client pipeline (fetch POST → parseSSEStream → compat → enforce → transformChunks →
// verifyEvents → reducer) judges every response.
//
// Usage: node tests/node/demo-agent.mjs <url> <threadId> [resume-status]
//
// Plays the demo agent's onboarding on one agent (so messages and state carry over from run to
// run): run 1 (assessment), run 2 (asks for approval: must end with pending interrupts), run 3
// answering every pending interrupt with `resume[]` (status `resolved` with payload
// `{"approved": true}` by default, or the given status). Any run that fails stops the script.
//
// Output (stdout, one JSON document):
//   {"runs":[{"runId","events":[...],"result","pendingInterrupts":[...],"error"}],
//    "messages":[...], "state":{...}, "warnings":[...]}
// `events` are what the client's subscribers saw, after verification.

import { format } from "node:util";
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, resumeStatus = "resolved"] = process.argv.slice(2);
if (!url || !threadId) {
  process.stderr.write("usage: demo-agent.mjs <url> <threadId> [resume-status]\n");
  process.exit(2);
}

const warnings = [];
console.warn = (...args) => warnings.push(format(...args));
console.error = () => {};
console.log = (...args) => process.stderr.write(format(...args) + "\n");

const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "user-1", role: "user", content: "I'd like to open an account." }],
  initialState: {},
});

const runs = [];
for (let i = 1; i <= 3; i++) {
  const runId = `run-${i}`;
  const events = [];
  const params = { runId };
  if (i === 3) {
    params.resume = agent.pendingInterrupts.map((interrupt) => ({
      interruptId: interrupt.id,
      status: resumeStatus,
      ...(resumeStatus === "resolved" ? { payload: { approved: true } } : {}),
    }));
  }
  const run = { runId, events, result: null, pendingInterrupts: [], error: null };
  runs.push(run);
  try {
    const out = await agent.runAgent(params, {
      onEvent({ event }) {
        events.push(event);
      },
    });
    run.result = out.result === undefined ? null : out.result;
  } catch (e) {
    run.error = e instanceof Error ? e.message : String(e);
  }
  run.pendingInterrupts = agent.pendingInterrupts;
  if (run.error !== null) break;
}

process.stdout.write(
  JSON.stringify({ runs, messages: agent.messages, state: agent.state, warnings }) + "\n",
  () => process.exit(0),
);
