//! The reducer's run lifecycle: the current [`Run`] and how `RUN_STARTED`, `RUN_FINISHED`
//! and `RUN_ERROR` change it.

use super::{Applied, Fold, snapshot_message};
use crate::event::Fields;
use serde_json::{Map, Value};

/// The current run of a thread: its `RUN_STARTED` and how it stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The original `RUN_STARTED` event, `input` included; `None` when the run was only
    /// ever seen ending (a stream may open with `RUN_ERROR`, AGUI.md §5 rule 3).
    pub started: Option<Value>,
    /// Running, finished or errored.
    pub status: RunStatus,
}

/// How the current run stands.
#[derive(Clone, Debug, PartialEq)]
pub enum RunStatus {
    /// Started, no terminal event yet.
    Running,
    /// The original `RUN_FINISHED` event (`outcome`, `result`, `usage`).
    Finished(Value),
    /// The original `RUN_ERROR` event; `finished` holds the `RUN_FINISHED` it followed, if
    /// any (a late `RUN_ERROR` after `RUN_FINISHED` is legal and means the run failed).
    Errored {
        /// The `RUN_ERROR` event.
        error: Value,
        /// The `RUN_FINISHED` this error came after, if any.
        finished: Option<Value>,
    },
}

impl Run {
    /// The run's `threadId` (from its `RUN_STARTED`).
    pub fn thread_id(&self) -> Option<&str> {
        self.started.as_ref()?.field("threadId")?.as_str()
    }

    /// The run's `runId` (from its `RUN_STARTED`).
    pub fn run_id(&self) -> Option<&str> {
        self.started.as_ref()?.field("runId")?.as_str()
    }

    /// Whether the run has ended (finished or errored).
    pub fn is_closed(&self) -> bool {
        !matches!(self.status, RunStatus::Running)
    }

    /// `{"threadId", "runId", "status": "running"|"finished"|"errored", "started",
    /// "finished"?, "error"?}` (ids `null` when no `RUN_STARTED` was seen).
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        out.insert(
            "threadId".into(),
            self.thread_id().map_or(Value::Null, Value::from),
        );
        out.insert(
            "runId".into(),
            self.run_id().map_or(Value::Null, Value::from),
        );
        let (status, finished, error) = match &self.status {
            RunStatus::Running => ("running", None, None),
            RunStatus::Finished(f) => ("finished", Some(f), None),
            RunStatus::Errored { error, finished } => ("errored", finished.as_ref(), Some(error)),
        };
        out.insert("status".into(), status.into());
        out.insert(
            "started".into(),
            self.started.clone().unwrap_or(Value::Null),
        );
        if let Some(f) = finished {
            out.insert("finished".into(), f.clone());
        }
        if let Some(e) = error {
            out.insert("error".into(), e.clone());
        }
        Value::Object(out)
    }
}

impl Fold {
    // ---- run lifecycle ------------------------------------------------------------------

    /// `RUN_STARTED`: becomes the current run; `input.messages` not already present (by id)
    /// are appended (the input-echo, AGUI.md §6). `input.state` is not adopted: the client's
    /// reducer ignores it (its own state already is that value), so a client folding the
    /// log does too.
    pub(super) fn run_started(&mut self, event: &Value) -> Applied {
        self.run = Some(Run {
            started: Some(event.clone()),
            status: RunStatus::Running,
        });
        let input = event
            .field("input")
            .and_then(|i| i.field("messages"))
            .and_then(Value::as_array);
        for m in input.into_iter().flatten() {
            let present = m
                .field("id")
                .and_then(Value::as_str)
                .is_some_and(|id| self.messages.position(id).is_some());
            if !present {
                self.messages.push(snapshot_message(m));
            }
        }
        Applied::Folded
    }

    /// `RUN_FINISHED`: the current run is finished with this event (outcome, result).
    pub(super) fn run_finished(&mut self, event: &Value) -> Applied {
        let status = RunStatus::Finished(event.clone());
        self.end_run(status)
    }

    /// `RUN_ERROR`: the current run errored (also after `RUN_FINISHED`, which it then
    /// overrides, or with no run started at all).
    pub(super) fn run_error(&mut self, event: &Value) -> Applied {
        let finished = match self.run.as_ref().map(|r| &r.status) {
            Some(RunStatus::Finished(f)) => Some(f.clone()),
            Some(RunStatus::Errored { finished, .. }) => finished.clone(),
            _ => None,
        };
        let status = RunStatus::Errored {
            error: event.clone(),
            finished,
        };
        self.end_run(status)
    }

    /// Ends the current run with `status`; a run only ever seen ending has no `RUN_STARTED`.
    fn end_run(&mut self, status: RunStatus) -> Applied {
        match &mut self.run {
            Some(run) => run.status = status,
            None => {
                self.run = Some(Run {
                    started: None,
                    status,
                })
            }
        }
        Applied::Folded
    }
}
