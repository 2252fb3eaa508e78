// Unit tests of the checker (node --test loadtest/faults/checker.test.mjs): each count on a
// small hand-made stream, so a checker that stops counting something fails here, not silently
// in the fault table.

import assert from "node:assert/strict";
import test from "node:test";
import { checkSubscriber, sameJson, sumChecks } from "./lib/checker.mjs";
import { classify } from "./lib/subscriber.mjs";

const P = "p1";
const ev = (seq) => ({ seq, producer: P, signal: null });
const prelude = () => ({ seq: null, producer: null, signal: "prelude" });
const other = () => ({ seq: null, producer: null, signal: null });
const acks = (...seqs) => new Map([[P, new Map(seqs.map((s) => [s, { id: `x-${s}` }]))]]);
const log = (...seqs) => new Map([[P, new Set(seqs)]]);

function check(items, acked, inLog = null) {
  return checkSubscriber({ items, producers: [P], acked, inLog });
}

test("every acknowledged event received once, in order: all counts zero", () => {
  const r = check([ev(1), other(), ev(2), ev(3)], acks(1, 2, 3), log(1, 2, 3));
  for (const key of ["lostSilently", "lostSignalled", "lostInLog", "duplicated", "reordered", "neverAcked", "rolledBack"]) {
    assert.equal(r[key], 0, key);
  }
});

test("a gap with no signal is lost silently, and counted as in the log when the log holds it", () => {
  const r = check([ev(1), ev(4)], acks(1, 2, 3, 4), log(1, 2, 3, 4));
  assert.equal(r.lostSilently, 2);
  assert.equal(r.lostSignalled, 0);
  assert.equal(r.lostInLog, 2);
  assert.deepEqual(r.samples.lostSilently, [2, 3]);
});

test("a prelude between the events around a gap makes it lost with a signal", () => {
  const r = check([ev(1), prelude(), other(), ev(4)], acks(1, 2, 3, 4), log(1, 4));
  assert.equal(r.lostSilently, 0);
  assert.equal(r.lostSignalled, 2);
  assert.equal(r.lostInLog, 0, "Redis lost 2 and 3: not the broker's doing");
});

test("an event skipped though the log holds it is described with the ids around it", () => {
  const items = [
    { ...ev(1), id: "7-1-0" },
    { ...prelude(), id: "" },
    { ...other(), id: "7-9-0" },
    { ...ev(4), id: "7-10-0" },
  ];
  const r = check(items, acks(1, 2, 3, 4), log(1, 3, 4));
  assert.equal(r.lostInLog, 1);
  assert.deepEqual(r.contexts, [
    "seq 3 (in the log): received before it 7-1-0, then prelude at 7-9-0, next received 7-10-0",
  ]);
  assert.deepEqual(sumChecks([r, r]).contexts.length, 2);
});

test("a signal outside the gap's window does not cover it", () => {
  const r = check([prelude(), ev(1), ev(3), ev(4)], acks(1, 2, 3, 4));
  assert.equal(r.lostSilently, 1);
  assert.equal(r.lostSignalled, 0);
});

test("a lost tail is covered by a signal after the last event received", () => {
  assert.equal(check([ev(1), prelude()], acks(1, 2)).lostSignalled, 1);
  assert.equal(check([ev(1)], acks(1, 2)).lostSilently, 1);
});

test("bridge marks and broker gap events are signals, other events are not", () => {
  const bridge = classify("abc-0-5-bridge", '{"type":"MESSAGES_SNAPSHOT","messages":[]}');
  const gap = classify("abc-0-9", '{"type":"CUSTOM","name":"agui-fanout.gap","value":{}}');
  const plain = classify("abc-0-9", '{"type":"STATE_SNAPSHOT","snapshot":{}}');
  assert.equal(bridge.signal, "bridge");
  assert.equal(gap.signal, "gap");
  assert.equal(plain.signal, null);
  assert.equal(check([ev(1), bridge, ev(3)], acks(1, 2, 3)).lostSignalled, 1);
  assert.equal(check([ev(1), plain, ev(3)], acks(1, 2, 3)).lostSilently, 1);
});

test("classify reads prelude starts and counted events", () => {
  const start = classify("", '{"type":"RUN_STARTED","threadId":"t","runId":"r","metadata":{"agui-fanout":{"prelude":true}}}');
  assert.equal(start.signal, "prelude");
  const counted = classify("e-0-3", '{"type":"CUSTOM","name":"fault-seq","value":{"producer":"p1","seq":7,"pad":""}}');
  assert.equal(counted.seq, 7);
  assert.equal(counted.producer, "p1");
  assert.equal(classify("", "not json").seq, null);
});

test("duplicates, reorders and deliveries nobody acknowledged are counted", () => {
  const r = check([ev(1), ev(3), ev(2), ev(3), ev(9)], acks(1, 2, 3), log(1, 2, 3, 9));
  assert.equal(r.duplicated, 1);
  assert.equal(r.reordered, 1);
  assert.equal(r.neverAcked, 1);
  assert.equal(r.lostSilently, 0);
});

test("events received that the final log does not hold are rolled back", () => {
  const r = check([ev(1), ev(2), ev(3)], acks(1, 2, 3), log(1));
  assert.equal(r.rolledBack, 2);
  assert.equal(r.lostSilently, 0);
});

test("another producer's events are not this subscriber's business", () => {
  const items = [ev(1), { seq: 5, producer: "p2", signal: null }];
  const r = checkSubscriber({ items, producers: [P], acked: acks(1), inLog: null });
  assert.equal(r.neverAcked, 0);
});

test("sums add counts and keep a few samples", () => {
  const a = check([ev(1)], acks(1, 2));
  const b = check([ev(2)], acks(1, 2));
  const s = sumChecks([a, b]);
  assert.equal(s.lostSilently, 2);
  assert.deepEqual(s.samples.lostSilently.sort(), [1, 2]);
});

test("sameJson ignores key order, not values or array order", () => {
  assert.ok(sameJson({ a: 1, b: [1, 2] }, { b: [1, 2], a: 1 }));
  assert.ok(!sameJson({ a: [1, 2] }, { a: [2, 1] }));
  assert.ok(!sameJson({ a: 1 }, { a: 1, b: null }));
});
