//! Server-Sent Events: the wire encoding (WHATWG HTML, "Server-sent events", §9.2) and the
//! subscriber's response body, which drains the connection's queue into the socket.
//!
//! Data path position: `queue` → **`sse`** → socket. Encoding is a leaf used once per event
//! per node by the hub; every subscriber then shares the same `Bytes` (SPEC §3).
//!
//! Wire rules (SPEC §3): LF only, never CR; first frame `retry: <ms>`; one AG-UI event per
//! frame as `id: <event id>\n` + one `data: <compact JSON>\n` + blank line; no `event:` field;
//! a comment line as heartbeat when the stream was idle.

use crate::event::EventType;
use crate::event::order::OrderChecker;
use crate::log::{EventId, LogEntry, ResumeId};
use crate::queue::{CloseReason, ConnQueue, Drained, MergeKey};
use bytes::{BufMut, Bytes, BytesMut};
use futures::Stream;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// One encoded event, shared by all subscribers of a node.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The event's id (also written in the frame's `id:` line).
    pub id: EventId,
    /// The event's AG-UI type.
    pub event_type: EventType,
    /// `id: …\ndata: …\n\n`, ready to write.
    pub bytes: Bytes,
    /// Offset of the JSON inside `bytes` (after `data: `).
    data_start: usize,
    /// When this node read the event from the log (start of `agui_publish_to_write_seconds`).
    pub born: Instant,
    /// What coalescing may merge this frame with.
    pub merge: MergeKey,
    /// The thread's order state after this event (open constructs, run, chunk lanes): what a
    /// client that received the stream up to here has. Shared by consecutive frames that do
    /// not change it; `None` for frames encoded without a fold (replay from the log).
    pub view: Option<Arc<OrderChecker>>,
}

impl Frame {
    /// Encodes an event into its frame (the only place an event becomes SSE bytes).
    pub fn new(
        id: EventId,
        event_type: EventType,
        json: &[u8],
        born: Instant,
        merge: MergeKey,
    ) -> Frame {
        let id_text = id.to_string();
        Frame {
            id,
            event_type,
            bytes: encode_event(&id_text, json),
            data_start: 4 + id_text.len() + 7,
            born,
            merge,
            view: None,
        }
    }

    /// Several synthesised events (a prelude or a reset bridge) as one frame: every event is
    /// its own SSE event, and only the last carries `id` (SPEC §5: a client cut off inside
    /// resumes from where it was before). `view` is the order state after the last event.
    /// `events` must not be empty.
    pub fn synthesised(
        id: EventId,
        events: &[Value],
        born: Instant,
        view: Option<Arc<OrderChecker>>,
    ) -> Frame {
        Self::synthesised_from(None, id, events, born, view)
    }

    /// A reset bridge (SPEC §5 "Reset") as one frame: like [`Frame::synthesised`], and when
    /// the bridge has more than one event its first event also carries
    /// [`ResumeId::InsideBridge`]`(after)`, `after` being the last id the connection was
    /// given before the bridge. A client cut off inside the bridge has applied part of it and
    /// must not be resumed exactly from `after`: it comes back with the mark instead and gets
    /// a prelude. `events` must not be empty.
    pub fn bridge(
        after: EventId,
        id: EventId,
        events: &[Value],
        born: Instant,
        view: Option<Arc<OrderChecker>>,
    ) -> Frame {
        let mark = (events.len() > 1).then_some(ResumeId::InsideBridge(after));
        Self::synthesised_from(mark, id, events, born, view)
    }

    fn synthesised_from(
        mark: Option<ResumeId>,
        id: EventId,
        events: &[Value],
        born: Instant,
        view: Option<Arc<OrderChecker>>,
    ) -> Frame {
        let mut buf = BytesMut::new();
        let mut event_type = EventType::Raw;
        let mut data_start = 0;
        for (i, ev) in events.iter().enumerate() {
            // Serialising a `Value` cannot fail (string keys only).
            let json = serde_json::to_vec(ev).unwrap_or_default();
            event_type = ev
                .get("type")
                .and_then(Value::as_str)
                .and_then(EventType::parse)
                .unwrap_or(EventType::Raw);
            let id_text = if i + 1 == events.len() {
                Some(id.to_string())
            } else if i == 0 {
                mark.map(|m| m.to_string())
            } else {
                None
            };
            if let Some(id_text) = id_text {
                buf.put_slice(b"id: ");
                buf.put_slice(id_text.as_bytes());
                buf.put_slice(b"\n");
            }
            data_start = buf.len() + 6;
            buf.put_slice(b"data: ");
            buf.put_slice(&json);
            buf.put_slice(b"\n\n");
        }
        Frame {
            id,
            event_type,
            bytes: buf.freeze(),
            data_start,
            born,
            merge: MergeKey::None,
            view,
        }
    }

