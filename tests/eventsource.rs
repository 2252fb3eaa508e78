//! A real browser-grade client: the npm `eventsource` package (WHATWG EventSource for Node),
//! cut mid-stream by a TCP proxy several times, must reconnect by itself with `Last-Event-ID`
//! and receive every event exactly once, in order (PROTOCOL §4.1, §4.2). The client side lives in
//! `tests/node/eventsource-resume.mjs`; this test starts the broker and runs it, once per log
//! backend. The same client with its token in `?access_token=` (PROTOCOL §8,
//! `tests/node/eventsource-auth.mjs`): refused, it stays closed; with a token that expires
//! while events flow, it gets every event until the broker ends the stream, and its own
//! reconnect is refused. And the same client through the SIGTERM drain of one of two nodes
//! (`tests/node/eventsource-drain.mjs`, PROTOCOL §9): it follows to the other node and misses
//! nothing.

mod common;

use agui_fanout::app::Server;
use agui_fanout::event::ThreadId;
use agui_fanout::log::ReadFrom;
use common::broker;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Events the script publishes and follows.
const EVENTS: usize = 500;

fn node_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

/// Runs `tests/node/<script>` with `args`, asserts it exits 0 within `limit`, and returns the
/// JSON summary it prints last.
async fn run_node_script(script: &str, args: &[String], limit: Duration) -> serde_json::Value {
    let dir = node_dir();
    assert!(
        dir.join("node_modules/eventsource/package.json").exists(),
        "tests/node/node_modules is missing: run `npm ci --prefix tests/node` first \
         (scripts/test.sh does it)"
    );
    let child = tokio::process::Command::new("node")
        .arg(dir.join(script))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `node` (Node.js 20+ is needed): {e}"));
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {limit:?}"))
        .expect("wait for node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{script}: summary is not JSON ({e}): {stdout}"))
}

/// Runs the resume script against `server` and asserts it succeeds and the log holds its
/// events; returns the thread id.
async fn run_resume_script(server: &Server, tag: &str) -> String {
    let thread = broker::thread_id(tag);
    let args = [
        broker::base(server.addr),
        thread.clone(),
        EVENTS.to_string(),
    ];
    let summary = run_node_script("eventsource-resume.mjs", &args, Duration::from_secs(40)).await;
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["events"], EVENTS, "{summary}");
    assert!(
        summary["connections"].as_u64().unwrap_or(0) >= 3,
        "at least 2 reconnects: {summary}"
    );

    // The log holds exactly what was published, once, and the client's last id is its last.
    let tid = ThreadId::parse(&thread).unwrap();
    let log = server
        .state
        .log
        .read(&tid, ReadFrom::Start, EVENTS + 10)
        .await;
    let log = log.expect("read the log");
    assert_eq!(log.len(), EVENTS, "events in the log");
    assert_eq!(
        summary["lastId"].as_str(),
        Some(log[EVENTS - 1].id.to_string().as_str()),
        "{summary}"
    );
    assert_eq!(
        summary["firstId"].as_str(),
        Some(log[0].id.to_string().as_str()),
        "{summary}"
    );
    thread
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_resumes_through_cuts_memory() {
    let server = broker::start(|c| c.sse.retry_ms = 100).await;
    run_resume_script(&server, "es-mem").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_resumes_through_cuts_redis() {
    let server = broker::start(|c| {
        c.sse.retry_ms = 100;
        c.redis_url = broker::redis_url();
    })
    .await;
    let thread = run_resume_script(&server, "es-redis").await;
    server.stop().await;
    // Leave the shared test Redis as it was.
    let client = redis::Client::open(broker::redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(format!("agui:{{{thread}}}:log"))
        .arg(format!("agui:{{{thread}}}:meta"))
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_with_an_access_token_stops_when_it_expires() {
    use agui_fanout::http::auth::issue_hs256;
    const SECRET: &str = "eventsource-test-secret-0123456789";
    let server = broker::start(|c| {
        c.sse.retry_ms = 100;
        c.auth.hs256_secret = SECRET.into();
    })
    .await;
    let thread = broker::thread_id("es-auth");
    let hour = Some(Duration::from_secs(3600));
    let token = |sub: &[&str], publ: &[&str], ttl| {
        let v = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        issue_hs256(SECRET, &v(sub), &v(publ), ttl).unwrap()
    };
    let publisher = token(&[], &[&thread], hour);
    let refused = token(&[], &[&thread], hour); // no subscribe grant: 403
    // `exp` has a one-second resolution: the stream ends 2 to 3 s after it opens.
    let short = token(&[&thread], &[], Some(Duration::from_secs(3)));
    let args = [broker::base(server.addr), thread, publisher, refused, short];
    let summary = run_node_script("eventsource-auth.mjs", &args, Duration::from_secs(30)).await;
    let ended = summary["endedAfterMs"].as_u64().unwrap();
    assert!((1_500..=6_000).contains(&ended), "{summary}");
    server.stop().await;
}

/// A client following a thread through the SIGTERM drain of node A, with node B on the same
/// Redis and a load balancer that keeps sending reconnects to A while A accepts connections
/// (`tests/node/eventsource-drain.mjs`): the EventSource never closes (a draining node answers
/// a subscribe 200 with a short `retry:` and no id, never an error status), every `retry:` A
/// sends is short, and the client misses nothing (PROTOCOL §9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_follows_a_drain_to_another_node() {
    const RETRY_MS: u64 = 200;
    let env = [
        ("AGUI_REDIS_URL", broker::redis_url()),
        ("AGUI_SSE__RETRY_MS", RETRY_MS.to_string()),
        ("AGUI_SHUTDOWN__DRAIN", "2s".to_string()),
    ];
    let mut a = broker::BrokerProcess::spawn(&env).await;
    let b = broker::BrokerProcess::spawn(&env).await;
    let thread = broker::thread_id("es-drain");
    let args = [
        a.base(),
        b.base(),
        a.child.id().to_string(),
        thread.clone(),
        "300".to_string(),
        RETRY_MS.to_string(),
    ];
    let summary = run_node_script("eventsource-drain.mjs", &args, Duration::from_secs(40)).await;
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["events"], 300, "{summary}");
    // The script sent SIGTERM: A drained and exited cleanly.
    assert!(a.terminate().success(), "node A exits 0 after its drain");
    drop(b);
    let client = redis::Client::open(broker::redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(format!("agui:{{{thread}}}:log"))
        .arg(format!("agui:{{{thread}}}:meta"))
        .query_async(&mut conn)
        .await
        .unwrap();
}
