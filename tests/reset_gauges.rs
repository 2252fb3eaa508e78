//! The process-wide gauges of resets (`agui_resets_pending`, `agui_queue_depth_events`) stay
//! true when a reset queue is reset again before its writer comes back (the tail's
//! discontinuity resets every subscriber of a thread, stalled ones included): one owed bridge,
//! counted once. Before, each reset counted another pending reset and pending event, and the
//! gauges stayed off by one for good. Its own test binary: it reads process-wide counts.

use agui_fanout::log::{Epoch, EventId, StreamPos};
use agui_fanout::queue::{
    Bridge, BridgePart, BridgeSource, ConnQueue, Drained, QueueLimits, ResetCause, pending_events,
    pending_resets,
};
use std::sync::Arc;
use std::time::Instant;

/// Installs a one-event bridge at `0-9`.
struct AtNine;

impl BridgeSource for AtNine {
    fn bridge(&self, queue: &ConnQueue) {
        let at = |seq| EventId {
            epoch: Epoch(1),
            pos: StreamPos::new(0, seq),
        };
        queue.install_bridge(Bridge::encode(
            at(0),
            at(9),
            &[BridgePart::Own(
                &serde_json::json!({"type":"STATE_SNAPSHOT","snapshot":{}}),
            )],
            Instant::now(),
            None,
        ));
    }
}

#[test]
fn a_second_reset_before_the_bridge_counts_one_owed_bridge() {
    let limits = QueueLimits {
        max_events: 4,
        max_bytes: 1 << 20,
    };
    let q = ConnQueue::new(limits, StreamPos::ZERO, false, None);
    q.set_bridge_source(Arc::new(AtNine));
    assert!(q.begin_reset(ResetCause::Overflow));
    assert!(q.begin_reset(ResetCause::Trimmed));
    assert_eq!((pending_resets(), pending_events()), (1, 1));
    assert!(matches!(q.try_drain(), Some(Drained::Frames(_))));
    assert_eq!((pending_resets(), pending_events()), (0, 0));
    assert_eq!(q.skipped(), Default::default());
}
