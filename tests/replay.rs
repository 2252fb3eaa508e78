//! `agui-fanout replay` against a stand-in broker on a real socket: a small axum app that
//! records every publish request and answers from a script. Pacing is exercised but never
//! timed (no timing assertions).

use agui_fanout::cli::replay::{ReplayArgs, ReplayError, run};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// One publish request as the stand-in broker saw it.
#[derive(Debug, Clone)]
struct Received {
    thread: String,
    content_type: Option<String>,
    producer_id: Option<String>,
    producer_seq: Option<String>,
    body: Value,
}

/// How the stand-in broker answers the request numbered `n` (0-based, retries included).
type Script = Box<dyn Fn(usize) -> Option<Response> + Send + Sync>;

#[derive(Clone)]
struct Broker {
    received: Arc<Mutex<Vec<Received>>>,
    script: Arc<Script>,
}

async fn publish(
    State(broker): State<Broker>,
    Path(thread): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let n = {
        let mut received = broker.received.lock().unwrap();
        received.push(Received {
            thread,
            content_type: text("content-type"),
            producer_id: text("x-producer-id"),
            producer_seq: text("x-producer-seq"),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        });
        received.len() - 1
    };
    if let Some(response) = (broker.script)(n) {
        return response;
    }
    let id = format!("0-{n}");
    axum::Json(json!({"count": 1, "firstId": id, "lastId": id})).into_response()
}

/// Starts a stand-in broker on `127.0.0.1:0`; returns its base URL and what it records.
async fn broker(
    script: impl Fn(usize) -> Option<Response> + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<Received>>>) {
    let state = Broker {
        received: Arc::default(),
        script: Arc::new(Box::new(script)),
    };
    let received = state.received.clone();
    let app = Router::new()
        .route("/v1/threads/{thread}/events", post(publish))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), received)
}

/// A recorded run in the shape of the .NET baselines: UTF-8 BOM, pretty-printed array.
fn recording() -> Vec<Value> {
    vec![
        json!({"type": "RUN_STARTED", "threadId": "thread_Id_1", "runId": "run_Id_1",
               "input": {"threadId": "thread_Id_1", "runId": "run_Id_1", "messages": [],
                         "state": {}, "tools": [], "context": [], "forwardedProps": {}}}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant",
               "rawEvent": {"threadId": "thread_Id_1"}}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hello"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "!"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}),
        json!({"type": "RUN_FINISHED", "threadId": "thread_Id_1", "runId": "run_Id_1"}),
    ]
}

fn write_recording(events: &[Value]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(b"\xEF\xBB\xBF").unwrap();
    file.write_all(serde_json::to_string_pretty(events).unwrap().as_bytes())
        .unwrap();
    file
}

fn args(url: &str, file: &tempfile::NamedTempFile, thread: Option<&str>, rate: f64) -> ReplayArgs {
    ReplayArgs {
        url: url.to_string(),
        thread: thread.map(str::to_string),
        file: file.path().to_path_buf(),
        rate,
        token: None,
    }
}

#[tokio::test]
async fn publishes_every_event_in_order_to_the_recorded_thread() {
    let (url, received) = broker(|_| None).await;
    let events = recording();
    let file = write_recording(&events);

    let summary = run(&args(&url, &file, None, 0.0)).await.unwrap();

    assert_eq!(summary.thread, "thread_Id_1");
    assert_eq!(summary.published, events.len());
    assert_eq!(summary.first_id.as_deref(), Some("0-0"));
    assert_eq!(summary.last_id.as_deref(), Some("0-5"));
    let received = received.lock().unwrap().clone();
    let bodies: Vec<Value> = received.iter().map(|r| r.body.clone()).collect();
    assert_eq!(bodies, events, "sent one by one, in order, unchanged");
    let producer = received[0].producer_id.clone();
    assert!(producer.is_some());
    for (i, r) in received.iter().enumerate() {
        assert_eq!(r.thread, "thread_Id_1");
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
        assert_eq!(r.producer_id, producer, "one producer id per run");
        assert_eq!(r.producer_seq, Some((i + 1).to_string()));
    }
}

