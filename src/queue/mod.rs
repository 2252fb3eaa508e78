//! The per-connection bounded queue between the hub and a subscriber's SSE writer (SPEC §5).
//!
//! Data path position: `hub` → **`queue`** → `sse`. Two lanes:
//! - the **replay lane**, filled by the connection's replay task with log pages it read for a
//!   resume; that task waits for room (it is the only producer that may wait);
//! - the **live lane**, filled by the hub's fan-out, which never waits: a push that would go
//!   over `max_events` or `max_bytes` fails and the hub applies its slow-consumer policy.
//!
//! The writer drains the replay lane first, then the live lane, and skips any frame at or
//! before the last position it wrote, which makes the replay → live hand-over exact.
//!
//! Direct writes: when the writer writes to a raw socket ([`ConnQueue::attach_socket`]), a live
//! push that finds nothing pending and the writer idle is written to the socket by the pusher
//! itself, under the queue's lock (so it cannot interleave with the writer); the unwritten rest
//! of a partial write is kept ahead of everything else.
//!
//! Lock discipline: one `parking_lot::Mutex` per connection, held only to move `Bytes`
//! handles; the writer is woken after the lock is dropped. The writer is the only consumer,
//! so it waits on an `AtomicWaker` (one atomic swap per push) rather than a `Notify`, whose
//! waiter list takes a lock at every poll and drop.

pub mod coalesce;

pub use coalesce::MergeKey;

use crate::event::order::OrderChecker;
use coalesce::coalesce;
use std::sync::Arc;

use crate::log::StreamPos;
use crate::sse::Frame;
use bytes::{Bytes, BytesMut};
use futures::task::AtomicWaker;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};
use tokio::net::TcpStream;
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

/// Bounds of one connection's live lane.
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
    /// The live lane overflowed (slow subscriber).
    Overflow,
    /// The log lost continuity under the tail (recreated or trimmed past the node's position).
    Discontinuity,
    /// Reading the log for a replay failed (backend unavailable).
    Backend,
    /// The node is shutting down.
    Shutdown,
}

impl CloseReason {
    /// Metric label (`agui_disconnects_total{cause}`).
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Overflow => "overflow",
            CloseReason::Discontinuity => "discontinuity",
            CloseReason::Backend => "backend",
            CloseReason::Shutdown => "shutdown",
        }
    }

    /// A comment the writer sends before ending the stream, if any.
    pub fn final_words(self) -> Option<&'static str> {
        match self {
            CloseReason::Overflow => Some("agui-fanout: subscriber too slow, reconnect"),
            CloseReason::Discontinuity => Some("agui-fanout: log discontinuity, reconnect"),
            CloseReason::Backend => Some("agui-fanout: log backend unavailable, reconnect"),
            CloseReason::Shutdown => None,
        }
    }
}

/// What [`ConnQueue::next_batch`] yields.
#[derive(Debug)]
pub enum Drained {
    /// Every frame that was ready, concatenated into one write.
    Frames(Bytes),
    /// The queue was closed; nothing more will come.
    Closed(CloseReason),
}

