//! The log backends' shared contract (PROTOCOL §1, §4, §6, §7): the same test functions run against
//! `MemoryLog` (`memory_*`) and `RedisLog` on a real redis-server (`redis_*`). Harness:
//! `common/logs.rs`.

#[allow(dead_code, unreachable_pub)]
mod common {
    pub mod logs;
}

use agui_fanout::event::{ThreadId, ValidEvent};
use agui_fanout::log::{
    AppendExtras, Epoch, EventId, EventLog, LogError, LogHead, ProducerMark, ReadFrom, ResumeGap,
    Retention, StreamPos, TailItem,
};
use common::logs::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// The shared suite

/// Runs each listed test function against both backends under the given test names.
macro_rules! both_backends {
    ($($test:ident: $memory:ident, $redis:ident;)*) => {
        $(
            #[tokio::test]
            async fn $memory() {
                $test(Fixture::new(Backend::Memory)).await;
            }
            #[tokio::test]
            async fn $redis() {
                $test(Fixture::new(Backend::Redis)).await;
            }
        )*
    };
}

both_backends! {
    append_then_read: memory_append_then_read, redis_append_then_read;
    empty_batch: memory_empty_batch, redis_empty_batch;
    read_paging: memory_read_paging, redis_read_paging;
    read_from_start: memory_read_from_start, redis_read_from_start;
    resume_after_every_id: memory_resume_after_every_id, redis_resume_after_every_id;
    gap_ahead: memory_gap_ahead, redis_gap_ahead;
    rolled_back_ids_fork: memory_rolled_back_ids_fork, redis_rolled_back_ids_fork;
    gap_other_epoch: memory_gap_other_epoch, redis_gap_other_epoch;
    gap_trimmed: memory_gap_trimmed, redis_gap_trimmed;
    head_new_thread: memory_head_new_thread, redis_head_new_thread;
    tail_follows_many_threads: memory_tail_follows_many_threads, redis_tail_follows_many_threads;
    tail_follow_while_blocked: memory_tail_follow_while_blocked, redis_tail_follow_while_blocked;
    tail_unfollow_stops: memory_tail_unfollow_stops, redis_tail_unfollow_stops;
    tail_follow_from_position: memory_tail_follow_from_position, redis_tail_follow_from_position;
    tail_follow_gaps: memory_tail_follow_gaps, redis_tail_follow_gaps;
    ping_answers: memory_ping_answers, redis_ping_answers;
    tail_shutdown_ends_it: memory_tail_shutdown_ends_it, redis_tail_shutdown_ends_it;
    append_if_compares_epoch_and_last: memory_append_if_compares_epoch_and_last, redis_append_if_compares_epoch_and_last;
    producer_marks_are_stored_with_the_append: memory_producer_marks_are_stored_with_the_append, redis_producer_marks_are_stored_with_the_append;
    checkpoint_pending_then_promoted: memory_checkpoint_pending_then_promoted, redis_checkpoint_pending_then_promoted;
    checkpoint_rebuilds_fold_under_steady_publishing: memory_checkpoint_rebuilds_fold_under_steady_publishing, redis_checkpoint_rebuilds_fold_under_steady_publishing;
    candidate_within_min_gap_is_dropped: memory_candidate_within_min_gap_is_dropped, redis_candidate_within_min_gap_is_dropped;
    checkpoint_safety_cap_without_candidates: memory_checkpoint_safety_cap_without_candidates, redis_checkpoint_safety_cap_without_candidates;
    max_age_trims_only_to_checkpoint: memory_max_age_trims_only_to_checkpoint, redis_max_age_trims_only_to_checkpoint;
    max_age_without_checkpoint_trims_nothing: memory_max_age_without_checkpoint_trims_nothing, redis_max_age_without_checkpoint_trims_nothing;
    idle_ttl_expires_thread: memory_idle_ttl_expires_thread, redis_idle_ttl_expires_thread;
}

/// A producer mark is stored in the same step as the batch, per producer; a conflicting
/// append stores nothing.
async fn producer_marks_are_stored_with_the_append(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    assert_eq!(log.producer_seq(&thread, "p1").await.unwrap(), 0);
    let head = log.head(&thread).await.unwrap();
    let mark = |id: &str, last_seq| AppendExtras {
        candidate: None,
        candidate_min_gap: 0,
        producer: Some(ProducerMark {
            id: id.into(),
            last_seq,
        }),
        handed_over: false,
    };
    log.append_if(&thread, &events(0..3), head, mark("p1", 3))
        .await
        .unwrap();
    assert_eq!(log.producer_seq(&thread, "p1").await.unwrap(), 3);
    assert_eq!(log.producer_seq(&thread, "p2").await.unwrap(), 0);
    // A stale head: conflict, and the mark does not move.
    assert!(matches!(
        log.append_if(&thread, &events(3..4), head, mark("p1", 4))
            .await,
        Err(LogError::Conflict(_))
    ));
    assert_eq!(log.producer_seq(&thread, "p1").await.unwrap(), 3);
    let head = log.head(&thread).await.unwrap();
    log.append_if(&thread, &events(3..5), head, mark("p2", 7))
        .await
        .unwrap();
    assert_eq!(log.producer_seq(&thread, "p1").await.unwrap(), 3);
    assert_eq!(log.producer_seq(&thread, "p2").await.unwrap(), 7);
}

