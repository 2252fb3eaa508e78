//! The log's ids (PROTOCOL §1): [`Epoch`], [`StreamPos`], [`EventId`] (what an SSE `id:`
//! carries) and [`ResumeId`] (what a `Last-Event-ID` may name), with their text forms.

use std::fmt;
use std::str::FromStr;

/// A thread log's epoch: a random 32-bit value drawn when the log is created.
///
/// If a thread's log is lost and recreated (Redis flushed, failover without the data, idle
/// expiry), it gets a new epoch, so ids of the old log are never taken for positions in the
/// new one (PROTOCOL §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Epoch(pub u32);

impl Epoch {
    /// Draws a fresh random epoch.
    pub fn random() -> Self {
        Epoch(rand::random())
    }
}

impl FromStr for Epoch {
    type Err = IdParseError;
    /// Parses exactly 8 hex digits (the form [`Epoch`]'s `Display` writes; either case).
    fn from_str(s: &str) -> Result<Self, IdParseError> {
        if s.len() != 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(IdParseError);
        }
        u32::from_str_radix(s, 16)
            .map(Epoch)
            .map_err(|_| IdParseError)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

/// A position inside one epoch of a thread log, ordered like a Redis Streams entry ID
/// `<ms>-<seq>` (the memory backend uses `0-<n>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamPos {
    /// Milliseconds part of the entry ID.
    pub ms: u64,
    /// Sequence part of the entry ID.
    pub seq: u64,
}

impl StreamPos {
    /// The position before every entry (`0-0`, never assigned to an entry).
    pub const ZERO: StreamPos = StreamPos { ms: 0, seq: 0 };

    /// Builds a position.
    pub const fn new(ms: u64, seq: u64) -> Self {
        StreamPos { ms, seq }
    }
}

impl fmt::Display for StreamPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl FromStr for StreamPos {
    type Err = IdParseError;
    /// Parses a Redis Streams entry ID `<ms>-<seq>` (both decimal `u64`).
    fn from_str(s: &str) -> Result<Self, IdParseError> {
        let (ms, seq) = s.split_once('-').ok_or(IdParseError)?;
        Ok(StreamPos {
            ms: parse_decimal(ms)?,
            seq: parse_decimal(seq)?,
        })
    }
}

fn parse_decimal(s: &str) -> Result<u64, IdParseError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IdParseError);
    }
    s.parse().map_err(|_| IdParseError)
}

/// The SSE `id:` of an event: `<epoch as 8 hex digits>-<ms>-<seq>`, e.g. `0a1b2c3d-1764500000000-0`.
///
/// Opaque to clients; strictly increasing within a thread's epoch (PROTOCOL §1, §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventId {
    /// The log epoch the id belongs to.
    pub epoch: Epoch,
    /// The entry's position in that epoch.
    pub pos: StreamPos,
}

/// A string that is not an [`EventId`] (or a stream position).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed event id")]
pub struct IdParseError;

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.epoch, self.pos)
    }
}

impl FromStr for EventId {
    type Err = IdParseError;
    /// Parses `<8 hex>-<ms>-<seq>`; anything else (including surrounding spaces) is an error.
    fn from_str(s: &str) -> Result<Self, IdParseError> {
        let (epoch, pos) = s.split_once('-').ok_or(IdParseError)?;
        Ok(EventId {
            epoch: epoch.parse()?,
            pos: pos.parse()?,
        })
    }
}

/// A `Last-Event-ID` as the broker hands it out and gets it back (PROTOCOL §3, §4, §5).
///
/// Besides event ids, the first event of a reset bridge (PROTOCOL §5 "Reset", built by the hub)
/// carries `<event id>-bridge`, where `<event id>` is the last id the connection was given
/// before the bridge. A client cut off inside the bridge has applied an unknown part of it,
/// so it cannot be resumed exactly: it comes back with this id and gets a prelude. The mark
/// sorts after `<event id>` and before the bridge's own id (the bridge's last event carries
/// the newest id it stands for), so ids still strictly increase on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeId {
    /// An event's id: resumable exactly while the log retains what follows it.
    Event(EventId),
    /// The mark of a position inside a reset bridge sent after this id.
    InsideBridge(EventId),
}

/// The suffix of [`ResumeId::InsideBridge`].
const BRIDGE_SUFFIX: &str = "-bridge";

impl fmt::Display for ResumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResumeId::Event(id) => id.fmt(f),
            ResumeId::InsideBridge(id) => write!(f, "{id}{BRIDGE_SUFFIX}"),
        }
    }
}

impl FromStr for ResumeId {
    type Err = IdParseError;
    /// Parses an [`EventId`], optionally followed by `-bridge`.
    fn from_str(s: &str) -> Result<Self, IdParseError> {
        match s.strip_suffix(BRIDGE_SUFFIX) {
            Some(id) => id.parse().map(ResumeId::InsideBridge),
            None => s.parse().map(ResumeId::Event),
        }
    }
}
