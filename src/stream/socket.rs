//! The direct socket writer of a subscriber stream (HTTP/1 requests taken by the connection
//! front, `http::conn`), and the socket's side of the queue's direct writes
//! ([`crate::queue::Sink`]).

use super::{Guard, StreamSettings, Wake, WriterState, first_write};
use crate::queue::{Batch, ConnQueue, Sink};
use bytes::{Buf, Bytes};
use std::io::IoSlice;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::net::TcpStream;

/// Writes a subscriber's stream straight to its socket (HTTP/1 requests taken by the
/// connection front, `http::conn`): `head` (the response head), `retry:` and `prefix` in one
/// vectored write, then every batch the queue yields as one vectored write (`writev(2)` of the
/// shared frames themselves: nothing is copied per connection), heartbeats when idle, until
/// the queue closes or the client goes away. Returns when the stream has ended; the socket is
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
    let mut first = Batch::one(head);
    first.extend(first_write(&settings, prefix));
    if write_all(&io, &mut first, patience).await.is_err() {
        return;
    }
    drop(first);
    // From here on the hub may write frames itself while this writer is idle.
    queue.attach_sink(io.clone());
    let _detach = Detach(queue.clone());
    let mut st = WriterState::new(queue, settings, Batch::new(), guard);
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
        let mut batch = match wake {
            SocketWake::Stream(Wake::Frames(batch)) => batch,
            SocketWake::Stream(Wake::Closed(last)) => {
                if let Some(last) = last {
                    let _ = write_all(&io, &mut Batch::one(last), patience).await;
                }
                return;
            }
            SocketWake::Stream(Wake::Heartbeat) => match st.on_heartbeat() {
                // A frame the hub wrote partly goes first: skip this heartbeat.
                Some(bytes) if st.queue.begin_own_write() => Batch::one(bytes),
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
        if let Err(e) = write_all(&io, &mut batch, patience).await {
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
        self.0.detach_sink();
    }
}

/// Most chunks handed to one `writev(2)` (Linux takes up to 1024).
const MAX_IOVECS: usize = 256;

/// Writes all of `batch` to a socket shared with the hub (which writes only while this writer
/// is idle, see [`ConnQueue::attach_sink`]), with vectored writes of its chunks as they are.
///
/// # Errors
/// The socket's error; `TimedOut` when the socket accepted no byte for `patience`.
async fn write_all(io: &TcpStream, batch: &mut Batch, patience: Duration) -> std::io::Result<()> {
    while !batch.is_empty() {
        let written = {
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let n = batch.chunks_vectored(&mut slices);
            io.try_write_vectored(&slices[..n])
        };
        match written {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => batch.advance(n),
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
