//! The model repository: loading (with retries, at most `--model-load-thread-count` at once),
//! reloading (new versions ready before the old ones drain), unloading, polling for changes, and
//! starting each version's instances, rolled back when one fails. Ensembles' dependencies are
//! [`super::dependencies`]'s.

use super::overrides::{self, OverrideDir};
use super::resolve::{framework_model_file, gpu_inputs, instance_specs, resolve_in};
use super::rollback;
use super::*;

impl Server {
    /// The model directories in the repository, sorted.
    pub fn repository_models(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.core.opts.repository)
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
        let slots = Arc::new(tokio::sync::Semaphore::new(self.core.opts.load_threads.max(1)));
        let (names, ensembles) = dependencies::split(self, names);
        let loads: Vec<_> = names
            .into_iter()
            .map(|name| {
                let server = self.clone();
                let slots = slots.clone();
                tokio::spawn(async move {
                    let Ok(_slot) = slots.acquire().await else { return };
                    let mut tries = 0;
                    while let Err(e) = server.load(&name).await {
                        if tries >= server.core.opts.load_retries {
                            error!(model = %name, "{e}");
                            break;
                        }
                        tries += 1;
                        warn!(model = %name, "{e}; retrying ({tries} of {})", server.core.opts.load_retries);
                    }
                })
            })
            .collect();
        for load in loads {
            let _ = load.await;
        }
        dependencies::load_ensembles(self, ensembles).await;
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
        self.load_model_with_files(name, Some(config_json), Vec::new()).await
    }

    /// A client's load request with a `config` override and `file:<path>` files (Triton's load
    /// parameters): with files, the model is loaded from a new directory holding them (and need
    /// not be in the repository); files need a config. Refused unless model control is
    /// explicit, as in Triton.
    pub async fn load_model_with_files(
        &self,
        name: &str,
        config_json: Option<&str>,
        files: Vec<crate::types::ModelFile>,
    ) -> Result<(), InferError> {
        self.check_control()?;
        check_name(name).map_err(InferError::invalid)?;
        let config = config_json.map(|json| parse_config_override(name, json)).transpose()?;
        let dir = if files.is_empty() {
            None
        } else {
            let has_config = config.is_some();
            let name = name.to_string();
            // Writing files is blocking work; keep it off the runtime's threads.
            let written = tokio::task::spawn_blocking(move || overrides::write(&name, has_config, files))
                .await
                .map_err(|e| InferError::internal(format!("the file writer died: {e}")))??;
            Some(written)
        };
        self.load_with(name, config, dir).await
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

    pub(super) fn check_control(&self) -> Result<(), InferError> {
        if self.core.opts.explicit_control {
            Ok(())
        } else {
            Err(InferError::unavailable("explicit model load / unload is not allowed if polling is enabled"))
        }
    }

    /// Reloads models whose directory changed, loads new ones and unloads removed ones
    /// (`--model-control-mode poll`). A changed directory still being written (a file changed
    /// within [`SETTLE`]) is left for a later poll, and changes to what is not part of a model
    /// (`__pycache__`, `.git`, editors' swap files) are not changes.
    pub async fn poll_repository(&self) {
        let changes = self.repository_changes();
        for name in &changes.settling {
            info!(model = %name, "model directory is still being written; loading it at a later poll");
        }
        self.apply(changes).await;
    }

    /// [`Server::poll_repository`] on an operator's request (SIGHUP), when no later poll may
    /// come: a directory still being written is waited for (up to 10 s) rather than skipped.
    pub async fn rescan_repository(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut changes = self.repository_changes();
        while !changes.settling.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(SETTLE / 4).await;
            changes = self.repository_changes();
        }
        for name in &changes.settling {
            warn!(model = %name, "model directory still being written after 10 s; loading it anyway");
        }
        changes.changed.append(&mut changes.settling);
        self.apply(changes).await;
    }

    /// What changed in the repository since the models were loaded.
    fn repository_changes(&self) -> Changes {
        let on_disk = self.repository_models();
        let now = std::time::SystemTime::now();
        let models = self.models();
        let mut changes = Changes::default();
        for name in &on_disk {
            let snap = snapshot(&self.core.opts.repository.join(name));
            if models.get(name).is_some_and(|e| e.fingerprint == snap.hash) {
                continue;
            }
            if snap.settling(now) {
                changes.settling.push(name.clone());
            } else {
                changes.changed.push(name.clone());
            }
        }
        changes.removed =
            models.iter().filter(|(n, e)| e.wanted && !on_disk.contains(n)).map(|(n, _)| n.clone()).collect();
        changes
    }

    /// Unloads the removed models and (re)loads the changed ones.
    async fn apply(&self, changes: Changes) {
        for name in changes.removed {
            info!(model = %name, "model directory removed; unloading");
            let _ = self.unload(&name).await;
        }
        if !changes.changed.is_empty() {
            info!("repository changed: (re)loading {:?}", changes.changed);
            self.load_models(changes.changed).await;
        }
    }

    /// Loads (or reloads) a model. On reload the new versions are ready before the old ones drain.
    pub async fn load(&self, name: &str) -> Result<(), InferError> {
        self.load_with(name, None, None).await
    }

    /// Loads (or reloads) a model, with its config from `config` instead of the repository when
    /// it is given, and from the directory `files` instead of the repository's when given.
    pub(super) async fn load_with(
        &self,
        name: &str,
        config: Option<ModelConfig>,
        files: Option<OverrideDir>,
    ) -> Result<(), InferError> {
        check_name(name).map_err(InferError::invalid)?;
        let print = fingerprint(&self.core.opts.repository.join(name));
        {
            let mut models = self.models_mut();
            let entry = models.entry(name.to_string()).or_insert_with(|| Entry {
                fingerprint: 0,
                state: State::Loading,
                wanted: true,
                versions: BTreeMap::new(),
                gone: Vec::new(),
                standby: BTreeMap::new(),
                rolled_back: None,
            });
            entry.wanted = true;
            if entry.versions.is_empty() {
                entry.state = State::Loading;
            }
        }
        // An ensemble's step models load first.
        let steps = self.ensemble_dependencies(name).await;
        let (tx, rx) = oneshot::channel();
        let core = self.core.clone();
        let model = name.to_string();
        std::thread::Builder::new()
            .name(format!("load-{name}"))
            .spawn(move || {
                let _ = tx.send(steps.and_then(|steps| {
                    let cache = core.cache.get().cloned();
                    load_versions(&core, cache, &model, steps, config, files.map(Arc::new))
                }));
            })
            .map_err(|e| InferError::internal(format!("cannot start a loader thread: {e}")))?;
        let result = rx.await.unwrap_or(Err(LoadError::LoaderDied));
        self.core.load_progress.locked().remove(name);
        let (old, watch) = {
            let mut models = self.models_mut();
            let Some(entry) = models.get_mut(name) else {
                return Err(InferError::internal("model vanished while loading"));
            };
            entry.fingerprint = print;
            match result {
                Ok(versions) => {
                    entry.state = State::Ready;
                    entry.gone.clear();
                    entry.rolled_back = None;
                    // Versions an earlier update kept on standby go now.
                    let mut old: Vec<Arc<Version>> = std::mem::take(&mut entry.standby).into_values().collect();
                    let grace = update_grace(&versions).filter(|_| self.core.runtime.is_some());
                    let replaced = std::mem::replace(&mut entry.versions, versions);
                    let watch = match grace {
                        Some(grace) if !replaced.is_empty() && replaced.values().all(|v| v.ensemble.is_none()) => {
                            entry.standby = replaced;
                            Some((entry.versions.values().cloned().collect::<Vec<_>>(), grace))
                        }
                        _ => {
                            old.extend(replaced.into_values());
                            None
                        }
                    };
                    (old, watch)
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
        if let Some((new, grace)) = watch {
            info!(model = %name, "model ready; the previous version stays on standby for {grace:?}");
            rollback::watch_update(self.clone(), name.to_string(), new, grace);
        } else {
            info!(model = %name, "model ready");
        }
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
            let standby = std::mem::take(&mut entry.standby);
            std::mem::take(&mut entry.versions).into_values().chain(standby.into_values()).collect::<Vec<_>>()
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
}

/// The grace period of an update to `versions` (their instances' setting), unless it is zero
/// or they are ensembles (which have no instances to crash).
fn update_grace(versions: &BTreeMap<i64, Arc<Version>>) -> Option<Duration> {
    let first = versions.values().next()?;
    if first.ensemble.is_some() {
        return None;
    }
    let grace = first.ctx.settings.update_grace;
    (!grace.is_zero()).then_some(grace)
}

/// Retires `versions` at once (each drains, then finalizes its instances) and waits for all of
/// them. A list, not a map by version number: at shutdown every model's versions are retired
/// together, and many models have a version 1.
pub(super) async fn retire_all(versions: impl IntoIterator<Item = Arc<Version>>) {
    let versions: Vec<Arc<Version>> = versions.into_iter().collect();
    if versions.is_empty() {
        return;
    }
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new().name("retire".into()).spawn(move || {
        std::thread::scope(|s| {
            for v in &versions {
                s.spawn(|| v.retire());
            }
        });
        let _ = tx.send(());
    });
    if spawned.is_ok() {
        let _ = rx.await;
    }
}

/// A hash of every file's path, size and modification time under `dir`, without what is not
/// part of the model ([`not_model_content`]).
pub(super) fn fingerprint(dir: &Path) -> u64 {
    snapshot(dir).hash
}

/// How long a model directory must stay unchanged before poll mode loads it: one still being
/// copied or written is left for a later poll rather than loaded half-written.
pub(super) const SETTLE: Duration = Duration::from_secs(1);

/// What changed in the repository: model directories changed and settled, changed and still
/// being written, and removed.
#[derive(Default)]
struct Changes {
    changed: Vec<String>,
    settling: Vec<String>,
    removed: Vec<String>,
}

/// A model directory's contents as poll mode sees them.
pub(super) struct Snapshot {
    /// The hash of every model file's path, size and modification time.
    pub(super) hash: u64,
    /// The latest change (modification or status change, of a model file or a directory) seen.
    pub(super) latest: Option<std::time::SystemTime>,
}

impl Snapshot {
    /// Whether something in the directory changed within [`SETTLE`] of `now` (or is dated
    /// later than `now`, by less than that).
    pub(super) fn settling(&self, now: std::time::SystemTime) -> bool {
        self.latest.is_some_and(|t| match now.duration_since(t) {
            Ok(age) => age < SETTLE,
            Err(ahead) => ahead.duration() < SETTLE,
        })
    }
}

/// Reads `dir`'s [`Snapshot`].
pub(super) fn snapshot(dir: &Path) -> Snapshot {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    // The status change time too: a copy that keeps modification times (`cp -p`, `rsync -a`)
    // still changes it.
    let changed = |meta: &std::fs::Metadata| {
        let ctime = std::time::UNIX_EPOCH
            + Duration::from_secs(meta.ctime().max(0) as u64)
            + Duration::from_nanos(meta.ctime_nsec().clamp(0, 999_999_999) as u64);
        meta.modified().map_or(ctime, |m| m.max(ctime))
    };
    let mut files = Vec::new();
    let mut latest = std::fs::metadata(dir).ok().map(|m| changed(&m));
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let path = e.path();
            let Ok(meta) = e.metadata() else { continue };
            if not_model_content(&e.file_name().to_string_lossy(), meta.is_dir()) {
                continue;
            }
            latest = latest.max(Some(changed(&meta)));
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
    Snapshot { hash: h.finish(), latest }
}

/// Whether a directory entry is not part of a model, so that poll mode ignores it: Python's
/// caches, version control, and editors' swap, backup and lock files.
pub(super) fn not_model_content(name: &str, is_dir: bool) -> bool {
    if is_dir {
        return matches!(name, "__pycache__" | ".git" | ".hg" | ".svn" | ".ipynb_checkpoints" | ".mypy_cache");
    }
    name.ends_with(".swp")
        || name.ends_with(".swo")
        || name.ends_with(".swx")
        || name.ends_with('~')
        || name.ends_with(".pyc")
        || name.starts_with(".#")
        || (name.starts_with('#') && name.ends_with('#'))
        || name == "4913"
        || name == ".DS_Store"
}

/// Reads, completes and checks a model's config, then starts every instance of every version;
/// if any version fails, every version started is retired again.
pub(super) fn load_versions(
    core: &ServerCore,
    cache: Option<Arc<ResponseCache>>,
    name: &str,
    steps: Option<dependencies::StepConfigs>,
    config: Option<ModelConfig>,
    files: Option<Arc<OverrideDir>>,
) -> Result<BTreeMap<i64, Arc<Version>>, LoadError> {
    let load_start = Instant::now();
    let (opts, metrics) = (&core.opts, core.metrics.custom());
    let mut resolved = resolve_in(opts, name, config, files)?;
    resolved.cache = model_cache(name, &resolved.config, cache);
    // Each version's load time is the shared preparation plus the start of its own instances.
    let prepared = load_start.elapsed();
    if tritium_config::is_ensemble(&resolved.config) {
        let steps = steps.ok_or_else(|| LoadError::Ensemble(format!("ensemble '{name}' has no steps")))?;
        return dependencies::start_ensemble(opts, metrics, name, &resolved, steps, prepared);
    }
    let mut loaded = BTreeMap::new();
    for &v in &resolved.versions {
        match start_version(core, name, &resolved, v, prepared) {
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
pub(super) fn model_cache(name: &str, config: &ModelConfig, cache: Option<Arc<ResponseCache>>) -> Option<ModelCache> {
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

/// Step 4: spawns the instances of version `v` and waits until each is ready or failed (step 5);
/// a version with a failed instance is retired.
pub(super) fn start_version(
    core: &ServerCore,
    name: &str,
    r: &Resolved,
    v: i64,
    prepared: Duration,
) -> Result<Arc<Version>, LoadError> {
    let version_start = Instant::now();
    let (metrics, metric_options) = (core.metrics.custom(), &core.opts.metrics);
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
    let stats = Arc::new(Stats::for_metrics(name, v, metric_options, &r.config));
    let specs = instance_specs(&r.config);
    let rate_limits = match &core.opts.rate_limiter {
        Some(limiter) => crate::limiter::Members::new(
            specs
                .iter()
                .map(|s| Ok((s.name.clone(), limiter.register(s.rate_limiter.as_ref(), s.device_id)?)))
                .collect::<Result<_, LoadError>>()?,
        ),
        None => crate::limiter::Members::default(),
    };
    let names = specs.iter().map(|s| s.name.clone()).collect();
    let queue = match crate::sequence::Sequences::for_config(
        name,
        &r.config,
        names,
        r.settings.max_sequence_backlog,
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
        settings: r.settings.clone(),
        live_workers: AtomicUsize::new(0),
        instances: Mutex::new(Vec::new()),
        metrics: metrics.clone(),
        classes: r.classes.clone(),
        reshapes: crate::reshape::Reshapes::new(&r.config),
        gpu_inputs: gpu_inputs(&r.config),
        decoupled: tritium_config::is_decoupled(&r.config),
        calls: core.calls.clone(),
        runtime: core.runtime.clone(),
        warmup: r.warmup.clone(),
        rate_limits,
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
        _files: r.files.clone(),
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
pub(super) fn await_readiness(ready: &mpsc::Receiver<Result<(), String>>, expected: usize) -> Vec<String> {
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
pub(super) fn rollback(loaded: BTreeMap<i64, Arc<Version>>) {
    for version in loaded.into_values() {
        version.retire();
    }
}

/// Refuses model names that could escape the repository.
pub(super) fn check_name(name: &str) -> Result<(), String> {
    if name.contains('\\') {
        // A backslash is one of python_backend's invalid stub name characters: its text.
        return Err(format!(
            "invalid model name {name:?}: Invalid stub name: contains invalid characters (a model name may not hold \
             a backslash)"
        ));
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(format!("invalid model name {name:?}: a model name is one directory name inside the repository"));
    }
    Ok(())
}

#[cfg(test)]
mod poll_tests {
    use super::*;

    #[test]
    fn what_is_not_a_model_change() {
        for (name, is_dir) in [
            ("__pycache__", true),
            (".git", true),
            (".model.py.swp", false),
            ("model.py~", false),
            (".#model.py", false),
            ("#model.py#", false),
            ("4913", false),
            ("model.cpython-312.pyc", false),
        ] {
            assert!(not_model_content(name, is_dir), "{name}");
        }
        for (name, is_dir) in [("model.py", false), ("1", true), ("config.pbtxt", false), ("git", true)] {
            assert!(!not_model_content(name, is_dir), "{name}");
        }
    }

    #[test]
    fn ignored_files_leave_the_fingerprint_and_a_fresh_write_settles() {
        let dir = std::env::temp_dir().join(format!("tritium-poll-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("1/__pycache__")).expect("mkdir");
        std::fs::write(dir.join("1/model.py"), "x = 1\n").expect("write");
        let before = snapshot(&dir);
        std::fs::write(dir.join("1/.model.py.swp"), "swap").expect("write");
        std::fs::write(dir.join("1/__pycache__/model.pyc"), "cache").expect("write");
        std::fs::create_dir_all(dir.join(".git")).expect("mkdir");
        std::fs::write(dir.join(".git/HEAD"), "ref").expect("write");
        assert_eq!(snapshot(&dir).hash, before.hash);
        std::fs::write(dir.join("1/model.py"), "x = 22\n").expect("write");
        let after = snapshot(&dir);
        assert_ne!(after.hash, before.hash);
        let now = std::time::SystemTime::now();
        assert!(after.settling(now), "a file written just now is still being written");
        assert!(!after.settling(now + SETTLE + Duration::from_millis(10)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
