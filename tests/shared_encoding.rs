//! What the hub synthesises from a thread's fold is encoded once per position and shared by
//! every connection that needs it (PROTOCOL §5): subscribers that start at one position get the
//! same prelude allocation, and subscribers reset at one position share their bridges'
//! snapshots. Before, each connection built and held its own copy (O(size of the fold) per
//! connection, for as long as its client did not read it).

mod common;

use agui_fanout::event::ThreadId;
use agui_fanout::hub::{Hub, Start, Subscription};
use agui_fanout::queue::Drained;
use common::{broker, sse_client};
use serde_json::{Value, json};
use std::time::Duration;

/// A run with a large state and an open message: a prelude or bridge restates both.
fn opening(thread: &str) -> Vec<Value> {
    vec![
        json!({"type":"RUN_STARTED","threadId":thread,"runId":"r1"}),
        json!({"type":"STATE_SNAPSHOT","snapshot":{"doc":"s".repeat(20_000)}}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"hello"}),
    ]
}

/// Subscribes until the subscription starts at `last` (the hub fans out after the publish
/// answered).
async fn subscribe_at(hub: &Hub, thread: &ThreadId, last: &str) -> Subscription {
    for _ in 0..500 {
        let sub = hub
            .subscribe(thread, Start::Live)
            .await
            .expect("subscribed");
        if sub
            .prelude
            .as_ref()
            .is_some_and(|p| p.id.to_string() == last)
        {
            return sub;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the hub never reached {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_at_one_position_share_one_prelude_and_a_new_position_gets_its_own() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("shared-prelude");
    let (_, last) = sse_client::publish_ok(&base, &thread, &opening(&thread)).await;
    let tid = ThreadId::parse(&thread).unwrap();
    let hub = &server.state.hub;
    let a = subscribe_at(hub, &tid, &last).await;
    let b = subscribe_at(hub, &tid, &last).await;
    let (pa, pb) = (a.prelude.as_ref().unwrap(), b.prelude.as_ref().unwrap());
    assert!(pa.bytes.len() > 20_000, "the prelude restates the state");
    assert_eq!(
        pa.bytes.as_ptr(),
        pb.bytes.as_ptr(),
        "one allocation, shared"
    );
    assert_eq!(pa.bytes, pb.bytes);

    // The fold moves on: a subscriber at the new position gets the prelude of that position.
    let (_, newer) = sse_client::publish_ok(
        &base,
        &thread,
        &[json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":" world"})],
    )
    .await;
    let c = subscribe_at(hub, &tid, &newer).await;
    let pc = c.prelude.as_ref().unwrap();
    assert_ne!(pc.bytes.as_ptr(), pa.bytes.as_ptr());
    let text = std::str::from_utf8(&pc.bytes).unwrap();
    assert!(text.contains(r#""content":"hello world""#), "{text}");
    drop((a, b, c));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_reset_at_one_position_share_their_bridges_snapshots() {
    let server = broker::start(|c| c.queue.max_events = 4).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("shared-bridge");
    let (_, last) = sse_client::publish_ok(&base, &thread, &opening(&thread)).await;
    let tid = ThreadId::parse(&thread).unwrap();
    let hub = &server.state.hub;
    // Two subscribers that never read: ten CUSTOM events overflow both.
    let subs = [
        subscribe_at(hub, &tid, &last).await,
        subscribe_at(hub, &tid, &last).await,
    ];
    let custom: Vec<Value> = (0..10)
        .map(|i| json!({"type":"CUSTOM","name":"n","value":i}))
        .collect();
    // In batches of at most a queue's 4 events (a batch must fit a queue whole).
    for batch in custom.chunks(4) {
        sse_client::publish_ok(&base, &thread, batch).await;
    }
    for _ in 0..500 {
        if subs.iter().all(|s| s.queue.reset_pending()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let batches: Vec<_> = subs
        .iter()
        .map(|s| match s.queue.try_drain() {
            Some(Drained::Frames(b)) => b,
            other => panic!("a bridge expected, got {other:?}"),
        })
        .collect();
    let shared: usize = batches[0]
        .chunks()
        .iter()
        .filter(|c| batches[1].chunks().iter().any(|d| d.as_ptr() == c.as_ptr()))
        .map(|c| c.len())
        .sum();
    assert!(
        shared > 20_000,
        "the snapshots are one allocation for both bridges ({shared} bytes shared)"
    );
    for b in &batches {
        let events = common::sse::body_events(&b.concat());
        assert_eq!(events[0]["name"], "agui-fanout.gap", "{events:?}");
        assert_eq!(events[0]["value"]["skipped"], 10, "{events:?}");
    }
    drop(subs);
    server.stop().await;
}
