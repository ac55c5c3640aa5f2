//! The `Server` facade the frontends call: routing a request to a version's queue (validation,
//! reshapes, the response cache, queue deadlines), readiness and log settings, and the
//! [`Router`] that BLS and ensembles call through. The rest of `impl Server` is by concern:
//! [`repository`] (load, reload, unload, poll), [`dependencies`] (ensembles' step models),
//! [`resolve`] (a model's config and settings before it loads) and [`introspect`] (metadata,
//! index, statistics, metrics).

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
use tritium_sync::{Locked, RwLocked};

use crate::cache::{ModelCache, ResponseCache};
use crate::classify::{Classes, LabelError};
use crate::composition::{Boxed, Ensemble, RoutedCalls, Router};
use crate::instance::{self, InstanceSettings, InstanceSpec, ModelCalls, StateView, VersionContext};
use crate::pending::{Pending, Refused, Reply};
use crate::scheduler::{Batching, Priorities, Queue};
use crate::stats::Stats;
use crate::types::*;
use crate::validate::{check_metadata, transaction_mismatch, validate, wire_type};

mod dependencies;
mod introspect;
mod overrides;
mod repository;
mod resolve;
mod rollback;
mod stacks;
mod trace;

use repository::retire_all;
use resolve::{parse_config_override, LoadError, Resolved};

pub use rollback::DEFAULT_MODEL_UPDATE_GRACE_SECS;
pub use stacks::STACKS_TIMEOUT;
pub use trace::TraceSettingsView;

/// How the server runs models.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The model repository.
    pub repository: PathBuf,
    /// How to start stubs.
    pub stub: StubCommand,
    /// The instances' settings (per model overridable in `parameters`).
    pub instance_settings: InstanceSettings,
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
    /// `--rate-limit execution_count`: the rate limiter every instance's executions wait for;
    /// `None` (`--rate-limit off`, the default) ignores the configs' `rate_limiter`s.
    pub rate_limiter: Option<Arc<crate::limiter::RateLimiter>>,
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
    /// The instances' supervisors.
    workers: Mutex<Vec<instance::Worker>>,
    /// How long loading this version took: reading its config, then starting and initializing
    /// its instances (`nv_model_load_duration_secs`).
    load_duration: Duration,
    /// An ensemble's steps (an ensemble has no instances and is ready once loaded).
    ensemble: Option<Arc<Ensemble>>,
    /// The response cache, when the model enables it and the server has one.
    cache: Option<ModelCache>,
    /// The directory written from the load request's files, when the version was loaded from
    /// one; removed when the last version using it goes.
    _files: Option<Arc<overrides::OverrideDir>>,
}

impl Version {
    /// Whether at least one instance serves.
    fn any_ready(&self) -> bool {
        if self.ensemble.is_some() {
            return true;
        }
        self.ctx.instances.locked().iter().any(|i| i.serving())
    }

