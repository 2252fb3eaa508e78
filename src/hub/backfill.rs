//! The backfill of an exact resume (PROTOCOL §4.2): reads `(after, c]` from the log into the
//! connection's queue, `c` being the hub's cursor when the subscriber was registered, then
//! hands the queue over to its live buffer, which holds everything after `c`.
//!
//! The backfill of a subscriber whose id is of an older epoch (PROTOCOL §4.3) reads the new
//! epoch from its start, and opens with a prelude of the fold at the epoch's first event in
//! place of that event: the client still holds the lost epoch's messages and state, which only
//! snapshots replace, and a stream must begin with a `RUN_STARTED`. When the epoch has no event
//! yet it waits for the first one (the live buffer meanwhile keeps what the fan-out pushes).
//!
//! The backfill of a subscriber whose id the log never held in its epoch (a tail a failover
//! rolled back, PROTOCOL §4.3) opens with a prelude of the fold at the fork point (the last
//! entry the log holds at or before the id), rebuilt from the log, then reads every entry
//! after it: the client's rolled-back events are replaced by snapshots, and nothing the log
//! took after the fork is skipped.
//!
//! The backfill is the only producer that waits for room in a queue (its buffer is bounded by
//! waiting, not by dropping). It ends early when the subscriber leaves (its stop token) and
//! closes the stream when the range is no longer in the log: the client comes back with its
//! last id and gets a prelude.

use super::{Hub, ThreadHub};
use crate::event::ThreadId;
use crate::fold::{ThreadFold, load_fold_at, prelude};
use crate::log::{Epoch, EventId, EventLog, LogEntry, LogError, ReadFrom, StreamPos};
use crate::metrics as m;
use crate::queue::Frame;
use crate::queue::{CloseReason, ConnQueue};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Entries per log read of a backfill.
const BACKFILL_PAGE: usize = 512;

/// How a backfill's stream opens.
pub(super) enum Opening {
    /// With the first entry read (an exact resume, `?from=start`).
    Plain,
    /// With a prelude of the fold at the epoch's first event, standing for that event (an id
    /// of an older epoch, PROTOCOL §4.3); waits for the first event on the thread hub's
    /// `first_entries` when the epoch has none yet.
    EpochStart(Arc<ThreadHub>),
    /// With a prelude of the fold at this entry (the fork point of a rolled-back id), standing
    /// for it; the backfill reads strictly after it.
    ForkPoint(EventId),
}

impl Hub {
    /// Spawns the backfill of a subscriber registered at the hub's cursor `until`, in the
    /// thread's `epoch`, from `from`, opening as `opening` says.
    // Each argument is one fact of the registration; a struct would only name them twice.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spawn_backfill(
        &self,
        thread: &ThreadId,
        from: ReadFrom,
        epoch: Option<Epoch>,
        until: StreamPos,
        queue: Arc<ConnQueue>,
        stop: CancellationToken,
        opening: Opening,
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
            opening,
        ));
    }
}

/// Reads `(from, until]` from the log into the queue's backfill buffer, then hands over to live.
/// With [`Opening::EpochStart`], `from` is the epoch's start and its first event is replaced by
/// a prelude of the fold at it.
pub(super) async fn backfill(
    log: Arc<dyn EventLog>,
    thread: ThreadId,
    from: ReadFrom,
    until: StreamPos,
    queue: Arc<ConnQueue>,
    stop: CancellationToken,
    opening: Opening,
) {
    let mut from = from;
    let mut opening = opening;
    loop {
        if let ReadFrom::After(id) = from
            && id.pos >= until
            && matches!(opening, Opening::Plain)
        {
            break;
        }
        let read = match &opening {
            Opening::Plain => read_page(&*log, &thread, from, &queue, &stop).await,
            Opening::EpochStart(th) => first_page(&*log, &thread, from, &queue, &stop, th).await,
            Opening::ForkPoint(fork) => {
                let fork = *fork;
                let Some(prelude) = fork_prelude(&*log, &thread, fork, &queue, &stop).await else {
                    return;
                };
                if let Some(prelude) = prelude
                    && !queue.push_backfill(vec![prelude]).await
                {
                    return;
                }
                from = ReadFrom::After(fork);
                opening = Opening::Plain;
                continue;
            }
        };
        let Some(entries) = read else {
            return;
        };
        let Some(last) = entries.last().map(|e| e.id) else {
            break;
        };
        let born = Instant::now();
        let mut frames: Vec<Frame> = Vec::with_capacity(entries.len());
        let mut rest = &entries[..];
        if let Opening::EpochStart(_) = opening
            && let Some((first, after)) = entries.split_first()
        {
            frames.push(epoch_prelude(first, born));
            rest = after;
            opening = Opening::Plain;
        }
        frames.extend(
            rest.iter()
                .filter(|e| e.id.pos <= until)
                .map(|e| Frame::encode(e, born)),
        );
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

/// One page of the backfill; `None` when the backfill ends here: the subscriber left, or the
/// range is no longer in the log or cannot be read (the queue is closed then, and the client
/// comes back with its last id).
async fn read_page(
    log: &dyn EventLog,
    thread: &ThreadId,
    from: ReadFrom,
    queue: &ConnQueue,
    stop: &CancellationToken,
) -> Option<Vec<LogEntry>> {
    let page = tokio::select! {
        biased;
        _ = stop.cancelled() => return None,
        page = log.read(thread, from, BACKFILL_PAGE) => page,
    };
    match page {
        Ok(entries) => Some(entries),
        Err(LogError::Gap(gap)) => {
            // Trimmed (or recreated) since the subscription was decided: the client comes
            // back with its last id and gets a prelude.
            tracing::info!(%thread, reason = gap.as_str(), "backfill range no longer in the log; closing the stream so the client resumes");
            metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Discontinuity.as_str())
                .increment(1);
            queue.close(CloseReason::Discontinuity);
            None
        }
        Err(e) => {
            tracing::warn!(%thread, error = %e, "backfill read failed; closing the stream so the client resumes");
            metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Backend.as_str())
                .increment(1);
            queue.close(CloseReason::Backend);
            None
        }
    }
}

