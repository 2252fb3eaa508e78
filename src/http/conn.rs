//! The connection front: every accepted TCP connection passes here first.
//!
//! The front reads the first request head of every HTTP/1 connection itself (up to
//! `limits.max_head_bytes`) and parses it with `httparse`. A head that hyper would refuse
//! with an empty answer (a malformed request line or header, too many or too large header
//! fields, a request target over hyper's limit) is answered here with the JSON error shape
//! (`http::head`). A subscribe (`GET /v1/threads/{threadId}/events`, no body) is served here:
//! the subscription is opened with the same `subscribe::open` the router's handler uses, and
//! the stream is written by [`stream::write_socket`] straight to the socket, delimited by the
//! connection's close (RFC 9112 §6.3). A plain publish is served here too, with the requests
//! after it on the kept-alive connection (`publish_front`). Every other connection (health,
//! metrics, HTTP/2, a request with anything unusual in its head) is handed to hyper and the
//! axum router, with the bytes read so far put back in front of the socket ([`head::Rewind`]).
//!
//! Why not hyper for the common subscribe: a subscriber connection lives for hours and mostly
//! idles. Through hyper it holds an 8 KiB read buffer, the dispatcher and the body stream's
//! state (measured: ~24 KiB of RSS per idle connection), and every event crosses the
//! dispatcher, the body adapter and a chunk encoder (~2.9 µs of user CPU per delivery). Served
//! here, it is a socket, the queue and a small task (see `loadtest/REPORT.md` for the figures).
//! Requests are still parsed by a library (`httparse`, hyper's own parser).

use super::head::{self, Parsed, Rewind};
use super::publish_front::{self, Next, Plain, PlainRules};
use super::subscribe::{self, Opened, SSE_HEADERS, SubscribeQuery};
use super::{ApiError, AppState, cors};
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
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_io_timeout::TimeoutStream;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Size of the first read of a connection: most request heads fit (the buffer grows, up to
/// `limits.max_head_bytes`, for those that do not).
pub const FIRST_READ: usize = 4096;
/// After answering a refused head, how long the front keeps reading (and dropping) what the
/// client still sends before closing, and how much: closing with unread bytes would reset the
/// connection, and the client could lose the answer (RFC 9112 §9.6).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;
/// Time a new connection has to send its first request head (and hyper's header read timeout
/// for later heads), so connections that say nothing do not stay open forever.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The HTTP/2 connection preface (RFC 9113 §3.4): a connection that starts with part of it is
/// read here until all of it came (hyper's protocol detection then takes it; it has no timeout
/// of its own).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Pause after a failed `accept` (typically EMFILE: out of file descriptors) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts connections until `stop_accepting` completes (then takes those still queued, see
/// `accept::take_queued`, and closes the listener), then waits for the open connections
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
    let serve_one = |stream, peer| {
        tracker.spawn(handle(
            stream,
            peer,
            state.clone(),
            router.clone(),
            graceful.watcher(),
            tracker.clone(),
        ));
    };
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = &mut stop_accepting => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        serve_one(stream, peer);
    }
    // Connections the kernel completed meanwhile would be reset by the listener's close:
    // answered instead, as the drain answers.
    for (stream, peer) in super::accept::take_queued(listener) {
        serve_one(stream, peer);
    }
    tracker.close();
    tokio::select! {
        _ = async {
            graceful.shutdown().await;
            tracker.wait().await;
        } => {}
        _ = deadline => tracing::warn!("drain deadline passed; closing remaining connections"),
    }
}

