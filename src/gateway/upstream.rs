//! The upstream side of a gateway run: one configured agent's HTTP client (hyper's, over
//! rustls), the run request (`POST url`, the caller's `RunAgentInput`,
//! `Accept: text/event-stream`, AGUI.md §4.1), and its answer read as SSE events
//! (`eventsource-stream`), each failure named by its cause (PROTOCOL §11 "Upstream failures").

use crate::config::agents::{AgentConfig, OnDisconnect};
use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::http::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use hyper::http::{Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::fmt::Display;
use std::pin::Pin;
use std::time::Duration;

/// Why an upstream run failed: the `code` of the `RUN_ERROR` the broker appends, and the
/// `cause` label of `agui_upstream_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The connection (TCP, TLS) could not be made within `connect_timeout`, or was refused.
    Unavailable,
    /// The agent answered with a status other than 2xx.
    Status,
    /// The agent's stream broke, or ended before the run's terminal event.
    Disconnected,
    /// No event from the agent for `idle_timeout` (response headers included).
    Timeout,
    /// The answer is not an AG-UI event stream: not `text/event-stream`, not UTF-8 or SSE, an
    /// event the schema or the order rules refuse, or a run other than the one requested.
    Invalid,
}

impl Cause {
    /// Every cause, for describing metrics with zero series.
    pub const ALL: [Cause; 5] = [
        Cause::Unavailable,
        Cause::Status,
        Cause::Disconnected,
        Cause::Timeout,
        Cause::Invalid,
    ];

    /// The `RUN_ERROR` `code`, e.g. `upstream_unavailable`.
    pub fn code(self) -> &'static str {
        match self {
            Cause::Unavailable => "upstream_unavailable",
            Cause::Status => "upstream_status",
            Cause::Disconnected => "upstream_disconnected",
            Cause::Timeout => "upstream_timeout",
            Cause::Invalid => "upstream_invalid",
        }
    }
}

/// A failure of the upstream run, with a message for people (it becomes the `RUN_ERROR`'s
/// `message`; never a header value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// What failed.
    pub cause: Cause,
    /// For people.
    pub message: String,
}

impl Failure {
    /// A failure of `cause`.
    pub fn new(cause: Cause, message: impl Into<String>) -> Self {
        Failure {
            cause,
            message: message.into(),
        }
    }
}

/// The agent's answer, event by event (`data` of each SSE event; `id:`, `event:`, `retry:`
/// and comments are ignored, AGUI.md §3).
pub type Events = Pin<Box<dyn Stream<Item = Result<Event, Failure>> + Send>>;

/// How much of a non-2xx answer's body goes into the `RUN_ERROR` message.
const STATUS_BODY_MAX: usize = 256;

/// One configured upstream agent, ready to run: its HTTP client (connection pool, connect
/// timeout, no redirects) and its static headers, resolved once.
#[derive(Debug)]
pub struct Agent {
    /// The agent's name (`[agents.<name>]`, the `agent` label of the run metrics).
    pub name: String,
    /// Its configuration.
    pub config: AgentConfig,
    uri: Uri,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    headers: HeaderMap,
    forward: Vec<HeaderName>,
}

impl Agent {
    /// Builds the agent's client: HTTP/1.1, or HTTP/2 when TLS negotiates it; TLS by rustls
    /// with the `ring` provider and the platform's certificate verifier, or the CAs of
    /// `ca_file` when set; `connect_timeout` on
    /// the TCP connection; no redirect followed (a redirected POST would become a GET: an
    /// agent that moved is a configuration error, reported as `upstream_status`).
    ///
    /// # Errors
    /// A URL or header that does not parse or resolve (checked at start-up already,
    /// `config::agents`), or a TLS setup that fails.
    pub fn new(name: &str, config: &AgentConfig) -> Result<Agent, String> {
        let uri: Uri = config
            .url
            .parse()
            .map_err(|e| format!("agents.{name}.url: {e}"))?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(config.connect_timeout));
        let provider = rustls::crypto::ring::default_provider();
        let tls = match config.root_store(name)? {
            // A private CA (`ca_file`) instead of the platform's trust store.
            Some(roots) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
                    .with_safe_default_protocol_versions()
                    .map_err(|e| format!("agents.{name}: TLS: {e}"))?
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            ),
            None => hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_platform_verifier(provider)
                .map_err(|e| format!("agents.{name}: TLS: {e}"))?,
        };
        let tls = tls
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(tls);
        let mut headers = HeaderMap::new();
        for (k, v) in &config.headers {
            let name_ = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("agents.{name}.headers: {k:?} is not a header name"))?;
            let mut value = HeaderValue::from_str(&v.resolve()?)
                .map_err(|_| format!("agents.{name}.headers.{k}: not a valid header value"))?;
            value.set_sensitive(true);
            headers.insert(name_, value);
        }
        let forward = config
            .forward_headers
            .iter()
            .map(|h| {
                HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| format!("agents.{name}.forward_headers: {h:?}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Agent {
            name: name.to_string(),
            config: config.clone(),
            uri,
            client,
            headers,
            forward,
        })
    }

    /// Whether a caller that goes away cancels the run.
    pub fn cancels_on_disconnect(&self) -> bool {
        self.config.on_disconnect == OnDisconnect::Cancel
    }

    /// The configured idle timeout.
    pub fn idle_timeout(&self) -> Duration {
        self.config.idle_timeout
    }

    /// Sends the run request and checks the answer's head: a 2xx status and
    /// `Content-Type: text/event-stream`. The caller's headers named in `forward_headers` go
    /// along; the static `headers` win over them.
    ///
    /// # Errors
    /// [`Failure`] with cause `Unavailable` (connect), `Status` (non-2xx, with the start of
    /// its body), `Invalid` (another content type), `Disconnected` (any other transport
    /// error). The idle timeout is the caller's to apply.
    pub async fn open(
        &self,
        input: &Value,
        caller: &HeaderMap,
        max_event: usize,
    ) -> Result<Events, Failure> {
        let mut headers = HeaderMap::new();
        for name in &self.forward {
            for v in caller.get_all(name) {
                headers.append(name.clone(), v.clone());
            }
        }
        for (k, v) in &self.headers {
            headers.insert(k.clone(), v.clone());
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        let body = serde_json::to_vec(input).unwrap_or_default();
        let mut request = Request::post(self.uri.clone())
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Failure::new(Cause::Unavailable, format!("the request: {e}")))?;
        *request.headers_mut() = headers;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| request_failure(&e))?;
        let status = response.status();
        if !status.is_success() {
            let text = head_of_body(response).await;
            return Err(Failure::new(
                Cause::Status,
                format!("the agent answered HTTP {}: {text}", status.as_u16()),
            ));
        }
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let essence = content_type.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("text/event-stream") {
            return Err(Failure::new(
                Cause::Invalid,
                format!("the agent answered Content-Type {content_type:?}, not text/event-stream"),
            ));
        }
        let bytes = guard_event_size(response.into_body().into_data_stream(), max_event);
        let events = bytes.eventsource().map(|item| {
            item.map_err(|e| match e {
                EventStreamError::Transport(f) => f,
                EventStreamError::Utf8(e) => Failure::new(
                    Cause::Invalid,
                    format!("the agent's stream is not UTF-8: {e}"),
                ),
                EventStreamError::Parser(e) => Failure::new(
                    Cause::Invalid,
                    format!("the agent's stream is not SSE: {e}"),
                ),
            })
        });
        Ok(Box::pin(events))
    }
}

