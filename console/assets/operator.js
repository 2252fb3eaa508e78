// The console's operator view: a thread's event stream exactly as the broker writes it
// (GET /v1/threads/{threadId}/events over fetch, so that comments and ids are seen too), one
// row per event, with what the broker did to the stream marked (PROTOCOL §4, §5):
//   prelude    events a stream starts with (the RUN_STARTED marked agui-fanout.prelude, up to
//              the event that carries an id);
//   bridge     a reset bridge (from the event whose id ends in -bridge to the next id);
//   gap        the broker's agui-fanout.gap event (what a reset skipped);
//   coalesced  a delta that stands for several published events (when the ids prove it: the
//              memory log's ids are consecutive, Redis ids only within one millisecond);
//   note       the broker's own comments (": agui-fanout: …") and the connection's life.
// It reconnects with Last-Event-ID after a stream ends, as an EventSource would.

/** Most rows kept; older ones are dropped (counted). */
const MAX_ROWS = 5000;

/** Types the broker may merge when a subscriber is behind (PROTOCOL §5 "Coalescing"). */
const MERGEABLE = new Set([
  "TEXT_MESSAGE_CONTENT",
  "TOOL_CALL_ARGS",
  "REASONING_MESSAGE_CONTENT",
  "STATE_DELTA",
  "STATE_SNAPSHOT",
]);

/** `<epoch>-<ms>-<seq>` as numbers, or undefined (a bridge mark, or not an id). */
export function parseId(id) {
  const m = /^([0-9a-f]{8})-(\d+)-(\d+)$/.exec(id ?? "");
  return m ? { epoch: m[1], ms: BigInt(m[2]), seq: BigInt(m[3]) } : undefined;
}

/**
 * How many log entries lie strictly between two ids of one stream, when the ids prove it:
 * exactly, within one millisecond (the memory log's ids are all `0-n`); at least `seq` when the
 * later id is in a later millisecond (entries `ms-0` … `ms-(seq-1)` came before it); else
 * undefined.
 * @returns {{n: bigint, exact: boolean} | undefined}
 */
export function between(prev, next) {
  const a = parseId(prev);
  const b = parseId(next);
  if (!a || !b || a.epoch !== b.epoch) return undefined;
  if (a.ms === b.ms) return { n: b.seq - a.seq - 1n, exact: true };
  if (b.ms > a.ms && b.seq > 0n) return { n: b.seq, exact: false };
  return undefined;
}

/** Splits an SSE body into events (WHATWG HTML §9.2), comments included. */
class SseReader {
  constructor() {
    this.buf = "";
    this.data = [];
    this.id = undefined;
    this.retry = undefined;
    this.comments = [];
  }

  /** Feeds text; returns the items completed: {kind:"event", id, data} | {kind:"comment", text} | {kind:"retry", ms}. */
  push(text) {
    this.buf += text;
    const out = [];
    let nl;
    while ((nl = this.buf.search(/\r\n|\n|\r/)) >= 0) {
      const line = this.buf.slice(0, nl);
      const sep = this.buf.startsWith("\r\n", nl) ? 2 : 1;
      this.buf = this.buf.slice(nl + sep);
      if (line === "") {
        if (this.data.length > 0) out.push({ kind: "event", id: this.id, data: this.data.join("\n") });
        this.data = [];
        this.id = undefined;
        continue;
      }
      if (line.startsWith(":")) {
        const text = line.slice(1).replace(/^ /, "");
        if (text !== "") out.push({ kind: "comment", text });
        continue;
      }
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "data") this.data.push(value);
      else if (field === "id" && !value.includes("\0")) this.id = value;
      else if (field === "retry" && /^\d+$/.test(value)) out.push({ kind: "retry", ms: Number(value) });
    }
    return out;
  }
}

export class OperatorView {
  /**
   * @param {HTMLElement} rows the rows' container
   * @param {HTMLElement} status the connection pill
   * @param {{threadId: string, token: () => string | undefined}} opts
   */
  constructor(rows, status, opts) {
    this.rows = rows;
    this.status = status;
    this.opts = opts;
    this.lastId = undefined; // the stream's last-event-id buffer
    this.prevLive = undefined; // the id of the last live (not prelude/bridge) event
    this.mode = undefined; // "prelude" | "bridge" while inside one
    this.retryMs = 2000;
    this.dropped = 0;
    this.count = 0;
    this.controller = new AbortController();
    this.connections = 0;
  }

  start() {
    this.loop().catch((e) => this.note(`stopped: ${e}`, "conn"));
  }

  stop() {
    this.controller.abort();
  }

