//! The Redis backend's Lua scripts (`scripts/*.lua`, each headed by its KEYS and ARGV) and one
//! typed argument struct per script: the struct's `write` is the only place that spells a
//! script's KEYS/ARGV order, whether the script is invoked alone or pipelined as `EVALSHA`;
//! and running a read-only one (`RedisLog::read_script`).

use super::{RedisLog, retry_dropped};
use crate::event::{ThreadId, ValidEvent};
use crate::log::{Epoch, LogHead, ProducerMark, StreamPos};
use redis::{Pipeline, RedisError, Script, ScriptInvocation, ToRedisArgs, Value};

/// The scripts, built once (their SHA1 is computed at construction).
pub(super) struct Scripts {
    /// `append.lua`, called with [`AppendArgs`].
    pub append: Script,
    /// `producer.lua`, called with [`ProducerArgs`].
    pub producer: Script,
    /// `read.lua`, called with [`ReadArgs`].
    pub read: Script,
    /// `head.lua`, called with [`HeadArgs`].
    pub head: Script,
    /// `checkpoint.lua`, called with [`HeadArgs`].
    pub checkpoint: Script,
    /// `summary.lua`, called with [`HeadArgs`] (admin API).
    pub summary: Script,
    /// `outcome.lua`, called with [`OutcomeArgs`].
    pub outcome: Script,
    /// `probe.lua`, called with [`ProbeArgs`].
    pub probe: Script,
}

/// Shebang of the write script (Redis 7): a write script is refused as a whole when Redis is
/// out of memory, before any `XADD`, which keeps the batch all-or-nothing.
const APPEND: &str = concat!(
    "#!lua\n",
    include_str!("scripts/helpers.lua"),
    include_str!("scripts/retention.lua"),
    include_str!("scripts/append.lua"),
);

/// Shebang of the read scripts: they still work when Redis is out of memory (their only write
/// is a missing epoch, a few bytes).
macro_rules! read_script {
    ($file:literal) => {
        concat!(
            "#!lua flags=allow-oom\n",
            include_str!("scripts/helpers.lua"),
            include_str!($file),
        )
    };
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            append: Script::new(APPEND),
            read: Script::new(read_script!("scripts/read.lua")),
            head: Script::new(read_script!("scripts/head.lua")),
            producer: Script::new(read_script!("scripts/producer.lua")),
            checkpoint: Script::new(read_script!("scripts/checkpoint.lua")),
            summary: Script::new(read_script!("scripts/summary.lua")),
            // Allowed when Redis is out of memory: the fence is a few bytes, and an append it
            // cannot settle is answered "outcome unknown".
            outcome: Script::new(concat!(
                "#!lua flags=allow-oom\n",
                include_str!("scripts/outcome.lua")
            )),
            probe: Script::new(concat!("#!lua\n", include_str!("scripts/probe.lua"))),
        }
    }
}

/// The three keys of one thread, in one hash slot (`{threadId}` hash tag): KEYS 1–3 of every
/// script.
pub(super) struct Keys {
    /// `<prefix>:{<thread>}:log`, the stream.
    pub stream: String,
    /// `<prefix>:{<thread>}:meta`, the epoch and producer marks.
    pub meta: String,
    /// `<prefix>:{<thread>}:ckpt`, the checkpoints.
    pub ckpt: String,
    /// `<prefix>:{<thread>}:n`, the thread's shard channel of append notes on a cluster.
    pub notes: String,
    /// `<prefix>:{<thread>}:o:`, followed by an append's token: its outcome key
    /// ([`Keys::outcome`]).
    outcome_prefix: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, thread: &ThreadId) -> Self {
        Keys {
            stream: format!("{prefix}:{{{thread}}}:log"),
            meta: format!("{prefix}:{{{thread}}}:meta"),
            ckpt: format!("{prefix}:{{{thread}}}:ckpt"),
            notes: format!("{prefix}:{{{thread}}}:n"),
            outcome_prefix: format!("{prefix}:{{{thread}}}:o:"),
        }
    }

    /// `<prefix>:{<thread>}:o:<token>`: where the append with `token` records its outcome
    /// (`append.lua` KEYS[4]) and where `outcome.lua` settles it; same hash slot as the rest.
    pub(super) fn outcome(&self, token: AppendToken) -> String {
        format!("{}{token}", self.outcome_prefix)
    }
}

