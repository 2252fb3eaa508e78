//! CORS, the Fetch standard's CORS protocol (<https://fetch.spec.whatwg.org/#http-cors-protocol>),
//! for browsers on other origins (PROTOCOL §8): `tower-http`'s `CorsLayer` on the router
//! (preflights and every response hyper serves), and [`stream_headers`], which asks that same
//! layer for the headers of the event streams the connection front writes itself
//! (`http::conn`), so both paths answer alike.
//!
//! Allowed request headers (preflight): `Authorization`, `Content-Type`, `Last-Event-ID`,
//! `X-Producer-Id`, `X-Producer-Seq`; methods `GET` and `POST`. Responses carry
//! `Vary: origin, access-control-request-method, access-control-request-headers` whenever CORS
//! is on, so caches keep answers per origin.

use crate::config::CorsConfig;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, ORIGIN, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use std::convert::Infallible;
use tower::{Layer, ServiceExt, service_fn};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// The router's CORS layer; `None` when no origin is allowed (CORS off).
pub fn layer(c: &CorsConfig) -> Option<CorsLayer> {
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

/// The CORS headers `layer` gives a `GET` from `origin` (the `Origin` header's raw value):
/// none without a layer. Run once per stream the front opens, not per event.
pub(crate) async fn stream_headers(layer: Option<&CorsLayer>, origin: Option<&[u8]>) -> HeaderMap {
    let Some(layer) = layer else {
        return HeaderMap::new();
    };
    let mut req = Request::new(());
    if let Some(origin) = origin.and_then(|o| HeaderValue::from_bytes(o).ok()) {
        req.headers_mut().insert(ORIGIN, origin);
    }
    let empty = service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
    match layer.clone().layer(empty).oneshot(req).await {
        Ok(resp) => resp.into_parts().0.headers,
        Err(never) => match never {},
    }
}
