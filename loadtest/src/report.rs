//! Results: the JSON file, the Markdown summary and the SVG plots (latency CDF per step;
//! throughput and p99 against the offered rate for sweeps).

use crate::scenario::{ConnectSummary, StepResult, SubSummary, TimePoint};
use crate::stats;
use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Correctness verdict of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Checks {
    /// No failure.
    pub ok: bool,
    /// What failed (gaps, duplicates, connect errors, missing events, inexact resumes).
    pub failures: Vec<String>,
    /// Worth knowing, not a failure (publish errors, resets of slow subscribers, ...).
    pub warnings: Vec<String>,
}

/// Everything a run produced.
#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    /// `agui-loadtest`.
    pub tool: &'static str,
    /// Its version.
    pub version: &'static str,
    /// The scenario's name.
    pub scenario: String,
    /// Name of the result files.
    pub label: String,
    /// Start, seconds since the UNIX epoch.
    pub started_unix: u64,
    /// The command-line options.
    pub options: serde_json::Value,
    /// Where it ran.
    pub env: serde_json::Value,
    /// Subscriber connections.
    pub connect: Option<ConnectSummary>,
    /// Measured steps.
    pub steps: Vec<StepResult>,
    /// Per-subscriber figures.
    pub subscribers: Option<SubSummary>,
    /// Figures particular to the scenario.
    pub scenario_result: serde_json::Value,
    /// Changes of the broker's `agui_*_total` counters over the run.
    pub broker_metrics_delta: BTreeMap<String, f64>,
    /// Once-a-second samples.
    pub timeline: Vec<TimePoint>,
    /// The verdict.
    pub checks: Checks,
    /// Latency histograms of the normal subscribers per step, for the plot.
    #[serde(skip)]
    pub latency_plots: Vec<(String, Histogram<u64>)>,
}

