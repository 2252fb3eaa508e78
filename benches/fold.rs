//! Fold throughput: events/s folding the largest recorded producer response, one tool call
//! turn on threads of 100 and 10,000 messages (the per-event cost must not grow with the
//! thread), the publish's order check and fold of such a turn inside one run of 33 and of
//! 3,333 turns (`publish_in_one_run`: the order state records an owner per message and tool
//! call of the run, and the hub holds a copy of it), and `STATE_DELTA`s/s applied to a realistic state (single operation: in place;
//! several: on a copy, for atomicity), plus the pure `apply_patch` the publish path uses for
//! its 422 check.
//!
//! `cargo bench --bench fold`

use agui_fanout::fold::{Fold, ThreadFold, apply_patch};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use std::hint::black_box;

fn recorded(stem: &str) -> Vec<Value> {
    let path = agui_fanout::fixtures_dir()
        .join("agui-recorded/dotnet-getting-started-baselines")
        .join(format!("{stem}.06.Response.Server.AGUI.verified.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(text.trim_start_matches('\u{feff}')).expect("a JSON array of events")
}

/// The largest recorded response: 698 events, 3309 characters of streamed text.
const LARGEST: &str = "Step06_RawEvents/PostRun_ForwardsLlmUsageAsRawEvents#Turn_01";
/// The recorded response that carries a real `STATE_SNAPSHOT` (a recipe).
const WITH_STATE: &str =
    "Step05_StateManagement/PostRun_WithState_EmitsStateSnapshotAndSummary#Turn_01";

fn fold_recorded(c: &mut Criterion) {
    let events = recorded(LARGEST);
    let mut group = c.benchmark_group("fold_recorded");
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function("largest_response", |b| {
        b.iter(|| {
            let mut fold = Fold::new();
            for event in &events {
                black_box(fold.apply(event));
            }
            fold
        })
    });
    group.finish();
}

/// Turn `i`: an assistant message calling a tool, trailing text, then the tool's result,
/// which the client places right after its call, before the text (`TOOL_CALL_RESULT`).
fn tool_turn(i: usize) -> Vec<Value> {
    let (a, b, c, t) = (
        format!("a{i}"),
        format!("b{i}"),
        format!("c{i}"),
        format!("t{i}"),
    );
    vec![
        json!({"type": "TEXT_MESSAGE_START", "messageId": a, "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": a, "delta": "Let me look "}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": a}),
        json!({"type": "TOOL_CALL_START", "toolCallId": c, "toolCallName": "search", "parentMessageId": a}),
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": c, "delta": "{\"q\": \"forks\"}"}),
        json!({"type": "TOOL_CALL_END", "toolCallId": c}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": b, "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": b, "delta": "while it runs"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": b}),
        json!({"type": "TOOL_CALL_RESULT", "messageId": t, "toolCallId": c, "content": "3 found"}),
    ]
}

/// One tool turn (`tool_turn`) measured after 33 and 3,333 earlier ones: `apply` takes one
/// event into a `start` state, `id` names the bench from the state before the measured turn
/// and its count of turns.
fn bench_turns<S: Clone>(
    c: &mut Criterion,
    group: &str,
    start: S,
    apply: fn(&mut S, &Value),
    id: fn(&S, usize) -> BenchmarkId,
) {
    let mut group = c.benchmark_group(group);
    let turn = tool_turn(usize::MAX);
    group.throughput(Throughput::Elements(turn.len() as u64));
    // A clone holds its lists and indexes at their exact size: one turn applied in the set-up
    // makes them grow (as a thread's own state did, amortized) before the measured turn.
    let warm_up = tool_turn(usize::MAX - 1);
    for turns in [33, 3_333] {
        let mut state = start.clone();
        for i in 0..turns {
            for event in tool_turn(i) {
                apply(&mut state, &event);
            }
        }
        group.bench_function(id(&state, turns), |b| {
            b.iter_batched_ref(
                || {
                    let mut state = state.clone();
                    for event in &warm_up {
                        apply(&mut state, event);
                    }
                    state
                },
                |state| {
                    for event in &turn {
                        apply(state, event);
                    }
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn long_thread(c: &mut Criterion) {
    bench_turns(
        c,
        "fold_tool_turn",
        Fold::new(),
        |fold, event| {
            black_box(fold.apply(event));
        },
        |fold, _| BenchmarkId::new("messages", fold.messages().len()),
    );
}

/// The publish's check and fold (`ThreadFold::check_batch_only`, then `apply_checked`), one
/// event per publish as a producer streams them, while a copy of the order state is held as
/// the hub's frame view holds one.
fn publish_in_one_run(c: &mut Criterion) {
    fn publish(fold: &mut ThreadFold, event: &Value) {
        let _view = fold.checker().clone();
        let after = fold
            .check_batch_only(std::iter::once(event))
            .expect("a valid turn");
        fold.apply_checked(std::iter::once(event), after);
    }
    let mut run = ThreadFold::new();
    publish(
        &mut run,
        &json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
    );
    bench_turns(c, "publish_in_one_run", run, publish, |_, turns| {
        BenchmarkId::new("turns", turns)
    });
}

/// Deltas against the recorded recipe state: `n` operations per `STATE_DELTA`, cycling so
/// the state stays the same size.
fn deltas(n: usize) -> Vec<Value> {
    (0..64)
        .map(|i| {
            let mut ops = vec![json!({"op": "replace", "path": "/recipe/title", "value": format!("Carbonara {i}")})];
            if n > 1 {
                ops.push(json!({"op": "add", "path": "/recipe/ingredients/-", "value": {"name": "pepper", "amount": i}}));
                ops.push(json!({"op": "remove", "path": "/recipe/ingredients/0"}));
            }
            json!({"type": "STATE_DELTA", "delta": ops})
        })
        .collect()
}

fn state_delta(c: &mut Criterion) {
    let snapshot = recorded(WITH_STATE)
        .into_iter()
        .find(|e| e["type"] == "STATE_SNAPSHOT")
        .expect("a STATE_SNAPSHOT");
    let state_bytes = serde_json::to_vec(&snapshot["snapshot"]).unwrap().len();
    let mut group = c.benchmark_group(format!("state_delta_{state_bytes}B_state"));
    for ops in [1, 3] {
        let batch = deltas(ops);
        group.throughput(Throughput::Elements(batch.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("fold_apply", format!("{ops}_ops")),
            &batch,
            |b, batch| {
                let mut fold = Fold::new();
                fold.apply(&snapshot);
                b.iter(|| {
                    for event in batch {
                        black_box(fold.apply(event));
                    }
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("apply_patch", format!("{ops}_ops")),
            &batch,
            |b, batch| {
                let state = snapshot["snapshot"].clone();
                b.iter(|| {
                    for event in batch {
                        let ops = event["delta"].as_array().unwrap();
                        black_box(apply_patch(&state, ops).ok());
                    }
                })
            },
        );
    }
    group.finish();
}

/// A publish of `STATE_DELTA`s (check, then fold in place) on states of growing size: a
/// list of `items` objects, and patches of 1 and 3 operations that keep its size. The cost per
/// delta should not grow with the state (RFC 6902 §5's all-or-nothing without a copy).
fn state_delta_publish(c: &mut Criterion) {
    fn publish(fold: &mut ThreadFold, event: &Value) {
        let after = fold
            .check_batch_only(std::iter::once(event))
            .expect("a valid delta");
        fold.apply_checked(std::iter::once(event), after);
    }
    let mut group = c.benchmark_group("state_delta_publish");
    for items in [100usize, 1_000, 10_000] {
        let list: Vec<Value> = (0..items)
            .map(|i| json!({"id": i, "text": format!("item {i} of the agent's working list"), "done": false}))
            .collect();
        for ops in [1, 3] {
            let batch: Vec<Value> = (0..64)
                .map(|i| {
                    let mut delta = vec![json!({"op": "replace", "path": format!("/items/{}/done", i % items), "value": true})];
                    if ops > 1 {
                        delta.push(json!({"op": "add", "path": "/items/-", "value": {"id": i, "text": "appended", "done": false}}));
                        delta.push(json!({"op": "remove", "path": "/items/0"}));
                    }
                    json!({"type": "STATE_DELTA", "delta": delta})
                })
                .collect();
            group.throughput(Throughput::Elements(batch.len() as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("{ops}_ops"), items),
                &batch,
                |b, batch| {
                    let mut fold = ThreadFold::new();
                    publish(
                        &mut fold,
                        &json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
                    );
                    publish(
                        &mut fold,
                        &json!({"type": "STATE_SNAPSHOT", "snapshot": {"items": list}}),
                    );
                    b.iter(|| {
                        for event in batch {
                            publish(&mut fold, event);
                        }
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    fold_recorded,
    long_thread,
    publish_in_one_run,
    state_delta,
    state_delta_publish
);
criterion_main!(benches);
