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

/// Reads what `s` sends until `until` appears (or the peer closes), within `within`; the text.
async fn read_until(s: &mut tokio::net::TcpStream, until: &str, within: Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    while !String::from_utf8_lossy(&got).contains(until) {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => panic!(
                "no {until:?} within {within:?}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Opens a publish with a chunked JSON body on `addr` and sends `n` bytes of it, never the
/// end.
async fn endless_publish(
    addr: std::net::SocketAddr,
    thread: &str,
    n: usize,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/threads/{thread}/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 16 << 10];
    let mut sent = 0;
    while sent < n {
        let len = chunk.len().min(n - sent);
        s.write_all(format!("{len:x}\r\n").as_bytes())
            .await
            .unwrap();
        s.write_all(&chunk[..len]).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
        sent += len;
    }
    s
}

/// A JSON body that never ends is cut at `limits.body_timeout` with 408 `body_timeout` in
/// JSON, and its connection is closed (issue 13: such connections were held forever, with
/// their bytes).
#[tokio::test]
async fn a_body_that_never_ends_is_cut_at_the_timeout() {
    let server = broker::start(|c| c.limits.body_timeout = Duration::from_millis(300)).await;
    let t = broker::thread_id("endless");
    let mut s = endless_publish(server.addr, &t, 100_000).await;
    let resp = read_until(&mut s, "}}", Duration::from_secs(10)).await;
    assert!(resp.starts_with("HTTP/1.1 408"), "{resp}");
    let body = &resp[resp.find("\r\n\r\n").expect("a head") + 4..];
    let v: Value = serde_json::from_str(body).expect("JSON");
    assert_eq!(v["error"]["code"], "body_timeout", "{v}");
    // The connection is closed after the answer.
    read_until(&mut s, "never sent", Duration::from_secs(5)).await;
    server.stop().await;
}

/// Bodies being read on a node share `limits.bodies_in_flight_bytes`: while one connection
/// holds most of it, another body that does not fit is refused at once with 503 `busy` and
/// `Retry-After`, in JSON; once the first connection goes, the budget is free again.
#[tokio::test]
async fn the_budget_for_bodies_in_flight_is_enforced() {
    let server = broker::start(|c| {
        c.limits.max_body_bytes = 1 << 20;
        c.limits.bodies_in_flight_bytes = 1 << 20;
    })
    .await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("budget");
    let holder = endless_publish(server.addr, &t, 900_000).await;
    let client = reqwest::Client::new();
    let post = || {
        client
            .post(format!("{base}/v1/threads/{t}/events"))
            .header("content-type", "application/json")
            .body(" ".repeat(300_000))
            .send()
    };
    // The holder's bytes are taken as the broker reads them: poll until they are.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let resp = loop {
        let resp = post().await.unwrap();
        if resp.status() == 503 {
            break resp;
        }
        assert_eq!(resp.status(), 400, "the blank body is refused as not JSON");
        assert!(
            tokio::time::Instant::now() < deadline,
            "no 503 while another body holds 900 KB of a 1 MiB budget"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(resp.headers()["retry-after"], "1");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "busy", "{v}");
    drop(holder);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while post().await.unwrap().status() == 503 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the budget was not given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}
