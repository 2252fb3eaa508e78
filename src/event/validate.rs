//! Schema validation of one AG-UI 1.0 event (PROTOCOL §2 "Publish rules", AGUI.md §1–§2).
//!
//! What is checked, table by table (the tables are in `validate/schema.rs`):
//! - the event is a JSON object whose string `type` is one of the 31 AG-UI 1.0 [`EventType`]s
//!   (unknown types, the removed `THINKING_*` included, are refused: producers use `CUSTOM` or
//!   `RAW`);
//! - per type, every required field is present with the right JSON type, and an optional
//!   field, when present, has the right type and is **never `null`**; the base fields:
//!   `timestamp` a JavaScript safe integer written as an integer, `rawEvent` any value but
//!   `null`, `metadata` an object, `subagentRunId` a string (required on `SUBAGENT_*`);
//! - enumerations (roles, `subtype`, outcome and message discriminators), nested shapes
//!   (`RunAgentInput`, messages, tool calls, content parts, interrupts, token usage), and JSON
//!   Patch documents: each operation's `op` one of RFC 6902's six, `path`/`from` RFC 6901
//!   pointers, `value` present where the operation needs one;
//! - with a thread given, `threadId` (and `input.threadId`) must name that thread.
//!
//! Objects are open: a member not in the tables is neither checked nor removed, so
//! [`ValidEvent::json`] is the producer's object, whole and in its key order (the crate builds
//! `serde_json` with `preserve_order` and `arbitrary_precision`), compactly re-serialised, or
//! kept as received when the bytes already are that form (`validate/compact.rs`).
//! A content delta (`TEXT_MESSAGE_CONTENT`, `TOOL_CALL_ARGS`, `REASONING_MESSAGE_CONTENT`)
//! spelled compactly is validated from its members' text without building a value
//! ([`validate_content`], `validate/content.rs`): a shortcut that accepts only what the full
//! validation accepts, with the same result, and sends everything else the full way.
//!
//! Which events are checked and which are refused is pinned by `tests/validate_rows/` and,
//! against the recorded .NET producer output and the AG-UI conformance fixtures,
//! `tests/validate_fixtures.rs`.

mod compact;
mod content;
mod received;
mod schema;

pub use compact::array_elements;
pub use content::{validate_content, validate_content_batch, validate_content_in};
pub use received::{ParseError, RESERVED_MEMBER, RESERVED_MEMBERS, parse_received};

use super::{EventType, ThreadId, ValidEvent};
use crate::event::Fields;
use bytes::Bytes;
use schema::{Field, Kind, MAX_SAFE_INTEGER, Presence, Union};
use serde_json::{Map, Value};
use std::fmt;

/// Why an event was refused, naming the offending field (a JSON Pointer-like dotted path such
/// as `delta[2].path`) when there is one. Mapped to HTTP 400 `invalid_event` by `http`.
///
/// `message` starts with the field's path and says what was expected, e.g.
/// `"input.messages[0].role must be one of developer, system, assistant, user, tool, activity,
/// reasoning"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    /// Human-readable reason, e.g. `"messageId must be a string"`.
    pub message: String,
    /// The field at fault, when the error concerns one: member names joined by `.`, array
    /// positions as `[i]` (`outcome.interrupts[0].id`).
    pub field: Option<String>,
}

impl ValidationError {
    /// An error about the field at `path`; the message is the path followed by `problem`.
    fn at(path: &Path<'_>, problem: impl fmt::Display) -> Self {
        let field = path.to_string();
        Self {
            message: format!("{field} {problem}"),
            field: Some(field),
        }
    }

    /// An error about the event as a whole.
    fn whole(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            field: None,
        }
    }
}

/// Deepest nesting of arrays and objects accepted by [`validate_value`], the event object being
/// level 1. It matches what `serde_json`'s parser allows (fewer than 128 levels), so a value
/// built in code meets the bound a parsed one does, and serialising it cannot exhaust the stack.
pub const MAX_DEPTH: usize = 128;

