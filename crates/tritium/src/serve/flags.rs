//! The flags of `tritium serve` ([`ServeArgs`]): Triton's names where Triton has them (the rest
//! of tritonserver's command line is [`TritonFlags`](crate::triton_flags::TritonFlags)), each
//! also read from a `TRITIUM_*` variable, and tritium's own under a `--help` heading of their own.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::spin::{parse_spin, Spin};

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
    pub(super) model_repository: Vec<PathBuf>,
    /// Address the HTTP, gRPC and metrics endpoints listen on, unless --http-address,
    /// --grpc-address or --metrics-address say otherwise (tritium's own; Triton binds 0.0.0.0).
    #[arg(long, env = "TRITIUM_HOST", default_value = "127.0.0.1", help_heading = TRITIUM_OWN)]
    pub(super) host: String,
    /// HTTP (KServe v2 REST) port.
    #[arg(long, env = "TRITIUM_HTTP_PORT", default_value_t = 8000, help_heading = "HTTP")]
    pub(super) http_port: u16,
    /// gRPC port.
    #[arg(long, env = "TRITIUM_GRPC_PORT", default_value_t = 8001, help_heading = "GRPC")]
    pub(super) grpc_port: u16,
    /// Prometheus metrics port.
    #[arg(long, env = "TRITIUM_METRICS_PORT", default_value_t = 8002, help_heading = "Metrics")]
    pub(super) metrics_port: u16,
    /// Serve Prometheus metrics on `--metrics-port`.
    #[arg(long, env = "TRITIUM_ALLOW_METRICS", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Metrics")]
    pub(super) allow_metrics: bool,
    /// How models are loaded.
    #[arg(long, env = "TRITIUM_MODEL_CONTROL_MODE", value_enum, default_value_t = ControlMode::None, help_heading = "Model Repository")]
    pub(super) model_control_mode: ControlMode,
    /// With explicit control: a model to load at startup (repeatable; `*` loads all).
    #[arg(long = "load-model", env = "TRITIUM_LOAD_MODEL", value_delimiter = ',', help_heading = "Model Repository")]
    pub(super) load_model: Vec<String>,
    /// Seconds between repository scans in poll mode.
    #[arg(long, env = "TRITIUM_REPOSITORY_POLL_SECS", default_value_t = 15, help_heading = "Model Repository")]
    pub(super) repository_poll_secs: u64,
    /// Verbose logging level (0 = off, 1 = debug, 2 and up = trace).
    #[arg(long, env = "TRITIUM_LOG_VERBOSE", default_value = "0", value_parser = crate::triton_flags::triton_verbose, help_heading = "Logging")]
    pub(super) log_verbose: u32,
    /// Write INFO lines.
    #[arg(long, env = "TRITIUM_LOG_INFO", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Logging")]
    pub(super) log_info: bool,
    /// Write WARNING lines.
    #[arg(long, env = "TRITIUM_LOG_WARNING", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Logging")]
    pub(super) log_warning: bool,
    /// Write ERROR lines.
    #[arg(long, env = "TRITIUM_LOG_ERROR", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Logging")]
    pub(super) log_error: bool,
    /// Log line format: default, ISO8601 or json.
    #[arg(long, env = "TRITIUM_LOG_FORMAT", default_value = "default", help_heading = "Logging")]
    pub(super) log_format: String,
    /// Write the log to this file instead of stderr.
    #[arg(long, env = "TRITIUM_LOG_FILE", default_value = "", help_heading = "Logging")]
    pub(super) log_file: String,
    /// The Python interpreter stubs run on (default: the repository's .venv, else python3).
    #[arg(long, env = "TRITIUM_PYTHON", help_heading = TRITIUM_OWN)]
    pub(super) python: Option<PathBuf>,
    /// The directory holding tritium's Python package (default: found next to the binary).
    #[arg(long, env = "TRITIUM_PYTHON_PATH", help_heading = TRITIUM_OWN)]
    pub(super) python_path: Option<PathBuf>,
    /// Seconds a stub may take to start and finish `initialize` (per model:
    /// `parameters { key: "stub_init_timeout_secs" ... }`).
    #[arg(long, env = "TRITIUM_STUB_INIT_TIMEOUT_SECS", default_value_t = 300, help_heading = TRITIUM_OWN)]
    pub(super) stub_init_timeout_secs: u64,
    /// Seconds one `execute` may take before its stub is killed and restarted; 0 never (per
    /// model: `execute_timeout_secs`).
    #[arg(long, env = "TRITIUM_EXECUTE_TIMEOUT_SECS", default_value_t = 0, help_heading = TRITIUM_OWN)]
    pub(super) execute_timeout_secs: u64,
    /// Fork stubs from a fork server per interpreter and environment (one that has imported
    /// numpy and tritium and started no thread) instead of starting a fresh interpreter each;
    /// per model, `parameters { key: "FORK_SERVER" value: { string_value: "false" } }` opts out.
    #[arg(long, env = "TRITIUM_STUB_FORK_SERVER", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = TRITIUM_OWN)]
    pub(super) stub_fork_server: bool,
    /// Seconds without a heartbeat from a stub's native thread before it is killed as frozen.
    #[arg(long, env = "TRITIUM_STUB_HEARTBEAT_TIMEOUT_SECS", default_value_t = 10, help_heading = TRITIUM_OWN)]
    pub(super) stub_heartbeat_timeout_secs: u64,
    /// Crashes within the restart window after which an instance is marked failed (per model:
    /// `stub_restart_limit`).
    #[arg(long, env = "TRITIUM_STUB_RESTART_LIMIT", default_value_t = 5, help_heading = TRITIUM_OWN)]
    pub(super) stub_restart_limit: u32,
    /// Recycle a stub whose resident memory passes this many bytes: a fresh stub is started and
    /// ready first, then the old one finishes its batch and stops, so no request fails (per
    /// model: `stub_max_rss_bytes`; 0: no limit).
    #[arg(long, env = "TRITIUM_STUB_MAX_RSS_BYTES", default_value_t = 0, help_heading = TRITIUM_OWN)]
    pub(super) stub_max_rss_bytes: u64,
    /// Recycle a stub once it has taken this many requests, the same way (per model:
    /// `stub_max_requests`; 0: no limit).
    #[arg(long, env = "TRITIUM_STUB_MAX_REQUESTS", default_value_t = 0, help_heading = TRITIUM_OWN)]
    pub(super) stub_max_requests: u64,
    /// The window of `--stub-restart-limit`, in seconds (per model: `stub_restart_window_secs`).
    #[arg(long, env = "TRITIUM_STUB_RESTART_WINDOW_SECS", default_value_t = 60, help_heading = TRITIUM_OWN)]
    pub(super) stub_restart_window_secs: u64,
    /// Longest delay between restarts of a crashing stub, in seconds; delays start at 0.1 s and
    /// double (per model: `stub_backoff_max_secs`).
    #[arg(long, env = "TRITIUM_STUB_BACKOFF_MAX_SECS", default_value_t = 10, help_heading = TRITIUM_OWN)]
    pub(super) stub_backoff_max_secs: u64,
    /// After a reload switches traffic to the new instances, seconds the previous ones stay
    /// alive without traffic; if the new instances crash twice within them, the previous
    /// version serves again (the index's reason and the log say why). 0 retires the previous
    /// instances at once (per model: `model_update_grace_secs`).
    #[arg(long, env = "TRITIUM_MODEL_UPDATE_GRACE_SECS", default_value_t = tritium_server::DEFAULT_MODEL_UPDATE_GRACE_SECS, help_heading = TRITIUM_OWN)]
    pub(super) model_update_grace_secs: u64,
    /// Do not call the models' `auto_complete_config`.
    #[arg(long, env = "TRITIUM_DISABLE_AUTO_COMPLETE_CONFIG", help_heading = "Model Repository")]
    pub(super) disable_auto_complete_config: bool,
    /// Server readiness requires every model to be ready.
    #[arg(long, env = "TRITIUM_STRICT_READINESS", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = "Server")]
    pub(super) strict_readiness: bool,
    /// Longest busy-poll, in microseconds, of a server thread or stub waiting for the other side
    /// before it sleeps; `auto` (the default) measures at start-up what waking a sleeping thread
    /// costs on this machine, and spins up to 150 us where that is 20 us or more (a virtual CPU
    /// that halts when idle), never where it is less. Spinning is also adaptive: only while
    /// messages keep arriving within this time of each other, so idle models cost no CPU (0 never
    /// spins).
    #[arg(long, env = "TRITIUM_STUB_SPIN_US", default_value = "auto", value_parser = parse_spin, help_heading = TRITIUM_OWN)]
    pub(super) stub_spin_us: Spin,
    /// Longest busy-poll, in microseconds, of an async runtime thread about to sleep while a
    /// stub executes a batch for it, counted from the batch's start; `auto` (the default) takes
    /// the wake-up cost measured at start-up (at most 100 us) where it is 20 us or more, and 0
    /// (never) where it is less. A batch that ends within it is answered without the runtime
    /// thread sleeping and being woken; a longer one is slept through.
    #[arg(long, env = "TRITIUM_RUNTIME_SPIN_US", default_value = "auto", value_parser = parse_spin, help_heading = TRITIUM_OWN)]
    pub(super) runtime_spin_us: Spin,
    /// Threads of the async runtime that runs the HTTP, gRPC, OpenAI and metrics frontends; by
    /// default half the CPUs this process may use (at least one), leaving the rest to the model
    /// stubs: a request handed between two runtime threads costs a cross-CPU wake-up, so fewer
    /// threads serve more requests per CPU second until they are saturated.
    #[arg(long, env = "TRITIUM_ASYNC_THREADS", value_parser = clap::value_parser!(u16).range(1..), help_heading = TRITIUM_OWN)]
    pub(super) async_threads: Option<u16>,
    /// Serve the instances of models that have no sequence batching, decoupled or not, from the
    /// async runtime that decoded their requests (run to completion: the stub wakes the runtime
    /// through an eventfd), rather than from a worker thread per instance, which costs two more
    /// thread wake-ups per request (per streamed response, for a decoupled model). `false`
    /// brings the worker threads back.
    #[arg(long, env = "TRITIUM_RUN_TO_COMPLETION", default_value = "true", value_parser = crate::triton_flags::triton_bool, action = clap::ArgAction::Set, help_heading = TRITIUM_OWN)]
    pub(super) run_to_completion: bool,
    /// Seconds in-flight requests get to finish at shutdown.
    #[arg(long, env = "TRITIUM_EXIT_TIMEOUT_SECS", default_value_t = 30, help_heading = "Server")]
    pub(super) exit_timeout_secs: u64,
    /// A token that lets clients other than loopback restart stubs (`tritium restart
    /// --admin-token`); without one, only clients on this host may.
    #[arg(long, env = "TRITIUM_ADMIN_TOKEN", hide_env_values = true, help_heading = TRITIUM_OWN)]
    pub(super) admin_token: Option<String>,
    /// The rest of tritonserver's command line.
    #[command(flatten)]
    pub(super) triton: crate::triton_flags::TritonFlags,
    // Stub and request limits (instance-hardening work).
    /// Most bytes of one request's id and parameters (keys and string values); a request with
    /// more is refused (400 / INVALID_ARGUMENT) before it is queued.
    #[arg(long, env = "TRITIUM_MAX_REQUEST_METADATA_BYTES", default_value_t = tritium_server::DEFAULT_MAX_REQUEST_METADATA_BYTES, help_heading = TRITIUM_OWN)]
    pub(super) max_request_metadata_bytes: usize,
    /// Most bytes of output tensors in one response from a model; a larger response fails that
    /// request alone, before anything is copied. The default, 2 GiB, is the largest message
    /// Triton's gRPC endpoint sends.
    #[arg(long, env = "TRITIUM_MAX_OUTPUT_BYTES", default_value_t = tritium_server::DEFAULT_MAX_OUTPUT_BYTES, help_heading = TRITIUM_OWN)]
    pub(super) max_output_bytes: u64,
    /// Most shared-memory segments one stub may have the server map at once; a stub that
    /// announces more breaks the protocol and is restarted.
    #[arg(long, env = "TRITIUM_MAX_STUB_SEGMENTS", default_value_t = tritium_host::ChannelLimits::default().max_peer_segments, help_heading = TRITIUM_OWN)]
    pub(super) max_stub_segments: usize,
    /// Most bytes of one stub's shared-memory segments the server maps at once (address space;
    /// pages cost memory only once written); past it the stub is restarted.
    #[arg(long, env = "TRITIUM_MAX_STUB_SHM_BYTES", default_value_t = tritium_host::ChannelLimits::default().max_peer_mapped_bytes, help_heading = TRITIUM_OWN)]
    pub(super) max_stub_shm_bytes: u64,
    /// Most bytes of shared memory the server holds for one stub's inputs at once; a request
    /// whose inputs do not fit fails alone.
    #[arg(long, env = "TRITIUM_MAX_SERVER_SHM_BYTES_PER_STUB", default_value_t = tritium_host::ChannelLimits::default().max_own_bytes, help_heading = TRITIUM_OWN)]
    pub(super) max_server_shm_bytes_per_stub: u64,
    // Shared memory and sequence limits (issue 37).
    /// Most shared memory regions (system and CUDA) registered at once; a registration past it
    /// is refused. Each distinct range of a file holds a descriptor and a mapping, so keep this
    /// well below the process's descriptor limit (`ulimit -n`).
    #[arg(long, env = "TRITIUM_MAX_SHM_REGIONS", default_value_t = tritium_server::shm::DEFAULT_MAX_SHM_REGIONS, help_heading = TRITIUM_OWN)]
    pub(super) max_shm_regions: usize,
    /// Most requests of sequences waiting for a free sequence slot (the sequence batcher's
    /// backlog) per model version; a request past it is refused with UNAVAILABLE.
    #[arg(long, env = "TRITIUM_MAX_SEQUENCE_BACKLOG", default_value_t = tritium_server::DEFAULT_MAX_SEQUENCE_BACKLOG, help_heading = TRITIUM_OWN)]
    pub(super) max_sequence_backlog: usize,
    // Queue limits (queue-policy work).
    /// Requests a model version queues at most (per priority level) when its config sets no
    /// `max_queue_size` of its own, with or without dynamic batching; the overflow is rejected
    /// with UNAVAILABLE ("Exceeds maximum queue size"). 0: unbounded, Triton's behaviour.
    #[arg(long, env = "TRITIUM_MAX_QUEUE_SIZE", default_value_t = 0, help_heading = TRITIUM_OWN)]
    pub(super) max_queue_size: usize,
    // Config limits (hardening: a config may be a client's load override).
    /// A directory outside the model directories that paths in a model config
    /// (`EXECUTION_ENV_PATH`, `requirements`, `label_filename`, warmup `input_data_file`) may
    /// name, such as a shared directory of packed environments; repeat for several. Without
    /// one, every such path must stay inside its model's directory.
    #[arg(long = "allow-config-path", value_name = "DIR", env = "TRITIUM_ALLOW_CONFIG_PATH", value_delimiter = ':', help_heading = TRITIUM_OWN)]
    pub(super) allow_config_paths: Vec<PathBuf>,
    /// Most bytes of one `model_warmup` sample's data (its inputs times its `batch_size`); a
    /// config asking for more fails its load.
    #[arg(long, env = "TRITIUM_MAX_WARMUP_BYTES", default_value_t = tritium_server::config_limits::DEFAULT_MAX_WARMUP_BYTES, help_heading = TRITIUM_OWN)]
    pub(super) max_warmup_bytes: u64,
    /// Most instances (stub processes) of one model version, over all of its instance groups;
    /// a config asking for more fails its load.
    #[arg(long, env = "TRITIUM_MAX_MODEL_INSTANCES", default_value_t = tritium_server::config_limits::DEFAULT_MAX_MODEL_INSTANCES, help_heading = TRITIUM_OWN)]
    pub(super) max_model_instances: u64,
    /// Most sequence slots of one instance (`max_candidate_sequences`, or `max_batch_size` of a
    /// sequence-batched model); a config asking for more fails its load.
    #[arg(long, env = "TRITIUM_MAX_SEQUENCE_SLOTS", default_value_t = tritium_server::config_limits::DEFAULT_MAX_SEQUENCE_SLOTS, help_heading = TRITIUM_OWN)]
    pub(super) max_sequence_slots: u64,
    // Client request limits (frontend-limits work).
    /// The largest HTTP request body, in bytes: the JSON and any binary tensor data together,
    /// counted after decompression (Triton's flag and default, 64 MiB).
    #[arg(long, env = "TRITIUM_HTTP_MAX_INPUT_SIZE", default_value_t = tritium_http::DEFAULT_MAX_INPUT_SIZE, help_heading = "HTTP")]
    pub(super) http_max_input_size: usize,
    /// The largest gRPC message received or sent, in bytes (a compressed request counts
    /// decompressed); Triton's fixed limit, INT32_MAX, by default.
    #[arg(long, env = "TRITIUM_GRPC_MAX_MESSAGE_SIZE", default_value_t = tritium_grpc::MAX_GRPC_MESSAGE_SIZE, help_heading = TRITIUM_OWN)]
    pub(super) grpc_max_message_size: usize,
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
    pub(super) backend_directory: PathBuf,
    // OpenAI frontend (issue 11)
    /// Serve the OpenAI-compatible API (`/v1/chat/completions`, `/v1/completions`,
    /// `/v1/models`) on this port; off unless given (Triton's OpenAI frontend uses 9000).
    #[arg(long, env = "TRITIUM_OPENAI_PORT", help_heading = TRITIUM_OWN)]
    pub(super) openai_port: Option<u16>,
    /// A Jinja chat template for every model of the OpenAI frontend, overriding the
    /// `chat_template` of their `tokenizer_config.json` (a template file, or a
    /// `tokenizer_config.json`).
    #[arg(long, env = "TRITIUM_CHAT_TEMPLATE", help_heading = TRITIUM_OWN)]
    pub(super) chat_template: Option<PathBuf>,
    /// Most template steps (minijinja instructions) one render of a chat template may run; a
    /// chat request whose messages need more is refused (400). It bounds a template whose loops
    /// grow with the messages.
    #[arg(long, env = "TRITIUM_CHAT_TEMPLATE_FUEL", default_value_t = tritium_openai::template::DEFAULT_FUEL, value_parser = clap::value_parser!(u64).range(1..), help_heading = TRITIUM_OWN)]
    pub(super) chat_template_fuel: u64,
    /// Milliseconds a chat request waits for its prompt (templates render off the async
    /// runtime, one per two CPUs at once); past it the request is answered 503.
    #[arg(long, env = "TRITIUM_CHAT_TEMPLATE_TIMEOUT_MS", default_value_t = tritium_openai::template::DEFAULT_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..), help_heading = TRITIUM_OWN)]
    pub(super) chat_template_timeout_ms: u64,
    /// The largest chat prompt a template may render, in bytes; a request whose prompt would be
    /// larger is refused (400) as soon as the render passes it.
    #[arg(long, env = "TRITIUM_CHAT_TEMPLATE_MAX_BYTES", default_value_t = tritium_openai::template::DEFAULT_MAX_PROMPT_BYTES, help_heading = TRITIUM_OWN)]
    pub(super) chat_template_max_bytes: usize,
    /// Parse chat answers for tool calls with this parser (llama3 or mistral), as Triton's
    /// OpenAI frontend does; without it, requests with `tools` and `tool_choice` "auto" are
    /// refused (400).
    #[arg(long, env = "TRITIUM_TOOL_CALL_PARSER", value_parser = ["llama3", "mistral"], help_heading = TRITIUM_OWN)]
    pub(super) tool_call_parser: Option<String>,
    /// The most text (bytes) a streamed tool-call parse holds; past it the stream ends with
    /// finish_reason "length" and the generation is cancelled.
    #[arg(long, env = "TRITIUM_MAX_TOOL_CALL_PARSE_BYTES", default_value_t = tritium_openai::tools::DEFAULT_MAX_PARSE_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), help_heading = TRITIUM_OWN)]
    pub(super) max_tool_call_parse_bytes: usize,
    /// Serve each LoRA adapter listed in a model's `multi_lora.json` as `<model><SEP><adapter>`
    /// on the OpenAI frontend.
    #[arg(long, env = "TRITIUM_LORA_SEPARATOR", help_heading = TRITIUM_OWN)]
    pub(super) lora_separator: Option<String>,
    // Back-pressure for decoupled streams (issue 10)
    /// Most responses of one decoupled request that the model may have sent and its client not
    /// yet taken; the model's next `send` waits for the client (0: no limit, the server buffers
    /// whatever the model sends). The window starts at 8 and grows by one for each response the
    /// client takes, up to this.
    #[arg(long, env = "TRITIUM_MAX_INFLIGHT_RESPONSES", default_value_t = tritium_server::DEFAULT_MAX_INFLIGHT_RESPONSES, help_heading = TRITIUM_OWN)]
    pub(super) max_inflight_responses: u32,
    // Per-model Python environments (issue 14).
    /// Where packed environments (`EXECUTION_ENV_PATH`) are unpacked and `requirements.txt`
    /// environments are built, each once, keyed by a hash of what made it (default:
    /// `$XDG_CACHE_HOME/tritium/envs`, else `~/.cache/tritium/envs`).
    #[arg(long, env = "TRITIUM_ENV_CACHE_DIR", help_heading = TRITIUM_OWN)]
    pub(super) env_cache_dir: Option<PathBuf>,
    /// Install models' requirements only from this directory of wheels (pip's `--no-index
    /// --find-links DIR`), for servers without access to PyPI.
    #[arg(long, env = "TRITIUM_WHEELHOUSE", help_heading = TRITIUM_OWN)]
    pub(super) wheelhouse: Option<PathBuf>,
    /// Seconds building one model's Python environment may take (its installer is killed past
    /// it and the load fails); apart from `--stub-init-timeout-secs`.
    #[arg(long, env = "TRITIUM_ENV_BUILD_TIMEOUT_SECS", default_value_t = 900, help_heading = TRITIUM_OWN)]
    pub(super) env_build_timeout_secs: u64,
    // Tracing and config variants (issue 16, trace).
    /// Each model's config is `<model>/configs/<NAME>.pbtxt` when it has one, else its
    /// `config.pbtxt` (Triton's config variants).
    #[arg(long, env = "TRITIUM_MODEL_CONFIG_NAME", help_heading = "Model Repository")]
    pub(super) model_config_name: Option<String>,
}
