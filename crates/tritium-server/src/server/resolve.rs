//! Resolving a model before it loads, as pure functions of the server's options and the model
//! directory: its config (read or overridden, auto-completed, normalized, checked against the
//! limits), its backend and model file, its versions, and its instance settings.

use super::*;

/// The server-wide instance settings with the model's `parameters` overrides applied.
pub(super) fn settings_for(base: &InstanceSettings, config: &ModelConfig) -> Result<InstanceSettings, LoadError> {
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
    if let Some(d) = secs("model_update_grace_secs")? {
        sup.update_grace = d;
    }
    if let Some(p) = config.parameters.get("stub_restart_limit") {
        sup.restart_limit = p.string_value.trim().parse().map_err(|_| {
            LoadError::Parameter(format!(
                "parameter \"stub_restart_limit\" must be a whole number, got {:?}",
                p.string_value
            ))
        })?;
    }
    for (key, limit) in [("stub_max_rss_bytes", &mut sup.max_rss_bytes), ("stub_max_requests", &mut sup.max_requests)] {
        if let Some(p) = config.parameters.get(key) {
            let n: u64 = p.string_value.trim().parse().map_err(|_| {
                LoadError::Parameter(format!(
                    "parameter {key:?} must be a whole number (0 for no limit), got {:?}",
                    p.string_value
                ))
            })?;
            *limit = (n > 0).then_some(n);
        }
    }
    Ok(sup)
}

/// Finds the newest numeric version directory, for auto-completion before the policy is known.
pub(super) fn newest_version_dir(dir: &Path) -> Option<i64> {
    std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i64>().ok()).max()
}

