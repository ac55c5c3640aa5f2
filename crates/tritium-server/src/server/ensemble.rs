//! Ensembles (`platform: "ensemble"`, `ensemble_scheduling { step [...] }`), as Triton runs
//! them (core `ensemble_scheduler.cc`, `model_repository_manager.cc`).
//!
//! Loading: an ensemble's step models load first (in explicit model control too, as Triton's
//! polling chain does); a step model missing from the repository, failed, or without the
//! version a step asks for fails the ensemble with Triton's texts; then the ensemble is checked
//! against its steps' completed configs ([`tritium_config::check_steps`]). An ensemble has
//! version directories (they may be empty) and no model file, starts no stub, and is ready as
//! soon as it is loaded; a step model that goes away later fails the requests that reach it.
//!
//! Execution: a request's tensors are kept by name and *generation*. The request's inputs are
//! generation 0; a step runs once per generation in which all its inputs exist, and its
//! outputs join that generation, except a decoupled step's: each of its responses opens a new
//! generation, which drives the steps downstream of it again (Triton's iteration counts; the
//! decoupled rule checked at load keeps every step's inputs in one generation). Steps go
//! through [`Server::infer`] and [`Server::infer_decoupled`] (only the steps the requested outputs
//! need run, as in Triton), so step models keep their own
//! queues and statistics, and run concurrently where the graph allows. Tensors move between
//! steps as `Bytes` clones, never copied. The ensemble answers once a generation holds all its
//! requested outputs (in the order they were made, with the request's sequence id and flags as
//! parameters, as Triton answers); a decoupled ensemble streams one response per such generation
//! and a final flag at the end. A step's error ends the request with Triton's
//! `in ensemble '<name>', <the step's error>`.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc as tokio_mpsc;
use tritium_config::proto::ModelTransactionPolicy;

use super::*;
use crate::stats::ExecTimes;

/// The steps of a loaded ensemble, with their tensor names resolved.
pub(super) struct Ensemble {
    steps: Vec<Step>,
    /// Ensemble tensor name -> the steps that read it.
    consumers: HashMap<String, Vec<usize>>,
    /// The ensemble's optional inputs (absent ones still let their steps run).
    optional: Vec<String>,
}

impl Ensemble {
    /// The steps the tensors `wanted` need, directly or through the steps before them: Triton
    /// runs no other (a step whose outputs nobody asked for is not executed).
    fn needed(&self, wanted: &[RequestedOutput]) -> Vec<bool> {
        let mut needed = vec![false; self.steps.len()];
        let mut tensors: Vec<&str> = wanted.iter().map(|o| o.name.as_str()).collect();
        while let Some(tensor) = tensors.pop() {
            for (i, step) in self.steps.iter().enumerate() {
                if !needed[i] && step.outputs.values().any(|t| t == tensor) {
                    needed[i] = true;
                    tensors.extend(step.inputs.iter().map(|(_, t)| t.as_str()));
                }
            }
        }
        needed
    }
}

struct Step {
    model: String,
    version: Option<i64>,
    /// (step model input, ensemble tensor), sorted by input.
    inputs: Vec<(String, String)>,
    /// Step model output -> ensemble tensor.
    outputs: HashMap<String, String>,
    decoupled: bool,
}

/// The step models' configs an ensemble is checked against, in step order.
pub(super) type StepConfigs = Vec<Arc<ModelConfig>>;

