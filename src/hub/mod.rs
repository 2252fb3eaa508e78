//! The node's fan-out hub: one reader per thread per node, each event encoded once, shared
//! `Bytes` pushed into every subscriber's bounded queue without ever waiting for a client.
//!
//! Data path position: `log` → **`hub`** → `queue`. The hub follows a thread through the
//! log's node-wide [`Tail`] while it has local subscribers (SPEC §7: a node reads a thread's
//! log once, however many subscribers follow it).
//!
//! Exact resume (SPEC §4.2): a subscriber is registered under the thread's lock together with
//! the hub's cursor `c` (the last position fanned out). Everything after `c` reaches its live
//! lane; its replay task reads `(after, c]` from the log into the replay lane. The queue skips
//! anything at or before the last position written, so the hand-over has no gap and no
//! duplicate, whatever producers do meanwhile.

use crate::event::ThreadId;
use crate::log::{
    EventId, EventLog, LogError, LogHead, ReadFrom, ResumeGap, StreamPos, Tail, TailItem,
};
use crate::metrics as m;
use crate::queue::{CloseReason, ConnQueue, QueueLimits};
use crate::sse::Frame;
use dashmap::DashMap;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::{OnceCell, mpsc};
use tokio_util::sync::CancellationToken;

/// Entries per log read of a replay task.
const REPLAY_PAGE: usize = 512;
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
}

/// How a subscription actually started, for the caller's logs, metrics and stream comments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// As asked.
    Exact,
    /// The id could not be resumed exactly; the stream starts live at the head.
    /// (A later version sends a prelude instead.)
    Unresumable(ResumeGap),
    /// `?from=start` on a trimmed log; the stream starts live at the head.
    StartTrimmed,
}

/// A registered subscriber: its queue, and the guard that unregisters it when dropped.
pub struct Subscription {
    /// The connection's queue (the SSE writer drains it).
    pub queue: Arc<ConnQueue>,
    /// How the subscription started.
    pub outcome: Outcome,
    /// Unregisters on drop; keep it alive as long as the stream.
    pub guard: SubscriptionGuard,
}

/// Unregisters a subscriber (and stops its replay) when dropped.
pub struct SubscriptionGuard {
    hub: Hub,
    thread: ThreadId,
    key: u64,
    replay_stop: CancellationToken,
}

impl Drop for SubscriptionGuard {
    fn drop(&mut self) {
        self.replay_stop.cancel();
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
                let head = self.shared.log.head(thread).await?;
                let mut st = th.state.lock();
                st.head = Some(head);
                st.cursor = head.last;
                self.shared
                    .tail
                    .follow(thread.clone(), head.epoch, head.last);
                Ok::<(), LogError>(())
            })
            .await?;

        // Decide the replay range against the hub's head (cheap checks first; the log read
        // checks trimming and "ahead" against the log itself).
        let (outcome, replay_from) = {
            let st = th.state.lock();
            let head = st
                .head
                .expect("set by the OnceCell above before it completes");
            match start {
                Start::Live => (Outcome::Exact, None),
                Start::FromStart if head.complete_from_start() => {
                    (Outcome::Exact, Some(ReadFrom::Start))
                }
                Start::FromStart => (Outcome::StartTrimmed, None),
                Start::After(id) if id.epoch != head.epoch => {
                    (Outcome::Unresumable(ResumeGap::OtherEpoch), None)
                }
                Start::After(id) => (Outcome::Exact, Some(ReadFrom::After(id))),
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
                // Live subscribers start at the hub's cursor; everything at or before it is old.
                let writer_after = if replay_from.is_some() {
                    after
                } else {
                    st.cursor
                };
                let queue = Arc::new(ConnQueue::new(
                    self.shared.limits,
                    writer_after,
                    replay_from.is_some(),
                ));
                st.subscribers.push((key, queue.clone()));
                Some((queue, st.cursor))
            }
        };
        let Some((queue, replay_until)) = registered else {
            // The last subscriber left between our lookup and now, and this thread hub is no
            // longer the followed one: start over with a fresh one.
            return Box::pin(self.subscribe(thread, start)).await;
        };
        metrics::gauge!(m::CONNECTIONS).increment(1.0);
        if let Some(from) = replay_from {
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
            queue,
            outcome,
            guard: SubscriptionGuard {
                hub: self.clone(),
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
                } => {
                    tracing::warn!(%thread, reason = reason.as_str(), epoch = %head.epoch, "log discontinuity under the tail; disconnecting the thread's subscribers");
                    if let Some(th) = self.shared.threads.get(&thread).map(|t| t.clone()) {
                        let mut st = th.state.lock();
                        st.head = Some(head);
                        st.cursor = head.last;
                        for (_, q) in st.subscribers.drain(..) {
                            q.close(CloseReason::Discontinuity);
                            metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Discontinuity.as_str()).increment(1);
                        }
                    }
                }
            }
        }
    }

    fn fan_out(&self, thread: &ThreadId, entries: &[crate::log::LogEntry]) {
        let Some(th) = self.shared.threads.get(thread).map(|t| t.clone()) else {
            return;
        };
        let born = Instant::now();
        let mut st = th.state.lock();
        let cursor = st.cursor;
        // Encode once per node; the tail may repeat entries after a re-follow, skip those.
        let frames: Vec<Frame> = entries
            .iter()
            .filter(|e| e.id.pos > cursor)
            .map(|e| Frame::encode(e, born))
            .collect();
        let Some(last) = frames.last() else { return };
        st.cursor = last.id.pos;
        if let Some(head) = st.head.as_mut() {
            head.last = last.id.pos;
        }
        let mut overflowed = 0u64;
        st.subscribers.retain(|(_, q)| match q.push_live(&frames) {
            Ok(()) => true,
            Err(_) => {
                q.close(CloseReason::Overflow);
                overflowed += 1;
                false
            }
        });
        let receivers = st.subscribers.len() as u64;
        drop(st);
        if overflowed > 0 {
            tracing::info!(%thread, overflowed, "slow subscribers disconnected (queue full)");
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
