//! Orphaned runs (PROTOCOL §2, `runs.orphan_timeout`) with two broker nodes on one private
//! `redis-server`: a run whose producer went silent gets exactly one `RUN_ERROR`
//! (`code: "orphaned"`) although both nodes sweep, a subscriber on the other node sees it
//! live, and the thread takes the next run; a run published through a node that then stops
//! is closed by the node that remains (the registry is in Redis).

mod common;

use common::redis_server::RedisServer;
use common::sse_client::{self, publish, publish_ok};
use common::{broker, logs};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(300);
/// Longest wait for the sweep (it closes within about twice the timeout).
const WITHIN: Duration = Duration::from_secs(10);

async fn node(redis: &RedisServer) -> agui_fanout::app::Server {
    let url = redis.url();
    broker::start(move |c| {
        c.redis_url = url;
        c.runs.orphan_timeout = TIMEOUT;
    })
    .await
}

/// The `type` and `code` of every entry of the thread's Redis stream.
async fn logged(redis: &RedisServer, thread: &str) -> Vec<(String, Option<String>)> {
    let mut conn = logs::redis_conn(&redis.url()).await;
    let thread = agui_fanout::event::ThreadId::parse(thread).expect("a thread id");
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(logs::stream_key(&thread))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    entries
        .into_iter()
        .map(|(_, fields)| {
            let event: Value = serde_json::from_str(&fields[0].1).expect("JSON entry");
            let code = event["code"].as_str().map(str::to_string);
            (event["type"].as_str().unwrap_or("").to_string(), code)
        })
        .collect()
}

async fn run_status(base: &str, thread: &str) -> Value {
    let snapshot: Value = reqwest::get(format!("{base}/v1/threads/{thread}/snapshot"))
        .await
        .expect("snapshot")
        .json()
        .await
        .expect("snapshot JSON");
    snapshot["run"]["status"].clone()
}

async fn wait_errored(base: &str, thread: &str) {
    let start = Instant::now();
    while run_status(base, thread).await != "errored" {
        assert!(start.elapsed() < WITHIN, "the orphaned run was not closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_close_a_silent_run_once_and_take_the_next() {
    let redis = RedisServer::start().await;
    let (a, b) = (node(&redis).await, node(&redis).await);
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let thread = broker::thread_id("orphan");
    let mut viewer = sse_client::subscribe(&base_b, &thread, "", None).await;
    publish_ok(
        &base_a,
        &thread,
        &[
            json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "half an"}),
        ],
    )
    .await;
    // The producer dies here: nothing else comes.

    wait_errored(&base_a, &thread).await;
    // Both nodes keep sweeping for several timeouts: still one RUN_ERROR.
    tokio::time::sleep(TIMEOUT * 5).await;
    let got = logged(&redis, &thread).await;
    let errors: Vec<_> = got.iter().filter(|(t, _)| t == "RUN_ERROR").collect();
    assert_eq!(errors.len(), 1, "{got:?}");
    assert_eq!(errors[0].1.as_deref(), Some("orphaned"));
    assert_eq!(got.len(), 4, "{got:?}");

    // The viewer on the other node saw the run end.
    let seen = viewer.take(4, WITHIN).await;
    assert_eq!(seen[3].data["type"], "RUN_ERROR");
    assert_eq!(seen[3].data["code"], "orphaned");
    assert_eq!(seen[3].data["metadata"]["agui-fanout"]["runId"], "r1");

    // The thread takes the next run, on either node.
    let reply = publish(
        &base_b,
        &thread,
        &[json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r2"})],
    )
    .await;
    assert_eq!(reply.status(), 200);

    let metrics = reqwest::get(format!("{base_a}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("agui_runs_orphaned_total ")),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_published_through_a_node_that_stopped_is_closed_by_the_other() {
    let redis = RedisServer::start().await;
    let (a, b) = (node(&redis).await, node(&redis).await);
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let thread = broker::thread_id("orphan-node");
    publish_ok(
        &base_a,
        &thread,
        &[json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"})],
    )
    .await;
    a.stop().await;
    wait_errored(&base_b, &thread).await;
    let got = logged(&redis, &thread).await;
    assert_eq!(
        got,
        [
            ("RUN_STARTED".to_string(), None),
            ("RUN_ERROR".to_string(), Some("orphaned".to_string()))
        ]
    );
}
