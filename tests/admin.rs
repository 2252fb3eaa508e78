//! The admin API (PROTOCOL §12) over real sockets, on both log backends (Redis: a private
//! `redis-server` per test):
//!
//! - `GET /v1/threads?prefix=&limit=&cursor=`: every thread with the prefix is listed, and only
//!   those, across pages of at most `limit`, with its last id, last type, run status and
//!   retained count; Redis walks the keyspace with `SCAN` (threads written by direct `XADD`
//!   included); `GET /v1/threads/{id}` summarises one, 404 for a thread with no event;
//! - `GET /v1/connections` lists this node's streams (thread, remote address, start, queue);
//!   `DELETE /v1/connections/{id}` ends one, and a client that reconnects with its
//!   `Last-Event-ID` gets every later event exactly once while a producer keeps publishing;
//! - with authentication on: 401 without a token, 403 (`agui.admin`) without the admin claim;
//!   an admin token may also subscribe to and publish on any thread;
//! - bad queries get 400 naming the field;
//! - on a Redis Cluster the list walks every primary (pages crossing from one primary to the
//!   next), with the same guarantees; one thread's summary works.

mod common;

use common::broker::{self, base, walk};
use common::redis_cluster::RedisCluster;
use common::redis_server::RedisServer;
use common::sse_client::{self, open_raw, publish_ok};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

const SECRET: &str = "test-secret-of-a-reasonable-length";
const WAIT: Duration = Duration::from_secs(10);

/// `GET {url}` with an optional bearer token: status and JSON body.
async fn get(url: &str, token: Option<&str>) -> (u16, Value) {
    broker::get_json(url, token).await
}

/// `DELETE {url}`: status and JSON body.
async fn delete(url: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().delete(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Publishes a run to `thread`: `RUN_STARTED`, and `RUN_FINISHED` when `finished`; the last id.
async fn run(base: &str, thread: &str, finished: bool) -> String {
    let mut events = vec![json!({"type":"RUN_STARTED","threadId":thread,"runId":"r1"})];
    if finished {
        events.push(json!({"type":"RUN_FINISHED","threadId":thread,"runId":"r1"}));
    }
    publish_ok(base, thread, &events).await.1
}

/// Threads `{tag}-p-00`… (`n` of them, every third one finished) and `{tag}-q-00`… (`others`):
/// the `p` ids.
async fn populate(base: &str, tag: &str, n: usize, others: usize) -> BTreeSet<String> {
    let mut wanted = BTreeSet::new();
    for i in 0..n {
        let t = format!("{tag}-p-{i:03}");
        run(base, &t, i % 3 == 0).await;
        wanted.insert(t);
    }
    for i in 0..others {
        run(base, &format!("{tag}-q-{i:03}"), false).await;
    }
    wanted
}

/// Lists by prefix over pages of `limit`: exactly the wanted threads, each once, no page
/// over its limit; the rows say what the log holds.
async fn lists_by_prefix(base: &str, tag: &str) {
    let wanted = populate(base, tag, 40, 10).await;
    // A thread only looked at (subscribed, never written) is not listed.
    let mut looked = open_raw(base, &format!("{tag}-p-zz"), "", None).await;
    looked.next_frame(WAIT).await.expect("retry frame");
    let (ids, sizes) = walk(base, &format!("{tag}-p-"), 7).await;
    assert!(sizes.iter().all(|&s| s <= 7), "page sizes {sizes:?}");
    assert!(sizes.len() >= 6, "40 threads in pages of 7: {sizes:?}");
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(unique.len(), ids.len(), "a thread listed twice: {ids:?}");
    assert_eq!(unique, wanted);

    // One page holding everything, and the rows' content.
    let (status, page) = get(&format!("{base}/v1/threads?prefix={tag}-&limit=1000"), None).await;
    assert_eq!(status, 200);
    assert_eq!(page["threads"].as_array().unwrap().len(), 50, "{page}");
    assert_eq!(page["nextCursor"], Value::Null);
    let finished = format!("{tag}-p-003");
    let last = run(base, &finished, false).await;
    let row = |page: &Value, t: &str| {
        page["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["threadId"] == t)
            .cloned()
            .unwrap_or_else(|| panic!("{t} not in {page}"))
    };
    let (_, page) = get(&format!("{base}/v1/threads?prefix={finished}"), None).await;
    let r = row(&page, &finished);
    assert_eq!(r["lastEventId"], last.as_str());
    assert_eq!(r["lastEventType"], "RUN_STARTED");
    assert_eq!(r["runStatus"], "running");
    assert_eq!(r["eventsRetained"], 3);
    let (_, page) = get(&format!("{base}/v1/threads?prefix={tag}-p-006"), None).await;
    let r = row(&page, &format!("{tag}-p-006"));
    assert_eq!(
        (r["lastEventType"].as_str(), r["runStatus"].as_str()),
        (Some("RUN_FINISHED"), Some("finished"))
    );
    assert_eq!(r["eventsRetained"], 2);
    assert_eq!(r["connections"], 0);

    // One thread's summary, with the fold's run; 404 for one without events.
    let (status, s) = get(&format!("{base}/v1/threads/{finished}"), None).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["lastEventId"], last.as_str());
    assert_eq!(s["run"]["runId"], "r1");
    assert_eq!(s["run"]["status"], "running");
    assert_eq!(s["trimmed"], false);
    let (status, e) = get(&format!("{base}/v1/threads/{tag}-nothing"), None).await;
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["error"]["code"], "thread_not_found");
    drop(looked);
}

#[tokio::test]
async fn threads_by_prefix_in_pages_memory() {
    let server = broker::start_memory().await;
    lists_by_prefix(&base(server.addr), "mem").await;
    server.stop().await;
}

#[tokio::test]
async fn threads_by_prefix_in_pages_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let server = broker::start(|c| c.redis_url = url).await;
    lists_by_prefix(&base(server.addr), "red").await;
    server.stop().await;
}

