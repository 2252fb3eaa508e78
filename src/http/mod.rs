//! The HTTP API (SPEC §2): `router()` wires publish, subscribe, health and metrics over a
//! shared [`AppState`]; errors are JSON `{"error":{"code","message","index"?,"field"?}}`.
//!
//! Data path position: the edge. Publish enters the path here (→ `event` → `log`);
//! subscribe leaves it here (`hub` → `queue` → `sse` → response body).

pub mod conn;
mod error;
mod ops;
mod publish;
mod snapshot;
mod subscribe;

pub use error::ApiError;

use crate::config::Config;
use crate::hub::Hub;
use crate::ingest::Ingest;
use crate::log::EventLog;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Everything a request handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Validated configuration.
    pub config: Arc<Config>,
    /// The log backend (readiness, and reads).
    pub log: Arc<dyn EventLog>,
    /// The publish pipeline: order checks, then compare-and-append to the log.
    pub ingest: Ingest,
    /// The fan-out hub (subscribe registers here).
    pub hub: Hub,
    /// Prometheus exporter handle rendered by `/metrics`.
    pub metrics: PrometheusHandle,
    /// Set when the node starts draining: `/readyz` fails and new streams are refused (open
    /// streams are ended by [`Hub::drain_streams`]).
    pub draining: Arc<AtomicBool>,
}

/// The broker's router. Tests can drive it with `tower::ServiceExt::oneshot` without a socket.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/v1/threads/{thread_id}/events",
            get(subscribe::subscribe).post(publish::publish),
        )
        .route("/v1/threads/{thread_id}/snapshot", get(snapshot::snapshot))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        // Bodies are read by the handlers with the configured limits (413 as JSON).
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}
