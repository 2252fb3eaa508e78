//! The log backends' shared contract (SPEC §1, §4, §6, §7): the same test functions run against
//! `MemoryLog` (`memory_*`) and `RedisLog` on a real redis-server (`redis_*`), plus Redis-only
//! tests: lost keys (new epoch), producers writing to the stream directly, and outages.
//!
//! Shared server: `AGUI_TEST_REDIS_URL` (default `redis://127.0.0.1:6379`). Each test uses
//! random thread ids and deletes its keys when done, so tests run in parallel and the server is
//! never flushed. Tests that stop or restart Redis run their own `redis-server` child
//! (`common/redis_server.rs`).

mod common {
    pub mod redis_server;
}

use agui_fanout::event::{ThreadId, ValidEvent, validate_event};
use agui_fanout::log::memory::MemoryLog;
use agui_fanout::log::redis::{RedisLog, RedisLogConfig};
use agui_fanout::log::{
    AppendExtras, Checkpoint, Epoch, EventId, EventLog, LogEntry, LogError, LogHead, ProducerMark,
    ReadFrom, ResumeGap, Retention, StreamPos, Tail, TailItem,
};
use bytes::Bytes;
use common::redis_server::RedisServer;
use parking_lot::Mutex;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// Fixtures

fn redis_url() -> String {
    std::env::var("AGUI_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

const UNBOUNDED: Retention = Retention {
    max_events: 0,
    max_age: None,
    idle_ttl: None,
};

/// Keep about `max_events` per thread; no age limit, no expiry.
fn keep(max_events: usize) -> Retention {
    Retention {
        max_events,
        ..UNBOUNDED
    }
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    Redis,
}

/// One test's backend and the threads it created (their Redis keys are deleted on drop).
struct Fixture {
    backend: Backend,
    threads: Mutex<Vec<ThreadId>>,
}

impl Fixture {
    fn new(backend: Backend) -> Self {
        Fixture {
            backend,
            threads: Mutex::new(Vec::new()),
        }
    }

    /// A fresh, random thread id.
    fn thread(&self) -> ThreadId {
        let thread = ThreadId::parse(&format!("test-{:016x}", rand::random::<u64>())).unwrap();
        self.threads.lock().push(thread.clone());
        thread
    }

    async fn log(&self) -> Arc<dyn EventLog> {
        self.log_with(UNBOUNDED, Duration::from_secs(1)).await
    }

    async fn log_with(&self, retention: Retention, block: Duration) -> Arc<dyn EventLog> {
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
fn event(i: usize) -> ValidEvent {
    valid(json!({"type": "CUSTOM", "name": "test", "value": {"i": i, "s": "h\u{e9}llo \"x\"\n"}}))
}

fn valid(value: serde_json::Value) -> ValidEvent {
    validate_event(value.to_string().as_bytes(), None).expect("valid test event")
}

fn events(range: std::ops::Range<usize>) -> Vec<ValidEvent> {
    range.map(event).collect()
}

/// Appends `all` in batches of the given sizes (cycled) and returns every id.
async fn append_in_batches(
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

fn assert_entries(got: &[LogEntry], ids: &[EventId], evs: &[ValidEvent]) {
    assert_eq!(got.len(), ids.len(), "entry count");
    for ((entry, id), ev) in got.iter().zip(ids).zip(evs) {
        assert_eq!(entry.id, *id);
        assert_eq!(entry.event_type, ev.event_type);
        assert_eq!(entry.json, ev.json, "json must be byte-equal");
    }
}

fn assert_strictly_increasing(ids: &[EventId]) {
    for pair in ids.windows(2) {
        assert_eq!(pair[0].epoch, pair[1].epoch);
        assert!(pair[0].pos < pair[1].pos, "{} !< {}", pair[0], pair[1]);
    }
}

fn next_pos(pos: StreamPos) -> StreamPos {
    StreamPos::new(pos.ms, pos.seq + 1)
}

/// A running tail and the receiving end of its sink.
struct TailHarness {
    tail: Arc<dyn Tail>,
    rx: mpsc::Receiver<TailItem>,
    stop: CancellationToken,
}

impl TailHarness {
    fn start(log: &dyn EventLog) -> Self {
        let (tx, rx) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let tail = log.start_tail(tx, stop.clone());
        TailHarness { tail, rx, stop }
    }

    async fn next(&mut self, within: Duration) -> TailItem {
        tokio::time::timeout(within, self.rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no tail item within {within:?}"))
            .expect("tail sink open")
    }

    /// Receives `Entries` until every thread of `want` got its count; a discontinuity fails.
    async fn collect(
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

    /// Items that arrive within `period`.
    async fn drain_for(&mut self, period: Duration) -> Vec<TailItem> {
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

const WITHIN: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// The shared suite

/// Runs each listed test function against both backends under the given test names.
macro_rules! both_backends {
    ($($test:ident: $memory:ident, $redis:ident;)*) => {
        $(
            #[tokio::test]
            async fn $memory() {
                $test(Fixture::new(Backend::Memory)).await;
            }
            #[tokio::test]
            async fn $redis() {
                $test(Fixture::new(Backend::Redis)).await;
            }
        )*
    };
}

both_backends! {
    append_then_read: memory_append_then_read, redis_append_then_read;
    empty_batch: memory_empty_batch, redis_empty_batch;
    read_paging: memory_read_paging, redis_read_paging;
    read_from_start: memory_read_from_start, redis_read_from_start;
    resume_after_every_id: memory_resume_after_every_id, redis_resume_after_every_id;
    gap_ahead: memory_gap_ahead, redis_gap_ahead;
    gap_other_epoch: memory_gap_other_epoch, redis_gap_other_epoch;
    gap_trimmed: memory_gap_trimmed, redis_gap_trimmed;
    head_new_thread: memory_head_new_thread, redis_head_new_thread;
    tail_follows_many_threads: memory_tail_follows_many_threads, redis_tail_follows_many_threads;
    tail_follow_while_blocked: memory_tail_follow_while_blocked, redis_tail_follow_while_blocked;
    tail_unfollow_stops: memory_tail_unfollow_stops, redis_tail_unfollow_stops;
    tail_follow_from_position: memory_tail_follow_from_position, redis_tail_follow_from_position;
    tail_follow_gaps: memory_tail_follow_gaps, redis_tail_follow_gaps;
    ping_answers: memory_ping_answers, redis_ping_answers;
    tail_shutdown_ends_it: memory_tail_shutdown_ends_it, redis_tail_shutdown_ends_it;
    append_if_compares_epoch_and_last: memory_append_if_compares_epoch_and_last, redis_append_if_compares_epoch_and_last;
    producer_marks_are_stored_with_the_append: memory_producer_marks_are_stored_with_the_append, redis_producer_marks_are_stored_with_the_append;
    checkpoint_pending_then_promoted: memory_checkpoint_pending_then_promoted, redis_checkpoint_pending_then_promoted;
    checkpoint_rebuilds_fold_under_steady_publishing: memory_checkpoint_rebuilds_fold_under_steady_publishing, redis_checkpoint_rebuilds_fold_under_steady_publishing;
    candidate_within_min_gap_is_dropped: memory_candidate_within_min_gap_is_dropped, redis_candidate_within_min_gap_is_dropped;
    checkpoint_safety_cap_without_candidates: memory_checkpoint_safety_cap_without_candidates, redis_checkpoint_safety_cap_without_candidates;
    max_age_trims_only_to_checkpoint: memory_max_age_trims_only_to_checkpoint, redis_max_age_trims_only_to_checkpoint;
    max_age_without_checkpoint_trims_nothing: memory_max_age_without_checkpoint_trims_nothing, redis_max_age_without_checkpoint_trims_nothing;
    idle_ttl_expires_thread: memory_idle_ttl_expires_thread, redis_idle_ttl_expires_thread;
}

/// A producer mark is stored in the same step as the batch, per producer; a conflicting
/// append stores nothing.
async fn producer_marks_are_stored_with_the_append(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    assert_eq!(log.producer_seq(&thread, "p1").await.unwrap(), 0);
    let head = log.head(&thread).await.unwrap();
    let mark = |id: &str, last_seq| AppendExtras {
        candidate: None,
        candidate_min_gap: 0,
        producer: Some(ProducerMark {
            id: id.into(),
            last_seq,
        }),
    };
    log.append_if(&thread, &events(0..3), head, mark("p1", 3))
        .await
        .unwrap();
    assert_eq!(log.producer_seq(&thread, "p1").await.unwrap(), 3);
    assert_eq!(log.producer_seq(&thread, "p2").await.unwrap(), 0);
    // A stale head: conflict, and the mark does not move.
    assert!(matches!(
        log.append_if(&thread, &events(3..4), head, mark("p1", 4))
            .await,
        Err(LogError::Conflict(_))
    ));
    assert_eq!(log.producer_seq(&thread, "p1").await.unwrap(), 3);
    let head = log.head(&thread).await.unwrap();
    log.append_if(&thread, &events(3..5), head, mark("p2", 7))
        .await
        .unwrap();
    assert_eq!(log.producer_seq(&thread, "p1").await.unwrap(), 3);
    assert_eq!(log.producer_seq(&thread, "p2").await.unwrap(), 7);
}

/// Compare-and-append: appends only on the expected head; a stale head gets `Conflict` with
/// the current head and appends nothing; concurrent appenders on one head: exactly one wins.
async fn append_if_compares_epoch_and_last(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let fresh = log.head(&thread).await.unwrap();
    let ids = log
        .append_if(&thread, &events(0..3), fresh, AppendExtras::default())
        .await
        .unwrap();
    assert_eq!(ids.len(), 3);
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.last, ids[2].pos);

    // Stale position.
    match log
        .append_if(&thread, &events(3..4), fresh, AppendExtras::default())
        .await
    {
        Err(LogError::Conflict(now)) => assert_eq!(now, head),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // Stale epoch.
    let other_epoch = LogHead {
        epoch: Epoch(head.epoch.0.wrapping_add(1)),
        ..head
    };
    assert!(matches!(
        log.append_if(&thread, &events(3..4), other_epoch, AppendExtras::default())
            .await,
        Err(LogError::Conflict(_))
    ));
    assert_eq!(log.head(&thread).await.unwrap(), head, "nothing appended");

    // Many appenders racing on the same head: exactly one wins.
    let results = futures::future::join_all((0..8).map(|i| {
        let log = log.clone();
        let thread = thread.clone();
        async move {
            log.append_if(
                &thread,
                &events(10 + i..11 + i),
                head,
                AppendExtras::default(),
            )
            .await
        }
    }))
    .await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(
        results
            .iter()
            .all(|r| r.is_ok() || matches!(r, Err(LogError::Conflict(_))))
    );
    let all = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    assert_eq!(all.len(), 4);
}

// ---------------------------------------------------------------------------------------------
// Retention with checkpoints (SPEC §6)

/// A checkpoint candidate: a JSON array of events that says which event it covers up to.
fn candidate(upto: usize) -> Bytes {
    Bytes::from(
        json!([{"type": "CUSTOM", "name": "checkpoint", "value": {"upto": upto}}]).to_string(),
    )
}

/// The `upto` a [`candidate`] was built with.
fn upto_of(checkpoint: &Checkpoint) -> usize {
    let v: serde_json::Value = serde_json::from_slice(&checkpoint.events).unwrap();
    v[0]["value"]["upto"].as_u64().unwrap() as usize
}

/// Compare-and-append on the current head, with a checkpoint candidate when given.
async fn append_with(
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

/// Asserts that the retained log is exactly `ids[first..]` and that resuming after `ids[i]`
/// is `Gap(Trimmed)` for `i < first - 1` and exact from `ids[first - 1]` on (the entry at the
/// checkpoint, the newest trimmed one, is resumable: nothing after it is gone).
async fn assert_trimmed_to(
    log: &dyn EventLog,
    thread: &ThreadId,
    ids: &[EventId],
    evs: &[ValidEvent],
    first: usize,
) {
    let retained = log.read(thread, ReadFrom::Start, 10_000).await.unwrap();
    assert_entries(&retained, &ids[first..], &evs[first..]);
    let head = log.head(thread).await.unwrap();
    assert_eq!(head.max_deleted, ids[first - 1].pos, "max_deleted");
    assert!(!head.complete_from_start());
    for (i, id) in ids.iter().enumerate() {
        let read = log.read(thread, ReadFrom::After(*id), 10_000).await;
        if i + 1 < first {
            assert!(
                matches!(read, Err(LogError::Gap(ResumeGap::Trimmed))),
                "{i}: {read:?}"
            );
        } else {
            assert_entries(&read.unwrap(), &ids[i + 1..], &evs[i + 1..]);
        }
    }
}

/// A candidate is stored as pending (nothing trimmed); the next one promotes it: it becomes
/// `checkpoint()` and every entry at or before it is trimmed, exactly. `None`, a conflict and
/// an empty batch change nothing; a tail can follow from the checkpoint exactly.
async fn checkpoint_pending_then_promoted(f: Fixture) {
    let log = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..40);
    let mut ids = log.append(&thread, &evs[..10]).await.unwrap();
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);

    // Pending: stored, not returned, nothing trimmed.
    ids.extend(append_with(&*log, &thread, &evs[10..15], Some(candidate(14))).await);
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.max_deleted, StreamPos::ZERO);
    assert!(head.complete_from_start());
    ids.extend(log.append(&thread, &evs[15..20]).await.unwrap());
    let all = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    assert_entries(&all, &ids, &evs[..20]);

    // A stale head with a candidate: a conflict, nothing changes. An empty batch with a
    // candidate: nothing changes either.
    let stale = LogHead {
        last: ids[3].pos,
        ..head
    };
    assert!(matches!(
        log.append_if(&thread, &evs[20..25], stale, Some(candidate(99)).into())
            .await,
        Err(LogError::Conflict(_))
    ));
    let now = log.head(&thread).await.unwrap();
    assert!(
        log.append_if(&thread, &[], now, Some(candidate(98)).into())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    assert_eq!(log.head(&thread).await.unwrap(), now);

    // The next candidate promotes the pending one (at the last entry of its batch, 14).
    ids.extend(append_with(&*log, &thread, &evs[20..25], Some(candidate(24))).await);
    let checkpoint = log.checkpoint(&thread).await.unwrap().expect("promoted");
    assert_eq!(checkpoint.pos, ids[14].pos);
    assert_eq!(checkpoint.events, candidate(14), "events byte-equal");
    assert_trimmed_to(&*log, &thread, &ids, &evs[..25], 15).await;

    // Appends without a candidate leave checkpoints alone.
    ids.extend(append_with(&*log, &thread, &evs[25..30], None).await);
    ids.extend(log.append(&thread, &evs[30..32]).await.unwrap());
    assert_eq!(log.checkpoint(&thread).await.unwrap(), Some(checkpoint));
    assert_trimmed_to(&*log, &thread, &ids, &evs[..32], 15).await;

    // A tail following from the checkpoint continues exactly.
    let mut tail = TailHarness::start(&*log);
    tail.tail.follow(thread.clone(), ids[14].epoch, ids[14].pos);
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 17)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &ids[15..32], &evs[15..32]);

    // And the next promotion moves both to the newer checkpoint (24).
    ids.extend(append_with(&*log, &thread, &evs[32..40], Some(candidate(39))).await);
    let checkpoint = log.checkpoint(&thread).await.unwrap().unwrap();
    assert_eq!(checkpoint.pos, ids[24].pos);
    assert_eq!(upto_of(&checkpoint), 24);
    assert_trimmed_to(&*log, &thread, &ids, &evs, 25).await;
}

/// A candidate fewer than `candidate_min_gap` entries after the pending checkpoint is dropped:
/// nothing stored, nothing promoted, nothing trimmed (several nodes send candidates about
/// together). One at the gap or beyond promotes the pending checkpoint as usual.
async fn candidate_within_min_gap_is_dropped(f: Fixture) {
    let log = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..40);
    let with_gap = |upto: usize| AppendExtras {
        candidate: Some(candidate(upto)),
        candidate_min_gap: 10,
        producer: None,
    };
    let mut ids = log.append(&thread, &evs[..10]).await.unwrap();
    // No pending checkpoint yet: stored whatever the gap.
    let head = log.head(&thread).await.unwrap();
    ids.extend(
        log.append_if(&thread, &evs[10..12], head, with_gap(11))
            .await
            .unwrap(),
    );
    // 9 entries after the pending one (at 11): dropped.
    let head = log.head(&thread).await.unwrap();
    ids.extend(
        log.append_if(&thread, &evs[12..21], head, with_gap(20))
            .await
            .unwrap(),
    );
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    let head = log.head(&thread).await.unwrap();
    assert!(head.complete_from_start(), "nothing trimmed");
    // 10 entries after it: promotes the pending one (11), becomes pending itself (at 21).
    ids.extend(
        log.append_if(&thread, &evs[21..22], head, with_gap(21))
            .await
            .unwrap(),
    );
    let checkpoint = log.checkpoint(&thread).await.unwrap().expect("promoted");
    assert_eq!(checkpoint.pos, ids[11].pos);
    assert_eq!(upto_of(&checkpoint), 11);
    assert_trimmed_to(&*log, &thread, &ids, &evs[..22], 12).await;
    // The dropped candidate (20) never became the pending one: 21 did.
    ids.extend(append_with(&*log, &thread, &evs[22..40], Some(candidate(39))).await);
    let checkpoint = log.checkpoint(&thread).await.unwrap().unwrap();
    assert_eq!(upto_of(&checkpoint), 21);
    assert_trimmed_to(&*log, &thread, &ids, &evs, 22).await;
}

/// The publish path's cadence (a candidate every ~`max_events` events, batches of 7): the log
/// keeps about `max_events`..`2 * max_events` events, and at every step the checkpoint plus
/// the entries after it cover the whole thread (its fold can be rebuilt).
async fn checkpoint_rebuilds_fold_under_steady_publishing(f: Fixture) {
    const MAX: usize = 20;
    let log = f.log_with(keep(MAX), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..400);
    let mut since_candidate = 0;
    let mut appended = 0;
    for batch in evs.chunks(7) {
        since_candidate += batch.len();
        appended += batch.len();
        let c = (since_candidate >= MAX).then(|| {
            since_candidate = 0;
            candidate(appended - 1)
        });
        append_with(&*log, &thread, batch, c).await;

        let head = log.head(&thread).await.unwrap();
        let retained = log.read(&thread, ReadFrom::Start, 10_000).await.unwrap();
        let Some(checkpoint) = log.checkpoint(&thread).await.unwrap() else {
            assert!(head.complete_from_start());
            assert_eq!(retained.len(), appended);
            continue;
        };
        assert_eq!(head.max_deleted, checkpoint.pos);
        let after = log
            .read(
                &thread,
                ReadFrom::After(EventId {
                    epoch: head.epoch,
                    pos: checkpoint.pos,
                }),
                10_000,
            )
            .await
            .unwrap();
        assert_eq!(
            after, retained,
            "everything after the checkpoint is retained"
        );
        // Checkpoint (events 0..=upto) + retained entries == the whole thread, in order.
        let upto = upto_of(&checkpoint);
        assert_eq!(upto + 1 + retained.len(), appended);
        for (k, entry) in retained.iter().enumerate() {
            assert_eq!(entry.json, evs[upto + 1 + k].json);
        }
        assert!(
            retained.len() <= 2 * MAX + 7,
            "{} retained after {appended}",
            retained.len()
        );
    }
    let retained = log.read(&thread, ReadFrom::Start, 10_000).await.unwrap();
    assert!(retained.len() >= MAX, "{}", retained.len());
}

/// A thread that uses checkpoints but whose producer stops sending candidates: past the
/// safety cap (`4 * max_events`) the pending checkpoint is promoted early, and nothing after
/// the newest checkpoint is ever trimmed (the fold stays rebuildable, SPEC §6).
async fn checkpoint_safety_cap_without_candidates(f: Fixture) {
    const MAX: usize = 10;
    let log = f.log_with(keep(MAX), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..500);
    let mut ids = append_with(&*log, &thread, &evs[..5], Some(candidate(4))).await;
    // 30 events: more than `max_events`, less than the safety cap: nothing trimmed.
    ids.extend(append_in_batches(&*log, &thread, &evs[5..30], &[5]).await);
    let head = log.head(&thread).await.unwrap();
    assert!(head.complete_from_start(), "{head:?}");
    assert_eq!(
        log.read(&thread, ReadFrom::Start, 1000)
            .await
            .unwrap()
            .len(),
        30
    );

    // Never another candidate: past the safety cap the pending checkpoint is promoted (and
    // everything up to it trimmed), but nothing after it is ever trimmed: the fold stays
    // rebuildable from the checkpoint (SPEC §6).
    ids.extend(append_in_batches(&*log, &thread, &evs[30..], &[25]).await);
    let ckpt = log
        .checkpoint(&thread)
        .await
        .unwrap()
        .expect("promoted by the safety cap");
    assert_eq!(ckpt.pos, ids[4].pos);
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.max_deleted, ids[4].pos);
    let retained = log.read(&thread, ReadFrom::Start, 10_000).await.unwrap();
    assert_entries(&retained, &ids[5..], &evs[5..]);
    for (i, id) in ids.iter().enumerate() {
        let read = log.read(&thread, ReadFrom::After(*id), 1000).await;
        if id.pos < head.max_deleted {
            assert!(
                matches!(read, Err(LogError::Gap(ResumeGap::Trimmed))),
                "{i}: {read:?}"
            );
        } else {
            assert_entries(&read.unwrap(), &ids[i + 1..], &evs[i + 1..]);
        }
    }
}

/// Polls `cond` every 50 ms until it holds; fails after [`WITHIN`].
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WITHIN;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `max_age`: once the pending checkpoint is older than `max_age`, an append promotes it and
/// trims up to it, and no further: the entries after it stay, however old.
async fn max_age_trims_only_to_checkpoint(f: Fixture) {
    let retention = Retention {
        max_age: Some(Duration::from_secs(1)),
        ..keep(1000)
    };
    let log = f.log_with(retention, Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..200);
    let mut ids = log.append(&thread, &evs[..5]).await.unwrap();
    ids.extend(append_with(&*log, &thread, &evs[5..8], Some(candidate(7))).await);
    ids.extend(log.append(&thread, &evs[8..12]).await.unwrap());
    // The pending checkpoint is younger than `max_age`: nothing happens yet.
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    assert!(log.head(&thread).await.unwrap().complete_from_start());

    // Appends (without candidates) until one finds the pending checkpoint old enough.
    let deadline = Instant::now() + WITHIN;
    loop {
        let n = ids.len();
        ids.extend(log.append(&thread, &evs[n..n + 1]).await.unwrap());
        if log.checkpoint(&thread).await.unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no age promotion");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let checkpoint = log.checkpoint(&thread).await.unwrap().unwrap();
    assert_eq!(checkpoint.pos, ids[7].pos);
    assert_eq!(upto_of(&checkpoint), 7);
    assert_trimmed_to(&*log, &thread, &ids, &evs[..ids.len()], 8).await;

    // Everything retained is now older than `max_age` too, and stays: no newer checkpoint.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let n = ids.len();
    ids.extend(log.append(&thread, &evs[n..n + 1]).await.unwrap());
    assert_trimmed_to(&*log, &thread, &ids, &evs[..ids.len()], 8).await;
}

/// `max_age` without any checkpoint trims nothing (the fold must stay rebuildable).
async fn max_age_without_checkpoint_trims_nothing(f: Fixture) {
    let retention = Retention {
        max_age: Some(Duration::from_millis(100)),
        ..keep(1000)
    };
    let log = f.log_with(retention, Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..6);
    let mut ids = log.append(&thread, &evs[..5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    ids.extend(log.append(&thread, &evs[5..]).await.unwrap());
    let head = log.head(&thread).await.unwrap();
    assert!(head.complete_from_start());
    assert_entries(
        &log.read(&thread, ReadFrom::Start, 100).await.unwrap(),
        &ids,
        &evs,
    );
}

/// `idle_ttl`: a thread without appends for that long expires whole: a new epoch (a tail
/// following it reports the discontinuity), no checkpoint, no entries; old ids are another
/// epoch. Appends keep it alive.
async fn idle_ttl_expires_thread(f: Fixture) {
    const TTL: Duration = Duration::from_millis(300);
    let retention = Retention {
        idle_ttl: Some(TTL),
        ..keep(1000)
    };
    let log = f.log_with(retention, Duration::from_millis(200)).await;
    let thread = f.thread();
    let evs = events(0..200);
    let mut ids = append_with(&*log, &thread, &evs[..5], Some(candidate(4))).await;
    ids.extend(append_with(&*log, &thread, &evs[5..10], Some(candidate(9))).await);
    let old = log.head(&thread).await.unwrap();
    assert!(log.checkpoint(&thread).await.unwrap().is_some());
    let mut tail = TailHarness::start(&*log);
    tail.tail.follow(thread.clone(), old.epoch, old.last);

    // Appends more often than the TTL keep the thread alive.
    let alive_until = Instant::now() + TTL * 3;
    let mut n = 10;
    while Instant::now() < alive_until {
        ids.extend(log.append(&thread, &evs[n..n + 1]).await.unwrap());
        n += 1;
        tokio::time::sleep(TTL / 4).await;
    }
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.epoch, old.epoch, "expired while written to");
    assert!(log.checkpoint(&thread).await.unwrap().is_some());
    tail.collect(&HashMap::from([(thread.clone(), n - 10)]), WITHIN)
        .await;

    eventually("the idle expiry", || {
        let log = log.clone();
        let thread = thread.clone();
        async move { log.head(&thread).await.unwrap().epoch != old.epoch }
    })
    .await;
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.last, StreamPos::ZERO);
    assert_eq!(head.max_deleted, StreamPos::ZERO);
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    assert!(
        log.read(&thread, ReadFrom::Start, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let read = log.read(&thread, ReadFrom::After(ids[12]), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::OtherEpoch))),
        "{read:?}"
    );
    match tail.next(WITHIN).await {
        TailItem::Discontinuity {
            thread: t,
            head: h,
            reason,
        } => {
            assert_eq!(t, thread);
            assert_eq!(reason, ResumeGap::OtherEpoch);
            assert_eq!(h.epoch, head.epoch);
        }
        other => panic!("expected a discontinuity, got {other:?}"),
    }

    // The thread comes back under the new epoch, without the old checkpoint.
    let new = append_with(&*log, &thread, &evs[..2], Some(candidate(1))).await;
    assert_eq!(new[0].epoch, head.epoch);
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
}

async fn append_then_read(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let evs = events(0..50);
    let ids = append_in_batches(&*log, &thread, &evs, &[1, 3, 10, 1, 35]).await;
    assert_eq!(ids.len(), 50);
    assert_strictly_increasing(&ids);

    let got = log.read(&thread, ReadFrom::Start, 1000).await.unwrap();
    assert_entries(&got, &ids, &evs);

    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.epoch, ids[0].epoch);
    assert_eq!(head.last, ids[49].pos);
    assert_eq!(head.last_id(), Some(ids[49]));
    assert_eq!(head.max_deleted, StreamPos::ZERO);
    assert!(head.complete_from_start());
}

async fn empty_batch(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let before = log.head(&thread).await.unwrap();
    assert_eq!(
        log.append(&thread, &[]).await.unwrap(),
        Vec::<EventId>::new()
    );
    assert_eq!(log.head(&thread).await.unwrap(), before);
    assert!(
        log.read(&thread, ReadFrom::Start, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Also on a thread that has events.
    let ids = log.append(&thread, &events(0..2)).await.unwrap();
    assert_eq!(
        log.append(&thread, &[]).await.unwrap(),
        Vec::<EventId>::new()
    );
    assert_eq!(log.head(&thread).await.unwrap().last, ids[1].pos);
}

async fn read_paging(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let evs = events(0..25);
    let ids = log.append(&thread, &evs).await.unwrap();

    let mut got = log.read(&thread, ReadFrom::Start, 7).await.unwrap();
    assert_eq!(got.len(), 7);
    loop {
        let after = got.last().unwrap().id;
        let page = log.read(&thread, ReadFrom::After(after), 7).await.unwrap();
        assert!(page.len() <= 7);
        if page.is_empty() {
            break;
        }
        got.extend(page);
    }
    assert_entries(&got, &ids, &evs);

    assert!(
        log.read(&thread, ReadFrom::Start, 0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        log.read(&thread, ReadFrom::After(ids[3]), 0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        log.read(&thread, ReadFrom::After(ids[24]), 7)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn read_from_start(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    assert!(
        log.read(&thread, ReadFrom::Start, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let evs = events(0..5);
    let ids = log.append(&thread, &evs).await.unwrap();
    let got = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    assert_entries(&got, &ids, &evs);
    let got = log.read(&thread, ReadFrom::Start, 2).await.unwrap();
    assert_entries(&got, &ids[..2], &evs[..2]);
}

async fn resume_after_every_id(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let evs = events(0..200);
    let ids = append_in_batches(&*log, &thread, &evs, &[20]).await;
    assert_strictly_increasing(&ids);
    for (i, id) in ids.iter().enumerate() {
        let got = log.read(&thread, ReadFrom::After(*id), 1000).await.unwrap();
        assert_entries(&got, &ids[i + 1..], &evs[i + 1..]);
    }
}

async fn gap_ahead(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let ids = log.append(&thread, &events(0..3)).await.unwrap();
    let last = ids[2];
    for pos in [
        next_pos(last.pos),
        StreamPos::new(last.pos.ms + 1, 0),
        StreamPos::new(u64::MAX, u64::MAX),
    ] {
        let ahead = EventId {
            epoch: last.epoch,
            pos,
        };
        let read = log.read(&thread, ReadFrom::After(ahead), 10).await;
        assert!(
            matches!(read, Err(LogError::Gap(ResumeGap::Ahead))),
            "{read:?}"
        );
    }

    // A thread with no events: any position is ahead.
    let empty = f.thread();
    let head = log.head(&empty).await.unwrap();
    let ahead = EventId {
        epoch: head.epoch,
        pos: StreamPos::new(0, 1),
    };
    let read = log.read(&empty, ReadFrom::After(ahead), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::Ahead))),
        "{read:?}"
    );
    // Exactly at ZERO of the current epoch is resumable (nothing before it).
    let zero = EventId {
        epoch: head.epoch,
        pos: StreamPos::ZERO,
    };
    assert!(
        log.read(&empty, ReadFrom::After(zero), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn gap_other_epoch(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let ids = log.append(&thread, &events(0..3)).await.unwrap();
    let other = EventId {
        epoch: Epoch(ids[0].epoch.0 ^ 0x5a5a_0001),
        pos: ids[1].pos,
    };
    let read = log.read(&thread, ReadFrom::After(other), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::OtherEpoch))),
        "{read:?}"
    );
    // An id of this thread's epoch used on another thread is another epoch there.
    let elsewhere = f.thread();
    let read = log.read(&elsewhere, ReadFrom::After(ids[0]), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::OtherEpoch))),
        "{read:?}"
    );
}

async fn gap_trimmed(f: Fixture) {
    // Redis trims `MAXLEN ~` by whole macro nodes (100 entries by default), hence 500 events.
    let log = f.log_with(keep(10), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..500);
    let ids = append_in_batches(&*log, &thread, &evs, &[25]).await;
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.last, ids[499].pos);
    assert!(head.max_deleted > StreamPos::ZERO, "nothing trimmed");
    assert!(!head.complete_from_start());

    let retained = log.read(&thread, ReadFrom::Start, 10_000).await.unwrap();
    assert!(
        retained.len() >= 10 && retained.len() < 500,
        "{}",
        retained.len()
    );
    let first = ids.len() - retained.len();
    assert_entries(&retained, &ids[first..], &evs[first..]);
    assert!(retained[0].id.pos > head.max_deleted);

    let mut trimmed = 0;
    for (i, id) in ids.iter().enumerate() {
        let read = log.read(&thread, ReadFrom::After(*id), 1000).await;
        if id.pos < head.max_deleted {
            assert!(
                matches!(read, Err(LogError::Gap(ResumeGap::Trimmed))),
                "{i}: {read:?}"
            );
            trimmed += 1;
        } else {
            assert_entries(&read.unwrap(), &ids[i + 1..], &evs[i + 1..]);
        }
    }
    assert!(trimmed >= 1);
}

async fn head_new_thread(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.last, StreamPos::ZERO);
    assert_eq!(head.max_deleted, StreamPos::ZERO);
    assert!(head.complete_from_start());
    assert_eq!(head.last_id(), None);
    // The epoch is created once and kept.
    assert_eq!(log.head(&thread).await.unwrap(), head);
    let ids = log.append(&thread, &events(0..1)).await.unwrap();
    assert_eq!(ids[0].epoch, head.epoch);
    assert!(ids[0].pos > StreamPos::ZERO);
}

async fn ping_answers(f: Fixture) {
    f.log().await.ping().await.unwrap();
}

async fn tail_follows_many_threads(f: Fixture) {
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let threads: Vec<ThreadId> = (0..3).map(|_| f.thread()).collect();
    for t in &threads {
        let head = log.head(t).await.unwrap();
        tail.tail.follow(t.clone(), head.epoch, head.last);
    }
    // Appenders run concurrently, in batches of 1 to 7.
    let appenders: Vec<_> = threads
        .iter()
        .enumerate()
        .map(|(n, t)| {
            let log = log.clone();
            let t = t.clone();
            tokio::spawn(async move {
                let evs = events(n * 1000..n * 1000 + 60);
                let mut ids = Vec::new();
                for (k, batch) in evs.chunks(1 + n * 3).enumerate() {
                    ids.extend(log.append(&t, batch).await.unwrap());
                    if k % 3 == 0 {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                }
                (t, ids, evs)
            })
        })
        .collect();
    let mut expected = Vec::new();
    for a in appenders {
        expected.push(a.await.unwrap());
    }
    let want: HashMap<ThreadId, usize> = threads.iter().map(|t| (t.clone(), 60)).collect();
    let got = tail.collect(&want, WITHIN).await;
    for (t, ids, evs) in &expected {
        assert_entries(&got[t], ids, evs);
    }
    assert!(
        tail.drain_for(Duration::from_millis(300)).await.is_empty(),
        "duplicates or extra items"
    );
}

async fn tail_follow_while_blocked(f: Fixture) {
    // A long block time: a follow must not wait for the reader's `XREAD BLOCK` to time out.
    let log = f.log_with(UNBOUNDED, Duration::from_secs(30)).await;
    let mut tail = TailHarness::start(&*log);
    let a = f.thread();
    let b = f.thread();
    let head = log.head(&a).await.unwrap();
    tail.tail.follow(a.clone(), head.epoch, head.last);
    let ids = log.append(&a, &events(0..1)).await.unwrap();
    let got = tail.collect(&HashMap::from([(a.clone(), 1)]), WITHIN).await;
    assert_eq!(got[&a][0].id, ids[0]);
    // Let the reader settle into its blocking read of `a` alone.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let head = log.head(&b).await.unwrap();
    tail.tail.follow(b.clone(), head.epoch, head.last);
    let evs = events(0..3);
    let ids = log.append(&b, &evs).await.unwrap();
    let started = Instant::now();
    let got = tail
        .collect(&HashMap::from([(b.clone(), 3)]), Duration::from_secs(10))
        .await;
    assert_entries(&got[&b], &ids, &evs);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the new follow waited for the block timeout"
    );
}

async fn tail_unfollow_stops(f: Fixture) {
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let a = f.thread();
    let b = f.thread();
    for t in [&a, &b] {
        let head = log.head(t).await.unwrap();
        tail.tail.follow(t.clone(), head.epoch, head.last);
    }
    log.append(&a, &events(0..1)).await.unwrap();
    tail.collect(&HashMap::from([(a.clone(), 1)]), WITHIN).await;

    tail.tail.unfollow(&a);
    log.append(&a, &events(1..6)).await.unwrap();
    let ids = log.append(&b, &events(0..1)).await.unwrap();
    let got = tail.collect(&HashMap::from([(b.clone(), 1)]), WITHIN).await;
    assert_eq!(got[&b][0].id, ids[0]);
    let late = tail.drain_for(Duration::from_millis(1500)).await;
    assert!(late.is_empty(), "items after unfollow: {late:?}");
}

async fn tail_follow_from_position(f: Fixture) {
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let thread = f.thread();
    let evs = events(0..20);
    let ids = log.append(&thread, &evs).await.unwrap();
    tail.tail.follow(thread.clone(), ids[9].epoch, ids[9].pos);
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 10)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &ids[10..], &evs[10..]);

    // Following again replaces the earlier follow.
    tail.tail.follow(thread.clone(), ids[17].epoch, ids[17].pos);
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 2)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &ids[18..], &evs[18..]);
    assert!(tail.drain_for(Duration::from_millis(300)).await.is_empty());
}

