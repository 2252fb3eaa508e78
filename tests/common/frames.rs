//! Queue frames for the queue and writer tests: one small `RAW` event per position.

use agui_fanout::event::EventType;
use agui_fanout::log::{Epoch, EventId, LogEntry, StreamPos};
use agui_fanout::queue::Frame;
use bytes::Bytes;
use std::time::Instant;

/// The frame of a `RAW` event at position `0-<seq>` of epoch 1, encoded now.
pub fn frame(seq: u64) -> Frame {
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
