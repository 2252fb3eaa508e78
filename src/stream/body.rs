//! The hyper response body of a subscriber stream (HTTP/2, and HTTP/1 requests the connection
//! front hands to hyper).

use super::{Guard, MAX_GATHER, StreamSettings, Wake, WriterState, first_write};
use crate::queue::ConnQueue;
use bytes::Bytes;
use futures::Stream;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Builds the response body of a subscriber served through hyper (HTTP/2, and HTTP/1 requests
/// the connection front does not take itself, see `http::conn`): `retry:`, then `prefix`
/// frames, then whatever the queue yields, heartbeats when idle, until the queue closes (the
/// node's drain closes it too) or the client goes away (the stream is dropped: `guard`
/// unregisters it).
///
/// Each body frame is one shared frame as it is, or small frames gathered into a piece of at
/// most 64 KiB: a connection never copies what it was given whole (a prelude, a backlog).
pub fn body(
    queue: Arc<ConnQueue>,
    prefix: Vec<Bytes>,
    settings: StreamSettings,
    guard: Guard,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static {
    let first = first_write(&settings, prefix);
    let state = WriterState::new(queue, settings, first, guard);
    futures::stream::unfold(state, |mut st| async move {
        let bytes = std::future::poll_fn(|cx| st.poll_write(cx)).await?;
        Some((Ok(bytes), st))
    })
}

impl WriterState {
    /// The next chunk of the hyper body, `None` when the stream must end.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(piece) = self.pending.next_chunk(MAX_GATHER) {
            return Poll::Ready(Some(piece));
        }
        loop {
            match std::task::ready!(self.poll_wake(cx)) {
                Wake::Frames(mut batch) => {
                    self.wrote_at = tokio::time::Instant::now();
                    if let Some(piece) = batch.next_chunk(MAX_GATHER) {
                        self.pending = batch;
                        return Poll::Ready(Some(piece));
                    }
                }
                Wake::Closed(last) => {
                    self.done = true;
                    return Poll::Ready(last);
                }
                Wake::Heartbeat => {
                    if let Some(bytes) = self.on_heartbeat() {
                        return Poll::Ready(Some(bytes));
                    }
                }
            }
        }
    }
}
