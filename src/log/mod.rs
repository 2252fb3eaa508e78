//! The per-thread, totally ordered event log (PROTOCOL §1, §4, §6), behind one trait with two
//! backends: [`memory`] (embedded default, one node) and [`redis`] (Redis Streams, many nodes).
//!
//! Data path position: `ingest` → **`log`** → `hub`. The log assigns [`EventId`]s at append and
//! offers two ways out: [`EventLog::read`] (pages, read when a subscriber resumes) and a
//! node-wide [`Tail`] that follows every thread with local subscribers and reads each of them
//! **once** per node, whatever the number of subscribers (PROTOCOL §7).
//!
//! This file owns what both backends share: the ids (defined in `id`, re-exported here), the
//! trait (whose provided [`EventLog::append`] and [`EventLog::append_if`] go through each
//! backend's [`EventLog::append_checked`]), retention settings and `check_resumable`, the one
//! rule for whether a read after an id is exact.

mod id;
pub mod list;
pub mod memory;
pub mod redis;

pub use id::{Epoch, EventId, IdParseError, IdText, ResumeId, StreamPos};
pub use list::{ListCursor, RunState, ThreadPage, ThreadSummary};

use crate::event::{EventType, ThreadId, ValidEvent};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One appended event as read back from the log.
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    /// The id assigned at append.
    pub id: EventId,
    /// The AG-UI `type` (saves downstream stages from parsing `json`).
    pub event_type: EventType,
    /// Compact one-line JSON of the event, exactly as validated at publish.
    pub json: Bytes,
}

/// Where a [`EventLog::read`] starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// From the first retained entry of the current epoch.
    Start,
    /// Strictly after this id, which must be resumable (same epoch, nothing after it trimmed,
    /// not ahead of the log, an entry the log holds or the trimmed bound: `check_resumable`).
    After(EventId),
}

/// The state of a thread log's ends, for starting a subscription or a tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHead {
    /// Current epoch (a thread that never had an event still has one).
    pub epoch: Epoch,
    /// Position of the newest entry ever appended in this epoch (`StreamPos::ZERO` if none).
    pub last: StreamPos,
    /// Highest position ever removed by trimming (`StreamPos::ZERO` if nothing was trimmed):
    /// a resume after `p` is exact only when `p >= max_deleted` (Redis 7 `max-deleted-entry-id`).
    pub max_deleted: StreamPos,
}

impl LogHead {
    /// True when the retained log still holds the thread's first event (PROTOCOL §2 `?from=start`).
    pub fn complete_from_start(&self) -> bool {
        self.max_deleted == StreamPos::ZERO
    }

    /// The id of the newest event, if any.
    pub fn last_id(&self) -> Option<EventId> {
        (self.last != StreamPos::ZERO).then_some(EventId {
            epoch: self.epoch,
            pos: self.last,
        })
    }
}

/// How much of each thread's log is retained (PROTOCOL §6).
///
/// Two ways of trimming work together:
///
/// - **Checkpoints** (the normal path): the publish path hands [`EventLog::append_if`] a
///   checkpoint *candidate* about every `max_events` appended events. The log keeps it as the
///   thread's *pending* checkpoint; the next candidate promotes it to the thread's
///   [`Checkpoint`] and every entry at or before its position is trimmed, exactly. So about
///   `max_events`..`2 * max_events` events stay, and the thread's fold can always be rebuilt
///   from the checkpoint and the entries after it, however much was trimmed.
/// - **Count cap** (a memory safety net): every append caps the log at about `max_events`
///   entries (Redis: `XADD … MAXLEN ~`), or at [`Retention::safety_cap`] (`4 * max_events`)
///   once the thread has a checkpoint or a pending one, so checkpoint-based trimming is not
///   pre-empted, while producers that never send candidates (direct `XADD` producers, the
///   non-strict publish path) still have a bounded log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Keep about this many newest events per thread (Redis: `XADD … MAXLEN ~`, so the actual
    /// count may exceed it by up to one macro node). `0` means unbounded (no count cap; a
    /// promoted checkpoint still trims up to its position).
    pub max_events: usize,
    /// Drop events older than this, at checkpoint granularity: at append time, when the
    /// thread's pending checkpoint is older than `max_age` (its newest entry was appended
    /// more than `max_age` ago; Redis: the entry ID's milliseconds against the server's
    /// `TIME`), it is promoted early and every entry at or before it is trimmed. Entries after
    /// the newest checkpoint are never trimmed for age (the fold stays rebuildable), so a
    /// thread without checkpoints is not trimmed for age at all. `None`: no age limit.
    pub max_age: Option<Duration>,
    /// Expiry of idle threads: a thread with no append for this long is dropped whole (log,
    /// epoch, checkpoints) and comes back, if written again, under a new epoch. Redis:
    /// `PEXPIRE` of all the thread's keys at every append; memory: see
    /// [`memory::MemoryLog`]. `None`: threads never expire.
    pub idle_ttl: Option<Duration>,
}

