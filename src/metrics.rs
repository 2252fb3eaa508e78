//! Every metric name of the broker (prefix `agui_`, PROTOCOL §9), described once at start-up, and
//! the Prometheus exporter handle that `/metrics` renders.
//!
//! Naming follows the Prometheus conventions: counters end in `_total`, units in the name,
//! bounded labels only (event type, outcome, cause, reason; never a thread id or an address).
//!
//! Every family is on `/metrics` from start ([`export_zero_series`]): a counter series that
//! first appears at 1 is invisible to `rate()` and `increase()`, so an alert on the first
//! backend error or reset would never fire, and a rule on a family absent until then would not
//! even match. The process's own figures (CPU, resident memory, open file descriptors and their
//! limit) use the standard `process_*` names of Prometheus client libraries
//! ([`collect_process`]), so stock dashboards and rules work on them.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Gauge: open SSE connections on this node.
pub const CONNECTIONS: &str = "agui_connections";
/// Counter: events appended, by `type`.
pub const PUBLISHED: &str = "agui_events_published_total";
/// Counter: events handed to subscribers' queues by the fan-out, by `type`.
pub const DELIVERED: &str = "agui_events_delivered_total";
/// Counter: events refused at publish, by `reason` (invalid_event, too_large, ...).
pub const REJECTED: &str = "agui_events_rejected_total";
/// Counter: resumes with `Last-Event-ID`, by `outcome` (exact, prelude; PROTOCOL §9).
pub const RESUMES: &str = "agui_resumes_total";
/// Counter: events merged away by coalescing for lagging subscribers, by `type`.
pub const COALESCED: &str = "agui_events_coalesced_total";
/// Counter: `CUSTOM` and `RAW` events a reset dropped for a subscriber (no snapshot restates
/// them), counted when its client is told by the bridge's gap event, by `type` (PROTOCOL §5
/// "Reset").
pub const SKIPPED: &str = "agui_events_skipped_total";
/// Counter: snapshot-and-resets of subscribers, by `cause` (overflow, trimmed, epoch, ahead,
/// unknown, invalid, bridge; PROTOCOL §9).
pub const RESETS: &str = "agui_resets_total";
/// Counter: subscribers disconnected by the broker, by `cause` (overflow, discontinuity,
/// backend, write_timeout, token_expired, max_age, admin; PROTOCOL §9).
pub const DISCONNECTS: &str = "agui_disconnects_total";
/// Counter: backend operations that failed, by `backend` and `op`.
pub const BACKEND_ERRORS: &str = "agui_backend_errors_total";
/// Histogram: backend operation latency in seconds, by `backend` and `op`.
pub const BACKEND_LATENCY: &str = "agui_backend_latency_seconds";
/// Histogram: seconds from the node reading an event off the log to its frame being handed
/// to a subscriber's socket (measured per write, for the oldest frame of the write).
pub const PUBLISH_TO_WRITE: &str = "agui_publish_to_write_seconds";
/// Gauge: events pending in connection queues on this node (sum over connections).
pub const QUEUE_DEPTH: &str = "agui_queue_depth_events";
/// Gauge: connections whose queue was reset (snapshot-and-reset) and whose writer has not
/// come back for its bridge yet: subscribers that are not reading.
pub const RESETS_PENDING: &str = "agui_resets_pending";
/// Counter: entries found in the log that failed validation (skipped, never delivered).
pub const INVALID_ENTRIES: &str = "agui_log_invalid_entries_total";
/// Gauge: 1 while the log backend answers, 0 otherwise.
pub const BACKEND_UP: &str = "agui_backend_up";
/// Counter: runs this node closed with a `RUN_ERROR` (`code: "orphaned"`) after
/// `runs.orphan_timeout` without an event (PROTOCOL §2 "Orphaned runs").
pub const RUNS_ORPHANED: &str = "agui_runs_orphaned_total";
/// Counter: appends whose reply was lost and that were settled afterwards, by `outcome`
/// (`appended`, `not_appended`, `unknown`; PROTOCOL §2 "Unknown outcomes").
pub const APPEND_OUTCOMES: &str = "agui_append_outcomes_settled_total";
/// Gauge: seconds since the newest probe the Redis tail read back was written (the node
/// writes one about every second through its append path; grows while the tail is stalled).
pub const TAIL_PROBE_AGE: &str = "agui_redis_tail_probe_age_seconds";
/// Gauge: seconds from writing the newest probe the Redis tail read back to reading it (the
/// tail's lag behind the log).
pub const TAIL_LAG: &str = "agui_redis_tail_lag_seconds";
/// Gauge: 1 while the Redis tail is stalled (a probe not read back within
/// `redis_tail_stall`; `/readyz` answers 503), else 0.
pub const TAIL_STALLED: &str = "agui_redis_tail_stalled";
/// Counter: stalls the Redis tail detected and reconnected from, by `path` (`read`: the
/// reader's connection; `notes`: the subscription to the append notes).
pub const TAIL_STALLS: &str = "agui_redis_tail_stalls_total";
/// Gauge: entries in the Redis streams of the threads this node follows, summed (sampled
/// every ten `redis_block`s, at most 4,096 streams).
pub const STREAM_ENTRIES: &str = "agui_redis_followed_stream_entries";
/// Gauge: entries in the longest Redis stream this node follows (same sample).
pub const STREAM_ENTRIES_MAX: &str = "agui_redis_followed_stream_entries_max";
/// Gauge: bytes (`MEMORY USAGE`) of the Redis streams this node follows, summed (same sample).
pub const STREAM_BYTES: &str = "agui_redis_followed_stream_bytes";
/// Gauge: bytes of the largest Redis stream this node follows (same sample).
pub const STREAM_BYTES_MAX: &str = "agui_redis_followed_stream_bytes_max";

