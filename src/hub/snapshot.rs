//! The thread's fold as JSON for `GET /v1/threads/{threadId}/snapshot` (PROTOCOL §2): from the
//! hub's fold when the thread is followed here, else rebuilt from the log.

use super::Hub;
use crate::event::ThreadId;
use crate::fold::prelude;
use crate::fold::{ThreadFold, load_fold};
use crate::log::{Epoch, EventId, LogError, StreamPos};
use serde_json::Value;

impl Hub {
    /// The thread's fold as `{"lastEventId","state","messages","run"}` (PROTOCOL §2 snapshot), from
    /// the hub's fold when the thread is followed here, else rebuilt from the log.
    ///
    /// # Errors
    /// [`LogError::Unavailable`]; `Ok(None)` when the fold cannot be rebuilt (trimmed log
    /// without a checkpoint).
    pub async fn snapshot(&self, thread: &ThreadId) -> Result<Option<Value>, LogError> {
        if let Some(th) = self.followed(thread)
            && th.started.initialized()
        {
            let st = th.state.lock();
            if let (Some(fold), Some(head)) = (&st.fold, st.head) {
                return Ok(Some(snapshot_json(fold, head.epoch, st.cursor)));
            }
        }
        let (head, fold) = load_fold(&*self.shared.log, thread).await?;
        Ok(fold.map(|f| snapshot_json(&f, head.epoch, head.last)))
    }
}

/// The snapshot document of `fold` at `<epoch>-<pos>` (`lastEventId` null at position zero).
fn snapshot_json(fold: &ThreadFold, epoch: Epoch, pos: StreamPos) -> Value {
    let last = (pos != StreamPos::ZERO).then(|| EventId { epoch, pos }.to_string());
    let mut run = fold.fold().run().map(|r| r.to_json());
    // A fold rebuilt from a checkpoint (a prelude, PROTOCOL §6) holds the prelude's marked
    // `RUN_STARTED`: the snapshot gives the producer's event, as for an untrimmed thread.
    if let Some(started) = run.as_mut().and_then(|r| r.get_mut("started")) {
        prelude::unmark_prelude(started);
    }
    serde_json::json!({
        "lastEventId": last,
        "state": fold.fold().state(),
        "messages": fold.fold().messages(),
        "run": run,
    })
}
