//! Order rules against recorded and normative streams: the AG-UI conformance corpus
//! (`spec-1.0`, `spec-1.1`, `spec-draft`) and the .NET server's recorded responses, all
//! run through `agui_fanout::event::order::OrderChecker` as one stream each, the way
//! `@ag-ui/client` 1.0.0 runs `transformChunks` → `verifyEvents` on one HTTP response.

#[path = "common/order_check.rs"]
mod order_check;

use agui_fanout::event::order::{OrderChecker, OrderViolation, RunLifecycle};
use agui_fanout::event::validate_value;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn conformance() -> PathBuf {
    agui_fanout::fixtures_dir().join("agui-recorded/conformance-streams")
}

fn baselines() -> PathBuf {
    agui_fanout::fixtures_dir().join("agui-recorded/dotnet-getting-started-baselines")
}

/// The fatal 1.0/1.1 fixtures and the position of the event `@ag-ui/client` 1.0.0 fails on
/// (the fixtures give the error text; the position follows from the stream).
const FATAL_AT: &[(&str, usize)] = &[
    ("content-without-start-fatal", 1),
    ("event-after-run-finished-fatal", 2),
    ("first-event-not-run-started-fatal", 0),
    ("nested-run-started-fatal", 1),
    ("open-message-at-run-finished-fatal", 3),
    ("step-finished-without-start-fatal", 1),
];

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

/// Runs `stream` through one checker. Events that fail schema validation are skipped:
/// the broker refuses them before order checking (PROTOCOL §2 refuses unknown event types and
/// unknown patch operations on purpose, where the client drops them), so they are not this
/// module's business. `STATE_DELTA` applicability is the fold's, and is not checked here.
/// Returns the checker and, if refused, the position and violation.
fn run_stream(stream: &[Value]) -> (OrderChecker, Option<(usize, OrderViolation)>) {
    let mut checker = OrderChecker::new();
    for (index, event) in stream.iter().enumerate() {
        if validate_value(event.clone(), None).is_err() {
            continue;
        }
        let before = checker.clone();
        let checked = order_check::check_both_ways(&mut checker, event);
        if let Err(violation) = checked {
            assert_eq!(checker, before, "a refused event must change nothing");
            return (checker, Some((index, violation)));
        }
    }
    (checker, None)
}

fn fixture(path: &Path) -> (String, Vec<Value>, Value) {
    let doc = read_json(path);
    let name = doc["name"].as_str().expect("fixture name").to_owned();
    let stream = doc["stream"].as_array().expect("stream array").clone();
    (name, stream, doc["expect"].clone())
}

#[test]
fn conformance_1_0_and_1_1_streams_behave_as_their_expect_block_says() {
    let mut fatal_seen = Vec::new();
    let mut skipped = Vec::new();
    for version in ["spec-1.0", "spec-1.1"] {
        for path in json_files(&conformance().join(version)) {
            let (name, stream, expect) = fixture(&path);
            for event in &stream {
                if validate_value(event.clone(), None).is_err() {
                    skipped.push(format!("{name}: {}", event["type"]));
                }
            }
            let (_, refused) = run_stream(&stream);
            match expect["outcome"].as_str() {
                Some("failed") => {
                    let (index, violation) =
                        refused.unwrap_or_else(|| panic!("{name}: accepted, the client fails it"));
                    let contains = expect["errorContains"].as_str().expect("errorContains");
                    assert!(
                        violation.message.contains(contains),
                        "{name}: {:?} does not contain {contains:?}",
                        violation.message
                    );
                    let at = FATAL_AT
                        .iter()
                        .find(|(fatal, _)| *fatal == name)
                        .unwrap_or_else(|| panic!("{name}: add it to FATAL_AT"))
                        .1;
                    assert_eq!(index, at, "{name}: refused at the wrong event");
                    fatal_seen.push(name);
                }
                Some("completed") => {
                    assert_eq!(refused, None, "{name}: refused, the client accepts it");
                }
                other => panic!("{name}: unexpected outcome {other:?}"),
            }
        }
    }
    fatal_seen.sort();
    let mut listed: Vec<_> = FATAL_AT.iter().map(|(name, _)| name.to_owned()).collect();
    listed.sort();
    assert_eq!(fatal_seen, listed, "every listed fatal fixture was run");
    // The only schema refusals are the ones PROTOCOL §2 makes on purpose.
    assert_eq!(
        skipped,
        [
            "state-delta-unknown-op-dropped: \"STATE_DELTA\"",
            "unknown-event-dropped: \"FUTURE_EVENT\"",
        ]
    );
}