    /// Why no instance serves, when none does and none will come back by itself.
    fn failure(&self) -> Option<String> {
        if self.ensemble.is_some() {
            return None;
        }
        let instances = self.ctx.instances.locked();
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
        let workers = std::mem::take(&mut *self.workers.locked());
        for w in workers {
            w.join();
        }
        for instance in self.ctx.instances.locked().iter() {
            instance.release_metrics();
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
    /// The versions a reload replaced, kept alive without traffic for the update's grace
    /// period, to serve again if the new ones crash ([`rollback`]).
    standby: BTreeMap<i64, Arc<Version>>,
    /// Why the last update was rolled back, until the next load: the index's reason.
    rolled_back: Option<String>,
}

/// The server's state, shared by every [`Server`] handle. It is the [`Router`] BLS and
/// ensembles call through.
pub(crate) struct ServerCore {
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
    core: Arc<ServerCore>,
}

impl Server {
    /// A server with no models loaded yet.
    pub fn new(mut opts: ServerOptions) -> Self {
        let metrics = tritium_metrics::Metrics::with_options(opts.metrics.clone());
        let load_progress: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let progress = load_progress.clone();
        opts.envs.progress = crate::envs::Progress::new(move |model, line| {
            progress.locked().insert(model.to_string(), line.to_string());
        });
        let runtime = tokio::runtime::Handle::try_current().ok();
        Self {
            core: Arc::new_cyclic(|weak: &std::sync::Weak<ServerCore>| ServerCore {
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
        self.core.models()
    }

    fn models_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.core.models.write_locked()
    }

    fn route(&self, model: &str, version: Option<i64>) -> Result<Arc<Version>, InferError> {
        self.core.route(model, version)
    }

    /// Whether a model version is decoupled (its requests are answered by
    /// [`Server::infer_decoupled`] only); the frontends refuse unary inference of one with
    /// their own texts.
    pub fn is_decoupled(&self, model: &str, version: Option<i64>) -> Result<bool, InferError> {
        Ok(self.route(model, version)?.ctx.decoupled)
    }

    /// The system shared memory regions clients registered.
    pub fn shm(&self) -> &crate::shm::ShmRegistry {
        &self.core.shm
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
            return Ok(ensemble.infer(self.core.clone(), req));
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
            return ensemble.infer_decoupled(self.core.clone(), req);
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
        let limit = version.ctx.settings.max_request_metadata_bytes;
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
        let _ = self.core.cache.set(Arc::new(ResponseCache::new(bytes)));
    }

    /// Hands the server the process's log control, for the logging extension.
    pub fn set_log_control(&self, control: Arc<dyn LogControl>) {
        let _ = self.core.logging.set(control);
    }

    fn log_control(&self) -> Result<&Arc<dyn LogControl>, InferError> {
        self.core.logging.get().ok_or_else(|| InferError::unavailable("the server does not support dynamic logging"))
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
        self.core.live.load(Ordering::Acquire)
    }

    /// Readiness: live, and (with strict readiness) every wanted model ready.
    pub fn ready(&self) -> bool {
        if !self.live() {
            return false;
        }
        if !self.core.opts.strict_readiness {
            return true;
        }
        self.models()
            .values()
            .filter(|e| e.wanted)
            .all(|e| e.state == State::Ready && e.versions.values().any(|v| v.any_ready()))
    }

    /// Stops serving: every model drains its queue and finalizes its instances.
    pub async fn shutdown(&self) {
        self.core.live.store(false, Ordering::Release);
        // Every version of every model: many models share a version number.
        let all: Vec<_> = {
            let mut models = self.models_mut();
            models
                .values_mut()
                .flat_map(|e| {
                    let standby = std::mem::take(&mut e.standby);
                    std::mem::take(&mut e.versions).into_values().chain(standby.into_values())
                })
                .collect()
        };
        retire_all(all).await;
    }
}

impl ServerCore {
    fn models(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.models.read_locked()
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

impl Router for ServerCore {
    fn ready_target(&self, model: &str, version: Option<i64>) -> Option<Arc<VersionContext>> {
        self.route(model, version).ok().filter(|v| v.any_ready()).map(|v| v.ctx.clone())
    }

    fn enqueue(self: Arc<Self>, req: InferRequest, tx: StreamTx) -> Result<(), InferError> {
        let server = Server { core: self };
        if let Some(ensemble) = server.ensemble_of(&req) {
            // An ensemble has no queue of its own: its steps are queued as they become ready.
            return ensemble.start_on(server.core.clone(), req, tx);
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
        let server = Server { core: self };
        Box::pin(async move { server.infer(req).await })
    }

    fn infer_decoupled(self: Arc<Self>, req: InferRequest) -> Result<ResponseStream, InferError> {
        Server { core: self }.infer_decoupled(req)
    }

    fn load(
        self: Arc<Self>,
        name: &str,
        config_json: Option<String>,
        files: Vec<ModelFile>,
    ) -> Result<Boxed<Result<(), InferError>>, InferError> {
        let server = Server { core: self };
        server.check_control()?;
        let name = name.to_string();
        Ok(Box::pin(async move { server.load_model_with_files(&name, config_json.as_deref(), files).await }))
    }

    fn unload(self: Arc<Self>, name: &str, dependents: bool) -> Result<Boxed<Result<(), InferError>>, InferError> {
        let server = Server { core: self };
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

/// The answer of a request whose sender went away unanswered.
fn dropped() -> InferError {
    InferError::internal("the model instance dropped the request without answering")
}
