//! Minimal cases of what the property found, as plain tests on a small rig (a log, the
//! publish path and a hub).

use crate::sim::settle;
use crate::sse;
use agui_fanout::event::{ThreadId, ValidEvent, validate_value};
use agui_fanout::fold::apply_patch;
use agui_fanout::fold::prelude;
use agui_fanout::hub::{Hub, Outcome, Start};
use agui_fanout::ingest::Ingest;
use agui_fanout::log::memory::MemoryLog;
use agui_fanout::log::{Epoch, EventId, EventLog, Retention, StreamPos};
use agui_fanout::queue::{Drained, Frame, QueueLimits};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

// ---- minimal cases of what the property found ---------------------------------------------

/// A log, the publish path and a hub, for the minimal cases below.
struct Rig {
    log: Arc<dyn EventLog>,
    ingest: Ingest,
    hub: Hub,
    thread: ThreadId,
    head: Option<EventId>,
    stop: CancellationToken,
}

impl Rig {
    fn new(retention: usize, limits: QueueLimits) -> Rig {
        let log: Arc<dyn EventLog> = Arc::new(MemoryLog::new(Retention {
            max_events: retention,
            max_age: None,
            idle_ttl: None,
        }));
        let stop = CancellationToken::new();
        Rig {
            ingest: Ingest::new(log.clone(), true, retention),
            hub: Hub::start(log.clone(), limits, stop.clone()),
            log,
            thread: ThreadId::parse("t").expect("a thread id"),
            head: None,
            stop,
        }
    }

    /// Publishes one batch (strict order) and waits until the hub fanned it out.
    async fn publish(&mut self, events: &[Value]) {
        self.publish_unsettled(events).await;
        settle(&self.hub, &self.thread, self.head)
            .await
            .expect("fanned out");
    }