/// Counter: gateway runs whose `RUN_STARTED` was appended (PROTOCOL §11).
pub const RUNS_STARTED: &str = "agui_runs_started_total";
/// Counter: gateway runs ended, by `outcome` (finished, interrupted, error, failed, cancelled,
/// shutdown, abandoned; PROTOCOL §11).
pub const RUNS_ENDED: &str = "agui_runs_ended_total";
/// Counter: gateway runs ended by an upstream failure, by `cause` (the `RUN_ERROR` code:
/// upstream_unavailable, upstream_status, upstream_disconnected, upstream_timeout,
/// upstream_invalid).
pub const UPSTREAM_ERRORS: &str = "agui_upstream_errors_total";
/// Histogram: seconds from a gateway run's request to its end (its terminal event appended).
pub const RUN_DURATION: &str = "agui_run_duration_seconds";
/// Gauge: gateway runs active on this node.
pub const RUNS_ACTIVE: &str = "agui_runs_active";

/// Buckets of [`RUN_DURATION`], seconds: agent runs last from a second to many minutes.
const RUN_DURATION_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// Gauge: always 1, labelled with the broker's `version` (Cargo package version), so a
/// dashboard or an alert can tell which build each pod runs (mixed during a rollout).
pub const BUILD_INFO: &str = "agui_build_info";
/// Histogram: seconds from the log assigning an entry its id to this node's fan-out reading it
/// (the node's tail lag), per batch of the tail, for the batch's oldest entry. Only for a
/// backend whose entry ids carry the time (Redis: the server's clock in milliseconds, so
/// clock skew between Redis and the node adds to it); the memory log records nothing.
pub const APPEND_TO_READ: &str = "agui_append_to_read_seconds";

