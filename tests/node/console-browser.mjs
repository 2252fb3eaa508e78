// The console (PROTOCOL §12) in headless Chromium (the system's /usr/bin/chromium, driven by
// playwright-core), against real brokers on Redis and the built-in demo agent behind the run
// gateway:
//
//   1. the console loads from the broker alone (every request the page makes is same-origin)
//      and lists threads (filtered by prefix);
//   2. a turn started from the page streams into both views: mid-run the operator view holds
//      the run's first events and not its end while the customer view shows the answer being
//      written; at the end the operator view holds every event of the log exactly once after its
//      prelude, and the customer view's messages and state equal the broker's snapshot;
//   3. a reload mid-run rejoins (a prelude, marked, then live events; equal to the snapshot);
//      the run's interrupt is answered from the page (Approve) and the next run opens the account;
//   4. a run is cancelled from the page (RUN_ERROR cancelled);
//   5. killing (SIGKILL) and restarting the page's broker node mid-run, while the run goes on
//      through another node, loses nothing in the page: the operator view resumes exactly (every
//      event once, no new prelude) and the customer view ends equal to the snapshot, never reset;
//   6. with authentication on, the console asks for an admin token and works once given one;
//   7. a delta the broker coalesced (a backlog in a small queue) is marked with how many events
//      it stands for, and the customer view holds the whole text.
//
// Usage: node tests/node/console-browser.mjs '<JSON>' with {"bin": path of agui-fanout,
// "redisUrl", "agentUrl": the demo agent, "screenshot"?: where to save a screenshot mid-run}.
// Exits 0 and prints a JSON summary as its last line; 1 with a message otherwise.

import { spawn } from "node:child_process";
import net from "node:net";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const args = JSON.parse(process.argv[2] ?? "{}");
const { bin, redisUrl, agentUrl } = args;
if (!bin || !redisUrl || !agentUrl) {
  console.error("usage: console-browser.mjs '{\"bin\":…,\"redisUrl\":…,\"agentUrl\":…}'");
  process.exit(2);
}
const CHROMIUM = process.env.AGUI_TEST_CHROMIUM ?? "/usr/bin/chromium";
const SECRET = "console-test-secret-of-a-reasonable-length";
const tag = Math.random().toString(16).slice(2, 8);
const log = (...m) => console.error("console-browser:", ...m);

// --- brokers -----------------------------------------------------------------------------------

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

const children = new Set();

/** Starts `agui-fanout serve` on `port` with `env`; resolves once /healthz answers. */
async function startBroker(port, env) {
  const child = spawn(bin, ["serve", "--listen", `127.0.0.1:${port}`], {
    env: {
      ...process.env,
      AGUI_LOG: process.env.TEST_AGUI_LOG ?? "warn",
      AGUI_SSE__RETRY_MS: "300",
      AGUI_SHUTDOWN__DRAIN: "300ms",
      AGUI_AGENTS__DEMO__URL: agentUrl,
      ...env,
    },
    stdio: ["ignore", process.env.TEST_AGUI_LOG ? "inherit" : "ignore", "inherit"],
  });
  children.add(child);
  child.on("exit", () => children.delete(child));
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 200; i++) {
    try {
      if ((await fetch(`${base}/healthz`)).ok) return { child, base, port, env };
    } catch {
      // not up yet
    }
    await sleep(50);
  }
  throw new Error(`broker on ${port} did not come up`);
}

