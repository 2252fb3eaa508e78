//! HTTP semantics of the router without a socket: [`http::router`] driven with
//! `tower::ServiceExt::oneshot` (status codes, headers and JSON error bodies of PROTOCOL §2 as the
//! README's API section lists them). Streaming and wire-level behaviour are tested on real
//! sockets elsewhere (`fanout_smoke`, `resume`, `conn_front`).

use agui_fanout::config::Config;
use agui_fanout::http::{self, AppState};
use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The router over a memory log, with `config` changed by `f` (no authentication, no CORS).
async fn app_with(f: impl FnOnce(&mut Config)) -> (Router, AppState) {
    let mut config = Config::default();
    f(&mut config);
    let log = agui_fanout::app::build_log(&config)
        .await
        .expect("a memory log");
    let state = agui_fanout::app::state(
        config,
        log,
        CancellationToken::new(),
        agui_fanout::metrics::install(),
    )
    .expect("the default configuration is valid");
    (http::router(state.clone()), state)
}

async fn app() -> Router {
    app_with(|_| {}).await.0
}

async fn send(app: Router, req: Request<Body>) -> (StatusCode, Response<Body>) {
    let resp = app.oneshot(req).await.expect("the router is infallible");
    (resp.status(), resp)
}

async fn body_bytes(resp: Response<Body>) -> Vec<u8> {
    resp.into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes()
        .to_vec()
}

/// The reply's JSON body, asserting `Content-Type: application/json`.
async fn json_body(resp: Response<Body>) -> Value {
    assert_eq!(
        resp.headers()[header::CONTENT_TYPE],
        "application/json",
        "{:?}",
        resp.headers()
    );
    serde_json::from_slice(&body_bytes(resp).await).expect("a JSON body")
}

fn post(path: &str, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut req = Request::post(path);
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    req.body(body.into()).unwrap()
}

fn post_json(thread: &str, body: &Value) -> Request<Body> {
    post(
        &format!("/v1/threads/{thread}/events"),
        Some("application/json"),
        body.to_string(),
    )
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn run_started(thread: &str) -> Value {
    json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"})
}

/// Asserts `{"error":{"code": code, …}}` and returns the error object.
fn error<'a>(body: &'a Value, code: &str) -> &'a Value {
    let e = &body["error"];
    assert_eq!(e["code"], code, "{body}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    e
}

#[tokio::test]
async fn publish_appends_and_answers_count_and_ids() {
    let (status, resp) = send(app().await, post_json("t1", &json!([run_started("t1")]))).await;
    assert_eq!(status, StatusCode::OK);
    let body = json_body(resp).await;
    assert_eq!(body["count"], 1, "{body}");
    assert!(body["firstId"].is_string(), "{body}");
    assert_eq!(body["firstId"], body["lastId"], "{body}");
}

#[tokio::test]
async fn publish_of_bad_json_is_400_invalid_json() {
    let req = post(
        "/v1/threads/t1/events",
        Some("application/json"),
        "{not json",
    );
    let (status, resp) = send(app().await, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    error(&json_body(resp).await, "invalid_json");
}

#[tokio::test]
async fn publish_with_another_content_type_is_415() {
    let body = run_started("t1").to_string();
    for ct in [Some("text/plain"), None] {
        let req = post("/v1/threads/t1/events", ct, body.clone());
        let (status, resp) = send(app().await, req).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}");
        error(&json_body(resp).await, "unsupported_media_type");
    }
}

