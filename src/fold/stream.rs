//! The reducer's streamed messages: text and reasoning messages, tool calls and their
//! results, encrypted values (START / CONTENT / END and friends).

use super::messages::{find_tool_call, merge_metadata};
use super::{Applied, Fold, copy_subagent_run_id, role_of, str_field};
use crate::event::{ContentRef, EventType, Fields};
use serde_json::{Map, Value};

impl Fold {
    // ---- messages: text and reasoning ---------------------------------------------------

    /// `TEXT_MESSAGE_START` / `REASONING_MESSAGE_START`: reuses the first message with this id
    /// (so later content appends to it, AGUI.md §6 "reducer idempotency"), or appends a new
    /// one `{id, role, content: "", name?, subagentRunId?}`; `role` defaults to `assistant`
    /// (`reasoning` for reasoning). An activity message under the id is left alone (the
    /// client warns that ids must be unique across kinds). Metadata merges either way.
    pub(super) fn message_start(
        &mut self,
        event: &Value,
        fixed_role: Option<&'static str>,
    ) -> Applied {
        let Some(id) = str_field(event, "messageId") else {
            return Applied::Skipped("message start without messageId");
        };
        if let Some(index) = self.messages.position(id) {
            let Some(message) = self.messages.get_mut(index) else {
                return Applied::Skipped("message is not an object");
            };
            if role_of(message) == Some("activity") {
                return Applied::Skipped("message start aimed at an activity message");
            }
            merge_metadata(message, event);
            return Applied::Folded;
        }
        let mut message = Map::new();
        message.insert("id".into(), id.into());
        let role = match fixed_role {
            Some(role) => Value::from(role),
            None => event
                .field("role")
                .cloned()
                .unwrap_or_else(|| "assistant".into()),
        };
        message.insert("role".into(), role);
        message.insert("content".into(), "".into());
        if fixed_role.is_none()
            && let Some(name) = event.field("name")
        {
            message.insert("name".into(), name.clone());
        }
        copy_subagent_run_id(&mut message, event);
        merge_metadata(&mut message, event);
        self.messages.push(Value::Object(message));
        Applied::Folded
    }

    /// `TEXT_MESSAGE_CONTENT` / `REASONING_MESSAGE_CONTENT`: appends `delta` byte-exactly to
    /// the message's string `content` (a non-string content is replaced, as JavaScript's
    /// `typeof content === "string" ? content : ""` does) and merges metadata.
    pub(super) fn message_content(&mut self, event: &Value) -> Applied {
        let (Some(id), Some(delta)) = (str_field(event, "messageId"), str_field(event, "delta"))
        else {
            return Applied::Skipped("content without messageId or delta");
        };
        self.append_content(id, delta, Some(event))
    }

    /// [`Self::message_content`] of message `id`; `event`, when given, for its metadata.
    fn append_content(&mut self, id: &str, delta: &str, event: Option<&Value>) -> Applied {
        let Some(message) = self
            .messages
            .position(id)
            .and_then(|i| self.messages.get_mut(i))
        else {
            return Applied::Skipped("content for an id with no message");
        };
        if role_of(message) == Some("activity") {
            return Applied::Skipped("content aimed at an activity message");
        }
        match message.get_mut("content") {
            Some(Value::String(content)) => content.push_str(delta),
            _ => {
                message.insert("content".into(), delta.into());
            }
        }
        if let Some(event) = event {
            merge_metadata(message, event);
        }
        Applied::Folded
    }

    /// A content delta given by its fields (no `metadata`, so nothing to merge): what
    /// [`Self::message_content`] or [`Self::tool_call_args`] does with the event.
    pub(super) fn content(&mut self, content: ContentRef<'_>) -> Applied {
        match content.event_type {
            EventType::ToolCallArgs => self.append_args(content.id, content.delta, None),
            _ => self.append_content(content.id, content.delta, None),
        }
    }

    /// `TEXT_MESSAGE_END` / `REASONING_MESSAGE_END`: merges metadata (where end-of-message
    /// values such as token usage arrive).
    pub(super) fn message_end(&mut self, event: &Value) -> Applied {
        let Some(message) = str_field(event, "messageId")
            .and_then(|id| self.messages.position(id))
            .and_then(|i| self.messages.get_mut(i))
        else {
            return Applied::Skipped("end for an id with no message");
        };
        if role_of(message) == Some("activity") {
            return Applied::Skipped("end aimed at an activity message");
        }
        merge_metadata(message, event);
        Applied::Folded
    }

