//! The scenarios: setting up threads and subscribers, running measured steps (one rate, or a
//! sweep of rates), and turning what was seen into an [`Outcome`].

use crate::net::{HttpConn, Sources, Target};
use crate::payload::{self, EventWriter};
use crate::procfs::{self, Probe, ProcDelta, ProcSample};
use crate::publisher::{self, PubConfig, PubStats, ThreadPub};
use crate::report::{self, Checks, Outcome};
use crate::stats::{Spread, Summary};
use crate::subscriber::{self, Control, Group, Shared, SlowMode, Spec, SubStats};
use crate::{Cli, Common, Load, Scenario, SlowModeArg};
use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Everything a scenario needs to know about the run.
pub struct Ctx {
    /// Common options.
    pub common: Common,
    /// The broker.
    pub target: Target,
    /// Client source addresses.
    pub sources: Arc<Sources>,
    /// The broker process, if given.
    pub probe: Probe,
    /// Prefix of this run's thread ids (unique per run).
    pub run_id: String,
}

/// Runs the chosen scenario and writes its results; `Ok(true)` when the checks passed.
///
/// # Errors
/// The broker cannot be reached, a thread cannot be opened, the results cannot be written.
pub async fn run(cli: Cli, workers: usize) -> Result<bool> {
    let (nofile_before, nofile_after) = procfs::raise_nofile();
    let common = cli.common.clone();
    let mut target = Target::parse(&common.url)?;
    target.bearer = common.bearer.clone();
    let sources = Arc::new(Sources::new(&target.addr, common.source_addrs));
    let probe = Probe::new(common.broker_pid)?;
    crate::net::connect(target.addr, None)
        .await
        .with_context(|| format!("the broker does not answer at {}", common.url))?;
    let started_unix = payload::unix_ns() / 1_000_000_000;
    let name = cli.scenario.name();
    let label = common
        .label
        .clone()
        .unwrap_or_else(|| format!("{name}-{started_unix}"));
    let ctx = Ctx {
        common: common.clone(),
        target,
        sources,
        probe,
        run_id: format!("lt{:08x}", (payload::unix_ns() / 1000) as u32),
    };
    if !common.quiet {
        eprintln!(
            "agui-loadtest {name}: {} (broker pid {}), {} worker thread(s), open files {} -> {}, sources {}",
            common.url,
            common
                .broker_pid
                .map_or_else(|| "not given".into(), |p| p.to_string()),
            workers,
            nofile_before,
            nofile_after,
            ctx.sources.addrs().len()
        );
    }
    let metrics_before = fetch_metrics(&ctx).await;
    let mut outcome = match &cli.scenario {
        Scenario::Fanout { subscribers, load } => {
            let plan = StreamPlan::simple(1, *subscribers, load, 100.0);
            stream(&ctx, plan).await?
        }
        Scenario::Threads {
            threads,
            subscribers,
            load,
        } => {
            let plan = StreamPlan::simple(*threads, *subscribers, load, 6000.0);
            stream(&ctx, plan).await?
        }
        Scenario::Ingest {
            threads,
            subscribers,
            load,
        } => {
            let plan = StreamPlan::simple(*threads, *subscribers, load, 0.0);
            stream(&ctx, plan).await?
        }
        Scenario::Slow {
            threads,
            subscribers,
            slow_share,
            slow_mode,
            slow_read_bytes,
            slow_read_interval_ms,
            no_baseline,
            load,
        } => {
            let mut plan = StreamPlan::simple(*threads, *subscribers, load, 100.0);
            plan.slow_share = slow_share.clamp(0.0, 1.0);
            plan.slow_mode = match slow_mode {
                SlowModeArg::Stall => SlowMode::Stall,
                SlowModeArg::Slow => SlowMode::Slow {
                    bytes: *slow_read_bytes,
                    interval: Duration::from_millis(*slow_read_interval_ms),
                },
            };
            plan.kind = Kind::Slow {
                baseline: !no_baseline,
            };
            stream(&ctx, plan).await?
        }
        Scenario::ResumeStorm {
            threads,
            subscribers,
            storm_at,
            load,
        } => {
            let mut plan = StreamPlan::simple(*threads, *subscribers, load, 100.0);
            plan.kind = Kind::Storm {
                at: storm_at.unwrap_or(load.duration / 2.0).max(0.0),
            };
            stream(&ctx, plan).await?
        }
        Scenario::Idle {
            connections,
            threads,
            settle,
            hold,
        } => idle(&ctx, *connections, *threads, *settle, *hold).await?,
        Scenario::Runs(args) => crate::runs::run(&ctx, args).await?,
    };
    let metrics_after = fetch_metrics(&ctx).await;
    if let (Some(before), Some(after)) = (metrics_before, metrics_after) {
        for (k, v) in &after {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            if d != 0.0 {
                outcome.broker_metrics_delta.insert(k.clone(), d);
            }
        }
    }
    outcome.scenario = name.to_string();
    outcome.label = label;
    outcome.started_unix = started_unix;
    outcome.options = json!({"common": common, "scenario": cli.scenario});
    outcome.env = json!({
        "url": common.url,
        "broker_pid": common.broker_pid,
        "loadgen_pid": std::process::id(),
        "workers": workers,
        "latency_from": common.latency_from,
        "cpus_available": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "nofile_before": nofile_before,
        "nofile_after": nofile_after,
        "source_addrs": ctx.sources.addrs().iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "run_id": ctx.run_id,
    });
    let paths = report::write(&common.out, &outcome)?;
    println!("{}", report::markdown(&outcome, &paths));
    for p in &paths {
        eprintln!("wrote {}", p.display());
    }
    Ok(outcome.checks.ok || common.no_fail)
}

