//! The demo agent's scripted runs: a deterministic bank-onboarding flow as AG-UI 1.0 events,
//! a pure function of the `RunAgentInput` (no model, no clock, no randomness).
//!
//! Three runs make one onboarding, chosen by [`RunKind::of`]:
//! 1. [`RunKind::Assessment`]: identity check, risk assessment and routing; finishes.
//! 2. [`RunKind::Approval`] (the input's `state.stage` is `"routed"`): asks an advisor for
//!    approval and finishes with an `interrupt` outcome (AGUI.md §1.4).
//! 3. [`RunKind::Opening`] (the input carries `resume[]`): reads the advisor's answer, opens
//!    the account (or records the refusal) and finishes.
//!
//! Every run restates the state with a `STATE_SNAPSHOT` first, so its `STATE_DELTA`s apply
//! whatever state the caller held, then streams text word by word, tool-call arguments in
//! pieces, reasoning, steps and a `CUSTOM` status; ids are derived from the `runId`, so two
//! runs never share a message or tool-call id.

use serde_json::{Value, json};

/// Which part of the onboarding a run plays (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunKind {
    /// Identity check, risk assessment, routing; ends with `RUN_FINISHED` (success).
    Assessment,
    /// Asks for an advisor's approval; ends with `RUN_FINISHED` whose outcome is an interrupt.
    Approval,
    /// Answers the interrupt: opens the account when `approved`, else records the refusal.
    Opening {
        /// The advisor approved: the first `resume` entry is `resolved` and its payload does
        /// not say `"approved": false`.
        approved: bool,
    },
}

impl RunKind {
    /// The run an input asks for: `Opening` when it carries a non-empty `resume` array,
    /// `Approval` when its `state.stage` is `"routed"` (where an assessment run leaves the
    /// state), `Assessment` otherwise. `input` is a validated `RunAgentInput`.
    pub fn of(input: &Value) -> RunKind {
        if let Some(first) = input["resume"].as_array().and_then(|r| r.first()) {
            let approved =
                first["status"] == "resolved" && first["payload"]["approved"] != json!(false);
            return RunKind::Opening { approved };
        }
        match input["state"]["stage"].as_str() {
            Some("routed") => RunKind::Approval,
            _ => RunKind::Assessment,
        }
    }
}

/// The customer every run is about.
const CUSTOMER: (&str, &str) = ("C-1042", "Ada Lovelace");
/// The account number the opening run assigns.
const ACCOUNT_NUMBER: &str = "ACC-1042-0001";
/// The advisor routing assigns.
const ADVISOR: &str = "Grace Hopper";
/// Longest piece of tool-call arguments per `TOOL_CALL_ARGS`, in characters.
const ARGS_PIECE: usize = 12;

