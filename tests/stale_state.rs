//! A client that resumes holding state the log never had (from an epoch Redis lost, or from a
//! tail a failover rolled back) ends at the log's state, judged by the real `@ag-ui/client`:
//! the prelude it gets restates the state even when nothing in the log ever set it
//! (PROTOCOL §5 "Prelude", item 3). Before, the client kept `{"k":1}` for good while the
//! broker's snapshot said `{}`.

mod common;

use common::agui_client::{self as agui, Case};
use common::{broker, sse_client};
use serde_json::{Value, json};

/// SSE frames of a run the client saw on a log that no longer exists, with state set.
fn stale_history(thread: &str) -> String {
    [
        json!({"type":"RUN_STARTED","threadId":thread,"runId":"lost"}),
        json!({"type":"STATE_SNAPSHOT","snapshot":{"k":1}}),
        json!({"type":"RUN_FINISHED","threadId":thread,"runId":"lost"}),
    ]
    .iter()
    .map(|e| format!("data: {e}\n\n"))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_the_log_cannot_honour_replaces_stale_state_with_the_logs() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("stale");
    sse_client::publish_ok(
        &base,
        &thread,
        &[
            json!({"type":"RUN_STARTED","threadId":thread,"runId":"r1"}),
            json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
            json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"hello"}),
        ],
    )
    .await;

    // An id of an epoch this log never had: not resumable, so the stream starts with a prelude.
    let mut raw = sse_client::open_raw(&base, &thread, "", Some("0badc0de-1-1")).await;
    assert_eq!(raw.status, 200);
    let (_, last) = sse_client::publish_ok(
        &base,
        &thread,
        &[json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":" world"})],
    )
    .await;
    let body = agui::read_until(&mut raw, &last).await;
    drop(raw);
    let events = agui::body_events(&body);
    assert!(
        events.first().is_some_and(agui::is_prelude_start),
        "a prelude first: {body}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "STATE_SNAPSHOT" && e["snapshot"] == json!({})),
        "the prelude restates the empty state: {body}"
    );

    let results = agui::run_cases(&[Case {
        name: "stale state, then a prelude".into(),
        thread_id: thread.clone(),
        bodies: vec![stale_history(&thread), body],
    }]);
    let result = &results[0];
    assert!(
        result.ok,
        "the client accepts both streams: {:?}",
        result.error
    );

    let snapshot: Value = reqwest::get(format!("{base}/v1/threads/{thread}/snapshot"))
        .await
        .expect("snapshot request")
        .json()
        .await
        .expect("snapshot JSON");
    assert_eq!(
        result.state, snapshot["state"],
        "the client's state is the log's"
    );
    assert_eq!(result.state, json!({}));
    assert_eq!(
        result.messages, snapshot["messages"],
        "the client's messages are the log's"
    );
    server.stop().await;
}
