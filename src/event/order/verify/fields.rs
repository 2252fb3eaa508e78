//! `verifyEvents`' field checks that precede the per-type rules: the event's type and
//! attribution tag, null optionals and the outcome shape on `SUBAGENT_*`, null interrupt
//! attribution on `RUN_FINISHED` (check 5), and the null check on the messages that seed
//! owners.

use crate::event::EventType;
use crate::event::Fields;
use crate::event::order::rule::{self, OrderViolation};
use serde_json::Map;
use serde_json::Value;

/// The event's object and its known AG-UI 1.0 `type`; `None` for anything the client drops
/// before verification.
pub(super) fn typed(event: &Value) -> Option<(&Map<String, Value>, EventType)> {
    let obj = event.as_object()?;
    let event_type = obj
        .field("type")
        .and_then(Value::as_str)
        .and_then(EventType::parse)?;
    Some((obj, event_type))
}

/// The `subagentRunId` tag of an event: absent, or a string; `null` is fatal.
pub(super) fn tag_of(
    obj: &Map<String, Value>,
    event_type: EventType,
) -> Result<Option<&str>, OrderViolation> {
    match obj.field("subagentRunId") {
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

/// Check 5's per-type part: null optionals and outcome shape on `SUBAGENT_*`, null interrupt
/// attribution on `RUN_FINISHED`.
pub(super) fn check_lifecycle_fields(
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
            let outcome = obj.field("outcome");
            if outcome
                .and_then(|o| o.field("type"))
                .and_then(Value::as_str)
                == Some("interrupt")
                && let Some(Value::Array(interrupts)) = outcome.and_then(|o| o.field("interrupts"))
            {
                for interrupt in interrupts {
                    if interrupt.field("subagentRunId") == Some(&Value::Null) {
                        return Err(OrderViolation::new(
                            rule::INTERRUPT_SUBAGENT_RUN_ID_NULL,
                            format!(
                                "Cannot send 'RUN_FINISHED' with an interrupt (id '{}') carrying \
                                 'subagentRunId: null'. The field is optional — omit it entirely.",
                                js_string(interrupt.field("id")),
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
        if obj.field(field) == Some(&Value::Null) {
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
    let Some(outcome) = obj.field("outcome") else {
        return Ok(());
    };
    let outcome_type = outcome.field("type");
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
    match outcome.field("interruptIds") {
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
pub(super) fn check_seed(messages: Option<&Value>) -> Result<(), OrderViolation> {
    for message in message_list(messages) {
        if let Some(id) = message.field("id").and_then(Value::as_str)
            && message.field("subagentRunId") == Some(&Value::Null)
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

/// The messages of a `MESSAGES_SNAPSHOT` or `RUN_STARTED.input`, when an array.
pub(super) fn message_list(messages: Option<&Value>) -> &[Value] {
    match messages {
        Some(Value::Array(list)) => list,
        _ => &[],
    }
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
