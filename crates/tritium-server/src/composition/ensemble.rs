//! Ensemble execution (`platform: "ensemble"`, `ensemble_scheduling { step [...] }`), as Triton
//! runs it (core `ensemble_scheduler.cc`), through a [`Router`]: the server's loading code builds
//! an [`Ensemble`] per loaded version, and requests run on it here.
//!
//! A request's tensors are kept by name and *generation*. The request's inputs are
//! generation 0; a step runs once per generation in which all its inputs exist, and its
//! outputs join that generation, except a decoupled step's: each of its responses opens a new
//! generation, which drives the steps downstream of it again (Triton's iteration counts; the
//! decoupled rule checked at load keeps every step's inputs in one generation). Steps go
//! through [`Router::infer`] and [`Router::infer_decoupled`] (only the steps the requested outputs
//! need run, as in Triton), so step models keep their own
//! queues and statistics, and run concurrently where the graph allows. Tensors move between
//! steps as `Bytes` clones, never copied. The ensemble answers once a generation holds all its
//! requested outputs (in the order they were made, with the request's sequence id and flags as
//! parameters, as Triton answers); a decoupled ensemble streams one response per such generation
//! and a final flag at the end. A step's error ends the request with Triton's
//! `in ensemble '<name>', <the step's error>`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc as tokio_mpsc;
use tritium_config::ModelConfig;

use super::{Boxed, Router};
use crate::classify::Classes;
use crate::instance::InstanceSettings;
use crate::reshape::Reshapes;
use crate::stats::{ExecTimes, Stats};
use crate::types::{
    ComputeTally, CorrelationId, ErrorKind, InferError, InferRequest, InferResponse, InputTensor, OutputTensor,
    ParamValue, RequestedOutput, ResponseStream, StreamTx, Streamed,
};
use crate::validate::{check_metadata, validate, Validated};

/// One loaded version of an ensemble: its steps, with their tensor names resolved, and what
/// answering its requests needs (its config, statistics, reshapes and labels).
pub(crate) struct Ensemble {
    model: String,
    version: i64,
    /// The ensemble's completed config, which its requests are validated against.
    config: Arc<ModelConfig>,
    /// Any step is decoupled: the ensemble streams its responses.
    decoupled: bool,
    /// `--max-inflight-responses`: how far a decoupled step may run ahead of the client.
    window: u32,
    max_metadata_bytes: usize,
    stats: Arc<Stats>,
    /// The ensemble's own reshapes: its inputs go to the steps, and its outputs to the client,
    /// reshaped as a model's (Triton normalizes an ensemble's requests too).
    reshapes: Reshapes,
    classes: Classes,
    steps: Vec<Step>,
    /// Ensemble tensor name -> the steps that read it.
    consumers: HashMap<String, Vec<usize>>,
    /// The ensemble's optional inputs (absent ones still let their steps run).
    optional: Vec<String>,
}

/// What an [`Ensemble`] is built from, besides its config and its steps' configs.
pub(crate) struct EnsembleVersion {
    /// The model's name.
    pub model: String,
    /// The version.
    pub version: i64,
    /// Its statistics.
    pub stats: Arc<Stats>,
    /// Its labels, for classification outputs.
    pub classes: Classes,
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

impl Ensemble {
    /// Ensemble `v` of `config` (completed, with its transaction policy set: decoupled when a
    /// step is), whose steps' models have the configs `steps`, in step order.
    pub(crate) fn new(
        v: EnsembleVersion,
        config: Arc<ModelConfig>,
        steps: &[Arc<ModelConfig>],
        settings: &InstanceSettings,
    ) -> Self {
        let scheduling = tritium_config::ensemble_scheduling(&config).cloned().unwrap_or_default();
        let mut plan = Vec::new();
        let mut consumers: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, (step, model)) in scheduling.step.iter().zip(steps).enumerate() {
            let mut inputs: Vec<(String, String)> =
                step.input_map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            inputs.sort();
            for (_, tensor) in &inputs {
                consumers.entry(tensor.clone()).or_default().push(i);
            }
            plan.push(Step {
                model: step.model_name.clone(),
                version: (step.model_version >= 0).then_some(step.model_version),
                inputs,
                outputs: step.output_map.clone(),
                decoupled: tritium_config::is_decoupled(model),
            });
        }
        Self {
            model: v.model,
            version: v.version,
            decoupled: tritium_config::is_decoupled(&config),
            window: settings.max_inflight_responses,
            max_metadata_bytes: settings.max_request_metadata_bytes,
            stats: v.stats,
            reshapes: Reshapes::new(&config),
            classes: v.classes,
            optional: config.input.iter().filter(|i| i.optional).map(|i| i.name.clone()).collect(),
            steps: plan,
            consumers,
            config,
        }
    }

