//! Validation of a content delta (`TEXT_MESSAGE_CONTENT`, `TOOL_CALL_ARGS`,
//! `REASONING_MESSAGE_CONTENT`) from its members' text, without building a `serde_json::Value`
//! (why: `event/content.rs`).
//!
//! It is a shortcut, never a second judge: it accepts only events that the full validation
//! (`validate_parsed`) accepts with the same result (the same type, and the received bytes
//! kept as the JSON), and answers "not here" for anything else, which then goes the full way
//! and gets its verdict and error there. So it takes only what it can decide from the members'
//! text alone: compact spelling (`compact.rs`), member names without escapes and not repeated,
//! the type's two string members, `subagentRunId` a string, `timestamp` a safe integer,
//! `rawEvent` not `null`; no `metadata` (the fold reads it) and no `threadId` (checked
//! against the thread). Members holding arrays or objects are parsed on their own, to count
//! their members (a repeated name inside one collapses when parsed: the bytes are then not
//! the serialised form) and bound their depth. `tests` compares it with the full validation.

use super::compact::{Escapes, count_members, string_end, written_members};
use super::received::names_reserved_member;
use super::schema::MAX_SAFE_INTEGER;
use super::{MAX_DEPTH, nested_deeper_than};
use crate::event::content::Content;
use crate::event::{ContentRef, EventType, ValidEvent};
use bytes::Bytes;
use memchr::memmem;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::fmt;
use std::sync::LazyLock;

/// Members beyond which an event goes the full way (content deltas have a handful).
const MAX_MEMBERS: usize = 16;

/// Validates `raw`, one received JSON text, when it is a content delta this shortcut can
/// decide (module docs): `Some` is the event exactly as the full validation returns it;
/// `None` means "validate it the full way" (whether it is valid or not).
pub fn validate_content(raw: &[u8]) -> Option<ValidEvent> {
    let raw = trim_json(raw);
    let content = read_content(raw)?;
    Some(ValidEvent::from_content(
        Bytes::copy_from_slice(raw),
        content,
    ))
}

/// [`validate_content`] of text already in a [`Bytes`] (a log entry read back): the event's
/// JSON shares it rather than copying it.
pub fn validate_content_in(json: &Bytes) -> Option<ValidEvent> {
    let raw = trim_json(json);
    let content = read_content(raw)?;
    Some(ValidEvent::from_content(json.slice_ref(raw), content))
}

/// [`validate_content`] of a batch: `raw` a JSON array (RFC 8259 §5) every element of which
/// is a content delta the shortcut accepts, returned in order, each element's bytes copied as
/// its JSON (as a single event's are, so no event holds the whole body). `None` means
/// "validate it the full way": any other element, an empty array, or text that is not exactly
/// an array of objects separated by commas and JSON whitespace (each element is parsed alone,
/// so together they are valid JSON).
pub fn validate_content_batch(raw: &[u8]) -> Option<Vec<ValidEvent>> {
    let inner = trim_json(raw).strip_prefix(b"[")?.strip_suffix(b"]")?;
    // Split, and look at every element's type, before validating any: a batch that is not all
    // content deltas (a run of them, then the message's end) is declined without validating
    // the run twice, here and the full way.
    let mut elements = Vec::new();
    let mut i = 0;
    loop {
        i = skip_json_space(inner, i);
        if inner.get(i) != Some(&b'{') {
            return None;
        }
        let end = object_end(inner, i)?;
        let element = &inner[i..end];
        if !names_content_type(element) {
            return None;
        }
        elements.push(element);
        i = skip_json_space(inner, end);
        match inner.get(i) {
            None => break,
            Some(b',') => i += 1,
            Some(_) => return None,
        }
    }
    elements.into_iter().map(validate_content).collect()
}

