//! The events the load generator publishes, and how a subscriber reads them back.
//!
//! Each thread gets one `RUN_STARTED` first (the broker's strict order validation refuses
//! anything else before a run is open); then every measured event is a `CUSTOM` event whose
//! `value` carries the per-thread sequence number and the send time:
//!
//! ```json
//! {"type":"CUSTOM","name":"agui-loadtest","value":{"seq":17,"ts":1764500000123456789,"pad":"xxxx"}}
//! ```
//!
//! `CUSTOM` events are never coalesced and do not change the fold, so every one of them is
//! delivered as published unless a subscriber is reset (then the broker's bridge, which starts
//! with a `MESSAGES_SNAPSHOT`, takes the place of what it skipped).

use memchr::memmem::Finder;
use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The JSON before the sequence number.
const HEAD: &str = r#"{"type":"CUSTOM","name":"agui-loadtest","value":{"seq":"#;

static SEQ: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"seq\":"));
static TS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"ts\":"));
static SNAPSHOT: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"type\":\"MESSAGES_SNAPSHOT\""));
static RUN_STARTED: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"type\":\"RUN_STARTED\""));

/// Nanoseconds since the UNIX epoch, now.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The `RUN_STARTED` that opens `thread`'s run.
pub fn run_started(thread: &str, run_id: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "type": "RUN_STARTED",
        "threadId": thread,
        "runId": run_id,
    }))
    .unwrap_or_default()
}

/// Builds measured events of about a chosen size.
#[derive(Clone, Debug)]
pub struct EventWriter {
    pad: String,
}

impl EventWriter {
    /// A writer whose events are about `bytes` long (with a 6-digit sequence number; never
    /// shorter than the fields themselves, about 90 bytes).
    pub fn new(bytes: usize) -> Self {
        // HEAD + "123456" + ,"ts": + 19 digits + ,"pad":" + pad + "}}
        let fixed = HEAD.len() + 6 + 6 + 19 + 8 + 3;
        EventWriter {
            pad: "x".repeat(bytes.saturating_sub(fixed)),
        }
    }

    /// Appends one event to `out`.
    pub fn write(&self, out: &mut Vec<u8>, seq: u64, ts_ns: u64) {
        use std::io::Write;
        out.extend_from_slice(HEAD.as_bytes());
        let _ = write!(out, "{seq},\"ts\":{ts_ns},\"pad\":\"{}\"}}}}", self.pad);
    }

    /// A JSON array of `count` events numbered from `first_seq`, all stamped `ts_ns`.
    pub fn batch(&self, first_seq: u64, count: u64, ts_ns: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity((count as usize) * (HEAD.len() + 64 + self.pad.len()));
        if count == 1 {
            self.write(&mut out, first_seq, ts_ns);
            return out;
        }
        out.push(b'[');
        for i in 0..count {
            if i > 0 {
                out.push(b',');
            }
            self.write(&mut out, first_seq + i, ts_ns);
        }
        out.push(b']');
        out
    }
}

/// Reads the unsigned integer right after `finder`'s needle in `data`.
fn number_after(finder: &Finder<'_>, data: &[u8]) -> Option<u64> {
    let at = finder.find(data)? + finder.needle().len();
    let digits = &data[at..];
    let mut n: u64 = 0;
    let mut any = false;
    for &b in digits {
        if !b.is_ascii_digit() {
            break;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        any = true;
    }
    any.then_some(n)
}

/// The `(seq, ts)` of a measured event's JSON, `None` for any other event.
pub fn seq_ts(data: &[u8]) -> Option<(u64, u64)> {
    Some((number_after(&SEQ, data)?, number_after(&TS, data)?))
}

/// Whether an event (not a measured one) starts a restatement of the thread: a prelude's or
/// a reset bridge's `RUN_STARTED` or `MESSAGES_SNAPSHOT`.
pub fn is_restatement(data: &[u8]) -> bool {
    SNAPSHOT.find(data).is_some() || RUN_STARTED.find(data).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_have_the_chosen_size() {
        let w = EventWriter::new(200);
        let mut one = Vec::new();
        w.write(&mut one, 123_456, 1_764_500_000_123_456_789);
        assert_eq!(one.len(), 200);
        let v: serde_json::Value = serde_json::from_slice(&one).unwrap();
        assert_eq!(v["type"], "CUSTOM");
        assert_eq!(v["name"], "agui-loadtest");
        assert_eq!(v["value"]["seq"], 123_456);
        assert_eq!(seq_ts(&one), Some((123_456, 1_764_500_000_123_456_789)));
        let batch = w.batch(7, 3, 42);
        let v: Vec<serde_json::Value> = serde_json::from_slice(&batch).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[2]["value"]["seq"], 9);
        // A batch of one is the bare object (one message per POST for nchan), not an array.
        let single = w.batch(5, 1, 9);
        assert_eq!(single.first(), Some(&b'{'));
        assert_eq!(seq_ts(&single), Some((5, 9)));
    }

    #[test]
    fn restatements_are_recognised() {
        assert!(is_restatement(
            br#"{"type":"RUN_STARTED","threadId":"t","runId":"r"}"#
        ));
        assert!(is_restatement(
            br#"{"type":"MESSAGES_SNAPSHOT","messages":[]}"#
        ));
        assert!(!is_restatement(
            br#"{"type":"STATE_SNAPSHOT","snapshot":{}}"#
        ));
        assert_eq!(seq_ts(br#"{"type":"RUN_STARTED"}"#), None);
        let rs: serde_json::Value = serde_json::from_slice(&run_started("t-1", "r")).unwrap();
        assert_eq!(rs["threadId"], "t-1");
    }
}
