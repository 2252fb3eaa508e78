//! `GET /v1/threads/{threadId}/events` (PROTOCOL §2–§4): an SSE stream of the thread's events,
//! resumed with `Last-Event-ID` (header, or `?lastEventId=` for clients that cannot set
//! headers; the header wins, since `EventSource` sends it on reconnect while the URL keeps the
//! first id), or from the start with `?from=start`.

use super::admin::connections::StartKind;
use super::auth::{Action, Credentials};
use super::publish::parse_thread;
use super::{ApiError, AppState};
use crate::hub::{Outcome, Start};
use crate::log::ResumeId;
use crate::metrics as m;
use crate::queue::ConnQueue;
use crate::sse;
use crate::stream::{self, Guard, StreamSettings};
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

/// Query parameters of a subscription.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SubscribeQuery {
    /// Resume point for clients that cannot set `Last-Event-ID`.
    pub last_event_id: Option<String>,
    /// `start`: the retained log from its first event on (empty: absent; anything else: 400).
    pub from: Option<String>,
    /// A bearer token (RFC 6750 §2.3), for clients that cannot set `Authorization` (PROTOCOL §8).
    #[serde(rename = "access_token")]
    pub access_token: Option<String>,
}

/// What a subscribe request opens.
pub(crate) enum Opened {
    /// A stream: the queue to drain, the frames it starts with (comments, a prelude), the
    /// hub's registration guard (dropping it unregisters the subscriber), and its settings.
    Stream {
        /// The connection's queue.
        queue: Arc<ConnQueue>,
        /// Frames written after `retry:` and before the queue's.
        prefix: Vec<Bytes>,
        /// Unregisters the subscriber when dropped.
        guard: Guard,
        /// `retry:` and heartbeat settings.
        settings: StreamSettings,
    },
    /// No stream now (the log backend is down, or the node is draining): a complete, short
    /// event stream (`retry:` and a comment, no `id:`) that makes `EventSource` come back later
    /// with its `Last-Event-ID` unchanged, where an error status would stop it for good.
    Unavailable(Bytes),
}

/// The subscribe handler (hyper's path: HTTP/2, and HTTP/1 requests that `http::conn` hands
/// over; the common HTTP/1 request is served by `http::conn` with [`open`] as well).
pub(super) async fn subscribe(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<SubscribeQuery>, QueryRejection>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(thread) = path?;
    let Query(query) = query?;
    let header_id = headers.get("last-event-id").map(|v| v.as_bytes());
    let granted = state.authorize_headers(
        &headers,
        query.access_token.as_deref(),
        &parse_thread(&thread)?,
        Action::Subscribe,
    )?;
    match open(
        &state,
        &thread,
        header_id,
        query,
        granted.and_then(|g| g.expires),
        peer.map(|axum::Extension(ConnectInfo(addr))| addr),
    )
    .await?
    {
        Opened::Stream {
            queue,
            prefix,
            guard,
            settings,
        } => {
            let body = stream::body(queue, prefix, settings, guard);
            Ok(sse_response(Body::from_stream(body)))
        }
        Opened::Unavailable(body) => Ok(sse_response(Body::from(body))),
    }
}

/// Checks a front-served subscribe's token (PROTOCOL §8): [`AppState::authorize`] with the
/// request's `Authorization` and `Cookie` values and the query's `access_token`; the token's
/// expiry, if any.
///
/// # Errors
/// 400 `invalid_thread_id`, 401 `unauthorized`, 403 `forbidden`.
pub(crate) fn authorize_front(
    state: &AppState,
    thread: &str,
    authorization: Option<&[u8]>,
    cookie: Option<&[u8]>,
    query: &SubscribeQuery,
) -> Result<Option<SystemTime>, ApiError> {
    if state.auth.is_none() {
        return Ok(None);
    }
    let cookies: Vec<&[u8]> = cookie.into_iter().collect();
    let credentials = Credentials {
        authorization,
        query_token: query.access_token.as_deref(),
        cookies: &cookies,
    };
    let granted = state.authorize(credentials, &parse_thread(thread)?, Action::Subscribe)?;
    Ok(granted.and_then(|g| g.expires))
}

