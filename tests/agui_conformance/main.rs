//! What the broker sends, judged by the real `@ag-ui/client` 1.0.0 (PROTOCOL §4.5): every recorded
//! stream and every conformance stream whose `expect.outcome` is `completed` (spec 1.0 and 1.1)
//! is published, one event per POST, to a fresh thread of an in-process broker; what a client
//! received is kept byte for byte and played through the client's whole pipeline
//! (`tests/node/agui-fold.mjs`), then compared with the fold of the full log (`?from=start`),
//! itself checked against the fixture's `expect` block. Events the broker refuses at publish
//! (4xx) are skipped and printed.
//!
//! Scenarios (each a function from a source to [`Comparison`]s, so later ones can reuse them):
//! - (a) [`scenario_live`]: a subscriber connected before publishing reads the whole run; memory
//!   backend (recorded + conformance streams) and redis backend (recorded streams);
//! - (b) [`scenario_join_mid_run`]: subscribers that connect, without `Last-Event-ID`, after
//!   k = 1, 11, 21, … events were published: each starts with a prelude;
//! - (c) [`scenario_resume_after_trim`]: a subscriber resumes with an id that retention trimmed
//!   meanwhile: it gets a prelude (the client's messages and state carry over);
//! - (d) [`scenario_slow`]: a raw TCP subscriber that does not read while a recorded run is
//!   published is coalesced (PROTOCOL §5), and still folds like the log;
//! - (e) [`scenario_resets`]: a raw TCP subscriber that reads in bursts is reset several times,
//!   across run boundaries, and its one connection still passes and folds like the log;
//! - (f) `a_subscriber_cut_inside_a_bridge_resumes_and_folds_like_the_log`: a client cut off at
//!   every event boundary inside a reset bridge comes back with its last id and still passes.
//!
//! (d) and (e) run against a broker child process ([`BrokerProcess`]), so that its `/metrics`
//! counts this subscriber alone; see [`StalledSse`] for how the stall is made certain.
//!
//! Needs `node` and `npm ci --prefix tests/node` (scripts/test.sh does it) and, for the redis
//! pass, the test Redis.

mod bridge;
#[path = "../common/mod.rs"]
mod common;
mod resets;
mod slow;
mod stall;

use common::agui_client::{self as agui, Case, Comparison, Publisher, Source};
use common::broker::{self, BrokerProcess};
use common::sse_client;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use {resets::*, stall::*};

/// (b): a subscriber joins after k events for k = 1, 1 + JOIN_EVERY, 1 + 2 × JOIN_EVERY, …
const JOIN_EVERY: usize = 10;
/// (c): `retention.max_events` of the trimming broker.
const TRIM_TO: usize = 4;

/// Every source of the memory passes: recorded streams, then the conformance streams.
fn all_sources() -> Vec<Source> {
    let mut sources = agui::recorded_sources();
    sources.extend(agui::conformance_sources("spec-1.0"));
    sources.extend(agui::conformance_sources("spec-1.1"));
    sources
}

/// Notes the events of `label` the broker refused.
fn note_skipped(notes: &mut Vec<String>, label: &str, p: &Publisher) {
    for s in p.skipped_notes() {
        notes.push(format!("{label}: skipped at publish: {s}"));
    }
}

/// The full log of `thread` as one body, named after `label`.
async fn log_case(base: &str, thread: &str, last_id: &str, label: &str) -> Case {
    Case {
        name: format!("{label}/log"),
        thread_id: thread.to_string(),
        bodies: vec![agui::read_log(base, thread, last_id).await],
    }
}

/// A fixture's `expect` block, when the whole source was published (a refused event changes
/// what the block describes).
fn expect_if_complete(source: &Source, p: &Publisher) -> Option<serde_json::Value> {
    p.skipped
        .is_empty()
        .then(|| source.expect.clone())
        .flatten()
}

