//! The direct socket writer of a subscriber stream (HTTP/1 requests taken by the connection
//! front, `http::conn`), and the socket's side of the queue's direct writes
//! ([`crate::queue::Sink`]).

use super::{Guard, StreamSettings, Wake, WriterState, first_write};
use crate::queue::{Batch, ConnQueue, Sink};
use bytes::{Buf, Bytes};
use std::future::Future;
use std::io::IoSlice;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::net::TcpStream;

/// Writes a subscriber's stream straight to its socket (HTTP/1 requests taken by the
/// connection front, `http::conn`): `head` (the response head), `retry:` and `prefix` in one
/// vectored write, then every batch the queue yields as one vectored write (`writev(2)` of the
/// shared frames themselves: nothing is copied per connection), heartbeats when idle, until
/// the queue closes or the client goes away. Returns the stream as a future (to spawn as a
/// task; its heartbeat timer is armed at the call, which needs the runtime) that completes
/// when the stream has ended; the socket is closed when `io` is dropped (the response is
/// delimited by the close, RFC 9112 §6.3).
///
/// While waiting it also watches the socket for reads, so a client that closes its end is
/// noticed at once rather than at the next write. Anything it sends is read and ignored, up to
/// 64 KiB; more closes the connection.
pub fn write_socket(
    io: TcpStream,
    head: Bytes,
    queue: Arc<ConnQueue>,
    prefix: Vec<Bytes>,
    settings: StreamSettings,
    guard: Guard,
) -> impl Future<Output = ()> + Send + 'static {
    // Built here, outside the stream's future: the arguments of an `async fn` stay in its
    // future for its whole life beside what is made of them, and this future is what an idle
    // subscriber holds for hours (its size: `tests::the_stream_future_stays_small`).
    let mut first = Batch::one(head);
    first.extend(first_write(&settings, prefix));
    let mut s = SocketStream {
        io: Arc::new(io),
        st: WriterState::new(queue, settings, first, guard),
        ignored: 0,
        attached: false,
        ending: false,
    };
    // Captured by an `async` block, not passed to an `async fn`: an `async fn` moves its
    // arguments into locals of its own, and the future then holds both copies.
    async move { stream_socket(&mut s).await }
}

/// The state of a [`write_socket`] stream.
struct SocketStream {
    io: Arc<TcpStream>,
    st: WriterState,
    /// Bytes the client sent after its request (read and dropped).
    ignored: u32,
    /// The socket is attached to the queue (after the first write, the response head): the
    /// hub may write frames itself while this writer is idle.
    attached: bool,
    /// The last words were taken: the stream ends once they are written.
    ending: bool,
}

impl SocketStream {
    /// Reads (and drops) what the client sent: `false` when the stream must end (the client
    /// closed its end, the connection failed, or it sent more than [`MAX_IGNORED_BYTES`]).
    /// An event stream's client has nothing to say; the response is `connection: close`, so
    /// not even a pipelined request is answered.
    fn read_ignored(&mut self) -> bool {
        let mut scratch = [0u8; 256];
        match self.io.try_read(&mut scratch) {
            Ok(0) => false,
            Ok(n) => {
                self.ignored = self.ignored.saturating_add(n as u32);
                if self.ignored > MAX_IGNORED_BYTES {
                    tracing::debug!(ignored = self.ignored, "subscriber keeps sending; closing");
                    return false;
                }
                true
            }
            // A spurious readiness.
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
        }
    }
}

/// Detaches the socket from the queue when the writer ends, so that the connection closes
/// with the writer's handle (the queue may outlive it briefly).
impl Drop for SocketStream {
    fn drop(&mut self) {
        self.st.queue.detach_sink();
    }
}

