//! Schema validation (`validate_event` / `validate_value`) by table rows: every event type's
//! required and optional fields, base fields, enumerations, outcomes, content parts, JSON
//! Patch, messages, `RUN_STARTED` input, thread binding, what is stored, and properties.

use agui_fanout::event::validate::MAX_DEPTH;
use agui_fanout::event::{EventType, ThreadId, ValidEvent, validate_event, validate_value};
use proptest::strategy::Strategy;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

mod messages;
mod nested;

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
