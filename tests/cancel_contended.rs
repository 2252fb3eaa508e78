//! A cancel while the run's producer publishes back to back: the `RUN_ERROR` goes in under the
//! thread's lock (the producer's next publish is refused, as after any `RUN_ERROR`), rather
//! than losing every compare-and-append race to the producer and answering 503. Both backends.

mod common;

use common::broker;
use common::broker::snapshot;
use common::sse_client;
use serde_json::json;
use std::time::{Duration, Instant};

/// Three producers of one run publish token deltas as fast as they are answered; a cancel in
/// their midst must answer 200, stop each of them with `run_already_errored`, and leave the
/// run cancelled.
async fn cancel_under_load(base: &str) {
    let thread = broker::thread_id("cancel-busy");
    sse_client::publish_ok(
        base,
        &thread,
        &[
            json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
        ],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let producers: Vec<_> = (0..3)
        .map(|p| {
            let (base, thread) = (base.to_string(), thread.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let url = format!("{base}/v1/threads/{thread}/events");
                let mut accepted = 0u32;
                while Instant::now() < deadline {
                    let event = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1",
                        "delta": format!("p{p}-{accepted} ")});
                    let resp = client.post(&url).json(&event).send().await.unwrap();
                    match resp.status().as_u16() {
                        200 => accepted += 1,
                        // The cancel's RUN_ERROR is in: the run takes nothing more.
                        409 => {
                            let body: serde_json::Value = resp.json().await.unwrap();
                            assert_eq!(body["error"]["rule"], "run_already_errored", "{body}");
                            return accepted;
                        }
                        s => panic!(
                            "producer {p}: unexpected {s}: {}",
                            resp.text().await.unwrap()
                        ),
                    }
                }
                panic!("producer {p} was never stopped by the cancel");
            })
        })
        .collect();
    // Let the producers get going.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/runs/r1/cancel"))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 200, "the cancel under load: {body}");
    let mut accepted = 0;
    for p in producers {
        accepted += p.await.unwrap();
    }
    assert!(accepted > 0, "the producers published before the cancel");
    let snap = snapshot(base, &thread).await;
    assert_eq!(snap["run"]["error"]["code"], "cancelled", "{snap}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_lands_while_the_producer_publishes_memory() {
    let server = broker::start_memory().await;
    cancel_under_load(&broker::base(server.addr)).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_lands_while_the_producer_publishes_redis() {
    let server = broker::start_redis().await;
    cancel_under_load(&broker::base(server.addr)).await;
    server.stop().await;
}
