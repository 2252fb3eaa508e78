//! Clients across a Redis that lost data (PROTOCOL §4.3); every client's fold, judged by the
//! real `@ag-ui/client`, ends equal to the log's (`/snapshot`):
//!
//! - restarted empty: the thread's log starts over under a new epoch, and a client of the lost
//!   epoch gets the new one from its first event, so nothing acknowledged meanwhile is skipped;
//! - failed over without the primary's last events: the promoted replica keeps the thread's
//!   epoch (the meta hash was replicated) but not the tail the clients were sent. A client
//!   holding that tail is never resumed exactly from a position the log never held, and a node
//!   that fanned the tail out ends its streams rather than continue them.
//!
//! Private `redis-server`s, primary and replica (`common/redis_server.rs`).

mod common;

use common::agui_client::{self as agui};
use common::broker::snapshot;
use common::redis_server::RedisServer;
use common::{broker, sse_client};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn run_started(thread: &str) -> Value {
    json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"})
}

fn text_start() -> Value {
    json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"})
}

fn content(delta: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": delta})
}

/// `n` content events of `delta`, one per publish (as an agent streams): the last id.
async fn stream_text(base: &str, thread: &str, delta: &str, n: usize) -> String {
    let mut last = String::new();
    for _ in 0..n {
        last = sse_client::publish_ok(base, thread, &[content(delta)])
            .await
            .1;
    }
    last
}

/// Publishes until the broker takes it (Redis just changed roles), for at most 10 s; the id.
async fn publish_when_writable(base: &str, thread: &str, event: &Value) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = sse_client::publish(base, thread, std::slice::from_ref(event)).await;
        let status = resp.status();
        let body: Value = resp.json().await.expect("JSON reply");
        if status == 200 {
            return body["lastId"].as_str().expect("lastId").to_string();
        }
        assert_eq!(status, 503, "{body}");
        assert!(Instant::now() < deadline, "publishes still fail: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `(ms, seq)` of an event id (`<epoch>-<ms>-<seq>`).
fn position(id: &str) -> (u64, u64) {
    let (_, ms, seq, _) = sse_client::id_key(id);
    (ms, seq)
}

/// The client's fold of `connections` (one raw body per connection), by the real
/// `@ag-ui/client`, is the log's fold (`/snapshot` on `base`), and its text is `text`.
async fn assert_client_folds_to_the_log(
    name: &str,
    base: &str,
    thread: &str,
    connections: &[String],
    text: &str,
) {
    let results = agui::run_cases(&[agui::client_case(name, thread, connections)]);
    let result = &results[0];
    assert!(
        result.ok,
        "{name}: the client accepts every stream: {result:?}"
    );
    let snapshot = snapshot(base, thread).await;
    assert_eq!(
        snapshot["messages"][0]["content"],
        json!(text),
        "the log's text"
    );
    assert_eq!(
        result.messages, snapshot["messages"],
        "{name}: the client's messages are the log's"
    );
    assert_eq!(
        result.state, snapshot["state"],
        "{name}: the client's state is the log's"
    );
}

/// A client that reads `raw` and, whenever its stream ends, reconnects to `base` with its last
/// id, until it has a frame with id `until`; its raw bodies, one per connection.
async fn follow_until(
    base: &str,
    thread: &str,
    mut raw: sse_client::RawStream,
    mut last: Option<String>,
    until: &str,
) -> Vec<String> {
    let mut bodies = Vec::new();
    let mut body = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match raw.next_frame(agui::FRAME_WAIT).await {
            Some(frame) => {
                body.push_str(&frame.text);
                body.push_str("\n\n");
                if let Some(id) = frame.id {
                    let done = id == until;
                    last = Some(id);
                    if done {
                        bodies.push(body);
                        return bodies;
                    }
                }
            }
            None => {
                assert!(
                    Instant::now() < deadline,
                    "no frame with id {until} after 20 s: {bodies:?}"
                );
                bodies.push(std::mem::take(&mut body));
                raw = sse_client::open_raw(base, thread, "", last.as_deref()).await;
                assert_eq!(raw.status, 200);
            }
        }
    }
}

