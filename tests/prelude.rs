//! Preludes and bridges (PROTOCOL §5) built from a thread's fold: what they restate, the
//! prelude mark, and that a fresh client folding them reaches the same state and messages.

use agui_fanout::fold::ThreadFold;
use agui_fanout::fold::prelude::{PRELUDE_METADATA_KEY, bridge, is_prelude_start, prelude};
use serde_json::Value;
use serde_json::json;

/// A fold rebuilt from a checkpoint holds the checkpoint's marked `RUN_STARTED`; a bridge
/// from it must restate the run unmarked, a prelude marked. (Found by the delivery
/// property, hunt case 121: a marked RUN_STARTED inside a connection.)
#[test]
fn a_fold_from_a_checkpoint_does_not_pass_the_prelude_mark_to_bridges() {
    let mut original = ThreadFold::new();
    for e in [
        json!({"type":"RUN_STARTED","threadId":"t","runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"hi"}),
    ] {
        original.apply_logged(&e).expect("valid");
    }
    // What `load_fold` does with a checkpoint: fold the stored prelude.
    let mut from_checkpoint = ThreadFold::new();
    for e in prelude(&original) {
        from_checkpoint
            .apply_logged(&e)
            .expect("a prelude is valid");
    }
    let nothing = ThreadFold::new();
    let bridged = bridge(nothing.checker(), &from_checkpoint);
    assert_eq!(bridged[0]["type"], "RUN_STARTED", "{bridged:?}");
    assert!(!is_prelude_start(&bridged[0]), "{:?}", bridged[0]);
    assert_eq!(
        bridged[0],
        json!({"type":"RUN_STARTED","threadId":"t","runId":"r1"}),
        "the producer's event, as it was"
    );
    let pre = prelude(&from_checkpoint);
    assert!(is_prelude_start(&pre[0]), "{:?}", pre[0]);
}

/// Every recorded .NET run, and the runs of one test folder concatenated (several runs on
/// one thread).
fn recorded_threads() -> Vec<(String, Vec<Value>)> {
    let root = agui_fanout::fixtures_dir().join("agui-recorded/dotnet-getting-started-baselines");
    let mut out = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|f| f.unwrap().path())
            .filter(|p| {
                p.to_string_lossy()
                    .ends_with("Response.Server.AGUI.verified.json")
            })
            .collect();
        files.sort();
        let mut all = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let events: Vec<Value> =
                serde_json::from_str(text.trim_start_matches('\u{feff}')).unwrap();
            out.push((f.display().to_string(), events.clone()));
            all.extend(events);
        }
        if files.len() > 1 {
            out.push((format!("{} (all turns)", dir.display()), all));
        }
    }
    out
}

