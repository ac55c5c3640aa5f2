//! One model instance: a worker thread that owns a stub, takes batches from the version's queue,
//! and turns stub responses into client responses.
//!
//! The worker thread spawns its own stub, so the stub's `PR_SET_PDEATHSIG` is tied to a thread
//! that lives as long as the instance.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};
use tritium_host::{HostError, Stub, StubCommand};
use tritium_ipc::{Initialize, Request, TensorData};

use crate::scheduler::{Pending, Queue};
use crate::stats::{ExecTimes, Stats};
use crate::types::{ErrorKind, InferError, InferResponse, OutputTensor};

/// Everything an instance of one model version needs.
pub(crate) struct VersionContext {
    pub model: String,
    pub version: i64,
    pub model_file: PathBuf,
    pub model_dir: PathBuf,
    pub config_json: String,
    pub queue: Arc<Queue>,
    pub stats: Arc<Stats>,
    pub stub: StubCommand,
    pub init_timeout: Duration,
    /// Workers still serving; the last one to leave fails whatever is queued.
    pub live_workers: AtomicUsize,
}

/// Which instance this is, as `initialize(args)` reports it.
#[derive(Debug, Clone)]
pub(crate) struct InstanceSpec {
    pub name: String,
    pub kind: &'static str,
    pub device_id: i32,
}

static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

fn start(ctx: &VersionContext, spec: &InstanceSpec) -> Result<Stub, HostError> {
    let stub = Stub::spawn(&ctx.stub, &spec.name, ctx.init_timeout)?;
    let args = [
        ("model_config", ctx.config_json.clone()),
        ("model_instance_kind", spec.kind.to_string()),
        ("model_instance_name", spec.name.clone()),
        ("model_instance_device_id", spec.device_id.to_string()),
        ("model_repository", ctx.model_dir.display().to_string()),
        ("model_version", ctx.version.to_string()),
        ("model_name", ctx.model.clone()),
    ];
    let init = Initialize {
        model_file: ctx.model_file.display().to_string(),
        args: args.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    match stub.initialize(init, ctx.init_timeout) {
        Ok(()) => Ok(stub),
        Err(e) => {
            stub.kill();
            Err(e)
        }
    }
}

/// Starts the instance's worker thread. `ready` receives the outcome of `initialize`.
pub(crate) fn spawn(ctx: Arc<VersionContext>, spec: InstanceSpec, ready: mpsc::Sender<Result<(), String>>) -> std::io::Result<std::thread::JoinHandle<()>> {
    ctx.live_workers.fetch_add(1, Ordering::SeqCst);
    let name = format!("instance-{}", spec.name);
    let ctx2 = ctx.clone();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let span = tracing::info_span!("instance", model = %ctx.model, version = ctx.version, instance = %spec.name);
        let _enter = span.enter();
        let stub = match start(&ctx, &spec) {
            Ok(stub) => {
                let _ = ready.send(Ok(()));
                stub
            }
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                leave(&ctx);
                return;
            }
        };
        serve(&ctx, &spec, stub);
        leave(&ctx);
    });
    if spawned.is_err() {
        ctx2.live_workers.fetch_sub(1, Ordering::SeqCst);
    }
    spawned
}

fn leave(ctx: &VersionContext) {
    if ctx.live_workers.fetch_sub(1, Ordering::SeqCst) == 1 {
        for p in ctx.queue.close() {
            let _ = p.tx.send(Err(InferError::unavailable(format!(
                "model '{}' version {} has no running instances",
                ctx.model, ctx.version
            ))));
        }
    }
}

fn serve(ctx: &VersionContext, spec: &InstanceSpec, mut stub: Stub) {
    while let Some(batch) = ctx.queue.next_batch() {
        if let Err(e) = run_batch(ctx, &stub, batch) {
            // The stub died or broke the protocol: its batch has been failed; start a new one.
            error!("{e}");
            stub.kill();
            match start(ctx, spec) {
                Ok(s) => {
                    info!("instance restarted");
                    stub = s;
                }
                Err(e) => {
                    error!("instance could not be restarted: {e}");
                    return;
                }
            }
        }
    }
    if let Err(e) = stub.finalize(Duration::from_secs(30)) {
        warn!("finalize: {e}");
    }
}

