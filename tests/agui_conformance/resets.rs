//! (e): a subscriber that reads in bursts is reset several times, across runs, and still
//! folds like the log.

use super::*;

// ---------------------------------------------------------------------------------------------
// (e)

/// (e): `queue.max_events` and `queue.max_bytes` of the resetting broker.
pub(crate) const RESET_MAX_EVENTS: usize = 8;
pub(crate) const RESET_MAX_BYTES: usize = 8 << 10;
/// (e): bytes of padding in each `RAW` padding event (under half the queue's bytes).
pub(crate) const RESET_PAD_BYTES: usize = 3 << 10;

/// One step of a burst reader's schedule (e).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Step {
    /// Publish the source's events up to this index (exclusive), one per POST.
    Publish(usize),
    /// Read everything published so far.
    ReadAll,
    /// Publish `RAW` padding (inside the open run), one per POST, until the broker reset this
    /// subscriber and its writer is stuck.
    PadUntilReset,
    /// Read until the connection's writer wrote again (it took the bridge).
    Burst,
}

/// Index ranges of the runs of `events` (`RUN_STARTED` to its `RUN_FINISHED`/`RUN_ERROR`).
pub(crate) fn run_ranges(events: &[Value]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, e) in events.iter().enumerate() {
        match e["type"].as_str() {
            Some("RUN_STARTED") => start = Some(i),
            Some("RUN_FINISHED" | "RUN_ERROR") => {
                if let Some(s) = start.take() {
                    out.push(s..i + 1);
                }
            }
            _ => {}
        }
    }
    out
}

/// The schedule of (e). Cuts at a third and two thirds of every run, and at `catch_up` (every
/// cut inside a run, so padding can go there). At each cut: padding until a reset, then a burst
/// read, except at a run's last cut when another run follows: there the subscriber stays stuck
/// until the next run's first cut, so that reset bridges from one run to the next. At a
/// `catch_up` cut the reader reads everything before the padding (its view is the log at the
/// cut) and after the reset (so the events that follow go out live after the bridge).
pub(crate) fn reset_schedule(events: &[Value], catch_up: &[usize]) -> Vec<Step> {
    let runs = run_ranges(events);
    let mut steps = Vec::new();
    for (r, run) in runs.iter().enumerate() {
        let len = run.len();
        if len < 2 {
            continue;
        }
        let mut cuts: Vec<usize> = [len / 3, 2 * len / 3]
            .iter()
            .map(|k| run.start + (*k).clamp(1, len - 1))
            .chain(catch_up.iter().copied().filter(|c| run.contains(c)))
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        for (c, cut) in cuts.iter().enumerate() {
            assert!(
                run.start < *cut && *cut < run.end,
                "cut {cut} inside {run:?}"
            );
            steps.push(Step::Publish(*cut));
            if catch_up.contains(cut) {
                steps.extend([Step::ReadAll, Step::PadUntilReset, Step::ReadAll]);
                continue;
            }
            steps.push(Step::PadUntilReset);
            if c + 1 < cuts.len() || r + 1 == runs.len() {
                steps.push(Step::Burst);
            }
        }
    }
    steps.push(Step::Publish(events.len()));
    steps
}

/// What a burst reader went through (e).
pub(crate) struct ResetRow {
    pub(crate) name: String,
    pub(crate) log_events: usize,
    pub(crate) body_events: usize,
    pub(crate) resets: f64,
    pub(crate) bridges: usize,
    pub(crate) crossing: usize,
    pub(crate) padding: usize,
    pub(crate) read: usize,
}