/// The first page of an epoch's start, waiting for the epoch's first event when it has none
/// yet; `None` as for [`read_page`].
async fn first_page(
    log: &dyn EventLog,
    thread: &ThreadId,
    from: ReadFrom,
    queue: &ConnQueue,
    stop: &CancellationToken,
    th: &ThreadHub,
) -> Option<Vec<LogEntry>> {
    loop {
        let appended = th.first_entries.notified();
        tokio::pin!(appended);
        // Registered before the read, so entries appended after it wake this wait.
        appended.as_mut().enable();
        let entries = read_page(log, thread, from, queue, stop).await?;
        if !entries.is_empty() {
            return Some(entries);
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            _ = appended => {}
        }
    }
}

/// The prelude of the fold at `fork`, rebuilt from the log, as one frame standing for that entry
/// (PROTOCOL §4.3), `Some(None)` when the fold there restates nothing (the log opened no run up
/// to it); `None` when the backfill ends here (the subscriber left, or the fold cannot be
/// rebuilt there any more: the queue is closed then, and the client comes back with its id).
async fn fork_prelude(
    log: &dyn EventLog,
    thread: &ThreadId,
    fork: EventId,
    queue: &ConnQueue,
    stop: &CancellationToken,
) -> Option<Option<Frame>> {
    let fold = tokio::select! {
        biased;
        _ = stop.cancelled() => return None,
        fold = load_fold_at(log, thread, fork) => fold,
    };
    let cause = match fold {
        Ok(Some(fold)) => {
            let events = prelude::prelude(&fold);
            let view = Arc::new(fold.checker().clone());
            return Some(
                (!events.is_empty())
                    .then(|| Frame::synthesised(fork, &events, Instant::now(), Some(view))),
            );
        }
        Ok(None) | Err(LogError::Gap(_)) => {
            // Trimmed (or recreated) since the subscription was decided: the client comes
            // back with its id and gets a prelude.
            tracing::info!(%thread, %fork, "the fold at the fork point is no longer in the log; closing the stream so the client resumes");
            CloseReason::Discontinuity
        }
        Err(e) => {
            tracing::warn!(%thread, error = %e, "rebuilding the fold at the fork point failed; closing the stream so the client resumes");
            CloseReason::Backend
        }
    };
    metrics::counter!(m::DISCONNECTS, "cause" => cause.as_str()).increment(1);
    queue.close(cause);
    None
}

/// The prelude of the fold at an epoch's first event (`RUN_STARTED`, `MESSAGES_SNAPSHOT`,
/// `STATE_SNAPSHOT` `{}`, ...: PROTOCOL §5), as one frame standing for that event; the event
/// itself when its fold restates nothing (it opens no run).
fn epoch_prelude(first: &LogEntry, born: Instant) -> Frame {
    let mut fold = ThreadFold::new();
    if let Ok(v) = serde_json::from_slice::<Value>(&first.json) {
        // An event that breaks the order rules is not folded, as every reader of the log does.
        let _ = fold.apply_logged(&v);
    }
    let events = prelude::prelude(&fold);
    if events.is_empty() {
        return Frame::encode(first, born);
    }
    let view = Arc::new(fold.checker().clone());
    Frame::synthesised(first.id, &events, born, Some(view))
}
