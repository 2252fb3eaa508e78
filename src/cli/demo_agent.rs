//! The `demo-agent` subcommand: a built-in AG-UI agent server with scripted runs and no model
//! keys, so the broker can be tried and tested with nothing from outside the repository.
//!
//! `POST /` takes a `RunAgentInput` (AG-UI 1.0, checked against the broker's own schema) and
//! answers `200 text/event-stream` with one run, `data: {json}\n\n` per event as the official
//! encoders write (AGUI.md §3): no `id:`, `event:` or comments. The runs (a bank onboarding:
//! assessment, an approval that ends with an `interrupt` outcome, the `resume[]` run that opens
//! the account) are in [`script`]. Input that is not a `RunAgentInput` gets `400` with the
//! broker's JSON error body naming the field, before any stream opens.
//!
//! `--pace` spaces the events for a human to watch; `--fail-after N` drops the connection
//! after N events, as a producer that crashes mid-run does (the chunked body ends without its
//! last chunk).

pub mod script;

use crate::event::validate_value;
use crate::http::ApiError;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::{Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Largest request body read, in bytes (a `RunAgentInput` carries the conversation so far).
pub const MAX_INPUT_BYTES: usize = 4 * 1024 * 1024;

/// How long a `--fail-after` body stays pending before it fails, so that the server writes
/// out the frames before it (see [`paced`]).
const FLUSH_PAUSE: Duration = Duration::from_millis(50);

/// Arguments of `demo-agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoAgentArgs {
    /// Address to listen on (port 0: any free port; the address is printed once bound).
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Events per second (text streams a word per event, so 15 reads at a human pace);
    /// `0` or `inf`: as fast as the connection takes them.
    #[arg(long, default_value = "15", value_parser = parse_pace)]
    pub pace: f64,
    /// Drop the connection after this many events of a run, without a terminal event (a
    /// producer crashing mid-run).
    #[arg(long)]
    pub fail_after: Option<usize>,
}

/// `--pace`: a non-negative number of events per second, or `inf`.
fn parse_pace(raw: &str) -> Result<f64, String> {
    match raw.parse::<f64>() {
        Ok(p) if p >= 0.0 => Ok(p),
        Ok(_) | Err(_) => Err(format!(
            "{raw:?} is not a pace: give events per second (a number ≥ 0; 0 or inf: unlimited)"
        )),
    }
}

/// How the agent streams, from [`DemoAgentArgs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pacing {
    /// Time between two events; `None`: no wait.
    pub period: Option<Duration>,
    /// Events written before the connection is dropped; `None`: every run completes.
    pub fail_after: Option<usize>,
}

impl Pacing {
    /// Events as fast as the connection takes them, runs complete: what tests use.
    pub const UNLIMITED: Pacing = Pacing {
        period: None,
        fail_after: None,
    };

    /// The pacing `args` ask for.
    pub fn of(args: &DemoAgentArgs) -> Pacing {
        let period = (args.pace > 0.0 && args.pace.is_finite())
            .then(|| Duration::from_secs_f64(1.0 / args.pace));
        Pacing {
            period,
            fail_after: args.fail_after,
        }
    }
}

#[derive(Clone)]
struct AgentState {
    pacing: Pacing,
    shutdown: CancellationToken,
}

/// The agent's routes: `POST /`. A stream ends itself when `shutdown` is cancelled (the
/// connection is dropped mid-run, as when the process stops).
pub fn router(pacing: Pacing, shutdown: CancellationToken) -> Router {
    Router::new()
        .route("/", post(run))
        .with_state(Arc::new(AgentState { pacing, shutdown }))
}

/// Serves [`router`] on `listener` until `shutdown` is cancelled, then waits for the open
/// streams (which end at once).
///
/// # Errors
/// The listener's, when accepting fails for good.
pub async fn serve(
    listener: TcpListener,
    pacing: Pacing,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router(pacing, shutdown.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// `POST /`: one scripted run for the input, or 400.
async fn run(State(agent): State<Arc<AgentState>>, body: Body) -> Response {
    let input = match read_input(body).await {
        Ok(input) => input,
        Err(e) => return e.into_response(),
    };
    let frames: Vec<Bytes> = script::run_events(&input)
        .iter()
        .map(|event| Bytes::from(format!("data: {event}\n\n")))
        .collect();
    let stream = paced(frames, agent.pacing, agent.shutdown.clone());
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Reads and checks a `RunAgentInput`.
///
/// # Errors
/// `413 too_large` over [`MAX_INPUT_BYTES`]; `400 invalid_input` for a body that is not a
/// JSON object or breaks the AG-UI 1.0 `RunAgentInput` schema, naming the field
/// (`messages[0].role`).
async fn read_input(body: Body) -> Result<Value, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_INPUT_BYTES)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is larger than {MAX_INPUT_BYTES} bytes"),
            )
        })?;
    let input: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            format!("the body is not JSON: {e}"),
        )
    })?;
    if !input.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            "the body must be a JSON object (an AG-UI RunAgentInput)",
        ));
    }
    // The broker's schema knows RunAgentInput as what `RUN_STARTED.input` echoes: check it
    // there and report the field relative to the body.
    let probe = json!({"type": "RUN_STARTED", "threadId": "-", "runId": "-", "input": input});
    match validate_value(probe, None) {
        Ok(valid) => Ok(valid.parsed()["input"].clone()),
        Err(e) => {
            let relative = |s: &str| s.strip_prefix("input.").unwrap_or(s).to_string();
            Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_input",
                relative(&e.message),
            )
            .field(e.field.as_deref().map(relative)))
        }
    }
}