/// Validates one event given as raw JSON bytes (UTF-8, one JSON object).
///
/// # Errors
/// [`ValidationError`] for bytes that are not UTF-8, malformed JSON (trailing data included,
/// or nesting deeper than `serde_json`'s limit), a non-object, or any schema violation (see
/// [`validate_value`]).
pub fn validate_event(
    bytes: &[u8],
    thread: Option<&ThreadId>,
) -> Result<ValidEvent, ValidationError> {
    if let Some(event) = validate_content(bytes) {
        return Ok(event);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ValidationError::whole(format!(
            "the event is not UTF-8: invalid byte at offset {}",
            e.valid_up_to()
        ))
    })?;
    let value =
        received::parse_received_text(text).map_err(|e| ValidationError::whole(e.to_string()))?;
    // The parser refuses nesting beyond its recursion limit, which is below MAX_DEPTH.
    finish(value, Some(text.as_bytes()), thread)
}

/// Validates one parsed event against the AG-UI 1.0 schema for its `type` (module docs list the
/// rules). `thread`, when given, must equal the `threadId` a `RUN_STARTED` or `RUN_FINISHED`
/// carries, and `RUN_STARTED.input.threadId`.
///
/// On success the event is returned as [`ValidEvent`]: its type and the compact JSON of the
/// whole object as received: unknown members kept, key order kept, numbers with all their
/// digits (`serde_json` only respells an exponent, `1E2` as `1e+2`), and no raw newline since
/// compact JSON escapes control characters inside strings.
///
/// # Errors
/// [`ValidationError`] naming the field at fault, or the event as a whole when it is not an
/// object or nests deeper than [`MAX_DEPTH`].
pub fn validate_value(
    value: Value,
    thread: Option<&ThreadId>,
) -> Result<ValidEvent, ValidationError> {
    bounded(value, None, thread)
}

/// [`validate_value`] for a value `serde_json` parsed from `raw`: the same checks and result,
/// and when `raw` is already the compact form (the usual case) its bytes are kept as
/// [`ValidEvent::json`] instead of serialising the value again.
///
/// # Errors
/// As [`validate_value`].
pub fn validate_parsed(
    value: Value,
    raw: &[u8],
    thread: Option<&ThreadId>,
) -> Result<ValidEvent, ValidationError> {
    bounded(value, Some(raw), thread)
}

/// The elements of a batch body `raw` that `serde_json` parsed into `items` (a JSON array),
/// each validated as [`validate_parsed`] with its received bytes (as [`validate_value`] when
/// the bytes cannot be split out), in order; a publish stops at the first error and names its
/// index.
pub fn validate_elements<'a>(
    items: Vec<Value>,
    raw: &'a [u8],
    thread: Option<&'a ThreadId>,
) -> impl Iterator<Item = Result<ValidEvent, ValidationError>> + 'a {
    let bytes = array_elements(raw).filter(|bytes| bytes.len() == items.len());
    items
        .into_iter()
        .enumerate()
        .map(move |(i, item)| match &bytes {
            Some(bytes) => validate_parsed(item, bytes[i], thread),
            None => validate_value(item, thread),
        })
}

/// Refuses a value nested deeper than [`MAX_DEPTH`] (one not from the parser may be), then
/// [`finish`]es it.
fn bounded(
    value: Value,
    raw: Option<&[u8]>,
    thread: Option<&ThreadId>,
) -> Result<ValidEvent, ValidationError> {
    if nested_deeper_than(&value, MAX_DEPTH) {
        return Err(ValidationError::whole(format!(
            "the event nests arrays and objects more than {MAX_DEPTH} levels deep"
        )));
    }
    finish(value, raw, thread)
}

/// Validates a `RunAgentInput` (AGUI.md §2: the body of an AG-UI run request, what
/// `RUN_STARTED.input` echoes) with the same tables as that echo: `threadId`, `runId` and
/// `messages` required, the optional members never `null`, every message, tool, context entry
/// and resume entry of the right shape. Members it does not describe pass untouched.
///
/// # Errors
/// [`ValidationError`] naming the member at fault relative to the input (`messages[0].role`),
/// or the input as a whole when it is not an object or nests deeper than [`MAX_DEPTH`].
pub fn validate_run_input(value: &Value) -> Result<(), ValidationError> {
    if nested_deeper_than(value, MAX_DEPTH) {
        return Err(ValidationError::whole(format!(
            "the input nests arrays and objects more than {MAX_DEPTH} levels deep"
        )));
    }
    let Value::Object(input) = value else {
        return Err(ValidationError::whole(format!(
            "a RunAgentInput must be a JSON object, got {}",
            json_type(value)
        )));
    };
    check_shape(input, schema::RUN_AGENT_INPUT, &Path::Root)
}

