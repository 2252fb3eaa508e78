// A producer that behaves as README and PROTOCOL §2 tell producers to: one event per POST (as
// an agent streams), retried on `503` after its `Retry-After`, retried on a transport error
// (the balancer sends the retry to a live node), with `X-Producer-Id`/`X-Producer-Seq` when
// `idempotent` (the documented way to make retries safe), without them otherwise (the docs
// say a 503 means nothing was appended, so a plain retry must be safe too).
//
// It publishes one valid AG-UI run: `RUN_STARTED`, `TEXT_MESSAGE_START`, then steps cycling
// through a `CUSTOM` event numbered by `value.seq` (what the checker counts: never coalesced,
// restated by no snapshot), a `TEXT_MESSAGE_CONTENT` and a `STATE_DELTA` (what the fold check
// sees), and at the end `TEXT_MESSAGE_END`, `RUN_FINISHED` (a pattern without text opens no
// message). When the log lost the run under it
// (Redis restarted empty, a failover), the broker refuses the next event with `409
// order_violation`; the producer then does what an agent would: it reads the thread's snapshot
// and opens a new run (or a new message in the running one), and goes on.

import { setTimeout as sleep } from "node:timers/promises";

/** Name of the `CUSTOM` events the checker counts. */
export const SEQ_EVENT = "fault-seq";

/** Longest time one event is retried before the producer gives up on it. */
const EVENT_DEADLINE_MS = 30_000;
/** Per-request timeout. */
const REQUEST_TIMEOUT_MS = 10_000;
/** New runs or messages a producer opens after `409`s before it gives up. */
const MAX_RESYNCS = 6;

export class Producer {
  /**
   * @param {object} o
   * @param {string} o.name producer id (also `X-Producer-Id` when idempotent)
   * @param {() => string} o.base the broker's base URL (a balancer's, usually)
   * @param {string} o.thread
   * @param {boolean} [o.idempotent]
   * @param {number} [o.padBytes] padding of each counted `CUSTOM` event
   * @param {string[]} [o.pattern] the steps' kinds in turn: `custom`, `text`, `state` (no
   *   `text`: the run opens no message)
   */
  constructor({ name, base, thread, idempotent = true, padBytes = 48, pattern = ["custom", "text", "state"] }) {
    Object.assign(this, { name, base, thread, idempotent, padBytes, pattern });
    this.withMessage = pattern.includes("text");
    this.number = 0; // X-Producer-Seq of the last event sent
    this.seq = 0; // value.seq of the last counted event
    this.run = 0;
    this.messageId = null;
    this.step = 0;
    /** value.seq → `{id, duplicates}` for every counted event a 200 acknowledged. */
    this.acked = new Map();
    /** value.seq of counted events given up on (never acknowledged). */
    this.unacked = [];
    this.stats = { requests: 0, status: {}, transportErrors: 0, resyncs: 0, gaveUp: 0, refused: [] };
    this.failed = null;
  }

  get url() {
    return `${this.base()}/v1/threads/${this.thread}/events`;
  }

  /**
   * Sends one event until a final answer. Returns `{ok: reply}`, `{conflict: error}` (409),
   * `{refused: {status, body}}` (another 4xx) or `{gaveUp: reason}`.
   */
  async send(event, number) {
    const deadline = Date.now() + EVENT_DEADLINE_MS;
    const headers = { "Content-Type": "application/json" };
    if (this.idempotent) {
      headers["X-Producer-Id"] = this.name;
      headers["X-Producer-Seq"] = String(number);
    }
    let last = "no attempt";
    while (Date.now() < deadline) {
      this.stats.requests += 1;
      let res;
      let text;
      try {
        res = await fetch(this.url, {
          method: "POST",
          headers,
          body: JSON.stringify(event),
          signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
        });
        text = await res.text();
      } catch (error) {
        this.stats.transportErrors += 1;
        last = `transport: ${error.cause?.code ?? error.name}`;
        await sleep(200);
        continue;
      }
      this.stats.status[res.status] = (this.stats.status[res.status] ?? 0) + 1;
      let body = null;
      try {
        body = JSON.parse(text);
      } catch {
        // Not JSON: kept as text below.
      }
      if (res.status === 200) return { ok: body };
      if (res.status === 503) {
        // PROTOCOL §2: backend_unavailable, contended, draining: retry after Retry-After.
        const after = Number(res.headers.get("retry-after") ?? "1");
        last = `503 ${body?.error?.code ?? text.slice(0, 80)}`;
        await sleep(Math.min(Math.max(after, 0.1), 5) * 1000);
        continue;
      }
      if (res.status === 409 && body?.error?.code === "order_violation") return { conflict: body.error };
      if (res.status === 409 && body?.error?.code === "gap") {
        last = "409 gap";
        await sleep(500);
        continue;
      }
      return { refused: { status: res.status, body: text.slice(0, 300) } };
    }
    return { gaveUp: last };
  }

