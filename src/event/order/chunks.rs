//! Chunk expansion: `TEXT_MESSAGE_CHUNK`, `TOOL_CALL_CHUNK` and `REASONING_MESSAGE_CHUNK`
//! become the START / CONTENT (ARGS) / END events `@ag-ui/client` 1.0.0 `transformChunks`
//! produces, which is what its `verifyEvents` and reducer then see (AGUI.md §4.3, §5.1).
//!
//! The rules, as the client applies them:
//! - A stream being assembled from chunks lives in a **lane**, one per `subagentRunId`
//!   (`None` is the parent agent). A lane holds at most one open stream, of any kind.
//! - A chunk whose id is absent, or equal to its lane's open stream of the same kind,
//!   **continues** it (CONTENT/ARGS only). Otherwise the lane's open stream is closed (a
//!   synthesised END) and a new one opens (a synthesised START): the first chunk must carry
//!   its id (and `toolCallName` for tools). A continuation that repeats `role` / `name`
//!   (text) or `toolCallName` / `parentMessageId` (tools) with a different value is fatal.
//! - Which lane a chunk belongs to: a chunk naming an id already open in some lane goes to
//!   that lane (a contradicting `subagentRunId` is fatal); an id nobody holds opens in the
//!   lane its own tag names; an id-less chunk goes to the lane its tag names, else the
//!   parent's lane when it has a stream of that kind open, else the sole lane with such a
//!   stream (several is fatal: ambiguous).
//! - Non-chunk events: `TEXT_MESSAGE_*`, `TOOL_CALL_*` (RESULT included), `STATE_*`,
//!   `CUSTOM`, `STEP_*` and the non-encrypted `REASONING_*` close **their own** lane (the
//!   lane of their `subagentRunId`); `RUN_*` and `MESSAGES_SNAPSHOT` close **every** lane (in
//!   the order the lanes opened); `SUBAGENT_FINISHED` / `SUBAGENT_ERROR` close that
//!   subagent's lane; `RAW`, `ACTIVITY_*`, `REASONING_ENCRYPTED_VALUE` and
//!   `SUBAGENT_STARTED` close nothing.
//! - ENDs are only ever synthesised: a stream may end with a lane still open, and the client
//!   then emits nothing for it (its `finalize` discards the ENDs), so there is no `flush`.
//!   A prelude that resumes such a stream must re-open the lane ([`OpenLane::reopening_chunk`]).
//!
//! Mixing the two forms for one item needs no rule of its own: `TEXT_MESSAGE_START(m1)`
//! then a chunk for `m1` synthesises a second START, and a chunk for `m1` then
//! `TEXT_MESSAGE_CONTENT(m1)` closes the lane first, so `verifyEvents` (see
//! [`super::OrderVerifier`]) refuses both, exactly as the client does.
//!
//! Synthesised events are built field by field as the client builds them: a START carries the
//! chunk's `metadata`; a CONTENT/ARGS carries the chunk's `metadata` and `rawEvent` and is
//! emitted when the chunk has a `delta` or a `rawEvent` (`delta` then defaults to `""`); a
//! continuation carrying only `metadata` yields a zero-delta CONTENT/ARGS so the metadata
//! still reaches the reducer; an END carries only the id and the opener's `subagentRunId`.
//! Unknown top-level members of a chunk are not carried over: the client's enforcement strips
//! them before expansion, so its reducer never sees them either. `timestamp` is not carried.

use super::open::{OpenKind, REASONING_MESSAGE, Streamed, TEXT_MESSAGE, TOOL_CALL};
use super::rule::{self, OrderViolation};
use crate::event::EventType;
use crate::event::Fields;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// What kind of stream a lane is assembling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LaneKind {
    /// A text message, from `TEXT_MESSAGE_CHUNK`.
    Text,
    /// A tool call, from `TOOL_CALL_CHUNK`.
    Tool,
    /// A reasoning message, from `REASONING_MESSAGE_CHUNK`.
    Reasoning,
}