/// Checks a value whose depth is known to be bounded, then serialises it, or keeps `raw`, the
/// bytes it was parsed from, when they are the serialised form already.
fn finish(
    value: Value,
    raw: Option<&[u8]>,
    thread: Option<&ThreadId>,
) -> Result<ValidEvent, ValidationError> {
    let event_type = check_event(&value, thread)?;
    let json =
        match raw.map(<[u8]>::trim_ascii) {
            Some(raw) if compact::is_serialised_form(raw, &value) => Bytes::copy_from_slice(raw),
            _ => Bytes::from(serde_json::to_vec(&value).map_err(|e| {
                ValidationError::whole(format!("the event cannot be serialised: {e}"))
            })?),
        };
    Ok(ValidEvent::from_value(event_type, json, value))
}

/// The schema checks proper: `type`, the type's own fields, the base fields, the thread.
fn check_event(value: &Value, thread: Option<&ThreadId>) -> Result<EventType, ValidationError> {
    let Value::Object(event) = value else {
        return Err(ValidationError::whole(format!(
            "an event must be a JSON object, got {}",
            json_type(value)
        )));
    };
    let event_type = check_type(event)?;
    let root = Path::Root;
    let fields = schema::event_fields(event_type);
    check_fields(event, fields, &root)?;
    let base = schema::BASE
        .iter()
        .filter(|base| !fields.iter().any(|own| own.name == base.name));
    for field in base {
        check_field(event, field, &root)?;
    }
    if let Some(thread) = thread {
        check_thread(event, event_type, thread)?;
    }
    Ok(event_type)
}

/// The types AG-UI 1.0 removed (AGUI.md §1.1), named in their refusal so a producer on an
/// older SDK learns why.
const REMOVED_TYPES: &[&str] = &[
    "THINKING_START",
    "THINKING_END",
    "THINKING_TEXT_MESSAGE_START",
    "THINKING_TEXT_MESSAGE_CONTENT",
    "THINKING_TEXT_MESSAGE_END",
];

/// `type`: a string naming one of the 31 AG-UI 1.0 event types.
fn check_type(event: &Map<String, Value>) -> Result<EventType, ValidationError> {
    let at = Path::Root;
    let at = at.key("type");
    let name = match event.field("type") {
        None => return Err(ValidationError::at(&at, "is required")),
        Some(Value::String(name)) => name,
        Some(_) => return Err(ValidationError::at(&at, "must be a string")),
    };
    EventType::parse(name).ok_or_else(|| {
        let message = if REMOVED_TYPES.contains(&name.as_str()) {
            format!(
                "type {} was removed in AG-UI 1.0 (use the REASONING_* events)",
                quoted(name)
            )
        } else {
            format!(
                "type {} is not an AG-UI 1.0 event type (producers use CUSTOM or RAW)",
                quoted(name)
            )
        };
        ValidationError {
            message,
            field: Some("type".into()),
        }
    })
}

/// `threadId` of any event (a schema field of `RUN_STARTED`/`RUN_FINISHED`), and
/// `RUN_STARTED.input.threadId`, must name the thread the event is published to
/// (PROTOCOL §2). Runs after the schema checks, so both are strings when present.
fn check_thread(
    event: &Map<String, Value>,
    event_type: EventType,
    thread: &ThreadId,
) -> Result<(), ValidationError> {
    let root = Path::Root;
    if !matches!(event_type, EventType::RunStarted | EventType::RunFinished) {
        // Not in the schema of other types, but an event naming another thread is still
        // refused (PROTOCOL §2); a non-string `threadId` is just an unknown field.
        if let Some(Value::String(_)) = event.field("threadId") {
            same_thread(event.field("threadId"), &root.key("threadId"), thread)?;
        }
        return Ok(());
    }
    same_thread(event.field("threadId"), &root.key("threadId"), thread)?;
    if let Some(Value::Object(input)) = event.field("input") {
        let input_at = root.key("input");
        same_thread(input.field("threadId"), &input_at.key("threadId"), thread)?;
    }
    Ok(())
}

fn same_thread(
    claimed: Option<&Value>,
    at: &Path<'_>,
    thread: &ThreadId,
) -> Result<(), ValidationError> {
    match claimed.and_then(Value::as_str) {
        Some(id) if id != thread.as_str() => Err(ValidationError::at(
            at,
            format!(
                "must equal the thread the event is published to ({}), got {}",
                quoted(thread.as_str()),
                quoted(id)
            ),
        )),
        _ => Ok(()),
    }
}

