//! Conformance of [`agui_fanout::fold`]: the JSON Patch test suite through `apply_patch`, the
//! AG-UI 1.0/1.1 conformance streams whose `expect` block states the folded `state` or
//! `messages`, and the recorded .NET producer streams.
//!
//! Fixtures are read from `tests/fixtures/` (origins and licences in its `SOURCES.md`).

use agui_fanout::fold::{Applied, Fold, RunStatus, apply_patch};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    agui_fanout::fixtures_dir()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(text.trim_start_matches('\u{feff}')).unwrap()
}

// ---- JSON Patch conformance suite (json-patch/json-patch-tests) ---------------------------

/// Cases whose expectation is RFC 6902's and where `fast-json-patch` 3.1.1 — and so the AG-UI
/// client, and so the fold — does otherwise: `(file, comment, path)` and why.
const FAST_JSON_PATCH_DEVIATIONS: &[(&str, &str, &str, &str)] = &[
    (
        "tests.json",
        "test with bad array number that has leading zeros",
        "/00",
        "`test` does not validate array indices; `~~\"00\"` is 0, so it compares element 0 and passes",
    ),
    (
        "tests.json",
        "test with bad array number that has leading zeros",
        "/01",
        "`test` does not validate array indices; `~~\"01\"` is 1, so it compares element 1 and passes",
    ),
];

fn deviation(file: &str, case: &Value) -> Option<&'static str> {
    let comment = case.get("comment").and_then(Value::as_str)?;
    let path = case["patch"].get(0)?.get("path")?.as_str()?;
    FAST_JSON_PATCH_DEVIATIONS
        .iter()
        .find(|(f, c, p, _)| *f == file && *c == comment && *p == path)
        .map(|(.., why)| *why)
}

#[test]
fn json_patch_test_suite() {
    let mut checked = 0;
    let mut deviations_seen = 0;
    for file in ["tests.json", "spec_tests.json"] {
        let cases = read_json(&fixtures().join("json-patch-tests").join(file));
        for (i, case) in cases
            .as_array()
            .expect("an array of records")
            .iter()
            .enumerate()
        {
            let Some(patch) = case.get("patch").and_then(Value::as_array) else {
                continue; // a comment-only record
            };
            if case.get("disabled") == Some(&Value::Bool(true)) {
                continue;
            }
            let label = format!(
                "{file}[{i}] {}",
                case.get("comment").unwrap_or(&Value::Null)
            );
            let result = apply_patch(&case["doc"], patch);
            if let Some(why) = deviation(file, case) {
                // The suite expects an error; fast-json-patch applies the patch (and the test
                // passes on the unchanged document). Pin that, so the list stays true.
                assert!(case.get("error").is_some(), "{label}");
                assert_eq!(result.as_ref().ok(), Some(&case["doc"]), "{label}: {why}");
                deviations_seen += 1;
                continue;
            }
            match (case.get("expected"), case.get("error"), result) {
                (Some(expected), _, Ok(got)) => assert_eq!(&got, expected, "{label}"),
                (Some(_), _, Err(e)) => panic!("{label}: expected success, got {e}"),
                (None, Some(_), Err(_)) => {}
                (None, Some(why), Ok(got)) => {
                    panic!("{label}: expected an error ({why}), got {got}")
                }
                (None, None, _) => {} // a record with no expectation: must merely not panic
            }
            checked += 1;
        }
    }
    assert_eq!(deviations_seen, FAST_JSON_PATCH_DEVIATIONS.len());
    assert!(checked > 100, "only {checked} cases checked");
}

// ---- AG-UI conformance streams ----------------------------------------------------------------

