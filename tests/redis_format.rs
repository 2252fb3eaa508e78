//! The Redis backend's documented key and entry format (`log/redis/mod.rs`), as producers that
//! write to Redis directly see it: entries, meta and checkpoint hashes, TTLs, lost keys (new
//! epoch), direct `XADD`s and the append's compare against them. Harness: `common/logs.rs`.

#[allow(dead_code, unreachable_pub)]
mod common {
    pub mod logs;
    pub mod redis_server;
}

use agui_fanout::log::EventLog;
use agui_fanout::log::redis::{RedisLog, RedisLogConfig};
use agui_fanout::log::{AppendExtras, LogError, ReadFrom, ResumeGap, Retention, StreamPos};
use common::logs::*;
use common::redis_server::RedisServer;
use std::collections::HashMap;
use std::time::Duration;

/// The documented format: one field `e` with the event JSON; the epoch in the meta hash.
#[tokio::test]
async fn redis_entry_format() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let thread = f.thread();
    let evs = events(0..2);
    let ids = log.append(&thread, &evs).await.unwrap();
    let mut conn = redis_conn(&redis_url()).await;
    let raw: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(stream_key(&thread))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(raw.len(), 2);
    for ((entry_id, fields), (id, ev)) in raw.iter().zip(ids.iter().zip(&evs)) {
        assert_eq!(entry_id, &id.pos.to_string());
        assert_eq!(fields, &vec![b"e".to_vec(), ev.json.to_vec()]);
    }
    let epoch = meta_epoch(&mut conn, &thread).await;
    assert_eq!(epoch, ids[0].epoch.to_string());
    assert_eq!(epoch.len(), 8);
}

/// The documented checkpoint hash: `pos`, `events`, `ord` (promoted) and `next_pos`,
/// `next_events`, `next_ord` (pending); `ord` is the stream's `entries-added` at `pos`.
#[tokio::test]
async fn redis_checkpoint_key_format() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let thread = f.thread();
    let mut ids = log.append(&thread, &events(0..3)).await.unwrap();
    ids.extend(append_with(&*log, &thread, &events(3..5), Some(candidate(4))).await);
    // The entry after the checkpoint in a later millisecond: `max_deleted` is still exactly
    // the checkpoint (the trimmed-entry bound from `recorded-first-entry-id` alone would be
    // `<ms - 1>-<u64::MAX>`, making a resume from the checkpoint look trimmed).
    tokio::time::sleep(Duration::from_millis(5)).await;
    ids.extend(append_with(&*log, &thread, &events(5..9), Some(candidate(8))).await);
    assert!(ids[5].pos.ms > ids[4].pos.ms);
    assert_eq!(log.head(&thread).await.unwrap().max_deleted, ids[4].pos);
    let mut conn = redis_conn(&redis_url()).await;
    let hash: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(ckpt_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    let field = |k: &str| String::from_utf8(hash[k].clone()).unwrap();
    assert_eq!(hash.len(), 6, "{:?}", hash.keys());
    assert_eq!(field("pos"), ids[4].pos.to_string());
    assert_eq!(hash["events"], candidate(4).to_vec());
    assert_eq!(field("ord"), "5");
    assert_eq!(field("next_pos"), ids[8].pos.to_string());
    assert_eq!(hash["next_events"], candidate(8).to_vec());
    assert_eq!(field("next_ord"), "9");
    let len: i64 = redis::cmd("XLEN")
        .arg(stream_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        len, 4,
        "XTRIM MINID removed exactly the entries up to the checkpoint"
    );
}

/// Whenever the broker creates a new epoch, the checkpoint hash goes with the old one: after
/// the stream alone was lost, and after the meta hash alone was lost.
#[tokio::test]
async fn redis_new_epoch_deletes_checkpoint() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let mut conn = redis_conn(&redis_url()).await;
    for lost in ["stream", "meta"] {
        let thread = f.thread();
        append_with(&*log, &thread, &events(0..3), Some(candidate(2))).await;
        append_with(&*log, &thread, &events(3..6), Some(candidate(5))).await;
        let old = log.head(&thread).await.unwrap();
        assert!(log.checkpoint(&thread).await.unwrap().is_some());
        let key = match lost {
            "stream" => stream_key(&thread),
            _ => meta_key(&thread),
        };
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        // Any script that looks at the thread notices; `checkpoint()` is one of them.
        assert_eq!(log.checkpoint(&thread).await.unwrap(), None, "{lost}");
        assert!(!exists(&mut conn, &ckpt_key(&thread)).await, "{lost}");
        let head = log.head(&thread).await.unwrap();
        assert_ne!(head.epoch, old.epoch, "{lost}");
        // New candidates start over: pending first, promoted by the next.
        append_with(&*log, &thread, &events(6..7), Some(candidate(6))).await;
        assert_eq!(log.checkpoint(&thread).await.unwrap(), None, "{lost}");
    }
}

