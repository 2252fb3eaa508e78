// The agui-fanout console (PROTOCOL §12): the thread list (polled from the admin API), and for
// one thread the operator view (operator.js) beside the customer view (customer.js), with
// controls that start a turn through the run gateway, cancel the run and answer an interrupt
// (PROTOCOL §11). With authentication on, every call carries the admin token the page was
// given (kept in sessionStorage, so it lasts as long as the tab).

import { OperatorView } from "./operator.js";
import { CustomerView } from "./customer.js";

const TOKEN_KEY = "agui-fanout-console-token";
const AGENT_KEY = "agui-fanout-console-agent";
const LIST_EVERY_MS = 2000;
const THREAD_EVERY_MS = 1000;

const $ = (id) => document.getElementById(id);

const token = () => sessionStorage.getItem(TOKEN_KEY) || undefined;

/** The page's state, also for tests and people at the devtools console. */
const app = {
  thread: undefined,
  operator: undefined,
  customer: undefined,
  summary: undefined,
  pages: 1,
  prefix: "",
};
window.aguiConsole = app;

/** A call to the broker with the token; the JSON body, or throws {status, body}. */
async function api(path, init = {}) {
  const headers = { ...(init.headers ?? {}) };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const resp = await fetch(path, { cache: "no-store", ...init, headers });
  const text = await resp.text();
  let body = text;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    // not JSON
  }
  if (resp.status === 401 || resp.status === 403) askToken(body?.error?.message);
  if (!resp.ok) throw { status: resp.status, body };
  return body;
}

function describe(err) {
  if (err?.status) {
    const e = err.body?.error;
    return e ? `${err.status} ${e.code}: ${e.message}` : `HTTP ${err.status}`;
  }
  return String(err?.message ?? err);
}

// --- token -------------------------------------------------------------------------------------

function askToken(reason) {
  $("token-box").hidden = false;
  if (reason) $("token-reason").textContent = `The broker refused the token: ${reason}. It needs an admin token (a JWT whose agui claim holds "admin": true; agui-fanout token --admin prints one).`;
}

function showTokenState() {
  $("token-state").textContent = token() ? "admin token set" : "no token";
}

$("token-button").addEventListener("click", () => {
  $("token-box").hidden = !$("token-box").hidden;
});
$("token-save").addEventListener("click", () => {
  const t = $("token-input").value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  $("token-input").value = "";
  $("token-box").hidden = true;
  showTokenState();
  refreshThreads();
  if (app.thread) openThread(app.thread, true);
});
$("token-clear").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showTokenState();
});

// --- broker status -----------------------------------------------------------------------------

async function pollReady() {
  const pill = $("broker-status");
  try {
    const resp = await fetch("/readyz", { cache: "no-store" });
    pill.textContent = resp.ok ? "broker ready" : `broker not ready (${resp.status})`;
    pill.className = `pill ${resp.ok ? "ok" : "warn"}`;
  } catch {
    pill.textContent = "broker unreachable";
    pill.className = "pill bad";
  }
}

// --- thread list -------------------------------------------------------------------------------

async function refreshThreads() {
  const rows = [];
  let cursor;
  let more = false;
  try {
    for (let page = 0; page < app.pages; page++) {
      const q = new URLSearchParams({ limit: "100" });
      if (app.prefix) q.set("prefix", app.prefix);
      if (cursor) q.set("cursor", cursor);
      const body = await api(`/v1/threads?${q}`);
      rows.push(...body.threads);
      cursor = body.nextCursor;
      if (!cursor) break;
    }
    more = Boolean(cursor);
    $("threads-note").textContent = rows.length === 0 ? "no thread yet" : "";
  } catch (e) {
    $("threads-note").textContent = `cannot list threads: ${describe(e)}`;
    return;
  }
  const tbody = $("threads").tBodies[0];
  tbody.replaceChildren(
    ...rows.map((t) => {
      const tr = document.createElement("tr");
      tr.dataset.thread = t.threadId;
      if (t.threadId === app.thread) tr.className = "selected";
      const run = t.runStatus === "finished" && t.outcome === "interrupt" ? "interrupt" : (t.runStatus ?? "—");
      for (const text of [t.threadId, run, String(t.eventsRetained), String(t.connections)]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.append(td);
      }
      tr.title = `last: ${t.lastEventType ?? "?"} ${t.lastEventId ?? ""}`;
      tr.addEventListener("click", () => select(t.threadId));
      return tr;
    }),
  );
  $("threads-more").hidden = !more;
}