/// The reproduction: a client was sent `bbbbbbbbbb` by the primary, which died before
/// its replica got them; a broker on the promoted replica appends `c`, so the log grows past
/// the client's id (new entry ids take the clock's milliseconds). Resuming with that id is a
/// rollback: a prelude, and the client ends at the log's `aaaaaaaac`, not
/// `aaaaaaaabbbbbbbbbbc` (before: "resumed exactly" from a position the log never held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_a_lost_tail_resumes_to_the_promoted_log() {
    let primary = RedisServer::start().await;
    let replica = RedisServer::start().await;
    replica.replicate(&primary).await;
    let old = broker::start(|c| c.redis_url = primary.url()).await;
    let old_base = broker::base(old.addr);
    let thread = broker::thread_id("failover");

    let mut raw = sse_client::open_raw(&old_base, &thread, "", None).await;
    sse_client::publish_ok(&old_base, &thread, &[run_started(&thread), text_start()]).await;
    stream_text(&old_base, &thread, "a", 8).await;
    primary.replicated_to(&replica).await;
    // The replica is cut off (and later promoted); the primary's last events reach only it.
    replica.promote().await;
    let lost = stream_text(&old_base, &thread, "b", 10).await;
    let first = agui::read_until(&mut raw, &lost).await;
    drop(raw);
    old.stop().await;
    drop(primary);

    let new = broker::start(|c| c.redis_url = replica.url()).await;
    let base = broker::base(new.addr);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let c = publish_when_writable(&base, &thread, &content("c")).await;
    assert!(
        position(&c) > position(&lost),
        "the log grew past the lost id: {c} after {lost}"
    );
    assert_eq!(
        sse_client::id_key(&c).0,
        sse_client::id_key(&lost).0,
        "same epoch: the meta hash was replicated"
    );

    let mut resumed = sse_client::open_raw(&base, &thread, "", Some(&lost)).await;
    assert_eq!(resumed.status, 200);
    let second = agui::read_until(&mut resumed, &c).await;
    drop(resumed);
    let events = agui::body_events(&second);
    assert!(
        events.first().is_some_and(agui::is_prelude_start),
        "a prelude, not an exact resume: {second}"
    );
    assert!(
        second.contains(": agui-fanout: Last-Event-ID not resumable (unknown)"),
        "{second}"
    );
    assert_client_folds_to_the_log("lost tail", &base, &thread, &[first, second], "aaaaaaaac")
        .await;
    new.stop().await;
}

/// The promoted log takes events (`CUSTOM`s, which no snapshot restates, and `c`) before the
/// client holding the lost tail reconnects: it gets a prelude at the fork point (the last `a`,
/// the last entry the log holds before its id), which replaces the lost text and state, then
/// every event the log took after it, each once; its fold ends at the log's `aaaaaaaac` and
/// `{}` (before: a prelude at the head, and the events up to there were skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_a_lost_tail_gets_every_event_after_the_fork() {
    let primary = RedisServer::start().await;
    let replica = RedisServer::start().await;
    replica.replicate(&primary).await;
    let old = broker::start(|c| c.redis_url = primary.url()).await;
    let old_base = broker::base(old.addr);
    let thread = broker::thread_id("fork");

    let mut raw = sse_client::open_raw(&old_base, &thread, "", None).await;
    sse_client::publish_ok(&old_base, &thread, &[run_started(&thread), text_start()]).await;
    let fork = stream_text(&old_base, &thread, "a", 8).await;
    primary.replicated_to(&replica).await;
    replica.promote().await;
    let lost_state = json!({"type": "STATE_SNAPSHOT", "snapshot": {"lost": true}});
    sse_client::publish_ok(&old_base, &thread, &[lost_state]).await;
    let lost = stream_text(&old_base, &thread, "b", 10).await;
    let first = agui::read_until(&mut raw, &lost).await;
    drop(raw);
    old.stop().await;
    drop(primary);

    let new = broker::start(|c| c.redis_url = replica.url()).await;
    let base = broker::base(new.addr);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let custom = |i: usize| json!({"type": "CUSTOM", "name": "step", "value": i});
    let mut taken = vec![publish_when_writable(&base, &thread, &custom(1)).await];
    for event in [content("c"), custom(2)] {
        taken.push(sse_client::publish_ok(&base, &thread, &[event]).await.1);
    }
    assert!(
        position(&taken[0]) > position(&lost),
        "the log grew past the lost id"
    );
    let last = taken.last().unwrap().clone();

    let mut resumed = sse_client::open_raw(&base, &thread, "", Some(&lost)).await;
    assert_eq!(resumed.status, 200);
    let second = agui::read_until(&mut resumed, &last).await;
    drop(resumed);
    assert!(
        second.contains(": agui-fanout: Last-Event-ID not resumable (unknown), prelude at the last event the log holds before it, then every later event"),
        "{second}"
    );
    let events = agui::body_events(&second);
    assert!(
        events.first().is_some_and(agui::is_prelude_start),
        "a prelude: {second}"
    );
    let frames = common::sse::parse_body(second.as_bytes()).expect("SSE");
    let ids: Vec<&str> = frames.iter().filter_map(|f| f.id.as_deref()).collect();
    let mut want = vec![fork.as_str()];
    want.extend(taken.iter().map(String::as_str));
    assert_eq!(
        ids, want,
        "the prelude stands at the fork, then every event after it: {second}"
    );
    let customs: Vec<&Value> = events.iter().filter(|e| e["type"] == "CUSTOM").collect();
    assert_eq!(customs, [&custom(1), &custom(2)], "{second}");
    assert_client_folds_to_the_log("fork", &base, &thread, &[first, second], "aaaaaaaac").await;
    assert_eq!(snapshot(&base, &thread).await["state"], json!({}));
    new.stop().await;
}

