//! The Redis backend under outages: Redis killed and restarted (with or without its data), a
//! frozen server, connecting while down, bad configuration, a thread's keys of a foreign type.
//! Tests that stop or restart Redis run their own `redis-server` child
//! (`common/redis_server.rs`). Harness: `common/logs.rs`.

#[allow(dead_code, unreachable_pub)]
mod common {
    pub mod logs;
    pub mod redis_server;
}

use agui_fanout::event::ThreadId;
use agui_fanout::log::redis::{RedisLog, RedisLogConfig};
use agui_fanout::log::{EventLog, LogError, ReadFrom, ResumeGap, StreamPos};
use common::logs::*;
use common::redis_server::RedisServer;
use std::time::{Duration, Instant};

fn outage_config(server: &RedisServer) -> RedisLogConfig {
    RedisLogConfig {
        op_timeout: Duration::from_millis(500),
        outcome_timeout: Duration::from_millis(500),
        block: Duration::from_millis(500),
        retention: UNBOUNDED,
        ..RedisLogConfig::new(server.url())
    }
}

fn assert_unavailable<T: std::fmt::Debug>(r: Result<T, LogError>, started: Instant) {
    assert!(matches!(r, Err(LogError::Unavailable(_))), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

/// An append that failed, fast, without claiming it appended anything: `Unavailable` (it did
/// not run) or `OutcomeUnknown` (it was written to a connection Redis dropped, and no Redis was
/// there to say whether it ran; PROTOCOL §2 "Unknown outcomes").
fn assert_append_failed<T: std::fmt::Debug>(r: Result<T, LogError>, started: Instant) {
    assert!(
        matches!(
            r,
            Err(LogError::Unavailable(_) | LogError::OutcomeUnknown(_))
        ),
        "{r:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

async fn wait_ready(log: &dyn EventLog) {
    let deadline = Instant::now() + WITHIN;
    while log.ping().await.is_err() {
        assert!(Instant::now() < deadline, "redis never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Redis killed and restarted empty: calls fail fast with `Unavailable`, the tail survives,
/// reports the new epoch and delivers what is appended after the restart.
#[tokio::test]
async fn redis_outage_and_restart_without_data() {
    let mut server = RedisServer::start().await;
    let log = RedisLog::connect(outage_config(&server)).await.unwrap();
    let mut tail = TailHarness::start(&log);
    let thread = ThreadId::parse("outage").unwrap();
    let head = log.head(&thread).await.unwrap();
    tail.tail.follow(thread.clone(), head.epoch, head.last);
    let evs = events(0..3);
    let ids = log.append(&thread, &evs).await.unwrap();
    let got = tail.collect_one(&thread, 3).await;
    assert_entries(&got, &ids, &evs);

    server.kill();
    let started = Instant::now();
    assert_append_failed(log.append(&thread, &events(3..4)).await, started);
    let started = Instant::now();
    assert_unavailable(log.head(&thread).await, started);
    let started = Instant::now();
    assert_unavailable(log.read(&thread, ReadFrom::Start, 10).await, started);
    let started = Instant::now();
    assert_unavailable(log.ping().await, started);
    // The tail retries in the background meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    server.restart().await;
    wait_ready(&log).await;
    let new_head = log.head(&thread).await.unwrap();
    assert_ne!(new_head.epoch, head.epoch);
    let h = tail
        .expect_discontinuity(&thread, ResumeGap::OtherEpoch)
        .await;
    assert_eq!(h.epoch, new_head.epoch);
    let evs = events(10..14);
    let ids = log.append(&thread, &evs).await.unwrap();
    assert_eq!(ids[0].epoch, new_head.epoch);
    let got = tail.collect_one(&thread, 4).await;
    assert_entries(&got, &ids, &evs);
}

/// Connections dropped while Redis keeps its data: the tail reconnects and continues exactly
/// from its cursor, no discontinuity, nothing lost or repeated.
#[tokio::test]
async fn redis_tail_continues_after_connection_loss() {
    let server = RedisServer::start().await;
    let log = RedisLog::connect(outage_config(&server)).await.unwrap();
    let mut tail = TailHarness::start(&log);
    let thread = ThreadId::parse("conn-loss").unwrap();
    let head = log.head(&thread).await.unwrap();
    tail.tail.follow(thread.clone(), head.epoch, head.last);
    let evs = events(0..40);
    let mut ids = log.append(&thread, &evs[..10]).await.unwrap();
    tail.collect_one(&thread, 10).await;

    let mut admin = redis_conn(&server.url()).await;
    for chunk in evs[10..].chunks(10) {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .unwrap();
        // The shared connection may see the kill on this call: retry like a producer would.
        let deadline = Instant::now() + WITHIN;
        loop {
            match log.append(&thread, chunk).await {
                Ok(more) => {
                    ids.extend(more);
                    break;
                }
                Err(e) => {
                    assert!(Instant::now() < deadline, "{e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    let got = tail.collect_one(&thread, 30).await;
    assert_entries(&got, &ids[10..], &evs[10..]);
    assert!(tail.drain_for(Duration::from_millis(300)).await.is_empty());
}

/// A frozen Redis (accepts nothing, answers nothing): calls return within their deadlines; the
/// append, sent to Redis, is reported with an unknown outcome (it runs once Redis thaws).
#[tokio::test]
async fn redis_frozen_server_never_hangs() {
    let server = RedisServer::start().await;
    let log = RedisLog::connect(outage_config(&server)).await.unwrap();
    let thread = ThreadId::parse("frozen").unwrap();
    log.append(&thread, &events(0..1)).await.unwrap();
    server.pause();
    let started = Instant::now();
    let frozen = log.append(&thread, &events(1..2)).await;
    assert!(
        matches!(frozen, Err(LogError::OutcomeUnknown(_))),
        "{frozen:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    let started = Instant::now();
    assert_unavailable(log.ping().await, started);
    server.resume();
    wait_ready(&log).await;
    let ids = log.append(&thread, &events(2..3)).await.unwrap();
    assert_eq!(log.head(&thread).await.unwrap().last, ids[0].pos);
}

/// The broker starts while Redis is down (not ready), and works once Redis is up.
#[tokio::test]
async fn redis_connect_while_down() {
    let mut server = RedisServer::start().await;
    server.kill();
    let started = Instant::now();
    let log = RedisLog::connect(outage_config(&server)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    let mut tail = TailHarness::start(&log);
    let thread = ThreadId::parse("late").unwrap();
    let started = Instant::now();
    assert_unavailable(log.ping().await, started);
    let started = Instant::now();
    assert_unavailable(log.append(&thread, &events(0..1)).await, started);

    server.restart().await;
    wait_ready(&log).await;
    let head = log.head(&thread).await.unwrap();
    tail.tail.follow(thread.clone(), head.epoch, head.last);
    let evs = events(0..2);
    let ids = log.append(&thread, &evs).await.unwrap();
    let got = tail.collect_one(&thread, 2).await;
    assert_entries(&got, &ids, &evs);
}

/// Bad configuration is refused; a good one connects (the sanity path of `connect`).
#[tokio::test]
async fn redis_connect_rejects_bad_config() {
    let bad_prefix = RedisLogConfig {
        prefix: "a{b}".into(),
        ..RedisLogConfig::new(redis_url())
    };
    assert!(RedisLog::connect(bad_prefix).await.is_err());
    assert!(
        RedisLog::connect(RedisLogConfig::new("not a url"))
            .await
            .is_err()
    );
}

/// A thread whose key holds another type (someone else's data) fails on its own: its calls
/// return `Unavailable`, and the tail keeps delivering every other thread.
#[tokio::test]
async fn redis_foreign_key_type_is_isolated() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let bad = f.thread();
    let good = f.thread();
    let mut conn = redis_conn(&redis_url()).await;
    let _: () = redis::cmd("SET")
        .arg(stream_key(&bad))
        .arg("not a stream")
        .query_async(&mut conn)
        .await
        .unwrap();
    let append = log.append(&bad, &events(0..1)).await;
    assert!(
        matches!(append, Err(LogError::Unavailable(_))),
        "{append:?}"
    );
    let read = log.read(&bad, ReadFrom::Start, 10).await;
    assert!(matches!(read, Err(LogError::Unavailable(_))), "{read:?}");
    assert!(matches!(
        log.head(&bad).await,
        Err(LogError::Unavailable(_))
    ));

    let head = log.head(&good).await.unwrap();
    tail.tail.follow(bad.clone(), head.epoch, StreamPos::ZERO);
    tail.tail.follow(good.clone(), head.epoch, head.last);
    let evs = events(0..3);
    let ids = log.append(&good, &evs).await.unwrap();
    let got = tail.collect_one(&good, 3).await;
    assert_entries(&got, &ids, &evs);
}
