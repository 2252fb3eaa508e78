//! The AG-UI run gateway (PROTOCOL §11): `POST /v1/agents/{name}` runs a configured upstream
//! agent and appends its events to the run's thread through the same pipeline as a publish
//! ([`Ingest`]: schema, order rules, idempotency with the run id as producer id), while the
//! caller gets the run's events as appended.
//!
//! Data path position: beside a publish, above `ingest` (which it appends through) and
//! below `http` (which answers the caller): `http/agents` → **`gateway`** → `event` →
//! `ingest` → `log`.
//!
//! Layout: this file holds [`Gateway`] (the agents, the runs active on this node, start and
//! cancel); `input.rs` the `RunAgentInput` and its echo; `upstream.rs` the agent's HTTP
//! client and failure causes; `run.rs` a run's task (upstream → log → caller) and its end;
//! `caller.rs` the bounded channel to the caller's response.
//!
//! A run belongs to a task of its own, not to the caller's request: a caller that goes away
//! drops only its channel (`on_disconnect = "continue"`), or cancels the run (`"cancel"`).

mod caller;
pub mod input;
mod run;
pub mod upstream;

pub use caller::{First, RunStream};
pub use input::{InputError, RunInput};

use crate::config::Config;
use crate::event::ThreadId;
use crate::event::order::rule::RUN_ALREADY_ACTIVE;
use crate::fold::{RunStatus, ThreadFold};
use crate::ingest::{Ingest, IngestError};
use crate::log::{EventId, EventLog, LogError};
use crate::metrics as m;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use hyper::http::HeaderMap;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use upstream::Agent;

/// How long a cancel waits for the run's `RUN_ERROR` to be appended.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// How a run ended: the `outcome` label of `agui_runs_ended_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The agent's `RUN_FINISHED` (no `interrupt` outcome).
    Finished,
    /// The agent's `RUN_FINISHED` with an `interrupt` outcome: a next run resumes it.
    Interrupted,
    /// The agent's own `RUN_ERROR`.
    Error,
    /// The broker's `RUN_ERROR` for an upstream failure (the cause is in
    /// `agui_upstream_errors_total`).
    Failed,
    /// The broker's `RUN_ERROR` `cancelled` (a cancel, or the caller left under `cancel`).
    Cancelled,
    /// The broker's `RUN_ERROR` `broker_shutdown`: the node stopped during the run.
    Shutdown,
    /// The log backend failed: the run could not be ended in the log (an orphan).
    Abandoned,
}

impl Outcome {
    /// Every outcome, for describing metrics with zero series.
    pub const ALL: [Outcome; 7] = [
        Outcome::Finished,
        Outcome::Interrupted,
        Outcome::Error,
        Outcome::Failed,
        Outcome::Cancelled,
        Outcome::Shutdown,
        Outcome::Abandoned,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Finished => "finished",
            Outcome::Interrupted => "interrupted",
            Outcome::Error => "error",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Shutdown => "shutdown",
            Outcome::Abandoned => "abandoned",
        }
    }
}

/// How a run ended, as a cancel learns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// How.
    pub outcome: Outcome,
    /// The id of the run's last event in the log (its terminal event), if any was appended.
    pub last_id: Option<EventId>,
}

/// Why a run did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The thread has an active run (HTTP 409, naming it).
    #[error("thread {thread} has an active run ({run_id}); one run at a time")]
    RunActive {
        /// The thread.
        thread: ThreadId,
        /// The active run's `runId`.
        run_id: String,
    },
    /// The run id was used on this thread before (HTTP 409): its events would be taken for
    /// retries of that run's (PROTOCOL §2 idempotent retries) and not appended.
    #[error("runId {0} was already used on this thread; a new run needs a new runId")]
    RunIdUsed(String),
    /// The log backend failed (HTTP 503).
    #[error(transparent)]
    Log(#[from] LogError),
}

/// Why a cancel did not end a run.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    /// The run is not the thread's active run (HTTP 409); `active` names the active one.
    #[error("run {run_id} is not active on this thread")]
    NotActive {
        /// The run asked for.
        run_id: String,
        /// The thread's active run, if any.
        active: Option<String>,
    },
    /// The log backend failed (HTTP 503).
    #[error(transparent)]
    Log(#[from] LogError),
}

/// The run gateway of a node. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
}

struct Shared {
    agents: HashMap<String, Arc<Agent>>,
    ingest: Ingest,
    log: Arc<dyn EventLog>,
    /// Gateway runs active on this node, by thread (one run at a time per thread).
    runs: DashMap<ThreadId, Active>,
    limits: Limits,
    /// Cancelled when the node stops: every run ends with `RUN_ERROR` `broker_shutdown`.
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// Bounds a run works within, from the configuration.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_event_bytes: usize,
    /// Most events per append (a batch of what the agent sent at once).
    batch: usize,
    caller_events: usize,
    caller_bytes: usize,
    /// How often a run waiting for its agent checks whether another producer ended it
    /// (`redis_block`).
    watch_every: Duration,
}