impl Retention {
    /// The count cap while a thread uses checkpoints: `4 * max_events` (`0`: unbounded).
    pub fn safety_cap(&self) -> usize {
        self.max_events.saturating_mul(4)
    }

    /// The count cap of one append: [`Retention::safety_cap`] when the thread has a
    /// checkpoint, a pending one, or gets a candidate with this append, else `max_events`
    /// (`0`: no cap).
    pub fn cap(&self, checkpoints_in_use: bool) -> usize {
        if checkpoints_in_use {
            self.safety_cap()
        } else {
            self.max_events
        }
    }

    /// `max_age` in whole milliseconds, `0` when unset or zero (no age trimming).
    pub fn max_age_ms(&self) -> u64 {
        duration_ms(self.max_age)
    }

    /// `idle_ttl` in whole milliseconds (at least 1 when set and non-zero), `0` when unset
    /// or zero (no expiry).
    pub fn idle_ttl_ms(&self) -> u64 {
        duration_ms(self.idle_ttl)
    }
}

/// A duration in whole milliseconds, rounded up so a non-zero duration is never `0`;
/// `None` and zero give `0` ("disabled").
fn duration_ms(d: Option<Duration>) -> u64 {
    match d {
        Some(d) if !d.is_zero() => u64::try_from(d.as_millis().max(1)).unwrap_or(u64::MAX),
        _ => 0,
    }
}

impl Default for Retention {
    /// 10 000 events, no age limit, idle threads expire after 7 days.
    fn default() -> Self {
        Retention {
            max_events: 10_000,
            max_age: None,
            idle_ttl: Some(Duration::from_secs(7 * 24 * 3600)),
        }
    }
}

/// A thread's checkpoint (PROTOCOL §6): its fold at `pos`, restated as AG-UI events.
///
/// `events` is an opaque JSON array of AG-UI events (the prelude of the thread's fold at
/// `pos`, `crate::fold::prelude::prelude`); the log stores and returns it byte for byte and never
/// interprets it. Folding `events` and then the log entries strictly after `pos` gives the
/// thread's fold. Every entry at or before `pos` may have been trimmed; the entries after it
/// are retained (unless the count safety cap cut in, see [`Retention`]), so
/// `read(ReadFrom::After(<epoch>-<pos>))` is exact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Position of the last entry the checkpoint covers, in the thread's current epoch.
    pub pos: StreamPos,
    /// JSON array of AG-UI events (opaque to the log).
    pub events: Bytes,
}

