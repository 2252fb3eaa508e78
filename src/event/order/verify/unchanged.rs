//! The verifier's check on a shared copy, for the events that record nothing: what the
//! publish path checks token deltas with, without copying the order state per batch.

use super::{OrderVerifier, Streamed, typed};
use crate::event::EventType;
use crate::event::order::rule::OrderViolation;
use serde_json::Value;

impl OrderVerifier {
    /// [`Self::verify`] on a shared verifier, for an event that records nothing whether it
    /// passes or not: a content delta (`TEXT_MESSAGE_CONTENT`, `TOOL_CALL_ARGS`,
    /// `REASONING_MESSAGE_CONTENT`), `STATE_SNAPSHOT`, `STATE_DELTA`, `CUSTOM` or `RAW`, once
    /// the stream's first event was received; the same rules in the same order, so the same
    /// violation. `None` for any other event (use `verify`). Why: the publish path checked
    /// every batch on a copy of the verifier, and copying the open constructs' maps per token
    /// delta was ~1.5 % of the broker's CPU (`loadtest/REPORT.md`, session 15).
    pub fn verify_unchanged(&self, event: &Value) -> Option<Result<(), OrderViolation>> {
        if !self.first_event_received {
            return None;
        }
        let (obj, event_type) = typed(event)?;
        use EventType as T;
        if !matches!(
            event_type,
            T::TextMessageContent
                | T::ToolCallArgs
                | T::ReasoningMessageContent
                | T::StateSnapshot
                | T::StateDelta
                | T::Custom
                | T::Raw
        ) {
            return None;
        }
        let check = || {
            let (_, tag) = self.check_head(obj, event_type)?;
            // Content phase only here: nothing to record.
            if let Some((construct, phase)) = Streamed::of(event_type) {
                self.check_streamed(construct, phase, obj, event_type, tag)?;
            }
            Ok(())
        };
        Some(check())
    }
}