/// (e) A raw TCP subscriber connected to a fresh thread reads only in bursts while `events`
/// are published (one per POST) following [`reset_schedule`]: at each cut, `RAW` padding is
/// published in the open run until `agui_resets_total{cause="overflow"}` rose and the writer is
/// stuck ([`pad_until_stuck`]; the broker is this subscriber's alone), and a burst reads until
/// `agui_publish_to_write_seconds_count` rises (the writer took the bridge). At the end it reads
/// up to the last id. Its one connection must pass the client as one stream (PROTOCOL §4.5: a live
/// reset passes as part of its connection) and fold like the log.
pub(crate) async fn scenario_resets(
    broker: &BrokerProcess,
    name: &str,
    events: &[Value],
    thread: &str,
    catch_up: &[usize],
    notes: &mut Vec<String>,
) -> (Comparison, ResetRow) {
    let base = broker.base();
    let label = format!("memory/resets/{name}");
    let mut slow = StalledSse::connect(broker.addr, thread).await;
    let capacity = stall_capacity(slow.rcvbuf, RESET_MAX_BYTES + (64 << 10));
    let resets_before = resets(&base).await;
    let mut p = Publisher::new(&base, thread);
    let (mut next, mut padding) = (0usize, 0usize);
    for step in reset_schedule(events, catch_up) {
        match step {
            Step::Publish(end) => {
                while next < end {
                    if p.publish(next, &events[next]).await.is_none() {
                        notes.push(format!(
                            "{label}: skipped at publish: {}",
                            p.skipped_notes().last().cloned().unwrap_or_default()
                        ));
                    }
                    next += 1;
                }
            }
            Step::ReadAll => {
                let newest = p.last_id().expect("published").to_string();
                slow.read_through(&newest).await;
            }
            Step::PadUntilReset => {
                padding += pad_until_reset(&base, &mut p, capacity).await;
            }
            Step::Burst => {
                let before = writes(&base).await;
                let deadline = Instant::now() + METRIC_WAIT;
                while writes(&base).await == before {
                    assert!(
                        Instant::now() < deadline,
                        "{label}: the writer did not write again"
                    );
                    slow.read_once(BURST_STEP).await;
                }
            }
        }
    }
    let last = p.last_id().expect("events accepted").to_string();
    slow.read_until(&last).await;
    let body = slow.body();
    let found = bridges(&body);
    let row = ResetRow {
        name: name.to_string(),
        log_events: p.accepted.len(),
        body_events: data_frames(&body).len(),
        resets: resets(&base).await - resets_before,
        bridges: found.len(),
        crossing: found
            .iter()
            .filter(|b| b.iter().any(|t| t == "RUN_STARTED"))
            .count(),
        padding,
        read: slow.read_total,
    };
    let comparison = Comparison {
        subject: agui::client_case(&format!("{label}/slow"), thread, &[body]),
        reference: log_case(&base, thread, &last, &label).await,
        expect: None,
        label,
    };
    (comparison, row)
}

/// The recorded responses of each test folder, its turns concatenated in order (several runs on
/// one thread), named after the folder.
pub(crate) fn recorded_folders() -> Vec<(String, Vec<Value>)> {
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    for source in agui::recorded_sources() {
        let folder = source.name.split('/').next().unwrap_or("").to_string();
        match out.last_mut() {
            Some((name, events)) if *name == folder => events.extend(source.events),
            _ => out.push((folder, source.events)),
        }
    }
    out
}