// ---- The schema walker ------------------------------------------------------------------

/// Checks the members of `object` that `fields` names; other members pass untouched.
fn check_fields(
    object: &Map<String, Value>,
    fields: &[Field],
    at: &Path<'_>,
) -> Result<(), ValidationError> {
    fields
        .iter()
        .try_for_each(|field| check_field(object, field, at))
}

/// Checks every field group of a shape.
fn check_shape(
    object: &Map<String, Value>,
    shape: &schema::Shape,
    at: &Path<'_>,
) -> Result<(), ValidationError> {
    shape
        .iter()
        .try_for_each(|fields| check_fields(object, fields, at))
}

/// Presence first (required, or optional and never `null`), then the value's kind.
fn check_field(
    object: &Map<String, Value>,
    field: &Field,
    at: &Path<'_>,
) -> Result<(), ValidationError> {
    let here = at.key(field.name);
    match (object.field(field.name), field.presence) {
        (None, Presence::Required) => Err(ValidationError::at(&here, "is required")),
        (None, Presence::Optional) => Ok(()),
        (Some(Value::Null), Presence::Optional) => {
            Err(ValidationError::at(&here, "must not be null"))
        }
        (Some(value), _) => check_kind(value, &field.kind, &here),
    }
}

/// Checks one value against what its field must hold.
fn check_kind(value: &Value, kind: &Kind, at: &Path<'_>) -> Result<(), ValidationError> {
    let expect = |ok: bool, problem: &str| {
        if ok {
            Ok(())
        } else {
            Err(ValidationError::at(at, problem))
        }
    };
    match kind {
        Kind::Any => Ok(()),
        Kind::String => expect(value.is_string(), "must be a string"),
        Kind::Bool => expect(value.is_boolean(), "must be a boolean"),
        Kind::Object => expect(value.is_object(), "must be an object"),
        Kind::SafeInteger => check_integer(value, at, false),
        Kind::Count => check_integer(value, at, true),
        Kind::OneOf(allowed) => match value.as_str() {
            Some(s) if allowed.contains(&s) => Ok(()),
            _ => Err(ValidationError::at(at, one_of(allowed.iter().copied()))),
        },
        Kind::Pointer => match value.as_str() {
            Some(pointer) => expect(
                is_json_pointer(pointer),
                "must be a JSON Pointer (RFC 6901): empty, or tokens each starting with \"/\", \
                 with \"~\" written only as ~0 or ~1",
            ),
            None => expect(false, "must be a string"),
        },
        Kind::TextOrParts => match value {
            Value::String(_) => Ok(()),
            Value::Array(parts) => parts
                .iter()
                .enumerate()
                .try_for_each(|(i, part)| check_union(part, &schema::CONTENT_PART, &at.index(i))),
            _ => expect(false, "must be a string or an array of content parts"),
        },
        Kind::Record(shape) => check_shape(as_object(value, at)?, shape, at),
        Kind::Union(union) => check_union(value, union, at),
        Kind::Array { items, min } => {
            let Value::Array(elements) = value else {
                return expect(false, "must be an array");
            };
            if elements.len() < *min {
                let plural = if *min == 1 { "" } else { "s" };
                return expect(false, &format!("must have at least {min} item{plural}"));
            }
            elements
                .iter()
                .enumerate()
                .try_for_each(|(i, element)| check_kind(element, items, &at.index(i)))
        }
    }
}

/// An object told apart by its `union.tag` member, then checked against that variant's shape.
/// A closed union refuses a tag it does not know; an open one lets the object pass unchecked
/// (the tag must still be a string).
fn check_union(value: &Value, union: &Union, at: &Path<'_>) -> Result<(), ValidationError> {
    let object = as_object(value, at)?;
    let tag_at = at.key(union.tag);
    let variant = match object.field(union.tag) {
        None => return Err(ValidationError::at(&tag_at, "is required")),
        Some(Value::String(tag)) => union.variant(tag),
        Some(_) if union.open => return Err(ValidationError::at(&tag_at, "must be a string")),
        Some(_) => None,
    };
    match variant {
        Some(shape) => check_shape(object, shape, at),
        None if union.open => Ok(()),
        None => Err(ValidationError::at(&tag_at, one_of(union.tags()))),
    }
}

fn as_object<'v>(
    value: &'v Value,
    at: &Path<'_>,
) -> Result<&'v Map<String, Value>, ValidationError> {
    value
        .as_object()
        .ok_or_else(|| ValidationError::at(at, "must be an object"))
}

