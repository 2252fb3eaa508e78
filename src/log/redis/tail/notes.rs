//! The append notes on a Redis Cluster: sharded pub/sub (Redis 7). The append script
//! `SPUBLISH`es each batch on its thread's own shard channel, `<prefix>:{<threadId>}:n` (the
//! slot of the thread's keys, so the note stays on that shard instead of crossing the whole
//! cluster bus as a `PUBLISH` would), and the probe on `<prefix>:probe:{<node id>}:n`. This
//! task keeps one `SSUBSCRIBE` per followed thread (and the probe's) on a cluster connection
//! of its own (RESP3, the redis crate routes each to the channel's shard) and hands the notes
//! to the reader as [`Notice`]s, exactly as the subscriber of a single Redis does
//! (`notify.rs`): the reader applies a note only when it continues its cursor, and reads
//! every followed stream every `block` whatever the notes do.
//!
//! A subscription the cluster ends by itself (its slot migrated: `sunsubscribe` push) is taken
//! again at the next resync; a connection lost, notes coming faster than the reader takes them,
//! or probe notes that stop coming back end the whole connection ([`Notice::Down`]: the reader
//! reads every followed stream) and it is opened again after a pause.

use super::probe::Probe;
use super::{TailShared, backoff};
use crate::event::ThreadId;
use crate::log::redis::notify::{Notice, parse_note, pause, send};
use crate::log::redis::scripts::Keys;
use crate::metrics::BACKEND_ERRORS;
use bytes::Bytes;
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Pushes buffered between the cluster connection and this task; past it pushes are dropped
/// and the connection is ended ([`Notice::Down`]), so memory stays bounded.
const PUSH_QUEUE: usize = 4096;

/// Settings of [`run`].
pub(super) struct NotesConfig {
    /// The RESP3 cluster client for the subscriptions.
    pub client: ClusterClient,
    /// The key prefix (the threads' shard channels).
    pub prefix: String,
    /// Deadline of connecting and of each `SSUBSCRIBE`.
    pub op_timeout: Duration,
    /// Period of the resync of the subscriptions with the follows.
    pub resync_every: Duration,
}

/// Why a connection ended.
enum End {
    Shutdown,
    Lost(&'static str),
}

/// Keeps the node's shard subscriptions in step with its follows until `shutdown`, sending
/// [`Notice::Up`] once a connection is open and [`Notice::Down`] when it ends.
pub(super) async fn run(
    config: NotesConfig,
    shared: Arc<TailShared>,
    probe: Arc<Probe>,
    tx: mpsc::Sender<Notice>,
    shutdown: CancellationToken,
) {
    let mut failures: u32 = 0;
    loop {
        let (push_tx, mut pushes) = mpsc::channel::<PushInfo>(PUSH_QUEUE);
        let overflow = Arc::new(AtomicBool::new(false));
        let sender = {
            let overflow = overflow.clone();
            // Never an error: the redis crate would stop sending pushes for good.
            move |info: PushInfo| {
                if push_tx.try_send(info).is_err() {
                    overflow.store(true, Ordering::SeqCst);
                }
                Ok::<(), redis::aio::SendError>(())
            }
        };
        let cluster_config = ClusterConfig::new()
            .set_connection_timeout(config.op_timeout)
            .set_response_timeout(config.op_timeout)
            .set_push_sender(sender);
        let opened = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            opened = tokio::time::timeout(
                config.op_timeout,
                config.client.get_async_connection_with_config(cluster_config),
            ) => opened,
        };
        let mut conn = match opened {
            Ok(Ok(conn)) => conn,
            other => {
                if let Ok(Err(e)) = other {
                    tracing::debug!(error = %e, "redis cluster notes: connect failed");
                }
                failures = failures.saturating_add(1);
                if pause(&shutdown, backoff(failures)).await {
                    return;
                }
                continue;
            }
        };
        let end = serve(
            &config,
            &mut conn,
            &mut pushes,
            &overflow,
            &shared,
            &probe,
            &tx,
            &shutdown,
        )
        .await;
        drop(conn);
        probe.subscribed(false);
        let why = match end {
            End::Shutdown => return,
            End::Lost(why) => why,
        };
        metrics::counter!(BACKEND_ERRORS, "backend" => "redis", "op" => "notify").increment(1);
        tracing::warn!(
            reason = why,
            "redis cluster append notes lost; the tail reads every stream until resubscribed"
        );
        if !send(&tx, &shutdown, Notice::Down).await {
            return;
        }
        failures = failures.saturating_add(1);
        if pause(&shutdown, backoff(failures)).await {
            return;
        }
        failures = 0;
    }
}

