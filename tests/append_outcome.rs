//! Appends whose reply Redis gives too late (PROTOCOL §2 "Unknown outcomes"): a 503
//! `backend_unavailable` must mean nothing was appended. Each test runs a private
//! `redis-server` (`common/redis_server.rs`) and stalls it past the operation timeout (SIGSTOP,
//! `DEBUG SLEEP`) or holds the append in a loopback proxy, then checks the log holds each event
//! exactly once whatever a producer without idempotency headers does with the answer.

mod common;

use agui_fanout::event::ThreadId;
use agui_fanout::log::redis::{RedisLog, RedisLogConfig};
use agui_fanout::log::{EventLog, LogError};
use common::broker;
use common::logs::{UNBOUNDED, events, redis_conn, stream_key};
use common::redis_server::RedisServer;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The broker's default Redis operation timeout (`RedisLogConfig::new`): a stall must outlast it.
const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// One answer to a publish: status, `Retry-After` (seconds) and the JSON body.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: Value,
}

impl Answer {
    fn code(&self) -> Option<&str> {
        self.body["error"]["code"].as_str()
    }
}

async fn publish(base: &str, thread: &str, events: &Value) -> Answer {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "application/json")
        .body(events.to_string())
        .send()
        .await
        .expect("the broker answers");
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = resp.json().await.expect("a JSON answer");
    Answer {
        status,
        retry_after,
        body,
    }
}

/// A producer without idempotency headers that does what the answers say: it retries a 503
/// that carries `Retry-After`, after waiting that long, and stops at any other answer. Returns
/// every answer, in order.
async fn naive_producer(base: &str, thread: &str, events: &Value) -> Vec<Answer> {
    let mut answers = Vec::new();
    for _ in 0..10 {
        let answer = publish(base, thread, events).await;
        let again = match (answer.status, answer.retry_after) {
            (503, Some(secs)) => Some(Duration::from_secs(secs)),
            _ => None,
        };
        answers.push(answer);
        match again {
            Some(wait) => tokio::time::sleep(wait).await,
            None => return answers,
        }
    }
    panic!("still refused after 10 attempts: {answers:?}");
}

/// The ids of the stream entries of `thread` whose JSON holds `marker`.
async fn entries_with(url: &str, thread: &str, marker: &str) -> Vec<String> {
    let mut conn = redis_conn(url).await;
    let thread = ThreadId::parse(thread).unwrap();
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(stream_key(&thread))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    reply
        .ids
        .into_iter()
        .filter(|entry| {
            entry
                .get::<String>("e")
                .is_some_and(|json| json.contains(marker))
        })
        .map(|entry| entry.id)
        .collect()
}

/// How Redis is stalled.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// SIGSTOP, SIGCONT after the period: the process is frozen.
    Stop,
    /// `DEBUG SLEEP <secs>` from another client: Redis is busy.
    DebugSleep,
}

