//! A thread's fold together with its order state: what the broker knows about a thread at a
//! log position, for publish-time order validation (PROTOCOL §2) and for preludes and resets
//! (PROTOCOL §5). One [`ThreadFold`] per followed thread in the hub, one per thread with recent
//! publishes in the ingest cache.

use super::{AmbiguousPath, Applied, DeltaRefusal, Fold, PatchError, patch};
use crate::event::order::{OrderChecker, OrderViolation};
use crate::event::{AsEvent, Fields};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

/// How many ended runs keep their terminal event, so a reset can finish a client's run with
/// its real `RUN_FINISHED`/`RUN_ERROR` after later runs started.
const ENDED_RUNS_KEPT: usize = 32;

/// The fold of a thread's log up to a position, with the `@ag-ui/client` order state.
///
/// `Clone` is a deep copy of the fold and a cheap copy of the order state (shared events).
#[derive(Clone, Debug, Default)]
pub struct ThreadFold {
    checker: OrderChecker,
    fold: Fold,
    /// `(runId, terminal event)` of recently ended runs, oldest first.
    ended_runs: VecDeque<(String, Arc<Value>)>,
    /// Log events that broke the order rules (possible only when producers write to Redis
    /// directly or `strict_order` is off); they were skipped by the fold.
    skipped: u64,
}

/// Why a batch cannot be appended on top of a [`ThreadFold`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Rejection {
    /// Event `index` breaks an `@ag-ui/client` order rule (HTTP 409).
    #[error("event {index}: {violation}")]
    Order {
        /// Index in the batch.
        index: usize,
        /// The rule broken.
        violation: OrderViolation,
    },
    /// Event `index` is a `STATE_DELTA` whose operation `error.op_index` does not apply to
    /// the folded state (HTTP 422).
    #[error("event {index}: {error}")]
    Patch {
        /// Index in the batch.
        index: usize,
        /// The failing operation.
        error: PatchError,
    },
    /// Event `index` is a `STATE_DELTA` or `ACTIVITY_DELTA` with an operation whose `path`
    /// or `from` JSON Patch clients disagree on (HTTP 422; PROTOCOL §2 "Portable patch paths").
    #[error("event {index}: {error}")]
    Ambiguous {
        /// Index in the batch.
        index: usize,
        /// The event's member holding the patch: `delta` (`STATE_DELTA`) or `patch`
        /// (`ACTIVITY_DELTA`).
        patch: &'static str,
        /// The operation and its pointer.
        error: AmbiguousPath,
    },
}

/// The order state a batch leaves, as [`ThreadFold::check_batch_only`] found it, so that
/// [`ThreadFold::apply_checked`] takes it instead of checking the batch a second time.
#[derive(Clone, Debug)]
pub enum OrderAfter {
    /// No event changed the order state (token deltas, state deltas, ...).
    Unchanged,
    /// The order state after the batch; every event expanded to itself (no chunk, no chunk
    /// lane closed), so the fold takes the events as they are.
    Changed(Box<OrderChecker>),
    /// An event expanded to others (a chunk, or a lane it closed): the fold checks the batch
    /// again to get them.
    Expanded,
}

impl Rejection {
    /// The index in the batch of the refused event.
    pub fn index(&self) -> usize {
        match self {
            Rejection::Order { index, .. }
            | Rejection::Patch { index, .. }
            | Rejection::Ambiguous { index, .. } => *index,
        }
    }

    /// The refused event's index, to shift it (a caller that checked part of a batch).
    pub fn index_mut(&mut self) -> &mut usize {
        match self {
            Rejection::Order { index, .. }
            | Rejection::Patch { index, .. }
            | Rejection::Ambiguous { index, .. } => index,
        }
    }

    /// The rejection of event `index`, an `ACTIVITY_DELTA` with an ambiguous pointer.
    fn activity(index: usize, error: AmbiguousPath) -> Self {
        Rejection::Ambiguous {
            index,
            patch: "patch",
            error,
        }
    }