/// Compare-and-append: appends only on the expected head; a stale head gets `Conflict` with
/// the current head and appends nothing; concurrent appenders on one head: exactly one wins.
async fn append_if_compares_epoch_and_last(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let fresh = log.head(&thread).await.unwrap();
    let ids = log
        .append_if(&thread, &events(0..3), fresh, AppendExtras::default())
        .await
        .unwrap();
    assert_eq!(ids.len(), 3);
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.last, ids[2].pos);

    // Stale position.
    match log
        .append_if(&thread, &events(3..4), fresh, AppendExtras::default())
        .await
    {
        Err(LogError::Conflict(now)) => assert_eq!(now, head),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // Stale epoch.
    let other_epoch = LogHead {
        epoch: Epoch(head.epoch.0.wrapping_add(1)),
        ..head
    };
    assert!(matches!(
        log.append_if(&thread, &events(3..4), other_epoch, AppendExtras::default())
            .await,
        Err(LogError::Conflict(_))
    ));
    assert_eq!(log.head(&thread).await.unwrap(), head, "nothing appended");

    // Many appenders racing on the same head: exactly one wins.
    let results = futures::future::join_all((0..8).map(|i| {
        let log = log.clone();
        let thread = thread.clone();
        async move {
            log.append_if(
                &thread,
                &events(10 + i..11 + i),
                head,
                AppendExtras::default(),
            )
            .await
        }
    }))
    .await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(
        results
            .iter()
            .all(|r| r.is_ok() || matches!(r, Err(LogError::Conflict(_))))
    );
    let all = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    assert_eq!(all.len(), 4);
}

/// Asserts that the retained log is exactly `ids[first..]` and that resuming after `ids[i]`
/// is `Gap(Trimmed)` for `i < first - 1` and exact from `ids[first - 1]` on (the entry at the
/// checkpoint, the newest trimmed one, is resumable: nothing after it is gone).
async fn assert_trimmed_to(
    log: &dyn EventLog,
    thread: &ThreadId,
    ids: &[EventId],
    evs: &[ValidEvent],
    first: usize,
) {
    let retained = log.read(thread, ReadFrom::Start, 10_000).await.unwrap();
    assert_entries(&retained, &ids[first..], &evs[first..]);
    let head = log.head(thread).await.unwrap();
    assert_eq!(head.max_deleted, ids[first - 1].pos, "max_deleted");
    assert!(!head.complete_from_start());
    for (i, id) in ids.iter().enumerate() {
        let read = log.read(thread, ReadFrom::After(*id), 10_000).await;
        if i + 1 < first {
            assert!(
                matches!(read, Err(LogError::Gap(ResumeGap::Trimmed))),
                "{i}: {read:?}"
            );
        } else {
            assert_entries(&read.unwrap(), &ids[i + 1..], &evs[i + 1..]);
        }
    }
}