/// A thread one of whose keys another program overwrote with another type (its `:meta` a
/// string) is left out of the list; the other threads of the page are listed (it used to fail
/// every page holding it with 503). Looking up an unknown id creates no key.
#[tokio::test]
async fn a_thread_with_foreign_keys_does_not_fail_the_list() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let server = broker::start(|c| c.redis_url = url).await;
    let base = base(server.addr);
    for t in ["fk-1", "fk-2", "fk-3"] {
        run(&base, t, true).await;
    }
    // An admin lookup of an id nobody wrote answers 404 and writes nothing.
    let (status, _) = get(&format!("{base}/v1/threads/fk-ghost"), None).await;
    assert_eq!(status, 404);
    assert_eq!(
        redis.command(&["EXISTS", "agui:{fk-ghost}:meta"]).await,
        "0"
    );
    redis.command(&["DEL", "agui:{fk-2}:meta"]).await;
    redis.command(&["SET", "agui:{fk-2}:meta", "garbage"]).await;
    let (ids, _) = walk(&base, "fk-", 1000).await;
    assert_eq!(ids, ["fk-1", "fk-3"]);
    let (ids, sizes) = walk(&base, "fk-", 1).await;
    assert_eq!(ids, ["fk-1", "fk-3"], "pages {sizes:?}");
    server.stop().await;
}

