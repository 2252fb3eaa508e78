//! `ChunkExpander` (`transformChunks`): chunks into START / CONTENT / END, lanes per
//! subagent, and the chunk rules.

use agui_fanout::event::order::{ChunkExpander, OrderViolation, rule};
use serde_json::Value;
use serde_json::json;
use std::borrow::Cow;

fn expand(x: &mut ChunkExpander, event: Value) -> Result<Vec<Value>, OrderViolation> {
    x.expand(&event)
        .map(|out| out.into_iter().map(Cow::into_owned).collect())
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}

#[test]
fn first_chunk_opens_then_continuations_append_and_run_finished_closes() {
    let mut x = ChunkExpander::new();
    let out = expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "delta": "Hi"}),
    )
    .unwrap();
    assert_eq!(
        out,
        vec![
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hi"}),
        ]
    );
    let out = expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "delta": " there"}),
    )
    .unwrap();
    assert_eq!(
        out,
        vec![json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": " there"})]
    );
    let run_finished = json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"});
    let out = expand(&mut x, run_finished.clone()).unwrap();
    assert_eq!(
        out,
        vec![
            json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}),
            run_finished
        ]
    );
    assert!(x.open_lanes().is_empty());
}

#[test]
fn raw_does_not_close_chunk_stream() {
    let mut x = ChunkExpander::new();
    expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "role": "assistant", "delta": "Half "}),
    )
    .unwrap();
    for aside in [
        json!({"type": "RAW", "event": {}}),
        json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "a", "activityType": "x", "content": {}}),
        json!({"type": "ACTIVITY_DELTA", "messageId": "a", "activityType": "x", "patch": []}),
        json!({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": "m1", "encryptedValue": "e"}),
        json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s1", "name": "n"}),
    ] {
        let out = expand(&mut x, aside.clone()).unwrap();
        assert_eq!(out, vec![aside]);
    }
    let out = expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "delta": "and half."}),
    )
    .unwrap();
    assert_eq!(types(&out), ["TEXT_MESSAGE_CONTENT"]);
}

#[test]
fn custom_between_id_less_chunks_is_fatal() {
    let mut x = ChunkExpander::new();
    expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "delta": "a"}),
    )
    .unwrap();
    let out = expand(&mut x, json!({"type": "CUSTOM", "name": "n", "value": 1})).unwrap();
    assert_eq!(types(&out), ["TEXT_MESSAGE_END", "CUSTOM"]);
    let err = expand(&mut x, json!({"type": "TEXT_MESSAGE_CHUNK", "delta": "b"})).unwrap_err();
    assert_eq!(err.rule, rule::CHUNK_MISSING_ID);
    assert_eq!(
        err.message,
        "First TEXT_MESSAGE_CHUNK must have a messageId"
    );
}

#[test]
fn lane_closing_events() {
    let closing = [
        json!({"type": "TEXT_MESSAGE_START", "messageId": "x"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "x", "delta": ""}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "x"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "x", "toolCallName": "f"}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": "x", "delta": ""}),
        json!({"type": "TOOL_CALL_END", "toolCallId": "x"}),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "x", "toolCallId": "c", "content": ""}),
        json!({"type": "STATE_SNAPSHOT", "snapshot": {}}),
        json!({"type": "STATE_DELTA", "delta": []}),
        json!({"type": "CUSTOM", "name": "n", "value": null}),
        json!({"type": "STEP_STARTED", "stepName": "s"}),
        json!({"type": "STEP_FINISHED", "stepName": "s"}),
        json!({"type": "REASONING_START", "messageId": "x"}),
        json!({"type": "REASONING_MESSAGE_START", "messageId": "x", "role": "reasoning"}),
        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "x", "delta": ""}),
        json!({"type": "REASONING_MESSAGE_END", "messageId": "x"}),
        json!({"type": "REASONING_END", "messageId": "x"}),
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
        json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}),
        json!({"type": "RUN_ERROR", "message": "m"}),
        json!({"type": "MESSAGES_SNAPSHOT", "messages": []}),
    ];
    for event in closing {
        let mut x = ChunkExpander::new();
        expand(
            &mut x,
            json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c1", "toolCallName": "f", "delta": "{"}),
        )
        .unwrap();
        let out = expand(&mut x, event.clone()).unwrap();
        assert_eq!(
            out,
            vec![json!({"type": "TOOL_CALL_END", "toolCallId": "c1"}), event]
        );
        assert!(x.open_lanes().is_empty());
    }
}

#[test]
fn chunk_with_another_id_closes_and_opens() {
    let mut x = ChunkExpander::new();
    expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "delta": "a"}),
    )
    .unwrap();
    let out = expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m2", "role": "user", "name": "bob", "delta": "b"}),
    )
    .unwrap();
    assert_eq!(
        out,
        vec![
            json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m2", "role": "user", "name": "bob"}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "b"}),
        ]
    );
    // A chunk of another kind in the same lane closes it too.
    let out = expand(
        &mut x,
        json!({"type": "REASONING_MESSAGE_CHUNK", "messageId": "r1"}),
    )
    .unwrap();
    assert_eq!(
        out,
        vec![
            json!({"type": "TEXT_MESSAGE_END", "messageId": "m2"}),
            json!({"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"}),
        ]
    );
}

