//! The `runs` scenario: concurrent AG-UI runs through the broker's run gateway
//! (`POST /v1/agents/{name}`, PROTOCOL §11) against the built-in demo agent, with viewers
//! following each thread, set against the same runs straight from the agent and the same
//! events published plainly (`POST /v1/threads/{id}/events`) in the same session.
//!
//! A round has up to three phases, each with `--concurrency` workers, one thread and one
//! keep-alive connection per worker, runs one after another on it:
//! 1. `direct` (with `--agent-url`): the runs against the demo agent itself: time to first
//!    event and event latency without the broker;
//! 2. `gateway`: the runs through the broker, `--viewers` `GET …/events?from=start` per
//!    thread; every caller stream and every viewer is checked event by event;
//! 3. `publish`: the events the gateway appended (the thread id changed), published by the
//!    workers on fresh threads, with `--viewers` + 1 viewers per thread, so that both phases
//!    deliver the same events the same number of times; broker CPU per delivered event of the
//!    two phases gives the gateway's overhead.
//!
//! Latency of a run's event is measured from the moment its run request was sent (`direct`,
//! `gateway`) or its publish was sent (`publish`) to its arrival, on one clock (this process).

mod client;

use crate::net::Target;
use crate::procfs::ProcSample;
use crate::report::{Checks, Outcome};
use crate::scenario::Ctx;
use crate::stats::{self, Summary};
use anyhow::{Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use client::{
    RunRead, Seen, ViewerLog, close, drain, open_viewers, publish_bodies, publish_phase, run_phase,
};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Options of the `runs` scenario.
#[derive(Clone, Debug, Args, Serialize)]
pub struct RunsArgs {
    /// The gateway agent (`[agents.<name>]` of the broker, pointing at `agui-fanout demo-agent`).
    #[arg(long, default_value = "demo")]
    pub agent: String,
    /// The demo agent's own URL (`http://host:port/`): the same runs straight from it first,
    /// for time to first event and latency without the broker.
    #[arg(long)]
    pub agent_url: Option<String>,
    /// Runs in flight at once (each on its own thread and connection).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Runs per phase.
    #[arg(long, default_value_t = 400)]
    pub runs: usize,
    /// Viewers (`GET …/events`) per thread besides the caller.
    #[arg(long, default_value_t = 1)]
    pub viewers: usize,
    /// Rounds (each: direct, gateway, publish), for the spread of the ratios.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// How the `publish` phase sends a run's events.
    #[arg(long, value_enum, default_value_t = Baseline::Event)]
    pub baseline: Baseline,
    /// No `publish` phase (correctness runs).
    #[arg(long)]
    pub no_baseline: bool,
    /// Seconds to wait after a phase's last run for the viewers to catch up.
    #[arg(long, default_value_t = 10.0)]
    pub drain_timeout: f64,
    /// Seconds of pause between phases.
    #[arg(long, default_value_t = 1.0)]
    pub pause: f64,
}

/// How the `publish` phase sends a run's events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Baseline {
    /// One `application/json` POST per event, as a producer that streams as it goes.
    Event,
    /// One `text/event-stream` POST per run (the agent's output piped in).
    Sse,
}

/// A phase's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseResult {
    /// `direct`, `gateway` or `publish`.
    pub phase: String,
    /// The round (from 1).
    pub round: usize,
    /// Runs completed without an error.
    pub runs_ok: usize,
    /// Runs that failed (transport, status, a stream that is not a whole run).
    pub runs_failed: usize,
    /// Wall seconds from the first request to the last answer.
    pub seconds: f64,
    /// Runs per second.
    pub runs_per_s: f64,
    /// Events of the runs (appended or read by the callers).
    pub events: u64,
    /// Events delivered to callers and viewers.
    pub delivered: u64,
    /// Time to first event of a run, µs (caller side).
    pub ttfe: Summary,
    /// Request-to-arrival latency of every event at the callers, µs.
    pub caller_latency: Summary,
    /// Request-to-arrival latency of every event at the viewers, µs.
    pub viewer_latency: Summary,
    /// Viewer events lost, duplicated, reordered or unexpected.
    pub viewer_errors: u64,
    /// Broker CPU over the phase (viewers connected to drained), seconds.
    pub broker_cpu_s: Option<f64>,
    /// Broker CPU per delivered event, ns.
    pub broker_ns_per_delivery: Option<f64>,
    /// Of which user-mode CPU, ns (the rest is the kernel's: socket reads and writes).
    pub broker_user_ns_per_delivery: Option<f64>,
    /// Problems (first 10).
    pub problems: Vec<String>,
}

