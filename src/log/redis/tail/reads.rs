//! The tail reader's Redis round trips on its dedicated connection: connecting (`CLIENT ID`,
//! `SCRIPT LOAD`), the pipelined read scripts (pages, and the checks of a cursor against the
//! log), the epoch checks and the `XREAD` over every followed stream.

use super::cluster::{ClusterReads, slot_of};
use super::{DIRTY_BATCH, Flow, Follow, TailReader, block_of, xread_interval};
use crate::event::ThreadId;
use crate::log::check_resumable;
use crate::log::redis::conn::Target;
use crate::log::redis::resp::{
    RawEntry, ReadPage, decode_entries, parse_epoch_str, parse_read_reply, parse_xread, string,
    unavailable,
};
use crate::log::redis::scripts::{Keys, ReadArgs, ScriptArgs};
use crate::log::{Epoch, EventId, LogError, LogHead, StreamPos, TailItem};
use crate::metrics::{
    BACKEND_UP, STREAM_BYTES, STREAM_BYTES_MAX, STREAM_ENTRIES, STREAM_ENTRIES_MAX,
};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl TailReader {
    /// Reads dirty threads after their cursors (at most [`DIRTY_BATCH`] per call): pipelined
    /// read scripts, each the epoch, the head, `XRANGE (<cursor> + COUNT n` and the lookup of
    /// the cursor's own entry in one atomic step, then [`check_resumable`] of the cursor
    /// against that head (a cursor the log does not hold is a rolled-back tail): the entries are
    /// delivered (after validation: they may come from a direct `XADD`), or a discontinuity.
    /// A thread that returned a full page stays dirty.
    pub(super) async fn read_dirty(&mut self) -> Result<Flow, LogError> {
        let batch: Vec<ThreadId> = self.dirty.iter().take(DIRTY_BATCH).cloned().collect();
        for thread in &batch {
            self.dirty.remove(thread);
        }
        let now = Instant::now();
        let todo: Vec<(ThreadId, Follow)> = {
            let state = self.shared.state.lock();
            batch
                .into_iter()
                .filter_map(|t| {
                    let f = *state.follows.get(&t)?;
                    // A broken thread waits for its retry time (the scan marks it again).
                    f.retry_at.is_none_or(|at| now >= at).then_some((t, f))
                })
                .collect()
        };
        if todo.is_empty() {
            return Ok(Flow::Continue);
        }
        let config = &self.log.config;
        let count = config.read_count.max(1);
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut slots = Vec::with_capacity(todo.len());
        for (thread, follow) in &todo {
            let keys = Keys::new(&config.prefix, thread);
            slots.push(slot_of(keys.stream.as_bytes()));
            ReadArgs {
                keys: &keys,
                fresh_epoch: Epoch::random(),
                after: Some(follow.cursor),
                count,
                idle_ttl_ms: config.retention.idle_ttl_ms(),
            }
            .evalsha(&mut pipe, &self.log.scripts.read);
        }
        let op_timeout = config.op_timeout;
        let Some(replies) = self.query(&pipe, &slots, op_timeout).await? else {
            return Ok(Flow::Stop);
        };
        let now = Instant::now();
        for ((thread, follow), reply) in todo.into_iter().zip(replies) {
            let page = match &reply {
                Value::ServerError(e) if matches!(e.code(), "WRONGTYPE" | "ERR") => {
                    self.broken(
                        &thread,
                        follow.version,
                        &LogError::Unavailable(format!("redis: {e}")),
                    );
                    continue;
                }
                Value::ServerError(e) => return Err(LogError::Unavailable(format!("redis: {e}"))),
                other => parse_read_reply(other)?,
            };
            let ReadPage {
                head,
                entries: raw,
                held,
                ..
            } = page;
            let at = EventId {
                epoch: follow.epoch,
                pos: follow.cursor,
            };
            let flow = match check_resumable(&head, at, held) {
                Ok(()) => {
                    if raw.len() >= count {
                        self.dirty.insert(thread.clone());
                    }
                    let cursor = raw.last().map(|r| r.pos).unwrap_or(follow.cursor);
                    let entries = decode_entries(&thread, follow.epoch, raw);
                    let item = (!entries.is_empty()).then(|| TailItem::Entries {
                        thread: thread.clone(),
                        entries,
                    });
                    self.commit(&thread, follow.version, item, |f| {
                        f.cursor = cursor;
                        f.checked = Some(now);
                        f.retry_at = None;
                    })
                    .await
                }
                Err(reason) => {
                    self.discontinuity(thread, follow.version, head, reason)
                        .await
                }
            };
            if let Flow::Stop = flow {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }

    /// Opens the dedicated connection if there is none: `CLIENT ID` (for `CLIENT UNBLOCK`),
    /// `CLIENT SETNAME`, `SCRIPT LOAD` of the read script (pipelined `EVALSHA` later).
    pub(super) async fn connect(&mut self) -> Result<(), LogError> {
        if self.conn.is_some() {
            return Ok(());
        }
        if let Target::Cluster { seeds, .. } = &self.log.target {
            let open = ClusterReads::open(seeds.clone(), self.log.config.op_timeout);
            let reads = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Err(LogError::Unavailable("shutting down".into())),
                reads = open => reads?,
            };
            self.conn = Some(ReaderConn::Cluster(Box::new(reads)));
            self.connected(0);
            return Ok(());
        }
        let Target::Single(client) = &self.log.target else {
            unreachable!("a target is a cluster or a single Redis");
        };
        let config = &self.log.config;
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.op_timeout))
            .set_response_timeout(Some(block_of(config) + config.op_timeout));
        let read = &self.log.scripts.read;
        let open = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&connection_config)
                .await?;
            // `CLIENT ID` / `SETNAME` may be denied (ACLs, managed services): the tail then
            // works without early wake-ups (a new follow waits at most one `block`).
            let id = match redis::cmd("CLIENT")
                .arg("ID")
                .query_async::<u64>(&mut conn)
                .await
            {
                Ok(id) => id,
                Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {
                    tracing::warn!(error = %e, "CLIENT ID refused; follows wait for the block timeout");
                    0
                }
                Err(e) => return Err(e),
            };
            match redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg("agui-fanout-tail")
                .query_async::<()>(&mut conn)
                .await
            {
                Err(e) if !matches!(e.kind(), redis::ErrorKind::Server(_)) => return Err(e),
                _ => {}
            }
            read.prepare_invoke().load_async(&mut conn).await?;
            Ok::<_, RedisError>((conn, id))
        };
        let (conn, id) = tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => return Err(LogError::Unavailable("shutting down".into())),
            opened = tokio::time::timeout(config.op_timeout, open) => match opened {
                Ok(Ok(opened)) => opened,
                Ok(Err(e)) => return Err(unavailable(e)),
                Err(_) => return Err(LogError::Unavailable("redis tail connect timed out".into())),
            },
        };
        self.conn = Some(ReaderConn::Single(conn));
        self.connected(id);
        Ok(())
    }

    /// After connecting: the waker's client id, `up`, and a full check of every follow
    /// (Redis may have restarted without its data, or failed over).
    fn connected(&mut self, client_id: u64) {
        self.shared
            .reader_client_id
            .store(client_id, Ordering::SeqCst);
        metrics::gauge!(BACKEND_UP).set(1.0);
        for f in self.shared.state.lock().follows.values_mut() {
            f.checked = None;
        }
        self.log.probe.reader_connected();
        tracing::info!(client_id, "redis tail connected");
    }

    /// True when the reader reads a cluster (no blocking reads: `CROSSSLOT`).
    pub(super) fn on_cluster(&self) -> bool {
        self.log.target.is_cluster()
    }

    /// Sends `pipe` (command `i` touching slot `slots[i]`, used on a cluster) on the dedicated
    /// connection(s) under `deadline`, watching for shutdown and for the probe's verdict.
    async fn query(
        &mut self,
        pipe: &redis::Pipeline,
        slots: &[u16],
        deadline: Duration,
    ) -> Result<Option<Vec<Value>>, LogError> {
        let shutdown = self.shutdown.clone();
        let probe = self.log.probe.clone();
        let log = self.log.clone();
        let Some(conn) = self.conn.as_mut() else {
            return Err(LogError::Unavailable("redis tail not connected".into()));
        };
        let reply = async {
            match conn {
                ReaderConn::Single(conn) => pipe
                    .query_async::<Vec<Value>>(conn)
                    .await
                    .map_err(unavailable),
                ReaderConn::Cluster(reads) => reads.query(pipe, slots, &log.scripts.read).await,
            }
        };
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => Ok(None),
            // The probe found this connection stalled: drop it (the caller reconnects).
            _ = probe.reconnect_reader.notified() => Err(LogError::Unavailable(
                "redis tail stalled: dropping its connection".into(),
            )),
            reply = tokio::time::timeout(deadline, reply) => match reply {
                Ok(Ok(values)) => Ok(Some(values)),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(LogError::Unavailable(format!("redis tail timed out after {deadline:?}"))),
            },
        }
    }

    /// Checks `due` threads: new follows (and every follow after a reconnect: Redis may have
    /// restarted empty or failed over) get a full check ([`check_resumable`] of their cursor,
    /// its entry looked up); the others an `HGET` of the epoch (a full check if it changed or
    /// vanished).
    pub(super) async fn check(&mut self, due: Vec<(ThreadId, Follow)>) -> Result<Flow, LogError> {
        let prefix = self.log.config.prefix.clone();
        let op_timeout = self.log.config.op_timeout;
        let (fresh, known): (Vec<_>, Vec<_>) =
            due.into_iter().partition(|(_, f)| f.checked.is_none());
        let mut full = fresh;
        if !known.is_empty() {
            let mut pipe = redis::pipe();
            let mut slots = Vec::with_capacity(known.len());
            for (thread, _) in &known {
                let meta = Keys::new(&prefix, thread).meta;
                slots.push(slot_of(meta.as_bytes()));
                pipe.cmd("HGET").arg(meta).arg("epoch");
            }
            let Some(epochs) = self.query(&pipe, &slots, op_timeout).await? else {
                return Ok(Flow::Stop);
            };
            let now = Instant::now();
            for ((thread, follow), epoch) in known.into_iter().zip(epochs) {
                // An error reply (the meta key of another type) is checked in full below.
                let same = string(&epoch)
                    .and_then(|s| parse_epoch_str(&s))
                    .is_some_and(|e| e == follow.epoch);
                if same {
                    self.update(&thread, follow.version, |f| f.checked = Some(now));
                } else {
                    full.push((thread, follow));
                }
            }
        }
        if full.is_empty() {
            return Ok(Flow::Continue);
        }
        let verdicts = self
            .verdicts(full.iter().map(|(t, f)| (t, f.cursor)))
            .await?;
        let Some(verdicts) = verdicts else {
            return Ok(Flow::Stop);
        };
        let now = Instant::now();
        for ((thread, follow), verdict) in full.into_iter().zip(verdicts) {
            let (head, held) = match verdict {
                Ok(verdict) => verdict,
                Err(e) => {
                    self.broken(&thread, follow.version, &e);
                    continue;
                }
            };
            let at = EventId {
                epoch: follow.epoch,
                pos: follow.cursor,
            };
            let flow = match check_resumable(&head, at, held) {
                Ok(()) => {
                    self.update(&thread, follow.version, |f| {
                        f.checked = Some(now);
                        f.retry_at = None;
                    });
                    Flow::Continue
                }
                Err(reason) => {
                    self.discontinuity(thread, follow.version, head, reason)
                        .await
                }
            };
            if let Flow::Stop = flow {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }

    /// Pipelined read scripts without entries (`EVALSHA`, loaded at connect) for `threads` at
    /// their cursors, in order: each thread's head and whether its stream holds the entry at
    /// the cursor (the input of [`check_resumable`]; a cursor the log no longer holds inside
    /// its range is a rolled-back tail). An error of one thread's own keys is that thread's
    /// `Err`; any other error fails the whole call.
    async fn verdicts<'a>(
        &mut self,
        threads: impl Iterator<Item = (&'a ThreadId, StreamPos)>,
    ) -> Result<Option<Vec<Result<(LogHead, bool), LogError>>>, LogError> {
        let config = &self.log.config;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut slots = Vec::new();
        for (thread, cursor) in threads {
            let keys = Keys::new(&config.prefix, thread);
            slots.push(slot_of(keys.stream.as_bytes()));
            ReadArgs {
                keys: &keys,
                fresh_epoch: Epoch::random(),
                after: Some(cursor),
                count: 0,
                idle_ttl_ms: config.retention.idle_ttl_ms(),
            }
            .evalsha(&mut pipe, &self.log.scripts.read);
        }
        let op_timeout = config.op_timeout;
        let Some(replies) = self.query(&pipe, &slots, op_timeout).await? else {
            return Ok(None);
        };
        replies
            .iter()
            .map(|reply| match reply {
                Value::ServerError(e) if matches!(e.code(), "WRONGTYPE" | "ERR") => {
                    Ok(Err(LogError::Unavailable(format!("redis: {e}"))))
                }
                Value::ServerError(e) => Err(LogError::Unavailable(format!("redis: {e}"))),
                other => Ok(parse_read_reply(other).map(|page| (page.head, page.held))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// `XREAD COUNT n [BLOCK ms] STREAMS <keys…> <probe> <cursors…> <probe cursor>` (`BLOCK`
    /// in blocking mode; the notified mode's periodic read returns at once; the node's probe
    /// stream is read back too, `probe.rs`), then, for the threads that got entries,
    /// a pipelined check of their cursors: the entries are delivered only if the cursor was
    /// still resumable (same epoch, nothing after it trimmed, its entry still in the log);
    /// otherwise a discontinuity.
    pub(super) async fn xread(
        &mut self,
        follows: Vec<(ThreadId, Follow)>,
        block: bool,
    ) -> Result<Flow, LogError> {
        if let Some(at) = self.last_busy_xread.take().filter(|_| block) {
            let next = at + xread_interval(follows.len());
            if next > Instant::now() {
                tokio::select! {
                    biased;
                    _ = self.shutdown.cancelled() => return Ok(Flow::Stop),
                    _ = tokio::time::sleep_until(next.into()) => {}
                }
            }
        }
        let sent = Instant::now();
        let log = self.log.clone();
        let config = &log.config;
        let generation = self.shared.seen_generation.load(Ordering::SeqCst);
        if generation != self.keys_generation {
            let followed: std::collections::HashSet<&ThreadId> =
                follows.iter().map(|(t, _)| t).collect();
            self.stream_keys.retain(|t, _| followed.contains(t));
            self.keys_generation = generation;
        }
        // Every followed stream and its cursor, then the node's probe stream (`probe.rs`),
        // read back like the followed streams.
        let mut streams: Vec<(Arc<str>, String)> = Vec::with_capacity(follows.len() + 1);
        let mut by_key: HashMap<Arc<str>, usize> = HashMap::with_capacity(follows.len());
        for (i, (thread, follow)) in follows.iter().enumerate() {
            let key = self
                .stream_keys
                .entry(thread.clone())
                .or_insert_with(|| Keys::new(&config.prefix, thread).stream.into())
                .clone();
            by_key.insert(key.clone(), i);
            streams.push((key, follow.cursor.to_string()));
        }
        streams.push((self.probe_key.clone(), self.probe_cursor.to_string()));
        // One `XREAD` for a single Redis; one per slot on a cluster, which refuses keys of
        // several slots in one command (`CROSSSLOT`) and where the reader never blocks.
        let cluster = self.on_cluster();
        let block_read = block && !cluster;
        let groups: Vec<(u16, Vec<usize>)> = if cluster {
            let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
            for (i, (key, _)) in streams.iter().enumerate() {
                by_slot.entry(slot_of(key.as_bytes())).or_default().push(i);
            }
            by_slot.into_iter().collect()
        } else {
            vec![(0, (0..streams.len()).collect())]
        };
        let mut pipe = redis::pipe();
        let mut slots = Vec::with_capacity(groups.len());
        for (slot, members) in &groups {
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT").arg(config.read_count.max(1));
            if block_read {
                cmd.arg("BLOCK")
                    .arg(u64::try_from(block_of(config).as_millis()).unwrap_or(u64::MAX));
            }
            cmd.arg("STREAMS");
            for &i in members {
                cmd.arg(&*streams[i].0);
            }
            for &i in members {
                cmd.arg(&streams[i].1);
            }
            pipe.add_command(cmd);
            slots.push(*slot);
        }
        let deadline = if block_read {
            block_of(config) + config.op_timeout
        } else {
            config.op_timeout
        };
        let Some(replies) = self.query(&pipe, &slots, deadline).await? else {
            return Ok(Flow::Stop);
        };
        let mut got: Vec<(usize, Vec<RawEntry>)> = Vec::new();
        for reply in &replies {
            if let Value::ServerError(e) = reply {
                return Err(LogError::Unavailable(format!("redis: {e}")));
            }
            for (key, entries) in parse_xread(reply)? {
                if key.as_str() == &*self.probe_key {
                    if let Some(last) = entries.last() {
                        self.probe_cursor = last.pos;
                        self.log.probe.read_back(last.pos);
                    }
                    continue;
                }
                if let Some(&i) = by_key.get(key.as_str())
                    && !entries.is_empty()
                {
                    got.push((i, entries));
                }
            }
        }
        if got.is_empty() {
            if block && cluster {
                // In place of the blocking read: the next read a period later (a new follow,
                // a notice or shutdown ends the wait).
                return Ok(self.wait(Some(sent + block_of(config))).await);
            }
            return Ok(Flow::Continue);
        }
        if block {
            self.last_busy_xread = Some(sent);
        }
        let checked = got
            .iter()
            .map(|(i, _)| (&follows[*i].0, follows[*i].1.cursor));
        let Some(verdicts) = self.verdicts(checked).await? else {
            return Ok(Flow::Stop);
        };
        let now = Instant::now();
        for ((i, raw), verdict) in got.into_iter().zip(verdicts) {
            let (thread, follow) = &follows[i];
            let (head, held) = match verdict {
                Ok(verdict) => verdict,
                Err(e) => {
                    self.broken(thread, follow.version, &e);
                    continue;
                }
            };
            let at = EventId {
                epoch: follow.epoch,
                pos: follow.cursor,
            };
            let flow = match check_resumable(&head, at, held) {
                Ok(()) => {
                    let cursor = raw.last().map(|r| r.pos).unwrap_or(follow.cursor);
                    let entries = decode_entries(thread, follow.epoch, raw);
                    let item = (!entries.is_empty()).then(|| TailItem::Entries {
                        thread: thread.clone(),
                        entries,
                    });
                    self.commit(thread, follow.version, item, |f| {
                        f.cursor = cursor;
                        f.checked = Some(now);
                    })
                    .await
                }
                Err(reason) => {
                    self.discontinuity(thread.clone(), follow.version, head, reason)
                        .await
                }
            };
            if let Flow::Stop = flow {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }
}

/// Most followed streams one sample of sizes covers (the first ones of the follow map).
const SAMPLED_STREAMS: usize = 4096;

impl TailReader {
    /// Samples the sizes of the followed streams (at most [`SAMPLED_STREAMS`]): `XLEN` and
    /// `MEMORY USAGE` of each, pipelined, into the aggregate gauges (sum and largest, entries
    /// and bytes). A reply that is an error (`MEMORY` denied by ACLs) counts as 0.
    pub(super) async fn sample_streams(&mut self) -> Result<Flow, LogError> {
        let prefix = self.log.config.prefix.clone();
        let keys: Vec<String> = {
            let state = self.shared.state.lock();
            state
                .follows
                .keys()
                .take(SAMPLED_STREAMS)
                .map(|t| Keys::new(&prefix, t).stream)
                .collect()
        };
        let (mut entries, mut bytes) = ((0u64, 0u64), (0u64, 0u64));
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            let mut slots = Vec::with_capacity(keys.len() * 2);
            for key in &keys {
                pipe.cmd("XLEN").arg(key);
                pipe.cmd("MEMORY").arg("USAGE").arg(key);
                slots.extend([slot_of(key.as_bytes()); 2]);
            }
            let op_timeout = self.log.config.op_timeout;
            let Some(replies) = self.query(&pipe, &slots, op_timeout).await? else {
                return Ok(Flow::Stop);
            };
            let n = |v: &Value| match v {
                Value::Int(n) => u64::try_from(*n).unwrap_or(0),
                _ => 0,
            };
            for pair in replies.chunks_exact(2) {
                let (len, size) = (n(&pair[0]), n(&pair[1]));
                entries = (entries.0 + len, entries.1.max(len));
                bytes = (bytes.0 + size, bytes.1.max(size));
            }
        }
        metrics::gauge!(STREAM_ENTRIES).set(entries.0 as f64);
        metrics::gauge!(STREAM_ENTRIES_MAX).set(entries.1 as f64);
        metrics::gauge!(STREAM_BYTES).set(bytes.0 as f64);
        metrics::gauge!(STREAM_BYTES_MAX).set(bytes.1 as f64);
        Ok(Flow::Continue)
    }
}

/// The reader's dedicated connection(s).
pub(super) enum ReaderConn {
    /// A single Redis: one connection.
    Single(MultiplexedConnection),
    /// A Redis Cluster: one connection per primary, and the slot map.
    Cluster(Box<ClusterReads>),
}
