//! Per-model-version statistics, recorded as Triton records them.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tritium_config::ModelConfig;
use tritium_metrics::{HistogramSnapshot, Summary};
use tritium_sync::Locked;

use crate::types::{BatchStats, ModelStats, StatDuration};

fn add(s: &mut StatDuration, d: Duration) {
    s.count += 1;
    s.ns += d.as_nanos() as u64;
}

/// The timings of one execution, shared by every request in its batch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ExecTimes {
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
}

impl ExecTimes {
    /// The sums an ensemble request's steps added up.
    pub(crate) fn tallied(tally: &crate::types::ComputeTally) -> Self {
        let [compute_input, compute_infer, compute_output] = tally.totals();
        Self { compute_input, compute_infer, compute_output }
    }

    /// Adds these times to `tally` (an ensemble step's, when the request is one).
    pub(crate) fn add_to(&self, tally: Option<&crate::types::ComputeTally>) {
        if let Some(tally) = tally {
            tally.add(self.compute_input, self.compute_infer, self.compute_output);
        }
    }
}

/// The latency summaries of one model version (`--metrics-config summary_latencies=true`), in
/// microseconds, recorded as Triton records them.
#[derive(Debug, Default)]
struct Summaries {
    request: Summary,
    queue: Summary,
    compute_input: Summary,
    compute_infer: Summary,
    compute_output: Summary,
    cache_hit: Summary,
    cache_miss: Summary,
}

fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

/// The first-response histogram's buckets: the last `histogram_options` the config's
/// `model_metrics` gives for its family, else Triton's defaults.
fn first_response_buckets(config: &ModelConfig) -> Vec<f64> {
    use tritium_config::proto::model_metrics::metric_control::MetricOptions;
    let controls = config.model_metrics.as_ref().map(|m| m.metric_control.as_slice()).unwrap_or_default();
    controls
        .iter()
        .filter(|c| c.metric_identifier.as_ref().is_some_and(|id| id.family == tritium_metrics::FIRST_RESPONSE_FAMILY))
        .filter_map(|c| c.metric_options.as_ref().map(|MetricOptions::HistogramOptions(h)| h.buckets.clone()))
        .next_back()
        .unwrap_or_else(|| tritium_metrics::FIRST_RESPONSE_BUCKETS_MS.to_vec())
}

/// Statistics of one model version.
#[derive(Debug)]
pub(crate) struct Stats {
    stats: Mutex<ModelStats>,
    /// Kept only when the server records latency summaries; a lock of its own, taken once per
    /// request after the statistics' one.
    summaries: Option<Mutex<Summaries>>,
    /// Request to first response, in whole milliseconds: kept only for a decoupled model when
    /// the server records latency histograms.
    first_response: Option<Mutex<HistogramSnapshot>>,
}

impl Stats {
    pub(crate) fn new(name: &str, version: i64) -> Self {
        let stats = ModelStats { name: name.to_string(), version: version.to_string(), ..Default::default() };
        Self { stats: Mutex::new(stats), summaries: None, first_response: None }
    }

    /// Statistics that also record the latency summaries.
    pub(crate) fn with_summaries(name: &str, version: i64) -> Self {
        Self { summaries: Some(Mutex::default()), ..Self::new(name, version) }
    }

    /// The statistics of version `version` of model `name` (`config` completed): with the
    /// latency summaries when the server's metrics record them, and for a decoupled model with
    /// the first-response histogram when they record latency histograms, with the buckets of
    /// the config's `model_metrics` or Triton's default ones.
    pub(crate) fn for_metrics(
        name: &str,
        version: i64,
        options: &tritium_metrics::MetricsOptions,
        config: &ModelConfig,
    ) -> Self {
        let mut stats =
            if options.summary_latencies { Self::with_summaries(name, version) } else { Self::new(name, version) };
        if options.histogram_latencies && tritium_config::is_decoupled(config) {
            let buckets = first_response_buckets(config);
            stats.first_response = Some(Mutex::new(HistogramSnapshot::with_bounds(&buckets)));
        }
        stats
    }

    /// Records how long a decoupled request waited for its first response, from its arrival
    /// (nothing unless the histogram is kept). Triton observes whole milliseconds.
    pub(crate) fn first_response(&self, after: Duration) {
        if let Some(h) = &self.first_response {
            h.locked().observe(after.as_millis() as f64);
        }
    }

    /// The first-response histogram (`None` unless kept).
    pub(crate) fn first_response_histogram(&self) -> Option<Box<HistogramSnapshot>> {
        let h = self.first_response.as_ref()?;
        Some(Box::new(h.locked().clone()))
    }

    pub(crate) fn snapshot(&self) -> ModelStats {
        self.stats.locked().clone()
    }

