//! The orphan sweep on the memory log, on paused time: a silent run is closed once, even by
//! two sweeps sharing the log (two nodes); a run that keeps publishing, or that ended, is
//! left alone; the thread takes the next run.

use super::*;
use crate::event::validate_value;
use crate::log::memory::MemoryLog;
use crate::log::{ReadFrom, Retention};
use std::sync::Arc;

const TIMEOUT: Duration = Duration::from_secs(60);

fn thread() -> ThreadId {
    ThreadId::parse("t-orphan").expect("a thread id")
}

async fn publish(ingest: &Ingest, events: &[Value]) {
    let valid: Vec<_> = events
        .iter()
        .map(|e| validate_value(e.clone(), None).expect("a valid event"))
        .collect();
    ingest
        .append(&thread(), &valid, None)
        .await
        .expect("appended");
}

async fn types(log: &dyn EventLog) -> Vec<String> {
    log.read(&thread(), ReadFrom::Start, 1000)
        .await
        .expect("read")
        .iter()
        .map(|e| e.event_type.as_str().to_string())
        .collect()
}

async fn last_event(log: &dyn EventLog) -> Value {
    let entries = log
        .read(&thread(), ReadFrom::Start, 1000)
        .await
        .expect("read");
    serde_json::from_slice(&entries.last().expect("an entry").json).expect("JSON")
}

fn started(run: &str) -> Value {
    json!({"type": "RUN_STARTED", "threadId": "t-orphan", "runId": run})
}

/// Two ingests over one log: two nodes sharing Redis, as far as the sweep can tell.
fn two_nodes() -> (Arc<dyn EventLog>, Ingest, Ingest) {
    let log: Arc<dyn EventLog> = Arc::new(MemoryLog::new(Retention::default()));
    let a = Ingest::new(log.clone(), true, 10_000);
    let b = Ingest::new(log.clone(), true, 10_000);
    (log, a, b)
}

#[tokio::test(start_paused = true)]
async fn a_silent_run_is_closed_once_by_two_sweeps_and_the_thread_takes_the_next_run() {
    let (log, a, b) = two_nodes();
    let stop = CancellationToken::new();
    a.start_orphan_sweep(TIMEOUT, stop.clone());
    b.start_orphan_sweep(TIMEOUT, stop.clone());
    publish(
        &a,
        &[
            started("r1"),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "half a"}),
        ],
    )
    .await;

    tokio::time::sleep(TIMEOUT - Duration::from_secs(1)).await;
    assert_eq!(types(&*log).await.len(), 3, "not before the timeout");

    // Closed between one and about two timeouts after the last event.
    tokio::time::sleep(TIMEOUT * 2).await;
    let got = types(&*log).await;
    assert_eq!(
        got.iter().filter(|t| *t == "RUN_ERROR").count(),
        1,
        "{got:?}"
    );
    let error = last_event(&*log).await;
    assert_eq!(error["code"], "orphaned");
    assert_eq!(error["metadata"]["agui-fanout"]["runId"], "r1");

    // Much later, still one; the registry is empty again.
    tokio::time::sleep(TIMEOUT * 10).await;
    assert_eq!(types(&*log).await.len(), 4);
    assert_eq!(
        log.idle_open_runs(u64::MAX, 10).await.expect("registry"),
        []
    );

    // Either node takes the next run (strict order: it would be 409 with r1 open).
    publish(&b, &[started("r2")]).await;
    assert_eq!(
        types(&*log).await.last().map(String::as_str),
        Some("RUN_STARTED")
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_run_that_keeps_publishing_or_ended_is_left_alone() {
    let (log, a, _) = two_nodes();
    let stop = CancellationToken::new();
    a.start_orphan_sweep(TIMEOUT, stop.clone());
    publish(&a, &[started("r1")]).await;
    // An event every half timeout for ten timeouts: never idle for a whole timeout.
    for i in 0..20 {
        tokio::time::sleep(TIMEOUT / 2).await;
        publish(&a, &[json!({"type": "CUSTOM", "name": "tick", "value": i})]).await;
    }
    publish(
        &a,
        &[json!({"type": "RUN_FINISHED", "threadId": "t-orphan", "runId": "r1"})],
    )
    .await;
    tokio::time::sleep(TIMEOUT * 5).await;
    let got = types(&*log).await;
    assert_eq!(got.len(), 22, "{got:?}");
    assert!(!got.iter().any(|t| t == "RUN_ERROR"));
    assert_eq!(
        log.idle_open_runs(u64::MAX, 10).await.expect("registry"),
        []
    );
    stop.cancel();
}

/// Two nodes that judged the same head a run's orphan: only the first append lands.
#[tokio::test(start_paused = true)]
async fn two_nodes_closing_at_once_append_one_run_error() {
    let (log, a, _) = two_nodes();
    publish(&a, &[started("r1")]).await;
    let head = log.head(&thread()).await.expect("head");
    let judged = [
        judge(&*log, &thread(), head, TIMEOUT).await.expect("log"),
        judge(&*log, &thread(), head, TIMEOUT).await.expect("log"),
    ];
    let mut verdicts = Vec::new();
    for j in judged {
        let Judged::Orphan(append) = j else {
            panic!("both nodes judge the silent run an orphan")
        };
        verdicts.push(commit(&*log, &thread(), *append).await.expect("log"));
    }
    assert!(matches!(verdicts[..], [Verdict::Closed, Verdict::Moved]));
    assert_eq!(types(&*log).await, ["RUN_STARTED", "RUN_ERROR"]);
}

/// The producer publishing between the sweep's judgement and its append wins.
#[tokio::test(start_paused = true)]
async fn the_producer_publishing_again_before_the_append_wins() {
    let (log, a, _) = two_nodes();
    publish(&a, &[started("r1")]).await;
    let head = log.head(&thread()).await.expect("head");
    let Judged::Orphan(append) = judge(&*log, &thread(), head, TIMEOUT).await.expect("log") else {
        panic!("a silent run is an orphan")
    };
    publish(&a, &[json!({"type": "CUSTOM", "name": "late", "value": 1})]).await;
    let verdict = commit(&*log, &thread(), *append).await.expect("log");
    assert!(matches!(verdict, Verdict::Moved));
    assert_eq!(types(&*log).await, ["RUN_STARTED", "CUSTOM"]);
    // A sweep that looked before the producer's event sees the head moved.
    let verdict = close_if_orphaned(&*log, &thread(), head, TIMEOUT)
        .await
        .expect("log");
    assert!(matches!(verdict, Verdict::Moved));
}

#[tokio::test(start_paused = true)]
async fn without_a_sweep_nothing_is_noted() {
    let (log, a, _) = two_nodes();
    publish(&a, &[started("r1")]).await;
    assert_eq!(
        log.idle_open_runs(u64::MAX, 10).await.expect("registry"),
        []
    );
}
