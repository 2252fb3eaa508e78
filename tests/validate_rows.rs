//! Schema validation (`validate_event` / `validate_value`) by table rows: every event type's
//! required and optional fields, base fields, enumerations, outcomes, content parts, JSON
//! Patch, messages, `RUN_STARTED` input, thread binding, what is stored, and properties.

use agui_fanout::event::validate::MAX_DEPTH;
use agui_fanout::event::{EventType, ThreadId, ValidEvent, validate_event, validate_value};
use proptest::strategy::Strategy;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

// ---- Helpers ------------------------------------------------------------------------

/// What one table row expects: `None` accepted, `Some((field, fragment))` refused naming
/// `field` with a message containing `fragment`.
type Expect = Option<(&'static str, &'static str)>;

fn thread(id: &str) -> ThreadId {
    ThreadId::parse(id).expect("test thread ids are valid")
}

/// Parses JSON text exactly (number text included), for rows `json!` cannot spell.
fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("bad test JSON {text}: {e}"))
}

/// Runs table rows, each validated without a thread, and checks accepted events survive
/// unchanged and on one line.
fn check_rows(rows: &[(Value, Expect)]) {
    for (event, expect) in rows {
        let outcome = validate_value(event.clone(), None);
        match (expect, outcome) {
            (None, Ok(valid)) => assert_round_trip(event, &valid),
            (None, Err(e)) => panic!("{event} was refused: {e:?}"),
            (Some((field, _)), Ok(_)) => panic!("{event} was accepted, expected {field}"),
            (Some((field, fragment)), Err(e)) => {
                assert_eq!(e.field.as_deref(), Some(*field), "{event}: {e:?}");
                assert!(
                    e.message.contains(fragment),
                    "{event}: {e:?} lacks {fragment:?}"
                );
                assert!(e.message.starts_with(field), "{event}: {e:?}");
            }
        }
    }
}

/// The stored JSON is the input, whole, compact, on one line.
fn assert_round_trip(input: &Value, valid: &ValidEvent) {
    assert!(!valid.json.contains(&b'\n') && !valid.json.contains(&b'\r'));
    assert_eq!(&valid.value().expect("stored JSON parses"), input);
    let compact = serde_json::to_vec(input).expect("values serialise");
    assert_eq!(valid.json.as_ref(), compact.as_slice());
}

fn with(base: &Value, extra: Value) -> Value {
    let mut event = base.clone();
    let (Value::Object(target), Value::Object(extra)) = (&mut event, extra) else {
        panic!("with() merges objects");
    };
    target.extend(extra);
    event
}

// ---- Every event type ---------------------------------------------------------------

/// For each of the 31 types: an example with every optional field set, its required and
/// its optional fields (AGUI.md §1.3), spelled out here independently of `schema`.
fn every_type() -> Vec<(Value, &'static [&'static str], &'static [&'static str])> {
    vec![
        (
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "user", "name": "Ann"}),
            &["messageId"],
            &["role", "name"],
        ),
        (
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": ""}),
            &["messageId", "delta"],
            &[],
        ),
        (
            json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}),
            &["messageId"],
            &[],
        ),
        (
            json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "role": "assistant", "delta": "x", "name": "n"}),
            &[],
            &["messageId", "role", "delta", "name"],
        ),
        (
            json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "search", "parentMessageId": "m1"}),
            &["toolCallId", "toolCallName"],
            &["parentMessageId"],
        ),
        (
            json!({"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": "{\"q\":"}),
            &["toolCallId", "delta"],
            &[],
        ),
        (
            json!({"type": "TOOL_CALL_END", "toolCallId": "c1"}),
            &["toolCallId"],
            &[],
        ),
        (
            json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c1", "toolCallName": "search", "parentMessageId": "m1", "delta": "{}"}),
            &[],
            &["toolCallId", "toolCallName", "parentMessageId", "delta"],
        ),
        (
            json!({"type": "TOOL_CALL_RESULT", "messageId": "m2", "toolCallId": "c1", "content": "ok", "role": "tool"}),
            &["messageId", "toolCallId", "content"],
            &["role"],
        ),
        (
            json!({"type": "STATE_SNAPSHOT", "snapshot": null}),
            &["snapshot"],
            &[],
        ),
        (json!({"type": "STATE_DELTA", "delta": []}), &["delta"], &[]),
        (
            json!({"type": "MESSAGES_SNAPSHOT", "messages": []}),
            &["messages"],
            &[],
        ),
        (
            json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "a1", "activityType": "PLAN", "content": {}, "replace": false}),
            &["messageId", "activityType", "content"],
            &["replace"],
        ),
        (
            json!({"type": "ACTIVITY_DELTA", "messageId": "a1", "activityType": "PLAN", "patch": []}),
            &["messageId", "activityType", "patch"],
            &[],
        ),
        (
            json!({"type": "RAW", "event": null, "source": "openai"}),
            &["event"],
            &["source"],
        ),
        (
            json!({"type": "CUSTOM", "name": "ping", "value": null}),
            &["name", "value"],
            &[],
        ),
        (
            json!({"type": "RUN_STARTED", "threadId": "t1", "runId": "r1", "protocolVersion": "1.0", "parentRunId": "r0",
                   "input": {"threadId": "t1", "runId": "r1", "messages": []}}),
            &["threadId", "runId"],
            &["protocolVersion", "parentRunId", "input"],
        ),
        (
            json!({"type": "RUN_FINISHED", "threadId": "t1", "runId": "r1", "result": {"a": 1},
                   "outcome": {"type": "success"}, "usage": []}),
            &["threadId", "runId"],
            &["result", "outcome", "usage"],
        ),
        (
            json!({"type": "RUN_ERROR", "message": "boom", "code": "E1", "usage": [{}]}),
            &["message"],
            &["code", "usage"],
        ),
        (
            json!({"type": "STEP_STARTED", "stepName": "plan"}),
            &["stepName"],
            &[],
        ),
        (
            json!({"type": "STEP_FINISHED", "stepName": "plan"}),
            &["stepName"],
            &[],
        ),
        (
            json!({"type": "REASONING_START", "messageId": "r1"}),
            &["messageId"],
            &[],
        ),
        (
            json!({"type": "REASONING_MESSAGE_START", "messageId": "r2", "role": "reasoning"}),
            &["messageId", "role"],
            &[],
        ),
        (
            json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "r2", "delta": "hm"}),
            &["messageId", "delta"],
            &[],
        ),
        (
            json!({"type": "REASONING_MESSAGE_END", "messageId": "r2"}),
            &["messageId"],
            &[],
        ),
        (
            json!({"type": "REASONING_MESSAGE_CHUNK", "messageId": "r2", "delta": "hm"}),
            &[],
            &["messageId", "delta"],
        ),
        (
            json!({"type": "REASONING_END", "messageId": "r1"}),
            &["messageId"],
            &[],
        ),
        (
            json!({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "tool-call", "entityId": "c1", "encryptedValue": "opaque"}),
            &["subtype", "entityId", "encryptedValue"],
            &[],
        ),
        (
            json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s1", "name": "researcher", "description": "d",
                   "parentSubagentRunId": "s0", "parentToolCallId": "c1", "parentMessageId": "m1"}),
            &["subagentRunId", "name"],
            &[
                "description",
                "parentSubagentRunId",
                "parentToolCallId",
                "parentMessageId",
            ],
        ),
        (
            json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s1", "result": 1,
                   "outcome": {"type": "suspended", "interruptIds": ["i1"]}}),
            &["subagentRunId"],
            &["result", "outcome"],
        ),
        (
            json!({"type": "SUBAGENT_ERROR", "subagentRunId": "s1", "message": "boom", "code": "E1"}),
            &["subagentRunId", "message"],
            &["code"],
        ),
    ]
}

