//! The per-connection bounded queue between the hub and a subscriber's stream writer
//! (PROTOCOL §5).
//!
//! Data path position: `hub` → **`queue`** → `stream`. Two buffers:
//! - the **backfill buffer**, filled by the hub's backfill of a resume with the log pages it
//!   read; that task waits for room (it is the only producer that may wait);
//! - the **live buffer**, filled by the hub's fan-out, which never waits: a push that would go
//!   over `max_events` or `max_bytes` fails and the hub applies its slow-consumer policy
//!   (coalesce, then reset).
//!
//! The writer drains the backfill buffer first, then the live buffer, and skips any frame at or
//! before the last position it wrote, which makes the backfill → live hand-over exact.
//!
//! What the writer takes is a [`Batch`] of the frames themselves: the `Bytes` every
//! subscriber of the thread shares, written with one vectored write, never copied into a
//! buffer of the connection's own.
//!
//! Beside the queue: `frame.rs` ([`Frame`], the queue's item), `batch.rs` ([`Batch`], what a
//! writer takes), [`coalesce`](mod@coalesce) (the pure merge rules), `reset.rs` (an
//! overflow's snapshot-and-reset, [`BridgeSource`], and the count of what it skipped),
//! `bridge.rs` ([`Bridge`], the reset's events as shared chunks) and `direct.rs` (the fan-out
//! writing a frame through the writer's [`Sink`] itself). The lock discipline is on
//! [`ConnQueue`].

mod batch;
mod bridge;
pub mod coalesce;
mod direct;
mod frame;
mod reset;

pub use batch::Batch;
pub use bridge::{Bridge, BridgePart, SharedEvents};
pub use coalesce::MergeKey;
pub use direct::Sink;
pub use frame::Frame;
pub use reset::{BridgeSource, ResetCause, Skipped};

use crate::event::order::OrderChecker;
use crate::log::StreamPos;
use bytes::Bytes;
use coalesce::coalesce;
use futures::task::AtomicWaker;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::Notify;

/// Events pending in all connection queues of this process (for the queue-depth gauge).
static PENDING_EVENTS: AtomicI64 = AtomicI64::new(0);

/// Events currently pending in all connection queues of this process.
pub fn pending_events() -> i64 {
    PENDING_EVENTS.load(Ordering::Relaxed)
}

/// Queues of this process with a reset waiting for its writer (for the resets-pending gauge).
static PENDING_RESETS: AtomicI64 = AtomicI64::new(0);

/// Connections of this process reset for overflow whose writer has not come back for its
/// bridge yet (subscribers that stopped reading).
pub fn pending_resets() -> i64 {
    PENDING_RESETS.load(Ordering::Relaxed)
}

/// Bounds of one connection's live buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Most frames pending.
    pub max_events: usize,
    /// Most bytes of frames pending.
    pub max_bytes: usize,
}

/// Why a queue was closed. The writer ends the stream at once; pending frames are dropped,
/// since the client resumes from the last id it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The live buffer overflowed (slow subscriber).
    Overflow,
    /// The log lost continuity under the tail (recreated or trimmed past the node's position).
    Discontinuity,
    /// Reading the log for a backfill failed (backend unavailable).
    Backend,
    /// The node is shutting down.
    Shutdown,
    /// An operator closed the connection (`DELETE /v1/connections/{id}`, PROTOCOL §12); the
    /// client reconnects with its `Last-Event-ID`.
    Admin,
}

impl CloseReason {
    /// Metric label (`agui_disconnects_total{cause}`).
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Overflow => "overflow",
            CloseReason::Discontinuity => "discontinuity",
            CloseReason::Backend => "backend",
            CloseReason::Shutdown => "shutdown",
            CloseReason::Admin => "admin",
        }
    }

    /// A comment the writer sends before ending the stream, if any.
    pub fn final_words(self) -> Option<&'static str> {
        match self {
            CloseReason::Overflow => Some("agui-fanout: subscriber too slow, reconnect"),
            CloseReason::Discontinuity => Some("agui-fanout: log discontinuity, reconnect"),
            CloseReason::Backend => Some("agui-fanout: log backend unavailable, reconnect"),
            CloseReason::Shutdown => None,
            CloseReason::Admin => Some("agui-fanout: closed by an operator, reconnect"),
        }
    }
}

/// What [`ConnQueue::next_batch`] yields.
#[derive(Debug)]
pub enum Drained {
    /// Every frame that was ready (a pending reset's bridge first), for one write.
    Frames(Batch),
    /// The queue was closed; nothing more will come.
    Closed(CloseReason),
}

