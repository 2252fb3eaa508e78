//! A subscriber's stream writers: they drain the connection's queue into the client, with
//! heartbeats when idle and the stream's last words when it ends.
//!
//! Data path position: `queue` → **`stream`** → client. Two writers share `WriterState`:
//! - [`body`]: the hyper response body (HTTP/2, and HTTP/1 requests the connection front hands
//!   to hyper);
//! - [`write_socket`]: the direct socket writer of the connection front (`http::conn`); it
//!   lends the socket to the queue ([`crate::queue::Sink`]) so that the hub's fan-out may
//!   write a frame itself while the writer is idle.

mod body;
mod socket;

pub use body::body;
pub use socket::write_socket;

use crate::queue::{Batch, CloseReason, ConnQueue, Drained};
use crate::sse::{self, HEARTBEAT};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Settings of one subscriber stream.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    /// Milliseconds written in the first `retry:` frame; the last frame of a stream ended by
    /// the node's drain carries [`drain_retry_ms`] of it (¼× to 1.5×).
    pub retry_ms: u64,
    /// Idle time after which a heartbeat comment is written.
    pub heartbeat: Duration,
    /// Longest wait for the socket to accept a byte before the stream is given up (streams
    /// written to the raw socket, [`write_socket`]).
    pub write_timeout: Duration,
    /// When the stream ends by itself: its token's expiry (PROTOCOL §8). The client reconnects
    /// with its `Last-Event-ID` (and a fresh token); the last frame is [`EXPIRED`].
    pub ends_at: Option<tokio::time::Instant>,
    /// When the stream ends to rebalance (`sse.max_stream_age`, drawn by [`stream_age_limit`]):
    /// its last frame is a short jittered `retry:` ([`drain_retry_ms`]), and the client resumes
    /// exactly with its `Last-Event-ID` on whichever node its next connection reaches.
    pub max_age_at: Option<tokio::time::Instant>,
}

/// The last frame of a stream whose token expired.
pub const EXPIRED: &[u8] = b": agui-fanout: token expired\n\n";

/// The `retry:` of a stream a draining node ends or refuses (PROTOCOL §9), in milliseconds:
/// uniformly drawn from ¼× to 1.5× `retry_ms` (500 ms to 3 s with the default 2 s).
///
/// Why short: the client should land on a ready node within a few seconds, not wait out a
/// long delay while other nodes could serve it (a 1×–5× jitter left clients up to 10 s
/// without events, on top of the drain). Why jittered at all: clients the drain ends at the
/// same moment (or that keep coming back to the draining node) should not return in step;
/// the main spread comes from the drain itself, which ends streams one by one over its
/// period ([`crate::hub::Hub::drain_streams`]).
pub fn drain_retry_ms(retry_ms: u64) -> u64 {
    rand::random_range(retry_ms / 4..=retry_ms.saturating_mul(3) / 2)
}

/// How long a stream may last under `sse.max_stream_age = max_age`: uniformly drawn from ¾× to
/// 1× of it, so that streams opened together (a reconnection wave after a deploy) do not end
/// together again, and the waves flatten with every round.
pub fn stream_age_limit(max_age: Duration) -> Duration {
    max_age.mul_f64(rand::random_range(0.75..=1.0))
}

impl StreamSettings {
    /// The last words of a stream whose queue was closed for `reason`: the short jittered
    /// `retry:` of a drain ([`drain_retry_ms`], PROTOCOL §9), or a comment naming the cause.
    fn final_frame(&self, reason: CloseReason) -> Option<Bytes> {
        if reason == CloseReason::Shutdown {
            return Some(sse::encode_retry(drain_retry_ms(self.retry_ms)));
        }
        reason.final_words().map(sse::encode_comment)
    }

    /// The writer's next timer deadline: the heartbeat's `due`, or the stream's end if sooner.
    fn next_wake(&self, due: tokio::time::Instant) -> tokio::time::Instant {
        [self.ends_at, self.max_age_at]
            .into_iter()
            .flatten()
            .fold(due, |wake, end| wake.min(end))
    }
}

/// An object kept alive as long as the stream (the hub's registration guard).
pub type Guard = Box<dyn Send + Sync + 'static>;

