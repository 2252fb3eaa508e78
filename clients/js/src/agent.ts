// FanoutAgent: an `@ag-ui/client` `HttpAgent` for an agui-fanout broker. `runAgent()` runs a turn
// through the broker's run gateway (`POST {url}/v1/agents/{agent}`, PROTOCOL §11);
// `connectAgent()` follows the thread's log (`GET {url}/v1/threads/{threadId}/events`,
// PROTOCOL §2) through the client's own pipeline (verify, apply) across runs and reconnects,
// and restarts that pipeline whenever the broker answers with a prelude (PROTOCOL §4.3, §5).

import {
  AGUIError,
  HttpAgent,
  enforceOutgoingInput,
  type AgentSubscriber,
  type BaseEvent,
  type HttpAgentConfig,
  type RunAgentInput,
  type RunAgentParameters,
  type RunAgentResult,
} from "@ag-ui/client";
import { Observable } from "rxjs";
import { compareIds } from "./ids.js";
import {
  ThreadFollower,
  isPreludeStart,
  type Batch,
  type ConnectionState,
} from "./follow.js";
import { readSse } from "./sse.js";
import { resolveToken, type TokenSource } from "./token.js";

/** `new FanoutAgent(config)`. */
export interface FanoutAgentConfig extends Omit<HttpAgentConfig, "url" | "threadId"> {
  /** The broker's base URL, e.g. `"https://broker.example"` or `"/broker"` behind a proxy. */
  url: string;
  /** The gateway agent (`[agents.<name>]` in the broker's config) that `runAgent()` runs. */
  agent: string;
  /** The thread: its events are appended to, and followed from, the broker's log. */
  threadId: string;
  /**
   * A bearer token (PROTOCOL §8), or a function returning a fresh one. A function is called
   * before every request; the follow reconnects with a fresh token before the current one's
   * `exp`, and asks once more after a 401.
   */
  token?: TokenSource;
  /** Follow after this event id (e.g. one kept across page loads); see `lastEventId`. */
  lastEventId?: string;
  /** Reconnect delay until the broker's `retry:` sets one, ms (default 1000). */
  retryMs?: number;
  /** Longest delay between failed attempts, ms (default 30000). */
  maxRetryMs?: number;
  /** Reconnect this long before a token function's token expires, ms (default 30000; capped
   * at half the token's remaining life). */
  tokenRefreshMarginMs?: number;
}

/** A gap event of the broker's (`CUSTOM` `agui-fanout.gap`, PROTOCOL §5 "Reset"). */
export interface FanoutGap {
  reason: "overflow" | "trimmed" | string;
  /** The last id the connection had before the reset. */
  after: string;
  /** The id the bridge stands for. */
  until: string;
  /** `CUSTOM`/`RAW` events this client will never receive (`null`: unknown). */
  skipped: number | null;
  skippedTypes: Record<string, number> | null;
}

/** What [`FanoutSubscriber.onReset`] is told. */
export interface FanoutReset {
  /** `"prelude"`: the broker could not resume exactly (PROTOCOL §4.3) and restated the thread. */
  reason: "prelude";
  /** The id the agent held before (`undefined` when it had none). */
  previousEventId?: string;
  /** The broker's last `agui-fanout:` comment, for people (its text is not a contract). */
  comment?: string;
}

/** Broker-side happenings an app may want to show; all optional. */
export interface FanoutSubscriber {
  /**
   * The agent's messages and state are being replaced by a prelude: the follow's pipeline
   * restarts from nothing (messages `[]`, state `{}`) and the prelude's snapshots follow at
   * once (`onMessagesChanged`/`onStateChanged` fire with them).
   */
  onReset?(reset: FanoutReset): void;
  /** A live reset skipped events no snapshot restates (also seen by `onCustomEvent`). */
  onGap?(gap: FanoutGap): void;
  /** The follow's connection opened, closed or waits to retry. */
  onConnection?(state: ConnectionState): void;
}

/** The name of the broker's gap event. */
export const GAP_EVENT_NAME = "agui-fanout.gap";

/** A follow in progress (one `connectAgent()` call). */
class FollowSession {
  /** Set when a segment stopped at a prelude: the next segment starts with it. */
  restart = false;
  /** The broker's last `agui-fanout:` comment. */
  comment: string | undefined;
  /** The id of the last batch emitted into a pipeline. */
  emittedId: string | undefined;
  /** Settles when the `connectAgent()` call that owns this follow has returned. */
  done: Promise<unknown> = Promise.resolve();
  private waiters: { id: string; resolve: () => void }[] = [];

