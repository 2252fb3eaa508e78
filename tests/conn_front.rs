//! The connection front (`src/http/conn.rs`): plain HTTP/1 subscribes are served on the raw
//! socket, everything else by hyper. These tests talk raw TCP so that they see exactly what
//! goes on the wire: the response head, errors as JSON, the close-delimited body, a client
//! that goes away, and the requests handed to hyper.

mod common;

use common::{broker, sse, sse_client};
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

/// The write timeout counts time without progress, not time without write readiness: a client
/// that reads slowly (Linux reports room only once a third of the send buffer is free, which
/// takes longer than the timeout here) keeps its stream and gets every byte.
#[tokio::test]
async fn a_slow_but_reading_subscriber_is_not_timed_out() {
    let server = broker::start(|c| {
        c.sse.write_timeout = Duration::from_millis(500);
        c.queue.max_bytes = 16 << 20;
    })
    .await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("slow-reader");
    let mut s = small_window_subscriber(server.addr, &base, &t).await;
    let pad = "x".repeat(200_000);
    for seq in 0..3 {
        let ev = json!({"type":"CUSTOM","name":"big","value":{"seq":seq,"pad":pad}});
        assert_eq!(sse_client::publish_one(&base, &t, &ev).await.status(), 200);
    }
    // ~160 KB/s: 8 KiB every 50 ms.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 8 << 10];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tail = String::from_utf8_lossy(&got[got.len().saturating_sub(300_000)..]).to_string();
        if tail.contains("\"seq\":2") && tail.ends_with("\n\n") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all 3 events in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = s.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "the broker closed the stream after {} bytes",
            got.len()
        );
        got.extend_from_slice(&buf[..n]);
    }
}

/// A subscriber that keeps sending after its request is closed once it sent more than the
/// front ignores (64 KiB); a few stray bytes are ignored.
#[tokio::test]
async fn a_subscriber_that_keeps_sending_is_closed() {
    let server = broker::start_memory().await;
    let t = broker::thread_id("chatty");
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 16 << 10];
    assert!(s.read(&mut buf).await.unwrap() > 0);
    // A few stray bytes: ignored, the stream goes on.
    s.write_all(b"\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let base = broker::base(server.addr);
    sse_client::publish_ok(
        &base,
        &t,
        &[json!({"type":"RUN_STARTED","threadId":t,"runId":"r1"})],
    )
    .await;
    let n = s.read(&mut buf).await.unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).contains("RUN_STARTED"),
        "the stream is still open"
    );
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let junk = vec![b'x'; 4096];
        for _ in 0..256 {
            if wr.write_all(&junk).await.is_err() {
                break;
            }
        }
        // Keep the write half open (dropping it would end the request side, which closes the
        // stream for another reason).
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(wr);
    });
    read_until_closed(
        &mut rd,
        Duration::from_secs(5),
        "closed after 1 MiB of junk",
    )
    .await;
    writer.abort();
}

/// Requests the router matches but whose thread id or query cannot be read (served by hyper
/// and axum's extractors), or whose `from` is not `start`, still get the JSON error naming
/// the field.
#[tokio::test]
async fn unreadable_thread_ids_and_queries_get_json_errors() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let client = reqwest::Client::new();
    let cases = [
        (
            client.get(format!("{base}/v1/threads/%FF/events")),
            "invalid_thread_id",
            "threadId",
        ),
        (
            client
                .post(format!("{base}/v1/threads/%FF/events"))
                .header("content-type", "application/json")
                .body("{}"),
            "invalid_thread_id",
            "threadId",
        ),
        (
            client.get(format!("{base}/v1/threads/%FF/snapshot")),
            "invalid_thread_id",
            "threadId",
        ),
        (
            client.get(format!("{base}/v1/threads/t/events?from=start&from=start")),
            "invalid_query",
            "from",
        ),
        // A position this API does not take, served by the front and by the router (a
        // request with a body goes to hyper): an error, not a stream from the head.
        (
            client.get(format!("{base}/v1/threads/t/events?from=begin")),
            "invalid_query",
            "from",
        ),
        (
            client
                .get(format!("{base}/v1/threads/t/events?lastEventId=&from=0"))
                .body("x"),
            "invalid_query",
            "from",
        ),
    ];
    for (request, code, field) in cases {
        let resp = request.send().await.expect("answer");
        assert_eq!(resp.status(), 400);
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("application/json"), "{ct}");
        let v: Value = resp.json().await.expect("JSON body");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert_eq!(v["error"]["field"], field, "{v}");
    }
}