/// The events of one run for `input` (a validated `RunAgentInput`): `RUN_STARTED` with the
/// input's `threadId`, `runId` (and `parentRunId` when given) to the terminal `RUN_FINISHED`.
/// Each event is a JSON object ready to be written as one SSE `data:` line.
pub fn run_events(input: &Value) -> Vec<Value> {
    let thread_id = input["threadId"].as_str().unwrap_or_default();
    let run_id = input["runId"].as_str().unwrap_or_default();
    let mut s = Script::new(thread_id, run_id);
    let mut started = json!({"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id});
    if let Some(parent) = input.get("parentRunId") {
        started["parentRunId"] = parent.clone();
    }
    s.push(started);
    match RunKind::of(input) {
        RunKind::Assessment => assessment(&mut s),
        RunKind::Approval => approval(&mut s),
        RunKind::Opening { approved } => opening(&mut s, approved),
    }
    s.events
}

/// The state before any run: nothing assessed yet.
fn initial_state() -> Value {
    json!({
        "customer": {"id": CUSTOMER.0, "name": CUSTOMER.1},
        "stage": "identity_check",
        "identityVerified": false,
        "riskScore": 50,
        "allocation": {"equities": 40, "bonds": 40, "cash": 20},
        "advisor": null,
        "account": null
    })
}

/// The state an assessment run ends in (and an approval run starts from).
fn routed_state() -> Value {
    let mut state = initial_state();
    state["stage"] = json!("routed");
    state["identityVerified"] = json!(true);
    state["riskScore"] = json!(37);
    state["allocation"] = json!({"equities": 60, "bonds": 30, "cash": 10});
    state["advisor"] = json!(ADVISOR);
    state
}

/// Run 1: identity check, risk assessment, routing.
fn assessment(s: &mut Script) {
    s.push(json!({"type": "STATE_SNAPSHOT", "snapshot": initial_state()}));
    s.status("started", "Onboarding started");
    s.step("identity_check", |s| {
        s.reasoning(
            "The customer wants a new account. Before anything else I must verify their \
             identity against the document on file.",
        );
        let m = s.text("Welcome, Ada. I'll start by checking your identity document.");
        s.tool_call(
            "verify_identity",
            &m,
            json!({"customerId": CUSTOMER.0, "document": "passport", "country": "GB"}),
            json!({"verified": true, "method": "passport", "matchScore": 0.98}),
        );
        s.delta(json!([
            {"op": "replace", "path": "/identityVerified", "value": true},
            {"op": "replace", "path": "/stage", "value": "risk_assessment"}
        ]));
    });
    s.step("risk_assessment", |s| {
        let m = s.text("Your identity is confirmed. Now assessing your risk profile.");
        s.tool_call(
            "assess_risk",
            &m,
            json!({"customerId": CUSTOMER.0, "horizonYears": 15, "income": "stable"}),
            json!({"riskScore": 37, "profile": "balanced-growth"}),
        );
        for (score, equities, bonds, cash) in [(45, 50, 35, 15), (41, 55, 33, 12), (37, 60, 30, 10)]
        {
            s.delta(json!([
                {"op": "replace", "path": "/riskScore", "value": score},
                {"op": "replace", "path": "/allocation",
                 "value": {"equities": equities, "bonds": bonds, "cash": cash}}
            ]));
        }
        s.status("risk_assessed", "Risk profile: balanced growth (score 37)");
    });
    s.step("routing", |s| {
        s.text(&format!(
            "With a risk score of 37 I suggest a balanced-growth portfolio: 60% equities, 30% \
             bonds, 10% cash. I've routed your file to {ADVISOR}, who approves new accounts."
        ));
        s.delta(json!([
            {"op": "replace", "path": "/advisor", "value": ADVISOR},
            {"op": "replace", "path": "/stage", "value": "routed"}
        ]));
    });
    let (thread_id, run_id) = (s.thread_id.clone(), s.run_id.clone());
    s.push(json!({
        "type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id,
        "result": {"stage": "routed", "riskScore": 37}
    }));
}

/// Run 2: asks for the advisor's approval and pauses on an interrupt.
fn approval(s: &mut Script) {
    s.push(json!({"type": "STATE_SNAPSHOT", "snapshot": routed_state()}));
    s.step("advisor_approval", |s| {
        s.text(&format!(
            "Opening the account needs {ADVISOR}'s approval. I've sent the request and will \
             continue once it is answered."
        ));
        s.delta(json!([{"op": "replace", "path": "/stage", "value": "awaiting_approval"}]));
        s.status("awaiting_approval", "Waiting for advisor approval");
    });
    let (thread_id, run_id) = (s.thread_id.clone(), s.run_id.clone());
    s.push(json!({
        "type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id,
        "outcome": {"type": "interrupt", "interrupts": [{
            "id": format!("{run_id}:approval"),
            "reason": "advisor_approval",
            "message": format!(
                "{ADVISOR}: approve opening a balanced-growth account for {} (risk score 37)?",
                CUSTOMER.1
            ),
            "responseSchema": {
                "type": "object",
                "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
                "required": ["approved"]
            }
        }]}
    }));
}

/// Run 3: resumes after the interrupt and opens the account, or records the refusal.
fn opening(s: &mut Script, approved: bool) {
    let mut state = routed_state();
    state["stage"] = json!("awaiting_approval");
    s.push(json!({"type": "STATE_SNAPSHOT", "snapshot": state}));
    s.step("advisor_approval", |s| {
        s.reasoning(if approved {
            "The advisor approved. Every check has passed, so the account can be opened."
        } else {
            "The advisor did not approve. The account must not be opened."
        });
        let stage = if approved { "approved" } else { "declined" };
        s.delta(json!([{"op": "replace", "path": "/stage", "value": stage}]));
    });
    let (thread_id, run_id) = (s.thread_id.clone(), s.run_id.clone());
    if !approved {
        s.text(&format!(
            "{ADVISOR} did not approve the account, so I have not opened it. Your file stays \
             on record."
        ));
        s.status("declined", "Advisor declined");
        s.push(json!({
            "type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id,
            "result": {"opened": false}
        }));
        return;
    }
    s.step("account_opening", |s| {
        let m = s.text("Approved. Opening your account now.");
        s.tool_call(
            "open_account",
            &m,
            json!({"customerId": CUSTOMER.0, "product": "balanced-growth",
                   "allocation": {"equities": 60, "bonds": 30, "cash": 10}}),
            json!({"accountNumber": ACCOUNT_NUMBER, "status": "open"}),
        );
        s.delta(json!([
            {"op": "replace", "path": "/account",
             "value": {"number": ACCOUNT_NUMBER, "product": "balanced-growth"}},
            {"op": "replace", "path": "/stage", "value": "opened"}
        ]));
        s.text(&format!(
            "Your account {ACCOUNT_NUMBER} is open, invested 60% in equities, 30% in bonds and \
             10% in cash. Welcome aboard!"
        ));
        s.status("opened", "Account opened");
    });
    s.push(json!({
        "type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id,
        "result": {"opened": true, "accountNumber": ACCOUNT_NUMBER}
    }));
}

/// Builds one run's events; numbers the ids it mints from the run id.
struct Script {
    thread_id: String,
    run_id: String,
    /// Ids minted so far (messages, tool calls, reasoning), for unique suffixes.
    minted: usize,
    events: Vec<Value>,
}

impl Script {
    fn new(thread_id: &str, run_id: &str) -> Self {
        Script {
            thread_id: thread_id.to_string(),
            run_id: run_id.to_string(),
            minted: 0,
            events: Vec::new(),
        }
    }

    fn push(&mut self, event: Value) {
        self.events.push(event);
    }

    /// A fresh id, `<runId>:<kind><n>`.
    fn mint(&mut self, kind: &str) -> String {
        self.minted += 1;
        format!("{}:{kind}{}", self.run_id, self.minted)
    }

    /// `STEP_STARTED`, what `body` adds, `STEP_FINISHED`.
    fn step(&mut self, name: &str, body: impl FnOnce(&mut Self)) {
        self.push(json!({"type": "STEP_STARTED", "stepName": name}));
        body(self);
        self.push(json!({"type": "STEP_FINISHED", "stepName": name}));
    }

    /// An assistant message streamed a word per `TEXT_MESSAGE_CONTENT`; returns its id.
    fn text(&mut self, text: &str) -> String {
        let id = self.mint("msg");
        self.push(json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}));
        for word in text.split_inclusive(' ') {
            self.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": word}));
        }
        self.push(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
        id
    }

    /// A reasoning span holding one reasoning message streamed a word per event.
    fn reasoning(&mut self, text: &str) {
        let span = self.mint("reasoning");
        let message = self.mint("thought");
        self.push(json!({"type": "REASONING_START", "messageId": span}));
        self.push(
            json!({"type": "REASONING_MESSAGE_START", "messageId": message,
                         "role": "reasoning"}),
        );
        for word in text.split_inclusive(' ') {
            self.push(
                json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": message,
                             "delta": word}),
            );
        }
        self.push(json!({"type": "REASONING_MESSAGE_END", "messageId": message}));
        self.push(json!({"type": "REASONING_END", "messageId": span}));
    }

    /// A backend tool call of the assistant message `parent`: its JSON arguments streamed in
    /// pieces of [`ARGS_PIECE`] characters, then the agent's own `TOOL_CALL_RESULT`.
    fn tool_call(&mut self, name: &str, parent: &str, args: Value, result: Value) {
        let call = self.mint("call");
        self.push(
            json!({"type": "TOOL_CALL_START", "toolCallId": call, "toolCallName": name,
                         "parentMessageId": parent}),
        );
        let args = args.to_string();
        let chars: Vec<char> = args.chars().collect();
        for piece in chars.chunks(ARGS_PIECE) {
            let delta: String = piece.iter().collect();
            self.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": delta}));
        }
        self.push(json!({"type": "TOOL_CALL_END", "toolCallId": call}));
        let result_id = self.mint("result");
        self.push(
            json!({"type": "TOOL_CALL_RESULT", "messageId": result_id, "toolCallId": call,
                         "content": result.to_string(), "role": "tool"}),
        );
    }

    /// A `STATE_DELTA` of RFC 6902 operations.
    fn delta(&mut self, ops: Value) {
        self.push(json!({"type": "STATE_DELTA", "delta": ops}));
    }

    /// A `CUSTOM` event `onboarding_status` telling a UI where the flow stands.
    fn status(&mut self, stage: &str, label: &str) {
        self.push(json!({"type": "CUSTOM", "name": "onboarding_status",
                         "value": {"stage": stage, "label": label}}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::validate_value;
    use crate::fold::ThreadFold;

    fn input(extra: Value) -> Value {
        let mut input = json!({"threadId": "t1", "runId": "r1", "messages": []});
        if let (Some(obj), Value::Object(extra)) = (input.as_object_mut(), extra) {
            obj.extend(extra);
        }
        input
    }

    /// Checks a run as the broker checks a publish on a fresh thread (the schema, the
    /// client's order rules, every `STATE_DELTA` applying) and returns the folded state.
    fn check_run(events: &[Value]) -> Value {
        for (i, e) in events.iter().enumerate() {
            validate_value(e.clone(), None).unwrap_or_else(|err| panic!("event {i}: {err:?}"));
        }
        let fold = ThreadFold::new()
            .check_batch(events)
            .unwrap_or_else(|err| panic!("{err}"));
        fold.fold().state().clone()
    }

    #[test]
    fn the_three_runs_are_valid_and_end_where_the_next_begins() {
        let first = run_events(&input(json!({})));
        assert_eq!(check_run(&first), routed_state());
        assert_eq!(first.last().unwrap()["type"], "RUN_FINISHED");
        assert!(first.last().unwrap().get("outcome").is_none());

        let second_input = input(json!({"runId": "r2", "state": check_run(&first)}));
        assert_eq!(RunKind::of(&second_input), RunKind::Approval);
        let second = run_events(&second_input);
        assert_eq!(check_run(&second)["stage"], "awaiting_approval");
        let end = second.last().unwrap();
        assert_eq!(end["outcome"]["type"], "interrupt");
        assert_eq!(end["outcome"]["interrupts"][0]["id"], "r2:approval");

        let resume = json!([{"interruptId": "r2:approval", "status": "resolved",
                             "payload": {"approved": true}}]);
        let third = run_events(&input(json!({"runId": "r3", "resume": resume})));
        let state = check_run(&third);
        assert_eq!(state["stage"], "opened");
        assert_eq!(state["account"]["number"], ACCOUNT_NUMBER);
        assert_eq!(third.last().unwrap()["result"]["opened"], true);
    }

    #[test]
    fn a_refused_or_cancelled_interrupt_opens_nothing() {
        for entry in [
            json!({"interruptId": "x", "status": "resolved", "payload": {"approved": false}}),
            json!({"interruptId": "x", "status": "cancelled"}),
        ] {
            let run = run_events(&input(json!({"resume": [entry]})));
            assert_eq!(check_run(&run)["stage"], "declined");
            assert!(!run.iter().any(|e| e["type"] == "TOOL_CALL_START"));
        }
    }

    #[test]
    fn runs_echo_the_ids_and_are_deterministic() {
        let i = input(json!({"threadId": "th", "runId": "ru", "parentRunId": "p0"}));
        let run = run_events(&i);
        assert_eq!(run, run_events(&i));
        assert_eq!(
            run[0],
            json!({"type": "RUN_STARTED", "threadId": "th", "runId": "ru", "parentRunId": "p0"})
        );
        let end = run.last().unwrap();
        assert_eq!(
            (&end["threadId"], &end["runId"]),
            (&json!("th"), &json!("ru"))
        );
        for kind in [
            "STEP_STARTED",
            "TEXT_MESSAGE_CONTENT",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_RESULT",
            "STATE_SNAPSHOT",
            "STATE_DELTA",
            "CUSTOM",
            "REASONING_MESSAGE_CONTENT",
        ] {
            assert!(run.iter().any(|e| e["type"] == kind), "no {kind}");
        }
    }
}
