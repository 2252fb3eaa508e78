//! The AG-UI client reducer: what `@ag-ui/client` 1.0.0 `defaultApplyEvents` makes of a
//! sequence of (chunk-expanded) events — `state`, `messages` and the current run (SPEC §1
//! "fold", AGUI.md §6).
//!
//! The reference is the published package's own source (`src/apply/default.ts`, shipped in
//! its sourcemap), read branch by branch; each handler below names the rule it mirrors.
//! Where that source and AGUI.md's summary differ, the source wins and the comment says so.
//! The fold takes events that already went through chunk expansion (`TEXT_MESSAGE_CHUNK` and
//! friends are refused, as the client's reducer throws on them) and does not check order:
//! that is `crate::event`'s job, before the fold.
//!
//! What the client's pipeline does before its reducer and the fold mirrors here: the
//! enforcement stage drops JSON Patch operations with an unknown `op` (conformance fixture
//! `state-delta-unknown-op-dropped`). What it does and the fold does not: it strips
//! undescribed members from messages carried whole (`MESSAGES_SNAPSHOT`, `RUN_STARTED.input`);
//! the fold keeps them (the broker never drops a producer's field, SPEC §2) and a client strips
//! them again when it receives them, so both end with the same messages.
//!
//! One difference is known and left: when two messages share an id (a producer bug — ids are
//! unique across kinds, AGUI.md §8 #8), a `MESSAGES_SNAPSHOT` makes the JavaScript reducer put
//! one object in both places, so a later append shows in both; the fold keeps them apart.
//! Replaying 48 000 random event sequences through both reducers agrees on everything else,
//! key order included.
//!
//! Layout: `patch.rs` is JSON Patch with `fast-json-patch` semantics ([`apply_patch`]),
//! `messages.rs` the message list and its lookups, this file the reducer.

mod load;
mod messages;
mod patch;
pub mod prelude;
mod thread;

pub use load::{catch_up, load_fold};
pub use patch::{PatchError, apply_patch};
pub use thread::{Rejection, ThreadFold};

use messages::{Messages, find_tool_call, merge_metadata, tool_call_ids};
use serde_json::{Map, Value, json};
use std::collections::{HashMap, HashSet};

use crate::event::EventType;

