//! tritonserver's command line: the flags of Triton 2.51 that tritium has no flag of its own for,
//! so that a deployment written for `tritonserver` (a Dockerfile, a Helm chart, KServe's Triton
//! runtime) starts tritium unchanged.
//!
//! Each flag is one of three kinds, decided by [`TritonFlags::review`]:
//! - implemented: it changes what tritium does, with Triton's meaning (`--allow-http`,
//!   `--grpc-address`, `--exit-on-error`, ...);
//! - accepted as a no-op: what it asks for has no meaning here (a pinned-memory pool, GPU
//!   metrics, `--allow-sagemaker=false`); one log line at start says so;
//! - refused: it asks for something tritium cannot do yet (a cache other than `local`, a rate
//!   limiter); the server does not start, and the error names the flag and why.
//!
//! The tracing flags are parsed by [`TritonFlags::trace_flags`] (`tritium_trace`, with Triton's
//! syntax and texts).
//!
//! The access flags (restricted APIs, header forwarding, gRPC TLS) are parsed by
//! [`TritonFlags::front_door`] into typed values for the frontends.
//!
//! Booleans take Triton's spellings (`true/false`, `on/off`, `1/0`, any case), and every flag
//! takes `--flag=value` as well as `--flag value`.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tritium_server::forward::HeaderForward;
use tritium_server::restricted::{ApiGroup, Restrictions, GRPC_HEADER_PREFIX};

/// Parses a boolean as Triton does: `true`, `on`, `1`, `false`, `off`, `0`, in any case.
pub(crate) fn triton_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "on" | "1" => Ok(true),
        "false" | "off" | "0" => Ok(false),
        _ => Err(format!("invalid value for bool option: {s} (use true/false, on/off or 1/0)")),
    }
}

/// Parses `--log-verbose` as Triton does: a level, or `true` (1) / `false` (0).
pub(crate) fn triton_verbose(s: &str) -> Result<u32, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" => Ok(1),
        "false" => Ok(0),
        other => other.parse().map_err(|_| format!("invalid verbose level {s:?}: use a number >= 0, true or false")),
    }
}

/// `--grpc-infer-response-compression-level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CompressionLevel {
    /// Answers are not compressed (Triton's default).
    None,
    /// Compressed with the client's accepted algorithm (gzip or deflate).
    Low,
    /// As `low`.
    Medium,
    /// As `low`.
    High,
}

/// The tritonserver flags that tritium's own flags do not cover.
#[derive(Debug, Clone, Args)]
pub(crate) struct TritonFlags {
    // Server
    /// Identifier for this server: the `name` of the server metadata (Triton's default
    /// "triton"; tritium's "tritium").
    #[arg(long, env = "TRITIUM_ID", help_heading = "Server")]
    pub id: Option<String>,

    /// Let clients register system shared memory regions (Triton 2.51 always does; later
    /// Triton releases default to false). false refuses registrations with Triton's text.
    #[arg(long, env = "TRITIUM_ALLOW_CLIENT_SHM", default_value = "true", value_parser = triton_bool, action = clap::ArgAction::Set, help_heading = "Server")]
    pub allow_client_shm: bool,
    /// No effect: tritium uses no GPUs, so there is no peer access to enable.
    #[arg(long, value_parser = triton_bool, help_heading = "Server")]
    pub enable_peer_access: Option<bool>,

    // Model Repository
    /// Exit if a model fails to load at startup (Triton's default is true; tritium's is false:
    /// the good models keep serving and the failed ones are in the repository index).
    #[arg(long, env = "TRITIUM_EXIT_ON_ERROR", default_value = "false", value_parser = triton_bool, action = clap::ArgAction::Set, help_heading = "Model Repository")]
    pub exit_on_error: bool,
    /// Deprecated in Triton: true is --disable-auto-complete-config.
    #[arg(long, value_parser = triton_bool, help_heading = "Model Repository")]
    pub strict_model_config: Option<bool>,
    /// Models loaded at once (Triton's default 4).
    #[arg(long, env = "TRITIUM_MODEL_LOAD_THREAD_COUNT", default_value_t = 4, help_heading = "Model Repository")]
    pub model_load_thread_count: usize,
    /// Times a failed model load is retried (Triton's default 0).
    #[arg(long, env = "TRITIUM_MODEL_LOAD_RETRY_COUNT", default_value_t = 0, help_heading = "Model Repository")]
    pub model_load_retry_count: u32,
    /// Models with the same name in different repositories (refused: tritium serves one
    /// repository).
    #[arg(long, value_parser = triton_bool, help_heading = "Model Repository")]
    pub model_namespacing: Option<bool>,

    // HTTP
    /// Listen for HTTP requests.
    #[arg(long, env = "TRITIUM_ALLOW_HTTP", default_value = "true", value_parser = triton_bool, action = clap::ArgAction::Set, help_heading = "HTTP")]
    pub allow_http: bool,
    /// The address the HTTP endpoint binds to (default: --host).
    #[arg(long, env = "TRITIUM_HTTP_ADDRESS", help_heading = "HTTP")]
    pub http_address: Option<String>,
    /// Let several servers listen on the HTTP port (SO_REUSEPORT), each with this flag.
    #[arg(long, default_value = "false", value_parser = triton_bool, action = clap::ArgAction::Set, help_heading = "HTTP")]
    pub reuse_http_port: bool,
    /// No effect: HTTP requests run on the server's async runtime with gRPC's.
    #[arg(long, help_heading = "HTTP")]
    pub http_thread_count: Option<u32>,
    /// Restrict HTTP APIs: `<apis>:<key>=<value>` (repeatable), `<apis>` a comma-separated
    /// list of health, metadata, inference, shared-memory, model-config, model-repository,
    /// statistics, trace, logging; their requests must carry the header `<key>: <value>`.
    #[arg(long, help_heading = "HTTP")]
    pub http_restricted_api: Vec<String>,
    /// A regular expression: the headers of inference requests whose names match it become
    /// request parameters (strings) the model sees.
    #[arg(long, help_heading = "HTTP")]
    pub http_header_forward_pattern: Option<String>,

