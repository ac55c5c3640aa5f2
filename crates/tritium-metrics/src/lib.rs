//! tritium's Prometheus `/metrics` text: Triton's `nv_inference_*` metrics with Triton's names,
//! HELP texts and labels, its host gauges (`nv_cpu_*`, `host`), tritium's own `tritium_stub_*` metrics, and the custom metrics that
//! model code creates with `pb_utils.MetricFamily` (with the rules and error texts of Triton's
//! metrics API).
//!
//! [`Metrics::render`] turns a [`Snapshot`] of the server, taken at scrape time, into the page,
//! whose `Content-Type` is [`CONTENT_TYPE`]; one hand-written renderer writes every family, the
//! server's and the custom ones. This crate knows no transport: the binary serves the page over
//! HTTP. Custom metrics live in [`CustomMetrics`] (reachable as [`Metrics::custom`]); each
//! stub's calls go through its own [`MetricsSession`], which releases what the stub held when it
//! goes away. The metrics model code registers with `prometheus_client` come from the stubs at
//! scrape time (`Snapshot::client`) and are checked and merged by `client`.

mod client;
mod custom;
mod host;
mod server;
pub mod summary;
mod text;
mod types;

pub use client::{ClientFamily, ClientKind, ClientSample, StubFamilies, MAX_SAMPLES, MAX_TEXT_BYTES};
pub use custom::{CustomMetrics, MetricsSession};
pub use host::{HostSampler, HostSnapshot};
pub use server::{
    CacheCounts, CacheSnapshot, FailureCounts, HistogramSnapshot, InstanceSnapshot, LatencySummaries, Metrics,
    MetricsOptions, ModelSnapshot, RateLimitedSnapshot, Snapshot, FIRST_RESPONSE_BUCKETS_MS, FIRST_RESPONSE_FAMILY,
    SERVER_METRIC_NAMES,
};
pub use summary::{Summary, SummarySnapshot};
pub use text::CONTENT_TYPE;
pub use types::{MetricError, MetricKind, MetricOp};
