//! A subscriber that resumes far back and disconnects while its backfill waits for room must
//! leave nothing behind (its queue and backfill task were kept alive: an unbounded leak).
//! Its own test binary: it reads the process-wide count of queued events.

mod common;

use agui_fanout::queue::pending_events;
use common::{broker, sse_client};
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn disconnected_resumers_leave_no_queued_events() {
    let server = broker::start(|c| {
        c.queue.max_events = 64;
        c.retention.max_events = 50_000;
    })
    .await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("leak");
    let mut events = vec![json!({"type":"RUN_STARTED","threadId":t,"runId":"r"})];
    // 40 MB: far more than the socket buffers take, so the backfill of a client that stops
    // reading must wait for room.
    events
        .extend((0..10_000).map(
            |i| json!({"type":"CUSTOM","name":"n","value":"x".repeat(4000) + &i.to_string()}),
        ));
    let mut first = None;
    // At most a queue's 64 events per publish (a batch must fit a queue whole).
    for chunk in events.chunks(64) {
        let (f, _) = sse_client::publish_ok(&base, &t, chunk).await;
        first.get_or_insert(f);
    }
    let first = first.unwrap();
    for _ in 0..5 {
        // Read one event, then go away while the backfill has far more to send.
        let mut sub = sse_client::subscribe(&base, &t, "", Some(&first)).await;
        sub.take(1, Duration::from_secs(5)).await;
        drop(sub);
    }
    let mut pending = i64::MAX;
    for _ in 0..200 {
        pending = pending_events();
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        pending, 0,
        "queued events left behind by closed connections"
    );
    server.stop().await;
}