  /** Publishes `event` (a new X-Producer-Seq), opening a new run or message on a 409. */
  async publish(event, seq = null) {
    for (;;) {
      this.number += 1;
      const answer = await this.send(event, this.number);
      if (answer.ok) {
        if (seq !== null) {
          this.acked.set(seq, { id: answer.ok.lastId ?? null, duplicates: answer.ok.duplicates ?? 0 });
        }
        return true;
      }
      if (answer.conflict && this.stats.resyncs < MAX_RESYNCS) {
        this.stats.resyncs += 1;
        if (!(await this.resync(answer.conflict.rule))) break;
        if (event.type === "TEXT_MESSAGE_CONTENT" || event.type === "TEXT_MESSAGE_END") {
          event = { ...event, messageId: this.messageId };
        }
        if (event.type === "RUN_FINISHED") event = { ...event, runId: this.runId };
        continue;
      }
      if (answer.refused) this.stats.refused.push({ type: event.type, ...answer.refused });
      if (answer.conflict) this.stats.refused.push({ type: event.type, status: 409, body: JSON.stringify(answer.conflict) });
      if (answer.gaveUp) this.stats.gaveUp += 1;
      break;
    }
    if (seq !== null) this.unacked.push(seq);
    return false;
  }

  /**
   * After a 409 breaking `rule`: a new run when the log has no running run (an empty log, a
   * finished run), a new message when the message is not open; for any other rule, whichever
   * the thread's snapshot says.
   */
  async resync(rule) {
    if (["first_event_must_be_run_started", "run_already_finished", "run_already_errored"].includes(rule)) {
      return this.openRun();
    }
    if (rule === "message_not_open") return !this.withMessage || this.openMessage();
    let snapshot = null;
    try {
      const res = await fetch(`${this.base()}/v1/threads/${this.thread}/snapshot`, {
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
      if (res.ok) snapshot = await res.json();
    } catch {
      // Unknown: open a new run, the broker will say if that was wrong.
    }
    if (snapshot?.run?.status !== "running") return this.openRun();
    return !this.withMessage || this.openMessage();
  }

  async openRun() {
    this.run += 1;
    this.runId = `${this.name}-run${this.run}`;
    const ok = await this.publishPlain({ type: "RUN_STARTED", threadId: this.thread, runId: this.runId });
    return ok && (!this.withMessage || this.openMessage());
  }

  async openMessage() {
    this.messageId = `${this.name}-m${this.run}-${this.number + 1}`;
    return this.publishPlain({ type: "TEXT_MESSAGE_START", messageId: this.messageId, role: "assistant" });
  }

  /** One event without resync (the run's own opening and closing events). */
  async publishPlain(event) {
    this.number += 1;
    const answer = await this.send(event, this.number);
    if (!answer.ok) this.stats.refused.push({ type: event.type, ...(answer.refused ?? answer) });
    return Boolean(answer.ok);
  }

  /** The next step's event; `seq` is set for counted events. */
  nextStep() {
    const step = this.step++;
    switch (this.pattern[step % this.pattern.length]) {
      case "custom": {
        const seq = ++this.seq;
        const pad = "x".repeat(this.padBytes);
        return { seq, event: { type: "CUSTOM", name: SEQ_EVENT, value: { producer: this.name, seq, pad } } };
      }
      case "text": {
        const letter = String.fromCharCode(97 + ((this.run - 1) % 26));
        return { seq: null, event: { type: "TEXT_MESSAGE_CONTENT", messageId: this.messageId, delta: letter } };
      }
      default:
        return { seq: null, event: { type: "STATE_DELTA", delta: [{ op: "add", path: `/${this.name}`, value: step }] } };
    }
  }

  /**
   * Opens the run, publishes one step every `intervalMs` until `stop()` is called or `steps`
   * steps were sent, then closes the run; in the background (`done` settles when it ends).
   */
  async start({ intervalMs = 20, steps = Infinity } = {}) {
    this.done = (async () => {
      if (!(await this.openRun())) {
        this.failed = "could not open the run";
        return;
      }
      await this.runSteps({ intervalMs, steps });
      await this.closeRun();
    })().catch((error) => {
      this.failed = String(error?.stack ?? error);
    });
    return this;
  }

  /** Publishes steps every `intervalMs` (0: back to back) until `stop()` or `steps` steps. */
  async runSteps({ intervalMs = 20, steps = Infinity } = {}) {
    this.stopping = false;
    const t0 = Date.now();
    for (let i = 0; i < steps && !this.stopping; i++) {
      const { seq, event } = this.nextStep();
      await this.publish(event, seq);
      const wait = t0 + (i + 1) * intervalMs - Date.now();
      if (wait > 0) await sleep(wait);
    }
  }

  /** Ends the open message and the run. */
  async closeRun() {
    if (this.withMessage) await this.publish({ type: "TEXT_MESSAGE_END", messageId: this.messageId });
    await this.publish({ type: "RUN_FINISHED", threadId: this.thread, runId: this.runId });
  }

  /** Asks the loop to finish its run and waits for it. */
  async stop() {
    this.stopping = true;
    await this.done;
  }
}
