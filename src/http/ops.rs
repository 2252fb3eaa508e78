//! Operational endpoints: `/healthz`, `/readyz`, `/metrics`, and the JSON 404/405 fallbacks.

use super::{ApiError, AppState};
use crate::metrics as m;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use std::sync::atomic::Ordering;

/// `GET /healthz`: 200 while the process serves requests.
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: 200 only when the log backend answers and the node is not draining.
pub(super) async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    if state.draining.load(Ordering::Relaxed) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "node is draining",
        ));
    }
    match state.log.ping().await {
        Ok(()) => {
            metrics::gauge!(m::BACKEND_UP).set(1.0);
            Ok("ready\n")
        }
        Err(e) => {
            metrics::gauge!(m::BACKEND_UP).set(0.0);
            Err(e.into())
        }
    }
}

/// `GET /metrics`: Prometheus text exposition format 0.0.4.
pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    metrics::gauge!(m::QUEUE_DEPTH).set(crate::queue::pending_events() as f64);
    metrics::gauge!(m::RESETS_PENDING).set(crate::queue::pending_resets() as f64);
    m::collect_process();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

/// Unknown route: 404 as JSON.
pub(super) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// Known route, wrong method: 405 as JSON.
pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
