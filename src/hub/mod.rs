//! The node's fan-out hub: one reader per thread per node, each event encoded once, shared
//! `Bytes` pushed into every subscriber's bounded queue without ever waiting for a client.
//!
//! Data path position: `log` → **`hub`** → `queue`. The hub follows a thread through the
//! log's node-wide [`Tail`] while it has local subscribers (SPEC §7: a node reads a thread's
//! log once, however many subscribers follow it).
//!
//! The hub also folds every event it fans out (once per node) into the thread's
//! [`ThreadFold`], so that it can start a client anywhere with a prelude and reset a lagging
//! one with a bridge (SPEC §5).
//!
//! Exact resume (SPEC §4.2): a subscriber is registered under the thread's lock together with
//! the hub's cursor `c` (the last position fanned out). Everything after `c` reaches its live
//! lane; its replay task reads `(after, c]` from the log into the replay lane. The queue skips
//! anything at or before the last position written, so the hand-over has no gap and no
//! duplicate, whatever producers do meanwhile.
//!
//! A new connection, or a `Last-Event-ID` that cannot be resumed exactly, gets a prelude of
//! the fold at `c`, built under the same lock (SPEC §4.3, §4.4).
//!
//! Slow subscribers (SPEC §5): a live push that does not fit is coalesced in the queue; if it
//! still does not fit, the queue is reset: it drops what is pending and every later push
//! until its writer comes back for more, and then gets a bridge from what the client was last
//! given to the fold at the newest id, built under the thread's lock on the writer's time
//! ([`BridgeSource`]). The fan-out itself never builds a bridge, so a stalled subscriber costs
//! it one queue lock per event.

use crate::event::order::OrderChecker;
use crate::event::{EventType, ThreadId};
use crate::fold::prelude;
use crate::fold::{Applied, ThreadFold, load_fold};
use crate::log::{
    EventId, EventLog, LogEntry, LogError, LogHead, ReadFrom, ResumeGap, StreamPos, Tail, TailItem,
};
use crate::metrics as m;
use crate::queue::{BridgeSource, CloseReason, ConnQueue, MergeKey, Pushed, QueueLimits};
use crate::sse::Frame;
use dashmap::DashMap;
use parking_lot::Mutex;
use rand::seq::SliceRandom;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{OnceCell, mpsc};
use tokio_util::sync::CancellationToken;

/// Entries per log read of a replay task.
const REPLAY_PAGE: usize = 512;
/// Frames written at once by the fan-out that share one `agui_publish_to_write_seconds` clock
/// read.
const WRITES_PER_SAMPLE: usize = 32;
/// Capacity of the channel from the log's tail to the hub's dispatcher, in tail items.
const TAIL_CHANNEL: usize = 1024;

/// Where a new subscription starts (SPEC §2, §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// At the head of the log: only events appended from now on.
    Live,
    /// `?from=start`: the retained log from its first event, when the log is complete from
    /// the thread's beginning (otherwise like [`Start::Live`]).
    FromStart,
    /// `Last-Event-ID`: strictly after this id.
    After(EventId),
    /// `Last-Event-ID` marking a position inside a reset bridge sent after this id
    /// ([`crate::log::ResumeId::InsideBridge`]): not resumable exactly, a prelude at the head.
    InsideBridge(EventId),
}

/// How a subscription actually started, for the caller's logs, metrics and stream comments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// As asked.
    Exact,
    /// The id could not be resumed exactly; the stream starts with a prelude at the head
    /// (or, when the thread's fold cannot be rebuilt, live at the head).
    Unresumable(ResumeGap),
    /// `?from=start` on a trimmed log; the stream starts with a prelude at the head.
    StartTrimmed,
}

