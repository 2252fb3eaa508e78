//! The fan-out: order, one encoding per node, the view frames share, the slow-consumer
//! policy, and what a discontinuity of the tail does.

use super::*;
use crate::log::ResumeGap;

fn text_start() -> Value {
    json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"})
}

fn text_content(delta: &str) -> Value {
    json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": delta})
}

/// Two subscribers get every event in log order, and the same bytes: the event was encoded
/// once for both.
#[tokio::test(start_paused = true)]
async fn fan_out_delivers_in_order_to_two_queues_encoded_once() {
    let rig = Rig::new(1000);
    rig.publish_run(0).await;
    let a = rig.subscribe(Start::Live).await;
    let b = rig.subscribe(Start::Live).await;
    let one = rig.publish(&[custom(0)]).await;
    let (Drained::Frames(fa), Drained::Frames(fb)) =
        (next_batch(&a.queue).await, next_batch(&b.queue).await)
    else {
        panic!("frames expected");
    };
    assert_eq!(ids_of(&parse(&fa.concat())), id_texts(&one));
    assert_eq!(
        fa.chunks()[0].as_ptr(),
        fb.chunks()[0].as_ptr(),
        "one encoding, shared"
    );

    let mut want = Vec::new();
    for n in 1..=10 {
        let batch: Vec<Value> = (0..n).map(custom).collect();
        want.extend(rig.publish(&batch).await);
    }
    let last = *want.last().unwrap();
    for q in [&a.queue, &b.queue] {
        assert_eq!(ids_of(&read_until(q, last).await), id_texts(&want));
        assert!(q.try_drain().is_none());
    }
}

/// The hub folds what it fans out, and frames that cannot change the order state share the
/// order state (`view`) of the frame before them.
#[tokio::test(start_paused = true)]
async fn the_fold_follows_the_fan_out_and_views_are_shared() {
    let rig = Rig::new(1000);
    rig.publish_run(0).await;
    let _sub = rig.subscribe(Start::Live).await;
    let view = || rig.thread_hub().state.lock().view.clone().expect("a fold");
    let before = view();
    rig.publish(&[text_start()]).await;
    rig.settled().await;
    let opened = view();
    assert!(!Arc::ptr_eq(&before, &opened), "a START changes the view");
    rig.publish(&[text_content("ab"), custom(1)]).await;
    rig.settled().await;
    assert!(Arc::ptr_eq(&opened, &view()), "content and CUSTOM keep it");
    let th = rig.thread_hub();
    let st = th.state.lock();
    let messages = st.fold.as_ref().unwrap().fold().messages();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["content"], "ab");
}

/// A subscriber that does not read has its pending frames coalesced first; when even that
/// does not fit, its queue is reset (nothing pending, a bridge owed), not closed.
#[tokio::test(start_paused = true)]
async fn a_full_queue_is_coalesced_then_reset() {
    let rig = Rig::new(4);
    rig.publish(&[run_started(&rig.thread), text_start()]).await;
    let sub = rig.subscribe(Start::Live).await;
    for _ in 0..12 {
        rig.publish(&[text_content("ab")]).await;
    }
    rig.settled().await;
    assert!(!sub.queue.reset_pending(), "deltas coalesce");
    assert!(sub.queue.pending().0 <= 4, "{:?}", sub.queue.pending());
    for i in 0..5 {
        rig.publish(&[custom(i)]).await;
    }
    rig.settled().await;
    assert!(sub.queue.reset_pending(), "CUSTOM events do not coalesce");
    assert_eq!(sub.queue.pending(), (0, 0), "what was pending is dropped");
    assert!(!sub.queue.is_closed());
}

/// A queue that overflows while its backfill is not yet written cannot be reset (the
/// client's view is unknown): it is closed for overflow.
#[tokio::test(start_paused = true)]
async fn a_full_queue_that_cannot_be_reset_is_closed() {
    let rig = Rig::new(4);
    let ids = rig.publish_run(6).await;
    let sub = rig.subscribe(Start::After(ids[0])).await;
    for i in 0..5 {
        rig.publish(&[custom(i)]).await;
    }
    rig.settled().await;
    assert_eq!(closed(&sub.queue).await, CloseReason::Overflow);
    assert_eq!(rig.thread_hub().state.lock().subscribers.len(), 0);
}

