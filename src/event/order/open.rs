//! The open-construct model: what `verifyEvents` holds open (text messages, tool calls,
//! reasoning spans and messages, steps, subagents), each with the event that opened it, and
//! the run's lifecycle with its original events: the input of a prelude (PROTOCOL §5). Also the
//! table of the four streamed constructs (opened by a START, continued, closed by an END)
//! that the verifier and the chunk expander share.

use crate::event::EventType;
use serde_json::Value;
use std::collections::{BTreeMap, btree_map};
use std::sync::Arc;

/// Owner of an entity: `None` is the parent agent.
pub(super) type Owner = Option<Arc<str>>;

/// Where the thread's current run stands, with the original events (shared, cheap to
/// clone) a prelude restates (PROTOCOL §5).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RunLifecycle {
    /// No run yet (empty stream).
    #[default]
    NotStarted,
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
    pub(super) id: Arc<str>,
    pub(super) owner: Option<Arc<str>>,
    pub(super) start: Arc<Value>,
    pub(super) seq: u64,
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

/// Hashed with foldhash (seeded per process, hashbrown's default) rather than SipHash: every
/// content delta looks its id up here, once per check and once per fold.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Open items of one kind: ordered by opening, indexed by id (and, for steps, owner).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct OpenSet {
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

    /// Whether `id` is open under `key_owner` (always `None` except for steps).
    pub(super) fn contains(&self, id: &str, key_owner: Option<&str>) -> bool {
        self.seq_of(id, key_owner).is_some()
    }

    /// Records `item` as open under `key_owner`.
    pub(super) fn insert(&mut self, item: OpenItem, key_owner: Option<Arc<str>>) {
        self.by_id
            .entry(item.id.clone())
            .or_default()
            .push((key_owner, item.seq));
        self.by_seq.insert(item.seq, item);
    }

    /// Closes `id` under `key_owner`, if open.
    pub(super) fn remove(&mut self, id: &str, key_owner: Option<&str>) {
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

    /// Whether nothing of this kind is open.
    pub(super) fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }

    /// The open items in opening order.
    pub(super) fn items(&self) -> OpenItems<'_> {
        self.by_seq.values()
    }

    /// The ids in opening order, joined as the client joins them (`", "`).
    pub(super) fn ids_joined(&self) -> String {
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

impl OpenKind {
    /// How many kinds there are.
    const COUNT: usize = 6;
}

/// The constructs `verifyEvents` holds open, each list in opening order, and the run status.
///
/// After `RUN_ERROR` the lists still show what was open when the run errored (the client
/// keeps them until the next `RUN_STARTED`); nothing may continue them, so a prelude for an
/// errored run re-opens nothing. After `RUN_FINISHED` they are empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpenConstructs {
    pub(super) run: RunLifecycle,
    /// One set per [`OpenKind`], indexed by the kind's declaration order.
    sets: [OpenSet; OpenKind::COUNT],
}

/// Items of one kind in opening order.
pub type OpenItems<'a> = btree_map::Values<'a, u64, OpenItem>;

impl OpenConstructs {
    /// The current run's lifecycle, with its original events.
    pub fn run(&self) -> &RunLifecycle {
        &self.run
    }

