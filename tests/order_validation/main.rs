//! Order validation at publish (PROTOCOL §2 "Publish rules"), over real sockets, on both log
//! backends (one generic body per check, run by a memory and a redis test), and compare-and-
//! append across two broker processes sharing Redis:
//!
//! - every conformance stream of `spec-1.0` and `spec-1.1`, published event by event to a fresh
//!   thread: a stream `@ag-ui/client` 1.0.0 fails is refused (409 `order_violation`, naming the
//!   rule) exactly at the event the client fails on — found by playing the stream's prefixes
//!   through the real client — with everything before it accepted and nothing of the refused
//!   batch appended; every other stream is accepted entirely, except the events refused on
//!   purpose (unknown event type and unknown patch operation: 400; a `STATE_DELTA` that does not
//!   apply: 422), listed in [`EXPECTED_REFUSALS`];
//! - a `STATE_DELTA` that does not apply to the folded state: 422 `state_delta_not_applicable`
//!   naming the operation and the batch index, nothing of the batch appended;
//! - a batch (JSON array, NDJSON) with a valid prefix and a violation in the middle: 409 naming
//!   that index, nothing of the batch appended;
//! - concurrent `RUN_STARTED`s on a thread whose run finished: exactly one wins, on one node or
//!   across two nodes;
//! - two producers streaming to two open messages of one run, on two nodes: all accepted, and the
//!   log reads back as a valid stream (the real client) with each producer's deltas in order;
//! - one producer whose POSTs alternate between two nodes (a load balancer): every event is
//!   valid at the log's latest position, so every one is accepted;
//! - an entry the broker cannot validate `XADD`ed directly at the end of the stream: later
//!   publishes follow it and are accepted.
//!
//! The checks across two broker processes are in `nodes.rs`. Needs `node` with
//! `npm ci --prefix tests/node` (the client), and the test Redis.

#[path = "../common/mod.rs"]
mod common;
mod nodes;

use common::agui_client::{self as agui, Case};
use common::broker::{self, BrokerProcess};
use common::{fixtures, sse_client};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Barrier;

/// A refused event: fixture, index in the stream, status, error code, the error's `field`, its
/// `operation`.
type Refusal = (
    &'static str,
    usize,
    u16,
    &'static str,
    Option<&'static str>,
    Option<u64>,
);

/// The events of completed streams the broker refuses on purpose, and how, in fixture order:
/// (fixture, index in the stream, status, error code, the error's `field`, its `operation`).
const EXPECTED_REFUSALS: &[Refusal] = &[
    // The client warns and keeps its state; PROTOCOL §2 refuses a delta that cannot apply.
    (
        "spec-1.1/state-delta-unappliable-warns-and-keeps",
        2,
        422,
        "state_delta_not_applicable",
        Some("delta[1]"),
        Some(1),
    ),
    // The client drops an operation RFC 6902 does not define; PROTOCOL §2 refuses malformed
    // patches.
    (
        "spec-1.1/state-delta-unknown-op-dropped",
        2,
        400,
        "invalid_event",
        Some("delta[0].op"),
        None,
    ),
    // The client drops an unknown type; PROTOCOL §2 refuses it (producers use CUSTOM/RAW).
    (
        "spec-1.1/unknown-event-dropped",
        3,
        400,
        "invalid_event",
        Some("type"),
        None,
    ),
];

/// The rule the broker names for each stream the client fails.
const FATAL_RULES: &[(&str, &str)] = &[
    ("spec-1.1/content-without-start-fatal", "message_not_open"),
    (
        "spec-1.1/event-after-run-finished-fatal",
        "run_already_finished",
    ),
    (
        "spec-1.1/first-event-not-run-started-fatal",
        "first_event_must_be_run_started",
    ),
    ("spec-1.1/nested-run-started-fatal", "run_already_active"),
    (
        "spec-1.1/open-message-at-run-finished-fatal",
        "run_finished_with_open_messages",
    ),
    (
        "spec-1.1/step-finished-without-start-fatal",
        "step_not_open",
    ),
];

