//! `OrderChecker` rules on attribution (`subagentRunId`), snapshots and the input echo, chunk
//! lanes, transactions and batches, the open constructs a prelude reopens, and the
//! properties over generated streams.

use super::*;

#[test]
fn null_attribution_is_fatal() {
    let msg = fails_at(
        &[
            rs("a"),
            json!({"type": "CUSTOM", "name": "n", "value": 1, "subagentRunId": null}),
        ],
        1,
        rule::SUBAGENT_RUN_ID_NULL,
    );
    assert_eq!(
        msg,
        "Cannot send 'CUSTOM' with 'subagentRunId: null'. The field is optional — omit it \
         entirely."
    );
    fails_at(
        &[
            rs("a"),
            json!({"type": "RAW", "event": 1, "subagentRunId": 7}),
        ],
        1,
        rule::SUBAGENT_RUN_ID_MALFORMED,
    );
    // On run-scoped events the member is unknown to the client, which strips it.
    passes(&[
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "a", "subagentRunId": null}),
        json!({"type": "MESSAGES_SNAPSHOT", "messages": [], "subagentRunId": "s"}),
        json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "a", "subagentRunId": 3}),
    ]);
    let interrupted = json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "a",
        "outcome": {"type": "interrupt", "interrupts": [{"id": "i1", "reason": "r", "subagentRunId": null}]}});
    let msg = fails_at(
        &[rs("a"), interrupted],
        1,
        rule::INTERRUPT_SUBAGENT_RUN_ID_NULL,
    );
    assert_eq!(
        msg,
        "Cannot send 'RUN_FINISHED' with an interrupt (id 'i1') carrying 'subagentRunId: \
         null'. The field is optional — omit it entirely."
    );
    let snapshot = json!({"type": "MESSAGES_SNAPSHOT", "messages": [
        {"id": "ok", "role": "user", "content": "hi", "subagentRunId": "s1"},
        {"id": "bad", "role": "user", "content": "hi", "subagentRunId": null}]});
    let msg = fails_at(&[rs("a"), snapshot], 1, rule::MESSAGE_SUBAGENT_RUN_ID_NULL);
    assert_eq!(
        msg,
        "Cannot send a message (id 'bad') with 'subagentRunId: null'. The field is optional \
         — omit it entirely."
    );
    let started = json!({"type": "RUN_STARTED", "threadId": "t", "runId": "b", "input": {
        "threadId": "t", "runId": "b", "messages": [{"id": "u", "role": "user", "content": "x", "subagentRunId": null}]}});
    fails_at(
        &[rs("a"), rf("a"), started],
        2,
        rule::MESSAGE_SUBAGENT_RUN_ID_NULL,
    );
}

