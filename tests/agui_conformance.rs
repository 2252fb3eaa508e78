//! What the broker sends, judged by the real `@ag-ui/client` 1.0.0 (PROTOCOL §4.5): every recorded
//! stream and every conformance stream whose `expect.outcome` is `completed` (spec 1.0 and 1.1)
//! is published, one event per POST, to a fresh thread of an in-process broker; what a client
//! received is kept byte for byte and played through the client's whole pipeline
//! (`tests/node/agui-fold.mjs`), then compared with the fold of the full log (`?from=start`),
//! itself checked against the fixture's `expect` block. Events the broker refuses at publish
//! (4xx) are skipped and printed.
//!
//! Scenarios (each a function from a source to [`Comparison`]s, so later ones can reuse them):
//! - (a) [`scenario_live`]: a subscriber connected before publishing reads the whole run; memory
//!   backend (recorded + conformance streams) and redis backend (recorded streams);
//! - (b) [`scenario_join_mid_run`]: subscribers that connect, without `Last-Event-ID`, after
//!   k = 1, 11, 21, … events were published: each starts with a prelude;
//! - (c) [`scenario_resume_after_trim`]: a subscriber resumes with an id that retention trimmed
//!   meanwhile: it gets a prelude (the client's messages and state carry over);
//! - (d) [`scenario_slow`]: a raw TCP subscriber that does not read while a recorded run is
//!   published is coalesced (PROTOCOL §5), and still folds like the log;
//! - (e) [`scenario_resets`]: a raw TCP subscriber that reads in bursts is reset several times,
//!   across run boundaries, and its one connection still passes and folds like the log;
//! - (f) `a_subscriber_cut_inside_a_bridge_resumes_and_folds_like_the_log`: a client cut off at
//!   every event boundary inside a reset bridge comes back with its last id and still passes.
//!
//! (d) and (e) run against a broker child process ([`BrokerProcess`]), so that its `/metrics`
//! counts this subscriber alone; see [`StalledSse`] for how the stall is made certain.
//!
//! Needs `node` and `npm ci --prefix tests/node` (scripts/test.sh does it) and, for the redis
//! pass, the test Redis.

mod common;

use common::agui_client::{self as agui, Case, Comparison, Publisher, Source};
use common::broker::{self, BrokerProcess};
use common::sse_client;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

/// (b): a subscriber joins after k events for k = 1, 1 + JOIN_EVERY, 1 + 2 × JOIN_EVERY, …
const JOIN_EVERY: usize = 10;
/// (c): `retention.max_events` of the trimming broker.
const TRIM_TO: usize = 4;

/// Every source of the memory passes: recorded streams, then the conformance streams.
fn all_sources() -> Vec<Source> {
    let mut sources = agui::recorded_sources();
    sources.extend(agui::conformance_sources("spec-1.0"));
    sources.extend(agui::conformance_sources("spec-1.1"));
    sources
}

/// Notes the events of `label` the broker refused.
fn note_skipped(notes: &mut Vec<String>, label: &str, p: &Publisher) {
    for s in p.skipped_notes() {
        notes.push(format!("{label}: skipped at publish: {s}"));
    }
}

/// The full log of `thread` as one body, named after `label`.
async fn log_case(base: &str, thread: &str, last_id: &str, label: &str) -> Case {
    Case {
        name: format!("{label}/log"),
        thread_id: thread.to_string(),
        bodies: vec![agui::read_log(base, thread, last_id).await],
    }
}

/// A fixture's `expect` block, when the whole source was published (a refused event changes
/// what the block describes).
fn expect_if_complete(source: &Source, p: &Publisher) -> Option<serde_json::Value> {
    p.skipped
        .is_empty()
        .then(|| source.expect.clone())
        .flatten()
}

/// (a) A subscriber connected before the first event reads the whole run; it must pass and fold
/// like the full log.
async fn scenario_live(
    base: &str,
    backend: &str,
    source: &Source,
    notes: &mut Vec<String>,
) -> Vec<Comparison> {
    let label = format!("{backend}/live/{}", source.name);
    let thread = broker::thread_id("conf-live");
    let events = source.retargeted(&thread);
    let (until, rx) = watch::channel(None);
    let reader = agui::subscribe_reader(base, &thread, None, rx).await;
    let mut p = Publisher::new(base, &thread);
    p.publish_all(&events).await;
    note_skipped(notes, &label, &p);
    let Some(last) = p.last_id().map(str::to_string) else {
        notes.push(format!("{label}: no event accepted, nothing to compare"));
        reader.abort();
        return Vec::new();
    };
    until.send_replace(Some(last.clone()));
    let body = reader.await.expect("live reader");
    vec![Comparison {
        subject: agui::client_case(&format!("{label}/sub"), &thread, &[body]),
        reference: log_case(base, &thread, &last, &label).await,
        expect: expect_if_complete(source, &p),
        label,
    }]
}

/// (b) Subscribers that connect without `Last-Event-ID` after k = 1, 11, 21, … events were
/// published, each read to the last event: joining mid-run must pass and fold like the full
/// log (PROTOCOL §4.4: the connection begins with a prelude at the head).
async fn scenario_join_mid_run(
    base: &str,
    backend: &str,
    source: &Source,
    notes: &mut Vec<String>,
) -> Vec<Comparison> {
    let label = format!("{backend}/join/{}", source.name);
    let thread = broker::thread_id("conf-join");
    let events = source.retargeted(&thread);
    let (until, rx) = watch::channel(None);
    let mut readers = Vec::new();
    let mut p = Publisher::new(base, &thread);
    for (i, e) in events.iter().enumerate() {
        if i % JOIN_EVERY == 1 {
            readers.push((
                i,
                agui::subscribe_reader(base, &thread, None, rx.clone()).await,
            ));
        }
        p.publish(i, e).await;
    }
    note_skipped(notes, &label, &p);
    let Some(last) = p.last_id().map(str::to_string) else {
        notes.push(format!("{label}: no event accepted, nothing to compare"));
        readers.iter().for_each(|(_, r)| r.abort());
        return Vec::new();
    };
    until.send_replace(Some(last.clone()));
    let reference = log_case(base, &thread, &last, &label).await;
    let mut out = Vec::new();
    for (k, reader) in readers {
        let body = reader.await.expect("join reader");
        let label = format!("{label}/k={k}");
        out.push(Comparison {
            subject: agui::client_case(&format!("{label}/sub"), &thread, &[body]),
            reference: reference.clone(),
            expect: None,
            label,
        });
    }
    out
}

