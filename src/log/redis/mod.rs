//! The `redis` log backend: thread logs as Redis Streams, shared by every node
//! (PROTOCOL §1, §4, §7).
//!
//! # Key and entry format (for producers that write to Redis directly, PROTOCOL §2)
//!
//! With the default prefix `agui`, thread `<threadId>` owns three keys in one hash slot (the
//! `{threadId}` hash tag, so Redis Cluster keeps them together), and short-lived outcome keys
//! in the same slot:
//!
//! - `agui:{<threadId>}:log`: a stream; one entry per AG-UI event, with one field `e` holding
//!   the event as compact UTF-8 JSON (one object, `threadId` if present equal to the thread).
//!   Entry IDs are auto-generated (`XADD … * e <json>`); they are the position part of the SSE
//!   event id. Other fields are ignored.
//! - `agui:{<threadId>}:meta`: a hash; field `epoch` is the log's epoch as 8 lowercase hex
//!   digits; field `seen` (`1`) records that the stream existed under this epoch, so a stream
//!   deleted on its own (its meta surviving) still gets a new epoch.
//! - `agui:{<threadId>}:ckpt`: a hash, the thread's checkpoints (PROTOCOL §6, written by the
//!   broker only): `pos` (entry ID), `events` (JSON array of AG-UI events, the thread's fold
//!   at `pos` restated) and `ord` (the stream's `entries-added` when the `pos` entry was
//!   added) for the promoted checkpoint; `next_pos`, `next_events`, `next_ord` for the
//!   pending one. It belongs to the epoch: whenever the broker creates a new epoch for the
//!   thread, it deletes this key in the same script.
//! - `agui:{<threadId>}:o:<token>`: a string, one per append (`<token>`: 32 random hex digits
//!   drawn for it), written by the append script: `<epoch> <entry id>…`, living
//!   `2 × (op_timeout + outcome_timeout)`; or `-`, a fence living 30 minutes (see "Unknown
//!   outcomes").
//!
//! # Unknown outcomes
//! An append whose reply is lost (`op_timeout` passed, or the connection failed after the
//! script may have been sent) may still run: Redis may be stalled with the script in its
//! input (SIGSTOP, `DEBUG SLEEP`, a long command), or may have run it and lost the
//! connection. The append is settled before the broker answers: on another connection
//! (retried, within `outcome_timeout`), `outcome.lua` returns the append's record (it ran: its
//! ids) or fences the token, so that the append script, if it reaches Redis later, finds the
//! key and appends nothing. What settles it is final either way. If Redis does not answer
//! within `outcome_timeout`, the append's outcome is unknown ([`LogError::OutcomeUnknown`]).
//! A refused connection or an error reply from Redis means the script did not run. The cost
//! on every append: one `GET` and one `SET … PX` in the same script. The same key makes the append safe to
//! repeat: a repeated call (the cluster connection retries a call whose connection dropped)
//! finds its own record and returns it, appending nothing again.
//!
//! # Retention
//! See [`Retention`]. An append that carries a checkpoint candidate (`append_if`), in the same
//! script: if a pending checkpoint exists it becomes the checkpoint (`next_*` moved to `pos`,
//! `events`, `ord`) and `XTRIM <log> MINID <pos + 1>` (exact: `MINID` removes IDs strictly
//! lower, hence the successor ID `<ms>-<seq + 1>`) removes every entry at or before it; the
//! candidate is then stored as `next_*` at the batch's last entry ID. `XADD … MAXLEN ~` caps
//! the stream at `max_events` (and, since `~` removes whole stream nodes only and a Redis
//! configured with large nodes trims nothing, an exact `XTRIM … MAXLEN` once the stream holds
//! more than twice that), or at `4 * max_events` once the `ckpt` key exists (a safety net
//! only). With `max_age`, a pending checkpoint whose `next_pos` milliseconds are older
//! than the server's `TIME` minus `max_age` is promoted (and trimmed to) at append time. With
//! `idle_ttl`, every append `PEXPIRE`s the three keys; expired keys mean a new epoch.
//! Trimming moves `entries-added` past `length`; when exactly the entries added before the
//! checkpoint are gone (`length == entries-added - ord`), the highest removed position is the
//! checkpoint's `pos`, so resuming after the checkpoint is exact.
//!
//! Producers may `XADD` to the stream without touching the meta hash: the broker creates the
//! epoch the first time it looks at the thread. Entries it cannot validate (missing `e`, not
//! JSON, not a valid AG-UI event) are logged, counted (`agui_log_invalid_entries_total`) and
//! skipped, never delivered. A direct `XADD` sends no append note (below), so its entry reaches
//! live subscribers within `block` (default 1 s) plus one read, or at once when the broker
//! appends to the same thread after it.
//!
//! The channel `<prefix>:appended` belongs to the broker like the meta and checkpoint hashes:
//! a note published there whose `prev` matches a node's cursor is delivered as it is, without
//! validation. With Redis ACLs, give direct producers `XADD` on the `…:log` keys and no
//! channel permission.
//!
//! # Commands
//! Appends, reads, heads and checkpoints are Lua scripts (one round trip, atomic):
//! `HMGET`/`HSET`/`HDEL`/`DEL` on the meta and checkpoint hashes, `XADD … MAXLEN ~ <n> * e
//! <json>`, `XTRIM … MINID`, `TIME`, `PEXPIRE`, `XRANGE`, and `XINFO STREAM` for the stream's
//! `last-generated-id`, `max-deleted-entry-id`, `recorded-first-entry-id`, `length` and
//! `entries-added` (Redis 7.0 or newer is required), from which the highest trimmed position
//! is derived (Redis 7.0 moves `max-deleted-entry-id` on `XDEL` only).
//!
//! # Tail
//! The append script also `PUBLISH`es each batch on `<prefix>:appended` (format: [`notify`]):
//! thread, epoch, the stream's `last-generated-id` before the batch (`prev`), and the entries. Each node's tail `SUBSCRIBE`s on a second connection. A note whose `prev` is the
//! follow's cursor (same epoch) is exactly the next part of the log and is delivered without
//! reading Redis; any other note of a followed thread makes the tail read that stream after its
//! cursor (one read script per thread, pipelined: epoch, head, `XRANGE` and the lookup of the
//! cursor's own entry atomically; a cursor the stream does not hold is a rolled-back tail). Every
//! `block`, one non-blocking `XREAD COUNT n STREAMS <every followed stream> <cursors>` picks up
//! what no note announced (direct `XADD`s). Pub/Sub is at-most-once, so notes are hints: when
//! the subscription is lost (or the tail falls 4,096 notes behind), the tail goes back to one
//! `XREAD COUNT n BLOCK ms STREAMS …` over every followed stream, woken early with `CLIENT
//! UNBLOCK <id> TIMEOUT` when a thread is followed, until it is subscribed again; right after
//! subscribing it reads every followed stream once. The cursor and the stream stay the truth.
//! A probe written through the append connection about every second must come back through
//! both the reader and the subscription; a way it does not come back within `stall_after`
//! reconnects, and [`EventLog::ping`] fails meanwhile (`tail/probe.rs`).
//!
//! Redis Cluster (`conn.rs`, found at start with `CLUSTER INFO`; the URL may list seeds):
//! each script touches the keys of one thread (one slot), sent by the redis crate's cluster
//! connection to the slot's primary, following `MOVED`/`ASK`. A cluster refuses a command over
//! several slots (`CROSSSLOT`, even on one primary), so there the tail reads each primary on
//! a dedicated connection of its own with one pipeline of per-slot commands per round trip
//! (`tail/cluster.rs`) and never blocks: without notes it reads every `block`. Notes are
//! sharded there: `SPUBLISH` on the thread's own channel `<prefix>:{<threadId>}:n`, one
//! `SSUBSCRIBE` per followed thread (`tail/notes.rs`).
//!
//! # Layout
//! - this file: [`RedisLog`] and its [`EventLog`] impl (connection, deadlines, metrics);
//! - `scripts.rs` + `scripts/*.lua`: the Lua scripts and their typed arguments;
//! - `resp.rs`: reply decoding and the validation of stored entries;
//! - `connect.rs`: the clients from the URL(s) and TLS files, single Redis or cluster;
//!   `conn.rs`: the shared connection of either kind;
//! - `tail.rs` (+ `tail/reads.rs`, `tail/cluster.rs`, `tail/probe.rs`): the node's tail;
//!   `notify.rs`: the append notes;
//! - `runs.rs`: the open-run registry of the orphan sweep (`<prefix>:runs`);
//! - `list.rs`: the admin API's thread list (`SCAN`) and summaries (`summary.lua`).