/// `idle_ttl` is a `PEXPIRE` of every key of the thread to `idle_ttl` plus a slack of
/// `idle_ttl / 16` (at most 60 s), renewed by an append that finds less than `idle_ttl` left.
#[tokio::test]
async fn redis_idle_ttl_pexpires_every_key() {
    let f = Fixture::new(Backend::Redis);
    let ttl = Duration::from_secs(60);
    let retention = Retention {
        idle_ttl: Some(ttl),
        ..keep(1000)
    };
    let log = f.log_with(retention, Duration::from_secs(1)).await;
    let thread = f.thread();
    let mut conn = redis_conn(&redis_url()).await;
    append_with(&*log, &thread, &events(0..2), Some(candidate(1))).await;
    for key in [stream_key(&thread), meta_key(&thread), ckpt_key(&thread)] {
        let left = pttl(&mut conn, &key).await;
        // 60 s + 60 s / 16 of slack.
        assert!(left > 60_000 && left <= 63_750, "{key}: {left}");
        let _: () = redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    log.append(&thread, &events(2..3)).await.unwrap();
    for key in [stream_key(&thread), meta_key(&thread), ckpt_key(&thread)] {
        let left = pttl(&mut conn, &key).await;
        assert!(left > 60_000, "{key} not renewed: {left}");
    }
    // An append that finds more than `idle_ttl` left leaves the TTLs alone.
    let _: () = redis::cmd("PEXPIRE")
        .arg(stream_key(&thread))
        .arg(62_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    log.append(&thread, &events(3..4)).await.unwrap();
    let left = pttl(&mut conn, &stream_key(&thread)).await;
    assert!(
        left <= 62_000,
        "renewed with more than idle_ttl left: {left}"
    );
    // Without `idle_ttl` the broker leaves TTLs alone.
    let keep_forever = f.log_with(keep(1000), Duration::from_secs(1)).await;
    let other = f.thread();
    keep_forever.append(&other, &events(0..1)).await.unwrap();
    assert_eq!(pttl(&mut conn, &stream_key(&other)).await, -1);

    // A read of a thread nobody writes creates its epoch (meta hash) with the same TTL, so
    // such reads leave nothing behind for good; without `idle_ttl`, no TTL.
    let unread = f.thread();
    log.head(&unread).await.unwrap();
    let left = pttl(&mut conn, &meta_key(&unread)).await;
    assert!(
        left > 60_000 && left <= 63_750,
        "meta of a read thread: {left}"
    );
    let unread = f.thread();
    log.read(&unread, ReadFrom::Start, 10).await.unwrap();
    assert!(pttl(&mut conn, &meta_key(&unread)).await > 60_000);
    let forever = f.thread();
    keep_forever.head(&forever).await.unwrap();
    assert_eq!(pttl(&mut conn, &meta_key(&forever)).await, -1);
}

/// Keys lost (a flush, a failover without the data): a new epoch, old ids are another epoch,
/// and the tail reports the discontinuity, then follows the new log.
#[tokio::test]
async fn redis_lost_keys_get_a_new_epoch() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let mut tail = TailHarness::start(&*log);
    let thread = f.thread();
    let old = log.append(&thread, &events(0..5)).await.unwrap();
    tail.tail.follow(thread.clone(), old[4].epoch, old[4].pos);

    let mut conn = redis_conn(&redis_url()).await;
    let _: () = redis::cmd("DEL")
        .arg(stream_key(&thread))
        .arg(meta_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();

    let head = log.head(&thread).await.unwrap();
    assert_ne!(head.epoch, old[0].epoch);
    assert_eq!(head.last, StreamPos::ZERO);
    let read = log.read(&thread, ReadFrom::After(old[2]), 10).await;
    assert!(
        matches!(read, Err(LogError::Gap(ResumeGap::OtherEpoch))),
        "{read:?}"
    );
    let h = tail
        .expect_discontinuity(&thread, ResumeGap::OtherEpoch)
        .await;
    assert_eq!(h.epoch, head.epoch);
    let evs = events(5..7);
    let new = log.append(&thread, &evs).await.unwrap();
    assert_eq!(new[0].epoch, head.epoch);
    let got = tail.collect_one(&thread, 2).await;
    assert_entries(&got, &new, &evs);

    // Only the stream lost (its meta survives): still a new epoch.
    let _: () = redis::cmd("DEL")
        .arg(stream_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = log.head(&thread).await.unwrap();
    assert_ne!(again.epoch, head.epoch);
    assert_eq!(again.last, StreamPos::ZERO);
    let newer = log.append(&thread, &events(7..8)).await.unwrap();
    assert_eq!(newer[0].epoch, again.epoch);
}

/// Producers may XADD directly: valid entries are delivered (an epoch is created for them),
/// invalid ones are skipped by read and by the tail, never fatal.
#[tokio::test]
async fn redis_direct_producer_entries() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let mut conn = redis_conn(&redis_url()).await;
    let thread = f.thread();
    let mixture = |n: usize| {
        vec![
            (
                "e",
                format!(r#"{{"type":"CUSTOM","name":"direct","value":{n}}}"#),
            ),
            ("e", "not json".to_string()),
            (
                "x",
                r#"{"type":"CUSTOM","name":"no e field","value":1}"#.to_string(),
            ),
            ("e", r#"{"type":"NOPE"}"#.to_string()),
            (
                "e",
                r#"{"type":"RUN_STARTED","threadId":"another-thread","runId":"r"}"#.to_string(),
            ),
            (
                "e",
                format!(
                    "{{ \"type\": \"CUSTOM\",\n \"name\": \"spaced\", \"value\": [{n}, 2], \"extra\": true }}"
                ),
            ),
        ]
    };
    for (field, v) in mixture(1) {
        xadd(&mut conn, &thread, field, &v).await;
    }
    let got = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    let jsons: Vec<&[u8]> = got.iter().map(|e| &e.json[..]).collect();
    assert_eq!(
        jsons,
        vec![
            &br#"{"type":"CUSTOM","name":"direct","value":1}"#[..],
            &br#"{"type":"CUSTOM","name":"spaced","value":[1,2],"extra":true}"#[..],
        ]
    );
    let head = log.head(&thread).await.unwrap();
    assert_eq!(got[0].id.epoch, head.epoch);
    assert_eq!(got[1].id.pos, head.last);
    let epoch = meta_epoch(&mut conn, &thread).await;
    assert_eq!(epoch, head.epoch.to_string());
    // Paging over invalid entries still returns `limit` valid ones.
    let one = log.read(&thread, ReadFrom::Start, 1).await.unwrap();
    assert_eq!(one.len(), 1);
    let next = log
        .read(&thread, ReadFrom::After(one[0].id), 1)
        .await
        .unwrap();
    assert_eq!(next, got[1..]);

    // The tail skips the same entries and keeps going.
    let mut tail = TailHarness::start(&*log);
    tail.tail.follow(thread.clone(), head.epoch, head.last);
    for (field, v) in mixture(2) {
        xadd(&mut conn, &thread, field, &v).await;
    }
    let ids = log.append(&thread, &events(0..1)).await.unwrap();
    let got = tail.collect_one(&thread, 3).await;
    assert_eq!(
        &got[0].json[..],
        br#"{"type":"CUSTOM","name":"direct","value":2}"#
    );
    assert_eq!(
        &got[1].json[..],
        br#"{"type":"CUSTOM","name":"spaced","value":[2,2],"extra":true}"#
    );
    assert_eq!(got[2].id, ids[0]);
    assert!(tail.drain_for(Duration::from_millis(300)).await.is_empty());
}

/// The append's compare on Redis: an entry added directly after the expected one is a
/// conflict (reported with the new last-generated-id); a stream emptied by trimming, or whose
/// newest entry was `XDEL`eted, still takes an append on the head it reports; a stream that
/// went back to an older state under the same epoch (restored from an earlier `DUMP`) is a
/// conflict, although no entry follows the expected ID.
#[tokio::test]
async fn redis_append_if_after_direct_trimmed_and_deleted_entries() {
    let f = Fixture::new(Backend::Redis);
    let log = f.log().await;
    let mut conn = redis_conn(&redis_url()).await;
    let thread = f.thread();
    let fresh = log.head(&thread).await.unwrap();
    log.append_if(&thread, &events(0..3), fresh, AppendExtras::default())
        .await
        .unwrap();
    let head = log.head(&thread).await.unwrap();

    xadd(
        &mut conn,
        &thread,
        "e",
        r#"{"type":"CUSTOM","name":"d","value":1}"#,
    )
    .await;
    let now = match log
        .append_if(&thread, &events(3..4), head, AppendExtras::default())
        .await
    {
        Err(LogError::Conflict(now)) => now,
        other => panic!("expected a conflict, got {other:?}"),
    };
    assert_eq!(now, log.head(&thread).await.unwrap());
    assert!(now.last > head.last);

    let _: i64 = redis::cmd("XTRIM")
        .arg(stream_key(&thread))
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    let trimmed = log.head(&thread).await.unwrap();
    assert_eq!(
        (trimmed.epoch, trimmed.last),
        (now.epoch, now.last),
        "trimming keeps the last-generated-id"
    );
    let ids = log
        .append_if(&thread, &events(3..5), trimmed, AppendExtras::default())
        .await
        .unwrap();

    let _: i64 = redis::cmd("XDEL")
        .arg(stream_key(&thread))
        .arg(ids[1].pos.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();
    let deleted = log.head(&thread).await.unwrap();
    assert_eq!(deleted.last, ids[1].pos);
    let more = log
        .append_if(&thread, &events(5..6), deleted, AppendExtras::default())
        .await
        .unwrap();
    assert!(more[0].pos > ids[1].pos);
    let got = log.read(&thread, ReadFrom::Start, 10).await.unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].id, ids[0]);
    assert_eq!(got[1].id, more[0]);

    let dump: Vec<u8> = redis::cmd("DUMP")
        .arg(stream_key(&thread))
        .query_async(&mut conn)
        .await
        .unwrap();
    log.append(&thread, &events(6..8)).await.unwrap();
    let ahead = log.head(&thread).await.unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg(stream_key(&thread))
        .arg(0)
        .arg(dump)
        .arg("REPLACE")
        .query_async(&mut conn)
        .await
        .unwrap();
    match log
        .append_if(&thread, &events(8..9), ahead, AppendExtras::default())
        .await
    {
        Err(LogError::Conflict(now)) => assert_eq!(now.last, more[0].pos),
        other => panic!("a stream that went back must be a conflict, got {other:?}"),
    }
}

/// `MAXLEN ~` removes whole stream nodes only: on a Redis whose nodes are unbounded
/// (`stream-node-max-entries 0`, `stream-node-max-bytes 0`) it trims nothing. The append then
/// trims exactly, so a thread without checkpoints stays within twice `max_events`.
#[tokio::test]
async fn redis_cap_holds_when_approximate_trimming_trims_nothing() {
    let server = RedisServer::start().await;
    server
        .command(&["CONFIG", "SET", "stream-node-max-entries", "0"])
        .await;
    server
        .command(&["CONFIG", "SET", "stream-node-max-bytes", "0"])
        .await;
    let mut config = RedisLogConfig::new(server.url());
    config.retention = keep(10);
    let log = RedisLog::connect(config).await.unwrap();
    let thread = agui_fanout::event::ThreadId::parse("capped").unwrap();
    let evs = events(0..100);
    let mut last = None;
    for ev in &evs {
        last = log
            .append(&thread, std::slice::from_ref(ev))
            .await
            .unwrap()
            .pop();
    }
    let len: usize = server
        .command(&["XLEN", &stream_key(&thread)])
        .await
        .parse()
        .unwrap();
    assert!((10..=20).contains(&len), "XLEN {len} with max_events 10");
    // What is kept is the newest entries, readable as usual.
    let head = log.head(&thread).await.unwrap();
    assert_eq!(Some(head.last), last.map(|id| id.pos));
    let kept = log.read(&thread, ReadFrom::Start, 100).await.unwrap();
    assert_eq!(kept.len(), len);
    assert_eq!(kept.last().map(|e| e.id), last);
}