    // GRPC
    /// Listen for gRPC requests.
    #[arg(long, env = "TRITIUM_ALLOW_GRPC", default_value = "true", value_parser = triton_bool, action = clap::ArgAction::Set, help_heading = "GRPC")]
    pub allow_grpc: bool,
    /// The address the gRPC endpoint binds to (default: --host).
    #[arg(long, env = "TRITIUM_GRPC_ADDRESS", help_heading = "GRPC")]
    pub grpc_address: Option<String>,
    /// Let several servers listen on the gRPC port (SO_REUSEPORT), each with this flag.
    #[arg(long, default_value = "false", value_parser = triton_bool, action = clap::ArgAction::Set, help_heading = "GRPC")]
    pub reuse_grpc_port: bool,
    /// No effect: gRPC requests run on the server's async runtime (a later Triton flag).
    #[arg(long, help_heading = "GRPC")]
    pub grpc_infer_thread_count: Option<u32>,
    /// No effect: tritium keeps no pool of response objects (a later Triton flag).
    #[arg(long, help_heading = "GRPC")]
    pub grpc_max_response_pool_size: Option<u32>,
    /// Compress inference answers with the algorithm the client accepts (gzip, deflate).
    #[arg(long, value_enum, default_value_t = CompressionLevel::None, help_heading = "GRPC")]
    pub grpc_infer_response_compression_level: CompressionLevel,
    /// Milliseconds between HTTP/2 keepalive pings (Triton's default: 2 hours).
    #[arg(long, default_value_t = 7_200_000, help_heading = "GRPC")]
    pub grpc_keepalive_time: u64,
    /// Milliseconds a keepalive ping waits for its acknowledgement before the connection is
    /// closed (Triton's default: 20 s).
    #[arg(long, default_value_t = 20_000, help_heading = "GRPC")]
    pub grpc_keepalive_timeout: u64,
    /// Milliseconds a connection may live before it is asked to close (default: no limit).
    #[arg(long, help_heading = "GRPC")]
    pub grpc_max_connection_age: Option<u64>,
    /// Milliseconds an aged connection gets to finish its calls (default: no limit).
    #[arg(long, help_heading = "GRPC")]
    pub grpc_max_connection_age_grace: Option<u64>,
    /// No effect (gRPC core's ping policy; hyper has its own).
    #[arg(long, value_parser = triton_bool, help_heading = "GRPC")]
    pub grpc_keepalive_permit_without_calls: Option<bool>,
    /// No effect (gRPC core's ping policy; hyper has its own).
    #[arg(long, help_heading = "GRPC")]
    pub grpc_http2_max_pings_without_data: Option<i64>,
    /// No effect (gRPC core's ping policy; hyper has its own).
    #[arg(long, help_heading = "GRPC")]
    pub grpc_http2_min_recv_ping_interval_without_data: Option<i64>,
    /// No effect (gRPC core's ping policy; hyper has its own).
    #[arg(long, help_heading = "GRPC")]
    pub grpc_http2_max_ping_strikes: Option<i64>,
    /// No effect (tritium keeps no pool of request objects).
    #[arg(long, help_heading = "GRPC")]
    pub grpc_infer_allocation_pool_size: Option<i64>,
    /// Serve gRPC over TLS (--grpc-server-cert and --grpc-server-key).
    #[arg(long, value_parser = triton_bool, help_heading = "GRPC")]
    pub grpc_use_ssl: Option<bool>,
    /// Serve gRPC over mutual TLS: clients must present a certificate signed by
    /// --grpc-root-cert (implies --grpc-use-ssl).
    #[arg(long, value_parser = triton_bool, help_heading = "GRPC")]
    pub grpc_use_ssl_mutual: Option<bool>,
    /// PEM file of the server's certificate (chain), for TLS.
    #[arg(long, help_heading = "GRPC")]
    pub grpc_server_cert: Option<String>,
    /// PEM file of the server's private key, for TLS.
    #[arg(long, help_heading = "GRPC")]
    pub grpc_server_key: Option<String>,
    /// PEM file of the CA certificate that signs clients' certificates, for mutual TLS.
    #[arg(long, help_heading = "GRPC")]
    pub grpc_root_cert: Option<String>,
    /// Restrict gRPC protocols: `<protocols>:<key>=<value>` (repeatable), the groups of
    /// --http-restricted-api plus tritium's `admin`; their calls must carry the metadata
    /// `triton-grpc-protocol-<key>: <value>`.
    #[arg(long, help_heading = "GRPC")]
    pub grpc_restricted_protocol: Vec<String>,
    /// A regular expression: the metadata of inference calls whose names match it become
    /// request parameters (strings) the model sees.
    #[arg(long, help_heading = "GRPC")]
    pub grpc_header_forward_pattern: Option<String>,

