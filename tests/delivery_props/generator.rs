//! The case generator: a stream of proptest choices, a state machine emitting valid AG-UI
//! threads (runs, text, tool calls, reasoning, steps, state, failing deltas), and the case
//! strategy (variant, queue limits, retention, simulated clients and their schedule).

use agui_fanout::fold::{ThreadFold, apply_patch};
use proptest::prelude::*;
use serde_json::{Value, json};

// ---- choices ------------------------------------------------------------------------------

/// A stream of choices drawn by proptest; `0` once exhausted, so a shrunk case takes the
/// first (simplest) option everywhere.
pub(crate) struct Choices<'a> {
    pub(crate) data: &'a [u16],
    pub(crate) at: usize,
}

impl<'a> Choices<'a> {
    pub(crate) fn new(data: &'a [u16]) -> Self {
        Choices { data, at: 0 }
    }

    pub(crate) fn next(&mut self) -> u16 {
        let v = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        v
    }

    /// `0..n` (0 when `n <= 1`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            0
        } else {
            usize::from(self.next()) % n
        }
    }

    /// True with `percent`% probability; false for a `0` choice.
    pub(crate) fn chance(&mut self, percent: u16) -> bool {
        self.next() % 100 >= 100 - percent.min(100)
    }

    /// Index of an entry picked by weight; a `0` choice picks the first entry with a weight.
    pub(crate) fn weighted(&mut self, weights: &[u32]) -> usize {
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
pub(crate) struct GenEvent {
    pub(crate) value: Value,
    pub(crate) failing: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunPhase {
    None,
    Running,
    Finished,
    Errored,
}

/// A state machine emitting events that `OrderChecker` accepts (asserted as it goes).
pub(crate) struct Gen<'c, 'd> {
    pub(crate) ch: &'c mut Choices<'d>,
    pub(crate) thread: String,
    pub(crate) allow_failing: bool,
    pub(crate) fold: ThreadFold,
    pub(crate) n: u32,
    pub(crate) phase: RunPhase,
    pub(crate) run_id: String,
    pub(crate) open_text: Vec<String>,
    pub(crate) closed_text: Vec<String>,
    pub(crate) open_tools: Vec<String>,
    pub(crate) ended_tools: Vec<String>,
    pub(crate) open_rmsgs: Vec<String>,
    pub(crate) open_spans: Vec<String>,
    pub(crate) open_steps: Vec<String>,
    pub(crate) assistants: Vec<String>,
    pub(crate) out: Vec<GenEvent>,
}

pub(crate) const TEXT_DELTAS: &[&str] = &[
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
pub(crate) const ARG_DELTAS: &[&str] = &["{\"city\":", "\"Par", "is\"", ",\"n\":", "42", "}", ""];

impl<'c, 'd> Gen<'c, 'd> {
    pub(crate) fn new(ch: &'c mut Choices<'d>, thread: &str, allow_failing: bool) -> Self {
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

    pub(crate) fn fresh(&mut self, prefix: &str) -> String {
        self.n += 1;
        format!("{prefix}{}", self.n)
    }

    pub(crate) fn emit(&mut self, value: Value) {
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

    pub(crate) fn pick<'v>(&mut self, v: &'v [String]) -> &'v String {
        let i = self.ch.below(v.len());
        &v[i]
    }

    pub(crate) fn take(&mut self, v: fn(&mut Self) -> &mut Vec<String>) -> String {
        let len = v(self).len();
        let i = self.ch.below(len);
        v(self).remove(i)
    }

    pub(crate) fn burst(&mut self) -> usize {
        1 + self.ch.below(8)
    }

    pub(crate) fn generate(mut self, target: usize) -> Vec<GenEvent> {
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

    pub(crate) fn run_started(&mut self) {
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

    pub(crate) fn step_running(&mut self) {
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
    pub(crate) fn progress(&mut self) {
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
    pub(crate) fn clean_delta(&mut self) -> Vec<Value> {
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
    pub(crate) fn failing_delta(&mut self) -> Vec<Value> {
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
pub(crate) enum Variant {
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
pub(crate) struct SubCfg {
    /// Publish steps between drains.
    pub(crate) speed: usize,
    /// Chance (%) per drain of stalling for `stall_len` steps.
    pub(crate) stall_pct: u16,
    pub(crate) stall_len: usize,
    /// Chance (%) per step of disconnecting.
    pub(crate) disconnect_pct: u16,
    /// Steps offline after a disconnect (at most).
    pub(crate) offline: usize,
    /// Chance (%) per write of being cut off inside it, after a random number of its events
    /// (the connection drops; the client comes back with the last id it received).
    pub(crate) cut_pct: u16,
    /// First connection with `?from=start` (else no id).
    pub(crate) from_start: bool,
    /// Joins at this percentage of the publish steps.
    pub(crate) join_pct: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub(crate) variant: Variant,
    pub(crate) max_events: usize,
    pub(crate) max_bytes: usize,
    pub(crate) retention: usize,
    pub(crate) n_events: usize,
    pub(crate) script: Vec<u16>,
    pub(crate) subs: Vec<SubCfg>,
    pub(crate) sched: Vec<u16>,
}

pub(crate) fn sub_cfg() -> impl Strategy<Value = SubCfg> {
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

pub(crate) fn case() -> impl Strategy<Value = Case> {
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
