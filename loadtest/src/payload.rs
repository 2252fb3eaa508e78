//! The events the load generator publishes, and how a subscriber reads them back.
//!
//! Three mixes (`--mix`): `tokens` and `agent` (realistic AG-UI runs, see [`crate::mix`]), and
//! `custom`, the original one: after the thread's `RUN_STARTED`, every measured event is a
//! `CUSTOM` event whose `value` carries the per-thread sequence number and the send time:
//!
//! ```json
//! {"type":"CUSTOM","name":"agui-loadtest","value":{"seq":17,"ts":1764500000123456789,"pad":"xxxx"}}
//! ```
//!
//! `CUSTOM` events are never coalesced and do not change the fold. The realistic mixes carry a
//! mark `~@<seq>:<ts>@~` instead ([`crate::mix::write_mark`]), placed so that a coalesced frame
//! holds the marks of every event merged into it: a subscriber reads every mark of a frame.
//! A prelude's or a reset bridge's events restate the thread (and may repeat original events
//! with their marks): their marks are not counted ([`restatement_starts`]).

use crate::mix::{self, MARK_OPEN, Script};
use clap::ValueEnum;
use memchr::memmem::Finder;
use serde::Serialize;
use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The JSON before the sequence number.
const HEAD: &str = r#"{"type":"CUSTOM","name":"agui-loadtest","value":{"seq":"#;

static SEQ: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"seq\":"));
static TS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"ts\":"));
static SNAPSHOT: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"type\":\"MESSAGES_SNAPSHOT\""));
static STATE_SNAPSHOT: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"type\":\"STATE_SNAPSHOT\""));
static PRELUDE_MARK: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"agui-fanout\":{\"prelude\":true"));
static MARK: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(MARK_OPEN));

/// The event mix published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mix {
    /// Assistant messages streamed as `TEXT_MESSAGE_CONTENT` deltas of 1-8 words, 4 messages
    /// of 30 deltas per run (an LLM token stream).
    #[default]
    Tokens,
    /// A recorded agent turn per run: steps, reasoning, a tool call with streamed arguments,
    /// its result, `STATE_DELTA`s on a growing state, the streamed answer.
    Agent,
    /// `CUSTOM` events of `--event-bytes` (never coalesced, never folded): the original mix.
    Custom,
}

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

/// Builds the measured events of a mix.
#[derive(Clone, Debug)]
pub struct EventWriter {
    kind: WriterKind,
}

#[derive(Clone, Debug)]
enum WriterKind {
    /// `CUSTOM` events padded to a size.
    Custom { pad: String },
    /// A realistic mix.
    Script(&'static Script),
}

impl EventWriter {
    /// A writer of `mix`; `custom` events are about `bytes` long (with a 6-digit sequence
    /// number; never shorter than the fields themselves, about 90 bytes). The other mixes have
    /// the sizes of their recorded events.
    pub fn new(mix: Mix, bytes: usize) -> Self {
        let kind = match mix {
            Mix::Custom => {
                // HEAD + "123456" + ,"ts": + 19 digits + ,"pad":" + pad + "}}
                let fixed = HEAD.len() + 6 + 6 + 19 + 8 + 3;
                WriterKind::Custom {
                    pad: "x".repeat(bytes.saturating_sub(fixed)),
                }
            }
            Mix::Tokens => WriterKind::Script(&mix::TOKENS),
            Mix::Agent => WriterKind::Script(&mix::AGENT),
        };
        EventWriter { kind }
    }

    /// The body that opens `thread` before measuring (unmeasured): its first `RUN_STARTED`,
    /// and for `agent` the initial `STATE_SNAPSHOT`.
    pub fn open(&self, thread: &str) -> Vec<u8> {
        match &self.kind {
            WriterKind::Custom { .. } => run_started(thread, &format!("{thread}-run")),
            WriterKind::Script(s) => s.open(thread),
        }
    }