/// One connection: served here when its first request is a plain subscribe (its stream then
/// goes on in a task of its own on `tracker`), refused here when its first head is not one
/// hyper would take, else served by hyper.
async fn handle(
    mut stream: TcpStream,
    peer: SocketAddr,
    state: AppState,
    router: Router,
    watcher: Watcher,
    tracker: TaskTracker,
) {
    // Frames are written whole; Nagle's algorithm would only delay the next one.
    let _ = stream.set_nodelay(true);
    super::liveness::set_liveness(&stream, state.config.sse.write_timeout);
    let max_head = state.config.limits.max_head_bytes;
    let rules = PlainRules {
        max_body: state.config.limits.max_body_bytes,
        cors: state.cors.is_some(),
    };
    let route = match route(&mut stream, HEAD_TIMEOUT, max_head, Some(rules)).await {
        // Boxed, as the paths below: a task is as large as its largest state. What the front
        // does not serve of the connection goes on as a first head would.
        Route::Publish(first, read) => {
            match Box::pin(publish_front::serve(
                &mut stream,
                read,
                first,
                &state,
                rules,
            ))
            .await
            {
                Next::Hyper(read) => Route::Hyper(read),
                Next::Refuse(e) => Route::Refuse(e),
                Next::Close(out) => return Box::pin(close_after(stream, &out)).await,
                Next::Done => Route::Gone,
            }
        }
        other => other,
    };
    match route {
        // The stream gets a task of its own: a task is as large as the largest state of its
        // future, and what an idle subscriber holds for hours is then only the stream's
        // (`stream::write_socket`), not this function's arguments and its other paths (idle
        // RSS per connection: loadtest/REPORT.md, session 11).
        Route::Subscribe(req) => {
            // Boxed: opening (the token, the hub, the log) would make every connection's task,
            // a keep-alive publisher's included, as large as its state.
            if let Some(stream) = Box::pin(start_subscribe(stream, peer, req, state)).await {
                tracker.spawn(stream);
            }
        }
        // Boxed: hyper's connection future would otherwise make every idle subscriber's task
        // as large as a publisher's.
        Route::Hyper(read) => {
            Box::pin(serve_hyper(
                stream,
                peer,
                read,
                router,
                watcher,
                HyperSettings::of(&state),
            ))
            .await
        }
        // Boxed too: its linger buffer (8 KiB, held across reads) made every connection's task,
        // idle subscribers' included, 8 KiB larger (idle RSS per connection 3.4 -> 12.3 KB,
        // loadtest/REPORT.md session 10).
        Route::Refuse(e) => Box::pin(refuse(stream, e)).await,
        // (A publish was served above.)
        Route::Publish(..) | Route::Gone => {}
    }
}

/// Where a connection goes.
#[derive(Debug)]
enum Route {
    /// A subscribe request the front serves itself (its head consumed).
    Subscribe(SubscribeRequest),
    /// A plain publish the front serves itself (`publish_front`), with the bytes read so far
    /// (its head first).
    Publish(Plain, Vec<u8>),
    /// Anything else: hyper and the router, given the bytes read so far first.
    Hyper(Bytes),
    /// A first head hyper would refuse (malformed, too large): answered with this error.
    Refuse(ApiError),
    /// The client closed, failed, or sent no whole head within [`HEAD_TIMEOUT`].
    Gone,
}

/// The parts of a subscribe request the front needs.
#[derive(Debug, PartialEq)]
struct SubscribeRequest {
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

/// Reads the connection's first request head (at most `max_head` bytes, within `patience`)
/// and decides where the connection goes; plain publishes are served here under `rules`
/// (`None`: they go to hyper). An HTTP/2 preface goes to hyper as soon as it is whole; a
/// connection that sends nothing, or no whole head, within `patience` is [`Route::Gone`].
async fn route(
    stream: &mut TcpStream,
    patience: Duration,
    max_head: usize,
    rules: Option<PlainRules>,
) -> Route {
    let deadline = tokio::time::Instant::now() + patience;
    let mut buf: Vec<u8> = Vec::with_capacity(FIRST_READ.min(max_head));
    loop {
        if buf.len() == buf.capacity() {
            if buf.len() >= max_head {
                return Route::Refuse(head::too_large(format!(
                    "the request head is larger than {max_head} bytes (limits.max_head_bytes)"
                )));
            }
            // Doubling, capped: the buffer never holds more than `max_head` bytes.
            buf.reserve_exact(buf.len().min(max_head - buf.len()));
        }
        match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Route::Gone,
            Ok(Ok(_)) => {}
        }
        if buf.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&buf) {
            continue;
        }
        if buf.starts_with(H2_PREFACE) {
            return Route::Hyper(Bytes::from(buf));
        }
        let mut headers = [httparse::EMPTY_HEADER; head::MAX_HEADERS];
        match head::parse(&buf, &mut headers) {
            Ok(Parsed::Partial) => continue,
            Err(e) => return Route::Refuse(e),
            Ok(Parsed::Complete { req, len }) => {
                if let Some(sub) = parse_subscribe(&req) {
                    return Route::Subscribe(sub);
                }
                if let Err(e) = head::check(&req) {
                    return Route::Refuse(e);
                }
                if let Some(p) =
                    rules.and_then(|rules| publish_front::plain(&req, &buf, len, rules))
                {
                    return Route::Publish(p, buf);
                }
            }
        }
        return Route::Hyper(Bytes::from(buf));
    }
}

