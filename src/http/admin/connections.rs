//! This node's open event streams, for the admin API (PROTOCOL §12): every subscribe registers
//! its stream here for as long as it is open (thread, remote address, when it opened, how it
//! started, its queue), so that an operator can list them and close one.
//!
//! Cost: one `DashMap` insert when a stream opens and one remove when it ends, and about
//! 150 bytes per open stream; nothing per event. Listing reads each queue's length under its
//! lock, one at a time, off the hot path.

use crate::event::ThreadId;
use crate::queue::{CloseReason, ConnQueue};
use dashmap::DashMap;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The registry. Cheap to clone (an `Arc` inside).
#[derive(Clone, Default)]
pub struct Connections {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// The last id handed out (ids start at 1, never reused while the process runs).
    last_id: AtomicU64,
    /// Open streams by id. A `DashMap`: streams open and end on every task of the node.
    open: DashMap<u64, Arc<Conn>>,
}

/// One open stream.
struct Conn {
    thread: ThreadId,
    /// The peer's address (`None`: not known, e.g. a request built in a test).
    remote: Option<SocketAddr>,
    opened: SystemTime,
    /// How the stream started ([`StartKind`]).
    start: StartKind,
    queue: Arc<ConnQueue>,
}

/// How a stream started (PROTOCOL §4), as the admin API shows it (`start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartKind {
    /// No id: a prelude at the head, then live events.
    New,
    /// `?from=start`: the retained log from its first event.
    FromStart,
    /// `Last-Event-ID` resumed exactly.
    Exact,
    /// An id that could not be resumed exactly (or `?from=start` on a trimmed log): a prelude
    /// at the head.
    Prelude,
    /// An id of another epoch: the new epoch from its first event.
    Epoch,
}

impl StartKind {
    /// `new`, `from_start`, `exact`, `prelude` or `epoch`.
    pub fn as_str(self) -> &'static str {
        match self {
            StartKind::New => "new",
            StartKind::FromStart => "from_start",
            StartKind::Exact => "exact",
            StartKind::Prelude => "prelude",
            StartKind::Epoch => "epoch",
        }
    }
}

/// Keeps a stream registered; dropping it (with the stream) removes the entry.
pub struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.open.remove(&self.id);
    }
}

impl Connections {
    /// An empty registry.
    pub fn new() -> Self {
        Connections::default()
    }

    /// Registers an open stream of `thread` whose frames go through `queue`.
    pub(crate) fn register(
        &self,
        thread: ThreadId,
        remote: Option<SocketAddr>,
        start: StartKind,
        queue: Arc<ConnQueue>,
    ) -> Registration {
        let id = self.shared.last_id.fetch_add(1, Ordering::Relaxed) + 1;
        let conn = Conn {
            thread,
            remote,
            opened: SystemTime::now(),
            start,
            queue,
        };
        self.shared.open.insert(id, Arc::new(conn));
        Registration {
            shared: self.shared.clone(),
            id,
        }
    }

    /// Open streams on this node.
    pub fn len(&self) -> usize {
        self.shared.open.len()
    }

    /// Whether no stream is open on this node.
    pub fn is_empty(&self) -> bool {
        self.shared.open.is_empty()
    }

    /// Open streams of `thread` on this node.
    pub fn count_of(&self, thread: &ThreadId) -> usize {
        self.shared
            .open
            .iter()
            .filter(|c| &c.thread == thread)
            .count()
    }

