//! The `memory` log backend: the embedded default, so `cargo run` serves with nothing else
//! installed. One node only; everything is lost on restart (each thread then gets a new
//! epoch, so old ids are never mistaken for new positions).

use super::{
    Epoch, EventId, EventLog, LogEntry, LogError, LogHead, ReadFrom, ResumeGap, Retention,
    StreamPos, Tail, TailItem,
};
use crate::event::{ThreadId, ValidEvent};
use dashmap::DashMap;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// In-process thread logs. Cheap to clone (an `Arc` inside).
#[derive(Clone, Default)]
pub struct MemoryLog {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    threads: DashMap<ThreadId, Arc<ThreadLog>>,
    retention: Retention,
}

struct ThreadLog {
    inner: Mutex<ThreadInner>,
    /// Woken after every append; the tail task of the thread waits on it.
    appended: Notify,
}

struct ThreadInner {
    epoch: Epoch,
    /// Retained entries, oldest first; positions are `0-1`, `0-2`, ... (consecutive).
    entries: VecDeque<LogEntry>,
    last: StreamPos,
    max_deleted: StreamPos,
}

impl ThreadInner {
    fn head(&self) -> LogHead {
        LogHead {
            epoch: self.epoch,
            last: self.last,
            max_deleted: self.max_deleted,
        }
    }

    /// Index in `entries` of the first entry strictly after `pos`.
    fn index_after(&self, pos: StreamPos) -> usize {
        match self.entries.front() {
            // Positions are consecutive `0-n`, so the index is arithmetic, not a search.
            Some(first) => (pos.seq + 1).saturating_sub(first.id.pos.seq) as usize,
            None => 0,
        }
        .min(self.entries.len())
    }

    fn read(&self, from: ReadFrom, limit: usize) -> Result<Vec<LogEntry>, ResumeGap> {
        let start = match from {
            ReadFrom::Start => 0,
            ReadFrom::After(id) => {
                check_resumable(&self.head(), id)?;
                self.index_after(id.pos)
            }
        };
        Ok(self
            .entries
            .iter()
            .skip(start)
            .take(limit)
            .cloned()
            .collect())
    }
}

/// Decides whether reading strictly after `id` is exact for a log with `head`.
pub(crate) fn check_resumable(head: &LogHead, id: EventId) -> Result<(), ResumeGap> {
    if id.epoch != head.epoch {
        Err(ResumeGap::OtherEpoch)
    } else if id.pos > head.last {
        Err(ResumeGap::Ahead)
    } else if id.pos < head.max_deleted {
        Err(ResumeGap::Trimmed)
    } else {
        Ok(())
    }
}

impl MemoryLog {
    /// An empty log store with the given retention.
    pub fn new(retention: Retention) -> Self {
        MemoryLog {
            shared: Arc::new(Shared {
                threads: DashMap::new(),
                retention,
            }),
        }
    }

    /// Appends under the thread's lock, after checking `expected` when given.
    fn append_checked(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: Option<LogHead>,
    ) -> Result<Vec<EventId>, LogError> {
        let log = self.thread(thread);
        let ids = {
            let mut inner = log.inner.lock();
            if let Some(exp) = expected {
                let head = inner.head();
                if head.epoch != exp.epoch || head.last != exp.last {
                    return Err(LogError::Conflict(head));
                }
            }
            if events.is_empty() {
                return Ok(Vec::new());
            }
            let mut ids = Vec::with_capacity(events.len());
            for ev in events {
                inner.last.seq += 1;
                let id = EventId {
                    epoch: inner.epoch,
                    pos: inner.last,
                };
                inner.entries.push_back(LogEntry {
                    id,
                    event_type: ev.event_type,
                    json: ev.json.clone(),
                });
                ids.push(id);
            }
            let max = self.shared.retention.max_events;
            while max > 0 && inner.entries.len() > max {
                if let Some(old) = inner.entries.pop_front() {
                    inner.max_deleted = old.id.pos;
                }
            }
            ids
        };
        // Lock dropped before waking the tail.
        log.appended.notify_waiters();
        Ok(ids)
    }