/// A candidate is stored as pending (nothing trimmed); the next one promotes it: it becomes
/// `checkpoint()` and every entry at or before it is trimmed, exactly. `None`, a conflict and
/// an empty batch change nothing; a tail can follow from the checkpoint exactly.
async fn checkpoint_pending_then_promoted(f: Fixture) {
    let log = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..40);
    let mut ids = log.append(&thread, &evs[..10]).await.unwrap();
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);

    // Pending: stored, not returned, nothing trimmed.
    ids.extend(append_with(&*log, &thread, &evs[10..15], Some(candidate(14))).await);
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.max_deleted, StreamPos::ZERO);
    assert!(head.complete_from_start());
    ids.extend(log.append(&thread, &evs[15..20]).await.unwrap());
    let all = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    assert_entries(&all, &ids, &evs[..20]);

    // A stale head with a candidate: a conflict, nothing changes. An empty batch with a
    // candidate: nothing changes either.
    let stale = LogHead {
        last: ids[3].pos,
        ..head
    };
    assert!(matches!(
        log.append_if(&thread, &evs[20..25], stale, Some(candidate(99)).into())
            .await,
        Err(LogError::Conflict(_))
    ));
    let now = log.head(&thread).await.unwrap();
    assert!(
        log.append_if(&thread, &[], now, Some(candidate(98)).into())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    assert_eq!(log.head(&thread).await.unwrap(), now);

    // The next candidate promotes the pending one (at the last entry of its batch, 14).
    ids.extend(append_with(&*log, &thread, &evs[20..25], Some(candidate(24))).await);
    let checkpoint = log.checkpoint(&thread).await.unwrap().expect("promoted");
    assert_eq!(checkpoint.pos, ids[14].pos);
    assert_eq!(checkpoint.events, candidate(14), "events byte-equal");
    assert_trimmed_to(&*log, &thread, &ids, &evs[..25], 15).await;

    // Appends without a candidate leave checkpoints alone.
    ids.extend(append_with(&*log, &thread, &evs[25..30], None).await);
    ids.extend(log.append(&thread, &evs[30..32]).await.unwrap());
    assert_eq!(log.checkpoint(&thread).await.unwrap(), Some(checkpoint));
    assert_trimmed_to(&*log, &thread, &ids, &evs[..32], 15).await;

    // A tail following from the checkpoint continues exactly.
    let mut tail = TailHarness::start(&*log);
    tail.tail.follow(thread.clone(), ids[14].epoch, ids[14].pos);
    let got = tail.collect_one(&thread, 17).await;
    assert_entries(&got, &ids[15..32], &evs[15..32]);

    // And the next promotion moves both to the newer checkpoint (24).
    ids.extend(append_with(&*log, &thread, &evs[32..40], Some(candidate(39))).await);
    let checkpoint = log.checkpoint(&thread).await.unwrap().unwrap();
    assert_eq!(checkpoint.pos, ids[24].pos);
    assert_eq!(upto_of(&checkpoint), 24);
    assert_trimmed_to(&*log, &thread, &ids, &evs, 25).await;
}

/// A candidate fewer than `candidate_min_gap` entries after the pending checkpoint is dropped:
/// nothing stored, nothing promoted, nothing trimmed (several nodes send candidates about
/// together). One at the gap or beyond promotes the pending checkpoint as usual.
async fn candidate_within_min_gap_is_dropped(f: Fixture) {
    let log = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..40);
    let with_gap = |upto: usize| AppendExtras {
        candidate: Some(candidate(upto)),
        candidate_min_gap: 10,
        producer: None,
        handed_over: false,
    };
    let mut ids = log.append(&thread, &evs[..10]).await.unwrap();
    // No pending checkpoint yet: stored whatever the gap.
    let head = log.head(&thread).await.unwrap();
    ids.extend(
        log.append_if(&thread, &evs[10..12], head, with_gap(11))
            .await
            .unwrap(),
    );
    // 9 entries after the pending one (at 11): dropped.
    let head = log.head(&thread).await.unwrap();
    ids.extend(
        log.append_if(&thread, &evs[12..21], head, with_gap(20))
            .await
            .unwrap(),
    );
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    let head = log.head(&thread).await.unwrap();
    assert!(head.complete_from_start(), "nothing trimmed");
    // 10 entries after it: promotes the pending one (11), becomes pending itself (at 21).
    ids.extend(
        log.append_if(&thread, &evs[21..22], head, with_gap(21))
            .await
            .unwrap(),
    );
    let checkpoint = log.checkpoint(&thread).await.unwrap().expect("promoted");
    assert_eq!(checkpoint.pos, ids[11].pos);
    assert_eq!(upto_of(&checkpoint), 11);
    assert_trimmed_to(&*log, &thread, &ids, &evs[..22], 12).await;
    // The dropped candidate (20) never became the pending one: 21 did.
    ids.extend(append_with(&*log, &thread, &evs[22..40], Some(candidate(39))).await);
    let checkpoint = log.checkpoint(&thread).await.unwrap().unwrap();
    assert_eq!(upto_of(&checkpoint), 21);
    assert_trimmed_to(&*log, &thread, &ids, &evs, 22).await;
}

/// The publish path's cadence (a candidate every ~`max_events` events, batches of 7): the log
/// keeps about `max_events`..`2 * max_events` events, and at every step the checkpoint plus
/// the entries after it cover the whole thread (its fold can be rebuilt).
async fn checkpoint_rebuilds_fold_under_steady_publishing(f: Fixture) {
    const MAX: usize = 20;
    let log = f.log_with(keep(MAX), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..400);
    let mut since_candidate = 0;
    let mut appended = 0;
    for batch in evs.chunks(7) {
        since_candidate += batch.len();
        appended += batch.len();
        let c = (since_candidate >= MAX).then(|| {
            since_candidate = 0;
            candidate(appended - 1)
        });
        append_with(&*log, &thread, batch, c).await;

        let head = log.head(&thread).await.unwrap();
        let retained = log.read(&thread, ReadFrom::Start, 10_000).await.unwrap();
        let Some(checkpoint) = log.checkpoint(&thread).await.unwrap() else {
            assert!(head.complete_from_start());
            assert_eq!(retained.len(), appended);
            continue;
        };
        assert_eq!(head.max_deleted, checkpoint.pos);
        let after = log
            .read(
                &thread,
                ReadFrom::After(EventId {
                    epoch: head.epoch,
                    pos: checkpoint.pos,
                }),
                10_000,
            )
            .await
            .unwrap();
        assert_eq!(
            after, retained,
            "everything after the checkpoint is retained"
        );
        // Checkpoint (events 0..=upto) + retained entries == the whole thread, in order.
        let upto = upto_of(&checkpoint);
        assert_eq!(upto + 1 + retained.len(), appended);
        for (k, entry) in retained.iter().enumerate() {
            assert_eq!(entry.json, evs[upto + 1 + k].json);
        }
        assert!(
            retained.len() <= 2 * MAX + 7,
            "{} retained after {appended}",
            retained.len()
        );
    }
    let retained = log.read(&thread, ReadFrom::Start, 10_000).await.unwrap();
    assert!(retained.len() >= MAX, "{}", retained.len());
}

