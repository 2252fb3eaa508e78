//! The simulated client: what the log holds (the truth each write is checked against), the
//! statistics of a case, and one client following the thread over reconnects, checking every
//! write it receives against properties (a)–(d).

use crate::generator::*;
use crate::sse;
use agui_fanout::event::{ThreadId, ValidEvent};
use agui_fanout::fold::ThreadFold;
use agui_fanout::fold::prelude;
use agui_fanout::hub::{Hub, Outcome, Start, Subscription};
use agui_fanout::log::{Epoch, EventId, ResumeId, StreamPos};
use agui_fanout::queue::{CloseReason, Drained, Frame};
use serde_json::Value;
use std::time::Instant;

// ---- the log's truth ----------------------------------------------------------------------

/// What was appended, and the fold after each prefix.
pub(crate) struct Truth {
    pub(crate) epoch: Option<Epoch>,
    /// `(type, json)` of event `k` at index `k - 1` (log position `0-k`).
    pub(crate) events: Vec<(String, bytes::Bytes)>,
    /// `(messages, state)` after `k` events at index `k`.
    pub(crate) at: Vec<(Value, Value)>,
    pub(crate) fold: ThreadFold,
    /// Largest prelude seen so far (bytes), a bound on one bridge.
    pub(crate) max_prelude: usize,
}

impl Truth {
    pub(crate) fn new() -> Self {
        let fold = ThreadFold::new();
        Truth {
            epoch: None,
            events: Vec::new(),
            at: vec![view(&fold)],
            fold,
            max_prelude: 0,
        }
    }

    pub(crate) fn push(&mut self, id: EventId, ev: &ValidEvent) -> Result<(), String> {
        match self.epoch {
            None => self.epoch = Some(id.epoch),
            Some(e) if e != id.epoch => return Err(format!("epoch changed to {}", id.epoch)),
            _ => {}
        }
        if id.pos != StreamPos::new(0, self.events.len() as u64 + 1) {
            return Err(format!("unexpected position {id}"));
        }
        let v = ev.value().map_err(|e| e.to_string())?;
        self.events
            .push((v["type"].as_str().unwrap_or("").to_owned(), ev.json.clone()));
        let _ = self.fold.apply_logged(&v);
        self.at.push(view(&self.fold));
        let pre = prelude::prelude(&self.fold);
        if !pre.is_empty() {
            let f = Frame::synthesised(id, &pre, Instant::now(), None);
            self.max_prelude = self.max_prelude.max(f.bytes.len());
        }
        Ok(())
    }

    pub(crate) fn head(&self) -> Option<EventId> {
        let epoch = self.epoch?;
        Some(EventId {
            epoch,
            pos: StreamPos::new(0, self.events.len() as u64),
        })
    }

    /// Bytes of the frame of event `k` as published (`id:` + `data:` + blank line).
    pub(crate) fn frame_len(&self, k: usize) -> usize {
        let id = EventId {
            epoch: self.epoch.unwrap_or(Epoch(0)),
            pos: StreamPos::new(0, k as u64),
        };
        4 + id.to_string().len() + 1 + 6 + self.events[k - 1].1.len() + 2
    }
}

pub(crate) fn view(f: &ThreadFold) -> (Value, Value) {
    (
        serde_json::to_value(f.fold().messages()).unwrap_or(Value::Null),
        f.fold().state().clone(),
    )
}

// ---- simulated clients --------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
pub(crate) struct Stats {
    pub(crate) events: usize,
    pub(crate) failing_deltas: usize,
    pub(crate) connections: usize,
    pub(crate) preludes: usize,
    pub(crate) exact_resumes: usize,
    pub(crate) unresumable: usize,
    /// Of those, ids of another epoch started at the epoch's first event (PROTOCOL §4.3).
    pub(crate) epoch_starts: usize,
    /// Connections cut inside a write.
    pub(crate) cuts: usize,
    /// Of those, cut inside a reset bridge (after its first event): resumed with its mark.
    pub(crate) cuts_inside_bridges: usize,
    pub(crate) synthesised_mid_connection: usize,
    pub(crate) coalesced_frames: usize,
    pub(crate) coalesced_events: usize,
    pub(crate) coalesced_snapshots: usize,
    /// Coalesced snapshots larger than the deltas they stand for.
    pub(crate) coalesced_snapshots_larger: usize,
    pub(crate) closes_overflow: usize,
    /// Overflow closes of a connection whose last write ended with a coalesced frame.
    pub(crate) closes_overflow_after_coalesced: usize,
    pub(crate) closes_other: usize,
    pub(crate) trimmed: usize,
    pub(crate) max_live_frames: usize,
}

