//! Following the log's tail: each event is parsed, folded and encoded once per node, and the
//! shared frame is pushed into every subscriber's queue without waiting (PROTOCOL §3, §7).
//!
//! Slow subscribers (PROTOCOL §5): a live push that does not fit is coalesced in the queue; if it
//! still does not fit, the queue is reset: it drops what is pending and every later push
//! until its writer comes back for more, and then gets a bridge (`bridge.rs`). A queue that
//! cannot be reset is closed. A discontinuity of the tail resets every subscriber to the fold
//! at the log's head, or ends the thread's streams.

use super::{Hub, ThreadHub, ThreadState};
use crate::event::validate::validate_content_in;
use crate::event::{AsEvent, ContentRef, EventType, ThreadId, ValidEvent};
use crate::fold::{Applied, load_fold};
use crate::log::{EventId, LogEntry, LogHead, ResumeGap, StreamPos, TailItem};
use crate::metrics as m;
use crate::queue::Frame;
use crate::queue::{CloseReason, MergeKey, Pushed, ResetCause};
use bytes::Bytes;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Frames written at once by the fan-out that share one `agui_publish_to_write_seconds` clock
/// read.
const WRITES_PER_SAMPLE: usize = 32;

impl Hub {
    /// Consumes the tail: encodes each event once and fans it out.
    pub(super) async fn dispatch(
        self,
        mut rx: mpsc::Receiver<TailItem>,
        shutdown: CancellationToken,
    ) {
        loop {
            let item = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                item = rx.recv() => match item { Some(i) => i, None => return },
            };
            match item {
                TailItem::Entries { thread, entries } => self.fan_out(&thread, &entries),
                TailItem::Discontinuity {
                    thread,
                    head,
                    reason,
                } => self.discontinuity(&thread, head, reason).await,
            }
        }
    }

    /// The tail lost continuity. Trimmed past the tail in the same epoch (a tail that fell
    /// behind retention): rebuild the fold at the log's head and reset every subscriber to it
    /// with a bridge (PROTOCOL §5), as for a slow subscriber. Otherwise (a recreated log), or when
    /// no bridge can be built: end the thread's streams; clients come back with their last id
    /// and get a prelude.
    async fn discontinuity(&self, thread: &ThreadId, head: LogHead, reason: ResumeGap) {
        let Some(th) = self.followed(thread) else {
            return;
        };
        let same_epoch = th.state.lock().head.is_some_and(|h| h.epoch == head.epoch);
        if reason == ResumeGap::OtherEpoch && same_epoch {
            // Reported for an earlier follow, whose thread hub a subscribe already retired
            // (`Hub::decide` saw the new epoch first): this thread hub was rebuilt in the
            // log's epoch, which its own follow cannot find foreign.
            return;
        }
        if reason == ResumeGap::Trimmed
            && same_epoch
            && let Ok((now, Some(fold))) = load_fold(&*self.shared.log, thread).await
            && now.epoch == head.epoch
        {
            let mut st = th.state.lock();
            if !st.removed {
                // The fold moves to the log's head first: the writers build their bridges
                // to it (under this lock) when they come back for more.
                st.head = Some(now);
                st.cursor = now.last;
                st.view = Some(Arc::new(fold.checker().clone()));
                st.fold = Some(fold);
                let mut resets = 0u64;
                let mut closed = 0u64;
                st.subscribers.retain(|(_, q)| {
                    if q.begin_reset(ResetCause::Trimmed) {
                        resets += 1;
                        true
                    } else {
                        q.close(CloseReason::Discontinuity);
                        closed += 1;
                        false
                    }
                });
                drop(st);
                tracing::info!(%thread, resets, closed, "the tail fell behind retention; subscribers reset to the fold at the head");
                metrics::counter!(m::RESETS, "cause" => "trimmed").increment(resets);
                metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Discontinuity.as_str())
                    .increment(closed);
                return;
            }
        }
        self.retire(thread, &th, head, reason);
    }

    /// The thread hub `th` no longer stands for the log (recreated, rolled back, or trimmed
    /// past it with no fold to reset to): drops it, if it is still the followed one (the next
    /// subscriber rebuilds it from the log), and ends its streams; clients come back with
    /// their last id.
    pub(super) fn retire(
        &self,
        thread: &ThreadId,
        th: &Arc<ThreadHub>,
        head: LogHead,
        reason: ResumeGap,
    ) {
        // Unfollowing inside the closure orders it before any new follow of the thread.
        let removed = self.shared.threads.remove_if(thread, |_, current| {
            if !Arc::ptr_eq(current, th) {
                return false;
            }
            current.state.lock().removed = true;
            self.shared.tail.unfollow(thread);
            true
        });
        if let Some((_, th)) = removed {
            let mut st = th.state.lock();
            tracing::warn!(%thread, reason = reason.as_str(), epoch = %head.epoch, subscribers = st.subscribers.len(),
                "log discontinuity; disconnecting the thread's subscribers");
            st.head = Some(head);
            st.cursor = head.last;
            for (_, q) in st.subscribers.drain(..) {
                q.close(CloseReason::Discontinuity);
                metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Discontinuity.as_str())
                    .increment(1);
            }
        }
    }

    /// Folds and encodes the tail's `entries` once, under the thread's lock, and pushes the
    /// frames into every subscriber's queue; a queue still full after coalescing is reset, or
    /// closed. Entries the fan-out already passed (fanned out at publish: [`Hub::fan_out_local`])
    /// are skipped unparsed.
    fn fan_out(&self, thread: &ThreadId, entries: &[LogEntry]) {
        let Some(th) = self.followed(thread) else {
            return;
        };
        // The values this node parsed at publish (`ahead.rs`); the others are parsed outside
        // the lock (once per event per node), except those already fanned out.
        let (mut values, cursor): (Vec<Option<Read>>, _) = {
            let mut st = th.state.lock();
            let (cursor, epoch) = (st.cursor, st.head.map(|h| h.epoch));
            let keeps_ahead = self.shared.ahead.load(Ordering::Relaxed) > 0;
            let values = entries
                .iter()
                .map(|e| {
                    if e.id.pos <= cursor || Some(e.id.epoch) != epoch {
                        None
                    } else if keeps_ahead {
                        st.ahead.take(e).map(Read::Valid)
                    } else {
                        None
                    }
                })
                .collect();
            (values, cursor)
        };
        for (v, e) in values.iter_mut().zip(entries) {
            if v.is_none() && e.id.pos > cursor {
                *v = Read::of(&e.json);
            }
        }
        let born = Instant::now();
        let mut st = th.state.lock();
        let fanned = self.fan_out_locked(
            &mut st,
            thread,
            born,
            entries.iter().zip(&values).map(|(e, v)| Entry {
                id: e.id,
                event_type: e.event_type,
                json: &e.json,
                value: v.as_ref().map(|v| v as &dyn AsEvent),
            }),
        );
        drop(st);
        fanned.record(&th, thread);
    }

    /// Fans out a batch this node just appended, from its publish (see [`LocalAppends`]): the
    /// batch directly follows the fan-out's cursor, so the frames go out without waiting for
    /// the tail (which brings the same entries back later; [`Hub::fan_out`] skips them).
    /// `st` is the thread's locked state.
    ///
    /// [`LocalAppends`]: crate::log::LocalAppends
    pub(super) fn fan_out_local(
        &self,
        th: &ThreadHub,
        mut st: parking_lot::MutexGuard<'_, ThreadState>,
        thread: &ThreadId,
        ids: &[EventId],
        events: &[ValidEvent],
    ) {
        let fanned = self.fan_out_locked(
            &mut st,
            thread,
            Instant::now(),
            ids.iter().zip(events).map(|(id, e)| Entry {
                id: *id,
                event_type: e.event_type,
                json: &e.json,
                value: Some(e),
            }),
        );
        drop(st);
        if let Some(last) = fanned.frames.last() {
            self.shared.tail.passed(thread, last.id);
        }
        fanned.record(th, thread);
    }

    /// The fan-out itself, under the thread's lock: folds and encodes each entry after the
    /// cursor once, pushes the frames into every subscriber's queue, moves the cursor.
    fn fan_out_locked<'a>(
        &self,
        st: &mut ThreadState,
        thread: &ThreadId,
        born: Instant,
        entries: impl Iterator<Item = Entry<'a>>,
    ) -> Fanned {
        let cursor = st.cursor;
        let epoch = st.head.map(|h| h.epoch);
        let mut frames: Vec<Frame> = Vec::with_capacity(entries.size_hint().0);
        for e in entries {
            // The tail may repeat entries after a re-follow, or bring back what was fanned out
            // at publish: skip those; and entries of an earlier follow's epoch still in the
            // channel when a subscribe retired its thread hub (`Hub::decide`).
            if e.id.pos <= cursor || Some(e.id.epoch) != epoch {
                continue;
            }
            // Not parsed before the lock only when it was behind the cursor then; a
            // discontinuity's reset may have moved the cursor since.
            let parsed;
            let value = match e.value {
                Some(v) => Some(v),
                None => {
                    parsed = Read::of(e.json);
                    parsed.as_ref().map(|v| v as &dyn AsEvent)
                }
            };
            let merge = match value {
                Some(v) => fold_event(st, thread, e.event_type, v),
                None => MergeKey::Never,
            };
            frames.push(
                Frame::new(e.id, e.event_type, e.json, born, merge).with_view(st.view.clone()),
            );
        }
        let mut fanned = Fanned {
            frames,
            cursor_before: cursor,
            born,
            written: 0,
            resets: 0,
            overflowed: 0,
            receivers: 0,
        };
        let Some(last) = fanned.frames.last() else {
            return fanned;
        };
        let last_id = last.id;
        st.cursor = last_id.pos;
        if let Some(head) = st.head.as_mut() {
            head.last = last_id.pos;
        }
        // Each queue is a cache miss at a thousand threads: asked for together, the misses
        // overlap (`ConnQueue::prefetch`).
        for (_, q) in &st.subscribers {
            q.prefetch();
        }
        // Frames written at once, counted in `agui_publish_to_write_seconds` in groups: one
        // clock read per group instead of per write (a group spans ~0.1 ms of writes).
        let frames = &fanned.frames;
        let (mut written, mut resets, mut overflowed) = (0usize, 0u64, 0u64);
        st.subscribers.retain(|(_, q)| {
            match q.push_live(frames) {
                Ok(Pushed::Written) => {
                    written += 1;
                    if written == WRITES_PER_SAMPLE {
                        m::record_publish_to_writes(born, written);
                        written = 0;
                    }
                    return true;
                }
                Ok(_) => return true,
                Err(_) => {}
            }
            // Still full after coalescing: snapshot-and-reset, the bridge built when the
            // writer comes back (see `bridge.rs`).
            if q.begin_reset(ResetCause::Overflow) {
                resets += 1;
                return true;
            }
            q.close(CloseReason::Overflow);
            overflowed += 1;
            false
        });
        fanned.written = written;
        fanned.resets = resets;
        fanned.overflowed = overflowed;
        fanned.receivers = st.subscribers.len() as u64;
        fanned
    }
}

