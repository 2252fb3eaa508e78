// The console's customer view: the thread as an app's user sees it, folded by the client
// package (clients/js, bundled as fanout-client.js): FanoutAgent.connectAgent() follows the
// thread through @ag-ui/client's own pipeline (verify, apply) across reconnects, and replaces
// messages and state when the broker answers with a prelude (onReset).

import { FanoutAgent } from "./fanout-client.js";

export class CustomerView {
  /**
   * @param {{messages: HTMLElement, state: HTMLElement, notices: HTMLElement, status: HTMLElement}} els
   * @param {{threadId: string, token: () => string | undefined}} opts
   */
  constructor(els, opts) {
    this.els = els;
    this.opts = opts;
    this.agent = new FanoutAgent({
      url: location.origin,
      // Only runAgent() uses it; the console starts turns itself (console.js).
      agent: "console",
      threadId: opts.threadId,
      token: () => opts.token(),
      retryMs: 500,
      maxRetryMs: 5000,
    });
    this.resets = 0;
    this.gaps = 0;
  }

  start() {
    this.agent.subscribe({
      onMessagesChanged: ({ messages }) => this.renderMessages(messages),
      onStateChanged: ({ state }) => this.renderState(state),
    });
    this.agent.subscribeFanout({
      onReset: (r) => {
        this.resets += 1;
        this.notice(
          `reset: the broker could not resume exactly and restated the thread (prelude)` +
            (r.comment ? `: ${r.comment}` : ""),
        );
      },
      onGap: (g) => {
        this.gaps += 1;
        this.notice(`gap: a reset skipped ${g.skipped ?? "an unknown number of"} CUSTOM/RAW events`);
      },
      onConnection: (c) => this.connection(c),
    });
    this.renderMessages([]);
    this.renderState({});
    this.agent.connectAgent().catch((e) => {
      this.setStatus("stopped", "bad");
      this.notice(`the follow stopped: ${e?.message ?? e}`);
    });
  }

  stop() {
    this.agent.detachActiveRun().catch(() => {});
  }

  /** The state the customer sees (a new turn's input carries it, as an app's would). */
  get state() {
    return this.agent.state ?? {};
  }

  get messages() {
    return this.agent.messages;
  }

  connection(c) {
    if (c.state === "open") this.setStatus("live", "ok");
    else if (c.state === "waiting") this.setStatus(`retry in ${Math.round(c.delayMs)} ms`, "warn");
    else this.setStatus(c.reason === "refresh" ? "refreshing token" : "disconnected", "warn");
  }

  renderMessages(messages) {
    const box = this.els.messages;
    box.replaceChildren();
    for (const m of messages) {
      const el = document.createElement("div");
      el.className = `msg ${m.role}`;
      el.dataset.id = m.id;
      el.dataset.role = m.role;
      const role = document.createElement("span");
      role.className = "role";
      role.textContent = m.role;
      el.append(role);
      if (m.role === "tool" && m.toolCallId) {
        const call = document.createElement("span");
        call.className = "call";
        call.textContent = `result of ${m.toolCallId}`;
        el.append(call);
      }
      const content = typeof m.content === "string" ? m.content : m.content ? JSON.stringify(m.content) : "";
      if (content) el.append(document.createTextNode(content));
      for (const call of m.toolCalls ?? []) {
        const c = document.createElement("span");
        c.className = "call";
        c.textContent = `→ ${call.function?.name}(${call.function?.arguments ?? ""})`;
        el.append(c);
      }
      box.append(el);
    }
    box.scrollTop = box.scrollHeight;
    box.dataset.count = String(messages.length);
  }

  renderState(state) {
    this.els.state.textContent = JSON.stringify(state ?? {}, null, 2);
  }

  notice(text) {
    const el = document.createElement("div");
    el.className = "notice";
    el.textContent = text;
    this.els.notices.append(el);
    while (this.els.notices.childElementCount > 5) this.els.notices.firstElementChild.remove();
  }

  setStatus(text, cls) {
    this.els.status.textContent = text;
    this.els.status.className = `pill ${cls}`;
  }
}
