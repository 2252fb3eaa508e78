//! Bad input and backend outages (PROTOCOL §2 errors and publish rules, §4.3, §9).
//!
//! Every refused publish gets its documented status (docs/PROTOCOL.md §2), a JSON body `{"error":{"code","message",…}}`
//! with `index` / `field` where they apply, and appends nothing (checked in the log itself and,
//! at the end, with a `?from=start` subscription). The same cases run on the memory and the
//! redis backend.
//!
//! Outages run the broker on a private `redis-server` (`common/redis_server.rs`) that the test
//! kills and restarts empty (a new epoch: the old stream is ended, a resume with the old id gets
//! 200 and the new events), or freezes and thaws (no data lost: the open stream continues
//! exactly).

#[path = "../common/mod.rs"]
mod common;
mod outages;

use agui_fanout::app::Server;
use agui_fanout::event::ThreadId;
use agui_fanout::log::{EventId, ReadFrom};
use common::broker;
use common::redis_server::RedisServer;
use common::sse_client::{self, RawFrame, RawStream};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};
use std::time::{Duration, Instant};

/// Limits of the broker under test (small, so 413s are cheap to provoke).
const MAX_EVENT: usize = 1024;
const MAX_BODY: usize = 4096;

const JSON: &str = "application/json";
const NDJSON: &str = "application/x-ndjson";
const SSE: &str = "text/event-stream";

// ---------------------------------------------------------------------------------------------
// Helpers

/// A publish (or any request) reply: status, headers and the body parsed as JSON (`Null` when
/// it is not JSON).
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
    text: String,
}

async fn send(req: reqwest::RequestBuilder) -> Reply {
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("reply body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
        text,
    }
}

