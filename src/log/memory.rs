//! The `memory` log backend: the embedded default, so `cargo run` serves with nothing else
//! installed. One node only; everything is lost on restart (each thread then gets a new
//! epoch, so old ids are never mistaken for new positions).
//!
//! Retention (PROTOCOL §6, [`Retention`]) has the Redis backend's semantics: checkpoint
//! candidates become pending, the next one promotes the pending checkpoint and trims every
//! entry at or before it; the count cap is `max_events`, or `4 * max_events` once the thread
//! uses checkpoints (trimming here is exact, where Redis' `MAXLEN ~` is approximate);
//! `max_age` promotes a pending checkpoint whose last entry was appended more than `max_age`
//! ago (an [`Instant`] stored with it). Idle threads (`idle_ttl` since their last append)
//! expire two ways: lazily, when the thread is next touched (it comes back empty under a new
//! epoch, and a tail following it reports the discontinuity), and by a sweeper task, started
//! by [`MemoryLog::new`] when a Tokio runtime is running, which runs every `idle_ttl / 2`
//! (between 50 ms and 60 s), empties idle threads the same way and drops them from memory
//! once nothing (no tail, no call in flight) holds them. The open-run registry of the orphan
//! sweep ([`EventLog::note_open_run`]) is a map beside the threads.

use super::{
    AppendExtras, Checkpoint, Epoch, EventId, EventLog, ListCursor, LogEntry, LogError, LogHead,
    ReadFrom, ResumeCheck, ResumeGap, Retention, StreamPos, Tail, TailItem, ThreadPage,
    ThreadSummary, check_resumable,
};
use crate::event::ThreadMap;
use crate::event::{ThreadId, ValidEvent};
use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// In-process thread logs. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct MemoryLog {
    shared: Arc<Shared>,
}

impl Default for MemoryLog {
    /// [`MemoryLog::new`] with the default [`Retention`].
    fn default() -> Self {
        MemoryLog::new(Retention::default())
    }
}

struct Shared {
    threads: ThreadMap<Arc<ThreadLog>>,
    retention: Retention,
    /// The open-run registry ([`EventLog::note_open_run`]): thread → noted time (ms).
    open_runs: Mutex<HashMap<ThreadId, u64>>,
}

struct ThreadLog {
    inner: Mutex<ThreadInner>,
    /// Woken after every append; the tail task of the thread waits on it.
    appended: Notify,
}

impl ThreadLog {
    fn new() -> Self {
        ThreadLog {
            inner: Mutex::new(ThreadInner::new(Instant::now())),
            appended: Notify::new(),
        }
    }

    /// Locks the thread, first expiring it if it has been idle for `retention.idle_ttl`.
    fn lock(&self, retention: &Retention) -> MutexGuard<'_, ThreadInner> {
        let mut inner = self.inner.lock();
        if inner.expire_if_idle(retention, Instant::now()) {
            // A tail following the thread wakes and reports the new epoch.
            self.appended.notify_waiters();
        }
        inner
    }
}

struct ThreadInner {
    epoch: Epoch,
    /// Retained entries, oldest first; positions are `0-1`, `0-2`, ... (consecutive).
    entries: VecDeque<LogEntry>,
    last: StreamPos,
    max_deleted: StreamPos,
    /// The promoted checkpoint (every entry at or before it is trimmed).
    checkpoint: Option<Checkpoint>,
    /// The latest candidate, promoted by the next one (or by `max_age`).
    pending: Option<Pending>,
    /// When the thread was created or last appended to (idle expiry).
    last_append: Instant,
    /// `X-Producer-Id` → number of its last appended event (idempotent retries).
    producers: HashMap<String, u64>,
}

/// A pending checkpoint and when its last entry was appended (`max_age`).
struct Pending {
    checkpoint: Checkpoint,
    at: Instant,
}

impl ThreadInner {
    fn new(now: Instant) -> Self {
        ThreadInner {
            epoch: Epoch::random(),
            entries: VecDeque::new(),
            last: StreamPos::ZERO,
            max_deleted: StreamPos::ZERO,
            checkpoint: None,
            pending: None,
            last_append: now,
            producers: HashMap::new(),
        }
    }

    fn idle(&self, retention: &Retention, now: Instant) -> bool {
        retention
            .idle_ttl
            .is_some_and(|ttl| !ttl.is_zero() && now.duration_since(self.last_append) >= ttl)
    }

