//! `OrderChecker` rule by rule: each `verifyEvents` check, its code and wording, the
//! transactional contract, and the open constructs a prelude restates.

mod attribution;
#[path = "../common/order_check.rs"]
mod order_check;

use agui_fanout::event::order::{
    OpenItem, OpenKind, OrderChecker, OrderViolation, RunLifecycle, rule,
};
use proptest::prelude::*;
use serde_json::Value;
use serde_json::json;

fn rs(run: &str) -> Value {
    json!({"type": "RUN_STARTED", "threadId": "t", "runId": run})
}
fn rf(run: &str) -> Value {
    json!({"type": "RUN_FINISHED", "threadId": "t", "runId": run})
}
fn re() -> Value {
    json!({"type": "RUN_ERROR", "message": "boom"})
}
fn tms(id: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"})
}
fn tmc(id: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": "x"})
}
fn tme(id: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_END", "messageId": id})
}
fn tcs(id: &str) -> Value {
    json!({"type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": "f"})
}
fn tca(id: &str) -> Value {
    json!({"type": "TOOL_CALL_ARGS", "toolCallId": id, "delta": "{}"})
}
fn tce(id: &str) -> Value {
    json!({"type": "TOOL_CALL_END", "toolCallId": id})
}
fn ss(name: &str) -> Value {
    json!({"type": "STEP_STARTED", "stepName": name})
}
fn sf(name: &str) -> Value {
    json!({"type": "STEP_FINISHED", "stepName": name})
}
fn rstart(id: &str) -> Value {
    json!({"type": "REASONING_START", "messageId": id})
}
fn rend(id: &str) -> Value {
    json!({"type": "REASONING_END", "messageId": id})
}
fn rms(id: &str) -> Value {
    json!({"type": "REASONING_MESSAGE_START", "messageId": id, "role": "reasoning"})
}
fn rmc(id: &str) -> Value {
    json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": id, "delta": "x"})
}
fn rme(id: &str) -> Value {
    json!({"type": "REASONING_MESSAGE_END", "messageId": id})
}
fn sub_start(id: &str) -> Value {
    json!({"type": "SUBAGENT_STARTED", "subagentRunId": id, "name": "helper"})
}
fn sub_fin(id: &str) -> Value {
    json!({"type": "SUBAGENT_FINISHED", "subagentRunId": id})
}
fn tagged(mut event: Value, tag: &str) -> Value {
    event["subagentRunId"] = tag.into();
    event
}
fn text_chunk(id: Option<&str>, delta: &str) -> Value {
    let mut chunk = json!({"type": "TEXT_MESSAGE_CHUNK", "delta": delta});
    if let Some(id) = id {
        chunk["messageId"] = id.into();
    }
    chunk
}

/// Feeds `events` one by one; on the first refusal, asserts the state is unchanged.
fn feed(events: &[Value]) -> (OrderChecker, Option<(usize, OrderViolation)>) {
    let mut checker = OrderChecker::new();
    for (index, event) in events.iter().enumerate() {
        let before = checker.clone();
        let checked = order_check::check_both_ways(&mut checker, event);
        if let Err(violation) = checked {
            assert_eq!(checker, before, "a refused event changes nothing");
            return (checker, Some((index, violation)));
        }
    }
    (checker, None)
}

#[track_caller]
fn passes(events: &[Value]) -> OrderChecker {
    let (checker, failure) = feed(events);
    assert_eq!(failure, None);
    checker
}

#[track_caller]
fn fails_at(events: &[Value], index: usize, code: &str) -> String {
    let (_, failure) = feed(events);
    let (at, violation) = failure.expect("the stream must be refused");
    assert_eq!((at, violation.rule), (index, code), "{}", violation.message);
    assert_eq!(violation.to_string(), violation.message);
    violation.message
}

#[test]
fn first_event_must_be_run_started_or_run_error() {
    let msg = fails_at(&[tms("m")], 0, rule::FIRST_EVENT_MUST_BE_RUN_STARTED);
    assert_eq!(msg, "First event must be 'RUN_STARTED'");
    fails_at(
        &[json!({"type": "STATE_SNAPSHOT", "snapshot": {}})],
        0,
        rule::FIRST_EVENT_MUST_BE_RUN_STARTED,
    );
    // RUN_FINISHED first is refused by the first-event rule too.
    fails_at(&[rf("r")], 0, rule::FIRST_EVENT_MUST_BE_RUN_STARTED);
    passes(&[]);
    passes(&[rs("r")]);
    let checker = passes(&[re()]);
    assert!(matches!(
        checker.open().run(),
        RunLifecycle::Errored {
            run_started: None,
            run_finished: None,
            ..
        }
    ));
    // A refused first event leaves the stream at its start: a RUN_STARTED may follow.
    let mut checker = OrderChecker::new();
    assert!(checker.check(&tms("m")).is_err());
    checker.check(&rs("r")).unwrap();
}