/// `POST {base}/v1/threads/{thread}/events` with a raw body and an optional `Content-Type`.
async fn post(
    base: &str,
    thread: &str,
    content_type: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> Reply {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    send(req).await
}

async fn post_json(base: &str, thread: &str, body: &Value) -> Reply {
    post(base, thread, Some(JSON), serde_json::to_vec(body).unwrap()).await
}

impl Reply {
    /// Asserts `status` and the JSON error shape; returns the error object.
    fn error(&self, status: StatusCode, what: &str) -> &Map<String, Value> {
        assert_eq!(self.status, status, "{what}: status (body {})", self.text);
        let ct = self
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(
            ct.starts_with("application/json"),
            "{what}: error content type {ct:?}"
        );
        let err = self.body["error"]
            .as_object()
            .unwrap_or_else(|| panic!("{what}: body is not {{\"error\":{{…}}}}: {}", self.text));
        assert!(
            err.get("code")
                .and_then(Value::as_str)
                .is_some_and(|c| !c.is_empty()),
            "{what}: error.code must be a non-empty string: {}",
            self.text
        );
        assert!(
            err.get("message")
                .and_then(Value::as_str)
                .is_some_and(|m| !m.is_empty()),
            "{what}: error.message must be a non-empty string: {}",
            self.text
        );
        err
    }

    /// Asserts a 400 `invalid_event`-like error with the given `index` and `field` members
    /// (`None`: the member must be absent).
    fn refused(&self, status: StatusCode, what: &str, index: Option<usize>, field: Option<&str>) {
        let err = self.error(status, what);
        assert_eq!(
            err.get("index").and_then(Value::as_u64),
            index.map(|i| i as u64),
            "{what}: error.index in {}",
            self.text
        );
        if index.is_none() {
            assert!(
                !err.contains_key("index"),
                "{what}: no index expected: {}",
                self.text
            );
        }
        assert_eq!(
            err.get("field").and_then(Value::as_str),
            field,
            "{what}: error.field in {}",
            self.text
        );
    }

    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// The ids and JSON of every retained event of `thread`.
async fn log_of(server: &Server, thread: &str) -> Vec<(EventId, Value)> {
    let tid = ThreadId::parse(thread).unwrap();
    server
        .state
        .log
        .read(&tid, ReadFrom::Start, 100_000)
        .await
        .expect("read the log")
        .into_iter()
        .map(|e| (e.id, serde_json::from_slice(&e.json).unwrap()))
        .collect()
}

async fn assert_nothing_appended(server: &Server, thread: &str, what: &str) {
    let log = log_of(server, thread).await;
    assert!(
        log.is_empty(),
        "{what}: a refused publish appended {} event(s): {:?}",
        log.len(),
        log.iter().map(|(_, v)| v.to_string()).collect::<Vec<_>>()
    );
    let tid = ThreadId::parse(thread).unwrap();
    let head = server.state.log.head(&tid).await.expect("head");
    assert_eq!(head.last_id(), None, "{what}: the log's head moved");
}

fn custom(n: u64) -> Value {
    json!({"type": "CUSTOM", "name": "n", "value": n})
}

fn ndjson(events: &[Value]) -> String {
    events.iter().map(|e| format!("{e}\n")).collect()
}

/// Deletes a thread's keys on the shared test Redis.
async fn delete_redis_keys(thread: &str) {
    let client = redis::Client::open(broker::redis_url()).unwrap();
    if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
        let _: Result<(), _> = redis::cmd("DEL")
            .arg(format!("agui:{{{thread}}}:log"))
            .arg(format!("agui:{{{thread}}}:meta"))
            .query_async(&mut conn)
            .await;
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input

/// A broker with small limits. Order validation is off: these cases are about the schema
/// and the limits, checked before any order rule, and "nothing appended" is easiest to see on
/// threads whose valid events are plain `CUSTOM`s (tests/order_validation/ covers the order
/// rules with strict order on).
async fn start_limited(redis: bool) -> Server {
    broker::start(|c| {
        c.strict_order = false;
        c.limits.max_event_bytes = MAX_EVENT;
        c.limits.max_body_bytes = MAX_BODY;
        if redis {
            c.redis_url = broker::redis_url();
        }
    })
    .await
}

/// A refused body: what it is, the bytes, the expected `index` and `field` of the error.
type BodyCase = (&'static str, Vec<u8>, Option<usize>, Option<&'static str>);

/// Every refused JSON / NDJSON publish on one thread, checking after each that nothing was
/// appended; then a `?from=start` subscription sees only a marker published at the end.
async fn refused_publishes(server: &Server) -> Vec<String> {
    let base = broker::base(server.addr);
    let t = broker::thread_id("bad");
    let t = t.as_str();
    let bad = StatusCode::BAD_REQUEST;
    let valid = |n| custom(n);

    // Bodies that are not JSON events at all.
    let cases: Vec<BodyCase> = vec![
        (
            "malformed JSON",
            br#"{"type":"CUSTOM","name":"#.to_vec(),
            None,
            None,
        ),
        (
            "trailing garbage",
            br#"{"type":"RAW","event":1} x"#.to_vec(),
            None,
            None,
        ),
        ("empty body", Vec::new(), None, None),
        ("a number", b"42".to_vec(), None, None),
        ("a string", br#""RUN_STARTED""#.to_vec(), None, None),
        ("null", b"null".to_vec(), None, None),
        ("empty array", b"[]".to_vec(), None, None),
        ("array of numbers", b"[1,2]".to_vec(), Some(0), None),
        (
            "array with a string after an event",
            br#"[{"type":"RAW","event":1},"x"]"#.to_vec(),
            Some(1),
            None,
        ),
        (
            "not UTF-8",
            b"{\"type\":\"RAW\",\"event\":\"\xff\"}".to_vec(),
            None,
            None,
        ),
        // serde_json's number marker: parsed, it would turn the object into the number 12.
        (
            "the reserved member name",
            br#"{"type":"CUSTOM","name":"n","value":{"$serde_json::private::Number":"12"}}"#
                .to_vec(),
            None,
            None,
        ),
        // serde_json's raw-value marker: parsed, an object holding it first becomes the JSON
        // text its string holds, or fails.
        (
            "the raw-value member name, first in a content delta",
            br#"{"$serde_json::private::RawValue":"1","type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"x"}"#
                .to_vec(),
            None,
            None,
        ),
        (
            "the raw-value member name, nested",
            br#"{"type":"STATE_SNAPSHOT","snapshot":{"$serde_json::private::RawValue":"{\"a\":1}"}}"#
                .to_vec(),
            None,
            None,
        ),
        (
            "the reserved member name, escaped, in a batch",
            br#"[{"type":"RAW","event":1},{"type":"RAW","event":{"\u0024serde_json::private::Number":"abc"}}]"#
                .to_vec(),
            None,
            None,
        ),
    ];
    for (what, body, index, field) in cases {
        let r = post(&base, t, Some(JSON), body).await;
        r.refused(bad, what, index, field);
        assert_nothing_appended(server, t, what).await;
    }

    // Schema violations, each alone (no index) and inside a batch (index of the bad one).
    let schema: Vec<(&str, Value, &str)> = vec![
        ("unknown type", json!({"type": "NOT_AN_EVENT"}), "type"),
        (
            "removed THINKING_ type",
            json!({"type": "THINKING_START"}),
            "type",
        ),
        ("missing type", json!({"name": "n", "value": 1}), "type"),
        (
            "missing required field",
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1"}),
            "delta",
        ),
        (
            "wrongly typed required field",
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": 7, "delta": "x"}),
            "messageId",
        ),
        (
            "null optional field",
            json!({"type": "RUN_STARTED", "threadId": t, "runId": "r1", "parentRunId": null}),
            "parentRunId",
        ),
        (
            "null timestamp",
            json!({"type": "CUSTOM", "name": "n", "value": 1, "timestamp": null}),
            "timestamp",
        ),
        (
            "float timestamp",
            json!({"type": "CUSTOM", "name": "n", "value": 1, "timestamp": 1.5}),
            "timestamp",
        ),
        (
            "integral float timestamp",
            serde_json::from_str(
                r#"{"type":"CUSTOM","name":"n","value":1,"timestamp":1700000000000.0}"#,
            )
            .unwrap(),
            "timestamp",
        ),
        (
            "patch: bad op",
            json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": 1}, {"op": "increment", "path": "/a", "value": 1}]}),
            "delta[1].op",
        ),
        (
            "patch: bad pointer",
            json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "a/b", "value": 1}]}),
            "delta[0].path",
        ),
        (
            "patch: missing value",
            json!({"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/a"}]}),
            "delta[0].value",
        ),
        (
            "patch: not an array",
            json!({"type": "STATE_DELTA", "delta": {"op": "add", "path": "/a", "value": 1}}),
            "delta",
        ),
        (
            "threadId differs from the path",
            json!({"type": "RUN_STARTED", "threadId": "another-thread", "runId": "r1"}),
            "threadId",
        ),
        (
            "input.threadId differs from the path",
            json!({"type": "RUN_STARTED", "threadId": t, "runId": "r1",
                   "input": {"threadId": "another-thread", "runId": "r1", "messages": []}}),
            "input.threadId",
        ),
    ];
    for (what, event, field) in &schema {
        let r = post_json(&base, t, event).await;
        r.refused(bad, what, None, Some(field));
        assert_eq!(r.code(), "invalid_event", "{what}: {}", r.text);
        assert_nothing_appended(server, t, what).await;

        // In the middle of a valid batch: that index, and nothing of the batch appended.
        let batch = json!([valid(1), valid(2), event, valid(3)]);
        let r = post_json(&base, t, &batch).await;
        r.refused(bad, &format!("{what} (batch)"), Some(2), Some(field));
        assert_nothing_appended(server, t, what).await;

        // The same as NDJSON.
        let body = ndjson(&[valid(1), valid(2), event.clone(), valid(3)]);
        let r = post(&base, t, Some(NDJSON), body).await;
        r.refused(bad, &format!("{what} (NDJSON)"), Some(2), Some(field));
        assert_nothing_appended(server, t, what).await;
    }

    // NDJSON lines that are not events; malformed JSON has the code it has in a JSON body.
    for (what, line, code) in [
        ("NDJSON: malformed line", "{\"type\":", "invalid_json"),
        ("NDJSON: a number", "5", "invalid_event"),
        (
            "NDJSON: an array",
            "[{\"type\":\"RAW\",\"event\":1}]",
            "invalid_event",
        ),
        (
            "NDJSON: the reserved member name",
            "{\"type\":\"RAW\",\"event\":{\"$serde_json::private::Number\":\"5\"}}",
            "invalid_event",
        ),
    ] {
        let body = format!("{}\n{}\n{line}\n{}\n", valid(1), valid(2), valid(3));
        let r = post(&base, t, Some(NDJSON), body).await;
        r.refused(bad, what, Some(2), None);
        assert_eq!(r.code(), code, "{what}: {}", r.text);
        assert_nothing_appended(server, t, what).await;
    }

    // Sizes (413): one event over the limit (alone, in a batch, in NDJSON), a body over it.
    let big = json!({"type": "CUSTOM", "name": "big", "value": "x".repeat(MAX_EVENT)});
    let too_large = StatusCode::PAYLOAD_TOO_LARGE;
    let r = post_json(&base, t, &big).await;
    r.error(too_large, "event too large");
    assert_nothing_appended(server, t, "event too large").await;
    let r = post_json(&base, t, &json!([valid(1), big])).await;
    r.error(too_large, "event too large (batch)");
    assert_eq!(r.body["error"]["index"], 1, "{}", r.text);
    assert_nothing_appended(server, t, "event too large (batch)").await;
    let r = post(&base, t, Some(NDJSON), ndjson(&[valid(1), big.clone()])).await;
    r.error(too_large, "event too large (NDJSON)");
    assert_eq!(r.body["error"]["index"], 1, "{}", r.text);
    assert_nothing_appended(server, t, "event too large (NDJSON)").await;
    let many: Vec<Value> = (0..200).map(valid).collect();
    assert!(serde_json::to_vec(&many).unwrap().len() > MAX_BODY);
    let r = post_json(&base, t, &Value::Array(many.clone())).await;
    r.error(too_large, "body too large");
    assert_nothing_appended(server, t, "body too large").await;
    // Without a Content-Length (chunked), the limit holds all the same.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = serde_json::to_vec(&many)
        .unwrap()
        .chunks(500)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let chunked = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let r = post(&base, t, Some(JSON), chunked).await;
    r.error(too_large, "chunked body too large");
    assert_nothing_appended(server, t, "chunked body too large").await;
    let r = post(&base, t, Some(NDJSON), ndjson(&many)).await;
    r.error(too_large, "body too large (NDJSON)");
    assert_nothing_appended(server, t, "body too large (NDJSON)").await;

    // Content types (415).
    let one = serde_json::to_vec(&valid(1)).unwrap();
    for ct in [
        None,
        Some("text/plain"),
        Some("application/xml"),
        Some("application/jsonx"),
    ] {
        let what = format!("content type {ct:?}");
        let r = post(&base, t, ct, one.clone()).await;
        r.error(StatusCode::UNSUPPORTED_MEDIA_TYPE, &what);
        assert_nothing_appended(server, t, &what).await;
    }

    // Nothing before the marker, seen by a subscriber reading from the start.
    let mut from_start = sse_client::subscribe(&base, t, "?from=start", None).await;
    let marker = json!({"type": "CUSTOM", "name": "marker", "value": true});
    sse_client::publish_ok(&base, t, std::slice::from_ref(&marker)).await;
    let first = from_start.take(1, Duration::from_secs(5)).await;
    assert_eq!(
        first[0].data, marker,
        "the first event of the thread is the marker"
    );
    assert_eq!(log_of(server, t).await.len(), 1);
    vec![t.to_string()]
}

