//! The unmodified `@ag-ui/client` 1.0.0 `HttpAgent` through the run gateway (PROTOCOL §11),
//! `tests/node/gateway-run.mjs`: a full run, a run that ends with an interrupt and the run that
//! resumes it; the client's messages and state equal the thread's fold; a subscriber on
//! another node sharing Redis gets the same events and folds to the same messages (the user's
//! included). A client that aborts mid-run leaves the run to finish in the log.

mod common;

use agui_fanout::app::Server;
use agui_fanout::config::agents::AgentConfig;
use common::agui_client::{self as agui, run_gateway_plan as run_plan};
use common::broker;
use common::broker::snapshot;
use common::upstream::{self, Answer, End, Upstream};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::sync::watch;

/// The scripted bank agent: a resume gets `resume_run`, "open an account" an interrupt, any
/// other message a full run.
async fn bank_agent(gap: Duration) -> Upstream {
    Upstream::start(move |input| {
        let last = input["messages"]
            .as_array()
            .and_then(|m| m.last())
            .map(|m| m["content"].clone())
            .unwrap_or(Value::Null);
        let events = if input.get("resume").is_some() {
            upstream::resume_run(input)
        } else if last == "open an account" {
            upstream::interrupt_run(input)
        } else {
            upstream::full_run(input)
        };
        Answer::Stream {
            events,
            gap,
            end: End::Close,
        }
    })
    .await
}

async fn node_with_agent(url: &str, redis: bool) -> Server {
    let agent = AgentConfig::new(url);
    broker::start(|c| {
        if redis {
            c.redis_url = broker::redis_url();
        }
        c.agents.insert("bank".into(), agent);
    })
    .await
}

fn types(events: &Value) -> Vec<&str> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_runs_through_the_gateway_and_another_node_sees_the_same_thread() {
    let agent = bank_agent(Duration::from_millis(2)).await;
    let a = node_with_agent(&agent.url(), true).await;
    let b = broker::start_redis().await;
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let thread = broker::thread_id("gw-client");

    // A viewer on node B, connected before the first run.
    let (until_tx, until) = watch::channel(None);
    let viewer = agui::subscribe_reader(&base_b, &thread, None, until).await;

    let out = run_plan(json!({
        "url": format!("{base_a}/v1/agents/bank"),
        "threadId": thread,
        "steps": [{"user": "hello"}, {"user": "open an account"}, {"resume": "resolved"}],
    }))
    .await;
    let steps = out["steps"].as_array().unwrap();
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["ok"], true, "step {i}: {step}");
        let t = types(&step["events"]);
        assert_eq!(t.first(), Some(&"RUN_STARTED"), "step {i}");
        assert_eq!(t.last(), Some(&"RUN_FINISHED"), "step {i}");
    }
    assert_eq!(
        steps[1]["pendingInterrupts"].as_array().map(Vec::len),
        Some(1),
        "the interrupt reached the client unchanged"
    );
    assert_eq!(steps[2]["pendingInterrupts"], json!([]));
    let resumed = &agent.got()[2].body;
    assert_eq!(
        resumed["resume"][0]["status"], "resolved",
        "resume[] went upstream"
    );
    assert_eq!(resumed["resume"][0]["payload"], json!({"approved": true}));

    // The client holds what the thread holds, on either node.
    let last = &steps[2];
    let snap_a = snapshot(&base_a, &thread).await;
    assert_eq!(
        last["messages"], snap_a["messages"],
        "messages: client vs fold"
    );
    assert_eq!(last["state"], snap_a["state"], "state: client vs fold");
    let users: Vec<&Value> = snap_a["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .collect();
    assert_eq!(users.len(), 2, "both questions are in the thread");
    let last_id = snap_a["lastEventId"].as_str().unwrap().to_string();
    until_tx.send(Some(last_id.clone())).unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(20), viewer)
        .await
        .expect("the viewer gets the last event")
        .expect("the viewer's task");
    let viewed = agui::run_cases(&[agui::client_case(
        "node B",
        &thread,
        std::slice::from_ref(&seen),
    )]);
    assert!(
        viewed[0].ok,
        "node B's stream passes: {:?}",
        viewed[0].errors
    );
    assert_eq!(
        viewed[0].messages, snap_a["messages"],
        "node B's viewer folds the same"
    );
    assert_eq!(viewed[0].state, snap_a["state"]);
    // The same events, with the same ids, as the caller got them.
    let log = agui::read_log(&base_b, &thread, &last_id).await;
    assert_eq!(
        agui::body_events(&seen),
        agui::body_events(&log),
        "node B's viewer got the log"
    );
    let snap_b = snapshot(&base_b, &thread).await;
    assert_eq!(snap_b["messages"], snap_a["messages"]);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_aborts_mid_run_leaves_the_run_to_finish_in_the_log() {
    let agent = bank_agent(Duration::from_millis(60)).await;
    let server = node_with_agent(&agent.url(), false).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-abort");
    let out = run_plan(json!({
        "url": format!("{base}/v1/agents/bank"),
        "threadId": thread,
        "steps": [{"user": "hello", "abortAfter": 3}],
    }))
    .await;
    let step = &out["steps"][0];
    let got = types(&step["events"]);
    assert!(
        got.len() < 13 && !got.contains(&"RUN_FINISHED"),
        "the client stopped early: {got:?}"
    );
    let mut snap = snapshot(&base, &thread).await;
    for _ in 0..250 {
        if snap["run"]["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        snap = snapshot(&base, &thread).await;
    }
    assert_eq!(snap["run"]["status"], "finished", "the run went on: {snap}");
    assert_eq!(agent.dropped(), 0, "the agent's stream was read to its end");
    let log = agui::read_log(&base, &thread, snap["lastEventId"].as_str().unwrap()).await;
    assert_eq!(agui::body_events(&log).len(), 13);
    server.stop().await;
}
