//! `POST /v1/threads/{threadId}/events` (PROTOCOL §2): JSON object or array, NDJSON, or an AG-UI
//! SSE stream piped in. JSON and NDJSON bodies are all-or-nothing (one atomic append); an SSE
//! ingest (`ingest_sse`) appends events as they arrive and stops at the first invalid one,
//! saying how many were appended before it.

use super::auth::Action;
use super::body::{self, too_large};
use super::{ApiError, AppState};
use crate::event::{EventType, ThreadId, ValidEvent, validate_event, validate_value};
use crate::ingest::Producer;
use crate::log::EventId;
use crate::metrics as m;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::Value;

/// The body formats publish accepts, from `Content-Type` (parameters such as `charset` ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyFormat {
    Json,
    Ndjson,
    EventStream,
}

fn body_format(headers: &HeaderMap) -> Result<BodyFormat, ApiError> {
    let raw = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = raw
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Ok(BodyFormat::Json),
        "application/x-ndjson" => Ok(BodyFormat::Ndjson),
        "text/event-stream" => Ok(BodyFormat::EventStream),
        _ => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "Content-Type must be application/json, application/x-ndjson or text/event-stream (got {raw:?})"
            ),
        )),
    }
}

/// The `access_token` query parameter (RFC 6750 §2.3), if the query has one and parses.
pub(super) fn query_token(query: Option<&str>) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct TokenQuery {
        access_token: Option<String>,
    }
    let q: TokenQuery = serde_urlencoded::from_str(query?).ok()?;
    q.access_token
}

/// Parses the `{threadId}` path segment (PROTOCOL §1).
///
/// # Errors
/// 400 `invalid_thread_id` naming the field `threadId`.
pub(super) fn parse_thread(raw: &str) -> Result<ThreadId, ApiError> {
    ThreadId::parse(raw).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_thread_id", e.to_string())
            .field(Some("threadId".into()))
    })
}

/// The publish handler. Replies `200 {"count","firstId","lastId"}`.
pub(super) async fn publish(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Reply>, ApiError> {
    let Path(thread) = path?;
    let result = publish_inner(&state, &thread, query.as_deref(), &headers, body).await;
    match &result {
        Ok(_) => {}
        Err(e) => {
            metrics::counter!(m::REJECTED, "reason" => e.reason()).increment(1);
        }
    }
    result
}

async fn publish_inner(
    state: &AppState,
    thread: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Json<Reply>, ApiError> {
    let thread = parse_thread(thread)?;
    // Before the body is read: a refused producer costs no parsing.
    let token = query_token(query);
    state.authorize_headers(headers, token.as_deref(), &thread, Action::Publish)?;
    let format = body_format(headers)?;
    let producer = producer(headers)?;
    if format == BodyFormat::EventStream {
        return super::ingest_sse::ingest(state, &thread, body, producer).await;
    }
    // Held (with its share of the node's body budget) until the publish is answered.
    let held = body::read_whole(body, headers, &state.config.limits, &state.bodies).await?;
    let bytes = &held.bytes;
    let events = match format {
        BodyFormat::Json => parse_json_body(bytes, &thread, state.config.limits.max_event_bytes)?,
        _ => parse_ndjson_body(bytes, &thread, state.config.limits.max_event_bytes)?,
    };
    if events.is_empty() {
        return Err(ApiError::invalid_event("the body holds no event", None));
    }
    let appended = state
        .ingest
        .append(&thread, &events, producer.as_ref())
        .await?;
    let ids = &appended.ids;
    count_published(&events[appended.duplicates..]);
    Ok(Json(reply(
        ids.len(),
        ids.first(),
        ids.last(),
        appended.duplicates,
    )))
}

/// Largest `X-Producer-Seq` accepted: 2^63 − 1.
const MAX_PRODUCER_SEQ: u64 = i64::MAX as u64;

/// `X-Producer-Id` and `X-Producer-Seq` (PROTOCOL §2 idempotent retries): both or neither.
///
/// # Errors
/// 400 `invalid_producer` naming the header.
fn producer(headers: &HeaderMap) -> Result<Option<Producer>, ApiError> {
    let get = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let bad = |field: &str, message: &str| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_producer", message)
            .field(Some(field.into()))
    };
    match (get("x-producer-id"), get("x-producer-seq")) {
        (None, None) => Ok(None),
        (Some(id), Some(seq)) => {
            ThreadId::parse(id).map_err(|e| {
                bad(
                    "X-Producer-Id",
                    &format!(
                        "X-Producer-Id: {}",
                        e.to_string().replace("threadId", "the id")
                    ),
                )
            })?;
            // Numbers start at 1 (the stored mark 0 means "nothing appended yet"), and stay
            // below 2^63 so that a batch's or an ingest stream's numbers cannot overflow.
            let seq: u64 = seq
                .parse()
                .ok()
                .filter(|n| (1..=MAX_PRODUCER_SEQ).contains(n))
                .ok_or_else(|| {
                    bad(
                        "X-Producer-Seq",
                        "X-Producer-Seq must be an integer from 1 to 9223372036854775807",
                    )
                })?;
            Ok(Some(Producer {
                id: id.to_string(),
                seq,
            }))
        }
        (Some(_), None) => Err(bad("X-Producer-Seq", "X-Producer-Id needs X-Producer-Seq")),
        (None, Some(_)) => Err(bad("X-Producer-Id", "X-Producer-Seq needs X-Producer-Id")),
    }
}

/// A publish's `200` body: `{"count","firstId","lastId"}`, plus `"duplicates"` when a
/// producer's retry had events already appended (acknowledged, not appended again). Typed
/// rather than a `json!` value: one is built per publish, and the map and its id strings cost
/// ~3 % of a published event's path (loadtest/REPORT.md, session 8).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Reply {
    count: usize,
    #[serde(serialize_with = "id_text")]
    first_id: Option<EventId>,
    #[serde(serialize_with = "id_text")]
    last_id: Option<EventId>,
    #[serde(skip_serializing_if = "is_zero")]
    duplicates: usize,
}

