//! The run gateway (PROTOCOL §11) in front of the built-in demo agent (`agui-fanout
//! demo-agent`, a child process): the unmodified `@ag-ui/client` `HttpAgent` runs the whole
//! onboarding through it (an assessment, an approval that ends with an interrupt, the
//! `resume[]` run that opens the account) while a viewer on another node sharing Redis
//! follows the thread; the demo agent dropping its connection (`--fail-after`) or SIGKILLed
//! mid-run ends the run with `RUN_ERROR` `upstream_disconnected`, which the real client
//! accepts, and the thread takes the next run.

mod common;

use agui_fanout::app::Server;
use agui_fanout::config::agents::AgentConfig;
use common::agui_client::{self as agui, Case, run_gateway_plan as run_plan};
use common::broker;
use common::broker::snapshot;
use common::demo_agent::DemoAgent;
use common::sse_client::{RawFrame, RawStream};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(10);

async fn node(agent_url: &str, redis: bool) -> Server {
    let agent = AgentConfig::new(agent_url);
    broker::start(|c| {
        if redis {
            c.redis_url = broker::redis_url();
        }
        c.agents.insert("demo".into(), agent);
    })
    .await
}

fn input(thread: &str, run: &str) -> Value {
    json!({
        "threadId": thread, "runId": run, "state": {}, "tools": [], "context": [],
        "forwardedProps": {},
        "messages": [{"id": format!("u-{run}"), "role": "user", "content": "Open an account"}]
    })
}

/// Posts a run and reads its answer to the end: the event frames.
async fn run_to_end(base: &str, body: &Value) -> Vec<RawFrame> {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/agents/demo"))
        .json(body)
        .send()
        .await
        .expect("run request");
    assert_eq!(resp.status(), 200);
    let (frames, _) = RawStream::from_response(resp).read_to_end(WAIT).await;
    frames.into_iter().filter(|f| f.data.is_some()).collect()
}

fn events(frames: &[RawFrame]) -> Vec<Value> {
    frames
        .iter()
        .map(|f| serde_json::from_str(f.data.as_deref().unwrap()).unwrap())
        .collect()
}

fn body(frames: &[RawFrame]) -> String {
    frames.iter().map(|f| format!("{}\n\n", f.text)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_runs_the_demo_onboarding_through_the_gateway_seen_from_another_node() {
    let demo = DemoAgent::spawn(&["--pace", "0"]);
    let a = node(&demo.url, true).await;
    let b = broker::start_redis().await;
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let thread = broker::thread_id("gw-demo");
    let (until_tx, until) = watch::channel(None);
    let viewer = agui::subscribe_reader(&base_b, &thread, None, until).await;

    let out = run_plan(json!({
        "url": format!("{base_a}/v1/agents/demo"),
        "threadId": thread,
        "steps": [{"user": "I want to open an account"}, {"user": "Go on"},
                  {"resume": "resolved"}],
    }))
    .await;
    let steps = out["steps"].as_array().unwrap();
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["ok"], true, "step {i}: {}", step["error"]);
        let evs = step["events"].as_array().unwrap();
        assert_eq!(evs.first().unwrap()["type"], "RUN_STARTED", "step {i}");
        assert_eq!(evs.last().unwrap()["type"], "RUN_FINISHED", "step {i}");
    }
    assert_eq!(
        steps[1]["pendingInterrupts"].as_array().map(Vec::len),
        Some(1),
        "the approval run ends with an interrupt the client holds"
    );
    assert_eq!(steps[2]["pendingInterrupts"], json!([]), "resumed");

    let snap = snapshot(&base_a, &thread).await;
    let last = &steps[2];
    assert_eq!(
        last["messages"], snap["messages"],
        "the client's messages are the thread's"
    );
    assert_eq!(
        last["state"], snap["state"],
        "the client's state is the thread's"
    );
    let users = snap["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .count();
    assert_eq!(users, 2, "both of the user's messages are in the thread");

    let last_id = snap["lastEventId"].as_str().unwrap().to_string();
    until_tx.send(Some(last_id)).unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(20), viewer)
        .await
        .expect("the viewer on node B gets the last event")
        .expect("the viewer's task");
    let viewed = agui::run_cases(&[agui::client_case("node B", &thread, &[seen])]);
    assert!(
        viewed[0].ok,
        "node B's stream passes: {:?}",
        viewed[0].errors
    );
    assert_eq!(
        viewed[0].messages, snap["messages"],
        "node B folds the same messages"
    );
    assert_eq!(viewed[0].state, snap["state"]);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_agent_dropping_or_killed_mid_run_ends_the_run_with_upstream_disconnected() {
    // --fail-after: the agent drops its connection after 7 events.
    let failing = DemoAgent::spawn(&["--pace", "0", "--fail-after", "7"]);
    let server = node(&failing.url, false).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-demo-fail");
    let got = run_to_end(&base, &input(&thread, "r1")).await;
    let evs = events(&got);
    assert_eq!(
        evs.len(),
        8,
        "the agent's 7 events, then the broker's: {evs:?}"
    );
    assert_eq!(evs[7]["type"], "RUN_ERROR");
    assert_eq!(evs[7]["code"], "upstream_disconnected");
    let mut answers = vec![("fail-after".to_string(), body(&got))];
    // The thread takes the next run (which fails the same way).
    let next = events(&run_to_end(&base, &input(&thread, "r2")).await);
    assert_eq!(
        (next[0]["type"].as_str(), next[0]["runId"].as_str()),
        (Some("RUN_STARTED"), Some("r2"))
    );
    server.stop().await;

    // SIGKILL mid-run.
    let mut slow = DemoAgent::spawn(&["--pace", "20"]);
    let server = node(&slow.url, false).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-demo-kill");
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/agents/demo"))
        .json(&input(&thread, "r1"))
        .send()
        .await
        .unwrap();
    let mut caller = RawStream::from_response(resp);
    let mut frames = Vec::new();
    for _ in 0..3 {
        frames.push(
            caller
                .next_event(WAIT)
                .await
                .expect("the run's first events"),
        );
    }
    slow.kill();
    let (rest, _) = caller.read_to_end(WAIT).await;
    frames.extend(rest.into_iter().filter(|f| f.data.is_some()));
    let evs = events(&frames);
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "RUN_ERROR", "{evs:?}");
    assert_eq!(last["code"], "upstream_disconnected", "{last}");
    let snap = snapshot(&base, &thread).await;
    assert_eq!(snap["run"]["error"]["code"], "upstream_disconnected");
    let logged = agui::read_log(
        &base,
        &thread,
        frames.last().unwrap().id.as_deref().unwrap(),
    )
    .await;
    assert_eq!(
        agui::body_events(&logged),
        evs,
        "everything the agent sent stays"
    );
    answers.push(("sigkill".to_string(), body(&frames)));
    // The thread takes the next run: the agent is gone, so it fails to connect.
    let next = events(&run_to_end(&base, &input(&thread, "r2")).await);
    assert_eq!(next[0]["runId"], "r2");
    assert_eq!(next.last().unwrap()["code"], "upstream_unavailable");
    server.stop().await;

    // The real client accepts both answers.
    let cases: Vec<Case> = answers
        .into_iter()
        .map(|(name, body)| Case {
            name,
            thread_id: thread.clone(),
            bodies: vec![body],
        })
        .collect();
    for r in agui::run_cases(&cases) {
        assert!(
            r.ok,
            "{}: the client refuses the answer: {:?}",
            r.name, r.errors
        );
    }
}