    fn thread(&self, thread: &ThreadId) -> Arc<ThreadLog> {
        if let Some(t) = self.shared.threads.get(thread) {
            return t.clone();
        }
        self.shared
            .threads
            .entry(thread.clone())
            .or_insert_with(|| {
                Arc::new(ThreadLog {
                    inner: Mutex::new(ThreadInner {
                        epoch: Epoch::random(),
                        entries: VecDeque::new(),
                        last: StreamPos::ZERO,
                        max_deleted: StreamPos::ZERO,
                    }),
                    appended: Notify::new(),
                })
            })
            .clone()
    }
}

#[async_trait::async_trait]
impl EventLog for MemoryLog {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn append(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
    ) -> Result<Vec<EventId>, LogError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.append_checked(thread, events, None)
    }

    async fn append_if(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: LogHead,
    ) -> Result<Vec<EventId>, LogError> {
        self.append_checked(thread, events, Some(expected))
    }

    async fn read(
        &self,
        thread: &ThreadId,
        from: ReadFrom,
        limit: usize,
    ) -> Result<Vec<LogEntry>, LogError> {
        let log = self.thread(thread);
        let inner = log.inner.lock();
        Ok(inner.read(from, limit)?)
    }

    async fn head(&self, thread: &ThreadId) -> Result<LogHead, LogError> {
        Ok(self.thread(thread).inner.lock().head())
    }

    async fn ping(&self) -> Result<(), LogError> {
        Ok(())
    }

    fn start_tail(
        &self,
        sink: mpsc::Sender<TailItem>,
        shutdown: CancellationToken,
    ) -> Arc<dyn Tail> {
        Arc::new(MemoryTail {
            log: self.clone(),
            sink,
            shutdown,
            followers: DashMap::new(),
        })
    }
}

/// Follows threads of a [`MemoryLog`]: one light task per followed thread, woken by appends.
struct MemoryTail {
    log: MemoryLog,
    sink: mpsc::Sender<TailItem>,
    shutdown: CancellationToken,
    followers: DashMap<ThreadId, CancellationToken>,
}

/// Largest batch a tail task hands to the hub at once.
const TAIL_BATCH: usize = 512;

impl Tail for MemoryTail {
    fn follow(&self, thread: ThreadId, epoch: Epoch, after: StreamPos) {
        let stop = self.shutdown.child_token();
        if let Some(old) = self.followers.insert(thread.clone(), stop.clone()) {
            old.cancel();
        }
        let log = self.log.thread(&thread);
        let sink = self.sink.clone();
        tokio::spawn(async move {
            let mut cursor = EventId { epoch, pos: after };
            loop {
                let notified = log.appended.notified();
                tokio::pin!(notified);
                // Register for the wake-up before reading, so an append between the read and
                // the wait is not missed.
                notified.as_mut().enable();
                let read = {
                    let inner = log.inner.lock();
                    inner
                        .read(ReadFrom::After(cursor), TAIL_BATCH)
                        .map_err(|gap| (gap, inner.head()))
                };
                let item = match read {
                    Ok(entries) if entries.is_empty() => None,
                    Ok(entries) => {
                        cursor = entries.last().map(|e| e.id).unwrap_or(cursor);
                        Some(TailItem::Entries {
                            thread: thread.clone(),
                            entries,
                        })
                    }
                    Err((reason, head)) => {
                        cursor = EventId {
                            epoch: head.epoch,
                            pos: head.last,
                        };
                        Some(TailItem::Discontinuity {
                            thread: thread.clone(),
                            head,
                            reason,
                        })
                    }
                };
                match item {
                    Some(item) => {
                        tokio::select! {
                            biased;
                            _ = stop.cancelled() => return,
                            sent = sink.send(item) => if sent.is_err() { return },
                        }
                    }
                    None => {
                        tokio::select! {
                            biased;
                            _ = stop.cancelled() => return,
                            _ = notified => {}
                        }
                    }
                }
            }
        });
    }

    fn unfollow(&self, thread: &ThreadId) {
        if let Some((_, stop)) = self.followers.remove(thread) {
            stop.cancel();
        }
    }
}
