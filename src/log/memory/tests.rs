//! Unit tests of the memory backend's idle expiry (they reach its private thread map).

use super::*;
use crate::event::validate_event;

fn event() -> ValidEvent {
    validate_event(br#"{"type":"CUSTOM","name":"t","value":1}"#, None).unwrap()
}

fn retention(ttl: Duration) -> Retention {
    Retention {
        max_events: 100,
        max_age: None,
        idle_ttl: Some(ttl),
    }
}

/// The sweeper forgets idle threads nothing holds, and empties (new epoch) those a tail
/// still follows, waking the tail.
#[tokio::test]
async fn sweeper_forgets_idle_threads() {
    let log = MemoryLog::new(retention(Duration::from_millis(100)));
    let idle = ThreadId::parse("idle").unwrap();
    let followed = ThreadId::parse("followed").unwrap();
    log.append(&idle, &[event()]).await.unwrap();
    let ids = log.append(&followed, &[event()]).await.unwrap();
    let (tx, mut rx) = mpsc::channel(4);
    let tail = log.start_tail(tx, CancellationToken::new());
    tail.follow(followed.clone(), ids[0].epoch, ids[0].pos);
    assert_eq!(log.shared.threads.len(), 2);
    // No call touches the threads from here: only the sweeper can expire them.
    let item = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the sweeper woke the tail")
        .unwrap();
    match item {
        TailItem::Discontinuity {
            thread,
            head,
            reason,
        } => {
            assert_eq!(thread, followed);
            assert_eq!(reason, ResumeGap::OtherEpoch);
            assert_ne!(head.epoch, ids[0].epoch);
            assert_eq!(head.last, StreamPos::ZERO);
        }
        other => panic!("{other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.shared.threads.contains_key(&idle) {
        assert!(Instant::now() < deadline, "idle thread never forgotten");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        log.shared.threads.contains_key(&followed),
        "a followed thread is kept"
    );
}

/// Without a runtime there is no sweeper; idle threads still expire when touched.
#[test]
fn lazy_expiry_without_runtime() {
    let log = MemoryLog::new(retention(Duration::from_millis(20)));
    let thread = ThreadId::parse("lazy").unwrap();
    let ids = log
        .append_locked(&thread, &[event()], None, AppendExtras::default())
        .unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let head = log.thread(&thread).lock(&log.shared.retention).head();
    assert_ne!(head.epoch, ids[0].epoch);
    assert_eq!(head.last, StreamPos::ZERO);
}
