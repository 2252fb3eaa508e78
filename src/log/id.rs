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

impl Epoch {
    /// The 8 lowercase hex digits of the epoch.
    fn hex(self) -> [u8; 8] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 8];
        for (i, d) in out.iter_mut().enumerate() {
            *d = DIGITS[(self.0 >> (28 - 4 * i) & 0xf) as usize];
        }
        out
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = IdText::default();
        text.put(&self.hex());
        f.write_str(text.as_str())
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
        let mut text = IdText::default();
        text.put_pos(*self);
        f.write_str(text.as_str())
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

impl EventId {
    /// The id's text form (`<8 hex>-<ms>-<seq>`) on the stack: every frame and every publish
    /// reply writes one, and `core::fmt` took ~1,100 instructions a frame and ~3,000 a reply
    /// (callgrind, `benches/hot_path.rs`; see `loadtest/REPORT.md`, session 12).
    pub fn text(&self) -> IdText {
        let mut text = IdText::default();
        text.put(&self.epoch.hex());
        text.put(b"-");
        text.put_pos(self.pos);
        text
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text().as_str())
    }
}

/// The text form of an [`EventId`] or a [`StreamPos`] in a fixed buffer (at most
/// 8 + 1 + 20 + 1 + 20 ASCII bytes), without an allocation.
#[derive(Clone, Copy)]
pub struct IdText {
    buf: [u8; IdText::CAPACITY],
    len: u8,
}

impl IdText {
    /// The longest text: 8 hex digits, two dashes, two `u64` in decimal.
    pub const CAPACITY: usize = 50;

    fn put(&mut self, bytes: &[u8]) {
        let at = usize::from(self.len);
        // Within `CAPACITY`: the callers write at most one epoch and one position.
        self.buf[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len() as u8;
    }

    fn put_pos(&mut self, pos: StreamPos) {
        let mut digits = itoa::Buffer::new();
        self.put(digits.format(pos.ms).as_bytes());
        self.put(b"-");
        self.put(digits.format(pos.seq).as_bytes());
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits, hex digits and dashes are ever put; an empty id would reset the
        // client's last event id, so a broken invariant must fail loudly.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).expect("ASCII only")
    }
}

impl Default for IdText {
    fn default() -> Self {
        IdText {
            buf: [0; IdText::CAPACITY],
            len: 0,
        }
    }
}

impl std::ops::Deref for IdText {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for IdText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
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