/// Runs the `runs` scenario.
///
/// # Errors
/// The agent URL does not parse; the first gateway round cannot run at all.
pub async fn run(ctx: &Ctx, args: &RunsArgs) -> Result<Outcome> {
    let agent = match &args.agent_url {
        Some(u) => Some(Target::parse(u).context("--agent-url")?),
        None => None,
    };
    let conc = args.concurrency.max(1);
    let runs = args.runs.max(conc);
    let mut phases: Vec<PhaseResult> = Vec::new();
    let mut reference: Option<Vec<String>> = None;
    let mut checks = Checks::default();
    let pause = Duration::from_secs_f64(args.pause.max(0.0));
    for round in 1..=args.rounds.max(1) {
        if let Some(agent) = &agent {
            let path = format!("{}/", agent.prefix);
            let reads = run_phase(ctx, agent, &path, &format!("d{round}"), conc, runs).await;
            if reference.is_none() {
                reference = reads
                    .iter()
                    .find(|r| r.error.is_none())
                    .map(|r| types(&r.events));
            }
            let mut p = PhaseResult::new("direct", round);
            p.judge_runs(&reads, reference.as_deref(), false);
            p.latencies(&reads, &HashMap::new(), &[]);
            progress(ctx, &p);
            phases.push(p);
            tokio::time::sleep(pause).await;
        }
        // Gateway.
        let threads: Vec<String> = (0..conc)
            .map(|w| format!("{}-g{round}-{w}", ctx.run_id))
            .collect();
        let viewers = open_viewers(ctx, &threads, args.viewers).await?;
        let cpu0 = ctx.probe.sample();
        let path = format!("{}/v1/agents/{}", ctx.target.prefix, args.agent);
        let reads = run_phase(ctx, &ctx.target, &path, &format!("g{round}"), conc, runs).await;
        if reference.is_none() {
            reference = reads
                .iter()
                .find(|r| r.error.is_none())
                .map(|r| types(&r.events));
        }
        let mut p = PhaseResult::new("gateway", round);
        p.judge_runs(&reads, reference.as_deref(), true);
        // Per thread, the events the callers got, in order: what every viewer must see.
        let mut expected: Vec<Vec<(Option<String>, Bytes)>> = vec![Vec::new(); conc];
        // Event ids are unique per thread only: keyed by worker (thread) and id.
        let mut starts: HashMap<(usize, String), Instant> = HashMap::new();
        for r in &reads {
            for e in &r.events {
                expected[r.worker].push((e.id.clone(), e.data.clone()));
                if let Some(id) = &e.id {
                    starts.insert((r.worker, id.clone()), r.start);
                }
            }
        }
        let logs = drain(&viewers, &expected, args.drain_timeout).await;
        let cpu1 = ctx.probe.sample();
        close(viewers);
        p.judge_viewers(&logs, &expected);
        p.latencies(&reads, &starts, &logs);
        p.cpu(cpu0, cpu1);
        progress(ctx, &p);
        let gateway_ok = p.runs_failed == 0;
        phases.push(p);
        if args.no_baseline {
            continue;
        }
        if !gateway_ok {
            checks.warnings.push(format!(
                "round {round}: no publish phase (gateway runs failed)"
            ));
            continue;
        }
        tokio::time::sleep(pause).await;
        // Publish: the same events on fresh threads, one more viewer standing for the caller.
        let pthreads: Vec<String> = (0..conc)
            .map(|w| format!("{}-p{round}-{w}", ctx.run_id))
            .collect();
        let bodies = publish_bodies(&reads, &threads, &pthreads)?;
        let expected_data: Vec<Vec<Bytes>> = (0..conc)
            .map(|w| {
                bodies[w]
                    .iter()
                    .flat_map(|run| run.events.iter().cloned())
                    .collect()
            })
            .collect();
        let viewers = open_viewers(ctx, &pthreads, args.viewers + 1).await?;
        let cpu0 = ctx.probe.sample();
        let sent = publish_phase(ctx, &pthreads, bodies, args.baseline).await;
        let expected: Vec<Vec<(Option<String>, Bytes)>> = expected_data
            .iter()
            .map(|v| v.iter().map(|d| (None, d.clone())).collect())
            .collect();
        let logs = drain(&viewers, &expected, args.drain_timeout).await;
        let cpu1 = ctx.probe.sample();
        close(viewers);
        let mut p = PhaseResult::new("publish", round);
        p.judge_publish(&sent, &logs, &expected_data);
        p.cpu(cpu0, cpu1);
        progress(ctx, &p);
        phases.push(p);
        tokio::time::sleep(pause).await;
    }
    for p in &phases {
        if p.runs_failed > 0 || p.viewer_errors > 0 || !p.problems.is_empty() {
            checks.failures.push(format!(
                "round {} {}: {} runs failed, {} viewer errors{}",
                p.round,
                p.phase,
                p.runs_failed,
                p.viewer_errors,
                p.problems
                    .first()
                    .map(|s| format!(" (first: {s})"))
                    .unwrap_or_default()
            ));
        }
    }
    checks.ok = checks.failures.is_empty();
    let summary = summarize(&phases);
    Ok(Outcome {
        scenario_result: json!({
            "agent": args.agent,
            "concurrency": conc,
            "runs_per_phase": runs,
            "viewers_per_thread": args.viewers,
            "baseline": args.baseline,
            "events_per_run": reference.as_ref().map(Vec::len),
            "summary": summary,
            "phases": phases,
        }),
        checks,
        ..Outcome::default()
    })
}