/// Entries the tail repeats (after a re-follow) are neither folded nor fanned out again.
#[tokio::test(start_paused = true)]
async fn repeated_tail_entries_are_skipped() {
    let rig = Rig::new(100);
    let ids = rig
        .publish(&[run_started(&rig.thread), text_start(), text_content("ab")])
        .await;
    let sub = rig.subscribe(Start::After(ids[0])).await;
    assert_eq!(
        ids_of(&read_until(&sub.queue, ids[2]).await),
        id_texts(&ids[1..])
    );
    let entries = rig
        .log
        .read(&rig.thread, ReadFrom::Start, 100)
        .await
        .unwrap();
    rig.log
        .inject(TailItem::Entries {
            thread: rig.thread.clone(),
            entries,
        })
        .await;
    let next = rig.publish(&[text_content("c")]).await;
    assert_eq!(ids_of(&next_events(&sub.queue).await), id_texts(&next));
    let th = rig.thread_hub();
    let st = th.state.lock();
    assert_eq!(st.cursor, next[0].pos);
    let messages = st.fold.as_ref().unwrap().fold().messages();
    assert_eq!(messages[0]["content"], "abc", "folded once");
}

/// A tail that fell behind retention (trimmed, same epoch) resets every subscriber to the
/// fold at the log's head: a bridge instead of what was pending.
#[tokio::test(start_paused = true)]
async fn a_tail_behind_retention_resets_subscribers_to_the_head() {
    let rig = Rig::new(100);
    rig.publish_run(1).await;
    let sub = rig.subscribe(Start::Live).await;
    let ids = rig.publish(&[custom(2), custom(3), custom(4)]).await;
    rig.settled().await;
    assert_eq!(sub.queue.pending().0, 3);
    let head = rig.log.head(&rig.thread).await.unwrap();
    rig.log
        .inject(TailItem::Discontinuity {
            thread: rig.thread.clone(),
            head,
            reason: ResumeGap::Trimmed,
        })
        .await;
    tokio::time::timeout(WAIT, async {
        while !sub.queue.reset_pending() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the subscriber is reset");
    let bridge = next_events(&sub.queue).await;
    assert_eq!(
        bridge.last().unwrap().id,
        Some(ids.last().unwrap().to_string())
    );
    assert!(
        bridge.iter().any(|e| e.event_type() == "MESSAGES_SNAPSHOT"),
        "{bridge:?}"
    );
    assert!(rig.log.follows(&rig.thread));
}

/// A discontinuity that is not a trim in the same epoch (a recreated log) ends the thread's
/// streams and stops following it.
#[tokio::test(start_paused = true)]
async fn a_recreated_log_ends_the_streams() {
    let rig = Rig::new(100);
    rig.publish_run(1).await;
    let a = rig.subscribe(Start::Live).await;
    let b = rig.subscribe(Start::Live).await;
    let mut head = rig.log.head(&rig.thread).await.unwrap();
    head.epoch = Epoch(head.epoch.0.wrapping_add(1));
    rig.log
        .inject(TailItem::Discontinuity {
            thread: rig.thread.clone(),
            head,
            reason: ResumeGap::OtherEpoch,
        })
        .await;
    assert_eq!(closed(&a.queue).await, CloseReason::Discontinuity);
    assert_eq!(closed(&b.queue).await, CloseReason::Discontinuity);
    assert_eq!(rig.hub.followed_threads(), 0);
    assert!(!rig.log.follows(&rig.thread));
}

/// A log event that breaks the order rules (order checks off, or a direct `XADD`) is logged at
/// the thread's 1st, 2nd, 4th, ... such event, not at every one: 100 of them make 7 lines.
#[tokio::test(start_paused = true)]
async fn refused_log_events_are_logged_sparsely() {
    use std::sync::Mutex as StdMutex;
    #[derive(Clone, Default)]
    struct Lines(Arc<StdMutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            // A poisoned lock only means another write panicked: the bytes are still whole.
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let rig = Rig::new(1000);
    rig.publish_run(0).await;
    let sub = rig.subscribe(Start::Live).await;
    // Content for a message that was never started, 100 times.
    let mut last = None;
    for i in 0..100 {
        last = rig.publish(&[text_content(&format!("{i}"))]).await.pop();
    }
    read_until(&sub.queue, last.expect("appended")).await;
    let text = String::from_utf8(lines.0.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .expect("UTF-8 log lines");
    let logged = text
        .lines()
        .filter(|l| l.contains("breaks the AG-UI order rules"))
        .count();
    assert_eq!(logged, 7, "{text}");
}
