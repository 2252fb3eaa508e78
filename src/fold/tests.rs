//! Reducer unit tests. Expected values were checked against `@ag-ui/client` 1.0.0
//! `defaultApplyEvents` given the same events.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn fold(events: &[Value]) -> Fold {
    let mut f = Fold::new();
    for e in events {
        f.apply(e);
    }
    f
}

fn start(id: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"})
}

fn content(id: &str, delta: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": delta})
}

fn end(id: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_END", "messageId": id})
}

fn delta(ops: Value) -> Value {
    json!({"type": "STATE_DELTA", "delta": ops})
}

// ---- state ------------------------------------------------------------------------------

#[test]
fn first_delta_applies_to_an_empty_object() {
    let mut f = Fold::new();
    assert_eq!(f.state(), &json!({}));
    assert!(!f.state_known());
    let applied = f.apply(&delta(json!([{"op": "add", "path": "/a", "value": 1}])));
    assert_eq!(applied, Applied::StateDelta(Ok(())));
    assert_eq!(f.state(), &json!({"a": 1}));
    assert!(f.state_known());
}

#[test]
fn failed_delta_keeps_the_state_and_names_the_operation() {
    let mut f =
        fold(&[json!({"type": "STATE_SNAPSHOT", "snapshot": {"plan": {"status": "open"}}})]);
    let applied = f.apply(&delta(json!([
        {"op": "replace", "path": "/plan/status", "value": "closed"},
        {"op": "replace", "path": "/absent/deeper", "value": 1}
    ])));
    let err = applied.patch_error().expect("fails");
    assert_eq!((err.op_index, err.code), (1, "OPERATION_PATH_UNRESOLVABLE"));
    assert_eq!(f.state(), &json!({"plan": {"status": "open"}}));
}

/// AGUI.md §6 coalescing caveat: `[A]`, `[B-fails]` keeps A; the merged `[A, B-fails]` does not.
#[test]
fn coalescing_caveat() {
    let a = json!({"op": "add", "path": "/a", "value": 1});
    let b = json!({"op": "remove", "path": "/missing"});
    let separate = fold(&[delta(json!([a])), delta(json!([b]))]);
    assert_eq!(separate.state(), &json!({"a": 1}));
    let merged = fold(&[delta(json!([a, b]))]);
    assert_eq!(merged.state(), &json!({}));
}

#[test]
fn snapshot_replaces_wholesale_with_any_value_and_is_adopted_after_failures() {
    for snapshot in [json!(null), json!([]), json!(0), json!({"x": [1]})] {
        let f = fold(&[
            json!({"type": "STATE_SNAPSHOT", "snapshot": {"old": true}}),
            delta(json!([{"op": "remove", "path": "/nope"}])),
            json!({"type": "STATE_SNAPSHOT", "snapshot": snapshot}),
        ]);
        assert_eq!(f.state(), &snapshot);
    }
    // A `null` state fails keyed operations, and a root operation still works.
    let mut f = fold(&[json!({"type": "STATE_SNAPSHOT", "snapshot": null})]);
    assert!(
        f.apply(&delta(json!([{"op": "add", "path": "/a", "value": 1}])))
            .patch_error()
            .is_some()
    );
    assert_eq!(f.state(), &json!(null));
    assert_eq!(
        f.apply(&delta(json!([{"op": "add", "path": "", "value": [1]}]))),
        Applied::StateDelta(Ok(()))
    );
    assert_eq!(f.state(), &json!([1]));
}

#[test]
fn unknown_ops_are_dropped_like_the_enforcement_stage_and_indices_stay_original() {
    let mut f = fold(&[json!({"type": "STATE_SNAPSHOT", "snapshot": {"count": 1}})]);
    let ops = json!([{"op": "increment", "path": "/count", "value": 1}, {"op": "replace", "path": "/count", "value": 5}]);
    assert_eq!(f.apply(&delta(ops)), Applied::StateDelta(Ok(())));
    assert_eq!(f.state(), &json!({"count": 5}));
    let ops = json!([{"op": "nope"}, {"op": "test", "path": "/count", "value": 6}]);
    assert_eq!(
        f.apply(&delta(ops)).patch_error().map(|e| e.op_index),
        Some(1)
    );
    let not_a_list = json!({"type": "STATE_DELTA", "delta": {"op": "add"}});
    assert_eq!(
        f.apply(&not_a_list).patch_error().map(|e| e.code),
        Some("SEQUENCE_NOT_AN_ARRAY")
    );
    assert_eq!(f.apply(&delta(json!([]))), Applied::StateDelta(Ok(())));
    assert_eq!(f.state(), &json!({"count": 5}));
}

