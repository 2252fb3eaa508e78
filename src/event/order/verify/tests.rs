//! The verifier's clone cost on long runs: owner maps shared until a clone writes one.

use super::OrderVerifier;
use serde_json::{Value, json};
use std::sync::Arc;

/// A verifier after a run that streamed `messages` text messages (each started, one content
/// delta, ended).
fn long_run(messages: usize) -> OrderVerifier {
    let mut v = OrderVerifier::default();
    let mut ok = |e: Value| v.verify(&e).expect("a valid event");
    ok(json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}));
    for i in 0..messages {
        let id = format!("m{i}");
        ok(json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}));
        ok(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": "hi"}));
        ok(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
    }
    v
}

#[test]
fn clones_share_the_run_owner_maps_until_one_records_an_owner() {
    let mut original = long_run(1_000);
    let open = json!({"type": "TEXT_MESSAGE_START", "messageId": "open", "role": "assistant"});
    original.verify(&open).expect("a new message");
    assert_eq!(original.owners.message.len(), 1_001);
    let mut clone = original.clone();
    assert!(
        Arc::ptr_eq(&original.owners, &clone.owners),
        "a clone copied 1,001 owners"
    );
    // Content deltas record no owner: still shared.
    clone
        .verify(&json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "open", "delta": "x"}))
        .expect("content of the open message");
    assert!(Arc::ptr_eq(&original.owners, &clone.owners));
    // A START records one: the clone copies the maps, the original is untouched.
    let start = json!({"type": "TEXT_MESSAGE_START", "messageId": "new", "role": "assistant"});
    clone.verify(&start).expect("a new message");
    assert!(!Arc::ptr_eq(&original.owners, &clone.owners));
    assert_eq!(original.owners.message.len(), 1_001);
    assert_eq!(clone.owners.message.len(), 1_002);
    assert!(!original.owners.message.contains_key("new"));
    original
        .verify(&start)
        .expect("the original never saw the clone's START");
}

#[test]
fn a_refused_event_leaves_the_shared_owners_alone() {
    let original = long_run(10);
    let mut clone = original.clone();
    // A tagged re-open of a message the parent owns: refused, nothing recorded.
    let err = clone.verify(&json!({"type": "TEXT_MESSAGE_START", "messageId": "m3", "role": "assistant", "subagentRunId": "s1"}));
    assert!(err.is_err());
    assert!(Arc::ptr_eq(&original.owners, &clone.owners));
    assert_eq!(clone, original);
}
