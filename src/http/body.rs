//! Request bodies read whole (JSON and NDJSON publishes): bounded in size
//! (`limits.max_body_bytes`, 413 `too_large`), in time (`limits.body_timeout`, 408
//! `body_timeout`) and, across every connection of the node, in memory
//! (`limits.bodies_in_flight_bytes`, 503 `busy` with `Retry-After`).
//!
//! Why a budget as well as a size limit: the size limit bounds one body, not how many are
//! read at once; twenty connections each sending 15 MiB and never finishing held 400 MB. The
//! budget is taken as bytes arrive (or at once for a declared `Content-Length`) and given back
//! when the handler drops the [`HeldBody`]; the time limit makes a body that trickles in, or
//! never ends, give its share back within `limits.body_timeout`.

use super::ApiError;
use crate::config::LimitsConfig;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The node's budget for request bodies in flight, in bytes (`limits.bodies_in_flight_bytes`).
/// Cheap to clone (one `Arc`).
#[derive(Clone, Debug)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
}

impl BodyBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Self {
        BodyBudget {
            bytes: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// Bytes of the budget not taken now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// Takes `n` more bytes of the budget, without waiting.
    ///
    /// # Errors
    /// 503 `busy` with `Retry-After: 1` when they are not free.
    fn take(&self, n: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        u32::try_from(n)
            .ok()
            .and_then(|n| self.bytes.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    "the node is reading as many request bytes as it may hold \
                     (limits.bodies_in_flight_bytes); retry",
                )
                .retry_after(1)
            })
    }
}

/// A body read whole, holding its share of the [`BodyBudget`] until dropped.
#[derive(Debug)]
pub(crate) struct HeldBody {
    /// The body.
    pub bytes: Bytes,
    /// The budget taken for it (its buffer's capacity).
    _held: OwnedSemaphorePermit,
}

/// 413 `too_large`: `what` exceeds `limit` bytes.
pub(super) fn too_large(what: &str, limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("{what} exceeds the limit of {limit} bytes"),
    )
}

/// Reads `body` whole. A declared `Content-Length` (in `headers`) over the size limit is
/// refused before anything is read, and its bytes are taken from `budget` at once; a body
/// without one takes the budget as its buffer grows. Everything must arrive within
/// `limits.body_timeout` of the call.
///
/// # Errors
/// 413 `too_large`; 503 `busy` (budget exhausted, `Retry-After: 1`); 408 `body_timeout`;
/// 400 `body_error` when the connection fails.
pub(crate) async fn read_whole(
    body: Body,
    headers: &HeaderMap,
    limits: &LimitsConfig,
    budget: &BodyBudget,
) -> Result<HeldBody, ApiError> {
    let max = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large("the request body", max));
    }
    // Bounded by `max` just above.
    let declared = declared.unwrap_or(0) as usize;
    let mut held = budget.take(declared)?;
    let read = async {
        let mut buf: Vec<u8> = Vec::with_capacity(declared);
        let mut frames = body.into_data_stream();
        while let Some(chunk) = frames.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "body_error",
                    format!("could not read the body: {e}"),
                )
            })?;
            let len = buf.len() + chunk.len();
            if len > max {
                return Err(too_large("the request body", max));
            }
            if len > buf.capacity() {
                // Grow by doubling (capped by the limit), taking the budget for the whole
                // new capacity before allocating it.
                let cap = len.max(buf.capacity() * 2).min(max);
                held.merge(budget.take(cap - held.num_permits())?);
                buf.reserve_exact(cap - buf.len());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    };
    let bytes = tokio::time::timeout(limits.body_timeout, read)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive whole within {} (limits.body_timeout)",
                    humantime::format_duration(limits.body_timeout)
                ),
            )
        })??;
    Ok(HeldBody { bytes, _held: held })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> LimitsConfig {
        LimitsConfig {
            max_body_bytes: 1000,
            body_timeout: Duration::from_secs(30),
            ..LimitsConfig::default()
        }
    }

    fn declared(n: usize) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, n.into());
        h
    }

    /// A body that sends `first` and then nothing, ever.
    fn endless(first: &'static [u8]) -> Body {
        let chunks = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(first))])
            .chain(futures::stream::pending());
        Body::from_stream(chunks)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_ends_is_cut_at_the_timeout_and_gives_its_budget_back() {
        let budget = BodyBudget::new(4096);
        let started = tokio::time::Instant::now();
        let e = read_whole(endless(b"{\"a\":"), &HeaderMap::new(), &limits(), &budget)
            .await
            .unwrap_err();
        assert_eq!(e.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert_eq!(budget.available(), 4096);
    }

    #[tokio::test]
    async fn the_budget_is_shared_and_given_back() {
        let budget = BodyBudget::new(1500);
        let a = read_whole(
            Body::from("x".repeat(900)),
            &declared(900),
            &limits(),
            &budget,
        )
        .await
        .expect("fits");
        assert_eq!(a.bytes.len(), 900);
        assert_eq!(budget.available(), 600);
        // A second declared body does not fit while the first is held: 503 busy at once.
        let e = read_whole(
            Body::from("y".repeat(700)),
            &declared(700),
            &limits(),
            &budget,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Nor does an undeclared one, once its buffer outgrows what is left.
        let e = read_whole(
            Body::from("z".repeat(700)),
            &HeaderMap::new(),
            &limits(),
            &budget,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(budget.available(), 600, "a refused body holds nothing");
        drop(a);
        assert_eq!(budget.available(), 1500);
        let b = read_whole(
            Body::from("y".repeat(700)),
            &HeaderMap::new(),
            &limits(),
            &budget,
        )
        .await
        .expect("fits now");
        assert_eq!(&b.bytes[..], "y".repeat(700).as_bytes());
    }

    #[tokio::test]
    async fn sizes_over_the_limit_are_413() {
        let budget = BodyBudget::new(1 << 20);
        for (body, headers) in [
            (Body::from("x".repeat(1001)), declared(1001)),
            (Body::from("x".repeat(1001)), HeaderMap::new()),
        ] {
            let e = read_whole(body, &headers, &limits(), &budget)
                .await
                .unwrap_err();
            assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
        }
        assert_eq!(budget.available(), 1 << 20);
    }
}
