//! Delivery-path throughput: coalescing a lagging subscriber's backlog
//! (`queue::coalesce::coalesce`), SSE frame encoding (`Frame::new`), and fan-out of one event
//! into 10 000 in-process connection queues (`ConnQueue::push_live`).
//!
//! Backlogs: 1 000 `TEXT_MESSAGE_CONTENT` deltas of one message; 1 000 clean `STATE_DELTA`s;
//! the largest recorded producer response (.NET GettingStarted baselines), with merge keys
//! computed as the hub does (a fold decides whether each delta applied cleanly); and every
//! recorded response concatenated (more varied, several messages and tool calls).
//!
//! `cargo bench --bench coalesce -- --measurement-time 3`

use agui_fanout::event::EventType;
use agui_fanout::fold::{Applied, ThreadFold, apply_patch};
use agui_fanout::log::{Epoch, EventId, StreamPos};
use agui_fanout::queue::coalesce::{MergeKey, coalesce};
use agui_fanout::queue::{ConnQueue, Frame, QueueLimits};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn id(seq: u64) -> EventId {
    EventId {
        epoch: Epoch(0x0a1b_2c3d),
        pos: StreamPos::new(1_764_500_000_000, seq),
    }
}

fn event_type(ev: &Value) -> EventType {
    ev["type"]
        .as_str()
        .and_then(EventType::parse)
        .expect("an AG-UI event type")
}

/// Frames of `events` with merge keys as the hub computes them: every event folded once, a
/// `STATE_DELTA` clean when its patch applied, else carrying the folded state after it.
fn frames(events: &[Value]) -> Vec<Frame> {
    let born = Instant::now();
    let mut fold = ThreadFold::new();
    events
        .iter()
        .enumerate()
        .map(|(i, ev)| {
            let t = event_type(ev);
            let (clean, state_after) = match fold.apply_logged(ev) {
                Ok(applied)
                    if applied
                        .iter()
                        .any(|a| matches!(a, Applied::StateDelta(Err(_)))) =>
                {
                    (false, Some(Arc::new(fold.fold().state().clone())))
                }
                Ok(_) => (true, None),
                Err(_) => (false, Some(Arc::new(fold.fold().state().clone()))),
            };
            let json = serde_json::to_vec(ev).expect("serialisable");
            let merge = MergeKey::of(t, ev, clean, state_after);
            Frame::new(id(i as u64 + 1), t, &json, born, merge)
        })
        .collect()
}

fn text_deltas(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg_0001", "delta": format!("token{i} ")}))
        .collect()
}

fn state_deltas(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({"type": "STATE_DELTA", "delta": [
                {"op": "replace", "path": "/count", "value": i},
                {"op": "add", "path": "/items/-", "value": {"n": i}},
            ]})
        })
        .collect()
}

fn recorded_files() -> Vec<PathBuf> {
    agui_fanout::recorded_responses()
}

fn read_events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(text.trim_start_matches('\u{feff}')).expect("a JSON array of events")
}

fn largest_recorded() -> (String, Vec<Value>) {
    let path = recorded_files()
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .expect("recorded responses");
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (name, read_events(&path))
}

