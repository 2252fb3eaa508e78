// An in-memory broker killed mid-run and started again on the same address: the thread's log is
// gone, and the next run starts a new epoch. (The runs are the demo agent's output published
// straight to the thread, so that this needs no gateway.) A FanoutAgent that followed the lost
// run reconnects by itself with its last id, gets the new epoch's prelude (PROTOCOL §4.3 "Another epoch"),
// restarts its pipeline without an error, and ends with the new log's fold.

import assert from "node:assert/strict";
import test from "node:test";
import * as h from "./harness.mjs";

test("connectAgent() recovers from an in-memory broker restarted mid-run", async (t) => {
  const demo = await h.startDemoAgent(["--pace", "80"]);
  let broker = await h.startBroker();
  t.after(async () => {
    await broker.stop();
    demo.kill();
  });
  const threadId = h.threadId("restart");
  const config = { url: broker.base, agent: "demo", threadId, retryMs: 100, maxRetryMs: 400 };

  const viewer = h.fanoutAgent(t, config);
  const resets = [];
  const connections = [];
  viewer.subscribeFanout({
    onReset: (r) => resets.push(r),
    onConnection: (c) => connections.push(c.state),
  });
  const failures = [];
  let events = 0;
  const following = viewer.connectAgent(undefined, {
    onRunFailed: ({ error }) => {
      failures.push(error);
    },
    onEvent: () => {
      events++;
    },
  });

  const lost = h.publishDemoRun(broker.base, demo.url, threadId, { runId: "lost-run" }).then(
    () => "resolved",
    (e) => `rejected: ${e.message}`,
  );
  await h.until(() => events >= 30, 10_000, "30 events at the viewer");
  assert.equal(viewer.isRunning, true, "the viewer is inside the run");
  assert.ok(viewer.messages.length > 0);

  await broker.stop();
  assert.match(await lost, /rejected/, "the producer of the lost run saw it fail");
  // Some reconnects fail while nothing listens.
  await h.until(() => connections.filter((c) => c === "waiting").length >= 2, 10_000, "retries");
  const before = viewer.lastEventId;
  broker = await h.startBroker({}, broker.port);

  // A new run on the restarted broker: the thread's new epoch.
  const published = await h.publishDemoRun(broker.base, demo.url, threadId, { runId: "new-run" });
  const snap = await h.snapshotAt(broker.base, threadId, published.lastId);
  assert.notEqual(snap.lastEventId.slice(0, 8), before.slice(0, 8), "a new epoch");

  await h.until(() => viewer.lastEventId === snap.lastEventId, 10_000, "the viewer at the new log's end");
  await h.sleep(20);
  assert.deepEqual(h.view(viewer), { messages: snap.messages, state: snap.state });
  assert.ok(!viewer.messages.some((m) => m.id.includes("lost-run")), "nothing of the lost epoch remains");
  assert.deepEqual(failures, [], "no pipeline error");
  assert.equal(resets.length, 1, "one reset: the pipeline restarted on the prelude");
  assert.equal(resets[0].previousEventId, before);
  assert.match(resets[0].comment ?? "", /epoch/);
  assert.equal(viewer.isRunning, false);

  await viewer.detachActiveRun();
  await following;
});
