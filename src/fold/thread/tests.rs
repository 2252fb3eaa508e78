//! A content delta read without a value folds and checks as its value does: every recorded
//! stream and conformance stream, event by event and in batches, both ways.

use super::ThreadFold;
use crate::event::{AsEvent, ValidEvent, validate_event};
use crate::fixtures;
use serde_json::{Value, json};

/// The event streams of the repository's fixtures (conformance `stream`s and recorded runs),
/// each event validated (the invalid ones left out: a publish refuses them), plus a few
/// hand-made ones around chunk lanes, subagent tags and closed runs.
fn streams() -> Vec<Vec<ValidEvent>> {
    let mut out = Vec::new();
    for path in fixtures::files(&fixtures::dir("agui-recorded")) {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(document) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let events = match &document {
            Value::Array(events) => events,
            Value::Object(members) => match members.get("stream") {
                Some(Value::Array(events)) => events,
                _ => continue,
            },
            _ => continue,
        };
        out.push(valid(events));
    }
    let m = |t: &str, id: &str, delta: &str| json!({"type": t, "messageId": id, "delta": delta});
    out.push(valid(&[
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "delta": "chunk"}),
        m("TEXT_MESSAGE_CONTENT", "c1", " more"),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m2", "subagentRunId": "s1"}),
        m("TEXT_MESSAGE_CONTENT", "m2", "untagged"),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "tagged", "subagentRunId": "s1"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "other", "subagentRunId": "s2"}),
        m("TEXT_MESSAGE_CONTENT", "nope", "x"),
        json!({"type": "TOOL_CALL_START", "toolCallId": "k", "toolCallName": "f", "parentMessageId": "m2"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "k", "delta": "{\"a\":"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "k", "delta": "1}", "rawEvent": {"x": 1}}),
        json!({"type": "TOOL_CALL_END", "toolCallId": "k"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "k", "delta": "late"}),
        json!({"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"}),
        m("REASONING_MESSAGE_CONTENT", "r1", "hmm"),
        json!({"type": "REASONING_MESSAGE_END", "messageId": "r1"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "m2", "subagentRunId": "s1"}),
        json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}),
        m("TEXT_MESSAGE_CONTENT", "m2", "after the run"),
    ]));
    out.push(valid(&[m("TEXT_MESSAGE_CONTENT", "m", "first")]));
    out
}

fn valid(events: &[Value]) -> Vec<ValidEvent> {
    events
        .iter()
        .filter_map(|e| validate_event(e.to_string().as_bytes(), None).ok())
        .collect()
}

/// The event's value, parsed from its JSON (so never read from fields).
fn value_of(event: &ValidEvent) -> Value {
    serde_json::from_slice(&event.json).unwrap()
}

fn same(a: &ThreadFold, b: &ThreadFold, what: &str) {
    assert_eq!(a.fold().snapshot_json(), b.fold().snapshot_json(), "{what}");
    assert_eq!(a.checker(), b.checker(), "{what}");
    assert_eq!(a.skipped(), b.skipped(), "{what}");
}

#[test]
fn logged_content_folds_as_its_value() {
    let (mut by_fields, mut events) = (0, 0);
    for (n, stream) in streams().iter().enumerate() {
        let (mut a, mut b) = (ThreadFold::new(), ThreadFold::new());
        for (i, event) in stream.iter().enumerate() {
            by_fields += usize::from(event.content().is_some());
            events += 1;
            let value = value_of(event);
            assert_eq!(
                a.apply_logged(event),
                b.apply_logged(&value),
                "stream {n} event {i}"
            );
            same(&a, &b, &format!("stream {n} event {i}"));
        }
    }
    assert!(
        by_fields > 40,
        "{by_fields} of {events} events read from fields"
    );
}

#[test]
fn checked_batches_of_content_fold_as_their_values() {
    for size in [1, 2, 3, 7] {
        for (n, stream) in streams().iter().enumerate() {
            let (mut a, mut b) = (ThreadFold::new(), ThreadFold::new());
            for (k, batch) in stream.chunks(size).enumerate() {
                let values: Vec<Value> = batch.iter().map(value_of).collect();
                let what = format!("size {size} stream {n} batch {k}");
                let (after_a, after_b) = (a.check_batch_only(batch), b.check_batch_only(&values));
                assert_eq!(after_a.as_ref().err(), after_b.as_ref().err(), "{what}");
                let built_a = a.check_batch(batch).map(|f| f.fold().snapshot_json());
                let built_b = b.check_batch(&values).map(|f| f.fold().snapshot_json());
                assert_eq!(built_a, built_b, "{what}");
                if let (Ok(after_a), Ok(after_b)) = (after_a, after_b) {
                    a.apply_checked(batch, after_a);
                    b.apply_checked(&values, after_b);
                }
                same(&a, &b, &what);
            }
        }
    }
}
