//! The Redis backend's open-run registry ([`EventLog::note_open_run`] and its two
//! companions; PROTOCOL §2 "Orphaned runs"): one sorted set, `<prefix>:runs`, member the
//! thread id, score the last time (ms since the Unix epoch) a node knew the thread's run to
//! be active. Every node's orphan sweep reads it, so a run whose node died is still found.
//!
//! One key for all threads (no hash tag): each command touches only it, so Redis Cluster puts
//! it in one slot. Commands: `ZADD … GT` (a later time only), `ZRANGE … BYSCORE LIMIT …
//! WITHSCORES`, and a compare-and-delete script (`ZSCORE`, then `ZREM` if unchanged).
//!
//! [`EventLog::note_open_run`]: crate::log::EventLog::note_open_run

use super::{RedisLog, retry_dropped};
use crate::event::ThreadId;
use crate::log::LogError;
use crate::log::redis::resp::unavailable;
use redis::Script;
use std::sync::LazyLock;

/// `KEYS[1]` the registry, `ARGV[1]` the thread, `ARGV[2]` the noted time: removes the member
/// only if its score is still that time (a run noted meanwhile stays).
static FORGET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n\
         if s and tonumber(s) == tonumber(ARGV[2]) then\n\
           return redis.call('ZREM', KEYS[1], ARGV[1])\n\
         end\n\
         return 0",
    )
});

impl RedisLog {
    /// `<prefix>:runs`.
    fn runs_key(&self) -> String {
        format!("{}:runs", self.inner.config.prefix)
    }

    /// `ZADD <prefix>:runs GT <active_ms> <thread>`.
    pub(super) async fn note_run(&self, thread: &ThreadId, active_ms: u64) -> Result<(), LogError> {
        self.timed("runs", async {
            let mut conn = self.inner.conn.clone();
            redis::cmd("ZADD")
                .arg(self.runs_key())
                .arg("GT")
                .arg(active_ms)
                .arg(thread.as_str())
                .query_async::<()>(&mut conn)
                .await
                .map_err(unavailable)
        })
        .await
    }

    /// `ZRANGE <prefix>:runs -inf <idle_since_ms> BYSCORE LIMIT 0 <limit> WITHSCORES`.
    /// Members that are not thread ids (not written by the broker) are skipped.
    pub(super) async fn idle_runs(
        &self,
        idle_since_ms: u64,
        limit: usize,
    ) -> Result<Vec<(ThreadId, u64)>, LogError> {
        self.timed("runs", async {
            let key = self.runs_key();
            let flat: Vec<String> = retry_dropped(|| {
                let mut conn = self.inner.conn.clone();
                let cmd = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg("-inf")
                    .arg(idle_since_ms)
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit)
                    .arg("WITHSCORES")
                    .clone();
                async move { cmd.query_async(&mut conn).await }
            })
            .await
            .map_err(unavailable)?;
            Ok(flat
                .chunks_exact(2)
                .filter_map(|pair| {
                    let thread = ThreadId::parse(&pair[0]).ok()?;
                    // Scores are whole milliseconds, exact in a double.
                    let noted = pair[1].parse::<f64>().ok()?;
                    Some((thread, noted as u64))
                })
                .collect())
        })
        .await
    }

    /// The compare-and-delete script on `<prefix>:runs`.
    pub(super) async fn forget_run(
        &self,
        thread: &ThreadId,
        active_ms: u64,
    ) -> Result<(), LogError> {
        self.timed("runs", async {
            let mut conn = self.inner.conn.clone();
            FORGET
                .key(self.runs_key())
                .arg(thread.as_str())
                .arg(active_ms)
                .invoke_async::<()>(&mut conn)
                .await
                .map_err(unavailable)
        })
        .await
    }
}