/// Bad thread ids in the path, unknown routes, wrong methods.
async fn bad_paths(server: &Server) -> Vec<String> {
    let base = broker::base(server.addr);
    let one = serde_json::to_vec(&custom(1)).unwrap();
    let long = "a".repeat(ThreadId::MAX_LEN + 1);
    for (what, segment) in [
        ("space", "a%20b"),
        ("brace", "a%7Bb"),
        ("raw brace", "a{b"),
        ("slash-less unicode", "caf%C3%A9"),
        ("too long", long.as_str()),
    ] {
        let r = post(&base, segment, Some(JSON), one.clone()).await;
        r.refused(
            StatusCode::BAD_REQUEST,
            &format!("publish, thread id: {what}"),
            None,
            Some("threadId"),
        );
        assert_eq!(r.code(), "invalid_thread_id");
        let r =
            send(reqwest::Client::new().get(format!("{base}/v1/threads/{segment}/events"))).await;
        r.refused(
            StatusCode::BAD_REQUEST,
            &format!("subscribe, thread id: {what}"),
            None,
            Some("threadId"),
        );
    }
    // The longest valid id is fine.
    let longest = format!("max-{}", "a".repeat(ThreadId::MAX_LEN - 4));
    let r = post(&base, &longest, Some(JSON), one.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "128-char thread id: {}", r.text);

    for (method, path) in [
        (reqwest::Method::GET, "/"),
        (reqwest::Method::GET, "/v2/threads/t/events"),
        (reqwest::Method::POST, "/v1/threads/t/evnts"),
        (reqwest::Method::GET, "/v1/threads/t"),
        (reqwest::Method::GET, "/v1/threads/t/events/extra"),
    ] {
        let r = send(reqwest::Client::new().request(method.clone(), format!("{base}{path}"))).await;
        r.error(StatusCode::NOT_FOUND, &format!("{method} {path}"));
    }
    let r = send(reqwest::Client::new().delete(format!("{base}/v1/threads/t/events"))).await;
    r.error(StatusCode::METHOD_NOT_ALLOWED, "DELETE on the events route");
    vec![longest]
}

