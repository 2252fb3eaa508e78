//! The connection front (`src/http/conn.rs`): plain HTTP/1 subscribes are served on the raw
//! socket, everything else by hyper. These tests talk raw TCP so that they see exactly what
//! goes on the wire: the response head, errors as JSON, the close-delimited body, a client
//! that goes away, and the requests handed to hyper.

mod common;

use common::{broker, sse_client};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` and reads until `until` appears in what came back (or the peer closes).
async fn exchange(addr: std::net::SocketAddr, request: &str, until: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&got).contains(until) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {until:?} within 5 s; got {:?}",
                    String::from_utf8_lossy(&got)
                )
            })
            .expect("read");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(got).expect("UTF-8")
}

fn split_head(resp: &str) -> (String, &str) {
    let end = resp.find("\r\n\r\n").expect("a complete head");
    (resp[..end].to_ascii_lowercase(), &resp[end + 4..])
}

#[tokio::test]
async fn subscribe_head_and_events_on_the_raw_socket() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("front");
    // Extra bytes after the head (a pipelined request) are read and ignored.
    let request = format!(
        "GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n"
    );
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("retry: ") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
    }
    sse_client::publish_ok(
        &base,
        &t,
        &[json!({"type":"RUN_STARTED","threadId":t,"runId":"r1"})],
    )
    .await;
    while !String::from_utf8_lossy(&got).contains("RUN_STARTED") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("the event within 5 s")
            .unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(got).unwrap();
    let (head, body) = split_head(&text);
    assert!(head.starts_with("http/1.1 200 ok"), "{head}");
    for h in [
        "content-type: text/event-stream",
        "cache-control: no-cache, no-transform",
        "x-accel-buffering: no",
        "connection: close",
        "date: ",
    ] {
        assert!(head.contains(&format!("\r\n{h}")), "missing {h}: {head}");
    }
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert!(!body.contains('\r'), "LF only: {body:?}");
    assert!(body.starts_with("retry: "), "{body:?}");
    assert!(body.contains("id: "), "{body:?}");
    // Not answered: the pipelined request after the subscribe.
    assert!(!body.contains("HTTP/1.1"), "{body:?}");
}

#[tokio::test]
async fn errors_are_json_with_the_field() {
    let server = broker::start_memory().await;
    let long = "x".repeat(300);
    let resp = exchange(
        server.addr,
        &format!("GET /v1/threads/{long}/events HTTP/1.1\r\nHost: x\r\n\r\n"),
        "}}",
    )
    .await;
    let (head, body) = split_head(&resp);
    assert!(head.starts_with("http/1.1 400 bad request"), "{head}");
    assert!(
        head.contains("\r\ncontent-type: application/json"),
        "{head}"
    );
    assert!(
        head.contains(&format!("\r\ncontent-length: {}", body.len())),
        "{head}"
    );
    let v: Value = serde_json::from_str(body).expect("JSON body");
    assert_eq!(v["error"]["code"], "invalid_thread_id", "{v}");
    assert_eq!(v["error"]["field"], "threadId", "{v}");
}

#[tokio::test]
async fn a_draining_node_refuses_new_streams_with_503_json() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_secs(2)).await;
    let addr = server.addr;
    server.shutdown.cancel();
    let t = broker::thread_id("drain");
    // The flag is set as soon as the drain starts; poll briefly for it.
    let mut last = String::new();
    for _ in 0..50 {
        last = exchange(
            addr,
            &format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\n\r\n"),
            "\r\n\r\n",
        )
        .await;
        if last.starts_with("HTTP/1.1 503") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let full = exchange(
        addr,
        &format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\n\r\n"),
        "}}",
    )
    .await;
    let (head, body) = split_head(&full);
    assert!(head.starts_with("http/1.1 503"), "{last} / {head}");
    assert!(head.contains("\r\nretry-after: 1"), "{head}");
    let v: Value = serde_json::from_str(body).expect("JSON body");
    assert_eq!(v["error"]["code"], "draining", "{v}");
    server.wait().await;
}

#[tokio::test]
async fn a_client_that_goes_away_is_unregistered_at_once() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("gone");
    let before = sse_client::metric(&base, "agui_connections", &[]).await;
    let mut conns = Vec::new();
    for _ in 0..20 {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        conns.push(s);
    }
    assert_eq!(
        sse_client::metric(&base, "agui_connections", &[]).await - before,
        20.0
    );
    drop(conns);
    // Nothing is published: only watching the socket notices the close.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let now = sse_client::metric(&base, "agui_connections", &[]).await;
        if now == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {now} connections 3 s after the clients left (before: {before})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn unusual_subscribes_are_served_by_hyper() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("hyper");
    let (_, last) = sse_client::publish_ok(
        &base,
        &t,
        &[json!({"type":"RUN_STARTED","threadId":t,"runId":"r1"})],
    )
    .await;
    // Two `Last-Event-ID` fields: the front does not choose, hyper's path takes the first.
    let resp = exchange(
        server.addr,
        &format!(
            "GET /v1/threads/{t}/events?from=start HTTP/1.1\r\nHost: x\r\nLast-Event-ID: \r\nLast-Event-ID: \r\n\r\n"
        ),
        &format!("id: {last}"),
    )
    .await;
    let (head, body) = split_head(&resp);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("\r\ntransfer-encoding: chunked"), "{head}");
    assert!(body.contains("RUN_STARTED"), "{body}");
    // A request hyper cannot parse gets hyper's answer, not a hang.
    let resp = exchange(server.addr, "BLAH\r\n\r\n", "\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
}