/// (c) A subscriber connected before the first event reads through event `cut`, disconnects,
/// misses `2 × TRIM_TO` events (so its id is trimmed on the broker at `trimmed`, whose
/// `retention.max_events` is [`TRIM_TO`]), resumes with that id and reads the rest. Its two
/// connections must pass as PROTOCOL §4.5 says and fold like the full log, read from the same
/// events published on the untrimmed broker at `full`. `None` when the source is too short.
async fn scenario_resume_after_trim(
    trimmed: &str,
    full: &str,
    source: &Source,
    cut: usize,
    notes: &mut Vec<String>,
) -> Option<Comparison> {
    let missed = 2 * TRIM_TO;
    if source.events.len() < cut + missed + 2 {
        return None;
    }
    let label = format!("memory/trimmed-resume/{}/cut={cut}", source.name);
    let thread = broker::thread_id("conf-trim");
    let events = source.retargeted(&thread);

    let mut reference = Publisher::new(full, &thread);
    reference.publish_all(&events).await;
    let last = reference.last_id()?.to_string();
    let reference = log_case(full, &thread, &last, &label).await;

    let mut p = Publisher::new(trimmed, &thread);
    let (until, rx) = watch::channel(None);
    let first = agui::subscribe_reader(trimmed, &thread, None, rx).await;
    for (i, e) in events.iter().enumerate().take(cut + 1) {
        p.publish(i, e).await;
    }
    let Some(cut_id) = p.last_id().map(str::to_string) else {
        notes.push(format!("{label}: nothing accepted before the cut"));
        first.abort();
        return None;
    };
    until.send_replace(Some(cut_id.clone()));
    let body1 = first.await.expect("first connection");
    for (i, e) in events.iter().enumerate().skip(cut + 1).take(missed) {
        p.publish(i, e).await;
    }
    let (until, rx) = watch::channel(None);
    let second = agui::subscribe_reader(trimmed, &thread, Some(&cut_id), rx).await;
    for (i, e) in events.iter().enumerate().skip(cut + 1 + missed) {
        p.publish(i, e).await;
    }
    note_skipped(notes, &label, &p);
    until.send_replace(p.last_id().map(str::to_string));
    let body2 = second.await.expect("second connection");
    Some(Comparison {
        subject: agui::client_case(&format!("{label}/sub"), &thread, &[body1, body2]),
        reference,
        expect: None,
        label,
    })
}