impl LaneKind {
    /// The chunk event type that feeds this kind of lane.
    pub const fn chunk_type(self) -> EventType {
        match self {
            LaneKind::Text => EventType::TextMessageChunk,
            LaneKind::Tool => EventType::ToolCallChunk,
            LaneKind::Reasoning => EventType::ReasoningMessageChunk,
        }
    }

    /// The construct a lane of this kind assembles (its START / END, id member and name are
    /// the verifier's too).
    const fn construct(self) -> &'static Streamed {
        match self {
            LaneKind::Text => &TEXT_MESSAGE,
            LaneKind::Tool => &TOOL_CALL,
            LaneKind::Reasoning => &REASONING_MESSAGE,
        }
    }

    /// The open construct a lane of this kind opens in `verifyEvents`.
    pub const fn open_kind(self) -> OpenKind {
        self.construct().kind
    }

    /// The id member of the chunk (`messageId` or `toolCallId`).
    pub const fn id_field(self) -> &'static str {
        self.construct().id_field
    }

    /// The client's wording for the entity ("text message", "tool call", ...).
    const fn entity_kind(self) -> &'static str {
        self.construct().noun
    }

    const fn start_type(self) -> EventType {
        self.construct().start
    }

    const fn end_type(self) -> EventType {
        self.construct().end
    }

    const fn content_type(self) -> EventType {
        match self {
            LaneKind::Text => EventType::TextMessageContent,
            LaneKind::Tool => EventType::ToolCallArgs,
            LaneKind::Reasoning => EventType::ReasoningMessageContent,
        }
    }
}

/// The stream an open lane is assembling, with the fields its opening chunk established
/// (the ones a continuation may repeat only with the same value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaneStream {
    /// A text message.
    Text {
        /// `messageId`.
        message_id: String,
        /// The role the opener established: the chunk's `role`, or `"assistant"` when absent.
        role: String,
        /// The opener's `name`, if any.
        name: Option<String>,
    },
    /// A tool call.
    Tool {
        /// `toolCallId`.
        tool_call_id: String,
        /// `toolCallName` (required on the opening chunk).
        tool_call_name: String,
        /// The opener's `parentMessageId`, if any.
        parent_message_id: Option<String>,
    },
    /// A reasoning message.
    Reasoning {
        /// `messageId`.
        message_id: String,
    },
}

/// A lane with a stream still being assembled from chunks (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenLane {
    /// The lane: the `subagentRunId` of the chunks that opened it, `None` for the parent
    /// agent. Synthesised events of this lane carry it as their `subagentRunId`.
    pub owner: Option<String>,
    /// What is being assembled.
    pub stream: LaneStream,
}

impl OpenLane {
    /// The kind of stream.
    pub fn kind(&self) -> LaneKind {
        match self.stream {
            LaneStream::Text { .. } => LaneKind::Text,
            LaneStream::Tool { .. } => LaneKind::Tool,
            LaneStream::Reasoning { .. } => LaneKind::Reasoning,
        }
    }

    /// The stream's `messageId` / `toolCallId`.
    pub fn id(&self) -> &str {
        match &self.stream {
            LaneStream::Text { message_id, .. } | LaneStream::Reasoning { message_id } => {
                message_id
            }
            LaneStream::Tool { tool_call_id, .. } => tool_call_id,
        }
    }

