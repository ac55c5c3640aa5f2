//! `tritium serve`: flags (Triton's names where Triton has them, also read from `TRITIUM_*`),
//! logging, the frontends, the initial model load, graceful shutdown on SIGINT/SIGTERM, and
//! systemd's notifications with SIGHUP as a repository re-scan (`sdnotify.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use tokio::sync::watch;
use tracing::{info, warn};
use tritium_host::StubCommand;
use tritium_server::{InstanceSettings, Server, ServerOptions};

/// How models get loaded, as Triton's `--model-control-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ControlMode {
    /// Load every model at startup; load and unload requests are refused.
    None,
    /// Load every model at startup and reload changed ones every `--repository-poll-secs`.
    Poll,
    /// Load only `--load-model` models at startup; load and unload on request.
    Explicit,
}

/// The `--help` heading of the flags tritonserver does not have.
const TRITIUM_OWN: &str = "tritium (not in tritonserver)";

/// Flags of `tritium serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The model repository directory (`--model-store` is Triton's other name for it; Triton
    /// takes several, tritium serves one).
    #[arg(
        long,
        env = "TRITIUM_MODEL_REPOSITORY",
        alias = "model-store",
        required = true,
        help_heading = "Model Repository"
    )]
    model_repository: Vec<PathBuf>,
    /// Address the HTTP, gRPC and metrics endpoints listen on, unless --http-address,
    /// --grpc-address or --metrics-address say otherwise (tritium's own; Triton binds 0.0.0.0).
    #[arg(long, env = "TRITIUM_HOST", default_value = "127.0.0.1", help_heading = TRITIUM_OWN)]
    host: String,
    /// HTTP (KServe v2 REST) port.
    #[arg(long, env = "TRITIUM_HTTP_PORT", default_value_t = 8000, help_heading = "HTTP")]
    http_port: u16,
    /// gRPC port.
    #[arg(long, env = "TRITIUM_GRPC_PORT", default_value_t = 8001, help_heading = "GRPC")]
    grpc_port: u16,
    /// Prometheus metrics port.
    #[arg(long, env = "TRITIUM_METRICS_PORT", default_value_t = 8002, help_heading = "Metrics")]
    metrics_port: u16,
    /// Serve Prometheus metrics on `--metrics-port`.
    #[arg(long, env = "TRITIUM_ALLOW_METRICS", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Metrics")]
    allow_metrics: bool,
    /// How models are loaded.
    #[arg(long, env = "TRITIUM_MODEL_CONTROL_MODE", value_enum, default_value_t = ControlMode::None, help_heading = "Model Repository")]
    model_control_mode: ControlMode,
    /// With explicit control: a model to load at startup (repeatable; `*` loads all).
    #[arg(long = "load-model", env = "TRITIUM_LOAD_MODEL", value_delimiter = ',', help_heading = "Model Repository")]
    load_model: Vec<String>,
    /// Seconds between repository scans in poll mode.
    #[arg(long, env = "TRITIUM_REPOSITORY_POLL_SECS", default_value_t = 15, help_heading = "Model Repository")]
    repository_poll_secs: u64,
    /// Verbose logging level (0 = off, 1 = debug, 2 and up = trace).
    #[arg(long, env = "TRITIUM_LOG_VERBOSE", default_value = "0", value_parser = crate::triton_flags::triton_verbose, help_heading = "Logging")]
    log_verbose: u32,
    /// Write INFO lines.
    #[arg(long, env = "TRITIUM_LOG_INFO", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Logging")]
    log_info: bool,
    /// Write WARNING lines.
    #[arg(long, env = "TRITIUM_LOG_WARNING", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Logging")]
    log_warning: bool,
    /// Write ERROR lines.
    #[arg(long, env = "TRITIUM_LOG_ERROR", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Logging")]
    log_error: bool,
    /// Log line format: default, ISO8601 or json.
    #[arg(long, env = "TRITIUM_LOG_FORMAT", default_value = "default", help_heading = "Logging")]
    log_format: String,
    /// Write the log to this file instead of stderr.
    #[arg(long, env = "TRITIUM_LOG_FILE", default_value = "", help_heading = "Logging")]
    log_file: String,
    /// The Python interpreter stubs run on (default: the repository's .venv, else python3).
    #[arg(long, env = "TRITIUM_PYTHON", help_heading = TRITIUM_OWN)]
    python: Option<PathBuf>,
    /// The directory holding tritium's Python package (default: found next to the binary).
    #[arg(long, env = "TRITIUM_PYTHON_PATH", help_heading = TRITIUM_OWN)]
    python_path: Option<PathBuf>,
    /// Seconds a stub may take to start and finish `initialize` (per model:
    /// `parameters { key: "stub_init_timeout_secs" ... }`).
    #[arg(long, env = "TRITIUM_STUB_INIT_TIMEOUT_SECS", default_value_t = 300, help_heading = TRITIUM_OWN)]
    stub_init_timeout_secs: u64,
    /// Seconds one `execute` may take before its stub is killed and restarted; 0 never (per
    /// model: `execute_timeout_secs`).
    #[arg(long, env = "TRITIUM_EXECUTE_TIMEOUT_SECS", default_value_t = 0, help_heading = TRITIUM_OWN)]
    execute_timeout_secs: u64,
    /// Fork stubs from a fork server per interpreter and environment (one that has imported
    /// numpy and tritium and started no thread) instead of starting a fresh interpreter each;
    /// per model, `parameters { key: "FORK_SERVER" value: { string_value: "false" } }` opts out.
    #[arg(long, env = "TRITIUM_STUB_FORK_SERVER", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = TRITIUM_OWN)]
    stub_fork_server: bool,
    /// Seconds without a heartbeat from a stub's native thread before it is killed as frozen.
    #[arg(long, env = "TRITIUM_STUB_HEARTBEAT_TIMEOUT_SECS", default_value_t = 10, help_heading = TRITIUM_OWN)]
    stub_heartbeat_timeout_secs: u64,
    /// Crashes within the restart window after which an instance is marked failed (per model:
    /// `stub_restart_limit`).
    #[arg(long, env = "TRITIUM_STUB_RESTART_LIMIT", default_value_t = 5, help_heading = TRITIUM_OWN)]
    stub_restart_limit: u32,
    /// Recycle a stub whose resident memory passes this many bytes: a fresh stub is started and
    /// ready first, then the old one finishes its batch and stops, so no request fails (per
    /// model: `stub_max_rss_bytes`; 0: no limit).
    #[arg(long, env = "TRITIUM_STUB_MAX_RSS_BYTES", default_value_t = 0, help_heading = TRITIUM_OWN)]
    stub_max_rss_bytes: u64,
    /// Recycle a stub once it has taken this many requests, the same way (per model:
    /// `stub_max_requests`; 0: no limit).
    #[arg(long, env = "TRITIUM_STUB_MAX_REQUESTS", default_value_t = 0, help_heading = TRITIUM_OWN)]
    stub_max_requests: u64,
    /// The window of `--stub-restart-limit`, in seconds (per model: `stub_restart_window_secs`).
    #[arg(long, env = "TRITIUM_STUB_RESTART_WINDOW_SECS", default_value_t = 60, help_heading = TRITIUM_OWN)]
    stub_restart_window_secs: u64,
    /// Longest delay between restarts of a crashing stub, in seconds; delays start at 0.1 s and
    /// double (per model: `stub_backoff_max_secs`).
    #[arg(long, env = "TRITIUM_STUB_BACKOFF_MAX_SECS", default_value_t = 10, help_heading = TRITIUM_OWN)]
    stub_backoff_max_secs: u64,
    /// After a reload switches traffic to the new instances, seconds the previous ones stay
    /// alive without traffic; if the new instances crash twice within them, the previous
    /// version serves again (the index's reason and the log say why). 0 retires the previous
    /// instances at once (per model: `model_update_grace_secs`).
    #[arg(long, env = "TRITIUM_MODEL_UPDATE_GRACE_SECS", default_value_t = tritium_server::DEFAULT_MODEL_UPDATE_GRACE_SECS, help_heading = TRITIUM_OWN)]
    model_update_grace_secs: u64,
    /// Do not call the models' `auto_complete_config`.
    #[arg(long, env = "TRITIUM_DISABLE_AUTO_COMPLETE_CONFIG", help_heading = "Model Repository")]
    disable_auto_complete_config: bool,
    /// Server readiness requires every model to be ready.
    #[arg(long, env = "TRITIUM_STRICT_READINESS", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Server")]
    strict_readiness: bool,
    /// Longest busy-poll, in microseconds, of a server thread or stub waiting for the other side
    /// before it sleeps; `auto` (the default) measures at start-up what waking a sleeping thread
    /// costs on this machine, and spins up to 500 us where that is 20 us or more (a virtual CPU
    /// that halts when idle), never where it is less. Spinning is also adaptive: only while
    /// messages keep arriving within this time of each other, so idle models cost no CPU (0 never
    /// spins).
    #[arg(long, env = "TRITIUM_STUB_SPIN_US", default_value = "auto", value_parser = parse_spin, help_heading = TRITIUM_OWN)]
    stub_spin_us: Spin,
    /// Longest busy-poll, in microseconds, of an async runtime thread about to sleep while a
    /// stub executes a batch for it, counted from the batch's start; `auto` (the default) takes
    /// the wake-up cost measured at start-up (at most 100 us) where it is 20 us or more, and 0
    /// (never) where it is less. A batch that ends within it is answered without the runtime
    /// thread sleeping and being woken; a longer one is slept through.
    #[arg(long, env = "TRITIUM_RUNTIME_SPIN_US", default_value = "auto", value_parser = parse_spin, help_heading = TRITIUM_OWN)]
    runtime_spin_us: Spin,
    /// Threads of the async runtime that runs the HTTP, gRPC, OpenAI and metrics frontends; by
    /// default half the CPUs this process may use (at least one), leaving the rest to the model
    /// stubs: a request handed between two runtime threads costs a cross-CPU wake-up, so fewer
    /// threads serve more requests per CPU second until they are saturated.
    #[arg(long, env = "TRITIUM_ASYNC_THREADS", value_parser = clap::value_parser!(u16).range(1..), help_heading = TRITIUM_OWN)]
    async_threads: Option<u16>,
    /// Serve the instances of models that are not decoupled and have no sequence batching from
    /// the async runtime that decoded their requests (run to completion: the stub wakes the
    /// runtime through an eventfd), rather than from a worker thread per instance, which costs
    /// two more thread wake-ups per request. `false` brings the worker threads back.
    #[arg(long, env = "TRITIUM_RUN_TO_COMPLETION", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = TRITIUM_OWN)]
    run_to_completion: bool,
    /// Seconds in-flight requests get to finish at shutdown.
    #[arg(long, env = "TRITIUM_EXIT_TIMEOUT_SECS", default_value_t = 30, help_heading = "Server")]
    exit_timeout_secs: u64,
    /// A token that lets clients other than loopback restart stubs (`tritium restart
    /// --admin-token`); without one, only clients on this host may.
    #[arg(long, env = "TRITIUM_ADMIN_TOKEN", hide_env_values = true, help_heading = TRITIUM_OWN)]
    admin_token: Option<String>,
    /// The rest of tritonserver's command line.
    #[command(flatten)]
    triton: crate::triton_flags::TritonFlags,
    // Stub and request limits (instance-hardening work).
    /// Most bytes of one request's id and parameters (keys and string values); a request with
    /// more is refused (400 / INVALID_ARGUMENT) before it is queued.
    #[arg(long, env = "TRITIUM_MAX_REQUEST_METADATA_BYTES", default_value_t = tritium_server::DEFAULT_MAX_REQUEST_METADATA_BYTES, help_heading = TRITIUM_OWN)]
    max_request_metadata_bytes: usize,
    /// Most bytes of output tensors in one response from a model; a larger response fails that
    /// request alone, before anything is copied. The default, 2 GiB, is the largest message
    /// Triton's gRPC endpoint sends.
    #[arg(long, env = "TRITIUM_MAX_OUTPUT_BYTES", default_value_t = tritium_server::DEFAULT_MAX_OUTPUT_BYTES, help_heading = TRITIUM_OWN)]
    max_output_bytes: u64,
    /// Most shared-memory segments one stub may have the server map at once; a stub that
    /// announces more breaks the protocol and is restarted.
    #[arg(long, env = "TRITIUM_MAX_STUB_SEGMENTS", default_value_t = tritium_host::ChannelLimits::default().max_peer_segments, help_heading = TRITIUM_OWN)]
    max_stub_segments: usize,
    /// Most bytes of one stub's shared-memory segments the server maps at once (address space;
    /// pages cost memory only once written); past it the stub is restarted.
    #[arg(long, env = "TRITIUM_MAX_STUB_SHM_BYTES", default_value_t = tritium_host::ChannelLimits::default().max_peer_mapped_bytes, help_heading = TRITIUM_OWN)]
    max_stub_shm_bytes: u64,
    /// Most bytes of shared memory the server holds for one stub's inputs at once; a request
    /// whose inputs do not fit fails alone.
    #[arg(long, env = "TRITIUM_MAX_SERVER_SHM_BYTES_PER_STUB", default_value_t = tritium_host::ChannelLimits::default().max_own_bytes, help_heading = TRITIUM_OWN)]
    max_server_shm_bytes_per_stub: u64,
    // Shared memory and sequence limits (issue 37).
    /// Most shared memory regions (system and CUDA) registered at once; a registration past it
    /// is refused. Each distinct range of a file holds a descriptor and a mapping, so keep this
    /// well below the process's descriptor limit (`ulimit -n`).
    #[arg(long, env = "TRITIUM_MAX_SHM_REGIONS", default_value_t = tritium_server::shm::DEFAULT_MAX_SHM_REGIONS, help_heading = TRITIUM_OWN)]
    max_shm_regions: usize,
    /// Most requests of sequences waiting for a free sequence slot (the sequence batcher's
    /// backlog) per model version; a request past it is refused with UNAVAILABLE.
    #[arg(long, env = "TRITIUM_MAX_SEQUENCE_BACKLOG", default_value_t = tritium_server::DEFAULT_MAX_SEQUENCE_BACKLOG, help_heading = TRITIUM_OWN)]
    max_sequence_backlog: usize,
    // Queue limits (queue-policy work).
    /// Requests a model version queues at most (per priority level) when its config sets no
    /// `max_queue_size` of its own, with or without dynamic batching; the overflow is rejected
    /// with UNAVAILABLE ("Exceeds maximum queue size"). 0: unbounded, Triton's behaviour.
    #[arg(long, env = "TRITIUM_MAX_QUEUE_SIZE", default_value_t = 0, help_heading = TRITIUM_OWN)]
    max_queue_size: usize,
    // Config limits (hardening: a config may be a client's load override).
    /// A directory outside the model directories that paths in a model config
    /// (`EXECUTION_ENV_PATH`, `requirements`, `label_filename`, warmup `input_data_file`) may
    /// name, such as a shared directory of packed environments; repeat for several. Without
    /// one, every such path must stay inside its model's directory.
    #[arg(long = "allow-config-path", value_name = "DIR", env = "TRITIUM_ALLOW_CONFIG_PATH", value_delimiter = ':', help_heading = TRITIUM_OWN)]
    allow_config_paths: Vec<PathBuf>,
    /// Most bytes of one `model_warmup` sample's data (its inputs times its `batch_size`); a
    /// config asking for more fails its load.
    #[arg(long, env = "TRITIUM_MAX_WARMUP_BYTES", default_value_t = tritium_server::config_limits::DEFAULT_MAX_WARMUP_BYTES, help_heading = TRITIUM_OWN)]
    max_warmup_bytes: u64,
    /// Most instances (stub processes) of one model version, over all of its instance groups;
    /// a config asking for more fails its load.
    #[arg(long, env = "TRITIUM_MAX_MODEL_INSTANCES", default_value_t = tritium_server::config_limits::DEFAULT_MAX_MODEL_INSTANCES, help_heading = TRITIUM_OWN)]
    max_model_instances: u64,
    /// Most sequence slots of one instance (`max_candidate_sequences`, or `max_batch_size` of a
    /// sequence-batched model); a config asking for more fails its load.
    #[arg(long, env = "TRITIUM_MAX_SEQUENCE_SLOTS", default_value_t = tritium_server::config_limits::DEFAULT_MAX_SEQUENCE_SLOTS, help_heading = TRITIUM_OWN)]
    max_sequence_slots: u64,
    // Client request limits (frontend-limits work).
    /// The largest HTTP request body, in bytes: the JSON and any binary tensor data together,
    /// counted after decompression (Triton's flag and default, 64 MiB).
    #[arg(long, env = "TRITIUM_HTTP_MAX_INPUT_SIZE", default_value_t = tritium_http::DEFAULT_MAX_INPUT_SIZE, help_heading = "HTTP")]
    http_max_input_size: usize,
    /// The largest gRPC message received or sent, in bytes (a compressed request counts
    /// decompressed); Triton's fixed limit, INT32_MAX, by default.
    #[arg(long, env = "TRITIUM_GRPC_MAX_MESSAGE_SIZE", default_value_t = tritium_grpc::MAX_GRPC_MESSAGE_SIZE, help_heading = TRITIUM_OWN)]
    grpc_max_message_size: usize,
    // Python-based backends (runtime work).
    /// The backend directory: a model with `backend: "<name>"` other than "python" runs
    /// `<backend-directory>/<name>/model.py` (a Python-based backend, as Triton's vLLM backend),
    /// with `pb_utils.get_model_dir()` still the model's version directory (Triton's flag and
    /// default).
    #[arg(
        long,
        env = "TRITIUM_BACKEND_DIRECTORY",
        default_value = "/opt/tritonserver/backends",
        help_heading = "Backend"
    )]
    backend_directory: PathBuf,
    // OpenAI frontend (issue 11)
    /// Serve the OpenAI-compatible API (`/v1/chat/completions`, `/v1/completions`,
    /// `/v1/models`) on this port; off unless given (Triton's OpenAI frontend uses 9000).
    #[arg(long, env = "TRITIUM_OPENAI_PORT", help_heading = TRITIUM_OWN)]
    openai_port: Option<u16>,
    /// A Jinja chat template for every model of the OpenAI frontend, overriding the
    /// `chat_template` of their `tokenizer_config.json` (a template file, or a
    /// `tokenizer_config.json`).
    #[arg(long, env = "TRITIUM_CHAT_TEMPLATE", help_heading = TRITIUM_OWN)]
    chat_template: Option<PathBuf>,
    /// Most template steps (minijinja instructions) one render of a chat template may run; a
    /// chat request whose messages need more is refused (400). It bounds a template whose loops
    /// grow with the messages.
    #[arg(long, env = "TRITIUM_CHAT_TEMPLATE_FUEL", default_value_t = tritium_openai::template::DEFAULT_FUEL, value_parser = clap::value_parser!(u64).range(1..), help_heading = TRITIUM_OWN)]
    chat_template_fuel: u64,
    /// Milliseconds a chat request waits for its prompt (templates render off the async
    /// runtime, one per two CPUs at once); past it the request is answered 503.
    #[arg(long, env = "TRITIUM_CHAT_TEMPLATE_TIMEOUT_MS", default_value_t = tritium_openai::template::DEFAULT_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..), help_heading = TRITIUM_OWN)]
    chat_template_timeout_ms: u64,
    /// The largest chat prompt a template may render, in bytes; a request whose prompt would be
    /// larger is refused (400) as soon as the render passes it.
    #[arg(long, env = "TRITIUM_CHAT_TEMPLATE_MAX_BYTES", default_value_t = tritium_openai::template::DEFAULT_MAX_PROMPT_BYTES, help_heading = TRITIUM_OWN)]
    chat_template_max_bytes: usize,
    /// Parse chat answers for tool calls with this parser (llama3 or mistral), as Triton's
    /// OpenAI frontend does; without it, requests with `tools` and `tool_choice` "auto" are
    /// refused (400).
    #[arg(long, env = "TRITIUM_TOOL_CALL_PARSER", value_parser = ["llama3", "mistral"], help_heading = TRITIUM_OWN)]
    tool_call_parser: Option<String>,
    /// The most text (bytes) a streamed tool-call parse holds; past it the stream ends with
    /// finish_reason "length" and the generation is cancelled.
    #[arg(long, env = "TRITIUM_MAX_TOOL_CALL_PARSE_BYTES", default_value_t = tritium_openai::tools::DEFAULT_MAX_PARSE_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), help_heading = TRITIUM_OWN)]
    max_tool_call_parse_bytes: usize,
    /// Serve each LoRA adapter listed in a model's `multi_lora.json` as `<model><SEP><adapter>`
    /// on the OpenAI frontend.
    #[arg(long, env = "TRITIUM_LORA_SEPARATOR", help_heading = TRITIUM_OWN)]
    lora_separator: Option<String>,
    // Back-pressure for decoupled streams (issue 10)
    /// Most responses of one decoupled request that the model may have sent and its client not
    /// yet taken; the model's next `send` waits for the client (0: no limit, the server buffers
    /// whatever the model sends).
    #[arg(long, env = "TRITIUM_MAX_INFLIGHT_RESPONSES", default_value_t = tritium_server::DEFAULT_MAX_INFLIGHT_RESPONSES, help_heading = TRITIUM_OWN)]
    max_inflight_responses: u32,
    // Per-model Python environments (issue 14).
    /// Where packed environments (`EXECUTION_ENV_PATH`) are unpacked and `requirements.txt`
    /// environments are built, each once, keyed by a hash of what made it (default:
    /// `$XDG_CACHE_HOME/tritium/envs`, else `~/.cache/tritium/envs`).
    #[arg(long, env = "TRITIUM_ENV_CACHE_DIR", help_heading = TRITIUM_OWN)]
    env_cache_dir: Option<PathBuf>,
    /// Install models' requirements only from this directory of wheels (pip's `--no-index
    /// --find-links DIR`), for servers without access to PyPI.
    #[arg(long, env = "TRITIUM_WHEELHOUSE", help_heading = TRITIUM_OWN)]
    wheelhouse: Option<PathBuf>,
    /// Seconds building one model's Python environment may take (its installer is killed past
    /// it and the load fails); apart from `--stub-init-timeout-secs`.
    #[arg(long, env = "TRITIUM_ENV_BUILD_TIMEOUT_SECS", default_value_t = 900, help_heading = TRITIUM_OWN)]
    env_build_timeout_secs: u64,
    // Tracing and config variants (issue 16, trace).
    /// Each model's config is `<model>/configs/<NAME>.pbtxt` when it has one, else its
    /// `config.pbtxt` (Triton's config variants).
    #[arg(long, env = "TRITIUM_MODEL_CONFIG_NAME", help_heading = "Model Repository")]
    model_config_name: Option<String>,
}

