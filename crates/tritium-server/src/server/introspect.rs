//! What the server reports about its models: metadata, configs, readiness, the repository
//! index, instances (and restarting them), statistics and the Prometheus page.

use super::*;

impl Server {
    /// Server name, version and extensions.
    pub fn metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: self.core.opts.server_id.clone(),
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
                for i in ver.ctx.instances.locked().iter() {
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
                for i in ver.ctx.instances.locked().iter() {
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
        let limit = targets.iter().map(|(v, _, _)| v.ctx.settings.init_timeout).max().unwrap_or_default()
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
                State::Ready => ("READY", entry.rolled_back.clone().unwrap_or_default()),
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
                    summaries: ver.ctx.stats.summaries(&self.core.opts.metrics.summary_quantiles),
                    first_response: ver.ctx.stats.first_response_histogram(),
                    name: s.name,
                    version: s.version,
                });
            }
        }
        // Every ready stub is asked for its prometheus_client metrics at once.
        let mut probes = Vec::new();
        for (name, entry) in self.models().iter() {
            for (v, ver) in &entry.versions {
                for i in ver.ctx.instances.locked().iter() {
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
        for (name, entry) in self.models().iter() {
            for (v, ver) in &entry.versions {
                for i in ver.ctx.instances.locked().iter() {
                    if let Some(member) = ver.ctx.rate_limits.get(&i.spec.name) {
                        let counts = member.counts();
                        snapshot.rate_limited.push(tritium_metrics::RateLimitedSnapshot {
                            model: name.clone(),
                            version: v.to_string(),
                            instance: i.spec.name.clone(),
                            waits: counts.waits.load(std::sync::atomic::Ordering::Relaxed),
                            wait_us: counts.waited_us.load(std::sync::atomic::Ordering::Relaxed),
                        });
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
                recycled: i.recycled.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
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
        self.core.metrics.render_reporting(&snapshot, &mut |i, why| {
            if let (Some(probe), Some(labels)) = (probes.get(i), snapshot.client.get(i)) {
                probe.warn_once(labels, &why);
            }
        })
    }

    /// Requests waiting in a model's queues (all versions).
    pub fn pending_requests(&self, name: &str) -> usize {
        self.models().get(name).map(|e| e.versions.values().map(|v| v.ctx.queue.len()).sum()).unwrap_or(0)
    }

    /// What the response cache holds now, when the server has one.
    pub fn cache_usage(&self) -> Option<crate::cache::CacheUsage> {
        self.core.cache.get().map(|c| c.usage())
    }

    /// What loading model `name` is doing now ("" when nothing is reported).
    pub(super) fn load_progress(&self, name: &str) -> String {
        self.core.load_progress.locked().get(name).cloned().unwrap_or_default()
    }
}

/// Waits on an instance's state changes until it is ready after more than `restarts` restarts,
/// or in a state no waiting changes (failed, stopping, stopped).
pub(super) async fn settled_after(mut states: watch::Receiver<StateView>, restarts: u64) -> StateView {
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