/// An integer written without fraction or exponent (`1.0` and `1e3` are refused, whatever
/// JSON Schema's `integer` would say) within the JavaScript safe range ±(2^53−1), and not
/// negative when `non_negative`.
fn check_integer(value: &Value, at: &Path<'_>, non_negative: bool) -> Result<(), ValidationError> {
    let expected = if non_negative {
        "must be a non-negative integer"
    } else {
        "must be an integer"
    };
    let out_of_range = || {
        let min = if non_negative { 0 } else { -MAX_SAFE_INTEGER };
        ValidationError::at(
            at,
            format!("must be a safe integer, between {min} and {MAX_SAFE_INTEGER}"),
        )
    };
    let Value::Number(number) = value else {
        return Err(ValidationError::at(at, expected));
    };
    if let Some(n) = number.as_i64() {
        return if non_negative && n < 0 {
            Err(ValidationError::at(at, expected))
        } else if n.unsigned_abs() > MAX_SAFE_INTEGER.unsigned_abs() {
            Err(out_of_range())
        } else {
            Ok(())
        };
    }
    // Outside i64 or not an integer: tell the two apart by the number's text.
    let text = number.to_string();
    let digits = text.strip_prefix('-').unwrap_or(&text);
    let integral = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    if integral && !(non_negative && text.starts_with('-')) {
        Err(out_of_range())
    } else {
        Err(ValidationError::at(at, expected))
    }
}

/// RFC 6901 §3: the empty string, or reference tokens each introduced by `/` in which `~`
/// only appears as `~0` or `~1`. Equivalent to the AG-UI schema's `^(/([^/~]|~[01])*)*$`.
fn is_json_pointer(pointer: &str) -> bool {
    if !(pointer.is_empty() || pointer.starts_with('/')) {
        return false;
    }
    let mut bytes = pointer.bytes();
    while let Some(b) = bytes.next() {
        if b == b'~' && !matches!(bytes.next(), Some(b'0' | b'1')) {
            return false;
        }
    }
    true
}

/// Whether arrays and objects nest deeper than `max` levels (the root being level 1).
/// Iterative, so any depth is measured without recursion; only containers are queued.
fn nested_deeper_than(root: &Value, max: usize) -> bool {
    fn is_container(value: &&Value) -> bool {
        value.is_array() || value.is_object()
    }
    let mut pending = vec![(root, 1_usize)];
    while let Some((value, depth)) = pending.pop() {
        if depth > max {
            return true;
        }
        let below = depth + 1;
        match value {
            Value::Array(items) => {
                pending.extend(
                    items
                        .iter()
                        .filter(is_container)
                        .map(|child| (child, below)),
                );
            }
            Value::Object(members) => {
                pending.extend(
                    members
                        .values()
                        .filter(is_container)
                        .map(|child| (child, below)),
                );
            }
            _ => {}
        }
    }
    false
}

// ---- Messages ---------------------------------------------------------------------------

/// `"must be one of a, b, c"`, or `must be "a"` for a single allowed value.
fn one_of(allowed: impl Iterator<Item = &'static str>) -> String {
    let allowed: Vec<&str> = allowed.collect();
    match allowed.as_slice() {
        [only] => format!("must be {only:?}"),
        all => format!("must be one of {}", all.join(", ")),
    }
}

/// The JSON type of a value with its article ("an object", "null"), for error messages.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A producer's string quoted for an error message, cut to 64 characters.
fn quoted(s: &str) -> String {
    const MAX_CHARS: usize = 64;
    match s.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{:?}…", &s[..cut]),
        None => format!("{s:?}"),
    }
}

/// Where a value sits in the event, built on the stack while walking and rendered only when an
/// error names it: `input.messages[0].role`, `delta[2].path`.
#[derive(Clone, Copy)]
enum Path<'a> {
    /// The event object itself.
    Root,
    /// A member of the object at the parent path.
    Key(&'a Path<'a>, &'a str),
    /// An item of the array at the parent path.
    Index(&'a Path<'a>, usize),
}

impl<'a> Path<'a> {
    fn key(&'a self, key: &'a str) -> Path<'a> {
        Path::Key(self, key)
    }

    fn index(&'a self, index: usize) -> Path<'a> {
        Path::Index(self, index)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

#[cfg(test)]
mod tests;