    /// Sets the order state after this frame.
    pub fn with_view(mut self, view: Option<Arc<OrderChecker>>) -> Frame {
        self.view = view;
        self
    }

    /// Encodes a log entry that is never merged.
    pub fn encode(entry: &LogEntry, born: Instant) -> Frame {
        Frame::new(
            entry.id,
            entry.event_type,
            &entry.json,
            born,
            MergeKey::None,
        )
    }

    /// The event's JSON, as written after `data: `.
    pub fn json(&self) -> Option<&[u8]> {
        self.bytes
            .get(self.data_start..self.bytes.len().checked_sub(2)?)
    }
}

/// Encodes one event frame: `id: <id>\ndata: <json>\n\n`.
///
/// `json` must be compact one-line JSON (validation guarantees it: serde_json escapes line
/// breaks inside strings), so one `data:` line carries the whole event.
pub fn encode_event(id: &str, json: &[u8]) -> Bytes {
    debug_assert!(!json.contains(&b'\n') && !json.contains(&b'\r'));
    let mut buf = BytesMut::with_capacity(id.len() + json.len() + 13);
    buf.put_slice(b"id: ");
    buf.put_slice(id.as_bytes());
    buf.put_slice(b"\ndata: ");
    buf.put_slice(json);
    buf.put_slice(b"\n\n");
    buf.freeze()
}

/// Encodes a `retry: <ms>` frame (the client's reconnection delay, WHATWG §9.2.6).
pub fn encode_retry(ms: u64) -> Bytes {
    Bytes::from(format!("retry: {ms}\n\n"))
}

/// Encodes a comment frame `: <text>` (ignored by every SSE client). `text` must not contain
/// line breaks; they are replaced by spaces if it does.
pub fn encode_comment(text: &str) -> Bytes {
    let clean: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    Bytes::from(format!(": {clean}\n\n"))
}

/// The heartbeat: an empty comment line and a blank line.
pub const HEARTBEAT: &[u8] = b":\n\n";

/// Settings of one subscriber stream.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    /// Milliseconds written in the first `retry:` frame; the last frame of a stream ended by
    /// the node's drain carries a jittered multiple of it (1× to 5×), so that clients spread
    /// their reconnects.
    pub retry_ms: u64,
    /// Idle time after which a heartbeat comment is written.
    pub heartbeat: Duration,
    /// Longest wait for the socket to accept a byte before the stream is given up (streams
    /// written to the raw socket, [`write_socket`]).
    pub write_timeout: Duration,
    /// When the stream ends by itself: its token's expiry (SPEC §8). The client reconnects
    /// with its `Last-Event-ID` (and a fresh token); the last frame is [`EXPIRED`].
    pub ends_at: Option<tokio::time::Instant>,
}

/// The last frame of a stream whose token expired.
pub const EXPIRED: &[u8] = b": agui-fanout: token expired\n\n";

impl StreamSettings {
    /// The last words of a stream whose queue was closed for `reason`: the jittered `retry:`
    /// of a drain (SPEC §9), or a comment naming the cause.
    fn final_frame(&self, reason: CloseReason) -> Option<Bytes> {
        if reason == CloseReason::Shutdown {
            let jitter = rand::random_range(0..=self.retry_ms.max(1) * 4);
            return Some(encode_retry(self.retry_ms + jitter));
        }
        reason.final_words().map(encode_comment)
    }

    /// The writer's next timer deadline: the heartbeat's `due`, or the stream's end if sooner.
    fn next_wake(&self, due: tokio::time::Instant) -> tokio::time::Instant {
        self.ends_at.map_or(due, |end| end.min(due))
    }
}

/// An object kept alive as long as the stream (the hub's registration guard).
pub type Guard = Box<dyn Send + Sync + 'static>;

/// The first write of a stream: `retry:`, then the `prefix` frames (comments, a prelude).
pub fn first_write(settings: &StreamSettings, prefix: Vec<Bytes>) -> Bytes {
    let mut first = BytesMut::new();
    first.extend_from_slice(&encode_retry(settings.retry_ms));
    for p in prefix {
        first.extend_from_slice(&p);
    }
    first.freeze()
}

