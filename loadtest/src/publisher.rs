//! Publishers: open-loop publishing at a target rate (a scheduler issues each event at its
//! due time, whatever the broker's replies do), or closed-loop (`rate` 0: every connection
//! publishes as fast as the broker answers).
//!
//! Each thread is published by one keep-alive connection only (thread `t` by connection
//! `t % conns`), so its events are appended in sequence order. When a connection falls behind,
//! the events due for one thread go out together as one JSON-array `POST` (up to `max_batch`),
//! which keeps the offered rate; `lag` (send time minus due time) shows how far behind the
//! publisher ran. Sequence numbers are given at send time and only advance on a `2xx`, so a
//! refused or failed `POST` leaves no hole in the sequence.
//!
//! Any `2xx` counts as an acknowledgement: agui-fanout answers `200`, nchan `201` (a
//! subscriber was there) or `202` (none). With `max_batch` 1 every `POST` carries one bare
//! event object, never an array, for brokers that store a body as one message (nchan).

use crate::net::{HttpConn, Sources, Target};
use crate::payload::{EventWriter, unix_ns};
use crate::stats;
use bytes::Bytes;
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Consecutive failures of one batch after which it is given up.
const MAX_ATTEMPTS: u32 = 5;

/// A thread being published to.
#[derive(Debug)]
pub struct ThreadPub {
    /// Its id.
    pub name: String,
    /// The publish path.
    pub path: String,
    /// Events acknowledged (also the next sequence number).
    pub acked: AtomicU64,
    /// Events sent, acknowledged or in flight (the next number to give).
    pub sent: AtomicU64,
}

/// How to publish.
#[derive(Clone, Debug)]
pub struct PubConfig {
    /// Parallel keep-alive connections.
    pub conns: usize,
    /// Most events in one `POST`.
    pub max_batch: u64,
    /// Builds the events.
    pub writer: EventWriter,
    /// Stamp each event with its due time rather than the send time (`--latency-from due`).
    pub stamp_due: bool,
}

/// What the publishers did in one step.
#[derive(Debug)]
pub struct PubStats {
    /// `POST`s answered `2xx`.
    pub posts: u64,
    /// Events acknowledged.
    pub acked: u64,
    /// Answers other than `2xx`, by status.
    pub status_errors: BTreeMap<u16, u64>,
    /// Transport errors (connect, reset, ...).
    pub transport_errors: u64,
    /// The first error seen.
    pub first_error: Option<String>,
    /// Events given up (batch failed [`MAX_ATTEMPTS`] times, or still queued at the deadline).
    pub abandoned: u64,
    /// Send time minus due time, µs (open loop only).
    pub lag: Histogram<u64>,
    /// `POST` round trip, µs.
    pub post_latency: Histogram<u64>,
    /// When the last connection finished.
    pub finished: Option<Instant>,
}

impl Default for PubStats {
    fn default() -> Self {
        PubStats {
            posts: 0,
            acked: 0,
            status_errors: BTreeMap::new(),
            transport_errors: 0,
            first_error: None,
            abandoned: 0,
            lag: stats::histogram(),
            post_latency: stats::histogram(),
            finished: None,
        }
    }
}

impl PubStats {
    fn merge(&mut self, other: PubStats) {
        self.posts += other.posts;
        self.acked += other.acked;
        for (k, v) in other.status_errors {
            *self.status_errors.entry(k).or_default() += v;
        }
        self.transport_errors += other.transport_errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.abandoned += other.abandoned;
        let _ = self.lag.add(&other.lag);
        let _ = self.post_latency.add(&other.post_latency);
        self.finished = self.finished.max(other.finished);
    }

    /// Failed `POST`s of any kind.
    pub fn errors(&self) -> u64 {
        self.transport_errors + self.status_errors.values().sum::<u64>()
    }
}

