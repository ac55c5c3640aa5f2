//! The subcommands that talk to a running server over gRPC: `stubs`, `restart` and `stack` through
//! tritium's admin API (`tritium.admin.Admin`), `models`, `load`, `reload` and `unload` through
//! the standard repository RPCs; and the formatting of their answers (tables, JSON, human units).

use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};
use tritium_proto::admin::admin_client::AdminClient;
use tritium_proto::admin::stub_exit::Status as ExitStatus;
use tritium_proto::admin::{InstanceStacks, RestartRequest, StacksRequest, StubExit, StubInfo, StubsRequest};
use tritium_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tritium_proto::inference::repository_index_response::ModelIndex;
use tritium_proto::inference::{RepositoryIndexRequest, RepositoryModelLoadRequest, RepositoryModelUnloadRequest};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a read-only call may take (restarts, loads and unloads wait as long as the server).
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Which server to talk to, and the token for admin calls.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// The server's gRPC address: `host:port` or `http://host:port`.
    #[arg(long, env = "TRITIUM_URL", default_value = "127.0.0.1:8001")]
    url: String,
    /// The server's admin token (`tritium serve --admin-token`), sent as `authorization: Bearer
    /// <token>`; needed to restart stubs from another host.
    #[arg(long, env = "TRITIUM_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Metadata sent with every call, `<name>=<value>` (repeatable): the header of a restricted
    /// group, e.g. `triton-grpc-protocol-admin-key=secret` for a server started with
    /// `--grpc-restricted-protocol=admin:admin-key=secret`.
    #[arg(long = "header", value_name = "NAME=VALUE")]
    headers: Vec<String>,
    /// Talk TLS to a server started with --grpc-use-ssl: the PEM file of the CA that signed its
    /// certificate (implied `https://` URL).
    #[arg(long, env = "TRITIUM_CA_CERT")]
    ca_cert: Option<std::path::PathBuf>,
    /// With --ca-cert, for a server started with --grpc-use-ssl-mutual: this client's PEM
    /// certificate and key files, `<cert>,<key>`.
    #[arg(long, value_name = "CERT,KEY", requires = "ca_cert")]
    client_cert: Option<String>,
}

