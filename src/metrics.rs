//! Every metric name of the broker (prefix `agui_`, PROTOCOL §9), described once at start-up, and
//! the Prometheus exporter handle that `/metrics` renders.
//!
//! Naming follows the Prometheus conventions: counters end in `_total`, units in the name,
//! bounded labels only (event type, outcome, cause, reason; never a thread id or an address).

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
/// backend, write_timeout, token_expired; PROTOCOL §9).
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

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder (once per process; later calls return the same handle)
/// and describes every metric.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &[
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    ],
                )
                .expect("bucket list is non-empty (a constant)");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // A second recorder in the same process (tests) is not an error: keep the handle.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            // Resolved once: the per-write histogram is on the hot path, and the macro looks
            // the key up in the registry at every call.
            let _ = PUBLISH_TO_WRITE_HANDLE.set(metrics::histogram!(PUBLISH_TO_WRITE));
            handle
        })
        .clone()
}

static PUBLISH_TO_WRITE_HANDLE: OnceLock<metrics::Histogram> = OnceLock::new();

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
}