/// (a) A subscriber connected before the first event reads the whole run; it must pass and fold
/// like the full log.
async fn scenario_live(
    base: &str,
    backend: &str,
    source: &Source,
    notes: &mut Vec<String>,
) -> Vec<Comparison> {
    let label = format!("{backend}/live/{}", source.name);
    let thread = broker::thread_id("conf-live");
    let events = source.retargeted(&thread);
    let (until, rx) = watch::channel(None);
    let reader = agui::subscribe_reader(base, &thread, None, rx).await;
    let mut p = Publisher::new(base, &thread);
    p.publish_all(&events).await;
    note_skipped(notes, &label, &p);
    let Some(last) = p.last_id().map(str::to_string) else {
        notes.push(format!("{label}: no event accepted, nothing to compare"));
        reader.abort();
        return Vec::new();
    };
    until.send_replace(Some(last.clone()));
    let body = reader.await.expect("live reader");
    vec![Comparison {
        subject: agui::client_case(&format!("{label}/sub"), &thread, &[body]),
        reference: log_case(base, &thread, &last, &label).await,
        expect: expect_if_complete(source, &p),
        label,
    }]
}

/// (b) Subscribers that connect without `Last-Event-ID` after k = 1, 11, 21, … events were
/// published, each read to the last event: joining mid-run must pass and fold like the full
/// log (PROTOCOL §4.4: the connection begins with a prelude at the head).
async fn scenario_join_mid_run(
    base: &str,
    backend: &str,
    source: &Source,
    notes: &mut Vec<String>,
) -> Vec<Comparison> {
    let label = format!("{backend}/join/{}", source.name);
    let thread = broker::thread_id("conf-join");
    let events = source.retargeted(&thread);
    let (until, rx) = watch::channel(None);
    let mut readers = Vec::new();
    let mut p = Publisher::new(base, &thread);
    for (i, e) in events.iter().enumerate() {
        if i % JOIN_EVERY == 1 {
            readers.push((
                i,
                agui::subscribe_reader(base, &thread, None, rx.clone()).await,
            ));
        }
        p.publish(i, e).await;
    }
    note_skipped(notes, &label, &p);
    let Some(last) = p.last_id().map(str::to_string) else {
        notes.push(format!("{label}: no event accepted, nothing to compare"));
        readers.iter().for_each(|(_, r)| r.abort());
        return Vec::new();
    };
    until.send_replace(Some(last.clone()));
    let reference = log_case(base, &thread, &last, &label).await;
    let mut out = Vec::new();
    for (k, reader) in readers {
        let body = reader.await.expect("join reader");
        let label = format!("{label}/k={k}");
        out.push(Comparison {
            subject: agui::client_case(&format!("{label}/sub"), &thread, &[body]),
            reference: reference.clone(),
            expect: None,
            label,
        });
    }
    out
}

/// (c) A subscriber connected before the first event reads through event `cut`, disconnects,
/// misses `2 × TRIM_TO` events (so its id is trimmed on the broker at `trimmed`, whose
/// `retention.max_events` is [`TRIM_TO`]), resumes with that id and reads the rest. Its two
/// connections must pass as PROTOCOL §4.5 says and fold like the full log, read from the same
/// events published on the untrimmed broker at `full`. `None` when the source is too short.
async fn scenario_resume_after_trim(
    trimmed: &str,
    full: &str,
    source: &Source,
    cut: usize,
    notes: &mut Vec<String>,
) -> Option<Comparison> {
    let missed = 2 * TRIM_TO;
    if source.events.len() < cut + missed + 2 {
        return None;
    }
    let label = format!("memory/trimmed-resume/{}/cut={cut}", source.name);
    let thread = broker::thread_id("conf-trim");
    let events = source.retargeted(&thread);

    let mut reference = Publisher::new(full, &thread);
    reference.publish_all(&events).await;
    let last = reference.last_id()?.to_string();
    let reference = log_case(full, &thread, &last, &label).await;

    let mut p = Publisher::new(trimmed, &thread);
    let (until, rx) = watch::channel(None);
    let first = agui::subscribe_reader(trimmed, &thread, None, rx).await;
    for (i, e) in events.iter().enumerate().take(cut + 1) {
        p.publish(i, e).await;
    }
    let Some(cut_id) = p.last_id().map(str::to_string) else {
        notes.push(format!("{label}: nothing accepted before the cut"));
        first.abort();
        return None;
    };
    until.send_replace(Some(cut_id.clone()));
    let body1 = first.await.expect("first connection");
    for (i, e) in events.iter().enumerate().skip(cut + 1).take(missed) {
        p.publish(i, e).await;
    }
    let (until, rx) = watch::channel(None);
    let second = agui::subscribe_reader(trimmed, &thread, Some(&cut_id), rx).await;
    for (i, e) in events.iter().enumerate().skip(cut + 1 + missed) {
        p.publish(i, e).await;
    }
    note_skipped(notes, &label, &p);
    until.send_replace(p.last_id().map(str::to_string));
    let body2 = second.await.expect("second connection");
    Some(Comparison {
        subject: agui::client_case(&format!("{label}/sub"), &thread, &[body1, body2]),
        reference,
        expect: None,
        label,
    })
}

