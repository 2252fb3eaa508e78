//! `POST /v1/threads/{threadId}/events` (PROTOCOL §2): JSON object or array, NDJSON, or an AG-UI
//! SSE stream piped in. JSON and NDJSON bodies are all-or-nothing (one atomic append); an SSE
//! ingest (`ingest_sse`) appends events as they arrive and stops at the first invalid one,
//! saying how many were appended before it.

use super::auth::{Action, Credentials};
use super::body::{self, HeldBody, too_large};
use super::{ApiError, AppState, head};
use crate::event::validate::{
    ParseError, parse_received, validate_content, validate_content_batch, validate_elements,
};
use crate::event::{EventType, ThreadId, ValidEvent, validate_parsed};
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
pub(super) enum BodyFormat {
    /// `application/json`: one event object or an array of them.
    Json,
    /// `application/x-ndjson`: one event object per line.
    Ndjson,
    /// `text/event-stream`: an AG-UI SSE stream piped in (`ingest_sse`).
    EventStream,
}

/// The body format a raw `Content-Type` value names.
///
/// # Errors
/// 415 `unsupported_media_type` for anything else (or no header).
pub(super) fn body_format(content_type: Option<&[u8]>) -> Result<BodyFormat, ApiError> {
    let raw = content_type.and_then(head::text).unwrap_or("");
    let essence = raw.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(BodyFormat::Json)
    } else if essence.eq_ignore_ascii_case("application/x-ndjson") {
        Ok(BodyFormat::Ndjson)
    } else if essence.eq_ignore_ascii_case("text/event-stream") {
        Ok(BodyFormat::EventStream)
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "Content-Type must be application/json, application/x-ndjson or text/event-stream (got {raw:?})"
            ),
        ))
    }
}

/// What a publish reads of its request head, whichever side parsed it (hyper for the router,
/// or the connection front, `publish_front`): the raw value of the first of each header, and
/// every `Cookie`.
#[derive(Debug, Default)]
pub(super) struct PublishHead<'a> {
    /// `Authorization`.
    pub authorization: Option<&'a [u8]>,
    /// Every `Cookie` (only read when authentication is on).
    pub cookies: Vec<&'a [u8]>,
    /// `Content-Type`.
    pub content_type: Option<&'a [u8]>,
    /// `X-Producer-Id` and `X-Producer-Seq`.
    pub producer_id: Option<&'a [u8]>,
    /// See `producer_id`.
    pub producer_seq: Option<&'a [u8]>,
}

impl<'a> PublishHead<'a> {
    fn of(headers: &'a HeaderMap, auth: bool) -> Self {
        let get = |name| headers.get(name).map(|v| v.as_bytes());
        PublishHead {
            authorization: get(header::AUTHORIZATION.as_str()),
            cookies: if auth {
                headers
                    .get_all(header::COOKIE)
                    .iter()
                    .map(|v| v.as_bytes())
                    .collect()
            } else {
                Vec::new()
            },
            content_type: get(header::CONTENT_TYPE.as_str()),
            producer_id: get("x-producer-id"),
            producer_seq: get("x-producer-seq"),
        }
    }
}

/// A publish whose head passed its checks (thread id, token, format, producer): what its
/// body is appended with.
#[derive(Debug)]
pub(super) struct Checked {
    /// The thread.
    pub thread: ThreadId,
    /// The body's format.
    pub format: BodyFormat,
    /// The producer of an idempotent publish.
    pub producer: Option<Producer>,
}