mod conn;
mod connect;
mod list;
mod notify;
mod resp;
mod runs;
mod scripts;
mod tail;
#[cfg(test)]
mod tests;

use super::{
    AppendExtras, Checkpoint, Epoch, EventId, EventLog, ListCursor, LogEntry, LogError, LogHead,
    ReadFrom, ResumeCheck, Retention, Tail, TailItem, ThreadPage, ThreadSummary, check_resumable,
};
use crate::event::{ThreadId, ValidEvent};
use crate::metrics::{APPEND_OUTCOMES, BACKEND_ERRORS, BACKEND_LATENCY, BACKEND_UP};
use bytes::Bytes;
use conn::{Shared, Target};
pub use connect::RedisTls;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterConfig;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Value};
use resp::{
    ReadPage, Settled, array, bytes_of, decode_entries, malformed, parse_append_reply, parse_head,
    parse_outcome_reply, parse_pos, parse_read_reply, string, unavailable,
};
use scripts::{
    AppendArgs, AppendToken, HeadArgs, Keys, OutcomeArgs, ProducerArgs, ReadArgs, ScriptArgs,
    Scripts,
};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Settings of a [`RedisLog`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisLogConfig {
    /// Redis URL, `redis://[user:pass@]host:port[/db]` or `rediss://…` (TLS).
    pub url: String,
    /// TLS files of a `rediss://` URL (CA, client certificate); default: the system's trust
    /// store, no client certificate.
    pub tls: RedisTls,
    /// First part of every key (`<prefix>:{<threadId>}:log`); must not contain `{` or `}`.
    pub prefix: String,
    /// How much each thread keeps and for how long (`XADD … MAXLEN ~`, checkpoints with
    /// `XTRIM … MINID`, `PEXPIRE`; see [`Retention`]).
    pub retention: Retention,
    /// How long the tail's `XREAD BLOCK` waits for new entries; also the period of the tail's
    /// epoch checks on quiet threads. At least 1 ms.
    pub block: Duration,
    /// Largest number of entries the tail reads per thread per `XREAD` (`COUNT`).
    pub read_count: usize,
    /// How long the tail may go without reading back the node's own probe before it counts
    /// as stalled (it reconnects; [`EventLog::ping`] fails meanwhile). Raised to three times
    /// `block`. See `tail/probe.rs`.
    pub stall_after: Duration,
    /// Deadline of every append, read, head and ping (connecting included): past it the call
    /// returns [`LogError::Unavailable`] instead of waiting for Redis (an append is settled
    /// first: `outcome_timeout`).
    pub op_timeout: Duration,
    /// How long an append whose reply was lost (past `op_timeout`, or a connection that
    /// failed after sending) may spend settling whether it ran, on another connection, before
    /// it returns [`LogError::OutcomeUnknown`] (module docs, "Unknown outcomes").
    pub outcome_timeout: Duration,
}

impl RedisLogConfig {
    /// The default settings for `url`: prefix `agui`, default retention, 1 s block, 512 entries
    /// per read, a stall after 5 s, 2 s operation timeout, 5 s to settle an append's lost
    /// reply.
    pub fn new(url: impl Into<String>) -> Self {
        RedisLogConfig {
            url: url.into(),
            tls: RedisTls::default(),
            prefix: "agui".into(),
            retention: Retention::default(),
            block: Duration::from_secs(1),
            read_count: 512,
            stall_after: Duration::from_secs(5),
            op_timeout: Duration::from_secs(2),
            outcome_timeout: Duration::from_secs(5),
        }
    }

    /// How long an append's outcome record lives, in ms: twice the longest time after the
    /// append was sent that the broker may still ask for it (`op_timeout + outcome_timeout`).
    fn record_ttl_ms(&self) -> u64 {
        let ms = (self.op_timeout + self.outcome_timeout).as_millis() * 2;
        u64::try_from(ms.max(1)).unwrap_or(u64::MAX)
    }
}

/// How long a fence (an append settled as "not appended") lives, in ms: longer than any
/// sent command can still reach Redis (Linux gives up retransmitting after about 15 minutes,
/// `tcp_retries2`). Fences are written only when a reply was lost, so they cost nothing in
/// normal operation.
const FENCE_TTL_MS: u64 = 30 * 60 * 1000;

/// Pause between attempts to settle an append while Redis refuses connections.
const SETTLE_RETRY: Duration = Duration::from_millis(100);

impl Default for RedisLogConfig {
    /// [`RedisLogConfig::new`] with `redis://127.0.0.1:6379`.
    fn default() -> Self {
        RedisLogConfig::new("redis://127.0.0.1:6379")
    }
}

/// Thread logs in Redis Streams (format: see the module docs). Cheap to clone (an `Arc`
/// inside); every clone shares one multiplexed connection that reconnects on its own.
#[derive(Clone)]
pub struct RedisLog {
    inner: Arc<Inner>,
}

struct Inner {
    /// A single Redis or a cluster (decided at start).
    target: Target,
    /// The connection every call shares (the tail reads on its own).
    conn: Shared,
    config: RedisLogConfig,
    scripts: Scripts,
    /// The append-note channel, `<prefix>:appended` ([`notify::channel`]).
    channel: String,
    /// The connection appends are settled on (never the shared one, whose reply was lost),
    /// opened on the first need and replaced after any error.
    settler: tokio::sync::Mutex<Option<Shared>>,
    /// The tail's liveness probe (written and read only while the tail runs).
    probe: Arc<tail::Probe>,
}

impl RedisLog {
    /// Builds the log and its connection manager without waiting for Redis: the broker must
    /// start (and report not ready) while Redis is down. One `PING` is tried (bounded by
    /// `op_timeout`) so the start-up log says whether Redis answered. Calls made while Redis
    /// is unreachable fail with [`LogError::Unavailable`] within `op_timeout`; the connection
    /// is re-established by the next call once Redis is back.
    ///
    /// # Errors
    /// [`LogError::Unavailable`] only for a configuration that can never work: a malformed
    /// URL, a prefix containing `{` or `}` (it would break the hash tag), TLS files that
    /// cannot be read, or a TLS handshake that fails (e.g. a server certificate the CA does
    /// not sign: no retry would fix it).
    pub async fn connect(config: RedisLogConfig) -> Result<RedisLog, LogError> {
        if config.prefix.contains(['{', '}']) {
            return Err(LogError::Unavailable(format!(
                "redis key prefix {:?} must not contain braces",
                config.prefix
            )));
        }
        let target = connect::resolve(&config).await?;
        let conn = match &target {
            Target::Single(client) => {
                // No hidden retries: a call during an outage fails fast (connection refused)
                // or at `op_timeout`; the connection manager reconnects on the next call.
                let manager_config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.op_timeout))
                    .set_response_timeout(Some(config.op_timeout))
                    .set_number_of_retries(0);
                Shared::Manager(
                    ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
                        .map_err(unavailable)?,
                )
            }
            Target::Cluster { cluster, .. } => Shared::Cluster(
                cluster.get_pending_async_connection_with_config(
                    ClusterConfig::new()
                        .set_connection_timeout(config.op_timeout)
                        .set_response_timeout(config.op_timeout),
                ),
            ),
        };
        let probe = Arc::new(tail::Probe::new(
            &config.prefix,
            config.stall_after,
            config.block.max(Duration::from_millis(1)),
        ));
        let log = RedisLog {
            inner: Arc::new(Inner {
                probe,
                target,
                conn,
                channel: notify::channel(&config.prefix),
                config,
                scripts: Scripts::new(),
                settler: tokio::sync::Mutex::new(None),
            }),
        };
        match log.ping().await {
            Ok(()) => {
                tracing::info!(prefix = %log.inner.config.prefix, "redis log backend answers")
            }
            Err(e) => tracing::warn!(error = %e, "redis log backend not reachable yet; will retry"),
        }
        Ok(log)
    }

    /// The configuration this log was built with.
    pub fn config(&self) -> &RedisLogConfig {
        &self.inner.config
    }

    /// [`HeadArgs`] of `keys`, with a fresh epoch drawn for a thread that needs one.
    fn head_args<'a>(&self, keys: &'a Keys) -> HeadArgs<'a> {
        HeadArgs {
            keys,
            fresh_epoch: Epoch::random(),
            idle_ttl_ms: self.inner.config.retention.idle_ttl_ms(),
        }
    }

    fn keys(&self, thread: &ThreadId) -> Keys {
        Keys::new(&self.inner.config.prefix, thread)
    }

    /// Runs one backend operation under `op_timeout`, recording latency, errors and `up`.
    async fn timed<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, LogError>>,
    ) -> Result<T, LogError> {
        self.timed_or(op, LogError::Unavailable, fut).await
    }

    /// [`RedisLog::timed`], with `lost` building the error of a call past `op_timeout`.
    async fn timed_or<T>(
        &self,
        op: &'static str,
        lost: fn(String) -> LogError,
        fut: impl Future<Output = Result<T, LogError>>,
    ) -> Result<T, LogError> {
        let started = Instant::now();
        let timeout = self.inner.config.op_timeout;
        let result = match tokio::time::timeout(timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(lost(format!("redis {op} timed out after {timeout:?}"))),
        };
        metrics::histogram!(BACKEND_LATENCY, "backend" => "redis", "op" => op)
            .record(started.elapsed().as_secs_f64());
        match &result {
            Err(LogError::Unavailable(msg) | LogError::OutcomeUnknown(msg)) => {
                metrics::counter!(BACKEND_ERRORS, "backend" => "redis", "op" => op).increment(1);
                metrics::gauge!(BACKEND_UP).set(0.0);
                tracing::debug!(op, error = %msg, "redis operation failed");
            }
            _ => metrics::gauge!(BACKEND_UP).set(1.0),
        }
        result
    }

    /// One page of the read script: the head, up to `count` raw entries from `start`, and
    /// whether the stream holds the entry `start` is after.
    async fn read_page(
        &self,
        keys: &Keys,
        from: ReadFrom,
        count: usize,
    ) -> Result<ReadPage, LogError> {
        let args = ReadArgs {
            keys,
            fresh_epoch: Epoch::random(),
            after: match from {
                ReadFrom::Start => None,
                ReadFrom::After(id) => Some(id.pos),
            },
            count,
            idle_ttl_ms: self.inner.config.retention.idle_ttl_ms(),
        };
        let reply = self
            .read_script(&self.inner.scripts.read, &args)
            .await
            .map_err(unavailable)?;
        parse_read_reply(&reply)
    }
}

