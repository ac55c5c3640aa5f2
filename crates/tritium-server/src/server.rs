//! The `Server` facade the frontends call: model lifecycle (load, reload, unload), request
//! routing to a version's queue, metadata, readiness and statistics.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tracing::{error, info, warn};
use tritium_config::proto::model_config::SchedulingChoice;
use tritium_config::proto::model_instance_group::Kind;
use tritium_config::{Framework, ModelConfig};
use tritium_host::{HostError, Stub, StubCommand};
use tritium_ipc::StubError;

use crate::cache::{ModelCache, ResponseCache};
use crate::classify::{Classes, LabelError};
use crate::composition::{Boxed, Ensemble, RoutedCalls, Router};
use crate::instance::{self, InstanceSpec, ModelCalls, StateView, Supervision, VersionContext};
use crate::pending::{Pending, Refused, Reply};
use crate::scheduler::{Batching, Priorities, Queue};
use crate::stats::Stats;
use crate::types::*;
use crate::validate::{check_metadata, transaction_mismatch, validate, wire_type};

mod ensemble;
mod trace;

pub use trace::TraceSettingsView;

/// How the server runs models.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The model repository.
    pub repository: PathBuf,
    /// How to start stubs.
    pub stub: StubCommand,
    /// Supervision limits (per model overridable in `parameters`).
    pub supervision: Supervision,
    /// Run the model's `auto_complete_config` (Triton's default; off with
    /// `--disable-auto-complete-config`).
    pub auto_complete: bool,
    /// Server readiness requires every model to be ready.
    pub strict_readiness: bool,
    /// Whether clients may load and unload models (Triton's explicit model-control mode).
    pub explicit_control: bool,
    /// Requests a model version (each of its priority levels) holds at most, for models without
    /// a `max_queue_size` of their own (`--max-queue-size`); 0: unbounded, as in Triton.
    pub max_queue_size: usize,
    /// The server metadata's `name` (Triton's `--id`).
    pub server_id: String,
    /// Models loaded at once (`--model-load-thread-count`, at least 1).
    pub load_threads: usize,
    /// Times a failed load is tried again (`--model-load-retry-count`).
    pub load_retries: u32,
    /// Where Python-based backends live: `backend: "<name>"` other than "python" runs
    /// `<backend_directory>/<name>/model.py` (`--backend-directory`).
    pub backend_directory: PathBuf,
    /// Per-model Python environments: their cache and how they are built (`envs.rs`).
    pub envs: crate::envs::EnvOptions,
    /// `--model-config-name`: each model's config is `configs/<name>.pbtxt` when it has one,
    /// else `config.pbtxt` (Triton's config variants).
    pub config_name: Option<String>,
    /// `--metrics-config`: which latency metrics are recorded and exported.
    pub metrics: tritium_metrics::MetricsOptions,
    /// The CUDA devices `KIND_GPU` (and, where there are any, `KIND_AUTO`) instance groups are
    /// placed on; empty on a machine without a usable CUDA driver.
    pub gpus: Vec<i32>,
    /// Directories outside model directories that paths in a config may name
    /// (`--allow-config-path`); every other path stays inside its model's directory.
    pub paths: crate::confine::PathPolicy,
    /// What a config may make the server allocate (`--max-warmup-bytes`,
    /// `--max-model-instances`, `--max-sequence-slots`).
    pub limits: crate::config_limits::ConfigLimits,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Loading,
    Ready,
    Unavailable(String),
    Unloading,
}

struct Version {
    config: Arc<ModelConfig>,
    ctx: Arc<VersionContext>,
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// How long loading this version took: reading its config, then starting and initializing
    /// its instances (`nv_model_load_duration_secs`).
    load_duration: Duration,
    /// An ensemble's steps (an ensemble has no instances and is ready once loaded).
    ensemble: Option<Arc<Ensemble>>,
    /// The response cache, when the model enables it and the server has one.
    cache: Option<ModelCache>,
}

impl Version {
    /// Whether at least one instance serves.
    fn any_ready(&self) -> bool {
        if self.ensemble.is_some() {
            return true;
        }
        self.ctx.instances.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|i| i.state() == InstanceState::Ready)
    }

    /// Why no instance serves, when none does and none will come back by itself.
    fn failure(&self) -> Option<String> {
        if self.ensemble.is_some() {
            return None;
        }
        let instances = self.ctx.instances.lock().unwrap_or_else(|p| p.into_inner());
        instances.iter().all(|i| i.state() == InstanceState::Failed).then(|| {
            instances.iter().map(|i| format!("{}: {}", i.spec.name, i.reason())).collect::<Vec<_>>().join("; ")
        })
    }

    /// The interpreter the version's stubs run on, and its own environment's directory (empty
    /// when it runs on the server's `--python`); both empty for an ensemble.
    fn interpreter(&self) -> (String, String) {
        if self.ensemble.is_some() {
            return (String::new(), String::new());
        }
        let stub = &self.ctx.stub;
        let environment =
            stub.env.iter().rev().find(|(k, _)| k == "VIRTUAL_ENV").map(|(_, v)| v.to_string_lossy().into_owned());
        (stub.python.display().to_string(), environment.unwrap_or_default())
    }

    /// Stops taking requests, lets the instances finish what is queued, and joins them.
    fn retire(&self) {
        self.ctx.queue.close_gracefully();
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in workers {
            let _ = w.join();
        }
    }
}

struct Entry {
    /// The model directory's contents when it was last loaded (for polling).
    fingerprint: u64,
    state: State,
    /// Whether the operator wants this model loaded (false after an unload).
    wanted: bool,
    versions: BTreeMap<i64, Arc<Version>>,
    /// While no version is loaded: the versions last unloaded, or the one whose load failed;
    /// the repository index lists them with the model's state, as Triton does.
    gone: Vec<i64>,
}

/// The server's state, shared by every [`Server`] handle. It is the [`Router`] BLS and
/// ensembles call through.
pub(crate) struct Inner {
    /// What instances' BLS requests and model-control calls go through (back to this server,
    /// weakly).
    calls: Arc<dyn ModelCalls>,
    /// The runtime the server was made on (none outside one, as in unit tests): where BLS tasks
    /// and run-to-completion lanes run.
    runtime: Option<tokio::runtime::Handle>,
    opts: ServerOptions,
    metrics: tritium_metrics::Metrics,
    logging: std::sync::OnceLock<Arc<dyn LogControl>>,
    /// The response cache (`--cache-config local,size=N`), set before models load.
    cache: std::sync::OnceLock<Arc<ResponseCache>>,
    /// Request tracing (`--trace-config`), set before requests arrive.
    tracer: std::sync::OnceLock<tritium_trace::Tracer>,
    models: RwLock<BTreeMap<String, Entry>>,
    live: AtomicBool,
    /// The system shared memory extension's registered regions.
    shm: crate::shm::ShmRegistry,
    /// What each loading model is doing now (building its Python environment), the reason the
    /// repository index gives while it loads.
    load_progress: Arc<Mutex<HashMap<String, String>>>,
}

/// The wait for the answer of a queued request ([`Server::infer_queued`]).
pub type InferFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<InferResponse, InferError>> + Send>>;

/// The running server: every model, its instances and queues.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

/// Refuses model names that could escape the repository.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\\')
        || name.contains('\0')
    {
        return Err(format!("invalid model name {name:?}: a model name is one directory name inside the repository"));
    }
    Ok(())
}

fn kind_name(kind: i32) -> &'static str {
    match Kind::try_from(kind) {
        Ok(Kind::Gpu) => "GPU",
        Ok(Kind::Model) => "MODEL",
        _ => "CPU",
    }
}

