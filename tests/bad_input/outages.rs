//! Redis outages: the broker's private `redis-server` killed and restarted empty (a new epoch),
//! or frozen and thawed (no data lost: the open stream continues exactly).

use super::*;

// ---------------------------------------------------------------------------------------------
// Redis outages

/// What a stream does next.
#[derive(Debug)]
enum Next {
    Event(RawFrame),
    Ended,
    Idle,
}

/// The next data frame of `raw` within `wait`, or that it ended, or that nothing came.
async fn next_data(raw: &mut RawStream, wait: Duration) -> Next {
    // `next_event` is cancel-safe (its buffer lives in `raw`); its own stall timeout is longer.
    match tokio::time::timeout(wait, raw.next_event(Duration::from_secs(300))).await {
        Err(_) => Next::Idle,
        Ok(None) => Next::Ended,
        Ok(Some(f)) => Next::Event(f),
    }
}

async fn take_data(raw: &mut RawStream, n: usize, what: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    while out.len() < n {
        match next_data(raw, Duration::from_secs(10)).await {
            Next::Event(f) => out.push((
                f.id.expect("event frames carry an id"),
                serde_json::from_str(f.data.as_deref().unwrap()).expect("data is JSON"),
            )),
            other => panic!(
                "{what}: {other:?} after {} of {n} events: {out:?}",
                out.len()
            ),
        }
    }
    out
}

fn epoch_of(id: &str) -> &str {
    id.split('-').next().unwrap()
}

async fn get(base: &str, path: &str) -> Reply {
    send(reqwest::Client::new().get(format!("{base}{path}"))).await
}