    /// The open items of `kind`, in opening order.
    pub fn of_kind(&self, kind: OpenKind) -> OpenItems<'_> {
        self.set(kind).items()
    }

    /// Open text messages (`messageId`; start = `TEXT_MESSAGE_START` with `role`/`name`).
    pub fn text_messages(&self) -> OpenItems<'_> {
        self.of_kind(OpenKind::TextMessage)
    }

    /// Open tool calls (`toolCallId`; start = `TOOL_CALL_START` with `toolCallName` and
    /// `parentMessageId`).
    pub fn tool_calls(&self) -> OpenItems<'_> {
        self.of_kind(OpenKind::ToolCall)
    }

    /// Open reasoning spans (`messageId`; start = `REASONING_START`).
    pub fn reasoning_spans(&self) -> OpenItems<'_> {
        self.of_kind(OpenKind::ReasoningSpan)
    }

    /// Open reasoning messages (`messageId`; start = `REASONING_MESSAGE_START`).
    pub fn reasoning_messages(&self) -> OpenItems<'_> {
        self.of_kind(OpenKind::ReasoningMessage)
    }

    /// Open steps (`stepName` + the `subagentRunId` they are keyed by; start =
    /// `STEP_STARTED`).
    pub fn steps(&self) -> OpenItems<'_> {
        self.of_kind(OpenKind::Step)
    }

    /// Active subagents (`subagentRunId`; start = `SUBAGENT_STARTED`).
    pub fn subagents(&self) -> OpenItems<'_> {
        self.of_kind(OpenKind::Subagent)
    }

    /// Whether text message `id` is open.
    pub fn is_text_message_open(&self, id: &str) -> bool {
        self.set(OpenKind::TextMessage).contains(id, None)
    }

    /// Whether tool call `id` is open.
    pub fn is_tool_call_open(&self, id: &str) -> bool {
        self.set(OpenKind::ToolCall).contains(id, None)
    }

    /// Whether nothing is open (the run status aside).
    pub fn is_empty(&self) -> bool {
        self.sets.iter().all(OpenSet::is_empty)
    }

    /// Every open construct, all kinds merged in the order they opened: the order in which a
    /// prelude re-opens them (a subagent before the steps and messages it opened after it).
    pub fn in_opening_order(&self) -> Vec<(OpenKind, &OpenItem)> {
        const KINDS: [OpenKind; OpenKind::COUNT] = [
            OpenKind::TextMessage,
            OpenKind::ToolCall,
            OpenKind::ReasoningSpan,
            OpenKind::ReasoningMessage,
            OpenKind::Step,
            OpenKind::Subagent,
        ];
        let mut all: Vec<(OpenKind, &OpenItem)> = KINDS
            .into_iter()
            .flat_map(|kind| self.set(kind).items().map(move |item| (kind, item)))
            .collect();
        all.sort_by_key(|(_, item)| item.seq);
        all
    }

    /// The open set of `kind`.
    pub(super) fn set(&self, kind: OpenKind) -> &OpenSet {
        &self.sets[kind as usize]
    }

    /// The open set of `kind`, to change.
    pub(super) fn set_mut(&mut self, kind: OpenKind) -> &mut OpenSet {
        &mut self.sets[kind as usize]
    }
}

/// Which of the verifier's per-run owner maps records a construct's owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OwnerMap {
    /// Text messages (and the tool messages `TOOL_CALL_RESULT` mints).
    Message,
    /// Tool calls.
    ToolCall,
    /// Reasoning messages and spans.
    Reasoning,
}

/// Where an event stands in its streamed construct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// The START that opens it.
    Start,
    /// A CONTENT / ARGS that continues it.
    Continue,
    /// The END that closes it.
    End,
}

/// One of the four constructs opened by a START, continued, closed by an END: its events,
/// id member, owner map and the client's words for it. The verifier and the chunk expander
/// read it instead of repeating one handler per construct.
#[derive(Debug)]
pub(super) struct Streamed {
    /// Its kind among the open constructs.
    pub(super) kind: OpenKind,
    /// The event that opens it.
    pub(super) start: EventType,
    /// The event that closes it.
    pub(super) end: EventType,
    /// The id member (`messageId` or `toolCallId`).
    pub(super) id_field: &'static str,
    /// The client's name for it in "not open" / "already open" messages.
    pub(super) noun: &'static str,
    /// The client's name for its opener in a subagent-tag mismatch.
    pub(super) owner_noun: &'static str,
    /// Where its owner is recorded.
    pub(super) owners: OwnerMap,
    /// Rule when its START repeats an open id.
    pub(super) already_open: &'static str,
    /// Rule when a continuation or END names an id not open.
    pub(super) not_open: &'static str,
    /// Whether a stray END is told "a START must be sent first" (else, like a stray
    /// continuation, "start one with START first"): the client's wording differs per kind.
    pub(super) end_advice: bool,
    /// Whether it inherits its parent message's owner (`parentMessageId`): tool calls.
    pub(super) parent_owned: bool,
}

