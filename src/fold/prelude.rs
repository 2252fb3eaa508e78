//! Preludes and bridges (PROTOCOL §5): events the broker synthesises so that a client with
//! nothing (prelude) or with a known, older view (bridge, for a live reset) reaches the
//! thread's fold at a given event id, in a stream `@ag-ui/client` 1.0 `verifyEvents` accepts
//! and that folds to the same state and messages (AGUI.md §6 "Prelude recipes").
//!
//! Pure functions: the hub calls them under the thread's lock with its [`ThreadFold`] and
//! encodes the result; only the last event of a prelude carries an `id:` (a bridge also marks its
//! first event, see `queue::Frame::bridge`).
//!
//! Recipe (fresh connection):
//! 1. the current run's original `RUN_STARTED` (`input` included), with
//!    `metadata: {"agui-fanout": {"prelude": true}}` added to the producer's metadata;
//! 2. `MESSAGES_SNAPSHOT` of every message (partial text and tool arguments included);
//! 3. `STATE_SNAPSHOT` of the folded state, `{}` when nothing ever set it (a bridge restates
//!    the state only when a snapshot or delta set it);
//! 4. one re-opening event per construct still open, in opening order (the original START,
//!    or for an item being assembled from chunks a content-less chunk that re-opens its lane);
//! 5. if the run has ended, its original `RUN_FINISHED` and/or `RUN_ERROR`.
//!
//! Content already in the snapshot is never streamed again (re-streaming would duplicate
//! text: the client's reducer appends to a message it already holds).
//!
//! A bridge is returned as [`Part`]s: its snapshots (steps 2 and 3) are a function of the
//! fold alone, so the hub encodes them once per position and every connection bridged there
//! shares them; at that point of every bridge the client's verifier has a run active, which
//! is where the hub puts the reset's gap event.

use super::ThreadFold;
use crate::event::Fields;
use crate::event::order::{OpenConstructs, OpenItem, OpenKind, OrderChecker, RunLifecycle};
use serde_json::{Map, Value, json};
use std::collections::HashSet;
use std::sync::Arc;

/// The metadata key that marks a prelude's `RUN_STARTED`.
pub const PRELUDE_METADATA_KEY: &str = "agui-fanout";

/// One piece of a bridge.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// An event of this bridge's own (it depends on the client's view).
    Event(Value),
    /// The fold's snapshots, [`bridge_snapshots`]: the same for every bridge to this fold.
    /// A run is active there for the client's verifier (a `MESSAGES_SNAPSHOT` may come only
    /// inside a run), so an event such as a `CUSTOM` may go right before it.
    Snapshots,
}

/// The prelude that brings a client with nothing to `truth` (empty for a thread that never
/// had a run).
pub fn prelude(truth: &ThreadFold) -> Vec<Value> {
    let mut out = Vec::new();
    let open = truth.checker().open();
    match open.run() {
        RunLifecycle::NotStarted => return out,
        RunLifecycle::Errored {
            run_started: None,
            run_error,
            ..
        } => {
            // A log that opened with RUN_ERROR: nothing can follow it but a RUN_STARTED.
            out.push((**run_error).clone());
            return out;
        }
        _ => {}
    }
    let mut parts = Vec::new();
    restate_current_run(truth, &HashSet::new(), true, &mut parts);
    expand(parts, &prelude_snapshots(truth), &mut out);
    out
}

/// The snapshots of a prelude: `MESSAGES_SNAPSHOT` (after a clearing one when there are
/// messages) and `STATE_SNAPSHOT`, `{}` included (PROTOCOL §5 "Prelude" 2, 3).
fn prelude_snapshots(truth: &ThreadFold) -> Vec<Value> {
    let mut out = messages_snapshots(truth);
    // A prelude always restates the state, `{}` included: its client may hold state this
    // log never had (from an epoch Redis lost, or a tail a failover rolled back), which
    // only a snapshot replaces. A bridge's client got its state from this log.
    out.push(json!({"type": "STATE_SNAPSHOT", "snapshot": truth.fold().state()}));
    out
}

/// The snapshots every bridge to `truth` carries ([`Part::Snapshots`]): `MESSAGES_SNAPSHOT`
/// (after a clearing one when there are messages), and `STATE_SNAPSHOT` when a snapshot or
/// delta ever set the state.
pub fn bridge_snapshots(truth: &ThreadFold) -> Vec<Value> {
    let mut out = messages_snapshots(truth);
    if let Some(s) = state_snapshot(truth) {
        out.push(s);
    }
    out
}