/// The frames of one run as a body stream: one frame per `pacing.period`, ended by an error
/// (the connection dropped without the body's last chunk) after `pacing.fail_after` frames or
/// when `shutdown` is cancelled.
fn paced(
    frames: Vec<Bytes>,
    pacing: Pacing,
    shutdown: CancellationToken,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send {
    struct Cursor {
        frames: std::vec::IntoIter<Bytes>,
        sent: usize,
        ticks: Option<Interval>,
    }
    let ticks = pacing.period.map(|period| {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks
    });
    let cursor = Cursor {
        frames: frames.into_iter(),
        sent: 0,
        ticks,
    };
    futures::stream::unfold(Some(cursor), move |cursor| {
        let shutdown = shutdown.clone();
        async move {
            let mut c = cursor?;
            if pacing.fail_after.is_some_and(|n| c.sent >= n) {
                // hyper drops what it has buffered when a body fails: pausing first (the body
                // pending) lets it flush the frames already given, so they do reach the peer.
                tokio::time::sleep(FLUSH_PAUSE).await;
                return Some((Err(std::io::Error::other("--fail-after reached")), None));
            }
            // Taken before the wait, so the body ends as soon as the last frame is out.
            let frame = c.frames.next()?;
            if let Some(ticks) = c.ticks.as_mut() {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => {
                        return Some((Err(std::io::Error::other("shutting down")), None));
                    }
                    _ = ticks.tick() => {}
                }
            } else if shutdown.is_cancelled() {
                return Some((Err(std::io::Error::other("shutting down")), None));
            }
            c.sent += 1;
            Some((Ok(frame), Some(c)))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;
    use futures::StreamExt;
    use tower::ServiceExt;

    async fn post(body: &str) -> (StatusCode, Value) {
        let app = router(Pacing::UNLIMITED, CancellationToken::new());
        let response = app
            .oneshot(
                Request::post("/")
                    .body(Body::from(body.to_string()))
                    .expect("a request"),
            )
            .await
            .expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("the body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    #[tokio::test]
    async fn bad_input_is_400_naming_the_field() {
        for (body, field) in [
            ("{", Value::Null),
            ("[]", Value::Null),
            (r#"{"runId":"r","messages":[]}"#, json!("threadId")),
            (r#"{"threadId":"t","runId":"r"}"#, json!("messages")),
            (
                r#"{"threadId":"t","runId":"r","messages":[{"id":"u","role":"robot","content":"x"}]}"#,
                json!("messages[0].role"),
            ),
            (
                r#"{"threadId":"t","runId":"r","messages":[],"resume":[{"interruptId":"i"}]}"#,
                json!("resume[0].status"),
            ),
        ] {
            let (status, reply) = post(body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(reply["error"]["code"], "invalid_input", "{body}");
            assert_eq!(reply["error"]["field"], field, "{body}: {reply}");
        }
    }

    fn frames(n: usize) -> Vec<Bytes> {
        (0..n)
            .map(|i| Bytes::from(format!("data: {i}\n\n")))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn pace_spaces_the_events() {
        let pacing = Pacing {
            period: Some(Duration::from_millis(100)),
            fail_after: None,
        };
        let start = tokio::time::Instant::now();
        let got: Vec<_> = paced(frames(5), pacing, CancellationToken::new())
            .collect()
            .await;
        assert_eq!(got.len(), 5);
        assert!(got.iter().all(|f| f.is_ok()));
        // The first frame goes at once, then one per period.
        assert_eq!(start.elapsed(), Duration::from_millis(400));
    }

    #[tokio::test]
    async fn fail_after_ends_the_body_with_an_error() {
        let pacing = Pacing {
            period: None,
            fail_after: Some(3),
        };
        let got: Vec<_> = paced(frames(5), pacing, CancellationToken::new())
            .collect()
            .await;
        assert_eq!(got.len(), 4);
        assert!(got[..3].iter().all(|f| f.is_ok()));
        assert!(got[3].is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_a_paced_stream() {
        let pacing = Pacing {
            period: Some(Duration::from_secs(3600)),
            fail_after: None,
        };
        let shutdown = CancellationToken::new();
        let mut stream = Box::pin(paced(frames(5), pacing, shutdown.clone()));
        assert!(stream.next().await.expect("a frame").is_ok());
        shutdown.cancel();
        assert!(stream.next().await.expect("the end").is_err());
        assert!(stream.next().await.is_none());
    }

    #[test]
    fn pace_arguments() {
        assert_eq!(parse_pace("15"), Ok(15.0));
        assert_eq!(parse_pace("inf"), Ok(f64::INFINITY));
        assert!(parse_pace("-1").is_err());
        assert!(parse_pace("NaN").is_err());
        assert!(parse_pace("fast").is_err());
    }
}
