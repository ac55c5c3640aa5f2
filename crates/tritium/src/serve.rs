//! `tritium serve`: flags (Triton's names where Triton has them, also read from `TRITIUM_*`),
//! logging, the frontends, the initial model load, graceful shutdown on SIGINT/SIGTERM, and
//! systemd's notifications with SIGHUP as a repository re-scan (`sdnotify.rs`).
//!
//! - [`flags`]: [`ServeArgs`], the flag table.
//! - [`spin`]: the spin budgets of `--stub-spin-us` and `--runtime-spin-us`.
//! - [`lifecycle`]: the running server, from the frontends' start to shutdown.
//!
//! This file turns the flags into [`ServerOptions`] and starts the async runtime.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tracing::info;
use tritium_host::StubCommand;
use tritium_server::{InstanceSettings, ServerOptions};

mod flags;
mod lifecycle;
mod spin;

use flags::ControlMode;
pub(crate) use flags::ServeArgs;
use spin::spin_budgets;

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
pub(crate) fn run(args: ServeArgs) -> Result<()> {
    let allocator = crate::alloc::tune();
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
    info!("{allocator}");
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
    runtime.block_on(lifecycle::serve(args, opts, logging, front_door, grpc_tls))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_threads_default_to_half_the_cpus_and_at_least_one() {
        assert_eq!(async_threads(Some(3)), 3);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(async_threads(None), (cpus / 2).max(1));
    }
}
