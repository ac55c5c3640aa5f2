//! The server's metrics: Triton's per-model `nv_inference_*` families and tritium's per-instance
//! `tritium_stub_*` families, built from a [`Snapshot`] taken at scrape time and written by the
//! same renderer as the custom metrics ([`crate::text`]). Nothing is kept between scrapes, so a
//! series that is not in the snapshot (an unloaded model, a stub with no process) is not on the
//! page.

use std::sync::Arc;
use std::time::Duration;

use crate::custom::CustomMetrics;
use crate::host::{HostSampler, HostSnapshot};
use crate::summary::SummarySnapshot;
use crate::text::{Family, Number, SeriesValue};
use crate::types::MetricKind;

/// What the server knows about one model version when `/metrics` is scraped.
///
/// Counts and durations are cumulative since the version was loaded; durations are in
/// nanoseconds (Triton's statistics unit) and are exported in microseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelSnapshot {
    /// The model's name (label `model`).
    pub name: String,
    /// The version (label `version`), e.g. `"1"`.
    pub version: String,
    /// Successful requests, all batch sizes.
    pub success: u64,
    /// Failed requests by reason.
    pub failure: FailureCounts,
    /// Inferences performed (a request of batch size n counts n).
    pub inference_count: u64,
    /// Model executions performed (one per batch).
    pub exec_count: u64,
    /// Cumulative request duration (arrival to response), in nanoseconds.
    pub request_duration_ns: u64,
    /// Cumulative time requests spent queued, in nanoseconds.
    pub queue_duration_ns: u64,
    /// Cumulative time spent preparing inputs, in nanoseconds.
    pub compute_input_duration_ns: u64,
    /// Cumulative time spent executing the model, in nanoseconds.
    pub compute_infer_duration_ns: u64,
    /// Cumulative time spent extracting outputs, in nanoseconds.
    pub compute_output_duration_ns: u64,
    /// Requests waiting for execution now.
    pub pending_requests: u64,
    /// How long loading the version took, in seconds (`nv_model_load_duration_secs`); `None`
    /// leaves the series out.
    pub load_duration_secs: Option<f64>,
    /// The response cache's counts, for a version that uses the cache (`None`: the
    /// `nv_cache_*_per_model` series are left out, as Triton leaves them out for models
    /// without the cache).
    pub cache: Option<CacheCounts>,
    /// The latency summaries (`--metrics-config summary_latencies=true`; `None` otherwise).
    pub summaries: Option<Box<LatencySummaries>>,
    /// Request to first response, in milliseconds (`nv_inference_first_response_histogram_ms`):
    /// recorded for decoupled models under `--metrics-config histogram_latencies=true`, as in
    /// Triton; `None` leaves the series out.
    pub first_response: Option<Box<HistogramSnapshot>>,
}

/// The state of one histogram series.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// Finite upper bounds, strictly increasing.
    pub bounds: Vec<f64>,
    /// Observations per bucket, not cumulative: one more than `bounds`, the last for `+Inf`.
    pub counts: Vec<u64>,
    /// The sum of the observations.
    pub sum: f64,
    /// How many observations.
    pub count: u64,
}

impl HistogramSnapshot {
    /// An empty histogram with upper bounds `bounds` (sorted, deduplicated, finite ones kept).
    pub fn with_bounds(bounds: &[f64]) -> Self {
        let mut bounds: Vec<f64> = bounds.iter().copied().filter(|b| b.is_finite()).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let counts = vec![0; bounds.len() + 1];
        Self { bounds, counts, sum: 0.0, count: 0 }
    }

    /// Counts one observation `value` in the first bucket whose bound is at least `value`.
    pub fn observe(&mut self, value: f64) {
        let bucket = self.bounds.partition_point(|b| *b < value);
        if let Some(n) = self.counts.get_mut(bucket) {
            *n += 1;
        }
        self.sum += value;
        self.count += 1;
    }
}

/// The first-response histogram's default upper bounds, in milliseconds (Triton's).
pub const FIRST_RESPONSE_BUCKETS_MS: [f64; 4] = [100.0, 500.0, 2000.0, 5000.0];

/// The family of the first-response histogram, whose buckets a model's config may set.
pub const FIRST_RESPONSE_FAMILY: &str = "nv_inference_first_response_histogram_ms";

/// A model version's latency summaries (`nv_inference_*_summary_us`, and for a version that
/// uses the response cache `nv_cache_*_summary_per_model`), in microseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencySummaries {
    /// Successful requests, arrival to response (cache hits included).
    pub request: SummarySnapshot,
    /// Time queued (cache hits included).
    pub queue: SummarySnapshot,
    /// Preparing inputs.
    pub compute_input: SummarySnapshot,
    /// Executing the model.
    pub compute_infer: SummarySnapshot,
    /// Extracting outputs.
    pub compute_output: SummarySnapshot,
    /// Lookups that hit the cache.
    pub cache_hit: SummarySnapshot,
    /// Lookups that missed, with the insert of the answer.
    pub cache_miss: SummarySnapshot,
}

/// A cache-enabled model version's response-cache counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Requests answered from the cache.
    pub hits: u64,
    /// Requests looked up and not found (then executed and inserted).
    pub misses: u64,
    /// Cumulative lookup time of the hits, in nanoseconds.
    pub hit_duration_ns: u64,
    /// Cumulative lookup and insert time of the misses, in nanoseconds.
    pub miss_duration_ns: u64,
}

/// Failed requests by the reasons Triton distinguishes (the `reason` label of
/// `nv_inference_request_failure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureCounts {
    /// `REJECTED`: refused before execution (queue full, timeout in the queue).
    pub rejected: u64,
    /// `CANCELED`: cancelled by the client or the server.
    pub canceled: u64,
    /// `BACKEND`: the model (stub) failed the request.
    pub backend: u64,
    /// `OTHER`: any other failure.
    pub other: u64,
}

/// What the supervisor knows about one model instance (one stub) when `/metrics` is scraped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InstanceSnapshot {
    /// The model's name (label `model`).
    pub model: String,
    /// The version (label `version`).
    pub version: String,
    /// The instance's name (label `instance`), e.g. `"mymodel_0_0"`.
    pub instance: String,
    /// The stub's current state (label `state` of `tritium_stub_state`), e.g. `"ready"`.
    pub state: String,
    /// How many times the stub was restarted.
    pub restarts: u64,
    /// Events the supervisor refused as impossible in the state they came in (a bug if not 0).
    pub impossible_transitions: u64,
    /// The stub's resident memory in bytes; `None` (no live process) leaves the series out.
    pub rss_bytes: Option<u64>,
    /// Shared memory mapped for the stub (control and arena segments), in bytes.
    pub shm_bytes: u64,
    /// Requests the stub is executing now.
    pub inflight: u64,
    /// Stubs of this instance recycled so far, by reason (`rss`, `requests`); summed per model
    /// into `tritium_stub_recycled_total{model,reason}`.
    pub recycled: Vec<(String, u64)>,
}