#[test]
fn first_tool_chunk_needs_id_and_name() {
    let mut x = ChunkExpander::new();
    let err = expand(
        &mut x,
        json!({"type": "TOOL_CALL_CHUNK", "toolCallName": "f"}),
    )
    .unwrap_err();
    assert_eq!(err.rule, rule::CHUNK_MISSING_ID);
    assert_eq!(err.message, "First TOOL_CALL_CHUNK must have a toolCallId");
    let err = expand(
        &mut x,
        json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c"}),
    )
    .unwrap_err();
    assert_eq!(err.rule, rule::CHUNK_MISSING_TOOL_CALL_NAME);
    assert_eq!(
        err.message,
        "First TOOL_CALL_CHUNK must have a toolCallName"
    );
    let err = expand(
        &mut x,
        json!({"type": "REASONING_MESSAGE_CHUNK", "delta": "x"}),
    )
    .unwrap_err();
    assert_eq!(
        err.message,
        "First REASONING_MESSAGE_CHUNK must have a messageId"
    );
    let out = expand(
        &mut x,
        json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c", "toolCallName": "f", "parentMessageId": "m1", "delta": "{}"}),
    )
    .unwrap();
    assert_eq!(
        out,
        vec![
            json!({"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "f", "parentMessageId": "m1"}),
            json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": "{}"}),
        ]
    );
}

#[test]
fn continuation_repeating_a_field_with_another_value_is_fatal() {
    let mut x = ChunkExpander::new();
    expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "delta": "a"}),
    )
    .unwrap();
    // Same value (the default role) is fine, with or without the id.
    expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "role": "assistant", "delta": "b"}),
    )
    .unwrap();
    let before = x.clone();
    let err = expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "role": "user", "delta": "c"}),
    )
    .unwrap_err();
    assert_eq!(err.rule, rule::CHUNK_FIELD_MISMATCH);
    assert_eq!(
        err.message,
        "Cannot continue text message 'm1': chunk role 'user' does not match the open \
         stream's role 'assistant'."
    );
    assert_eq!(x, before, "unchanged on error");
    let err = expand(&mut x, json!({"type": "TEXT_MESSAGE_CHUNK", "name": "n"})).unwrap_err();
    assert_eq!(
        err.message,
        "Cannot continue text message 'm1': chunk name 'n' does not match the open \
         stream's name (absent)."
    );

    let mut x = ChunkExpander::new();
    expand(
        &mut x,
        json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c", "toolCallName": "f", "parentMessageId": "p"}),
    )
    .unwrap();
    expand(
        &mut x,
        json!({"type": "TOOL_CALL_CHUNK", "toolCallName": "f", "parentMessageId": "p", "delta": "1"}),
    )
    .unwrap();
    let err = expand(
        &mut x,
        json!({"type": "TOOL_CALL_CHUNK", "toolCallName": "g"}),
    )
    .unwrap_err();
    assert_eq!(err.rule, rule::CHUNK_FIELD_MISMATCH);
    let err = expand(
        &mut x,
        json!({"type": "TOOL_CALL_CHUNK", "parentMessageId": "q"}),
    )
    .unwrap_err();
    assert_eq!(
        err.message,
        "Cannot continue tool call 'c': chunk parentMessageId 'q' does not match the open \
         stream's parentMessageId 'p'."
    );
}

