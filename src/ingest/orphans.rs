//! The orphan sweep (PROTOCOL §2 "Orphaned runs", `runs.orphan_timeout`): a run that has had
//! no event for the timeout gets a terminal `RUN_ERROR` (`code: "orphaned"`) appended by the
//! broker, exactly once however many nodes notice it, so a producer that died mid-run (a
//! crashed worker, a node that died during a gateway run) never wedges its thread.
//!
//! How, on every node that runs it:
//! - the registry: a batch holding a `RUN_STARTED` notes its thread in the log's open-run
//!   registry ([`EventLog::note_open_run`]; Redis: one sorted set, so every node sees runs
//!   published anywhere) before it is appended;
//! - every `timeout / 4` (50 ms … 30 s) the sweep takes the threads noted at least `timeout`
//!   ago and looks at each one's head. A head this node has not seen yet is remembered (with
//!   the local time) and the thread noted again now, so it comes back after another
//!   `timeout`; a thread whose rebuilt fold shows no open run is forgotten (compare-and-delete:
//!   a run noted meanwhile stays);
//! - a head unchanged for `timeout` since this node remembered it: the fold is rebuilt at
//!   that head and, if its run is still open, `RUN_ERROR` is appended with
//!   [`EventLog::append_if`] on that very head. Another node closing the same run, or the
//!   producer publishing again, moves the head first, so the append is refused
//!   ([`LogError::Conflict`]) and nothing is appended twice or after a live event.
//!
//! A run is thus closed between `timeout` and about twice that after its last event.
//! `RUN_ERROR` is allowed with anything open (AGUI.md §5), so nothing else is appended; the
//! thread then takes the next `RUN_STARTED`.

use super::Ingest;
use crate::event::order::RunLifecycle;
use crate::event::{ThreadId, ValidEvent, validate_value};
use crate::fold::load_fold;
use crate::log::{AppendExtras, EventLog, LogError, LogHead};
use crate::metrics::RUNS_ORPHANED;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Threads looked at per sweep at most (the oldest noted first; the rest wait for the next).
const BATCH: usize = 256;

/// The registry's milliseconds: the wall clock read once, then advanced with Tokio's clock,
/// so that nodes agree (about) on times and tests can pause time.
#[derive(Debug)]
pub(super) struct Clock {
    wall_ms: u64,
    at: Instant,
}

impl Clock {
    pub(super) fn new() -> Self {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Clock {
            wall_ms,
            at: Instant::now(),
        }
    }

    /// Milliseconds since the Unix epoch, now.
    pub(super) fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.at.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.wall_ms.saturating_add(elapsed)
    }
}

impl Ingest {
    /// Starts this node's orphan sweep (module docs) with `timeout` (> 0) until `shutdown` is
    /// cancelled; from now on this node notes every `RUN_STARTED` it appends in the log's
    /// open-run registry. Errors of the log (Redis down) are logged and the sweep goes on.
    pub fn start_orphan_sweep(
        &self,
        timeout: Duration,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        self.shared.tracks_runs.store(true, Ordering::Relaxed);
        let mut sweep = Sweep {
            ingest: self.clone(),
            timeout,
            seen: HashMap::new(),
        };
        tokio::spawn(async move {
            let period = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                if let Err(e) = sweep.once().await {
                    tracing::warn!(error = %e, "orphan sweep: log unavailable; trying again");
                }
            }
        })
    }
}

/// A head this node saw, and when it first saw it.
struct Seen {
    head: LogHead,
    since: Instant,
}

/// One node's sweep state.
struct Sweep {
    ingest: Ingest,
    timeout: Duration,
    /// Heads this node saw on noted threads (pruned after `4 × timeout`).
    seen: HashMap<ThreadId, Seen>,
}

/// What [`close_if_orphaned`] found.
enum Verdict {
    /// `RUN_ERROR` appended.
    Closed,
    /// The thread has no open run (ended, or the log was recreated).
    NotRunning,
    /// The log moved since the head was seen (an event, or another node's `RUN_ERROR`).
    Moved,
}

impl Sweep {
    fn log(&self) -> &dyn EventLog {
        &*self.ingest.shared.log
    }

    fn now_ms(&self) -> u64 {
        self.ingest.shared.clock.now_ms()
    }

    /// One look at every thread noted at least `timeout` ago; returns how many runs it closed.
    async fn once(&mut self) -> Result<usize, LogError> {
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let keep = self.timeout.saturating_mul(4);
        self.seen.retain(|_, s| s.since.elapsed() < keep);
        let idle_since = self.now_ms().saturating_sub(timeout_ms);
        let mut closed = 0;
        for (thread, noted) in self.log().idle_open_runs(idle_since, BATCH).await? {
            let head = self.log().head(&thread).await?;
            let unchanged_since = self
                .seen
                .get(&thread)
                .filter(|s| same_place(&s.head, &head))
                .map(|s| s.since);
            let verdict = match unchanged_since {
                Some(since) if since.elapsed() >= self.timeout => {
                    close_if_orphaned(self.log(), &thread, head, self.timeout).await?
                }
                // Seen here less than `timeout` ago: wait.
                Some(_) => continue,
                // New to this node, or moved: remember it; forget a thread with no open run.
                None => {
                    if !run_open(self.log(), &thread).await? {
                        self.log().forget_open_run(&thread, noted).await?;
                        self.seen.remove(&thread);
                        continue;
                    }
                    Verdict::Moved
                }
            };
            match verdict {
                Verdict::Closed => {
                    closed += 1;
                    metrics::counter!(RUNS_ORPHANED).increment(1);
                    self.seen.remove(&thread);
                    self.log().forget_open_run(&thread, noted).await?;
                }
                Verdict::NotRunning => {
                    self.seen.remove(&thread);
                    self.log().forget_open_run(&thread, noted).await?;
                }
                Verdict::Moved => {
                    let head = self.log().head(&thread).await?;
                    self.seen.insert(
                        thread.clone(),
                        Seen {
                            head,
                            since: Instant::now(),
                        },
                    );
                    let now = self.now_ms();
                    self.log().note_open_run(&thread, now).await?;
                }
            }
        }
        Ok(closed)
    }
}