/// Fields whose value may be any JSON (so `true` is not a wrong type for them) or a boolean.
const TRUE_IS_FINE: &[&str] = &[
    "snapshot", "event", "value", "result", "rawEvent", "replace",
];

#[test]
fn every_type_required_and_optional_fields() {
    let examples = every_type();
    let covered: BTreeSet<&str> = examples
        .iter()
        .map(|(event, _, _)| event["type"].as_str().expect("examples have a type"))
        .collect();
    let all: BTreeSet<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
    assert_eq!(covered, all, "one example per AG-UI 1.0 type");

    for (event, required, optional) in examples {
        let name = event["type"].as_str().unwrap_or_default().to_owned();
        let valid = validate_value(event.clone(), None)
            .unwrap_or_else(|e| panic!("{name} example refused: {e:?}"));
        assert_eq!(valid.event_type.as_str(), name);
        assert_round_trip(&event, &valid);

        let base: &[&str] = if name.starts_with("SUBAGENT_") {
            &["timestamp", "rawEvent", "metadata"]
        } else {
            &["timestamp", "rawEvent", "metadata", "subagentRunId"]
        };
        for field in required.iter().chain(optional).chain(base) {
            let mut changed = event.clone();
            let members = changed.as_object_mut().expect("examples are objects");
            let was_required = required.contains(field);

            members.remove(*field);
            let outcome = validate_value(changed.clone(), None);
            if was_required {
                let e = outcome.expect_err(&format!("{name} without {field}"));
                assert_eq!(e.field.as_deref(), Some(*field));
                assert_eq!(e.message, format!("{field} is required"));
            } else {
                assert!(
                    outcome.is_ok(),
                    "{name} without optional {field}: {outcome:?}"
                );
                let members = changed.as_object_mut().expect("still an object");
                members.insert((*field).to_owned(), Value::Null);
                let e = validate_value(changed.clone(), None)
                    .expect_err(&format!("{name} with {field}: null"));
                assert_eq!(e.field.as_deref(), Some(*field));
                assert_eq!(e.message, format!("{field} must not be null"));
            }

            if !TRUE_IS_FINE.contains(field) {
                let members = changed.as_object_mut().expect("still an object");
                members.insert((*field).to_owned(), Value::Bool(true));
                let e =
                    validate_value(changed, None).expect_err(&format!("{name} with {field}: true"));
                assert_eq!(e.field.as_deref(), Some(*field), "{e:?}");
            }
        }
    }
}

// ---- Whole-event errors -------------------------------------------------------------

