//! The HTTP API (PROTOCOL §2): `router()` wires publish, subscribe, snapshot, the run gateway
//! (§11), the admin API and the console (§12), health and metrics over a shared
//! [`AppState`]; errors are JSON `{"error":{"code","message","index"?,"field"?}}`.
//!
//! Data path position: the edge. Publish enters the path here (→ `event` → `ingest` →
//! `log`); subscribe leaves it here (`hub` → `queue` → `stream`, whose writers write the
//! bytes `sse` encodes).

mod accept;
pub mod admin;
mod agents;
pub mod auth;
mod body;
pub mod conn;
mod console;
pub mod cors;
mod draining;
mod error;
mod head;
mod ingest_sse;
mod liveness;
mod ops;
mod publish;
mod publish_front;
mod snapshot;
mod subscribe;

pub use body::BodyBudget;
pub use error::ApiError;

use crate::config::Config;
use crate::event::ThreadId;
use crate::gateway::Gateway;
use crate::hub::Hub;
use crate::ingest::Ingest;
use crate::log::EventLog;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::routing::{delete, get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use tokio_util::sync::CancellationToken;

/// Everything a request handler needs ([`AppShared`]), behind one `Arc`: a clone (every
/// request's router and extractors make a few, every connection's task holds one) is one
/// reference count, where a copy of the fields took ~1,100 instructions (callgrind, session 12
/// of `loadtest/REPORT.md`) and ~100 bytes of each idle connection.
#[derive(Clone)]
pub struct AppState(Arc<AppShared>);

impl AppState {
    /// Shares `parts` with every handler.
    pub fn new(parts: AppShared) -> AppState {
        AppState(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppShared;
    fn deref(&self) -> &AppShared {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct AppShared {
    /// Validated configuration.
    pub config: Arc<Config>,
    /// The log backend (readiness, and reads).
    pub log: Arc<dyn EventLog>,
    /// The publish pipeline: order checks, then compare-and-append to the log.
    pub ingest: Ingest,
    /// The fan-out hub (subscribe registers here).
    pub hub: Hub,
    /// The run gateway (`POST /v1/agents/{name}`, run cancel; PROTOCOL §11).
    pub gateway: Gateway,
    /// Prometheus exporter handle rendered by `/metrics`.
    pub metrics: PrometheusHandle,
    /// Set when the node starts draining: `/readyz` fails, a subscribe is told to reconnect
    /// (a short `retry:` and an immediate end), every answer over HTTP/1 carries
    /// `Connection: close` (open streams are ended by [`Hub::drain_streams`]).
    pub draining: Arc<AtomicBool>,
    /// Cancelled when the drain period is over and the node stops accepting connections: an
    /// SSE ingest still running stops reading and answers with what it appended (PROTOCOL §9).
    pub drain_ended: CancellationToken,
    /// The token verifier (PROTOCOL §8); `None`: authentication off.
    pub auth: Option<Arc<auth::Auth>>,
    /// The CORS layer ([`cors::layer`]); `None`: CORS off.
    pub cors: Option<Arc<tower_http::cors::CorsLayer>>,
    /// The node's budget for request bodies read whole (`limits.bodies_in_flight_bytes`).
    pub bodies: BodyBudget,
    /// This node's open event streams, for the admin API (PROTOCOL §12).
    pub connections: admin::connections::Connections,
}

impl AppState {
    /// Checks the request's token for `action` on `thread` (PROTOCOL §8); `Ok(None)` when
    /// authentication is off.
    ///
    /// # Errors
    /// 401 `unauthorized`, 403 `forbidden` (see [`auth::Auth::check`]).
    pub(crate) fn authorize(
        &self,
        credentials: auth::Credentials<'_>,
        thread: &ThreadId,
        action: auth::Action,
    ) -> Result<Option<auth::Granted>, ApiError> {
        match &self.auth {
            None => Ok(None),
            Some(a) => a.check(credentials, thread, action).map(Some),
        }
    }

    /// [`AppState::authorize`] for a request seen through hyper: `Authorization` and every
    /// `Cookie` of `headers`, and the query's `access_token`.
    pub(crate) fn authorize_headers(
        &self,
        headers: &HeaderMap,
        query_token: Option<&str>,
        thread: &ThreadId,
        action: auth::Action,
    ) -> Result<Option<auth::Granted>, ApiError> {
        if self.auth.is_none() {
            return Ok(None);
        }
        let cookies: Vec<&[u8]> = headers
            .get_all(COOKIE)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        let credentials = auth::Credentials {
            authorization: headers.get(AUTHORIZATION).map(|v| v.as_bytes()),
            query_token,
            cookies: &cookies,
        };
        self.authorize(credentials, thread, action)
    }
}

impl AppState {
    /// Checks that the request's token carries the admin claim (PROTOCOL §12): its
    /// `Authorization`, every `Cookie` of `headers`, or the query's `access_token`. Nothing to
    /// check when authentication is off.
    ///
    /// # Errors
    /// 401 `unauthorized`, 403 `forbidden` (see [`auth::Auth::check_admin`]).
    pub(crate) fn authorize_admin(
        &self,
        headers: &HeaderMap,
        query_token: Option<&str>,
    ) -> Result<(), ApiError> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let cookies: Vec<&[u8]> = headers
            .get_all(COOKIE)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        let credentials = auth::Credentials {
            authorization: headers.get(AUTHORIZATION).map(|v| v.as_bytes()),
            query_token,
            cookies: &cookies,
        };
        auth.check_admin(credentials).map(|_| ())
    }
}

/// The broker's router. Tests can drive it with `tower::ServiceExt::oneshot` without a socket.
pub fn router(state: AppState) -> Router {
    let router = Router::new();
    let router = if state.config.console_enabled() {
        console::routes(router)
    } else {
        router
    };
    let router = router
        .route(
            "/v1/threads/{thread_id}/events",
            get(subscribe::subscribe).post(publish::publish),
        )
        .route("/v1/threads/{thread_id}/snapshot", get(snapshot::snapshot))
        .route("/v1/threads", get(admin::threads))
        .route("/v1/threads/{thread_id}", get(admin::thread))
        .route("/v1/connections", get(admin::connections))
        .route("/v1/connections/{id}", delete(admin::close))
        .route("/v1/agents/{name}", post(agents::run))
        .route(
            "/v1/threads/{thread_id}/runs/{run_id}/cancel",
            post(agents::cancel),
        )
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        // Bodies are read by the handlers with the configured limits (413 as JSON).
        .layer(DefaultBodyLimit::disable())
        .layer(draining::CloseWhileDraining::new(state.draining.clone()));
    let router = match state.cors.as_deref() {
        Some(cors) => router.layer(cors.clone()),
        None => router,
    };
    router.with_state(state)
}
