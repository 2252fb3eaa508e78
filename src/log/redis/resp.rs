//! Decoding of the Redis backend's replies (RESP2 or RESP3 [`Value`]s): the scripts' heads
//! and pages, `XRANGE`/`XREAD` entries, and the validation of stored entries (PROTOCOL §2: direct
//! producers' entries are checked like a publish).

use crate::event::{ThreadId, validate_event};
use crate::log::{Epoch, EventId, LogEntry, LogError, LogHead, StreamPos};
use crate::metrics::INVALID_ENTRIES;
use bytes::Bytes;
use redis::{RedisError, Value};

/// One stream entry as stored, before validation.
pub(super) struct RawEntry {
    /// The entry ID.
    pub pos: StreamPos,
    /// The `e` field, if the entry has one.
    pub data: Option<Bytes>,
}

/// Validates raw entries of `thread` (PROTOCOL §2: producers may write directly): an entry without
/// `e`, or whose `e` is not a valid AG-UI event of this thread, is logged, counted and skipped.
pub(super) fn decode_entries(thread: &ThreadId, epoch: Epoch, raw: Vec<RawEntry>) -> Vec<LogEntry> {
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

/// Logs and counts an entry that is not a valid AG-UI event of its thread.
fn skip_invalid(thread: &ThreadId, id: EventId, why: &str) {
    tracing::warn!(%thread, entry = %id.pos, error = why, "skipping invalid log entry");
    metrics::counter!(INVALID_ENTRIES).increment(1);
}

/// A Redis error as [`LogError::Unavailable`].
pub(super) fn unavailable(e: RedisError) -> LogError {
    LogError::Unavailable(format!("redis: {e}"))
}

/// A reply of an unexpected shape, as [`LogError::Unavailable`].
pub(super) fn malformed(what: &str) -> LogError {
    LogError::Unavailable(format!("redis: unexpected {what}"))
}

/// The items of an array (or set) reply.
pub(super) fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        Value::Attribute { data, .. } => array(data),
        _ => None,
    }
}

/// The bytes of a string reply (bulk, simple or verbatim).
pub(super) fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        Value::Attribute { data, .. } => bytes_of(data),
        _ => None,
    }
}

/// A string reply as UTF-8.
pub(super) fn string(v: &Value) -> Option<String> {
    bytes_of(v).and_then(|b| std::str::from_utf8(b).ok().map(str::to_owned))
}

/// An epoch as stored in the meta hash (8 hex digits).
pub(super) fn parse_epoch_str(s: &str) -> Option<Epoch> {
    s.parse().ok()
}

/// An epoch reply (8 hex digits).
pub(super) fn parse_epoch(v: Option<&Value>) -> Result<Epoch, LogError> {
    v.and_then(string)
        .as_deref()
        .and_then(parse_epoch_str)
        .ok_or_else(|| malformed("epoch"))
}

/// An entry ID reply (`<ms>-<seq>`).
pub(super) fn parse_pos(v: &Value) -> Result<StreamPos, LogError> {
    string(v)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("entry ID"))
}

/// `{epoch, {last, max_deleted, first, length, entries_added, ckpt_pos, ckpt_ord}, …}` of the
/// head and read scripts (the inner list: `XINFO STREAM` fields and the checkpoint's), as a
/// [`LogHead`].
pub(super) fn parse_head(items: &[Value]) -> Result<LogHead, LogError> {
    parse_head_counts(items).map(|(head, _)| head)
}

/// [`parse_head`], with the stream's `XINFO STREAM` counts (the admin summary's `length`).
pub(super) fn parse_head_counts(items: &[Value]) -> Result<(LogHead, StreamCounts), LogError> {
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
    let head = LogHead {
        epoch: parse_epoch(items.first())?,
        last,
        max_deleted: max_deleted(stream, checkpoint),
    };
    Ok((head, stream))
}

