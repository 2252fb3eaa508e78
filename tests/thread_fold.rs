//! `ThreadFold`: the fold with its order checker; the ways of checking and applying a batch
//! agree.

use agui_fanout::fold::ThreadFold;
use serde_json::Value;
use serde_json::json;

/// The two ways of checking a batch agree, and the in-place fold equals the built one.
fn agree(fold: &ThreadFold, batch: &[Value], at: &str) {
    let built = fold.check_batch(batch);
    let only = fold.check_batch_only(batch);
    match (&built, &only) {
        (Ok(next), Ok(())) => {
            let mut in_place = fold.clone();
            in_place.apply_checked(batch);
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
        (Err(a), Err(b)) => assert_eq!(a, b, "{at}: same rejection"),
        _ => panic!("{at}: check_batch {built:?} but check_batch_only {only:?}"),
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
    for file in files {
        let text = std::fs::read_to_string(&file).expect("fixture");
        let events: Vec<Value> =
            serde_json::from_str(text.trim_start_matches('\u{feff}')).expect("a JSON array");
        let mut fold = ThreadFold::new();
        for (i, event) in events.iter().enumerate() {
            let at = format!("{}#{i}", file.display());
            agree(&fold, std::slice::from_ref(event), &at);
            agree(&fold, &events[i..(i + 3).min(events.len())], &at);
            for p in &probes {
                agree(&fold, &[event.clone(), p.clone()], &at);
            }
            agree(&fold, &snapshot_then_delta, &at);
            agree(&fold, &snapshot_then_delta[..2], &at);
            let _ = fold.apply_logged(event);
        }
    }
}