impl PhaseResult {
    fn new(phase: &str, round: usize) -> Self {
        PhaseResult {
            phase: phase.into(),
            round,
            ..Default::default()
        }
    }

    fn problem(&mut self, what: String) {
        if self.problems.len() < 10 {
            self.problems.push(what);
        }
    }

    /// Checks every run's caller stream: a whole run (the reference's event types in order,
    /// from `RUN_STARTED` with its run id to `RUN_FINISHED`), each event with an id when
    /// `ids` (through the broker), no id twice on a thread.
    fn judge_runs(&mut self, reads: &[RunRead], reference: Option<&[String]>, ids: bool) {
        let first = reads.iter().map(|r| r.start).min();
        let last = reads
            .iter()
            .filter_map(|r| r.events.last().map(|e| e.at))
            .max();
        let mut seen_ids: HashSet<(usize, String)> = HashSet::new();
        for r in reads {
            let mut bad = r.error.clone();
            if bad.is_none() {
                let t = types(&r.events);
                if let Some(reference) = reference
                    && t != reference
                {
                    bad = Some(format!(
                        "{} events {:?}…, expected {} {:?}…",
                        t.len(),
                        &t[..t.len().min(3)],
                        reference.len(),
                        &reference[..reference.len().min(3)]
                    ));
                } else if t.first().map(String::as_str) != Some("RUN_STARTED")
                    || t.last().map(String::as_str) != Some("RUN_FINISHED")
                {
                    bad = Some("not a whole run".into());
                } else if !r.events[0].data_has(&format!("\"runId\":\"{}\"", r.run_id)) {
                    bad = Some("RUN_STARTED of another run".into());
                }
            }
            if bad.is_none() && ids {
                for e in &r.events {
                    match &e.id {
                        None => bad = Some("an event without id".into()),
                        Some(id) if !seen_ids.insert((r.worker, id.clone())) => {
                            bad = Some(format!("id {id} twice"))
                        }
                        Some(_) => {}
                    }
                }
            }
            match bad {
                None => {
                    self.runs_ok += 1;
                    self.events += r.events.len() as u64;
                    self.delivered += r.events.len() as u64;
                }
                Some(b) => {
                    self.runs_failed += 1;
                    self.problem(format!("run {}: {b}", r.run_id));
                }
            }
        }
        if let (Some(a), Some(b)) = (first, last) {
            self.seconds = b.duration_since(a).as_secs_f64();
            if self.seconds > 0.0 {
                self.runs_per_s = self.runs_ok as f64 / self.seconds;
            }
        }
    }