/// Publishes until the backend takes it (Redis just came back), for at most 10 s.
async fn publish_when_back(base: &str, thread: &str, events: &[Value]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = post_json(base, thread, &Value::Array(events.to_vec())).await;
        if r.status == StatusCode::OK {
            return r.body;
        }
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
        assert!(
            Instant::now() < deadline,
            "publishes still fail 10 s after Redis came back: {}",
            r.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// While Redis is unreachable: publish 503 + JSON with one of `codes` (`backend_unavailable`
/// with `Retry-After`: nothing was appended; `append_outcome_unknown` without it: the append
/// was sent and may run, PROTOCOL §2 "Unknown outcomes"); `/readyz` 503; `/healthz` 200; a new
/// stream still opens with 200 (PROTOCOL §4.3: never a 4xx for `EventSource`). A resume
/// (`Last-Event-ID: resume_id`) opened meanwhile also gets 200 and an SSE stream that ends, so
/// an `EventSource` retries later.
async fn assert_outage_answers(
    base: &str,
    thread: &str,
    event: &Value,
    resume_id: &str,
    codes: &[&str],
) {
    let fresh = broker::thread_id("outage-new");
    let batch = json!([event]);
    let (publish, ready, health, new_stream, mut resume) = tokio::join!(
        post_json(base, thread, &batch),
        get(base, "/readyz"),
        get(base, "/healthz"),
        sse_client::open_raw(base, &fresh, "", None),
        sse_client::open_raw(base, thread, "", Some(resume_id)),
    );
    publish.error(StatusCode::SERVICE_UNAVAILABLE, "publish during the outage");
    assert!(codes.contains(&publish.code()), "{}", publish.text);
    let retry_after = publish
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if publish.code() == "backend_unavailable" {
        assert!(
            retry_after.is_some_and(|s| s >= 1),
            "503 carries Retry-After in seconds: {:?}",
            publish.headers.get("retry-after")
        );
    } else {
        assert_eq!(
            retry_after, None,
            "an unknown outcome is no invitation to retry"
        );
    }
    ready.error(StatusCode::SERVICE_UNAVAILABLE, "/readyz during the outage");
    assert_eq!(health.status, StatusCode::OK, "/healthz during the outage");
    assert_eq!(
        new_stream.status,
        StatusCode::OK,
        "a stream opened during the outage"
    );
    assert_eq!(new_stream.headers["content-type"], SSE);
    assert_eq!(resume.status, StatusCode::OK, "a resume during the outage");
    assert_eq!(resume.headers["content-type"], SSE);
    let (frames, _) = resume.read_to_end(Duration::from_secs(10)).await;
    assert!(
        frames.iter().all(|f| f.data.is_none()),
        "a resume during the outage carries no event: {frames:?}"
    );
}

async fn wait_ready(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(base, "/readyz").await.status != StatusCode::OK {
        assert!(
            Instant::now() < deadline,
            "/readyz not 200 10 s after Redis came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Redis dies and comes back empty (it persists nothing): the broker stays up, refuses
/// publishes with 503 meanwhile, then starts the thread's log over under a new epoch. The old
/// stream is ended (a discontinuity); resuming with an id of the old epoch gets 200 and the
/// events of the new log (PROTOCOL §1 epoch, §4.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_with_data_loss() {
    let mut redis = RedisServer::start().await;
    let server = broker::start(|c| {
        c.redis_url = redis.url();
        c.redis_outcome_timeout = Duration::from_secs(1);
    })
    .await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("outage-lost");

    let mut stream = sse_client::open_raw(&base, &t, "", None).await;
    assert_eq!(stream.status, StatusCode::OK);
    let before = vec![
        json!({"type": "RUN_STARTED", "threadId": t, "runId": "r1"}),
        custom(1),
        custom(2),
    ];
    sse_client::publish_ok(&base, &t, &before).await;
    let got = take_data(&mut stream, 3, "before the outage").await;
    assert_eq!(
        got.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
        before
    );
    let old_id = got[2].0.clone();

    redis.kill();
    // The broker's connection died with Redis: a publish written to it cannot be settled
    // (unknown), one that finds the connection gone was not appended (unavailable).
    let codes = ["backend_unavailable", "append_outcome_unknown"];
    assert_outage_answers(&base, &t, &custom(3), &old_id, &codes).await;
    match next_data(&mut stream, Duration::from_millis(500)).await {
        Next::Idle => {}
        other => panic!("the open stream must stay open during the outage, got {other:?}"),
    }

    redis.restart().await;
    let after = vec![
        json!({"type": "RUN_STARTED", "threadId": t, "runId": "r2"}),
        custom(10),
    ];
    let reply = publish_when_back(&base, &t, &after).await;
    let new_first = reply["firstId"].as_str().unwrap().to_string();
    assert_ne!(
        epoch_of(&new_first),
        epoch_of(&old_id),
        "the log recreated after the data loss has a new epoch"
    );
    wait_ready(&base).await;

    // The old stream cannot continue across the lost log: the broker ends it.
    match next_data(&mut stream, Duration::from_secs(10)).await {
        Next::Ended => {}
        other => panic!("the stream of the lost log must be ended by the broker, got {other:?}"),
    }

    // The client reconnects with its old id: 200, never a 4xx; then the new log's events.
    let mut resumed = sse_client::open_raw(&base, &t, "", Some(&old_id)).await;
    assert_eq!(
        resumed.status,
        StatusCode::OK,
        "resume with an id of the old epoch"
    );
    assert_eq!(resumed.headers["content-type"], SSE);
    let later = vec![
        custom(11),
        custom(12),
        json!({"type": "RUN_FINISHED", "threadId": t, "runId": "r2"}),
    ];
    let (later_first, later_last) = sse_client::publish_ok(&base, &t, &later).await;
    // A prelude (PROTOCOL §5) may come first; the live events follow it exactly.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < later.len()
        || seen[seen.len() - later.len()..]
            .iter()
            .map(|(_, v): &(String, Value)| v.clone())
            .collect::<Vec<_>>()
            != later
    {
        assert!(
            Instant::now() < deadline,
            "the resumed stream did not deliver the new events: {seen:?}"
        );
        match next_data(&mut resumed, Duration::from_secs(10)).await {
            Next::Event(f) => {
                let data: Value = serde_json::from_str(f.data.as_deref().unwrap()).unwrap();
                assert!(
                    !before.contains(&data),
                    "an event of the lost log was delivered: {data}"
                );
                seen.push((f.id.unwrap_or_default(), data));
            }
            other => panic!("resumed stream: {other:?} after {seen:?}"),
        }
    }
    let tail = &seen[seen.len() - later.len()..];
    assert_eq!(tail[0].0, later_first);
    assert_eq!(tail[later.len() - 1].0, later_last);
    for (id, _) in &seen {
        if !id.is_empty() {
            assert_eq!(
                epoch_of(id),
                epoch_of(&new_first),
                "only ids of the new epoch: {seen:?}"
            );
        }
    }
    server.stop().await;
}

/// Redis freezes (SIGSTOP: nothing answers, nothing is lost) and thaws: publishes fail with 503
/// meanwhile, `/readyz` fails, the broker and the open stream stay up; afterwards the open
/// stream continues exactly with what the log holds after its last id: no gap, no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_without_data_loss() {
    let redis = RedisServer::start().await;
    let server = broker::start(|c| {
        c.redis_url = redis.url();
        c.redis_outcome_timeout = Duration::from_secs(1);
    })
    .await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("outage-kept");

    let mut stream = sse_client::open_raw(&base, &t, "", None).await;
    assert_eq!(stream.status, StatusCode::OK);
    let before = vec![
        json!({"type": "RUN_STARTED", "threadId": t, "runId": "r1"}),
        custom(1),
        custom(2),
    ];
    sse_client::publish_ok(&base, &t, &before).await;
    let got = take_data(&mut stream, 3, "before the outage").await;
    let last_before = got[2].0.clone();

    redis.pause();
    // A publish that times out may still be applied when Redis thaws, and a frozen Redis
    // cannot settle it: 503 `append_outcome_unknown`, and whatever the log holds afterwards
    // is what the stream must carry.
    let codes = ["append_outcome_unknown"];
    assert_outage_answers(&base, &t, &custom(3), &last_before, &codes).await;
    match next_data(&mut stream, Duration::from_millis(300)).await {
        Next::Idle => {}
        other => panic!("the open stream must stay open during the outage, got {other:?}"),
    }
    redis.resume();

    let after = vec![
        custom(20),
        custom(21),
        json!({"type": "RUN_FINISHED", "threadId": t, "runId": "r1"}),
    ];
    let reply = publish_when_back(&base, &t, &after).await;
    let last_after = reply["lastId"].as_str().unwrap().to_string();
    assert_eq!(
        epoch_of(&last_after),
        epoch_of(&last_before),
        "same epoch: nothing was lost"
    );
    wait_ready(&base).await;

    // Exactly the log after the last id received, on the same stream.
    let tid = ThreadId::parse(&t).unwrap();
    let last_before_id: EventId = last_before.parse().unwrap();
    let expected: Vec<(String, Value)> = server
        .state
        .log
        .read(&tid, ReadFrom::After(last_before_id), 1000)
        .await
        .expect("read the log")
        .into_iter()
        .map(|e| (e.id.to_string(), serde_json::from_slice(&e.json).unwrap()))
        .collect();
    let published_after: Vec<Value> = expected[expected.len().saturating_sub(after.len())..]
        .iter()
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(
        published_after, after,
        "the log ends with the events published after the outage: {expected:?}"
    );
    assert_eq!(expected.last().unwrap().0, last_after);
    let got = take_data(&mut stream, expected.len(), "after the outage").await;
    assert_eq!(got, expected, "the open stream continues exactly");
    match next_data(&mut stream, Duration::from_millis(300)).await {
        Next::Idle => {}
        other => panic!("nothing more after the log's last event, got {other:?}"),
    }
    server.stop().await;
}
