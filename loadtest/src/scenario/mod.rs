//! The scenarios: setting up threads and subscribers, running measured steps (one rate, or a
//! sweep of rates), and turning what was seen into an [`Outcome`].

mod session;
mod summary;

pub use session::{ConnectSummary, StepResult, TimePoint};
pub use summary::SubSummary;

use crate::net::{HttpConn, Sources, Target};
use crate::payload::{self};
use crate::procfs::{self, Probe, ProcSample};
use crate::report::{self, Outcome};
use crate::stats::Summary;
use crate::subscriber::{Group, SlowMode, SubStats};
use crate::{Cli, Common, Load, Scenario, SlowModeArg};
use anyhow::{Context, Result, bail};
use serde_json::json;
use session::Session;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use summary::summarize;

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
    use super::session::judge;
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
