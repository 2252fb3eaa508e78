//! The run gateway (PROTOCOL §11) over real sockets, against a scripted AG-UI agent
//! (`common::upstream`): a run lands in the thread with its input echo and the caller gets
//! exactly what was appended; each upstream failure ends the run with its `RUN_ERROR` code,
//! keeps what came before, and frees the thread; one run at a time (409) and cancel; a caller
//! that leaves does not stop the run (`continue`) or does (`cancel`); request errors name the
//! field; auth; metrics.

mod common;

use agui_fanout::app::Server;
use agui_fanout::config::Config;
use agui_fanout::config::agents::{AgentConfig, HeaderSource, OnDisconnect};
use common::agui_client::{self as agui, Case};
use common::broker;
use common::broker::snapshot;
use common::sse_client::{self, RawFrame, RawStream};
use common::upstream::{self, Answer, End, Upstream};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};
use std::time::Duration;

/// Longest wait for one frame.
const WAIT: Duration = Duration::from_secs(10);

/// A broker with the agent `agent` at `url`, configured by `f`.
async fn broker_with(url: &str, f: impl FnOnce(&mut Config, &mut AgentConfig)) -> Server {
    let mut agent = AgentConfig::new(url);
    broker::start(|c| {
        f(c, &mut agent);
        c.agents.insert("agent".into(), agent);
    })
    .await
}

/// A `RunAgentInput` as the 1.0 `HttpAgent` sends it, with one user message.
fn input(thread: &str, run: &str, user: &str) -> Value {
    json!({
        "threadId": thread, "runId": run, "protocolVersion": "1.0", "state": {},
        "messages": [{"id": format!("u-{run}"), "role": "user", "content": user}],
        "tools": [], "context": [], "forwardedProps": {}
    })
}

/// `POST {base}/v1/agents/{agent}` with `body`.
async fn post(base: &str, agent: &str, body: &Value, token: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/agents/{agent}"))
        .header("accept", "text/event-stream")
        .json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("run request")
}

/// Runs `body` through the gateway and reads the answer to its end (asserting 200).
async fn run_to_end(base: &str, body: &Value) -> Vec<RawFrame> {
    let resp = post(base, "agent", body, None).await;
    assert_eq!(resp.status(), 200, "run status");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut raw = RawStream::from_response(resp);
    let (frames, rest) = raw.read_to_end(WAIT).await;
    assert!(rest.is_empty(), "the answer ends with whole frames");
    frames.into_iter().filter(|f| f.data.is_some()).collect()
}