/// Prints `notes`, judges `comparisons` with the client and fails with every failed check.
fn report(test: &str, comparisons: &[Comparison], notes: &[String]) {
    for n in notes {
        println!("{test}: note: {n}");
    }
    let failures = agui::judge(comparisons);
    println!(
        "{test}: {} comparisons, {} failed checks",
        comparisons.len(),
        failures.len()
    );
    let failed_comparisons = comparisons
        .iter()
        .filter(|c| {
            failures
                .iter()
                .any(|f| f.starts_with(&format!("{}:", c.label)))
        })
        .count();
    assert!(
        failures.is_empty(),
        "{test}: {failed_comparisons} of {} comparisons failed ({} checks):\n{}",
        comparisons.len(),
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_live_subscriber_folds_like_the_log() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let mut comparisons = Vec::new();
    let mut notes = Vec::new();
    for source in all_sources() {
        comparisons.extend(scenario_live(&base, "memory", &source, &mut notes).await);
    }
    server.stop().await;
    report(
        "memory_live_subscriber_folds_like_the_log",
        &comparisons,
        &notes,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_live_subscriber_folds_like_the_log() {
    let server = broker::start_redis().await;
    let base = broker::base(server.addr);
    let mut comparisons = Vec::new();
    let mut notes = Vec::new();
    for source in agui::recorded_sources() {
        comparisons.extend(scenario_live(&base, "redis", &source, &mut notes).await);
    }
    server.stop().await;
    report(
        "redis_live_subscriber_folds_like_the_log",
        &comparisons,
        &notes,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_join_mid_run_folds_like_the_log() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let mut comparisons = Vec::new();
    let mut notes = Vec::new();
    for source in all_sources() {
        comparisons.extend(scenario_join_mid_run(&base, "memory", &source, &mut notes).await);
    }
    server.stop().await;
    report(
        "memory_join_mid_run_folds_like_the_log",
        &comparisons,
        &notes,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_resume_after_trim_folds_like_the_log() {
    let trimmed = broker::start(|c| c.retention.max_events = TRIM_TO).await;
    let full = broker::start_memory().await;
    let (trimmed_base, full_base) = (broker::base(trimmed.addr), broker::base(full.addr));
    let mut comparisons = Vec::new();
    let mut notes = Vec::new();
    for source in all_sources() {
        let n = source.events.len();
        let mut cuts = vec![2, n / 2];
        cuts.dedup();
        for cut in cuts {
            comparisons.extend(
                scenario_resume_after_trim(&trimmed_base, &full_base, &source, cut, &mut notes)
                    .await,
            );
        }
    }
    trimmed.stop().await;
    full.stop().await;
    report(
        "memory_resume_after_trim_folds_like_the_log",
        &comparisons,
        &notes,
    );
}

// ---------------------------------------------------------------------------------------------
// (d), (e): stalled subscribers on raw TCP sockets

/// Requested `SO_RCVBUF` of a stalled subscriber's socket (Linux doubles it).
const STALL_RCVBUF: u32 = 4 << 10;
/// `TCP_MAXSEG` of a stalled subscriber's socket. On loopback the broker's send buffer is
/// autotuned when the connection is set up, from the MSS (Linux `tcp_sndbuf_expand`: about
/// 3 × 10 × 128 KiB ≈ 3.9 MB with the 64 KiB loopback MSS, whatever the peer's receive buffer);
/// a 536-byte MSS keeps it near 100–200 KB, so that little has to be published before the
/// subscriber is stuck. It only makes the tests cheaper: what they rely on is bounded by
/// [`stall_capacity`], which does not assume it.
const STALL_MSS: i32 = 536;
/// hyper 1.x's HTTP/1 write buffer (`DEFAULT_MAX_BUFFER_SIZE`): it takes another body chunk while
/// it holds fewer than 16 chunks and fewer bytes than this.
const HYPER_WRITE_BUF: usize = 8192 + 4096 * 100;
/// What the kernel may hold beyond the buffer sizes: one send may overshoot the send buffer by a
/// GSO segment (64 KiB), and windows are rounded.
const KERNEL_SLACK: usize = 128 << 10;
/// Most bytes a stalled subscriber reads at a time in a burst (e).
const BURST_STEP: usize = 16 << 10;
/// Longest a condition polled on `/metrics` may take.
const METRIC_WAIT: Duration = Duration::from_secs(20);
/// [`writer_stuck`]: consecutive `/metrics` answers, this far apart, that must show frames
/// pending and no write.
const STUCK_POLLS: usize = 5;
const STUCK_POLL_EVERY: Duration = Duration::from_millis(20);

/// Upper bound of the bytes that can sit between a connection's queue in the broker and a
/// subscriber that stopped reading: the broker's socket send buffer (the broker does not set
/// `SO_SNDBUF`, so autotuning caps it at the maximum of `net.ipv4.tcp_wmem`), the subscriber's
/// receive buffer (`rcvbuf`, as the kernel set it), hyper's write buffer plus the chunk that
/// takes it over the limit (at most `max_chunk`), and [`KERNEL_SLACK`]. Once more bytes than this
/// were pushed (and not merged away) since the subscriber last read, the connection's writer
/// is stuck with frames pending, whatever the kernel actually did.
fn stall_capacity(rcvbuf: usize, max_chunk: usize) -> usize {
    let wmem_max = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).and_then(|v| v.parse().ok()))
        .unwrap_or(16 << 20);
    wmem_max + rcvbuf + HYPER_WRITE_BUF + max_chunk + KERNEL_SLACK
}

unsafe extern "C" {
    /// POSIX `setsockopt(2)`, from the C library std links anyway.
    fn setsockopt(fd: i32, level: i32, name: i32, value: *const std::ffi::c_void, len: u32) -> i32;
}

/// Sets `TCP_MAXSEG` (the MSS announced in the SYN) on a socket not yet connected.
fn set_mss(socket: &TcpSocket, mss: i32) {
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

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A subscriber on a raw TCP socket that reads only when told to: small `SO_RCVBUF` and MSS set
/// before connecting, `GET` written by hand, the response (chunked, or delimited by the close)
/// decoded as it is read.
struct StalledSse {
    stream: TcpStream,
    /// Read and not yet decoded.
    raw: Vec<u8>,
    head_done: bool,
    /// The body is chunked (hyper's path); otherwise it runs until the connection closes (the
    /// broker's own HTTP/1 subscribe path).
    chunked: bool,
    /// Bytes left in the current chunk, and whether the CRLF after a chunk is due.
    chunk_left: usize,
    crlf_due: bool,
    /// The decoded body (SSE text).
    body: Vec<u8>,
    /// `body[..scanned]` is complete frames, already looked at.
    scanned: usize,
    /// Every `id:` received, and the newest.
    ids: HashSet<String>,
    newest: Option<(String, u64, u64)>,
    /// Bytes read from the socket.
    read_total: usize,
    /// `SO_RCVBUF` as the kernel set it.
    rcvbuf: usize,
}

impl StalledSse {
    /// Connects, subscribes to `thread` (no `Last-Event-ID`) and reads the response head
    /// (200, chunked), nothing more.
    async fn connect(addr: SocketAddr, thread: &str) -> StalledSse {
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
    async fn read_once(&mut self, max: usize) -> usize {
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
    async fn read_until(&mut self, last_id: &str) {
        while !self.ids.contains(last_id) {
            self.read_once(64 << 10).await;
        }
    }

    /// Reads until a frame with an id at or after `id` arrived (a bridge may stand for it).
    async fn read_through(&mut self, id: &str) {
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
    fn body(&self) -> String {
        String::from_utf8(self.body[..self.scanned].to_vec()).expect("SSE is UTF-8")
    }

    /// Moves what `raw` holds of the body into `body`, then notes complete frames.
    fn decode(&mut self) {
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
struct DataFrame {
    /// Its `id:`, if any (only the last event of a prelude or bridge has an event id; a bridge's
    /// first event has its mark).
    id: Option<String>,
    event: Value,
    /// Bytes on the wire (the frame and its blank line).
    bytes: usize,
}

/// The complete frames of `body` (an unfinished last frame is left out), each parsed by the
/// one strict wire parser (`common::sse`): `(frame, its bytes with the blank line)`.
fn whole_frames(body: &str) -> Vec<(common::sse::Frame, usize)> {
    body.split_inclusive("\n\n")
        .filter(|block| block.ends_with("\n\n"))
        .map(|block| {
            let frame = common::sse::parse_frame(&block[..block.len() - 2])
                .unwrap_or_else(|e| panic!("bad SSE frame {block:?}: {e}"));
            (frame, block.len())
        })
        .collect()
}

fn data_frames(body: &str) -> Vec<DataFrame> {
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
fn bridges(body: &str) -> Vec<Vec<String>> {
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
fn tally(frames: &[DataFrame]) -> (usize, usize) {
    (frames.len(), frames.iter().map(|f| f.bytes).sum())
}

async fn metric(base: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sse_client::metric(base, name, labels).await
}

async fn resets(base: &str) -> f64 {
    metric(base, "agui_resets_total", &[("cause", "overflow")]).await
}

async fn overflow_disconnects(base: &str) -> f64 {
    metric(base, "agui_disconnects_total", &[("cause", "overflow")]).await
}

async fn coalesced(base: &str) -> f64 {
    metric(base, "agui_events_coalesced_total", &[]).await
}

/// Writes to subscribers (one per drain of a connection's queue).
async fn writes(base: &str) -> f64 {
    metric(base, "agui_publish_to_write_seconds_count", &[]).await
}

/// Whether the broker's connection writers are stuck: frames pending in its queues (a reset
/// waiting for its bridge counts as one) and no write, on [`STUCK_POLLS`] consecutive `/metrics`
/// answers. Those answers come from the runtime that would run a writer able to write (and
/// frames pending have woken it), so a writer that shows no progress across them cannot write.
/// Meant for a broker whose only subscriber that has something to write is the stalled one.
async fn writer_stuck(base: &str) -> bool {
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
enum Overfull {
    /// `agui_events_coalesced_total` rose (d).
    Coalesced,
    /// A reset is waiting for the writer, `agui_resets_pending` (e): the bridge is built when
    /// the writer comes back, and until then every push is dropped.
    Reset,
}

/// Publishes `pad(i)` events, one per POST, until `signal` shows and [`writer_stuck`] holds;
/// returns the bytes of padding published. Panics if more than `capacity` bytes (a bound past
/// which the writer must be stuck, see [`stall_capacity`]) did not get there.
async fn pad_until_stuck(
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
async fn pad_until_reset(base: &str, p: &mut Publisher, capacity: usize) -> usize {
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
async fn publish_own(p: &mut Publisher, event: Value) {
    let i = p.accepted.len() + p.skipped.len();
    if p.publish(i, &event).await.is_none() {
        panic!("refused: {:?}", p.skipped_notes());
    }
}

// ---------------------------------------------------------------------------------------------
// (d)

/// (d): `queue.max_events` and `queue.max_bytes` of the slow-subscriber broker.
const SLOW_MAX_EVENTS: usize = 64;
const SLOW_MAX_BYTES: usize = 64 << 10;
/// (d): bytes of `rawEvent` padding in each event of the padding run.
const SLOW_PAD_BYTES: usize = 8 << 10;
/// Run and message of the padding run that fills a slow subscriber's connection first (d).
const PAD_RUN: &str = "agui-fanout-test-padding";
const PAD_MESSAGE: &str = "agui-fanout-test-padding-m";

/// What a slow subscriber and a fast one received of one recorded run (d).
struct SlowRow {
    name: String,
    log_events: usize,
    fast: (usize, usize),
    slow: (usize, usize),
    coalesced: f64,
    padding: usize,
}

/// The frames after the padding run's `RUN_FINISHED`: the recorded run as received.
fn run_part(body: &str) -> Vec<DataFrame> {
    let frames = data_frames(body);
    let end = frames
        .iter()
        .position(|f| f.event["type"] == "RUN_FINISHED" && f.event["runId"] == PAD_RUN)
        .expect("the padding run's RUN_FINISHED");
    frames.into_iter().skip(end + 1).collect()
}

/// (d) A raw TCP subscriber connects to a fresh thread and stops reading. A padding run (one
/// assistant message whose `TEXT_MESSAGE_CONTENT`s carry 8 KiB of `rawEvent`: mergeable) is
/// published, one event per POST, until the subscriber is stuck ([`pad_until_stuck`]: its queue
/// went over its bound and was coalesced, and its writer writes no more). Then the recorded run
/// is published, one event per POST, as fast as the broker answers, and only then does the
/// subscriber read, up to the run's last id. A fast subscriber reads along from the start. The
/// slow body, one connection, must pass the client as one stream and fold like the log.
async fn scenario_slow(
    broker: &BrokerProcess,
    source: &Source,
    notes: &mut Vec<String>,
) -> Option<(Comparison, SlowRow)> {
    let base = broker.base();
    let label = format!("memory/slow/{}", source.name);
    let thread = broker::thread_id("conf-slow");
    let events = source.retargeted(&thread);
    let resets_before = resets(&base).await;
    let (until, rx) = watch::channel(None);
    let fast = agui::subscribe_reader(&base, &thread, None, rx).await;
    let slow = StalledSse::connect(broker.addr, &thread).await;

    let mut pad = Publisher::new(&base, &thread);
    publish_own(
        &mut pad,
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": PAD_RUN}),
    )
    .await;
    publish_own(
        &mut pad,
        json!({"type": "TEXT_MESSAGE_START", "messageId": PAD_MESSAGE, "role": "assistant"}),
    )
    .await;
    let filler = "x".repeat(SLOW_PAD_BYTES);
    let padding = pad_until_stuck(
        &base,
        &mut pad,
        |_| {
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": PAD_MESSAGE, "delta": ".",
                "rawEvent": {"padding": filler}})
        },
        Overfull::Coalesced,
        stall_capacity(slow.rcvbuf, SLOW_MAX_BYTES + SLOW_PAD_BYTES + 1024),
    )
    .await;
    publish_own(
        &mut pad,
        json!({"type": "TEXT_MESSAGE_END", "messageId": PAD_MESSAGE}),
    )
    .await;
    publish_own(
        &mut pad,
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": PAD_RUN}),
    )
    .await;

    let coalesced_before = coalesced(&base).await;
    let mut p = Publisher::new(&base, &thread);
    p.publish_all(&events).await;
    for s in p.skipped_notes() {
        notes.push(format!("{label}: skipped at publish: {s}"));
    }
    let Some(last) = p.last_id().map(str::to_string) else {
        notes.push(format!("{label}: no event accepted, nothing to compare"));
        fast.abort();
        return None;
    };
    let mut slow = slow;
    slow.read_until(&last).await;
    until.send_replace(Some(last.clone()));
    let fast_body = fast.await.expect("fast reader");
    let slow_body = slow.body();
    let coalesced_after = coalesced(&base).await;
    assert_eq!(
        resets(&base).await,
        resets_before,
        "{label}: coalescing alone keeps the slow subscriber within its queue"
    );
    let row = SlowRow {
        name: source.name.clone(),
        log_events: p.accepted.len(),
        fast: tally(&run_part(&fast_body)),
        slow: tally(&run_part(&slow_body)),
        coalesced: coalesced_after - coalesced_before,
        padding,
    };
    let comparison = Comparison {
        subject: agui::client_case(&format!("{label}/slow"), &thread, &[slow_body]),
        reference: log_case(&base, &thread, &last, &label).await,
        expect: None,
        label,
    };
    Some((comparison, row))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_subscriber_is_coalesced_and_folds_like_the_log() {
    let test = "slow_subscriber_is_coalesced_and_folds_like_the_log";
    let broker = BrokerProcess::spawn(&[
        ("AGUI_QUEUE__MAX_EVENTS", SLOW_MAX_EVENTS.to_string()),
        ("AGUI_QUEUE__MAX_BYTES", SLOW_MAX_BYTES.to_string()),
    ])
    .await;
    let base = broker.base();
    let disconnects = overflow_disconnects(&base).await;
    let mut comparisons = Vec::new();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for source in agui::recorded_sources() {
        if let Some((c, row)) = scenario_slow(&broker, &source, &mut notes).await {
            comparisons.push(c);
            rows.push(row);
        }
    }
    assert_eq!(overflow_disconnects(&base).await, disconnects);

    eprintln!(
        "{test}: queue.max_events = {SLOW_MAX_EVENTS}, queue.max_bytes = {SLOW_MAX_BYTES}; \
         the recorded run's frames as received (after the padding run)"
    );
    eprintln!(
        "{:<76} {:>5} {:>6} {:>6} {:>9} {:>9} {:>6} {:>9}",
        "stream", "log", "fast", "slow", "fast B", "slow B", "coal.", "padding"
    );
    for r in &rows {
        eprintln!(
            "{:<76} {:>5} {:>6} {:>6} {:>9} {:>9} {:>6} {:>9}",
            r.name, r.log_events, r.fast.0, r.slow.0, r.fast.1, r.slow.1, r.coalesced, r.padding
        );
    }
    for r in &rows {
        // More events than the queue holds, published while the writer is stuck: merged.
        if r.log_events > SLOW_MAX_EVENTS {
            assert!(
                r.slow.0 < r.log_events && r.coalesced > 0.0,
                "{}: the slow subscriber was not coalesced ({} of {} events)",
                r.name,
                r.slow.0,
                r.log_events
            );
        }
        assert!(r.slow.0 <= r.fast.0, "{}: slow got more than fast", r.name);
    }
    assert!(
        rows.iter().any(|r| r.log_events > SLOW_MAX_EVENTS),
        "some run is long enough"
    );
    report(test, &comparisons, &notes);
}

// ---------------------------------------------------------------------------------------------
// (e)

/// (e): `queue.max_events` and `queue.max_bytes` of the resetting broker.
const RESET_MAX_EVENTS: usize = 8;
const RESET_MAX_BYTES: usize = 8 << 10;
/// (e): bytes of padding in each `RAW` padding event (under half the queue's bytes).
const RESET_PAD_BYTES: usize = 3 << 10;

/// One step of a burst reader's schedule (e).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    /// Publish the source's events up to this index (exclusive), one per POST.
    Publish(usize),
    /// Read everything published so far.
    ReadAll,
    /// Publish `RAW` padding (inside the open run), one per POST, until the broker reset this
    /// subscriber and its writer is stuck.
    PadUntilReset,
    /// Read until the connection's writer wrote again (it took the bridge).
    Burst,
}

/// Index ranges of the runs of `events` (`RUN_STARTED` to its `RUN_FINISHED`/`RUN_ERROR`).
fn run_ranges(events: &[Value]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, e) in events.iter().enumerate() {
        match e["type"].as_str() {
            Some("RUN_STARTED") => start = Some(i),
            Some("RUN_FINISHED" | "RUN_ERROR") => {
                if let Some(s) = start.take() {
                    out.push(s..i + 1);
                }
            }
            _ => {}
        }
    }
    out
}

/// The schedule of (e). Cuts at a third and two thirds of every run, and at `catch_up` (every
/// cut inside a run, so padding can go there). At each cut: padding until a reset, then a burst
/// read, except at a run's last cut when another run follows: there the subscriber stays stuck
/// until the next run's first cut, so that reset bridges from one run to the next. At a
/// `catch_up` cut the reader reads everything before the padding (its view is the log at the
/// cut) and after the reset (so the events that follow go out live after the bridge).
fn reset_schedule(events: &[Value], catch_up: &[usize]) -> Vec<Step> {
    let runs = run_ranges(events);
    let mut steps = Vec::new();
    for (r, run) in runs.iter().enumerate() {
        let len = run.len();
        if len < 2 {
            continue;
        }
        let mut cuts: Vec<usize> = [len / 3, 2 * len / 3]
            .iter()
            .map(|k| run.start + (*k).clamp(1, len - 1))
            .chain(catch_up.iter().copied().filter(|c| run.contains(c)))
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        for (c, cut) in cuts.iter().enumerate() {
            assert!(
                run.start < *cut && *cut < run.end,
                "cut {cut} inside {run:?}"
            );
            steps.push(Step::Publish(*cut));
            if catch_up.contains(cut) {
                steps.extend([Step::ReadAll, Step::PadUntilReset, Step::ReadAll]);
                continue;
            }
            steps.push(Step::PadUntilReset);
            if c + 1 < cuts.len() || r + 1 == runs.len() {
                steps.push(Step::Burst);
            }
        }
    }
    steps.push(Step::Publish(events.len()));
    steps
}

/// What a burst reader went through (e).
struct ResetRow {
    name: String,
    log_events: usize,
    body_events: usize,
    resets: f64,
    bridges: usize,
    crossing: usize,
    padding: usize,
    read: usize,
}

/// (e) A raw TCP subscriber connected to a fresh thread reads only in bursts while `events`
/// are published (one per POST) following [`reset_schedule`]: at each cut, `RAW` padding is
/// published in the open run until `agui_resets_total{cause="overflow"}` rose and the writer is
/// stuck ([`pad_until_stuck`]; the broker is this subscriber's alone), and a burst reads until
/// `agui_publish_to_write_seconds_count` rises (the writer took the bridge). At the end it reads
/// up to the last id. Its one connection must pass the client as one stream (PROTOCOL §4.5: a live
/// reset passes as part of its connection) and fold like the log.
async fn scenario_resets(
    broker: &BrokerProcess,
    name: &str,
    events: &[Value],
    thread: &str,
    catch_up: &[usize],
    notes: &mut Vec<String>,
) -> (Comparison, ResetRow) {
    let base = broker.base();
    let label = format!("memory/resets/{name}");
    let mut slow = StalledSse::connect(broker.addr, thread).await;
    let capacity = stall_capacity(slow.rcvbuf, RESET_MAX_BYTES + (64 << 10));
    let resets_before = resets(&base).await;
    let mut p = Publisher::new(&base, thread);
    let (mut next, mut padding) = (0usize, 0usize);
    for step in reset_schedule(events, catch_up) {
        match step {
            Step::Publish(end) => {
                while next < end {
                    if p.publish(next, &events[next]).await.is_none() {
                        notes.push(format!(
                            "{label}: skipped at publish: {}",
                            p.skipped_notes().last().cloned().unwrap_or_default()
                        ));
                    }
                    next += 1;
                }
            }
            Step::ReadAll => {
                let newest = p.last_id().expect("published").to_string();
                slow.read_through(&newest).await;
            }
            Step::PadUntilReset => {
                padding += pad_until_reset(&base, &mut p, capacity).await;
            }
            Step::Burst => {
                let before = writes(&base).await;
                let deadline = Instant::now() + METRIC_WAIT;
                while writes(&base).await == before {
                    assert!(
                        Instant::now() < deadline,
                        "{label}: the writer did not write again"
                    );
                    slow.read_once(BURST_STEP).await;
                }
            }
        }
    }
    let last = p.last_id().expect("events accepted").to_string();
    slow.read_until(&last).await;
    let body = slow.body();
    let found = bridges(&body);
    let row = ResetRow {
        name: name.to_string(),
        log_events: p.accepted.len(),
        body_events: data_frames(&body).len(),
        resets: resets(&base).await - resets_before,
        bridges: found.len(),
        crossing: found
            .iter()
            .filter(|b| b.iter().any(|t| t == "RUN_STARTED"))
            .count(),
        padding,
        read: slow.read_total,
    };
    let comparison = Comparison {
        subject: agui::client_case(&format!("{label}/slow"), thread, &[body]),
        reference: log_case(&base, thread, &last, &label).await,
        expect: None,
        label,
    };
    (comparison, row)
}

/// The recorded responses of each test folder, its turns concatenated in order (several runs on
/// one thread), named after the folder.
fn recorded_folders() -> Vec<(String, Vec<Value>)> {
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    for source in agui::recorded_sources() {
        let folder = source.name.split('/').next().unwrap_or("").to_string();
        match out.last_mut() {
            Some((name, events)) if *name == folder => events.extend(source.events),
            _ => out.push((folder, source.events)),
        }
    }
    out
}

/// A hand-made thread in the style of the prelude tests' synthetic one: three runs with
/// interleaved constructs (text, tool call, reasoning, a step, a subagent's message) and a long
/// `STATE_DELTA` series. With `failing`, some patches of the series do not apply to the folded
/// state (a `remove` of a missing key; an `add` then a failing `test`, atomic), which a broker
/// with order validation refuses (422). With `chunks`, the subagent's message streams as
/// id-less `TEXT_MESSAGE_CHUNK`s (a chunk lane open for 20 rounds), else as START/CONTENT/END.
fn synthetic_thread(thread: &str, failing: bool, chunks: bool) -> Vec<Value> {
    let mut v = vec![
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "syn-r1",
            "input": {"threadId": thread, "runId": "syn-r1",
                "messages": [{"id": "syn-u1", "role": "user", "content": "count"}]}}),
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"n": 0, "items": [], "log": {}}}),
        json!({"type": "STEP_STARTED", "stepName": "plan"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "syn-m1", "role": "assistant"}),
        json!({"type": "TOOL_CALL_START", "toolCallId": "syn-c1", "toolCallName": "count",
            "parentMessageId": "syn-m1"}),
        json!({"type": "REASONING_START", "messageId": "syn-rs"}),
        json!({"type": "REASONING_MESSAGE_START", "messageId": "syn-rm", "role": "reasoning"}),
    ];
    let deltas = |v: &mut Vec<Value>, i: usize, fail_every: usize| {
        v.push(
            json!({"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/n", "value": i}]}),
        );
        if i.is_multiple_of(3) {
            v.push(json!({"type": "STATE_DELTA", "delta": [
                {"op": "add", "path": "/items/-", "value": i},
                {"op": "add", "path": format!("/log/k{i}"), "value": "x".repeat(i % 40)}]}));
        }
        if failing && i % fail_every == 1 {
            v.push(json!({"type": "STATE_DELTA",
                "delta": [{"op": "remove", "path": format!("/missing{i}")}]}));
        }
        if failing && i % (fail_every + 4) == 2 {
            v.push(json!({"type": "STATE_DELTA", "delta": [
                {"op": "add", "path": "/partial", "value": i},
                {"op": "test", "path": "/n", "value": -1}]}));
        }
    };
    for i in 0..150 {
        v.push(
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "syn-m1",
            "delta": format!("{i} ")}),
        );
        deltas(&mut v, i, 5);
        if i.is_multiple_of(4) {
            v.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": "syn-c1",
                "delta": format!("[{i}]")}));
        }
        if i.is_multiple_of(6) {
            v.push(
                json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": "syn-rm",
                "delta": format!("t{i} ")}),
            );
        }
        if i == 100 {
            v.push(
                json!({"type": "SUBAGENT_STARTED", "subagentRunId": "syn-s1", "name": "helper"}),
            );
            if !chunks {
                v.push(json!({"type": "TEXT_MESSAGE_START", "messageId": "syn-m2",
                    "role": "assistant", "subagentRunId": "syn-s1"}));
            }
        }
        if (100..120).contains(&i) {
            let delta = format!("s{i} ");
            v.push(if !chunks {
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "syn-m2", "delta": delta,
                    "subagentRunId": "syn-s1"})
            } else if i == 100 {
                json!({"type": "TEXT_MESSAGE_CHUNK", "messageId": "syn-m2", "delta": delta,
                    "subagentRunId": "syn-s1"})
            } else {
                json!({"type": "TEXT_MESSAGE_CHUNK", "delta": delta, "subagentRunId": "syn-s1"})
            });
        }
        if i == 120 {
            if !chunks {
                v.push(json!({"type": "TEXT_MESSAGE_END", "messageId": "syn-m2",
                    "subagentRunId": "syn-s1"}));
            }
            v.push(json!({"type": "SUBAGENT_FINISHED", "subagentRunId": "syn-s1"}));
        }
    }
    v.extend([
        json!({"type": "REASONING_MESSAGE_END", "messageId": "syn-rm"}),
        json!({"type": "REASONING_END", "messageId": "syn-rs"}),
        json!({"type": "TOOL_CALL_END", "toolCallId": "syn-c1"}),
        json!({"type": "TEXT_MESSAGE_END", "messageId": "syn-m1"}),
        json!({"type": "STEP_FINISHED", "stepName": "plan"}),
        json!({"type": "TOOL_CALL_RESULT", "messageId": "syn-tr1", "toolCallId": "syn-c1",
            "content": "ok"}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "syn-r1", "result": {"x": 1}}),
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "syn-r2"}),
        json!({"type": "TEXT_MESSAGE_START", "messageId": "syn-m3", "role": "assistant"}),
    ]);
    for i in 150..230 {
        v.push(
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "syn-m3",
            "delta": format!("{i} ")}),
        );
        deltas(&mut v, i, 4);
    }
    v.extend([
        json!({"type": "TEXT_MESSAGE_END", "messageId": "syn-m3"}),
        json!({"type": "RUN_FINISHED", "threadId": thread, "runId": "syn-r2"}),
        json!({"type": "RUN_STARTED", "threadId": thread, "runId": "syn-r3"}),
    ]);
    for i in 230..290 {
        deltas(&mut v, i, 3);
    }
    v.push(json!({"type": "RUN_ERROR", "message": "syn-r3 failed", "code": "SYNTHETIC"}));
    v
}

