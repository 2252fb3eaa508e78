//! The drain a client survives (PROTOCOL §9), on real sockets: a subscribe to a draining node is
//! told to reconnect (200, never an error status, on hyper's path as on the front's), every
//! HTTP/1 answer during the drain carries `Connection: close`, and an SSE ingest still open
//! when the drain ends answers with what it appended before its connection closes.
//! (The front's draining answer is in `conn_front.rs`; a real `EventSource` following a drain
//! to another node in `eventsource.rs`.)

mod common;

use agui_fanout::app::Server;
use agui_fanout::event::ThreadId;
use agui_fanout::log::ReadFrom;
use bytes::Bytes;
use common::{broker, sse_client};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` on a new connection and reads until the server closes it (at most 5 s).
async fn until_closed(server: &Server, request: &str) -> String {
    let mut s = TcpStream::connect(server.addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .unwrap_or_else(|_| panic!("not closed within 5 s: {:?}", String::from_utf8_lossy(&got)))
        .expect("read");
    String::from_utf8(got).expect("UTF-8")
}

/// Starts the drain of `server` and waits until it shows (`/readyz` at 503).
async fn start_drain(server: &Server) {
    server.shutdown.cancel();
    let url = format!("{}/readyz", broker::base(server.addr));
    for _ in 0..100 {
        let status = reqwest::get(&url).await.expect("readyz").status();
        if status == 503 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the drain did not start");
}

fn run_started(t: &str) -> Value {
    json!({"type": "RUN_STARTED", "threadId": t, "runId": "r"})
}

fn custom(n: u64) -> Value {
    json!({"type": "CUSTOM", "name": "n", "value": n})
}

/// A subscribe that hyper serves (a head the front does not take: two `Last-Event-ID`s) gets
/// the same draining answer as the front's: 200, a short `retry:`, no id, the end.
#[tokio::test]
async fn a_draining_node_answers_a_subscribe_served_by_hyper_200() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_secs(2)).await;
    let t = broker::thread_id("drain-hyper");
    start_drain(&server).await;
    let resp = until_closed(
        &server,
        &format!(
            "GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 0-1\r\nLast-Event-ID: 0-2\r\n\r\n"
        ),
    )
    .await;
    let (head, body) = resp.split_once("\r\n\r\n").expect("a head");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains("\r\ncontent-type: text/event-stream"),
        "{head}"
    );
    assert!(head.contains("\r\nconnection: close"), "{head}");
    // The test config's `retry_ms` is 100: ¼× to 1.5×.
    let retry: u64 = body
        .strip_prefix("retry: ")
        .and_then(|rest| rest.split_once('\n'))
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or_else(|| panic!("a retry first: {body:?}"));
    assert!((25..=150).contains(&retry), "{retry}");
    assert!(!body.contains("id:") && !body.contains("data:"), "{body:?}");
    server.wait().await;
}

/// Publish answers carry `Connection: close` once the node drains (not before): the producer's
/// next request goes on a new connection, not on one the node is about to close.
#[tokio::test]
async fn publish_answers_during_a_drain_close_their_connection() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_secs(2)).await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("drain-close");
    let before = sse_client::publish(&base, &t, &[run_started(&t)]).await;
    assert_eq!(before.status(), 200);
    assert_eq!(
        before.headers().get("connection"),
        None,
        "keep-alive before"
    );
    start_drain(&server).await;
    let during = sse_client::publish(&base, &t, &[custom(1)]).await;
    assert_eq!(during.status(), 200, "publishes are still accepted");
    assert_eq!(
        during.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    // On a raw keep-alive request too: the node answers, then closes.
    let raw = until_closed(
        &server,
        &format!(
            "POST /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
            custom(2).to_string().len(),
            custom(2)
        ),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(
        raw.to_ascii_lowercase().contains("\r\nconnection: close"),
        "{raw}"
    );
    server.wait().await;
}

/// An SSE ingest whose producer is still streaming when the drain ends: the node stops reading
/// and answers `503 draining` with `appended` and `lastId` (exactly what the log holds of the
/// stream), `Retry-After` and `Connection: close`, instead of cutting it without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_ingest_open_when_the_drain_ends_gets_its_reply() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_millis(500)).await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("drain-ingest");
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let request = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{t}/events"))
        .header("content-type", "text/event-stream")
        .body(body)
        .send();
    let reply = tokio::spawn(request);
    // The producer: an event every 5 ms until its stream is refused.
    let first = format!("data: {}\n\n", run_started(&t));
    let producer = tokio::spawn(async move {
        let mut next = Some(first);
        for n in 1.. {
            let chunk = next
                .take()
                .unwrap_or_else(|| format!("data: {}\n\n", custom(n)));
            if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    // The drain starts once some events are in the log, the producer still streaming.
    let tid = ThreadId::parse(&t).unwrap();
    let log = |server: &Server| {
        let log = server.state.log.clone();
        let tid = tid.clone();
        async move { log.read(&tid, ReadFrom::Start, 100_000).await.unwrap() }
    };
    for _ in 0..200 {
        if log(&server).await.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.shutdown.cancel();
    let resp = tokio::time::timeout(Duration::from_secs(5), reply)
        .await
        .expect("an answer once the drain ends")
        .expect("the request task")
        .expect("an answer, not a cut connection");
    assert_eq!(resp.status(), 503);
    assert_eq!(
        resp.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(v["error"]["code"], "draining", "{v}");
    let log = log(&server).await;
    assert!(log.len() >= 3, "{v}");
    assert_eq!(v["error"]["appended"], log.len(), "{v}");
    assert_eq!(
        v["error"]["lastId"],
        log[log.len() - 1].id.to_string(),
        "{v}"
    );
    producer.abort();
    server.wait().await;
}

/// What became of one connection made while a drain ended.
#[derive(Debug, PartialEq)]
enum Fate {
    /// Refused at connect: the listener was closed (a client retries another node).
    Refused,
    /// Connected and answered.
    Answered,
    /// Connected (the kernel completed the handshake) and then closed or reset with no answer.
    Unanswered,
}

/// Connects, asks `/healthz`, and reads until the close.
async fn one_connection(addr: std::net::SocketAddr) -> Fate {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return Fate::Refused;
    };
    let _ = s
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: drain\r\n\r\n")
        .await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    if got.starts_with(b"HTTP/1.1 ") {
        Fate::Answered
    } else {
        Fate::Unanswered
    }
}

/// Connections made right up to the end of a drain are each answered or refused: those the
/// kernel completed but the broker had not accepted yet when it stopped accepting are taken
/// and answered, not reset by the listener's close (a proxy forwarding one would have nothing
/// to give its client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_queued_when_the_drain_ends_are_answered() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_millis(300)).await;
    let addr = server.addr;
    start_drain(&server).await;
    let clients: Vec<_> = (0..16)
        .map(|_| {
            tokio::spawn(async move {
                let mut fates = Vec::new();
                loop {
                    let fate = one_connection(addr).await;
                    let refused = fate == Fate::Refused;
                    fates.push(fate);
                    if refused {
                        return fates;
                    }
                }
            })
        })
        .collect();
    let mut fates = Vec::new();
    for c in clients {
        fates.extend(c.await.expect("client task"));
    }
    let unanswered = fates.iter().filter(|f| **f == Fate::Unanswered).count();
    let answered = fates.iter().filter(|f| **f == Fate::Answered).count();
    assert!(answered > 0, "some connections came during the drain");
    assert_eq!(unanswered, 0, "of {} connections", fates.len());
    server.stop().await;
}

/// Connections accepted during the drain whose first request comes only after the drain
/// ended are answered, on HTTP/1 and on HTTP/2 with prior knowledge (hyper's graceful
/// shutdown used to close both before they read their request, without a byte).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_request_after_the_drain_ended_is_answered_on_http1_and_http2() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_millis(300)).await;
    start_drain(&server).await;
    let mut h1 = TcpStream::connect(server.addr).await.expect("connect h1");
    let h2 = TcpStream::connect(server.addr).await.expect("connect h2");
    // The drain ends (the node stops accepting) while both wait.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "no longer accepting"
    );

    h1.write_all(b"GET /healthz HTTP/1.1\r\nhost: drain\r\n\r\n")
        .await
        .expect("send h1");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), h1.read_to_end(&mut got))
        .await
        .expect("h1 closed in time")
        .expect("h1 read");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );

    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(h2),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    let req = axum::http::Request::get(format!("http://{}/healthz", server.addr))
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("h2 answer in time")
        .expect("h2 answer");
    assert_eq!(resp.status(), 200);
    server.stop().await;
}
