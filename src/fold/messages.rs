//! The message list of a fold, with the lookups the reducer makes per streamed token.
//!
//! `@ag-ui/client` 1.0.0 finds messages with `messages.find(m => m.id === id)` (the first
//! match) and tool calls with `messages.find(m => m.toolCalls?.some(tc => tc.id === id))`.
//! Those are linear scans per `TEXT_MESSAGE_CONTENT` / `TOOL_CALL_ARGS`; here two indexes give
//! the same first match in O(1), are extended on append and rebuilt after any other change.

use crate::event::Fields;
use serde_json::{Map, Value};

/// Hashed with foldhash (seeded per process, hashbrown's default) rather than SipHash: every
/// content delta looks its message up, in each fold that follows the thread.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Messages in conversation order (AGUI.md §2 shapes, each a JSON object) and the first
/// position of every message id and tool-call id.
#[derive(Clone, Debug, Default)]
pub(super) struct Messages {
    list: Vec<Value>,
    /// First index of each string `id`.
    by_id: HashMap<String, usize>,
    /// First index of a message (any role) whose `toolCalls` holds a call with that `id`.
    by_tool_call: HashMap<String, usize>,
}

impl Messages {
    pub(super) fn as_slice(&self) -> &[Value] {
        &self.list
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// Index of the first message with this id.
    pub(super) fn position(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    /// Index of the first message holding a tool call with this id.
    pub(super) fn tool_call_owner(&self, tool_call_id: &str) -> Option<usize> {
        self.by_tool_call.get(tool_call_id).copied()
    }

    pub(super) fn get(&self, index: usize) -> Option<&Map<String, Value>> {
        self.list.get(index).and_then(Value::as_object)
    }

    /// Mutable access to one message. Changing its `id` or the ids of its tool calls needs
    /// [`Messages::reindex`] afterwards; adding a tool call needs [`Messages::note_tool_call`].
    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut Map<String, Value>> {
        self.list.get_mut(index).and_then(Value::as_object_mut)
    }

    /// Appends a message (`messages.push`).
    pub(super) fn push(&mut self, message: Value) {
        let index = self.list.len();
        index_message(&mut self.by_id, &mut self.by_tool_call, index, &message);
        self.list.push(message);
    }

    /// Inserts a message before `index` (`messages.splice(index, 0, message)`).
    pub(super) fn insert(&mut self, index: usize, message: Value) {
        let index = index.min(self.list.len());
        self.list.insert(index, message);
        self.reindex();
    }

    /// Replaces the message at `index` (its id or tool calls may differ).
    pub(super) fn replace(&mut self, index: usize, message: Value) {
        if let Some(slot) = self.list.get_mut(index) {
            *slot = message;
            self.reindex();
        }
    }

    /// Replaces the whole list.
    pub(super) fn set_all(&mut self, list: Vec<Value>) {
        self.list = list;
        self.reindex();
    }

    /// Takes the list out (for a rebuild), leaving it empty.
    pub(super) fn take_all(&mut self) -> Vec<Value> {
        self.by_id.clear();
        self.by_tool_call.clear();
        std::mem::take(&mut self.list)
    }

    /// Records that the message at `index` gained a tool call with this id.
    pub(super) fn note_tool_call(&mut self, index: usize, tool_call_id: &str) {
        self.by_tool_call
            .entry(tool_call_id.to_owned())
            .and_modify(|first| *first = (*first).min(index))
            .or_insert(index);
    }

    /// Rebuilds both indexes from the list.
    pub(super) fn reindex(&mut self) {
        self.by_id.clear();
        self.by_tool_call.clear();
        for (index, message) in self.list.iter().enumerate() {
            index_message(&mut self.by_id, &mut self.by_tool_call, index, message);
        }
    }
}

fn index_message(
    by_id: &mut HashMap<String, usize>,
    by_tool_call: &mut HashMap<String, usize>,
    index: usize,
    message: &Value,
) {
    if let Some(id) = message.field("id").and_then(Value::as_str) {
        by_id.entry(id.to_owned()).or_insert(index);
    }
    for id in tool_call_ids(message) {
        by_tool_call.entry(id.to_owned()).or_insert(index);
    }
}

/// The ids of a message's `toolCalls` (none when absent or not an array).
pub(super) fn tool_call_ids(message: &Value) -> impl Iterator<Item = &str> {
    message
        .field("toolCalls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tc| tc.field("id").and_then(Value::as_str))
}

/// The tool call with this id in a message's `toolCalls` (`toolCalls.find`).
pub(super) fn find_tool_call<'m>(
    message: &'m mut Map<String, Value>,
    tool_call_id: &str,
) -> Option<&'m mut Map<String, Value>> {
    message
        .get_mut("toolCalls")?
        .as_array_mut()?
        .iter_mut()
        .filter_map(Value::as_object_mut)
        .find(|tc| tc.field("id").and_then(Value::as_str) == Some(tool_call_id))
}

/// `applyEventMetadata(target, event)`: folds the event's `metadata` into the target's, per
/// key, last write wins, no recursion (`mergeMetadata` in `@ag-ui/core` 1.0.0; AGUI.md §1.2).
/// New keys go last, existing keys keep their place. Returns whether the event had metadata.
pub(super) fn merge_metadata(target: &mut Map<String, Value>, event: &Value) -> bool {
    let incoming = match event.field("metadata") {
        None => return false,
        Some(Value::Object(incoming)) => Some(incoming),
        // `{...null}` is `{}`: the target ends up with (at least) an empty metadata object.
        Some(Value::Null) => None,
        // Not an object: refused by schema validation; JavaScript would spread its indices.
        Some(_) => return false,
    };
    let slot = target
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    if let (Value::Object(existing), Some(incoming)) = (slot, incoming) {
        for (key, value) in incoming {
            existing.insert(key.clone(), value.clone());
        }
    }
    true
}
