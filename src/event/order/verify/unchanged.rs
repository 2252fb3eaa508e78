//! The verifier's check on a shared copy, for the events that record nothing: what the
//! publish path checks token deltas with, without copying the order state per batch.

use super::{OrderVerifier, Streamed, check_tag, typed};
use crate::event::order::open::Phase;
use crate::event::order::rule::OrderViolation;
use crate::event::{ContentRef, EventType};
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

    /// [`Self::verify_unchanged`] for a content delta given by its fields: the same rules in
    /// the same order (the lifecycle, then the construct open under the tag's owner; a schema
    /// valid content delta has no other member these rules read).
    pub fn verify_content_unchanged(
        &self,
        content: ContentRef<'_>,
    ) -> Option<Result<(), OrderViolation>> {
        if !self.first_event_received {
            return None;
        }
        let (construct, phase) = Streamed::of(content.event_type)?;
        let check = || {
            self.check_lifecycle(content.event_type)?;
            self.check_open(
                construct,
                phase,
                content.id,
                content.event_type,
                content.tag,
            )
        };
        Some(check())
    }

    /// [`Self::check_streamed`] for the construct `id`.
    pub(super) fn check_open(
        &self,
        construct: &Streamed,
        phase: Phase,
        id: &str,
        event_type: EventType,
        tag: Option<&str>,
    ) -> Result<(), OrderViolation> {
        if !self.open.set(construct.kind).contains(id, None) {
            let advice = if phase == Phase::End && construct.end_advice {
                format!("A '{}' event must be sent first.", construct.start)
            } else {
                format!(
                    "Start a {} with '{}' first.",
                    construct.noun, construct.start
                )
            };
            return Err(OrderViolation::new(
                construct.not_open,
                format!(
                    "Cannot send '{event_type}' event: No active {} found with ID '{id}'. \
                     {advice}",
                    construct.noun,
                ),
            ));
        }
        check_tag(
            event_type,
            tag,
            self.owners.of(construct.owners).get(id),
            construct.owner_noun,
            id,
        )
    }
}