/// The subscribe request `req` is, if the front can serve it: `GET`, the subscribe path with
/// one non-empty segment (percent-decoded as axum's `Path` does), a query that parses (as
/// axum's `Query` does), no request body, no upgrade, at most one each of `Last-Event-ID`,
/// `Authorization`, `Cookie` and `Origin`. `None` for anything else: hyper's path answers
/// those. The target's length is not limited here beyond `limits.max_head_bytes`: a long id
/// is the prelude's case (PROTOCOL §4.3), never a 414.
fn parse_subscribe(req: &httparse::Request<'_, '_>) -> Option<SubscribeRequest> {
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
        thread,
        last_event_id,
        authorization,
        cookie,
        origin,
        query,
    })
}

/// Everything of a front-served subscribe before its stream (its head was read by `route`):
/// checks the token (PROTOCOL §8), opens the subscription. Answers by itself what is not a
/// stream (an error, the backend being down) and returns `None` then; else the stream to run
/// ([`stream::write_socket`]: the response head with the CORS headers, then the events).
async fn start_subscribe(
    mut stream: TcpStream,
    peer: SocketAddr,
    req: SubscribeRequest,
    state: AppState,
) -> Option<impl Future<Output = ()> + Send + 'static> {
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
        Some(peer),
    )
    .await;
    match opened {
        Ok(Opened::Stream {
            queue,
            prefix,
            guard,
            settings,
        }) => Some(stream::write_socket(
            stream,
            sse_head(&cors),
            queue,
            prefix,
            settings,
            guard,
        )),
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
    end_head(&mut head, true);
    Bytes::from(head)
}

/// Ends a response head of the front: `connection: close` when the connection ends with the
/// response, `date` (RFC 9110 §6.6.1) and the blank line.
fn end_head(head: &mut String, close: bool) {
    if close {
        push_header(head, "connection", "close");
    }
    head.push_str("date: ");
    date(|d| head.push_str(d));
    head.push_str("\r\n\r\n");
}

/// Calls `f` with the current time as an HTTP date (RFC 9110 §5.6.7), formatted at most once
/// per second per worker thread (as hyper caches it).
pub(super) fn date<R>(f: impl FnOnce(&str) -> R) -> R {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            *cached = (secs, httpdate::fmt_http_date(now));
        }
        f(&cached.1)
    })
}

/// Every header of `headers` whose value is visible ASCII.
pub(super) fn push_headers(head: &mut String, headers: &HeaderMap) {
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
    let out = encode_response(resp, cors, true).await;
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
}

