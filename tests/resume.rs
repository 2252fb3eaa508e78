//! Resume (PROTOCOL §4, §9) on real sockets, with a real `redis-server` for the redis backend:
//!
//! - (a) a subscriber cut at random points while a producer publishes resumes with
//!   `Last-Event-ID` and, concatenated, receives the log exactly (both backends);
//! - (b) the same with every reconnect going to the other of two broker processes sharing Redis;
//! - (c) the broker process is SIGTERMed (clean exit) and replaced; the subscriber resumes on the
//!   new process and receives exactly the rest;
//! - (d) unresumable ids (other epoch, ahead, malformed, trimmed) open a 200 stream that begins
//!   with an explaining comment, then carries live events; each case is counted in `/metrics`;
//! - (d') with `strict_order = false`, a thread trimmed past its first event still has its
//!   snapshot and preludes (checkpoints are kept without order checks);
//! - (e) graceful drain of an in-process broker: open streams end by themselves with a `retry:`
//!   frame, the server task finishes, and an acknowledged publish is in the log afterwards.
//!
//! Randomness is seeded (`AGUI_TEST_SEED` to reproduce a run); each test prints its seed.

mod common;

use agui_fanout::app::Server;
use common::broker::{self, BrokerProcess};
use common::sse_client::{self, ReceivedText, Subscription};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

/// Longest wait for any one event or frame.
const WAIT: Duration = Duration::from_secs(10);
/// Events of the long run of (a)–(c).
const TOTAL: usize = 2_000;
/// Client-side cuts per run of (a) and (b).
const CUTS: usize = 16;

/// The test's seed: `AGUI_TEST_SEED` or a random one; printed so a failure can be reproduced.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("AGUI_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("{test}: seed = {seed} (AGUI_TEST_SEED={seed} to reproduce)");
    seed
}

/// A valid AG-UI run of `total` events: `RUN_STARTED`, `TEXT_MESSAGE_START`, `total - 4`
/// `TEXT_MESSAGE_CONTENT` (the sequence number in the delta), `TEXT_MESSAGE_END`, `RUN_FINISHED`.
fn long_run(thread: &str, run: &str, total: usize) -> Vec<Value> {
    assert!(total >= 5);
    let msg = format!("{run}-msg");
    let mut events = Vec::with_capacity(total);
    events.push(json!({"type": "RUN_STARTED", "threadId": thread, "runId": run}));
    events.push(json!({"type": "TEXT_MESSAGE_START", "messageId": msg, "role": "assistant"}));
    for i in 0..total - 4 {
        events.push(
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": msg, "delta": format!("#{i} ")}),
        );
    }
    events.push(json!({"type": "TEXT_MESSAGE_END", "messageId": msg}));
    events.push(json!({"type": "RUN_FINISHED", "threadId": thread, "runId": run}));
    events
}

/// Publishes `events` in order, in batches of random size 1–20, each batch to a random broker
/// of `bases`. Every batch must be acknowledged before the next is sent.
async fn produce(bases: Vec<String>, thread: String, events: Vec<Value>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut i = 0;
    while i < events.len() {
        let n = rng.random_range(1..=20usize).min(events.len() - i);
        let base = &bases[rng.random_range(0..bases.len())];
        sse_client::publish_ok(base, &thread, &events[i..i + n]).await;
        i += n;
    }
}

/// `k` distinct cut points in `1..total`, ascending.
fn cut_points(rng: &mut StdRng, k: usize, total: usize) -> Vec<usize> {
    let mut cuts = BTreeSet::new();
    while cuts.len() < k {
        cuts.insert(rng.random_range(1..total));
    }
    cuts.into_iter().collect()
}

/// Reads `total` events from `sub`, dropping the connection after each cut point (counted in
/// events received so far) and reconnecting with `Last-Event-ID` to the next broker of `bases`
/// (round robin, starting after `bases[0]`).
async fn read_with_cuts(
    mut sub: Subscription,
    bases: &[String],
    thread: &str,
    total: usize,
    cuts: &[usize],
) -> Vec<ReceivedText> {
    let mut got: Vec<ReceivedText> = Vec::with_capacity(total);
    let mut node = 0;
    let mut cuts = cuts.iter().copied().peekable();
    while got.len() < total {
        let Some(r) = sub.next_text(WAIT).await else {
            panic!(
                "stream on {} ended or stalled after {} events (last id {:?})",
                bases[node],
                got.len(),
                got.last().map(|r| &r.id)
            );
        };
        got.push(r);
        if cuts.peek() == Some(&got.len()) {
            cuts.next();
            drop(sub);
            node = (node + 1) % bases.len();
            let last = got
                .last()
                .map(|r| r.id.clone())
                .expect("cut after one event");
            sub = sse_client::subscribe(&bases[node], thread, "", Some(&last)).await;
        }
    }
    got
}