    // Sagemaker, Vertex AI
    /// Refused when true: tritium has no SageMaker endpoint.
    #[arg(long, value_parser = triton_bool, help_heading = "Sagemaker")]
    pub allow_sagemaker: Option<bool>,
    /// No effect without --allow-sagemaker.
    #[arg(long, help_heading = "Sagemaker")]
    pub sagemaker_port: Option<u16>,
    /// No effect without --allow-sagemaker.
    #[arg(long, help_heading = "Sagemaker")]
    pub sagemaker_safe_port_range: Option<String>,
    /// No effect without --allow-sagemaker.
    #[arg(long, help_heading = "Sagemaker")]
    pub sagemaker_thread_count: Option<u32>,
    /// Refused when true: tritium has no Vertex AI endpoint.
    #[arg(long, value_parser = triton_bool, help_heading = "Vertex")]
    pub allow_vertex_ai: Option<bool>,
    /// No effect without --allow-vertex-ai.
    #[arg(long, help_heading = "Vertex")]
    pub vertex_ai_port: Option<u16>,
    /// No effect without --allow-vertex-ai.
    #[arg(long, help_heading = "Vertex")]
    pub vertex_ai_thread_count: Option<u32>,
    /// No effect without --allow-vertex-ai.
    #[arg(long, help_heading = "Vertex")]
    pub vertex_ai_default_model: Option<String>,

    // Metrics
    /// The address the metrics endpoint binds to (default: the HTTP address).
    #[arg(long, env = "TRITIUM_METRICS_ADDRESS", help_heading = "Metrics")]
    pub metrics_address: Option<String>,
    /// No effect: tritium has no GPU metrics.
    #[arg(long, value_parser = triton_bool, help_heading = "Metrics")]
    pub allow_gpu_metrics: Option<bool>,
    /// Export the host's CPU utilization and memory (`nv_cpu_*`, default true).
    #[arg(long, value_parser = triton_bool, help_heading = "Metrics")]
    pub allow_cpu_metrics: Option<bool>,
    /// How often the host gauges are sampled, in milliseconds (default 2000): a scrape takes a
    /// new sample when the last one is half an interval old.
    #[arg(long, help_heading = "Metrics")]
    pub metrics_interval_ms: Option<f64>,
    /// Metrics settings, repeatable: `<setting>=<value>`: `counter_latencies=true|false` (the
    /// `nv_inference_*_duration_us` counters, on by default), `summary_latencies=true|false`
    /// (the `nv_inference_*_summary_us` summaries, off by default), `summary_quantiles=
    /// <quantile>:<error>,...`. Other settings are accepted with no effect.
    #[arg(long, help_heading = "Metrics")]
    pub metrics_config: Vec<String>,

    // Tracing
    /// Trace settings, repeatable: `[<mode>,]<setting>=<value>` (`mode=triton|opentelemetry`,
    /// `level=OFF|TIMESTAMPS|TENSORS`, `rate=N`, `count=N`, `triton,file=PATH`,
    /// `triton,log-frequency=N`, `opentelemetry,url=URL`, `opentelemetry,resource=KEY=VALUE`,
    /// `opentelemetry,bsp_*=N`).
    #[arg(long, help_heading = "Tracing")]
    pub trace_config: Vec<String>,
    /// Deprecated in Triton (--trace-config triton,file=...).
    #[arg(long, help_heading = "Tracing")]
    pub trace_file: Option<String>,
    /// Deprecated in Triton (--trace-config level=...).
    #[arg(long, help_heading = "Tracing")]
    pub trace_level: Vec<String>,
    /// Deprecated in Triton (--trace-config rate=N).
    #[arg(long, help_heading = "Tracing")]
    pub trace_rate: Option<i64>,
    /// Deprecated in Triton (--trace-config count=N).
    #[arg(long, help_heading = "Tracing")]
    pub trace_count: Option<i64>,
    /// Deprecated in Triton (--trace-config triton,log-frequency=N).
    #[arg(long, help_heading = "Tracing")]
    pub trace_log_frequency: Option<i64>,

    // Backend, Repository Agent
    /// Backend settings (`<backend>,<setting>=<value>`): `onnxruntime,default-max-batch-size=N`
    /// (the max_batch_size ONNX auto-complete gives a model that batches; 4 by default); the
    /// Python backend's shared-memory sizes have no effect here (memfd regions grow as needed).
    #[arg(long, help_heading = "Backend")]
    pub backend_config: Vec<String>,
    /// No effect: tritium runs no repository agents.
    #[arg(long, help_heading = "Repository Agent")]
    pub repoagent_directory: Option<String>,

    // Response Cache
    /// The response cache: `local,size=BYTES` (Triton's in-memory LRU cache; other caches are
    /// refused). Models use it with `response_cache { enable: true }`.
    #[arg(long, help_heading = "Response Cache")]
    pub cache_config: Vec<String>,
    /// No effect: tritium loads no cache libraries.
    #[arg(long, help_heading = "Response Cache")]
    pub cache_directory: Option<String>,
    /// Deprecated in Triton: the same as --cache-config local,size=N (0: no cache).
    #[arg(long, help_heading = "Response Cache")]
    pub response_cache_byte_size: Option<u64>,

    // Rate Limiter
    /// `off` (the default: every instance runs as soon as it has work) or `execution_count`
    /// (instances wait for the resources their `rate_limiter` names; `priority` weighs turns).
    #[arg(long, help_heading = "Rate Limiter")]
    pub rate_limit: Option<String>,
    /// `<name>:<count>[:<device>]`: how many of a resource there are (on every device when no
    /// device is given). Default: the most any loaded instance needs. No effect while
    /// --rate-limit is off.
    #[arg(long, help_heading = "Rate Limiter")]
    pub rate_limit_resource: Vec<String>,