impl RedisLog {
    /// Settles an append of `expected` events whose reply was lost (`why`), by its outcome key:
    /// `outcome.lua` on the settling connection, retried until `outcome_timeout`. Counted in
    /// `agui_append_outcomes_settled_total{outcome}`.
    ///
    /// # Errors
    /// [`LogError::Unavailable`] when it did not run (and now never will: fenced);
    /// [`LogError::OutcomeUnknown`] when Redis did not answer in time.
    async fn settle(
        &self,
        outcome: &str,
        expected: usize,
        why: String,
    ) -> Result<Vec<EventId>, LogError> {
        let started = Instant::now();
        let bound = self.inner.config.outcome_timeout;
        let deadline = tokio::time::Instant::now() + bound;
        let args = OutcomeArgs {
            outcome,
            fence_ttl_ms: FENCE_TTL_MS,
        };
        let mut last = String::from("no answer");
        let settled = loop {
            let attempt = tokio::time::timeout_at(deadline, self.ask_outcome(&args)).await;
            match attempt {
                Ok(Ok(reply)) => match parse_outcome_reply(&reply, expected) {
                    Ok(settled) => break Some(settled),
                    Err(e) => {
                        last = e.to_string();
                        break None;
                    }
                },
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => break None,
            }
            if tokio::time::Instant::now() + SETTLE_RETRY >= deadline {
                break None;
            }
            tokio::time::sleep(SETTLE_RETRY).await;
        };
        metrics::histogram!(BACKEND_LATENCY, "backend" => "redis", "op" => "settle")
            .record(started.elapsed().as_secs_f64());
        let (label, result) = match settled {
            Some(Settled::Appended(ids)) => ("appended", Ok(ids)),
            Some(Settled::NotAppended) => (
                "not_appended",
                Err(LogError::Unavailable(format!(
                    "{why}; settled: nothing was appended"
                ))),
            ),
            None => (
                "unknown",
                Err(LogError::OutcomeUnknown(format!(
                    "{why}; Redis did not settle it within {bound:?} (last: {last})"
                ))),
            ),
        };
        tracing::warn!(outcome = label, reason = %why, "append reply lost; settled");
        metrics::counter!(APPEND_OUTCOMES, "outcome" => label).increment(1);
        result
    }