/// Everything `/metrics` reports about the server, taken at scrape time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// One entry per loaded model version.
    pub models: Vec<ModelSnapshot>,
    /// One entry per model instance.
    pub instances: Vec<InstanceSnapshot>,
    /// The server's response cache, when it has one (`tritium_cache_*`).
    pub cache: Option<CacheSnapshot>,
    /// What each live stub's `prometheus_client` registry held.
    pub client: Vec<crate::client::StubFamilies>,
    /// One entry per model instance under `--rate-limit execution_count`.
    pub rate_limited: Vec<RateLimitedSnapshot>,
}

/// How an instance fared with the rate limiter (`tritium_rate_limiter_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitedSnapshot {
    /// The model's name (label `model`).
    pub model: String,
    /// The version (label `version`).
    pub version: String,
    /// The instance's name (label `instance`).
    pub instance: String,
    /// Executions that waited for their resources.
    pub waits: u64,
    /// Their total wait, in microseconds.
    pub wait_us: u64,
}

/// What the server's response cache holds when `/metrics` is scraped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheSnapshot {
    /// Responses held.
    pub entries: u64,
    /// Bytes held.
    pub used_bytes: u64,
    /// The cache's byte size.
    pub capacity_bytes: u64,
    /// Responses evicted to make room, since the server started.
    pub evictions: u64,
    /// Lookups made, since the server started.
    pub lookups: u64,
    /// Lookups that found a response.
    pub hits: u64,
    /// Time spent in lookups, hit or miss, in nanoseconds.
    pub lookup_ns: u64,
    /// Time spent inserting responses, in nanoseconds.
    pub insertion_ns: u64,
}

/// Options matching Triton's `--metrics-config`.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsOptions {
    /// Export the cumulative `nv_inference_*_duration_us` counters (Triton's
    /// `counter_latencies`, default true).
    pub counter_latencies: bool,
    /// Record and export the latency summaries (Triton's `summary_latencies`, default false).
    pub summary_latencies: bool,
    /// The summaries' `(quantile, error)` pairs (Triton's `summary_quantiles`).
    pub summary_quantiles: Vec<(f64, f64)>,
    /// Record and export the first-response histogram of decoupled models (Triton's
    /// `histogram_latencies`, default false).
    pub histogram_latencies: bool,
    /// Export the host's CPU and memory gauges (`nv_cpu_*`; Triton's `--allow-cpu-metrics`,
    /// default true).
    pub cpu_metrics: bool,
    /// How often the host gauges are sampled: at most twice per interval (Triton's
    /// `--metrics-interval-ms`, default 2000 ms).
    pub interval: Duration,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        Self {
            counter_latencies: true,
            summary_latencies: false,
            summary_quantiles: crate::summary::DEFAULT_QUANTILES.to_vec(),
            histogram_latencies: false,
            cpu_metrics: true,
            interval: Duration::from_millis(2000),
        }
    }
}

/// One server metric family: name, HELP text and the TYPE line's type.
#[derive(Debug)]
struct FamilyDef {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
}

macro_rules! family {
    // Summaries are the server's alone (custom metrics have no such kind).
    ($ident:ident, $name:literal, Summary, $help:literal) => {
        const $ident: FamilyDef = FamilyDef { name: $name, help: $help, kind: "summary" };
    };
    ($ident:ident, $name:literal, $kind:ident, $help:literal) => {
        const $ident: FamilyDef = FamilyDef { name: $name, help: $help, kind: MetricKind::$kind.prometheus_type() };
    };
}

// Names, HELP texts and types exactly as Triton registers them (core `src/metrics.cc`).
family!(SUCCESS, "nv_inference_request_success", Counter, "Number of successful inference requests, all batch sizes");
family!(FAILURE, "nv_inference_request_failure", Counter, "Number of failed inference requests, all batch sizes");
family!(COUNT, "nv_inference_count", Counter, "Number of inferences performed (does not include cached requests)");
family!(
    EXEC_COUNT,
    "nv_inference_exec_count",
    Counter,
    "Number of model executions performed (does not include cached requests)"
);
family!(
    REQUEST_DURATION,
    "nv_inference_request_duration_us",
    Counter,
    "Cumulative inference request duration in microseconds (includes cached requests)"
);
family!(
    QUEUE_DURATION,
    "nv_inference_queue_duration_us",
    Counter,
    "Cumulative inference queuing duration in microseconds (includes cached requests)"
);
family!(
    COMPUTE_INPUT_DURATION,
    "nv_inference_compute_input_duration_us",
    Counter,
    "Cumulative compute input duration in microseconds (does not include cached requests)"
);
family!(
    COMPUTE_INFER_DURATION,
    "nv_inference_compute_infer_duration_us",
    Counter,
    "Cumulative compute inference duration in microseconds (does not include cached requests)"
);
family!(
    COMPUTE_OUTPUT_DURATION,
    "nv_inference_compute_output_duration_us",
    Counter,
    "Cumulative inference compute output duration in microseconds (does not include cached requests)"
);
family!(
    PENDING,
    "nv_inference_pending_request_count",
    Gauge,
    "Instantaneous number of pending requests awaiting execution per-model."
);
family!(CACHE_HITS, "nv_cache_num_hits_per_model", Counter, "Number of cache hits per model");
family!(
    CACHE_HIT_DURATION,
    "nv_cache_hit_duration_per_model",
    Counter,
    "Total cache hit duration per model, in microseconds"
);
family!(CACHE_MISSES, "nv_cache_num_misses_per_model", Counter, "Number of cache misses per model");
family!(
    CACHE_MISS_DURATION,
    "nv_cache_miss_duration_per_model",
    Counter,
    "Total cache miss (insert+lookup) duration per model, in microseconds"
);
family!(LOAD_DURATION, "nv_model_load_duration_secs", Gauge, "Model load time in seconds");
family!(CPU_UTILIZATION, "nv_cpu_utilization", Gauge, "CPU utilization rate [0.0 - 1.0]");
family!(CPU_MEMORY_TOTAL, "nv_cpu_memory_total_bytes", Gauge, "CPU total memory (RAM), in bytes");
family!(CPU_MEMORY_USED, "nv_cpu_memory_used_bytes", Gauge, "CPU used memory (RAM), in bytes");

