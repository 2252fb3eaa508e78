//! A real producer no one here wrote the wire format of: `examples/python-agent/` (the official
//! Python SDK `ag-ui-protocol` and its `EventEncoder`, FastAPI + uvicorn, pinned in its
//! `requirements.txt`), installed in a virtualenv and run as a server. Its SSE answer is
//! published through the broker's SSE ingest with order validation on: every event is
//! accepted, and the real `@ag-ui/client` folds the broker's log, and a prelude built from the
//! broker's fold, to exactly what it folds from the agent's own stream.
//!
//! The virtualenv lives under the target directory (`CARGO_TARGET_TMPDIR`) and is reinstalled
//! only when `requirements.txt` changes. Needs `python3` with `venv` (Debian: `python3-venv`;
//! `scripts/test.sh` installs it) and PyPI for the first install.
//!
//! The gateway (PROTOCOL §11) runs the same agent as an upstream of `POST /v1/agents/{name}`.

mod common;

use common::agui_client::{self as agui, Case};
use common::{broker, sse_client};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python-agent")
}

/// The example's virtualenv with its requirements installed; returns its `python`.
fn virtualenv() -> PathBuf {
    // The tests of this file run in parallel threads and share one virtualenv: one creates
    // it while the others wait (two `venv --clear` at once on one directory fail).
    static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _creating = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-agent-venv");
    let python = venv.join("bin/python");
    let requirements = std::fs::read_to_string(example_dir().join("requirements.txt"))
        .expect("examples/python-agent/requirements.txt");
    let stamp = venv.join("requirements.installed");
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&requirements) {
        return python;
    }
    let created = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .unwrap_or_else(|e| panic!("cannot run python3 (install python3 and python3-venv): {e}"));
    assert!(
        created.success(),
        "python3 -m venv failed (Debian: apt-get install python3-venv; scripts/test.sh does it)"
    );
    let installed = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(example_dir().join("requirements.txt"))
        .status()
        .expect("run pip");
    assert!(
        installed.success(),
        "pip install -r requirements.txt failed"
    );
    std::fs::write(&stamp, requirements).expect("write the install stamp");
    python
}

/// The agent server; killed on drop.
struct PythonAgent {
    child: Child,
    url: String,
}

