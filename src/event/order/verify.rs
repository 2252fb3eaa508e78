//! Event-order rules: `@ag-ui/client` 1.0.0 `verifyEvents` over chunk-expanded events, and the
//! open constructs a prelude must restate (SPEC §2 "Order validation", AGUI.md §5).
//!
//! - [`OrderVerifier`] is `verifyEvents`: the same checks, in the same order, with the same
//!   wording, on events already expanded by [`ChunkExpander`]. Run lifecycle first
//!   (errored, finished, first event, nested `RUN_STARTED`, null attribution), then the
//!   per-type rules, then `RUN_FINISHED`'s open-construct checks (steps, text messages,
//!   reasoning messages, reasoning spans, tool calls, subagents). `RUN_STARTED` after
//!   `RUN_FINISHED` / `RUN_ERROR` resets all per-run tracking, so one stream (here: one
//!   thread's log) may carry many runs.
//! - [`OrderChecker`] is the client pipeline's `transformChunks` → `verifyEvents` on one
//!   stream, transactional per event: what the broker runs on every published event.
//! - [`OpenConstructs`] is what is still open, in opening order, with the events that opened
//!   it, plus the run status with its original `RUN_STARTED` and terminal events: the input
//!   of a prelude (SPEC §5).
//!
//! The verifier reads only the members the client's enforcement keeps. In particular the
//! `subagentRunId` of `RUN_*` and `MESSAGES_SNAPSHOT` is ignored (the client strips it as an
//! unknown member), and events that are not an object with a known AG-UI 1.0 `type` are
//! ignored (the client drops them before verification). Schema validation
//! ([`super::validate_value`]) runs first in the broker, so the two rules that exist only for
//! schema-invalid input (`missing_field`, `subagent_run_id_malformed`) never fire there.
//!
//! What the client does **not** check, and neither does this module: a stream that ends with
//! a run open, `RUN_FINISHED` ids agreeing with `RUN_STARTED`, `TOOL_CALL_RESULT` naming a
//! known tool call, `STATE_DELTA` applicability.

use super::EventType;
use super::chunks::{ChunkExpander, Expanded, OpenLane};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet, btree_map};
use std::fmt::Write as _;
use std::sync::Arc;

/// Stable short codes of [`OrderViolation::rule`], one per client check (the HTTP layer
/// reports them; tests match on them).
pub mod rule {
    /// The stream's (thread's) first event is neither `RUN_STARTED` nor `RUN_ERROR`.
    pub const FIRST_EVENT_MUST_BE_RUN_STARTED: &str = "first_event_must_be_run_started";
    /// An event other than `RUN_STARTED` after `RUN_ERROR`.
    pub const RUN_ALREADY_ERRORED: &str = "run_already_errored";
    /// An event other than `RUN_STARTED` / `RUN_ERROR` after `RUN_FINISHED`.
    pub const RUN_ALREADY_FINISHED: &str = "run_already_finished";
    /// `RUN_STARTED` while a run is active.
    pub const RUN_ALREADY_ACTIVE: &str = "run_already_active";
    /// `subagentRunId: null` on an event.
    pub const SUBAGENT_RUN_ID_NULL: &str = "subagent_run_id_null";
    /// `subagentRunId` neither absent nor a string nor null (schema-invalid; not a client
    /// message: the client's enforcement refuses it earlier).
    pub const SUBAGENT_RUN_ID_MALFORMED: &str = "subagent_run_id_malformed";
    /// An optional `SUBAGENT_*` field (or `outcome.interruptIds`) sent as `null`.
    pub const SUBAGENT_FIELD_NULL: &str = "subagent_field_null";
    /// `SUBAGENT_FINISHED.outcome` not success/suspended, or non-string interrupt ids.
    pub const SUBAGENT_OUTCOME_INVALID: &str = "subagent_outcome_invalid";
    /// A `RUN_FINISHED` interrupt with `subagentRunId: null`.
    pub const INTERRUPT_SUBAGENT_RUN_ID_NULL: &str = "interrupt_subagent_run_id_null";
    /// A message in `MESSAGES_SNAPSHOT` / `RUN_STARTED.input` with `subagentRunId: null`.
    pub const MESSAGE_SUBAGENT_RUN_ID_NULL: &str = "message_subagent_run_id_null";
    /// A required id member missing or not a string (schema-invalid; broker wording).
    pub const MISSING_FIELD: &str = "missing_field";
    /// `TEXT_MESSAGE_START` for a message already open.
    pub const MESSAGE_ALREADY_OPEN: &str = "message_already_open";
    /// `TEXT_MESSAGE_CONTENT` / `_END` for a message not open.
    pub const MESSAGE_NOT_OPEN: &str = "message_not_open";
    /// `TOOL_CALL_START` for a tool call already open.
    pub const TOOL_CALL_ALREADY_OPEN: &str = "tool_call_already_open";
    /// `TOOL_CALL_ARGS` / `_END` for a tool call not open.
    pub const TOOL_CALL_NOT_OPEN: &str = "tool_call_not_open";
    /// `TOOL_CALL_START` tagged with another subagent than its parent message's owner.
    pub const TOOL_CALL_PARENT_OWNER_MISMATCH: &str = "tool_call_parent_owner_mismatch";
    /// An untagged `TOOL_CALL_START` re-opening a call owned by someone other than the owner
    /// of its new parent message.
    pub const TOOL_CALL_OWNER_CONFLICT: &str = "tool_call_owner_conflict";
    /// An event whose `subagentRunId` disagrees with the owner of what it continues.
    pub const SUBAGENT_TAG_MISMATCH: &str = "subagent_tag_mismatch";
    /// `STEP_STARTED` for a step already open (same owner, same name).
    pub const STEP_ALREADY_OPEN: &str = "step_already_open";
    /// `STEP_FINISHED` for a step never started.
    pub const STEP_NOT_OPEN: &str = "step_not_open";
    /// `STEP_FINISHED` for a step open under another owner.
    pub const STEP_OWNER_MISMATCH: &str = "step_owner_mismatch";
    /// `REASONING_START` for a span already open.
    pub const REASONING_SPAN_ALREADY_OPEN: &str = "reasoning_span_already_open";
    /// `REASONING_END` for a span not open.
    pub const REASONING_SPAN_NOT_OPEN: &str = "reasoning_span_not_open";
    /// `REASONING_MESSAGE_START` for a reasoning message already open.
    pub const REASONING_MESSAGE_ALREADY_OPEN: &str = "reasoning_message_already_open";
    /// `REASONING_MESSAGE_CONTENT` / `_END` for a reasoning message not open.
    pub const REASONING_MESSAGE_NOT_OPEN: &str = "reasoning_message_not_open";
    /// `SUBAGENT_*` without a string `subagentRunId`.
    pub const SUBAGENT_MISSING_ID: &str = "subagent_missing_id";
    /// `SUBAGENT_STARTED` without a string `name`.
    pub const SUBAGENT_MISSING_NAME: &str = "subagent_missing_name";
    /// `SUBAGENT_ERROR` without a string `message`.
    pub const SUBAGENT_MISSING_MESSAGE: &str = "subagent_missing_message";
    /// `SUBAGENT_STARTED` for a subagent already active.
    pub const SUBAGENT_ALREADY_ACTIVE: &str = "subagent_already_active";
    /// `SUBAGENT_STARTED` for a subagent that already finished in this run.
    pub const SUBAGENT_ALREADY_FINISHED: &str = "subagent_already_finished";
    /// `SUBAGENT_STARTED` naming a `parentSubagentRunId` never started in this run.
    pub const SUBAGENT_PARENT_NOT_STARTED: &str = "subagent_parent_not_started";
    /// `SUBAGENT_FINISHED` / `_ERROR` for a subagent not active.
    pub const SUBAGENT_NOT_ACTIVE: &str = "subagent_not_active";
    /// `RUN_FINISHED` with a step open.
    pub const RUN_FINISHED_WITH_OPEN_STEPS: &str = "run_finished_with_open_steps";
    /// `RUN_FINISHED` with a text message open.
    pub const RUN_FINISHED_WITH_OPEN_MESSAGES: &str = "run_finished_with_open_messages";
    /// `RUN_FINISHED` with a reasoning message open.
    pub const RUN_FINISHED_WITH_OPEN_REASONING_MESSAGES: &str =
        "run_finished_with_open_reasoning_messages";
    /// `RUN_FINISHED` with a reasoning span open.
    pub const RUN_FINISHED_WITH_OPEN_REASONING_SPANS: &str =
        "run_finished_with_open_reasoning_spans";
    /// `RUN_FINISHED` with a tool call open.
    pub const RUN_FINISHED_WITH_OPEN_TOOL_CALLS: &str = "run_finished_with_open_tool_calls";
    /// `RUN_FINISHED` with a subagent active.
    pub const RUN_FINISHED_WITH_OPEN_SUBAGENTS: &str = "run_finished_with_open_subagents";
    /// A first chunk without its `messageId` / `toolCallId` (`transformChunks`).
    pub const CHUNK_MISSING_ID: &str = "chunk_missing_id";
    /// A first `TOOL_CALL_CHUNK` without `toolCallName` (`transformChunks`).
    pub const CHUNK_MISSING_TOOL_CALL_NAME: &str = "chunk_missing_tool_call_name";
    /// A continuation chunk repeating `role` / `name` / `toolCallName` / `parentMessageId`
    /// with another value (`transformChunks`).
    pub const CHUNK_FIELD_MISMATCH: &str = "chunk_field_mismatch";
    /// A chunk naming an open id with a `subagentRunId` other than its lane's.
    pub const CHUNK_SUBAGENT_MISMATCH: &str = "chunk_subagent_mismatch";
    /// An untagged, id-less chunk while several subagent lanes have that kind open.
    pub const CHUNK_LANE_AMBIGUOUS: &str = "chunk_lane_ambiguous";
    /// A chunk member that must be a string is not (schema-invalid; broker wording).
    pub const CHUNK_FIELD_MALFORMED: &str = "chunk_field_malformed";
}

/// An event the AG-UI 1.0 client would refuse at this point of the stream: the run errors.
///
/// `message` is the client's own wording where it has one (AGUI.md §5 quotes several), so a
/// producer can search for it; `rule` is a stable code from [`rule`]. The event's position in
/// a batch is the caller's to add.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OrderViolation {
    /// Stable short code, one of the [`rule`] constants.
    pub rule: &'static str,
    /// Human-readable reason, in the client's words.
    pub message: String,
}

impl OrderViolation {
    /// A violation of `rule` with `message`.
    pub fn new(rule: &'static str, message: impl Into<String>) -> Self {
        Self {
            rule,
            message: message.into(),
        }
    }
}

/// Where the thread's current run stands, with the original events (shared, cheap to
/// clone) a prelude restates (SPEC §5).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RunStatus {
    /// No run yet (empty stream).
    #[default]
    None,
    /// Started, neither finished nor errored.
    Running {
        /// The run's `RUN_STARTED`, as published (`input` included).
        run_started: Arc<Value>,
    },
    /// Ended with `RUN_FINISHED`.
    Finished {
        /// The run's `RUN_STARTED`.
        run_started: Arc<Value>,
        /// Its `RUN_FINISHED` (outcome, result, usage).
        run_finished: Arc<Value>,
    },
    /// Ended with `RUN_ERROR`: mid-run, after `RUN_FINISHED` (a late error, which means the
    /// run failed), or as the stream's very first event.
    Errored {
        /// The run's `RUN_STARTED`; `None` when `RUN_ERROR` was the stream's first event.
        run_started: Option<Arc<Value>>,
        /// The `RUN_FINISHED` a late `RUN_ERROR` followed, if any.
        run_finished: Option<Arc<Value>>,
        /// The `RUN_ERROR`.
        run_error: Arc<Value>,
    },
}

