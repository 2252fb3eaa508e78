//! Coalescing of a lagging subscriber's pending events (PROTOCOL §5 "Coalescing", AGUI.md §6
//! "Coalescing caveat" and §9.5). Pure functions over frames; the queue calls them when a
//! connection is behind (more than one frame pending at a write, or its queue is full).
//!
//! Merge rules, never across any other event:
//! - adjacent `TEXT_MESSAGE_CONTENT`, `TOOL_CALL_ARGS` or `REASONING_MESSAGE_CONTENT` of the
//!   same id and the same `subagentRunId` become one event whose `delta` is the byte-exact
//!   concatenation (no normalisation: AG-UI 1.0 conformance `multibyte-text-assembles`,
//!   `zwj-sequence-split-at-the-joiner`), whose `metadata` merges per key, last write wins,
//!   and whose other fields are the last event's;
//! - adjacent `STATE_DELTA`s become one `STATE_DELTA` with the operations concatenated when
//!   every patch of the run applied cleanly to the fold; otherwise the run becomes one
//!   `STATE_SNAPSHOT` of the folded state after the run (`[A], [B-fails]` ≠ `[A, B-fails]`:
//!   a merged patch is atomic, so a failing operation would undo A).
//!
//! A merged event carries the id of the last event merged.

use super::Frame;
use crate::event::{AsEvent, EventType, Fields};
use bytes::Bytes;
use serde_json::{Map, Value};
use std::sync::Arc;

/// What a frame may be merged with, decided once per event per node by the hub.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum MergeKey {
    /// Never merged.
    #[default]
    Never,
    /// A content or args delta: merges with adjacent frames of the same type and key.
    Delta {
        /// `TEXT_MESSAGE_CONTENT`, `TOOL_CALL_ARGS` or `REASONING_MESSAGE_CONTENT`.
        event_type: EventType,
        /// The message / tool call id and the `subagentRunId`, one string per pair
        /// ([`MergeKey::delta`]).
        key: Arc<str>,
    },
    /// A `STATE_DELTA`.
    StateDelta {
        /// The patch applied cleanly to the thread's fold.
        clean: bool,
        /// For a patch that failed: the folded state after it (unchanged by it).
        state_after: Option<Arc<Value>>,
    },
}

impl MergeKey {
    /// Derives the key of an event (a JSON object) of type `t`. `clean`/`state_after` describe
    /// how a `STATE_DELTA` applied to the fold.
    pub fn of(
        t: EventType,
        event: &Value,
        clean: bool,
        state_after: Option<Arc<Value>>,
    ) -> MergeKey {
        let id_field = match t {
            EventType::TextMessageContent | EventType::ReasoningMessageContent => "messageId",
            EventType::ToolCallArgs => "toolCallId",
            EventType::StateDelta => return MergeKey::StateDelta { clean, state_after },
            _ => return MergeKey::Never,
        };
        let id = event.field(id_field).and_then(Value::as_str).unwrap_or("");
        let tag = event.field("subagentRunId").and_then(Value::as_str);
        MergeKey::delta(t, id, tag)
    }

    /// [`Self::of`] an event, from its fields when it is a content delta read without a value.
    pub fn of_event<E: AsEvent + ?Sized>(
        t: EventType,
        event: &E,
        clean: bool,
        state_after: Option<Arc<Value>>,
    ) -> MergeKey {
        match event.content() {
            Some(content) => MergeKey::delta(content.event_type, content.id, content.tag),
            None => MergeKey::of(t, event.as_value(), clean, state_after),
        }
    }

