//! Property tests of the whole delivery path, in process (no sockets): a [`MemoryLog`],
//! [`Ingest`] (order validation, checkpoint candidates), [`Hub::start`] and subscriptions
//! drained by hand at random moments, against SPEC §4.5 and §5.
//!
//! Each case generates a valid AG-UI thread (several runs; interleaved text messages, tool
//! calls with arguments and results, reasoning spans and messages, steps, state snapshots and
//! deltas, some of them failing when order validation is off, `RUN_ERROR`s, `RAW`/`CUSTOM`)
//! with a small state machine, publishes it in small batches, and runs 1–4 simulated clients:
//! each has a speed (publish steps between its drains), stalls, disconnects (reconnecting with
//! its last id, without id, or with an id that cannot be resumed), cuts inside a write (after
//! some of its events, as a dropped connection; it comes back with the last id it received,
//! which inside a reset bridge is the bridge's mark) and random queue limits;
//! retention trims the log (small `retention.max_events`, checkpoints from [`Ingest`]).
//!
//! Properties:
//! - (a) every connection passes the AG-UI order rules: a connection that begins with a
//!   prelude on its own, an exact resume as the continuation of the previous connection, a
//!   live reset as part of its connection; after every write, the fold of everything the
//!   client received (messages and state carry over across connections, as in one client)
//!   equals the fold of the log up to the last id it received; and once publishing stops,
//!   every client reaches the head;
//! - (b) a frame that stands for several log events (coalesced) is one event, no longer in
//!   bytes than the frames of the events it stands for, and merges only what §5 allows; a
//!   frame that stands for one log event carries it byte for byte;
//! - (c) after every publish step, each connection's live lane holds at most `max_events`
//!   frames and `max_bytes` bytes plus one bridge;
//! - (d) a connection that began with a prelude is not closed for overflow: its full queue
//!   is reset to a bridge (SPEC §5; the hub knows such a connection's view), unless the
//!   client has not even taken its previous bridge (stalled: the hub disconnects it).
//!
//! A coalesced `STATE_SNAPSHOT` (a run of deltas with a failing one) is exempt from the byte
//! bound of (b): SPEC §5 prescribes it and it can outgrow the deltas (ignored test
//! `a_failing_delta_run_coalesces_into_a_snapshot_larger_than_its_deltas`).
//!
//! Minimal cases of what the property found are plain tests at the end of the file.
//!
//! `PROPTEST_CASES` overrides the number of cases (64 by default). The cases come from a fixed
//! seed ([`FIXED_SEED`]) so that CI is reproducible; `PROPTEST_RNG_SEED=<n>` explores other
//! cases, and the ignored `hunt` test many at once (400 hunt cases pass as of 2026-11-30).

use agui_fanout::event::{ThreadId, ValidEvent, validate_value};
use agui_fanout::fold::prelude;
use agui_fanout::fold::{ThreadFold, apply_patch};
use agui_fanout::hub::{Hub, Outcome, Start, Subscription};
use agui_fanout::ingest::Ingest;
use agui_fanout::log::memory::MemoryLog;
use agui_fanout::log::{Epoch, EventId, EventLog, ResumeId, Retention, StreamPos};
use agui_fanout::queue::{CloseReason, Drained, QueueLimits};
use agui_fanout::sse::Frame;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

// ---- choices ------------------------------------------------------------------------------

/// A stream of choices drawn by proptest; `0` once exhausted, so a shrunk case takes the
/// first (simplest) option everywhere.
struct Choices<'a> {
    data: &'a [u16],
    at: usize,
}

impl<'a> Choices<'a> {
    fn new(data: &'a [u16]) -> Self {
        Choices { data, at: 0 }
    }

    fn next(&mut self) -> u16 {
        let v = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        v
    }

    /// `0..n` (0 when `n <= 1`).
    fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            0
        } else {
            usize::from(self.next()) % n
        }
    }

    /// True with `percent`% probability; false for a `0` choice.
    fn chance(&mut self, percent: u16) -> bool {
        self.next() % 100 >= 100 - percent.min(100)
    }

    /// Index of an entry picked by weight; a `0` choice picks the first entry with a weight.
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        assert!(total > 0, "nothing to choose from");
        let mut r = u32::from(self.next()) % total;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i;
            }
            r -= w;
        }
        unreachable!()
    }
}

// ---- the event generator ------------------------------------------------------------------

/// One generated event; `failing` marks a `STATE_DELTA` that does not apply to the state.
#[derive(Clone, Debug)]
struct GenEvent {
    value: Value,
    failing: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunPhase {
    None,
    Running,
    Finished,
    Errored,
}

/// A state machine emitting events that `OrderChecker` accepts (asserted as it goes).
struct Gen<'c, 'd> {
    ch: &'c mut Choices<'d>,
    thread: String,
    allow_failing: bool,
    fold: ThreadFold,
    n: u32,
    phase: RunPhase,
    run_id: String,
    open_text: Vec<String>,
    closed_text: Vec<String>,
    open_tools: Vec<String>,
    ended_tools: Vec<String>,
    open_rmsgs: Vec<String>,
    open_spans: Vec<String>,
    open_steps: Vec<String>,
    assistants: Vec<String>,
    out: Vec<GenEvent>,
}

const TEXT_DELTAS: &[&str] = &[
    "Hel",
    "lo",
    " ",
    "world",
    "é",
    "e\u{301}",
    "👩\u{200d}",
    "💻",
    "",
    "\"quoted\"",
    "line\nbreak",
    "\\",
    "日本語",
    "a much longer delta that carries a whole sentence of streamed assistant text. ",
];
const ARG_DELTAS: &[&str] = &["{\"city\":", "\"Par", "is\"", ",\"n\":", "42", "}", ""];

impl<'c, 'd> Gen<'c, 'd> {
    fn new(ch: &'c mut Choices<'d>, thread: &str, allow_failing: bool) -> Self {
        Gen {
            ch,
            thread: thread.to_owned(),
            allow_failing,
            fold: ThreadFold::new(),
            n: 0,
            phase: RunPhase::None,
            run_id: String::new(),
            open_text: Vec::new(),
            closed_text: Vec::new(),
            open_tools: Vec::new(),
            ended_tools: Vec::new(),
            open_rmsgs: Vec::new(),
            open_spans: Vec::new(),
            open_steps: Vec::new(),
            assistants: Vec::new(),
            out: Vec::new(),
        }
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.n += 1;
        format!("{prefix}{}", self.n)
    }

    fn emit(&mut self, value: Value) {
        // A failing delta leaves the state as it was (the patch is atomic).
        let failing = match self.fold.apply_logged(&value) {
            Ok(applied) => applied.iter().any(|a| a.patch_error().is_some()),
            Err(v) => panic!("generator bug: {value} breaks the order rules: {v}"),
        };
        assert!(
            !failing || self.allow_failing,
            "generator bug: failing delta {value}"
        );
        self.out.push(GenEvent { value, failing });
    }

