//! (f): a client cut off at every event boundary inside a reset bridge resumes with its last
//! id and still folds like the log.

use super::*;

// ---------------------------------------------------------------------------------------------
// (f)

/// Where a client may be cut off inside the first reset bridge of `body`: the byte offsets
/// after each complete event of the bridge but its last. The bridge is found without relying
/// on its mark: the frames from after the last event id before its `MESSAGES_SNAPSHOT` (every
/// bridge restates the messages; the synthetic thread has no `MESSAGES_SNAPSHOT`) to the next
/// event id, which is on its last event. Also returns whether the bridge's first event
/// carries the mark (`<id>-bridge`, PROTOCOL §5).
pub(crate) fn cuts_inside_first_bridge(body: &str) -> (Vec<usize>, bool) {
    // (end offset, id, data type) of each block.
    let mut blocks = Vec::new();
    let mut at = 0;
    for (frame, bytes) in whole_frames(body) {
        at += bytes;
        let ty = frame.data.as_deref().map(|d| {
            let v: Value = serde_json::from_str(d).expect("data is JSON");
            v["type"].as_str().unwrap_or("?").to_string()
        });
        blocks.push((at, frame.id, ty));
    }
    let event_id = |b: &(usize, Option<String>, Option<String>)| {
        b.1.as_deref().is_some_and(|id| !id.ends_with("-bridge"))
    };
    let snapshot = blocks
        .iter()
        .position(|b| b.2.as_deref() == Some("MESSAGES_SNAPSHOT"))
        .expect("a bridge in the body");
    let first = blocks[..snapshot]
        .iter()
        .rposition(event_id)
        .map_or(0, |i| i + 1);
    let first = first
        + blocks[first..]
            .iter()
            .position(|b| b.2.is_some())
            .expect("data");
    let last = snapshot
        + blocks[snapshot..]
            .iter()
            .position(event_id)
            .expect("the bridge's id");
    let cuts = blocks[first..last]
        .iter()
        .filter(|b| b.2.is_some())
        .map(|b| b.0)
        .collect();
    let marked = blocks[first]
        .1
        .as_deref()
        .is_some_and(|id| id.ends_with("-bridge"));
    (cuts, marked)
}

/// The last `id:` of a body (what an `EventSource` sends back as `Last-Event-ID`).
pub(crate) fn last_id_of(body: &str) -> Option<String> {
    whole_frames(body)
        .into_iter()
        .rev()
        .find_map(|(frame, _)| frame.id)
}

