//! Registering a subscriber of a thread (PROTOCOL §4): where its stream starts (an exact resume
//! with a backfill, or a prelude of the fold at the hub's cursor), and unregistering it when
//! its stream ends.
//!
//! Exact resume (PROTOCOL §4.2): a subscriber is registered under the thread's lock together with
//! the hub's cursor `c` (the last position fanned out). Everything after `c` reaches its live
//! buffer; its backfill reads `(after, c]` from the log (`backfill.rs`). The queue skips
//! anything at or before the last position written, so the hand-over has no gap and no
//! duplicate, whatever producers do meanwhile.
//!
//! A new connection, or a `Last-Event-ID` that cannot be resumed exactly, gets a prelude of
//! the fold at `c`, built under the same lock (PROTOCOL §4.3, §4.4). An id of another epoch,
//! when the current epoch's log is complete from its start, gets the whole epoch instead: a
//! prelude at its first event (built by the backfill), then every later event (PROTOCOL §4.3).
//! An id the log never held in its epoch (a tail a failover rolled back) gets a prelude at the
//! fork point, the last entry the log holds at or before it, then every later event: nothing
//! the log holds after the fork is skipped.
//!
//! Never from a fold the log does not stand for: when the log's answer to a subscribe shows the
//! thread hub behind the log's truth (another epoch, or the hub's cursor at a position the
//! log does not hold: Redis lost its data, or a failover rolled back the tail this node
//! fanned out) before its tail noticed, the thread hub is retired and the subscriber starts
//! on a fresh one rebuilt from the log.

use super::backfill::Opening;
use super::bridge::Bridges;
use super::{Hub, ThreadHub};
use crate::event::ThreadId;
use crate::fold::load_fold;
use crate::log::{Epoch, EventId, LogError, LogHead, ReadFrom, ResumeGap, StreamPos};
use crate::metrics as m;
use crate::queue::Frame;
use crate::queue::{CloseReason, ConnQueue};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;

/// Where a new subscription starts (PROTOCOL §2, §4).
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
    /// The id is one the log does not hold in its epoch ([`ResumeGap::Unknown`], or
    /// [`ResumeGap::Ahead`]: a tail a failover rolled back): a prelude at the fork point (the
    /// last entry the log holds at or before the id; the epoch's first event when it holds
    /// none), then every later event, so nothing the log holds is skipped (PROTOCOL §4.3).
    ForkPoint(ResumeGap),
    /// The id is of another epoch (the log was recreated) and the current epoch's log is
    /// complete from its start: a prelude at the epoch's first event, then every later event,
    /// so nothing the log holds is skipped (PROTOCOL §4.3).
    EpochStart,
}

/// What [`Hub::decide`] found.
enum Decided {
    /// Start as decided, with the backfill's start (`None`: a prelude at the hub's cursor).
    Start(Outcome, Option<ReadFrom>),
    /// The thread hub's fold does not stand for the log (the log's `head` is of another
    /// epoch, or behind the hub's cursor, or does not hold it): retire the thread hub and
    /// decide again on a fresh one.
    Stale(LogHead, ResumeGap),
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

/// Unregisters a subscriber (and stops its backfill) when dropped.
pub struct SubscriptionGuard {
    hub: Hub,
    queue: Arc<ConnQueue>,
    thread: ThreadId,
    key: u64,
    /// Stops the subscriber's backfill task; `None` when it has none (most subscribers: a
    /// child token is an allocation and an entry in the shutdown token's list per
    /// connection).
    backfill_stop: Option<CancellationToken>,
}

impl Drop for SubscriptionGuard {
    fn drop(&mut self) {
        if let Some(stop) = &self.backfill_stop {
            stop.cancel();
        }
        // Closing frees what is queued and wakes a backfill waiting for room.
        self.queue.close(CloseReason::Shutdown);
        self.hub.unregister(&self.thread, self.key);
    }
}

/// A subscriber just registered under the thread's lock.
struct Registered {
    queue: Arc<ConnQueue>,
    /// The hub's cursor at registration: a backfill reads up to it, live frames follow it.
    cursor: StreamPos,
    prelude: Option<Frame>,
    fold_known: bool,
    epoch: Option<Epoch>,
}

impl Hub {
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
        let loaded = self.start_following(&th, thread).await?;
        let (outcome, backfill_from) = match self.decide(&th, thread, start, loaded).await? {
            Decided::Start(outcome, backfill_from) => (outcome, backfill_from),
            Decided::Stale(head, reason) => {
                // The tail has not reported it yet (it will, to a thread hub that is gone
                // by then, or to a fresh one, which ignores it, see `discontinuity`).
                self.retire(thread, &th, head, reason);
                return Box::pin(self.subscribe(thread, start)).await;
            }
        };

