//! The admin API (PROTOCOL §12), off the hot path: the threads the log holds
//! (`GET /v1/threads`, `GET /v1/threads/{threadId}`) and this node's open event streams
//! (`GET /v1/connections`, `DELETE /v1/connections/{id}`). With authentication on, every
//! request needs a token whose `agui` claim has `"admin": true` (401/403 otherwise).
//!
//! `connections.rs` holds the registry of open streams that subscribes fill.

pub mod connections;

use super::publish::{parse_thread, query_token};
use super::{ApiError, AppState};
use crate::event::ThreadId;
use crate::log::{ListCursor, StreamPos, ThreadSummary};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

/// `limit` of a thread page when none is given.
const DEFAULT_THREADS: usize = 100;
/// `limit` of the connection list when none is given.
const DEFAULT_CONNECTIONS: usize = 1000;
/// The connection list's largest `limit`: one answer stays a few MB at most.
const MAX_CONNECTIONS: usize = 10_000;

/// The query of `GET /v1/threads` (strings, so that a bad value gets an error naming it).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ThreadsQuery {
    prefix: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// The query of `GET /v1/connections`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ConnectionsQuery {
    thread: Option<String>,
    limit: Option<String>,
}

/// Checks the admin claim (PROTOCOL §12; nothing when authentication is off) and parses the
/// query into `Q` (unknown keys, `access_token` among them, are ignored).
///
/// # Errors
/// 401/403; 400 `invalid_query` for a query that does not parse (a repeated key).
fn admin<Q: Default + for<'de> Deserialize<'de>>(
    state: &AppState,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Q, ApiError> {
    state.authorize_admin(headers, query_token(query).as_deref())?;
    match query {
        None => Ok(Q::default()),
        Some(query) => serde_urlencoded::from_str(query).map_err(|e| {
            let message = format!("the query does not parse: {e}");
            let field = super::error::query_field(&message).to_owned();
            invalid_query(&field, message)
        }),
    }
}

fn invalid_query(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message).field(Some(field.into()))
}

/// `limit`: a whole number from 1 to `max`, `default` when absent.
fn parse_limit(raw: Option<&str>, default: usize, max: usize) -> Result<usize, ApiError> {
    match raw {
        None => Ok(default),
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                invalid_query(
                    "limit",
                    format!("limit must be a whole number from 1 to {max}"),
                )
            }),
    }
}

/// `GET /v1/threads?prefix=&limit=&cursor=`: a page of the threads the log holds whose id
/// starts with `prefix`, `{"threads":[…],"nextCursor"}` (`nextCursor` `null` on the last page).
///
/// # Errors
/// 401/403 without the admin claim; 400 `invalid_query` naming `prefix`, `limit` or `cursor`;
/// 503 when the log backend does not answer.
pub(super) async fn threads(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let q: ThreadsQuery = admin(&state, &headers, query.as_deref())?;
    let prefix = q.prefix.unwrap_or_default();
    // A prefix of a thread id is itself one (or empty).
    if !prefix.is_empty() && ThreadId::parse(&prefix).is_err() {
        return Err(invalid_query(
            "prefix",
            "prefix must be empty or up to 128 characters of [A-Za-z0-9._:-]",
        ));
    }
    let limit = parse_limit(
        q.limit.as_deref(),
        DEFAULT_THREADS,
        crate::log::list::MAX_PAGE,
    )?;
    let cursor = match q.cursor.as_deref() {
        None | Some("") => ListCursor::default(),
        Some(raw) => raw
            .parse::<ListCursor>()
            .map_err(|e| invalid_query("cursor", e.to_string()))?,
    };
    let page = state.log.list_threads(&prefix, &cursor, limit).await?;
    let here = state.connections.counts();
    let threads: Vec<Value> = page
        .threads
        .iter()
        .map(|s| {
            let mut row = summary_json(s);
            row["connections"] = here.get(&s.thread).copied().unwrap_or(0).into();
            row
        })
        .collect();
    Ok(Json(json!({
        "threads": threads,
        "nextCursor": page.next.map(|c| c.to_string()),
    })))
}

