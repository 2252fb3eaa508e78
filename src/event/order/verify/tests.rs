//! The verifier's clone cost on long runs: owner maps shared by clones (persistent maps: a
//! write into a clone copies a path, not the map; the original never sees it).

use super::{OrderVerifier, Owners};
use serde_json::{Value, json};

/// Whether two owner sets are the same maps (not copies).
fn shared(a: &Owners, b: &Owners) -> bool {
    a.message.ptr_eq(&b.message)
        && a.tool_call.ptr_eq(&b.tool_call)
        && a.activity.ptr_eq(&b.activity)
        && a.reasoning.ptr_eq(&b.reasoning)
}

/// A verifier after a run that streamed `messages` text messages (each started, one content
/// delta, ended).
fn long_run(messages: usize) -> OrderVerifier {
    let mut v = OrderVerifier::default();
    let mut ok = |e: Value| v.verify(&e).expect("a valid event");
    ok(json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}));
    for i in 0..messages {
        let id = format!("m{i}");
        ok(json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}));
        ok(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": "hi"}));
        ok(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
    }
    v
}

#[test]
fn clones_share_the_run_owner_maps_and_a_write_stays_in_its_clone() {
    let mut original = long_run(1_000);
    let open = json!({"type": "TEXT_MESSAGE_START", "messageId": "open", "role": "assistant"});
    original.verify(&open).expect("a new message");
    assert_eq!(original.owners.message.len(), 1_001);
    let mut clone = original.clone();
    assert!(
        shared(&original.owners, &clone.owners),
        "a clone copied 1,001 owners"
    );
    // Content deltas record no owner: still shared.
    clone
        .verify(&json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "open", "delta": "x"}))
        .expect("content of the open message");
    assert!(shared(&original.owners, &clone.owners));
    // A START records one: in the clone only, the original is untouched.
    let start = json!({"type": "TEXT_MESSAGE_START", "messageId": "new", "role": "assistant"});
    clone.verify(&start).expect("a new message");
    assert!(!shared(&original.owners, &clone.owners));
    assert_eq!(original.owners.message.len(), 1_001);
    assert_eq!(clone.owners.message.len(), 1_002);
    assert!(!original.owners.message.contains_key("new"));
    original
        .verify(&start)
        .expect("the original never saw the clone's START");
}

#[test]
fn a_refused_event_leaves_the_shared_owners_alone() {
    let original = long_run(10);
    let mut clone = original.clone();
    // A tagged re-open of a message the parent owns: refused, nothing recorded.
    let err = clone.verify(&json!({"type": "TEXT_MESSAGE_START", "messageId": "m3", "role": "assistant", "subagentRunId": "s1"}));
    assert!(err.is_err());
    assert!(shared(&original.owners, &clone.owners));
    assert_eq!(clone, original);
}

/// Every event of `events` through a verifier: where `verify_unchanged` answers, it gives
/// `verify`'s result (same rule) and `verify` recorded nothing. Returns how often it answered.
fn cross_check(events: &[Value]) -> usize {
    let mut v = OrderVerifier::default();
    let mut answered = 0;
    for e in events {
        let mut copy = v.clone();
        let full = copy.verify(e).map_err(|x| x.rule);
        if let Some(fast) = v.verify_unchanged(e) {
            answered += 1;
            assert_eq!(fast.map_err(|x| x.rule), full, "{e}");
            assert_eq!(copy, v, "verify recorded something for {e}");
        }
        let _ = v.verify(e);
    }
    answered
}

#[test]
fn the_shared_check_answers_as_verify_does_for_the_events_that_record_nothing() {
    let stream = vec![
        // Before the first event: not answered (the first event is recorded).
        json!({"type": "STATE_DELTA", "delta": []}),
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "not open"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "ok"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "delta": "no id"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "x", "subagentRunId": null}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "x", "subagentRunId": 7}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "x", "subagentRunId": "s9"}),
        json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s1", "name": "helper"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "f", "subagentRunId": "s1"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": "{", "subagentRunId": "s1"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": "{"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c2", "delta": "{"}),
        json!({"type": "REASONING_START", "messageId": "r1"}),
        json!({"type": "REASONING_MESSAGE_START", "messageId": "rm1", "role": "reasoning"}),
        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "rm1", "delta": "hmm"}),
        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "rm2", "delta": "hmm"}),
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"a": 1}}),
        json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/b", "value": 2}]}),
        json!({"type": "CUSTOM", "name": "n", "value": 1}),
        json!({"type": "RAW", "event": {}}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "ended"}),
        json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "after"}),
        json!({"type": "STATE_DELTA", "delta": []}),
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r2"}),
        json!({"type": "RUN_ERROR", "message": "boom"}),
        json!({"type": "CUSTOM", "name": "after error", "value": 1}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": "}"}),
    ];
    let answered = cross_check(&stream);
    assert!(answered >= 20, "answered only {answered} times");
}
