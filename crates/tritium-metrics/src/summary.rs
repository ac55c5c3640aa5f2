//! Prometheus summaries over a sliding time window, for Triton's `--metrics-config
//! summary_latencies=true` families (`nv_inference_*_summary_us`).
//!
//! Triton's summaries are prometheus-cpp's: quantiles over the last `max_age` (60 s) in
//! `age_buckets` (5) rotating buckets, each quantile with a target error. Here the window is the
//! same (60 s in 5 buckets of 12 s), and each bucket keeps a uniform sample of its observations
//! (reservoir sampling, at most [`RESERVOIR`] values), so memory is bounded whatever the request
//! rate. A quantile is read from the samples of the live buckets, each weighted by the
//! observations it stands for. With fewer than [`RESERVOIR`] observations in a bucket the
//! quantiles are exact; above that, the sampling error of a quantile `q` is about
//! `sqrt(q (1 - q) / n)` in rank for `n` samples (about 0.3% at the median for a full window),
//! the target errors of `summary_quantiles` are not used. `_count` and `_sum` are cumulative,
//! as in Prometheus. An empty window reports `NaN`, as prometheus-cpp does.

use std::time::{Duration, Instant};

/// Values kept per bucket.
pub const RESERVOIR: usize = 1024;
/// The window quantiles are computed over (prometheus-cpp's default `max_age`).
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// Buckets the window rotates through (prometheus-cpp's default `age_buckets`).
pub const AGE_BUCKETS: u32 = 5;

/// Triton's default quantiles (`{quantile, error}`), used unless `summary_quantiles` says otherwise.
pub const DEFAULT_QUANTILES: [(f64, f64); 5] = [(0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001)];

/// What a summary reports when scraped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SummarySnapshot {
    /// `(quantile, value)` over the window, in the configured quantiles' order.
    pub quantiles: Vec<(f64, f64)>,
    /// Sum of every observation since the summary was made.
    pub sum: f64,
    /// Observations since the summary was made.
    pub count: u64,
}

#[derive(Debug, Clone, Default)]
struct Bucket {
    /// When this bucket started taking observations.
    start: Option<Instant>,
    /// Observations that went into this bucket.
    seen: u64,
    /// A uniform sample of them.
    values: Vec<f64>,
}

/// One summary series.
#[derive(Debug, Clone)]
pub struct Summary {
    buckets: Vec<Bucket>,
    /// The bucket that takes observations now.
    current: usize,
    sum: f64,
    count: u64,
    /// xorshift64 state for the reservoir's choices.
    rng: u64,
}

impl Default for Summary {
    fn default() -> Self {
        Self::new()
    }
}