    // Memory/Device Management
    /// No effect: tritium allocates no pinned memory.
    #[arg(long, help_heading = "Memory/Device Management")]
    pub pinned_memory_pool_byte_size: Option<i64>,
    /// No effect: tritium allocates no CUDA memory pool.
    #[arg(long, help_heading = "Memory/Device Management")]
    pub cuda_memory_pool_byte_size: Vec<String>,
    /// No effect: tritium has no implicit state.
    #[arg(long, help_heading = "Memory/Device Management")]
    pub cuda_virtual_address_size: Vec<String>,
    /// No effect: tritium does not pick GPUs.
    #[arg(long, help_heading = "Memory/Device Management")]
    pub min_supported_compute_capability: Option<f64>,
    /// No effect: copies are made by the thread that serves the request.
    #[arg(long, help_heading = "Memory/Device Management")]
    pub buffer_manager_thread_count: Option<i64>,
    /// No effect yet: host policies (numa-node, cpu-cores) are not applied.
    #[arg(long, help_heading = "Memory/Device Management")]
    pub host_policy: Vec<String>,
    /// No effect: tritium does not track GPU memory.
    #[arg(long, help_heading = "Memory/Device Management")]
    pub model_load_gpu_limit: Vec<String>,
}

/// What [`TritonFlags::review`] found: lines to log (flags that have no effect), or the first
/// flag that asks for something tritium cannot do.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Review {
    /// One line per accepted flag without an effect.
    pub no_effect: Vec<String>,
}

/// A flag tritium refuses to start with.
#[derive(Debug, PartialEq)]
pub(crate) struct Refused {
    /// The flag as given.
    pub flag: String,
    /// Why it is refused, and what to do.
    pub why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.flag, self.why)
    }
}

impl std::error::Error for Refused {}

fn refuse(flag: impl Into<String>, why: impl Into<String>) -> Refused {
    Refused { flag: flag.into(), why: why.into() }
}

const NOT_YET: &str = "not implemented in tritium yet";

impl TritonFlags {
    /// `--metrics-config` as the server's metrics options, and the settings that have no effect.
    pub(crate) fn metrics_options(&self) -> Result<(tritium_server::MetricsOptions, Vec<String>), Refused> {
        let mut options = tritium_server::MetricsOptions::default();
        if let Some(allow) = self.allow_cpu_metrics {
            options.cpu_metrics = allow;
        }
        if let Some(ms) = self.metrics_interval_ms {
            if !ms.is_finite() || ms <= 0.0 {
                return Err(refuse(
                    format!("--metrics-interval-ms={ms}"),
                    "the interval must be a positive number of milliseconds",
                ));
            }
            options.interval = Duration::from_secs_f64(ms / 1000.0);
        }
        let mut ignored = Vec::new();
        for arg in &self.metrics_config {
            let flag = || format!("--metrics-config={arg}");
            let Some((key, value)) = arg.split_once('=') else {
                return Err(refuse(flag(), "the format is <setting>=<value>, e.g. summary_latencies=true"));
            };
            let boolean = || triton_bool(value).map_err(|e| refuse(flag(), e));
            match key {
                "counter_latencies" => options.counter_latencies = boolean()?,
                "summary_latencies" => options.summary_latencies = boolean()?,
                "histogram_latencies" => options.histogram_latencies = boolean()?,
                "summary_quantiles" => {
                    options.summary_quantiles = tritium_metrics::summary::parse_quantiles(value.trim_matches('"'))
                        .map_err(|e| refuse(flag(), e))?
                }
                _ => ignored.push(key.to_string()),
            }
        }
        Ok((options, ignored))
    }

    /// The tracing flags (`--trace-config` and the deprecated `--trace-*`), combined as Triton
    /// combines them; a value Triton refuses is refused with its text.
    pub(crate) fn trace_flags(&self) -> Result<tritium_server::trace::TraceFlags, Refused> {
        let legacy = tritium_server::trace::LegacyFlags {
            file: self.trace_file.clone(),
            level: self.trace_level.clone(),
            rate: self.trace_rate,
            count: self.trace_count,
            log_frequency: self.trace_log_frequency,
        };
        tritium_server::trace::parse_flags(&self.trace_config, &legacy).map_err(|e| refuse("--trace-config", e.0))
    }

    /// `--rate-limit execution_count` as the server's rate limiter, with the
    /// `--rate-limit-resource` counts; `None` when it is off (the default).
    pub(crate) fn rate_limiter(&self) -> Result<Option<Arc<tritium_server::limiter::RateLimiter>>, Refused> {
        let Some(mode) = &self.rate_limit else { return Ok(None) };
        match mode.to_ascii_lowercase().as_str() {
            "off" => Ok(None),
            "execution_count" => {
                let limits = tritium_server::limiter::ResourceLimits::parse(&self.rate_limit_resource)
                    .map_err(|e| refuse("--rate-limit-resource", e.to_string()))?;
                Ok(Some(tritium_server::limiter::RateLimiter::new(limits)))
            }
            other => Err(refuse(
                format!("--rate-limit={other}"),
                "unknown rate limit mode; the modes are off and execution_count",
            )),
        }
    }

