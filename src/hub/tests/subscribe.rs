//! Registering subscribers: where each kind of start begins, and unregistering.

use super::*;
use crate::hub::Outcome;
use crate::log::ResumeGap;

/// A new subscriber starts at the hub's cursor with a prelude of the fold there, and gets
/// only what is appended afterwards.
#[tokio::test(start_paused = true)]
async fn a_fresh_subscriber_gets_a_prelude_at_the_head() {
    let rig = Rig::new(100);
    let mut ids = rig.publish_run(2).await;
    ids.extend(
        rig.publish(&[json!({"type": "STATE_SNAPSHOT", "snapshot": {"n": 1}})])
            .await,
    );
    let sub = rig.subscribe(Start::Live).await;
    assert_eq!(sub.outcome, Outcome::Exact);
    assert!(sub.fold_known);
    let prelude = parse(&sub.prelude.as_ref().expect("a prelude").bytes);
    let types: Vec<&str> = prelude.iter().map(Sse::event_type).collect();
    assert_eq!(
        types,
        ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"]
    );
    assert_eq!(prelude[2].data["snapshot"], json!({"n": 1}));
    // Only the prelude's last event carries an id: the head.
    let last = ids.last().unwrap().to_string();
    assert_eq!(ids_of(&prelude), [None, None, Some(last)]);

    let next = rig.publish(&[custom(9)]).await;
    assert_eq!(ids_of(&next_events(&sub.queue).await), id_texts(&next));
    assert!(sub.queue.try_drain().is_none());
}

/// A resumable `Last-Event-ID` gets exactly the events after it (backfill), then live ones,
/// and no prelude.
#[tokio::test(start_paused = true)]
async fn a_resumable_id_gets_exactly_the_missed_events() {
    let rig = Rig::new(100);
    let ids = rig.publish_run(5).await;
    // Another subscriber keeps the thread followed, with the hub's cursor at the head.
    let _other = rig.subscribe(Start::Live).await;
    let sub = rig.subscribe(Start::After(ids[2])).await;
    assert_eq!(sub.outcome, Outcome::Exact);
    assert!(sub.prelude.is_none());
    let more = rig.publish(&[custom(10), custom(11)]).await;
    let got = read_until(&sub.queue, more[1]).await;
    let mut want = id_texts(&ids[3..]);
    want.extend(id_texts(&more));
    assert_eq!(ids_of(&got), want);
    assert!(sub.queue.try_drain().is_none());
}

/// Ids that cannot be resumed exactly start with a prelude at the head, and say why (an id
/// of another epoch gets the current epoch from its start instead while that is complete:
/// `epoch.rs`). An id ahead of the log forks at its last entry, the head here, so the thread
/// hub's prelude is the fork's.
#[tokio::test(start_paused = true)]
async fn an_unresumable_id_gets_a_prelude_at_the_head() {
    let rig = Rig::new(100);
    let ids = rig.publish_run(3).await;
    let head = *ids.last().unwrap();
    let ahead = EventId {
        epoch: head.epoch,
        pos: StreamPos::new(head.pos.ms, head.pos.seq + 5),
    };
    for (start, gap) in [
        (Start::After(ahead), Outcome::ForkPoint(ResumeGap::Ahead)),
        (
            Start::InsideBridge(ids[1]),
            Outcome::Unresumable(ResumeGap::InsideBridge),
        ),
    ] {
        let sub = rig.subscribe(start).await;
        assert_eq!(sub.outcome, gap, "{start:?}");
        let prelude = parse(&sub.prelude.as_ref().expect("a prelude").bytes);
        assert_eq!(
            prelude.last().unwrap().id,
            Some(head.to_string()),
            "{start:?}"
        );
        assert!(sub.queue.try_drain().is_none(), "{start:?}");
    }
}

/// `?from=start` on a complete log reads it from its first event.
#[tokio::test(start_paused = true)]
async fn from_start_reads_the_whole_log() {
    let rig = Rig::new(100);
    let ids = rig.publish_run(4).await;
    let sub = rig.subscribe(Start::FromStart).await;
    assert_eq!(sub.outcome, Outcome::Exact);
    assert!(sub.prelude.is_none());
    let got = read_until(&sub.queue, *ids.last().unwrap()).await;
    assert_eq!(ids_of(&got), id_texts(&ids));
    assert_eq!(got[0].event_type(), "RUN_STARTED");
}

/// `?from=start` on a trimmed log (no checkpoint: no fold either) starts live at the head.
#[tokio::test(start_paused = true)]
async fn from_start_on_a_trimmed_log_starts_at_the_head() {
    let rig = Rig::with_retention(100, 3);
    rig.publish_run(10).await;
    let sub = rig.subscribe(Start::FromStart).await;
    assert_eq!(sub.outcome, Outcome::StartTrimmed);
    assert!(!sub.fold_known);
    assert!(sub.prelude.is_none());
    let next = rig.publish(&[custom(20)]).await;
    assert_eq!(ids_of(&next_events(&sub.queue).await), id_texts(&next));
}

/// The thread is followed while it has subscribers, and no longer once the last one left;
/// a later subscriber follows it again.
#[tokio::test(start_paused = true)]
async fn a_thread_with_no_subscribers_left_is_no_longer_followed() {
    let rig = Rig::new(100);
    rig.publish_run(1).await;
    let a = rig.subscribe(Start::Live).await;
    let b = rig.subscribe(Start::Live).await;
    assert!(rig.log.follows(&rig.thread));
    assert_eq!(rig.hub.followed_threads(), 1);
    drop(a);
    assert!(rig.log.follows(&rig.thread), "one subscriber is left");
    assert_eq!(rig.hub.followed_threads(), 1);
    let kept = b.queue.clone();
    drop(b);
    assert!(!rig.log.follows(&rig.thread));
    assert_eq!(rig.hub.followed_threads(), 0);
    assert!(rig.hub.followed(&rig.thread).is_none());
    assert_eq!(closed(&kept).await, CloseReason::Shutdown);

    // Appends meanwhile are not the hub's business; a new subscriber starts at the head.
    let missed = rig.publish(&[custom(5)]).await;
    let c = rig.subscribe(Start::Live).await;
    assert!(rig.log.follows(&rig.thread));
    let prelude = parse(&c.prelude.as_ref().unwrap().bytes);
    assert_eq!(prelude.last().unwrap().id, Some(missed[0].to_string()));
    let next = rig.publish(&[custom(6)]).await;
    assert_eq!(ids_of(&next_events(&c.queue).await), id_texts(&next));
}
