//! Resuming across a lost log (a new epoch): never from the thread hub's fold of the dead
//! epoch, and from the new epoch's first event, so that nothing the log holds is skipped.

use super::*;
use crate::hub::Outcome;
use crate::log::ResumeGap;

/// The types of `events`.
fn types(events: &[Sse]) -> Vec<&str> {
    events.iter().map(Sse::event_type).collect()
}

/// `state` set in the log.
fn state(value: Value) -> Value {
    json!({"type": "STATE_SNAPSHOT", "snapshot": value})
}

/// A prelude at the new epoch's first event (`RUN_STARTED`, marked) that clears what the client
/// holds from the dead epoch: empty messages, `{}` state; only its last event carries the
/// first event's id.
fn assert_epoch_prelude(got: &[Sse], first: EventId) {
    assert_eq!(
        types(&got[..3]),
        ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"],
        "{got:?}"
    );
    assert_eq!(
        got[0].data["metadata"]["agui-fanout"]["prelude"],
        json!(true),
        "a prelude starts a fresh sequence: {got:?}"
    );
    assert_eq!(got[1].data["messages"], json!([]));
    assert_eq!(got[2].data["snapshot"], json!({}));
    assert_eq!(ids_of(&got[..3]), [None, None, Some(first.to_string())]);
}

/// Redis lost the thread's data and the new epoch already holds acknowledged events, before
/// this node's tail noticed: a client resuming with its old id gets the new epoch from its
/// first event (prelude, then every event), never a prelude of the node's fold of the dead
/// epoch (its old state, an old id). The thread hub that folded the dead epoch ends its
/// streams; the tail's late report of the new epoch does not end the new stream.
#[tokio::test(start_paused = true)]
async fn an_old_epoch_id_gets_the_new_epoch_from_its_first_event() {
    let rig = Rig::new(100);
    let mut old = rig.publish_run(2).await;
    old.extend(rig.publish(&[state(json!({"old": true}))]).await);
    let watcher = rig.subscribe(Start::Live).await;
    rig.settled().await;

    rig.log.hold_tail(true);
    // The last event of the dead epoch: read by the tail, never fanned out.
    rig.publish(&[custom(99)]).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    rig.log.lose(&rig.thread);
    let new = rig.publish_run(3).await;
    assert_ne!(new[0].epoch, old[0].epoch, "the lost log has a new epoch");
    // The tail has read the new epoch, and not handed its report over yet.
    tokio::time::sleep(Duration::from_millis(10)).await;

    let sub = rig.subscribe(Start::After(*old.last().unwrap())).await;
    assert_eq!(sub.outcome, Outcome::EpochStart);
    assert!(sub.prelude.is_none(), "the backfill opens the stream");
    let got = read_until(&sub.queue, *new.last().unwrap()).await;
    assert_epoch_prelude(&got, new[0]);
    assert_eq!(types(&got[3..]), ["CUSTOM"; 3], "{got:?}");
    assert_eq!(ids_of(&got[3..]), id_texts(&new[1..]));
    assert_eq!(
        closed(&watcher.queue).await,
        CloseReason::Discontinuity,
        "the streams of the dead epoch's fold end"
    );

    // What the tail read for its follow of the dead epoch (its last event, then the report
    // of the new epoch) comes late, to the rebuilt thread hub, which takes none of it.
    rig.log.hold_tail(false);
    let more = rig.publish(&[custom(9)]).await;
    assert_eq!(ids_of(&next_events(&sub.queue).await), id_texts(&more));
    let snapshot = rig
        .hub
        .snapshot(&rig.thread)
        .await
        .unwrap()
        .expect("a fold");
    assert_eq!(snapshot["state"], json!({}));
}

/// An id of the new epoch (from another node) on a node whose thread hub still folds the dead
/// epoch resumes exactly, rather than getting a prelude of the dead epoch.
#[tokio::test(start_paused = true)]
async fn a_new_epoch_id_on_a_stale_thread_hub_resumes_exactly() {
    let rig = Rig::new(100);
    rig.publish_run(1).await;
    let _watcher = rig.subscribe(Start::Live).await;
    rig.settled().await;
    rig.log.hold_tail(true);
    rig.log.lose(&rig.thread);
    let new = rig.publish_run(3).await;

    let sub = rig.subscribe(Start::After(new[1])).await;
    assert_eq!(sub.outcome, Outcome::Exact);
    assert!(sub.prelude.is_none());
    let got = read_until(&sub.queue, new[3]).await;
    assert_eq!(ids_of(&got), id_texts(&new[2..]));
}