    /// The response cache's byte size from `--cache-config local,size=N` (or the deprecated
    /// `--response-cache-byte-size N`), parsed as Triton parses them; `None` without a cache.
    pub(crate) fn response_cache_bytes(&self) -> Result<Option<u64>, Refused> {
        if self.response_cache_byte_size.is_some() && !self.cache_config.is_empty() {
            return Err(refuse(
                "--response-cache-byte-size",
                "Incompatible flags --response-cache-byte-size and --cache-config both provided. Please \
                 provide one or the other.",
            ));
        }
        if let Some(bytes) = self.response_cache_byte_size {
            return Ok((bytes > 0).then_some(bytes));
        }
        let mut size = None;
        for arg in &self.cache_config {
            let flag = format!("--cache-config={arg}");
            let Some((name, setting)) = arg.split_once(',').filter(|(name, _)| !name.is_empty()) else {
                return Err(refuse(
                    flag,
                    format!(
                        "No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got {arg}"
                    ),
                ));
            };
            let Some((key, value)) = setting.split_once('=').filter(|(k, v)| !k.is_empty() && !v.is_empty()) else {
                return Err(refuse(
                    flag,
                    format!("--cache-config option format is '<cache name>,<setting>=<value>'. Got {arg}"),
                ));
            };
            if name != "local" {
                return Err(refuse(
                    flag,
                    format!("the {name:?} cache is {NOT_YET}; use the local cache (--cache-config local,size=BYTES)"),
                ));
            }
            if key != "size" {
                return Err(refuse(flag, format!("the local cache has no setting {key:?}; its one setting is size")));
            }
            let bytes = value.parse::<u64>().map_err(|_| {
                refuse(flag.clone(), format!("the local cache's size must be a number of bytes, not {value:?}"))
            })?;
            if bytes == 0 {
                return Err(refuse(flag, "the local cache's size must be greater than 0"));
            }
            size = Some(bytes);
        }
        Ok(size)
    }

    /// Sorts the given flags into no-ops (to log) and refusals (the first one is returned).
    pub(crate) fn review(&self) -> Result<Review, Refused> {
        let mut no_effect = Vec::new();
        let mut noop = |given: bool, flag: &str, why: &str| {
            if given {
                no_effect.push(format!("{flag} has no effect in tritium: {why}"));
            }
        };

        if self.model_namespacing == Some(true) {
            return Err(refuse(
                "--model-namespacing=true",
                "tritium serves one model repository, so there are no namespaces; leave the flag out",
            ));
        }
        if self.allow_sagemaker == Some(true) {
            return Err(refuse(
                "--allow-sagemaker=true",
                "tritium has no SageMaker endpoint; use KServe v2 HTTP or gRPC",
            ));
        }
        if self.allow_vertex_ai == Some(true) {
            return Err(refuse(
                "--allow-vertex-ai=true",
                "tritium has no Vertex AI endpoint; use KServe v2 HTTP or gRPC",
            ));
        }
        self.response_cache_bytes()?;
        self.rate_limiter()?;
        self.trace_flags()?;

        let ssl_files = [&self.grpc_server_cert, &self.grpc_server_key, &self.grpc_root_cert];
        noop(
            !self.grpc_tls_on() && ssl_files.iter().any(|f| f.is_some()),
            "--grpc-server-cert/key/root-cert",
            "they are used with --grpc-use-ssl or --grpc-use-ssl-mutual only",
        );
        noop(
            !self.grpc_tls_on() && (self.grpc_use_ssl.is_some() || self.grpc_use_ssl_mutual.is_some()),
            "--grpc-use-ssl=false",
            "the default",
        );
        noop(self.model_namespacing.is_some(), "--model-namespacing=false", "the default");
        noop(self.http_thread_count.is_some(), "--http-thread-count", "HTTP runs on the server's async runtime");
        let ping_policy = [
            self.grpc_http2_max_pings_without_data,
            self.grpc_http2_min_recv_ping_interval_without_data,
            self.grpc_http2_max_ping_strikes,
        ];
        noop(
            self.grpc_keepalive_permit_without_calls.is_some() || ping_policy.iter().any(|p| p.is_some()),
            "--grpc-keepalive-permit-without-calls/--grpc-http2-*",
            "they tune gRPC core's ping policy; tritium's HTTP/2 (hyper) has its own",
        );
        noop(self.grpc_infer_allocation_pool_size.is_some(), "--grpc-infer-allocation-pool-size", "no pool is kept");
        noop(self.grpc_max_response_pool_size.is_some(), "--grpc-max-response-pool-size", "no pool is kept");
        noop(
            self.grpc_infer_thread_count.is_some(),
            "--grpc-infer-thread-count",
            "gRPC runs on the server's async runtime",
        );
        noop(self.enable_peer_access.is_some(), "--enable-peer-access", "tritium uses no GPUs");
        noop(self.allow_sagemaker.is_some(), "--allow-sagemaker=false", "the default");
        noop(
            self.sagemaker_port.is_some()
                || self.sagemaker_safe_port_range.is_some()
                || self.sagemaker_thread_count.is_some(),
            "--sagemaker-*",
            "tritium has no SageMaker endpoint",
        );
        noop(self.allow_vertex_ai.is_some(), "--allow-vertex-ai=false", "the default");
        noop(
            self.vertex_ai_port.is_some()
                || self.vertex_ai_thread_count.is_some()
                || self.vertex_ai_default_model.is_some(),
            "--vertex-ai-*",
            "tritium has no Vertex AI endpoint",
        );
        noop(self.allow_gpu_metrics.is_some(), "--allow-gpu-metrics", "tritium exports no GPU metrics");
        for key in self.metrics_options()?.1 {
            noop(true, &format!("--metrics-config {key}"), "Triton knows no such metrics setting either");
        }
        for setting in self.backend_config.iter().filter(|s| !backend_config_applies(s)) {
            noop(true, &format!("--backend-config={setting}"), backend_config_why(setting));
        }
        noop(self.repoagent_directory.is_some(), "--repoagent-directory", "tritium runs no repository agents");
        noop(self.cache_directory.is_some(), "--cache-directory", "tritium loads no cache libraries");
        noop(self.response_cache_byte_size == Some(0), "--response-cache-byte-size=0", "no cache is made");
        let off = !self.rate_limit.as_deref().is_some_and(|m| m.eq_ignore_ascii_case("execution_count"));
        noop(off && self.rate_limit.is_some(), "--rate-limit=off", "the default");
        noop(off && !self.rate_limit_resource.is_empty(), "--rate-limit-resource", "the rate limiter is off");
        noop(self.pinned_memory_pool_byte_size.is_some(), "--pinned-memory-pool-byte-size", "no pinned memory is used");
        noop(
            !self.cuda_memory_pool_byte_size.is_empty() || !self.cuda_virtual_address_size.is_empty(),
            "--cuda-memory-pool-byte-size/--cuda-virtual-address-size",
            "tritium allocates no CUDA memory itself",
        );
        noop(self.min_supported_compute_capability.is_some(), "--min-supported-compute-capability", "no GPU is used");
        noop(self.buffer_manager_thread_count.is_some(), "--buffer-manager-thread-count", "no copy threads are kept");
        noop(!self.host_policy.is_empty(), "--host-policy", "host policies are not applied yet");
        noop(!self.model_load_gpu_limit.is_empty(), "--model-load-gpu-limit", "GPU memory is not tracked");
        Ok(Review { no_effect })
    }
}