$("threads-more").addEventListener("click", () => {
  app.pages += 1;
  refreshThreads();
});
$("thread-prefix").addEventListener("input", (e) => {
  app.prefix = e.target.value.trim();
  app.pages = 1;
  refreshThreads();
});
$("open-thread").addEventListener("click", () => {
  const id = $("open-thread-id").value.trim();
  if (/^[A-Za-z0-9._:-]{1,128}$/.test(id)) select(id);
  else $("threads-note").textContent = "a thread id is 1-128 characters of A-Z a-z 0-9 . _ : -";
});

// --- one thread --------------------------------------------------------------------------------

function select(threadId) {
  location.hash = `thread=${encodeURIComponent(threadId)}`;
}

function fromHash() {
  const m = /^#thread=(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : undefined;
}

function openThread(threadId, force = false) {
  if (!force && threadId === app.thread) return;
  app.operator?.stop();
  app.customer?.stop();
  app.thread = threadId;
  app.summary = undefined;
  $("empty-pane").hidden = threadId !== undefined;
  $("thread-pane").hidden = threadId === undefined;
  for (const tr of $("threads").tBodies[0].rows) {
    tr.className = tr.dataset.thread === threadId ? "selected" : "";
  }
  if (threadId === undefined) return;
  $("thread-title").textContent = threadId;
  $("op-rows").replaceChildren();
  $("cu-notices").replaceChildren();
  $("control-status").textContent = "";
  app.operator = new OperatorView($("op-rows"), $("op-status"), { threadId, token });
  app.customer = new CustomerView(
    { messages: $("cu-messages"), state: $("cu-state"), notices: $("cu-notices"), status: $("cu-status") },
    { threadId, token },
  );
  app.operator.start();
  app.customer.start();
  refreshThread();
}

async function refreshThread() {
  const threadId = app.thread;
  if (!threadId) return;
  let summary;
  try {
    summary = await api(`/v1/threads/${encodeURIComponent(threadId)}`);
  } catch (e) {
    summary = undefined;
    $("thread-info").textContent = e?.status === 404 ? "no event yet" : describe(e);
  }
  if (threadId !== app.thread) return;
  app.summary = summary;
  const run = summary?.run;
  const pill = $("thread-run");
  const interrupts = run?.status === "finished" ? (run.finished?.outcome?.interrupts ?? []) : [];
  if (!run) {
    pill.textContent = "no run";
    pill.className = "pill";
  } else {
    const waiting = run.status === "finished" && run.finished?.outcome?.type === "interrupt";
    pill.textContent = `${run.runId ?? "?"}: ${waiting ? "waiting (interrupt)" : run.status}`;
    pill.className = `pill ${run.status === "running" ? "ok" : run.status === "errored" ? "bad" : waiting ? "warn" : ""}`;
  }
  if (summary) {
    $("thread-info").textContent =
      `${summary.eventsRetained} events retained · last ${summary.lastEventType ?? "?"} ${summary.lastEventId ?? ""}` +
      (summary.trimmed ? " · trimmed" : "");
  }
  $("run-cancel").disabled = run?.status !== "running";
  renderInterrupts(interrupts);
  try {
    const conns = await api(`/v1/connections?thread=${encodeURIComponent(threadId)}`);
    if (threadId === app.thread) renderConnections(conns);
  } catch {
    // shown by the list's note
  }
}

function renderInterrupts(interrupts) {
  const box = $("interrupts");
  const key = JSON.stringify(interrupts.map((i) => i.id));
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.hidden = interrupts.length === 0;
  box.replaceChildren();
  if (interrupts.length === 0) return;
  const p = document.createElement("p");
  p.textContent = "The run ended with an interrupt: it waits for an answer (the next run's resume[]).";
  box.append(p);
  for (const i of interrupts) {
    const row = document.createElement("div");
    row.className = "interrupt";
    const text = document.createElement("span");
    text.textContent = `${i.id}${i.reason ? ` (${i.reason})` : ""}${i.message ? `: ${i.message}` : ""}`;
    row.append(text);
    for (const [label, approved] of [["Approve", true], ["Reject", false]]) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = label;
      b.dataset.interrupt = i.id;
      b.dataset.answer = approved ? "approve" : "reject";
      b.addEventListener("click", () =>
        startTurn({ resume: [{ interruptId: i.id, status: "resolved", payload: { approved } }] }),
      );
      row.append(b);
    }
    box.append(row);
  }
}