family!(
    REQUEST_SUMMARY,
    "nv_inference_request_summary_us",
    Summary,
    "Summary of inference request duration in microseconds (includes cached requests)"
);
family!(
    QUEUE_SUMMARY,
    "nv_inference_queue_summary_us",
    Summary,
    "Summary of inference queuing duration in microseconds (includes cached requests)"
);
// Triton registers these three summaries with its counters' HELP texts.
family!(
    COMPUTE_INPUT_SUMMARY,
    "nv_inference_compute_input_summary_us",
    Summary,
    "Cumulative compute input duration in microseconds (does not include cached requests)"
);
family!(
    COMPUTE_INFER_SUMMARY,
    "nv_inference_compute_infer_summary_us",
    Summary,
    "Cumulative compute inference duration in microseconds (does not include cached requests)"
);
family!(
    COMPUTE_OUTPUT_SUMMARY,
    "nv_inference_compute_output_summary_us",
    Summary,
    "Cumulative inference compute output duration in microseconds (does not include cached requests)"
);
family!(
    CACHE_HIT_SUMMARY,
    "nv_cache_hit_summary_per_model",
    Summary,
    "Summary of cache hit counts/durations per model, in microseconds."
);
family!(
    CACHE_MISS_SUMMARY,
    "nv_cache_miss_summary_per_model",
    Summary,
    "Summary of cache miss counts/durations per model, in microseconds."
);
/// The summary families, in Triton's order.
const SUMMARIES: [&FamilyDef; 7] = [
    &REQUEST_SUMMARY,
    &QUEUE_SUMMARY,
    &COMPUTE_INPUT_SUMMARY,
    &COMPUTE_INFER_SUMMARY,
    &COMPUTE_OUTPUT_SUMMARY,
    &CACHE_HIT_SUMMARY,
    &CACHE_MISS_SUMMARY,
];
// The server's response cache as Triton's local cache reports it (all gauges, no labels).
family!(CACHE_UTIL, "nv_cache_util", Gauge, "Cache utilization [0.0 - 1.0]");
family!(CACHE_NUM_ENTRIES, "nv_cache_num_entries", Gauge, "Number of responses stored in response cache");
family!(CACHE_NUM_HITS, "nv_cache_num_hits", Gauge, "Number of cache hits in response cache");
family!(CACHE_NUM_MISSES, "nv_cache_num_misses", Gauge, "Number of cache misses in response cache");
family!(CACHE_NUM_LOOKUPS, "nv_cache_num_lookups", Gauge, "Number of cache lookups in response cache");
family!(CACHE_NUM_EVICTIONS, "nv_cache_num_evictions", Gauge, "Number of cache evictions in response cache");
family!(
    CACHE_LOOKUP_DURATION,
    "nv_cache_lookup_duration",
    Gauge,
    "Total cache lookup duration (hit and miss), in microseconds"
);
family!(
    CACHE_INSERTION_DURATION,
    "nv_cache_insertion_duration",
    Gauge,
    "Total cache insertion duration, in microseconds"
);
// tritium's own, for the server's response cache (bytes, and evictions as a counter).
family!(CACHE_ENTRIES, "tritium_cache_entries", Gauge, "Number of responses held by the response cache");
family!(CACHE_USED, "tritium_cache_used_bytes", Gauge, "Bytes held by the response cache");
family!(
    CACHE_CAPACITY,
    "tritium_cache_capacity_bytes",
    Gauge,
    "Byte size of the response cache (--cache-config local,size=N)"
);
family!(
    CACHE_EVICTIONS,
    "tritium_cache_evictions_total",
    Counter,
    "Number of responses evicted from the response cache to make room"
);
// tritium's own, per model instance.
family!(
    STUB_STATE,
    "tritium_stub_state",
    Gauge,
    "State of the stub process of a model instance: 1 for the state it is in (label state)"
);
family!(
    STUB_RESTARTS,
    "tritium_stub_restarts_total",
    Counter,
    "Number of times the supervisor restarted the stub of a model instance"
);
family!(
    STUB_IMPOSSIBLE_TRANSITIONS,
    "tritium_stub_impossible_transitions_total",
    Counter,
    "Number of events the supervisor of a model instance refused as impossible in its state (a bug if not 0)"
);
family!(STUB_RSS, "tritium_stub_rss_bytes", Gauge, "Resident memory of the stub process of a model instance, in bytes");
family!(
    STUB_SHM,
    "tritium_stub_shm_bytes",
    Gauge,
    "Shared memory mapped for the stub of a model instance (control and arena segments), in bytes"
);
family!(
    STUB_RECYCLED,
    "tritium_stub_recycled_total",
    Counter,
    "Number of stubs of a model replaced by a fresh one for passing a limit (label reason: rss for stub_max_rss_bytes, requests for stub_max_requests)"
);
family!(
    STUB_INFLIGHT,
    "tritium_stub_inflight_requests",
    Gauge,
    "Number of requests the stub of a model instance is executing now"
);
family!(
    RATE_LIMITER_WAITS,
    "tritium_rate_limiter_waits_total",
    Counter,
    "Number of executions of a model instance that waited for rate limiter resources"
);
family!(
    RATE_LIMITER_WAIT_DURATION,
    "tritium_rate_limiter_wait_duration_us",
    Counter,
    "Cumulative time executions of a model instance waited for rate limiter resources, in microseconds"
);

/// The server's families in output order (Triton's registration order, then tritium's).
const FAMILIES: [&FamilyDef; 39] = [
    &SUCCESS,
    &FAILURE,
    &COUNT,
    &EXEC_COUNT,
    &REQUEST_DURATION,
    &QUEUE_DURATION,
    &COMPUTE_INPUT_DURATION,
    &COMPUTE_INFER_DURATION,
    &COMPUTE_OUTPUT_DURATION,
    &CACHE_HITS,
    &CACHE_HIT_DURATION,
    &CACHE_MISSES,
    &CACHE_MISS_DURATION,
    &PENDING,
    &LOAD_DURATION,
    &CPU_UTILIZATION,
    &CPU_MEMORY_TOTAL,
    &CPU_MEMORY_USED,
    &CACHE_UTIL,
    &CACHE_NUM_ENTRIES,
    &CACHE_NUM_HITS,
    &CACHE_NUM_MISSES,
    &CACHE_NUM_LOOKUPS,
    &CACHE_NUM_EVICTIONS,
    &CACHE_LOOKUP_DURATION,
    &CACHE_INSERTION_DURATION,
    &CACHE_ENTRIES,
    &CACHE_USED,
    &CACHE_CAPACITY,
    &CACHE_EVICTIONS,
    &STUB_STATE,
    &STUB_RESTARTS,
    &STUB_IMPOSSIBLE_TRANSITIONS,
    &STUB_RSS,
    &STUB_SHM,
    &STUB_INFLIGHT,
    &RATE_LIMITER_WAITS,
    &RATE_LIMITER_WAIT_DURATION,
    &STUB_RECYCLED,
];

/// The names of the server's metric families; custom metrics may not use them.
pub const SERVER_METRIC_NAMES: [&str; 44] = [
    SUCCESS.name,
    FAILURE.name,
    COUNT.name,
    EXEC_COUNT.name,
    REQUEST_DURATION.name,
    QUEUE_DURATION.name,
    COMPUTE_INPUT_DURATION.name,
    COMPUTE_INFER_DURATION.name,
    COMPUTE_OUTPUT_DURATION.name,
    CACHE_HITS.name,
    CACHE_HIT_DURATION.name,
    CACHE_MISSES.name,
    CACHE_MISS_DURATION.name,
    PENDING.name,
    LOAD_DURATION.name,
    CPU_UTILIZATION.name,
    CPU_MEMORY_TOTAL.name,
    CPU_MEMORY_USED.name,
    CACHE_UTIL.name,
    CACHE_NUM_ENTRIES.name,
    CACHE_NUM_HITS.name,
    CACHE_NUM_MISSES.name,
    CACHE_NUM_LOOKUPS.name,
    CACHE_NUM_EVICTIONS.name,
    CACHE_LOOKUP_DURATION.name,
    CACHE_INSERTION_DURATION.name,
    CACHE_ENTRIES.name,
    CACHE_USED.name,
    CACHE_CAPACITY.name,
    CACHE_EVICTIONS.name,
    STUB_STATE.name,
    STUB_RESTARTS.name,
    STUB_IMPOSSIBLE_TRANSITIONS.name,
    STUB_RSS.name,
    STUB_SHM.name,
    STUB_INFLIGHT.name,
    STUB_RECYCLED.name,
    REQUEST_SUMMARY.name,
    QUEUE_SUMMARY.name,
    COMPUTE_INPUT_SUMMARY.name,
    COMPUTE_INFER_SUMMARY.name,
    COMPUTE_OUTPUT_SUMMARY.name,
    CACHE_HIT_SUMMARY.name,
    CACHE_MISS_SUMMARY.name,
];