/// A complete (small: an error's JSON) response as bytes, with the CORS headers `cors`,
/// `content-length`, `date`, and `connection: close` when the connection ends with it.
pub(super) async fn encode_response(resp: Response, cors: &HeaderMap, close: bool) -> Vec<u8> {
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
    end_head(&mut head, close);
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Answers a refused head with its JSON error (no CORS headers: the head could not be read),
/// then closes the connection ([`close_after`]).
async fn refuse(stream: TcpStream, e: ApiError) {
    tracing::debug!(error = %e, "request head refused");
    let out = encode_response(e.into_response(), &HeaderMap::new(), true).await;
    close_after(stream, &out).await;
}

/// Writes the last answer `out` and closes the connection without resetting it: what the
/// client still sends is read and dropped for a moment (at most [`LINGER`] and
/// [`LINGER_BYTES`]), so that the answer is not lost to a reset (RFC 9112 §9.6).
async fn close_after(mut stream: TcpStream, out: &[u8]) {
    if stream.write_all(out).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(LINGER, async {
        let mut sink = [0u8; 8192];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Settings of a connection served by hyper (see [`serve_hyper`]).
struct HyperSettings {
    /// `sse.write_timeout`.
    write_timeout: Duration,
    /// `sse.send_buffer`.
    send_buffer: usize,
    /// `limits.max_head_bytes`: hyper's read buffer limit, so a later head on a kept-alive
    /// connection has the same bound as the first (hyper's minimum is 8 KiB).
    max_head: usize,
    /// The node was draining when the connection reached hyper.
    draining: bool,
}

/// Serves a connection with hyper (HTTP/1 with keep-alive, or HTTP/2) and the router; `read`
/// is what the front already read of it (hyper reads it first). Every request carries the
/// peer's address as axum's `ConnectInfo` extension (the admin API lists it, PROTOCOL §12).
///
/// A write to the socket that makes no progress for `write_timeout` (`sse.write_timeout`)
/// fails with `TimedOut` and ends the connection, counted as
/// `agui_disconnects_total{cause="write_timeout"}`. Why: a subscriber served here (HTTP/2, an
/// unusual head) that stops reading would otherwise hold its connection and task forever once
/// the socket buffers are full (its queue is bounded either way); the front applies the same
/// rule to its own subscribers. Only writes are timed here: an idle keep-alive connection is
/// not a stalled write, and a producer's request body has its own time limit
/// (`limits.body_timeout`). The socket gets the subscribers' `SO_SNDBUF` (`send_buffer`, 0:
/// the kernel's) as on the front: under the kernel's autotuning (up to 4 MiB) a socket
/// becomes writable again only once about a third of it has drained, so a client that reads
/// slowly but steadily would see no write progress for longer than the timeout and be cut.
async fn serve_hyper(
    stream: TcpStream,
    peer: SocketAddr,
    read: Bytes,
    router: Router,
    watcher: Watcher,
    settings: HyperSettings,
) {
    set_send_buffer(&stream, settings.send_buffer);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(settings.max_head.max(MIN_HYPER_BUFFER));
    let service = TowerToHyperService::new(router.map_request(
        move |mut req: axum::http::Request<hyper::body::Incoming>| {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            req
        },
    ));
    let mut io = TimeoutStream::new(stream);
    io.set_write_timeout(Some(settings.write_timeout));
    let io = Rewind::new(read, Box::pin(io));
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    // A connection that reaches hyper while the node drains is served outside the graceful
    // shutdown, which closes a connection that has not read its first request yet at once,
    // with no answer (HTTP/2's `GOAWAY` included), and when the drain ends that is every
    // connection just accepted. HTTP/1 closes after its answer (`Connection: close`, the
    // draining layer); HTTP/2 goes on until the client is done or the drain's deadline.
    let served = if settings.draining {
        conn.await
    } else {
        watcher.watch(conn).await
    };
    if let Err(e) = served {
        if write_timed_out(&*e) {
            metrics::counter!(crate::metrics::DISCONNECTS, "cause" => "write_timeout").increment(1);
        }
        tracing::trace!(error = %e, "connection ended with an error");
    }
}

impl HyperSettings {
    /// The settings `state`'s configuration gives.
    fn of(state: &AppState) -> Self {
        HyperSettings {
            write_timeout: state.config.sse.write_timeout,
            send_buffer: state.config.sse.send_buffer,
            max_head: state.config.limits.max_head_bytes,
            draining: state.draining.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// hyper's smallest read buffer limit (it panics below it).
const MIN_HYPER_BUFFER: usize = 8192;

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
        let mut headers = [httparse::EMPTY_HEADER; head::MAX_HEADERS];
        match head::parse(head.as_bytes(), &mut headers) {
            Ok(Parsed::Complete { req, .. }) => parse_subscribe(&req),
            _ => None,
        }
    }

    /// The status of a refusal.
    fn refused(route: &Route) -> Option<u16> {
        match route {
            Route::Refuse(e) => Some(e.status().as_u16()),
            _ => None,
        }
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

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, B, C, D, E, G, Fut>(_: fn(A, B, C, D, E, G) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// A connection's task lives as long as the connection unless it is a front-served
    /// subscribe (whose stream moves to a task of its own, `stream::write_socket`), and is as
    /// large as the largest state of [`handle`]: hyper's path and the refusal (its 8 KiB linger
    /// buffer) are boxed, so a keep-alive publisher's task holds neither inline.
    #[test]
    fn a_connection_task_stays_small() {
        let size = future_size(handle as fn(_, _, _, _, _, _) -> _);
        assert!(size <= 1024, "handle's future is {size} bytes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_http2_preface_is_closed_by_the_head_timeout() {
        let patience = Duration::from_millis(300);
        let (mut client, mut server) = pair().await;
        client.write_all(&H2_PREFACE[..16]).await.expect("write");
        let started = tokio::time::Instant::now();
        assert!(matches!(
            route(&mut server, patience, 1 << 16, None).await,
            Route::Gone
        ));
        assert!(started.elapsed() >= patience / 2, "waited for the rest");
        // The whole preface (sent in two parts) goes to hyper, with the bytes read.
        let (mut client, mut server) = pair().await;
        client.write_all(&H2_PREFACE[..10]).await.expect("write");
        let rest = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            client.write_all(&H2_PREFACE[10..]).await.expect("write");
            client
        });
        match route(&mut server, patience, 1 << 16, None).await {
            Route::Hyper(read) => assert_eq!(&read[..], H2_PREFACE),
            other => panic!("{other:?}"),
        }
        drop(rest.await);
        // Nothing at all within the patience.
        let (_client, mut server) = pair().await;
        assert!(matches!(
            route(&mut server, patience, 1 << 16, None).await,
            Route::Gone
        ));
    }

    #[tokio::test]
    async fn heads_are_read_whole_up_to_the_limit() {
        let max = 96 << 10;
        // A subscribe whose head is far larger than the first read (a 64 KiB id) is taken.
        let id = "x".repeat(64 << 10);
        let (mut client, mut server) = pair().await;
        let head = format!("GET /v1/threads/t/events?lastEventId={id} HTTP/1.1\r\nHost: x\r\n\r\n");
        let writer = tokio::spawn(async move {
            client.write_all(head.as_bytes()).await.expect("write");
            client
        });
        match route(&mut server, HEAD_TIMEOUT, max, None).await {
            Route::Subscribe(r) => assert_eq!(r.query.last_event_id.as_deref(), Some(&id[..])),
            other => panic!("{other:?}"),
        }
        drop(writer.await);
        // A head over the limit, or a malformed one, is refused.
        let (mut client, mut server) = pair().await;
        let head = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(max));
        let writer = tokio::spawn(async move {
            let _ = client.write_all(head.as_bytes()).await;
            client
        });
        assert_eq!(
            refused(&route(&mut server, HEAD_TIMEOUT, max, None).await),
            Some(431)
        );
        drop(server);
        drop(writer.await);
        let (mut client, mut server) = pair().await;
        client.write_all(b"BLAH\r\n\r\n").await.expect("write");
        assert_eq!(
            refused(&route(&mut server, HEAD_TIMEOUT, max, None).await),
            Some(400)
        );
        // A publish goes to hyper with everything read so far (head and body).
        let (mut client, mut server) = pair().await;
        let publish = "POST /v1/threads/t/events HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        client.write_all(publish.as_bytes()).await.expect("write");
        match route(&mut server, HEAD_TIMEOUT, max, None).await {
            Route::Hyper(read) => assert_eq!(&read[..], publish.as_bytes()),
            other => panic!("{other:?}"),
        }
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
