//! The Redis backend's side of the admin API (PROTOCOL §12): a page of threads walked with
//! `SCAN <cursor> MATCH <prefix>:{<thread prefix>*}:log COUNT 256 TYPE stream`, and each
//! thread's summary (`summary.lua`: epoch, `XINFO STREAM`, `XREVRANGE + - COUNT 1`).
//!
//! `SCAN` walks the node's whole keyspace in batches whose size Redis chooses; a page takes
//! whole batches while they fit its `limit`, and one that does not fit is cut in id order and
//! read again by the next page (the cursor says where, see [`ListCursor`]). On a Redis
//! Cluster the walk goes through the primaries one after the other (ranked by their lowest
//! slot, as `CLUSTER SLOTS` gives them when each page starts), each with its own `SCAN`; a
//! failover or a slot migrating during the walk weakens `SCAN`'s guarantee as a resize
//! does: a thread of the moved slots may be listed twice or, once, missed. A thread one of
//! whose keys another program overwrote with another type is left out of the page (logged),
//! rather than failing every page that holds it.

use super::conn::{Shared, Target};
use super::resp::{
    Addr, decode_entries, malformed, parse_entries, parse_head_counts, parse_slots, unavailable,
};
use super::{RedisLog, retry_dropped};
use crate::event::ThreadId;
use crate::log::list::MAX_PAGE;
use crate::log::{ListCursor, LogError, ThreadPage, ThreadSummary};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ConnectionAddr, Value};

/// One thread's summary, or why its keys are not the broker's.
enum Summarised {
    /// The thread as its log holds it.
    Thread(ThreadSummary),
    /// One of its keys holds another type than the broker writes (`WRONGTYPE`).
    ForeignKeys(String),
}

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
            let mut threads = Vec::with_capacity(summaries.len());
            for (thread, summary) in ids.iter().zip(summaries) {
                match summary? {
                    Summarised::Thread(s) => threads.push(s),
                    // One thread's foreign keys must not make every page that holds it fail.
                    Summarised::ForeignKeys(why) => {
                        tracing::warn!(%thread, error = %why, "thread list: skipping a thread whose keys are not the broker's");
                    }
                }
            }
            Ok(ThreadPage { threads, next })
        })
        .await
    }

    /// [`EventLog::summary`](crate::log::EventLog::summary), under `op_timeout`.
    pub(super) async fn summary_of(&self, thread: &ThreadId) -> Result<ThreadSummary, LogError> {
        self.timed("summary", async {
            match self.summarise(thread).await? {
                Summarised::Thread(s) => Ok(s),
                Summarised::ForeignKeys(why) => Err(LogError::Unavailable(format!(
                    "redis: the keys of thread {thread} are not the broker's ({why})"
                ))),
            }
        })
        .await
    }

    /// One `summary.lua` call. A thread key of another type (`WRONGTYPE`: a key another
    /// program wrote under the broker's prefix) is [`Summarised::ForeignKeys`], not an error.
    async fn summarise(&self, thread: &ThreadId) -> Result<Summarised, LogError> {
        let keys = self.keys(thread);
        let reply = self
            .read_script(&self.inner.scripts.summary, &self.head_args(&keys))
            .await;
        match reply {
            Ok(reply) => parse_summary(thread, &reply).map(Summarised::Thread),
            Err(e) if e.code() == Some("WRONGTYPE") => Ok(Summarised::ForeignKeys(
                "a key holds the wrong kind of value".into(),
            )),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The ids of one page: whole `SCAN` batches while they fit `limit`, the first that does
    /// not fit cut after its `room` first ids in id order (each batch is sorted; a batch read
    /// again skips the ids up to the cursor's `after`). On a cluster, a primary's walk that
    /// ends goes on with the next primary's, in the same page while it has room.
    async fn scan_page(
        &self,
        prefix: &str,
        cursor: &ListCursor,
        limit: usize,
    ) -> Result<(Vec<ThreadId>, Option<ListCursor>), LogError> {
        let key_prefix = format!("{}:{{", self.inner.config.prefix);
        let pattern = format!("{}{}*}}:log", glob_escape(&key_prefix), glob_escape(prefix));
        let primaries = self.primaries().await?;
        let mut shard = cursor.shard;
        let mut scan = cursor.scan;
        let mut after = cursor.after.clone();
        let mut out: Vec<ThreadId> = Vec::new();
        for _ in 0..SCAN_CALLS {
            let node = match &primaries {
                None => None,
                Some(nodes) => match nodes.get(shard as usize) {
                    Some(node) => Some(node),
                    // A cursor past the last primary (the cluster shrank): the walk is over.
                    None => return Ok((out, None)),
                },
            };
            let (next_scan, keys) = self.scan_once(node, scan, &pattern).await?;
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
                return Ok((
                    out,
                    Some(ListCursor {
                        shard,
                        scan,
                        after: last,
                    }),
                ));
            }
            out.extend(batch);
            after = None;
            if next_scan == 0 {
                let walked = primaries.as_ref().map_or(1, Vec::len);
                if shard as usize + 1 >= walked {
                    return Ok((out, None));
                }
                shard += 1;
            }
            scan = next_scan;
            if out.len() == limit {
                break;
            }
        }
        Ok((
            out,
            Some(ListCursor {
                shard,
                scan,
                after: None,
            }),
        ))
    }

    /// On a Redis Cluster, its primaries ranked by their lowest slot (`CLUSTER SLOTS` through
    /// the shared connection); `None` on a single Redis.
    async fn primaries(&self) -> Result<Option<Vec<Addr>>, LogError> {
        let (Shared::Cluster(conn), Target::Cluster { seeds, .. }) =
            (&self.inner.conn, &self.inner.target)
        else {
            return Ok(None);
        };
        let reply = conn
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(unavailable)?;
        // A node that does not know its own address answers an empty host: the seeds' host.
        let seed_host = match seeds.first().map(|c| c.get_connection_info().addr()) {
            Some(ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. }) => {
                host.clone()
            }
            _ => String::new(),
        };
        let mut ranges = parse_slots(&reply, &seed_host)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| malformed("CLUSTER SLOTS reply"))?;
        ranges.sort_unstable_by_key(|(first, _, _)| *first);
        let mut nodes: Vec<Addr> = Vec::new();
        for (_, _, addr) in ranges {
            if !nodes.contains(&addr) {
                nodes.push(addr);
            }
        }
        Ok(Some(nodes))
    }

    /// One `SCAN` on `node` (a cluster primary), or on the single Redis (`None`).
    async fn scan_once(
        &self,
        node: Option<&Addr>,
        scan: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<Vec<u8>>), LogError> {
        let cmd: Cmd = redis::cmd("SCAN")
            .arg(scan)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .arg("TYPE")
            .arg("stream")
            .clone();
        match (node, &self.inner.conn) {
            (Some((host, port)), Shared::Cluster(conn)) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let reply = conn
                    .clone()
                    .route_command(cmd, routing)
                    .await
                    .map_err(unavailable)?;
                redis::from_redis_value(reply).map_err(|_| malformed("SCAN reply"))
            }
            _ => retry_dropped(|| {
                let mut conn = self.inner.conn.clone();
                let cmd = cmd.clone();
                async move { cmd.query_async::<(u64, Vec<Vec<u8>>)>(&mut conn).await }
            })
            .await
            .map_err(unavailable),
        }
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
