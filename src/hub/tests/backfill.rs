//! The backfill of an exact resume: its range, the hand-over to live, how it ends.

use super::*;
use crate::hub::backfill::{Opening, backfill};
use crate::queue::Frame;
use std::time::Instant;

fn backfill_queue(after: StreamPos) -> Arc<ConnQueue> {
    let limits = QueueLimits {
        max_events: 100,
        max_bytes: 1 << 20,
    };
    Arc::new(ConnQueue::new(limits, after, true, None))
}

/// The backfill reads `(after, until]` only; the live buffer waits until it is done.
#[tokio::test(start_paused = true)]
async fn backfill_reads_up_to_the_cursor_then_hands_over() {
    let rig = Rig::new(100);
    let ids = rig.publish_run(9).await;
    let entries = rig
        .log
        .read(&rig.thread, ReadFrom::Start, 100)
        .await
        .unwrap();
    let queue = backfill_queue(ids[1].pos);
    queue
        .push_live(&[Frame::encode(&entries[9], Instant::now())])
        .unwrap();
    assert!(queue.try_drain().is_none(), "live waits for the backfill");
    backfill(
        rig.log.clone(),
        rig.thread.clone(),
        ReadFrom::After(ids[1]),
        ids[5].pos,
        queue.clone(),
        CancellationToken::new(),
        Opening::Plain,
    )
    .await;
    let got = read_until(&queue, ids[9]).await;
    let mut want = id_texts(&ids[2..=5]);
    want.extend(id_texts(&ids[9..]));
    assert_eq!(ids_of(&got), want);
}

/// A resume far back (several log pages, the backfill waiting for the writer between them)
/// while a producer keeps appending: every event after the id arrives once, in order.
#[tokio::test(start_paused = true)]
async fn backfill_hands_over_to_live_with_no_gap_and_no_duplicate() {
    let rig = Arc::new(Rig::new(1000));
    let mut ids = rig.publish_run(1500).await;
    let producer = {
        let rig = rig.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..100 {
                ids.extend(rig.publish(&[custom(i), custom(i + 1)]).await);
                tokio::task::yield_now().await;
            }
            ids
        })
    };
    let _live = rig.subscribe(Start::Live).await;
    tokio::task::yield_now().await;
    let sub = rig.subscribe(Start::After(ids[10])).await;
    ids.extend(producer.await.unwrap());
    let got = read_until(&sub.queue, *ids.last().unwrap()).await;
    assert_eq!(ids_of(&got), id_texts(&ids[11..]));
    assert!(sub.queue.try_drain().is_none());
}

/// A range no longer in the log closes the stream (discontinuity: the client comes back and
/// gets a prelude); a failing read closes it too (backend).
#[tokio::test(start_paused = true)]
async fn a_backfill_that_cannot_read_closes_the_stream() {
    let rig = Rig::new(100);
    let ids = rig.publish_run(3).await;
    let other_epoch = EventId {
        epoch: Epoch(ids[0].epoch.0.wrapping_add(1)),
        pos: ids[0].pos,
    };
    for (from, error, reason) in [
        (other_epoch, None, CloseReason::Discontinuity),
        (
            ids[0],
            Some(LogError::Unavailable("down".into())),
            CloseReason::Backend,
        ),
    ] {
        rig.log.fail_reads(error);
        let queue = backfill_queue(ids[0].pos);
        backfill(
            rig.log.clone(),
            rig.thread.clone(),
            ReadFrom::After(from),
            ids[3].pos,
            queue.clone(),
            CancellationToken::new(),
            Opening::Plain,
        )
        .await;
        assert_eq!(closed(&queue).await, reason);
    }
}

/// A stopped backfill (its subscriber left) reads nothing and does not hand over.
#[tokio::test(start_paused = true)]
async fn a_stopped_backfill_ends_without_handing_over() {
    let rig = Rig::new(100);
    let ids = rig.publish_run(3).await;
    let queue = backfill_queue(ids[0].pos);
    let stop = CancellationToken::new();
    stop.cancel();
    backfill(
        rig.log.clone(),
        rig.thread.clone(),
        ReadFrom::After(ids[0]),
        ids[3].pos,
        queue.clone(),
        stop,
        Opening::Plain,
    )
    .await;
    assert!(queue.try_drain().is_none());
    assert!(!queue.is_closed());
}

/// `?from=start` (decided on a complete log) reads "after position 0" of the thread's
/// epoch: trimmed in between, the stream is closed rather than started mid-thread.
#[tokio::test(start_paused = true)]
async fn from_start_trimmed_meanwhile_closes_the_stream() {
    let rig = Rig::with_retention(100, 3);
    let ids = rig.publish_run(10).await;
    let queue = backfill_queue(StreamPos::ZERO);
    rig.hub.spawn_backfill(
        &rig.thread,
        ReadFrom::Start,
        Some(ids[0].epoch),
        ids.last().unwrap().pos,
        queue.clone(),
        CancellationToken::new(),
        Opening::Plain,
    );
    assert_eq!(closed(&queue).await, CloseReason::Discontinuity);
}