    fn pick<'v>(&mut self, v: &'v [String]) -> &'v String {
        let i = self.ch.below(v.len());
        &v[i]
    }

    fn take(&mut self, v: fn(&mut Self) -> &mut Vec<String>) -> String {
        let len = v(self).len();
        let i = self.ch.below(len);
        v(self).remove(i)
    }

    fn burst(&mut self) -> usize {
        1 + self.ch.below(8)
    }

    fn generate(mut self, target: usize) -> Vec<GenEvent> {
        while self.out.len() < target {
            match self.phase {
                RunPhase::Running => self.step_running(),
                RunPhase::Finished => match self.ch.weighted(&[20, 1]) {
                    0 => self.run_started(),
                    _ => self.emit(json!({"type": "RUN_ERROR", "message": "late failure"})),
                },
                RunPhase::None | RunPhase::Errored => self.run_started(),
            }
            if let Some(e) = self.out.last()
                && e.value["type"] == "RUN_ERROR"
            {
                self.phase = RunPhase::Errored;
            }
        }
        self.out.truncate(target);
        self.out
    }

    fn run_started(&mut self) {
        self.run_id = self.fresh("run");
        let mut ev = json!({"type": "RUN_STARTED", "threadId": self.thread, "runId": self.run_id});
        if self.ch.weighted(&[1, 2]) == 1 {
            let user = self.fresh("u");
            ev["input"] = json!({
                "threadId": self.thread,
                "runId": self.run_id,
                "messages": [{"id": user, "role": "user", "content": format!("question {}", self.n)}],
                "tools": [],
                "context": [],
            });
        }
        if self.ch.chance(10) {
            ev["metadata"] = json!({"producer": "props"});
        }
        self.emit(ev);
        self.phase = RunPhase::Running;
        self.open_text.clear();
        self.open_tools.clear();
        self.ended_tools.clear();
        self.open_rmsgs.clear();
        self.open_spans.clear();
        self.open_steps.clear();
    }

    fn step_running(&mut self) {
        let failing = u32::from(self.allow_failing);
        let has = |v: &Vec<String>| u32::from(!v.is_empty());
        let weights = [
            6,                          // 0 progress: close the newest kind, or finish
            6,                          // 1 text start
            14 * has(&self.open_text),  // 2 text content burst
            4 * has(&self.open_text),   // 3 text end
            4,                          // 4 tool start
            8 * has(&self.open_tools),  // 5 args burst
            3 * has(&self.open_tools),  // 6 tool end
            3 * has(&self.ended_tools), // 7 tool result
            2,                          // 8 reasoning span start
            2,                          // 9 reasoning message start
            6 * has(&self.open_rmsgs),  // 10 reasoning content burst
            2 * has(&self.open_rmsgs),  // 11 reasoning message end
            2 * has(&self.open_spans),  // 12 reasoning span end
            2,                          // 13 step start
            2 * has(&self.open_steps),  // 14 step finish
            2,                          // 15 state snapshot
            8,                          // 16 clean state delta burst
            6 * failing,                // 17 state deltas, some failing
            2,                          // 18 RAW / CUSTOM
            1,                          // 19 RUN_ERROR
            has(&self.closed_text),     // 20 re-open a closed text message
        ];
        match self.ch.weighted(&weights) {
            0 => self.progress(),
            1 => {
                let id = self.fresh("m");
                let mut ev = json!({"type": "TEXT_MESSAGE_START", "messageId": id});
                if self.ch.chance(50) {
                    ev["role"] = json!("assistant");
                }
                self.emit(ev);
                self.assistants.push(id.clone());
                self.open_text.push(id);
            }
            2 => {
                let id = self.pick(&self.open_text.clone()).clone();
                for _ in 0..self.burst() {
                    let d = TEXT_DELTAS[self.ch.below(TEXT_DELTAS.len())];
                    let mut ev =
                        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": d});
                    if self.ch.chance(5) {
                        ev["metadata"] = json!({"k": self.ch.below(3), "tokens": self.ch.below(9)});
                    }
                    self.emit(ev);
                }
            }
            3 => {
                let id = self.take(|g| &mut g.open_text);
                self.emit(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
                self.closed_text.push(id);
            }
            4 => {
                let id = self.fresh("c");
                let mut ev =
                    json!({"type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": "lookup"});
                match self.ch.below(3) {
                    0 => {}
                    1 if !self.assistants.is_empty() => {
                        ev["parentMessageId"] = json!(self.pick(&self.assistants.clone()));
                    }
                    _ => {
                        let p = self.fresh("p");
                        ev["parentMessageId"] = json!(p);
                        self.assistants.push(p);
                    }
                }
                self.emit(ev);
                self.open_tools.push(id);
            }
            5 => {
                let id = self.pick(&self.open_tools.clone()).clone();
                for _ in 0..self.burst() {
                    let d = ARG_DELTAS[self.ch.below(ARG_DELTAS.len())];
                    self.emit(json!({"type": "TOOL_CALL_ARGS", "toolCallId": id, "delta": d}));
                }
            }
            6 => {
                let id = self.take(|g| &mut g.open_tools);
                self.emit(json!({"type": "TOOL_CALL_END", "toolCallId": id}));
                self.ended_tools.push(id);
            }
            7 => {
                let call = self.take(|g| &mut g.ended_tools);
                let id = self.fresh("t");
                let mut ev = json!({"type": "TOOL_CALL_RESULT", "messageId": id, "toolCallId": call, "content": format!("result of {call}")});
                if self.ch.chance(30) {
                    ev["role"] = json!("tool");
                }
                self.emit(ev);
            }
            8 => {
                let id = self.fresh("s");
                self.emit(json!({"type": "REASONING_START", "messageId": id}));
                self.open_spans.push(id);
            }
            9 => {
                let id = self.fresh("r");
                self.emit(
                    json!({"type": "REASONING_MESSAGE_START", "messageId": id, "role": "reasoning"}),
                );
                self.open_rmsgs.push(id);
            }
            10 => {
                let id = self.pick(&self.open_rmsgs.clone()).clone();
                for _ in 0..self.burst() {
                    let d = TEXT_DELTAS[self.ch.below(TEXT_DELTAS.len())];
                    self.emit(
                        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": id, "delta": d}),
                    );
                }
            }
            11 => {
                let id = self.take(|g| &mut g.open_rmsgs);
                self.emit(json!({"type": "REASONING_MESSAGE_END", "messageId": id}));
            }
            12 => {
                let id = self.take(|g| &mut g.open_spans);
                self.emit(json!({"type": "REASONING_END", "messageId": id}));
            }
            13 => {
                let name = self.fresh("step");
                self.emit(json!({"type": "STEP_STARTED", "stepName": name}));
                self.open_steps.push(name);
            }
            14 => {
                let name = self.take(|g| &mut g.open_steps);
                self.emit(json!({"type": "STEP_FINISHED", "stepName": name}));
            }
            15 => {
                let snapshot = match self.ch.weighted(&[8, 1, 1, 1]) {
                    0 => {
                        json!({"k0": self.ch.below(10), "list": [1, 2], "note": "x".repeat(self.ch.below(300))})
                    }
                    1 => json!([]),
                    2 => Value::Null,
                    _ => json!(7),
                };
                self.emit(json!({"type": "STATE_SNAPSHOT", "snapshot": snapshot}));
            }
            16 => {
                for _ in 0..self.burst() {
                    let delta = self.clean_delta();
                    self.emit(json!({"type": "STATE_DELTA", "delta": delta}));
                }
            }
            17 => {
                // A run of deltas, some of which fail.
                for _ in 0..self.burst() {
                    let delta = if self.ch.chance(50) {
                        self.clean_delta()
                    } else {
                        self.failing_delta()
                    };
                    self.emit(json!({"type": "STATE_DELTA", "delta": delta}));
                }
            }
            18 => {
                let ev = if self.ch.chance(50) {
                    json!({"type": "RAW", "event": {"usage": self.ch.below(100)}, "source": "llm"})
                } else {
                    json!({"type": "CUSTOM", "name": "progress", "value": self.ch.below(100)})
                };
                self.emit(ev);
            }
            19 => {
                let mut ev = json!({"type": "RUN_ERROR", "message": "boom"});
                if self.ch.chance(50) {
                    ev["code"] = json!("E_PROPS");
                }
                self.emit(ev);
                self.phase = RunPhase::Errored;
            }
            20 => {
                let i = self.ch.below(self.closed_text.len());
                let id = self.closed_text.remove(i);
                self.emit(json!({"type": "TEXT_MESSAGE_START", "messageId": id}));
                self.open_text.push(id);
            }
            _ => unreachable!(),
        }
    }

    /// Closes the newest open construct of the first kind that has one, or finishes the run.
    fn progress(&mut self) {
        if let Some(id) = self.open_text.pop() {
            self.emit(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
            self.closed_text.push(id);
        } else if let Some(id) = self.open_tools.pop() {
            self.emit(json!({"type": "TOOL_CALL_END", "toolCallId": id}));
            self.ended_tools.push(id);
        } else if let Some(id) = self.open_rmsgs.pop() {
            self.emit(json!({"type": "REASONING_MESSAGE_END", "messageId": id}));
        } else if let Some(id) = self.open_spans.pop() {
            self.emit(json!({"type": "REASONING_END", "messageId": id}));
        } else if let Some(name) = self.open_steps.pop() {
            self.emit(json!({"type": "STEP_FINISHED", "stepName": name}));
        } else {
            let mut ev =
                json!({"type": "RUN_FINISHED", "threadId": self.thread, "runId": self.run_id});
            if self.ch.chance(50) {
                ev["result"] = json!({"answer": self.n});
            }
            self.emit(ev);
            self.phase = RunPhase::Finished;
            self.closed_text.clear();
        }
    }

    /// 1–3 operations that apply, in order, to the current state.
    fn clean_delta(&mut self) -> Vec<Value> {
        let mut state = self.fold.fold().state().clone();
        if !state.is_object() {
            return vec![json!({"op": "add", "path": "", "value": {"k0": self.ch.below(5)}})];
        }
        if self.ch.chance(5) {
            return Vec::new();
        }
        let mut ops = Vec::new();
        for _ in 0..1 + self.ch.below(3) {
            let keys: Vec<String> = state
                .as_object()
                .map(|o| o.keys().filter(|k| k.starts_with('k')).cloned().collect())
                .unwrap_or_default();
            let has_list = state.get("list").is_some_and(Value::is_array);
            let v = self.ch.below(1000);
            let op = match self.ch.below(6) {
                1 if !keys.is_empty() => {
                    json!({"op": "replace", "path": format!("/{}", self.pick(&keys)), "value": v})
                }
                2 if !keys.is_empty() => {
                    json!({"op": "remove", "path": format!("/{}", self.pick(&keys))})
                }
                3 if has_list => json!({"op": "add", "path": "/list/-", "value": v}),
                3 => json!({"op": "add", "path": "/list", "value": []}),
                4 if !keys.is_empty() => {
                    let k = self.pick(&keys).clone();
                    json!({"op": "test", "path": format!("/{k}"), "value": state[&k]})
                }
                5 => json!({"op": "add", "path": "/nested", "value": {"deep": {"v": v}}}),
                _ => json!({"op": "add", "path": format!("/k{}", self.ch.below(5)), "value": v}),
            };
            if let Ok(next) = apply_patch(&state, std::slice::from_ref(&op)) {
                state = next;
                ops.push(op);
            }
        }
        ops
    }

    /// A patch that does not apply to the current state (so the client keeps its state).
    fn failing_delta(&mut self) -> Vec<Value> {
        let state = self.fold.fold().state().clone();
        let candidates = [
            vec![json!({"op": "remove", "path": "/missing"})],
            vec![
                json!({"op": "add", "path": "/k1", "value": 1}),
                json!({"op": "remove", "path": "/missing"}),
            ],
            vec![json!({"op": "test", "path": "", "value": "never the state"})],
            vec![json!({"op": "replace", "path": "/nope/deeper", "value": 0})],
        ];
        let i = self.ch.below(candidates.len());
        let ops = candidates[i].clone();
        assert!(
            apply_patch(&state, &ops).is_err(),
            "{ops:?} applies to {state}"
        );
        ops
    }
}

// ---- the case -----------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// `strict_order = true`; small retention with checkpoints.
    Strict,
    /// `strict_order = false` with failing deltas (appended, skipped by every fold); small
    /// retention with checkpoints (the publish path keeps the fold without checking it).
    NonStrict,
    /// `strict_order = true`; failing deltas appended to the log directly (a producer writing
    /// to the stream itself) once the thread has a checkpoint candidate; small retention.
    Mixed,
}