impl Server {
    /// A server with no models loaded yet.
    pub fn new(mut opts: ServerOptions) -> Self {
        let metrics = tritium_metrics::Metrics::with_options(opts.metrics.clone());
        let load_progress: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let progress = load_progress.clone();
        opts.envs.progress = crate::envs::Progress::new(move |model, line| {
            progress.lock().unwrap_or_else(|p| p.into_inner()).insert(model.to_string(), line.to_string());
        });
        let runtime = tokio::runtime::Handle::try_current().ok();
        Self {
            inner: Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| Inner {
                calls: Arc::new(RoutedCalls::new(weak.clone(), runtime.clone())),
                runtime,
                opts,
                metrics,
                logging: std::sync::OnceLock::new(),
                cache: std::sync::OnceLock::new(),
                tracer: std::sync::OnceLock::new(),
                models: RwLock::new(BTreeMap::new()),
                live: AtomicBool::new(true),
                shm: crate::shm::ShmRegistry::default(),
                load_progress,
            }),
        }
    }

    fn models(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.inner.models()
    }

    fn models_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.inner.models.write().unwrap_or_else(|p| p.into_inner())
    }

    fn route(&self, model: &str, version: Option<i64>) -> Result<Arc<Version>, InferError> {
        self.inner.route(model, version)
    }

    /// The model directories in the repository, sorted.
    pub fn repository_models(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.inner.opts.repository)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Loads the given models, at most `load_threads` at once, each tried `1 + load_retries`
    /// times; failures are logged and reported by the index.
    pub async fn load_models(&self, names: Vec<String>) {
        let slots = Arc::new(tokio::sync::Semaphore::new(self.inner.opts.load_threads.max(1)));
        let (names, ensembles) = ensemble::split(self, names);
        let loads: Vec<_> = names
            .into_iter()
            .map(|name| {
                let server = self.clone();
                let slots = slots.clone();
                tokio::spawn(async move {
                    let Ok(_slot) = slots.acquire().await else { return };
                    let mut tries = 0;
                    while let Err(e) = server.load(&name).await {
                        if tries >= server.inner.opts.load_retries {
                            error!(model = %name, "{e}");
                            break;
                        }
                        tries += 1;
                        warn!(model = %name, "{e}; retrying ({tries} of {})", server.inner.opts.load_retries);
                    }
                })
            })
            .collect();
        for load in loads {
            let _ = load.await;
        }
        ensemble::load_ensembles(self, ensembles).await;
    }

    /// Whether a model version is decoupled (its requests are answered by
    /// [`Server::infer_decoupled`] only); the frontends refuse unary inference of one with
    /// their own texts.
    pub fn is_decoupled(&self, model: &str, version: Option<i64>) -> Result<bool, InferError> {
        Ok(self.route(model, version)?.ctx.decoupled)
    }

    /// The system shared memory regions clients registered.
    pub fn shm(&self) -> &crate::shm::ShmRegistry {
        &self.inner.shm
    }

    /// Runs one inference on a model that is not decoupled.
    pub async fn infer(&self, req: InferRequest) -> Result<InferResponse, InferError> {
        self.infer_queued(req)?.await
    }

    /// Routes, validates and queues one inference on a model that is not decoupled, and
    /// returns the wait for its answer: an error here happened before the request was queued.
    /// Dropping the wait cancels the request (it is never executed if still queued).
    pub fn infer_queued(&self, req: InferRequest) -> Result<InferFuture, InferError> {
        let targets: Vec<(String, crate::shm::ShmTarget)> =
            req.outputs.iter().filter_map(|o| Some((o.name.clone(), o.shm.clone()?))).collect();
        let answer = self.infer_queued_inner(req)?;
        if targets.is_empty() {
            return Ok(answer);
        }
        // Outputs asked for in shared memory: a stub wrote them there already (they come back
        // without bytes); any other answer (an ensemble's, a cached one) is copied there now.
        Ok(Box::pin(async move {
            let mut response = answer.await?;
            place_outputs(&targets, &mut response)?;
            Ok(response)
        }))
    }

    fn infer_queued_inner(&self, req: InferRequest) -> Result<InferFuture, InferError> {
        if let Some(ensemble) = self.ensemble_of(&req) {
            // An ensemble has no queue of its own: its checks and steps run in the answer's wait.
            return Ok(ensemble.infer(self.inner.clone(), req));
        }
        let (tx, mut rx) = oneshot::channel();
        let (version, deadline) = self.enqueue(req, Reply::Unary(tx), false)?;
        Ok(Box::pin(async move {
            if let Some(deadline) = deadline {
                // At its deadline the request times out if it is still queued, even while every
                // instance is busy (Triton's batcher checks timeouts while it waits for a slot).
                match tokio::time::timeout_at(deadline.into(), &mut rx).await {
                    Ok(answer) => return answer.unwrap_or_else(|_| Err(dropped())),
                    Err(_) => version.ctx.queue.expire(),
                }
            }
            rx.await.unwrap_or_else(|_| Err(dropped()))
        }))
    }

    /// Starts one inference on a decoupled model: the request is routed, validated and queued
    /// before this returns, and its responses come on the stream as the model sends them, the
    /// last one final ([`Streamed::is_last`]). A stream whose sender is dropped without a final
    /// message means the server lost the request (it never happens by design).
    pub fn infer_decoupled(&self, req: InferRequest) -> Result<ResponseStream, InferError> {
        if let Some(ensemble) = self.ensemble_of(&req) {
            return ensemble.infer_decoupled(self.inner.clone(), req);
        }
        let (tx, rx) = crate::types::response_stream();
        let (version, deadline) = self.enqueue(req, Reply::Stream(tx), true)?;
        if let Some(deadline) = deadline {
            // The queue timeout applies even while every instance is busy.
            tokio::spawn(async move {
                tokio::time::sleep_until(deadline.into()).await;
                version.ctx.queue.expire();
            });
        }
        Ok(rx)
    }

    /// Routes, validates and queues a request whose answer goes to `tx`; `decoupled` says
    /// which kind of model the caller expects. Returns the version and the request's queue
    /// deadline.
    fn enqueue(
        &self,
        mut req: InferRequest,
        tx: Reply,
        decoupled: bool,
    ) -> Result<(Arc<Version>, Option<Instant>), InferError> {
        let start = Instant::now();
        let version = self.route(&req.model, req.version)?;
        if version.ctx.decoupled != decoupled {
            return Err(transaction_mismatch(&req.model, decoupled));
        }
        let limit = version.ctx.supervision.max_request_metadata_bytes;
        // The server reads a client region's bytes itself (BYTES validation, cache keys) only
        // from a copy taken with `pread`, so a client shrinking its file fails this request alone.
        let copied = copy_read_inputs(&mut req, version.cache.is_some());
        let checked = match copied
            .and_then(|()| check_metadata(&req, &req.model, limit))
            .and_then(|()| validate(&req, &version.config))
        {
            Ok(v) => v,
            Err(e) => {
                version.ctx.stats.failure(start.elapsed(), e.kind, false);
                return Err(e);
            }
        };
        // As Triton's `Normalize`: once valid, inputs take the shape the model expects.
        for input in &mut req.inputs {
            version.ctx.reshapes.input(&input.name, &mut input.shape);
        }
        // The response cache (only versions whose model enables it): a hit is answered here and
        // never queued; a miss is queued with an answer that fills the cache on its way back.
        let tx = match (&version.cache, tx) {
            // A response whose outputs went to shared memory holds no bytes to cache.
            (Some(cache), Reply::Unary(tx)) if req.outputs.iter().all(|o| o.shm.is_none()) => {
                match cache.lookup(&req, version.ctx.version, &version.ctx.stats, start, tx) {
                    crate::cache::Lookup::Hit => return Ok((version, None)),
                    crate::cache::Lookup::Miss(tx) => Reply::Unary(tx),
                }
            }
            (_, tx) => tx,
        };
        let trace = self.start_trace(&req, &version.ctx, start);
        let pending =
            Pending { req, batch_size: checked.batch_size, outputs: checked.outputs, enqueued: start, tx, trace };
        match version.ctx.queue.push(pending) {
            Ok(deadline) => Ok((version, deadline)),
            Err(Refused::Closed) => Err(InferError::unavailable(format!(
                "model '{}' is unloading; retry once it is loaded again",
                version.ctx.model
            ))),
            Err(Refused::Full(e) | Refused::Invalid(e)) => {
                // Triton counts a full queue as a failed request, reason REJECTED.
                version.ctx.stats.failure(start.elapsed(), e.kind, false);
                Err(e)
            }
        }
    }

    /// Gives the server a response cache of `bytes` (`--cache-config local,size=N`); models
    /// loaded afterwards with `response_cache { enable: true }` use it. Only the first call
    /// counts.
    pub fn set_response_cache(&self, bytes: u64) {
        let _ = self.inner.cache.set(Arc::new(ResponseCache::new(bytes)));
    }

    /// What the response cache holds now, when the server has one.
    pub fn cache_usage(&self) -> Option<crate::cache::CacheUsage> {
        self.inner.cache.get().map(|c| c.usage())
    }

    /// Hands the server the process's log control, for the logging extension.
    pub fn set_log_control(&self, control: Arc<dyn LogControl>) {
        let _ = self.inner.logging.set(control);
    }

    fn log_control(&self) -> Result<&Arc<dyn LogControl>, InferError> {
        self.inner.logging.get().ok_or_else(|| InferError::unavailable("the server does not support dynamic logging"))
    }

    /// The current log settings.
    pub fn log_settings(&self) -> Result<LogSettings, InferError> {
        Ok(self.log_control()?.get())
    }

    /// Changes log settings at run time.
    pub fn update_log_settings(&self, update: LogSettingsUpdate) -> Result<LogSettings, InferError> {
        self.log_control()?.update(update)
    }

    /// Always true while the process serves.
    pub fn live(&self) -> bool {
        self.inner.live.load(Ordering::Acquire)
    }

    /// Readiness: live, and (with strict readiness) every wanted model ready.
    pub fn ready(&self) -> bool {
        if !self.live() {
            return false;
        }
        if !self.inner.opts.strict_readiness {
            return true;
        }
        self.models()
            .values()
            .filter(|e| e.wanted)
            .all(|e| e.state == State::Ready && e.versions.values().any(|v| v.any_ready()))
    }

    /// Server name, version and extensions.
    pub fn metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: self.inner.opts.server_id.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: [
                "classification",
                "sequence",
                "model_repository",
                "model_repository(unload_dependents)",
                "model_configuration",
                "binary_tensor_data",
                "system_shared_memory",
                "cuda_shared_memory",
                "parameters",
                "statistics",
                "schedule_policy",
                "logging",
                "trace",
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    /// A model's metadata: `versions` lists the loaded versions, or only the one asked for, as
    /// Triton's does.
    pub fn model_metadata(&self, name: &str, version: Option<i64>) -> Result<ModelMetadata, InferError> {
        let v = self.route(name, version)?;
        let versions = match version {
            Some(asked) => vec![asked.to_string()],
            None => {
                self.models().get(name).map(|e| e.versions.keys().map(i64::to_string).collect()).unwrap_or_default()
            }
        };
        let c = &v.config;
        let batch = c.max_batch_size > 0;
        let meta = |n: &str, t: i32, dims: &[i64]| TensorMetadata {
            name: n.to_string(),
            datatype: wire_type(t).map_or("INVALID", DataType::wire_name).to_string(),
            shape: if batch { std::iter::once(-1).chain(dims.iter().copied()).collect() } else { dims.to_vec() },
        };
        Ok(ModelMetadata {
            name: name.to_string(),
            versions,
            platform: if c.platform.is_empty() { c.backend.clone() } else { c.platform.clone() },
            inputs: c.input.iter().map(|i| meta(&i.name, i.data_type, &i.dims)).collect(),
            outputs: c.output.iter().map(|o| meta(&o.name, o.data_type, &o.dims)).collect(),
        })
    }

    /// A model's config as Triton's JSON (every field, defaults filled).
    pub fn model_config_json(&self, name: &str, version: Option<i64>) -> Result<String, InferError> {
        Ok(self.route(name, version)?.ctx.config_json.clone())
    }

    /// A model's `max_batch_size` (0 for a model that does not batch).
    pub fn model_max_batch_size(&self, name: &str, version: Option<i64>) -> Result<i64, InferError> {
        Ok(i64::from(self.route(name, version)?.config.max_batch_size))
    }

    /// A model's config.
    pub fn model_config(&self, name: &str, version: Option<i64>) -> Result<ModelConfig, InferError> {
        Ok((*self.route(name, version)?.config).clone())
    }

    /// Whether a model (version) is ready: loaded, with at least one instance ready to serve.
    pub fn model_ready(&self, name: &str, version: Option<i64>) -> bool {
        self.route(name, version).is_ok_and(|v| v.any_ready())
    }

    /// Every instance of every loaded model (or of one model), for the CLI and metrics.
    pub fn instances(&self, model: Option<&str>) -> Vec<InstanceInfo> {
        let models = self.models();
        let mut out = Vec::new();
        for (name, entry) in models.iter() {
            if model.is_some_and(|m| m != name) {
                continue;
            }
            for (v, ver) in &entry.versions {
                for i in ver.ctx.instances.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    out.push(i.info(name, *v));
                }
            }
        }
        out
    }

    /// Drains and restarts one instance (or every instance) of a model, and returns once they
    /// are ready again, or says why they are not.
    pub async fn restart(&self, model: &str, instance: Option<&str>) -> Result<(), InferError> {
        let targets: Vec<(Arc<Version>, Arc<instance::Instance>, u64)> = {
            let models = self.models();
            let entry = models
                .get(model)
                .ok_or_else(|| InferError::not_found(format!("Request for unknown model: '{model}' is not found")))?;
            let mut t = Vec::new();
            for ver in entry.versions.values() {
                for i in ver.ctx.instances.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    if instance.is_none_or(|n| n == i.spec.name) {
                        t.push((ver.clone(), i.clone(), i.restarts()));
                    }
                }
            }
            t
        };
        if targets.is_empty() {
            let name = instance.unwrap_or("");
            return Err(InferError::not_found(format!("model '{model}' has no instance named '{name}'")));
        }
        for (ver, i, _) in &targets {
            if i.state() == InstanceState::Failed {
                return Err(InferError::unavailable(format!(
                    "instance '{}' is failed ({}); reload the model to start it again",
                    i.spec.name,
                    i.reason()
                )));
            }
            i.request_restart(&ver.ctx.queue);
        }
        let limit = targets.iter().map(|(v, _, _)| v.ctx.supervision.init_timeout).max().unwrap_or_default()
            + Duration::from_secs(60);
        let deadline = tokio::time::Instant::now() + limit;
        for (_, i, before) in &targets {
            let view = match tokio::time::timeout_at(deadline, settled_after(i.subscribe(), *before)).await {
                Ok(view) => view,
                Err(_) => {
                    return Err(InferError::internal(format!(
                        "instance '{}' is not ready {}s after the restart request (state {})",
                        i.spec.name,
                        limit.as_secs(),
                        i.state().as_str()
                    )));
                }
            };
            match view.state {
                InstanceState::Failed => {
                    return Err(InferError::internal(format!(
                        "instance '{}' failed to restart: {}",
                        i.spec.name,
                        i.reason()
                    )));
                }
                InstanceState::Stopped | InstanceState::Stopping => {
                    return Err(InferError::unavailable(format!(
                        "instance '{}' stopped: the model is unloading",
                        i.spec.name
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The repository index: every model directory, and the state of each loaded version.
    pub fn repository_index(&self, ready_only: bool) -> Vec<IndexEntry> {
        let models = self.models();
        let mut out = Vec::new();
        let mut names = self.repository_models();
        names.extend(models.keys().cloned());
        names.sort();
        names.dedup();
        for name in names {
            let Some(entry) = models.get(&name) else {
                if !ready_only {
                    out.push(IndexEntry { name, ..IndexEntry::default() });
                }
                continue;
            };
            let (state, reason) = match &entry.state {
                State::Loading => ("LOADING", self.load_progress(&name)),
                State::Ready => ("READY", String::new()),
                State::Unavailable(r) => ("UNAVAILABLE", r.clone()),
                State::Unloading => ("UNLOADING", String::new()),
            };
            if ready_only && entry.state != State::Ready {
                continue;
            }
            if entry.versions.is_empty() && entry.gone.is_empty() {
                out.push(IndexEntry { name: name.clone(), state: state.into(), reason, ..IndexEntry::default() });
            } else if entry.versions.is_empty() {
                for v in &entry.gone {
                    let (state, reason) = (state.into(), reason.clone());
                    out.push(IndexEntry {
                        name: name.clone(),
                        version: v.to_string(),
                        state,
                        reason,
                        ..IndexEntry::default()
                    });
                }
            } else {
                for (v, ver) in &entry.versions {
                    let (state, reason) = match ver.failure() {
                        Some(why) => ("UNAVAILABLE", why),
                        None => (state, reason.clone()),
                    };
                    if ready_only && state != "READY" {
                        continue;
                    }
                    let (python, environment) = ver.interpreter();
                    out.push(IndexEntry {
                        name: name.clone(),
                        version: v.to_string(),
                        state: state.into(),
                        reason,
                        python,
                        environment,
                    });
                }
            }
        }
        out
    }

    /// A client's load request: refused unless model control is explicit, as in Triton.
    pub async fn load_model(&self, name: &str) -> Result<(), InferError> {
        self.check_control()?;
        self.load(name).await
    }

    /// A client's load request with a `config` override (Triton's load parameter: the model's
    /// config as JSON, used instead of its `config.pbtxt`; auto-complete and normalization apply
    /// as to a config file). The override lasts until the model is loaded again without one.
    /// Refused unless model control is explicit, as in Triton.
    pub async fn load_model_with_config(&self, name: &str, config_json: &str) -> Result<(), InferError> {
        self.check_control()?;
        let config = parse_config_override(name, config_json)?;
        self.load_with(name, Some(config)).await
    }

    /// A client's unload request: refused unless model control is explicit, as in Triton.
    pub async fn unload_model(&self, name: &str) -> Result<(), InferError> {
        self.check_control()?;
        self.unload(name).await
    }

    /// A client's unload request with `unload_dependents: true`: an ensemble is unloaded with
    /// the models of its steps that no other loaded ensemble uses (a model that is not an
    /// ensemble has none); refused unless model control is explicit, as in Triton.
    pub async fn unload_model_and_dependents(&self, name: &str) -> Result<(), InferError> {
        self.check_control()?;
        self.unload_with_dependents(name).await
    }

    fn check_control(&self) -> Result<(), InferError> {
        if self.inner.opts.explicit_control {
            Ok(())
        } else {
            Err(InferError::unavailable("explicit model load / unload is not allowed if polling is enabled"))
        }
    }

    /// Reloads models whose directory changed, loads new ones and unloads removed ones
    /// (`--model-control-mode poll`).
    pub async fn poll_repository(&self) {
        let on_disk = self.repository_models();
        let (changed, removed) = {
            let models = self.models();
            let changed: Vec<String> = on_disk
                .iter()
                .filter(|n| {
                    models.get(*n).is_none_or(|e| e.fingerprint != fingerprint(&self.inner.opts.repository.join(n)))
                })
                .cloned()
                .collect();
            let removed: Vec<String> =
                models.iter().filter(|(n, e)| e.wanted && !on_disk.contains(n)).map(|(n, _)| n.clone()).collect();
            (changed, removed)
        };
        for name in removed {
            info!(model = %name, "model directory removed; unloading");
            let _ = self.unload(&name).await;
        }
        if !changed.is_empty() {
            info!("repository changed: (re)loading {changed:?}");
            self.load_models(changed).await;
        }
    }

    /// Loads (or reloads) a model. On reload the new versions are ready before the old ones drain.
    pub async fn load(&self, name: &str) -> Result<(), InferError> {
        self.load_with(name, None).await
    }

    /// Loads (or reloads) a model, with its config from `config` instead of the repository when
    /// it is given.
    async fn load_with(&self, name: &str, config: Option<ModelConfig>) -> Result<(), InferError> {
        check_name(name).map_err(InferError::invalid)?;
        let print = fingerprint(&self.inner.opts.repository.join(name));
        {
            let mut models = self.models_mut();
            let entry = models.entry(name.to_string()).or_insert_with(|| Entry {
                fingerprint: 0,
                state: State::Loading,
                wanted: true,
                versions: BTreeMap::new(),
                gone: Vec::new(),
            });
            entry.wanted = true;
            if entry.versions.is_empty() {
                entry.state = State::Loading;
            }
        }
        // An ensemble's step models load first.
        let steps = self.ensemble_dependencies(name).await;
        let (tx, rx) = oneshot::channel();
        let inner = self.inner.clone();
        let model = name.to_string();
        std::thread::Builder::new()
            .name(format!("load-{name}"))
            .spawn(move || {
                let _ = tx.send(steps.and_then(|steps| {
                    let cache = inner.cache.get().cloned();
                    load_versions(&inner, cache, &model, steps, config)
                }));
            })
            .map_err(|e| InferError::internal(format!("cannot start a loader thread: {e}")))?;
        let result = rx.await.unwrap_or(Err(LoadError::LoaderDied));
        self.inner.load_progress.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        let old = {
            let mut models = self.models_mut();
            let Some(entry) = models.get_mut(name) else {
                return Err(InferError::internal("model vanished while loading"));
            };
            entry.fingerprint = print;
            match result {
                Ok(versions) => {
                    entry.state = State::Ready;
                    entry.gone.clear();
                    std::mem::replace(&mut entry.versions, versions)
                }
                Err(e) => {
                    // Triton's texts: a version that failed is at UNAVAILABLE state with an
                    // `Internal:` reason; a name the repository lacks failed to poll.
                    let (reason, message) = match &e {
                        LoadError::Version { version, source } => {
                            // Instances that failed to start (their `initialize`) are Triton's
                            // INTERNAL errors; other failures keep their own texts.
                            let reason = match **source {
                                LoadError::Instances(_) | LoadError::Thread(_) => format!("Internal: {source}"),
                                _ => source.to_string(),
                            };
                            let message = format!(
                                "load failed for model '{name}': version {version} is at UNAVAILABLE state: {reason};\n"
                            );
                            (reason, message)
                        }
                        LoadError::NoDirectory(_) => (
                            e.to_string(),
                            format!("failed to load '{name}', failed to poll from model repository: {e}"),
                        ),
                        _ => (e.to_string(), format!("failed to load '{name}': {e}")),
                    };
                    if let (LoadError::Version { version, .. }, true) = (&e, entry.versions.is_empty()) {
                        entry.gone = vec![*version];
                    }
                    if matches!(e, LoadError::NoDirectory(_)) && entry.versions.is_empty() {
                        // No such model: nothing of it stays in the index (as in Triton), so
                        // a later unload of the name does not make it appear either.
                        models.remove(name);
                    } else if entry.versions.is_empty() {
                        entry.state = State::Unavailable(reason.clone());
                    } else {
                        error!(model = %name, "reload failed, the previous versions keep serving: {reason}");
                    }
                    return Err(InferError::invalid(message));
                }
            }
        };
        retire_all(old).await;
        info!(model = %name, "model ready");
        self.refresh_dependents(name, true).await;
        Ok(())
    }

    /// Unloads a model: new requests are refused, queued ones are served, then `finalize` runs.
    /// A name the server does not know is already unloaded: that succeeds, as in Triton 2.51.
    pub async fn unload(&self, name: &str) -> Result<(), InferError> {
        check_name(name).map_err(InferError::invalid)?;
        let old = {
            let mut models = self.models_mut();
            let Some(entry) = models.get_mut(name) else {
                return Ok(());
            };
            entry.wanted = false;
            entry.state = State::Unloading;
            if !entry.versions.is_empty() {
                entry.gone = entry.versions.keys().copied().collect();
            }
            std::mem::take(&mut entry.versions)
        };
        retire_all(old).await;
        if let Some(entry) = self.models_mut().get_mut(name) {
            if entry.state == State::Unloading {
                entry.state = State::Unavailable("unloaded".into());
            }
        }
        info!(model = %name, "model unloaded");
        self.refresh_dependents(name, false).await;
        Ok(())
    }

    /// What loading model `name` is doing now ("" when nothing is reported).
    fn load_progress(&self, name: &str) -> String {
        self.inner.load_progress.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned().unwrap_or_default()
    }

    /// Statistics for one model (and version) or all.
    pub fn statistics(&self, name: Option<&str>, version: Option<i64>) -> Result<Vec<ModelStats>, InferError> {
        let models = self.models();
        let mut out = Vec::new();
        for (model, entry) in models.iter() {
            if name.is_some_and(|n| n != model) {
                continue;
            }
            for (v, ver) in &entry.versions {
                if version.is_some_and(|want| want != *v) {
                    continue;
                }
                out.push(ver.ctx.stats.snapshot());
            }
        }
        if let Some(n) = name {
            // Triton's texts and code (core `TRITONSERVER_ServerModelStatistics`).
            if out.is_empty() {
                let known = models.get(n).is_some_and(|e| !e.versions.is_empty());
                return Err(InferError::invalid(if known {
                    format!("requested model version is not available for model '{n}'")
                } else {
                    format!("requested model '{n}' is not available")
                }));
            }
        }
        Ok(out)
    }

    /// The Prometheus page: Triton's `nv_inference_*` metrics, tritium's stub metrics, and the
    /// models' custom metrics.
    pub fn metrics_text(&self) -> String {
        use tritium_metrics::{FailureCounts, InstanceSnapshot, ModelSnapshot, Snapshot};
        let mut snapshot = Snapshot::default();
        // Only loaded versions are listed, so an unloaded model's series leave the page.
        for entry in self.models().values() {
            for ver in entry.versions.values() {
                let s = ver.ctx.stats.snapshot();
                snapshot.models.push(ModelSnapshot {
                    success: s.success.count,
                    failure: FailureCounts {
                        rejected: s.fail_reasons.rejected,
                        canceled: s.fail_reasons.canceled,
                        backend: s.fail_reasons.backend,
                        other: s.fail_reasons.other,
                    },
                    inference_count: s.inference_count,
                    exec_count: s.execution_count,
                    request_duration_ns: s.success.ns + s.fail.ns,
                    queue_duration_ns: s.queue.ns,
                    compute_input_duration_ns: s.compute_input.ns,
                    compute_infer_duration_ns: s.compute_infer.ns,
                    compute_output_duration_ns: s.compute_output.ns,
                    pending_requests: ver.ctx.queue.len() as u64,
                    load_duration_secs: Some(ver.load_duration.as_secs_f64()),
                    cache: ver.cache.as_ref().map(|_| tritium_metrics::CacheCounts {
                        hits: s.cache_hit.count,
                        misses: s.cache_miss.count,
                        hit_duration_ns: s.cache_hit.ns,
                        miss_duration_ns: s.cache_miss.ns,
                    }),
                    summaries: ver.ctx.stats.summaries(&self.inner.opts.metrics.summary_quantiles),
                    name: s.name,
                    version: s.version,
                });
            }
        }
        // Every ready stub is asked for its prometheus_client metrics at once.
        let mut probes = Vec::new();
        for (name, entry) in self.models().iter() {
            for (v, ver) in &entry.versions {
                for i in ver.ctx.instances.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    if let Some(probe) = i.metrics_probe() {
                        let labels = tritium_metrics::StubFamilies {
                            model: name.clone(),
                            version: v.to_string(),
                            instance: i.spec.name.clone(),
                            families: Vec::new(),
                        };
                        probes.push((labels, probe));
                    }
                }
            }
        }
        let answered = crate::scrape::gather(probes);
        for i in self.instances(None) {
            snapshot.instances.push(InstanceSnapshot {
                model: i.model,
                version: i.version.to_string(),
                instance: i.instance,
                state: i.state.as_str().to_string(),
                restarts: i.restarts,
                impossible_transitions: i.impossible_transitions,
                rss_bytes: i.pid.map(|_| i.rss_bytes),
                shm_bytes: i.shm_bytes,
                inflight: i.inflight,
            });
        }
        snapshot.cache = self.cache_usage().map(|u| tritium_metrics::CacheSnapshot {
            entries: u.entries,
            used_bytes: u.used_bytes,
            capacity_bytes: u.capacity_bytes,
            evictions: u.evictions,
            lookups: u.lookups,
            hits: u.hits,
            lookup_ns: u.lookup_ns,
            insertion_ns: u.insertion_ns,
        });
        let probes: Vec<_> = answered.iter().map(|(_, p)| p.clone()).collect();
        snapshot.client = answered.into_iter().map(|(families, _)| families).collect();
        self.inner.metrics.render_reporting(&snapshot, &mut |i, why| {
            if let (Some(probe), Some(labels)) = (probes.get(i), snapshot.client.get(i)) {
                probe.warn_once(labels, &why);
            }
        })
    }

    /// Requests waiting in a model's queues (all versions).
    pub fn pending_requests(&self, name: &str) -> usize {
        self.models().get(name).map(|e| e.versions.values().map(|v| v.ctx.queue.len()).sum()).unwrap_or(0)
    }

    /// Stops serving: every model drains its queue and finalizes its instances.
    pub async fn shutdown(&self) {
        self.inner.live.store(false, Ordering::Release);
        let all: Vec<_> = {
            let mut models = self.models_mut();
            models.values_mut().flat_map(|e| std::mem::take(&mut e.versions)).collect()
        };
        retire_all(all.into_iter().collect()).await;
    }
}

impl Inner {
    fn models(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.models.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The loaded version a request for `model` (`version`, or the newest) goes to.
    fn route(&self, model: &str, version: Option<i64>) -> Result<Arc<Version>, InferError> {
        let models = self.models();
        let Some(entry) = models.get(model) else {
            return Err(InferError::not_found(format!("Request for unknown model: '{model}' is not found")));
        };
        let found = match version {
            Some(v) => entry.versions.get(&v).cloned(),
            None => entry.versions.values().next_back().cloned(),
        };
        match (found, version, &entry.state) {
            (Some(v), _, _) => Ok(v),
            (None, Some(v), _) => {
                Err(InferError::not_found(format!("Request for unknown model: '{model}' version {v} is not found")))
            }
            (None, None, State::Unavailable(reason)) => Err(InferError::not_found(format!(
                "Request for unknown model: '{model}' has no available versions: {reason}"
            ))),
            (None, None, _) => {
                Err(InferError::not_found(format!("Request for unknown model: '{model}' has no available versions")))
            }
        }
    }
}

impl Router for Inner {
    fn ready_target(&self, model: &str, version: Option<i64>) -> Option<Arc<VersionContext>> {
        self.route(model, version).ok().filter(|v| v.any_ready()).map(|v| v.ctx.clone())
    }

    fn enqueue(self: Arc<Self>, req: InferRequest, tx: StreamTx) -> Result<(), InferError> {
        let server = Server { inner: self };
        if let Some(ensemble) = server.ensemble_of(&req) {
            // An ensemble has no queue of its own: its steps are queued as they become ready.
            return ensemble.start_on(server.inner.clone(), req, tx);
        }
        let decoupled = server.route(&req.model, req.version)?.ctx.decoupled;
        let (version, deadline) = server.enqueue(req, Reply::Stream(tx), decoupled)?;
        if let Some(deadline) = deadline {
            tokio::spawn(async move {
                tokio::time::sleep_until(deadline.into()).await;
                version.ctx.queue.expire();
            });
        }
        Ok(())
    }

    fn infer(self: Arc<Self>, req: InferRequest) -> Boxed<Result<InferResponse, InferError>> {
        let server = Server { inner: self };
        Box::pin(async move { server.infer(req).await })
    }

    fn infer_decoupled(self: Arc<Self>, req: InferRequest) -> Result<ResponseStream, InferError> {
        Server { inner: self }.infer_decoupled(req)
    }

    fn load(
        self: Arc<Self>,
        name: &str,
        config_json: Option<String>,
    ) -> Result<Boxed<Result<(), InferError>>, InferError> {
        let server = Server { inner: self };
        server.check_control()?;
        let name = name.to_string();
        Ok(Box::pin(async move {
            match config_json {
                None => server.load(&name).await,
                Some(json) => {
                    let config = parse_config_override(&name, &json)?;
                    server.load_with(&name, Some(config)).await
                }
            }
        }))
    }

    fn unload(self: Arc<Self>, name: &str, dependents: bool) -> Result<Boxed<Result<(), InferError>>, InferError> {
        let server = Server { inner: self };
        server.check_control()?;
        let name = name.to_string();
        Ok(Box::pin(async move {
            if dependents {
                server.unload_with_dependents(&name).await
            } else {
                server.unload(&name).await
            }
        }))
    }
}

/// Replaces the bytes of `req`'s inputs that lie in a system region with a copy read by
/// `pread`, for the inputs the server itself reads: BYTES inputs (validated element by element),
/// or every input when `all` (response-cache keys).
fn copy_read_inputs(req: &mut InferRequest, all: bool) -> Result<(), InferError> {
    for input in &mut req.inputs {
        if input.data.is_empty() || !(all || input.datatype == DataType::Bytes) {
            continue;
        }
        if let Some(copy) = crate::shm::pread_copy(&input.data)? {
            input.data = copy;
        }
    }
    Ok(())
}

/// Writes the outputs that still hold bytes into their shared-memory targets and drops the
/// bytes, so the response names them without data (as Triton's does).
fn place_outputs(targets: &[(String, crate::shm::ShmTarget)], response: &mut InferResponse) -> Result<(), InferError> {
    for output in &mut response.outputs {
        if let Some((_, target)) = targets.iter().find(|(name, _)| *name == output.name) {
            if !output.data.is_empty() {
                target.write(&output.name, &output.data)?;
                output.data = Vec::new();
            }
        }
    }
    Ok(())
}

/// Waits on an instance's state changes until it is ready after more than `restarts` restarts,
/// or in a state no waiting changes (failed, stopping, stopped).
async fn settled_after(mut states: watch::Receiver<StateView>, restarts: u64) -> StateView {
    let settled = |v: &StateView| {
        (v.state == InstanceState::Ready && v.restarts > restarts)
            || matches!(v.state, InstanceState::Failed | InstanceState::Stopping | InstanceState::Stopped)
    };
    match states.wait_for(settled).await {
        Ok(view) => *view,
        // The instance is gone (its status dropped): it stopped.
        Err(_) => StateView { state: InstanceState::Stopped, restarts },
    }
}

async fn retire_all(versions: BTreeMap<i64, Arc<Version>>) {
    if versions.is_empty() {
        return;
    }
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new().name("retire".into()).spawn(move || {
        std::thread::scope(|s| {
            for v in versions.values() {
                s.spawn(|| v.retire());
            }
        });
        let _ = tx.send(());
    });
    if spawned.is_ok() {
        let _ = rx.await;
    }
}

/// The server-wide supervision limits with the model's `parameters` overrides applied.
fn supervision_for(base: &Supervision, config: &ModelConfig) -> Result<Supervision, LoadError> {
    let mut sup = base.clone();
    let secs = |key: &str| -> Result<Option<Duration>, LoadError> {
        let Some(p) = config.parameters.get(key) else { return Ok(None) };
        let v: f64 = p.string_value.trim().parse().map_err(|_| {
            LoadError::Parameter(format!("parameter {key:?} must be a number of seconds, got {:?}", p.string_value))
        })?;
        if !(v.is_finite() && v >= 0.0) {
            return Err(LoadError::Parameter(format!(
                "parameter {key:?} must be a non-negative number of seconds, got {v}"
            )));
        }
        Ok(Some(Duration::from_secs_f64(v)))
    };
    if let Some(d) = secs("stub_init_timeout_secs")? {
        sup.init_timeout = d;
    }
    if let Some(d) = secs("execute_timeout_secs")? {
        sup.execute_timeout = (!d.is_zero()).then_some(d);
    }
    if let Some(d) = secs("stub_restart_window_secs")? {
        sup.restart_window = d;
    }
    if let Some(d) = secs("stub_backoff_max_secs")? {
        sup.backoff_max = d;
    }
    if let Some(p) = config.parameters.get("stub_restart_limit") {
        sup.restart_limit = p.string_value.trim().parse().map_err(|_| {
            LoadError::Parameter(format!(
                "parameter \"stub_restart_limit\" must be a whole number, got {:?}",
                p.string_value
            ))
        })?;
    }
    Ok(sup)
}

/// A hash of every file's path, size and modification time under `dir` (caches excluded).
fn fingerprint(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let path = e.path();
            if e.file_name() == "__pycache__" {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else {
                files.push((path, meta.len(), meta.modified().ok()));
            }
        }
    }
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    files.hash(&mut h);
    h.finish()
}

/// Finds the newest numeric version directory, for auto-completion before the policy is known.
fn newest_version_dir(dir: &Path) -> Option<i64> {
    std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i64>().ok()).max()
}

/// Runs the model's `auto_complete_config` in a short-lived stub.
fn auto_complete(
    opts: &ServerOptions,
    stub: &StubCommand,
    name: &str,
    model_file: &Path,
    config: &ModelConfig,
) -> Result<ModelConfig, LoadError> {
    let timeout = opts.supervision.init_timeout;
    let stub = Stub::spawn(stub, &format!("{name}_autocomplete"), timeout)
        .map_err(|e| LoadError::AutoComplete(e.to_string()))?;
    let json = tritium_config::to_json(config).to_string();
    let result = stub.auto_complete(&model_file.display().to_string(), &json, timeout);
    let _ = stub.finalize(Duration::from_secs(5));
    let completed = result.map_err(|e| {
        if let HostError::Model(model_error @ StubError { traceback: Some(_), .. }) = &e {
            error!(model = %name, "auto_complete_config failed: {model_error:#}");
        }
        LoadError::AutoComplete(format!("auto_complete_config failed: {e}"))
    })?;
    tritium_config::from_json_str(&completed)
        .map_err(|e| LoadError::AutoComplete(format!("auto_complete_config returned an invalid config: {e}")))
}

/// Why a model could not be loaded; its text is the reason the repository index reports.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    /// The repository has no such directory.
    #[error("no model directory {0} in the repository")]
    NoDirectory(String),
    /// `config.pbtxt` or the version policy is invalid.
    #[error(transparent)]
    Config(#[from] tritium_config::ConfigError),
    /// `auto_complete_config` failed or returned something unusable.
    #[error("{0}")]
    AutoComplete(String),
    /// No version directory matches the policy.
    #[error("no version directory (a number, such as {0}/1) holds the model")]
    NoVersions(String),
    /// A supervision parameter is malformed.
    #[error("{0}")]
    Parameter(String),
    /// A label file named by the config cannot be read.
    #[error(transparent)]
    Labels(#[from] LabelError),
    /// A version directory lacks the model file.
    #[error("Python model file not found in '{0}'")]
    NoModelFile(String),
    /// A version directory lacks an ONNX or PyTorch model's file.
    #[error(
        "model file not found: '{path}' (a '{platform}' model's version directory holds model.onnx, model.pt or \
         model.pt2, or the file the config's default_model_filename names)"
    )]
    NoFrameworkModelFile {
        /// The model's platform.
        platform: &'static str,
        /// The file looked for.
        path: String,
    },
    /// `backend` names neither "python" nor a Python-based backend in the backend directory.
    #[error(
        "unable to find backend library for backend '{backend}', try specifying runtime on the model configuration. \
         ({}; it looked for '{searched}': set the backend directory with --backend-directory)",
        tritium_config::SERVED
    )]
    UnknownBackend {
        /// The config's `backend`.
        backend: String,
        /// The model.py it looked for.
        searched: String,
    },
    /// The instance worker thread could not be started.
    #[error("cannot start an instance thread: {0}")]
    Thread(#[source] std::io::Error),
    /// Instances failed to start (their reasons, joined).
    #[error("{}", .0.join("; "))]
    Instances(Vec<String>),
    /// The loader thread ended without an answer.
    #[error("the loader thread died")]
    LoaderDied,
    /// A version failed to start (the index lists it as unavailable, with this reason).
    #[error("{source}")]
    Version {
        /// The version.
        version: i64,
        /// Why it failed.
        source: Box<LoadError>,
    },
    /// An ensemble's step models are missing or not loaded (Triton's texts).
    #[error("{0}")]
    Ensemble(String),
    /// The model's Python environment cannot be unpacked, built or used.
    #[error(transparent)]
    Env(#[from] crate::envs::EnvError),
    /// A `model_warmup` sample is malformed (Triton's texts).
    #[error("{0}")]
    Warmup(String),
    /// The config asks for more than the server's limits allow.
    #[error(transparent)]
    Limit(#[from] crate::config_limits::LimitError),
}

/// A model's config, read and completed, and what loading its versions needs from it.
struct Resolved {
    dir: PathBuf,
    /// A Python-based backend's `model.py`, run instead of each version's own model file.
    backend_model: Option<PathBuf>,
    config: Arc<ModelConfig>,
    config_json: String,
    supervision: Supervision,
    batching: Option<Batching>,
    priorities: Priorities,
    classes: Classes,
    versions: Vec<i64>,
    /// How this model's stubs start: the server's interpreter, or its own environment's.
    stub: StubCommand,
    /// The response cache, when the model enables it and the server has one.
    cache: Option<ModelCache>,
    /// The warmup samples every instance runs before it is ready.
    warmup: Arc<Vec<crate::warmup::Sample>>,
}

/// Reads, completes and checks a model's config, then starts every instance of every version;
/// if any version fails, every version started is retired again.
fn load_versions(
    inner: &Inner,
    cache: Option<Arc<ResponseCache>>,
    name: &str,
    steps: Option<ensemble::StepConfigs>,
    config: Option<ModelConfig>,
) -> Result<BTreeMap<i64, Arc<Version>>, LoadError> {
    let load_start = Instant::now();
    let (opts, metrics) = (&inner.opts, inner.metrics.custom());
    let mut resolved = resolve(opts, name, config)?;
    resolved.cache = model_cache(name, &resolved.config, cache);
    // Each version's load time is the shared preparation plus the start of its own instances.
    let prepared = load_start.elapsed();
    if tritium_config::is_ensemble(&resolved.config) {
        let steps = steps.ok_or_else(|| LoadError::Ensemble(format!("ensemble '{name}' has no steps")))?;
        return ensemble::start(opts, metrics, name, &resolved, steps, prepared);
    }
    let mut loaded = BTreeMap::new();
    for &v in &resolved.versions {
        match start_version(inner, name, &resolved, v, prepared) {
            Ok(version) => {
                loaded.insert(v, version);
            }
            Err(e) => {
                rollback(loaded);
                return Err(LoadError::Version { version: v, source: Box::new(e) });
            }
        }
    }
    Ok(loaded)
}

/// The cache a model's versions use: the server's, when the model enables it (Triton uses the
/// cache only when both the server and the model enable it; a model that enables it on a
/// server without one is served without it, and tritium says so in the log).
fn model_cache(name: &str, config: &ModelConfig, cache: Option<Arc<ResponseCache>>) -> Option<ModelCache> {
    if !config.response_cache.as_ref().is_some_and(|c| c.enable) {
        return None;
    }
    if cache.is_none() {
        warn!(
            model = %name,
            "the model enables response_cache but the server has no cache; it is served without one \
             (start the server with --cache-config local,size=BYTES)"
        );
    }
    cache.map(|cache| ModelCache { cache })
}

/// The answer of a request whose sender went away unanswered.
fn dropped() -> InferError {
    InferError::internal("the model instance dropped the request without answering")
}

/// A load request's `config` parameter as a model config: Triton's JSON form of `ModelConfig`. A
/// name other than the model's is refused (an empty one is the model's).
fn parse_config_override(name: &str, json: &str) -> Result<ModelConfig, InferError> {
    let mut config = tritium_config::from_json_str(json).map_err(|e| {
        InferError::invalid(format!(
            "failed to load '{name}': the 'config' parameter is not a model configuration in JSON: {e}"
        ))
    })?;
    if config.name.is_empty() {
        config.name = name.to_string();
    } else if config.name != name {
        return Err(InferError::invalid(format!(
            "failed to load '{name}': the 'config' parameter names model '{}'; a config override must be the \
             loaded model's own",
            config.name
        )));
    }
    Ok(config)
}

/// Step 1: the model's config (from `config.pbtxt`, or a load request's override; auto-completed,
/// normalized) and its versions.
fn resolve(opts: &ServerOptions, name: &str, config: Option<ModelConfig>) -> Result<Resolved, LoadError> {
    let dir = opts.repository.join(name);
    if !dir.is_dir() {
        return Err(LoadError::NoDirectory(dir.display().to_string()));
    }
    // A load request's config override stands for the config file.
    let from_file = match config {
        Some(config) => Some(config),
        None => tritium_config::load_config_named(&dir, opts.config_name.as_deref())?,
    };
    let has_file = from_file.is_some();
    let mut config = from_file.unwrap_or_else(|| ModelConfig { name: name.to_string(), ..Default::default() });
    if config.backend.is_empty() && config.platform.is_empty() {
        // As Triton's AutoCompleteBackendFields: the model file says which backend runs it.
        config.backend = detect_framework(&dir).map_or("python", Framework::backend).to_owned();
    }
    let framework = Framework::of_backend(&config.backend).or_else(|| Framework::of_platform(&config.platform));
    // Before any file is looked for: the config may be a client's load override.
    check_model_filename(&config, name)?;
    let backend_model = python_based_backend(opts, &config)?;
    // The model's own Python environment (envs.rs), made ready before any of its stubs starts.
    let stub = if config.platform == "ensemble" {
        opts.stub.clone()
    } else {
        crate::envs::stub_for(&opts.stub, &opts.envs, &opts.paths, name, &dir, &config)?
    };
    if opts.auto_complete {
        let file = match (&backend_model, framework) {
            (Some(file), _) => mentions_auto_complete(file, has_file).then(|| file.clone()),
            // A built-in backend completes from the model file itself (the stub picks the
            // backend module from the config's backend or platform).
            (None, Some(framework)) => (framework.completes_config() || !has_file)
                .then(|| newest_version_dir(&dir))
                .flatten()
                .map(|v| framework_model_file(&dir.join(v.to_string()), &config, framework)),
            (None, None) => auto_complete_file(&dir, &config, has_file),
        };
        if let Some(file) = file {
            // As Triton, auto-complete sees the model's name (normalize would fill it in next).
            if config.name.is_empty() {
                config.name = name.to_string();
            }
            if let Some(framework) = framework {
                // The stub's built-in backend module is chosen by the config's backend.
                config.backend = framework.backend().to_owned();
            }
            config = auto_complete(opts, &stub, name, &file, &config)?;
        }
    }
    tritium_config::normalize(&mut config, name)?;
    // Stubs of a model that asks for KIND_GPU itself bind their device (a CUDA context each);
    // KIND_AUTO placed on the GPUs does not, so a model that never touches CUDA costs no GPU
    // memory, as in Triton.
    let mut stub = stub;
    if config.instance_group.iter().any(|g| g.kind == Kind::Gpu as i32) {
        stub.env.push(("TRITIUM_CUDA_BIND".into(), "1".into()));
    }
    tritium_config::resolve_instance_groups(&mut config, &opts.gpus)?;
    // Before anything is sized by the config: it may be a client's load override.
    opts.limits.check(&config)?;
    check_model_filename(&config, name)?;
    let policy = config.version_policy.clone().unwrap_or_default();
    let versions = tritium_config::model_versions(&dir, &policy)?;
    if versions.is_empty() {
        return Err(LoadError::NoVersions(dir.display().to_string()));
    }
    let supervision = supervision_for(&opts.supervision, &config)?;
    let classes = Classes::load(&dir, &config, &opts.paths)?;
    let warmup = if tritium_config::is_ensemble(&config) {
        Vec::new()
    } else {
        crate::warmup::samples(&config, &dir, &opts.paths, opts.limits.max_warmup_bytes).map_err(LoadError::Warmup)?
    };
    let batching = batching_for(&config);
    let priorities = Priorities::for_config(&config, opts.max_queue_size);
    let config_json = tritium_config::to_json(&config).to_string();
    Ok(Resolved {
        dir,
        backend_model,
        config: Arc::new(config),
        config_json,
        supervision,
        batching,
        priorities,
        classes,
        versions,
        stub,
        cache: None,
        warmup: Arc::new(warmup),
    })
}

/// Step 2: the model file whose `auto_complete_config` runs, if it should: the newest version's,
/// when the model has no `config.pbtxt` or its file mentions `auto_complete_config`.
fn auto_complete_file(dir: &Path, config: &ModelConfig, has_file: bool) -> Option<PathBuf> {
    let filename = if config.default_model_filename.is_empty() { "model.py" } else { &config.default_model_filename };
    let file = dir.join(newest_version_dir(dir)?.to_string()).join(filename);
    mentions_auto_complete(&file, has_file).then_some(file)
}

/// Whether `auto_complete_config` in `file` should run: always without a `config.pbtxt`,
/// otherwise when the file mentions it.
fn mentions_auto_complete(file: &Path, has_file: bool) -> bool {
    !has_file || std::fs::read_to_string(file).map(|s| s.contains("auto_complete_config")).unwrap_or(false)
}

/// `default_model_filename` names a file inside each version directory, nothing else.
fn check_model_filename(config: &ModelConfig, name: &str) -> Result<(), LoadError> {
    let file = &config.default_model_filename;
    if file.is_empty() || crate::confine::is_plain_name(file) {
        return Ok(());
    }
    Err(LoadError::Parameter(format!(
        "default_model_filename '{file}' of model '{name}' is not a file name: it names the model file inside each \
         version directory (such as model.py or model.onnx), without any directory"
    )))
}

/// The framework of a config-less model (or one whose config names neither backend nor
/// platform), from the files of its newest version directory: none when it has a `model.py`.
fn detect_framework(dir: &Path) -> Option<Framework> {
    let version = dir.join(newest_version_dir(dir)?.to_string());
    if version.join("model.py").exists() {
        return None;
    }
    Framework::ALL.into_iter().find(|f| {
        std::iter::once(f.default_filename())
            .chain(f.alternative_filenames().iter().copied())
            .any(|n| version.join(n).exists())
    })
}

/// The model file of a built-in backend's model in `version_dir`: the config's
/// `default_model_filename`, else the framework's default file (`model.onnx`, `model.pt`), else
/// an alternative one that is there (`model.pt2`). The path may not exist; the caller says so.
fn framework_model_file(version_dir: &Path, config: &ModelConfig, framework: Framework) -> PathBuf {
    let named = config.default_model_filename.as_str();
    if !named.is_empty() && named != framework.default_filename() {
        return version_dir.join(named);
    }
    let default = version_dir.join(framework.default_filename());
    if default.exists() {
        return default;
    }
    framework.alternative_filenames().iter().map(|n| version_dir.join(n)).find(|p| p.exists()).unwrap_or(default)
}

/// A Python-based backend (Triton's layout): `backend: "<name>"` other than "python" runs
/// `<backend directory>/<name>/model.py` for every version of the model. None for the python
/// backend, the built-in backends (onnxruntime, pytorch) and ensembles; an error naming the file
/// looked for when the backend has none.
fn python_based_backend(opts: &ServerOptions, config: &ModelConfig) -> Result<Option<PathBuf>, LoadError> {
    let backend = config.backend.as_str();
    if backend.is_empty() || backend == "python" || Framework::of_backend(backend).is_some() {
        return Ok(None);
    }
    let file = opts.backend_directory.join(backend).join("model.py");
    // A name that leaves the backend directory (`..`, a separator) is no backend.
    let plain = Path::new(backend).components().count() == 1 && !backend.starts_with('.');
    if !plain || !file.is_file() {
        return Err(LoadError::UnknownBackend { backend: backend.to_string(), searched: file.display().to_string() });
    }
    Ok(Some(file))
}

/// `FORCE_CPU_ONLY_INPUT_TENSORS: "no"` (Triton's python backend parameter; "yes" by default):
/// inputs that are on a GPU (in a client's CUDA shared memory) reach the model as GPU tensors.
fn gpu_inputs(config: &ModelConfig) -> bool {
    config
        .parameters
        .get("FORCE_CPU_ONLY_INPUT_TENSORS")
        .is_some_and(|p| p.string_value.trim().eq_ignore_ascii_case("no"))
}

/// Step 3: dynamic batching, for a batching model with `dynamic_batching`.
fn batching_for(config: &ModelConfig) -> Option<Batching> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(db)) if config.max_batch_size > 0 => Some(Batching {
            max_batch_size: config.max_batch_size as u64,
            preferred: db.preferred_batch_size.iter().map(|&p| p as u64).collect(),
            max_delay: Duration::from_micros(db.max_queue_delay_microseconds),
        }),
        _ => None,
    }
}