    /// One `outcome.lua` call on the settling connection (opened if needed; dropped after an
    /// error so the next attempt opens a new one). Unbounded here: [`RedisLog::settle`] bounds
    /// it.
    async fn ask_outcome(&self, args: &OutcomeArgs<'_>) -> Result<Value, RedisError> {
        let mut conn = {
            let mut slot = self.inner.settler.lock().await;
            match slot.as_ref() {
                Some(conn) => conn.clone(),
                None => {
                    let conn = match &self.inner.target {
                        Target::Single(client) => {
                            let unbounded = AsyncConnectionConfig::new()
                                .set_connection_timeout(None)
                                .set_response_timeout(None);
                            Shared::Multiplexed(
                                client
                                    .get_multiplexed_async_connection_with_config(&unbounded)
                                    .await?,
                            )
                        }
                        Target::Cluster { cluster, .. } => {
                            Shared::Cluster(cluster.get_async_connection().await?)
                        }
                    };
                    slot.insert(conn).clone()
                }
            }
        };
        let reply = args
            .invocation(&self.inner.scripts.outcome)
            .invoke_async(&mut conn)
            .await;
        if reply.is_err() {
            *self.inner.settler.lock().await = None;
        }
        reply
    }
}

/// Whether a failed append may have reached Redis and run: its reply was lost (an I/O error
/// other than a refused connection, or a reply that cannot be read). A refused connection
/// sent nothing; an error reply (script error, OOM, wrong type) is Redis's own answer.
fn reply_lost(e: &RedisError) -> bool {
    (e.is_io_error() && !e.is_connection_refusal()) || e.kind() == ErrorKind::Parse
}