#[derive(Clone, Debug)]
struct SubCfg {
    /// Publish steps between drains.
    speed: usize,
    /// Chance (%) per drain of stalling for `stall_len` steps.
    stall_pct: u16,
    stall_len: usize,
    /// Chance (%) per step of disconnecting.
    disconnect_pct: u16,
    /// Steps offline after a disconnect (at most).
    offline: usize,
    /// Chance (%) per write of being cut off inside it, after a random number of its events
    /// (the connection drops; the client comes back with the last id it received).
    cut_pct: u16,
    /// First connection with `?from=start` (else no id).
    from_start: bool,
    /// Joins at this percentage of the publish steps.
    join_pct: usize,
}

#[derive(Clone, Debug)]
struct Case {
    variant: Variant,
    max_events: usize,
    max_bytes: usize,
    retention: usize,
    n_events: usize,
    script: Vec<u16>,
    subs: Vec<SubCfg>,
    sched: Vec<u16>,
}

fn sub_cfg() -> impl Strategy<Value = SubCfg> {
    (
        1usize..=24,
        0u16..=20,
        1usize..=60,
        0u16..=12,
        0usize..=8,
        any::<bool>(),
        0usize..=100,
        prop_oneof![Just(0u16), 1u16..=40],
    )
        .prop_map(
            |(
                speed,
                stall_pct,
                stall_len,
                disconnect_pct,
                offline,
                from_start,
                join_pct,
                cut_pct,
            )| SubCfg {
                speed,
                stall_pct,
                stall_len,
                disconnect_pct,
                offline,
                from_start,
                join_pct,
                cut_pct,
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just(Variant::Strict),
            Just(Variant::NonStrict),
            Just(Variant::Mixed)
        ],
        2usize..=48,
        300usize..=16_384,
        prop_oneof![Just(0usize), 4usize..=48],
        1usize..=300,
        prop::collection::vec(any::<u16>(), 0..=600),
        prop::collection::vec(sub_cfg(), 1..=4),
        prop::collection::vec(any::<u16>(), 0..=2000),
    )
        .prop_map(
            |(variant, max_events, max_bytes, retention, n_events, script, subs, sched)| Case {
                variant,
                max_events,
                max_bytes,
                retention,
                n_events,
                script,
                subs,
                sched,
            },
        )
}

// ---- the log's truth ----------------------------------------------------------------------

/// What was appended, and the fold after each prefix.
struct Truth {
    epoch: Option<Epoch>,
    /// `(type, json)` of event `k` at index `k - 1` (log position `0-k`).
    events: Vec<(String, bytes::Bytes)>,
    /// `(messages, state)` after `k` events at index `k`.
    at: Vec<(Value, Value)>,
    fold: ThreadFold,
    /// Largest prelude seen so far (bytes), a bound on one bridge.
    max_prelude: usize,
}

impl Truth {
    fn new() -> Self {
        let fold = ThreadFold::new();
        Truth {
            epoch: None,
            events: Vec::new(),
            at: vec![view(&fold)],
            fold,
            max_prelude: 0,
        }
    }

    fn push(&mut self, id: EventId, ev: &ValidEvent) -> Result<(), String> {
        match self.epoch {
            None => self.epoch = Some(id.epoch),
            Some(e) if e != id.epoch => return Err(format!("epoch changed to {}", id.epoch)),
            _ => {}
        }
        if id.pos != StreamPos::new(0, self.events.len() as u64 + 1) {
            return Err(format!("unexpected position {id}"));
        }
        let v = ev.value().map_err(|e| e.to_string())?;
        self.events
            .push((v["type"].as_str().unwrap_or("").to_owned(), ev.json.clone()));
        let _ = self.fold.apply_logged(&v);
        self.at.push(view(&self.fold));
        let pre = prelude::prelude(&self.fold);
        if !pre.is_empty() {
            let f = Frame::synthesised(id, &pre, Instant::now(), None);
            self.max_prelude = self.max_prelude.max(f.bytes.len());
        }
        Ok(())
    }