/// A registered subscriber: its queue, and the guard that unregisters it when dropped.
pub struct Subscription {
    /// The connection's queue (the SSE writer drains it).
    pub queue: Arc<ConnQueue>,
    /// How the subscription started.
    pub outcome: Outcome,
    /// Events the stream starts with (a prelude), already encoded; empty when there is none.
    pub prelude: Option<Frame>,
    /// Whether the thread's fold was known: without it no prelude could be built.
    pub fold_known: bool,
    /// Unregisters on drop; keep it alive as long as the stream.
    pub guard: SubscriptionGuard,
}

/// Unregisters a subscriber (and stops its replay) when dropped.
pub struct SubscriptionGuard {
    hub: Hub,
    queue: Arc<ConnQueue>,
    thread: ThreadId,
    key: u64,
    replay_stop: CancellationToken,
}

impl Drop for SubscriptionGuard {
    fn drop(&mut self) {
        self.replay_stop.cancel();
        // Closing frees what is queued and wakes a replay task waiting for room.
        self.queue.close(CloseReason::Shutdown);
        self.hub.unregister(&self.thread, self.key);
    }
}

/// The hub. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

struct Shared {
    log: Arc<dyn EventLog>,
    tail: Arc<dyn Tail>,
    threads: DashMap<ThreadId, Arc<ThreadHub>>,
    limits: QueueLimits,
    next_key: AtomicU64,
    shutdown: CancellationToken,
    /// Set when [`Hub::drain_streams`] starts: a subscriber registered after it took its list
    /// is closed at once (see `subscribe`).
    draining: std::sync::atomic::AtomicBool,
}

/// One followed thread.
struct ThreadHub {
    /// Set once, by the first subscriber: the head the tail was started from.
    started: OnceCell<()>,
    state: Mutex<ThreadState>,
}

struct ThreadState {
    head: Option<LogHead>,
    /// Last position fanned out (every later event reaches registered subscribers).
    cursor: StreamPos,
    /// The fold at `cursor`; `None` when it cannot be rebuilt (trimmed without checkpoint).
    fold: Option<ThreadFold>,
    /// The fold's order state at `cursor`, shared with the frames that do not change it.
    view: Option<Arc<OrderChecker>>,
    subscribers: Vec<(u64, Arc<ConnQueue>)>,
    /// Taken out of the hub's map (its last subscriber left); never reused.
    removed: bool,
}

impl Hub {
    /// Starts a hub over `log`: spawns the dispatcher that consumes the log's tail until
    /// `shutdown` is cancelled.
    pub fn start(log: Arc<dyn EventLog>, limits: QueueLimits, shutdown: CancellationToken) -> Hub {
        let (tx, rx) = mpsc::channel(TAIL_CHANNEL);
        let tail = log.start_tail(tx, shutdown.clone());
        let hub = Hub {
            shared: Arc::new(Shared {
                log,
                tail,
                threads: DashMap::new(),
                limits,
                next_key: AtomicU64::new(1),
                draining: std::sync::atomic::AtomicBool::new(false),
                shutdown: shutdown.clone(),
            }),
        };
        tokio::spawn(hub.clone().dispatch(rx, shutdown));
        hub
    }

    /// The log this hub reads.
    pub fn log(&self) -> &Arc<dyn EventLog> {
        &self.shared.log
    }

    /// Number of threads with local subscribers.
    pub fn followed_threads(&self) -> usize {
        self.shared.threads.len()
    }

    /// Ends every open stream of this node within `drain` (SIGTERM, SPEC §9): the queues are
    /// closed in random order, evenly spread over the period, so that clients do not all
    /// reconnect at the same moment; each writer then sends a jittered `retry:` and ends its
    /// stream. A subscriber registered after the list was taken (its subscribe started before
    /// the drain) is closed as soon as it registers.
    pub async fn drain_streams(&self, drain: Duration) {
        // Before the list is taken: whoever registers after it sees the flag (`subscribe`).
        self.shared.draining.store(true, Ordering::SeqCst);
        let mut queues: Vec<Arc<ConnQueue>> = Vec::new();
        for th in self.shared.threads.iter() {
            let st = th.state.lock();
            queues.extend(st.subscribers.iter().map(|(_, q)| q.clone()));
        }
        queues.shuffle(&mut rand::rng());
        let started = tokio::time::Instant::now();
        let n = queues.len().max(1) as f64;
        for (i, q) in queues.into_iter().enumerate() {
            tokio::time::sleep_until(started + drain.mul_f64(i as f64 / n)).await;
            q.close(CloseReason::Shutdown);
        }
    }