/// One open construct, with the event that opened it.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenItem {
    id: Arc<str>,
    owner: Option<Arc<str>>,
    start: Arc<Value>,
    seq: u64,
}

impl OpenItem {
    /// The construct's id: `messageId` (text and reasoning messages, reasoning spans),
    /// `toolCallId`, `stepName`, or the subagent's `subagentRunId`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The opening event's `subagentRunId` (for a step, the owner it is keyed by; for a
    /// subagent, its own id).
    pub fn subagent_run_id(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// The event that opened it, as the verifier saw it: the published START (or
    /// `STEP_STARTED`, `SUBAGENT_STARTED`), or the START `transformChunks` synthesised from a
    /// chunk. It carries what a re-open needs: `role`/`name`, `toolCallName`/
    /// `parentMessageId`, `subagentRunId`, `metadata`.
    pub fn start(&self) -> &Value {
        &self.start
    }

    /// [`Self::start`], shared.
    pub fn start_shared(&self) -> &Arc<Value> {
        &self.start
    }

    /// Position in the overall opening order (increasing across all kinds; see
    /// [`OpenConstructs::in_opening_order`]).
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// Open items of one kind: ordered by opening, indexed by id (and, for steps, owner).
#[derive(Clone, Debug, Default, PartialEq)]
struct OpenSet {
    by_seq: BTreeMap<u64, OpenItem>,
    /// id → the (key owner, seq) pairs open under that id. The key owner is always `None`
    /// except for steps, which the client keys by `(subagentRunId, stepName)`.
    by_id: HashMap<Arc<str>, Vec<(Owner, u64)>>,
}

impl OpenSet {
    fn seq_of(&self, id: &str, key_owner: Option<&str>) -> Option<u64> {
        self.by_id
            .get(id)?
            .iter()
            .find(|(owner, _)| owner.as_deref() == key_owner)
            .map(|&(_, seq)| seq)
    }

    fn contains(&self, id: &str, key_owner: Option<&str>) -> bool {
        self.seq_of(id, key_owner).is_some()
    }

    fn insert(&mut self, item: OpenItem, key_owner: Option<Arc<str>>) {
        self.by_id
            .entry(item.id.clone())
            .or_default()
            .push((key_owner, item.seq));
        self.by_seq.insert(item.seq, item);
    }

    fn remove(&mut self, id: &str, key_owner: Option<&str>) {
        let Some(keys) = self.by_id.get_mut(id) else {
            return;
        };
        if let Some(at) = keys
            .iter()
            .position(|(owner, _)| owner.as_deref() == key_owner)
        {
            let (_, seq) = keys.swap_remove(at);
            self.by_seq.remove(&seq);
        }
        if keys.is_empty() {
            self.by_id.remove(id);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }

    /// The ids in opening order, joined as the client joins them (`", "`).
    fn ids_joined(&self) -> String {
        let mut out = String::new();
        for item in self.by_seq.values() {
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(&item.id);
        }
        out
    }
}

/// What kind of construct an [`OpenItem`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpenKind {
    /// Opened by `TEXT_MESSAGE_START`.
    TextMessage,
    /// Opened by `TOOL_CALL_START`.
    ToolCall,
    /// Opened by `REASONING_START`.
    ReasoningSpan,
    /// Opened by `REASONING_MESSAGE_START`.
    ReasoningMessage,
    /// Opened by `STEP_STARTED`.
    Step,
    /// Opened by `SUBAGENT_STARTED`.
    Subagent,
}

/// The constructs `verifyEvents` holds open, each list in opening order, and the run status.
///
/// After `RUN_ERROR` the lists still show what was open when the run errored (the client
/// keeps them until the next `RUN_STARTED`); nothing may continue them, so a prelude for an
/// errored run re-opens nothing. After `RUN_FINISHED` they are empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpenConstructs {
    run: RunStatus,
    text_messages: OpenSet,
    tool_calls: OpenSet,
    reasoning_spans: OpenSet,
    reasoning_messages: OpenSet,
    steps: OpenSet,
    subagents: OpenSet,
}

/// Items of one kind in opening order.
pub type OpenItems<'a> = btree_map::Values<'a, u64, OpenItem>;

impl OpenConstructs {
    /// The current run's status, with its original events.
    pub fn run(&self) -> &RunStatus {
        &self.run
    }

    /// Open text messages (`messageId`; start = `TEXT_MESSAGE_START` with `role`/`name`).
    pub fn text_messages(&self) -> OpenItems<'_> {
        self.text_messages.by_seq.values()
    }

    /// Open tool calls (`toolCallId`; start = `TOOL_CALL_START` with `toolCallName` and
    /// `parentMessageId`).
    pub fn tool_calls(&self) -> OpenItems<'_> {
        self.tool_calls.by_seq.values()
    }

    /// Open reasoning spans (`messageId`; start = `REASONING_START`).
    pub fn reasoning_spans(&self) -> OpenItems<'_> {
        self.reasoning_spans.by_seq.values()
    }

    /// Open reasoning messages (`messageId`; start = `REASONING_MESSAGE_START`).
    pub fn reasoning_messages(&self) -> OpenItems<'_> {
        self.reasoning_messages.by_seq.values()
    }

    /// Open steps (`stepName` + the `subagentRunId` they are keyed by; start =
    /// `STEP_STARTED`).
    pub fn steps(&self) -> OpenItems<'_> {
        self.steps.by_seq.values()
    }

    /// Active subagents (`subagentRunId`; start = `SUBAGENT_STARTED`).
    pub fn subagents(&self) -> OpenItems<'_> {
        self.subagents.by_seq.values()
    }

    /// Whether text message `id` is open.
    pub fn is_text_message_open(&self, id: &str) -> bool {
        self.text_messages.contains(id, None)
    }

    /// Whether tool call `id` is open.
    pub fn is_tool_call_open(&self, id: &str) -> bool {
        self.tool_calls.contains(id, None)
    }

    /// Whether nothing is open (the run status aside).
    pub fn is_empty(&self) -> bool {
        self.text_messages.is_empty()
            && self.tool_calls.is_empty()
            && self.reasoning_spans.is_empty()
            && self.reasoning_messages.is_empty()
            && self.steps.is_empty()
            && self.subagents.is_empty()
    }

    /// Every open construct, all kinds merged in the order they opened: the order in which a
    /// prelude re-opens them (a subagent before the steps and messages it opened after it).
    pub fn in_opening_order(&self) -> Vec<(OpenKind, &OpenItem)> {
        let mut all: Vec<(OpenKind, &OpenItem)> = [
            (OpenKind::TextMessage, &self.text_messages),
            (OpenKind::ToolCall, &self.tool_calls),
            (OpenKind::ReasoningSpan, &self.reasoning_spans),
            (OpenKind::ReasoningMessage, &self.reasoning_messages),
            (OpenKind::Step, &self.steps),
            (OpenKind::Subagent, &self.subagents),
        ]
        .into_iter()
        .flat_map(|(kind, set)| set.by_seq.values().map(move |item| (kind, item)))
        .collect();
        all.sort_by_key(|(_, item)| item.seq);
        all
    }
}

/// Owner of an entity: `None` is the parent agent.
type Owner = Option<Arc<str>>;

/// The client's per-kind owner buckets, retained for the whole run (not cleared on close).
#[derive(Clone, Debug, Default, PartialEq)]
struct Owners {
    message: HashMap<Arc<str>, Owner>,
    tool_call: HashMap<Arc<str>, Owner>,
    activity: HashMap<Arc<str>, Owner>,
    reasoning: HashMap<Arc<str>, Owner>,
}

/// `@ag-ui/client` 1.0.0 `verifyEvents` as a state machine over one stream of expanded
/// events (see the module docs for what it checks).
///
/// [`Self::verify`] is atomic: an event it refuses leaves the state unchanged. Cloning costs
/// the open constructs plus the run's owner maps (one entry per message / tool call id seen
/// in the run, `RUN_STARTED.input.messages` and `MESSAGES_SNAPSHOT` included); keys are
/// shared `Arc<str>`, events are shared `Arc<Value>`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderVerifier {
    first_event_received: bool,
    run_started: bool,
    run_finished: bool,
    run_error: bool,
    open: OpenConstructs,
    owners: Owners,
    /// Step owners in the order the client's `activeSteps` map first saw them (the order of
    /// the `RUN_FINISHED` open-steps message).
    step_owners: Vec<Owner>,
    /// Subagents closed in this run.
    closed_subagents: HashSet<Arc<str>>,
    next_seq: u64,
}

/// The `subagentRunId` tag of an event: absent, or a string; `null` is fatal.
fn tag_of(obj: &Map<String, Value>, event_type: EventType) -> Result<Option<&str>, OrderViolation> {
    match obj.get("subagentRunId") {
        None => Ok(None),
        Some(Value::String(tag)) => Ok(Some(tag)),
        Some(Value::Null) => Err(OrderViolation::new(
            rule::SUBAGENT_RUN_ID_NULL,
            format!(
                "Cannot send '{event_type}' with 'subagentRunId: null'. The field is optional — \
                 omit it entirely."
            ),
        )),
        Some(_) => Err(OrderViolation::new(
            rule::SUBAGENT_RUN_ID_MALFORMED,
            format!("Cannot send '{event_type}' with a non-string 'subagentRunId'."),
        )),
    }
}

/// A required string member (always present on schema-valid events).
fn required_str<'v>(
    obj: &'v Map<String, Value>,
    field: &str,
    event_type: EventType,
) -> Result<&'v str, OrderViolation> {
    obj.get(field).and_then(Value::as_str).ok_or_else(|| {
        OrderViolation::new(
            rule::MISSING_FIELD,
            format!("Cannot send '{event_type}' without a string '{field}'."),
        )
    })
}

/// JavaScript's `String(value)` for the few places the client interpolates a raw value.
fn js_string(value: Option<&Value>) -> String {
    match value {
        None => "undefined".to_owned(),
        Some(Value::Null) => "null".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Object(_)) => "[object Object]".to_owned(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::Null => String::new(),
                other => js_string(Some(other)),
            })
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// "'s1'" or the parent agent, as the client names an owner.
fn owner_name(owner: Option<&str>) -> &str {
    owner.unwrap_or("(the parent agent)")
}

/// The client's `subagentTagError`: an untagged event always agrees; a tagged one must match
/// a recorded owner (an untagged opener is the parent, which is an owner too).
fn check_tag(
    event_type: EventType,
    tag: Option<&str>,
    owner: Option<&Owner>,
    entity_kind: &str,
    entity_id: &str,
) -> Result<(), OrderViolation> {
    let (Some(tag), Some(owner)) = (tag, owner) else {
        return Ok(());
    };
    if owner.as_deref() == Some(tag) {
        return Ok(());
    }
    Err(OrderViolation::new(
        rule::SUBAGENT_TAG_MISMATCH,
        format!(
            "Cannot send '{event_type}': subagentRunId '{tag}' does not match the {entity_kind} \
             '{entity_id}' opener's subagent '{}'.",
            owner_name(owner.as_deref()),
        ),
    ))
}

/// The messages of a `MESSAGES_SNAPSHOT` or `RUN_STARTED.input`, when an array.
fn message_list(messages: Option<&Value>) -> &[Value] {
    match messages {
        Some(Value::Array(list)) => list,
        _ => &[],
    }
}

impl OrderVerifier {
    /// A verifier at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// What is open, and the run status.
    pub fn open(&self) -> &OpenConstructs {
        &self.open
    }

