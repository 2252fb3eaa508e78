//! Publishes served by the connection front (`src/http/publish_front.rs`): plain HTTP/1.1
//! publishes, one after another on a kept-alive connection, answered as the router answers
//! them; anything else on the same connection handed to hyper. Raw TCP, so that the tests see
//! exactly what goes on the wire: each answer's head and body, the connection kept or closed.

mod common;

use common::broker;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One client connection, reading answers one at a time.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

/// An answer: status, head (lowercased) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Value,
}

impl Answer {
    fn has(&self, header: &str) -> bool {
        self.head.contains(&format!("\r\n{header}"))
    }
}

impl Conn {
    async fn open(addr: std::net::SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Conn { s, buf: Vec::new() }
    }

    async fn send(&mut self, bytes: &str) {
        self.s.write_all(bytes.as_bytes()).await.expect("send");
    }

    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), self.s.read(&mut chunk))
            .await
            .expect("an answer within 5 s")
            .expect("read");
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// The next answer (its body read by `content-length`).
    async fn answer(&mut self) -> Answer {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(self.fill().await > 0, "closed before a whole head");
        };
        let head = String::from_utf8(self.buf[..end].to_vec())
            .expect("UTF-8")
            .to_ascii_lowercase();
        let len: usize = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("content-length")
            .parse()
            .expect("a number");
        while self.buf.len() < end + len {
            assert!(self.fill().await > 0, "closed before the whole body");
        }
        // JSON, or (`/readyz`) the text as a JSON string.
        let raw = &self.buf[end..end + len];
        let body = serde_json::from_slice(raw)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(raw).into_owned()));
        self.buf.drain(..end + len);
        let status = head[9..12].parse().expect("a status");
        Answer { status, head, body }
    }

    /// Whether the server closes the connection (within 5 s) with nothing more to say.
    async fn closed(&mut self) -> bool {
        self.buf.is_empty() && self.fill().await == 0
    }
}

fn publish(t: &str, body: &str, extra: &str) -> String {
    format!(
        "POST /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn run_started(t: &str) -> String {
    json!({"type":"RUN_STARTED","threadId":t,"runId":"r1"}).to_string()
}

fn message_start(id: &str) -> String {
    json!({"type":"TEXT_MESSAGE_START","messageId":id,"role":"assistant"}).to_string()
}

#[tokio::test]
async fn publishes_on_a_kept_alive_connection_are_answered_in_order() {
    let server = broker::start_memory().await;
    let t = broker::thread_id("front-publish");
    let mut c = Conn::open(server.addr).await;
    // Two pipelined in one write, then one more after the answers.
    let two = publish(&t, &run_started(&t), "") + &publish(&t, &message_start("m1"), "");
    c.send(&two).await;
    let first = c.answer().await;
    let second = c.answer().await;
    c.send(&publish(
        &t,
        &json!([
            {"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Hel"},
            {"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"lo"}
        ])
        .to_string(),
        "",
    ))
    .await;
    let third = c.answer().await;
    for a in [&first, &second, &third] {
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.head.starts_with("http/1.1 200 ok\r\n"), "{}", a.head);
        assert!(a.has("content-type: application/json"), "{}", a.head);
        assert!(a.has("date: "), "{}", a.head);
        assert!(!a.has("connection: close"), "{}", a.head);
    }
    assert_eq!(first.body["count"], 1);
    assert_eq!(third.body["count"], 2);
    let pos = |a: &Answer, key: &str| -> u64 {
        let id = a.body[key].as_str().expect("an id");
        id.rsplit('-').next().unwrap().parse().unwrap()
    };
    assert!(pos(&first, "lastId") < pos(&second, "firstId"));
    assert!(pos(&second, "lastId") < pos(&third, "firstId"));
    // The log folds to what was published.
    let snap = broker::snapshot(&broker::base(server.addr), &t).await;
    assert_eq!(snap["messages"][0]["content"], "Hello", "{snap}");
}

#[tokio::test]
async fn refused_publishes_keep_the_connection_and_append_nothing() {
    let server = broker::start_memory().await;
    let t = broker::thread_id("front-refused");
    let mut c = Conn::open(server.addr).await;
    c.send(&publish(&t, &run_started(&t), "")).await;
    assert_eq!(c.answer().await.status, 200);
    let cases: [(String, u16, &str, Option<&str>); 5] = [
        // Malformed JSON.
        (publish(&t, "{\"type\":", ""), 400, "invalid_json", None),
        // A batch with one invalid event: nothing of it is appended.
        (
            publish(
                &t,
                &json!([{"type":"TEXT_MESSAGE_START","messageId":"m9","role":"assistant"},{"type":"TEXT_MESSAGE_CONTENT","messageId":"m9"}]).to_string(),
                "",
            ),
            400,
            "invalid_event",
            None,
        ),
        // An id the path cannot hold (refused before the body, which is still consumed).
        (
            publish("bad%20id", &run_started(&t), ""),
            400,
            "invalid_thread_id",
            Some("threadId"),
        ),
        // Half a producer pair.
        (
            publish(&t, &message_start("m2"), "X-Producer-Id: w1\r\n"),
            400,
            "invalid_producer",
            Some("X-Producer-Seq"),
        ),
        // An order rule: content for a message never started.
        (
            publish(
                &t,
                &json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"nope","delta":"x"}).to_string(),
                "",
            ),
            409,
            "order_violation",
            None,
        ),
    ];
    for (request, status, code, field) in cases {
        c.send(&request).await;
        let a = c.answer().await;
        assert_eq!(a.status, status, "{request}: {a:?}");
        assert_eq!(a.body["error"]["code"], code, "{a:?}");
        if let Some(field) = field {
            assert_eq!(a.body["error"]["field"], field, "{a:?}");
        }
        assert!(!a.has("connection: close"), "{}", a.head);
    }
    // The connection still works, and the log holds only the accepted events.
    c.send(&publish(&t, &message_start("m3"), "")).await;
    let ok = c.answer().await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let snap = broker::snapshot(&broker::base(server.addr), &t).await;
    let ids: Vec<&str> = snap["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["m3"], "{snap}");
}