/// A random 128-bit token naming one append (PROTOCOL §2 "Unknown outcomes"): the append
/// records its outcome under it, and a broker that lost the append's reply asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AppendToken(u128);

impl AppendToken {
    /// Draws a fresh token.
    pub(super) fn random() -> Self {
        AppendToken(rand::random())
    }
}

impl std::fmt::Display for AppendToken {
    /// 32 lowercase hex digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Where a script's KEYS and ARGV are written: a [`ScriptInvocation`] (`EVALSHA`, loading the
/// script on `NOSCRIPT`) or the last `EVALSHA` command of a [`Pipeline`].
pub(super) trait ScriptCall {
    /// Appends one of KEYS.
    fn push_key<T: ToRedisArgs>(&mut self, key: T);
    /// Appends one of ARGV.
    fn push_arg<T: ToRedisArgs>(&mut self, arg: T);
}

impl ScriptCall for ScriptInvocation<'_> {
    fn push_key<T: ToRedisArgs>(&mut self, key: T) {
        self.key(key);
    }
    fn push_arg<T: ToRedisArgs>(&mut self, arg: T) {
        self.arg(arg);
    }
}

impl ScriptCall for Pipeline {
    fn push_key<T: ToRedisArgs>(&mut self, key: T) {
        self.arg(key);
    }
    fn push_arg<T: ToRedisArgs>(&mut self, arg: T) {
        self.arg(arg);
    }
}

/// The arguments of one script.
pub(super) trait ScriptArgs {
    /// Writes KEYS, then ARGV, in the script's order.
    fn write(&self, call: &mut impl ScriptCall);

    /// How many of the arguments [`ScriptArgs::write`] writes are KEYS.
    fn key_count(&self) -> usize {
        3
    }

    /// An invocation of `script` with these arguments.
    fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        self.write(&mut invocation);
        invocation
    }

    /// Adds `EVALSHA <sha> <key count> <keys> <argv>` to `pipe` (the script must be loaded on
    /// that connection: `SCRIPT LOAD`).
    fn evalsha(&self, pipe: &mut Pipeline, script: &Script) {
        pipe.cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(self.key_count());
        self.write(pipe);
    }
}

fn write_keys(call: &mut impl ScriptCall, keys: &Keys) {
    call.push_key(&keys.stream);
    call.push_key(&keys.meta);
    call.push_key(&keys.ckpt);
}

/// The arguments of `append.lua` (see its header for what the script does with each).
pub(super) struct AppendArgs<'a> {
    /// KEYS 1–3: the thread's keys.
    pub keys: &'a Keys,
    /// KEYS 4: this append's outcome key ([`Keys::outcome`]).
    pub outcome: &'a str,
    /// ARGV 1: the epoch to create if the thread needs a new one.
    pub fresh_epoch: Epoch,
    /// ARGV 2: the `XADD … MAXLEN ~` cap without checkpoints (`0`: none).
    pub maxlen: usize,
    /// ARGV 3: the safety cap once the thread uses checkpoints (`0`: none).
    pub safety_cap: usize,
    /// ARGV 4–5: append only if the log's epoch and last-generated-id are these (`None`:
    /// unconditional; both sent empty).
    pub expected: Option<LogHead>,
    /// ARGV 6–7: the checkpoint candidate's events (`None`: no candidate; ARGV 6 `-`).
    pub candidate: Option<&'a [u8]>,
    /// ARGV 6 with a candidate: its least distance in entries from the pending checkpoint.
    pub candidate_min_gap: u64,
    /// ARGV 8: `max_age` in ms (`0`: none).
    pub max_age_ms: u64,
    /// ARGV 9: `idle_ttl` in ms (`0`: none).
    pub idle_ttl_ms: u64,
    /// ARGV 10–11: the producer and the number of its last event in the batch (`None`: id
    /// sent empty, number `0`).
    pub producer: Option<&'a ProducerMark>,
    /// ARGV 12: the append-note channel (empty: no note).
    pub channel: &'a str,
    /// ARGV 16: `SPUBLISH` on the thread's shard channel (a cluster) rather than `PUBLISH`.
    pub sharded: bool,
    /// ARGV 13: the thread (for the note).
    pub thread: &'a ThreadId,
    /// ARGV 15: how long the outcome record lives, in ms.
    pub record_ttl_ms: u64,
    /// ARGV 14 (their AG-UI types, for the note) and ARGV 17…: the events' JSON.
    pub events: &'a [ValidEvent],
}

