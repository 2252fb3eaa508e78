// A subscriber: the npm `eventsource` package (a WHATWG EventSource for Node), which reconnects
// by itself with `Last-Event-ID` after the `retry:` the broker sent, and stops for good after an
// answer that is not `200 text/event-stream`, as a browser does. Everything it receives is kept
// per connection for the checker and the fold check.
//
// Its `fetch` is wrapped, which changes nothing of what the EventSource does, to:
// - record every answer's status and content type (the "fatal answers" of the table);
// - hold the response body back while the subscriber is paused: nothing is read off the socket,
//   so the broker sees a client that stopped reading (a stalled tab, a network blip), and
//   everything queued arrives when it resumes.
//
// After a fatal answer the EventSource is dead, as it would be in a browser. The harness then
// does what an application that notices would do: after 1 s it opens a new EventSource with
// `?lastEventId=` set to the last id received, so that the other counts stay meaningful.

import { EventSource } from "./deps.mjs";
import { SEQ_EVENT } from "./producer.mjs";

/** True for the first event of a prelude (PROTOCOL §5): the marked `RUN_STARTED`. */
export function isPreludeStart(event) {
  return event?.type === "RUN_STARTED" && event?.metadata?.["agui-fanout"]?.prelude === true;
}

/** True for an event the broker added to say events were skipped (issue 13 item 3). */
export function isGapEvent(event) {
  return event?.type === "CUSTOM" && typeof event.name === "string" && event.name.startsWith("agui-fanout");
}

/**
 * What the checker needs of one received frame: `{id, data, seq, producer, signal}`; `seq`
 * is the counted event's number and `producer` its producer (or null), `signal` names what told the client it may have missed
 * events (`prelude`, `bridge`, `gap`) or is null.
 */
export function classify(id, data) {
  let event = null;
  try {
    event = JSON.parse(data);
  } catch {
    // Not JSON: kept, counted as nothing.
  }
  let seq = null;
  let producer = null;
  if (event?.type === "CUSTOM" && event.name === SEQ_EVENT && Number.isInteger(event.value?.seq)) {
    seq = event.value.seq;
    producer = event.value.producer;
  }
  let signal = null;
  if (isPreludeStart(event)) signal = "prelude";
  else if (id.endsWith("-bridge")) signal = "bridge";
  else if (isGapEvent(event)) signal = "gap";
  return { id, data, seq, producer, signal };
}

export class Subscriber {
  /**
   * @param {object} o
   * @param {string} o.name
   * @param {string} o.url the stream's URL (query included)
   * @param {string} o.thread
   */
  constructor({ name, url, thread }) {
    Object.assign(this, { name, url, thread });
    /** One entry per connection that opened: `{at, items: [classify(...)]}`. */
    this.conns = [];
    /** Every answer: `{status, contentType, at}`. */
    this.answers = [];
    /** Answers an EventSource does not retry after: `{status, contentType, body}`. */
    this.fatal = [];
    this.errors = 0;
    this.lastId = null;
    this.paused = false;
    this.resumeWaiters = [];
    this.closed = false;
    this.sources = 0;
    this.waiters = [];
  }

  /** Opens the EventSource. */
  start() {
    this.open(this.url);
    return this;
  }

  open(url) {
    this.sources += 1;
    const es = new EventSource(url, { fetch: (input, init) => this.fetch(input, init) });
    this.es = es;
    es.addEventListener("open", () => {
      this.conns.push({ at: Date.now(), items: [] });
    });
    es.addEventListener("message", (message) => {
      if (this.conns.length === 0) this.conns.push({ at: Date.now(), items: [] });
      const item = classify(message.lastEventId, message.data);
      this.conns.at(-1).items.push(item);
      if (message.lastEventId) {
        this.lastId = message.lastEventId;
        this.waiters = this.waiters.filter((w) => !w(message.lastEventId));
      }
    });
    es.addEventListener("error", () => {
      this.errors += 1;
      if (es.readyState === EventSource.CLOSED && !this.closed && this.es === es) {
        // Dead for good, as in a browser: an app re-creates it.
        setTimeout(() => {
          if (this.closed || this.es !== es) return;
          const again = new URL(this.url);
          if (this.lastId) {
            again.searchParams.delete("from");
            again.searchParams.set("lastEventId", this.lastId);
          }
          this.open(again.toString());
        }, 1000);
      }
    });
  }

  async fetch(input, init) {
    const res = await fetch(input, init);
    const contentType = res.headers.get("content-type") ?? "";
    this.answers.push({ status: res.status, contentType, at: Date.now() });
    if (res.status !== 200 || !contentType.startsWith("text/event-stream")) {
      const body = await res.text().catch(() => "");
      this.fatal.push({ status: res.status, contentType, body: body.slice(0, 200) });
      return new Response(null, { status: res.status === 200 ? 200 : res.status, headers: res.headers });
    }
    if (!res.body) return res;
    // The gate: pull from the real body only while not paused (highWaterMark 0: nothing is
    // read ahead), so a paused subscriber leaves the bytes in the socket.
    const reader = res.body.getReader();
    const gated = new ReadableStream(
      {
        pull: async (controller) => {
          while (this.paused) await new Promise((resolve) => this.resumeWaiters.push(resolve));
          try {
            const { done, value } = await reader.read();
            if (done) controller.close();
            else controller.enqueue(value);
          } catch (error) {
            controller.error(error);
          }
        },
        cancel: (reason) => reader.cancel(reason),
      },
      { highWaterMark: 0 },
    );
    return new Response(gated, { status: 200, headers: res.headers });
  }

  /** Stops reading (the socket fills, then the broker's queue). */
  pause() {
    this.paused = true;
  }

  /** Reads again. */
  resume() {
    this.paused = false;
    const waiters = this.resumeWaiters;
    this.resumeWaiters = [];
    for (const w of waiters) w();
  }

  /** True once an event with this id arrived. */
  has(id) {
    return this.conns.some((c) => c.items.some((i) => i.id === id));
  }

  /** Waits until an event with id `id` arrives (true) or `ms` pass (false). */
  waitFor(id, ms) {
    if (this.has(id)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== check);
        resolve(false);
      }, ms);
      const check = (got) => {
        if (got !== id) return false;
        clearTimeout(timer);
        resolve(true);
        return true;
      };
      this.waiters.push(check);
    });
  }

  /** Closes the EventSource for good. */
  close() {
    this.closed = true;
    this.resume();
    this.es?.close();
  }

  /** Every item received, in order, with the index of its connection. */
  items() {
    return this.conns.flatMap((c, conn) => c.items.map((i) => ({ ...i, conn })));
  }
}
