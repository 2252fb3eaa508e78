//! Stalled subscribers on raw TCP sockets for (d), (e) and (f): the socket, the bound past
//! which a writer must be stuck, reading `/metrics`, and padding a thread until a stall shows.

use super::*;

// ---------------------------------------------------------------------------------------------
// (d), (e): stalled subscribers on raw TCP sockets

/// Requested `SO_RCVBUF` of a stalled subscriber's socket (Linux doubles it).
pub(crate) const STALL_RCVBUF: u32 = 4 << 10;
/// `TCP_MAXSEG` of a stalled subscriber's socket. On loopback the broker's send buffer is
/// autotuned when the connection is set up, from the MSS (Linux `tcp_sndbuf_expand`: about
/// 3 × 10 × 128 KiB ≈ 3.9 MB with the 64 KiB loopback MSS, whatever the peer's receive buffer);
/// a 536-byte MSS keeps it near 100–200 KB, so that little has to be published before the
/// subscriber is stuck. It only makes the tests cheaper: what they rely on is bounded by
/// [`stall_capacity`], which does not assume it.
pub(crate) const STALL_MSS: i32 = 536;
/// hyper 1.x's HTTP/1 write buffer (`DEFAULT_MAX_BUFFER_SIZE`): it takes another body chunk while
/// it holds fewer than 16 chunks and fewer bytes than this.
pub(crate) const HYPER_WRITE_BUF: usize = 8192 + 4096 * 100;
/// What the kernel may hold beyond the buffer sizes: one send may overshoot the send buffer by a
/// GSO segment (64 KiB), and windows are rounded.
pub(crate) const KERNEL_SLACK: usize = 128 << 10;
/// Most bytes a stalled subscriber reads at a time in a burst (e).
pub(crate) const BURST_STEP: usize = 16 << 10;
/// Longest a condition polled on `/metrics` may take.
pub(crate) const METRIC_WAIT: Duration = Duration::from_secs(20);
/// [`writer_stuck`]: consecutive `/metrics` answers, this far apart, that must show frames
/// pending and no write.
pub(crate) const STUCK_POLLS: usize = 5;
pub(crate) const STUCK_POLL_EVERY: Duration = Duration::from_millis(20);

/// Upper bound of the bytes that can sit between a connection's queue in the broker and a
/// subscriber that stopped reading: the broker's socket send buffer (the broker does not set
/// `SO_SNDBUF`, so autotuning caps it at the maximum of `net.ipv4.tcp_wmem`), the subscriber's
/// receive buffer (`rcvbuf`, as the kernel set it), hyper's write buffer plus the chunk that
/// takes it over the limit (at most `max_chunk`), and [`KERNEL_SLACK`]. Once more bytes than this
/// were pushed (and not merged away) since the subscriber last read, the connection's writer
/// is stuck with frames pending, whatever the kernel actually did.
pub(crate) fn stall_capacity(rcvbuf: usize, max_chunk: usize) -> usize {
    let wmem_max = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).and_then(|v| v.parse().ok()))
        .unwrap_or(16 << 20);
    wmem_max + rcvbuf + HYPER_WRITE_BUF + max_chunk + KERNEL_SLACK
}

unsafe extern "C" {
    /// POSIX `setsockopt(2)`, from the C library std links anyway.
    pub(crate) fn setsockopt(
        fd: i32,
        level: i32,
        name: i32,
        value: *const std::ffi::c_void,
        len: u32,
    ) -> i32;
}

/// Sets `TCP_MAXSEG` (the MSS announced in the SYN) on a socket not yet connected.
pub(crate) fn set_mss(socket: &TcpSocket, mss: i32) {
    const IPPROTO_TCP: i32 = 6;
    const TCP_MAXSEG: i32 = 2;
    // SAFETY: the descriptor is `socket`'s own open socket, and the value points at a live
    // `i32` whose size is passed along.
    let rc = unsafe {
        setsockopt(
            socket.as_raw_fd(),
            IPPROTO_TCP,
            TCP_MAXSEG,
            (&raw const mss).cast(),
            size_of::<i32>() as u32,
        )
    };
    assert_eq!(
        rc,
        0,
        "setsockopt(TCP_MAXSEG): {}",
        std::io::Error::last_os_error()
    );
}

