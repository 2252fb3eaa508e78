//! Unit tests of the hub's jobs against the in-memory log, one file per job; this file holds
//! the rig they share (a [`MemoryLog`] the tests can watch and steer, a started [`Hub`], an
//! SSE reader for the queues).

mod backfill;
mod bridge;
mod epoch;
mod fanout;
mod registry;
mod snapshot;
mod subscribe;

use super::{Hub, Start, Subscription, ThreadHub};
use crate::event::{ThreadId, ValidEvent, validate_event};
use crate::log::memory::MemoryLog;
use crate::log::{
    AppendExtras, Checkpoint, Epoch, EventId, EventLog, ListCursor, LogEntry, LogError, LogHead,
    ReadFrom, ResumeCheck, Retention, StreamPos, Tail, TailItem, ThreadPage, ThreadSummary,
};
use crate::queue::{CloseReason, ConnQueue, Drained, QueueLimits};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// How long a test waits for the hub (virtual time: the tests run with paused time, so a
/// wait for something that never comes ends at once).
const WAIT: Duration = Duration::from_secs(30);

/// A [`MemoryLog`] that lets a test see and steer the hub's use of it: which threads the
/// tail follows, items injected into the hub's tail channel, reads that fail.
pub(super) struct TestLog {
    memory: MemoryLog,
    /// The hub's tail channel (set by `start_tail`).
    sink: Mutex<Option<mpsc::Sender<TailItem>>>,
    /// The threads the tail follows now.
    followed: Arc<Mutex<HashSet<ThreadId>>>,
    /// While set, `read` fails with this error.
    failing_reads: Mutex<Option<LogError>>,
    /// While `true`, what the tail reads is held back from the hub (a tail that has not
    /// noticed yet), then handed over in order.
    tail_held: watch::Sender<bool>,
    /// Positions the log lost (a tail a failover rolled back, the log grown past it): reads
    /// leave them out, and resuming after one is [`ResumeGap::Unknown`], forking at the last
    /// entry kept before it.
    rolled_back: Mutex<HashSet<StreamPos>>,
}

impl TestLog {
    fn new(retention: Retention) -> Self {
        TestLog {
            memory: MemoryLog::new(retention),
            sink: Mutex::new(None),
            followed: Arc::default(),
            failing_reads: Mutex::new(None),
            tail_held: watch::Sender::new(false),
            rolled_back: Mutex::default(),
        }
    }

    /// From now on, the log lost the entry at `pos`: left out of reads, and a resume after it
    /// answered as by a log that never held it (what Redis answers after a failover lost the
    /// entry and the log grew past it; the memory log's consecutive positions cannot lose
    /// one).
    pub(super) fn roll_back(&self, pos: StreamPos) {
        self.rolled_back.lock().insert(pos);
    }

    fn is_rolled_back(&self, pos: StreamPos) -> bool {
        self.rolled_back.lock().contains(&pos)
    }

    /// Holds back what the tail reads from the hub (`true`), or hands it over (`false`).
    pub(super) fn hold_tail(&self, held: bool) {
        self.tail_held.send_replace(held);
    }

    /// Loses the thread's data as a Redis restarted empty would: a new epoch, no entries.
    pub(super) fn lose(&self, thread: &ThreadId) {
        self.memory.lose(thread);
    }

    /// Whether the tail follows `thread` now.
    pub(super) fn follows(&self, thread: &ThreadId) -> bool {
        self.followed.lock().contains(thread)
    }

    /// Hands `item` to the hub as if its tail had read it.
    pub(super) async fn inject(&self, item: TailItem) {
        let sink = self.sink.lock().clone().expect("the hub started the tail");
        sink.send(item).await.expect("the hub's dispatcher runs");
    }

    /// Makes every read fail with `error` (`None`: reads work again).
    pub(super) fn fail_reads(&self, error: Option<LogError>) {
        *self.failing_reads.lock() = error;
    }
}