/// Builds the response body of a subscriber served through hyper (HTTP/2, and HTTP/1 requests
/// the connection front does not take itself, see `http::conn`): `retry:`, then `prefix`
/// frames, then whatever the queue yields, heartbeats when idle, until the queue closes (the
/// node's drain closes it too) or the client goes away (the stream is dropped: `guard`
/// unregisters it).
pub fn body(
    queue: Arc<ConnQueue>,
    prefix: Vec<Bytes>,
    settings: StreamSettings,
    guard: Guard,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static {
    let heartbeat = Box::pin(tokio::time::sleep_until(
        settings.next_wake(tokio::time::Instant::now() + settings.heartbeat),
    ));
    let state = WriterState {
        pending_first: Some(first_write(&settings, prefix)),
        queue,
        settings,
        heartbeat,
        wrote_at: tokio::time::Instant::now(),
        done: false,
        _guard: guard,
    };
    futures::stream::unfold(state, |mut st| async move {
        let bytes = std::future::poll_fn(|cx| st.poll_write(cx)).await?;
        Some((Ok(bytes), st))
    })
}

/// What wakes a stream's writer.
enum Wake {
    /// Frames to write.
    Frames(Bytes),
    /// The queue closed; the stream ends after these last words.
    Closed(Option<Bytes>),
    /// The heartbeat timer fired.
    Heartbeat,
}

/// A stream's writer state, shared by both ways of writing (hyper body, raw socket).
///
/// The heartbeat timer is created once and only re-armed when it fires (to the last write
/// plus the heartbeat period), so a write costs no timer operation.
struct WriterState {
    queue: Arc<ConnQueue>,
    settings: StreamSettings,
    pending_first: Option<Bytes>,
    heartbeat: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// When the last bytes were handed out.
    wrote_at: tokio::time::Instant,
    done: bool,
    _guard: Guard,
}

impl WriterState {
    /// Polls for what to do next: frames, the end, or a heartbeat tick.
    fn poll_wake(&mut self, cx: &mut Context<'_>) -> Poll<Wake> {
        // Checked before the queue, so that a stream that is never idle ends on time too (the
        // timer below wakes an idle one).
        if self
            .settings
            .ends_at
            .is_some_and(|end| tokio::time::Instant::now() >= end)
        {
            metrics::counter!(crate::metrics::DISCONNECTS, "cause" => "token_expired").increment(1);
            return Poll::Ready(Wake::Closed(Some(Bytes::from_static(EXPIRED))));
        }
        match self.queue.poll_batch(cx) {
            Poll::Ready(Drained::Frames(bytes)) => return Poll::Ready(Wake::Frames(bytes)),
            Poll::Ready(Drained::Closed(reason)) => {
                return Poll::Ready(Wake::Closed(self.settings.final_frame(reason)));
            }
            Poll::Pending => {}
        }
        if self.heartbeat.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Wake::Heartbeat);
        }
        Poll::Pending
    }

    /// Handles a heartbeat tick: the heartbeat bytes when the stream was idle for the whole
    /// period, and the timer re-armed either way.
    fn on_heartbeat(&mut self) -> Option<Bytes> {
        let now = tokio::time::Instant::now();
        let due = self.wrote_at + self.settings.heartbeat;
        if now >= due {
            self.wrote_at = now;
            let next = self.settings.next_wake(now + self.settings.heartbeat);
            self.heartbeat.as_mut().reset(next);
            Some(Bytes::from_static(HEARTBEAT))
        } else {
            let next = self.settings.next_wake(due);
            self.heartbeat.as_mut().reset(next);
            None
        }
    }

    /// The next chunk of the hyper body, `None` when the stream must end.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(first) = self.pending_first.take() {
            return Poll::Ready(Some(first));
        }
        loop {
            match std::task::ready!(self.poll_wake(cx)) {
                Wake::Frames(bytes) => {
                    self.wrote_at = tokio::time::Instant::now();
                    return Poll::Ready(Some(bytes));
                }
                Wake::Closed(last) => {
                    self.done = true;
                    return Poll::Ready(last);
                }
                Wake::Heartbeat => {
                    if let Some(bytes) = self.on_heartbeat() {
                        return Poll::Ready(Some(bytes));
                    }
                }
            }
        }
    }
}

