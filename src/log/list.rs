//! What the log tells the admin API about its threads (PROTOCOL §12): a page of threads
//! ([`EventLog::list_threads`](super::EventLog::list_threads)) and one thread's summary
//! ([`EventLog::summary`](super::EventLog::summary)), read without folding anything.

use super::{EventId, LogEntry, LogHead};
use crate::event::{EventType, ThreadId};
use std::fmt;
use std::str::FromStr;

/// Most threads one page may hold (`limit` is clamped to it).
pub const MAX_PAGE: usize = 1000;

/// Where a page of [`EventLog::list_threads`](super::EventLog::list_threads) starts; opaque to
/// clients, written `<scan>`, `<scan>.<after>`, or either behind `<shard>:` when `shard` is
/// not 0.
///
/// `shard` is, on a Redis Cluster, the primary the walk is on (the primaries in the order
/// of their lowest slot; always `0` elsewhere); `scan` is the Redis `SCAN` cursor of the
/// batch the page starts in on that node (always `0` for the memory log); `after` is the last
/// thread of the previous page when that page ended inside a batch (a `SCAN` batch may hold
/// more threads than the page had room for: the batch is read again and the threads up to
/// `after` skipped, so a page never exceeds its `limit`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListCursor {
    /// The Redis Cluster primary the page starts on, by rank of its lowest slot (`0`
    /// elsewhere).
    pub shard: u32,
    /// The `SCAN` cursor the page starts at (`0`: the beginning).
    pub scan: u64,
    /// Threads up to and including this one (in id order) were already listed from the
    /// batch at `scan`.
    pub after: Option<ThreadId>,
}

/// A string that is not a [`ListCursor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed cursor: give back the nextCursor of the previous page")]
pub struct CursorParseError;

impl FromStr for ListCursor {
    type Err = CursorParseError;

    /// Parses `[<shard>:]<scan>[.<after>]` (`shard` and `scan` decimal, `after` a thread id).
    fn from_str(s: &str) -> Result<Self, CursorParseError> {
        let (scan, after) = match s.split_once('.') {
            Some((scan, after)) => (scan, Some(after)),
            None => (s, None),
        };
        let (shard, scan) = match scan.split_once(':') {
            Some((shard, scan)) => (Some(shard), scan),
            None => (None, scan),
        };
        let decimal = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        if !decimal(scan) || shard.is_some_and(|d| !decimal(d)) {
            return Err(CursorParseError);
        }
        Ok(ListCursor {
            shard: shard
                .map(str::parse)
                .transpose()
                .map_err(|_| CursorParseError)?
                .unwrap_or(0),
            scan: scan.parse().map_err(|_| CursorParseError)?,
            after: after
                .map(ThreadId::parse)
                .transpose()
                .map_err(|_| CursorParseError)?,
        })
    }
}

impl fmt::Display for ListCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shard != 0 {
            write!(f, "{}:", self.shard)?;
        }
        match &self.after {
            Some(after) => write!(f, "{}.{after}", self.scan),
            None => write!(f, "{}", self.scan),
        }
    }
}

/// One thread as the log holds it: its head, how many events it retains, its newest event.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadSummary {
    /// The thread.
    pub thread: ThreadId,
    /// Its log's head (epoch, newest position, trimmed bound).
    pub head: LogHead,
    /// Entries the log retains now (Redis: the stream's `XLEN`).
    pub retained: u64,
    /// The newest entry, when it is a valid event (`None` for an emptied log).
    pub last: Option<LogEntry>,
}

/// How a thread's current run stands, judged from its newest event alone (the order rules
/// allow only a `RUN_STARTED` after a run's end): the admin list's `runStatus`, with the
/// snapshot's words (PROTOCOL §2 Snapshot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// The newest event is inside a run.
    Running,
    /// The newest event is a `RUN_FINISHED`.
    Finished,
    /// The newest event is a `RUN_ERROR`.
    Errored,
}

impl RunState {
    /// `running`, `finished` or `errored`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Finished => "finished",
            RunState::Errored => "errored",
        }
    }
}

impl ThreadSummary {
    /// The id of the newest event (`None` for a thread that never had one).
    pub fn last_id(&self) -> Option<EventId> {
        self.head.last_id()
    }

    /// The run's state from the newest event; `None` when the log holds no event.
    pub fn run_state(&self) -> Option<RunState> {
        Some(match self.last.as_ref()?.event_type {
            EventType::RunFinished => RunState::Finished,
            EventType::RunError => RunState::Errored,
            _ => RunState::Running,
        })
    }
}

/// A page of threads ([`EventLog::list_threads`](super::EventLog::list_threads)).
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadPage {
    /// At most `limit` threads; fewer (even none) does not mean the end.
    pub threads: Vec<ThreadSummary>,
    /// Where the next page starts; `None`: this was the last page.
    pub next: Option<ListCursor>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject() {
        let t = ThreadId::parse("a.b:c-1").unwrap();
        for c in [
            ListCursor::default(),
            ListCursor {
                shard: 0,
                scan: 1234,
                after: Some(t.clone()),
            },
            ListCursor {
                shard: 0,
                scan: 0,
                after: Some(t.clone()),
            },
            ListCursor {
                shard: 2,
                scan: 77,
                after: Some(t),
            },
            ListCursor {
                shard: 1,
                scan: 0,
                after: None,
            },
        ] {
            assert_eq!(c.to_string().parse::<ListCursor>(), Ok(c));
        }
        assert_eq!(
            "17.x.y"
                .parse::<ListCursor>()
                .unwrap()
                .after
                .unwrap()
                .as_str(),
            "x.y"
        );
        for bad in [
            "",
            ".",
            "x",
            "-1",
            "1.",
            "1.a b",
            "99999999999999999999999",
            "+1",
            ":1",
            "1:",
            "x:1",
            "1:2:3",
            "99999999999:1",
        ] {
            assert_eq!(bad.parse::<ListCursor>(), Err(CursorParseError), "{bad:?}");
        }
    }
}