#[async_trait::async_trait]
impl EventLog for TestLog {
    fn name(&self) -> &'static str {
        "test"
    }

    async fn append_checked(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: Option<LogHead>,
        extras: AppendExtras,
    ) -> Result<Vec<EventId>, LogError> {
        self.memory
            .append_checked(thread, events, expected, extras)
            .await
    }

    async fn producer_seq(&self, thread: &ThreadId, producer: &str) -> Result<u64, LogError> {
        self.memory.producer_seq(thread, producer).await
    }

    async fn checkpoint(&self, thread: &ThreadId) -> Result<Option<Checkpoint>, LogError> {
        self.memory.checkpoint(thread).await
    }

    async fn read(
        &self,
        thread: &ThreadId,
        from: ReadFrom,
        limit: usize,
    ) -> Result<Vec<LogEntry>, LogError> {
        if let Some(e) = self.failing_reads.lock().clone() {
            return Err(e);
        }
        if let ReadFrom::After(id) = from
            && let Err(gap) = self.check_resume(thread, id).await?.verdict
        {
            return Err(LogError::Gap(gap));
        }
        let lost = self.rolled_back.lock().len();
        let mut entries = self
            .memory
            .read(thread, from, limit.saturating_add(lost))
            .await?;
        entries.retain(|e| !self.is_rolled_back(e.id.pos));
        entries.truncate(limit);
        Ok(entries)
    }

    async fn check_resume(&self, thread: &ThreadId, id: EventId) -> Result<ResumeCheck, LogError> {
        if let Some(e) = self.failing_reads.lock().clone() {
            return Err(e);
        }
        let check = self.memory.check_resume(thread, id).await?;
        let held = check.verdict.is_ok() && !self.is_rolled_back(id.pos);
        let before = self
            .memory
            .read(thread, ReadFrom::Start, usize::MAX)
            .await?
            .iter()
            .map(|e| e.id.pos)
            .rfind(|&pos| pos <= id.pos && !self.is_rolled_back(pos));
        Ok(ResumeCheck::new(check.head, id, held, before))
    }

    async fn head(&self, thread: &ThreadId) -> Result<LogHead, LogError> {
        self.memory.head(thread).await
    }

    async fn ping(&self) -> Result<(), LogError> {
        Ok(())
    }

    async fn list_threads(
        &self,
        prefix: &str,
        cursor: &ListCursor,
        limit: usize,
    ) -> Result<ThreadPage, LogError> {
        self.memory.list_threads(prefix, cursor, limit).await
    }

    async fn summary(&self, thread: &ThreadId) -> Result<ThreadSummary, LogError> {
        self.memory.summary(thread).await
    }

    fn start_tail(
        &self,
        sink: mpsc::Sender<TailItem>,
        shutdown: CancellationToken,
    ) -> Arc<dyn Tail> {
        *self.sink.lock() = Some(sink.clone());
        // The memory tail writes to a gate that forwards to the hub unless held.
        let (gate, mut gated) = mpsc::channel::<TailItem>(1024);
        let mut held = self.tail_held.subscribe();
        tokio::spawn(async move {
            while let Some(item) = gated.recv().await {
                while *held.borrow_and_update() {
                    if held.changed().await.is_err() {
                        return;
                    }
                }
                if sink.send(item).await.is_err() {
                    return;
                }
            }
        });
        Arc::new(RecordingTail {
            inner: self.memory.start_tail(gate, shutdown),
            followed: self.followed.clone(),
        })
    }
}

/// The memory log's tail, recording which threads it follows.
struct RecordingTail {
    inner: Arc<dyn Tail>,
    followed: Arc<Mutex<HashSet<ThreadId>>>,
}

impl Tail for RecordingTail {
    fn follow(&self, thread: ThreadId, epoch: Epoch, after: StreamPos) {
        self.followed.lock().insert(thread.clone());
        self.inner.follow(thread, epoch, after);
    }

    fn unfollow(&self, thread: &ThreadId) {
        self.followed.lock().remove(thread);
        self.inner.unfollow(thread);
    }
}