/// Finds the `python/` directory holding the `tritium` package with its native module built.
fn find_python_path(given: Option<PathBuf>) -> Result<PathBuf> {
    let has_native = |p: &Path| p.join("tritium/_native.abi3.so").is_file();
    if let Some(p) = given {
        if !has_native(&p) {
            bail!("{} has no tritium/_native.abi3.so: build it with `cargo xtask build`", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("locating the tritium binary")?;
    // A checkout (`python/` next to `target/`), or an installed wheel: the binary in
    // `<env>/bin`, the package in `<env>/lib/python3.X/site-packages`.
    let site_packages = |d: &Path| -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(d.join("lib")) else { return Vec::new() };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path().join("site-packages"))
            .collect();
        found.sort();
        found
    };
    let candidates = exe.ancestors().skip(1).take(4).flat_map(|d| {
        let mut c = vec![d.join("python"), d.join("share/tritium/python")];
        c.extend(site_packages(d));
        c
    });
    for c in candidates {
        if has_native(&c) {
            return Ok(c);
        }
    }
    bail!(
        "cannot find tritium's python/ directory next to {}: pass --python-path (after `cargo xtask build`)",
        exe.display()
    )
}

/// Runs the server until SIGINT or SIGTERM.
/// `--stub-spin-us`: a fixed budget, or one measured at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spin {
    Auto,
    Micros(u32),
}

