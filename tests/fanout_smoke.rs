//! A first end-to-end check on a real socket: publish, subscribe, resume (memory backend).

mod common;

use common::{broker, sse_client};
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn publish_subscribe_resume_memory() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("smoke");
    let mut live = sse_client::subscribe(&base, &thread, "", None).await;
    assert_eq!(live.headers["content-type"], "text/event-stream");
    assert_eq!(live.headers["cache-control"], "no-cache, no-transform");
    assert_eq!(live.headers["x-accel-buffering"], "no");
    let events = vec![
        json!({"type":"RUN_STARTED","threadId":thread,"runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Hi\nthere"}),
        json!({"type":"TEXT_MESSAGE_END","messageId":"m1"}),
        json!({"type":"RUN_FINISHED","threadId":thread,"runId":"r1"}),
    ];
    let resp = sse_client::publish(&base, &thread, &events).await;
    assert_eq!(resp.status(), 200);
    let got = live.take(5, Duration::from_secs(5)).await;
    assert_eq!(
        got.iter().map(|r| r.data.clone()).collect::<Vec<_>>(),
        events
    );
    sse_client::assert_strictly_increasing(&got);

    let mut resumed = sse_client::subscribe(&base, &thread, "", Some(&got[1].id)).await;
    let rest = resumed.take(3, Duration::from_secs(5)).await;
    assert_eq!(rest, got[2..].to_vec());

    let mut from_start = sse_client::subscribe(&base, &thread, "?from=start", None).await;
    assert_eq!(from_start.take(5, Duration::from_secs(5)).await, got);
    server.stop().await;
}

/// SIGTERM semantics (PROTOCOL §9): during the drain period the node still answers, but
/// `/readyz` gets 503 and a new stream is told to reconnect (200, a short `retry:`, its end),
/// while open streams end themselves after a short `retry:`; then it stops.
#[tokio::test]
async fn draining_node_answers_503_then_stops() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_secs(2)).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("drain");
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let mut open = sse_client::open_raw(&base, &thread, "", None).await;
    server.shutdown.cancel();
    // The drain flag is set as soon as the shutdown starts; poll until it shows.
    let mut ready = 200;
    for _ in 0..100 {
        ready = client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if ready == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ready, 503, "readiness off while draining");
    let sub = client
        .get(format!("{base}/v1/threads/{thread}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(sub.status(), 200, "a new stream is told to reconnect");
    let body = sub.text().await.expect("the answer ends");
    assert!(body.starts_with("retry: "), "{body:?}");
    assert!(!body.contains("id:") && !body.contains("data:"), "{body:?}");
    let (frames, _) = open.read_to_end(Duration::from_secs(10)).await;
    // The test config's `retry_ms` is 100: the drain's `retry:` is at most 1.5× that.
    let last = frames
        .last()
        .and_then(|f| f.retry.as_deref()?.parse::<u64>().ok());
    assert!(
        last.is_some_and(|ms| (25..=150).contains(&ms)),
        "the open stream ends with a short retry: {last:?}"
    );
    tokio::time::timeout(Duration::from_secs(15), server.wait())
        .await
        .expect("the server stops after the drain");
}
