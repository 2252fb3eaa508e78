//! The connection front: every accepted TCP connection passes here first.
//!
//! A connection whose first request is an HTTP/1 subscribe (`GET
//! /v1/threads/{threadId}/events`, no body, head within [`PEEK_BYTES`]) is served here: the
//! head is parsed with `httparse` from a `peek` of the socket, the subscription is opened with
//! the same `subscribe::open` the router's handler uses, and the stream is written by
//! [`stream::write_socket`] straight to the socket, delimited by the connection's close
//! (RFC 9112 §6.3). Every other connection (publish, health, metrics, HTTP/2, a subscribe
//! with anything unusual in its head) is handed untouched — nothing was read from it — to
//! hyper and the axum router, which answer exactly as before.
//!
//! Why not hyper for the common subscribe: a subscriber connection lives for hours and mostly
//! idles. Through hyper it holds an 8 KiB read buffer, the dispatcher and the body stream's
//! state (measured: ~24 KiB of RSS per idle connection), and every event crosses the
//! dispatcher, the body adapter and a chunk encoder (~2.9 µs of user CPU per delivery). Served
//! here, it is a socket, the queue and a small task (see `loadtest/REPORT.md` for the figures).
//! Requests are still parsed by a library (`httparse`, hyper's own parser).

use super::subscribe::{self, Opened, SSE_HEADERS, SubscribeQuery};
use super::{AppState, cors};
use crate::stream;
use axum::Router;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_io_timeout::TimeoutStream;
use tokio_util::task::TaskTracker;