/// Chunk streams, expanded by hand as the client's `transformChunks` does (AGUI.md §5.1): the
/// first chunk opens the message (START with `messageId`/`role`, CONTENT), continuations are
/// CONTENT, `RAW` stands aside, the run terminal closes the lane with a synthesised END.
/// Chunk expansion itself lives in `event::order` (`chunks.rs`); the fold takes expanded events.
fn hand_expanded(name: &str) -> Option<Vec<Value>> {
    let (thread, run, id, first, second, between) = match name {
        "chunk-expansion-assembles" => (
            "t-chunk-expand",
            "chunk-expand-r1",
            "chunk-expand-m1",
            "Chunks ",
            "expand.",
            None,
        ),
        "raw-does-not-close-chunk-stream" => (
            "t-raw-aside",
            "raw-aside-r1",
            "raw-aside-m1",
            "Half ",
            "and half.",
            Some(json!({"type": "RAW", "event": {"provider": "raw-aside", "kind": "heartbeat"}})),
        ),
        _ => return None,
    };
    let mut events = vec![
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": run, "protocolVersion": "1.1"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": first}),
    ];
    events.extend(between);
    events.extend([
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": second}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": id}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": run}),
    ]);
    Some(events)
}

/// Every key an expected message states must be equal in the folded one (the fixtures leave
/// out ids they do not pin).
fn message_matches(expected: &Value, got: &Value) -> bool {
    expected
        .as_object()
        .is_some_and(|e| e.iter().all(|(k, v)| got.get(k) == Some(v)))
}

#[test]
fn conformance_streams_fold_to_their_expected_state_and_messages() {
    let mut folded = Vec::new();
    for version in ["spec-1.0", "spec-1.1"] {
        let dir = fixtures()
            .join("agui-recorded/conformance-streams")
            .join(version);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for path in files {
            let fixture = read_json(&path);
            let name = fixture["name"].as_str().unwrap().to_owned();
            let expect = &fixture["expect"];
            if expect.get("state").is_none() && expect.get("messages").is_none() {
                continue; // verifier fixtures (`outcome: failed`): order rules, not the fold
            }
            let stream = fixture["stream"].as_array().unwrap().clone();
            let has_chunks = stream
                .iter()
                .any(|e| e["type"].as_str().is_some_and(|t| t.ends_with("_CHUNK")));
            let events = match hand_expanded(&name) {
                Some(expanded) => {
                    assert!(has_chunks, "{name}: expected a chunk stream");
                    expanded
                }
                None => {
                    assert!(!has_chunks, "{name}: chunk stream without a hand expansion");
                    stream
                }
            };
            let mut fold = Fold::new();
            let mut run_errors = Vec::new();
            for event in &events {
                fold.apply(event);
                if let Some(RunStatus::Errored { error, .. }) = fold.run().map(|r| &r.status) {
                    run_errors.push(error["message"].clone());
                }
            }
            if let Some(state) = expect.get("state") {
                assert_eq!(fold.state(), state, "{name}: state");
            }
            if let Some(count) = expect.get("messageCount") {
                assert_eq!(
                    Some(fold.messages().len() as u64),
                    count.as_u64(),
                    "{name}: messageCount"
                );
            }
            if let Some(messages) = expect.get("messages").and_then(Value::as_array) {
                assert_eq!(
                    fold.messages().len(),
                    messages.len(),
                    "{name}: messages {:?}",
                    fold.messages()
                );
                for (want, got) in messages.iter().zip(fold.messages()) {
                    assert!(message_matches(want, got), "{name}: want {want}, got {got}");
                }
            }
            // The run the error ended was errored in the fold (a later run may have followed).
            if let Some(message) = expect.get("runError") {
                assert!(
                    run_errors.contains(message),
                    "{name}: no errored run with {message}"
                );
            }
            folded.push(name);
        }
    }
    // Every fixture that states a fold outcome, chunk streams included.
    assert_eq!(folded.len(), 24, "{folded:?}");
}

// ---- recorded .NET producer output ------------------------------------------------------------