// ---- text and reasoning messages ------------------------------------------------------------

#[test]
fn triad_assembles_byte_exactly() {
    let f = fold(&[
        start("m"),
        content("m", "cafe"),
        content("m", "\u{301}"),
        content("m", ""),
        content("m", "👨"),
        content("m", "\u{200d}👩"),
        end("m"),
    ]);
    assert_eq!(
        f.messages(),
        &[json!({"id": "m", "role": "assistant", "content": "cafe\u{301}👨\u{200d}👩"})]
    );
}

#[test]
fn role_defaults_to_assistant_and_name_is_kept() {
    let f = fold(&[
        json!({"type": "TEXT_MESSAGE_START", "messageId": "a"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "u", "role": "user", "name": "ann"}),
    ]);
    assert_eq!(
        f.messages(),
        &[
            json!({"id": "a", "role": "assistant", "content": ""}),
            json!({"id": "u", "role": "user", "content": "", "name": "ann"}),
        ]
    );
}

/// Conformance `reopen-closed-message-appends`, and AGUI.md §6: re-streaming duplicates text.
#[test]
fn reopened_message_appends() {
    let f = fold(&[
        start("m"),
        content("m", "First half."),
        end("m"),
        start("m"),
        content("m", " Second half."),
        end("m"),
    ]);
    assert_eq!(
        f.messages(),
        &[json!({"id": "m", "role": "assistant", "content": "First half. Second half."})]
    );
    let f = fold(&[
        start("m"),
        content("m", "Hello"),
        start("m"),
        content("m", "Hello"),
    ]);
    assert_eq!(f.messages()[0]["content"], "HelloHello");
}

#[test]
fn content_without_a_message_or_into_an_activity_is_skipped() {
    let mut f = Fold::new();
    assert!(matches!(f.apply(&content("x", "a")), Applied::Skipped(_)));
    assert!(matches!(f.apply(&end("x")), Applied::Skipped(_)));
    f.apply(&json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "act", "activityType": "search", "content": {"q": 1}}));
    assert!(matches!(f.apply(&start("act")), Applied::Skipped(_)));
    assert!(matches!(
        f.apply(&content("act", "text")),
        Applied::Skipped(_)
    ));
    assert_eq!(
        f.messages(),
        &[json!({"id": "act", "role": "activity", "activityType": "search", "content": {"q": 1}})]
    );
}

#[test]
fn content_replaces_non_string_content() {
    let f = fold(&[
        json!({"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "u", "role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
        content("u", "plain"),
    ]);
    assert_eq!(
        f.messages(),
        &[json!({"id": "u", "role": "user", "content": "plain"})]
    );
}

#[test]
fn metadata_merges_per_key_last_write_wins_without_recursion() {
    let f = fold(&[
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "metadata": {"a": 1, "deep": {"x": 1}}}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hi", "metadata": {"b": null}}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "m", "metadata": {"a": 2, "deep": {"y": 2}}}),
    ]);
    let m = &f.messages()[0];
    assert_eq!(m["metadata"], json!({"a": 2, "deep": {"y": 2}, "b": null}));
    assert_eq!(
        serde_json::to_string(&m["metadata"]).unwrap(),
        r#"{"a":2,"deep":{"y":2},"b":null}"#
    );
}

#[test]
fn reasoning_messages() {
    let f = fold(&[
        json!({"type": "REASONING_START", "messageId": "r"}),
        json!({"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning", "subagentRunId": "s1"}),
        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "think"}),
        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "ing"}),
        json!({"type": "REASONING_MESSAGE_END", "messageId": "r1"}),
        json!({"type": "REASONING_END", "messageId": "r"}),
        json!({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": "r1", "encryptedValue": "enc"}),
    ]);
    assert_eq!(
        f.messages(),
        &[
            json!({"id": "r1", "role": "reasoning", "content": "thinking", "subagentRunId": "s1", "encryptedValue": "enc"})
        ]
    );
}