/// Reads the broker's Prometheus counters (`agui_*_total`), `None` when unavailable.
async fn fetch_metrics(ctx: &Ctx) -> Option<BTreeMap<String, f64>> {
    if ctx.common.metrics_path.is_empty() {
        return None;
    }
    let mut conn = HttpConn::open(&ctx.target, None).await.ok()?;
    let path = format!("{}{}", ctx.target.prefix, ctx.common.metrics_path);
    let reply = tokio::time::timeout(Duration::from_secs(5), conn.get(&path))
        .await
        .ok()?
        .ok()?;
    if reply.status != 200 {
        return None;
    }
    let text = String::from_utf8_lossy(&reply.body);
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || !line.starts_with("agui_") {
            continue;
        }
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = key.split('{').next().unwrap_or(key);
        if !name.ends_with("_total") {
            continue;
        }
        if let Ok(v) = value.parse::<f64>() {
            out.insert(key.to_string(), v);
        }
    }
    Some(out)
}

/// Which streaming scenario.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// One step at `--rate`, or a sweep.
    Plain,
    /// Optional baseline step, then a step with the slow group stalled.
    Slow { baseline: bool },
    /// One step; the storm is called `at` seconds in.
    Storm { at: f64 },
}

/// A streaming scenario's shape.
#[derive(Clone, Debug)]
struct StreamPlan {
    kind: Kind,
    threads: usize,
    subs_per_thread: usize,
    slow_share: f64,
    slow_mode: SlowMode,
    rate: f64,
    load: Load,
}

impl StreamPlan {
    fn simple(threads: usize, subs_per_thread: usize, load: &Load, default_rate: f64) -> Self {
        StreamPlan {
            kind: Kind::Plain,
            threads: threads.max(1),
            subs_per_thread,
            slow_share: 0.0,
            slow_mode: SlowMode::Stall,
            rate: load.rate.unwrap_or(default_rate).max(0.0),
            load: load.clone(),
        }
    }
}

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
struct Session<'a> {
    ctx: &'a Ctx,
    plan: StreamPlan,
    threads: Vec<Arc<ThreadPub>>,
    shared: Arc<Shared>,
    ctl: watch::Sender<Control>,
    handles: Vec<JoinHandle<SubStats>>,
    slow_excluded: bool,
    pub_cfg: PubConfig,
    steps: Vec<StepResult>,
    hists: Vec<(String, Histogram<u64>)>,
    step_label: Arc<Mutex<String>>,
    timeline: Arc<Mutex<Vec<TimePoint>>>,
    sampler: Option<JoinHandle<()>>,
    started: Instant,
}