/// Builds a reset bridge on demand (SPEC §5 "Reset"); the hub implements it for each
/// subscriber of a thread.
///
/// A reset is lazy: on overflow the hub only marks the queue ([`ConnQueue::begin_reset`]),
/// which drops what is pending and every later push; the bridge is built when the writer
/// comes back for more (the client reads again), from what the client was last given to the
/// fold at the newest id. A stalled client therefore costs one lock per event and no memory,
/// however long it stalls, and a client that overflows many times before it reads gets one
/// bridge, not one per overflow.
pub trait BridgeSource: Send + Sync {
    /// Builds the bridge from `queue`'s client view ([`ConnQueue::client_view`]) to the
    /// thread's fold at its newest id and installs it with [`ConnQueue::install_bridge`],
    /// atomically with the fan-out (every frame pushed afterwards is newer than the bridge).
    /// When no bridge can be built (the thread's fold or the client's view is unknown, the
    /// thread is no longer followed) it closes the queue with [`CloseReason::Overflow`]
    /// instead: the client comes back with its last id.
    fn bridge(&self, queue: &ConnQueue);
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

/// A push into the live lane that did not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overflow;

/// One connection's queue. Shared (`Arc`) by the hub, the replay task and the writer.
pub struct ConnQueue {
    inner: Mutex<Inner>,
    /// Wakes the writer (its only consumer). A wake before the writer registered is not
    /// lost: the writer registers, then looks at the lanes.
    writer: AtomicWaker,
    /// Wakes the replay task waiting for room.
    replay_room: Notify,
    limits: QueueLimits,
}

struct Inner {
    /// The order state after the last frame the writer took (what the client has), when
    /// known; the base of a reset bridge.
    client_view: Option<Arc<OrderChecker>>,
    replay: VecDeque<Frame>,
    /// The replay task is done (or there was none): the live lane may be drained.
    replay_done: bool,
    live: VecDeque<Frame>,
    live_bytes: usize,
    /// Last position written to the client; frames at or before it are skipped.
    last: StreamPos,
    /// A reset bridge is queued and not yet taken by the writer. The bridge is not counted
    /// against the bounds (its size is the thread's fold, not the backlog).
    bridge_pending: bool,
    /// The live lane overflowed and was dropped ([`ConnQueue::begin_reset`]): pushes are
    /// dropped until the writer has the bridge built ([`BridgeSource`]).
    reset_pending: bool,
    /// Builds this queue's reset bridges; `None`: an overflow cannot be reset (the hub then
    /// closes the queue).
    bridges: Option<Arc<dyn BridgeSource>>,
    closed: Option<CloseReason>,
    /// The subscriber's socket, when its writer writes to the raw socket (see
    /// [`ConnQueue::attach_socket`]): the hub may then write a frame itself.
    socket: Option<Arc<TcpStream>>,
    /// The writer holds bytes it took and has not finished writing (or is writing a
    /// heartbeat): nobody else may write to the socket meanwhile.
    writer_busy: bool,
    /// The rest of a frame the hub wrote only partly: it goes out before anything else.
    partial: Option<Bytes>,
}

impl ConnQueue {
    /// A queue whose writer starts after `after` (the client's last position, or ZERO).
    /// With `replay` true the live lane is held back until [`ConnQueue::finish_replay`].
    /// `view` is the client's order state at `after` when known (after a prelude).
    pub fn new(
        limits: QueueLimits,
        after: StreamPos,
        replay: bool,
        view: Option<Arc<OrderChecker>>,
    ) -> Self {
        ConnQueue {
            inner: Mutex::new(Inner {
                client_view: view,
                replay: VecDeque::new(),
                replay_done: !replay,
                live: VecDeque::new(),
                live_bytes: 0,
                last: after,
                bridge_pending: false,
                reset_pending: false,
                bridges: None,
                closed: None,
                socket: None,
                writer_busy: false,
                partial: None,
            }),
            writer: AtomicWaker::new(),
            replay_room: Notify::new(),
            limits,
        }
    }

