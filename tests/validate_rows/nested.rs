//! Schema validation rows for nested shapes: enumerations, run outcomes, token usage, content
//! parts and JSON Patch operations.

use super::*;

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
