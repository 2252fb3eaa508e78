// Hostile input next to a healthy thread (memory backend): 20 endless bodies (chunked POSTs
// that send several MiB and never finish), slow bodies (a byte every 500 ms), slowloris
// connections (a header line every 2 s, never an end of head) and fuzzed requests, while a
// producer publishes and a subscriber follows another thread. The healthy subscriber must get
// everything; every error answer must be the JSON error shape; no subscribe may be refused for
// its id; memory must stay within the formula (issue 13 items 5 and 8: endless bodies were
// held without bound, hyper's own errors had empty bodies, a 64 KiB ?lastEventId got 414).

import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { FUZZ_SETUP, fuzzCases, judgeAnswer } from "../lib/fuzz.mjs";
import { mib } from "../lib/memory.mjs";
import { rawExchange } from "../lib/net.mjs";
import { Producer } from "../lib/producer.mjs";
import { finish, opened, samplePeaks, subscribe } from "../lib/scenario.mjs";
import { node, until } from "./common.mjs";

/** A raw connection to `addr` that records whether the server answered or closed it. */
function connection(addr) {
  const [host, port] = addr.split(":");
  const socket = net.connect({ host, port: Number(port) });
  const c = { socket, answered: null, closed: false, written: 0 };
  socket.on("data", (d) => {
    c.answered ??= d.toString("latin1").split("\r\n")[0];
  });
  socket.on("error", () => {});
  socket.on("close", () => {
    c.closed = true;
  });
  return c;
}

/** Writes `chunk`, waiting (at most `ms`) for the socket to drain; false when it did not. */
async function write(c, chunk, ms = 5000) {
  if (c.closed) return false;
  c.written += chunk.length;
  if (c.socket.write(chunk)) return true;
  const drained = await Promise.race([
    new Promise((resolve) => c.socket.once("drain", () => resolve(true))),
    sleep(ms).then(() => false),
  ]);
  return drained && !c.closed;
}

/** A chunked JSON body of `mebibytes` MiB that never ends (no last chunk). */
async function endlessBody(addr, i, mebibytes) {
  const c = connection(addr);
  await new Promise((resolve) => c.socket.once("connect", resolve).once("error", resolve));
  const head =
    `POST /v1/threads/endless-${i}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n` +
    "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  if (!(await write(c, Buffer.from(head)))) return c;
  const event = `{"type":"CUSTOM","name":"endless","value":"${"e".repeat(1000)}"},`;
  const payload = "[" + event.repeat(Math.floor(65536 / event.length));
  const chunk = Buffer.from(`${Buffer.byteLength(payload).toString(16)}\r\n${payload}\r\n`);
  while (c.written < mebibytes * 1048576) {
    // The broker stopped reading (a bound): stop pushing, keep the connection open.
    if (!(await write(c, chunk))) break;
  }
  return c;
}