    /// The rejection of event `index` for a `STATE_DELTA` refused as `refusal` says.
    fn delta(index: usize, refusal: DeltaRefusal) -> Self {
        match refusal {
            DeltaRefusal::NotApplicable(error) => Rejection::Patch { index, error },
            DeltaRefusal::Ambiguous(error) => Rejection::Ambiguous {
                index,
                patch: "delta",
                error,
            },
        }
    }
}

impl ThreadFold {
    /// The fold of an empty thread.
    pub fn new() -> Self {
        Self::default()
    }

    /// The reducer's view (state, messages, run).
    pub fn fold(&self) -> &Fold {
        &self.fold
    }

    /// The order state after the last event (open constructs, run status, chunk lanes).
    pub fn checker(&self) -> &OrderChecker {
        &self.checker
    }

    /// Log events skipped because they broke the order rules.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The terminal event of a recently ended run, by `runId`.
    pub fn ended_run(&self, run_id: &str) -> Option<&Arc<Value>> {
        self.ended_runs
            .iter()
            .rev()
            .find(|(id, _)| id == run_id)
            .map(|(_, e)| e)
    }

    /// Starts a fresh order state (a new HTTP response to a client: `@ag-ui/client` makes a
    /// new verifier and chunk transformer per response) while state and messages carry over.
    pub fn reset_order(&mut self) {
        self.checker = OrderChecker::new();
    }

    /// Folds one event read from the log. An event that breaks the order rules is skipped
    /// (returns `Err`) and leaves everything unchanged, as a client would fail on it.
    ///
    /// # Errors
    /// The order violation, for the caller's log line and metric.
    pub fn apply_logged<E: AsEvent + ?Sized>(
        &mut self,
        event: &E,
    ) -> Result<Vec<Applied>, OrderViolation> {
        // Content and state deltas, most of a log: checked on the order state as it is, with
        // no expansion (no lane open) and nothing recorded; never a run's end. A content delta
        // read without a value is checked and folded from its fields.
        if let Some(content) = event.content()
            && let Some(checked) = self.checker.check_content(content)
        {
            if let Err(v) = checked {
                self.skipped += 1;
                return Err(v);
            }
            return Ok(vec![self.fold.content(content)]);
        }
        let event = event.as_value();
        if let Some(checked) = self.checker.check_unchanged(event) {
            if let Err(v) = checked {
                self.skipped += 1;
                return Err(v);
            }
            return Ok(vec![self.fold.apply(event)]);
        }
        let expanded = match self.checker.check_expanded(event) {
            Ok(e) => e,
            Err(v) => {
                self.skipped += 1;
                return Err(v);
            }
        };
        let mut out = Vec::with_capacity(expanded.len());
        for ev in &expanded {
            out.push(self.fold.apply(ev));
            self.note_run_end(ev);
        }
        Ok(out)
    }

    fn note_run_end(&mut self, ev: &Value) {
        let t = ev.field("type").and_then(Value::as_str);
        if !matches!(t, Some("RUN_FINISHED") | Some("RUN_ERROR")) {
            return;
        }
        if let Some(run_id) = self.fold.run().and_then(|r| r.run_id()).map(str::to_owned) {
            if self.ended_runs.len() == ENDED_RUNS_KEPT {
                self.ended_runs.pop_front();
            }
            self.ended_runs.push_back((run_id, Arc::new(ev.clone())));
        }
    }