#[test]
fn not_json_or_not_an_object() {
    let cases: &[(&[u8], &str)] = &[
        (b"", "malformed JSON"),
        (b"{\"type\":", "malformed JSON"),
        (b"{\"type\":\"RAW\",\"event\":1} {}", "malformed JSON"),
        (b"{'type':'RAW'}", "malformed JSON"),
        (
            b"{\"type\":\"RAW\",\"event\":\"\xff\"}",
            "not UTF-8: invalid byte at offset 23",
        ),
        (b"\xc3\x28", "not UTF-8"),
        (b"[]", "must be a JSON object, got an array"),
        (b"\"RAW\"", "must be a JSON object, got a string"),
        (b"null", "must be a JSON object, got null"),
        (b"42", "must be a JSON object, got a number"),
        (b"[{\"type\":\"RAW\",\"event\":1}]", "must be a JSON object"),
    ];
    for (bytes, fragment) in cases {
        let e = validate_event(bytes, None).expect_err("refused");
        assert_eq!(e.field, None, "{e:?}");
        assert!(e.message.contains(fragment), "{e:?} lacks {fragment:?}");
    }
    let ok = validate_event(b" {\"type\":\"RAW\",\"event\":1}\n", None).expect("accepted");
    assert_eq!(ok.json.as_ref(), br#"{"type":"RAW","event":1}"#);
}

#[test]
fn unknown_and_malformed_types() {
    check_rows(&[
        (json!({"event": 1}), Some(("type", "type is required"))),
        (json!({"type": 5}), Some(("type", "type must be a string"))),
        (
            json!({"type": null}),
            Some(("type", "type must be a string")),
        ),
        (
            json!({"type": "FUTURE_EVENT"}),
            Some((
                "type",
                "type \"FUTURE_EVENT\" is not an AG-UI 1.0 event type",
            )),
        ),
        (
            json!({"type": "state_delta", "delta": []}),
            Some(("type", "\"state_delta\"")),
        ),
        (
            json!({"type": ""}),
            Some(("type", "type \"\" is not an AG-UI 1.0 event type")),
        ),
        (
            json!({"type": "THINKING_START"}),
            Some(("type", "type \"THINKING_START\" was removed in AG-UI 1.0")),
        ),
        (
            json!({"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": "x"}),
            Some(("type", "THINKING_TEXT_MESSAGE_CONTENT")),
        ),
    ]);
    let long = "X".repeat(10_000);
    let e = validate_value(json!({"type": long}), None).expect_err("unknown");
    assert!(
        e.message.len() < 200,
        "producer strings are cut: {}",
        e.message
    );
}

// ---- Base fields --------------------------------------------------------------------

#[test]
fn timestamps() {
    let rows: Vec<(Value, Expect)> = [
        ("0", None),
        ("-1", None),
        ("-0", None),
        ("1700000000000", None),
        ("9007199254740991", None),
        ("-9007199254740991", None),
        ("1.5", Some(("timestamp", "timestamp must be an integer"))),
        ("1.0", Some(("timestamp", "timestamp must be an integer"))),
        ("-2.0", Some(("timestamp", "timestamp must be an integer"))),
        ("1e3", Some(("timestamp", "timestamp must be an integer"))),
        ("1E3", Some(("timestamp", "timestamp must be an integer"))),
        (
            "\"1700000000000\"",
            Some(("timestamp", "timestamp must be an integer")),
        ),
        ("true", Some(("timestamp", "timestamp must be an integer"))),
        ("null", Some(("timestamp", "timestamp must not be null"))),
        (
            "9007199254740992",
            Some(("timestamp", "must be a safe integer")),
        ),
        (
            "-9007199254740992",
            Some(("timestamp", "must be a safe integer")),
        ),
        (
            "9223372036854775808",
            Some(("timestamp", "must be a safe integer")),
        ),
        (
            "-9223372036854775809",
            Some(("timestamp", "must be a safe integer")),
        ),
        (
            "123456789012345678901234567890",
            Some(("timestamp", "must be a safe integer")),
        ),
        ("1e400", Some(("timestamp", "timestamp must be an integer"))),
    ]
    .into_iter()
    .map(|(number, expect)| {
        let text = format!(r#"{{"type":"STEP_STARTED","stepName":"s","timestamp":{number}}}"#);
        (parse(&text), expect)
    })
    .collect();
    check_rows(&rows);
    // The exact wording for the common mistake.
    let e = validate_event(
        br#"{"type":"RUN_ERROR","message":"m","timestamp":1.5}"#,
        None,
    )
    .expect_err("float timestamp");
    assert_eq!(e.message, "timestamp must be an integer");
}

#[test]
fn raw_event_metadata_and_attribution() {
    let step = json!({"type": "STEP_STARTED", "stepName": "s"});
    let subagent = json!({"type": "SUBAGENT_ERROR", "message": "m"});
    check_rows(&[
        (with(&step, json!({"rawEvent": 0})), None),
        (with(&step, json!({"rawEvent": ""})), None),
        (with(&step, json!({"rawEvent": [null]})), None),
        (
            with(&step, json!({"rawEvent": null})),
            Some(("rawEvent", "must not be null")),
        ),
        (with(&step, json!({"metadata": {}})), None),
        (
            with(&step, json!({"metadata": {"k": null, "ag-ui": {"x": 1}}})),
            None,
        ),
        (
            with(&step, json!({"metadata": null})),
            Some(("metadata", "metadata must not be null")),
        ),
        (
            with(&step, json!({"metadata": []})),
            Some(("metadata", "metadata must be an object")),
        ),
        (
            with(&step, json!({"metadata": "x"})),
            Some(("metadata", "must be an object")),
        ),
        (with(&step, json!({"subagentRunId": "s1"})), None),
        (
            with(&step, json!({"subagentRunId": null})),
            Some(("subagentRunId", "must not be null")),
        ),
        (
            with(&step, json!({"subagentRunId": 7})),
            Some(("subagentRunId", "must be a string")),
        ),
        (with(&subagent, json!({"subagentRunId": "s1"})), None),
        (
            subagent.clone(),
            Some(("subagentRunId", "subagentRunId is required")),
        ),
        (
            with(&subagent, json!({"subagentRunId": null})),
            Some(("subagentRunId", "subagentRunId must be a string")),
        ),
    ]);
    let e = validate_value(json!({"type": "TEXT_MESSAGE_END", "messageId": 5}), None)
        .expect_err("numeric id");
    assert_eq!(e.message, "messageId must be a string");
    assert_eq!(e.field.as_deref(), Some("messageId"));
}

// ---- Enumerations -------------------------------------------------------------------

#[test]
fn enumerations() {
    let start = json!({"type": "TEXT_MESSAGE_START", "messageId": "m"});
    let reasoning = json!({"type": "REASONING_MESSAGE_START", "messageId": "m"});
    let result =
        json!({"type": "TOOL_CALL_RESULT", "messageId": "m", "toolCallId": "c", "content": ""});
    let encrypted =
        json!({"type": "REASONING_ENCRYPTED_VALUE", "entityId": "e", "encryptedValue": "v"});
    let activity = json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "a", "activityType": "PLAN"});
    let mut rows: Vec<(Value, Expect)> = ["developer", "system", "assistant", "user"]
        .into_iter()
        .map(|role| (with(&start, json!({"role": role})), None))
        .collect();
    rows.extend([
        (
            with(&start, json!({"role": "tool"})),
            Some((
                "role",
                "role must be one of developer, system, assistant, user",
            )),
        ),
        (
            with(&start, json!({"role": "Assistant"})),
            Some(("role", "must be one of")),
        ),
        (
            with(&start, json!({"role": 1})),
            Some(("role", "must be one of")),
        ),
        (
            json!({"type": "TEXT_MESSAGE_CHUNK", "role": "reasoning"}),
            Some(("role", "must be one of developer, system, assistant, user")),
        ),
        (with(&reasoning, json!({"role": "reasoning"})), None),
        (reasoning.clone(), Some(("role", "role is required"))),
        (
            with(&reasoning, json!({"role": "assistant"})),
            Some(("role", "role must be \"reasoning\"")),
        ),
        (with(&result, json!({"role": "tool"})), None),
        (
            with(&result, json!({"role": "user"})),
            Some(("role", "role must be \"tool\"")),
        ),
        (with(&encrypted, json!({"subtype": "message"})), None),
        (with(&encrypted, json!({"subtype": "tool-call"})), None),
        (
            with(&encrypted, json!({"subtype": "tool_call"})),
            Some(("subtype", "subtype must be one of tool-call, message")),
        ),
        (
            with(&activity, json!({"content": {"a": null}, "replace": true})),
            None,
        ),
        (
            with(&activity, json!({"content": []})),
            Some(("content", "content must be an object")),
        ),
        (
            with(&activity, json!({"content": null})),
            Some(("content", "content must be an object")),
        ),
        (
            with(&activity, json!({"content": {}, "replace": "true"})),
            Some(("replace", "replace must be a boolean")),
        ),
    ]);
    check_rows(&rows);
}

