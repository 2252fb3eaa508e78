//! CORS, the Fetch standard's CORS protocol (<https://fetch.spec.whatwg.org/#http-cors-protocol>),
//! for browsers on other origins (SPEC §8): `tower-http`'s `CorsLayer` on the router (preflights
//! and every response hyper serves), and [`stream_headers`], the same response headers for the
//! event streams the connection front writes itself (`http::conn`).
//!
//! Allowed request headers (preflight): `Authorization`, `Content-Type`, `Last-Event-ID`,
//! `X-Producer-Id`, `X-Producer-Seq`; methods `GET` and `POST`. Responses carry
//! `Vary: origin, access-control-request-method, access-control-request-headers` whenever CORS
//! is on, so caches keep answers per origin.

use crate::config::CorsConfig;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// The `Vary` value `tower-http` sets (its default), repeated by the front.
const VARY: &str = "origin, access-control-request-method, access-control-request-headers";

/// The router's CORS layer; `None` when no origin is allowed (CORS off).
pub(crate) fn layer(c: &CorsConfig) -> Option<CorsLayer> {
    if c.allow_origins.is_empty() {
        return None;
    }
    let origin = if c.allow_origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        // Checked at start-up (`Config::validate`): every entry is a valid header value.
        AllowOrigin::list(
            c.allow_origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(origin)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                AUTHORIZATION,
                CONTENT_TYPE,
                HeaderName::from_static("last-event-id"),
                HeaderName::from_static("x-producer-id"),
                HeaderName::from_static("x-producer-seq"),
            ])
            // A browser script may read why a publish was refused or when to retry.
            .expose_headers([RETRY_AFTER, WWW_AUTHENTICATE])
            .allow_credentials(c.allow_credentials)
            .max_age(c.max_age),
    )
}

/// The CORS response headers of a non-preflight response to a request from `origin` (the
/// `Origin` header's value), as [`layer`] sets them: none when CORS is off; else `Vary`, the
/// credentials flag when configured, and `Access-Control-Allow-Origin` when `origin` is
/// allowed (`*` for any).
pub(crate) fn stream_headers(c: &CorsConfig, origin: Option<&[u8]>) -> Vec<(&'static str, String)> {
    if c.allow_origins.is_empty() {
        return Vec::new();
    }
    let mut out = vec![("vary", VARY.to_string())];
    if c.allow_credentials {
        out.push(("access-control-allow-credentials", "true".to_string()));
    }
    if c.allow_origins.iter().any(|o| o == "*") {
        out.push(("access-control-allow-origin", "*".to_string()));
    } else if let Some(origin) = origin.and_then(|o| std::str::from_utf8(o).ok())
        && c.allow_origins.iter().any(|o| o == origin)
    {
        out.push(("access-control-allow-origin", origin.to_string()));
    }
    out.push((
        "access-control-expose-headers",
        "retry-after,www-authenticate".to_string(),
    ));
    out
}