  async loop() {
    const signal = this.controller.signal;
    while (!signal.aborted) {
      const headers = { Accept: "text/event-stream" };
      const token = this.opts.token();
      if (token) headers.Authorization = `Bearer ${token}`;
      if (this.lastId !== undefined) headers["Last-Event-ID"] = this.lastId;
      this.setStatus("connecting", "warn");
      let failed = false;
      try {
        const resp = await fetch(`/v1/threads/${encodeURIComponent(this.opts.threadId)}/events`, {
          headers,
          signal,
          cache: "no-store",
        });
        if (!resp.ok) {
          const body = await resp.text().catch(() => "");
          this.note(`subscribe answered ${resp.status}: ${body.slice(0, 200)}`, "conn");
          this.setStatus(`HTTP ${resp.status}`, "bad");
          failed = true;
        } else {
          this.connections += 1;
          this.note(
            this.lastId === undefined
              ? "connected (no id: the stream starts with a prelude)"
              : `connected with Last-Event-ID ${this.lastId}`,
            "conn",
          );
          this.setStatus("live", "ok");
          await this.read(resp.body);
          if (!signal.aborted) this.note("stream ended; reconnecting", "conn");
        }
      } catch (e) {
        if (signal.aborted) return;
        this.note(`connection lost (${e?.message ?? e}); reconnecting`, "conn");
        failed = true;
      }
      if (signal.aborted) return;
      this.setStatus("reconnecting", "warn");
      // As an EventSource: the broker's retry:, longer after a failure.
      await sleep(failed ? Math.max(this.retryMs, 1000) : this.retryMs, signal);
    }
  }

  async read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    const sse = new SseReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      for (const item of sse.push(value)) this.item(item);
    }
  }

  item(item) {
    if (item.kind === "retry") {
      this.retryMs = item.ms;
      return;
    }
    if (item.kind === "comment") {
      if (item.text.startsWith("agui-fanout:")) this.note(item.text, "note");
      return;
    }
    if (item.id !== undefined) this.lastId = item.id;
    let event;
    try {
      event = JSON.parse(item.data);
    } catch {
      event = { type: "(not JSON)" };
    }
    const tags = [];
    let mark;
    const fanout = event?.metadata?.["agui-fanout"];
    if (event.type === "RUN_STARTED" && fanout?.prelude === true) this.mode = "prelude";
    if (item.id?.endsWith("-bridge")) this.mode = "bridge";
    if (this.mode) {
      mark = this.mode;
      if (item.id !== undefined && !item.id.endsWith("-bridge")) {
        this.mode = undefined;
        this.prevLive = item.id;
      }
    } else if (item.id !== undefined) {
      const gap = MERGEABLE.has(event.type) ? between(this.prevLive, item.id) : undefined;
      if (gap && gap.n > 0n) {
        mark = "coalesced";
        tags.push(`${gap.exact ? "" : "≥"}${gap.n + 1n} events`);
      }
      this.prevLive = item.id;
    }
    if (event.type === "CUSTOM" && event.name === "agui-fanout.gap") {
      mark = "gap";
      const v = event.value ?? {};
      tags.push(`skipped ${v.skipped ?? "?"}`);
    }
    this.row(item.id, event.type, item.data, mark, tags);
  }

  row(id, type, json, mark, tags = []) {
    const el = document.createElement("div");
    el.className = `row${mark ? ` ${mark}` : ""}`;
    el.dataset.kind = "event";
    if (id !== undefined) el.dataset.id = id;
    el.dataset.type = type ?? "";
    if (mark) el.dataset.mark = mark;
    const idEl = span("id", id ?? "·");
    const typeEl = span("type", type ?? "");
    if (mark) {
      const m = span(`mark ${mark} tags`, [mark, ...tags].join(" "));
      typeEl.append(m);
    }
    el.append(idEl, typeEl, span("json", json));
    el.title = "click to show the whole event";
    // The whole JSON on demand; rows stay one line each otherwise.
    el.addEventListener("click", () => el.classList.toggle("open"));
    this.count += 1;
    this.append(el);
  }

  note(text, kind) {
    const el = document.createElement("div");
    el.className = `row ${kind}`;
    el.dataset.kind = kind;
    el.textContent = kind === "note" ? `: ${text}` : text;
    this.append(el);
  }

  append(el) {
    const atBottom = this.rows.scrollTop + this.rows.clientHeight >= this.rows.scrollHeight - 4;
    this.rows.append(el);
    while (this.rows.childElementCount > MAX_ROWS) {
      this.rows.firstElementChild.remove();
      this.dropped += 1;
    }
    if (atBottom) this.rows.scrollTop = this.rows.scrollHeight;
  }

  setStatus(text, cls) {
    this.status.textContent = text;
    this.status.className = `pill ${cls}`;
  }
}

function span(cls, text) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = text;
  return s;
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });
}
