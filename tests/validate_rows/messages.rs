//! Schema validation rows for messages (`MESSAGES_SNAPSHOT`), the `RUN_STARTED` input, the
//! thread binding, what is stored, nesting, and the properties over generated events.

use super::*;

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