/// A hand-made thread in the style of the prelude tests' synthetic one: three runs with
/// interleaved constructs (text, tool call, reasoning, a step, a subagent's message) and a long
/// `STATE_DELTA` series. With `failing`, some patches of the series do not apply to the folded
/// state (a `remove` of a missing key; an `add` then a failing `test`, atomic), which a broker
/// with order validation refuses (422). With `chunks`, the subagent's message streams as
/// id-less `TEXT_MESSAGE_CHUNK`s (a chunk lane open for 20 rounds), else as START/CONTENT/END.
pub(crate) fn synthetic_thread(thread: &str, failing: bool, chunks: bool) -> Vec<Value> {
    let mut v = vec![
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "syn-r1",
            "input": {"threadId": thread, "runId": "syn-r1",
                "messages": [{"id": "syn-u1", "role": "user", "content": "count"}]}}),
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"n": 0, "items": [], "log": {}}}),
        json!({"type": "STEP_STARTED", "stepName": "plan"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "syn-m1", "role": "assistant"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "syn-c1", "toolCallName": "count",
            "parentMessageId": "syn-m1"}),
        json!({"type": "REASONING_START", "messageId": "syn-rs"}),
        json!({"type": "REASONING_MESSAGE_START", "messageId": "syn-rm", "role": "reasoning"}),
    ];
    let deltas = |v: &mut Vec<Value>, i: usize, fail_every: usize| {
        v.push(
            json!({"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/n", "value": i}]}),
        );
        if i.is_multiple_of(3) {
            v.push(json!({"type": "STATE_DELTA", "delta": [
                {"op": "add", "path": "/items/-", "value": i},
                {"op": "add", "path": format!("/log/k{i}"), "value": "x".repeat(i % 40)}]}));
        }
        if failing && i % fail_every == 1 {
            v.push(json!({"type": "STATE_DELTA",
                "delta": [{"op": "remove", "path": format!("/missing{i}")}]}));
        }
        if failing && i % (fail_every + 4) == 2 {
            v.push(json!({"type": "STATE_DELTA", "delta": [
                {"op": "add", "path": "/partial", "value": i},
                {"op": "test", "path": "/n", "value": -1}]}));
        }
    };
    for i in 0..150 {
        v.push(
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "syn-m1",
            "delta": format!("{i} ")}),
        );
        deltas(&mut v, i, 5);
        if i.is_multiple_of(4) {
            v.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": "syn-c1",
                "delta": format!("[{i}]")}));
        }
        if i.is_multiple_of(6) {
            v.push(
                json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "syn-rm",
                "delta": format!("t{i} ")}),
            );
        }
        if i == 100 {
            v.push(
                json!({"type": "SUBAGENT_STARTED", "subagentRunId": "syn-s1", "name": "helper"}),
            );
            if !chunks {
                v.push(json!({"type": "TEXT_MESSAGE_START", "messageId": "syn-m2",
                    "role": "assistant", "subagentRunId": "syn-s1"}));
            }
        }
        if (100..120).contains(&i) {
            let delta = format!("s{i} ");
            v.push(if !chunks {
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "syn-m2", "delta": delta,
                    "subagentRunId": "syn-s1"})
            } else if i == 100 {
                json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "syn-m2", "delta": delta,
                    "subagentRunId": "syn-s1"})
            } else {
                json!({"type": "TEXT_MESSAGE_CHUNK", "delta": delta, "subagentRunId": "syn-s1"})
            });
        }
        if i == 120 {
            if !chunks {
                v.push(json!({"type": "TEXT_MESSAGE_END", "messageId": "syn-m2",
                    "subagentRunId": "syn-s1"}));
            }
            v.push(json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "syn-s1"}));
        }
    }
    v.extend([
        json!({"type": "REASONING_MESSAGE_END", "messageId": "syn-rm"}),
        json!({"type": "REASONING_END", "messageId": "syn-rs"}),
        json!({"type": "TOOL_CALL_END", "toolCallId": "syn-c1"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "syn-m1"}),
        json!({"type": "STEP_FINISHED", "stepName": "plan"}),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "syn-tr1", "toolCallId": "syn-c1",
            "content": "ok"}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "syn-r1", "result": {"x": 1}}),
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "syn-r2"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "syn-m3", "role": "assistant"}),
    ]);
    for i in 150..230 {
        v.push(
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "syn-m3",
            "delta": format!("{i} ")}),
        );
        deltas(&mut v, i, 4);
    }
    v.extend([
        json!({"type": "TEXT_MESSAGE_END", "messageId": "syn-m3"}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "syn-r2"}),
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "syn-r3"}),
    ]);
    for i in 230..290 {
        deltas(&mut v, i, 3);
    }
    v.push(json!({"type": "RUN_ERROR", "message": "syn-r3 failed", "code": "SYNTHETIC"}));
    v
}

/// Prints the (e) table and checks that each burst reader was reset, and received a bridge,
/// at least twice.
pub(crate) fn check_resets(test: &str, rows: &[ResetRow]) {
    eprintln!("{test}: queue.max_events = {RESET_MAX_EVENTS}, queue.max_bytes = {RESET_MAX_BYTES}");
    eprintln!(
        "{:<10} {:>6} {:>6} {:>6} {:>7} {:>8} {:>9} {:>9}",
        "thread", "log", "body", "resets", "bridges", "crossing", "padding", "read"
    );
    for r in rows {
        eprintln!(
            "{:<10} {:>6} {:>6} {:>6} {:>7} {:>8} {:>9} {:>9}",
            r.name, r.log_events, r.body_events, r.resets, r.bridges, r.crossing, r.padding, r.read
        );
    }
    for r in rows {
        assert!(r.resets >= 2.0, "{}: reset {} times", r.name, r.resets);
        assert!(r.bridges >= 2, "{}: {} bridges received", r.name, r.bridges);
    }
}