#[test]
fn run_already_active() {
    let msg = fails_at(&[rs("a"), rs("b")], 1, rule::RUN_ALREADY_ACTIVE);
    assert_eq!(
        msg,
        "Cannot send 'RUN_STARTED' while a run is still active. The previous run must be \
         finished with 'RUN_FINISHED' before starting a new run."
    );
}

#[test]
fn run_already_finished() {
    let msg = fails_at(&[rs("a"), rf("a"), tms("m")], 2, rule::RUN_ALREADY_FINISHED);
    assert_eq!(
        msg,
        "Cannot send event type 'TEXT_MESSAGE_START': The run has already finished with \
         'RUN_FINISHED'. Start a new run with 'RUN_STARTED'."
    );
    fails_at(&[rs("a"), rf("a"), rf("a")], 2, rule::RUN_ALREADY_FINISHED);
    fails_at(
        &[rs("a"), rf("a"), json!({"type": "RAW", "event": 1})],
        2,
        rule::RUN_ALREADY_FINISHED,
    );
}

#[test]
fn run_already_errored() {
    let msg = fails_at(
        &[
            rs("a"),
            re(),
            json!({"type": "CUSTOM", "name": "n", "value": 1}),
        ],
        2,
        rule::RUN_ALREADY_ERRORED,
    );
    assert_eq!(
        msg,
        "Cannot send event type 'CUSTOM': The run has already errored with 'RUN_ERROR'. No \
         further events can be sent."
    );
    fails_at(&[rs("a"), re(), re()], 2, rule::RUN_ALREADY_ERRORED);
    fails_at(&[re(), rf("a")], 1, rule::RUN_ALREADY_ERRORED);
    passes(&[rs("a"), re(), rs("b"), rf("b")]);
    passes(&[re(), rs("b"), rf("b")]);
}

#[test]
fn late_run_error_after_run_finished_is_allowed() {
    let checker = passes(&[rs("a"), rf("a"), re()]);
    let RunLifecycle::Errored {
        run_started: Some(started),
        run_finished: Some(finished),
        run_error,
    } = checker.open().run()
    else {
        panic!("errored after finishing: {:?}", checker.open().run());
    };
    assert_eq!(**started, rs("a"));
    assert_eq!(**finished, rf("a"));
    assert_eq!(**run_error, re());
    passes(&[rs("a"), rf("a"), re(), rs("b"), rf("b")]);
}

#[test]
fn run_error_is_allowed_with_anything_open_and_the_next_run_starts_clean() {
    let events = [
        rs("a"),
        sub_start("s1"),
        ss("plan"),
        tms("m1"),
        tcs("c1"),
        rstart("r1"),
        rms("r1"),
        text_chunk(Some("m2"), "chunked"),
        re(),
    ];
    let checker = passes(&events);
    let open = checker.open();
    // The chunk lane was closed (its END synthesised) before RUN_ERROR; the rest stays
    // recorded as it was when the run errored.
    assert_eq!(
        open.text_messages().map(OpenItem::id).collect::<Vec<_>>(),
        ["m1"]
    );
    assert_eq!(open.tool_calls().count(), 1);
    assert_eq!(open.steps().count(), 1);
    assert_eq!(open.subagents().count(), 1);
    assert!(checker.open_lanes().is_empty());
    let mut more = events.to_vec();
    more.extend([
        rs("b"),
        tms("m1"),
        tme("m1"),
        ss("plan"),
        sf("plan"),
        rf("b"),
    ]);
    let checker = passes(&more);
    assert!(checker.open().is_empty());
    assert!(matches!(
        checker.open().run(),
        RunLifecycle::Finished { .. }
    ));
}

