//! `ThreadFold`: the fold with its order checker; the ways of checking and applying a batch
//! agree.

use agui_fanout::fold::{OrderAfter, ThreadFold};
use serde_json::Value;
use serde_json::json;

/// How many accepted batches left the order state each way ([`OrderAfter`]): unchanged,
/// changed, expanded.
#[derive(Default)]
struct Seen([usize; 3]);

/// The two ways of checking a batch agree, and the in-place fold (taking the order state the
/// check found) equals the built one.
fn agree(fold: &ThreadFold, batch: &[Value], at: &str, seen: &mut Seen) {
    let built = fold.check_batch(batch);
    // The check alone tries the batch's state deltas on the fold's own state: it must leave
    // the fold as it was, byte for byte, whatever the outcome.
    let mut probe = fold.clone();
    let only = probe.check_batch_only(batch);
    assert_eq!(
        serde_json::to_string(probe.fold().state()).unwrap(),
        serde_json::to_string(fold.fold().state()).unwrap(),
        "{at}: the check changed the state"
    );
    assert_eq!(
        probe.checker(),
        fold.checker(),
        "{at}: the check changed the order state"
    );
    match (&built, only) {
        (Ok(next), Ok(after)) => {
            seen.0[match after {
                OrderAfter::Unchanged => 0,
                OrderAfter::Changed(_) => 1,
                OrderAfter::Expanded => 2,
            }] += 1;
            let mut in_place = fold.clone();
            in_place.apply_checked(batch, after);
            assert_eq!(in_place.checker(), next.checker(), "{at}: order state");
            assert_eq!(in_place.fold().state(), next.fold().state(), "{at}: state");
            assert_eq!(
                in_place.fold().messages(),
                next.fold().messages(),
                "{at}: messages"
            );
            assert_eq!(
                in_place.fold().run().map(|r| r.to_json()),
                next.fold().run().map(|r| r.to_json()),
                "{at}: run"
            );
        }
        (Err(a), Err(b)) => assert_eq!(a, &b, "{at}: same rejection"),
        (_, only) => panic!("{at}: check_batch {built:?} but check_batch_only {only:?}"),
    }
}

/// Every recorded stream, event by event and in batches of three, plus events each
/// position refuses (content for an unknown message, a patch that does not apply, a
/// patch after a snapshot in the same batch).
#[test]
fn checking_alone_agrees_with_building_the_next_fold() {
    let files = agui_fanout::recorded_responses();
    assert!(!files.is_empty(), "recorded fixtures");
    let probes = [
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "nope", "delta": "x"}),
        json!({"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/absent/deeper"}]}),
        json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/n", "value": 1}]}),
    ];
    let snapshot_then_delta = [
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"a": [1]}}),
        json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a/-", "value": 2}]}),
        json!({"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/b", "value": 2}]}),
    ];
    // Chunks expand to other events, and any event closes an open lane.
    let chunks = vec![
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "role": "assistant", "delta": "a"}),
        json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "delta": "b"}),
        json!({"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/n", "value": 1}]}),
        json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "k1", "toolCallName": "f", "delta": "{"}),
        json!({"type": "TOOL_CALL_CHUNK", "toolCallId": "k1", "delta": "}"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "x"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "m1"}),
        json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}),
    ];
    let mut seen = Seen::default();
    let streams = files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).expect("fixture");
            let events: Vec<Value> =
                serde_json::from_str(text.trim_start_matches('\u{feff}')).expect("a JSON array");
            (file.display().to_string(), events)
        })
        .chain([("chunks".to_owned(), chunks)]);
    for (name, events) in streams {
        let mut fold = ThreadFold::new();
        for (i, event) in events.iter().enumerate() {
            let at = format!("{name}#{i}");
            agree(&fold, std::slice::from_ref(event), &at, &mut seen);
            agree(&fold, &events[i..(i + 3).min(events.len())], &at, &mut seen);
            for p in &probes {
                agree(&fold, &[event.clone(), p.clone()], &at, &mut seen);
            }
            agree(&fold, &snapshot_then_delta, &at, &mut seen);
            agree(&fold, &snapshot_then_delta[..2], &at, &mut seen);
            let _ = fold.apply_logged(event);
        }
    }
    // Each way of leaving the order state was taken (and compared with the built fold).
    assert!(
        seen.0.iter().all(|&n| n > 0),
        "unchanged, changed, expanded: {:?}",
        seen.0
    );
}

/// A log event the order rules refuse is skipped and counted, on the path of the events that
/// record nothing (a content delta) as on the others (a start); the others fold.
#[test]
fn logged_events_that_break_the_rules_are_skipped_and_counted() {
    let mut fold = ThreadFold::new();
    let ok = |fold: &mut ThreadFold, e: Value| assert!(fold.apply_logged(&e).is_ok(), "{e}");
    ok(
        &mut fold,
        json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
    );
    ok(
        &mut fold,
        json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}),
    );
    ok(
        &mut fold,
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "a"}),
    );
    let content = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "x", "delta": "b"});
    assert!(fold.apply_logged(&content).is_err());
    assert_eq!(fold.skipped(), 1);
    let start = json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"});
    assert!(fold.apply_logged(&start).is_err());
    assert_eq!(fold.skipped(), 2);
    ok(
        &mut fold,
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "c"}),
    );
    assert_eq!(fold.fold().messages()[0]["content"], "ac");
    assert_eq!(fold.skipped(), 2);
}