    // ---- tool calls ---------------------------------------------------------------------

    /// `TOOL_CALL_START`. A tool call whose id some message already holds is updated in place
    /// (renamed if the name differs; metadata merged), never duplicated. Otherwise it is
    /// added as `{id, type: "function", function: {name, arguments: ""}}` to:
    /// - the first message with id `parentMessageId`, when that message is an assistant;
    /// - else a new assistant message `{id, role, toolCalls: []}` appended at the end, with id
    ///   `parentMessageId` when no message has that id, or the `toolCallId` when a
    ///   non-assistant message does (the 1.0 client's `resolveOrCreateAssistantMessage`);
    /// - else, without `parentMessageId`, a new assistant message with id `toolCallId`.
    ///
    /// A newly created message takes the event's `subagentRunId`. Event metadata merges into
    /// the tool call, not the message: several calls can share one message.
    pub(super) fn tool_call_start(&mut self, event: &Value) -> Applied {
        let Some(tool_call_id) = str_field(event, "toolCallId") else {
            return Applied::Skipped("TOOL_CALL_START without toolCallId");
        };
        let name = event.field("toolCallName");
        if let Some(owner) = self.messages.tool_call_owner(tool_call_id) {
            let Some(call) = self
                .messages
                .get_mut(owner)
                .and_then(|m| find_tool_call(m, tool_call_id))
            else {
                return Applied::Skipped("tool call index out of date");
            };
            if let (Some(name), Some(Value::Object(function))) = (name, call.get_mut("function"))
                && function.field("name") != Some(name)
            {
                function.insert("name".into(), name.clone());
            }
            merge_metadata(call, event);
            return Applied::Folded;
        }

        let parent = str_field(event, "parentMessageId").filter(|p| !p.is_empty());
        let existing_parent = parent.and_then(|p| self.messages.position(p));
        let target = match (parent, existing_parent) {
            (Some(_), Some(i)) if self.messages.get(i).and_then(role_of) == Some("assistant") => i,
            (Some(p), None) => self.push_assistant_for_tool_call(p, event),
            _ => self.push_assistant_for_tool_call(tool_call_id, event),
        };
        let Some(message) = self.messages.get_mut(target) else {
            return Applied::Skipped("tool call parent is not an object");
        };
        let calls = message
            .entry("toolCalls")
            .or_insert_with(|| Value::Array(Vec::new()));
        if calls.is_null() {
            *calls = Value::Array(Vec::new());
        }
        let Value::Array(calls) = calls else {
            return Applied::Skipped("parent message toolCalls is not an array");
        };
        let mut function = Map::new();
        if let Some(name) = name {
            function.insert("name".into(), name.clone());
        }
        function.insert("arguments".into(), "".into());
        let mut call = Map::new();
        call.insert("id".into(), tool_call_id.into());
        call.insert("type".into(), "function".into());
        call.insert("function".into(), Value::Object(function));
        merge_metadata(&mut call, event);
        calls.push(Value::Object(call));
        self.messages.note_tool_call(target, tool_call_id);
        Applied::Folded
    }

    /// Appends `{id, role: "assistant", toolCalls: []}` (plus the event's `subagentRunId` when
    /// no message had that id before) and returns its index.
    pub(super) fn push_assistant_for_tool_call(&mut self, id: &str, event: &Value) -> usize {
        let was_absent = self.messages.position(id).is_none();
        let mut message = Map::new();
        message.insert("id".into(), id.into());
        message.insert("role".into(), "assistant".into());
        message.insert("toolCalls".into(), Value::Array(Vec::new()));
        if was_absent {
            copy_subagent_run_id(&mut message, event);
        }
        self.messages.push(Value::Object(message));
        self.messages.len() - 1
    }

    /// `TOOL_CALL_ARGS`: appends `delta` to the first tool call with this id, in place, and
    /// merges metadata into the call.
    pub(super) fn tool_call_args(&mut self, event: &Value) -> Applied {
        let (Some(id), Some(delta)) = (str_field(event, "toolCallId"), str_field(event, "delta"))
        else {
            return Applied::Skipped("TOOL_CALL_ARGS without toolCallId or delta");
        };
        self.append_args(id, delta, Some(event))
    }

