//! `agui-fanout demo-agent` (the real binary) judged by the real parts: the unmodified
//! `@ag-ui/client` 1.0.0 `HttpAgent` plays the onboarding against it (assessment, approval
//! ending with an interrupt, the `resume[]` run), and the broker's own publish path (schema,
//! order rules, `STATE_DELTA`s applying) takes every run it streams, piped in live as
//! `text/event-stream`; `--fail-after` drops the connection mid-run; bad input is a JSON 400.

mod common;

use agui_fanout::cli::demo_agent::script;
use common::agui_client::node_dir;
use common::broker;
use common::demo_agent::DemoAgent;
use futures::StreamExt;
use serde_json::{Value, json};
use std::process::{Command, Stdio};

/// Runs `tests/node/demo-agent.mjs` (the real `HttpAgent`, three runs) against `url`.
fn real_client(url: &str, thread: &str, resume_status: &str) -> Value {
    assert!(
        node_dir()
            .join("node_modules/@ag-ui/client/package.json")
            .exists(),
        "run `npm ci --prefix tests/node` first (scripts/test.sh does it)"
    );
    let output = Command::new("node")
        .arg(node_dir().join("demo-agent.mjs"))
        .args([url, thread, resume_status])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `node` (Node.js 20+ is needed): {e}"));
    assert!(
        output.status.success(),
        "demo-agent.mjs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("demo-agent.mjs prints one JSON document")
}

/// The `RunAgentInput` of the three runs the node script sends, as far as the demo agent
/// reads them (ids, `state.stage`, `resume`).
fn onboarding_inputs(thread: &str) -> [Value; 3] {
    let user = json!([{"id": "user-1", "role": "user", "content": "I'd like to open an account."}]);
    [
        json!({"threadId": thread, "runId": "run-1", "messages": user, "state": {}}),
        json!({"threadId": thread, "runId": "run-2", "messages": user,
               "state": {"stage": "routed"}}),
        json!({"threadId": thread, "runId": "run-3", "messages": user,
               "state": {"stage": "awaiting_approval"},
               "resume": [{"interruptId": "run-2:approval", "status": "resolved",
                           "payload": {"approved": true}}]}),
    ]
}

/// POSTs `input` to the demo agent and pipes its answer, as it streams, into the broker's
/// publish as `text/event-stream`; returns the broker's status and reply.
async fn pipe_run(agent: &str, base: &str, thread: &str, input: &Value) -> (u16, Value) {
    let client = reqwest::Client::new();
    let upstream = client.post(agent).json(input).send().await.expect("POST /");
    assert_eq!(upstream.status(), 200);
    assert_eq!(upstream.headers()["content-type"], "text/event-stream");
    let reply = client
        .post(format!("{base}/v1/threads/{thread}/events"))
        .header("content-type", "text/event-stream")
        // Like a shell pipe (`curl -N agent | curl --data-binary @- broker`): the upload ends
        // where the agent's answer ends, cleanly or not.
        .body(reqwest::Body::wrap_stream(
            upstream
                .bytes_stream()
                .take_while(|chunk| std::future::ready(chunk.is_ok())),
        ))
        .send()
        .await
        .expect("publish");
    let status = reply.status().as_u16();
    (status, reply.json().await.expect("a JSON reply"))
}

fn types(events: &Value) -> Vec<&str> {
    events
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect()
}

fn steps(events: &Value) -> Vec<&str> {
    events
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["type"] == "STEP_STARTED")
        .filter_map(|e| e["stepName"].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_client_and_the_broker_take_the_onboarding() {
    let agent = DemoAgent::spawn(&["--pace", "0"]);
    let thread = broker::thread_id("demo");

    let client = real_client(&agent.url, &thread, "resolved");
    let runs = client["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 3, "{client}");
    for run in runs {
        assert_eq!(
            run["error"],
            Value::Null,
            "{}: {}",
            run["runId"],
            run["error"]
        );
    }
    assert_eq!(client["warnings"], json!([]), "the client warned");

    assert_eq!(
        steps(&runs[0]["events"]),
        ["identity_check", "risk_assessment", "routing"]
    );
    let first = types(&runs[0]["events"]);
    for kind in [
        "STATE_SNAPSHOT",
        "STATE_DELTA",
        "TEXT_MESSAGE_CONTENT",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_RESULT",
        "REASONING_MESSAGE_CONTENT",
        "CUSTOM",
    ] {
        assert!(first.contains(&kind), "run 1 has no {kind}");
    }
    assert_eq!(runs[0]["result"]["stage"], "routed");
    assert_eq!(runs[0]["pendingInterrupts"], json!([]));

    assert_eq!(steps(&runs[1]["events"]), ["advisor_approval"]);
    let interrupts = runs[1]["pendingInterrupts"].as_array().expect("interrupts");
    assert_eq!(interrupts.len(), 1, "run 2 ends on an interrupt");
    assert_eq!(interrupts[0]["id"], "run-2:approval");
    assert_eq!(interrupts[0]["reason"], "advisor_approval");

    assert_eq!(
        steps(&runs[2]["events"]),
        ["advisor_approval", "account_opening"]
    );
    assert_eq!(runs[2]["pendingInterrupts"], json!([]));
    assert_eq!(runs[2]["result"]["opened"], true);
    assert_eq!(client["state"]["stage"], "opened");
    assert_eq!(client["state"]["riskScore"], 37);

    // The same runs, piped live into a broker with order validation on: every event accepted,
    // and the broker's fold is the client's (but for the user's message, which no agent
    // stream carries).
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    for input in onboarding_inputs(&thread) {
        let (status, reply) = pipe_run(&agent.url, &base, &thread, &input).await;
        assert_eq!(status, 200, "{}: {reply}", input["runId"]);
        assert_eq!(
            reply["count"],
            script::run_events(&input).len(),
            "{}: {reply}",
            input["runId"]
        );
    }
    let snapshot: Value = reqwest::get(format!("{base}/v1/threads/{thread}/snapshot"))
        .await
        .expect("snapshot")
        .json()
        .await
        .expect("snapshot JSON");
    assert_eq!(snapshot["state"], client["state"]);
    let agent_messages: Vec<&Value> = client["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] != "user")
        .collect();
    let folded: Vec<&Value> = snapshot["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .collect();
    assert_eq!(folded, agent_messages);
    assert_eq!(snapshot["run"]["status"], "finished", "{}", snapshot["run"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_interrupt_ends_the_onboarding_without_an_account() {
    let agent = DemoAgent::spawn(&["--pace", "0"]);
    let client = real_client(&agent.url, &broker::thread_id("demo-no"), "cancelled");
    let runs = client["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 3, "{client}");
    assert_eq!(runs[2]["error"], Value::Null, "{}", runs[2]["error"]);
    assert_eq!(runs[2]["result"]["opened"], false);
    assert_eq!(client["state"]["stage"], "declined");
    assert_eq!(client["state"]["account"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_after_drops_the_connection_mid_run() {
    let agent = DemoAgent::spawn(&["--pace", "0", "--fail-after", "7"]);
    let input = json!({"threadId": "t", "runId": "r", "messages": []});
    let response = reqwest::Client::new()
        .post(&agent.url)
        .json(&input)
        .send()
        .await
        .expect("POST /");
    assert_eq!(response.status(), 200);
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    let mut failed = false;
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(bytes) => body.extend_from_slice(&bytes),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(
        failed,
        "the body ends with a transport error, not a clean end"
    );
    let events = common::sse::body_events(&body);
    let want: Vec<Value> = script::run_events(&input).into_iter().take(7).collect();
    assert_eq!(
        events, want,
        "the run's first 7 events, whole, then nothing"
    );

    // Piped into a broker, the 7 events are appended and the run stays open.
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("demo-fail");
    let input = json!({"threadId": thread, "runId": "r", "messages": []});
    let (status, reply) = pipe_run(&agent.url, &base, &thread, &input).await;
    assert_eq!((status, &reply["count"]), (200, &json!(7)), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_json_400_naming_the_field() {
    let agent = DemoAgent::spawn(&["--pace", "0"]);
    let client = reqwest::Client::new();
    for (body, field) in [
        (r#"{"threadId":"t","messages":[]}"#, json!("runId")),
        (
            r#"{"threadId":"t","runId":"r","messages":[{"id":"m","role":"user"}]}"#,
            json!("messages[0].content"),
        ),
        ("not json", Value::Null),
    ] {
        let reply = client
            .post(&agent.url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST /");
        assert_eq!(reply.status(), 400, "{body}");
        assert!(
            reply.headers()["content-type"]
                .to_str()
                .unwrap_or("")
                .starts_with("application/json")
        );
        let error: Value = reply.json().await.expect("a JSON error");
        assert_eq!(error["error"]["code"], "invalid_input", "{body}");
        assert_eq!(error["error"]["field"], field, "{body}: {error}");
    }
}