/// A conformance fixture.
struct Fixture {
    /// `spec-1.x/<name>`.
    name: String,
    stream: Vec<Value>,
    expect: Value,
}

fn conformance_fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    for spec in ["spec-1.0", "spec-1.1"] {
        let dir = fixtures::root()
            .join("agui-recorded/conformance-streams")
            .join(spec);
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).expect("fixture");
            let doc: Value =
                serde_json::from_str(text.trim_start_matches('\u{feff}')).expect("fixture JSON");
            out.push(Fixture {
                name: format!("{spec}/{}", doc["name"].as_str().expect("name")),
                stream: doc["stream"].as_array().expect("stream").clone(),
                expect: doc["expect"].clone(),
            });
        }
    }
    assert!(out.len() > 20, "the conformance fixtures are there");
    out
}

/// An SSE body of `events`, as an agent would send them.
fn sse_body(events: &[Value]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

/// For each fixture, the index of the event `@ag-ui/client` 1.0.0 fails on and its message
/// (`None` when the whole stream passes): every prefix is played through the real client, one
/// case each; the failing event is the last of the shortest failing prefix.
fn client_verdicts(fixtures: &[Fixture]) -> Vec<Option<(usize, String)>> {
    let mut cases = Vec::new();
    for (f, fixture) in fixtures.iter().enumerate() {
        for k in 1..=fixture.stream.len() {
            cases.push(Case {
                name: format!("{f}/{k}"),
                thread_id: "t".into(),
                bodies: vec![sse_body(&fixture.stream[..k])],
            });
        }
    }
    let results = agui::run_cases(&cases);
    let mut verdicts: Vec<Option<(usize, String)>> = vec![None; fixtures.len()];
    for (case, result) in cases.iter().zip(results) {
        let (f, k) = case.name.split_once('/').expect("case name");
        let (f, k): (usize, usize) = (f.parse().unwrap(), k.parse().unwrap());
        if !result.ok && verdicts[f].as_ref().is_none_or(|(at, _)| k - 1 < *at) {
            verdicts[f] = Some((k - 1, result.error.unwrap_or_default()));
        }
    }
    verdicts
}

/// A publish answer: status and JSON body.
struct Reply {
    status: u16,
    body: Value,
}

impl Reply {
    fn error(&self) -> &Value {
        &self.body["error"]
    }
}

async fn reply(resp: reqwest::Response) -> Reply {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("reply body");
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("reply {text:?}: {e}"));
    Reply { status, body }
}

async fn publish_one(base: &str, thread: &str, event: &Value) -> Reply {
    reply(sse_client::publish_one(base, thread, event).await).await
}

async fn publish_batch(base: &str, thread: &str, events: &[Value]) -> Reply {
    reply(sse_client::publish(base, thread, events).await).await
}

async fn publish_ndjson(base: &str, thread: &str, events: &[Value]) -> Reply {
    let body: String = events.iter().map(|e| format!("{e}\n")).collect();
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .expect("publish request");
    reply(resp).await
}

/// The thread's snapshot (`{"lastEventId","state","messages","run"}`).
async fn snapshot(base: &str, thread: &str) -> Value {
    let resp = reqwest::get(format!("{base}/v1/threads/{thread}/snapshot"))
        .await
        .expect("snapshot request");
    assert_eq!(resp.status(), 200, "snapshot status");
    resp.json().await.expect("snapshot JSON")
}

/// The id of the thread's last event, `None` for a thread without events.
async fn last_event_id(base: &str, thread: &str) -> Option<String> {
    snapshot(base, thread).await["lastEventId"]
        .as_str()
        .map(str::to_string)
}

/// The thread's log read back (`?from=start`) up to its last event: the events, as JSON.
async fn log_events(base: &str, thread: &str) -> Vec<Value> {
    match last_event_id(base, thread).await {
        Some(last) => agui::body_events(&agui::read_log(base, thread, &last).await),
        None => Vec::new(),
    }
}