/// Follows that cannot continue exactly get a discontinuity at the head, then live entries.
async fn tail_follow_gaps(f: Fixture) {
    let log = f.log_with(keep(10), Duration::from_secs(1)).await;
    let mut tail = TailHarness::start(&*log);

    let other = f.thread();
    let ids = log.append(&other, &events(0..3)).await.unwrap();
    let wrong = Epoch(ids[0].epoch.0 ^ 1);
    tail.tail.follow(other.clone(), wrong, ids[0].pos);
    expect_discontinuity(&mut tail, &other, ResumeGap::OtherEpoch, ids[2]).await;

    let ahead = f.thread();
    let ids = log.append(&ahead, &events(0..3)).await.unwrap();
    tail.tail
        .follow(ahead.clone(), ids[2].epoch, next_pos(ids[2].pos));
    expect_discontinuity(&mut tail, &ahead, ResumeGap::Ahead, ids[2]).await;

    let trimmed = f.thread();
    let ids = append_in_batches(&*log, &trimmed, &events(0..500), &[50]).await;
    tail.tail.follow(trimmed.clone(), ids[0].epoch, ids[0].pos);
    expect_discontinuity(&mut tail, &trimmed, ResumeGap::Trimmed, ids[499]).await;

    // Each continues live after its head.
    let mut want = HashMap::new();
    let mut expected = Vec::new();
    for t in [&other, &ahead, &trimmed] {
        let evs = events(900..902);
        let ids = log.append(t, &evs).await.unwrap();
        want.insert(t.clone(), 2);
        expected.push((t.clone(), ids, evs));
    }
    let got = tail.collect(&want, WITHIN).await;
    for (t, ids, evs) in &expected {
        assert_entries(&got[t], ids, evs);
    }
}

