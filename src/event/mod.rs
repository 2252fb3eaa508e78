//! AG-UI 1.0 event model: event types, thread ids and the validated event that travels down
//! the data path (`http` → `ingest` → **`event`** → `log` → `hub` → `queue` → `stream`).
//!
//! Events are kept as the producer's JSON (compactly re-serialised) rather than as typed
//! structs: the broker must never drop or rewrite a producer's field (PROTOCOL §2), and only a few
//! fields (`type`, ids, deltas) are ever read downstream.

mod content;
mod fields;
pub mod order;
mod types;
pub mod validate;

pub use content::{AsEvent, ContentRef};
pub use fields::Fields;
pub use types::EventType;
pub use validate::{
    ValidationError, json_type, validate_event, validate_parsed, validate_run_input, validate_value,
};

use bytes::Bytes;
use content::Content;
use serde_json::Value;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// An AG-UI `threadId` used as the unit of ordering: 1–128 chars of `[A-Za-z0-9._:-]`, other
/// than `.` and `..` (PROTOCOL §1).
///
/// Cheap to clone (`Arc<str>`). The character set keeps it safe inside a Redis hash tag
/// (`{threadId}`) and a URL path segment without escaping.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadId(Arc<str>);

/// A concurrent map keyed by thread (the log's, the hub's and the publish path's thread
/// tables). Hashed with foldhash, seeded per process as hashbrown's default is, rather than
/// SipHash: each publish looks a thread up in three of them (SipHash and its set-up were 3 %
/// of the `agent` mix's instructions in `benches/hot_path.rs`, with serde_json's maps).
pub type ThreadMap<V> = dashmap::DashMap<ThreadId, V, foldhash::fast::RandomState>;

/// Why a string is not a valid [`ThreadId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThreadIdError {
    /// Empty or longer than 128 characters.
    #[error("threadId must be 1 to 128 characters long, got {0}")]
    Length(usize),
    /// A character outside `[A-Za-z0-9._:-]`.
    #[error("threadId may only contain A-Z a-z 0-9 . _ : - (found {0:?})")]
    Character(char),
    /// `.` or `..`: a URL path segment that clients remove (RFC 3986 §5.2.4), so a browser
    /// could never reach the thread's URLs.
    #[error("threadId may not be \".\" or \"..\" (URL path normalisation removes them)")]
    DotSegment,
}

impl ThreadId {
    /// Longest accepted thread id, in characters (PROTOCOL §1).
    pub const MAX_LEN: usize = 128;

    /// Parses a thread id.
    ///
    /// # Errors
    /// [`ThreadIdError`] when the length or a character is out of the PROTOCOL §1 range.
    pub fn parse(s: &str) -> Result<Self, ThreadIdError> {
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(ThreadIdError::Length(s.chars().count()));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
        {
            return Err(ThreadIdError::Character(c));
        }
        if s == "." || s == ".." {
            return Err(ThreadIdError::DotSegment);
        }
        Ok(Self(Arc::from(s)))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ThreadId({})", &self.0)
    }
}

/// An event that passed schema validation, ready to append.
///
/// `json` is the compact serialisation of the producer's object, unknown fields included; it
/// is what gets stored in the log and, unchanged, what subscribers receive in `data:`.
#[derive(Clone, Debug)]
pub struct ValidEvent {
    /// The AG-UI `type`.
    pub event_type: EventType,
    /// Compact one-line JSON of the whole event object (no `\n`, so one `data:` line suffices).
    pub json: Bytes,
    /// What validation read of the event, so the publish path's order checks and fold do not
    /// parse `json` again.
    parsed: Parsed,
}

/// What validation kept of an event besides its JSON.
#[derive(Clone, Debug)]
enum Parsed {
    /// The event as a value.
    Value(Arc<Value>),
    /// A content delta read without a value (`content.rs`): its fields, and the value once
    /// something asks for it.
    Content(Content, OnceLock<Arc<Value>>),
}

impl PartialEq for ValidEvent {
    /// Equal type and JSON (what validation kept besides follows from the JSON).
    fn eq(&self, other: &Self) -> bool {
        self.event_type == other.event_type && self.json == other.json
    }
}

impl ValidEvent {
    /// An event validated as a value.
    pub(crate) fn from_value(event_type: EventType, json: Bytes, value: Value) -> Self {
        Self {
            event_type,
            json,
            parsed: Parsed::Value(Arc::new(value)),
        }
    }

    /// A content delta validated from its fields, read from `json`.
    pub(crate) fn from_content(json: Bytes, content: Content) -> Self {
        Self {
            event_type: content.event_type(),
            json,
            parsed: Parsed::Content(content, OnceLock::new()),
        }
    }

    /// The event as a value: kept from validation, or, for a content delta validated from its
    /// fields, parsed from `json` on the first call.
    pub fn parsed(&self) -> &Arc<Value> {
        match &self.parsed {
            Parsed::Value(value) => value,
            Parsed::Content(_, value) => value.get_or_init(|| {
                // Invariant: `json` is the text validation parsed (UTF-8 JSON, no reserved
                // member), so it parses again.
                Arc::new(serde_json::from_slice(&self.json).expect("validated JSON parses"))
            }),
        }
    }

    /// Parses the stored JSON back into a value (for tests; not on the hot path).
    ///
    /// # Errors
    /// Only if `json` was not produced by validation (it always parses when it was).
    pub fn value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(&self.json)
    }
}

impl AsEvent for ValidEvent {
    fn content(&self) -> Option<ContentRef<'_>> {
        match &self.parsed {
            Parsed::Content(content, _) => Some(content.get()),
            Parsed::Value(_) => None,
        }
    }

    fn as_value(&self) -> &Value {
        self.parsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_id_rules() {
        assert!(ThreadId::parse("thread_Id_1").is_ok());
        assert!(ThreadId::parse("a.b:c-d").is_ok());
        assert_eq!(ThreadId::parse(""), Err(ThreadIdError::Length(0)));
        assert_eq!(
            ThreadId::parse(&"x".repeat(129)),
            Err(ThreadIdError::Length(129))
        );
        assert!(ThreadId::parse(&"x".repeat(128)).is_ok());
        assert_eq!(ThreadId::parse("a b"), Err(ThreadIdError::Character(' ')));
        assert_eq!(ThreadId::parse("a{b}"), Err(ThreadIdError::Character('{')));
        assert_eq!(ThreadId::parse("é"), Err(ThreadIdError::Character('é')));
        assert_eq!(ThreadId::parse("."), Err(ThreadIdError::DotSegment));
        assert_eq!(ThreadId::parse(".."), Err(ThreadIdError::DotSegment));
        assert!(ThreadId::parse("...").is_ok());
        assert!(ThreadId::parse(".a").is_ok());
    }
}
