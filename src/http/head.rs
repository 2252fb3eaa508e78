//! A connection's first request head, as the connection front (`conn`) reads it: parsed with
//! `httparse` (hyper's own parser) and checked against the rules hyper applies to a request
//! head, so that a head hyper would refuse with a bodiless `400`, `414` or `431` is refused by
//! the front with the JSON error shape instead (PROTOCOL §2, Errors); and [`Rewind`], which
//! gives hyper the bytes the front read before the rest of the connection.
//!
//! Why here: hyper answers a head it cannot parse itself, before any service runs, with an
//! empty body and no way to change it. The front reads the first head of every HTTP/1
//! connection anyway (to serve subscribes on the raw socket), so it applies the same checks
//! first. A later head on a kept-alive connection is still hyper's to refuse.

use super::ApiError;
use axum::http::{HeaderName, Method, StatusCode, Uri};
use bytes::Bytes;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most header fields of a request head: hyper's default (`431` beyond it, there as here).
pub(super) const MAX_HEADERS: usize = 100;
/// Longest request target hyper takes: the `http` crate's `Uri` limit (2^16 − 2 bytes); hyper
/// answers `414` beyond it. A subscribe the front serves itself is not bound by it (its id may
/// be long, PROTOCOL §4.3).
pub(super) const MAX_URI_LEN: usize = u16::MAX as usize - 1;
/// Longest header name hyper takes (`431` beyond it).
const MAX_HEADER_NAME_LEN: usize = (1 << 16) - 1;

/// What the bytes read so far hold.
pub(super) enum Parsed<'h, 'b> {
    /// Not a whole head yet.
    Partial,
    /// A whole head.
    Complete {
        /// The parsed head.
        req: httparse::Request<'h, 'b>,
        /// Its length in bytes (what follows is the body, or the next request).
        len: usize,
    },
}

/// Parses `bytes` as the start of an HTTP/1 request, with room for `headers.len()` fields.
///
/// # Errors
/// 400 `bad_request` naming the part at fault (`method`, `request-target`, `version`,
/// `header`); 431 `headers_too_large` when there are more fields than `headers` holds.
pub(super) fn parse<'h, 'b>(
    bytes: &'b [u8],
    headers: &'h mut [httparse::Header<'b>],
) -> Result<Parsed<'h, 'b>, ApiError> {
    let room = headers.len();
    let mut req = httparse::Request::new(headers);
    let status = req.parse(bytes);
    match status {
        Ok(httparse::Status::Complete(len)) => Ok(Parsed::Complete { req, len }),
        Ok(httparse::Status::Partial) => Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => Err(too_large(format!(
            "the request has more than {room} header fields"
        ))),
        Err(e) => {
            // As hyper tells them apart: a bad token before the method is known is the
            // method's, after it the target's.
            let field = match e {
                httparse::Error::Token if req.method.is_none() => "method",
                httparse::Error::Token => "request-target",
                httparse::Error::Version => "version",
                _ => "header",
            };
            Err(bad_request(field, format!("malformed request: {e}")))
        }
    }
}

/// Checks a whole head against what hyper refuses once `httparse` accepted it: a target too
/// long or not a URI, a method hyper cannot represent, a header name over 64 KiB, and the
/// framing rules of RFC 9112 §6 as hyper applies them (`Transfer-Encoding` only in HTTP/1.1
/// and ending in `chunked`; a `Content-Length` that is digits, and the same when repeated).
///
/// # Errors
/// 414 `uri_too_long`; 431 `headers_too_large`; 400 `bad_request` naming the part at fault.
pub(super) fn check(req: &httparse::Request<'_, '_>) -> Result<(), ApiError> {
    let target = req.path.unwrap_or_default();
    if target.len() > MAX_URI_LEN {
        return Err(ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!(
                "the request target is {} bytes; at most {MAX_URI_LEN} are accepted",
                target.len()
            ),
        )
        .field(Some("request-target".into())));
    }
    Uri::try_from(target)
        .map_err(|e| bad_request("request-target", format!("malformed request target: {e}")))?;
    Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|e| bad_request("method", format!("malformed method: {e}")))?;
    let http10 = req.version == Some(0);
    let (mut te, mut chunked, mut length) = (false, false, None);
    for h in req.headers.iter() {
        if h.name.len() > MAX_HEADER_NAME_LEN {
            return Err(too_large(format!(
                "a header name is longer than {MAX_HEADER_NAME_LEN} bytes"
            )));
        }
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|e| bad_request("header", format!("malformed header name: {e}")))?;
        if name == axum::http::header::TRANSFER_ENCODING {
            if http10 {
                return Err(bad_request(
                    "Transfer-Encoding",
                    "Transfer-Encoding is not allowed in an HTTP/1.0 request",
                ));
            }
            te = true;
            // The last coding must be `chunked` (RFC 9112 §6.3); hyper reads it so.
            chunked = std::str::from_utf8(h.value).is_ok_and(|v| {
                v.rsplit(',')
                    .next()
                    .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
            });
        } else if name == axum::http::header::CONTENT_LENGTH && !te {
            // After a Transfer-Encoding, hyper ignores Content-Length (RFC 9112 §6.3 item 3).
            let n = digits(h.value).ok_or_else(|| {
                bad_request("Content-Length", "Content-Length must be a decimal number")
            })?;
            if length.is_some_and(|prev| prev != n) {
                return Err(bad_request(
                    "Content-Length",
                    "Content-Length is repeated with different values",
                ));
            }
            length = Some(n);
        }
    }
    if te && !chunked {
        return Err(bad_request(
            "Transfer-Encoding",
            "the last transfer coding must be chunked",
        ));
    }
    Ok(())
}

