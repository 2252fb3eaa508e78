//! The order rules' stable codes and [`OrderViolation`], the error every order stage
//! (`transformChunks`, `verifyEvents`) returns: a leaf the other order modules import.
//!
//! The constants are the stable short codes of [`OrderViolation::rule`], one per client check
//! (the HTTP layer reports them; tests match on them).

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
pub const RUN_FINISHED_WITH_OPEN_REASONING_SPANS: &str = "run_finished_with_open_reasoning_spans";
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

/// An event the AG-UI 1.0 client would refuse at this point of the stream: the run errors.
///
/// `message` is the client's own wording where it has one (AGUI.md §5 quotes several), so a
/// producer can search for it; `rule` is one of this module's stable codes. The event's position
/// in a batch is the caller's to add.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OrderViolation {
    /// Stable short code, one of this module's constants.
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