/// Publishes one `CUSTOM` event while Redis stalls for 3 s (longer than the 2 s operation
/// timeout, shorter than it plus the 5 s given to settle the append), as a producer without
/// idempotency headers, and checks the event is in the log exactly once, and that the first
/// answer says what happened: appended (`200` with the entry's id), or, if it says nothing was
/// appended (`503 backend_unavailable`), the entry is the one a retry appended.
async fn publish_during_stall(stall: Stall) {
    let server = Arc::new(RedisServer::start().await);
    let broker = broker::start(|c| c.redis_url = server.url()).await;
    let base = broker::base(broker.addr);
    let thread = broker::thread_id("stall");
    let run = json!([{"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}]);
    assert_eq!(publish(&base, &thread, &run).await.status, 200);

    let period = OP_TIMEOUT + Duration::from_secs(1);
    let stalled = {
        let server = server.clone();
        tokio::spawn(async move {
            match stall {
                Stall::Stop => {
                    server.pause();
                    tokio::time::sleep(period).await;
                    server.resume();
                }
                Stall::DebugSleep => {
                    // No response timeout: the answer comes after the sleep.
                    let mut conn = redis::Client::open(server.url())
                        .unwrap()
                        .get_multiplexed_async_connection_with_config(
                            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
                        )
                        .await
                        .unwrap();
                    let _: () = redis::cmd("DEBUG")
                        .arg("SLEEP")
                        .arg(period.as_secs_f64())
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            }
        })
    };
    // Let the stall begin (the `DEBUG SLEEP` command reach Redis) before publishing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let event =
        json!([{"type": "CUSTOM", "name": "once", "value": {"stall": format!("{stall:?}")}}]);
    let answers = naive_producer(&base, &thread, &event).await;
    stalled.await.unwrap();

    let ids = entries_with(&server.url(), &thread, "\"once\"").await;
    assert_eq!(
        ids.len(),
        1,
        "the event is in the log {} times: {answers:?}",
        ids.len()
    );
    let first = &answers[0];
    let last = answers.last().unwrap();
    let appended_id = |a: &Answer| {
        a.body["lastId"]
            .as_str()
            .and_then(|id| id.split_once('-'))
            .map(|(_, pos)| pos.to_string())
    };
    match (first.status, first.code()) {
        (200, _) => assert_eq!(appended_id(first), Some(ids[0].clone()), "{answers:?}"),
        (503, Some("append_outcome_unknown")) => {
            assert_eq!(first.retry_after, None, "no invitation to retry: {first:?}")
        }
        (503, Some("backend_unavailable")) => {
            // Nothing was appended then: the entry must be the retry's.
            assert_eq!(last.status, 200, "{answers:?}");
            assert_eq!(appended_id(last), Some(ids[0].clone()), "{answers:?}");
        }
        _ => panic!("unexpected first answer: {answers:?}"),
    }
    broker.stop().await;
}

#[tokio::test]
async fn publish_during_sigstop_is_appended_once() {
    publish_during_stall(Stall::Stop).await;
}

#[tokio::test]
async fn publish_during_debug_sleep_is_appended_once() {
    publish_during_stall(Stall::DebugSleep).await;
}

fn quick_config(url: String) -> RedisLogConfig {
    RedisLogConfig {
        op_timeout: Duration::from_millis(300),
        outcome_timeout: Duration::from_millis(400),
        retention: UNBOUNDED,
        ..RedisLogConfig::new(url)
    }
}

/// A stall longer than the operation timeout and the time to settle: the append's outcome is
/// reported unknown (never "unavailable", which means nothing was appended), and indeed the
/// append runs once Redis resumes.
#[tokio::test]
async fn append_stalled_past_settling_is_outcome_unknown() {
    let server = RedisServer::start().await;
    let log = RedisLog::connect(quick_config(server.url())).await.unwrap();
    let thread = ThreadId::parse("unknown-outcome").unwrap();
    log.append(&thread, &events(0..1)).await.unwrap();
    server.pause();
    let result = log.append(&thread, &events(1..2)).await;
    server.resume();
    assert!(
        matches!(result, Err(LogError::OutcomeUnknown(_))),
        "{result:?}"
    );
    // The stalled append ran when Redis resumed: "unknown" was the truthful answer.
    let mut appended = 0;
    for _ in 0..100 {
        appended = entries_with(&server.url(), "unknown-outcome", "\"i\":1")
            .await
            .len();
        if appended == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(appended, 1);
}

/// A loopback TCP proxy in front of Redis that can hold back what the connections open at the
/// time send (they reach Redis on [`HoldingProxy::release`]), while new connections pass.
struct HoldingProxy {
    port: u16,
    /// One flag per connection, raised while its client-to-Redis bytes are held back.
    holds: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>>,
    release: Arc<tokio::sync::Notify>,
}

impl HoldingProxy {
    async fn start(upstream: u16) -> HoldingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let holds: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let release = Arc::new(tokio::sync::Notify::new());
        let (h, r) = (holds.clone(), release.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
                let held = Arc::new(AtomicBool::new(false));
                h.lock().unwrap().push(held.clone());
                let (mut client_rx, mut client_tx) = client.into_split();
                let (mut server_rx, mut server_tx) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
                });
                let release = r.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match client_rx.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        while held.load(Ordering::SeqCst) {
                            release.notified().await;
                        }
                        if server_tx.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        HoldingProxy {
            port,
            holds,
            release,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Holds back whatever the connections open now send next.
    fn hold(&self) {
        for held in self.holds.lock().unwrap().iter() {
            held.store(true, Ordering::SeqCst);
        }
    }

    /// Lets the held bytes through.
    fn release(&self) {
        for held in self.holds.lock().unwrap().iter() {
            held.store(false, Ordering::SeqCst);
        }
        self.release.notify_waiters();
    }
}

/// An append that reaches Redis only after the broker gave up on it and settled it as "not
/// appended" (503 `backend_unavailable`): it must then append nothing (the fence), so that
/// "nothing was appended" stays true and a producer's retry makes no duplicate.
#[tokio::test]
async fn append_arriving_after_settling_appends_nothing() {
    let server = RedisServer::start().await;
    let proxy = HoldingProxy::start(server.port()).await;
    let config = RedisLogConfig {
        outcome_timeout: Duration::from_secs(5),
        ..quick_config(proxy.url())
    };
    let log = RedisLog::connect(config).await.unwrap();
    let thread = ThreadId::parse("late-append").unwrap();
    log.append(&thread, &events(0..1)).await.unwrap();

    proxy.hold();
    let result = log.append(&thread, &events(1..2)).await;
    assert!(
        matches!(result, Err(LogError::Unavailable(_))),
        "{result:?}"
    );
    proxy.release();
    // Once released, the held append reaches Redis; a later append on the same connection
    // is answered after it.
    let retried = log.append(&thread, &events(1..2)).await.unwrap();
    let mut conn = redis_conn(&server.url()).await;
    let len: usize = redis::cmd("XLEN")
        .arg(stream_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 2, "the held append must not have appended");
    let ids = entries_with(&server.url(), "late-append", "\"i\":1").await;
    assert_eq!(ids, vec![retried[0].pos.to_string()]);
}