/// A run active on this node.
struct Active {
    run_id: String,
    cancel: CancellationToken,
    ended: watch::Receiver<Option<Ended>>,
}

impl Gateway {
    /// The gateway of `config.agents`, appending through `ingest`.
    ///
    /// # Errors
    /// An agent whose client cannot be built (a header that does not resolve).
    pub fn new(config: &Config, ingest: Ingest, log: Arc<dyn EventLog>) -> Result<Self, String> {
        let agents = config
            .agents
            .iter()
            .map(|(name, c)| Agent::new(name, c).map(|a| (name.clone(), Arc::new(a))))
            .collect::<Result<_, _>>()?;
        let max_batch = match config.retention.max_events {
            0 => run::BATCH,
            n => run::BATCH.min(n.saturating_mul(2)),
        };
        Ok(Gateway {
            shared: Arc::new(Shared {
                agents,
                ingest,
                log,
                runs: DashMap::new(),
                limits: Limits {
                    max_event_bytes: config.limits.max_event_bytes,
                    batch: max_batch.max(1),
                    caller_events: config.queue.max_events,
                    caller_bytes: config.queue.max_bytes,
                    watch_every: config.redis_block,
                },
                stop: CancellationToken::new(),
                tasks: TaskTracker::new(),
            }),
        })
    }

    /// The agent configured as `name`.
    pub fn agent(&self, name: &str) -> Option<Arc<Agent>> {
        self.shared.agents.get(name).cloned()
    }

    /// Runs on this node right now.
    pub fn active_runs(&self) -> usize {
        self.shared.runs.len()
    }

    /// Starts a run of `agent` for `input` and returns the caller's stream of it. The thread
    /// must have no active run (on this node's gateway, or in the log at its latest position),
    /// and the run id must be new to the thread. `caller` holds the request headers that
    /// `forward_headers` may copy.
    ///
    /// # Errors
    /// [`StartError`].
    pub async fn start(
        &self,
        agent: Arc<Agent>,
        input: RunInput,
        caller: HeaderMap,
    ) -> Result<RunStream, StartError> {
        let thread = input.thread.clone();
        let (ended_tx, ended_rx) = watch::channel(None);
        // The run's own: a cancel (or its caller leaving under `cancel`), told apart from the
        // node stopping (`Shared::stop`).
        let cancel = CancellationToken::new();
        match self.shared.runs.entry(thread.clone()) {
            Entry::Occupied(active) => {
                return Err(StartError::RunActive {
                    thread,
                    run_id: active.get().run_id.clone(),
                });
            }
            Entry::Vacant(slot) => {
                slot.insert(Active {
                    run_id: input.run_id.clone(),
                    cancel: cancel.clone(),
                    ended: ended_rx,
                });
            }
        }
        let registration = Registration {
            shared: self.shared.clone(),
            thread: thread.clone(),
            run_id: input.run_id.clone(),
        };
        let missing = self.check_new_run(&input).await?;
        let (tx, rx) = caller::channel(
            self.shared.limits.caller_events,
            self.shared.limits.caller_bytes,
        );
        let task = run::RunTask::new(
            self.shared.clone(),
            agent,
            input,
            missing,
            caller,
            tx,
            cancel,
            ended_tx,
            registration,
        );
        self.shared.tasks.spawn(task.run());
        Ok(rx)
    }

    /// Checks a new run against the thread's fold at the log's latest position and returns
    /// the ids of the input's messages the thread does not hold (for the input echo).
    async fn check_new_run(&self, input: &RunInput) -> Result<Vec<String>, StartError> {
        let seen = self
            .shared
            .ingest
            .with_latest_fold(&input.thread, |fold| {
                let run = fold.fold().run();
                let active = run
                    .filter(|r| r.status == RunStatus::Running)
                    .map(|r| r.run_id().unwrap_or_default().to_string());
                let held: HashSet<&str> = fold
                    .fold()
                    .messages()
                    .iter()
                    .filter_map(|m| m["id"].as_str())
                    .collect();
                (active, input.missing_ids(&held))
            })
            .await?;
        // Without a fold (order checks off, or a thread trimmed without a checkpoint) every
        // input message is echoed: the fold skips those it holds.
        let (active, missing) = seen.unwrap_or_else(|| (None, input.missing_ids(&HashSet::new())));
        if let Some(run_id) = active {
            return Err(StartError::RunActive {
                thread: input.thread.clone(),
                run_id,
            });
        }
        if self
            .shared
            .log
            .producer_seq(&input.thread, &input.run_id)
            .await?
            > 0
        {
            return Err(StartError::RunIdUsed(input.run_id.clone()));
        }
        Ok(missing)
    }