/// The cause of a failed request: no connection (refused, or not made within
/// `connect_timeout`), or the connection broke before an answer.
fn request_failure(e: &hyper_util::client::legacy::Error) -> Failure {
    let cause = if e.is_connect() {
        Cause::Unavailable
    } else {
        Cause::Disconnected
    };
    Failure::new(
        cause,
        format!("the agent could not be reached: {}", error_chain(e)),
    )
}

/// An error with its sources, `a: b: c`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    message
}

/// The first [`STATUS_BODY_MAX`] bytes of a body, lossily as text (read for at most 2 s).
async fn head_of_body(response: hyper::Response<hyper::body::Incoming>) -> String {
    let mut stream = response.into_body().into_data_stream();
    let mut buf = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            buf.extend_from_slice(&chunk);
            if buf.len() >= STATUS_BODY_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
    buf.truncate(STATUS_BODY_MAX);
    String::from_utf8_lossy(&buf).trim().to_string()
}

/// Fails the byte stream once more than `limit` (+ framing slack) bytes arrive without an
/// empty line, so that one oversized event cannot make the SSE parser buffer without bound
/// (`limits.max_event_bytes`, as for a publish). A transport error ends the stream with
/// `Disconnected`.
fn guard_event_size<E: Display>(
    body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    limit: usize,
) -> impl Stream<Item = Result<Bytes, Failure>> + Send + 'static {
    let cap = limit + 1024;
    // Bytes since the last empty line, and of the current line.
    let (mut since_empty, mut line) = (0usize, 0usize);
    let mut failed = false;
    body.map(move |chunk| {
        let chunk = chunk.map_err(|e| {
            Failure::new(
                Cause::Disconnected,
                format!("the agent's stream broke: {e}"),
            )
        })?;
        for &b in chunk.iter() {
            match b {
                b'\n' => {
                    if line == 0 {
                        since_empty = 0;
                    }
                    line = 0;
                }
                // A CR alone does not make a line non-empty (CRLF framing).
                b'\r' => {}
                _ => {
                    line += 1;
                    since_empty += 1;
                }
            }
        }
        if since_empty > cap {
            return Err(Failure::new(
                Cause::Invalid,
                format!("the agent sent an event larger than {limit} bytes"),
            ));
        }
        Ok(chunk)
    })
    .take_while(move |item| {
        let go = !failed;
        failed |= item.is_err();
        futures::future::ready(go)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_event_without_end_is_cut_at_the_limit() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = (0..40)
            .map(|_| {
                Ok(Bytes::from_static(
                    b"data: 0123456789012345678901234567890123456789",
                ))
            })
            .collect();
        let out: Vec<_> = guard_event_size(futures::stream::iter(chunks), 512)
            .collect()
            .await;
        assert!(out.len() < 40, "the stream stops after the error");
        assert_eq!(
            out.last().unwrap().as_ref().unwrap_err().cause,
            Cause::Invalid
        );
        let ok: Vec<Result<Bytes, std::io::Error>> = (0..200)
            .map(|_| {
                Ok(Bytes::from_static(
                    b"data: {\"type\":\"RAW\",\"event\":1}\r\n\r\n",
                ))
            })
            .collect();
        let out: Vec<_> = guard_event_size(futures::stream::iter(ok), 64)
            .collect()
            .await;
        assert!(out.iter().all(Result::is_ok));
    }
}