impl Summary {
    /// An empty summary.
    pub fn new() -> Self {
        Self {
            buckets: vec![Bucket::default(); AGE_BUCKETS as usize],
            current: 0,
            sum: 0.0,
            count: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn bucket_width() -> Duration {
        MAX_AGE / AGE_BUCKETS
    }

    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// Moves to a fresh bucket when the current one is older than a bucket's width, dropping
    /// buckets that left the window.
    fn rotate(&mut self, now: Instant) {
        let width = Self::bucket_width();
        match self.buckets[self.current].start {
            None => self.buckets[self.current].start = Some(now),
            Some(start) if now.saturating_duration_since(start) >= width => {
                self.current = (self.current + 1) % self.buckets.len();
                let bucket = &mut self.buckets[self.current];
                bucket.start = Some(now);
                bucket.seen = 0;
                bucket.values.clear();
            }
            Some(_) => {}
        }
    }

    /// Records one observation at `now`.
    pub fn observe_at(&mut self, value: f64, now: Instant) {
        self.rotate(now);
        self.sum += value;
        self.count += 1;
        let random = self.next_random();
        let bucket = &mut self.buckets[self.current];
        bucket.seen += 1;
        if bucket.values.len() < RESERVOIR {
            bucket.values.push(value);
        } else {
            // Algorithm R: the n-th observation replaces a kept one with probability RESERVOIR / n.
            let slot = random % bucket.seen;
            if let Some(kept) = bucket.values.get_mut(slot as usize) {
                *kept = value;
            }
        }
    }

    /// Records one observation now.
    pub fn observe(&mut self, value: f64) {
        self.observe_at(value, Instant::now());
    }

    /// The quantiles of the observations in the window ending at `now`.
    pub fn snapshot_at(&self, quantiles: &[(f64, f64)], now: Instant) -> SummarySnapshot {
        let mut weighted: Vec<(f64, f64)> = Vec::new();
        for bucket in &self.buckets {
            let live = bucket.start.is_some_and(|start| now.saturating_duration_since(start) < MAX_AGE);
            if !live || bucket.values.is_empty() {
                continue;
            }
            let weight = bucket.seen as f64 / bucket.values.len() as f64;
            weighted.extend(bucket.values.iter().map(|&v| (v, weight)));
        }
        weighted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = weighted.iter().map(|(_, w)| w).sum();
        let quantiles = quantiles
            .iter()
            .map(|&(q, _)| {
                if weighted.is_empty() {
                    return (q, f64::NAN);
                }
                // The smallest value whose cumulative weight reaches q of the total.
                let target = q.clamp(0.0, 1.0) * total;
                let mut cumulative = 0.0;
                let mut value = weighted[weighted.len() - 1].0;
                for &(v, w) in &weighted {
                    cumulative += w;
                    if cumulative >= target {
                        value = v;
                        break;
                    }
                }
                (q, value)
            })
            .collect();
        SummarySnapshot { quantiles, sum: self.sum, count: self.count }
    }

    /// The quantiles of the observations of the last [`MAX_AGE`].
    pub fn snapshot(&self, quantiles: &[(f64, f64)]) -> SummarySnapshot {
        self.snapshot_at(quantiles, Instant::now())
    }
}

/// Parses Triton's `summary_quantiles` value, `<quantile>:<error>,...` (e.g.
/// `0.5:0.05,0.9:0.01`). Unlike Triton, which logs and skips a bad pair, a bad pair is an error
/// here, so a typo stops the start instead of silently changing the quantiles.
pub fn parse_quantiles(value: &str) -> Result<Vec<(f64, f64)>, String> {
    let mut out = Vec::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (q, e) = pair
            .split_once(':')
            .ok_or_else(|| format!("[{pair}] has no ':' delimiter; the format is <quantile>:<error>,..."))?;
        let q: f64 = q.trim().parse().map_err(|_| format!("[{pair}]: {q:?} is not a number"))?;
        let e: f64 = e.trim().parse().map_err(|_| format!("[{pair}]: {e:?} is not a number"))?;
        if !(0.0..=1.0).contains(&q) || !(0.0..=1.0).contains(&e) {
            return Err(format!("[{pair}]: a quantile and its error lie between 0 and 1"));
        }
        out.push((q, e));
    }
    if out.is_empty() {
        return Err("no quantiles given; the format is <quantile>:<error>,...".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(s: &SummarySnapshot) -> Vec<f64> {
        s.quantiles.iter().map(|(_, v)| *v).collect()
    }

    #[test]
    fn small_windows_are_exact_and_count_and_sum_are_cumulative() {
        let mut s = Summary::new();
        let t0 = Instant::now();
        for v in 1..=100 {
            s.observe_at(v as f64, t0);
        }
        let snap = s.snapshot_at(&DEFAULT_QUANTILES, t0);
        assert_eq!(values(&snap), [50.0, 90.0, 95.0, 99.0, 100.0]);
        assert_eq!((snap.count, snap.sum), (100, 5050.0));
    }

    #[test]
    fn an_empty_window_is_nan_as_in_prometheus_cpp() {
        let s = Summary::new();
        let snap = s.snapshot(&[(0.5, 0.05)]);
        assert!(snap.quantiles[0].1.is_nan());
        assert_eq!(snap.count, 0);
    }

    #[test]
    fn old_observations_leave_the_window_but_stay_counted() {
        let mut s = Summary::new();
        let t0 = Instant::now();
        for _ in 0..10 {
            s.observe_at(1000.0, t0);
        }
        let later = t0 + MAX_AGE + Duration::from_secs(1);
        for _ in 0..10 {
            s.observe_at(1.0, later);
        }
        let snap = s.snapshot_at(&[(0.99, 0.001)], later);
        assert_eq!(values(&snap), [1.0], "the slow minute is gone from the quantiles");
        assert_eq!((snap.count, snap.sum), (20, 10010.0));
        let empty = s.snapshot_at(&[(0.5, 0.05)], later + MAX_AGE);
        assert!(empty.quantiles[0].1.is_nan());
    }

    #[test]
    fn buckets_rotate_and_share_the_window_by_their_weight() {
        let mut s = Summary::new();
        let t0 = Instant::now();
        let width = MAX_AGE / AGE_BUCKETS;
        // 10 fast observations in one bucket, 10 slow ones in the next: the median splits them.
        for _ in 0..10 {
            s.observe_at(1.0, t0);
        }
        for _ in 0..10 {
            s.observe_at(9.0, t0 + width);
        }
        let snap = s.snapshot_at(&[(0.25, 0.0), (0.75, 0.0)], t0 + width);
        assert_eq!(values(&snap), [1.0, 9.0]);
    }

    #[test]
    fn memory_stays_bounded_and_large_windows_stay_close() {
        let mut s = Summary::new();
        let t0 = Instant::now();
        // 100,000 observations of 0..1000 in one bucket: at most RESERVOIR kept.
        for i in 0..100_000u64 {
            s.observe_at((i % 1000) as f64, t0);
        }
        assert!(s.buckets.iter().all(|b| b.values.len() <= RESERVOIR));
        let snap = s.snapshot_at(&[(0.5, 0.05), (0.9, 0.01)], t0);
        assert!((snap.quantiles[0].1 - 500.0).abs() < 60.0, "{snap:?}");
        assert!((snap.quantiles[1].1 - 900.0).abs() < 40.0, "{snap:?}");
        assert_eq!(snap.count, 100_000);
    }

    #[test]
    fn quantile_settings_are_parsed_and_bad_ones_named() {
        assert_eq!(parse_quantiles("0.5:0.05,0.9:0.01").expect("ok"), [(0.5, 0.05), (0.9, 0.01)]);
        assert!(parse_quantiles("0.5").expect_err("no colon").contains("no ':' delimiter"));
        assert!(parse_quantiles("x:0.1").expect_err("nan").contains("not a number"));
        assert!(parse_quantiles("1.5:0.1").expect_err("range").contains("between 0 and 1"));
        assert!(parse_quantiles("").is_err());
    }
}
