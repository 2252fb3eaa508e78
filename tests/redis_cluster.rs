//! The `redis` backend on a Redis Cluster (a private 3-primary cluster started here,
//! `common/redis_cluster.rs`), with `redis_url` listing the seed nodes:
//!
//! - threads on every primary: publishes on one node reach subscribers on another (through
//!   the tail's per-primary reads and the append notes), and resume is exact;
//! - a slot migrating to another primary under a live subscriber (`MOVED`, `ASK`): every
//!   event is delivered once, in order, and publishing goes on;
//! - failovers (3 primaries with a replica each): a replica promoted with `CLUSTER FAILOVER`,
//!   then a primary killed (SIGKILL) after its replica caught up: every event once, in
//!   order, resume exact;
//! - notes go through sharded pub/sub, one channel per thread on its shard, and carry events
//!   to subscribers on their own;
//! - configurations that cannot work are refused at start: several URLs of Redis servers that
//!   are not a cluster, a database other than 0 with a cluster.
//!
//! A failing test shows the brokers' log lines (`info` and above; `RUST_LOG` for more).

mod common;

use agui_fanout::app;
use common::broker;
use common::redis_cluster::RedisCluster;
use common::redis_server::RedisServer;
use common::sse_client::{self, Subscription};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

/// The hash slot of a thread's keys (`{threadId}` hash tag; the Redis Cluster specification).
fn slot(thread: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(thread.as_bytes()) % 16384
}

fn custom(i: u64) -> Value {
    json!({"type": "CUSTOM", "name": "n", "value": i})
}

