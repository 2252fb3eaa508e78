//! The reducer's whole-message events: `MESSAGES_SNAPSHOT` (reconciled by id) and
//! `ACTIVITY_SNAPSHOT` / `ACTIVITY_DELTA`.

use super::messages::merge_metadata;
use super::{
    AmbiguousPath, Applied, DeltaRefusal, Fold, copy_subagent_run_id, patch, patch_ops, role_of,
    snapshot_message, str_field,
};
use crate::event::Fields;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

impl Fold {
    // ---- snapshots and activities -------------------------------------------------------

    /// `MESSAGES_SNAPSHOT`, reconciled by id (AGUI.md §6; `events/state` in the spec):
    /// 1. each local message whose id the snapshot carries is replaced, in place, by the
    ///    snapshot's (last) message with that id;
    /// 2. local messages the snapshot lacks are dropped, except client-only ones: `reasoning`
    ///    messages unless the snapshot carries any reasoning message, and `activity` messages
    ///    unless the snapshot carries any activity message — or, when the event's
    ///    `metadata["@ag-ui/client"].authoritativeActivityTypes` declares them, unless their
    ///    `activityType` is declared (`null` declares every type);
    /// 3. snapshot messages with ids not already present are appended in snapshot order.
    ///
    /// A `subagentRunId: null` in a snapshot message reads as absent.
    pub(super) fn messages_snapshot(&mut self, event: &Value) -> Applied {
        let Some(snapshot) = event.field("messages").and_then(Value::as_array) else {
            return Applied::Skipped("MESSAGES_SNAPSHOT without messages");
        };
        let mut by_id: HashMap<&str, usize> = HashMap::with_capacity(snapshot.len());
        for (i, m) in snapshot.iter().enumerate() {
            if let Some(id) = m.field("id").and_then(Value::as_str) {
                by_id.insert(id, i);
            }
        }
        let has_role = |role: &str| {
            snapshot
                .iter()
                .any(|m| m.field("role").and_then(Value::as_str) == Some(role))
        };
        let (has_activity, has_reasoning) = (has_role("activity"), has_role("reasoning"));
        let owned = authoritative_activity_types(event);
        let preserved = |m: &Value| match m.field("role").and_then(Value::as_str) {
            Some("activity") => match &owned {
                ActivityAuthority::Types(types) => {
                    let activity_type = m.field("activityType").and_then(Value::as_str);
                    !activity_type.is_some_and(|t| types.contains(&t))
                }
                ActivityAuthority::All => false,
                ActivityAuthority::Inferred => !has_activity,
            },
            Some("reasoning") => !has_reasoning,
            _ => false,
        };

        let local = self.messages.take_all();
        let mut out = Vec::with_capacity(local.len().max(snapshot.len()));
        for m in local {
            let from_snapshot = m
                .field("id")
                .and_then(Value::as_str)
                .and_then(|id| by_id.get(id).copied());
            match from_snapshot {
                Some(i) => out.push(snapshot_message(&snapshot[i])),
                None if preserved(&m) => out.push(m),
                None => {}
            }
        }
        let present: HashSet<String> = out
            .iter()
            .filter_map(|m| m.field("id").and_then(Value::as_str).map(str::to_owned))
            .collect();
        for m in snapshot {
            let known = m
                .field("id")
                .and_then(Value::as_str)
                .is_some_and(|id| present.contains(id));
            if !known {
                out.push(snapshot_message(m));
            }
        }
        self.messages.set_all(out);
        Applied::Folded
    }

    /// `ACTIVITY_SNAPSHOT`: appends `{id, role: "activity", activityType, content,
    /// subagentRunId?}` when the id is new. For an existing activity message with `replace`
    /// (absent ⇒ true) its `activityType`, `content` and `subagentRunId` are replaced in place
    /// (other members kept); with `replace: false` only metadata merges. A non-activity
    /// message under the id is replaced by the activity when `replace`, else left alone.
    pub(super) fn activity_snapshot(&mut self, event: &Value) -> Applied {
        let Some(id) = str_field(event, "messageId") else {
            return Applied::Skipped("ACTIVITY_SNAPSHOT without messageId");
        };
        let replace = !matches!(event.field("replace"), Some(Value::Bool(false)));
        let fresh = || {
            let mut m = Map::new();
            m.insert("id".into(), id.into());
            m.insert("role".into(), "activity".into());
            if let Some(t) = event.field("activityType") {
                m.insert("activityType".into(), t.clone());
            }
            if let Some(c) = event.field("content") {
                m.insert("content".into(), c.clone());
            }
            copy_subagent_run_id(&mut m, event);
            merge_metadata(&mut m, event);
            Value::Object(m)
        };
        let Some(index) = self.messages.position(id) else {
            self.messages.push(fresh());
            return Applied::Folded;
        };
        let is_activity = self.messages.get(index).and_then(role_of) == Some("activity");
        if !is_activity {
            if replace {
                self.messages.replace(index, fresh());
            }
            return Applied::Folded;
        }
        let Some(message) = self.messages.get_mut(index) else {
            return Applied::Skipped("message is not an object");
        };
        if replace {
            if let Some(t) = event.field("activityType") {
                message.insert("activityType".into(), t.clone());
            }
            if let Some(c) = event.field("content") {
                message.insert("content".into(), c.clone());
            }
            match event.field("subagentRunId") {
                Some(s) if !s.is_null() => {
                    message.insert("subagentRunId".into(), s.clone());
                }
                _ => {
                    message.shift_remove("subagentRunId");
                }
            }
        }
        merge_metadata(message, event);
        Applied::Folded
    }