/// Writes a subscriber's stream straight to its socket (HTTP/1 requests taken by the
/// connection front, `http::conn`): `head` (the response head), `retry:` and `prefix` in one
/// write, then every batch the queue yields as one write, heartbeats when idle, until the
/// queue closes or the client goes away. Returns when the stream has ended; the socket is
/// closed when `io` is dropped (the response is delimited by the close, RFC 9112 §6.3).
///
/// While waiting it also watches the socket for reads, so a client that closes its end is
/// noticed at once rather than at the next write. Anything it sends is read and ignored, up to
/// 64 KiB; more closes the connection.
pub async fn write_socket(
    io: TcpStream,
    head: Bytes,
    queue: Arc<ConnQueue>,
    prefix: Vec<Bytes>,
    settings: StreamSettings,
    guard: Guard,
) {
    let io = Arc::new(io);
    let patience = settings.write_timeout;
    let mut first = BytesMut::from(&head[..]);
    first.extend_from_slice(&first_write(&settings, prefix));
    if write_all(&io, &first, patience).await.is_err() {
        return;
    }
    drop(first);
    // From here on the hub may write frames itself while this writer is idle.
    queue.attach_socket(io.clone());
    let _detach = Detach(queue.clone());
    let heartbeat = Box::pin(tokio::time::sleep_until(
        settings.next_wake(tokio::time::Instant::now() + settings.heartbeat),
    ));
    let mut st = WriterState {
        queue,
        settings,
        pending_first: None,
        heartbeat,
        wrote_at: tokio::time::Instant::now(),
        done: false,
        _guard: guard,
    };
    // Bytes the client sent after its request (read and dropped).
    let mut ignored = 0usize;
    /// What woke the socket writer.
    enum SocketWake {
        Stream(Wake),
        Readable,
    }
    loop {
        let wake = std::future::poll_fn(|cx| {
            if let Poll::Ready(w) = st.poll_wake(cx) {
                return Poll::Ready(SocketWake::Stream(w));
            }
            if io.poll_read_ready(cx).is_ready() {
                return Poll::Ready(SocketWake::Readable);
            }
            Poll::Pending
        })
        .await;
        let bytes = match wake {
            SocketWake::Stream(Wake::Frames(bytes)) => bytes,
            SocketWake::Stream(Wake::Closed(last)) => {
                if let Some(last) = last {
                    let _ = write_all(&io, &last, patience).await;
                }
                return;
            }
            SocketWake::Stream(Wake::Heartbeat) => match st.on_heartbeat() {
                // A frame the hub wrote partly goes first: skip this heartbeat.
                Some(bytes) if st.queue.begin_own_write() => bytes,
                _ => continue,
            },
            SocketWake::Readable => {
                let mut scratch = [0u8; 256];
                match io.try_read(&mut scratch) {
                    // The client closed its end, or the connection failed.
                    Ok(0) => return,
                    Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return,
                    // Bytes after the request: ignored, up to a bound (an event stream's client
                    // has nothing to say; the response is `connection: close`, so not even a
                    // pipelined request is answered). Past it the client is not an SSE client.
                    Ok(n) => {
                        ignored += n;
                        if ignored > MAX_IGNORED_BYTES {
                            tracing::debug!(ignored, "subscriber keeps sending; closing");
                            return;
                        }
                        continue;
                    }
                    // A spurious readiness.
                    Err(_) => continue,
                }
            }
        };
        if let Err(e) = write_all(&io, &bytes, patience).await {
            if e.kind() == std::io::ErrorKind::TimedOut {
                tracing::debug!("subscriber accepted nothing for the write timeout; disconnecting");
                metrics::counter!(crate::metrics::DISCONNECTS, "cause" => "write_timeout")
                    .increment(1);
            }
            return;
        }
        st.queue.writer_done();
        st.wrote_at = tokio::time::Instant::now();
    }
}

/// Bytes in the socket's send queue not yet acknowledged by the peer (`SIOCOUTQ`, Linux);
/// `None` elsewhere or on error.
fn unsent_bytes(io: &TcpStream) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mut n: libc::c_int = 0;
        // SAFETY: the fd is open while `io` is borrowed, and `TIOCOUTQ` (= `SIOCOUTQ` for a
        // TCP socket) writes one `int` to the pointer given.
        let rc = unsafe { libc::ioctl(io.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
        (rc == 0).then(|| u64::try_from(n).ok()).flatten()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = io;
        None
    }
}

/// Most bytes a subscriber may send after its request before its connection is closed.
const MAX_IGNORED_BYTES: usize = 64 << 10;

/// Detaches the socket from the queue when the writer ends, so that the connection closes
/// with the writer's handle (the queue may outlive it briefly).
struct Detach(Arc<ConnQueue>);