/// What a live push that fitted did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Written to the socket at once (nothing was pending, the writer idle).
    Written,
    /// Queued for the writer.
    Queued,
    /// Dropped: the queue is closed, or reset and waiting for its writer (whose bridge stands
    /// for the frame).
    Dropped,
}

/// A push into the live buffer that did not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overflow;

/// One connection's queue. Shared (`Arc`) by the hub, the backfill task and the writer.
///
/// # Lock discipline
/// One `parking_lot::Mutex` per connection (`inner`), held only to move `Bytes` handles and
/// flags, never across an `.await`. Lock order: the hub's thread state → this queue's lock →
/// the socket: a direct write (`direct.rs`) calls [`Sink::send`] under this lock, so that
/// it cannot interleave with the writer's own writes. Nothing else is called under it: the
/// writer is woken and the backfill task notified after it is dropped, and a
/// [`BridgeSource`] is called without it (it takes the thread's lock, then this one). The
/// writer is the only consumer, so it waits on an `AtomicWaker` (one atomic swap per push)
/// rather than a `Notify`, whose waiter list takes a lock at every poll and drop.
pub struct ConnQueue {
    inner: Mutex<Inner>,
    /// Wakes the writer (its only consumer). A wake before the writer registered is not
    /// lost: the writer registers, then looks at the buffers.
    writer: AtomicWaker,
    /// Wakes the backfill task waiting for room.
    backfill_room: Notify,
    limits: QueueLimits,
}

/// What [`ConnQueue`]'s lock guards.
struct Inner {
    /// The order state after the last frame the writer took (what the client has), when
    /// known; the base of a reset bridge.
    client_view: Option<Arc<OrderChecker>>,
    backfill: VecDeque<Frame>,
    /// The backfill task is done (or there was none): the live buffer may be drained.
    backfill_done: bool,
    live: VecDeque<Frame>,
    live_bytes: usize,
    /// The leading frames of `live` a compaction already coalesced (no two neighbours among
    /// them merge): the next compaction starts at the last of them. Meaningful while `live`
    /// is not empty; a push into an empty `live` sets it back to 0.
    compacted: usize,
    /// Last position written to the client; frames at or before it are skipped.
    last: StreamPos,
    /// A reset bridge not yet taken by the writer; it goes out before the live buffer, which
    /// holds only newer frames. Not counted against the bounds (its size is the thread's
    /// fold, not the backlog). Boxed: it is rare, and inline it made every queue larger by
    /// its size (idle memory per subscriber).
    bridge: Option<Box<Bridge>>,
    /// What resets dropped that no snapshot restates, since the writer last took a bridge
    /// (the next bridge's gap event tells the client, PROTOCOL §5 "Reset").
    skipped: Skipped,
    /// The live buffer overflowed and was dropped ([`ConnQueue::begin_reset`]): pushes are
    /// dropped until the writer has the bridge built ([`BridgeSource`]).
    reset_pending: bool,
    /// Resets begun on this queue ([`ConnQueue::resets`]).
    resets: u32,
    /// Builds this queue's reset bridges; `None`: an overflow cannot be reset (the hub then
    /// closes the queue).
    bridges: Option<Arc<dyn BridgeSource>>,
    closed: Option<CloseReason>,
    /// The subscriber's socket, when its writer writes to the raw socket (see
    /// [`ConnQueue::attach_sink`]): the hub may then write a frame itself.
    sink: Option<Arc<dyn Sink>>,
    /// The sink's descriptor ([`Sink::raw_fd`]), set and cleared with `sink`.
    sink_fd: Option<std::os::fd::RawFd>,
    /// The writer holds bytes it took and has not finished writing (or is writing a
    /// heartbeat): nobody else may write to the socket meanwhile.
    writer_busy: bool,
    /// The rest of a frame the hub wrote only partly: it goes out before anything else.
    partial: Option<Bytes>,
}