    /// Checks each viewer's stream against its thread's caller events: the same ids and
    /// data, in the same order, nothing else.
    fn judge_viewers(
        &mut self,
        logs: &[(usize, ViewerLog)],
        expected: &[Vec<(Option<String>, Bytes)>],
    ) {
        for (w, log) in logs {
            let want = &expected[*w];
            let got: Vec<(Option<String>, Bytes)> = log
                .seen
                .iter()
                .map(|s| (s.id.clone(), s.data.clone()))
                .collect();
            self.delivered += got.len() as u64;
            if got != *want {
                let errors = sequence_errors(
                    want.iter().map(|(i, d)| (i.as_deref(), d)),
                    got.iter().map(|(i, d)| (i.as_deref(), d)),
                );
                self.viewer_errors += errors.max(1);
                self.problem(format!(
                    "viewer of thread {w}: {} events, expected {} ({errors} lost/duplicated/reordered/unexpected){}",
                    got.len(),
                    want.len(),
                    log.error.as_ref().map(|e| format!("; {e}")).unwrap_or_default()
                ));
            }
        }
    }

    /// Checks the publishes and each viewer's stream against the published events (same
    /// events as JSON, in order, each with an id, no id twice).
    fn judge_publish(
        &mut self,
        sent: &[RunRead],
        logs: &[(usize, ViewerLog)],
        expected: &[Vec<Bytes>],
    ) {
        let first = sent.iter().map(|r| r.start).min();
        let last = sent
            .iter()
            .filter_map(|r| r.events.last().map(|e| e.at))
            .max();
        let mut times: HashMap<(usize, usize), Instant> = HashMap::new();
        let mut index = vec![0usize; expected.len()];
        let mut sent_ok = vec![true; expected.len()];
        for r in sent {
            if let Some(e) = &r.error {
                self.runs_failed += 1;
                sent_ok[r.worker] = false;
                self.problem(format!("publish of run {}: {e}", r.run_id));
            } else {
                self.runs_ok += 1;
            }
            // `events` of a publishing worker: one entry per event, `at` = when it was sent.
            for e in &r.events {
                times.insert((r.worker, index[r.worker]), e.at);
                index[r.worker] += 1;
                self.events += 1;
            }
        }
        if let (Some(a), Some(b)) = (first, last) {
            self.seconds = b.duration_since(a).as_secs_f64();
            if self.seconds > 0.0 {
                self.runs_per_s = self.runs_ok as f64 / self.seconds;
            }
        }
        let mut h = stats::histogram();
        for (w, log) in logs {
            self.delivered += log.seen.len() as u64;
            let want = &expected[*w];
            let mut ids = HashSet::new();
            let mut bad = log.seen.len() != want.len() && sent_ok[*w];
            for (k, s) in log.seen.iter().enumerate() {
                if let Some(t) = times.get(&(*w, k)) {
                    stats::record(
                        &mut h,
                        s.at.saturating_duration_since(*t).as_micros() as u64,
                    );
                }
                let same = want.get(k).is_some_and(|d| same_json(d, &s.data));
                let fresh = s.id.as_ref().is_some_and(|id| ids.insert(id.clone()));
                bad |= !same || !fresh;
            }
            if bad {
                let errors = sequence_errors(
                    want.iter().map(|d| (None, d)),
                    log.seen.iter().map(|s| (None, &s.data)),
                );
                self.viewer_errors += errors.max(1);
                self.problem(format!(
                    "viewer of publish thread {w}: {} events, expected {}{}",
                    log.seen.len(),
                    want.len(),
                    log.error
                        .as_ref()
                        .map(|e| format!("; {e}"))
                        .unwrap_or_default()
                ));
            }
        }
        self.viewer_latency = Summary::of(&h);
    }