    /// Checks one expanded event as `verifyEvents` does and, when it passes, records its
    /// effect. Events that are not objects with a known AG-UI 1.0 `type` are ignored.
    ///
    /// # Errors
    /// [`OrderViolation`] naming the client rule the event breaks; the state is then
    /// unchanged.
    pub fn verify(&mut self, event: &Value) -> Result<(), OrderViolation> {
        let Some(obj) = event.as_object() else {
            return Ok(());
        };
        let Some(event_type) = obj
            .get("type")
            .and_then(Value::as_str)
            .and_then(EventType::parse)
        else {
            return Ok(());
        };
        let reset = self.check_lifecycle(event_type)?;
        use EventType as T;
        // Run-scoped events carry no attribution: the client strips a `subagentRunId` there.
        let tag = match event_type {
            T::RunStarted | T::RunFinished | T::RunError | T::MessagesSnapshot => None,
            _ => tag_of(obj, event_type)?,
        };
        check_lifecycle_fields(obj, event_type)?;

        match event_type {
            T::TextMessageStart => self.text_message_start(event, obj, tag)?,
            T::TextMessageContent | T::TextMessageEnd => {
                self.text_message_continue(obj, event_type, tag)?;
            }
            T::ToolCallStart => self.tool_call_start(event, obj, tag)?,
            T::ToolCallArgs | T::ToolCallEnd => self.tool_call_continue(obj, event_type, tag)?,
            T::StepStarted => self.step_started(event, obj, tag)?,
            T::StepFinished => self.step_finished(obj, tag)?,
            T::ActivitySnapshot => {
                let id = required_str(obj, "messageId", event_type)?;
                let replace = obj.get("replace") != Some(&Value::Bool(false));
                if replace || !self.owners.activity.contains_key(id) {
                    self.owners.activity.insert(id.into(), tag.map(Arc::from));
                }
            }
            T::ToolCallResult => {
                // Records the minted tool message's owner; newest wins. No other check.
                if let Some(id) = obj.get("messageId").and_then(Value::as_str) {
                    self.owners.message.insert(id.into(), tag.map(Arc::from));
                }
            }
            T::ReasoningStart | T::ReasoningMessageStart => {
                self.reasoning_start(event, obj, event_type, tag)?;
            }
            T::ReasoningMessageContent | T::ReasoningMessageEnd | T::ReasoningEnd => {
                self.reasoning_continue(obj, event_type, tag)?;
            }
            T::ReasoningEncryptedValue => {
                let id = required_str(obj, "entityId", event_type)?;
                let (owner, kind) = match obj.get("subtype").and_then(Value::as_str) {
                    Some("tool-call") => (self.owners.tool_call.get(id), "tool call"),
                    Some("message") => (
                        self.owners
                            .message
                            .get(id)
                            .or_else(|| self.owners.reasoning.get(id)),
                        "message",
                    ),
                    _ => (self.owners.reasoning.get(id), "reasoning message"),
                };
                check_tag(event_type, tag, owner, kind, id)?;
            }
            T::ActivityDelta => {
                let id = required_str(obj, "messageId", event_type)?;
                check_tag(event_type, tag, self.owners.activity.get(id), "activity", id)?;
            }
            T::SubagentStarted => self.subagent_started(event, obj, tag)?,
            T::SubagentFinished | T::SubagentError => {
                self.subagent_terminal(obj, event_type, tag)?;
            }
            T::MessagesSnapshot => {
                let messages = obj.get("messages");
                check_seed(messages)?;
                self.seed_owners(messages, true);
            }
            T::RunStarted => {
                let messages = obj.get("input").and_then(|input| input.get("messages"));
                check_seed(messages)?;
                if reset {
                    self.reset_run();
                }
                self.run_started = true;
                self.seed_owners(messages, false);
                self.open.run = RunStatus::Running {
                    run_started: Arc::new(event.clone()),
                };
            }
            T::RunFinished => self.run_finished(event)?,
            T::RunError => {
                self.run_error = true;
                let run_error = Arc::new(event.clone());
                self.open.run = match std::mem::take(&mut self.open.run) {
                    RunStatus::Running { run_started } => RunStatus::Errored {
                        run_started: Some(run_started),
                        run_finished: None,
                        run_error,
                    },
                    RunStatus::Finished {
                        run_started,
                        run_finished,
                    } => RunStatus::Errored {
                        run_started: Some(run_started),
                        run_finished: Some(run_finished),
                        run_error,
                    },
                    // First event of the stream (an errored run cannot error again).
                    RunStatus::None | RunStatus::Errored { .. } => RunStatus::Errored {
                        run_started: None,
                        run_finished: None,
                        run_error,
                    },
                };
            }
            T::StateSnapshot
            | T::StateDelta
            | T::Custom
            | T::Raw
            // Chunks never reach the verifier in the client pipeline; unexpanded, it has no
            // rule for them.
            | T::TextMessageChunk
            | T::ToolCallChunk
            | T::ReasoningMessageChunk => {}
        }
        self.first_event_received = true;
        Ok(())
    }

    /// Checks 1–4: errored, finished, first event, nested `RUN_STARTED`. Returns whether a
    /// `RUN_STARTED` resets the per-run tracking.
    fn check_lifecycle(&self, event_type: EventType) -> Result<bool, OrderViolation> {
        let run_started = event_type == EventType::RunStarted;
        if self.run_error && !run_started {
            return Err(OrderViolation::new(
                rule::RUN_ALREADY_ERRORED,
                format!(
                    "Cannot send event type '{event_type}': The run has already errored with \
                     'RUN_ERROR'. No further events can be sent."
                ),
            ));
        }
        if self.run_finished && !run_started && event_type != EventType::RunError {
            return Err(OrderViolation::new(
                rule::RUN_ALREADY_FINISHED,
                format!(
                    "Cannot send event type '{event_type}': The run has already finished with \
                     'RUN_FINISHED'. Start a new run with 'RUN_STARTED'."
                ),
            ));
        }
        if !self.first_event_received {
            if !run_started && event_type != EventType::RunError {
                return Err(OrderViolation::new(
                    rule::FIRST_EVENT_MUST_BE_RUN_STARTED,
                    "First event must be 'RUN_STARTED'",
                ));
            }
            return Ok(false);
        }
        if run_started {
            if self.run_started && !self.run_finished && !self.run_error {
                return Err(OrderViolation::new(
                    rule::RUN_ALREADY_ACTIVE,
                    "Cannot send 'RUN_STARTED' while a run is still active. The previous run \
                     must be finished with 'RUN_FINISHED' before starting a new run.",
                ));
            }
            return Ok(self.run_finished || self.run_error);
        }
        Ok(false)
    }

    /// The client's `resetRunState`, run by a `RUN_STARTED` that follows a closed run.
    fn reset_run(&mut self) {
        let run = std::mem::take(&mut self.open.run);
        self.open = OpenConstructs {
            run,
            ..OpenConstructs::default()
        };
        self.owners = Owners::default();
        self.step_owners.clear();
        self.closed_subagents.clear();
        self.run_finished = false;
        self.run_error = false;
        self.run_started = true;
    }

    /// The client's `seedOwnersFromMessages` (after [`check_seed`] passed): snapshot
    /// messages (`authoritative`) replace recorded owners; input-echo messages fill gaps.
    fn seed_owners(&mut self, messages: Option<&Value>, authoritative: bool) {
        for message in message_list(messages) {
            let Some(id) = message.get("id").and_then(Value::as_str) else {
                continue;
            };
            let owner: Owner = message
                .get("subagentRunId")
                .and_then(Value::as_str)
                .map(Arc::from);
            let bucket = match message.get("role").and_then(Value::as_str) {
                Some("reasoning") => &mut self.owners.reasoning,
                Some("activity") => &mut self.owners.activity,
                _ => &mut self.owners.message,
            };
            if authoritative || !bucket.contains_key(id) {
                bucket.insert(id.into(), owner.clone());
            }
            let calls = match message.get("toolCalls") {
                Some(Value::Array(calls)) => calls.as_slice(),
                _ => &[],
            };
            for call in calls {
                if let Some(call_id) = call.get("id").and_then(Value::as_str)
                    && (authoritative || !self.owners.tool_call.contains_key(call_id))
                {
                    self.owners.tool_call.insert(call_id.into(), owner.clone());
                }
            }
        }
    }

    fn next_item(&mut self, id: &str, owner: Option<&str>, start: &Value) -> OpenItem {
        let seq = self.next_seq;
        self.next_seq += 1;
        OpenItem {
            id: id.into(),
            owner: owner.map(Arc::from),
            start: Arc::new(start.clone()),
            seq,
        }
    }

    fn text_message_start(
        &mut self,
        event: &Value,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let event_type = EventType::TextMessageStart;
        let id = required_str(obj, "messageId", event_type)?;
        if self.open.text_messages.contains(id, None) {
            return Err(OrderViolation::new(
                rule::MESSAGE_ALREADY_OPEN,
                format!(
                    "Cannot send 'TEXT_MESSAGE_START' event: A text message with ID '{id}' is \
                     already in progress. Complete it with 'TEXT_MESSAGE_END' first."
                ),
            ));
        }
        // First writer wins; a re-open by another producer is a contradiction.
        let existing = self.owners.message.get(id);
        check_tag(event_type, tag, existing, "message", id)?;
        if existing.is_none() {
            self.owners.message.insert(id.into(), tag.map(Arc::from));
        }
        let item = self.next_item(id, tag, event);
        self.open.text_messages.insert(item, None);
        Ok(())
    }

    fn text_message_continue(
        &mut self,
        obj: &Map<String, Value>,
        event_type: EventType,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let id = required_str(obj, "messageId", event_type)?;
        if !self.open.text_messages.contains(id, None) {
            let advice = if event_type == EventType::TextMessageEnd {
                "A 'TEXT_MESSAGE_START' event must be sent first."
            } else {
                "Start a text message with 'TEXT_MESSAGE_START' first."
            };
            return Err(OrderViolation::new(
                rule::MESSAGE_NOT_OPEN,
                format!(
                    "Cannot send '{event_type}' event: No active text message found with ID \
                     '{id}'. {advice}"
                ),
            ));
        }
        check_tag(event_type, tag, self.owners.message.get(id), "message", id)?;
        if event_type == EventType::TextMessageEnd {
            self.open.text_messages.remove(id, None);
        }
        Ok(())
    }

    fn tool_call_start(
        &mut self,
        event: &Value,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let event_type = EventType::ToolCallStart;
        let id = required_str(obj, "toolCallId", event_type)?;
        if self.open.tool_calls.contains(id, None) {
            return Err(OrderViolation::new(
                rule::TOOL_CALL_ALREADY_OPEN,
                format!(
                    "Cannot send 'TOOL_CALL_START' event: A tool call with ID '{id}' is already \
                     in progress. Complete it with 'TOOL_CALL_END' first."
                ),
            ));
        }
        // A tool call lives inside its parent message, so it inherits (and must agree with)
        // that message's owner.
        let parent = obj.get("parentMessageId").and_then(Value::as_str);
        let mut inherited: Option<&Owner> = None;
        if let Some(parent) = parent
            && let Some(parent_owner) = self.owners.message.get(parent)
        {
            if let Some(tag) = tag
                && parent_owner.as_deref() != Some(tag)
            {
                return Err(OrderViolation::new(
                    rule::TOOL_CALL_PARENT_OWNER_MISMATCH,
                    format!(
                        "Cannot send 'TOOL_CALL_START': subagentRunId '{tag}' does not match its \
                         parent message '{parent}' owner '{}'. A tool call belongs to the \
                         message that carries it.",
                        owner_name(parent_owner.as_deref()),
                    ),
                ));
            }
            inherited = Some(parent_owner);
        }
        let existing = self.owners.tool_call.get(id);
        if let Some(existing) = existing {
            check_tag(event_type, tag, Some(existing), "tool call", id)?;
            if tag.is_none()
                && let Some(inherited) = inherited
                && inherited != existing
            {
                return Err(OrderViolation::new(
                    rule::TOOL_CALL_OWNER_CONFLICT,
                    format!(
                        "Cannot send 'TOOL_CALL_START': tool call '{id}' is owned by '{}' but its \
                         parent message '{}' is owned by '{}'. A tool call belongs to the \
                         message that carries it.",
                        owner_name(existing.as_deref()),
                        parent.unwrap_or("undefined"),
                        owner_name(inherited.as_deref()),
                    ),
                ));
            }
        }
        if existing.is_none() {
            let owner: Owner = match tag {
                Some(tag) => Some(Arc::from(tag)),
                None => inherited.cloned().flatten(),
            };
            self.owners.tool_call.insert(id.into(), owner);
        }
        let item = self.next_item(id, tag, event);
        self.open.tool_calls.insert(item, None);
        Ok(())
    }