fn id_text<S: serde::Serializer>(id: &Option<EventId>, s: S) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => s.serialize_str(&id.text()),
        None => s.serialize_none(),
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The [`Reply`] of a publish that appended `count` events (`first` to `last`) after skipping
/// `duplicates`.
pub(super) fn reply(
    count: usize,
    first: Option<&EventId>,
    last: Option<&EventId>,
    duplicates: usize,
) -> Reply {
    Reply {
        count,
        first_id: first.copied(),
        last_id: last.copied(),
        duplicates,
    }
}

pub(super) fn count_published(events: &[ValidEvent]) {
    static PUBLISHED: m::CounterTable =
        m::CounterTable::new(m::PUBLISHED, "type", EventType::NAMES);
    for e in events {
        PUBLISHED.increment(e.event_type as usize, 1);
    }
}

fn check_size(ev: &ValidEvent, index: Option<usize>, limit: usize) -> Result<(), ApiError> {
    if ev.json.len() > limit {
        let e = too_large("the event", limit);
        return Err(match index {
            Some(i) => e.at(i),
            None => e,
        });
    }
    Ok(())
}

/// A JSON body: one event object, or an array of events (all validated before any append).
fn parse_json_body(
    bytes: &[u8],
    thread: &ThreadId,
    max_event: usize,
) -> Result<Vec<ValidEvent>, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("malformed JSON: {e}"),
        )
    })?;
    match value {
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let ev = validate_value(item, Some(thread))
                    .map_err(|e| ApiError::invalid_event(e.message, e.field).at(i))?;
                check_size(&ev, Some(i), max_event)?;
                Ok(ev)
            })
            .collect(),
        Value::Object(_) => {
            let ev = validate_value(value, Some(thread))
                .map_err(|e| ApiError::invalid_event(e.message, e.field))?;
            check_size(&ev, None, max_event)?;
            Ok(vec![ev])
        }
        _ => Err(ApiError::invalid_event(
            "the body must be an event object or an array of event objects",
            None,
        )),
    }
}

/// An NDJSON body: one event object per line; blank lines are ignored.
fn parse_ndjson_body(
    bytes: &[u8],
    thread: &ThreadId,
    max_event: usize,
) -> Result<Vec<ValidEvent>, ApiError> {
    let mut events = Vec::new();
    for line in bytes.split(|b| *b == b'\n') {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let i = events.len();
        if line.len() > max_event {
            return Err(too_large("the event", max_event).at(i));
        }
        let ev = validate_event(line, Some(thread))
            .map_err(|e| ApiError::invalid_event(e.message, e.field).at(i))?;
        events.push(ev);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        assert_eq!(
            body_format(&h).unwrap_err().status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        h.insert(
            header::CONTENT_TYPE,
            "Application/JSON; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(body_format(&h).unwrap(), BodyFormat::Json);
        h.insert(
            header::CONTENT_TYPE,
            "application/x-ndjson".parse().unwrap(),
        );
        assert_eq!(body_format(&h).unwrap(), BodyFormat::Ndjson);
        h.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        assert_eq!(body_format(&h).unwrap(), BodyFormat::EventStream);
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(body_format(&h).is_err());
    }

    #[test]
    fn reply_bytes() {
        let first: EventId = "0a1b2c3d-1764500000000-5".parse().expect("an id");
        let last: EventId = "0a1b2c3d-1764500000000-7".parse().expect("an id");
        let text = |r: Reply| serde_json::to_string(&r).expect("serialisable");
        assert_eq!(
            text(reply(3, Some(&first), Some(&last), 0)),
            r#"{"count":3,"firstId":"0a1b2c3d-1764500000000-5","lastId":"0a1b2c3d-1764500000000-7"}"#
        );
        assert_eq!(
            text(reply(0, None, None, 2)),
            r#"{"count":0,"firstId":null,"lastId":null,"duplicates":2}"#
        );
    }
}