export default {
  name: "hostile-input",
  fault: "20 endless bodies, slow bodies, slowloris and fuzzed requests next to a healthy thread (memory backend)",
  async run(ctx) {
    const { endless, endlessMiB, slow, slowloris, fuzz, seconds } = ctx.params;
    const broker = await node(ctx, "node-a").start();
    ctx.defer(samplePeaks([broker]));
    const thread = "calm";
    const producer = await new Producer({ name: "p-calm", base: () => broker.base, thread }).start({ intervalMs: 20 });
    await until(() => producer.acked.size > 0);
    const subs = subscribe(2, broker.base, thread, "healthy");
    ctx.defer(() => subs.forEach((s) => s.close()));
    await opened(subs);
    const t0 = Date.now();
    const held = [];
    ctx.defer(() => held.forEach((c) => c.socket.destroy()));

    // Slowloris: a header line every 2 s, never the end of the head.
    const loris = Array.from({ length: slowloris }, () => connection(broker.addr));
    held.push(...loris);
    const lorisTimer = setInterval(() => {
      for (const [i, c] of loris.entries()) {
        if (c.closed) continue;
        const line = c.written === 0 ? "GET /v1/threads/calm/events HTTP/1.1\r\nHost: 127.0.0.1\r\n" : `X-Loris-${i}-${c.written}: 1\r\n`;
        write(c, Buffer.from(line), 100);
      }
    }, 2000);
    ctx.defer(() => clearInterval(lorisTimer));

    // Slow bodies: a complete head, then the body a byte every 500 ms.
    const slowBody = JSON.stringify({ type: "CUSTOM", name: "slow", value: "s".repeat(150) });
    const slows = Array.from({ length: slow }, () => connection(broker.addr));
    held.push(...slows);
    slows.forEach((c, i) =>
      write(c, Buffer.from(`POST /v1/threads/slow-${i}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${slowBody.length}\r\n\r\n`)),
    );
    let slowAt = 0;
    const slowTimer = setInterval(() => {
      for (const c of slows) if (slowAt < slowBody.length) write(c, Buffer.from(slowBody[slowAt]), 100);
      slowAt += 1;
    }, 500);
    ctx.defer(() => clearInterval(slowTimer));

    // Endless bodies, all at once.
    ctx.log(`${endless} endless bodies of ${endlessMiB} MiB, ${slow} slow bodies, ${slowloris} slowloris`);
    const bodies = await Promise.all(Array.from({ length: endless }, (_, i) => endlessBody(broker.addr, i, endlessMiB)));
    held.push(...bodies);
    const accepted = bodies.reduce((n, c) => n + c.written, 0);
    ctx.log(`endless bodies sent ${mib(accepted)}; RSS ${mib(broker.status().VmRSS ?? 0)}`);

    // Fuzzed requests, 8 at a time, after the fuzzed thread's run is opened.
    const setup = await fetch(`${broker.base}/v1/threads/fz/events`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(FUZZ_SETUP),
    });
    if (!setup.ok) throw new Error(`fuzz set-up answered ${setup.status}: ${await setup.text()}`);
    const cases = fuzzCases(fuzz);
    const answers = new Array(cases.length);
    let next = 0;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        while (next < cases.length) {
          const i = next++;
          answers[i] = await rawExchange(broker.addr, cases[i].bytes, 5000);
        }
      }),
    );
    const judged = cases.map((c, i) => ({ kind: c.kind, status: answers[i].status, ...judgeAnswer(c, answers[i]), answer: answers[i] }));
    fs.writeFileSync(
      path.join(ctx.out, "fuzz.json"),
      JSON.stringify(judged.map(({ answer, ...j }) => ({ ...j, body: answer.body?.slice(0, 200), error: answer.error, timedOut: answer.timedOut }))),
    );
    ctx.log(`${cases.length} fuzzed requests answered`);
    await sleep(Math.max(0, seconds * 1000 - (Date.now() - t0)));
    await producer.stop();

    const summary = (flag) => {
      const by = {};
      for (const j of judged.filter((x) => x[flag])) {
        const key = `${j.kind} → ${j.status ?? "none"}`;
        by[key] = (by[key] ?? 0) + 1;
      }
      return Object.entries(by).map(([k, n]) => `${n}× ${k}`).join("; ");
    };
    const notJson = judged.filter((j) => j.errorNotJson).length;
    const acceptedInvalid = judged.filter((j) => j.acceptedInvalid).length;
    const serverErrors = judged.filter((j) => j.serverError).length;
    const fatal = judged.filter((j) => j.fatal).map((j) => ({ status: j.status, contentType: j.answer.headers["content-type"] ?? "" }));
    let alive = false;
    try {
      alive = (await fetch(`${broker.base}/healthz`, { signal: AbortSignal.timeout(5000) })).ok;
    } catch {
      alive = false;
    }
    const notes = [
      `fuzz: ${cases.length} requests, ${judged.filter((j) => j.status !== null).length} answered, ${judged.filter((j) => j.noAnswer).length} closed without an answer`,
      `endless bodies: ${mib(accepted)} accepted by the socket in all; still open at the end: ${bodies.filter((c) => !c.closed).length} of ${endless}; answered: ${bodies.filter((c) => c.answered).length}`,
      `slow bodies still open: ${slows.filter((c) => !c.closed).length} of ${slow}; slowloris still open: ${loris.filter((c) => !c.closed).length} of ${slowloris}`,
    ];
    if (notJson > 0) notes.push(`error answers without the JSON shape: ${summary("errorNotJson")}`);
    if (serverErrors > 0) notes.push(`server errors: ${summary("serverError")}`);
    if (fatal.length > 0) notes.push(`refused subscribes: ${summary("fatal")}`);
    if (acceptedInvalid > 0) notes.push(`invalid publishes answered 2xx: ${summary("acceptedInvalid")}`);
    return finish({
      ctx,
      base: broker.base,
      brokers: [broker],
      producers: [producer],
      subscribers: subs,
      extraFatal: fatal,
      memory: { subscribers: subs.length, others: endless + slow + slowloris + 8 + 1 },
      notes,
      extra: [
        { name: "error answers not in the JSON error shape", value: notJson, ok: notJson === 0 },
        { name: "server errors (5xx but 503)", value: serverErrors, ok: serverErrors === 0 },
        { name: "invalid publishes answered 2xx", value: acceptedInvalid, ok: acceptedInvalid === 0 },
        { name: "broker alive at the end", value: alive ? "yes" : "no", ok: alive },
      ],
    });
  },
};