#[test]
fn lanes_per_subagent_assemble_independently() {
    let mut x = ChunkExpander::new();
    let chunk = |id: Option<&str>, tag: Option<&str>, delta: &str| {
        let mut c = json!({"type": "TEXT_MESSAGE_CHUNK", "delta": delta});
        if let Some(id) = id {
            c["messageId"] = id.into();
        }
        if let Some(tag) = tag {
            c["subagentRunId"] = tag.into();
        }
        c
    };
    expand(&mut x, chunk(Some("a"), Some("s1"), "1")).unwrap();
    expand(&mut x, chunk(Some("b"), Some("s2"), "2")).unwrap();
    expand(&mut x, chunk(Some("p"), None, "3")).unwrap();
    assert_eq!(x.open_lanes().len(), 3);
    // Tagged continuation goes to its lane, with the tag.
    let out = expand(&mut x, chunk(None, Some("s1"), "4")).unwrap();
    assert_eq!(
        out,
        vec![
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "a", "delta": "4", "subagentRunId": "s1"})
        ]
    );
    // Untagged continuation: the parent's lane.
    let out = expand(&mut x, chunk(None, None, "5")).unwrap();
    assert_eq!(out[0]["messageId"], "p");
    // A named id continues in its lane even untagged; a contradicting tag is fatal.
    let out = expand(&mut x, chunk(Some("b"), None, "6")).unwrap();
    assert_eq!(out[0]["subagentRunId"], "s2");
    let err = expand(&mut x, chunk(Some("b"), Some("s1"), "7")).unwrap_err();
    assert_eq!(err.rule, rule::CHUNK_SUBAGENT_MISMATCH);
    assert_eq!(
        err.message,
        "Cannot continue text message 'b': chunk subagentRunId 's1' does not match the open \
         stream's subagent 's2'."
    );
    // A parent event closes only the parent's lane.
    let out = expand(&mut x, json!({"type": "CUSTOM", "name": "n", "value": 0})).unwrap();
    assert_eq!(types(&out), ["TEXT_MESSAGE_END", "CUSTOM"]);
    assert_eq!(out[0]["messageId"], "p");
    // Untagged, no parent stream, two subagent streams: ambiguous.
    let err = expand(&mut x, chunk(None, None, "8")).unwrap_err();
    assert_eq!(err.rule, rule::CHUNK_LANE_AMBIGUOUS);
    assert_eq!(
        err.message,
        "Ambiguous TEXT_MESSAGE_CHUNK: it carries neither a messageId nor a subagentRunId, \
         but 2 lanes have an open text message. Attribute the chunk to the subagent it \
         belongs to."
    );
    // SUBAGENT_FINISHED closes its own lane; then the sole open lane takes untagged chunks.
    let out = expand(
        &mut x,
        json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s2"}),
    )
    .unwrap();
    assert_eq!(
        out[0],
        json!({"type": "TEXT_MESSAGE_END", "messageId": "b", "subagentRunId": "s2"})
    );
    let out = expand(&mut x, chunk(None, None, "9")).unwrap();
    assert_eq!(out[0]["messageId"], "a");
    assert_eq!(out[0]["subagentRunId"], "s1");
    // Run terminals close every lane in opening order.
    expand(&mut x, chunk(Some("q"), None, "10")).unwrap();
    let out = expand(&mut x, json!({"type": "RUN_ERROR", "message": "x"})).unwrap();
    assert_eq!(
        types(&out),
        ["TEXT_MESSAGE_END", "TEXT_MESSAGE_END", "RUN_ERROR"]
    );
    assert_eq!(out[0]["messageId"], "a");
    assert_eq!(out[1]["messageId"], "q");
}

#[test]
fn metadata_and_raw_event_ride_the_synthesised_events() {
    let mut x = ChunkExpander::new();
    let out = expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "metadata": {"k": 1}, "rawEvent": {"r": 1}, "timestamp": 5, "extra": true}),
    )
    .unwrap();
    assert_eq!(
        out,
        vec![
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant", "metadata": {"k": 1}}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "", "metadata": {"k": 1}, "rawEvent": {"r": 1}}),
        ]
    );
    // Metadata-only continuation: a zero-delta content event.
    let out = expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "metadata": {"usage": 3}}),
    )
    .unwrap();
    assert_eq!(
        out,
        vec![
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "", "metadata": {"usage": 3}})
        ]
    );
    // An empty continuation yields nothing.
    let out = expand(&mut x, json!({"type": "TEXT_MESSAGE_CHUNK"})).unwrap();
    assert!(out.is_empty());
    // An opener without delta yields only the START.
    let out = expand(
        &mut x,
        json!({"type": "REASONING_MESSAGE_CHUNK", "messageId": "r", "subagentRunId": "s"}),
    )
    .unwrap();
    // (The parent's lane, holding m1, is not this subagent's lane: nothing closes.)
    assert_eq!(
        out,
        vec![
            json!({"type": "REASONING_MESSAGE_START", "messageId": "r", "role": "reasoning", "subagentRunId": "s"})
        ]
    );
}

#[test]
fn reopening_chunk_restores_the_lane() {
    let mut x = ChunkExpander::new();
    expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "role": "user", "name": "n", "subagentRunId": "s", "delta": "a"}),
    )
    .unwrap();
    expand(
        &mut x,
        json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c", "toolCallName": "f", "parentMessageId": "m0", "delta": "{"}),
    )
    .unwrap();
    let lanes = x.open_lanes().to_vec();
    let mut fresh = ChunkExpander::new();
    for lane in &lanes {
        let out = expand(&mut fresh, lane.reopening_chunk()).unwrap();
        assert_eq!(out.len(), 1, "only the START");
    }
    assert_eq!(fresh.open_lanes(), &lanes[..]);
    assert_eq!(
        lanes[0].reopening_chunk(),
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "role": "user", "name": "n", "subagentRunId": "s"})
    );
}

#[test]
fn unknown_or_non_object_events_pass_through() {
    let mut x = ChunkExpander::new();
    expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1"}),
    )
    .unwrap();
    for event in [
        json!({"type": "FUTURE_EVENT"}),
        json!(5),
        json!({"no": "type"}),
    ] {
        assert_eq!(expand(&mut x, event.clone()).unwrap(), vec![event]);
    }
    assert_eq!(x.open_lanes().len(), 1);
    let err = expand(
        &mut x,
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": 5}),
    )
    .unwrap_err();
    assert_eq!(err.rule, rule::CHUNK_FIELD_MALFORMED);
}