impl<'a> Session<'a> {
    /// Opens the threads (one `RUN_STARTED` each).
    async fn new(ctx: &'a Ctx, plan: StreamPlan) -> Result<Session<'a>> {
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

    fn set_label(&self, label: &str) {
        *self.step_label.lock().unwrap_or_else(|e| e.into_inner()) = label.to_string();
    }

    /// A task that samples progress, broker and load generator once a second.
    fn start_sampler(&mut self) {
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
    async fn connect(&mut self) -> ConnectSummary {
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
    fn owed(&self, group: Group) -> u64 {
        self.threads
            .iter()
            .zip(&self.shared.connected_per_thread)
            .map(|(t, c)| {
                t.acked.load(Ordering::Relaxed) * c[group as usize].load(Ordering::Relaxed)
            })
            .sum()
    }

    fn counted_groups(&self) -> Vec<Group> {
        if self.slow_excluded {
            vec![Group::Normal]
        } else {
            vec![Group::Normal, Group::Slow]
        }
    }

    fn accounted(&self) -> (u64, u64) {
        let mut owed = 0;
        let mut got = 0;
        for g in self.counted_groups() {
            owed += self.owed(g);
            got += self.shared.progress[g as usize].load(Ordering::Relaxed);
        }
        (owed, got)
    }

    /// Runs one measured step.
    async fn step(
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
    async fn finish(mut self) -> Finished {
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
struct Finished {
    steps: Vec<StepResult>,
    hists: Vec<(String, Histogram<u64>)>,
    subs: Vec<SubStats>,
    acked: Vec<u64>,
    slow_excluded: bool,
    timeline: Vec<TimePoint>,
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
fn judge(r: &mut StepResult, bound_ms: f64, has_subscribers: bool) {
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

/// Parses `--sweep`.
fn sweep_rates(spec: &str) -> Result<Vec<f64>> {
    if let Some(rest) = spec.strip_prefix("geom:") {
        let parts: Vec<f64> = rest
            .split(':')
            .map(|p| p.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .context("--sweep geom:START:MAX:FACTOR")?;
        let [start, max, factor] = parts[..] else {
            bail!("--sweep geom:START:MAX:FACTOR needs three numbers");
        };
        if start <= 0.0 || factor <= 1.0 || max < start {
            bail!("--sweep geom: START > 0, MAX >= START, FACTOR > 1");
        }
        let mut out = Vec::new();
        let mut r = start;
        while r <= max * 1.000_001 {
            out.push(r.round());
            r *= factor;
        }
        if out.last().is_some_and(|&l| l < max) {
            out.push(max);
        }
        return Ok(out);
    }
    let out: Vec<f64> = spec
        .split(',')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .context("--sweep r1,r2,...")?;
    if out.is_empty() || out.iter().any(|&r| r <= 0.0) {
        bail!("--sweep rates must be > 0");
    }
    Ok(out)
}

/// Formats a rate for a step label.
fn rate_label(rate: f64) -> String {
    if rate == 0.0 {
        "max".into()
    } else {
        format!("{rate}/s")
    }
}

/// fanout, threads, ingest, slow, resume-storm.
async fn stream(ctx: &Ctx, plan: StreamPlan) -> Result<Outcome> {
    let mut s = Session::new(ctx, plan.clone()).await?;
    let connect = s.connect().await;
    if !ctx.common.quiet {
        eprintln!(
            "connected {}/{} subscribers in {:.2} s ({} gave up)",
            connect.connected, connect.requested, connect.seconds, connect.failed
        );
    }
    let pause = Duration::from_secs_f64(plan.load.pause.max(0.0));
    let mut extra = json!({
        "threads": plan.threads,
        "subscribers_per_thread": plan.subs_per_thread,
        "event_bytes": plan.load.event_bytes,
        "mix": plan.load.mix,
    });
    match plan.kind {
        Kind::Plain => {
            if let Some(spec) = &plan.load.sweep {
                let rates = sweep_rates(spec)?;
                let mut best: Option<f64> = None;
                let mut failed: Option<f64> = None;
                for (i, &r) in rates.iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(pause).await;
                    }
                    let res = s.step(&rate_label(r), r, false, None).await;
                    if res.sustained {
                        best = Some(r);
                    } else {
                        failed = Some(r);
                        break;
                    }
                }
                for _ in 0..plan.load.sweep_refine {
                    let (Some(lo), Some(hi)) = (best, failed) else {
                        break;
                    };
                    let mid = ((lo + hi) / 2.0).round();
                    if mid <= lo || mid >= hi {
                        break;
                    }
                    tokio::time::sleep(pause).await;
                    if s.step(&rate_label(mid), mid, false, None).await.sustained {
                        best = Some(mid);
                    } else {
                        failed = Some(mid);
                    }
                }
                extra["sweep"] = json!({
                    "p99_bound_ms": plan.load.sweep_p99_ms,
                    "best_sustained_rate": best,
                    "first_failed_rate": failed,
                    "best_sustained_deliveries_per_s": best.and_then(|b| s.steps.iter()
                        .find(|st| st.offered_rate == b)
                        .map(|st| st.deliveries_per_s)),
                });
            } else {
                s.step(&rate_label(plan.rate), plan.rate, false, None).await;
            }
        }
        Kind::Slow { baseline } => {
            if baseline {
                s.step("baseline", plan.rate, false, None).await;
                tokio::time::sleep(pause).await;
            }
            s.step("with-slow", plan.rate, true, None).await;
        }
        Kind::Storm { at } => {
            s.step(
                &format!("storm@{at}s"),
                plan.rate,
                false,
                Some(Duration::from_secs_f64(at)),
            )
            .await;
        }
    }
    let fin = s.finish().await;
    let (summary, checks) = summarize(&fin, &plan);
    match plan.kind {
        Kind::Slow { baseline } => {
            let slow_count = fin.subs.iter().filter(|x| x.group == Group::Slow).count();
            let last = fin.steps.last().cloned().unwrap_or_default();
            let base = baseline.then(|| fin.steps[0].clone());
            let peak_rss = fin
                .timeline
                .iter()
                .filter(|p| p.step == "with-slow")
                .filter_map(|p| p.broker_rss_kib)
                .max();
            extra["slow"] = json!({
                "slow_subscribers": slow_count,
                "mode": format!("{:?}", plan.slow_mode),
                "others_p99_us_baseline": base.as_ref().map(|b| b.latency.p99_us),
                "others_p99_us_with_slow": last.latency.p99_us,
                "others_p99_ratio": base.as_ref().and_then(|b| (b.latency.p99_us > 0)
                    .then(|| last.latency.p99_us as f64 / b.latency.p99_us as f64)),
                "slow_group_resets": fin.subs.iter().filter(|x| x.group == Group::Slow).map(|x| x.resets).sum::<u64>(),
                "slow_group_peer_closes": fin.subs.iter().filter(|x| x.group == Group::Slow).map(|x| x.peer_closes).sum::<u64>(),
                "broker_rss_peak_kib_with_slow": peak_rss,
                "broker_rss_baseline_end_kib": base.as_ref().and_then(|b| b.broker.as_ref()).map(|b| b.process.rss_end_kib),
            });
        }
        Kind::Storm { at } => {
            let counted: Vec<&SubStats> = fin.subs.iter().filter(|x| x.ever_connected).collect();
            let reconnect: Vec<u64> = counted
                .iter()
                .filter_map(|x| x.storm_reconnect_us.first().copied())
                .collect();
            let catchup: Vec<u64> = counted
                .iter()
                .filter_map(|x| x.storm_catchup_us.first().copied())
                .collect();
            let absorbed = catchup.len() == counted.len() && !counted.is_empty();
            extra["storm"] = json!({
                "at_s": at,
                "subscribers": counted.len(),
                "reconnected": reconnect.len(),
                "caught_up": catchup.len(),
                "absorbed": absorbed,
                "absorb_s": catchup.iter().max().map(|&m| m as f64 / 1e6),
                "reconnect_us": Summary::of_values(&reconnect),
                "catchup_us": Summary::of_values(&catchup),
                "inexact_resumes": summary.inexact_resumes,
            });
        }
        Kind::Plain => {}
    }
    Ok(Outcome {
        connect: Some(connect),
        steps: fin.steps,
        subscribers: Some(summary),
        scenario_result: extra,
        timeline: fin.timeline,
        checks,
        latency_plots: fin.hists,
        ..Outcome::default()
    })
}

/// Per-subscriber figures over the whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SubSummary {
    /// Subscribers started.
    pub subscribers: usize,
    /// Subscribers that reported back.
    pub reported: usize,
    /// Never connected.
    pub never_connected: usize,
    /// Successful connections, all subscribers.
    pub connects: u64,
    /// Failed connection attempts.
    pub connect_errors: u64,
    /// Streams ended by the broker.
    pub peer_closes: u64,
    /// Measured events delivered.
    pub delivered: u64,
    /// Duplicates.
    pub duplicates: u64,
    /// Gaps (jumps without a restatement).
    pub gaps: u64,
    /// Events skipped by gaps.
    pub gap_events: u64,
    /// Resets (restatements mid-stream).
    pub resets: u64,
    /// Events skipped by resets.
    pub reset_skipped: u64,
    /// Resumes that were not exact.
    pub inexact_resumes: u64,
    /// Events never delivered to counted subscribers (published, not received by the end).
    pub missing_at_end: u64,
    /// Deliveries per subscriber.
    pub deliveries: Spread,
    /// Per-subscriber p99 latency, µs.
    pub p99_us: Spread,
    /// Per-subscriber max latency, µs.
    pub max_us: Spread,
    /// Subscribers with a problem (first 20).
    pub problems: Vec<serde_json::Value>,
}

fn summarize(fin: &Finished, plan: &StreamPlan) -> (SubSummary, Checks) {
    let mut s = SubSummary {
        subscribers: plan.threads * plan.subs_per_thread,
        reported: fin.subs.len(),
        ..SubSummary::default()
    };
    let mut deliveries = Vec::new();
    let mut p99 = Vec::new();
    let mut max = Vec::new();
    for x in &fin.subs {
        let counted = x.ever_connected && !(x.group == Group::Slow && fin.slow_excluded);
        let missing = if counted {
            fin.acked[x.thread].saturating_sub(x.last_seq.map_or(0, |q| q + 1))
        } else {
            0
        };
        if !x.ever_connected {
            s.never_connected += 1;
        }
        s.connects += x.connects;
        s.connect_errors += x.connect_errors;
        s.peer_closes += x.peer_closes;
        s.delivered += x.delivered;
        s.duplicates += x.duplicates;
        s.gaps += x.gaps;
        s.gap_events += x.gap_events;
        s.resets += x.resets;
        s.reset_skipped += x.reset_skipped;
        s.inexact_resumes += x.inexact_resumes;
        s.missing_at_end += missing;
        if x.group == Group::Normal {
            deliveries.push(x.delivered);
            if let Some(h) = &x.latency {
                p99.push(h.value_at_quantile(0.99));
                max.push(h.max());
            }
        }
        let bad = x.duplicates > 0
            || x.gaps > 0
            || x.connect_errors > 0
            || x.inexact_resumes > 0
            || missing > 0
            || !x.ever_connected;
        if bad && s.problems.len() < 20 {
            s.problems.push(json!({
                "id": x.id, "thread": x.thread, "group": x.group,
                "connected": x.ever_connected, "connect_errors": x.connect_errors,
                "last_connect_error": x.last_connect_error, "duplicates": x.duplicates,
                "gaps": x.gaps, "gap_events": x.gap_events, "missing": missing,
                "inexact_resumes": x.inexact_resumes, "peer_closes": x.peer_closes,
                "last_seq": x.last_seq, "published": fin.acked[x.thread],
            }));
        }
    }
    s.deliveries = Spread::of(deliveries);
    s.p99_us = Spread::of(p99);
    s.max_us = Spread::of(max);
    let mut checks = Checks::default();
    let mut fail = |cond: bool, msg: String| {
        if cond {
            checks.failures.push(msg);
        }
    };
    fail(
        s.gaps > 0,
        format!("{} gaps ({} events)", s.gaps, s.gap_events),
    );
    fail(s.duplicates > 0, format!("{} duplicates", s.duplicates));
    fail(
        s.connect_errors > 0,
        format!("{} connect errors", s.connect_errors),
    );
    fail(
        s.never_connected > 0,
        format!("{} subscribers never connected", s.never_connected),
    );
    fail(
        s.reported < s.subscribers,
        format!("{} subscribers did not report", s.subscribers - s.reported),
    );
    fail(
        s.missing_at_end > 0,
        format!("{} deliveries missing at the end", s.missing_at_end),
    );
    fail(
        s.inexact_resumes > 0,
        format!("{} inexact resumes", s.inexact_resumes),
    );
    let pub_errors: u64 = fin.steps.iter().map(|st| st.publish.errors).sum();
    let abandoned: u64 = fin.steps.iter().map(|st| st.publish.abandoned).sum();
    if pub_errors > 0 || abandoned > 0 {
        checks.warnings.push(format!(
            "{pub_errors} publish errors, {abandoned} events abandoned"
        ));
    }
    if s.resets > 0 {
        checks.warnings.push(format!(
            "{} resets ({} events skipped by them)",
            s.resets, s.reset_skipped
        ));
    }
    if s.peer_closes > 0 {
        checks
            .warnings
            .push(format!("{} streams closed by the broker", s.peer_closes));
    }
    checks.ok = checks.failures.is_empty();
    (s, checks)
}

/// The `idle` scenario: RSS per idle connection.
async fn idle(
    ctx: &Ctx,
    connections: usize,
    threads: usize,
    settle: f64,
    hold: f64,
) -> Result<Outcome> {
    let threads = threads.clamp(1, connections.max(1));
    let per_thread = connections.div_ceil(threads);
    let load = Load {
        rate: Some(0.0),
        duration: 0.0,
        mix: payload::Mix::Custom,
        event_bytes: 200,
        publish_conns: 1,
        max_batch: 1,
        drain_timeout: 0.0,
        sweep: None,
        sweep_p99_ms: 0.0,
        sweep_refine: 0,
        pause: 0.0,
    };
    let plan = StreamPlan::simple(threads, per_thread, &load, 0.0);
    let mut s = Session::new(ctx, plan.clone()).await?;
    // Give the RUN_STARTED fan-in a moment, then take the baseline.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b0 = ctx.probe.sample();
    let s0 = procfs::sample_self();
    let connect = s.connect().await;
    if !ctx.common.quiet {
        eprintln!(
            "connected {}/{} idle subscribers in {:.2} s",
            connect.connected, connect.requested, connect.seconds
        );
    }
    s.set_label("settle");
    tokio::time::sleep(Duration::from_secs_f64(settle.max(0.0))).await;
    let b1 = ctx.probe.sample();
    let s1 = procfs::sample_self();
    s.set_label("hold");
    tokio::time::sleep(Duration::from_secs_f64(hold.max(0.0))).await;
    let b2 = ctx.probe.sample();
    let s2 = procfs::sample_self();
    let open_at_end = s.shared.open.load(Ordering::Relaxed);
    let fin = s.finish().await;
    let (summary, mut checks) = summarize(&fin, &plan);
    let n = connect.connected.max(1) as f64;
    let per_conn = |a: &Option<ProcSample>, b: &Option<ProcSample>| match (a, b) {
        (Some(a), Some(b)) => Some((b.rss_kib as f64 - a.rss_kib as f64) * 1024.0 / n),
        _ => None,
    };
    if open_at_end < connect.connected {
        checks.failures.push(format!(
            "{} of {} connections were not open at the end",
            connect.connected - open_at_end,
            connect.connected
        ));
        checks.ok = false;
    }
    let extra = json!({
        "connections": connections,
        "threads": threads,
        "connected": connect.connected,
        "open_at_end": open_at_end,
        "broker_rss_kib": {
            "before": b0.map(|b| b.rss_kib),
            "after_settle": b1.map(|b| b.rss_kib),
            "after_hold": b2.map(|b| b.rss_kib),
        },
        "broker_rss_bytes_per_connection": per_conn(&b0, &b1),
        "broker_rss_bytes_per_connection_after_hold": per_conn(&b0, &b2),
        "broker_cpu_during_hold": match (b1, b2) { (Some(a), Some(b)) => Some(a.delta(&b)), _ => None },
        "loadgen_rss_bytes_per_connection": (s1.rss_kib as f64 - s0.rss_kib as f64) * 1024.0 / n,
        "loadgen_cpu_connect": s0.delta(&s1),
        "loadgen_cpu_hold": s1.delta(&s2),
    });
    Ok(Outcome {
        connect: Some(connect),
        steps: Vec::new(),
        subscribers: Some(summary),
        scenario_result: extra,
        timeline: fin.timeline,
        checks,
        ..Outcome::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_parse() {
        assert_eq!(
            sweep_rates("100, 200,400").unwrap(),
            vec![100.0, 200.0, 400.0]
        );
        assert_eq!(
            sweep_rates("geom:100:1000:2").unwrap(),
            vec![100.0, 200.0, 400.0, 800.0, 1000.0]
        );
        assert_eq!(
            sweep_rates("geom:100:400:2").unwrap(),
            vec![100.0, 200.0, 400.0]
        );
        assert!(sweep_rates("geom:100:50:2").is_err());
        assert!(sweep_rates("x").is_err());
        assert!(sweep_rates("0").is_err());
    }

    #[test]
    fn judging() {
        let mut r = StepResult {
            offered_rate: 100.0,
            ..StepResult::default()
        };
        r.publish.achieved_rate = 99.0;
        r.latency.p99_us = 1500;
        judge(&mut r, 2.0, true);
        assert!(r.sustained, "{:?}", r.not_sustained);
        r.latency.p99_us = 2500;
        r.missing = 3;
        judge(&mut r, 2.0, true);
        assert!(!r.sustained);
        assert_eq!(r.not_sustained.len(), 2);
    }
}
