//! The `Connection: close` a draining node adds to its HTTP/1 answers, as a tower layer.
//!
//! Why not `axum::middleware::from_fn`: it clones the boxed inner service and boxes a future
//! for every request, ~3,000 instructions of a publish (callgrind, `benches/hot_path.rs`,
//! session 12 of `loadtest/REPORT.md`); this layer does neither.

use axum::http::{HeaderValue, Request, Version, header::CONNECTION};
use axum::response::Response;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use tower::{Layer, Service};

/// Adds `Connection: close` to every HTTP/1 answer given while `draining` is set (RFC 9112
/// §9.6), so that a client sends its next request on a new connection (to a ready node)
/// instead of reusing one this node is about to close, where a request would meet the close
/// and get no answer. HTTP/2 has no such header (hyper's graceful shutdown sends `GOAWAY`).
#[derive(Clone)]
pub(super) struct CloseWhileDraining {
    draining: Arc<AtomicBool>,
}

impl CloseWhileDraining {
    /// The layer, reading the node's drain flag.
    pub(super) fn new(draining: Arc<AtomicBool>) -> Self {
        CloseWhileDraining { draining }
    }
}

impl<S> Layer<S> for CloseWhileDraining {
    type Service = CloseWhileDrainingService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CloseWhileDrainingService {
            inner,
            draining: self.draining.clone(),
        }
    }
}

/// The service of [`CloseWhileDraining`].
#[derive(Clone)]
pub(super) struct CloseWhileDrainingService<S> {
    inner: S,
    draining: Arc<AtomicBool>,
}

impl<S, B> Service<Request<B>> for CloseWhileDrainingService<S>
where
    S: Service<Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Answer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let http1 = req.version() < Version::HTTP_2;
        Answer {
            inner: self.inner.call(req),
            draining: http1.then(|| self.draining.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner service's answer, with `Connection: close` added if the node is draining
    /// when it is ready (a long request may outlast the start of the drain).
    pub(super) struct Answer<F> {
        #[pin]
        inner: F,
        // `None` for HTTP/2.
        draining: Option<Arc<AtomicBool>>,
    }
}

impl<F, E> Future for Answer<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = ready!(this.inner.poll(cx))?;
        if this
            .draining
            .as_ref()
            .is_some_and(|d| d.load(Ordering::Relaxed))
        {
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        Poll::Ready(Ok(resp))
    }
}