/// The `XINFO STREAM` fields [`max_deleted`] works from.
#[derive(Clone, Copy, Debug)]
pub(super) struct StreamCounts {
    /// `last-generated-id`.
    pub last: StreamPos,
    /// `max-deleted-entry-id`.
    pub deleted: StreamPos,
    /// `recorded-first-entry-id`.
    pub first: StreamPos,
    /// `length`.
    pub length: i64,
    /// `entries-added`.
    pub added: i64,
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
pub(super) fn max_deleted(s: StreamCounts, checkpoint: Option<(StreamPos, i64)>) -> StreamPos {
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
pub(super) fn parse_entries(v: &Value) -> Result<Vec<RawEntry>, LogError> {
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
pub(super) fn parse_xread(v: &Value) -> Result<Vec<(String, Vec<RawEntry>)>, LogError> {
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

/// The append script's reply: `{epoch, {entry id…}}` (one id per event: `expected` of them),
/// `{'conflict', epoch, info}` ([`LogError::Conflict`] with the head it describes), or
/// `{'fenced'}` (its outcome was settled as "not appended" before it ran:
/// [`LogError::Unavailable`]), or `{'done', record}` (the same append ran before and was
/// repeated: its ids, from its outcome record).
pub(super) fn parse_append_reply(reply: &Value, expected: usize) -> Result<Vec<EventId>, LogError> {
    let items = array(reply).ok_or_else(|| malformed("append reply"))?;
    match string(items.first().unwrap_or(&Value::Nil)).as_deref() {
        Some("conflict") => return Err(LogError::Conflict(parse_head(&items[1..])?)),
        Some("fenced") => {
            return Err(LogError::Unavailable(
                "redis: the append was settled as not appended before it ran".into(),
            ));
        }
        Some("done") => {
            return match parse_outcome_reply(items.get(1).unwrap_or(&Value::Nil), expected)? {
                Settled::Appended(ids) => Ok(ids),
                Settled::NotAppended => Err(malformed("append reply (done)")),
            };
        }
        _ => {}
    }
    let epoch = parse_epoch(items.first())?;
    let ids = items
        .get(1)
        .and_then(array)
        .ok_or_else(|| malformed("append reply"))?
        .iter()
        .map(|v| parse_pos(v).map(|pos| EventId { epoch, pos }))
        .collect::<Result<Vec<_>, _>>()?;
    if ids.len() != expected {
        return Err(malformed("append reply (id count)"));
    }
    Ok(ids)
}

/// The read script's reply, decoded.
pub(super) struct ReadPage {
    /// The head the page was read at.
    pub head: LogHead,
    /// Up to `count` raw entries after the start.
    pub entries: Vec<RawEntry>,
    /// The stream holds an entry at exactly the position read after (`false` for a read from
    /// the start): the input of `check_resumable`.
    pub held: bool,
    /// When that position is not held: the last entry before it, if any (the input of
    /// [`ResumeCheck::new`](crate::log::ResumeCheck::new)).
    pub before: Option<StreamPos>,
}

/// The read script's reply: `{epoch, info, entries, held, before}`.
pub(super) fn parse_read_reply(reply: &Value) -> Result<ReadPage, LogError> {
    let items = array(reply).ok_or_else(|| malformed("read reply"))?;
    let head = parse_head(items)?;
    let entries = parse_entries(items.get(2).ok_or_else(|| malformed("read reply"))?)?;
    let held = match items.get(3) {
        Some(Value::Int(n)) => *n == 1,
        _ => return Err(malformed("read reply (held)")),
    };
    let before = match items.get(4) {
        Some(v) if bytes_of(v).is_some_and(|b| !b.is_empty()) => Some(parse_pos(v)?),
        Some(_) => None,
        None => return Err(malformed("read reply (before)")),
    };
    Ok(ReadPage {
        head,
        entries,
        held,
        before,
    })
}

/// What `outcome.lua` settled about an append of `expected` events.
#[derive(Debug, PartialEq)]
pub(super) enum Settled {
    /// It ran: its ids.
    Appended(Vec<EventId>),
    /// It did not run, and now never will (fenced).
    NotAppended,
}

/// The outcome script's reply: `-` (fenced, not appended) or the append's record
/// `<epoch> <entry id>…` (one id per event: `expected` of them).
pub(super) fn parse_outcome_reply(reply: &Value, expected: usize) -> Result<Settled, LogError> {
    let record = string(reply).ok_or_else(|| malformed("outcome reply"))?;
    if record == "-" {
        return Ok(Settled::NotAppended);
    }
    let mut parts = record.split(' ');
    let epoch = parts
        .next()
        .and_then(parse_epoch_str)
        .ok_or_else(|| malformed("outcome record"))?;
    let ids = parts
        .map(|p| {
            p.parse()
                .map(|pos| EventId { epoch, pos })
                .map_err(|_| malformed("outcome record"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ids.len() != expected {
        return Err(malformed("outcome record (id count)"));
    }
    Ok(Settled::Appended(ids))
}

/// A Redis Cluster primary's address, as `CLUSTER SLOTS` gives it.
pub(super) type Addr = (String, u16);

/// `CLUSTER SLOTS`: `[[first, last, [host, port, id, …], replicas…]…]` as (first slot, last
/// slot, primary). An empty host (a node that does not know its own address) is `asked_host`,
/// the host that was asked. `None` for a reply of another shape.
pub(super) fn parse_slots(reply: &Value, asked_host: &str) -> Option<Vec<(u16, u16, Addr)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let host = match primary.first()? {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.to_string()
        } else {
            host
        };
        let Value::Int(port) = primary.get(1)? else {
            return None;
        };
        out.push((
            u16::try_from(*first).ok()?,
            u16::try_from(*last).ok()?,
            (host, u16::try_from(*port).ok()?),
        ));
    }
    Some(out)
}