function kill(broker) {
  return new Promise((resolve) => {
    if (broker.child.exitCode !== null) return resolve();
    broker.child.once("exit", resolve);
    broker.child.kill("SIGKILL");
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(what, f, ms = 20_000, every = 50) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await f();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await sleep(every);
  }
  throw new Error(`timed out waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
}

// --- the log, as the broker holds it -------------------------------------------------------------

async function snapshot(base, thread) {
  const r = await fetch(`${base}/v1/threads/${thread}/snapshot`);
  assert.equal(r.status, 200, `snapshot of ${thread}`);
  return r.json();
}

/** Every event id of the thread's log, read with ?from=start up to the snapshot's last id. */
async function logIds(base, thread) {
  const { lastEventId } = await snapshot(base, thread);
  const controller = new AbortController();
  const resp = await fetch(`${base}/v1/threads/${thread}/events?from=start`, { signal: controller.signal });
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  const ids = [];
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const frame = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const id = /^id: (.*)$/m.exec(frame)?.[1];
        if (id !== undefined && /^data: /m.test(frame)) ids.push(id);
        if (id === lastEventId) return ids;
      }
    }
  } finally {
    controller.abort();
  }
  return ids;
}

/** POSTs a turn to `base`'s gateway; resolves when the run's answer ended. */
async function runThrough(base, thread, input) {
  const resp = await fetch(`${base}/v1/agents/demo`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({
      threadId: thread,
      runId: `t-${Math.random().toString(16).slice(2)}`,
      messages: [],
      tools: [],
      context: [],
      forwardedProps: {},
      ...input,
    }),
  });
  assert.equal(resp.status, 200, `gateway run on ${thread}: ${resp.status}`);
  return resp.text();
}

// --- the page ----------------------------------------------------------------------------------

/** The operator view's event rows: {id, type, mark}. */
function opRows(page) {
  return page.$$eval("#op-rows .row[data-kind=event]", (rows) =>
    rows.map((r) => ({ id: r.dataset.id, type: r.dataset.type, mark: r.dataset.mark })),
  );
}

function opNotes(page) {
  return page.$$eval("#op-rows .row:not([data-kind=event])", (rows) => rows.map((r) => r.textContent));
}

function customer(page) {
  return page.evaluate(() => {
    const c = window.aguiConsole.customer;
    return { messages: JSON.parse(JSON.stringify(c.messages)), state: c.state, resets: c.resets };
  });
}

/**
 * The operator view against the log: after its last prelude (or from the log's start, for a
 * view opened on a thread with no event yet), every event of the log exactly once, in order,
 * none coalesced; returns how many live rows it checked.
 */
async function assertOperatorExact(page, base, thread) {
  const rows = await opRows(page);
  const ids = await logIds(base, thread);
  let start = -1;
  rows.forEach((r, i) => {
    if (r.mark === "prelude" && r.id !== undefined) start = i;
  });
  const live = rows.slice(start + 1);
  assert.ok(live.every((r) => r.mark === undefined), `unexpected marks: ${JSON.stringify(live.filter((r) => r.mark))}`);
  const from = start >= 0 ? ids.indexOf(rows[start].id) : -1;
  if (start >= 0) assert.ok(from >= 0, `the prelude's id ${rows[start].id} is in the log`);
  assert.deepEqual(
    live.map((r) => r.id),
    ids.slice(from + 1),
    "the operator view holds every event after its prelude exactly once",
  );
  return live.length;
}

/** Waits until the customer view holds the broker's snapshot; returns it. */
async function assertCustomerEqualsSnapshot(page, base, thread) {
  let seen;
  await until(`the customer view of ${thread} to equal the snapshot`, async () => {
    const snap = await snapshot(base, thread);
    seen = await customer(page);
    try {
      assert.deepEqual(seen.messages, snap.messages);
      assert.deepEqual(seen.state, snap.state);
      return true;
    } catch {
      return false;
    }
  }, 15_000, 200).catch(async (e) => {
    const snap = await snapshot(base, thread);
    assert.deepEqual(seen.messages, snap.messages, e.message);
    assert.deepEqual(seen.state, snap.state, e.message);
  });
  return seen;
}

async function openThread(page, base, thread) {
  await page.goto(`${base}/console/#thread=${thread}`);
  await page.waitForSelector("#thread-pane:not([hidden])");
  await until("the operator view to connect", async () => (await page.textContent("#op-status")) === "live");
}

async function startTurn(page, text) {
  await page.fill("#turn-message", text);
  await page.click("#turn-start");
  await until("the run to start", async () => /started|ended/.test(await page.textContent("#control-status")));
}

const hasType = (rows, type) => rows.some((r) => r.type === type);

// --- the scenarios -----------------------------------------------------------------------------

const summary = { ok: false };
let browser;
try {
  const redisEnv = { AGUI_REDIS_URL: redisUrl, AGUI_REDIS_BLOCK: "200ms" };
  const a = await startBroker(await freePort(), redisEnv);
  const b = await startBroker(await freePort(), redisEnv);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  const context = await browser.newContext({ viewport: { width: 1500, height: 900 } });
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  const requests = [];
  page.on("request", (r) => requests.push(r.url()));

  // 1. Loads and lists threads.
  const listed = [`cb-${tag}-a`, `cb-${tag}-b`];
  for (const t of listed) {
    await runThrough(a.base, t, {
      messages: [{ id: `${t}-u1`, role: "user", content: "hello" }],
    });
  }
  await page.goto(`${a.base}/console`);
  await page.waitForSelector("#threads");
  await page.fill("#thread-prefix", `cb-${tag}-`);
  await until("the thread list", async () => {
    const shown = await page.$$eval("#threads tbody tr", (trs) => trs.map((t) => t.dataset.thread));
    return listed.every((t) => shown.includes(t)) && shown.length === listed.length;
  });
  const row = await page.$$eval("#threads tbody tr", (trs) => trs.map((t) => t.textContent));
  assert.ok(row.every((r) => r.includes("finished")), `list rows: ${row}`);
  assert.equal(await page.textContent("#broker-status"), "broker ready");
  log("1. loads and lists threads: ok");

  // 2. A turn from the page streams into both views.
  const t1 = `cb-${tag}-turn`;
  await openThread(page, a.base, t1);
  await startTurn(page, "I would like to open an account");
  const mid = await until("the run mid-way in both views", async () => {
    const rows = await opRows(page);
    const c = await customer(page);
    const writing = c.messages.some((m) => m.role === "assistant" && typeof m.content === "string" && m.content.length > 0);
    return hasType(rows, "TEXT_MESSAGE_CONTENT") && !hasType(rows, "RUN_FINISHED") && writing
      ? { rows: rows.length, messages: c.messages.length }
      : false;
  }, 20_000, 25);
  if (args.screenshot) {
    await page.waitForTimeout(600); // a few more events, still mid-run (the run takes ~9 s)
    await page.screenshot({ path: args.screenshot });
    summary.screenshot = "mid-run";
  }
  await until("the run's end in the operator view", async () => hasType(await opRows(page), "RUN_FINISHED"));
  const checked = await assertOperatorExact(page, a.base, t1);
  const c1 = await assertCustomerEqualsSnapshot(page, a.base, t1);
  assert.equal(c1.state.stage, "routed");
  assert.equal(c1.messages[0].role, "user", "the question comes first (the gateway's input echo)");
  summary.turn = { midRows: mid.rows, midMessages: mid.messages, liveRows: checked, messages: c1.messages.length };
  log("2. a turn streams into both views:", JSON.stringify(summary.turn));

  // 3. A reload mid-run rejoins; the run's interrupt is answered from the page.
  await startTurn(page, ""); // state.stage = "routed": the advisor's approval, ending with an interrupt
  await until("the second run under way", async () => (await opRows(page)).filter((r) => r.type === "RUN_STARTED").length >= 2);
  await page.reload();
  await page.waitForSelector("#thread-pane:not([hidden])");
  // Mid-run after the reload (the prelude, then a few live events), for the screenshot.
  const midReload = await until("live events after the reload's prelude", async () => {
    const rows = await opRows(page);
    const after = rows.length - 1 - rows.findLastIndex((r) => r.mark === "prelude");
    if (hasType(rows, "RUN_FINISHED")) return "ended";
    return rows.some((r) => r.mark === "prelude") && after >= 6 ? "mid" : false;
  }, 20_000, 20).then((s) => s === "mid");
  if (args.screenshot && midReload) {
    // Where the marks show: the prelude the reloaded page started with, then live rows.
    await page.screenshot({ path: args.screenshot });
    summary.screenshot = "after a reload, mid-run";
  }
  await until("the interrupt after the reload", async () => {
    const rows = await opRows(page);
    return hasType(rows, "RUN_FINISHED") && (await page.$("#interrupts button[data-answer=approve]"));
  });
  const reloaded = await opRows(page);
  assert.equal(reloaded[0].type, "RUN_STARTED");
  assert.equal(reloaded[0].mark, "prelude", "the reloaded page starts with a prelude");
  await assertOperatorExact(page, a.base, t1);
  await assertCustomerEqualsSnapshot(page, a.base, t1);
  await page.click("#interrupts button[data-answer=approve]");
  await until("the account opened", async () => (await customer(page)).state?.stage === "opened");
  await until("the third run's end", async () => {
    const snap = await snapshot(a.base, t1);
    return snap.run?.status === "finished" && snap.run.finished?.outcome?.type !== "interrupt";
  });
  await assertOperatorExact(page, a.base, t1);
  const c3 = await assertCustomerEqualsSnapshot(page, a.base, t1);
  assert.ok(c3.state.account, "the account is in the state");
  log("3. reload rejoins, interrupt answered: ok");

  // 4. Cancel from the page.
  const t2 = `cb-${tag}-cancel`;
  await openThread(page, a.base, t2);
  await startTurn(page, "I would like to open an account");
  await until("the cancel button", async () => !(await page.isDisabled("#run-cancel")));
  await page.click("#run-cancel");
  await until("the RUN_ERROR cancelled", async () => {
    const snap = await snapshot(a.base, t2);
    return snap.run?.status === "errored" && snap.run?.error?.code === "cancelled";
  });
  await until("the operator view's RUN_ERROR", async () => hasType(await opRows(page), "RUN_ERROR"));
  await assertCustomerEqualsSnapshot(page, a.base, t2);
  log("4. cancel: ok");

  // 5. Kill and restart the page's node mid-run; the run goes on through node B.
  const t3 = `cb-${tag}-kill`;
  await openThread(page, a.base, t3);
  const run = runThrough(b.base, t3, {
    messages: [{ id: `${t3}-u1`, role: "user", content: "I would like to open an account" }],
  });
  await until("events in the page before the kill", async () => (await opRows(page)).length >= 20, 20_000, 20);
  await kill(a);
  const rowsAtKill = await opRows(page);
  const before = rowsAtKill.length;
  const preludes = (rows) => rows.filter((r) => r.mark === "prelude").length;
  await sleep(1200);
  const a2 = await startBroker(a.port, a.env);
  await run;
  await until("the run's end in the page after the restart", async () => hasType(await opRows(page), "RUN_FINISHED"));
  const notes = await opNotes(page);
  assert.ok(notes.some((n) => /connection lost|stream ended/.test(n)), `the page saw the cut: ${notes}`);
  assert.ok(notes.some((n) => n.startsWith("connected with Last-Event-ID")), `the page resumed: ${notes}`);
  assert.equal(preludes(await opRows(page)), preludes(rowsAtKill), "no prelude after the restart: an exact resume");
  const live = await assertOperatorExact(page, a2.base, t3);
  const c5 = await assertCustomerEqualsSnapshot(page, a2.base, t3);
  assert.equal(c5.resets, 0, "the customer view resumed exactly (no prelude, no reset)");
  assert.ok(live > before, "events arrived after the restart");
  summary.kill = { rowsBeforeKill: before, liveRows: live };
  log("5. kill and restart mid-run:", JSON.stringify(summary.kill));

  // 6. With authentication on: the console asks for the admin token.
  // (A small queue, for 7: a batch of 100 deltas is a backlog there, and is coalesced.)
  const c = await startBroker(await freePort(), {
    AGUI_AUTH__HS256_SECRET: SECRET,
    AGUI_QUEUE__MAX_EVENTS: "64",
  });
  const admin = await new Promise((resolve, reject) => {
    const p = spawn(bin, ["token", "--admin", "--ttl", "10m", "--secret", SECRET], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    p.stdout.on("data", (d) => (out += d));
    p.on("exit", (code) => (code === 0 ? resolve(out.trim()) : reject(new Error(`token exited ${code}`))));
  });
  const authed = `cb-${tag}-auth`;
  const pub = await fetch(`${c.base}/v1/threads/${authed}/events`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${admin}` },
    body: JSON.stringify({ type: "RUN_STARTED", threadId: authed, runId: "r1" }),
  });
  assert.equal(pub.status, 200);
  const page2 = await context.newPage();
  page2.on("pageerror", (e) => errors.push(e.message));
  await page2.goto(`${c.base}/console/`);
  await page2.waitForSelector("#token-box:not([hidden])");
  assert.match(await page2.textContent("#threads-note"), /401/);
  await page2.fill("#token-input", admin);
  await page2.click("#token-save");
  await until("the list with the token", async () =>
    (await page2.$$eval("#threads tbody tr", (trs) => trs.map((t) => t.dataset.thread))).includes(authed),
  );
  log("6. auth: ok");

  // 7. A coalesced delta is marked with the events it stands for (memory ids are consecutive).
  const merged = `cb-${tag}-merged`;
  const publish = (events) =>
    fetch(`${c.base}/v1/threads/${merged}/events`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${admin}` },
      body: JSON.stringify(events),
    }).then((r) => assert.equal(r.status, 200));
  await publish([
    { type: "RUN_STARTED", threadId: merged, runId: "r1" },
    { type: "TEXT_MESSAGE_START", messageId: "m1", role: "assistant" },
  ]);
  await openThread(page2, c.base, merged);
  await until("the operator view of the merged thread", async () => (await opRows(page2)).length >= 2);
  const words = Array.from({ length: 100 }, (_, i) => ({ type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta: `w${i} ` }));
  await publish(words);
  const marked = await until("a coalesced row", async () =>
    page2.$eval("#op-rows .row[data-mark=coalesced]", (r) => r.textContent).catch(() => false),
  );
  assert.match(marked, /coalesced 100 events/);
  const text = await until("the customer's text", async () => {
    const m = (await customer(page2)).messages.find((x) => x.id === "m1");
    return m?.content?.length === words.map((w) => w.delta).join("").length ? m.content : false;
  });
  assert.equal(text, words.map((w) => w.delta).join(""));
  log("7. coalesced delta marked: ok");

  const foreign = requests.filter((u) => !u.startsWith(a.base) && !u.startsWith(b.base) && !u.startsWith(c.base));
  assert.deepEqual(foreign, [], "the page fetches from the broker only");
  assert.deepEqual(errors, [], "no error in the page");
  summary.requests = requests.length;
  summary.ok = true;
} catch (e) {
  console.error(`console-browser: FAIL: ${e?.stack ?? e}`);
  process.exitCode = 1;
} finally {
  await browser?.close().catch(() => {});
  for (const child of children) child.kill("SIGKILL");
}
console.log(JSON.stringify(summary));