/// Over many `SCAN` batches (threads written straight to Redis with `XADD`, as a direct
/// producer does): every thread with the prefix is listed, pages within their limit.
#[tokio::test]
async fn redis_lists_across_scan_batches() {
    let redis = RedisServer::start().await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    let mut wanted = BTreeSet::new();
    for i in 0..900 {
        let t = format!("big-{i:04}");
        let e = json!({"type":"RUN_STARTED","threadId":t,"runId":"r"}).to_string();
        pipe.cmd("XADD")
            .arg(format!("agui:{{{t}}}:log"))
            .arg("*")
            .arg("e")
            .arg(e)
            .ignore();
        wanted.insert(t);
    }
    // Keys that are not thread logs, some of them close to the pattern.
    for i in 0..300 {
        pipe.cmd("SET")
            .arg(format!("agui:{{big-{i:04}}}:o:x"))
            .arg("-")
            .ignore();
        pipe.cmd("SET").arg(format!("other:{i}")).arg("1").ignore();
    }
    pipe.query_async::<()>(&mut conn).await.unwrap();
    let url = redis.url();
    let server = broker::start(|c| c.redis_url = url).await;
    let base = base(server.addr);
    let (ids, sizes) = walk(&base, "big-", 100).await;
    assert!(sizes.iter().all(|&s| s <= 100), "page sizes {sizes:?}");
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    // SCAN may list a thread twice if the keyspace is resized during the walk; never miss one.
    assert_eq!(unique, wanted);
    let (_, page) = get(&format!("{base}/v1/threads?prefix=big-0042"), None).await;
    let row = &page["threads"][0];
    assert_eq!(row["threadId"], "big-0042");
    assert_eq!(row["lastEventType"], "RUN_STARTED");
    assert_eq!(row["eventsRetained"], 1);
    server.stop().await;
}

#[tokio::test]
async fn bad_queries_name_the_field() {
    let server = broker::start_memory().await;
    let base = base(server.addr);
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=x", "limit"),
        ("prefix=a%20b", "prefix"),
        ("cursor=nope", "cursor"),
        ("cursor=1.a%20b", "cursor"),
        ("limit=1&limit=2", "limit"),
    ] {
        let (status, e) = get(&format!("{base}/v1/threads?{query}"), None).await;
        assert_eq!(status, 400, "{query}: {e}");
        assert_eq!(e["error"]["field"], field, "{query}: {e}");
    }
    let (status, e) = get(&format!("{base}/v1/connections?thread=a%20b"), None).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (400, Some("thread"))
    );
    let (status, e) = delete(&format!("{base}/v1/connections/abc"), None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("invalid_connection_id"))
    );
    let (status, e) = delete(&format!("{base}/v1/connections/424242"), None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("connection_not_found"))
    );
    server.stop().await;
}

