//! `agui-hiccup`: how long this machine keeps a spinning thread off its CPU. It reads the
//! monotonic clock in a loop for `--seconds` and counts the gaps between two reads longer than
//! 1, 2, 5 and 10 ms: time the thread did not run (the hypervisor, kernel work, other
//! processes). Run it pinned, idle machine, one per CPU (`taskset -c 0 agui-hiccup & taskset
//! -c 1 agui-hiccup`): a server's latency tail cannot be lower than the stalls of its CPU, so
//! this is the floor under the load test's p99 (`loadtest/REPORT.md`, session 17).

use std::time::{Duration, Instant};

/// Gap thresholds counted, in milliseconds.
const THRESHOLDS_MS: [u64; 4] = [1, 2, 5, 10];

fn main() {
    let mut seconds = 20.0_f64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => match args.next().and_then(|s| s.parse().ok()) {
                Some(s) if s > 0.0 => seconds = s,
                _ => usage("--seconds needs a positive number"),
            },
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let run = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut prev = start;
    let mut counts = [0u64; THRESHOLDS_MS.len()];
    // Time spent in gaps longer than 1 ms: the share of the run the thread did not run.
    let mut lost = Duration::ZERO;
    let mut max = Duration::ZERO;
    loop {
        let now = Instant::now();
        let gap = now - prev;
        prev = now;
        if gap >= Duration::from_millis(1) {
            lost += gap;
            for (count, ms) in counts.iter_mut().zip(THRESHOLDS_MS) {
                if gap > Duration::from_millis(ms) {
                    *count += 1;
                }
            }
        }
        max = max.max(gap);
        if now - start >= run {
            break;
        }
    }
    let per_s = |n: u64| n as f64 / seconds;
    println!(
        "{seconds} s: gaps > 1 ms {} ({:.1}/s), > 2 ms {} ({:.1}/s), > 5 ms {} ({:.2}/s), \
         > 10 ms {} ({:.2}/s); longest {:.2} ms; {:.2} % of the time in gaps > 1 ms",
        counts[0],
        per_s(counts[0]),
        counts[1],
        per_s(counts[1]),
        counts[2],
        per_s(counts[2]),
        counts[3],
        per_s(counts[3]),
        max.as_secs_f64() * 1e3,
        lost.as_secs_f64() / seconds * 100.0
    );
}

fn usage(error: &str) -> ! {
    if !error.is_empty() {
        eprintln!("error: {error}");
    }
    eprintln!("usage: agui-hiccup [--seconds N]   (default 20; pin it with taskset)");
    std::process::exit(if error.is_empty() { 0 } else { 2 });
}