#[test]
fn subagent_run_id_is_carried_onto_minted_messages() {
    let f = fold(&[
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "subagentRunId": "s1"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "tc", "toolCallName": "f", "subagentRunId": "s2"}),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "r", "toolCallId": "tc", "content": "ok", "subagentRunId": "s2"}),
        json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "a", "activityType": "t", "content": {}, "subagentRunId": "s3"}),
    ]);
    let tags: Vec<_> = f
        .messages()
        .iter()
        .map(|m| m["subagentRunId"].clone())
        .collect();
    assert_eq!(tags, [json!("s1"), json!("s2"), json!("s2"), json!("s3")]);
}

// ---- tool calls ------------------------------------------------------------------------------

#[test]
fn tool_call_args_accumulate_on_the_parent_message() {
    let f = fold(&[
        start("m"),
        content("m", "Looking it up."),
        end("m"),
        json!({"type": "TOOL_CALL_START", "toolCallId": "tc", "toolCallName": "search", "parentMessageId": "m"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "tc", "delta": "{\"q\":"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "tc", "delta": ""}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "tc", "delta": "\"agui\"}", "metadata": {"k": 1}}),
        json!({"type": "TOOL_CALL_END", "toolCallId": "tc", "metadata": {"done": true}}),
    ]);
    assert_eq!(
        f.messages(),
        &[json!({
            "id": "m", "role": "assistant", "content": "Looking it up.",
            "toolCalls": [{"id": "tc", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"agui\"}"},
                           "metadata": {"k": 1, "done": true}}]
        })]
    );
}

/// The 1.0 client's `resolveOrCreateAssistantMessage`: a missing parent is created under its
/// own id, no parent means a message keyed by the tool call id, and a parent that is not an
/// assistant message gets a new assistant message keyed by the tool call id.
#[test]
fn tool_call_start_parent_resolution() {
    let f = fold(&[
        json!({"type": "TOOL_CALL_START", "toolCallId": "t1", "toolCallName": "a", "parentMessageId": "missing"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "t2", "toolCallName": "b"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "u", "role": "user"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "t3", "toolCallName": "c", "parentMessageId": "u"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "t4", "toolCallName": "d", "parentMessageId": "missing"}),
    ]);
    let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": ""}});
    assert_eq!(
        f.messages(),
        &[
            json!({"id": "missing", "role": "assistant", "toolCalls": [call("t1", "a"), call("t4", "d")]}),
            json!({"id": "t2", "role": "assistant", "toolCalls": [call("t2", "b")]}),
            json!({"id": "u", "role": "user", "content": ""}),
            json!({"id": "t3", "role": "assistant", "toolCalls": [call("t3", "c")]}),
        ]
    );
}

/// AGUI.md §6: a `TOOL_CALL_START` for an existing call updates it in place, and ARGS append.
#[test]
fn tool_call_start_is_idempotent() {
    let f = fold(&[
        json!({"type": "TOOL_CALL_START", "toolCallId": "tc", "toolCallName": "f", "parentMessageId": "m"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "tc", "delta": "{\"a\""}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "tc", "toolCallName": "g", "parentMessageId": "m"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "tc", "delta": ":1}"}),
    ]);
    assert_eq!(
        f.messages(),
        &[json!({"id": "m", "role": "assistant", "toolCalls": [
            {"id": "tc", "type": "function", "function": {"name": "g", "arguments": "{\"a\":1}"}}
        ]})]
    );
}

#[test]
fn tool_result_follows_its_call_past_earlier_results() {
    let f = fold(&[
        json!({"type": "TOOL_CALL_START", "toolCallId": "t1", "toolCallName": "f", "parentMessageId": "a"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "t2", "toolCallName": "f", "parentMessageId": "a"}),
        start("later"),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "r1", "toolCallId": "t1", "content": "one"}),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "r2", "toolCallId": "t2", "content": [{"type": "text", "text": "two"}], "metadata": {"m": 1}}),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "r3", "toolCallId": "unknown", "content": "x"}),
    ]);
    let ids: Vec<_> = f
        .messages()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "r1", "r2", "later", "r3"]);
    assert_eq!(
        f.messages()[2],
        json!({"id": "r2", "toolCallId": "t2", "role": "tool", "content": [{"type": "text", "text": "two"}], "metadata": {"m": 1}})
    );
    // Later appends still find the message after the insertion shifted positions.
    let mut f = f;
    f.apply(&content("later", "text"));
    assert_eq!(f.messages()[3]["content"], "text");
}

