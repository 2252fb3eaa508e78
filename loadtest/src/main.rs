//! `agui-loadtest`: a load generator for agui-fanout (or any SSE broker with the same
//! publish/subscribe shape). It drives a running broker over real sockets and writes a JSON
//! result file, a Markdown summary and SVG plots. `loadtest/README.md` explains the scenarios.
//!
//! Exit code: 0 when the correctness checks passed (0 gaps, 0 duplicates, no connect errors,
//! nothing missing, exact resumes), 1 when one failed, 2 on an error that stopped the run.

#![warn(missing_docs)]

mod mix;
mod net;
mod payload;
mod procfs;
mod publisher;
mod report;
mod runs;
mod scenario;
mod stats;
mod subscriber;
mod wire;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;

/// Load generator for agui-fanout: publishes AG-UI events at a target rate, follows them
/// over SSE, and reports deliveries, latency, gaps/duplicates, broker CPU and memory.
#[derive(Debug, Parser)]
#[command(name = "agui-loadtest", version, about, args_override_self = true)]
pub struct Cli {
    /// Options of every scenario.
    #[command(flatten)]
    pub common: Common,
    /// The scenario to run.
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// Options of every scenario.
#[derive(Clone, Debug, Args, Serialize)]
pub struct Common {
    /// Broker base URL (plain http).
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Directory for the result files (created if missing).
    #[arg(long, global = true, default_value = "loadtest/results")]
    pub out: PathBuf,
    /// Name of the result files (default: `<scenario>-<unix time>`).
    #[arg(long, global = true)]
    pub label: Option<String>,
    /// The broker's process id: its CPU (user/kernel) and RSS are sampled from /proc.
    #[arg(long, global = true)]
    pub broker_pid: Option<u32>,
    /// Client sockets are bound in turn to 127.0.0.1 … 127.0.0.N (loopback targets only;
    /// 0: let the kernel choose).
    #[arg(long, global = true, default_value_t = 8)]
    pub source_addrs: usize,
    /// Runtime worker threads (default: the CPUs this process may run on; 1 = one thread).
    #[arg(long, global = true)]
    pub workers: Option<usize>,
    /// Subscriber connections being opened at once (first connections only).
    #[arg(long, global = true, default_value_t = 256)]
    pub connect_concurrency: usize,
    /// Publish path; `{thread}` is replaced by the thread id.
    #[arg(long, global = true, default_value = "/v1/threads/{thread}/events")]
    pub publish_path: String,
    /// Subscribe path; `{thread}` is replaced by the thread id.
    #[arg(long, global = true, default_value = "/v1/threads/{thread}/events")]
    pub subscribe_path: String,
    /// Prometheus metrics path read before and after the run ("" to skip).
    #[arg(long, global = true, default_value = "/metrics")]
    pub metrics_path: String,
    /// Do not publish a RUN_STARTED to each thread first (brokers without order checks).
    #[arg(long, global = true)]
    pub no_run_started: bool,
    /// No progress lines on stderr.
    #[arg(long, global = true)]
    pub quiet: bool,
    /// Exit 0 even when a correctness check failed.
    #[arg(long, global = true)]
    pub no_fail: bool,
    /// A bearer token sent with every publish and subscribe (`Authorization: Bearer`), for a
    /// broker with authentication on (PROTOCOL §8); `agui-fanout token` makes one.
    #[arg(long, global = true)]
    pub bearer: Option<String>,
    /// What an event's end-to-end latency counts from: `send` (the time its `POST` went out)
    /// or `due` (the time the open-loop schedule meant it to go out, so the time it waited
    /// behind its connection's previous `POST` counts too: the correction for coordinated
    /// omission; closed-loop publishing has no due time and stamps the send time).
    #[arg(long, global = true, value_enum, default_value_t = LatencyFrom::Send)]
    pub latency_from: LatencyFrom,
}

/// Where end-to-end latency starts (`--latency-from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LatencyFrom {
    /// The event's `POST` went out.
    Send,
    /// The event was due by the open-loop schedule.
    Due,
}

/// Publishing and measuring options of the streaming scenarios.
#[derive(Clone, Debug, Args, Serialize)]
pub struct Load {
    /// Events per second published, over all threads (default depends on the scenario;
    /// `ingest` only: 0 = closed loop, as fast as the broker answers).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seconds of publishing per step.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// The events published: `tokens` (LLM token stream), `agent` (a recorded agent turn) or
    /// `custom` (the original `CUSTOM` events of `--event-bytes`); see loadtest/README.md.
    #[arg(long, value_enum, default_value_t = payload::Mix::Tokens)]
    pub mix: payload::Mix,
    /// Approximate size of each event, bytes of JSON (`--mix custom` only).
    #[arg(long, default_value_t = 200)]
    pub event_bytes: usize,
    /// Keep-alive publishing connections (each thread is published by one of them).
    #[arg(long, default_value_t = 8)]
    pub publish_conns: usize,
    /// Most events in one POST (a connection that falls behind sends a thread's backlog
    /// together as a JSON array; `ingest` closed loop: events per POST). 1: every POST is one
    /// bare event object, as brokers that store a body as one message (nchan) need.
    #[arg(long, default_value_t = 100)]
    pub max_batch: u64,
    /// Seconds to wait after publishing for every event to reach every subscriber.
    #[arg(long, default_value_t = 10.0)]
    pub drain_timeout: f64,
    /// Rate sweep instead of one rate: `r1,r2,…` or `geom:START:MAX:FACTOR`; stops at the
    /// first rate not sustained, then bisects (`--sweep-refine`).
    #[arg(long)]
    pub sweep: Option<String>,
    /// Latency bound of a sustained rate: p99 end-to-end (or POST round trip for `ingest`
    /// without subscribers), milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub sweep_p99_ms: f64,
    /// Bisection steps between the last sustained and the first failed sweep rate.
    #[arg(long, default_value_t = 2)]
    pub sweep_refine: u32,
    /// Seconds of pause between steps.
    #[arg(long, default_value_t = 1.0)]
    pub pause: f64,
}