        let key = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        let Some(registered) = self.register(&th, key, outcome, backfill_from) else {
            // The last subscriber left between our lookup and now, and this thread hub is no
            // longer the followed one: start over with a fresh one.
            return Box::pin(self.subscribe(thread, start)).await;
        };
        let Registered {
            queue,
            cursor,
            prelude,
            fold_known,
            epoch,
        } = registered;
        metrics::gauge!(m::CONNECTIONS).increment(1.0);
        if self.shared.draining.load(Ordering::SeqCst) {
            // Registered after the drain took its list of streams (the subscribe passed the
            // node's draining check before SIGTERM, then waited for the log): end it now, with
            // its jittered `retry:`, rather than let it outlive the drain.
            queue.close(CloseReason::Shutdown);
        }
        let backfill_stop = backfill_from.map(|from| {
            let stop = self.shared.shutdown.child_token();
            let opening = match (outcome, from) {
                (Outcome::EpochStart, _) => Opening::EpochStart(th.clone()),
                (Outcome::ForkPoint(_), ReadFrom::Start) => Opening::EpochStart(th.clone()),
                (Outcome::ForkPoint(_), ReadFrom::After(fork)) => Opening::ForkPoint(fork),
                _ => Opening::Plain,
            };
            self.spawn_backfill(
                thread,
                from,
                epoch,
                cursor,
                queue.clone(),
                stop.clone(),
                opening,
            );
            stop
        });
        Ok(Subscription {
            queue: queue.clone(),
            outcome,
            prelude,
            fold_known,
            guard: SubscriptionGuard {
                hub: self.clone(),
                queue,
                thread: thread.clone(),
                key,
                backfill_stop,
            },
        })
    }

