//! The per-connection queue (`src/queue/`): the live buffer's bounds and coalescing, the
//! snapshot-and-reset protocol, the backfill → live hand-over, closing, and the fan-out's
//! direct writes through a [`Sink`].

use agui_fanout::event::EventType;
use agui_fanout::log::{Epoch, EventId, StreamPos};
use agui_fanout::queue::{
    Bridge, BridgePart, BridgeSource, CloseReason, ConnQueue, Drained, Frame, MergeKey, Overflow,
    Pushed, QueueLimits, ResetCause, Sink, Skipped,
};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

#[path = "common/frames.rs"]
#[allow(unreachable_pub)]
mod frames;
use frames::frame;

fn limits(max_events: usize) -> QueueLimits {
    QueueLimits {
        max_events,
        max_bytes: 1 << 20,
    }
}

/// The event ids (sequence numbers) of a drained batch.
fn ids(d: Option<Drained>) -> Vec<u64> {
    match d {
        Some(Drained::Frames(b)) => seqs(&b.concat()),
        other => panic!("expected frames, got {other:?}"),
    }
}

fn seqs(bytes: &[u8]) -> Vec<u64> {
    std::str::from_utf8(bytes)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("id: 00000001-0-"))
        .map(|s| s.parse().unwrap())
        .collect()
}

#[test]
fn live_buffer_is_bounded_by_events_and_bytes() {
    let q = ConnQueue::new(limits(3), StreamPos::ZERO, false, None);
    q.push_live(&[frame(1), frame(2)]).unwrap();
    q.push_live(&[frame(3)]).unwrap();
    // RAW frames cannot be coalesced: a fourth does not fit.
    assert_eq!(q.push_live(&[frame(4)]), Err(Overflow));
    let small = ConnQueue::new(
        QueueLimits {
            max_events: 100,
            max_bytes: frame(1).bytes.len() * 2,
        },
        StreamPos::ZERO,
        false,
        None,
    );
    small.push_live(&[frame(1), frame(2)]).unwrap();
    assert_eq!(small.push_live(&[frame(3)]), Err(Overflow));
}

fn text_frame(seq: u64, delta: &str) -> Frame {
    message_frame(seq, "m", delta)
}

fn message_frame(seq: u64, message: &str, delta: &str) -> Frame {
    let id = EventId {
        epoch: Epoch(1),
        pos: StreamPos::new(0, seq),
    };
    let ev = serde_json::json!({"type":"TEXT_MESSAGE_CONTENT","messageId":message,"delta":delta});
    let merge = MergeKey::of(EventType::TextMessageContent, &ev, true, None);
    Frame::new(
        id,
        EventType::TextMessageContent,
        &serde_json::to_vec(&ev).unwrap(),
        Instant::now(),
        merge,
    )
}

#[test]
fn a_full_buffer_is_coalesced_before_it_overflows() {
    let q = ConnQueue::new(limits(4), StreamPos::ZERO, false, None);
    for i in 1..=20 {
        q.push_live(&[text_frame(i, "ab")]).unwrap();
    }
    let Some(Drained::Frames(batch)) = q.try_drain() else {
        panic!("frames expected")
    };
    let bytes = batch.concat();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert_eq!(text.matches("data: ").count(), 1, "{text}");
    assert!(text.starts_with("id: 00000001-0-20\n"), "{text}");
    assert!(text.contains(&"ab".repeat(20)), "{text}");
}

#[test]
fn a_full_buffer_compacted_push_by_push_ends_as_one_coalescing_of_everything() {
    // Runs of two messages' deltas, alternating: each push into the full buffer coalesces
    // only what came after the last compaction (with its last frame).
    let mut all = Vec::new();
    for run in 0..6u64 {
        let message = if run % 2 == 0 { "x" } else { "y" };
        for i in 0..5 {
            let seq = run * 5 + i + 1;
            all.push(message_frame(seq, message, &format!("{seq} ")));
        }
    }
    let q = ConnQueue::new(limits(8), StreamPos::ZERO, false, None);
    for f in &all {
        assert!(q.push_live(std::slice::from_ref(f)).is_ok());
        assert!(q.pending().0 <= 8);
    }
    let mut once = all.clone();
    agui_fanout::queue::coalesce::coalesce(&mut once, |_, _| None);
    assert_eq!(once.len(), 6);
    let Some(Drained::Frames(batch)) = q.try_drain() else {
        panic!("frames expected")
    };
    let want: Vec<u8> = once.iter().flat_map(|f| f.bytes.to_vec()).collect();
    assert_eq!(
        String::from_utf8(batch.concat().to_vec()).unwrap(),
        String::from_utf8(want).unwrap()
    );
}