/// Text messages (`TEXT_MESSAGE_START` / `_CONTENT` / `_END`).
pub(super) const TEXT_MESSAGE: Streamed = Streamed {
    kind: OpenKind::TextMessage,
    start: EventType::TextMessageStart,
    end: EventType::TextMessageEnd,
    id_field: "messageId",
    noun: "text message",
    owner_noun: "message",
    owners: OwnerMap::Message,
    already_open: super::rule::MESSAGE_ALREADY_OPEN,
    not_open: super::rule::MESSAGE_NOT_OPEN,
    end_advice: true,
    parent_owned: false,
};

/// Tool calls (`TOOL_CALL_START` / `_ARGS` / `_END`).
pub(super) const TOOL_CALL: Streamed = Streamed {
    kind: OpenKind::ToolCall,
    start: EventType::ToolCallStart,
    end: EventType::ToolCallEnd,
    id_field: "toolCallId",
    noun: "tool call",
    owner_noun: "tool call",
    owners: OwnerMap::ToolCall,
    already_open: super::rule::TOOL_CALL_ALREADY_OPEN,
    not_open: super::rule::TOOL_CALL_NOT_OPEN,
    end_advice: true,
    parent_owned: true,
};

/// Reasoning spans (`REASONING_START` / `REASONING_END`).
pub(super) const REASONING_SPAN: Streamed = Streamed {
    kind: OpenKind::ReasoningSpan,
    start: EventType::ReasoningStart,
    end: EventType::ReasoningEnd,
    id_field: "messageId",
    noun: "reasoning span",
    owner_noun: "reasoning message",
    owners: OwnerMap::Reasoning,
    already_open: super::rule::REASONING_SPAN_ALREADY_OPEN,
    not_open: super::rule::REASONING_SPAN_NOT_OPEN,
    end_advice: true,
    parent_owned: false,
};

/// Reasoning messages (`REASONING_MESSAGE_START` / `_CONTENT` / `_END`).
pub(super) const REASONING_MESSAGE: Streamed = Streamed {
    kind: OpenKind::ReasoningMessage,
    start: EventType::ReasoningMessageStart,
    end: EventType::ReasoningMessageEnd,
    id_field: "messageId",
    noun: "reasoning message",
    owner_noun: "reasoning message",
    owners: OwnerMap::Reasoning,
    already_open: super::rule::REASONING_MESSAGE_ALREADY_OPEN,
    not_open: super::rule::REASONING_MESSAGE_NOT_OPEN,
    end_advice: false,
    parent_owned: false,
};

impl Streamed {
    /// The streamed construct `event_type` opens, continues or closes, and how; `None` for
    /// every other event type.
    pub(super) fn of(event_type: EventType) -> Option<(&'static Streamed, Phase)> {
        use EventType as T;
        Some(match event_type {
            T::TextMessageStart => (&TEXT_MESSAGE, Phase::Start),
            T::TextMessageContent => (&TEXT_MESSAGE, Phase::Continue),
            T::TextMessageEnd => (&TEXT_MESSAGE, Phase::End),
            T::ToolCallStart => (&TOOL_CALL, Phase::Start),
            T::ToolCallArgs => (&TOOL_CALL, Phase::Continue),
            T::ToolCallEnd => (&TOOL_CALL, Phase::End),
            T::ReasoningStart => (&REASONING_SPAN, Phase::Start),
            T::ReasoningEnd => (&REASONING_SPAN, Phase::End),
            T::ReasoningMessageStart => (&REASONING_MESSAGE, Phase::Start),
            T::ReasoningMessageContent => (&REASONING_MESSAGE, Phase::Continue),
            T::ReasoningMessageEnd => (&REASONING_MESSAGE, Phase::End),
            _ => return None,
        })
    }
}
