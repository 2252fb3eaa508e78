//! A scripted AG-UI agent for the run gateway's tests: an axum server on 127.0.0.1:0 that
//! answers each run request (`POST /`, a `RunAgentInput`) as its script says: an AG-UI SSE
//! stream paced event by event, a status, HTML, raw bytes. It records the requests it got and
//! counts the streams its client dropped before they ended (an aborted upstream request).

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the stream does after its last event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The response ends.
    Close,
    /// The response stays open, writing a `: ping` comment every 20 ms (a comment is no event),
    /// until the client goes away.
    Hang,
}

/// How the agent answers one request.
#[derive(Clone, Debug)]
pub enum Answer {
    /// `200 text/event-stream`: each event as one `data:` frame, `gap` apart, then `end`.
    Stream {
        /// The events.
        events: Vec<Value>,
        /// Pause before each event after the first.
        gap: Duration,
        /// After the last.
        end: End,
    },
    /// This status with a short text body.
    Status(u16),
    /// `200 text/html` with a page.
    Html,
    /// `200 text/event-stream` with these bytes, then the end.
    Raw(String),
}

/// A request the agent got.
#[derive(Clone, Debug)]
pub struct Got {
    /// The body.
    pub body: Value,
    /// The headers.
    pub headers: HeaderMap,
}

type Script = Arc<dyn Fn(&Value) -> Answer + Send + Sync>;

#[derive(Clone)]
struct Shared {
    script: Script,
    got: Arc<Mutex<Vec<Got>>>,
    dropped: Arc<AtomicUsize>,
}

/// A running scripted agent; stopped on drop.
pub struct Upstream {
    /// Its address.
    pub addr: SocketAddr,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Starts an agent answering every request with `script(input)`.
    pub async fn start(script: impl Fn(&Value) -> Answer + Send + Sync + 'static) -> Upstream {
        let shared = Shared {
            script: Arc::new(script),
            got: Arc::default(),
            dropped: Arc::default(),
        };
        let app = Router::new()
            .route("/", post(answer))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the scripted agent");
        let addr = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Upstream { addr, shared, task }
    }

    /// Its URL, `http://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The requests it got so far.
    pub fn got(&self) -> Vec<Got> {
        self.shared.got.lock().unwrap().clone()
    }

    /// How many of its streams the client dropped before they ended.
    pub fn dropped(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let input: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    shared.got.lock().unwrap().push(Got {
        body: input.clone(),
        headers,
    });
    match (shared.script)(&input) {
        Answer::Status(code) => (
            StatusCode::from_u16(code).expect("a status"),
            "the agent is broken",
        )
            .into_response(),
        Answer::Html => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            "<!doctype html><title>Sign in</title><p>Please sign in",
        )
            .into_response(),
        Answer::Raw(text) => ([(header::CONTENT_TYPE, "text/event-stream")], text).into_response(),
        Answer::Stream { events, gap, end } => {
            let guard = DropGuard {
                dropped: shared.dropped.clone(),
                done: std::cell::Cell::new(false),
            };
            let state = (events.into_iter().enumerate(), guard);
            let body = futures::stream::unfold(state, move |(mut events, guard)| async move {
                let frame = match events.next() {
                    Some((i, e)) => {
                        if i > 0 {
                            tokio::time::sleep(gap).await;
                        }
                        format!("data: {e}\n\n")
                    }
                    None if end == End::Hang => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        ": ping\n\n".to_string()
                    }
                    None => {
                        guard.done.set(true);
                        return None;
                    }
                };
                Some((Ok::<_, std::convert::Infallible>(frame), (events, guard)))
            });
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from_stream(body),
            )
                .into_response()
        }
    }
}

