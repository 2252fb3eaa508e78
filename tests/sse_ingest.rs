//! An SSE ingest says what happened (PROTOCOL §2, `text/event-stream` publish): input that is
//! not an event stream is refused, never a silent `200 {"count":0}`; a stream that ends inside
//! an event is refused naming it, never a silent drop of its last event; an event refused by
//! the order checks takes none of the events before it with it, however the events were
//! grouped in reads; and every error's `appended`/`lastId` is exactly what the log holds.
//! (The first invalid event, oversized events, CRLF and a BOM are in `bad_input.rs` and
//! `hardening.rs`.)

mod common;

use agui_fanout::app::Server;
use agui_fanout::event::ThreadId;
use agui_fanout::log::ReadFrom;
use common::broker;
use serde_json::{Value, json};

/// Posts `body` as an SSE ingest; the status and the JSON answer.
async fn post_sse(base: &str, thread: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "text/event-stream")
        .body(body)
        .send()
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("a body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    (status, v)
}

/// The thread's log: (id, event) in order.
async fn log_of(server: &Server, thread: &str) -> Vec<(String, Value)> {
    let tid = ThreadId::parse(thread).unwrap();
    let entries = server
        .state
        .log
        .read(&tid, ReadFrom::Start, 10_000)
        .await
        .expect("read the log");
    entries
        .into_iter()
        .map(|e| {
            let v = serde_json::from_slice(&e.json).expect("JSON in the log");
            (e.id.to_string(), v)
        })
        .collect()
}

/// Asserts an error answer: status, code, `appended`, and `lastId` equal to the log's last id
/// (the log holding exactly `appended` events); returns the error object.
async fn assert_refused(
    server: &Server,
    thread: &str,
    (status, v): (u16, Value),
    want: (u16, &str),
    appended: usize,
) -> Value {
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (want.0, Some(want.1)),
        "{v}"
    );
    assert_eq!(v["error"]["appended"], appended, "{v}");
    let log = log_of(server, thread).await;
    assert_eq!(
        log.len(),
        appended,
        "the log holds what the answer says: {v}"
    );
    assert_eq!(
        v["error"]["lastId"],
        log.last().map_or(Value::Null, |(id, _)| json!(id)),
        "{v}"
    );
    v["error"].clone()
}

fn run_started(t: &str) -> Value {
    json!({"type": "RUN_STARTED", "threadId": t, "runId": "r"})
}

fn run_finished(t: &str) -> Value {
    json!({"type": "RUN_FINISHED", "threadId": t, "runId": "r"})
}

fn custom(n: usize) -> Value {
    json!({"type": "CUSTOM", "name": "n", "value": n})
}

/// `data: <event>\n\n` for each event: what AG-UI encoders write.
fn sse(events: &[Value]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

/// A JSON body, NDJSON or any text that is not an event stream, sent as one: `400
/// invalid_event_stream` naming the line (the SSE parser ignores unknown fields, so this was
/// `200 {"count":0}`); a stream with no event at all: `400 invalid_event`. Nothing appended.
#[tokio::test]
async fn what_is_not_an_event_stream_is_refused() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let probe = broker::thread_id("not-sse");
    let ndjson = format!("{}\n{}\n", run_started(&probe), custom(1));
    for body in [
        run_started(&probe).to_string(),
        json!([run_started(&probe)]).to_string(),
        ndjson,
        "hello world\n\n".to_string(),
        "<html><body>502 Bad Gateway</body></html>\n".to_string(),
    ] {
        let t = broker::thread_id("not-sse");
        let body = body.replace(&probe, &t);
        let r = post_sse(&base, &t, body.clone()).await;
        let e = assert_refused(&server, &t, r, (400, "invalid_event_stream"), 0).await;
        let message = e["message"].as_str().unwrap_or_default();
        assert!(message.contains("line 1 "), "{body:?}: {e}");
    }
    for body in ["", ": only a comment\n\n", "id: 7\nretry: 100\n\n"] {
        let t = broker::thread_id("no-event");
        let r = post_sse(&base, &t, body).await;
        assert_refused(&server, &t, r, (400, "invalid_event"), 0).await;
    }
    server.stop().await;
}

/// An event whose data is not JSON: `400 invalid_event` naming its index, the events before it
/// appended and counted.
#[tokio::test]
async fn an_event_whose_data_is_not_json_is_refused_after_the_valid_ones() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("not-json");
    let body = format!(
        "{}data: this is not JSON\n\n",
        sse(&[run_started(&t), custom(1)])
    );
    let r = post_sse(&base, &t, body).await;
    let e = assert_refused(&server, &t, r, (400, "invalid_event"), 2).await;
    assert_eq!(e["index"], 2, "{e}");
    server.stop().await;
}

