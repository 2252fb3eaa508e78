//! The Redis backend's side of the admin API (PROTOCOL §12): a page of threads walked with
//! `SCAN <cursor> MATCH <prefix>:{<thread prefix>*}:log COUNT 256 TYPE stream`, and each
//! thread's summary (`summary.lua`: epoch, `XINFO STREAM`, `XREVRANGE + - COUNT 1`).
//!
//! `SCAN` walks the node's whole keyspace in batches whose size Redis chooses; a page takes
//! whole batches while they fit its `limit`, and one that does not fit is cut in id order and
//! read again by the next page (the cursor says where, see [`ListCursor`]). A sharded Redis
//! Cluster would need one walk per primary; like the tail, this works with a single Redis (or
//! a primary with replicas).

use super::resp::{decode_entries, malformed, parse_entries, parse_head_counts, unavailable};
use super::{RedisLog, retry_dropped};
use crate::event::ThreadId;
use crate::log::list::MAX_PAGE;
use crate::log::{ListCursor, LogError, ThreadPage, ThreadSummary};
use redis::Value;

/// `COUNT` of every `SCAN` call (buckets looked at). Fixed, so that a batch cut by a page is
/// the same batch when the next page reads it again (unless the keyspace was resized).
const SCAN_COUNT: usize = 256;

/// Most `SCAN` calls one page makes: on a keyspace where few keys match, a page comes back
/// short (even empty, with a cursor) rather than walking the whole keyspace in one request.
const SCAN_CALLS: usize = 64;

impl RedisLog {
    /// [`EventLog::list_threads`](crate::log::EventLog::list_threads): the page's thread ids
    /// from `SCAN`, then their summaries (the scripts sent together on the multiplexed
    /// connection, which pipelines them).
    pub(super) async fn list(
        &self,
        prefix: &str,
        cursor: &ListCursor,
        limit: usize,
    ) -> Result<ThreadPage, LogError> {
        let limit = limit.clamp(1, MAX_PAGE);
        self.timed("list", async {
            let (ids, next) = self.scan_page(prefix, cursor, limit).await?;
            let summaries = futures::future::join_all(ids.iter().map(|t| self.summarise(t))).await;
            let threads = summaries
                .into_iter()
                .collect::<Result<Vec<ThreadSummary>, LogError>>()?;
            Ok(ThreadPage { threads, next })
        })
        .await
    }

    /// [`EventLog::summary`](crate::log::EventLog::summary), under `op_timeout`.
    pub(super) async fn summary_of(&self, thread: &ThreadId) -> Result<ThreadSummary, LogError> {
        self.timed("summary", self.summarise(thread)).await
    }

    /// One `summary.lua` call.
    async fn summarise(&self, thread: &ThreadId) -> Result<ThreadSummary, LogError> {
        let keys = self.keys(thread);
        let reply = self
            .read_script(&self.inner.scripts.summary, &self.head_args(&keys))
            .await?;
        parse_summary(thread, &reply)
    }

    /// The ids of one page: whole `SCAN` batches while they fit `limit`, the first that does
    /// not fit cut after its `room` first ids in id order (each batch is sorted; a batch read
    /// again skips the ids up to the cursor's `after`).
    async fn scan_page(
        &self,
        prefix: &str,
        cursor: &ListCursor,
        limit: usize,
    ) -> Result<(Vec<ThreadId>, Option<ListCursor>), LogError> {
        let key_prefix = format!("{}:{{", self.inner.config.prefix);
        let pattern = format!("{}{}*}}:log", glob_escape(&key_prefix), glob_escape(prefix));
        let mut scan = cursor.scan;
        let mut after = cursor.after.clone();
        let mut out: Vec<ThreadId> = Vec::new();
        for _ in 0..SCAN_CALLS {
            let (next_scan, keys) = retry_dropped(|| {
                let mut conn = self.inner.conn.clone();
                let cmd = redis::cmd("SCAN")
                    .arg(scan)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .arg("TYPE")
                    .arg("stream")
                    .clone();
                async move { cmd.query_async::<(u64, Vec<Vec<u8>>)>(&mut conn).await }
            })
            .await
            .map_err(unavailable)?;
            let mut batch: Vec<ThreadId> = keys
                .iter()
                .filter_map(|k| thread_of_key(k, &key_prefix))
                .filter(|t| t.as_str().starts_with(prefix))
                .filter(|t| after.as_ref().is_none_or(|a| t > a))
                .collect();
            batch.sort_unstable();
            batch.dedup();
            // At least 1: the loop returns as soon as the page is full.
            let room = limit - out.len();
            if batch.len() > room {
                batch.truncate(room);
                let last = batch.last().cloned();
                out.extend(batch);
                return Ok((out, Some(ListCursor { scan, after: last })));
            }
            out.extend(batch);
            if next_scan == 0 {
                return Ok((out, None));
            }
            scan = next_scan;
            after = None;
            if out.len() == limit {
                break;
            }
        }
        Ok((out, Some(ListCursor { scan, after: None })))
    }
}

/// The thread of a stream key `<prefix>:{<threadId>}:log` (`key_prefix` is `<prefix>:{`);
/// `None` for a key of another shape (another application's, or an invalid id).
fn thread_of_key(key: &[u8], key_prefix: &str) -> Option<ThreadId> {
    let key = std::str::from_utf8(key).ok()?;
    let id = key.strip_prefix(key_prefix)?.strip_suffix("}:log")?;
    ThreadId::parse(id).ok()
}

/// `s` with the glob characters of `SCAN … MATCH` (`*`, `?`, `[`, `]`, `\`) escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `summary.lua`'s reply `{epoch, info, last}` as a [`ThreadSummary`]; an invalid newest
/// entry is skipped (and counted) as every read does, leaving `last` empty.
fn parse_summary(thread: &ThreadId, reply: &Value) -> Result<ThreadSummary, LogError> {
    let items = super::resp::array(reply).ok_or_else(|| malformed("summary reply"))?;
    let (head, counts) = parse_head_counts(items)?;
    let raw = parse_entries(items.get(2).ok_or_else(|| malformed("summary reply"))?)?;
    Ok(ThreadSummary {
        thread: thread.clone(),
        head,
        retained: u64::try_from(counts.length).unwrap_or(0),
        last: decode_entries(thread, head.epoch, raw).pop(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_keys_name_their_thread() {
        let t = |k: &str| thread_of_key(k.as_bytes(), "agui:{").map(|t| t.to_string());
        assert_eq!(t("agui:{t-1}:log").as_deref(), Some("t-1"));
        assert_eq!(t("agui:{a:b}:log").as_deref(), Some("a:b"));
        assert_eq!(t("agui:{t-1}:meta"), None);
        assert_eq!(t("agui:{}:log"), None);
        assert_eq!(t("agui:{a}:o:x}:log"), None, "not a thread id");
        assert_eq!(t("other:{t}:log"), None);
        assert_eq!(glob_escape("a*b?[c]\\d"), "a\\*b\\?\\[c\\]\\\\d");
    }
}
