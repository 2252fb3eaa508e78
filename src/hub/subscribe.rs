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
//! the fold at `c`, built under the same lock (PROTOCOL §4.3, §4.4).

use super::bridge::Bridges;
use super::{Hub, ThreadHub};
use crate::event::ThreadId;
use crate::fold::load_fold;
use crate::fold::prelude;
use crate::log::{Epoch, EventId, LogError, ReadFrom, ResumeGap, StreamPos};
use crate::metrics as m;
use crate::queue::Frame;
use crate::queue::{CloseReason, ConnQueue};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
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
    backfill_stop: CancellationToken,
}

impl Drop for SubscriptionGuard {
    fn drop(&mut self) {
        self.backfill_stop.cancel();
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
        self.start_following(&th, thread).await?;
        let (outcome, backfill_from) = self.decide(&th, thread, start).await?;

        let key = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        let backfill_stop = self.shared.shutdown.child_token();
        let Some(registered) = self.register(&th, key, backfill_from) else {
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
        if let Some(from) = backfill_from {
            self.spawn_backfill(
                thread,
                from,
                epoch,
                cursor,
                queue.clone(),
                backfill_stop.clone(),
            );
        }
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
    /// first subscriber does it; the others wait for it).
    async fn start_following(&self, th: &ThreadHub, thread: &ThreadId) -> Result<(), LogError> {
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
        Ok(())
    }

    /// Decides how the subscription starts, and the backfill's start when it resumes exactly
    /// (`None`: a prelude at the hub's cursor).
    async fn decide(
        &self,
        th: &ThreadHub,
        thread: &ThreadId,
        start: Start,
    ) -> Result<(Outcome, Option<ReadFrom>), LogError> {
        // Decide the backfill range against the hub's head (cheap checks first; the log read
        // checks trimming and "ahead" against the log itself).
        // `?from=start` asks the log itself whether it is still complete: the hub's cached
        // head does not see trimming.
        let complete = match start {
            Start::FromStart => self.shared.log.head(thread).await?.complete_from_start(),
            _ => false,
        };
        let (outcome, backfill_from) = {
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
        Ok(match backfill_from {
            Some(ReadFrom::After(id)) => {
                match self.shared.log.read(thread, ReadFrom::After(id), 0).await {
                    Ok(_) => (outcome, Some(ReadFrom::After(id))),
                    Err(LogError::Gap(gap)) => (Outcome::Unresumable(gap), None),
                    Err(e) => return Err(e),
                }
            }
            other => (outcome, other),
        })
    }

    /// Registers the subscriber's new queue under the thread's lock, with a prelude of the fold
    /// at the cursor unless it resumes exactly. `None` when the thread hub was removed
    /// meanwhile (its last subscriber left).
    fn register(
        &self,
        th: &Arc<ThreadHub>,
        key: u64,
        backfill_from: Option<ReadFrom>,
    ) -> Option<Registered> {
        let mut st = th.state.lock();
        if st.removed {
            return None;
        }
        let after = match backfill_from {
            Some(ReadFrom::After(id)) => id.pos,
            _ => StreamPos::ZERO,
        };
        // Other subscribers start at the hub's cursor with a prelude of the fold there;
        // everything at or before it is old.
        let (writer_after, prelude, view) = if backfill_from.is_some() {
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