/// A boxed future: the ensemble runs requests of its steps, which may be ensembles.
type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Server {
    /// The loaded ensemble version a request is for, if the model is an ensemble.
    pub(super) fn ensemble_of(&self, req: &InferRequest) -> Option<Arc<Version>> {
        self.route(&req.model, req.version).ok().filter(|v| v.ensemble.is_some())
    }

    /// Loads, before ensemble `name` itself, the step models it names that are not loaded,
    /// and returns their configs; `None` for a model that is not an ensemble. Boxed, as loading
    /// a step may load an ensemble again.
    pub(super) fn ensemble_dependencies(&self, name: &str) -> Boxed<Result<Option<StepConfigs>, LoadError>> {
        let server = self.clone();
        let name = name.to_string();
        Box::pin(async move { server.dependencies(&name).await })
    }

    async fn dependencies(&self, name: &str) -> Result<Option<StepConfigs>, LoadError> {
        let dir = self.inner.opts.repository.join(name);
        let cfg = self.inner.opts.config_name.as_deref();
        let Ok(Some(config)) = tritium_config::load_config_named(&dir, cfg) else { return Ok(None) };
        let Some(scheduling) = tritium_config::ensemble_scheduling(&config) else { return Ok(None) };
        if !tritium_config::is_ensemble(&config) {
            return Ok(None);
        }
        let mut names: Vec<&str> = scheduling.step.iter().map(|s| s.model_name.as_str()).collect();
        names.sort();
        names.dedup();
        let on_disk = self.repository_models();
        let missing: Vec<&str> =
            names.iter().copied().filter(|n| !n.is_empty() && !on_disk.iter().any(|d| d == n)).collect();
        if !missing.is_empty() {
            return Err(LoadError::Ensemble(format!(
                "ensemble {name} contains models that are not available or ambiguous: {}",
                missing.join(", ")
            )));
        }
        if let Some(cycle) = ensemble_cycle(&self.inner.opts.repository, name, self.inner.opts.config_name.as_deref()) {
            // Each ensemble of the cycle would wait for the other: Triton leaves them unloaded.
            return Err(LoadError::Ensemble(format!(
                "ensemble '{name}' depends on itself through its steps: {}",
                cycle.join(" -> ")
            )));
        }
        for step in names.iter().filter(|n| !n.is_empty()) {
            self.await_loaded(step).await;
        }
        let models = self.models();
        let mut configs = Vec::new();
        for step in &scheduling.step {
            let s = &step.model_name;
            let entry = models.get(s.as_str());
            let loaded = entry.filter(|e| !e.versions.is_empty());
            let Some(entry) = loaded else {
                let reason = match entry.map(|e| &e.state) {
                    Some(State::Unavailable(r)) => format!(" Model '{s}' loading failed with error: {r}"),
                    _ => String::new(),
                };
                return Err(LoadError::Ensemble(format!(
                    "ensemble '{name}' depends on '{s}' which has no loaded version.{reason}"
                )));
            };
            // As in Triton, a step without `model_version` asks for version 0; -1 is the latest.
            let version = if step.model_version >= 0 {
                entry.versions.get(&step.model_version)
            } else {
                entry.versions.values().next_back()
            };
            let Some(version) = version else {
                return Err(LoadError::Ensemble(format!(
                    "ensemble '{name}' depends on '{s}' whose required version {} is not loaded.",
                    step.model_version
                )));
            };
            configs.push(version.config.clone());
        }
        Ok(Some(configs))
    }

    /// Unloads `name` and then, if it is an ensemble, the models of its steps that no other
    /// loaded ensemble uses, each the same way (Triton's `unload_dependents`). Boxed, as it
    /// recurses through ensembles of ensembles.
    pub(super) fn unload_with_dependents(&self, name: &str) -> Boxed<Result<(), InferError>> {
        let server = self.clone();
        let name = name.to_string();
        Box::pin(async move {
            let uses = |plan: &Ensemble, model: &str| plan.steps.iter().any(|s| s.model == model);
            let mut steps: Vec<String> = server
                .models()
                .get(&name)
                .and_then(|e| e.versions.values().next_back().and_then(|v| v.ensemble.clone()))
                .map(|plan| plan.steps.iter().map(|s| s.model.clone()).collect())
                .unwrap_or_default();
            steps.sort();
            steps.dedup();
            server.unload(&name).await?;
            for step in steps {
                let (loaded, used_elsewhere) = {
                    let models = server.models();
                    let loaded = models.get(&step).is_some_and(|e| !e.versions.is_empty());
                    let used = models.iter().any(|(n, e)| {
                        *n != step && e.versions.values().any(|v| v.ensemble.as_deref().is_some_and(|p| uses(p, &step)))
                    });
                    (loaded, used)
                };
                if loaded && !used_elsewhere {
                    server.unload_with_dependents(&step).await?;
                } else if used_elsewhere {
                    info!(model = %step, "kept loaded: another loaded ensemble uses it");
                }
            }
            Ok(())
        })
    }

    /// After model `name` was loaded (`loaded`) or unloaded, the ensembles that use it are
    /// checked again, as Triton's dependency graph does: reloaded against the new model, or made
    /// unavailable with the reason. Boxed, as it loads models.
    pub(super) fn refresh_dependents(&self, name: &str, loaded: bool) -> Boxed<()> {
        let server = self.clone();
        let name = name.to_string();
        Box::pin(async move {
            let repo = server.inner.opts.repository.clone();
            let cfg = server.inner.opts.config_name.clone();
            let dependents: Vec<String> = server
                .models()
                .iter()
                .filter(|(n, e)| **n != name && e.wanted && e.state != State::Loading)
                .filter(|(n, e)| match e.versions.values().next_back() {
                    // A loaded model: only an ensemble has steps.
                    Some(v) => v.ensemble.as_ref().is_some_and(|plan| plan.steps.iter().any(|s| s.model == name)),
                    // A failed one may be an ensemble that waits for this model.
                    None => step_models(&repo.join(n), cfg.as_deref()).contains(&name),
                })
                .map(|(n, _)| n.clone())
                .collect();
            for ensemble in dependents {
                if loaded {
                    if let Err(e) = server.load(&ensemble).await {
                        error!(model = %ensemble, "{e}");
                    }
                    continue;
                }
                let reason = format!("ensemble '{ensemble}' depends on '{name}' which has no loaded version.");
                info!(model = %ensemble, "{reason}");
                let old = {
                    let mut models = server.models_mut();
                    let Some(entry) = models.get_mut(&ensemble) else { continue };
                    entry.state = State::Unavailable(reason);
                    std::mem::take(&mut entry.versions)
                };
                retire_all(old).await;
                server.refresh_dependents(&ensemble, false).await;
            }
        })
    }

    /// Loads step model `name` unless it is loaded or being loaded; waits for a load under way.
    async fn await_loaded(&self, name: &str) {
        let load = {
            let models = self.models();
            models.get(name).is_none_or(|e| !e.wanted)
        };
        if load {
            let _ = self.load(name).await;
            return;
        }
        // Another task loads it (the repository's first load runs models concurrently).
        while self.models().get(name).is_some_and(|e| e.state == State::Loading) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The step models of the ensemble in `dir`, from its config.pbtxt alone (none for a model that
/// is not an ensemble).
fn step_models(dir: &Path, config_name: Option<&str>) -> Vec<String> {
    match tritium_config::load_config_named(dir, config_name) {
        Ok(Some(c)) if tritium_config::is_ensemble(&c) => tritium_config::ensemble_scheduling(&c)
            .map(|e| e.step.iter().map(|s| s.model_name.clone()).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// A chain of ensembles in `repository` that leads from `name` back to itself, if any.
fn ensemble_cycle(repository: &Path, name: &str, config_name: Option<&str>) -> Option<Vec<String>> {
    fn walk(repository: &Path, cfg: Option<&str>, path: &mut Vec<String>, done: &mut HashSet<String>) -> bool {
        let Some(last) = path.last().cloned() else { return false };
        for step in step_models(&repository.join(&last), cfg) {
            if step == path[0] {
                path.push(step);
                return true;
            }
            if step.is_empty() || path.contains(&step) || !done.insert(step.clone()) {
                continue;
            }
            path.push(step);
            if walk(repository, cfg, path, done) {
                return true;
            }
            path.pop();
        }
        false
    }
    let mut path = vec![name.to_string()];
    walk(repository, config_name, &mut path, &mut HashSet::new()).then_some(path)
}

/// Whether the model in `dir` is an ensemble, from its config.pbtxt alone.
pub(super) fn is_ensemble_dir(dir: &Path, config_name: Option<&str>) -> bool {
    matches!(tritium_config::load_config_named(dir, config_name), Ok(Some(c)) if tritium_config::is_ensemble(&c))
}

/// Splits models to load into (others, ensembles): ensembles load after the models they use.
pub(super) fn split(server: &Server, names: Vec<String>) -> (Vec<String>, Vec<String>) {
    let repo = &server.inner.opts.repository;
    let cfg = server.inner.opts.config_name.as_deref();
    let (ensembles, others) = names.into_iter().partition(|n| is_ensemble_dir(&repo.join(n), cfg));
    (others, ensembles)
}

/// Loads ensembles one by one, after the other models (each loads the steps it still misses);
/// an ensemble loaded already as another ensemble's step is not loaded twice.
pub(super) async fn load_ensembles(server: &Server, ensembles: Vec<String>) {
    let repo = server.inner.opts.repository.clone();
    for name in ensembles {
        let current = server
            .models()
            .get(&name)
            .is_some_and(|e| e.wanted && e.state == State::Ready && e.fingerprint == fingerprint(&repo.join(&name)));
        if current {
            continue;
        }
        if let Err(e) = server.load(&name).await {
            error!(model = %name, "{e}");
        }
    }
}

/// Starts the versions of ensemble `name` (no stub, no instance): checks the ensemble against
/// its steps, and notes whether it is decoupled in its config, as Triton does.
pub(super) fn start(
    opts: &ServerOptions,
    metrics: &tritium_metrics::CustomMetrics,
    bls: &crate::bls::Hook,
    name: &str,
    r: &Resolved,
    steps: StepConfigs,
    prepared: Duration,
) -> Result<BTreeMap<i64, Arc<Version>>, LoadError> {
    let start = Instant::now();
    let step_refs: Vec<&ModelConfig> = steps.iter().map(Arc::as_ref).collect();
    let decoupled = tritium_config::check_steps(&r.config, &step_refs)?;
    let mut config = (*r.config).clone();
    config.model_transaction_policy = Some(ModelTransactionPolicy { decoupled });
    let config_json = tritium_config::to_json(&config).to_string();
    let scheduling = tritium_config::ensemble_scheduling(&config).cloned().unwrap_or_default();
    let mut plan = Ensemble { steps: Vec::new(), consumers: HashMap::new(), optional: Vec::new() };
    for (i, (step, model)) in scheduling.step.iter().zip(&steps).enumerate() {
        let mut inputs: Vec<(String, String)> = step.input_map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        inputs.sort();
        for (_, tensor) in &inputs {
            plan.consumers.entry(tensor.clone()).or_default().push(i);
        }
        plan.steps.push(Step {
            model: step.model_name.clone(),
            version: (step.model_version >= 0).then_some(step.model_version),
            inputs,
            outputs: step.output_map.clone(),
            decoupled: is_decoupled(model),
        });
    }
    plan.optional = config.input.iter().filter(|i| i.optional).map(|i| i.name.clone()).collect();
    let config = Arc::new(config);
    let plan = Arc::new(plan);
    let mut versions = BTreeMap::new();
    for &v in &r.versions {
        let stats = Arc::new(Stats::for_metrics(name, v, &opts.metrics));
        let ctx = Arc::new(VersionContext {
            model: name.to_string(),
            version: v,
            model_file: r.dir.join(v.to_string()),
            model_dir: r.dir.clone(),
            config_json: config_json.clone(),
            queue: Arc::new(Queue::new(None, r.priorities.clone(), stats.clone())),
            stats,
            stub: opts.stub.clone(),
            supervision: r.supervision.clone(),
            live_workers: AtomicUsize::new(0),
            instances: Mutex::new(Vec::new()),
            metrics: metrics.clone(),
            classes: r.classes.clone(),
            // The ensemble's own reshapes: its inputs go to the steps, and its outputs to the
            // client, reshaped as a model's (Triton normalizes an ensemble's requests too).
            reshapes: crate::reshape::Reshapes::new(&config),
            gpu_inputs: false,
            decoupled,
            bls: bls.clone(),
            warmup: Arc::default(),
        });
        let version = Version {
            config: config.clone(),
            ctx,
            workers: Mutex::new(Vec::new()),
            load_duration: prepared + start.elapsed(),
            ensemble: Some(plan.clone()),
            cache: None,
        };
        versions.insert(v, Arc::new(version));
    }
    Ok(versions)
}

/// The error a unary call of a decoupled model gets, or a streamed call of one that is not.
fn check_policy(version: &Version, req: &InferRequest, decoupled: bool) -> Result<(), InferError> {
    if version.ctx.decoupled == decoupled {
        return Ok(());
    }
    Err(transaction_mismatch(&req.model, decoupled))
}

/// Checks a request against the ensemble's config, as any model's; counts a refusal.
fn admit(version: &Version, req: &InferRequest) -> Result<Validated, InferError> {
    let start = Instant::now();
    let limit = version.ctx.supervision.max_request_metadata_bytes;
    check_metadata(req, &req.model, limit).and_then(|()| validate(req, &version.config)).inspect_err(|e| {
        version.ctx.stats.failure(start.elapsed(), e.kind, false);
    })
}

/// Runs a request on an ensemble that is not decoupled.
pub(super) fn infer(
    server: Server,
    version: Arc<Version>,
    req: InferRequest,
) -> Boxed<Result<InferResponse, InferError>> {
    Box::pin(async move {
        check_policy(&version, &req, false)?;
        let checked = admit(&version, &req)?;
        let (tx, mut rx) = crate::types::response_stream();
        run(server, version, req, checked, tx).await;
        loop {
            match rx.recv().await {
                Some(Streamed::Response { result, .. }) => return result,
                Some(Streamed::Final) => continue,
                None => return Err(dropped()),
            }
        }
    })
}

/// Starts a request on a decoupled ensemble; its responses come on the returned stream.
pub(super) fn infer_decoupled(
    server: &Server,
    version: Arc<Version>,
    req: InferRequest,
) -> Result<ResponseStream, InferError> {
    check_policy(&version, &req, true)?;
    let checked = admit(&version, &req)?;
    let (tx, rx) = crate::types::response_stream();
    tokio::spawn(run(server.clone(), version, req, checked, tx));
    Ok(rx)
}

/// Starts a request of an ensemble of either kind with its answers on `tx` (the last one
/// final): the path of BLS calls, whose caller already checked the transaction policy.
pub(super) fn start_on(
    server: &Server,
    version: Arc<Version>,
    req: InferRequest,
    tx: crate::types::StreamTx,
) -> Result<(), InferError> {
    let checked = admit(&version, &req)?;
    tokio::spawn(run(server.clone(), version, req, checked, tx));
    Ok(())
}

/// What a running step reports to its ensemble request.
enum Event {
    /// One response of step `step`, run in generation `gen`.
    Response { step: usize, gen: u64, response: InferResponse },
    /// The step failed.
    Error(InferError),
    /// The step sent its last response.
    Done,
}

/// One ensemble request, from its inputs to its last response on `tx`.
async fn run(server: Server, version: Arc<Version>, req: InferRequest, checked: Validated, tx: crate::types::StreamTx) {
    let start = Instant::now();
    let Some(plan) = version.ensemble.clone() else { return };
    let name = version.ctx.model.clone();
    let wanted: Vec<RequestedOutput> = checked.outputs;
    let needed = plan.needed(&wanted);
    // Each tensor of a generation with the order it was made in: the ensemble's outputs are
    // answered in that order, as Triton's are (not in the config's).
    let mut made = 0u64;
    let mut order: HashMap<(String, u64), u64> = HashMap::new();
    let mut tensors: HashMap<(String, u64), Option<InputTensor>> = HashMap::new();
    let mut updated: Vec<(String, u64)> = Vec::new();
    for input in &req.inputs {
        let mut input = input.clone();
        version.ctx.reshapes.input(&input.name, &mut input.shape);
        updated.push((input.name.clone(), 0));
        tensors.insert((input.name.clone(), 0), Some(input));
    }
    for name in &plan.optional {
        if let std::collections::hash_map::Entry::Vacant(slot) = tensors.entry((name.clone(), 0)) {
            slot.insert(None);
            updated.push((name.clone(), 0));
        }
    }
    let (events, mut incoming) = tokio_mpsc::unbounded_channel::<Event>();
    let mut fired: HashSet<(usize, u64)> = HashSet::new();
    let mut answered: HashSet<u64> = HashSet::new();
    let mut inflight = 0usize;
    let mut generations = 0u64;
    let mut responses = 0usize;
    let fail = |e: InferError| {
        let e = InferError::new(e.kind, format!("in ensemble '{name}', {}", e.message));
        // Triton counts an ensemble's failure with reason OTHER.
        version.ctx.stats.failure(start.elapsed(), ErrorKind::Internal, false);
        tx.send(Streamed::Response { result: Err(e), last: true });
    };
    loop {
        let mut gens: Vec<u64> = Vec::new();
        for (tensor, gen) in std::mem::take(&mut updated) {
            if !gens.contains(&gen) {
                gens.push(gen);
            }
            for &s in plan.consumers.get(&tensor).map(Vec::as_slice).unwrap_or_default() {
                let step = &plan.steps[s];
                if !needed[s]
                    || fired.contains(&(s, gen))
                    || !step.inputs.iter().all(|(_, t)| tensors.contains_key(&(t.clone(), gen)))
                {
                    continue;
                }
                fired.insert((s, gen));
                inflight += 1;
                let inputs = step
                    .inputs
                    .iter()
                    .filter_map(|(input, t)| {
                        let tensor = tensors.get(&(t.clone(), gen))?.as_ref()?;
                        Some(InputTensor { name: input.clone(), ..tensor.clone() })
                    })
                    .collect();
                let step_req = InferRequest {
                    model: step.model.clone(),
                    version: step.version,
                    id: req.id.clone(),
                    inputs,
                    outputs: step.outputs.keys().map(RequestedOutput::named).collect(),
                    parameters: req.parameters.clone(),
                    correlation_id: req.correlation_id.clone(),
                    flags: req.flags,
                    timeout_us: req.timeout_us,
                    priority: req.priority,
                    // Each step is traced on its own, in the client's trace when it sent one.
                    trace: req.trace,
                };
                // A decoupled ensemble's client holds its decoupled steps back (a step's
                // response becomes, through the steps after it, one of the ensemble's).
                let hold = version.ctx.decoupled.then(|| (tx.clone(), version.ctx.supervision.max_inflight_responses));
                launch(&server, s, gen, step.decoupled, step_req, events.clone(), hold);
            }
        }
        for gen in gens {
            if answered.contains(&gen) {
                continue;
            }
            let ready: Option<Vec<&InputTensor>> =
                wanted.iter().map(|o| tensors.get(&(o.name.clone(), gen)).and_then(Option::as_ref)).collect();
            let Some(ready) = ready else { continue };
            answered.insert(gen);
            let mut ready: Vec<(&InputTensor, &RequestedOutput)> = ready.into_iter().zip(&wanted).collect();
            ready.sort_by_key(|(_, o)| order.get(&(o.name.clone(), gen)).copied().unwrap_or(0));
            let mut outputs = Vec::new();
            for (t, o) in ready {
                let mut output = OutputTensor {
                    name: o.name.clone(),
                    datatype: t.datatype,
                    shape: t.shape.clone(),
                    data: Vec::from(t.data.clone()),
                };
                version.ctx.reshapes.output(&output.name, &mut output.shape);
                match o.classification {
                    Some(k) => match version.ctx.classes.classify(&output, k) {
                        Ok(c) => outputs.push(c),
                        Err(e) => return fail(e.into()),
                    },
                    None => outputs.push(output),
                }
            }
            let response = InferResponse {
                model: name.clone(),
                version: version.ctx.version,
                id: req.id.clone(),
                outputs,
                parameters: sequence_parameters(&req),
            };
            responses += 1;
            if !version.ctx.decoupled {
                // One response: the ensemble is done once it is complete.
                version.ctx.stats.success(checked.batch_size, start.elapsed(), Duration::ZERO, zero_times());
                version.ctx.stats.execution(checked.batch_size.max(1), zero_times());
                tx.send(Streamed::Response { result: Ok(response), last: true });
                return;
            }
            if !tx.send(Streamed::Response { result: Ok(response), last: false }) {
                // The client went away: dropping `incoming` cancels the steps.
                version.ctx.stats.failure(start.elapsed(), ErrorKind::Cancelled, false);
                return;
            }
        }
        if inflight == 0 {
            break;
        }
        let Some(event) = incoming.recv().await else { break };
        match event {
            Event::Response { step, gen, response } => {
                let gen = if plan.steps[step].decoupled {
                    generations += 1;
                    generations
                } else {
                    gen
                };
                for out in response.outputs {
                    let Some(tensor) = plan.steps[step].outputs.get(&out.name) else { continue };
                    let data = Bytes::from(out.data);
                    let input = InputTensor { name: tensor.clone(), datatype: out.datatype, shape: out.shape, data };
                    made += 1;
                    order.insert((tensor.clone(), gen), made);
                    tensors.insert((tensor.clone(), gen), Some(input));
                    updated.push((tensor.clone(), gen));
                }
            }
            Event::Error(e) => return fail(e),
            Event::Done => inflight -= 1,
        }
    }
    if responses == 0 && !version.ctx.decoupled {
        let log = if req.id.is_empty() { "<id_unknown>" } else { &req.id };
        return fail(InferError::invalid(format!(
            "[request id: {log}] unexpected deadlock, at least one output is not set while no more ensemble steps can \
             be made"
        )));
    }
    version.ctx.stats.success(checked.batch_size, start.elapsed(), Duration::ZERO, zero_times());
    version.ctx.stats.execution(checked.batch_size.max(1), zero_times());
    tx.send(Streamed::Final);
}

/// The parameters Triton puts on every response of an ensemble: the request's sequence id (0
/// without one) and its sequence start and end flags.
fn sequence_parameters(req: &InferRequest) -> Vec<(String, ParamValue)> {
    let id = match &req.correlation_id {
        CorrelationId::None => ParamValue::Int(0),
        CorrelationId::U64(v) => i64::try_from(*v).map_or_else(|_| ParamValue::Str(v.to_string()), ParamValue::Int),
        CorrelationId::Str(s) => ParamValue::Str(s.clone()),
    };
    vec![
        ("sequence_id".to_string(), id),
        ("sequence_start".to_string(), ParamValue::Bool(req.flags & crate::types::FLAG_SEQUENCE_START != 0)),
        ("sequence_end".to_string(), ParamValue::Bool(req.flags & crate::types::FLAG_SEQUENCE_END != 0)),
    ]
}

fn zero_times() -> ExecTimes {
    ExecTimes { compute_input: Duration::ZERO, compute_infer: Duration::ZERO, compute_output: Duration::ZERO }
}

/// Sends one step's request through the server's own routing, in a task that reports its
/// responses on `events`; a step that fails to start reports its error at once. With `hold`
/// (the ensemble's own stream and window), a decoupled step's next response is taken only while
/// the responses taken from it are less than a window ahead of what the ensemble's client took,
/// so the step model is held back by the ensemble's client.
fn launch(
    server: &Server,
    step: usize,
    gen: u64,
    decoupled: bool,
    req: InferRequest,
    events: tokio_mpsc::UnboundedSender<Event>,
    hold: Option<(crate::types::StreamTx, u32)>,
) {
    if decoupled {
        let mut stream = match server.infer_decoupled(req) {
            Ok(stream) => stream,
            Err(e) => {
                let _ = events.send(Event::Error(e));
                return;
            }
        };
        tokio::spawn(async move {
            loop {
                if let Some((out, window)) = hold.as_ref().filter(|(_, w)| *w > 0) {
                    out.wait_taken((stream.taken() + 1).saturating_sub(u64::from(*window))).await;
                }
                let Some(message) = stream.recv().await else { break };
                let last = message.is_last();
                let sent = match message {
                    Streamed::Response { result: Ok(response), .. } => {
                        events.send(Event::Response { step, gen, response })
                    }
                    Streamed::Response { result: Err(e), .. } => {
                        let _ = events.send(Event::Error(e));
                        return;
                    }
                    Streamed::Final => Ok(()),
                };
                // The ensemble request is over: dropping the stream cancels the step.
                if sent.is_err() {
                    return;
                }
                if last {
                    break;
                }
            }
            let _ = events.send(Event::Done);
        });
    } else {
        let server = server.clone();
        tokio::spawn(async move {
            match server.infer(req).await {
                Ok(response) => {
                    let _ = events.send(Event::Response { step, gen, response });
                    let _ = events.send(Event::Done);
                }
                Err(e) => {
                    let _ = events.send(Event::Error(e));
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_not_an_ensemble() {
        assert!(!is_ensemble_dir(Path::new("/nonexistent/tritium/ensemble"), None));
    }

    fn write_ensemble(repo: &Path, name: &str, steps: &[&str]) {
        let steps: Vec<String> = steps
            .iter()
            .map(|s| format!(r#"{{ model_name: "{s}" input_map {{ key: "IN" value: "X" }} output_map {{ key: "OUT" value: "Y" }} }}"#))
            .collect();
        let config = format!(
            r#"platform: "ensemble"
            input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
            output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
            ensemble_scheduling {{ step [ {} ] }}"#,
            steps.join(", ")
        );
        std::fs::create_dir_all(repo.join(name).join("1")).expect("model dir");
        std::fs::write(repo.join(name).join("config.pbtxt"), config).expect("config");
    }

    #[test]
    fn cycles_of_ensembles_are_found_and_plain_graphs_are_not() {
        let repo = std::env::temp_dir().join(format!("tritium-ensemble-cycle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&repo);
        write_ensemble(&repo, "a", &["b", "plain"]);
        write_ensemble(&repo, "b", &["c"]);
        write_ensemble(&repo, "c", &["a"]);
        write_ensemble(&repo, "self", &["self"]);
        write_ensemble(&repo, "d", &["b2", "b2"]);
        write_ensemble(&repo, "b2", &["plain"]);
        assert_eq!(ensemble_cycle(&repo, "a", None), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
        assert_eq!(ensemble_cycle(&repo, "self", None), Some(vec!["self".into(), "self".into()]));
        assert_eq!(ensemble_cycle(&repo, "d", None), None);
        assert!(is_ensemble_dir(&repo.join("d"), None));
        assert_eq!(step_models(&repo.join("d"), None), ["b2", "b2"]);
        let _ = std::fs::remove_dir_all(&repo);
    }
}
