//! Direct writes: while a connection's writer is idle and nothing is pending, the hub's
//! fan-out writes a frame to the subscriber itself, through the [`Sink`] the writer lent the
//! queue (a subscriber that keeps up then costs no wake-up of its writer per event). The
//! unwritten rest of a partial write is kept ahead of everything else.

use super::{ConnQueue, Frame, Inner};
use bytes::Bytes;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;

/// Where the fan-out may write a frame itself: the subscriber's socket, lent by its writer
/// (`stream::write_socket`) with [`ConnQueue::attach_sink`]. Called under the queue's lock
/// (see [`ConnQueue`]'s lock discipline), so it must never wait.
pub trait Sink: Send + Sync {
    /// Writes what fits of `buf` now, without waiting; returns how many bytes were taken.
    ///
    /// # Errors
    /// `WouldBlock` when nothing fits now (the writer then waits for room), or the connection's
    /// error (the writer notices it too).
    fn send(&self, buf: &[u8]) -> std::io::Result<usize>;

    /// The socket's file descriptor, when `send` is exactly `send(2)` on it: the queue then
    /// keeps the descriptor beside the sink and calls `send(2)` itself, without reaching
    /// into the sink (a cache miss per subscriber at 10,000 connections). `None` (the
    /// default): every write goes through [`Sink::send`].
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
}

/// `send(2)` on `fd` without waiting (`MSG_NOSIGNAL` on Linux, as socket2 sends).
///
/// Measured (perf, threads 1,000 × 10 at 3,000 events/s, `tokens`): the write through the
/// sink spent ~1 % of the broker's CPU (~4.5 % of its user CPU) in `TcpStream::as_fd`, the
/// load of the socket's struct on the way to its descriptor.
fn send_fd(fd: RawFd, buf: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `fd` is the descriptor of the sink kept beside it in the same `Inner`; both are
    // only set, replaced or dropped under the queue's lock, which the caller holds, so the
    // descriptor stays open (and is the same socket) for this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    socket2::SockRef::from(&fd).send(buf)
}

impl ConnQueue {
    /// Lets the hub write frames straight to `sink` while nothing is pending and the writer
    /// is idle. The writer calls [`ConnQueue::writer_done`] after each of its own writes and
    /// [`ConnQueue::detach_sink`] when it ends.
    pub fn attach_sink(&self, sink: Arc<dyn Sink>) {
        let mut q = self.inner.lock();
        q.sink_fd = sink.raw_fd();
        q.sink = Some(sink);
    }

    /// Forgets the sink (the writer ended): the connection closes with the writer's handle.
    pub fn detach_sink(&self) {
        let mut q = self.inner.lock();
        q.sink = None;
        q.sink_fd = None;
    }

    /// The writer finished writing what it took: the socket is free again.
    pub fn writer_done(&self) {
        self.inner.lock().writer_busy = false;
    }

    /// The writer is about to write its last words (a stream that ends by itself: its token
    /// expired, its `max_stream_age` passed): the hub no longer writes to the socket, and the
    /// rest of a frame it wrote partly, if any, is returned to go out first (else the last
    /// words would land inside that frame).
    pub fn take_socket(&self) -> Option<Bytes> {
        let mut q = self.inner.lock();
        q.sink = None;
        q.sink_fd = None;
        q.writer_busy = true;
        q.partial.take()
    }

    /// The writer is about to write bytes of its own (a heartbeat): `false` when a partly
    /// written frame must go first (the writer then drains instead).
    pub fn begin_own_write(&self) -> bool {
        let mut q = self.inner.lock();
        if q.partial.is_some() {
            return false;
        }
        q.writer_busy = true;
        true
    }
}

impl Inner {
    /// Writes `frame` to the attached sink under the queue's lock, when that keeps the
    /// stream's order: nothing pending, no backfill, writer idle, frame newer than the last
    /// one written. `false`: nothing was written (the caller queues the frame). A partial
    /// write keeps the rest in `partial`, ahead of everything else.
    pub(super) fn write_direct(&mut self, frame: &Frame) -> bool {
        let Some(sink) = self.sink.as_ref() else {
            return false;
        };
        if !self.backfill_done
            || self.reset_pending
            || !self.backfill.is_empty()
            || !self.live.is_empty()
            || self.bridge.is_some()
            || self.writer_busy
            || self.partial.is_some()
            || frame.id.pos <= self.last
        {
            return false;
        }
        let sent = match self.sink_fd {
            Some(fd) => send_fd(fd, &frame.bytes),
            None => sink.send(&frame.bytes),
        };
        match sent {
            Ok(n) => {
                if n < frame.bytes.len() {
                    self.partial = Some(frame.bytes.slice(n..));
                }
                self.last = frame.id.pos;
                self.client_view = frame.view.clone();
                true
            }
            // Full (the writer waits for room) or failed (the writer notices the close).
            Err(_) => false,
        }
    }
}