    /// A delta-less chunk that, sent to a fresh `@ag-ui/client` pipeline, re-opens this lane
    /// (and, through the synthesised START, the message or tool call in `verifyEvents`), so
    /// that later id-less continuation chunks keep assembling into it. It names the id, the
    /// established fields (`role`, `name`, `toolCallName`, `parentMessageId`) and the lane's
    /// `subagentRunId`. Meant for preludes (PROTOCOL §5): a plain `TEXT_MESSAGE_START` would
    /// re-open the message but not the lane, and the next id-less chunk would then be fatal.
    pub fn reopening_chunk(&self) -> Value {
        let mut chunk = Map::new();
        chunk.insert("type".into(), self.kind().chunk_type().as_str().into());
        match &self.stream {
            LaneStream::Text {
                message_id,
                role,
                name,
            } => {
                chunk.insert("messageId".into(), message_id.as_str().into());
                chunk.insert("role".into(), role.as_str().into());
                if let Some(name) = name {
                    chunk.insert("name".into(), name.as_str().into());
                }
            }
            LaneStream::Tool {
                tool_call_id,
                tool_call_name,
                parent_message_id,
            } => {
                chunk.insert("toolCallId".into(), tool_call_id.as_str().into());
                chunk.insert("toolCallName".into(), tool_call_name.as_str().into());
                if let Some(parent) = parent_message_id {
                    chunk.insert("parentMessageId".into(), parent.as_str().into());
                }
            }
            LaneStream::Reasoning { message_id } => {
                chunk.insert("messageId".into(), message_id.as_str().into());
            }
        }
        if let Some(owner) = &self.owner {
            chunk.insert("subagentRunId".into(), owner.as_str().into());
        }
        Value::Object(chunk)
    }

    /// The END the client synthesises when this lane closes.
    fn end_event(&self) -> Value {
        let kind = self.kind();
        let mut end = Map::new();
        end.insert("type".into(), kind.end_type().as_str().into());
        end.insert(kind.id_field().into(), self.id().into());
        if let Some(owner) = &self.owner {
            end.insert("subagentRunId".into(), owner.as_str().into());
        }
        Value::Object(end)
    }
}

/// `@ag-ui/client` 1.0.0 `transformChunks` as a state machine over one stream (here: one
/// thread's log, from its first event). See the module docs for the rules.
///
/// Cheap to clone: it holds only the open lanes (at most one per subagent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkExpander {
    /// Open lanes in the order they opened (the client's `Map` insertion order, which is the
    /// order `RUN_*` / `MESSAGES_SNAPSHOT` close them in).
    lanes: Vec<OpenLane>,
}

/// The result of expanding one event: borrowed when it is the event itself, owned when
/// synthesised. Dereferences to [`Value`].
pub type Expanded<'a> = Vec<Cow<'a, Value>>;

impl ChunkExpander {
    /// An expander with no lane open (the state at the start of a stream).
    pub fn new() -> Self {
        Self::default()
    }

    /// The lanes still assembling a stream, in the order they opened. A prelude must re-open
    /// each of them ([`OpenLane::reopening_chunk`]).
    pub fn open_lanes(&self) -> &[OpenLane] {
        &self.lanes
    }