/// A thread that uses checkpoints but whose producer stops sending candidates: past the
/// safety cap (`4 * max_events`) the pending checkpoint is promoted early, and nothing after
/// the newest checkpoint is ever trimmed (the fold stays rebuildable, PROTOCOL §6).
async fn checkpoint_safety_cap_without_candidates(f: Fixture) {
    const MAX: usize = 10;
    let log = f.log_with(keep(MAX), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..500);
    let mut ids = append_with(&*log, &thread, &evs[..5], Some(candidate(4))).await;
    // 30 events: more than `max_events`, less than the safety cap: nothing trimmed.
    ids.extend(append_in_batches(&*log, &thread, &evs[5..30], &[5]).await);
    let head = log.head(&thread).await.unwrap();
    assert!(head.complete_from_start(), "{head:?}");
    assert_eq!(
        log.read(&thread, ReadFrom::Start, 1000)
            .await
            .unwrap()
            .len(),
        30
    );

    // Never another candidate: past the safety cap the pending checkpoint is promoted (and
    // everything up to it trimmed), but nothing after it is ever trimmed: the fold stays
    // rebuildable from the checkpoint (PROTOCOL §6).
    ids.extend(append_in_batches(&*log, &thread, &evs[30..], &[25]).await);
    let ckpt = log
        .checkpoint(&thread)
        .await
        .unwrap()
        .expect("promoted by the safety cap");
    assert_eq!(ckpt.pos, ids[4].pos);
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.max_deleted, ids[4].pos);
    let retained = log.read(&thread, ReadFrom::Start, 10_000).await.unwrap();
    assert_entries(&retained, &ids[5..], &evs[5..]);
    for (i, id) in ids.iter().enumerate() {
        let read = log.read(&thread, ReadFrom::After(*id), 1000).await;
        if id.pos < head.max_deleted {
            assert!(
                matches!(read, Err(LogError::Gap(ResumeGap::Trimmed))),
                "{i}: {read:?}"
            );
        } else {
            assert_entries(&read.unwrap(), &ids[i + 1..], &evs[i + 1..]);
        }
    }
}