/// A publish's checks before its body is read, in the order answered: the `{threadId}` path
/// segment `thread` (percent-decoded), the token (`Authorization`, cookies, the `query`'s
/// `access_token`; PROTOCOL §8), `Content-Type`, the producer headers.
///
/// # Errors
/// 400 `invalid_thread_id`, 401/403, 415 `unsupported_media_type`, 400 `invalid_producer`.
pub(super) fn check_head(
    state: &AppState,
    thread: &str,
    query: Option<&str>,
    head: &PublishHead<'_>,
) -> Result<Checked, ApiError> {
    let thread = parse_thread(thread)?;
    // Before the body is read: a refused producer costs no parsing.
    if state.auth.is_some() {
        let token = query_token(query);
        let credentials = Credentials {
            authorization: head.authorization,
            query_token: token.as_deref(),
            cookies: &head.cookies,
        };
        state.authorize(credentials, &thread, Action::Publish)?;
    }
    let format = body_format(head.content_type)?;
    let producer = producer(head.producer_id, head.producer_seq)?;
    Ok(Checked {
        thread,
        format,
        producer,
    })
}

/// Appends a JSON or NDJSON body read whole (all-or-nothing) and counts the events.
///
/// # Errors
/// 400 `invalid_json` / `invalid_event` (with the event's `index`), 413 `too_large` for an
/// event over `limits.max_event_bytes`, the order rules' and the log's errors.
pub(super) async fn append_body(
    state: &AppState,
    checked: &Checked,
    held: HeldBody,
) -> Result<Reply, ApiError> {
    let (bytes, thread) = (&held.bytes, &checked.thread);
    let max_event = state.config.limits.max_event_bytes;
    let events = match checked.format {
        BodyFormat::Json => parse_json_body(bytes, thread, max_event)?,
        _ => parse_ndjson_body(bytes, thread, max_event)?,
    };
    if events.is_empty() {
        return Err(ApiError::invalid_event("the body holds no event", None));
    }
    let appended = state
        .ingest
        .append(thread, &events, checked.producer.as_ref())
        .await?;
    // The body's share of the node's budget is given back once the append is done.
    drop(held);
    let ids = &appended.ids;
    count_published(&events[appended.duplicates..]);
    Ok(reply(
        ids.len(),
        ids.first(),
        ids.last(),
        appended.duplicates,
    ))
}

