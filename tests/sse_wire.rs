//! The tests' strict SSE wire parser (`tests/common/sse.rs`) against what the broker writes
//! (`agui_fanout::sse`) and what it never writes: CR line ends, unknown fields, repeated
//! fields, partial frames.

mod common;

use agui_fanout::sse::{HEARTBEAT, encode_comment, encode_retry};
use common::sse::{body_events, parse_body, parse_frame, split_frame};
use serde_json::json;

#[test]
fn reads_what_the_broker_writes() {
    let f = parse_frame("id: 00000001-0-1\ndata: {\"type\":\"RAW\",\"event\":{}}").unwrap();
    assert_eq!(f.id.as_deref(), Some("00000001-0-1"));
    assert_eq!(f.data.as_deref(), Some("{\"type\":\"RAW\",\"event\":{}}"));
    assert_eq!(f.retry, None);

    let mut body = encode_retry(2000).to_vec();
    body.extend_from_slice(HEARTBEAT);
    body.extend_from_slice(&encode_comment("agui-fanout: token expired"));
    body.extend_from_slice(b"id: 00000001-0-4-bridge\ndata: {\"n\":1}\n\n");
    let frames = parse_body(&body).unwrap();
    assert_eq!(frames.len(), 4);
    assert_eq!(frames[0].retry.as_deref(), Some("2000"));
    assert_eq!(frames[1].comments, [""]);
    assert_eq!(frames[2].comments, ["agui-fanout: token expired"]);
    assert_eq!(frames[3].id.as_deref(), Some("00000001-0-4-bridge"));
    assert_eq!(body_events(&body), [json!({"n": 1})]);
}

#[test]
fn one_optional_space_after_the_colon_is_removed() {
    let f = parse_frame("data:{}\nid:  x").unwrap();
    assert_eq!(f.data.as_deref(), Some("{}"));
    assert_eq!(f.id.as_deref(), Some(" x"));
}

#[test]
fn refuses_what_the_broker_never_writes() {
    for bad in [
        "data: {}\r",
        "id: 1\r\ndata: {}",
        "event: message\ndata: {}",
        "data: {}\ndata: {}",
        "id: 1\nid: 2\ndata: {}",
        "retry: 1\nretry: 2",
        "data",
        "",
    ] {
        assert!(parse_frame(bad).is_err(), "accepted {bad:?}");
    }
    assert!(
        parse_body(b"data: {}\n\ndata: {}\n").is_err(),
        "a partial frame"
    );
    assert!(parse_body(b"data: {}\r\n\r\n").is_err(), "CR LF");
    assert!(parse_body(b"data: \xff\n\n").is_err(), "not UTF-8");
    assert!(parse_body(b"").unwrap().is_empty());
}

#[test]
fn splits_at_the_first_blank_line() {
    assert_eq!(
        split_frame(b"data: 1\n\ndata: 2\n\n"),
        Some((&b"data: 1"[..], &b"data: 2\n\n"[..]))
    );
    assert_eq!(split_frame(b"data: 1\n"), None);
}
