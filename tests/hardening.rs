//! Regressions from trying to break the broker with bad input (each was a real finding).

mod common;

use common::{broker, sse_client};
use serde_json::{Value, json};
use std::time::Duration;

async fn post_sse(base: &str, thread: &str, body: Vec<u8>) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "text/event-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// A UTF-8 BOM at the start of an SSE ingest is tolerated (it made the parser crate panic).
#[tokio::test]
async fn sse_ingest_with_a_bom() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("bom");
    let body = format!(
        "\u{feff}data: {}\n\n",
        json!({"type":"RUN_STARTED","threadId":t,"runId":"r"})
    );
    let (status, reply) = post_sse(&base, &t, body.into_bytes()).await;
    assert_eq!((status, reply["count"].clone()), (200, json!(1)), "{reply}");
    server.stop().await;
}

/// A byte that is not UTF-8 ends an SSE ingest at once (the parser crate buffered everything
/// after it until the end of the body).
#[tokio::test]
async fn sse_ingest_with_invalid_utf8() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("utf8");
    let mut body = format!(
        "data: {}\n\n: ",
        json!({"type":"RUN_STARTED","threadId":t,"runId":"r"})
    )
    .into_bytes();
    body.push(0xff);
    body.extend_from_slice(b"\n\n");
    body.extend(
        std::iter::repeat_n(b"data: {\"type\":\"RAW\",\"event\":1}\n\n".to_vec(), 1000).flatten(),
    );
    let (status, reply) = post_sse(&base, &t, body).await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["code"], "invalid_event_stream", "{reply}");
    server.stop().await;
}

/// An empty `Last-Event-ID` header does not hide a valid `?lastEventId=`.
#[tokio::test]
async fn empty_header_does_not_hide_the_query_id() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("empty-header");
    let events = [
        json!({"type":"RUN_STARTED","threadId":t,"runId":"r"}),
        json!({"type":"CUSTOM","name":"a","value":1}),
        json!({"type":"CUSTOM","name":"b","value":2}),
    ];
    let (first, _) = sse_client::publish_ok(&base, &t, &events).await;
    let mut sub =
        sse_client::subscribe(&base, &t, &format!("?lastEventId={first}"), Some("")).await;
    let got = sub.take(2, Duration::from_secs(5)).await;
    assert_eq!(got[0].data, events[1], "an exact resume, not a prelude");
    server.stop().await;
}

/// Any event naming another thread is refused, not only run events (PROTOCOL §2).
#[tokio::test]
async fn any_event_naming_another_thread_is_refused() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("other-thread");
    let events = [
        json!({"type":"RUN_STARTED","threadId":t,"runId":"r"}),
        json!({"type":"CUSTOM","name":"a","value":1,"threadId":"somewhere-else"}),
    ];
    let resp = sse_client::publish(&base, &t, &events).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        (
            body["error"]["index"].clone(),
            body["error"]["field"].clone()
        ),
        (json!(1), json!("threadId")),
        "{body}"
    );
    server.stop().await;
}

/// A batch larger than twice `retention.max_events` is refused (413): it could be trimmed
/// before a checkpoint stands for it, leaving the thread without a rebuildable fold.
#[tokio::test]
async fn batch_larger_than_retention_is_refused() {
    let server = broker::start(|c| c.retention.max_events = 10).await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("big-batch");
    let mut events = vec![json!({"type":"RUN_STARTED","threadId":t,"runId":"r"})];
    events.extend((0..20).map(|i| json!({"type":"CUSTOM","name":"n","value":i})));
    let resp = sse_client::publish(&base, &t, &events).await;
    assert_eq!(resp.status(), 413);
    let resp = sse_client::publish(&base, &t, &events[..20]).await;
    assert_eq!(resp.status(), 200);
    server.stop().await;
}