/// One log entry as the fan-out takes it: from the tail (read, or not) or from this node's
/// publish (as validated).
struct Entry<'a> {
    id: EventId,
    event_type: EventType,
    json: &'a Bytes,
    value: Option<&'a dyn AsEvent>,
}

/// A log entry's event as the fan-out folds it: as this node's publish validated it, or read
/// from the tail's bytes.
enum Read {
    /// Validated: kept from this node's publish (`ahead.rs`), or a content delta read without
    /// a value (`validate_content_in`).
    Valid(ValidEvent),
    /// Any other entry, parsed.
    Value(Value),
}

impl Read {
    /// Reads an entry's JSON; `None` when it does not parse (not folded, never merged).
    fn of(json: &Bytes) -> Option<Read> {
        match validate_content_in(json) {
            Some(event) => Some(Read::Valid(event)),
            None => serde_json::from_slice(json).ok().map(Read::Value),
        }
    }
}

impl AsEvent for Read {
    fn content(&self) -> Option<ContentRef<'_>> {
        match self {
            Read::Valid(event) => event.content(),
            Read::Value(_) => None,
        }
    }

    fn as_value(&self) -> &Value {
        match self {
            Read::Valid(event) => event.as_value(),
            Read::Value(value) => value,
        }
    }
}

/// What one fan-out did, recorded in the metrics once the thread's lock is dropped.
struct Fanned {
    frames: Vec<Frame>,
    /// The cursor before the fan-out.
    cursor_before: StreamPos,
    born: Instant,
    /// Writes not yet counted in `agui_publish_to_write_seconds`.
    written: usize,
    resets: u64,
    overflowed: u64,
    /// Subscribers after the fan-out.
    receivers: u64,
}