#[test]
fn text_message_rules() {
    let msg = fails_at(&[rs("a"), tmc("m1")], 1, rule::MESSAGE_NOT_OPEN);
    assert_eq!(
        msg,
        "Cannot send 'TEXT_MESSAGE_CONTENT' event: No active text message found with ID \
         'm1'. Start a text message with 'TEXT_MESSAGE_START' first."
    );
    let msg = fails_at(&[rs("a"), tme("m1")], 1, rule::MESSAGE_NOT_OPEN);
    assert_eq!(
        msg,
        "Cannot send 'TEXT_MESSAGE_END' event: No active text message found with ID 'm1'. \
         A 'TEXT_MESSAGE_START' event must be sent first."
    );
    let msg = fails_at(
        &[rs("a"), tms("m1"), tms("m1")],
        2,
        rule::MESSAGE_ALREADY_OPEN,
    );
    assert_eq!(
        msg,
        "Cannot send 'TEXT_MESSAGE_START' event: A text message with ID 'm1' is already in \
         progress. Complete it with 'TEXT_MESSAGE_END' first."
    );
    fails_at(
        &[rs("a"), tms("m1"), tme("m1"), tmc("m1")],
        3,
        rule::MESSAGE_NOT_OPEN,
    );
    // Re-opening a closed id is legal; interleaving too.
    passes(&[
        rs("a"),
        tms("m1"),
        tmc("m1"),
        tme("m1"),
        tms("m1"),
        tms("m2"),
        tmc("m1"),
        tmc("m2"),
        tme("m1"),
        tme("m2"),
        rf("a"),
    ]);
}

#[test]
fn tool_call_rules() {
    let msg = fails_at(&[rs("a"), tca("c1")], 1, rule::TOOL_CALL_NOT_OPEN);
    assert_eq!(
        msg,
        "Cannot send 'TOOL_CALL_ARGS' event: No active tool call found with ID 'c1'. Start a \
         tool call with 'TOOL_CALL_START' first."
    );
    let msg = fails_at(&[rs("a"), tce("c1")], 1, rule::TOOL_CALL_NOT_OPEN);
    assert_eq!(
        msg,
        "Cannot send 'TOOL_CALL_END' event: No active tool call found with ID 'c1'. A \
         'TOOL_CALL_START' event must be sent first."
    );
    let msg = fails_at(
        &[rs("a"), tcs("c1"), tcs("c1")],
        2,
        rule::TOOL_CALL_ALREADY_OPEN,
    );
    assert_eq!(
        msg,
        "Cannot send 'TOOL_CALL_START' event: A tool call with ID 'c1' is already in \
         progress. Complete it with 'TOOL_CALL_END' first."
    );
    // TOOL_CALL_RESULT is never checked: unknown id, or after END.
    let result = |call: &str| json!({"type": "TOOL_CALL_RESULT", "messageId": format!("tm-{call}"), "toolCallId": call, "content": "ok"});
    passes(&[
        rs("a"),
        result("nobody"),
        tcs("c1"),
        tca("c1"),
        result("c1"),
        tce("c1"),
        result("c1"),
        rf("a"),
    ]);
}

#[test]
fn step_rules() {
    let msg = fails_at(&[rs("a"), sf("s")], 1, rule::STEP_NOT_OPEN);
    assert_eq!(
        msg,
        "Cannot send 'STEP_FINISHED' for step \"s\" that was not started"
    );
    let msg = fails_at(&[rs("a"), ss("s"), ss("s")], 2, rule::STEP_ALREADY_OPEN);
    assert_eq!(msg, "Step \"s\" is already active for 'STEP_STARTED'");
    let msg = fails_at(
        &[rs("a"), tagged(ss("s"), "x"), tagged(ss("s"), "x")],
        2,
        rule::STEP_ALREADY_OPEN,
    );
    assert_eq!(
        msg,
        "Step \"s\" is already active for 'STEP_STARTED' in subagent 'x'"
    );
    // Keyed by owner + name: the parent and a subagent may both run "tools".
    passes(&[
        rs("a"),
        ss("tools"),
        tagged(ss("tools"), "s1"),
        tagged(sf("tools"), "s1"),
        sf("tools"),
        rf("a"),
    ]);
    let msg = fails_at(
        &[rs("a"), ss("tools"), tagged(sf("tools"), "s1")],
        2,
        rule::STEP_OWNER_MISMATCH,
    );
    assert_eq!(
        msg,
        "Cannot send 'STEP_FINISHED' for step \"tools\" attributed to subagent 's1': that \
         step is open under the parent agent. A step must be finished by whoever started it."
    );
    let msg = fails_at(
        &[rs("a"), tagged(ss("tools"), "s1"), sf("tools")],
        2,
        rule::STEP_OWNER_MISMATCH,
    );
    assert!(msg.contains("attributed to the parent agent: that step is open under subagent 's1'"));
}