/// An SSE ingest with N valid events then an invalid one: the N are appended, the reply is an
/// error saying so (`appended: N`, `index: N`), and the log holds exactly those N.
async fn sse_ingest_stops_at_first_invalid(server: &Server) -> Vec<String> {
    let base = broker::base(server.addr);
    let mut threads = Vec::new();
    for (what, bad, field) in [
        (
            "invalid event",
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1"}),
            Some("delta"),
        ),
        (
            "other thread",
            json!({"type": "RUN_FINISHED", "threadId": "x", "runId": "r"}),
            Some("threadId"),
        ),
    ] {
        let t = broker::thread_id("ingest");
        const N: u64 = 5;
        let mut body = String::from(": an agent's own output\nretry: 1000\n\n");
        for n in 0..N {
            body.push_str(&format!(
                "id: producer-{n}\nevent: message\ndata: {}\n\n",
                custom(n)
            ));
        }
        body.push_str(&format!("data: {bad}\n\n"));
        body.push_str(&format!("data: {}\n\n", custom(99)));
        let r = post(&base, &t, Some(SSE), body).await;
        r.refused(
            StatusCode::BAD_REQUEST,
            &format!("SSE ingest: {what}"),
            Some(N as usize),
            field,
        );
        assert_eq!(r.body["error"]["appended"], N, "{}", r.text);
        let log = log_of(server, &t).await;
        assert_eq!(
            log.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
            (0..N).map(custom).collect::<Vec<_>>(),
            "SSE ingest: {what}: exactly the valid prefix is in the log"
        );
        assert_eq!(
            r.body["error"]["lastId"].as_str(),
            Some(log[N as usize - 1].0.to_string().as_str()),
            "{}",
            r.text
        );
        threads.push(t);
    }

    // An event over the size limit inside an ingest: 413, the events before it appended.
    let t = broker::thread_id("ingest-big");
    let big = json!({"type": "CUSTOM", "name": "big", "value": "x".repeat(MAX_EVENT)});
    let body = format!(
        "data: {}\n\ndata: {}\n\ndata: {big}\n\n",
        custom(0),
        custom(1)
    );
    let r = post(&base, &t, Some(SSE), body).await;
    r.error(StatusCode::PAYLOAD_TOO_LARGE, "SSE ingest: event too large");
    assert_eq!(r.body["error"]["appended"], 2, "{}", r.text);
    assert_eq!(log_of(server, &t).await.len(), 2);
    threads.push(t);

    // CRLF line ends and a `data:` split over several lines (joined with LF: still one JSON
    // object) are valid SSE.
    let t = broker::thread_id("ingest-crlf");
    let body = "data: {\"type\":\"CUSTOM\",\r\ndata: \"name\":\"n\",\"value\":0}\r\n\r\ndata: {\"type\":\"CUSTOM\",\"name\":\"n\",\"value\":1}\r\n\r\n";
    let r = post(&base, &t, Some(SSE), body).await;
    assert_eq!(r.status, StatusCode::OK, "CRLF SSE ingest: {}", r.text);
    assert_eq!(r.body["count"], 2, "{}", r.text);
    assert_eq!(
        log_of(server, &t)
            .await
            .into_iter()
            .map(|(_, v)| v)
            .collect::<Vec<_>>(),
        vec![custom(0), custom(1)]
    );
    threads.push(t);
    threads
}