/// Most bytes of a first request head the front looks at; a longer head goes to hyper.
pub const PEEK_BYTES: usize = 4096;
/// Most header fields of a subscribe request served by the front (more: hyper's path).
const MAX_HEADERS: usize = 32;
/// Time a new connection has to send the first bytes of its request head (and hyper's
/// header read timeout), so connections that say nothing do not stay open forever.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The HTTP/2 connection preface (RFC 9113 §3.4): a connection that starts with part of it is
/// held here until all of it came (hyper's protocol detection then takes it; it has no timeout
/// of its own).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Pause after a failed `accept` (typically EMFILE: out of file descriptors) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts connections until `stop_accepting` completes, then waits for the open connections
/// to finish (hyper's are asked to shut down gracefully; streams end when the drain closes
/// their queues) or for `deadline`, whichever comes first.
pub async fn serve<S, D>(
    listener: TcpListener,
    state: AppState,
    router: Router,
    stop_accepting: S,
    deadline: D,
) where
    S: Future<Output = ()>,
    D: Future<Output = ()>,
{
    let graceful = GracefulShutdown::new();
    let tracker = TaskTracker::new();
    tokio::pin!(stop_accepting);
    loop {
        let stream = tokio::select! {
            biased;
            _ = &mut stop_accepting => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        tracker.spawn(handle(
            stream,
            state.clone(),
            router.clone(),
            graceful.watcher(),
        ));
    }
    drop(listener);
    tracker.close();
    tokio::select! {
        _ = async {
            graceful.shutdown().await;
            tracker.wait().await;
        } => {}
        _ = deadline => tracing::warn!("drain deadline passed; closing remaining connections"),
    }
}

/// One connection: served here when its first request is a plain subscribe, else by hyper.
async fn handle(stream: TcpStream, state: AppState, router: Router, watcher: Watcher) {
    // Frames are written whole; Nagle's algorithm would only delay the next one.
    let _ = stream.set_nodelay(true);
    match route(&stream, HEAD_TIMEOUT).await {
        Route::Subscribe(req) => serve_subscribe(stream, req, state).await,
        // Boxed: a task is as large as its largest state, and hyper's connection future would
        // otherwise make every idle subscriber's task as large as a publisher's.
        Route::Hyper => {
            let sse = &state.config.sse;
            let (write_timeout, send_buffer) = (sse.write_timeout, sse.send_buffer);
            Box::pin(serve_hyper(
                stream,
                router,
                watcher,
                write_timeout,
                send_buffer,
            ))
            .await
        }
        Route::Gone => {}
    }
}

/// Where a connection goes.
#[derive(Debug, PartialEq)]
enum Route {
    /// A subscribe request the front serves itself.
    Subscribe(SubscribeRequest),
    /// Anything else: hyper and the router.
    Hyper,
    /// The client closed, failed, or sent nothing within [`HEAD_TIMEOUT`].
    Gone,
}

/// The parts of a subscribe request the front needs.
#[derive(Debug, PartialEq)]
struct SubscribeRequest {
    /// Length of the request head in bytes (consumed from the socket before answering).
    head_len: usize,
    /// The `{threadId}` path segment, percent-decoded.
    thread: String,
    /// The raw `Last-Event-ID` header.
    last_event_id: Option<Vec<u8>>,
    /// The raw `Authorization`, `Cookie` and `Origin` headers (PROTOCOL §8).
    authorization: Option<Vec<u8>>,
    cookie: Option<Vec<u8>>,
    origin: Option<Vec<u8>>,
    /// The query string.
    query: SubscribeQuery,
}

/// Peeks at the first bytes of the connection (without consuming them, so hyper can still be
/// given the connection as it was) and decides where it goes. A connection that sends nothing
/// within `patience`, or only part of the HTTP/2 preface, is [`Route::Gone`].
async fn route(stream: &TcpStream, patience: Duration) -> Route {
    let deadline = tokio::time::Instant::now() + patience;
    let mut buf = vec![0u8; PEEK_BYTES];
    // `peek` returns at once while anything is buffered: wait for more with a short pause.
    let mut pause = Duration::from_millis(5);
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Route::Gone,
            Ok(Ok(n)) => n,
        };
        let bytes = &buf[..n];
        if n >= H2_PREFACE.len() || !H2_PREFACE.starts_with(bytes) {
            return parse_subscribe(bytes).map_or(Route::Hyper, Route::Subscribe);
        }
        if tokio::time::Instant::now() + pause >= deadline {
            return Route::Gone;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// Parses `bytes` as the head of a subscribe request the front can serve: `GET`, the
/// subscribe path with one non-empty segment (percent-decoded as axum's `Path` does), a query
/// that parses (as axum's `Query` does), no request body, no upgrade, at most one each of
/// `Last-Event-ID`, `Authorization`, `Cookie` and `Origin`. `None` for anything else,
/// including an incomplete head: hyper's path answers those (with its own errors for
/// malformed requests).
fn parse_subscribe(bytes: &[u8]) -> Option<SubscribeRequest> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head_len) = req.parse(bytes).ok()? else {
        return None;
    };
    if req.method? != "GET" {
        return None;
    }
    let target = req.path?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let segment = path.strip_prefix("/v1/threads/")?.strip_suffix("/events")?;
    if segment.is_empty() || segment.contains('/') {
        return None;
    }
    let thread = percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()?
        .into_owned();
    let query: SubscribeQuery = serde_urlencoded::from_str(query).ok()?;
    let (mut last_event_id, mut authorization, mut cookie, mut origin) = (None, None, None, None);
    for h in req.headers.iter() {
        let name = h.name;
        let has_body = (name.eq_ignore_ascii_case("content-length") && h.value != b"0")
            || name.eq_ignore_ascii_case("transfer-encoding");
        if has_body || name.eq_ignore_ascii_case("upgrade") {
            return None;
        }
        let slot = if name.eq_ignore_ascii_case("last-event-id") {
            &mut last_event_id
        } else if name.eq_ignore_ascii_case("authorization") {
            &mut authorization
        } else if name.eq_ignore_ascii_case("cookie") {
            &mut cookie
        } else if name.eq_ignore_ascii_case("origin") {
            &mut origin
        } else {
            continue;
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(h.value.to_vec());
    }
    Some(SubscribeRequest {
        head_len,
        thread,
        last_event_id,
        authorization,
        cookie,
        origin,
        query,
    })
}

/// Serves a subscribe request on the raw socket (see the module docs).
async fn serve_subscribe(stream: TcpStream, req: SubscribeRequest, state: AppState) {
    // Boxed: a task is as large as its largest state. Reading the head, checking the token and
    // opening (the hub, the log) are done before the stream starts, so their state must not
    // stay part of the task for the stream's lifetime (idle memory per subscriber).
    let Some((stream, head, opened)) = Box::pin(start_subscribe(stream, req, state)).await else {
        return;
    };
    // `start_subscribe` answers `Unavailable` itself: only a stream comes back.
    let Opened::Stream {
        queue,
        prefix,
        guard,
        settings,
    } = opened
    else {
        return;
    };
    stream::write_socket(stream, head, queue, prefix, settings, guard).await
}

/// Everything of a front-served subscribe before its stream: consumes the head `route` only
/// peeked at, checks the token (PROTOCOL §8), opens the subscription. Answers by itself what is
/// not a stream (an error, the backend being down) and returns `None` then; else the socket,
/// the response head (with the CORS headers) and the opened stream.
async fn start_subscribe(
    mut stream: TcpStream,
    req: SubscribeRequest,
    state: AppState,
) -> Option<(TcpStream, Bytes, Opened)> {
    let mut head = vec![0u8; req.head_len];
    if stream.read_exact(&mut head).await.is_err() {
        return None;
    }
    drop(head);
    set_send_buffer(&stream, state.config.sse.send_buffer);
    let cors = cors::stream_headers(state.cors.as_deref(), req.origin.as_deref()).await;
    let checked = subscribe::authorize_front(
        &state,
        &req.thread,
        req.authorization.as_deref(),
        req.cookie.as_deref(),
        &req.query,
    );
    let expires = match checked {
        Ok(expires) => expires,
        Err(e) => {
            write_response(stream, e.into_response(), &cors).await;
            return None;
        }
    };
    let opened = subscribe::open(
        &state,
        &req.thread,
        req.last_event_id.as_deref(),
        req.query,
        expires,
    )
    .await;
    match opened {
        Ok(opened @ Opened::Stream { .. }) => Some((stream, sse_head(&cors), opened)),
        Ok(Opened::Unavailable(body)) => {
            let mut out = sse_head(&cors).to_vec();
            out.extend_from_slice(&body);
            let _ = stream.write_all(&out).await;
            let _ = stream.shutdown().await;
            None
        }
        Err(e) => {
            write_response(stream, e.into_response(), &cors).await;
            None
        }
    }
}

/// The response head of an event stream served by the front: `200`, the SSE headers, the
/// CORS headers `cors` (see `cors::stream_headers`), `connection: close` (the body ends with
/// the connection) and `date` (RFC 9110 §6.6.1).
fn sse_head(cors: &HeaderMap) -> Bytes {
    let mut head = String::with_capacity(192);
    head.push_str("HTTP/1.1 200 OK\r\n");
    for (name, value) in SSE_HEADERS {
        push_header(&mut head, name, value);
    }
    push_headers(&mut head, cors);
    end_head(&mut head);
    Bytes::from(head)
}

/// Ends a response head of the front: `connection: close` (the connection ends with the
/// response), `date` (RFC 9110 §6.6.1) and the blank line.
fn end_head(head: &mut String) {
    push_header(head, "connection", "close");
    push_header(head, "date", &httpdate::fmt_http_date(SystemTime::now()));
    head.push_str("\r\n");
}

/// Every header of `headers` whose value is visible ASCII.
fn push_headers(head: &mut String, headers: &HeaderMap) {
    for (name, value) in headers {
        if let Ok(value) = value.to_str() {
            push_header(head, name.as_str(), value);
        }
    }
}

fn push_header(head: &mut String, name: &str, value: &str) {
    head.push_str(name);
    head.push_str(": ");
    head.push_str(value);
    head.push_str("\r\n");
}

/// Writes a complete (small: an error's JSON) response with the CORS headers `cors` and
/// closes the connection.
async fn write_response(mut stream: TcpStream, resp: Response, cors: &HeaderMap) {
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        parts.status.as_u16(),
        parts.status.canonical_reason().unwrap_or("")
    );
    // Header values an error response carries are visible ASCII (JSON type, numbers).
    push_headers(&mut head, &parts.headers);
    push_headers(&mut head, cors);
    push_header(&mut head, "content-length", &body.len().to_string());
    end_head(&mut head);
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
}

