//! Latency histograms (HDR, microseconds) and their summaries.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency recorded, µs (larger values are clamped to it): 100 s.
pub const MAX_US: u64 = 100_000_000;

/// A histogram of microseconds, 1 µs to 100 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

/// A small per-subscriber histogram of microseconds (2 significant digits, ~11 KB).
pub fn small_histogram() -> Histogram<u32> {
    Histogram::new_with_bounds(1, MAX_US, 2).expect("valid histogram bounds")
}

/// Records `us` (clamped to 1 µs … [`MAX_US`]).
pub fn record<T: hdrhistogram::Counter>(h: &mut Histogram<T>, us: u64) {
    h.saturating_record(us.clamp(1, MAX_US));
}

/// Percentiles of a latency distribution, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Summary {
    /// Number of values.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Smallest.
    pub min_us: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest.
    pub max_us: u64,
}

impl Summary {
    /// The summary of `h` (all zeros when empty).
    pub fn of<T: hdrhistogram::Counter>(h: &Histogram<T>) -> Self {
        if h.is_empty() {
            return Summary::default();
        }
        Summary {
            count: h.len(),
            mean_us: (h.mean() * 10.0).round() / 10.0,
            min_us: h.min(),
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }

    /// The summary of plain values (µs).
    pub fn of_values(values: &[u64]) -> Self {
        let mut h = histogram();
        for &v in values {
            record(&mut h, v);
        }
        Summary::of(&h)
    }
}

/// Minimum, median and maximum of some per-subscriber figure.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Spread {
    /// Smallest.
    pub min: u64,
    /// Median.
    pub median: u64,
    /// Largest.
    pub max: u64,
}

impl Spread {
    /// The spread of `values` (zeros when empty).
    pub fn of(mut values: Vec<u64>) -> Self {
        if values.is_empty() {
            return Spread::default();
        }
        values.sort_unstable();
        Spread {
            min: values[0],
            median: values[values.len() / 2],
            max: values[values.len() - 1],
        }
    }
}

/// Points `(latency ms, cumulative fraction)` of `h`'s distribution, one per distinct
/// recorded value (the step function's upper corners).
pub fn cdf_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let total = h.len() as f64;
    if total == 0.0 {
        return Vec::new();
    }
    h.iter_recorded()
        .map(|v| {
            (
                h.highest_equivalent(v.value_iterated_to()) as f64 / 1000.0,
                v.count_since_last_iteration() as f64,
            )
        })
        .scan(0.0, |acc, (ms, c)| {
            *acc += c;
            Some((ms, *acc / total))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_and_cdf() {
        let mut h = histogram();
        for v in 1..=1000u64 {
            record(&mut h, v);
        }
        let s = Summary::of(&h);
        assert_eq!(s.count, 1000);
        assert_eq!(s.p50_us, 500);
        assert_eq!(s.p99_us, 990);
        assert_eq!(s.max_us, 1000);
        let cdf = cdf_points(&h);
        assert_eq!(cdf.len(), 1000);
        assert!((cdf.last().unwrap().1 - 1.0).abs() < 1e-9);
        assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(Summary::of(&histogram()), Summary::default());
        assert_eq!(
            Spread::of(vec![3, 1, 2]),
            Spread {
                min: 1,
                median: 2,
                max: 3
            }
        );
        let mut small = small_histogram();
        record(&mut small, 0);
        record(&mut small, u64::MAX);
        assert_eq!(small.len(), 2);
    }
}