/// The subcommands that act on a running server.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// List the stub processes of the loaded models: pid, state, uptime, restarts, last exit,
    /// memory, requests in flight and executions.
    Stubs {
        /// Only this model's stubs.
        model: Option<String>,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Restart every instance of a model, or one instance, and wait until they are ready again.
    /// From another host this needs the server's admin token.
    Restart {
        /// `MODEL` restarts every instance of the model; `MODEL/INSTANCE` one of them
        /// (instance names as `tritium stubs` lists them, e.g. `add_sub/add_sub_0_0`).
        #[arg(value_name = "MODEL[/INSTANCE]")]
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Print the live Python stack of every thread in a model's stubs (the main thread in
    /// `execute`, the model's own threads, the asyncio tasks), also of a stub stuck in C code
    /// that holds the GIL. From another host this needs the server's admin token.
    Stack {
        /// The model's name.
        model: String,
        /// Only this instance: its name as `tritium stubs` lists it (`add_sub_0_0`), or its
        /// position among the model's instances (0, 1, ...).
        #[arg(long, value_name = "N")]
        instance: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List the models of the repository with their loaded version, state and reason.
    Models {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Load a model, or reload it if it is loaded (the server must run with
    /// `--model-control-mode explicit`).
    Load {
        /// The model's directory name in the repository.
        model: String,
        #[command(flatten)]
        target: Target,
    },
    /// Reload a model (or load it) and wait for the outcome: the new instances ready and serving
    /// (printed with each version's state), or the server's error and a non-zero exit status,
    /// the previous versions serving on (the server must run with `--model-control-mode
    /// explicit`).
    Reload {
        /// The model's directory name in the repository.
        model: String,
        #[command(flatten)]
        target: Target,
    },
    /// Unload a model (the server must run with `--model-control-mode explicit`).
    Unload {
        /// The model's name.
        model: String,
        #[command(flatten)]
        target: Target,
    },
}

/// Runs one subcommand to completion.
pub(crate) fn run(command: Command) -> Result<()> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let out = runtime.block_on(execute(command))?;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()) {
        // A reader that stops early (`| head`) is not an error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// Runs a subcommand and returns what it prints.
async fn execute(command: Command) -> Result<String> {
    match command {
        Command::Stubs { model, json, target } => {
            let conn = Conn::open(&target).await?;
            let mut admin = AdminClient::new(conn.channel.clone());
            let stubs = conn
                .stubs(&mut admin, model.as_deref().unwrap_or(""))
                .await
                .map_err(|s| conn.error("listing stubs", s))?;
            let now = unix_ms(SystemTime::now());
            Ok(if json { json_text(&stubs_json(&stubs)) } else { stubs_table(&stubs, model.as_deref(), now) })
        }
        Command::Restart { name, target } => {
            let (model, instance) = match name.split_once('/') {
                Some((m, i)) => (m.to_string(), i.to_string()),
                None => (name.clone(), String::new()),
            };
            let what = format!("restart of {name}");
            let conn = Conn::open(&target).await?;
            let mut admin = AdminClient::new(conn.channel.clone());
            let before = conn.stubs(&mut admin, &model).await.map_err(|s| conn.error(&what, s))?;
            let req = conn.request(RestartRequest { model: model.clone(), instance: instance.clone() });
            admin.restart(req).await.map_err(|s| conn.error(&what, s))?;
            // The restart happened; the new pids are a courtesy.
            let after = conn.stubs(&mut admin, &model).await.unwrap_or_default();
            Ok(restart_report(&model, &instance, &before, &after))
        }
        Command::Stack { model, instance, target } => {
            let conn = Conn::open(&target).await?;
            let mut admin = AdminClient::new(conn.channel.clone());
            let mut req = conn.request(StacksRequest { model: model.clone(), instance: instance.unwrap_or_default() });
            req.set_timeout(QUERY_TIMEOUT);
            let stacks = admin.stacks(req).await.map_err(|s| conn.error(&format!("stacks of {model}"), s))?;
            Ok(stacks_text(&stacks.into_inner().stacks))
        }
        Command::Models { json, target } => {
            let conn = Conn::open(&target).await?;
            let mut client = GrpcInferenceServiceClient::new(conn.channel.clone());
            let mut req = conn.request(RepositoryIndexRequest::default());
            req.set_timeout(QUERY_TIMEOUT);
            let index = client.repository_index(req).await.map_err(|s| conn.error("listing models", s))?;
            let models = index.into_inner().models;
            Ok(if json { json_text(&models_json(&models)) } else { models_table(&models) })
        }
        Command::Load { model, target } => {
            let conn = Conn::open(&target).await?;
            let mut client = GrpcInferenceServiceClient::new(conn.channel.clone());
            let req = conn.request(RepositoryModelLoadRequest { model_name: model.clone(), ..Default::default() });
            client.repository_model_load(req).await.map_err(|s| conn.error(&format!("load of {model}"), s))?;
            Ok(format!("loaded {model}\n"))
        }
        Command::Reload { model, target } => {
            let conn = Conn::open(&target).await?;
            let mut client = GrpcInferenceServiceClient::new(conn.channel.clone());
            let started = std::time::Instant::now();
            let req = conn.request(RepositoryModelLoadRequest { model_name: model.clone(), ..Default::default() });
            let loaded = client.repository_model_load(req).await;
            let took = started.elapsed();
            let mut req = conn.request(RepositoryIndexRequest::default());
            req.set_timeout(QUERY_TIMEOUT);
            let index = client.repository_index(req).await.map(|r| r.into_inner().models).unwrap_or_default();
            let versions: Vec<ModelIndex> = index.into_iter().filter(|m| m.name == model).collect();
            let error = loaded.err().map(|s| conn.error(&format!("reload of {model}"), s));
            crate::reload::report(&model, took, &versions, error)
        }
        Command::Unload { model, target } => {
            let conn = Conn::open(&target).await?;
            let mut client = GrpcInferenceServiceClient::new(conn.channel.clone());
            let req = conn.request(RepositoryModelUnloadRequest { model_name: model.clone(), ..Default::default() });
            client.repository_model_unload(req).await.map_err(|s| conn.error(&format!("unload of {model}"), s))?;
            Ok(format!("unloaded {model}\n"))
        }
    }
}

/// Growth of a stub's resident memory since it became ready: `+1.5 MiB`, `-12.0 KiB`, `0 B`.
fn growth_text(bytes: i64) -> String {
    let size = human_bytes(bytes.unsigned_abs());
    match bytes {
        0 => size,
        b if b > 0 => format!("+{size}"),
        _ => format!("-{size}"),
    }
}

/// `tritium stack`'s output: for each stub a heading (model, version, instance, pid), then its
/// stacks as the stub wrote them, or why there are none.
fn stacks_text(stacks: &[InstanceStacks]) -> String {
    let mut out = String::new();
    for s in stacks {
        let pid = if s.pid == 0 { "no process".to_string() } else { format!("pid {}", s.pid) };
        out.push_str(&format!("=== {} version {} instance {} ({pid}) ===\n", s.model, s.version, s.instance));
        if s.error.is_empty() {
            out.push_str(s.stacks.trim_end());
        } else {
            out.push_str(&format!("(no stacks: {})", s.error));
        }
        out.push_str("\n\n");
    }
    out
}

/// The client's TLS settings from `--ca-cert` and `--client-cert`, if TLS is asked for.
fn client_tls(target: &Target) -> Result<Option<tonic::transport::ClientTlsConfig>> {
    let Some(ca) = &target.ca_cert else { return Ok(None) };
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))
    };
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read("--ca-cert", ca)?));
    if let Some(pair) = &target.client_cert {
        let (cert, key) = pair.split_once(',').ok_or_else(|| anyhow!("--client-cert {pair:?}: expected CERT,KEY"))?;
        let (cert, key) = (read("--client-cert", cert.as_ref())?, read("--client-cert", key.as_ref())?);
        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    Ok(Some(tls))
}

