//! Publishes the connection front serves itself: plain HTTP/1.1
//! `POST /v1/threads/{threadId}/events` requests with a JSON or NDJSON body of declared length,
//! one after another on a kept-alive connection (RFC 9112 §9.3). The first request that is not
//! one (another route, a chunked or SSE body, `Expect`, HTTP/1.0, a browser's CORS request...)
//! hands the connection, with the bytes read so far, to hyper and the router.
//!
//! Why: producers publish token by token, a small request each. Through hyper and the router,
//! ~60 % of a publish's user CPU went to the HTTP layers around it (the dispatcher, a
//! `HeaderMap` per request, routing, extractors, response encoding; `perf` in session 13 of
//! `loadtest/REPORT.md`). The checks, the append and the answers are the router's own
//! (`publish::check_head`, `publish::append_body`, `ApiError`'s JSON), and requests are still
//! parsed by a library (`httparse`).

use super::body::HeldBody;
use super::conn::{FIRST_READ, HEAD_TIMEOUT, date, encode_response, push_headers};
use super::head::{self, Parsed};
use super::publish::{self, BodyFormat, PublishHead};
use super::{ApiError, AppState, cors};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use bytes::{BufMut, Bytes};
use std::borrow::Cow;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What decides whether a request is a plain publish, besides its head.
#[derive(Clone, Copy, Debug)]
pub(super) struct PlainRules {
    /// `limits.max_body_bytes`: a larger declared body goes to hyper (its 413).
    pub max_body: usize,
    /// CORS is on: a request with an `Origin` goes to hyper (the CORS layer answers it).
    pub cors: bool,
}

/// A plain publish's head: what the front needs of it, as ranges of the connection's buffer
/// (no copy of the head).
#[derive(Debug, PartialEq)]
pub(super) struct Plain {
    /// Length of the head; the body follows it.
    head_len: usize,
    /// `Content-Length`.
    body_len: usize,
    /// The raw `{threadId}` path segment (percent-decoded when used).
    segment: Range<usize>,
    /// The query string, if any.
    query: Option<Range<usize>>,
    authorization: Option<Range<usize>>,
    cookies: Vec<Range<usize>>,
    content_type: Range<usize>,
    producer_id: Option<Range<usize>>,
    producer_seq: Option<Range<usize>>,
    /// The client asked to close after the answer (`Connection: close`).
    close: bool,
}