    /// The live lane's bounds.
    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// Appends frames to the live lane without waiting, or writes a single frame to the socket
    /// at once (see [`ConnQueue::attach_socket`]). When they do not fit, the lane is coalesced
    /// first (SPEC §5: a subscriber that is behind gets its pending deltas merged).
    ///
    /// A frame written at once is not counted in `agui_publish_to_write_seconds` here: the
    /// caller counts its [`Pushed::Written`] pushes in groups (one clock read per group).
    ///
    /// # Errors
    /// [`Overflow`] when even the coalesced lane exceeds a bound. The lane then holds an
    /// equivalent but unspecified mix of old and new frames: the caller must
    /// [`ConnQueue::begin_reset`] or [`ConnQueue::close`] the queue.
    pub fn push_live(&self, frames: &[Frame]) -> Result<Pushed, Overflow> {
        let added = frames.len() as i64;
        let result = {
            let mut q = self.inner.lock();
            // Closed, or reset pending: the bridge the writer will get stands for these frames.
            if q.closed.is_some() || q.reset_pending {
                return Ok(Pushed::Dropped);
            }
            if let [frame] = frames
                && Self::write_direct(&mut q, frame)
            {
                let partly = q.partial.is_some();
                drop(q);
                if partly {
                    self.writer.wake();
                }
                return Ok(Pushed::Written);
            }
            let bytes: usize = frames.iter().map(|f| f.bytes.len()).sum();
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

    /// Lets the hub write frames straight to `socket` while nothing is pending and the writer
    /// is idle (a subscriber that keeps up then costs no wake-up of its writer per event). The
    /// writer calls [`ConnQueue::writer_done`] after each of its own writes and
    /// [`ConnQueue::detach_socket`] when it ends.
    pub fn attach_socket(&self, socket: Arc<TcpStream>) {
        self.inner.lock().socket = Some(socket);
    }

    /// Forgets the socket (the writer ended): the connection closes with the writer's handle.
    pub fn detach_socket(&self) {
        self.inner.lock().socket = None;
    }

    /// The writer finished writing what it took: the socket is free again.
    pub fn writer_done(&self) {
        self.inner.lock().writer_busy = false;
    }

    /// The writer is about to write bytes of its own (a heartbeat): `false` when a partly
    /// written frame must go first (the writer then drains instead).
    pub fn begin_own_write(&self) -> bool {
        let mut q = self.inner.lock();
        if q.partial.is_some() {
            return false;
        }
        q.writer_busy = true;
        true
    }

    /// Writes `frame` to the attached socket under the queue's lock, when that keeps the
    /// stream's order: nothing pending, no replay, writer idle, frame newer than the last one
    /// written. `false`: nothing was written (the caller queues the frame). A partial write
    /// keeps the rest in `partial`, ahead of everything else.
    fn write_direct(q: &mut Inner, frame: &Frame) -> bool {
        let Some(socket) = q.socket.as_ref() else {
            return false;
        };
        if !q.replay_done
            || q.reset_pending
            || !q.replay.is_empty()
            || !q.live.is_empty()
            || q.writer_busy
            || q.partial.is_some()
            || frame.id.pos <= q.last
        {
            return false;
        }
        // `send(2)` on the socket directly, not tokio's `try_write`: that one first reads the
        // socket's readiness word (a cache miss per subscriber: 4–6% of the node's samples at
        // 10,000 connections) to skip a syscall that is rarely skipped here. A full socket
        // answers `EAGAIN` either way; the writer's own `try_write` then clears the stale
        // readiness and waits for room.
        match socket2::SockRef::from(socket.as_ref()).send(&frame.bytes) {
            Ok(n) => {
                if n < frame.bytes.len() {
                    q.partial = Some(frame.bytes.slice(n..));
                }
                q.last = frame.id.pos;
                q.client_view = frame.view.clone();
                true
            }
            // Full (the writer waits for room) or failed (the writer notices the close).
            Err(_) => false,
        }
    }

    /// Sets what builds this queue's reset bridges (the hub, once, when it registers the
    /// subscriber).
    pub fn set_bridge_source(&self, bridges: Arc<dyn BridgeSource>) {
        self.inner.lock().bridges = Some(bridges);
    }

    /// Starts a snapshot-and-reset (SPEC §5 "Reset"): drops everything pending in the live lane
    /// and every later push, until the writer comes back and has the bridge built (see
    /// [`BridgeSource`]). Returns `false` (and changes nothing) when no reset is possible: the
    /// client's view is unknown (a replay is still being written), the queue has no
    /// [`BridgeSource`] or is closed; the caller closes the queue then.
    pub fn begin_reset(&self) -> bool {
        {
            let mut q = self.inner.lock();
            if q.closed.is_some() || !q.replay_done || !q.replay.is_empty() || q.bridges.is_none() {
                return false;
            }
            // The owed bridge counts as one pending event (the queue-depth gauge then shows
            // that this writer has something to write).
            let dropped = q.live.len() as i64 - 1;
            // Frees the lane's capacity too (up to `max_events` entries): a stalled client
            // keeps nothing.
            q.live = VecDeque::new();
            q.live_bytes = 0;
            q.bridge_pending = false;
            q.reset_pending = true;
            PENDING_EVENTS.fetch_sub(dropped, Ordering::Relaxed);
            PENDING_RESETS.fetch_add(1, Ordering::Relaxed);
        }
        self.writer.wake();
        true
    }

    /// Queues `bridge` (which stands for the thread's fold at `bridge.id`) ahead of anything
    /// pushed after it and ends the pending reset. Called by a [`BridgeSource`] under the
    /// thread's lock, so that every later push is newer than the bridge. Ignored on a closed
    /// queue.
    pub fn install_bridge(&self, bridge: Frame) {
        let mut q = self.inner.lock();
        if q.closed.is_some() {
            return;
        }
        if q.reset_pending {
            // The bridge was counted as pending by `begin_reset`.
            q.reset_pending = false;
            PENDING_RESETS.fetch_sub(1, Ordering::Relaxed);
        } else {
            PENDING_EVENTS.fetch_add(1, Ordering::Relaxed);
        }
        q.live.push_front(bridge);
        q.bridge_pending = true;
    }

    /// Whether a reset is pending: the live lane overflowed and the writer has not come back
    /// for its bridge yet (the client is not reading).
    pub fn reset_pending(&self) -> bool {
        self.inner.lock().reset_pending
    }

    /// What the live lane holds now, as `(frames, bytes)`, a pending reset bridge included
    /// (so this can exceed [`QueueLimits`] by one bridge). The replay lane is not counted (it
    /// is bounded by the replay task waiting for room). Read-only, for tests and diagnostics.
    pub fn pending(&self) -> (usize, usize) {
        let q = self.inner.lock();
        (q.live.len(), q.live.iter().map(|f| f.bytes.len()).sum())
    }

    /// Whether the live lane exceeds a bound (a pending bridge is not counted).
    fn over_bounds(&self, q: &Inner) -> bool {
        let frames = q.live.len() - usize::from(q.bridge_pending && !q.live.is_empty());
        frames > self.limits.max_events || q.live_bytes > self.limits.max_bytes
    }

    /// Whether a reset bridge is queued and not yet taken by the writer.
    pub fn bridge_pending(&self) -> bool {
        self.inner.lock().bridge_pending
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

    /// Appends replayed frames, waiting while the replay lane holds `max_events / 2` or more.
    /// Returns `false` if the queue was closed (stop replaying).
    pub async fn push_replay(&self, frames: Vec<Frame>) -> bool {
        let high_water = (self.limits.max_events / 2).max(1);
        loop {
            let room = self.replay_room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut q = self.inner.lock();
                if q.closed.is_some() {
                    return false;
                }
                if q.replay.len() < high_water {
                    let n = frames.len() as i64;
                    q.replay.extend(frames);
                    drop(q);
                    PENDING_EVENTS.fetch_add(n, Ordering::Relaxed);
                    self.writer.wake();
                    return true;
                }
            }
            room.await;
        }
    }

    /// Marks the replay done: the writer moves on to the live lane.
    pub fn finish_replay(&self) {
        self.inner.lock().replay_done = true;
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
            let dropped = (q.replay.len() + q.live.len() + usize::from(q.reset_pending)) as i64;
            if q.reset_pending {
                q.reset_pending = false;
                PENDING_RESETS.fetch_sub(1, Ordering::Relaxed);
            }
            q.replay.clear();
            q.live.clear();
            q.live_bytes = 0;
            PENDING_EVENTS.fetch_sub(dropped, Ordering::Relaxed);
        }
        self.writer.wake();
        self.replay_room.notify_one();
    }

    /// Pending frames at which a write counts as "behind" and is coalesced: half of
    /// `max_events` (at least 2). A batch published at once is not a lagging subscriber: a
    /// subscriber that keeps up gets every event as published (SPEC §5).
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
    /// reset has its bridge built first (by the [`BridgeSource`], on this caller's time).
    pub fn try_drain(&self) -> Option<Drained> {
        // A bridge is built, or the queue closed, at the first attempt; more attempts only when
        // the lane overflowed again in between (a burst larger than the queue).
        for attempt in 0.. {
            let bridges = {
                let q = self.inner.lock();
                if !q.reset_pending || q.partial.is_some() || q.closed.is_some() {
                    break;
                }
                q.bridges.clone()
            };
            match bridges {
                // Installs the bridge or closes the queue; either ends the pending reset.
                Some(b) if attempt < 3 => b.bridge(self),
                // No source (`begin_reset` requires one), or the bursts keep coming.
                _ => self.close(CloseReason::Overflow),
            }
        }
        let mut taken: Vec<Frame> = Vec::new();
        let mut single: Option<Frame> = None;
        let mut skipped = 0i64;
        let from_replay;
        {
            let mut q = self.inner.lock();
            if let Some(rest) = q.partial.take() {
                // The rest of a frame the hub started: before anything, even the close.
                q.writer_busy = true;
                return Some(Drained::Frames(rest));
            }
            if let Some(reason) = q.closed {
                return Some(Drained::Closed(reason));
            }
            from_replay = !q.replay.is_empty();
            let lane_len = if from_replay {
                q.replay.len()
            } else if q.replay_done {
                q.live.len()
            } else {
                0
            };
            if lane_len == 0 {
                return None;
            }
            let mut last = q.last;
            let lane = if from_replay {
                &mut q.replay
            } else {
                &mut q.live
            };
            if lane_len == 1 {
                // The common case of a subscriber that keeps up: no batch vector.
                match lane.pop_front() {
                    Some(f) if f.id.pos > last => {
                        last = f.id.pos;
                        single = Some(f);
                    }
                    _ => skipped += 1,
                }
            } else {
                taken.reserve(lane_len);
                for f in lane.drain(..) {
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
                // Replayed frames carry no view: the client's view is then unknown.
                q.client_view = f.view.clone();
            }
            if !from_replay {
                q.bridge_pending = false;
                q.live_bytes = 0;
            }
            if single.is_some() || !taken.is_empty() {
                q.writer_busy = true;
            }
        }
        let count = taken.len() + usize::from(single.is_some());
        if count > 0 || skipped > 0 {
            PENDING_EVENTS.fetch_sub(count as i64 + skipped, Ordering::Relaxed);
        }
        if from_replay {
            self.replay_room.notify_one();
        }
        if let Some(f) = single {
            crate::metrics::record_publish_to_write(f.born);
            return Some(Drained::Frames(f.bytes));
        }
        if taken.len() >= self.coalesce_from() {
            // Behind: what piled up goes out merged (SPEC §5).
            count_coalesced(coalesce(&mut taken, apply_patch));
        }
        let oldest = taken.first()?.born;
        crate::metrics::record_publish_to_write(oldest);
        if taken.len() == 1 {
            return taken.pop().map(|f| Drained::Frames(f.bytes));
        }
        let len = taken.iter().map(|f| f.bytes.len()).sum();
        let mut buf = BytesMut::with_capacity(len);
        for f in &taken {
            buf.extend_from_slice(&f.bytes);
        }
        Some(Drained::Frames(buf.freeze()))
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

/// Coalesces the live lane in place and recomputes its byte count.
fn compact(q: &mut Inner) {
    let mut frames: Vec<Frame> = q.live.drain(..).collect();
    let before = frames.len() as i64;
    count_coalesced(coalesce(&mut frames, apply_patch));
    PENDING_EVENTS.fetch_sub(before - frames.len() as i64, Ordering::Relaxed);
    // A pending bridge (always first: it is never merged) stays uncounted.
    let uncounted = usize::from(q.bridge_pending);
    q.live_bytes = frames.iter().skip(uncounted).map(|f| f.bytes.len()).sum();
    q.live.extend(frames);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventType;
    use crate::log::{Epoch, EventId, LogEntry};
    use std::time::Instant;

    fn frame(seq: u64) -> Frame {
        let entry = LogEntry {
            id: EventId {
                epoch: Epoch(1),
                pos: StreamPos::new(0, seq),
            },
            event_type: EventType::Raw,
            json: Bytes::from_static(br#"{"type":"RAW","event":1}"#),
        };
        Frame::encode(&entry, Instant::now())
    }

    fn limits(max_events: usize) -> QueueLimits {
        QueueLimits {
            max_events,
            max_bytes: 1 << 20,
        }
    }

    fn ids(d: Option<Drained>) -> Vec<u64> {
        match d {
            Some(Drained::Frames(b)) => std::str::from_utf8(&b)
                .unwrap()
                .lines()
                .filter_map(|l| l.strip_prefix("id: 00000001-0-"))
                .map(|s| s.parse().unwrap())
                .collect(),
            other => panic!("expected frames, got {other:?}"),
        }
    }

    #[test]
    fn live_lane_is_bounded_by_events_and_bytes() {
        let q = ConnQueue::new(limits(3), StreamPos::ZERO, false, None);
        q.push_live(&[frame(1), frame(2)]).unwrap();
        q.push_live(&[frame(3)]).unwrap();
        // RAW frames cannot be coalesced: a fourth does not fit.
        assert_eq!(q.push_live(&[frame(4)]), Err(Overflow));
        let small = ConnQueue::new(
            QueueLimits {
                max_events: 100,
                max_bytes: frame(1).bytes.len() * 2,
            },
            StreamPos::ZERO,
            false,
            None,
        );
        small.push_live(&[frame(1), frame(2)]).unwrap();
        assert_eq!(small.push_live(&[frame(3)]), Err(Overflow));
    }

    fn text_frame(seq: u64, delta: &str) -> Frame {
        let id = EventId {
            epoch: Epoch(1),
            pos: StreamPos::new(0, seq),
        };
        let ev = serde_json::json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":delta});
        let merge = MergeKey::of(EventType::TextMessageContent, &ev, true, None);
        Frame::new(
            id,
            EventType::TextMessageContent,
            &serde_json::to_vec(&ev).unwrap(),
            Instant::now(),
            merge,
        )
    }

    #[test]
    fn a_full_lane_is_coalesced_before_it_overflows() {
        let q = ConnQueue::new(limits(4), StreamPos::ZERO, false, None);
        for i in 1..=20 {
            q.push_live(&[text_frame(i, "ab")]).unwrap();
        }
        let Some(Drained::Frames(bytes)) = q.try_drain() else {
            panic!("frames expected")
        };
        let text = std::str::from_utf8(&bytes).unwrap();
        assert_eq!(text.matches("data: ").count(), 1, "{text}");
        assert!(text.starts_with("id: 00000001-0-20\n"), "{text}");
        assert!(text.contains(&"ab".repeat(20)), "{text}");
    }

    /// A [`BridgeSource`] that installs a fixed bridge at a fixed position, counting calls.
    struct FixedBridge {
        at: u64,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl BridgeSource for FixedBridge {
        fn bridge(&self, queue: &ConnQueue) {
            self.calls.fetch_add(1, Ordering::SeqCst);
            queue.install_bridge(Frame::synthesised(
                EventId {
                    epoch: Epoch(1),
                    pos: StreamPos::new(0, self.at),
                },
                &[serde_json::json!({"type":"STATE_SNAPSHOT","snapshot":1})],
                Instant::now(),
                None,
            ));
        }
    }

    #[test]
    fn reset_drops_what_is_pending_and_builds_one_bridge_when_the_writer_comes_back() {
        let q = ConnQueue::new(limits(2), StreamPos::ZERO, false, None);
        // Without a bridge source no reset is possible (the hub closes the queue then).
        assert!(!q.begin_reset());
        let source = Arc::new(FixedBridge {
            at: 7,
            calls: Default::default(),
        });
        q.set_bridge_source(source.clone());
        q.push_live(&[frame(1), frame(2)]).unwrap();
        assert_eq!(q.push_live(&[frame(3)]), Err(Overflow));
        assert!(q.begin_reset());
        assert_eq!(
            q.pending(),
            (0, 0),
            "the overflowed lane is dropped at once"
        );
        // While the client does not read, pushes are dropped (the bridge stands for them).
        for i in 4..=7 {
            q.push_live(&[frame(i)]).unwrap();
        }
        assert_eq!(q.pending(), (0, 0));
        assert!(q.reset_pending());
        assert_eq!(source.calls.load(Ordering::SeqCst), 0, "nothing built yet");
        // The writer comes back: one bridge (at 7), then what was pushed after it.
        assert_eq!(ids(q.try_drain()), vec![7]);
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
        q.push_live(&[frame(8)]).unwrap();
        assert_eq!(ids(q.try_drain()), vec![8]);
        // While a replay is being written the client's view is unknown: no reset.
        let r = ConnQueue::new(limits(2), StreamPos::ZERO, true, None);
        r.set_bridge_source(source);
        assert!(!r.begin_reset());
    }

    #[tokio::test]
    async fn replay_then_live_hand_over_skips_overlap() {
        // Client had 2; replay brings 3..=5; live already holds 4..=7 (overlap 4, 5).
        let q = ConnQueue::new(limits(100), StreamPos::new(0, 2), true, None);
        q.push_live(&[frame(4), frame(5), frame(6), frame(7)])
            .unwrap();
        assert!(q.try_drain().is_none(), "live lane waits for the replay");
        assert!(q.push_replay(vec![frame(3), frame(4), frame(5)]).await);
        assert_eq!(ids(q.try_drain()), vec![3, 4, 5]);
        q.finish_replay();
        assert_eq!(ids(q.try_drain()), vec![6, 7]);
        assert!(q.try_drain().is_none());
    }

    #[tokio::test]
    async fn close_wins_and_drops_pending() {
        let q = ConnQueue::new(limits(10), StreamPos::ZERO, false, None);
        q.push_live(&[frame(1)]).unwrap();
        q.close(CloseReason::Overflow);
        q.close(CloseReason::Shutdown);
        assert!(matches!(
            q.next_batch().await,
            Drained::Closed(CloseReason::Overflow)
        ));
        assert!(!q.push_replay(vec![frame(2)]).await);
    }
}