impl Fanned {
    /// Records the fan-out in the metrics and wakes the backfills waiting for the epoch's
    /// first entries.
    fn record(self, th: &ThreadHub, thread: &ThreadId) {
        let Some(oldest) = self.frames.first() else {
            return;
        };
        // The tail's lag, once per batch, from its oldest new entry: the memory log's ids carry
        // no time (0), Redis ids carry the server's clock in milliseconds.
        if oldest.id.pos.ms > 0 {
            m::record_append_to_read(oldest.id.pos.ms);
        }
        if self.cursor_before == StreamPos::ZERO {
            // The epoch's first entries: a backfill waiting for them can build its prelude.
            th.first_entries.notify_waiters();
        }
        if self.written > 0 {
            m::record_publish_to_writes(self.born, self.written);
        }
        if self.resets > 0 {
            tracing::debug!(%thread, resets = self.resets, "slow subscribers reset to a snapshot");
            metrics::counter!(m::RESETS, "cause" => "overflow").increment(self.resets);
        }
        if self.overflowed > 0 {
            tracing::info!(%thread, overflowed = self.overflowed, "slow subscribers disconnected (queue full, no bridge possible)");
            metrics::counter!(m::DISCONNECTS, "cause" => CloseReason::Overflow.as_str())
                .increment(self.overflowed);
        }
        if self.receivers > 0 {
            static DELIVERED: m::CounterTable =
                m::CounterTable::new(m::DELIVERED, "type", EventType::NAMES);
            for f in &self.frames {
                DELIVERED.increment(f.event_type as usize, self.receivers);
            }
        }
    }
}

