//! The log contract's reads: appends read back, paging, resumes after every id, the gaps a
//! resume can meet (ahead, another epoch, trimmed, rolled back), heads, and tails following
//! many threads.

use super::*;

pub(crate) async fn append_then_read(f: Fixture) {
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

pub(crate) async fn empty_batch(f: Fixture) {
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

pub(crate) async fn read_paging(f: Fixture) {
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

pub(crate) async fn read_from_start(f: Fixture) {
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

pub(crate) async fn resume_after_every_id(f: Fixture) {
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
pub(crate) async fn rolled_back_ids_fork(f: Fixture) {
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

pub(crate) async fn gap_ahead(f: Fixture) {
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

pub(crate) async fn gap_other_epoch(f: Fixture) {
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

pub(crate) async fn gap_trimmed(f: Fixture) {
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

pub(crate) async fn head_new_thread(f: Fixture) {
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

pub(crate) async fn ping_answers(f: Fixture) {
    f.log().await.ping().await.unwrap();
}

pub(crate) async fn tail_follows_many_threads(f: Fixture) {
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

pub(crate) async fn tail_follow_while_blocked(f: Fixture) {
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

pub(crate) async fn tail_unfollow_stops(f: Fixture) {
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

pub(crate) async fn tail_follow_from_position(f: Fixture) {
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
pub(crate) async fn tail_follow_gaps(f: Fixture) {
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
pub(crate) async fn tail_shutdown_ends_it(f: Fixture) {
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
pub(crate) async fn expect_discontinuity(
    tail: &mut TailHarness,
    thread: &ThreadId,
    want: ResumeGap,
    last: EventId,
) {
    let head = tail.expect_discontinuity(thread, want).await;
    assert_eq!(head.last_id(), Some(last));
}
