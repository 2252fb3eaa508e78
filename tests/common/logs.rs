//! The log backends' test harness, shared by `log_contract/`, `redis_format.rs` and
//! `redis_outage.rs`: a [`Fixture`] per test (memory or Redis backend, random thread ids whose
//! Redis keys are deleted on drop), test events, a running tail ([`TailHarness`]) and direct
//! Redis access to the documented keys.
//!
//! Shared server: `AGUI_TEST_REDIS_URL` (default `redis://127.0.0.1:6379`). Each test uses
//! random thread ids and deletes its keys when done, so tests run in parallel and the server is
//! never flushed.
#![allow(dead_code)]

use agui_fanout::event::{ThreadId, ValidEvent, validate_event};
use agui_fanout::log::memory::MemoryLog;
use agui_fanout::log::redis::{RedisLog, RedisLogConfig};
use agui_fanout::log::{
    Checkpoint, EventId, EventLog, LogEntry, LogHead, ResumeGap, Retention, StreamPos, Tail,
    TailItem,
};
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub fn redis_url() -> String {
    std::env::var("AGUI_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub const UNBOUNDED: Retention = Retention {
    max_events: 0,
    max_age: None,
    idle_ttl: None,
};

/// Keep about `max_events` per thread; no age limit, no expiry.
pub fn keep(max_events: usize) -> Retention {
    Retention {
        max_events,
        ..UNBOUNDED
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Memory,
    Redis,
}

/// One test's backend and the threads it created (their Redis keys are deleted on drop).
pub struct Fixture {
    pub backend: Backend,
    pub threads: Mutex<Vec<ThreadId>>,
}

impl Fixture {
    pub fn new(backend: Backend) -> Self {
        Fixture {
            backend,
            threads: Mutex::new(Vec::new()),
        }
    }

    /// A fresh, random thread id.
    pub fn thread(&self) -> ThreadId {
        let thread = ThreadId::parse(&format!("test-{:016x}", rand::random::<u64>())).unwrap();
        self.threads.lock().push(thread.clone());
        thread
    }

    pub async fn log(&self) -> Arc<dyn EventLog> {
        self.log_with(UNBOUNDED, Duration::from_secs(1)).await
    }

    pub async fn log_with(&self, retention: Retention, block: Duration) -> Arc<dyn EventLog> {
        match self.backend {
            Backend::Memory => Arc::new(MemoryLog::new(retention)),
            Backend::Redis => {
                let config = RedisLogConfig {
                    retention,
                    block,
                    ..RedisLogConfig::new(redis_url())
                };
                Arc::new(RedisLog::connect(config).await.expect("connect"))
            }
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Backend::Redis = self.backend {
            let threads = std::mem::take(&mut *self.threads.lock());
            if let Ok(mut conn) = redis::Client::open(redis_url()).and_then(|c| c.get_connection())
            {
                for t in threads {
                    let _: Result<(), _> = redis::cmd("DEL")
                        .arg(format!("agui:{{{t}}}:log"))
                        .arg(format!("agui:{{{t}}}:meta"))
                        .arg(format!("agui:{{{t}}}:ckpt"))
                        .query(&mut conn);
                }
            }
        }
    }
}

/// A valid AG-UI `CUSTOM` event numbered `i` (non-ASCII and escapes included).
pub fn event(i: usize) -> ValidEvent {
    valid(json!({"type": "CUSTOM", "name": "test", "value": {"i": i, "s": "h\u{e9}llo \"x\"\n"}}))
}

pub fn valid(value: serde_json::Value) -> ValidEvent {
    validate_event(value.to_string().as_bytes(), None).expect("valid test event")
}

pub fn events(range: std::ops::Range<usize>) -> Vec<ValidEvent> {
    range.map(event).collect()
}

/// Appends `all` in batches of the given sizes (cycled) and returns every id.
pub async fn append_in_batches(
    log: &dyn EventLog,
    thread: &ThreadId,
    all: &[ValidEvent],
    sizes: &[usize],
) -> Vec<EventId> {
    let mut ids = Vec::with_capacity(all.len());
    let mut rest = all;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (batch, tail) = rest.split_at(size.min(rest.len()));
        ids.extend(log.append(thread, batch).await.expect("append"));
        rest = tail;
    }
    ids
}

pub fn assert_entries(got: &[LogEntry], ids: &[EventId], evs: &[ValidEvent]) {
    assert_eq!(got.len(), ids.len(), "entry count");
    for ((entry, id), ev) in got.iter().zip(ids).zip(evs) {
        assert_eq!(entry.id, *id);
        assert_eq!(entry.event_type, ev.event_type);
        assert_eq!(entry.json, ev.json, "json must be byte-equal");
    }
}

pub fn assert_strictly_increasing(ids: &[EventId]) {
    for pair in ids.windows(2) {
        assert_eq!(pair[0].epoch, pair[1].epoch);
        assert!(pair[0].pos < pair[1].pos, "{} !< {}", pair[0], pair[1]);
    }
}

pub fn next_pos(pos: StreamPos) -> StreamPos {
    StreamPos::new(pos.ms, pos.seq + 1)
}

/// A running tail and the receiving end of its sink.
pub struct TailHarness {
    pub tail: Arc<dyn Tail>,
    pub rx: mpsc::Receiver<TailItem>,
    pub stop: CancellationToken,
}

impl TailHarness {
    pub fn start(log: &dyn EventLog) -> Self {
        let (tx, rx) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let tail = log.start_tail(tx, stop.clone());
        TailHarness { tail, rx, stop }
    }

    pub async fn next(&mut self, within: Duration) -> TailItem {
        tokio::time::timeout(within, self.rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no tail item within {within:?}"))
            .expect("tail sink open")
    }

    /// The next item, which must be a discontinuity of `thread` for `reason`; returns the head
    /// it reports.
    pub async fn expect_discontinuity(&mut self, thread: &ThreadId, reason: ResumeGap) -> LogHead {
        match self.next(WITHIN).await {
            TailItem::Discontinuity {
                thread: t,
                head,
                reason: r,
            } => {
                assert_eq!(&t, thread);
                assert_eq!(r, reason);
                head
            }
            other => panic!("expected a discontinuity, got {other:?}"),
        }
    }

    /// Receives `Entries` until every thread of `want` got its count; a discontinuity fails.
    pub async fn collect(
        &mut self,
        want: &HashMap<ThreadId, usize>,
        within: Duration,
    ) -> HashMap<ThreadId, Vec<LogEntry>> {
        let deadline = Instant::now() + within;
        let mut got: HashMap<ThreadId, Vec<LogEntry>> = HashMap::new();
        while want
            .iter()
            .any(|(t, n)| got.get(t).map_or(0, Vec::len) < *n)
        {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                TailItem::Entries { thread, entries } => {
                    assert!(!entries.is_empty(), "empty Entries item");
                    got.entry(thread).or_default().extend(entries);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        got
    }

    /// [`TailHarness::collect`] for one thread: its first `n` entries, within [`WITHIN`].
    pub async fn collect_one(&mut self, thread: &ThreadId, n: usize) -> Vec<LogEntry> {
        let mut got = self
            .collect(&HashMap::from([(thread.clone(), n)]), WITHIN)
            .await;
        got.remove(thread).unwrap_or_default()
    }

    /// Items that arrive within `period`.
    pub async fn drain_for(&mut self, period: Duration) -> Vec<TailItem> {
        let deadline = tokio::time::Instant::now() + period;
        let mut items = Vec::new();
        while let Ok(Some(item)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            items.push(item);
        }
        items
    }
}

impl Drop for TailHarness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub const WITHIN: Duration = Duration::from_secs(20);

/// A checkpoint candidate: a JSON array of events that says which event it covers up to.
pub fn candidate(upto: usize) -> Bytes {
    Bytes::from(
        json!([{"type": "CUSTOM", "name": "checkpoint", "value": {"upto": upto}}]).to_string(),
    )
}

/// The `upto` a [`candidate`] was built with.
pub fn upto_of(checkpoint: &Checkpoint) -> usize {
    let v: serde_json::Value = serde_json::from_slice(&checkpoint.events).unwrap();
    v[0]["value"]["upto"].as_u64().unwrap() as usize
}

/// Compare-and-append on the current head, with a checkpoint candidate when given.
pub async fn append_with(
    log: &dyn EventLog,
    thread: &ThreadId,
    evs: &[ValidEvent],
    candidate: Option<Bytes>,
) -> Vec<EventId> {
    let head = log.head(thread).await.unwrap();
    log.append_if(thread, evs, head, candidate.into())
        .await
        .unwrap()
}

pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub fn stream_key(thread: &ThreadId) -> String {
    format!("agui:{{{thread}}}:log")
}

pub fn meta_key(thread: &ThreadId) -> String {
    format!("agui:{{{thread}}}:meta")
}

pub async fn xadd(
    conn: &mut redis::aio::MultiplexedConnection,
    thread: &ThreadId,
    field: &str,
    v: &str,
) {
    let _: String = redis::cmd("XADD")
        .arg(stream_key(thread))
        .arg("*")
        .arg(field)
        .arg(v)
        .query_async(conn)
        .await
        .unwrap();
}

/// The `epoch` field of a thread's meta hash, as Redis holds it.
pub async fn meta_epoch(conn: &mut redis::aio::MultiplexedConnection, thread: &ThreadId) -> String {
    redis::cmd("HGET")
        .arg(meta_key(thread))
        .arg("epoch")
        .query_async(conn)
        .await
        .unwrap()
}

pub fn ckpt_key(thread: &ThreadId) -> String {
    format!("agui:{{{thread}}}:ckpt")
}

pub async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

/// `PTTL` of `key` in ms (`-1`: no TTL, `-2`: no key).
pub async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}
