//! A content delta's fields (`TEXT_MESSAGE_CONTENT`, `TOOL_CALL_ARGS`,
//! `REASONING_MESSAGE_CONTENT`) read without building a `serde_json::Value`, and [`AsEvent`],
//! how the order rules and the fold take an event either way.
//!
//! Why: content deltas are most of a run's events (an LLM streams its text and tool arguments
//! token by token), and building the `Value` of each (an `IndexMap` hashing every member name
//! with SipHash, a `String` per name, per string and, with `arbitrary_precision`, per number),
//! then dropping it, was the largest single cost of a publish (~12,000 instructions per event
//! on the `agent` mix of `benches/hot_path.rs`, `loadtest/REPORT.md` session 20). The order
//! rules, the fold and coalescing read only the type, the id, the delta and the
//! `subagentRunId` of such an event.

use super::EventType;
use serde_json::Value;

/// The fields of a content delta that the order rules, the fold and coalescing read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentRef<'a> {
    /// `TEXT_MESSAGE_CONTENT`, `TOOL_CALL_ARGS` or `REASONING_MESSAGE_CONTENT`.
    pub event_type: EventType,
    /// `messageId` (text and reasoning) or `toolCallId` (tool call arguments).
    pub id: &'a str,
    /// `delta`, unescaped.
    pub delta: &'a str,
    /// `subagentRunId`, when present.
    pub tag: Option<&'a str>,
}

impl ContentRef<'_> {
    /// Whether `t` is one of the three content delta types.
    pub fn is_content_type(t: EventType) -> bool {
        matches!(
            t,
            EventType::TextMessageContent
                | EventType::ToolCallArgs
                | EventType::ReasoningMessageContent
        )
    }

    /// The member naming the delta's construct: `toolCallId` for `TOOL_CALL_ARGS`,
    /// `messageId` for the others.
    pub fn id_member(t: EventType) -> &'static str {
        match t {
            EventType::ToolCallArgs => "toolCallId",
            _ => "messageId",
        }
    }
}

/// [`ContentRef`] as [`super::ValidEvent`] keeps it: the three strings one after the other
/// in one allocation (reading them back is slicing; spans of the event's JSON bytes would
/// need a UTF-8 check on every read, and the fields are read four times per event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Content {
    event_type: EventType,
    /// The id, the delta, then the tag.
    text: Box<str>,
    /// Where the id ends and the delta begins.
    id_end: usize,
    /// Where the delta ends and the tag, if any, begins.
    delta_end: usize,
    has_tag: bool,
}

impl Content {
    /// The fields of a content delta of type `event_type`.
    pub(crate) fn new(event_type: EventType, id: &str, delta: &str, tag: Option<&str>) -> Self {
        let tag_len = tag.map_or(0, str::len);
        let mut text = String::with_capacity(id.len() + delta.len() + tag_len);
        text.push_str(id);
        text.push_str(delta);
        text.push_str(tag.unwrap_or(""));
        Self {
            event_type,
            text: text.into_boxed_str(),
            id_end: id.len(),
            delta_end: id.len() + delta.len(),
            has_tag: tag.is_some(),
        }
    }

    /// The type.
    pub(crate) fn event_type(&self) -> EventType {
        self.event_type
    }

    /// The fields.
    pub(crate) fn get(&self) -> ContentRef<'_> {
        // The ends are those of strings pushed whole in `new`: character boundaries.
        ContentRef {
            event_type: self.event_type,
            id: &self.text[..self.id_end],
            delta: &self.text[self.id_end..self.delta_end],
            tag: self.has_tag.then(|| &self.text[self.delta_end..]),
        }
    }
}

/// An event as the order rules ([`crate::event::order`]) and the fold take it: as a value, and,
/// for a content delta read without one, as its fields.
///
/// Implementations agree: when [`Self::content`] is `Some`, its fields are what
/// [`Self::as_value`] holds, and the event has no member the fold reads besides them (no
/// `metadata`), so folding the fields or the value gives the same result.
pub trait AsEvent {
    /// The content delta's fields, when the event is one and they were read without a value.
    fn content(&self) -> Option<ContentRef<'_>>;

    /// The event as a JSON value (parsed on first use for an event read without one).
    fn as_value(&self) -> &Value;
}

impl AsEvent for Value {
    fn content(&self) -> Option<ContentRef<'_>> {
        None
    }

    fn as_value(&self) -> &Value {
        self
    }
}

impl<T: AsEvent + ?Sized> AsEvent for &T {
    fn content(&self) -> Option<ContentRef<'_>> {
        (**self).content()
    }

    fn as_value(&self) -> &Value {
        (**self).as_value()
    }
}
