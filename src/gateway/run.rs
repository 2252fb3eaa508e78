//! One gateway run's task (PROTOCOL §11 "Run lifecycle"): the upstream request, each batch of
//! the agent's events checked and appended to the thread as it arrives, each appended event's
//! frame handed to the caller, and the run's end: the agent's terminal event, or a `RUN_ERROR`
//! the broker appends naming why (upstream failure, cancel, shutdown).
//!
//! What the broker checks beyond a publish's rules, because the run is its to end: the
//! agent's first event is the requested run's `RUN_STARTED` (the broker adds the `input` echo
//! when it has none), no second `RUN_STARTED` follows, `RUN_FINISHED` names the same run. A
//! `RUN_ERROR` is allowed with anything open (AGUI.md §5), so the broker's `RUN_ERROR` needs
//! nothing closed before it, and the thread's next `RUN_STARTED` starts afresh.

use super::caller::CallerTx;
use super::upstream::{Agent, Cause, Events, Failure};
use super::{Ended, Outcome, Registration, RunInput, Shared};
use crate::event::order::rule::{RUN_ALREADY_ERRORED, RUN_ALREADY_FINISHED};
use crate::event::{EventType, ThreadId, ValidEvent, validate_event, validate_value};
use crate::fold::{Rejection, RunStatus};
use crate::ingest::{IngestError, Producer};
use crate::log::{EventId, LogError, ReadFrom};
use crate::metrics as m;
use crate::sse;
use eventsource_stream::Event;
use futures::{FutureExt, StreamExt};
use hyper::http::HeaderMap;
use serde_json::{Map, Value, json};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::time::error::Elapsed;
use tokio_util::sync::CancellationToken;

/// Most events appended in one step: what the agent sent at once.
pub(super) const BATCH: usize = 256;
/// Appends retried when the log backend fails (with the same producer numbers, so a retry of
/// an append that did happen is not appended twice), 200 ms, 400 ms, ... apart (6 s in all).
const APPEND_RETRIES: u32 = 5;
/// Entries read when another producer ended the run, to find its terminal event.
const FOREIGN_READ: usize = 512;

/// A `RUN_ERROR` the broker appends for run `run_id`: its `code` names why, and the run's id
/// goes under the broker's metadata key (`RUN_ERROR` has no `runId` in AG-UI 1.0), as the
/// orphan sweep's does.
pub(super) fn run_error(code: &str, message: &str, run_id: &str) -> Value {
    json!({
        "type": "RUN_ERROR", "message": message, "code": code,
        "metadata": {"agui-fanout": {"runId": run_id}}
    })
}

/// An event the broker writes itself, as a [`ValidEvent`] for `thread`.
pub(super) fn broker_event(event: Value, thread: &ThreadId) -> ValidEvent {
    // Invariant: the broker's `RUN_STARTED` and `RUN_ERROR` are built from strings the schema
    // already accepted (the input's ids and messages) and constant codes.
    validate_value(event, Some(thread)).expect("the broker's own events pass the schema")
}

/// Why the run's loop stopped.
enum Stop {
    /// The agent's terminal event was appended.
    Ended(Outcome),
    /// The upstream failed.
    Fail(Failure),
    /// Cancelled (a cancel request, or the caller left under `on_disconnect = "cancel"`).
    Cancelled,
    /// The node is stopping.
    Shutdown,
    /// The run's `RUN_STARTED` was refused: the thread has another active run.
    Refused,
    /// Another producer ended the run (a cancel through another node, say).
    EndedElsewhere,
    /// The log backend kept failing.
    LogDown(LogError),
}

/// A batch of the agent's events, checked, with how it ends the run.
#[derive(Default)]
struct Prepared {
    batch: Vec<ValidEvent>,
    /// Set when the batch ends with the run's terminal event.
    terminal: Option<Outcome>,
    /// Set when the agent's stream failed after `batch`.
    failure: Option<Failure>,
}

/// One run, owned by its task.
pub(super) struct RunTask {
    shared: Arc<Shared>,
    agent: Arc<Agent>,
    input: RunInput,
    /// Ids of the input's messages the thread lacked when the run was accepted.
    missing: Vec<String>,
    caller_headers: HeaderMap,
    caller: CallerTx,
    cancel: CancellationToken,
    ended: watch::Sender<Option<Ended>>,
    /// Taken (the thread's entry removed) as soon as the run has ended, before the caller's
    /// stream ends: a caller that starts its next turn when the answer ends must not meet
    /// this run's entry (409). Fields drop in declaration order, `caller` before this one.
    registration: Option<Registration>,
    /// The producer number of the last event appended (the run id is the producer id).
    seq: u64,
    /// The run's `RUN_STARTED` is in the log.
    started: bool,
    last_id: Option<EventId>,
    /// The last event of another producer seen after `last_id` that did not end the run.
    foreign_seen: Option<EventId>,
}