/// Runs one batch; answers every request in it. Returns the stub's error if the stub is unusable.
fn run_batch(ctx: &VersionContext, stub: &Stub, batch: Vec<Pending>) -> Result<(), HostError> {
    let t0 = Instant::now();
    let mut waiting: HashMap<u64, Pending> = HashMap::with_capacity(batch.len());
    let mut requests = Vec::with_capacity(batch.len());
    let mut batch_size = 0;
    for p in batch {
        let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
        let mut inputs = Vec::with_capacity(p.req.inputs.len());
        let mut failed = None;
        for t in &p.req.inputs {
            match stub.input(&t.data) {
                Ok(desc) => inputs.push(tritium_ipc::Tensor {
                    name: t.name.clone(),
                    dtype: t.datatype,
                    shape: t.shape.clone(),
                    data: TensorData::Shm { desc, writable: true },
                }),
                Err(e) => {
                    failed = Some(InferError::internal(format!("cannot place input '{}' in shared memory: {e}", t.name)));
                    break;
                }
            }
        }
        if let Some(err) = failed {
            for t in &inputs {
                if let TensorData::Shm { desc, .. } = t.data {
                    let _ = stub.channel().free_own(desc);
                }
            }
            finish(ctx, p, Err(err), None);
            continue;
        }
        batch_size += p.batch_size.max(1);
        requests.push(Request {
            id,
            request_id: p.req.id.clone(),
            correlation_id: p.req.correlation_id.clone(),
            flags: p.req.flags,
            timeout_us: p.req.timeout_us,
            parameters: p.req.parameters.clone(),
            inputs,
            requested_outputs: p.outputs.clone(),
        });
        waiting.insert(id, p);
    }
    if requests.is_empty() {
        return Ok(());
    }
    let t1 = Instant::now();
    let executed = match stub.execute(requests, None) {
        Ok(done) => done,
        Err(e) => {
            let message = e.to_string();
            for (_, p) in waiting.drain() {
                finish(ctx, p, Err(InferError::internal(message.clone())), None);
            }
            return Err(e);
        }
    };
    let t2 = Instant::now();
    let mut answers = Vec::with_capacity(executed.responses.len());
    for resp in &executed.responses {
        let Some(p) = waiting.remove(&resp.request) else { continue };
        let result = match &resp.error {
            Some(e) => Err(InferError::new(ErrorKind::from_triton_code(e.code), e.message.clone())),
            None => {
                let mut outputs = Vec::with_capacity(resp.outputs.len());
                let mut err = None;
                for t in &resp.outputs {
                    match stub.output(&t.data) {
                        Ok(view) => outputs.push(OutputTensor { name: t.name.clone(), datatype: t.dtype, shape: t.shape.clone(), data: view.to_vec() }),
                        Err(e) => {
                            err = Some(InferError::internal(e.to_string()));
                            break;
                        }
                    }
                }
                match err {
                    Some(e) => Err(e),
                    None => {
                        order_outputs(&mut outputs, &p.outputs);
                        Ok(InferResponse {
                            model: ctx.model.clone(),
                            version: ctx.version,
                            id: p.req.id.clone(),
                            outputs,
                            parameters: resp.parameters.clone(),
                        })
                    }
                }
            }
        };
        stub.release_outputs(resp);
        answers.push((p, result));
    }
    let fallback = executed.error.map(|e| e.to_string()).unwrap_or_else(|| "the model sent no response for this request".to_string());
    for (_, p) in waiting.drain() {
        answers.push((p, Err(InferError::internal(fallback.clone()))));
    }
    let t3 = Instant::now();
    let times = ExecTimes { compute_input: t1 - t0, compute_infer: t2 - t1, compute_output: t3 - t2 };
    ctx.stats.execution(batch_size, times);
    for (p, result) in answers {
        let queue = t0.saturating_duration_since(p.enqueued);
        finish(ctx, p, result, Some((queue, times)));
    }
    Ok(())
}

/// Puts outputs in the order the client asked for them.
fn order_outputs(outputs: &mut [OutputTensor], requested: &[String]) {
    outputs.sort_by_key(|o| requested.iter().position(|r| r == &o.name).unwrap_or(usize::MAX));
}

fn finish(ctx: &VersionContext, p: Pending, result: Result<InferResponse, InferError>, timing: Option<(Duration, ExecTimes)>) {
    let total = p.enqueued.elapsed();
    match (&result, timing) {
        (Ok(_), Some((queue, times))) => ctx.stats.success(p.batch_size, total, queue, times),
        _ => ctx.stats.failure(total),
    }
    let _ = p.tx.send(result);
}
