//! Append notifications of the Redis backend: the append script `PUBLISH`es every batch it adds
//! on `<prefix>:appended`; this module owns that note's format (built in Lua by the append
//! script, parsed here) and the node's subscriber task, which hands parsed notes to the tail.
//!
//! A note is a hint with a proof of continuity, never the truth: Redis Pub/Sub is at-most-once
//! (a note published while the subscriber is disconnected is lost), so the tail applies a note
//! only when it continues its cursor exactly (same epoch, `prev` equal to the cursor) and reads
//! the stream otherwise. See the module docs of [`super`] ("Tail").
//!
//! # Note format
//! One `PUBLISH <prefix>:appended <note>` per appended batch, in the same script as its `XADD`s:
//!
//! ```text
//! <threadId> SP <epoch, 8 hex> SP <prev entry ID> LF
//! then, per entry: <entry ID> SP <AG-UI type> SP <JSON length in bytes> LF <JSON>
//! ```
//!
//! `prev` is the stream's `last-generated-id` before the batch (`0-0` for a stream that did not
//! exist), so the entries of a note are exactly the stream's entries after `prev`, at the time
//! of the append. The JSON is the event as validated by the appending broker.

use super::tail::{PROBE_PREFIX, Probe};
use crate::event::{EventType, ThreadId};
use crate::log::{Epoch, StreamPos};
use crate::metrics::BACKEND_ERRORS;
use bytes::Bytes;
use futures::StreamExt;
use redis::Client;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The channel the append script publishes on with a single Redis: `<prefix>:appended`. On a
/// Redis Cluster each thread has its own shard channel instead (`tail/notes.rs`).
pub(super) fn channel(prefix: &str) -> String {
    format!("{prefix}:appended")
}

/// One parsed append note (format: see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Note {
    /// The thread appended to.
    pub thread: ThreadId,
    /// The log's epoch at the append.
    pub epoch: Epoch,
    /// The stream's `last-generated-id` right before the batch.
    pub prev: StreamPos,
    /// The batch, in log order (never empty): entry ID, AG-UI type, compact JSON (a slice of
    /// the note's payload, not a copy).
    pub entries: Vec<(StreamPos, EventType, Bytes)>,
}

/// What the subscriber task tells the tail's reader, in order.
#[derive(Debug)]
pub(super) enum Notice {
    /// Subscribed: every append from now on is announced, until a [`Notice::Down`]. Appends
    /// made before were not: the reader reads every followed stream once.
    Up,
    /// A batch was appended.
    Note(Note),
    /// The subscription is gone (connection lost, ping unanswered, or the reader fell behind
    /// the notes): appends may go unannounced until the next [`Notice::Up`].
    Down,
}

/// Notes buffered between the subscriber and the reader. A reader this far behind makes the
/// subscriber drop its subscription (and the tail reads the streams instead) rather than queue
/// without bound.
pub(super) const NOTICE_QUEUE: usize = 4096;

/// Parses a note; `None` when it does not follow the format (the tail then ignores it: the
/// periodic read of every followed stream still finds the entries, if any).
pub(super) fn parse_note(payload: Bytes) -> Option<Note> {
    let mut at = 0;
    let header = line(&payload, &mut at)?;
    let mut parts = header.split(|&b| b == b' ');
    let thread = ThreadId::parse(std::str::from_utf8(parts.next()?).ok()?).ok()?;
    let epoch = parse_epoch(parts.next()?)?;
    let prev = parse_pos(parts.next()?)?;
    if parts.next().is_some() {
        return None;
    }
    let mut entries = Vec::new();
    while at < payload.len() {
        let head = line(&payload, &mut at)?;
        let mut parts = head.split(|&b| b == b' ');
        let pos = parse_pos(parts.next()?)?;
        let event_type = EventType::parse(std::str::from_utf8(parts.next()?).ok()?)?;
        let len: usize = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        if parts.next().is_some() || payload.len() - at < len {
            return None;
        }
        // Entry IDs strictly increase within a batch, and after `prev`.
        let before = entries.last().map_or(prev, |(p, _, _)| *p);
        if pos <= before {
            return None;
        }
        entries.push((pos, event_type, payload.slice(at..at + len)));
        at += len;
    }
    (!entries.is_empty()).then_some(Note {
        thread,
        epoch,
        prev,
        entries,
    })
}