    fn tool_call_continue(
        &mut self,
        obj: &Map<String, Value>,
        event_type: EventType,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let id = required_str(obj, "toolCallId", event_type)?;
        if !self.open.tool_calls.contains(id, None) {
            let advice = if event_type == EventType::ToolCallEnd {
                "A 'TOOL_CALL_START' event must be sent first."
            } else {
                "Start a tool call with 'TOOL_CALL_START' first."
            };
            return Err(OrderViolation::new(
                rule::TOOL_CALL_NOT_OPEN,
                format!(
                    "Cannot send '{event_type}' event: No active tool call found with ID '{id}'. \
                     {advice}"
                ),
            ));
        }
        check_tag(
            event_type,
            tag,
            self.owners.tool_call.get(id),
            "tool call",
            id,
        )?;
        if event_type == EventType::ToolCallEnd {
            self.open.tool_calls.remove(id, None);
        }
        Ok(())
    }

    fn step_started(
        &mut self,
        event: &Value,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let name = required_str(obj, "stepName", EventType::StepStarted)?;
        if self.open.steps.contains(name, tag) {
            let within = tag.map_or_else(String::new, |tag| format!(" in subagent '{tag}'"));
            return Err(OrderViolation::new(
                rule::STEP_ALREADY_OPEN,
                format!("Step \"{name}\" is already active for 'STEP_STARTED'{within}"),
            ));
        }
        if !self.step_owners.iter().any(|owner| owner.as_deref() == tag) {
            self.step_owners.push(tag.map(Arc::from));
        }
        let item = self.next_item(name, tag, event);
        self.open.steps.insert(item, tag.map(Arc::from));
        Ok(())
    }

    fn step_finished(
        &mut self,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let name = required_str(obj, "stepName", EventType::StepFinished)?;
        if !self.open.steps.contains(name, tag) {
            // Open under another owner: the likelier mistake, reported as such.
            let other = self.step_owners.iter().find(|owner| {
                owner.as_deref() != tag && self.open.steps.contains(name, owner.as_deref())
            });
            let who = |owner: Option<&str>| {
                owner.map_or_else(
                    || "the parent agent".to_owned(),
                    |owner| format!("subagent '{owner}'"),
                )
            };
            if let Some(other) = other {
                return Err(OrderViolation::new(
                    rule::STEP_OWNER_MISMATCH,
                    format!(
                        "Cannot send 'STEP_FINISHED' for step \"{name}\" attributed to {}: that \
                         step is open under {}. A step must be finished by whoever started it.",
                        who(tag),
                        who(other.as_deref()),
                    ),
                ));
            }
            return Err(OrderViolation::new(
                rule::STEP_NOT_OPEN,
                format!("Cannot send 'STEP_FINISHED' for step \"{name}\" that was not started"),
            ));
        }
        self.open.steps.remove(name, tag);
        Ok(())
    }

    fn reasoning_start(
        &mut self,
        event: &Value,
        obj: &Map<String, Value>,
        event_type: EventType,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let id = required_str(obj, "messageId", event_type)?;
        let is_span = event_type == EventType::ReasoningStart;
        let open = if is_span {
            &self.open.reasoning_spans
        } else {
            &self.open.reasoning_messages
        };
        if open.contains(id, None) {
            return Err(if is_span {
                OrderViolation::new(
                    rule::REASONING_SPAN_ALREADY_OPEN,
                    format!(
                        "Cannot send 'REASONING_START' event: A reasoning span with ID '{id}' is \
                         already in progress. Complete it with 'REASONING_END' first."
                    ),
                )
            } else {
                OrderViolation::new(
                    rule::REASONING_MESSAGE_ALREADY_OPEN,
                    format!(
                        "Cannot send 'REASONING_MESSAGE_START' event: A reasoning message with ID \
                         '{id}' is already in progress. Complete it with 'REASONING_MESSAGE_END' \
                         first."
                    ),
                )
            });
        }
        let existing = self.owners.reasoning.get(id);
        check_tag(event_type, tag, existing, "reasoning message", id)?;
        if existing.is_none() {
            self.owners.reasoning.insert(id.into(), tag.map(Arc::from));
        }
        let item = self.next_item(id, tag, event);
        if is_span {
            self.open.reasoning_spans.insert(item, None);
        } else {
            self.open.reasoning_messages.insert(item, None);
        }
        Ok(())
    }

    fn reasoning_continue(
        &mut self,
        obj: &Map<String, Value>,
        event_type: EventType,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let id = required_str(obj, "messageId", event_type)?;
        let is_span = event_type == EventType::ReasoningEnd;
        let open = if is_span {
            &self.open.reasoning_spans
        } else {
            &self.open.reasoning_messages
        };
        if !open.contains(id, None) {
            return Err(if is_span {
                OrderViolation::new(
                    rule::REASONING_SPAN_NOT_OPEN,
                    format!(
                        "Cannot send 'REASONING_END' event: No active reasoning span found with \
                         ID '{id}'. A 'REASONING_START' event must be sent first."
                    ),
                )
            } else {
                OrderViolation::new(
                    rule::REASONING_MESSAGE_NOT_OPEN,
                    format!(
                        "Cannot send '{event_type}' event: No active reasoning message found with \
                         ID '{id}'. Start a reasoning message with 'REASONING_MESSAGE_START' \
                         first."
                    ),
                )
            });
        }
        check_tag(
            event_type,
            tag,
            self.owners.reasoning.get(id),
            "reasoning message",
            id,
        )?;
        match event_type {
            EventType::ReasoningEnd => self.open.reasoning_spans.remove(id, None),
            EventType::ReasoningMessageEnd => self.open.reasoning_messages.remove(id, None),
            _ => {}
        }
        Ok(())
    }

    fn subagent_started(
        &mut self,
        event: &Value,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let Some(id) = tag else {
            return Err(OrderViolation::new(
                rule::SUBAGENT_MISSING_ID,
                "Cannot send 'SUBAGENT_STARTED' without a 'subagentRunId'.",
            ));
        };
        if !obj.get("name").is_some_and(Value::is_string) {
            return Err(OrderViolation::new(
                rule::SUBAGENT_MISSING_NAME,
                "Cannot send 'SUBAGENT_STARTED' without a 'name'.",
            ));
        }
        if self.open.subagents.contains(id, None) {
            return Err(OrderViolation::new(
                rule::SUBAGENT_ALREADY_ACTIVE,
                format!(
                    "Cannot send 'SUBAGENT_STARTED': subagent '{id}' is already active. Finish it \
                     with 'SUBAGENT_FINISHED' first."
                ),
            ));
        }
        if self.closed_subagents.contains(id) {
            return Err(OrderViolation::new(
                rule::SUBAGENT_ALREADY_FINISHED,
                format!(
                    "Cannot send 'SUBAGENT_STARTED': subagent '{id}' has already finished in this \
                     run. Subagent IDs are per-invocation and cannot be reused."
                ),
            ));
        }
        if let Some(parent) = obj.get("parentSubagentRunId").and_then(Value::as_str)
            && !self.open.subagents.contains(parent, None)
            && !self.closed_subagents.contains(parent)
        {
            return Err(OrderViolation::new(
                rule::SUBAGENT_PARENT_NOT_STARTED,
                format!(
                    "Cannot send 'SUBAGENT_STARTED': parentSubagentRunId '{parent}' has not been \
                     started in this run."
                ),
            ));
        }
        let item = self.next_item(id, Some(id), event);
        self.open.subagents.insert(item, None);
        Ok(())
    }

    fn subagent_terminal(
        &mut self,
        obj: &Map<String, Value>,
        event_type: EventType,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let Some(id) = tag else {
            return Err(OrderViolation::new(
                rule::SUBAGENT_MISSING_ID,
                format!("Cannot send '{event_type}' without a 'subagentRunId'."),
            ));
        };
        if event_type == EventType::SubagentError
            && !obj.get("message").is_some_and(Value::is_string)
        {
            return Err(OrderViolation::new(
                rule::SUBAGENT_MISSING_MESSAGE,
                "Cannot send 'SUBAGENT_ERROR' without a 'message'.",
            ));
        }
        if !self.open.subagents.contains(id, None) {
            return Err(OrderViolation::new(
                rule::SUBAGENT_NOT_ACTIVE,
                format!(
                    "Cannot send '{event_type}': no active subagent found with ID '{id}'. A \
                     'SUBAGENT_STARTED' event must be sent first."
                ),
            ));
        }
        self.open.subagents.remove(id, None);
        self.closed_subagents.insert(id.into());
        Ok(())
    }

    fn run_finished(&mut self, event: &Value) -> Result<(), OrderViolation> {
        let open = &self.open;
        if !open.steps.is_empty() {
            let mut parts = String::new();
            for owner in &self.step_owners {
                for step in open
                    .steps
                    .by_seq
                    .values()
                    .filter(|step| step.owner == *owner)
                {
                    if !parts.is_empty() {
                        parts.push_str(", ");
                    }
                    parts.push_str(&step.id);
                    if let Some(owner) = owner {
                        // Writing to a String cannot fail.
                        let _ = write!(parts, " (subagent '{owner}')");
                    }
                }
            }
            return Err(OrderViolation::new(
                rule::RUN_FINISHED_WITH_OPEN_STEPS,
                format!("Cannot send 'RUN_FINISHED' while steps are still active: {parts}"),
            ));
        }
        let still_open = [
            (
                &open.text_messages,
                rule::RUN_FINISHED_WITH_OPEN_MESSAGES,
                "text messages",
            ),
            (
                &open.reasoning_messages,
                rule::RUN_FINISHED_WITH_OPEN_REASONING_MESSAGES,
                "reasoning messages",
            ),
            (
                &open.reasoning_spans,
                rule::RUN_FINISHED_WITH_OPEN_REASONING_SPANS,
                "reasoning spans",
            ),
            (
                &open.tool_calls,
                rule::RUN_FINISHED_WITH_OPEN_TOOL_CALLS,
                "tool calls",
            ),
            (
                &open.subagents,
                rule::RUN_FINISHED_WITH_OPEN_SUBAGENTS,
                "subagents",
            ),
        ];
        for (set, code, what) in still_open {
            if !set.is_empty() {
                return Err(OrderViolation::new(
                    code,
                    format!(
                        "Cannot send 'RUN_FINISHED' while {what} are still active: {}",
                        set.ids_joined()
                    ),
                ));
            }
        }
        self.run_finished = true;
        let run_finished = Arc::new(event.clone());
        self.open.run = match std::mem::take(&mut self.open.run) {
            RunStatus::Running { run_started } => RunStatus::Finished {
                run_started,
                run_finished,
            },
            // Unreachable: RUN_FINISHED passes the lifecycle checks only while a run is
            // running. Kept total rather than panicking.
            other => other,
        };
        Ok(())
    }
}

