//! The Redis backend's node-wide tail: the [`Tail`] handle the hub holds, the single reader
//! that follows every thread with local subscribers (append notes when subscribed, `XREAD`
//! otherwise) and the waker that unblocks its `XREAD`. The reader's Redis round trips live in
//! [`reads`]; the module docs of [`super`] ("Tail") say how notes, reads and the fallback
//! combine.

mod cluster;
mod notes;
mod probe;
mod reads;

pub(super) use probe::{NOTE_PREFIX as PROBE_PREFIX, Probe};

use super::conn::Target;
use super::notify::{self, Note, Notice};
use super::{Inner, RedisLogConfig};
use crate::event::ThreadId;
use crate::log::{
    Epoch, EventId, LogEntry, LogError, LogHead, ResumeGap, StreamPos, Tail, TailItem,
};
use crate::metrics::{BACKEND_ERRORS, BACKEND_UP};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// Spawns the node's reader, its subscriber to the append notes and its waker (see
/// [`EventLog::start_tail`](crate::log::EventLog::start_tail) on [`RedisLog`](super::RedisLog)).
pub(super) fn start(
    log: Arc<Inner>,
    sink: mpsc::Sender<TailItem>,
    shutdown: CancellationToken,
) -> Arc<dyn Tail> {
    let shared = Arc::new(TailShared::default());
    let (notice_tx, notice_rx) = mpsc::channel(notify::NOTICE_QUEUE);
    let reader = TailReader {
        log: log.clone(),
        shared: shared.clone(),
        sink,
        shutdown: shutdown.clone(),
        conn: None,
        last_busy_xread: None,
        stream_keys: HashMap::new(),
        keys_generation: 0,
        notices: Some(notice_rx),
        notified: false,
        probe_key: log.probe.key.as_str().into(),
        probe_cursor: StreamPos::new(0, 0),
        poll_at: None,
        scan_at: Instant::now(),
        scan_now: true,
        dirty: HashSet::new(),
        sample_at: Instant::now(),
    };
    tokio::spawn(reader.run());
    let config = &log.config;
    let subscriber = notify::SubscriberConfig {
        channel: log.channel.clone(),
        op_timeout: config.op_timeout,
        ping_every: block_of(config),
    };
    // A reader blocked in its `XREAD` learns of the subscription at once: the waker
    // unblocks it when the generation moves.
    let on_up = {
        let shared = shared.clone();
        move || {
            shared.state.lock().generation += 1;
            shared.waker_wake.notify_one();
        }
    };
    match &log.target {
        Target::Single(client) => {
            tokio::spawn(notify::run_subscriber(
                client.clone(),
                subscriber,
                notice_tx,
                log.probe.clone(),
                shutdown.clone(),
                on_up,
                backoff,
            ));
        }
        // Sharded pub/sub: one subscription per followed thread, on its shard.
        Target::Cluster { notes: client, .. } => {
            let config = notes::NotesConfig {
                client: client.clone(),
                prefix: config.prefix.clone(),
                op_timeout: config.op_timeout,
                resync_every: block_of(config),
            };
            tokio::spawn(notes::run(
                config,
                shared.clone(),
                log.probe.clone(),
                notice_tx,
                shutdown.clone(),
            ));
        }
    }
    tokio::spawn(probe::run(log.clone(), shutdown.clone()));
    tokio::spawn(run_waker(log.clone(), shared.clone(), shutdown));
    Arc::new(RedisTail { shared })
}

/// State shared by the tail's handle ([`RedisTail`]), its reader and its waker.
#[derive(Default)]
struct TailShared {
    state: Mutex<TailState>,
    /// Wakes the reader while it waits with nothing to follow.
    reader_wake: Notify,
    /// Wakes the waker, which then unblocks the reader's `XREAD`.
    waker_wake: Notify,
    /// Wakes the cluster's note subscriber (`notes.rs`) when the follows change.
    notes_wake: Notify,
    /// `CLIENT ID` of the reader's connection; `0` while it has none.
    reader_client_id: AtomicU64,
    /// The [`TailState::generation`] the reader's current `XREAD` was built from.
    seen_generation: AtomicU64,
    /// True while the reader may block in `XREAD` (no append notes): only then does the waker
    /// unblock it.
    blocking: AtomicBool,
}