/// Why an id cannot be resumed exactly (each case gets a prelude in PROTOCOL §4.3; counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResumeGap {
    /// The id belongs to another epoch of the thread's log.
    #[error("event id is from another epoch of this thread's log")]
    OtherEpoch,
    /// Events after the id were trimmed away.
    #[error("events after this id were trimmed")]
    Trimmed,
    /// The id is ahead of the newest event.
    #[error("event id is ahead of the log")]
    Ahead,
    /// The id is within the log's range, but the log holds no entry with it: a position the
    /// log never had (a tail a failover rolled back, after which the log grew past it, or an
    /// id it never issued). Treated as a rollback (PROTOCOL §4.3).
    #[error("the log holds no entry with this id")]
    Unknown,
    /// The id marks a position inside a reset bridge ([`ResumeId::InsideBridge`]): what the
    /// client applied of the bridge is unknown.
    #[error("event id marks a position inside a reset bridge")]
    InsideBridge,
}

impl ResumeGap {
    /// Metric label (`agui_resumes_total{outcome}`).
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeGap::OtherEpoch => "epoch",
            ResumeGap::Trimmed => "trimmed",
            ResumeGap::Ahead => "ahead",
            ResumeGap::Unknown => "unknown",
            ResumeGap::InsideBridge => "bridge",
        }
    }
}

/// Decides whether reading strictly after `id` is exact for a log with `head` (both backends'
/// reads and tails). `held`: the log holds an entry at exactly `id.pos` (the backend looks;
/// the check costs one lookup per resume or tail check, never one per event).
///
/// Exact means: the same epoch, not ahead of `head.last`, nothing after it trimmed, and the
/// position is one the log holds, or the trimmed bound itself (`head.max_deleted`, `0-0` on a
/// log trimmed of nothing: a checkpoint's position, or the start). A position inside the
/// log's range that it does not hold is one it never had: after a failover that lost the
/// primary's last entries (same epoch, the meta hash was replicated), a client's or a tail's
/// position in the lost part lies below the new entries once the log grew past it, and
/// reading after it would skip nothing yet continue a history the log does not have.
///
/// # Errors
/// The [`ResumeGap`] that makes it inexact: another epoch, ahead of `head.last`, before
/// `head.max_deleted`, or a position the log does not hold.
pub(crate) fn check_resumable(head: &LogHead, id: EventId, held: bool) -> Result<(), ResumeGap> {
    if id.epoch != head.epoch {
        Err(ResumeGap::OtherEpoch)
    } else if id.pos > head.last {
        Err(ResumeGap::Ahead)
    } else if id.pos < head.max_deleted {
        Err(ResumeGap::Trimmed)
    } else if id.pos != head.max_deleted && !held {
        Err(ResumeGap::Unknown)
    } else {
        Ok(())
    }
}

/// The log's answer to "can a stream resume exactly after this id?" ([`EventLog::check_resume`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumeCheck {
    /// The log's head when it answered.
    pub head: LogHead,
    /// `Ok` when reading strictly after the id is exact; otherwise why not
    /// (`check_resumable`'s rule).
    pub verdict: Result<(), ResumeGap>,
    /// Where the id's history and the log's part, when the verdict is [`ResumeGap::Unknown`]
    /// or [`ResumeGap::Ahead`] (a tail a failover rolled back, in the log's epoch): the
    /// position of the last entry the log holds at or before the id, or the trimmed bound
    /// (`head.max_deleted`; `0-0`: the log's start) when it holds none. Everything after it
    /// is history the id's holder never had (PROTOCOL §4.3). `None` for other verdicts.
    pub fork: Option<StreamPos>,
}

impl ResumeCheck {
    /// The check of `id` against a log with `head` (`check_resumable`): `held` as there,
    /// `before` the position of the last entry the log holds at or before `id` (if any), which
    /// becomes [`ResumeCheck::fork`] for a rolled-back id.
    pub(crate) fn new(head: LogHead, id: EventId, held: bool, before: Option<StreamPos>) -> Self {
        let verdict = check_resumable(&head, id, held);
        let fork = matches!(verdict, Err(ResumeGap::Unknown | ResumeGap::Ahead))
            .then(|| before.unwrap_or(head.max_deleted).max(head.max_deleted));
        ResumeCheck {
            head,
            verdict,
            fork,
        }
    }
}

