//! The running server: the frontends bound and started (HTTP, gRPC, OpenAI, `/metrics`), the
//! initial model load and later re-scans (`--model-control-mode poll`, SIGHUP), systemd's
//! notifications (`sdnotify.rs`), and graceful shutdown on SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::watch;
use tracing::{info, warn};
use tritium_server::{Server, ServerOptions};

use super::flags::{ControlMode, ServeArgs};

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

/// Serves until SIGINT or SIGTERM (or, with `--exit-on-error`, a model that fails its first
/// load), then drains in-flight requests for up to `--exit-timeout-secs`.
pub(super) async fn serve(
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