/// One connection: the probe's subscription, [`Notice::Up`], then notes and resyncs until
/// the connection must end.
#[allow(clippy::too_many_arguments)]
async fn serve(
    config: &NotesConfig,
    conn: &mut ClusterConnection,
    pushes: &mut mpsc::Receiver<PushInfo>,
    overflow: &AtomicBool,
    shared: &TailShared,
    probe: &Probe,
    tx: &mpsc::Sender<Notice>,
    shutdown: &CancellationToken,
) -> End {
    if !ssubscribe(conn, &probe.channel, config.op_timeout).await {
        return End::Lost("probe channel not subscribed");
    }
    probe.subscribed(true);
    // Channel → thread, for every thread subscribed.
    let mut subscribed: HashMap<String, ThreadId> = HashMap::new();
    if !sync(
        conn,
        &mut subscribed,
        shared,
        &config.prefix,
        config.op_timeout,
    )
    .await
    {
        return End::Lost("SSUBSCRIBE failed");
    }
    // Appends made before the subscriptions were not announced: the reader reads every
    // followed stream on `Up`.
    if !send(tx, shutdown, Notice::Up).await {
        return End::Shutdown;
    }
    tracing::info!("redis tail subscribed to the cluster's shard channels");
    let mut resync = tokio::time::interval(config.resync_every);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if overflow.load(Ordering::SeqCst) {
            return End::Lost("reader behind the notes");
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return End::Shutdown,
            _ = probe.resubscribe.notified() => return End::Lost("probe notes not coming back"),
            push = pushes.recv() => {
                let Some(push) = push else { return End::Lost("connection closed") };
                match push.kind {
                    PushKind::SMessage => {
                        let Some(payload) = push.data.get(1).and_then(bytes_of) else {
                            continue;
                        };
                        if payload.starts_with(super::PROBE_PREFIX.as_bytes()) {
                            probe.note(&payload);
                            continue;
                        }
                        let Some(note) = parse_note(payload) else { continue };
                        match tx.try_send(Notice::Note(note)) {
                            Ok(()) => {}
                            Err(mpsc::error::TrySendError::Full(_)) => {
                                return End::Lost("reader behind the notes");
                            }
                            Err(mpsc::error::TrySendError::Closed(_)) => return End::Shutdown,
                        }
                    }
                    // The cluster ended a subscription (its slot moved): taken again at the
                    // next resync, on the slot's new shard.
                    PushKind::SUnsubscribe => {
                        let channel = push.data.first().and_then(bytes_of);
                        if let Some(channel) = channel {
                            let channel = String::from_utf8_lossy(&channel).into_owned();
                            if channel == probe.channel {
                                return End::Lost("probe channel unsubscribed");
                            }
                            subscribed.remove(&channel);
                        }
                    }
                    PushKind::Disconnection => return End::Lost("a shard connection closed"),
                    _ => {}
                }
            }
            _ = shared.notes_wake.notified() => {
                if !sync(conn, &mut subscribed, shared, &config.prefix, config.op_timeout).await {
                    return End::Lost("SSUBSCRIBE failed");
                }
            }
            _ = resync.tick() => {
                if !sync(conn, &mut subscribed, shared, &config.prefix, config.op_timeout).await {
                    return End::Lost("SSUBSCRIBE failed");
                }
            }
        }
    }
}

/// Subscribes the followed threads not subscribed yet and unsubscribes the others; false when
/// a command failed.
async fn sync(
    conn: &mut ClusterConnection,
    subscribed: &mut HashMap<String, ThreadId>,
    shared: &TailShared,
    prefix: &str,
    op_timeout: Duration,
) -> bool {
    let followed: HashMap<String, ThreadId> = shared
        .state
        .lock()
        .follows
        .keys()
        .map(|t| (Keys::new(prefix, t).notes, t.clone()))
        .collect();
    let gone: Vec<String> = subscribed
        .keys()
        .filter(|c| !followed.contains_key(*c))
        .cloned()
        .collect();
    for channel in gone {
        subscribed.remove(&channel);
        let unsubscribe = conn.sunsubscribe(&channel);
        if !matches!(
            tokio::time::timeout(op_timeout, unsubscribe).await,
            Ok(Ok(()))
        ) {
            return false;
        }
    }
    for (channel, thread) in followed {
        if subscribed.contains_key(&channel) {
            continue;
        }
        if !ssubscribe(conn, &channel, op_timeout).await {
            return false;
        }
        subscribed.insert(channel, thread);
    }
    true
}

/// `SSUBSCRIBE <channel>` on its shard, under `op_timeout`.
async fn ssubscribe(conn: &mut ClusterConnection, channel: &str, op_timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(op_timeout, conn.ssubscribe(channel)).await,
        Ok(Ok(()))
    )
}

fn bytes_of(v: &Value) -> Option<Bytes> {
    match v {
        Value::BulkString(b) => Some(Bytes::copy_from_slice(b)),
        Value::SimpleString(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        _ => None,
    }
}
