//! The message list of a fold, with the lookups the reducer makes per streamed token.
//!
//! `@ag-ui/client` 1.0.0 finds messages with `messages.find(m => m.id === id)` (the first
//! match) and tool calls with `messages.find(m => m.toolCalls?.some(tc => tc.id === id))`.
//! Those are linear scans per `TEXT_MESSAGE_CONTENT` / `TOOL_CALL_ARGS`; here two indexes give
//! the same first match in O(1), are extended on append, moved past an insert (a tool result
//! placed after its call) and rebuilt after any other change (a snapshot, a replaced
//! activity), so that no per-event fold costs O(messages in the thread).

use super::str_field;
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
    /// First index of an assistant message whose `toolCalls` holds a call with that `id`.
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

    /// Index of the first assistant message holding a tool call with this id (the client's
    /// `messages.find(m => m.toolCalls?.some(tc => tc.id === id))`, where only assistant
    /// messages hold calls: see [`held_tool_call_ids`]).
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

    /// Inserts a message before `index` (`messages.splice(index, 0, message)`). At the end it
    /// is a push; before the end only the messages from `index` on move, and the index entries
    /// pointing at them (a tool result lands right after its call, near the end of a thread's
    /// list however long: O(messages after it), not a rebuild of both indexes).
    pub(super) fn insert(&mut self, index: usize, message: Value) {
        if index >= self.list.len() {
            self.push(message);
            return;
        }
        // An entry at or past `index` is the first position of an id held by the message
        // there. From the end backwards, so that an entry moved from `p` to `p + 1` is not met
        // again at `p + 1`.
        for (at, moved) in self.list.iter().enumerate().skip(index).rev() {
            each_key(
                &mut self.by_id,
                &mut self.by_tool_call,
                moved,
                |index_of, id| step_past(index_of, id, at),
            );
        }
        // The new message may now be the first holder of its ids.
        index_message(&mut self.by_id, &mut self.by_tool_call, index, &message);
        self.list.insert(index, message);
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
        lower_first(&mut self.by_tool_call, tool_call_id, index);
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

/// Moves the first position of `id` from `at` to `at + 1` (when `at` is where it is).
fn step_past(index_of: &mut HashMap<String, usize>, id: &str, at: usize) {
    if let Some(first) = index_of.get_mut(id)
        && *first == at
    {
        *first = at + 1;
    }
}

/// Records `index` as the first position of `id` unless an earlier one is recorded.
fn lower_first(index_of: &mut HashMap<String, usize>, id: &str, index: usize) {
    match index_of.get_mut(id) {
        Some(first) => *first = (*first).min(index),
        None => {
            index_of.insert(id.to_owned(), index);
        }
    }
}

/// Records the message at `index` as the first holder of its ids, unless an earlier one is.
fn index_message(
    by_id: &mut HashMap<String, usize>,
    by_tool_call: &mut HashMap<String, usize>,
    index: usize,
    message: &Value,
) {
    each_key(by_id, by_tool_call, message, |index_of, id| {
        lower_first(index_of, id, index)
    });
}

/// Calls `f` with each index entry's key the message has: its `id` in `by_id`, each call it
/// holds ([`held_tool_call_ids`]) in `by_tool_call`.
fn each_key(
    by_id: &mut HashMap<String, usize>,
    by_tool_call: &mut HashMap<String, usize>,
    message: &Value,
    mut f: impl FnMut(&mut HashMap<String, usize>, &str),
) {
    if let Some(id) = str_field(message, "id") {
        f(by_id, id);
    }
    for id in held_tool_call_ids(message) {
        f(by_tool_call, id);
    }
}

/// The tool calls the client sees on a message: an assistant's `toolCalls` ids, none on other
/// roles. The client's reducer adds calls to assistant messages only, and its enforcement
/// strips `toolCalls` from the other roles of a `MESSAGES_SNAPSHOT` or `RUN_STARTED.input`
/// (the fold keeps that member, PROTOCOL §2, but no event finds a call through it).
fn held_tool_call_ids(message: &Value) -> impl Iterator<Item = &str> {
    let assistant = str_field(message, "role") == Some("assistant");
    tool_call_ids(message).filter(move |_| assistant)
}

/// The ids of a message's `toolCalls` (none when absent or not an array).
fn tool_call_ids(message: &Value) -> impl Iterator<Item = &str> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The client's linear scan, which the index must answer exactly.
    fn scanned_owner(list: &[Value], tool_call_id: &str) -> Option<usize> {
        list.iter().position(|m| {
            str_field(m, "role") == Some("assistant")
                && tool_call_ids(m).any(|id| id == tool_call_id)
        })
    }

    /// The indexes are those a rebuild makes, and the owner of each call `c0`..`c{calls}` is
    /// the client's scan's.
    fn agrees_with_a_rebuild(messages: &Messages, calls: usize, when: &str) {
        let mut fresh = messages.clone();
        fresh.reindex();
        assert_eq!(messages.by_id, fresh.by_id, "ids {when}");
        assert_eq!(messages.by_tool_call, fresh.by_tool_call, "calls {when}");
        for tc in (0..calls).map(|n| format!("c{n}")) {
            assert_eq!(
                messages.tool_call_owner(&tc),
                scanned_owner(messages.as_slice(), &tc),
                "owner of {tc} {when}"
            );
        }
    }

    /// Inserting anywhere (duplicate ids, tool calls on other roles than assistant) leaves
    /// the indexes a rebuild would make, and the owner lookup agrees with the client's scan.
    #[test]
    fn insert_keeps_the_indexes_a_rebuild_makes() {
        let mut messages = Messages::default();
        messages.push(json!({"id": "u1", "role": "user", "content": "hi",
            "toolCalls": [{"id": "c1"}]}));
        messages.push(
            json!({"id": "a1", "role": "assistant", "toolCalls": [{"id": "c1"}, {"id": "c2"}]}),
        );
        messages.push(json!({"id": "t1", "role": "tool", "toolCallId": "c1"}));
        messages.push(json!({"id": "a2", "role": "assistant", "content": "done"}));
        let inserts = [
            (3, json!({"id": "t2", "role": "tool", "toolCallId": "c2"})),
            (
                0,
                json!({"id": "a2", "role": "assistant", "toolCalls": [{"id": "c2"}]}),
            ),
            (2, json!({"id": "a1", "role": "user"})),
            (
                99,
                json!({"id": "u1", "role": "assistant", "toolCalls": [{"id": "c3"}]}),
            ),
            (5, json!({"role": "tool"})),
            (
                1,
                json!({"id": "x", "role": "assistant", "toolCalls": [{"id": "c1"}]}),
            ),
        ];
        for (at, message) in inserts {
            messages.insert(at, message);
            agrees_with_a_rebuild(&messages, 5, &format!("after inserting at {at}"));
        }
        assert_eq!(messages.len(), 10);
    }

    /// Many inserts at pseudo-random places, ids drawn from small pools so that duplicates
    /// (of message ids and of tool call ids, on several messages) are the rule.
    #[test]
    fn inserts_with_duplicate_ids_match_a_rebuild() {
        let mut messages = Messages::default();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for step in 0..300 {
            let role = ["assistant", "tool", "user"][next(3) as usize];
            let calls: Vec<Value> = (0..next(3))
                .map(|_| json!({"id": format!("c{}", next(6))}))
                .collect();
            let message = json!({"id": format!("m{}", next(8)), "role": role, "toolCalls": calls});
            let at = next(messages.len() as u64 + 2) as usize;
            messages.insert(at, message);
            agrees_with_a_rebuild(&messages, 7, &format!("at step {step}"));
        }
    }
}