/// Hand-made thread with interleaved constructs, a failing delta, reasoning, a step and an
/// open subagent, and a second run.
fn synthetic() -> Vec<Value> {
    vec![
        json!({"type":"RUN_STARTED","threadId":"t","runId":"r1","input":{"threadId":"t","runId":"r1","messages":[{"id":"u1","role":"user","content":"hi"}]}}),
        json!({"type":"STATE_SNAPSHOT","snapshot":{"n":0}}),
        json!({"type":"STEP_STARTED","stepName":"plan"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"Hel"}),
        json!({"type":"TOOL_CALL_START","toolCallId":"c1","toolCallName":"f","parentMessageId":"m1"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"lo"}),
        json!({"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"{\"a\":"}),
        json!({"type":"STATE_DELTA","delta":[{"op":"replace","path":"/n","value":1}]}),
        json!({"type":"STATE_DELTA","delta":[{"op":"remove","path":"/missing"}]}),
        json!({"type":"REASONING_START","messageId":"rs"}),
        json!({"type":"REASONING_MESSAGE_START","messageId":"rm","role":"reasoning"}),
        json!({"type":"REASONING_MESSAGE_CONTENT","messageId":"rm","delta":"think"}),
        json!({"type":"TOOL_CALL_ARGS","toolCallId":"c1","delta":"1}"}),
        json!({"type":"SUBAGENT_STARTED","subagentRunId":"s1","name":"helper"}),
        json!({"type":"TEXT_MESSAGE_CHUNK","messageId":"m2","delta":"chunk","subagentRunId":"s1"}),
        json!({"type":"TEXT_MESSAGE_CHUNK","delta":"ed","subagentRunId":"s1"}),
        json!({"type":"REASONING_MESSAGE_END","messageId":"rm"}),
        json!({"type":"REASONING_END","messageId":"rs"}),
        json!({"type":"TOOL_CALL_END","toolCallId":"c1"}),
        json!({"type":"TEXT_MESSAGE_END","messageId":"m1"}),
        json!({"type":"STATE_DELTA","delta":[{"op":"add","path":"/m","value":[1]}]}),
        json!({"type":"SUBAGENT_FINISHED","subagentRunId":"s1"}),
        json!({"type":"STEP_FINISHED","stepName":"plan"}),
        json!({"type":"TOOL_CALL_RESULT","messageId":"tr1","toolCallId":"c1","content":"ok"}),
        json!({"type":"RUN_FINISHED","threadId":"t","runId":"r1","result":{"x":1}}),
        json!({"type":"RUN_STARTED","threadId":"t","runId":"r2"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m3"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m3","delta":"second"}),
        json!({"type":"TEXT_MESSAGE_END","messageId":"m3"}),
        json!({"type":"RUN_ERROR","message":"boom"}),
    ]
}

fn fold_all(events: &[Value]) -> ThreadFold {
    let mut f = ThreadFold::new();
    for (i, e) in events.iter().enumerate() {
        f.apply_logged(e)
            .unwrap_or_else(|v| panic!("log event {i} refused: {v}"));
    }
    f
}

/// Folds what a client receives, as the client does: a fresh verifier for a new stream;
/// panics on an order violation.
fn client_fold(name: &str, streams: &[Vec<Value>]) -> (Value, Value) {
    let mut messages_state = ThreadFold::new();
    for stream in streams {
        // A fresh verifier per stream, but messages and state carry over (same agent).
        messages_state.reset_order();
        for (i, e) in stream.iter().enumerate() {
            messages_state
                .apply_logged(e)
                .unwrap_or_else(|v| panic!("{name}: client refuses event {i} {e}: {v}"));
        }
    }
    (
        serde_json::to_value(messages_state.fold().messages()).unwrap(),
        messages_state.fold().state().clone(),
    )
}

fn truth(events: &[Value]) -> (Value, Value) {
    let f = fold_all(events);
    (
        serde_json::to_value(f.fold().messages()).unwrap(),
        f.fold().state().clone(),
    )
}

fn all_threads() -> Vec<(String, Vec<Value>)> {
    let mut v = recorded_threads();
    v.push(("synthetic".into(), synthetic()));
    v
}

#[test]
fn prelude_at_every_position_then_live_folds_like_the_log() {
    for (name, events) in all_threads() {
        let want = truth(&events);
        for k in 0..=events.len() {
            let pre = prelude(&fold_all(&events[..k]));
            if k > 0 {
                assert!(!pre.is_empty(), "{name}@{k}: empty prelude");
                assert!(
                    is_prelude_start(&pre[0]) || pre[0]["type"] == "RUN_ERROR",
                    "{name}@{k}: {}",
                    pre[0]
                );
            }
            let stream: Vec<Value> = pre.into_iter().chain(events[k..].iter().cloned()).collect();
            assert_eq!(
                client_fold(&format!("{name}@{k}"), &[stream]),
                want,
                "{name}@{k}"
            );
        }
    }
}

#[test]
fn prelude_on_a_second_connection_of_a_client_with_history_folds_like_the_log() {
    // A client that folded events[..j] reconnects and gets a prelude at k (its id was
    // trimmed): its agent keeps its messages, the new response gets a fresh verifier.
    for (name, events) in all_threads() {
        let want = truth(&events);
        let n = events.len();
        let step = (n / 40).max(1);
        for j in (1..n).step_by(step) {
            for k in (j..=n).step_by(step) {
                let second: Vec<Value> = prelude(&fold_all(&events[..k]))
                    .into_iter()
                    .chain(events[k..].iter().cloned())
                    .collect();
                let streams = [events[..j].to_vec(), second];
                assert_eq!(
                    client_fold(&format!("{name} {j}=>{k}"), &streams),
                    want,
                    "{name} {j}=>{k}"
                );
            }
        }
    }
}

#[test]
fn bridge_from_every_earlier_position_keeps_the_stream_valid_and_exact() {
    for (name, events) in all_threads() {
        let want = truth(&events);
        let n = events.len();
        // Pairs (client at j, truth at k), j < k; sampled on long runs.
        let step = (n / 40).max(1);
        for j in (1..n).step_by(step) {
            for k in (j + 1..=n).step_by(step) {
                let client = fold_all(&events[..j]);
                let truth_k = fold_all(&events[..k]);
                let b = bridge(client.checker(), &truth_k);
                let stream: Vec<Value> = events[..j]
                    .iter()
                    .cloned()
                    .chain(b)
                    .chain(events[k..].iter().cloned())
                    .collect();
                assert_eq!(
                    client_fold(&format!("{name} {j}->{k}"), &[stream]),
                    want,
                    "{name} {j}->{k}"
                );
            }
        }
    }
}

#[test]
fn prelude_marks_only_its_run_started_and_keeps_producer_metadata() {
    let events = vec![
        json!({"type":"RUN_STARTED","threadId":"t","runId":"r","metadata":{"k":"v"}}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m","metadata":{"x":1}}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"a"}),
    ];
    let pre = prelude(&fold_all(&events));
    assert_eq!(
        pre[0]["metadata"],
        json!({"k":"v","agui-fanout":{"prelude":true}})
    );
    assert_eq!(
        pre.iter()
            .filter(|e| e
                .get("metadata")
                .and_then(|m| m.get(PRELUDE_METADATA_KEY))
                .is_some())
            .count(),
        1
    );
    let types: Vec<&str> = pre.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "RUN_STARTED",
            "MESSAGES_SNAPSHOT",
            "MESSAGES_SNAPSHOT",
            "STATE_SNAPSHOT",
            "TEXT_MESSAGE_START"
        ]
    );
    assert_eq!(pre[1]["messages"], json!([]));
    assert_eq!(pre[2]["messages"][0]["content"], "a");
    assert_eq!(
        pre[3]["snapshot"],
        json!({}),
        "the state is restated, empty included"
    );
    assert!(prelude(&ThreadFold::new()).is_empty());
}