fn parse_spin(s: &str) -> Result<Spin, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(Spin::Auto);
    }
    s.parse::<u32>()
        .map(Spin::Micros)
        .map_err(|_| format!("'{s}' is neither `auto` nor a number of microseconds (0 never spins)"))
}

/// The stub's and the runtime's spin budgets in microseconds: `auto` measures, once, what waking
/// a sleeping thread costs here (`tritium_host::spin`: the median of 30 wake-ups, each after 2 ms
/// of idleness, about 70 ms).
fn spin_budgets(stub: Spin, runtime: Spin) -> (u32, u32) {
    use tritium_host::spin;
    let cost = (stub == Spin::Auto || runtime == Spin::Auto).then(|| spin::wake_cost(30, Duration::from_millis(2)));
    // A number is the budget; `auto` is the flag's rule applied to the measured cost (measured
    // whenever a flag is `auto`).
    let budget = |flag, rule: fn(Duration) -> Duration| match flag {
        Spin::Micros(us) => Duration::from_micros(u64::from(us)),
        Spin::Auto => rule(cost.unwrap_or_default()),
    };
    let (stub_budget, runtime_budget) = (budget(stub, spin::budget_for), budget(runtime, spin::runtime_budget_for));
    if let (Spin::Auto, Some(cost)) = (stub, cost) {
        info!(
            wake_cost_us = cost.as_micros() as u64,
            spin_us = stub_budget.as_micros() as u64,
            "waking a sleeping thread takes {} us here ({} than {} us), so waiters spin {} before they sleep (--stub-spin-us auto)",
            cost.as_micros(),
            if stub_budget.is_zero() { "less" } else { "no less" },
            spin::SPIN_THRESHOLD.as_micros(),
            spin_words(stub_budget)
        );
    }
    if runtime == Spin::Auto {
        info!(
            runtime_spin_us = runtime_budget.as_micros() as u64,
            "an async runtime thread spins {} for a stub executing a batch before it sleeps (--runtime-spin-us auto)",
            spin_words(runtime_budget)
        );
    }
    (micros(stub_budget), micros(runtime_budget))
}