/// A subscribe to a draining node, served by the front: `200`, a whole event stream of a short
/// jittered `retry:` (¼× to 1.5× `sse.retry_ms`) and a comment, no `id:` (the client's
/// `Last-Event-ID` stays), and the end: an `EventSource` reconnects, where a 503 closed it for
/// good (PROTOCOL §9).
#[tokio::test]
async fn a_draining_node_answers_a_subscribe_200_and_ends_it() {
    let server = broker::start(|c| {
        c.shutdown.drain = Duration::from_secs(2);
        c.sse.retry_ms = 2_000;
    })
    .await;
    let addr = server.addr;
    let t = broker::thread_id("drain");
    sse_client::publish_ok(
        &broker::base(addr),
        &t,
        &[json!({"type":"RUN_STARTED","threadId":t,"runId":"r"})],
    )
    .await;
    server.shutdown.cancel();
    let request =
        format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 0-1\r\n\r\n");
    // The flag is set as soon as the drain starts; poll briefly for it.
    let mut full = String::new();
    for _ in 0..50 {
        // Read to the end: the answer is complete, the connection closed.
        full = exchange(addr, &request, "\u{0}").await;
        if full.contains("draining") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (head, body) = split_head(&full);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains("\r\ncontent-type: text/event-stream"),
        "{head}"
    );
    let retry: u64 = body
        .strip_prefix("retry: ")
        .and_then(|rest| rest.split_once("\n\n"))
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or_else(|| panic!("a retry first: {body:?}"));
    assert!((500..=3_000).contains(&retry), "{retry}");
    assert_eq!(
        body,
        format!("retry: {retry}\n\n: agui-fanout: node draining, reconnect\n\n"),
        "no id, no event"
    );
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

/// Reads (and drops) what `reader` holds until the peer closes or the read fails; panics with
/// `what` when that takes longer than `within`.
async fn read_until_closed(
    reader: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
    what: &str,
) {
    let mut buf = vec![0u8; 64 << 10];
    let closed = async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, closed).await.expect(what);
}

/// Starts a run on `t` and subscribes to it over a raw socket with a 4 KB receive buffer (so
/// the broker's writes fill it quickly), the request sent, nothing read yet.
async fn small_window_subscriber(addr: std::net::SocketAddr, base: &str, t: &str) -> TcpStream {
    small_window_subscriber_with(addr, base, t, "").await
}

/// [`small_window_subscriber`] with `extra` header lines (each ending in CRLF) in the request.
async fn small_window_subscriber_with(
    addr: std::net::SocketAddr,
    base: &str,
    t: &str,
    extra: &str,
) -> TcpStream {
    sse_client::publish_ok(
        base,
        t,
        &[json!({"type":"RUN_STARTED","threadId":t,"runId":"r1"})],
    )
    .await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    s.write_all(
        format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\n{extra}\r\n").as_bytes(),
    )
    .await
    .unwrap();
    s
}

/// A broker whose connection queues overflow quickly (8 events, 64 KiB) and whose
/// `sse.write_timeout` is 1 s.
async fn stalling_broker() -> agui_fanout::app::Server {
    broker::start(|c| {
        c.queue.max_events = 8;
        c.queue.max_bytes = 64 << 10;
        c.sse.write_timeout = Duration::from_secs(1);
    })
    .await
}

/// `agui_disconnects_total{cause="write_timeout"}`.
async fn write_timeouts(base: &str) -> f64 {
    sse_client::metric(
        base,
        "agui_disconnects_total",
        &[("cause", "write_timeout")],
    )
    .await
}

/// Publishes 200 events of 20 KB to `t`: far more than a stalled subscriber's socket buffers
/// and queue hold.
async fn publish_stalling_load(base: &str, t: &str) {
    let pad = "x".repeat(20_000);
    for seq in 0..200 {
        let ev = json!({"type":"CUSTOM","name":"stall","value":{"seq":seq,"pad":pad}});
        assert_eq!(sse_client::publish_one(base, t, &ev).await.status(), 200);
    }
}

/// Waits (at most 10 s) until the write-timeout counter is above `before`, then until the
/// broker has closed `s` (what was in flight is still readable first).
async fn await_write_timeout(base: &str, before: f64, s: &mut TcpStream) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while write_timeouts(base).await == before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not disconnected 10 s after it stopped reading"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    read_until_closed(
        s,
        Duration::from_secs(10),
        "the broker closed the connection",
    )
    .await;
}