    /// The key of a content delta of type `t` (`TEXT_MESSAGE_CONTENT`, `TOOL_CALL_ARGS`,
    /// `REASONING_MESSAGE_CONTENT`) for construct `id` with `subagentRunId` `tag`.
    ///
    /// The key spells the pair so that no two pairs share it: whether there is a tag, the id's
    /// length, the id, the tag (ids and tags may hold any character, `\0` included, and an
    /// absent tag is not an empty one: merging across either would misattribute text).
    pub fn delta(t: EventType, id: &str, tag: Option<&str>) -> MergeKey {
        let mut length = itoa::Buffer::new();
        let length = length.format(id.len());
        let tagged = tag.map_or("-", |_| "+");
        let tag = tag.unwrap_or("");
        let mut key = String::with_capacity(2 + length.len() + id.len() + tag.len());
        key.push_str(tagged);
        key.push_str(length);
        key.push(':');
        key.push_str(id);
        key.push_str(tag);
        MergeKey::Delta {
            event_type: t,
            key: Arc::from(key),
        }
    }

    fn mergeable_with(&self, other: &MergeKey) -> bool {
        match (self, other) {
            (
                MergeKey::Delta {
                    event_type: a,
                    key: ka,
                },
                MergeKey::Delta {
                    event_type: b,
                    key: kb,
                },
            ) => a == b && ka == kb,
            (MergeKey::StateDelta { .. }, MergeKey::StateDelta { .. }) => true,
            _ => false,
        }
    }
}