  constructor(readonly follower: ThreadFollower) {}

  /** Resolves once the follow handed out the batch `id` or a later one (or ended). */
  reached(id: string): Promise<void> {
    if (this.follower.closed || this.passed(id)) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ id, resolve }));
  }

  private passed(id: string): boolean {
    const last = this.emittedId;
    if (last === undefined) return false;
    const c = compareIds(last, id);
    // Another epoch (the log was recreated, PROTOCOL §4.3): the id will never come.
    return c === undefined ? !last.endsWith("-bridge") : c >= 0;
  }

  /** Called after the batch `id` was emitted into the pipeline. */
  delivered(id: string): void {
    this.emittedId = id;
    if (this.waiters.length === 0) return;
    const ready = this.waiters.filter((w) => this.passed(w.id));
    this.waiters = this.waiters.filter((w) => !ready.includes(w));
    // After the pipeline's own (async) apply of what was just emitted.
    if (ready.length > 0) setTimeout(() => ready.forEach((w) => w.resolve()), 0);
  }

  close(): void {
    this.follower.close();
    const all = this.waiters;
    this.waiters = [];
    all.forEach((w) => w.resolve());
  }
}

function isEmptyState(state: unknown): boolean {
  return (
    state === undefined ||
    state === null ||
    (typeof state === "object" && !Array.isArray(state) && Object.keys(state as object).length === 0)
  );
}

/**
 * An `HttpAgent` for an agui-fanout broker.
 *
 * - `runAgent()` POSTs the turn to the broker's gateway (`{url}/v1/agents/{agent}`) and applies
 *   the run's events as the log numbered them. While `connectAgent()` follows the thread, the
 *   run's events reach the agent through the follow instead (once), and `runAgent()` resolves
 *   when the follow has applied the run's last event.
 * - `connectAgent()` follows the thread until `abortRun()` or `detachActiveRun()`: the thread's
 *   messages and state (a prelude), then live events, across runs and reconnects. A prelude
 *   after a reconnect that could not resume exactly restarts the pipeline (messages and state
 *   replaced, `onReset`) instead of failing `verifyEvents`.
 * - `isRunning` is true while a run of the thread is active (as seen by the follow), or a
 *   `runAgent()` is in flight; not for the whole follow.
 */
export class FanoutAgent extends HttpAgent {
  /** The broker's base URL. */
  brokerUrl!: string;
  /** The gateway agent's name. */
  agentName!: string;
  /** The token source given to the constructor. */
  token?: TokenSource;
  private fanout!: {
    lastEventId?: string;
    boundaryId?: string;
    /** The thread the ids above belong to (a clone may be moved to another thread). */
    idsThread: string;
    runOpen: boolean;
    runId?: string;
    runCalls: number;
    pipelineRunning: boolean;
    follow?: FollowSession;
    followRunResult?: unknown;
    listeners: FanoutSubscriber[];
    retryMs: number;
    maxRetryMs: number;
    refreshMarginMs: number;
  };

  constructor(config: FanoutAgentConfig) {
    const base = config.url.replace(/\/+$/, "");
    super({ ...config, url: `${base}/v1/agents/${encodeURIComponent(config.agent)}` });
    this.setUp(base, config.agent, config.token, {
      lastEventId: config.lastEventId,
      retryMs: config.retryMs ?? 1000,
      maxRetryMs: config.maxRetryMs ?? 30_000,
      refreshMarginMs: config.tokenRefreshMarginMs ?? 30_000,
    });
  }

  private setUp(
    brokerUrl: string,
    agentName: string,
    token: TokenSource | undefined,
    o: { lastEventId?: string; retryMs: number; maxRetryMs: number; refreshMarginMs: number },
  ): void {
    this.brokerUrl = brokerUrl;
    this.agentName = agentName;
    this.token = token;
    this.fanout = {
      lastEventId: o.lastEventId,
      // An id given by the app is taken for a run boundary: a prelude answers it otherwise.
      boundaryId: o.lastEventId,
      idsThread: this.threadId,
      runOpen: false,
      runCalls: 0,
      pipelineRunning: false,
      listeners: [],
      retryMs: o.retryMs,
      maxRetryMs: o.maxRetryMs,
      refreshMarginMs: o.refreshMarginMs,
    };
    // `isRunning` is a plain field of AbstractAgent, assigned by every pipeline; an accessor on
    // the instance keeps those writes and answers what an app means by it (see the class doc).
    Object.defineProperty(this, "isRunning", {
      configurable: true,
      enumerable: true,
      get: () =>
        this.fanout.runCalls > 0 ||
        (this.fanout.follow ? this.fanout.runOpen : this.fanout.pipelineRunning),
      set: (v: boolean) => {
        this.fanout.pipelineRunning = v;
      },
    });
  }

