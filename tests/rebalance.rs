//! Rebalancing (`sse.max_stream_age`, PROTOCOL §9): a stream older than its (jittered) age
//! limit ends with a short `retry:`, and its client, reconnecting with `Last-Event-ID` to
//! another node (as a load balancer may send it after a scale-out), resumes exactly: every
//! event once, in order. Two in-process brokers on the test Redis.

mod common;

use common::broker;
use common::sse_client::{self, publish_ok};
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// The run a producer publishes one event at a time: a message streamed in `n` chunks.
fn run(thread: &str, n: usize) -> Vec<Value> {
    let mut events = vec![
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
    ];
    for i in 0..n {
        events.push(
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": format!("w{i} ")}),
        );
    }
    events.push(json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}));
    events.push(json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"}));
    events
}

#[tokio::test]
async fn an_old_stream_ends_with_a_short_retry_and_resumes_exactly_on_another_node() {
    let a = broker::start(|c| {
        c.redis_url = broker::redis_url();
        c.sse.max_stream_age = Some(Duration::from_millis(400));
    })
    .await;
    let b = broker::start(|c| c.redis_url = broker::redis_url()).await;
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let thread = broker::thread_id("rebalance");
    let events = run(&thread, 12);

    let mut first = sse_client::open_raw(&base_a, &thread, "", None).await;
    assert_eq!(first.status, 200);
    let producer = {
        let (base, thread, events) = (base_a.clone(), thread.clone(), events.clone());
        tokio::spawn(async move {
            for e in events {
                publish_ok(&base, &thread, &[e]).await;
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
        })
    };

    // On A: events, then the end by age (300-400 ms in) with a short jittered retry.
    let (frames, rest) = first.read_to_end(WAIT).await;
    assert!(rest.is_empty(), "a whole last frame");
    let mut got: Vec<(String, Value)> = Vec::new();
    for f in &frames {
        if let (Some(id), Some(data)) = (&f.id, &f.data) {
            got.push((id.clone(), serde_json::from_str(data).unwrap()));
        }
    }
    let last = frames.last().expect("frames");
    let retry: u64 = last
        .retry
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("the last frame is a retry: {:?}", last.text));
    // ¼× to 1.5× of the test config's retry_ms (100).
    assert!((25..=150).contains(&retry), "{retry}");
    assert!(
        !got.is_empty() && got.len() < events.len(),
        "the stream ended mid-run: {} of {} events",
        got.len(),
        events.len()
    );

    // On B, from the last id: the rest, exactly.
    let last_id = got.last().unwrap().0.clone();
    let mut second = sse_client::subscribe(&base_b, &thread, "", Some(&last_id)).await;
    while got.len() < events.len() {
        let r = second.next(WAIT).await.expect("the rest of the run on B");
        got.push((r.id, r.data));
    }
    producer.await.unwrap();
    let ids: Vec<_> = got.iter().map(|(id, _)| sse_client::id_key(id)).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "in order, no duplicate: {ids:?}"
    );
    let types: Vec<_> = got.iter().map(|(_, e)| e["type"].clone()).collect();
    let sent: Vec<_> = events.iter().map(|e| e["type"].clone()).collect();
    assert_eq!(types, sent);
    let deltas: String = got
        .iter()
        .filter_map(|(_, e)| e["delta"].as_str())
        .collect();
    assert_eq!(
        deltas,
        (0..12).map(|i| format!("w{i} ")).collect::<String>()
    );
    assert!(
        sse_client::metric(&base_a, "agui_disconnects_total", &[("cause", "max_age")]).await >= 1.0
    );
}
