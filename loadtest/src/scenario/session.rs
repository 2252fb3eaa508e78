//! One streaming session: threads opened, subscribers connected, measured steps run and
//! judged, the once-a-second timeline, and what the session leaves when it finishes.

use super::{Ctx, StreamPlan};
use crate::payload::EventWriter;
use crate::procfs::{self, ProcDelta, ProcSample};
use crate::publisher::{self, PubConfig, PubStats, ThreadPub};
use crate::stats::Summary;
use crate::subscriber::{self, Control, Group, Shared, Spec, SubStats};
use anyhow::Result;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Subscriber connection summary.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConnectSummary {
    /// Subscribers started.
    pub requested: usize,
    /// Connected at least once.
    pub connected: usize,
    /// Gave up before connecting.
    pub failed: usize,
    /// Seconds until all had connected or given up.
    pub seconds: f64,
    /// Connections per second.
    pub per_second: f64,
}

/// Broker CPU over a step, per delivered and per published event.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BrokerStep {
    /// CPU and memory over the step.
    pub process: ProcDelta,
    /// User-mode CPU ns per delivered event.
    pub user_ns_per_delivery: f64,
    /// Kernel CPU ns per delivered event.
    pub sys_ns_per_delivery: f64,
    /// Total CPU ns per delivered event.
    pub total_ns_per_delivery: f64,
    /// Total CPU ns per published event.
    pub total_ns_per_publish: f64,
}

/// The publisher's side of a step.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PublishSummary {
    /// Events acknowledged.
    pub acked: u64,
    /// `POST`s acknowledged.
    pub posts: u64,
    /// Acknowledged events per second of publishing.
    pub achieved_rate: f64,
    /// Failed `POST`s (status and transport).
    pub errors: u64,
    /// Failed `POST`s by status.
    pub status_errors: BTreeMap<u16, u64>,
    /// Transport errors.
    pub transport_errors: u64,
    /// The first error.
    pub first_error: Option<String>,
    /// Events given up.
    pub abandoned: u64,
    /// Send time minus due time, µs.
    pub lag: Summary,
    /// `POST` round trip, µs.
    pub post_latency: Summary,
}

/// One measured step.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepResult {
    /// Its name.
    pub label: String,
    /// Offered rate, events/s (0: closed loop).
    pub offered_rate: f64,
    /// Planned publishing seconds.
    pub duration_s: f64,
    /// Actual publishing seconds (until the last acknowledgement).
    pub publish_s: f64,
    /// Seconds waited afterwards for deliveries.
    pub drain_s: f64,
    /// Publishing.
    pub publish: PublishSummary,
    /// Measured events delivered (all subscribers).
    pub delivered: u64,
    /// Delivered per second of publishing.
    pub deliveries_per_s: f64,
    /// Deliveries owed to the counted subscribers.
    pub expected: u64,
    /// Deliveries still missing when the drain ended.
    pub missing: u64,
    /// Restatements (resets) seen by subscribers.
    pub resets: u64,
    /// End-to-end latency of normal subscribers, µs.
    pub latency: Summary,
    /// End-to-end latency of slow subscribers, µs (the `slow` scenario).
    pub latency_slow: Option<Summary>,
    /// The broker, when `--broker-pid` was given.
    pub broker: Option<BrokerStep>,
    /// The load generator itself.
    pub loadgen: ProcDelta,
    /// Whether the rate was sustained (everything delivered, publisher on time, p99 within
    /// the bound, no resets or errors).
    pub sustained: bool,
    /// Why not.
    pub not_sustained: Vec<String>,
}

/// A point of the once-a-second timeline.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TimePoint {
    /// Seconds since the session started.
    pub t_s: f64,
    /// The step running.
    pub step: String,
    /// Events acknowledged so far.
    pub published: u64,
    /// Deliveries so far.
    pub delivered: u64,
    /// Open subscriber connections.
    pub open: usize,
    /// Broker RSS, KiB.
    pub broker_rss_kib: Option<u64>,
    /// Broker CPU over the last interval, cores.
    pub broker_cores: Option<f64>,
    /// Load generator CPU over the last interval, cores.
    pub loadgen_cores: f64,
}

/// A running streaming scenario: threads, subscribers, the measured steps so far.
pub(super) struct Session<'a> {
    ctx: &'a Ctx,
    plan: StreamPlan,
    threads: Vec<Arc<ThreadPub>>,
    pub(super) shared: Arc<Shared>,
    ctl: watch::Sender<Control>,
    handles: Vec<JoinHandle<SubStats>>,
    slow_excluded: bool,
    pub_cfg: PubConfig,
    pub(super) steps: Vec<StepResult>,
    hists: Vec<(String, Histogram<u64>)>,
    step_label: Arc<Mutex<String>>,
    timeline: Arc<Mutex<Vec<TimePoint>>>,
    sampler: Option<JoinHandle<()>>,
    started: Instant,
}