#[derive(Default)]
struct TailState {
    follows: HashMap<ThreadId, Follow>,
    /// Bumped by every follow and unfollow (and when append notes come up, to wake a blocked
    /// reader); also the version of a new follow.
    generation: u64,
}

#[derive(Clone, Copy, Debug)]
struct Follow {
    /// Distinguishes this follow from an earlier one of the same thread.
    version: u64,
    epoch: Epoch,
    /// Entries strictly after this position are still to be delivered.
    cursor: StreamPos,
    /// When the epoch and position were last checked against the log; `None`: never (a new
    /// follow, or the reader reconnected). Only checked follows are read.
    checked: Option<Instant>,
    /// Set when the thread's keys answered with an error of their own (e.g. `WRONGTYPE`): the
    /// thread is left out of the `XREAD` (which would fail for every thread) and checked again
    /// at this instant.
    retry_at: Option<Instant>,
}

/// The handle the hub holds: follow and unfollow only touch the shared map (never block).
struct RedisTail {
    shared: Arc<TailShared>,
}

impl Tail for RedisTail {
    fn follow(&self, thread: ThreadId, epoch: Epoch, after: StreamPos) {
        {
            let mut state = self.shared.state.lock();
            state.generation += 1;
            let version = state.generation;
            state.follows.insert(
                thread,
                Follow {
                    version,
                    epoch,
                    cursor: after,
                    checked: None,
                    retry_at: None,
                },
            );
        }
        // Lock dropped before notifying.
        self.shared.reader_wake.notify_one();
        self.shared.waker_wake.notify_one();
        self.shared.notes_wake.notify_one();
    }

    fn unfollow(&self, thread: &ThreadId) {
        let removed = {
            let mut state = self.shared.state.lock();
            let removed = state.follows.remove(thread).is_some();
            if removed {
                state.generation += 1;
            }
            removed
        };
        if removed {
            self.shared.notes_wake.notify_one();
        }
    }
}

/// What the reader does after a step.
enum Flow {
    Continue,
    Stop,
}

/// The node's single reader: owns the dedicated connection.
///
/// Two modes, switched by the subscriber's [`Notice`]s:
///
/// - **Notified** (subscribed to the append notes): an append note that continues a follow
///   exactly (same epoch, `prev` equal to the cursor) is delivered as it is, without reading
///   Redis; any other note for a followed thread marks it *dirty*, and dirty threads (and new
///   follows) are read with pipelined read scripts (epoch, head and `XRANGE` after the cursor in
///   one atomic step, then [`check_resumable`](crate::log::check_resumable)). Every `block`, one non-blocking `XREAD` over
///   every followed stream finds what no note announced (producers that `XADD` directly, a
///   note lost with its connection), and quiet threads get their epoch check. Right after
///   subscribing, that `XREAD` runs at once (appends made before the subscription).
/// - **Blocking** (no subscription: at start, or after [`Notice::Down`]): one `XREAD BLOCK`
///   over every followed stream, with a head check of the threads that got entries, as before
///   the notes existed.
///
/// A note is only a hint with a proof of continuity: the stream and the cursor stay the truth,
/// so a lost, late, repeated or foreign note can delay an entry (until the next read) but
/// never lose, repeat or reorder one.
struct TailReader {
    log: Arc<Inner>,
    shared: Arc<TailShared>,
    sink: mpsc::Sender<TailItem>,
    shutdown: CancellationToken,
    conn: Option<reads::ReaderConn>,
    /// When the last `XREAD` that returned entries was sent (see [`xread_interval`]).
    last_busy_xread: Option<Instant>,
    /// Stream key of each followed thread, built once per follow rather than at every
    /// `XREAD` (which names every followed stream); pruned when follows change.
    stream_keys: HashMap<ThreadId, Arc<str>>,
    /// The follow generation `stream_keys` was last pruned at.
    keys_generation: u64,
    /// From the subscriber task; `None` once it has ended.
    notices: Option<mpsc::Receiver<Notice>>,
    /// Subscribed to the append notes (notified mode).
    notified: bool,
    /// The node's probe stream (`probe.rs`), named in every `XREAD`.
    probe_key: Arc<str>,
    /// The last probe entry read back.
    probe_cursor: StreamPos,
    /// Notified mode: when the next non-blocking `XREAD` over every followed stream is due.
    poll_at: Option<Instant>,
    /// Notified mode: when follows are next scanned (epoch checks of quiet threads, broken
    /// threads due for a retry).
    scan_at: Instant,
    /// Notified mode: scan for new follows at the next step.
    scan_now: bool,
    /// Followed threads to read after their cursor (a note did not continue them).
    dirty: HashSet<ThreadId>,
    /// When the followed streams' sizes are next sampled (`reads.rs`, `sample_streams`).
    sample_at: Instant,
}