/// "never", or "up to N us", for the log.
fn spin_words(budget: Duration) -> String {
    if budget.is_zero() {
        "never".to_string()
    } else {
        format!("up to {} us", budget.as_micros())
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

pub(crate) fn run(args: ServeArgs) -> Result<()> {
    // A flag asking for what tritium cannot do stops it before anything starts.
    let review = args.triton.review().context("refusing to start")?;
    let front_door = args.triton.front_door().context("refusing to start")?;
    let grpc_tls = match &front_door.grpc_tls {
        Some(tls) => Some(tls.config().context("refusing to start: gRPC TLS")?),
        None => None,
    };
    let logging = crate::logging::Logging::install(tritium_server::LogSettings {
        log_file: args.log_file.clone(),
        log_info: args.log_info,
        log_warning: args.log_warning,
        log_error: args.log_error,
        log_verbose_level: args.log_verbose,
        log_format: args.log_format.clone(),
    })?;
    for line in &review.no_effect {
        info!("{line}");
    }
    let python_path = find_python_path(args.python_path.clone())?;
    let python = args.python.clone().unwrap_or_else(|| {
        let venv = crate::cli::normalize_path(&python_path.join("../.venv/bin/python"));
        // Installed from the wheel: the environment's own interpreter, next to the binary.
        let beside = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("python")));
        if venv.is_file() {
            venv
        } else if let Some(beside) = beside.filter(|p| {
            p.is_file()
                && python_path.starts_with(p.parent().and_then(Path::parent).unwrap_or(Path::new("/nonexistent")))
        }) {
            beside
        } else {
            PathBuf::from("python3")
        }
    });
    let repository = match args.model_repository.as_slice() {
        [one] => one.canonicalize().with_context(|| format!("model repository {} does not exist", one.display()))?,
        many => bail!(
            "--model-repository was given {} times: tritium serves one model repository (merge them into one \
             directory, or run one server per repository)",
            many.len()
        ),
    };
    let (stub_spin, runtime_spin) = spin_budgets(args.stub_spin_us, args.runtime_spin_us);
    tritium_host::set_fork_server(args.stub_fork_server);
    if args.admin_token.is_some() {
        // Models run as the server's user: keep the token out of their reach in /proc. (Children
        // never inherit TRITIUM_* variables; see tritium-host's process.rs.)
        tritium_host::hide_from_same_user().context("making the server non-dumpable to protect --admin-token")?;
    }
    let opts = ServerOptions {
        repository,
        stub: {
            info!(python = %python.display(), python_path = %python_path.display(), "stubs run on this interpreter unless a model has its own environment");
            // The backend settings the stubs' built-in backends read (triton_flags.rs says which).
            let settings: Vec<&str> = args
                .triton
                .backend_config
                .iter()
                .filter(|s| crate::triton_flags::backend_config_applies(s))
                .map(String::as_str)
                .collect();
            let env = if settings.is_empty() {
                Vec::new()
            } else {
                vec![("TRITIUM_BACKEND_CONFIG".into(), settings.join("\n").into())]
            };
            StubCommand { python, python_path, env, spin: stub_spin }
        },
        instance_settings: InstanceSettings {
            init_timeout: Duration::from_secs(args.stub_init_timeout_secs),
            execute_timeout: (args.execute_timeout_secs > 0).then(|| Duration::from_secs(args.execute_timeout_secs)),
            heartbeat_timeout: (args.stub_heartbeat_timeout_secs > 0)
                .then(|| Duration::from_secs(args.stub_heartbeat_timeout_secs)),
            restart_limit: args.stub_restart_limit,
            restart_window: Duration::from_secs(args.stub_restart_window_secs),
            backoff_max: Duration::from_secs(args.stub_backoff_max_secs),
            max_request_metadata_bytes: args.max_request_metadata_bytes,
            max_output_bytes: args.max_output_bytes,
            max_inflight_responses: args.max_inflight_responses,
            max_sequence_backlog: args.max_sequence_backlog,
            run_to_completion: args.run_to_completion,
            update_grace: Duration::from_secs(args.model_update_grace_secs),
            max_rss_bytes: (args.stub_max_rss_bytes > 0).then_some(args.stub_max_rss_bytes),
            max_requests: (args.stub_max_requests > 0).then_some(args.stub_max_requests),
            channel: tritium_host::ChannelLimits {
                max_peer_segments: args.max_stub_segments,
                max_peer_segment_bytes: tritium_host::ChannelLimits::default()
                    .max_peer_segment_bytes
                    .min(args.max_stub_shm_bytes),
                max_peer_mapped_bytes: args.max_stub_shm_bytes,
                max_own_bytes: args.max_server_shm_bytes_per_stub,
            },
            ..InstanceSettings::default()
        },
        auto_complete: !args.disable_auto_complete_config && args.triton.strict_model_config != Some(true),
        strict_readiness: args.strict_readiness,
        explicit_control: args.model_control_mode == ControlMode::Explicit,
        backend_directory: args.backend_directory.clone(),
        max_queue_size: args.max_queue_size,
        server_id: args.triton.id.clone().unwrap_or_else(|| "tritium".to_string()),
        load_threads: args.triton.model_load_thread_count.max(1),
        load_retries: args.triton.model_load_retry_count,
        envs: tritium_server::EnvOptions {
            cache_dir: args.env_cache_dir.clone().unwrap_or_else(tritium_server::envs::default_cache_dir),
            wheelhouse: args.wheelhouse.clone(),
            build_timeout: Duration::from_secs(args.env_build_timeout_secs),
            // The server reports it in the repository index.
            progress: Default::default(),
        },
        config_name: args.model_config_name.clone(),
        metrics: args.triton.metrics_options().context("refusing to start")?.0,
        gpus: cuda_devices(),
        paths: tritium_server::PathPolicy { allowed: args.allow_config_paths.clone() },
        limits: tritium_server::ConfigLimits {
            max_warmup_bytes: args.max_warmup_bytes,
            max_model_instances: args.max_model_instances,
            max_sequence_slots: args.max_sequence_slots,
        },
        rate_limiter: args.triton.rate_limiter().context("refusing to start")?,
    };
    let threads = async_threads(args.async_threads);
    info!(threads, "async runtime threads (--async-threads)");
    let park_spin = Duration::from_micros(u64::from(runtime_spin));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .on_thread_park(move || tritium_server::park_spin(park_spin))
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args, opts, logging, front_door, grpc_tls))
}

