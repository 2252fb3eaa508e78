//! One case run end to end: the thread generated, published in batches, and the simulated
//! clients drained on the case's schedule; `run_case` runs it on a fresh runtime.

use crate::client::*;
use crate::generator::*;
use agui_fanout::event::{ThreadId, ValidEvent, validate_value};
use agui_fanout::fold::ThreadFold;
use agui_fanout::hub::{Hub, Start};
use agui_fanout::ingest::Ingest;
use agui_fanout::log::memory::MemoryLog;
use agui_fanout::log::{EventId, EventLog, Retention};
use agui_fanout::queue::QueueLimits;
use serde_json::Value;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Waits until the hub fanned out everything up to `head`.
pub(crate) async fn settle(
    hub: &Hub,
    thread: &ThreadId,
    head: Option<EventId>,
) -> Result<(), String> {
    let want = head
        .map(|h| Value::String(h.to_string()))
        .unwrap_or(Value::Null);
    for _ in 0..10_000 {
        let snap = hub
            .snapshot(thread)
            .await
            .map_err(|e| format!("snapshot: {e}"))?
            .ok_or("no fold for the snapshot")?;
        if snap["lastEventId"] == want {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
    Err(format!("the hub never reached {want}"))
}

pub(crate) async fn simulate(case: &Case) -> Result<Stats, String> {
    let thread_name = "props-thread";
    let thread = ThreadId::parse(thread_name).expect("valid thread id");
    let mut gch = Choices::new(&case.script);
    let events =
        Gen::new(&mut gch, thread_name, case.variant != Variant::Strict).generate(case.n_events);

    let log = Arc::new(MemoryLog::new(Retention {
        max_events: case.retention,
        max_age: None,
        idle_ttl: None,
    }));
    let dyn_log: Arc<dyn EventLog> = log.clone();
    let strict = case.variant != Variant::NonStrict;
    let ingest = Ingest::new(dyn_log.clone(), strict, case.retention);
    let limits = QueueLimits {
        max_events: case.max_events,
        max_bytes: case.max_bytes,
    };
    let stop = CancellationToken::new();
    let hub = Hub::start(dyn_log.clone(), limits, stop.clone());
    // As the server does: the fan-out takes this node's parsed values (`hub/ahead.rs`).
    ingest.hand_values_to(Arc::new(hub.clone()));

    let mut stats = Stats::default();
    let mut truth = Truth::new();
    let mut ch = Choices::new(&case.sched);

    // Publish steps: batches of consecutive events (a failing delta in `Mixed` goes alone, to
    // the log directly, once the thread has a checkpoint candidate; before that it is dropped:
    // it changes nothing).
    let mut steps: Vec<(Vec<GenEvent>, bool)> = Vec::new();
    let mut ingested = 0usize;
    let mut i = 0;
    while i < events.len() {
        let size = match ch.weighted(&[6, 3, 1]) {
            0 => 1,
            1 => 2 + ch.below(3),
            _ => 5 + ch.below(12),
        };
        // The publish path refuses batches over 2 × `retention.max_events`.
        let size = match case.retention {
            0 => size,
            r => size.min(2 * r),
        };
        let mut batch = Vec::new();
        while i < events.len() && batch.len() < size {
            let e = &events[i];
            if e.failing && case.variant == Variant::Mixed {
                if !batch.is_empty() {
                    break;
                }
                i += 1;
                if case.retention > 0 && ingested >= case.retention {
                    steps.push((vec![e.clone()], true));
                }
                continue;
            }
            batch.push(e.clone());
            ingested += 1;
            i += 1;
        }
        if !batch.is_empty() {
            steps.push((batch, false));
        }
    }
    stats.events = steps.iter().map(|(b, _)| b.len()).sum();
    stats.failing_deltas = steps
        .iter()
        .flat_map(|(b, _)| b)
        .filter(|e| e.failing)
        .count();

    let n_steps = steps.len();
    let mut clients: Vec<Client> = case
        .subs
        .iter()
        .enumerate()
        .map(|(n, cfg)| Client {
            n,
            cfg: cfg.clone(),
            sub: None,
            conn_first: true,
            conn_last: None,
            last_coalesced: false,
            conn_prelude: false,
            conn_epoch_start: false,
            fold: ThreadFold::new(),
            last: None,
            bridge_mark: false,
            connected_once: false,
            reconnect_at: cfg.join_pct * n_steps / 100,
            reconnect: Reconnect::NoId,
            next_drain: 0,
            log: Vec::new(),
        })
        .collect();

    for (step, (batch, direct)) in steps.iter().enumerate() {
        let settle_first = ch.chance(70);
        // Publish.
        let valid: Vec<ValidEvent> = batch
            .iter()
            .map(|e| validate_value(e.value.clone(), Some(&thread)))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("generator bug: schema: {e}"))?;
        let ids = if *direct {
            dyn_log
                .append(&thread, &valid)
                .await
                .map_err(|e| e.to_string())?
        } else {
            ingest
                .append(&thread, &valid, None)
                .await
                .map_err(|e| format!("publish refused: {e} (batch {batch:?})"))?
                .ids
        };
        for (id, ev) in ids.iter().zip(&valid) {
            truth.push(*id, ev)?;
        }
        if settle_first {
            settle(&hub, &thread, truth.head()).await?;
        }
        // Joins and reconnects (possibly while the hub has not fanned the batch out yet).
        for c in clients.iter_mut() {
            if c.sub.is_none() && step >= c.reconnect_at {
                let start = if !c.connected_once && c.cfg.from_start {
                    Start::FromStart
                } else {
                    c.start_for(c.reconnect, &truth)
                };
                c.connect(&hub, &thread, &truth, start, settle_first, &mut stats)
                    .await?;
                c.next_drain = step;
            }
        }
        settle(&hub, &thread, truth.head()).await?;
        // (c) Bounded live buffers.
        let bound = case.max_bytes + truth.max_prelude + 4096;
        for c in &clients {
            if let Some(sub) = &c.sub {
                let (frames, bytes) = sub.queue.pending();
                stats.max_live_frames = stats.max_live_frames.max(frames);
                // One bridge may wait on top of what the limits allow.
                if frames > case.max_events + 1 || bytes > bound {
                    return Err(c.fail(format!(
                        "(c) live buffer holds {frames} frames, {bytes} bytes (limits {} frames, {} bytes, bridge bound {})",
                        case.max_events, case.max_bytes, truth.max_prelude + 4096
                    )));
                }
            }
        }
        // Drains.
        for c in clients.iter_mut() {
            if c.sub.is_some() && step >= c.next_drain {
                let full = ch.weighted(&[3, 1]) == 0;
                c.drain(full, step, &mut ch, &truth, &mut stats).await?;
                c.next_drain = step + c.cfg.speed;
                if ch.chance(c.cfg.stall_pct) {
                    c.next_drain += c.cfg.stall_len;
                }
            }
        }
        // Disconnects.
        for c in clients.iter_mut() {
            if c.sub.is_some() && ch.chance(c.cfg.disconnect_pct) {
                let how = match ch.weighted(&[7, 2, 1]) {
                    0 => Reconnect::LastId,
                    1 => Reconnect::NoId,
                    _ => Reconnect::Bogus,
                };
                let offline = ch.below(c.cfg.offline + 1);
                c.disconnect(step, offline, how, "client");
            }
        }
    }

    // Publishing is over: everyone (re)connects and catches up with the head (uncut).
    settle(&hub, &thread, truth.head()).await?;
    let mut no_cuts = Choices::new(&[]);
    for round in 0..8 {
        if round >= 4 {
            // (On a multi-threaded runtime, backfill tasks may need a moment.)
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        for c in clients.iter_mut() {
            if c.sub.is_none() {
                let start = if !c.connected_once && c.cfg.from_start {
                    Start::FromStart
                } else {
                    c.start_for(Reconnect::LastId, &truth)
                };
                c.connect(&hub, &thread, &truth, start, true, &mut stats)
                    .await?;
            }
            c.drain(true, n_steps + round, &mut no_cuts, &truth, &mut stats)
                .await?;
        }
    }
    for c in &clients {
        if c.sub.is_none() || c.last != truth.head() {
            return Err(c.fail(format!(
                "(a) did not reach the head {:?} (at {:?}, connected {})",
                truth.head().map(|i| i.to_string()),
                c.last.map(|i| i.to_string()),
                c.sub.is_some()
            )));
        }
    }
    let head = dyn_log.head(&thread).await.map_err(|e| e.to_string())?;
    stats.trimmed = head.max_deleted.seq as usize;
    drop(clients);
    stop.cancel();
    Ok(stats)
}

pub(crate) fn run_case(case: &Case) -> Result<Stats, String> {
    if std::env::var_os("HUNT_MT").is_some() {
        // Exploration on two worker threads (the hub, tails and backfills run in parallel).
        return tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(simulate(case));
    }
    // Paused time: nothing here waits on a socket, so the runtime's clock jumps over every
    // sleep once all tasks are idle.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(simulate(case))
}