/// Polls `cond` every 50 ms until it holds; fails after [`WITHIN`].
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WITHIN;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `max_age`: once the pending checkpoint is older than `max_age`, an append promotes it and
/// trims up to it, and no further: the entries after it stay, however old.
async fn max_age_trims_only_to_checkpoint(f: Fixture) {
    let retention = Retention {
        max_age: Some(Duration::from_secs(1)),
        ..keep(1000)
    };
    let log = f.log_with(retention, Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..200);
    let mut ids = log.append(&thread, &evs[..5]).await.unwrap();
    ids.extend(append_with(&*log, &thread, &evs[5..8], Some(candidate(7))).await);
    ids.extend(log.append(&thread, &evs[8..12]).await.unwrap());
    // The pending checkpoint is younger than `max_age`: nothing happens yet.
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    assert!(log.head(&thread).await.unwrap().complete_from_start());

    // Appends (without candidates) until one finds the pending checkpoint old enough.
    let deadline = Instant::now() + WITHIN;
    loop {
        let n = ids.len();
        ids.extend(log.append(&thread, &evs[n..n + 1]).await.unwrap());
        if log.checkpoint(&thread).await.unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no age promotion");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let checkpoint = log.checkpoint(&thread).await.unwrap().unwrap();
    assert_eq!(checkpoint.pos, ids[7].pos);
    assert_eq!(upto_of(&checkpoint), 7);
    assert_trimmed_to(&*log, &thread, &ids, &evs[..ids.len()], 8).await;

    // Everything retained is now older than `max_age` too, and stays: no newer checkpoint.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let n = ids.len();
    ids.extend(log.append(&thread, &evs[n..n + 1]).await.unwrap());
    assert_trimmed_to(&*log, &thread, &ids, &evs[..ids.len()], 8).await;
}

/// `max_age` without any checkpoint trims nothing (the fold must stay rebuildable).
async fn max_age_without_checkpoint_trims_nothing(f: Fixture) {
    let retention = Retention {
        max_age: Some(Duration::from_millis(100)),
        ..keep(1000)
    };
    let log = f.log_with(retention, Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..6);
    let mut ids = log.append(&thread, &evs[..5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    ids.extend(log.append(&thread, &evs[5..]).await.unwrap());
    let head = log.head(&thread).await.unwrap();
    assert!(head.complete_from_start());
    assert_entries(
        &log.read(&thread, ReadFrom::Start, 100).await.unwrap(),
        &ids,
        &evs,
    );
}

/// `idle_ttl`: a thread without appends for that long expires whole: a new epoch (a tail
/// following it reports the discontinuity), no checkpoint, no entries; old ids are another
/// epoch. Appends keep it alive.
async fn idle_ttl_expires_thread(f: Fixture) {
    const TTL: Duration = Duration::from_millis(300);
    let retention = Retention {
        idle_ttl: Some(TTL),
        ..keep(1000)
    };
    let log = f.log_with(retention, Duration::from_millis(200)).await;
    let thread = f.thread();
    let evs = events(0..200);
    let mut ids = append_with(&*log, &thread, &evs[..5], Some(candidate(4))).await;
    ids.extend(append_with(&*log, &thread, &evs[5..10], Some(candidate(9))).await);
    let old = log.head(&thread).await.unwrap();
    assert!(log.checkpoint(&thread).await.unwrap().is_some());
    let mut tail = TailHarness::start(&*log);
    tail.tail.follow(thread.clone(), old.epoch, old.last);

    // Appends more often than the TTL keep the thread alive.
    let alive_until = Instant::now() + TTL * 3;
    let mut n = 10;
    while Instant::now() < alive_until {
        ids.extend(log.append(&thread, &evs[n..n + 1]).await.unwrap());
        n += 1;
        tokio::time::sleep(TTL / 4).await;
    }
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.epoch, old.epoch, "expired while written to");
    assert!(log.checkpoint(&thread).await.unwrap().is_some());
    tail.collect_one(&thread, n - 10).await;

    eventually("the idle expiry", || {
        let log = log.clone();
        let thread = thread.clone();
        async move { log.head(&thread).await.unwrap().epoch != old.epoch }
    })
    .await;
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.last, StreamPos::ZERO);
    assert_eq!(head.max_deleted, StreamPos::ZERO);
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
    assert!(
        log.read(&thread, ReadFrom::Start, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let read = log.read(&thread, ReadFrom::After(ids[12]), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::OtherEpoch))),
        "{read:?}"
    );
    let h = tail
        .expect_discontinuity(&thread, ResumeGap::OtherEpoch)
        .await;
    assert_eq!(h.epoch, head.epoch);

    // The thread comes back under the new epoch, without the old checkpoint.
    let new = append_with(&*log, &thread, &evs[..2], Some(candidate(1))).await;
    assert_eq!(new[0].epoch, head.epoch);
    assert_eq!(log.checkpoint(&thread).await.unwrap(), None);
}

async fn append_then_read(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let evs = events(0..50);
    let ids = append_in_batches(&*log, &thread, &evs, &[1, 3, 10, 1, 35]).await;
    assert_eq!(ids.len(), 50);
    assert_strictly_increasing(&ids);

    let got = log.read(&thread, ReadFrom::Start, 1000).await.unwrap();
    assert_entries(&got, &ids, &evs);

    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.epoch, ids[0].epoch);
    assert_eq!(head.last, ids[49].pos);
    assert_eq!(head.last_id(), Some(ids[49]));
    assert_eq!(head.max_deleted, StreamPos::ZERO);
    assert!(head.complete_from_start());
}