struct Inner {
    options: MetricsOptions,
    custom: CustomMetrics,
    /// The host gauges' sampler, when `options.cpu_metrics`.
    host: Option<HostSampler>,
}

/// The `/metrics` registry of one server: its options and the custom metrics of its models; the
/// server's own series come from the snapshot given to each [`render`](Self::render). Cheap to
/// clone; clones share everything.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("options", &self.inner.options).finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with Triton's default options.
    pub fn new() -> Self {
        Self::with_options(MetricsOptions::default())
    }

    /// A registry with the given options.
    pub fn with_options(options: MetricsOptions) -> Self {
        let host = options.cpu_metrics.then(|| HostSampler::new(options.interval));
        let custom = CustomMetrics::with_reserved_names(&SERVER_METRIC_NAMES);
        Self { inner: Arc::new(Inner { options, custom, host }) }
    }

    /// The options it was made with (`--metrics-config`).
    pub fn options(&self) -> &MetricsOptions {
        &self.inner.options
    }

    /// The custom metrics registry (shared with this `Metrics`); it refuses the server's names.
    pub fn custom(&self) -> &CustomMetrics {
        &self.inner.custom
    }

    /// The whole `/metrics` text: the server's families from `snapshot` (Triton's order, series
    /// sorted by labels), then the custom metrics (families by name).
    pub fn render(&self, snapshot: &Snapshot) -> String {
        self.render_reporting(snapshot, &mut |_, _| {})
    }

    /// [`render`](Self::render), then the stubs' `prometheus_client` families
    /// (`snapshot.client`, merged by name); `ignored` gets the index in `snapshot.client` of
    /// each stub something was left out of, and why.
    pub fn render_reporting(&self, snapshot: &Snapshot, ignored: &mut dyn FnMut(usize, String)) -> String {
        let mut out = String::with_capacity(256 * (snapshot.models.len() + snapshot.instances.len()) + 1024);
        let host = self.inner.host.as_ref().map(HostSampler::sample);
        for family in server_families(snapshot, &self.inner.options, host) {
            family.render(&mut out);
        }
        for family in summary_families(snapshot) {
            family.render(&mut out);
        }
        histogram_family(snapshot).render(&mut out);
        self.inner.custom.render_to(&mut out);
        if !snapshot.client.is_empty() {
            crate::client::render_to(&mut out, &snapshot.client, &self.inner.custom.family_names(), ignored);
        }
        out
    }
}

/// The latency summary families of the versions that record them (a version that does not use
/// the response cache has no cache summaries, as in Triton).
fn summary_families(snapshot: &Snapshot) -> Vec<Family<'_>> {
    let mut families: Vec<Family<'_>> =
        SUMMARIES.iter().map(|def| Family::typed(def.name, def.help, def.kind)).collect();
    for model in &snapshot.models {
        let Some(s) = model.summaries.as_deref() else { continue };
        let labels = || vec![("model", model.name.as_str()), ("version", model.version.as_str())];
        let mut series = vec![&s.request, &s.queue, &s.compute_input, &s.compute_infer, &s.compute_output];
        if model.cache.is_some() {
            series.extend([&s.cache_hit, &s.cache_miss]);
        }
        for (family, summary) in families.iter_mut().zip(series) {
            let value =
                SeriesValue::Summary { quantiles: &summary.quantiles, sum: summary.sum, count: summary.count as f64 };
            family.push(labels(), value);
        }
    }
    families
}

/// The first-response histogram family, with a series for each version that records it (a
/// family without series is not written).
fn histogram_family(snapshot: &Snapshot) -> Family<'_> {
    let mut family = Family::typed(FIRST_RESPONSE_FAMILY, FIRST_RESPONSE_HELP, "histogram");
    for model in &snapshot.models {
        let Some(h) = model.first_response.as_deref() else { continue };
        let labels = vec![("model", model.name.as_str()), ("version", model.version.as_str())];
        family
            .push(labels, SeriesValue::Histogram { bounds: &h.bounds, counts: &h.counts, sum: h.sum, count: h.count });
    }
    family
}

/// Triton's HELP text of the first-response histogram.
const FIRST_RESPONSE_HELP: &str = "Duration from request to first response in milliseconds";