/// Counts a refused publish in `agui_publish_rejected_total` by its reason.
pub(super) fn count_rejected(e: &ApiError) {
    metrics::counter!(m::REJECTED, "reason" => e.reason()).increment(1);
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
    if let Err(e) = &result {
        count_rejected(e);
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
    let head = PublishHead::of(headers, state.auth.is_some());
    let checked = check_head(state, thread, query, &head)?;
    if checked.format == BodyFormat::EventStream {
        return super::ingest_sse::ingest(state, &checked.thread, body, checked.producer).await;
    }
    // Held (with its share of the node's body budget) until the append is done.
    let held = body::read_whole(body, headers, &state.config.limits, &state.bodies).await?;
    append_body(state, &checked, held).await.map(Json)
}

/// Largest `X-Producer-Seq` accepted: 2^63 − 1.
const MAX_PRODUCER_SEQ: u64 = i64::MAX as u64;

/// `X-Producer-Id` and `X-Producer-Seq` (PROTOCOL §2 idempotent retries), raw: both or neither.
///
/// # Errors
/// 400 `invalid_producer` naming the header.
fn producer(id: Option<&[u8]>, seq: Option<&[u8]>) -> Result<Option<Producer>, ApiError> {
    fn text(v: &[u8]) -> &str {
        head::text(v).unwrap_or("\u{fffd}")
    }
    let bad = |field: &str, message: &str| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_producer", message)
            .field(Some(field.into()))
    };
    match (id.map(text), seq.map(text)) {
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
    // A token delta, most publishes: validated without a value.
    if let Some(ev) = validate_content(bytes) {
        check_size(&ev, None, max_event)?;
        return Ok(vec![ev]);
    }
    // A batch of them (a producer sending its token deltas in groups), the same way.
    if let Some(events) = validate_content_batch(bytes) {
        for (i, ev) in events.iter().enumerate() {
            check_size(ev, Some(i), max_event)?;
        }
        return Ok(events);
    }
    let value = parse_received(bytes).map_err(parse_refusal)?;
    match value {
        // Each element keeps its received bytes when they are the compact form.
        Value::Array(items) => validate_elements(items, bytes, Some(thread))
            .enumerate()
            .map(|(i, ev)| {
                let ev = ev.map_err(|e| ApiError::invalid_event(e.message, e.field).at(i))?;
                check_size(&ev, Some(i), max_event)?;
                Ok(ev)
            })
            .collect(),
        Value::Object(_) => {
            let ev = validate_parsed(value, bytes, Some(thread))
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

/// A body or NDJSON line that did not parse: 400 `invalid_json` when it is not JSON, as in
/// either format; `invalid_event` when it names the reserved member.
fn parse_refusal(e: ParseError) -> ApiError {
    match e {
        ParseError::Malformed(_) => {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string())
        }
        ParseError::Reserved(_) => ApiError::invalid_event(e.to_string(), None),
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
        if let Some(ev) = validate_content(line) {
            events.push(ev);
            continue;
        }
        let value = parse_received(line).map_err(|e| parse_refusal(e).at(i))?;
        let ev = validate_parsed(value, line, Some(thread))
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
        let format = |v: &[u8]| body_format(Some(v));
        assert_eq!(
            body_format(None).unwrap_err().status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        assert_eq!(
            format(b"Application/JSON; charset=utf-8").unwrap(),
            BodyFormat::Json
        );
        assert_eq!(format(b"application/x-ndjson").unwrap(), BodyFormat::Ndjson);
        assert_eq!(
            format(b"text/event-stream").unwrap(),
            BodyFormat::EventStream
        );
        assert!(format(b"text/plain").is_err());
        // Not visible ASCII: refused as hyper's `HeaderValue::to_str` would read it (empty).
        let e = format(b"application/json\xff").unwrap_err();
        assert!(e.to_string().contains(r#"(got "")"#), "{e}");
    }

    #[test]
    fn producer_headers() {
        assert!(producer(None, None).unwrap().is_none());
        let p = producer(Some(b"worker-1"), Some(b"7")).unwrap().unwrap();
        assert_eq!((p.id.as_str(), p.seq), ("worker-1", 7));
        for (id, seq, field) in [
            (Some(&b"worker-1"[..]), None, "X-Producer-Seq"),
            (None, Some(&b"7"[..]), "X-Producer-Id"),
            (Some(&b"worker-1"[..]), Some(&b"0"[..]), "X-Producer-Seq"),
            (Some(&b"w\xff"[..]), Some(&b"1"[..]), "X-Producer-Id"),
        ] {
            let e = producer(id, seq).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST);
            assert_eq!(e.field_name(), Some(field), "{e}");
        }
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

    /// A body's events keep their received bytes when those are the compact form, one by
    /// one in a batch; the others are written compactly; both say the same.
    #[test]
    fn events_keep_their_compact_bytes() {
        let thread = ThreadId::parse("t").expect("a thread id");
        let compact = r#"{"type":"CUSTOM","name":"a","value":{"x":[1,2.50]}}"#;
        let spaced = r#"{ "type": "CUSTOM", "name": "b", "value": "\u00e9" }"#;
        let json = |events: Vec<ValidEvent>| -> Vec<String> {
            events
                .iter()
                .map(|e| String::from_utf8(e.json.to_vec()).expect("UTF-8"))
                .collect()
        };
        // Two compact elements of one shape: each must keep its own bytes, not its neighbour's.
        let twin = r#"{"type":"CUSTOM","name":"c","value":{"x":[3,4.75]}}"#;
        let batch = format!(" [{compact},\n {spaced} ,{twin}]");
        assert_eq!(
            json(parse_json_body(batch.as_bytes(), &thread, 1 << 20).expect("valid")),
            [compact, r#"{"type":"CUSTOM","name":"b","value":"é"}"#, twin]
        );
        let single = format!("{compact}\n");
        assert_eq!(
            json(parse_json_body(single.as_bytes(), &thread, 1 << 20).expect("valid")),
            [compact]
        );
    }
}