    /// Expands one event as `@ag-ui/client` 1.0.0 `transformChunks` does: a chunk becomes
    /// its synthesised events (possibly none, for an empty continuation); any other event is
    /// returned as itself, preceded by the ENDs of the lanes it closes. Events that are not an
    /// object with a known AG-UI 1.0 `type` pass through untouched and close nothing.
    ///
    /// # Errors
    /// [`OrderViolation`] for a chunk the client refuses (rules `chunk_missing_id`,
    /// `chunk_missing_tool_call_name`, `chunk_field_mismatch`, `chunk_subagent_mismatch`,
    /// `chunk_lane_ambiguous`, `chunk_field_malformed`). On error the expander is unchanged.
    pub fn expand<'a>(&mut self, event: &'a Value) -> Result<Expanded<'a>, OrderViolation> {
        let Some(obj) = event.as_object() else {
            return Ok(vec![Cow::Borrowed(event)]);
        };
        let Some(event_type) = obj
            .field("type")
            .and_then(Value::as_str)
            .and_then(EventType::parse)
        else {
            return Ok(vec![Cow::Borrowed(event)]);
        };
        use EventType as T;
        let mut out: Expanded<'a> = Vec::new();
        match event_type {
            T::TextMessageChunk => return self.expand_chunk(LaneKind::Text, obj),
            T::ToolCallChunk => return self.expand_chunk(LaneKind::Tool, obj),
            T::ReasoningMessageChunk => return self.expand_chunk(LaneKind::Reasoning, obj),
            // Events that close their own lane (untagged ones: the parent's).
            T::TextMessageStart
            | T::TextMessageContent
            | T::TextMessageEnd
            | T::ToolCallStart
            | T::ToolCallArgs
            | T::ToolCallEnd
            | T::ToolCallResult
            | T::StateSnapshot
            | T::StateDelta
            | T::Custom
            | T::StepStarted
            | T::StepFinished
            | T::ReasoningStart
            | T::ReasoningMessageStart
            | T::ReasoningMessageContent
            | T::ReasoningMessageEnd
            | T::ReasoningEnd => match obj.field("subagentRunId") {
                // The client reads `subagentRunId ?? undefined`: null is the parent's lane.
                None | Some(Value::Null) => out.extend(self.close_lane(None).map(Cow::Owned)),
                Some(Value::String(owner)) => {
                    out.extend(self.close_lane(Some(owner)).map(Cow::Owned));
                }
                // A non-string tag (schema-invalid) names no lane.
                Some(_) => {}
            },
            // Run-level events close every lane, in opening order.
            T::RunStarted | T::RunFinished | T::RunError | T::MessagesSnapshot => {
                out.extend(
                    self.lanes
                        .drain(..)
                        .map(|lane| Cow::Owned(lane.end_event())),
                );
            }
            // A subagent's terminal closes that subagent's lane only.
            T::SubagentFinished | T::SubagentError => {
                if let Some(Value::String(owner)) = obj.field("subagentRunId") {
                    out.extend(self.close_lane(Some(owner)).map(Cow::Owned));
                }
            }
            // Stand aside from chunk assembly.
            T::Raw
            | T::ActivitySnapshot
            | T::ActivityDelta
            | T::ReasoningEncryptedValue
            | T::SubagentStarted => {}
        }
        out.push(Cow::Borrowed(event));
        Ok(out)
    }

    /// Removes `owner`'s lane, returning its END; `None` when the lane has nothing open.
    fn close_lane(&mut self, owner: Option<&str>) -> Option<Value> {
        let at = self
            .lanes
            .iter()
            .position(|lane| lane.owner.as_deref() == owner)?;
        Some(self.lanes.remove(at).end_event())
    }

    /// The client's `resolveLane`: which lane a chunk of `kind` belongs to.
    fn resolve_lane(
        &self,
        kind: LaneKind,
        id: Option<&str>,
        tag: Option<&str>,
    ) -> Result<Option<String>, OrderViolation> {
        if let Some(id) = id {
            // A named id continues wherever it is already open, whoever sends it.
            let holder = self
                .lanes
                .iter()
                .find(|lane| lane.kind() == kind && lane.id() == id);
            if let Some(holder) = holder {
                if let Some(tag) = tag
                    && Some(tag) != holder.owner.as_deref()
                {
                    return Err(OrderViolation::new(
                        rule::CHUNK_SUBAGENT_MISMATCH,
                        format!(
                            "Cannot continue {} '{id}': chunk subagentRunId '{tag}' does not match \
                             the open stream's subagent '{}'.",
                            kind.entity_kind(),
                            holder.owner.as_deref().unwrap_or("(the parent agent)"),
                        ),
                    ));
                }
                return Ok(holder.owner.clone());
            }
            return Ok(tag.map(str::to_owned));
        }
        if let Some(tag) = tag {
            return Ok(Some(tag.to_owned()));
        }
        // Untagged means the parent agent: prefer the parent's own open stream.
        if self
            .lanes
            .iter()
            .any(|lane| lane.owner.is_none() && lane.kind() == kind)
        {
            return Ok(None);
        }
        // Otherwise the sole open stream of this kind, so producers that tag only the
        // opening chunk keep working.
        let mut candidates = self.lanes.iter().filter(|lane| lane.kind() == kind);
        match (candidates.next(), candidates.count()) {
            (Some(only), 0) => Ok(only.owner.clone()),
            (Some(_), more) => Err(OrderViolation::new(
                rule::CHUNK_LANE_AMBIGUOUS,
                format!(
                    "Ambiguous {}: it carries neither a {} nor a subagentRunId, but {} lanes have \
                     an open {}. Attribute the chunk to the subagent it belongs to.",
                    kind.chunk_type(),
                    kind.id_field(),
                    more + 1,
                    kind.entity_kind(),
                ),
            )),
            (None, _) => Ok(None),
        }
    }

    /// Expands one chunk. Every check runs before the first change to `self.lanes`.
    fn expand_chunk<'a>(
        &mut self,
        kind: LaneKind,
        chunk: &Map<String, Value>,
    ) -> Result<Expanded<'a>, OrderViolation> {
        let chunk_type = kind.chunk_type();
        let id = optional_str(chunk, kind.id_field(), chunk_type)?;
        let tag = optional_str(chunk, "subagentRunId", chunk_type)?;
        let lane = self.resolve_lane(kind, id, tag)?;
        let lane_at = self
            .lanes
            .iter()
            .position(|open| open.owner.as_deref() == lane.as_deref());
        // Indexing below: `lane_at` and `stream_at` are positions in `self.lanes` taken
        // after its last change, so they are in bounds.
        let continuing = lane_at.filter(|&at| {
            let open = &self.lanes[at];
            open.kind() == kind && id.is_none_or(|id| id == open.id())
        });

        let mut out: Expanded<'a> = Vec::new();
        let stream_at = match continuing {
            Some(at) => {
                check_opener_agreement(&self.lanes[at], chunk)?;
                at
            }
            None => {
                let Some(id) = id else {
                    return Err(OrderViolation::new(
                        rule::CHUNK_MISSING_ID,
                        format!("First {chunk_type} must have a {}", kind.id_field()),
                    ));
                };
                let stream = match kind {
                    LaneKind::Text => LaneStream::Text {
                        message_id: id.to_owned(),
                        role: optional_str(chunk, "role", chunk_type)?
                            .unwrap_or("assistant")
                            .to_owned(),
                        name: optional_str(chunk, "name", chunk_type)?.map(str::to_owned),
                    },
                    LaneKind::Tool => LaneStream::Tool {
                        tool_call_id: id.to_owned(),
                        tool_call_name: optional_str(chunk, "toolCallName", chunk_type)?
                            .ok_or_else(|| {
                                OrderViolation::new(
                                    rule::CHUNK_MISSING_TOOL_CALL_NAME,
                                    "First TOOL_CALL_CHUNK must have a toolCallName",
                                )
                            })?
                            .to_owned(),
                        parent_message_id: optional_str(chunk, "parentMessageId", chunk_type)?
                            .map(str::to_owned),
                    },
                    LaneKind::Reasoning => LaneStream::Reasoning {
                        message_id: id.to_owned(),
                    },
                };
                // Checks done: from here on the lanes change.
                if let Some(at) = lane_at {
                    out.push(Cow::Owned(self.lanes.remove(at).end_event()));
                }
                let opened = OpenLane {
                    owner: lane,
                    stream,
                };
                out.push(Cow::Owned(start_event(&opened, chunk)));
                self.lanes.push(opened);
                // Just pushed: the vector is not empty.
                self.lanes.len() - 1
            }
        };

        let open = &self.lanes[stream_at];
        let delta = chunk.field("delta");
        let raw_event = chunk.field("rawEvent");
        let metadata = chunk.field("metadata");
        if delta.is_some() || raw_event.is_some() {
            let mut content = content_base(open, delta.cloned().unwrap_or_else(|| "".into()));
            // Prefer the incoming chunk's own tag over the opener's.
            if let Some(owner) = tag.or(open.owner.as_deref()) {
                content.insert("subagentRunId".into(), owner.into());
            }
            if let Some(metadata) = metadata {
                content.insert("metadata".into(), metadata.clone());
            }
            if let Some(raw_event) = raw_event {
                content.insert("rawEvent".into(), raw_event.clone());
            }
            out.push(Cow::Owned(Value::Object(content)));
        } else if out.is_empty()
            && let Some(metadata) = metadata
        {
            // A metadata-only continuation: a zero-delta content event carries it.
            let mut content = content_base(open, "".into());
            content.insert("metadata".into(), metadata.clone());
            if let Some(owner) = tag.or(open.owner.as_deref()) {
                content.insert("subagentRunId".into(), owner.into());
            }
            out.push(Cow::Owned(Value::Object(content)));
        }
        Ok(out)
    }
}