/// What the frontends need from the access flags: restricted groups, header forwarding and
/// gRPC TLS, parsed and checked.
#[derive(Debug, Default)]
pub(crate) struct FrontDoor {
    /// `--http-restricted-api`.
    pub http_restrictions: Restrictions,
    /// `--grpc-restricted-protocol` (headers with Triton's `triton-grpc-protocol-` prefix).
    pub grpc_restrictions: Restrictions,
    /// `--http-header-forward-pattern`.
    pub http_forward: Option<HeaderForward>,
    /// `--grpc-header-forward-pattern`.
    pub grpc_forward: Option<HeaderForward>,
    /// `--grpc-use-ssl` / `--grpc-use-ssl-mutual` with the files' contents.
    pub grpc_tls: Option<tritium_grpc::front_door::Tls>,
}

impl TritonFlags {
    /// Whether gRPC is served over TLS.
    fn grpc_tls_on(&self) -> bool {
        self.grpc_use_ssl == Some(true) || self.grpc_use_ssl_mutual == Some(true)
    }

    /// Parses the access flags; an error names the flag and says what is wrong, with Triton's
    /// texts for the restricted-API syntax.
    pub(crate) fn front_door(&self) -> Result<FrontDoor, Refused> {
        let mut door = FrontDoor::default();
        for arg in &self.http_restricted_api {
            door.http_restrictions
                .add(arg, "http-restricted-api", "", "api")
                .map_err(|e| refuse(format!("--http-restricted-api={arg}"), e.0))?;
            if door.http_restrictions.get(ApiGroup::Admin).is_some() {
                return Err(refuse(
                    format!("--http-restricted-api={arg}"),
                    "tritium's admin API is served over gRPC only: restrict it with --grpc-restricted-protocol=admin:...",
                ));
            }
        }
        for arg in &self.grpc_restricted_protocol {
            door.grpc_restrictions
                .add(arg, "grpc-restricted-protocol", GRPC_HEADER_PREFIX, "protocol")
                .map_err(|e| refuse(format!("--grpc-restricted-protocol={arg}"), e.0))?;
        }
        let pattern = |flag: &str, p: &Option<String>| match p.as_deref() {
            None | Some("") => Ok(None),
            Some(p) => HeaderForward::new(p)
                .map(Some)
                .map_err(|e| refuse(format!("--{flag}={p}"), format!("not a valid regular expression: {e}"))),
        };
        door.http_forward = pattern("http-header-forward-pattern", &self.http_header_forward_pattern)?;
        door.grpc_forward = pattern("grpc-header-forward-pattern", &self.grpc_header_forward_pattern)?;
        if self.grpc_tls_on() {
            let read = |flag: &str, path: &Option<String>| -> Result<Vec<u8>, Refused> {
                let path = path
                    .as_deref()
                    .ok_or_else(|| refuse(format!("--{flag}"), "is needed with --grpc-use-ssl: give a PEM file"))?;
                std::fs::read(path)
                    .map_err(|e| refuse(format!("--{flag}={path}"), format!("cannot read the file: {e}")))
            };
            let mutual = self.grpc_use_ssl_mutual == Some(true);
            door.grpc_tls = Some(tritium_grpc::front_door::Tls {
                cert: read("grpc-server-cert", &self.grpc_server_cert)?,
                key: read("grpc-server-key", &self.grpc_server_key)?,
                root: match (&self.grpc_root_cert, mutual) {
                    (None, false) => None,
                    (root, _) => Some(read("grpc-root-cert", root)?),
                },
                mutual,
            });
        }
        Ok(door)
    }
}

/// Whether a `--backend-config` setting has an effect: `default-max-batch-size`, for the
/// onnxruntime backend or for every backend (no backend name), which the stubs read from
/// `TRITIUM_BACKEND_CONFIG` when they auto-complete an ONNX model's config.
pub(crate) fn backend_config_applies(setting: &str) -> bool {
    let (backend, key_value) = setting.split_once(',').unwrap_or(("", setting));
    let key = key_value.split('=').next().unwrap_or("");
    matches!(backend, "" | "onnxruntime") && key == "default-max-batch-size"
}

