//! The one percentile function every benchmark (`sandboxd bench` and the per-area bench.rs
//! files) reports with, so that a p50 means the same in every table of BENCHMARKS.md.

use std::time::Duration;

/// The `q`-quantile (0.0..=1.0) of a sorted sample by nearest rank: the smallest sample
/// with at least a `q` share of the samples at or below it. Zero for an empty sample.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let n = sorted.len();
    let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(5));
        assert_eq!(percentile(&v, 0.95), Duration::from_millis(10));
        assert_eq!(percentile(&v, 0.0), Duration::from_millis(1));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(10));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
        let one = [Duration::from_millis(7)];
        assert_eq!(percentile(&one, 0.99), Duration::from_millis(7));
    }
}
