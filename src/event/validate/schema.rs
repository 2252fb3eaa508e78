//! The AG-UI 1.0 schema as data: for each event type and each nested object, which fields
//! exist, whether they are required, and what they must hold (AGUI.md §1–§2, the 1.0
//! `schema.json`; RFC 6901 pointers and RFC 6902 operations for the JSON Patch fields).
//!
//! Nothing here runs: `validate` walks these tables. Objects are open: a member a table does
//! not name is neither checked nor removed (PROTOCOL §2 keeps every producer field).

use crate::event::EventType;

/// Whether a field must be present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Presence {
    /// Absent is an error. `null` passes only when the kind accepts it ([`Kind::Any`]).
    Required,
    /// Absent is fine; present it must match the kind and is **never** `null` ("absent means
    /// absent", AGUI.md §1.2).
    Optional,
}

/// What a field's value must be.
#[derive(Debug)]
pub(super) enum Kind {
    /// A JSON string.
    String,
    /// A JSON boolean.
    Bool,
    /// A JSON object, open by key: metadata, activity content, a carried JSON Schema.
    Object,
    /// Any JSON value (`null` included when the field is required).
    Any,
    /// An integer in the JavaScript safe range, −(2^53−1) ..= 2^53−1, written without a
    /// fraction or exponent (`timestamp`).
    SafeInteger,
    /// A safe integer that is not negative (the `TokenUsage` counts).
    Count,
    /// One of these strings (an enumeration, or a `const` when it has one member).
    OneOf(&'static [&'static str]),
    /// A JSON Pointer (RFC 6901 §3): `^(/([^/~]|~[01])*)*$`.
    Pointer,
    /// `string | ContentPart[]`: a user or tool message body, `TOOL_CALL_RESULT.content`.
    TextOrParts,
    /// An object with these fields.
    Record(&'static Shape),
    /// An object discriminated by one of its string members.
    Union(&'static Union),
    /// An array whose every item is `items`, with at least `min` items.
    Array {
        /// What each item must be.
        items: &'static Kind,
        /// Fewest items allowed.
        min: usize,
    },
}

/// One named member of an object.
#[derive(Debug)]
pub(super) struct Field {
    /// The JSON member name (camelCase, as on the wire).
    pub(super) name: &'static str,
    /// Required or optional.
    pub(super) presence: Presence,
    /// What the value must be.
    pub(super) kind: Kind,
}

/// The fields of an object, as groups composed the way JSON Schema's `allOf` composes them
/// (e.g. the message fields every role shares, then the role's own).
pub(super) type Shape = [&'static [Field]];

/// A family of object shapes told apart by the string member `tag`.
#[derive(Debug)]
pub(super) struct Union {
    /// The discriminating member, e.g. `role` for messages, `op` for patch operations.
    pub(super) tag: &'static str,
    /// Each tag value with the shape of the rest of the object.
    pub(super) variants: &'static [(&'static str, &'static Shape)],
    /// Whether a tag value not in `variants` passes unchecked. Only `RUN_FINISHED.outcome` is
    /// open: the 1.0 client strips an outcome it does not know and reads it as success.
    pub(super) open: bool,
}

impl Union {
    /// The shape for a tag value, if the union knows it.
    pub(super) fn variant(&self, tag: &str) -> Option<&'static Shape> {
        self.variants
            .iter()
            .find(|(name, _)| *name == tag)
            .map(|(_, shape)| *shape)
    }

    /// The known tag values, for error messages.
    pub(super) fn tags(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.variants.iter().map(|(name, _)| *name)
    }
}

const fn req(name: &'static str, kind: Kind) -> Field {
    Field {
        name,
        presence: Presence::Required,
        kind,
    }
}

const fn opt(name: &'static str, kind: Kind) -> Field {
    Field {
        name,
        presence: Presence::Optional,
        kind,
    }
}

const fn array_of(items: &'static Kind) -> Kind {
    Kind::Array { items, min: 0 }
}

/// The largest integer JavaScript represents exactly, 2^53 − 1 (`Number.MAX_SAFE_INTEGER`).
pub(super) const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

// ---- Base fields (AGUI.md §1.2) -----------------------------------------------------------

/// Fields every event may carry. An event's own table takes precedence for a name it also
/// lists (`subagentRunId` is required on `SUBAGENT_*`).
///
/// `subagentRunId` is checked on every type, run-scoped ones included: the schema does not
/// declare it there, so it is an unknown member that is kept, but a producer sending it as
/// `null` or a number is refused like anywhere else.
pub(super) const BASE: &[Field] = &[
    opt("timestamp", Kind::SafeInteger),
    opt("rawEvent", Kind::Any),
    opt("metadata", Kind::Object),
    opt("subagentRunId", Kind::String),
];

// ---- Enumerations -------------------------------------------------------------------------

/// `TextMessageRole`: the roles a streamed text message may take.
const TEXT_ROLES: &[&str] = &["developer", "system", "assistant", "user"];

// ---- JSON Patch (RFC 6902 §4) -------------------------------------------------------------

const VALUE_AT_PATH: &Shape = &[&[req("path", Kind::Pointer), req("value", Kind::Any)]];
const AT_PATH: &Shape = &[&[req("path", Kind::Pointer)]];
const FROM_TO_PATH: &Shape = &[&[req("from", Kind::Pointer), req("path", Kind::Pointer)]];

/// One RFC 6902 operation. Closed on `op`: PROTOCOL §2 refuses an unknown operation even though
/// the 1.0 client would only drop it. Open otherwise: extra members are kept (conformance
/// fixture `open-object-patch-op-extras`).
const PATCH_OPERATION: Union = Union {
    tag: "op",
    variants: &[
        ("add", VALUE_AT_PATH),
        ("remove", AT_PATH),
        ("replace", VALUE_AT_PATH),
        ("move", FROM_TO_PATH),
        ("copy", FROM_TO_PATH),
        ("test", VALUE_AT_PATH),
    ],
    open: false,
};

/// A JSON Patch document: an array of operations (`[]` is a valid no-op).
const JSON_PATCH: Kind = array_of(&Kind::Union(&PATCH_OPERATION));

// ---- Content parts (AGUI.md §2) -----------------------------------------------------------

const PART_SOURCE: Union = Union {
    tag: "type",
    variants: &[
        (
            "data",
            &[&[req("value", Kind::String), req("mimeType", Kind::String)]],
        ),
        (
            "url",
            &[&[req("value", Kind::String), opt("mimeType", Kind::String)]],
        ),
        (
            "file",
            &[&[
                req("value", Kind::String),
                opt("provider", Kind::String),
                opt("mimeType", Kind::String),
            ]],
        ),
    ],
    open: false,
};

/// The members of a media part (image, audio, video, document). `metadata` on a part is any
/// value except null (unlike the object-valued `metadata` elsewhere).
const MEDIA_PART: &Shape = &[&[
    opt("id", Kind::String),
    req("source", Kind::Union(&PART_SOURCE)),
    opt("metadata", Kind::Any),
]];

/// `ContentPart`, discriminated on `type`. The 0.x `binary` part is retired in 1.0.
pub(super) const CONTENT_PART: Union = Union {
    tag: "type",
    variants: &[
        (
            "text",
            &[&[
                opt("id", Kind::String),
                req("text", Kind::String),
                opt("metadata", Kind::Any),
            ]],
        ),
        ("image", MEDIA_PART),
        ("audio", MEDIA_PART),
        ("video", MEDIA_PART),
        ("document", MEDIA_PART),
    ],
    open: false,
};

// ---- Messages (AGUI.md §2) ----------------------------------------------------------------

/// Members every message has, whatever its role.
const MESSAGE_COMMON: &[Field] = &[
    req("id", Kind::String),
    opt("metadata", Kind::Object),
    opt("subagentRunId", Kind::String),
];

/// `name` and `encryptedValue`, shared by developer, system, assistant and user messages.
const NAMED: &[Field] = &[
    opt("name", Kind::String),
    opt("encryptedValue", Kind::String),
];

const TOOL_CALL: Kind = Kind::Record(&[&[
    req("id", Kind::String),
    req("type", Kind::OneOf(&["function"])),
    req(
        "function",
        Kind::Record(&[&[req("name", Kind::String), req("arguments", Kind::String)]]),
    ),
    opt("encryptedValue", Kind::String),
    opt("metadata", Kind::Object),
]]);

/// `Message`, discriminated on `role`.
const MESSAGE: Union = Union {
    tag: "role",
    variants: &[
        (
            "developer",
            &[MESSAGE_COMMON, NAMED, &[req("content", Kind::String)]],
        ),
        (
            "system",
            &[MESSAGE_COMMON, NAMED, &[req("content", Kind::String)]],
        ),
        (
            "assistant",
            &[
                MESSAGE_COMMON,
                NAMED,
                &[
                    opt("content", Kind::String),
                    opt("toolCalls", array_of(&TOOL_CALL)),
                ],
            ],
        ),
        (
            "user",
            &[MESSAGE_COMMON, NAMED, &[req("content", Kind::TextOrParts)]],
        ),
        (
            "tool",
            &[
                MESSAGE_COMMON,
                &[
                    req("content", Kind::TextOrParts),
                    req("toolCallId", Kind::String),
                    opt("error", Kind::String),
                    opt("encryptedValue", Kind::String),
                ],
            ],
        ),
        (
            "activity",
            &[
                MESSAGE_COMMON,
                &[
                    req("activityType", Kind::String),
                    req("content", Kind::Object),
                ],
            ],
        ),
        (
            "reasoning",
            &[
                MESSAGE_COMMON,
                &[
                    req("content", Kind::String),
                    opt("encryptedValue", Kind::String),
                ],
            ],
        ),
    ],
    open: false,
};

const MESSAGES: Kind = array_of(&Kind::Union(&MESSAGE));

// ---- RunAgentInput (AGUI.md §2) -----------------------------------------------------------

const TOOL: Kind = Kind::Record(&[&[
    req("name", Kind::String),
    req("description", Kind::String),
    opt("parameters", Kind::Any),
    opt("metadata", Kind::Object),
]]);

const CONTEXT: Kind =
    Kind::Record(&[&[req("description", Kind::String), req("value", Kind::String)]]);

const RESUME_ENTRY: Kind = Kind::Record(&[&[
    req("interruptId", Kind::String),
    req("status", Kind::OneOf(&["resolved", "cancelled"])),
    opt("payload", Kind::Any),
    opt("metadata", Kind::Object),
]]);

/// `RunAgentInput`, the run request that `RUN_STARTED.input` echoes (and the body of a
/// gateway run, `validate_run_input`).
pub(super) const RUN_AGENT_INPUT: &Shape = &[&[
    req("threadId", Kind::String),
    req("runId", Kind::String),
    req("messages", MESSAGES),
    opt("tools", array_of(&TOOL)),
    opt("context", array_of(&CONTEXT)),
    opt("state", Kind::Any),
    opt("forwardedProps", Kind::Any),
    opt("resume", array_of(&RESUME_ENTRY)),
    opt("protocolVersion", Kind::String),
    opt("parentRunId", Kind::String),
]];

// ---- Run and subagent outcomes (AGUI.md §1.4) ---------------------------------------------

const STRINGS: Kind = array_of(&Kind::String);

const INTERRUPT: Kind = Kind::Record(&[&[
    req("id", Kind::String),
    req("reason", Kind::String),
    opt("message", Kind::String),
    opt("toolCallId", Kind::String),
    opt("responseSchema", Kind::Object),
    opt("expiresAt", Kind::String),
    opt("metadata", Kind::Object),
    opt("subagentRunId", Kind::String),
]]);

/// `RUN_FINISHED.outcome`. Open: an unknown `type` string passes (the 1.0 client strips it).
const RUN_OUTCOME: Union = Union {
    tag: "type",
    variants: &[
        ("success", &[&[opt("pendingToolCallIds", STRINGS)]]),
        (
            "interrupt",
            &[&[req(
                "interrupts",
                Kind::Array {
                    items: &INTERRUPT,
                    min: 1,
                },
            )]],
        ),
        ("cancelled", &[]),
    ],
    open: true,
};

/// `SUBAGENT_FINISHED.outcome`. Closed.
const SUBAGENT_OUTCOME: Union = Union {
    tag: "type",
    variants: &[
        ("success", &[]),
        ("suspended", &[&[opt("interruptIds", STRINGS)]]),
    ],
    open: false,
};

/// `TokenUsage`: every member optional.
const TOKEN_USAGE: Kind = Kind::Record(&[&[
    opt("provider", Kind::String),
    opt("model", Kind::String),
    opt("inputTokens", Kind::Count),
    opt("outputTokens", Kind::Count),
    opt("totalTokens", Kind::Count),
    opt("reasoningTokens", Kind::Count),
    opt("cachedInputTokens", Kind::Count),
    opt("cacheWriteInputTokens", Kind::Count),
]]);

const USAGE: Kind = array_of(&TOKEN_USAGE);

// ---- Events (AGUI.md §1.3) ----------------------------------------------------------------

mod events {
    //! One table per event type: its fields beyond [`BASE`](super::BASE) and `type`.

    use super::{
        Field, JSON_PATCH, Kind, MESSAGES, RUN_AGENT_INPUT, RUN_OUTCOME, SUBAGENT_OUTCOME,
        TEXT_ROLES, USAGE, opt, req,
    };
    use Kind::{Any, Bool, Object, OneOf, String, TextOrParts};

    /// `TEXT_MESSAGE_START`.
    pub(super) const TEXT_MESSAGE_START: &[Field] = &[
        req("messageId", String),
        opt("role", OneOf(TEXT_ROLES)),
        opt("name", String),
    ];
    /// `TEXT_MESSAGE_CONTENT`.
    pub(super) const TEXT_MESSAGE_CONTENT: &[Field] =
        &[req("messageId", String), req("delta", String)];
    /// `TEXT_MESSAGE_END`.
    pub(super) const TEXT_MESSAGE_END: &[Field] = &[req("messageId", String)];
    /// `TEXT_MESSAGE_CHUNK`.
    pub(super) const TEXT_MESSAGE_CHUNK: &[Field] = &[
        opt("messageId", String),
        opt("role", OneOf(TEXT_ROLES)),
        opt("delta", String),
        opt("name", String),
    ];
    /// `TOOL_CALL_START`.
    pub(super) const TOOL_CALL_START: &[Field] = &[
        req("toolCallId", String),
        req("toolCallName", String),
        opt("parentMessageId", String),
    ];
    /// `TOOL_CALL_ARGS`.
    pub(super) const TOOL_CALL_ARGS: &[Field] = &[req("toolCallId", String), req("delta", String)];
    /// `TOOL_CALL_END`.
    pub(super) const TOOL_CALL_END: &[Field] = &[req("toolCallId", String)];
    /// `TOOL_CALL_CHUNK`.
    pub(super) const TOOL_CALL_CHUNK: &[Field] = &[
        opt("toolCallId", String),
        opt("toolCallName", String),
        opt("parentMessageId", String),
        opt("delta", String),
    ];
    /// `TOOL_CALL_RESULT`.
    pub(super) const TOOL_CALL_RESULT: &[Field] = &[
        req("messageId", String),
        req("toolCallId", String),
        req("content", TextOrParts),
        opt("role", OneOf(&["tool"])),
    ];
    /// `STATE_SNAPSHOT`.
    pub(super) const STATE_SNAPSHOT: &[Field] = &[req("snapshot", Any)];
    /// `STATE_DELTA`.
    pub(super) const STATE_DELTA: &[Field] = &[req("delta", JSON_PATCH)];
    /// `MESSAGES_SNAPSHOT`.
    pub(super) const MESSAGES_SNAPSHOT: &[Field] = &[req("messages", MESSAGES)];
    /// `ACTIVITY_SNAPSHOT`.
    pub(super) const ACTIVITY_SNAPSHOT: &[Field] = &[
        req("messageId", String),
        req("activityType", String),
        req("content", Object),
        opt("replace", Bool),
    ];
    /// `ACTIVITY_DELTA`.
    pub(super) const ACTIVITY_DELTA: &[Field] = &[
        req("messageId", String),
        req("activityType", String),
        req("patch", JSON_PATCH),
    ];
    /// `RAW`.
    pub(super) const RAW: &[Field] = &[req("event", Any), opt("source", String)];
    /// `CUSTOM`.
    pub(super) const CUSTOM: &[Field] = &[req("name", String), req("value", Any)];
    /// `RUN_STARTED`.
    pub(super) const RUN_STARTED: &[Field] = &[
        req("threadId", String),
        req("runId", String),
        opt("protocolVersion", String),
        opt("parentRunId", String),
        opt("input", Kind::Record(RUN_AGENT_INPUT)),
    ];
    /// `RUN_FINISHED`.
    pub(super) const RUN_FINISHED: &[Field] = &[
        req("threadId", String),
        req("runId", String),
        opt("result", Any),
        opt("outcome", Kind::Union(&RUN_OUTCOME)),
        opt("usage", USAGE),
    ];
    /// `RUN_ERROR`.
    pub(super) const RUN_ERROR: &[Field] = &[
        req("message", String),
        opt("code", String),
        opt("usage", USAGE),
    ];
    /// `STEP_STARTED` and `STEP_FINISHED`.
    pub(super) const STEP: &[Field] = &[req("stepName", String)];
    /// `REASONING_START`, `REASONING_END` and `REASONING_MESSAGE_END`.
    pub(super) const REASONING_SPAN: &[Field] = &[req("messageId", String)];
    /// `REASONING_MESSAGE_START`.
    pub(super) const REASONING_MESSAGE_START: &[Field] =
        &[req("messageId", String), req("role", OneOf(&["reasoning"]))];
    /// `REASONING_MESSAGE_CONTENT`.
    pub(super) const REASONING_MESSAGE_CONTENT: &[Field] =
        &[req("messageId", String), req("delta", String)];
    /// `REASONING_MESSAGE_CHUNK`.
    pub(super) const REASONING_MESSAGE_CHUNK: &[Field] =
        &[opt("messageId", String), opt("delta", String)];
    /// `REASONING_ENCRYPTED_VALUE`.
    pub(super) const REASONING_ENCRYPTED_VALUE: &[Field] = &[
        req("subtype", OneOf(&["tool-call", "message"])),
        req("entityId", String),
        req("encryptedValue", String),
    ];
    /// `SUBAGENT_STARTED`.
    pub(super) const SUBAGENT_STARTED: &[Field] = &[
        req("subagentRunId", String),
        req("name", String),
        opt("description", String),
        opt("parentSubagentRunId", String),
        opt("parentToolCallId", String),
        opt("parentMessageId", String),
    ];
    /// `SUBAGENT_FINISHED`.
    pub(super) const SUBAGENT_FINISHED: &[Field] = &[
        req("subagentRunId", String),
        opt("result", Any),
        opt("outcome", Kind::Union(&SUBAGENT_OUTCOME)),
    ];
    /// `SUBAGENT_ERROR`.
    pub(super) const SUBAGENT_ERROR: &[Field] = &[
        req("subagentRunId", String),
        req("message", String),
        opt("code", String),
    ];
}

/// The fields of one event type beyond [`BASE`] and `type` itself.
pub(super) fn event_fields(event_type: EventType) -> &'static [Field] {
    use EventType as T;
    match event_type {
        T::TextMessageStart => events::TEXT_MESSAGE_START,
        T::TextMessageContent => events::TEXT_MESSAGE_CONTENT,
        T::TextMessageEnd => events::TEXT_MESSAGE_END,
        T::TextMessageChunk => events::TEXT_MESSAGE_CHUNK,
        T::ToolCallStart => events::TOOL_CALL_START,
        T::ToolCallArgs => events::TOOL_CALL_ARGS,
        T::ToolCallEnd => events::TOOL_CALL_END,
        T::ToolCallChunk => events::TOOL_CALL_CHUNK,
        T::ToolCallResult => events::TOOL_CALL_RESULT,
        T::StateSnapshot => events::STATE_SNAPSHOT,
        T::StateDelta => events::STATE_DELTA,
        T::MessagesSnapshot => events::MESSAGES_SNAPSHOT,
        T::ActivitySnapshot => events::ACTIVITY_SNAPSHOT,
        T::ActivityDelta => events::ACTIVITY_DELTA,
        T::Raw => events::RAW,
        T::Custom => events::CUSTOM,
        T::RunStarted => events::RUN_STARTED,
        T::RunFinished => events::RUN_FINISHED,
        T::RunError => events::RUN_ERROR,
        T::ReasoningMessageStart => events::REASONING_MESSAGE_START,
        T::ReasoningMessageContent => events::REASONING_MESSAGE_CONTENT,
        T::ReasoningMessageChunk => events::REASONING_MESSAGE_CHUNK,
        T::ReasoningEncryptedValue => events::REASONING_ENCRYPTED_VALUE,
        T::SubagentStarted => events::SUBAGENT_STARTED,
        T::SubagentFinished => events::SUBAGENT_FINISHED,
        T::SubagentError => events::SUBAGENT_ERROR,
        T::StepStarted | T::StepFinished => events::STEP,
        T::ReasoningStart | T::ReasoningEnd | T::ReasoningMessageEnd => events::REASONING_SPAN,
    }
}
