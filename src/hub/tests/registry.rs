//! The registry itself: followed threads, and the drain at shutdown.

use super::*;

/// The drain closes every stream, spread over the period, and one registered after it
/// started is closed at once.
#[tokio::test(start_paused = true)]
async fn drain_closes_every_stream_within_the_period() {
    let rig = Rig::new(100);
    rig.publish_run(1).await;
    let mut subs = Vec::new();
    for _ in 0..4 {
        subs.push(rig.subscribe(Start::Live).await);
    }
    let other = ThreadId::parse("hub-test-2").unwrap();
    subs.push(rig.hub.subscribe(&other, Start::Live).await.unwrap());
    assert_eq!(rig.hub.followed_threads(), 2);

    let began = tokio::time::Instant::now();
    let period = Duration::from_secs(10);
    rig.hub.drain_streams(period).await;
    assert!(began.elapsed() < period, "{:?}", began.elapsed());
    assert!(
        began.elapsed() >= period / 2,
        "spread: {:?}",
        began.elapsed()
    );
    for s in &subs {
        assert_eq!(closed(&s.queue).await, CloseReason::Shutdown);
    }
    let late = rig.subscribe(Start::Live).await;
    assert_eq!(closed(&late.queue).await, CloseReason::Shutdown);
}
