// Loopback plumbing: a TCP balancer in front of broker nodes (what a Kubernetes Service or a
// load balancer does for browsers and producers) or in front of Redis (what a Sentinel-aware
// proxy or a DNS switch does for the brokers), and a raw HTTP/1.1 exchange for requests no
// HTTP client library would send (fuzz, slowloris).

import net from "node:net";

/**
 * A TCP balancer on 127.0.0.1: each accepted connection is forwarded to the next backend in
 * rotation that accepts a connection (a refused one is skipped, as a balancer's health check
 * would once it noticed). Backends are `"host:port"` strings and can be swapped at run time.
 */
export class Balancer {
  constructor(backends) {
    this.backends = [...backends];
    this.next = 0;
    this.pairs = new Set();
    this.server = net.createServer((client) => this.accept(client));
    this.refused = 0;
  }

  /** Listens on a free loopback port; resolves to `this` (`port`, `addr`, `base` set). */
  async listen() {
    await new Promise((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.port = this.server.address().port;
    this.addr = `127.0.0.1:${this.port}`;
    this.base = `http://${this.addr}`;
    return this;
  }

  /** Replaces the backends; with `cut`, also closes every forwarded connection. */
  setBackends(backends, { cut = false } = {}) {
    this.backends = [...backends];
    if (cut) this.cutAll();
  }

  /**
   * Stops forwarding on every open connection, both ways, leaving them open: what was in
   * flight stays in this process's buffers (a partitioned link). `cutAll` later drops it.
   */
  freeze() {
    for (const { client, upstream } of this.pairs) {
      if (!upstream) continue;
      upstream.unpipe(client);
      client.unpipe(upstream);
      upstream.pause();
      client.pause();
    }
  }

  /** Closes every forwarded connection (both sides). */
  cutAll() {
    for (const { client, upstream } of this.pairs) {
      client.destroy();
      upstream?.destroy();
    }
    this.pairs.clear();
  }

  accept(client) {
    client.pause();
    client.on("error", () => {});
    const pair = { client, upstream: null };
    this.pairs.add(pair);
    client.on("close", () => {
      pair.upstream?.destroy();
      this.pairs.delete(pair);
    });
    const tries = this.backends.length;
    const attempt = (left) => {
      if (left === 0 || client.destroyed) {
        this.refused += 1;
        client.destroy();
        return;
      }
      const backend = this.backends[this.next++ % this.backends.length];
      const [host, port] = backend.split(":");
      const upstream = net.connect({ host, port: Number(port) });
      upstream.once("error", () => {
        upstream.destroy();
        if (pair.upstream === upstream) client.destroy();
        else attempt(left - 1);
      });
      upstream.once("connect", () => {
        pair.upstream = upstream;
        if (client.destroyed) {
          upstream.destroy();
          return;
        }
        upstream.on("close", () => client.destroy());
        client.pipe(upstream);
        upstream.pipe(client);
        client.resume();
      });
    };
    attempt(tries);
  }

  /** Stops accepting and closes every forwarded connection. */
  async close() {
    this.cutAll();
    await new Promise((resolve) => this.server.close(resolve));
  }
}

/**
 * Sends `bytes` (a Buffer or string, written as is) on a fresh connection to `addr` and reads
 * the answer until the server closes or `ms` passes. Returns `{status, headers, body, raw,
 * timedOut, error}`; `status` is `null` when no status line came back.
 */
export function rawExchange(addr, bytes, ms = 5000) {
  const [host, port] = addr.split(":");
  return new Promise((resolve) => {
    const socket = net.connect({ host, port: Number(port) });
    const chunks = [];
    let done = false;
    const finish = (extra) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ ...parseAnswer(Buffer.concat(chunks)), ...extra });
    };
    const timer = setTimeout(() => finish({ timedOut: true }), ms);
    socket.on("connect", () => socket.write(bytes));
    socket.on("data", (chunk) => {
      chunks.push(chunk);
      const answer = parseAnswer(Buffer.concat(chunks));
      // A complete answer with a length, or an event stream's head (it would never end): done.
      if (answer.complete || /text\/event-stream/i.test(answer.headers["content-type"] ?? "")) {
        finish({});
      }
    });
    socket.on("error", (error) => finish({ error: error.code ?? error.message }));
    socket.on("close", () => finish({}));
  });
}

/** Splits a raw HTTP/1.1 answer into status, headers (lower-case names) and body. */
export function parseAnswer(buffer) {
  const text = buffer.toString("latin1");
  const end = text.indexOf("\r\n\r\n");
  if (!text.startsWith("HTTP/1.")) return { status: null, headers: {}, body: "", raw: text };
  const head = end >= 0 ? text.slice(0, end) : text;
  const [statusLine, ...lines] = head.split("\r\n");
  const status = Number(statusLine.split(" ")[1]);
  const headers = {};
  for (const line of lines) {
    const colon = line.indexOf(":");
    if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  const body = end >= 0 ? buffer.subarray(end + 4).toString("utf8") : "";
  const length = headers["content-length"];
  const complete = end >= 0 && length !== undefined && Buffer.byteLength(body) >= Number(length);
  return { status, headers, body, raw: text.slice(0, 2000), complete };
}
