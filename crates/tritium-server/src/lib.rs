//! tritium's core: the model repository, per-model queues feeding stub instances with dynamic
//! batching, request validation, and statistics. It knows nothing of HTTP, gRPC or JSON; the
//! frontends translate their wire formats into [`types`] and call [`Server`].

pub mod admin_access;
mod cache;
mod callers;
mod classify;
mod composition;
pub mod config_limits;
pub mod confine;
pub mod envs;
mod error;
pub mod forward;
mod instance;
pub mod limiter;
mod pending;
mod reshape;
pub mod restricted;
mod scheduler;
mod scrape;
mod sequence;
mod server;
pub mod shm;
mod stats;
#[doc(hidden)]
#[cfg(feature = "testing")]
pub mod testing;
pub mod types;
mod validate;
mod warmup;

pub use cache::CacheUsage;
pub use config_limits::ConfigLimits;
pub use confine::PathPolicy;
pub use envs::EnvOptions;
pub use instance::{
    park_spin, InstanceSettings, DEFAULT_MAX_INFLIGHT_RESPONSES, DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_REQUEST_METADATA_BYTES, DEFAULT_MAX_SEQUENCE_BACKLOG,
};
pub use scrape::STUB_METRICS_TIMEOUT;
pub use server::{
    InferFuture, Server, ServerOptions, TraceSettingsView, DEFAULT_MODEL_UPDATE_GRACE_SECS, STACKS_TIMEOUT,
};
/// `--metrics-config`, as [`ServerOptions::metrics`] takes it.
pub use tritium_metrics::MetricsOptions;
/// Request tracing: the frontends parse a caller's `traceparent` with [`trace::SpanContext`].
pub use tritium_trace as trace;
pub use types::*;

/// Runs `f`, which blocks. On a multi-thread runtime (a task of an instance served there, see
/// `instance::lane`) the runtime first hands this thread's other tasks to another thread
/// (`block_in_place`); anywhere else (a worker thread) `f` just runs.
pub(crate) fn off_runtime<T>(f: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}