    /// Registers a subscriber of `thread` starting at `start`.
    ///
    /// # Errors
    /// [`LogError::Unavailable`] when the log cannot be reached to start following the thread.
    pub async fn subscribe(
        &self,
        thread: &ThreadId,
        start: Start,
    ) -> Result<Subscription, LogError> {
        let th = self.thread_hub(thread);
        th.started
            .get_or_try_init(|| async {
                let (head, fold) = load_fold(&*self.shared.log, thread).await?;
                let mut st = th.state.lock();
                st.head = Some(head);
                st.cursor = head.last;
                st.view = fold.as_ref().map(|f| Arc::new(f.checker().clone()));
                st.fold = fold;
                self.shared
                    .tail
                    .follow(thread.clone(), head.epoch, head.last);
                Ok::<(), LogError>(())
            })
            .await?;

        // Decide the replay range against the hub's head (cheap checks first; the log read
        // checks trimming and "ahead" against the log itself).
        // `?from=start` asks the log itself whether it is still complete: the hub's cached
        // head does not see trimming.
        let complete = match start {
            Start::FromStart => self.shared.log.head(thread).await?.complete_from_start(),
            _ => false,
        };
        let (outcome, replay_from) = {
            let st = th.state.lock();
            let head = st
                .head
                .expect("set by the OnceCell above before it completes");
            match start {
                Start::Live => (Outcome::Exact, None),
                Start::FromStart if complete => (Outcome::Exact, Some(ReadFrom::Start)),
                Start::FromStart => (Outcome::StartTrimmed, None),
                Start::After(id) if id.epoch != head.epoch => {
                    (Outcome::Unresumable(ResumeGap::OtherEpoch), None)
                }
                Start::After(id) => (Outcome::Exact, Some(ReadFrom::After(id))),
                Start::InsideBridge(_) => (Outcome::Unresumable(ResumeGap::InsideBridge), None),
            }
        };
        // A resume needs the log's verdict (trimmed? ahead?) before the stream starts.
        let (outcome, replay_from) = match replay_from {
            Some(ReadFrom::After(id)) => {
                match self.shared.log.read(thread, ReadFrom::After(id), 0).await {
                    Ok(_) => (outcome, Some(ReadFrom::After(id))),
                    Err(LogError::Gap(gap)) => (Outcome::Unresumable(gap), None),
                    Err(e) => return Err(e),
                }
            }
            other => (outcome, other),
        };

        let key = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        let replay_stop = self.shared.shutdown.child_token();
        let registered = {
            let mut st = th.state.lock();
            if st.removed {
                None
            } else {
                let after = match replay_from {
                    Some(ReadFrom::After(id)) => id.pos,
                    _ => StreamPos::ZERO,
                };
                // Other subscribers start at the hub's cursor with a prelude of the fold there;
                // everything at or before it is old.
                let (writer_after, prelude, view) = if replay_from.is_some() {
                    (after, None, None)
                } else {
                    let prelude = match (&st.fold, st.head) {
                        (Some(fold), Some(head)) => {
                            let events = prelude::prelude(fold);
                            (!events.is_empty()).then(|| {
                                let id = EventId {
                                    epoch: head.epoch,
                                    pos: st.cursor,
                                };
                                Frame::synthesised(id, &events, Instant::now(), st.view.clone())
                            })
                        }
                        _ => None,
                    };
                    (st.cursor, prelude, st.view.clone())
                };
                let queue = Arc::new(ConnQueue::new(
                    self.shared.limits,
                    writer_after,
                    replay_from.is_some(),
                    view,
                ));
                queue.set_bridge_source(Arc::new(Bridges {
                    thread: Arc::downgrade(&th),
                }));
                st.subscribers.push((key, queue.clone()));
                let epoch = st.head.map(|h| h.epoch);
                Some((queue, st.cursor, prelude, st.fold.is_some(), epoch))
            }
        };
        let Some((queue, replay_until, prelude, fold_known, epoch)) = registered else {
            // The last subscriber left between our lookup and now, and this thread hub is no
            // longer the followed one: start over with a fresh one.
            return Box::pin(self.subscribe(thread, start)).await;
        };
        metrics::gauge!(m::CONNECTIONS).increment(1.0);
        if self.shared.draining.load(Ordering::SeqCst) {
            // Registered after the drain took its list of streams (the subscribe passed the
            // node's draining check before SIGTERM, then waited for the log): end it now, with
            // its jittered `retry:`, rather than let it outlive the drain.
            queue.close(CloseReason::Shutdown);
        }
        if let Some(from) = replay_from {
            // `?from=start` was decided on a complete log, but the log may be trimmed before
            // the replay reads it: read "after position 0" of this epoch instead, which the log
            // refuses (a gap) once anything was trimmed, rather than starting mid-thread.
            let from = match (from, epoch) {
                (ReadFrom::Start, Some(epoch)) => ReadFrom::After(EventId {
                    epoch,
                    pos: StreamPos::ZERO,
                }),
                (from, _) => from,
            };
            tokio::spawn(replay(
                self.shared.log.clone(),
                thread.clone(),
                from,
                replay_until,
                queue.clone(),
                replay_stop.clone(),
            ));
        }
        Ok(Subscription {
            queue: queue.clone(),
            outcome,
            prelude,
            fold_known,
            guard: SubscriptionGuard {
                hub: self.clone(),
                queue: queue.clone(),
                thread: thread.clone(),
                key,
                replay_stop,
            },
        })
    }