// ---- RUN_FINISHED / SUBAGENT_FINISHED outcomes and usage ----------------------------

#[test]
fn run_outcomes() {
    let finished = json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"});
    let outcome = |o: Value| with(&finished, json!({"outcome": o}));
    let interrupt = |i: Value| outcome(json!({"type": "interrupt", "interrupts": [i]}));
    check_rows(&[
        (outcome(json!({"type": "success"})), None),
        (
            outcome(json!({"type": "success", "pendingToolCallIds": ["c1", "c2"]})),
            None,
        ),
        (outcome(json!({"type": "cancelled"})), None),
        (interrupt(json!({"id": "i1", "reason": "approval"})), None),
        (
            interrupt(
                json!({"id": "i1", "reason": "input_required", "message": "name?", "toolCallId": "c1",
                             "responseSchema": {"type": "object"}, "expiresAt": "2030-01-01T00:00:00Z",
                             "metadata": {"traceId": null}, "subagentRunId": "s1", "future": 1}),
            ),
            None,
        ),
        // An outcome the client does not know is stripped (read as success): accepted.
        (
            outcome(json!({"type": "partial", "interrupts": "anything"})),
            None,
        ),
        (with(&finished, json!({"result": 0})), None),
        (
            with(&finished, json!({"result": null})),
            Some(("result", "result must not be null")),
        ),
        (
            with(&finished, json!({"outcome": null})),
            Some(("outcome", "outcome must not be null")),
        ),
        (
            outcome(json!([])),
            Some(("outcome", "outcome must be an object")),
        ),
        (
            outcome(json!("success")),
            Some(("outcome", "outcome must be an object")),
        ),
        (
            outcome(json!({})),
            Some(("outcome.type", "outcome.type is required")),
        ),
        (
            outcome(json!({"type": 5})),
            Some(("outcome.type", "outcome.type must be a string")),
        ),
        (
            outcome(json!({"type": "success", "pendingToolCallIds": "c1"})),
            Some(("outcome.pendingToolCallIds", "must be an array")),
        ),
        (
            outcome(json!({"type": "success", "pendingToolCallIds": ["c1", 2]})),
            Some((
                "outcome.pendingToolCallIds[1]",
                "outcome.pendingToolCallIds[1] must be a string",
            )),
        ),
        (
            outcome(json!({"type": "interrupt"})),
            Some(("outcome.interrupts", "outcome.interrupts is required")),
        ),
        (
            outcome(json!({"type": "interrupt", "interrupts": []})),
            Some(("outcome.interrupts", "must have at least 1 item")),
        ),
        (
            outcome(json!({"type": "interrupt", "interrupts": {}})),
            Some(("outcome.interrupts", "must be an array")),
        ),
        (
            interrupt(json!({"reason": "r"})),
            Some((
                "outcome.interrupts[0].id",
                "outcome.interrupts[0].id is required",
            )),
        ),
        (
            interrupt(json!({"id": "i", "reason": 5})),
            Some(("outcome.interrupts[0].reason", "must be a string")),
        ),
        (
            interrupt(json!("i1")),
            Some(("outcome.interrupts[0]", "must be an object")),
        ),
        (
            interrupt(json!({"id": "i", "reason": "r", "responseSchema": true})),
            Some(("outcome.interrupts[0].responseSchema", "must be an object")),
        ),
        (
            interrupt(json!({"id": "i", "reason": "r", "expiresAt": 1})),
            Some(("outcome.interrupts[0].expiresAt", "must be a string")),
        ),
        (
            interrupt(json!({"id": "i", "reason": "r", "metadata": null})),
            Some(("outcome.interrupts[0].metadata", "must not be null")),
        ),
        (
            outcome(
                json!({"type": "interrupt", "interrupts": [{"id": "a", "reason": "r"}, {"reason": "r"}]}),
            ),
            Some(("outcome.interrupts[1].id", "is required")),
        ),
    ]);

    let subagent = json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s1"});
    let sub = |o: Value| with(&subagent, json!({"outcome": o}));
    check_rows(&[
        (sub(json!({"type": "success"})), None),
        (sub(json!({"type": "suspended"})), None),
        (sub(json!({"type": "suspended", "interruptIds": []})), None),
        (
            sub(json!({"type": "failed"})),
            Some((
                "outcome.type",
                "outcome.type must be one of success, suspended",
            )),
        ),
        (
            sub(json!({"type": null})),
            Some(("outcome.type", "must be one of success, suspended")),
        ),
        (
            sub(json!({"type": "suspended", "interruptIds": [1]})),
            Some(("outcome.interruptIds[0]", "must be a string")),
        ),
        (
            with(&subagent, json!({"result": null})),
            Some(("result", "must not be null")),
        ),
    ]);
}