/// How many frames `events` (each event's type and value, in order) leave in a queue once
/// [`coalesce`] merged the adjacent mergeable ones, each `STATE_DELTA` taken as applying
/// cleanly: what a batch takes of an empty queue.
pub fn merged_count<'a, E: AsEvent + ?Sized + 'a>(
    events: impl IntoIterator<Item = (EventType, &'a E)>,
) -> usize {
    let mut count = 0;
    let mut prev: Option<MergeKey> = None;
    for (t, v) in events {
        let key = MergeKey::of_event(t, v, true, None);
        if !prev.as_ref().is_some_and(|p| p.mergeable_with(&key)) {
            count += 1;
        }
        prev = Some(key);
    }
    count
}

/// Applies a JSON Patch with the client's semantics (the fold's function), for rebuilding a
/// state snapshot; `None` when it fails (it never should for a patch that applied on the fold).
pub type PatchFn = fn(&Value, &[Value]) -> Option<Value>;

/// Merges every run of adjacent mergeable frames in place. Returns how many frames were
/// merged away, by type, for metrics.
pub fn coalesce(frames: &mut Vec<Frame>, apply: PatchFn) -> Vec<(EventType, u64)> {
    let mut merged_away: Vec<(EventType, u64)> = Vec::new();
    if frames.len() < 2 {
        return merged_away;
    }
    let mut out: Vec<Frame> = Vec::with_capacity(frames.len());
    let mut i = 0;
    while i < frames.len() {
        let mut j = i + 1;
        while j < frames.len() && frames[i].merge.mergeable_with(&frames[j].merge) {
            j += 1;
        }
        if j - i >= 2 {
            match merge_run(&frames[i..j], apply) {
                Some(f) => {
                    let t = frames[i].event_type;
                    match merged_away.iter_mut().find(|(mt, _)| *mt == t) {
                        Some((_, n)) => *n += (j - i - 1) as u64,
                        None => merged_away.push((t, (j - i - 1) as u64)),
                    }
                    out.push(f);
                }
                None => out.extend_from_slice(&frames[i..j]),
            }
        } else {
            out.push(frames[i].clone());
        }
        i = j;
    }
    *frames = out;
    merged_away
}

/// Merges one run (≥ 2 frames, all mergeable with each other). `None` if a frame's JSON does
/// not parse as expected (then the run is left as it was).
fn merge_run(run: &[Frame], apply: PatchFn) -> Option<Frame> {
    let last = run.last()?;
    let events: Vec<Map<String, Value>> = run
        .iter()
        .map(|f| match serde_json::from_slice::<Value>(f.json()?) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let mut merged = events.last()?.clone();
    let (json_type, merge) = match &last.merge {
        MergeKey::Delta { .. } => {
            let mut delta = String::new();
            for e in &events {
                delta.push_str(e.field("delta")?.as_str()?);
            }
            merged.insert("delta".into(), Value::String(delta));
            merge_metadata(&events, &mut merged);
            (last.event_type, last.merge.clone())
        }
        MergeKey::StateDelta { .. } => {
            let all_clean = run
                .iter()
                .all(|f| matches!(f.merge, MergeKey::StateDelta { clean: true, .. }));
            if all_clean {
                let mut ops = Vec::new();
                for e in &events {
                    ops.extend(e.field("delta")?.as_array()?.iter().cloned());
                }
                merged.insert("delta".into(), Value::Array(ops));
                merge_metadata(&events, &mut merged);
                (EventType::StateDelta, last.merge.clone())
            } else {
                // The folded state after the run: the state after its last failing patch,
                // then the clean patches that follow it, in order.
                let k = run
                    .iter()
                    .rposition(|f| matches!(f.merge, MergeKey::StateDelta { clean: false, .. }))?;
                let MergeKey::StateDelta {
                    state_after: Some(base),
                    ..
                } = &run[k].merge
                else {
                    return None;
                };
                let mut state: Value = (**base).clone();
                for e in &events[k + 1..] {
                    state = apply(&state, e.field("delta")?.as_array()?)?;
                }
                let mut snap = Map::new();
                snap.insert("type".into(), Value::String("STATE_SNAPSHOT".into()));
                snap.insert("snapshot".into(), state);
                merged = snap;
                (EventType::StateSnapshot, MergeKey::Never)
            }
        }
        MergeKey::Never => return None,
    };
    let json = Bytes::from(serde_json::to_vec(&Value::Object(merged)).ok()?);
    // The order state after the merged event is the last one's: a reset can still bridge
    // from a client whose last write was a merged frame.
    Some(Frame::new(last.id, json_type, &json, run[0].born, merge).with_view(last.view.clone()))
}

/// `metadata` of the merged event: per key, last write wins, no recursion (AGUI.md §1.2).
fn merge_metadata(events: &[Map<String, Value>], merged: &mut Map<String, Value>) {
    let mut meta: Option<Map<String, Value>> = None;
    for e in events {
        if let Some(Value::Object(m)) = e.field("metadata") {
            let acc = meta.get_or_insert_with(Map::new);
            for (k, v) in m {
                acc.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(m) = meta {
        merged.insert("metadata".into(), Value::Object(m));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Epoch, EventId, StreamPos};
    use serde_json::json;
    use std::time::Instant;

    /// Pairs that a plain join would confuse get keys of their own.
    #[test]
    fn delta_keys_tell_every_id_and_tag_apart() {
        let t = EventType::TextMessageContent;
        let pairs: [(&str, Option<&str>); 7] = [
            ("a", Some("b\0")),
            ("a\0b", None),
            ("a\0b", Some("")),
            ("a", None),
            ("a", Some("")),
            ("", Some("a")),
            ("1:a", None),
        ];
        for (i, x) in pairs.iter().enumerate() {
            for (j, y) in pairs.iter().enumerate() {
                let (kx, ky) = (MergeKey::delta(t, x.0, x.1), MergeKey::delta(t, y.0, y.1));
                assert_eq!(kx.mergeable_with(&ky), i == j, "{x:?} {y:?}");
            }
        }
    }

    fn apply(doc: &Value, ops: &[Value]) -> Option<Value> {
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.to_vec())).ok()?;
        let mut d = doc.clone();
        json_patch::patch(&mut d, &patch).ok()?;
        Some(d)
    }

    fn frame(seq: u64, ev: Value, clean: bool, state_after: Option<Value>) -> Frame {
        let t = EventType::parse(ev.at("type").as_str().unwrap()).unwrap();
        let id = EventId {
            epoch: Epoch(7),
            pos: StreamPos::new(0, seq),
        };
        let merge = MergeKey::of(t, &ev, clean, state_after.map(Arc::new));
        Frame::new(
            id,
            t,
            &serde_json::to_vec(&ev).unwrap(),
            Instant::now(),
            merge,
        )
    }

    fn events(frames: &[Frame]) -> Vec<(u64, Value)> {
        frames
            .iter()
            .map(|f| {
                (
                    f.id.pos.seq,
                    serde_json::from_slice(f.json().unwrap()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn text_deltas_of_one_message_concatenate_byte_exactly() {
        let mut fs = vec![
            frame(
                1,
                json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"e\u{301}","metadata":{"a":1,"b":1}}),
                true,
                None,
            ),
            frame(
                2,
                json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"👩\u{200d}","metadata":{"b":2}}),
                true,
                None,
            ),
            frame(
                3,
                json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"💻"}),
                true,
                None,
            ),
            frame(
                4,
                json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"n","delta":"x"}),
                true,
                None,
            ),
        ];
        let merged = coalesce(&mut fs, apply);
        assert_eq!(merged, vec![(EventType::TextMessageContent, 2)]);
        assert_eq!(
            events(&fs),
            vec![
                (
                    3,
                    json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"e\u{301}👩\u{200d}💻","metadata":{"a":1,"b":2}})
                ),
                (
                    4,
                    json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"n","delta":"x"})
                ),
            ]
        );
    }

    #[test]
    fn never_across_other_events_types_or_subagents() {
        let mut fs = vec![
            frame(
                1,
                json!({"type":"TOOL_CALL_ARGS","toolCallId":"c","delta":"{"}),
                true,
                None,
            ),
            frame(2, json!({"type":"RAW","event":1}), true, None),
            frame(
                3,
                json!({"type":"TOOL_CALL_ARGS","toolCallId":"c","delta":"}"}),
                true,
                None,
            ),
            frame(
                4,
                json!({"type":"TOOL_CALL_ARGS","toolCallId":"c","delta":"x","subagentRunId":"s"}),
                true,
                None,
            ),
            frame(
                5,
                json!({"type":"REASONING_MESSAGE_CONTENT","messageId":"c","delta":"r"}),
                true,
                None,
            ),
        ];
        let before = events(&fs);
        assert!(coalesce(&mut fs, apply).is_empty());
        assert_eq!(events(&fs), before);
    }

    #[test]
    fn clean_state_deltas_merge_into_one_patch() {
        let mut fs = vec![
            frame(
                1,
                json!({"type":"STATE_DELTA","delta":[{"op":"add","path":"/a","value":1}]}),
                true,
                None,
            ),
            frame(2, json!({"type":"STATE_DELTA","delta":[]}), true, None),
            frame(
                3,
                json!({"type":"STATE_DELTA","delta":[{"op":"replace","path":"/a","value":2}]}),
                true,
                None,
            ),
        ];
        coalesce(&mut fs, apply);
        assert_eq!(
            events(&fs),
            vec![(
                3,
                json!({"type":"STATE_DELTA","delta":[{"op":"add","path":"/a","value":1},{"op":"replace","path":"/a","value":2}]})
            )]
        );
    }

    #[test]
    fn a_failing_delta_turns_the_run_into_a_snapshot_of_the_fold() {
        // Fold: {} → A ok {"a":1} → B fails (state stays {"a":1}) → C ok {"a":1,"c":3}.
        let mut fs = vec![
            frame(
                1,
                json!({"type":"STATE_DELTA","delta":[{"op":"add","path":"/a","value":1}]}),
                true,
                None,
            ),
            frame(
                2,
                json!({"type":"STATE_DELTA","delta":[{"op":"remove","path":"/zz"}]}),
                false,
                Some(json!({"a":1})),
            ),
            frame(
                3,
                json!({"type":"STATE_DELTA","delta":[{"op":"add","path":"/c","value":3}]}),
                true,
                None,
            ),
            frame(
                4,
                json!({"type":"STATE_SNAPSHOT","snapshot":{}}),
                true,
                None,
            ),
        ];
        assert_eq!(coalesce(&mut fs, apply), vec![(EventType::StateDelta, 2)]);
        assert_eq!(
            events(&fs),
            vec![
                (3, json!({"type":"STATE_SNAPSHOT","snapshot":{"a":1,"c":3}})),
                (4, json!({"type":"STATE_SNAPSHOT","snapshot":{}})),
            ]
        );
    }
}
