//! Loading ensembles (`platform: "ensemble"`), as Triton's repository manager does (core
//! `model_repository_manager.cc`): their step models first, their dependents refreshed when a
//! step model is loaded or unloaded, and unloading with dependents.
//!
//! Loading: an ensemble's step models load first (in explicit model control too, as Triton's
//! polling chain does); a step model missing from the repository, failed, or without the
//! version a step asks for fails the ensemble with Triton's texts; then the ensemble is checked
//! against its steps' completed configs ([`tritium_config::check_steps`]). An ensemble has
//! version directories (they may be empty) and no model file, starts no stub, and is ready as
//! soon as it is loaded; a step model that goes away later fails the requests that reach it.
//!
//! Execution is [`crate::composition::ensemble`]'s: this module builds its [`Ensemble`] for each
//! loaded version.

use std::collections::HashSet;

use tritium_config::proto::ModelTransactionPolicy;

use super::repository::fingerprint;
use super::*;
use crate::composition::ensemble::EnsembleVersion;
use crate::composition::{Boxed, Ensemble};
use crate::instance::NoModelCalls;

/// The step models' configs an ensemble is checked against, in step order.
pub(super) type StepConfigs = Vec<Arc<ModelConfig>>;

impl Server {
    /// The loaded ensemble version a request is for, if the model is an ensemble.
    pub(super) fn ensemble_of(&self, req: &InferRequest) -> Option<Arc<Ensemble>> {
        self.route(&req.model, req.version).ok().and_then(|v| v.ensemble.clone())
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
        let dir = self.core.opts.repository.join(name);
        let cfg = self.core.opts.config_name.as_deref();
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
        if let Some(cycle) = ensemble_cycle(&self.core.opts.repository, name, self.core.opts.config_name.as_deref()) {
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
            let steps: Vec<String> = server
                .models()
                .get(&name)
                .and_then(|e| e.versions.values().next_back().and_then(|v| v.ensemble.clone()))
                .map(|plan| plan.step_models())
                .unwrap_or_default();
            server.unload(&name).await?;
            for step in steps {
                let (loaded, used_elsewhere) = {
                    let models = server.models();
                    let loaded = models.get(&step).is_some_and(|e| !e.versions.is_empty());
                    let used = models.iter().any(|(n, e)| {
                        *n != step && e.versions.values().any(|v| v.ensemble.as_deref().is_some_and(|p| p.uses(&step)))
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
            let repo = server.core.opts.repository.clone();
            let cfg = server.core.opts.config_name.clone();
            let dependents: Vec<String> = server
                .models()
                .iter()
                .filter(|(n, e)| **n != name && e.wanted && e.state != State::Loading)
                .filter(|(n, e)| match e.versions.values().next_back() {
                    // A loaded model: only an ensemble has steps.
                    Some(v) => v.ensemble.as_ref().is_some_and(|plan| plan.uses(&name)),
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
                retire_all(old.into_values()).await;
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
    let repo = &server.core.opts.repository;
    let cfg = server.core.opts.config_name.as_deref();
    let (ensembles, others) = names.into_iter().partition(|n| is_ensemble_dir(&repo.join(n), cfg));
    (others, ensembles)
}

/// Loads ensembles one by one, after the other models (each loads the steps it still misses);
/// an ensemble loaded already as another ensemble's step is not loaded twice.
pub(super) async fn load_ensembles(server: &Server, ensembles: Vec<String>) {
    let repo = server.core.opts.repository.clone();
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
pub(super) fn start_ensemble(
    opts: &ServerOptions,
    metrics: &tritium_metrics::CustomMetrics,
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
    let config = Arc::new(config);
    let mut versions = BTreeMap::new();
    for &v in &r.versions {
        let stats = Arc::new(Stats::for_metrics(name, v, &opts.metrics, &config));
        let plan =
            EnsembleVersion { model: name.to_string(), version: v, stats: stats.clone(), classes: r.classes.clone() };
        let plan = Ensemble::new(plan, config.clone(), &steps, &r.settings);
        let ctx = Arc::new(VersionContext {
            model: name.to_string(),
            version: v,
            model_file: r.dir.join(v.to_string()),
            model_dir: r.dir.clone(),
            config_json: config_json.clone(),
            queue: Arc::new(Queue::new(None, r.priorities.clone(), stats.clone())),
            stats,
            stub: opts.stub.clone(),
            settings: r.settings.clone(),
            live_workers: AtomicUsize::new(0),
            instances: Mutex::new(Vec::new()),
            metrics: metrics.clone(),
            classes: r.classes.clone(),
            reshapes: crate::reshape::Reshapes::new(&config),
            gpu_inputs: false,
            decoupled,
            calls: Arc::new(NoModelCalls),
            runtime: None,
            warmup: Arc::default(),
            rate_limits: Default::default(),
        });
        let version = Version {
            config: config.clone(),
            ctx,
            workers: Mutex::new(Vec::new()),
            load_duration: prepared + start.elapsed(),
            ensemble: Some(Arc::new(plan)),
            cache: None,
            _files: r.files.clone(),
        };
        versions.insert(v, Arc::new(version));
    }
    Ok(versions)
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