#[test]
fn token_usage() {
    let finished = json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"});
    let error = json!({"type": "RUN_ERROR", "message": "m"});
    let usage = |u: Value| with(&finished, json!({"usage": u}));
    check_rows(&[
        (usage(json!([])), None),
        (
            usage(
                json!([{"provider": "openai", "model": "gpt", "inputTokens": 11, "outputTokens": 22,
                          "totalTokens": 33, "reasoningTokens": 4, "cachedInputTokens": 0,
                          "cacheWriteInputTokens": 9007199254740991_i64, "costUsd": 0.5}]),
            ),
            None,
        ),
        (with(&error, json!({"usage": [{"inputTokens": 120}]})), None),
        (usage(json!({})), Some(("usage", "usage must be an array"))),
        (
            usage(json!([5])),
            Some(("usage[0]", "usage[0] must be an object")),
        ),
        (
            usage(json!([{}, {"inputTokens": -1}])),
            Some((
                "usage[1].inputTokens",
                "usage[1].inputTokens must be a non-negative integer",
            )),
        ),
        (
            usage(parse(r#"[{"outputTokens": 1.5}]"#)),
            Some(("usage[0].outputTokens", "non-negative integer")),
        ),
        (
            usage(parse(r#"[{"outputTokens": 2.0}]"#)),
            Some(("usage[0].outputTokens", "non-negative integer")),
        ),
        (
            usage(json!([{"totalTokens": "3"}])),
            Some(("usage[0].totalTokens", "non-negative integer")),
        ),
        (
            usage(json!([{"totalTokens": 9007199254740992_i64}])),
            Some((
                "usage[0].totalTokens",
                "must be a safe integer, between 0 and 9007199254740991",
            )),
        ),
        (
            usage(parse(
                r#"[{"totalTokens": -123456789012345678901234567890}]"#,
            )),
            Some(("usage[0].totalTokens", "non-negative integer")),
        ),
        (
            usage(json!([{"provider": 1}])),
            Some(("usage[0].provider", "must be a string")),
        ),
        (
            usage(json!([{"model": null}])),
            Some(("usage[0].model", "must not be null")),
        ),
        (
            with(&error, json!({"usage": [{"reasoningTokens": -5}]})),
            Some(("usage[0].reasoningTokens", "non-negative")),
        ),
    ]);
}

// ---- TOOL_CALL_RESULT content and content parts -------------------------------------

#[test]
fn content_parts() {
    let result = json!({"type": "TOOL_CALL_RESULT", "messageId": "m", "toolCallId": "c"});
    let content = |c: Value| with(&result, json!({"content": c}));
    let parts = |p: Value| content(json!([p]));
    let mut rows: Vec<(Value, Expect)> = vec![
        (content(json!("{\"ok\":true}")), None),
        (content(json!([])), None),
        (
            parts(
                json!({"type": "text", "text": "hi", "id": "p1", "metadata": "anything but null"}),
            ),
            None,
        ),
        (
            parts(json!({"type": "image", "source": {"type": "url", "value": "https://x/y.png"}})),
            None,
        ),
        (
            parts(
                json!({"type": "image", "source": {"type": "data", "value": "AA==", "mimeType": "image/png"}}),
            ),
            None,
        ),
        (
            parts(
                json!({"type": "document", "source": {"type": "file", "value": "file-1", "provider": "openai", "mimeType": "application/pdf"}}),
            ),
            None,
        ),
        (
            content(json!(5)),
            Some((
                "content",
                "content must be a string or an array of content parts",
            )),
        ),
        (
            content(json!({"type": "text", "text": "x"})),
            Some(("content", "must be a string or an array")),
        ),
        (
            content(json!(null)),
            Some(("content", "must be a string or an array")),
        ),
        (
            content(json!(["text"])),
            Some(("content[0]", "content[0] must be an object")),
        ),
        (
            parts(json!({"text": "x"})),
            Some(("content[0].type", "content[0].type is required")),
        ),
        (
            parts(json!({"type": "text"})),
            Some(("content[0].text", "content[0].text is required")),
        ),
        (
            parts(json!({"type": "text", "text": 1})),
            Some(("content[0].text", "must be a string")),
        ),
        (
            parts(json!({"type": "text", "text": "x", "metadata": null})),
            Some(("content[0].metadata", "must not be null")),
        ),
        (
            parts(json!({"type": "binary", "mimeType": "image/png", "data": "AA=="})),
            Some((
                "content[0].type",
                "must be one of text, image, audio, video, document",
            )),
        ),
        (
            parts(json!({"type": "image"})),
            Some(("content[0].source", "content[0].source is required")),
        ),
        (
            parts(json!({"type": "image", "source": "https://x"})),
            Some(("content[0].source", "must be an object")),
        ),
        (
            parts(json!({"type": "audio", "source": {"type": "data", "value": "AA=="}})),
            Some((
                "content[0].source.mimeType",
                "content[0].source.mimeType is required",
            )),
        ),
        (
            parts(json!({"type": "video", "source": {"type": "s3", "value": "k"}})),
            Some(("content[0].source.type", "must be one of data, url, file")),
        ),
        (
            parts(json!({"type": "image", "source": {"type": "url"}})),
            Some(("content[0].source.value", "is required")),
        ),
    ];
    for media in ["audio", "video", "document"] {
        rows.push((
            parts(json!({"type": media, "source": {"type": "url", "value": "u"}})),
            None,
        ));
    }
    check_rows(&rows);
}

// ---- JSON Patch (RFC 6902) and JSON Pointer (RFC 6901) ------------------------------

#[test]
fn json_patch_operations() {
    let delta = |ops: Value| json!({"type": "STATE_DELTA", "delta": ops});
    let op = |o: Value| delta(json!([o]));
    check_rows(&[
        (delta(json!([])), None),
        (
            delta(json!([
                {"op": "add", "path": "/a", "value": 1},
                {"op": "remove", "path": "/a"},
                {"op": "replace", "path": "/b", "value": {"c": [1]}},
                {"op": "move", "from": "/b", "path": "/c"},
                {"op": "copy", "from": "/c", "path": "/d"},
                {"op": "test", "path": "/d", "value": null},
            ])),
            None,
        ),
        (
            op(json!({"op": "replace", "path": "/selectedId", "value": null})),
            None,
        ),
        // RFC 6902 §4: members an operation does not define are kept, not refused.
        (
            op(json!({"op": "remove", "path": "/items/1", "value": "drop-me", "x-note": 1})),
            None,
        ),
        (delta(json!({})), Some(("delta", "delta must be an array"))),
        (
            delta(json!(null)),
            Some(("delta", "delta must be an array")),
        ),
        (
            json!({"type": "STATE_DELTA"}),
            Some(("delta", "delta is required")),
        ),
        (
            delta(json!([5])),
            Some(("delta[0]", "delta[0] must be an object")),
        ),
        (
            op(json!({"path": "/a", "value": 1})),
            Some(("delta[0].op", "delta[0].op is required")),
        ),
        (
            op(json!({"op": "increment", "path": "/count", "value": 1})),
            Some((
                "delta[0].op",
                "delta[0].op must be one of add, remove, replace, move, copy, test",
            )),
        ),
        (
            op(json!({"op": "ADD", "path": "/a", "value": 1})),
            Some(("delta[0].op", "must be one of")),
        ),
        (
            op(json!({"op": 1, "path": "/a", "value": 1})),
            Some(("delta[0].op", "must be one of")),
        ),
        (
            op(json!({"op": "add", "value": 1})),
            Some(("delta[0].path", "delta[0].path is required")),
        ),
        (
            op(json!({"op": "add", "path": 5, "value": 1})),
            Some(("delta[0].path", "delta[0].path must be a string")),
        ),
        (
            op(json!({"op": "add", "path": "/a"})),
            Some(("delta[0].value", "delta[0].value is required")),
        ),
        (
            op(json!({"op": "replace", "path": "/a"})),
            Some(("delta[0].value", "is required")),
        ),
        (
            op(json!({"op": "test", "path": "/a"})),
            Some(("delta[0].value", "is required")),
        ),
        (
            op(json!({"op": "move", "path": "/a"})),
            Some(("delta[0].from", "delta[0].from is required")),
        ),
        (
            op(json!({"op": "copy", "from": "a", "path": "/b"})),
            Some(("delta[0].from", "must be a JSON Pointer")),
        ),
        (
            op(json!({"op": "copy", "from": null, "path": "/b"})),
            Some(("delta[0].from", "must be a string")),
        ),
        (
            delta(json!([
                {"op": "add", "path": "/a", "value": 1},
                {"op": "remove", "path": "/a"},
                {"op": "add", "path": "a/b", "value": 1},
            ])),
            Some((
                "delta[2].path",
                "delta[2].path must be a JSON Pointer (RFC 6901)",
            )),
        ),
    ]);
    let patch = json!({"type": "ACTIVITY_DELTA", "messageId": "a", "activityType": "PLAN",
                       "patch": [{"op": "replace", "path": "/found", "value": 3}, {"op": "nope", "path": "/x"}]});
    check_rows(&[(patch, Some(("patch[1].op", "patch[1].op must be one of")))]);
}

// ---- Messages (MESSAGES_SNAPSHOT) ----------------------------------------------------

#[test]
fn messages() {
    let snapshot = |messages: Value| json!({"type": "MESSAGES_SNAPSHOT", "messages": messages});
    let one = |message: Value| snapshot(json!([message]));
    let tool_call = |call: Value| one(json!({"id": "a", "role": "assistant", "toolCalls": [call]}));
    check_rows(&[
        (
            snapshot(json!([
                {"id": "0", "role": "developer", "content": "Be brief.", "name": "dev", "encryptedValue": "e"},
                {"id": "1", "role": "system", "content": "Be kind."},
                {"id": "2", "role": "user", "content": "Hi", "metadata": {"k": null}, "subagentRunId": "s1"},
                {"id": "3", "role": "user", "content": [{"type": "text", "text": "see"},
                    {"type": "image", "source": {"type": "url", "value": "https://x/y.png"}}]},
                {"id": "4", "role": "assistant"},
                {"id": "5", "role": "assistant", "content": "calling", "toolCalls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"},
                     "encryptedValue": "e", "metadata": {}}]},
                {"id": "6", "role": "tool", "content": "{\"ok\":1}", "toolCallId": "c1", "error": "partial"},
                {"id": "7", "role": "tool", "content": [], "toolCallId": "c1"},
                {"id": "8", "role": "activity", "activityType": "PLAN", "content": {"tasks": []}},
                {"id": "9", "role": "reasoning", "content": "hm", "encryptedValue": "e", "futureField": [1]},
            ])),
            None,
        ),
        (
            snapshot(json!({})),
            Some(("messages", "messages must be an array")),
        ),
        (
            json!({"type": "MESSAGES_SNAPSHOT"}),
            Some(("messages", "messages is required")),
        ),
        (
            snapshot(json!([5])),
            Some(("messages[0]", "messages[0] must be an object")),
        ),
        (
            one(json!({"role": "user", "content": "x"})),
            Some(("messages[0].id", "messages[0].id is required")),
        ),
        (
            one(json!({"id": 1, "role": "user", "content": "x"})),
            Some(("messages[0].id", "must be a string")),
        ),
        (
            one(json!({"id": "1", "content": "x"})),
            Some(("messages[0].role", "messages[0].role is required")),
        ),
        (
            one(json!({"id": "1", "role": "bot", "content": "x"})),
            Some((
                "messages[0].role",
                "must be one of developer, system, assistant, user, tool, activity, reasoning",
            )),
        ),
        (
            one(json!({"id": "1", "role": "user"})),
            Some(("messages[0].content", "messages[0].content is required")),
        ),
        (
            one(json!({"id": "1", "role": "developer", "content": []})),
            Some(("messages[0].content", "must be a string")),
        ),
        (
            one(json!({"id": "1", "role": "system", "content": "x", "name": null})),
            Some(("messages[0].name", "must not be null")),
        ),
        (
            one(json!({"id": "1", "role": "assistant", "content": null})),
            Some(("messages[0].content", "must not be null")),
        ),
        (
            one(json!({"id": "1", "role": "user", "content": "x", "metadata": []})),
            Some(("messages[0].metadata", "must be an object")),
        ),
        (
            one(
                json!({"id": "1", "role": "user", "content": [{"type": "binary", "data": "AA=="}]}),
            ),
            Some(("messages[0].content[0].type", "must be one of text, image")),
        ),
        (
            tool_call(
                json!({"id": "c", "type": "fn", "function": {"name": "f", "arguments": "{}"}}),
            ),
            Some((
                "messages[0].toolCalls[0].type",
                "messages[0].toolCalls[0].type must be \"function\"",
            )),
        ),
        (
            tool_call(json!({"id": "c", "type": "function", "function": {"name": "f"}})),
            Some(("messages[0].toolCalls[0].function.arguments", "is required")),
        ),
        (
            tool_call(
                json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}),
            ),
            Some((
                "messages[0].toolCalls[0].function.arguments",
                "must be a string",
            )),
        ),
        (
            tool_call(json!({"type": "function", "function": {"name": "f", "arguments": ""}})),
            Some(("messages[0].toolCalls[0].id", "is required")),
        ),
        (
            snapshot(
                json!([{"id": "1", "role": "user", "content": "x"}, {"id": "2", "role": "tool", "content": "r"}]),
            ),
            Some((
                "messages[1].toolCallId",
                "messages[1].toolCallId is required",
            )),
        ),
        (
            one(json!({"id": "1", "role": "activity", "activityType": "PLAN", "content": "x"})),
            Some(("messages[0].content", "must be an object")),
        ),
        (
            one(json!({"id": "1", "role": "activity", "content": {}})),
            Some(("messages[0].activityType", "is required")),
        ),
        (
            one(json!({"id": "1", "role": "reasoning"})),
            Some(("messages[0].content", "is required")),
        ),
    ]);
}