/// `GET /v1/threads/{threadId}`: one thread's summary, with its current run as the snapshot
/// shows it (PROTOCOL §2) and its open streams on this node.
///
/// # Errors
/// 400 `invalid_thread_id`; 401/403 without the admin claim; 404 `thread_not_found` for a
/// thread whose log holds no event (never written, or expired); 503 when the log backend does
/// not answer.
pub(super) async fn thread(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let Path(raw) = path?;
    // The token (and a query that parses); this route takes no parameter of its own.
    let _: ThreadsQuery = admin(&state, &headers, query.as_deref())?;
    let thread = parse_thread(&raw)?;
    let summary = state.log.summary(&thread).await?;
    if summary.head.last == StreamPos::ZERO {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "thread_not_found",
            format!("thread {thread} has no event"),
        )
        .field(Some("threadId".into())));
    }
    // The fold's view of the run (its `RUN_STARTED`, interrupts); `null` when the fold cannot
    // be rebuilt (PROTOCOL §6).
    let run = state
        .hub
        .snapshot(&thread)
        .await?
        .and_then(|mut s| s.get_mut("run").map(Value::take))
        .unwrap_or(Value::Null);
    let mut out = summary_json(&summary);
    out["epoch"] = summary.head.epoch.to_string().into();
    out["trimmed"] = (summary.head.max_deleted != StreamPos::ZERO).into();
    out["run"] = run;
    out["connections"] = state.connections.count_of(&thread).into();
    Ok(Json(out))
}

/// `{"threadId","lastEventId","lastEventType","runStatus","outcome","eventsRetained"}` of a
/// summary (`runStatus` from the newest event; `outcome` the `RUN_FINISHED`'s `outcome.type`
/// when it has one, e.g. `interrupt`).
fn summary_json(s: &ThreadSummary) -> Value {
    let outcome = s
        .last
        .as_ref()
        .filter(|e| e.event_type == crate::event::EventType::RunFinished)
        .and_then(|e| serde_json::from_slice::<Value>(&e.json).ok())
        .and_then(|v| v.pointer("/outcome/type").cloned())
        .unwrap_or(Value::Null);
    json!({
        "threadId": s.thread.as_str(),
        "lastEventId": s.last_id().map(|id| id.to_string()),
        "lastEventType": s.last.as_ref().map(|e| e.event_type.as_str()),
        "runStatus": s.run_state().map(|r| r.as_str()),
        "outcome": outcome,
        "eventsRetained": s.retained,
    })
}

/// `GET /v1/connections?thread=&limit=`: this node's open event streams, by id,
/// `{"total","connections":[…]}`.
///
/// # Errors
/// 401/403 without the admin claim; 400 `invalid_query` naming `thread` or `limit`.
pub(super) async fn connections(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let q: ConnectionsQuery = admin(&state, &headers, query.as_deref())?;
    let thread = match q.thread.as_deref() {
        None | Some("") => None,
        Some(t) => Some(ThreadId::parse(t).map_err(|e| invalid_query("thread", e.to_string()))?),
    };
    let limit = parse_limit(q.limit.as_deref(), DEFAULT_CONNECTIONS, MAX_CONNECTIONS)?;
    let (listed, total) = state.connections.list(thread.as_ref(), limit);
    Ok(Json(json!({"total": total, "connections": listed})))
}

/// `DELETE /v1/connections/{id}`: ends that stream (with the comment `: agui-fanout: closed by
/// an operator, reconnect`); its client reconnects with its `Last-Event-ID` and resumes
/// exactly. Answers `{"closed": <the connection as listed>}`.
///
/// # Errors
/// 401/403 without the admin claim; 400 `invalid_connection_id`; 404 `connection_not_found`
/// (not open on this node).
pub(super) async fn close(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    // The token (and a query that parses); this route takes no parameter of its own.
    let _: ConnectionsQuery = admin(&state, &headers, query.as_deref())?;
    let id: u64 = path
        .ok()
        .and_then(|Path(raw)| raw.parse().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_connection_id",
                "a connection id is a whole number, as GET /v1/connections lists it",
            )
            .field(Some("id".into()))
        })?;
    match state.connections.close(id) {
        Some(conn) => Ok(Json(json!({ "closed": conn }))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "connection_not_found",
            format!("no stream {id} is open on this node"),
        )
        .field(Some("id".into()))),
    }
}