    /// The latency summaries over their window, with `quantiles` (`None` unless recorded).
    pub(crate) fn summaries(&self, quantiles: &[(f64, f64)]) -> Option<Box<tritium_metrics::LatencySummaries>> {
        let s = self.summaries.as_ref()?.locked();
        let now = std::time::Instant::now();
        Some(Box::new(tritium_metrics::LatencySummaries {
            request: s.request.snapshot_at(quantiles, now),
            queue: s.queue.snapshot_at(quantiles, now),
            compute_input: s.compute_input.snapshot_at(quantiles, now),
            compute_infer: s.compute_infer.snapshot_at(quantiles, now),
            compute_output: s.compute_output.snapshot_at(quantiles, now),
            cache_hit: s.cache_hit.snapshot_at(quantiles, now),
            cache_miss: s.cache_miss.snapshot_at(quantiles, now),
        }))
    }

    fn observe(&self, record: impl FnOnce(&mut Summaries)) {
        if let Some(summaries) = &self.summaries {
            record(&mut summaries.locked());
        }
    }

    /// Records one execution of `batch_size` (the sum of the requests' batch sizes).
    pub(crate) fn execution(&self, batch_size: u64, t: ExecTimes) {
        let mut s = self.stats.locked();
        s.execution_count += 1;
        // Kept sorted by batch size, as Triton reports them.
        let pos = match s.batch_stats.binary_search_by_key(&batch_size, |b| b.batch_size) {
            Ok(p) => p,
            Err(p) => {
                s.batch_stats.insert(p, BatchStats { batch_size, ..Default::default() });
                p
            }
        };
        let b = &mut s.batch_stats[pos];
        add(&mut b.compute_input, t.compute_input);
        add(&mut b.compute_infer, t.compute_infer);
        add(&mut b.compute_output, t.compute_output);
    }

    /// Records a request that succeeded after `total` (queue and compute included) and, for an
    /// ensemble's step, adds its compute times to the ensemble's.
    pub(crate) fn request_success(
        &self,
        req: &crate::types::InferRequest,
        batch_size: u64,
        total: Duration,
        queue: Duration,
        t: ExecTimes,
    ) {
        t.add_to(req.compute_tally.as_deref());
        self.success(batch_size, total, queue, t);
    }

    /// Records a request that succeeded after `total` (queue and compute included).
    pub(crate) fn success(&self, batch_size: u64, total: Duration, queue: Duration, t: ExecTimes) {
        let mut s = self.stats.locked();
        s.inference_count += batch_size.max(1);
        s.last_inference = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        add(&mut s.success, total);
        add(&mut s.queue, queue);
        add(&mut s.compute_input, t.compute_input);
        add(&mut s.compute_infer, t.compute_infer);
        add(&mut s.compute_output, t.compute_output);
        drop(s);
        self.observe(|m| {
            let now = std::time::Instant::now();
            m.request.observe_at(us(total), now);
            m.queue.observe_at(us(queue), now);
            m.compute_input.observe_at(us(t.compute_input), now);
            m.compute_infer.observe_at(us(t.compute_infer), now);
            m.compute_output.observe_at(us(t.compute_output), now);
        });
    }

    /// Records a request answered from the response cache (Triton's `UpdateSuccessCacheHit`): a
    /// success of `total`, queued for `queue`, whose lookup took `lookup`; no inference,
    /// execution or compute is counted.
    pub(crate) fn cache_hit(&self, total: Duration, queue: Duration, lookup: Duration) {
        let mut s = self.stats.locked();
        s.last_inference = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        add(&mut s.success, total);
        add(&mut s.queue, queue);
        add(&mut s.cache_hit, lookup);
        drop(s);
        // Unlike Triton 2.51, whose request summary leaves out models with the cache, a hit is a
        // request like any other here.
        self.observe(|m| {
            let now = std::time::Instant::now();
            m.request.observe_at(us(total), now);
            m.queue.observe_at(us(queue), now);
            m.cache_hit.observe_at(us(lookup), now);
        });
    }

    /// Records a cache miss of a request that succeeded: `lookup_and_insert` is the time spent
    /// looking it up and inserting its answer (Triton's `UpdateSuccessCacheMiss`).
    pub(crate) fn cache_miss(&self, lookup_and_insert: Duration) {
        let mut s = self.stats.locked();
        add(&mut s.cache_miss, lookup_and_insert);
        drop(s);
        self.observe(|m| m.cache_miss.observe(us(lookup_and_insert)));
    }

    /// Records a request that failed after `total` with an error of `kind`; `reached_model`
    /// tells a model failure from a rejection.
    pub(crate) fn failure(&self, total: Duration, kind: crate::types::ErrorKind, reached_model: bool) {
        use crate::types::ErrorKind;
        let mut s = self.stats.locked();
        add(&mut s.fail, total);
        let r = &mut s.fail_reasons;
        match (kind, reached_model) {
            (ErrorKind::Cancelled, _) => r.canceled += 1,
            (_, true) => r.backend += 1,
            (ErrorKind::InvalidArg | ErrorKind::Unavailable | ErrorKind::NotFound, false) => r.rejected += 1,
            _ => r.other += 1,
        }
    }
}