// ---- RUN_STARTED and its RunAgentInput ----------------------------------------------

#[test]
fn run_agent_input() {
    let started = json!({"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"});
    let input = |extra: Value| {
        with(
            &started,
            json!({"input": with(&json!({"threadId": "t1", "runId": "r1", "messages": []}), extra)}),
        )
    };
    check_rows(&[
        (input(json!({})), None),
        (
            input(json!({
                "messages": [{"id": "u1", "role": "user", "content": "Hello"}],
                "tools": [{"name": "search", "description": "Search", "parameters": {"type": "object"}, "metadata": {}}],
                "context": [{"description": "locale", "value": "en-US"}],
                "state": {"recipe": {}}, "forwardedProps": {}, "protocolVersion": "1.0", "parentRunId": "r0",
                "resume": [{"interruptId": "i1", "status": "resolved", "payload": {"ok": true}, "metadata": {}},
                           {"interruptId": "i2", "status": "cancelled"}],
            })),
            None,
        ),
        (input(json!({"state": 0, "forwardedProps": []})), None),
        (
            with(&started, json!({"input": []})),
            Some(("input", "input must be an object")),
        ),
        (
            with(&started, json!({"input": null})),
            Some(("input", "input must not be null")),
        ),
        (
            with(
                &started,
                json!({"input": {"threadId": "t1", "runId": "r1"}}),
            ),
            Some(("input.messages", "input.messages is required")),
        ),
        (
            with(
                &started,
                json!({"input": {"threadId": "t1", "messages": []}}),
            ),
            Some(("input.runId", "input.runId is required")),
        ),
        (
            input(json!({"threadId": 5})),
            Some(("input.threadId", "input.threadId must be a string")),
        ),
        (
            input(json!({"messages": [{"id": "u1", "role": "human", "content": "x"}]})),
            Some((
                "input.messages[0].role",
                "input.messages[0].role must be one of developer, system",
            )),
        ),
        (
            input(json!({"tools": [{"name": "f"}]})),
            Some(("input.tools[0].description", "is required")),
        ),
        (
            input(json!({"tools": [{"name": "f", "description": "d", "parameters": null}]})),
            Some(("input.tools[0].parameters", "must not be null")),
        ),
        (
            input(json!({"tools": {}})),
            Some(("input.tools", "must be an array")),
        ),
        (
            input(json!({"context": [{"description": "d", "value": 5}]})),
            Some((
                "input.context[0].value",
                "input.context[0].value must be a string",
            )),
        ),
        (
            input(json!({"state": null})),
            Some(("input.state", "input.state must not be null")),
        ),
        (
            input(json!({"forwardedProps": null})),
            Some(("input.forwardedProps", "must not be null")),
        ),
        (
            input(json!({"resume": [{"interruptId": "i", "status": "done"}]})),
            Some((
                "input.resume[0].status",
                "must be one of resolved, cancelled",
            )),
        ),
        (
            input(json!({"resume": [{"status": "resolved"}]})),
            Some(("input.resume[0].interruptId", "is required")),
        ),
        (
            input(json!({"resume": [{"interruptId": "i", "status": "resolved", "payload": null}]})),
            Some(("input.resume[0].payload", "must not be null")),
        ),
        (
            input(json!({"protocolVersion": 1})),
            Some(("input.protocolVersion", "must be a string")),
        ),
        (
            input(json!({"parentRunId": null})),
            Some(("input.parentRunId", "must not be null")),
        ),
        (
            with(&started, json!({"protocolVersion": 1.0})),
            Some(("protocolVersion", "protocolVersion must be a string")),
        ),
        (
            with(&started, json!({"parentRunId": null})),
            Some(("parentRunId", "must not be null")),
        ),
    ]);
}

