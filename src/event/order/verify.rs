//! `@ag-ui/client` 1.0.0 `verifyEvents` as a state machine ([`OrderVerifier`]): the same
//! checks, in the same order, with the same wording, on events already expanded by
//! `transformChunks` ([`super::ChunkExpander`]).
//!
//! Run lifecycle first (errored, finished, first event, nested `RUN_STARTED`, null
//! attribution), then the per-type rules, then `RUN_FINISHED`'s open-construct checks (steps,
//! text messages, reasoning messages, reasoning spans, tool calls, subagents). `RUN_STARTED`
//! after `RUN_FINISHED` / `RUN_ERROR` resets all per-run tracking, so one stream (here: one
//! thread's log) may carry many runs.
//!
//! The verifier reads only the members the client's enforcement keeps. In particular the
//! `subagentRunId` of `RUN_*` and `MESSAGES_SNAPSHOT` is ignored (the client strips it as an
//! unknown member), and events that are not an object with a known AG-UI 1.0 `type` are
//! ignored (the client drops them before verification). Schema validation
//! ([`crate::event::validate_value`]) runs first in the broker, so the two rules that exist
//! only for schema-invalid input (`missing_field`, `subagent_run_id_malformed`) never fire
//! there.
//!
//! What the client does **not** check, and neither does this module: a stream that ends with
//! a run open, `RUN_FINISHED` ids agreeing with `RUN_STARTED`, `TOOL_CALL_RESULT` naming a
//! known tool call, `STATE_DELTA` applicability.

use super::open::{
    OpenConstructs, OpenItem, OpenKind, Owner, OwnerMap, Phase, RunLifecycle, Streamed,
};
use super::rule::{self, OrderViolation};
use crate::event::EventType;
use crate::event::Fields;
use fields::{check_lifecycle_fields, check_seed, message_list, tag_of, typed};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;

mod fields;
mod unchanged;

/// One owner map: a persistent hash map (`imbl`, a hash array mapped trie), so that a clone is
/// O(1) and an insert into a shared one copies O(log n) nodes. The broker clones the verifier
/// for every publish that may change the order state and for every frame's order view; with
/// `std`'s map each `TEXT_MESSAGE_START` / `TOOL_CALL_START` / `TOOL_CALL_RESULT` then copied
/// every owner of the run, O(run) per such event (`benches/fold.rs`, `publish_in_one_run`).
type OwnerIndex = imbl::GenericHashMap<
    Arc<str>,
    Owner,
    foldhash::fast::RandomState,
    imbl::shared_ptr::DefaultSharedPtr,
>;

/// The client's per-kind owner maps, retained for the whole run (not cleared on close).
#[derive(Clone, Debug, Default, PartialEq)]
struct Owners {
    message: OwnerIndex,
    tool_call: OwnerIndex,
    activity: OwnerIndex,
    reasoning: OwnerIndex,
}

impl Owners {
    /// The map a streamed construct records its owner in.
    fn of(&self, map: OwnerMap) -> &OwnerIndex {
        match map {
            OwnerMap::Message => &self.message,
            OwnerMap::ToolCall => &self.tool_call,
            OwnerMap::Reasoning => &self.reasoning,
        }
    }

    /// [`Self::of`], to change.
    fn of_mut(&mut self, map: OwnerMap) -> &mut OwnerIndex {
        match map {
            OwnerMap::Message => &mut self.message,
            OwnerMap::ToolCall => &mut self.tool_call,
            OwnerMap::Reasoning => &mut self.reasoning,
        }
    }
}

/// `@ag-ui/client` 1.0.0 `verifyEvents` as a state machine over one stream of expanded
/// events (see the module docs for what it checks).
///
/// [`Self::verify`] is atomic: an event it refuses leaves the state unchanged. Cloning costs
/// the open constructs; the run's owner maps (one entry per message / tool call id seen in the
/// run, `RUN_STARTED.input.messages` and `MESSAGES_SNAPSHOT` included) are persistent maps
/// whose nodes clones share, an owner recorded in a clone copying O(log n) of them; keys are
/// shared `Arc<str>`, events are shared `Arc<Value>`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderVerifier {
    first_event_received: bool,
    run_started: bool,
    run_finished: bool,
    run_error: bool,
    open: OpenConstructs,
    /// Shared between clones, node by node (see [`OwnerIndex`]): a clone stays O(open
    /// constructs) however long the run, and so does recording an owner in one.
    owners: Owners,
    /// Step owners in the order the client's `activeSteps` map first saw them (the order of
    /// the `RUN_FINISHED` open-steps message).
    step_owners: Vec<Owner>,
    /// Subagents closed in this run.
    closed_subagents: HashSet<Arc<str>>,
    next_seq: u64,
}