/// The position of the first byte at or after `i` that is not JSON whitespace.
fn skip_json_space(raw: &[u8], mut i: usize) -> usize {
    while matches!(raw.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The position after the bracket that closes the object opening at `raw[start]`, strings
/// skipped; `None` when it does not close. Whether the text between is JSON is left to the
/// parse of the element.
fn object_end(raw: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0_usize;
    let mut i = start;
    while i < raw.len() {
        match raw[i] {
            b'"' => {
                i = string_end(raw, i, Escapes::Any)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// `raw` without the whitespace JSON allows around a value (RFC 8259 §2: space, tab, line
/// feed, carriage return); `trim_ascii` would also drop a form feed, which the parser refuses.
fn trim_json(raw: &[u8]) -> &[u8] {
    let json_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let start = raw.iter().position(|b| !json_space(b)).unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|b| !json_space(b))
        .map_or(start, |i| i + 1);
    &raw[start..end]
}

/// The fields of `raw` (trimmed), when [`validate_content`] accepts it.
fn read_content(raw: &[u8]) -> Option<Content> {
    // Cheap refusals first: most events that are not content deltas stop at the type.
    if !names_content_type(raw) {
        return None;
    }
    let text = std::str::from_utf8(raw).ok()?;
    if names_reserved_member(raw).is_some() {
        return None;
    }
    let written = written_members(raw)?;
    let Members(members) = serde_json::from_str(text).ok()?;
    let type_text = members.iter().find(|(name, _)| *name == "type")?.1.get();
    let event_type = EventType::parse(unquoted(type_text)?)?;
    if !ContentRef::is_content_type(event_type) {
        return None;
    }
    let id_member = ContentRef::id_member(event_type);
    let (mut id, mut delta, mut tag) = (None, None, None);
    let mut nested = 0;
    for (i, (name, value)) in members.iter().enumerate() {
        if members[..i].iter().any(|(earlier, _)| earlier == name) {
            return None;
        }
        let value = value.get();
        match *name {
            "type" => {}
            "delta" => delta = Some(string(value)?),
            "subagentRunId" => tag = Some(string(value)?),
            "timestamp" => {
                if !is_safe_integer(value) {
                    return None;
                }
            }
            "metadata" | "threadId" => return None,
            "rawEvent" if value == "null" => return None,
            name if name == id_member => id = Some(string(value)?),
            _ => nested += container_members(value)?,
        }
    }
    if members.len() + nested != written {
        return None;
    }
    Some(Content::new(event_type, &id?, &delta?, tag.as_deref()))
}

/// Whether the first `"type":"` in `raw` names a content type: one `memmem` search that sends
/// every other event the full way before any parse. Only a filter: the type is read again
/// from the parsed members (a nested object's `type` may come first; the event then goes the
/// full way).
fn names_content_type(raw: &[u8]) -> bool {
    static TYPE_MEMBER: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"type\":\""));
    let Some(at) = TYPE_MEMBER.find(raw) else {
        return false;
    };
    let name = &raw[at + 8..];
    let name = &name[..memchr::memchr(b'"', name).unwrap_or(name.len())];
    matches!(
        name,
        b"TEXT_MESSAGE_CONTENT" | b"TOOL_CALL_ARGS" | b"REASONING_MESSAGE_CONTENT"
    )
}

/// The characters of a JSON string spelled without escapes; `None` for anything else.
fn unquoted(value: &str) -> Option<&str> {
    let inner = value.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// A string member's value from its text: borrowed when spelled without escapes, else
/// unescaped. `None` when it is not a string.
fn string(value: &str) -> Option<Cow<'_, str>> {
    match unquoted(value) {
        Some(s) => Some(Cow::Borrowed(s)),
        None if value.starts_with('"') => {
            serde_json::from_str::<String>(value).ok().map(Cow::Owned)
        }
        None => None,
    }
}

/// The full validation's `timestamp` rule on the member's text: an integer within
/// JavaScript's safe range, written without fraction or exponent.
fn is_safe_integer(value: &str) -> bool {
    value
        .parse::<i64>()
        .is_ok_and(|n| n.unsigned_abs() <= MAX_SAFE_INTEGER.unsigned_abs())
}

/// The object members inside a member's value (0 for a scalar); `None` when it nests too deep
/// to decide here.
fn container_members(value: &str) -> Option<usize> {
    if !value.starts_with(['{', '[']) {
        return Some(0);
    }
    let parsed: Value = serde_json::from_str(value).ok()?;
    // Within the event, the member is one level down: well inside the parser's limit.
    if nested_deeper_than(&parsed, MAX_DEPTH / 2) {
        return None;
    }
    Some(count_members(&parsed))
}

/// An object's members as received: names (without escapes) and values' text, in order.
struct Members<'a>(SmallVec<[(&'a str, &'a RawValue); 8]>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Members<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = SmallVec::new();
                // A name with an escape is not borrowed: an error here, the full way there.
                while let Some(name) = map.next_key::<&'de str>()? {
                    if members.len() == MAX_MEMBERS {
                        return Err(serde::de::Error::custom("many members"));
                    }
                    members.push((name, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

#[cfg(test)]
mod tests;