// ---- Thread binding -----------------------------------------------------------------

#[test]
fn thread_binding() {
    let t1 = thread("t1");
    let started = json!({"type": "RUN_STARTED", "threadId": "t1", "runId": "r1",
                         "input": {"threadId": "t1", "runId": "r1", "messages": []}});
    assert!(validate_value(started.clone(), Some(&t1)).is_ok());
    assert!(validate_value(started.clone(), None).is_ok());
    assert!(validate_value(started.clone(), Some(&thread("t2"))).is_err());

    let refused = |event: Value, field: &str| {
        let e = validate_value(event, Some(&t1)).expect_err(field);
        assert_eq!(e.field.as_deref(), Some(field), "{e:?}");
        assert!(
            e.message.contains("\"t1\"") && e.message.contains("\"t2\""),
            "{e:?}"
        );
    };
    refused(with(&started, json!({"threadId": "t2"})), "threadId");
    refused(
        with(
            &started,
            json!({"input": {"threadId": "t2", "runId": "r1", "messages": []}}),
        ),
        "input.threadId",
    );
    refused(
        json!({"type": "RUN_FINISHED", "threadId": "t2", "runId": "r1"}),
        "threadId",
    );
    let finished = json!({"type": "RUN_FINISHED", "threadId": "t1", "runId": "r1"});
    assert!(validate_value(finished, Some(&t1)).is_ok());
    // Events without a threadId are not bound to anything.
    let error = json!({"type": "RUN_ERROR", "message": "m"});
    assert!(validate_value(error, Some(&t1)).is_ok());
    // Schema errors come before the thread check.
    let e = validate_value(
        json!({"type": "RUN_FINISHED", "threadId": 7, "runId": "r"}),
        Some(&t1),
    )
    .expect_err("numeric threadId");
    assert_eq!(e.message, "threadId must be a string");
}

