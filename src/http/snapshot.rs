//! `GET /v1/threads/{threadId}/snapshot` (PROTOCOL §2): the thread's fold as JSON,
//! `{"lastEventId","state","messages","run"}` — what a client holds after receiving the
//! thread's events up to `lastEventId` (`null` for a thread with no events).

use super::auth::Action;
use super::publish::{parse_thread, query_token};
use super::{ApiError, AppState};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::http::StatusCode;
use serde_json::Value;

/// The snapshot handler.
///
/// # Errors
/// 400 for a bad thread id; 401/403 without a token allowing `subscribe` on the thread (when
/// authentication is on, PROTOCOL §8); 503 when the log backend does not answer, or when the fold
/// cannot be rebuilt (log trimmed without a checkpoint).
pub(super) async fn snapshot(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let Path(thread) = path?;
    let thread = parse_thread(&thread)?;
    let token = query_token(query.as_deref());
    state.authorize_headers(&headers, token.as_deref(), &thread, Action::Subscribe)?;
    match state.hub.snapshot(&thread).await? {
        Some(v) => Ok(Json(v)),
        None => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "snapshot_unavailable",
            "the thread's log was trimmed and no checkpoint is stored; its fold cannot be rebuilt",
        )),
    }
}