/// The stream of [`write_socket`]: `st.pending` (the response head, `retry:` and the prefix)
/// first, then what the queue yields. One write site, one wait site: every `.await` of an
/// `async fn` keeps its own state in the future.
async fn stream_socket(s: &mut SocketStream) {
    loop {
        // Written now when the socket takes it all (the common case); the wait for room is
        // boxed, rare, and inline it would make every stream's future larger by as much.
        let written = match write_ready(&s.io, &mut s.st.pending) {
            Ok(true) => Ok(()),
            Ok(false) => {
                let patience = s.st.settings.write_timeout;
                Box::pin(write_waiting(&s.io, &mut s.st.pending, patience)).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            // The last words' timeout is not a cause of its own: the stream was ending anyway.
            if e.kind() == std::io::ErrorKind::TimedOut && !s.ending {
                tracing::debug!("subscriber accepted nothing for the write timeout; disconnecting");
                metrics::counter!(crate::metrics::DISCONNECTS, "cause" => "write_timeout")
                    .increment(1);
            }
            return;
        }
        if s.ending {
            return;
        }
        // Dropped, not kept empty: a batch keeps its chunk vector's capacity, and an idle
        // stream would hold it for hours.
        s.st.pending = Batch::new();
        s.st.wrote_at = tokio::time::Instant::now();
        if s.attached {
            s.st.queue.writer_done();
        } else {
            s.st.queue.attach_sink(s.io.clone());
            s.attached = true;
        }
        loop {
            let SocketStream { io, st, .. } = &mut *s;
            let wake = std::future::poll_fn(|cx| {
                if let Poll::Ready(w) = st.poll_wake(cx) {
                    return Poll::Ready(Some(w));
                }
                if io.poll_read_ready(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            match wake {
                Some(Wake::Frames(batch)) => s.st.pending = batch,
                Some(Wake::Closed(last)) => {
                    let Some(last) = last else { return };
                    // The hub may have the socket (a stream that ends by itself is told so
                    // before the queue is looked at): take it, and the rest of a frame the
                    // hub wrote partly goes first.
                    let mut batch = match s.st.queue.take_socket() {
                        Some(rest) => Batch::one(rest),
                        None => Batch::new(),
                    };
                    batch.push(last);
                    s.st.pending = batch;
                    s.ending = true;
                }
                Some(Wake::Heartbeat) if peer_vanished(&s.io, s.st.settings.write_timeout) => {
                    tracing::debug!(
                        "subscriber acknowledged nothing for the write timeout; disconnecting"
                    );
                    metrics::counter!(crate::metrics::DISCONNECTS, "cause" => "write_timeout")
                        .increment(1);
                    return;
                }
                Some(Wake::Heartbeat) => match s.st.on_heartbeat() {
                    // A frame the hub wrote partly goes first: skip this heartbeat.
                    Some(bytes) if s.st.queue.begin_own_write() => s.st.pending = Batch::one(bytes),
                    _ => continue,
                },
                // The socket is readable.
                None if s.read_ignored() => continue,
                None => return,
            }
            break;
        }
    }
}

/// The hub's fan-out writes a frame to the subscriber's socket itself, under the queue's lock,
/// while the writer is idle (see [`ConnQueue::attach_sink`]).
impl Sink for TcpStream {
    /// `send(2)` on the socket directly, not tokio's `try_write`: that one first reads the
    /// socket's readiness word (a cache miss per subscriber at 10,000 connections) to skip a
    /// syscall that is rarely skipped here. A full socket answers `EAGAIN` either way; the
    /// writer's own `try_write` then clears the stale readiness and waits for room.
    fn send(&self, buf: &[u8]) -> std::io::Result<usize> {
        socket2::SockRef::from(self).send(buf)
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.as_raw_fd())
    }
}

/// Whether the peer vanished without closing the connection (no FIN, no RST: a laptop closed,
/// a NAT entry dropped): segments sent are unacknowledged and no ACK at all came for `limit`
/// (`sse.write_timeout`), both read with one `getsockopt(TCP_INFO)`. Checked at every heartbeat tick, so such a subscriber is freed within
/// heartbeat + `limit`, not after the kernel's ~15 minutes of retransmissions. A slow reader,
/// or one that stopped reading, still acknowledges (data, window probes) and is left to
/// [`write_waiting`]'s progress check. Not `TCP_USER_TIMEOUT`: its persist-timer accounting
/// ended live readers with small windows.
fn peer_vanished(io: &TcpStream, limit: Duration) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `tcp_info` is plain integers (all-zero is valid); `getsockopt(TCP_INFO)`
        // writes at most `len` bytes of it for the open socket `io` borrows.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockopt(
                io.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&raw mut info).cast(),
                &mut len,
            )
        };
        rc == 0 && info.tcpi_unacked > 0 && u128::from(info.tcpi_last_ack_recv) >= limit.as_millis()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = limit;
        false
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
const MAX_IGNORED_BYTES: u32 = 64 << 10;

/// Most chunks handed to one `writev(2)` (Linux takes up to 1024).
const MAX_IOVECS: usize = 256;

/// Writes what the socket takes now: `true` when all of `batch` was written, `false` when the
/// socket is full (`EAGAIN`).
///
/// # Errors
/// The socket's error.
fn write_ready(io: &TcpStream, batch: &mut Batch) -> std::io::Result<bool> {
    while !batch.is_empty() {
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
        let n = batch.chunks_vectored(&mut slices);
        match io.try_write_vectored(&slices[..n]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => batch.advance(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes all of `batch` once the socket is full (shared with the hub, which writes only while
/// this writer is idle, see [`ConnQueue::attach_sink`]): waits for room, writes, until `batch`
/// is written.
///
/// # Errors
/// The socket's error; `TimedOut` when the socket accepted no byte for `patience`.
async fn write_waiting(
    io: &TcpStream,
    batch: &mut Batch,
    patience: Duration,
) -> std::io::Result<()> {
    loop {
        let mut unsent = unsent_bytes(io);
        loop {
            match tokio::time::timeout(patience, io.writable()).await {
                Ok(ready) => break ready?,
                // No room reported for `patience`. Linux reports a socket writable only once a
                // third of its buffer is free, so a client that reads, slowly, may never get
                // there within `patience`: give up only when the kernel sent nothing of what
                // it holds meanwhile.
                Err(_) => match (unsent, unsent_bytes(io)) {
                    (Some(before), Some(now)) if now < before => unsent = Some(now),
                    _ => return Err(std::io::ErrorKind::TimedOut.into()),
                },
            }
        }
        if write_ready(io, batch)? {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`write_socket`] returns is the whole state of an idle subscriber's task, held for
    /// the connection's life (with its queue and socket): 1,104 bytes while it was an
    /// `async fn` running inside the connection's task (whose future was 2,184), 272 now, in
    /// release and debug builds alike.
    #[test]
    fn the_stream_future_stays_small() {
        fn size<A, B, C, D, E, G, F>(_: fn(A, B, C, D, E, G) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let size = size(write_socket as fn(_, _, _, _, _, _) -> _);
        assert!(size <= 320, "write_socket's future is {size} bytes");
    }
}