/// A continuation may repeat a field its opener established, but only with the same value.
fn check_opener_agreement(
    open: &OpenLane,
    chunk: &Map<String, Value>,
) -> Result<(), OrderViolation> {
    let chunk_type = open.kind().chunk_type();
    let agree = |field: &str, established: Option<&str>| -> Result<(), OrderViolation> {
        match optional_str(chunk, field, chunk_type)? {
            Some(incoming) if Some(incoming) != established => Err(OrderViolation::new(
                rule::CHUNK_FIELD_MISMATCH,
                format!(
                    "Cannot continue {} '{}': chunk {field} '{incoming}' does not match the open \
                     stream's {field} {}.",
                    open.kind().entity_kind(),
                    open.id(),
                    established.map_or_else(|| "(absent)".to_owned(), |e| format!("'{e}'")),
                ),
            )),
            _ => Ok(()),
        }
    };
    match &open.stream {
        LaneStream::Text { role, name, .. } => {
            agree("role", Some(role))?;
            agree("name", name.as_deref())
        }
        LaneStream::Tool {
            tool_call_name,
            parent_message_id,
            ..
        } => {
            agree("toolCallName", Some(tool_call_name))?;
            agree("parentMessageId", parent_message_id.as_deref())
        }
        // The client checks no repeated field on reasoning chunks.
        LaneStream::Reasoning { .. } => Ok(()),
    }
}