/// Cancelling the shutdown token ends the tail, even while its reader is blocked in a long
/// read: the sink closes.
async fn tail_shutdown_ends_it(f: Fixture) {
    let log = f.log_with(UNBOUNDED, Duration::from_secs(30)).await;
    let (tx, mut rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let tail = log.start_tail(tx, stop.clone());
    let thread = f.thread();
    let head = log.head(&thread).await.unwrap();
    tail.follow(thread.clone(), head.epoch, head.last);
    log.append(&thread, &events(0..1)).await.unwrap();
    assert!(matches!(
        tokio::time::timeout(WITHIN, rx.recv()).await,
        Ok(Some(TailItem::Entries { .. }))
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    drop(tail);
    let end = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert!(matches!(end, Ok(None)), "tail still running: {end:?}");
}

async fn expect_discontinuity(
    tail: &mut TailHarness,
    thread: &ThreadId,
    want: ResumeGap,
    last: EventId,
) {
    match tail.next(WITHIN).await {
        TailItem::Discontinuity {
            thread: t,
            head,
            reason,
        } => {
            assert_eq!(&t, thread);
            assert_eq!(reason, want);
            assert_eq!(head.last_id(), Some(last));
        }
        other => panic!("expected a discontinuity, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Redis only

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn stream_key(thread: &ThreadId) -> String {
    format!("agui:{{{thread}}}:log")
}

fn meta_key(thread: &ThreadId) -> String {
    format!("agui:{{{thread}}}:meta")
}

async fn xadd(
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

/// The documented format: one field `e` with the event JSON; the epoch in the meta hash.
#[tokio::test]
async fn redis_entry_format() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let thread = f.thread();
    let evs = events(0..2);
    let ids = log.append(&thread, &evs).await.unwrap();
    let mut conn = redis_conn(&redis_url()).await;
    let raw: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(stream_key(&thread))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(raw.len(), 2);
    for ((entry_id, fields), (id, ev)) in raw.iter().zip(ids.iter().zip(&evs)) {
        assert_eq!(entry_id, &id.pos.to_string());
        assert_eq!(fields, &vec![b"e".to_vec(), ev.json.to_vec()]);
    }
    let epoch: String = redis::cmd("HGET")
        .arg(meta_key(&thread))
        .arg("epoch")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(epoch, ids[0].epoch.to_string());
    assert_eq!(epoch.len(), 8);
}

fn ckpt_key(thread: &ThreadId) -> String {
    format!("agui:{{{thread}}}:ckpt")
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

/// The documented checkpoint hash: `pos`, `events`, `ord` (promoted) and `next_pos`,
/// `next_events`, `next_ord` (pending); `ord` is the stream's `entries-added` at `pos`.
#[tokio::test]
async fn redis_checkpoint_key_format() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let thread = f.thread();
    let mut ids = log.append(&thread, &events(0..3)).await.unwrap();
    ids.extend(append_with(&*log, &thread, &events(3..5), Some(candidate(4))).await);
    // The entry after the checkpoint in a later millisecond: `max_deleted` is still exactly
    // the checkpoint (the trimmed-entry bound from `recorded-first-entry-id` alone would be
    // `<ms - 1>-<u64::MAX>`, making a resume from the checkpoint look trimmed).
    tokio::time::sleep(Duration::from_millis(5)).await;
    ids.extend(append_with(&*log, &thread, &events(5..9), Some(candidate(8))).await);
    assert!(ids[5].pos.ms > ids[4].pos.ms);
    assert_eq!(log.head(&thread).await.unwrap().max_deleted, ids[4].pos);
    let mut conn = redis_conn(&redis_url()).await;
    let hash: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(ckpt_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    let field = |k: &str| String::from_utf8(hash[k].clone()).unwrap();
    assert_eq!(hash.len(), 6, "{:?}", hash.keys());
    assert_eq!(field("pos"), ids[4].pos.to_string());
    assert_eq!(hash["events"], candidate(4).to_vec());
    assert_eq!(field("ord"), "5");
    assert_eq!(field("next_pos"), ids[8].pos.to_string());
    assert_eq!(hash["next_events"], candidate(8).to_vec());
    assert_eq!(field("next_ord"), "9");
    let len: i64 = redis::cmd("XLEN")
        .arg(stream_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        len, 4,
        "XTRIM MINID removed exactly the entries up to the checkpoint"
    );
}

/// Whenever the broker creates a new epoch, the checkpoint hash goes with the old one: after
/// the stream alone was lost, and after the meta hash alone was lost.
#[tokio::test]
async fn redis_new_epoch_deletes_checkpoint() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let mut conn = redis_conn(&redis_url()).await;
    for lost in ["stream", "meta"] {
        let thread = f.thread();
        append_with(&*log, &thread, &events(0..3), Some(candidate(2))).await;
        append_with(&*log, &thread, &events(3..6), Some(candidate(5))).await;
        let old = log.head(&thread).await.unwrap();
        assert!(log.checkpoint(&thread).await.unwrap().is_some());
        let key = match lost {
            "stream" => stream_key(&thread),
            _ => meta_key(&thread),
        };
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        // Any script that looks at the thread notices; `checkpoint()` is one of them.
        assert_eq!(log.checkpoint(&thread).await.unwrap(), None, "{lost}");
        assert!(!exists(&mut conn, &ckpt_key(&thread)).await, "{lost}");
        let head = log.head(&thread).await.unwrap();
        assert_ne!(head.epoch, old.epoch, "{lost}");
        // New candidates start over: pending first, promoted by the next.
        append_with(&*log, &thread, &events(6..7), Some(candidate(6))).await;
        assert_eq!(log.checkpoint(&thread).await.unwrap(), None, "{lost}");
    }
}

/// `PTTL` of `key` in ms (`-1`: no TTL, `-2`: no key).
async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

/// `idle_ttl` is a `PEXPIRE` of every key of the thread to `idle_ttl` plus a slack of
/// `idle_ttl / 16` (at most 60 s), renewed by an append that finds less than `idle_ttl` left.
#[tokio::test]
async fn redis_idle_ttl_pexpires_every_key() {
    let f = Fixture::new(Backend::Redis);
    let ttl = Duration::from_secs(60);
    let retention = Retention {
        idle_ttl: Some(ttl),
        ..keep(1000)
    };
    let log = f.log_with(retention, Duration::from_secs(1)).await;
    let thread = f.thread();
    let mut conn = redis_conn(&redis_url()).await;
    append_with(&*log, &thread, &events(0..2), Some(candidate(1))).await;
    for key in [stream_key(&thread), meta_key(&thread), ckpt_key(&thread)] {
        let left = pttl(&mut conn, &key).await;
        // 60 s + 60 s / 16 of slack.
        assert!(left > 60_000 && left <= 63_750, "{key}: {left}");
        let _: () = redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    log.append(&thread, &events(2..3)).await.unwrap();
    for key in [stream_key(&thread), meta_key(&thread), ckpt_key(&thread)] {
        let left = pttl(&mut conn, &key).await;
        assert!(left > 60_000, "{key} not renewed: {left}");
    }
    // An append that finds more than `idle_ttl` left leaves the TTLs alone.
    let _: () = redis::cmd("PEXPIRE")
        .arg(stream_key(&thread))
        .arg(62_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    log.append(&thread, &events(3..4)).await.unwrap();
    let left = pttl(&mut conn, &stream_key(&thread)).await;
    assert!(
        left <= 62_000,
        "renewed with more than idle_ttl left: {left}"
    );
    // Without `idle_ttl` the broker leaves TTLs alone.
    let keep_forever = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let other = f.thread();
    keep_forever.append(&other, &events(0..1)).await.unwrap();
    assert_eq!(pttl(&mut conn, &stream_key(&other)).await, -1);

    // A read of a thread nobody writes creates its epoch (meta hash) with the same TTL, so
    // such reads leave nothing behind for good; without `idle_ttl`, no TTL.
    let unread = f.thread();
    log.head(&unread).await.unwrap();
    let left = pttl(&mut conn, &meta_key(&unread)).await;
    assert!(
        left > 60_000 && left <= 63_750,
        "meta of a read thread: {left}"
    );
    let unread = f.thread();
    log.read(&unread, ReadFrom::Start, 10).await.unwrap();
    assert!(pttl(&mut conn, &meta_key(&unread)).await > 60_000);
    let forever = f.thread();
    keep_forever.head(&forever).await.unwrap();
    assert_eq!(pttl(&mut conn, &meta_key(&forever)).await, -1);
}

/// Keys lost (a flush, a failover without the data): a new epoch, old ids are another epoch,
/// and the tail reports the discontinuity, then follows the new log.
#[tokio::test]
async fn redis_lost_keys_get_a_new_epoch() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let thread = f.thread();
    let old = log.append(&thread, &events(0..5)).await.unwrap();
    tail.tail.follow(thread.clone(), old[4].epoch, old[4].pos);

    let mut conn = redis_conn(&redis_url()).await;
    let _: () = redis::cmd("DEL")
        .arg(stream_key(&thread))
        .arg(meta_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();

    let head = log.head(&thread).await.unwrap();
    assert_ne!(head.epoch, old[0].epoch);
    assert_eq!(head.last, StreamPos::ZERO);
    let read = log.read(&thread, ReadFrom::After(old[2]), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::OtherEpoch))),
        "{read:?}"
    );
    match tail.next(WITHIN).await {
        TailItem::Discontinuity {
            thread: t,
            head: h,
            reason,
        } => {
            assert_eq!(t, thread);
            assert_eq!(reason, ResumeGap::OtherEpoch);
            assert_eq!(h.epoch, head.epoch);
        }
        other => panic!("expected a discontinuity, got {other:?}"),
    }
    let evs = events(5..7);
    let new = log.append(&thread, &evs).await.unwrap();
    assert_eq!(new[0].epoch, head.epoch);
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 2)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &new, &evs);

    // Only the stream lost (its meta survives): still a new epoch.
    let _: () = redis::cmd("DEL")
        .arg(stream_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = log.head(&thread).await.unwrap();
    assert_ne!(again.epoch, head.epoch);
    assert_eq!(again.last, StreamPos::ZERO);
    let newer = log.append(&thread, &events(7..8)).await.unwrap();
    assert_eq!(newer[0].epoch, again.epoch);
}

/// Producers may XADD directly: valid entries are delivered (an epoch is created for them),
/// invalid ones are skipped by read and by the tail, never fatal.
#[tokio::test]
async fn redis_direct_producer_entries() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let mut conn = redis_conn(&redis_url()).await;
    let thread = f.thread();
    let mixture = |n: usize| {
        vec![
            (
                "e",
                format!(r#"{{"type":"CUSTOM","name":"direct","value":{n}}}"#),
            ),
            ("e", "not json".to_string()),
            (
                "x",
                r#"{"type":"CUSTOM","name":"no e field","value":1}"#.to_string(),
            ),
            ("e", r#"{"type":"NOPE"}"#.to_string()),
            (
                "e",
                r#"{"type":"RUN_STARTED","threadId":"another-thread","runId":"r"}"#.to_string(),
            ),
            (
                "e",
                format!(
                    "{{ \"type\": \"CUSTOM\",\n \"name\": \"spaced\", \"value\": [{n}, 2], \"extra\": true }}"
                ),
            ),
        ]
    };
    for (field, v) in mixture(1) {
        xadd(&mut conn, &thread, field, &v).await;
    }
    let got = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    let jsons: Vec<&[u8]> = got.iter().map(|e| &e.json[..]).collect();
    assert_eq!(
        jsons,
        vec![
            &br#"{"type":"CUSTOM","name":"direct","value":1}"#[..],
            &br#"{"type":"CUSTOM","name":"spaced","value":[1,2],"extra":true}"#[..],
        ]
    );
    let head = log.head(&thread).await.unwrap();
    assert_eq!(got[0].id.epoch, head.epoch);
    assert_eq!(got[1].id.pos, head.last);
    let epoch: String = redis::cmd("HGET")
        .arg(meta_key(&thread))
        .arg("epoch")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(epoch, head.epoch.to_string());
    // Paging over invalid entries still returns `limit` valid ones.
    let one = log.read(&thread, ReadFrom::Start, 1).await.unwrap();
    assert_eq!(one.len(), 1);
    let next = log
        .read(&thread, ReadFrom::After(one[0].id), 1)
        .await
        .unwrap();
    assert_eq!(next, got[1..]);

    // The tail skips the same entries and keeps going.
    let mut tail = TailHarness::start(&*log);
    tail.tail.follow(thread.clone(), head.epoch, head.last);
    for (field, v) in mixture(2) {
        xadd(&mut conn, &thread, field, &v).await;
    }
    let ids = log.append(&thread, &events(0..1)).await.unwrap();
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 3)]), WITHIN)
        .await;
    let got = &got[&thread];
    assert_eq!(
        &got[0].json[..],
        br#"{"type":"CUSTOM","name":"direct","value":2}"#
    );
    assert_eq!(
        &got[1].json[..],
        br#"{"type":"CUSTOM","name":"spaced","value":[2,2],"extra":true}"#
    );
    assert_eq!(got[2].id, ids[0]);
    assert!(tail.drain_for(Duration::from_millis(300)).await.is_empty());
}

/// The append's compare on Redis: an entry added directly after the expected one is a
/// conflict (reported with the new last-generated-id); a stream emptied by trimming, or whose
/// newest entry was `XDEL`eted, still takes an append on the head it reports; a stream that
/// went back to an older state under the same epoch (restored from an earlier `DUMP`) is a
/// conflict, although no entry follows the expected ID.
#[tokio::test]
async fn redis_append_if_after_direct_trimmed_and_deleted_entries() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let mut conn = redis_conn(&redis_url()).await;
    let thread = f.thread();
    let fresh = log.head(&thread).await.unwrap();
    log.append_if(&thread, &events(0..3), fresh, AppendExtras::default())
        .await
        .unwrap();
    let head = log.head(&thread).await.unwrap();

    xadd(
        &mut conn,
        &thread,
        "e",
        r#"{"type":"CUSTOM","name":"d","value":1}"#,
    )
    .await;
    let now = match log
        .append_if(&thread, &events(3..4), head, AppendExtras::default())
        .await
    {
        Err(LogError::Conflict(now)) => now,
        other => panic!("expected a conflict, got {other:?}"),
    };
    assert_eq!(now, log.head(&thread).await.unwrap());
    assert!(now.last > head.last);

    let _: i64 = redis::cmd("XTRIM")
        .arg(stream_key(&thread))
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    let trimmed = log.head(&thread).await.unwrap();
    assert_eq!(
        (trimmed.epoch, trimmed.last),
        (now.epoch, now.last),
        "trimming keeps the last-generated-id"
    );
    let ids = log
        .append_if(&thread, &events(3..5), trimmed, AppendExtras::default())
        .await
        .unwrap();

    let _: i64 = redis::cmd("XDEL")
        .arg(stream_key(&thread))
        .arg(ids[1].pos.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();
    let deleted = log.head(&thread).await.unwrap();
    assert_eq!(deleted.last, ids[1].pos);
    let more = log
        .append_if(&thread, &events(5..6), deleted, AppendExtras::default())
        .await
        .unwrap();
    assert!(more[0].pos > ids[1].pos);
    let got = log.read(&thread, ReadFrom::Start, 10).await.unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].id, ids[0]);
    assert_eq!(got[1].id, more[0]);

    let dump: Vec<u8> = redis::cmd("DUMP")
        .arg(stream_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    log.append(&thread, &events(6..8)).await.unwrap();
    let ahead = log.head(&thread).await.unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg(stream_key(&thread))
        .arg(0)
        .arg(dump)
        .arg("REPLACE")
        .query_async(&mut conn)
        .await
        .unwrap();
    match log
        .append_if(&thread, &events(8..9), ahead, AppendExtras::default())
        .await
    {
        Err(LogError::Conflict(now)) => assert_eq!(now.last, more[0].pos),
        other => panic!("a stream that went back must be a conflict, got {other:?}"),
    }
}