    fn thread_hub(&self, thread: &ThreadId) -> Arc<ThreadHub> {
        if let Some(th) = self.shared.threads.get(thread) {
            return th.clone();
        }
        self.shared
            .threads
            .entry(thread.clone())
            .or_insert_with(|| {
                Arc::new(ThreadHub {
                    started: OnceCell::new(),
                    state: Mutex::new(ThreadState {
                        head: None,
                        cursor: StreamPos::ZERO,
                        fold: None,
                        view: None,
                        subscribers: Vec::new(),
                        removed: false,
                    }),
                })
            })
            .clone()
    }

    fn unregister(&self, thread: &ThreadId, key: u64) {
        metrics::gauge!(m::CONNECTIONS).decrement(1.0);
        // Remove the thread (and stop following it) when its last subscriber leaves. The
        // DashMap shard lock is held across the check so a concurrent subscribe either sees
        // the thread removed (and creates a fresh one) or registers before the check.
        // Unfollowing inside the closure orders it before any new follow of the thread.
        self.shared.threads.remove_if(thread, |_, th| {
            let mut st = th.state.lock();
            st.subscribers.retain(|(k, _)| *k != key);
            if st.subscribers.is_empty() {
                st.removed = true;
                self.shared.tail.unfollow(thread);
                true
            } else {
                false
            }
        });
    }