/// A [`BridgeSource`] that installs a fixed bridge at a fixed position, counting calls.
struct FixedBridge {
    at: u64,
    calls: AtomicUsize,
}

impl BridgeSource for FixedBridge {
    fn bridge(&self, queue: &ConnQueue) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let at = |pos| EventId {
            epoch: Epoch(1),
            pos,
        };
        queue.install_bridge(Bridge::encode(
            at(queue.last_position()),
            at(StreamPos::new(0, self.at)),
            &[BridgePart::Own(
                &serde_json::json!({"type":"STATE_SNAPSHOT","snapshot":1}),
            )],
            Instant::now(),
            None,
        ));
    }
}

#[test]
fn reset_drops_what_is_pending_and_builds_one_bridge_when_the_writer_comes_back() {
    let q = ConnQueue::new(limits(2), StreamPos::ZERO, false, None);
    // Without a bridge source no reset is possible (the hub closes the queue then).
    assert!(!q.begin_reset(ResetCause::Overflow));
    let source = Arc::new(FixedBridge {
        at: 7,
        calls: Default::default(),
    });
    q.set_bridge_source(source.clone());
    q.push_live(&[frame(1), frame(2)]).unwrap();
    assert_eq!(q.push_live(&[frame(3)]), Err(Overflow));
    assert!(q.begin_reset(ResetCause::Overflow));
    assert_eq!(
        q.pending(),
        (0, 0),
        "the overflowed buffer is dropped at once"
    );
    // While the client does not read, pushes are dropped (the bridge stands for them).
    for i in 4..=7 {
        q.push_live(&[frame(i)]).unwrap();
    }
    assert_eq!(q.pending(), (0, 0));
    assert!(q.reset_pending());
    assert_eq!(source.calls.load(Ordering::SeqCst), 0, "nothing built yet");
    // The writer comes back: one bridge (at 7), then what was pushed after it.
    assert_eq!(ids(q.try_drain()), vec![7]);
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    q.push_live(&[frame(8)]).unwrap();
    assert_eq!(ids(q.try_drain()), vec![8]);
    // While a backfill is being written the client's view is unknown: no reset.
    let r = ConnQueue::new(limits(2), StreamPos::ZERO, true, None);
    r.set_bridge_source(source);
    assert!(!r.begin_reset(ResetCause::Overflow));
}

#[tokio::test]
async fn backfill_then_live_hand_over_skips_overlap() {
    // Client had 2; the backfill brings 3..=5; live already holds 4..=7 (overlap 4, 5).
    let q = ConnQueue::new(limits(100), StreamPos::new(0, 2), true, None);
    q.push_live(&[frame(4), frame(5), frame(6), frame(7)])
        .unwrap();
    assert!(
        q.try_drain().is_none(),
        "live buffer waits for the backfill"
    );
    assert!(q.push_backfill(vec![frame(3), frame(4), frame(5)]).await);
    assert_eq!(ids(q.try_drain()), vec![3, 4, 5]);
    q.finish_backfill();
    assert_eq!(ids(q.try_drain()), vec![6, 7]);
    assert!(q.try_drain().is_none());
}

#[tokio::test]
async fn close_wins_and_drops_pending() {
    let q = ConnQueue::new(limits(10), StreamPos::ZERO, false, None);
    q.push_live(&[frame(1)]).unwrap();
    q.close(CloseReason::Overflow);
    q.close(CloseReason::Shutdown);
    assert!(matches!(
        q.next_batch().await,
        Drained::Closed(CloseReason::Overflow)
    ));
    assert!(!q.push_backfill(vec![frame(2)]).await);
}

/// A [`Sink`] that takes at most `room` bytes per call (0: `WouldBlock`), keeping them.
struct MemorySink {
    room: AtomicUsize,
    got: Mutex<Vec<u8>>,
}

impl MemorySink {
    fn new(room: usize) -> Arc<MemorySink> {
        Arc::new(MemorySink {
            room: AtomicUsize::new(room),
            got: Mutex::new(Vec::new()),
        })
    }
}