/// Prints the (e) table and checks that each burst reader was reset, and received a bridge,
/// at least twice.
fn check_resets(test: &str, rows: &[ResetRow]) {
    eprintln!("{test}: queue.max_events = {RESET_MAX_EVENTS}, queue.max_bytes = {RESET_MAX_BYTES}");
    eprintln!(
        "{:<10} {:>6} {:>6} {:>6} {:>7} {:>8} {:>9} {:>9}",
        "thread", "log", "body", "resets", "bridges", "crossing", "padding", "read"
    );
    for r in rows {
        eprintln!(
            "{:<10} {:>6} {:>6} {:>6} {:>7} {:>8} {:>9} {:>9}",
            r.name, r.log_events, r.body_events, r.resets, r.bridges, r.crossing, r.padding, r.read
        );
    }
    for r in rows {
        assert!(r.resets >= 2.0, "{}: reset {} times", r.name, r.resets);
        assert!(r.bridges >= 2, "{}: {} bridges received", r.name, r.bridges);
    }
}

/// Spawns the (e) broker: a memory log, `queue.max_events` 8, `queue.max_bytes` 8 KiB.
async fn resets_broker(strict_order: bool) -> BrokerProcess {
    BrokerProcess::spawn(&[
        ("AGUI_QUEUE__MAX_EVENTS", RESET_MAX_EVENTS.to_string()),
        ("AGUI_QUEUE__MAX_BYTES", RESET_MAX_BYTES.to_string()),
        ("AGUI_STRICT_ORDER", strict_order.to_string()),
    ])
    .await
}

