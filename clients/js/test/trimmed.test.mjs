// Ids trimmed from the log (PROTOCOL §6 retention, §4.3): a FanoutAgent that comes back with an
// id the log no longer holds gets a prelude at the head and no error. Holding the thread's older
// view, it restarts its pipeline (onReset) and ends with the log's fold; a fresh agent given a
// trimmed id just starts from the prelude. (The runs are the demo agent's output published
// straight to the thread.)

import assert from "node:assert/strict";
import test from "node:test";
import * as h from "./harness.mjs";

test("a trimmed id gets a prelude, and the agent restarts its pipeline without an error", async (t) => {
  const demo = await h.startDemoAgent(["--pace", "0"]);
  // Checkpoints every 20 events: a run of 107 events trims everything before its last ~40.
  const broker = await h.startBroker({ AGUI_RETENTION__MAX_EVENTS: "20" });
  t.after(async () => {
    await broker.stop();
    demo.kill();
  });
  const threadId = h.threadId("trim");
  const config = { url: broker.base, agent: "demo", threadId };

  const viewer = h.fanoutAgent(t, config);
  const resets = [];
  const connections = [];
  viewer.subscribeFanout({
    onReset: (r) => resets.push(r),
    onConnection: (c) => connections.push(JSON.stringify(c)),
  });
  const failures = [];
  const onRunFailed = ({ error }) => {
    failures.push(error);
  };
  let following = viewer.connectAgent(undefined, { onRunFailed });
  const run1 = await h.publishDemoRun(broker.base, demo.url, threadId, { runId: "run-1" });
  const snap1 = await h.snapshotAt(broker.base, threadId, run1.lastId);
  await h.until(
    () => {
      if (failures.length > 0) throw failures[0];
      return viewer.lastEventId === snap1.lastEventId;
    },
    10_000,
    () => `the first run at the viewer (${viewer.lastEventId} of ${snap1.lastEventId}; ${connections})`,
  );
  await viewer.detachActiveRun();
  await following;
  const held = viewer.lastEventId;

  // Two more runs while the viewer is away: its id leaves the log.
  await h.publishDemoRun(broker.base, demo.url, threadId, { runId: "run-2" });
  const run3 = await h.publishDemoRun(broker.base, demo.url, threadId, { runId: "run-3" });
  const snap = await h.snapshotAt(broker.base, threadId, run3.lastId);
  const fold = { messages: snap.messages, state: snap.state };
  const oldest = (await h.readLog(broker.base, threadId, snap.lastEventId))[0];
  // `?from=start` on a trimmed log begins with a prelude at the head (PROTOCOL §2 Subscribe).
  assert.equal(oldest.event.metadata?.["agui-fanout"]?.prelude, true, "the log's start was trimmed");

  following = viewer.connectAgent(undefined, { onRunFailed });
  await h.until(() => viewer.lastEventId === snap.lastEventId, 10_000, "the viewer at the log's end");
  await h.sleep(20);
  assert.deepEqual(h.view(viewer), fold);
  assert.deepEqual(failures, []);
  assert.equal(resets.length, 1, "the older view was replaced once");
  assert.equal(resets[0].previousEventId, held);
  assert.match(resets[0].comment ?? "", /trimmed/, `${JSON.stringify(resets)} ${connections}`);
  await viewer.detachActiveRun();
  await following;

  // A new page that kept the old id (e.g. in sessionStorage): the prelude, nothing to replace.
  const page = h.fanoutAgent(t, { ...config, lastEventId: held });
  const pageResets = [];
  page.subscribeFanout({ onReset: (r) => pageResets.push(r) });
  following = page.connectAgent(undefined, { onRunFailed });
  await h.until(() => page.lastEventId === snap.lastEventId, 10_000, "the page at the log's end");
  await h.sleep(20);
  assert.deepEqual(h.view(page), fold);
  assert.deepEqual(pageResets, []);
  assert.deepEqual(failures, []);
  await page.detachActiveRun();
  await following;

  const metrics = await (await fetch(`${broker.base}/metrics`)).text();
  // The two resumes above, both answered with a prelude (the `?from=start` read is no resume).
  assert.match(metrics, /agui_resumes_total\{outcome="prelude"\} 2\n/);
  assert.doesNotMatch(metrics, /agui_resumes_total\{outcome="exact"\} [1-9]/);
});