fn outage_config(server: &RedisServer) -> RedisLogConfig {
    RedisLogConfig {
        op_timeout: Duration::from_millis(500),
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
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 3)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &ids, &evs);

    server.kill();
    let started = Instant::now();
    assert_unavailable(log.append(&thread, &events(3..4)).await, started);
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
    match tail.next(WITHIN).await {
        TailItem::Discontinuity {
            thread: t,
            head: h,
            reason,
        } => {
            assert_eq!(t, thread);
            assert_eq!(reason, ResumeGap::OtherEpoch);
            assert_eq!(h.epoch, new_head.epoch);
        }
        other => panic!("expected a discontinuity, got {other:?}"),
    }
    let evs = events(10..14);
    let ids = log.append(&thread, &evs).await.unwrap();
    assert_eq!(ids[0].epoch, new_head.epoch);
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 4)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &ids, &evs);
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
    tail.collect(&HashMap::from([(thread.clone(), 10)]), WITHIN)
        .await;

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
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 30)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &ids[10..], &evs[10..]);
    assert!(tail.drain_for(Duration::from_millis(300)).await.is_empty());
}

/// A frozen Redis (accepts nothing, answers nothing): calls return within the deadline.
#[tokio::test]
async fn redis_frozen_server_never_hangs() {
    let server = RedisServer::start().await;
    let log = RedisLog::connect(outage_config(&server)).await.unwrap();
    let thread = ThreadId::parse("frozen").unwrap();
    log.append(&thread, &events(0..1)).await.unwrap();
    server.pause();
    let started = Instant::now();
    assert_unavailable(log.append(&thread, &events(1..2)).await, started);
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
    let got = tail
        .collect(&HashMap::from([(thread.clone(), 2)]), WITHIN)
        .await;
    assert_entries(&got[&thread], &ids, &evs);
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
    let got = tail
        .collect(&HashMap::from([(good.clone(), 3)]), WITHIN)
        .await;
    assert_entries(&got[&good], &ids, &evs);
}
