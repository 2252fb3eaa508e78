//! The AG-UI client reducer: what `@ag-ui/client` 1.0.0 `defaultApplyEvents` makes of a
//! sequence of (chunk-expanded) events — `state`, `messages` and the current run (PROTOCOL §1
//! "fold", AGUI.md §6).
//!
//! The reference is the published package's own source (`src/apply/default.ts`, shipped in
//! its sourcemap), read branch by branch; each handler names the rule it mirrors.
//! Where that source and AGUI.md's summary differ, the source wins and the comment says so.
//! The fold takes events that already went through chunk expansion (`TEXT_MESSAGE_CHUNK` and
//! friends are refused, as the client's reducer throws on them) and does not check order:
//! that is `crate::event`'s job, before the fold.
//!
//! What the client's pipeline does before its reducer and the fold mirrors here: the
//! enforcement stage drops JSON Patch operations with an unknown `op` (conformance fixture
//! `state-delta-unknown-op-dropped`). What it does and the fold does not: it strips
//! undescribed members from messages carried whole (`MESSAGES_SNAPSHOT`, `RUN_STARTED.input`);
//! the fold keeps them (the broker never drops a producer's field, PROTOCOL §2) and a client strips
//! them again when it receives them, so both end with the same messages.
//!
//! One difference is known and left: when two messages share an id (a producer bug — ids are
//! unique across kinds, AGUI.md §8 #8), a `MESSAGES_SNAPSHOT` makes the JavaScript reducer put
//! one object in both places, so a later append shows in both; the fold keeps them apart.
//! Running 48 000 random event sequences through both reducers agrees on everything else,
//! key order included.
//!
//! Layout: this file holds [`Fold`] and its dispatch and the state handlers; `stream.rs` the
//! streamed messages and tool calls, `snapshot.rs` `MESSAGES_SNAPSHOT` and activities,
//! `run.rs` the run lifecycle ([`Run`]); `messages.rs` the message list and its lookups;
//! `patch/` JSON Patch with `fast-json-patch` semantics ([`apply_patch`]); `thread.rs` the
//! fold with its order checker ([`ThreadFold`]), `load.rs` building one from the log,
//! `prelude.rs` the prelude and bridge events built from it.

mod load;
mod messages;
mod patch;
pub mod prelude;
mod run;
mod snapshot;
mod stream;
mod thread;

pub use load::{catch_up, load_fold, load_fold_at};
pub use patch::{AmbiguousPath, DeltaRefusal, PatchError, apply_patch};
pub use run::{Run, RunStatus};
pub use thread::{OrderAfter, Rejection, ThreadFold};

use crate::event::EventType;
use crate::event::Fields;
use messages::Messages;
use serde_json::{Map, Value, json};

/// A thread's fold: the state, the messages and the current run, as the AG-UI 1.0 client
/// reducer builds them from the thread's events (PROTOCOL §1).
///
/// `Clone` is a deep copy (used to try a batch before committing it).
#[derive(Clone, Debug)]
pub struct Fold {
    /// The shared state; `{}` until a snapshot or delta sets it (the client's baseline).
    state: Value,
    /// Whether a `STATE_SNAPSHOT` or applied `STATE_DELTA` set `state`.
    state_known: bool,
    messages: Messages,
    run: Option<Run>,
}

impl Default for Fold {
    /// Same as [`Fold::new`].
    fn default() -> Self {
        Fold::new()
    }
}

/// What [`Fold::apply`] did with one event.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied {
    /// Applied by the reducer's rules.
    Folded,
    /// The reducer keeps nothing of this event type (`RAW`, `CUSTOM`, `STEP_*`,
    /// `REASONING_START`/`_END`, `SUBAGENT_*`).
    NoEffect,
    /// Skipped as the client skips it, usually with a `console.warn` (content for an id with
    /// no message, a text event aimed at an activity message, an unknown event type, a chunk
    /// event that was not expanded): nothing changed.
    Skipped(&'static str),
    /// A `STATE_DELTA`: `Ok` when its whole patch applied; `Err` when it did not, and the
    /// state is unchanged (the client warns "Failed to apply state patch" and goes on).
    StateDelta(Result<(), PatchError>),
    /// An `ACTIVITY_DELTA` for a known activity message: `Err` leaves its content unchanged
    /// (its `metadata` is merged either way, as the client does).
    ActivityDelta(Result<(), PatchError>),
}