    fn head(&self) -> Option<EventId> {
        let epoch = self.epoch?;
        Some(EventId {
            epoch,
            pos: StreamPos::new(0, self.events.len() as u64),
        })
    }

    /// Bytes of the frame of event `k` as published (`id:` + `data:` + blank line).
    fn frame_len(&self, k: usize) -> usize {
        let id = EventId {
            epoch: self.epoch.unwrap_or(Epoch(0)),
            pos: StreamPos::new(0, k as u64),
        };
        4 + id.to_string().len() + 1 + 6 + self.events[k - 1].1.len() + 2
    }
}

fn view(f: &ThreadFold) -> (Value, Value) {
    (
        serde_json::to_value(f.fold().messages()).unwrap_or(Value::Null),
        f.fold().state().clone(),
    )
}

// ---- simulated clients --------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct Stats {
    events: usize,
    failing_deltas: usize,
    connections: usize,
    preludes: usize,
    exact_resumes: usize,
    unresumable: usize,
    /// Connections cut inside a write.
    cuts: usize,
    /// Of those, cut inside a reset bridge (after its first event): resumed with its mark.
    cuts_inside_bridges: usize,
    synthesised_mid_connection: usize,
    coalesced_frames: usize,
    coalesced_events: usize,
    coalesced_snapshots: usize,
    /// Coalesced snapshots larger than the deltas they stand for.
    coalesced_snapshots_larger: usize,
    closes_overflow: usize,
    /// Overflow closes of a connection whose last write ended with a coalesced frame.
    closes_overflow_after_coalesced: usize,
    closes_other: usize,
    trimmed: usize,
    max_live_frames: usize,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.events += o.events;
        self.failing_deltas += o.failing_deltas;
        self.connections += o.connections;
        self.preludes += o.preludes;
        self.exact_resumes += o.exact_resumes;
        self.unresumable += o.unresumable;
        self.cuts += o.cuts;
        self.cuts_inside_bridges += o.cuts_inside_bridges;
        self.synthesised_mid_connection += o.synthesised_mid_connection;
        self.coalesced_frames += o.coalesced_frames;
        self.coalesced_events += o.coalesced_events;
        self.coalesced_snapshots += o.coalesced_snapshots;
        self.coalesced_snapshots_larger += o.coalesced_snapshots_larger;
        self.closes_overflow += o.closes_overflow;
        self.closes_overflow_after_coalesced += o.closes_overflow_after_coalesced;
        self.closes_other += o.closes_other;
        self.trimmed += o.trimmed;
        self.max_live_frames = self.max_live_frames.max(o.max_live_frames);
    }
}

#[derive(Clone, Copy, Debug)]
enum Reconnect {
    LastId,
    NoId,
    Bogus,
}

struct Client {
    n: usize,
    cfg: SubCfg,
    sub: Option<Subscription>,
    /// No event of the current connection received yet.
    conn_first: bool,
    /// Last id of the current connection.
    conn_last: Option<EventId>,
    /// The last frame received was a coalesced one.
    last_coalesced: bool,
    /// The current connection began with a prelude (the hub knows its view throughout).
    conn_prelude: bool,
    /// The client's fold (messages and state carry over; order state per connection).
    fold: ThreadFold,
    /// Last id received (over all connections).
    last: Option<EventId>,
    /// The last id received is the mark of a reset bridge sent after `last` (or, `last`
    /// being `None`, after nothing): the client resumes with that mark.
    bridge_mark: bool,
    connected_once: bool,
    reconnect_at: usize,
    reconnect: Reconnect,
    next_drain: usize,
    /// Trace of this client's connections and writes, for failure messages.
    log: Vec<String>,
}

