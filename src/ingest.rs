//! The publish pipeline after schema validation (PROTOCOL §2): order validation against the
//! thread's fold at the **latest** log position, then a compare-and-append, so that several
//! nodes publishing to one thread can never interleave into an invalid sequence.
//!
//! Data path position: `http` → `event` (schema) → **`ingest`** (order rules) → `log`.
//!
//! Per thread, a node caches the fold at the position it last saw (`LogHead`). A publish
//! catches the fold up with whatever other nodes appended, checks the batch on a copy
//! ([`ThreadFold::check_batch`]: `@ag-ui/client` order rules, then `STATE_DELTA`
//! applicability), and appends with [`EventLog::append_if`] on that position. If another
//! node appended in between, the append is refused (nothing written), the fold catches up and
//! the batch is checked again. Every `retention.max_events` appended events it hands the log a
//! checkpoint candidate: the prelude of the fold after the batch (PROTOCOL §6). With order
//! validation off, batches are folded without being checked, for those candidates.
//!
//! `orphans` (`src/ingest/orphans.rs`): the orphan sweep, the broker's own append of a
//! `RUN_ERROR` to a run whose producer went silent (`runs.orphan_timeout`); with it on, a
//! batch holding a `RUN_STARTED` first notes its thread in the log's open-run registry.

mod orphans;

use crate::event::ThreadMap;
use crate::event::{ThreadId, ValidEvent};
use crate::fold::prelude;
use crate::fold::{OrderAfter, Rejection, ThreadFold, catch_up, load_fold};
use crate::log::{
    AppendExtras, EventId, EventLog, IdText, LocalAppends, LogError, LogHead, ProducerMark,
};
use crate::queue::QueueLimits;
use crate::queue::coalesce::merged_count;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Compare-and-append attempts before a publish gives up (503, retry): each failed attempt
/// means another node appended to the thread meanwhile.
const MAX_ATTEMPTS: usize = 32;
/// Threads whose cached fold was not used for this long are dropped from the cache when it
/// grows beyond [`CACHE_SOFT_LIMIT`] entries.
const CACHE_IDLE: Duration = Duration::from_secs(300);
/// Cache size above which idle threads are dropped.
const CACHE_SOFT_LIMIT: usize = 10_000;

/// `X-Producer-Id` and `X-Producer-Seq` of a publish: the producer's number of the batch's
/// first event (events numbered consecutively), PROTOCOL §2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Producer {
    /// The producer id.
    pub id: String,
    /// Number of the batch's first event.
    pub seq: u64,
}

/// What a publish appended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Appended {
    /// Ids of the events appended now, in order.
    pub ids: Vec<EventId>,
    /// Leading events of the batch skipped because their producer had appended them before.
    pub duplicates: usize,
}

/// Why a publish was not appended.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The batch breaks an order rule or a `STATE_DELTA` does not apply (HTTP 409 / 422).
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The log backend failed, or appends kept conflicting (HTTP 503).
    #[error(transparent)]
    Log(#[from] LogError),
    /// A batch larger than twice `retention.max_events`: it could be trimmed before a
    /// checkpoint stands for it (HTTP 413).
    #[error("a batch may hold at most {0} events (2 × retention.max_events)")]
    BatchTooLarge(usize),
    /// A batch that would leave more frames than a subscriber's queue takes
    /// (`queue.max_events`), its adjacent deltas merged: every subscriber would be reset by
    /// it (HTTP 413).
    #[error(
        "a batch may make at most {0} SSE frames once its adjacent deltas are merged \
         (queue.max_events: what a subscriber's queue takes); send it in several batches"
    )]
    BatchFramesTooLarge(usize),
    /// A batch whose frames would not fit a subscriber's queue (`queue.max_bytes`): every
    /// subscriber would be reset by it (HTTP 413).
    #[error(
        "a batch's events may make at most {0} bytes of SSE frames (queue.max_bytes: what a \
         subscriber's queue takes); send them in several batches"
    )]
    BatchBytesTooLarge(usize),
    /// The guard of [`Ingest::append_guarded`] refused the thread's state at the log's latest
    /// position: nothing appended.
    #[error("the thread's state does not allow this append")]
    Guarded,
}

