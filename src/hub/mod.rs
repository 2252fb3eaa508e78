//! The node's fan-out hub: the registry of the threads this node follows, with one reader per
//! thread per node; each event is folded and encoded once, and the shared `Bytes` are pushed
//! into every subscriber's bounded queue without ever waiting for a client.
//!
//! Data path position: `log` → **`hub`** → `queue`. The hub follows a thread through the
//! log's node-wide [`Tail`] while it has local subscribers (PROTOCOL §7: a node reads a thread's
//! log once, however many subscribers follow it), and folds what it fans out into the
//! thread's [`ThreadFold`], so that it can start a client anywhere with a prelude and reset a
//! lagging one with a bridge (PROTOCOL §5).
//!
//! One file per job:
//! - `mod.rs`: the [`Hub`] registry, the per-thread state and its lock, the drain at shutdown;
//! - `subscribe.rs`: registering a subscriber (exact resume or prelude) and unregistering it;
//! - `fanout.rs`: following the tail, folding and encoding each event once, pushing the frames
//!   into the queues, the slow-consumer policy (coalesce, then reset);
//! - `bridge.rs`: the reset bridges a reset queue calls back for (`queue::BridgeSource`);
//! - `encoded.rs`: the prelude and the bridge snapshots at the cursor, encoded once and
//!   shared by every connection that needs them;
//! - `backfill.rs`: the resume read of `(after, c]` from the log into a connection's queue;
//! - `snapshot.rs`: the thread's fold as JSON (`GET /v1/threads/{threadId}/snapshot`);
//! - `ahead.rs`: the values this node parsed at publish, handed to the fan-out so that it does
//!   not parse its own appends again.
//!
//! # Lock order
//!
//! Locks are taken in this order, never the other way round, and none is held across an
//! `.await`:
//!
//! 1. the hub's thread map (a `DashMap` shard of `Shared::threads`): held across a thread
//!    state lock only to remove a thread (`unregister`, a discontinuity) or to list the
//!    subscribers (`drain_streams`);
//! 2. **thread state** (`ThreadHub::state`): cursor, fold, subscriber list. The fan-out holds
//!    it across a whole batch, so registering a subscriber, building a bridge and fanning out
//!    are atomic with respect to each other;
//! 3. **connection queue** (each `ConnQueue`'s own lock): the fan-out, a registration and a
//!    bridge take it while holding the thread state; the backfill and the writer take it
//!    alone;
//! 4. **socket**: a live push may write to the subscriber's socket (`send(2)`) under its
//!    queue's lock.
//!
//! The tail's follow map (`Tail::follow`, `Tail::unfollow`) is a leaf, taken under 1 or 2.
//!
//! One call runs the other way, queue → hub: the reset bridge. A reset queue's writer calls
//! back [`crate::queue::BridgeSource::bridge`] (implemented in `bridge.rs`) on its own time,
//! with no queue lock held; the bridge then takes 2, then 3, like everyone else. The queue
//! only knows the trait, so the module dependency stays one way (`hub` → `queue`).

mod ahead;
mod backfill;
mod bridge;
mod encoded;
mod fanout;
mod snapshot;
mod subscribe;
#[cfg(test)]
mod tests;

pub use subscribe::{Outcome, Start, Subscription, SubscriptionGuard};

use crate::event::ThreadMap;
use crate::event::order::OrderChecker;
use crate::event::{ThreadId, ValidEvent};
use crate::fold::ThreadFold;
use crate::log::{EventId, EventLog, LocalAppends, LogHead, StreamPos, Tail};
use crate::queue::{CloseReason, ConnQueue, QueueLimits};
use parking_lot::Mutex;
use rand::seq::SliceRandom;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, OnceCell, mpsc};
use tokio_util::sync::CancellationToken;

/// Capacity of the channel from the log's tail to the hub's dispatcher, in tail items.
const TAIL_CHANNEL: usize = 1024;