    /// [`Self::tool_call_args`] of tool call `id`; `event`, when given, for its metadata.
    fn append_args(&mut self, id: &str, delta: &str, event: Option<&Value>) -> Applied {
        let Some(call) = self
            .messages
            .tool_call_owner(id)
            .and_then(|i| self.messages.get_mut(i))
            .and_then(|m| find_tool_call(m, id))
        else {
            return Applied::Skipped("TOOL_CALL_ARGS for an unknown tool call");
        };
        let Some(Value::Object(function)) = call.get_mut("function") else {
            return Applied::Skipped("tool call without a function object");
        };
        match function.get_mut("arguments") {
            Some(Value::String(arguments)) => arguments.push_str(delta),
            _ => {
                function.insert("arguments".into(), delta.into());
            }
        }
        if let Some(event) = event {
            merge_metadata(call, event);
        }
        Applied::Folded
    }

    /// `TOOL_CALL_END`: merges metadata into the tool call.
    pub(super) fn tool_call_end(&mut self, event: &Value) -> Applied {
        let Some(call) = str_field(event, "toolCallId").and_then(|id| {
            self.messages
                .tool_call_owner(id)
                .and_then(|i| self.messages.get_mut(i))
                .and_then(|m| find_tool_call(m, id))
        }) else {
            return Applied::Skipped("TOOL_CALL_END for an unknown tool call");
        };
        merge_metadata(call, event);
        Applied::Folded
    }

    /// `TOOL_CALL_RESULT`: mints `{id: messageId, toolCallId, role: "tool", content,
    /// subagentRunId?}` (plus metadata) and places it right after the assistant message that
    /// holds the call, past any tool results already there (so parallel results keep their
    /// order); at the end when no assistant holds the call. The 1.0 client does this so that
    /// a result arriving after trailing text still follows its call.
    pub(super) fn tool_call_result(&mut self, event: &Value) -> Applied {
        let Some(id) = str_field(event, "messageId") else {
            return Applied::Skipped("TOOL_CALL_RESULT without messageId");
        };
        let tool_call_id = event.field("toolCallId");
        let mut message = Map::new();
        message.insert("id".into(), id.into());
        if let Some(tc) = tool_call_id {
            message.insert("toolCallId".into(), tc.clone());
        }
        let role = match event.field("role") {
            Some(Value::String(r)) if !r.is_empty() => Value::from(r.as_str()),
            _ => "tool".into(),
        };
        message.insert("role".into(), role);
        if let Some(content) = event.field("content") {
            message.insert("content".into(), content.clone());
        }
        copy_subagent_run_id(&mut message, event);
        merge_metadata(&mut message, event);

        let owner = tool_call_id
            .and_then(Value::as_str)
            .and_then(|tc| self.messages.tool_call_owner(tc));
        match owner {
            None => self.messages.push(Value::Object(message)),
            Some(owner) => {
                let list = self.messages.as_slice();
                let mut at = owner + 1;
                while list
                    .get(at)
                    .and_then(|m| m.field("role"))
                    .and_then(Value::as_str)
                    == Some("tool")
                {
                    at += 1;
                }
                self.messages.insert(at, Value::Object(message));
            }
        }
        Applied::Folded
    }

    /// `REASONING_ENCRYPTED_VALUE`: sets `encryptedValue` on the first assistant tool call with
    /// id `entityId` (`subtype: "tool-call"`) or on the first non-activity message with that
    /// id (`"message"`). Its metadata stays on the event.
    pub(super) fn encrypted_value(&mut self, event: &Value) -> Applied {
        let (Some(entity), Some(value)) =
            (str_field(event, "entityId"), event.field("encryptedValue"))
        else {
            return Applied::Skipped("REASONING_ENCRYPTED_VALUE without entityId or value");
        };
        if str_field(event, "subtype") == Some("tool-call") {
            let owner = self.messages.tool_call_owner(entity);
            if let Some(call) = owner
                .and_then(|i| self.messages.get_mut(i))
                .and_then(|m| find_tool_call(m, entity))
            {
                call.insert("encryptedValue".into(), value.clone());
                return Applied::Folded;
            }
        } else if let Some(message) = self
            .messages
            .position(entity)
            .and_then(|i| self.messages.get_mut(i))
            && role_of(message) != Some("activity")
        {
            message.insert("encryptedValue".into(), value.clone());
            return Applied::Folded;
        }
        Applied::Skipped("REASONING_ENCRYPTED_VALUE for an unknown entity")
    }
}
