//! The 31 AG-UI 1.0 event types (`@ag-ui/core` 1.0.0 `EventType`, AGUI.md §1.1).

use std::fmt;

macro_rules! event_types {
    ($($variant:ident => $name:literal),+ $(,)?) => {
        /// The AG-UI 1.0 `type` discriminator. Spelled on the wire exactly as `as_str` returns.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(missing_docs)]
        pub enum EventType { $($variant),+ }

        impl EventType {
            /// Every type, in the order of the AG-UI enum.
            pub const ALL: &'static [EventType] = &[$(EventType::$variant),+];

            /// The wire names of [`EventType::ALL`], in the same order (`t as usize` indexes
            /// both).
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The wire name, e.g. `"STATE_DELTA"`.
            pub const fn as_str(self) -> &'static str {
                match self { $(EventType::$variant => $name),+ }
            }

            /// Parses a wire name; `None` for anything not in AG-UI 1.0 (including the removed
            /// `THINKING_*` types, which PROTOCOL §2 refuses like any unknown type).
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($name => Some(EventType::$variant),)+ _ => None }
            }
        }
    };
}

event_types! {
    TextMessageStart => "TEXT_MESSAGE_START",
    TextMessageContent => "TEXT_MESSAGE_CONTENT",
    TextMessageEnd => "TEXT_MESSAGE_END",
    TextMessageChunk => "TEXT_MESSAGE_CHUNK",
    ToolCallStart => "TOOL_CALL_START",
    ToolCallArgs => "TOOL_CALL_ARGS",
    ToolCallEnd => "TOOL_CALL_END",
    ToolCallChunk => "TOOL_CALL_CHUNK",
    ToolCallResult => "TOOL_CALL_RESULT",
    StateSnapshot => "STATE_SNAPSHOT",
    StateDelta => "STATE_DELTA",
    MessagesSnapshot => "MESSAGES_SNAPSHOT",
    ActivitySnapshot => "ACTIVITY_SNAPSHOT",
    ActivityDelta => "ACTIVITY_DELTA",
    Raw => "RAW",
    Custom => "CUSTOM",
    RunStarted => "RUN_STARTED",
    RunFinished => "RUN_FINISHED",
    RunError => "RUN_ERROR",
    StepStarted => "STEP_STARTED",
    StepFinished => "STEP_FINISHED",
    ReasoningStart => "REASONING_START",
    ReasoningMessageStart => "REASONING_MESSAGE_START",
    ReasoningMessageContent => "REASONING_MESSAGE_CONTENT",
    ReasoningMessageEnd => "REASONING_MESSAGE_END",
    ReasoningMessageChunk => "REASONING_MESSAGE_CHUNK",
    ReasoningEnd => "REASONING_END",
    ReasoningEncryptedValue => "REASONING_ENCRYPTED_VALUE",
    SubagentStarted => "SUBAGENT_STARTED",
    SubagentFinished => "SUBAGENT_FINISHED",
    SubagentError => "SUBAGENT_ERROR",
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_31_round_trip() {
        assert_eq!(EventType::ALL.len(), 31);
        assert_eq!(EventType::NAMES.len(), 31);
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(*t));
            // The counter tables index the names by the type's discriminant.
            assert_eq!(EventType::NAMES[*t as usize], t.as_str());
        }
        assert_eq!(EventType::parse("THINKING_START"), None);
        assert_eq!(EventType::parse("state_delta"), None);
    }
}