/// The most bytes `event`'s SSE frame can take in a subscriber's queue: its frame with the
/// longest event id.
pub fn frame_bytes(event: &ValidEvent) -> usize {
    crate::sse::event_len(Some(IdText::CAPACITY), event.json.len())
}

/// What [`Ingest::append_guarded`] asks of the thread's fold at the head a batch would go on
/// (`None`: the fold cannot be rebuilt, the log was trimmed without a checkpoint).
pub type Guard<'a> = dyn Fn(Option<&ThreadFold>) -> bool + Send + Sync + 'a;

/// How a batch was checked before its append.
enum Checked {
    /// With the fold after the batch (built because a checkpoint candidate goes with it).
    Built(Box<ThreadFold>),
    /// Checked alone; the cached fold folds it in place once appended, taking the order
    /// state the check found.
    InPlace(OrderAfter),
    /// Not checked (order validation off): the cached fold folds it in place once appended,
    /// as a reader of the log would ([`ThreadFold::apply_unchecked`]).
    Lenient,
    /// Not checked, and no fold to keep (it cannot be rebuilt, or nothing needs it).
    Unchecked,
}

impl Checked {
    /// Checks `batch` against `fold`, building the fold after it only when `build` (a
    /// checkpoint candidate goes with the batch).
    fn check<'a>(
        fold: &mut ThreadFold,
        batch: impl IntoIterator<Item = &'a ValidEvent>,
        build: bool,
    ) -> Result<Checked, Rejection> {
        if build {
            fold.check_batch(batch)
                .map(|next| Checked::Built(Box::new(next)))
        } else {
            fold.check_batch_only(batch).map(Checked::InPlace)
        }
    }
}

/// One publish's inputs and what its attempts carry over.
struct Attempt<'a> {
    thread: &'a ThreadId,
    events: &'a [ValidEvent],
    producer: Option<&'a Producer>,
    /// Set when the cached fold was just caught up with the log.
    caught_up: bool,
    /// What the fold must satisfy for the batch to go on ([`Ingest::append_guarded`]).
    guard: Option<&'a Guard<'a>>,
    /// The head the last conflicting append found, for the error when attempts run out.
    moved_to: Option<LogHead>,
    /// The head the batch was appended right after, when the log's appends are final
    /// ([`EventLog::appends_final`]): the hub may then fan it out at once.
    appended_on: Option<LogHead>,
}

/// The publish pipeline. Cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    shared: Arc<Shared>,
}

struct Shared {
    log: Arc<dyn EventLog>,
    strict_order: bool,
    checkpoint_every: usize,
    threads: ThreadMap<Arc<Mutex<Cached>>>,
    /// Set once the orphan sweep runs: batches holding a `RUN_STARTED` are then noted in the
    /// log's open-run registry before their append.
    tracks_runs: AtomicBool,
    /// The milliseconds of the registry ([`orphans::Clock`]).
    clock: orphans::Clock,
    /// Told of each appended batch with its parsed values ([`Ingest::hand_values_to`]).
    hub: std::sync::OnceLock<Arc<dyn LocalAppends>>,
    /// A subscriber's queue bounds: a batch must fit them whole ([`Ingest::max_batch`]).
    queue: QueueLimits,
}

/// A thread's fold as this node last saw it.
struct Cached {
    /// `None` until loaded; `Some((head, None))` when the fold cannot be rebuilt. Boxed: a
    /// publish takes it out and puts it back, and moving a fold by value was ~1,000
    /// instructions per published event in `benches/hot_path.rs`.
    at: Option<(LogHead, Option<Box<ThreadFold>>)>,
    /// Events in the log since this node's last checkpoint candidate: its own appends and
    /// what it folded while catching up with other nodes'.
    since_candidate: usize,
    used: Instant,
}

