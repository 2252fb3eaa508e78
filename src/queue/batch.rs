//! What a writer takes from the queue in one go: the ready frames as the shared `Bytes` they
//! are, for one vectored write (PROTOCOL §3: an event is serialised once per node; a drain
//! never copies the pending frames into a buffer of its own connection).

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;
use std::io::IoSlice;

/// Chunks smaller than this are copied together by [`Batch::next_chunk`]; larger ones go out
/// as they are (the shared frame itself).
const SMALL_CHUNK: usize = 4 << 10;

/// Ready bytes for one write: a list of chunks, each usually a frame shared with every other
/// subscriber of the thread (a reference-count bump, never a copy). Implements [`Buf`], so a
/// socket writer hands [`Buf::chunks_vectored`] to `writev(2)` and [`Buf::advance`]s by what
/// was written. Holds no empty chunk.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The chunks not yet consumed, in order, from `chunks[start]` on; one inline (the common
    /// write of a subscriber that keeps up costs no allocation).
    chunks: SmallVec<[Bytes; 1]>,
    start: usize,
    /// Bytes in `chunks[start..]`.
    remaining: usize,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// A batch of one chunk.
    pub fn one(bytes: Bytes) -> Batch {
        let mut b = Batch::new();
        b.push(bytes);
        b
    }

    /// Appends a chunk (an empty one is left out).
    pub fn push(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.remaining += bytes.len();
            self.chunks.push(bytes);
        }
    }

    /// Appends every chunk of `other`.
    pub fn extend(&mut self, other: Batch) {
        for c in other.chunks.into_iter().skip(other.start) {
            self.push(c);
        }
    }

    /// Bytes not yet consumed.
    pub fn len(&self) -> usize {
        self.remaining
    }

    /// Whether every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }

    /// The chunks not yet consumed (the first one possibly advanced into).
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks[self.start..]
    }

    /// Takes the next piece for a writer that hands on whole `Bytes` (a hyper body frame): a
    /// chunk of [`SMALL_CHUNK`] bytes or more as it is; otherwise the small chunks that follow
    /// it copied into one buffer of at most `max_copy` bytes (a bounded copy: a frame never
    /// passes through a buffer of its connection whole unless it is small). `None` when empty.
    pub fn next_chunk(&mut self, max_copy: usize) -> Option<Bytes> {
        let first = self.chunks.get(self.start)?;
        if first.len() >= SMALL_CHUNK || self.chunks.len() - self.start == 1 {
            return self.pop_front();
        }
        let (mut small, mut len) = (0, 0);
        for c in self.chunks() {
            if c.len() >= SMALL_CHUNK || (small > 0 && len + c.len() > max_copy) {
                break;
            }
            small += 1;
            len += c.len();
        }
        if small == 1 {
            return self.pop_front();
        }
        let mut buf = BytesMut::with_capacity(len);
        for _ in 0..small {
            if let Some(c) = self.pop_front() {
                buf.extend_from_slice(&c);
            }
        }
        Some(buf.freeze())
    }

    /// Takes the first chunk whole.
    fn pop_front(&mut self) -> Option<Bytes> {
        let slot = self.chunks.get_mut(self.start)?;
        let c = std::mem::take(slot);
        self.start += 1;
        self.remaining -= c.len();
        if self.start == self.chunks.len() {
            self.chunks.clear();
            self.start = 0;
        }
        Some(c)
    }

    /// Every remaining byte in one buffer (a copy). For tests and diagnostics: writers use the
    /// chunks.
    pub fn concat(&self) -> Bytes {
        match self.chunks() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut buf = BytesMut::with_capacity(self.remaining);
                for c in many {
                    buf.extend_from_slice(c);
                }
                buf.freeze()
            }
        }
    }
}

impl From<Bytes> for Batch {
    fn from(bytes: Bytes) -> Batch {
        Batch::one(bytes)
    }
}

impl Buf for Batch {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.get(self.start).map_or(&[], |c| &c[..])
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, c) in dst.iter_mut().zip(self.chunks()) {
            *slot = IoSlice::new(c);
            n += 1;
        }
        n
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining, "advance past the end of a batch");
        while cnt > 0 {
            let first = &mut self.chunks[self.start];
            if cnt < first.len() {
                // A slice of the shared frame: no copy.
                first.advance(cnt);
                self.remaining -= cnt;
                return;
            }
            cnt -= first.len();
            self.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advancing_slices_the_shared_chunks_without_copying() {
        let a = Bytes::from_static(b"hello ");
        let b = Bytes::from(vec![b'w'; 10]);
        let mut batch = Batch::one(a.clone());
        batch.push(Bytes::new());
        batch.push(b.clone());
        assert_eq!(batch.len(), 16);
        assert_eq!(batch.chunks().len(), 2, "the empty chunk is left out");
        batch.advance(3);
        assert_eq!(batch.chunk(), b"lo ");
        batch.advance(5);
        assert_eq!(batch.len(), 8);
        assert_eq!(
            batch.chunk().as_ptr(),
            b[2..].as_ptr(),
            "the same allocation"
        );
        let mut slices = [IoSlice::new(&[]); 4];
        assert_eq!(batch.chunks_vectored(&mut slices), 1);
        batch.advance(8);
        assert!(batch.is_empty());
        assert_eq!(batch.chunks().len(), 0);
    }

    #[test]
    fn next_chunk_copies_only_runs_of_small_chunks_up_to_the_bound() {
        let big = Bytes::from(vec![b'b'; SMALL_CHUNK]);
        let mut batch = Batch::new();
        for s in [&b"ab"[..], b"cd", b"ef"] {
            batch.push(Bytes::copy_from_slice(s));
        }
        batch.push(big.clone());
        batch.push(Bytes::from_static(b"gh"));
        assert_eq!(batch.next_chunk(4).as_deref(), Some(&b"abcd"[..]));
        assert_eq!(batch.next_chunk(4).as_deref(), Some(&b"ef"[..]));
        let shared = batch.next_chunk(4).expect("the big chunk");
        assert_eq!(shared.as_ptr(), big.as_ptr(), "passed on, not copied");
        assert_eq!(batch.next_chunk(4).as_deref(), Some(&b"gh"[..]));
        assert_eq!(batch.next_chunk(4), None);
    }
}
