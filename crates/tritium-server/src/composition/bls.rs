//! BLS: requests model code sends to other models (`InferenceRequest.exec` in the stub).
//!
//! The instance worker hands each `BlsRequest` to the stub's [`handler`], which must not block it: it copies
//! the request's inputs out of the stub's arena (and releases them), makes the checks Triton
//! makes before queueing (the target is ready; a decoupled target needs `decoupled=True`; the
//! call cannot deadlock), and spawns a task on the server's runtime. The task queues the request
//! through the clients' path ([`Router::enqueue`]) and, as each answer arrives, places its
//! outputs in the server's arena of the caller's stub and sends a `BlsResponse`, the last one
//! final. Errors go back as error responses with Triton's texts, never as a failed stub.
//!
//! Deadlocks: an instance whose stub waits on a BLS call while its worker is inside `execute`
//! is *blocked*. A call is refused when its target could only be served by blocked instances
//! that wait, directly or through others, on the target itself ([`would_deadlock`]): a model
//! calling itself with one instance, or a cycle of models each waiting on the next.

use std::sync::{Arc, Weak};

use tokio::sync::Notify;
use tracing::warn;
use tritium_host::{BlsEvent, BlsHandler};
use tritium_ipc::{Request, Response, ServerChannel, StubError, Tensor, TensorData, ToStub};
use tritium_sync::Locked;

use super::Router;
use crate::instance::{BlsCall, Instance, VersionContext};
use crate::types::{InferError, InferRequest, InputTensor, OutputTensor, RequestedOutput, Streamed};

fn error_response(e: &InferError) -> Response {
    Response {
        request: 0,
        outputs: Vec::new(),
        error: Some(StubError { message: e.message.clone(), code: e.kind.triton_code(), traceback: None }),
        parameters: Vec::new(),
        final_response: true,
        flag_only: false,
    }
}

/// Triton's wrapping of an error met before the request is queued (python_backend's
/// `RequestExecutor::Infer`).
fn before_queue(model: &str, message: &str) -> InferError {
    InferError::internal(format!("Model {model} - Error when running inference: {message}"))
}

/// Triton's text for a target that is unknown or not ready.
fn not_ready(model: &str) -> InferError {
    before_queue(model, &format!("Failed for execute the inference request. Model '{model}' is not ready."))
}

/// Triton's text for a decoupled target called without `decoupled=True`.
fn needs_decoupled(model: &str) -> InferError {
    before_queue(
        model,
        &format!(
            "Model {model} is using the decoupled. The current BLS request call doesn't support models using the \
             decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls \
             for decoupled models.'"
        ),
    )
}

fn deadlock(caller: &str, model: &str) -> InferError {
    before_queue(
        model,
        &format!(
            "the BLS request from model '{caller}' to model '{model}' would never run: every instance of '{model}' is \
             inside execute waiting on BLS requests that wait, directly or through other models, on '{model}' itself. \
             Give '{model}' more instances (instance_group count) or do not call it from itself"
        ),
    )
}

/// Makes the BLS handler of one stub of `instance` (of version `ctx`), answering on `channel`:
/// calls go through `router` (held weakly), their tasks run on `runtime`.
pub(crate) fn handler(
    router: Weak<dyn Router>,
    runtime: Option<tokio::runtime::Handle>,
    ctx: &Arc<VersionContext>,
    instance: &Arc<Instance>,
    channel: &Arc<ServerChannel>,
) -> BlsHandler {
    let caller = Arc::downgrade(ctx);
    let instance = Arc::downgrade(instance);
    let channel = Arc::downgrade(channel);
    Arc::new(move |event| {
        let (Some(ctx), Some(instance), Some(channel)) = (caller.upgrade(), instance.upgrade(), channel.upgrade())
        else {
            return;
        };
        match event {
            BlsEvent::Request { call, model, version, decoupled, request } => {
                let key = (Arc::as_ptr(&channel) as usize, call);
                let req = take_request(&channel, model, version, request);
                let reached = router.upgrade().zip(runtime.clone());
                match check(reached, &ctx, &instance, key, &req, decoupled) {
                    Ok((router, cancel, runtime)) => {
                        runtime.spawn(run(router, req, channel, instance, key, cancel));
                    }
                    Err(e) => send(&channel, call, error_response(&e)),
                }
            }
            BlsEvent::Cancel { call } => {
                let key = (Arc::as_ptr(&channel) as usize, call);
                if let Some(c) = instance.bls.lock().get(&key) {
                    c.cancel.notify_one();
                }
            }
        }
    })
}

