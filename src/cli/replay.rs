//! The `replay` subcommand (PROTOCOL §9): publishes a recorded AG-UI run to a broker as a live
//! agent would, one event per `POST /v1/threads/{threadId}/events`, paced at a fixed rate.
//!
//! A client of the broker's HTTP API (PROTOCOL §2), not a stage of the data path. It runs one way:
//! read the file (a JSON array of events, UTF-8 BOM tolerated) → pick the thread (`--thread`,
//! else the first `threadId` in the recording) → retarget the events' `threadId` fields →
//! publish them in order, stopping at the first refusal.
//!
//! Every request carries `X-Producer-Id` (random per run) and `X-Producer-Seq` (the event's
//! 1-based position), so the retries of a `503` can never append an event twice (PROTOCOL §2,
//! idempotent retries). Nothing is printed here; the binary reports the [`ReplaySummary`] or
//! the [`ReplayError`].

use crate::event::{ThreadId, ThreadIdError, json_type};
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::MissedTickBehavior;

/// Attempts per event while the broker answers `503` (the first try included).
const MAX_ATTEMPTS: u32 = 5;
/// Wait before the first retry of a `503` without `Retry-After`; doubled on each retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest wait between two attempts, whatever `Retry-After` asks for.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Bound on establishing a TCP connection to the broker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one publish request, reply included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest non-JSON reply body quoted in an error, in characters (the broker's error bodies
/// are small JSON; this only guards against quoting a proxy's HTML page in full).
const MAX_QUOTED_BODY: usize = 4096;

/// Arguments of `replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// Base URL of the broker, e.g. `http://127.0.0.1:8080` (plain `http://` only).
    #[arg(long)]
    pub url: String,
    /// Publish to this thread instead of the recording's; every `threadId` in the events
    /// (top level, and `input.threadId` of `RUN_STARTED`) is rewritten to it.
    #[arg(long)]
    pub thread: Option<String>,
    /// A recorded run: a JSON array of AG-UI events (a leading UTF-8 BOM is tolerated).
    pub file: PathBuf,
    /// Events per second, like a live agent streaming; `0` (or less) or `inf` publishes as
    /// fast as the broker answers.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// A bearer token allowing to publish to the thread, for a broker with authentication on
    /// (PROTOCOL §8; e.g. from `agui-fanout token --publish <thread>`). Sent as
    /// `Authorization: Bearer`.
    #[arg(long, env = "AGUI_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// What a successful replay published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaySummary {
    /// The thread the events were published to.
    pub thread: String,
    /// Number of events the broker acknowledged (all of the file's).
    pub published: usize,
    /// Event id the broker assigned to the first event (`None` if nothing was published).
    pub first_id: Option<String>,
    /// Event id the broker assigned to the last event (`None` if nothing was published).
    pub last_id: Option<String>,
}

/// Why a replay failed.
///
/// For the variants naming an event `index` (0-based position in the file's array), the
/// events before it were published and acknowledged; it and the ones after were not
/// (except that a timed-out request may have been appended without its reply arriving).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// `--rate` is not a usable number of events per second.
    #[error("--rate {rate}: {reason}")]
    InvalidRate {
        /// The rate given.
        rate: f64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `--url` is not a usable base URL.
    #[error("--url {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The recording could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The recording is not JSON.
    #[error("{} is not valid JSON: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why parsing failed.
        source: serde_json::Error,
    },
    /// The recording is JSON but not an array of event objects.
    #[error("{}: {reason}", path.display())]
    NotEvents {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// No `--thread` was given and no event of the recording carries a `threadId`.
    #[error("{}: no event carries a threadId; pass --thread", path.display())]
    NoThread {
        /// The file.
        path: PathBuf,
    },
    /// The target thread id is not a valid thread id (PROTOCOL §1).
    #[error("thread {thread:?}: {source}")]
    InvalidThread {
        /// The id (from `--thread` or the recording).
        thread: String,
        /// Why it is invalid.
        source: ThreadIdError,
    },
    /// Without `--thread`, an event names another thread than the run's: the broker would
    /// refuse it midway, so nothing is published.
    #[error(
        "event {index} has threadId {found:?} but the run's thread is {expected:?} \
         (pass --thread to publish the whole run to one thread)"
    )]
    ThreadMismatch {
        /// Position of the event in the file.
        index: usize,
        /// Its `threadId`.
        found: String,
        /// The thread of the run (the first `threadId` of the recording).
        expected: String,
    },
    /// The HTTP client could not be set up.
    #[error("cannot set up the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// The request for an event failed before a reply (connection refused, timeout, ...).
    #[error("publishing event {index} to {endpoint} failed: {source}")]
    Request {
        /// Position of the event in the file.
        index: usize,
        /// The publish URL.
        endpoint: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The broker refused an event with a non-2xx status (other than a `503` retried).
    #[error(
        "broker refused event {index} ({event_type}) with HTTP {status}: {body}{hint}",
        hint = auth_hint(*.status)
    )]
    Rejected {
        /// Position of the event in the file.
        index: usize,
        /// Its AG-UI `type` (`?` if it has none).
        event_type: String,
        /// The reply's status.
        status: StatusCode,
        /// The broker's error body (`{"error":{"code",...}}`), compact if JSON.
        body: String,
    },
    /// The broker kept answering `503` (backend unavailable) for an event.
    #[error(
        "broker unavailable for event {index}: HTTP {status} on all {attempts} attempts; \
         last reply: {body}"
    )]
    Unavailable {
        /// Position of the event in the file.
        index: usize,
        /// The last reply's status (`503`).
        status: StatusCode,
        /// Attempts made, the first included.
        attempts: u32,
        /// The broker's last error body, compact if JSON.
        body: String,
    },
    /// The broker accepted an event but its reply is not `{"count","firstId","lastId"}`.
    #[error("unexpected reply to event {index}: {reason}")]
    BadReply {
        /// Position of the event in the file.
        index: usize,
        /// What was wrong with the reply.
        reason: String,
    },
}