/// One folded message: its role, tool-call count and `content` length in UTF-16 units.
type Shape = (&'static str, usize, usize);

/// What the 1.0 client folds each recorded response into (checked on `@ag-ui/client` 1.0.0).
const RECORDED: &[(&str, &[Shape])] = &[
    (
        "Step01_GettingStarted/PostRun_MultiTurn_SynthesizesAssistantMessages#Turn_01",
        &[("assistant", 0, 32)],
    ),
    (
        "Step01_GettingStarted/PostRun_MultiTurn_SynthesizesAssistantMessages#Turn_02",
        &[("assistant", 0, 68)],
    ),
    (
        "Step02_BackendTools/PostRun_WithBackendToolCall_InvokesToolAndStreamsResult#Turn_01",
        &[("assistant", 1, 0), ("tool", 0, 605), ("assistant", 0, 273)],
    ),
    (
        "Step03_FrontendTools/PostRun_WithFrontendToolCall_InvokesToolLocallyAndStreamsResult#Turn_01",
        &[("assistant", 1, 0)],
    ),
    (
        "Step03_FrontendTools/PostRun_WithFrontendToolCall_InvokesToolLocallyAndStreamsResult#Turn_02",
        &[("assistant", 0, 2295)],
    ),
    (
        "Step04_HumanInLoop/PostRun_WithApprovalRequired_RoundTripsThroughBothWrappers#Turn_01",
        &[("assistant", 1, 0)],
    ),
    (
        "Step04_HumanInLoop/PostRun_WithApprovalRequired_RoundTripsThroughBothWrappers#Turn_02",
        &[("assistant", 1, 0), ("tool", 0, 62), ("assistant", 0, 67)],
    ),
    (
        "Step05_StateManagement/PostRun_WithState_EmitsStateSnapshotAndSummary#Turn_01",
        &[("assistant", 0, 252)],
    ),
    (
        "Step06_RawEvents/PostRun_ForwardsLlmUsageAsRawEvents#Turn_01",
        &[("assistant", 0, 3309)],
    ),
    (
        "Step08_MultimodalMessages/PostRun_WithImageUrl_DescribesImage#Turn_01",
        &[("assistant", 0, 234)],
    ),
    (
        "Step10_InterruptsUserInput/PostRun_SetupRequest_EmitsInputInterruptThenResumes#Turn_01",
        &[],
    ),
    (
        "Step10_InterruptsUserInput/PostRun_SetupRequest_EmitsInputInterruptThenResumes#Turn_02",
        &[("assistant", 0, 58)],
    ),
    (
        "Step11_Serialization/PostRun_EventsSerializeAndDeserializeRoundTrip#Turn_01",
        &[("assistant", 0, 206)],
    ),
    (
        "Step11_Serialization/PostRun_EventsSerializeAndDeserializeRoundTrip#Turn_02",
        &[("assistant", 0, 168)],
    ),
];

#[test]
fn recorded_producer_streams_fold_cleanly() {
    let root = fixtures().join("agui-recorded/dotnet-getting-started-baselines");
    for (stem, shape) in RECORDED {
        let path = root.join(format!("{stem}.06.Response.Server.AGUI.verified.json"));
        let events = read_json(&path);
        let mut fold = Fold::new();
        for event in events.as_array().unwrap() {
            let applied = fold.apply(event);
            assert!(
                matches!(
                    applied,
                    Applied::Folded
                        | Applied::NoEffect
                        | Applied::StateDelta(Ok(()))
                        | Applied::ActivityDelta(Ok(()))
                ),
                "{stem}: {applied:?} for {event}"
            );
        }
        let got: Vec<(String, usize, usize)> = fold
            .messages()
            .iter()
            .map(|m| {
                let role = m["role"].as_str().unwrap_or_default().to_owned();
                let calls = m
                    .get("toolCalls")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let len = m
                    .get("content")
                    .and_then(Value::as_str)
                    .map_or(0, |s| s.encode_utf16().count());
                (role, calls, len)
            })
            .collect();
        let want: Vec<(String, usize, usize)> = shape
            .iter()
            .map(|(r, c, l)| ((*r).to_owned(), *c, *l))
            .collect();
        assert_eq!(got, want, "{stem}");
        // Every recorded run is closed, and its tool-call arguments assembled into JSON.
        assert!(fold.run().is_some_and(|r| r.is_closed()), "{stem}");
        for call in fold
            .messages()
            .iter()
            .filter_map(|m| m.get("toolCalls")?.as_array())
            .flatten()
        {
            let arguments = call["function"]["arguments"].as_str().unwrap();
            assert!(
                serde_json::from_str::<Value>(arguments).is_ok(),
                "{stem}: {arguments}"
            );
        }
    }
}