impl Client {
    fn fail(&self, what: String) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(12).collect();
        format!(
            "client {}: {what}\n  recent (newest first):\n    {}",
            self.n,
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n    ")
        )
    }

    async fn connect(
        &mut self,
        hub: &Hub,
        thread: &ThreadId,
        truth: &Truth,
        start: Start,
        settled: bool,
        stats: &mut Stats,
    ) -> Result<(), String> {
        let sub = hub
            .subscribe(thread, start)
            .await
            .map_err(|e| self.fail(format!("subscribe: {e}")))?;
        stats.connections += 1;
        match (start, sub.outcome) {
            (Start::After(_), Outcome::Exact) => stats.exact_resumes += 1,
            (Start::InsideBridge(_), Outcome::Unresumable(_)) => {
                stats.unresumable += 1;
                stats.cuts_inside_bridges += 1;
            }
            (Start::InsideBridge(_), _) => {
                return Err(self.fail("a resume inside a bridge taken as exact".into()));
            }
            (_, Outcome::Unresumable(_)) => stats.unresumable += 1,
            _ => {}
        }
        self.log.push(format!(
            "connect {start:?} -> {:?} prelude={} (head {:?})",
            sub.outcome,
            sub.prelude.is_some(),
            truth.head().map(|i| i.to_string())
        ));
        if !sub.fold_known {
            return Err(self.fail("the hub does not know the thread's fold".into()));
        }
        let exact = matches!((start, sub.outcome), (Start::After(_), Outcome::Exact))
            || matches!((start, sub.outcome), (Start::FromStart, Outcome::Exact));
        // (When the hub has not fanned the last batch out yet, its fold may still be empty.)
        if settled && !exact && truth.head().is_some() && sub.prelude.is_none() {
            return Err(
                self.fail("a fresh connection to a non-empty thread without prelude".into())
            );
        }
        if exact && sub.prelude.is_some() {
            return Err(self.fail("an exact resume with a prelude".into()));
        }
        self.conn_first = true;
        self.conn_last = None;
        self.conn_prelude = false;
        self.connected_once = true;
        let prelude = sub.prelude.as_ref().map(|p| p.bytes.clone());
        self.sub = Some(sub);
        if let Some(bytes) = prelude {
            self.receive(&bytes, None, truth, stats)?;
        }
        Ok(())
    }

    fn disconnect(&mut self, at: usize, offline: usize, how: Reconnect, why: &str) {
        self.log.push(format!("disconnect ({why}) at step {at}"));
        self.sub = None;
        self.reconnect_at = at + offline;
        self.reconnect = how;
    }

    /// Processes one write of the stream (whole frames); with `cut_after = Some(n)`, only the
    /// first `n` events of it (the connection was cut there: the rest never arrives and the
    /// fold is not compared, since the client may be inside a bridge).
    fn receive(
        &mut self,
        bytes: &[u8],
        cut_after: Option<usize>,
        truth: &Truth,
        stats: &mut Stats,
    ) -> Result<(), String> {
        let text = std::str::from_utf8(bytes).map_err(|e| self.fail(format!("not UTF-8: {e}")))?;
        if text.contains('\r') || !text.ends_with("\n\n") {
            return Err(self.fail(format!("bad framing: {text:?}")));
        }
        let mut data_only = 0usize;
        let mut types = Vec::new();
        for block in text.split_terminator("\n\n") {
            if cut_after.is_some_and(|n| types.len() >= n) {
                self.log.push(format!("cut after {types:?}"));
                return Ok(());
            }
            let (mut id, mut data) = (None, None);
            for line in block.split('\n') {
                if let Some(r) = line.strip_prefix("id: ") {
                    id = Some(r);
                } else if let Some(d) = line.strip_prefix("data: ") {
                    if data.replace(d).is_some() {
                        return Err(self.fail(format!("two data lines: {block:?}")));
                    }
                } else if !line.starts_with(':') {
                    return Err(self.fail(format!("unexpected line {line:?}")));
                }
            }
            let Some(data) = data else {
                if id.is_some() {
                    return Err(self.fail(format!("id without data: {block:?}")));
                }
                continue;
            };
            let ev: Value = serde_json::from_str(data)
                .map_err(|e| self.fail(format!("data is not JSON ({e}): {data}")))?;
            let ty = ev["type"].as_str().unwrap_or("?").to_owned();
            types.push(ty.clone());
            if self.conn_first {
                self.conn_first = false;
                if prelude::is_prelude_start(&ev) {
                    // A fresh HTTP response: a fresh verifier; messages and state carry over.
                    self.fold.reset_order();
                    self.conn_prelude = true;
                    stats.preludes += 1;
                }
            } else if prelude::is_prelude_start(&ev) {
                return Err(self.fail(format!("a marked RUN_STARTED inside a connection: {data}")));
            }
            if let Err(v) = self.fold.apply_logged(&ev) {
                return Err(self.fail(format!(
                    "(a) order violation [{}] on {data} (write: {types:?})",
                    v.rule
                )));
            }
            let Some(id) = id else {
                data_only += 1;
                continue;
            };
            let id = match id.parse::<ResumeId>() {
                Ok(ResumeId::Event(id)) => id,
                Ok(ResumeId::InsideBridge(after)) => {
                    // The first event of a reset bridge: marked after the client's last id.
                    let last = self.last.map_or(StreamPos::ZERO, |l| l.pos);
                    if Some(after.epoch) != truth.epoch || after.pos != last || data_only > 0 {
                        return Err(self.fail(format!(
                            "bridge mark {after}-bridge after {last} (events without id before it: {data_only})"
                        )));
                    }
                    self.bridge_mark = true;
                    data_only += 1;
                    continue;
                }
                Err(_) => return Err(self.fail(format!("malformed id {id:?}"))),
            };
            if Some(id.epoch) != truth.epoch {
                return Err(self.fail(format!("id {id} of another epoch")));
            }
            if self.conn_last.is_some_and(|l| id.pos <= l.pos) {
                return Err(self.fail(format!("ids not increasing within a connection at {id}")));
            }
            let prev = self.last.map_or(0, |l| l.pos.seq as usize);
            let x = id.pos.seq as usize;
            if x < prev || x > truth.events.len() {
                return Err(self.fail(format!("id {id} goes back (last {prev}) or ahead")));
            }
            let synthesised =
                data_only > 0 || ty == "MESSAGES_SNAPSHOT" || prelude::is_prelude_start(&ev);
            if synthesised {
                if self.conn_last.is_some() {
                    stats.synthesised_mid_connection += 1;
                }
            } else {
                self.check_frame(prev, x, &ty, data, block.len() + 2, truth, stats)?;
            }
            data_only = 0;
            self.last_coalesced = !synthesised && x > prev + 1;
            self.bridge_mark = false;
            self.last = Some(id);
            self.conn_last = Some(id);
        }
        if data_only > 0 {
            return Err(self.fail("a write ends with events without id".into()));
        }
        let k = self.last.map_or(0, |l| l.pos.seq as usize);
        self.log.push(format!("write up to {k}: {types:?}"));
        let got = view(&self.fold);
        if got != truth.at[k] {
            return Err(self.fail(format!(
                "(a) fold after {k} differs:\n  client messages {}\n  log    messages {}\n  client state {}\n  log    state {}",
                got.0, truth.at[k].0, got.1, truth.at[k].1
            )));
        }
        Ok(())
    }

    /// (b): a frame at log position `x`, the previous id received being `prev`.
    #[allow(clippy::too_many_arguments)]
    fn check_frame(
        &self,
        prev: usize,
        x: usize,
        ty: &str,
        data: &str,
        len: usize,
        truth: &Truth,
        stats: &mut Stats,
    ) -> Result<(), String> {
        if x == prev {
            return Err(self.fail(format!("event {x} received twice")));
        }
        if x == prev + 1 {
            if data.as_bytes() != &truth.events[x - 1].1[..] {
                return Err(self.fail(format!(
                    "(b) event {x} not delivered as published: {data} vs {}",
                    String::from_utf8_lossy(&truth.events[x - 1].1)
                )));
            }
            return Ok(());
        }
        // Stands for (prev, x]: a coalesced frame.
        let originals: Vec<&str> = truth.events[prev..x]
            .iter()
            .map(|(t, _)| t.as_str())
            .collect();
        let ok_types = match ty {
            "TEXT_MESSAGE_CONTENT" | "TOOL_CALL_ARGS" | "REASONING_MESSAGE_CONTENT" => {
                originals.iter().all(|t| *t == ty)
            }
            "STATE_DELTA" | "STATE_SNAPSHOT" => originals.iter().all(|t| *t == "STATE_DELTA"),
            _ => false,
        };
        if !ok_types {
            return Err(self.fail(format!(
                "(a)/(b) a {ty} frame stands for events {}..={x} of types {originals:?} (a gap, or a merge across other events)",
                prev + 1
            )));
        }
        let original_bytes: usize = (prev + 1..=x).map(|k| truth.frame_len(k)).sum();
        stats.coalesced_frames += 1;
        stats.coalesced_events += x - prev;
        if ty == "STATE_SNAPSHOT" {
            stats.coalesced_snapshots += 1;
        }
        if len > original_bytes && ty == "STATE_SNAPSHOT" {
            // SPEC §5 turns a run of deltas with a failing one into a snapshot of the whole
            // folded state, which can outgrow the deltas (see
            // `a_failing_delta_run_coalesces_into_a_snapshot_larger_than_its_deltas`). Its
            // content is checked by the fold comparison.
            stats.coalesced_snapshots_larger += 1;
        } else if len > original_bytes {
            return Err(self.fail(format!(
                "(b) a coalesced {ty} frame of {len} bytes stands for events {}..={x} of {original_bytes} bytes: {data}",
                prev + 1
            )));
        }
        Ok(())
    }

    /// One drain moment: one write (`full` false) or everything until the queue stays empty.
    async fn drain(
        &mut self,
        full: bool,
        step: usize,
        cut: &mut Choices<'_>,
        truth: &Truth,
        stats: &mut Stats,
    ) -> Result<(), String> {
        let mut idle = 0;
        loop {
            let Some(sub) = &self.sub else { return Ok(()) };
            match sub.queue.try_drain() {
                Some(Drained::Frames(bytes)) => {
                    let events = bytes.windows(2).filter(|w| w == b"\n\n").count();
                    // Writes with a bridge are rare and what cuts are about: cut them often.
                    let bridge = bytes.windows(8).any(|w| w == b"-bridge\n");
                    let pct = match self.cfg.cut_pct {
                        0 => 0,
                        p if bridge => p.max(50),
                        p => p,
                    };
                    if events > 1 && cut.chance(pct) {
                        stats.cuts += 1;
                        let n = 1 + cut.below(events - 1);
                        self.receive(&bytes, Some(n), truth, stats)?;
                        self.disconnect(step, 1, Reconnect::LastId, "cut inside a write");
                        return Ok(());
                    }
                    self.receive(&bytes, None, truth, stats)?;
                    idle = 0;
                    if !full {
                        return Ok(());
                    }
                }
                Some(Drained::Closed(reason)) => {
                    if reason == CloseReason::Overflow {
                        stats.closes_overflow += 1;
                        if self.last_coalesced && self.conn_last.is_some() {
                            stats.closes_overflow_after_coalesced += 1;
                        }
                        if self.conn_prelude && !sub.queue.bridge_pending() {
                            // (d) SPEC §5: a full queue is reset to a bridge; the hub knows
                            // the view of a connection that began with a prelude. (A client
                            // that has not taken its previous bridge is stalled: the hub
                            // disconnects it.)
                            return Err(self.fail(format!(
                                "(d) closed for overflow instead of reset (last write coalesced: {})",
                                self.last_coalesced
                            )));
                        }
                    } else {
                        stats.closes_other += 1;
                    }
                    self.disconnect(step, 1, Reconnect::LastId, reason.as_str());
                    return Ok(());
                }
                None => {
                    if !full || idle >= 3 {
                        return Ok(());
                    }
                    idle += 1;
                    tokio::task::yield_now().await;
                }
            }
        }
    }

    fn start_for(&self, how: Reconnect, truth: &Truth) -> Start {
        match (how, self.last) {
            (Reconnect::LastId, last) if self.bridge_mark => {
                Start::InsideBridge(last.unwrap_or(EventId {
                    epoch: truth.epoch.unwrap_or(Epoch(1)),
                    pos: StreamPos::ZERO,
                }))
            }
            (Reconnect::LastId, Some(id)) => Start::After(id),
            (Reconnect::Bogus, last) => {
                let epoch = truth.epoch.unwrap_or(Epoch(1));
                match last {
                    // Ahead of the log.
                    Some(id) if id.pos.seq % 2 == 0 => Start::After(EventId {
                        epoch,
                        pos: StreamPos::new(0, id.pos.seq + 10_000),
                    }),
                    // Another epoch.
                    _ => Start::After(EventId {
                        epoch: Epoch(epoch.0 ^ 0x5a5a),
                        pos: StreamPos::new(0, 1),
                    }),
                }
            }
            _ => Start::Live,
        }
    }
}