impl ScriptArgs for AppendArgs<'_> {
    fn key_count(&self) -> usize {
        4
    }

    fn write(&self, call: &mut impl ScriptCall) {
        write_keys(call, self.keys);
        call.push_key(self.outcome);
        call.push_arg(self.fresh_epoch.to_string());
        call.push_arg(self.maxlen);
        call.push_arg(self.safety_cap);
        call.push_arg(
            self.expected
                .map(|h| h.epoch.to_string())
                .unwrap_or_default(),
        );
        call.push_arg(
            self.expected
                .map(|h| h.last.to_string())
                .unwrap_or_default(),
        );
        call.push_arg(match self.candidate {
            Some(_) => self.candidate_min_gap.to_string(),
            None => "-".to_string(),
        });
        call.push_arg(self.candidate.unwrap_or_default());
        call.push_arg(self.max_age_ms);
        call.push_arg(self.idle_ttl_ms);
        call.push_arg(self.producer.map(|p| p.id.as_str()).unwrap_or_default());
        call.push_arg(self.producer.map_or(0, |p| p.last_seq));
        call.push_arg(self.channel);
        call.push_arg(self.thread.as_str());
        call.push_arg(note_types(self.events));
        call.push_arg(self.record_ttl_ms);
        call.push_arg(publish_command(self.sharded));
        for ev in self.events {
            call.push_arg(&ev.json[..]);
        }
    }
}

/// `SPUBLISH` (a shard channel of a cluster) or `PUBLISH`.
fn publish_command(sharded: bool) -> &'static str {
    if sharded { "SPUBLISH" } else { "PUBLISH" }
}

/// The batch's AG-UI types, separated by spaces (ARGV 14 of the append script, for its note).
pub(super) fn note_types(events: &[ValidEvent]) -> String {
    let mut types = String::with_capacity(events.len() * 16);
    for (i, ev) in events.iter().enumerate() {
        if i > 0 {
            types.push(' ');
        }
        types.push_str(ev.event_type.as_str());
    }
    types
}

/// The arguments of `read.lua`: the head and a page of entries.
pub(super) struct ReadArgs<'a> {
    /// The thread's keys.
    pub keys: &'a Keys,
    /// ARGV 1: the epoch to create if the thread needs a new one.
    pub fresh_epoch: Epoch,
    /// ARGV 2: read strictly after this position (`None`: from the first entry).
    pub after: Option<StreamPos>,
    /// ARGV 3: most entries to return.
    pub count: usize,
    /// ARGV 4: `idle_ttl` in ms (`0`: none).
    pub idle_ttl_ms: u64,
}

impl ScriptArgs for ReadArgs<'_> {
    fn write(&self, call: &mut impl ScriptCall) {
        write_keys(call, self.keys);
        let (start, count) = match self.after {
            None => ("-".to_string(), self.count),
            // Nothing can follow the largest ID (and `XRANGE (<max>` is an error).
            Some(pos) if pos == StreamPos::new(u64::MAX, u64::MAX) => ("-".to_string(), 0),
            Some(pos) => (format!("({pos}"), self.count),
        };
        call.push_arg(self.fresh_epoch.to_string());
        call.push_arg(start);
        // Lua numbers are doubles: keep the count exact.
        call.push_arg(count.min(1 << 40));
        call.push_arg(self.idle_ttl_ms);
    }
}