    /// Appends event `seq` of `thread` to `out`.
    pub fn write(&self, out: &mut Vec<u8>, thread: &str, seq: u64, ts_ns: u64) {
        use std::io::Write;
        match &self.kind {
            WriterKind::Custom { pad } => {
                out.extend_from_slice(HEAD.as_bytes());
                let _ = write!(out, "{seq},\"ts\":{ts_ns},\"pad\":\"{pad}\"}}}}");
            }
            WriterKind::Script(s) => s.write(out, thread, seq, ts_ns),
        }
    }

    /// A JSON array of `count` events of `thread` numbered from `first_seq`, all stamped
    /// `ts_ns` (a batch of one is the bare object).
    #[cfg(test)]
    pub fn batch(&self, thread: &str, first_seq: u64, count: u64, ts_ns: u64) -> Vec<u8> {
        self.batch_stamped(thread, first_seq, &vec![ts_ns; count as usize])
    }

    /// As [`Self::batch`], the `i`-th event stamped `stamps[i]` (one event per stamp).
    pub fn batch_stamped(&self, thread: &str, first_seq: u64, stamps: &[u64]) -> Vec<u8> {
        let mut out = Vec::with_capacity(stamps.len() * 256);
        if let [ts_ns] = stamps {
            self.write(&mut out, thread, first_seq, *ts_ns);
            return out;
        }
        out.push(b'[');
        for (i, ts_ns) in (0u64..).zip(stamps) {
            if i > 0 {
                out.push(b',');
            }
            self.write(&mut out, thread, first_seq + i, *ts_ns);
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

/// The `(seq, ts)` of a `custom` measured event's JSON, `None` for any other event.
pub fn seq_ts(data: &[u8]) -> Option<(u64, u64)> {
    Some((number_after(&SEQ, data)?, number_after(&TS, data)?))
}

/// Parses `<seq>:<ts>@~` at the start of `data`.
fn parse_mark(data: &[u8]) -> Option<(u64, u64)> {
    let mut nums = [0u64; 2];
    let mut at = 0;
    for (i, n) in nums.iter_mut().enumerate() {
        let start = at;
        while let Some(&b) = data.get(at).filter(|b| b.is_ascii_digit()) {
            *n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            at += 1;
        }
        let sep: &[u8] = if i == 0 { b":" } else { b"@~" };
        if at == start || !data[at..].starts_with(sep) {
            return None;
        }
        at += sep.len();
    }
    Some((nums[0], nums[1]))
}

/// Calls `f` with the `(seq, ts)` of every measured event a frame's data stands for, in
/// order: every mark of a realistic mix's event (several in a coalesced one), or a `custom`
/// event's numbers. Returns how many.
pub fn for_each_measured(data: &[u8], mut f: impl FnMut(u64, u64)) -> usize {
    let mut n = 0;
    for at in MARK.find_iter(data) {
        if let Some((seq, ts)) = parse_mark(&data[at + MARK_OPEN.len()..]) {
            f(seq, ts);
            n += 1;
        }
    }
    if n == 0
        && let Some((seq, ts)) = seq_ts(data)
    {
        f(seq, ts);
        n = 1;
    }
    n
}

/// Whether a frame starts a restatement of the thread (a prelude or a reset bridge), whose
/// events up to and including the next one with an `id:` restate the fold and are not
/// measured: a bridge's first event carries the bridge mark `<id>-bridge`; a prelude opens
/// with a `RUN_STARTED` marked `"agui-fanout":{"prelude":true}` (or, for a thread with no run,
/// a snapshot without an `id:`; a live event always has one).
pub fn restatement_starts(id: Option<&[u8]>, data: &[u8]) -> bool {
    match id {
        Some(id) => id.ends_with(b"-bridge"),
        None => {
            PRELUDE_MARK.find(data).is_some()
                || SNAPSHOT.find(data).is_some()
                || STATE_SNAPSHOT.find(data).is_some()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_have_the_chosen_size() {
        let w = EventWriter::new(Mix::Custom, 200);
        let mut one = Vec::new();
        w.write(&mut one, "t", 123_456, 1_764_500_000_123_456_789);
        assert_eq!(one.len(), 200);
        let v: serde_json::Value = serde_json::from_slice(&one).unwrap();
        assert_eq!(v["type"], "CUSTOM");
        assert_eq!(v["name"], "agui-loadtest");
        assert_eq!(v["value"]["seq"], 123_456);
        assert_eq!(seq_ts(&one), Some((123_456, 1_764_500_000_123_456_789)));
        let batch = w.batch("t", 7, 3, 42);
        let v: Vec<serde_json::Value> = serde_json::from_slice(&batch).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[2]["value"]["seq"], 9);
        // A batch of one is the bare object (one message per POST for nchan), not an array.
        let single = w.batch("t", 5, 1, 9);
        assert_eq!(single.first(), Some(&b'{'));
        assert_eq!(seq_ts(&single), Some((5, 9)));
        let mut got = Vec::new();
        assert_eq!(for_each_measured(&single, |s, t| got.push((s, t))), 1);
        assert_eq!(got, vec![(5, 9)]);
    }

    /// Every event of a realistic mix is valid JSON naming its thread where it has one, and
    /// carries exactly its own mark.
    #[test]
    fn every_mix_event_carries_its_mark() {
        for mix in [Mix::Tokens, Mix::Agent] {
            let w = EventWriter::new(mix, 200);
            let WriterKind::Script(s) = &w.kind else {
                panic!("not a script")
            };
            for seq in 0..3 * s.cycle_len() {
                let ts = 1_764_500_000_000_000_000 + seq;
                let mut out = Vec::new();
                w.write(&mut out, "lt-3", seq, ts);
                let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
                    panic!("{mix:?} {seq}: {e}: {}", String::from_utf8_lossy(&out))
                });
                if let Some(t) = v.get("threadId") {
                    assert_eq!(t, "lt-3");
                }
                let mut marks = Vec::new();
                for_each_measured(&out, |s, t| marks.push((s, t)));
                assert_eq!(
                    marks,
                    vec![(seq, ts)],
                    "{mix:?} {}",
                    String::from_utf8_lossy(&out)
                );
            }
            let open: serde_json::Value = serde_json::from_slice(&w.open("lt-3")).unwrap();
            let first = if open.is_array() { &open[0] } else { &open };
            assert_eq!(first["type"], "RUN_STARTED");
            assert_eq!(first["runId"], "lt-3-run-0");
        }
    }

    #[test]
    fn marks_are_read_in_order_and_malformed_ones_skipped() {
        let data = br#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":" a~@4:10@~ b~@5:11@~~@x:1@~ ~@6:12@"}"#;
        let mut got = Vec::new();
        assert_eq!(for_each_measured(data, |s, t| got.push((s, t))), 2);
        assert_eq!(got, vec![(4, 10), (5, 11)]);
    }

    #[test]
    fn restatements_are_recognised() {
        let prelude_start = br#"{"type":"RUN_STARTED","threadId":"t","runId":"r","metadata":{"agui-fanout":{"prelude":true}}}"#;
        assert!(restatement_starts(None, prelude_start));
        assert!(restatement_starts(
            None,
            br#"{"type":"MESSAGES_SNAPSHOT","messages":[]}"#
        ));
        assert!(restatement_starts(
            Some(b"53cafd13-0-41-bridge"),
            br#"{"type":"TEXT_MESSAGE_END","messageId":"m"}"#
        ));
        // A live run start is an event like any other.
        assert!(!restatement_starts(
            Some(b"53cafd13-0-42"),
            br#"{"type":"RUN_STARTED","threadId":"t","runId":"r","lt":"~@3:4@~"}"#
        ));
        assert_eq!(seq_ts(br#"{"type":"RUN_STARTED"}"#), None);
        let rs: serde_json::Value = serde_json::from_slice(&run_started("t-1", "r")).unwrap();
        assert_eq!(rs["threadId"], "t-1");
    }
}