impl ConnQueue {
    /// A queue whose writer starts after `after` (the client's last position, or ZERO).
    /// With `backfill` true the live buffer is held back until [`ConnQueue::finish_backfill`].
    /// `view` is the client's order state at `after` when known (after a prelude).
    pub fn new(
        limits: QueueLimits,
        after: StreamPos,
        backfill: bool,
        view: Option<Arc<OrderChecker>>,
    ) -> Self {
        ConnQueue {
            inner: Mutex::new(Inner {
                client_view: view,
                backfill: VecDeque::new(),
                backfill_done: !backfill,
                live: VecDeque::new(),
                live_bytes: 0,
                compacted: 0,
                last: after,
                bridge: None,
                skipped: Skipped::default(),
                reset_pending: false,
                resets: 0,
                bridges: None,
                closed: None,
                sink: None,
                sink_fd: None,
                writer_busy: false,
                partial: None,
            }),
            writer: AtomicWaker::new(),
            backfill_room: Notify::new(),
            limits,
        }
    }

    /// Asks the CPU to bring this queue's lock and state into its cache, without waiting for
    /// them (a hint; nothing on targets other than x86-64). The hub calls it for every
    /// subscriber of a thread before it pushes to any: with many threads each queue is a
    /// cache miss, and misses asked for together overlap instead of following one another.
    #[inline]
    pub fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let start = std::ptr::from_ref(&self.inner).cast::<i8>();
            for offset in (0..size_of::<Mutex<Inner>>()).step_by(64) {
                // SAFETY: `prefetcht0` is a hint: it never faults and changes no memory or
                // register the program sees, whatever the address (this one is inside `self`).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
            }
        }
    }

    /// The live buffer's bounds.
    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// Appends frames to the live buffer without waiting, or writes a single frame to the socket
    /// at once (see [`ConnQueue::attach_sink`]). When they do not fit, the buffer is coalesced
    /// first (PROTOCOL §5: a subscriber that is behind gets its pending deltas merged).
    ///
    /// A frame written at once is not counted in `agui_publish_to_write_seconds` here: the
    /// caller counts its [`Pushed::Written`] pushes in groups (one clock read per group).
    ///
    /// # Errors
    /// [`Overflow`] when even the coalesced buffer exceeds a bound. The buffer then holds an
    /// equivalent but unspecified mix of old and new frames: the caller must
    /// [`ConnQueue::begin_reset`] or [`ConnQueue::close`] the queue.
    pub fn push_live(&self, frames: &[Frame]) -> Result<Pushed, Overflow> {
        let added = frames.len() as i64;
        let result = {
            let mut q = self.inner.lock();
            // Closed, or reset pending: the bridge the writer will get stands for these frames
            // (and its gap event counts those it cannot restate).
            if q.closed.is_some() {
                return Ok(Pushed::Dropped);
            }
            if q.reset_pending {
                let last = q.last;
                q.skipped.count(frames, last);
                return Ok(Pushed::Dropped);
            }
            if let [frame] = frames
                && q.write_direct(frame)
            {
                let partly = q.partial.is_some();
                drop(q);
                if partly {
                    self.writer.wake();
                }
                return Ok(Pushed::Written);
            }
            let bytes: usize = frames.iter().map(|f| f.bytes.len()).sum();
            if q.live.is_empty() {
                q.compacted = 0;
            }
            q.live.extend(frames.iter().cloned());
            q.live_bytes += bytes;
            PENDING_EVENTS.fetch_add(added, Ordering::Relaxed);
            if self.over_bounds(&q) {
                compact(&mut q);
            }
            if self.over_bounds(&q) {
                Err(Overflow)
            } else {
                Ok(Pushed::Queued)
            }
        };
        if result.is_ok() {
            self.writer.wake();
        }
        result
    }

    /// What the live buffer holds now, as `(frames, bytes)`, a pending reset bridge included
    /// as one frame (so this can exceed [`QueueLimits`] by one bridge). The backfill buffer is
    /// not counted (it is bounded by the backfill task waiting for room). Read-only, for tests
    /// and diagnostics.
    pub fn pending(&self) -> (usize, usize) {
        let q = self.inner.lock();
        let bridge = q.bridge.as_ref().map_or(0, |b| b.batch.len());
        (
            q.live.len() + usize::from(q.bridge.is_some()),
            q.live.iter().map(|f| f.bytes.len()).sum::<usize>() + bridge,
        )
    }

    /// Whether the live buffer exceeds a bound (a pending bridge is not counted).
    fn over_bounds(&self, q: &Inner) -> bool {
        q.live.len() > self.limits.max_events || q.live_bytes > self.limits.max_bytes
    }

    /// How many resets (PROTOCOL §5 "Reset") this connection went through: overflows, and the
    /// node's tail falling behind the log's retention. For the admin API (PROTOCOL §12).
    pub fn resets(&self) -> u32 {
        self.inner.lock().resets
    }

    /// The position of the last frame taken by the writer or written at once (or where the
    /// queue started): the client's last id, within the thread's current epoch.
    pub fn last_position(&self) -> StreamPos {
        self.inner.lock().last
    }

    /// The order state after the last frame taken by the writer (the client's view), if
    /// known.
    pub fn client_view(&self) -> Option<Arc<OrderChecker>> {
        self.inner.lock().client_view.clone()
    }

    /// Appends frames the backfill read from the log, waiting while the backfill buffer holds
    /// `max_events / 2` or more. Returns `false` if the queue was closed (stop the backfill).
    pub async fn push_backfill(&self, frames: Vec<Frame>) -> bool {
        let high_water = (self.limits.max_events / 2).max(1);
        loop {
            let room = self.backfill_room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut q = self.inner.lock();
                if q.closed.is_some() {
                    return false;
                }
                if q.backfill.len() < high_water {
                    let n = frames.len() as i64;
                    q.backfill.extend(frames);
                    drop(q);
                    PENDING_EVENTS.fetch_add(n, Ordering::Relaxed);
                    self.writer.wake();
                    return true;
                }
            }
            room.await;
        }
    }

    /// Marks the backfill done: the writer moves on to the live buffer.
    pub fn finish_backfill(&self) {
        self.inner.lock().backfill_done = true;
        self.writer.wake();
    }

    /// Closes the queue; the writer ends the stream at its next wake-up. The first reason wins.
    pub fn close(&self, reason: CloseReason) {
        {
            let mut q = self.inner.lock();
            if q.closed.is_some() {
                return;
            }
            q.closed = Some(reason);
            let dropped = (q.backfill.len()
                + q.live.len()
                + usize::from(q.reset_pending)
                + usize::from(q.bridge.is_some())) as i64;
            q.bridge = None;
            if q.reset_pending {
                q.reset_pending = false;
                PENDING_RESETS.fetch_sub(1, Ordering::Relaxed);
            }
            q.backfill.clear();
            q.live.clear();
            q.live_bytes = 0;
            PENDING_EVENTS.fetch_sub(dropped, Ordering::Relaxed);
        }
        self.writer.wake();
        self.backfill_room.notify_one();
    }

    /// Pending frames at which a write counts as "behind" and is coalesced: half of
    /// `max_events` (at least 2). A batch published at once is not a lagging subscriber: a
    /// subscriber that keeps up gets every event as published (PROTOCOL §5).
    fn coalesce_from(&self) -> usize {
        (self.limits.max_events / 2).max(2)
    }

    /// True once closed.
    pub fn is_closed(&self) -> bool {
        self.inner.lock().closed.is_some()
    }

    /// Waits until frames are ready or the queue is closed, then takes every ready frame.
    pub async fn next_batch(&self) -> Drained {
        std::future::poll_fn(|cx| self.poll_batch(cx)).await
    }

    /// Polls for the next batch: every ready frame, or the close reason. Registers `cx`'s
    /// waker before looking, so a push racing with this poll wakes the writer again.
    pub fn poll_batch(&self, cx: &mut Context<'_>) -> Poll<Drained> {
        self.writer.register(cx.waker());
        match self.try_drain() {
            Some(d) => Poll::Ready(d),
            None => Poll::Pending,
        }
    }

    /// Takes every ready frame without waiting; `None` when there is nothing to do. A pending
    /// reset has its bridge built first (by the [`BridgeSource`], on this caller's time) and
    /// goes out first. The frames are handed over as they are (shared `Bytes`), never copied
    /// into one buffer: a thousand connections that resume at once hold references to the
    /// same frames, not a thousand copies of them.
    pub fn try_drain(&self) -> Option<Drained> {
        self.build_pending_bridge();
        let mut taken: Vec<Frame> = Vec::new();
        let mut single: Option<Frame> = None;
        let mut bridge: Option<Box<Bridge>> = None;
        let mut told = Skipped::default();
        let mut skipped = 0i64;
        let from_backfill;
        {
            let mut q = self.inner.lock();
            if let Some(rest) = q.partial.take() {
                // The rest of a frame the hub started: before anything, even the close.
                q.writer_busy = true;
                return Some(Drained::Frames(Batch::one(rest)));
            }
            if let Some(reason) = q.closed {
                return Some(Drained::Closed(reason));
            }
            from_backfill = !q.backfill.is_empty();
            if !from_backfill && q.backfill_done {
                // A bridge exists only once the backfill is done (see `begin_reset`).
                bridge = q.bridge.take();
                if bridge.is_some() {
                    // Its gap event tells the client what the resets skipped.
                    told = std::mem::take(&mut q.skipped);
                }
            }
            let buffered = if from_backfill {
                q.backfill.len()
            } else if q.backfill_done {
                q.live.len()
            } else {
                0
            };
            if buffered == 0 && bridge.is_none() {
                return None;
            }
            let mut last = q.last;
            if let Some(b) = &bridge {
                last = b.id.pos;
                q.client_view = b.view.clone();
            }
            let buffer = if from_backfill {
                &mut q.backfill
            } else {
                &mut q.live
            };
            if buffered == 1 && bridge.is_none() {
                // The common case of a subscriber that keeps up: no batch vector.
                match buffer.pop_front() {
                    Some(f) if f.id.pos > last => {
                        last = f.id.pos;
                        single = Some(f);
                    }
                    _ => skipped += 1,
                }
            } else {
                taken.reserve(buffered);
                for f in buffer.drain(..) {
                    if f.id.pos > last {
                        last = f.id.pos;
                        taken.push(f);
                    } else {
                        skipped += 1;
                    }
                }
            }
            q.last = last;
            if let Some(f) = single.as_ref().or(taken.last()) {
                // Backfilled frames carry no view: the client's view is then unknown.
                q.client_view = f.view.clone();
            }
            if !from_backfill {
                q.live_bytes = 0;
            }
            if single.is_some() || !taken.is_empty() || bridge.is_some() {
                q.writer_busy = true;
            }
        }
        let count = taken.len() + usize::from(single.is_some()) + usize::from(bridge.is_some());
        if count > 0 || skipped > 0 {
            PENDING_EVENTS.fetch_sub(count as i64 + skipped, Ordering::Relaxed);
        }
        if from_backfill {
            self.backfill_room.notify_one();
        }
        if bridge.is_some() {
            told.record();
        }
        if let Some(f) = single {
            crate::metrics::record_publish_to_write(f.born);
            return Some(Drained::Frames(Batch::one(f.bytes)));
        }
        if taken.len() >= self.coalesce_from() {
            // Behind: what piled up goes out merged (PROTOCOL §5).
            count_coalesced(coalesce(&mut taken, apply_patch));
        }
        let oldest = bridge
            .as_ref()
            .map(|b| b.born)
            .or_else(|| taken.first().map(|f| f.born))?;
        crate::metrics::record_publish_to_write(oldest);
        let mut batch = bridge.map(|b| b.batch).unwrap_or_default();
        for f in taken {
            batch.push(f.bytes);
        }
        Some(Drained::Frames(batch))
    }
}