impl<'a> Session<'a> {
    /// Opens the threads (one `RUN_STARTED` each).
    pub(super) async fn new(ctx: &'a Ctx, plan: StreamPlan) -> Result<Session<'a>> {
        let threads: Vec<Arc<ThreadPub>> = (0..plan.threads)
            .map(|i| {
                let name = format!("{}-{i}", ctx.run_id);
                Arc::new(ThreadPub {
                    path: ctx.target.path(&ctx.common.publish_path, &name),
                    name,
                    acked: Default::default(),
                    sent: Default::default(),
                })
            })
            .collect();
        let writer = EventWriter::new(plan.load.mix, plan.load.event_bytes);
        if !ctx.common.no_run_started {
            publisher::open_threads(&ctx.target, &ctx.sources, &threads, 16, |t| {
                writer.open(&t.name)
            })
            .await?;
        }
        let shared = Arc::new(Shared::new(
            ctx.target.clone(),
            ctx.sources.clone(),
            plan.threads,
            ctx.common.connect_concurrency,
            plan.slow_mode,
        ));
        let (ctl, _) = watch::channel(Control::default());
        let pub_cfg = PubConfig {
            conns: plan.load.publish_conns.max(1),
            max_batch: plan.load.max_batch.max(1),
            writer,
            stamp_due: ctx.common.latency_from == crate::LatencyFrom::Due,
        };
        let mut s = Session {
            ctx,
            plan,
            threads,
            shared,
            ctl,
            handles: Vec::new(),
            slow_excluded: false,
            pub_cfg,
            steps: Vec::new(),
            hists: Vec::new(),
            step_label: Arc::new(Mutex::new("connect".into())),
            timeline: Arc::new(Mutex::new(Vec::new())),
            sampler: None,
            started: Instant::now(),
        };
        s.start_sampler();
        Ok(s)
    }

    pub(super) fn set_label(&self, label: &str) {
        *self.step_label.lock().unwrap_or_else(|e| e.into_inner()) = label.to_string();
    }

    /// A task that samples progress, broker and load generator once a second.
    pub(super) fn start_sampler(&mut self) {
        let probe = self.ctx.probe.clone();
        let shared = self.shared.clone();
        let threads = self.threads.clone();
        let label = self.step_label.clone();
        let timeline = self.timeline.clone();
        let quiet = self.ctx.common.quiet;
        let started = self.started;
        self.sampler = Some(tokio::spawn(async move {
            let mut prev_b = probe.sample();
            let mut prev_s = procfs::sample_self();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            tick.tick().await;
            loop {
                tick.tick().await;
                let b = probe.sample();
                let s = procfs::sample_self();
                let point = TimePoint {
                    t_s: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
                    step: label.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                    published: threads
                        .iter()
                        .map(|t| t.acked.load(Ordering::Relaxed))
                        .sum(),
                    delivered: shared.delivered.load(Ordering::Relaxed),
                    open: shared.open.load(Ordering::Relaxed),
                    broker_rss_kib: b.map(|b| b.rss_kib),
                    broker_cores: match (prev_b, b) {
                        (Some(p), Some(b)) => Some(p.delta(&b).cores),
                        _ => None,
                    },
                    loadgen_cores: prev_s.delta(&s).cores,
                };
                if !quiet {
                    eprintln!(
                        "  t={:>5.1}s [{}] published {} delivered {} open {}{} loadgen {:.0}%",
                        point.t_s,
                        point.step,
                        point.published,
                        point.delivered,
                        point.open,
                        match (point.broker_cores, point.broker_rss_kib) {
                            (Some(c), Some(r)) =>
                                format!(" broker {:.0}% {:.1} MiB", c * 100.0, r as f64 / 1024.0),
                            _ => String::new(),
                        },
                        point.loadgen_cores * 100.0
                    );
                }
                timeline
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(point);
                prev_b = b;
                prev_s = s;
            }
        }));
    }

    /// Starts `subs_per_thread` subscribers per thread (the slow share marked) and waits
    /// until each has connected or given up.
    pub(super) async fn connect(&mut self) -> ConnectSummary {
        let t0 = Instant::now();
        let n = self.plan.threads * self.plan.subs_per_thread;
        let share = self.plan.slow_share;
        for i in 0..n {
            let thread = i % self.plan.threads;
            let slow = share > 0.0 && ((i + 1) as f64 * share).floor() > (i as f64 * share).floor();
            let spec = Spec {
                id: i,
                thread,
                path: self
                    .ctx
                    .target
                    .path(&self.ctx.common.subscribe_path, &self.threads[thread].name),
                group: if slow { Group::Slow } else { Group::Normal },
            };
            self.handles.push(tokio::spawn(subscriber::run(
                spec,
                self.shared.clone(),
                self.ctl.subscribe(),
            )));
        }
        loop {
            // A subscriber either connects (and runs on) or ends (gave up, or panicked).
            let ended = self.handles.iter().filter(|h| h.is_finished()).count();
            if self.shared.connected.load(Ordering::Relaxed) + ended >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seconds = t0.elapsed().as_secs_f64();
        let connected = self.shared.connected.load(Ordering::Relaxed);
        ConnectSummary {
            requested: n,
            connected,
            failed: self.shared.failed.load(Ordering::Relaxed),
            seconds,
            per_second: if seconds > 0.0 {
                connected as f64 / seconds
            } else {
                0.0
            },
        }
    }

    /// Deliveries owed to `group`: acknowledged events × its connected subscribers, summed
    /// over threads.
    pub(super) fn owed(&self, group: Group) -> u64 {
        self.threads
            .iter()
            .zip(&self.shared.connected_per_thread)
            .map(|(t, c)| {
                t.acked.load(Ordering::Relaxed) * c[group as usize].load(Ordering::Relaxed)
            })
            .sum()
    }

    pub(super) fn counted_groups(&self) -> Vec<Group> {
        if self.slow_excluded {
            vec![Group::Normal]
        } else {
            vec![Group::Normal, Group::Slow]
        }
    }

    pub(super) fn accounted(&self) -> (u64, u64) {
        let mut owed = 0;
        let mut got = 0;
        for g in self.counted_groups() {
            owed += self.owed(g);
            got += self.shared.progress[g as usize].load(Ordering::Relaxed);
        }
        (owed, got)
    }

    /// Runs one measured step.
    pub(super) async fn step(
        &mut self,
        label: &str,
        rate: f64,
        stall: bool,
        storm_at: Option<Duration>,
    ) -> StepResult {
        let idx = self.steps.len();
        let load = self.plan.load.clone();
        let duration = Duration::from_secs_f64(load.duration.max(0.1));
        let drain_timeout = Duration::from_secs_f64(load.drain_timeout.max(0.0));
        self.set_label(label);
        self.shared.step.store(idx, Ordering::Relaxed);
        if stall {
            self.shared.stall.store(true, Ordering::Relaxed);
            self.slow_excluded = true;
        }
        let b0 = self.ctx.probe.sample();
        let s0 = procfs::sample_self();
        let delivered0 = self.shared.delivered.load(Ordering::Relaxed);
        let resets0 = self.shared.resets.load(Ordering::Relaxed);
        let start = Instant::now();
        let storm_task = storm_at.map(|at| {
            let shared = self.shared.clone();
            let threads = self.threads.clone();
            let ctl = self.ctl.clone();
            tokio::spawn(async move {
                tokio::time::sleep(at).await;
                {
                    let mut s = shared.storm.lock().unwrap_or_else(|e| e.into_inner());
                    s.t0 = Some(Instant::now());
                    s.marks = threads
                        .iter()
                        .map(|t| t.sent.load(Ordering::Relaxed))
                        .collect();
                }
                ctl.send_modify(|c| c.storm += 1);
            })
        });
        let pubs: PubStats = publisher::run(
            &self.ctx.target,
            &self.ctx.sources,
            &self.threads,
            &self.pub_cfg,
            rate,
            duration,
            start + duration + drain_timeout,
        )
        .await;
        if let Some(t) = storm_task {
            let _ = t.await;
        }
        let published_at = pubs.finished.unwrap_or_else(Instant::now).max(start);
        let publish_s = published_at.duration_since(start).as_secs_f64();
        // Drain: wait until every counted subscriber has every acknowledged event.
        let drain_start = Instant::now();
        loop {
            let (owed, got) = self.accounted();
            if got >= owed || drain_start.elapsed() >= drain_timeout {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let drain_s = drain_start.elapsed().as_secs_f64();
        let b1 = self.ctx.probe.sample();
        let s1 = procfs::sample_self();
        let (owed, got) = self.accounted();
        let delivered = self.shared.delivered.load(Ordering::Relaxed) - delivered0;
        let resets = self.shared.resets.load(Ordering::Relaxed) - resets0;
        let hist = self.shared.step_histogram(idx, Group::Normal);
        let slow_hist = self.shared.step_histogram(idx, Group::Slow);
        let broker = match (b0, b1) {
            (Some(a), Some(b)) => Some(broker_step(&a, &b, delivered, pubs.acked)),
            _ => None,
        };
        let mut r = StepResult {
            label: label.to_string(),
            offered_rate: rate,
            duration_s: duration.as_secs_f64(),
            publish_s,
            drain_s,
            publish: PublishSummary {
                acked: pubs.acked,
                posts: pubs.posts,
                achieved_rate: if publish_s > 0.0 {
                    pubs.acked as f64 / publish_s
                } else {
                    0.0
                },
                errors: pubs.errors(),
                status_errors: pubs.status_errors.clone(),
                transport_errors: pubs.transport_errors,
                first_error: pubs.first_error.clone(),
                abandoned: pubs.abandoned,
                lag: Summary::of(&pubs.lag),
                post_latency: Summary::of(&pubs.post_latency),
            },
            delivered,
            deliveries_per_s: if publish_s > 0.0 {
                delivered as f64 / publish_s
            } else {
                0.0
            },
            expected: owed,
            missing: owed.saturating_sub(got),
            resets,
            latency: Summary::of(&hist),
            latency_slow: (self.plan.slow_share > 0.0).then(|| Summary::of(&slow_hist)),
            broker,
            loadgen: s0.delta(&s1),
            sustained: false,
            not_sustained: Vec::new(),
        };
        judge(&mut r, load.sweep_p99_ms, self.plan.subs_per_thread > 0);
        if !self.ctx.common.quiet {
            eprintln!(
                "step {label}: offered {rate}/s, acked {} ({:.0}/s), delivered {} ({:.0}/s), p99 {:.2} ms, missing {}, {}",
                r.publish.acked,
                r.publish.achieved_rate,
                r.delivered,
                r.deliveries_per_s,
                r.latency.p99_us as f64 / 1000.0,
                r.missing,
                if r.sustained {
                    "sustained".to_string()
                } else {
                    format!("not sustained: {}", r.not_sustained.join("; "))
                }
            );
        }
        self.hists.push((label.to_string(), hist));
        self.steps.push(r.clone());
        r
    }

    /// Stops every subscriber and collects what each saw.
    pub(super) async fn finish(mut self) -> Finished {
        self.set_label("stop");
        self.ctl.send_modify(|c| c.stop = true);
        let mut subs = Vec::with_capacity(self.handles.len());
        for h in self.handles.drain(..) {
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(15), h).await {
                subs.push(s);
            }
        }
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
        let acked: Vec<u64> = self
            .threads
            .iter()
            .map(|t| t.acked.load(Ordering::Relaxed))
            .collect();
        Finished {
            timeline: std::mem::take(&mut *self.timeline.lock().unwrap_or_else(|e| e.into_inner())),
            steps: self.steps,
            hists: self.hists,
            subs,
            acked,
            slow_excluded: self.slow_excluded,
        }
    }
}

/// What a finished session leaves.
pub(super) struct Finished {
    pub(super) steps: Vec<StepResult>,
    pub(super) hists: Vec<(String, Histogram<u64>)>,
    pub(super) subs: Vec<SubStats>,
    pub(super) acked: Vec<u64>,
    pub(super) slow_excluded: bool,
    pub(super) timeline: Vec<TimePoint>,
}

fn broker_step(a: &ProcSample, b: &ProcSample, delivered: u64, published: u64) -> BrokerStep {
    let process = a.delta(b);
    let per = |s: f64, n: u64| if n > 0 { s * 1e9 / n as f64 } else { 0.0 };
    BrokerStep {
        process,
        user_ns_per_delivery: per(process.user_s, delivered),
        sys_ns_per_delivery: per(process.sys_s, delivered),
        total_ns_per_delivery: per(process.user_s + process.sys_s, delivered),
        total_ns_per_publish: per(process.user_s + process.sys_s, published),
    }
}

/// Decides whether a step's rate was sustained.
pub(super) fn judge(r: &mut StepResult, bound_ms: f64, has_subscribers: bool) {
    let mut why = Vec::new();
    if r.missing > 0 {
        why.push(format!("{} deliveries missing after the drain", r.missing));
    }
    if r.offered_rate > 0.0 && r.publish.achieved_rate < 0.95 * r.offered_rate {
        why.push(format!(
            "publisher reached {:.0}/s of {:.0}/s",
            r.publish.achieved_rate, r.offered_rate
        ));
    }
    if r.publish.abandoned > 0 || r.publish.errors > 0 {
        why.push(format!(
            "{} publish errors, {} events abandoned",
            r.publish.errors, r.publish.abandoned
        ));
    }
    if r.resets > 0 {
        why.push(format!("{} subscriber resets", r.resets));
    }
    let p99_ms = if has_subscribers {
        r.latency.p99_us as f64 / 1000.0
    } else {
        r.publish.post_latency.p99_us as f64 / 1000.0
    };
    if p99_ms > bound_ms {
        why.push(format!("p99 {p99_ms:.2} ms > {bound_ms} ms"));
    }
    r.sustained = why.is_empty();
    r.not_sustained = why;
}