/// A header value as text when it is visible ASCII (and tabs), as `HeaderValue::to_str` reads
/// it; `None` otherwise.
pub(super) fn text(value: &[u8]) -> Option<&str> {
    if value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        // Checked just above: ASCII only.
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

/// A `Content-Length` value: ASCII digits only (no sign, no spaces), below 2^64 − 2 (hyper's
/// bound).
pub(super) fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value)
        .ok()?
        .parse::<u64>()
        .ok()
        .filter(|n| *n < u64::MAX - 1)
}

/// 400 `bad_request` naming `field`.
fn bad_request(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message).field(Some(field.into()))
}

/// 431 `headers_too_large` naming the field `headers`.
pub(super) fn too_large(message: impl Into<String>) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "headers_too_large",
        message,
    )
    .field(Some("headers".into()))
}

/// An I/O object that reads `prefix` first, then from `inner`; writes go to `inner`. The front
/// hands hyper a connection whose first bytes it already read this way (hyper-util's own
/// `Rewind` is private). The prefix is freed as soon as it has been read.
pub(super) struct Rewind<T> {
    prefix: Bytes,
    inner: T,
}

impl<T> Rewind<T> {
    /// `inner`, with `prefix` read before it.
    pub(super) fn new(prefix: Bytes, inner: T) -> Self {
        Rewind { prefix, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.is_empty() {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let n = this.prefix.len().min(buf.remaining());
        buf.put_slice(&this.prefix[..n]);
        if n == this.prefix.len() {
            this.prefix = Bytes::new();
        } else {
            this.prefix = this.prefix.slice(n..);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The status and field `head` is refused with, or `None` if it passes.
    async fn verdict(head: &[u8]) -> Option<(u16, String)> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let checked = match parse(head, &mut headers) {
            Ok(Parsed::Complete { req, .. }) => check(&req),
            Ok(Parsed::Partial) => panic!("partial: {head:?}"),
            Err(e) => Err(e),
        };
        let resp = axum::response::IntoResponse::into_response(checked.err()?);
        let status = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .expect("a body")
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        Some((
            status,
            v["error"]["field"].as_str().unwrap_or("").to_string(),
        ))
    }

    #[tokio::test]
    async fn hyper_refusals_are_caught() {
        for (head, status, field) in [
            (&b"BLAH\r\n\r\n"[..], 400, "method"),
            (b"GET /x HTTP/1.1\r\nbad header\r\n\r\n", 400, "header"),
            (b"GET /x HTTP/3.0\r\n\r\n", 400, "version"),
            (
                b"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                400,
                "Transfer-Encoding",
            ),
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                400,
                "Transfer-Encoding",
            ),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
                400,
                "Content-Length",
            ),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                400,
                "Content-Length",
            ),
        ] {
            let got = verdict(head).await;
            assert_eq!(got, Some((status, field.to_string())), "{head:?}");
        }
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI_LEN));
        let got = verdict(long.as_bytes()).await;
        assert_eq!(got, Some((414, "request-target".into())));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: 1\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            verdict(many.as_bytes()).await,
            Some((431, "headers".into()))
        );
    }

    #[tokio::test]
    async fn ordinary_heads_pass() {
        for head in [
            &b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"POST /v1/threads/t/events HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
            b"POST /v1/threads/t/events HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            // Content-Length after Transfer-Encoding is ignored (hyper drops it).
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: nope\r\n\r\n",
            b"GET /x HTTP/1.0\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(verdict(head).await, None, "{head:?}");
        }
    }

    #[tokio::test]
    async fn rewind_reads_the_prefix_then_the_rest() {
        let (mut a, b) = tokio::io::duplex(64);
        let mut r = Rewind::new(Bytes::from_static(b"head "), b);
        a.write_all(b"rest").await.unwrap();
        drop(a);
        let mut got = String::new();
        r.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "head rest");
    }
}
