//! The backfill of an exact resume (PROTOCOL §4.2): reads `(after, c]` from the log into the
//! connection's queue, `c` being the hub's cursor when the subscriber was registered, then
//! hands the queue over to its live buffer, which holds everything after `c`.
//!
//! The backfill is the only producer that waits for room in a queue (its buffer is bounded by
//! waiting, not by dropping). It ends early when the subscriber leaves (its stop token) and
//! closes the stream when the range is no longer in the log: the client comes back with its
//! last id and gets a prelude.

use super::Hub;
use crate::event::ThreadId;
use crate::log::{Epoch, EventId, EventLog, LogError, ReadFrom, StreamPos};
use crate::metrics as m;
use crate::queue::Frame;
use crate::queue::{CloseReason, ConnQueue};
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Entries per log read of a backfill.
const BACKFILL_PAGE: usize = 512;

impl Hub {
    /// Spawns the backfill of a subscriber registered at the hub's cursor `until`, in the
    /// thread's `epoch`, from `from`.
    pub(super) fn spawn_backfill(
        &self,
        thread: &ThreadId,
        from: ReadFrom,
        epoch: Option<Epoch>,
        until: StreamPos,
        queue: Arc<ConnQueue>,
        stop: CancellationToken,
    ) {
        // `?from=start` was decided on a complete log, but the log may be trimmed before the
        // backfill reads it: read "after position 0" of this epoch instead, which the log
        // refuses (a gap) once anything was trimmed, rather than starting mid-thread.
        let from = match (from, epoch) {
            (ReadFrom::Start, Some(epoch)) => ReadFrom::After(EventId {
                epoch,
                pos: StreamPos::ZERO,
            }),
            (from, _) => from,
        };
        tokio::spawn(backfill(
            self.shared.log.clone(),
            thread.clone(),
            from,
            until,
            queue,
            stop,
        ));
    }
}

/// Reads `(from, until]` from the log into the queue's backfill buffer, then hands over to live.
pub(super) async fn backfill(
    log: Arc<dyn EventLog>,
    thread: ThreadId,
    from: ReadFrom,
    until: StreamPos,
    queue: Arc<ConnQueue>,
    stop: CancellationToken,
) {
    let mut from = from;
    loop {
        if let ReadFrom::After(id) = from
            && id.pos >= until
        {
            break;
        }
        let page = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            page = log.read(&thread, from, BACKFILL_PAGE) => page,
        };
        let entries = match page {
            Ok(entries) => entries,
            Err(LogError::Gap(gap)) => {
                // Trimmed (or recreated) since the subscription was decided: the client comes
                // back with its last id and gets a prelude.
                tracing::info!(%thread, reason = gap.as_str(), "backfill range no longer in the log; closing the stream so the client resumes");
                metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Discontinuity.as_str())
                    .increment(1);
                queue.close(CloseReason::Discontinuity);
                return;
            }
            Err(e) => {
                tracing::warn!(%thread, error = %e, "backfill read failed; closing the stream so the client resumes");
                metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Backend.as_str())
                    .increment(1);
                queue.close(CloseReason::Backend);
                return;
            }
        };
        let Some(last) = entries.last().map(|e| e.id) else {
            break;
        };
        let born = Instant::now();
        let frames: Vec<Frame> = entries
            .iter()
            .filter(|e| e.id.pos <= until)
            .map(|e| Frame::encode(e, born))
            .collect();
        let full = entries.len() == BACKFILL_PAGE;
        if !frames.is_empty() && !queue.push_backfill(frames).await {
            return;
        }
        if !full || last.pos >= until {
            break;
        }
        from = ReadFrom::After(last);
    }
    queue.finish_backfill();
}