#[tokio::test]
async fn thread_flag_retargets_the_run_while_paced() {
    let (url, received) = broker(|_| None).await;
    let file = write_recording(&recording());

    // Paced (the interval path), but fast enough not to slow the suite; time is not asserted.
    let summary = run(&args(&url, &file, Some("demo:2"), 500.0))
        .await
        .unwrap();

    assert_eq!(summary.thread, "demo:2");
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 6);
    assert!(received.iter().all(|r| r.thread == "demo:2"));
    assert_eq!(received[0].body["threadId"], "demo:2");
    assert_eq!(received[0].body["input"]["threadId"], "demo:2");
    assert_eq!(received[5].body["threadId"], "demo:2");
    assert_eq!(
        received[1].body["rawEvent"]["threadId"], "thread_Id_1",
        "only threadId fields of the AG-UI event follow the thread"
    );
    let types: Vec<&str> = received
        .iter()
        .map(|r| r.body["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
}

#[tokio::test]
async fn a_400_stops_the_replay_with_the_brokers_error() {
    let (url, received) = broker(|n| {
        (n == 2).then(|| {
            let error = json!({"error": {"code": "invalid_event",
                "message": "delta must be a string", "index": 0, "field": "delta"}});
            (StatusCode::BAD_REQUEST, axum::Json(error)).into_response()
        })
    })
    .await;
    let file = write_recording(&recording());

    let err = run(&args(&url, &file, None, 0.0)).await.unwrap_err();

    match &err {
        ReplayError::Rejected {
            index,
            event_type,
            status,
            body,
        } => {
            assert_eq!(*index, 2);
            assert_eq!(event_type, "TEXT_MESSAGE_CONTENT");
            assert_eq!(*status, StatusCode::BAD_REQUEST);
            assert!(body.contains(r#""code":"invalid_event""#), "{body}");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("400"), "{message}");
    assert!(message.contains("delta must be a string"), "{message}");
    assert_eq!(
        received.lock().unwrap().len(),
        3,
        "nothing sent after the refusal"
    );
}

#[tokio::test]
async fn a_503_is_retried_honouring_retry_after() {
    let (url, received) = broker(|n| {
        // The second event is refused twice, then accepted.
        matches!(n, 1 | 2).then(|| {
            let error = json!({"error": {"code": "backend_unavailable", "message": "redis"}});
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(error)).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, "0".parse().unwrap());
            response
        })
    })
    .await;
    let events = recording();
    let file = write_recording(&events);

    let summary = run(&args(&url, &file, None, 0.0)).await.unwrap();

    assert_eq!(summary.published, events.len());
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), events.len() + 2);
    let seqs: Vec<&str> = received
        .iter()
        .map(|r| r.producer_seq.as_deref().unwrap())
        .collect();
    assert_eq!(
        seqs,
        ["1", "2", "2", "2", "3", "4", "5", "6"],
        "a retry repeats the event's X-Producer-Seq"
    );
    assert_eq!(received[1].body, received[3].body);
}

#[tokio::test]
async fn a_persistent_503_gives_up_after_a_few_attempts() {
    let (url, received) = broker(|_| {
        let mut response = (
            StatusCode::SERVICE_UNAVAILABLE,
            "{\"error\":{\"code\":\"unavailable\"}}",
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, "0".parse().unwrap());
        Some(response)
    })
    .await;
    let file = write_recording(&recording());

    let err = run(&args(&url, &file, None, 0.0)).await.unwrap_err();

    let requests = received.lock().unwrap().len();
    match &err {
        ReplayError::Unavailable {
            index,
            status,
            attempts,
            body,
        } => {
            assert_eq!(*index, 0);
            assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(*attempts > 1);
            assert_eq!(*attempts as usize, requests);
            assert!(body.contains("unavailable"), "{body}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(err.to_string().contains("503"), "{err}");
}

#[tokio::test]
async fn bad_invocations_publish_nothing() {
    let (url, received) = broker(|_| None).await;
    let file = write_recording(&recording());

    let nan = run(&args(&url, &file, None, f64::NAN)).await.unwrap_err();
    assert!(matches!(nan, ReplayError::InvalidRate { .. }), "{nan}");
    let thread = run(&args(&url, &file, Some("no/slash"), 0.0))
        .await
        .unwrap_err();
    assert!(
        matches!(thread, ReplayError::InvalidThread { .. }),
        "{thread}"
    );
    let missing = ReplayArgs {
        file: file.path().with_extension("missing"),
        ..args(&url, &file, None, 0.0)
    };
    let err = run(&missing).await.unwrap_err();
    assert!(matches!(err, ReplayError::Read { .. }), "{err}");
    assert!(received.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_unreachable_broker_is_a_request_error() {
    // Bind then drop a listener: the port is (very likely) closed.
    let addr = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let file = write_recording(&recording());

    let err = run(&args(&format!("http://{addr}"), &file, None, 0.0))
        .await
        .unwrap_err();

    assert!(
        matches!(err, ReplayError::Request { index: 0, .. }),
        "{err}"
    );
}

/// The .NET AG-UI baselines (real producer output, each file starting with a UTF-8 BOM) from
/// the repository's test data (`tests/fixtures/`, `agui_fanout::fixtures_dir()`).
fn dotnet_baselines() -> Vec<std::path::PathBuf> {
    let files = agui_fanout::recorded_responses();
    assert!(
        !files.is_empty(),
        "no recorded runs under {:?}",
        agui_fanout::fixtures_dir()
    );
    files
}

#[tokio::test]
async fn replays_the_recorded_dotnet_baselines() {
    for file in dotnet_baselines() {
        let (url, received) = broker(|_| None).await;
        let raw = std::fs::read(&file).unwrap();
        assert!(raw.starts_with(b"\xEF\xBB\xBF"), "{}", file.display());
        let mut events: Vec<Value> = serde_json::from_slice(&raw[3..]).unwrap();
        let args = ReplayArgs {
            url,
            thread: Some("replayed".into()),
            file: file.clone(),
            rate: 0.0,
            token: None,
        };

        let summary = run(&args).await.unwrap();

        for event in &mut events {
            if event.get("threadId").is_some() {
                event["threadId"] = json!("replayed");
            }
        }
        let received = received.lock().unwrap().clone();
        assert_eq!(summary.published, events.len(), "{}", file.display());
        assert!(received.iter().all(|r| r.thread == "replayed"));
        let bodies: Vec<Value> = received.into_iter().map(|r| r.body).collect();
        assert_eq!(bodies, events, "{}", file.display());
    }
}