/// Most dirty threads read in one pipeline.
const DIRTY_BATCH: usize = 256;

/// Most scans of the follows per tail period (notified mode), see `TailReader::scan`.
const SCANS_PER_PERIOD: u32 = 8;
/// Most notices applied before the reader turns to its reads.
const NOTICE_BATCH: usize = 1024;

/// How an append note relates to a follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Continues {
    /// Every entry of the note is at or before the cursor: already delivered.
    Already,
    /// The note's entries from this index on continue the cursor exactly.
    From(usize),
    /// Something may lie between the cursor and the note (or the epoch differs): read.
    Gap,
}

/// Decides whether `note` continues a follow at `cursor` in `epoch`. Exact because a note's
/// entries are the stream's entries right after `note.prev` (the append script adds them and
/// publishes the note atomically, with `prev` its `last-generated-id` before them).
pub(super) fn continues(epoch: Epoch, cursor: StreamPos, note: &Note) -> Continues {
    if note.epoch != epoch {
        return Continues::Gap;
    }
    let Some(&(last, _, _)) = note.entries.last() else {
        return Continues::Already;
    };
    if last <= cursor {
        Continues::Already
    } else if note.prev == cursor {
        Continues::From(0)
    } else if note.prev < cursor
        && let Some(i) = note.entries.iter().position(|(p, _, _)| *p == cursor)
    {
        Continues::From(i + 1)
    } else {
        Continues::Gap
    }
}

/// Least time between two `XREAD`s of a busy tail: 2 µs per followed thread, at most 5 ms.
///
/// Every `XREAD` names every followed stream, so Redis (and this node, building the command)
/// pays per followed thread at every call. While entries keep coming, waiting this long before
/// the next call lets each call return the entries of many threads, so the cost per second
/// stays bounded whatever the thread count, for at most this much added latency (2 ms at
/// 1,000 followed threads). An idle tail blocks in `XREAD` as before and is not delayed.
fn xread_interval(followed: usize) -> Duration {
    Duration::from_micros(2 * followed as u64).min(Duration::from_millis(5))
}

/// How long a thread whose keys answer with an error is left out before it is checked again.
const BROKEN_THREAD_RETRY: Duration = Duration::from_secs(5);

/// Backoff after `failures` consecutive failures: 100 ms doubling up to 5 s, each drawn in
/// `[d/2, d]` so nodes do not reconnect in step.
pub(super) fn backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(100)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(6))
        .min(Duration::from_secs(5));
    base.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