impl Stats {
    pub(crate) fn add(&mut self, o: &Stats) {
        self.events += o.events;
        self.failing_deltas += o.failing_deltas;
        self.connections += o.connections;
        self.preludes += o.preludes;
        self.exact_resumes += o.exact_resumes;
        self.unresumable += o.unresumable;
        self.epoch_starts += o.epoch_starts;
        self.cuts += o.cuts;
        self.cuts_inside_bridges += o.cuts_inside_bridges;
        self.synthesised_mid_connection += o.synthesised_mid_connection;
        self.coalesced_frames += o.coalesced_frames;
        self.coalesced_events += o.coalesced_events;
        self.coalesced_snapshots += o.coalesced_snapshots;
        self.coalesced_snapshots_larger += o.coalesced_snapshots_larger;
        self.closes_overflow += o.closes_overflow;
        self.closes_overflow_after_coalesced += o.closes_overflow_after_coalesced;
        self.closes_other += o.closes_other;
        self.trimmed += o.trimmed;
        self.max_live_frames = self.max_live_frames.max(o.max_live_frames);
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Reconnect {
    LastId,
    NoId,
    Bogus,
}

pub(crate) struct Client {
    pub(crate) n: usize,
    pub(crate) cfg: SubCfg,
    pub(crate) sub: Option<Subscription>,
    /// No event of the current connection received yet.
    pub(crate) conn_first: bool,
    /// Last id of the current connection.
    pub(crate) conn_last: Option<EventId>,
    /// The last frame received was a coalesced one.
    pub(crate) last_coalesced: bool,
    /// The current connection began with a prelude (the hub knows its view throughout).
    pub(crate) conn_prelude: bool,
    /// The current connection starts at the epoch's first event (an id of another epoch,
    /// PROTOCOL §4.3): its prelude comes through the queue and a backfill follows it, so the
    /// hub knows its view only once the backfill is written, as for an exact resume.
    pub(crate) conn_epoch_start: bool,
    /// The client's fold (messages and state carry over; order state per connection).
    pub(crate) fold: ThreadFold,
    /// Last id received (over all connections).
    pub(crate) last: Option<EventId>,
    /// The last id received is the mark of a reset bridge sent after `last` (or, `last`
    /// being `None`, after nothing): the client resumes with that mark.
    pub(crate) bridge_mark: bool,
    pub(crate) connected_once: bool,
    pub(crate) reconnect_at: usize,
    pub(crate) reconnect: Reconnect,
    pub(crate) next_drain: usize,
    /// Trace of this client's connections and writes, for failure messages.
    pub(crate) log: Vec<String>,
}

impl Client {
    pub(crate) fn fail(&self, what: String) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(12).collect();
        format!(
            "client {}: {what}\n  recent (newest first):\n    {}",
            self.n,
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n    ")
        )
    }

    pub(crate) async fn connect(
        &mut self,
        hub: &Hub,
        thread: &ThreadId,
        truth: &Truth,
        start: Start,
        settled: bool,
        stats: &mut Stats,
    ) -> Result<(), String> {
        let sub = hub
            .subscribe(thread, start)
            .await
            .map_err(|e| self.fail(format!("subscribe: {e}")))?;
        stats.connections += 1;
        match (start, sub.outcome) {
            (Start::After(_), Outcome::Exact) => stats.exact_resumes += 1,
            (Start::InsideBridge(_), Outcome::Unresumable(_)) => {
                stats.unresumable += 1;
                stats.cuts_inside_bridges += 1;
            }
            (Start::InsideBridge(_), _) => {
                return Err(self.fail("a resume inside a bridge taken as exact".into()));
            }
            (_, Outcome::Unresumable(_)) => stats.unresumable += 1,
            (Start::After(_), Outcome::EpochStart) => {
                stats.unresumable += 1;
                stats.epoch_starts += 1;
            }
            (_, Outcome::EpochStart) => {
                return Err(self.fail("an epoch start without an id".into()));
            }
            _ => {}
        }
        self.log.push(format!(
            "connect {start:?} -> {:?} prelude={} (head {:?})",
            sub.outcome,
            sub.prelude.is_some(),
            truth.head().map(|i| i.to_string())
        ));
        if !sub.fold_known {
            return Err(self.fail("the hub does not know the thread's fold".into()));
        }
        let exact = matches!((start, sub.outcome), (Start::After(_), Outcome::Exact))
            || matches!((start, sub.outcome), (Start::FromStart, Outcome::Exact));
        let epoch_start = sub.outcome == Outcome::EpochStart;
        // (When the hub has not fanned the last batch out yet, its fold may still be empty.
        // An epoch start's prelude comes first through the queue.)
        if settled && !exact && !epoch_start && truth.head().is_some() && sub.prelude.is_none() {
            return Err(
                self.fail("a fresh connection to a non-empty thread without prelude".into())
            );
        }
        if (exact || epoch_start) && sub.prelude.is_some() {
            return Err(self.fail("an exact resume with a prelude".into()));
        }
        if epoch_start {
            // The id was of another epoch: nothing the client received is a position of this
            // one, and the stream starts over at the epoch's first event. Such a client holds
            // the lost epoch's messages, not this log's (the forged id here comes with this
            // log's): the prelude's snapshots replace them, except `reasoning` and `activity`
            // messages, which a MESSAGES_SNAPSHOT without one of the kind keeps on the client
            // (AGUI.md §6; PROTOCOL §4.3), so that a replay from the start would append to them
            // again. Modelled as a client of a lost epoch: holding nothing of this log.
            self.fold = ThreadFold::new();
            self.last = None;
            self.bridge_mark = false;
        }
        self.conn_first = true;
        self.conn_last = None;
        self.conn_prelude = false;
        self.conn_epoch_start = epoch_start;
        self.connected_once = true;
        let prelude = sub.prelude.as_ref().map(|p| p.bytes.clone());
        self.sub = Some(sub);
        if let Some(bytes) = prelude {
            self.receive(&bytes, None, truth, stats)?;
        }
        Ok(())
    }

    pub(crate) fn disconnect(&mut self, at: usize, offline: usize, how: Reconnect, why: &str) {
        self.log.push(format!("disconnect ({why}) at step {at}"));
        self.sub = None;
        self.reconnect_at = at + offline;
        self.reconnect = how;
    }

    /// Processes one write of the stream (whole frames); with `cut_after = Some(n)`, only the
    /// first `n` events of it (the connection was cut there: the rest never arrives and the
    /// fold is not compared, since the client may be inside a bridge).
    pub(crate) fn receive(
        &mut self,
        bytes: &[u8],
        cut_after: Option<usize>,
        truth: &Truth,
        stats: &mut Stats,
    ) -> Result<(), String> {
        let text = std::str::from_utf8(bytes).map_err(|e| self.fail(format!("not UTF-8: {e}")))?;
        if text.contains('\r') || !text.ends_with("\n\n") {
            return Err(self.fail(format!("bad framing: {text:?}")));
        }
        let mut data_only = 0usize;
        let mut types = Vec::new();
        for block in text.split_terminator("\n\n") {
            if cut_after.is_some_and(|n| types.len() >= n) {
                self.log.push(format!("cut after {types:?}"));
                return Ok(());
            }
            let frame = sse::parse_frame(block).map_err(|e| self.fail(e))?;
            if frame.retry.is_some() {
                return Err(self.fail(format!("unexpected retry: in a queue's write: {block:?}")));
            }
            let (id, data) = (frame.id.as_deref(), frame.data.as_deref());
            let Some(data) = data else {
                if id.is_some() {
                    return Err(self.fail(format!("id without data: {block:?}")));
                }
                continue;
            };
            let ev: Value = serde_json::from_str(data)
                .map_err(|e| self.fail(format!("data is not JSON ({e}): {data}")))?;
            let ty = ev["type"].as_str().unwrap_or("?").to_owned();
            types.push(ty.clone());
            if self.conn_first {
                self.conn_first = false;
                if prelude::is_prelude_start(&ev) {
                    // A fresh HTTP response: a fresh verifier; messages and state carry over.
                    self.fold.reset_order();
                    self.conn_prelude = !self.conn_epoch_start;
                    stats.preludes += 1;
                }
            } else if prelude::is_prelude_start(&ev) {
                return Err(self.fail(format!("a marked RUN_STARTED inside a connection: {data}")));
            }
            if let Err(v) = self.fold.apply_logged(&ev) {
                return Err(self.fail(format!(
                    "(a) order violation [{}] on {data} (write: {types:?})",
                    v.rule
                )));
            }
            let Some(id) = id else {
                data_only += 1;
                continue;
            };
            let id = match id.parse::<ResumeId>() {
                Ok(ResumeId::Event(id)) => id,
                Ok(ResumeId::InsideBridge(after)) => {
                    // The first event of a reset bridge: marked after the client's last id.
                    let last = self.last.map_or(StreamPos::ZERO, |l| l.pos);
                    if Some(after.epoch) != truth.epoch || after.pos != last || data_only > 0 {
                        return Err(self.fail(format!(
                            "bridge mark {after}-bridge after {last} (events without id before it: {data_only})"
                        )));
                    }
                    self.bridge_mark = true;
                    data_only += 1;
                    continue;
                }
                Err(_) => return Err(self.fail(format!("malformed id {id:?}"))),
            };
            if Some(id.epoch) != truth.epoch {
                return Err(self.fail(format!("id {id} of another epoch")));
            }
            if self.conn_last.is_some_and(|l| id.pos <= l.pos) {
                return Err(self.fail(format!("ids not increasing within a connection at {id}")));
            }
            let prev = self.last.map_or(0, |l| l.pos.seq as usize);
            let x = id.pos.seq as usize;
            if x < prev || x > truth.events.len() {
                return Err(self.fail(format!("id {id} goes back (last {prev}) or ahead")));
            }
            let synthesised =
                data_only > 0 || ty == "MESSAGES_SNAPSHOT" || prelude::is_prelude_start(&ev);
            if synthesised {
                if self.conn_last.is_some() {
                    stats.synthesised_mid_connection += 1;
                }
            } else {
                self.check_frame(prev, x, &ty, data, block.len() + 2, truth, stats)?;
            }
            data_only = 0;
            self.last_coalesced = !synthesised && x > prev + 1;
            self.bridge_mark = false;
            self.last = Some(id);
            self.conn_last = Some(id);
        }
        if data_only > 0 {
            return Err(self.fail("a write ends with events without id".into()));
        }
        let k = self.last.map_or(0, |l| l.pos.seq as usize);
        self.log.push(format!("write up to {k}: {types:?}"));
        let got = view(&self.fold);
        if got != truth.at[k] {
            return Err(self.fail(format!(
                "(a) fold after {k} differs:\n  client messages {}\n  log    messages {}\n  client state {}\n  log    state {}",
                got.0, truth.at[k].0, got.1, truth.at[k].1
            )));
        }
        Ok(())
    }

    /// (b): a frame at log position `x`, the previous id received being `prev`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_frame(
        &self,
        prev: usize,
        x: usize,
        ty: &str,
        data: &str,
        len: usize,
        truth: &Truth,
        stats: &mut Stats,
    ) -> Result<(), String> {
        if x == prev {
            return Err(self.fail(format!("event {x} received twice")));
        }
        if x == prev + 1 {
            if data.as_bytes() != &truth.events[x - 1].1[..] {
                return Err(self.fail(format!(
                    "(b) event {x} not delivered as published: {data} vs {}",
                    String::from_utf8_lossy(&truth.events[x - 1].1)
                )));
            }
            return Ok(());
        }
        // Stands for (prev, x]: a coalesced frame.
        let originals: Vec<&str> = truth.events[prev..x]
            .iter()
            .map(|(t, _)| t.as_str())
            .collect();
        let ok_types = match ty {
            "TEXT_MESSAGE_CONTENT" | "TOOL_CALL_ARGS" | "REASONING_MESSAGE_CONTENT" => {
                originals.iter().all(|t| *t == ty)
            }
            "STATE_DELTA" | "STATE_SNAPSHOT" => originals.iter().all(|t| *t == "STATE_DELTA"),
            _ => false,
        };
        if !ok_types {
            return Err(self.fail(format!(
                "(a)/(b) a {ty} frame stands for events {}..={x} of types {originals:?} (a gap, or a merge across other events)",
                prev + 1
            )));
        }
        let original_bytes: usize = (prev + 1..=x).map(|k| truth.frame_len(k)).sum();
        stats.coalesced_frames += 1;
        stats.coalesced_events += x - prev;
        if ty == "STATE_SNAPSHOT" {
            stats.coalesced_snapshots += 1;
        }
        if len > original_bytes && ty == "STATE_SNAPSHOT" {
            // PROTOCOL §5 turns a run of deltas with a failing one into a snapshot of the whole
            // folded state, which can outgrow the deltas (see
            // `a_failing_delta_run_coalesces_into_a_snapshot_larger_than_its_deltas`). Its
            // content is checked by the fold comparison.
            stats.coalesced_snapshots_larger += 1;
        } else if len > original_bytes {
            return Err(self.fail(format!(
                "(b) a coalesced {ty} frame of {len} bytes stands for events {}..={x} of {original_bytes} bytes: {data}",
                prev + 1
            )));
        }
        Ok(())
    }

