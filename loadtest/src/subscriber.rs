//! Subscribers: one task per SSE connection, reading with a hand-written HTTP/SSE parser
//! into a per-thread shared read buffer, and recording deliveries, end-to-end latency (from
//! the send timestamp inside each event), gaps and duplicates (by the per-thread sequence
//! number), resets and resumes.
//!
//! A subscriber behaves like a browser's `EventSource`: when the broker closes its stream it
//! reconnects with `Last-Event-ID` (the id of the last frame that carried one). A resume
//! storm makes every subscriber drop its connection and reconnect at once.

use crate::net::{self, Sources, Target};
use crate::payload;
use crate::stats;
use crate::wire::{self, BodyDecoder, Frame, SseParser};
use hdrhistogram::Histogram;
use std::cell::RefCell;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};

/// Subscriber groups: their latency is recorded and checked separately.
pub const GROUPS: usize = 2;

/// A subscriber's group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    /// Reads as fast as it can.
    Normal = 0,
    /// Stalls or reads slowly while [`Shared::stall`] is set (the `slow` scenario).
    Slow = 1,
}

/// What slow subscribers do while stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowMode {
    /// Stop reading altogether.
    Stall,
    /// Read at most `bytes` every `interval`.
    Slow {
        /// Bytes per read.
        bytes: usize,
        /// Pause between reads.
        interval: Duration,
    },
}

/// The coordinator's orders, broadcast to every subscriber.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Control {
    /// End the subscription now.
    pub stop: bool,
    /// Resume-storm generation: when it changes, drop the connection and reconnect with
    /// `Last-Event-ID` at once.
    pub storm: u64,
}

/// Latency histograms per step and group (one shard of them).
#[derive(Debug, Default)]
pub struct StepHists {
    hists: Vec<Histogram<u64>>,
}

impl StepHists {
    /// The histogram of `step` and `group`, created when first used.
    pub fn get(&mut self, step: usize, group: Group) -> &mut Histogram<u64> {
        let i = step * GROUPS + group as usize;
        while self.hists.len() <= i {
            self.hists.push(stats::histogram());
        }
        &mut self.hists[i]
    }
}

/// What the storm's subscribers measure against.
#[derive(Debug, Default)]
pub struct StormState {
    /// When the storm was called.
    pub t0: Option<Instant>,
    /// Per thread: the first sequence number published after the call. A subscriber has
    /// caught up when it receives one at least that high.
    pub marks: Vec<u64>,
}

/// State shared by all subscribers and the coordinator.
#[derive(Debug)]
pub struct Shared {
    /// The broker.
    pub target: Target,
    /// Source addresses for client sockets.
    pub sources: Arc<Sources>,
    /// The current measurement step (index into the latency histograms).
    pub step: AtomicUsize,
    /// Latency histograms, sharded to keep lock contention low.
    pub shards: Vec<Mutex<StepHists>>,
    /// Per group: sequence numbers accounted for (delivered, or skipped by a gap or a reset),
    /// summed over subscribers; equals the expected count once everything arrived.
    pub progress: [AtomicU64; GROUPS],
    /// Measured events delivered, all groups (duplicates included).
    pub delivered: AtomicU64,
    /// Mid-stream restatements (reset bridges, inexact resumes) seen, all subscribers.
    pub resets: AtomicU64,
    /// Per thread and group: subscribers that connected at least once.
    pub connected_per_thread: Vec<[AtomicU64; GROUPS]>,
    /// Subscribers connected at least once.
    pub connected: AtomicUsize,
    /// Subscribers that gave up before their first connection.
    pub failed: AtomicUsize,
    /// Subscribers currently connected.
    pub open: AtomicUsize,
    /// Slow subscribers stall while set.
    pub stall: AtomicBool,
    /// What stalling means.
    pub slow_mode: SlowMode,
    /// Bounds concurrent first connects.
    pub connect_gate: Semaphore,
    /// Storm bookkeeping.
    pub storm: Mutex<StormState>,
    /// Pause before reconnecting after the broker closed a stream.
    pub reconnect_delay: Duration,
    /// Connect attempts before a subscriber gives up on its first connection.
    pub first_attempts: u32,
}

