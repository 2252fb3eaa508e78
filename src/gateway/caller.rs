//! The caller's side of a gateway run: a bounded channel carrying the SSE frames of the run's
//! events, as appended, from the run's task to the HTTP response that answers the caller.
//!
//! The run belongs to its task, not to the response: a caller that goes away only drops the
//! receiving end. A caller that does not read is detached once its frames pending exceed the
//! queue bounds (`queue.max_events`, `queue.max_bytes`), so it can neither hold the run back
//! nor grow the node's memory; its response ends there (counted as
//! `agui_disconnects_total{cause="overflow"}`) while the run goes on in the log.

use crate::metrics as m;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;

/// What the run's task tells the response.
#[derive(Debug)]
enum Msg {
    /// One SSE frame (`id:` + `data:`) of an appended event.
    Frame(Bytes),
    /// The thread already had an active run, named when known: nothing was appended, the
    /// caller gets `409`.
    Refused(Option<String>),
}

/// How the response begins.
#[derive(Debug)]
pub enum First {
    /// The run's first frame (its `RUN_STARTED`): the response is `200 text/event-stream`.
    Started(Bytes),
    /// Another run is active on the thread (its `runId` when known): `409`.
    Refused(Option<String>),
    /// The run ended before appending anything (the log backend failed): `503`.
    Abandoned,
}

/// The run task's end of the channel.
#[derive(Debug)]
pub(super) struct CallerTx {
    tx: Option<mpsc::Sender<Msg>>,
    /// Bytes of frames sent and not yet taken by the response.
    pending: Arc<AtomicUsize>,
    max_bytes: usize,
}

/// The response's end: the run's frames, in order, then the end of the run.
#[derive(Debug)]
pub struct RunStream {
    rx: mpsc::Receiver<Msg>,
    pending: Arc<AtomicUsize>,
}

/// A channel holding at most `max_events` frames and `max_bytes` bytes of them.
pub(super) fn channel(max_events: usize, max_bytes: usize) -> (CallerTx, RunStream) {
    let (tx, rx) = mpsc::channel(max_events.max(1));
    let pending = Arc::new(AtomicUsize::new(0));
    (
        CallerTx {
            tx: Some(tx),
            pending: pending.clone(),
            max_bytes,
        },
        RunStream { rx, pending },
    )
}

impl CallerTx {
    /// Sends one frame, unless the caller is gone or was detached. A caller whose pending
    /// frames would exceed the bounds is detached (its response ends after what it has).
    pub(super) fn frame(&mut self, frame: Bytes) {
        let Some(tx) = &self.tx else {
            return;
        };
        let len = frame.len();
        // Counted before the send: the response may take the frame at once.
        let before = self.pending.fetch_add(len, Ordering::Relaxed);
        let sent = if before + len > self.max_bytes {
            Err(None)
        } else {
            tx.try_send(Msg::Frame(frame)).map_err(Some)
        };
        match sent {
            Ok(()) => {}
            Err(e) => {
                self.pending.fetch_sub(len, Ordering::Relaxed);
                match e {
                    // Kept: the caller stays `gone` (not detached), which a run under
                    // `on_disconnect = "cancel"` acts on.
                    Some(mpsc::error::TrySendError::Closed(_)) => {}
                    _ => self.detach(),
                }
            }
        }
    }

    fn detach(&mut self) {
        metrics::counter!(m::DISCONNECTS, "cause" => "overflow").increment(1);
        tracing::info!("gateway caller not reading: detached, the run goes on");
        self.tx = None;
    }

    /// Tells a caller that nothing was appended because the thread has an active run.
    pub(super) fn refuse(&mut self, active: Option<String>) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.try_send(Msg::Refused(active));
        }
    }

    /// Whether the caller went away (its response was dropped); `false` for a caller the
    /// broker detached.
    pub(super) fn gone(&self) -> bool {
        self.tx.as_ref().is_some_and(mpsc::Sender::is_closed)
    }

    /// Resolves when the caller goes away; never for a detached caller.
    pub(super) async fn closed(&self) {
        match &self.tx {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    }
}

impl RunStream {
    /// Waits for how the response begins.
    pub async fn first(&mut self) -> First {
        match self.rx.recv().await {
            Some(Msg::Frame(frame)) => {
                self.taken(&frame);
                First::Started(frame)
            }
            Some(Msg::Refused(active)) => First::Refused(active),
            None => First::Abandoned,
        }
    }

    /// The next frame; `None` once the run has ended (or the caller was detached).
    pub async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            match self.rx.recv().await? {
                Msg::Frame(frame) => {
                    self.taken(&frame);
                    return Some(frame);
                }
                Msg::Refused(_) => continue,
            }
        }
    }

    fn taken(&self, frame: &Bytes) {
        self.pending.fetch_sub(frame.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_caller_that_does_not_read_is_detached_at_the_bounds() {
        let (mut tx, mut rx) = channel(3, 1_000);
        for _ in 0..5 {
            tx.frame(Bytes::from_static(b"data: x\n\n"));
        }
        assert!(tx.tx.is_none(), "detached at the fourth frame");
        let mut n = 0;
        while rx.next_frame().await.is_some() {
            n += 1;
        }
        assert_eq!(n, 3, "what was queued before is still delivered");

        let (mut tx, mut rx) = channel(100, 20);
        tx.frame(Bytes::from_static(b"data: 0123456789\n\n"));
        tx.frame(Bytes::from_static(b"data: 0123456789\n\n"));
        assert!(tx.tx.is_none(), "detached over the byte bound");
        assert!(matches!(rx.first().await, First::Started(_)));
    }

    #[tokio::test]
    async fn a_dropped_response_is_gone() {
        let (mut tx, rx) = channel(3, 1_000);
        assert!(!tx.gone());
        drop(rx);
        assert!(tx.gone());
        tx.closed().await;
        // Still gone after a frame was sent to it (not taken for a detached caller).
        tx.frame(Bytes::from_static(b"data: x\n\n"));
        assert!(tx.gone());
        tx.closed().await;
    }
}
