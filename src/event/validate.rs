//! Schema validation of one AG-UI 1.0 event (SPEC §2 "Publish rules", AGUI.md §1–§2).
//!
//! PLACEHOLDER: being written; the signatures below are the contract.

use super::{EventType, ThreadId, ValidEvent};
use bytes::Bytes;
use serde_json::Value;

/// Why an event was refused, naming the offending field (a JSON Pointer-like dotted path such
/// as `delta[2].path`) when there is one. Mapped to HTTP 400 `invalid_event` by `http`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    /// Human-readable reason, e.g. `"messageId must be a string"`.
    pub message: String,
    /// The field at fault, when the error concerns one.
    pub field: Option<String>,
}

/// Validates one event given as raw JSON bytes.
///
/// # Errors
/// [`ValidationError`] for malformed JSON, a non-object, or any schema violation.
pub fn validate_event(
    bytes: &[u8],
    thread: Option<&ThreadId>,
) -> Result<ValidEvent, ValidationError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ValidationError {
        message: format!("malformed JSON: {e}"),
        field: None,
    })?;
    validate_value(value, thread)
}

/// Validates one parsed event. `thread`, when given, must equal any `threadId` the event carries.
///
/// # Errors
/// [`ValidationError`] naming the field at fault.
pub fn validate_value(
    value: Value,
    thread: Option<&ThreadId>,
) -> Result<ValidEvent, ValidationError> {
    let _ = thread;
    let Value::Object(map) = &value else {
        return Err(ValidationError {
            message: "an event must be a JSON object".into(),
            field: None,
        });
    };
    let Some(Value::String(t)) = map.get("type") else {
        return Err(ValidationError {
            message: "type must be a string".into(),
            field: Some("type".into()),
        });
    };
    let Some(event_type) = EventType::parse(t) else {
        return Err(ValidationError {
            message: format!("unknown event type {t:?}"),
            field: Some("type".into()),
        });
    };
    let json = Bytes::from(serde_json::to_vec(&value).map_err(|e| ValidationError {
        message: e.to_string(),
        field: None,
    })?);
    Ok(ValidEvent { event_type, json })
}
