//! The queue's item: one event (or a synthesised group of events) encoded once as SSE bytes,
//! with what coalescing may merge it with and the thread's order state after it.

use super::MergeKey;
use super::bridge::json_of;
use crate::event::EventType;
use crate::event::order::OrderChecker;
use crate::log::{EventId, LogEntry};
use crate::sse;
use bytes::{Bytes, BytesMut};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// One encoded event, shared by all subscribers of a node.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The event's id (also written in the frame's `id:` line).
    pub id: EventId,
    /// The event's AG-UI type.
    pub event_type: EventType,
    /// `id: …\ndata: …\n\n`, ready to write.
    pub bytes: Bytes,
    /// Offset of the JSON inside `bytes` (after `data: `).
    data_start: usize,
    /// When this node read the event from the log (start of `agui_publish_to_write_seconds`).
    pub born: Instant,
    /// What coalescing may merge this frame with.
    pub merge: MergeKey,
    /// The thread's order state after this event (open constructs, run, chunk lanes): what a
    /// client that received the stream up to here has. Shared by consecutive frames that do
    /// not change it; `None` for frames encoded without a fold (backfill from the log).
    pub view: Option<Arc<OrderChecker>>,
}

impl Frame {
    /// Encodes an event into its frame (the only place an event becomes SSE bytes).
    pub fn new(
        id: EventId,
        event_type: EventType,
        json: &[u8],
        born: Instant,
        merge: MergeKey,
    ) -> Frame {
        let id_text = id.text();
        let mut bytes = BytesMut::with_capacity(sse::event_len(Some(id_text.len()), json.len()));
        let data_start = sse::put_event(&mut bytes, Some(&id_text), json);
        Frame {
            id,
            event_type,
            bytes: bytes.freeze(),
            data_start,
            born,
            merge,
            view: None,
        }
    }

    /// Several synthesised events (a prelude) as one frame: every event is its own SSE event,
    /// and only the last carries `id` (PROTOCOL §5: a client cut off inside resumes from where
    /// it was before; a reset bridge is a [`super::Bridge`]). `view` is the order state after the last event.
    /// `events` must not be empty.
    pub fn synthesised(
        id: EventId,
        events: &[Value],
        born: Instant,
        view: Option<Arc<OrderChecker>>,
    ) -> Frame {
        let mut buf = BytesMut::new();
        let mut event_type = EventType::Raw;
        let mut data_start = 0;
        for (i, ev) in events.iter().enumerate() {
            event_type = ev
                .get("type")
                .and_then(Value::as_str)
                .and_then(EventType::parse)
                .unwrap_or(EventType::Raw);
            let id_text = (i + 1 == events.len()).then(|| id.text());
            data_start = sse::put_event(&mut buf, id_text.as_deref(), &json_of(ev));
        }
        Frame {
            id,
            event_type,
            bytes: buf.freeze(),
            data_start,
            born,
            merge: MergeKey::Never,
            view,
        }
    }

    /// Sets the order state after this frame.
    pub fn with_view(mut self, view: Option<Arc<OrderChecker>>) -> Frame {
        self.view = view;
        self
    }

    /// Encodes a log entry that is never merged.
    pub fn encode(entry: &LogEntry, born: Instant) -> Frame {
        Frame::new(
            entry.id,
            entry.event_type,
            &entry.json,
            born,
            MergeKey::Never,
        )
    }

    /// The event's JSON, as written after `data: `.
    pub fn json(&self) -> Option<&[u8]> {
        self.bytes
            .get(self.data_start..self.bytes.len().checked_sub(2)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Epoch, StreamPos};

    #[test]
    fn synthesised_frame_puts_the_id_on_the_last_event_only() {
        let id = EventId {
            epoch: Epoch(1),
            pos: StreamPos::new(0, 9),
        };
        let f = Frame::synthesised(
            id,
            &[
                serde_json::json!({"type":"RUN_STARTED","threadId":"t","runId":"r"}),
                serde_json::json!({"type":"STATE_SNAPSHOT","snapshot":{}}),
            ],
            Instant::now(),
            None,
        );
        assert_eq!(
            &f.bytes[..],
            &b"data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}\n\nid: 00000001-0-9\ndata: {\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{}}\n\n"[..]
        );
        assert_eq!(
            f.json(),
            Some(&br#"{"type":"STATE_SNAPSHOT","snapshot":{}}"#[..])
        );
        assert_eq!(f.event_type, EventType::StateSnapshot);
    }

    #[test]
    fn event_frame_is_byte_exact() {
        let id = EventId {
            epoch: Epoch(0xdeadbeef),
            pos: StreamPos::new(5, 1),
        };
        let frame = Frame::new(
            id,
            EventType::Raw,
            br#"{"type":"RAW","event":{}}"#,
            Instant::now(),
            MergeKey::Never,
        );
        assert_eq!(
            &frame.bytes[..],
            b"id: deadbeef-5-1\ndata: {\"type\":\"RAW\",\"event\":{}}\n\n"
        );
        assert_eq!(
            frame.bytes,
            sse::encode_event(&id.to_string(), br#"{"type":"RAW","event":{}}"#)
        );
        assert_eq!(frame.json(), Some(&br#"{"type":"RAW","event":{}}"#[..]));
    }
}
