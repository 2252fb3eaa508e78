//! Idempotent retries (PROTOCOL §2): with `X-Producer-Id` and `X-Producer-Seq`, events a producer
//! already appended on a thread are acknowledged and not appended again, also across nodes.

mod common;

use common::{broker, sse_client};
use serde_json::{Value, json};
use std::time::Duration;

async fn post(
    base: &str,
    thread: &str,
    producer: Option<(&str, &str)>,
    events: &[Value],
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(events).unwrap());
    if let Some((id, seq)) = producer {
        req = req
            .header("X-Producer-Id", id)
            .header("X-Producer-Seq", seq);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

fn content(i: usize) -> Value {
    json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":format!("<{i}>")})
}

/// Two nodes sharing Redis: a producer's retries on either node never duplicate.
#[tokio::test]
async fn retries_are_acknowledged_not_appended_across_nodes() {
    let a = broker::start_redis().await;
    let b = broker::start_redis().await;
    let (a_url, b_url) = (broker::base(a.addr), broker::base(b.addr));
    let t = broker::thread_id("idem");
    let start = [
        json!({"type":"RUN_STARTED","threadId":t,"runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m"}),
    ];
    let p = Some(("agent-1", "1"));
    let (s, r) = post(&a_url, &t, p, &start).await;
    assert_eq!((s, r["count"].clone()), (200, json!(2)), "{r}");
    // The same batch again (a retry after a lost reply), on the other node.
    let (s, r) = post(&b_url, &t, p, &start).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["count"], 0);
    assert_eq!(r["duplicates"], 2);
    // Events 3..=5, then a retry overlapping 5..=6: only 6 is new.
    let (s, r) = post(
        &b_url,
        &t,
        Some(("agent-1", "3")),
        &[content(3), content(4), content(5)],
    )
    .await;
    assert_eq!((s, r["count"].clone()), (200, json!(3)), "{r}");
    let (s, r) = post(
        &a_url,
        &t,
        Some(("agent-1", "5")),
        &[content(5), content(6)],
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["count"].clone(), r["duplicates"].clone()),
        (json!(1), json!(1)),
        "{r}"
    );
    // Another producer has its own numbering.
    let (s, r) = post(&a_url, &t, Some(("agent-2", "1")), &[content(100)]).await;
    assert_eq!((s, r["count"].clone()), (200, json!(1)), "{r}");
    // Without headers, nothing is deduplicated.
    let (s, r) = post(&a_url, &t, None, &[content(6)]).await;
    assert_eq!((s, r["count"].clone()), (200, json!(1)), "{r}");

    let mut all = sse_client::subscribe(&a_url, &t, "?from=start", None).await;
    let got = all.take(8, Duration::from_secs(5)).await;
    let deltas: Vec<&str> = got
        .iter()
        .filter_map(|e| e.data["delta"].as_str())
        .collect();
    assert_eq!(deltas, ["<3>", "<4>", "<5>", "<6>", "<100>", "<6>"]);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn malformed_producer_headers_are_refused() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let t = broker::thread_id("idem-bad");
    let ev = [json!({"type":"RUN_STARTED","threadId":t,"runId":"r1"})];
    for (id, seq, field) in [
        (Some("a b"), Some("1"), "X-Producer-Id"),
        (Some("a"), Some("-1"), "X-Producer-Seq"),
        (Some("a"), Some("x"), "X-Producer-Seq"),
        // Numbers start at 1; 0 was taken for "already appended" and the event dropped.
        (Some("a"), Some("0"), "X-Producer-Seq"),
        // Past 2^63 - 1 a batch's numbers could overflow (and a retry append again).
        (Some("a"), Some("9223372036854775808"), "X-Producer-Seq"),
        (Some("a"), Some("18446744073709551615"), "X-Producer-Seq"),
        (Some("a"), None, "X-Producer-Seq"),
        (None, Some("1"), "X-Producer-Id"),
    ] {
        let mut req = reqwest::Client::new()
            .post(format!("{base}/v1/threads/{t}/events"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&ev).unwrap());
        if let Some(id) = id {
            req = req.header("X-Producer-Id", id);
        }
        if let Some(seq) = seq {
            req = req.header("X-Producer-Seq", seq);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_producer", "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    let head = server
        .state
        .log
        .head(&agui_fanout::event::ThreadId::parse(&t).unwrap())
        .await
        .unwrap();
    assert_eq!(head.last_id(), None, "nothing appended");
    server.stop().await;
}