#[test]
fn reasoning_rules() {
    // Spans and messages are tracked apart: one id may name both.
    passes(&[
        rs("a"),
        rstart("r1"),
        rms("r1"),
        rmc("r1"),
        rme("r1"),
        rend("r1"),
        rf("a"),
    ]);
    let msg = fails_at(
        &[rs("a"), rstart("r1"), rmc("r1")],
        2,
        rule::REASONING_MESSAGE_NOT_OPEN,
    );
    assert_eq!(
        msg,
        "Cannot send 'REASONING_MESSAGE_CONTENT' event: No active reasoning message found \
         with ID 'r1'. Start a reasoning message with 'REASONING_MESSAGE_START' first."
    );
    fails_at(&[rs("a"), rme("r1")], 1, rule::REASONING_MESSAGE_NOT_OPEN);
    let msg = fails_at(
        &[rs("a"), rms("r1"), rend("r1")],
        2,
        rule::REASONING_SPAN_NOT_OPEN,
    );
    assert_eq!(
        msg,
        "Cannot send 'REASONING_END' event: No active reasoning span found with ID 'r1'. A \
         'REASONING_START' event must be sent first."
    );
    let msg = fails_at(
        &[rs("a"), rstart("r"), rstart("r")],
        2,
        rule::REASONING_SPAN_ALREADY_OPEN,
    );
    assert!(msg.starts_with("Cannot send 'REASONING_START' event: A reasoning span with ID 'r'"));
    let msg = fails_at(
        &[rs("a"), rms("r"), rms("r")],
        2,
        rule::REASONING_MESSAGE_ALREADY_OPEN,
    );
    assert!(msg.starts_with("Cannot send 'REASONING_MESSAGE_START' event: A reasoning message"));
    // Re-opening a closed reasoning message is legal.
    passes(&[rs("a"), rms("r"), rme("r"), rms("r"), rme("r"), rf("a")]);
}

#[test]
fn run_finished_checks_open_constructs_in_the_client_order() {
    let cases: [(Vec<Value>, &str, &str); 6] = [
        (
            vec![tms("m1"), ss("plan"), tagged(ss("plan"), "s9")],
            rule::RUN_FINISHED_WITH_OPEN_STEPS,
            "Cannot send 'RUN_FINISHED' while steps are still active: plan, plan (subagent \
             's9')",
        ),
        (
            vec![rms("r1"), tms("m1"), tms("m2")],
            rule::RUN_FINISHED_WITH_OPEN_MESSAGES,
            "Cannot send 'RUN_FINISHED' while text messages are still active: m1, m2",
        ),
        (
            vec![rstart("r1"), rms("r2")],
            rule::RUN_FINISHED_WITH_OPEN_REASONING_MESSAGES,
            "Cannot send 'RUN_FINISHED' while reasoning messages are still active: r2",
        ),
        (
            vec![tcs("c1"), rstart("r1")],
            rule::RUN_FINISHED_WITH_OPEN_REASONING_SPANS,
            "Cannot send 'RUN_FINISHED' while reasoning spans are still active: r1",
        ),
        (
            vec![sub_start("s1"), tcs("c1")],
            rule::RUN_FINISHED_WITH_OPEN_TOOL_CALLS,
            "Cannot send 'RUN_FINISHED' while tool calls are still active: c1",
        ),
        (
            vec![sub_start("s1")],
            rule::RUN_FINISHED_WITH_OPEN_SUBAGENTS,
            "Cannot send 'RUN_FINISHED' while subagents are still active: s1",
        ),
    ];
    for (opened, code, message) in cases {
        let mut events = vec![rs("a")];
        events.extend(opened);
        events.push(rf("a"));
        let at = events.len() - 1;
        assert_eq!(fails_at(&events, at, code), message);
    }
    // A chunk lane is closed by RUN_FINISHED itself, so it never trips the check.
    passes(&[rs("a"), text_chunk(Some("m1"), "x"), rf("a")]);
}