/// Buckets of [`APPEND_TO_READ`], seconds: milliseconds when the tail keeps up, up to minutes
/// when it stalls (the tail-lag alert fires at 5 s).
const APPEND_TO_READ_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Label values of `agui_resets_total{cause}` (PROTOCOL §9).
pub const RESET_CAUSES: &[&str] = &[
    "overflow", "trimmed", "epoch", "ahead", "unknown", "invalid", "bridge",
];
/// Label values of `agui_resumes_total{outcome}`.
pub const RESUME_OUTCOMES: &[&str] = &["exact", "prelude"];
/// Label values of `agui_disconnects_total{cause}`.
pub const DISCONNECT_CAUSES: &[&str] = &[
    "overflow",
    "discontinuity",
    "backend",
    "write_timeout",
    "token_expired",
    "max_age",
    "admin",
];
/// Label values of `agui_append_outcomes_settled_total{outcome}`.
pub const SETTLED_OUTCOMES: &[&str] = &["appended", "not_appended", "unknown"];
/// The `reason`s of `agui_events_rejected_total` that a well-formed publish can get for its
/// events or from the log (the error codes of PROTOCOL §2), exported from start.
pub const REJECT_REASONS: &[&str] = &[
    "invalid_event",
    "order_violation",
    "state_delta_not_applicable",
    "state_delta_ambiguous_path",
    "too_large",
    "backend_unavailable",
    "append_outcome_unknown",
    "contended",
];
/// Event types a reset can drop without a snapshot restating them (`agui_events_skipped_total`).
pub const SKIPPED_TYPES: &[&str] = &["CUSTOM", "RAW"];
/// The `op`s of `agui_backend_errors_total{backend="redis"}` and
/// `agui_backend_latency_seconds{backend="redis"}`.
pub const REDIS_OPS: &[&str] = &[
    "append",
    "producer",
    "checkpoint",
    "read",
    "head",
    "ping",
    "runs",
    "tail",
    "notify",
    "list",
    "summary",
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();

/// Installs the Prometheus recorder (once per process; later calls return the same handle)
/// and describes every metric.
pub fn install() -> PrometheusHandle {
    let handle = install_recorder();
    PROCESS.get_or_init(|| {
        let process = metrics_process::Collector::default();
        process.describe();
        process.collect();
        process
    });
    handle
}

/// [`install`] without the `process_*` collector, whose first read of `/proc` (through
/// `rustix`'s auxiliary vector) crashes under valgrind: for the `hot_path` bench's instruction
/// counts. Not part of the API.
#[doc(hidden)]
pub fn install_recorder() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &[
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    ],
                )
                .expect("bucket list is non-empty (a constant)")
                // A full-name match wins over the suffix match above: a stalled tail's lag
                // grows to seconds and minutes, past the latency buckets.
                .set_buckets_for_metric(
                    Matcher::Full(APPEND_TO_READ.into()),
                    APPEND_TO_READ_BUCKETS,
                )
                .expect("bucket list is non-empty (a constant)")
                // Likewise for the gateway's run durations.
                .set_buckets_for_metric(Matcher::Full(RUN_DURATION.into()), RUN_DURATION_BUCKETS)
                .expect("bucket list is non-empty (a constant)");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // A second recorder in the same process (tests) is not an error: keep the handle.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            // Resolved once: the per-write histogram is on the hot path, and the macro looks
            // the key up in the registry at every call.
            let _ = PUBLISH_TO_WRITE_HANDLE.set(metrics::histogram!(PUBLISH_TO_WRITE));
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            handle
        })
        .clone()
}

static PUBLISH_TO_WRITE_HANDLE: OnceLock<metrics::Histogram> = OnceLock::new();

/// The counters of one family with one bounded label (`type` of the event counters), resolved
/// once: the `counter!` macro builds and looks up its key at every call, ~1,100 instructions a
/// published or delivered event (callgrind, session 12 of `loadtest/REPORT.md`).
pub struct CounterTable {
    family: &'static str,
    label: &'static str,
    values: &'static [&'static str],
    handles: OnceLock<Box<[metrics::Counter]>>,
}

impl CounterTable {
    /// The counters `family{label="values[i]"}`.
    pub const fn new(
        family: &'static str,
        label: &'static str,
        values: &'static [&'static str],
    ) -> CounterTable {
        CounterTable {
            family,
            label,
            values,
            handles: OnceLock::new(),
        }
    }

    /// Adds `n` to the counter of `values[index]` (an index out of range is ignored).
    /// Before [`install_recorder`] the handles are not kept (they would count nowhere for
    /// good): each call goes through the macro, to whatever recorder there is.
    pub fn increment(&self, index: usize, n: u64) {
        let Some(&value) = self.values.get(index) else {
            return;
        };
        match self.handles() {
            Some(handles) => handles[index].increment(n),
            None => metrics::counter!(self.family, self.label => value).increment(n),
        }
    }

    fn handles(&self) -> Option<&[metrics::Counter]> {
        if let Some(h) = self.handles.get() {
            return Some(h);
        }
        HANDLE.get()?;
        Some(self.handles.get_or_init(|| {
            self.values
                .iter()
                .map(|&v| metrics::counter!(self.family, self.label => v))
                .collect()
        }))
    }
}