/// A stream that ends inside an event (its `data` line, but not the blank line that ends it):
/// refused, naming the event, never dropped in silence (an agent's last `RUN_FINISHED` vanished
/// behind a `200`). The events before it are appended.
#[tokio::test]
async fn a_stream_that_ends_inside_an_event_is_refused_naming_it() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    for end in ["", "\n", "\r\n"] {
        let t = broker::thread_id("incomplete");
        let body = format!(
            "{}data: {}{end}",
            sse(&[run_started(&t), custom(1)]),
            run_finished(&t)
        );
        let r = post_sse(&base, &t, body).await;
        let e = assert_refused(&server, &t, r, (400, "invalid_event_stream"), 2).await;
        assert_eq!(e["index"], 2, "{end:?}: {e}");
        let message = e["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("ended inside the event that starts on line 5"),
            "{end:?}: {e}"
        );
    }
    server.stop().await;
}

/// Lines ended by a lone CR (one of WHATWG's three line ends): every event is appended, the
/// last one too (the parser waited for a byte after the last CR and dropped the event).
#[tokio::test]
async fn a_stream_with_cr_line_ends_keeps_its_last_event() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("cr");
    let events = [run_started(&t), custom(1), run_finished(&t)];
    let body = sse(&events).replace('\n', "\r");
    let (status, v) = post_sse(&base, &t, body).await;
    assert_eq!((status, &v["count"]), (200, &json!(3)), "{v}");
    let log: Vec<Value> = log_of(&server, &t)
        .await
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(log, events);
    server.stop().await;
}

/// Events that arrive together (one read) are appended in one step; an event the order checks
/// refuse among them (409, or 422 for a `STATE_DELTA` that does not apply) no longer takes the
/// valid events before it with it: they are appended, and the answer counts them.
#[tokio::test]
async fn a_refused_event_takes_none_of_the_events_before_it() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let not_open = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "nope", "delta": "x"});
    let not_applicable = json!({"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/missing", "value": 1}]});
    for (bad, status, code) in [
        (not_open, 409, "order_violation"),
        (not_applicable, 422, "state_delta_not_applicable"),
    ] {
        let t = broker::thread_id("refused-in-read");
        let mut events = vec![run_started(&t)];
        events.extend((1..5).map(custom));
        events.push(bad);
        events.push(custom(99));
        let r = post_sse(&base, &t, sse(&events)).await;
        let e = assert_refused(&server, &t, r, (status, code), 5).await;
        assert_eq!(e["index"], 5, "{e}");
        let log: Vec<Value> = log_of(&server, &t)
            .await
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        assert_eq!(log, events[..5]);
    }
    server.stop().await;
}

/// More events in one read than a batch may hold (2 × `retention.max_events`): appended in
/// several batches, not refused whole with 413.
#[tokio::test]
async fn a_read_larger_than_a_batch_is_appended_in_batches() {
    let server = broker::start(|c| c.retention.max_events = 10).await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("big-read");
    let mut events = vec![run_started(&t)];
    events.extend((1..50).map(custom));
    let (status, v) = post_sse(&base, &t, sse(&events)).await;
    assert_eq!((status, &v["count"]), (200, &json!(50)), "{v}");
    let log = log_of(&server, &t).await;
    assert_eq!(v["lastId"], json!(log[log.len() - 1].0), "{v}");
    server.stop().await;
}

/// A producer's retry whose first events were appended before: an event refused after them is
/// named by its index in the batch as sent, duplicates included (it was counted from the first
/// event not yet appended).
#[tokio::test]
async fn a_refusal_after_a_producers_duplicates_names_the_event_as_sent() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("dup-index");
    let publish = |events: Vec<Value>| {
        reqwest::Client::new()
            .post(format!("{base}/v1/threads/{t}/events"))
            .header("X-Producer-Id", "p")
            .header("X-Producer-Seq", "1")
            .json(&events)
            .send()
    };
    let first = publish(vec![run_started(&t), custom(1)]).await.unwrap();
    assert_eq!(first.status(), 200);
    let not_open = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "nope", "delta": "x"});
    let retry = publish(vec![run_started(&t), custom(1), custom(2), not_open])
        .await
        .unwrap();
    assert_eq!(retry.status(), 409);
    let v: Value = retry.json().await.unwrap();
    assert_eq!(v["error"]["index"], 3, "{v}");
    server.stop().await;
}