impl TailReader {
    async fn run(mut self) {
        let mut failures: u32 = 0;
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            match self.step().await {
                Ok(Flow::Continue) => failures = 0,
                Ok(Flow::Stop) => return,
                Err(_) if self.shutdown.is_cancelled() => return,
                Err(e) => {
                    self.conn = None;
                    self.shared.reader_client_id.store(0, Ordering::SeqCst);
                    failures = failures.saturating_add(1);
                    let delay = backoff(failures);
                    metrics::counter!(BACKEND_ERRORS, "backend" => "redis", "op" => "tail")
                        .increment(1);
                    metrics::gauge!(BACKEND_UP).set(0.0);
                    tracing::warn!(error = %e, retry_in = ?delay, "redis tail failed; retrying");
                    tokio::select! {
                        biased;
                        _ = self.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// One step: apply the notices that arrived, then one step of the current mode.
    async fn step(&mut self) -> Result<Flow, LogError> {
        if let Flow::Stop = self.take_notices().await {
            return Ok(Flow::Stop);
        }
        if self.conn.is_some() && Instant::now() >= self.sample_at {
            self.sample_at = Instant::now() + sample_every(&self.log.config);
            return self.sample_streams().await;
        }
        // Before the follows are read: a follow made after this sees `blocking` set and is
        // unblocked by the waker, or is seen by this step's snapshot.
        self.shared.blocking.store(!self.notified, Ordering::SeqCst);
        if self.notified {
            self.step_notified().await
        } else {
            self.step_blocking().await
        }
    }

    /// Applies the notices already waiting (at most [`NOTICE_BATCH`]), without waiting.
    async fn take_notices(&mut self) -> Flow {
        for _ in 0..NOTICE_BATCH {
            let Some(rx) = self.notices.as_mut() else {
                return Flow::Continue;
            };
            let notice = match rx.try_recv() {
                Ok(notice) => notice,
                Err(mpsc::error::TryRecvError::Empty) => return Flow::Continue,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.notices = None;
                    self.notified = false;
                    return Flow::Continue;
                }
            };
            if let Flow::Stop = self.apply(notice).await {
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// Applies one notice of the subscriber.
    async fn apply(&mut self, notice: Notice) -> Flow {
        match notice {
            Notice::Up => {
                self.notified = true;
                // Appends made before the subscription were not announced: read everything.
                self.poll_at = Some(Instant::now());
                self.scan_now = true;
                Flow::Continue
            }
            Notice::Down => {
                self.notified = false;
                self.poll_at = None;
                // The blocking `XREAD` reads every followed stream after its cursor.
                self.dirty.clear();
                Flow::Continue
            }
            Notice::Note(note) => self.apply_note(note).await,
        }
    }

    /// Delivers a note's entries when they continue the thread's follow exactly (no read, no
    /// validation: the appending broker validated them); marks the thread dirty when they may
    /// not; ignores notes of threads not followed, not yet checked, or already delivered.
    async fn apply_note(&mut self, note: Note) -> Flow {
        // The slot is reserved before the lock is taken (see `commit`).
        let permit = tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => return Flow::Stop,
            permit = self.sink.reserve() => match permit {
                Ok(permit) => permit,
                Err(_) => return Flow::Stop,
            },
        };
        let mut state = self.shared.state.lock();
        let Some(follow) = state.follows.get_mut(&note.thread) else {
            return Flow::Continue;
        };
        if follow.checked.is_none() {
            // A new follow (its first read covers the note) or a broken thread.
            return Flow::Continue;
        }
        match continues(follow.epoch, follow.cursor, &note) {
            Continues::Already => {}
            Continues::From(i) => {
                let epoch = follow.epoch;
                let entries: Vec<LogEntry> = note
                    .entries
                    .into_iter()
                    .skip(i)
                    .map(|(pos, event_type, json)| LogEntry {
                        id: EventId { epoch, pos },
                        event_type,
                        json,
                    })
                    .collect();
                // Non-empty: `From(i)` means an entry after the cursor exists at `i`.
                if let Some(last) = entries.last() {
                    follow.cursor = last.id.pos;
                    // The note's epoch is the log's, read in the append's script.
                    follow.checked = Some(Instant::now());
                    permit.send(TailItem::Entries {
                        thread: note.thread,
                        entries,
                    });
                }
            }
            Continues::Gap => {
                drop(state);
                self.dirty.insert(note.thread);
            }
        }
        Flow::Continue
    }

    /// Waits for a notice (applied), a new follow, `until`, or shutdown.
    async fn wait(&mut self, until: Option<Instant>) -> Flow {
        let shared = self.shared.clone();
        let shutdown = self.shutdown.clone();
        let sleep = async {
            match until {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let notice = async {
            match self.notices.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let got = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Flow::Stop,
            notice = notice => Some(notice),
            _ = shared.reader_wake.notified() => {
                self.scan_now = true;
                None
            }
            _ = sleep => None,
        };
        match got {
            Some(Some(notice)) => self.apply(notice).await,
            Some(None) => {
                // The subscriber ended (shutdown): stay in blocking mode.
                self.notices = None;
                self.notified = false;
                Flow::Continue
            }
            None => Flow::Continue,
        }
    }

    /// One step in notified mode: scan follows when due, the periodic `XREAD` when due, read
    /// dirty threads, else wait.
    async fn step_notified(&mut self) -> Result<Flow, LogError> {
        // With nothing to follow the reader still reads its probe back every period.
        let idle = self.shared.state.lock().follows.is_empty();
        if idle {
            self.dirty.clear();
        }
        self.connect().await?;
        let period = block_of(&self.log.config);
        let now = Instant::now();
        if !idle && (self.scan_now || now >= self.scan_at) {
            self.scan_now = false;
            if let Flow::Stop = self.scan(now, period).await? {
                return Ok(Flow::Stop);
            }
        }
        if let Some(at) = self.poll_at
            && now >= at
        {
            self.poll_at = Some(now + period);
            let readable: Vec<(ThreadId, Follow)> = {
                let state = self.shared.state.lock();
                state
                    .follows
                    .iter()
                    .filter(|(_, f)| f.checked.is_some())
                    .map(|(t, f)| (t.clone(), *f))
                    .collect()
            };
            // Also the probe's read back, when nothing is followed.
            return self.xread(readable, false).await;
        }
        if !self.dirty.is_empty() {
            return self.read_dirty().await;
        }
        let until = match self.poll_at {
            Some(at) if idle => at,
            Some(at) => at.min(self.scan_at),
            None => self.scan_at,
        };
        Ok(self.wait(Some(until)).await)
    }

    /// Notified mode: new follows (and broken threads due for a retry) become dirty; quiet
    /// threads whose epoch was last checked a `period` ago get the epoch check of [`check`].
    ///
    /// [`check`]: TailReader::check
    async fn scan(&mut self, now: Instant, period: Duration) -> Result<Flow, LogError> {
        let mut known = Vec::new();
        let mut next = now + period;
        let generation = {
            let state = self.shared.state.lock();
            for (thread, f) in &state.follows {
                match (f.checked, f.retry_at) {
                    (None, Some(at)) if now < at => next = next.min(at),
                    (None, _) => {
                        self.dirty.insert(thread.clone());
                    }
                    (Some(at), _) if now.duration_since(at) >= period => {
                        known.push((thread.clone(), *f));
                    }
                    (Some(at), _) => next = next.min(at + period),
                }
            }
            state.generation
        };
        self.shared
            .seen_generation
            .store(generation, Ordering::SeqCst);
        // At most `SCANS_PER_PERIOD` scans per period: each walks every follow, and the
        // thread due first is rarely far ahead of the others (each note delivered re-arms its
        // thread's check), so scanning exactly when it is due walked 1,000 follows per step at
        // 1,000 threads (4% of the node's CPU). An epoch check or a retry is then late by at
        // most `period / SCANS_PER_PERIOD`.
        self.scan_at = next.max(now + period / SCANS_PER_PERIOD);
        if known.is_empty() {
            return Ok(Flow::Continue);
        }
        self.check(known).await
    }

    /// One step in blocking mode: wait for a follow, or check due threads, or `XREAD BLOCK`
    /// once and deliver.
    async fn step_blocking(&mut self) -> Result<Flow, LogError> {
        let (generation, follows) = {
            let state = self.shared.state.lock();
            let follows: Vec<(ThreadId, Follow)> =
                state.follows.iter().map(|(t, f)| (t.clone(), *f)).collect();
            (state.generation, follows)
        };
        self.connect().await?;
        if follows.is_empty() {
            // Only the probe stream: the reader still reads its probe back.
            self.shared
                .seen_generation
                .store(generation, Ordering::SeqCst);
            return self.xread(Vec::new(), true).await;
        }
        let period = self.log.config.block;
        let now = Instant::now();
        let due: Vec<(ThreadId, Follow)> = follows
            .iter()
            .filter(|(_, f)| match f.checked {
                None => f.retry_at.is_none_or(|at| now >= at),
                Some(at) => now.duration_since(at) >= period,
            })
            .cloned()
            .collect();
        if !due.is_empty() {
            return self.check(due).await;
        }
        let next_retry = follows.iter().filter_map(|(_, f)| f.retry_at).min();
        let readable: Vec<(ThreadId, Follow)> = follows
            .into_iter()
            .filter(|(_, f)| f.checked.is_some())
            .collect();
        self.shared
            .seen_generation
            .store(generation, Ordering::SeqCst);
        if readable.is_empty() && next_retry.is_some_and(|at| at < now + period) {
            // Every followed thread is broken, one due for a retry soon: wait for it (or a
            // new follow).
            return Ok(self.wait(next_retry).await);
        }
        self.xread(readable, true).await
    }

    /// Reports a discontinuity and moves the follow strictly after `head.last`.
    async fn discontinuity(
        &mut self,
        thread: ThreadId,
        version: u64,
        head: LogHead,
        reason: ResumeGap,
    ) -> Flow {
        tracing::info!(%thread, reason = reason.as_str(), epoch = %head.epoch, last = %head.last,
            "redis tail discontinuity");
        let item = TailItem::Discontinuity {
            thread: thread.clone(),
            head,
            reason,
        };
        let now = Instant::now();
        self.commit(&thread, version, Some(item), |f| {
            f.epoch = head.epoch;
            f.cursor = head.last;
            f.checked = Some(now);
            f.retry_at = None;
        })
        .await
    }

    /// Applies `update` to the follow of `thread` and sends `item`, both only if the follow is
    /// still the one (`version`) the item was computed for. The send slot is reserved first and
    /// used under the lock, so nothing of a replaced or removed follow is sent after
    /// [`Tail::follow`] / [`Tail::unfollow`] returned.
    async fn commit(
        &self,
        thread: &ThreadId,
        version: u64,
        item: Option<TailItem>,
        update: impl FnOnce(&mut Follow),
    ) -> Flow {
        let permit = match item {
            Some(_) => tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Flow::Stop,
                permit = self.sink.reserve() => match permit {
                    Ok(permit) => Some(permit),
                    // The hub is gone: nobody to deliver to.
                    Err(_) => return Flow::Stop,
                },
            },
            None => None,
        };
        let mut state = self.shared.state.lock();
        if let Some(follow) = state.follows.get_mut(thread)
            && follow.version == version
        {
            update(follow);
            if let (Some(permit), Some(item)) = (permit, item) {
                permit.send(item);
            }
        }
        Flow::Continue
    }

    /// Leaves `thread` out of the reads until [`BROKEN_THREAD_RETRY`] has passed (its keys
    /// answered with an error of their own; the other threads keep flowing).
    fn broken(&self, thread: &ThreadId, version: u64, error: &LogError) {
        metrics::counter!(BACKEND_ERRORS, "backend" => "redis", "op" => "tail").increment(1);
        tracing::warn!(%thread, %error, retry_in = ?BROKEN_THREAD_RETRY,
            "redis tail cannot read this thread's keys");
        let retry_at = Instant::now() + BROKEN_THREAD_RETRY;
        self.update(thread, version, |f| {
            f.checked = None;
            f.retry_at = Some(retry_at);
        });
    }

    /// Applies `update` to the follow of `thread` if it is still `version`.
    fn update(&self, thread: &ThreadId, version: u64, update: impl FnOnce(&mut Follow)) {
        let mut state = self.shared.state.lock();
        if let Some(follow) = state.follows.get_mut(thread)
            && follow.version == version
        {
            update(follow);
        }
    }
}

/// Period of the samples of the followed streams' sizes: ten `block`s, within 1 s … 60 s.
fn sample_every(config: &RedisLogConfig) -> Duration {
    (config.block * 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// The configured block time, at least 1 ms (`BLOCK 0` would wait forever).
fn block_of(config: &RedisLogConfig) -> Duration {
    config.block.max(Duration::from_millis(1))
}

/// Unblocks the reader's `XREAD` (`CLIENT UNBLOCK <id> TIMEOUT`) after a follow, until the
/// reader has rebuilt its `XREAD` from that follow or more. Retries with growing pauses (the
/// reader may have been between two `XREAD`s) and gives up on a Redis error (the reader then
/// reconnects and rebuilds anyway).
async fn run_waker(log: Arc<Inner>, shared: Arc<TailShared>, shutdown: CancellationToken) {
    let max_pause = block_of(&log.config);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = shared.waker_wake.notified() => {}
        }
        let mut pause = Duration::from_millis(5);
        loop {
            let wanted = shared.state.lock().generation;
            if shared.seen_generation.load(Ordering::SeqCst) >= wanted {
                break;
            }
            let id = shared.reader_client_id.load(Ordering::SeqCst);
            // A reader that does not block (notified mode) is woken by `reader_wake`.
            if id == 0 || !shared.blocking.load(Ordering::SeqCst) {
                break;
            }
            let mut conn = log.conn.clone();
            let mut cmd = redis::cmd("CLIENT");
            cmd.arg("UNBLOCK").arg(id).arg("TIMEOUT");
            let unblock = cmd.query_async::<i64>(&mut conn);
            let sent = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                sent = tokio::time::timeout(log.config.op_timeout, unblock) => sent,
            };
            if !matches!(sent, Ok(Ok(_))) {
                break;
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(max_pause);
        }
    }
}