/// A connection to the server, and the admin token to send with every call.
struct Conn {
    channel: Channel,
    url: String,
    authorization: Option<AsciiMetadataValue>,
    headers: Vec<(tonic::metadata::AsciiMetadataKey, AsciiMetadataValue)>,
}

impl Conn {
    /// Checks the flags and connects.
    async fn open(target: &Target) -> Result<Self> {
        let authorization = match target.admin_token.as_deref().filter(|t| !t.is_empty()) {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| anyhow!("--admin-token must be printable ASCII"))?,
            ),
            None => None,
        };
        let mut headers = Vec::new();
        for h in &target.headers {
            let (name, value) = h.split_once('=').ok_or_else(|| anyhow!("--header {h:?}: expected NAME=VALUE"))?;
            let name = name
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| anyhow!("--header {h:?}: {name:?} is not a valid metadata name"))?;
            let value = value.parse().map_err(|_| anyhow!("--header {h:?}: the value must be printable ASCII"))?;
            headers.push((name, value));
        }
        let scheme = if target.ca_cert.is_some() { "https" } else { "http" };
        let uri = if target.url.contains("://") { target.url.clone() } else { format!("{scheme}://{}", target.url) };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| anyhow!("invalid --url {:?}: {e} (expected host:port)", target.url))?
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(tls) = client_tls(target)? {
            endpoint = endpoint.tls_config(tls).map_err(|e| anyhow!("TLS settings: {}", root_cause(&e)))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| anyhow!("cannot reach the server at {}: {}", target.url, root_cause(&e)))?;
        Ok(Self { channel, url: target.url.clone(), authorization, headers })
    }

    /// A request with the admin token, if one is given. Every call sends it, so a server that
    /// guards more calls than `Restart` needs nothing new from the CLI.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut req = Request::new(message);
        if let Some(value) = &self.authorization {
            req.metadata_mut().insert("authorization", value.clone());
        }
        for (name, value) in &self.headers {
            req.metadata_mut().insert(name.clone(), value.clone());
        }
        req
    }

    async fn stubs(&self, admin: &mut AdminClient<Channel>, model: &str) -> Result<Vec<StubInfo>, Status> {
        let mut req = self.request(StubsRequest { model: model.to_string() });
        req.set_timeout(QUERY_TIMEOUT);
        Ok(admin.stubs(req).await?.into_inner().stubs)
    }

    /// An error for a failed call: the server's own message where it answered, what went wrong
    /// with the connection where it did not.
    fn error(&self, what: &str, status: Status) -> anyhow::Error {
        let message = status.message();
        match status.code() {
            Code::Unavailable | Code::Unknown | Code::Internal if std::error::Error::source(&status).is_some() => {
                anyhow!("cannot reach the server at {}: {}", self.url, root_cause(&status))
            }
            Code::Unimplemented if message.is_empty() => anyhow!(
                "{what} failed: the server at {} does not serve this API (is it Triton, or an older tritium?)",
                self.url
            ),
            Code::DeadlineExceeded if message.is_empty() || message.contains("Timeout expired") => {
                anyhow!("{what} failed: the server at {} did not answer within {}s", self.url, QUERY_TIMEOUT.as_secs())
            }
            Code::PermissionDenied => anyhow!("{what} refused: {message}"),
            _ => anyhow!("{what} failed: {message}"),
        }
    }
}

