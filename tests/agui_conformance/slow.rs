//! (d): a stalled subscriber is coalesced and still folds like the log.

use super::*;

// ---------------------------------------------------------------------------------------------
// (d)

/// (d): `queue.max_events` and `queue.max_bytes` of the slow-subscriber broker.
pub(crate) const SLOW_MAX_EVENTS: usize = 64;
pub(crate) const SLOW_MAX_BYTES: usize = 64 << 10;
/// (d): bytes of `rawEvent` padding in each event of the padding run.
pub(crate) const SLOW_PAD_BYTES: usize = 8 << 10;
/// Run and message of the padding run that fills a slow subscriber's connection first (d).
pub(crate) const PAD_RUN: &str = "agui-fanout-test-padding";
pub(crate) const PAD_MESSAGE: &str = "agui-fanout-test-padding-m";

/// What a slow subscriber and a fast one received of one recorded run (d).
pub(crate) struct SlowRow {
    pub(crate) name: String,
    pub(crate) log_events: usize,
    pub(crate) fast: (usize, usize),
    pub(crate) slow: (usize, usize),
    pub(crate) coalesced: f64,
    pub(crate) padding: usize,
}

/// The frames after the padding run's `RUN_FINISHED`: the recorded run as received.
pub(crate) fn run_part(body: &str) -> Vec<DataFrame> {
    let frames = data_frames(body);
    let end = frames
        .iter()
        .position(|f| f.event["type"] == "RUN_FINISHED" && f.event["runId"] == PAD_RUN)
        .expect("the padding run's RUN_FINISHED");
    frames.into_iter().skip(end + 1).collect()
}

/// (d) A raw TCP subscriber connects to a fresh thread and stops reading. A padding run (one
/// assistant message whose `TEXT_MESSAGE_CONTENT`s carry 8 KiB of `rawEvent`: mergeable) is
/// published, one event per POST, until the subscriber is stuck ([`pad_until_stuck`]: its queue
/// went over its bound and was coalesced, and its writer writes no more). Then the recorded run
/// is published, one event per POST, as fast as the broker answers, and only then does the
/// subscriber read, up to the run's last id. A fast subscriber reads along from the start. The
/// slow body, one connection, must pass the client as one stream and fold like the log.
pub(crate) async fn scenario_slow(
    broker: &BrokerProcess,
    source: &Source,
    notes: &mut Vec<String>,
) -> Option<(Comparison, SlowRow)> {
    let base = broker.base();
    let label = format!("memory/slow/{}", source.name);
    let thread = broker::thread_id("conf-slow");
    let events = source.retargeted(&thread);
    let resets_before = resets(&base).await;
    let (until, rx) = watch::channel(None);
    let fast = agui::subscribe_reader(&base, &thread, None, rx).await;
    let slow = StalledSse::connect(broker.addr, &thread).await;

    let mut pad = Publisher::new(&base, &thread);
    publish_own(
        &mut pad,
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": PAD_RUN}),
    )
    .await;
    publish_own(
        &mut pad,
        json!({"type": "TEXT_MESSAGE_START", "messageId": PAD_MESSAGE, "role": "assistant"}),
    )
    .await;
    let filler = "x".repeat(SLOW_PAD_BYTES);
    let padding = pad_until_stuck(
        &base,
        &mut pad,
        |_| {
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": PAD_MESSAGE, "delta": ".",
                "rawEvent": {"padding": filler}})
        },
        Overfull::Coalesced,
        stall_capacity(slow.rcvbuf, SLOW_MAX_BYTES + SLOW_PAD_BYTES + 1024),
    )
    .await;
    publish_own(
        &mut pad,
        json!({"type": "TEXT_MESSAGE_END", "messageId": PAD_MESSAGE}),
    )
    .await;
    publish_own(
        &mut pad,
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": PAD_RUN}),
    )
    .await;

    let coalesced_before = coalesced(&base).await;
    let mut p = Publisher::new(&base, &thread);
    p.publish_all(&events).await;
    for s in p.skipped_notes() {
        notes.push(format!("{label}: skipped at publish: {s}"));
    }
    let Some(last) = p.last_id().map(str::to_string) else {
        notes.push(format!("{label}: no event accepted, nothing to compare"));
        fast.abort();
        return None;
    };
    let mut slow = slow;
    slow.read_until(&last).await;
    until.send_replace(Some(last.clone()));
    let fast_body = fast.await.expect("fast reader");
    let slow_body = slow.body();
    let coalesced_after = coalesced(&base).await;
    assert_eq!(
        resets(&base).await,
        resets_before,
        "{label}: coalescing alone keeps the slow subscriber within its queue"
    );
    let row = SlowRow {
        name: source.name.clone(),
        log_events: p.accepted.len(),
        fast: tally(&run_part(&fast_body)),
        slow: tally(&run_part(&slow_body)),
        coalesced: coalesced_after - coalesced_before,
        padding,
    };
    let comparison = Comparison {
        subject: agui::client_case(&format!("{label}/slow"), &thread, &[slow_body]),
        reference: log_case(&base, &thread, &last, &label).await,
        expect: None,
        label,
    };
    Some((comparison, row))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn slow_subscriber_is_coalesced_and_folds_like_the_log() {
    let test = "slow_subscriber_is_coalesced_and_folds_like_the_log";
    let broker = BrokerProcess::spawn(&[
        ("AGUI_QUEUE__MAX_EVENTS", SLOW_MAX_EVENTS.to_string()),
        ("AGUI_QUEUE__MAX_BYTES", SLOW_MAX_BYTES.to_string()),
    ])
    .await;
    let base = broker.base();
    let disconnects = overflow_disconnects(&base).await;
    let mut comparisons = Vec::new();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for source in agui::recorded_sources() {
        if let Some((c, row)) = scenario_slow(&broker, &source, &mut notes).await {
            comparisons.push(c);
            rows.push(row);
        }
    }
    assert_eq!(overflow_disconnects(&base).await, disconnects);

    eprintln!(
        "{test}: queue.max_events = {SLOW_MAX_EVENTS}, queue.max_bytes = {SLOW_MAX_BYTES}; \
         the recorded run's frames as received (after the padding run)"
    );
    eprintln!(
        "{:<76} {:>5} {:>6} {:>6} {:>9} {:>9} {:>6} {:>9}",
        "stream", "log", "fast", "slow", "fast B", "slow B", "coal.", "padding"
    );
    for r in &rows {
        eprintln!(
            "{:<76} {:>5} {:>6} {:>6} {:>9} {:>9} {:>6} {:>9}",
            r.name, r.log_events, r.fast.0, r.slow.0, r.fast.1, r.slow.1, r.coalesced, r.padding
        );
    }
    for r in &rows {
        // More events than the queue holds, published while the writer is stuck: merged.
        if r.log_events > SLOW_MAX_EVENTS {
            assert!(
                r.slow.0 < r.log_events && r.coalesced > 0.0,
                "{}: the slow subscriber was not coalesced ({} of {} events)",
                r.name,
                r.slow.0,
                r.log_events
            );
        }
        assert!(r.slow.0 <= r.fast.0, "{}: slow got more than fast", r.name);
    }
    assert!(
        rows.iter().any(|r| r.log_events > SLOW_MAX_EVENTS),
        "some run is long enough"
    );
    report(test, &comparisons, &notes);
}