/// A hub over a [`TestLog`], and one thread to work on.
pub(super) struct Rig {
    pub(super) log: Arc<TestLog>,
    pub(super) hub: Hub,
    pub(super) thread: ThreadId,
    stop: CancellationToken,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Rig {
    /// A hub whose queues hold `max_events` frames, over an untrimmed log.
    pub(super) fn new(max_events: usize) -> Rig {
        Rig::with_retention(max_events, 0)
    }

    /// A hub whose queues hold `max_events` frames, over a log that keeps about
    /// `kept_events` events per thread (`0`: all of them).
    pub(super) fn with_retention(max_events: usize, kept_events: usize) -> Rig {
        let log = Arc::new(TestLog::new(Retention {
            max_events: kept_events,
            max_age: None,
            idle_ttl: None,
        }));
        let stop = CancellationToken::new();
        let limits = QueueLimits {
            max_events,
            max_bytes: 1 << 24,
        };
        let hub = Hub::start(log.clone(), limits, stop.clone());
        Rig {
            log,
            hub,
            thread: ThreadId::parse("hub-test").unwrap(),
            stop,
        }
    }

    /// `events`, validated for the thread.
    pub(super) fn valid(&self, events: &[Value]) -> Vec<ValidEvent> {
        events
            .iter()
            .map(|e| validate_event(e.to_string().as_bytes(), Some(&self.thread)).unwrap())
            .collect()
    }

    /// Appends `events` to the thread's log in one batch.
    pub(super) async fn publish(&self, events: &[Value]) -> Vec<EventId> {
        self.log
            .append(&self.thread, &self.valid(events))
            .await
            .unwrap()
    }

    /// Appends `RUN_STARTED` and `n` `CUSTOM` events, one batch each; their ids.
    pub(super) async fn publish_run(&self, n: usize) -> Vec<EventId> {
        let mut ids = self.publish(&[run_started(&self.thread)]).await;
        for i in 0..n {
            ids.extend(self.publish(&[custom(i)]).await);
        }
        ids
    }

    /// Registers a subscriber.
    pub(super) async fn subscribe(&self, start: Start) -> Subscription {
        self.hub.subscribe(&self.thread, start).await.unwrap()
    }

    /// The followed thread's hub.
    pub(super) fn thread_hub(&self) -> Arc<ThreadHub> {
        self.hub
            .followed(&self.thread)
            .expect("the thread is followed")
    }

    /// Waits until the hub has fanned out everything in the log.
    pub(super) async fn settled(&self) {
        let head = self.log.head(&self.thread).await.unwrap();
        let th = self.thread_hub();
        tokio::time::timeout(WAIT, async {
            while th.state.lock().cursor != head.last {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the hub fanned out the log");
    }
}

/// `RUN_STARTED` of run `r1` on `thread`.
pub(super) fn run_started(thread: &ThreadId) -> Value {
    json!({"type": "RUN_STARTED", "threadId": thread.as_str(), "runId": "r1"})
}

/// A `CUSTOM` event carrying `i` (never merged).
pub(super) fn custom(i: usize) -> Value {
    json!({"type": "CUSTOM", "name": "n", "value": i})
}

/// One SSE event as a client reads it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sse {
    /// The `id:` field, when the event has one.
    pub(super) id: Option<String>,
    /// The `data:` field, parsed.
    pub(super) data: Value,
}

impl Sse {
    /// The event's AG-UI `type`.
    pub(super) fn event_type(&self) -> &str {
        self.data["type"].as_str().unwrap_or("")
    }
}

/// Parses SSE frames (`id: …\ndata: …\n\n`, LF only).
pub(super) fn parse(bytes: &[u8]) -> Vec<Sse> {
    let text = std::str::from_utf8(bytes).unwrap();
    assert!(text.ends_with("\n\n"), "whole frames only: {text:?}");
    text.split_terminator("\n\n")
        .map(|block| {
            let mut id = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str(v).unwrap());
                } else {
                    panic!("unexpected line {line:?}");
                }
            }
            Sse {
                id,
                data: data.expect("a data line"),
            }
        })
        .collect()
}

/// The next batch the queue's writer would get; panics when nothing comes.
pub(super) async fn next_batch(queue: &ConnQueue) -> Drained {
    tokio::time::timeout(WAIT, queue.next_batch())
        .await
        .expect("the queue delivers")
}

/// The events of the next batch; panics when the queue was closed.
pub(super) async fn next_events(queue: &ConnQueue) -> Vec<Sse> {
    match next_batch(queue).await {
        Drained::Frames(batch) => parse(&batch.concat()),
        Drained::Closed(reason) => panic!("closed: {reason:?}"),
    }
}

/// Reads the queue until the event with id `last`; every event read.
pub(super) async fn read_until(queue: &ConnQueue, last: EventId) -> Vec<Sse> {
    let last = last.to_string();
    let mut out: Vec<Sse> = Vec::new();
    while out.last().and_then(|e| e.id.as_deref()) != Some(last.as_str()) {
        out.extend(next_events(queue).await);
    }
    out
}

/// Why the queue was closed; panics when it delivers frames instead.
pub(super) async fn closed(queue: &ConnQueue) -> CloseReason {
    match next_batch(queue).await {
        Drained::Closed(reason) => reason,
        Drained::Frames(bytes) => panic!("frames, not a close: {bytes:?}"),
    }
}

/// The ids of `events`, as text (`None` for events without one).
pub(super) fn ids_of(events: &[Sse]) -> Vec<Option<String>> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// `ids` as the id texts a client would read.
pub(super) fn id_texts(ids: &[EventId]) -> Vec<Option<String>> {
    ids.iter().map(|id| Some(id.to_string())).collect()
}