/// The bytes from `*at` to the next LF (excluded); moves `*at` past the LF.
fn line<'a>(payload: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let rest = payload.get(*at..)?;
    let end = memchr::memchr(b'\n', rest)?;
    *at += end + 1;
    Some(&rest[..end])
}

fn parse_epoch(s: &[u8]) -> Option<Epoch> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn parse_pos(s: &[u8]) -> Option<StreamPos> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// Settings of [`run_subscriber`].
pub(super) struct SubscriberConfig {
    /// The channel ([`channel`]).
    pub channel: String,
    /// Deadline of connecting, `SUBSCRIBE` and each `PING`.
    pub op_timeout: Duration,
    /// Period of the liveness `PING` on the subscribed connection (a connection that died
    /// silently ends the subscription within `ping_every + op_timeout`).
    pub ping_every: Duration,
}

/// Keeps the node subscribed to the append notes and forwards them to the reader until
/// `shutdown`: connect, `SUBSCRIBE`, [`Notice::Up`] (then `on_up`), one [`Notice::Note`] per
/// well-formed note, [`Notice::Down`] when the subscription ends; reconnects with `backoff`.
/// Probe notes go to `probe`, which may end the subscription (its probes stopped coming
/// back: the subscription is on a server that no longer gets the writes, `tail/probe.rs`).
///
/// Policy when the reader falls behind: once [`NOTICE_QUEUE`] notes wait, the subscription is
/// dropped ([`Notice::Down`]) and taken again after a pause, so memory stays bounded and the
/// reader catches up from the streams, which hold everything.
pub(super) async fn run_subscriber(
    client: Client,
    config: SubscriberConfig,
    tx: mpsc::Sender<Notice>,
    probe: Arc<Probe>,
    shutdown: CancellationToken,
    on_up: impl Fn(),
    backoff: impl Fn(u32) -> Duration,
) {
    let mut failures: u32 = 0;
    loop {
        let subscribed = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            s = tokio::time::timeout(config.op_timeout, subscribe(&client, &config.channel)) => s,
        };
        let (mut sink, mut stream) = match subscribed {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis notification subscribe failed");
                failures = failures.saturating_add(1);
                if pause(&shutdown, backoff(failures)).await {
                    return;
                }
                continue;
            }
            Err(_) => {
                failures = failures.saturating_add(1);
                if pause(&shutdown, backoff(failures)).await {
                    return;
                }
                continue;
            }
        };
        // Probes sent from now on come back on this subscription.
        probe.subscribed(true);
        if !send(&tx, &shutdown, Notice::Up).await {
            return;
        }
        on_up();
        tracing::info!(channel = %config.channel, "redis tail subscribed to append notes");
        let mut ping = tokio::time::interval(config.ping_every);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.tick().await;
        let why = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                msg = stream.next() => {
                    let Some(msg) = msg else { break "connection closed" };
                    if msg.get_payload_bytes().starts_with(PROBE_PREFIX.as_bytes()) {
                        probe.note(msg.get_payload_bytes());
                        continue;
                    }
                    let payload = Bytes::copy_from_slice(msg.get_payload_bytes());
                    let Some(note) = parse_note(payload) else {
                        tracing::debug!("ignoring a malformed append note");
                        continue;
                    };
                    match tx.try_send(Notice::Note(note)) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => break "reader behind the notes",
                        Err(mpsc::error::TrySendError::Closed(_)) => return,
                    }
                }
                _ = probe.resubscribe.notified() => break "probe notes not coming back",
                _ = ping.tick() => {
                    let pong = tokio::time::timeout(config.op_timeout, sink.ping::<redis::Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        break "ping unanswered";
                    }
                }
            }
        };
        // Drop the connection (and its subscription) before telling the reader.
        drop((sink, stream));
        probe.subscribed(false);
        metrics::counter!(BACKEND_ERRORS, "backend" => "redis", "op" => "notify").increment(1);
        tracing::warn!(
            reason = why,
            "redis append notes lost; the tail reads every stream until resubscribed"
        );
        if !send(&tx, &shutdown, Notice::Down).await {
            return;
        }
        failures = failures.saturating_add(1);
        if pause(&shutdown, backoff(failures)).await {
            return;
        }
        // A subscription that lasted resets the backoff.
        failures = 0;
    }
}