/// Most subscribers of a thread for which a publish fans its batch out itself (see
/// [`LocalAppends`]): the publisher's answer waits for those writes (~1–3 µs each here), and a
/// large fan-out is better left to the dispatcher, which batches the entries that came
/// meanwhile into one push per subscriber.
const INLINE_SUBSCRIBERS: usize = 64;

/// The hub. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

struct Shared {
    log: Arc<dyn EventLog>,
    tail: Arc<dyn Tail>,
    /// The followed threads (lock 1 of the lock order).
    threads: ThreadMap<Arc<ThreadHub>>,
    limits: QueueLimits,
    next_key: AtomicU64,
    shutdown: CancellationToken,
    /// Set when [`Hub::drain_streams`] starts: a subscriber registered after it took its list
    /// is closed at once (see `subscribe`).
    draining: AtomicBool,
    /// Values kept ahead of the fan-out over all threads (`ahead.rs`).
    ahead: Arc<AtomicUsize>,
}

/// One followed thread.
struct ThreadHub {
    /// Set once, by the first subscriber: the head the tail was started from.
    started: OnceCell<()>,
    /// The thread state (lock 2 of the lock order in the module docs).
    state: Mutex<ThreadState>,
    /// Woken when the fan-out moves the cursor off `0-0` (the epoch's first entries): the
    /// backfill of a subscriber reset to an empty epoch's start waits for it (`backfill.rs`).
    first_entries: Notify,
}

/// What the hub knows of one followed thread, under [`ThreadHub::state`].
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
    /// The prelude and bridge snapshots of the fold at `cursor`, encoded once (`encoded.rs`).
    encoded: encoded::Encoded,
    /// Values this node parsed at publish, for entries after `cursor` (`ahead.rs`).
    ahead: ahead::Ahead,
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
                threads: ThreadMap::default(),
                limits,
                next_key: AtomicU64::new(1),
                draining: AtomicBool::new(false),
                shutdown: shutdown.clone(),
                ahead: Arc::new(AtomicUsize::new(0)),
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

    /// Ends every open stream of this node within `drain` (SIGTERM, PROTOCOL §9): the queues are
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

    /// The followed thread's hub, created (not yet started) when the thread is not followed.
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
                        encoded: Default::default(),
                        ahead: ahead::Ahead::new(self.shared.ahead.clone()),
                    }),
                    first_entries: Notify::new(),
                })
            })
            .clone()
    }

    /// The followed thread's hub, if the thread is followed here.
    fn followed(&self, thread: &ThreadId) -> Option<Arc<ThreadHub>> {
        self.shared.threads.get(thread).map(|t| t.clone())
    }
}

/// The publish path's hand-over. A batch appended right after the fan-out's cursor, on a log
/// whose appends are final (the memory log), is fanned out at once from the publish, unless the
/// thread has more than [`INLINE_SUBSCRIBERS`] subscribers here; otherwise its values wait for
/// the fan-out (`ahead.rs`), which then does not parse them again. A map lookup for a thread
/// nobody follows here.
impl LocalAppends for Hub {
    fn appended(
        &self,
        thread: &ThreadId,
        on: Option<LogHead>,
        ids: &[EventId],
        events: &[ValidEvent],
    ) {
        let Some(th) = self.followed(thread) else {
            return;
        };
        let mut st = th.state.lock();
        let Some(head) = st.head.filter(|_| !st.removed) else {
            return;
        };
        if let Some(on) = on
            && on.epoch == head.epoch
            && on.last == st.cursor
            && st.subscribers.len() <= INLINE_SUBSCRIBERS
        {
            self.fan_out_local(&th, st, thread, ids, events);
            return;
        }
        let after = EventId {
            epoch: head.epoch,
            pos: st.cursor,
        };
        for (id, e) in ids.iter().zip(events) {
            st.ahead.keep(after, *id, e);
        }
        drop(st);
        if on.is_some() {
            // A handed-over append: the log did not wake the tail for it.
            self.shared.tail.wake(thread);
        }
    }
}