/// The instances of a config, in `instance_group` order: one per count per device.
fn instance_specs(config: &ModelConfig) -> Vec<InstanceSpec> {
    let mut specs = Vec::new();
    for group in &config.instance_group {
        let devices: Vec<i32> = if group.kind == Kind::Gpu as i32 { group.gpus.clone() } else { vec![0] };
        let mut k = 0;
        for device_id in devices {
            for _ in 0..group.count.max(1) {
                specs.push(InstanceSpec {
                    name: format!("{}_{k}", group.name),
                    kind: kind_name(group.kind),
                    device_id,
                });
                k += 1;
            }
        }
    }
    specs
}

/// Step 4: spawns the instances of version `v` and waits until each is ready or failed (step 5);
/// a version with a failed instance is retired.
fn start_version(
    inner: &Inner,
    name: &str,
    r: &Resolved,
    v: i64,
    prepared: Duration,
) -> Result<Arc<Version>, LoadError> {
    let version_start = Instant::now();
    let (metrics, metric_options) = (inner.metrics.custom(), &inner.opts.metrics);
    let version_dir = r.dir.join(v.to_string());
    let framework = Framework::of_backend(&r.config.backend);
    let model_file = match (&r.backend_model, framework) {
        (Some(file), _) => file.clone(),
        (None, Some(framework)) => framework_model_file(&version_dir, &r.config, framework),
        (None, None) => version_dir.join(&r.config.default_model_filename),
    };
    match framework {
        // An ONNX model with external data may be a directory.
        Some(framework) if !model_file.exists() => {
            return Err(LoadError::NoFrameworkModelFile {
                platform: framework.platform(),
                path: model_file.display().to_string(),
            });
        }
        None if !model_file.is_file() => return Err(LoadError::NoModelFile(model_file.display().to_string())),
        _ => {}
    }
    let stats = Arc::new(Stats::for_metrics(name, v, metric_options));
    let specs = instance_specs(&r.config);
    let names = specs.iter().map(|s| s.name.clone()).collect();
    let queue = match crate::sequence::Sequences::for_config(
        name,
        &r.config,
        names,
        r.supervision.max_sequence_backlog,
        stats.clone(),
    )? {
        Some(sequences) => Queue::sequenced(sequences, r.priorities.clone(), stats.clone()),
        None => Queue::new(r.batching.clone(), r.priorities.clone(), stats.clone()),
    };
    let ctx = Arc::new(VersionContext {
        model: name.to_string(),
        version: v,
        model_file,
        model_dir: r.dir.clone(),
        config_json: r.config_json.clone(),
        queue: Arc::new(queue),
        stats,
        stub: r.stub.clone(),
        supervision: r.supervision.clone(),
        live_workers: AtomicUsize::new(0),
        instances: Mutex::new(Vec::new()),
        metrics: metrics.clone(),
        classes: r.classes.clone(),
        reshapes: crate::reshape::Reshapes::new(&r.config),
        gpu_inputs: gpu_inputs(&r.config),
        decoupled: tritium_config::is_decoupled(&r.config),
        calls: inner.calls.clone(),
        runtime: inner.runtime.clone(),
        warmup: r.warmup.clone(),
    });
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut workers = Vec::new();
    let mut spawn_error = None;
    for spec in specs {
        match instance::spawn(ctx.clone(), spec, ready_tx.clone()) {
            Ok(w) => workers.push(w),
            Err(e) => {
                spawn_error = Some(LoadError::Thread(e));
                break;
            }
        }
    }
    drop(ready_tx);
    let failures = await_readiness(&ready_rx, workers.len());
    let load_duration = prepared + version_start.elapsed();
    let version = Arc::new(Version {
        config: r.config.clone(),
        ctx,
        workers: Mutex::new(workers),
        load_duration,
        ensemble: None,
        cache: r.cache.clone(),
    });
    let error = spawn_error.or_else(|| (!failures.is_empty()).then_some(LoadError::Instances(failures)));
    match error {
        Some(e) => {
            version.retire();
            Err(e)
        }
        None => Ok(version),
    }
}