fn events(frames: &[RawFrame]) -> Vec<Value> {
    frames
        .iter()
        .map(|f| serde_json::from_str(f.data.as_deref().unwrap()).expect("JSON data"))
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The thread's whole log, as frames.
async fn log_frames(base: &str, thread: &str, last: &str) -> Vec<RawFrame> {
    let body = agui::read_log(base, thread, last).await;
    common::sse::parse_body(body.as_bytes())
        .expect("the log parses")
        .into_iter()
        .filter(|f| f.data.is_some())
        .collect()
}

/// Waits until the thread's current run is no longer running, and returns the snapshot.
async fn wait_ended(base: &str, thread: &str) -> Value {
    for _ in 0..500 {
        let s = snapshot(base, thread).await;
        if s["run"]["status"] != "running" && !s["run"].is_null() {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the run on {thread} did not end");
}

/// The real client judges each answer: it must pass `verifyEvents` on its own.
fn assert_client_accepts(thread: &str, bodies: Vec<(String, Vec<RawFrame>)>) {
    let cases: Vec<Case> = bodies
        .iter()
        .map(|(name, frames)| Case {
            name: name.clone(),
            thread_id: thread.to_string(),
            bodies: vec![
                frames
                    .iter()
                    .map(|f| format!("{}\n\n", f.text))
                    .collect::<String>(),
            ],
        })
        .collect();
    for r in agui::run_cases(&cases) {
        // A run that ends with RUN_ERROR resolves `runAgent()` on the 1.0 client; a stream its
        // verifier refuses rejects it.
        assert!(
            r.ok,
            "{}: the client refuses the answer: {:?}",
            r.name, r.errors
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_lands_in_the_thread_with_its_input_and_the_caller_gets_what_was_appended() {
    // SAFETY of the environment: this test binary sets this variable only here.
    unsafe { std::env::set_var("AGUI_TEST_GATEWAY_KEY", "k-123") };
    let agent = Upstream::start(|i| Answer::Stream {
        events: upstream::full_run(i),
        gap: Duration::ZERO,
        end: End::Close,
    })
    .await;
    let server = broker_with(&agent.url(), |_, a| {
        a.headers.insert(
            "x-api-key".into(),
            HeaderSource::Env("AGUI_TEST_GATEWAY_KEY".into()),
        );
        a.forward_headers = vec!["x-tenant".into()];
    })
    .await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-full");
    let body = input(&thread, "r1", "Open an account for me");

    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/agents/agent"))
        .header("x-tenant", "bank-7")
        .header("x-other", "not forwarded")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (frames, _) = RawStream::from_response(resp).read_to_end(WAIT).await;
    let frames: Vec<RawFrame> = frames.into_iter().filter(|f| f.data.is_some()).collect();
    let got = events(&frames);
    let sent = upstream::full_run(&body);
    assert_eq!(types(&got), types(&sent), "the run's events, in order");
    assert_eq!(
        got[0]["input"]["messages"], body["messages"],
        "the broker echoes the input's new messages on RUN_STARTED"
    );
    assert_eq!(&got[1..], &sent[1..], "the agent's other events as sent");
    assert!(
        frames.iter().all(|f| f.id.is_some()),
        "every frame has its id"
    );

    // What the caller got is the log, byte for byte.
    let last = frames.last().unwrap().id.clone().unwrap();
    let log = log_frames(&base, &thread, &last).await;
    assert_eq!(
        log.iter().map(|f| &f.text).collect::<Vec<_>>(),
        frames.iter().map(|f| &f.text).collect::<Vec<_>>()
    );
    // The thread holds the question with its answer.
    let snap = snapshot(&base, &thread).await;
    assert_eq!(snap["run"]["status"], "finished");
    assert_eq!(
        snap["messages"][0], body["messages"][0],
        "the user's message first"
    );
    assert_eq!(snap["messages"].as_array().unwrap().len(), 3);
    assert_eq!(snap["state"], json!({"risk": 42, "steps": ["identity"]}));
    let metric = |name: &'static str, labels: &'static [(&'static str, &'static str)]| {
        sse_client::metric(&base, name, labels)
    };
    assert!(metric("agui_runs_started_total", &[]).await >= 1.0);
    assert!(metric("agui_runs_ended_total", &[("outcome", "finished")]).await >= 1.0);
    assert!(metric("agui_run_duration_seconds_count", &[]).await >= 1.0);

    // The agent got the input as sent, with its headers.
    let req = &agent.got()[0];
    assert_eq!(req.body, body);
    assert_eq!(req.headers["accept"], "text/event-stream");
    assert_eq!(req.headers["content-type"], "application/json");
    assert_eq!(req.headers["x-api-key"], "k-123");
    assert_eq!(req.headers["x-tenant"], "bank-7");
    assert!(req.headers.get("x-other").is_none());

    // The next run: only the messages the thread lacks are echoed.
    let mut second = input(&thread, "r2", "And a savings account?");
    let mut history: Vec<Value> = snap["messages"].as_array().unwrap().clone();
    history.push(second["messages"][0].clone());
    second["messages"] = Value::Array(history);
    let got = events(&run_to_end(&base, &second).await);
    assert_eq!(
        got[0]["input"]["messages"],
        json!([second["messages"][3]]),
        "only the new message is echoed"
    );
    let snap = snapshot(&base, &thread).await;
    assert_eq!(snap["messages"].as_array().unwrap().len(), 6);
    server.stop().await;
}

/// The scripted failure for a thread named `t-<case>-…`.
fn failing(input: &Value) -> Answer {
    let (t, r) = upstream::ids(input);
    let case = t.split('-').nth(1).unwrap_or_default().to_string();
    if r != "r1" {
        // The run after the failure: a full one.
        return Answer::Stream {
            events: upstream::full_run(input),
            gap: Duration::ZERO,
            end: End::Close,
        };
    }
    let start = json!({"type":"RUN_STARTED","threadId":t,"runId":r});
    let open = json!({"type":"TEXT_MESSAGE_START","messageId":format!("{r}-a"),"role":"assistant"});
    let text =
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":format!("{r}-a"),"delta":"Partial"});
    let stream = |events: Vec<Value>, end| Answer::Stream {
        events,
        gap: Duration::ZERO,
        end,
    };
    match case.as_str() {
        "status" => Answer::Status(500),
        "html" => Answer::Html,
        "invalid" => stream(
            vec![
                start,
                open,
                text,
                json!({"type":"TEXT_MESSAGE_CONTENT","messageId":format!("{r}-a"),"delta":5}),
            ],
            End::Close,
        ),
        "order" => stream(
            vec![
                start,
                open,
                text,
                json!({"type":"TOOL_CALL_ARGS","toolCallId":"never-opened","delta":"{}"}),
            ],
            End::Close,
        ),
        "notsse" => Answer::Raw("data: {not json}\n\n".into()),
        "silent" => stream(vec![start, open, text], End::Hang),
        "broken" => stream(vec![start, open, text], End::Close),
        "otherrun" => stream(
            vec![json!({"type":"RUN_STARTED","threadId":t,"runId":"someone-else"})],
            End::Close,
        ),
        _ => stream(upstream::full_run(input), End::Close),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_upstream_failure_ends_the_run_with_its_code_and_frees_the_thread() {
    let agent = Upstream::start(failing).await;
    // A second agent at a port nothing listens on: connection refused.
    let dead = AgentConfig::new(format!("http://127.0.0.1:{}/", broker::free_port()));
    // And one that is asked for TLS on a plain-HTTP port: the handshake fails.
    let tls = AgentConfig::new(format!("https://{}/", agent.addr));
    let server = broker_with(&agent.url(), |c, a| {
        a.idle_timeout = Duration::from_millis(300);
        c.agents.insert("dead".into(), dead);
        c.agents.insert("tls".into(), tls);
    })
    .await;
    let base = broker::base(server.addr);
    let cases = [
        ("refused", "upstream_unavailable", 0),
        ("tls", "upstream_unavailable", 0),
        ("status", "upstream_status", 0),
        ("html", "upstream_invalid", 0),
        ("notsse", "upstream_invalid", 0),
        ("invalid", "upstream_invalid", 3),
        ("order", "upstream_invalid", 3),
        ("silent", "upstream_timeout", 3),
        ("broken", "upstream_disconnected", 3),
        ("otherrun", "upstream_invalid", 0),
    ];
    let mut answers = Vec::new();
    for (case, code, kept) in cases {
        let name = match case {
            "refused" => "dead",
            "tls" => "tls",
            _ => "agent",
        };
        let thread = broker::thread_id(case);
        let resp = post(&base, name, &input(&thread, "r1", "hi"), None).await;
        assert_eq!(resp.status(), 200, "{case}");
        let (frames, _) = RawStream::from_response(resp).read_to_end(WAIT).await;
        let got: Vec<RawFrame> = frames.into_iter().filter(|f| f.data.is_some()).collect();
        let evs = events(&got);
        let last = evs.last().unwrap();
        assert_eq!(last["type"], "RUN_ERROR", "{case}: {evs:?}");
        assert_eq!(last["code"], code, "{case}: {last}");
        assert!(last["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert_eq!(
            evs[0]["type"], "RUN_STARTED",
            "{case}: a run is always started"
        );
        assert_eq!(
            evs[0]["input"]["messages"][0]["content"], "hi",
            "{case}: the question is in the thread"
        );
        assert_eq!(
            evs.len(),
            kept.max(1) + 1,
            "{case}: what the agent sent first stays: {evs:?}"
        );
        let snap = snapshot(&base, &thread).await;
        assert_eq!(snap["run"]["status"], "errored", "{case}");
        assert_eq!(snap["run"]["error"]["code"], code, "{case}");
        if kept == 3 {
            assert_eq!(snap["messages"][1]["content"], "Partial", "{case}: kept");
        }
        answers.push((case.to_string(), got));
        // The thread takes the next run.
        let next = run_to_end(&base, &input(&thread, "r2", "again")).await;
        assert_eq!(
            events(&next).last().unwrap()["type"],
            "RUN_FINISHED",
            "{case}: the thread takes the next run"
        );
    }
    assert_client_accepts("t", answers);
    for cause in [
        "upstream_unavailable",
        "upstream_status",
        "upstream_invalid",
        "upstream_timeout",
        "upstream_disconnected",
    ] {
        let n = sse_client::metric(&base, "agui_upstream_errors_total", &[("cause", cause)]).await;
        assert!(n >= 1.0, "{cause} counted");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_at_a_time_and_a_cancel_ends_it_and_aborts_the_agent() {
    let agent = Upstream::start(upstream::hang_after(4)).await;
    let server = broker_with(&agent.url(), |_, _| {}).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-cancel");

    let resp = post(&base, "agent", &input(&thread, "r1", "hi"), None).await;
    assert_eq!(resp.status(), 200);
    let mut first = RawStream::from_response(resp);
    for _ in 0..4 {
        first
            .next_event(WAIT)
            .await
            .expect("the run's first events");
    }
    // A second run on the thread is refused, naming the active one.
    let second = post(&base, "agent", &input(&thread, "r2", "hi"), None).await;
    assert_eq!(second.status(), 409);
    let err: Value = second.json().await.unwrap();
    assert_eq!(err["error"]["code"], "run_active");
    assert_eq!(err["error"]["activeRunId"], "r1");
    // So is a publish's RUN_STARTED (the same order rule).
    let publish = sse_client::publish(
        &base,
        &thread,
        &[json!({"type":"RUN_STARTED","threadId":thread,"runId":"direct"})],
    )
    .await;
    assert_eq!(publish.status(), 409);

    let cancel = |run: &str| {
        let url = format!("{base}/v1/threads/{thread}/runs/{run}/cancel");
        async move { reqwest::Client::new().post(url).send().await.unwrap() }
    };
    let wrong = cancel("r2").await;
    assert_eq!(wrong.status(), 409);
    let err: Value = wrong.json().await.unwrap();
    assert_eq!(err["error"]["code"], "run_not_active");
    assert_eq!(err["error"]["activeRunId"], "r1");

    let done = cancel("r1").await;
    assert_eq!(done.status(), 200);
    let done: Value = done.json().await.unwrap();
    let (rest, _) = first.read_to_end(WAIT).await;
    let last = rest
        .iter()
        .rev()
        .find(|f| f.data.is_some())
        .expect("a last event");
    let last_event: Value = serde_json::from_str(last.data.as_deref().unwrap()).unwrap();
    assert_eq!(last_event["type"], "RUN_ERROR");
    assert_eq!(last_event["code"], "cancelled");
    assert_eq!(
        last.id.as_deref(),
        done["lastId"].as_str(),
        "the cancel names it"
    );
    for _ in 0..250 {
        if agent.dropped() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(agent.dropped(), 1, "the agent's request was aborted");
    assert_eq!(
        snapshot(&base, &thread).await["run"]["error"]["code"],
        "cancelled"
    );
    let again = cancel("r1").await;
    assert_eq!(again.status(), 409, "an ended run cannot be cancelled");

    // The thread takes the next run.
    let third = post(&base, "agent", &input(&thread, "r3", "hi"), None).await;
    assert_eq!(third.status(), 200);
    drop(third);

    // A direct producer's run is cancelled the same way.
    let direct = broker::thread_id("gw-direct");
    sse_client::publish_ok(
        &base,
        &direct,
        &[json!({"type":"RUN_STARTED","threadId":direct,"runId":"d1"})],
    )
    .await;
    let url = format!("{base}/v1/threads/{direct}/runs/d1/cancel");
    let resp = reqwest::Client::new().post(url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        snapshot(&base, &direct).await["run"]["error"]["code"],
        "cancelled"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_another_node_ends_the_run_and_aborts_the_agent() {
    let agent = Upstream::start(upstream::hang_after(3)).await;
    let a = broker_with(&agent.url(), |c, _| {
        c.redis_url = broker::redis_url();
        c.redis_block = Duration::from_millis(100);
    })
    .await;
    let b = broker::start(|c| {
        c.redis_url = broker::redis_url();
        c.redis_block = Duration::from_millis(100);
    })
    .await;
    let (base_a, base_b) = (broker::base(a.addr), broker::base(b.addr));
    let thread = broker::thread_id("gw-xcancel");
    let resp = post(&base_a, "agent", &input(&thread, "r1", "hi"), None).await;
    let mut caller = RawStream::from_response(resp);
    for _ in 0..3 {
        caller
            .next_event(WAIT)
            .await
            .expect("the run's first events");
    }
    // Node B has no gateway run: it appends the RUN_ERROR for the thread's active run.
    let url = format!("{base_b}/v1/threads/{thread}/runs/r1/cancel");
    let done = reqwest::Client::new().post(url).send().await.unwrap();
    assert_eq!(done.status(), 200);
    let done: Value = done.json().await.unwrap();
    // Node A's run sees it while its agent is silent: the caller's answer ends with it, and
    // the agent's request is aborted.
    let (rest, _) = caller.read_to_end(WAIT).await;
    let rest: Vec<RawFrame> = rest.into_iter().filter(|f| f.data.is_some()).collect();
    assert_eq!(rest.len(), 1, "only the RUN_ERROR follows: {rest:?}");
    assert_eq!(rest[0].id.as_deref(), done["lastId"].as_str());
    assert_eq!(events(&rest)[0]["code"], "cancelled");
    assert_eq!(
        events(&rest)[0]["metadata"]["agui-fanout"]["runId"],
        "r1",
        "the RUN_ERROR names its run"
    );
    for _ in 0..250 {
        if agent.dropped() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(agent.dropped(), 1, "the agent's request was aborted");
    let next = post(&base_a, "agent", &input(&thread, "r2", "again"), None).await;
    assert_eq!(next.status(), 200, "the thread takes the next run");
    let first = RawStream::from_response(next)
        .next_event(WAIT)
        .await
        .unwrap();
    assert_eq!(events(&[first])[0]["runId"], "r2");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_leaves_does_not_stop_the_run_unless_configured_to() {
    let agent = Upstream::start(|i| Answer::Stream {
        events: upstream::full_run(i),
        gap: Duration::from_millis(40),
        end: End::Close,
    })
    .await;
    let server = broker_with(&agent.url(), |_, _| {}).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-leave");
    let resp = post(&base, "agent", &input(&thread, "r1", "hi"), None).await;
    let mut raw = RawStream::from_response(resp);
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(raw.next_event(WAIT).await.unwrap());
    }
    drop(raw);
    let snap = wait_ended(&base, &thread).await;
    assert_eq!(
        snap["run"]["status"], "finished",
        "the run went on to its end"
    );
    let all = log_frames(&base, &thread, snap["lastEventId"].as_str().unwrap()).await;
    assert_eq!(all.len(), 13, "every event of the run is in the log");
    // A page that comes back with the caller's last id gets the rest exactly.
    let caller_last = seen.last().unwrap().id.clone().unwrap();
    let mut resumed = sse_client::open_raw(&base, &thread, "", Some(&caller_last)).await;
    let mut rest = Vec::new();
    while rest.len() < 10 {
        rest.push(resumed.next_event(WAIT).await.unwrap());
    }
    assert_eq!(
        rest.iter().map(|f| &f.text).collect::<Vec<_>>(),
        all[3..].iter().map(|f| &f.text).collect::<Vec<_>>()
    );

    // Under `on_disconnect = "cancel"` the run ends when its caller leaves.
    let hang = Upstream::start(upstream::hang_after(3)).await;
    // A caller that left is noticed at the next write to it: an event or a heartbeat.
    let cancelling = broker_with(&hang.url(), |c, a| {
        c.sse.heartbeat = Duration::from_millis(100);
        a.on_disconnect = OnDisconnect::Cancel;
    })
    .await;
    let cbase = broker::base(cancelling.addr);
    let thread = broker::thread_id("gw-leave-cancel");
    let resp = post(&cbase, "agent", &input(&thread, "r1", "hi"), None).await;
    let mut raw = RawStream::from_response(resp);
    raw.next_event(WAIT).await.unwrap();
    drop(raw);
    let snap = wait_ended(&cbase, &thread).await;
    assert_eq!(snap["run"]["error"]["code"], "cancelled");
    for _ in 0..250 {
        if hang.dropped() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(hang.dropped(), 1, "the agent's request was aborted");
    server.stop().await;
    cancelling.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_their_field() {
    let agent = Upstream::start(|i| Answer::Stream {
        events: upstream::full_run(i),
        gap: Duration::ZERO,
        end: End::Close,
    })
    .await;
    let server = broker_with(&agent.url(), |_, _| {}).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-bad");
    let error = |resp: reqwest::Response| async move {
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.expect("a JSON error");
        (status, body["error"].clone())
    };

    let (status, e) = error(post(&base, "nobody", &input(&thread, "r1", "hi"), None).await).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("agent_not_found")));
    let mut bad = input(&thread, "r1", "hi");
    bad["messages"][0]["role"] = json!("robot");
    let (status, e) = error(post(&base, "agent", &bad, None).await).await;
    assert_eq!(status, 400);
    assert_eq!(e["code"], "invalid_run_input");
    assert_eq!(e["field"], "messages[0].role");
    let (status, e) = error(post(&base, "agent", &json!({"runId":"r"}), None).await).await;
    assert_eq!((status, e["field"].as_str()), (400, Some("threadId")));
    let (status, e) = error(post(&base, "agent", &input("a b", "r1", "hi"), None).await).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (400, Some("invalid_thread_id"))
    );
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/agents/agent"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    let (status, e) = error(resp).await;
    assert_eq!((status, e["code"].as_str()), (400, Some("invalid_json")));
    assert!(agent.got().is_empty(), "nothing reached the agent");

    // A run id used before on the thread is refused (its events would be taken for retries).
    run_to_end(&base, &input(&thread, "r1", "hi")).await;
    let (status, e) = error(post(&base, "agent", &input(&thread, "r1", "hi"), None).await).await;
    assert_eq!((status, e["code"].as_str()), (409, Some("run_id_used")));
    server.stop().await;
}

const SECRET: &str = "gateway-test-secret-of-a-good-length";

fn token(publish: &[&str]) -> String {
    jsonwebtoken::encode(
        &Header::default(),
        &json!({"agui": {"publish": publish, "subscribe": publish}}),
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("sign a token")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_a_run_needs_a_token_that_may_publish_on_the_thread() {
    let agent = Upstream::start(|i| Answer::Stream {
        events: upstream::full_run(i),
        gap: Duration::ZERO,
        end: End::Close,
    })
    .await;
    let server = broker_with(&agent.url(), |c, _| c.auth.hs256_secret = SECRET.into()).await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-auth");
    let body = input(&thread, "r1", "hi");

    let resp = post(&base, "agent", &body, None).await;
    assert_eq!(resp.status(), 401);
    assert!(resp.headers().contains_key("www-authenticate"));
    let resp = post(&base, "agent", &body, Some(&token(&["someone-else"]))).await;
    assert_eq!(resp.status(), 403);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["field"], "agui.publish");
    let cancel = format!("{base}/v1/threads/{thread}/runs/r1/cancel");
    let resp = reqwest::Client::new().post(&cancel).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert!(agent.got().is_empty(), "nothing reached the agent");

    let resp = post(&base, "agent", &body, Some(&token(&[&thread]))).await;
    assert_eq!(resp.status(), 200);
    let (frames, _) = RawStream::from_response(resp).read_to_end(WAIT).await;
    let evs = events(
        &frames
            .into_iter()
            .filter(|f| f.data.is_some())
            .collect::<Vec<_>>(),
    );
    assert_eq!(evs.last().unwrap()["type"], "RUN_FINISHED");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_ends_its_runs_with_broker_shutdown() {
    let agent = Upstream::start(upstream::hang_after(3)).await;
    let server = broker_with(&agent.url(), |c, _| {
        c.redis_url = broker::redis_url();
    })
    .await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("gw-stop");
    let resp = post(&base, "agent", &input(&thread, "r1", "hi"), None).await;
    let mut caller = RawStream::from_response(resp);
    for _ in 0..3 {
        caller
            .next_event(WAIT)
            .await
            .expect("the run's first events");
    }
    let stopping = tokio::spawn(server.stop());
    let (rest, _) = caller.read_to_end(WAIT).await;
    let rest: Vec<RawFrame> = rest.into_iter().filter(|f| f.data.is_some()).collect();
    assert_eq!(
        events(&rest).last().unwrap()["code"],
        "broker_shutdown",
        "{rest:?}"
    );
    stopping.await.unwrap();
    assert_eq!(agent.dropped(), 1, "the agent's request was aborted");
    // The thread, read through another node, ended with it.
    let other = broker::start_redis().await;
    let snap = snapshot(&broker::base(other.addr), &thread).await;
    assert_eq!(snap["run"]["error"]["code"], "broker_shutdown");
    other.stop().await;
}