    /// Time to first event and request-to-arrival latencies; `starts` maps a thread's
    /// (worker's) event id to its run's request time (viewers).
    fn latencies(
        &mut self,
        reads: &[RunRead],
        starts: &HashMap<(usize, String), Instant>,
        logs: &[(usize, ViewerLog)],
    ) {
        let mut ttfe = stats::histogram();
        let mut caller = stats::histogram();
        for r in reads.iter().filter(|r| r.error.is_none()) {
            if let Some(e) = r.events.first() {
                stats::record(&mut ttfe, us(e.at, r.start));
            }
            for e in &r.events {
                stats::record(&mut caller, us(e.at, r.start));
            }
        }
        let mut viewer: Histogram<u64> = stats::histogram();
        for (w, log) in logs {
            for s in &log.seen {
                if let Some(t) = s.id.as_ref().and_then(|id| starts.get(&(*w, id.clone()))) {
                    stats::record(&mut viewer, us(s.at, *t));
                }
            }
        }
        self.ttfe = Summary::of(&ttfe);
        self.caller_latency = Summary::of(&caller);
        self.viewer_latency = Summary::of(&viewer);
    }

    fn cpu(&mut self, a: Option<ProcSample>, b: Option<ProcSample>) {
        if let (Some(a), Some(b)) = (a, b) {
            let d = a.delta(&b);
            let cpu = d.user_s + d.sys_s;
            self.broker_cpu_s = Some(cpu);
            if self.delivered > 0 {
                self.broker_ns_per_delivery = Some(cpu * 1e9 / self.delivered as f64);
                self.broker_user_ns_per_delivery = Some(d.user_s * 1e9 / self.delivered as f64);
            }
        }
    }
}

impl Seen {
    fn data_has(&self, needle: &str) -> bool {
        memchr::memmem::find(&self.data, needle.as_bytes()).is_some()
    }
}

fn us(at: Instant, start: Instant) -> u64 {
    at.saturating_duration_since(start).as_micros() as u64
}

/// The `type` of each event.
fn types(events: &[Seen]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            serde_json::from_slice::<Value>(&e.data)
                .ok()
                .and_then(|v| v["type"].as_str().map(str::to_string))
                .unwrap_or_else(|| "?".into())
        })
        .collect()
}

