//! Publish-path validation throughput, in events/s: what a publish costs per event before the
//! log append.
//!
//! - **Schema validation** of every event of the recorded producer responses (.NET
//!   GettingStarted baselines, the files `benches/fold.rs` reads: 14 responses, 1 506 events),
//!   from the raw JSON bytes of one event to the [`ValidEvent`], bound to the stream's thread as
//!   the publish handler binds it. Both entry points the handler uses are measured:
//!   [`validate_event`] (NDJSON lines, SSE `data:`) and `serde_json::from_slice` then
//!   [`validate_value`] (an `application/json` body holding one event object; an array body is
//!   parsed whole, then each item goes through `validate_value` the same way).
//! - **Order checks**: [`ThreadFold::check_batch`], what `ingest` runs on the thread's cached
//!   fold (order rules, then `STATE_DELTA` applicability), for each recorded response published
//!   as one batch on a new thread; and, for comparison, the same events published one per
//!   request (each publish checks a one-event batch on the fold the previous one returned, so
//!   it pays for a copy of the fold).
//! - **The load test's event**: a ~200-byte `CUSTOM` (`{"type":"CUSTOM","name":"agui-loadtest",
//!   "value":{"seq":17,"ts":…,"pad":"xxxx…"}}`) validated alone by both entry points, and its
//!   order check on a thread whose run is open: the per-event floor of a publish.
//!
//! `cargo bench --bench validate -- --measurement-time 3`

use agui_fanout::event::validate::{parse_received, validate_content_batch, validate_elements};
use agui_fanout::event::{ThreadId, ValidEvent, validate_event, validate_value};
use agui_fanout::fold::ThreadFold;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use std::hint::black_box;
use std::path::{Path, PathBuf};

/// One recorded producer response, ready to publish to its own thread.
struct Stream {
    /// The thread the response is published to (the `threadId` of its `RUN_STARTED`).
    thread: ThreadId,
    /// The events as parsed values (what `ingest` holds in `ValidEvent::parsed`).
    values: Vec<Value>,
    /// Each event as the compact JSON a producer sends: one NDJSON line or SSE `data:`.
    wire: Vec<Vec<u8>>,
}

/// Every recorded producer response of the .NET GettingStarted baselines, sorted by path.
fn recorded_files() -> Vec<PathBuf> {
    agui_fanout::recorded_responses()
}

/// Reads one recorded response (a JSON array of events, after the UTF-8 BOM).
fn read_stream(path: &Path) -> Stream {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let values: Vec<Value> =
        serde_json::from_str(text.trim_start_matches('\u{feff}')).expect("a JSON array of events");
    let thread = values
        .first()
        .and_then(|e| e["threadId"].as_str())
        .and_then(|t| ThreadId::parse(t).ok())
        .unwrap_or_else(|| panic!("{}: no RUN_STARTED with a threadId", path.display()));
    let wire = values
        .iter()
        .map(|e| serde_json::to_vec(e).expect("serialisable"))
        .collect();
    Stream {
        thread,
        values,
        wire,
    }
}

/// All recorded responses, each checked once to be valid and in order (so that the benches
/// below measure the accepting path, as a production publish takes it).
fn recorded_streams() -> Vec<Stream> {
    let streams: Vec<Stream> = recorded_files().iter().map(|p| read_stream(p)).collect();
    assert!(!streams.is_empty(), "recorded responses found");
    for s in &streams {
        for bytes in &s.wire {
            validate_event(bytes, Some(&s.thread)).expect("a valid recorded event");
        }
        ThreadFold::new()
            .check_batch(&s.values)
            .expect("a recorded response in order");
    }
    streams
}

/// The `application/json` publish of one event object: parse the body, then validate the value
/// (as `http::publish` does; its body parser is private).
fn validate_json_body(bytes: &[u8], thread: &ThreadId) -> ValidEvent {
    let value: Value = serde_json::from_slice(bytes).expect("well-formed JSON");
    validate_value(value, Some(thread)).expect("a valid event")
}

/// Schema validation of every recorded event, one event at a time, by both entry points.
fn schema_benches(c: &mut Criterion, streams: &[Stream]) {
    let events: usize = streams.iter().map(|s| s.wire.len()).sum();
    let bytes: usize = streams.iter().flat_map(|s| &s.wire).map(Vec::len).sum();
    eprintln!(
        "recorded responses: {} streams, {events} events, {bytes} B of compact JSON ({} B/event)",
        streams.len(),
        bytes / events
    );
    let mut group = c.benchmark_group("validate_schema");
    group.throughput(Throughput::Elements(events as u64));
    group.bench_function(
        format!("validate_event_recorded_all_{}B", bytes / events),
        |b| {
            b.iter(|| {
                for s in streams {
                    for bytes in &s.wire {
                        black_box(validate_event(bytes, Some(&s.thread)).ok());
                    }
                }
            })
        },
    );
    group.bench_function(format!("json_body_recorded_all_{}B", bytes / events), |b| {
        b.iter(|| {
            for s in streams {
                for bytes in &s.wire {
                    black_box(validate_json_body(bytes, &s.thread));
                }
            }
        })
    });
    group.finish();
}

