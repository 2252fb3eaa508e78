//! A reset bridge as the queue holds it (PROTOCOL §5 "Reset"): the connection's own events
//! (closes, the gap event, re-opens) beside the thread's snapshots, which are encoded once per
//! position and shared, as the same `Bytes`, by every connection bridged there.

use super::Batch;
use crate::event::order::OrderChecker;
use crate::log::{EventId, ResumeId};
use crate::sse;
use bytes::{Bytes, BytesMut};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Synthesised events encoded once, without ids: a run of SSE events any number of connections
/// write as the same `Bytes`. A bridge that ends with them gives their last event its id by
/// writing the `id:` line between two slices of them, so nothing is copied per connection.
#[derive(Clone, Debug, Default)]
pub struct SharedEvents {
    bytes: Bytes,
    /// Offset of the last event in `bytes`.
    last_start: usize,
    /// Events in `bytes`.
    count: usize,
}

impl SharedEvents {
    /// Encodes `events`, in order, each as its own SSE event without `id:`.
    pub fn encode(events: &[Value]) -> SharedEvents {
        let mut buf = BytesMut::new();
        let mut last_start = 0;
        for ev in events {
            last_start = buf.len();
            sse::put_event(&mut buf, None, &json_of(ev));
        }
        SharedEvents {
            bytes: buf.freeze(),
            last_start,
            count: events.len(),
        }
    }

    /// The encoded events.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// How many events.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there is no event.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// One piece of a bridge, in order.
#[derive(Clone, Copy, Debug)]
pub enum BridgePart<'a> {
    /// An event of this connection's bridge alone, encoded for it.
    Own(&'a Value),
    /// Events shared with every connection bridged at the same position.
    Shared(&'a SharedEvents),
}

impl BridgePart<'_> {
    fn events(&self) -> usize {
        match self {
            BridgePart::Own(_) => 1,
            BridgePart::Shared(s) => s.count,
        }
    }
}

/// A reset bridge ready to be written (PROTOCOL §5 "Reset"): the events that bring one
/// connection's client from what it was given to the thread's fold at `id`.
#[derive(Clone, Debug)]
pub struct Bridge {
    /// The id the bridge stands for, carried by its last event.
    pub id: EventId,
    /// The encoded events; the shared parts are the thread's `Bytes`, not copies.
    pub batch: Batch,
    /// The thread's order state at `id`: what the client has after the bridge.
    pub view: Option<Arc<OrderChecker>>,
    /// When it was built (where its `agui_publish_to_write_seconds` starts).
    pub born: Instant,
}

impl Bridge {
    /// Encodes the bridge of a connection last given `after`, standing for `id`: its last event
    /// carries `id`, and its first (when it has several) the bridge mark
    /// [`ResumeId::InsideBridge`]`(after)`. A client cut off inside the bridge has applied part
    /// of it and must not be resumed exactly from `after`: it comes back with the mark and
    /// gets a prelude. `parts` must hold at least one event.
    pub fn encode(
        after: EventId,
        id: EventId,
        parts: &[BridgePart<'_>],
        born: Instant,
        view: Option<Arc<OrderChecker>>,
    ) -> Bridge {
        let total: usize = parts.iter().map(BridgePart::events).sum();
        let mark = (total > 1).then(|| ResumeId::InsideBridge(after).to_string());
        let last_id = id.to_string();
        let mut batch = Batch::new();
        // This connection's own bytes since the last shared part.
        let mut own = BytesMut::new();
        let mut seen = 0usize;
        for part in parts {
            match *part {
                BridgePart::Own(event) => {
                    seen += 1;
                    let id_text = if seen == total {
                        Some(last_id.as_str())
                    } else if seen == 1 {
                        mark.as_deref()
                    } else {
                        None
                    };
                    sse::put_event(&mut own, id_text, &json_of(event));
                }
                BridgePart::Shared(shared) if shared.count == 0 => {}
                BridgePart::Shared(shared) => {
                    if seen == 0
                        && let Some(mark) = &mark
                    {
                        // The mark's line, then the first shared event's `data:` line.
                        sse::put_id(&mut own, mark);
                    }
                    seen += shared.count;
                    if seen == total {
                        // Its last event carries the bridge's id: the id line goes between the
                        // slices. (With one event in all there is no mark line before it.)
                        batch.push(own.split().freeze());
                        batch.push(shared.bytes.slice(..shared.last_start));
                        sse::put_id(&mut own, &last_id);
                        batch.push(own.split().freeze());
                        batch.push(shared.bytes.slice(shared.last_start..));
                    } else {
                        batch.push(own.split().freeze());
                        batch.push(shared.bytes.clone());
                    }
                }
            }
        }
        batch.push(own.freeze());
        Bridge {
            id,
            batch,
            view,
            born,
        }
    }
}

/// The compact JSON of a synthesised event. Serialising a `Value` cannot fail (string keys
/// only).
pub(super) fn json_of(event: &Value) -> Vec<u8> {
    serde_json::to_vec(event).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Epoch, StreamPos};
    use serde_json::json;