    /// Open streams per thread on this node (one pass over the registry).
    pub(crate) fn counts(&self) -> HashMap<ThreadId, usize> {
        let mut counts = HashMap::new();
        for c in self.shared.open.iter() {
            *counts.entry(c.thread.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// The open streams (of `thread` only, when given), by id, at most `limit` of them, as
    /// JSON objects (PROTOCOL §12); and how many matched in all.
    pub(crate) fn list(&self, thread: Option<&ThreadId>, limit: usize) -> (Vec<Value>, usize) {
        let mut matched: Vec<(u64, Arc<Conn>)> = self
            .shared
            .open
            .iter()
            .filter(|c| thread.is_none_or(|t| &c.thread == t))
            .map(|c| (*c.key(), c.value().clone()))
            .collect();
        let total = matched.len();
        matched.sort_unstable_by_key(|(id, _)| *id);
        matched.truncate(limit);
        let now = SystemTime::now();
        let listed = matched
            .iter()
            .map(|(id, conn)| conn.to_json(*id, now))
            .collect();
        (listed, total)
    }

    /// Closes stream `id` (its writer ends it with a comment; the client reconnects with its
    /// `Last-Event-ID` and resumes exactly); what it was, or `None` when no such stream is
    /// open. The registration goes when the stream ends.
    pub(crate) fn close(&self, id: u64) -> Option<Value> {
        let conn = self.shared.open.get(&id).map(|c| c.value().clone())?;
        let shown = conn.to_json(id, SystemTime::now());
        conn.queue.close(CloseReason::Admin);
        metrics::counter!(crate::metrics::DISCONNECTS, "cause" => CloseReason::Admin.as_str())
            .increment(1);
        Some(shown)
    }
}

impl Conn {
    /// `{"id","threadId","remoteAddr","openedAtMs","ageMs","start","queue":{"events","bytes"},
    /// "resets","closed"}`.
    fn to_json(&self, id: u64, now: SystemTime) -> Value {
        let (events, bytes) = self.queue.pending();
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        json!({
            "id": id,
            "threadId": self.thread.as_str(),
            "remoteAddr": self.remote.map(|a| a.to_string()),
            "openedAtMs": ms(self.opened.duration_since(UNIX_EPOCH).unwrap_or_default()),
            "ageMs": ms(now.duration_since(self.opened).unwrap_or_default()),
            "start": self.start.as_str(),
            "queue": {"events": events, "bytes": bytes},
            "resets": self.queue.resets(),
            "closed": self.queue.is_closed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::StreamPos;
    use crate::queue::{Drained, QueueLimits};

    fn queue() -> Arc<ConnQueue> {
        let limits = QueueLimits {
            max_events: 8,
            max_bytes: 1 << 16,
        };
        Arc::new(ConnQueue::new(limits, StreamPos::ZERO, false, None))
    }

    /// Streams are listed while registered, filtered by thread, and closing one closes its
    /// queue with the admin reason.
    #[tokio::test]
    async fn registered_listed_closed_and_forgotten() {
        let conns = Connections::new();
        let t1 = ThreadId::parse("t1").unwrap();
        let t2 = ThreadId::parse("t2").unwrap();
        let q1 = queue();
        let addr: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let r1 = conns.register(t1.clone(), Some(addr), StartKind::Exact, q1.clone());
        let r2 = conns.register(t2.clone(), None, StartKind::New, queue());
        let (all, total) = conns.list(None, 10);
        assert_eq!(total, 2);
        assert_eq!(all[0]["threadId"], "t1");
        assert_eq!(all[0]["remoteAddr"], "127.0.0.1:4242");
        assert_eq!(all[0]["start"], "exact");
        assert_eq!(all[1]["remoteAddr"], Value::Null);
        let (only, total) = conns.list(Some(&t2), 10);
        assert_eq!((only.len(), total), (1, 1));
        let (cut, total) = conns.list(None, 1);
        assert_eq!((cut.len(), total), (1, 2));
        assert_eq!(conns.count_of(&t1), 1);

        let id = all[0]["id"].as_u64().unwrap();
        assert!(conns.close(id).is_some());
        assert!(matches!(
            q1.next_batch().await,
            Drained::Closed(CloseReason::Admin)
        ));
        assert!(conns.close(9999).is_none());
        drop(r1);
        assert_eq!(conns.len(), 1);
        assert!(conns.close(id).is_none(), "gone once the stream ended");
        drop(r2);
        assert!(conns.is_empty());
    }
}