    /// Replaces an idle thread by an empty one under a new epoch (its log and checkpoints
    /// gone, like expired Redis keys). A thread that never had an event keeps its epoch.
    /// Returns whether it was expired.
    fn expire_if_idle(&mut self, retention: &Retention, now: Instant) -> bool {
        if !self.idle(retention, now) {
            return false;
        }
        if self.last == StreamPos::ZERO {
            self.last_append = now;
            return false;
        }
        *self = ThreadInner::new(now);
        true
    }

    /// Makes `checkpoint` the thread's checkpoint and trims every entry at or before it.
    fn promote(&mut self, checkpoint: Checkpoint) {
        while let Some(first) = self.entries.front()
            && first.id.pos <= checkpoint.pos
        {
            self.max_deleted = first.id.pos;
            self.entries.pop_front();
        }
        self.checkpoint = Some(checkpoint);
    }

    /// Retention after an append that ended at `self.last` (see the module docs). A
    /// `candidate` within `min_gap` entries of the pending checkpoint is dropped
    /// ([`AppendExtras::candidate_min_gap`]).
    fn retain(
        &mut self,
        retention: &Retention,
        candidate: Option<Bytes>,
        min_gap: u64,
        now: Instant,
    ) {
        // Positions are `0-n`, `n` counting the entries: the gap is a difference of `seq`s.
        let too_soon = |p: &Pending| self.last.seq - p.checkpoint.pos.seq < min_gap;
        if let Some(events) = candidate
            && !self.pending.as_ref().is_some_and(too_soon)
        {
            if let Some(older) = self.pending.take() {
                self.promote(older.checkpoint);
            }
            self.pending = Some(Pending {
                checkpoint: Checkpoint {
                    pos: self.last,
                    events,
                },
                at: now,
            });
        }
        if let Some(max_age) = retention.max_age.filter(|a| !a.is_zero())
            && self
                .pending
                .as_ref()
                .is_some_and(|p| now.duration_since(p.at) >= max_age)
            && let Some(old) = self.pending.take()
        {
            self.promote(old.checkpoint);
        }
        let in_use = self.checkpoint.is_some() || self.pending.is_some();
        let cap = retention.cap(in_use);
        if in_use {
            // Never trim past the newest checkpoint (the fold must stay rebuildable, PROTOCOL §6):
            // over the safety cap, the pending checkpoint is promoted early instead.
            if cap > 0
                && self.entries.len() > cap
                && let Some(p) = self.pending.take()
            {
                self.promote(p.checkpoint);
            }
            return;
        }
        while cap > 0 && self.entries.len() > cap {
            if let Some(old) = self.entries.pop_front() {
                self.max_deleted = old.id.pos;
            }
        }
    }

    fn head(&self) -> LogHead {
        LogHead {
            epoch: self.epoch,
            last: self.last,
            max_deleted: self.max_deleted,
        }
    }

    fn summary(&self, thread: &ThreadId) -> ThreadSummary {
        ThreadSummary {
            thread: thread.clone(),
            head: self.head(),
            retained: self.entries.len() as u64,
            last: self.entries.back().cloned(),
        }
    }

    /// Index in `entries` of the first entry strictly after `pos`.
    fn index_after(&self, pos: StreamPos) -> usize {
        match self.entries.front() {
            // Positions are consecutive `0-n`, so the index is arithmetic, not a search.
            Some(first) => (pos.seq + 1).saturating_sub(first.id.pos.seq) as usize,
            None => 0,
        }
        .min(self.entries.len())
    }

    /// Whether an entry at `pos` is retained. Positions are consecutive `0-n` up to `last`, so
    /// every position from the first retained one to `last` is held.
    fn holds(&self, pos: StreamPos) -> bool {
        pos.ms == 0
            && pos <= self.last
            && self
                .entries
                .front()
                .is_some_and(|first| pos >= first.id.pos)
    }

    /// `check_resumable` of `id` against this thread.
    fn check(&self, id: EventId) -> Result<(), ResumeGap> {
        check_resumable(&self.head(), id, self.holds(id.pos))
    }