/// The server's families, in [`FAMILIES`] order, with the series of `snapshot` and the host
/// gauges. Labels are Triton's: `model` and `version` (and `reason` on failures), none on the
/// host's, `instance` on tritium's own.
fn server_families<'a>(
    snapshot: &'a Snapshot,
    options: &MetricsOptions,
    host: Option<HostSnapshot>,
) -> Vec<Family<'a>> {
    let mut families: Vec<Family<'a>> =
        FAMILIES.iter().map(|def| Family::typed(def.name, def.help, def.kind)).collect();
    let mut add = |def: &FamilyDef, labels: Vec<(&'static str, &'a str)>, value: Number| {
        // Every definition is in FAMILIES, so the family is always found.
        if let Some(family) = families.iter_mut().find(|family| family.name() == def.name) {
            family.push(labels, SeriesValue::Scalar(value));
        }
    };
    for model in &snapshot.models {
        let labels = || vec![("model", model.name.as_str()), ("version", model.version.as_str())];
        add(&SUCCESS, labels(), Number::Int(model.success));
        let failures = [
            ("REJECTED", model.failure.rejected),
            ("CANCELED", model.failure.canceled),
            ("BACKEND", model.failure.backend),
            ("OTHER", model.failure.other),
        ];
        for (reason, count) in failures {
            let labels = vec![("model", model.name.as_str()), ("reason", reason), ("version", model.version.as_str())];
            add(&FAILURE, labels, Number::Int(count));
        }
        add(&COUNT, labels(), Number::Int(model.inference_count));
        add(&EXEC_COUNT, labels(), Number::Int(model.exec_count));
        if options.counter_latencies {
            let durations = [
                (&REQUEST_DURATION, model.request_duration_ns),
                (&QUEUE_DURATION, model.queue_duration_ns),
                (&COMPUTE_INPUT_DURATION, model.compute_input_duration_ns),
                (&COMPUTE_INFER_DURATION, model.compute_infer_duration_ns),
                (&COMPUTE_OUTPUT_DURATION, model.compute_output_duration_ns),
            ];
            for (family, ns) in durations {
                add(family, labels(), Number::Int(ns / 1000));
            }
        }
        if let Some(cache) = model.cache {
            add(&CACHE_HITS, labels(), Number::Int(cache.hits));
            add(&CACHE_HIT_DURATION, labels(), Number::Int(cache.hit_duration_ns / 1000));
            add(&CACHE_MISSES, labels(), Number::Int(cache.misses));
            add(&CACHE_MISS_DURATION, labels(), Number::Int(cache.miss_duration_ns / 1000));
        }
        add(&PENDING, labels(), Number::Int(model.pending_requests));
        if let Some(secs) = model.load_duration_secs {
            add(&LOAD_DURATION, labels(), Number::Float(secs));
        }
    }
    if let Some(host) = host {
        add(&CPU_UTILIZATION, vec![], Number::Float(host.cpu_utilization));
        add(&CPU_MEMORY_TOTAL, vec![], Number::Int(host.memory_total_bytes));
        add(&CPU_MEMORY_USED, vec![], Number::Int(host.memory_used_bytes));
    }
    if let Some(cache) = snapshot.cache {
        let util = if cache.capacity_bytes == 0 { 0.0 } else { cache.used_bytes as f64 / cache.capacity_bytes as f64 };
        add(&CACHE_UTIL, vec![], Number::Float(util));
        add(&CACHE_NUM_ENTRIES, vec![], Number::Int(cache.entries));
        add(&CACHE_NUM_HITS, vec![], Number::Int(cache.hits));
        add(&CACHE_NUM_MISSES, vec![], Number::Int(cache.lookups.saturating_sub(cache.hits)));
        add(&CACHE_NUM_LOOKUPS, vec![], Number::Int(cache.lookups));
        add(&CACHE_NUM_EVICTIONS, vec![], Number::Int(cache.evictions));
        add(&CACHE_LOOKUP_DURATION, vec![], Number::Int(cache.lookup_ns / 1000));
        add(&CACHE_INSERTION_DURATION, vec![], Number::Int(cache.insertion_ns / 1000));
        add(&CACHE_ENTRIES, vec![], Number::Int(cache.entries));
        add(&CACHE_USED, vec![], Number::Int(cache.used_bytes));
        add(&CACHE_CAPACITY, vec![], Number::Int(cache.capacity_bytes));
        add(&CACHE_EVICTIONS, vec![], Number::Int(cache.evictions));
    }
    for instance in &snapshot.instances {
        let labels = || instance_labels(&instance.instance, &instance.model, &instance.version);
        let mut state = labels();
        state.push(("state", instance.state.as_str()));
        add(&STUB_STATE, state, Number::Int(1));
        add(&STUB_RESTARTS, labels(), Number::Int(instance.restarts));
        add(&STUB_IMPOSSIBLE_TRANSITIONS, labels(), Number::Int(instance.impossible_transitions));
        if let Some(rss) = instance.rss_bytes {
            add(&STUB_RSS, labels(), Number::Int(rss));
        }
        add(&STUB_SHM, labels(), Number::Int(instance.shm_bytes));
        add(&STUB_INFLIGHT, labels(), Number::Int(instance.inflight));
    }
    for limited in &snapshot.rate_limited {
        let labels = || instance_labels(&limited.instance, &limited.model, &limited.version);
        add(&RATE_LIMITER_WAITS, labels(), Number::Int(limited.waits));
        add(&RATE_LIMITER_WAIT_DURATION, labels(), Number::Int(limited.wait_us));
    }
    let mut recycled: std::collections::BTreeMap<(&str, &str), u64> = std::collections::BTreeMap::new();
    for instance in &snapshot.instances {
        for (reason, n) in &instance.recycled {
            *recycled.entry((instance.model.as_str(), reason.as_str())).or_default() += n;
        }
    }
    for ((model, reason), n) in recycled {
        add(&STUB_RECYCLED, vec![("model", model), ("reason", reason)], Number::Int(n));
    }
    families
}

