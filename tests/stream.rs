//! The hyper body writer (`src/stream/`), on paused time: the first write, frames as the
//! queue yields them, heartbeats only after a whole idle period, and the stream's last words
//! (the close reason, a drain's jittered `retry:`, a token's expiry).

use agui_fanout::event::EventType;
use agui_fanout::log::{Epoch, EventId, StreamPos};
use agui_fanout::queue::{CloseReason, ConnQueue, Frame, MergeKey, QueueLimits};
use agui_fanout::sse::{self, HEARTBEAT};
use agui_fanout::stream::{self, EXPIRED, StreamSettings};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

#[path = "common/frames.rs"]
#[allow(unreachable_pub)]
mod frames;
use frames::frame;

const HEARTBEAT_EVERY: Duration = Duration::from_secs(15);

fn queue() -> Arc<ConnQueue> {
    let limits = QueueLimits {
        max_events: 16,
        max_bytes: 1 << 20,
    };
    Arc::new(ConnQueue::new(limits, StreamPos::ZERO, false, None))
}

fn settings(ends_at: Option<Instant>) -> StreamSettings {
    StreamSettings {
        retry_ms: 2000,
        heartbeat: HEARTBEAT_EVERY,
        write_timeout: Duration::from_secs(5),
        ends_at,
        max_age_at: None,
    }
}

/// The body's next chunk.
async fn next<S>(body: &mut S) -> Option<Bytes>
where
    S: Stream<Item = Result<Bytes, std::convert::Infallible>> + Unpin,
{
    body.next().await.map(|chunk| chunk.expect("infallible"))
}

#[tokio::test(start_paused = true)]
async fn heartbeats_come_after_a_whole_idle_period_and_the_close_reason_ends_the_stream() {
    let q = queue();
    let start = Instant::now();
    let prefix = vec![sse::encode_comment("hello")];
    let body = stream::body(q.clone(), prefix, settings(None), Box::new(()));
    let mut body = std::pin::pin!(body);
    assert_eq!(
        next(&mut body).await.as_deref(),
        Some(&b"retry: 2000\n\n: hello\n\n"[..])
    );
    q.push_live(&[frame(1)]).unwrap();
    assert_eq!(next(&mut body).await, Some(frame(1).bytes));
    assert_eq!(next(&mut body).await.as_deref(), Some(HEARTBEAT));
    assert_eq!(start.elapsed(), HEARTBEAT_EVERY);
    // A write in between puts the next heartbeat a whole period after it.
    tokio::time::advance(Duration::from_secs(10)).await;
    q.push_live(&[frame(2)]).unwrap();
    assert_eq!(next(&mut body).await, Some(frame(2).bytes));
    assert_eq!(next(&mut body).await.as_deref(), Some(HEARTBEAT));
    assert_eq!(
        start.elapsed(),
        HEARTBEAT_EVERY * 2 + Duration::from_secs(10)
    );
    q.close(CloseReason::Overflow);
    assert_eq!(
        next(&mut body).await.as_deref(),
        Some(&b": agui-fanout: subscriber too slow, reconnect\n\n"[..])
    );
    assert_eq!(next(&mut body).await, None);
}

/// A stream the drain ends gets a short jittered `retry:` (¼× to 1.5× `retry_ms`: 500 ms to
/// 3 s here), so that its client lands on a ready node within a few seconds (PROTOCOL §9).
#[tokio::test(start_paused = true)]
async fn a_drained_stream_ends_with_a_short_jittered_retry() {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let q = queue();
        let body = stream::body(q.clone(), Vec::new(), settings(None), Box::new(()));
        let mut body = std::pin::pin!(body);
        assert_eq!(
            next(&mut body).await.as_deref(),
            Some(&b"retry: 2000\n\n"[..])
        );
        q.close(CloseReason::Shutdown);
        let last = next(&mut body).await.expect("a last frame");
        let text = std::str::from_utf8(&last).unwrap();
        let ms: u64 = text
            .strip_prefix("retry: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a retry frame: {text:?}"));
        assert!((500..=3_000).contains(&ms), "{ms}");
        seen.insert(ms);
        assert_eq!(next(&mut body).await, None);
    }
    assert!(seen.len() > 1, "jittered: {seen:?}");
}

#[tokio::test(start_paused = true)]
async fn a_stream_ends_when_its_token_expires() {
    let q = queue();
    let start = Instant::now();
    let ends_at = start + Duration::from_secs(40);
    let body = stream::body(q, Vec::new(), settings(Some(ends_at)), Box::new(()));
    let mut body = std::pin::pin!(body);
    assert!(next(&mut body).await.is_some(), "retry: first");
    assert_eq!(next(&mut body).await.as_deref(), Some(HEARTBEAT));
    assert_eq!(next(&mut body).await.as_deref(), Some(HEARTBEAT));
    assert_eq!(start.elapsed(), HEARTBEAT_EVERY * 2);
    assert_eq!(next(&mut body).await.as_deref(), Some(EXPIRED));
    assert_eq!(start.elapsed(), Duration::from_secs(40));
    assert_eq!(next(&mut body).await, None);
}