/// (e) on `threads` (name, events retargeted to the thread, thread, catch-up cuts), one after
/// the other on `broker`; every multi-run thread must have received a bridge from one run to
/// the next.
async fn resets_test(
    test: &str,
    broker: &BrokerProcess,
    threads: &[(String, Vec<Value>, String, Vec<usize>)],
) {
    let base = broker.base();
    let disconnects = overflow_disconnects(&base).await;
    let mut comparisons = Vec::new();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (name, events, thread, catch_up) in threads {
        let (c, row) = scenario_resets(broker, name, events, thread, catch_up, &mut notes).await;
        comparisons.push(c);
        rows.push(row);
    }
    assert_eq!(
        overflow_disconnects(&base).await,
        disconnects,
        "every overflow was a reset, none a disconnect"
    );
    check_resets(test, &rows);
    for ((name, events, ..), r) in threads.iter().zip(&rows) {
        if run_ranges(events).len() > 1 {
            assert!(
                r.crossing >= 1,
                "{name}: no bridge from one run to the next"
            );
        }
    }
    assert!(notes.is_empty(), "every event accepted: {notes:?}");
    report(test, &comparisons, &notes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_reader_reset_several_times_folds_like_the_log() {
    let broker = resets_broker(true).await;
    let mut threads: Vec<(String, Vec<Value>, String, Vec<usize>)> = recorded_folders()
        .into_iter()
        .map(|(name, mut events)| {
            let thread = broker::thread_id("conf-resets");
            common::fixtures::retarget(&mut events, &thread);
            (name, events, thread, Vec::new())
        })
        .collect();
    let thread = broker::thread_id("conf-resets");
    let events = synthetic_thread(&thread, false, false);
    threads.push(("synthetic".into(), events, thread, Vec::new()));
    resets_test(
        "burst_reader_reset_several_times_folds_like_the_log",
        &broker,
        &threads,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_reader_reset_through_failing_state_deltas_folds_like_the_log() {
    let broker = resets_broker(false).await;
    let thread = broker::thread_id("conf-resets-failing");
    let events = synthetic_thread(&thread, true, false);
    resets_test(
        "burst_reader_reset_through_failing_state_deltas_folds_like_the_log",
        &broker,
        &[("synthetic".into(), events, thread, Vec::new())],
    )
    .await;
}

/// (e) with the reader caught up while a subagent's id-less `TEXT_MESSAGE_CHUNK` lane is open,
/// then reset while it is still open, then caught up again before the lane's next chunks: the
/// bridge closes the client's lane (a lane-closing `STATE_SNAPSHOT`, and its `MESSAGES_SNAPSHOT`
/// closes every lane) and must re-open it (a content-less chunk with the lane's `messageId`), or
/// the next id-less chunk, live after the bridge, is fatal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_reader_reset_inside_a_chunk_lane_folds_like_the_log() {
    let broker = resets_broker(true).await;
    let thread = broker::thread_id("conf-resets-lane");
    let events = synthetic_thread(&thread, false, true);
    let inside = events
        .iter()
        .position(|e| e["type"] == "TEXT_MESSAGE_CHUNK" && e["delta"] == "s105 ")
        .expect("the chunk lane");
    resets_test(
        "burst_reader_reset_inside_a_chunk_lane_folds_like_the_log",
        &broker,
        &[("synthetic".into(), events, thread, vec![inside])],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// (f)

/// Where a client may be cut off inside the first reset bridge of `body`: the byte offsets
/// after each complete event of the bridge but its last. The bridge is found without relying
/// on its mark: the frames from after the last event id before its `MESSAGES_SNAPSHOT` (every
/// bridge restates the messages; the synthetic thread has no `MESSAGES_SNAPSHOT`) to the next
/// event id, which is on its last event. Also returns whether the bridge's first event
/// carries the mark (`<id>-bridge`, PROTOCOL §5).
fn cuts_inside_first_bridge(body: &str) -> (Vec<usize>, bool) {
    // (end offset, id, data type) of each block.
    let mut blocks = Vec::new();
    let mut at = 0;
    for (frame, bytes) in whole_frames(body) {
        at += bytes;
        let ty = frame.data.as_deref().map(|d| {
            let v: Value = serde_json::from_str(d).expect("data is JSON");
            v["type"].as_str().unwrap_or("?").to_string()
        });
        blocks.push((at, frame.id, ty));
    }
    let event_id = |b: &(usize, Option<String>, Option<String>)| {
        b.1.as_deref().is_some_and(|id| !id.ends_with("-bridge"))
    };
    let snapshot = blocks
        .iter()
        .position(|b| b.2.as_deref() == Some("MESSAGES_SNAPSHOT"))
        .expect("a bridge in the body");
    let first = blocks[..snapshot]
        .iter()
        .rposition(event_id)
        .map_or(0, |i| i + 1);
    let first = first
        + blocks[first..]
            .iter()
            .position(|b| b.2.is_some())
            .expect("data");
    let last = snapshot
        + blocks[snapshot..]
            .iter()
            .position(event_id)
            .expect("the bridge's id");
    let cuts = blocks[first..last]
        .iter()
        .filter(|b| b.2.is_some())
        .map(|b| b.0)
        .collect();
    let marked = blocks[first]
        .1
        .as_deref()
        .is_some_and(|id| id.ends_with("-bridge"));
    (cuts, marked)
}

/// The last `id:` of a body (what an `EventSource` sends back as `Last-Event-ID`).
fn last_id_of(body: &str) -> Option<String> {
    whole_frames(body)
        .into_iter()
        .rev()
        .find_map(|(frame, _)| frame.id)
}

/// (f) A raw TCP subscriber reads the first third of the synthetic thread's first run, stalls
/// until its queue is reset, and reads again once more of the run was published: it receives
/// a bridge. For every event boundary inside that bridge, a client cut off there comes back
/// with the last id it received (the bridge's mark: the bridge's first event carries it) and
/// reads to the end of the thread. Each client's two connections must pass (the second begins
/// with a prelude) and fold like the log; without the mark the client would resume exactly
/// from before the bridge, on top of the part it applied (duplicated messages, a run started
/// twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_cut_inside_a_bridge_resumes_and_folds_like_the_log() {
    let test = "a_subscriber_cut_inside_a_bridge_resumes_and_folds_like_the_log";
    let broker = resets_broker(true).await;
    let base = broker.base();
    let thread = broker::thread_id("conf-cut");
    let events = synthetic_thread(&thread, false, false);
    let run = run_ranges(&events)[0].clone();
    let (read_to, stall_to) = (run.start + run.len() / 3, run.start + 2 * run.len() / 3);

    let mut slow = StalledSse::connect(broker.addr, &thread).await;
    let capacity = stall_capacity(slow.rcvbuf, RESET_MAX_BYTES + (64 << 10));
    let mut p = Publisher::new(&base, &thread);
    for (i, e) in events.iter().enumerate().take(read_to) {
        publish_own_at(&mut p, i, e).await;
    }
    slow.read_through(p.last_id().expect("published")).await;
    pad_until_reset(&base, &mut p, capacity).await;
    for (i, e) in events.iter().enumerate().take(stall_to).skip(read_to) {
        publish_own_at(&mut p, i, e).await;
    }
    slow.read_through(p.last_id().expect("published")).await;
    let body = slow.body();
    drop(slow);
    let (cuts, marked) = cuts_inside_first_bridge(&body);
    assert!(cuts.len() >= 3, "a bridge of several events: {cuts:?}");

    let bridge_resets = || metric(&base, "agui_resets_total", &[("cause", "bridge")]);
    let counted_before = bridge_resets().await;
    let mut clients = Vec::new();
    for &cut in &cuts {
        let first = body[..cut].to_string();
        let last = last_id_of(&first).expect("an id before the cut");
        let (until, rx) = watch::channel(None);
        let reader = agui::subscribe_reader(&base, &thread, Some(&last), rx).await;
        clients.push((first, until, reader));
    }
    for (i, e) in events.iter().enumerate().skip(stall_to) {
        publish_own_at(&mut p, i, e).await;
    }
    let last = p.last_id().expect("published").to_string();
    let mut comparisons = Vec::new();
    for (n, (first, until, reader)) in clients.into_iter().enumerate() {
        until.send_replace(Some(last.clone()));
        let second = reader.await.expect("second connection");
        let label = format!("memory/cut-inside-bridge/synthetic/cut={n}");
        comparisons.push(Comparison {
            subject: agui::client_case(&format!("{label}/sub"), &thread, &[first, second]),
            reference: log_case(&base, &thread, &last, &label).await,
            expect: None,
            label,
        });
    }
    report(test, &comparisons, &[]);
    assert!(marked, "the bridge's first event carries its mark");
    assert_eq!(
        bridge_resets().await - counted_before,
        cuts.len() as f64,
        "each resume with a bridge mark is counted as a reset (cause bridge)"
    );
}

/// Publishes event `i` of a source, which must be accepted.
async fn publish_own_at(p: &mut Publisher, i: usize, event: &Value) {
    if p.publish(i, event).await.is_none() {
        panic!("refused: {:?}", p.skipped_notes());
    }
}

// ---------------------------------------------------------------------------------------------
// (g)

/// How many events of `events` have type `t`.
fn count_type(events: &[Value], t: &str) -> u64 {
    events.iter().filter(|e| e["type"] == t).count() as u64
}

/// (g) A raw TCP subscriber reads the start of a run, stalls while `CUSTOM` padding overflows
/// its queue (the broker resets it), misses three more `CUSTOM` and three `RAW` events, and
/// reads again. No snapshot restates `CUSTOM` or `RAW`, so the bridge must say what was lost,
/// in a way an app can read (PROTOCOL §5 "Reset"): its first event is the `agui-fanout.gap`
/// `CUSTOM` event, carrying the bridge mark, with the exact numbers of `CUSTOM` and `RAW`
/// events this subscriber did not get (the log's minus the body's), also counted in
/// `agui_events_skipped_total{type}`. The real `@ag-ui/client` accepts the stream, hands the
/// gap event to an app's `onCustomEvent`, and folds like the log. Before, the bridge said
/// nothing of the loss, and a one-event bridge carried a plain id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_that_drops_custom_events_tells_the_client_with_a_gap_event() {
    let broker = resets_broker(true).await;
    let base = broker.base();
    let thread = broker::thread_id("conf-gap");
    let mut slow = StalledSse::connect(broker.addr, &thread).await;
    let capacity = stall_capacity(slow.rcvbuf, RESET_MAX_BYTES + (64 << 10));
    let mut p = Publisher::new(&base, &thread);
    for e in [
        json!({"type":"RUN_STARTED","threadId":thread,"runId":"r1"}),
        json!({"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}),
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"a"}),
    ] {
        publish_own(&mut p, e).await;
    }
    slow.read_through(p.last_id().expect("published")).await;
    let had = slow.newest.clone();
    let skipped_before = [
        metric(&base, "agui_events_skipped_total", &[("type", "CUSTOM")]).await,
        metric(&base, "agui_events_skipped_total", &[("type", "RAW")]).await,
    ];
    let filler = "x".repeat(RESET_PAD_BYTES);
    pad_until_stuck(
        &base,
        &mut p,
        |i| json!({"type":"CUSTOM","name":"pad","value":{"i": i, "pad": filler}}),
        Overfull::Reset,
        capacity + RESET_MAX_BYTES,
    )
    .await;
    for i in 0..3 {
        publish_own(&mut p, json!({"type":"CUSTOM","name":"late","value":i})).await;
        publish_own(&mut p, json!({"type":"RAW","event":{"late":i}})).await;
    }
    publish_own(
        &mut p,
        json!({"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"b"}),
    )
    .await;
    let last = p.last_id().expect("published").to_string();
    slow.read_through(&last).await;
    let body = slow.body();
    drop(slow);

    let frames = data_frames(&body);
    let gaps: Vec<&DataFrame> = frames
        .iter()
        .filter(|f| f.event["name"] == "agui-fanout.gap")
        .collect();
    assert_eq!(gaps.len(), 1, "one gap event: {body}");
    let gap = gaps[0];
    let received: Vec<Value> = frames
        .iter()
        .filter(|f| f.event["name"] != "agui-fanout.gap")
        .map(|f| f.event.clone())
        .collect();
    let lost_custom = count_type(&p.accepted, "CUSTOM") - count_type(&received, "CUSTOM");
    let lost_raw = count_type(&p.accepted, "RAW") - count_type(&received, "RAW");
    assert!(
        lost_custom >= 3 && lost_raw == 3,
        "{lost_custom} {lost_raw}"
    );
    let value = &gap.event["value"];
    assert_eq!(value["reason"], "overflow");
    assert_eq!(value["skipped"], lost_custom + lost_raw, "{value}");
    assert_eq!(
        value["skippedTypes"],
        json!({"CUSTOM": lost_custom, "RAW": lost_raw})
    );
    // The gap event opens the bridge and carries its mark: `<the client's last id>-bridge`.
    let before = frames
        .iter()
        .take_while(|f| !std::ptr::eq(*f, gap))
        .filter_map(|f| f.id.clone())
        .last()
        .expect("an id before the bridge");
    assert_eq!(gap.id, Some(format!("{before}-bridge")));
    assert_eq!(value["after"], before);
    let (epoch, ms, seq, _) = sse_client::id_key(&before);
    assert!(
        had.is_some_and(|h| (h.0, h.1, h.2) <= (epoch, ms, seq)),
        "the mark names what the client had"
    );
    let until = frames
        .iter()
        .skip_while(|f| !std::ptr::eq(*f, gap))
        .find_map(|f| f.id.clone().filter(|id| !id.ends_with("-bridge")))
        .expect("the bridge's id");
    assert_eq!(value["until"], until);
    assert_eq!(
        [
            metric(&base, "agui_events_skipped_total", &[("type", "CUSTOM")]).await
                - skipped_before[0],
            metric(&base, "agui_events_skipped_total", &[("type", "RAW")]).await
                - skipped_before[1],
        ],
        [lost_custom as f64, lost_raw as f64]
    );

    let label = "memory/gap";
    let subject = agui::client_case(&format!("{label}/sub"), &thread, &[body]);
    let reference = log_case(&base, &thread, &last, label).await;
    let results = agui::run_cases(&[subject, reference]);
    let (sub, log) = (&results[0], &results[1]);
    assert!(sub.ok && log.ok, "{:?} / {:?}", sub.error, log.error);
    let told: Vec<&Value> = sub
        .custom
        .iter()
        .filter(|c| c["name"] == "agui-fanout.gap")
        .collect();
    assert_eq!(told, [&json!({"name": "agui-fanout.gap", "value": value})]);
    assert_eq!(sub.messages, log.messages, "folds like the log");
    assert_eq!(sub.state, log.state, "folds like the log");
}