/// The labels of a per-instance series, in output order.
fn instance_labels<'a>(instance: &'a str, model: &'a str, version: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![("instance", instance), ("model", model), ("version", version)]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::{MetricError, MetricKind};

    /// A registry without the host gauges, whose values depend on the machine.
    fn quiet() -> Metrics {
        Metrics::with_options(MetricsOptions { cpu_metrics: false, ..Default::default() })
    }

    #[test]
    fn the_host_gauges_are_tritons_and_off_with_allow_cpu_metrics_false() {
        let text = Metrics::new().render(&Snapshot::default());
        for (name, help) in [
            ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]"),
            ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes"),
            ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes"),
        ] {
            assert!(text.contains(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n{name} ")), "{name}: {text}");
        }
        assert_eq!(quiet().render(&Snapshot::default()), "");
    }

    fn simple() -> ModelSnapshot {
        ModelSnapshot {
            name: "simple".into(),
            version: "1".into(),
            success: 10,
            failure: FailureCounts { rejected: 1, canceled: 2, backend: 3, other: 4 },
            inference_count: 40,
            exec_count: 5,
            request_duration_ns: 1_234_567,
            queue_duration_ns: 2_000_999,
            compute_input_duration_ns: 3_000,
            compute_infer_duration_ns: 4_000_000,
            compute_output_duration_ns: 999,
            pending_requests: 2,
            load_duration_secs: Some(1.5),
            cache: None,
            summaries: None,
            first_response: None,
        }
    }

    #[test]
    fn the_first_response_histogram_is_tritons_family_with_cumulative_buckets() {
        let mut h = HistogramSnapshot::with_bounds(&FIRST_RESPONSE_BUCKETS_MS);
        for ms in [0.0, 100.0, 101.0, 2500.0, 7000.0] {
            h.observe(ms);
        }
        assert_eq!(h.counts, [2, 1, 0, 1, 1]);
        let model = ModelSnapshot { first_response: Some(Box::new(h)), ..simple() };
        let text = quiet().render(&Snapshot { models: vec![model, simple()], ..Default::default() });
        let name = FIRST_RESPONSE_FAMILY;
        let expected = format!(
            "# HELP {name} Duration from request to first response in milliseconds\n# TYPE {name} histogram\n\
             {name}_bucket{{model=\"simple\",version=\"1\",le=\"100\"}} 2\n\
             {name}_bucket{{model=\"simple\",version=\"1\",le=\"500\"}} 3\n\
             {name}_bucket{{model=\"simple\",version=\"1\",le=\"2000\"}} 3\n\
             {name}_bucket{{model=\"simple\",version=\"1\",le=\"5000\"}} 4\n\
             {name}_bucket{{model=\"simple\",version=\"1\",le=\"+Inf\"}} 5\n\
             {name}_sum{{model=\"simple\",version=\"1\"}} 9701\n\
             {name}_count{{model=\"simple\",version=\"1\"}} 5\n"
        );
        assert!(text.contains(&expected), "{text}");
        // A version without the histogram has no series, and no page has an empty family.
        assert_eq!(text.matches(&format!("{name}_count")).count(), 1);
        assert!(!quiet().render(&Snapshot { models: vec![simple()], ..Default::default() }).contains(name));
    }

    #[test]
    fn histogram_bounds_are_sorted_finite_and_unique() {
        let h = HistogramSnapshot::with_bounds(&[8.0, 1.0, f64::INFINITY, 2.0, 2.0, f64::NAN]);
        assert_eq!(h.bounds, [1.0, 2.0, 8.0]);
        assert_eq!(h.counts.len(), 4);
    }

    fn summary(count: u64, sum: f64, median: f64) -> SummarySnapshot {
        SummarySnapshot { quantiles: vec![(0.5, median), (0.99, f64::NAN)], sum, count }
    }

    #[test]
    fn summaries_are_tritons_families_after_the_counters_and_cache_ones_only_with_the_cache() {
        let metrics = quiet();
        let summaries = LatencySummaries {
            request: summary(3, 30.0, 10.0),
            queue: summary(3, 6.0, 2.0),
            cache_hit: summary(1, 1.5, 1.5),
            ..Default::default()
        };
        let plain = ModelSnapshot { summaries: Some(Box::new(summaries.clone())), ..simple() };
        let cached = ModelSnapshot {
            name: "cached".into(),
            cache: Some(CacheCounts::default()),
            summaries: Some(Box::new(summaries)),
            ..simple()
        };
        let text = metrics.render(&Snapshot { models: vec![plain, cached], ..Default::default() });
        let request: Vec<&str> = text.lines().filter(|l| l.contains("nv_inference_request_summary_us")).collect();
        assert_eq!(
            request,
            [
                "# HELP nv_inference_request_summary_us Summary of inference request duration in microseconds (includes cached requests)",
                "# TYPE nv_inference_request_summary_us summary",
                "nv_inference_request_summary_us{model=\"cached\",version=\"1\",quantile=\"0.5\"} 10",
                "nv_inference_request_summary_us{model=\"cached\",version=\"1\",quantile=\"0.99\"} NaN",
                "nv_inference_request_summary_us_sum{model=\"cached\",version=\"1\"} 30",
                "nv_inference_request_summary_us_count{model=\"cached\",version=\"1\"} 3",
                "nv_inference_request_summary_us{model=\"simple\",version=\"1\",quantile=\"0.5\"} 10",
                "nv_inference_request_summary_us{model=\"simple\",version=\"1\",quantile=\"0.99\"} NaN",
                "nv_inference_request_summary_us_sum{model=\"simple\",version=\"1\"} 30",
                "nv_inference_request_summary_us_count{model=\"simple\",version=\"1\"} 3",
            ]
        );
        let hits: Vec<&str> = text.lines().filter(|l| l.starts_with("nv_cache_hit_summary_per_model_count")).collect();
        assert_eq!(hits, ["nv_cache_hit_summary_per_model_count{model=\"cached\",version=\"1\"} 1"]);
        assert!(
            text.find("nv_inference_request_duration_us").unwrap()
                < text.find("nv_inference_request_summary_us").unwrap()
        );
        // Without summaries recorded, no summary family is on the page.
        assert!(!metrics.render(&Snapshot { models: vec![simple()], ..Default::default() }).contains("summary"));
    }

    #[test]
    fn cache_families_are_tritons_and_only_for_models_with_the_cache() {
        let metrics = quiet();
        let cached = ModelSnapshot {
            name: "cached".into(),
            version: "1".into(),
            cache: Some(CacheCounts { hits: 3, misses: 2, hit_duration_ns: 4_500, miss_duration_ns: 12_000 }),
            ..Default::default()
        };
        let text = metrics.render(&Snapshot {
            models: vec![cached, simple()],
            instances: vec![],
            cache: None,
            client: vec![],
            rate_limited: vec![],
        });
        let expected = [
            "# HELP nv_cache_num_hits_per_model Number of cache hits per model",
            "# TYPE nv_cache_num_hits_per_model counter",
            "nv_cache_num_hits_per_model{model=\"cached\",version=\"1\"} 3",
            "# HELP nv_cache_hit_duration_per_model Total cache hit duration per model, in microseconds",
            "# TYPE nv_cache_hit_duration_per_model counter",
            "nv_cache_hit_duration_per_model{model=\"cached\",version=\"1\"} 4",
            "# HELP nv_cache_num_misses_per_model Number of cache misses per model",
            "# TYPE nv_cache_num_misses_per_model counter",
            "nv_cache_num_misses_per_model{model=\"cached\",version=\"1\"} 2",
            "# HELP nv_cache_miss_duration_per_model Total cache miss (insert+lookup) duration per model, in microseconds",
            "# TYPE nv_cache_miss_duration_per_model counter",
            "nv_cache_miss_duration_per_model{model=\"cached\",version=\"1\"} 12",
        ];
        let got: Vec<&str> = text.lines().filter(|l| l.contains("nv_cache_")).collect();
        assert_eq!(got, expected);
        let start = text.find("nv_cache_num_hits_per_model").unwrap();
        assert!(text.find("nv_inference_compute_output_duration_us").unwrap() < start);
        assert!(start < text.find("nv_inference_pending_request_count").unwrap());
    }

    #[test]
    fn the_servers_cache_has_tritiums_families_when_there_is_one() {
        let metrics = quiet();
        let cache = CacheSnapshot {
            entries: 2,
            used_bytes: 300,
            capacity_bytes: 1000,
            evictions: 5,
            lookups: 3,
            hits: 1,
            lookup_ns: 20_500,
            insertion_ns: 44_000,
        };
        let text = metrics.render(&Snapshot {
            models: vec![],
            instances: vec![],
            cache: Some(cache),
            client: vec![],
            rate_limited: vec![],
        });
        let got: Vec<&str> = text.lines().filter(|l| l.starts_with("tritium_cache_")).collect();
        assert_eq!(
            got,
            [
                "tritium_cache_entries 2",
                "tritium_cache_used_bytes 300",
                "tritium_cache_capacity_bytes 1000",
                "tritium_cache_evictions_total 5"
            ]
        );
        // Triton's own names for the same cache, as its local cache reports them.
        let got: Vec<&str> = text.lines().filter(|l| l.starts_with("nv_cache_")).collect();
        assert_eq!(
            got,
            [
                "nv_cache_util 0.3",
                "nv_cache_num_entries 2",
                "nv_cache_num_hits 1",
                "nv_cache_num_misses 2",
                "nv_cache_num_lookups 3",
                "nv_cache_num_evictions 5",
                "nv_cache_lookup_duration 20",
                "nv_cache_insertion_duration 44"
            ]
        );
        assert!(text.contains("# HELP nv_cache_util Cache utilization [0.0 - 1.0]\n# TYPE nv_cache_util gauge\n"));
        assert!(!metrics.render(&Snapshot::default()).contains("tritium_cache_"));
        assert!(!metrics.render(&Snapshot::default()).contains("nv_cache_"));
    }

    fn instance() -> InstanceSnapshot {
        InstanceSnapshot {
            model: "simple".into(),
            version: "1".into(),
            instance: "simple_0_0".into(),
            state: "ready".into(),
            restarts: 1,
            impossible_transitions: 2,
            rss_bytes: Some(1_048_576),
            shm_bytes: 268_443_648,
            inflight: 1,
            recycled: Vec::new(),
        }
    }

    #[test]
    fn recycled_stubs_are_summed_per_model_and_reason() {
        let metrics = quiet();
        let mut a = instance();
        a.recycled = vec![("rss".into(), 2), ("requests".into(), 0)];
        let mut b = instance();
        b.instance = "simple_0_1".into();
        b.recycled = vec![("rss".into(), 1), ("requests".into(), 3)];
        let text = metrics.render(&Snapshot { instances: vec![a, b], ..Snapshot::default() });
        let lines = lines(&text);
        assert!(lines.contains(&"# TYPE tritium_stub_recycled_total counter"), "{text}");
        assert!(lines.contains(&"tritium_stub_recycled_total{model=\"simple\",reason=\"rss\"} 3"), "{text}");
        assert!(lines.contains(&"tritium_stub_recycled_total{model=\"simple\",reason=\"requests\"} 3"), "{text}");
    }

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn rate_limited_instances_get_their_wait_counters() {
        let limited = RateLimitedSnapshot {
            model: "m".into(),
            version: "1".into(),
            instance: "m_0".into(),
            waits: 3,
            wait_us: 1500,
        };
        let text = quiet().render(&Snapshot { rate_limited: vec![limited], ..Default::default() });
        let labels = "{instance=\"m_0\",model=\"m\",version=\"1\"}";
        assert!(text.contains("# TYPE tritium_rate_limiter_waits_total counter"), "{text}");
        assert!(text.contains(&format!("tritium_rate_limiter_waits_total{labels} 3")), "{text}");
        assert!(text.contains(&format!("tritium_rate_limiter_wait_duration_us{labels} 1500")), "{text}");
        // Without the rate limiter the families are left out.
        assert!(!quiet().render(&Snapshot::default()).contains("tritium_rate_limiter"));
    }

    #[test]
    fn renders_tritons_names_labels_and_help_exactly() {
        let metrics = quiet();
        let snapshot = Snapshot {
            models: vec![simple(), ModelSnapshot { name: "a_model".into(), version: "2".into(), ..Default::default() }],
            instances: vec![instance()],
            cache: None,
            client: vec![],
            rate_limited: vec![],
        };
        let text = metrics.render(&snapshot);
        let expected = [
            "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
            "# TYPE nv_inference_request_success counter",
            "nv_inference_request_success{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_request_success{model=\"simple\",version=\"1\"} 10",
            "# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes",
            "# TYPE nv_inference_request_failure counter",
            "nv_inference_request_failure{model=\"a_model\",reason=\"BACKEND\",version=\"2\"} 0",
            "nv_inference_request_failure{model=\"a_model\",reason=\"CANCELED\",version=\"2\"} 0",
            "nv_inference_request_failure{model=\"a_model\",reason=\"OTHER\",version=\"2\"} 0",
            "nv_inference_request_failure{model=\"a_model\",reason=\"REJECTED\",version=\"2\"} 0",
            "nv_inference_request_failure{model=\"simple\",reason=\"BACKEND\",version=\"1\"} 3",
            "nv_inference_request_failure{model=\"simple\",reason=\"CANCELED\",version=\"1\"} 2",
            "nv_inference_request_failure{model=\"simple\",reason=\"OTHER\",version=\"1\"} 4",
            "nv_inference_request_failure{model=\"simple\",reason=\"REJECTED\",version=\"1\"} 1",
            "# HELP nv_inference_count Number of inferences performed (does not include cached requests)",
            "# TYPE nv_inference_count counter",
            "nv_inference_count{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_count{model=\"simple\",version=\"1\"} 40",
            "# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)",
            "# TYPE nv_inference_exec_count counter",
            "nv_inference_exec_count{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_exec_count{model=\"simple\",version=\"1\"} 5",
            "# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds (includes cached requests)",
            "# TYPE nv_inference_request_duration_us counter",
            "nv_inference_request_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_request_duration_us{model=\"simple\",version=\"1\"} 1234",
            "# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds (includes cached requests)",
            "# TYPE nv_inference_queue_duration_us counter",
            "nv_inference_queue_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_queue_duration_us{model=\"simple\",version=\"1\"} 2000",
            "# HELP nv_inference_compute_input_duration_us Cumulative compute input duration in microseconds (does not include cached requests)",
            "# TYPE nv_inference_compute_input_duration_us counter",
            "nv_inference_compute_input_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_compute_input_duration_us{model=\"simple\",version=\"1\"} 3",
            "# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds (does not include cached requests)",
            "# TYPE nv_inference_compute_infer_duration_us counter",
            "nv_inference_compute_infer_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_compute_infer_duration_us{model=\"simple\",version=\"1\"} 4000",
            "# HELP nv_inference_compute_output_duration_us Cumulative inference compute output duration in microseconds (does not include cached requests)",
            "# TYPE nv_inference_compute_output_duration_us counter",
            "nv_inference_compute_output_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_compute_output_duration_us{model=\"simple\",version=\"1\"} 0",
            "# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.",
            "# TYPE nv_inference_pending_request_count gauge",
            "nv_inference_pending_request_count{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_pending_request_count{model=\"simple\",version=\"1\"} 2",
            "# HELP nv_model_load_duration_secs Model load time in seconds",
            "# TYPE nv_model_load_duration_secs gauge",
            "nv_model_load_duration_secs{model=\"simple\",version=\"1\"} 1.5",
            "# HELP tritium_stub_state State of the stub process of a model instance: 1 for the state it is in (label state)",
            "# TYPE tritium_stub_state gauge",
            "tritium_stub_state{instance=\"simple_0_0\",model=\"simple\",state=\"ready\",version=\"1\"} 1",
            "# HELP tritium_stub_restarts_total Number of times the supervisor restarted the stub of a model instance",
            "# TYPE tritium_stub_restarts_total counter",
            "tritium_stub_restarts_total{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 1",
            "# HELP tritium_stub_impossible_transitions_total Number of events the supervisor of a model instance refused as impossible in its state (a bug if not 0)",
            "# TYPE tritium_stub_impossible_transitions_total counter",
            "tritium_stub_impossible_transitions_total{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 2",
            "# HELP tritium_stub_rss_bytes Resident memory of the stub process of a model instance, in bytes",
            "# TYPE tritium_stub_rss_bytes gauge",
            "tritium_stub_rss_bytes{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 1048576",
            "# HELP tritium_stub_shm_bytes Shared memory mapped for the stub of a model instance (control and arena segments), in bytes",
            "# TYPE tritium_stub_shm_bytes gauge",
            "tritium_stub_shm_bytes{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 268443648",
            "# HELP tritium_stub_inflight_requests Number of requests the stub of a model instance is executing now",
            "# TYPE tritium_stub_inflight_requests gauge",
            "tritium_stub_inflight_requests{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 1",
        ];
        let got = lines(&text);
        for (i, (got, want)) in got.iter().zip(expected.iter()).enumerate() {
            assert_eq!(got, want, "line {i}");
        }
        assert_eq!(got.len(), expected.len(), "{text}");
        // Rendering again with the same snapshot gives the same page.
        assert_eq!(metrics.render(&snapshot), text);
    }

    #[test]
    fn an_empty_server_renders_nothing() {
        assert_eq!(quiet().render(&Snapshot::default()), "");
    }

    #[test]
    fn counters_follow_the_snapshot_down_and_unloaded_series_go() {
        let metrics = quiet();
        let mut snapshot = Snapshot {
            models: vec![simple()],
            instances: vec![instance()],
            cache: None,
            client: vec![],
            rate_limited: vec![],
        };
        assert!(metrics
            .render(&snapshot)
            .contains("nv_inference_request_success{model=\"simple\",version=\"1\"} 10\n"));

        snapshot.models[0].success = 12;
        assert!(metrics
            .render(&snapshot)
            .contains("nv_inference_request_success{model=\"simple\",version=\"1\"} 12\n"));

        // The model was reloaded: its statistics start again from zero.
        snapshot.models[0].success = 3;
        let text = metrics.render(&snapshot);
        assert!(text.contains("nv_inference_request_success{model=\"simple\",version=\"1\"} 3\n"), "{text}");

        // The stub restarted and changed state; the dead process has no RSS.
        snapshot.instances[0].state = "restarting".into();
        snapshot.instances[0].rss_bytes = None;
        let text = metrics.render(&snapshot);
        assert!(text.contains("state=\"restarting\""), "{text}");
        assert!(!text.contains("state=\"ready\""), "{text}");
        assert!(!text.contains("tritium_stub_rss_bytes"), "{text}");

        // Unloaded.
        let text = metrics.render(&Snapshot::default());
        assert_eq!(text, "");
    }

    #[test]
    fn impossible_transitions_are_a_counter_per_instance_even_at_zero() {
        let metrics = quiet();
        let mut snapshot =
            Snapshot { models: vec![], instances: vec![instance()], cache: None, client: vec![], rate_limited: vec![] };
        snapshot.instances[0].impossible_transitions = 0;
        let text = metrics.render(&snapshot);
        assert!(
            text.contains(
                "# TYPE tritium_stub_impossible_transitions_total counter\n\
                 tritium_stub_impossible_transitions_total{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 0\n"
            ),
            "{text}"
        );
        snapshot.instances[0].impossible_transitions = 3;
        let text = metrics.render(&snapshot);
        assert!(
            text.contains(
                "tritium_stub_impossible_transitions_total{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 3\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn counter_latencies_can_be_turned_off() {
        let metrics = Metrics::with_options(MetricsOptions {
            counter_latencies: false,
            cpu_metrics: false,
            ..Default::default()
        });
        let text = metrics.render(&Snapshot {
            models: vec![simple()],
            instances: vec![],
            cache: None,
            client: vec![],
            rate_limited: vec![],
        });
        assert!(!text.contains("_duration_us"), "{text}");
        assert!(text.contains("nv_inference_count{model=\"simple\",version=\"1\"} 40\n"), "{text}");
    }

    #[test]
    fn custom_metrics_follow_the_server_metrics() {
        let metrics = quiet();
        let custom = metrics.custom().clone();
        let family = custom
            .family("requests_process_latency_ns", "Cumulative time spent processing requests", MetricKind::Counter)
            .unwrap();
        let metric = custom
            .metric(family, vec![("model".into(), "custom_metrics".into()), ("version".into(), "1".into())], None)
            .unwrap();
        custom.increment(metric, 42.0).unwrap();
        let text = metrics.render(&Snapshot {
            models: vec![simple()],
            instances: vec![],
            cache: None,
            client: vec![],
            rate_limited: vec![],
        });
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        assert_eq!(
            tail,
            [
                "requests_process_latency_ns{model=\"custom_metrics\",version=\"1\"} 42",
                "# TYPE requests_process_latency_ns counter",
                "# HELP requests_process_latency_ns Cumulative time spent processing requests",
            ]
        );
        // The server's names are not available to models.
        for name in SERVER_METRIC_NAMES {
            assert_eq!(custom.family(name, "d", MetricKind::Counter), Err(MetricError::ReservedName(name.to_owned())));
        }
    }

    #[test]
    fn metrics_instances_are_independent() {
        let a = quiet();
        let b = quiet();
        a.render(&Snapshot {
            models: vec![simple()],
            instances: vec![],
            cache: None,
            client: vec![],
            rate_limited: vec![],
        });
        assert_eq!(b.render(&Snapshot::default()), "");
        a.custom().family("only_in_a", "d", MetricKind::Gauge).unwrap();
        assert!(b.custom().family("only_in_a", "d", MetricKind::Counter).is_ok());
    }

    #[test]
    fn concurrent_renders_are_consistent() {
        let metrics = quiet();
        let threads: Vec<_> = (0..4u64)
            .map(|i| {
                let metrics = metrics.clone();
                std::thread::spawn(move || {
                    for n in 0..50u64 {
                        let mut model = simple();
                        model.success = i * 1000 + n;
                        let text = metrics.render(&Snapshot {
                            models: vec![model],
                            instances: vec![],
                            cache: None,
                            client: vec![],
                            rate_limited: vec![],
                        });
                        let want = format!(
                            "nv_inference_request_success{{model=\"simple\",version=\"1\"}} {}\n",
                            i * 1000 + n
                        );
                        assert!(text.contains(&want), "{text}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    #[test]
    fn a_series_given_twice_keeps_its_last_value_and_versions_sort_as_text() {
        let metrics = quiet();
        let mut first = simple();
        first.success = 1;
        let second = simple();
        let v10 = ModelSnapshot { version: "10".into(), ..simple() };
        let text = metrics.render(&Snapshot {
            models: vec![first, v10, second],
            instances: vec![],
            cache: None,
            client: vec![],
            rate_limited: vec![],
        });
        let success: Vec<&str> = text.lines().filter(|l| l.starts_with("nv_inference_request_success{")).collect();
        assert_eq!(
            success,
            [
                "nv_inference_request_success{model=\"simple\",version=\"1\"} 10",
                "nv_inference_request_success{model=\"simple\",version=\"10\"} 10",
            ]
        );
    }

    #[test]
    fn counters_are_exact_integers_and_labels_are_escaped() {
        let metrics = quiet();
        let model = ModelSnapshot {
            name: "we\"ird\\name\n".into(),
            version: "1".into(),
            success: u64::MAX,
            load_duration_secs: Some(0.25),
            ..Default::default()
        };
        let text = metrics.render(&Snapshot {
            models: vec![model],
            instances: vec![],
            cache: None,
            client: vec![],
            rate_limited: vec![],
        });
        assert!(
            text.contains(
                "nv_inference_request_success{model=\"we\\\"ird\\\\name\\n\",version=\"1\"} 18446744073709551615\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("nv_model_load_duration_secs{model=\"we\\\"ird\\\\name\\n\",version=\"1\"} 0.25\n"),
            "{text}"
        );
    }
}