    /// Publishes one batch (strict order).
    async fn publish_unsettled(&mut self, events: &[Value]) {
        let valid: Vec<ValidEvent> = events
            .iter()
            .map(|e| validate_value(e.clone(), Some(&self.thread)).expect("schema-valid"))
            .collect();
        let appended = self
            .ingest
            .append(&self.thread, &valid, None)
            .await
            .expect("appended");
        self.head = appended.ids.last().copied().or(self.head);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A current-thread runtime on paused time (in process: no socket to wait for).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// The events of a write (whole frames).
fn events_of(bytes: &[u8]) -> Vec<Value> {
    sse::body_events(bytes)
}

fn content(delta: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": delta})
}

/// PROTOCOL §2: `?from=start` sends the retained log from its first event only "when the log is
/// complete from the thread's beginning (otherwise it behaves as no id)", i.e. a prelude at the
/// head (§4.4).
///
/// Found by the property (order violation `first_event_must_be_run_started` on the first
/// event of a `?from=start` connection). Cause: `Hub::subscribe` decides with
/// `head.complete_from_start()` on the thread hub's `LogHead`, loaded when the thread hub
/// started; `fan_out` advances its `last` but never its `max_deleted`, so a thread trimmed
/// while followed still looks complete, the outcome is `Exact` and the backfill starts at the
/// first retained event, mid-run, without a prelude.
#[test]
fn from_start_on_a_thread_trimmed_while_followed_begins_with_a_prelude() {
    runtime().block_on(async {
        let mut rig = Rig::new(
            4,
            QueueLimits {
                max_events: 64,
                max_bytes: 1 << 20,
            },
        );
        rig.publish(&[json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"})])
            .await;
        // The hub follows the thread from here on.
        let _follower = rig
            .hub
            .subscribe(&rig.thread, Start::Live)
            .await
            .expect("subscribed");
        rig.publish(&[json!({"type": "TEXT_MESSAGE_START", "messageId": "m1"})])
            .await;
        for _ in 0..8 {
            rig.publish(&[content("x")]).await;
        }
        let head = rig.log.head(&rig.thread).await.expect("head");
        assert!(!head.complete_from_start(), "the log was trimmed: {head:?}");

        let sub = rig
            .hub
            .subscribe(&rig.thread, Start::FromStart)
            .await
            .expect("subscribed");
        let mut received = sub
            .prelude
            .as_ref()
            .map(|p| events_of(&p.bytes))
            .unwrap_or_default();
        for _ in 0..8 {
            tokio::task::yield_now().await;
            if let Some(Drained::Frames(b)) = sub.queue.try_drain() {
                received.extend(events_of(&b.concat()));
            }
        }
        assert_eq!(sub.outcome, Outcome::StartTrimmed, "received {received:?}");
        assert!(
            received.first().is_some_and(prelude::is_prelude_start),
            "the stream must begin with a prelude, got {received:?}"
        );
    });
}

/// PROTOCOL §6: "A checkpoint of the fold is kept with the log so a prelude can always be built,
/// however much was trimmed."
///
/// Found by the property (`the hub does not know the thread's fold` for a subscriber joining
/// later; the snapshot has no fold either). Cause: the count safety cap (`4 × max_events`
/// once a thread uses checkpoints) trims the oldest entries *after* the promoted checkpoint
/// when more than that many entries pile up before the next promotion; checkpoint + retained
/// entries then no longer make the fold (`load_fold` meets a gap after the checkpoint and
/// gives up), so a new subscriber gets no prelude (it starts live, mid-run) and, after a
/// restart, publishes go unchecked. First found with one large strict batch (> ~3 ×
/// `max_events`, which the working tree now refuses: batches are capped at 2 ×
/// `max_events`); still reachable, as here, when events appended to the log directly (PROTOCOL
/// §2 allows producers to write to the stream) come between the publish path's checkpoint
/// candidates, which count only its own events. Memory backend shown; the Redis script
/// follows the same rules.
#[test]
fn direct_appends_between_checkpoints_keep_the_fold_rebuildable() {
    runtime().block_on(async {
        let mut rig = Rig::new(
            4,
            QueueLimits {
                max_events: 64,
                max_bytes: 1 << 20,
            },
        );
        // Two candidates: the checkpoint at 0-4 is promoted (0-1..=0-4 trimmed), 0-8 pending.
        rig.publish_unsettled(&[
            json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1"}),
            content("a"),
            content("b"),
        ])
        .await;
        rig.publish_unsettled(&[content("c"), content("d"), content("e"), content("f")])
            .await;
        // A producer appends 13 events to the log itself: 0-5..=0-21 is 17 entries, over the
        // 16-entry cap, so 0-5 goes although the checkpoint stands at 0-4.
        let direct: Vec<ValidEvent> = (0..13)
            .map(|_| validate_value(content("g"), Some(&rig.thread)).expect("schema-valid"))
            .collect();
        rig.log
            .append(&rig.thread, &direct)
            .await
            .expect("appended");
        let head = rig.log.head(&rig.thread).await.expect("head");
        let ckpt = rig.log.checkpoint(&rig.thread).await.expect("checkpoint");
        let sub = rig
            .hub
            .subscribe(&rig.thread, Start::Live)
            .await
            .expect("subscribed");
        assert!(
            sub.fold_known && sub.prelude.is_some(),
            "no fold, no prelude: head {head:?}, checkpoint at {:?}",
            ckpt.map(|c| c.pos)
        );
    });
}

/// PROTOCOL §5 "Reset (queue still full): the queue is dropped and replaced by a bridge ...".
///
/// Found by the property (an `overflow` close of a connection that began with a prelude,
/// whose view the hub always knows). Cause: a full live buffer is coalesced in place
/// (`queue::compact`), and `coalesce::merge_run` builds the merged frame with `Frame::new`,
/// which has no `view`. When the writer's last frame taken is such a merged frame,
/// `ConnQueue::client_view` becomes `None`, so the next overflow cannot build a bridge and the
/// hub closes the stream (`CloseReason::Overflow`) instead of resetting it. The client
/// recovers by reconnecting, but the reset the spec promises is lost exactly for the slow
/// subscribers coalescing is for. (Same without the compaction — 4 deltas, then the 5 RAW —
/// and the queue is reset.)
#[test]
fn an_overflow_after_a_coalesced_write_resets_the_queue() {
    runtime().block_on(async {
        let mut rig = Rig::new(
            0,
            QueueLimits {
                max_events: 4,
                max_bytes: 1 << 20,
            },
        );
        rig.publish(&[
            json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1"}),
        ])
        .await;
        let sub = rig
            .hub
            .subscribe(&rig.thread, Start::Live)
            .await
            .expect("subscribed");
        assert!(sub.prelude.is_some());
        // Five deltas, one at a time: the fifth overflows `max_events` and the buffer is
        // coalesced into one frame.
        for d in ["a", "b", "c", "d", "e"] {
            rig.publish(&[content(d)]).await;
        }
        let Some(Drained::Frames(b)) = sub.queue.try_drain() else {
            panic!("frames expected");
        };
        assert_eq!(events_of(&b.concat()), vec![content("abcde")]);
        // Five events that cannot be merged: the buffer overflows again.
        for i in 0..5 {
            rig.publish(&[json!({"type": "CUSTOM", "name": "n", "value": i})])
                .await;
        }
        match sub.queue.try_drain() {
            Some(Drained::Frames(b)) => {
                let evs = events_of(&b.concat());
                // The gap event, the five CUSTOM events lost, then the restatement.
                assert_eq!(evs[0]["name"], "agui-fanout.gap", "a bridge: {evs:?}");
                assert_eq!(evs[0]["value"]["skipped"], 5, "a bridge: {evs:?}");
                assert_eq!(evs[1]["type"], "MESSAGES_SNAPSHOT", "a bridge: {evs:?}");
            }
            other => panic!("PROTOCOL §5: the queue must be reset to a bridge, got {other:?}"),
        }
    });
}

/// Property (b) does not hold for one case PROTOCOL §5 prescribes: a run of `STATE_DELTA`s with
/// a failing one becomes one `STATE_SNAPSHOT` of the whole folded state, which is larger than
/// the deltas when the state is. Ignored: the behaviour is the spec's; run it with
/// `--ignored` to see the figures. (A coalescer could leave such a run as it is when the
/// snapshot would be larger: the spec does not require merging.)
#[test]
#[ignore = "PROTOCOL §5 prescribes the snapshot; it can outgrow the deltas it replaces"]
fn a_failing_delta_run_coalesces_into_a_snapshot_larger_than_its_deltas() {
    let big = json!({"doc": "x".repeat(1000)});
    let born = Instant::now();
    let frame = |seq: u64, ev: Value, clean: bool, after: Option<Value>| {
        let json = serde_json::to_vec(&ev).expect("serialisable");
        let merge = agui_fanout::queue::MergeKey::of(
            agui_fanout::event::EventType::StateDelta,
            &ev,
            clean,
            after.map(Arc::new),
        );
        Frame::new(
            EventId {
                epoch: Epoch(1),
                pos: StreamPos::new(0, seq),
            },
            agui_fanout::event::EventType::StateDelta,
            &json,
            born,
            merge,
        )
    };
    let mut with_a = big.clone();
    with_a["a"] = json!(1);
    let mut frames = vec![
        frame(
            1,
            json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": 1}]}),
            true,
            None,
        ),
        frame(
            2,
            json!({"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/missing"}]}),
            false,
            Some(with_a),
        ),
    ];
    let before: usize = frames.iter().map(|f| f.bytes.len()).sum();
    agui_fanout::queue::coalesce::coalesce(&mut frames, |d, o| apply_patch(d, o).ok());
    let after: usize = frames.iter().map(|f| f.bytes.len()).sum();
    assert!(
        after <= before,
        "2 deltas of {before} bytes became 1 {} of {after} bytes",
        frames[0].event_type.as_str()
    );
}