/// The innermost cause of an error, in words: `connection refused` rather than `transport error`.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    let mut current = Some(e);
    while let Some(err) = current {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                _ => io.to_string(),
            };
        }
        last = err;
        current = err.source();
    }
    last.to_string()
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn json_text(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    s.push('\n');
    s
}

/// `--json` of `tritium stubs`: one object per instance; `pid` is null while no process runs,
/// `last_exit` null until a stub has ended unexpectedly.
fn stubs_json(stubs: &[StubInfo]) -> Value {
    Value::Array(
        stubs
            .iter()
            .map(|s| {
                let last_exit = s.last_exit.as_ref().map(|e| json!({ "status": exit_status(e), "unix_ms": e.unix_ms }));
                json!({
                    "model": s.model,
                    "version": s.version,
                    "instance": s.instance,
                    "pid": (s.pid != 0).then_some(s.pid),
                    "state": s.state,
                    "uptime_secs": s.uptime_secs,
                    "restarts": s.restarts,
                    "last_exit": last_exit,
                    "rss_bytes": s.rss_bytes,
                    "shm_bytes": s.shm_bytes,
                    "inflight": s.inflight,
                    "executions": s.executions,
                    "impossible_transitions": s.impossible_transitions,
                    "pss_bytes": s.pss_bytes,
                    "uss_bytes": s.uss_bytes,
                    "rss_growth_bytes": s.rss_growth_bytes,
                    "requests_taken": s.requests_taken,
                    "recycled": { "rss": s.recycled_rss, "requests": s.recycled_requests },
                })
            })
            .collect(),
    )
}

/// The table of `tritium stubs`, then the reason of each instance that has one and the count of
/// impossible supervisor transitions of each that had any. `now_ms` is the current time, for
/// "how long ago".
fn stubs_table(stubs: &[StubInfo], model: Option<&str>, now_ms: u64) -> String {
    if stubs.is_empty() {
        return match model {
            Some(m) => format!("no stubs: model {m:?} is not loaded\n"),
            None => "no stubs: no model is loaded\n".to_string(),
        };
    }
    let header = [
        "MODEL",
        "VERSION",
        "INSTANCE",
        "PID",
        "STATE",
        "UPTIME",
        "RESTARTS",
        "LAST EXIT",
        "RSS",
        "PSS",
        "GROWTH",
        "SHM",
        "INFLIGHT",
        "EXECUTIONS",
    ];
    let running = |s: &StubInfo, text: String| if s.pid == 0 { "-".to_string() } else { text };
    let rows: Vec<Vec<String>> = stubs
        .iter()
        .map(|s| {
            vec![
                s.model.clone(),
                s.version.to_string(),
                s.instance.clone(),
                running(s, s.pid.to_string()),
                s.state.clone(),
                running(s, human_duration(Duration::from_secs_f64(s.uptime_secs.max(0.0)))),
                s.restarts.to_string(),
                last_exit_text(s.last_exit.as_ref(), now_ms),
                running(s, human_bytes(s.rss_bytes)),
                running(s, human_bytes(s.pss_bytes)),
                running(s, growth_text(s.rss_growth_bytes)),
                running(s, human_bytes(s.shm_bytes)),
                s.inflight.to_string(),
                s.executions.to_string(),
            ]
        })
        .collect();
    let mut out = table(&header, &rows);
    let mut notes = String::new();
    for s in stubs {
        if !s.reason.trim().is_empty() {
            notes.push_str(&format!("{}: {}\n", s.instance, first_line(&s.reason)));
        }
        if s.recycled_rss + s.recycled_requests != 0 {
            notes.push_str(&format!(
                "{}: recycled {} time(s) over stub_max_rss_bytes, {} over stub_max_requests\n",
                s.instance, s.recycled_rss, s.recycled_requests
            ));
        }
        if s.impossible_transitions != 0 {
            notes.push_str(&format!(
                "{}: {} impossible supervisor transition(s) refused (a tritium bug; the server log has each)\n",
                s.instance, s.impossible_transitions
            ));
        }
    }
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes);
    }
    out
}