/// Counts a stream dropped before its end.
struct DropGuard {
    dropped: Arc<AtomicUsize>,
    done: std::cell::Cell<bool>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.done.get() {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `threadId` and `runId` of a run request.
pub fn ids(input: &Value) -> (String, String) {
    (
        input["threadId"].as_str().unwrap_or_default().to_string(),
        input["runId"].as_str().unwrap_or_default().to_string(),
    )
}

/// An agent that sends the first `n` events of [`full_run`] at once, then stays silent with the
/// connection open (a run still going, for cancel, caller-leaving and shutdown cases).
pub fn hang_after(n: usize) -> impl Fn(&Value) -> Answer + Send + Sync + 'static {
    move |input| {
        let mut events = full_run(input);
        events.truncate(n);
        Answer::Stream {
            events,
            gap: Duration::ZERO,
            end: End::Hang,
        }
    }
}

/// A full run answering `input`: streamed text, a tool call with its result, a state
/// snapshot and delta, then `RUN_FINISHED`. Message ids are made from the run id.
pub fn full_run(input: &Value) -> Vec<Value> {
    let (t, r) = ids(input);
    vec![
        json!({"type":"RUN_STARTED","threadId":t,"runId":r}),
        json!({"type":"STATE_SNAPSHOT","snapshot":{"risk":10,"steps":[]}}),
        json!({"type":"TEXT_MESSAGE_START","messageId":format!("{r}-a"),"role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":format!("{r}-a"),"delta":"Checking "}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":format!("{r}-a"),"delta":"your identity."}),
        json!({"type":"TEXT_MESSAGE_END","messageId":format!("{r}-a")}),
        json!({"type":"TOOL_CALL_START","toolCallId":format!("{r}-c"),"toolCallName":"check_id","parentMessageId":format!("{r}-a")}),
        json!({"type":"TOOL_CALL_ARGS","toolCallId":format!("{r}-c"),"delta":"{\"doc\":"}),
        json!({"type":"TOOL_CALL_ARGS","toolCallId":format!("{r}-c"),"delta":"\"passport\"}"}),
        json!({"type":"TOOL_CALL_END","toolCallId":format!("{r}-c")}),
        json!({"type":"TOOL_CALL_RESULT","messageId":format!("{r}-tr"),"toolCallId":format!("{r}-c"),"content":"ok"}),
        json!({"type":"STATE_DELTA","delta":[{"op":"replace","path":"/risk","value":42},{"op":"add","path":"/steps/-","value":"identity"}]}),
        json!({"type":"RUN_FINISHED","threadId":t,"runId":r}),
    ]
}

/// A run that ends asking for approval: `RUN_FINISHED` with an `interrupt` outcome.
pub fn interrupt_run(input: &Value) -> Vec<Value> {
    let (t, r) = ids(input);
    vec![
        json!({"type":"RUN_STARTED","threadId":t,"runId":r}),
        json!({"type":"TEXT_MESSAGE_START","messageId":format!("{r}-a"),"role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":format!("{r}-a"),"delta":"An advisor must approve."}),
        json!({"type":"TEXT_MESSAGE_END","messageId":format!("{r}-a")}),
        json!({"type":"RUN_FINISHED","threadId":t,"runId":r,
               "outcome":{"type":"interrupt","interrupts":[{"id":format!("{r}-i"),"reason":"approval","message":"Approve the account?"}]}}),
    ]
}

/// A run that answers a `resume[]`: it says what it was told.
pub fn resume_run(input: &Value) -> Vec<Value> {
    let (t, r) = ids(input);
    let status = input["resume"][0]["status"]
        .as_str()
        .unwrap_or("none")
        .to_string();
    vec![
        json!({"type":"RUN_STARTED","threadId":t,"runId":r}),
        json!({"type":"TEXT_MESSAGE_START","messageId":format!("{r}-a"),"role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":format!("{r}-a"),"delta":format!("Approval {status}; account opened.")}),
        json!({"type":"TEXT_MESSAGE_END","messageId":format!("{r}-a")}),
        json!({"type":"STATE_DELTA","delta":[{"op":"add","path":"/account","value":"open"}]}),
        json!({"type":"RUN_FINISHED","threadId":t,"runId":r}),
    ]
}