    /// [`Self::check_batch`] without building the fold after the batch: the order state is
    /// checked on a copy (its open constructs and the run's owner maps), copied only at the
    /// first event that changes it, and the batch's `STATE_DELTA`s are tried on the fold's own
    /// state and taken back ([`patch::Trial`]), so a publish costs O(order state + the
    /// deltas' operations) rather than a copy of the thread or of its state. Once the batch is
    /// appended, [`Self::apply_checked`] folds it in place.
    ///
    /// `self` is as it was on return, whatever the outcome (the state byte for byte, key order
    /// included). Returns the order state the batch leaves, for [`Self::apply_checked`].
    ///
    /// # Errors
    /// As [`Self::check_batch`].
    pub fn check_batch_only<'a, E: AsEvent + ?Sized + 'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a E>,
    ) -> Result<OrderAfter, Rejection> {
        // Taken out for the check, so that the rest of the fold can be read while it is
        // patched, and put back as it was.
        let mut own = std::mem::take(self.fold.state_mut());
        let mut trial = patch::Trial::new();
        let checked = self.check_on(events, &mut own, &mut trial);
        trial.undo(&mut own);
        *self.fold.state_mut() = own;
        checked
    }

    /// [`Self::check_batch_only`] with the fold's state (`own`, taken out of it) patched under
    /// `trial`.
    fn check_on<'a, E: AsEvent + ?Sized + 'a>(
        &self,
        events: impl IntoIterator<Item = &'a E>,
        own: &mut Value,
        trial: &mut patch::Trial,
    ) -> Result<OrderAfter, Rejection> {
        // The order state as the batch leaves it, copied at the first event that may change
        // it: until then (token deltas, state deltas) each event is checked on the fold's own.
        let mut checker: Option<OrderChecker> = None;
        // The state as the batch leaves it once a snapshot in the batch replaced the fold's
        // (the snapshot's copy); until then the deltas go on `own`, under `trial`.
        let mut state: Option<Value> = None;
        // The messages as the batch leaves them, once an `ACTIVITY_DELTA` needs its activity's
        // content (the fold copied at the first one); the message snapshots before it wait.
        let mut messages: Option<Fold> = None;
        let mut snapshots: Vec<Value> = Vec::new();
        // Whether every event checked on the copy expanded to itself.
        let mut as_sent = true;
        for (index, event) in events.into_iter().enumerate() {
            let refused = |violation| Rejection::Order { index, violation };
            // A content delta read without a value changes no order state and nothing this
            // check tracks: checked from its fields, on the copy when there is one.
            if let Some(content) = event.content()
                && let Some(checked) = checker
                    .as_ref()
                    .unwrap_or(&self.checker)
                    .check_content(content)
            {
                checked.map_err(refused)?;
                continue;
            }
            let event = event.as_value();
            let unchanged = match &checker {
                None => self.checker.check_unchanged(event),
                Some(_) => None,
            };
            // One event on the copy-free branch: a slice of it, not a one-item `Vec` (an
            // allocation per token delta).
            let single: [Cow<'_, Value>; 1];
            let many: Vec<Cow<'_, Value>>;
            let expanded: &[Cow<'_, Value>] = match unchanged {
                Some(checked) => {
                    checked.map_err(refused)?;
                    single = [Cow::Borrowed(event)];
                    &single
                }
                None => {
                    many = checker
                        .get_or_insert_with(|| self.checker.clone())
                        .check_expanded(event)
                        .map_err(refused)?;
                    as_sent &= matches!(many.as_slice(), [Cow::Borrowed(one)] if std::ptr::eq(*one, event));
                    &many
                }
            };
            for ev in expanded {
                match ev.field("type").and_then(Value::as_str) {
                    // As `Fold::apply`: a snapshot without `snapshot` changes nothing.
                    Some("STATE_SNAPSHOT") => {
                        if let Some(snapshot) = ev.field("snapshot") {
                            state = Some(snapshot.clone());
                        }
                    }
                    Some("STATE_DELTA") => {
                        let tried = match state.as_mut() {
                            // The snapshot's copy is the check's own: patched directly, its
                            // writes are not the trial's to take back on `own`.
                            Some(copy) => super::apply_state_delta_portable(copy, ev),
                            None => super::try_state_delta(own, ev, trial),
                        };
                        tried.map_err(|refusal| Rejection::delta(index, refusal))?;
                    }
                    Some("ACTIVITY_SNAPSHOT" | "MESSAGES_SNAPSHOT") => match messages.as_mut() {
                        Some(fold) => {
                            fold.apply(ev);
                        }
                        None => snapshots.push(ev.clone().into_owned()),
                    },
                    Some("ACTIVITY_DELTA") => {
                        let fold = messages.get_or_insert_with(|| {
                            let mut fold = self.fold.clone();
                            for s in snapshots.drain(..) {
                                fold.apply(&s);
                            }
                            fold
                        });
                        fold.activity_delta_portable(ev)
                            .map_err(|error| Rejection::activity(index, error))?;
                    }
                    _ => {}
                }
            }
        }
        Ok(match checker {
            None => OrderAfter::Unchanged,
            Some(checker) if as_sent => OrderAfter::Changed(Box::new(checker)),
            Some(_) => OrderAfter::Expanded,
        })
    }

    /// Folds a batch that [`Self::check_batch_only`] accepted against this very fold (and
    /// that was then appended), taking the order state it found (`after`) rather than checking
    /// the batch again. When the batch's events expanded to others, they are checked again to
    /// get them: an event the order rules refuse then (the fold changed in between: a bug) is
    /// skipped and counted, as for the log.
    pub fn apply_checked<'a, E: AsEvent + ?Sized + 'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a E>,
        after: OrderAfter,
    ) {
        let checker = match after {
            OrderAfter::Unchanged => None,
            OrderAfter::Changed(checker) => Some(checker),
            OrderAfter::Expanded => return self.apply_checked_again(events),
        };
        for event in events {
            match event.content() {
                // Never a run's end.
                Some(content) => {
                    self.fold.content(content);
                }
                None => {
                    let event = event.as_value();
                    self.fold.apply(event);
                    self.note_run_end(event);
                }
            }
        }
        if let Some(checker) = checker {
            self.checker = *checker;
        }
    }

    /// [`Self::apply_checked`] of a batch whose events expanded to others: checked again to
    /// get them.
    fn apply_checked_again<'a, E: AsEvent + ?Sized + 'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a E>,
    ) {
        for event in events {
            if let Err(violation) = self.apply_logged(event) {
                tracing::error!(
                    rule = violation.rule,
                    "a checked event no longer folds; skipped"
                );
            }
        }
    }

    /// Folds a batch appended without order checks (`strict_order = false`) exactly as a
    /// reader of the log folds it ([`Self::apply_logged`]): events that break the order rules
    /// are skipped and counted, a `STATE_DELTA` that does not apply leaves the state as it was.
    pub fn apply_unchecked<'a, E: AsEvent + ?Sized + 'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a E>,
    ) {
        for event in events {
            let _ = self.apply_logged(event);
        }
    }

    /// Checks a batch against this fold (order rules, then `STATE_DELTA` applicability) and
    /// returns the fold after it. `self` is not changed.
    ///
    /// # Errors
    /// The first [`Rejection`]; nothing of the batch counts then.
    pub fn check_batch<'a, E: AsEvent + ?Sized + 'a>(
        &self,
        events: impl IntoIterator<Item = &'a E>,
    ) -> Result<ThreadFold, Rejection> {
        let mut next = self.clone();
        for (index, event) in events.into_iter().enumerate() {
            let event = event.as_value();
            let expanded = next
                .checker
                .check_expanded(event)
                .map_err(|violation| Rejection::Order { index, violation })?;
            for ev in &expanded {
                match ev.field("type").and_then(Value::as_str) {
                    Some("STATE_DELTA") => next
                        .fold
                        .state_delta_portable(ev)
                        .map_err(|refusal| Rejection::delta(index, refusal))?,
                    Some("ACTIVITY_DELTA") => {
                        next.fold
                            .activity_delta_portable(ev)
                            .map_err(|error| Rejection::activity(index, error))?;
                    }
                    _ => {
                        next.fold.apply(ev);
                    }
                }
                next.note_run_end(ev);
            }
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests;