/// The new epoch has no event yet: the stream waits for the first one and opens with the
/// prelude at it (only a stream that starts with `RUN_STARTED` can clear the client's
/// snapshots), then the events after it.
#[tokio::test(start_paused = true)]
async fn an_old_epoch_id_on_an_empty_epoch_waits_for_its_first_event() {
    let rig = Rig::new(100);
    let old = rig.publish_run(2).await;
    rig.log.lose(&rig.thread);

    let sub = rig.subscribe(Start::After(old[2])).await;
    assert_eq!(sub.outcome, Outcome::EpochStart);
    assert!(sub.prelude.is_none());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        sub.queue.try_drain().is_none(),
        "nothing before the first event"
    );

    let new = rig
        .publish(&[run_started(&rig.thread), state(json!({"k": 1})), custom(1)])
        .await;
    let got = read_until(&sub.queue, new[2]).await;
    assert_epoch_prelude(&got, new[0]);
    assert_eq!(types(&got[3..]), ["STATE_SNAPSHOT", "CUSTOM"]);
    assert_eq!(ids_of(&got[3..]), id_texts(&new[1..]));
    let more = rig.publish(&[custom(2)]).await;
    assert_eq!(ids_of(&next_events(&sub.queue).await), id_texts(&more));
}

/// The new epoch's log is no longer complete from its start: a prelude at the head, as for
/// any id that cannot be resumed (here without a fold: trimmed and no checkpoint).
#[tokio::test(start_paused = true)]
async fn an_old_epoch_id_on_a_trimmed_epoch_starts_at_the_head() {
    let rig = Rig::with_retention(100, 3);
    let old = rig.publish_run(1).await;
    rig.log.lose(&rig.thread);
    rig.publish_run(10).await;
    let sub = rig.subscribe(Start::After(old[1])).await;
    assert_eq!(sub.outcome, Outcome::Unresumable(ResumeGap::OtherEpoch));
    let next = rig.publish(&[custom(20)]).await;
    assert_eq!(ids_of(&next_events(&sub.queue).await), id_texts(&next));
}

/// A failover lost the tail this node fanned out (same epoch) and the log grew past it, before
/// the node's tail noticed: a client resuming from inside the lost tail never gets a prelude of
/// the thread hub's fold at a position the log does not hold; it starts at the fork point, the
/// last entry the log kept before its id, then gets every event the log took after it (before:
/// a prelude at the head, and the promoted log's events up to there were skipped).
#[tokio::test(start_paused = true)]
async fn a_rolled_back_id_gets_a_prelude_at_the_fork_then_every_later_event() {
    let rig = Rig::new(100);
    let kept = rig.publish_run(2).await;
    let lost = rig
        .publish(&[state(json!({"lost": true})), custom(90), custom(91)])
        .await;
    let watcher = rig.subscribe(Start::Live).await;
    rig.settled().await;
    rig.log.hold_tail(true);
    for id in &lost {
        rig.log.roll_back(id.pos);
    }
    let grown = rig
        .publish(&[custom(7), state(json!({"new": 1})), custom(8)])
        .await;

    let sub = rig.subscribe(Start::After(*lost.last().unwrap())).await;
    assert_eq!(sub.outcome, Outcome::ForkPoint(ResumeGap::Unknown));
    assert!(sub.prelude.is_none(), "the backfill opens the stream");
    let got = read_until(&sub.queue, *grown.last().unwrap()).await;
    let fork = *kept.last().unwrap();
    assert_eq!(
        types(&got[..3]),
        ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"],
        "{got:?}"
    );
    assert_eq!(
        got[0].data["metadata"]["agui-fanout"]["prelude"],
        json!(true)
    );
    assert_eq!(
        got[2].data["snapshot"],
        json!({}),
        "the lost state is replaced"
    );
    assert_eq!(ids_of(&got[..3]), [None, None, Some(fork.to_string())]);
    assert_eq!(
        ids_of(&got[3..]),
        id_texts(&grown),
        "every event after the fork: {got:?}"
    );
    assert_eq!(closed(&watcher.queue).await, CloseReason::Discontinuity);

    rig.log.hold_tail(false);
    let more = rig.publish(&[custom(9)]).await;
    assert_eq!(ids_of(&next_events(&sub.queue).await), id_texts(&more));
    let snapshot = rig.hub.snapshot(&rig.thread).await.unwrap().unwrap();
    assert_eq!(snapshot["state"], json!({"new": 1}));
}