/// Publishes one `RUN_STARTED` (or any opening body) to every thread, `conns` at a time.
///
/// # Errors
/// The first thread whose opening event is refused or cannot be sent (after 3 tries).
pub async fn open_threads(
    target: &Target,
    sources: &Sources,
    threads: &[Arc<ThreadPub>],
    conns: usize,
    body: impl Fn(&ThreadPub) -> Vec<u8>,
) -> anyhow::Result<()> {
    let conns = conns.clamp(1, threads.len().max(1));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..conns {
        let mine: Vec<(Arc<ThreadPub>, Bytes)> = threads
            .iter()
            .skip(c)
            .step_by(conns)
            .map(|t| (t.clone(), Bytes::from(body(t))))
            .collect();
        let target = target.clone();
        let source = sources.pick();
        tasks.spawn(async move {
            let mut conn: Option<HttpConn> = None;
            for (t, body) in mine {
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    if conn.is_none() {
                        conn = Some(HttpConn::open(&target, source).await?);
                    }
                    let Some(c) = conn.as_mut() else { continue };
                    match c.post_json(&t.path, body.clone()).await {
                        Ok(r) if is_success(r.status) => break,
                        Ok(r) => anyhow::bail!(
                            "opening thread {}: HTTP {} {}",
                            t.name,
                            r.status,
                            String::from_utf8_lossy(&r.body)
                        ),
                        Err(e) if attempt < 3 => {
                            conn = None;
                            tracing_warn(&format!("opening thread {}: {e:#}; retrying", t.name));
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(e) => return Err(e.context(format!("opening thread {}", t.name))),
                    }
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// Whether a publish answer acknowledges the events: any `2xx`.
fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

fn tracing_warn(msg: &str) {
    eprintln!("warning: {msg}");
}

/// One job of the open-loop scheduler: an event due for a thread.
#[derive(Clone, Copy, Debug)]
struct Job {
    thread: usize,
    due: Instant,
}

/// Publishes for `duration`: open loop at `rate` events/s (spread round-robin over the
/// threads), or closed loop when `rate` is 0. Connections stop at `deadline` whatever is still
/// queued (counted as abandoned). Each thread's `acked` advances as events are acknowledged.
pub async fn run(
    target: &Target,
    sources: &Sources,
    threads: &[Arc<ThreadPub>],
    cfg: &PubConfig,
    rate: f64,
    duration: Duration,
    deadline: Instant,
) -> PubStats {
    let conns = cfg.conns.clamp(1, threads.len().max(1));
    let start = Instant::now();
    let stop_at = start + duration;
    let mut txs = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..conns {
        let mine: Vec<Arc<ThreadPub>> = threads.iter().skip(c).step_by(conns).cloned().collect();
        let target = target.clone();
        let source = sources.pick();
        let cfg = cfg.clone();
        if rate > 0.0 {
            let (tx, rx) = mpsc::unbounded_channel();
            txs.push(tx);
            tasks.spawn(open_loop_conn(
                target, source, mine, conns, cfg, rx, deadline,
            ));
        } else {
            tasks.spawn(closed_loop_conn(target, source, mine, cfg, stop_at));
        }
    }
    if rate > 0.0 {
        let total = (rate * duration.as_secs_f64()).round() as u64;
        let mut issued = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while issued < total {
            tick.tick().await;
            let due_now = ((start.elapsed().as_secs_f64() * rate) as u64 + 1).min(total);
            while issued < due_now {
                let thread = (issued % threads.len() as u64) as usize;
                let due = start + Duration::from_secs_f64(issued as f64 / rate);
                let _ = txs[thread % conns].send(Job { thread, due });
                issued += 1;
            }
        }
        drop(txs);
    }
    let mut out = PubStats::default();
    while let Some(r) = tasks.join_next().await {
        if let Ok(s) = r {
            out.merge(s);
        }
    }
    out
}

/// The events one `POST` carries: how many, and when each was due (open loop; empty for
/// closed loop).
struct Next {
    count: u64,
    dues: Vec<Instant>,
}

/// Sends `batch.count` events of `t` (numbered from its `acked`) in one `POST`; advances
/// `acked` on success. Returns whether it succeeded.
async fn send(
    conn: &mut Option<HttpConn>,
    target: &Target,
    source: Option<std::net::IpAddr>,
    t: &ThreadPub,
    batch: Next,
    cfg: &PubConfig,
    stats: &mut PubStats,
) -> bool {
    let Next { count: n, dues } = batch;
    let first = t.acked.load(Ordering::Relaxed);
    t.sent.store(first + n, Ordering::Relaxed);
    if conn.is_none() {
        match HttpConn::open(target, source).await {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                stats.transport_errors += 1;
                stats.first_error.get_or_insert_with(|| format!("{e:#}"));
                t.sent.store(first, Ordering::Relaxed);
                return false;
            }
        }
    }
    let Some(c) = conn.as_mut() else { return false };
    let now_ns = unix_ns();
    // Each event stamped with its own due time (`--latency-from due`), else the send time.
    let stamps: Vec<u64> = if cfg.stamp_due && dues.len() as u64 == n {
        dues.iter()
            .map(|due| {
                now_ns.saturating_sub(due.elapsed().as_nanos().try_into().unwrap_or(u64::MAX))
            })
            .collect()
    } else {
        vec![now_ns; n as usize]
    };
    let body = Bytes::from(cfg.writer.batch_stamped(&t.name, first, &stamps));
    let sent_at = Instant::now();
    match c.post_json(&t.path, body).await {
        Ok(r) if is_success(r.status) => {
            stats::record(
                &mut stats.post_latency,
                sent_at.elapsed().as_micros() as u64,
            );
            t.acked.store(first + n, Ordering::Relaxed);
            stats.posts += 1;
            stats.acked += n;
            true
        }
        Ok(r) => {
            *stats.status_errors.entry(r.status).or_default() += 1;
            stats.first_error.get_or_insert_with(|| {
                format!(
                    "HTTP {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body[..r.body.len().min(300)])
                )
            });
            t.sent.store(first, Ordering::Relaxed);
            false
        }
        Err(e) => {
            stats.transport_errors += 1;
            stats.first_error.get_or_insert_with(|| format!("{e:#}"));
            *conn = None;
            t.sent.store(first, Ordering::Relaxed);
            false
        }
    }
}

/// One open-loop connection: sends the jobs it is given, batching a thread's backlog.
async fn open_loop_conn(
    target: Target,
    source: Option<std::net::IpAddr>,
    threads: Vec<Arc<ThreadPub>>,
    conns: usize,
    cfg: PubConfig,
    mut rx: mpsc::UnboundedReceiver<Job>,
    deadline: Instant,
) -> PubStats {
    let mut stats = PubStats::default();
    let mut conn: Option<HttpConn> = None;
    // Per local thread index: due times of queued events; threads with a backlog, in order.
    let mut pending: HashMap<usize, VecDeque<Instant>> = HashMap::new();
    let mut ready: VecDeque<usize> = VecDeque::new();
    let mut closed = false;
    let mut attempts = 0u32;
    let add =
        |job: Job, pending: &mut HashMap<usize, VecDeque<Instant>>, ready: &mut VecDeque<usize>| {
            let local = job.thread / conns;
            let q = pending.entry(local).or_default();
            if q.is_empty() {
                ready.push_back(local);
            }
            q.push_back(job.due);
        };
    loop {
        if ready.is_empty() {
            if closed {
                break;
            }
            match rx.recv().await {
                Some(j) => add(j, &mut pending, &mut ready),
                None => {
                    closed = true;
                    continue;
                }
            }
        }
        loop {
            match rx.try_recv() {
                Ok(j) => add(j, &mut pending, &mut ready),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if Instant::now() >= deadline {
            stats.abandoned += pending.values().map(|q| q.len() as u64).sum::<u64>();
            // Drain what the scheduler may still send.
            while let Some(_j) = rx.recv().await {
                stats.abandoned += 1;
            }
            break;
        }
        let Some(local) = ready.pop_front() else {
            continue;
        };
        let Some(q) = pending.get_mut(&local) else {
            continue;
        };
        let n = (q.len() as u64).min(cfg.max_batch.max(1));
        let t = &threads[local];
        let send_at = Instant::now();
        let next = Next {
            count: n,
            dues: q.iter().take(n as usize).copied().collect(),
        };
        if send(&mut conn, &target, source, t, next, &cfg, &mut stats).await {
            attempts = 0;
            for due in q.drain(..n as usize) {
                stats::record(
                    &mut stats.lag,
                    send_at.saturating_duration_since(due).as_micros() as u64,
                );
            }
            if !q.is_empty() {
                ready.push_back(local);
            }
        } else {
            attempts += 1;
            if attempts >= MAX_ATTEMPTS {
                attempts = 0;
                q.drain(..n as usize);
                stats.abandoned += n;
                if !q.is_empty() {
                    ready.push_back(local);
                }
            } else {
                ready.push_front(local);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    stats.finished = Some(Instant::now());
    stats
}

/// One closed-loop connection: its threads in turn, `max_batch` events per `POST`, until
/// `stop_at`.
async fn closed_loop_conn(
    target: Target,
    source: Option<std::net::IpAddr>,
    threads: Vec<Arc<ThreadPub>>,
    cfg: PubConfig,
    stop_at: Instant,
) -> PubStats {
    let mut stats = PubStats::default();
    let mut conn: Option<HttpConn> = None;
    let mut i = 0usize;
    while Instant::now() < stop_at && !threads.is_empty() {
        let t = &threads[i % threads.len()];
        i += 1;
        if !send(
            &mut conn,
            &target,
            source,
            t,
            Next {
                count: cfg.max_batch.max(1),
                dues: Vec::new(),
            },
            &cfg,
            &mut stats,
        )
        .await
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    stats.finished = Some(Instant::now());
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_2xx_acknowledges() {
        // agui-fanout: 200; nchan: 201 (subscribers present) or 202 (none).
        for ok in [200, 201, 202, 204] {
            assert!(is_success(ok), "{ok}");
        }
        for bad in [199, 300, 304, 409, 503] {
            assert!(!is_success(bad), "{bad}");
        }
    }
}