/// A stream an operator closes ends with a comment; its client reconnects with its
/// `Last-Event-ID` and gets every later event exactly once while the producer keeps going.
async fn closed_stream_resumes_exactly(base: &str, thread: &str) {
    run(base, thread, false).await;
    publish_ok(
        base,
        thread,
        &[json!({"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"})],
    )
    .await;
    let producer = {
        let (base, thread) = (base.to_string(), thread.to_string());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..150 {
                let ev =
                    json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":format!("w{i} ")});
                ids.push(publish_ok(&base, &thread, &[ev]).await.1);
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
            let end = [
                json!({"type":"TEXT_MESSAGE_END","messageId":"m"}),
                json!({"type":"RUN_FINISHED","threadId":thread,"runId":"r1"}),
            ];
            let (first, last) = publish_ok(&base, &thread, &end).await;
            ids.extend([first, last]);
            ids
        })
    };
    // First connection: the prelude, then live events until the operator closes it.
    let mut stream = open_raw(base, thread, "", None).await;
    let mut got: Vec<(String, Value)> = Vec::new();
    let mut prelude_done = false;
    let mut last_id = String::new();
    while got.len() < 20 {
        let f = stream
            .next_event(WAIT)
            .await
            .expect("events before the close");
        // A prelude's events carry no id but the last (the parser keeps the last one seen).
        if let Some(i) = f.id.clone() {
            last_id = i;
        }
        let data: Value = serde_json::from_str(f.data.as_deref().unwrap()).unwrap();
        if data["type"] == "TEXT_MESSAGE_CONTENT" {
            prelude_done = true;
        }
        if prelude_done {
            got.push((last_id.clone(), data));
        }
    }
    let (status, list) = get(&format!("{base}/v1/connections?thread={thread}"), None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["total"], 1, "{list}");
    let conn = &list["connections"][0];
    assert_eq!(conn["threadId"], thread);
    assert_eq!(conn["start"], "new");
    assert!(
        conn["remoteAddr"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{conn}"
    );
    let id = conn["id"].as_u64().unwrap();
    let (status, closed) = delete(&format!("{base}/v1/connections/{id}"), None).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["closed"]["id"], id);
    // The rest of the first stream: maybe a few events already written, then the comment.
    let mut told = false;
    while let Some(f) = stream.next_frame(WAIT).await {
        if let (Some(i), Some(d)) = (f.id.clone(), f.data.as_deref()) {
            last_id = i.clone();
            got.push((i, serde_json::from_str(d).unwrap()));
        }
        told |= f
            .comments
            .iter()
            .any(|c| c == "agui-fanout: closed by an operator, reconnect");
    }
    assert!(told, "the stream ended with the operator's comment");
    // Reconnect as an EventSource does: the last id it saw.
    let mut again = open_raw(base, thread, "", Some(&last_id)).await;
    loop {
        let f = again
            .next_event(WAIT)
            .await
            .expect("events after the resume");
        let data: Value = serde_json::from_str(f.data.as_deref().unwrap()).unwrap();
        let done = data["type"] == "RUN_FINISHED";
        got.push((f.id.expect("an id"), data));
        if done {
            break;
        }
    }
    let (_, list) = get(&format!("{base}/v1/connections?thread={thread}"), None).await;
    assert_eq!(list["connections"][0]["start"], "exact", "{list}");
    let published = producer.await.unwrap();
    // Every event from the first one received on: in order, each once, none missing.
    let received: Vec<&str> = got.iter().map(|(i, _)| i.as_str()).collect();
    let from = published
        .iter()
        .position(|i| i == received[0])
        .expect("the first event received was published");
    assert_eq!(
        received,
        published[from..]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    assert!(sse_client::metric(base, "agui_disconnects_total", &[("cause", "admin")]).await >= 1.0);
}

#[tokio::test]
async fn closing_a_connection_resumes_exactly_memory() {
    let server = broker::start_memory().await;
    closed_stream_resumes_exactly(&base(server.addr), &broker::thread_id("close")).await;
    server.stop().await;
}

#[tokio::test]
async fn closing_a_connection_resumes_exactly_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let server = broker::start(|c| c.redis_url = url).await;
    closed_stream_resumes_exactly(&base(server.addr), &broker::thread_id("close")).await;
    server.stop().await;
}