impl Shared {
    /// State for `threads` threads.
    pub fn new(
        target: Target,
        sources: Arc<Sources>,
        threads: usize,
        connect_concurrency: usize,
        slow_mode: SlowMode,
    ) -> Self {
        Shared {
            target,
            sources,
            step: AtomicUsize::new(0),
            shards: (0..16).map(|_| Mutex::new(StepHists::default())).collect(),
            progress: [AtomicU64::new(0), AtomicU64::new(0)],
            delivered: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            connected_per_thread: (0..threads)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            connected: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            stall: AtomicBool::new(false),
            slow_mode,
            connect_gate: Semaphore::new(connect_concurrency.max(1)),
            storm: Mutex::new(StormState::default()),
            reconnect_delay: Duration::from_millis(100),
            first_attempts: 3,
        }
    }

    /// The merged latency histogram of `step` and `group`.
    pub fn step_histogram(&self, step: usize, group: Group) -> Histogram<u64> {
        let mut out = stats::histogram();
        for shard in &self.shards {
            let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
            let _ = out.add(&*s.get(step, group));
        }
        out
    }
}

/// Who a subscriber is.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Its number.
    pub id: usize,
    /// Index of its thread.
    pub thread: usize,
    /// The subscribe path.
    pub path: String,
    /// Its group.
    pub group: Group,
}

/// What one subscriber saw, returned when it ends.
#[derive(Debug)]
pub struct SubStats {
    /// Its number.
    pub id: usize,
    /// Index of its thread.
    pub thread: usize,
    /// Its group.
    pub group: Group,
    /// Whether it ever connected.
    pub ever_connected: bool,
    /// Successful connections (first one included).
    pub connects: u64,
    /// Failed connection attempts (TCP errors, timeouts, non-200 statuses).
    pub connect_errors: u64,
    /// The last connection error.
    pub last_connect_error: Option<String>,
    /// Streams the broker ended (EOF, reset, malformed response).
    pub peer_closes: u64,
    /// Measured events received (duplicates included).
    pub delivered: u64,
    /// Events received again (sequence number not above the last one).
    pub duplicates: u64,
    /// Jumps in the sequence without a restatement before them.
    pub gaps: u64,
    /// Sequence numbers skipped by those jumps.
    pub gap_events: u64,
    /// Restatements within a stream (reset bridges, preludes on resume).
    pub resets: u64,
    /// Sequence numbers skipped after a restatement (legitimately: a reset).
    pub reset_skipped: u64,
    /// Resumes with `Last-Event-ID` that got a prelude instead of an exact continuation.
    pub inexact_resumes: u64,
    /// Comment frames (heartbeats, broker notices).
    pub comments: u64,
    /// Non-measured events (preludes, bridges).
    pub control_events: u64,
    /// The highest sequence number accounted for.
    pub last_seq: Option<u64>,
    /// End-to-end latency, µs (2 significant digits).
    pub latency: Option<Histogram<u32>>,
    /// Per storm: µs from the call to the new stream's response head.
    pub storm_reconnect_us: Vec<u64>,
    /// Per storm: µs from the call to the first event published after it.
    pub storm_catchup_us: Vec<u64>,
}

/// Sequence and frame bookkeeping of one subscriber.
struct Tracker {
    stats: SubStats,
    /// Id of the last frame that carried one.
    last_id: Vec<u8>,
    /// Latencies of the current read, flushed to the shared histograms.
    batch: Vec<u64>,
    /// A restatement was seen and no measured event since.
    restating: bool,
    /// Inside a prelude or a bridge (up to its event with a plain id).
    in_restatement: bool,
    /// The current connection was opened with `Last-Event-ID`.
    resumed: bool,
    /// Measured events on the current connection.
    conn_events: u64,
    /// Waiting to catch up after a storm: (mark, call time).
    catchup: Option<(u64, Instant)>,
    /// Wall clock of the current read, ns since the epoch.
    now_ns: u64,
}

impl Tracker {
    /// A tracker with nothing seen yet.
    fn new(spec: &Spec) -> Tracker {
        Tracker {
            stats: SubStats {
                id: spec.id,
                thread: spec.thread,
                group: spec.group,
                ever_connected: false,
                connects: 0,
                connect_errors: 0,
                last_connect_error: None,
                peer_closes: 0,
                delivered: 0,
                duplicates: 0,
                gaps: 0,
                gap_events: 0,
                resets: 0,
                reset_skipped: 0,
                inexact_resumes: 0,
                comments: 0,
                control_events: 0,
                last_seq: None,
                latency: None,
                storm_reconnect_us: Vec::new(),
                storm_catchup_us: Vec::new(),
            },
            last_id: Vec::new(),
            batch: Vec::with_capacity(64),
            restating: false,
            in_restatement: false,
            resumed: false,
            conn_events: 0,
            catchup: None,
            now_ns: 0,
        }
    }