    /// Position of the last retained entry at or before `pos` (the fork point of a
    /// rolled-back id, [`ResumeCheck::fork`]).
    fn last_at_or_before(&self, pos: StreamPos) -> Option<StreamPos> {
        let n = self.entries.partition_point(|e| e.id.pos <= pos);
        n.checked_sub(1)
            .and_then(|i| self.entries.get(i))
            .map(|e| e.id.pos)
    }

    fn read(&self, from: ReadFrom, limit: usize) -> Result<Vec<LogEntry>, ResumeGap> {
        let start = match from {
            ReadFrom::Start => 0,
            ReadFrom::After(id) => {
                self.check(id)?;
                self.index_after(id.pos)
            }
        };
        Ok(self
            .entries
            .iter()
            .skip(start)
            .take(limit)
            .cloned()
            .collect())
    }
}

impl MemoryLog {
    /// An empty log store with the given retention. With an `idle_ttl` and inside a Tokio
    /// runtime, also spawns the idle-thread sweeper (see the module docs); it ends when the
    /// last clone of the log is dropped.
    pub fn new(retention: Retention) -> Self {
        let shared = Arc::new(Shared {
            threads: ThreadMap::default(),
            retention,
            open_runs: Mutex::new(HashMap::new()),
        });
        if let Some(ttl) = retention.idle_ttl.filter(|t| !t.is_zero())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(sweep(Arc::downgrade(&shared), ttl));
        }
        MemoryLog { shared }
    }

    /// Appends under the thread's lock, after checking `expected` when given, then applies
    /// retention (checkpoint `candidate`, `max_age`, count cap).
    fn append_locked(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: Option<LogHead>,
        extras: AppendExtras,
    ) -> Result<Vec<EventId>, LogError> {
        let AppendExtras {
            candidate,
            candidate_min_gap,
            producer,
            handed_over,
        } = extras;
        let log = self.thread(thread);
        let retention = &self.shared.retention;
        let ids = {
            let mut inner = log.lock(retention);
            if let Some(exp) = expected {
                let head = inner.head();
                if head.epoch != exp.epoch || head.last != exp.last {
                    return Err(LogError::Conflict(head));
                }
            }
            if events.is_empty() {
                return Ok(Vec::new());
            }
            let mut ids = Vec::with_capacity(events.len());
            for ev in events {
                inner.last.seq += 1;
                let id = EventId {
                    epoch: inner.epoch,
                    pos: inner.last,
                };
                inner.entries.push_back(LogEntry {
                    id,
                    event_type: ev.event_type,
                    json: ev.json.clone(),
                });
                ids.push(id);
            }
            if let Some(mark) = producer {
                inner.producers.insert(mark.id, mark.last_seq);
            }
            let now = Instant::now();
            inner.last_append = now;
            inner.retain(retention, candidate, candidate_min_gap, now);
            ids
        };
        // Lock dropped before waking the tail; a batch handed over to the hub is its to fan
        // out, or to wake the tail for (`Tail::wake`).
        if !handed_over {
            log.appended.notify_waiters();
        }
        Ok(ids)
    }

    /// Loses the thread's data as a Redis restarted without persistence would: the thread
    /// comes back empty under a new epoch, and a tail following it reports the discontinuity.
    #[cfg(test)]
    pub(crate) fn lose(&self, thread: &ThreadId) {
        let log = self.thread(thread);
        *log.inner.lock() = ThreadInner::new(Instant::now());
        log.appended.notify_waiters();
    }

    fn thread(&self, thread: &ThreadId) -> Arc<ThreadLog> {
        if let Some(t) = self.shared.threads.get(thread) {
            return t.clone();
        }
        self.shared
            .threads
            .entry(thread.clone())
            .or_insert_with(|| Arc::new(ThreadLog::new()))
            .clone()
    }
}

/// The idle-thread sweeper: every `ttl / 2` (50 ms … 60 s) empties the threads idle for
/// `ttl` and forgets those nothing else holds. Ends when the log is dropped.
async fn sweep(shared: Weak<Shared>, ttl: Duration) {
    let period = (ttl / 2).clamp(Duration::from_millis(50), Duration::from_secs(60));
    loop {
        tokio::time::sleep(period).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        sweep_once(&shared, Instant::now());
    }
}