/// A stream served by hyper (here: two `Cookie` headers, which the connection front leaves to
/// hyper) is listed with its remote address too, and closes the same way.
#[tokio::test]
async fn hyper_streams_are_listed_and_closed() {
    let server = broker::start_memory().await;
    let base = base(server.addr);
    let thread = broker::thread_id("hyper");
    run(&base, &thread, false).await;
    let resp = reqwest::Client::new()
        .get(format!("{base}/v1/threads/{thread}/events"))
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (_, list) = get(&format!("{base}/v1/connections?thread={thread}"), None).await;
    let conn = &list["connections"][0];
    assert!(
        conn["remoteAddr"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{list}"
    );
    let id = conn["id"].as_u64().unwrap();
    assert_eq!(
        delete(&format!("{base}/v1/connections/{id}"), None).await.0,
        200
    );
    let body = tokio::time::timeout(WAIT, resp.text())
        .await
        .expect("the stream ends")
        .unwrap();
    assert!(
        body.contains(": agui-fanout: closed by an operator, reconnect"),
        "{body}"
    );
    // Gone from the list once its stream ended.
    for _ in 0..100 {
        let (_, list) = get(&format!("{base}/v1/connections?thread={thread}"), None).await;
        if list["total"] == 0 {
            server.stop().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the closed stream stayed listed");
}

/// With authentication on: 401 without a token (or with a bad one), 403 naming `agui.admin`
/// with a token that lacks the claim, 200 with it; an admin token may subscribe and publish
/// anywhere.
#[tokio::test]
async fn admin_needs_the_admin_claim() {
    let server = broker::start(|c| c.auth.hs256_secret = SECRET.into()).await;
    let base = base(server.addr);
    let admin = agui_fanout::http::auth::DevToken {
        subscribe: &[],
        publish: &[],
        admin: true,
        ttl: Some(Duration::from_secs(600)),
        audience: None,
        issuer: None,
    }
    .sign_hs256(SECRET)
    .unwrap();
    let plain = agui_fanout::http::auth::issue_hs256(
        SECRET,
        &["*".into()],
        &["*".into()],
        Some(Duration::from_secs(600)),
    )
    .unwrap();
    let urls = [
        format!("{base}/v1/threads"),
        format!("{base}/v1/threads/x"),
        format!("{base}/v1/connections"),
    ];
    for url in &urls {
        let (status, e) = get(url, None).await;
        assert_eq!(
            (status, e["error"]["code"].as_str()),
            (401, Some("unauthorized")),
            "{url}"
        );
        let (status, _) = get(url, Some("not.a.token")).await;
        assert_eq!(status, 401, "{url}");
        let (status, e) = get(url, Some(&plain)).await;
        assert_eq!(
            (status, e["error"]["field"].as_str()),
            (403, Some("agui.admin")),
            "{url}"
        );
    }
    let (status, e) = delete(&format!("{base}/v1/connections/1"), None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, e) = delete(&format!("{base}/v1/connections/1"), Some(&plain)).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (403, Some("agui.admin"))
    );

    // The admin token publishes and subscribes on any thread, and reads the admin API.
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/threads/any-1/events"))
        .bearer_auth(&admin)
        .json(&json!({"type":"RUN_STARTED","threadId":"any-1","runId":"r"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = open_raw(&base, "any-1", &format!("?access_token={admin}"), None).await;
    assert_eq!(stream.status, 200);
    stream.next_event(WAIT).await.expect("the prelude");
    let (status, page) = get(&format!("{base}/v1/threads"), Some(&admin)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["threads"][0]["threadId"], "any-1");
    assert_eq!(page["threads"][0]["connections"], 1);
    let (status, _) = get(&format!("{base}/v1/threads?access_token={admin}"), None).await;
    assert_eq!(status, 200, "the token in the query");
    let (status, list) = get(&format!("{base}/v1/connections"), Some(&admin)).await;
    assert_eq!((status, list["total"].as_u64()), (200, Some(1)));
    let id = list["connections"][0]["id"].as_u64().unwrap();
    let (status, _) = delete(&format!("{base}/v1/connections/{id}"), Some(&admin)).await;
    assert_eq!(status, 200);
    server.stop().await;
}

/// On a Redis Cluster (3 primaries) the list walks each primary in turn: the 40 threads of
/// the prefix, spread over the primaries, come back exactly once in pages of 7 (some of which
/// cross from one primary to the next), and a thread's summary works.
#[tokio::test]
async fn a_cluster_lists_the_threads_of_every_primary() {
    let cluster = RedisCluster::start(3, 0).await;
    let seeds = cluster.seeds();
    let server = broker::start(|c| c.redis_url = seeds).await;
    let base = base(server.addr);
    lists_by_prefix(&base, "clu").await;
    let last = run(&base, "clu-1", true).await;
    let (status, s) = get(&format!("{base}/v1/threads/clu-1"), None).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["lastEventId"], last.as_str());
    assert_eq!(s["runStatus"], "finished");
    server.stop().await;
}