/// (f) A raw TCP subscriber reads the first third of the synthetic thread's first run, stalls
/// until its queue is reset, and reads again once more of the run was published: it receives
/// a bridge. For every event boundary inside that bridge, a client cut off there comes back
/// with the last id it received (the bridge's mark: the bridge's first event carries it) and
/// reads to the end of the thread. Each client's two connections must pass (the second begins
/// with a prelude) and fold like the log; without the mark the client would resume exactly
/// from before the bridge, on top of the part it applied (duplicated messages, a run started
/// twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_subscriber_cut_inside_a_bridge_resumes_and_folds_like_the_log() {
    let test = "a_subscriber_cut_inside_a_bridge_resumes_and_folds_like_the_log";
    let broker = resets_broker(true).await;
    let base = broker.base();
    let thread = broker::thread_id("conf-cut");
    let events = synthetic_thread(&thread, false, false);
    let run = run_ranges(&events)[0].clone();
    let (read_to, stall_to) = (run.start + run.len() / 3, run.start + 2 * run.len() / 3);

    let mut slow = StalledSse::connect(broker.addr, &thread).await;
    let capacity = stall_capacity(slow.rcvbuf, RESET_MAX_BYTES + (64 << 10));
    let mut p = Publisher::new(&base, &thread);
    for (i, e) in events.iter().enumerate().take(read_to) {
        publish_own_at(&mut p, i, e).await;
    }
    slow.read_through(p.last_id().expect("published")).await;
    pad_until_reset(&base, &mut p, capacity).await;
    for (i, e) in events.iter().enumerate().take(stall_to).skip(read_to) {
        publish_own_at(&mut p, i, e).await;
    }
    slow.read_through(p.last_id().expect("published")).await;
    let body = slow.body();
    drop(slow);
    let (cuts, marked) = cuts_inside_first_bridge(&body);
    assert!(cuts.len() >= 3, "a bridge of several events: {cuts:?}");

    let bridge_resets = || metric(&base, "agui_resets_total", &[("cause", "bridge")]);
    let counted_before = bridge_resets().await;
    let mut clients = Vec::new();
    for &cut in &cuts {
        let first = body[..cut].to_string();
        let last = last_id_of(&first).expect("an id before the cut");
        let (until, rx) = watch::channel(None);
        let reader = agui::subscribe_reader(&base, &thread, Some(&last), rx).await;
        clients.push((first, until, reader));
    }
    for (i, e) in events.iter().enumerate().skip(stall_to) {
        publish_own_at(&mut p, i, e).await;
    }
    let last = p.last_id().expect("published").to_string();
    let mut comparisons = Vec::new();
    for (n, (first, until, reader)) in clients.into_iter().enumerate() {
        until.send_replace(Some(last.clone()));
        let second = reader.await.expect("second connection");
        let label = format!("memory/cut-inside-bridge/synthetic/cut={n}");
        comparisons.push(Comparison {
            subject: agui::client_case(&format!("{label}/sub"), &thread, &[first, second]),
            reference: log_case(&base, &thread, &last, &label).await,
            expect: None,
            label,
        });
    }
    report(test, &comparisons, &[]);
    assert!(marked, "the bridge's first event carries its mark");
    assert_eq!(
        bridge_resets().await - counted_before,
        cuts.len() as f64,
        "each resume with a bridge mark is counted as a reset (cause bridge)"
    );
}

/// Publishes event `i` of a source, which must be accepted.
pub(crate) async fn publish_own_at(p: &mut Publisher, i: usize, event: &Value) {
    if p.publish(i, event).await.is_none() {
        panic!("refused: {:?}", p.skipped_notes());
    }
}

// ---------------------------------------------------------------------------------------------
// (g)

/// How many events of `events` have type `t`.
pub(crate) fn count_type(events: &[Value], t: &str) -> u64 {
    events.iter().filter(|e| e["type"] == t).count() as u64
}