#[test]
fn encrypted_value_on_a_tool_call() {
    let f = fold(&[
        json!({"type": "TOOL_CALL_START", "toolCallId": "tc", "toolCallName": "f"}),
        json!({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "tool-call", "entityId": "tc", "encryptedValue": "e"}),
    ]);
    assert_eq!(f.messages()[0]["toolCalls"][0]["encryptedValue"], "e");
}

// ---- MESSAGES_SNAPSHOT and input-echo --------------------------------------------------------

#[test]
fn messages_snapshot_reconciles_by_id() {
    let f = fold(&[
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r", "input": {"threadId": "t", "runId": "r", "messages": [{"id": "u", "role": "user", "content": "q"}]}}),
        start("a"),
        content("a", "first draft"),
        end("a"),
        start("b"),
        content("b", "retracted"),
        end("b"),
        json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "act", "activityType": "search", "content": {}}),
        json!({"type": "REASONING_MESSAGE_START", "messageId": "think", "role": "reasoning"}),
        json!({"type": "MESSAGES_SNAPSHOT", "messages": [
            {"id": "n1", "role": "assistant", "content": "new"},
            {"id": "a", "role": "assistant", "content": "first draft, corrected"},
            {"id": "u", "role": "user", "content": "q"},
            {"id": "n2", "role": "user", "content": "new too", "subagentRunId": null}
        ]}),
    ]);
    // Kept in place: u, a (replaced); dropped: b; client-only kept: act, think; appended: n1, n2.
    assert_eq!(
        f.messages(),
        &[
            json!({"id": "u", "role": "user", "content": "q"}),
            json!({"id": "a", "role": "assistant", "content": "first draft, corrected"}),
            json!({"id": "act", "role": "activity", "activityType": "search", "content": {}}),
            json!({"id": "think", "role": "reasoning", "content": ""}),
            json!({"id": "n1", "role": "assistant", "content": "new"}),
            json!({"id": "n2", "role": "user", "content": "new too"}),
        ]
    );
}

#[test]
fn messages_snapshot_owns_the_roles_it_carries() {
    let base = [
        json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "s", "activityType": "search", "content": {}}),
        json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "o", "activityType": "other", "content": {}}),
        json!({"type": "REASONING_MESSAGE_START", "messageId": "r", "role": "reasoning"}),
    ];
    let ids = |extra: Value| -> Vec<String> {
        let mut events = base.to_vec();
        events.push(extra);
        fold(&events)
            .messages()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    // Carrying an activity drops the other activities; carrying reasoning drops reasoning.
    assert_eq!(
        ids(
            json!({"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "x", "role": "activity", "activityType": "other", "content": {}}]})
        ),
        ["r", "x"]
    );
    assert_eq!(
        ids(
            json!({"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "x", "role": "reasoning", "content": ""}]})
        ),
        ["s", "o", "x"]
    );
    assert_eq!(
        ids(json!({"type": "MESSAGES_SNAPSHOT", "messages": []})),
        ["s", "o", "r"]
    );
    // The client's `authoritativeActivityTypes` declaration scopes the activity authority.
    let declared = |types: Value| {
        json!({"type": "MESSAGES_SNAPSHOT", "messages": [],
        "metadata": {"@ag-ui/client": {"authoritativeActivityTypes": types}}})
    };
    assert_eq!(ids(declared(json!(["search"]))), ["o", "r"]);
    assert_eq!(ids(declared(json!(null))), ["r"]);
    assert_eq!(ids(declared(json!("invalid"))), ["s", "o", "r"]);
}

#[test]
fn input_echo_appends_messages_not_already_present() {
    let input = |messages: Value| {
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r",
        "input": {"threadId": "t", "runId": "r", "messages": messages, "state": {"ignored": true}}})
    };
    let f = fold(&[
        input(json!([{"id": "u1", "role": "user", "content": "hi"}])),
        start("a"),
        content("a", "hello"),
        end("a"),
        json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}),
        input(json!([
            {"id": "u1", "role": "user", "content": "edited?"},
            {"id": "a", "role": "assistant", "content": "hello"},
            {"id": "u2", "role": "user", "content": "more", "subagentRunId": null},
            {"id": "u2", "role": "user", "content": "dup"}
        ])),
    ]);
    assert_eq!(
        f.messages(),
        &[
            json!({"id": "u1", "role": "user", "content": "hi"}),
            json!({"id": "a", "role": "assistant", "content": "hello"}),
            json!({"id": "u2", "role": "user", "content": "more"}),
        ]
    );
    assert_eq!(f.state(), &json!({}), "input.state is not adopted");
}