    /// [`Self::activity_delta`] as a publish checks it: an operation whose `path` or `from`
    /// JSON Patch clients disagree on (PROTOCOL §2 "Portable patch paths"; checked against
    /// the activity's content as the operations before it leave it) refuses the event, and
    /// nothing changes. A patch that does not apply is not refused (every client leaves the
    /// content as it was).
    ///
    /// # Errors
    /// The first ambiguous operation.
    pub(crate) fn activity_delta_portable(
        &mut self,
        event: &Value,
    ) -> Result<Applied, AmbiguousPath> {
        let content = str_field(event, "messageId")
            .and_then(|id| self.messages.position(id))
            .and_then(|index| self.messages.get(index))
            .filter(|message| role_of(message) == Some("activity"))
            .map(|message| match message.field("content") {
                Some(c) if !c.is_null() => c.clone(),
                _ => Value::Object(Map::new()),
            });
        let empty = Value::Array(Vec::new());
        if let Some(mut content) = content
            && let Ok(ops) = patch_ops(Some(event.field("patch").unwrap_or(&empty)))
            && let Err(DeltaRefusal::Ambiguous(ambiguous)) =
                patch::apply_atomic_portable(&mut content, ops)
        {
            return Err(ambiguous);
        }
        Ok(self.activity_delta(event))
    }

    /// `ACTIVITY_DELTA`: metadata merges first; then `patch` applies to the activity's
    /// `content` (`{}` when absent) with the same atomic semantics as `STATE_DELTA`, and on
    /// success `activityType` is updated too. A delta for an unknown id is silently ignored;
    /// one aimed at a non-activity message is skipped.
    pub(super) fn activity_delta(&mut self, event: &Value) -> Applied {
        let Some(index) = str_field(event, "messageId").and_then(|id| self.messages.position(id))
        else {
            return Applied::Skipped("ACTIVITY_DELTA for an unknown activity");
        };
        let Some(message) = self.messages.get_mut(index) else {
            return Applied::Skipped("message is not an object");
        };
        if role_of(message) != Some("activity") {
            return Applied::Skipped("ACTIVITY_DELTA aimed at a non-activity message");
        }
        merge_metadata(message, event);
        let empty = Value::Array(Vec::new());
        let ops = patch_ops(Some(event.field("patch").unwrap_or(&empty)));
        // Patch the content where it lies: `apply_atomic` leaves it untouched on failure.
        let had_content = matches!(message.field("content"), Some(c) if !c.is_null());
        let mut content = match message.get_mut("content") {
            Some(c) if !c.is_null() => std::mem::take(c),
            _ => Value::Object(Map::new()),
        };
        let result = ops.and_then(|ops| patch::apply_atomic(&mut content, ops));
        if result.is_ok() || had_content {
            message.insert("content".into(), content);
        }
        if result.is_ok()
            && let Some(t) = event.field("activityType")
        {
            message.insert("activityType".into(), t.clone());
        }
        Applied::ActivityDelta(result)
    }
}

/// Who owns activity messages in a `MESSAGES_SNAPSHOT` (`authoritativeActivityTypes` in
/// `@ag-ui/client` 1.0.0 `activity-history.ts`).
enum ActivityAuthority<'e> {
    /// No declaration: the snapshot owns activities iff it carries one.
    Inferred,
    /// `null`: the snapshot owns every activity type.
    All,
    /// These types (an invalid declaration owns none).
    Types(Vec<&'e str>),
}

fn authoritative_activity_types(event: &Value) -> ActivityAuthority<'_> {
    let Some(value) = event.field("metadata").and_then(|m| m.get("@ag-ui/client")) else {
        return ActivityAuthority::Inferred;
    };
    let Some(value) = value.as_object() else {
        return ActivityAuthority::Types(Vec::new());
    };
    match value.field("authoritativeActivityTypes") {
        None => ActivityAuthority::Inferred,
        Some(Value::Null) => ActivityAuthority::All,
        Some(Value::Array(types)) => {
            let names: Option<Vec<&str>> = types.iter().map(Value::as_str).collect();
            ActivityAuthority::Types(names.unwrap_or_default())
        }
        Some(_) => ActivityAuthority::Types(Vec::new()),
    }
}
