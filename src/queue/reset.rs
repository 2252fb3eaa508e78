//! The slow-consumer reset (PROTOCOL §5 "Reset"): a connection whose live buffer overflowed drops
//! what is pending and every later push, and gets one bridge, built when its writer comes back
//! for more, from what the client was last given to the thread's fold at the newest id. What
//! it dropped that no snapshot restates (`CUSTOM`, `RAW`) is counted, for the bridge's gap
//! event.

use super::{Bridge, CloseReason, ConnQueue, Frame, PENDING_EVENTS, PENDING_RESETS};
use crate::event::EventType;
use crate::log::StreamPos;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Why a connection is reset (the `reason` of its gap event, PROTOCOL §5 "Reset").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetCause {
    /// Its live buffer overflowed (a slow subscriber).
    Overflow,
    /// The node's tail fell behind the log's retention: the log trimmed events before this
    /// node read them, so what the client missed cannot be counted.
    Trimmed,
}

/// Events that resets dropped for a connection and that no snapshot restates (`CUSTOM` and
/// `RAW`: the fold keeps nothing of them), not yet told to its client. Counted exactly, in
/// constant space: `CUSTOM` and `RAW` frames are never merged, so each dropped frame is one
/// event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// `CUSTOM` events dropped.
    pub custom: u64,
    /// `RAW` events dropped.
    pub raw: u64,
    /// Set when a reset had cause [`ResetCause::Trimmed`]: more events were skipped than
    /// counted, how many is unknown.
    pub unknown: bool,
}

impl Skipped {
    /// Counts the `CUSTOM` and `RAW` frames of `frames` after `last` (the client's last
    /// position; older frames would never have been written anyway).
    pub(super) fn count<'a>(
        &mut self,
        frames: impl IntoIterator<Item = &'a Frame>,
        last: StreamPos,
    ) {
        for f in frames {
            if f.id.pos <= last {
                continue;
            }
            match f.event_type {
                EventType::Custom => self.custom += 1,
                EventType::Raw => self.raw += 1,
                _ => {}
            }
        }
    }

    /// `CUSTOM` and `RAW` events counted.
    pub fn total(&self) -> u64 {
        self.custom + self.raw
    }

    /// Counts what the client was just told (its bridge was taken):
    /// `agui_events_skipped_total{type}`.
    pub(super) fn record(&self) {
        for (t, n) in [(EventType::Custom, self.custom), (EventType::Raw, self.raw)] {
            if n > 0 {
                metrics::counter!(crate::metrics::SKIPPED, "type" => t.as_str()).increment(n);
            }
        }
    }
}

/// Builds a reset bridge on demand (PROTOCOL §5 "Reset"); the hub implements it for each
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

impl ConnQueue {
    /// Sets what builds this queue's reset bridges (the hub, once, when it registers the
    /// subscriber).
    pub fn set_bridge_source(&self, bridges: Arc<dyn BridgeSource>) {
        self.inner.lock().bridges = Some(bridges);
    }

    /// Starts a snapshot-and-reset (PROTOCOL §5 "Reset"): drops everything pending in the live
    /// buffer (a bridge not yet taken included) and every later push, until the writer comes
    /// back and has the bridge built (see [`BridgeSource`]); the `CUSTOM` and `RAW` events
    /// dropped are counted in [`ConnQueue::skipped`]. Returns `false` (and changes nothing)
    /// when no reset is possible: the client's view is unknown (a backfill is still being
    /// written), the queue has no [`BridgeSource`] or is closed; the caller closes the queue
    /// then.
    pub fn begin_reset(&self, cause: ResetCause) -> bool {
        {
            let mut q = self.inner.lock();
            if q.closed.is_some()
                || !q.backfill_done
                || !q.backfill.is_empty()
                || q.bridges.is_none()
            {
                return false;
            }
            if q.reset_pending {
                // Already dropping everything for one bridge (the tail's discontinuity resets
                // every subscriber, stalled ones included): that bridge stands for this reset.
                q.skipped.unknown |= cause == ResetCause::Trimmed;
                return true;
            }
            // The owed bridge counts as one pending event (the queue-depth gauge then shows
            // that this writer has something to write).
            let dropped = (q.live.len() + usize::from(q.bridge.is_some())) as i64 - 1;
            let last = q.last;
            let mut skipped = q.skipped;
            skipped.count(&q.live, last);
            skipped.unknown |= cause == ResetCause::Trimmed;
            q.skipped = skipped;
            // Frees the buffer's capacity too (up to `max_events` entries): a stalled client
            // keeps nothing. A dropped bridge's gap counts stay in `skipped`: the next bridge
            // tells them.
            q.live = VecDeque::new();
            q.live_bytes = 0;
            q.bridge = None;
            q.reset_pending = true;
            q.resets = q.resets.saturating_add(1);
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
    pub fn install_bridge(&self, bridge: Bridge) {
        // Boxed before the lock: the queue's lock is taken under the thread's.
        let bridge = Box::new(bridge);
        let mut q = self.inner.lock();
        if q.closed.is_some() {
            return;
        }
        if q.reset_pending {
            // The bridge was counted as pending by `begin_reset`.
            q.reset_pending = false;
            PENDING_RESETS.fetch_sub(1, Ordering::Relaxed);
        } else if q.bridge.is_none() {
            PENDING_EVENTS.fetch_add(1, Ordering::Relaxed);
        }
        q.bridge = Some(bridge);
    }

    /// What resets dropped that no snapshot restates and the client was not told yet: what
    /// the next bridge's gap event says (PROTOCOL §5 "Reset"). Stable while a reset is pending
    /// under the thread's lock (pushes, which add to it, take that lock too).
    pub fn skipped(&self) -> Skipped {
        self.inner.lock().skipped
    }

    /// Whether a reset is pending: the live buffer overflowed and the writer has not come back
    /// for its bridge yet (the client is not reading).
    pub fn reset_pending(&self) -> bool {
        self.inner.lock().reset_pending
    }

    /// Whether a reset bridge is queued and not yet taken by the writer.
    pub fn bridge_pending(&self) -> bool {
        self.inner.lock().bridge.is_some()
    }

    /// The writer came back: a pending reset has its bridge built (by the [`BridgeSource`], on
    /// the writer's time, without the queue's lock) or the queue closed. A partly written
    /// frame goes out first.
    pub(super) fn build_pending_bridge(&self) {
        // A bridge is built, or the queue closed, at the first attempt; more attempts only when
        // the buffer overflowed again in between (a burst larger than the queue).
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
    }
}