/// Writes `<label>.json`, `<label>.md` and the plots into `dir`; returns their paths.
///
/// # Errors
/// The directory or a file cannot be written.
pub fn write(dir: &Path, outcome: &Outcome) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut paths = Vec::new();
    let json_path = dir.join(format!("{}.json", outcome.label));
    let mut full = serde_json::to_value(outcome)?;
    full["tool"] = "agui-loadtest".into();
    full["version"] = env!("CARGO_PKG_VERSION").into();
    std::fs::write(&json_path, serde_json::to_vec_pretty(&full)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    paths.push(json_path);
    if outcome.latency_plots.iter().any(|(_, h)| !h.is_empty()) {
        let svg = dir.join(format!("{}-latency.svg", outcome.label));
        latency_svg(&svg, &outcome.latency_plots)?;
        paths.push(svg);
    }
    let rates: Vec<&StepResult> = outcome
        .steps
        .iter()
        .filter(|s| s.offered_rate > 0.0)
        .collect();
    let distinct: std::collections::BTreeSet<u64> =
        rates.iter().map(|s| s.offered_rate as u64).collect();
    if distinct.len() > 1 {
        let svg = dir.join(format!("{}-rate.svg", outcome.label));
        rate_svg(&svg, &rates)?;
        paths.push(svg);
    }
    let md_path = dir.join(format!("{}.md", outcome.label));
    let md = markdown(outcome, &paths);
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    paths.push(md_path);
    Ok(paths)
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The Markdown summary.
pub fn markdown(o: &Outcome, paths: &[PathBuf]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# agui-loadtest `{}`: {}\n", o.scenario, o.label);
    let _ = writeln!(
        md,
        "**Checks: {}**{}\n",
        if o.checks.ok { "passed" } else { "FAILED" },
        if o.checks.failures.is_empty() {
            String::new()
        } else {
            format!(" ({})", o.checks.failures.join("; "))
        }
    );
    for w in &o.checks.warnings {
        let _ = writeln!(md, "- note: {w}");
    }
    if !o.checks.warnings.is_empty() {
        md.push('\n');
    }
    if o.env["latency_from"] == "due" {
        let _ = writeln!(
            md,
            "End-to-end latency counts from each event's due time (`--latency-from due`: the \
             wait behind its connection's previous `POST` included).\n"
        );
    }
    let _ = writeln!(
        md,
        "Target {} (broker pid {}), load generator on {} worker thread(s), {} source address(es).\n",
        o.env["url"].as_str().unwrap_or("?"),
        o.env["broker_pid"]
            .as_u64()
            .map_or_else(|| "not given".into(), |p| p.to_string()),
        o.env["workers"],
        o.env["source_addrs"].as_array().map_or(0, Vec::len),
    );
    if let Some(c) = &o.connect {
        let _ = writeln!(
            md,
            "Subscribers: {}/{} connected in {:.2} s ({:.0}/s), {} gave up.\n",
            c.connected, c.requested, c.seconds, c.per_second, c.failed
        );
    }
    if !o.steps.is_empty() {
        md.push_str("| step | offered/s | acked/s | deliveries/s | p50 ms | p99 ms | p99.9 ms | max ms | missing | broker CPU | broker µs/delivery user+sys | loadgen CPU | sustained |\n");
        md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for s in &o.steps {
            let (cpu, per) = match &s.broker {
                Some(b) => (
                    format!("{:.0}%", b.process.cores * 100.0),
                    format!(
                        "{:.2} + {:.2}",
                        b.user_ns_per_delivery / 1000.0,
                        b.sys_ns_per_delivery / 1000.0
                    ),
                ),
                None => ("-".into(), "-".into()),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {} |",
                s.label,
                if s.offered_rate > 0.0 {
                    format!("{:.0}", s.offered_rate)
                } else {
                    "max".into()
                },
                s.publish.achieved_rate,
                s.deliveries_per_s,
                ms(s.latency.p50_us),
                ms(s.latency.p99_us),
                ms(s.latency.p999_us),
                ms(s.latency.max_us),
                s.missing,
                cpu,
                per,
                s.loadgen.cores * 100.0,
                if s.sustained {
                    "yes".to_string()
                } else {
                    format!("no: {}", s.not_sustained.join("; "))
                }
            );
        }
        md.push('\n');
        for s in &o.steps {
            let _ = writeln!(
                md,
                "- `{}`: {} events in {} POSTs over {:.2} s (POST p99 {} ms, publisher lag p99 {} ms); {} deliveries; drain {:.2} s{}{}",
                s.label,
                s.publish.acked,
                s.publish.posts,
                s.publish_s,
                ms(s.publish.post_latency.p99_us),
                ms(s.publish.lag.p99_us),
                s.delivered,
                s.drain_s,
                s.broker.as_ref().map_or(String::new(), |b| format!(
                    "; broker {:.2} s user + {:.2} s sys, RSS {:.1} → {:.1} MiB, {:.2} µs CPU per published event",
                    b.process.user_s,
                    b.process.sys_s,
                    b.process.rss_start_kib as f64 / 1024.0,
                    b.process.rss_end_kib as f64 / 1024.0,
                    b.total_ns_per_publish / 1000.0
                )),
                s.latency_slow.map_or(String::new(), |l| format!(
                    "; slow subscribers p99 {} ms",
                    ms(l.p99_us)
                )),
            );
        }
        md.push('\n');
    }
    if let Some(s) = &o.subscribers {
        let _ = writeln!(
            md,
            "Subscribers: {} delivered, {} gaps, {} duplicates, {} connect errors, {} missing at the end, {} resets ({} events skipped by them), {} inexact resumes, {} streams closed by the broker; deliveries per subscriber {}/{}/{} (min/median/max), per-subscriber p99 {}/{}/{} ms.\n",
            s.delivered,
            s.gaps,
            s.duplicates,
            s.connect_errors,
            s.missing_at_end,
            s.resets,
            s.reset_skipped,
            s.inexact_resumes,
            s.peer_closes,
            s.deliveries.min,
            s.deliveries.median,
            s.deliveries.max,
            ms(s.p99_us.min),
            ms(s.p99_us.median),
            ms(s.p99_us.max),
        );
    }
    if o.scenario_result.as_object().is_some_and(|m| !m.is_empty()) {
        let _ = writeln!(
            md,
            "Scenario figures:\n\n```json\n{}\n```\n",
            serde_json::to_string_pretty(&o.scenario_result).unwrap_or_default()
        );
    }
    if !o.broker_metrics_delta.is_empty() {
        md.push_str("Broker counters (change over the run):\n\n");
        for (k, v) in &o.broker_metrics_delta {
            let _ = writeln!(md, "- `{k}`: {v}");
        }
        md.push('\n');
    }
    for p in paths {
        if p.extension().is_some_and(|e| e == "svg") {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            let _ = writeln!(md, "![{name}]({name})");
        }
    }
    md
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e:?}")
}

