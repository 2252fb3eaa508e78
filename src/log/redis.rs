//! The `redis` log backend: thread logs as Redis Streams, shared by every node (SPEC §1, §4, §7).
//!
//! # Key and entry format (for producers that write to Redis directly, SPEC §2)
//!
//! With the default prefix `agui`, thread `<threadId>` owns three keys in one hash slot (the
//! `{threadId}` hash tag, so Redis Cluster keeps them together):
//!
//! - `agui:{<threadId>}:log`: a stream; one entry per AG-UI event, with one field `e` holding
//!   the event as compact UTF-8 JSON (one object, `threadId` if present equal to the thread).
//!   Entry IDs are auto-generated (`XADD … * e <json>`); they are the position part of the SSE
//!   event id. Other fields are ignored.
//! - `agui:{<threadId>}:meta`: a hash; field `epoch` is the log's epoch as 8 lowercase hex
//!   digits; field `seen` (`1`) records that the stream existed under this epoch, so a stream
//!   deleted on its own (its meta surviving) still gets a new epoch.
//! - `agui:{<threadId>}:ckpt`: a hash, the thread's checkpoints (SPEC §6, written by the
//!   broker only): `pos` (entry ID), `events` (JSON array of AG-UI events, the thread's fold
//!   at `pos` restated) and `ord` (the stream's `entries-added` when the `pos` entry was
//!   added) for the promoted checkpoint; `next_pos`, `next_events`, `next_ord` for the
//!   pending one. It belongs to the epoch: whenever the broker creates a new epoch for the
//!   thread, it deletes this key in the same script.
//!
//! # Retention
//! See [`Retention`]. An append that carries a checkpoint candidate (`append_if`), in the same
//! script: if a pending checkpoint exists it becomes the checkpoint (`next_*` moved to `pos`,
//! `events`, `ord`) and `XTRIM <log> MINID <pos + 1>` (exact: `MINID` removes IDs strictly
//! lower, hence the successor ID `<ms>-<seq + 1>`) removes every entry at or before it; the
//! candidate is then stored as `next_*` at the batch's last entry ID. `XADD … MAXLEN ~` caps
//! the stream at `max_events`, or at `4 * max_events` once the `ckpt` key exists (a safety
//! net only). With `max_age`, a pending checkpoint whose `next_pos` milliseconds are older
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
//! The append script also `PUBLISH`es each batch on `<prefix>:appended` (format:
//! `src/log/redis/notify.rs`): thread, epoch, the stream's `last-generated-id` before the batch (`prev`), and
//! the entries. Each node's tail `SUBSCRIBE`s on a second connection. A note whose `prev` is the
//! follow's cursor (same epoch) is exactly the next part of the log and is delivered without
//! reading Redis; any other note of a followed thread makes the tail read that stream after its
//! cursor (one read script per thread, pipelined: epoch, head and `XRANGE` atomically). Every
//! `block`, one non-blocking `XREAD COUNT n STREAMS <every followed stream> <cursors>` picks up
//! what no note announced (direct `XADD`s). Pub/Sub is at-most-once, so notes are hints: when
//! the subscription is lost (or the tail falls 4,096 notes behind), the tail goes back to one
//! `XREAD COUNT n BLOCK ms STREAMS …` over every followed stream, woken early with `CLIENT
//! UNBLOCK <id> TIMEOUT` when a thread is followed, until it is subscribed again; right after
//! subscribing it reads every followed stream once. The cursor and the stream stay the truth.
//!
//! Redis Cluster: each script touches the keys of one thread (one slot), but the tail's
//! multi-key `XREAD` needs every followed key in one slot, so the tail works with a single
//! Redis (or a primary with replicas), not a sharded cluster.

mod notify;

use super::memory::check_resumable;
use super::{
    AppendExtras, Checkpoint, Epoch, EventId, EventLog, LogEntry, LogError, LogHead, ReadFrom,
    ResumeGap, Retention, StreamPos, Tail, TailItem,
};
use crate::event::{ThreadId, ValidEvent, validate_event};
use crate::metrics::{BACKEND_ERRORS, BACKEND_LATENCY, BACKEND_UP, INVALID_ENTRIES};
use bytes::Bytes;
use notify::{Note, Notice};
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, RedisError, Script, Value};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// Settings of a [`RedisLog`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisLogConfig {
    /// Redis URL, `redis://[user:pass@]host:port[/db]` or `rediss://…`.
    pub url: String,
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
    /// Deadline of every append, read, head and ping (connecting included): past it the call
    /// returns [`LogError::Unavailable`] instead of waiting for Redis.
    pub op_timeout: Duration,
}

impl RedisLogConfig {
    /// The default settings for `url`: prefix `agui`, default retention, 1 s block, 512 entries
    /// per read, 2 s operation timeout.
    pub fn new(url: impl Into<String>) -> Self {
        RedisLogConfig {
            url: url.into(),
            prefix: "agui".into(),
            retention: Retention::default(),
            block: Duration::from_secs(1),
            read_count: 512,
            op_timeout: Duration::from_secs(2),
        }
    }
}

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
    client: Client,
    conn: ConnectionManager,
    config: RedisLogConfig,
    scripts: Scripts,
    /// The append-note channel, `<prefix>:appended` ([`notify::channel`]).
    channel: String,
}

/// The Lua scripts, built once (their SHA1 is computed at construction).
struct Scripts {
    append: Script,
    producer: Script,
    read: Script,
    head: Script,
    checkpoint: Script,
}

/// Helpers shared by every script. `renewed_ttl` is the TTL the thread's keys get for an
/// `idle_ttl` of `ttl` ms: `idle_ttl + min(idle_ttl / 16, 60 s)`. `ensure_epoch` returns the
/// thread's epoch, creating it (from `fresh`) when it is missing or malformed, or when the
/// stream vanished after it existed under the current epoch (a new epoch deletes the
/// checkpoint hash; a created meta hash gets the TTL for `ttl`, `'0'`: none, so that reads of
/// threads nobody writes leave nothing behind for good), then whether the stream exists;
/// `stream_info` returns
/// `XINFO STREAM`'s `last-generated-id`, `max-deleted-entry-id`, `recorded-first-entry-id`,
/// `length` and `entries-added`, then the checkpoint's `pos` and `ord` (`0-0` and `-1` without
/// one; see [`max_deleted`]).
const LUA_PRELUDE: &str = r#"
local function renewed_ttl(ttl)
  local t = tonumber(ttl)
  return t + math.min(math.floor(t / 16), 60000)
end
local function ensure_epoch(stream, meta, ckpt, fresh, ttl)
  local m = redis.call('HMGET', meta, 'epoch', 'seen')
  local ep, seen = m[1], m[2]
  local live = redis.call('EXISTS', stream) == 1
  if (not ep) or string.len(ep) ~= 8 or string.find(ep, '[^0-9a-f]') or (seen and not live) then
    ep = fresh
    -- A new epoch starts a new log: nothing of the old meta hash (producer marks) carries over.
    redis.call('DEL', meta)
    redis.call('HSET', meta, 'epoch', ep)
    if ttl ~= '0' then
      redis.call('PEXPIRE', meta, renewed_ttl(ttl))
    end
    redis.call('DEL', ckpt)
    seen = false
  end
  if live and not seen then
    redis.call('HSET', meta, 'seen', '1')
  end
  return ep, live
end
local function stream_info(stream, ckpt, live)
  if not live then
    return {'0-0', '0-0', '0-0', 0, 0, '0-0', -1}
  end
  local x = redis.call('XINFO', 'STREAM', stream)
  local f = {}
  for i = 1, #x, 2 do
    f[x[i]] = x[i + 1]
  end
  local info = {f['last-generated-id'], f['max-deleted-entry-id'], f['recorded-first-entry-id'],
    f['length'], f['entries-added']}
  for i = 1, 5 do
    if info[i] == nil then
      error('agui-fanout needs Redis 7.0 or newer (XINFO STREAM max-deleted-entry-id)')
    end
  end
  local c = redis.call('HMGET', ckpt, 'pos', 'ord')
  if c[1] and c[2] then
    info[6], info[7] = c[1], c[2]
  else
    info[6], info[7] = '0-0', -1
  end
  return info
end
"#;

/// Retention helpers of the append script. `successor` is the entry ID right after `id`
/// (decimal string arithmetic, exact for every `u64` pair); `promote` makes the pending
/// checkpoint the thread's checkpoint and trims every entry at or before it.
const LUA_RETENTION: &str = r#"
local function incr(s)
  local i = #s
  local zeros = ''
  while i > 0 do
    local d = string.byte(s, i) - 48
    if d < 9 then
      return string.sub(s, 1, i - 1) .. string.char(d + 49) .. zeros
    end
    zeros = zeros .. '0'
    i = i - 1
  end
  return '1' .. zeros