/// Where `part` (a slice of `buf`) lies in `buf`.
fn range(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// The plain publish `req` (parsed from `buf`, its head `head_len` bytes long) is, if the front
/// can serve it: `POST` over HTTP/1.1, the events path with one segment that decodes to UTF-8,
/// one `Content-Length` of at most `max_body` bytes, a JSON or NDJSON `Content-Type`, no
/// `Transfer-Encoding`, `Expect` or `Upgrade`, at most one each of the headers a publish reads
/// (`Authorization`, `Content-Type`, the producer headers), and no `Origin` when CORS is on.
/// `None` for anything else: hyper's path answers those.
pub(super) fn plain(
    req: &httparse::Request<'_, '_>,
    buf: &[u8],
    head_len: usize,
    rules: PlainRules,
) -> Option<Plain> {
    if req.method? != "POST" || req.version? != 1 {
        return None;
    }
    let target = req.path?;
    // A fragment (which `http::Uri` strips, RFC 9110 §4.2.5) is hyper's to read.
    if target.contains('#') {
        return None;
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let segment = path.strip_prefix("/v1/threads/")?.strip_suffix("/events")?;
    if segment.is_empty() || segment.contains('/') {
        return None;
    }
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()?;
    let mut p = Plain {
        head_len,
        body_len: 0,
        segment: range(buf, segment.as_bytes()),
        query: query.map(|q| range(buf, q.as_bytes())),
        authorization: None,
        cookies: Vec::new(),
        content_type: 0..0,
        producer_id: None,
        producer_seq: None,
        close: false,
    };
    let (mut length, mut content_type) = (None, None);
    for h in req.headers.iter() {
        let (name, value) = (h.name, h.value);
        let once = |slot: &mut Option<Range<usize>>| {
            slot.replace(range(buf, value)).is_none().then_some(())
        };
        if name.eq_ignore_ascii_case("content-length") {
            let n = head::digits(value)?;
            if length.replace(n).is_some() {
                return None;
            }
        } else if name.eq_ignore_ascii_case("content-type") {
            once(&mut content_type)?;
        } else if name.eq_ignore_ascii_case("authorization") {
            once(&mut p.authorization)?;
        } else if name.eq_ignore_ascii_case("x-producer-id") {
            once(&mut p.producer_id)?;
        } else if name.eq_ignore_ascii_case("x-producer-seq") {
            once(&mut p.producer_seq)?;
        } else if name.eq_ignore_ascii_case("cookie") {
            p.cookies.push(range(buf, value));
        } else if name.eq_ignore_ascii_case("connection") {
            let tokens = head::text(value)?;
            for token in tokens.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    p.close = true;
                } else if !token.eq_ignore_ascii_case("keep-alive") {
                    return None;
                }
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
            || (rules.cors && name.eq_ignore_ascii_case("origin"))
        {
            return None;
        }
    }
    p.body_len = usize::try_from(length?)
        .ok()
        .filter(|n| *n <= rules.max_body)?;
    p.content_type = content_type?;
    match publish::body_format(Some(&buf[p.content_type.clone()])) {
        Ok(BodyFormat::Json | BodyFormat::Ndjson) => Some(p),
        _ => None,
    }
}

/// What becomes of a connection after the publishes the front served.
#[derive(Debug)]
pub(super) enum Next {
    /// Hyper serves the rest, starting with these bytes (read, not served).
    Hyper(Bytes),
    /// A head hyper would refuse: answered with this error, and closed.
    Refuse(ApiError),
    /// This last answer, then the close (without a reset: see `conn::close_after`): what the
    /// client still sends of its request is not read.
    Close(Vec<u8>),
    /// The connection is over: closed by either side, failed, idle past [`HEAD_TIMEOUT`], or
    /// the node stopped accepting.
    Done,
}

/// Serves `first` and every plain publish after it on `stream`; `buf` holds what was read
/// (`first`'s head at its start).
pub(super) async fn serve(
    stream: &mut TcpStream,
    mut buf: Vec<u8>,
    first: Plain,
    state: &AppState,
    rules: PlainRules,
) -> Next {
    // The CORS headers of an answer to a request without `Origin` (the only kind served here):
    // the same for every answer, asked of the CORS layer once per connection.
    let cors = cors::stream_headers(state.cors.as_deref(), None).await;
    let limits = &state.config.limits;
    let write_timeout = state.config.sse.write_timeout;
    let mut req = first;
    loop {
        let end = req.head_len + req.body_len;
        let checked = {
            let slice = |r: &Option<Range<usize>>| r.clone().map(|r| &buf[r]);
            let head = PublishHead {
                authorization: slice(&req.authorization),
                cookies: req.cookies.iter().map(|r| &buf[r.clone()]).collect(),
                content_type: Some(&buf[req.content_type.clone()]),
                producer_id: slice(&req.producer_id),
                producer_seq: slice(&req.producer_seq),
            };
            let thread = percent_encoding::percent_decode(&buf[req.segment.clone()])
                .decode_utf8()
                .unwrap_or(Cow::Borrowed(""));
            let query = req
                .query
                .clone()
                .and_then(|r| std::str::from_utf8(&buf[r]).ok());
            publish::check_head(state, &thread, query, &head)
        };
        let admitted = checked.and_then(|c| state.bodies.take(req.body_len).map(|held| (c, held)));
        let draining = || state.draining.load(Ordering::Relaxed);
        let (out, close) = match admitted {
            // Answered at once, as the router answers it: the body is not read for a refused
            // head. The connection goes on only when the whole body is here already.
            Err(e) => {
                publish::count_rejected(&e);
                if buf.len() < end {
                    return Next::Close(encode_response(e.into_response(), &cors, true).await);
                }
                consume(&mut buf, end);
                let close = req.close || draining();
                (
                    encode_response(e.into_response(), &cors, close).await,
                    close,
                )
            }
            Ok((checked, held)) => {
                let body = match read_body(stream, &mut buf, &req, limits.body_timeout).await {
                    Ok(body) => body,
                    Err(e) => {
                        publish::count_rejected(&e);
                        return Next::Close(encode_response(e.into_response(), &cors, true).await);
                    }
                };
                let held = HeldBody::new(Bytes::from(body), held);
                let result = publish::append_body(state, &checked, held).await;
                let close = req.close || draining();
                let out = match result {
                    Ok(reply) => ok_response(&reply, &cors, close),
                    Err(e) => {
                        publish::count_rejected(&e);
                        encode_response(e.into_response(), &cors, close).await
                    }
                };
                (out, close)
            }
        };
        if write_all(stream, &out, write_timeout).await.is_err() || close {
            let _ = stream.shutdown().await;
            return Next::Done;
        }
        req = match next_head(stream, &mut buf, state, rules).await {
            Head::Plain(next) => next,
            Head::Other(next) => return next,
        };
    }
}

/// A buffer capacity above which a kept-alive connection's buffer is given back once it
/// holds little (a large head was read into it).
const SHRINK_ABOVE: usize = 4 * FIRST_READ;

/// Drops the first `n` bytes of `buf` (a served request), keeping what follows.
fn consume(buf: &mut Vec<u8>, n: usize) {
    if n >= buf.len() {
        buf.clear();
    } else {
        buf.drain(..n);
    }
    if buf.capacity() > SHRINK_ABOVE && buf.len() <= FIRST_READ {
        buf.shrink_to(FIRST_READ);
    }
}

/// The body of `req` in a buffer of its own, of exactly its size (what the node's budget
/// counts): the part already in `buf` (consumed from it with the head), the rest read within
/// `patience` straight into it, never past its end (what follows is the next request's).
///
/// # Errors
/// 408 `body_timeout`; 400 `body_error` when the connection closes or fails first (as
/// `body::read_whole` answers them).
async fn read_body(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    req: &Plain,
    patience: Duration,
) -> Result<Vec<u8>, ApiError> {
    let here = buf.len().min(req.head_len + req.body_len);
    let mut body = Vec::with_capacity(req.body_len);
    body.extend_from_slice(&buf[req.head_len..here]);
    consume(buf, here);
    let read = async {
        while body.len() < req.body_len {
            let left = req.body_len - body.len();
            match stream.read_buf(&mut (&mut body).limit(left)).await {
                Ok(0) => return Err("the connection closed before the body was whole".into()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(patience, read).await {
        Ok(Ok(())) => Ok(body),
        Ok(Err(why)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "body_error",
            format!("could not read the body: {why}"),
        )),
        Err(_) => Err(body_timeout(patience)),
    }
}

/// 408 `body_timeout`, as `body::read_whole` answers it.
fn body_timeout(patience: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        format!(
            "the request body did not arrive whole within {} (limits.body_timeout)",
            humantime::format_duration(patience)
        ),
    )
}

/// The `200` answer to a publish: `reply` as JSON, with the CORS headers `cors`, and
/// `connection: close` when the connection closes after it.
fn ok_response(reply: &publish::Reply, cors: &HeaderMap, close: bool) -> Vec<u8> {
    // A struct of numbers and ids: serialising it cannot fail.
    let body = serde_json::to_vec(reply).unwrap_or_default();
    let mut head = String::with_capacity(160);
    head.push_str("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ");
    head.push_str(itoa::Buffer::new().format(body.len()));
    head.push_str("\r\n");
    push_headers(&mut head, cors);
    if close {
        head.push_str("connection: close\r\n");
    }
    head.push_str("date: ");
    date(|d| head.push_str(d));
    head.push_str("\r\n\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Writes `out` whole: at once when the socket has room (an answer is small), else waiting
/// for room at most `patience` per attempt (`sse.write_timeout`, as hyper's connections).
async fn write_all(stream: &mut TcpStream, out: &[u8], patience: Duration) -> std::io::Result<()> {
    let mut done = match stream.try_write(out) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    while done < out.len() {
        done += tokio::time::timeout(patience, stream.write(&out[done..]))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    }
    Ok(())
}

/// The next request's head on a kept-alive connection.
enum Head {
    /// Another plain publish.
    Plain(Plain),
    /// Anything else.
    Other(Next),
}

/// Reads the next request's head into `buf` (which may already hold some or all of it): it
/// must come whole within [`HEAD_TIMEOUT`] of the last answer (hyper's rule for kept-alive
/// connections) and within `limits.max_head_bytes`. The connection ends, with no answer, when
/// the node stops accepting while it is idle (as hyper's graceful shutdown ends idle ones).
async fn next_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    state: &AppState,
    rules: PlainRules,
) -> Head {
    let max_head = state.config.limits.max_head_bytes;
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    loop {
        if !buf.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; head::MAX_HEADERS];
            match head::parse(buf, &mut headers) {
                Ok(Parsed::Complete { len, .. }) if len > max_head => {
                    return Head::Other(Next::Refuse(too_large(max_head)));
                }
                Ok(Parsed::Complete { req, len }) => {
                    if let Err(e) = head::check(&req) {
                        return Head::Other(Next::Refuse(e));
                    }
                    if let Some(p) = plain(&req, buf, len, rules) {
                        return Head::Plain(p);
                    }
                    return Head::Other(Next::Hyper(Bytes::from(std::mem::take(buf))));
                }
                Ok(Parsed::Partial) if buf.len() >= max_head => {
                    return Head::Other(Next::Refuse(too_large(max_head)));
                }
                Ok(Parsed::Partial) => {}
                Err(e) => return Head::Other(Next::Refuse(e)),
            }
        }
        buf.reserve(FIRST_READ);
        let read = tokio::select! {
            biased;
            _ = state.drain_ended.cancelled() => {
                // A request that already arrived is still served (its answer closes the
                // connection); closing with it unread would reset the connection.
                match stream.try_read_buf(buf) {
                    Ok(n) if n > 0 => continue,
                    _ => return Head::Other(Next::Done),
                }
            }
            read = tokio::time::timeout_at(deadline, stream.read_buf(buf)) => read,
        };
        match read {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Head::Other(Next::Done),
            Ok(Ok(_)) => {}
        }
    }
}

fn too_large(max_head: usize) -> ApiError {
    head::too_large(format!(
        "the request head is larger than {max_head} bytes (limits.max_head_bytes)"
    ))
}

#[cfg(test)]
mod tests;