pub(crate) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A subscriber on a raw TCP socket that reads only when told to: small `SO_RCVBUF` and MSS set
/// before connecting, `GET` written by hand, the response (chunked, or delimited by the close)
/// decoded as it is read.
pub(crate) struct StalledSse {
    pub(crate) stream: TcpStream,
    /// Read and not yet decoded.
    pub(crate) raw: Vec<u8>,
    pub(crate) head_done: bool,
    /// The body is chunked (hyper's path); otherwise it runs until the connection closes (the
    /// broker's own HTTP/1 subscribe path).
    pub(crate) chunked: bool,
    /// Bytes left in the current chunk, and whether the CRLF after a chunk is due.
    pub(crate) chunk_left: usize,
    pub(crate) crlf_due: bool,
    /// The decoded body (SSE text).
    pub(crate) body: Vec<u8>,
    /// `body[..scanned]` is complete frames, already looked at.
    pub(crate) scanned: usize,
    /// Every `id:` received, and the newest.
    pub(crate) ids: HashSet<String>,
    pub(crate) newest: Option<(String, u64, u64)>,
    /// Bytes read from the socket.
    pub(crate) read_total: usize,
    /// `SO_RCVBUF` as the kernel set it.
    pub(crate) rcvbuf: usize,
}

impl StalledSse {
    /// Connects, subscribes to `thread` (no `Last-Event-ID`) and reads the response head
    /// (200, chunked), nothing more.
    pub(crate) async fn connect(addr: SocketAddr, thread: &str) -> StalledSse {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .set_recv_buffer_size(STALL_RCVBUF)
            .expect("SO_RCVBUF");
        set_mss(&socket, STALL_MSS);
        let rcvbuf = socket.recv_buffer_size().expect("SO_RCVBUF") as usize;
        let mut stream = socket.connect(addr).await.expect("connect");
        let request = format!(
            "GET /v1/threads/{thread}/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("send the request");
        let mut s = StalledSse {
            stream,
            raw: Vec::new(),
            head_done: false,
            chunked: false,
            chunk_left: 0,
            crlf_due: false,
            body: Vec::new(),
            scanned: 0,
            ids: HashSet::new(),
            newest: None,
            read_total: 0,
            rcvbuf,
        };
        let end = loop {
            if let Some(end) = find(&s.raw, b"\r\n\r\n") {
                break end;
            }
            s.read_once(1024).await;
        };
        let head = String::from_utf8_lossy(&s.raw[..end]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "subscribe: {head}");
        s.chunked = head.contains("\r\ntransfer-encoding: chunked");
        assert!(
            s.chunked || head.contains("\r\nconnection: close"),
            "a chunked or close-delimited response: {head}"
        );
        s.raw.drain(..end + 4);
        s.head_done = true;
        s.decode();
        s
    }

    /// One read of at most `max` bytes (what is there, at least one byte). Panics if the stream
    /// ends or nothing comes for [`agui::FRAME_WAIT`].
    pub(crate) async fn read_once(&mut self, max: usize) -> usize {
        let mut buf = vec![0u8; max];
        let n = tokio::time::timeout(agui::FRAME_WAIT, self.stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("nothing to read for {:?}", agui::FRAME_WAIT))
            .expect("read");
        assert!(
            n > 0,
            "the broker closed the stream; last bytes:\n{}",
            String::from_utf8_lossy(&self.body[self.body.len().saturating_sub(2000)..])
        );
        self.raw.extend_from_slice(&buf[..n]);
        self.read_total += n;
        if self.head_done {
            self.decode();
        }
        n
    }

    /// Reads until a frame with `id: last_id` arrived.
    pub(crate) async fn read_until(&mut self, last_id: &str) {
        while !self.ids.contains(last_id) {
            self.read_once(64 << 10).await;
        }
    }

    /// Reads until a frame with an id at or after `id` arrived (a bridge may stand for it).
    pub(crate) async fn read_through(&mut self, id: &str) {
        let (epoch, ms, seq, _) = sse_client::id_key(id);
        while !self
            .newest
            .as_ref()
            .is_some_and(|(e, m, s)| *e == epoch && (*m, *s) >= (ms, seq))
        {
            self.read_once(64 << 10).await;
        }
    }

    /// What was received: complete frames, byte for byte.
    pub(crate) fn body(&self) -> String {
        String::from_utf8(self.body[..self.scanned].to_vec()).expect("SSE is UTF-8")
    }

    /// Moves what `raw` holds of the body into `body`, then notes complete frames.
    pub(crate) fn decode(&mut self) {
        let mut at = 0;
        if !self.chunked {
            at = self.raw.len();
            self.body.extend_from_slice(&self.raw);
        }
        while self.chunked {
            let left = self.raw.len() - at;
            if self.chunk_left > 0 {
                let n = self.chunk_left.min(left);
                if n == 0 {
                    break;
                }
                self.body.extend_from_slice(&self.raw[at..at + n]);
                at += n;
                self.chunk_left -= n;
                self.crlf_due = self.chunk_left == 0;
            } else if self.crlf_due {
                if left < 2 {
                    break;
                }
                assert_eq!(&self.raw[at..at + 2], b"\r\n", "CRLF after a chunk");
                at += 2;
                self.crlf_due = false;
            } else {
                let Some(eol) = find(&self.raw[at..], b"\r\n") else {
                    break;
                };
                let line = std::str::from_utf8(&self.raw[at..at + eol]).expect("chunk size");
                let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                    .unwrap_or_else(|e| panic!("chunk size {line:?}: {e}"));
                assert!(size > 0, "the broker ended the stream");
                at += eol + 2;
                self.chunk_left = size;
            }
        }
        self.raw.drain(..at);
        while let Some(end) = find(&self.body[self.scanned..], b"\n\n") {
            let frame = &self.body[self.scanned..self.scanned + end];
            assert!(!frame.contains(&b'\r'), "SSE must use LF only");
            for line in frame.split(|b| *b == b'\n') {
                if let Some(id) = line.strip_prefix(b"id: ") {
                    let id = String::from_utf8_lossy(id).into_owned();
                    let (epoch, ms, seq, _) = sse_client::id_key(&id);
                    self.newest = Some((epoch, ms, seq));
                    self.ids.insert(id);
                }
            }
            self.scanned += end + 2;
        }
    }
}

/// One frame of a body that carries data.
pub(crate) struct DataFrame {
    /// Its `id:`, if any (only the last event of a prelude or bridge has an event id; a bridge's
    /// first event has its mark).
    pub(crate) id: Option<String>,
    pub(crate) event: Value,
    /// Bytes on the wire (the frame and its blank line).
    pub(crate) bytes: usize,
}

/// The complete frames of `body` (an unfinished last frame is left out), each parsed by the
/// one strict wire parser (`common::sse`): `(frame, its bytes with the blank line)`.
pub(crate) fn whole_frames(body: &str) -> Vec<(common::sse::Frame, usize)> {
    body.split_inclusive("\n\n")
        .filter(|block| block.ends_with("\n\n"))
        .map(|block| {
            let frame = common::sse::parse_frame(&block[..block.len() - 2])
                .unwrap_or_else(|e| panic!("bad SSE frame {block:?}: {e}"));
            (frame, block.len())
        })
        .collect()
}

pub(crate) fn data_frames(body: &str) -> Vec<DataFrame> {
    whole_frames(body)
        .into_iter()
        .filter_map(|(frame, bytes)| {
            let event = serde_json::from_str(frame.data.as_deref()?).expect("data is JSON");
            Some(DataFrame {
                id: frame.id,
                event,
                bytes,
            })
        })
        .collect()
}

/// The event types of every bridge in a body received live from an empty thread (so without
/// prelude): a bridge is a run of frames without an event id (its first carries the bridge's
/// mark) and the frame with `id:` that ends it,
/// holding a `MESSAGES_SNAPSHOT` (every bridge restates the messages; the published sources
/// have no `MESSAGES_SNAPSHOT`).
pub(crate) fn bridges(body: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut group: Vec<String> = Vec::new();
    for f in data_frames(body) {
        group.push(f.event["type"].as_str().unwrap_or("?").to_string());
        // The bridge's mark on its first event does not end it (PROTOCOL §5).
        if f.id.as_deref().is_some_and(|id| !id.ends_with("-bridge")) {
            if group.iter().any(|t| t == "MESSAGES_SNAPSHOT") {
                out.push(std::mem::take(&mut group));
            }
            group.clear();
        }
    }
    out
}

/// `(events, bytes)` of `frames`.
pub(crate) fn tally(frames: &[DataFrame]) -> (usize, usize) {
    (frames.len(), frames.iter().map(|f| f.bytes).sum())
}

pub(crate) async fn metric(base: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sse_client::metric(base, name, labels).await
}

pub(crate) async fn resets(base: &str) -> f64 {
    metric(base, "agui_resets_total", &[("cause", "overflow")]).await
}

pub(crate) async fn overflow_disconnects(base: &str) -> f64 {
    metric(base, "agui_disconnects_total", &[("cause", "overflow")]).await
}

pub(crate) async fn coalesced(base: &str) -> f64 {
    metric(base, "agui_events_coalesced_total", &[]).await
}

/// Writes to subscribers (one per drain of a connection's queue).
pub(crate) async fn writes(base: &str) -> f64 {
    metric(base, "agui_publish_to_write_seconds_count", &[]).await
}

/// Whether the broker's connection writers are stuck: frames pending in its queues (a reset
/// waiting for its bridge counts as one) and no write, on [`STUCK_POLLS`] consecutive `/metrics`
/// answers. Those answers come from the runtime that would run a writer able to write (and
/// frames pending have woken it), so a writer that shows no progress across them cannot write.
/// Meant for a broker whose only subscriber that has something to write is the stalled one.
pub(crate) async fn writer_stuck(base: &str) -> bool {
    let before = writes(base).await;
    for _ in 0..STUCK_POLLS {
        tokio::time::sleep(STUCK_POLL_EVERY).await;
        let pending = metric(base, "agui_queue_depth_events", &[]).await;
        if pending < 1.0 || writes(base).await != before {
            return false;
        }
    }
    true
}

/// What signals that a stalled subscriber's queue went over its bound.
#[derive(Clone, Copy)]
pub(crate) enum Overfull {
    /// `agui_events_coalesced_total` rose (d).
    Coalesced,
    /// A reset is waiting for the writer, `agui_resets_pending` (e): the bridge is built when
    /// the writer comes back, and until then every push is dropped.
    Reset,
}

/// Publishes `pad(i)` events, one per POST, until `signal` shows and [`writer_stuck`] holds;
/// returns the bytes of padding published. Panics if more than `capacity` bytes (a bound past
/// which the writer must be stuck, see [`stall_capacity`]) did not get there.
pub(crate) async fn pad_until_stuck(
    base: &str,
    p: &mut Publisher,
    pad: impl Fn(usize) -> Value,
    signal: Overfull,
    capacity: usize,
) -> usize {
    let mut seen = coalesced(base).await;
    let mut sent = 0usize;
    for i in 0.. {
        let e = pad(i);
        sent += e.to_string().len();
        publish_own(p, e).await;
        let ready = match signal {
            Overfull::Coalesced => {
                let now = coalesced(base).await;
                let rose = now > seen;
                seen = now;
                rose
            }
            Overfull::Reset => metric(base, "agui_resets_pending", &[]).await >= 1.0,
        };
        if ready && writer_stuck(base).await {
            return sent;
        }
        assert!(
            sent <= capacity,
            "{sent} bytes of padding and the subscriber is still not stuck"
        );
    }
    unreachable!()
}

/// [`pad_until_stuck`] with `RAW` padding of [`RESET_PAD_BYTES`] until the subscriber is reset
/// (e, f). `RAW` frames never merge: past `capacity` the writer is stuck, and the queue
/// overflows within its own bound. Returns the bytes of padding published.
pub(crate) async fn pad_until_reset(base: &str, p: &mut Publisher, capacity: usize) -> usize {
    let filler = "x".repeat(RESET_PAD_BYTES);
    pad_until_stuck(
        base,
        p,
        |_| json!({"type": "RAW", "event": {"padding": filler}}),
        Overfull::Reset,
        capacity + RESET_MAX_BYTES,
    )
    .await
}

/// Publishes a test's own event (padding), which must be accepted.
pub(crate) async fn publish_own(p: &mut Publisher, event: Value) {
    let i = p.accepted.len() + p.skipped.len();
    if p.publish(i, &event).await.is_none() {
        panic!("refused: {:?}", p.skipped_notes());
    }
}