/// A head refused before its body came is answered at once, as the router answers it, and
/// the connection closed (its body is never read); a body cut by the client gets
/// `body_error`.
#[tokio::test]
async fn refused_heads_are_answered_before_their_body() {
    let server = broker::start_memory().await;
    let t = broker::thread_id("front-early");
    let mut c = Conn::open(server.addr).await;
    c.send("POST /v1/threads/bad%20id/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 16000000\r\n\r\n{\"a\":")
        .await;
    let a = c.answer().await;
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.body["error"]["code"], "invalid_thread_id");
    assert!(a.has("connection: close"), "{}", a.head);
    assert!(c.closed().await, "closed after the answer");
    // The client stops sending halfway (a half-close): 400 `body_error`.
    let mut c = Conn::open(server.addr).await;
    let request = publish(&t, &run_started(&t), "");
    c.send(&request[..request.len() - 5]).await;
    c.s.shutdown().await.expect("half-close");
    let a = c.answer().await;
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.body["error"]["code"], "body_error");
    assert!(a.has("connection: close"), "{}", a.head);
}

#[tokio::test]
async fn other_requests_on_the_connection_go_to_hyper() {
    let server = broker::start_memory().await;
    let t = broker::thread_id("front-handoff");
    let mut c = Conn::open(server.addr).await;
    c.send(&publish(&t, &run_started(&t), "")).await;
    assert_eq!(c.answer().await.status, 200);
    // A GET of another route, then a chunked publish: hyper and the router answer both.
    c.send("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let ready = c.answer().await;
    assert_eq!(ready.status, 200, "{ready:?}");
    let body = message_start("m1");
    c.send(&format!(
        "POST /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    ))
    .await;
    let chunked = c.answer().await;
    assert_eq!(chunked.status, 200, "{chunked:?}");
    assert_eq!(chunked.body["count"], 1);
}

#[tokio::test]
async fn connection_close_and_slow_bodies() {
    let server = broker::start(|c| c.limits.body_timeout = Duration::from_millis(300)).await;
    let t = broker::thread_id("front-close");
    // A body that arrives in pieces is read whole.
    let mut c = Conn::open(server.addr).await;
    let request = publish(&t, &run_started(&t), "");
    let (a, b) = request.split_at(request.len() - 10);
    c.send(a).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.send(b).await;
    assert_eq!(c.answer().await.status, 200);
    // `Connection: close` is honoured.
    c.send(&publish(&t, &message_start("m1"), "Connection: close\r\n"))
        .await;
    let a = c.answer().await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.has("connection: close"), "{}", a.head);
    assert!(c.closed().await, "closed after the answer");
    // A body that stops arriving: 408 within `limits.body_timeout`, then the close.
    let mut c = Conn::open(server.addr).await;
    let request = publish(&t, &message_start("m2"), "");
    c.send(&request[..request.len() - 5]).await;
    let a = c.answer().await;
    assert_eq!(a.status, 408, "{a:?}");
    assert_eq!(a.body["error"]["code"], "body_timeout");
    assert!(a.has("connection: close"), "{}", a.head);
    assert!(c.closed().await, "closed after the answer");
}

#[tokio::test]
async fn a_body_over_the_budget_is_refused_and_skipped() {
    let server = broker::start(|c| {
        c.limits.bodies_in_flight_bytes = 4096;
        c.limits.max_body_bytes = 4096;
        c.limits.max_event_bytes = 4096;
    })
    .await;
    let t = broker::thread_id("front-budget");
    // A body still arriving holds its declared length of the node's budget.
    let mut holder = Conn::open(server.addr).await;
    let filler = format!("[{}]", " ".repeat(4088));
    let held = publish(&t, &filler, "");
    let cut = held.len() - 100;
    holder.send(&held[..cut]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Meanwhile: 503 busy, the body's bytes read and dropped, the connection kept.
    let mut c = Conn::open(server.addr).await;
    c.send(&publish(&t, &run_started(&t), "")).await;
    let a = c.answer().await;
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.body["error"]["code"], "busy");
    assert!(a.has("retry-after: 1"), "{}", a.head);
    assert!(!a.has("connection: close"), "{}", a.head);
    // The held body ends (an empty batch: refused), giving its budget back.
    holder.send(&held[cut..]).await;
    assert_eq!(holder.answer().await.status, 400);
    c.send(&publish(&t, &run_started(&t), "")).await;
    assert_eq!(c.answer().await.status, 200);
    // Over `limits.max_body_bytes`: hyper's path answers 413.
    c.send(&publish(&t, &"x".repeat(5000), "")).await;
    assert_eq!(c.answer().await.status, 413);
}

#[tokio::test]
async fn an_idle_publisher_connection_does_not_hold_the_shutdown() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_millis(200)).await;
    let t = broker::thread_id("front-idle");
    let mut c = Conn::open(server.addr).await;
    c.send(&publish(&t, &run_started(&t), "")).await;
    assert_eq!(c.answer().await.status, 200);
    let started = std::time::Instant::now();
    server.shutdown.cancel();
    // Closed once the drain is over, well before the drain deadline's grace.
    assert!(c.closed().await, "the idle connection is closed");
    tokio::time::timeout(Duration::from_secs(5), server.wait())
        .await
        .expect("the node stops");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