async fn empty_batch(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let before = log.head(&thread).await.unwrap();
    assert_eq!(
        log.append(&thread, &[]).await.unwrap(),
        Vec::<EventId>::new()
    );
    assert_eq!(log.head(&thread).await.unwrap(), before);
    assert!(
        log.read(&thread, ReadFrom::Start, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Also on a thread that has events.
    let ids = log.append(&thread, &events(0..2)).await.unwrap();
    assert_eq!(
        log.append(&thread, &[]).await.unwrap(),
        Vec::<EventId>::new()
    );
    assert_eq!(log.head(&thread).await.unwrap().last, ids[1].pos);
}

async fn read_paging(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let evs = events(0..25);
    let ids = log.append(&thread, &evs).await.unwrap();

    let mut got = log.read(&thread, ReadFrom::Start, 7).await.unwrap();
    assert_eq!(got.len(), 7);
    loop {
        let after = got.last().unwrap().id;
        let page = log.read(&thread, ReadFrom::After(after), 7).await.unwrap();
        assert!(page.len() <= 7);
        if page.is_empty() {
            break;
        }
        got.extend(page);
    }
    assert_entries(&got, &ids, &evs);

    assert!(
        log.read(&thread, ReadFrom::Start, 0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        log.read(&thread, ReadFrom::After(ids[3]), 0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        log.read(&thread, ReadFrom::After(ids[24]), 7)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn read_from_start(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    assert!(
        log.read(&thread, ReadFrom::Start, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let evs = events(0..5);
    let ids = log.append(&thread, &evs).await.unwrap();
    let got = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    assert_entries(&got, &ids, &evs);
    let got = log.read(&thread, ReadFrom::Start, 2).await.unwrap();
    assert_entries(&got, &ids[..2], &evs[..2]);
}

async fn resume_after_every_id(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let evs = events(0..200);
    let ids = append_in_batches(&*log, &thread, &evs, &[20]).await;
    assert_strictly_increasing(&ids);
    for (i, id) in ids.iter().enumerate() {
        let got = log.read(&thread, ReadFrom::After(*id), 1000).await.unwrap();
        assert_entries(&got, &ids[i + 1..], &evs[i + 1..]);
    }
}

/// `check_resume` of an id the log does not hold in its epoch (ahead of it, or, on Redis,
/// inside its range: a tail a failover rolled back, the log grown past it) names the fork: the
/// last entry the log holds before the id; an id it holds, or of another epoch, has none.
async fn rolled_back_ids_fork(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let ids = log.append(&thread, &events(0..3)).await.unwrap();
    let last = ids[2];
    let at = |pos| EventId {
        epoch: last.epoch,
        pos,
    };
    let ahead = log
        .check_resume(&thread, at(StreamPos::new(last.pos.ms + 1, 0)))
        .await
        .unwrap();
    assert_eq!(ahead.verdict, Err(ResumeGap::Ahead));
    assert_eq!(ahead.fork, Some(last.pos));
    let held = log.check_resume(&thread, ids[1]).await.unwrap();
    assert_eq!((held.verdict, held.fork), (Ok(()), None));
    let other = EventId {
        epoch: Epoch(last.epoch.0 ^ 1),
        pos: last.pos,
    };
    assert_eq!(log.check_resume(&thread, other).await.unwrap().fork, None);

    let empty = f.thread();
    let head = log.head(&empty).await.unwrap();
    let nothing = log
        .check_resume(
            &empty,
            EventId {
                epoch: head.epoch,
                pos: StreamPos::new(5, 0),
            },
        )
        .await
        .unwrap();
    assert_eq!(nothing.fork, Some(StreamPos::ZERO), "the log's start");

    if let Backend::Redis = f.backend {
        // The log grows past positions it never held (a promoted replica's new entries).
        let mut conn = redis_conn(&redis_url()).await;
        let _: String = redis::cmd("XADD")
            .arg(stream_key(&thread))
            .arg(format!("{}-0", last.pos.ms + 1000))
            .arg("e")
            .arg(r#"{"type":"CUSTOM","name":"n","value":9}"#)
            .query_async(&mut conn)
            .await
            .unwrap();
        let lost = log
            .check_resume(&thread, at(StreamPos::new(last.pos.ms + 10, 0)))
            .await
            .unwrap();
        assert_eq!(lost.verdict, Err(ResumeGap::Unknown));
        assert_eq!(lost.fork, Some(last.pos), "the last entry before the id");
    }
}

async fn gap_ahead(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let ids = log.append(&thread, &events(0..3)).await.unwrap();
    let last = ids[2];
    for pos in [
        next_pos(last.pos),
        StreamPos::new(last.pos.ms + 1, 0),
        StreamPos::new(u64::MAX, u64::MAX),
    ] {
        let ahead = EventId {
            epoch: last.epoch,
            pos,
        };
        let read = log.read(&thread, ReadFrom::After(ahead), 10).await;
        assert!(
            matches!(read, Err(LogError::Gap(ResumeGap::Ahead))),
            "{read:?}"
        );
    }

    // A thread with no events: any position is ahead.
    let empty = f.thread();
    let head = log.head(&empty).await.unwrap();
    let ahead = EventId {
        epoch: head.epoch,
        pos: StreamPos::new(0, 1),
    };
    let read = log.read(&empty, ReadFrom::After(ahead), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::Ahead))),
        "{read:?}"
    );
    // Exactly at ZERO of the current epoch is resumable (nothing before it).
    let zero = EventId {
        epoch: head.epoch,
        pos: StreamPos::ZERO,
    };
    assert!(
        log.read(&empty, ReadFrom::After(zero), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn gap_other_epoch(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let ids = log.append(&thread, &events(0..3)).await.unwrap();
    let other = EventId {
        epoch: Epoch(ids[0].epoch.0 ^ 0x5a5a_0001),
        pos: ids[1].pos,
    };
    let read = log.read(&thread, ReadFrom::After(other), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::OtherEpoch))),
        "{read:?}"
    );
    // An id of this thread's epoch used on another thread is another epoch there.
    let elsewhere = f.thread();
    let read = log.read(&elsewhere, ReadFrom::After(ids[0]), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::OtherEpoch))),
        "{read:?}"
    );
}

async fn gap_trimmed(f: Fixture) {
    // Redis trims `MAXLEN ~` by whole macro nodes (100 entries by default), hence 500 events.
    let log = f.log_with(keep(10), Duration::from_secs(1)).await;
    let thread = f.thread();
    let evs = events(0..500);
    let ids = append_in_batches(&*log, &thread, &evs, &[25]).await;
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.last, ids[499].pos);
    assert!(head.max_deleted > StreamPos::ZERO, "nothing trimmed");
    assert!(!head.complete_from_start());

    let retained = log.read(&thread, ReadFrom::Start, 10_000).await.unwrap();
    assert!(
        retained.len() >= 10 && retained.len() < 500,
        "{}",
        retained.len()
    );
    let first = ids.len() - retained.len();
    assert_entries(&retained, &ids[first..], &evs[first..]);
    assert!(retained[0].id.pos > head.max_deleted);

    let mut trimmed = 0;
    for (i, id) in ids.iter().enumerate() {
        let read = log.read(&thread, ReadFrom::After(*id), 1000).await;
        if id.pos < head.max_deleted {
            assert!(
                matches!(read, Err(LogError::Gap(ResumeGap::Trimmed))),
                "{i}: {read:?}"
            );
            trimmed += 1;
        } else {
            assert_entries(&read.unwrap(), &ids[i + 1..], &evs[i + 1..]);
        }
    }
    assert!(trimmed >= 1);
}

async fn head_new_thread(f: Fixture) {
    let log = f.log().await;
    let thread = f.thread();
    let head = log.head(&thread).await.unwrap();
    assert_eq!(head.last, StreamPos::ZERO);
    assert_eq!(head.max_deleted, StreamPos::ZERO);
    assert!(head.complete_from_start());
    assert_eq!(head.last_id(), None);
    // The epoch is created once and kept.
    assert_eq!(log.head(&thread).await.unwrap(), head);
    let ids = log.append(&thread, &events(0..1)).await.unwrap();
    assert_eq!(ids[0].epoch, head.epoch);
    assert!(ids[0].pos > StreamPos::ZERO);
}

async fn ping_answers(f: Fixture) {
    f.log().await.ping().await.unwrap();
}

async fn tail_follows_many_threads(f: Fixture) {
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let threads: Vec<ThreadId> = (0..3).map(|_| f.thread()).collect();
    for t in &threads {
        let head = log.head(t).await.unwrap();
        tail.tail.follow(t.clone(), head.epoch, head.last);
    }
    // Appenders run concurrently, in batches of 1 to 7.
    let appenders: Vec<_> = threads
        .iter()
        .enumerate()
        .map(|(n, t)| {
            let log = log.clone();
            let t = t.clone();
            tokio::spawn(async move {
                let evs = events(n * 1000..n * 1000 + 60);
                let mut ids = Vec::new();
                for (k, batch) in evs.chunks(1 + n * 3).enumerate() {
                    ids.extend(log.append(&t, batch).await.unwrap());
                    if k % 3 == 0 {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                }
                (t, ids, evs)
            })
        })
        .collect();
    let mut expected = Vec::new();
    for a in appenders {
        expected.push(a.await.unwrap());
    }
    let want: HashMap<ThreadId, usize> = threads.iter().map(|t| (t.clone(), 60)).collect();
    let got = tail.collect(&want, WITHIN).await;
    for (t, ids, evs) in &expected {
        assert_entries(&got[t], ids, evs);
    }
    assert!(
        tail.drain_for(Duration::from_millis(300)).await.is_empty(),
        "duplicates or extra items"
    );
}

async fn tail_follow_while_blocked(f: Fixture) {
    // A long block time: a follow must not wait for the reader's `XREAD BLOCK` to time out.
    let log = f.log_with(UNBOUNDED, Duration::from_secs(30)).await;
    let mut tail = TailHarness::start(&*log);
    let a = f.thread();
    let b = f.thread();
    let head = log.head(&a).await.unwrap();
    tail.tail.follow(a.clone(), head.epoch, head.last);
    let ids = log.append(&a, &events(0..1)).await.unwrap();
    let got = tail.collect_one(&a, 1).await;
    assert_eq!(got[0].id, ids[0]);
    // Let the reader settle into its blocking read of `a` alone.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let head = log.head(&b).await.unwrap();
    tail.tail.follow(b.clone(), head.epoch, head.last);
    let evs = events(0..3);
    let ids = log.append(&b, &evs).await.unwrap();
    let started = Instant::now();
    let got = tail
        .collect(&HashMap::from([(b.clone(), 3)]), Duration::from_secs(10))
        .await;
    assert_entries(&got[&b], &ids, &evs);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the new follow waited for the block timeout"
    );
}

async fn tail_unfollow_stops(f: Fixture) {
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let a = f.thread();
    let b = f.thread();
    for t in [&a, &b] {
        let head = log.head(t).await.unwrap();
        tail.tail.follow(t.clone(), head.epoch, head.last);
    }
    log.append(&a, &events(0..1)).await.unwrap();
    tail.collect_one(&a, 1).await;

    tail.tail.unfollow(&a);
    log.append(&a, &events(1..6)).await.unwrap();
    let ids = log.append(&b, &events(0..1)).await.unwrap();
    let got = tail.collect_one(&b, 1).await;
    assert_eq!(got[0].id, ids[0]);
    let late = tail.drain_for(Duration::from_millis(1500)).await;
    assert!(late.is_empty(), "items after unfollow: {late:?}");
}

async fn tail_follow_from_position(f: Fixture) {
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let thread = f.thread();
    let evs = events(0..20);
    let ids = log.append(&thread, &evs).await.unwrap();
    tail.tail.follow(thread.clone(), ids[9].epoch, ids[9].pos);
    let got = tail.collect_one(&thread, 10).await;
    assert_entries(&got, &ids[10..], &evs[10..]);

    // Following again replaces the earlier follow.
    tail.tail.follow(thread.clone(), ids[17].epoch, ids[17].pos);
    let got = tail.collect_one(&thread, 2).await;
    assert_entries(&got, &ids[18..], &evs[18..]);
    assert!(tail.drain_for(Duration::from_millis(300)).await.is_empty());
}

/// Follows that cannot continue exactly get a discontinuity at the head, then live entries.
async fn tail_follow_gaps(f: Fixture) {
    let log = f.log_with(keep(10), Duration::from_secs(1)).await;
    let mut tail = TailHarness::start(&*log);

    let other = f.thread();
    let ids = log.append(&other, &events(0..3)).await.unwrap();
    let wrong = Epoch(ids[0].epoch.0 ^ 1);
    tail.tail.follow(other.clone(), wrong, ids[0].pos);
    expect_discontinuity(&mut tail, &other, ResumeGap::OtherEpoch, ids[2]).await;

    let ahead = f.thread();
    let ids = log.append(&ahead, &events(0..3)).await.unwrap();
    tail.tail
        .follow(ahead.clone(), ids[2].epoch, next_pos(ids[2].pos));
    expect_discontinuity(&mut tail, &ahead, ResumeGap::Ahead, ids[2]).await;

    let trimmed = f.thread();
    let ids = append_in_batches(&*log, &trimmed, &events(0..500), &[50]).await;
    tail.tail.follow(trimmed.clone(), ids[0].epoch, ids[0].pos);
    expect_discontinuity(&mut tail, &trimmed, ResumeGap::Trimmed, ids[499]).await;

    // Each continues live after its head.
    let mut want = HashMap::new();
    let mut expected = Vec::new();
    for t in [&other, &ahead, &trimmed] {
        let evs = events(900..902);
        let ids = log.append(t, &evs).await.unwrap();
        want.insert(t.clone(), 2);
        expected.push((t.clone(), ids, evs));
    }
    let got = tail.collect(&want, WITHIN).await;
    for (t, ids, evs) in &expected {
        assert_entries(&got[t], ids, evs);
    }
}

/// Cancelling the shutdown token ends the tail, even while its reader is blocked in a long
/// read: the sink closes.
async fn tail_shutdown_ends_it(f: Fixture) {
    let log = f.log_with(UNBOUNDED, Duration::from_secs(30)).await;
    let (tx, mut rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let tail = log.start_tail(tx, stop.clone());
    let thread = f.thread();
    let head = log.head(&thread).await.unwrap();
    tail.follow(thread.clone(), head.epoch, head.last);
    log.append(&thread, &events(0..1)).await.unwrap();
    assert!(matches!(
        tokio::time::timeout(WITHIN, rx.recv()).await,
        Ok(Some(TailItem::Entries { .. }))
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    drop(tail);
    let end = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert!(matches!(end, Ok(None)), "tail still running: {end:?}");
}

/// The next tail item is `thread`'s discontinuity for `want`, at the log's last id `last`.
async fn expect_discontinuity(
    tail: &mut TailHarness,
    thread: &ThreadId,
    want: ResumeGap,
    last: EventId,
) {
    let head = tail.expect_discontinuity(thread, want).await;
    assert_eq!(head.last_id(), Some(last));
}