/// A required string member (always present on schema-valid events).
fn required_str<'v>(
    obj: &'v Map<String, Value>,
    field: &str,
    event_type: EventType,
) -> Result<&'v str, OrderViolation> {
    obj.field(field).and_then(Value::as_str).ok_or_else(|| {
        OrderViolation::new(
            rule::MISSING_FIELD,
            format!("Cannot send '{event_type}' without a string '{field}'."),
        )
    })
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
        let Some((obj, event_type)) = typed(event) else {
            return Ok(());
        };
        let (reset, tag) = self.check_head(obj, event_type)?;
        use EventType as T;
        match event_type {
            T::TextMessageStart
            | T::TextMessageContent
            | T::TextMessageEnd
            | T::ToolCallStart
            | T::ToolCallArgs
            | T::ToolCallEnd
            | T::ReasoningStart
            | T::ReasoningEnd
            | T::ReasoningMessageStart
            | T::ReasoningMessageContent
            | T::ReasoningMessageEnd => {
                // `Streamed::of` knows every type of this arm.
                if let Some((construct, phase)) = Streamed::of(event_type) {
                    if phase == Phase::Start {
                        self.start_streamed(construct, event, obj, tag)?;
                    } else {
                        self.continue_streamed(construct, phase, obj, event_type, tag)?;
                    }
                }
            }
            T::StepStarted => self.step_started(event, obj, tag)?,
            T::StepFinished => self.step_finished(obj, tag)?,
            T::ActivitySnapshot => {
                let id = required_str(obj, "messageId", event_type)?;
                let replace = obj.field("replace") != Some(&Value::Bool(false));
                if replace || !self.owners.activity.contains_key(id) {
                    self.owners
                        .activity
                        .insert(id.into(), tag.map(Arc::from));
                }
            }
            T::ToolCallResult => {
                // Records the minted tool message's owner; newest wins. No other check.
                if let Some(id) = obj.field("messageId").and_then(Value::as_str) {
                    self.owners
                        .message
                        .insert(id.into(), tag.map(Arc::from));
                }
            }
            T::ReasoningEncryptedValue => {
                let id = required_str(obj, "entityId", event_type)?;
                let (owner, kind) = match obj.field("subtype").and_then(Value::as_str) {
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
                let messages = obj.field("messages");
                check_seed(messages)?;
                self.seed_owners(messages, true);
            }
            T::RunStarted => {
                let messages = obj.field("input").and_then(|input| input.field("messages"));
                check_seed(messages)?;
                if reset {
                    self.reset_run();
                }
                self.run_started = true;
                self.seed_owners(messages, false);
                self.open.run = RunLifecycle::Running {
                    run_started: Arc::new(event.clone()),
                };
            }
            T::RunFinished => self.run_finished(event)?,
            T::RunError => {
                self.run_error = true;
                let run_error = Arc::new(event.clone());
                self.open.run = match std::mem::take(&mut self.open.run) {
                    RunLifecycle::Running { run_started } => RunLifecycle::Errored {
                        run_started: Some(run_started),
                        run_finished: None,
                        run_error,
                    },
                    RunLifecycle::Finished {
                        run_started,
                        run_finished,
                    } => RunLifecycle::Errored {
                        run_started: Some(run_started),
                        run_finished: Some(run_finished),
                        run_error,
                    },
                    // First event of the stream (an errored run cannot error again).
                    RunLifecycle::NotStarted | RunLifecycle::Errored { .. } => RunLifecycle::Errored {
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

    /// The rules every event meets before its type's own: the run lifecycle
    /// ([`Self::check_lifecycle`]), the attribution tag, the lifecycle fields. Returns
    /// whether a `RUN_STARTED` resets the per-run tracking, and the event's tag.
    fn check_head<'v>(
        &self,
        obj: &'v Map<String, Value>,
        event_type: EventType,
    ) -> Result<(bool, Option<&'v str>), OrderViolation> {
        let reset = self.check_lifecycle(event_type)?;
        use EventType as T;
        // Run-scoped events carry no attribution: the client strips a `subagentRunId` there.
        let tag = match event_type {
            T::RunStarted | T::RunFinished | T::RunError | T::MessagesSnapshot => None,
            _ => tag_of(obj, event_type)?,
        };
        check_lifecycle_fields(obj, event_type)?;
        Ok((reset, tag))
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
        self.open = OpenConstructs::default();
        self.open.run = run;
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
            let Some(id) = message.field("id").and_then(Value::as_str) else {
                continue;
            };
            let owner: Owner = message
                .field("subagentRunId")
                .and_then(Value::as_str)
                .map(Arc::from);
            let owners = &mut self.owners;
            let bucket = match message.field("role").and_then(Value::as_str) {
                Some("reasoning") => &mut owners.reasoning,
                Some("activity") => &mut owners.activity,
                _ => &mut owners.message,
            };
            if authoritative || !bucket.contains_key(id) {
                bucket.insert(id.into(), owner.clone());
            }
            let calls = match message.field("toolCalls") {
                Some(Value::Array(calls)) => calls.as_slice(),
                _ => &[],
            };
            for call in calls {
                if let Some(call_id) = call.field("id").and_then(Value::as_str)
                    && (authoritative || !owners.tool_call.contains_key(call_id))
                {
                    owners.tool_call.insert(call_id.into(), owner.clone());
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

    /// A START of a streamed construct (text message, tool call, reasoning span or message).
    fn start_streamed(
        &mut self,
        construct: &Streamed,
        event: &Value,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let event_type = construct.start;
        let id = required_str(obj, construct.id_field, event_type)?;
        if self.open.set(construct.kind).contains(id, None) {
            return Err(OrderViolation::new(
                construct.already_open,
                format!(
                    "Cannot send '{event_type}' event: A {} with ID '{id}' is already in \
                     progress. Complete it with '{}' first.",
                    construct.noun, construct.end,
                ),
            ));
        }
        let inherited = if construct.parent_owned {
            self.parent_owner(obj, tag)?
        } else {
            None
        };
        let owners = self.owners.of(construct.owners);
        let existing = owners.get(id);
        if let Some(existing) = existing {
            // First writer wins; a re-open by another producer is a contradiction.
            check_tag(event_type, tag, Some(existing), construct.owner_noun, id)?;
            if tag.is_none()
                && let Some(inherited) = &inherited
                && inherited != existing
            {
                return Err(OrderViolation::new(
                    rule::TOOL_CALL_OWNER_CONFLICT,
                    format!(
                        "Cannot send '{event_type}': {} '{id}' is owned by '{}' but its parent \
                         message '{}' is owned by '{}'. A {} belongs to the message that \
                         carries it.",
                        construct.noun,
                        owner_name(existing.as_deref()),
                        obj.field("parentMessageId")
                            .and_then(Value::as_str)
                            .unwrap_or("undefined"),
                        owner_name(inherited.as_deref()),
                        construct.noun,
                    ),
                ));
            }
        } else {
            let owner: Owner = match tag {
                Some(tag) => Some(Arc::from(tag)),
                None => inherited.flatten(),
            };
            self.owners
                .of_mut(construct.owners)
                .insert(id.into(), owner);
        }
        let item = self.next_item(id, tag, event);
        self.open.set_mut(construct.kind).insert(item, None);
        Ok(())
    }

    /// The owner a tool call inherits from its parent message (`parentMessageId`), when that
    /// message's owner is known; a tag other than it is refused.
    fn parent_owner(
        &self,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<Option<Owner>, OrderViolation> {
        let Some(parent) = obj.field("parentMessageId").and_then(Value::as_str) else {
            return Ok(None);
        };
        let Some(parent_owner) = self.owners.message.get(parent) else {
            return Ok(None);
        };
        if let Some(tag) = tag
            && parent_owner.as_deref() != Some(tag)
        {
            return Err(OrderViolation::new(
                rule::TOOL_CALL_PARENT_OWNER_MISMATCH,
                format!(
                    "Cannot send 'TOOL_CALL_START': subagentRunId '{tag}' does not match its \
                     parent message '{parent}' owner '{}'. A tool call belongs to the message \
                     that carries it.",
                    owner_name(parent_owner.as_deref()),
                ),
            ));
        }
        Ok(Some(parent_owner.clone()))
    }

    /// A CONTENT / ARGS or END of a streamed construct: it must be open, and a tag must
    /// agree with its opener's; an END closes it.
    fn continue_streamed(
        &mut self,
        construct: &Streamed,
        phase: Phase,
        obj: &Map<String, Value>,
        event_type: EventType,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let id = self.check_streamed(construct, phase, obj, event_type, tag)?;
        if phase == Phase::End {
            self.open.set_mut(construct.kind).remove(id, None);
        }
        Ok(())
    }

    /// The checks of [`Self::continue_streamed`]: the construct is open and the event's
    /// subagent tag is its owner's. Returns the construct's id.
    fn check_streamed<'o>(
        &self,
        construct: &Streamed,
        phase: Phase,
        obj: &'o Map<String, Value>,
        event_type: EventType,
        tag: Option<&str>,
    ) -> Result<&'o str, OrderViolation> {
        let id = required_str(obj, construct.id_field, event_type)?;
        self.check_open(construct, phase, id, event_type, tag)?;
        Ok(id)
    }

    fn step_started(
        &mut self,
        event: &Value,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let name = required_str(obj, "stepName", EventType::StepStarted)?;
        if self.open.set(OpenKind::Step).contains(name, tag) {
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
        self.open
            .set_mut(OpenKind::Step)
            .insert(item, tag.map(Arc::from));
        Ok(())
    }

    fn step_finished(
        &mut self,
        obj: &Map<String, Value>,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        let name = required_str(obj, "stepName", EventType::StepFinished)?;
        if !self.open.set(OpenKind::Step).contains(name, tag) {
            // Open under another owner: the likelier mistake, reported as such.
            let other = self.step_owners.iter().find(|owner| {
                owner.as_deref() != tag
                    && self
                        .open
                        .set(OpenKind::Step)
                        .contains(name, owner.as_deref())
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
        self.open.set_mut(OpenKind::Step).remove(name, tag);
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
        if !obj.field("name").is_some_and(Value::is_string) {
            return Err(OrderViolation::new(
                rule::SUBAGENT_MISSING_NAME,
                "Cannot send 'SUBAGENT_STARTED' without a 'name'.",
            ));
        }
        if self.open.set(OpenKind::Subagent).contains(id, None) {
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
        if let Some(parent) = obj.field("parentSubagentRunId").and_then(Value::as_str)
            && !self.open.set(OpenKind::Subagent).contains(parent, None)
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
        self.open.set_mut(OpenKind::Subagent).insert(item, None);
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
            && !obj.field("message").is_some_and(Value::is_string)
        {
            return Err(OrderViolation::new(
                rule::SUBAGENT_MISSING_MESSAGE,
                "Cannot send 'SUBAGENT_ERROR' without a 'message'.",
            ));
        }
        if !self.open.set(OpenKind::Subagent).contains(id, None) {
            return Err(OrderViolation::new(
                rule::SUBAGENT_NOT_ACTIVE,
                format!(
                    "Cannot send '{event_type}': no active subagent found with ID '{id}'. A \
                     'SUBAGENT_STARTED' event must be sent first."
                ),
            ));
        }
        self.open.set_mut(OpenKind::Subagent).remove(id, None);
        self.closed_subagents.insert(id.into());
        Ok(())
    }

    fn run_finished(&mut self, event: &Value) -> Result<(), OrderViolation> {
        let open = &self.open;
        if !open.set(OpenKind::Step).is_empty() {
            let mut parts = String::new();
            for owner in &self.step_owners {
                for step in open.steps().filter(|step| step.owner == *owner) {
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
                open.set(OpenKind::TextMessage),
                rule::RUN_FINISHED_WITH_OPEN_MESSAGES,
                "text messages",
            ),
            (
                open.set(OpenKind::ReasoningMessage),
                rule::RUN_FINISHED_WITH_OPEN_REASONING_MESSAGES,
                "reasoning messages",
            ),
            (
                open.set(OpenKind::ReasoningSpan),
                rule::RUN_FINISHED_WITH_OPEN_REASONING_SPANS,
                "reasoning spans",
            ),
            (
                open.set(OpenKind::ToolCall),
                rule::RUN_FINISHED_WITH_OPEN_TOOL_CALLS,
                "tool calls",
            ),
            (
                open.set(OpenKind::Subagent),
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
            RunLifecycle::Running { run_started } => RunLifecycle::Finished {
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

#[cfg(test)]
mod tests;