/// Publishes every conformance stream, event by event, to a fresh thread each; checks each
/// refusal against the client's verdict and [`EXPECTED_REFUSALS`], and the log against what was
/// accepted.
async fn conformance_streams_are_checked_like_the_client(base: &str, backend: &str) {
    let fixtures = conformance_fixtures();
    let verdicts = client_verdicts(&fixtures);
    let mut refusals = Vec::new();
    let mut fatal_seen = Vec::new();
    for (fixture, verdict) in fixtures.iter().zip(&verdicts) {
        let name = &fixture.name;
        let thread = broker::thread_id("order-conf");
        let mut events = fixture.stream.clone();
        fixtures::retarget(&mut events, &thread);
        let fails = fixture.expect["outcome"] == "failed";
        assert_eq!(
            fails,
            verdict.is_some(),
            "{name}: the client's verdict {verdict:?} contradicts the fixture"
        );
        let mut accepted = Vec::new();
        for (i, event) in events.iter().enumerate() {
            let before = last_event_id(base, &thread).await;
            let r = publish_one(base, &thread, event).await;
            if r.status == 200 {
                assert_eq!(r.body["count"], 1, "{name} #{i}: {}", r.body);
                accepted.push(event.clone());
                continue;
            }
            let err = r.error();
            println!(
                "{backend}: {name} #{i} {}: {} {err}",
                event["type"], r.status
            );
            assert_eq!(
                last_event_id(base, &thread).await,
                before,
                "{name} #{i}: a refused event must append nothing"
            );
            if let Some((at, message)) = verdict {
                assert_eq!(i, *at, "{name}: refused #{i}, the client fails on #{at}");
                assert_eq!(r.status, 409, "{name} #{i}: {err}");
                assert_eq!(err["code"], "order_violation", "{name} #{i}: {err}");
                assert_eq!(err["index"], 0, "{name} #{i}: index in its batch: {err}");
                let rule = FATAL_RULES
                    .iter()
                    .find(|(n, _)| n == name)
                    .unwrap_or_else(|| panic!("{name}: add it to FATAL_RULES ({err})"))
                    .1;
                assert_eq!(err["rule"], rule, "{name} #{i}: {err}");
                let contains = fixture.expect["errorContains"].as_str().unwrap_or("");
                assert!(
                    err["message"].as_str().unwrap_or("").contains(contains)
                        && message.contains(contains),
                    "{name}: broker says {}, client says {message:?}, fixture {contains:?}",
                    err["message"]
                );
                fatal_seen.push(name.clone());
                break;
            }
            refusals.push((
                name.clone(),
                i,
                r.status,
                err["code"].as_str().unwrap_or("").to_string(),
                err["field"].as_str().map(str::to_string),
                err["operation"].as_u64(),
            ));
            // A single-object body is a batch of one: 409/422 say `index: 0`, a schema 400
            // says no index at all.
            let index_ok = err["index"] == 0 || (r.status == 400 && err["index"].is_null());
            assert!(index_ok, "{name} #{i}: index in its batch: {err}");
        }
        if let Some((at, _)) = verdict {
            assert_eq!(
                accepted.len(),
                *at,
                "{name}: everything before #{at} accepted"
            );
        }
        assert_eq!(
            log_events(base, &thread).await,
            accepted,
            "{name}: the log holds exactly what was accepted"
        );
    }
    let expected: Vec<_> = EXPECTED_REFUSALS
        .iter()
        .map(|(n, i, s, c, f, o)| {
            (
                n.to_string(),
                *i,
                *s,
                c.to_string(),
                f.map(str::to_string),
                *o,
            )
        })
        .collect();
    assert_eq!(
        refusals, expected,
        "{backend}: the events of completed streams refused"
    );
    let mut fatal_listed: Vec<String> = FATAL_RULES.iter().map(|(n, _)| n.to_string()).collect();
    fatal_listed.sort();
    fatal_seen.sort();
    assert_eq!(
        fatal_seen, fatal_listed,
        "{backend}: every fatal stream refused"
    );
}