/// Whether two heads are the same place in the log (same epoch, same last entry).
fn same_place(a: &LogHead, b: &LogHead) -> bool {
    a.epoch == b.epoch && a.last == b.last
}

/// Whether the thread's rebuilt fold has a run open (`true` when the fold cannot be rebuilt:
/// the sweep then keeps looking rather than forget a run it cannot judge).
async fn run_open(log: &dyn EventLog, thread: &ThreadId) -> Result<bool, LogError> {
    let (_, fold) = load_fold(log, thread).await?;
    Ok(fold.is_none_or(|f| matches!(f.checker().open().run(), RunLifecycle::Running { .. })))
}

/// Appends the orphan `RUN_ERROR` if the thread is still at `head` with its run open.
async fn close_if_orphaned(
    log: &dyn EventLog,
    thread: &ThreadId,
    head: LogHead,
    timeout: Duration,
) -> Result<Verdict, LogError> {
    match judge(log, thread, head, timeout).await? {
        Judged::Orphan(append) => commit(log, thread, *append).await,
        Judged::Not(verdict) => Ok(verdict),
    }
}

/// The append that closes an orphan: the `RUN_ERROR`, and the head it goes on.
struct OrphanAppend {
    at: LogHead,
    error: ValidEvent,
    run_id: Value,
}

/// What [`judge`] decided.
enum Judged {
    /// Still at the head with its run open: append this.
    Orphan(Box<OrphanAppend>),
    /// Nothing to append.
    Not(Verdict),
}

/// Rebuilds the fold and, if the thread is still at `head` with its run open, prepares the
/// `RUN_ERROR` (checked against the schema and the order rules like any publish).
async fn judge(
    log: &dyn EventLog,
    thread: &ThreadId,
    head: LogHead,
    timeout: Duration,
) -> Result<Judged, LogError> {
    let (now, fold) = load_fold(log, thread).await?;
    if !same_place(&now, &head) {
        return Ok(Judged::Not(Verdict::Moved));
    }
    let Some(fold) = fold else {
        tracing::warn!(%thread, "orphan sweep: the thread's fold cannot be rebuilt (trimmed, no checkpoint); its run is left open");
        return Ok(Judged::Not(Verdict::NotRunning));
    };
    let RunLifecycle::Running { run_started } = fold.checker().open().run() else {
        return Ok(Judged::Not(Verdict::NotRunning));
    };
    let error = match validate_value(orphan_error(run_started, timeout), None) {
        Ok(valid) => valid,
        Err(e) => {
            // A runId the schema refuses cannot come from a RUN_STARTED that passed it.
            tracing::error!(%thread, error = %e.message, "orphan sweep: RUN_ERROR refused by the schema");
            return Ok(Judged::Not(Verdict::NotRunning));
        }
    };
    if let Err(rejection) = fold.check_batch([&error]) {
        tracing::error!(%thread, %rejection, "orphan sweep: RUN_ERROR refused by the order rules");
        return Ok(Judged::Not(Verdict::NotRunning));
    }
    Ok(Judged::Orphan(Box::new(OrphanAppend {
        at: now,
        error,
        run_id: run_started["runId"].clone(),
    })))
}

/// Appends the prepared `RUN_ERROR` on its head only ([`EventLog::append_if`]): if anything
/// was appended since (the producer, another node's `RUN_ERROR`), nothing is.
async fn commit(
    log: &dyn EventLog,
    thread: &ThreadId,
    append: OrphanAppend,
) -> Result<Verdict, LogError> {
    let OrphanAppend { at, error, run_id } = append;
    match log
        .append_if(thread, &[error], at, AppendExtras::default())
        .await
    {
        Ok(_) => {
            tracing::info!(%thread, %run_id, "orphan sweep: closed a run with no event for runs.orphan_timeout");
            Ok(Verdict::Closed)
        }
        Err(LogError::Conflict(_)) => Ok(Verdict::Moved),
        Err(e) => Err(e),
    }
}

/// The `RUN_ERROR` closing an orphaned run (PROTOCOL §2): `code` `orphaned`, and the run's id
/// under the broker's metadata key (`RUN_ERROR` has no `runId` field in AG-UI 1.0).
fn orphan_error(run_started: &Value, timeout: Duration) -> Value {
    json!({
        "type": "RUN_ERROR",
        "message": format!(
            "no event for {} (runs.orphan_timeout): the run's producer is presumed gone",
            humantime::format_duration(timeout)
        ),
        "code": "orphaned",
        "metadata": {"agui-fanout": {"runId": run_started["runId"]}}
    })
}

#[cfg(test)]
mod tests;