function renderConnections(body) {
  $("conn-count").textContent = String(body.total);
  const tbody = $("connections").tBodies[0];
  tbody.replaceChildren(
    ...body.connections.map((c) => {
      const tr = document.createElement("tr");
      const cells = [
        String(c.id),
        c.remoteAddr ?? "?",
        `${Math.round(c.ageMs / 1000)} s`,
        c.start,
        `${c.queue.events} ev / ${c.queue.bytes} B`,
        String(c.resets),
      ];
      for (const text of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.append(td);
      }
      const td = document.createElement("td");
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = "Close";
      b.title = "end this stream: its client reconnects and resumes exactly";
      b.addEventListener("click", async () => {
        try {
          await api(`/v1/connections/${c.id}`, { method: "DELETE" });
        } catch (e) {
          status(describe(e), true);
        }
        refreshThread();
      });
      td.append(b);
      tr.append(td);
      return tr;
    }),
  );
}

// --- controls ----------------------------------------------------------------------------------

function status(text, bad = false) {
  const el = $("control-status");
  el.textContent = text;
  el.className = `status${bad ? " bad" : ""}`;
}

function randomId(prefix) {
  const hex = crypto.getRandomValues(new Uint8Array(8));
  return prefix + Array.from(hex, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Starts a turn through the gateway: POST /v1/agents/{agent} with a RunAgentInput. */
async function startTurn({ resume } = {}) {
  const threadId = app.thread;
  const agent = $("turn-agent").value.trim();
  if (!threadId || !agent) return;
  localStorage.setItem(AGENT_KEY, agent);
  const text = $("turn-message").value;
  const input = {
    threadId,
    runId: randomId("console-"),
    // Only the new message: the gateway echoes it into the run's RUN_STARTED (PROTOCOL §11).
    messages: text && !resume ? [{ id: randomId("msg-"), role: "user", content: text }] : [],
    // The state the customer holds, as an app's agent would send it.
    state: app.customer?.state ?? {},
    tools: [],
    context: [],
    forwardedProps: {},
  };
  if (resume) input.resume = resume;
  const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  status("starting…");
  try {
    const resp = await fetch(`/v1/agents/${encodeURIComponent(agent)}`, {
      method: "POST",
      headers,
      body: JSON.stringify(input),
    });
    if (!resp.ok) {
      const body = await resp.json().catch(() => null);
      status(describe({ status: resp.status, body }), true);
      if (resp.status === 401 || resp.status === 403) askToken(body?.error?.message);
      return;
    }
    if (!resume) $("turn-message").value = "";
    status(`run ${input.runId} started`);
    refreshThread();
    // The run's events reach both views through the log; this answer is read to its end
    // only so that the gateway sees its caller stay (on_disconnect = "cancel" agents).
    resp.body
      ?.pipeTo(new WritableStream())
      .then(() => status(`run ${input.runId} ended`))
      .catch(() => {});
  } catch (e) {
    status(`cannot start the turn: ${describe(e)}`, true);
  }
}

async function cancelRun() {
  const run = app.summary?.run;
  if (!app.thread || run?.status !== "running" || !run.runId) return;
  try {
    const body = await api(
      `/v1/threads/${encodeURIComponent(app.thread)}/runs/${encodeURIComponent(run.runId)}/cancel`,
      { method: "POST" },
    );
    status(`run ${run.runId} cancelled (${body.lastId})`);
  } catch (e) {
    status(describe(e), true);
  }
  refreshThread();
}

$("turn-start").addEventListener("click", () => startTurn());
$("turn-message").addEventListener("keydown", (e) => {
  if (e.key === "Enter") startTurn();
});
$("run-cancel").addEventListener("click", cancelRun);

// --- start -------------------------------------------------------------------------------------

$("turn-agent").value = localStorage.getItem(AGENT_KEY) || "demo";
showTokenState();
window.addEventListener("hashchange", () => openThread(fromHash()));
openThread(fromHash());
pollReady();
refreshThreads();
setInterval(pollReady, LIST_EVERY_MS);
setInterval(refreshThreads, LIST_EVERY_MS);
setInterval(refreshThread, THREAD_EVERY_MS);
window.addEventListener("pagehide", () => {
  app.operator?.stop();
  app.customer?.stop();
});
