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
//!
//! Every bridge carries a gap event (a `CUSTOM` named `agui-fanout.gap`) where the client's
//! run is active, right before the restated snapshots: what an app reads to know the stream
//! skipped events, and how many of them no snapshot restates. The snapshots themselves are
//! the thread's, encoded once per position (`encoded.rs`); the rest is the connection's own.

use super::ThreadHub;
use crate::fold::prelude::{self, Part};
use crate::log::EventId;
use crate::metrics as m;
use crate::queue::{Bridge, BridgePart, BridgeSource, CloseReason, ConnQueue, Skipped};
use serde_json::{Value, json};
use std::sync::Weak;
use std::time::Instant;

/// The `name` of the `CUSTOM` event that opens a reset's bridge (PROTOCOL §5 "Reset").
pub(super) const GAP_EVENT: &str = "agui-fanout.gap";

/// Builds the reset bridges of one thread's subscribers, on the writer's time: from what the
/// connection was last given to the hub's fold at its cursor, under the thread's lock.
pub(super) struct Bridges {
    /// Weak: the thread hub holds the queues that hold this.
    pub(super) thread: Weak<ThreadHub>,
}

impl BridgeSource for Bridges {
    fn bridge(&self, queue: &ConnQueue) {
        let built = self.thread.upgrade().is_some_and(|th| {
            let mut st = th.state.lock();
            let (Some(fold), Some(head), false) = (&st.fold, st.head, st.removed) else {
                return false;
            };
            let Some(client) = queue.client_view() else {
                return false;
            };
            let parts = prelude::bridge_parts(&client, fold);
            if parts.is_empty() {
                return false;
            }
            let at = |pos| EventId {
                epoch: head.epoch,
                pos,
            };
            // The queue's last position and skipped count are stable here: a reset queue takes
            // no frame until the bridge is installed, and pushes take this lock.
            let (after, id) = (at(queue.last_position()), at(st.cursor));
            let gap = gap_event(after, id, &queue.skipped());
            let Some(snapshots) = st.encoded_bridge_snapshots() else {
                return false;
            };
            let mut pieces: Vec<BridgePart> = Vec::with_capacity(parts.len() + 1);
            for part in &parts {
                match part {
                    Part::Event(e) => pieces.push(BridgePart::Own(e)),
                    Part::Snapshots => {
                        // Where the client's verifier has a run active: the gap event first,
                        // so the app learns of the gap before the state is restated.
                        pieces.push(BridgePart::Own(&gap));
                        pieces.push(BridgePart::Shared(&snapshots));
                    }
                }
            }
            queue.install_bridge(Bridge::encode(
                after,
                id,
                &pieces,
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

/// The gap event of a reset bridge (PROTOCOL §5 "Reset"): a `CUSTOM` event an app reads
/// with `@ag-ui/client`'s `onCustomEvent`, saying that the events after `after` up to `id`
/// were not delivered one by one, and how many of them no snapshot restates (`CUSTOM`,
/// `RAW`: lost for this client unless it reads them again by resuming from `after`).
/// `skipped` is `null` when that number is unknown (the log trimmed events before this node
/// read them).
pub(super) fn gap_event(after: EventId, id: EventId, skipped: &Skipped) -> Value {
    let (reason, skipped, types) = if skipped.unknown {
        ("trimmed", Value::Null, Value::Null)
    } else {
        let mut types = serde_json::Map::new();
        for (t, n) in [("CUSTOM", skipped.custom), ("RAW", skipped.raw)] {
            if n > 0 {
                types.insert(t.into(), n.into());
            }
        }
        ("overflow", skipped.total().into(), Value::Object(types))
    };
    json!({
        "type": "CUSTOM",
        "name": GAP_EVENT,
        "value": {
            "reason": reason,
            "after": after.to_string(),
            "until": id.to_string(),
            "skipped": skipped,
            "skippedTypes": types,
        },
    })
}