    /// Loads the thread's fold and starts the tail after its head, once per thread hub (the
    /// first subscriber does it; the others wait for it). True when this call loaded it (the
    /// fold is the log's as of now).
    async fn start_following(&self, th: &ThreadHub, thread: &ThreadId) -> Result<bool, LogError> {
        let mut loaded = false;
        th.started
            .get_or_try_init(|| async {
                loaded = true;
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
        Ok(loaded)
    }

    /// Decides how the subscription starts, and the backfill's start when it resumes exactly
    /// or from the epoch's start (`None`: a prelude at the hub's cursor); or finds the thread
    /// hub stale.
    ///
    /// A resume asks the log itself
    /// ([`EventLog::check_resume`](crate::log::EventLog::check_resume), one round trip:
    /// trimmed, ahead, another epoch, a position it does not hold) and compares the answer's
    /// head with the hub's: the hub's cached head sees neither trimming nor a recreated log
    /// until its tail reports them. `?from=start` does the same with the log's head. A fresh
    /// connection (no id, or one inside a bridge) gets a prelude of the hub's fold, so the log
    /// is asked first whether it still holds the hub's cursor in the hub's epoch (one round
    /// trip, skipped when this subscribe just `loaded` the fold from the log).
    ///
    /// An id the log does not hold in its epoch forks ([`Outcome::ForkPoint`]): at the hub's
    /// cursor, the hub's prelude is the fork's; elsewhere the backfill rebuilds the fold at
    /// the fork from the log (from its start, or its checkpoint when that is at or before the
    /// fork; otherwise a prelude at the hub's cursor, as before).
    async fn decide(
        &self,
        th: &ThreadHub,
        thread: &ThreadId,
        start: Start,
        loaded: bool,
    ) -> Result<Decided, LogError> {
        let (hub_head, hub_cursor) = {
            let st = th.state.lock();
            let head = st
                .head
                .expect("set by the OnceCell of start_following before it completes");
            (head, st.cursor)
        };
        let hub_at = EventId {
            epoch: hub_head.epoch,
            pos: hub_cursor,
        };
        // The log's head is read after the hub's cursor, and a log's `last` only grows within
        // an epoch: another epoch, or a cursor past the log's newest entry, means the log lost
        // what the hub folded.
        let stale = |head: LogHead| {
            if head.epoch != hub_head.epoch {
                Some(Decided::Stale(head, ResumeGap::OtherEpoch))
            } else if hub_cursor > head.last {
                Some(Decided::Stale(head, ResumeGap::Ahead))
            } else {
                None
            }
        };
        // A prelude of the hub's fold needs the log to hold the hub's cursor (a trimmed one is
        // an old fold, not a wrong one: the tail resets to the head when it finds it).
        let hub_held = |verdict: Result<(), ResumeGap>, head: LogHead| match verdict {
            Err(gap) if gap != ResumeGap::Trimmed => Some(Decided::Stale(head, gap)),
            _ => None,
        };
        let decided = match start {
            Start::Live | Start::InsideBridge(_) => {
                if !loaded {
                    // The tail may not have noticed a lost epoch or a rollback yet.
                    let check = self.shared.log.check_resume(thread, hub_at).await?;
                    if let Some(stale) = stale(check.head).or(hub_held(check.verdict, check.head)) {
                        return Ok(stale);
                    }
                }
                match start {
                    Start::InsideBridge(_) => {
                        Decided::Start(Outcome::Unresumable(ResumeGap::InsideBridge), None)
                    }
                    _ => Decided::Start(Outcome::Exact, None),
                }
            }
            Start::FromStart => {
                let head = self.shared.log.head(thread).await?;
                if let Some(stale) = stale(head) {
                    return Ok(stale);
                }
                if head.complete_from_start() {
                    Decided::Start(Outcome::Exact, Some(ReadFrom::Start))
                } else {
                    Decided::Start(Outcome::StartTrimmed, None)
                }
            }
            Start::After(id) => {
                let check = self.shared.log.check_resume(thread, id).await?;
                if let Some(stale) = stale(check.head) {
                    return Ok(stale);
                }
                match check.verdict {
                    Ok(()) => Decided::Start(Outcome::Exact, Some(ReadFrom::After(id))),
                    Err(ResumeGap::OtherEpoch) if check.head.complete_from_start() => {
                        Decided::Start(Outcome::EpochStart, Some(ReadFrom::Start))
                    }
                    Err(gap) => {
                        // A prelude of the hub's fold (or a backfill handing over to it): only
                        // if the log holds the hub's cursor (at the log's head it does;
                        // otherwise one more look, on this path only).
                        if hub_cursor != check.head.last
                            && let Some(stale) = hub_held(
                                self.shared.log.check_resume(thread, hub_at).await?.verdict,
                                check.head,
                            )
                        {
                            return Ok(stale);
                        }
                        match check.fork {
                            Some(fork) => {
                                self.fork(thread, check.head, fork, hub_cursor, gap).await?
                            }
                            None => Decided::Start(Outcome::Unresumable(gap), None),
                        }
                    }
                }
            }
        };
        Ok(decided)
    }

    /// How a resume from an id the log does not hold in its epoch starts, given the check's
    /// `fork` (`ResumeCheck::fork`): at the hub's cursor, with the hub's prelude; at the
    /// epoch's start (nothing held before the id, the log complete from its start), as for an
    /// id of another epoch; elsewhere, a backfill from the fork when the log can fold up to it
    /// (complete from its start, or a checkpoint at or before it); else a prelude at the hub's
    /// cursor ([`Outcome::Unresumable`]).
    async fn fork(
        &self,
        thread: &ThreadId,
        head: LogHead,
        fork: StreamPos,
        hub_cursor: StreamPos,
        gap: ResumeGap,
    ) -> Result<Decided, LogError> {
        let outcome = Outcome::ForkPoint(gap);
        if fork == hub_cursor && fork != StreamPos::ZERO {
            return Ok(Decided::Start(outcome, None));
        }
        if fork == StreamPos::ZERO && head.complete_from_start() {
            return Ok(Decided::Start(outcome, Some(ReadFrom::Start)));
        }
        let foldable = head.complete_from_start()
            || self
                .shared
                .log
                .checkpoint(thread)
                .await?
                .is_some_and(|ckpt| ckpt.pos <= fork);
        if foldable && fork != StreamPos::ZERO {
            let at = EventId {
                epoch: head.epoch,
                pos: fork,
            };
            return Ok(Decided::Start(outcome, Some(ReadFrom::After(at))));
        }
        Ok(Decided::Start(Outcome::Unresumable(gap), None))
    }

    /// Registers the subscriber's new queue under the thread's lock, with a prelude of the fold
    /// at the cursor unless it resumes exactly or from a backfill. `None` when the thread hub
    /// was removed meanwhile (its last subscriber left).
    fn register(
        &self,
        th: &Arc<ThreadHub>,
        key: u64,
        outcome: Outcome,
        backfill_from: Option<ReadFrom>,
    ) -> Option<Registered> {
        let mut st = th.state.lock();
        if st.removed {
            return None;
        }
        let after = match (outcome, backfill_from) {
            // The backfill's first frame is the prelude at the fork, which carries its id.
            (Outcome::ForkPoint(_), _) => StreamPos::ZERO,
            (_, Some(ReadFrom::After(id))) => id.pos,
            _ => StreamPos::ZERO,
        };
        // Other subscribers start at the hub's cursor with a prelude of the fold there;
        // everything at or before it is old.
        let (writer_after, prelude, view) = if backfill_from.is_some() {
            (after, None, None)
        } else {
            // Encoded once per position: every subscriber starting here shares its bytes.
            let prelude = st.encoded_prelude();
            (st.cursor, prelude, st.view.clone())
        };
        let queue = Arc::new(ConnQueue::new(
            self.shared.limits,
            writer_after,
            backfill_from.is_some(),
            view,
        ));
        queue.set_bridge_source(Arc::new(Bridges {
            thread: Arc::downgrade(th),
        }));
        st.subscribers.push((key, queue.clone()));
        Some(Registered {
            queue,
            cursor: st.cursor,
            prelude,
            fold_known: st.fold.is_some(),
            epoch: st.head.map(|h| h.epoch),
        })
    }

    /// Unregisters a subscriber; the thread is no longer followed once its last subscriber
    /// left.
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
}