/// Serves a connection with hyper (HTTP/1 with keep-alive, or HTTP/2) and the router.
///
/// A write to the socket that makes no progress for `write_timeout` (`sse.write_timeout`)
/// fails with `TimedOut` and ends the connection, counted as
/// `agui_disconnects_total{cause="write_timeout"}`. Why: a subscriber served here (HTTP/2, an
/// unusual head) that stops reading would otherwise hold its connection and task forever once
/// the socket buffers are full (its queue is bounded either way); the front applies the same
/// rule to its own subscribers. Only writes are timed: an idle keep-alive connection or a
/// producer's slow request body is not a stalled write. The socket gets the subscribers'
/// `SO_SNDBUF` (`send_buffer`, 0: the kernel's) as on the front: under the kernel's
/// autotuning (up to 4 MiB) a socket becomes writable again only once about a third of it has
/// drained, so a client that reads slowly but steadily would see no write progress for
/// longer than the timeout and be cut.
async fn serve_hyper(
    stream: TcpStream,
    router: Router,
    watcher: Watcher,
    write_timeout: Duration,
    send_buffer: usize,
) {
    set_send_buffer(&stream, send_buffer);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT);
    let service = TowerToHyperService::new(router);
    let mut io = TimeoutStream::new(stream);
    io.set_write_timeout(Some(write_timeout));
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(Box::pin(io)), service);
    if let Err(e) = watcher.watch(conn).await {
        if write_timed_out(&*e) {
            metrics::counter!(crate::metrics::DISCONNECTS, "cause" => "write_timeout").increment(1);
        }
        tracing::trace!(error = %e, "connection ended with an error");
    }
}