/// `--async-threads`, or half the CPUs this process may use (affinity mask and CPU quota), at
/// least one.
fn async_threads(given: Option<u16>) -> usize {
    match given {
        Some(n) => usize::from(n),
        None => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
    }
}

/// The CUDA devices instances may be placed on, said once in the log either way.
fn cuda_devices() -> Vec<i32> {
    match tritium_cuda::cuda() {
        Ok(cuda) => {
            let devices = cuda.devices();
            for &device in &devices {
                let name = cuda.device_name(device).unwrap_or_else(|e| e.to_string());
                info!(device, %name, "CUDA device");
            }
            devices
        }
        Err(e) => {
            info!(
                "{e}: models run on the CPU only (KIND_GPU instance groups are refused, CUDA shared memory cannot be \
                 registered)"
            );
            Vec::new()
        }
    }
}

/// Listens on `host:port` for `what` (`http`, `grpc`, `metrics`: the flags' prefix); with
/// `reuse_port` (Triton's `--reuse-http-port`), other servers with it may listen there too.
async fn bind(host: &str, port: u16, what: &str, reuse_port: bool) -> Result<tokio::net::TcpListener> {
    let addr: SocketAddr = tokio::net::lookup_host((host, port))
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .with_context(|| format!("invalid address {host:?} for {what} (--host or --{what}-address)"))?;
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }
        .context("creating a socket")?;
    socket.set_reuseaddr(true).context("setting SO_REUSEADDR")?;
    if reuse_port {
        socket.set_reuseport(true).context("setting SO_REUSEPORT")?;
    }
    socket.bind(addr).and_then(|()| socket.listen(1024)).with_context(|| {
        format!(
            "cannot listen for {what} on {addr}: is another server using the port? (choose another with --{what}-port)"
        )
    })
}