impl PythonAgent {
    async fn start() -> PythonAgent {
        let python = virtualenv();
        let port = broker::free_port();
        let child = Command::new(python)
            .arg(example_dir().join("agent.py"))
            .args(["--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start agent.py");
        let agent = PythonAgent {
            child,
            url: format!("http://127.0.0.1:{port}/"),
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return agent;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("agent.py did not listen on port {port} within 10 s");
    }
}

impl Drop for PythonAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_agent_is_accepted_whole_and_folds_right() {
    let agent = PythonAgent::start().await;
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("python");
    let client = reqwest::Client::new();

    let mut bodies = Vec::new();
    for (run, question) in [("r1", "convert 250 GBP to EUR"), ("r2", "and 40 USD?")] {
        let input = json!({
            "threadId": thread, "runId": run, "state": {}, "tools": [], "context": [],
            "forwardedProps": {},
            "messages": [{"id": format!("{run}-user"), "role": "user", "content": question}]
        });
        let answer = client
            .post(&agent.url)
            .header("accept", "text/event-stream")
            .json(&input)
            .send()
            .await
            .expect("POST to agent.py");
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.headers()["content-type"],
            "text/event-stream; charset=utf-8"
        );
        let body = answer.text().await.expect("the agent's answer");
        let events = agui::body_events(&body);
        let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        for kind in [
            "TEXT_MESSAGE_CONTENT",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_RESULT",
            "STATE_DELTA",
        ] {
            assert!(types.contains(&kind), "no {kind} in {body}");
        }

        let reply = client
            .post(format!("{base}/v1/threads/{thread}/events"))
            .header("content-type", "text/event-stream")
            .body(body.clone())
            .send()
            .await
            .expect("publish");
        let status = reply.status();
        let reply: Value = reply.json().await.expect("a JSON reply");
        assert_eq!(status, 200, "{reply}");
        assert_eq!(
            reply["count"],
            events.len(),
            "every event appended: {reply}"
        );
        bodies.push(body);
    }

    let snapshot: Value = client
        .get(format!("{base}/v1/threads/{thread}/snapshot"))
        .send()
        .await
        .expect("snapshot")
        .json()
        .await
        .expect("snapshot JSON");
    let last = snapshot["lastEventId"].as_str().expect("an event id");
    // "and 40 USD?": USD to EUR, the second run's conversion.
    assert_eq!(snapshot["state"]["lastConversion"]["to"], "EUR");
    let log = agui::read_log(&base, &thread, last).await;
    let mut fresh = sse_client::open_raw(&base, &thread, "", None).await;
    let prelude = agui::read_until(&mut fresh, last).await;
    drop(fresh);

    let results = agui::run_cases(&[
        Case {
            name: "the agent's own streams".into(),
            thread_id: thread.clone(),
            bodies,
        },
        Case {
            name: "the broker's log".into(),
            thread_id: thread.clone(),
            bodies: vec![log],
        },
        Case {
            name: "a prelude from the broker's fold".into(),
            thread_id: thread.clone(),
            bodies: vec![prelude],
        },
    ]);
    for r in &results {
        assert!(r.ok, "{}: {:?}", r.name, r.error);
        assert_eq!(r.warnings, Vec::<String>::new(), "{}", r.name);
    }
    assert_eq!(
        results[0].messages.as_array().map(Vec::len),
        Some(6),
        "two runs of intro (with its tool call), tool result and answer"
    );
    for r in &results[1..] {
        assert_eq!(agui::fold_diff(r, &results[0]), None, "{}", r.name);
    }
}

/// The same agent as an upstream of the run gateway (PROTOCOL §11): each run's answer through
/// `POST /v1/agents/python` is accepted by the real client, and folds to what the broker's log
/// folds to, the user's questions included (the broker's input echo).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_agent_runs_through_the_gateway() {
    let agent = PythonAgent::start().await;
    let upstream = agui_fanout::config::agents::AgentConfig::new(agent.url.clone());
    let server = broker::start(|c| {
        c.agents.insert("python".into(), upstream);
    })
    .await;
    let base = broker::base(server.addr);
    let thread = broker::thread_id("python-gw");
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for (run, question) in [("r1", "convert 250 GBP to EUR"), ("r2", "and 40 USD?")] {
        let input = json!({
            "threadId": thread, "runId": run, "state": {}, "tools": [], "context": [],
            "forwardedProps": {},
            "messages": [{"id": format!("{run}-user"), "role": "user", "content": question}]
        });
        let answer = client
            .post(format!("{base}/v1/agents/python"))
            .json(&input)
            .send()
            .await
            .expect("a gateway run");
        assert_eq!(answer.status(), 200);
        let body = answer.text().await.expect("the run's answer");
        let events = agui::body_events(&body);
        assert_eq!(
            events.first().map(|e| &e["type"]),
            Some(&json!("RUN_STARTED"))
        );
        assert_eq!(
            events.last().map(|e| &e["type"]),
            Some(&json!("RUN_FINISHED")),
            "{body}"
        );
        answers.push(body);
    }
    let snapshot: Value = client
        .get(format!("{base}/v1/threads/{thread}/snapshot"))
        .send()
        .await
        .expect("snapshot")
        .json()
        .await
        .expect("snapshot JSON");
    let last = snapshot["lastEventId"].as_str().expect("an event id");
    let log = agui::read_log(&base, &thread, last).await;
    let results = agui::run_cases(&[
        Case {
            name: "the gateway's answers".into(),
            thread_id: thread.clone(),
            bodies: answers,
        },
        Case {
            name: "the broker's log".into(),
            thread_id: thread.clone(),
            bodies: vec![log],
        },
    ]);
    for r in &results {
        assert!(r.ok, "{}: {:?}", r.name, r.error);
        assert_eq!(r.warnings, Vec::<String>::new(), "{}", r.name);
    }
    assert_eq!(agui::fold_diff(&results[1], &results[0]), None);
    assert_eq!(results[1].messages, snapshot["messages"]);
    let users = snapshot["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .count();
    assert_eq!(users, 2, "both questions are in the thread");
    server.stop().await;
}
