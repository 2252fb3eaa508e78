// FanoutAgent against a real broker with the demo agent behind its gateway: runAgent() runs
// turns (a full run, an interrupt, the resume), connectAgent() follows the same thread, live or
// joining late, and all of them end with the log's fold (`/snapshot`). An agent that follows
// the thread and runs turns itself applies each event once; cancelRun() ends a run for all.

import assert from "node:assert/strict";
import test from "node:test";
import * as h from "./harness.mjs";

async function setUp(t, pace = "300") {
  const demo = await h.startDemoAgent(["--pace", pace]);
  const broker = await h.startBroker({ AGUI_AGENTS__DEMO__URL: demo.url });
  t.after(async () => {
    await broker.stop();
    demo.kill();
  });
  return { demo, broker };
}

/** connectAgent() in the background, with what it reports. */
function follow(agent) {
  const out = { failures: [], resets: [], events: [] };
  agent.subscribeFanout({ onReset: (r) => out.resets.push(r) });
  out.done = agent.connectAgent(undefined, {
    onRunFailed: ({ error }) => {
      out.failures.push(error);
    },
    onEvent: ({ event }) => {
      out.events.push(event);
    },
  });
  return out;
}

/** Waits until `agent` applied the event `id` (and the pipeline's apply ran). */
async function reached(agent, id) {
  await h.until(() => agent.lastEventId === id, 10_000, `${id} at the agent`);
  await h.sleep(20);
}

test("runAgent() and connectAgent() on one thread end with the log's fold", async (t) => {
  const { broker } = await setUp(t);
  const threadId = h.threadId("gw");
  const config = { url: broker.base, agent: "demo", threadId };
  const viewer = h.fanoutAgent(t, config);
  const live = follow(viewer);

  const runner = h.fanoutAgent(t, config);
  runner.addMessage({ id: "u-1", role: "user", content: "I would like to open an account" });
  const first = await runner.runAgent();
  assert.ok(first.newMessages.some((m) => m.role === "assistant"), "the run answered");
  assert.equal(runner.state.stage, "routed");
  await runner.runAgent();
  assert.equal(runner.pendingInterrupts.length, 1, "the second run asks for approval");
  await runner.runAgent({
    resume: runner.pendingInterrupts.map((i) => ({
      interruptId: i.id,
      status: "resolved",
      payload: { approved: true },
    })),
  });
  assert.deepEqual(runner.pendingInterrupts, []);

  assert.match(runner.lastEventId ?? "", /^[0-9a-f]{8}-0-[0-9]+$/, "runAgent() recorded the log's ids");
  const snap = await h.snapshotAt(broker.base, threadId, runner.lastEventId);
  assert.equal(snap.run.status, "finished");
  const fold = { messages: snap.messages, state: snap.state };
  assert.deepEqual(h.view(runner), fold, "runAgent(): the log's fold");
  assert.equal(snap.messages.filter((m) => m.role === "user").length, 1, "the question is in the thread");

  await reached(viewer, snap.lastEventId);
  assert.deepEqual(h.view(viewer), fold, "a follower from before the first run");
  assert.equal(viewer.isRunning, false, "no run is active");

  // A page that mounts after the runs: a prelude, then nothing more.
  const late = h.fanoutAgent(t, config);
  const joined = follow(late);
  await reached(late, snap.lastEventId);
  assert.deepEqual(h.view(late), fold, "a follower that joins late");
  assert.equal(late.pendingInterrupts.length, 0);
  // Mounted twice (React's StrictMode does it): the second connectAgent() ends the first.
  const twice = follow(late);
  await joined.done;
  assert.equal(late.following, true, "the second call follows on");

  // The runner itself resumes exactly after its own last id, at a run boundary.
  const again = follow(runner);
  runner.addMessage({ id: "u-2", role: "user", content: "thanks" });
  await runner.runAgent();
  const snap2 = await h.snapshotAt(broker.base, threadId, runner.lastEventId);
  await Promise.all([viewer, late, runner].map((a) => reached(a, snap2.lastEventId)));
  const fold2 = { messages: snap2.messages, state: snap2.state };
  for (const [name, a] of [["viewer", viewer], ["late", late], ["runner", runner]]) {
    assert.deepEqual(h.view(a), fold2, `${name} after the fourth run`);
  }
  assert.equal(again.events[0].type, "RUN_STARTED", "the runner's follow began with the new run");
  assert.ok(!again.events.some((e) => e.type === "MESSAGES_SNAPSHOT"), "no prelude: an exact resume");

  for (const a of [viewer, late, runner]) await a.detachActiveRun();
  for (const f of [live, joined, again, twice]) {
    const r = await f.done;
    assert.ok(Array.isArray(r.newMessages));
    assert.deepEqual(f.failures, []);
    assert.deepEqual(f.resets, []);
  }
  assert.equal(viewer.following, false);
});