#[async_trait::async_trait]
impl EventLog for RedisLog {
    fn name(&self) -> &'static str {
        "redis"
    }

    /// One `EVALSHA` for the whole batch (`append.lua`): the epoch is read (or created), the
    /// expected epoch and `last-generated-id` are checked when given (compare-and-append on
    /// the stream's last entry ID), and every event is `XADD … MAXLEN ~ <cap> * e <json>`ed
    /// (no `MAXLEN` when `max_events` is 0 or checkpoints are in use) in the same script, so
    /// the batch is wholly in the log or not at all. A candidate is handled after the `XADD`s:
    /// `HMGET` of the pending checkpoint, its promotion (`HSET`/`HDEL` on the `ckpt` hash,
    /// `XTRIM <log> MINID <pos + 1>`, exact), and `HSET` of the candidate as pending at the
    /// batch's last entry ID. Then `max_age` (may promote the pending checkpoint, `TIME`,
    /// `XTRIM … MINID`) and `idle_ttl` (`PEXPIRE` of the thread's three keys, in ms, when
    /// less than `idle_ttl` is left: see the script). The same script records the append's
    /// outcome under a fresh token; when the reply is lost, [`RedisLog::settle`] finds out
    /// what happened before this returns (module docs, "Unknown outcomes").
    async fn append_checked(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: Option<LogHead>,
        extras: AppendExtras,
    ) -> Result<Vec<EventId>, LogError> {
        let keys = self.keys(thread);
        let outcome = keys.outcome(AppendToken::random());
        let sharded = self.inner.target.is_cluster();
        let config = &self.inner.config;
        let retention = &config.retention;
        let args = AppendArgs {
            keys: &keys,
            outcome: &outcome,
            fresh_epoch: Epoch::random(),
            maxlen: retention.cap(false),
            safety_cap: retention.cap(true),
            expected,
            candidate: extras.candidate.as_deref(),
            candidate_min_gap: extras.candidate_min_gap,
            max_age_ms: retention.max_age_ms(),
            idle_ttl_ms: retention.idle_ttl_ms(),
            producer: extras.producer.as_ref(),
            // A cluster: the thread's own shard channel (`SPUBLISH`, in its slot); else the
            // one channel of every thread.
            channel: if sharded {
                &keys.notes
            } else {
                &self.inner.channel
            },
            sharded,
            thread,
            record_ttl_ms: config.record_ttl_ms(),
            events,
        };
        let sent = self
            .timed_or("append", LogError::OutcomeUnknown, async {
                let mut conn = self.inner.conn.clone();
                match args
                    .invocation(&self.inner.scripts.append)
                    .invoke_async(&mut conn)
                    .await
                {
                    Ok(reply) => parse_append_reply(&reply, events.len()),
                    Err(e) if reply_lost(&e) => {
                        Err(LogError::OutcomeUnknown(format!("redis: {e}")))
                    }
                    Err(e) => Err(unavailable(e)),
                }
            })
            .await;
        match sent {
            Err(LogError::OutcomeUnknown(why)) => self.settle(&outcome, events.len(), why).await,
            other => other,
        }
    }

    /// Script: the epoch check (a new epoch clears the meta hash), then `HGET <meta> p:<id>`.
    async fn producer_seq(&self, thread: &ThreadId, producer: &str) -> Result<u64, LogError> {
        self.timed("producer", async {
            let reply = self
                .read_script(
                    &self.inner.scripts.producer,
                    &ProducerArgs {
                        keys: &self.keys(thread),
                        fresh_epoch: Epoch::random(),
                        producer,
                        idle_ttl_ms: self.inner.config.retention.idle_ttl_ms(),
                    },
                )
                .await
                .map_err(unavailable)?;
            match reply {
                Value::Nil => Ok(0),
                other => string(&other)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| malformed("producer sequence")),
            }
        })
        .await
    }

    /// Script: the epoch check (a new epoch deletes the `ckpt` hash), then `HMGET <ckpt> pos
    /// events`.
    async fn checkpoint(&self, thread: &ThreadId) -> Result<Option<Checkpoint>, LogError> {
        self.timed("checkpoint", async {
            let reply = self
                .read_script(
                    &self.inner.scripts.checkpoint,
                    &self.head_args(&self.keys(thread)),
                )
                .await
                .map_err(unavailable)?;
            let fields = array(&reply)
                .and_then(|items| items.get(1))
                .and_then(array)
                .ok_or_else(|| malformed("checkpoint reply"))?;
            match fields {
                [pos, events] => match (bytes_of(pos), bytes_of(events)) {
                    (Some(_), Some(events)) => Ok(Some(Checkpoint {
                        pos: parse_pos(pos)?,
                        events: Bytes::copy_from_slice(events),
                    })),
                    _ => Ok(None),
                },
                _ => Err(malformed("checkpoint reply")),
            }
        })
        .await
    }

    /// Script: epoch, `XINFO STREAM` head and `XRANGE <start> + COUNT <limit>` in one atomic
    /// step, then `check_resumable` exactly as the memory backend. Invalid entries are
    /// skipped (and further pages read, so `limit` valid entries come back when they exist).
    async fn read(
        &self,
        thread: &ThreadId,
        from: ReadFrom,
        limit: usize,
    ) -> Result<Vec<LogEntry>, LogError> {
        self.timed("read", async {
            let keys = self.keys(thread);
            let mut out: Vec<LogEntry> = Vec::new();
            let mut start = from;
            let mut first_page = true;
            loop {
                let want = limit - out.len();
                let ReadPage {
                    head,
                    entries: raw,
                    held,
                    ..
                } = self.read_page(&keys, start, want).await?;
                if let ReadFrom::After(id) = start
                    && let Err(gap) = check_resumable(&head, id, held)
                {
                    if first_page {
                        return Err(gap.into());
                    }
                    // Changed under a later page: return what was exact; the caller's next
                    // read reports the gap.
                    break;
                }
                first_page = false;
                let complete_page = raw.len() >= want;
                let last_raw = raw.last().map(|r| r.pos);
                out.extend(decode_entries(thread, head.epoch, raw));
                match last_raw {
                    Some(pos) if complete_page && out.len() < limit => {
                        start = ReadFrom::After(EventId {
                            epoch: head.epoch,
                            pos,
                        });
                    }
                    _ => break,
                }
            }
            Ok(out)
        })
        .await
    }

    /// The read script with no entries (`COUNT 0`): the epoch, the head, `XRANGE <id> <id>`
    /// and, when that finds nothing, `XREVRANGE <id> - COUNT 1` (the fork point) in one atomic
    /// step, then `check_resumable` as `read` does.
    async fn check_resume(&self, thread: &ThreadId, id: EventId) -> Result<ResumeCheck, LogError> {
        self.timed("read", async {
            let page = self
                .read_page(&self.keys(thread), ReadFrom::After(id), 0)
                .await?;
            Ok(ResumeCheck::new(page.head, id, page.held, page.before))
        })
        .await
    }

    /// Script: epoch (created if missing) and the `XINFO STREAM` fields: `last` is
    /// `last-generated-id`, `max_deleted` the highest removed position (see the module docs);
    /// both `0-0` when the stream does not exist.
    async fn head(&self, thread: &ThreadId) -> Result<LogHead, LogError> {
        self.timed("head", async {
            let reply = self
                .read_script(
                    &self.inner.scripts.head,
                    &self.head_args(&self.keys(thread)),
                )
                .await
                .map_err(unavailable)?;
            parse_head(array(&reply).ok_or_else(|| malformed("head reply"))?)
        })
        .await
    }

    /// `PING`; fails while the tail is stalled (its probe not read back, `tail/probe.rs`).
    async fn ping(&self) -> Result<(), LogError> {
        if let Some(why) = self.inner.probe.stalled() {
            return Err(LogError::Unavailable(why));
        }
        self.timed("ping", async {
            retry_dropped(|| {
                let mut conn = self.inner.conn.clone();
                async move { redis::cmd("PING").query_async::<()>(&mut conn).await }
            })
            .await
            .map_err(unavailable)
        })
        .await
    }

    /// `SCAN … MATCH … TYPE stream`, then `summary.lua` per thread (`list.rs`).
    async fn list_threads(
        &self,
        prefix: &str,
        cursor: &ListCursor,
        limit: usize,
    ) -> Result<ThreadPage, LogError> {
        self.list(prefix, cursor, limit).await
    }

    /// `summary.lua`: the epoch check, `XINFO STREAM` and `XREVRANGE + - COUNT 1` (`list.rs`).
    async fn summary(&self, thread: &ThreadId) -> Result<ThreadSummary, LogError> {
        self.summary_of(thread).await
    }

    /// `ZADD … GT` on `<prefix>:runs` (`runs.rs`).
    async fn note_open_run(&self, thread: &ThreadId, active_ms: u64) -> Result<(), LogError> {
        self.note_run(thread, active_ms).await
    }

    /// `ZRANGE … BYSCORE` on `<prefix>:runs` (`runs.rs`).
    async fn idle_open_runs(
        &self,
        idle_since_ms: u64,
        limit: usize,
    ) -> Result<Vec<(ThreadId, u64)>, LogError> {
        self.idle_runs(idle_since_ms, limit).await
    }

    /// A compare-and-delete script on `<prefix>:runs` (`runs.rs`).
    async fn forget_open_run(&self, thread: &ThreadId, active_ms: u64) -> Result<(), LogError> {
        self.forget_run(thread, active_ms).await
    }

    /// Spawns the node's reader (one dedicated connection), its subscriber to the append
    /// notes (a second connection, `SUBSCRIBE <prefix>:appended`) and its waker (`CLIENT
    /// UNBLOCK` on the shared connection). All run until `shutdown` is cancelled; Redis outages
    /// are retried with capped, jittered backoff (100 ms … 5 s) and the reader resumes from its
    /// cursors. The module docs ("Tail") say how notes, reads and the fallback combine.
    fn start_tail(
        &self,
        sink: mpsc::Sender<TailItem>,
        shutdown: CancellationToken,
    ) -> Arc<dyn Tail> {
        tail::start(self.inner.clone(), sink, shutdown)
    }
}

/// Runs an idempotent call (read, head, ping) once more when it failed because the shared
/// connection was dropped: the connection manager reconnects in between, so a single lost
/// connection (a Redis restart, `CLIENT KILL`, an idle timeout) does not surface as an error.
/// Appends are never retried here: the script may have run.
async fn retry_dropped<T, Fut>(mut attempt: impl FnMut() -> Fut) -> Result<T, RedisError>
where
    Fut: Future<Output = Result<T, RedisError>>,
{
    match attempt().await {
        Err(e) if e.is_connection_dropped() || e.is_io_error() => attempt().await,
        other => other,
    }
}