fn sweep_once(shared: &Shared, now: Instant) {
    let retention = &shared.retention;
    shared.threads.retain(|_, log| {
        let mut inner = log.inner.lock();
        if !inner.idle(retention, now) {
            return true;
        }
        if inner.last != StreamPos::ZERO {
            *inner = ThreadInner::new(now);
            log.appended.notify_waiters();
        }
        // Forgotten when only the map holds it (the map's write lock keeps anyone from cloning
        // it meanwhile); otherwise kept, emptied, under its new epoch.
        Arc::strong_count(log) > 1
    });
}

#[async_trait::async_trait]
impl EventLog for MemoryLog {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn append_checked(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: Option<LogHead>,
        extras: AppendExtras,
    ) -> Result<Vec<EventId>, LogError> {
        self.append_locked(thread, events, expected, extras)
    }

    async fn producer_seq(&self, thread: &ThreadId, producer: &str) -> Result<u64, LogError> {
        let log = self.thread(thread);
        let inner = log.lock(&self.shared.retention);
        Ok(inner.producers.get(producer).copied().unwrap_or(0))
    }

    async fn checkpoint(&self, thread: &ThreadId) -> Result<Option<Checkpoint>, LogError> {
        let log = self.thread(thread);
        let inner = log.lock(&self.shared.retention);
        Ok(inner.checkpoint.clone())
    }

    async fn read(
        &self,
        thread: &ThreadId,
        from: ReadFrom,
        limit: usize,
    ) -> Result<Vec<LogEntry>, LogError> {
        let log = self.thread(thread);
        let inner = log.lock(&self.shared.retention);
        Ok(inner.read(from, limit)?)
    }

    async fn check_resume(&self, thread: &ThreadId, id: EventId) -> Result<ResumeCheck, LogError> {
        let log = self.thread(thread);
        let inner = log.lock(&self.shared.retention);
        Ok(ResumeCheck::new(
            inner.head(),
            id,
            inner.holds(id.pos),
            inner.last_at_or_before(id.pos),
        ))
    }

    async fn head(&self, thread: &ThreadId) -> Result<LogHead, LogError> {
        Ok(self.thread(thread).lock(&self.shared.retention).head())
    }

    async fn ping(&self) -> Result<(), LogError> {
        Ok(())
    }

    /// In id order: the matching threads are collected and sorted (one pass over the map,
    /// then each thread's lock in turn); a thread that never had an event (only looked at, or
    /// expired) is not listed. The cursor's `after` is the last thread looked at.
    async fn list_threads(
        &self,
        prefix: &str,
        cursor: &ListCursor,
        limit: usize,
    ) -> Result<ThreadPage, LogError> {
        let mut candidates: Vec<(ThreadId, Arc<ThreadLog>)> = self
            .shared
            .threads
            .iter()
            .filter(|e| e.key().as_str().starts_with(prefix))
            .filter(|e| cursor.after.as_ref().is_none_or(|after| e.key() > after))
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        candidates.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let limit = limit.clamp(1, super::list::MAX_PAGE);
        let mut threads = Vec::new();
        let mut rest = candidates.iter();
        let mut looked_at: Option<&ThreadId> = None;
        while threads.len() < limit
            && let Some((thread, log)) = rest.next()
        {
            looked_at = Some(thread);
            let summary = log.lock(&self.shared.retention).summary(thread);
            if summary.head.last != StreamPos::ZERO {
                threads.push(summary);
            }
        }
        let next = match (rest.next(), looked_at) {
            (Some(_), Some(after)) => Some(ListCursor {
                shard: 0,
                scan: 0,
                after: Some(after.clone()),
            }),
            _ => None,
        };
        Ok(ThreadPage { threads, next })
    }

    async fn summary(&self, thread: &ThreadId) -> Result<ThreadSummary, LogError> {
        Ok(self
            .thread(thread)
            .lock(&self.shared.retention)
            .summary(thread))
    }

    async fn note_open_run(&self, thread: &ThreadId, active_ms: u64) -> Result<(), LogError> {
        let mut runs = self.shared.open_runs.lock();
        let noted = runs.entry(thread.clone()).or_insert(active_ms);
        *noted = (*noted).max(active_ms);
        Ok(())
    }

    async fn idle_open_runs(
        &self,
        idle_since_ms: u64,
        limit: usize,
    ) -> Result<Vec<(ThreadId, u64)>, LogError> {
        let mut idle: Vec<(ThreadId, u64)> = self
            .shared
            .open_runs
            .lock()
            .iter()
            .filter(|(_, noted)| **noted <= idle_since_ms)
            .map(|(thread, noted)| (thread.clone(), *noted))
            .collect();
        idle.sort_by_key(|(_, noted)| *noted);
        idle.truncate(limit);
        Ok(idle)
    }

