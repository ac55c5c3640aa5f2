//! Version contexts and instances for other modules' unit tests: no stub, no worker thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tritium_host::StubCommand;
use tritium_sync::Locked;

use super::{Event, Instance, InstanceSettings, InstanceSpec, NoModelCalls, VersionContext};
use crate::scheduler::{Policy, Priorities, Queue};
use crate::stats::Stats;

/// Version 1 of `model` with `instances` instances that are ready and idle.
pub(crate) fn version(model: &str, instances: usize) -> Arc<VersionContext> {
    let stats = Arc::new(Stats::new(model, 1));
    let ctx = Arc::new(VersionContext {
        model: model.to_string(),
        version: 1,
        model_file: "model.py".into(),
        model_dir: ".".into(),
        config_json: String::new(),
        queue: Arc::new(Queue::new(None, Priorities::single(Policy::bounded_by_flag(0)), stats.clone())),
        stats,
        stub: StubCommand { python: "python3".into(), python_path: ".".into(), env: Vec::new(), spin: 0 },
        settings: InstanceSettings::default(),
        live_workers: AtomicUsize::new(0),
        instances: Mutex::new(Vec::new()),
        metrics: tritium_metrics::CustomMetrics::default(),
        classes: crate::classify::Classes::default(),
        reshapes: crate::reshape::Reshapes::default(),
        gpu_inputs: false,
        decoupled: false,
        calls: Arc::new(NoModelCalls),
        runtime: None,
        warmup: Arc::default(),
        rate_limits: Default::default(),
    });
    for k in 0..instances {
        let spec = InstanceSpec { name: format!("{model}_{k}"), kind: "CPU", device_id: 0, rate_limiter: None };
        let instance = Arc::new(Instance::new(spec, ctx.metrics.session()));
        let (channel, _fds) =
            tritium_ipc::ServerChannel::create("instance-test", tritium_ipc::ChannelConfig::default())
                .expect("channel");
        instance.on(Event::Spawn);
        instance.on(Event::Spawned { pid: 1, channel: Arc::new(channel) });
        instance.on(Event::Initialized);
        ctx.instances.locked().push(instance);
    }
    ctx
}

/// Marks `instance` as inside `execute` (or out of it).
pub(crate) fn set_executing(instance: &Instance, executing: bool) {
    instance.inflight.store(u64::from(executing), Ordering::Relaxed);
}