    /// One drain moment: one write (`full` false) or everything until the queue stays empty.
    pub(crate) async fn drain(
        &mut self,
        full: bool,
        step: usize,
        cut: &mut Choices<'_>,
        truth: &Truth,
        stats: &mut Stats,
    ) -> Result<(), String> {
        let mut idle = 0;
        loop {
            let Some(sub) = &self.sub else { return Ok(()) };
            match sub.queue.try_drain() {
                Some(Drained::Frames(bytes)) => {
                    let events = bytes.windows(2).filter(|w| w == b"\n\n").count();
                    // Writes with a bridge are rare and what cuts are about: cut them often.
                    let bridge = bytes.windows(8).any(|w| w == b"-bridge\n");
                    let pct = match self.cfg.cut_pct {
                        0 => 0,
                        p if bridge => p.max(50),
                        p => p,
                    };
                    if events > 1 && cut.chance(pct) {
                        stats.cuts += 1;
                        let n = 1 + cut.below(events - 1);
                        self.receive(&bytes, Some(n), truth, stats)?;
                        self.disconnect(step, 1, Reconnect::LastId, "cut inside a write");
                        return Ok(());
                    }
                    self.receive(&bytes, None, truth, stats)?;
                    idle = 0;
                    if !full {
                        return Ok(());
                    }
                }
                Some(Drained::Closed(reason)) => {
                    if reason == CloseReason::Overflow {
                        stats.closes_overflow += 1;
                        if self.last_coalesced && self.conn_last.is_some() {
                            stats.closes_overflow_after_coalesced += 1;
                        }
                        if self.conn_prelude && !sub.queue.bridge_pending() {
                            // (d) PROTOCOL §5: a full queue is reset to a bridge; the hub knows
                            // the view of a connection that began with a prelude. (A client
                            // that has not taken its previous bridge is stalled: the hub
                            // disconnects it.)
                            return Err(self.fail(format!(
                                "(d) closed for overflow instead of reset (last write coalesced: {})",
                                self.last_coalesced
                            )));
                        }
                    } else {
                        stats.closes_other += 1;
                    }
                    self.disconnect(step, 1, Reconnect::LastId, reason.as_str());
                    return Ok(());
                }
                None => {
                    if !full || idle >= 3 {
                        return Ok(());
                    }
                    idle += 1;
                    tokio::task::yield_now().await;
                }
            }
        }
    }

    pub(crate) fn start_for(&self, how: Reconnect, truth: &Truth) -> Start {
        match (how, self.last) {
            (Reconnect::LastId, last) if self.bridge_mark => {
                Start::InsideBridge(last.unwrap_or(EventId {
                    epoch: truth.epoch.unwrap_or(Epoch(1)),
                    pos: StreamPos::ZERO,
                }))
            }
            (Reconnect::LastId, Some(id)) => Start::After(id),
            (Reconnect::Bogus, last) => {
                let epoch = truth.epoch.unwrap_or(Epoch(1));
                match last {
                    // Ahead of the log.
                    Some(id) if id.pos.seq % 2 == 0 => Start::After(EventId {
                        epoch,
                        pos: StreamPos::new(0, id.pos.seq + 10_000),
                    }),
                    // Another epoch.
                    _ => Start::After(EventId {
                        epoch: Epoch(epoch.0 ^ 0x5a5a),
                        pos: StreamPos::new(0, 1),
                    }),
                }
            }
            _ => Start::Live,
        }
    }
}