/// Replays `args.file` to the broker at `args.url`, event by event, paced at `args.rate`.
///
/// All checks that need no network (rate, URL, file, thread) run before the first request,
/// so a bad invocation publishes nothing.
///
/// # Errors
/// [`ReplayError`]: invalid arguments or recording, a transport failure, a non-2xx reply
/// (status and the broker's JSON error body), or `503` on every attempt. Publishing stops at
/// the first failed event.
pub async fn run(args: &ReplayArgs) -> Result<ReplaySummary, ReplayError> {
    let period = pacing(args.rate)?;
    let endpoint_base = base_url(&args.url)?;
    let bytes = tokio::fs::read(&args.file)
        .await
        .map_err(|source| ReplayError::Read {
            path: args.file.clone(),
            source,
        })?;
    let mut events = parse_events(&bytes, &args.file)?;
    let thread = target_thread(&events, args.thread.as_deref(), &args.file)?;
    if args.thread.is_some() {
        retarget(&mut events, thread.as_str());
    }
    let publisher = Publisher::new(endpoint_base, &thread, args.token.clone())?;

    let mut ticker = period.map(|period| {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticker
    });
    let mut summary = ReplaySummary {
        thread: thread.to_string(),
        published: 0,
        first_id: None,
        last_id: None,
    };
    for (index, event) in events.iter().enumerate() {
        if let Some(ticker) = ticker.as_mut() {
            ticker.tick().await;
        }
        let reply = publisher.publish(index, event).await?;
        summary.published += 1;
        if summary.first_id.is_none() {
            summary.first_id = reply.first_id;
        }
        if reply.last_id.is_some() {
            summary.last_id = reply.last_id;
        }
    }
    Ok(summary)
}

/// The interval between two events for `rate` events/s; `None` means unpaced.
///
/// `rate <= 0` and `+inf` are unpaced, as is a rate so high its period rounds to zero.
///
/// # Errors
/// [`ReplayError::InvalidRate`] for NaN, or a rate so small its period overflows a `Duration`.
fn pacing(rate: f64) -> Result<Option<Duration>, ReplayError> {
    if rate.is_nan() {
        return Err(ReplayError::InvalidRate {
            rate,
            reason: "not a number of events per second",
        });
    }
    if rate <= 0.0 || rate.is_infinite() {
        return Ok(None);
    }
    let period = Duration::try_from_secs_f64(1.0 / rate).map_err(|_| ReplayError::InvalidRate {
        rate,
        reason: "too small: the interval between events would be unbounded",
    })?;
    Ok((!period.is_zero()).then_some(period))
}