// ---- activities ------------------------------------------------------------------------------

#[test]
fn activity_snapshot_and_delta() {
    let mut f = fold(&[
        json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "a", "activityType": "search", "content": {"query": "ag-ui", "found": 0}, "metadata": {"k": 1}}),
        json!({"type": "ACTIVITY_DELTA", "messageId": "a", "activityType": "search", "patch": [{"op": "replace", "path": "/found", "value": 3}]}),
    ]);
    assert_eq!(
        f.messages(),
        &[
            json!({"id": "a", "role": "activity", "activityType": "search", "content": {"query": "ag-ui", "found": 3}, "metadata": {"k": 1}})
        ]
    );
    // A failing delta keeps the content but still merges metadata.
    let applied = f.apply(&json!({"type": "ACTIVITY_DELTA", "messageId": "a", "activityType": "x", "metadata": {"k": 2},
        "patch": [{"op": "replace", "path": "/found", "value": 4}, {"op": "test", "path": "/query", "value": "no"}]}));
    assert_eq!(applied.patch_error().map(|e| e.op_index), Some(1));
    assert_eq!(
        f.messages()[0],
        json!({"id": "a", "role": "activity", "activityType": "search", "content": {"query": "ag-ui", "found": 3}, "metadata": {"k": 2}})
    );
    // Unknown id: ignored.
    assert!(matches!(
        f.apply(
            &json!({"type": "ACTIVITY_DELTA", "messageId": "zz", "activityType": "x", "patch": []})
        ),
        Applied::Skipped(_)
    ));
    // `replace: false` keeps the content; a replace keeps other members and re-tags the owner.
    f.apply(&json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "a", "activityType": "search", "content": {"n": 1}, "replace": false}));
    assert_eq!(
        f.messages()[0]["content"],
        json!({"query": "ag-ui", "found": 3})
    );
    f.apply(&json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "a", "activityType": "web", "content": {"n": 1}, "subagentRunId": "s"}));
    assert_eq!(
        f.messages()[0],
        json!({"id": "a", "role": "activity", "activityType": "web", "content": {"n": 1}, "metadata": {"k": 2}, "subagentRunId": "s"})
    );
    f.apply(&json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "a", "activityType": "web", "content": {"n": 2}}));
    assert_eq!(
        f.messages()[0],
        json!({"id": "a", "role": "activity", "activityType": "web", "content": {"n": 2}, "metadata": {"k": 2}})
    );
}

#[test]
fn activity_snapshot_replaces_a_non_activity_message_only_with_replace() {
    let mut f = fold(&[start("m")]);
    f.apply(&json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "m", "activityType": "t", "content": {}, "replace": false}));
    assert_eq!(f.messages()[0]["role"], "assistant");
    f.apply(
        &json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "m", "activityType": "t", "content": {}}),
    );
    assert_eq!(
        f.messages(),
        &[json!({"id": "m", "role": "activity", "activityType": "t", "content": {}})]
    );
}

// ---- run ---------------------------------------------------------------------------------------

#[test]
fn run_status() {
    let started = json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1", "input": {"threadId": "t", "runId": "r1", "messages": []}});
    let finished = json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r1", "outcome": {"type": "interrupt", "interrupts": [{"id": "i", "reason": "approval"}]}});
    let error = json!({"type": "RUN_ERROR", "message": "late"});
    let mut f = fold(std::slice::from_ref(&started));
    let run = f.run().unwrap();
    assert_eq!(
        (run.thread_id(), run.run_id(), &run.status),
        (Some("t"), Some("r1"), &RunStatus::Running)
    );
    assert_eq!(run.started.as_ref(), Some(&started));
    f.apply(&finished);
    assert_eq!(
        f.run().unwrap().status,
        RunStatus::Finished(finished.clone())
    );
    f.apply(&error);
    assert_eq!(
        f.run().unwrap().status,
        RunStatus::Errored {
            error: error.clone(),
            finished: Some(finished.clone())
        }
    );
    assert_eq!(
        f.snapshot_json()["run"],
        json!({"threadId": "t", "runId": "r1", "status": "errored", "started": started, "finished": finished, "error": error})
    );
    // A stream may open with RUN_ERROR: a run with no RUN_STARTED.
    let f = fold(std::slice::from_ref(&error));
    assert_eq!(
        f.run().unwrap().to_json(),
        json!({"threadId": null, "runId": null, "status": "errored", "started": null, "error": error})
    );
}

