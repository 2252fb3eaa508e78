//! `GET /v1/threads/{threadId}/snapshot` (SPEC §2): the thread's fold as JSON,
//! `{"lastEventId","state","messages","run"}` — what a client holds after receiving the
//! thread's events up to `lastEventId` (`null` for a thread with no events).

use super::publish::parse_thread;
use super::{ApiError, AppState};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::Value;

/// The snapshot handler.
///
/// # Errors
/// 400 for a bad thread id; 503 when the log backend does not answer, or when the fold cannot
/// be rebuilt (log trimmed without a checkpoint).
pub async fn snapshot(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(thread) = path?;
    let thread = parse_thread(&thread)?;
    match state.hub.snapshot(&thread).await? {
        Some(v) => Ok(Json(v)),
        None => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "snapshot_unavailable",
            "the thread's log was trimmed and no checkpoint is stored; its fold cannot be rebuilt",
        )),
    }
}
