//! tritium's Prometheus `/metrics`: Triton's `nv_inference_*` metrics with Triton's names, HELP
//! texts and labels, tritium's own `tritium_stub_*` metrics, and the custom metrics that model
//! code creates with `pb_utils.MetricFamily` (with the rules and error texts of Triton's
//! metrics API).
//!
//! [`Metrics::render`] turns a [`Snapshot`] of the server, taken at scrape time, into the page;
//! [`serve`] answers `GET /metrics` with it. Custom metrics live in [`CustomMetrics`]
//! (reachable as [`Metrics::custom`]); each stub's calls go through its own
//! [`MetricsSession`], which releases what the stub held when it goes away.

mod custom;
mod http;
mod server;
mod text;

pub use custom::{CustomMetrics, MetricError, MetricKind, MetricOp, MetricsSession};
pub use http::{serve, CONTENT_TYPE};
pub use server::{
    FailureCounts, InstanceSnapshot, Metrics, MetricsOptions, ModelSnapshot, Snapshot, SERVER_METRIC_NAMES,
};
