//! The events this node validated at publish, kept for the fan-out so that it does not parse
//! the same events again when the log's tail brings them back (issue 16: the hub's re-parse
//! was 7.7 % of a token delta's instructions, as much as the publish's own parse).
//!
//! The publish path (the hub's [`LocalAppends`](crate::log::LocalAppends), called by `ingest`
//! after an append) leaves `(id, event)` here for a followed thread; the fan-out takes the
//! event of an entry whose id **and** JSON bytes are those left, and parses the rest as before.
//! The JSON check makes a hand-over exact whatever raced (a failover that reused an id, a
//! rebuilt fold): an event is used only for its very bytes. An event the tail never
//! brings back (the fan-out moved past it, a discontinuity) is dropped at the next hand-over
//! or take; each thread keeps at most [`PER_THREAD`], the node at most [`PER_NODE`], so a tail
//! that stops (a Redis outage) while publishes go on cannot grow memory.

use crate::event::ValidEvent;
use crate::log::{EventId, LogEntry};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Events one thread keeps at most (the oldest dropped first): a tail keeping up brings an
/// append back within milliseconds, a few batches.
pub(super) const PER_THREAD: usize = 256;

/// Events the node keeps at most over all threads (~ a few KiB each with their JSON).
pub(super) const PER_NODE: usize = 16_384;

/// One thread's events ahead of its fan-out, in id order, all of one epoch (`keep` admits only
/// the fan-out's epoch and empties the buffer when that epoch changes).
pub(super) struct Ahead {
    entries: VecDeque<(EventId, ValidEvent)>,
    /// The node's count, shared by every thread's [`Ahead`].
    node: Arc<AtomicUsize>,
}

impl Ahead {
    /// An empty buffer counted in `node`.
    pub(super) fn new(node: Arc<AtomicUsize>) -> Self {
        Ahead {
            entries: VecDeque::new(),
            node,
        }
    }

    /// Keeps `event` for entry `id`, unless the node holds [`PER_NODE`] events already;
    /// `after` is the fan-out's position: events of another epoch, or at or before it, are
    /// dropped rather than kept.
    pub(super) fn keep(&mut self, after: EventId, id: EventId, event: &ValidEvent) {
        self.drop_through(after);
        if id.epoch != after.epoch
            || id.pos <= after.pos
            || self.node.load(Ordering::Relaxed) >= PER_NODE
        {
            return;
        }
        if self.entries.len() >= PER_THREAD {
            self.entries.pop_front();
            self.node.fetch_sub(1, Ordering::Relaxed);
        }
        // Publishes of one thread are appended one after the other, so this is nearly always
        // the end.
        let at = self.entries.partition_point(|(e, _)| e.pos < id.pos);
        if self.entries.get(at).is_some_and(|(e, _)| *e == id) {
            return;
        }
        self.entries.insert(at, (id, event.clone()));
        self.node.fetch_add(1, Ordering::Relaxed);
    }

    /// The event kept for `entry`, if its JSON is the entry's; drops every event kept for an
    /// id at or before the entry's, or of another epoch.
    pub(super) fn take(&mut self, entry: &LogEntry) -> Option<ValidEvent> {
        if self.entries.is_empty() {
            return None;
        }
        let mut found = None;
        while let Some((id, _)) = self.entries.front() {
            if id.epoch == entry.id.epoch && id.pos > entry.id.pos {
                break;
            }
            let (id, event) = self.entries.pop_front()?;
            self.node.fetch_sub(1, Ordering::Relaxed);
            if id == entry.id && event.json == entry.json {
                found = Some(event);
            }
        }
        found
    }

    /// Drops the events kept for ids of another epoch than `id`'s or at or before it: all of
    /// them when the epoch changed, else a prefix (the entries are in id order), so a keep
    /// costs O(1) amortised rather than a walk of the buffer.
    fn drop_through(&mut self, id: EventId) {
        let before = self.entries.len();
        if self
            .entries
            .front()
            .is_some_and(|(e, _)| e.epoch != id.epoch)
        {
            self.entries.clear();
        }
        while self.entries.front().is_some_and(|(e, _)| e.pos <= id.pos) {
            self.entries.pop_front();
        }
        self.node
            .fetch_sub(before - self.entries.len(), Ordering::Relaxed);
    }

    /// Events kept now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.node.fetch_sub(self.entries.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::validate_event;
    use crate::log::{Epoch, StreamPos};

    fn id(epoch: u64, seq: u64) -> EventId {
        EventId {
            epoch: Epoch(u32::try_from(epoch).unwrap()),
            pos: StreamPos::new(1, seq),
        }
    }

    fn entry(id: EventId, event: &ValidEvent) -> LogEntry {
        LogEntry {
            id,
            event_type: event.event_type,
            json: event.json.clone(),
        }
    }

    fn event(n: u64) -> ValidEvent {
        let json = format!(r#"{{"type":"CUSTOM","name":"n","value":{n}}}"#);
        validate_event(json.as_bytes(), None).unwrap()
    }

    #[test]
    fn an_event_is_handed_over_only_for_its_own_bytes() {
        let node = Arc::new(AtomicUsize::new(0));
        let mut ahead = Ahead::new(node.clone());
        let (a, b) = (event(1), event(2));
        ahead.keep(id(1, 0), id(1, 1), &a);
        ahead.keep(id(1, 0), id(1, 2), &b);
        assert_eq!(node.load(Ordering::Relaxed), 2);
        assert_eq!(ahead.take(&entry(id(1, 1), &a)).unwrap(), a);
        // Same id, other bytes (a failover reused it): parsed again, and dropped.
        assert!(ahead.take(&entry(id(1, 2), &event(3))).is_none());
        assert_eq!(ahead.len(), 0);
        assert_eq!(node.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn stale_events_are_dropped_and_the_node_bound_holds() {
        let node = Arc::new(AtomicUsize::new(0));
        let mut ahead = Ahead::new(node.clone());
        let e = event(1);
        // At or before the fan-out's position: not kept.
        ahead.keep(id(1, 5), id(1, 5), &e);
        assert_eq!(ahead.len(), 0);
        for seq in 6..6 + PER_THREAD as u64 + 10 {
            ahead.keep(id(1, 5), id(1, seq), &e);
        }
        assert_eq!(ahead.len(), PER_THREAD);
        // The fan-out moved past some: they go at the next keep.
        ahead.keep(id(1, 100), id(1, 1000), &e);
        assert_eq!(ahead.entries.front().unwrap().0, id(1, 101));
        // A take past everything empties it.
        assert!(ahead.take(&entry(id(1, 5000), &e)).is_none());
        assert_eq!(node.load(Ordering::Relaxed), 0);
        // The node's bound.
        node.store(PER_NODE, Ordering::Relaxed);
        ahead.keep(id(1, 5000), id(1, 5001), &e);
        assert_eq!(ahead.len(), 0);
        node.store(0, Ordering::Relaxed);
        ahead.keep(id(1, 5000), id(1, 5001), &e);
        drop(ahead);
        assert_eq!(node.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn events_of_another_epoch_are_neither_kept_nor_handed_over() {
        let node = Arc::new(AtomicUsize::new(0));
        let mut ahead = Ahead::new(node.clone());
        let e = event(1);
        ahead.keep(id(1, 0), id(2, 1), &e);
        assert_eq!(ahead.len(), 0);
        ahead.keep(id(1, 0), id(1, 1), &e);
        assert!(ahead.take(&entry(id(2, 1), &e)).is_none());
        assert_eq!(ahead.len(), 0);
        assert_eq!(node.load(Ordering::Relaxed), 0);
    }
}