#[test]
fn subagent_tag_agreement() {
    // A tagged continuation of a parent-owned message disagrees.
    let msg = fails_at(
        &[rs("a"), tms("m1"), tagged(tmc("m1"), "s1")],
        2,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    assert_eq!(
        msg,
        "Cannot send 'TEXT_MESSAGE_CONTENT': subagentRunId 's1' does not match the message \
         'm1' opener's subagent '(the parent agent)'."
    );
    // Untagged continuations always agree.
    passes(&[
        rs("a"),
        tagged(tms("m1"), "s1"),
        tmc("m1"),
        tme("m1"),
        rf("a"),
    ]);
    // Owners outlive the close: another producer cannot re-open the id...
    fails_at(
        &[
            rs("a"),
            tagged(tms("m1"), "s1"),
            tme("m1"),
            tagged(tms("m1"), "s2"),
        ],
        3,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    // ...and an untagged re-open does not hand it to the parent.
    fails_at(
        &[
            rs("a"),
            tagged(tms("m1"), "s1"),
            tme("m1"),
            tms("m1"),
            tagged(tmc("m1"), "s2"),
        ],
        4,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    // A new run forgets owners.
    passes(&[
        rs("a"),
        tagged(tms("m1"), "s1"),
        tme("m1"),
        rf("a"),
        rs("b"),
        tagged(tms("m1"), "s2"),
    ]);

    // Tool calls inherit their parent message's owner.
    let call = |id: &str, parent: &str| json!({"type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": "f", "parentMessageId": parent});
    let msg = fails_at(
        &[
            rs("a"),
            tagged(tms("m1"), "s1"),
            tagged(call("c1", "m1"), "s2"),
        ],
        2,
        rule::TOOL_CALL_PARENT_OWNER_MISMATCH,
    );
    assert_eq!(
        msg,
        "Cannot send 'TOOL_CALL_START': subagentRunId 's2' does not match its parent message \
         'm1' owner 's1'. A tool call belongs to the message that carries it."
    );
    fails_at(
        &[
            rs("a"),
            tagged(tms("m1"), "s1"),
            call("c1", "m1"),
            tagged(tca("c1"), "s2"),
        ],
        3,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    let msg = fails_at(
        &[
            rs("a"),
            tagged(tms("m1"), "s1"),
            tms("m2"),
            call("c1", "m1"),
            tce("c1"),
            call("c1", "m2"),
        ],
        5,
        rule::TOOL_CALL_OWNER_CONFLICT,
    );
    assert_eq!(
        msg,
        "Cannot send 'TOOL_CALL_START': tool call 'c1' is owned by 's1' but its parent \
         message 'm2' is owned by '(the parent agent)'. A tool call belongs to the message \
         that carries it."
    );

    // Reasoning: one owner per id across spans and messages.
    fails_at(
        &[rs("a"), tagged(rstart("r"), "s1"), tagged(rms("r"), "s2")],
        2,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    // Encrypted values check the bucket their subtype names.
    let encrypted = |subtype: &str, id: &str| json!({"type": "REASONING_ENCRYPTED_VALUE", "subtype": subtype, "entityId": id, "encryptedValue": "e"});
    let msg = fails_at(
        &[
            rs("a"),
            tagged(tcs("c1"), "s1"),
            tce("c1"),
            tagged(encrypted("tool-call", "c1"), "s2"),
        ],
        3,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    assert!(msg.contains("the tool call 'c1' opener's subagent 's1'"));
    fails_at(
        &[
            rs("a"),
            tagged(rms("r"), "s1"),
            tagged(encrypted("message", "r"), "s2"),
        ],
        2,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    passes(&[rs("a"), tagged(encrypted("message", "unknown"), "s2")]);

    // Activities: a replacing snapshot re-owns, replace:false does not.
    let snap = |replace: bool| json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "act", "activityType": "t", "content": {}, "replace": replace});
    let delta =
        json!({"type": "ACTIVITY_DELTA", "messageId": "act", "activityType": "t", "patch": []});
    passes(&[
        rs("a"),
        tagged(snap(true), "s1"),
        tagged(snap(true), "s2"),
        tagged(delta.clone(), "s2"),
    ]);
    fails_at(
        &[
            rs("a"),
            tagged(snap(true), "s1"),
            tagged(snap(false), "s2"),
            tagged(delta, "s2"),
        ],
        3,
        rule::SUBAGENT_TAG_MISMATCH,
    );
}

#[test]
fn snapshots_and_input_echo_seed_owners() {
    let snapshot = json!({"type": "MESSAGES_SNAPSHOT", "messages": [
        {"id": "m1", "role": "assistant", "subagentRunId": "s2",
         "toolCalls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"id": "r1", "role": "reasoning", "content": "", "subagentRunId": "s2"}]});
    // Authoritative: replaces the owner recorded by the opener.
    passes(&[
        rs("a"),
        tagged(tms("m1"), "s1"),
        tme("m1"),
        snapshot.clone(),
        tagged(tms("m1"), "s2"),
        tagged(tcs("c1"), "s2"),
        tagged(rms("r1"), "s2"),
    ]);
    fails_at(
        &[rs("a"), snapshot.clone(), tagged(tcs("c1"), "s1")],
        2,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    // It does not close open messages.
    fails_at(
        &[rs("a"), tms("m9"), snapshot, rf("a")],
        3,
        rule::RUN_FINISHED_WITH_OPEN_MESSAGES,
    );
    // The RUN_STARTED input echo seeds owners too.
    let started = json!({"type": "RUN_STARTED", "threadId": "t", "runId": "a", "input": {
        "threadId": "t", "runId": "a", "messages": [
            {"id": "m1", "role": "assistant", "content": "earlier", "subagentRunId": "s1"}]}});
    fails_at(
        &[started.clone(), tagged(tms("m1"), "s2")],
        1,
        rule::SUBAGENT_TAG_MISMATCH,
    );
    passes(&[started, tagged(tms("m1"), "s1")]);
}

#[test]
fn mixing_chunk_and_triad_forms_is_refused() {
    let msg = fails_at(
        &[rs("a"), tms("m1"), text_chunk(Some("m1"), "x")],
        2,
        rule::MESSAGE_ALREADY_OPEN,
    );
    assert!(msg.contains("'m1' is already in progress"));
    fails_at(
        &[rs("a"), text_chunk(Some("m1"), "x"), tmc("m1")],
        2,
        rule::MESSAGE_NOT_OPEN,
    );
    fails_at(
        &[rs("a"), text_chunk(Some("m1"), "x"), tme("m1")],
        2,
        rule::MESSAGE_NOT_OPEN,
    );
    fails_at(
        &[
            rs("a"),
            json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c1", "toolCallName": "f", "delta": "{"}),
            tce("c1"),
        ],
        2,
        rule::TOOL_CALL_NOT_OPEN,
    );
}

#[test]
fn chunk_lane_rules_through_the_checker() {
    let raw = json!({"type": "RAW", "event": {"kind": "heartbeat"}});
    let custom = json!({"type": "CUSTOM", "name": "n", "value": 1});
    let checker = passes(&[
        rs("a"),
        text_chunk(Some("m1"), "Half "),
        raw,
        text_chunk(None, "and half."),
    ]);
    assert_eq!(checker.open_lanes().len(), 1);
    assert!(checker.open().is_text_message_open("m1"));
    let msg = fails_at(
        &[
            rs("a"),
            text_chunk(Some("m1"), "a"),
            custom,
            text_chunk(None, "b"),
        ],
        3,
        rule::CHUNK_MISSING_ID,
    );
    assert_eq!(msg, "First TEXT_MESSAGE_CHUNK must have a messageId");
    let mismatch = json!({"type": "TEXT_MESSAGE_CHUNK", "role": "user", "delta": "b"});
    fails_at(
        &[rs("a"), text_chunk(Some("m1"), "a"), mismatch],
        2,
        rule::CHUNK_FIELD_MISMATCH,
    );
    // A chunk stream after the run finished is refused by the verifier.
    fails_at(
        &[rs("a"), rf("a"), text_chunk(Some("m1"), "a")],
        2,
        rule::RUN_ALREADY_FINISHED,
    );
}

#[test]
fn check_is_transactional_when_a_later_expanded_event_fails() {
    // m2 is open as a triad; a chunk for m2 closes the m1 lane (END m1 passes) and then
    // synthesises START m2 (refused). Nothing of it may stick.
    let mut checker = passes(&[rs("a"), tms("m2"), text_chunk(Some("m1"), "x")]);
    let before = checker.clone();
    let err = checker.check(&text_chunk(Some("m2"), "y")).unwrap_err();
    assert_eq!(err.rule, rule::MESSAGE_ALREADY_OPEN);
    assert_eq!(checker, before);
    assert!(checker.open().is_text_message_open("m1"));
    assert_eq!(checker.open_lanes()[0].id(), "m1");
    // The lane still continues.
    checker.check(&text_chunk(None, "z")).unwrap();
}

#[test]
fn check_batch_is_all_or_nothing() {
    let mut checker = OrderChecker::new();
    checker.check_batch(&[rs("a"), tms("m1")]).unwrap();
    let before = checker.clone();
    let (index, violation) = checker
        .check_batch(&[tmc("m1"), tme("m1"), tmc("m1")])
        .unwrap_err();
    assert_eq!((index, violation.rule), (2, rule::MESSAGE_NOT_OPEN));
    assert_eq!(checker, before);
    checker
        .check_batch(&[tmc("m1"), tme("m1"), rf("a")])
        .unwrap();
    assert!(matches!(
        checker.open().run(),
        RunLifecycle::Finished { .. }
    ));
}

#[test]
fn open_constructs_list_what_a_prelude_reopens() {
    let call = json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "search", "parentMessageId": "m1"});
    let user =
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m0", "role": "user", "name": "ann"});
    let checker = passes(&[
        rs("a"),
        sub_start("s1"),
        user.clone(),
        tagged(ss("plan"), "s1"),
        tms("m1"),
        tme("m1"),
        call.clone(),
        rstart("r1"),
        rms("r2"),
        text_chunk(Some("m3"), "chunked"),
    ]);
    let open = checker.open();
    assert!(
        matches!(open.run(), RunLifecycle::Running { run_started } if **run_started == rs("a"))
    );
    let texts: Vec<_> = open
        .text_messages()
        .map(|m| (m.id(), m.start().clone()))
        .collect();
    assert_eq!(
        texts,
        [
            ("m0", user),
            (
                "m3",
                json!({"type": "TEXT_MESSAGE_START", "messageId": "m3", "role": "assistant"})
            ),
        ]
    );
    assert_eq!(
        open.tool_calls()
            .map(|c| c.start().clone())
            .collect::<Vec<_>>(),
        [call]
    );
    let steps: Vec<_> = open
        .steps()
        .map(|s| (s.id(), s.subagent_run_id()))
        .collect();
    assert_eq!(steps, [("plan", Some("s1"))]);
    assert_eq!(
        open.reasoning_spans().map(OpenItem::id).collect::<Vec<_>>(),
        ["r1"]
    );
    assert_eq!(
        open.reasoning_messages()
            .map(OpenItem::id)
            .collect::<Vec<_>>(),
        ["r2"]
    );
    assert_eq!(
        open.subagents()
            .map(|s| s.start().clone())
            .collect::<Vec<_>>(),
        [sub_start("s1")]
    );
    let order: Vec<_> = open
        .in_opening_order()
        .into_iter()
        .map(|(kind, item)| (kind, item.id()))
        .collect();
    assert_eq!(
        order,
        [
            (OpenKind::Subagent, "s1"),
            (OpenKind::TextMessage, "m0"),
            (OpenKind::Step, "plan"),
            (OpenKind::ToolCall, "c1"),
            (OpenKind::ReasoningSpan, "r1"),
            (OpenKind::ReasoningMessage, "r2"),
            (OpenKind::TextMessage, "m3"),
        ]
    );
    assert_eq!(checker.open_lanes().len(), 1);

    // A prelude built from it passes a fresh checker: RUN_STARTED, (snapshots), then the
    // re-opening events in opening order, lanes re-opened by chunk.
    let mut prelude = vec![rs("a")];
    for (_, item) in open.in_opening_order() {
        match checker
            .open_lanes()
            .iter()
            .find(|lane| lane.id() == item.id())
        {
            Some(lane) => prelude.push(lane.reopening_chunk()),
            None => prelude.push(item.start().clone()),
        }
    }
    let mut fresh = passes(&prelude);
    assert_eq!(fresh.open_lanes(), checker.open_lanes());
    // Live events continue on both alike.
    let live = [
        text_chunk(None, "more"),
        tme("m0"),
        tagged(sf("plan"), "s1"),
    ];
    let mut original = checker.clone();
    for event in &live {
        original.check(event).unwrap();
        fresh.check(event).unwrap();
    }
}

#[test]
fn unknown_types_and_non_objects_are_ignored() {
    let mut checker = OrderChecker::new();
    for event in [
        json!({"type": "FUTURE_EVENT"}),
        json!("x"),
        json!({}),
        json!({"type": 1}),
    ] {
        checker.check(&event).unwrap();
    }
    assert_eq!(checker, OrderChecker::new());
    checker.check(&rs("a")).unwrap();
}

#[test]
fn a_lane_whose_message_was_closed_under_another_attribution_is_dead() {
    // The untagged END closes the parent's lane (empty) and the message in the
    // verifier, while subagent s1's lane still holds it: as in the client, the run
    // terminal then synthesises an END for a closed message, which is refused.
    let chunk = tagged(text_chunk(Some("m1"), "x"), "s1");
    let checker = passes(&[rs("a"), chunk.clone(), tme("m1")]);
    assert_eq!(checker.open_lanes().len(), 1);
    assert!(!checker.open().is_text_message_open("m1"));
    fails_at(
        &[rs("a"), chunk.clone(), tme("m1"), rf("a")],
        3,
        rule::MESSAGE_NOT_OPEN,
    );
    fails_at(
        &[rs("a"), chunk, tme("m1"), re()],
        3,
        rule::MESSAGE_NOT_OPEN,
    );
}

/// A small alphabet, so random sequences hit the rules often.
fn any_event() -> impl Strategy<Value = Value> {
    let id = prop::sample::select(vec!["a", "b"]);
    let tag = prop::option::of(prop::sample::select(vec!["s1", "s2"]));
    let kind = prop::sample::select(vec![
        "RUN_STARTED",
        "RUN_FINISHED",
        "RUN_ERROR",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TEXT_MESSAGE_CHUNK",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_CHUNK",
        "TOOL_CALL_RESULT",
        "REASONING_START",
        "REASONING_END",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_MESSAGE_CHUNK",
        "REASONING_ENCRYPTED_VALUE",
        "STEP_STARTED",
        "STEP_FINISHED",
        "SUBAGENT_STARTED",
        "SUBAGENT_FINISHED",
        "SUBAGENT_ERROR",
        "MESSAGES_SNAPSHOT",
        "ACTIVITY_SNAPSHOT",
        "ACTIVITY_DELTA",
        "CUSTOM",
        "RAW",
    ]);
    (kind, id, tag, any::<bool>()).prop_map(|(kind, id, tag, with_id)| {
        let mut e = json!({"type": kind, "threadId": "t", "runId": "r", "messageId": id,
            "toolCallId": id, "toolCallName": "f", "stepName": id, "name": "n",
            "delta": "d", "message": "m", "entityId": id, "subtype": "message",
            "messages": [{"id": id, "role": "assistant"}]});
        if let Some(tag) = tag {
            e["subagentRunId"] = tag.into();
        }
        if kind.ends_with("_CHUNK") && !with_id {
            let obj = e.as_object_mut().expect("built as an object");
            obj.remove("messageId");
            obj.remove("toolCallId");
            obj.remove("toolCallName");
        }
        if kind == "SUBAGENT_STARTED" && with_id {
            e["parentSubagentRunId"] = "s1".into();
        }
        e
    })
}

proptest! {
    #[test]
    fn random_streams_never_panic_and_refusals_change_nothing(
        events in prop::collection::vec(any_event(), 0..60)
    ) {
        let mut checker = OrderChecker::new();
        for event in &events {
            let before = checker.clone();
            if checker.check(event).is_err() {
                prop_assert_eq!(&checker, &before);
            }
        }
    }
}