/// Asserts that what a subscriber received, concatenated over its connections, is exactly the
/// log (`?from=start` on `base`) and exactly what was published.
async fn assert_exactly_the_log(
    base: &str,
    thread: &str,
    got: &[ReceivedText],
    published: &[Value],
) {
    let mut full = sse_client::subscribe(base, thread, "?from=start", None).await;
    let log = full.take_text(published.len(), WAIT).await;
    sse_client::assert_text_ids_increasing(&log);
    for (i, (r, ev)) in log.iter().zip(published).enumerate() {
        assert_eq!(&r.data, ev, "log event #{i} differs from the published one");
        assert_eq!(
            r.text,
            serde_json::to_string(ev).unwrap(),
            "log event #{i} text"
        );
    }
    assert_eq!(got.len(), log.len(), "received vs log length");
    for (i, (g, l)) in got.iter().zip(&log).enumerate() {
        assert_eq!(
            g, l,
            "received event #{i} differs from the log (gap or duplicate)"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (a) cuts and resumes on one broker, both backends

async fn cut_and_resume(server: Server, test: &str) {
    let seed = seed(test);
    let mut rng = StdRng::seed_from_u64(seed);
    let base = broker::base(server.addr);
    let thread = broker::thread_id("resume");
    let events = long_run(&thread, "run-1", TOTAL);
    let cuts = cut_points(&mut rng, CUTS, TOTAL);
    println!("{test}: cuts after {cuts:?} events");

    let sub = sse_client::subscribe(&base, &thread, "", None).await;
    let producer = tokio::spawn(produce(
        vec![base.clone()],
        thread.clone(),
        events.clone(),
        rng.random(),
    ));
    let got = read_with_cuts(sub, std::slice::from_ref(&base), &thread, TOTAL, &cuts).await;
    producer.await.expect("producer");
    assert_exactly_the_log(&base, &thread, &got, &events).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_cut_subscriber_resumes_exactly() {
    cut_and_resume(
        broker::start_memory().await,
        "memory_cut_subscriber_resumes_exactly",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cut_subscriber_resumes_exactly() {
    cut_and_resume(
        broker::start_redis().await,
        "redis_cut_subscriber_resumes_exactly",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// (b) reconnects alternate between two broker processes sharing Redis

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_resume_on_another_process() {
    let test = "redis_resume_on_another_process";
    let seed = seed(test);
    let mut rng = StdRng::seed_from_u64(seed);
    let env = [("AGUI_REDIS_URL", broker::redis_url())];
    let a = BrokerProcess::spawn(&env).await;
    let b = BrokerProcess::spawn(&env).await;
    let bases = vec![a.base(), b.base()];
    let thread = broker::thread_id("two-nodes");
    let events = long_run(&thread, "run-1", TOTAL);
    let cuts = cut_points(&mut rng, CUTS, TOTAL);
    println!("{test}: cuts after {cuts:?} events");

    let sub = sse_client::subscribe(&bases[0], &thread, "", None).await;
    let producer = tokio::spawn(produce(
        bases.clone(),
        thread.clone(),
        events.clone(),
        rng.random(),
    ));
    let got = read_with_cuts(sub, &bases, &thread, TOTAL, &cuts).await;
    producer.await.expect("producer");
    assert_exactly_the_log(&bases[0], &thread, &got, &events).await;
    assert_exactly_the_log(&bases[1], &thread, &got, &events).await;
}

// ---------------------------------------------------------------------------------------------
// (c) broker restart (SIGTERM, clean exit, new process)

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_resume_after_broker_restart() {
    let test = "redis_resume_after_broker_restart";
    let seed = seed(test);
    let mut rng = StdRng::seed_from_u64(seed);
    let env = [("AGUI_REDIS_URL", broker::redis_url())];
    let old = BrokerProcess::spawn(&env).await;
    let old_base = old.base();
    let thread = broker::thread_id("restart");
    let events = long_run(&thread, "run-1", TOTAL);
    let half = TOTAL / 2;

    let mut sub = sse_client::subscribe(&old_base, &thread, "", None).await;
    produce(
        vec![old_base.clone()],
        thread.clone(),
        events[..half].to_vec(),
        rng.random(),
    )
    .await;
    let some = rng.random_range(1..half);
    println!("{test}: reads {some} events before SIGTERM");
    let mut got = sub.take_text(some, WAIT).await;

    // SIGTERM while the subscriber keeps reading: its stream must end by itself (drain).
    let mut old = old;
    let term = tokio::task::spawn_blocking(move || {
        let status = old.terminate();
        (old, status)
    });
    while let Some(r) = sub.next_text(WAIT).await {
        got.push(r);
    }
    drop(sub);
    let (old, status) = term.await.expect("terminate task");
    assert_eq!(
        status.code(),
        Some(0),
        "broker must exit cleanly on SIGTERM: {status:?}"
    );
    drop(old);
    assert!(got.len() <= half, "received more than was published");
    println!(
        "{test}: {} events received before the old process ended",
        got.len()
    );

    let new = BrokerProcess::spawn(&env).await;
    let base = new.base();
    let last = got.last().map(|r| r.id.clone()).expect("read some");
    let mut sub = sse_client::subscribe(&base, &thread, "", Some(&last)).await;
    let producer = tokio::spawn(produce(
        vec![base.clone()],
        thread.clone(),
        events[half..].to_vec(),
        rng.random(),
    ));
    let rest = sub.take_text(TOTAL - got.len(), WAIT).await;
    got.extend(rest);
    producer.await.expect("producer");
    assert_exactly_the_log(&base, &thread, &got, &events).await;
}

// ---------------------------------------------------------------------------------------------
// (d) unresumable ids: 200, an explaining comment, then live events; counted

/// How the resume id is broken.
#[derive(Clone, Copy, Debug)]
enum BadId {
    OtherEpoch,
    Ahead,
    MalformedHeader,
    MalformedQuery,
    Trimmed,
}

impl BadId {
    /// A word the explaining comment must contain, and the `agui_resets_total` cause.
    fn expect(self) -> (&'static str, &'static str) {
        match self {
            BadId::OtherEpoch => ("epoch", "epoch"),
            BadId::Ahead => ("ahead", "ahead"),
            BadId::MalformedHeader | BadId::MalformedQuery => ("malformed", "invalid"),
            BadId::Trimmed => ("trimmed", "trimmed"),
        }
    }
}

/// Events of the thread before the bad resume (enough to be trimmed by both backends with
/// `retention.max_events = 10`; Redis trims whole stream nodes only).
const BEFORE: usize = 300;

async fn unresumable_case(base: &str, case: BadId) {
    let thread = broker::thread_id("bad-id");
    let before = long_run(&thread, "run-1", BEFORE);
    // In batches no larger than the broker takes with retention.max_events = 10.
    let mut ids = Vec::new();
    for chunk in before.chunks(10) {
        ids.push(sse_client::publish_ok(base, &thread, chunk).await);
    }
    let (first, last) = (ids[0].0.clone(), ids[ids.len() - 1].1.clone());
    let (epoch, ms, _, _) = sse_client::id_key(&last);

    let (header, query) = match case {
        BadId::OtherEpoch => {
            let other = u32::from_str_radix(&epoch, 16).unwrap() ^ 0x8000_0001;
            (Some(format!("{other:08x}-{ms}-0")), String::new())
        }
        BadId::Ahead => (Some(format!("{epoch}-{}-0", ms + 1_000_000)), String::new()),
        BadId::MalformedHeader => (Some("not-an-event-id".to_string()), String::new()),
        BadId::MalformedQuery => (None, "?lastEventId=zz%20top-1-1".to_string()),
        BadId::Trimmed => (Some(first), String::new()),
    };
    let (word, outcome) = case.expect();
    let counted_before = sse_client::metric(base, "agui_resets_total", &[("cause", outcome)]).await;

    let mut raw = sse_client::open_raw(base, &thread, &query, header.as_deref()).await;
    assert_eq!(raw.status, 200, "{case:?}: a bad resume id is never a 4xx");
    assert_eq!(raw.headers["content-type"], "text/event-stream", "{case:?}");
    let retry = raw.next_frame(WAIT).await.expect("a first frame");
    assert!(
        retry.retry.is_some() && retry.data.is_none(),
        "{case:?}: first frame must be retry:, got {:?}",
        retry.text
    );
    let comment = raw.next_frame(WAIT).await.expect("a second frame");
    assert!(
        comment.data.is_none()
            && comment
                .comments
                .iter()
                .any(|c| c.contains("agui-fanout") && c.contains(word)),
        "{case:?}: expected a comment explaining the case ({word}), got {:?}",
        comment.text
    );

    // Live events published after the stream opened arrive (after a prelude, if any).
    let live = vec![
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "run-2"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "run-2-msg", "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "run-2-msg", "delta": "live"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "run-2-msg"}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "run-2"}),
    ];
    let (live_first, live_last) = sse_client::publish_ok(base, &thread, &live).await;
    let wanted: Vec<String> = live
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    let mut skipped = Vec::new();
    let first_live = loop {
        let f = raw
            .next_event(WAIT)
            .await
            .unwrap_or_else(|| panic!("{case:?}: stream ended before the live events"));
        if f.data.as_deref() == Some(wanted[0].as_str()) {
            break f;
        }
        skipped.push(f.text);
        assert!(
            skipped.len() <= 16,
            "{case:?}: expected at most a prelude before the live events, got {skipped:#?}"
        );
    };
    assert_eq!(
        first_live.id.as_deref(),
        Some(live_first.as_str()),
        "{case:?}"
    );
    let mut ids = vec![first_live.id.clone().unwrap()];
    for (i, w) in wanted.iter().enumerate().skip(1) {
        let f = raw
            .next_event(WAIT)
            .await
            .unwrap_or_else(|| panic!("{case:?}: stream ended at live event #{i}"));
        assert_eq!(
            f.data.as_deref(),
            Some(w.as_str()),
            "{case:?}: live event #{i}"
        );
        ids.push(f.id.expect("live events carry an id"));
    }
    assert_eq!(ids.last(), Some(&live_last), "{case:?}");
    for w in ids.windows(2) {
        assert!(
            sse_client::id_key(&w[0]) < sse_client::id_key(&w[1]),
            "{case:?}: {ids:?}"
        );
    }
    drop(raw);

    let counted_after = sse_client::metric(base, "agui_resets_total", &[("cause", outcome)]).await;
    assert!(
        counted_after > counted_before,
        "{case:?}: agui_resets_total{{cause=\"{outcome}\"}} did not increase ({counted_before} -> {counted_after})"
    );
}

async fn unresumable_ids(server: Server) {
    let base = broker::base(server.addr);
    for case in [
        BadId::OtherEpoch,
        BadId::Ahead,
        BadId::MalformedHeader,
        BadId::MalformedQuery,
        BadId::Trimmed,
    ] {
        unresumable_case(&base, case).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_unresumable_ids_open_with_comment_then_live() {
    unresumable_ids(broker::start(|c| c.retention.max_events = 10).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_unresumable_ids_open_with_comment_then_live() {
    unresumable_ids(
        broker::start(|c| {
            c.redis_url = broker::redis_url();
            c.retention.max_events = 10;
        })
        .await,
    )
    .await;
}

/// `strict_order = false` (no order checks at publish) still keeps the thread's checkpoints
/// (PROTOCOL §6): on Redis with `retention.max_events = 10`, a run trimmed far past its first event
/// still has a snapshot equal to the untrimmed run's (a memory broker without retention), and a
/// new subscriber still begins with a prelude. Fails when the non-strict path appends without
/// checkpoint candidates (snapshot 503, live events without a prelude).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_non_strict_trimmed_thread_keeps_its_fold() {
    let trimmed = broker::start(|c| {
        c.redis_url = broker::redis_url();
        c.retention.max_events = 10;
        c.strict_order = false;
    })
    .await;
    let full = broker::start(|c| c.retention.max_events = 0).await;
    let (trimmed_base, full_base) = (broker::base(trimmed.addr), broker::base(full.addr));
    let thread = broker::thread_id("non-strict-trim");
    let events = long_run(&thread, "run-1", BEFORE);
    let mut first = None;
    for chunk in events.chunks(10) {
        let (a, _) = sse_client::publish_ok(&trimmed_base, &thread, chunk).await;
        first.get_or_insert(a);
        sse_client::publish_ok(&full_base, &thread, chunk).await;
    }

    // Trimmed: the first event is gone (a resume from it is not exact).
    let mut raw = sse_client::open_raw(&trimmed_base, &thread, "", first.as_deref()).await;
    raw.next_frame(WAIT).await.expect("retry frame");
    let comment = raw.next_frame(WAIT).await.expect("a comment");
    assert!(
        comment.comments.iter().any(|c| c.contains("trimmed")),
        "{:?}",
        comment.text
    );
    drop(raw);

    let snapshot = |base: String| {
        let thread = thread.clone();
        async move {
            let r = reqwest::get(format!("{base}/v1/threads/{thread}/snapshot"))
                .await
                .expect("snapshot request");
            let status = r.status();
            let body: Value = r.json().await.expect("snapshot JSON");
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let (got, want) = (
        snapshot(trimmed_base.clone()).await,
        snapshot(full_base).await,
    );
    assert_eq!(got["messages"], want["messages"]);
    assert_eq!(got["state"], want["state"]);
    assert_eq!(got["run"], want["run"]);

    // A new subscriber gets the prelude: the marked run start, the messages (a clearing
    // snapshot, then every message), the state (`{}` included), the run's end.
    let mut raw = sse_client::open_raw(&trimmed_base, &thread, "", None).await;
    let mut prelude = Vec::new();
    while prelude.len() < 5 {
        let f = raw.next_event(WAIT).await.expect("a prelude event");
        prelude.push(serde_json::from_str::<Value>(f.data.as_deref().unwrap()).unwrap());
    }
    let types: Vec<&str> = prelude
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "RUN_STARTED",
            "MESSAGES_SNAPSHOT",
            "MESSAGES_SNAPSHOT",
            "STATE_SNAPSHOT",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(prelude[0]["metadata"]["agui-fanout"]["prelude"], true);
    assert_eq!(prelude[2]["messages"], want["messages"]);
    assert_eq!(prelude[3]["snapshot"], want["state"]);
    drop(raw);
    trimmed.stop().await;
    full.stop().await;
}

// ---------------------------------------------------------------------------------------------
// (e) graceful drain

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_drain_ends_streams_and_keeps_acknowledged_events() {
    let server = broker::start_redis().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("drain");
    let started = json!({"type": "RUN_STARTED", "threadId": thread, "runId": "run-1"});
    let message = json!({"type": "TEXT_MESSAGE_START", "messageId": "m-1", "role": "assistant"});

    let mut raw = sse_client::open_raw(&base, &thread, "", None).await;
    assert_eq!(raw.status, 200);
    let (first_id, _) =
        sse_client::publish_ok(&base, &thread, std::slice::from_ref(&started)).await;
    let f = raw.next_event(WAIT).await.expect("the first event");
    assert_eq!(f.id.as_deref(), Some(first_id.as_str()));

    // Acknowledged before the shutdown starts.
    let (acked_id, _) =
        sse_client::publish_ok(&base, &thread, std::slice::from_ref(&message)).await;

    let shutdown = server.shutdown.clone();
    shutdown.cancel();
    let (frames, rest) = raw.read_to_end(WAIT).await;
    assert!(
        rest.is_empty(),
        "stream ended inside a frame: {:?}",
        String::from_utf8_lossy(&rest)
    );
    let last = frames.last().expect("a final frame before the end");
    assert!(
        last.retry.is_some() && last.data.is_none(),
        "the drained stream must end with a retry: frame, got {frames:#?}"
    );
    for f in &frames {
        if let Some(data) = &f.data {
            assert_eq!(data, &serde_json::to_string(&message).unwrap());
            assert_eq!(f.id.as_deref(), Some(acked_id.as_str()));
        }
    }
    tokio::time::timeout(Duration::from_secs(15), server.wait())
        .await
        .expect("the server task finishes after the drain");

    // The acknowledged publish is in the log, as seen by a fresh broker.
    let fresh = broker::start_redis().await;
    let fresh_base = broker::base(fresh.addr);
    let mut sub = sse_client::subscribe(&fresh_base, &thread, "?from=start", None).await;
    let log = sub.take_text(2, WAIT).await;
    assert_eq!(log[0].id, first_id);
    assert_eq!(log[0].data, started);
    assert_eq!(log[1].id, acked_id);
    assert_eq!(log[1].data, message);
    drop(sub);
    fresh.stop().await;
}
