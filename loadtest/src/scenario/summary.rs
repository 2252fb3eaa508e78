//! Per-subscriber figures over a whole session and the checks on them (gaps, duplicates,
//! missing deliveries, resets).

use super::StreamPlan;
use super::session::Finished;
use crate::report::Checks;
use crate::stats::Spread;
use crate::subscriber::Group;
use serde::Serialize;
use serde_json::json;

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

pub(super) fn summarize(fin: &Finished, plan: &StreamPlan) -> (SubSummary, Checks) {
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