    fn accounted(&self) -> u64 {
        self.stats.last_seq.map_or(0, |s| s + 1)
    }

    fn on_frame(&mut self, f: Frame<'_>) {
        if f.comment {
            self.stats.comments += 1;
        }
        if let Some(id) = f.id {
            self.last_id.clear();
            self.last_id.extend_from_slice(id);
        }
        let Some(data) = f.data else { return };
        if !self.in_restatement && payload::restatement_starts(f.id, data) {
            self.in_restatement = true;
            if (self.resumed || self.conn_events > 0) && !self.restating {
                self.stats.resets += 1;
                if self.resumed && self.conn_events == 0 {
                    self.stats.inexact_resumes += 1;
                }
            }
            self.restating = true;
        }
        if self.in_restatement {
            // A prelude's or bridge's events restate the fold (some are original events with
            // their marks): none is a delivery. The first one with a plain id ends it.
            self.stats.control_events += 1;
            if f.id.is_some_and(|id| !id.ends_with(b"-bridge")) {
                self.in_restatement = false;
            }
            return;
        }
        // A coalesced frame stands for several events: every one of them is accounted.
        if payload::for_each_measured(data, |seq, ts| self.on_event(seq, ts)) == 0 {
            self.stats.control_events += 1;
        }
    }

    /// Accounts one measured event.
    fn on_event(&mut self, seq: u64, ts: u64) {
        let lat = self.now_ns.saturating_sub(ts) / 1000;
        self.batch.push(lat);
        stats::record(
            self.stats
                .latency
                .get_or_insert_with(stats::small_histogram),
            lat,
        );
        self.stats.delivered += 1;
        self.conn_events += 1;
        let expected = self.accounted();
        if seq < expected {
            self.stats.duplicates += 1;
        } else {
            if seq > expected {
                if self.restating {
                    self.stats.reset_skipped += seq - expected;
                } else {
                    self.stats.gaps += 1;
                    self.stats.gap_events += seq - expected;
                }
            }
            self.stats.last_seq = Some(seq);
        }
        self.restating = false;
        if let Some((mark, t0)) = self.catchup
            && seq >= mark
        {
            self.stats
                .storm_catchup_us
                .push(t0.elapsed().as_micros() as u64);
            self.catchup = None;
        }
    }
}

/// Per-connection decoding state.
struct Conn {
    stream: TcpStream,
    decoder: BodyDecoder,
    parser: SseParser,
    /// Body bytes that arrived with the response head.
    head_rest: Vec<u8>,
}

thread_local! {
    /// The read buffer of every subscriber on this worker thread (reads are processed
    /// before the next await, so one buffer serves them all).
    static READ_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0; 256 * 1024]);
}

/// How a read loop ended.
enum End {
    Stop,
    Storm,
    Closed,
}

/// Result of processing one read.
enum Fed {
    More,
    Closed,
}

/// Runs one subscriber until told to stop; returns what it saw.
pub async fn run(spec: Spec, shared: Arc<Shared>, mut ctl: watch::Receiver<Control>) -> SubStats {
    let mut t = Tracker::new(&spec);
    let mut storm_seen = ctl.borrow().storm;
    let mut storm_t0: Option<Instant> = None;
    let mut failures = 0u32;
    loop {
        if ctl.borrow().stop {
            break;
        }
        let first = !t.stats.ever_connected;
        let opened = if first {
            let _permit = shared.connect_gate.acquire().await;
            open(&shared, &spec.path, &t.last_id).await
        } else {
            open(&shared, &spec.path, &t.last_id).await
        };
        let mut conn = match opened {
            Ok(c) => c,
            Err(e) => {
                t.stats.connect_errors += 1;
                t.stats.last_connect_error = Some(e);
                failures += 1;
                if first && failures >= shared.first_attempts {
                    shared.failed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                let backoff = Duration::from_millis(100 * u64::from(failures.min(20)));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    r = ctl.changed() => if r.is_err() { break },
                }
                continue;
            }
        };
        failures = 0;
        t.stats.connects += 1;
        if first {
            t.stats.ever_connected = true;
            shared.connected_per_thread[spec.thread][spec.group as usize]
                .fetch_add(1, Ordering::Relaxed);
            shared.connected.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t0) = storm_t0.take() {
            t.stats
                .storm_reconnect_us
                .push(t0.elapsed().as_micros() as u64);
        }
        shared.open.fetch_add(1, Ordering::Relaxed);
        t.resumed = !t.last_id.is_empty();
        t.conn_events = 0;
        t.restating = false;
        t.in_restatement = false;
        let end = read_loop(&mut conn, &mut t, &spec, &shared, &mut ctl, &mut storm_seen).await;
        shared.open.fetch_sub(1, Ordering::Relaxed);
        drop(conn);
        match end {
            End::Stop => break,
            End::Storm => {
                let storm = shared.storm.lock().unwrap_or_else(|e| e.into_inner());
                let t0 = storm.t0.unwrap_or_else(Instant::now);
                storm_t0 = Some(t0);
                if let Some(&mark) = storm.marks.get(spec.thread) {
                    t.catchup = Some((mark, t0));
                }
            }
            End::Closed => {
                t.stats.peer_closes += 1;
                tokio::select! {
                    _ = tokio::time::sleep(shared.reconnect_delay) => {}
                    r = ctl.changed() => if r.is_err() { break },
                }
            }
        }
    }
    t.stats
}