/// The first write of a stream: `retry:`, then the `prefix` frames (comments, a prelude), as
/// they are: a prelude is the thread's, shared by every connection that starts at its
/// position, not copied into each.
fn first_write(settings: &StreamSettings, prefix: Vec<Bytes>) -> Batch {
    let mut first = Batch::one(sse::encode_retry(settings.retry_ms));
    for p in prefix {
        first.push(p);
    }
    first
}

/// Most bytes a writer copies into one piece when it gathers small frames for a writer of
/// whole `Bytes` (a hyper body frame, [`Batch::next_chunk`]); larger frames go out as they are.
const MAX_GATHER: usize = 64 << 10;

/// What wakes a stream's writer.
enum Wake {
    /// Frames to write.
    Frames(Batch),
    /// The queue closed; the stream ends after these last words.
    Closed(Option<Bytes>),
    /// The heartbeat timer fired.
    Heartbeat,
}

/// A stream's writer state, shared by both ways of writing (hyper body, raw socket).
///
/// The heartbeat timer is created once and only re-armed when it fires (to the last write
/// plus the heartbeat period), so a write costs no timer operation.
struct WriterState {
    queue: Arc<ConnQueue>,
    settings: StreamSettings,
    /// Taken and not yet handed out (the hyper body hands out one piece at a time) or not yet
    /// written (the socket writer).
    pending: Batch,
    heartbeat: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// When the last bytes were handed out.
    wrote_at: tokio::time::Instant,
    done: bool,
    _guard: Guard,
}

impl WriterState {
    /// A writer of `queue` that starts with `pending` (possibly empty), its heartbeat timer
    /// armed from now.
    fn new(
        queue: Arc<ConnQueue>,
        settings: StreamSettings,
        pending: Batch,
        guard: Guard,
    ) -> WriterState {
        let now = tokio::time::Instant::now();
        let heartbeat = Box::pin(tokio::time::sleep_until(
            settings.next_wake(now + settings.heartbeat),
        ));
        WriterState {
            queue,
            settings,
            pending,
            heartbeat,
            wrote_at: now,
            done: false,
            _guard: guard,
        }
    }

    /// Polls for what to do next: frames, the end, or a heartbeat tick.
    fn poll_wake(&mut self, cx: &mut Context<'_>) -> Poll<Wake> {
        // Checked before the queue, so that a stream that is never idle ends on time too (the
        // timer below wakes an idle one).
        let now = tokio::time::Instant::now();
        if self.settings.ends_at.is_some_and(|end| now >= end) {
            metrics::counter!(crate::metrics::DISCONNECTS, "cause" => "token_expired").increment(1);
            return Poll::Ready(Wake::Closed(Some(Bytes::from_static(EXPIRED))));
        }
        if self.settings.max_age_at.is_some_and(|end| now >= end) {
            metrics::counter!(crate::metrics::DISCONNECTS, "cause" => "max_age").increment(1);
            let retry = drain_retry_ms(self.settings.retry_ms);
            return Poll::Ready(Wake::Closed(Some(sse::encode_retry(retry))));
        }
        match self.queue.poll_batch(cx) {
            Poll::Ready(Drained::Frames(bytes)) => return Poll::Ready(Wake::Frames(bytes)),
            Poll::Ready(Drained::Closed(reason)) => {
                return Poll::Ready(Wake::Closed(self.settings.final_frame(reason)));
            }
            Poll::Pending => {}
        }
        if self.heartbeat.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Wake::Heartbeat);
        }
        Poll::Pending
    }

    /// Handles a heartbeat tick: the heartbeat bytes when the stream was idle for the whole
    /// period, and the timer re-armed either way.
    fn on_heartbeat(&mut self) -> Option<Bytes> {
        let now = tokio::time::Instant::now();
        let due = self.wrote_at + self.settings.heartbeat;
        if now >= due {
            self.wrote_at = now;
            let next = self.settings.next_wake(now + self.settings.heartbeat);
            self.heartbeat.as_mut().reset(next);
            Some(Bytes::from_static(HEARTBEAT))
        } else {
            let next = self.settings.next_wake(due);
            self.heartbeat.as_mut().reset(next);
            None
        }
    }
}