end
local function successor(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if seq == '18446744073709551615' then
    return incr(ms) .. '-0'
  end
  return ms .. '-' .. incr(seq)
end
local function promote(stream, ckpt, pending)
  redis.call('HSET', ckpt, 'pos', pending[1], 'events', pending[2], 'ord', pending[3])
  redis.call('HDEL', ckpt, 'next_pos', 'next_events', 'next_ord')
  redis.call('XTRIM', stream, 'MINID', successor(pending[1]))
end
local function pending_of(ckpt)
  local p = redis.call('HMGET', ckpt, 'next_pos', 'next_events', 'next_ord')
  if p[1] and p[2] and p[3] and string.match(p[1], '^%d+-%d+$') then
    return p
  end
  return nil
end
"#;

/// KEYS: stream, meta, ckpt. ARGV: [1] fresh epoch, [2] maxlen and [3] maxlen once the
/// thread uses checkpoints (`0`: none), [4] expected epoch and [5] expected last entry ID
/// (both empty: unconditional), [6] `-` when there is no checkpoint candidate, else the
/// candidate's least distance in entries (`entries-added`) from the pending checkpoint, below
/// which it is dropped (`AppendExtras::candidate_min_gap`), and [7] the candidate,
/// [8] `max_age` in ms and [9] `idle_ttl` in ms (`0`: none), [10] producer id (empty: none)
/// and [11] the number of its last event in the batch (stored as `p:<id>` in the meta hash),
/// [12] the append-note channel (empty: no note), [13] the thread id and [14] the events'
/// AG-UI types separated by spaces (for the note), then one JSON per event.
/// Returns `{epoch, {entry id…}}`, or `{'conflict', epoch, info}` when the log's epoch or
/// last-generated-id is not the expected one (nothing appended, nothing changed). The newest
/// entry's ID being the expected one is taken as a match (the only difference from the
/// last-generated-id: entries after it deleted with `XDEL`, which are then not in the log the
/// batch is checked against either).
/// `idle_ttl` ([9]) renews the three keys' TTL only when the stream's is below it (or the
/// checkpoint hash may just have been created), to `idle_ttl + min(idle_ttl / 16, 60 s)`: a
/// thread then expires between `idle_ttl` and that long after its last append, and most
/// appends make one `PTTL` call instead of three `PEXPIRE`s. A new stream has no TTL (below
/// `idle_ttl`); a new meta hash got its TTL in `ensure_epoch`.
/// After the `XADD`s, `PUBLISH`es the batch on [12] (format: `notify.rs`), with the stream's
/// `last-generated-id` before the batch: [5] when conditional (just compared), else from
/// `XINFO STREAM` (`0-0` for a stream that did not exist).
const LUA_APPEND: &str = r#"
local ep, live = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[9])
local prev = ARGV[5]
if ARGV[4] ~= '' then
  -- The newest entry being the expected one is the common case, and `XREVRANGE … COUNT 1` is
  -- cheaper than `XINFO STREAM` (which also returns the first entry). Otherwise (another
  -- append came first, the stream is empty after trimming, or it went back to an older
  -- state: a restore, a replica that lagged) the last-generated-id decides. "Nothing after
  -- the expected ID" would not do: it also holds for a stream whose newest entry is older.
  local newest = nil
  if live and ep == ARGV[4] then
    local r = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
    if r[1] then
      newest = r[1][1]
    end
  end
  if newest ~= ARGV[5] then
    local info = stream_info(KEYS[1], KEYS[3], live)
    if ep ~= ARGV[4] or info[1] ~= ARGV[5] then
      return {'conflict', ep, info}
    end
  end
end
if #ARGV < 15 then
  return {ep, {}}
end
if ARGV[12] ~= '' and ARGV[4] == '' then
  prev = '0-0'
  if live then
    prev = stream_info(KEYS[1], KEYS[3], true)[1]
  end
end
if not live then
  redis.call('HSET', KEYS[2], 'seen', '1')
end
local candidate = ARGV[6] ~= '-'
local cap = ARGV[2]
-- With checkpoints in use, MAXLEN never trims: past the safety cap [3] the pending
-- checkpoint is promoted instead (below), so the fold stays rebuildable (SPEC §6).
local in_use = candidate or redis.call('EXISTS', KEYS[3]) == 1
if in_use then
  cap = '0'
end
local ids = {}
for i = 15, #ARGV do
  if cap ~= '0' then
    ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', cap, '*', 'e', ARGV[i])
  else
    ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
  end