/// Sends one response to the stub; one that cannot be sent (the stub is gone) has its blocks
/// freed.
fn send(channel: &ServerChannel, call: u64, response: Response) {
    let blocks: Vec<_> = response
        .outputs
        .iter()
        .filter_map(|t| match t.data {
            TensorData::Shm { desc, .. } => Some(desc),
            TensorData::Cuda { .. } => None,
        })
        .collect();
    if let Err(e) = channel.send(&ToStub::BlsResponse { call, response }) {
        warn!("cannot answer BLS call {call}: {e}");
        for desc in blocks {
            let _ = channel.free_own(desc);
        }
    }
}

/// The request as the server takes it: its inputs copied out of the stub's arena, whose blocks
/// are released at once.
fn take_request(channel: &ServerChannel, model: String, version: i64, r: Request) -> Result<InferRequest, InferError> {
    let mut inputs = Vec::with_capacity(r.inputs.len());
    let mut failed = None;
    for t in r.inputs {
        let TensorData::Shm { desc, .. } = t.data else {
            failed.get_or_insert_with(|| {
                InferError::invalid(format!("input '{}' is a GPU tensor, which BLS does not take yet", t.name))
            });
            continue;
        };
        match channel.view(desc) {
            Ok(view) => {
                inputs.push(InputTensor {
                    name: t.name,
                    datatype: t.dtype,
                    shape: t.shape,
                    data: view.to_vec().into(),
                });
                channel.release(desc);
            }
            Err(e) => {
                failed.get_or_insert_with(|| InferError::invalid(format!("input '{}' cannot be read: {e}", t.name)));
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(InferRequest {
        model,
        version: (version >= 0).then_some(version),
        id: r.request_id,
        inputs,
        outputs: r.requested_outputs.into_iter().map(RequestedOutput::named).collect(),
        parameters: r.parameters,
        correlation_id: r.correlation_id,
        flags: r.flags,
        timeout_us: r.timeout_us,
        priority: 0,
        trace: tritium_trace::SpanContext::from_triton_context(&r.trace).map(tritium_trace::TraceParent::Caller),
        compute_tally: None,
    })
}

type Checked = (Arc<dyn Router>, Arc<Notify>, tokio::runtime::Handle);

/// Triton's checks before a BLS request is queued, and the deadlock check; registers the call.
/// `reached` is the router and the runtime, unless the server is going away.
fn check(
    reached: Option<(Arc<dyn Router>, tokio::runtime::Handle)>,
    ctx: &Arc<VersionContext>,
    instance: &Instance,
    key: (usize, u64),
    req: &Result<InferRequest, InferError>,
    decoupled: bool,
) -> Result<Checked, InferError> {
    let req = req.as_ref().map_err(Clone::clone)?;
    let Some((router, runtime)) = reached else {
        return Err(InferError::unavailable("the server is shutting down"));
    };
    let Some(target) = router.ready_target(&req.model, req.version) else {
        return Err(not_ready(&req.model));
    };
    if target.decoupled && !decoupled {
        return Err(needs_decoupled(&req.model));
    }
    let cancel = Arc::new(Notify::new());
    instance.bls.lock().insert(key, BlsCall { target: Arc::downgrade(&target), cancel: cancel.clone() });
    if would_deadlock(&target) {
        instance.bls.lock().remove(&key);
        return Err(deadlock(&ctx.model, &req.model));
    }
    Ok((router, cancel, runtime))
}

/// Whether `target` can never serve another request: it belongs to a set of versions whose
/// every ready instance is inside `execute` waiting on a BLS call to a version of the set (an
/// instance is freed only when all its calls are answered, so one call into the set holds it).
/// The set is the greatest such set among the versions reachable from `target` through the
/// calls in flight.
pub(crate) fn would_deadlock(target: &Arc<VersionContext>) -> bool {
    // Every version reachable from the target, and for each of its ready instances the versions
    // its calls wait on (None: the instance is not blocked).
    let mut nodes: Vec<Arc<VersionContext>> = Vec::new();
    let mut waits: Vec<Vec<Option<Vec<Arc<VersionContext>>>>> = Vec::new();
    let mut pending = vec![target.clone()];
    while let Some(v) = pending.pop() {
        if nodes.iter().any(|n| Arc::ptr_eq(n, &v)) {
            continue;
        }
        let instances = v.instances.locked().clone();
        let mut outs = Vec::new();
        for i in instances.iter().filter(|i| i.state() == crate::types::InstanceState::Ready) {
            let targets = i.bls.targets();
            if i.executing() && !targets.is_empty() {
                pending.extend(targets.iter().cloned());
                outs.push(Some(targets));
            } else {
                outs.push(None);
            }
        }
        nodes.push(v);
        waits.push(outs);
    }
    let index = |t: &Arc<VersionContext>| nodes.iter().position(|n| Arc::ptr_eq(n, t));
    let graph: Vec<Vec<Option<Vec<usize>>>> = waits
        .iter()
        .map(|outs| outs.iter().map(|o| o.as_ref().map(|ts| ts.iter().filter_map(index).collect())).collect())
        .collect();
    blocked_for_ever(&graph).first().copied().unwrap_or(false)
}

/// For each version (its instances: None when not blocked, else the versions its calls wait
/// on), whether it is in the greatest set whose every instance waits on a member.
fn blocked_for_ever(versions: &[Vec<Option<Vec<usize>>>]) -> Vec<bool> {
    let mut member: Vec<bool> =
        versions.iter().map(|inst| !inst.is_empty() && inst.iter().all(Option::is_some)).collect();
    loop {
        let mut changed = false;
        for (k, inst) in versions.iter().enumerate() {
            if !member[k] {
                continue;
            }
            let stuck = inst.iter().all(|i| i.as_ref().is_some_and(|targets| targets.iter().any(|&t| member[t])));
            if !stuck {
                member[k] = false;
                changed = true;
            }
        }
        if !changed {
            return member;
        }
    }
}

/// Places a response's outputs in the server's arena of the caller's stub.
fn place(channel: &ServerChannel, outputs: Vec<OutputTensor>) -> Result<Vec<Tensor>, InferError> {
    let mut placed = Vec::with_capacity(outputs.len());
    for o in outputs {
        match channel.alloc(o.data.len() as u64) {
            Ok(view) => {
                view.copy_from(&o.data);
                placed.push(Tensor {
                    name: o.name,
                    dtype: o.datatype,
                    shape: o.shape,
                    data: TensorData::Shm { desc: view.desc, writable: true },
                });
            }
            Err(e) => {
                for t in &placed {
                    if let TensorData::Shm { desc, .. } = t.data {
                        let _ = channel.free_own(desc);
                    }
                }
                return Err(InferError::internal(format!(
                    "cannot place BLS output '{}' in shared memory: {e}",
                    o.name
                )));
            }
        }
    }
    Ok(placed)
}

/// One streamed answer as the stub's response.
fn to_response(channel: &ServerChannel, message: Streamed) -> Response {
    match message {
        Streamed::Final => Response::final_flag(0),
        Streamed::Response { result, last } => {
            let placed = result.and_then(|r| place(channel, r.outputs).map(|outputs| (outputs, r.parameters)));
            match placed {
                Ok((outputs, parameters)) => {
                    Response { request: 0, outputs, error: None, parameters, final_response: last, flag_only: false }
                }
                Err(e) => Response { final_response: last, ..error_response(&e) },
            }
        }
    }
}

/// The call's task: queues the request and forwards its answers until the final one.
async fn run(
    router: Arc<dyn Router>,
    req: Result<InferRequest, InferError>,
    channel: Arc<ServerChannel>,
    instance: Arc<Instance>,
    key: (usize, u64),
    cancel: Arc<Notify>,
) {
    let call = key.1;
    // The task takes each answer as it comes, so a decoupled target is credited at once: what
    // bounds it is the caller's own model code, and the caller's answers wait in the server's
    // arena of the caller's stub (each within `--max-server-shm-bytes-per-stub`), not here.
    let (tx, mut rx) = crate::types::response_stream();
    let queued = req.and_then(|req| {
        let model = req.model.clone();
        router.enqueue(req, tx).map_err(|e| InferError::new(e.kind, before_queue(&model, &e.message).message))
    });
    if let Err(e) = queued {
        send(&channel, call, error_response(&e));
        instance.bls.lock().remove(&key);
        return;
    }
    let mut cancelled = false;
    loop {
        tokio::select! {
            message = rx.recv() => {
                let Some(message) = message else {
                    let e = InferError::internal("the server dropped the BLS request without a final response");
                    send(&channel, call, error_response(&e));
                    break;
                };
                let last = message.is_last();
                let response = to_response(&channel, message);
                send(&channel, call, response);
                if last {
                    break;
                }
            }
            () = cancel.notified(), if !cancelled => {
                // The target sees the cancellation (`is_cancelled()`) and decides: as in Triton,
                // whatever it still sends, until its final response, reaches the caller.
                cancelled = true;
                rx.cancel();
            }
        }
    }
    instance.bls.lock().remove(&key);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tritium_ipc::{ChannelConfig, DataType, StubChannel, ToServer, WaitPolicy};

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn inputs_are_copied_out_and_released_and_outputs_reach_the_stub_over_shared_memory() {
        let config = ChannelConfig { arena_segment: 2 << 20, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("bls-test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, WaitPolicy::default(), 2 << 20).expect("connect");
        let block = stub.alloc(8).expect("alloc");
        block.copy_from(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let input = Tensor {
            name: "IN".into(),
            dtype: DataType::Fp32,
            shape: vec![2],
            data: TensorData::Shm { desc: block.desc, writable: true },
        };
        let request = Request { inputs: vec![input], requested_outputs: vec!["OUT".into()], ..Default::default() };
        stub.send(&ToServer::BlsRequest { call: 3, model: "m".into(), version: 2, decoupled: false, request })
            .expect("send");
        let Some(ToServer::BlsRequest { model, version, request, .. }) = server.recv(T).expect("recv") else {
            panic!("expected a BLS request");
        };
        let req = take_request(&server, model, version, request).expect("request");
        assert_eq!((req.model.as_str(), req.version, req.outputs[0].name.as_str()), ("m", Some(2), "OUT"));
        assert_eq!(&req.inputs[0].data[..], &[1, 2, 3, 4, 5, 6, 7, 8]);

        let output = crate::types::OutputTensor {
            name: "OUT".into(),
            datatype: DataType::Int32,
            shape: vec![1],
            data: vec![9, 0, 0, 0],
        };
        let answer = crate::types::InferResponse {
            model: "m".into(),
            version: 2,
            id: String::new(),
            outputs: vec![output],
            parameters: Vec::new(),
        };
        let response = to_response(&server, Streamed::Response { result: Ok(answer), last: true });
        send(&server, 3, response);
        let Some(ToStub::BlsResponse { call, response }) = stub.recv(T).expect("recv") else {
            panic!("expected a BLS response");
        };
        assert!(call == 3 && response.final_response && response.error.is_none());
        let TensorData::Shm { desc, .. } = response.outputs[0].data else { panic!("shm") };
        assert_eq!(stub.view(desc).expect("view").to_vec(), [9, 0, 0, 0]);
        // The server's release of the input reached the stub ahead of the response.
        assert_eq!(stub.live_blocks(), 0);

        let e = to_response(&server, Streamed::Response { result: Err(InferError::not_found("gone")), last: false });
        assert_eq!((e.error.map(|e| (e.message, e.code)), e.final_response), (Some(("gone".into(), 2)), false));
        assert!(to_response(&server, Streamed::Final).final_response);
    }

    #[test]
    fn a_version_waiting_on_itself_is_blocked_for_ever() {
        // One instance, inside execute, calling its own version.
        assert_eq!(blocked_for_ever(&[vec![Some(vec![0])]]), [true]);
        // A second instance that is free serves the call.
        assert_eq!(blocked_for_ever(&[vec![Some(vec![0]), None]]), [false]);
    }

    #[test]
    fn a_cycle_is_blocked_only_when_every_instance_on_it_waits_inside_it() {
        // A waits on B, B waits on A.
        assert_eq!(blocked_for_ever(&[vec![Some(vec![1])], vec![Some(vec![0])]]), [true, true]);
        // B's instance waits on C, which is free: it comes back, so nothing is stuck.
        assert_eq!(blocked_for_ever(&[vec![Some(vec![1])], vec![Some(vec![2])], vec![None]]), [false, false, false]);
        // A chain three deep that ends in a free model is no deadlock either.
        assert_eq!(
            blocked_for_ever(&[vec![Some(vec![1])], vec![Some(vec![2])], vec![Some(vec![0]), None]]),
            [false, false, false]
        );
        // A version without ready instances is not counted as stuck (it is not ready at all).
        assert_eq!(blocked_for_ever(&[vec![]]), [false]);
    }

    #[test]
    fn errors_before_queueing_have_tritons_texts() {
        assert_eq!(
            not_ready("nope").message,
            "Model nope - Error when running inference: Failed for execute the inference request. Model 'nope' is not ready."
        );
        let m = needs_decoupled("d").message;
        assert!(m.starts_with("Model d - Error when running inference: Model d is using the decoupled."), "{m}");
        assert!(m.ends_with("for decoupled models.'"), "{m}");
    }

    /// Registers a BLS call from `caller`'s instance `k` to `target`, with that instance inside
    /// `execute`.
    fn call(caller: &Arc<VersionContext>, k: usize, target: &Arc<VersionContext>) {
        let instance = caller.instances.lock().expect("instances")[k].clone();
        crate::instance::testing::set_executing(&instance, true);
        let key = (k, instance.bls.lock().len() as u64);
        instance.bls.lock().insert(key, BlsCall { target: Arc::downgrade(target), cancel: Arc::default() });
    }

    #[test]
    fn a_model_calling_itself_deadlocks_only_without_a_free_instance() {
        let one = crate::instance::testing::version("one", 1);
        assert!(!would_deadlock(&one), "an idle instance serves the call");
        call(&one, 0, &one);
        assert!(would_deadlock(&one));

        let two = crate::instance::testing::version("two", 2);
        call(&two, 0, &two);
        assert!(!would_deadlock(&two), "the second instance is free");
        call(&two, 1, &two);
        assert!(would_deadlock(&two));
    }

    #[test]
    fn a_cycle_through_other_models_deadlocks_and_a_chain_to_a_free_model_does_not() {
        let (a, b, c) = (
            crate::instance::testing::version("a", 1),
            crate::instance::testing::version("b", 1),
            crate::instance::testing::version("c", 1),
        );
        // a waits on b, b waits on c, and c is free: every call comes back.
        call(&a, 0, &b);
        call(&b, 0, &c);
        assert!(!would_deadlock(&b) && !would_deadlock(&a));
        // c now waits on a: a -> b -> c -> a, each with its only instance.
        call(&c, 0, &a);
        assert!(would_deadlock(&a) && would_deadlock(&b) && would_deadlock(&c));
        // An instance that is not inside execute is not blocked, whatever it has in flight.
        let first_c = c.instances.lock().expect("instances")[0].clone();
        crate::instance::testing::set_executing(&first_c, false);
        assert!(!would_deadlock(&a));
    }
}