#[test]
fn snapshot_json_shape() {
    let f = fold(&[
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"s": 1}}),
        start("m"),
    ]);
    assert_eq!(
        f.snapshot_json(),
        json!({"state": {"s": 1}, "messages": [{"id": "m", "role": "assistant", "content": ""}], "run": null})
    );
}

#[test]
fn chunks_unknown_and_inert_events() {
    let mut f = Fold::new();
    assert!(matches!(
        f.apply(&json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m", "delta": "x"})),
        Applied::Skipped(_)
    ));
    assert!(matches!(
        f.apply(&json!({"type": "FUTURE_EVENT"})),
        Applied::Skipped(_)
    ));
    assert!(matches!(f.apply(&json!([1, 2])), Applied::Skipped(_)));
    for t in [
        "RAW",
        "CUSTOM",
        "STEP_STARTED",
        "STEP_FINISHED",
        "SUBAGENT_STARTED",
        "SUBAGENT_FINISHED",
        "SUBAGENT_ERROR",
    ] {
        assert_eq!(f.apply(&json!({"type": t})), Applied::NoEffect);
    }
    assert!(f.messages().is_empty());
    assert_eq!(f.state(), &json!({}));
}

// ---- no panics on any input --------------------------------------------------------------------

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..5).prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "a",
            "m",
            "tc",
            "-",
            "0",
            "01",
            "~1",
            "assistant",
            "activity",
            "tool",
            "reasoning"
        ])
        .prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "id",
                        "role",
                        "content",
                        "toolCalls",
                        "function",
                        "op",
                        "path",
                        "from",
                        "value",
                        "a",
                        "0"
                    ]),
                    inner
                ),
                0..4
            )
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

fn event() -> impl Strategy<Value = Value> {
    let types: Vec<&'static str> = crate::event::EventType::ALL
        .iter()
        .map(|t| t.as_str())
        .collect();
    let fields = vec![
        "messageId",
        "toolCallId",
        "parentMessageId",
        "delta",
        "patch",
        "snapshot",
        "messages",
        "role",
        "content",
        "metadata",
        "replace",
        "activityType",
        "input",
        "subtype",
        "entityId",
        "encryptedValue",
        "subagentRunId",
        "toolCallName",
        "name",
    ];
    (
        prop::sample::select(types),
        prop::collection::vec((prop::sample::select(fields), json_value()), 0..6),
    )
        .prop_map(|(t, kv)| {
            let mut m: Map<String, Value> =
                kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            m.insert("type".into(), t.into());
            Value::Object(m)
        })
}

proptest! {
    #[test]
    fn any_event_sequence_folds_without_panicking(events in prop::collection::vec(event(), 0..20)) {
        let mut f = Fold::new();
        for e in &events {
            f.apply(e);
        }
        let _ = f.snapshot_json();
    }

    #[test]
    fn any_patch_applies_or_fails_without_changing_the_input(doc in json_value(), ops in prop::collection::vec(json_value(), 0..5)) {
        let before = doc.clone();
        let _ = apply_patch(&doc, &ops);
        prop_assert_eq!(doc, before);
    }
}

/// `toolCalls` on a user message of a snapshot: the client strips them, so its later
/// `TOOL_CALL_START` adds the call to its assistant parent and the result follows that
/// parent. The fold keeps the member but finds no call through it.
#[test]
fn tool_calls_on_a_non_assistant_snapshot_message_capture_nothing() {
    let f = fold(&[
        json!({"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "u1", "role": "user", "content": "q",
            "toolCalls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]}]}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "a1", "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "a1"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "f", "parentMessageId": "a1"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": "{}"}),
        json!({"type": "TOOL_CALL_END", "toolCallId": "c1"}),
        start("a2"),
        end("a2"),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "t1", "toolCallId": "c1", "content": "ok"}),
    ]);
    let ids: Vec<&str> = f
        .messages()
        .iter()
        .map(|m| m["id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["u1", "a1", "t1", "a2"]);
    assert_eq!(
        f.messages()[1]["toolCalls"][0]["function"]["arguments"],
        "{}"
    );
    assert_eq!(f.messages()[0]["toolCalls"][0]["function"]["arguments"], "");
}