    fn at(seq: u64) -> EventId {
        EventId {
            epoch: Epoch(1),
            pos: StreamPos::new(0, seq),
        }
    }

    fn text(b: &Bridge) -> String {
        String::from_utf8(b.batch.concat().to_vec()).unwrap()
    }

    #[test]
    fn the_first_event_carries_the_mark_and_the_last_the_id() {
        let events = [
            json!({"type":"RUN_FINISHED","threadId":"t","runId":"r"}),
            json!({"type":"RUN_STARTED","threadId":"t","runId":"s"}),
            json!({"type":"STATE_SNAPSHOT","snapshot":{}}),
        ];
        let parts: Vec<BridgePart> = events.iter().map(BridgePart::Own).collect();
        let b = Bridge::encode(at(4), at(9), &parts, Instant::now(), None);
        let body = text(&b);
        let ids: Vec<&str> = body
            .lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .collect();
        assert_eq!(ids, ["00000001-0-4-bridge", "00000001-0-9"], "{body}");
        assert!(body.starts_with("id: 00000001-0-4-bridge\ndata: {\"type\":\"RUN_FINISHED\""));
        assert_eq!(
            ids[0].parse::<ResumeId>(),
            Ok(ResumeId::InsideBridge(at(4)))
        );
        // A bridge of one event is whole or not received at all: its id alone.
        let one = Bridge::encode(
            at(4),
            at(9),
            &[BridgePart::Own(&events[2])],
            Instant::now(),
            None,
        );
        assert_eq!(
            text(&one),
            "id: 00000001-0-9\ndata: {\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{}}\n\n"
        );
    }

    /// Shared events keep their bytes: the connection's ids go around them, and the encoding is
    /// the one of the same events encoded for the connection alone.
    #[test]
    fn shared_events_are_written_as_the_same_bytes_with_the_ids_around_them() {
        let gap = json!({"type":"CUSTOM","name":"g","value":1});
        let snapshots = [
            json!({"type":"MESSAGES_SNAPSHOT","messages":[]}),
            json!({"type":"STATE_SNAPSHOT","snapshot":{"n":1}}),
        ];
        let shared = SharedEvents::encode(&snapshots);
        let reopen = json!({"type":"TEXT_MESSAGE_START","messageId":"m"});
        for tail in [None, Some(&reopen)] {
            let mut parts = vec![BridgePart::Own(&gap), BridgePart::Shared(&shared)];
            let mut alone: Vec<BridgePart> = vec![BridgePart::Own(&gap)];
            alone.extend(snapshots.iter().map(BridgePart::Own));
            if let Some(t) = tail {
                parts.push(BridgePart::Own(t));
                alone.push(BridgePart::Own(t));
            }
            let b = Bridge::encode(at(4), at(9), &parts, Instant::now(), None);
            let own = Bridge::encode(at(4), at(9), &alone, Instant::now(), None);
            assert_eq!(text(&b), text(&own));
            let base = shared.bytes().as_ptr_range();
            assert!(
                b.batch.chunks().iter().any(|c| base.contains(&c.as_ptr())),
                "the shared bytes themselves"
            );
        }
        // Shared events first and last: the mark before them, the id inside them.
        let b = Bridge::encode(
            at(4),
            at(9),
            &[BridgePart::Shared(&shared)],
            Instant::now(),
            None,
        );
        assert_eq!(
            text(&b),
            "id: 00000001-0-4-bridge\ndata: {\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[]}\n\n\
             id: 00000001-0-9\ndata: {\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{\"n\":1}}\n\n"
        );
    }
}