/// (g) A raw TCP subscriber reads the start of a run, stalls while `CUSTOM` padding overflows
/// its queue (the broker resets it), misses three more `CUSTOM` and three `RAW` events, and
/// reads again. No snapshot restates `CUSTOM` or `RAW`, so the bridge must say what was lost,
/// in a way an app can read (PROTOCOL §5 "Reset"): its first event is the `agui-fanout.gap`
/// `CUSTOM` event, carrying the bridge mark, with the exact numbers of `CUSTOM` and `RAW`
/// events this subscriber did not get (the log's minus the body's), also counted in
/// `agui_events_skipped_total{type}`. The real `@ag-ui/client` accepts the stream, hands the
/// gap event to an app's `onCustomEvent`, and folds like the log. Before, the bridge said
/// nothing of the loss, and a one-event bridge carried a plain id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_reset_that_drops_custom_events_tells_the_client_with_a_gap_event() {
    let broker = resets_broker(true).await;
    let base = broker.base();
    let thread = broker::thread_id("conf-gap");
    let mut slow = StalledSse::connect(broker.addr, &thread).await;
    let capacity = stall_capacity(slow.rcvbuf, RESET_MAX_BYTES + (64 << 10));
    let mut p = Publisher::new(&base, &thread);
    for e in [
        json!({"type":"RUN_STARTED","threadId":thread,"runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a"}),
    ] {
        publish_own(&mut p, e).await;
    }
    slow.read_through(p.last_id().expect("published")).await;
    let had = slow.newest.clone();
    let skipped_before = [
        metric(&base, "agui_events_skipped_total", &[("type", "CUSTOM")]).await,
        metric(&base, "agui_events_skipped_total", &[("type", "RAW")]).await,
    ];
    let filler = "x".repeat(RESET_PAD_BYTES);
    pad_until_stuck(
        &base,
        &mut p,
        |i| json!({"type":"CUSTOM","name":"pad","value":{"i": i, "pad": filler}}),
        Overfull::Reset,
        capacity + RESET_MAX_BYTES,
    )
    .await;
    for i in 0..3 {
        publish_own(&mut p, json!({"type":"CUSTOM","name":"late","value":i})).await;
        publish_own(&mut p, json!({"type":"RAW","event":{"late":i}})).await;
    }
    publish_own(
        &mut p,
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"b"}),
    )
    .await;
    let last = p.last_id().expect("published").to_string();
    slow.read_through(&last).await;
    let body = slow.body();
    drop(slow);

    let frames = data_frames(&body);
    let gaps: Vec<&DataFrame> = frames
        .iter()
        .filter(|f| f.event["name"] == "agui-fanout.gap")
        .collect();
    assert_eq!(gaps.len(), 1, "one gap event: {body}");
    let gap = gaps[0];
    let received: Vec<Value> = frames
        .iter()
        .filter(|f| f.event["name"] != "agui-fanout.gap")
        .map(|f| f.event.clone())
        .collect();
    let lost_custom = count_type(&p.accepted, "CUSTOM") - count_type(&received, "CUSTOM");
    let lost_raw = count_type(&p.accepted, "RAW") - count_type(&received, "RAW");
    assert!(
        lost_custom >= 3 && lost_raw == 3,
        "{lost_custom} {lost_raw}"
    );
    let value = &gap.event["value"];
    assert_eq!(value["reason"], "overflow");
    assert_eq!(value["skipped"], lost_custom + lost_raw, "{value}");
    assert_eq!(
        value["skippedTypes"],
        json!({"CUSTOM": lost_custom, "RAW": lost_raw})
    );
    // The gap event opens the bridge and carries its mark: `<the client's last id>-bridge`.
    let before = frames
        .iter()
        .take_while(|f| !std::ptr::eq(*f, gap))
        .filter_map(|f| f.id.clone())
        .last()
        .expect("an id before the bridge");
    assert_eq!(gap.id, Some(format!("{before}-bridge")));
    assert_eq!(value["after"], before);
    let (epoch, ms, seq, _) = sse_client::id_key(&before);
    assert!(
        had.is_some_and(|h| (h.0, h.1, h.2) <= (epoch, ms, seq)),
        "the mark names what the client had"
    );
    let until = frames
        .iter()
        .skip_while(|f| !std::ptr::eq(*f, gap))
        .find_map(|f| f.id.clone().filter(|id| !id.ends_with("-bridge")))
        .expect("the bridge's id");
    assert_eq!(value["until"], until);
    assert_eq!(
        [
            metric(&base, "agui_events_skipped_total", &[("type", "CUSTOM")]).await
                - skipped_before[0],
            metric(&base, "agui_events_skipped_total", &[("type", "RAW")]).await
                - skipped_before[1],
        ],
        [lost_custom as f64, lost_raw as f64]
    );

    let label = "memory/gap";
    let subject = agui::client_case(&format!("{label}/sub"), &thread, &[body]);
    let reference = log_case(&base, &thread, &last, label).await;
    let results = agui::run_cases(&[subject, reference]);
    let (sub, log) = (&results[0], &results[1]);
    assert!(sub.ok && log.ok, "{:?} / {:?}", sub.error, log.error);
    let told: Vec<&Value> = sub
        .custom
        .iter()
        .filter(|c| c["name"] == "agui-fanout.gap")
        .collect();
    assert_eq!(told, [&json!({"name": "agui-fanout.gap", "value": value})]);
    assert_eq!(sub.messages, log.messages, "folds like the log");
    assert_eq!(sub.state, log.state, "folds like the log");
}