    async fn forget_open_run(&self, thread: &ThreadId, active_ms: u64) -> Result<(), LogError> {
        let mut runs = self.shared.open_runs.lock();
        if runs.get(thread) == Some(&active_ms) {
            runs.remove(thread);
        }
        Ok(())
    }

    /// One process holds the log: nothing else appends, nothing acknowledged is lost.
    fn appends_final(&self) -> bool {
        true
    }

    fn start_tail(
        &self,
        sink: mpsc::Sender<TailItem>,
        shutdown: CancellationToken,
    ) -> Arc<dyn Tail> {
        Arc::new(MemoryTail {
            log: self.clone(),
            sink,
            shutdown,
            followers: ThreadMap::default(),
        })
    }
}

/// Follows threads of a [`MemoryLog`]: one light task per followed thread, woken by appends
/// (or by [`Tail::wake`] for those handed over to the hub).
struct MemoryTail {
    log: MemoryLog,
    sink: mpsc::Sender<TailItem>,
    shutdown: CancellationToken,
    followers: ThreadMap<Follower>,
}

/// One follow of a thread.
struct Follower {
    stop: CancellationToken,
    /// Where the hub fanned out by itself ([`Tail::passed`]): the task reads after it.
    passed: Arc<Mutex<Option<EventId>>>,
}

/// Largest batch a tail task hands to the hub at once.
const TAIL_BATCH: usize = 512;

impl Tail for MemoryTail {
    fn follow(&self, thread: ThreadId, epoch: Epoch, after: StreamPos) {
        let stop = self.shutdown.child_token();
        let passed = Arc::new(Mutex::new(None));
        let follower = Follower {
            stop: stop.clone(),
            passed: passed.clone(),
        };
        if let Some(old) = self.followers.insert(thread.clone(), follower) {
            old.stop.cancel();
        }
        let log = self.log.thread(&thread);
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let mut cursor = EventId { epoch, pos: after };
            loop {
                let notified = log.appended.notified();
                tokio::pin!(notified);
                // Register for the wake-up before reading, so an append between the read and
                // the wait is not missed.
                notified.as_mut().enable();
                if let Some(p) = *passed.lock()
                    && p.epoch == cursor.epoch
                    && p.pos > cursor.pos
                {
                    cursor = p;
                }
                let read = {
                    let inner = log.inner.lock();
                    inner
                        .read(ReadFrom::After(cursor), TAIL_BATCH)
                        .map_err(|gap| (gap, inner.head()))
                };
                let item = match read {
                    Ok(entries) if entries.is_empty() => None,
                    Ok(entries) => {
                        cursor = entries.last().map(|e| e.id).unwrap_or(cursor);
                        Some(TailItem::Entries {
                            thread: thread.clone(),
                            entries,
                        })
                    }
                    Err((reason, head)) => {
                        cursor = EventId {
                            epoch: head.epoch,
                            pos: head.last,
                        };
                        Some(TailItem::Discontinuity {
                            thread: thread.clone(),
                            head,
                            reason,
                        })
                    }
                };
                match item {
                    Some(item) => {
                        tokio::select! {
                            biased;
                            _ = stop.cancelled() => return,
                            sent = sink.send(item) => if sent.is_err() { return },
                        }
                    }
                    None => {
                        tokio::select! {
                            biased;
                            _ = stop.cancelled() => return,
                            _ = notified => {}
                        }
                    }
                }
            }
        });
    }

    fn unfollow(&self, thread: &ThreadId) {
        if let Some((_, follower)) = self.followers.remove(thread) {
            follower.stop.cancel();
        }
    }

    fn passed(&self, thread: &ThreadId, id: EventId) {
        if let Some(f) = self.followers.get(thread) {
            let mut passed = f.passed.lock();
            if passed.is_none_or(|p| p.epoch != id.epoch || p.pos < id.pos) {
                *passed = Some(id);
            }
        }
    }

    fn wake(&self, thread: &ThreadId) {
        if let Some(log) = self.log.shared.threads.get(thread) {
            log.appended.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests;