impl RunTask {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        shared: Arc<Shared>,
        agent: Arc<Agent>,
        input: RunInput,
        missing: Vec<String>,
        caller_headers: HeaderMap,
        caller: CallerTx,
        cancel: CancellationToken,
        ended: watch::Sender<Option<Ended>>,
        registration: Registration,
    ) -> Self {
        RunTask {
            shared,
            agent,
            input,
            missing,
            caller_headers,
            caller,
            cancel,
            ended,
            registration: Some(registration),
            seq: 0,
            started: false,
            last_id: None,
            foreign_seen: None,
        }
    }

    /// Runs to the end, then tells a waiting cancel how it ended. The caller's stream ends
    /// when this returns (the channel is dropped).
    pub(super) async fn run(mut self) {
        let begun = Instant::now();
        metrics::gauge!(m::RUNS_ACTIVE).increment(1.0);
        let stop = self.drive().await;
        let outcome = self.finish(stop).await;
        drop(self.registration.take());
        metrics::gauge!(m::RUNS_ACTIVE).decrement(1.0);
        if let Some(outcome) = outcome {
            metrics::counter!(m::RUNS_ENDED, "outcome" => outcome.as_str()).increment(1);
            metrics::histogram!(m::RUN_DURATION).record(begun.elapsed().as_secs_f64());
            tracing::info!(
                thread = %self.input.thread, run = %self.input.run_id, agent = %self.agent.name,
                outcome = outcome.as_str(), "gateway run ended"
            );
        }
        let _ = self.ended.send(Some(Ended {
            outcome: outcome.unwrap_or(Outcome::Abandoned),
            last_id: self.last_id,
        }));
    }

    /// The upstream request, then batch after batch until the run's end.
    async fn drive(&mut self) -> Stop {
        let agent = self.agent.clone();
        let idle = agent.idle_timeout();
        let max_event = self.shared.limits.max_event_bytes;
        let open = agent.open(&self.input.value, &self.caller_headers, max_event);
        let mut events: Events = match self.interruptible(tokio::time::timeout(idle, open)).await {
            Err(stop) => return stop,
            Ok(Err(_)) => return Stop::Fail(silent(idle, "did not answer")),
            Ok(Ok(Err(failure))) => return Stop::Fail(failure),
            Ok(Ok(Ok(events))) => events,
        };
        loop {
            let first = match self.next_event(&mut events, idle).await {
                Err(stop) => return stop,
                Ok(Err(_)) => return Stop::Fail(silent(idle, "sent no event")),
                Ok(Ok(None)) => {
                    return Stop::Fail(Failure::new(
                        Cause::Disconnected,
                        "the agent's stream ended before the run's terminal event",
                    ));
                }
                Ok(Ok(Some(item))) => item,
            };
            let mut items = vec![first];
            while items.len() < self.shared.limits.batch {
                match events.next().now_or_never() {
                    Some(Some(item)) => items.push(item),
                    _ => break,
                }
            }
            let prepared = self.prepare(items);
            // In batches a subscriber's queue takes whole (`queue.max_bytes`).
            for piece in self.shared.ingest.pieces(&prepared.batch) {
                if let Err(stop) = self.append(piece).await {
                    return stop;
                }
            }
            if let Some(outcome) = prepared.terminal {
                return Stop::Ended(outcome);
            }
            if let Some(failure) = prepared.failure {
                return Stop::Fail(failure);
            }
            if self.agent.cancels_on_disconnect() && self.caller.gone() {
                return Stop::Cancelled;
            }
        }
    }

    /// The agent's next event, waited for at most `idle`. Meanwhile, once the run is in the
    /// log, every `redis_block` checks whether another producer ended it (a cancel through
    /// another node), so that the upstream request is aborted then and not at its next event.
    async fn next_event(
        &mut self,
        events: &mut Events,
        idle: Duration,
    ) -> Result<Result<Option<Result<Event, Failure>>, Elapsed>, Stop> {
        let deadline = tokio::time::Instant::now() + idle;
        loop {
            let watch = tokio::time::sleep(self.shared.limits.watch_every);
            let started = self.started;
            let waited = self
                .interruptible(async {
                    tokio::select! {
                        r = tokio::time::timeout_at(deadline, events.next()) => Some(r),
                        _ = watch, if started => None,
                    }
                })
                .await?;
            match waited {
                Some(r) => return Ok(r),
                None if self.ended_elsewhere().await => return Err(Stop::EndedElsewhere),
                None => {}
            }
        }
    }

    /// Whether another producer appended the run's terminal event after its last event.
    /// Events of others that do not end it are skipped from then on.
    async fn ended_elsewhere(&mut self) -> bool {
        let Some(from) = self.foreign_seen.or(self.last_id) else {
            return false;
        };
        let log = &self.shared.log;
        match log.head(&self.input.thread).await {
            Ok(head) if head.last_id() != Some(from) => {}
            _ => return false,
        }
        let Ok(entries) = log
            .read(&self.input.thread, ReadFrom::After(from), FOREIGN_READ)
            .await
        else {
            return false;
        };
        if entries
            .iter()
            .any(|e| matches!(e.event_type, EventType::RunFinished | EventType::RunError))
        {
            return true;
        }
        self.foreign_seen = entries.last().map(|e| e.id).or(self.foreign_seen);
        false
    }

    /// Awaits `fut` unless the node stops, the run is cancelled, or (under
    /// `on_disconnect = "cancel"`) the caller leaves: dropping `fut` then aborts the upstream
    /// request.
    async fn interruptible<T>(&self, fut: impl Future<Output = T>) -> Result<T, Stop> {
        let leaves = self.agent.cancels_on_disconnect();
        tokio::select! {
            biased;
            _ = self.shared.stop.cancelled() => Err(Stop::Shutdown),
            _ = self.cancel.cancelled() => Err(Stop::Cancelled),
            _ = self.caller.closed(), if leaves => Err(Stop::Cancelled),
            r = fut => Ok(r),
        }
    }

    /// Checks what the agent sent at once: each event's schema (as for a publish) and the
    /// run's own rules (module docs). Stops at the run's terminal event or the first failure.
    fn prepare(&self, items: Vec<Result<Event, Failure>>) -> Prepared {
        let mut out = Prepared::default();
        let mut started = self.started;
        for item in items {
            let data = match item {
                Ok(event) => event.data,
                Err(failure) => {
                    out.failure = Some(failure);
                    break;
                }
            };
            if data.is_empty() {
                continue;
            }
            let checked = if data.len() > self.shared.limits.max_event_bytes {
                Err(Failure::new(
                    Cause::Invalid,
                    format!(
                        "the agent sent an event larger than {} bytes",
                        self.shared.limits.max_event_bytes
                    ),
                ))
            } else {
                validate_event(data.as_bytes(), Some(&self.input.thread))
                    .map_err(|e| {
                        Failure::new(
                            Cause::Invalid,
                            format!("the agent sent an invalid event: {e}"),
                        )
                    })
                    .and_then(|ev| self.check_own(ev, &mut started, &mut out.terminal))
            };
            match checked {
                Ok(ev) => out.batch.push(ev),
                Err(failure) => {
                    out.failure = Some(failure);
                    break;
                }
            }
            if out.terminal.is_some() {
                break;
            }
        }
        out
    }

    /// The run's own rules for one schema-valid event; adds the `input` echo to a
    /// `RUN_STARTED` without one.
    fn check_own(
        &self,
        ev: ValidEvent,
        started: &mut bool,
        terminal: &mut Option<Outcome>,
    ) -> Result<ValidEvent, Failure> {
        let invalid = |m: String| Failure::new(Cause::Invalid, m);
        // Only the run's own events carry a `runId`: a content delta keeps its value unparsed.
        let is_run_event = matches!(
            ev.event_type,
            EventType::RunStarted | EventType::RunFinished | EventType::RunError
        );
        let run_id = is_run_event
            .then(|| ev.parsed().get("runId").and_then(Value::as_str))
            .flatten();
        let same_run = run_id == Some(self.input.run_id.as_str());
        match ev.event_type {
            EventType::RunStarted if *started => {
                return Err(invalid(
                    "the agent sent a second RUN_STARTED in one run".into(),
                ));
            }
            EventType::RunStarted if !same_run => {
                return Err(invalid(format!(
                    "the agent's RUN_STARTED names run {:?}, not the requested {:?}",
                    run_id.unwrap_or_default(),
                    self.input.run_id
                )));
            }
            EventType::RunStarted => {
                *started = true;
                if ev.parsed().get("input").is_none() {
                    let mut value = (**ev.parsed()).clone();
                    if let Some(obj) = value.as_object_mut() {
                        obj.insert("input".into(), self.input.echo(&self.missing));
                    }
                    return validate_value(value, Some(&self.input.thread))
                        .map_err(|e| invalid(format!("RUN_STARTED with the input echo: {e}")));
                }
            }
            t if !*started => {
                return Err(invalid(format!(
                    "the agent's first event is {}, not RUN_STARTED",
                    t.as_str()
                )));
            }
            EventType::RunFinished if !same_run => {
                return Err(invalid(format!(
                    "the agent's RUN_FINISHED names run {:?}, not {:?}",
                    run_id.unwrap_or_default(),
                    self.input.run_id
                )));
            }
            EventType::RunFinished => {
                let interrupt = ev.parsed()["outcome"]["type"] == "interrupt";
                *terminal = Some(if interrupt {
                    Outcome::Interrupted
                } else {
                    Outcome::Finished
                });
            }
            EventType::RunError => *terminal = Some(Outcome::Error),
            _ => {}
        }
        Ok(ev)
    }

    /// Appends `batch` (the run id as producer id, numbered on from the run's last event) and
    /// hands each appended event's frame to the caller. A backend failure is retried with the
    /// same numbers.
    async fn append(&mut self, batch: &[ValidEvent]) -> Result<(), Stop> {
        let mut attempt = 0;
        loop {
            let producer = Producer {
                id: self.input.run_id.clone(),
                seq: self.seq + 1,
            };
            let result = self
                .shared
                .ingest
                .append(&self.input.thread, batch, Some(&producer))
                .await;
            match result {
                Ok(appended) => {
                    self.seq += batch.len() as u64;
                    if batch.iter().any(|e| e.event_type == EventType::RunStarted) {
                        self.started = true;
                        metrics::counter!(m::RUNS_STARTED).increment(1);
                    }
                    // Leading duplicates were appended by an attempt whose answer was lost;
                    // their ids are not known here, so the caller does not get them.
                    let fresh = &batch[appended.duplicates..];
                    for (ev, id) in fresh.iter().zip(&appended.ids) {
                        metrics::counter!(m::PUBLISHED, "type" => ev.event_type.as_str())
                            .increment(1);
                        self.caller
                            .frame(sse::encode_event(&id.to_string(), &ev.json));
                    }
                    self.last_id = appended.ids.last().copied().or(self.last_id);
                    return Ok(());
                }
                Err(IngestError::Rejected(rejection)) => {
                    return Err(Box::pin(self.rejected(batch, rejection)).await);
                }
                Err(e) if attempt < APPEND_RETRIES => {
                    attempt += 1;
                    tracing::warn!(thread = %self.input.thread, error = %e, attempt, "gateway append failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(IngestError::Log(e)) => return Err(Stop::LogDown(e)),
                Err(e) => return Err(Stop::LogDown(LogError::Unavailable(e.to_string()))),
            }
        }
    }

    /// What an order or state rejection of the agent's batch means: another run holds the
    /// thread (`RUN_STARTED` refused), another producer ended this run, or the agent broke
    /// the rules (what comes before the offending event is appended, then the run fails).
    async fn rejected(&mut self, batch: &[ValidEvent], rejection: Rejection) -> Stop {
        let index = rejection.index();
        if let Rejection::Order { violation, .. } = &rejection
            && index == 0
        {
            if !self.started && super::is_run_active_rule(violation.rule) {
                return Stop::Refused;
            }
            if self.started && [RUN_ALREADY_ERRORED, RUN_ALREADY_FINISHED].contains(&violation.rule)
            {
                return Stop::EndedElsewhere;
            }
        }
        if index > 0
            && let Err(stop) = self.append(&batch[..index]).await
        {
            return stop;
        }
        let ev = &batch[index.min(batch.len() - 1)];
        let message = match rejection {
            Rejection::Order { violation, .. } => format!(
                "the agent's {} breaks the AG-UI order rules ({}): {}",
                ev.event_type.as_str(),
                violation.rule,
                violation.message
            ),
            Rejection::Patch { error, .. } => format!(
                "the agent's STATE_DELTA does not apply to the thread's state (operation {}): {}",
                error.op_index, error.message
            ),
            Rejection::Ambiguous { error, .. } => {
                format!(
                    "the agent's STATE_DELTA has a path JSON Patch clients disagree on: {error}"
                )
            }
        };
        Stop::Fail(Failure::new(Cause::Invalid, message))
    }

    /// Ends the run as `stop` says; `None` when it never started (refused).
    async fn finish(&mut self, stop: Stop) -> Option<Outcome> {
        match stop {
            Stop::Ended(outcome) => Some(outcome),
            Stop::Fail(failure) => {
                metrics::counter!(m::UPSTREAM_ERRORS, "cause" => failure.cause.code()).increment(1);
                tracing::info!(
                    thread = %self.input.thread, run = %self.input.run_id, agent = %self.agent.name,
                    cause = failure.cause.code(), message = %failure.message, "gateway upstream failed"
                );
                let code = failure.cause.code();
                self.close(code, &failure.message, Outcome::Failed).await
            }
            Stop::Cancelled => {
                self.close("cancelled", "the run was cancelled", Outcome::Cancelled)
                    .await
            }
            Stop::Shutdown => {
                let message = "the broker node stopped during the run";
                self.close("broker_shutdown", message, Outcome::Shutdown)
                    .await
            }
            Stop::Refused => {
                self.refuse().await;
                None
            }
            Stop::EndedElsewhere => Some(self.forward_foreign_end().await),
            Stop::LogDown(e) => {
                tracing::warn!(
                    thread = %self.input.thread, run = %self.input.run_id, error = %e,
                    "gateway run abandoned: the log backend failed"
                );
                Some(Outcome::Abandoned)
            }
        }
    }

    /// Appends the broker's `RUN_ERROR` (`code`, `message`), after the run's `RUN_STARTED`
    /// when the agent never sent one, so the caller's stream and the thread end in order.
    async fn close(&mut self, code: &str, message: &str, outcome: Outcome) -> Option<Outcome> {
        let mut events = Vec::with_capacity(2);
        if !self.started {
            events.push(self.broker_run_started());
        }
        events.push(run_error(code, message, &self.input.run_id));
        let valid: Vec<ValidEvent> = events
            .into_iter()
            .map(|e| broker_event(e, &self.input.thread))
            .collect();
        match self.append(&valid).await {
            Ok(()) => Some(outcome),
            Err(Stop::Refused) => {
                self.refuse().await;
                None
            }
            Err(Stop::EndedElsewhere) => Some(self.forward_foreign_end().await),
            Err(_) => Some(Outcome::Abandoned),
        }
    }

    /// The run's `RUN_STARTED` as the broker writes it: the requested ids, `parentRunId` when
    /// asked for, and the input echo.
    fn broker_run_started(&self) -> Value {
        let mut ev = Map::new();
        ev.insert("type".into(), "RUN_STARTED".into());
        ev.insert("threadId".into(), self.input.thread.as_str().into());
        ev.insert("runId".into(), self.input.run_id.clone().into());
        if let Some(parent) = self.input.value.get("parentRunId") {
            ev.insert("parentRunId".into(), parent.clone());
        }
        ev.insert("input".into(), self.input.echo(&self.missing));
        Value::Object(ev)
    }

    /// Tells the caller that the thread has another active run (named when it can be read).
    async fn refuse(&mut self) {
        let active = self
            .shared
            .ingest
            .with_latest_fold(&self.input.thread, |fold| {
                fold.fold()
                    .run()
                    .filter(|r| r.status == RunStatus::Running)
                    .and_then(|r| r.run_id().map(str::to_string))
            })
            .await
            .ok()
            .flatten()
            .flatten();
        self.caller.refuse(active);
    }

    /// Another producer ended the run: the caller gets what was appended after the run's own
    /// last event, up to that terminal event; the outcome is the terminal event's.
    async fn forward_foreign_end(&mut self) -> Outcome {
        let Some(after) = self.last_id else {
            return Outcome::Abandoned;
        };
        let read = self
            .shared
            .log
            .read(&self.input.thread, ReadFrom::After(after), FOREIGN_READ)
            .await;
        for entry in read.unwrap_or_default() {
            self.caller
                .frame(sse::encode_event(&entry.id.to_string(), &entry.json));
            self.last_id = Some(entry.id);
            match entry.event_type {
                EventType::RunFinished => return Outcome::Finished,
                EventType::RunError => {
                    let cancelled = serde_json::from_slice::<Value>(&entry.json)
                        .is_ok_and(|v| v["code"] == "cancelled");
                    return if cancelled {
                        Outcome::Cancelled
                    } else {
                        Outcome::Error
                    };
                }
                _ => {}
            }
        }
        Outcome::Error
    }
}

/// The failure of an agent silent for `idle` (`upstream_timeout`).
fn silent(idle: Duration, what: &str) -> Failure {
    Failure::new(
        Cause::Timeout,
        format!(
            "the agent {what} within idle_timeout ({})",
            humantime::format_duration(idle)
        ),
    )
}