/// Publishes one event, retrying a 503 (a slot moving) for at most [`WAIT`]; its id.
async fn publish(base: &str, thread: &str, event: &Value) -> String {
    let deadline = Instant::now() + WAIT;
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

/// The next `n` events' `(id, value)` (`value` of a `CUSTOM`, else its type).
async fn take(live: &mut Subscription, n: usize) -> Vec<(String, Value)> {
    live.take(n, WAIT)
        .await
        .into_iter()
        .map(|r| {
            let v = match r.data["type"].as_str() {
                Some("CUSTOM") => r.data["value"].clone(),
                _ => r.data["type"].clone(),
            };
            (r.id, v)
        })
        .collect()
}

fn run_started(thread: &str) -> Value {
    json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"})
}

async fn start_node(cluster: &RedisCluster) -> app::Server {
    broker::start(|c| {
        c.redis_url = cluster.seeds();
        c.redis_block = Duration::from_millis(200);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_on_every_primary_are_published_subscribed_and_resumed() {
    common::trace::capture_broker_logs();
    let cluster = RedisCluster::start(3, 0).await;
    let a = start_node(&cluster).await;
    let b = start_node(&cluster).await;
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));

    // Two threads on each primary.
    let mut by_primary: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    while by_primary.len() < 3 || by_primary.values().any(|t| t.len() < 2) {
        let thread = broker::thread_id("cluster");
        let owner = cluster.owner(slot(&thread)).await;
        let threads = by_primary.entry(owner).or_default();
        if threads.len() < 2 {
            threads.push(thread);
        }
    }
    let threads: Vec<String> = by_primary.values().flatten().cloned().collect();
    let mut subs = Vec::new();
    for thread in &threads {
        subs.push(sse_client::subscribe(&base_b, thread, "", None).await);
    }
    // Published on node A, one event per publish, interleaved across threads.
    for thread in &threads {
        publish(&base_a, thread, &run_started(thread)).await;
    }
    for i in 0..5 {
        for thread in &threads {
            publish(&base_a, thread, &custom(i)).await;
        }
    }
    for (thread, sub) in threads.iter().zip(&mut subs) {
        let got = take(sub, 6).await;
        let values: Vec<&Value> = got.iter().map(|(_, v)| v).collect();
        assert_eq!(
            values,
            [
                &json!("RUN_STARTED"),
                &json!(0),
                &json!(1),
                &json!(2),
                &json!(3),
                &json!(4)
            ],
            "{thread}"
        );
        // Resume on node A after the third event: exactly the rest.
        let mut resumed = sse_client::subscribe(&base_a, thread, "", Some(&got[2].0)).await;
        assert_eq!(take(&mut resumed, 3).await, got[3..].to_vec(), "{thread}");
    }
    // Every primary holds its threads' keys.
    for (primary, threads) in &by_primary {
        for thread in threads {
            let len = cluster
                .command(*primary, &["XLEN", &format!("agui:{{{thread}}}:log")])
                .await;
            assert_eq!(len, "6", "{thread} on its primary {primary}");
        }
    }
    for base in [&base_a, &base_b] {
        let ready = reqwest::get(format!("{base}/readyz")).await.unwrap();
        assert_eq!(ready.status(), 200);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_under_a_subscriber_loses_and_repeats_nothing() {
    common::trace::capture_broker_logs();
    let cluster = RedisCluster::start(3, 0).await;
    let a = start_node(&cluster).await;
    let b = start_node(&cluster).await;
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let thread = broker::thread_id("reshard");
    let mut live = sse_client::subscribe(&base_b, &thread, "", None).await;
    publish(&base_a, &thread, &run_started(&thread)).await;
    for i in 0..10 {
        publish(&base_a, &thread, &custom(i)).await;
    }
    let before = take(&mut live, 11).await;

    // The thread's slot moves to another primary while both nodes keep going.
    let from = cluster.owner(slot(&thread)).await;
    let to = *cluster
        .master_ports()
        .await
        .iter()
        .find(|p| **p != from)
        .expect("another primary");
    let migrate = cluster.migrate_slot(slot(&thread), to);
    let publishes = async {
        for i in 10..30 {
            publish(&base_a, &thread, &custom(i)).await;
        }
    };
    tokio::join!(migrate, publishes);
    assert_eq!(cluster.owner(slot(&thread)).await, to);
    for i in 30..40 {
        publish(&base_b, &thread, &custom(i)).await;
    }
    let after = take(&mut live, 30).await;
    let values: Vec<u64> = after.iter().map(|(_, v)| v.as_u64().unwrap()).collect();
    assert_eq!(values, (10..40).collect::<Vec<_>>());
    assert!(
        live.next(Duration::from_millis(500)).await.is_none(),
        "nothing repeated"
    );
    // Resume across the move is exact.
    let mut resumed = sse_client::subscribe(&base_a, &thread, "", Some(&before[5].0)).await;
    let rest = take(&mut resumed, 35).await;
    assert_eq!(rest[..5], before[6..]);
    assert_eq!(rest[5..], after[..]);
    a.stop().await;
    b.stop().await;
}

/// Notes are sharded (`SPUBLISH` on each thread's own channel, in its slot): a node
/// subscribes to the channels of the threads it follows, on their primaries, and nothing goes
/// through classic pub/sub. With `redis_block` at 60 s the tail reads a followed stream only
/// when it starts following it, so events published afterwards arrive through the notes alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notes_go_through_each_threads_shard_channel() {
    common::trace::capture_broker_logs();
    let cluster = RedisCluster::start(3, 0).await;
    let slow = |c: &mut agui_fanout::config::Config| {
        c.redis_url = cluster.seeds();
        c.redis_block = Duration::from_secs(60);
    };
    let a = broker::start(slow).await;
    let b = broker::start(slow).await;
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let mut threads: BTreeMap<u16, String> = BTreeMap::new();
    while threads.len() < 3 {
        let thread = broker::thread_id("sharded");
        threads
            .entry(cluster.owner(slot(&thread)).await)
            .or_insert(thread);
    }
    let mut subs = Vec::new();
    for (primary, thread) in &threads {
        subs.push(sse_client::subscribe(&base_b, thread, "", None).await);
        let channel = format!("agui:{{{thread}}}:n");
        let deadline = Instant::now() + WAIT;
        loop {
            let counts = cluster
                .command(*primary, &["PUBSUB", "SHARDNUMSUB", &channel])
                .await;
            // `[channel, count]`, as text: the count last.
            if counts.ends_with('1') {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{channel} not subscribed on {primary}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for thread in threads.values() {
        publish(&base_a, thread, &run_started(thread)).await;
        publish_all(&base_a, thread, 0..3).await;
    }
    for (thread, sub) in threads.values().zip(&mut subs) {
        let got: Vec<Value> = take(sub, 4).await.into_iter().map(|(_, v)| v).collect();
        assert_eq!(
            got,
            [json!("RUN_STARTED"), json!(0), json!(1), json!(2)],
            "{thread}"
        );
    }
    for port in cluster.master_ports().await {
        let numsub = cluster
            .command(port, &["PUBSUB", "NUMSUB", "agui:appended"])
            .await;
        assert!(
            numsub.ends_with('0'),
            "classic subscribers on {port}: {numsub}"
        );
    }
    a.stop().await;
    b.stop().await;
}

/// Publishes `values` on `base` one per publish (retrying while the cluster fails over).
async fn publish_all(base: &str, thread: &str, values: std::ops::Range<u64>) {
    for i in values {
        publish(base, thread, &custom(i)).await;
    }
}

/// Waits (up to [`WAIT`] × 3) until the primary of `slot` is `port`.
async fn owner_becomes(cluster: &RedisCluster, slot: u16, port: u16) {
    let deadline = Instant::now() + WAIT * 3;
    while cluster.owner(slot).await != port {
        assert!(Instant::now() < deadline, "slot {slot} not on {port}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asks `replica` to take over `slot` (`CLUSTER FAILOVER`) until it owns it, for up to
/// [`WAIT`] × 3. Redis aborts a manual failover the old primary does not answer within
/// `cluster-mf-timeout` (5 s) and does not retry it; on a loaded 2-core machine (the whole
/// suite in parallel) that happens, so the request is repeated every 6 s.
async fn fail_over(cluster: &RedisCluster, slot: u16, replica: u16) {
    let deadline = Instant::now() + WAIT * 3;
    'ask: loop {
        let reply = cluster.command(replica, &["CLUSTER", "FAILOVER"]).await;
        let asked = Instant::now();
        while cluster.owner(slot).await != replica {
            assert!(
                Instant::now() < deadline,
                "slot {slot} not on {replica} (last CLUSTER FAILOVER reply: {reply})"
            );
            if asked.elapsed() > Duration::from_secs(6) {
                continue 'ask;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        return;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failovers_lose_and_repeat_nothing() {
    common::trace::capture_broker_logs();
    let mut cluster = RedisCluster::start(3, 1).await;
    let a = start_node(&cluster).await;
    let b = start_node(&cluster).await;
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let thread = broker::thread_id("failover");
    let slot = slot(&thread);
    let mut live = sse_client::subscribe(&base_b, &thread, "", None).await;
    publish(&base_a, &thread, &run_started(&thread)).await;
    publish_all(&base_a, &thread, 0..10).await;
    let mut got = take(&mut live, 11).await;

    // A replica takes over on request (`CLUSTER FAILOVER`: it catches up first) while both
    // nodes keep publishing.
    let primary = cluster.owner(slot).await;
    let replica = cluster.replica_of(primary).await;
    let publishes = async {
        publish_all(&base_a, &thread, 10..20).await;
        publish_all(&base_b, &thread, 20..30).await;
    };
    tokio::join!(fail_over(&cluster, slot, replica), publishes);
    publish_all(&base_a, &thread, 30..35).await;
    got.extend(take(&mut live, 25).await);

    // The new primary is killed once its replica (the old primary) holds everything: the
    // replica is promoted after the node timeout; publishes fail meanwhile, then go on.
    let primary = replica;
    let replica = cluster.replica_of(primary).await;
    cluster.replicated(primary, replica).await;
    cluster.kill(primary);
    let publishes = publish_all(&base_b, &thread, 35..45);
    tokio::join!(owner_becomes(&cluster, slot, replica), publishes);
    publish_all(&base_a, &thread, 45..50).await;
    got.extend(take(&mut live, 15).await);

    let values: Vec<&Value> = got[1..].iter().map(|(_, v)| v).collect();
    let expected: Vec<Value> = (0..50).map(|i| json!(i)).collect();
    assert_eq!(values, expected.iter().collect::<Vec<_>>());
    sse_client::assert_strictly_increasing(
        &got.iter()
            .map(|(id, v)| sse_client::Received {
                id: id.clone(),
                data: v.clone(),
            })
            .collect::<Vec<_>>(),
    );
    assert!(
        live.next(Duration::from_millis(500)).await.is_none(),
        "nothing repeated"
    );
    // Resume from before both failovers is exact.
    let mut resumed = sse_client::subscribe(&base_a, &thread, "", Some(&got[5].0)).await;
    assert_eq!(take(&mut resumed, got.len() - 6).await, got[6..].to_vec());
    a.stop().await;
    b.stop().await;
}

/// The error `app::start` refuses to start with.
async fn start_error(url: String) -> String {
    let mut config = broker::test_config();
    config.redis_url = url;
    match app::start(config).await {
        Ok(server) => {
            server.stop().await;
            panic!("the broker started");
        }
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configurations_that_cannot_work_are_refused_at_start() {
    common::trace::capture_broker_logs();
    let (one, two) = (RedisServer::start().await, RedisServer::start().await);
    let e = start_error(format!("{},{}", one.url(), two.url())).await;
    assert!(e.contains("not a Redis Cluster"), "{e}");

    let cluster = RedisCluster::start(3, 0).await;
    let seeds: Vec<String> = cluster
        .seeds()
        .split(',')
        .map(|u| format!("{u}/2"))
        .collect();
    let e = start_error(seeds.join(",")).await;
    assert!(e.contains("only database 0"), "{e}");

    let e = start_error(format!("{},rediss://127.0.0.1:1", one.url())).await;
    assert!(e.contains("mix redis:// and rediss://"), "{e}");

    // One seed of the cluster is enough: the cluster is found and used.
    let first = cluster.seeds().split(',').next().unwrap().to_string();
    let node = broker::start(|c| c.redis_url = first).await;
    let base = broker::base(node.addr);
    let thread = broker::thread_id("one-seed");
    let mut live = sse_client::subscribe(&base, &thread, "", None).await;
    publish(&base, &thread, &run_started(&thread)).await;
    assert_eq!(take(&mut live, 1).await[0].1, json!("RUN_STARTED"));
    node.stop().await;
}