/// Opens a subscription (PROTOCOL §2–§4), once its token was checked: checks the thread id and
/// the node's state, parses the resume point, registers with the hub and collects the frames
/// the stream starts with. `header_id` is the raw `Last-Event-ID` header, if any; `expires`
/// the token's expiry, when the stream ends (PROTOCOL §8); `remote` the client's address, for
/// the admin API's list of connections (PROTOCOL §12), where the stream is registered while
/// it is open.
///
/// A draining node opens no stream (PROTOCOL §9): it answers `200` with a short jittered
/// `retry:` ([`stream::drain_retry_ms`]) and a comment, and ends at once, so that the client
/// reconnects (to a ready node, through the load balancer) within a few seconds with its
/// `Last-Event-ID`: a native `EventSource` never reconnects after a non-200 answer.
///
/// # Errors
/// 400 `invalid_thread_id`; 400 `invalid_query` naming `from` for a `from` other than `start`.
pub(crate) async fn open(
    state: &AppState,
    thread: &str,
    header_id: Option<&[u8]>,
    query: SubscribeQuery,
    expires: Option<SystemTime>,
    remote: Option<SocketAddr>,
) -> Result<Opened, ApiError> {
    let thread = parse_thread(thread)?;
    // Any other value was a typo or a position this API does not take: silently streaming
    // from the head instead would hide it.
    if let Some(from) = query
        .from
        .as_deref()
        .filter(|f| !f.is_empty() && *f != "start")
    {
        let shown: String = from.chars().take(80).collect();
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("from must be \"start\" (or absent), got {shown:?}"),
        )
        .field(Some("from".into())));
    }
    if state.draining.load(Ordering::Relaxed) {
        return Ok(Opened::Unavailable(draining_answer(
            state.config.sse.retry_ms,
        )));
    }
    let header_id = header_id.map(|v| String::from_utf8_lossy(v).into_owned());
    // An empty header (what a client sends before it has an id) does not hide the query's.
    let raw_id = header_id
        .filter(|s| !s.is_empty())
        .or(query.last_event_id.filter(|s| !s.is_empty()));
    let mut prefix: Vec<Bytes> = Vec::new();
    let mut malformed = false;
    let start = match raw_id {
        Some(raw) => match raw.parse::<ResumeId>() {
            Ok(ResumeId::Event(id)) => Start::After(id),
            Ok(ResumeId::InsideBridge(id)) => Start::InsideBridge(id),
            Err(_) => {
                // Never a 4xx for a bad id: a native EventSource would not retry (PROTOCOL §4.3).
                let shown: String = raw.chars().take(80).collect();
                tracing::info!(%thread, id = %shown, "malformed Last-Event-ID; prelude at the head");
                metrics::counter!(m::RESUMES, "outcome" => "prelude").increment(1);
                metrics::counter!(m::RESETS, "cause" => "invalid").increment(1);
                prefix.push(sse::encode_comment(
                    "agui-fanout: malformed Last-Event-ID, starting at the head",
                ));
                malformed = true;
                Start::Live
            }
        },
        None if query.from.as_deref() == Some("start") => Start::FromStart,
        None => Start::Live,
    };
    let settings = StreamSettings {
        retry_ms: state.config.sse.retry_ms,
        heartbeat: state.config.sse.heartbeat,
        write_timeout: state.config.sse.write_timeout,
        // An expiry too far ahead for the clock (centuries) is no end.
        ends_at: expires.and_then(|at| {
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::Instant::now().checked_add(left)
        }),
        max_age_at: state
            .config
            .sse
            .max_stream_age
            .filter(|age| !age.is_zero())
            .and_then(|age| tokio::time::Instant::now().checked_add(stream::stream_age_limit(age))),
    };
    let sub = match state.hub.subscribe(&thread, start).await {
        Ok(sub) => sub,
        Err(e) => {
            tracing::warn!(%thread, error = %e, "cannot start a subscription");
            let body = [
                sse::encode_retry(state.config.sse.retry_ms),
                sse::encode_comment("agui-fanout: log backend unavailable, retry later"),
            ]
            .concat();
            return Ok(Opened::Unavailable(Bytes::from(body)));
        }
    };
    match (start, sub.outcome) {
        (Start::After(_), Outcome::Exact) => {
            metrics::counter!(m::RESUMES, "outcome" => "exact").increment(1);
        }
        (_, Outcome::Unresumable(gap)) => {
            tracing::info!(%thread, reason = gap.as_str(), "Last-Event-ID cannot be resumed exactly; prelude at the head");
            metrics::counter!(m::RESUMES, "outcome" => "prelude").increment(1);
            metrics::counter!(m::RESETS, "cause" => gap.as_str()).increment(1);
            prefix.push(sse::encode_comment(&format!(
                "agui-fanout: Last-Event-ID not resumable ({}), starting at the head",
                gap.as_str()
            )));
        }
        (_, Outcome::EpochStart) => {
            tracing::info!(%thread, "Last-Event-ID of another epoch; the new epoch from its first event");
            metrics::counter!(m::RESUMES, "outcome" => "prelude").increment(1);
            metrics::counter!(m::RESETS, "cause" => "epoch").increment(1);
            prefix.push(sse::encode_comment(
                "agui-fanout: Last-Event-ID not resumable (epoch), starting at the log's first event",
            ));
        }
        (_, Outcome::ForkPoint(gap)) => {
            tracing::info!(%thread, reason = gap.as_str(), "Last-Event-ID not held by the log; prelude at the fork point, then every later event");
            metrics::counter!(m::RESUMES, "outcome" => "prelude").increment(1);
            metrics::counter!(m::RESETS, "cause" => gap.as_str()).increment(1);
            prefix.push(sse::encode_comment(&format!(
                "agui-fanout: Last-Event-ID not resumable ({}), prelude at the last event the log holds before it, then every later event",
                gap.as_str()
            )));
        }
        (_, Outcome::StartTrimmed) => {
            prefix.push(sse::encode_comment(
                "agui-fanout: log trimmed, from=start begins at the head",
            ));
        }
        _ => {}
    }
    if !sub.fold_known && sub.prelude.is_none() && start != Start::FromStart {
        // Without a fold (log trimmed and no checkpoint) the stream can only start live.
        tracing::warn!(%thread, "the thread's fold cannot be rebuilt; stream starts live without a prelude");
        prefix.push(sse::encode_comment(
            "agui-fanout: no snapshot available, starting live",
        ));
    }
    if let Some(prelude) = sub.prelude {
        prefix.push(prelude.bytes);
    }
    let kind = match (start, sub.outcome) {
        _ if malformed => StartKind::Prelude,
        (_, Outcome::Unresumable(_) | Outcome::StartTrimmed | Outcome::ForkPoint(_)) => {
            StartKind::Prelude
        }
        (_, Outcome::EpochStart) => StartKind::Epoch,
        (Start::After(_), Outcome::Exact) => StartKind::Exact,
        (Start::FromStart, Outcome::Exact) => StartKind::FromStart,
        (Start::Live | Start::InsideBridge(_), Outcome::Exact) => StartKind::New,
    };
    let registered = state
        .connections
        .register(thread, remote, kind, sub.queue.clone());
    Ok(Opened::Stream {
        queue: sub.queue,
        prefix,
        // Dropped with the stream: the hub's registration first, then the admin list's.
        guard: Box::new((sub.guard, registered)),
        settings,
    })
}

/// The whole event stream a draining node answers a subscribe with: a short jittered `retry:`
/// and a comment; no `id:`, so the client's `Last-Event-ID` stays what it was.
fn draining_answer(retry_ms: u64) -> Bytes {
    let mut body = sse::encode_retry(stream::drain_retry_ms(retry_ms)).to_vec();
    body.extend_from_slice(&sse::encode_comment(
        "agui-fanout: node draining, reconnect",
    ));
    Bytes::from(body)
}

/// Headers of every event-stream response (PROTOCOL §3), after the status line. `x-accel-buffering`
/// keeps nginx-style proxies from buffering the stream.
pub(crate) const SSE_HEADERS: [(&str, &str); 3] = [
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache, no-transform"),
    ("x-accel-buffering", "no"),
];

fn sse_response(body: Body) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    for (name, value) in SSE_HEADERS {
        h.insert(name, HeaderValue::from_static(value));
    }
    resp
}