/// Errors of a log backend.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LogError {
    /// The backend cannot be reached or answered with an error; retry later (HTTP 503).
    #[error("log backend unavailable: {0}")]
    Unavailable(String),
    /// A read asked for a position that cannot be resumed exactly.
    #[error(transparent)]
    Gap(#[from] ResumeGap),
    /// A conditional append found the log elsewhere than expected; nothing was appended.
    #[error("the log moved: its head is now {0:?}")]
    Conflict(LogHead),
    /// An append was sent but its reply was lost (a timeout, a dropped connection), and
    /// asking the backend afterwards (within its bound) did not settle whether it ran: the
    /// events may be in the log or not (HTTP 503 `append_outcome_unknown`; PROTOCOL §2).
    /// Only appends return it; only a retry that is deduplicated (a producer mark) is safe.
    #[error("the append's outcome is unknown: {0}")]
    OutcomeUnknown(String),
}

/// What [`EventLog::append_if`] stores besides the events, in the same atomic step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AppendExtras {
    /// A checkpoint candidate (see [`EventLog::append_if`]).
    pub candidate: Option<Bytes>,
    /// The candidate is dropped (neither stored nor promoting the pending checkpoint) when
    /// the pending checkpoint is fewer than this many entries old (`0`: never dropped). Why:
    /// every node publishing to a thread sends candidates at its own count of the thread's
    /// events, about together; promoting on each would trim the retained log to a few
    /// entries. The publish path passes `retention.max_events`, so promotions stay at least
    /// that far apart.
    pub candidate_min_gap: u64,
    /// The producer's number of the batch's last event, recorded so that a retried batch is
    /// recognised (PROTOCOL §2 idempotent retries).
    pub producer: Option<ProducerMark>,
    /// The caller hands the batch to this node's hub right after ([`LocalAppends`], with `on`
    /// given), which fans it out itself or wakes the [`Tail`] ([`Tail::wake`]): a log whose
    /// appends are final then does not wake its tail for it. Ignored by Redis.
    pub handed_over: bool,
}

/// A producer's position on a thread: `X-Producer-Id` and the number of its last appended
/// event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerMark {
    /// The producer id (1–128 chars of `[A-Za-z0-9._:-]`, like a thread id).
    pub id: String,
    /// Number of the last event of the batch.
    pub last_seq: u64,
}

impl From<Option<Bytes>> for AppendExtras {
    fn from(candidate: Option<Bytes>) -> Self {
        AppendExtras {
            candidate,
            candidate_min_gap: 0,
            producer: None,
            handed_over: false,
        }
    }
}

/// What a [`Tail`] reports to the hub.
#[derive(Clone, Debug)]
pub enum TailItem {
    /// New entries of a followed thread, in log order, each strictly after the previous batch.
    Entries {
        /// The thread.
        thread: ThreadId,
        /// One or more entries.
        entries: Vec<LogEntry>,
    },
    /// The tail could not continue exactly where it was (the log was recreated under a new
    /// epoch, or trimmed past the tail's position). It continues strictly after `head.last`;
    /// the hub must not pretend the stream it fans out is continuous across this point.
    Discontinuity {
        /// The thread.
        thread: ThreadId,
        /// The log's head when the tail noticed; the tail follows strictly after `head.last`.
        head: LogHead,
        /// What broke continuity.
        reason: ResumeGap,
    },
}

/// Told of every batch this node appended, with the values validation parsed. The publish
/// path (`ingest`) calls it after each successful append, before answering the publisher; it
/// must not block. The hub fans a batch out at once when it directly follows what the hub
/// fanned out (`on`), else keeps the values so that its fan-out does not parse the same events
/// again when the [`Tail`] brings them back (`hub/ahead.rs`).
pub trait LocalAppends: Send + Sync + 'static {
    /// `events` were appended to `thread` with `ids` (in order, one each). `on`: the head the
    /// batch was appended right after (no entry between), given only when the log's
    /// acknowledged appends are final ([`EventLog::appends_final`]) and the append was
    /// [`AppendExtras::handed_over`]: the log did not wake its tail, so the hub fans the batch
    /// out ([`Tail::passed`]) or wakes the tail ([`Tail::wake`]).
    fn appended(
        &self,
        thread: &ThreadId,
        on: Option<LogHead>,
        ids: &[EventId],
        events: &[ValidEvent],
    );
}