/// Exports a zero series for every bounded label set (and the unlabelled families), so that
/// `/metrics` lists every family from start. `event_types`: the AG-UI event types (the `type`
/// label of the event counters). `redis`: the log backend is Redis (its `op`s get series; a
/// memory-log node has no backend errors to show). Idempotent: adds 0 to counters and gauges.
pub fn export_zero_series(event_types: impl IntoIterator<Item = &'static str>, redis: bool) {
    use metrics::{counter, gauge, histogram};
    for t in event_types {
        counter!(PUBLISHED, "type" => t).increment(0);
        counter!(DELIVERED, "type" => t).increment(0);
        counter!(COALESCED, "type" => t).increment(0);
    }
    for &t in SKIPPED_TYPES {
        counter!(SKIPPED, "type" => t).increment(0);
    }
    for &r in REJECT_REASONS {
        counter!(REJECTED, "reason" => r).increment(0);
    }
    for &o in RESUME_OUTCOMES {
        counter!(RESUMES, "outcome" => o).increment(0);
    }
    for &c in RESET_CAUSES {
        counter!(RESETS, "cause" => c).increment(0);
    }
    for &c in DISCONNECT_CAUSES {
        counter!(DISCONNECTS, "cause" => c).increment(0);
    }
    for &o in SETTLED_OUTCOMES {
        counter!(APPEND_OUTCOMES, "outcome" => o).increment(0);
    }
    if redis {
        for &op in REDIS_OPS {
            counter!(BACKEND_ERRORS, "backend" => "redis", "op" => op).increment(0);
            // Registering a histogram exports it with empty buckets.
            let _ = histogram!(BACKEND_LATENCY, "backend" => "redis", "op" => op);
        }
        for path in ["read", "notes"] {
            counter!(TAIL_STALLS, "path" => path).increment(0);
        }
        for name in [
            TAIL_PROBE_AGE,
            TAIL_LAG,
            TAIL_STALLED,
            STREAM_ENTRIES,
            STREAM_ENTRIES_MAX,
            STREAM_BYTES,
            STREAM_BYTES_MAX,
        ] {
            gauge!(name).increment(0.0);
        }
    }
    counter!(INVALID_ENTRIES).increment(0);
    counter!(RUNS_ORPHANED).increment(0);
    gauge!(CONNECTIONS).increment(0.0);
    gauge!(QUEUE_DEPTH).increment(0.0);
    gauge!(RESETS_PENDING).increment(0.0);
    let _ = histogram!(APPEND_TO_READ);
    let _ = histogram!(RUN_DURATION);
}

/// Reads the process's CPU time, resident and virtual memory, open file descriptors and their
/// limit, threads and start time into the `process_*` gauges (Linux: from `/proc/self`; about
/// 10 µs plus one directory entry read per open descriptor). Called at each scrape of
/// `/metrics`. Before [`install`] this records nothing.
pub fn collect_process() {
    if let Some(p) = PROCESS.get() {
        p.collect();
    }
}

/// Records the tail lag of a batch whose oldest entry got its id at `appended_ms` (Unix time in
/// milliseconds, the log's clock) into [`APPEND_TO_READ`]. A time ahead of this node's clock
/// (skew) counts as 0.
pub fn record_append_to_read(appended_ms: u64) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    metrics::histogram!(APPEND_TO_READ).record(now_ms.saturating_sub(appended_ms) as f64 / 1000.0);
}

/// Records `writes` samples of [`PUBLISH_TO_WRITE`] at the seconds since `born` (writes done
/// one after the other just now: one clock read for the group). Before [`install`] this records
/// nothing.
pub fn record_publish_to_writes(born: Instant, writes: usize) {
    if let Some(h) = PUBLISH_TO_WRITE_HANDLE.get() {
        h.record_many(born.elapsed().as_secs_f64(), writes);
    }
}

/// Records one write's [`PUBLISH_TO_WRITE`] sample: the seconds since `born` (when the node read
/// the oldest frame of the write from the log).
pub fn record_publish_to_write(born: Instant) {
    record_publish_to_writes(born, 1);
}

/// How often [`run_upkeep`] folds recorded histogram samples into their buckets: often, so each
/// run is short. Folding costs ~30 ns per sample and runs on the node's runtime: every 5 s at
/// 100k writes/s it stalled the node for ~16 ms (measured), every 100 ms it takes ~0.3 ms.
pub const UPKEEP_INTERVAL: Duration = Duration::from_millis(100);

/// Folds histogram samples into buckets every [`UPKEEP_INTERVAL`] until the task is dropped.
/// The exporter keeps raw samples until then; without upkeep a node nobody scrapes would hold
/// every sample it ever recorded (one per write: ~1 MB/s at 100k writes/s).
pub async fn run_upkeep(handle: PrometheusHandle) {
    let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        handle.run_upkeep();
    }
}