/// What slow subscribers do in the `slow` scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SlowModeArg {
    /// Stop reading altogether (the connection stays open).
    Stall,
    /// Read `--slow-read-bytes` every `--slow-read-interval-ms`.
    Slow,
}

/// The scenarios.
#[derive(Clone, Debug, Subcommand, Serialize)]
#[serde(tag = "scenario", rename_all = "kebab-case")]
pub enum Scenario {
    /// 1 thread × N subscribers: fan-out of every event to many connections.
    Fanout {
        /// Subscribers.
        #[arg(long, default_value_t = 1000)]
        subscribers: usize,
        /// Publishing and measuring options.
        #[command(flatten)]
        load: Load,
    },
    /// T threads × S subscribers each: many independent streams.
    Threads {
        /// Threads.
        #[arg(long, default_value_t = 1000)]
        threads: usize,
        /// Subscribers per thread.
        #[arg(long, default_value_t = 10)]
        subscribers: usize,
        /// Publishing and measuring options.
        #[command(flatten)]
        load: Load,
    },
    /// N idle SSE connections: broker RSS per connection.
    Idle {
        /// Connections.
        #[arg(long, default_value_t = 10000)]
        connections: usize,
        /// Threads the connections are spread over.
        #[arg(long, default_value_t = 100)]
        threads: usize,
        /// Seconds to wait after the last connection before measuring.
        #[arg(long, default_value_t = 2.0)]
        settle: f64,
        /// Seconds to hold the connections open (measured again at the end).
        #[arg(long, default_value_t = 5.0)]
        hold: f64,
    },
    /// A share of subscribers stall or read slowly: the others' latency, broker memory.
    Slow {
        /// Threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Subscribers per thread.
        #[arg(long, default_value_t = 1000)]
        subscribers: usize,
        /// Share of subscribers that turn slow.
        #[arg(long, default_value_t = 0.1)]
        slow_share: f64,
        /// What they do.
        #[arg(long, value_enum, default_value_t = SlowModeArg::Stall)]
        slow_mode: SlowModeArg,
        /// `slow` mode: bytes per read.
        #[arg(long, default_value_t = 4096)]
        slow_read_bytes: usize,
        /// `slow` mode: milliseconds between reads.
        #[arg(long, default_value_t = 100)]
        slow_read_interval_ms: u64,
        /// Skip the baseline step (everyone reading) before the slow step.
        #[arg(long)]
        no_baseline: bool,
        /// Publishing and measuring options.
        #[command(flatten)]
        load: Load,
    },
    /// M subscribers drop their connections and reconnect with Last-Event-ID at once.
    ResumeStorm {
        /// Threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Subscribers per thread.
        #[arg(long, default_value_t = 1000)]
        subscribers: usize,
        /// Seconds into the step when the storm is called (default: half the duration).
        #[arg(long)]
        storm_at: Option<f64>,
        /// Publishing and measuring options.
        #[command(flatten)]
        load: Load,
    },
    /// Publish throughput (run the broker with its redis backend to measure that).
    Ingest {
        /// Threads.
        #[arg(long, default_value_t = 100)]
        threads: usize,
        /// Subscribers per thread (0: publish only).
        #[arg(long, default_value_t = 0)]
        subscribers: usize,
        /// Publishing and measuring options.
        #[command(flatten)]
        load: Load,
    },
    /// Concurrent AG-UI runs through the run gateway against the demo agent, with viewers,
    /// against the same events published plainly (broker CPU per delivered event).
    Runs(runs::RunsArgs),
}

impl Scenario {
    /// The scenario's name.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Fanout { .. } => "fanout",
            Scenario::Threads { .. } => "threads",
            Scenario::Idle { .. } => "idle",
            Scenario::Slow { .. } => "slow",
            Scenario::ResumeStorm { .. } => "resume-storm",
            Scenario::Ingest { .. } => "ingest",
            Scenario::Runs(_) => "runs",
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let workers = cli.common.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let runtime = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = match runtime.block_on(scenario::run(cli, workers)) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    // Subscriber tasks may still hold sockets: do not wait for them.
    runtime.shutdown_background();
    std::process::exit(code);
}