// ---- What is stored -----------------------------------------------------------------

#[test]
fn unknown_fields_key_order_and_number_text_are_kept() {
    let text = r#"{"runId":"r","futureField":{"deep":[1,2.50,-0]},"type":"RUN_FINISHED","threadId":"t",
        "outcome":{"type":"interrupt","interrupts":[{"reason":"r","id":"i","x":null}],"y":1}}"#;
    let valid = validate_event(text.as_bytes(), None).expect("accepted");
    assert_eq!(valid.event_type, EventType::RunFinished);
    assert_eq!(
        std::str::from_utf8(&valid.json).expect("UTF-8"),
        r#"{"runId":"r","futureField":{"deep":[1,2.50,-0]},"type":"RUN_FINISHED","threadId":"t","outcome":{"type":"interrupt","interrupts":[{"reason":"r","id":"i","x":null}],"y":1}}"#
    );
    // Numbers keep their digits beyond f64 range and precision; serde_json only respells
    // an exponent as `e` with an explicit sign.
    let huge = r#"{"type":"STATE_SNAPSHOT","snapshot":{"big":123456789012345678901234567890,"tiny":1e-400,"huge":-1E400,"f":0.10}}"#;
    let valid = validate_event(huge.as_bytes(), None).expect("accepted");
    assert_eq!(
        valid.json.as_ref(),
        br#"{"type":"STATE_SNAPSHOT","snapshot":{"big":123456789012345678901234567890,"tiny":1e-400,"huge":-1e+400,"f":0.10}}"#
    );
}

#[test]
fn stored_json_never_contains_a_raw_newline() {
    let pretty = "{\n  \"type\": \"TEXT_MESSAGE_CONTENT\",\r\n  \"messageId\": \"m\",\n  \"delta\": \"a\\nb\\r\\n\\u2028c\\u0000\"\n}\n";
    let valid = validate_event(pretty.as_bytes(), None).expect("accepted");
    assert!(!valid.json.contains(&b'\n') && !valid.json.contains(&b'\r'));
    assert_eq!(
        valid.json.as_ref(),
        "{\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\\nb\\r\\n\u{2028}c\\u0000\"}".as_bytes()
    );
    assert_eq!(
        valid.value().expect("parses")["delta"],
        "a\nb\r\n\u{2028}c\u{0}"
    );
}

#[test]
fn deep_nesting_is_refused_not_a_crash() {
    let depth = 100_000;
    let deep = format!(
        r#"{{"type":"STATE_SNAPSHOT","snapshot":{}{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let e = validate_event(deep.as_bytes(), None).expect_err("too deep");
    assert!(e.message.starts_with("malformed JSON"), "{e:?}");

    let nested = |levels: usize| {
        let mut value = json!([]);
        for _ in 1..levels {
            value = Value::Array(vec![value]);
        }
        json!({"type": "STATE_SNAPSHOT", "snapshot": value})
    };
    // The event object is level 1, the snapshot's arrays the levels below it.
    assert!(validate_value(nested(MAX_DEPTH - 1), None).is_ok());
    let e = validate_value(nested(MAX_DEPTH), None).expect_err("too deep");
    assert_eq!(e.field, None);
    assert!(e.message.contains("levels deep"), "{e:?}");
}

proptest::proptest! {
    /// Arbitrary bytes never panic, whatever they are.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
        let _ = validate_event(&bytes, None);
    }

    /// Any value in any known field of any event type is either refused with a field, or
    /// accepted and stored unchanged.
    #[test]
    fn arbitrary_members_never_panic(
        type_index in 0..EventType::ALL.len(),
        members in proptest::collection::vec((field_name(), json_value()), 0..6),
    ) {
        let mut event = Map::new();
        event.insert("type".into(), Value::from(EventType::ALL[type_index].as_str()));
        event.extend(members);
        let event = Value::Object(event);
        match validate_value(event.clone(), Some(&thread("t1"))) {
            Ok(valid) => assert_round_trip(&event, &valid),
            Err(e) => proptest::prop_assert!(e.field.is_some() || e.message.contains("levels deep")),
        }
    }
}

fn field_name() -> impl proptest::strategy::Strategy<Value = String> {
    proptest::sample::select(vec![
        "messageId",
        "delta",
        "role",
        "content",
        "snapshot",
        "messages",
        "patch",
        "input",
        "outcome",
        "usage",
        "timestamp",
        "metadata",
        "rawEvent",
        "subagentRunId",
        "threadId",
        "runId",
        "toolCallId",
        "toolCallName",
        "name",
        "value",
        "event",
        "subtype",
        "result",
    ])
    .prop_map(str::to_owned)
}

fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        proptest::sample::select(vec![
            "",
            "/a",
            "a/b",
            "~2",
            "add",
            "user",
            "t1",
            "text",
            "interrupt"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((field_name_or_tag(), inner), 0..4)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn field_name_or_tag() -> impl proptest::strategy::Strategy<Value = String> {
    proptest::sample::select(vec![
        "type",
        "op",
        "path",
        "from",
        "value",
        "id",
        "role",
        "content",
        "threadId",
        "runId",
        "messages",
        "interrupts",
        "reason",
        "text",
        "source",
        "toolCalls",
        "function",
    ])
    .prop_map(str::to_owned)
}