impl Ingest {
    /// A pipeline over `log`. With `strict_order` false, batches are appended without order
    /// checks (schema validation still applies), still folded for checkpoint candidates
    /// unless `checkpoint_every` is `0`. `checkpoint_every`: events between checkpoint
    /// candidates (`retention.max_events`; `0`: no checkpoints).
    pub fn new(log: Arc<dyn EventLog>, strict_order: bool, checkpoint_every: usize) -> Self {
        let unbounded = QueueLimits {
            max_events: usize::MAX,
            max_bytes: usize::MAX,
        };
        Self::with_queue_limits(log, strict_order, checkpoint_every, unbounded)
    }

    /// [`Self::new`], with batches bounded by a subscriber's queue (`queue.max_events`,
    /// `queue.max_bytes`): a batch the fan-out pushes whole into each queue must fit an empty
    /// one, or it would reset every subscriber, those keeping up included.
    pub fn with_queue_limits(
        log: Arc<dyn EventLog>,
        strict_order: bool,
        checkpoint_every: usize,
        queue: QueueLimits,
    ) -> Self {
        Ingest {
            shared: Arc::new(Shared {
                queue,
                log,
                strict_order,
                checkpoint_every,
                threads: ThreadMap::default(),
                tracks_runs: AtomicBool::new(false),
                clock: orphans::Clock::new(),
                hub: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Hands the values of every batch appended from now on to `hub` (the node's hub, see
    /// [`LocalAppends`]), so that its fan-out does not parse this node's appends again. Set
    /// once (a second call is ignored).
    pub fn hand_values_to(&self, hub: Arc<dyn LocalAppends>) {
        let _ = self.shared.hub.set(hub);
    }

    /// Appends a schema-valid batch atomically after the order checks. With a `producer`,
    /// events whose number that producer already appended on this thread are acknowledged
    /// and skipped (PROTOCOL §2 idempotent retries), also across nodes.
    ///
    /// # Errors
    /// [`IngestError::Rejected`] with the first offending event (nothing appended);
    /// [`IngestError::Log`] when the backend fails: nothing appended, except for
    /// [`LogError::OutcomeUnknown`] (the append was sent and could not be settled: it may be in
    /// the log; a producer retrying with the same numbers is safe).
    pub async fn append(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        producer: Option<&Producer>,
    ) -> Result<Appended, IngestError> {
        self.append_with(thread, events, producer, None).await
    }

    /// [`Self::append`] of a broker's own batch that must land on a given state of the
    /// thread: `guard` is asked about the fold at the head the batch would go on, on every
    /// attempt, under the thread's lock (this node's publishes wait; an append by another node
    /// makes it catch up and ask again). E.g. a cancel's `RUN_ERROR`, only while its run is
    /// the thread's active run.
    ///
    /// # Errors
    /// [`IngestError::Guarded`] when `guard` refused the state at the log's latest position;
    /// otherwise as [`Self::append`].
    pub async fn append_guarded(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        guard: &Guard<'_>,
    ) -> Result<Appended, IngestError> {
        self.append_with(thread, events, None, Some(guard)).await
    }

    async fn append_with(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        producer: Option<&Producer>,
        guard: Option<&Guard<'_>>,
    ) -> Result<Appended, IngestError> {
        if events.is_empty() {
            return Ok(Appended::default());
        }
        self.check_batch_size(events)?;
        if self.shared.tracks_runs.load(Ordering::Relaxed)
            && events
                .iter()
                .any(|e| e.event_type == crate::event::EventType::RunStarted)
        {
            // Before the append: a node that dies right after it still leaves the run noted.
            let now = self.shared.clock.now_ms();
            self.shared.log.note_open_run(thread, now).await?;
        }
        if !self.keeps_fold() && producer.is_none() && guard.is_none() {
            let ids = self.shared.log.append(thread, events).await?;
            self.hand_over(thread, None, &ids, events);
            return Ok(Appended { ids, duplicates: 0 });
        }
        let cached = self.cached(thread);
        let mut c = cached.lock().await;
        c.used = Instant::now();
        let mut attempt = Attempt {
            thread,
            events,
            producer,
            caught_up: false,
            appended_on: None,
            guard,
            moved_to: None,
        };
        for _ in 0..MAX_ATTEMPTS {
            if let Some(appended) = self.try_append(&mut attempt, &mut c).await? {
                // Still under the thread's lock: this node's appends reach the hub in order.
                // No `.await` between the append and this call: a handed-over append
                // (`AppendExtras::handed_over`) always reaches the hub, which wakes the tail
                // unless it fans the batch out itself.
                self.hand_over(
                    thread,
                    attempt.appended_on,
                    &appended.ids,
                    &events[appended.duplicates..],
                );
                return Ok(appended);
            }
        }
        // Other nodes' appends won every race: `contended`, not a backend failure.
        Err(match attempt.moved_to {
            Some(head) => LogError::Conflict(head),
            None => {
                LogError::Unavailable("the thread kept changing under concurrent appends".into())
            }
        }
        .into())
    }

    /// Whether a conditional append is handed over to the hub with its head
    /// ([`AppendExtras::handed_over`]): a hub was given and the log's appends are final.
    fn hands_over(&self) -> bool {
        self.shared.hub.get().is_some() && self.shared.log.appends_final()
    }

    /// Hands the appended events to the hub, if one was given; `on`: the head they were
    /// appended right after, when [`Ingest::hands_over`].
    fn hand_over(
        &self,
        thread: &ThreadId,
        on: Option<LogHead>,
        ids: &[EventId],
        appended: &[ValidEvent],
    ) {
        if let Some(hub) = self.shared.hub.get() {
            hub.appended(thread, on, ids, appended);
        }
    }

    /// The most events one batch may hold, `None` without a limit: twice the retained count
    /// (`retention.max_events`), so that with checkpoints every `max_events` the log's safety
    /// cap (4 × `max_events`) never trims past the newest checkpoint.
    pub fn max_batch(&self) -> Option<usize> {
        Some(self.shared.checkpoint_every.saturating_mul(2)).filter(|&n| n > 0)
    }

    /// The most frames one batch may leave in a subscriber's queue once its adjacent deltas
    /// are merged ([`merged_count`]): `queue.max_events`.
    pub fn max_batch_frames(&self) -> usize {
        self.shared.queue.max_events
    }

    /// The most bytes of SSE frames one batch may make (`queue.max_bytes`), each event
    /// counted with the longest id ([`frame_bytes`]).
    pub fn max_batch_bytes(&self) -> usize {
        self.shared.queue.max_bytes
    }

    /// `events` cut, in order, into the batches [`Self::max_batch`], [`Self::max_batch_frames`]
    /// (counted before merging: a bound that is never too large) and [`Self::max_batch_bytes`]
    /// allow, for a caller whose events may be appended in several steps (an SSE ingest, a
    /// gateway run). An event too large alone is a batch of its own (and refused).
    pub fn pieces<'b>(&self, events: &'b [ValidEvent]) -> Vec<&'b [ValidEvent]> {
        let max = self
            .max_batch()
            .unwrap_or(usize::MAX)
            .min(self.max_batch_frames())
            .max(1);
        let max_bytes = self.max_batch_bytes();
        let mut out = Vec::new();
        let (mut start, mut bytes) = (0, 0usize);
        for (i, e) in events.iter().enumerate() {
            let b = frame_bytes(e);
            if i > start && (i - start == max || bytes.saturating_add(b) > max_bytes) {
                out.push(&events[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes = bytes.saturating_add(b);
        }
        if start < events.len() {
            out.push(&events[start..]);
        }
        out
    }

    fn check_batch_size(&self, events: &[ValidEvent]) -> Result<(), IngestError> {
        if let Some(max) = self.max_batch()
            && events.len() > max
        {
            return Err(IngestError::BatchTooLarge(max));
        }
        // Merge keys only for a batch that could be too large: most publishes are one event.
        let max_frames = self.max_batch_frames();
        if events.len() > max_frames
            && merged_count(events.iter().map(|e| (e.event_type, e))) > max_frames
        {
            return Err(IngestError::BatchFramesTooLarge(max_frames));
        }
        let max_bytes = self.max_batch_bytes();
        let mut bytes = 0usize;
        for e in events {
            bytes = bytes.saturating_add(frame_bytes(e));
            if bytes > max_bytes {
                return Err(IngestError::BatchBytesTooLarge(max_bytes));
            }
        }
        Ok(())
    }

    /// Whether the thread's fold is kept. Without order checks it is still kept when the log
    /// is trimmed, for the checkpoint candidates a trimmed thread's preludes and snapshots are
    /// built from (PROTOCOL §6); without trimming (`max_events = 0`) the log alone rebuilds it.
    fn keeps_fold(&self) -> bool {
        self.shared.strict_order || self.shared.checkpoint_every > 0
    }

    /// One attempt: the thread's position, the producer's duplicates, the order check, the
    /// compare-and-append. `Ok(None)`: the log moved meanwhile, try again.
    async fn try_append(
        &self,
        a: &mut Attempt<'_>,
        c: &mut Cached,
    ) -> Result<Option<Appended>, IngestError> {
        let thread = a.thread;
        // Whether the fold was read from the log just now (not this node's cached copy).
        let fresh = c.at.is_none() || std::mem::take(&mut a.caught_up);
        let (head, mut fold) = self.position(thread, c).await?;
        let skip = self.already_appended(a).await?;
        if skip == a.events.len() {
            c.at = Some((head, fold));
            return Ok(Some(Appended {
                ids: Vec::new(),
                duplicates: skip,
            }));
        }
        let batch = &a.events[skip..];
        let Some(passes) = self.guard_passes(a, thread, fold.as_deref(), head).await? else {
            c.at = None;
            return Ok(None);
        };
        let checked = if passes {
            self.check_order(
                thread,
                fold.as_deref_mut(),
                batch,
                self.candidate_due(c, batch.len()),
            )
            .map_err(|mut rejection| {
                // The index counts from the batch as given, its duplicates included.
                *rejection.index_mut() += skip;
                IngestError::from(rejection)
            })
        } else {
            Err(IngestError::Guarded)
        };
        let checked = match checked {
            Ok(checked) => checked,
            // Another node may have appended what makes the batch valid (the message it
            // writes to, say) or what the guard waits for: refuse only against the log's
            // latest position.
            Err(_) if !fresh && fold.is_some() => {
                if let Some(fold) = fold {
                    self.catch_up_cached(thread, c, fold, head, None).await?;
                }
                a.caught_up = true;
                return Ok(None);
            }
            Err(e) => {
                c.at = Some((head, fold));
                return Err(e);
            }
        };
        let extras = self.extras(&checked, a);
        match self.shared.log.append_if(thread, batch, head, extras).await {
            Ok(ids) => {
                a.appended_on = self.hands_over().then_some(head);
                Ok(Some(Self::record_append(
                    c, ids, head, fold, checked, batch, skip,
                )))
            }
            Err(LogError::Conflict(now)) => {
                // Someone else appended (or the log was recreated): catch up, check again.
                a.moved_to = Some(now);
                c.at = None;
                if now.epoch == head.epoch
                    && let Some(fold) = fold
                {
                    a.caught_up = self
                        .catch_up_cached(thread, c, fold, head, Some(now))
                        .await?;
                }
                Ok(None)
            }
            Err(e) => {
                // Not appended, or not known (`OutcomeUnknown`): reload next time.
                c.at = None;
                Err(e.into())
            }
        }
    }

    /// Whether the attempt's guard ([`Ingest::append_guarded`]) accepts `fold` at `head`
    /// (`true` without a guard); `None` when the log moved past `head` meanwhile (try again).
    async fn guard_passes(
        &self,
        a: &mut Attempt<'_>,
        thread: &ThreadId,
        fold: Option<&ThreadFold>,
        head: LogHead,
    ) -> Result<Option<bool>, LogError> {
        let Some(guard) = a.guard else {
            return Ok(Some(true));
        };
        if fold.is_some() || self.keeps_fold() {
            return Ok(Some(guard(fold)));
        }
        // No fold kept here (order checks and checkpoints off): the log's, at `head`.
        let (now, built) = load_fold(&*self.shared.log, thread).await?;
        if now != head {
            a.moved_to = Some(now);
            return Ok(None);
        }
        Ok(Some(guard(built.as_ref())))
    }

    /// The position to check against: the cached one, or the log's (with the fold rebuilt
    /// when it is kept).
    async fn position(
        &self,
        thread: &ThreadId,
        c: &mut Cached,
    ) -> Result<(LogHead, Option<Box<ThreadFold>>), LogError> {
        match c.at.take() {
            Some(at) => Ok(at),
            None if self.keeps_fold() => {
                let (head, fold) = load_fold(&*self.shared.log, thread).await?;
                Ok((head, fold.map(Box::new)))
            }
            None => Ok((self.shared.log.head(thread).await?, None)),
        }
    }

    /// How many leading events of the batch its producer already appended (numbers up to its
    /// mark); `0` without a producer.
    async fn already_appended(&self, a: &Attempt<'_>) -> Result<usize, LogError> {
        let Some(p) = a.producer else {
            return Ok(0);
        };
        let last = self.shared.log.producer_seq(a.thread, &p.id).await?;
        Ok(usize::try_from((last + 1).saturating_sub(p.seq))
            .unwrap_or(usize::MAX)
            .min(a.events.len()))
    }

    /// Checks `batch` against the fold (or not, as configured). The fold after the batch is
    /// built before the append only when a checkpoint candidate (its prelude) goes with it
    /// (`due`); otherwise the batch is checked alone and folded in place once appended (no
    /// copy of the thread per publish).
    fn check_order(
        &self,
        thread: &ThreadId,
        fold: Option<&mut ThreadFold>,
        batch: &[ValidEvent],
        due: bool,
    ) -> Result<Checked, Rejection> {
        // What schema validation kept: no second parse.
        let values = batch.iter();
        Ok(match (fold, self.shared.strict_order) {
            (Some(f), true) => Checked::check(f, values, due)?,
            (Some(f), false) if due => {
                let mut next = f.clone();
                next.apply_unchecked(values);
                Checked::Built(Box::new(next))
            }
            (Some(_), false) => Checked::Lenient,
            (None, true) => {
                // Trimmed without a checkpoint: the order cannot be checked.
                tracing::warn!(%thread, "thread fold cannot be rebuilt; appending without order checks");
                Checked::Unchecked
            }
            (None, false) => Checked::Unchecked,
        })
    }

    /// What goes with the append: the checkpoint candidate (`Built` only when
    /// `candidate_due`) and the producer's mark.
    fn extras(&self, checked: &Checked, a: &Attempt<'_>) -> AppendExtras {
        AppendExtras {
            candidate: match checked {
                Checked::Built(next) => candidate(next),
                _ => None,
            },
            // Every node sends candidates at its own count: the log drops one that comes
            // within `max_events` entries of the pending checkpoint (see `AppendExtras`).
            candidate_min_gap: self.shared.checkpoint_every as u64,
            producer: a.producer.map(|p| ProducerMark {
                id: p.id.clone(),
                last_seq: p.seq + a.events.len() as u64 - 1,
            }),
            handed_over: self.hands_over(),
        }
    }

    /// After a successful append: the cached position and fold move past the batch.
    fn record_append(
        c: &mut Cached,
        ids: Vec<EventId>,
        head: LogHead,
        fold: Option<Box<ThreadFold>>,
        checked: Checked,
        batch: &[ValidEvent],
        skip: usize,
    ) -> Appended {
        // Counted once appended: a candidate whose append conflicted is built again for the
        // retry.
        if matches!(checked, Checked::Built(_)) {
            c.since_candidate = 0;
        } else {
            c.since_candidate += batch.len();
        }
        let last = ids.last().copied().map_or(head, |id| LogHead {
            epoch: id.epoch,
            last: id.pos,
            ..head
        });
        let values = batch.iter();
        let next = match checked {
            Checked::Built(next) => Some(next),
            Checked::InPlace(after) => fold.map(|mut f| {
                f.apply_checked(values, after);
                f
            }),
            Checked::Lenient => fold.map(|mut f| {
                f.apply_unchecked(values);
                f
            }),
            Checked::Unchecked => None,
        };
        c.at = Some((last, next));
        Appended {
            ids,
            duplicates: skip,
        }
    }

    /// Catches `fold` (at `head`) up with the log and caches it; `seen`: the head a conflict
    /// reported. Returns whether it caught up (`false`: trimmed or recreated meanwhile, the
    /// next attempt reloads from scratch).
    async fn catch_up_cached(
        &self,
        thread: &ThreadId,
        c: &mut Cached,
        mut fold: Box<ThreadFold>,
        head: LogHead,
        seen: Option<LogHead>,
    ) -> Result<bool, LogError> {
        match catch_up(&*self.shared.log, thread, &mut fold, head).await {
            Ok((mut head, folded)) => {
                c.since_candidate += folded;
                // The read skips entries it cannot validate (a producer's direct `XADD`), so
                // it may stop short of `seen`; they were in the log it read, so the next
                // append follows them.
                if let Some(now) = seen
                    && head.epoch == now.epoch
                    && head.last < now.last
                {
                    head.last = now.last;
                }
                c.at = Some((head, Some(fold)));
                Ok(true)
            }
            Err(LogError::Gap(_)) => {
                c.at = None;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs `f` on the thread's fold at the log's latest position: this node's cached fold,
    /// caught up with whatever other nodes appended meanwhile (one read when nothing was). The
    /// run gateway checks a new run against it (the thread's current run, the messages it
    /// holds), where the hub's fold may still lag the log by the tail's delay. `Ok(None)` when
    /// no fold is kept (order checks off and no checkpoints) or it cannot be rebuilt (trimmed
    /// without a checkpoint).
    ///
    /// # Errors
    /// [`LogError::Unavailable`].
    pub async fn with_latest_fold<R>(
        &self,
        thread: &ThreadId,
        f: impl FnOnce(&ThreadFold) -> R,
    ) -> Result<Option<R>, LogError> {
        if !self.keeps_fold() {
            return Ok(None);
        }
        let cached = self.cached(thread);
        let mut c = cached.lock().await;
        c.used = Instant::now();
        let (head, fold) = self.position(thread, &mut c).await?;
        let Some(fold) = fold else {
            c.at = Some((head, None));
            return Ok(None);
        };
        if !self
            .catch_up_cached(thread, &mut c, fold, head, None)
            .await?
        {
            // Trimmed or recreated meanwhile: rebuilt from the log (`c.at` is `None`).
            let (head, fold) = self.position(thread, &mut c).await?;
            let result = fold.as_deref().map(f);
            c.at = Some((head, fold));
            return Ok(result);
        }
        Ok(c.at.as_ref().and_then(|(_, fold)| fold.as_deref()).map(f))
    }

    fn cached(&self, thread: &ThreadId) -> Arc<Mutex<Cached>> {
        if let Some(c) = self.shared.threads.get(thread) {
            return c.clone();
        }
        if self.shared.threads.len() > CACHE_SOFT_LIMIT {
            self.shared.threads.retain(|_, c| match c.try_lock() {
                Ok(g) => g.used.elapsed() < CACHE_IDLE,
                Err(_) => true,
            });
        }
        self.shared
            .threads
            .entry(thread.clone())
            .or_insert_with(|| {
                Arc::new(Mutex::new(Cached {
                    at: None,
                    since_candidate: 0,
                    used: Instant::now(),
                }))
            })
            .clone()
    }

    /// Whether a batch of `n` more events takes the thread to its next checkpoint candidate.
    fn candidate_due(&self, c: &Cached, n: usize) -> bool {
        self.shared.checkpoint_every > 0 && c.since_candidate + n >= self.shared.checkpoint_every
    }
}

/// A checkpoint candidate: the prelude of `next`, the fold after the batch (PROTOCOL §6).
fn candidate(next: &ThreadFold) -> Option<Bytes> {
    serde_json::to_vec(&prelude::prelude(next))
        .ok()
        .map(Bytes::from)
}