  /** The id of the last event the agent applied from the broker (`undefined`: none yet). */
  get lastEventId(): string | undefined {
    return this.fanout.lastEventId;
  }

  /** Whether `connectAgent()` is following the thread. */
  get following(): boolean {
    return this.fanout.follow !== undefined;
  }

  /** Adds a [`FanoutSubscriber`]; returns its `unsubscribe`. */
  subscribeFanout(listener: FanoutSubscriber): { unsubscribe: () => void } {
    this.fanout.listeners.push(listener);
    return {
      unsubscribe: () => {
        this.fanout.listeners = this.fanout.listeners.filter((l) => l !== listener);
      },
    };
  }

  private tell(f: (l: FanoutSubscriber) => void): void {
    for (const l of [...this.fanout.listeners]) {
      try {
        f(l);
      } catch (e) {
        console.error("FanoutSubscriber error:", e);
      }
    }
  }

  /** Tracks the run lifecycle of what reaches the pipeline (for `isRunning` and resumes). */
  private noteEvent(event: BaseEvent): void {
    switch (event.type) {
      case "RUN_STARTED":
        this.fanout.runOpen = true;
        this.fanout.runId = (event as { runId?: string }).runId;
        break;
      case "RUN_FINISHED":
      case "RUN_ERROR":
        this.fanout.runOpen = false;
        break;
      case "CUSTOM": {
        const c = event as { name?: string; value?: unknown };
        if (c.name === GAP_EVENT_NAME) this.tell((l) => l.onGap?.(c.value as FanoutGap));
        break;
      }
      default:
        break;
    }
  }

  /** Records the id of a batch the pipeline got whole. */
  private noteId(id: string): void {
    this.fanout.lastEventId = id;
    this.fanout.idsThread = this.threadId;
    // A new pipeline can start exactly after an id only between runs: its verifier wants a
    // RUN_STARTED (or RUN_ERROR) first (AGUI.md §5).
    this.fanout.boundaryId = this.fanout.runOpen ? undefined : id;
  }

  private async authHeaders(): Promise<Record<string, string>> {
    const token = await resolveToken(this.token);
    return token === undefined ? {} : { Authorization: `Bearer ${token}` };
  }

  /** A request to the broker with the token; a 401 with a token function is retried once. */
  private async brokerFetch(url: string, init: RequestInit): Promise<Response> {
    const send = async () => {
      const headers = { ...(init.headers as Record<string, string>), ...(await this.authHeaders()) };
      return this.fetch(url, { ...init, headers });
    };
    const first = await send();
    if (first.status !== 401 || typeof this.token !== "function") return first;
    await first.body?.cancel().catch(() => {});
    return send();
  }

  /**
   * The turn through the gateway. Outside a follow: the run's events as the log numbered them
   * (their ids recorded, so a later `connectAgent()` resumes after them exactly). During a
   * follow: nothing (the follow applies the run's events), completing once the follow has
   * applied the run's last one.
   */
  override run(input: RunAgentInput): Observable<BaseEvent> {
    return new Observable<BaseEvent>((subscriber) => {
      const follow = this.fanout.follow;
      const signal = this.abortController.signal;
      let stopped = false;
      (async () => {
        const init = this.requestInit(enforceOutgoingInput(input));
        const response = await this.brokerFetch(this.url, { ...init, signal });
        if (!response.ok) throw await httpError(response);
        if (!response.body) throw new AGUIError("the gateway's answer has no body");
        let lastId: string | undefined;
        this.fanout.followRunResult = undefined;
        for await (const item of readSse(response.body)) {
          if (stopped) return;
          if (item.kind !== "frame") continue;
          const event = JSON.parse(item.frame.data) as BaseEvent;
          if (item.frame.id !== undefined) lastId = item.frame.id;
          if (follow) {
            // Decided once: a run's events go to one pipeline only. Should the follow end
            // meanwhile, the rest of the answer is read and dropped (the log has it).
            if (event.type === "RUN_FINISHED") {
              this.fanout.followRunResult = (event as { result?: unknown }).result;
            }
            continue;
          }
          this.noteEvent(event);
          subscriber.next(event);
          if (item.frame.id !== undefined) this.noteId(item.frame.id);
        }
        if (follow && lastId !== undefined) await follow.reached(lastId);
        subscriber.complete();
      })().catch((error: unknown) => {
        if (isAbort(error) || signal.aborted) {
          // As HttpAgent does: an aborted request ends the local run with RUN_ERROR "abort".
          // The run itself goes on in the log; the local view is no longer at a run boundary.
          this.fanout.boundaryId = undefined;
          subscriber.next({ type: "RUN_ERROR", message: "Request aborted", code: "abort" } as BaseEvent);
          subscriber.complete();
          return;
        }
        subscriber.error(error);
      });
      return () => {
        stopped = true;
      };
    });
  }