    /// Consumes the tail: encodes each event once and fans it out.
    async fn dispatch(self, mut rx: mpsc::Receiver<TailItem>, shutdown: CancellationToken) {
        loop {
            let item = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                item = rx.recv() => match item { Some(i) => i, None => return },
            };
            match item {
                TailItem::Entries { thread, entries } => self.fan_out(&thread, &entries),
                TailItem::Discontinuity {
                    thread,
                    head,
                    reason,
                } => self.discontinuity(&thread, head, reason).await,
            }
        }
    }

    /// The tail lost continuity. Trimmed past the tail in the same epoch (a tail that fell
    /// behind retention): rebuild the fold at the log's head and reset every subscriber to it
    /// with a bridge (SPEC §5), as for a slow subscriber. Otherwise (a recreated log), or when
    /// no bridge can be built: end the thread's streams; clients come back with their last id
    /// and get a prelude.
    async fn discontinuity(&self, thread: &ThreadId, head: LogHead, reason: ResumeGap) {
        let Some(th) = self.shared.threads.get(thread).map(|t| t.clone()) else {
            return;
        };
        let same_epoch = th.state.lock().head.is_some_and(|h| h.epoch == head.epoch);
        if reason == ResumeGap::Trimmed
            && same_epoch
            && let Ok((now, Some(fold))) = load_fold(&*self.shared.log, thread).await
            && now.epoch == head.epoch
        {
            let mut st = th.state.lock();
            if !st.removed {
                // The fold moves to the log's head first: the writers build their bridges
                // to it (under this lock) when they come back for more.
                st.head = Some(now);
                st.cursor = now.last;
                st.view = Some(Arc::new(fold.checker().clone()));
                st.fold = Some(fold);
                let mut resets = 0u64;
                let mut closed = 0u64;
                st.subscribers.retain(|(_, q)| {
                    if q.begin_reset() {
                        resets += 1;
                        true
                    } else {
                        q.close(CloseReason::Discontinuity);
                        closed += 1;
                        false
                    }
                });
                drop(st);
                tracing::info!(%thread, resets, closed, "the tail fell behind retention; subscribers reset to the fold at the head");
                metrics::counter!(m::RESETS, "cause" => "trimmed").increment(resets);
                metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Discontinuity.as_str())
                    .increment(closed);
                return;
            }
        }
        tracing::warn!(%thread, reason = reason.as_str(), epoch = %head.epoch, "log discontinuity under the tail; disconnecting the thread's subscribers");
        // The fold no longer stands for the log: drop the thread hub (the next subscriber
        // rebuilds it) and end its streams.
        let removed = self.shared.threads.remove_if(thread, |_, th| {
            th.state.lock().removed = true;
            self.shared.tail.unfollow(thread);
            true
        });
        if let Some((_, th)) = removed {
            let mut st = th.state.lock();
            st.head = Some(head);
            st.cursor = head.last;
            for (_, q) in st.subscribers.drain(..) {
                q.close(CloseReason::Discontinuity);
                metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Discontinuity.as_str())
                    .increment(1);
            }
        }
    }

    fn fan_out(&self, thread: &ThreadId, entries: &[LogEntry]) {
        let Some(th) = self.shared.threads.get(thread).map(|t| t.clone()) else {
            return;
        };
        // Parse outside the lock (once per event per node).
        let values: Vec<Option<Value>> = entries
            .iter()
            .map(|e| serde_json::from_slice(&e.json).ok())
            .collect();
        let born = Instant::now();
        let mut st = th.state.lock();
        let cursor = st.cursor;
        let mut frames: Vec<Frame> = Vec::with_capacity(entries.len());
        for (e, v) in entries.iter().zip(&values) {
            // The tail may repeat entries after a re-follow: skip those.
            if e.id.pos <= cursor {
                continue;
            }
            let merge = match v {
                Some(v) => fold_event(&mut st, thread, e.event_type, v),
                None => MergeKey::None,
            };
            frames.push(
                Frame::new(e.id, e.event_type, &e.json, born, merge).with_view(st.view.clone()),
            );
        }
        let Some(last) = frames.last() else { return };
        let last_id = last.id;
        st.cursor = last_id.pos;
        if let Some(head) = st.head.as_mut() {
            head.last = last_id.pos;
        }
        let (mut resets, mut overflowed) = (0u64, 0u64);
        // Frames written at once, counted in `agui_publish_to_write_seconds` in groups: one
        // clock read per group instead of per write (a group spans ~0.1 ms of writes).
        let mut written = 0usize;
        st.subscribers.retain(|(_, q)| {
            match q.push_live(&frames) {
                Ok(Pushed::Written) => {
                    written += 1;
                    if written == WRITES_PER_SAMPLE {
                        m::record_publish_to_writes(born, written);
                        written = 0;
                    }
                    return true;
                }
                Ok(_) => return true,
                Err(_) => {}
            }
            // Still full after coalescing: snapshot-and-reset, the bridge built when the
            // writer comes back (see `Bridges`).
            if q.begin_reset() {
                resets += 1;
                return true;
            }
            q.close(CloseReason::Overflow);
            overflowed += 1;
            false
        });
        let receivers = st.subscribers.len() as u64;
        drop(st);
        if written > 0 {
            m::record_publish_to_writes(born, written);
        }
        if resets > 0 {
            tracing::debug!(%thread, resets, "slow subscribers reset to a snapshot");
            metrics::counter!(m::RESETS, "cause" => "overflow").increment(resets);
        }
        if overflowed > 0 {
            tracing::info!(%thread, overflowed, "slow subscribers disconnected (queue full, no bridge possible)");
            metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Overflow.as_str())
                .increment(overflowed);
        }
        if receivers > 0 {
            for f in &frames {
                metrics::counter!(m::DELIVERED, "type" => f.event_type.as_str())
                    .increment(receivers);
            }
        }
    }

    /// The thread's fold as `{"lastEventId","state","messages","run"}` (SPEC §2 snapshot), from
    /// the hub's fold when the thread is followed here, else rebuilt from the log.
    ///
    /// # Errors
    /// [`LogError::Unavailable`]; `Ok(None)` when the fold cannot be rebuilt (trimmed log
    /// without a checkpoint).
    pub async fn snapshot(&self, thread: &ThreadId) -> Result<Option<Value>, LogError> {
        if let Some(th) = self.shared.threads.get(thread).map(|t| t.clone())
            && th.started.initialized()
        {
            let st = th.state.lock();
            if let (Some(fold), Some(head)) = (&st.fold, st.head) {
                return Ok(Some(snapshot_json(fold, head.epoch, st.cursor)));
            }
        }
        let (head, fold) = load_fold(&*self.shared.log, thread).await?;
        Ok(fold.map(|f| snapshot_json(&f, head.epoch, head.last)))
    }
}