impl Sink for MemorySink {
    fn send(&self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.room.load(Ordering::SeqCst));
        if n == 0 {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        self.got.lock().extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// A queue (bounds of 10 frames, no backfill) with a [`MemorySink`] of `room` attached.
fn with_sink(room: usize) -> (ConnQueue, Arc<MemorySink>) {
    let q = ConnQueue::new(limits(10), StreamPos::ZERO, false, None);
    let sink = MemorySink::new(room);
    q.attach_sink(sink.clone());
    (q, sink)
}

#[test]
fn an_idle_writer_lets_the_fan_out_write_through_the_sink() {
    let (q, sink) = with_sink(usize::MAX);
    assert_eq!(q.push_live(&[frame(1)]), Ok(Pushed::Written));
    assert_eq!(q.push_live(&[frame(2)]), Ok(Pushed::Written));
    assert_eq!(seqs(&sink.got.lock()), vec![1, 2]);
    assert_eq!(q.last_position(), StreamPos::new(0, 2));
    assert!(q.try_drain().is_none(), "nothing left for the writer");
    // A frame at or before the last one written is never written again.
    assert_eq!(q.push_live(&[frame(2)]), Ok(Pushed::Queued));
    assert!(q.try_drain().is_none(), "skipped by the writer too");
    // Several frames at once go to the writer (one write of the batch).
    assert_eq!(q.push_live(&[frame(3), frame(4)]), Ok(Pushed::Queued));
    assert_eq!(ids(q.try_drain()), vec![3, 4]);
    // The writer holds bytes: the fan-out queues until it is done.
    assert_eq!(q.push_live(&[frame(5)]), Ok(Pushed::Queued));
    assert_eq!(ids(q.try_drain()), vec![5]);
    q.writer_done();
    assert_eq!(q.push_live(&[frame(6)]), Ok(Pushed::Written));
    // Detached (the writer ended): nothing is written through the sink any more.
    q.detach_sink();
    assert_eq!(q.push_live(&[frame(7)]), Ok(Pushed::Queued));
    assert_eq!(seqs(&sink.got.lock()), vec![1, 2, 6]);
}

/// A socket [`Sink`] that gives the queue its descriptor and must never be asked to send.
struct FdSink(std::os::unix::net::UnixStream);

impl Sink for FdSink {
    fn send(&self, _: &[u8]) -> std::io::Result<usize> {
        panic!("a sink with a descriptor is written with send(2) on it, not through send")
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.0.as_raw_fd())
    }
}

#[test]
fn a_sink_with_a_descriptor_is_written_with_send_on_it_until_detached() {
    use std::io::Read;
    let (ours, mut peer) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    ours.set_nonblocking(true).expect("non-blocking");
    let q = ConnQueue::new(limits(10), StreamPos::ZERO, false, None);
    q.attach_sink(Arc::new(FdSink(ours)));
    assert_eq!(q.push_live(&[frame(1)]), Ok(Pushed::Written));
    assert_eq!(q.push_live(&[frame(2)]), Ok(Pushed::Written));
    let want = [frame(1).bytes, frame(2).bytes].concat();
    let mut got = vec![0u8; want.len()];
    peer.read_exact(&mut got).expect("the frames on the socket");
    assert_eq!(got, want);
    // Detached: the descriptor is forgotten with the sink (it closes with the writer's handle).
    q.detach_sink();
    assert_eq!(q.push_live(&[frame(3)]), Ok(Pushed::Queued));
    assert_eq!(ids(q.try_drain()), vec![3]);
}

#[test]
fn the_rest_of_a_partial_direct_write_goes_out_first() {
    let (q, sink) = with_sink(10);
    assert_eq!(q.push_live(&[frame(1)]), Ok(Pushed::Written));
    assert_eq!(sink.got.lock().len(), 10);
    // A full sink: the frame is queued behind the rest.
    sink.room.store(0, Ordering::SeqCst);
    assert_eq!(q.push_live(&[frame(2)]), Ok(Pushed::Queued));
    // The writer cannot slip a heartbeat in between.
    assert!(!q.begin_own_write());
    let Some(Drained::Frames(rest)) = q.try_drain() else {
        panic!("the rest expected")
    };
    assert_eq!(&rest.concat()[..], &frame(1).bytes[10..]);
    q.writer_done();
    assert_eq!(ids(q.try_drain()), vec![2]);
    q.writer_done();
    assert!(q.begin_own_write());
}

/// A stream that ends by itself (token expired, `max_stream_age`) writes its last words after
/// taking the socket back: the rest of a partly written frame comes first, and the hub writes
/// nothing more through the sink.
#[test]
fn last_words_take_the_socket_and_the_rest_of_a_partial_write() {
    let (q, sink) = with_sink(10);
    assert_eq!(q.push_live(&[frame(1)]), Ok(Pushed::Written));
    let rest = q.take_socket().expect("the rest of frame 1");
    assert_eq!(&rest[..], &frame(1).bytes[10..]);
    sink.room.store(usize::MAX, Ordering::SeqCst);
    assert_eq!(q.push_live(&[frame(2)]), Ok(Pushed::Queued));
    assert_eq!(sink.got.lock().len(), 10, "nothing more through the sink");
    // Without a partial write there is nothing to send first.
    let (q, _sink) = with_sink(usize::MAX);
    assert!(q.take_socket().is_none());
}

#[test]
fn no_direct_write_during_a_backfill() {
    let q = ConnQueue::new(limits(10), StreamPos::ZERO, true, None);
    let sink = MemorySink::new(usize::MAX);
    q.attach_sink(sink.clone());
    assert_eq!(q.push_live(&[frame(1)]), Ok(Pushed::Queued));
    q.finish_backfill();
    assert_eq!(ids(q.try_drain()), vec![1]);
    q.writer_done();
    assert_eq!(q.push_live(&[frame(2)]), Ok(Pushed::Written));
    assert_eq!(seqs(&sink.got.lock()), vec![2]);
}

/// A `CUSTOM` event's frame at position `0-<seq>` of epoch 1.
fn custom_frame(seq: u64) -> Frame {
    let id = EventId {
        epoch: Epoch(1),
        pos: StreamPos::new(0, seq),
    };
    Frame::new(
        id,
        EventType::Custom,
        br#"{"type":"CUSTOM","name":"n","value":1}"#,
        Instant::now(),
        MergeKey::Never,
    )
}

/// The frames a writer takes are the frames the fan-out pushed, the same allocations for
/// every connection: a drain copies nothing per connection (PROTOCOL §3), however much is
/// pending when a stalled subscriber reads again.
#[test]
fn a_drain_hands_the_writer_the_shared_frames_not_a_copy() {
    let frames: Vec<Frame> = (1..=50).map(frame).collect();
    let queues: Vec<ConnQueue> = (0..2)
        .map(|_| ConnQueue::new(limits(100), StreamPos::ZERO, false, None))
        .collect();
    for q in &queues {
        q.push_live(&frames).unwrap();
        let Some(Drained::Frames(batch)) = q.try_drain() else {
            panic!("frames expected")
        };
        let got: Vec<*const u8> = batch.chunks().iter().map(|c| c.as_ptr()).collect();
        let shared: Vec<*const u8> = frames.iter().map(|f| f.bytes.as_ptr()).collect();
        assert_eq!(got, shared, "each chunk is the shared frame itself");
        assert_eq!(
            batch.len(),
            frames.iter().map(|f| f.bytes.len()).sum::<usize>()
        );
    }
}

/// What resets drop that no snapshot restates (`CUSTOM`, `RAW`) is counted, across resets,
/// until the writer takes a bridge (whose gap event tells the client), then starts again.
#[test]
fn resets_count_the_custom_and_raw_events_they_drop_until_a_bridge_is_taken() {
    let q = ConnQueue::new(limits(3), StreamPos::ZERO, false, None);
    q.set_bridge_source(Arc::new(FixedBridge {
        at: 20,
        calls: Default::default(),
    }));
    q.push_live(&[custom_frame(1), frame(2)]).unwrap();
    assert_eq!(
        q.push_live(&[custom_frame(3), text_frame(4, "a")]),
        Err(Overflow)
    );
    assert!(q.begin_reset(ResetCause::Overflow));
    // Dropped while the reset waits for the writer.
    q.push_live(&[custom_frame(5), frame(6)]).unwrap();
    let want = Skipped {
        custom: 3,
        raw: 2,
        unknown: false,
    };
    assert_eq!(q.skipped(), want);
    // A bridge built and dropped again before the writer took it: its count carries over.
    q.install_bridge(Bridge::encode(
        EventId {
            epoch: Epoch(1),
            pos: StreamPos::ZERO,
        },
        EventId {
            epoch: Epoch(1),
            pos: StreamPos::new(0, 6),
        },
        &[BridgePart::Own(
            &serde_json::json!({"type":"STATE_SNAPSHOT","snapshot":1}),
        )],
        Instant::now(),
        None,
    ));
    q.push_live(&[custom_frame(7), frame(8), frame(9), frame(10)])
        .unwrap_err();
    assert!(q.begin_reset(ResetCause::Trimmed));
    assert_eq!(
        q.skipped(),
        Skipped {
            custom: 4,
            raw: 5,
            unknown: true,
        }
    );
    // The writer takes the bridge (at 20): the count starts again.
    assert_eq!(ids(q.try_drain()), vec![20]);
    assert_eq!(q.skipped(), Skipped::default());
}