/// The fold's JSON Patch (client semantics) for rebuilding a state snapshot while coalescing.
fn apply_patch(doc: &serde_json::Value, ops: &[serde_json::Value]) -> Option<serde_json::Value> {
    crate::fold::apply_patch(doc, ops).ok()
}

/// Counts merged-away events by type (`agui_events_coalesced_total{type}`).
fn count_coalesced(merged: Vec<(crate::event::EventType, u64)>) {
    for (t, n) in merged {
        metrics::counter!(crate::metrics::COALESCED, "type" => t.as_str()).increment(n);
    }
}

/// Coalesces the live buffer in place and updates its byte count. Only what came after the
/// last compaction is coalesced, with the last frame of that compaction (the only one the new
/// frames can merge with: merging is by equal keys, so runs never reach further back). Why: a
/// stalled subscriber's full buffer is compacted at every push, inside the fan-out's loop over
/// the thread's subscribers; walking and cloning the whole buffer made each such push cost
/// O(`max_events`) instead of O(frames pushed since).
fn compact(q: &mut Inner) {
    let start = q.compacted.min(q.live.len()).saturating_sub(1);
    let mut frames: Vec<Frame> = q.live.drain(start..).collect();
    let before = frames.len();
    let before_bytes: usize = frames.iter().map(|f| f.bytes.len()).sum();
    count_coalesced(coalesce(&mut frames, apply_patch));
    PENDING_EVENTS.fetch_sub((before - frames.len()) as i64, Ordering::Relaxed);
    q.live_bytes =
        q.live_bytes - before_bytes + frames.iter().map(|f| f.bytes.len()).sum::<usize>();
    q.live.extend(frames);
    q.compacted = q.live.len();
}