/// Parses `--url`: an absolute `http://` URL that can take path segments (a path prefix, for
/// a broker behind a reverse proxy, is kept).
///
/// # Errors
/// [`ReplayError::InvalidUrl`] saying why.
fn base_url(url: &str) -> Result<Url, ReplayError> {
    let invalid = |reason: String| ReplayError::InvalidUrl {
        url: url.to_string(),
        reason,
    };
    let parsed = Url::parse(url).map_err(|e| invalid(e.to_string()))?;
    if parsed.scheme() != "http" {
        return Err(invalid(format!(
            "scheme {:?} is not supported: this client speaks plain http:// only (no TLS)",
            parsed.scheme()
        )));
    }
    if parsed.cannot_be_a_base() || parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid(
            "expected a base URL such as http://127.0.0.1:8080 (no query or fragment)".into(),
        ));
    }
    Ok(parsed)
}

/// Parses a recording: a JSON array of event objects, after an optional UTF-8 BOM
/// (`EF BB BF`, which the .NET AG-UI baselines start with).
///
/// # Errors
/// [`ReplayError::Parse`] for invalid JSON, [`ReplayError::NotEvents`] when the top level is
/// not an array or an element is not an object.
fn parse_events(bytes: &[u8], path: &Path) -> Result<Vec<Map<String, Value>>, ReplayError> {
    let json = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let value: Value = serde_json::from_slice(json).map_err(|source| ReplayError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let not_events = |reason: String| ReplayError::NotEvents {
        path: path.to_path_buf(),
        reason,
    };
    let Value::Array(items) = value else {
        return Err(not_events(format!(
            "expected a JSON array of AG-UI events, found {}",
            json_type(&value)
        )));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::Object(event) => Ok(event),
            other => Err(not_events(format!(
                "event {index} is {}, not a JSON object",
                json_type(&other)
            ))),
        })
        .collect()
}

/// The thread to publish to: `override_thread` if given, else the `threadId` of the first
/// event carrying one as a string. Without an override, every event's `threadId` must name
/// that same thread.
///
/// # Errors
/// [`ReplayError::NoThread`], [`ReplayError::InvalidThread`] (PROTOCOL §1 rules, checked here so
/// the id is safe as a URL path segment), [`ReplayError::ThreadMismatch`].
fn target_thread(
    events: &[Map<String, Value>],
    override_thread: Option<&str>,
    path: &Path,
) -> Result<ThreadId, ReplayError> {
    let parse = |id: &str| {
        ThreadId::parse(id).map_err(|source| ReplayError::InvalidThread {
            thread: id.to_string(),
            source,
        })
    };
    if let Some(id) = override_thread {
        return parse(id);
    }
    fn recorded(event: &Map<String, Value>) -> Option<&str> {
        event.get("threadId").and_then(Value::as_str)
    }
    let first = events
        .iter()
        .find_map(recorded)
        .ok_or_else(|| ReplayError::NoThread {
            path: path.to_path_buf(),
        })?;
    if let Some((index, found)) = events.iter().enumerate().find_map(|(index, event)| {
        recorded(event)
            .filter(|&id| id != first)
            .map(|id| (index, id))
    }) {
        return Err(ReplayError::ThreadMismatch {
            index,
            found: found.to_string(),
            expected: first.to_string(),
        });
    }
    parse(first)
}

/// Rewrites every `threadId` of the events to `thread`: the top-level field and
/// `input.threadId` of `RUN_STARTED` (the `RunAgentInput` echo). Fields are replaced in
/// place, never added; nothing else is touched (a `rawEvent`'s content stays as recorded).
fn retarget(events: &mut [Map<String, Value>], thread: &str) {
    for event in events {
        if let Some(id) = event.get_mut("threadId") {
            *id = Value::String(thread.to_string());
        }
        if event.get("type").and_then(Value::as_str) == Some("RUN_STARTED")
            && let Some(id) = event
                .get_mut("input")
                .and_then(Value::as_object_mut)
                .and_then(|input| input.get_mut("threadId"))
        {
            *id = Value::String(thread.to_string());
        }
    }
}

/// The broker's publish reply, `{"count":N,"firstId":"…","lastId":"…"}` (PROTOCOL §2).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PublishReply {
    /// Id assigned to the first event of the batch.
    #[serde(default)]
    first_id: Option<String>,
    /// Id assigned to the last event of the batch.
    #[serde(default)]
    last_id: Option<String>,
}

/// Publishes single events to one thread's publish endpoint, retrying `503`s.
struct Publisher {
    /// The HTTP client (connection pool, timeouts).
    client: reqwest::Client,
    /// `{base}/v1/threads/{threadId}/events`.
    endpoint: Url,
    /// `X-Producer-Id` of this run, so retried events are appended once.
    producer_id: String,
    /// `--token`, sent as `Authorization: Bearer`.
    token: Option<String>,
}