test("an agent that follows its thread and runs turns applies every event once", async (t) => {
  const { broker } = await setUp(t, "100");
  const threadId = h.threadId("gw-self");
  const agent = h.fanoutAgent(t, { url: broker.base, agent: "demo", threadId });
  const seen = [];
  const running = [];
  agent.subscribe({
    onEvent: ({ event }) => {
      seen.push(event);
      running.push(agent.isRunning);
    },
  });
  const f = follow(agent);
  await h.sleep(100);
  assert.equal(agent.isRunning, false, "following alone is not running");

  agent.addMessage({ id: "u-1", role: "user", content: "hello" });
  const first = await agent.runAgent();
  const snap1 = await h.runEnded(broker.base, threadId);
  assert.equal(agent.lastEventId, snap1.lastEventId, "runAgent() resolved after the follow applied the run");
  assert.deepEqual(h.view(agent), { messages: snap1.messages, state: snap1.state });
  assert.ok(first.newMessages.some((m) => m.role === "assistant"), "newMessages hold the answer");
  assert.equal(agent.isRunning, false);

  agent.addMessage({ id: "u-2", role: "user", content: "go on" });
  const second = await agent.runAgent();
  const snap2 = await h.runEnded(broker.base, threadId, undefined, snap1.run.runId);
  assert.equal(agent.lastEventId, snap2.lastEventId);
  assert.equal(second.result, undefined);
  assert.deepEqual(h.view(agent), { messages: snap2.messages, state: snap2.state });
  assert.equal(agent.pendingInterrupts.length, 1);

  // Every event of the log reached the pipeline once, in order.
  const log = await h.readLog(broker.base, threadId, snap2.lastEventId);
  assert.deepEqual(
    seen.map((e) => e.type),
    log.map((l) => l.event.type),
  );
  assert.ok(running.slice(1, -1).some((r) => r), "isRunning during the runs");

  agent.abortRun();
  await f.done;
  assert.deepEqual(f.failures, []);
});

test("cancelRun() ends the thread's active run for the caller and every follower", async (t) => {
  const { broker } = await setUp(t, "20");
  const threadId = h.threadId("gw-cancel");
  const config = { url: broker.base, agent: "demo", threadId };
  const viewer = h.fanoutAgent(t, config);
  const f = follow(viewer);
  const runner = h.fanoutAgent(t, config);
  runner.addMessage({ id: "u-1", role: "user", content: "hello" });
  const run = runner.runAgent();
  await h.until(() => viewer.isRunning && f.events.length >= 5, 10_000, "the run at the viewer");

  const { lastId } = await viewer.cancelRun();
  await run;
  const snap = await h.snapshotAt(broker.base, threadId, lastId);
  assert.equal(snap.run.status, "errored");
  assert.equal(snap.run.error.code, "cancelled");
  assert.deepEqual(await viewer.snapshot(), snap, "snapshot() is the broker's fold");
  await reached(viewer, lastId);
  assert.equal(f.events.at(-1).type, "RUN_ERROR");
  assert.equal(f.events.at(-1).code, "cancelled");
  assert.equal(viewer.isRunning, false);
  assert.equal(runner.lastEventId, lastId, "the caller's answer ended with the cancel");
  assert.deepEqual(h.view(viewer), { messages: snap.messages, state: snap.state });
  await assert.rejects(viewer.cancelRun(), (e) => e.status === 409 && e.payload.error.code === "run_not_active");
  await viewer.detachActiveRun();
  await f.done;
  assert.deepEqual(f.failures, []);
});
