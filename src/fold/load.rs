//! Rebuilding a thread's fold from its log: from the first event when nothing was trimmed,
//! else from the log's checkpoint (a prelude stored with the log, PROTOCOL §6) plus the entries
//! after it.

use super::ThreadFold;
use crate::event::ThreadId;
use crate::log::{
    Checkpoint, Epoch, EventId, EventLog, LogError, LogHead, ReadFrom, ResumeGap, StreamPos,
};
use serde_json::Value;

/// Entries per read while folding.
const PAGE: usize = 512;

/// The thread's fold at its head, and the head it stands for. `None` for the fold when it
/// cannot be rebuilt (trimmed and no checkpoint).
///
/// # Errors
/// [`LogError::Unavailable`].
pub async fn load_fold(
    log: &dyn EventLog,
    thread: &ThreadId,
) -> Result<(LogHead, Option<ThreadFold>), LogError> {
    // A trim or checkpoint promotion between the head and the reads: try again (bounded).
    for _ in 0..4 {
        let head = log.head(thread).await?;
        let (mut fold, from) = if head.complete_from_start() {
            (ThreadFold::new(), ReadFrom::Start)
        } else {
            match log.checkpoint(thread).await? {
                Some(ckpt) if ckpt.pos <= head.last => checkpoint_fold(&ckpt, head.epoch),
                _ => return Ok((head, None)),
            }
        };
        match fold_until(log, thread, &mut fold, from, head).await {
            Ok(()) => return Ok((head, Some(fold))),
            Err(LogError::Gap(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    let head = log.head(thread).await?;
    Ok((head, None))
}

/// The thread's fold at `at` (a position the log holds, or its trimmed bound), for a prelude
/// at a rolled-back id's fork point (PROTOCOL §4.3): from the first event when nothing was
/// trimmed, else from the checkpoint when it is at or before `at`. `None` when it cannot be
/// rebuilt there (trimmed, and no checkpoint at or before `at`).
///
/// # Errors
/// [`LogError::Gap`] when the log moved past `at` meanwhile (another epoch, trimmed past the
/// start of the fold); [`LogError::Unavailable`].
pub async fn load_fold_at(
    log: &dyn EventLog,
    thread: &ThreadId,
    at: EventId,
) -> Result<Option<ThreadFold>, LogError> {
    let head = log.head(thread).await?;
    if head.epoch != at.epoch {
        return Err(ResumeGap::OtherEpoch.into());
    }
    let (mut fold, from) = if head.complete_from_start() {
        // After `0-0` of the epoch rather than from the start: a read the log refuses (a gap)
        // once anything was trimmed, rather than one that starts mid-thread.
        let start = EventId {
            epoch: head.epoch,
            pos: StreamPos::ZERO,
        };
        (ThreadFold::new(), ReadFrom::After(start))
    } else {
        match log.checkpoint(thread).await? {
            Some(ckpt) if ckpt.pos <= at.pos => checkpoint_fold(&ckpt, head.epoch),
            _ => return Ok(None),
        }
    };
    fold_range(log, thread, &mut fold, from, Some(at.pos)).await?;
    Ok(Some(fold))
}

/// The fold of a checkpoint's events, and where the log's entries after it start.
fn checkpoint_fold(ckpt: &Checkpoint, epoch: Epoch) -> (ThreadFold, ReadFrom) {
    let mut fold = ThreadFold::new();
    let events: Vec<Value> = serde_json::from_slice(&ckpt.events).unwrap_or_default();
    for e in &events {
        let _ = fold.apply_logged(e);
    }
    let id = EventId {
        epoch,
        pos: ckpt.pos,
    };
    (fold, ReadFrom::After(id))
}

/// Folds entries from `from` up to `head.last` (later ones are left for the caller's tail).
async fn fold_until(
    log: &dyn EventLog,
    thread: &ThreadId,
    fold: &mut ThreadFold,
    from: ReadFrom,
    head: LogHead,
) -> Result<(), LogError> {
    fold_range(log, thread, fold, from, Some(head.last))
        .await
        .map(|_| ())
}

/// Folds what was appended after `head` into `fold`, to the end of the log, and returns the
/// new head position and the number of entries folded.
///
/// # Errors
/// [`LogError::Gap`] when the log was trimmed past `head` or recreated meanwhile (reload the
/// fold then); [`LogError::Unavailable`].
pub async fn catch_up(
    log: &dyn EventLog,
    thread: &ThreadId,
    fold: &mut ThreadFold,
    mut head: LogHead,
) -> Result<(LogHead, usize), LogError> {
    let from = match head.last_id() {
        Some(id) => ReadFrom::After(id),
        None => ReadFrom::Start,
    };
    let (last, folded) = fold_range(log, thread, fold, from, None).await?;
    if let Some(last) = last {
        head.epoch = last.epoch;
        head.last = last.pos;
    }
    Ok((head, folded))
}

/// Folds entries from `from`, up to `until` when given (else to the end of the log); returns
/// the id of the last entry folded and how many were folded.
async fn fold_range(
    log: &dyn EventLog,
    thread: &ThreadId,
    fold: &mut ThreadFold,
    mut from: ReadFrom,
    until: Option<StreamPos>,
) -> Result<(Option<EventId>, usize), LogError> {
    let mut folded = None;
    let mut count = 0;
    loop {
        if let (ReadFrom::After(id), Some(until)) = (from, until)
            && id.pos >= until
        {
            return Ok((folded, count));
        }
        let page = log.read(thread, from, PAGE).await?;
        let Some(last) = page.last().map(|e| e.id) else {
            return Ok((folded, count));
        };
        for e in page.iter().filter(|e| until.is_none_or(|u| e.id.pos <= u)) {
            if let Ok(v) = serde_json::from_slice::<Value>(&e.json) {
                let _ = fold.apply_logged(&v);
            }
            folded = Some(e.id);
            count += 1;
        }
        if page.len() < PAGE || until.is_some_and(|u| last.pos >= u) {
            return Ok((folded, count));
        }
        from = ReadFrom::After(last);
    }
}