impl Publisher {
    /// A publisher for `thread` on the broker at `base`, sending `token` (if any) as a bearer
    /// token.
    ///
    /// # Errors
    /// [`ReplayError::InvalidUrl`] if `base` cannot take a path (`base_url` already refuses
    /// those), [`ReplayError::Client`] if the HTTP client cannot be built.
    fn new(base: Url, thread: &ThreadId, token: Option<String>) -> Result<Self, ReplayError> {
        let mut endpoint = base.clone();
        endpoint
            .path_segments_mut()
            .map_err(|()| ReplayError::InvalidUrl {
                url: base.to_string(),
                reason: "cannot take a path".into(),
            })?
            .pop_if_empty()
            .extend(["v1", "threads", thread.as_str(), "events"]);
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            // A redirected POST may turn into a GET; report a 3xx as the refusal it is.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(ReplayError::Client)?;
        Ok(Publisher {
            client,
            endpoint,
            producer_id: format!("agui-fanout-replay-{:016x}", rand::random::<u64>()),
            token,
        })
    }

    /// Publishes the event at `index` (0-based; its `X-Producer-Seq` is `index + 1`).
    ///
    /// A `503` is retried up to [`MAX_ATTEMPTS`] in all, waiting `Retry-After` seconds when
    /// the broker gives them, else an exponential backoff from [`FIRST_BACKOFF`], never more
    /// than [`MAX_BACKOFF`].
    ///
    /// # Errors
    /// [`ReplayError::Request`], [`ReplayError::Rejected`], [`ReplayError::Unavailable`],
    /// [`ReplayError::BadReply`].
    async fn publish(
        &self,
        index: usize,
        event: &Map<String, Value>,
    ) -> Result<PublishReply, ReplayError> {
        // Serialised once, compactly; a map with string keys cannot fail to serialise.
        let body = Bytes::from(serde_json::to_vec(event).unwrap_or_default());
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            let mut request = self
                .client
                .post(self.endpoint.clone())
                .header(CONTENT_TYPE, "application/json")
                .header("X-Producer-Id", &self.producer_id)
                .header("X-Producer-Seq", (index + 1).to_string());
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            let response = request
                .body(body.clone())
                .send()
                .await
                .map_err(|source| self.request_error(index, source))?;
            let status = response.status();
            if status.is_success() {
                let reply = response
                    .bytes()
                    .await
                    .map_err(|source| self.request_error(index, source))?;
                return serde_json::from_slice(&reply).map_err(|e| ReplayError::BadReply {
                    index,
                    reason: format!("{e} in {}", quote_body(&reply)),
                });
            }
            let retry_after = retry_after(response.headers());
            let body = quote_body(&response.bytes().await.unwrap_or_default());
            if status != StatusCode::SERVICE_UNAVAILABLE {
                let event_type = event.get("type").and_then(Value::as_str).unwrap_or("?");
                return Err(ReplayError::Rejected {
                    index,
                    event_type: event_type.to_string(),
                    status,
                    body,
                });
            }
            if attempt >= MAX_ATTEMPTS {
                return Err(ReplayError::Unavailable {
                    index,
                    status,
                    attempts: attempt,
                    body,
                });
            }
            tokio::time::sleep(retry_after.unwrap_or(backoff).min(MAX_BACKOFF)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            attempt += 1;
        }
    }

    /// Wraps a transport error for the event at `index`.
    fn request_error(&self, index: usize, source: reqwest::Error) -> ReplayError {
        ReplayError::Request {
            index,
            endpoint: self.endpoint.to_string(),
            source,
        }
    }
}

/// What to do about a refusal for authentication (401, 403), for [`ReplayError::Rejected`].
fn auth_hint(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            " (the broker needs a token allowing to publish to this thread: --token or AGUI_TOKEN)"
        }
        _ => "",
    }
}

/// The delay of a `Retry-After: <seconds>` header (RFC 9110 §10.2.3). The HTTP-date form is
/// not used by the broker and is ignored (the backoff applies).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let seconds = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

/// A reply body for an error message: compact JSON when it is JSON, else the text, cut at
/// [`MAX_QUOTED_BODY`] bytes.
fn quote_body(body: &[u8]) -> String {
    if body.is_empty() {
        return "(empty body)".to_string();
    }
    if let Ok(json) = serde_json::from_slice::<Value>(body) {
        return json.to_string();
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(MAX_QUOTED_BODY) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests;