/// The node that fanned the lost tail out still serves the thread when its Redis comes back
/// without it (here in place: the old primary rejoins the promoted replica, which drops its
/// tail, then serves again). Its tail finds its position gone once the log grew past it and
/// ends the thread's streams instead of continuing them; a client that stayed connected and
/// one that resumes after the append both end at the log's fold (before: the open stream went
/// on with `c` after the lost `b`s, and the resume was taken as exact).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_fanned_out_a_lost_tail_does_not_continue_it() {
    let redis = RedisServer::start().await;
    let other = RedisServer::start().await;
    other.replicate(&redis).await;
    let server = broker::start(|c| c.redis_url = redis.url()).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("rolled-back");

    let stays = sse_client::open_raw(&base, &thread, "", None).await;
    let mut leaves = sse_client::open_raw(&base, &thread, "", None).await;
    sse_client::publish_ok(&base, &thread, &[run_started(&thread), text_start()]).await;
    stream_text(&base, &thread, "a", 8).await;
    redis.replicated_to(&other).await;
    other.promote().await;
    let lost = stream_text(&base, &thread, "b", 10).await;
    let left_with = agui::read_until(&mut leaves, &lost).await;
    drop(leaves);

    // The failover: Redis loses the tail its replica never got, and serves writes again.
    redis.replicate(&other).await;
    redis.promote().await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let c = publish_when_writable(&base, &thread, &content("c")).await;
    assert!(position(&c) > position(&lost), "{c} after {lost}");

    let stayed = follow_until(&base, &thread, stays, None, &c).await;
    assert!(
        !stayed[0].contains("\"delta\":\"c\""),
        "the stream of the lost tail does not go on with the new log: {stayed:?}"
    );
    assert_client_folds_to_the_log("stayed", &base, &thread, &stayed, "aaaaaaaac").await;

    let mut resumed = sse_client::open_raw(&base, &thread, "", Some(&lost)).await;
    let second = agui::read_until(&mut resumed, &c).await;
    drop(resumed);
    assert!(
        agui::body_events(&second)
            .first()
            .is_some_and(agui::is_prelude_start),
        "a prelude: {second}"
    );
    assert_client_folds_to_the_log("resumed", &base, &thread, &[left_with, second], "aaaaaaaac")
        .await;
    server.stop().await;
}

/// Redis restarts empty; the producer starts a new run, acknowledged (with `CUSTOM` events no
/// snapshot restates) before the client of the lost epoch reconnects with its old id. It gets
/// a prelude at the new epoch's first event, which clears the lost epoch's messages and state,
/// then every event after it (before: a prelude at the head, and the new epoch's events up to
/// there were skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_a_lost_epoch_gets_every_event_of_the_new_one() {
    let mut redis = RedisServer::start().await;
    let server = broker::start(|c| c.redis_url = redis.url()).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("lost-epoch");

    let mut raw = sse_client::open_raw(&base, &thread, "", None).await;
    let old = [
        run_started(&thread),
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"k": 1}}),
        text_start(),
        content("old"),
    ];
    let (_, old_last) = sse_client::publish_ok(&base, &thread, &old).await;
    let first = agui::read_until(&mut raw, &old_last).await;
    drop(raw);

    redis.restart().await;
    let custom = |i: usize| json!({"type": "CUSTOM", "name": "step", "value": i});
    let new = [
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r2"}),
        custom(1),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m2", "role": "assistant"}),
        custom(2),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "new"}),
        custom(3),
    ];
    let mut new_ids = Vec::new();
    for event in &new {
        new_ids.push(publish_when_writable(&base, &thread, event).await);
    }
    let new_last = new_ids.last().unwrap().clone();
    assert_ne!(
        sse_client::id_key(&new_last).0,
        sse_client::id_key(&old_last).0,
        "the log recreated after the data loss has a new epoch"
    );

    let mut resumed = sse_client::open_raw(&base, &thread, "", Some(&old_last)).await;
    assert_eq!(resumed.status, 200);
    let second = agui::read_until(&mut resumed, &new_last).await;
    drop(resumed);
    assert!(
        second.contains(
            ": agui-fanout: Last-Event-ID not resumable (epoch), starting at the log's first event"
        ),
        "{second}"
    );
    let events = agui::body_events(&second);
    assert!(
        events.first().is_some_and(agui::is_prelude_start),
        "a prelude at the new epoch's first event: {second}"
    );
    assert_eq!(events[0]["runId"], "r2");
    let customs: Vec<&Value> = events.iter().filter(|e| e["type"] == "CUSTOM").collect();
    assert_eq!(
        customs,
        [&custom(1), &custom(2), &custom(3)],
        "every event of the new epoch after its first: {second}"
    );
    let frames = common::sse::parse_body(second.as_bytes()).expect("SSE");
    let ids: Vec<&str> = frames.iter().filter_map(|f| f.id.as_deref()).collect();
    assert_eq!(ids, new_ids.iter().map(String::as_str).collect::<Vec<_>>());

    let snapshot = snapshot(&base, &thread).await;
    assert_eq!(snapshot["state"], json!({}));
    let results = agui::run_cases(&[agui::client_case("lost epoch", &thread, &[first, second])]);
    let result = &results[0];
    assert!(result.ok, "the client accepts both streams: {result:?}");
    assert_eq!(result.messages, snapshot["messages"], "the log's messages");
    assert_eq!(result.state, snapshot["state"], "the log's state");
    server.stop().await;
}
