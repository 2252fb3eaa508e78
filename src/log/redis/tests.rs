//! Unit tests of the Redis backend's private parts: keys, reply decoding, the tail's
//! continuity rule and backoff, the append note's type list.

use super::notify::Note;
use super::resp::{
    Settled, StreamCounts, max_deleted, parse_append_reply, parse_epoch_str, parse_outcome_reply,
    parse_xread,
};
use super::scripts::{AppendToken, Keys, note_types};
use super::tail::{Continues, backoff, continues};
use crate::event::{ThreadId, validate_event};
use crate::log::{Epoch, EventId, LogError, StreamPos};
use bytes::Bytes;
use redis::Value;
use std::time::Duration;

#[test]
fn keys_share_a_hash_tag() {
    let thread = ThreadId::parse("t-1").unwrap();
    let keys = Keys::new("agui", &thread);
    assert_eq!(keys.stream, "agui:{t-1}:log");
    assert_eq!(keys.meta, "agui:{t-1}:meta");
    assert_eq!(keys.ckpt, "agui:{t-1}:ckpt");
    let token = AppendToken::random();
    let outcome = keys.outcome(token);
    assert_eq!(outcome, format!("agui:{{t-1}}:o:{token}"));
    assert_eq!(token.to_string().len(), 32);
    assert!(token.to_string().bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(AppendToken::random(), token);
}

#[test]
fn outcome_replies_decode() {
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    assert_eq!(
        parse_outcome_reply(&bulk("-"), 2).unwrap(),
        Settled::NotAppended
    );
    let epoch = Epoch(0x0a1b2c3d);
    let id = |ms, seq| EventId {
        epoch,
        pos: StreamPos::new(ms, seq),
    };
    assert_eq!(
        parse_outcome_reply(&bulk("0a1b2c3d 5-0 5-1"), 2).unwrap(),
        Settled::Appended(vec![id(5, 0), id(5, 1)])
    );
    // A record that does not match the batch, or is not one, settles nothing.
    for bad in ["0a1b2c3d 5-0", "0a1b2c3d 5-0 x", "zz 5-0 5-1", ""] {
        assert!(parse_outcome_reply(&bulk(bad), 2).is_err(), "{bad:?}");
    }
    assert!(parse_outcome_reply(&Value::Nil, 1).is_err());
    // The append script's own answer when it finds its token fenced: nothing appended.
    let fenced = Value::Array(vec![bulk("fenced")]);
    assert!(matches!(
        parse_append_reply(&fenced, 1),
        Err(LogError::Unavailable(_))
    ));
}

#[test]
fn max_deleted_is_exact_at_a_checkpoint() {
    let counts = |first, length, added| StreamCounts {
        last: StreamPos::new(9, 3),
        deleted: StreamPos::ZERO,
        first,
        length,
        added,
    };
    // Nothing removed.
    let s = counts(StreamPos::new(1, 0), 10, 10);
    assert_eq!(max_deleted(s, None), StreamPos::ZERO);
    // Promoted at 4-1 (the 6th entry added); the next entry is 7-0: exact, not 6-MAX.
    let s = counts(StreamPos::new(7, 0), 4, 10);
    let ckpt = Some((StreamPos::new(4, 1), 6));
    assert_eq!(max_deleted(s, ckpt), StreamPos::new(4, 1));
    assert_eq!(max_deleted(s, None), StreamPos::new(6, u64::MAX));
    // Something after the checkpoint went too (safety cap): the conservative bound.
    let s = counts(StreamPos::new(8, 0), 3, 10);
    assert_eq!(max_deleted(s, ckpt), StreamPos::new(7, u64::MAX));
    // An entry XDEL'd before the checkpoint does not move it.
    let s = StreamCounts {
        deleted: StreamPos::new(3, 0),
        ..counts(StreamPos::new(7, 0), 4, 10)
    };
    assert_eq!(max_deleted(s, ckpt), StreamPos::new(4, 1));
}

#[test]
fn backoff_is_capped_and_jittered() {
    for failures in 1..40 {
        let d = backoff(failures);
        assert!(d >= Duration::from_millis(50), "{d:?}");
        assert!(d <= Duration::from_secs(5), "{d:?}");
    }
    assert!(backoff(1) <= Duration::from_millis(100));
}

#[test]
fn parses_xread_and_entries() {
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let reply = Value::Array(vec![Value::Array(vec![
        bulk("agui:{t}:log"),
        Value::Array(vec![
            Value::Array(vec![bulk("5-1"), Value::Array(vec![bulk("e"), bulk("{}")])]),
            Value::Array(vec![bulk("5-2"), Value::Array(vec![bulk("x"), bulk("1")])]),
        ]),
    ])]);
    let parsed = parse_xread(&reply).unwrap();
    assert_eq!(parsed.len(), 1);
    assert_eq!(parsed[0].0, "agui:{t}:log");
    let entries = &parsed[0].1;
    assert_eq!(entries[0].pos, StreamPos::new(5, 1));
    assert_eq!(entries[0].data.as_deref(), Some(&b"{}"[..]));
    assert_eq!(entries[1].data, None);
    assert!(parse_xread(&Value::Nil).unwrap().is_empty());
}

#[test]
fn a_note_continues_only_from_its_prev() {
    let note = Note {
        thread: ThreadId::parse("t").unwrap(),
        epoch: Epoch(7),
        prev: StreamPos::new(5, 0),
        entries: [StreamPos::new(5, 1), StreamPos::new(6, 0)]
            .into_iter()
            .map(|p| {
                (
                    p,
                    crate::event::EventType::Custom,
                    Bytes::from_static(b"{}"),
                )
            })
            .collect(),
    };
    let at = |ms, seq| continues(Epoch(7), StreamPos::new(ms, seq), &note);
    assert_eq!(at(5, 0), Continues::From(0));
    // The cursor inside the batch (a read limited by `COUNT` stopped there).
    assert_eq!(at(5, 1), Continues::From(1));
    assert_eq!(at(6, 0), Continues::Already);
    assert_eq!(at(9, 0), Continues::Already);
    // Entries between the cursor and `prev` may exist (a direct XADD, a lost note).
    assert_eq!(at(4, 0), Continues::Gap);
    // Not one of the batch's IDs: not a position of this log.
    assert_eq!(at(5, 5), Continues::Gap);
    // Another epoch, even at the same position.
    assert_eq!(
        continues(Epoch(8), StreamPos::new(5, 0), &note),
        Continues::Gap
    );
}

#[test]
fn note_types_are_space_separated() {
    let ev = |t: &str| {
        validate_event(
            format!(r#"{{"type":"{t}","name":"n","value":1}}"#).as_bytes(),
            None,
        )
        .unwrap()
    };
    assert_eq!(note_types(&[]), "");
    assert_eq!(note_types(&[ev("CUSTOM"), ev("CUSTOM")]), "CUSTOM CUSTOM");
}

#[test]
fn epoch_strings() {
    assert_eq!(parse_epoch_str("0a1b2c3d"), Some(Epoch(0x0a1b2c3d)));
    assert_eq!(parse_epoch_str("0a1b2c3"), None);
    assert_eq!(parse_epoch_str("+a1b2c3d"), None);
}

/// The append script run twice with one outcome key (the cluster connection repeats a call
/// whose connection dropped after sending): the second run returns the first one's ids and
/// appends nothing. Against the test Redis (`AGUI_TEST_REDIS_URL`).
#[tokio::test]
async fn a_repeated_append_returns_its_ids_and_appends_once() {
    use super::scripts::{AppendArgs, ScriptArgs, Scripts};
    let url =
        std::env::var("AGUI_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let thread = ThreadId::parse(&format!("repeat-{:016x}", rand::random::<u64>())).unwrap();
    let keys = Keys::new("agui", &thread);
    let outcome = keys.outcome(AppendToken::random());
    let events = vec![validate_event(br#"{"type":"CUSTOM","name":"n","value":1}"#, None).unwrap()];
    let scripts = Scripts::new();
    let args = AppendArgs {
        keys: &keys,
        outcome: &outcome,
        fresh_epoch: Epoch::random(),
        maxlen: 0,
        safety_cap: 0,
        expected: None,
        candidate: None,
        candidate_min_gap: 0,
        max_age_ms: 0,
        idle_ttl_ms: 0,
        producer: None,
        channel: "",
        sharded: false,
        thread: &thread,
        record_ttl_ms: 60_000,
        events: &events,
    };
    let mut run = async || {
        let reply: Value = args
            .invocation(&scripts.append)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        parse_append_reply(&reply, 1)
    };
    let first = run().await.unwrap();
    let again = run().await.unwrap();
    assert_eq!(first, again);
    let len: usize = redis::cmd("XLEN")
        .arg(&keys.stream)
        .query_async(&mut client.get_multiplexed_async_connection().await.unwrap())
        .await
        .unwrap();
    assert_eq!(len, 1);
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&keys.stream)
        .arg(&keys.meta)
        .arg(&keys.ckpt)
        .arg(&outcome)
        .query_async(&mut conn)
        .await
        .unwrap();
}
