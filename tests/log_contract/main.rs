//! The log backends' shared contract (PROTOCOL §1, §4, §6, §7): the same test functions run against
//! `MemoryLog` (`memory_*`) and `RedisLog` on a real redis-server (`redis_*`). Harness:
//! `common/logs.rs`.

#[allow(unreachable_pub)]
#[path = "../common/logs.rs"]
mod logs;
mod reads;

use agui_fanout::event::{ThreadId, ValidEvent};
use agui_fanout::log::{
    AppendExtras, Epoch, EventId, EventLog, LogError, LogHead, ProducerMark, ReadFrom, ResumeGap,
    Retention, StreamPos, TailItem,
};
use logs::*;
use reads::*;
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