/// A prelude restates the state even when nothing ever set it: a client resuming with state
/// the log never had (an epoch Redis lost, a tail a failover rolled back) must end at the
/// log's `{}`, not keep its own (issue: the real `@ag-ui/client` ended at `{"k":1}` while the
/// broker's snapshot said `{}`).
#[test]
fn a_prelude_restates_an_empty_state() {
    let mut truth = ThreadFold::new();
    for e in [
        json!({"type":"RUN_STARTED","threadId":"t","runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"hi"}),
    ] {
        truth.apply_logged(&e).expect("valid");
    }
    assert!(!truth.fold().state_known(), "nothing set the state");
    let pre = prelude(&truth);
    let snapshots: Vec<&Value> = pre
        .iter()
        .filter(|e| e["type"] == "STATE_SNAPSHOT")
        .collect();
    assert_eq!(
        snapshots,
        [&json!({"type":"STATE_SNAPSHOT","snapshot":{}})],
        "{pre:?}"
    );

    // A client that held stale state folds the prelude to the log's state.
    let mut client = ThreadFold::new();
    for e in [
        json!({"type":"RUN_STARTED","threadId":"t","runId":"r0"}),
        json!({"type":"STATE_SNAPSHOT","snapshot":{"k":1}}),
        json!({"type":"RUN_FINISHED","threadId":"t","runId":"r0"}),
    ] {
        client.apply_logged(&e).expect("valid");
    }
    for e in &pre {
        client
            .apply_logged(e)
            .expect("a prelude is valid after a finished run");
    }
    assert_eq!(client.fold().state(), truth.fold().state());
    assert_eq!(client.fold().state(), &json!({}));
}