/// An SSE ingest whose third event is far over the size limit and never ends (the ingest stops
/// reading it before its end): 413, and the two complete events before it are appended and
/// counted, the error's index naming the oversized event (PROTOCOL §2: an SSE ingest appends events
/// as they arrive; the reply says how many were appended before the one refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_ingest_keeps_events_before_an_unterminated_oversized_one() {
    let server = start_limited(false).await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("ingest-huge");
    // One request chunk: two complete events, then the start of one over twice the limit.
    let body = format!(
        "data: {}\n\ndata: {}\n\ndata: {{\"type\":\"CUSTOM\",\"name\":\"huge\",\"value\":\"{}",
        custom(0),
        custom(1),
        "x".repeat(2 * MAX_EVENT + 200)
    );
    let r = post(&base, &t, Some(SSE), body).await;
    r.error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "SSE ingest: unterminated huge event",
    );
    let log = log_of(&server, &t).await;
    assert_eq!(
        r.body["error"]["appended"],
        log.len(),
        "the reply says what was appended: {}",
        r.text
    );
    assert_eq!(
        log.len(),
        2,
        "SSE ingest: the 2 valid events before an oversized one are appended ({})",
        r.text
    );
    assert_eq!(
        r.body["error"]["index"], 2,
        "index of the oversized event: {}",
        r.text
    );
    server.stop().await;
}

async fn bad_input_suite(redis: bool) {
    let server = start_limited(redis).await;
    let mut threads = refused_publishes(&server).await;
    threads.extend(bad_paths(&server).await);
    threads.extend(sse_ingest_stops_at_first_invalid(&server).await);
    server.stop().await;
    if redis {
        for t in threads {
            delete_redis_keys(&t).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_memory() {
    bad_input_suite(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_redis() {
    bad_input_suite(true).await;
}
