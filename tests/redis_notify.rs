//! The Redis tail's append notes (`<prefix>:appended`, `src/log/redis/notify.rs`) are hints,
//! never the truth: entries no note announced (a producer's direct `XADD`, a note lost with its
//! connection) are still delivered, a lost subscription loses and repeats nothing, and notes
//! that do not continue a follow exactly (other threads, forged or stale notes) deliver
//! nothing by themselves.
//!
//! Each test runs its own `redis-server` child (`common/redis_server.rs`): they kill pub/sub
//! connections and count subscribers, which the shared test server must not see.

#[allow(dead_code, unreachable_pub)]
mod common {
    pub mod redis_server;
}

use agui_fanout::event::{ThreadId, ValidEvent, validate_event};
use agui_fanout::log::redis::{RedisLog, RedisLogConfig};
use agui_fanout::log::{EventId, EventLog, LogEntry, Retention, Tail, TailItem};
use common::redis_server::RedisServer;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WITHIN: Duration = Duration::from_secs(20);

fn event(i: usize) -> ValidEvent {
    let value = json!({"type": "CUSTOM", "name": "notify", "value": {"i": i, "s": "a\nb"}});
    validate_event(value.to_string().as_bytes(), None).expect("valid test event")
}

fn events(range: std::ops::Range<usize>) -> Vec<ValidEvent> {
    range.map(event).collect()
}

/// A log on `server` with `block` as the tail's fallback period, no retention limits.
async fn log_on(server: &RedisServer, block: Duration) -> Arc<RedisLog> {
    let config = RedisLogConfig {
        block,
        op_timeout: Duration::from_millis(500),
        retention: Retention {
            max_events: 0,
            max_age: None,
            idle_ttl: None,
        },
        ..RedisLogConfig::new(server.url())
    };
    Arc::new(RedisLog::connect(config).await.expect("connect"))
}

async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Waits until `n` clients are subscribed to the append notes.
async fn wait_subscribed(conn: &mut redis::aio::MultiplexedConnection, n: i64) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let reply: (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("agui:appended")
            .query_async(conn)
            .await
            .unwrap();
        if reply.1 == n {
            return;
        }
        assert!(Instant::now() < deadline, "tail never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Harness {
    tail: Arc<dyn Tail>,
    rx: mpsc::Receiver<TailItem>,
    stop: CancellationToken,
}

impl Harness {
    fn start(log: &dyn EventLog) -> Self {
        let (tx, rx) = mpsc::channel(64);
        let stop = CancellationToken::new();
        let tail = log.start_tail(tx, stop.clone());
        Harness { tail, rx, stop }
    }

    /// Receives `Entries` until each thread of `want` got its count (a discontinuity fails).
    async fn collect(
        &mut self,
        want: &HashMap<ThreadId, usize>,
        within: Duration,
    ) -> HashMap<ThreadId, Vec<LogEntry>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut got: HashMap<ThreadId, Vec<LogEntry>> = HashMap::new();
        while want
            .iter()
            .any(|(t, n)| got.get(t).map_or(0, Vec::len) < *n)
        {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(TailItem::Entries { thread, entries })) => {
                    got.entry(thread).or_default().extend(entries)
                }
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => panic!(
                    "not delivered within {within:?}: got {:?} of {want:?}",
                    got.iter().map(|(t, e)| (t, e.len())).collect::<Vec<_>>()
                ),
            }
        }
        got
    }

    async fn drain_for(&mut self, period: Duration) -> Vec<TailItem> {
        let deadline = tokio::time::Instant::now() + period;
        let mut items = Vec::new();
        while let Ok(Some(item)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            items.push(item);
        }
        items
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn assert_entries(got: &[LogEntry], ids: &[EventId], evs: &[ValidEvent]) {
    assert_eq!(got.len(), ids.len(), "entry count");
    for ((entry, id), ev) in got.iter().zip(ids).zip(evs) {
        assert_eq!(entry.id, *id);
        assert_eq!(entry.event_type, ev.event_type);
        assert_eq!(entry.json, ev.json, "json must be byte-equal");
    }
}

/// An entry a producer `XADD`s directly has no note: the tail's periodic read of every
/// followed stream (every `block`) still delivers it, in order with the broker's own appends,
/// while the notes keep flowing. Fails if nothing but notes moved the tail.
#[tokio::test]
async fn direct_xadd_is_delivered_by_the_periodic_read() {
    let server = RedisServer::start().await;
    let mut conn = admin(&server).await;
    let log = log_on(&server, Duration::from_millis(300)).await;
    let mut tail = Harness::start(&*log);
    let thread = ThreadId::parse("direct").unwrap();
    let head = log.head(&thread).await.unwrap();
    tail.tail.follow(thread.clone(), head.epoch, head.last);
    wait_subscribed(&mut conn, 1).await;

    let first = log.append(&thread, &events(0..2)).await.unwrap();
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 2)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &first, &events(0..2));

    // Nothing else is appended after it: only the periodic read can find it.
    let json = r#"{"type":"CUSTOM","name":"direct","value":1}"#;
    let pos: String = redis::cmd("XADD")
        .arg("agui:{direct}:log")
        .arg("*")
        .arg("e")
        .arg(json)
        .query_async(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    let got = tail
        .collect(
            &HashMap::from([(thread.clone(), 1)]),
            Duration::from_secs(5),
        )
        .await;
    let entry = &got[&thread][0];
    assert_eq!(entry.id.pos.to_string(), pos);
    assert_eq!(&entry.json[..], json.as_bytes());
    // The documented bound: one `block` (300 ms) plus a read; generous for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // The broker's next append continues after the direct entry (its note's `prev`).
    let next = log.append(&thread, &events(2..3)).await.unwrap();
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 1)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &next, &events(2..3));
    assert!(tail.drain_for(Duration::from_millis(700)).await.is_empty());
}