impl Applied {
    /// The patch error of a `STATE_DELTA` or `ACTIVITY_DELTA` that did not apply.
    pub fn patch_error(&self) -> Option<&PatchError> {
        match self {
            Applied::StateDelta(Err(e)) | Applied::ActivityDelta(Err(e)) => Some(e),
            _ => None,
        }
    }
}

impl Fold {
    /// An empty fold: state `{}` (the client's default `agent.state`, and the baseline
    /// AGUI.md §2 gives the first `STATE_DELTA`), no messages, no run.
    pub fn new() -> Self {
        Fold {
            state: Value::Object(Map::new()),
            state_known: false,
            messages: Messages::default(),
            run: None,
        }
    }

    /// The state: `{}` until a `STATE_SNAPSHOT` (any JSON value, `null` included) or an
    /// applied `STATE_DELTA`.
    pub fn state(&self) -> &Value {
        &self.state
    }

    /// The state, for a check that patches it and takes the patch back
    /// ([`ThreadFold::check_batch_only`]).
    pub(crate) fn state_mut(&mut self) -> &mut Value {
        &mut self.state
    }

    /// Whether a `STATE_SNAPSHOT` or an applied `STATE_DELTA` has set [`Fold::state`].
    pub fn state_known(&self) -> bool {
        self.state_known
    }

    /// The messages in conversation order, as the client holds them (AGUI.md §2 shapes).
    pub fn messages(&self) -> &[Value] {
        self.messages.as_slice()
    }

    /// The current run, if any event of a run was seen.
    pub fn run(&self) -> Option<&Run> {
        self.run.as_ref()
    }

    /// `{"state", "messages", "run"}`; `run` is [`Run::to_json`] or `null`.
    pub fn snapshot_json(&self) -> Value {
        json!({
            "state": self.state,
            "messages": self.messages.as_slice(),
            "run": self.run.as_ref().map_or(Value::Null, Run::to_json),
        })
    }

    /// Folds one chunk-expanded event (a JSON object as validated by `crate::event`).
    ///
    /// Never panics; an event the reducer cannot use is [`Applied::Skipped`] and changes
    /// nothing. Streamed text and arguments are appended in place (no copy of the message).
    pub fn apply(&mut self, event: &Value) -> Applied {
        let Some(kind) = event
            .field("type")
            .and_then(Value::as_str)
            .and_then(EventType::parse)
        else {
            // The client's enforcement stage drops unknown types with a warning.
            return Applied::Skipped("not an AG-UI 1.0 event type");
        };
        match kind {
            EventType::TextMessageStart => self.message_start(event, None),
            EventType::ReasoningMessageStart => self.message_start(event, Some("reasoning")),
            EventType::TextMessageContent | EventType::ReasoningMessageContent => {
                self.message_content(event)
            }
            EventType::TextMessageEnd | EventType::ReasoningMessageEnd => self.message_end(event),
            EventType::ToolCallStart => self.tool_call_start(event),
            EventType::ToolCallArgs => self.tool_call_args(event),
            EventType::ToolCallEnd => self.tool_call_end(event),
            EventType::ToolCallResult => self.tool_call_result(event),
            EventType::StateSnapshot => self.state_snapshot(event),
            EventType::StateDelta => self.state_delta(event),
            EventType::MessagesSnapshot => self.messages_snapshot(event),
            EventType::ActivitySnapshot => self.activity_snapshot(event),
            EventType::ActivityDelta => self.activity_delta(event),
            EventType::RunStarted => self.run_started(event),
            EventType::RunFinished => self.run_finished(event),
            EventType::RunError => self.run_error(event),
            EventType::ReasoningEncryptedValue => self.encrypted_value(event),
            EventType::TextMessageChunk
            | EventType::ToolCallChunk
            | EventType::ReasoningMessageChunk => {
                // The client reducer throws "… must be transformed before being applied".
                Applied::Skipped("chunk events must be expanded before folding")
            }
            EventType::Raw
            | EventType::Custom
            | EventType::StepStarted
            | EventType::StepFinished
            | EventType::ReasoningStart
            | EventType::ReasoningEnd
            | EventType::SubagentStarted
            | EventType::SubagentFinished
            | EventType::SubagentError => Applied::NoEffect,
        }
    }

    // ---- state --------------------------------------------------------------------------

    /// `STATE_SNAPSHOT`: replaces the state wholesale with any JSON value (no merge).
    fn state_snapshot(&mut self, event: &Value) -> Applied {
        let Some(snapshot) = event.field("snapshot") else {
            return Applied::Skipped("STATE_SNAPSHOT without snapshot");
        };
        self.state = snapshot.clone();
        self.state_known = true;
        Applied::Folded
    }