/// Spawns the (e) broker: a memory log, `queue.max_events` 8, `queue.max_bytes` 8 KiB.
pub(crate) async fn resets_broker(strict_order: bool) -> BrokerProcess {
    BrokerProcess::spawn(&[
        ("AGUI_QUEUE__MAX_EVENTS", RESET_MAX_EVENTS.to_string()),
        ("AGUI_QUEUE__MAX_BYTES", RESET_MAX_BYTES.to_string()),
        ("AGUI_STRICT_ORDER", strict_order.to_string()),
    ])
    .await
}

/// (e) on `threads` (name, events retargeted to the thread, thread, catch-up cuts), one after
/// the other on `broker`; every multi-run thread must have received a bridge from one run to
/// the next.
pub(crate) async fn resets_test(
    test: &str,
    broker: &BrokerProcess,
    threads: &[(String, Vec<Value>, String, Vec<usize>)],
) {
    let base = broker.base();
    let disconnects = overflow_disconnects(&base).await;
    let mut comparisons = Vec::new();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (name, events, thread, catch_up) in threads {
        let (c, row) = scenario_resets(broker, name, events, thread, catch_up, &mut notes).await;
        comparisons.push(c);
        rows.push(row);
    }
    assert_eq!(
        overflow_disconnects(&base).await,
        disconnects,
        "every overflow was a reset, none a disconnect"
    );
    check_resets(test, &rows);
    for ((name, events, ..), r) in threads.iter().zip(&rows) {
        if run_ranges(events).len() > 1 {
            assert!(
                r.crossing >= 1,
                "{name}: no bridge from one run to the next"
            );
        }
    }
    assert!(notes.is_empty(), "every event accepted: {notes:?}");
    report(test, &comparisons, &notes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn burst_reader_reset_several_times_folds_like_the_log() {
    let broker = resets_broker(true).await;
    let mut threads: Vec<(String, Vec<Value>, String, Vec<usize>)> = recorded_folders()
        .into_iter()
        .map(|(name, mut events)| {
            let thread = broker::thread_id("conf-resets");
            common::fixtures::retarget(&mut events, &thread);
            (name, events, thread, Vec::new())
        })
        .collect();
    let thread = broker::thread_id("conf-resets");
    let events = synthetic_thread(&thread, false, false);
    threads.push(("synthetic".into(), events, thread, Vec::new()));
    resets_test(
        "burst_reader_reset_several_times_folds_like_the_log",
        &broker,
        &threads,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn burst_reader_reset_through_failing_state_deltas_folds_like_the_log() {
    let broker = resets_broker(false).await;
    let thread = broker::thread_id("conf-resets-failing");
    let events = synthetic_thread(&thread, true, false);
    resets_test(
        "burst_reader_reset_through_failing_state_deltas_folds_like_the_log",
        &broker,
        &[("synthetic".into(), events, thread, Vec::new())],
    )
    .await;
}

/// (e) with the reader caught up while a subagent's id-less `TEXT_MESSAGE_CHUNK` lane is open,
/// then reset while it is still open, then caught up again before the lane's next chunks: the
/// bridge closes the client's lane (a lane-closing `STATE_SNAPSHOT`, and its `MESSAGES_SNAPSHOT`
/// closes every lane) and must re-open it (a content-less chunk with the lane's `messageId`), or
/// the next id-less chunk, live after the bridge, is fatal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn burst_reader_reset_inside_a_chunk_lane_folds_like_the_log() {
    let broker = resets_broker(true).await;
    let thread = broker::thread_id("conf-resets-lane");
    let events = synthetic_thread(&thread, false, true);
    let inside = events
        .iter()
        .position(|e| e["type"] == "TEXT_MESSAGE_CHUNK" && e["delta"] == "s105 ")
        .expect("the chunk lane");
    resets_test(
        "burst_reader_reset_inside_a_chunk_lane_folds_like_the_log",
        &broker,
        &[("synthetic".into(), events, thread, vec![inside])],
    )
    .await;
}
