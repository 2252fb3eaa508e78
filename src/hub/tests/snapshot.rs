//! The snapshot document: from the hub's fold when followed, else rebuilt from the log.

use super::*;
use crate::fold::ThreadFold;
use crate::fold::prelude;

/// Unfollowed, the snapshot is rebuilt from the log; followed, it is the hub's own fold (no
/// log read) and the same document.
#[tokio::test(start_paused = true)]
async fn a_followed_threads_snapshot_is_the_hubs_fold() {
    let rig = Rig::new(100);
    let ids = rig
        .publish(&[
            run_started(&rig.thread),
            json!({"type": "STATE_SNAPSHOT", "snapshot": {"n": 1}}),
            json!({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}),
            json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hi"}),
        ])
        .await;
    let rebuilt = rig.hub.snapshot(&rig.thread).await.unwrap().unwrap();
    assert_eq!(rebuilt["lastEventId"], ids.last().unwrap().to_string());
    assert_eq!(rebuilt["state"], json!({"n": 1}));
    assert_eq!(rebuilt["messages"][0]["content"], "hi");
    assert_eq!(rebuilt["run"]["status"], "running");
    assert_eq!(rebuilt["run"]["started"], run_started(&rig.thread));

    let sub = rig.subscribe(Start::Live).await;
    rig.settled().await;
    rig.log
        .fail_reads(Some(LogError::Unavailable("down".into())));
    assert_eq!(
        rig.hub.snapshot(&rig.thread).await.unwrap().unwrap(),
        rebuilt
    );
    drop(sub);
    assert!(matches!(
        rig.hub.snapshot(&rig.thread).await,
        Err(LogError::Unavailable(_))
    ));
}

/// A thread with no events has no `lastEventId`; a trimmed log without checkpoint has no
/// snapshot at all.
#[tokio::test(start_paused = true)]
async fn empty_and_unrebuildable_threads() {
    let rig = Rig::new(100);
    let empty = rig.hub.snapshot(&rig.thread).await.unwrap().unwrap();
    assert_eq!(
        empty,
        json!({"lastEventId": null, "state": {}, "messages": [], "run": null})
    );
    let trimmed = Rig::with_retention(100, 3);
    trimmed.publish_run(10).await;
    assert_eq!(trimmed.hub.snapshot(&trimmed.thread).await.unwrap(), None);
}

/// A fold rebuilt from a checkpoint (a prelude with a marked `RUN_STARTED`) gives the
/// producer's `RUN_STARTED`, followed or not.
#[tokio::test(start_paused = true)]
async fn a_checkpointed_thread_gives_the_producers_run_started() {
    let rig = Rig::new(100);
    let mut fold = ThreadFold::new();
    let started = json!({
        "type": "RUN_STARTED", "threadId": rig.thread.as_str(), "runId": "r1",
        "metadata": {"mine": 1}
    });
    for batch in [vec![started.clone()], vec![custom(1)], vec![custom(2)]] {
        for e in &batch {
            fold.apply_logged(e).unwrap();
        }
        let candidate = serde_json::to_vec(&prelude::prelude(&fold)).unwrap();
        let head = rig.log.head(&rig.thread).await.unwrap();
        let extras = AppendExtras {
            candidate: Some(candidate.into()),
            ..AppendExtras::default()
        };
        rig.log
            .append_if(&rig.thread, &rig.valid(&batch), head, extras)
            .await
            .unwrap();
    }
    let head = rig.log.head(&rig.thread).await.unwrap();
    assert!(
        !head.complete_from_start(),
        "the first entries were trimmed"
    );
    let rebuilt = rig.hub.snapshot(&rig.thread).await.unwrap().unwrap();
    assert_eq!(rebuilt["run"]["started"], started);
    let _sub = rig.subscribe(Start::Live).await;
    let followed = rig.hub.snapshot(&rig.thread).await.unwrap().unwrap();
    assert_eq!(followed, rebuilt);
}