fn describe() {
    describe_counter!(COALESCED, "Events merged away by coalescing, by type.");
    describe_counter!(RESETS, "Snapshot-and-resets of subscribers, by cause.");
    describe_counter!(
        SKIPPED,
        "CUSTOM and RAW events a reset dropped for a subscriber (told by its gap event), by type."
    );
    describe_gauge!(CONNECTIONS, "Open SSE connections on this node.");
    describe_counter!(PUBLISHED, "Events appended to thread logs, by type.");
    describe_counter!(DELIVERED, "Events handed to subscribers' queues, by type.");
    describe_counter!(REJECTED, "Events refused at publish, by reason.");
    describe_counter!(
        RESUMES,
        "Subscriptions resumed with Last-Event-ID, by outcome."
    );
    describe_counter!(
        DISCONNECTS,
        "Subscribers disconnected by the broker, by cause."
    );
    describe_counter!(
        BACKEND_ERRORS,
        "Failed log backend operations, by backend and op."
    );
    describe_histogram!(
        BACKEND_LATENCY,
        Unit::Seconds,
        "Log backend operation latency."
    );
    describe_histogram!(
        PUBLISH_TO_WRITE,
        Unit::Seconds,
        "From the node reading an event off the log to its frame written."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Events pending in connection queues on this node."
    );
    describe_gauge!(
        RESETS_PENDING,
        "Connections reset for overflow whose client has not read since (stalled subscribers)."
    );
    describe_counter!(
        INVALID_ENTRIES,
        "Log entries that failed validation and were skipped."
    );
    describe_gauge!(BACKEND_UP, "1 while the log backend answers, else 0.");
    describe_counter!(RUNS_STARTED, "Gateway runs whose RUN_STARTED was appended.");
    describe_counter!(RUNS_ENDED, "Gateway runs ended, by outcome.");
    describe_counter!(
        UPSTREAM_ERRORS,
        "Gateway runs ended by an upstream failure, by cause."
    );
    describe_histogram!(
        RUN_DURATION,
        Unit::Seconds,
        "From a gateway run's request to its terminal event."
    );
    describe_gauge!(RUNS_ACTIVE, "Gateway runs active on this node.");
    describe_counter!(
        RUNS_ORPHANED,
        "Runs closed with RUN_ERROR (orphaned) after runs.orphan_timeout without an event."
    );
    describe_counter!(
        APPEND_OUTCOMES,
        "Appends whose reply was lost, by what settling them found."
    );
    describe_gauge!(
        TAIL_PROBE_AGE,
        Unit::Seconds,
        "Age of the newest probe the Redis tail read back (grows while it is stalled)."
    );
    describe_gauge!(
        TAIL_LAG,
        Unit::Seconds,
        "From writing the newest probe the Redis tail read back to reading it."
    );
    describe_gauge!(TAIL_STALLED, "1 while the Redis tail is stalled, else 0.");
    describe_gauge!(
        STREAM_ENTRIES,
        "Entries in the Redis streams of the threads this node follows, summed."
    );
    describe_gauge!(
        STREAM_ENTRIES_MAX,
        "Entries in the longest Redis stream this node follows."
    );
    describe_gauge!(
        STREAM_BYTES,
        Unit::Bytes,
        "Bytes of the Redis streams of the threads this node follows, summed."
    );
    describe_gauge!(
        STREAM_BYTES_MAX,
        Unit::Bytes,
        "Bytes of the largest Redis stream this node follows."
    );
    describe_counter!(
        TAIL_STALLS,
        "Stalls the Redis tail detected and reconnected from, by path (read, notes)."
    );
    describe_gauge!(BUILD_INFO, "Always 1; the build's version as a label.");
    describe_histogram!(
        APPEND_TO_READ,
        Unit::Seconds,
        "From the log assigning an entry its id to this node's tail reading it (Redis only)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_table_counts_into_the_installed_recorder() {
        static TABLE: CounterTable =
            CounterTable::new("agui_test_table_total", "kind", &["a", "b"]);
        // Before the recorder (if no other test installed it yet): counted through the macro.
        TABLE.increment(0, 1);
        let handle = install_recorder();
        TABLE.increment(1, 2);
        TABLE.increment(1, 3);
        TABLE.increment(2, 1); // out of range: ignored
        let text = handle.render();
        assert!(
            text.contains("agui_test_table_total{kind=\"b\"} 5"),
            "{text}"
        );
    }
}