impl Drop for Detach {
    fn drop(&mut self) {
        self.0.detach_socket();
    }
}

/// Writes all of `buf` to a socket shared with the hub (which writes only while this writer
/// is idle, see `ConnQueue::attach_socket`).
///
/// # Errors
/// The socket's error; `TimedOut` when the socket accepted no byte for `patience`.
async fn write_all(io: &TcpStream, mut buf: &[u8], patience: Duration) -> std::io::Result<()> {
    while !buf.is_empty() {
        match io.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut unsent = unsent_bytes(io);
                loop {
                    match tokio::time::timeout(patience, io.writable()).await {
                        Ok(ready) => break ready?,
                        // No room reported for `patience`. Linux reports a socket writable only
                        // once a third of its buffer is free, so a client that reads, slowly,
                        // may never get there within `patience`: give up only when the kernel
                        // sent nothing of what it holds meanwhile.
                        Err(_) => match (unsent, unsent_bytes(io)) {
                            (Some(before), Some(now)) if now < before => unsent = Some(now),
                            _ => return Err(std::io::ErrorKind::TimedOut.into()),
                        },
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Epoch, StreamPos};

    #[test]
    fn synthesised_frame_puts_the_id_on_the_last_event_only() {
        let id = EventId {
            epoch: Epoch(1),
            pos: StreamPos::new(0, 9),
        };
        let f = Frame::synthesised(
            id,
            &[
                serde_json::json!({"type":"RUN_STARTED","threadId":"t","runId":"r"}),
                serde_json::json!({"type":"STATE_SNAPSHOT","snapshot":{}}),
            ],
            Instant::now(),
            None,
        );
        assert_eq!(
            &f.bytes[..],
            &b"data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}\n\nid: 00000001-0-9\ndata: {\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{}}\n\n"[..]
        );
        assert_eq!(
            f.json(),
            Some(&br#"{"type":"STATE_SNAPSHOT","snapshot":{}}"#[..])
        );
        assert_eq!(f.event_type, EventType::StateSnapshot);
    }

    #[test]
    fn bridge_frame_marks_its_first_event_and_ids_its_last() {
        let at = |seq| EventId {
            epoch: Epoch(1),
            pos: StreamPos::new(0, seq),
        };
        let events = [
            serde_json::json!({"type":"RUN_FINISHED","threadId":"t","runId":"r"}),
            serde_json::json!({"type":"RUN_STARTED","threadId":"t","runId":"s"}),
            serde_json::json!({"type":"STATE_SNAPSHOT","snapshot":{}}),
        ];
        let f = Frame::bridge(at(4), at(9), &events, Instant::now(), None);
        let text = std::str::from_utf8(&f.bytes).unwrap();
        let ids: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .collect();
        assert_eq!(ids, ["00000001-0-4-bridge", "00000001-0-9"], "{text}");
        assert!(text.starts_with("id: 00000001-0-4-bridge\ndata: {\"type\":\"RUN_FINISHED\""));
        assert_eq!(
            ids[0].parse::<ResumeId>(),
            Ok(ResumeId::InsideBridge(at(4)))
        );
        // A bridge of one event is whole or not received at all: its id alone.
        let one = Frame::bridge(at(4), at(9), &events[2..], Instant::now(), None);
        assert_eq!(
            &one.bytes[..],
            &b"id: 00000001-0-9\ndata: {\"type\":\"STATE_SNAPSHOT\",\"snapshot\":{}}\n\n"[..]
        );
    }

    #[test]
    fn event_frame_is_byte_exact() {
        let id = EventId {
            epoch: Epoch(0xdeadbeef),
            pos: StreamPos::new(5, 1),
        };
        let f = encode_event(&id.to_string(), br#"{"type":"RAW","event":{}}"#);
        assert_eq!(
            &f[..],
            b"id: deadbeef-5-1\ndata: {\"type\":\"RAW\",\"event\":{}}\n\n"
        );
        assert_eq!(&encode_retry(2000)[..], b"retry: 2000\n\n");
        assert_eq!(&encode_comment("a\r\nb")[..], b": a  b\n\n");
        assert!(!f.contains(&b'\r'));
        let frame = Frame::new(
            id,
            EventType::Raw,
            br#"{"type":"RAW","event":{}}"#,
            Instant::now(),
            MergeKey::None,
        );
        assert_eq!(frame.json(), Some(&br#"{"type":"RAW","event":{}}"#[..]));
    }
}