/// Builds the reset bridges of one thread's subscribers (SPEC §5 "Reset"), on the writer's
/// time: from what the connection was last given to the hub's fold at its cursor, under the
/// thread's lock so that every frame fanned out afterwards is newer than the bridge.
struct Bridges {
    /// Weak: the thread hub holds the queues that hold this.
    thread: Weak<ThreadHub>,
}

impl BridgeSource for Bridges {
    fn bridge(&self, queue: &ConnQueue) {
        let built = self.thread.upgrade().is_some_and(|th| {
            let st = th.state.lock();
            let (Some(fold), Some(head), false) = (&st.fold, st.head, st.removed) else {
                return false;
            };
            let Some(client) = queue.client_view() else {
                return false;
            };
            let events = prelude::bridge(&client, fold);
            if events.is_empty() {
                return false;
            }
            let at = |pos| EventId {
                epoch: head.epoch,
                pos,
            };
            // The queue's last position is stable here: a reset queue takes no frame until
            // the bridge is installed.
            queue.install_bridge(Frame::bridge(
                at(queue.last_position()),
                at(st.cursor),
                &events,
                Instant::now(),
                st.view.clone(),
            ));
            true
        });
        tracing::debug!(built, "reset bridge");
        if !built {
            queue.close(CloseReason::Overflow);
            tracing::info!("slow subscriber disconnected (no bridge possible)");
            metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Overflow.as_str())
                .increment(1);
        }
    }
}