    /// A `STATE_DELTA` checked as a publish checks it ([`apply_state_delta_portable`]): applied
    /// when it applies and its pointers are portable, else refused with the state unchanged.
    ///
    /// # Errors
    /// The first [`DeltaRefusal`].
    pub(crate) fn state_delta_portable(&mut self, event: &Value) -> Result<(), DeltaRefusal> {
        apply_state_delta_portable(&mut self.state, event)?;
        self.state_known = true;
        Ok(())
    }

    /// `STATE_DELTA`: the client's `applyPatch(state, delta, true, false)` — atomic, and a
    /// failure leaves the state as it was ([`patch`]). Operations with an unknown `op` are
    /// dropped first, as the client's enforcement stage drops them; error indices still
    /// count them.
    fn state_delta(&mut self, event: &Value) -> Applied {
        let result = apply_state_delta(&mut self.state, event);
        if result.is_ok() {
            self.state_known = true;
        }
        Applied::StateDelta(result)
    }
}

/// Applies a `STATE_DELTA` event's `delta` to `state` as [`Fold::apply`] does (the client's
/// `applyPatch(state, delta, true, false)`: atomic, unknown operations dropped first).
///
/// # Errors
/// The first operation that does not apply (RFC 6902 §5: the whole patch fails, `state` is
/// unchanged).
pub(crate) fn apply_state_delta(state: &mut Value, event: &Value) -> Result<(), PatchError> {
    patch_ops(event.field("delta")).and_then(|ops| patch::apply_atomic(state, ops))
}

/// [`apply_state_delta`] for a publish: also refuses an operation whose `path` or `from` JSON
/// Patch clients disagree on (PROTOCOL §2 "Portable patch paths"), before it is applied.
///
/// # Errors
/// The first [`DeltaRefusal`]; `state` is unchanged.
pub(crate) fn apply_state_delta_portable(
    state: &mut Value,
    event: &Value,
) -> Result<(), DeltaRefusal> {
    let ops = patch_ops(event.field("delta"))?;
    patch::apply_atomic_portable(state, ops)
}

/// [`apply_state_delta_portable`] as part of a [`patch::Trial`] (a batch's check, which takes
/// every write back when it is done).
///
/// # Errors
/// The first [`DeltaRefusal`]; `state` may then hold part of the patch until the trial is
/// taken back.
pub(crate) fn try_state_delta(
    state: &mut Value,
    event: &Value,
    trial: &mut patch::Trial,
) -> Result<(), DeltaRefusal> {
    let ops = patch_ops(event.field("delta"))?;
    trial.apply_portable(state, ops)
}

/// The `(index, operation)` list of a patch, without operations whose `op` the client's
/// enforcement stage does not recognise (an object whose `op` is not one of RFC 6902's six).
fn patch_ops(delta: Option<&Value>) -> Result<Vec<(usize, &Value)>, PatchError> {
    let Some(Value::Array(ops)) = delta else {
        return Err(PatchError {
            op_index: 0,
            code: "SEQUENCE_NOT_AN_ARRAY",
            message: "patch sequence must be an array".into(),
        });
    };
    Ok(ops
        .iter()
        .enumerate()
        .filter(|(_, op)| {
            !op.is_object()
                || matches!(
                    op.field("op").and_then(Value::as_str),
                    Some("add" | "remove" | "replace" | "move" | "copy" | "test")
                )
        })
        .collect())
}

/// A message carried whole (snapshot, input-echo), with `subagentRunId: null` read as absent.
fn snapshot_message(m: &Value) -> Value {
    let mut m = m.clone();
    if let Value::Object(map) = &mut m
        && map.field("subagentRunId").is_some_and(Value::is_null)
    {
        map.shift_remove("subagentRunId");
    }
    m
}

/// Copies a non-null `subagentRunId` from the event onto a message it mints.
fn copy_subagent_run_id(message: &mut Map<String, Value>, event: &Value) {
    if let Some(s) = event.field("subagentRunId").filter(|s| !s.is_null()) {
        message.insert("subagentRunId".into(), s.clone());
    }
}

fn str_field<'e>(event: &'e Value, key: &str) -> Option<&'e str> {
    event.field(key).and_then(Value::as_str)
}

fn role_of(message: &Map<String, Value>) -> Option<&str> {
    message.field("role").and_then(Value::as_str)
}

#[cfg(test)]
mod tests;