#[test]
fn draft_streams_are_accepted_like_the_1_0_client_does() {
    // The draft rules (terminal required, matching run/thread ids, unique interrupt ids)
    // are not enforced by @ag-ui/client 1.0.0, which accepts all five.
    for path in json_files(&conformance().join("spec-draft")) {
        let (name, stream, expect) = fixture(&path);
        assert_eq!(expect["outcome"], "failed", "{name}: a future rule");
        let (_, refused) = run_stream(&stream);
        assert_eq!(refused, None, "{name}: the 1.0 client accepts it");
    }
}

/// The recorded .NET responses, grouped by test (folder + name before `#`), turns in order.
fn recorded_tests() -> BTreeMap<String, Vec<PathBuf>> {
    let mut tests: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for step in std::fs::read_dir(baselines()).expect("baselines present") {
        let step = step.expect("directory entry").path();
        for file in std::fs::read_dir(&step).expect("step folder") {
            let file = file.expect("directory entry").path();
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if !name.ends_with("Response.Server.AGUI.verified.json") {
                continue;
            }
            let test = name.split('#').next().unwrap_or_default();
            tests
                .entry(format!("{}/{test}", step.display()))
                .or_default()
                .push(file);
        }
    }
    for turns in tests.values_mut() {
        turns.sort();
    }
    assert!(!tests.is_empty());
    tests
}

fn events_of(path: &Path) -> Vec<Value> {
    match read_json(path) {
        Value::Array(events) => events,
        other => panic!("{} is not an array: {other}", path.display()),
    }
}

#[track_caller]
fn assert_closed_cleanly(checker: &OrderChecker, what: &str) {
    assert!(
        matches!(checker.open().run(), RunLifecycle::Finished { .. }),
        "{what}: ends with a finished run, got {:?}",
        checker.open().run()
    );
    assert!(checker.open().is_empty(), "{what}: nothing left open");
    assert!(
        checker.open_lanes().is_empty(),
        "{what}: no chunk lane open"
    );
}

#[test]
fn every_recorded_dotnet_response_is_accepted() {
    let mut count = 0;
    for turns in recorded_tests().values() {
        for path in turns {
            let events = events_of(path);
            for event in &events {
                assert!(
                    validate_value(event.clone(), None).is_ok(),
                    "{}: schema-valid",
                    path.display()
                );
            }
            let (checker, refused) = run_stream(&events);
            assert_eq!(refused, None, "{}", path.display());
            assert_closed_cleanly(&checker, &path.display().to_string());
            count += 1;
        }
    }
    assert_eq!(count, 14);
}

#[test]
fn recorded_turns_of_one_test_concatenate_into_one_thread() {
    let mut multi_turn = 0;
    for (test, turns) in recorded_tests() {
        let thread: Vec<Value> = turns.iter().flat_map(|path| events_of(path)).collect();
        let mut checker = OrderChecker::new();
        // The broker's way: each turn is a batch, all-or-nothing.
        for path in &turns {
            let events = events_of(path);
            checker
                .check_batch(&events)
                .unwrap_or_else(|(index, v)| panic!("{test}: event {index}: {v}"));
        }
        assert_closed_cleanly(&checker, &test);
        let (one_stream, refused) = run_stream(&thread);
        assert_eq!(refused, None, "{test}");
        assert_eq!(one_stream, checker);
        if turns.len() > 1 {
            multi_turn += 1;
        }
    }
    assert_eq!(multi_turn, 5, "tests with Turn_01 and Turn_02");
}