/// Order checks of the recorded responses, each on a new thread: as one batch, and as one
/// publish per event.
fn order_benches(c: &mut Criterion, streams: &[Stream]) {
    let events: usize = streams.iter().map(|s| s.values.len()).sum();
    let mut group = c.benchmark_group("order_check");
    group.throughput(Throughput::Elements(events as u64));
    group.bench_function("check_batch_recorded_one_batch_per_response", |b| {
        b.iter(|| {
            for s in streams {
                black_box(ThreadFold::new().check_batch(&s.values).ok());
            }
        })
    });
    group.bench_function("check_batch_recorded_one_event_per_publish", |b| {
        b.iter(|| {
            for s in streams {
                let mut fold = ThreadFold::new();
                for event in &s.values {
                    fold = fold
                        .check_batch(std::slice::from_ref(event))
                        .expect("in order");
                }
                black_box(fold);
            }
        })
    });
    group.finish();
}

/// Length of the load test's measured event, in bytes.
const LOADTEST_EVENT_BYTES: usize = 200;

/// The load test's measured event (`loadtest/src/payload.rs`), padded to
/// [`LOADTEST_EVENT_BYTES`].
fn loadtest_event() -> Vec<u8> {
    let event = |pad: &str| {
        format!(
            r#"{{"type":"CUSTOM","name":"agui-loadtest","value":{{"seq":17,"ts":1764500000123456789,"pad":"{pad}"}}}}"#
        )
    };
    let fixed = event("").len();
    let bytes = event(&"x".repeat(LOADTEST_EVENT_BYTES.saturating_sub(fixed))).into_bytes();
    assert_eq!(bytes.len(), LOADTEST_EVENT_BYTES);
    bytes
}

/// The load test's event alone: schema validation by both entry points, and the order check
/// of a one-event publish on a thread whose run is open.
fn loadtest_benches(c: &mut Criterion) {
    let thread = ThreadId::parse("loadtest-0001").expect("a thread id");
    let bytes = loadtest_event();
    let value: Value = serde_json::from_slice(&bytes).expect("well-formed JSON");
    let running = ThreadFold::new()
        .check_batch(&[json!({"type": "RUN_STARTED", "threadId": thread.as_str(), "runId": "r1"})])
        .expect("a run starts");
    running
        .check_batch(std::slice::from_ref(&value))
        .expect("CUSTOM in a running thread");
    let mut group = c.benchmark_group("validate_loadtest_custom");
    group.throughput(Throughput::Elements(1));
    group.bench_function(format!("validate_event_{LOADTEST_EVENT_BYTES}B"), |b| {
        b.iter(|| black_box(validate_event(black_box(&bytes), Some(&thread)).ok()))
    });
    group.bench_function(format!("json_body_{LOADTEST_EVENT_BYTES}B"), |b| {
        b.iter(|| black_box(validate_json_body(black_box(&bytes), &thread)))
    });
    group.bench_function("check_batch_running_thread", |b| {
        b.iter(|| {
            black_box(
                running
                    .check_batch(std::slice::from_ref(black_box(&value)))
                    .ok(),
            )
        })
    });
    group.finish();
}

/// A JSON array body of 8 token deltas (~100 bytes each): the way `POST` takes it
/// (`validate_content_batch`, each element from its fields) against the full way it took
/// before (the array parsed to a value, each element validated with its bytes).
fn batch_benches(c: &mut Criterion) {
    let thread = ThreadId::parse("loadtest-0001").expect("a thread id");
    let body = format!(
        "[{}]",
        (0..8)
            .map(|i| format!(
                r#"{{"type":"TEXT_MESSAGE_CONTENT","messageId":"msg-0001-0042","delta":" token {i} of the answer, a few words long"}}"#
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    let full = |raw: &[u8]| -> Vec<ValidEvent> {
        let Ok(Value::Array(items)) = parse_received(raw) else {
            panic!("an array")
        };
        validate_elements(items, raw, Some(&thread))
            .map(|ev| ev.expect("valid"))
            .collect()
    };
    assert_eq!(
        validate_content_batch(body.as_bytes()).expect("taken"),
        full(body.as_bytes())
    );
    let mut group = c.benchmark_group("validate_batch_of_8_token_deltas");
    group.throughput(Throughput::Elements(8));
    group.bench_function("content_batch", |b| {
        b.iter(|| black_box(validate_content_batch(black_box(body.as_bytes()))))
    });
    group.bench_function("full", |b| {
        b.iter(|| black_box(full(black_box(body.as_bytes()))))
    });
    group.finish();
}

/// The recorded-stream benches, sharing one load of the fixtures.
fn recorded_benches(c: &mut Criterion) {
    let streams = recorded_streams();
    schema_benches(c, &streams);
    order_benches(c, &streams);
}

criterion_group!(benches, recorded_benches, loadtest_benches, batch_benches);
criterion_main!(benches);