/// Prints `notes`, judges `comparisons` with the client and fails with every failed check.
fn report(test: &str, comparisons: &[Comparison], notes: &[String]) {
    for n in notes {
        println!("{test}: note: {n}");
    }
    let failures = agui::judge(comparisons);
    println!(
        "{test}: {} comparisons, {} failed checks",
        comparisons.len(),
        failures.len()
    );
    let failed_comparisons = comparisons
        .iter()
        .filter(|c| {
            failures
                .iter()
                .any(|f| f.starts_with(&format!("{}:", c.label)))
        })
        .count();
    assert!(
        failures.is_empty(),
        "{test}: {failed_comparisons} of {} comparisons failed ({} checks):\n{}",
        comparisons.len(),
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_live_subscriber_folds_like_the_log() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let mut comparisons = Vec::new();
    let mut notes = Vec::new();
    for source in all_sources() {
        comparisons.extend(scenario_live(&base, "memory", &source, &mut notes).await);
    }
    server.stop().await;
    report(
        "memory_live_subscriber_folds_like_the_log",
        &comparisons,
        &notes,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_live_subscriber_folds_like_the_log() {
    let server = broker::start_redis().await;
    let base = broker::base(server.addr);
    let mut comparisons = Vec::new();
    let mut notes = Vec::new();
    for source in agui::recorded_sources() {
        comparisons.extend(scenario_live(&base, "redis", &source, &mut notes).await);
    }
    server.stop().await;
    report(
        "redis_live_subscriber_folds_like_the_log",
        &comparisons,
        &notes,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_join_mid_run_folds_like_the_log() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let mut comparisons = Vec::new();
    let mut notes = Vec::new();
    for source in all_sources() {
        comparisons.extend(scenario_join_mid_run(&base, "memory", &source, &mut notes).await);
    }
    server.stop().await;
    report(
        "memory_join_mid_run_folds_like_the_log",
        &comparisons,
        &notes,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_resume_after_trim_folds_like_the_log() {
    let trimmed = broker::start(|c| c.retention.max_events = TRIM_TO).await;
    let full = broker::start_memory().await;
    let (trimmed_base, full_base) = (broker::base(trimmed.addr), broker::base(full.addr));
    let mut comparisons = Vec::new();
    let mut notes = Vec::new();
    for source in all_sources() {
        let n = source.events.len();
        let mut cuts = vec![2, n / 2];
        cuts.dedup();
        for cut in cuts {
            comparisons.extend(
                scenario_resume_after_trim(&trimmed_base, &full_base, &source, cut, &mut notes)
                    .await,
            );
        }
    }
    trimmed.stop().await;
    full.stop().await;
    report(
        "memory_resume_after_trim_folds_like_the_log",
        &comparisons,
        &notes,
    );
}