    /// Ends the thread's active run `run_id` with `RUN_ERROR` `{"code": "cancelled"}` and
    /// returns the id of that event. A gateway run on this node has its upstream request
    /// aborted first; any other active run (a direct producer's, or a gateway run of another
    /// node, which sees it within `redis_block` and aborts its upstream request then) gets
    /// the `RUN_ERROR` appended here.
    ///
    /// # Errors
    /// [`CancelError::NotActive`] when `run_id` is not the thread's active run;
    /// [`CancelError::Ingest`] when the append fails.
    pub async fn cancel(&self, thread: &ThreadId, run_id: &str) -> Result<EventId, CancelError> {
        let local = self
            .shared
            .runs
            .get(thread)
            .filter(|a| a.run_id == run_id)
            .map(|a| (a.cancel.clone(), a.ended.clone()));
        if let Some((cancel, mut ended)) = local {
            cancel.cancel();
            let end = tokio::time::timeout(CANCEL_WAIT, ended.wait_for(Option::is_some)).await;
            if let Ok(Ok(end)) = end
                && let Some(Ended {
                    outcome: Outcome::Cancelled,
                    last_id: Some(id),
                }) = *end
            {
                return Ok(id);
            }
            return Err(CancelError::NotActive {
                run_id: run_id.to_string(),
                active: None,
            });
        }
        self.cancel_elsewhere(thread, run_id).await
    }

    /// Cancels a run this node does not own: the `RUN_ERROR` is appended through the ingest
    /// only on a head at which the fold shows `run_id` active, so that a run that ended
    /// meanwhile (and the next run, which a `RUN_ERROR` would fail: it names no run) is never
    /// touched. Under the thread's lock, so this node's publishes wait for it, and each retry
    /// after another node's append reads only what it appended.
    async fn cancel_elsewhere(
        &self,
        thread: &ThreadId,
        run_id: &str,
    ) -> Result<EventId, CancelError> {
        // The active run the guard last saw (`None`: none), for the refusal.
        let seen: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
        let guard = |fold: Option<&ThreadFold>| {
            let active = fold.and_then(|f| {
                f.fold()
                    .run()
                    .filter(|r| r.status == RunStatus::Running)
                    .and_then(|r| r.run_id().map(str::to_string))
            });
            let passes = active.as_deref() == Some(run_id);
            // A poisoned lock only means a guard panicked earlier: the value is still whole.
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = active;
            passes
        };
        let error = run::broker_event(
            run::run_error("cancelled", "the run was cancelled", run_id),
            thread,
        );
        let not_active = |active: Option<String>| CancelError::NotActive {
            run_id: run_id.to_string(),
            active,
        };
        match self
            .shared
            .ingest
            .append_guarded(thread, std::slice::from_ref(&error), &guard)
            .await
        {
            Ok(appended) => {
                metrics::counter!(m::PUBLISHED, "type" => "RUN_ERROR").increment(1);
                appended.ids.last().copied().ok_or_else(|| not_active(None))
            }
            Err(IngestError::Guarded) => Err(not_active(
                seen.lock().unwrap_or_else(|e| e.into_inner()).take(),
            )),
            Err(IngestError::Log(e)) => Err(e.into()),
            // A RUN_ERROR breaks no order rule while its run is active, and one event is no
            // batch too large: neither can happen; answered as the backend's failure.
            Err(e) => Err(LogError::Unavailable(e.to_string()).into()),
        }
    }

    /// Ends every run on this node (each with `RUN_ERROR` `broker_shutdown`, its upstream
    /// request aborted) and waits up to `wait` for them to be appended. New runs are refused
    /// by the caller (`http`, while draining).
    pub async fn stop(&self, wait: Duration) {
        self.shared.stop.cancel();
        self.shared.tasks.close();
        if tokio::time::timeout(wait, self.shared.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                runs = self.shared.runs.len(),
                "gateway runs still ending at shutdown; the orphan timeout closes them"
            );
        }
    }
}

/// A run's entry in [`Shared::runs`], removed when the run's task ends (or never starts).
struct Registration {
    shared: Arc<Shared>,
    thread: ThreadId,
    run_id: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared
            .runs
            .remove_if(&self.thread, |_, a| a.run_id == self.run_id);
    }
}

/// Whether an order rule broken by a `RUN_STARTED` says the thread already has an active run.
fn is_run_active_rule(rule: &str) -> bool {
    rule == RUN_ALREADY_ACTIVE
}

/// Describes the gateway's metrics with a zero series for every bounded label value.
pub fn describe_metrics() {
    for outcome in Outcome::ALL {
        metrics::counter!(m::RUNS_ENDED, "outcome" => outcome.as_str()).absolute(0);
    }
    for cause in upstream::Cause::ALL {
        metrics::counter!(m::UPSTREAM_ERRORS, "cause" => cause.code()).absolute(0);
    }
    metrics::counter!(m::RUNS_STARTED).absolute(0);
    metrics::gauge!(m::RUNS_ACTIVE).set(0.0);
}
