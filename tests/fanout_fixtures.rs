//! Fan-out of the recorded AG-UI streams (`tests/fixtures/agui-recorded/…`), on a real socket,
//! against both log backends: every recorded response stream is retargeted to a fresh thread,
//! published through the HTTP API (one event per POST, as an agent streams, and once as one
//! JSON-array batch) and received by several subscribers that connected before publishing.
//! Each subscriber gets exactly what was published, in order, byte-exact compact JSON, with
//! strictly increasing ids; a `?from=start` subscriber afterwards gets the same (PROTOCOL §2–§4).

mod common;

use agui_fanout::app::Server;
use common::sse_client::{self, ReceivedText};
use common::{broker, fixtures};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// Concurrent live subscribers per thread.
const SUBSCRIBERS: usize = 4;
/// Longest wait for any one event.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// One POST per event, body a single JSON object.
    PerEvent,
    /// One POST, body a JSON array of every event.
    Batch,
}

/// Publishes `events` on `thread` as `mode` says; returns the ids the broker acknowledged.
async fn publish(base: &str, thread: &str, events: &[Value], mode: Mode) -> Vec<String> {
    match mode {
        Mode::PerEvent => {
            let mut ids = Vec::with_capacity(events.len());
            for (i, ev) in events.iter().enumerate() {
                let resp = sse_client::publish_one(base, thread, ev).await;
                let status = resp.status();
                let body: Value = resp.json().await.expect("publish reply is JSON");
                assert_eq!(status, 200, "publish of event #{i} {ev}: {body}");
                assert_eq!(body["count"], 1, "{body}");
                assert_eq!(body["firstId"], body["lastId"], "{body}");
                ids.push(body["lastId"].as_str().expect("lastId").to_string());
            }
            ids
        }
        Mode::Batch => {
            let (first, last) = sse_client::publish_ok(base, thread, events).await;
            vec![first, last]
        }
    }
}

/// Asserts that `got` is exactly `published`: same JSON values, data text equal to the compact
/// serialisation, ids strictly increasing.
fn assert_same(what: &str, got: &[ReceivedText], published: &[Value]) {
    assert_eq!(got.len(), published.len(), "{what}: event count");
    for (i, (r, ev)) in got.iter().zip(published).enumerate() {
        assert_eq!(&r.data, ev, "{what}: event #{i} differs");
        let compact = serde_json::to_string(ev).unwrap();
        assert_eq!(
            r.text, compact,
            "{what}: event #{i} is not the compact serialisation"
        );
    }
    sse_client::assert_text_ids_increasing(got);
}

/// One recorded stream, one mode, one fresh thread.
async fn fan_out_one(base: &str, path: &Path, mode: Mode) {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let what = format!("{name} ({mode:?})");
    let thread = broker::thread_id("fixture");
    let mut events = fixtures::read_events(path);
    fixtures::retarget(&mut events, &thread);
    let n = events.len();

    // Subscribers connect (the response headers are back) before anything is published.
    let mut readers = Vec::with_capacity(SUBSCRIBERS);
    for _ in 0..SUBSCRIBERS {
        let mut sub = sse_client::subscribe(base, &thread, "", None).await;
        readers.push(tokio::spawn(async move { sub.take_text(n, WAIT).await }));
    }
    let acked = publish(base, &thread, &events, mode).await;

    let mut first: Option<Vec<ReceivedText>> = None;
    for (k, reader) in readers.into_iter().enumerate() {
        let got = reader.await.expect("subscriber task");
        assert_same(&format!("{what}, subscriber {k}"), &got, &events);
        match &first {
            None => first = Some(got),
            Some(f) => assert_eq!(&got, f, "{what}: subscriber {k} differs from subscriber 0"),
        }
    }
    let got = first.expect("at least one subscriber");
    match mode {
        Mode::PerEvent => {
            let ids: Vec<String> = got.iter().map(|r| r.id.clone()).collect();
            assert_eq!(ids, acked, "{what}: ids differ from the acknowledged ones");
        }
        Mode::Batch => {
            assert_eq!(got[0].id, acked[0], "{what}: first id vs firstId");
            assert_eq!(got[n - 1].id, acked[1], "{what}: last id vs lastId");
        }
    }

    let mut from_start = sse_client::subscribe(base, &thread, "?from=start", None).await;
    let again = from_start.take_text(n, WAIT).await;
    assert_eq!(
        again, got,
        "{what}: ?from=start differs from the live subscribers"
    );
}

/// The shared body: every recorded response stream, in both publish modes.
async fn fan_out_all(server: Server) {
    let base = broker::base(server.addr);
    let paths = fixtures::recorded_responses();
    for path in &paths {
        for mode in [Mode::PerEvent, Mode::Batch] {
            fan_out_one(&base, path, mode).await;
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_recorded_streams_fan_out_identically() {
    fan_out_all(broker::start_memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_recorded_streams_fan_out_identically() {
    fan_out_all(broker::start_redis().await).await;
}