/// Runs the model's `auto_complete_config` in a short-lived stub.
pub(super) fn auto_complete(
    opts: &ServerOptions,
    stub: &StubCommand,
    name: &str,
    model_file: &Path,
    config: &ModelConfig,
) -> Result<ModelConfig, LoadError> {
    let timeout = opts.instance_settings.init_timeout;
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
    /// The rate limiter cannot run an instance (`--rate-limit execution_count`).
    #[error("{0}")]
    RateLimit(#[from] crate::limiter::LimitError),
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
pub(super) struct Resolved {
    pub(super) dir: PathBuf,
    /// A Python-based backend's `model.py`, run instead of each version's own model file.
    pub(super) backend_model: Option<PathBuf>,
    pub(super) config: Arc<ModelConfig>,
    pub(super) config_json: String,
    pub(super) settings: InstanceSettings,
    pub(super) batching: Option<Batching>,
    pub(super) priorities: Priorities,
    pub(super) classes: Classes,
    pub(super) versions: Vec<i64>,
    /// How this model's stubs start: the server's interpreter, or its own environment's.
    pub(super) stub: StubCommand,
    /// The response cache, when the model enables it and the server has one.
    pub(super) cache: Option<ModelCache>,
    /// The warmup samples every instance runs before it is ready.
    pub(super) warmup: Arc<Vec<crate::warmup::Sample>>,
    /// The directory written from the load request's files, which stands for `dir`'s model
    /// directory in the repository (and is `dir`).
    pub(super) files: Option<Arc<super::overrides::OverrideDir>>,
}

/// A load request's `config` parameter as a model config: Triton's JSON form of `ModelConfig`. A
/// name other than the model's is refused (an empty one is the model's).
pub(super) fn parse_config_override(name: &str, json: &str) -> Result<ModelConfig, InferError> {
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
#[cfg(test)]
pub(super) fn resolve(opts: &ServerOptions, name: &str, config: Option<ModelConfig>) -> Result<Resolved, LoadError> {
    resolve_in(opts, name, config, None)
}

/// [`resolve`], with the model directory written from a load request's files instead of the
/// repository's when `files` is given.
pub(super) fn resolve_in(
    opts: &ServerOptions,
    name: &str,
    config: Option<ModelConfig>,
    files: Option<Arc<super::overrides::OverrideDir>>,
) -> Result<Resolved, LoadError> {
    let dir = files.as_ref().map_or_else(|| opts.repository.join(name), |f| f.path().to_path_buf());
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
    // A model that opts out of the fork server (`FORK_SERVER: "false"`) starts its stubs plainly.
    if config.parameters.get("FORK_SERVER").is_some_and(|p| p.string_value.trim().eq_ignore_ascii_case("false")) {
        stub.env.push((tritium_host::NO_FORK_SERVER_ENV.into(), "1".into()));
    }
    tritium_config::resolve_instance_groups(&mut config, &opts.gpus)?;
    if framework.is_none() && !tritium_config::is_ensemble(&config) {
        check_stub_names(&config)?;
    }
    // Before anything is sized by the config: it may be a client's load override.
    opts.limits.check(&config)?;
    check_model_filename(&config, name)?;
    let policy = config.version_policy.clone().unwrap_or_default();
    let versions = tritium_config::model_versions(&dir, &policy)?;
    if versions.is_empty() {
        return Err(LoadError::NoVersions(dir.display().to_string()));
    }
    let settings = settings_for(&opts.instance_settings, &config)?;
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
        settings,
        batching,
        priorities,
        classes,
        versions,
        stub,
        cache: None,
        warmup: Arc::new(warmup),
        files,
    })
}

/// Step 2: the model file whose `auto_complete_config` runs, if it should: the newest version's,
/// when the model has no `config.pbtxt` or its file mentions `auto_complete_config`.
pub(super) fn auto_complete_file(dir: &Path, config: &ModelConfig, has_file: bool) -> Option<PathBuf> {
    let filename = if config.default_model_filename.is_empty() { "model.py" } else { &config.default_model_filename };
    let file = dir.join(newest_version_dir(dir)?.to_string()).join(filename);
    mentions_auto_complete(&file, has_file).then_some(file)
}

/// Whether `auto_complete_config` in `file` should run: always without a `config.pbtxt`,
/// otherwise when the file mentions it.
pub(super) fn mentions_auto_complete(file: &Path, has_file: bool) -> bool {
    !has_file || std::fs::read_to_string(file).map(|s| s.contains("auto_complete_config")).unwrap_or(false)
}

/// `default_model_filename` names a file inside each version directory, nothing else.
pub(super) fn check_model_filename(config: &ModelConfig, name: &str) -> Result<(), LoadError> {
    let file = &config.default_model_filename;
    if file.is_empty() || crate::confine::is_plain_name(file) {
        return Ok(());
    }
    Err(LoadError::Parameter(format!(
        "default_model_filename '{file}' of model '{name}' is not a file name: it names the model file inside each \
         version directory (such as model.py or model.onnx), without any directory"
    )))
}

/// Characters a Python model's instance (stub) name may not hold (python_backend's
/// `INVALID_CHARS`: shell metacharacters).
const INVALID_STUB_CHARS: &[char] =
    &[';', '|', '&', '$', '`', '<', '>', '(', ')', '[', ']', '{', '}', '\\', '"', '\'', '*', '?', '~', '#', '!'];

/// Refuses instance groups whose stubs' names hold shell metacharacters, with python_backend's
/// text (a model's name is its groups' default name).
pub(super) fn check_stub_names(config: &ModelConfig) -> Result<(), LoadError> {
    if config.instance_group.iter().any(|g| g.name.contains(INVALID_STUB_CHARS)) {
        return Err(LoadError::Parameter("Invalid stub name: contains invalid characters".into()));
    }
    Ok(())
}

/// The framework of a config-less model (or one whose config names neither backend nor
/// platform), from the files of its newest version directory: none when it has a `model.py`.
pub(super) fn detect_framework(dir: &Path) -> Option<Framework> {
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
pub(super) fn framework_model_file(version_dir: &Path, config: &ModelConfig, framework: Framework) -> PathBuf {
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
pub(super) fn python_based_backend(opts: &ServerOptions, config: &ModelConfig) -> Result<Option<PathBuf>, LoadError> {
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
pub(super) fn gpu_inputs(config: &ModelConfig) -> bool {
    config
        .parameters
        .get("FORCE_CPU_ONLY_INPUT_TENSORS")
        .is_some_and(|p| p.string_value.trim().eq_ignore_ascii_case("no"))
}

/// Step 3: dynamic batching, for a batching model with `dynamic_batching`.
pub(super) fn batching_for(config: &ModelConfig) -> Option<Batching> {
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
pub(super) fn instance_specs(config: &ModelConfig) -> Vec<InstanceSpec> {
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
                    rate_limiter: group.rate_limiter.clone(),
                });
                k += 1;
            }
        }
    }
    specs
}

pub(super) fn kind_name(kind: i32) -> &'static str {
    match Kind::try_from(kind) {
        Ok(Kind::Gpu) => "GPU",
        Ok(Kind::Model) => "MODEL",
        _ => "CPU",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::introspect::settled_after;
    use crate::server::repository::await_readiness;

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
                instance_settings: InstanceSettings::default(),
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
                rate_limiter: None,
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
        assert_eq!(r.settings.execute_timeout, Some(Duration::from_secs_f64(2.5)));
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
