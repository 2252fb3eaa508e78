//! `POST /v1/threads/{threadId}/events` (PROTOCOL §2): JSON object or array, NDJSON, or an AG-UI
//! SSE stream piped in. JSON and NDJSON bodies are all-or-nothing (one atomic append); an SSE
//! ingest appends events as they arrive and stops at the first invalid one, saying how many
//! were appended before it.

use super::auth::Action;
use super::{ApiError, AppState};
use crate::event::{ThreadId, ValidEvent, validate_event, validate_value};
use crate::ingest::Producer;
use crate::log::EventId;
use crate::metrics as m;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

/// Most events appended in one round trip by an SSE ingest (what was ready at once).
const INGEST_BATCH: usize = 256;

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
) -> Result<Json<Value>, ApiError> {
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
) -> Result<Json<Value>, ApiError> {
    let thread = parse_thread(thread)?;
    // Before the body is read: a refused producer costs no parsing.
    let token = query_token(query);
    state.authorize_headers(headers, token.as_deref(), &thread, Action::Publish)?;
    let format = body_format(headers)?;
    let producer = producer(headers)?;
    if format == BodyFormat::EventStream {
        return ingest_sse(state, &thread, body, producer).await;
    }
    let bytes = read_body(body, state.config.limits.max_body_bytes).await?;
    let events = match format {
        BodyFormat::Json => parse_json_body(&bytes, &thread, state.config.limits.max_event_bytes)?,
        _ => parse_ndjson_body(&bytes, &thread, state.config.limits.max_event_bytes)?,
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

/// `{"count","firstId","lastId"}`, plus `"duplicates"` when a producer's retry had events
/// already appended (acknowledged, not appended again).
fn reply(
    count: usize,
    first: Option<&EventId>,
    last: Option<&EventId>,
    duplicates: usize,
) -> Value {
    let mut v = json!({
        "count": count,
        "firstId": first.map(ToString::to_string),
        "lastId": last.map(ToString::to_string),
    });
    if duplicates > 0 {
        v["duplicates"] = json!(duplicates);
    }
    v
}

fn count_published(events: &[ValidEvent]) {
    for e in events {
        metrics::counter!(m::PUBLISHED, "type" => e.event_type.as_str()).increment(1);
    }
}

fn too_large(what: &str, limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("{what} exceeds the limit of {limit} bytes"),
    )
}

/// Reads the whole body, refusing more than `limit` bytes with 413.
pub(super) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return too_large("the request body", limit);
            }
            source = err.source();
        }
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "body_error",
            format!("could not read the body: {e}"),
        )
    })
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

/// An SSE ingest: each event's `data` is one AG-UI event; `id:`, `event:`, `retry:` and
/// comments are ignored (AG-UI HTTP binding). Events ready together are appended in one
/// round trip; the first invalid event ends the ingest.
async fn ingest_sse(
    state: &AppState,
    thread: &ThreadId,
    body: Body,
    producer: Option<Producer>,
) -> Result<Json<Value>, ApiError> {
    let max_event = state.config.limits.max_event_bytes;
    let bytes = guard_event_size(body.into_data_stream(), max_event);
    let mut events = bytes.eventsource().ready_chunks(INGEST_BATCH);
    let mut appended = 0usize;
    // Events acknowledged as a producer's earlier appends (not appended again).
    let mut duplicates = 0usize;
    let mut first: Option<EventId> = None;
    let mut last: Option<EventId> = None;
    let fail = |e: ApiError, appended: usize, last: Option<EventId>| {
        e.with("appended", json!(appended))
            .with("lastId", json!(last.map(|id| id.to_string())))
    };
    while let Some(chunk) = events.next().await {
        let mut batch = Vec::with_capacity(chunk.len());
        let mut error = None;
        for item in chunk {
            let index = appended + duplicates + batch.len();
            let ev = match item {
                Ok(ev) => ev,
                Err(e) => {
                    let err = match e {
                        eventsource_stream::EventStreamError::Transport(t) => t,
                        other => ApiError::new(
                            StatusCode::BAD_REQUEST,
                            "invalid_event_stream",
                            other.to_string(),
                        ),
                    };
                    error = Some(err.at(index));
                    break;
                }
            };
            if ev.data.is_empty() {
                continue;
            }
            if ev.data.len() > max_event {
                error = Some(too_large("the event", max_event).at(index));
                break;
            }
            match validate_event(ev.data.as_bytes(), Some(thread)) {
                Ok(v) => batch.push(v),
                Err(e) => {
                    error = Some(ApiError::invalid_event(e.message, e.field).at(index));
                    break;
                }
            }
        }
        if !batch.is_empty() {
            // The producer numbers events from the ingest's first one.
            let batch_producer = producer.as_ref().map(|p| Producer {
                id: p.id.clone(),
                seq: p.seq + (appended + duplicates) as u64,
            });
            match state
                .ingest
                .append(thread, &batch, batch_producer.as_ref())
                .await
            {
                Ok(done) => {
                    let ids = done.ids;
                    count_published(&batch[done.duplicates..]);
                    duplicates += done.duplicates;
                    appended += ids.len();
                    first = first.or(ids.first().copied());
                    last = ids.last().copied().or(last);
                }
                Err(e) => {
                    // The index of an order rejection counts from the start of the ingest.
                    return Err(fail(
                        ApiError::from(e).offset_index(appended + duplicates),
                        appended,
                        last,
                    ));
                }
            }
        }
        if let Some(e) = error {
            return Err(fail(e, appended, last));
        }
    }
    Ok(Json(reply(
        appended,
        first.as_ref(),
        last.as_ref(),
        duplicates,
    )))
}