/// What `tritium restart` prints: one line per restarted instance with its old and new pid.
fn restart_report(model: &str, instance: &str, before: &[StubInfo], after: &[StubInfo]) -> String {
    let targeted = |s: &&StubInfo| instance.is_empty() || s.instance == instance;
    let pid = |p: u32| if p == 0 { "none".to_string() } else { p.to_string() };
    let mut out = String::new();
    for old in before.iter().filter(targeted) {
        let new = after.iter().find(|n| n.instance == old.instance && n.version == old.version);
        match new {
            Some(new) => out.push_str(&format!(
                "restarted {model}/{}: pid {} -> {}, {}\n",
                old.instance,
                pid(old.pid),
                pid(new.pid),
                new.state
            )),
            None => out.push_str(&format!("restarted {model}/{}\n", old.instance)),
        }
    }
    if out.is_empty() {
        out = if instance.is_empty() {
            format!("restarted {model}\n")
        } else {
            format!("restarted {model}/{instance}\n")
        };
    }
    out
}

/// `path` without `.` and `..` components, as the kernel resolves it: a `..` after a directory
/// removes it, except after a symbolic link that exists on this machine, which is resolved
/// first (`canonicalize`), since `link/..` is the parent of the link's target. A relative path
/// keeps the `..`s it starts with. An empty path stays empty.
pub(crate) fn normalize_path(path: &std::path::Path) -> std::path::PathBuf {
    use std::path::{Component, PathBuf};
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if out.is_symlink() {
                    if let Ok(real) = out.canonicalize() {
                        out = real;
                    }
                }
                match out.components().next_back() {
                    Some(Component::Normal(_)) => {
                        out.pop();
                    }
                    // `/..` is `/`.
                    Some(Component::RootDir | Component::Prefix(_)) => {}
                    _ => out.push(".."),
                }
            }
            other => out.push(other),
        }
    }
    if out.as_os_str().is_empty() && !path.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// A path the server reports, normalised for display (`normalize_path`).
fn shown_path(path: &str) -> String {
    if path.is_empty() {
        return String::new();
    }
    normalize_path(std::path::Path::new(path)).display().to_string()
}

/// `--json` of `tritium models`.
fn models_json(models: &[ModelIndex]) -> Value {
    Value::Array(
        models
            .iter()
            .map(|m| {
                json!({
                    "name": m.name,
                    "version": m.version,
                    "state": m.state,
                    "reason": m.reason,
                    "python": shown_path(&m.tritium_python),
                    "environment": shown_path(&m.tritium_environment),
                })
            })
            .collect(),
    )
}

/// The table of `tritium models`; a model that was never loaded has no version, state or
/// interpreter, and one running on the server's `--python` has no environment of its own.
fn models_table(models: &[ModelIndex]) -> String {
    if models.is_empty() {
        return "no models in the repository\n".to_string();
    }
    let dash = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
    let rows: Vec<Vec<String>> = models
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                dash(&m.version),
                dash(&m.state),
                dash(&shown_path(&m.tritium_python)),
                dash(&shown_path(&m.tritium_environment)),
                first_line(&m.reason).to_string(),
            ]
        })
        .collect();
    table(&["NAME", "VERSION", "STATE", "PYTHON", "ENV", "REASON"], &rows)
}

/// Left-aligned columns two spaces apart, without trailing spaces.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (cell, w) in row.iter().zip(&widths) {
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', w.saturating_sub(cell.chars().count()) + 2));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("").trim_end()
}

/// Bytes in binary units: `512 B`, `1.5 KiB`, `23 MiB` (one decimal below 10).
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value < 9.95 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

/// A duration to the two largest units: `42s`, `3m07s`, `5h02m`, `2d04h`.
fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// How a stub ended, in words: `exit code 1`, `killed by signal 9 (SIGKILL)`, or the first line
/// of what happened instead when the process left no exit status.
fn exit_status(exit: &StubExit) -> String {
    match &exit.status {
        Some(ExitStatus::Code(code)) => format!("exit code {code}"),
        Some(ExitStatus::Signal(signal)) => format!("killed by signal {} ({})", signal.number, signal.name),
        Some(ExitStatus::Other(what)) => first_line(what).to_string(),
        None => "unknown".to_string(),
    }
}