/// `sse.max_stream_age` (rebalancing): the stream ends at its age limit with a short jittered
/// `retry:` (500 ms to 3 s here), also while frames keep flowing (never idle), after writing
/// what came before; the client resumes with its `Last-Event-ID` wherever it reconnects.
#[tokio::test(start_paused = true)]
async fn a_stream_ends_at_its_max_age_with_a_short_retry() {
    let q = queue();
    let start = Instant::now();
    let mut s = settings(None);
    s.max_age_at = Some(start + Duration::from_secs(40));
    let body = stream::body(q.clone(), Vec::new(), s, Box::new(()));
    let mut body = std::pin::pin!(body);
    assert!(next(&mut body).await.is_some(), "retry: first");
    // A frame every 10 s: never idle for a heartbeat period.
    for seq in 1..=4 {
        q.push_live(&[frame(seq)]).unwrap();
        assert_eq!(next(&mut body).await, Some(frame(seq).bytes));
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    assert_eq!(start.elapsed(), Duration::from_secs(40));
    let last = next(&mut body).await.expect("a last frame");
    let text = std::str::from_utf8(&last).unwrap();
    let ms: u64 = text
        .strip_prefix("retry: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a retry frame: {text:?}"));
    assert!((500..=3_000).contains(&ms), "{ms}");
    assert_eq!(next(&mut body).await, None);

    // An idle stream ends on time too: the writer's timer wakes it.
    let q = queue();
    let start = Instant::now();
    let mut s = settings(None);
    s.max_age_at = Some(start + Duration::from_secs(20));
    let body = stream::body(q, Vec::new(), s, Box::new(()));
    let mut body = std::pin::pin!(body);
    assert!(next(&mut body).await.is_some(), "retry: first");
    assert_eq!(next(&mut body).await.as_deref(), Some(HEARTBEAT));
    let last = next(&mut body).await.expect("a last frame");
    assert!(last.starts_with(b"retry: "), "{last:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(20));
    assert_eq!(next(&mut body).await, None);
}

/// Each stream's age limit is drawn from ¾× to 1× of `sse.max_stream_age`, so streams opened
/// together do not all end together.
#[test]
fn stream_age_limits_are_jittered_within_three_quarters_to_one() {
    let age = Duration::from_secs(1800);
    let drawn: std::collections::BTreeSet<Duration> =
        (0..50).map(|_| stream::stream_age_limit(age)).collect();
    assert!(
        drawn.iter().all(|d| *d >= age.mul_f64(0.75) && *d <= age),
        "{drawn:?}"
    );
    assert!(drawn.len() > 10, "jittered: {drawn:?}");
}

/// A `RAW` event's frame at position `0-<seq>` of epoch 1 with `pad` bytes of padding.
fn big_frame(seq: u64, pad: usize) -> Frame {
    let json = format!(r#"{{"type":"RAW","event":"{}"}}"#, "x".repeat(pad));
    let id = EventId {
        epoch: Epoch(1),
        pos: StreamPos::new(0, seq),
    };
    Frame::new(
        id,
        EventType::Raw,
        json.as_bytes(),
        std::time::Instant::now(),
        MergeKey::Never,
    )
}

/// The body hands hyper what the hub encoded, not copies of it: a prelude in the first write
/// and a backlog of large frames go out as the shared allocations themselves (a stalled
/// subscriber that reads again holds references to the thread's frames, not a buffer of its
/// own of everything pending); small pieces (`retry:`, comments, small frames) are gathered.
/// Before, every write was one buffer per connection with everything ready copied into it.
#[tokio::test(start_paused = true)]
async fn the_body_writes_the_shared_frames_and_prelude_as_they_are() {
    let q = queue();
    let prelude = Bytes::from(format!("data: {}\n\n", "p".repeat(64 << 10)));
    let prefix = vec![sse::encode_comment("hello"), prelude.clone()];
    let body = stream::body(q.clone(), prefix, settings(None), Box::new(()));
    let mut body = std::pin::pin!(body);
    let head = next(&mut body).await.expect("retry: first");
    assert!(
        head == b"retry: 2000\n\n: hello\n\n"[..],
        "retry: and the comment, gathered, without the prelude ({} bytes)",
        head.len()
    );
    let first = next(&mut body).await.expect("the prelude");
    assert_eq!(first.as_ptr(), prelude.as_ptr(), "the shared prelude");
    assert_eq!(first.len(), prelude.len());

    let frames: Vec<Frame> = (1..=4).map(|i| big_frame(i, 32 << 10)).collect();
    q.push_live(&frames).unwrap();
    for f in &frames {
        let chunk = next(&mut body).await.expect("a frame");
        assert_eq!(chunk.as_ptr(), f.bytes.as_ptr(), "the shared frame");
        assert_eq!(chunk.len(), f.bytes.len());
    }
    q.push_live(&[frame(5), frame(6)]).unwrap();
    let small = next(&mut body).await.expect("small frames");
    assert_eq!(small, [frame(5).bytes, frame(6).bytes].concat());
}