  /**
   * Runs a turn through the gateway (see `run`), with HttpAgent's lifecycle. During a follow it
   * resolves once the follow applied the run's last event, with `newMessages` from the follow
   * and `result` from the run's `RUN_FINISHED`.
   * @throws AGUIError with `status`/`payload` for a refused request (e.g. 409 `run_active`).
   */
  override async runAgent(
    parameters?: RunAgentParameters & { abortController?: AbortController },
    subscriber?: AgentSubscriber,
  ): Promise<RunAgentResult> {
    this.fanout.runCalls++;
    try {
      const following = this.fanout.follow !== undefined;
      const result = await super.runAgent(parameters, subscriber);
      if (following && result.result === undefined) result.result = this.fanout.followRunResult;
      return result;
    } finally {
      this.fanout.runCalls--;
    }
  }

  /**
   * Follows the thread until `abortRun()` or `detachActiveRun()` (then resolves; a second call
   * ends the first follow and takes over), through the
   * pipeline of `AbstractAgent.connectAgent`, once per segment: a prelude that arrives after
   * events were applied ends the segment, and the next one starts from empty messages and state
   * with that prelude. Rejects on an error no reconnect can fix (a 4xx from the broker, an
   * event the verifier refuses).
   */
  override async connectAgent(
    parameters?: RunAgentParameters,
    subscriber?: AgentSubscriber,
  ): Promise<RunAgentResult> {
    const follower = new ThreadFollower(
      {
        url: this.brokerUrl,
        threadId: this.threadId,
        headers: () => this.headers,
        token: this.token,
        fetch: (url, init) => this.fetch(url, init),
        retryMs: this.fanout.retryMs,
        maxRetryMs: this.fanout.maxRetryMs,
        refreshMarginMs: this.fanout.refreshMarginMs,
        onConnection: (state) => this.tell((l) => l.onConnection?.(state)),
        onComment: (text) => {
          if (text.startsWith("agui-fanout:")) session.comment = text;
        },
      },
      // Exactly after the last id only at a run boundary of this thread; else a prelude.
      this.fanout.idsThread === this.threadId ? this.fanout.boundaryId : undefined,
    );
    const session = new FollowSession(follower);
    const previous = this.fanout.follow;
    this.fanout.follow = session;
    let finished: () => void = () => {};
    session.done = new Promise<void>((resolve) => (finished = resolve));
    if (previous) {
      // The latest call wins (a component mounted twice): the earlier follow ends before this
      // one's pipeline starts (it restarts no segment once closed).
      previous.close();
      await previous.done;
    }
    const before = new Set(this.messages.map((m) => m.id));
    let result: unknown;
    try {
      for (;;) {
        const r = await super.connectAgent(parameters, subscriber);
        if (r.result !== undefined) result = r.result;
        if (!session.restart || follower.closed) break;
        session.restart = false;
        const previousEventId = this.fanout.lastEventId;
        // The prelude restates everything: start the next pipeline from nothing, so that no
        // message or state of the lost view survives (reasoning and activity messages included,
        // which a MESSAGES_SNAPSHOT keeps, AGUI.md §6).
        this.messages = [];
        this.state = {};
        this.pendingInterrupts = [];
        this.tell((l) => l.onReset?.({ reason: "prelude", previousEventId, comment: session.comment }));
      }
    } finally {
      session.close();
      if (this.fanout.follow === session) this.fanout.follow = undefined;
      finished();
    }
    const newMessages = structuredClone(this.messages).filter((m) => !before.has(m.id));
    return { result, newMessages };
  }