/// Event types that never change the order state (open constructs, run, owners): frames of
/// these share the previous view unless a chunk lane is open (any event may close a lane).
fn keeps_view(t: EventType) -> bool {
    matches!(
        t,
        EventType::TextMessageContent
            | EventType::ToolCallArgs
            | EventType::ReasoningMessageContent
            | EventType::StateDelta
            | EventType::StateSnapshot
            | EventType::Raw
            | EventType::Custom
    )
}

/// Folds one event into the thread's fold (when known) and returns its merge key; updates the
/// shared view when the event changed the order state.
fn fold_event(st: &mut ThreadState, thread: &ThreadId, t: EventType, v: &dyn AsEvent) -> MergeKey {
    let Some(fold) = st.fold.as_mut() else {
        return MergeKey::of_event(t, v, false, None);
    };
    let lanes_before = !fold.checker().open_lanes().is_empty();
    let (clean, state_after) = match fold.apply_logged(v) {
        Ok(applied) => {
            let failed = applied
                .iter()
                .any(|a| matches!(a, Applied::StateDelta(Err(_))));
            let state = failed.then(|| Arc::new(fold.fold().state().clone()));
            (!failed, state)
        }
        Err(violation) => {
            // Logged at the thread's 1st, 2nd, 4th, 8th... skip: with order checks off a
            // producer's every out-of-order event would be a line on every node.
            let skipped = fold.skipped();
            if skipped.is_power_of_two() {
                tracing::warn!(%thread, rule = violation.rule, skipped, "log event breaks the AG-UI order rules; not folded (logged at the 1st, 2nd, 4th, ... such event of the thread)");
            }
            (false, Some(Arc::new(fold.fold().state().clone())))
        }
    };
    if !keeps_view(t) || lanes_before || !fold.checker().open_lanes().is_empty() {
        st.view = Some(Arc::new(fold.checker().clone()));
    }
    MergeKey::of_event(t, v, clean, state_after)
}