/// Pub/sub connections killed (`CLIENT KILL TYPE pubsub`) while three threads are appended to:
/// every entry arrives exactly once, in order. The last batches are appended right after a
/// kill, so their notes are lost; with a fallback period (`block`) longer than the test's
/// patience, only a tail that noticed the lost subscription delivers them.
#[tokio::test]
async fn killed_subscription_loses_and_repeats_nothing() {
    let server = RedisServer::start().await;
    let mut conn = admin(&server).await;
    let log = log_on(&server, Duration::from_secs(60)).await;
    let mut tail = Harness::start(&*log);
    let threads: Vec<ThreadId> = (0..3)
        .map(|i| ThreadId::parse(&format!("kill-{i}")).unwrap())
        .collect();
    for t in &threads {
        let head = log.head(t).await.unwrap();
        tail.tail.follow(t.clone(), head.epoch, head.last);
    }
    wait_subscribed(&mut conn, 1).await;

    let mut expected: HashMap<ThreadId, (Vec<EventId>, Vec<ValidEvent>)> = HashMap::new();
    let mut n = 0;
    for round in 0..8 {
        for (k, t) in threads.iter().enumerate() {
            let evs = events(n..n + 1 + k);
            n += evs.len();
            let ids = log.append(t, &evs).await.unwrap();
            let e = expected.entry(t.clone()).or_default();
            e.0.extend(ids);
            e.1.extend(evs);
        }
        if round % 2 == 1 {
            wait_subscribed(&mut conn, 1).await;
            let killed: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("pubsub")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(killed, 1);
        }
        if round < 7 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
    // Right after the last kill (round 7), before the subscriber is back (it pauses at least
    // 50 ms): these notes are lost.
    for t in &threads {
        let evs = events(n..n + 2);
        n += 2;
        let ids = log.append(t, &evs).await.unwrap();
        let e = expected.entry(t.clone()).or_default();
        e.0.extend(ids);
        e.1.extend(evs);
    }
    let want: HashMap<ThreadId, usize> = expected
        .iter()
        .map(|(t, (ids, _))| (t.clone(), ids.len()))
        .collect();
    let got = tail.collect(&want, WITHIN).await;
    for (t, (ids, evs)) in &expected {
        assert_entries(&got[t], ids, evs);
    }
    assert!(tail.drain_for(Duration::from_millis(500)).await.is_empty());

    // Subscribed again: the broker's appends flow on.
    wait_subscribed(&mut conn, 1).await;
    let ids = log.append(&threads[0], &events(900..901)).await.unwrap();
    let got = tail
        .collect(&HashMap::from([(threads[0].clone(), 1)]), WITHIN)
        .await;
    assert_entries(&got[&threads[0]], &ids, &events(900..901));
}

/// Notes that do not continue a follow deliver nothing: a note for a thread not followed, a
/// malformed one, and a forged one for a followed thread whose `prev` is not the tail's cursor
/// (its event is in no stream). The thread's real entries still arrive exactly once.
#[tokio::test]
async fn notes_that_do_not_continue_a_follow_deliver_nothing() {
    let server = RedisServer::start().await;
    let mut conn = admin(&server).await;
    let log = log_on(&server, Duration::from_millis(300)).await;
    let mut tail = Harness::start(&*log);
    let thread = ThreadId::parse("followed").unwrap();
    let head = log.head(&thread).await.unwrap();
    tail.tail.follow(thread.clone(), head.epoch, head.last);
    wait_subscribed(&mut conn, 1).await;
    let first = log.append(&thread, &events(0..1)).await.unwrap();
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 1)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &first, &events(0..1));

    // An appended thread nobody follows here.
    let other = ThreadId::parse("not-followed").unwrap();
    log.append(&other, &events(0..3)).await.unwrap();
    let forged = |prev: String| {
        let json = r#"{"type":"CUSTOM","name":"forged","value":0}"#;
        format!(
            "followed {} {prev}\n{}-{} CUSTOM {}\n{json}",
            first[0].epoch,
            first[0].pos.ms + 1,
            0,
            json.len()
        )
    };
    for note in [
        forged("0-0".into()),
        forged(format!("{}-{}", first[0].pos.ms, first[0].pos.seq + 1)),
        "followed garbage".to_string(),
        format!("not-followed {} 0-0\n1-1 CUSTOM 2\n{{}}", first[0].epoch),
    ] {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("agui:appended")
            .arg(note)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let items = tail.drain_for(Duration::from_millis(1000)).await;
    assert!(items.is_empty(), "delivered from a note: {items:?}");

    let next = log.append(&thread, &events(1..3)).await.unwrap();
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 2)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &next, &events(1..3));
    assert!(tail.drain_for(Duration::from_millis(700)).await.is_empty());
}