/// A `STATE_DELTA` that does not apply to the folded state, in a batch after one that does:
/// 422 naming the batch index and the operation; nothing of the batch appended; the state
/// unchanged. The same delta alone, then one that applies, to show the thread is still usable.
async fn failing_state_delta_is_refused_whole(base: &str, backend: &str) {
    let thread = broker::thread_id("order-delta");
    sse_client::publish_ok(
        base,
        &thread,
        &[
            json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
            json!({"type": "STATE_SNAPSHOT", "snapshot": {"a": 1, "list": [1]}}),
        ],
    )
    .await;
    let before = snapshot(base, &thread).await;
    let good =
        json!({"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/a", "value": 2}]});
    let bad = json!({"type": "STATE_DELTA", "delta": [
        {"op": "add", "path": "/b", "value": true},
        {"op": "add", "path": "/list/-", "value": 2},
        {"op": "remove", "path": "/missing"},
        {"op": "add", "path": "/c", "value": 3}]});
    for (batch, index) in [(vec![good.clone(), bad.clone()], 1), (vec![bad.clone()], 0)] {
        let r = publish_batch(base, &thread, &batch).await;
        let err = r.error();
        assert_eq!(r.status, 422, "{backend}: {}", r.body);
        assert_eq!(err["code"], "state_delta_not_applicable", "{err}");
        assert_eq!(err["index"], index, "{err}");
        assert_eq!(err["operation"], 2, "{err}");
        assert_eq!(err["field"], "delta[2]", "{err}");
        assert_eq!(
            snapshot(base, &thread).await,
            before,
            "{backend}: nothing of the batch appended, the state unchanged"
        );
    }
    let (_, last) = sse_client::publish_ok(base, &thread, &[good]).await;
    let after = snapshot(base, &thread).await;
    assert_eq!(after["lastEventId"], last);
    assert_eq!(after["state"], json!({"a": 2, "list": [1]}));
}

/// A batch whose events are valid up to one in the middle that breaks an order rule: 409 naming
/// that index and the rule; nothing of the batch appended (JSON array and NDJSON alike); the
/// valid prefix alone is then accepted.
async fn violation_mid_batch_refuses_the_whole_batch(base: &str, backend: &str) {
    let thread = broker::thread_id("order-batch");
    let (_, first) = sse_client::publish_ok(
        base,
        &thread,
        &[json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"})],
    )
    .await;
    let batch = vec![
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "hello"}),
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"k": 1}}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "nobody opened me"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}),
    ];
    let finish_early = vec![
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"}),
    ];
    for (events, index, rule) in [
        (&batch, 3, "message_not_open"),
        (&finish_early, 1, "run_finished_with_open_messages"),
    ] {
        for ndjson in [false, true] {
            let r = if ndjson {
                publish_ndjson(base, &thread, events).await
            } else {
                publish_batch(base, &thread, events).await
            };
            let err = r.error();
            assert_eq!(r.status, 409, "{backend} ndjson={ndjson}: {}", r.body);
            assert_eq!(err["code"], "order_violation", "{err}");
            assert_eq!(err["rule"], rule, "{err}");
            assert_eq!(err["index"], index, "{err}");
            assert_eq!(
                last_event_id(base, &thread).await.as_deref(),
                Some(first.as_str()),
                "{backend} ndjson={ndjson}: nothing of the batch appended"
            );
        }
    }
    let (_, last) = sse_client::publish_ok(base, &thread, &batch[..3]).await;
    assert_eq!(last_event_id(base, &thread).await, Some(last.clone()));
    assert_eq!(log_events(base, &thread).await.len(), 4);
    // A batch of token deltas only (validated from their fields, `validate_content_batch`):
    // the same rules.
    let deltas = vec![
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "a"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "b"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "x"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "c"}),
    ];
    for ndjson in [false, true] {
        let r = if ndjson {
            publish_ndjson(base, &thread, &deltas).await
        } else {
            publish_batch(base, &thread, &deltas).await
        };
        let err = r.error();
        assert_eq!(r.status, 409, "{backend} ndjson={ndjson}: {}", r.body);
        assert_eq!(err["rule"], "message_not_open", "{err}");
        assert_eq!(err["index"], 2, "{err}");
        assert_eq!(last_event_id(base, &thread).await, Some(last.clone()));
    }
    sse_client::publish_ok(base, &thread, &deltas[..2]).await;
    let log = log_events(base, &thread).await;
    assert_eq!(log.len(), 6);
    assert_eq!(log[4], deltas[0]);
    assert_eq!(log[5], deltas[1]);
}