fn coalesce_backlog(c: &mut Criterion, name: &str, backlog: &[Frame]) {
    let mut merged = backlog.to_vec();
    coalesce(&mut merged, patch);
    let bytes_before: usize = backlog.iter().map(|f| f.bytes.len()).sum();
    let bytes_after: usize = merged.iter().map(|f| f.bytes.len()).sum();
    eprintln!(
        "coalesce/{name}: {} frames ({bytes_before} B) -> {} frames ({bytes_after} B)",
        backlog.len(),
        merged.len()
    );
    let mut group = c.benchmark_group("coalesce");
    group.throughput(Throughput::Elements(backlog.len() as u64));
    group.bench_function(name, |b| {
        b.iter_batched(
            || backlog.to_vec(),
            |mut frames| {
                black_box(coalesce(&mut frames, patch));
                frames
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn patch(doc: &Value, ops: &[Value]) -> Option<Value> {
    apply_patch(doc, ops).ok()
}

/// The backlog of `events` after the events that open their run (folded, not in the backlog).
fn backlog(opening: &[Value], events: &[Value]) -> Vec<Frame> {
    let all: Vec<Value> = opening.iter().chain(events).cloned().collect();
    frames(&all).split_off(opening.len())
}

fn coalesce_benches(c: &mut Criterion) {
    let run_started = json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"});
    let text = backlog(
        &[
            run_started.clone(),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "msg_0001"}),
        ],
        &text_deltas(1000),
    );
    coalesce_backlog(c, "text_deltas_1000", &text);
    let state = backlog(
        &[
            run_started,
            json!({"type": "STATE_SNAPSHOT", "snapshot": {"count": 0, "items": []}}),
        ],
        &state_deltas(1000),
    );
    assert!(
        state
            .iter()
            .all(|f| matches!(f.merge, MergeKey::StateDelta { clean: true, .. })),
        "every delta applies"
    );
    coalesce_backlog(c, "state_deltas_1000_clean", &state);
    let (name, events) = largest_recorded();
    eprintln!(
        "largest recorded response: {name} ({} events)",
        events.len()
    );
    coalesce_backlog(c, "recorded_largest_response", &frames(&events));
    let all: Vec<Value> = recorded_files()
        .iter()
        .flat_map(|p| read_events(p))
        .collect();
    coalesce_backlog(c, "recorded_all_responses", &frames(&all));
}

fn encode_benches(c: &mut Criterion) {
    let (_, events) = largest_recorded();
    let encoded: Vec<(EventType, Vec<u8>, MergeKey)> = events
        .iter()
        .map(|ev| {
            let t = event_type(ev);
            (
                t,
                serde_json::to_vec(ev).expect("serialisable"),
                MergeKey::of(t, ev, true, None),
            )
        })
        .collect();
    let bytes: usize = encoded.iter().map(|(_, j, _)| j.len()).sum();
    let mut group = c.benchmark_group("sse_encode");
    group.throughput(Throughput::Elements(encoded.len() as u64));
    group.bench_function(
        format!("frame_new_recorded_{}B", bytes / encoded.len()),
        |b| {
            let born = Instant::now();
            b.iter(|| {
                for (i, (t, json, merge)) in encoded.iter().enumerate() {
                    black_box(Frame::new(id(i as u64 + 1), *t, json, born, merge.clone()));
                }
            })
        },
    );
    group.finish();
}

fn fan_out_benches(c: &mut Criterion) {
    const QUEUES: usize = 10_000;
    let limits = QueueLimits {
        max_events: 4096,
        max_bytes: 4 << 20,
    };
    let queues: Vec<ConnQueue> = (0..QUEUES)
        .map(|_| ConnQueue::new(limits, StreamPos::ZERO, false, None))
        .collect();
    let ev =
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg_0001", "delta": "Hello, world"});
    let t = event_type(&ev);
    let json = serde_json::to_vec(&ev).expect("serialisable");
    let mut seq = 0u64;
    let mut group = c.benchmark_group("fan_out");
    group.throughput(Throughput::Elements(QUEUES as u64));
    group.bench_function("push_live_one_event_10000_queues", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                seq += 1;
                let frame = [Frame::new(
                    id(seq),
                    t,
                    &json,
                    Instant::now(),
                    MergeKey::of(t, &ev, true, None),
                )];
                let start = Instant::now();
                for q in &queues {
                    let _ = black_box(q.push_live(&frame));
                }
                spent += start.elapsed();
                // The writers' side, not measured: keep the queues short.
                for q in &queues {
                    black_box(q.try_drain());
                }
            }
            spent
        })
    });
    group.finish();
}

criterion_group!(benches, coalesce_benches, encode_benches, fan_out_benches);
criterion_main!(benches);