    /// Whether a step of the ensemble runs `model`.
    pub(crate) fn uses(&self, model: &str) -> bool {
        self.steps.iter().any(|s| s.model == model)
    }

    /// The models of the steps, sorted, each once.
    pub(crate) fn step_models(&self) -> Vec<String> {
        let mut models: Vec<String> = self.steps.iter().map(|s| s.model.clone()).collect();
        models.sort();
        models.dedup();
        models
    }

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

    /// Runs a request on an ensemble that is not decoupled.
    pub(crate) fn infer(
        self: &Arc<Self>,
        router: Arc<dyn Router>,
        req: InferRequest,
    ) -> Boxed<Result<InferResponse, InferError>> {
        let plan = self.clone();
        Box::pin(async move {
            plan.check_policy(&req, false)?;
            let checked = plan.admit(&req)?;
            let (tx, mut rx) = crate::types::response_stream();
            run(router, plan, req, checked, tx).await;
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
    pub(crate) fn infer_decoupled(
        self: &Arc<Self>,
        router: Arc<dyn Router>,
        req: InferRequest,
    ) -> Result<ResponseStream, InferError> {
        self.check_policy(&req, true)?;
        let checked = self.admit(&req)?;
        let (tx, rx) = crate::types::response_stream();
        tokio::spawn(run(router, self.clone(), req, checked, tx));
        Ok(rx)
    }

    /// Starts a request of an ensemble of either kind with its answers on `tx` (the last one
    /// final): the path of BLS calls, whose caller already checked the transaction policy.
    pub(crate) fn start_on(
        self: &Arc<Self>,
        router: Arc<dyn Router>,
        req: InferRequest,
        tx: StreamTx,
    ) -> Result<(), InferError> {
        let checked = self.admit(&req)?;
        tokio::spawn(run(router, self.clone(), req, checked, tx));
        Ok(())
    }

    /// Whether tensor `t` of generation `gen` is no longer needed: it is not a requested output,
    /// and every step that needs it and runs for this request has fired in that generation.
    fn last_use(
        &self,
        t: &str,
        gen: u64,
        wanted: &[RequestedOutput],
        needed: &[bool],
        fired: &HashSet<(usize, u64)>,
    ) -> bool {
        !wanted.iter().any(|o| o.name == t)
            && self
                .consumers
                .get(t)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .all(|&c| !needed.get(c).copied().unwrap_or(false) || fired.contains(&(c, gen)))
    }

    /// The error a unary call of a decoupled ensemble gets, or a streamed call of one that is
    /// not.
    fn check_policy(&self, req: &InferRequest, decoupled: bool) -> Result<(), InferError> {
        if self.decoupled == decoupled {
            return Ok(());
        }
        Err(crate::validate::transaction_mismatch(&req.model, decoupled))
    }

    /// Checks a request against the ensemble's config, as any model's; counts a refusal.
    fn admit(&self, req: &InferRequest) -> Result<Validated, InferError> {
        let start = Instant::now();
        check_metadata(req, &req.model, self.max_metadata_bytes).and_then(|()| validate(req, &self.config)).inspect_err(
            |e| {
                self.stats.failure(start.elapsed(), e.kind, false);
            },
        )
    }
}

/// The answer of a request whose sender went away unanswered.
fn dropped() -> InferError {
    InferError::internal("the model instance dropped the request without answering")
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
async fn run(router: Arc<dyn Router>, plan: Arc<Ensemble>, mut req: InferRequest, checked: Validated, tx: StreamTx) {
    let start = Instant::now();
    let name = plan.model.clone();
    let wanted: Vec<RequestedOutput> = checked.outputs;
    let needed = plan.needed(&wanted);
    // Each tensor of a generation with the order it was made in: the ensemble's outputs are
    // answered in that order, as Triton's are (not in the config's).
    let mut made = 0u64;
    let mut order: HashMap<(String, u64), u64> = HashMap::new();
    let mut tensors: HashMap<(String, u64), Option<InputTensor>> = HashMap::new();
    let mut updated: Vec<(String, u64)> = Vec::new();
    // The inputs move into the request's tensors, so each is released after its last consumer.
    for mut input in std::mem::take(&mut req.inputs) {
        plan.reshapes.input(&input.name, &mut input.shape);
        updated.push((input.name.clone(), 0));
        tensors.insert((input.name.clone(), 0), Some(input));
    }
    for name in &plan.optional {
        if let std::collections::hash_map::Entry::Vacant(slot) = tensors.entry((name.clone(), 0)) {
            slot.insert(None);
            updated.push((name.clone(), 0));
        }
    }
    // The steps' compute times, which are the ensemble's own (as in Triton).
    let tally = Arc::new(ComputeTally::default());
    let (events, mut incoming) = tokio_mpsc::unbounded_channel::<Event>();
    let mut fired: HashSet<(usize, u64)> = HashSet::new();
    let mut answered: HashSet<u64> = HashSet::new();
    let mut inflight = 0usize;
    let mut generations = 0u64;
    let mut responses = 0usize;
    let fail = |e: InferError| {
        let e = InferError::new(e.kind, format!("in ensemble '{name}', {}", e.message));
        // Triton counts an ensemble's failure with reason OTHER.
        plan.stats.failure(start.elapsed(), ErrorKind::Internal, false);
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
                    compute_tally: Some(tally.clone()),
                };
                // A decoupled ensemble's client holds its decoupled steps back (a step's
                // response becomes, through the steps after it, one of the ensemble's).
                let hold = plan.decoupled.then(|| (tx.clone(), plan.window));
                launch(&router, s, gen, step.decoupled, step_req, events.clone(), hold);
                // A tensor whose last consumer has now fired is no longer held here: its bytes
                // go once the steps that took it are done with them.
                for (_, t) in &step.inputs {
                    if plan.last_use(t, gen, &wanted, &needed, &fired) {
                        tensors.remove(&(t.clone(), gen));
                    }
                }
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
                plan.reshapes.output(&output.name, &mut output.shape);
                match o.classification {
                    Some(k) => match plan.classes.classify(&output, k) {
                        Ok(c) => outputs.push(c),
                        Err(e) => return fail(e.into()),
                    },
                    None => outputs.push(output),
                }
            }
            let response = InferResponse {
                model: name.clone(),
                version: plan.version,
                id: req.id.clone(),
                outputs,
                parameters: sequence_parameters(&req),
            };
            responses += 1;
            if !plan.decoupled {
                // One response: the ensemble is done once it is complete.
                succeeded(&plan, &req, checked.batch_size, start, &tally);
                tx.send(Streamed::Response { result: Ok(response), last: true });
                return;
            }
            if responses == 1 {
                plan.stats.first_response(start.elapsed());
            }
            if !tx.send(Streamed::Response { result: Ok(response), last: false }) {
                // The client went away: dropping `incoming` cancels the steps.
                plan.stats.failure(start.elapsed(), ErrorKind::Cancelled, false);
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
    if responses == 0 && !plan.decoupled {
        let log = if req.id.is_empty() { "<id_unknown>" } else { &req.id };
        return fail(InferError::invalid(format!(
            "[request id: {log}] unexpected deadlock, at least one output is not set while no more ensemble steps can \
             be made"
        )));
    }
    succeeded(&plan, &req, checked.batch_size, start, &tally);
    tx.send(Streamed::Final);
}

/// Records an ensemble request that succeeded: its compute times are the sums of its steps'
/// (added to its own ensemble's when it is a step of one), counted as one execution, as in
/// Triton.
fn succeeded(plan: &Ensemble, req: &InferRequest, batch_size: u64, start: Instant, tally: &ComputeTally) {
    let times = ExecTimes::tallied(tally);
    plan.stats.request_success(req, batch_size, start.elapsed(), Duration::ZERO, times);
    plan.stats.execution(batch_size.max(1), times);
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

/// Sends one step's request through the server's own routing, in a task that reports its
/// responses on `events`; a step that fails to start reports its error at once. With `hold`
/// (the ensemble's own stream and window), a decoupled step's next response is taken only while
/// the responses taken from it are less than a window ahead of what the ensemble's client took,
/// so the step model is held back by the ensemble's client.
fn launch(
    router: &Arc<dyn Router>,
    step: usize,
    gen: u64,
    decoupled: bool,
    req: InferRequest,
    events: tokio_mpsc::UnboundedSender<Event>,
    hold: Option<(StreamTx, u32)>,
) {
    if decoupled {
        let mut stream = match router.clone().infer_decoupled(req) {
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
        let answer = router.clone().infer(req);
        tokio::spawn(async move {
            match answer.await {
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
    use std::sync::Mutex;

    use tritium_config::proto::ModelTransactionPolicy;
    use tritium_ipc::DataType;

    use super::*;

    /// A router whose models are arithmetic on one FP32 value: "split" (decoupled) answers
    /// `x` and `x + 1`, "double" answers `2x`, and "fail" refuses every request.
    #[derive(Default)]
    struct FakeRouter {
        /// The models called, in order.
        called: Mutex<Vec<String>>,
        /// What "gated" (which answers `2x`) waits for.
        gate: tokio::sync::Notify,
    }

    fn value(req: &InferRequest) -> f32 {
        let bytes: [u8; 4] = req.inputs[0].data[..4].try_into().expect("one FP32");
        f32::from_le_bytes(bytes)
    }

    fn answer(req: &InferRequest, v: f32) -> InferResponse {
        let outputs = req
            .outputs
            .iter()
            .map(|o| OutputTensor {
                name: o.name.clone(),
                datatype: DataType::Fp32,
                shape: vec![1],
                data: v.to_le_bytes().to_vec(),
            })
            .collect();
        InferResponse { model: req.model.clone(), version: 1, id: req.id.clone(), outputs, parameters: Vec::new() }
    }

    impl Router for FakeRouter {
        fn ready_target(&self, _: &str, _: Option<i64>) -> Option<Arc<crate::instance::VersionContext>> {
            None
        }

        fn enqueue(self: Arc<Self>, _: InferRequest, _: StreamTx) -> Result<(), InferError> {
            Err(InferError::internal("not used by ensembles"))
        }

        fn infer(self: Arc<Self>, req: InferRequest) -> Boxed<Result<InferResponse, InferError>> {
            self.called.lock().expect("called").push(req.model.clone());
            Box::pin(async move {
                match req.model.as_str() {
                    "double" => Ok(answer(&req, 2.0 * value(&req))),
                    "gated" => {
                        self.gate.notified().await;
                        Ok(answer(&req, 2.0 * value(&req)))
                    }
                    _ => Err(InferError::invalid(format!("model '{}' refused the request", req.model))),
                }
            })
        }

        fn infer_decoupled(self: Arc<Self>, req: InferRequest) -> Result<ResponseStream, InferError> {
            self.called.lock().expect("called").push(req.model.clone());
            let (tx, rx) = crate::types::response_stream();
            let x = value(&req);
            for v in [x, x + 1.0] {
                tx.send(Streamed::Response { result: Ok(answer(&req, v)), last: false });
            }
            tx.send(Streamed::Final);
            Ok(rx)
        }

        fn load(
            self: Arc<Self>,
            _: &str,
            _: Option<String>,
            _: Vec<crate::types::ModelFile>,
        ) -> Result<Boxed<Result<(), InferError>>, InferError> {
            Err(InferError::unavailable("no model control here"))
        }

        fn unload(self: Arc<Self>, _: &str, _: bool) -> Result<Boxed<Result<(), InferError>>, InferError> {
            Err(InferError::unavailable("no model control here"))
        }
    }

    /// Ensemble "e": IN -> `first` -> MID -> `second` -> OUT.
    fn ensemble(first: &str, second: &str, first_decoupled: bool) -> Arc<Ensemble> {
        let text = format!(
            r#"name: "e"
            platform: "ensemble"
            input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
            output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
            ensemble_scheduling {{ step [
              {{ model_name: "{first}" model_version: -1 input_map {{ key: "X" value: "IN" }} output_map {{ key: "Y" value: "MID" }} }},
              {{ model_name: "{second}" model_version: -1 input_map {{ key: "X" value: "MID" }} output_map {{ key: "Y" value: "OUT" }} }}
            ] }}"#
        );
        let mut config = tritium_config::parse_config(&text, std::path::Path::new("config.pbtxt")).expect("config");
        config.model_transaction_policy = Some(ModelTransactionPolicy { decoupled: first_decoupled });
        let step = |decoupled| {
            Arc::new(ModelConfig {
                model_transaction_policy: Some(ModelTransactionPolicy { decoupled }),
                ..ModelConfig::default()
            })
        };
        let v = EnsembleVersion {
            model: "e".into(),
            version: 1,
            stats: Arc::new(Stats::new("e", 1)),
            classes: Classes::default(),
        };
        Arc::new(Ensemble::new(
            v,
            Arc::new(config),
            &[step(first_decoupled), step(false)],
            &InstanceSettings::default(),
        ))
    }

    fn request(x: f32) -> InferRequest {
        InferRequest {
            model: "e".into(),
            inputs: vec![InputTensor {
                name: "IN".into(),
                datatype: DataType::Fp32,
                shape: vec![1],
                data: Bytes::copy_from_slice(&x.to_le_bytes()),
            }],
            outputs: vec![RequestedOutput::named("OUT")],
            ..InferRequest::default()
        }
    }

    fn out(response: &InferResponse) -> f32 {
        let o = &response.outputs[0];
        assert_eq!(o.name, "OUT");
        f32::from_le_bytes(o.data[..4].try_into().expect("one FP32"))
    }

    #[tokio::test]
    async fn each_response_of_a_decoupled_step_runs_the_steps_after_it() {
        let router = Arc::new(FakeRouter::default());
        let plan = ensemble("split", "double", true);
        assert!(plan.uses("double") && !plan.uses("e"));
        assert_eq!(plan.step_models(), ["double", "split"]);
        // A decoupled ensemble is refused a unary call.
        let unary = plan.infer(router.clone(), request(3.0)).await;
        assert_eq!(unary.map_err(|e| e.kind), Err(ErrorKind::Unsupported));

        let mut stream = plan.infer_decoupled(router.clone(), request(3.0)).expect("started");
        let mut values = Vec::new();
        while let Streamed::Response { result, last } = stream.recv().await.expect("a final message") {
            assert!(!last);
            let response = result.expect("a response");
            assert_eq!((response.model.as_str(), response.version), ("e", 1));
            values.push(out(&response));
        }
        values.sort_by(f32::total_cmp);
        assert_eq!(values, [6.0, 8.0]);
        assert_eq!(*router.called.lock().expect("called"), ["split", "double", "double"]);
        assert_eq!(plan.stats.snapshot().success.count, 1);
    }

    /// Bytes that say when they are freed.
    struct Watched(Arc<std::sync::atomic::AtomicBool>, [u8; 4]);

    impl AsRef<[u8]> for Watched {
        fn as_ref(&self) -> &[u8] {
            &self.1
        }
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_tensor_is_released_once_its_last_consumer_has_run() {
        let router = Arc::new(FakeRouter::default());
        let plan = ensemble("double", "gated", false);
        let freed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut req = request(1.5);
        req.inputs[0].data = Bytes::from_owner(Watched(freed.clone(), 1.5f32.to_le_bytes()));
        let answer = tokio::spawn(plan.clone().infer(router.clone(), req));
        // The second step runs (and waits) only after the first answered, which was IN's only
        // consumer: IN is gone before the request ends.
        while !router.called.lock().expect("called").contains(&"gated".to_string()) {
            tokio::task::yield_now().await;
        }
        assert!(freed.load(std::sync::atomic::Ordering::SeqCst), "IN is still held while the last step runs");
        router.gate.notify_one();
        let response = answer.await.expect("joined").expect("answered");
        assert_eq!(out(&response), 6.0);
    }

    #[tokio::test]
    async fn a_step_that_fails_ends_the_request_with_the_ensembles_text() {
        let router = Arc::new(FakeRouter::default());
        let plan = ensemble("double", "fail", false);
        let e = plan.infer(router.clone(), request(1.0)).await.expect_err("the second step fails");
        assert_eq!(e.kind, ErrorKind::InvalidArg);
        assert_eq!(e.message, "in ensemble 'e', model 'fail' refused the request");
        assert_eq!(*router.called.lock().expect("called"), ["double", "fail"]);
        let stats = plan.stats.snapshot();
        assert_eq!((stats.success.count, stats.fail.count), (0, 1));

        // Both steps succeed: one response, with the sequence parameters Triton adds.
        let plan = ensemble("double", "double", false);
        let response = plan.infer(router, request(1.0)).await.expect("answered");
        assert_eq!(out(&response), 4.0);
        assert!(response.parameters.iter().any(|(k, v)| k == "sequence_id" && *v == ParamValue::Int(0)));
    }
}
