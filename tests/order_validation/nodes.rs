//! Order validation across two broker processes sharing Redis (the checks of `main.rs` on two
//! nodes, a producer alternating between nodes, an entry `XADD`ed directly, checkpoints while
//! alternating).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_concurrent_run_starts_one_wins() {
    let (a, b) = two_nodes().await;
    let stale = concurrent_run_starts_one_wins(&[a.base(), b.base()], "redis/two nodes")
        .await
        .expect("two nodes");
    println!("appends refused by the log's compare-and-append: {stale}");
    assert!(
        stale >= 1.0,
        "the stale node's first contender reached the compare-and-append"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_concurrent_producers_interleave_validly() {
    let (a, b) = two_nodes().await;
    concurrent_producers_interleave_validly(&[a.base(), b.base()], "redis/two nodes").await;
}

/// A producer behind a load balancer: a recorded run published one event per POST, to the two
/// nodes in turn. Each event is valid at the log's latest position, so every one must be
/// accepted (PROTOCOL §2: order validation refuses what would make the *log* break the rules), and
/// the log must read back as the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_producer_alternating_between_nodes_is_accepted() {
    let (a, b) = two_nodes().await;
    let bases = [a.base(), b.base()];
    let mut refused = Vec::new();
    for source in agui::recorded_sources()
        .into_iter()
        .filter(|s| s.name.starts_with("Step02/") || s.name.starts_with("Step04/"))
    {
        let thread = broker::thread_id("order-alternate");
        let events = source.retargeted(&thread);
        let mut accepted = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let node = i % 2;
            let r = publish_one(&bases[node], &thread, e).await;
            if r.status == 200 {
                accepted.push(e.clone());
            } else {
                refused.push(format!(
                    "{} #{i} {} via node {node}: {} {}",
                    source.name, e["type"], r.status, r.body
                ));
            }
        }
        assert_eq!(log_events(&bases[0], &thread).await, accepted);
    }
    assert!(
        refused.is_empty(),
        "{} events refused:\n{}",
        refused.len(),
        refused.join("\n")
    );
}

/// A producer may `XADD` to a thread's stream directly (PROTOCOL §2); an entry the broker cannot
/// validate is skipped, never delivered. One such entry at the end of the stream must not stop
/// the broker's own publishes: they follow it (compare-and-append against the stream's newest
/// entry), the log reads back as the valid events, and the thread's fold is unchanged. Fails
/// when catching up stops at the last *valid* entry (every retry conflicts: 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_follow_an_invalid_entry_xadded_at_the_end() {
    let server = broker::start_redis().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("order-invalid-tail");
    let mut conn = redis::Client::open(broker::redis_url())
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let run = json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"});
    let r = publish_one(&base, &thread, &run).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let mut accepted = vec![run];
    // Not JSON, then no `e` field: both skipped by every read.
    for (field, value) in [("e", "not json"), ("x", "{}")] {
        let _: String = redis::cmd("XADD")
            .arg(format!("agui:{{{thread}}}:log"))
            .arg("*")
            .arg(field)
            .arg(value)
            .query_async(&mut conn)
            .await
            .expect("XADD");
        let i = accepted.len();
        let e = json!({"type": "STATE_SNAPSHOT", "snapshot": {"i": i}});
        let r = publish_one(&base, &thread, &e).await;
        assert_eq!(
            r.status, 200,
            "publish after invalid entry {field}: {:?}",
            r.body
        );
        accepted.push(e);
    }
    assert_eq!(log_events(&base, &thread).await, accepted);
    assert_eq!(snapshot(&base, &thread).await["state"], json!({"i": 2}));
}

/// Two nodes sharing Redis, one producer alternating between them one event per `POST`,
/// `retention.max_events = 10`: every append of a node conflicts once (the other node appended
/// last), yet the thread gets checkpoints, so the stream stays bounded, the snapshot is
/// served after trimming, and a node started afterwards still checks order. Fails when a
/// conflict throws the batch's checkpoint candidate away (found by an adversarial pass: no
/// checkpoint ever, the stream trimmed by `MAXLEN` alone, snapshot 503, order checks off on a
/// new node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_alternating_keep_checkpoints() {
    let env = [
        ("AGUI_REDIS_URL", broker::redis_url()),
        ("AGUI_RETENTION__MAX_EVENTS", "10".to_string()),
    ];
    let (a, b) = (
        BrokerProcess::spawn(&env).await,
        BrokerProcess::spawn(&env).await,
    );
    let bases = [a.base(), b.base()];
    let thread = broker::thread_id("order-two-node-ckpt");
    let start = [
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}),
    ];
    assert_eq!(publish_batch(&bases[0], &thread, &start).await.status, 200);
    let mut text = String::new();
    for i in 0..100 {
        let delta = format!("{i},");
        let e = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": delta});
        let r = publish_one(&bases[i % 2], &thread, &e).await;
        assert_eq!(r.status, 200, "#{i}: {:?}", r.body);
        text.push_str(&delta);
    }
    let mut redis = redis::Client::open(broker::redis_url())
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let pos: Option<String> = redis::cmd("HGET")
        .arg(format!("agui:{{{thread}}}:ckpt"))
        .arg("pos")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(pos.is_some(), "no checkpoint was promoted");
    let len: usize = redis::cmd("XLEN")
        .arg(format!("agui:{{{thread}}}:log"))
        .query_async(&mut redis)
        .await
        .unwrap();
    // Promotions at least `max_events` apart: at least that many entries stay.
    assert!(
        (10..=40).contains(&len),
        "{len} entries kept with max_events = 10"
    );
    for base in &bases {
        let s = snapshot(base, &thread).await;
        assert_eq!(s["messages"][0]["content"], text.as_str(), "{s}");
    }
    // A node that never saw the thread rebuilds its fold from the checkpoint and checks order.
    let c = BrokerProcess::spawn(&env).await;
    let bad = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "nope", "delta": "x"});
    let r = publish_one(&c.base(), &thread, &bad).await;
    assert_eq!(r.status, 409, "{:?}", r.body);
}