/// Compare-and-append attempts of a node (`op="append"` samples of its backend latency: one
/// per attempt, refused by a moved log or not).
async fn append_attempts(base: &str) -> f64 {
    sse_client::metric(
        base,
        "agui_backend_latency_seconds_count",
        &[("backend", "redis"), ("op", "append")],
    )
    .await
}

/// A thread whose run finished gets `RUN_STARTED`s of 20 different runs at once, sent round-robin
/// to `bases` (the nodes, sharing one log): exactly one is accepted, the others are refused with
/// 409 `run_already_active`, and the log holds exactly that one new `RUN_STARTED`. Before the
/// race the first node saw its own `RUN_FINISHED`, then the last node appended a late
/// `RUN_ERROR`: with two nodes the first one's view is stale but allows a `RUN_STARTED`, so its
/// first contender reaches the log's compare-and-append with an old position and is refused
/// there (returns the number of such refused appends, `None` for an in-process broker).
async fn concurrent_run_starts_one_wins(bases: &[String], label: &str) -> Option<f64> {
    const CONTENDERS: usize = 20;
    let thread = broker::thread_id("order-race");
    let first = &bases[0];
    let last = &bases[bases.len() - 1];
    for e in [
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r0"}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "r0"}),
    ] {
        sse_client::publish_ok(first, &thread, &[e]).await;
    }
    sse_client::publish_ok(
        last,
        &thread,
        &[json!({"type": "RUN_ERROR", "message": "late failure"})],
    )
    .await;
    let two_nodes = bases.len() > 1;
    let mut attempts_before = 0.0;
    if two_nodes {
        for base in bases {
            attempts_before += append_attempts(base).await;
        }
    }
    let barrier = Arc::new(Barrier::new(CONTENDERS));
    let mut tasks = Vec::new();
    for k in 0..CONTENDERS {
        let base = bases[k % bases.len()].clone();
        let thread = thread.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let event =
                json!({"type": "RUN_STARTED", "threadId": thread, "runId": format!("r-{k}")});
            barrier.wait().await;
            (k, publish_one(&base, &thread, &event).await)
        }));
    }
    let mut winners = Vec::new();
    let mut refused: BTreeMap<String, usize> = BTreeMap::new();
    for t in tasks {
        let (k, r) = t.await.expect("contender");
        match r.status {
            200 => winners.push(k),
            409 => {
                assert_eq!(r.error()["code"], "order_violation", "{label}: {}", r.body);
                *refused
                    .entry(r.error()["rule"].as_str().unwrap_or("").to_string())
                    .or_default() += 1;
            }
            other => panic!("{label}: contender {k}: {other} {}", r.body),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "{label}: winners {winners:?}, refused {refused:?}"
    );
    assert_eq!(
        refused,
        BTreeMap::from([("run_already_active".to_string(), CONTENDERS - 1)]),
        "{label}"
    );
    for base in bases {
        let log = log_events(base, &thread).await;
        let types: Vec<&str> = log
            .iter()
            .map(|e| e["type"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            types,
            ["RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "RUN_STARTED"],
            "{label}"
        );
        assert_eq!(
            log[3]["runId"],
            format!("r-{}", winners[0]),
            "{label}: the winner's RUN_STARTED is the one in the log"
        );
    }
    if !two_nodes {
        return None;
    }
    let mut attempts = 0.0;
    for base in bases {
        attempts += append_attempts(base).await;
    }
    Some(attempts - attempts_before - 1.0)
}

/// Two producers, on `bases[0]` and `bases[1 % n]`, stream `TEXT_MESSAGE_CONTENT` at once to two
/// messages open in one run: every publish is accepted, and the log read back (on the other
/// node) passes the real client, each message holding its producer's deltas in order.
async fn concurrent_producers_interleave_validly(bases: &[String], label: &str) {
    const DELTAS: usize = 60;
    let thread = broker::thread_id("order-producers");
    sse_client::publish_ok(
        &bases[0],
        &thread,
        &[
            json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m-a", "role": "assistant"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m-b", "role": "assistant"}),
        ],
    )
    .await;
    let barrier = Arc::new(Barrier::new(2));
    let mut producers = Vec::new();
    for (p, message) in ["m-a", "m-b"].into_iter().enumerate() {
        let base = bases[p % bases.len()].clone();
        let thread = thread.clone();
        let barrier = barrier.clone();
        producers.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut refused = Vec::new();
            for i in 0..DELTAS {
                let event = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": message,
                    "delta": format!("{message}:{i} ")});
                let r = publish_one(&base, &thread, &event).await;
                if r.status != 200 {
                    refused.push(format!("#{i}: {} {}", r.status, r.body));
                }
            }
            refused
        }));
    }
    for p in producers {
        let refused = p.await.expect("producer");
        assert!(refused.is_empty(), "{label}: refused {refused:?}");
    }
    let (_, last) = sse_client::publish_ok(
        &bases[0],
        &thread,
        &[
            json!({"type": "TEXT_MESSAGE_END", "messageId": "m-a"}),
            json!({"type": "TEXT_MESSAGE_END", "messageId": "m-b"}),
            json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"}),
        ],
    )
    .await;
    let reader = &bases[bases.len() - 1];
    let body = agui::read_log(reader, &thread, &last).await;
    let events = agui::body_events(&body);
    assert_eq!(events.len(), 6 + 2 * DELTAS, "{label}");
    let result = agui::run_cases(&[Case {
        name: label.to_string(),
        thread_id: thread.clone(),
        bodies: vec![body],
    }])
    .remove(0);
    assert!(
        result.ok,
        "{label}: the log fails the client: {:?}",
        result.error
    );
    let content = |m: &str| -> String { (0..DELTAS).map(|i| format!("{m}:{i} ")).collect() };
    assert_eq!(
        result.messages,
        json!([
            {"id": "m-a", "role": "assistant", "content": content("m-a")},
            {"id": "m-b", "role": "assistant", "content": content("m-b")},
        ]),
        "{label}: each message holds its producer's deltas in order"
    );
}

/// Every check of one broker (`backend` names its log).
async fn order_validation(base: &str, backend: &str) {
    conformance_streams_are_checked_like_the_client(base, backend).await;
    failing_state_delta_is_refused_whole(base, backend).await;
    violation_mid_batch_refuses_the_whole_batch(base, backend).await;
    let bases = [base.to_string()];
    concurrent_run_starts_one_wins(&bases, &format!("{backend}/one node")).await;
    concurrent_producers_interleave_validly(&bases, &format!("{backend}/one node")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_order_validation() {
    let server = broker::start_memory().await;
    order_validation(&broker::base(server.addr), "memory").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_order_validation() {
    let server = broker::start_redis().await;
    order_validation(&broker::base(server.addr), "redis").await;
    server.stop().await;
}

/// Two broker processes sharing the test Redis.
async fn two_nodes() -> (BrokerProcess, BrokerProcess) {
    let env = [("AGUI_REDIS_URL", broker::redis_url())];
    (
        BrokerProcess::spawn(&env).await,
        BrokerProcess::spawn(&env).await,
    )
}
