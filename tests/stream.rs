//! The hyper body writer (`src/stream/`), on paused time: the first write, frames as the
//! queue yields them, heartbeats only after a whole idle period, and the stream's last words
//! (the close reason, a drain's jittered `retry:`, a token's expiry).

use agui_fanout::log::StreamPos;
use agui_fanout::queue::{CloseReason, ConnQueue, QueueLimits};
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
