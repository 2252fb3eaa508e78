//! Reset bridges (PROTOCOL §5 "Reset"): what a reset queue gets when its writer comes back, the
//! events that bring its client from what it was last given to the thread's fold at the
//! newest id.
//!
//! The call-back: on overflow the fan-out only marks the queue (`ConnQueue::begin_reset`);
//! the bridge is built later, on the writer's time, when the queue's writer asks the queue
//! for more and the queue calls back the [`BridgeSource`] the hub gave it at registration.
//! The queue knows only the trait, so the module dependency stays one way (`hub` → `queue`)
//! while the call runs queue → hub. The queue makes the call with none of its locks held;
//! the bridge then takes the thread state's lock, then the queue's (the lock order in
//! `hub/mod.rs`), so every frame fanned out afterwards is newer than the bridge. The fan-out
//! itself never builds a bridge: a stalled subscriber costs it one queue lock per event.

use super::ThreadHub;
use crate::fold::prelude;
use crate::log::EventId;
use crate::metrics as m;
use crate::queue::Frame;
use crate::queue::{BridgeSource, CloseReason, ConnQueue};
use std::sync::Weak;
use std::time::Instant;

/// Builds the reset bridges of one thread's subscribers, on the writer's time: from what the
/// connection was last given to the hub's fold at its cursor, under the thread's lock.
pub(super) struct Bridges {
    /// Weak: the thread hub holds the queues that hold this.
    pub(super) thread: Weak<ThreadHub>,
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
