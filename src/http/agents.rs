//! The run gateway's endpoints (PROTOCOL §11): `POST /v1/agents/{name}`, an AG-UI endpoint an
//! unmodified `HttpAgent` runs against (a `RunAgentInput` in, the run's events as appended to
//! the thread out, as `text/event-stream`), and `POST /v1/threads/{threadId}/runs/{runId}/cancel`.

use super::auth::Action;
use super::publish::{parse_thread, query_token};
use super::{ApiError, AppState};
use crate::gateway::{CancelError, First, RunInput, RunStream, StartError};
use crate::sse;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `POST /v1/agents/{name}`: checks the request (agent, body, token, the thread's run), starts
/// the run, and answers with its events once the first is appended.
///
/// # Errors
/// 404 `agent_not_found`; 400 `invalid_json`, `invalid_run_input` or `invalid_thread_id`
/// naming the member; 413 for a body over `limits.max_body_bytes`; 401/403 without a token
/// allowing `publish` on the thread; 409 `run_active` (with `activeRunId`) or `run_id_used`;
/// 503 `draining` or `backend_unavailable`.
pub(super) async fn run(
    State(state): State<AppState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Some(agent) = state.gateway.agent(&name) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "agent_not_found",
            format!("no agent is configured as {name:?} ([agents.<name>])"),
        )
        .field(Some("name".into())));
    };
    if state.draining.load(Ordering::Relaxed) {
        return Err(draining());
    }
    // Held (with its share of the node's body budget) until the input is parsed.
    let held = super::body::read_whole(body, &headers, &state.config.limits, &state.bodies).await?;
    let input = RunInput::parse(&held.bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.code, e.message).field(e.field))?;
    let token = query_token(query.as_deref());
    state.authorize_headers(&headers, token.as_deref(), &input.thread, Action::Publish)?;
    let mut stream = state
        .gateway
        .start(agent, input, headers)
        .await
        .map_err(start_error)?;
    match stream.first().await {
        First::Started(frame) => Ok(event_stream(frame, stream, state.config.sse.heartbeat)),
        First::Refused(active) => Err(run_active(active)),
        First::Abandoned => Err(ApiError::unavailable(
            "the run could not be appended to the thread",
        )),
    }
}

/// `POST /v1/threads/{threadId}/runs/{runId}/cancel`: ends the thread's active run with
/// `RUN_ERROR` `{"code":"cancelled"}` and answers `{"threadId","runId","lastId"}` (the
/// `RUN_ERROR`'s id).
///
/// # Errors
/// 400 for a bad thread or run id; 401/403 without a token allowing `publish` on the thread;
/// 409 `run_not_active` (with `activeRunId`); 503 when the log backend fails.
pub(super) async fn cancel(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let Path((thread, run_id)) = path?;
    let thread = parse_thread(&thread)?;
    let token = query_token(query.as_deref());
    state.authorize_headers(&headers, token.as_deref(), &thread, Action::Publish)?;
    match state.gateway.cancel(&thread, &run_id).await {
        Ok(id) => Ok(Json(json!({
            "threadId": thread.as_str(),
            "runId": run_id,
            "lastId": id.to_string(),
        }))),
        Err(CancelError::NotActive { run_id, active }) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "run_not_active",
            format!("run {run_id:?} is not the thread's active run"),
        )
        .field(Some("runId".into()))
        .with("activeRunId", json!(active))),
        Err(CancelError::Log(e)) => Err(e.into()),
    }
}

fn draining() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "draining",
        "the node is shutting down; run through another node",
    )
    .retry_after(1)
}

fn run_active(active: Option<String>) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "run_active",
        match &active {
            Some(id) => format!("the thread has an active run ({id}); one run at a time"),
            None => "the thread has an active run; one run at a time".into(),
        },
    )
    .field(Some("threadId".into()))
    .with("activeRunId", json!(active))
}

fn start_error(e: StartError) -> ApiError {
    match e {
        StartError::RunActive { run_id, .. } => run_active(Some(run_id)),
        e @ StartError::RunIdUsed(_) => {
            ApiError::new(StatusCode::CONFLICT, "run_id_used", e.to_string())
                .field(Some("runId".into()))
        }
        StartError::Log(e) => e.into(),
    }
}

/// `200 text/event-stream`: `first`, then the run's frames as they come, a heartbeat comment
/// after `heartbeat` of silence (an agent thinking), and the end of the body after the run's
/// terminal event. No `retry:`: the AG-UI binding has no reconnection (AGUI.md §3).
fn event_stream(first: Bytes, stream: RunStream, heartbeat: Duration) -> Response {
    let rest = futures::stream::unfold(stream, move |mut stream| async move {
        let frame = match tokio::time::timeout(heartbeat, stream.next_frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(_) => Bytes::from_static(sse::HEARTBEAT),
        };
        Some((Ok::<_, std::convert::Infallible>(frame), stream))
    });
    let body = futures::stream::once(async move { Ok(first) }).chain(rest);
    let mut response = Body::from_stream(body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}