/// A subscriber that stops reading: its queue is reset (every later event dropped until it
/// reads, `agui_resets_pending`) and, once its socket accepted nothing for `sse.write_timeout`,
/// the broker ends the connection (`agui_disconnects_total{cause="write_timeout"}`).
#[tokio::test]
async fn a_subscriber_that_stops_reading_is_reset_then_disconnected() {
    let server = stalling_broker().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("stalled");
    let before = write_timeouts(&base).await;
    let resets = || sse_client::metric(&base, "agui_resets_total", &[("cause", "overflow")]);
    let resets_before = resets().await;
    let mut s = small_window_subscriber(server.addr, &base, &t).await;
    let mut buf = vec![0u8; 64 << 10];
    let n = s.read(&mut buf).await.unwrap();
    assert!(n > 0);
    publish_stalling_load(&base, &t).await;
    // The counter, not the `agui_resets_pending` gauge: on a loaded machine publishing may
    // take longer than the write timeout, which ends the reset connection (gauge back to 0).
    assert!(
        resets().await > resets_before,
        "the stalled subscriber's queue is reset"
    );
    // The write timeout (1 s) ends the connection.
    await_write_timeout(&base, before, &mut s).await;
}

/// The same rule on hyper's path (a subscribe with two `Last-Event-ID` fields goes there):
/// once the socket accepted nothing for `sse.write_timeout`, the connection ends, counted as
/// `agui_disconnects_total{cause="write_timeout"}`.
#[tokio::test]
async fn a_stalled_subscriber_served_by_hyper_is_disconnected() {
    let server = stalling_broker().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("stalled-hyper");
    let before = write_timeouts(&base).await;
    let mut s = small_window_subscriber_with(
        server.addr,
        &base,
        &t,
        "Last-Event-ID: \r\nLast-Event-ID: \r\n",
    )
    .await;
    let mut buf = vec![0u8; 64 << 10];
    let n = s.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    assert!(
        head.contains("transfer-encoding: chunked"),
        "not hyper's path: {head}"
    );
    publish_stalling_load(&base, &t).await;
    await_write_timeout(&base, before, &mut s).await;
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

/// A slow reader with a small receive buffer makes the broker's writes to its socket partial,
/// on the fan-out's direct path as well as the writer's: every frame must still arrive whole
/// and in order (the rest of a partly written frame goes out before anything else).
#[tokio::test]
async fn partial_writes_keep_every_frame_whole_and_in_order() {
    const EVENTS: usize = 300;
    let server = broker::start(|c| {
        c.queue.max_bytes = 64 << 20;
        c.queue.max_events = 100_000;
    })
    .await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("partial");
    let mut s = small_window_subscriber(server.addr, &base, &t).await;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    while !String::from_utf8_lossy(&got).contains("retry: ") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    // 300 events of ~30 KB, one per POST (each fanned out alone: the direct path), while the
    // reader takes 1 KB every millisecond at first.
    let publisher = {
        let (base, t) = (base.clone(), t.clone());
        tokio::spawn(async move {
            let pad = "x".repeat(30_000);
            for seq in 0..EVENTS {
                let ev = json!({"type":"CUSTOM","name":"partial","value":{"seq":seq,"pad":pad}});
                let r = sse_client::publish_one(&base, &t, &ev).await;
                assert_eq!(r.status(), 200);
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut slow = 0usize;
    let last = format!("\"seq\":{}", EVENTS - 1);
    loop {
        // Only the tail: the last event is ~30 KB.
        let tail = String::from_utf8_lossy(&got[got.len().saturating_sub(64 << 10)..]);
        if tail.contains(&last) && tail.ends_with("\n\n") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all events within 60 s"
        );
        let n = if slow < 2_000 {
            // Slow at first: 1 KB per millisecond.
            slow += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
            1024
        } else {
            buf.len()
        };
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf[..n]))
            .await
            .expect("bytes within 10 s")
            .unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
    }
    publisher.await.unwrap();
    let text = String::from_utf8(got).expect("UTF-8");
    let (_, body) = split_head(&text);
    let mut next = 0u64;
    for frame in body.split_terminator("\n\n") {
        let frame = sse::parse_frame(frame)
            .unwrap_or_else(|e| panic!("{}", e.chars().take(160).collect::<String>()));
        let Some(data) = frame.data else {
            continue;
        };
        let v: Value = serde_json::from_str(&data).unwrap_or_else(|e| {
            panic!(
                "a frame arrived broken ({e}): {:?}",
                &data[..data.len().min(120)]
            )
        });
        if v["type"] == "CUSTOM" {
            assert_eq!(v["value"]["seq"], next, "in order, no gap, no duplicate");
            next += 1;
        }
    }
    assert_eq!(next, EVENTS as u64);
}

/// The drain's hard deadline (drain + 5 s) counts from SIGTERM: a connection that never sends
/// a request head (it would hold the front for 30 s) does not keep the node past it.
#[tokio::test]
async fn shutdown_deadline_counts_from_the_signal() {
    let server = broker::start(|c| c.shutdown.drain = Duration::from_secs(4)).await;
    let _silent = TcpStream::connect(server.addr).await.unwrap();
    let started = std::time::Instant::now();
    server.stop().await;
    let took = started.elapsed();
    // drain (4 s) + grace (5 s); counted from the end of the drain it was 13 s.
    assert!(took < Duration::from_secs(11), "stopped after {took:?}");
    assert!(
        took >= Duration::from_secs(4),
        "stopped before the drain ended: {took:?}"
    );
}

/// Asserts that `resp` (a whole answer) is `status` with the JSON error shape and `code`, a
/// `content-length` that matches its body and `connection: close`; returns the error object.
fn assert_json_error(resp: &str, status: u16, code: &str) -> Value {
    let (head, body) = split_head(resp);
    assert!(
        head.starts_with(&format!("http/1.1 {status} ")),
        "want {status}: {head}"
    );
    for h in [
        "content-type: application/json".to_string(),
        format!("content-length: {}", body.len()),
        "connection: close".to_string(),
    ] {
        assert!(head.contains(&format!("\r\n{h}")), "missing {h}: {head}");
    }
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    v["error"].clone()
}

/// Requests hyper would refuse before any handler runs (a malformed request line or header,
/// too many or too large header fields, a request target over hyper's limit, framing headers
/// it refuses) are answered with the JSON error shape, not hyper's empty body (issue 13: 446
/// of 1,158 fuzzed error answers had an empty body).
#[tokio::test]
async fn errors_below_the_router_are_json() {
    let server = broker::start_memory().await;
    let many: String = (0..101).map(|i| format!("X-{i}: 1\r\n")).collect();
    let cases = [
        ("BLAH\r\n\r\n".to_string(), 400, "bad_request", "method"),
        (
            "GET /healthz HTTP/1.1\r\nbad header\r\n\r\n".into(),
            400,
            "bad_request",
            "header",
        ),
        (
            "GET /healthz HTTP/9.9\r\n\r\n".into(),
            400,
            "bad_request",
            "version",
        ),
        (
            format!(
                "GET /healthz HTTP/1.1\r\nX-Big: {}\r\n\r\n",
                "a".repeat(200_000)
            ),
            431,
            "headers_too_large",
            "headers",
        ),
        (
            format!("GET /healthz HTTP/1.1\r\n{many}\r\n"),
            431,
            "headers_too_large",
            "headers",
        ),
        (
            format!("GET /healthz?{} HTTP/1.1\r\n\r\n", "q".repeat(70_000)),
            414,
            "uri_too_long",
            "request-target",
        ),
        (
            "POST /v1/threads/t/events HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
            400,
            "bad_request",
            "Transfer-Encoding",
        ),
        (
            "POST /v1/threads/t/events HTTP/1.1\r\nContent-Length: ten\r\n\r\n".into(),
            400,
            "bad_request",
            "Content-Length",
        ),
    ];
    for (request, status, code, field) in cases {
        let resp = exchange(server.addr, &request, "}}").await;
        let err = assert_json_error(&resp, status, code);
        assert_eq!(
            err["field"],
            field,
            "{}: {err}",
            &request[..request.len().min(60)]
        );
    }
}

/// A subscribe whose id is oversized (64 KiB in `?lastEventId=` or in `Last-Event-ID`) or
/// malformed gets the prelude path (200 and the comment), never a 4xx: a native
/// `EventSource` would not retry after one (PROTOCOL §4.3). The 64 KiB query id got hyper's
/// 414 before.
#[tokio::test]
async fn oversized_and_malformed_ids_get_the_prelude() {
    let server = broker::start_memory().await;
    let t = broker::thread_id("long-id");
    let long = "9".repeat(64 << 10);
    for request in [
        format!("GET /v1/threads/{t}/events?lastEventId={long} HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: {long}\r\n\r\n"),
        format!("GET /v1/threads/{t}/events?lastEventId=%ZZ%FF HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("GET /v1/threads/{t}/events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: \u{ff}-\r\n\r\n"),
    ] {
        let resp = exchange(server.addr, &request, "malformed Last-Event-ID").await;
        let (head, body) = split_head(&resp);
        assert!(
            head.starts_with("http/1.1 200"),
            "{}: {head}",
            &request[..80]
        );
        assert!(body.starts_with("retry: "), "{body:?}");
    }
}