fn snapshot_json(fold: &ThreadFold, epoch: crate::log::Epoch, pos: StreamPos) -> Value {
    let last = (pos != StreamPos::ZERO).then(|| EventId { epoch, pos }.to_string());
    let mut run = fold.fold().run().map(|r| r.to_json());
    // A fold rebuilt from a checkpoint (a prelude, SPEC §6) holds the prelude's marked
    // `RUN_STARTED`: the snapshot gives the producer's event, as for an untrimmed thread.
    if let Some(started) = run.as_mut().and_then(|r| r.get_mut("started")) {
        prelude::unmark_prelude(started);
    }
    serde_json::json!({
        "lastEventId": last,
        "state": fold.fold().state(),
        "messages": fold.fold().messages(),
        "run": run,
    })
}

/// Event types that never change the order state (open constructs, run, owners): frames of
/// these share the previous view unless a chunk lane is open (any event may close a lane).
fn keeps_view(t: EventType) -> bool {
    matches!(
        t,
        EventType::TextMessageContent
            | EventType::ToolCallArgs
            | EventType::ReasoningMessageContent
            | EventType::StateDelta
            | EventType::StateSnapshot
            | EventType::Raw
            | EventType::Custom
    )
}

/// Folds one event into the thread's fold (when known) and returns its merge key; updates the
/// shared view when the event changed the order state.
fn fold_event(st: &mut ThreadState, thread: &ThreadId, t: EventType, v: &Value) -> MergeKey {
    let Some(fold) = st.fold.as_mut() else {
        return MergeKey::of(t, v, false, None);
    };
    let lanes_before = !fold.checker().open_lanes().is_empty();
    let (clean, state_after) = match fold.apply_logged(v) {
        Ok(applied) => {
            let failed = applied
                .iter()
                .any(|a| matches!(a, Applied::StateDelta(Err(_))));
            let state = failed.then(|| Arc::new(fold.fold().state().clone()));
            (!failed, state)
        }
        Err(violation) => {
            tracing::warn!(%thread, rule = violation.rule, "log event breaks the AG-UI order rules; not folded");
            (false, Some(Arc::new(fold.fold().state().clone())))
        }
    };
    if !keeps_view(t) || lanes_before || !fold.checker().open_lanes().is_empty() {
        st.view = Some(Arc::new(fold.checker().clone()));
    }
    MergeKey::of(t, v, clean, state_after)
}

/// Reads `(from, until]` from the log into the queue's replay lane, then hands over to live.
async fn replay(
    log: Arc<dyn EventLog>,
    thread: ThreadId,
    from: ReadFrom,
    until: StreamPos,
    queue: Arc<ConnQueue>,
    stop: CancellationToken,
) {
    let mut from = from;
    loop {
        if let ReadFrom::After(id) = from
            && id.pos >= until
        {
            break;
        }
        let page = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            page = log.read(&thread, from, REPLAY_PAGE) => page,
        };
        let entries = match page {
            Ok(entries) => entries,
            Err(LogError::Gap(gap)) => {
                // Trimmed (or recreated) since the subscription was decided: the client comes
                // back with its last id and gets a prelude.
                tracing::info!(%thread, reason = gap.as_str(), "replay range no longer in the log; closing the stream so the client resumes");
                metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Discontinuity.as_str())
                    .increment(1);
                queue.close(CloseReason::Discontinuity);
                return;
            }
            Err(e) => {
                tracing::warn!(%thread, error = %e, "replay read failed; closing the stream so the client resumes");
                metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Backend.as_str())
                    .increment(1);
                queue.close(CloseReason::Backend);
                return;
            }
        };
        let Some(last) = entries.last().map(|e| e.id) else {
            break;
        };
        let born = Instant::now();
        let frames: Vec<Frame> = entries
            .iter()
            .filter(|e| e.id.pos <= until)
            .map(|e| Frame::encode(e, born))
            .collect();
        let full = entries.len() == REPLAY_PAGE;
        if !frames.is_empty() && !queue.push_replay(frames).await {
            return;
        }
        if !full || last.pos >= until {
            break;
        }
        from = ReadFrom::After(last);
    }
    queue.finish_replay();
}
