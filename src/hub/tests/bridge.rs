//! Reset bridges: built on the writer's time, from what the client was given to the hub's
//! fold at the newest id; or, when none can be built, a close.

use super::*;
use crate::fold::ThreadFold;
use crate::hub::bridge::Bridges;
use crate::log::ResumeId;
use crate::queue::BridgeSource;
use std::sync::Weak;

fn fold_into(client: &mut ThreadFold, events: &[Sse]) {
    for e in events {
        client
            .apply_logged(&e.data)
            .expect("the stream keeps the order rules");
    }
}

/// The client's fold equals the hub's (the snapshot's state and messages).
async fn assert_caught_up(rig: &Rig, client: &ThreadFold) {
    let truth = rig.hub.snapshot(&rig.thread).await.unwrap().unwrap();
    assert_eq!(client.fold().state(), &truth["state"]);
    assert_eq!(
        client.fold().messages(),
        truth["messages"].as_array().unwrap().as_slice()
    );
}

/// After a reset the writer's next batch is a bridge from what the client was last given to
/// the fold at the newest id; what is appended afterwards follows it.
#[tokio::test(start_paused = true)]
async fn the_bridge_after_a_reset_brings_the_client_to_the_fold_at_the_newest_id() {
    let rig = Rig::new(4);
    rig.publish(&[
        run_started(&rig.thread),
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"n": 0}}),
    ])
    .await;
    let sub = rig.subscribe(Start::Live).await;
    let mut client = ThreadFold::new();
    fold_into(&mut client, &parse(&sub.prelude.as_ref().unwrap().bytes));
    // The client reads one event, then stops reading.
    let given = rig.publish(&[custom(0)]).await;
    fold_into(&mut client, &next_events(&sub.queue).await);
    let burst: Vec<Value> = (1..=6).map(custom).collect();
    rig.publish(&burst).await;
    rig.settled().await;
    assert!(sub.queue.reset_pending());
    // The thread moves on while the client does not read.
    let newest = rig
        .publish(&[
            json!({"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/n", "value": 5}]}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hi"}),
        ])
        .await;
    rig.settled().await;
    assert!(sub.queue.reset_pending(), "built on the writer's time only");

    let bridge = next_events(&sub.queue).await;
    assert!(bridge.len() > 1, "{bridge:?}");
    // A client cut off inside the bridge comes back with the mark, not with `given`.
    assert_eq!(
        bridge[0].id,
        Some(ResumeId::InsideBridge(given[0]).to_string())
    );
    assert_eq!(
        bridge.last().unwrap().id,
        Some(newest.last().unwrap().to_string())
    );
    // It opens with the gap event: the six CUSTOM events dropped are lost for this client.
    assert_eq!(
        bridge[0].data,
        json!({"type": "CUSTOM", "name": "agui-fanout.gap", "value": {
            "reason": "overflow",
            "after": given[0].to_string(),
            "until": newest.last().unwrap().to_string(),
            "skipped": 6,
            "skippedTypes": {"CUSTOM": 6},
        }})
    );
    assert_eq!(sub.queue.skipped(), Default::default(), "told, so reset");
    fold_into(&mut client, &bridge);
    assert_caught_up(&rig, &client).await;

    // The open message goes on after the bridge.
    let next = rig
        .publish(&[json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": " there"})])
        .await;
    let after = next_events(&sub.queue).await;
    assert_eq!(ids_of(&after), id_texts(&next));
    fold_into(&mut client, &after);
    assert_caught_up(&rig, &client).await;
    assert_eq!(client.fold().messages()[0]["content"], "hi there");
}

/// A thread hub that is gone cannot build a bridge: the queue is closed for overflow.
#[test]
fn without_its_thread_the_queue_is_closed() {
    let limits = QueueLimits {
        max_events: 4,
        max_bytes: 1 << 20,
    };
    let queue = ConnQueue::new(limits, StreamPos::ZERO, false, None);
    Bridges {
        thread: Weak::new(),
    }
    .bridge(&queue);
    assert!(matches!(
        queue.try_drain(),
        Some(Drained::Closed(CloseReason::Overflow))
    ));
}

/// Without the thread's fold (a trimmed log without checkpoint) a reset ends in a close for
/// overflow when the writer comes back.
#[tokio::test(start_paused = true)]
async fn without_a_fold_a_reset_ends_in_a_close() {
    let rig = Rig::with_retention(4, 8);
    rig.publish_run(10).await;
    let sub = rig.subscribe(Start::Live).await;
    assert!(!sub.fold_known);
    let burst: Vec<Value> = (0..6).map(custom).collect();
    rig.publish(&burst).await;
    rig.settled().await;
    assert!(sub.queue.reset_pending());
    assert_eq!(closed(&sub.queue).await, CloseReason::Overflow);
}
