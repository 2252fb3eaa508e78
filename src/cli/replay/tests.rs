//! Unit tests of the `replay` subcommand's private steps: reading the recording, picking and
//! retargeting the thread, the rate, the URL, `Retry-After`, quoting reply bodies.

use super::*;
use serde_json::json;

fn events(value: Value) -> Vec<Map<String, Value>> {
    parse_events(value.to_string().as_bytes(), Path::new("t.json")).unwrap()
}

#[test]
fn strips_a_leading_bom() {
    let file =
        b"\xEF\xBB\xBF[\n  {\"type\": \"RUN_STARTED\", \"threadId\": \"t\", \"runId\": \"r\"}\n]";
    let parsed = parse_events(file, Path::new("t.json")).unwrap();
    assert_eq!(parsed.len(), 1);
    assert_eq!(parsed[0]["threadId"], "t");
    // Without a BOM too.
    assert_eq!(
        parse_events(&file[3..], Path::new("t.json")).unwrap(),
        parsed
    );
    // A BOM anywhere else is not stripped.
    let err = parse_events(b" \xEF\xBB\xBF[]", Path::new("t.json")).unwrap_err();
    assert!(matches!(err, ReplayError::Parse { .. }), "{err}");
}

#[test]
fn refuses_what_is_not_an_array_of_objects() {
    let err = parse_events(br#"{"type":"RUN_STARTED"}"#, Path::new("t.json")).unwrap_err();
    assert!(err.to_string().contains("found an object"), "{err}");
    let err = parse_events(br#"[{"type":"RAW"}, 3]"#, Path::new("t.json")).unwrap_err();
    assert!(err.to_string().contains("event 1 is a number"), "{err}");
    let err = parse_events(b"[{", Path::new("t.json")).unwrap_err();
    assert!(
        err.to_string().starts_with("t.json is not valid JSON"),
        "{err}"
    );
}

#[test]
fn infers_the_thread_from_the_first_event_carrying_one() {
    let evs = events(json!([
        {"type": "RAW", "event": {}},
        {"type": "RUN_STARTED", "threadId": "t-1", "runId": "r"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
        {"type": "RUN_FINISHED", "threadId": "t-1", "runId": "r"},
    ]));
    let thread = target_thread(&evs, None, Path::new("t.json")).unwrap();
    assert_eq!(thread.as_str(), "t-1");
}

#[test]
fn thread_inference_errors() {
    let path = Path::new("t.json");
    let none = events(json!([{"type": "RAW", "event": {}}]));
    assert!(matches!(
        target_thread(&none, None, path),
        Err(ReplayError::NoThread { .. })
    ));
    assert!(matches!(
        target_thread(&[], None, path),
        Err(ReplayError::NoThread { .. })
    ));
    let two = events(json!([
        {"type": "RUN_STARTED", "threadId": "a", "runId": "r"},
        {"type": "RUN_FINISHED", "threadId": "b", "runId": "r"},
    ]));
    let err = target_thread(&two, None, path).unwrap_err();
    assert!(
        matches!(&err, ReplayError::ThreadMismatch { index: 1, found, expected }
            if found == "b" && expected == "a"),
        "{err}"
    );
    // --thread publishes a multi-thread recording to one thread.
    assert_eq!(target_thread(&two, Some("c"), path).unwrap().as_str(), "c");
    let bad = events(json!([{"type": "RUN_STARTED", "threadId": "a/b", "runId": "r"}]));
    assert!(matches!(
        target_thread(&bad, None, path),
        Err(ReplayError::InvalidThread { .. })
    ));
    assert!(matches!(
        target_thread(&none, Some("x y"), path),
        Err(ReplayError::InvalidThread { .. })
    ));
}

#[test]
fn retargets_every_thread_id_and_nothing_else() {
    let mut evs = events(json!([
        {"type": "RUN_STARTED", "threadId": "old", "runId": "r",
         "input": {"threadId": "old", "runId": "r", "messages": []}},
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant",
         "rawEvent": {"threadId": "old"}},
        {"type": "CUSTOM", "name": "n", "value": {}, "input": {"threadId": "old"}},
        {"type": "RUN_FINISHED", "threadId": "old", "runId": "r"},
    ]));
    retarget(&mut evs, "new");
    let got = Value::Array(evs.into_iter().map(Value::Object).collect());
    assert_eq!(
        got,
        json!([
            {"type": "RUN_STARTED", "threadId": "new", "runId": "r",
             "input": {"threadId": "new", "runId": "r", "messages": []}},
            {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant",
             "rawEvent": {"threadId": "old"}},
            {"type": "CUSTOM", "name": "n", "value": {}, "input": {"threadId": "old"}},
            {"type": "RUN_FINISHED", "threadId": "new", "runId": "r"},
        ])
    );
}

#[test]
fn retarget_keeps_field_order() {
    let mut evs = events(json!([{"type": "RUN_STARTED", "threadId": "old", "runId": "r"}]));
    retarget(&mut evs, "new");
    assert_eq!(
        Value::Object(evs.remove(0)).to_string(),
        r#"{"type":"RUN_STARTED","threadId":"new","runId":"r"}"#
    );
}

#[test]
fn rate_validation() {
    assert_eq!(pacing(50.0).unwrap(), Some(Duration::from_millis(20)));
    assert_eq!(pacing(0.5).unwrap(), Some(Duration::from_secs(2)));
    assert_eq!(pacing(0.0).unwrap(), None);
    assert_eq!(pacing(-3.0).unwrap(), None);
    assert_eq!(pacing(f64::INFINITY).unwrap(), None);
    assert_eq!(pacing(f64::NEG_INFINITY).unwrap(), None);
    assert_eq!(pacing(1e300).unwrap(), None, "a period that rounds to zero");
    assert!(matches!(
        pacing(f64::NAN),
        Err(ReplayError::InvalidRate { .. })
    ));
    assert!(matches!(
        pacing(1e-300),
        Err(ReplayError::InvalidRate { .. })
    ));
}

#[test]
fn base_url_validation() {
    assert!(base_url("http://127.0.0.1:8080").is_ok());
    assert!(base_url("http://broker/prefix/").is_ok());
    for bad in [
        "127.0.0.1:8080",
        "https://broker",
        "http://b/?x=1",
        "mailto:a@b",
        "",
    ] {
        assert!(
            matches!(base_url(bad), Err(ReplayError::InvalidUrl { .. })),
            "{bad}"
        );
    }
}

#[test]
fn endpoint_joins_the_base_path() {
    let thread = ThreadId::parse("t:1").unwrap();
    for (base, want) in [
        ("http://h:1", "http://h:1/v1/threads/t:1/events"),
        ("http://h:1/", "http://h:1/v1/threads/t:1/events"),
        ("http://h:1/p/", "http://h:1/p/v1/threads/t:1/events"),
        ("http://h:1/p", "http://h:1/p/v1/threads/t:1/events"),
    ] {
        let publisher = Publisher::new(base_url(base).unwrap(), &thread, None).unwrap();
        assert_eq!(publisher.endpoint.as_str(), want);
    }
}

#[test]
fn retry_after_seconds() {
    let mut headers = reqwest::header::HeaderMap::new();
    assert_eq!(retry_after(&headers), None);
    headers.insert(RETRY_AFTER, "2".parse().unwrap());
    assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
    headers.insert(
        RETRY_AFTER,
        "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
    );
    assert_eq!(retry_after(&headers), None);
}

#[test]
fn quoted_bodies() {
    assert_eq!(
        quote_body(b"{ \"error\": {\"code\": \"x\"} }"),
        r#"{"error":{"code":"x"}}"#
    );
    assert_eq!(quote_body(b""), "(empty body)");
    assert_eq!(quote_body(b" bad gateway\n"), "bad gateway");
    assert_eq!(
        quote_body("é".repeat(5000).as_bytes()).chars().count(),
        4097
    );
}