/// The arguments of `head.lua` and `checkpoint.lua`.
pub(super) struct HeadArgs<'a> {
    /// The thread's keys.
    pub keys: &'a Keys,
    /// ARGV 1: the epoch to create if the thread needs a new one.
    pub fresh_epoch: Epoch,
    /// ARGV 2: `idle_ttl` in ms (`0`: none).
    pub idle_ttl_ms: u64,
}

impl ScriptArgs for HeadArgs<'_> {
    fn write(&self, call: &mut impl ScriptCall) {
        write_keys(call, self.keys);
        call.push_arg(self.fresh_epoch.to_string());
        call.push_arg(self.idle_ttl_ms);
    }
}

/// The arguments of `producer.lua`.
pub(super) struct ProducerArgs<'a> {
    /// The thread's keys.
    pub keys: &'a Keys,
    /// ARGV 1: the epoch to create if the thread needs a new one.
    pub fresh_epoch: Epoch,
    /// ARGV 2: the producer id.
    pub producer: &'a str,
    /// ARGV 3: `idle_ttl` in ms (`0`: none).
    pub idle_ttl_ms: u64,
}

impl ScriptArgs for ProducerArgs<'_> {
    fn write(&self, call: &mut impl ScriptCall) {
        write_keys(call, self.keys);
        call.push_arg(self.fresh_epoch.to_string());
        call.push_arg(self.producer);
        call.push_arg(self.idle_ttl_ms);
    }
}

/// The arguments of `outcome.lua`: settle one append's outcome.
pub(super) struct OutcomeArgs<'a> {
    /// KEYS 1: the append's outcome key ([`Keys::outcome`]).
    pub outcome: &'a str,
    /// ARGV 1: how long the fence lives, in ms.
    pub fence_ttl_ms: u64,
}

impl ScriptArgs for OutcomeArgs<'_> {
    fn key_count(&self) -> usize {
        1
    }

    fn write(&self, call: &mut impl ScriptCall) {
        call.push_key(self.outcome);
        call.push_arg(self.fence_ttl_ms);
    }
}

/// The arguments of `probe.lua`: one probe of the tail (`tail/probe.rs`).
pub(super) struct ProbeArgs<'a> {
    /// KEYS 1: the node's probe stream.
    pub key: &'a str,
    /// ARGV 1: the append-note channel (empty: no note).
    pub channel: &'a str,
    /// ARGV 2: the node id.
    pub node: &'a str,
    /// ARGV 3: how long the probe stream outlives the node's last probe, in ms.
    pub ttl_ms: u64,
    /// ARGV 4: `SPUBLISH` on the probe's shard channel (a cluster) rather than `PUBLISH`.
    pub sharded: bool,
}

impl ScriptArgs for ProbeArgs<'_> {
    fn key_count(&self) -> usize {
        1
    }

    fn write(&self, call: &mut impl ScriptCall) {
        call.push_key(self.key);
        call.push_arg(self.channel);
        call.push_arg(self.node);
        call.push_arg(self.ttl_ms);
        call.push_arg(publish_command(self.sharded));
    }
}

impl RedisLog {
    /// Runs a read-only script (`args` written by its typed struct), retried once on a
    /// dropped connection. Redis's own error, so that a caller can tell a data error
    /// (`WRONGTYPE`, `list.rs`) from an unavailable backend ([`unavailable`](super::resp::unavailable)).
    pub(super) async fn read_script(
        &self,
        script: &Script,
        args: &impl ScriptArgs,
    ) -> Result<Value, RedisError> {
        retry_dropped(|| {
            let mut conn = self.inner.conn.clone();
            let invocation = args.invocation(script);
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await
    }
}
