// The `text/event-stream` reader (WHATWG HTML §9.2.6 "Interpreting an event stream") over a
// fetch body: bytes in, frames out. Kept to the parts the broker's wire uses (PROTOCOL §3): the
// `data`, `id` and `retry` fields and comments; `event:` is read and ignored (the broker never
// sends it, and AG-UI has one kind of message).

/** One dispatched SSE event. */
export interface SseFrame {
  /** The frame's `data` lines joined with `\n` (one AG-UI event as JSON, on this wire). */
  data: string;
  /**
   * The frame's own `id:` field, when it had one (`undefined` otherwise). Unlike an
   * `EventSource`, which carries the last id forward to every later event, this tells which
   * frames the broker numbered: inside a prelude or a bridge only the last event carries an id
   * (PROTOCOL §3, §5).
   */
  id?: string;
}

/** What the parser found in a chunk of the stream, in order. */
export type SseItem =
  | { kind: "frame"; frame: SseFrame }
  | { kind: "retry"; ms: number }
  | { kind: "comment"; text: string };

/**
 * Incremental parser: feed it decoded text with [`push`], in any split; it returns what became
 * complete. Lines end with LF, CRLF or CR (the standard's three), a blank line dispatches.
 */
export class SseParser {
  private buffer = "";
  private data: string[] = [];
  private id: string | undefined;
  private sawCr = false;

  /** Feeds `text` and returns the items it completed. */
  push(text: string): SseItem[] {
    const out: SseItem[] = [];
    let input = text;
    // A CR at the end of the previous chunk may be the first half of a CRLF.
    if (this.sawCr && input.startsWith("\n")) input = input.slice(1);
    this.sawCr = false;
    this.buffer += input;
    let start = 0;
    for (let i = 0; i < this.buffer.length; i++) {
      const c = this.buffer.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this.line(this.buffer.slice(start, i), out);
      if (c === 13) {
        if (i + 1 < this.buffer.length) {
          if (this.buffer.charCodeAt(i + 1) === 10) i++;
        } else {
          this.sawCr = true;
        }
      }
      start = i + 1;
    }
    this.buffer = this.buffer.slice(start);
    return out;
  }

  private line(line: string, out: SseItem[]): void {
    if (line === "") {
      if (this.data.length > 0) {
        const frame: SseFrame = { data: this.data.join("\n") };
        if (this.id !== undefined) frame.id = this.id;
        out.push({ kind: "frame", frame });
      }
      this.data = [];
      this.id = undefined;
      return;
    }
    if (line.startsWith(":")) {
      out.push({ kind: "comment", text: line.slice(1).trimStart() });
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.data.push(value);
        break;
      case "id":
        // The standard ignores an id containing NUL.
        if (!value.includes("\0")) this.id = value;
        break;
      case "retry":
        if (/^[0-9]+$/.test(value)) out.push({ kind: "retry", ms: Number(value) });
        break;
      default:
        // `event` and unknown fields: nothing on this wire depends on them.
        break;
    }
  }
}

/**
 * Reads a fetch response body as SSE items, decoding UTF-8 across chunk boundaries.
 * Ends when the body ends; a frame not terminated by a blank line is dropped, as the standard
 * says (the broker re-sends it after a resume with the last id that was complete).
 */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseItem> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  const parser = new SseParser();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      for (const item of parser.push(decoder.decode(value, { stream: true }))) yield item;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
