// Authentication on (PROTOCOL §8): a FanoutAgent given a token function follows a run longer
// than its tokens live. It reconnects with a fresh token and its last id before each token
// expires, and after a 401 asks once more; every event of the log reaches its pipeline exactly
// once, in order, and it ends with the log's fold. A fixed token that expired fails the follow
// with the broker's 401 instead of retrying for ever.

import assert from "node:assert/strict";
import test from "node:test";
import { FollowError } from "@agui-fanout/client";
import * as h from "./harness.mjs";

const SECRET = "client-js-test-secret-0123456789abcdef";

test("a token function keeps the follow going through expiries: every event once", async (t) => {
  const demo = await h.startDemoAgent(["--pace", "40"]);
  const broker = await h.startBroker({
    AGUI_AUTH__HS256_SECRET: SECRET,
  });
  t.after(async () => {
    await broker.stop();
    demo.kill();
  });
  const threadId = h.threadId("token");
  const reader = await h.issueToken(SECRET, { subscribe: [threadId] });

  // The first token handed out has expired already: the broker answers 401 and the agent asks
  // the function again. Later ones live 2 s (`exp` has a one-second resolution: 1 to 2 s).
  const expired = await h.issueToken(SECRET, { subscribe: [threadId], ttl: "1s" });
  await h.sleep(2100);
  let calls = 0;
  const token = async () => {
    calls++;
    return calls === 1 ? expired : h.issueToken(SECRET, { subscribe: [threadId], ttl: "2s" });
  };
  const viewer = h.fanoutAgent(t, { url: broker.base, agent: "demo", threadId, token });
  const opened = [];
  const closed = [];
  viewer.subscribeFanout({
    onConnection: (c) => {
      if (c.state === "open") opened.push(c.lastEventId);
      if (c.state === "closed") closed.push(c.reason);
    },
  });
  const seen = [];
  const failures = [];
  const following = viewer.connectAgent(undefined, {
    onEvent: ({ event }) => {
      seen.push(event);
    },
    onRunFailed: ({ error }) => {
      failures.push(error);
    },
  });
  await h.until(() => opened.length === 1, 10_000, "the follow's first stream");

  // The run (about 2.7 s): the demo agent's output published with a token that may publish.
  const publisher = await h.issueToken(SECRET, { publish: [threadId] });
  const published = await h.publishDemoRun(broker.base, demo.url, threadId, { token: publisher });
  const snap = await h.snapshotAt(broker.base, threadId, published.lastId, reader);
  await h.until(() => viewer.lastEventId === snap.lastEventId, 10_000, "the viewer at the end");
  await h.sleep(20);

  const log = await h.readLog(broker.base, threadId, snap.lastEventId, reader);
  assert.equal(log.length, 107, "the demo run's events");
  // The client's pipeline normalises events (e.g. `RUN_STARTED.input` gets `tools: []`): compare
  // what tells events apart.
  assert.deepEqual(seen.map(h.essence), log.map((l) => h.essence(l.event)), "every event once, in order");
  assert.deepEqual(h.view(viewer), { messages: snap.messages, state: snap.state });
  assert.deepEqual(failures, []);
  assert.ok(opened.length >= 3, `reconnected with fresh tokens: ${opened.length} streams`);
  assert.ok(closed.filter((r) => r === "refresh").length >= 2, `refreshes: ${closed}`);
  assert.ok(opened.slice(1).every((id) => id !== undefined), "every reconnect resumed with an id");
  assert.ok(calls >= opened.length + 1, "a token per attempt, the 401 included");

  await viewer.detachActiveRun();
  await following;
});

test("an expired fixed token ends the follow with the broker's 401", async (t) => {
  const broker = await h.startBroker({ AGUI_AUTH__HS256_SECRET: SECRET });
  t.after(() => broker.stop());
  const threadId = h.threadId("token-fixed");
  const token = await h.issueToken(SECRET, { subscribe: [threadId], ttl: "1s" });
  await h.sleep(2100);
  const viewer = h.fanoutAgent(t, { url: broker.base, agent: "demo", threadId, token });
  const errors = [];
  const quiet = { onRunFailed: () => ({ stopPropagation: false }) };
  const origError = console.error;
  console.error = (...args) => errors.push(args);
  try {
    await assert.rejects(viewer.connectAgent(undefined, quiet), (e) => {
      assert.ok(e instanceof FollowError, `${e}`);
      assert.equal(e.status, 401);
      assert.equal(e.payload.error.code, "unauthorized");
      return true;
    });
  } finally {
    console.error = origError;
  }
  assert.equal(viewer.following, false);
});