/// Connects, sends the `GET` and reads the response head; a `200` stream is returned ready
/// to read, with any body bytes that came with the head already fed.
async fn open(shared: &Shared, path: &str, last_id: &[u8]) -> Result<Conn, String> {
    let mut stream = net::connect(shared.target.addr, shared.sources.pick())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n",
        shared.target.host
    );
    if let Some(t) = &shared.target.bearer {
        req.push_str("Authorization: Bearer ");
        req.push_str(t);
        req.push_str("\r\n");
    }
    if !last_id.is_empty() {
        req.push_str("Last-Event-ID: ");
        req.push_str(&String::from_utf8_lossy(last_id));
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut head = Vec::with_capacity(512);
    let deadline = tokio::time::Instant::now() + net::CONNECT_TIMEOUT;
    let end = loop {
        if let Some(end) = wire::head_end(&head) {
            break end;
        }
        if head.len() > 64 * 1024 {
            return Err("response head over 64 KiB".into());
        }
        let mut buf = [0u8; 4096];
        let n = match tokio::time::timeout_at(
            deadline,
            tokio::io::AsyncReadExt::read(&mut stream, &mut buf),
        )
        .await
        {
            Err(_) => return Err("timed out waiting for the response head".into()),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Ok(Ok(0)) => return Err("connection closed before the response head".into()),
            Ok(Ok(n)) => n,
        };
        head.extend_from_slice(&buf[..n]);
    };
    let parsed = wire::parse_head(&head[..end])?;
    if parsed.status != 200 {
        return Err(format!("HTTP status {}", parsed.status));
    }
    Ok(Conn {
        stream,
        decoder: BodyDecoder::new(parsed.body),
        parser: SseParser::new(),
        head_rest: head[end..].to_vec(),
    })
}