/// The short form of [`exit_status`] for the table: `code 1`, `SIGKILL`, `signal 64`, or a
/// shortened first line.
fn short_exit(exit: &StubExit) -> String {
    match &exit.status {
        Some(ExitStatus::Code(code)) => format!("code {code}"),
        Some(ExitStatus::Signal(signal)) if signal.name.starts_with("SIG") => signal.name.clone(),
        Some(ExitStatus::Signal(signal)) => format!("signal {}", signal.number),
        Some(ExitStatus::Other(_)) | None => {
            const MAX: usize = 24;
            let status = exit_status(exit);
            if status.chars().count() > MAX {
                let short: String = status.chars().take(MAX - 1).collect();
                format!("{short}…")
            } else {
                status
            }
        }
    }
}

/// The LAST EXIT cell: `SIGKILL (3m07s ago)`, `code 1 (5s ago)`, or `-`.
fn last_exit_text(exit: Option<&StubExit>, now_ms: u64) -> String {
    let Some(exit) = exit else { return "-".to_string() };
    let ago = Duration::from_millis(now_ms.saturating_sub(exit.unix_ms));
    format!("{} ({} ago)", short_exit(exit), human_duration(ago))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stub(instance: &str, pid: u32) -> StubInfo {
        StubInfo {
            model: "add_sub".into(),
            version: 1,
            instance: instance.into(),
            pid,
            state: "ready".into(),
            uptime_secs: 75.4,
            restarts: 0,
            rss_bytes: 31_457_280,
            pss_bytes: 20 << 20,
            rss_growth_bytes: 3 << 19,
            shm_bytes: 1 << 20,
            executions: 12,
            ..Default::default()
        }
    }

    #[test]
    fn sizes_in_binary_units() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (10 * 1024, "10 KiB"),
            (31_457_280, "30 MiB"),
            (5 * 1024 * 1024 * 1024 / 2, "2.5 GiB"),
            (u64::MAX, "16384 PiB"),
        ];
        for (n, want) in cases {
            assert_eq!(human_bytes(n), want, "{n}");
        }
    }

    #[test]
    fn durations_to_two_units() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (60, "1m00s"),
            (187, "3m07s"),
            (3600, "1h00m"),
            (18_120, "5h02m"),
            (187_200, "2d04h"),
        ];
        for (s, want) in cases {
            assert_eq!(human_duration(Duration::from_secs(s)), want, "{s}");
        }
        assert_eq!(human_duration(Duration::from_millis(999)), "0s");
    }

    fn exit(status: ExitStatus, unix_ms: u64) -> StubExit {
        StubExit { status: Some(status), unix_ms }
    }

    fn signal(number: i32, name: &str) -> ExitStatus {
        ExitStatus::Signal(tritium_proto::admin::Signal { number, name: name.into() })
    }

    #[test]
    fn exits_in_words() {
        let killed = exit(signal(9, "SIGKILL"), 1_000);
        assert_eq!(exit_status(&killed), "killed by signal 9 (SIGKILL)");
        assert_eq!(short_exit(&killed), "SIGKILL");
        let exited = exit(ExitStatus::Code(1), 2_000);
        assert_eq!(exit_status(&exited), "exit code 1");
        assert_eq!(short_exit(&exited), "code 1");
        let odd = exit(signal(64, "unknown"), 0);
        assert_eq!(exit_status(&odd), "killed by signal 64 (unknown)");
        assert_eq!(short_exit(&odd), "signal 64");
        let unstarted = exit(ExitStatus::Other("cannot start the Python stub with \"py\": not found\nmore".into()), 0);
        assert_eq!(exit_status(&unstarted), "cannot start the Python stub with \"py\": not found");
        assert_eq!(short_exit(&unstarted), "cannot start the Python…");
        assert_eq!(exit_status(&StubExit::default()), "unknown");
        assert_eq!(last_exit_text(None, 1_000), "-");
        assert_eq!(last_exit_text(Some(&killed), 188_000), "SIGKILL (3m07s ago)");
        // A server clock ahead of ours is "0s ago", not a wrap-around.
        assert_eq!(last_exit_text(Some(&exited), 1_000), "code 1 (0s ago)");
    }

    #[test]
    fn exits_render_from_the_wire() {
        use prost::Message;

        let sent = StubInfo { last_exit: Some(exit(signal(9, "SIGKILL"), 10_000)), ..stub("add_sub_0_0", 0) };
        let got = StubInfo::decode(sent.encode_to_vec().as_slice()).expect("decode");
        assert_eq!(last_exit_text(got.last_exit.as_ref(), 10_400), "SIGKILL (0s ago)");
        assert_eq!(
            stubs_json(&[got])[0]["last_exit"],
            json!({ "status": "killed by signal 9 (SIGKILL)", "unix_ms": 10_000 })
        );
    }

    #[test]
    fn stubs_table_and_reasons() {
        let mut crashed = stub("add_sub_0_1", 0);
        crashed.state = "backing_off".into();
        crashed.restarts = 2;
        crashed.last_exit = Some(exit(ExitStatus::Code(3), 10_000));
        crashed.reason = "stub add_sub_0_1 (pid 9) exited unexpectedly (exit code 3); last stderr lines:\nx".into();
        let out = stubs_table(&[stub("add_sub_0_0", 4242), crashed], None, 15_000);
        let want = "\
MODEL    VERSION  INSTANCE     PID   STATE        UPTIME  RESTARTS  LAST EXIT        RSS     PSS     GROWTH    SHM      INFLIGHT  EXECUTIONS
add_sub  1        add_sub_0_0  4242  ready        1m15s   0         -                30 MiB  20 MiB  +1.5 MiB  1.0 MiB  0         12
add_sub  1        add_sub_0_1  -     backing_off  -       2         code 3 (5s ago)  -       -       -         -        0         12

add_sub_0_1: stub add_sub_0_1 (pid 9) exited unexpectedly (exit code 3); last stderr lines:
";
        assert_eq!(out, want);
        assert_eq!(stubs_table(&[], Some("m"), 0), "no stubs: model \"m\" is not loaded\n");
    }

    #[test]
    fn impossible_transitions_are_a_line_under_the_table_when_not_zero() {
        let mut buggy = stub("add_sub_0_1", 4243);
        buggy.impossible_transitions = 2;
        let out = stubs_table(&[stub("add_sub_0_0", 4242), buggy.clone()], None, 0);
        let want = "\
MODEL    VERSION  INSTANCE     PID   STATE  UPTIME  RESTARTS  LAST EXIT  RSS     PSS     GROWTH    SHM      INFLIGHT  EXECUTIONS
add_sub  1        add_sub_0_0  4242  ready  1m15s   0         -          30 MiB  20 MiB  +1.5 MiB  1.0 MiB  0         12
add_sub  1        add_sub_0_1  4243  ready  1m15s   0         -          30 MiB  20 MiB  +1.5 MiB  1.0 MiB  0         12

add_sub_0_1: 2 impossible supervisor transition(s) refused (a tritium bug; the server log has each)
";
        assert_eq!(out, want);
        // After the instance's reason, when it has one.
        buggy.reason = "crashed".into();
        assert!(stubs_table(&[buggy.clone()], None, 0).ends_with(
            "\n\nadd_sub_0_1: crashed\nadd_sub_0_1: 2 impossible supervisor transition(s) refused (a tritium bug; \
             the server log has each)\n"
        ));
        assert_eq!(stubs_json(&[buggy])[0]["impossible_transitions"], 2);
    }

    #[test]
    fn stubs_json_keys_and_nulls() {
        let mut crashed = stub("add_sub_0_1", 0);
        crashed.last_exit = Some(exit(signal(9, "SIGKILL"), 1_700_000_000_000));
        let v = stubs_json(&[stub("add_sub_0_0", 4242), crashed]);
        let first = &v[0];
        let mut keys: Vec<&str> = first.as_object().expect("object").keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "executions",
                "impossible_transitions",
                "inflight",
                "instance",
                "last_exit",
                "model",
                "pid",
                "pss_bytes",
                "recycled",
                "requests_taken",
                "restarts",
                "rss_bytes",
                "rss_growth_bytes",
                "shm_bytes",
                "state",
                "uptime_secs",
                "uss_bytes",
                "version"
            ]
        );
        assert_eq!(first["pid"], 4242);
        assert_eq!(first["last_exit"], Value::Null);
        assert_eq!(first["impossible_transitions"], 0);
        assert_eq!(v[1]["pid"], Value::Null);
        assert_eq!(
            v[1]["last_exit"],
            json!({ "status": "killed by signal 9 (SIGKILL)", "unix_ms": 1_700_000_000_000u64 })
        );
    }

    #[test]
    fn recycled_stubs_and_stacks_are_reported() {
        let mut recycled = stub("add_sub_0_0", 4242);
        (recycled.recycled_rss, recycled.recycled_requests) = (2, 1);
        assert!(stubs_table(&[recycled.clone()], None, 0)
            .ends_with("\n\nadd_sub_0_0: recycled 2 time(s) over stub_max_rss_bytes, 1 over stub_max_requests\n"));
        assert_eq!(stubs_json(&[recycled])[0]["recycled"], json!({ "rss": 2, "requests": 1 }));
        assert_eq!((growth_text(0), growth_text(-2048)), ("0 B".to_string(), "-2.0 KiB".to_string()));
        let one = |instance: &str, pid, stacks: &str, error: &str| InstanceStacks {
            model: "m".into(),
            version: 1,
            instance: instance.into(),
            pid,
            stacks: stacks.into(),
            error: error.into(),
        };
        assert_eq!(
            stacks_text(&[one("m_0_0", 7, "Thread 0x1:\n  File \"x\"\n", ""), one("m_0_1", 0, "", "no stub process")]),
            "=== m version 1 instance m_0_0 (pid 7) ===\nThread 0x1:\n  File \"x\"\n\n\
             === m version 1 instance m_0_1 (no process) ===\n(no stacks: no stub process)\n\n"
        );
    }

    #[test]
    fn restart_report_pairs_old_and_new_pids() {
        let before = [stub("add_sub_0_0", 10), stub("add_sub_0_1", 11)];
        let after = [stub("add_sub_0_0", 20), stub("add_sub_0_1", 21)];
        assert_eq!(
            restart_report("add_sub", "", &before, &after),
            "restarted add_sub/add_sub_0_0: pid 10 -> 20, ready\nrestarted add_sub/add_sub_0_1: pid 11 -> 21, ready\n"
        );
        assert_eq!(
            restart_report("add_sub", "add_sub_0_1", &before, &after),
            "restarted add_sub/add_sub_0_1: pid 11 -> 21, ready\n"
        );
        assert_eq!(
            restart_report("add_sub", "", &before, &[]),
            "restarted add_sub/add_sub_0_0\nrestarted add_sub/add_sub_0_1\n"
        );
    }

    #[test]
    fn models_table_with_dashes_for_unloaded() {
        let models = [
            ModelIndex {
                name: "add_sub".into(),
                version: "1".into(),
                state: "READY".into(),
                tritium_python: "/v/python/../.venv/./bin/python".into(),
                ..Default::default()
            },
            ModelIndex {
                name: "broken".into(),
                version: "1".into(),
                state: "UNAVAILABLE".into(),
                reason: "bad\nstack".into(),
                tritium_python: "/e/bin/python".into(),
                tritium_environment: "/e".into(),
            },
            ModelIndex { name: "later".into(), ..Default::default() },
        ];
        assert_eq!(
            models_table(&models),
            "NAME     VERSION  STATE        PYTHON               ENV  REASON\n\
             add_sub  1        READY        /v/.venv/bin/python  -\n\
             broken   1        UNAVAILABLE  /e/bin/python        /e   bad\n\
             later    -        -            -                    -\n"
        );
    }

    #[test]
    fn paths_are_normalized_lexically_and_through_symlinks() -> std::io::Result<()> {
        use std::path::Path;
        let cases = [
            ("/clone/python/../.venv/bin/python", "/clone/.venv/bin/python"),
            ("/a/./b/../../c", "/c"),
            ("/..", "/"),
            ("../x/../y", "../y"),
            ("a/..", "."),
            ("/usr/bin/python3", "/usr/bin/python3"),
        ];
        for (given, want) in cases {
            assert_eq!(normalize_path(Path::new(given)), Path::new(want), "{given}");
        }
        // `link/..` is the parent of the link's target, not the directory holding the link.
        let dir = std::env::temp_dir().join(format!("tritium-normalize-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("real/deep"))?;
        std::os::unix::fs::symlink(dir.join("real/deep"), dir.join("link"))?;
        let got = normalize_path(&dir.join("link/../x"));
        let want = dir.canonicalize()?.join("real/x");
        std::fs::remove_dir_all(&dir)?;
        assert_eq!(got, want);
        Ok(())
    }

    #[test]
    fn connection_errors_name_the_root_cause() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let wrapped = anyhow::Error::new(io).context("transport error");
        assert_eq!(root_cause(wrapped.as_ref()), "connection refused");
    }
}
