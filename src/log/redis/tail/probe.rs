//! The tail's liveness probe: a node whose reading stalls (a connection half open, a
//! subscription left on a server that no longer gets the writes after a failover, a Redis
//! that answers `PING` but delivers nothing) notices within `stall_after`.
//!
//! About every second the node writes a probe (`probe.lua`: an entry on its own stream
//! `<prefix>:probe:{<node id>}` and a `!probe <node id> <entry id>` note on the append-note
//! channel) on the connection its appends use, so a probe goes where appends go. It must come
//! back two ways: the reader's `XREAD` (which names the probe stream besides the followed
//! ones) and, while subscribed, the subscription. A probe Redis acknowledged that has not come
//! back one way within `stall_after` is a stall of that way: the reader drops its connection
//! and reconnects (its follows are checked again and continue from their cursors), or the
//! subscriber drops its subscription and subscribes again; the action repeats every
//! `stall_after` while the stall lasts. While the reader is stalled the log is not ready
//! (`/readyz` 503). Gauges: the age of the newest probe read back, its lag, and the stall.

use super::super::Inner;
use super::super::scripts::{ProbeArgs, ScriptArgs};
use crate::log::StreamPos;
use crate::metrics::{TAIL_LAG, TAIL_PROBE_AGE, TAIL_STALLED, TAIL_STALLS};
use futures::FutureExt;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Probes remembered per way while they are not back (the oldest, which decides a stall, is
/// always kept).
const PENDING: usize = 64;

/// The marker of a probe note (`!` is not allowed in a thread id, so no append note starts
/// with it).
pub(in crate::log::redis) const NOTE_PREFIX: &str = "!probe ";

/// The node's probe: its identity, the probes on their way back, and the signals to the
/// reader and the subscriber.
pub(in crate::log::redis) struct Probe {
    /// This process's node id: 16 random hex digits.
    node: String,
    /// `<prefix>:probe:{<node id>}`.
    pub(in crate::log::redis) key: String,
    /// `<prefix>:probe:{<node id>}:n`: the probe's shard channel on a cluster (its slot).
    pub(in crate::log::redis) channel: String,
    /// A probe not back within this long is a stall.
    stall_after: Duration,
    /// Period of the probes.
    every: Duration,
    state: Mutex<State>,
    /// Tells the reader to drop its connection (a stall of the read way).
    pub(in crate::log::redis) reconnect_reader: Notify,
    /// Tells the subscriber to drop its subscription (a stall of the note way).
    pub(in crate::log::redis) resubscribe: Notify,
}

#[derive(Default)]
struct State {
    read: Way,
    notes: Way,
}

/// One way probes come back.
#[derive(Default)]
struct Way {
    /// Probes Redis acknowledged, not yet back this way, oldest first: entry ID and when the
    /// acknowledgement came.
    pending: VecDeque<(StreamPos, Instant)>,
    /// Highest probe back this way.
    seen: StreamPos,
    /// When the newest probe back this way was acknowledged, and how long after that it came
    /// back.
    newest: Option<(Instant, Duration)>,
    /// When a stall of this way was last acted on (`None`: not stalled).
    kicked: Option<Instant>,
    /// Notes only: probes sent from this instant on come back (subscribed); `None`: not
    /// subscribed, nothing expected.
    open_since: Option<Instant>,
}

impl Way {
    fn expect(&mut self, id: StreamPos, acked: Instant) {
        if id <= self.seen {
            // Back before its acknowledgement was handled.
            return;
        }
        if self.pending.len() >= PENDING {
            self.pending.remove(1);
        }
        self.pending.push_back((id, acked));
    }

    /// Probes up to `id` are back; true when that ends a stall.
    fn back(&mut self, id: StreamPos, now: Instant) -> bool {
        self.seen = self.seen.max(id);
        while let Some(&(pending, acked)) = self.pending.front() {
            if pending > id {
                break;
            }
            self.pending.pop_front();
            self.newest = Some((acked, now.saturating_duration_since(acked)));
        }
        self.kicked.take().is_some()
    }

    /// How long the oldest probe not back has waited since its acknowledgement.
    fn waiting(&self, now: Instant) -> Duration {
        self.pending.front().map_or(Duration::ZERO, |&(_, acked)| {
            now.saturating_duration_since(acked)
        })
    }

    /// True when the way is stalled and the last action on it is `stall_after` old (or none).
    fn due(&mut self, now: Instant, stall_after: Duration) -> bool {
        if self.waiting(now) < stall_after {
            return false;
        }
        if self
            .kicked
            .is_some_and(|at| now.saturating_duration_since(at) < stall_after)
        {
            return false;
        }
        self.kicked = Some(now);
        true
    }
}

impl Probe {
    /// The probe of a node with key prefix `prefix`: `stall_after` raised to three times the
    /// tail's `block` (its reads of the probe come at least that often), probes every fifth
    /// of that, at most every second.
    pub(in crate::log::redis) fn new(prefix: &str, stall_after: Duration, block: Duration) -> Self {
        let node = format!("{:016x}", rand::random::<u64>());
        let stall_after = stall_after.max(block.saturating_mul(3));
        Probe {
            key: format!("{prefix}:probe:{{{node}}}"),
            channel: format!("{prefix}:probe:{{{node}}}:n"),
            node,
            every: (stall_after / 5)
                .min(Duration::from_secs(1))
                .max(Duration::from_millis(10)),
            stall_after,
            state: Mutex::new(State::default()),
            reconnect_reader: Notify::new(),
            resubscribe: Notify::new(),
        }
    }

    /// The reader has a new connection: a stall acted on while it had none (connecting, or
    /// waiting out its backoff) left a wake-up in `reconnect_reader` (`notify_one` keeps one
    /// when nobody waits) that would drop this fresh connection at its first read, before it
    /// could read the probes back; with a backoff longer than `stall_after` that repeated on
    /// every reconnect and the tail never came back. Taken here, so only a stall seen on this
    /// connection drops it.
    pub(in crate::log::redis) fn reader_connected(&self) {
        // Polling `notified()` once takes a stored wake-up, if any.
        let _ = self.reconnect_reader.notified().now_or_never();
    }

    /// Redis acknowledged probe `id`, sent at `sent`.
    fn acknowledged(&self, id: StreamPos, sent: Instant) {
        let now = Instant::now();
        let mut state = self.state.lock();
        state.read.expect(id, now);
        // A probe sent before the subscription was confirmed may have been published before it.
        if state.notes.open_since.is_some_and(|at| sent >= at) {
            state.notes.expect(id, now);
        }
    }

    /// The reader read probe `id` (and every earlier one) back.
    pub(in crate::log::redis) fn read_back(&self, id: StreamPos) {
        let ended = self.state.lock().read.back(id, Instant::now());
        if ended {
            tracing::info!("redis tail reads again (probe back)");
        }
    }

    /// The subscriber got a probe note; only this node's own probes count.
    pub(in crate::log::redis) fn note(&self, payload: &[u8]) {
        let Some(rest) = payload.strip_prefix(NOTE_PREFIX.as_bytes()) else {
            return;
        };
        let Ok(rest) = std::str::from_utf8(rest) else {
            return;
        };
        let Some((node, id)) = rest.split_once(' ') else {
            return;
        };
        if node != self.node {
            return;
        }
        if let Ok(id) = id.parse::<StreamPos>() {
            let ended = self.state.lock().notes.back(id, Instant::now());
            if ended {
                tracing::info!("redis append notes arrive again (probe back)");
            }
        }
    }

    /// The subscription is confirmed (`true`: probes sent from now on come back as notes) or
    /// gone (`false`: none expected).
    pub(in crate::log::redis) fn subscribed(&self, up: bool) {
        let mut state = self.state.lock();
        state.notes = Way {
            open_since: up.then(Instant::now),
            ..Way::default()
        };
    }

    /// Why the log is not ready: the reader has not read a probe back for longer than
    /// `stall_after`; `None` when it keeps up.
    pub(in crate::log::redis) fn stalled(&self) -> Option<String> {
        let waiting = self.state.lock().read.waiting(Instant::now());
        (waiting >= self.stall_after).then(|| {
            format!(
                "redis tail stalled: no probe read back for {:.1}s (redis_tail_stall {:?})",
                waiting.as_secs_f64(),
                self.stall_after
            )
        })
    }

    /// Acts on stalls that are due and sets the gauges.
    fn check(&self) {
        let now = Instant::now();
        let (read, notes, age, lag, stalled) = {
            let mut state = self.state.lock();
            let read = state.read.due(now, self.stall_after);
            let notes = state.notes.due(now, self.stall_after);
            let way = &state.read;
            let age = match (way.newest, way.pending.front()) {
                (Some((acked, _)), _) => now.saturating_duration_since(acked),
                (None, Some(&(_, acked))) => now.saturating_duration_since(acked),
                (None, None) => Duration::ZERO,
            };
            let lag = way.newest.map_or(Duration::ZERO, |(_, lag)| lag);
            let stalled = way.waiting(now) >= self.stall_after;
            (read, notes, age, lag, stalled)
        };
        metrics::gauge!(TAIL_PROBE_AGE).set(age.as_secs_f64());
        metrics::gauge!(TAIL_LAG).set(lag.as_secs_f64());
        metrics::gauge!(TAIL_STALLED).set(if stalled { 1.0 } else { 0.0 });
        if read {
            metrics::counter!(TAIL_STALLS, "path" => "read").increment(1);
            tracing::warn!(stall_after = ?self.stall_after,
                "redis tail stalled: probes are not read back; reconnecting the reader");
            self.reconnect_reader.notify_one();
        }
        if notes {
            metrics::counter!(TAIL_STALLS, "path" => "notes").increment(1);
            tracing::warn!(stall_after = ?self.stall_after,
                "redis append notes stalled: probe notes are not coming back; resubscribing");
            self.resubscribe.notify_one();
        }
    }
}

/// Writes a probe every period on the connection appends use, and acts on stalls, until
/// `shutdown`. A probe that fails (Redis down) is not expected back: the outage shows in
/// every other call.
pub(super) async fn run(log: Arc<Inner>, shutdown: CancellationToken) {
    let probe = log.probe.clone();
    let sharded = log.target.is_cluster();
    let mut tick = tokio::time::interval(probe.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ttl_ms = u64::try_from(
        probe
            .stall_after
            .saturating_mul(10)
            .max(Duration::from_secs(60))
            .as_millis(),
    )
    .unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        probe.check();
        let args = ProbeArgs {
            key: &probe.key,
            channel: if sharded {
                &probe.channel
            } else {
                &log.channel
            },
            node: &probe.node,
            ttl_ms,
            sharded,
        };
        let mut conn = log.conn.clone();
        let sent = Instant::now();
        let invocation = args.invocation(&log.scripts.probe);
        let write = invocation.invoke_async::<String>(&mut conn);
        let written = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            written = tokio::time::timeout(log.config.op_timeout, write) => written,
        };
        match written {
            Ok(Ok(id)) => match id.parse::<StreamPos>() {
                Ok(id) => probe.acknowledged(id, sent),
                Err(_) => tracing::debug!(%id, "redis probe: unexpected entry ID"),
            },
            Ok(Err(e)) => tracing::debug!(error = %e, "redis probe not written"),
            Err(_) => tracing::debug!("redis probe not written in time"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(ms: u64) -> StreamPos {
        StreamPos::new(ms, 0)
    }

    #[test]
    fn a_way_stalls_when_its_oldest_probe_is_not_back_in_time() {
        let stall = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut way = Way::default();
        way.expect(pos(1), t0);
        way.expect(pos(2), t0 + Duration::from_secs(1));
        assert!(!way.due(t0 + Duration::from_secs(4), stall));
        assert!(way.due(t0 + Duration::from_secs(5), stall));
        // Acted on: not again before another `stall`.
        assert!(!way.due(t0 + Duration::from_secs(6), stall));
        assert!(way.due(t0 + Duration::from_secs(10), stall));
        // Back: the stall ends, the newest probe back gives the lag.
        assert!(way.back(pos(2), t0 + Duration::from_secs(11)));
        assert_eq!(way.waiting(t0 + Duration::from_secs(11)), Duration::ZERO);
        assert_eq!(way.newest.unwrap().1, Duration::from_secs(10));
        // A probe back before its acknowledgement is not expected again.
        way.back(pos(4), t0 + Duration::from_secs(12));
        way.expect(pos(3), t0 + Duration::from_secs(12));
        assert!(way.pending.is_empty());
    }

    #[test]
    fn pending_probes_are_bounded_and_keep_the_oldest() {
        let t0 = Instant::now();
        let mut way = Way::default();
        for i in 1..=1000 {
            way.expect(pos(i), t0 + Duration::from_millis(i));
        }
        assert_eq!(way.pending.len(), PENDING);
        assert_eq!(way.pending.front().unwrap().0, pos(1));
        assert_eq!(way.pending.back().unwrap().0, pos(1000));
    }

    #[test]
    fn notes_count_only_this_nodes_probes_sent_while_subscribed() {
        let probe = Probe::new("agui", Duration::from_secs(5), Duration::from_secs(1));
        let before = Instant::now();
        probe.subscribed(true);
        probe.acknowledged(pos(1), before);
        assert!(probe.state.lock().notes.pending.is_empty());
        probe.acknowledged(pos(2), Instant::now());
        assert_eq!(probe.state.lock().notes.pending.len(), 1);
        probe.note(format!("{NOTE_PREFIX}0000000000000000 2-0").as_bytes());
        assert_eq!(probe.state.lock().notes.pending.len(), 1);
        probe.note(format!("{NOTE_PREFIX}{} 2-0", probe.node).as_bytes());
        assert!(probe.state.lock().notes.pending.is_empty());
        assert_eq!(probe.state.lock().read.pending.len(), 2);
        probe.read_back(pos(2));
        assert!(probe.stalled().is_none());
    }
}
