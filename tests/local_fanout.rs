//! The memory log's publishes are fanned out by the publish itself (`LocalAppends` with the
//! head the batch was appended on): the frames are in the subscribers' queues when the append
//! returns, the tail does not bring them back twice, and a thread with more subscribers than
//! the publish serves itself still gets every event through the tail, which the hub wakes.

use agui_fanout::event::{ThreadId, ValidEvent, validate_value};
use agui_fanout::hub::{Hub, Start, Subscription};
use agui_fanout::ingest::Ingest;
use agui_fanout::log::memory::MemoryLog;
use agui_fanout::log::{EventLog, Retention};
use agui_fanout::queue::{Drained, QueueLimits};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct Rig {
    thread: ThreadId,
    ingest: Ingest,
    hub: Hub,
    stop: CancellationToken,
}

impl Rig {
    fn new() -> Rig {
        let log: Arc<dyn EventLog> = Arc::new(MemoryLog::new(Retention::default()));
        let ingest = Ingest::new(log.clone(), true, Retention::default().max_events);
        let stop = CancellationToken::new();
        let hub = Hub::start(
            log,
            QueueLimits {
                max_events: 10_000,
                max_bytes: 1 << 24,
            },
            stop.clone(),
        );
        ingest.hand_values_to(Arc::new(hub.clone()));
        Rig {
            thread: ThreadId::parse("local-fanout").unwrap(),
            ingest,
            hub,
            stop,
        }
    }

    async fn publish(&self, events: &[Value]) {
        let valid: Vec<ValidEvent> = events
            .iter()
            .map(|e| validate_value(e.clone(), Some(&self.thread)).expect("valid event"))
            .collect();
        self.ingest
            .append(&self.thread, &valid, None)
            .await
            .expect("appended");
    }

    async fn subscribers(&self, n: usize) -> Vec<Subscription> {
        let mut subs = Vec::with_capacity(n);
        for _ in 0..n {
            subs.push(self.hub.subscribe(&self.thread, Start::Live).await.unwrap());
        }
        subs
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn content(i: usize) -> Value {
    json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":format!("t{i} ")})
}

/// The `id:` lines of what `sub`'s queue holds now, without waiting.
fn ids_now(sub: &Subscription) -> Vec<String> {
    match sub.queue.try_drain() {
        Some(Drained::Frames(batch)) => String::from_utf8(batch.concat().to_vec())
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("id: ").map(str::to_owned))
            .collect(),
        Some(Drained::Closed(reason)) => panic!("closed: {reason:?}"),
        None => Vec::new(),
    }
}

/// Collects `n` ids from `sub`, waiting for the tail where needed.
async fn ids(sub: &Subscription, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < n {
        let batch = tokio::time::timeout(Duration::from_secs(5), sub.queue.next_batch())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} events came", got.len()));
        let Drained::Frames(batch) = batch else {
            panic!("closed")
        };
        let text = String::from_utf8(batch.concat().to_vec()).unwrap();
        got.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("id: ").map(str::to_owned)),
        );
    }
    got
}

#[tokio::test]
async fn a_publish_fans_out_before_it_returns_and_the_tail_does_not_repeat_it() {
    let rig = Rig::new();
    rig.publish(&[
        json!({"type":"RUN_STARTED","threadId":"local-fanout","runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
    ])
    .await;
    let subs = rig.subscribers(3).await;
    // Give the tail its first read (it follows from the head the subscribe loaded).
    tokio::time::sleep(Duration::from_millis(20)).await;
    for i in 0..5 {
        rig.publish(&[content(i)]).await;
        // Current-thread runtime: no other task ran since the append; the frame is queued.
        for s in &subs {
            assert_eq!(
                ids_now(s).len(),
                1,
                "event {i} queued by the publish itself"
            );
        }
    }
    // The tail wakes for nothing: the queues stay empty.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for s in &subs {
        assert!(ids_now(s).is_empty(), "nothing fanned out twice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_subscribers_than_a_publish_serves_get_every_event_once_through_the_tail() {
    let rig = Rig::new();
    rig.publish(&[
        json!({"type":"RUN_STARTED","threadId":"local-fanout","runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
    ])
    .await;
    // Above the inline bound (64): the tail carries the events; the quiet appends wake it.
    let mut subs = rig.subscribers(70).await;
    let mut expected: Vec<Vec<String>> = vec![Vec::new(); subs.len()];
    for i in 0..20 {
        rig.publish(&[content(i)]).await;
    }
    for (s, want) in subs.iter().zip(&mut expected) {
        *want = ids(s, 20).await;
    }
    // Down to a few: the publishes serve them again, after whatever the tail still holds.
    subs.truncate(4);
    for i in 20..40 {
        rig.publish(&[content(i)]).await;
    }
    for (s, want) in subs.iter().zip(&mut expected) {
        let more = ids(s, 20).await;
        want.extend(more);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (s, got) in subs.iter().zip(&expected) {
        assert!(ids_now(s).is_empty(), "nothing fanned out twice");
        assert_eq!(got.len(), 40);
        assert_eq!(got, &expected[0], "every subscriber got the same ids");
        let mut sorted = got.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), 40, "no duplicate ids");
    }
}