/// The node-wide follower of thread logs. Cheap to call from any task; never blocks.
pub trait Tail: Send + Sync + 'static {
    /// Starts following `thread` strictly after `after` in `epoch`; replaces any earlier follow.
    fn follow(&self, thread: ThreadId, epoch: Epoch, after: StreamPos);
    /// Stops following `thread` (no more [`TailItem`]s for it after a short while).
    fn unfollow(&self, thread: &ThreadId);
    /// The hub fanned `thread` out through `id` by itself (a [`LocalAppends`] batch): the tail
    /// need not bring those entries back. A hint; no-op by default.
    fn passed(&self, _thread: &ThreadId, _id: EventId) {}
    /// Looks for new entries of `thread` now: a [`AppendExtras::handed_over`] append the hub
    /// did not fan out itself. No-op by default (a tail that wakes on its own).
    fn wake(&self, _thread: &ThreadId) {}
}

/// A thread log backend. All methods are cancel-safe with respect to the log's content: an
/// append is either wholly in the log or not at all.
#[async_trait::async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Backend name for logs and metrics (`"memory"` or `"redis"`).
    fn name(&self) -> &'static str;

    /// The append both [`EventLog::append`] and [`EventLog::append_if`] go through (backends
    /// implement this one): `events` atomically (all or nothing), on `expected` when given,
    /// with `extras` in the same step. Callers use `append` or `append_if`.
    ///
    /// # Errors
    /// As [`EventLog::append_if`] (no [`LogError::Conflict`] without `expected`).
    async fn append_checked(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: Option<LogHead>,
        extras: AppendExtras,
    ) -> Result<Vec<EventId>, LogError>;

    /// Appends `events` atomically (all or nothing) and returns their ids, in order.
    /// An empty batch appends nothing and returns no ids (and costs no backend call).
    /// When the backend's reply is lost, the backend settles what happened before returning
    /// (the ids if it ran, else it makes sure it never runs).
    ///
    /// # Errors
    /// [`LogError::Unavailable`] when the backend cannot be reached; nothing was appended.
    /// [`LogError::OutcomeUnknown`] when the reply was lost and what happened could not be
    /// settled: the events may or may not be in the log.
    async fn append(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
    ) -> Result<Vec<EventId>, LogError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.append_checked(thread, events, None, AppendExtras::default())
            .await
    }

    /// Like [`EventLog::append`], but only if the log's epoch and last position are still
    /// `expected` (compare-and-append): the caller checked the batch against the thread's fold
    /// at that position, so an append on top of anything else could break the order rules.
    ///
    /// `candidate` (retention, PROTOCOL §6; see [`Retention`]): the thread's fold after this batch,
    /// as a [`Checkpoint::events`] JSON array. When given and the batch is not empty, in the
    /// same atomic step as the append: a pending checkpoint stored earlier is promoted to the
    /// thread's [`Checkpoint`] and every entry at or before its position is trimmed (exactly),
    /// then the candidate becomes the pending checkpoint at the batch's last entry. `None`
    /// leaves checkpoints as they are. Nothing changes on a conflict or an empty batch.
    ///
    /// # Errors
    /// [`LogError::Conflict`] with the current head when the log moved (nothing appended; the
    /// caller catches up and retries); [`LogError::Unavailable`] and
    /// [`LogError::OutcomeUnknown`] as for `append`.
    async fn append_if(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: LogHead,
        extras: AppendExtras,
    ) -> Result<Vec<EventId>, LogError> {
        self.append_checked(thread, events, Some(expected), extras)
            .await
    }

    /// The last event number appended for `producer` on this thread (PROTOCOL §2 idempotent
    /// retries, `X-Producer-Id` / `X-Producer-Seq`); `0` when none in the current epoch.
    ///
    /// # Errors
    /// [`LogError::Unavailable`].
    async fn producer_seq(&self, thread: &ThreadId, producer: &str) -> Result<u64, LogError>;

    /// The thread's promoted checkpoint in its current epoch (`None` when there is none: no
    /// candidate was promoted yet, or the thread expired or got a new epoch since). Rebuild a
    /// fold as: `head`, `checkpoint`, fold [`Checkpoint::events`], then `read` strictly after
    /// `<head.epoch>-<pos>` (a [`LogError::Gap`] there means the log moved on in between:
    /// start again).
    ///
    /// # Errors
    /// [`LogError::Unavailable`] when the backend cannot be reached.
    async fn checkpoint(&self, thread: &ThreadId) -> Result<Option<Checkpoint>, LogError>;

    /// Up to `limit` entries in log order, starting as `from` says.
    ///
    /// # Errors
    /// [`LogError::Gap`] when `from` is an id that cannot be resumed exactly;
    /// [`LogError::Unavailable`] when the backend cannot be reached.
    async fn read(
        &self,
        thread: &ThreadId,
        from: ReadFrom,
        limit: usize,
    ) -> Result<Vec<LogEntry>, LogError>;

    /// The log's head and its verdict on resuming strictly after `id`, in one step (one round
    /// trip): the same rule as [`EventLog::read`] applies (`check_resumable`), including the
    /// lookup of the entry at `id` itself. Run once per resume, never per event.
    ///
    /// # Errors
    /// [`LogError::Unavailable`] when the backend cannot be reached.
    async fn check_resume(&self, thread: &ThreadId, id: EventId) -> Result<ResumeCheck, LogError>;

    /// The thread's current [`LogHead`] (creating its epoch if the thread is new).
    ///
    /// # Errors
    /// [`LogError::Unavailable`] when the backend cannot be reached.
    async fn head(&self, thread: &ThreadId) -> Result<LogHead, LogError>;

    /// A page of the threads whose log holds or held an event, whose id starts with `prefix`
    /// (empty: every thread), from `cursor` on ([`ListCursor::default`]: the first page), with
    /// at most `limit` threads (1 to [`list::MAX_PAGE`]), each summarised as by
    /// [`EventLog::summary`] (admin API, PROTOCOL §12). Off the hot path: Redis walks the
    /// keyspace with `SCAN … MATCH <prefix>:{<thread prefix>*}:log TYPE stream`, so a thread
    /// present during the whole walk is listed at least once, and may be listed twice when
    /// the keyspace is resized meanwhile (`SCAN`'s guarantee); the memory log lists in id
    /// order.
    ///
    /// # Errors
    /// [`LogError::Unavailable`].
    async fn list_threads(
        &self,
        prefix: &str,
        cursor: &ListCursor,
        limit: usize,
    ) -> Result<ThreadPage, LogError>;

    /// The thread's head, how many entries its log retains and its newest entry, in one step
    /// (Redis: one script), without folding anything.
    ///
    /// # Errors
    /// [`LogError::Unavailable`].
    async fn summary(&self, thread: &ThreadId) -> Result<ThreadSummary, LogError>;

    /// Answers when the backend is reachable (readiness, PROTOCOL §2 `/readyz`).
    ///
    /// # Errors
    /// [`LogError::Unavailable`] otherwise.
    async fn ping(&self) -> Result<(), LogError>;

    /// Records that `thread` may hold an open run, last known active at `active_ms`
    /// (milliseconds since the Unix epoch, the noting node's clock): the registry every node's
    /// orphan sweep reads (PROTOCOL §2 "Orphaned runs"). A later time replaces an earlier
    /// one, never the reverse. The default does nothing (a backend without the registry has
    /// no orphan sweep); both real backends keep it.
    ///
    /// # Errors
    /// [`LogError::Unavailable`].
    async fn note_open_run(&self, thread: &ThreadId, active_ms: u64) -> Result<(), LogError> {
        let _ = (thread, active_ms);
        Ok(())
    }

    /// Up to `limit` threads of the registry ([`EventLog::note_open_run`]) whose noted time is
    /// at or before `idle_since_ms`, oldest first, each with its noted time.
    ///
    /// # Errors
    /// [`LogError::Unavailable`].
    async fn idle_open_runs(
        &self,
        idle_since_ms: u64,
        limit: usize,
    ) -> Result<Vec<(ThreadId, u64)>, LogError> {
        let _ = (idle_since_ms, limit);
        Ok(Vec::new())
    }

    /// Removes `thread` from the registry if its noted time is still `active_ms` (atomically:
    /// a run noted meanwhile stays registered).
    ///
    /// # Errors
    /// [`LogError::Unavailable`].
    async fn forget_open_run(&self, thread: &ThreadId, active_ms: u64) -> Result<(), LogError> {
        let _ = (thread, active_ms);
        Ok(())
    }

    /// Whether every append goes through this node and an acknowledged append is never rolled
    /// back (the memory log): then this node's hub may fan a batch out straight from the
    /// publish that appended it, ahead of the [`Tail`]. `false` for Redis: another node may
    /// append, and a failover may lose an acknowledged tail, which only the tail's own reading
    /// notices (PROTOCOL §5).
    fn appends_final(&self) -> bool {
        false
    }

    /// Starts the node's tail: followed threads' new entries go to `sink` in log order until
    /// `shutdown` is cancelled. Called once per node by the hub.
    fn start_tail(
        &self,
        sink: mpsc::Sender<TailItem>,
        shutdown: CancellationToken,
    ) -> Arc<dyn Tail>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_id_round_trip_and_rejects() {
        let id = EventId {
            epoch: Epoch(0x0a1b2c3d),
            pos: StreamPos::new(1764500000000, 7),
        };
        assert_eq!(id.to_string(), "0a1b2c3d-1764500000000-7");
        assert_eq!("0a1b2c3d-1764500000000-7".parse::<EventId>(), Ok(id));
        for bad in [
            "",
            "x",
            "0a1b2c3d",
            "0a1b2c3d-1",
            "0a1b2c3d-1-",
            "0a1b2c3-1-1",
            "0a1b2c3d-+1-1",
            "zzzzzzzz-1-1",
            " 0a1b2c3d-1-1",
            "0a1b2c3d-1-1-1",
            "0a1b2c3d-99999999999999999999-1",
        ] {
            assert_eq!(bad.parse::<EventId>(), Err(IdParseError), "{bad:?}");
        }
    }

    #[test]
    fn id_text_is_the_display_form_at_the_extremes() {
        for (epoch, ms, seq) in [
            (0, 0, 0),
            (0x0000_00ff, 1, 10),
            (0xdead_beef, 1764500000000, 7),
            (u32::MAX, u64::MAX, u64::MAX),
        ] {
            let id = EventId {
                epoch: Epoch(epoch),
                pos: StreamPos::new(ms, seq),
            };
            let expected = format!("{epoch:08x}-{ms}-{seq}");
            assert_eq!(id.text().as_str(), expected);
            assert_eq!(id.to_string(), expected);
            assert_eq!(id.pos.to_string(), format!("{ms}-{seq}"));
            assert_eq!(id.epoch.to_string(), format!("{epoch:08x}"));
            assert_eq!(expected.parse::<EventId>(), Ok(id));
        }
    }

    #[test]
    fn resume_ids_round_trip_and_reject() {
        let id = EventId {
            epoch: Epoch(0x0a1b2c3d),
            pos: StreamPos::new(0, 7),
        };
        assert_eq!(ResumeId::Event(id).to_string(), "0a1b2c3d-0-7");
        assert_eq!(
            ResumeId::InsideBridge(id).to_string(),
            "0a1b2c3d-0-7-bridge"
        );
        for r in [ResumeId::Event(id), ResumeId::InsideBridge(id)] {
            assert_eq!(r.to_string().parse::<ResumeId>(), Ok(r));
        }
        for bad in [
            "-bridge",
            "0a1b2c3d-0-bridge",
            "0a1b2c3d-0-7-bridge-bridge",
            "0a1b2c3d-0-7-Bridge",
            "0a1b2c3d-0-7bridge",
        ] {
            assert_eq!(bad.parse::<ResumeId>(), Err(IdParseError), "{bad:?}");
        }
    }

    /// A position inside the log's range that the log does not hold is a rollback, not an
    /// exact resume; the trimmed bound itself (a checkpoint's position, `0-0`) needs no entry.
    #[test]
    fn resumable_needs_the_entry_or_the_trimmed_bound() {
        let head = LogHead {
            epoch: Epoch(7),
            last: StreamPos::new(50, 0),
            max_deleted: StreamPos::new(10, 0),
        };
        let at = |ms| EventId {
            epoch: Epoch(7),
            pos: StreamPos::new(ms, 0),
        };
        assert_eq!(check_resumable(&head, at(20), true), Ok(()));
        assert_eq!(
            check_resumable(&head, at(20), false),
            Err(ResumeGap::Unknown)
        );
        assert_eq!(check_resumable(&head, at(10), false), Ok(()), "the bound");
        assert_eq!(
            check_resumable(&head, at(9), false),
            Err(ResumeGap::Trimmed)
        );
        assert_eq!(check_resumable(&head, at(51), false), Err(ResumeGap::Ahead));
        let other = EventId {
            epoch: Epoch(8),
            pos: StreamPos::new(20, 0),
        };
        assert_eq!(
            check_resumable(&head, other, true),
            Err(ResumeGap::OtherEpoch)
        );
        let untrimmed = LogHead {
            max_deleted: StreamPos::ZERO,
            ..head
        };
        assert_eq!(check_resumable(&untrimmed, at(0), false), Ok(()), "0-0");
    }

    /// A rolled-back id (unknown, or ahead in the log's epoch) forks at the last entry the log
    /// holds before it, else at the trimmed bound; other verdicts have no fork.
    #[test]
    fn a_rolled_back_id_forks_at_the_last_entry_before_it() {
        let head = LogHead {
            epoch: Epoch(7),
            last: StreamPos::new(50, 0),
            max_deleted: StreamPos::new(10, 0),
        };
        let at = |ms| EventId {
            epoch: Epoch(7),
            pos: StreamPos::new(ms, 0),
        };
        let before = Some(StreamPos::new(18, 0));
        let check = ResumeCheck::new(head, at(20), false, before);
        assert_eq!(check.verdict, Err(ResumeGap::Unknown));
        assert_eq!(check.fork, before);
        let none_before = ResumeCheck::new(head, at(20), false, None);
        assert_eq!(
            none_before.fork,
            Some(head.max_deleted),
            "the trimmed bound"
        );
        let ahead = ResumeCheck::new(head, at(60), false, Some(head.last));
        assert_eq!(
            (ahead.verdict, ahead.fork),
            (Err(ResumeGap::Ahead), Some(head.last))
        );
        assert_eq!(ResumeCheck::new(head, at(20), true, before).fork, None);
        assert_eq!(ResumeCheck::new(head, at(5), false, None).fork, None);
        let other = EventId {
            epoch: Epoch(8),
            pos: StreamPos::new(20, 0),
        };
        assert_eq!(ResumeCheck::new(head, other, false, before).fork, None);
    }

    #[test]
    fn positions_order_like_entry_ids() {
        assert!(StreamPos::new(1, 9) < StreamPos::new(2, 0));
        assert!(StreamPos::new(2, 0) < StreamPos::new(2, 1));
        assert!(StreamPos::ZERO < StreamPos::new(0, 1));
    }
}