fn same_json(a: &[u8], b: &[u8]) -> bool {
    a == b
        || matches!(
            (serde_json::from_slice::<Value>(a), serde_json::from_slice::<Value>(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Events of `want` missing from `got`, plus events of `got` beyond what `want` holds
/// (duplicates, strangers), plus one when the common events come in another order.
fn sequence_errors<'a>(
    want: impl Iterator<Item = (Option<&'a str>, &'a Bytes)>,
    got: impl Iterator<Item = (Option<&'a str>, &'a Bytes)>,
) -> u64 {
    let want: Vec<_> = want.collect();
    let got: Vec<_> = got.collect();
    let mut left: HashMap<(Option<&str>, &[u8]), usize> = HashMap::new();
    for (i, d) in &want {
        *left.entry((*i, &d[..])).or_default() += 1;
    }
    let mut extra = 0u64;
    let mut common = Vec::new();
    for (i, d) in &got {
        match left.get_mut(&(*i, &d[..])) {
            Some(n) if *n > 0 => {
                *n -= 1;
                common.push((*i, &d[..]));
            }
            _ => extra += 1,
        }
    }
    let lost: u64 = left.values().map(|&n| n as u64).sum();
    let in_order: Vec<_> = want
        .iter()
        .map(|(i, d)| (*i, &d[..]))
        .filter(|x| common.contains(x))
        .collect();
    lost + extra + u64::from(in_order != common)
}

fn progress(ctx: &Ctx, p: &PhaseResult) {
    if ctx.common.quiet {
        return;
    }
    eprintln!(
        "round {} {:<8} {} runs ok, {} failed, {:.1} runs/s, {} delivered, ttfe p50/p99 {}/{} µs, caller p99 {} µs, viewer p99 {} µs, broker {} ns/delivery (user {})",
        p.round,
        p.phase,
        p.runs_ok,
        p.runs_failed,
        p.runs_per_s,
        p.delivered,
        p.ttfe.p50_us,
        p.ttfe.p99_us,
        p.caller_latency.p99_us,
        p.viewer_latency.p99_us,
        p.broker_ns_per_delivery
            .map_or_else(|| "-".into(), |n| format!("{n:.0}")),
        p.broker_user_ns_per_delivery
            .map_or_else(|| "-".into(), |n| format!("{n:.0}")),
    );
}

/// Per round, the gateway's broker CPU per delivered event over the publish phase's, and
/// their median/min/max over the rounds.
fn summarize(phases: &[PhaseResult]) -> Value {
    let mut ratios = Vec::new();
    let mut rounds = Vec::new();
    let rmax = phases.iter().map(|p| p.round).max().unwrap_or(0);
    for round in 1..=rmax {
        let get = |name: &str| phases.iter().find(|p| p.round == round && p.phase == name);
        let (g, b) = (get("gateway"), get("publish"));
        let ratio = match (
            g.and_then(|p| p.broker_ns_per_delivery),
            b.and_then(|p| p.broker_ns_per_delivery),
        ) {
            (Some(g), Some(b)) if b > 0.0 => Some(g / b),
            _ => None,
        };
        if let Some(r) = ratio {
            ratios.push(r);
        }
        rounds.push(json!({
            "round": round,
            "gateway_ns_per_delivery": g.and_then(|p| p.broker_ns_per_delivery),
            "publish_ns_per_delivery": b.and_then(|p| p.broker_ns_per_delivery),
            "gateway_user_ns_per_delivery": g.and_then(|p| p.broker_user_ns_per_delivery),
            "publish_user_ns_per_delivery": b.and_then(|p| p.broker_user_ns_per_delivery),
            "cpu_ratio": ratio,
            "gateway_runs_per_s": g.map(|p| p.runs_per_s),
            "direct_ttfe_p50_us": get("direct").map(|p| p.ttfe.p50_us),
            "gateway_ttfe_p50_us": g.map(|p| p.ttfe.p50_us),
        }));
    }
    ratios.sort_by(f64::total_cmp);
    json!({
        "rounds": rounds,
        "cpu_ratio_median": ratios.get(ratios.len() / 2),
        "cpu_ratio_min": ratios.first(),
        "cpu_ratio_max": ratios.last(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::from(s.to_string())
    }

    #[test]
    fn sequence_errors_count_lost_extra_and_order() {
        let want = [b("a"), b("b"), b("c")];
        let pairs = |v: &[Bytes]| v.to_vec();
        let count = |got: &[Bytes]| {
            let w = pairs(&want);
            let g = pairs(got);
            sequence_errors(w.iter().map(|d| (None, d)), g.iter().map(|d| (None, d)))
        };
        assert_eq!(count(&want), 0);
        assert_eq!(count(&[b("a"), b("c")]), 1, "one lost");
        assert_eq!(count(&[b("a"), b("b"), b("b"), b("c")]), 1, "one duplicate");
        assert_eq!(count(&[b("a"), b("c"), b("b")]), 1, "reordered");
        assert_eq!(count(&[b("a"), b("b"), b("c"), b("x")]), 1, "a stranger");
    }

    #[test]
    fn inputs_are_run_agent_inputs() {
        let v: Value = serde_json::from_slice(&client::run_input("t", "r")).unwrap();
        assert_eq!(v["threadId"], "t");
        assert_eq!(v["runId"], "r");
        assert_eq!(v["messages"][0]["role"], "user");
    }
}