#[test]
fn subagent_lifecycle_rules() {
    let msg = fails_at(
        &[rs("a"), sub_start("s1"), sub_start("s1")],
        2,
        rule::SUBAGENT_ALREADY_ACTIVE,
    );
    assert_eq!(
        msg,
        "Cannot send 'SUBAGENT_STARTED': subagent 's1' is already active. Finish it with \
         'SUBAGENT_FINISHED' first."
    );
    let msg = fails_at(
        &[rs("a"), sub_start("s1"), sub_fin("s1"), sub_start("s1")],
        3,
        rule::SUBAGENT_ALREADY_FINISHED,
    );
    assert!(msg.contains("has already finished in this run"));
    let child = json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s2", "name": "n", "parentSubagentRunId": "s1"});
    let msg = fails_at(
        &[rs("a"), child.clone()],
        1,
        rule::SUBAGENT_PARENT_NOT_STARTED,
    );
    assert_eq!(
        msg,
        "Cannot send 'SUBAGENT_STARTED': parentSubagentRunId 's1' has not been started in \
         this run."
    );
    // A parent that already finished in this run is fine.
    passes(&[
        rs("a"),
        sub_start("s1"),
        sub_fin("s1"),
        child.clone(),
        sub_fin("s2"),
        rf("a"),
    ]);
    let msg = fails_at(&[rs("a"), sub_fin("s1")], 1, rule::SUBAGENT_NOT_ACTIVE);
    assert_eq!(
        msg,
        "Cannot send 'SUBAGENT_FINISHED': no active subagent found with ID 's1'. A \
         'SUBAGENT_STARTED' event must be sent first."
    );
    let error = json!({"type": "SUBAGENT_ERROR", "subagentRunId": "s1", "message": "x"});
    fails_at(&[rs("a"), error.clone()], 1, rule::SUBAGENT_NOT_ACTIVE);
    passes(&[rs("a"), sub_start("s1"), error, rf("a")]);
    // A new run forgets the closed subagents.
    passes(&[
        rs("a"),
        sub_start("s1"),
        sub_fin("s1"),
        rf("a"),
        rs("b"),
        sub_start("s1"),
    ]);
    // Shapes the schema refuses, checked as the client does.
    let cases = [
        (
            json!({"type": "SUBAGENT_STARTED", "name": "n"}),
            rule::SUBAGENT_MISSING_ID,
            "Cannot send 'SUBAGENT_STARTED' without a 'subagentRunId'.",
        ),
        (
            json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s"}),
            rule::SUBAGENT_MISSING_NAME,
            "Cannot send 'SUBAGENT_STARTED' without a 'name'.",
        ),
        (
            json!({"type": "SUBAGENT_STARTED", "subagentRunId": null, "name": "n"}),
            rule::SUBAGENT_RUN_ID_NULL,
            "Cannot send 'SUBAGENT_STARTED' with 'subagentRunId: null'. The field is optional \
             — omit it entirely.",
        ),
        (
            json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s", "name": "n", "description": null}),
            rule::SUBAGENT_FIELD_NULL,
            "Cannot send 'SUBAGENT_STARTED' with 'description: null'. The field is optional — \
             omit it entirely.",
        ),
        (
            json!({"type": "SUBAGENT_ERROR", "subagentRunId": "s"}),
            rule::SUBAGENT_MISSING_MESSAGE,
            "Cannot send 'SUBAGENT_ERROR' without a 'message'.",
        ),
        (
            json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s", "outcome": {"type": "done"}}),
            rule::SUBAGENT_OUTCOME_INVALID,
            "Cannot send 'SUBAGENT_FINISHED' with outcome type 'done'. The outcome is either \
             { type: \"success\" } or { type: \"suspended\" }.",
        ),
        (
            json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s", "outcome": {"type": "suspended", "interruptIds": null}}),
            rule::SUBAGENT_FIELD_NULL,
            "Cannot send 'SUBAGENT_FINISHED' with 'outcome.interruptIds: null'. The field is \
             optional — omit it entirely.",
        ),
        (
            json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s", "outcome": {"type": "suspended", "interruptIds": [1]}}),
            rule::SUBAGENT_OUTCOME_INVALID,
            "Cannot send 'SUBAGENT_FINISHED' with a non-string entry in \
             'outcome.interruptIds'. Interrupt ids are strings.",
        ),
        (
            json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s", "outcome": []}),
            rule::SUBAGENT_OUTCOME_INVALID,
            "Cannot send 'SUBAGENT_FINISHED' with outcome type 'undefined'. The outcome is \
             either { type: \"success\" } or { type: \"suspended\" }.",
        ),
    ];
    for (event, code, message) in cases {
        assert_eq!(fails_at(&[rs("a"), event], 1, code), message);
    }
}