/// Two panels: the CDF (latency, log scale) and the tail (percentile on a
/// `1/(1-p)` log scale against latency).
fn latency_svg(path: &Path, series: &[(String, Histogram<u64>)]) -> Result<()> {
    let root = SVGBackend::new(path, (1100, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (left, right) = root.split_horizontally(550);
    let all: Vec<(&String, Vec<(f64, f64)>)> = series
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(l, h)| (l, stats::cdf_points(h)))
        .collect();
    let lo = all
        .iter()
        .flat_map(|(_, p)| p.first().map(|x| x.0))
        .fold(f64::INFINITY, f64::min)
        .max(0.001);
    let hi = all
        .iter()
        .flat_map(|(_, p)| p.last().map(|x| x.0))
        .fold(0.0, f64::max)
        .max(lo * 10.0);
    {
        let mut chart = ChartBuilder::on(&left)
            .caption("latency CDF", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((lo * 0.9..hi * 1.1).log_scale(), 0.0..1.0)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("end-to-end latency, ms")
            .y_desc("fraction of deliveries")
            .draw()
            .map_err(plot_err)?;
        for (i, (label, pts)) in all.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(plot_err)?;
    }
    {
        // x = 1/(1-p): 2 is the median, 100 is p99, 1000 p99.9.
        let tail: Vec<(&String, Vec<(f64, f64)>)> = series
            .iter()
            .filter(|(_, h)| !h.is_empty())
            .map(|(l, h)| {
                let pts = (0..=400)
                    .map(|i| {
                        let x = 10f64.powf(i as f64 / 100.0); // 1 .. 10^4
                        let q = 1.0 - 1.0 / x;
                        (x, h.value_at_quantile(q).max(1) as f64 / 1000.0)
                    })
                    .collect();
                (l, pts)
            })
            .collect();
        let mut chart = ChartBuilder::on(&right)
            .caption("latency by percentile", ("sans-serif", 20))
            .margin(12)
            .margin_right(30)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(
                (1.0..10_000.0f64).log_scale(),
                (lo * 0.9..hi * 1.1).log_scale(),
            )
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency, ms")
            .x_label_formatter(&|x| {
                let p = format!("{:.3}", (1.0 - 1.0 / x) * 100.0);
                format!("{}%", p.trim_end_matches('0').trim_end_matches('.'))
            })
            .draw()
            .map_err(plot_err)?;
        for (i, (label, pts)) in tail.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Two panels against the offered rate: deliveries/s, and p99 latency.
fn rate_svg(path: &Path, steps: &[&StepResult]) -> Result<()> {
    let mut pts: Vec<(f64, f64, f64)> = steps
        .iter()
        .map(|s| {
            (
                s.offered_rate,
                s.deliveries_per_s.max(s.publish.achieved_rate),
                (s.latency.p99_us.max(1) as f64) / 1000.0,
            )
        })
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (left, right) = root.split_horizontally(550);
    let xmax = pts.iter().map(|p| p.0).fold(1.0, f64::max) * 1.05;
    let ymax = pts.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    {
        let mut chart = ChartBuilder::on(&left)
            .caption("throughput vs offered rate", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("offered events/s")
            .y_desc("deliveries/s")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0, p.1)),
                COLORS[0].stroke_width(2),
            ))
            .map_err(plot_err)?;
        chart
            .draw_series(
                pts.iter()
                    .map(|p| Circle::new((p.0, p.1), 4, COLORS[0].filled())),
            )
            .map_err(plot_err)?;
    }
    {
        let lo = pts
            .iter()
            .map(|p| p.2)
            .fold(f64::INFINITY, f64::min)
            .max(0.001);
        let hi = pts.iter().map(|p| p.2).fold(0.0, f64::max).max(lo * 10.0);
        let mut chart = ChartBuilder::on(&right)
            .caption("p99 latency vs offered rate", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..xmax, (lo * 0.8..hi * 1.2).log_scale())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("offered events/s")
            .y_desc("p99, ms")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0, p.2)),
                COLORS[1].stroke_width(2),
            ))
            .map_err(plot_err)?;
        chart
            .draw_series(
                pts.iter()
                    .map(|p| Circle::new((p.0, p.2), 4, COLORS[1].filled())),
            )
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}