/// Fails the byte stream when more than `limit` (+ framing slack) bytes arrive without a
/// blank line, so one oversized event cannot make the SSE parser buffer without bound. The
/// complete events before the oversized one still pass (an ingest appends as it arrives).
fn guard_event_size(
    body: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
    limit: usize,
) -> impl Stream<Item = Result<Bytes, ApiError>> + Send + 'static {
    let cap = limit + 1024;
    // Bytes since the last blank line, and length of the current line so far.
    let mut since_boundary = 0usize;
    let mut line_len = 0usize;
    let mut failed = false;
    let mut first = true;
    // The bytes of a UTF-8 sequence split across chunks (at most 3).
    let mut utf8_tail: Vec<u8> = Vec::new();
    body.map(move |chunk| {
        if failed {
            return Vec::new();
        }
        let mut chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                failed = true;
                return vec![Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "body_error",
                    format!("could not read the body: {e}"),
                ))];
            }
        };
        if first {
            // A UTF-8 BOM is tolerated (WHATWG SSE strips it); removed here because the SSE
            // parser crate mishandles it.
            first = false;
            if chunk.starts_with(b"\xEF\xBB\xBF") {
                chunk = chunk.slice(3..);
            }
        }
        // The stream must be UTF-8 (WHATWG SSE): refuse a bad byte at once, since the parser
        // would otherwise buffer everything after it until the end of the body.
        if let Err(e) = check_utf8(&mut utf8_tail, &chunk) {
            failed = true;
            return vec![Err(e)];
        }
        let mut start = 0;
        // Offset just after the last blank line in this chunk.
        let mut boundary = 0;
        for nl in memchr::memchr_iter(b'\n', &chunk) {
            let seg = nl - start;
            line_len += seg;
            since_boundary += seg + 1;
            // An empty line (possibly "\r") ends an event.
            let empty =
                line_len == 0 || (line_len == 1 && chunk.get(nl.wrapping_sub(1)) == Some(&b'\r'));
            if empty {
                since_boundary = 0;
                boundary = nl + 1;
            }
            line_len = 0;
            start = nl + 1;
        }
        line_len += chunk.len() - start;
        since_boundary += chunk.len() - start;
        if since_boundary > cap {
            failed = true;
            let mut out = Vec::with_capacity(2);
            if boundary > 0 {
                out.push(Ok(chunk.slice(..boundary)));
            }
            out.push(Err(too_large("the event", limit)));
            out
        } else {
            vec![Ok(chunk)]
        }
    })
    .flat_map(futures::stream::iter)
}

/// Checks that `chunk`, after the incomplete sequence `tail` left by the previous chunk, is
/// UTF-8; keeps a sequence this chunk leaves incomplete in `tail`.
fn check_utf8(tail: &mut Vec<u8>, chunk: &[u8]) -> Result<(), ApiError> {
    let joined;
    let bytes: &[u8] = if tail.is_empty() {
        chunk
    } else {
        joined = [tail.as_slice(), chunk].concat();
        &joined
    };
    match std::str::from_utf8(bytes) {
        Ok(_) => {
            tail.clear();
            Ok(())
        }
        Err(e) if e.error_len().is_none() => {
            *tail = bytes[e.valid_up_to()..].to_vec();
            Ok(())
        }
        Err(_) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_event_stream",
            "the event stream is not valid UTF-8",
        )),
    }
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

    #[tokio::test]
    async fn size_guard_trips_only_without_boundaries() {
        let ok: Vec<Result<Bytes, axum::Error>> = (0..100)
            .map(|_| {
                Ok(Bytes::from_static(
                    b"data: {\"type\":\"RAW\",\"event\":1}\n\n",
                ))
            })
            .collect();
        let out: Vec<_> = guard_event_size(futures::stream::iter(ok), 64)
            .collect()
            .await;
        assert!(out.iter().all(Result::is_ok));
        let big: Vec<Result<Bytes, axum::Error>> =
            (0..100).map(|_| Ok(Bytes::from(vec![b'x'; 100]))).collect();
        let out: Vec<_> = guard_event_size(futures::stream::iter(big), 64)
            .collect()
            .await;
        assert!(out.iter().any(Result::is_err));
    }
}