#[tokio::test]
async fn a_bad_thread_id_is_400_invalid_thread_id() {
    let long = "x".repeat(129);
    for thread in ["a%20b", "a$b", long.as_str(), "%FF"] {
        let (status, resp) = send(app().await, post_json(thread, &run_started("t1"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{thread}");
        error(&json_body(resp).await, "invalid_thread_id");
        let (status, resp) =
            send(app().await, get(&format!("/v1/threads/{thread}/snapshot"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "snapshot {thread}");
        error(&json_body(resp).await, "invalid_thread_id");
    }
}

#[tokio::test]
async fn an_invalid_event_is_400_naming_index_and_field() {
    let batch = json!([
        run_started("t1"),
        {"type": "TEXT_MESSAGE_START", "threadId": "t1", "role": "assistant"},
    ]);
    let (status, resp) = send(app().await, post_json("t1", &batch)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body = json_body(resp).await;
    let e = error(&body, "invalid_event");
    assert_eq!(e["index"], 1, "{body}");
    assert_eq!(e["field"], "messageId", "{body}");
}

#[tokio::test]
async fn an_oversize_body_is_413_too_large() {
    let (app, _state) = app_with(|c| c.limits.max_body_bytes = 1024).await;
    let big = json!({"type": "CUSTOM", "threadId": "t1", "name": "n", "value": "x".repeat(4096)});
    let (status, resp) = send(app.clone(), post_json("t1", &big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    error(&json_body(resp).await, "too_large");
    let (_, resp) = send(app, get("/v1/threads/t1/snapshot")).await;
    let snapshot = json_body(resp).await;
    assert_eq!(
        snapshot["lastEventId"],
        Value::Null,
        "nothing appended: {snapshot}"
    );
}

#[tokio::test]
async fn an_order_violation_is_409_naming_the_rule_and_index() {
    let (app, _state) = app_with(|_| {}).await;
    let batch = json!([
        run_started("t1"),
        {"type": "TEXT_MESSAGE_CONTENT", "threadId": "t1", "messageId": "m1", "delta": "hi"},
    ]);
    let (status, resp) = send(app, post_json("t1", &batch)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let body = json_body(resp).await;
    let e = error(&body, "order_violation");
    assert_eq!(e["index"], 1, "{body}");
    assert!(e["rule"].as_str().is_some_and(|r| !r.is_empty()), "{body}");
}

#[tokio::test]
async fn snapshot_of_a_thread_is_its_fold() {
    let (app, _state) = app_with(|_| {}).await;
    let (status, resp) = send(app.clone(), get("/v1/threads/empty/snapshot")).await;
    assert_eq!(status, StatusCode::OK);
    let body = json_body(resp).await;
    assert_eq!(body["lastEventId"], Value::Null, "{body}");

    let batch = json!([
        run_started("t1"),
        {"type": "STATE_SNAPSHOT", "threadId": "t1", "snapshot": {"n": 1}},
    ]);
    let (status, resp) = send(app.clone(), post_json("t1", &batch)).await;
    assert_eq!(status, StatusCode::OK);
    let last = json_body(resp).await["lastId"].clone();
    let (status, resp) = send(app, get("/v1/threads/t1/snapshot")).await;
    assert_eq!(status, StatusCode::OK);
    let body = json_body(resp).await;
    assert_eq!(body["lastEventId"], last, "{body}");
    assert_eq!(body["state"], json!({"n": 1}), "{body}");
    assert!(body["messages"].is_array(), "{body}");
}

#[tokio::test]
async fn health_and_readiness() {
    let (app, state) = app_with(|_| {}).await;
    let (status, resp) = send(app.clone(), get("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body_bytes(resp).await, b"ok\n");
    let (status, resp) = send(app.clone(), get("/readyz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body_bytes(resp).await, b"ready\n");

    state.draining.store(true, Ordering::Relaxed);
    let (status, resp) = send(app.clone(), get("/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    error(&json_body(resp).await, "draining");
    let (status, _) = send(app, get("/healthz")).await;
    assert_eq!(status, StatusCode::OK, "a draining node is alive");
}

#[tokio::test]
async fn metrics_are_prometheus_text() {
    let app = app().await;
    let (status, _) = send(app.clone(), post_json("t1", &json!([run_started("t1")]))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, resp) = send(app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        resp.headers()[header::CONTENT_TYPE],
        "text/plain; version=0.0.4"
    );
    let text = String::from_utf8(body_bytes(resp).await).expect("UTF-8");
    assert!(
        text.contains("agui_events_published_total"),
        "{}",
        &text[..text.len().min(2000)]
    );
}

#[tokio::test]
async fn unknown_routes_are_404_and_other_methods_405_in_json() {
    // `/v1/threads` and `/v1/threads/{id}` are the admin API's (tests/admin.rs).
    for path in ["/", "/v1/threads/t1/nope", "/v2/x"] {
        let (status, resp) = send(app().await, get(path)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        error(&json_body(resp).await, "not_found");
    }
    for (method, path) in [
        (Method::DELETE, "/v1/threads/t1/events"),
        (Method::PUT, "/v1/threads/t1/events"),
        (Method::POST, "/v1/threads/t1/snapshot"),
        (Method::POST, "/healthz"),
        (Method::POST, "/readyz"),
        (Method::POST, "/metrics"),
        (Method::POST, "/v1/threads"),
        (Method::DELETE, "/v1/threads/t1"),
        (Method::POST, "/v1/connections/1"),
    ] {
        let req = Request::builder()
            .method(method.clone())
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let (status, resp) = send(app().await, req).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        error(&json_body(resp).await, "method_not_allowed");
    }
}