  /** One segment of a follow: batches from the follower until a prelude needs a new pipeline. */
  protected override connect(_input: RunAgentInput): Observable<BaseEvent> {
    const session = this.fanout.follow;
    if (!session) return new Observable((s) => s.complete());
    // A prelude may open the segment only on an agent that holds nothing.
    const fresh = this.messages.length === 0 && isEmptyState(this.state);
    return new Observable<BaseEvent>((subscriber) => {
      let stopped = false;
      (async () => {
        let emitted = false;
        for (;;) {
          const batch: Batch | undefined = await session.follower.next();
          if (!batch) break;
          if (stopped) {
            session.follower.unshift(batch);
            break;
          }
          const at = batch.events.findIndex(isPreludeStart);
          if (at >= 0 && (emitted || at > 0 || !fresh)) {
            for (const event of batch.events.slice(0, at)) {
              this.noteEvent(event);
              subscriber.next(event);
            }
            session.follower.unshift({ events: batch.events.slice(at), id: batch.id });
            session.restart = true;
            break;
          }
          for (const event of batch.events) {
            this.noteEvent(event);
            subscriber.next(event);
          }
          this.noteId(batch.id);
          emitted = true;
          session.delivered(batch.id);
        }
        subscriber.complete();
      })().catch((error: unknown) => subscriber.error(error));
      return () => {
        stopped = true;
      };
    });
  }

  /** Aborts the gateway request of a `runAgent()` and ends the follow. */
  override abortRun(): void {
    this.fanout.follow?.close();
    super.abortRun();
  }

  /** Ends the follow (and detaches the pipeline of a run in flight, as AbstractAgent does). */
  override async detachActiveRun(): Promise<void> {
    this.fanout.follow?.close();
    await super.detachActiveRun();
  }

  /**
   * Cancels the thread's active run through the broker
   * (`POST {url}/v1/threads/{threadId}/runs/{runId}/cancel`, PROTOCOL §11): it ends with
   * `RUN_ERROR` `cancelled`, which every follower receives. `runId` defaults to the run this
   * agent saw start last.
   * @throws AGUIError with the broker's status and error body (e.g. 409 `run_not_active`).
   */
  async cancelRun(runId: string | undefined = this.fanout.runId): Promise<{ lastId: string }> {
    if (runId === undefined) throw new AGUIError("FanoutAgent.cancelRun: no run id known");
    const url = `${this.brokerUrl}/v1/threads/${encodeURIComponent(this.threadId)}/runs/${encodeURIComponent(runId)}/cancel`;
    const response = await this.brokerFetch(url, { method: "POST", headers: { ...this.headers } });
    if (!response.ok) throw await httpError(response);
    return (await response.json()) as { lastId: string };
  }

  /** The thread's fold as the broker holds it (`GET {url}/v1/threads/{threadId}/snapshot`). */
  async snapshot(): Promise<{ lastEventId: string | null; state: unknown; messages: unknown[]; run: unknown }> {
    const url = `${this.brokerUrl}/v1/threads/${encodeURIComponent(this.threadId)}/snapshot`;
    const response = await this.brokerFetch(url, { method: "GET", headers: { ...this.headers } });
    if (!response.ok) throw await httpError(response);
    return (await response.json()) as {
      lastEventId: string | null;
      state: unknown;
      messages: unknown[];
      run: unknown;
    };
  }

  /** A copy for another use of the same broker and agent (CopilotKit clones per thread):
   * messages, state and the resume point are copied; a follow is not. */
  override clone(): FanoutAgent {
    const cloned = super.clone() as FanoutAgent;
    cloned.setUp(this.brokerUrl, this.agentName, this.token, {
      lastEventId: this.fanout.lastEventId,
      retryMs: this.fanout.retryMs,
      maxRetryMs: this.fanout.maxRetryMs,
      refreshMarginMs: this.fanout.refreshMarginMs,
    });
    cloned.fanout.boundaryId = this.fanout.boundaryId;
    cloned.fanout.idsThread = this.fanout.idsThread;
    cloned.fanout.runOpen = this.fanout.runOpen;
    cloned.fanout.runId = this.fanout.runId;
    return cloned;
  }
}

function isAbort(error: unknown): boolean {
  return (error as { name?: string })?.name === "AbortError";
}

/** An error shaped like HttpAgent's for a non-2xx answer: `status` and `payload` attached. */
async function httpError(response: Response): Promise<Error> {
  const text = await response.text().catch(() => "");
  let payload: unknown = text;
  try {
    payload = JSON.parse(text);
  } catch {
    // Not JSON: keep the text.
  }
  const err = new AGUIError(
    `HTTP ${response.status}: ${typeof payload === "string" ? payload : JSON.stringify(payload)}`,
  ) as AGUIError & { status?: number; payload?: unknown };
  err.status = response.status;
  err.payload = payload;
  return err;
}


