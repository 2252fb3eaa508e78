//! Schema validation over recorded producer output and conformance fixtures: the .NET
//! baselines, the AG-UI conformance streams, the .NET compatibility fixtures and the Dart
//! sequences, each accepted or refused as listed (the fixtures folder: `fixtures_dir()`).

use agui_fanout::event::{ThreadId, ValidEvent, validate_event, validate_value};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path as FsPath, PathBuf};

fn thread(id: &str) -> ThreadId {
    ThreadId::parse(id).expect("test thread ids are valid")
}

/// The stored JSON is the input, whole, compact, on one line.
fn assert_round_trip(input: &Value, valid: &ValidEvent) {
    assert!(!valid.json.contains(&b'\n') && !valid.json.contains(&b'\r'));
    assert_eq!(&valid.value().expect("stored JSON parses"), input);
    let compact = serde_json::to_vec(input).expect("values serialise");
    assert_eq!(valid.json.as_ref(), compact.as_slice());
}

// ---- Recorded producer output and conformance fixtures ------------------------------

fn fixtures() -> PathBuf {
    agui_fanout::fixtures_dir().join("agui-recorded")
}

/// Reads a JSON fixture, tolerating the UTF-8 BOM the .NET baselines start with.
fn read_json(path: &FsPath) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let bytes = bytes
        .strip_prefix(b"\xEF\xBB\xBF".as_slice())
        .unwrap_or(&bytes);
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.json` file under `dir`, recursively, sorted.
fn json_files(dir: &FsPath) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn relative(path: &FsPath, dir: &FsPath) -> String {
    path.strip_prefix(dir)
        .expect("under dir")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn dotnet_baselines_validate_and_round_trip() {
    let dir = fixtures().join("dotnet-getting-started-baselines");
    let files: Vec<PathBuf> = json_files(&dir)
        .into_iter()
        .filter(|f| {
            f.to_string_lossy()
                .ends_with(".Response.Server.AGUI.verified.json")
        })
        .collect();
    assert_eq!(files.len(), 14, "response baselines found");
    let mut count = 0;
    for file in &files {
        let Value::Array(events) = read_json(file) else {
            panic!("{} is not an array", file.display());
        };
        let thread_id = events[0]["threadId"]
            .as_str()
            .expect("starts with RUN_STARTED");
        let bound = thread(thread_id);
        for (i, event) in events.iter().enumerate() {
            // Through the bytes path, from pretty-printed text with newlines between tokens.
            let pretty = serde_json::to_vec_pretty(event).expect("serialises");
            let valid = validate_event(&pretty, Some(&bound))
                .unwrap_or_else(|e| panic!("{} event {i} refused: {e:?}", file.display()));
            assert_round_trip(event, &valid);
            count += 1;
        }
    }
    assert_eq!(count, 1506, "events in the 14 recorded turns");
}

/// When a refusal applies: always, or only when validating bound to the thread of the
/// stream's first `threadId` (the publish path's thread).
#[derive(Clone, Copy, PartialEq, Debug)]
enum When {
    Always,
    Bound,
}

/// A fixture file (relative path) with the events the broker refuses: (index, field, when).
/// Every other event must be accepted.
type FileExpectations = &'static [(&'static str, &'static [(usize, &'static str, When)])];

/// All conformance streams. Only three kinds of event are refused:
/// - `unknown-event-dropped`: `FUTURE_EVENT` is not an AG-UI 1.0 type (the client drops it
///   with a warning; PROTOCOL §2 refuses unknown types so it never reaches a log);
/// - `state-delta-unknown-op-dropped`: op `increment` (the client drops the op; PROTOCOL §2
///   refuses malformed patches);
/// - the draft thread-mismatch fixtures: a `threadId` other than the thread published to.
///
/// Everything else the client would reject (`*-fatal`) breaks an *order* rule, which is not
/// schema validation's concern, or is accepted by the client too.
const CONFORMANCE: FileExpectations = &[
    ("spec-1.0/combining-mark-split-from-its-base.json", &[]),
    ("spec-1.0/multibyte-text-assembles.json", &[]),
    ("spec-1.0/truncated-run-reported-as-completed.json", &[]),
    ("spec-1.0/zwj-sequence-split-at-the-joiner.json", &[]),
    ("spec-1.1/activity-snapshot-then-delta.json", &[]),
    ("spec-1.1/chunk-expansion-assembles.json", &[]),
    ("spec-1.1/conformant-run-is-quiet.json", &[]),
    ("spec-1.1/content-without-start-fatal.json", &[]),
    ("spec-1.1/event-after-run-finished-fatal.json", &[]),
    ("spec-1.1/first-event-not-run-started-fatal.json", &[]),
    (
        "spec-1.1/late-run-error-after-finished-run-continues.json",
        &[],
    ),
    ("spec-1.1/messages-snapshot-reconciles-by-id.json", &[]),
    ("spec-1.1/nested-run-started-fatal.json", &[]),
    ("spec-1.1/open-message-at-run-finished-fatal.json", &[]),
    ("spec-1.1/open-object-patch-op-extras.json", &[]),
    ("spec-1.1/raw-does-not-close-chunk-stream.json", &[]),
    ("spec-1.1/reopen-closed-message-appends.json", &[]),
    ("spec-1.1/run-error-first-run-continues.json", &[]),
    ("spec-1.1/run-error-then-new-run-continues.json", &[]),
    ("spec-1.1/run-finished-cancelled-outcome-accepted.json", &[]),
    ("spec-1.1/run-finished-interrupt-outcome-accepted.json", &[]),
    ("spec-1.1/state-delta-applies.json", &[]),
    ("spec-1.1/state-delta-unappliable-warns-and-keeps.json", &[]),
    (
        "spec-1.1/state-delta-unknown-op-dropped.json",
        &[(2, "delta[0].op", When::Always)],
    ),
    ("spec-1.1/state-snapshot-replaces.json", &[]),
    ("spec-1.1/step-finished-without-start-fatal.json", &[]),
    ("spec-1.1/tool-call-triad-assembles.json", &[]),
    ("spec-1.1/triad-assembles-message.json", &[]),
    ("spec-1.1/two-sequential-runs-accumulate.json", &[]),
    (
        "spec-1.1/unknown-event-dropped.json",
        &[(3, "type", When::Always)],
    ),
    ("spec-1.1/unknown-property-stripped.json", &[]),
    ("spec-draft/duplicate-interrupt-id-fatal.json", &[]),
    ("spec-draft/run-finished-wrong-run-id-fatal.json", &[]),
    (
        "spec-draft/run-finished-wrong-thread-id-fatal.json",
        &[(1, "threadId", When::Bound)],
    ),
    (
        "spec-draft/second-run-on-another-thread-fatal.json",
        &[(2, "threadId", When::Bound), (3, "threadId", When::Bound)],
    ),
    ("spec-draft/truncated-stream-fails-the-run.json", &[]),
];

/// The .NET SDK's per-family examples. One is refused: a `CUSTOM` without `value`, which
/// the AG-UI 1.0 schema requires (`"required": ["type", "name", "value"]`).
const DOTNET_COMPAT: FileExpectations = &[
    ("activity-events.json", &[]),
    ("custom-and-raw-events.json", &[(1, "value", When::Always)]),
    ("forward-compatibility.json", &[]),
    ("message-events.json", &[]),
    ("run-events.json", &[]),
    ("state-events.json", &[]),
    ("tool-call-events.json", &[]),
];

/// Validates each event of each file unbound and bound, and compares what was refused
/// with the table; accepted events must be stored unchanged.
fn check_fixture_files(dir: &str, table: FileExpectations, events_of: fn(Value) -> Vec<Value>) {
    let dir = fixtures().join(dir);
    let on_disk: BTreeSet<String> = json_files(&dir).iter().map(|f| relative(f, &dir)).collect();
    let listed: BTreeSet<String> = table.iter().map(|(file, _)| (*file).to_owned()).collect();
    assert_eq!(
        on_disk, listed,
        "every fixture file has an explicit expectation"
    );

    for (file, refusals) in table {
        let events = events_of(read_json(&dir.join(file)));
        assert!(!events.is_empty(), "{file} has events");
        let bound = events
            .iter()
            .find_map(|e| e["threadId"].as_str())
            .map(thread);
        for binding in [None, bound.as_ref()] {
            let mut refused = Vec::new();
            for (i, event) in events.iter().enumerate() {
                match validate_value(event.clone(), binding) {
                    Ok(valid) => assert_round_trip(event, &valid),
                    Err(e) => refused.push((i, e.field.unwrap_or_default())),
                }
            }
            let expected: Vec<(usize, String)> = refusals
                .iter()
                .filter(|(_, _, when)| *when == When::Always || binding.is_some())
                .map(|(i, field, _)| (*i, (*field).to_owned()))
                .collect();
            assert_eq!(refused, expected, "{file} (thread {binding:?})");
        }
    }
}

#[test]
fn conformance_streams_accepted_or_refused_as_listed() {
    check_fixture_files("conformance-streams", CONFORMANCE, |fixture| {
        fixture["stream"]
            .as_array()
            .cloned()
            .expect("a stream array")
    });
}

#[test]
fn dotnet_compat_fixtures_accepted_or_refused_as_listed() {
    check_fixture_files("dotnet-compat-fixtures", DOTNET_COMPAT, |fixture| {
        fixture.as_array().cloned().expect("an array of events")
    });
}

/// The cross-SDK null-omission contract: every `expected` event is valid; an `input` that
/// differs from it (it carries a `null` the SDKs omit) is refused, naming that field.
#[test]
fn null_omission_contract() {
    let fixture = read_json(&fixtures().join("sdks-fixtures/null-omission.json"));
    let cases = fixture["stream"].as_array().expect("stream");
    let mut refused = Vec::new();
    for case in cases {
        let (input, expected) = (&case["input"], &case["expected"]);
        let valid = validate_value(expected.clone(), None)
            .unwrap_or_else(|e| panic!("{}: {e:?}", case["name"]));
        assert_round_trip(expected, &valid);
        if input != expected {
            let e = validate_value(input.clone(), None).expect_err("null refused");
            refused.push((
                case["name"].as_str().unwrap_or_default().to_owned(),
                e.field,
            ));
        }
    }
    assert_eq!(cases.len(), 28);
    assert_eq!(
        refused,
        [(
            "run_started_input_with_bare_null_state_converges_on_omission".to_owned(),
            Some("input.state".to_owned())
        )]
    );
}

/// The Dart SDK's named sequences: all valid except the pre-1.0 `THINKING_*` events
/// (`THINKING_CONTENT` was never an AG-UI type at all).
#[test]
fn dart_sequences_accepted_or_refused_as_listed() {
    let fixture = read_json(&fixtures().join("dart-sdk-fixtures/events.json"));
    let sequences = fixture.as_object().expect("named sequences");
    let expected: &[(&str, &[usize])] = &[
        ("thinking_events", &[1, 2, 3, 4]),
        ("thinking_text_message_legacy", &[1, 2, 3]),
    ];
    assert_eq!(sequences.len(), 15);
    for (name, events) in sequences {
        let events = events.as_array().expect("an array of events");
        let bound = events
            .iter()
            .find_map(|e| e["threadId"].as_str())
            .map(thread);
        let mut refused = Vec::new();
        for (i, event) in events.iter().enumerate() {
            match validate_value(event.clone(), bound.as_ref()) {
                Ok(valid) => assert_round_trip(event, &valid),
                Err(e) => {
                    assert_eq!(e.field.as_deref(), Some("type"), "{name}[{i}]: {e:?}");
                    refused.push(i);
                }
            }
        }
        let want = expected
            .iter()
            .find(|(n, _)| n == name)
            .map_or(&[][..], |(_, r)| *r);
        assert_eq!(refused, want, "{name}");
    }
    let e = validate_value(json!({"type": "THINKING_CONTENT"}), None).expect_err("unknown");
    assert!(
        e.message.contains("is not an AG-UI 1.0 event type"),
        "{e:?}"
    );
}