/// Reads and processes the stream until it ends, the storm is called or `stop` is set.
async fn read_loop(
    conn: &mut Conn,
    t: &mut Tracker,
    spec: &Spec,
    shared: &Shared,
    ctl: &mut watch::Receiver<Control>,
    storm_seen: &mut u64,
) -> End {
    // Body bytes that came with the head.
    let rest = std::mem::take(&mut conn.head_rest);
    if !rest.is_empty()
        && let Fed::Closed = process(conn, t, spec, shared, &rest)
    {
        return End::Closed;
    }
    loop {
        let stalled = spec.group == Group::Slow && shared.stall.load(Ordering::Relaxed);
        let limit = match (stalled, shared.slow_mode) {
            (true, SlowMode::Stall) => {
                // Read nothing; look at the orders now and then.
                tokio::select! {
                    r = ctl.changed() => {
                        if let Some(end) = order(r.is_err(), ctl, storm_seen) { return end; }
                    }
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                continue;
            }
            (true, SlowMode::Slow { bytes, interval }) => {
                tokio::select! {
                    r = ctl.changed() => {
                        if let Some(end) = order(r.is_err(), ctl, storm_seen) { return end; }
                        continue;
                    }
                    _ = tokio::time::sleep(interval) => {}
                }
                bytes.max(1)
            }
            _ => usize::MAX,
        };
        tokio::select! {
            biased;
            r = ctl.changed() => {
                if let Some(end) = order(r.is_err(), ctl, storm_seen) { return end; }
                continue;
            }
            r = conn.stream.readable() => {
                if r.is_err() { return End::Closed; }
            }
        }
        for _ in 0..8 {
            let res = READ_BUF.with_borrow_mut(|buf| {
                let n = buf.len().min(limit);
                match conn.stream.try_read(&mut buf[..n]) {
                    Ok(0) => Err(true),
                    Ok(n) => Ok(process(conn, t, spec, shared, &buf[..n])),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => Err(false),
                    Err(_) => Err(true),
                }
            });
            match res {
                Ok(Fed::More) => {
                    if limit != usize::MAX {
                        break;
                    }
                }
                Ok(Fed::Closed) | Err(true) => return End::Closed,
                Err(false) => break,
            }
        }
    }
}

/// Interprets a change of the coordinator's orders: `Some` ends the read loop.
fn order(closed: bool, ctl: &mut watch::Receiver<Control>, storm_seen: &mut u64) -> Option<End> {
    if closed {
        return Some(End::Stop);
    }
    let c = *ctl.borrow_and_update();
    if c.stop {
        return Some(End::Stop);
    }
    if c.storm != *storm_seen {
        *storm_seen = c.storm;
        return Some(End::Storm);
    }
    None
}

/// Decodes and parses one read, records its events, flushes counters and latencies.
fn process(conn: &mut Conn, t: &mut Tracker, spec: &Spec, shared: &Shared, input: &[u8]) -> Fed {
    let before_accounted = t.accounted();
    let before_delivered = t.stats.delivered;
    let before_resets = t.stats.resets;
    t.now_ns = payload::unix_ns();
    t.batch.clear();
    let Conn {
        decoder, parser, ..
    } = conn;
    let decoded = decoder.decode(input, |piece| parser.feed(piece, |f| t.on_frame(f)));
    let accounted = t.accounted() - before_accounted;
    if accounted > 0 {
        shared.progress[spec.group as usize].fetch_add(accounted, Ordering::Relaxed);
    }
    let delivered = t.stats.delivered - before_delivered;
    if delivered > 0 {
        shared.delivered.fetch_add(delivered, Ordering::Relaxed);
    }
    if t.stats.resets > before_resets {
        shared
            .resets
            .fetch_add(t.stats.resets - before_resets, Ordering::Relaxed);
    }
    if !t.batch.is_empty() {
        let step = shared.step.load(Ordering::Relaxed);
        let shard = &shared.shards[spec.id % shared.shards.len()];
        let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
        let h = s.get(step, spec.group);
        for &v in &t.batch {
            stats::record(h, v);
        }
    }
    if decoded.is_err() || decoder.done() {
        Fed::Closed
    } else {
        Fed::More
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{EventWriter, Mix};
    use agui_fanout::event::EventType;
    use agui_fanout::log::{Epoch, EventId, StreamPos};
    use agui_fanout::queue::coalesce::coalesce;
    use agui_fanout::queue::{Frame as BrokerFrame, MergeKey};
    use serde_json::Value;

    fn apply(doc: &Value, ops: &[Value]) -> Option<Value> {
        agui_fanout::fold::apply_patch(doc, ops).ok()
    }

    /// The broker's frame of measured event `seq` (log position `seq + 1`).
    fn broker_frame(seq: u64, json: &[u8]) -> BrokerFrame {
        let v: Value = serde_json::from_slice(json).unwrap();
        let t = EventType::parse(v["type"].as_str().unwrap()).unwrap();
        let id = EventId {
            epoch: Epoch(7),
            pos: StreamPos::new(0, seq + 1),
        };
        BrokerFrame::new(id, t, json, Instant::now(), MergeKey::of(t, &v, true, None))
    }

    fn tracker() -> Tracker {
        Tracker::new(&Spec {
            id: 0,
            thread: 0,
            path: String::new(),
            group: Group::Normal,
        })
    }

    /// Feeds SSE bytes through the load generator's own parser.
    fn feed(t: &mut Tracker, bytes: &[u8]) {
        let mut p = SseParser::new();
        p.feed(bytes, |f| t.on_frame(f));
    }

    /// Every event of a stream the broker coalesced for a lagging subscriber is accounted for
    /// exactly: a merged delta or `STATE_DELTA` carries the marks of all the events in it.
    #[test]
    fn coalesced_frames_account_for_every_event() {
        for mix in [Mix::Tokens, Mix::Agent] {
            let w = EventWriter::new(mix, 200);
            let total = 400u64;
            let mut frames: Vec<BrokerFrame> = (0..total)
                .map(|seq| {
                    let mut json = Vec::new();
                    w.write(&mut json, "lt-0", seq, 1_000 + seq);
                    broker_frame(seq, &json)
                })
                .collect();
            let merged: u64 = coalesce(&mut frames, apply).iter().map(|(_, n)| n).sum();
            assert!(merged > total / 2, "{mix:?}: only {merged} merged away");
            let mut t = tracker();
            for f in &frames {
                feed(&mut t, &f.bytes);
            }
            let s = &t.stats;
            assert_eq!(
                (s.delivered, s.gaps, s.duplicates, s.last_seq),
                (total, 0, 0, Some(total - 1)),
                "{mix:?}"
            );
        }
    }

    /// Adjacent `STATE_DELTA`s of the `agent` mix merge into one patch holding both marks.
    #[test]
    fn merged_state_deltas_keep_both_marks() {
        let w = EventWriter::new(Mix::Agent, 200);
        let deltas: Vec<u64> = (0..200)
            .filter(|&seq| {
                let mut json = Vec::new();
                w.write(&mut json, "lt-0", seq, 0);
                json.starts_with(br#"{"type":"STATE_DELTA""#)
            })
            .take(2)
            .collect();
        assert_eq!(deltas.len(), 2);
        let mut frames: Vec<BrokerFrame> = deltas
            .iter()
            .enumerate()
            .map(|(i, &seq)| {
                let mut json = Vec::new();
                w.write(&mut json, "lt-0", seq, 50 + seq);
                broker_frame(i as u64, &json)
            })
            .collect();
        coalesce(&mut frames, apply);
        assert_eq!(frames.len(), 1);
        let mut marks = Vec::new();
        payload::for_each_measured(frames[0].json().unwrap(), |s, t| marks.push((s, t)));
        assert_eq!(
            marks,
            vec![(deltas[0], 50 + deltas[0]), (deltas[1], 50 + deltas[1])]
        );
    }

    /// A prelude's and a bridge's events (original events with their marks among them) are not
    /// deliveries; after a bridge, the events it skipped count as reset, not as a gap.
    #[test]
    fn preludes_and_bridges_are_not_deliveries() {
        let w = EventWriter::new(Mix::Tokens, 200);
        let ev = |seq: u64| {
            let mut json = Vec::new();
            w.write(&mut json, "lt-0", seq, 0);
            String::from_utf8(json).unwrap()
        };
        let mut t = tracker();
        let prelude = format!(
            "data: {{\"type\":\"RUN_STARTED\",\"threadId\":\"lt-0\",\"runId\":\"lt-0-run-0\",\"metadata\":{{\"agui-fanout\":{{\"prelude\":true}}}}}}\n\n\
             data: {{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[]}}\n\n\
             data: {}\n\n\
             id: e-0\ndata: {{\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{{}}}}\n\n",
            ev(0)
        );
        feed(&mut t, prelude.as_bytes());
        assert_eq!((t.stats.delivered, t.stats.control_events), (0, 4));
        feed(
            &mut t,
            format!("id: e-1\ndata: {}\n\nid: e-2\ndata: {}\n\n", ev(0), ev(1)).as_bytes(),
        );
        // A bridge: its first event carries the bridge mark; an original event inside it (the
        // re-opened message's start, with its old mark) is not counted; events 2..=9 skipped.
        let bridge = format!(
            "id: e-2-bridge\ndata: {{\"type\":\"CUSTOM\",\"name\":\"agui-fanout.gap\",\"value\":{{}}}}\n\n\
             data: {{\"type\":\"MESSAGES_SNAPSHOT\",\"messages\":[]}}\n\n\
             id: e-9\ndata: {}\n\n\
             id: e-10\ndata: {}\n\n",
            ev(0),
            ev(10)
        );
        feed(&mut t, bridge.as_bytes());
        let s = &t.stats;
        assert_eq!(
            (s.delivered, s.duplicates, s.gaps, s.resets, s.reset_skipped),
            (3, 0, 0, 1, 8)
        );
        // Without a restatement, a jump is a gap.
        feed(&mut t, format!("id: e-12\ndata: {}\n\n", ev(12)).as_bytes());
        assert_eq!((t.stats.gaps, t.stats.gap_events), (1, 1));
    }
}
