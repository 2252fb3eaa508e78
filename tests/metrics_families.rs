//! A fresh broker's `/metrics` lists every metric family that the alert rules, their unit
//! tests, the Grafana dashboard and the HPA's adapter rule name (deploy/), so no rule or panel
//! references a metric that does not exist, and each family is there before its first
//! increment (a counter series born at 1 is invisible to `rate()`/`increase()`). Runs the real
//! binary on the test Redis, as a pod does.

mod common;

use common::broker::{self, BrokerProcess};
use common::sse_client::{self, metric, publish_ok};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

/// The deploy/ files whose metric names must exist.
const USERS: &[&str] = &[
    "deploy/prometheus/agui-fanout.rules.yml",
    "deploy/prometheus/agui-fanout.rules.test.yml",
    "deploy/grafana/agui-fanout.json",
    "deploy/k8s/overlays/production/hpa.yaml",
    "deploy/k8s/overlays/production/prometheus-adapter-values.yaml",
];

/// Every `agui_…` / `process_…` name in `text` (a name: lowercase letters, digits, `_`; not
/// ending in `_`, which is a prose wildcard such as `agui_*`).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["agui_", "process_"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(prefix) {
            let start = from + i;
            let before = text[..start].chars().next_back();
            let rest = &text[start..];
            let len = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            from = start + len.max(1);
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name = &rest[..len];
            if !name.ends_with('_') {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// Families of a Prometheus text exposition (`# TYPE name kind`) with their kinds, and the
/// samples (`name{labels} value`).
fn parse(exposition: &str) -> (BTreeMap<String, String>, Vec<(String, f64)>) {
    let mut families = BTreeMap::new();
    let mut samples = Vec::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                families.insert(name.to_string(), kind.to_string());
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').expect("sample line: series value");
            samples.push((series.to_string(), value.parse().expect("sample value")));
        }
    }
    (families, samples)
}

#[tokio::test]
async fn metrics_at_start_list_every_family_deploy_uses() {
    let node = BrokerProcess::spawn(&[("AGUI_REDIS_URL", broker::redis_url())]).await;
    let text = reqwest::get(format!("{}/metrics", node.base()))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let (families, samples) = parse(&text);

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    for file in USERS {
        let body = std::fs::read_to_string(root.join(file)).expect("deploy file is readable");
        for name in metric_names(&body) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| families.get(*f).is_some_and(|k| k == "histogram"))
                })
                .unwrap_or(&name)
                .to_string();
            if !families.contains_key(&family) {
                missing.push(format!("{name} ({file})"));
            }
            used.insert(family);
        }
    }
    assert!(
        missing.is_empty(),
        "named in deploy/ but not on a fresh broker's /metrics: {missing:?}\n{text}"
    );
    // The rules and the dashboard do use the families this test is about.
    for f in [
        "agui_backend_errors_total",
        "agui_resets_total",
        "agui_connections",
        "process_open_fds",
        "process_max_fds",
        "agui_append_to_read_seconds",
        "agui_runs_ended_total",
        "agui_redis_tail_stalled",
    ] {
        assert!(used.contains(f), "{f} is not used in deploy/ any more");
    }

    // Zero series for bounded label sets, so the first increment is an increase.
    let value = |series: &str| {
        samples
            .iter()
            .find(|(s, _)| s == series)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no series {series} at start:\n{text}"))
    };
    assert_eq!(value(r#"agui_resets_total{cause="epoch"}"#), 0.0);
    assert_eq!(
        value(r#"agui_backend_errors_total{backend="redis",op="tail"}"#),
        0.0
    );
    assert_eq!(
        value(r#"agui_events_published_total{type="TEXT_MESSAGE_CONTENT"}"#),
        0.0
    );
    assert_eq!(value(r#"agui_disconnects_total{cause="overflow"}"#), 0.0);
    assert_eq!(value("agui_connections"), 0.0);
    // The tail-stalled alert's gauge is there, at 0, before any stall.
    assert_eq!(value("agui_redis_tail_stalled"), 0.0);
    // Readiness known from start (a first ping), not from the first operation.
    assert_eq!(value("agui_backend_up"), 1.0);
    assert_eq!(
        value(&format!(
            r#"agui_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        )),
        1.0
    );
    // The process's own figures are real readings.
    assert!(value("process_open_fds") > 0.0);
    assert!(value("process_max_fds") > 0.0);
    assert!(value("process_resident_memory_bytes") > 1e6);
}

/// The tail-lag histogram counts what the node's fan-out reads off Redis: one batch read for a
/// followed thread, one sample (the Redis entry id carries the append time).
#[tokio::test]
async fn tail_lag_is_recorded_per_batch_read_from_redis() {
    let node = BrokerProcess::spawn(&[("AGUI_REDIS_URL", broker::redis_url())]).await;
    let base = node.base();
    let thread = broker::thread_id("lag");
    let count = "agui_append_to_read_seconds_count";
    assert_eq!(metric(&base, count, &[]).await, 0.0);
    let mut sub = sse_client::subscribe(&base, &thread, "", None).await;
    publish_ok(
        &base,
        &thread,
        &[json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"})],
    )
    .await;
    sub.take(1, Duration::from_secs(10)).await;
    // Recorded once the fan-out's lock is dropped, which may be just after the frame left.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while metric(&base, count, &[]).await < 1.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(metric(&base, count, &[]).await >= 1.0);
    // Read within a second of the append on one machine (bucket `le="+Inf"` holds all).
    assert_eq!(
        metric(&base, "agui_append_to_read_seconds_bucket", &[("le", "1")]).await,
        metric(&base, count, &[]).await
    );
}

#[test]
fn metric_names_are_found_in_expressions_and_prose() {
    let names = metric_names(
        r#"sum(rate(agui_resets_total{cause="x"}[5m])) / process_max_fds; agui_* my_agui_x"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["agui_resets_total", "process_max_fds"]
    );
}
