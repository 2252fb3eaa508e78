//! A publish must fit a subscriber's queue whole: the fan-out pushes a batch into each queue
//! at once, so a batch beyond `queue.max_events` (its adjacent deltas merged) or
//! `queue.max_bytes` would reset every subscriber, those keeping up included. Such a JSON
//! batch is refused (413, nothing appended); an SSE ingest is appended in batches that fit; a
//! batch that fits (deltas that merge included) reaches a subscriber that keeps up whole,
//! without a reset.

mod common;

use common::broker;
use common::sse_client::{self, open_raw};
use serde_json::{Value, json};
use std::time::Duration;

const QUEUE_EVENTS: usize = 64;
const QUEUE_BYTES: usize = 16 * 1024;

async fn start() -> agui_fanout::app::Server {
    broker::start(|c| {
        c.queue.max_events = QUEUE_EVENTS;
        c.queue.max_bytes = QUEUE_BYTES;
    })
    .await
}

/// `n` `CUSTOM` events (never coalesced) with `pad` bytes of value each.
fn customs(n: usize, pad: usize) -> Vec<Value> {
    (0..n)
        .map(
            |i| json!({"type": "CUSTOM", "name": "c", "value": format!("{i}:{}", "x".repeat(pad))}),
        )
        .collect()
}

/// The next data frame's event; fails on a reset (a bridge or a gap event): the subscriber
/// kept up.
async fn next_data(stream: &mut sse_client::RawStream) -> Value {
    let frame = stream
        .next_event(Duration::from_secs(10))
        .await
        .expect("the stream stays open");
    let id = frame.id.clone().unwrap_or_default();
    assert!(
        !id.ends_with("-bridge"),
        "a subscriber keeping up was reset: {id}"
    );
    let v: Value = serde_json::from_str(frame.data.as_deref().unwrap_or("null")).unwrap();
    assert_ne!(
        v["name"], "agui-fanout.gap",
        "a subscriber keeping up lost events: {v}"
    );
    v
}

/// A live subscription with its prelude read: its queue is empty before the next batch (a
/// backlog left there would make it a subscriber that falls behind, which a reset is for).
async fn live_after_prelude(base: &str, thread: &str) -> sse_client::RawStream {
    let mut live = open_raw(base, thread, "", None).await;
    // Only a prelude's last event carries an id.
    while live
        .next_event(Duration::from_secs(10))
        .await
        .expect("the prelude")
        .id
        .is_none()
    {}
    live
}

/// Reads the next `n` `CUSTOM` events of a subscription ([`next_data`]).
async fn read_all(stream: &mut sse_client::RawStream, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    while got.len() < n {
        let v = next_data(stream).await;
        if v["type"] == "CUSTOM" {
            got.push(v);
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_bounded_by_a_subscribers_queue() {
    let server = start().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("batch-bounds");
    sse_client::publish_ok(
        &base,
        &thread,
        &[json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"})],
    )
    .await;
    let mut live = live_after_prelude(&base, &thread).await;

    // One event more than a queue takes: refused, nothing appended.
    let before = broker::snapshot(&base, &thread).await["lastEventId"].clone();
    let resp = sse_client::publish(&base, &thread, &customs(QUEUE_EVENTS + 1, 8)).await;
    assert_eq!(resp.status(), 413);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_large", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("queue.max_events"), "{message}");
    assert!(message.contains(&QUEUE_EVENTS.to_string()), "{message}");
    // More frame bytes than a queue takes (40 events of ~500 bytes > 16 KiB): refused.
    let resp = sse_client::publish(&base, &thread, &customs(40, 500)).await;
    assert_eq!(resp.status(), 413);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue.max_bytes"),
        "{body}"
    );
    assert_eq!(
        broker::snapshot(&base, &thread).await["lastEventId"],
        before
    );

    // Exactly what a queue takes: every event reaches the live subscriber, none reset.
    sse_client::publish_ok(&base, &thread, &customs(QUEUE_EVENTS, 8)).await;
    let got = read_all(&mut live, QUEUE_EVENTS).await;
    assert_eq!(got, customs(QUEUE_EVENTS, 8));

    // The same bytes through an SSE ingest: appended in batches that fit, all of them (read
    // back from the log: a live subscriber may still hold one batch when the next comes).
    let events = customs(40, 500);
    let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    let resp = sse_client::publish_sse(&base, &thread, body).await;
    assert_eq!(resp.status(), 200);
    let reply: Value = resp.json().await.unwrap();
    assert_eq!(reply["count"], 40, "{reply}");
    let mut replay = open_raw(&base, &thread, "?from=start", None).await;
    let got = read_all(&mut replay, QUEUE_EVENTS + 40).await;
    assert_eq!(got[QUEUE_EVENTS..], events[..]);
    drop(replay);
    // A new live subscriber, its prelude read, for the next batch (the first may still be
    // busy with the ingest's batches).
    drop(live);
    let mut live = live_after_prelude(&base, &thread).await;

    // More deltas than a queue takes, to one message: adjacent deltas merge into one frame,
    // so the batch fits, and arrives whole (merged), without a reset.
    sse_client::publish_ok(
        &base,
        &thread,
        &[json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"})],
    )
    .await;
    let deltas: Vec<Value> = (0..QUEUE_EVENTS * 2)
        .map(|i| json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": format!("w{i} ")}))
        .collect();
    sse_client::publish_ok(&base, &thread, &deltas).await;
    let want: String = (0..QUEUE_EVENTS * 2).map(|i| format!("w{i} ")).collect();
    let mut text = String::new();
    while text.len() < want.len() {
        let v = next_data(&mut live).await;
        if v["type"] == "TEXT_MESSAGE_CONTENT" {
            text.push_str(v["delta"].as_str().unwrap());
        }
    }
    assert_eq!(text, want);
    server.stop().await;
}