/// Check 5's per-type part: null optionals and outcome shape on `SUBAGENT_*`, null interrupt
/// attribution on `RUN_FINISHED`.
fn check_lifecycle_fields(
    obj: &Map<String, Value>,
    event_type: EventType,
) -> Result<(), OrderViolation> {
    let optionals: &[&str] = match event_type {
        EventType::SubagentStarted => &[
            "description",
            "parentSubagentRunId",
            "parentToolCallId",
            "parentMessageId",
        ],
        EventType::SubagentFinished => &["outcome"],
        EventType::SubagentError => &["code"],
        EventType::RunFinished => {
            let outcome = obj.get("outcome");
            if outcome.and_then(|o| o.get("type")).and_then(Value::as_str) == Some("interrupt")
                && let Some(Value::Array(interrupts)) = outcome.and_then(|o| o.get("interrupts"))
            {
                for interrupt in interrupts {
                    if interrupt.get("subagentRunId") == Some(&Value::Null) {
                        return Err(OrderViolation::new(
                            rule::INTERRUPT_SUBAGENT_RUN_ID_NULL,
                            format!(
                                "Cannot send 'RUN_FINISHED' with an interrupt (id '{}') carrying \
                                 'subagentRunId: null'. The field is optional — omit it entirely.",
                                js_string(interrupt.get("id")),
                            ),
                        ));
                    }
                }
            }
            return Ok(());
        }
        _ => return Ok(()),
    };
    for field in optionals {
        if obj.get(*field) == Some(&Value::Null) {
            return Err(OrderViolation::new(
                rule::SUBAGENT_FIELD_NULL,
                format!(
                    "Cannot send '{event_type}' with '{field}: null'. The field is optional — omit \
                     it entirely."
                ),
            ));
        }
    }
    // Only SUBAGENT_FINISHED declares `outcome`; on the others the client strips it.
    if event_type != EventType::SubagentFinished {
        return Ok(());
    }
    let Some(outcome) = obj.get("outcome") else {
        return Ok(());
    };
    let outcome_type = outcome.get("type");
    if !matches!(
        outcome_type.and_then(Value::as_str),
        Some("success" | "suspended")
    ) {
        return Err(OrderViolation::new(
            rule::SUBAGENT_OUTCOME_INVALID,
            format!(
                "Cannot send '{event_type}' with outcome type '{}'. The outcome is either \
                 {{ type: \"success\" }} or {{ type: \"suspended\" }}.",
                js_string(outcome_type),
            ),
        ));
    }
    match outcome.get("interruptIds") {
        Some(Value::Null) => Err(OrderViolation::new(
            rule::SUBAGENT_FIELD_NULL,
            format!(
                "Cannot send '{event_type}' with 'outcome.interruptIds: null'. The field is \
                 optional — omit it entirely."
            ),
        )),
        Some(Value::Array(ids)) if ids.iter().any(|id| !id.is_string()) => {
            Err(OrderViolation::new(
                rule::SUBAGENT_OUTCOME_INVALID,
                format!(
                    "Cannot send '{event_type}' with a non-string entry in \
                     'outcome.interruptIds'. Interrupt ids are strings."
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// The null check of `seedOwnersFromMessages`, run before any owner is seeded so a refused
/// event changes nothing.
fn check_seed(messages: Option<&Value>) -> Result<(), OrderViolation> {
    for message in message_list(messages) {
        if let Some(id) = message.get("id").and_then(Value::as_str)
            && message.get("subagentRunId") == Some(&Value::Null)
        {
            return Err(OrderViolation::new(
                rule::MESSAGE_SUBAGENT_RUN_ID_NULL,
                format!(
                    "Cannot send a message (id '{id}') with 'subagentRunId: null'. The field is \
                     optional — omit it entirely."
                ),
            ));
        }
    }
    Ok(())
}

/// The client pipeline's order stages on one stream: [`ChunkExpander`] (`transformChunks`)
/// then [`OrderVerifier`] (`verifyEvents`), as `@ag-ui/client` 1.0.0 runs them on each HTTP
/// response. The broker keeps one per thread, fed with the thread's log from its first event.
///
/// Every method that takes an event is transactional: on error nothing changes. To check a
/// batch all-or-nothing, use [`Self::check_batch`] (or check on a clone and commit).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderChecker {
    expander: ChunkExpander,
    verifier: OrderVerifier,
}

impl OrderChecker {
    /// A checker at the start of a stream (a thread with no events).
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks one event as published and, when the client would accept it, records it.
    ///
    /// # Errors
    /// [`OrderViolation`] from chunk expansion or verification; the state is then unchanged.
    pub fn check(&mut self, event: &Value) -> Result<(), OrderViolation> {
        self.check_expanded(event).map(drop)
    }

    /// [`Self::check`], returning the expanded events the client's reducer would apply for
    /// this event (borrowed when it is the event itself, owned when synthesised): what a fold
    /// mirroring the client consumes.
    ///
    /// # Errors
    /// As [`Self::check`].
    pub fn check_expanded<'a>(&mut self, event: &'a Value) -> Result<Expanded<'a>, OrderViolation> {
        // The expander holds at most one lane per subagent: cloning it is cheap.
        let mut expander = self.expander.clone();
        let expanded = expander.expand(event)?;
        match expanded.as_slice() {
            [] => {}
            // `verify` is atomic on its own.
            [one] => self.verifier.verify(one)?,
            many => {
                let mut verifier = self.verifier.clone();
                for each in many {
                    verifier.verify(each)?;
                }
                self.verifier = verifier;
            }
        }
        self.expander = expander;
        Ok(expanded)
    }

    /// Checks a batch all-or-nothing: either every event passes and all are recorded, or
    /// nothing changes.
    ///
    /// # Errors
    /// The position within the batch of the first refused event, and why.
    pub fn check_batch<'a, I>(&mut self, events: I) -> Result<(), (usize, OrderViolation)>
    where
        I: IntoIterator<Item = &'a Value>,
    {
        let mut scratch = self.clone();
        for (index, event) in events.into_iter().enumerate() {
            scratch
                .check(event)
                .map_err(|violation| (index, violation))?;
        }
        *self = scratch;
        Ok(())
    }

    /// The open constructs and run status (`verifyEvents`' view).
    pub fn open(&self) -> &OpenConstructs {
        self.verifier.open()
    }

    /// The chunk lanes still assembling a stream (`transformChunks`' view). A lane's item is
    /// normally also an open text message / tool call / reasoning message in [`Self::open`]
    /// (same id); a prelude re-opens such an item with [`OpenLane::reopening_chunk`] rather
    /// than its plain START, so later id-less chunks continue it.
    ///
    /// Edge case, as in the client: an explicit END attributed to another lane (e.g. an
    /// untagged `TEXT_MESSAGE_END` for a message a subagent's chunks opened) closes the item
    /// in the verifier but not the lane; the lane is then dead (the run terminal synthesises
    /// an END the verifier refuses).
    pub fn open_lanes(&self) -> &[OpenLane] {
        self.expander.open_lanes()
    }

    /// The chunk expander.
    pub fn expander(&self) -> &ChunkExpander {
        &self.expander
    }

    /// The verifier.
    pub fn verifier(&self) -> &OrderVerifier {
        &self.verifier
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn rs(run: &str) -> Value {
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": run})
    }
    fn rf(run: &str) -> Value {
        json!({"type": "RUN_FINISHED", "threadId": "t", "runId": run})
    }
    fn re() -> Value {
        json!({"type": "RUN_ERROR", "message": "boom"})
    }
    fn tms(id: &str) -> Value {
        json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"})
    }
    fn tmc(id: &str) -> Value {
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": "x"})
    }
    fn tme(id: &str) -> Value {
        json!({"type": "TEXT_MESSAGE_END", "messageId": id})
    }
    fn tcs(id: &str) -> Value {
        json!({"type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": "f"})
    }
    fn tca(id: &str) -> Value {
        json!({"type": "TOOL_CALL_ARGS", "toolCallId": id, "delta": "{}"})
    }
    fn tce(id: &str) -> Value {
        json!({"type": "TOOL_CALL_END", "toolCallId": id})
    }
    fn ss(name: &str) -> Value {
        json!({"type": "STEP_STARTED", "stepName": name})
    }
    fn sf(name: &str) -> Value {
        json!({"type": "STEP_FINISHED", "stepName": name})
    }
    fn rstart(id: &str) -> Value {
        json!({"type": "REASONING_START", "messageId": id})
    }
    fn rend(id: &str) -> Value {
        json!({"type": "REASONING_END", "messageId": id})
    }
    fn rms(id: &str) -> Value {
        json!({"type": "REASONING_MESSAGE_START", "messageId": id, "role": "reasoning"})
    }
    fn rmc(id: &str) -> Value {
        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": id, "delta": "x"})
    }
    fn rme(id: &str) -> Value {
        json!({"type": "REASONING_MESSAGE_END", "messageId": id})
    }
    fn sub_start(id: &str) -> Value {
        json!({"type": "SUBAGENT_STARTED", "subagentRunId": id, "name": "helper"})
    }
    fn sub_fin(id: &str) -> Value {
        json!({"type": "SUBAGENT_FINISHED", "subagentRunId": id})
    }
    fn tagged(mut event: Value, tag: &str) -> Value {
        event["subagentRunId"] = tag.into();
        event
    }
    fn text_chunk(id: Option<&str>, delta: &str) -> Value {
        let mut chunk = json!({"type": "TEXT_MESSAGE_CHUNK", "delta": delta});
        if let Some(id) = id {
            chunk["messageId"] = id.into();
        }
        chunk
    }

    /// Feeds `events` one by one; on the first refusal, asserts the state is unchanged.
    fn feed(events: &[Value]) -> (OrderChecker, Option<(usize, OrderViolation)>) {
        let mut checker = OrderChecker::new();
        for (index, event) in events.iter().enumerate() {
            let before = checker.clone();
            if let Err(violation) = checker.check(event) {
                assert_eq!(checker, before, "a refused event changes nothing");
                return (checker, Some((index, violation)));
            }
        }
        (checker, None)
    }

    #[track_caller]
    fn passes(events: &[Value]) -> OrderChecker {
        let (checker, failure) = feed(events);
        assert_eq!(failure, None);
        checker
    }

    #[track_caller]
    fn fails_at(events: &[Value], index: usize, code: &str) -> String {
        let (_, failure) = feed(events);
        let (at, violation) = failure.expect("the stream must be refused");
        assert_eq!((at, violation.rule), (index, code), "{}", violation.message);
        assert_eq!(violation.to_string(), violation.message);
        violation.message
    }

    #[test]
    fn first_event_must_be_run_started_or_run_error() {
        let msg = fails_at(&[tms("m")], 0, rule::FIRST_EVENT_MUST_BE_RUN_STARTED);
        assert_eq!(msg, "First event must be 'RUN_STARTED'");
        fails_at(
            &[json!({"type": "STATE_SNAPSHOT", "snapshot": {}})],
            0,
            rule::FIRST_EVENT_MUST_BE_RUN_STARTED,
        );
        // RUN_FINISHED first is refused by the first-event rule too.
        fails_at(&[rf("r")], 0, rule::FIRST_EVENT_MUST_BE_RUN_STARTED);
        passes(&[]);
        passes(&[rs("r")]);
        let checker = passes(&[re()]);
        assert!(matches!(
            checker.open().run(),
            RunStatus::Errored {
                run_started: None,
                run_finished: None,
                ..
            }
        ));
        // A refused first event leaves the stream at its start: a RUN_STARTED may follow.
        let mut checker = OrderChecker::new();
        assert!(checker.check(&tms("m")).is_err());
        checker.check(&rs("r")).unwrap();
    }

    #[test]
    fn run_already_active() {
        let msg = fails_at(&[rs("a"), rs("b")], 1, rule::RUN_ALREADY_ACTIVE);
        assert_eq!(
            msg,
            "Cannot send 'RUN_STARTED' while a run is still active. The previous run must be \
             finished with 'RUN_FINISHED' before starting a new run."
        );
    }

    #[test]
    fn run_already_finished() {
        let msg = fails_at(&[rs("a"), rf("a"), tms("m")], 2, rule::RUN_ALREADY_FINISHED);
        assert_eq!(
            msg,
            "Cannot send event type 'TEXT_MESSAGE_START': The run has already finished with \
             'RUN_FINISHED'. Start a new run with 'RUN_STARTED'."
        );
        fails_at(&[rs("a"), rf("a"), rf("a")], 2, rule::RUN_ALREADY_FINISHED);
        fails_at(
            &[rs("a"), rf("a"), json!({"type": "RAW", "event": 1})],
            2,
            rule::RUN_ALREADY_FINISHED,
        );
    }

    #[test]
    fn run_already_errored() {
        let msg = fails_at(
            &[
                rs("a"),
                re(),
                json!({"type": "CUSTOM", "name": "n", "value": 1}),
            ],
            2,
            rule::RUN_ALREADY_ERRORED,
        );
        assert_eq!(
            msg,
            "Cannot send event type 'CUSTOM': The run has already errored with 'RUN_ERROR'. No \
             further events can be sent."
        );
        fails_at(&[rs("a"), re(), re()], 2, rule::RUN_ALREADY_ERRORED);
        fails_at(&[re(), rf("a")], 1, rule::RUN_ALREADY_ERRORED);
        passes(&[rs("a"), re(), rs("b"), rf("b")]);
        passes(&[re(), rs("b"), rf("b")]);
    }

    #[test]
    fn late_run_error_after_run_finished_is_allowed() {
        let checker = passes(&[rs("a"), rf("a"), re()]);
        let RunStatus::Errored {
            run_started: Some(started),
            run_finished: Some(finished),
            run_error,
        } = checker.open().run()
        else {
            panic!("errored after finishing: {:?}", checker.open().run());
        };
        assert_eq!(**started, rs("a"));
        assert_eq!(**finished, rf("a"));
        assert_eq!(**run_error, re());
        passes(&[rs("a"), rf("a"), re(), rs("b"), rf("b")]);
    }

    #[test]
    fn run_error_is_allowed_with_anything_open_and_the_next_run_starts_clean() {
        let events = [
            rs("a"),
            sub_start("s1"),
            ss("plan"),
            tms("m1"),
            tcs("c1"),
            rstart("r1"),
            rms("r1"),
            text_chunk(Some("m2"), "chunked"),
            re(),
        ];
        let checker = passes(&events);
        let open = checker.open();
        // The chunk lane was closed (its END synthesised) before RUN_ERROR; the rest stays
        // recorded as it was when the run errored.
        assert_eq!(
            open.text_messages().map(OpenItem::id).collect::<Vec<_>>(),
            ["m1"]
        );
        assert_eq!(open.tool_calls().count(), 1);
        assert_eq!(open.steps().count(), 1);
        assert_eq!(open.subagents().count(), 1);
        assert!(checker.open_lanes().is_empty());
        let mut more = events.to_vec();
        more.extend([
            rs("b"),
            tms("m1"),
            tme("m1"),
            ss("plan"),
            sf("plan"),
            rf("b"),
        ]);
        let checker = passes(&more);
        assert!(checker.open().is_empty());
        assert!(matches!(checker.open().run(), RunStatus::Finished { .. }));
    }

    #[test]
    fn text_message_rules() {
        let msg = fails_at(&[rs("a"), tmc("m1")], 1, rule::MESSAGE_NOT_OPEN);
        assert_eq!(
            msg,
            "Cannot send 'TEXT_MESSAGE_CONTENT' event: No active text message found with ID \
             'm1'. Start a text message with 'TEXT_MESSAGE_START' first."
        );
        let msg = fails_at(&[rs("a"), tme("m1")], 1, rule::MESSAGE_NOT_OPEN);
        assert_eq!(
            msg,
            "Cannot send 'TEXT_MESSAGE_END' event: No active text message found with ID 'm1'. \
             A 'TEXT_MESSAGE_START' event must be sent first."
        );
        let msg = fails_at(
            &[rs("a"), tms("m1"), tms("m1")],
            2,
            rule::MESSAGE_ALREADY_OPEN,
        );
        assert_eq!(
            msg,
            "Cannot send 'TEXT_MESSAGE_START' event: A text message with ID 'm1' is already in \
             progress. Complete it with 'TEXT_MESSAGE_END' first."
        );
        fails_at(
            &[rs("a"), tms("m1"), tme("m1"), tmc("m1")],
            3,
            rule::MESSAGE_NOT_OPEN,
        );
        // Re-opening a closed id is legal; interleaving too.
        passes(&[
            rs("a"),
            tms("m1"),
            tmc("m1"),
            tme("m1"),
            tms("m1"),
            tms("m2"),
            tmc("m1"),
            tmc("m2"),
            tme("m1"),
            tme("m2"),
            rf("a"),
        ]);
    }

    #[test]
    fn tool_call_rules() {
        let msg = fails_at(&[rs("a"), tca("c1")], 1, rule::TOOL_CALL_NOT_OPEN);
        assert_eq!(
            msg,
            "Cannot send 'TOOL_CALL_ARGS' event: No active tool call found with ID 'c1'. Start a \
             tool call with 'TOOL_CALL_START' first."
        );
        let msg = fails_at(&[rs("a"), tce("c1")], 1, rule::TOOL_CALL_NOT_OPEN);
        assert_eq!(
            msg,
            "Cannot send 'TOOL_CALL_END' event: No active tool call found with ID 'c1'. A \
             'TOOL_CALL_START' event must be sent first."
        );
        let msg = fails_at(
            &[rs("a"), tcs("c1"), tcs("c1")],
            2,
            rule::TOOL_CALL_ALREADY_OPEN,
        );
        assert_eq!(
            msg,
            "Cannot send 'TOOL_CALL_START' event: A tool call with ID 'c1' is already in \
             progress. Complete it with 'TOOL_CALL_END' first."
        );
        // TOOL_CALL_RESULT is never checked: unknown id, or after END.
        let result = |call: &str| json!({"type": "TOOL_CALL_RESULT", "messageId": format!("tm-{call}"), "toolCallId": call, "content": "ok"});
        passes(&[
            rs("a"),
            result("nobody"),
            tcs("c1"),
            tca("c1"),
            result("c1"),
            tce("c1"),
            result("c1"),
            rf("a"),
        ]);
    }

    #[test]
    fn step_rules() {
        let msg = fails_at(&[rs("a"), sf("s")], 1, rule::STEP_NOT_OPEN);
        assert_eq!(
            msg,
            "Cannot send 'STEP_FINISHED' for step \"s\" that was not started"
        );
        let msg = fails_at(&[rs("a"), ss("s"), ss("s")], 2, rule::STEP_ALREADY_OPEN);
        assert_eq!(msg, "Step \"s\" is already active for 'STEP_STARTED'");
        let msg = fails_at(
            &[rs("a"), tagged(ss("s"), "x"), tagged(ss("s"), "x")],
            2,
            rule::STEP_ALREADY_OPEN,
        );
        assert_eq!(
            msg,
            "Step \"s\" is already active for 'STEP_STARTED' in subagent 'x'"
        );
        // Keyed by owner + name: the parent and a subagent may both run "tools".
        passes(&[
            rs("a"),
            ss("tools"),
            tagged(ss("tools"), "s1"),
            tagged(sf("tools"), "s1"),
            sf("tools"),
            rf("a"),
        ]);
        let msg = fails_at(
            &[rs("a"), ss("tools"), tagged(sf("tools"), "s1")],
            2,
            rule::STEP_OWNER_MISMATCH,
        );
        assert_eq!(
            msg,
            "Cannot send 'STEP_FINISHED' for step \"tools\" attributed to subagent 's1': that \
             step is open under the parent agent. A step must be finished by whoever started it."
        );
        let msg = fails_at(
            &[rs("a"), tagged(ss("tools"), "s1"), sf("tools")],
            2,
            rule::STEP_OWNER_MISMATCH,
        );
        assert!(
            msg.contains("attributed to the parent agent: that step is open under subagent 's1'")
        );
    }

    #[test]
    fn reasoning_rules() {
        // Spans and messages are tracked apart: one id may name both.
        passes(&[
            rs("a"),
            rstart("r1"),
            rms("r1"),
            rmc("r1"),
            rme("r1"),
            rend("r1"),
            rf("a"),
        ]);
        let msg = fails_at(
            &[rs("a"), rstart("r1"), rmc("r1")],
            2,
            rule::REASONING_MESSAGE_NOT_OPEN,
        );
        assert_eq!(
            msg,
            "Cannot send 'REASONING_MESSAGE_CONTENT' event: No active reasoning message found \
             with ID 'r1'. Start a reasoning message with 'REASONING_MESSAGE_START' first."
        );
        fails_at(&[rs("a"), rme("r1")], 1, rule::REASONING_MESSAGE_NOT_OPEN);
        let msg = fails_at(
            &[rs("a"), rms("r1"), rend("r1")],
            2,
            rule::REASONING_SPAN_NOT_OPEN,
        );
        assert_eq!(
            msg,
            "Cannot send 'REASONING_END' event: No active reasoning span found with ID 'r1'. A \
             'REASONING_START' event must be sent first."
        );
        let msg = fails_at(
            &[rs("a"), rstart("r"), rstart("r")],
            2,
            rule::REASONING_SPAN_ALREADY_OPEN,
        );
        assert!(
            msg.starts_with("Cannot send 'REASONING_START' event: A reasoning span with ID 'r'")
        );
        let msg = fails_at(
            &[rs("a"), rms("r"), rms("r")],
            2,
            rule::REASONING_MESSAGE_ALREADY_OPEN,
        );
        assert!(
            msg.starts_with("Cannot send 'REASONING_MESSAGE_START' event: A reasoning message")
        );
        // Re-opening a closed reasoning message is legal.
        passes(&[rs("a"), rms("r"), rme("r"), rms("r"), rme("r"), rf("a")]);
    }

    #[test]
    fn run_finished_checks_open_constructs_in_the_client_order() {
        let cases: [(Vec<Value>, &str, &str); 6] = [
            (
                vec![tms("m1"), ss("plan"), tagged(ss("plan"), "s9")],
                rule::RUN_FINISHED_WITH_OPEN_STEPS,
                "Cannot send 'RUN_FINISHED' while steps are still active: plan, plan (subagent \
                 's9')",
            ),
            (
                vec![rms("r1"), tms("m1"), tms("m2")],
                rule::RUN_FINISHED_WITH_OPEN_MESSAGES,
                "Cannot send 'RUN_FINISHED' while text messages are still active: m1, m2",
            ),
            (
                vec![rstart("r1"), rms("r2")],
                rule::RUN_FINISHED_WITH_OPEN_REASONING_MESSAGES,
                "Cannot send 'RUN_FINISHED' while reasoning messages are still active: r2",
            ),
            (
                vec![tcs("c1"), rstart("r1")],
                rule::RUN_FINISHED_WITH_OPEN_REASONING_SPANS,
                "Cannot send 'RUN_FINISHED' while reasoning spans are still active: r1",
            ),
            (
                vec![sub_start("s1"), tcs("c1")],
                rule::RUN_FINISHED_WITH_OPEN_TOOL_CALLS,
                "Cannot send 'RUN_FINISHED' while tool calls are still active: c1",
            ),
            (
                vec![sub_start("s1")],
                rule::RUN_FINISHED_WITH_OPEN_SUBAGENTS,
                "Cannot send 'RUN_FINISHED' while subagents are still active: s1",
            ),
        ];
        for (opened, code, message) in cases {
            let mut events = vec![rs("a")];
            events.extend(opened);
            events.push(rf("a"));
            let at = events.len() - 1;
            assert_eq!(fails_at(&events, at, code), message);
        }
        // A chunk lane is closed by RUN_FINISHED itself, so it never trips the check.
        passes(&[rs("a"), text_chunk(Some("m1"), "x"), rf("a")]);
    }

    #[test]
    fn subagent_lifecycle_rules() {
        let msg = fails_at(
            &[rs("a"), sub_start("s1"), sub_start("s1")],
            2,
            rule::SUBAGENT_ALREADY_ACTIVE,
        );
        assert_eq!(
            msg,
            "Cannot send 'SUBAGENT_STARTED': subagent 's1' is already active. Finish it with \
             'SUBAGENT_FINISHED' first."
        );
        let msg = fails_at(
            &[rs("a"), sub_start("s1"), sub_fin("s1"), sub_start("s1")],
            3,
            rule::SUBAGENT_ALREADY_FINISHED,
        );
        assert!(msg.contains("has already finished in this run"));
        let child = json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s2", "name": "n", "parentSubagentRunId": "s1"});
        let msg = fails_at(
            &[rs("a"), child.clone()],
            1,
            rule::SUBAGENT_PARENT_NOT_STARTED,
        );
        assert_eq!(
            msg,
            "Cannot send 'SUBAGENT_STARTED': parentSubagentRunId 's1' has not been started in \
             this run."
        );
        // A parent that already finished in this run is fine.
        passes(&[
            rs("a"),
            sub_start("s1"),
            sub_fin("s1"),
            child.clone(),
            sub_fin("s2"),
            rf("a"),
        ]);
        let msg = fails_at(&[rs("a"), sub_fin("s1")], 1, rule::SUBAGENT_NOT_ACTIVE);
        assert_eq!(
            msg,
            "Cannot send 'SUBAGENT_FINISHED': no active subagent found with ID 's1'. A \
             'SUBAGENT_STARTED' event must be sent first."
        );
        let error = json!({"type": "SUBAGENT_ERROR", "subagentRunId": "s1", "message": "x"});
        fails_at(&[rs("a"), error.clone()], 1, rule::SUBAGENT_NOT_ACTIVE);
        passes(&[rs("a"), sub_start("s1"), error, rf("a")]);
        // A new run forgets the closed subagents.
        passes(&[
            rs("a"),
            sub_start("s1"),
            sub_fin("s1"),
            rf("a"),
            rs("b"),
            sub_start("s1"),
        ]);
        // Shapes the schema refuses, checked as the client does.
        let cases = [
            (
                json!({"type": "SUBAGENT_STARTED", "name": "n"}),
                rule::SUBAGENT_MISSING_ID,
                "Cannot send 'SUBAGENT_STARTED' without a 'subagentRunId'.",
            ),
            (
                json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s"}),
                rule::SUBAGENT_MISSING_NAME,
                "Cannot send 'SUBAGENT_STARTED' without a 'name'.",
            ),
            (
                json!({"type": "SUBAGENT_STARTED", "subagentRunId": null, "name": "n"}),
                rule::SUBAGENT_RUN_ID_NULL,
                "Cannot send 'SUBAGENT_STARTED' with 'subagentRunId: null'. The field is optional \
                 — omit it entirely.",
            ),
            (
                json!({"type": "SUBAGENT_STARTED", "subagentRunId": "s", "name": "n", "description": null}),
                rule::SUBAGENT_FIELD_NULL,
                "Cannot send 'SUBAGENT_STARTED' with 'description: null'. The field is optional — \
                 omit it entirely.",
            ),
            (
                json!({"type": "SUBAGENT_ERROR", "subagentRunId": "s"}),
                rule::SUBAGENT_MISSING_MESSAGE,
                "Cannot send 'SUBAGENT_ERROR' without a 'message'.",
            ),
            (
                json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s", "outcome": {"type": "done"}}),
                rule::SUBAGENT_OUTCOME_INVALID,
                "Cannot send 'SUBAGENT_FINISHED' with outcome type 'done'. The outcome is either \
                 { type: \"success\" } or { type: \"suspended\" }.",
            ),
            (
                json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s", "outcome": {"type": "suspended", "interruptIds": null}}),
                rule::SUBAGENT_FIELD_NULL,
                "Cannot send 'SUBAGENT_FINISHED' with 'outcome.interruptIds: null'. The field is \
                 optional — omit it entirely.",
            ),
            (
                json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s", "outcome": {"type": "suspended", "interruptIds": [1]}}),
                rule::SUBAGENT_OUTCOME_INVALID,
                "Cannot send 'SUBAGENT_FINISHED' with a non-string entry in \
                 'outcome.interruptIds'. Interrupt ids are strings.",
            ),
            (
                json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "s", "outcome": []}),
                rule::SUBAGENT_OUTCOME_INVALID,
                "Cannot send 'SUBAGENT_FINISHED' with outcome type 'undefined'. The outcome is \
                 either { type: \"success\" } or { type: \"suspended\" }.",
            ),
        ];
        for (event, code, message) in cases {
            assert_eq!(fails_at(&[rs("a"), event], 1, code), message);
        }
    }

    #[test]
    fn null_attribution_is_fatal() {
        let msg = fails_at(
            &[
                rs("a"),
                json!({"type": "CUSTOM", "name": "n", "value": 1, "subagentRunId": null}),
            ],
            1,
            rule::SUBAGENT_RUN_ID_NULL,
        );
        assert_eq!(
            msg,
            "Cannot send 'CUSTOM' with 'subagentRunId: null'. The field is optional — omit it \
             entirely."
        );
        fails_at(
            &[
                rs("a"),
                json!({"type": "RAW", "event": 1, "subagentRunId": 7}),
            ],
            1,
            rule::SUBAGENT_RUN_ID_MALFORMED,
        );
        // On run-scoped events the member is unknown to the client, which strips it.
        passes(&[
            json!({"type": "RUN_STARTED", "threadId": "t", "runId": "a", "subagentRunId": null}),
            json!({"type": "MESSAGES_SNAPSHOT", "messages": [], "subagentRunId": "s"}),
            json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "a", "subagentRunId": 3}),
        ]);
        let interrupted = json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "a",
            "outcome": {"type": "interrupt", "interrupts": [{"id": "i1", "reason": "r", "subagentRunId": null}]}});
        let msg = fails_at(
            &[rs("a"), interrupted],
            1,
            rule::INTERRUPT_SUBAGENT_RUN_ID_NULL,
        );
        assert_eq!(
            msg,
            "Cannot send 'RUN_FINISHED' with an interrupt (id 'i1') carrying 'subagentRunId: \
             null'. The field is optional — omit it entirely."
        );
        let snapshot = json!({"type": "MESSAGES_SNAPSHOT", "messages": [
            {"id": "ok", "role": "user", "content": "hi", "subagentRunId": "s1"},
            {"id": "bad", "role": "user", "content": "hi", "subagentRunId": null}]});
        let msg = fails_at(&[rs("a"), snapshot], 1, rule::MESSAGE_SUBAGENT_RUN_ID_NULL);
        assert_eq!(
            msg,
            "Cannot send a message (id 'bad') with 'subagentRunId: null'. The field is optional \
             — omit it entirely."
        );
        let started = json!({"type": "RUN_STARTED", "threadId": "t", "runId": "b", "input": {
            "threadId": "t", "runId": "b", "messages": [{"id": "u", "role": "user", "content": "x", "subagentRunId": null}]}});
        fails_at(
            &[rs("a"), rf("a"), started],
            2,
            rule::MESSAGE_SUBAGENT_RUN_ID_NULL,
        );
    }

    #[test]
    fn subagent_tag_agreement() {
        // A tagged continuation of a parent-owned message disagrees.
        let msg = fails_at(
            &[rs("a"), tms("m1"), tagged(tmc("m1"), "s1")],
            2,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        assert_eq!(
            msg,
            "Cannot send 'TEXT_MESSAGE_CONTENT': subagentRunId 's1' does not match the message \
             'm1' opener's subagent '(the parent agent)'."
        );
        // Untagged continuations always agree.
        passes(&[
            rs("a"),
            tagged(tms("m1"), "s1"),
            tmc("m1"),
            tme("m1"),
            rf("a"),
        ]);
        // Owners outlive the close: another producer cannot re-open the id...
        fails_at(
            &[
                rs("a"),
                tagged(tms("m1"), "s1"),
                tme("m1"),
                tagged(tms("m1"), "s2"),
            ],
            3,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        // ...and an untagged re-open does not hand it to the parent.
        fails_at(
            &[
                rs("a"),
                tagged(tms("m1"), "s1"),
                tme("m1"),
                tms("m1"),
                tagged(tmc("m1"), "s2"),
            ],
            4,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        // A new run forgets owners.
        passes(&[
            rs("a"),
            tagged(tms("m1"), "s1"),
            tme("m1"),
            rf("a"),
            rs("b"),
            tagged(tms("m1"), "s2"),
        ]);

        // Tool calls inherit their parent message's owner.
        let call = |id: &str, parent: &str| json!({"type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": "f", "parentMessageId": parent});
        let msg = fails_at(
            &[
                rs("a"),
                tagged(tms("m1"), "s1"),
                tagged(call("c1", "m1"), "s2"),
            ],
            2,
            rule::TOOL_CALL_PARENT_OWNER_MISMATCH,
        );
        assert_eq!(
            msg,
            "Cannot send 'TOOL_CALL_START': subagentRunId 's2' does not match its parent message \
             'm1' owner 's1'. A tool call belongs to the message that carries it."
        );
        fails_at(
            &[
                rs("a"),
                tagged(tms("m1"), "s1"),
                call("c1", "m1"),
                tagged(tca("c1"), "s2"),
            ],
            3,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        let msg = fails_at(
            &[
                rs("a"),
                tagged(tms("m1"), "s1"),
                tms("m2"),
                call("c1", "m1"),
                tce("c1"),
                call("c1", "m2"),
            ],
            5,
            rule::TOOL_CALL_OWNER_CONFLICT,
        );
        assert_eq!(
            msg,
            "Cannot send 'TOOL_CALL_START': tool call 'c1' is owned by 's1' but its parent \
             message 'm2' is owned by '(the parent agent)'. A tool call belongs to the message \
             that carries it."
        );

        // Reasoning: one owner per id across spans and messages.
        fails_at(
            &[rs("a"), tagged(rstart("r"), "s1"), tagged(rms("r"), "s2")],
            2,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        // Encrypted values check the bucket their subtype names.
        let encrypted = |subtype: &str, id: &str| json!({"type": "REASONING_ENCRYPTED_VALUE", "subtype": subtype, "entityId": id, "encryptedValue": "e"});
        let msg = fails_at(
            &[
                rs("a"),
                tagged(tcs("c1"), "s1"),
                tce("c1"),
                tagged(encrypted("tool-call", "c1"), "s2"),
            ],
            3,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        assert!(msg.contains("the tool call 'c1' opener's subagent 's1'"));
        fails_at(
            &[
                rs("a"),
                tagged(rms("r"), "s1"),
                tagged(encrypted("message", "r"), "s2"),
            ],
            2,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        passes(&[rs("a"), tagged(encrypted("message", "unknown"), "s2")]);

        // Activities: a replacing snapshot re-owns, replace:false does not.
        let snap = |replace: bool| json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "act", "activityType": "t", "content": {}, "replace": replace});
        let delta =
            json!({"type": "ACTIVITY_DELTA", "messageId": "act", "activityType": "t", "patch": []});
        passes(&[
            rs("a"),
            tagged(snap(true), "s1"),
            tagged(snap(true), "s2"),
            tagged(delta.clone(), "s2"),
        ]);
        fails_at(
            &[
                rs("a"),
                tagged(snap(true), "s1"),
                tagged(snap(false), "s2"),
                tagged(delta, "s2"),
            ],
            3,
            rule::SUBAGENT_TAG_MISMATCH,
        );
    }

    #[test]
    fn snapshots_and_input_echo_seed_owners() {
        let snapshot = json!({"type": "MESSAGES_SNAPSHOT", "messages": [
            {"id": "m1", "role": "assistant", "subagentRunId": "s2",
             "toolCalls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
            {"id": "r1", "role": "reasoning", "content": "", "subagentRunId": "s2"}]});
        // Authoritative: replaces the owner recorded by the opener.
        passes(&[
            rs("a"),
            tagged(tms("m1"), "s1"),
            tme("m1"),
            snapshot.clone(),
            tagged(tms("m1"), "s2"),
            tagged(tcs("c1"), "s2"),
            tagged(rms("r1"), "s2"),
        ]);
        fails_at(
            &[rs("a"), snapshot.clone(), tagged(tcs("c1"), "s1")],
            2,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        // It does not close open messages.
        fails_at(
            &[rs("a"), tms("m9"), snapshot, rf("a")],
            3,
            rule::RUN_FINISHED_WITH_OPEN_MESSAGES,
        );
        // The RUN_STARTED input echo seeds owners too.
        let started = json!({"type": "RUN_STARTED", "threadId": "t", "runId": "a", "input": {
            "threadId": "t", "runId": "a", "messages": [
                {"id": "m1", "role": "assistant", "content": "earlier", "subagentRunId": "s1"}]}});
        fails_at(
            &[started.clone(), tagged(tms("m1"), "s2")],
            1,
            rule::SUBAGENT_TAG_MISMATCH,
        );
        passes(&[started, tagged(tms("m1"), "s1")]);
    }

    #[test]
    fn mixing_chunk_and_triad_forms_is_refused() {
        let msg = fails_at(
            &[rs("a"), tms("m1"), text_chunk(Some("m1"), "x")],
            2,
            rule::MESSAGE_ALREADY_OPEN,
        );
        assert!(msg.contains("'m1' is already in progress"));
        fails_at(
            &[rs("a"), text_chunk(Some("m1"), "x"), tmc("m1")],
            2,
            rule::MESSAGE_NOT_OPEN,
        );
        fails_at(
            &[rs("a"), text_chunk(Some("m1"), "x"), tme("m1")],
            2,
            rule::MESSAGE_NOT_OPEN,
        );
        fails_at(
            &[
                rs("a"),
                json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "c1", "toolCallName": "f", "delta": "{"}),
                tce("c1"),
            ],
            2,
            rule::TOOL_CALL_NOT_OPEN,
        );
    }

    #[test]
    fn chunk_lane_rules_through_the_checker() {
        let raw = json!({"type": "RAW", "event": {"kind": "heartbeat"}});
        let custom = json!({"type": "CUSTOM", "name": "n", "value": 1});
        let checker = passes(&[
            rs("a"),
            text_chunk(Some("m1"), "Half "),
            raw,
            text_chunk(None, "and half."),
        ]);
        assert_eq!(checker.open_lanes().len(), 1);
        assert!(checker.open().is_text_message_open("m1"));
        let msg = fails_at(
            &[
                rs("a"),
                text_chunk(Some("m1"), "a"),
                custom,
                text_chunk(None, "b"),
            ],
            3,
            rule::CHUNK_MISSING_ID,
        );
        assert_eq!(msg, "First TEXT_MESSAGE_CHUNK must have a messageId");
        let mismatch = json!({"type": "TEXT_MESSAGE_CHUNK", "role": "user", "delta": "b"});
        fails_at(
            &[rs("a"), text_chunk(Some("m1"), "a"), mismatch],
            2,
            rule::CHUNK_FIELD_MISMATCH,
        );
        // A chunk stream after the run finished is refused by the verifier.
        fails_at(
            &[rs("a"), rf("a"), text_chunk(Some("m1"), "a")],
            2,
            rule::RUN_ALREADY_FINISHED,
        );
    }

    #[test]
    fn check_is_transactional_when_a_later_expanded_event_fails() {
        // m2 is open as a triad; a chunk for m2 closes the m1 lane (END m1 passes) and then
        // synthesises START m2 (refused). Nothing of it may stick.
        let mut checker = passes(&[rs("a"), tms("m2"), text_chunk(Some("m1"), "x")]);
        let before = checker.clone();
        let err = checker.check(&text_chunk(Some("m2"), "y")).unwrap_err();
        assert_eq!(err.rule, rule::MESSAGE_ALREADY_OPEN);
        assert_eq!(checker, before);
        assert!(checker.open().is_text_message_open("m1"));
        assert_eq!(checker.open_lanes()[0].id(), "m1");
        // The lane still continues.
        checker.check(&text_chunk(None, "z")).unwrap();
    }

    #[test]
    fn check_batch_is_all_or_nothing() {
        let mut checker = OrderChecker::new();
        checker.check_batch(&[rs("a"), tms("m1")]).unwrap();
        let before = checker.clone();
        let (index, violation) = checker
            .check_batch(&[tmc("m1"), tme("m1"), tmc("m1")])
            .unwrap_err();
        assert_eq!((index, violation.rule), (2, rule::MESSAGE_NOT_OPEN));
        assert_eq!(checker, before);
        checker
            .check_batch(&[tmc("m1"), tme("m1"), rf("a")])
            .unwrap();
        assert!(matches!(checker.open().run(), RunStatus::Finished { .. }));
    }

    #[test]
    fn open_constructs_list_what_a_prelude_reopens() {
        let call = json!({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "search", "parentMessageId": "m1"});
        let user =
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m0", "role": "user", "name": "ann"});
        let checker = passes(&[
            rs("a"),
            sub_start("s1"),
            user.clone(),
            tagged(ss("plan"), "s1"),
            tms("m1"),
            tme("m1"),
            call.clone(),
            rstart("r1"),
            rms("r2"),
            text_chunk(Some("m3"), "chunked"),
        ]);
        let open = checker.open();
        assert!(
            matches!(open.run(), RunStatus::Running { run_started } if **run_started == rs("a"))
        );
        let texts: Vec<_> = open
            .text_messages()
            .map(|m| (m.id(), m.start().clone()))
            .collect();
        assert_eq!(
            texts,
            [
                ("m0", user),
                (
                    "m3",
                    json!({"type": "TEXT_MESSAGE_START", "messageId": "m3", "role": "assistant"})
                ),
            ]
        );
        assert_eq!(
            open.tool_calls()
                .map(|c| c.start().clone())
                .collect::<Vec<_>>(),
            [call]
        );
        let steps: Vec<_> = open
            .steps()
            .map(|s| (s.id(), s.subagent_run_id()))
            .collect();
        assert_eq!(steps, [("plan", Some("s1"))]);
        assert_eq!(
            open.reasoning_spans().map(OpenItem::id).collect::<Vec<_>>(),
            ["r1"]
        );
        assert_eq!(
            open.reasoning_messages()
                .map(OpenItem::id)
                .collect::<Vec<_>>(),
            ["r2"]
        );
        assert_eq!(
            open.subagents()
                .map(|s| s.start().clone())
                .collect::<Vec<_>>(),
            [sub_start("s1")]
        );
        let order: Vec<_> = open
            .in_opening_order()
            .into_iter()
            .map(|(kind, item)| (kind, item.id()))
            .collect();
        assert_eq!(
            order,
            [
                (OpenKind::Subagent, "s1"),
                (OpenKind::TextMessage, "m0"),
                (OpenKind::Step, "plan"),
                (OpenKind::ToolCall, "c1"),
                (OpenKind::ReasoningSpan, "r1"),
                (OpenKind::ReasoningMessage, "r2"),
                (OpenKind::TextMessage, "m3"),
            ]
        );
        assert_eq!(checker.open_lanes().len(), 1);

        // A prelude built from it passes a fresh checker: RUN_STARTED, (snapshots), then the
        // re-opening events in opening order, lanes re-opened by chunk.
        let mut prelude = vec![rs("a")];
        for (_, item) in open.in_opening_order() {
            match checker
                .open_lanes()
                .iter()
                .find(|lane| lane.id() == item.id())
            {
                Some(lane) => prelude.push(lane.reopening_chunk()),
                None => prelude.push(item.start().clone()),
            }
        }
        let mut fresh = passes(&prelude);
        assert_eq!(fresh.open_lanes(), checker.open_lanes());
        // Live events continue on both alike.
        let live = [
            text_chunk(None, "more"),
            tme("m0"),
            tagged(sf("plan"), "s1"),
        ];
        let mut original = checker.clone();
        for event in &live {
            original.check(event).unwrap();
            fresh.check(event).unwrap();
        }
    }

    #[test]
    fn unknown_types_and_non_objects_are_ignored() {
        let mut checker = OrderChecker::new();
        for event in [
            json!({"type": "FUTURE_EVENT"}),
            json!("x"),
            json!({}),
            json!({"type": 1}),
        ] {
            checker.check(&event).unwrap();
        }
        assert_eq!(checker, OrderChecker::new());
        checker.check(&rs("a")).unwrap();
    }

    #[test]
    fn a_lane_whose_message_was_closed_under_another_attribution_is_dead() {
        // The untagged END closes the parent's lane (empty) and the message in the
        // verifier, while subagent s1's lane still holds it: as in the client, the run
        // terminal then synthesises an END for a closed message, which is refused.
        let chunk = tagged(text_chunk(Some("m1"), "x"), "s1");
        let checker = passes(&[rs("a"), chunk.clone(), tme("m1")]);
        assert_eq!(checker.open_lanes().len(), 1);
        assert!(!checker.open().is_text_message_open("m1"));
        fails_at(
            &[rs("a"), chunk.clone(), tme("m1"), rf("a")],
            3,
            rule::MESSAGE_NOT_OPEN,
        );
        fails_at(
            &[rs("a"), chunk, tme("m1"), re()],
            3,
            rule::MESSAGE_NOT_OPEN,
        );
    }

    /// A small alphabet, so random sequences hit the rules often.
    fn any_event() -> impl Strategy<Value = Value> {
        let id = prop::sample::select(vec!["a", "b"]);
        let tag = prop::option::of(prop::sample::select(vec!["s1", "s2"]));
        let kind = prop::sample::select(vec![
            "RUN_STARTED",
            "RUN_FINISHED",
            "RUN_ERROR",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "TEXT_MESSAGE_CHUNK",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_CHUNK",
            "TOOL_CALL_RESULT",
            "REASONING_START",
            "REASONING_END",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_END",
            "REASONING_MESSAGE_CHUNK",
            "REASONING_ENCRYPTED_VALUE",
            "STEP_STARTED",
            "STEP_FINISHED",
            "SUBAGENT_STARTED",
            "SUBAGENT_FINISHED",
            "SUBAGENT_ERROR",
            "MESSAGES_SNAPSHOT",
            "ACTIVITY_SNAPSHOT",
            "ACTIVITY_DELTA",
            "CUSTOM",
            "RAW",
        ]);
        (kind, id, tag, any::<bool>()).prop_map(|(kind, id, tag, with_id)| {
            let mut e = json!({"type": kind, "threadId": "t", "runId": "r", "messageId": id,
                "toolCallId": id, "toolCallName": "f", "stepName": id, "name": "n",
                "delta": "d", "message": "m", "entityId": id, "subtype": "message",
                "messages": [{"id": id, "role": "assistant"}]});
            if let Some(tag) = tag {
                e["subagentRunId"] = tag.into();
            }
            if kind.ends_with("_CHUNK") && !with_id {
                let obj = e.as_object_mut().expect("built as an object");
                obj.remove("messageId");
                obj.remove("toolCallId");
                obj.remove("toolCallName");
            }
            if kind == "SUBAGENT_STARTED" && with_id {
                e["parentSubagentRunId"] = "s1".into();
            }
            e
        })
    }

    proptest! {
        #[test]
        fn random_streams_never_panic_and_refusals_change_nothing(
            events in prop::collection::vec(any_event(), 0..60)
        ) {
            let mut checker = OrderChecker::new();
            for event in &events {
                let before = checker.clone();
                if checker.check(event).is_err() {
                    prop_assert_eq!(&checker, &before);
                }
            }
        }
    }
}