/// Sets `SO_SNDBUF` to `size` bytes (`0`: leaves the kernel's autotuning). Bounds what a
/// client that stops reading costs in kernel memory and copying (see
/// `SseConfig::send_buffer`); the queue's own bounds and reset take over from there.
fn set_send_buffer(stream: &TcpStream, size: usize) {
    if size > 0 {
        let _ = socket2::SockRef::from(stream).set_send_buffer_size(size);
    }
}

/// Whether `e` comes from the socket's write timeout: an `io::Error` of kind `TimedOut`
/// somewhere in its source chain (hyper wraps it; its own header read timeout is not an
/// `io::Error`, and the connection's reads are not timed).
fn write_timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return true;
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Option<SubscribeRequest> {
        parse_subscribe(head.as_bytes())
    }

    /// A connected pair: the client's end and the server's.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (client, server)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_http2_preface_is_closed_by_the_head_timeout() {
        let patience = Duration::from_millis(300);
        let (mut client, server) = pair().await;
        client.write_all(&H2_PREFACE[..16]).await.expect("write");
        let started = tokio::time::Instant::now();
        assert_eq!(route(&server, patience).await, Route::Gone);
        assert!(started.elapsed() >= patience / 2, "waited for the rest");
        // The whole preface (sent in two parts) goes to hyper.
        let (mut client, server) = pair().await;
        client.write_all(&H2_PREFACE[..10]).await.expect("write");
        let rest = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            client.write_all(&H2_PREFACE[10..]).await.expect("write");
            client
        });
        assert_eq!(route(&server, patience).await, Route::Hyper);
        drop(rest.await);
        // Nothing at all within the patience.
        let (_client, server) = pair().await;
        assert_eq!(route(&server, patience).await, Route::Gone);
    }

    #[test]
    fn plain_subscribe_is_taken() {
        let r = parse(
            "GET /v1/threads/t%2D1/events?from=start HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 0-5\r\nAccept: text/event-stream\r\n\r\n",
        )
        .expect("taken");
        assert_eq!(r.thread, "t-1");
        assert_eq!(r.last_event_id.as_deref(), Some(&b"0-5"[..]));
        assert_eq!(r.query.from.as_deref(), Some("start"));
        assert_eq!(r.query.last_event_id, None);
        assert_eq!(
            r.head_len,
            "GET /v1/threads/t%2D1/events?from=start HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 0-5\r\nAccept: text/event-stream\r\n\r\n".len()
        );
    }

    #[test]
    fn anything_unusual_goes_to_hyper() {
        for head in [
            // incomplete head
            "GET /v1/threads/t/events HTTP/1.1\r\nHost: x\r\n",
            // other methods and paths
            "POST /v1/threads/t/events HTTP/1.1\r\n\r\n",
            "HEAD /v1/threads/t/events HTTP/1.1\r\n\r\n",
            "GET /v1/threads/t/snapshot HTTP/1.1\r\n\r\n",
            "GET /v1/threads//events HTTP/1.1\r\n\r\n",
            "GET /v1/threads/a/b/events HTTP/1.1\r\n\r\n",
            "GET /healthz HTTP/1.1\r\n\r\n",
            // a body, an upgrade, a repeated Last-Event-ID
            "GET /v1/threads/t/events HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "GET /v1/threads/t/events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET /v1/threads/t/events HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
            "GET /v1/threads/t/events HTTP/1.1\r\nLast-Event-ID: 1\r\nLast-Event-ID: 2\r\n\r\n",
            // a query axum's `Query` refuses (duplicate key), a non-UTF-8 segment
            "GET /v1/threads/t/events?from=start&from=x HTTP/1.1\r\n\r\n",
            "GET /v1/threads/%FF/events HTTP/1.1\r\n\r\n",
            // HTTP/2 prior knowledge
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "not http at all\r\n\r\n",
        ] {
            assert_eq!(parse(head), None, "{head:?}");
        }
    }
}