/// Waits until the hub fanned out everything up to `head`.
async fn settle(hub: &Hub, thread: &ThreadId, head: Option<EventId>) -> Result<(), String> {
    let want = head
        .map(|h| Value::String(h.to_string()))
        .unwrap_or(Value::Null);
    for _ in 0..10_000 {
        let snap = hub
            .snapshot(thread)
            .await
            .map_err(|e| format!("snapshot: {e}"))?
            .ok_or("no fold for the snapshot")?;
        if snap["lastEventId"] == want {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
    Err(format!("the hub never reached {want}"))
}

async fn simulate(case: &Case) -> Result<Stats, String> {
    let thread_name = "props-thread";
    let thread = ThreadId::parse(thread_name).expect("valid thread id");
    let mut gch = Choices::new(&case.script);
    let events =
        Gen::new(&mut gch, thread_name, case.variant != Variant::Strict).generate(case.n_events);

    let log = Arc::new(MemoryLog::new(Retention {
        max_events: case.retention,
        max_age: None,
        idle_ttl: None,
    }));
    let dyn_log: Arc<dyn EventLog> = log.clone();
    let strict = case.variant != Variant::NonStrict;
    let ingest = Ingest::new(dyn_log.clone(), strict, case.retention);
    let limits = QueueLimits {
        max_events: case.max_events,
        max_bytes: case.max_bytes,
    };
    let stop = CancellationToken::new();
    let hub = Hub::start(dyn_log.clone(), limits, stop.clone());

    let mut stats = Stats::default();
    let mut truth = Truth::new();
    let mut ch = Choices::new(&case.sched);

    // Publish steps: batches of consecutive events (a failing delta in `Mixed` goes alone, to
    // the log directly, once the thread has a checkpoint candidate; before that it is dropped:
    // it changes nothing).
    let mut steps: Vec<(Vec<GenEvent>, bool)> = Vec::new();
    let mut ingested = 0usize;
    let mut i = 0;
    while i < events.len() {
        let size = match ch.weighted(&[6, 3, 1]) {
            0 => 1,
            1 => 2 + ch.below(3),
            _ => 5 + ch.below(12),
        };
        // The publish path refuses batches over 2 × `retention.max_events`.
        let size = match case.retention {
            0 => size,
            r => size.min(2 * r),
        };
        let mut batch = Vec::new();
        while i < events.len() && batch.len() < size {
            let e = &events[i];
            if e.failing && case.variant == Variant::Mixed {
                if !batch.is_empty() {
                    break;
                }
                i += 1;
                if case.retention > 0 && ingested >= case.retention {
                    steps.push((vec![e.clone()], true));
                }
                continue;
            }
            batch.push(e.clone());
            ingested += 1;
            i += 1;
        }
        if !batch.is_empty() {
            steps.push((batch, false));
        }
    }
    stats.events = steps.iter().map(|(b, _)| b.len()).sum();
    stats.failing_deltas = steps
        .iter()
        .flat_map(|(b, _)| b)
        .filter(|e| e.failing)
        .count();

    let n_steps = steps.len();
    let mut clients: Vec<Client> = case
        .subs
        .iter()
        .enumerate()
        .map(|(n, cfg)| Client {
            n,
            cfg: cfg.clone(),
            sub: None,
            conn_first: true,
            conn_last: None,
            last_coalesced: false,
            conn_prelude: false,
            fold: ThreadFold::new(),
            last: None,
            bridge_mark: false,
            connected_once: false,
            reconnect_at: cfg.join_pct * n_steps / 100,
            reconnect: Reconnect::NoId,
            next_drain: 0,
            log: Vec::new(),
        })
        .collect();

    for (step, (batch, direct)) in steps.iter().enumerate() {
        let settle_first = ch.chance(70);
        // Publish.
        let valid: Vec<ValidEvent> = batch
            .iter()
            .map(|e| validate_value(e.value.clone(), Some(&thread)))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("generator bug: schema: {e}"))?;
        let ids = if *direct {
            dyn_log
                .append(&thread, &valid)
                .await
                .map_err(|e| e.to_string())?
        } else {
            ingest
                .append(&thread, &valid, None)
                .await
                .map_err(|e| format!("publish refused: {e} (batch {batch:?})"))?
                .ids
        };
        for (id, ev) in ids.iter().zip(&valid) {
            truth.push(*id, ev)?;
        }
        if settle_first {
            settle(&hub, &thread, truth.head()).await?;
        }
        // Joins and reconnects (possibly while the hub has not fanned the batch out yet).
        for c in clients.iter_mut() {
            if c.sub.is_none() && step >= c.reconnect_at {
                let start = if !c.connected_once && c.cfg.from_start {
                    Start::FromStart
                } else {
                    c.start_for(c.reconnect, &truth)
                };
                c.connect(&hub, &thread, &truth, start, settle_first, &mut stats)
                    .await?;
                c.next_drain = step;
            }
        }
        settle(&hub, &thread, truth.head()).await?;
        // (c) Bounded live lanes.
        let bound = case.max_bytes + truth.max_prelude + 4096;
        for c in &clients {
            if let Some(sub) = &c.sub {
                let (frames, bytes) = sub.queue.pending();
                stats.max_live_frames = stats.max_live_frames.max(frames);
                // One bridge may wait on top of what the limits allow.
                if frames > case.max_events + 1 || bytes > bound {
                    return Err(c.fail(format!(
                        "(c) live lane holds {frames} frames, {bytes} bytes (limits {} frames, {} bytes, bridge bound {})",
                        case.max_events, case.max_bytes, truth.max_prelude + 4096
                    )));
                }
            }
        }
        // Drains.
        for c in clients.iter_mut() {
            if c.sub.is_some() && step >= c.next_drain {
                let full = ch.weighted(&[3, 1]) == 0;
                c.drain(full, step, &mut ch, &truth, &mut stats).await?;
                c.next_drain = step + c.cfg.speed;
                if ch.chance(c.cfg.stall_pct) {
                    c.next_drain += c.cfg.stall_len;
                }
            }
        }
        // Disconnects.
        for c in clients.iter_mut() {
            if c.sub.is_some() && ch.chance(c.cfg.disconnect_pct) {
                let how = match ch.weighted(&[7, 2, 1]) {
                    0 => Reconnect::LastId,
                    1 => Reconnect::NoId,
                    _ => Reconnect::Bogus,
                };
                let offline = ch.below(c.cfg.offline + 1);
                c.disconnect(step, offline, how, "client");
            }
        }
    }

    // Publishing is over: everyone (re)connects and catches up with the head (uncut).
    settle(&hub, &thread, truth.head()).await?;
    let mut no_cuts = Choices::new(&[]);
    for round in 0..8 {
        if round >= 4 {
            // (On a multi-threaded runtime, replay tasks may need a moment.)
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        for c in clients.iter_mut() {
            if c.sub.is_none() {
                let start = if !c.connected_once && c.cfg.from_start {
                    Start::FromStart
                } else {
                    c.start_for(Reconnect::LastId, &truth)
                };
                c.connect(&hub, &thread, &truth, start, true, &mut stats)
                    .await?;
            }
            c.drain(true, n_steps + round, &mut no_cuts, &truth, &mut stats)
                .await?;
        }
    }
    for c in &clients {
        if c.sub.is_none() || c.last != truth.head() {
            return Err(c.fail(format!(
                "(a) did not reach the head {:?} (at {:?}, connected {})",
                truth.head().map(|i| i.to_string()),
                c.last.map(|i| i.to_string()),
                c.sub.is_some()
            )));
        }
    }
    let head = dyn_log.head(&thread).await.map_err(|e| e.to_string())?;
    stats.trimmed = head.max_deleted.seq as usize;
    drop(clients);
    stop.cancel();
    Ok(stats)
}

fn run_case(case: &Case) -> Result<Stats, String> {
    if std::env::var_os("HUNT_MT").is_some() {
        // Exploration on two worker threads (the hub, tails and replays run in parallel).
        return tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(simulate(case));
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(simulate(case))
}

/// Seed of the property's cases unless `PROPTEST_RNG_SEED` is set.
const FIXED_SEED: u64 = 20_261_130;

fn rng_seed() -> proptest::test_runner::RngSeed {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(FIXED_SEED);
    proptest::test_runner::RngSeed::Fixed(seed)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), rng_seed: rng_seed(), ..ProptestConfig::default() })]

    #[test]
    fn delivery_keeps_every_client_valid_exact_and_bounded(case in case()) {
        if let Err(e) = run_case(&case) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// The generator and the schedule reach what the properties are about (coalescing, resets,
/// preludes, exact resumes, trimming, failing deltas), so the property is not vacuous.
/// Counted over the cases that pass; failures are the property test's to report.
#[test]
fn the_cases_cover_the_delivery_paths() {
    let mut runner = TestRunner::deterministic();
    let strategy = case();
    let mut total = Stats::default();
    let mut failing = 0;
    for _ in 0..24 {
        let case = strategy.new_tree(&mut runner).expect("a case").current();
        match run_case(&case) {
            Ok(s) => total.add(&s),
            Err(_) => failing += 1,
        }
    }
    eprintln!("coverage over 24 deterministic cases ({failing} failing, not counted): {total:#?}");
    assert!(total.coalesced_frames > 0, "{total:?}");
    assert!(total.coalesced_snapshots > 0, "{total:?}");
    assert!(total.synthesised_mid_connection > 0, "{total:?}");
    assert!(total.preludes > 0, "{total:?}");
    assert!(total.exact_resumes > 0, "{total:?}");
    assert!(total.unresumable > 0, "{total:?}");
    assert!(total.cuts > 0, "{total:?}");
    assert!(total.cuts_inside_bridges > 0, "{total:?}");
    assert!(total.trimmed > 0, "{total:?}");
    assert!(total.failing_deltas > 0, "{total:?}");
}

// ---- minimal cases of what the property found ---------------------------------------------

/// A log, the publish path and a hub, for the minimal cases below.
struct Rig {
    log: Arc<dyn EventLog>,
    ingest: Ingest,
    hub: Hub,
    thread: ThreadId,
    head: Option<EventId>,
    stop: CancellationToken,
}

impl Rig {
    fn new(retention: usize, limits: QueueLimits) -> Rig {
        let log: Arc<dyn EventLog> = Arc::new(MemoryLog::new(Retention {
            max_events: retention,
            max_age: None,
            idle_ttl: None,
        }));
        let stop = CancellationToken::new();
        Rig {
            ingest: Ingest::new(log.clone(), true, retention),
            hub: Hub::start(log.clone(), limits, stop.clone()),
            log,
            thread: ThreadId::parse("t").expect("a thread id"),
            head: None,
            stop,
        }
    }

    /// Publishes one batch (strict order) and waits until the hub fanned it out.
    async fn publish(&mut self, events: &[Value]) {
        self.publish_unsettled(events).await;
        settle(&self.hub, &self.thread, self.head)
            .await
            .expect("fanned out");
    }

    /// Publishes one batch (strict order).
    async fn publish_unsettled(&mut self, events: &[Value]) {
        let valid: Vec<ValidEvent> = events
            .iter()
            .map(|e| validate_value(e.clone(), Some(&self.thread)).expect("schema-valid"))
            .collect();
        let appended = self
            .ingest
            .append(&self.thread, &valid, None)
            .await
            .expect("appended");
        self.head = appended.ids.last().copied().or(self.head);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The events of a write.
fn events_of(bytes: &[u8]) -> Vec<Value> {
    std::str::from_utf8(bytes)
        .expect("UTF-8")
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("JSON"))
        .collect()
}

fn content(delta: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": delta})
}

/// SPEC §2: `?from=start` replays the retained log from its first event only "when the log is
/// complete from the thread's beginning (otherwise it behaves as no id)", i.e. a prelude at the
/// head (§4.4).
///
/// Found by the property (order violation `first_event_must_be_run_started` on the first
/// event of a `?from=start` connection). Cause: `Hub::subscribe` decides with
/// `head.complete_from_start()` on the thread hub's `LogHead`, loaded when the thread hub
/// started; `fan_out` advances its `last` but never its `max_deleted`, so a thread trimmed
/// while followed still looks complete, the outcome is `Exact` and the replay starts at the
/// first retained event, mid-run, without a prelude.
#[test]
fn from_start_on_a_thread_trimmed_while_followed_begins_with_a_prelude() {
    runtime().block_on(async {
        let mut rig = Rig::new(
            4,
            QueueLimits {
                max_events: 64,
                max_bytes: 1 << 20,
            },
        );
        rig.publish(&[json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"})])
            .await;
        // The hub follows the thread from here on.
        let _follower = rig
            .hub
            .subscribe(&rig.thread, Start::Live)
            .await
            .expect("subscribed");
        rig.publish(&[json!({"type": "TEXT_MESSAGE_START", "messageId": "m1"})])
            .await;
        for _ in 0..8 {
            rig.publish(&[content("x")]).await;
        }
        let head = rig.log.head(&rig.thread).await.expect("head");
        assert!(!head.complete_from_start(), "the log was trimmed: {head:?}");

        let sub = rig
            .hub
            .subscribe(&rig.thread, Start::FromStart)
            .await
            .expect("subscribed");
        let mut received = sub
            .prelude
            .as_ref()
            .map(|p| events_of(&p.bytes))
            .unwrap_or_default();
        for _ in 0..8 {
            tokio::task::yield_now().await;
            if let Some(Drained::Frames(b)) = sub.queue.try_drain() {
                received.extend(events_of(&b));
            }
        }
        assert_eq!(sub.outcome, Outcome::StartTrimmed, "received {received:?}");
        assert!(
            received.first().is_some_and(prelude::is_prelude_start),
            "the stream must begin with a prelude, got {received:?}"
        );
    });
}

/// SPEC §6: "A checkpoint of the fold is kept with the log so a prelude can always be built,
/// however much was trimmed."
///
/// Found by the property (`the hub does not know the thread's fold` for a subscriber joining
/// later; the snapshot has no fold either). Cause: the count safety cap (`4 × max_events`
/// once a thread uses checkpoints) trims the oldest entries *after* the promoted checkpoint
/// when more than that many entries pile up before the next promotion; checkpoint + retained
/// entries then no longer make the fold (`load_fold` meets a gap after the checkpoint and
/// gives up), so a new subscriber gets no prelude (it starts live, mid-run) and, after a
/// restart, publishes go unchecked. First found with one large strict batch (> ~3 ×
/// `max_events`, which the working tree now refuses: batches are capped at 2 ×
/// `max_events`); still reachable, as here, when events appended to the log directly (SPEC
/// §2 allows producers to write to the stream) come between the publish path's checkpoint
/// candidates, which count only its own events. Memory backend shown; the Redis script
/// follows the same rules.
#[test]
fn direct_appends_between_checkpoints_keep_the_fold_rebuildable() {
    runtime().block_on(async {
        let mut rig = Rig::new(
            4,
            QueueLimits {
                max_events: 64,
                max_bytes: 1 << 20,
            },
        );
        // Two candidates: the checkpoint at 0-4 is promoted (0-1..=0-4 trimmed), 0-8 pending.
        rig.publish_unsettled(&[
            json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1"}),
            content("a"),
            content("b"),
        ])
        .await;
        rig.publish_unsettled(&[content("c"), content("d"), content("e"), content("f")])
            .await;
        // A producer appends 13 events to the log itself: 0-5..=0-21 is 17 entries, over the
        // 16-entry cap, so 0-5 goes although the checkpoint stands at 0-4.
        let direct: Vec<ValidEvent> = (0..13)
            .map(|_| validate_value(content("g"), Some(&rig.thread)).expect("schema-valid"))
            .collect();
        rig.log
            .append(&rig.thread, &direct)
            .await
            .expect("appended");
        let head = rig.log.head(&rig.thread).await.expect("head");
        let ckpt = rig.log.checkpoint(&rig.thread).await.expect("checkpoint");
        let sub = rig
            .hub
            .subscribe(&rig.thread, Start::Live)
            .await
            .expect("subscribed");
        assert!(
            sub.fold_known && sub.prelude.is_some(),
            "no fold, no prelude: head {head:?}, checkpoint at {:?}",
            ckpt.map(|c| c.pos)
        );
    });
}

/// SPEC §5 "Reset (queue still full): the queue is dropped and replaced by a bridge ...".
///
/// Found by the property (an `overflow` close of a connection that began with a prelude,
/// whose view the hub always knows). Cause: a full live lane is coalesced in place
/// (`queue::compact`), and `coalesce::merge_run` builds the merged frame with `Frame::new`,
/// which has no `view`. When the writer's last frame taken is such a merged frame,
/// `ConnQueue::client_view` becomes `None`, so the next overflow cannot build a bridge and the
/// hub closes the stream (`CloseReason::Overflow`) instead of resetting it. The client
/// recovers by reconnecting, but the reset the spec promises is lost exactly for the slow
/// subscribers coalescing is for. (Same without the compaction — 4 deltas, then the 5 RAW —
/// and the queue is reset.)
#[test]
fn an_overflow_after_a_coalesced_write_resets_the_queue() {
    runtime().block_on(async {
        let mut rig = Rig::new(
            0,
            QueueLimits {
                max_events: 4,
                max_bytes: 1 << 20,
            },
        );
        rig.publish(&[
            json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1"}),
        ])
        .await;
        let sub = rig
            .hub
            .subscribe(&rig.thread, Start::Live)
            .await
            .expect("subscribed");
        assert!(sub.prelude.is_some());
        // Five deltas, one at a time: the fifth overflows `max_events` and the lane is
        // coalesced into one frame.
        for d in ["a", "b", "c", "d", "e"] {
            rig.publish(&[content(d)]).await;
        }
        let Some(Drained::Frames(b)) = sub.queue.try_drain() else {
            panic!("frames expected");
        };
        assert_eq!(events_of(&b), vec![content("abcde")]);
        // Five events that cannot be merged: the lane overflows again.
        for i in 0..5 {
            rig.publish(&[json!({"type": "CUSTOM", "name": "n", "value": i})])
                .await;
        }
        match sub.queue.try_drain() {
            Some(Drained::Frames(b)) => {
                let evs = events_of(&b);
                assert_eq!(evs[0]["type"], "MESSAGES_SNAPSHOT", "a bridge: {evs:?}");
            }
            other => panic!("SPEC §5: the queue must be reset to a bridge, got {other:?}"),
        }
    });
}

/// Property (b) does not hold for one case SPEC §5 prescribes: a run of `STATE_DELTA`s with
/// a failing one becomes one `STATE_SNAPSHOT` of the whole folded state, which is larger than
/// the deltas when the state is. Ignored: the behaviour is the spec's; run it with
/// `--ignored` to see the figures. (A coalescer could leave such a run as it is when the
/// snapshot would be larger: the spec does not require merging.)
#[test]
#[ignore = "SPEC §5 prescribes the snapshot; it can outgrow the deltas it replaces"]
fn a_failing_delta_run_coalesces_into_a_snapshot_larger_than_its_deltas() {
    let big = json!({"doc": "x".repeat(1000)});
    let born = Instant::now();
    let frame = |seq: u64, ev: Value, clean: bool, after: Option<Value>| {
        let json = serde_json::to_vec(&ev).expect("serialisable");
        let merge = agui_fanout::queue::MergeKey::of(
            agui_fanout::event::EventType::StateDelta,
            &ev,
            clean,
            after.map(Arc::new),
        );
        Frame::new(
            EventId {
                epoch: Epoch(1),
                pos: StreamPos::new(0, seq),
            },
            agui_fanout::event::EventType::StateDelta,
            &json,
            born,
            merge,
        )
    };
    let mut with_a = big.clone();
    with_a["a"] = json!(1);
    let mut frames = vec![
        frame(
            1,
            json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": 1}]}),
            true,
            None,
        ),
        frame(
            2,
            json!({"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/missing"}]}),
            false,
            Some(with_a),
        ),
    ];
    let before: usize = frames.iter().map(|f| f.bytes.len()).sum();
    agui_fanout::queue::coalesce::coalesce(&mut frames, |d, o| apply_patch(d, o).ok());
    let after: usize = frames.iter().map(|f| f.bytes.len()).sum();
    assert!(
        after <= before,
        "2 deltas of {before} bytes became 1 {} of {after} bytes",
        frames[0].event_type.as_str()
    );
}

/// Explores `HUNT_CASES` random cases (default 500; from case `HUNT_FROM`, default 0)
/// without shrinking and prints every failure with its case number: case `i` is drawn from a
/// generator seeded with `i`, so `HUNT_FROM=i HUNT_CASES=1` replays it. With `HUNT_MT` set,
/// cases run on a two-worker runtime. A tool for finding several distinct failures in one go.
#[test]
#[ignore = "exploration tool: cargo test --test delivery_props hunt -- --ignored --nocapture"]
fn hunt() {
    use proptest::test_runner::{RngAlgorithm, TestRng};
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (from, n) = (env("HUNT_FROM", 0), env("HUNT_CASES", 500));
    let strategy = case();
    let mut failures = 0;
    for i in from..from + n {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&i.to_le_bytes());
        let mut runner = TestRunner::new_with_rng(
            ProptestConfig::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed),
        );
        let case = strategy.new_tree(&mut runner).expect("a case").current();
        if let Err(e) = run_case(&case) {
            failures += 1;
            let first = e.lines().next().unwrap_or("");
            eprintln!("case {i}: {first}\n{e}\n{case:?}\n");
        }
    }
    eprintln!("{failures} failures in {n} cases");
}