/// A thread's fold: the state, the messages and the current run, as the AG-UI 1.0 client
/// reducer builds them from the thread's events (SPEC §1).
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
        self.started.as_ref()?.get("threadId")?.as_str()
    }

    /// The run's `runId` (from its `RUN_STARTED`).
    pub fn run_id(&self) -> Option<&str> {
        self.started.as_ref()?.get("runId")?.as_str()
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
            .get("type")
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

    // ---- messages: text and reasoning ---------------------------------------------------

    /// `TEXT_MESSAGE_START` / `REASONING_MESSAGE_START`: reuses the first message with this id
    /// (so later content appends to it, AGUI.md §6 "reducer idempotency"), or appends a new
    /// one `{id, role, content: "", name?, subagentRunId?}`; `role` defaults to `assistant`
    /// (`reasoning` for reasoning). An activity message under the id is left alone (the
    /// client warns that ids must be unique across kinds). Metadata merges either way.
    fn message_start(&mut self, event: &Value, fixed_role: Option<&'static str>) -> Applied {
        let Some(id) = str_field(event, "messageId") else {
            return Applied::Skipped("message start without messageId");
        };
        if let Some(index) = self.messages.position(id) {
            let Some(message) = self.messages.get_mut(index) else {
                return Applied::Skipped("message is not an object");
            };
            if role_of(message) == Some("activity") {
                return Applied::Skipped("message start aimed at an activity message");
            }
            merge_metadata(message, event);
            return Applied::Folded;
        }
        let mut message = Map::new();
        message.insert("id".into(), id.into());
        let role = match fixed_role {
            Some(role) => Value::from(role),
            None => event
                .get("role")
                .cloned()
                .unwrap_or_else(|| "assistant".into()),
        };
        message.insert("role".into(), role);
        message.insert("content".into(), "".into());
        if fixed_role.is_none()
            && let Some(name) = event.get("name")
        {
            message.insert("name".into(), name.clone());
        }
        copy_subagent_run_id(&mut message, event);
        merge_metadata(&mut message, event);
        self.messages.push(Value::Object(message));
        Applied::Folded
    }

    /// `TEXT_MESSAGE_CONTENT` / `REASONING_MESSAGE_CONTENT`: appends `delta` byte-exactly to
    /// the message's string `content` (a non-string content is replaced, as JavaScript's
    /// `typeof content === "string" ? content : ""` does) and merges metadata.
    fn message_content(&mut self, event: &Value) -> Applied {
        let (Some(id), Some(delta)) = (str_field(event, "messageId"), str_field(event, "delta"))
        else {
            return Applied::Skipped("content without messageId or delta");
        };
        let Some(message) = self
            .messages
            .position(id)
            .and_then(|i| self.messages.get_mut(i))
        else {
            return Applied::Skipped("content for an id with no message");
        };
        if role_of(message) == Some("activity") {
            return Applied::Skipped("content aimed at an activity message");
        }
        match message.get_mut("content") {
            Some(Value::String(content)) => content.push_str(delta),
            _ => {
                message.insert("content".into(), delta.into());
            }
        }
        merge_metadata(message, event);
        Applied::Folded
    }

    /// `TEXT_MESSAGE_END` / `REASONING_MESSAGE_END`: merges metadata (where end-of-message
    /// values such as token usage arrive).
    fn message_end(&mut self, event: &Value) -> Applied {
        let Some(message) = str_field(event, "messageId")
            .and_then(|id| self.messages.position(id))
            .and_then(|i| self.messages.get_mut(i))
        else {
            return Applied::Skipped("end for an id with no message");
        };
        if role_of(message) == Some("activity") {
            return Applied::Skipped("end aimed at an activity message");
        }
        merge_metadata(message, event);
        Applied::Folded
    }

    // ---- tool calls ---------------------------------------------------------------------

    /// `TOOL_CALL_START`. A tool call whose id some message already holds is updated in place
    /// (renamed if the name differs; metadata merged), never duplicated. Otherwise it is
    /// added as `{id, type: "function", function: {name, arguments: ""}}` to:
    /// - the first message with id `parentMessageId`, when that message is an assistant;
    /// - else a new assistant message `{id, role, toolCalls: []}` appended at the end, with id
    ///   `parentMessageId` when no message has that id, or the `toolCallId` when a
    ///   non-assistant message does (the 1.0 client's `resolveOrCreateAssistantMessage`);
    /// - else, without `parentMessageId`, a new assistant message with id `toolCallId`.
    ///
    /// A newly created message takes the event's `subagentRunId`. Event metadata merges into
    /// the tool call, not the message: several calls can share one message.
    fn tool_call_start(&mut self, event: &Value) -> Applied {
        let Some(tool_call_id) = str_field(event, "toolCallId") else {
            return Applied::Skipped("TOOL_CALL_START without toolCallId");
        };
        let name = event.get("toolCallName");
        if let Some(owner) = self.messages.tool_call_owner(tool_call_id) {
            let Some(call) = self
                .messages
                .get_mut(owner)
                .and_then(|m| find_tool_call(m, tool_call_id))
            else {
                return Applied::Skipped("tool call index out of date");
            };
            if let (Some(name), Some(Value::Object(function))) = (name, call.get_mut("function"))
                && function.get("name") != Some(name)
            {
                function.insert("name".into(), name.clone());
            }
            merge_metadata(call, event);
            return Applied::Folded;
        }

        let parent = str_field(event, "parentMessageId").filter(|p| !p.is_empty());
        let existing_parent = parent.and_then(|p| self.messages.position(p));
        let target = match (parent, existing_parent) {
            (Some(_), Some(i)) if self.messages.get(i).and_then(role_of) == Some("assistant") => i,
            (Some(p), None) => self.push_assistant_for_tool_call(p, event),
            _ => self.push_assistant_for_tool_call(tool_call_id, event),
        };
        let Some(message) = self.messages.get_mut(target) else {
            return Applied::Skipped("tool call parent is not an object");
        };
        let calls = message
            .entry("toolCalls")
            .or_insert_with(|| Value::Array(Vec::new()));
        if calls.is_null() {
            *calls = Value::Array(Vec::new());
        }
        let Value::Array(calls) = calls else {
            return Applied::Skipped("parent message toolCalls is not an array");
        };
        let mut function = Map::new();
        if let Some(name) = name {
            function.insert("name".into(), name.clone());
        }
        function.insert("arguments".into(), "".into());
        let mut call = Map::new();
        call.insert("id".into(), tool_call_id.into());
        call.insert("type".into(), "function".into());
        call.insert("function".into(), Value::Object(function));
        merge_metadata(&mut call, event);
        calls.push(Value::Object(call));
        self.messages.note_tool_call(target, tool_call_id);
        Applied::Folded
    }

    /// Appends `{id, role: "assistant", toolCalls: []}` (plus the event's `subagentRunId` when
    /// no message had that id before) and returns its index.
    fn push_assistant_for_tool_call(&mut self, id: &str, event: &Value) -> usize {
        let was_absent = self.messages.position(id).is_none();
        let mut message = Map::new();
        message.insert("id".into(), id.into());
        message.insert("role".into(), "assistant".into());
        message.insert("toolCalls".into(), Value::Array(Vec::new()));
        if was_absent {
            copy_subagent_run_id(&mut message, event);
        }
        self.messages.push(Value::Object(message));
        self.messages.len() - 1
    }

    /// `TOOL_CALL_ARGS`: appends `delta` to the first tool call with this id, in place, and
    /// merges metadata into the call.
    fn tool_call_args(&mut self, event: &Value) -> Applied {
        let (Some(id), Some(delta)) = (str_field(event, "toolCallId"), str_field(event, "delta"))
        else {
            return Applied::Skipped("TOOL_CALL_ARGS without toolCallId or delta");
        };
        let Some(call) = self
            .messages
            .tool_call_owner(id)
            .and_then(|i| self.messages.get_mut(i))
            .and_then(|m| find_tool_call(m, id))
        else {
            return Applied::Skipped("TOOL_CALL_ARGS for an unknown tool call");
        };
        let Some(Value::Object(function)) = call.get_mut("function") else {
            return Applied::Skipped("tool call without a function object");
        };
        match function.get_mut("arguments") {
            Some(Value::String(arguments)) => arguments.push_str(delta),
            _ => {
                function.insert("arguments".into(), delta.into());
            }
        }
        merge_metadata(call, event);
        Applied::Folded
    }

    /// `TOOL_CALL_END`: merges metadata into the tool call.
    fn tool_call_end(&mut self, event: &Value) -> Applied {
        let Some(call) = str_field(event, "toolCallId").and_then(|id| {
            self.messages
                .tool_call_owner(id)
                .and_then(|i| self.messages.get_mut(i))
                .and_then(|m| find_tool_call(m, id))
        }) else {
            return Applied::Skipped("TOOL_CALL_END for an unknown tool call");
        };
        merge_metadata(call, event);
        Applied::Folded
    }

    /// `TOOL_CALL_RESULT`: mints `{id: messageId, toolCallId, role: "tool", content,
    /// subagentRunId?}` (plus metadata) and places it right after the assistant message that
    /// holds the call, past any tool results already there (so parallel results keep their
    /// order); at the end when no assistant holds the call. The 1.0 client does this so that
    /// a result arriving after trailing text still follows its call.
    fn tool_call_result(&mut self, event: &Value) -> Applied {
        let Some(id) = str_field(event, "messageId") else {
            return Applied::Skipped("TOOL_CALL_RESULT without messageId");
        };
        let tool_call_id = event.get("toolCallId");
        let mut message = Map::new();
        message.insert("id".into(), id.into());
        if let Some(tc) = tool_call_id {
            message.insert("toolCallId".into(), tc.clone());
        }
        let role = match event.get("role") {
            Some(Value::String(r)) if !r.is_empty() => Value::from(r.as_str()),
            _ => "tool".into(),
        };
        message.insert("role".into(), role);
        if let Some(content) = event.get("content") {
            message.insert("content".into(), content.clone());
        }
        copy_subagent_run_id(&mut message, event);
        merge_metadata(&mut message, event);

        let owner = tool_call_id.and_then(Value::as_str).and_then(|tc| {
            self.messages.as_slice().iter().position(|m| {
                m.get("role").and_then(Value::as_str) == Some("assistant")
                    && tool_call_ids(m).any(|id| id == tc)
            })
        });
        match owner {
            None => self.messages.push(Value::Object(message)),
            Some(owner) => {
                let list = self.messages.as_slice();
                let mut at = owner + 1;
                while list
                    .get(at)
                    .and_then(|m| m.get("role"))
                    .and_then(Value::as_str)
                    == Some("tool")
                {
                    at += 1;
                }
                self.messages.insert(at, Value::Object(message));
            }
        }
        Applied::Folded
    }

    /// `REASONING_ENCRYPTED_VALUE`: sets `encryptedValue` on the first assistant tool call with
    /// id `entityId` (`subtype: "tool-call"`) or on the first non-activity message with that
    /// id (`"message"`). Its metadata stays on the event.
    fn encrypted_value(&mut self, event: &Value) -> Applied {
        let (Some(entity), Some(value)) =
            (str_field(event, "entityId"), event.get("encryptedValue"))
        else {
            return Applied::Skipped("REASONING_ENCRYPTED_VALUE without entityId or value");
        };
        if str_field(event, "subtype") == Some("tool-call") {
            let owner = self.messages.as_slice().iter().position(|m| {
                m.get("role").and_then(Value::as_str) == Some("assistant")
                    && tool_call_ids(m).any(|id| id == entity)
            });
            if let Some(call) = owner
                .and_then(|i| self.messages.get_mut(i))
                .and_then(|m| find_tool_call(m, entity))
            {
                call.insert("encryptedValue".into(), value.clone());
                return Applied::Folded;
            }
        } else if let Some(message) = self
            .messages
            .position(entity)
            .and_then(|i| self.messages.get_mut(i))
            && role_of(message) != Some("activity")
        {
            message.insert("encryptedValue".into(), value.clone());
            return Applied::Folded;
        }
        Applied::Skipped("REASONING_ENCRYPTED_VALUE for an unknown entity")
    }

    // ---- state --------------------------------------------------------------------------

    /// `STATE_SNAPSHOT`: replaces the state wholesale with any JSON value (no merge).
    fn state_snapshot(&mut self, event: &Value) -> Applied {
        let Some(snapshot) = event.get("snapshot") else {
            return Applied::Skipped("STATE_SNAPSHOT without snapshot");
        };
        self.state = snapshot.clone();
        self.state_known = true;
        Applied::Folded
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

    // ---- snapshots and activities -------------------------------------------------------

    /// `MESSAGES_SNAPSHOT`, reconciled by id (AGUI.md §6; `events/state` in the spec):
    /// 1. each local message whose id the snapshot carries is replaced, in place, by the
    ///    snapshot's (last) message with that id;
    /// 2. local messages the snapshot lacks are dropped, except client-only ones: `reasoning`
    ///    messages unless the snapshot carries any reasoning message, and `activity` messages
    ///    unless the snapshot carries any activity message — or, when the event's
    ///    `metadata["@ag-ui/client"].authoritativeActivityTypes` declares them, unless their
    ///    `activityType` is declared (`null` declares every type);
    /// 3. snapshot messages with ids not already present are appended in snapshot order.
    ///
    /// A `subagentRunId: null` in a snapshot message reads as absent.
    fn messages_snapshot(&mut self, event: &Value) -> Applied {
        let Some(snapshot) = event.get("messages").and_then(Value::as_array) else {
            return Applied::Skipped("MESSAGES_SNAPSHOT without messages");
        };
        let mut by_id: HashMap<&str, usize> = HashMap::with_capacity(snapshot.len());
        for (i, m) in snapshot.iter().enumerate() {
            if let Some(id) = m.get("id").and_then(Value::as_str) {
                by_id.insert(id, i);
            }
        }
        let has_role = |role: &str| {
            snapshot
                .iter()
                .any(|m| m.get("role").and_then(Value::as_str) == Some(role))
        };
        let (has_activity, has_reasoning) = (has_role("activity"), has_role("reasoning"));
        let owned = authoritative_activity_types(event);
        let preserved = |m: &Value| match m.get("role").and_then(Value::as_str) {
            Some("activity") => match &owned {
                ActivityAuthority::Types(types) => {
                    let activity_type = m.get("activityType").and_then(Value::as_str);
                    !activity_type.is_some_and(|t| types.contains(&t))
                }
                ActivityAuthority::All => false,
                ActivityAuthority::Inferred => !has_activity,
            },
            Some("reasoning") => !has_reasoning,
            _ => false,
        };

        let local = self.messages.take_all();
        let mut out = Vec::with_capacity(local.len().max(snapshot.len()));
        for m in local {
            let from_snapshot = m
                .get("id")
                .and_then(Value::as_str)
                .and_then(|id| by_id.get(id).copied());
            match from_snapshot {
                Some(i) => out.push(snapshot_message(&snapshot[i])),
                None if preserved(&m) => out.push(m),
                None => {}
            }
        }
        let present: HashSet<String> = out
            .iter()
            .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
            .collect();
        for m in snapshot {
            let known = m
                .get("id")
                .and_then(Value::as_str)
                .is_some_and(|id| present.contains(id));
            if !known {
                out.push(snapshot_message(m));
            }
        }
        self.messages.set_all(out);
        Applied::Folded
    }

    /// `ACTIVITY_SNAPSHOT`: appends `{id, role: "activity", activityType, content,
    /// subagentRunId?}` when the id is new. For an existing activity message with `replace`
    /// (absent ⇒ true) its `activityType`, `content` and `subagentRunId` are replaced in place
    /// (other members kept); with `replace: false` only metadata merges. A non-activity
    /// message under the id is replaced by the activity when `replace`, else left alone.
    fn activity_snapshot(&mut self, event: &Value) -> Applied {
        let Some(id) = str_field(event, "messageId") else {
            return Applied::Skipped("ACTIVITY_SNAPSHOT without messageId");
        };
        let replace = !matches!(event.get("replace"), Some(Value::Bool(false)));
        let fresh = || {
            let mut m = Map::new();
            m.insert("id".into(), id.into());
            m.insert("role".into(), "activity".into());
            if let Some(t) = event.get("activityType") {
                m.insert("activityType".into(), t.clone());
            }
            if let Some(c) = event.get("content") {
                m.insert("content".into(), c.clone());
            }
            copy_subagent_run_id(&mut m, event);
            merge_metadata(&mut m, event);
            Value::Object(m)
        };
        let Some(index) = self.messages.position(id) else {
            self.messages.push(fresh());
            return Applied::Folded;
        };
        let is_activity = self.messages.get(index).and_then(role_of) == Some("activity");
        if !is_activity {
            if replace {
                self.messages.replace(index, fresh());
            }
            return Applied::Folded;
        }
        let Some(message) = self.messages.get_mut(index) else {
            return Applied::Skipped("message is not an object");
        };
        if replace {
            if let Some(t) = event.get("activityType") {
                message.insert("activityType".into(), t.clone());
            }
            if let Some(c) = event.get("content") {
                message.insert("content".into(), c.clone());
            }
            match event.get("subagentRunId") {
                Some(s) if !s.is_null() => {
                    message.insert("subagentRunId".into(), s.clone());
                }
                _ => {
                    message.shift_remove("subagentRunId");
                }
            }
        }
        merge_metadata(message, event);
        Applied::Folded
    }

    /// `ACTIVITY_DELTA`: metadata merges first; then `patch` applies to the activity's
    /// `content` (`{}` when absent) with the same atomic semantics as `STATE_DELTA`, and on
    /// success `activityType` is updated too. A delta for an unknown id is silently ignored;
    /// one aimed at a non-activity message is skipped.
    fn activity_delta(&mut self, event: &Value) -> Applied {
        let Some(index) = str_field(event, "messageId").and_then(|id| self.messages.position(id))
        else {
            return Applied::Skipped("ACTIVITY_DELTA for an unknown activity");
        };
        let Some(message) = self.messages.get_mut(index) else {
            return Applied::Skipped("message is not an object");
        };
        if role_of(message) != Some("activity") {
            return Applied::Skipped("ACTIVITY_DELTA aimed at a non-activity message");
        }
        merge_metadata(message, event);
        let empty = Value::Array(Vec::new());
        let ops = patch_ops(Some(event.get("patch").unwrap_or(&empty)));
        // Patch the content where it lies: `apply_atomic` leaves it untouched on failure.
        let had_content = matches!(message.get("content"), Some(c) if !c.is_null());
        let mut content = match message.get_mut("content") {
            Some(c) if !c.is_null() => std::mem::take(c),
            _ => Value::Object(Map::new()),
        };
        let result = ops.and_then(|ops| patch::apply_atomic(&mut content, ops));
        if result.is_ok() || had_content {
            message.insert("content".into(), content);
        }
        if result.is_ok()
            && let Some(t) = event.get("activityType")
        {
            message.insert("activityType".into(), t.clone());
        }
        Applied::ActivityDelta(result)
    }

    // ---- run lifecycle ------------------------------------------------------------------

    /// `RUN_STARTED`: becomes the current run; `input.messages` not already present (by id)
    /// are appended (the input-echo, AGUI.md §6). `input.state` is not adopted: the client's
    /// reducer ignores it (its own state already is that value), so a client folding the
    /// log does too.
    fn run_started(&mut self, event: &Value) -> Applied {
        self.run = Some(Run {
            started: Some(event.clone()),
            status: RunStatus::Running,
        });
        let input = event
            .get("input")
            .and_then(|i| i.get("messages"))
            .and_then(Value::as_array);
        for m in input.into_iter().flatten() {
            let present = m
                .get("id")
                .and_then(Value::as_str)
                .is_some_and(|id| self.messages.position(id).is_some());
            if !present {
                self.messages.push(snapshot_message(m));
            }
        }
        Applied::Folded
    }

    /// `RUN_FINISHED`: the current run is finished with this event (outcome, result).
    fn run_finished(&mut self, event: &Value) -> Applied {
        let status = RunStatus::Finished(event.clone());
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

    /// `RUN_ERROR`: the current run errored (also after `RUN_FINISHED`, which it then
    /// overrides, or with no run started at all).
    fn run_error(&mut self, event: &Value) -> Applied {
        let finished = match self.run.as_ref().map(|r| &r.status) {
            Some(RunStatus::Finished(f)) => Some(f.clone()),
            Some(RunStatus::Errored { finished, .. }) => finished.clone(),
            _ => None,
        };
        let status = RunStatus::Errored {
            error: event.clone(),
            finished,
        };
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

/// Who owns activity messages in a `MESSAGES_SNAPSHOT` (`authoritativeActivityTypes` in
/// `@ag-ui/client` 1.0.0 `activity-history.ts`).
enum ActivityAuthority<'e> {
    /// No declaration: the snapshot owns activities iff it carries one.
    Inferred,
    /// `null`: the snapshot owns every activity type.
    All,
    /// These types (an invalid declaration owns none).
    Types(Vec<&'e str>),
}

fn authoritative_activity_types(event: &Value) -> ActivityAuthority<'_> {
    let Some(value) = event.get("metadata").and_then(|m| m.get("@ag-ui/client")) else {
        return ActivityAuthority::Inferred;
    };
    let Some(value) = value.as_object() else {
        return ActivityAuthority::Types(Vec::new());
    };
    match value.get("authoritativeActivityTypes") {
        None => ActivityAuthority::Inferred,
        Some(Value::Null) => ActivityAuthority::All,
        Some(Value::Array(types)) => {
            let names: Option<Vec<&str>> = types.iter().map(Value::as_str).collect();
            ActivityAuthority::Types(names.unwrap_or_default())
        }
        Some(_) => ActivityAuthority::Types(Vec::new()),
    }
}

/// Applies a `STATE_DELTA` event's `delta` to `state` as [`Fold::apply`] does (the client's
/// `applyPatch(state, delta, true, false)`: atomic, unknown operations dropped first).
///
/// # Errors
/// The first operation that does not apply (RFC 6902 §5: the whole patch fails, `state` is
/// unchanged).
pub(crate) fn apply_state_delta(state: &mut Value, event: &Value) -> Result<(), PatchError> {
    patch_ops(event.get("delta")).and_then(|ops| patch::apply_atomic(state, ops))
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
                    op.get("op").and_then(Value::as_str),
                    Some("add" | "remove" | "replace" | "move" | "copy" | "test")
                )
        })
        .collect())
}

/// A message carried whole (snapshot, input-echo), with `subagentRunId: null` read as absent.
fn snapshot_message(m: &Value) -> Value {
    let mut m = m.clone();
    if let Value::Object(map) = &mut m
        && map.get("subagentRunId").is_some_and(Value::is_null)
    {
        map.shift_remove("subagentRunId");
    }
    m
}

/// Copies a non-null `subagentRunId` from the event onto a message it mints.
fn copy_subagent_run_id(message: &mut Map<String, Value>, event: &Value) {
    if let Some(s) = event.get("subagentRunId").filter(|s| !s.is_null()) {
        message.insert("subagentRunId".into(), s.clone());
    }
}

fn str_field<'e>(event: &'e Value, key: &str) -> Option<&'e str> {
    event.get(key).and_then(Value::as_str)
}

fn role_of(message: &Map<String, Value>) -> Option<&str> {
    message.get("role").and_then(Value::as_str)
}

#[cfg(test)]
mod tests;