/// Starts the OpenAI frontend when `--openai-port` is given.
async fn start_openai(
    args: &ServeArgs,
    repository: &Path,
    server: &Server,
    restrictions: Arc<tritium_server::restricted::Restrictions>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Option<tritium_openai::Started>> {
    let Some(port) = args.openai_port else {
        if args.chat_template.is_some() {
            warn!("--chat-template is ignored without --openai-port");
        }
        return Ok(None);
    };
    let mut options = tritium_openai::Options::new(repository, args.chat_template.as_deref())?;
    options.template_limits = tritium_openai::RenderLimits {
        fuel: args.chat_template_fuel,
        timeout: Duration::from_millis(args.chat_template_timeout_ms),
        max_bytes: args.chat_template_max_bytes,
    };
    // The OpenAI port is HTTP too: `--http-restricted-api` applies to it.
    options.restrictions = restrictions;
    options.max_output_bytes = args.max_output_bytes;
    options.tool_call_parser =
        args.tool_call_parser.as_deref().map(str::parse).transpose().map_err(anyhow::Error::msg)?;
    options.max_tool_call_parse_bytes = args.max_tool_call_parse_bytes;
    options.lora_separator = args.lora_separator.clone().filter(|s| !s.is_empty());
    let started = tritium_openai::start(&args.host, port, server.clone(), options, shutdown).await?;
    info!("OpenAI-compatible service on {}", started.addr);
    Ok(Some(started))
}

/// The `STATUS=` text once a load is done: how many models serve, and which failed.
fn ready_status(server: &Server) -> String {
    let index = server.repository_index(false);
    let ready = index.iter().filter(|e| e.state == "READY").count();
    let failed: Vec<&str> = index.iter().filter(|e| e.state == "UNAVAILABLE").map(|e| e.name.as_str()).collect();
    if failed.is_empty() {
        format!("serving {ready} model(s)")
    } else {
        format!("serving {ready} model(s); failed to load: {}", failed.join(", "))
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            warn!("cannot watch SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn serve(
    args: ServeArgs,
    opts: ServerOptions,
    logging: std::sync::Arc<crate::logging::Logging>,
    front_door: crate::triton_flags::FrontDoor,
    grpc_tls: Option<tonic::transport::ServerTlsConfig>,
) -> Result<()> {
    let opts_repository = opts.repository.clone();
    let server = Server::new(opts);
    server.shm().set_allowed(args.triton.allow_client_shm);
    server.shm().set_max_regions(args.max_shm_regions);
    server.set_log_control(logging);
    // Tracing (issue 16): `--trace-config`, checked by the review in `run`; the exporter task
    // of opentelemetry mode runs on this runtime.
    let trace_flags = args.triton.trace_flags().context("refusing to start")?;
    for warning in &trace_flags.warnings {
        warn!("Warning: {warning}");
    }
    server.set_tracer(tritium_server::trace::Tracer::new(&trace_flags).context("refusing to start")?);
    // The response cache (checked by the review in `run`).
    if let Some(bytes) = args.triton.response_cache_byte_size {
        warn!(
            "Warning: '--response-cache-byte-size' has been deprecated! This will default to the 'local' cache \
             implementation with the provided byte size for its config. Please use '--cache-config' instead. The \
             equivalent --cache-config CLI args would be: '--cache-config=local,size={bytes}'"
        );
    }
    if let Ok(Some(bytes)) = args.triton.response_cache_bytes() {
        info!("response cache: local, {bytes} bytes");
        server.set_response_cache(bytes);
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let t = &args.triton;
    let http_address = t.http_address.as_deref().unwrap_or(&args.host);
    let http_restrictions = Arc::new(front_door.http_restrictions);
    let http_task = if t.allow_http {
        let http = bind(http_address, args.http_port, "http", t.reuse_http_port).await?;
        info!("HTTP service on {}", http.local_addr()?);
        let http_options = tritium_http::Options {
            max_input_size: args.http_max_input_size,
            restrictions: http_restrictions.clone(),
            header_forward: front_door.http_forward,
            admin_token: args.admin_token.clone().filter(|t| !t.is_empty()).map(Arc::from),
        };
        let serving = tritium_http::serve_with(http, Arc::new(server.clone()), http_options, stopped(stop_rx.clone()));
        Some(tokio::spawn(serving))
    } else {
        info!("HTTP service off (--allow-http=false)");
        None
    };
    let grpc_task = if t.allow_grpc {
        let grpc_address = t.grpc_address.as_deref().unwrap_or(&args.host);
        let grpc = bind(grpc_address, args.grpc_port, "grpc", t.reuse_grpc_port).await?;
        let scheme = match &front_door.grpc_tls {
            Some(tls) if tls.mutual => " (mutual TLS)",
            Some(_) => " (TLS)",
            None => "",
        };
        info!("gRPC service on {}{scheme}", grpc.local_addr()?);
        let ms = |v: u64| Duration::from_millis(v);
        let grpc_options = tritium_grpc::Options {
            max_message_size: args.grpc_max_message_size,
            keepalive_interval: ms(t.grpc_keepalive_time),
            keepalive_timeout: ms(t.grpc_keepalive_timeout),
            max_connection_age: t.grpc_max_connection_age.map(ms),
            max_connection_age_grace: t.grpc_max_connection_age_grace.map(ms),
            compress_responses: t.grpc_infer_response_compression_level != crate::triton_flags::CompressionLevel::None,
            restrictions: Arc::new(front_door.grpc_restrictions),
            header_forward: front_door.grpc_forward,
            tls: grpc_tls,
        };
        Some(tokio::spawn(tritium_grpc::serve_with(
            grpc,
            server.clone(),
            args.admin_token.clone(),
            grpc_options,
            stopped(stop_rx.clone()),
        )))
    } else {
        info!("gRPC service off (--allow-grpc=false)");
        None
    };
    let openai = start_openai(&args, &opts_repository, &server, http_restrictions, stopped(stop_rx.clone())).await?;
    let openai_metrics = openai.as_ref().map(|o| o.metrics.clone());
    let metrics_task = if args.allow_metrics {
        let metrics_address = t.metrics_address.as_deref().unwrap_or(http_address);
        let listener = bind(metrics_address, args.metrics_port, "metrics", false).await?;
        info!("metrics on http://{}/metrics", listener.local_addr()?);
        let server = server.clone();
        Some(tokio::spawn(crate::metrics_http::serve(
            listener,
            move || server.metrics_text() + &openai_metrics.as_ref().map(|m| m.render()).unwrap_or_default(),
            stopped(stop_rx.clone()),
        )))
    } else {
        None
    };

    // systemd (Type=notify, ExecReload=kill -HUP): readiness, status, watchdog, and SIGHUP as a
    // repository re-scan (sdnotify.rs). The SIGHUP handler is in place before any model loads,
    // so an early reload request cannot end the process (SIGHUP's default action).
    let notifier = crate::sdnotify::Notifier::from_env();
    let watchdog = match (&notifier, crate::sdnotify::watchdog_interval()) {
        (Some(n), Some(every)) => Some(crate::sdnotify::spawn_watchdog(n.clone(), every)),
        _ => None,
    };
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| warn!("cannot watch SIGHUP ({e}); it will stop the server instead of re-scanning"))
        .ok();

    let initial = match args.model_control_mode {
        ControlMode::Explicit if !args.load_model.iter().any(|m| m == "*") => args.load_model.clone(),
        _ => server.repository_models(),
    };
    info!("loading {} model(s) from {}", initial.len(), opts_repository.display());
    if let Some(n) = &notifier {
        n.status(&format!("loading {} model(s)", initial.len()));
    }
    // With --exit-on-error=true, a model that fails its first load stops the server (Triton's
    // behaviour, and its default); tritium's default keeps serving the models that loaded.
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let loading = {
        let server = server.clone();
        let poll = (args.model_control_mode == ControlMode::Poll)
            .then(|| Duration::from_secs(args.repository_poll_secs.max(1)));
        let exit_on_error = args.triton.exit_on_error;
        let notifier = notifier.clone();
        let mode = args.model_control_mode;
        tokio::spawn(async move {
            server.load_models(initial.clone()).await;
            if exit_on_error {
                let failed: Vec<String> = server
                    .repository_index(false)
                    .into_iter()
                    .filter(|e| e.state == "UNAVAILABLE" && initial.contains(&e.name))
                    .map(|e| format!("{}: {}", e.name, e.reason))
                    .collect();
                if !failed.is_empty() {
                    let _ = failed_tx.send(failed.join("; "));
                    return;
                }
            }
            if let Some(n) = &notifier {
                n.notify(&format!("READY=1\nSTATUS={}", ready_status(&server)));
            }
            loop {
                let hup = async {
                    match hangup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                };
                let tick = async {
                    match poll {
                        Some(every) => tokio::time::sleep(every).await,
                        None => std::future::pending().await,
                    }
                };
                let rescan = tokio::select! {
                    _ = tick => false,
                    Some(()) = hup => true,
                    // SIGHUP's stream ended (the runtime is stopping) and no poll timer: idle.
                    else => std::future::pending().await,
                };
                if rescan && mode == ControlMode::Explicit {
                    warn!("SIGHUP ignored: with --model-control-mode explicit, models load and unload on request only");
                    continue;
                }
                if rescan {
                    info!("SIGHUP: re-scanning the model repository");
                    if let Some(n) = &notifier {
                        n.status("re-scanning the model repository (SIGHUP)");
                    }
                }
                if rescan {
                    server.rescan_repository().await;
                } else {
                    server.poll_repository().await;
                }
                if let (true, Some(n)) = (rescan, &notifier) {
                    n.status(&ready_status(&server));
                }
            }
        })
    };

    let failed = tokio::select! {
        _ = shutdown_signal() => None,
        Ok(why) = failed_rx => Some(why),
    };
    if let Some(why) = &failed {
        tracing::error!("a model failed to load and --exit-on-error is true: {why}");
    }
    info!(
        "shutting down: no new requests; in-flight requests get {}s (a second signal stops at once)",
        args.exit_timeout_secs
    );
    tokio::spawn(async {
        shutdown_signal().await;
        warn!("second signal: exiting now; stubs die with the server");
        std::process::exit(130);
    });
    loading.abort();
    if let Some(n) = &notifier {
        n.notify("STOPPING=1\nSTATUS=shutting down: draining requests and finalizing models");
    }
    if let Some(w) = watchdog {
        w.abort();
    }
    let _ = stop_tx.send(true);
    let drain = async {
        if let Some(t) = http_task {
            let _ = t.await;
        }
        if let Some(t) = grpc_task {
            let _ = t.await;
        }
        if let Some(o) = openai {
            let _ = o.task.await;
        }
        if let Some(t) = metrics_task {
            let _ = t.await;
        }
        server.shutdown().await;
    };
    if tokio::time::timeout(Duration::from_secs(args.exit_timeout_secs), drain).await.is_err() {
        warn!("exit timeout reached; stopping the remaining stubs");
    }
    if let Some(tracer) = server.tracer() {
        // The last spans go to the collector, the waiting traces to the trace file.
        tracer.shutdown(Duration::from_secs(5)).await;
    }
    info!("stopped");
    match failed {
        Some(why) => bail!("exiting because a model failed to load (--exit-on-error=true): {why}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_threads_default_to_half_the_cpus_and_at_least_one() {
        assert_eq!(async_threads(Some(3)), 3);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(async_threads(None), (cpus / 2).max(1));
    }

    #[test]
    fn the_spin_flag_is_auto_or_microseconds() {
        assert_eq!(parse_spin("auto"), Ok(Spin::Auto));
        assert_eq!(parse_spin("AUTO"), Ok(Spin::Auto));
        assert_eq!(parse_spin("0"), Ok(Spin::Micros(0)));
        assert_eq!(parse_spin("250"), Ok(Spin::Micros(250)));
        let err = parse_spin("fast").expect_err("not a budget");
        assert!(err.contains("'fast'") && err.contains("auto"), "{err}");
        assert_eq!(spin_budgets(Spin::Micros(7), Spin::Micros(3)), (7, 3));
    }
}