/// Step 5: the reasons of the instances (of `expected`) that did not become ready.
fn await_readiness(ready: &mpsc::Receiver<Result<(), String>>, expected: usize) -> Vec<String> {
    let mut failures = Vec::new();
    for _ in 0..expected {
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push("an instance thread ended before reporting".into()),
        }
    }
    failures
}

/// Step 6: retires the versions already started when a later one fails.
fn rollback(loaded: BTreeMap<i64, Arc<Version>>) {
    for version in loaded.into_values() {
        version.retire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository in a fresh temporary directory, removed on drop.
    struct Repo(PathBuf);

    impl Repo {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("tritium-load-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("repository");
            Self(dir)
        }

        /// Model `name` with `config` and version directories `versions` (each with a model.py).
        fn model(&self, name: &str, config: &str, versions: &[i64]) {
            let dir = self.0.join(name);
            std::fs::create_dir_all(&dir).expect("model dir");
            std::fs::write(dir.join("config.pbtxt"), config).expect("config");
            for v in versions {
                std::fs::create_dir_all(dir.join(v.to_string())).expect("version dir");
                std::fs::write(dir.join(v.to_string()).join("model.py"), "").expect("model.py");
            }
        }

        fn options(&self) -> ServerOptions {
            ServerOptions {
                repository: self.0.clone(),
                stub: StubCommand { python: "python3".into(), python_path: PathBuf::new(), env: Vec::new(), spin: 0 },
                supervision: Supervision::default(),
                auto_complete: false,
                strict_readiness: true,
                explicit_control: true,
                max_queue_size: 0,
                server_id: "tritium".into(),
                load_threads: 4,
                load_retries: 0,
                backend_directory: self.0.join("backends"),
                envs: crate::envs::EnvOptions::default(),
                config_name: None,
                metrics: tritium_metrics::MetricsOptions::default(),
                gpus: Vec::new(),
                paths: Default::default(),
                limits: Default::default(),
            }
        }
    }

    impl Drop for Repo {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const BATCHED: &str = r#"
        backend: "python"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 500 }
        parameters { key: "execute_timeout_secs" value: { string_value: "2.5" } }
    "#;

    #[test]
    fn resolve_reads_config_batching_labels_and_versions() {
        let repo = Repo::new("resolve");
        repo.model("m", BATCHED, &[1, 3]);
        std::fs::write(repo.0.join("m/labels.txt"), "a\nb\nc\nd\n").expect("labels");
        let r = resolve(&repo.options(), "m", None).expect("resolve");
        assert_eq!(r.versions, vec![3]);
        assert!(r.classes.batching);
        assert_eq!(r.classes.labels["OUT"], ["a", "b", "c", "d"]);
        assert_eq!(r.supervision.execute_timeout, Some(Duration::from_secs_f64(2.5)));
        let b = r.batching.expect("dynamic batching");
        assert_eq!((b.max_batch_size, b.preferred.clone(), b.max_delay), (8, vec![4], Duration::from_micros(500)));
        let specs = instance_specs(&r.config);
        assert_eq!(
            specs.iter().map(|s| (s.name.as_str(), s.kind)).collect::<Vec<_>>(),
            [("m_0_0", "CPU"), ("m_0_1", "CPU")]
        );
    }

    #[test]
    fn a_python_based_backend_runs_the_backend_directory_model_py() {
        let repo = Repo::new("backends");
        let opts = repo.options();
        repo.model("llm", "backend: \"words\"", &[1]);
        let searched = repo.0.join("backends/words/model.py");
        let e = resolve(&opts, "llm", None).err().expect("no such backend");
        assert!(matches!(e, LoadError::UnknownBackend { .. }), "{e}");
        assert!(e.to_string().starts_with("unable to find backend library for backend 'words'"), "{e}");
        assert!(e.to_string().contains(&format!("'{}'", searched.display())), "{e}");
        std::fs::create_dir_all(searched.parent().expect("parent")).expect("backend dir");
        std::fs::write(&searched, "").expect("model.py");
        let r = resolve(&opts, "llm", None).expect("resolve");
        assert_eq!(r.backend_model.as_deref(), Some(searched.as_path()));
        assert_eq!(r.config.backend, "words");
        repo.model("escape", "backend: \"../backends/words\"", &[1]);
        assert!(matches!(resolve(&opts, "escape", None), Err(LoadError::UnknownBackend { .. })));
        repo.model("plain", "backend: \"python\"", &[1]);
        assert!(resolve(&opts, "plain", None).expect("resolve").backend_model.is_none());
    }

    #[test]
    fn resolve_errors_are_typed_with_their_texts() {
        let repo = Repo::new("errors");
        let opts = repo.options();
        assert!(matches!(resolve(&opts, "absent", None), Err(LoadError::NoDirectory(_))));
        repo.model("nolabels", BATCHED, &[1]);
        let e = resolve(&opts, "nolabels", None).err().expect("missing label file");
        assert!(matches!(e, LoadError::Labels(_)), "{e}");
        repo.model("noversions", "backend: \"python\"", &[]);
        let e = resolve(&opts, "noversions", None).err().expect("no versions");
        assert!(matches!(e, LoadError::Config(_)), "{e}");
        assert!(e.to_string().starts_with("at least one version must be available"), "{e}");
        repo.model("decoupled", "backend: \"python\"\nmodel_transaction_policy { decoupled: true }", &[1]);
        assert!(resolve(&opts, "decoupled", None).is_ok_and(|r| tritium_config::is_decoupled(&r.config)));
        repo.model(
            "badparam",
            "backend: \"python\"\nparameters { key: \"stub_restart_limit\" value: { string_value: \"x\" } }",
            &[1],
        );
        let e = resolve(&opts, "badparam", None).err().expect("bad parameter");
        assert_eq!(e.to_string(), "parameter \"stub_restart_limit\" must be a whole number, got \"x\"");
        repo.model("badconfig", "max_batch_size: \"many\"", &[1]);
        assert!(matches!(resolve(&opts, "badconfig", None), Err(LoadError::Config(_))));
        repo.model(
            "badpriority",
            "backend: \"python\"\nmax_batch_size: 4\ndynamic_batching { priority_levels: 2 }",
            &[1],
        );
        let e = resolve(&opts, "badpriority", None).err().expect("bad priority level");
        assert!(matches!(e, LoadError::Config(_)), "{e}");
        assert_eq!(e.to_string(), "default priority level must be in range [1, 2] for badpriority");
    }

    #[test]
    fn the_max_queue_size_option_bounds_models_without_their_own() {
        let repo = Repo::new("queue");
        repo.model("plain", "backend: \"python\"", &[1]);
        repo.model(
            "own",
            "backend: \"python\"\nmax_batch_size: 4\ndynamic_batching { default_queue_policy { max_queue_size: 7 } }",
            &[1],
        );
        let opts = ServerOptions { max_queue_size: 3, ..repo.options() };
        let plain = resolve(&opts, "plain", None).expect("resolve");
        assert_eq!((plain.priorities.default_policy.max_queue_size, plain.priorities.levels), (3, 0));
        let own = resolve(&opts, "own", None).expect("resolve");
        assert_eq!(own.priorities.default_policy.max_queue_size, 7);
    }

    #[test]
    fn auto_complete_runs_without_a_config_or_when_the_model_asks() {
        let repo = Repo::new("autocomplete");
        repo.model("m", "backend: \"python\"", &[1, 2]);
        let dir = repo.0.join("m");
        let config = ModelConfig::default();
        assert_eq!(auto_complete_file(&dir, &config, false), Some(dir.join("2/model.py")));
        assert_eq!(auto_complete_file(&dir, &config, true), None);
        std::fs::write(dir.join("2/model.py"), "def auto_complete_config(c): return c").expect("write");
        assert_eq!(auto_complete_file(&dir, &config, true), Some(dir.join("2/model.py")));
    }

    #[tokio::test]
    async fn a_restart_waits_for_ready_after_the_restart_on_the_watch() {
        use InstanceState as S;
        let view = |state, restarts| StateView { state, restarts };
        let (tx, rx) = watch::channel(view(S::Ready, 2));
        let waiter = tokio::spawn(settled_after(rx, 2));
        for v in [view(S::Draining, 3), view(S::Starting, 3), view(S::Initializing, 3), view(S::Ready, 3)] {
            tokio::task::yield_now().await;
            tx.send_replace(v);
        }
        assert_eq!(waiter.await.expect("waiter"), view(S::Ready, 3));
        // Ready before the restart happened does not count; a failure ends the wait.
        let (tx, rx) = watch::channel(view(S::Ready, 0));
        let waiter = tokio::spawn(settled_after(rx, 0));
        tokio::task::yield_now().await;
        tx.send_replace(view(S::Failed, 1));
        assert_eq!(waiter.await.expect("waiter").state, S::Failed);
        // A dropped instance counts as stopped.
        let (tx, rx) = watch::channel(view(S::Draining, 1));
        drop(tx);
        assert_eq!(settled_after(rx, 0).await.state, S::Stopped);
    }

    #[test]
    fn readiness_collects_every_failure() {
        let (tx, rx) = mpsc::channel();
        tx.send(Ok(())).expect("send");
        tx.send(Err("boom".to_string())).expect("send");
        drop(tx);
        assert_eq!(await_readiness(&rx, 3), ["boom", "an instance thread ended before reporting"]);
        let e = LoadError::Instances(vec!["a".into(), "b".into()]);
        assert_eq!(e.to_string(), "a; b");
    }
}