/// The log lost everything the client's id had before it (its only entries were rolled back,
/// and the promoted log opened a new run): the fork is the log's start, so the stream opens
/// with a prelude at the log's first event, then every later one.
#[tokio::test(start_paused = true)]
async fn a_rolled_back_id_with_nothing_kept_before_it_starts_at_the_first_event() {
    let rig = Rig::new(100);
    let lost = rig.publish_run(1).await;
    for id in &lost {
        rig.log.roll_back(id.pos);
    }
    let grown = rig.publish_run(2).await;
    let sub = rig.subscribe(Start::After(lost[1])).await;
    assert_eq!(sub.outcome, Outcome::ForkPoint(ResumeGap::Unknown));
    let got = read_until(&sub.queue, *grown.last().unwrap()).await;
    assert_epoch_prelude(&got, grown[0]);
    assert_eq!(ids_of(&got[3..]), id_texts(&grown[1..]));
}

/// A fresh subscriber (no id) that comes before the node's tail noticed a lost epoch gets a
/// prelude of the new epoch's fold, never of the node's cached fold of the dead one (its old
/// state, an old id); the thread hub of the dead epoch ends its streams.
#[tokio::test(start_paused = true)]
async fn a_fresh_subscriber_never_gets_the_dead_epochs_fold() {
    let rig = Rig::new(100);
    rig.publish_run(1).await;
    rig.publish(&[state(json!({"old": true}))]).await;
    let watcher = rig.subscribe(Start::Live).await;
    rig.settled().await;
    rig.log.hold_tail(true);
    rig.log.lose(&rig.thread);
    let new = rig.publish_run(2).await;

    let sub = rig.subscribe(Start::Live).await;
    let prelude = parse(&sub.prelude.as_ref().expect("a prelude").bytes);
    assert_eq!(
        prelude.last().unwrap().id,
        Some(new.last().unwrap().to_string()),
        "the new epoch's fold: {prelude:?}"
    );
    assert!(
        prelude
            .iter()
            .all(|e| e.event_type() != "STATE_SNAPSHOT" || e.data["snapshot"] == json!({})),
        "{prelude:?}"
    );
    assert_eq!(closed(&watcher.queue).await, CloseReason::Discontinuity);
    rig.log.hold_tail(false);
    let more = rig.publish(&[custom(5)]).await;
    assert_eq!(ids_of(&next_events(&sub.queue).await), id_texts(&more));
}

/// The same for a tail a failover rolled back (same epoch): a fresh subscriber's prelude is the
/// log's fold, not the thread hub's at a position the log does not hold.
#[tokio::test(start_paused = true)]
async fn a_fresh_subscriber_never_gets_a_rolled_back_fold() {
    let rig = Rig::new(100);
    rig.publish_run(1).await;
    let lost = rig.publish(&[state(json!({"lost": true}))]).await;
    let watcher = rig.subscribe(Start::Live).await;
    rig.settled().await;
    rig.log.hold_tail(true);
    rig.log.roll_back(lost[0].pos);
    let grown = rig.publish(&[custom(7)]).await;

    let sub = rig.subscribe(Start::Live).await;
    let prelude = parse(&sub.prelude.as_ref().expect("a prelude").bytes);
    assert_eq!(prelude.last().unwrap().id, Some(grown[0].to_string()));
    let states: Vec<&Value> = prelude
        .iter()
        .filter(|e| e.event_type() == "STATE_SNAPSHOT")
        .map(|e| &e.data["snapshot"])
        .collect();
    assert_eq!(states, [&json!({})], "{prelude:?}");
    assert_eq!(closed(&watcher.queue).await, CloseReason::Discontinuity);
}