/// `parts` as events, with `snapshots` for [`Part::Snapshots`].
fn expand(parts: Vec<Part>, snapshots: &[Value], out: &mut Vec<Value>) {
    for p in parts {
        match p {
            Part::Event(e) => out.push(e),
            Part::Snapshots => out.extend_from_slice(snapshots),
        }
    }
}

/// [`bridge_parts`] as events, its snapshots expanded.
pub fn bridge(client: &OrderChecker, truth: &ThreadFold) -> Vec<Value> {
    let mut out = Vec::new();
    expand(
        bridge_parts(client, truth),
        &bridge_snapshots(truth),
        &mut out,
    );
    out
}

/// The bridge for a live reset: from what a client was already sent (`client`, the order
/// state after the last event written to it) to `truth` (PROTOCOL §5 "Reset"):
/// close what the client has open that is closed in truth, finish the client's run with its
/// real terminal event if it ended, start the current run if it is another one, restate the
/// messages and state ([`Part::Snapshots`]), re-open what is open in truth but not for the
/// client. Empty when `truth` has no run.
pub fn bridge_parts(client: &OrderChecker, truth: &ThreadFold) -> Vec<Part> {
    let c_open = client.open();
    let t_open = truth.checker().open();
    let mut out = Vec::new();
    let c_run = run_started(c_open.run());
    let t_run = run_started(t_open.run());
    if c_run.is_none() {
        return prelude_unmarked(truth);
    }
    let same_run = c_run == t_run;
    let client_running = matches!(c_open.run(), RunLifecycle::Running { .. });

    if same_run && client_running {
        // Close what is open for the client but no longer open in truth.
        let t_keys = keys(t_open);
        close_lanes(client, truth, &mut out);
        close_items(client, |k| !t_keys.contains(k), &mut out);
        if !matches!(t_open.run(), RunLifecycle::Running { .. }) {
            // The run ended in truth: restate, close everything, finish it.
            out.push(Part::Snapshots);
            close_items(client, |k| t_keys.contains(k), &mut out);
            push_terminals(t_open.run(), &mut out);
            return out;
        }
        out.push(Part::Snapshots);
        // The client's chunk-lane items were closed above (and a MESSAGES_SNAPSHOT closes
        // every lane anyway): re-open them like anything the client does not have open.
        let lanes = lane_keys(client);
        let c_keys: HashSet<Key> = keys(c_open).difference(&lanes).cloned().collect();
        reopen(truth, &c_keys, &mut out);
        return out;
    }

    if client_running {
        // The client's run ended in truth (a later run started): close all it has open and
        // finish it with its real terminal event.
        close_lanes(client, truth, &mut out);
        close_items(client, |_| true, &mut out);
        let run_id = c_run
            .and_then(|r| r.field("runId"))
            .and_then(Value::as_str)
            .unwrap_or("");
        match truth.ended_run(run_id) {
            Some(terminal) => out.push(Part::Event((**terminal).clone())),
            None => {
                // Too old to be remembered: a terminal event carrying the run's own ids.
                let thread_id = c_run
                    .and_then(|r| r.field("threadId"))
                    .cloned()
                    .unwrap_or(Value::Null);
                out.push(Part::Event(
                    json!({"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id}),
                ));
            }
        }
    }
    // The client's run is closed now: start the current run afresh and restate everything.
    restate_current_run(truth, &HashSet::new(), false, &mut out);
    out
}

/// A prelude whose `RUN_STARTED` is not marked (a bridge inside a connection).
fn prelude_unmarked(truth: &ThreadFold) -> Vec<Part> {
    let mut out = Vec::new();
    if matches!(truth.checker().open().run(), RunLifecycle::NotStarted) {
        return out;
    }
    restate_current_run(truth, &HashSet::new(), false, &mut out);
    out
}

/// `RUN_STARTED`, snapshots, re-opens, terminals of the current run; `mark`: a prelude's.
fn restate_current_run(truth: &ThreadFold, skip: &HashSet<Key>, mark: bool, out: &mut Vec<Part>) {
    let open = truth.checker().open();
    let Some(started) = run_started(open.run()) else {
        // Errored without a RUN_STARTED: only its RUN_ERROR can be restated.
        push_terminals(open.run(), out);
        return;
    };
    let mut rs = (**started).clone();
    if mark {
        mark_prelude(&mut rs);
    } else {
        // A fold rebuilt from a checkpoint (itself a prelude, PROTOCOL §6) holds the marked
        // RUN_STARTED: a bridge must not pass that mark on, or the client would take it for
        // the start of a new connection.
        unmark_prelude(&mut rs);
    }
    out.push(Part::Event(rs));
    out.push(Part::Snapshots);
    if matches!(open.run(), RunLifecycle::Running { .. }) {
        reopen(truth, skip, out);
    } else {
        push_terminals(open.run(), out);
    }
}

fn run_started(run: &RunLifecycle) -> Option<&Arc<Value>> {
    match run {
        RunLifecycle::NotStarted => None,
        RunLifecycle::Running { run_started } | RunLifecycle::Finished { run_started, .. } => {
            Some(run_started)
        }
        RunLifecycle::Errored { run_started, .. } => run_started.as_ref(),
    }
}

fn push_terminals(run: &RunLifecycle, out: &mut Vec<Part>) {
    match run {
        RunLifecycle::Finished { run_finished, .. } => {
            out.push(Part::Event((**run_finished).clone()));
        }
        RunLifecycle::Errored {
            run_finished,
            run_error,
            ..
        } => {
            if let Some(f) = run_finished {
                out.push(Part::Event((**f).clone()));
            }
            out.push(Part::Event((**run_error).clone()));
        }
        RunLifecycle::NotStarted | RunLifecycle::Running { .. } => {}
    }
}

/// Removes what [`mark_prelude`] added: the `agui-fanout` key of the event's metadata, and the
/// metadata itself when nothing else is left in it.
pub fn unmark_prelude(run_started: &mut Value) {
    if let Value::Object(map) = run_started {
        let now_empty = match map.get_mut("metadata") {
            Some(Value::Object(meta)) => {
                meta.shift_remove(PRELUDE_METADATA_KEY);
                meta.is_empty()
            }
            _ => false,
        };
        if now_empty {
            map.shift_remove("metadata");
        }
    }
}

/// Adds `{"agui-fanout": {"prelude": true}}` to the event's metadata (PROTOCOL §5).
pub fn mark_prelude(run_started: &mut Value) {
    if let Value::Object(map) = run_started {
        let meta = map
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(meta) = meta {
            meta.insert(PRELUDE_METADATA_KEY.into(), json!({"prelude": true}));
        }
    }
}

/// Whether an event is a prelude's marked `RUN_STARTED`.
pub fn is_prelude_start(event: &Value) -> bool {
    event.field("type").and_then(Value::as_str) == Some("RUN_STARTED")
        && event
            .pointer(&format!("/metadata/{PRELUDE_METADATA_KEY}/prelude"))
            .and_then(Value::as_bool)
            == Some(true)
}

/// The `MESSAGES_SNAPSHOT`s restating every message, in order.
///
/// The client reconciles a snapshot by id: it replaces a message it holds in place and
/// appends new ones at the end (AGUI.md §6). A client that already holds some messages (a
/// reconnect, or a live reset) would then get new messages that belong before old ones (a
/// tool result goes right after its call) at the end, and two messages sharing an id (a real
/// producer names a tool call's message and its result after the call) folded into one. So a
/// first snapshot clears the client's list: it carries no message the client keeps, except
/// one placeholder per role the client only drops when a snapshot carries that role
/// (`reasoning`, `activity`), and only for roles the full snapshot carries, which then drops
/// the placeholders again.
fn messages_snapshots(truth: &ThreadFold) -> Vec<Value> {
    let mut out = Vec::new();
    let messages = truth.fold().messages();
    if !messages.is_empty() {
        let has = |role: &str| {
            messages
                .iter()
                .any(|m| m.field("role").and_then(Value::as_str) == Some(role))
        };
        let mut clear = Vec::new();
        if has("reasoning") {
            clear.push(
                json!({"id": "agui-fanout:clear:reasoning", "role": "reasoning", "content": ""}),
            );
        }
        if has("activity") {
            clear.push(json!({"id": "agui-fanout:clear:activity", "role": "activity", "activityType": "agui-fanout.clear", "content": {}}));
        }
        out.push(json!({"type": "MESSAGES_SNAPSHOT", "messages": clear}));
    }
    out.push(json!({"type": "MESSAGES_SNAPSHOT", "messages": messages}));
    out
}

fn state_snapshot(truth: &ThreadFold) -> Option<Value> {
    truth
        .fold()
        .state_known()
        .then(|| json!({"type": "STATE_SNAPSHOT", "snapshot": truth.fold().state()}))
}

/// Identity of an open construct across two order states.
type Key = (OpenKind, String, Option<String>);

fn key(kind: OpenKind, item: &OpenItem) -> Key {
    (
        kind,
        item.id().to_owned(),
        item.subagent_run_id().map(str::to_owned),
    )
}

fn keys(open: &OpenConstructs) -> HashSet<Key> {
    open.in_opening_order()
        .into_iter()
        .map(|(k, i)| key(k, i))
        .collect()
}

/// Closes the client's open chunk lanes with a lane-closing `STATE_SNAPSHOT` of the true state
/// per lane owner (`transformChunks` then ends the lane's item itself; an explicit END would
/// reach a message the lane already closed). The snapshot is the truth, which the bridge
/// restates anyway.
fn close_lanes(client: &OrderChecker, truth: &ThreadFold, out: &mut Vec<Part>) {
    let mut owners: Vec<Option<String>> = Vec::new();
    for lane in client.open_lanes() {
        if !owners.contains(&lane.owner) {
            owners.push(lane.owner.clone());
        }
    }
    for owner in owners {
        let mut e = json!({"type": "STATE_SNAPSHOT", "snapshot": truth.fold().state()});
        if let (Some(o), Value::Object(m)) = (owner, &mut e) {
            m.insert("subagentRunId".into(), Value::String(o));
        }
        out.push(Part::Event(e));
    }
}

/// The open constructs that belong to an open chunk lane (their END comes from the lane).
fn lane_keys(checker: &OrderChecker) -> HashSet<Key> {
    checker
        .open_lanes()
        .iter()
        .map(|l| (l.kind().open_kind(), l.id().to_owned(), l.owner.clone()))
        .collect()
}

/// Ends the client's open items selected by `pick`, newest first, except those of the
/// client's open chunk lanes ([`close_lanes`] ends them).
fn close_items(client: &OrderChecker, pick: impl Fn(&Key) -> bool, out: &mut Vec<Part>) {
    let lanes = lane_keys(client);
    let mut items = client.open().in_opening_order();
    items.reverse();
    for (kind, item) in items {
        let k = key(kind, item);
        if !pick(&k) || lanes.contains(&k) {
            continue;
        }
        let mut end = match kind {
            OpenKind::TextMessage => json!({"type": "TEXT_MESSAGE_END", "messageId": item.id()}),
            OpenKind::ToolCall => json!({"type": "TOOL_CALL_END", "toolCallId": item.id()}),
            OpenKind::ReasoningSpan => json!({"type": "REASONING_END", "messageId": item.id()}),
            OpenKind::ReasoningMessage => {
                json!({"type": "REASONING_MESSAGE_END", "messageId": item.id()})
            }
            OpenKind::Step => json!({"type": "STEP_FINISHED", "stepName": item.id()}),
            OpenKind::Subagent => {
                out.push(Part::Event(
                    json!({"type": "SUBAGENT_FINISHED", "subagentRunId": item.id()}),
                ));
                continue;
            }
        };
        if let (Some(o), Value::Object(m)) = (item.subagent_run_id(), &mut end) {
            m.insert("subagentRunId".into(), Value::String(o.to_owned()));
        }
        out.push(Part::Event(end));
    }
}

/// Re-opens what is open in truth and not in `skip`, in opening order: the original START, or
/// for an item of an open chunk lane, the lane's re-opening chunk.
fn reopen(truth: &ThreadFold, skip: &HashSet<Key>, out: &mut Vec<Part>) {
    let lanes = truth.checker().open_lanes();
    for (kind, item) in truth.checker().open().in_opening_order() {
        if skip.contains(&key(kind, item)) {
            continue;
        }
        let lane = lanes
            .iter()
            .find(|l| l.id() == item.id() && l.kind().open_kind() == kind);
        match lane {
            Some(l) => out.push(Part::Event(l.reopening_chunk())),
            None => out.push(Part::Event(item.start().clone())),
        }
    }
}
