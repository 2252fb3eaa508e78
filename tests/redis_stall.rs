//! A tail that notices when it stops (`log/redis/tail/probe.rs`): the node writes a probe
//! through its append path about every second and must read it back through its tail; when
//! it does not within `redis_tail_stall`, the tail reconnects and continues from its cursors,
//! and `/readyz` answers 503 meanwhile. Private `redis-server`s behind a loopback TCP proxy
//! (`common/tcp_proxy.rs`):
//!
//! - a failover behind a stable address: the node's append connection moves to the promoted
//!   replica, while its tail's connections stay on the old primary, which still answers
//!   `PING` but gets no more writes; the tail must notice and follow, losing and repeating
//!   nothing;
//! - the tail's connection half open (open, nothing carried either way, reconnects too): the
//!   node is not ready (and says why) for as long as it lasts, and ready again after, with
//!   every event delivered once.
//!
//! - the sizes of the streams a node follows are observable in aggregate.
//!
//! The tests run one at a time: the gauges are process-wide.

mod common;

use common::broker;
use common::redis_server::RedisServer;
use common::sse_client::{self, Subscription};
use common::tcp_proxy::Proxy;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn custom(i: usize) -> Value {
    json!({"type": "CUSTOM", "name": "n", "value": i})
}

/// Publishes until the broker takes it (its append connection may be reconnecting), for at
/// most [`WAIT`].
async fn publish(base: &str, thread: &str, event: &Value) {
    let deadline = Instant::now() + WAIT;
    loop {
        let resp = sse_client::publish(base, thread, std::slice::from_ref(event)).await;
        let status = resp.status();
        if status == 200 {
            return;
        }
        let body = resp.text().await.unwrap_or_default();
        assert_eq!(status, 503, "{body}");
        assert!(Instant::now() < deadline, "publishes still fail: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `/readyz`: its status and body.
async fn readyz(base: &str) -> (u16, String) {
    let resp = reqwest::get(format!("{base}/readyz")).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

/// Polls `/readyz` until it answers `status`; the body.
async fn readyz_becomes(base: &str, status: u16) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let (got, body) = readyz(base).await;
        if got == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {got} ({body}), not {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the metric until it reaches at least `at_least`.
async fn metric_reaches(base: &str, name: &str, labels: &[(&str, &str)], at_least: f64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let value = sse_client::metric(base, name, labels).await;
        if value >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} = {value}, not >= {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The next events' `value`s, exactly `n` of them.
async fn values(live: &mut Subscription, n: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for _ in 0..n {
        match live.next(WAIT).await {
            Some(r) => out.push(r.data["value"].as_u64().expect("a CUSTOM value")),
            None => panic!("no event within {WAIT:?} after {out:?}"),
        }
    }
    out
}

/// Subscribes to `thread` and starts a run on it (the order rules want `RUN_STARTED`
/// first); the subscription, past that event.
async fn start_run(base: &str, thread: &str) -> Subscription {
    let mut live = sse_client::subscribe(base, thread, "", None).await;
    publish(
        base,
        thread,
        &json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
    )
    .await;
    let first = live.next(WAIT).await.expect("RUN_STARTED");
    assert_eq!(first.data["type"], "RUN_STARTED");
    live
}

async fn start_broker(proxy: &Proxy) -> agui_fanout::app::Server {
    broker::start(|c| {
        c.redis_url = proxy.url();
        c.redis_block = Duration::from_millis(100);
        c.redis_tail_stall = Duration::from_secs(1);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_left_on_the_old_primary_notices_and_follows_the_failover() {
    let _serial = SERIAL.lock().await;
    let primary = RedisServer::start().await;
    let replica = RedisServer::start().await;
    replica.replicate(&primary).await;
    let proxy = Proxy::start(primary.port()).await;
    let server = start_broker(&proxy).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("failover-stall");
    let mut live = start_run(&base, &thread).await;
    for i in 0..2 {
        publish(&base, &thread, &custom(i)).await;
    }
    assert_eq!(values(&mut live, 2).await, [0, 1]);

    // Failover behind the proxy's address: the replica (holding everything) is promoted and
    // takes new connections; the node's append connection is cut and reconnects there, while
    // the tail's reader and subscription stay on the old primary, which answers them.
    primary.replicated_to(&replica).await;
    replica.promote().await;
    proxy.set_upstream(replica.port());
    let cut = proxy
        .close_where(|head| !contains(head, b"agui-fanout-tail") && !contains(head, b"SUBSCRIBE"));
    assert!(cut >= 1, "the append connection was open");
    for i in 2..4 {
        publish(&base, &thread, &custom(i)).await;
    }
    assert_eq!(
        values(&mut live, 2).await,
        [2, 3],
        "the tail follows the writes to the promoted replica"
    );
    metric_reaches(
        &base,
        "agui_redis_tail_stalls_total",
        &[("path", "read")],
        1.0,
    )
    .await;
    // The subscription, left on the old primary too, is taken again where the writes go.
    metric_reaches(
        &base,
        "agui_redis_tail_stalls_total",
        &[("path", "notes")],
        1.0,
    )
    .await;
    publish(&base, &thread, &custom(4)).await;
    assert_eq!(values(&mut live, 1).await, [4]);
    readyz_becomes(&base, 200).await;
    assert!(
        live.next(Duration::from_millis(300)).await.is_none(),
        "nothing repeated"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_tail_makes_the_node_unready_until_it_reads_again() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start().await;
    let proxy = Proxy::start(redis.port()).await;
    let server = start_broker(&proxy).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("half-open");
    readyz_becomes(&base, 200).await;
    let mut live = start_run(&base, &thread).await;
    publish(&base, &thread, &custom(0)).await;
    assert_eq!(values(&mut live, 1).await, [0]);
    // Probes come back: the newest is younger than the stall threshold.
    let age = sse_client::metric(&base, "agui_redis_tail_probe_age_seconds", &[]).await;
    assert!(age < 1.0, "probe age {age}");

    // The reader's connection, and any it opens, carry nothing more; the node's other
    // connections work, so publishes are still taken.
    assert_eq!(proxy.freeze_matching(b"agui-fanout-tail"), 1);
    publish(&base, &thread, &custom(1)).await;
    let body = readyz_becomes(&base, 503).await;
    assert!(body.contains("redis tail stalled"), "{body}");
    metric_reaches(&base, "agui_redis_tail_stalled", &[], 1.0).await;
    metric_reaches(&base, "agui_redis_tail_probe_age_seconds", &[], 1.0).await;
    // Still stalled after the reader's reconnects were frozen in turn: not ready throughout.
    let stalls =
        sse_client::metric(&base, "agui_redis_tail_stalls_total", &[("path", "read")]).await;
    metric_reaches(
        &base,
        "agui_redis_tail_stalls_total",
        &[("path", "read")],
        stalls + 1.0,
    )
    .await;
    assert_eq!(readyz(&base).await.0, 503);

    proxy.heal();
    readyz_becomes(&base, 200).await;
    publish(&base, &thread, &custom(2)).await;
    assert_eq!(
        values(&mut live, 2).await,
        [1, 2],
        "each event once, in order"
    );
    assert!(
        live.next(Duration::from_millis(300)).await.is_none(),
        "nothing repeated"
    );
    let deadline = Instant::now() + WAIT;
    while sse_client::metric(&base, "agui_redis_tail_stalled", &[]).await != 0.0 {
        assert!(Instant::now() < deadline, "agui_redis_tail_stalled still 1");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// A stall the probe acts on while the reader has no connection (each reconnect hangs) must
/// not drop the first connection that works. The wake-up it left used to drop that fresh
/// connection at its first read, before it read the probes back; once the reader's backoff
/// outlasted `redis_tail_stall`, every backoff held another such wake-up, so every reconnect
/// was dropped and the node stayed unready after Redis was fine again (deploy/rolling met it
/// after a Redis primary was killed: one broker out of rotation for 14 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_seen_between_connections_does_not_drop_the_next_one() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start().await;
    let proxy = Proxy::start(redis.port()).await;
    let server = broker::start(|c| {
        c.redis_url = proxy.url();
        c.redis_block = Duration::from_millis(100);
        c.redis_tail_stall = Duration::from_millis(500);
    })
    .await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("stall-between");
    readyz_becomes(&base, 200).await;
    let mut live = start_run(&base, &thread).await;
    publish(&base, &thread, &custom(0)).await;
    assert_eq!(values(&mut live, 1).await, [0]);

    // The reader's connection, and each one it opens, hangs (a reconnect fails after the 2 s
    // operation timeout), so the probe acts on the stall while the reader is connecting. After
    // five failures its backoff (800 ms to 1.6 s) is longer than the stall threshold.
    let tail_errors = [("backend", "redis"), ("op", "tail")];
    let errors = sse_client::metric(&base, "agui_backend_errors_total", &tail_errors).await;
    assert_eq!(proxy.freeze_matching(b"agui-fanout-tail"), 1);
    publish(&base, &thread, &custom(1)).await;
    readyz_becomes(&base, 503).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while sse_client::metric(&base, "agui_backend_errors_total", &tail_errors).await < errors + 5.0
    {
        assert!(
            Instant::now() < deadline,
            "the reader's reconnects did not fail"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Redis reachable again: the next connection reads the probes back.
    proxy.heal();
    readyz_becomes(&base, 200).await;
    publish(&base, &thread, &custom(2)).await;
    assert_eq!(
        values(&mut live, 2).await,
        [1, 2],
        "each event once, in order"
    );
    server.stop().await;
}

/// The sizes of the streams a node follows are observable in aggregate: entries and bytes,
/// summed and largest (sampled every ten `redis_block`s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followed_stream_sizes_are_observable() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start().await;
    let proxy = Proxy::start(redis.port()).await;
    let server = start_broker(&proxy).await;
    let base = broker::base(server.addr);
    let (small, large) = (broker::thread_id("small"), broker::thread_id("large"));
    let _subs = (
        start_run(&base, &small).await,
        start_run(&base, &large).await,
    );
    for i in 0..3 {
        publish(&base, &small, &custom(i)).await;
    }
    for i in 0..5 {
        publish(&base, &large, &custom(i)).await;
    }
    metric_reaches(&base, "agui_redis_followed_stream_entries", &[], 10.0).await;
    assert_eq!(
        sse_client::metric(&base, "agui_redis_followed_stream_entries", &[]).await,
        10.0
    );
    assert_eq!(
        sse_client::metric(&base, "agui_redis_followed_stream_entries_max", &[]).await,
        6.0
    );
    let bytes = sse_client::metric(&base, "agui_redis_followed_stream_bytes", &[]).await;
    let largest = sse_client::metric(&base, "agui_redis_followed_stream_bytes_max", &[]).await;
    assert!(largest > 0.0 && largest < bytes, "{largest} of {bytes}");
    server.stop().await;
}
