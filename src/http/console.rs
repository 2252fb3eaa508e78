//! The operator console (PROTOCOL §12): static files from `console/assets/`, embedded in the
//! binary, served at `/console/` when `console.enabled` says so (by default on a loopback
//! `listen`). The pages hold no data: everything they show comes from the admin API, the event
//! streams and the gateway, each checked as usual (with authentication on, the page asks for
//! an admin token and sends it with every call).
//!
//! Nothing is fetched from elsewhere at run time: the client package (`clients/js`) comes as
//! `fanout-client.js`, a bundle built by `npm run build --prefix console` and committed, and
//! the `Content-Security-Policy` lets the pages load and call only this origin.

use super::AppState;
use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// The console's files: name, content type, bytes.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../console/assets/index.html"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/assets/console.js"),
    ),
    (
        "operator.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/assets/operator.js"),
    ),
    (
        "customer.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/assets/customer.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../../console/assets/console.css"),
    ),
    (
        "fanout-client.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/assets/fanout-client.js"),
    ),
];

/// Only this origin, for scripts, styles and calls; no framing (the console has controls).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `router` with the console's routes: `/console` (redirects to `/console/`), `/console/`
/// (the page) and `/console/{file}`.
pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    router
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(|| async { file("index.html") }))
        .route(
            "/console/{file}",
            get(|Path(name): Path<String>| async move { file(&name) }),
        )
}

/// One embedded file with its headers; 404 `not_found` (JSON) for any other name.
fn file(name: &str) -> Response {
    let Some((_, content_type, body)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return super::ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such console file")
            .into_response();
    };
    let mut resp = (*body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Served from the binary: a new broker may serve new files under the same names.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}