end
if candidate then
  local older = pending_of(KEYS[3])
  local added = stream_info(KEYS[1], KEYS[3], true)[5]
  -- Dropped when it comes too soon after the pending one (another node's, usually).
  if not older or tonumber(added) - tonumber(older[3]) >= tonumber(ARGV[6]) then
    if older then
      promote(KEYS[1], KEYS[3], older)
    end
    redis.call('HSET', KEYS[3], 'next_pos', ids[#ids], 'next_events', ARGV[7], 'next_ord', added)
  end
end
if ARGV[8] ~= '0' then
  local pending = pending_of(KEYS[3])
  if pending then
    local t = redis.call('TIME')
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local ms = tonumber(string.match(pending[1], '^(%d+)-'))
    if ms + tonumber(ARGV[8]) <= now_ms then
      promote(KEYS[1], KEYS[3], pending)
    end
  end
end
if in_use and ARGV[3] ~= '0' and redis.call('XLEN', KEYS[1]) > tonumber(ARGV[3]) then
  local pending = pending_of(KEYS[3])
  if pending then
    promote(KEYS[1], KEYS[3], pending)
  end
end
if ARGV[10] ~= '' then
  redis.call('HSET', KEYS[2], 'p:' .. ARGV[10], ARGV[11])
end
if ARGV[9] ~= '0' then
  -- `candidate` may have created the checkpoint hash: no TTL yet.
  if candidate or redis.call('PTTL', KEYS[1]) < tonumber(ARGV[9]) then
    local renewed = renewed_ttl(ARGV[9])
    for i = 1, 3 do
      redis.call('PEXPIRE', KEYS[i], renewed)
    end
  end
end
if ARGV[12] ~= '' then
  local note = {ARGV[13], ' ', ep, ' ', prev, '\n'}
  local i = 0
  for ty in string.gmatch(ARGV[14], '%S+') do
    i = i + 1
    local e = ARGV[14 + i]
    note[#note + 1] = ids[i] .. ' ' .. ty .. ' ' .. #e .. '\n'
    note[#note + 1] = e
  end
  if i == #ids then
    redis.call('PUBLISH', ARGV[12], table.concat(note))
  end
end
return {ep, ids}
"#;

/// KEYS: stream, meta, ckpt. ARGV: fresh epoch, XRANGE start (`-` or `(<id>`), count,
/// `idle_ttl` in ms (`0`: none; the last argument of every read script).
/// Returns `{epoch, info, {{id, {field, value…}}…}}` (`info`: see `stream_info`).
const LUA_READ: &str = r#"
local ep, live = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
local info = stream_info(KEYS[1], KEYS[3], live)
local entries = {}
local n = tonumber(ARGV[3])
if live and n > 0 then
  entries = redis.call('XRANGE', KEYS[1], ARGV[2], '+', 'COUNT', n)
end
return {ep, info, entries}
"#;

/// KEYS: stream, meta, ckpt. ARGV: fresh epoch, producer id, `idle_ttl` in ms. Returns the
/// producer's last event number in the current epoch (`false` when none).
const LUA_PRODUCER: &str = r#"
ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
return redis.call('HGET', KEYS[2], 'p:' .. ARGV[2])
"#;

/// KEYS: stream, meta, ckpt. ARGV: fresh epoch, `idle_ttl` in ms. Returns `{epoch, info}`.
const LUA_HEAD: &str = r#"
local ep, live = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
return {ep, stream_info(KEYS[1], KEYS[3], live)}
"#;

/// KEYS: stream, meta, ckpt. ARGV: fresh epoch, `idle_ttl` in ms. Returns
/// `{epoch, {pos, events}}` of the promoted checkpoint (both nil without one), after the epoch
/// check (which deletes the checkpoints of an epoch that ended).
const LUA_CHECKPOINT: &str = r#"
local ep = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[#ARGV])
return {ep, redis.call('HMGET', KEYS[3], 'pos', 'events')}
"#;

impl Scripts {
    fn new() -> Self {
        Scripts {
            // Shebang scripts (Redis 7): a write script is refused as a whole when Redis is out
            // of memory, before any XADD, which keeps the batch all-or-nothing.
            append: Script::new(&format!("#!lua{LUA_PRELUDE}{LUA_RETENTION}{LUA_APPEND}")),
            // Reads still work when Redis is out of memory (their only write is a missing
            // epoch, a few bytes).
            read: Script::new(&format!("#!lua flags=allow-oom{LUA_PRELUDE}{LUA_READ}")),
            head: Script::new(&format!("#!lua flags=allow-oom{LUA_PRELUDE}{LUA_HEAD}")),
            producer: Script::new(&format!("#!lua flags=allow-oom{LUA_PRELUDE}{LUA_PRODUCER}")),
            checkpoint: Script::new(&format!(
                "#!lua flags=allow-oom{LUA_PRELUDE}{LUA_CHECKPOINT}"
            )),
        }
    }
}

/// The three keys of one thread.
struct Keys {
    stream: String,
    meta: String,
    ckpt: String,
}

impl Keys {
    fn new(prefix: &str, thread: &ThreadId) -> Self {
        Keys {
            stream: format!("{prefix}:{{{thread}}}:log"),
            meta: format!("{prefix}:{{{thread}}}:meta"),
            ckpt: format!("{prefix}:{{{thread}}}:ckpt"),
        }
    }
}

/// One stream entry as stored, before validation.
struct RawEntry {
    pos: StreamPos,
    /// The `e` field, if the entry has one.
    data: Option<Bytes>,
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
    /// URL, or a prefix containing `{` or `}` (it would break the hash tag).
    pub async fn connect(config: RedisLogConfig) -> Result<RedisLog, LogError> {
        if config.prefix.contains(['{', '}']) {
            return Err(LogError::Unavailable(format!(
                "redis key prefix {:?} must not contain braces",
                config.prefix
            )));
        }
        let client = Client::open(config.url.as_str())
            .map_err(|e| LogError::Unavailable(format!("invalid redis URL: {e}")))?;
        // No hidden retries: a call during an outage fails fast (connection refused) or at
        // `op_timeout`; the connection manager reconnects on the next call.
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.op_timeout))
            .set_response_timeout(Some(config.op_timeout))
            .set_number_of_retries(0);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(unavailable)?;
        let log = RedisLog {
            inner: Arc::new(Inner {
                client,
                conn,
                channel: notify::channel(&config.prefix),
                config,
                scripts: Scripts::new(),
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

    /// Runs the append script, conditional on `expected` when given, with a checkpoint
    /// `candidate` when given.
    async fn append_checked(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: Option<LogHead>,
        extras: AppendExtras,
    ) -> Result<Vec<EventId>, LogError> {
        let AppendExtras {
            candidate,
            candidate_min_gap,
            producer,
        } = extras;
        self.timed("append", async {
            let keys = self.keys(thread);
            let retention = &self.inner.config.retention;
            let mut invocation = self.inner.scripts.append.key(&keys.stream);
            invocation
                .key(&keys.meta)
                .key(&keys.ckpt)
                .arg(Epoch::random().to_string())
                .arg(retention.cap(false))
                .arg(retention.cap(true))
                .arg(expected.map(|h| h.epoch.to_string()).unwrap_or_default())
                .arg(expected.map(|h| h.last.to_string()).unwrap_or_default())
                .arg(match candidate {
                    Some(_) => candidate_min_gap.to_string(),
                    None => "-".to_string(),
                })
                .arg(candidate.as_deref().unwrap_or_default())
                .arg(retention.max_age_ms())
                .arg(retention.idle_ttl_ms())
                .arg(producer.as_ref().map(|p| p.id.as_str()).unwrap_or_default())
                .arg(producer.as_ref().map_or(0, |p| p.last_seq))
                .arg(&self.inner.channel)
                .arg(thread.as_str())
                .arg(note_types(events));
            for ev in events {
                invocation.arg(&ev.json[..]);
            }
            let mut conn = self.inner.conn.clone();
            let reply: Value = invocation
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            let items = array(&reply).ok_or_else(|| malformed("append reply"))?;
            if string(items.first().unwrap_or(&Value::Nil)).as_deref() == Some("conflict") {
                return Err(LogError::Conflict(parse_head(&items[1..])?));
            }
            let epoch = parse_epoch(items.first())?;
            let ids = items
                .get(1)
                .and_then(array)
                .ok_or_else(|| malformed("append reply"))?
                .iter()
                .map(|v| parse_pos(v).map(|pos| EventId { epoch, pos }))
                .collect::<Result<Vec<_>, _>>()?;
            if ids.len() != events.len() {
                return Err(malformed("append reply (id count)"));
            }
            Ok(ids)
        })
        .await
    }

    /// Runs a read script (KEYS: stream, meta, ckpt; ARGV: a fresh epoch, then `arg` if any,
    /// then `idle_ttl` in ms), retried once on a dropped connection.
    async fn read_script(
        &self,
        script: &Script,
        thread: &ThreadId,
        arg: Option<&str>,
    ) -> Result<Value, LogError> {
        let keys = self.keys(thread);
        let fresh = Epoch::random().to_string();
        let idle_ttl = self.inner.config.retention.idle_ttl_ms();
        retry_dropped(|| {
            let mut conn = self.inner.conn.clone();
            let mut invocation = script.key(&keys.stream);
            invocation.key(&keys.meta).key(&keys.ckpt).arg(&fresh);
            if let Some(a) = arg {
                invocation.arg(a);
            }
            invocation.arg(idle_ttl);
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await
        .map_err(unavailable)
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
        let started = Instant::now();
        let timeout = self.inner.config.op_timeout;
        let result = match tokio::time::timeout(timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(LogError::Unavailable(format!(
                "redis {op} timed out after {timeout:?}"
            ))),
        };
        metrics::histogram!(BACKEND_LATENCY, "backend" => "redis", "op" => op)
            .record(started.elapsed().as_secs_f64());
        match &result {
            Err(LogError::Unavailable(msg)) => {
                metrics::counter!(BACKEND_ERRORS, "backend" => "redis", "op" => op).increment(1);
                metrics::gauge!(BACKEND_UP).set(0.0);
                tracing::debug!(op, error = %msg, "redis operation failed");
            }
            _ => metrics::gauge!(BACKEND_UP).set(1.0),
        }
        result
    }

    /// One page of the read script: the head and up to `count` raw entries from `start`.
    async fn read_page(
        &self,
        keys: &Keys,
        from: ReadFrom,
        count: usize,
    ) -> Result<(LogHead, Vec<RawEntry>), LogError> {
        let (start, count) = match from {
            ReadFrom::Start => ("-".to_string(), count),
            // Nothing can follow the largest ID (and `XRANGE (<max>` is an error).
            ReadFrom::After(id) if id.pos == StreamPos::new(u64::MAX, u64::MAX) => {
                ("-".to_string(), 0)
            }
            ReadFrom::After(id) => (format!("({}", id.pos), count),
        };
        let fresh = Epoch::random().to_string();
        let reply: Value = retry_dropped(|| {
            let mut conn = self.inner.conn.clone();
            let mut invocation = self.inner.scripts.read.key(&keys.stream);
            invocation
                .key(&keys.meta)
                .key(&keys.ckpt)
                .arg(&fresh)
                .arg(&start)
                // Lua numbers are doubles: keep the count exact.
                .arg(count.min(1 << 40))
                .arg(self.inner.config.retention.idle_ttl_ms());
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await
        .map_err(unavailable)?;
        let items = array(&reply).ok_or_else(|| malformed("read reply"))?;
        let head = parse_head(items)?;
        let entries = parse_entries(items.get(2).ok_or_else(|| malformed("read reply"))?)?;
        Ok((head, entries))
    }
}

#[async_trait::async_trait]
impl EventLog for RedisLog {
    fn name(&self) -> &'static str {
        "redis"
    }

    /// One `EVALSHA` for the whole batch: the epoch is read (or created) and every event is
    /// `XADD … MAXLEN ~ <cap> * e <json>`ed (no `MAXLEN` when `max_events` is 0; `cap` is
    /// `max_events`, or `4 * max_events` once the thread has checkpoints) in the same script,
    /// so the batch is wholly in the log or not at all; then `max_age` (may promote the pending
    /// checkpoint, `TIME`, `XTRIM … MINID`) and `idle_ttl` (`PEXPIRE` of the thread's three
    /// keys, in ms, when less than `idle_ttl` is left: see the script). An `Unavailable` that
    /// comes from a timeout cannot tell whether the script ran; the producer's retry is
    /// deduplicated upstream (`X-Producer-Seq`).
    async fn append(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
    ) -> Result<Vec<EventId>, LogError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.append_checked(thread, events, None, AppendExtras::default())
            .await
    }

    /// The append script with the expected epoch and `last-generated-id` checked first, in
    /// the same atomic step (compare-and-append on the stream's last entry ID). A candidate
    /// is handled in that script after the `XADD`s: `HMGET` of the pending checkpoint, its
    /// promotion (`HSET`/`HDEL` on the `ckpt` hash, `XTRIM <log> MINID <pos + 1>`, exact), and
    /// `HSET` of the candidate as pending at the batch's last entry ID.
    async fn append_if(
        &self,
        thread: &ThreadId,
        events: &[ValidEvent],
        expected: LogHead,
        extras: AppendExtras,
    ) -> Result<Vec<EventId>, LogError> {
        self.append_checked(thread, events, Some(expected), extras)
            .await
    }

    /// Script: the epoch check (a new epoch clears the meta hash), then `HGET <meta> p:<id>`.
    async fn producer_seq(&self, thread: &ThreadId, producer: &str) -> Result<u64, LogError> {
        self.timed("producer", async {
            let reply = self
                .read_script(&self.inner.scripts.producer, thread, Some(producer))
                .await?;
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
                .read_script(&self.inner.scripts.checkpoint, thread, None)
                .await?;
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
                let (head, raw) = self.read_page(&keys, start, want).await?;
                if let ReadFrom::After(id) = start
                    && let Err(gap) = check_resumable(&head, id)
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

    /// Script: epoch (created if missing) and the `XINFO STREAM` fields: `last` is
    /// `last-generated-id`, `max_deleted` the highest removed position (see the module docs);
    /// both `0-0` when the stream does not exist.
    async fn head(&self, thread: &ThreadId) -> Result<LogHead, LogError> {
        self.timed("head", async {
            let reply = self
                .read_script(&self.inner.scripts.head, thread, None)
                .await?;
            parse_head(array(&reply).ok_or_else(|| malformed("head reply"))?)
        })
        .await
    }

    /// `PING`.
    async fn ping(&self) -> Result<(), LogError> {
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
        let shared = Arc::new(TailShared::default());
        let (notice_tx, notice_rx) = mpsc::channel(notify::NOTICE_QUEUE);
        let reader = TailReader {
            log: self.inner.clone(),
            shared: shared.clone(),
            sink,
            shutdown: shutdown.clone(),
            conn: None,
            last_busy_xread: None,
            stream_keys: HashMap::new(),
            keys_generation: 0,
            notices: Some(notice_rx),
            notified: false,
            poll_at: None,
            scan_at: Instant::now(),
            scan_now: true,
            dirty: HashSet::new(),
        };
        tokio::spawn(reader.run());
        let config = &self.inner.config;
        let subscriber = notify::SubscriberConfig {
            channel: self.inner.channel.clone(),
            op_timeout: config.op_timeout,
            ping_every: block_of(config),
        };
        // A reader blocked in its `XREAD` learns of the subscription at once: the waker
        // unblocks it when the generation moves.
        let on_up = {
            let shared = shared.clone();
            move || {
                shared.state.lock().generation += 1;
                shared.waker_wake.notify_one();
            }
        };
        tokio::spawn(notify::run_subscriber(
            self.inner.client.clone(),
            subscriber,
            notice_tx,
            shutdown.clone(),
            on_up,
            backoff,
        ));
        tokio::spawn(run_waker(self.inner.clone(), shared.clone(), shutdown));
        Arc::new(RedisTail { shared })
    }
}

/// The batch's AG-UI types, separated by spaces (ARGV [14] of the append script, for its note).
fn note_types(events: &[ValidEvent]) -> String {
    let mut types = String::with_capacity(events.len() * 16);
    for (i, ev) in events.iter().enumerate() {
        if i > 0 {
            types.push(' ');
        }
        types.push_str(ev.event_type.as_str());
    }
    types
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

// ---------------------------------------------------------------------------------------------
// Tail

/// State shared by the tail's handle ([`RedisTail`]), its reader and its waker.
#[derive(Default)]
struct TailShared {
    state: Mutex<TailState>,
    /// Wakes the reader while it waits with nothing to follow.
    reader_wake: Notify,
    /// Wakes the waker, which then unblocks the reader's `XREAD`.
    waker_wake: Notify,
    /// `CLIENT ID` of the reader's connection; `0` while it has none.
    reader_client_id: AtomicU64,
    /// The [`TailState::generation`] the reader's current `XREAD` was built from.
    seen_generation: AtomicU64,
    /// True while the reader may block in `XREAD` (no append notes): only then does the waker
    /// unblock it.
    blocking: AtomicBool,
}

#[derive(Default)]
struct TailState {
    follows: HashMap<ThreadId, Follow>,
    /// Bumped by every follow and unfollow (and when append notes come up, to wake a blocked
    /// reader); also the version of a new follow.
    generation: u64,
}

#[derive(Clone, Copy, Debug)]
struct Follow {
    /// Distinguishes this follow from an earlier one of the same thread.
    version: u64,
    epoch: Epoch,
    /// Entries strictly after this position are still to be delivered.
    cursor: StreamPos,
    /// When the epoch and position were last checked against the log; `None`: never (a new
    /// follow, or the reader reconnected). Only checked follows are read.
    checked: Option<Instant>,
    /// Set when the thread's keys answered with an error of their own (e.g. `WRONGTYPE`): the
    /// thread is left out of the `XREAD` (which would fail for every thread) and checked again
    /// at this instant.
    retry_at: Option<Instant>,
}

/// The handle the hub holds: follow and unfollow only touch the shared map (never block).
struct RedisTail {
    shared: Arc<TailShared>,
}

impl Tail for RedisTail {
    fn follow(&self, thread: ThreadId, epoch: Epoch, after: StreamPos) {
        {
            let mut state = self.shared.state.lock();
            state.generation += 1;
            let version = state.generation;
            state.follows.insert(
                thread,
                Follow {
                    version,
                    epoch,
                    cursor: after,
                    checked: None,
                    retry_at: None,
                },
            );
        }
        // Lock dropped before notifying.
        self.shared.reader_wake.notify_one();
        self.shared.waker_wake.notify_one();
    }

    fn unfollow(&self, thread: &ThreadId) {
        let mut state = self.shared.state.lock();
        if state.follows.remove(thread).is_some() {
            state.generation += 1;
        }
    }
}

/// What the reader does after a step.
enum Flow {
    Continue,
    Stop,
}

/// The node's single reader: owns the dedicated connection.
///
/// Two modes, switched by the subscriber's [`Notice`]s:
///
/// - **Notified** (subscribed to the append notes): an append note that continues a follow
///   exactly (same epoch, `prev` equal to the cursor) is delivered as it is, without reading
///   Redis; any other note for a followed thread marks it *dirty*, and dirty threads (and new
///   follows) are read with pipelined read scripts (epoch, head and `XRANGE` after the cursor in
///   one atomic step, then [`check_resumable`]). Every `block`, one non-blocking `XREAD` over
///   every followed stream finds what no note announced (producers that `XADD` directly, a
///   note lost with its connection), and quiet threads get their epoch check. Right after
///   subscribing, that `XREAD` runs at once (appends made before the subscription).
/// - **Blocking** (no subscription: at start, or after [`Notice::Down`]): one `XREAD BLOCK`
///   over every followed stream, with a head check of the threads that got entries, as before
///   the notes existed.
///
/// A note is only a hint with a proof of continuity: the stream and the cursor stay the truth,
/// so a lost, late, repeated or foreign note can delay an entry (until the next read) but
/// never lose, repeat or reorder one.
struct TailReader {
    log: Arc<Inner>,
    shared: Arc<TailShared>,
    sink: mpsc::Sender<TailItem>,
    shutdown: CancellationToken,
    conn: Option<MultiplexedConnection>,
    /// When the last `XREAD` that returned entries was sent (see [`xread_interval`]).
    last_busy_xread: Option<Instant>,
    /// Stream key of each followed thread, built once per follow rather than at every
    /// `XREAD` (which names every followed stream); pruned when follows change.
    stream_keys: HashMap<ThreadId, Arc<str>>,
    /// The follow generation `stream_keys` was last pruned at.
    keys_generation: u64,
    /// From the subscriber task; `None` once it has ended.
    notices: Option<mpsc::Receiver<Notice>>,
    /// Subscribed to the append notes (notified mode).
    notified: bool,
    /// Notified mode: when the next non-blocking `XREAD` over every followed stream is due.
    poll_at: Option<Instant>,
    /// Notified mode: when follows are next scanned (epoch checks of quiet threads, broken
    /// threads due for a retry).
    scan_at: Instant,
    /// Notified mode: scan for new follows at the next step.
    scan_now: bool,
    /// Followed threads to read after their cursor (a note did not continue them).
    dirty: HashSet<ThreadId>,
}

/// Most dirty threads read in one pipeline.
const DIRTY_BATCH: usize = 256;

/// Most scans of the follows per tail period (notified mode), see `TailReader::scan`.
const SCANS_PER_PERIOD: u32 = 8;
/// Most notices applied before the reader turns to its reads.
const NOTICE_BATCH: usize = 1024;

/// How an append note relates to a follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Continues {
    /// Every entry of the note is at or before the cursor: already delivered.
    Already,
    /// The note's entries from this index on continue the cursor exactly.
    From(usize),
    /// Something may lie between the cursor and the note (or the epoch differs): read.
    Gap,
}

/// Decides whether `note` continues a follow at `cursor` in `epoch`. Exact because a note's
/// entries are the stream's entries right after `note.prev` (the append script adds them and
/// publishes the note atomically, with `prev` its `last-generated-id` before them).
fn continues(epoch: Epoch, cursor: StreamPos, note: &Note) -> Continues {
    if note.epoch != epoch {
        return Continues::Gap;
    }
    let Some(&(last, _, _)) = note.entries.last() else {
        return Continues::Already;
    };
    if last <= cursor {
        Continues::Already
    } else if note.prev == cursor {
        Continues::From(0)
    } else if note.prev < cursor
        && let Some(i) = note.entries.iter().position(|(p, _, _)| *p == cursor)
    {
        Continues::From(i + 1)
    } else {
        Continues::Gap
    }
}

/// Least time between two `XREAD`s of a busy tail: 2 µs per followed thread, at most 5 ms.
///
/// Every `XREAD` names every followed stream, so Redis (and this node, building the command)
/// pays per followed thread at every call. While entries keep coming, waiting this long before
/// the next call lets each call return the entries of many threads, so the cost per second
/// stays bounded whatever the thread count, for at most this much added latency (2 ms at
/// 1,000 followed threads). An idle tail blocks in `XREAD` as before and is not delayed.
fn xread_interval(followed: usize) -> Duration {
    Duration::from_micros(2 * followed as u64).min(Duration::from_millis(5))
}

/// How long a thread whose keys answer with an error is left out before it is checked again.
const BROKEN_THREAD_RETRY: Duration = Duration::from_secs(5);

/// Backoff after `failures` consecutive failures: 100 ms doubling up to 5 s, each drawn in
/// `[d/2, d]` so nodes do not reconnect in step.
fn backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(100)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(6))
        .min(Duration::from_secs(5));
    base.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

impl TailReader {
    async fn run(mut self) {
        let mut failures: u32 = 0;
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            match self.step().await {
                Ok(Flow::Continue) => failures = 0,
                Ok(Flow::Stop) => return,
                Err(_) if self.shutdown.is_cancelled() => return,
                Err(e) => {
                    self.conn = None;
                    self.shared.reader_client_id.store(0, Ordering::SeqCst);
                    failures = failures.saturating_add(1);
                    let delay = backoff(failures);
                    metrics::counter!(BACKEND_ERRORS, "backend" => "redis", "op" => "tail")
                        .increment(1);
                    metrics::gauge!(BACKEND_UP).set(0.0);
                    tracing::warn!(error = %e, retry_in = ?delay, "redis tail failed; retrying");
                    tokio::select! {
                        biased;
                        _ = self.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// One step: apply the notices that arrived, then one step of the current mode.
    async fn step(&mut self) -> Result<Flow, LogError> {
        if let Flow::Stop = self.take_notices().await {
            return Ok(Flow::Stop);
        }
        // Before the follows are read: a follow made after this sees `blocking` set and is
        // unblocked by the waker, or is seen by this step's snapshot.
        self.shared.blocking.store(!self.notified, Ordering::SeqCst);
        if self.notified {
            self.step_notified().await
        } else {
            self.step_blocking().await
        }
    }

    /// Applies the notices already waiting (at most [`NOTICE_BATCH`]), without waiting.
    async fn take_notices(&mut self) -> Flow {
        for _ in 0..NOTICE_BATCH {
            let Some(rx) = self.notices.as_mut() else {
                return Flow::Continue;
            };
            let notice = match rx.try_recv() {
                Ok(notice) => notice,
                Err(mpsc::error::TryRecvError::Empty) => return Flow::Continue,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.notices = None;
                    self.notified = false;
                    return Flow::Continue;
                }
            };
            if let Flow::Stop = self.apply(notice).await {
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// Applies one notice of the subscriber.
    async fn apply(&mut self, notice: Notice) -> Flow {
        match notice {
            Notice::Up => {
                self.notified = true;
                // Appends made before the subscription were not announced: read everything.
                self.poll_at = Some(Instant::now());
                self.scan_now = true;
                Flow::Continue
            }
            Notice::Down => {
                self.notified = false;
                self.poll_at = None;
                // The blocking `XREAD` reads every followed stream after its cursor.
                self.dirty.clear();
                Flow::Continue
            }
            Notice::Note(note) => self.apply_note(note).await,
        }
    }

    /// Delivers a note's entries when they continue the thread's follow exactly (no read, no
    /// validation: the appending broker validated them); marks the thread dirty when they may
    /// not; ignores notes of threads not followed, not yet checked, or already delivered.
    async fn apply_note(&mut self, note: Note) -> Flow {
        // The slot is reserved before the lock is taken (see `commit`).
        let permit = tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => return Flow::Stop,
            permit = self.sink.reserve() => match permit {
                Ok(permit) => permit,
                Err(_) => return Flow::Stop,
            },
        };
        let mut state = self.shared.state.lock();
        let Some(follow) = state.follows.get_mut(&note.thread) else {
            return Flow::Continue;
        };
        if follow.checked.is_none() {
            // A new follow (its first read covers the note) or a broken thread.
            return Flow::Continue;
        }
        match continues(follow.epoch, follow.cursor, &note) {
            Continues::Already => {}
            Continues::From(i) => {
                let epoch = follow.epoch;
                let entries: Vec<LogEntry> = note
                    .entries
                    .into_iter()
                    .skip(i)
                    .map(|(pos, event_type, json)| LogEntry {
                        id: EventId { epoch, pos },
                        event_type,
                        json,
                    })
                    .collect();
                // Non-empty: `From(i)` means an entry after the cursor exists at `i`.
                if let Some(last) = entries.last() {
                    follow.cursor = last.id.pos;
                    // The note's epoch is the log's, read in the append's script.
                    follow.checked = Some(Instant::now());
                    permit.send(TailItem::Entries {
                        thread: note.thread,
                        entries,
                    });
                }
            }
            Continues::Gap => {
                drop(state);
                self.dirty.insert(note.thread);
            }
        }
        Flow::Continue
    }

    /// Waits for a notice (applied), a new follow, `until`, or shutdown.
    async fn wait(&mut self, until: Option<Instant>) -> Flow {
        let shared = self.shared.clone();
        let shutdown = self.shutdown.clone();
        let sleep = async {
            match until {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let notice = async {
            match self.notices.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let got = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Flow::Stop,
            notice = notice => Some(notice),
            _ = shared.reader_wake.notified() => {
                self.scan_now = true;
                None
            }
            _ = sleep => None,
        };
        match got {
            Some(Some(notice)) => self.apply(notice).await,
            Some(None) => {
                // The subscriber ended (shutdown): stay in blocking mode.
                self.notices = None;
                self.notified = false;
                Flow::Continue
            }
            None => Flow::Continue,
        }
    }

    /// One step in notified mode: scan follows when due, the periodic `XREAD` when due, read
    /// dirty threads, else wait.
    async fn step_notified(&mut self) -> Result<Flow, LogError> {
        if self.shared.state.lock().follows.is_empty() {
            self.dirty.clear();
            return Ok(self.wait(None).await);
        }
        self.connect().await?;
        let period = block_of(&self.log.config);
        let now = Instant::now();
        if self.scan_now || now >= self.scan_at {
            self.scan_now = false;
            if let Flow::Stop = self.scan(now, period).await? {
                return Ok(Flow::Stop);
            }
        }
        if let Some(at) = self.poll_at
            && now >= at
        {
            self.poll_at = Some(now + period);
            let readable: Vec<(ThreadId, Follow)> = {
                let state = self.shared.state.lock();
                state
                    .follows
                    .iter()
                    .filter(|(_, f)| f.checked.is_some())
                    .map(|(t, f)| (t.clone(), *f))
                    .collect()
            };
            if !readable.is_empty() {
                return self.xread(readable, false).await;
            }
        }
        if !self.dirty.is_empty() {
            return self.read_dirty().await;
        }
        let until = match self.poll_at {
            Some(at) => at.min(self.scan_at),
            None => self.scan_at,
        };
        Ok(self.wait(Some(until)).await)
    }

    /// Notified mode: new follows (and broken threads due for a retry) become dirty; quiet
    /// threads whose epoch was last checked a `period` ago get the epoch check of [`check`].
    ///
    /// [`check`]: TailReader::check
    async fn scan(&mut self, now: Instant, period: Duration) -> Result<Flow, LogError> {
        let mut known = Vec::new();
        let mut next = now + period;
        let generation = {
            let state = self.shared.state.lock();
            for (thread, f) in &state.follows {
                match (f.checked, f.retry_at) {
                    (None, Some(at)) if now < at => next = next.min(at),
                    (None, _) => {
                        self.dirty.insert(thread.clone());
                    }
                    (Some(at), _) if now.duration_since(at) >= period => {
                        known.push((thread.clone(), *f));
                    }
                    (Some(at), _) => next = next.min(at + period),
                }
            }
            state.generation
        };
        self.shared
            .seen_generation
            .store(generation, Ordering::SeqCst);
        // At most `SCANS_PER_PERIOD` scans per period: each walks every follow, and the
        // thread due first is rarely far ahead of the others (each note delivered re-arms its
        // thread's check), so scanning exactly when it is due walked 1,000 follows per step at
        // 1,000 threads (4% of the node's CPU). An epoch check or a retry is then late by at
        // most `period / SCANS_PER_PERIOD`.
        self.scan_at = next.max(now + period / SCANS_PER_PERIOD);
        if known.is_empty() {
            return Ok(Flow::Continue);
        }
        self.check(known).await
    }

    /// Reads dirty threads after their cursors (at most [`DIRTY_BATCH`] per call): pipelined
    /// read scripts, each the epoch, the head and `XRANGE (<cursor> + COUNT n` in one atomic
    /// step, then [`check_resumable`] of the cursor against that head: the entries are
    /// delivered (after validation: they may come from a direct `XADD`), or a discontinuity.
    /// A thread that returned a full page stays dirty.
    async fn read_dirty(&mut self) -> Result<Flow, LogError> {
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
        for (thread, follow) in &todo {
            let keys = Keys::new(&config.prefix, thread);
            // Nothing can follow the largest ID (and `XRANGE (<max>` is an error).
            let (start, n) = if follow.cursor == StreamPos::new(u64::MAX, u64::MAX) {
                ("-".to_string(), 0)
            } else {
                (format!("({}", follow.cursor), count)
            };
            pipe.cmd("EVALSHA")
                .arg(self.log.scripts.read.get_hash())
                .arg(3)
                .arg(keys.stream)
                .arg(keys.meta)
                .arg(keys.ckpt)
                .arg(Epoch::random().to_string())
                .arg(start)
                .arg(n)
                .arg(config.retention.idle_ttl_ms());
        }
        let op_timeout = config.op_timeout;
        let Some(replies) = self.query(&pipe, op_timeout).await? else {
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
                other => array(other)
                    .ok_or_else(|| malformed("read reply"))
                    .and_then(|items| {
                        let head = parse_head(items)?;
                        let raw =
                            parse_entries(items.get(2).ok_or_else(|| malformed("read reply"))?)?;
                        Ok((head, raw))
                    })?,
            };
            let (head, raw) = page;
            let at = EventId {
                epoch: follow.epoch,
                pos: follow.cursor,
            };
            let flow = match check_resumable(&head, at) {
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

    /// One step in blocking mode: wait for a follow, or check due threads, or `XREAD BLOCK`
    /// once and deliver.
    async fn step_blocking(&mut self) -> Result<Flow, LogError> {
        let (generation, follows) = {
            let state = self.shared.state.lock();
            let follows: Vec<(ThreadId, Follow)> =
                state.follows.iter().map(|(t, f)| (t.clone(), *f)).collect();
            (state.generation, follows)
        };
        if follows.is_empty() {
            return Ok(self.wait(None).await);
        }
        self.connect().await?;
        let period = self.log.config.block;
        let now = Instant::now();
        let due: Vec<(ThreadId, Follow)> = follows
            .iter()
            .filter(|(_, f)| match f.checked {
                None => f.retry_at.is_none_or(|at| now >= at),
                Some(at) => now.duration_since(at) >= period,
            })
            .cloned()
            .collect();
        if !due.is_empty() {
            return self.check(due).await;
        }
        let next_retry = follows.iter().filter_map(|(_, f)| f.retry_at).min();
        let readable: Vec<(ThreadId, Follow)> = follows
            .into_iter()
            .filter(|(_, f)| f.checked.is_some())
            .collect();
        self.shared
            .seen_generation
            .store(generation, Ordering::SeqCst);
        if readable.is_empty() {
            // Every followed thread is broken: wait for its retry time or a new follow.
            let until = next_retry.unwrap_or(now + period);
            return Ok(self.wait(Some(until)).await);
        }
        self.xread(readable, true).await
    }

    /// Opens the dedicated connection if there is none: `CLIENT ID` (for `CLIENT UNBLOCK`),
    /// `CLIENT SETNAME`, `SCRIPT LOAD` of the head and read scripts (pipelined `EVALSHA`
    /// later).
    async fn connect(&mut self) -> Result<(), LogError> {
        if self.conn.is_some() {
            return Ok(());
        }
        let config = &self.log.config;
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.op_timeout))
            .set_response_timeout(Some(block_of(config) + config.op_timeout));
        let client = &self.log.client;
        let head = &self.log.scripts.head;
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
            head.prepare_invoke().load_async(&mut conn).await?;
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
        self.conn = Some(conn);
        self.shared.reader_client_id.store(id, Ordering::SeqCst);
        metrics::gauge!(BACKEND_UP).set(1.0);
        // Redis may have restarted without its data: check every thread again.
        for f in self.shared.state.lock().follows.values_mut() {
            f.checked = None;
        }
        tracing::info!(client_id = id, "redis tail connected");
        Ok(())
    }

    fn conn(&mut self) -> Result<&mut MultiplexedConnection, LogError> {
        self.conn
            .as_mut()
            .ok_or_else(|| LogError::Unavailable("redis tail not connected".into()))
    }

    /// Sends `pipe` on the dedicated connection under `deadline`, watching for shutdown.
    async fn query(
        &mut self,
        pipe: &redis::Pipeline,
        deadline: Duration,
    ) -> Result<Option<Vec<Value>>, LogError> {
        let shutdown = self.shutdown.clone();
        let conn = self.conn()?;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => Ok(None),
            reply = tokio::time::timeout(deadline, pipe.query_async::<Vec<Value>>(conn)) => match reply {
                Ok(Ok(values)) => Ok(Some(values)),
                Ok(Err(e)) => Err(unavailable(e)),
                Err(_) => Err(LogError::Unavailable(format!("redis tail timed out after {deadline:?}"))),
            },
        }
    }

    /// Checks `due` threads: new follows get a full head check ([`check_resumable`] of their
    /// cursor); the others an `HGET` of the epoch (a full check if it changed or vanished).
    async fn check(&mut self, due: Vec<(ThreadId, Follow)>) -> Result<Flow, LogError> {
        let prefix = self.log.config.prefix.clone();
        let op_timeout = self.log.config.op_timeout;
        let (fresh, known): (Vec<_>, Vec<_>) =
            due.into_iter().partition(|(_, f)| f.checked.is_none());
        let mut full = fresh;
        if !known.is_empty() {
            let mut pipe = redis::pipe();
            for (thread, _) in &known {
                pipe.cmd("HGET")
                    .arg(Keys::new(&prefix, thread).meta)
                    .arg("epoch");
            }
            let Some(epochs) = self.query(&pipe, op_timeout).await? else {
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
        let heads = self.heads(full.iter().map(|(t, _)| t)).await?;
        let Some(heads) = heads else {
            return Ok(Flow::Stop);
        };
        let now = Instant::now();
        for ((thread, follow), head) in full.into_iter().zip(heads) {
            let head = match head {
                Ok(head) => head,
                Err(e) => {
                    self.broken(&thread, follow.version, &e);
                    continue;
                }
            };
            let at = EventId {
                epoch: follow.epoch,
                pos: follow.cursor,
            };
            let flow = match check_resumable(&head, at) {
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

    /// Pipelined head scripts (`EVALSHA`, loaded at connect) for `threads`, in order. An error
    /// of one thread's own keys is that thread's `Err`; any other error fails the whole call.
    async fn heads<'a>(
        &mut self,
        threads: impl Iterator<Item = &'a ThreadId>,
    ) -> Result<Option<Vec<Result<LogHead, LogError>>>, LogError> {
        let prefix = self.log.config.prefix.clone();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for thread in threads {
            let keys = Keys::new(&prefix, thread);
            pipe.cmd("EVALSHA")
                .arg(self.log.scripts.head.get_hash())
                .arg(3)
                .arg(keys.stream)
                .arg(keys.meta)
                .arg(keys.ckpt)
                .arg(Epoch::random().to_string())
                .arg(self.log.config.retention.idle_ttl_ms());
        }
        let op_timeout = self.log.config.op_timeout;
        let Some(replies) = self.query(&pipe, op_timeout).await? else {
            return Ok(None);
        };
        replies
            .iter()
            .map(|reply| match reply {
                Value::ServerError(e) if matches!(e.code(), "WRONGTYPE" | "ERR") => {
                    Ok(Err(LogError::Unavailable(format!("redis: {e}"))))
                }
                Value::ServerError(e) => Err(LogError::Unavailable(format!("redis: {e}"))),
                other => Ok(array(other)
                    .ok_or_else(|| malformed("head reply"))
                    .and_then(parse_head)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// `XREAD COUNT n [BLOCK ms] STREAMS <keys…> <cursors…>` (`BLOCK` in blocking mode; the
    /// notified mode's periodic read returns at once), then, for the threads that got entries,
    /// a pipelined head check: the entries are delivered only if the cursor was still
    /// resumable (same epoch, nothing after it trimmed); otherwise a discontinuity.
    async fn xread(
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
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(config.read_count.max(1));
        if block {
            cmd.arg("BLOCK")
                .arg(u64::try_from(block_of(config).as_millis()).unwrap_or(u64::MAX));
        }
        cmd.arg("STREAMS");
        let mut by_key: HashMap<Arc<str>, usize> = HashMap::with_capacity(follows.len());
        for (i, (thread, _)) in follows.iter().enumerate() {
            let key = self
                .stream_keys
                .entry(thread.clone())
                .or_insert_with(|| Keys::new(&config.prefix, thread).stream.into());
            cmd.arg(&**key);
            by_key.insert(key.clone(), i);
        }
        for (_, follow) in &follows {
            cmd.arg(follow.cursor.to_string());
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd);
        let deadline = if block {
            block_of(config) + config.op_timeout
        } else {
            config.op_timeout
        };
        let Some(mut replies) = self.query(&pipe, deadline).await? else {
            return Ok(Flow::Stop);
        };
        let reply = replies.pop().unwrap_or(Value::Nil);
        let mut got: Vec<(usize, Vec<RawEntry>)> = Vec::new();
        for (key, entries) in parse_xread(&reply)? {
            if let Some(&i) = by_key.get(key.as_str())
                && !entries.is_empty()
            {
                got.push((i, entries));
            }
        }
        if got.is_empty() {
            return Ok(Flow::Continue);
        }
        if block {
            self.last_busy_xread = Some(sent);
        }
        let Some(heads) = self.heads(got.iter().map(|(i, _)| &follows[*i].0)).await? else {
            return Ok(Flow::Stop);
        };
        let now = Instant::now();
        for ((i, raw), head) in got.into_iter().zip(heads) {
            let (thread, follow) = &follows[i];
            let head = match head {
                Ok(head) => head,
                Err(e) => {
                    self.broken(thread, follow.version, &e);
                    continue;
                }
            };
            let at = EventId {
                epoch: follow.epoch,
                pos: follow.cursor,
            };
            let flow = match check_resumable(&head, at) {
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

    /// Reports a discontinuity and moves the follow strictly after `head.last`.
    async fn discontinuity(
        &mut self,
        thread: ThreadId,
        version: u64,
        head: LogHead,
        reason: ResumeGap,
    ) -> Flow {
        tracing::info!(%thread, reason = reason.as_str(), epoch = %head.epoch, last = %head.last,
            "redis tail discontinuity");
        let item = TailItem::Discontinuity {
            thread: thread.clone(),
            head,
            reason,
        };
        let now = Instant::now();
        self.commit(&thread, version, Some(item), |f| {
            f.epoch = head.epoch;
            f.cursor = head.last;
            f.checked = Some(now);
            f.retry_at = None;
        })
        .await
    }

    /// Applies `update` to the follow of `thread` and sends `item`, both only if the follow is
    /// still the one (`version`) the item was computed for. The send slot is reserved first and
    /// used under the lock, so nothing of a replaced or removed follow is sent after
    /// [`Tail::follow`] / [`Tail::unfollow`] returned.
    async fn commit(
        &self,
        thread: &ThreadId,
        version: u64,
        item: Option<TailItem>,
        update: impl FnOnce(&mut Follow),
    ) -> Flow {
        let permit = match item {
            Some(_) => tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Flow::Stop,
                permit = self.sink.reserve() => match permit {
                    Ok(permit) => Some(permit),
                    // The hub is gone: nobody to deliver to.
                    Err(_) => return Flow::Stop,
                },
            },
            None => None,
        };
        let mut state = self.shared.state.lock();
        if let Some(follow) = state.follows.get_mut(thread)
            && follow.version == version
        {
            update(follow);
            if let (Some(permit), Some(item)) = (permit, item) {
                permit.send(item);
            }
        }
        Flow::Continue
    }

    /// Leaves `thread` out of the reads until [`BROKEN_THREAD_RETRY`] has passed (its keys
    /// answered with an error of their own; the other threads keep flowing).
    fn broken(&self, thread: &ThreadId, version: u64, error: &LogError) {
        metrics::counter!(BACKEND_ERRORS, "backend" => "redis", "op" => "tail").increment(1);
        tracing::warn!(%thread, %error, retry_in = ?BROKEN_THREAD_RETRY,
            "redis tail cannot read this thread's keys");
        let retry_at = Instant::now() + BROKEN_THREAD_RETRY;
        self.update(thread, version, |f| {
            f.checked = None;
            f.retry_at = Some(retry_at);
        });
    }

    /// Applies `update` to the follow of `thread` if it is still `version`.
    fn update(&self, thread: &ThreadId, version: u64, update: impl FnOnce(&mut Follow)) {
        let mut state = self.shared.state.lock();
        if let Some(follow) = state.follows.get_mut(thread)
            && follow.version == version
        {
            update(follow);
        }
    }
}

/// The configured block time, at least 1 ms (`BLOCK 0` would wait forever).
fn block_of(config: &RedisLogConfig) -> Duration {
    config.block.max(Duration::from_millis(1))
}

/// Unblocks the reader's `XREAD` (`CLIENT UNBLOCK <id> TIMEOUT`) after a follow, until the
/// reader has rebuilt its `XREAD` from that follow or more. Retries with growing pauses (the
/// reader may have been between two `XREAD`s) and gives up on a Redis error (the reader then
/// reconnects and rebuilds anyway).
async fn run_waker(log: Arc<Inner>, shared: Arc<TailShared>, shutdown: CancellationToken) {
    let max_pause = block_of(&log.config);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = shared.waker_wake.notified() => {}
        }
        let mut pause = Duration::from_millis(5);
        loop {
            let wanted = shared.state.lock().generation;
            if shared.seen_generation.load(Ordering::SeqCst) >= wanted {
                break;
            }
            let id = shared.reader_client_id.load(Ordering::SeqCst);
            // A reader that does not block (notified mode) is woken by `reader_wake`.
            if id == 0 || !shared.blocking.load(Ordering::SeqCst) {
                break;
            }
            let mut conn = log.conn.clone();
            let mut cmd = redis::cmd("CLIENT");
            cmd.arg("UNBLOCK").arg(id).arg("TIMEOUT");
            let unblock = cmd.query_async::<i64>(&mut conn);
            let sent = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                sent = tokio::time::timeout(log.config.op_timeout, unblock) => sent,
            };
            if !matches!(sent, Ok(Ok(_))) {
                break;
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(max_pause);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Entries and replies

/// Validates raw entries of `thread` (SPEC §2: producers may write directly): an entry without
/// `e`, or whose `e` is not a valid AG-UI event of this thread, is logged, counted and skipped.
fn decode_entries(thread: &ThreadId, epoch: Epoch, raw: Vec<RawEntry>) -> Vec<LogEntry> {
    raw.into_iter()
        .filter_map(|entry| {
            let id = EventId {
                epoch,
                pos: entry.pos,
            };
            let Some(data) = entry.data else {
                skip_invalid(thread, id, "no field `e`");
                return None;
            };
            match validate_event(&data, Some(thread)) {
                Ok(event) => Some(LogEntry {
                    id,
                    event_type: event.event_type,
                    json: event.json,
                }),
                Err(e) => {
                    skip_invalid(thread, id, &e.to_string());
                    None
                }
            }
        })
        .collect()
}

fn skip_invalid(thread: &ThreadId, id: EventId, why: &str) {
    tracing::warn!(%thread, entry = %id.pos, error = why, "skipping invalid log entry");
    metrics::counter!(INVALID_ENTRIES).increment(1);
}

fn unavailable(e: RedisError) -> LogError {
    LogError::Unavailable(format!("redis: {e}"))
}

fn malformed(what: &str) -> LogError {
    LogError::Unavailable(format!("redis: unexpected {what}"))
}

fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        Value::Attribute { data, .. } => array(data),
        _ => None,
    }
}

fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        Value::Attribute { data, .. } => bytes_of(data),
        _ => None,
    }
}

fn string(v: &Value) -> Option<String> {
    bytes_of(v).and_then(|b| std::str::from_utf8(b).ok().map(str::to_owned))
}

fn parse_epoch_str(s: &str) -> Option<Epoch> {
    (s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(s, 16).ok().map(Epoch))
        .flatten()
}

fn parse_epoch(v: Option<&Value>) -> Result<Epoch, LogError> {
    v.and_then(string)
        .as_deref()
        .and_then(parse_epoch_str)
        .ok_or_else(|| malformed("epoch"))
}

fn parse_pos(v: &Value) -> Result<StreamPos, LogError> {
    string(v)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("entry ID"))
}

/// `{epoch, {last, max_deleted, first, length, entries_added, ckpt_pos, ckpt_ord}, …}` of the
/// head and read scripts (the inner list: `XINFO STREAM` fields and the checkpoint's), as a
/// [`LogHead`].
fn parse_head(items: &[Value]) -> Result<LogHead, LogError> {
    let info = items
        .get(1)
        .and_then(array)
        .ok_or_else(|| malformed("stream info"))?;
    let pos = |i: usize| {
        info.get(i)
            .ok_or_else(|| malformed("stream info"))
            .and_then(parse_pos)
    };
    let count = |i: usize| match info.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        Some(other) => string(other)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| malformed("stream info")),
        None => Err(malformed("stream info")),
    };
    let last = pos(0)?;
    let stream = StreamCounts {
        last,
        deleted: pos(1)?,
        first: pos(2)?,
        length: count(3)?,
        added: count(4)?,
    };
    let ord = count(6)?;
    let checkpoint = (ord >= 0).then_some((pos(5)?, ord));
    Ok(LogHead {
        epoch: parse_epoch(items.first())?,
        last,
        max_deleted: max_deleted(stream, checkpoint),
    })
}

/// The `XINFO STREAM` fields [`max_deleted`] works from.
#[derive(Clone, Copy, Debug)]
struct StreamCounts {
    /// `last-generated-id`.
    last: StreamPos,
    /// `max-deleted-entry-id`.
    deleted: StreamPos,
    /// `recorded-first-entry-id`.
    first: StreamPos,
    /// `length`.
    length: i64,
    /// `entries-added`.
    added: i64,
}

/// The highest position removed from a stream, from `XINFO STREAM` fields and the promoted
/// checkpoint (`(pos, ord)`, `ord` being `entries-added` when the `pos` entry was added).
///
/// Redis 7.0 updates `max-deleted-entry-id` on `XDEL` only, not when `XADD … MAXLEN` or
/// `XTRIM` trims. When the stream holds exactly the entries added after the checkpoint
/// (`length == entries-added - ord`: the promotion trimmed everything up to `pos`, nothing
/// after it is gone), the answer is exact: `pos` (or a higher `max-deleted-entry-id`). Else,
/// when `entries-added` exceeds `length` something was removed, and every entry before the
/// first one retained is gone. The bound is then the position just before `first` (or `last`
/// for an emptied stream): exact when the last trimmed entry shares the first retained entry's
/// millisecond, otherwise slightly higher, so resuming from the very last trimmed id may be
/// reported as trimmed (a prelude instead of an exact resume), never the other way round.
fn max_deleted(s: StreamCounts, checkpoint: Option<(StreamPos, i64)>) -> StreamPos {
    let StreamCounts {
        last,
        deleted,
        first,
        length,
        added,
    } = s;
    if added <= length {
        return deleted;
    }
    if let Some((pos, ord)) = checkpoint
        && length == added - ord
    {
        return deleted.max(pos);
    }
    let bound = if length <= 0 || first == StreamPos::ZERO {
        last
    } else if first.seq > 0 {
        StreamPos::new(first.ms, first.seq - 1)
    } else {
        StreamPos::new(first.ms.saturating_sub(1), u64::MAX)
    };
    deleted.max(bound)
}

/// An `XRANGE`-shaped reply: `[[id, [field, value, …]], …]` (RESP2 or RESP3).
fn parse_entries(v: &Value) -> Result<Vec<RawEntry>, LogError> {
    let items = match v {
        Value::Nil => return Ok(Vec::new()),
        other => array(other).ok_or_else(|| malformed("entry list"))?,
    };
    items
        .iter()
        .map(|entry| {
            let parts = array(entry).ok_or_else(|| malformed("entry"))?;
            let pos = parse_pos(parts.first().ok_or_else(|| malformed("entry"))?)?;
            let data = parts.get(1).and_then(field_e);
            Ok(RawEntry { pos, data })
        })
        .collect()
}

/// The value of field `e` among an entry's fields (flat array or RESP3 map).
fn field_e(fields: &Value) -> Option<Bytes> {
    match fields {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| bytes_of(k) == Some(b"e"))
            .and_then(|(_, v)| bytes_of(v))
            .map(Bytes::copy_from_slice),
        other => array(other)?
            .chunks(2)
            .find(|kv| kv.len() == 2 && bytes_of(&kv[0]) == Some(b"e"))
            .and_then(|kv| bytes_of(&kv[1]))
            .map(Bytes::copy_from_slice),
    }
}

/// An `XREAD` reply: `nil`, `[[key, entries], …]` (RESP2) or `{key: entries}` (RESP3).
fn parse_xread(v: &Value) -> Result<Vec<(String, Vec<RawEntry>)>, LogError> {
    let pairs: Vec<(&Value, &Value)> = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        other => array(other)
            .ok_or_else(|| malformed("XREAD reply"))?
            .iter()
            .map(|kv| match array(kv) {
                Some([k, v]) => Ok((k, v)),
                _ => Err(malformed("XREAD reply")),
            })
            .collect::<Result<_, _>>()?,
    };
    pairs
        .into_iter()
        .map(|(k, v)| {
            let key = string(k).ok_or_else(|| malformed("XREAD key"))?;
            Ok((key, parse_entries(v)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_hash_tag() {
        let thread = ThreadId::parse("t-1").unwrap();
        let keys = Keys::new("agui", &thread);
        assert_eq!(keys.stream, "agui:{t-1}:log");
        assert_eq!(keys.meta, "agui:{t-1}:meta");
        assert_eq!(keys.ckpt, "agui:{t-1}:ckpt");
    }

    #[test]
    fn max_deleted_is_exact_at_a_checkpoint() {
        let counts = |first, length, added| StreamCounts {
            last: StreamPos::new(9, 3),
            deleted: StreamPos::ZERO,
            first,
            length,
            added,
        };
        // Nothing removed.
        let s = counts(StreamPos::new(1, 0), 10, 10);
        assert_eq!(max_deleted(s, None), StreamPos::ZERO);
        // Promoted at 4-1 (the 6th entry added); the next entry is 7-0: exact, not 6-MAX.
        let s = counts(StreamPos::new(7, 0), 4, 10);
        let ckpt = Some((StreamPos::new(4, 1), 6));
        assert_eq!(max_deleted(s, ckpt), StreamPos::new(4, 1));
        assert_eq!(max_deleted(s, None), StreamPos::new(6, u64::MAX));
        // Something after the checkpoint went too (safety cap): the conservative bound.
        let s = counts(StreamPos::new(8, 0), 3, 10);
        assert_eq!(max_deleted(s, ckpt), StreamPos::new(7, u64::MAX));
        // An entry XDEL'd before the checkpoint does not move it.
        let s = StreamCounts {
            deleted: StreamPos::new(3, 0),
            ..counts(StreamPos::new(7, 0), 4, 10)
        };
        assert_eq!(max_deleted(s, ckpt), StreamPos::new(4, 1));
    }

    #[test]
    fn backoff_is_capped_and_jittered() {
        for failures in 1..40 {
            let d = backoff(failures);
            assert!(d >= Duration::from_millis(50), "{d:?}");
            assert!(d <= Duration::from_secs(5), "{d:?}");
        }
        assert!(backoff(1) <= Duration::from_millis(100));
    }

    #[test]
    fn parses_xread_and_entries() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("agui:{t}:log"),
            Value::Array(vec![
                Value::Array(vec![bulk("5-1"), Value::Array(vec![bulk("e"), bulk("{}")])]),
                Value::Array(vec![bulk("5-2"), Value::Array(vec![bulk("x"), bulk("1")])]),
            ]),
        ])]);
        let parsed = parse_xread(&reply).unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].0, "agui:{t}:log");
        let entries = &parsed[0].1;
        assert_eq!(entries[0].pos, StreamPos::new(5, 1));
        assert_eq!(entries[0].data.as_deref(), Some(&b"{}"[..]));
        assert_eq!(entries[1].data, None);
        assert!(parse_xread(&Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn a_note_continues_only_from_its_prev() {
        let note = Note {
            thread: ThreadId::parse("t").unwrap(),
            epoch: Epoch(7),
            prev: StreamPos::new(5, 0),
            entries: [StreamPos::new(5, 1), StreamPos::new(6, 0)]
                .into_iter()
                .map(|p| {
                    (
                        p,
                        crate::event::EventType::Custom,
                        Bytes::from_static(b"{}"),
                    )
                })
                .collect(),
        };
        let at = |ms, seq| continues(Epoch(7), StreamPos::new(ms, seq), &note);
        assert_eq!(at(5, 0), Continues::From(0));
        // The cursor inside the batch (a read limited by `COUNT` stopped there).
        assert_eq!(at(5, 1), Continues::From(1));
        assert_eq!(at(6, 0), Continues::Already);
        assert_eq!(at(9, 0), Continues::Already);
        // Entries between the cursor and `prev` may exist (a direct XADD, a lost note).
        assert_eq!(at(4, 0), Continues::Gap);
        // Not one of the batch's IDs: not a position of this log.
        assert_eq!(at(5, 5), Continues::Gap);
        // Another epoch, even at the same position.
        assert_eq!(
            continues(Epoch(8), StreamPos::new(5, 0), &note),
            Continues::Gap
        );
    }

    #[test]
    fn note_types_are_space_separated() {
        let ev = |t: &str| {
            validate_event(
                format!(r#"{{"type":"{t}","name":"n","value":1}}"#).as_bytes(),
                None,
            )
            .unwrap()
        };
        assert_eq!(note_types(&[]), "");
        assert_eq!(note_types(&[ev("CUSTOM"), ev("CUSTOM")]), "CUSTOM CUSTOM");
    }

    #[test]
    fn epoch_strings() {
        assert_eq!(parse_epoch_str("0a1b2c3d"), Some(Epoch(0x0a1b2c3d)));
        assert_eq!(parse_epoch_str("0a1b2c3"), None);
        assert_eq!(parse_epoch_str("+a1b2c3d"), None);
    }
}