/// The START the client synthesises for a lane opened by `chunk` (with the chunk's metadata).
fn start_event(opened: &OpenLane, chunk: &Map<String, Value>) -> Value {
    let kind = opened.kind();
    let mut start = Map::new();
    start.insert("type".into(), kind.start_type().as_str().into());
    start.insert(kind.id_field().into(), opened.id().into());
    match &opened.stream {
        LaneStream::Text { role, name, .. } => {
            start.insert("role".into(), role.as_str().into());
            if let Some(name) = name {
                start.insert("name".into(), name.as_str().into());
            }
        }
        LaneStream::Tool {
            tool_call_name,
            parent_message_id,
            ..
        } => {
            start.insert("toolCallName".into(), tool_call_name.as_str().into());
            if let Some(parent) = parent_message_id {
                start.insert("parentMessageId".into(), parent.as_str().into());
            }
        }
        LaneStream::Reasoning { .. } => {
            start.insert("role".into(), "reasoning".into());
        }
    }
    if let Some(owner) = &opened.owner {
        start.insert("subagentRunId".into(), owner.as_str().into());
    }
    if let Some(metadata) = chunk.field("metadata") {
        start.insert("metadata".into(), metadata.clone());
    }
    Value::Object(start)
}

/// `{type, <id>, delta}` of the lane's CONTENT / ARGS event.
fn content_base(open: &OpenLane, delta: Value) -> Map<String, Value> {
    let kind = open.kind();
    let mut content = Map::new();
    content.insert("type".into(), kind.content_type().as_str().into());
    content.insert(kind.id_field().into(), open.id().into());
    content.insert("delta".into(), delta);
    content
}

/// An optional string member: absent → `None`; anything but a string is malformed (the
/// schema refuses it, and so does the client's enforcement before expansion).
fn optional_str<'v>(
    chunk: &'v Map<String, Value>,
    field: &str,
    chunk_type: EventType,
) -> Result<Option<&'v str>, OrderViolation> {
    match chunk.field(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(OrderViolation::new(
            rule::CHUNK_FIELD_MALFORMED,
            format!("{chunk_type}.{field} must be a string when present"),
        )),
    }
}