/// What a `--backend-config` setting means to tritium.
fn backend_config_why(setting: &str) -> &'static str {
    let key = setting.split_once(',').map(|(_, kv)| kv.split('=').next().unwrap_or("")).unwrap_or("");
    match key {
        "shm-default-byte-size" | "shm-growth-byte-size" | "shm-region-prefix-name" => {
            "stubs use memfd regions that grow as needed"
        }
        "default-max-batch-size" => "the Python backend's auto-complete sets max_batch_size from model.py",
        _ => "tritium reads no such backend setting",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        flags: TritonFlags,
    }

    fn parse(args: &[&str]) -> TritonFlags {
        let mut argv = vec!["tritium"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv) {
            Ok(cli) => cli.flags,
            Err(e) => panic!("{args:?} did not parse: {e}"),
        }
    }

    #[test]
    fn booleans_take_tritons_spellings() {
        for (s, v) in [("true", true), ("ON", true), ("1", true), ("False", false), ("off", false), ("0", false)] {
            assert_eq!(triton_bool(s), Ok(v), "{s}");
        }
        assert!(triton_bool("yes").is_err());
        assert_eq!(triton_verbose("true"), Ok(1));
        assert_eq!(triton_verbose("3"), Ok(3));
        assert!(triton_verbose("loud").is_err());
    }

    #[test]
    fn both_value_syntaxes_and_defaults() {
        let f = parse(&["--allow-http=off", "--grpc-address", "127.0.0.2", "--exit-on-error", "1"]);
        assert!(!f.allow_http && f.allow_grpc && f.exit_on_error);
        assert_eq!(f.grpc_address.as_deref(), Some("127.0.0.2"));
        let f = parse(&[]);
        assert!(f.allow_http && f.allow_grpc && !f.exit_on_error && !f.reuse_http_port && f.allow_client_shm);
        assert!(!parse(&["--allow-client-shm=false"]).allow_client_shm);
        assert_eq!((f.grpc_keepalive_time, f.grpc_keepalive_timeout), (7_200_000, 20_000));
        assert_eq!(f.review(), Ok(Review::default()));
    }

    #[test]
    fn no_op_flags_are_accepted_with_one_line_each() {
        let f = parse(&[
            "--pinned-memory-pool-byte-size=268435456",
            "--cuda-memory-pool-byte-size=0:67108864",
            "--backend-config=python,shm-default-byte-size=1048576",
            "--allow-sagemaker=false",
            "--allow-gpu-metrics=false",
            "--trace-config=rate=100",
            "--enable-peer-access=false",
            "--grpc-infer-thread-count=4",
            "--grpc-max-response-pool-size=16",
        ]);
        let review = f.review().expect("accepted");
        assert_eq!(review.no_effect.len(), 8, "{:?}", review.no_effect);
        assert!(review.no_effect.iter().all(|l| l.contains("has no effect in tritium")));
        assert!(review.no_effect.iter().any(|l| l.contains("shm-default-byte-size") && l.contains("memfd")));
    }

    #[test]
    fn flags_asking_for_what_tritium_cannot_do_are_refused_by_name() {
        for (args, flag) in [
            (&["--cache-config=redis,host=localhost"][..], "--cache-config=redis,host=localhost"),
            (&["--cache-config=local,size=x"], "--cache-config=local,size=x"),
            (&["--cache-config=size=100"], "--cache-config=size=100"),
            (&["--cache-config=local,size"], "--cache-config=local,size"),
            (&["--cache-config=local,size=10", "--response-cache-byte-size=100"], "--response-cache-byte-size"),
            (&["--rate-limit=sometimes"], "--rate-limit=sometimes"),
            (&["--rate-limit=execution_count", "--rate-limit-resource=R1"], "--rate-limit-resource"),
            (&["--trace-config=level=LOUD"], "--trace-config"),
            (&["--trace-config=jaeger,url=x"], "--trace-config"),
            (&["--allow-sagemaker=true"], "--allow-sagemaker=true"),
            (&["--model-namespacing=true"], "--model-namespacing=true"),
        ] {
            let refused = parse(args).review().expect_err("refused");
            assert_eq!(refused.flag, flag, "{args:?}");
            assert!(!refused.why.is_empty());
        }
    }

    #[test]
    fn the_rate_limiter_is_on_only_with_execution_count() {
        assert!(parse(&[]).rate_limiter().expect("default").is_none());
        assert!(parse(&["--rate-limit=OFF"]).rate_limiter().expect("off").is_none());
        let f = parse(&["--rate-limit=execution_count", "--rate-limit-resource=R1:4", "--rate-limit-resource=R2:2:0"]);
        assert!(f.rate_limiter().expect("on").is_some());
        // With the rate limiter on, its resource counts have an effect.
        assert!(f.review().expect("accepted").no_effect.is_empty());
        let off = parse(&["--rate-limit-resource=R1:4"]).review().expect("accepted");
        assert!(off.no_effect.iter().any(|l| l.contains("--rate-limit-resource")), "{:?}", off.no_effect);
    }

    #[test]
    fn cpu_metrics_flags_switch_and_pace_the_host_gauges() {
        let (options, _) = parse(&[]).metrics_options().expect("defaults");
        assert!(options.cpu_metrics && options.interval == Duration::from_millis(2000));
        let f = parse(&["--allow-cpu-metrics=false", "--metrics-interval-ms=500"]);
        let (options, _) = f.metrics_options().expect("parsed");
        assert!(!options.cpu_metrics && options.interval == Duration::from_millis(500));
        assert!(f.review().expect("accepted").no_effect.is_empty());
        let refused = parse(&["--metrics-interval-ms=0"]).review().expect_err("refused");
        assert_eq!(refused.flag, "--metrics-interval-ms=0");
    }

    #[test]
    fn metrics_config_sets_the_latency_metrics() {
        let (options, ignored) = parse(&[]).metrics_options().expect("defaults");
        assert_eq!(options, tritium_server::MetricsOptions::default());
        assert!(options.counter_latencies && !options.summary_latencies && ignored.is_empty());
        let f = parse(&[
            "--metrics-config=summary_latencies=true",
            "--metrics-config",
            "counter_latencies=false",
            "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
            "--metrics-config=histogram_latencies=true",
            "--metrics-config=no_such_setting=1",
        ]);
        let (options, ignored) = f.metrics_options().expect("parsed");
        assert!(options.summary_latencies && !options.counter_latencies && options.histogram_latencies);
        assert_eq!(options.summary_quantiles, [(0.5, 0.05), (0.99, 0.001)]);
        assert_eq!(ignored, ["no_such_setting"]);
        let review = f.review().expect("accepted");
        assert_eq!(review.no_effect.len(), 1, "{:?}", review.no_effect);
        for (arg, why) in [
            ("--metrics-config=summary_latencies", "<setting>=<value>"),
            ("--metrics-config=summary_latencies=maybe", "maybe"),
            ("--metrics-config=summary_quantiles=0.5", "no ':' delimiter"),
        ] {
            let refused = parse(&[arg]).review().expect_err("refused");
            assert_eq!(refused.flag, arg);
            assert!(refused.why.contains(why), "{arg}: {}", refused.why);
        }
    }

    #[test]
    fn the_local_cache_size_is_read_from_either_flag() {
        assert_eq!(parse(&[]).response_cache_bytes(), Ok(None));
        assert_eq!(parse(&["--cache-config=local,size=1048576"]).response_cache_bytes(), Ok(Some(1_048_576)));
        assert_eq!(parse(&["--cache-config", "local,size=4096"]).response_cache_bytes(), Ok(Some(4096)));
        assert_eq!(parse(&["--response-cache-byte-size=2048"]).response_cache_bytes(), Ok(Some(2048)));
        assert_eq!(parse(&["--response-cache-byte-size=0"]).response_cache_bytes(), Ok(None));
        assert!(parse(&["--cache-config=local,size=1048576"]).review().is_ok());
    }

    #[test]
    fn trace_flags_are_implemented() {
        let f = parse(&[
            "--trace-config=mode=opentelemetry",
            "--trace-config",
            "level=TIMESTAMPS",
            "--trace-config=opentelemetry,url=http://127.0.0.1:4318/v1/traces",
        ]);
        assert_eq!(f.review(), Ok(Review::default()));
        let t = f.trace_flags().expect("valid");
        assert!(t.settings.level.timestamps());
        assert_eq!(t.otel.url, "http://127.0.0.1:4318/v1/traces");
        let legacy = parse(&["--trace-file=/tmp/t.json", "--trace-level=TIMESTAMPS", "--trace-rate=1"]);
        let t = legacy.trace_flags().expect("valid");
        assert_eq!((t.settings.file.as_str(), t.settings.rate), ("/tmp/t.json", 1));
    }

    #[test]
    fn access_flags_become_typed_values() {
        let f = parse(&[
            "--http-restricted-api=model-repository,statistics:Admin-Key=secret",
            "--http-restricted-api",
            "inference:infer-key=k",
            "--grpc-restricted-protocol=admin,health:key=v",
            "--http-header-forward-pattern=^x-",
            "--grpc-header-forward-pattern",
            "team",
        ]);
        assert_eq!(f.review(), Ok(Review::default()));
        let door = f.front_door().expect("parsed");
        let http = &door.http_restrictions;
        assert_eq!(
            http.get(ApiGroup::Statistics).map(|r| (r.header.as_str(), r.value.as_str())),
            Some(("admin-key", "secret"))
        );
        assert_eq!(http.get(ApiGroup::Inference).map(|r| r.header.as_str()), Some("infer-key"));
        assert_eq!(http.get(ApiGroup::Health), None);
        let grpc = &door.grpc_restrictions;
        assert_eq!(grpc.get(ApiGroup::Admin).map(|r| r.header.as_str()), Some("triton-grpc-protocol-key"));
        assert!(door.http_forward.is_some() && door.grpc_forward.is_some() && door.grpc_tls.is_none());
    }

    #[test]
    fn bad_access_flags_are_refused_with_tritons_texts() {
        let refused = |args: &[&str]| parse(args).front_door().expect_err("refused");
        let r = refused(&["--http-restricted-api=inferenc:k=v"]);
        assert_eq!(
            (r.flag.as_str(), r.why.as_str()),
            ("--http-restricted-api=inferenc:k=v", "unknown restricted api 'inferenc'")
        );
        let r = refused(&["--grpc-restricted-protocol=health:k=v", "--grpc-restricted-protocol=health:j=w"]);
        assert_eq!(r.why, "restricted protocol 'health' can not be specified in multiple config groups");
        let r = refused(&["--http-restricted-api=health"]);
        assert_eq!(r.why, "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health");
        let r = refused(&["--http-restricted-api=admin,health:k=v"]);
        assert!(r.why.contains("--grpc-restricted-protocol=admin"), "{}", r.why);
        let r = refused(&["--grpc-header-forward-pattern=("]);
        assert!(r.why.starts_with("not a valid regular expression"), "{}", r.why);
        let r = refused(&["--grpc-use-ssl=true", "--grpc-server-key=/k.pem"]);
        assert_eq!(r.flag, "--grpc-server-cert");
        let r = refused(&["--grpc-use-ssl-mutual=1", "--grpc-server-cert=/nonexistent/c.pem", "--grpc-server-key=/k"]);
        assert_eq!(r.flag, "--grpc-server-cert=/nonexistent/c.pem");
        assert!(r.why.starts_with("cannot read the file"), "{}", r.why);
    }
}