async fn subscribe(
    client: &Client,
    channel: &str,
) -> redis::RedisResult<(redis::aio::PubSubSink, redis::aio::PubSubStream)> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(channel).await?;
    Ok(pubsub.split())
}

/// Sends a control notice, waiting for room; `false` when the tail is gone or shutting down.
pub(super) async fn send(
    tx: &mpsc::Sender<Notice>,
    shutdown: &CancellationToken,
    notice: Notice,
) -> bool {
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => false,
        sent = tx.send(notice) => sent.is_ok(),
    }
}

/// Sleeps `d`; `true` when shutdown came first.
pub(super) async fn pause(shutdown: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(entries: &[(&str, &str, &str)]) -> Bytes {
        let mut s = String::from("t-1 0a1b2c3d 5-0\n");
        for (id, ty, json) in entries {
            s.push_str(&format!("{id} {ty} {}\n{json}", json.len()));
        }
        Bytes::from(s)
    }

    #[test]
    fn parses_a_note() {
        let json = "{\"type\":\"CUSTOM\",\"name\":\"a b\\n\",\"value\":1}";
        let parsed = parse_note(note(&[
            ("5-1", "CUSTOM", json),
            ("6-0", "RUN_STARTED", "{}"),
        ]))
        .unwrap();
        assert_eq!(parsed.thread.as_str(), "t-1");
        assert_eq!(parsed.epoch, Epoch(0x0a1b2c3d));
        assert_eq!(parsed.prev, StreamPos::new(5, 0));
        assert_eq!(parsed.entries.len(), 2);
        assert_eq!(parsed.entries[0].0, StreamPos::new(5, 1));
        assert_eq!(parsed.entries[0].1, EventType::Custom);
        assert_eq!(&parsed.entries[0].2[..], json.as_bytes());
        assert_eq!(parsed.entries[1].1, EventType::RunStarted);
        assert_eq!(&parsed.entries[1].2[..], b"{}");
    }

    #[test]
    fn rejects_malformed_notes() {
        for bad in [
            Bytes::from_static(b""),
            Bytes::from_static(b"t-1 0a1b2c3d 5-0\n"),
            Bytes::from_static(b"t 1 0a1b2c3d 5-0\n5-1 CUSTOM 2\n{}"),
            Bytes::from_static(b"t-1 0a1b2c3 5-0\n5-1 CUSTOM 2\n{}"),
            Bytes::from_static(b"t-1 0a1b2c3d 5-0\n5-1 NOPE 2\n{}"),
            Bytes::from_static(b"t-1 0a1b2c3d 5-0\n5-1 CUSTOM 3\n{}"),
            Bytes::from_static(b"t-1 0a1b2c3d 5-0\n5-0 CUSTOM 2\n{}"),
            Bytes::from_static(b"t-1 0a1b2c3d 5-0\n5-2 CUSTOM 2\n{}5-1 CUSTOM 2\n{}"),
            Bytes::from_static(b"t-1 0a1b2c3d 5-0\n5-1 CUSTOM 2 x\n{}"),
        ] {
            assert_eq!(parse_note(bad.clone()), None, "{bad:?}");
        }
    }
}
