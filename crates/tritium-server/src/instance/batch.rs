//! One batch's steps, shared by the worker thread and the async lane: [`place_inputs`] (each
//! input copied once into the stub's arena, or a client's region mapped), execute (`ring.rs`),
//! [`collect_responses`] (outputs read, ordered and classified) and the answers with their
//! times ([`answer_batch`]).

use super::*;

/// The input blocks the server placed for `requests`, to free if the `Execute` never left.
pub(super) fn input_blocks(requests: &[Request]) -> Vec<Descriptor> {
    requests
        .iter()
        .flat_map(|r| &r.inputs)
        .filter_map(|t| match t.data {
            TensorData::Shm { desc, .. } => Some(desc),
            TensorData::Cuda { .. } => None,
        })
        .collect()
}

/// Why one request of a batch failed before or after `execute`.
#[derive(Debug, thiserror::Error)]
pub(super) enum RequestError {
    /// Its input could not be copied into the stub's shared memory.
    #[error("cannot place input '{input}' in shared memory: {source}")]
    Placement {
        /// The input.
        input: String,
        /// Why.
        #[source]
        source: Box<HostError>,
    },
    /// An output's descriptor from the stub could not be read.
    #[error("{0}")]
    Output(#[source] Box<HostError>),
    /// A client's region the request uses is no longer valid (the client shrank its file).
    #[error("{0}")]
    Region(InferError),
    /// An output asked for as classes could not be classified.
    #[error(transparent)]
    Classify(#[from] ClassifyError),
    /// The response's outputs are larger than `--max-output-bytes`.
    #[error(
        "the model's response holds {bytes} bytes of outputs, more than the limit of {limit} bytes (server flag --max-output-bytes)"
    )]
    OutputTooLarge {
        /// The outputs' bytes.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
}

impl From<RequestError> for InferError {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::Classify(c) => c.into(),
            RequestError::Region(e) => e,
            other => InferError::internal(other.to_string()),
        }
    }
}

/// A batch's requests as sent to the stub, and those waiting for their answers by id.
#[derive(Default)]
pub(super) struct Placed {
    pub(super) requests: Vec<Request>,
    pub(super) waiting: HashMap<u64, Pending>,
    /// The sum of the requests' batch sizes (1 each for non-batching models).
    pub(super) batch_size: u64,
}

/// When a batch was taken from the queue, had its inputs placed, started (the worker turned to
/// it), and ended (its `ExecuteDone` came).
pub(super) struct Stamps {
    pub(super) taken: Instant,
    pub(super) placed: Instant,
    pub(super) started: Instant,
    pub(super) ended: Instant,
}

/// What the clients of a failed batch are told: the error's text, as Triton words it (an
/// exception's rendering ends with its "At:" frames). The Python traceback goes to the server
/// log, at verbose level: a failing model would otherwise fill the log.
pub(super) fn client_text(ctx: &VersionContext, e: tritium_ipc::StubError) -> String {
    if e.traceback.is_some() {
        tracing::debug!(model = %ctx.model, version = ctx.version, "execute failed: {e:#}");
    }
    e.message
}

/// Reads an ended batch's responses, records its times and answers every request in it.
/// Returns the stub's error if the stub is unusable (a response broke the protocol).
pub(super) fn answer_batch(
    ctx: &VersionContext,
    stub: &Stub,
    placed: Placed,
    executed: tritium_host::Executed,
    stamps: Stamps,
) -> Result<(), HostError> {
    let Stamps { taken: t0, placed: t1, started, ended: t2 } = stamps;
    // Reading the outputs starts after the next batch was sent, which is no part of this one.
    let output_start = Instant::now();
    let batch_error = executed.error.map(|e| client_text(ctx, e));
    let answers = collect_responses(ctx, stub, &executed.responses, batch_error, placed.waiting)?;
    let times =
        ExecTimes { compute_input: t1 - t0, compute_infer: t2 - started, compute_output: output_start.elapsed() };
    ctx.stats.execution(placed.batch_size, times);
    let t3 = Instant::now();
    for Answer { mut p, result, served } in answers {
        if p.tx.discards() {
            continue;
        }
        if let Some(trace) = p.trace.as_mut() {
            trace.stamp(Activity::ComputeStart, t0);
            trace.stamp(Activity::ComputeInputEnd, t1);
            trace.stamp(Activity::ComputeOutputStart, output_start);
            trace.stamp(Activity::ComputeEnd, t3);
        }
        let queue = t0.saturating_duration_since(p.enqueued);
        if served {
            ctx.stats.request_success(&p.req, p.batch_size, p.enqueued.elapsed(), queue, times);
            p.tx.send(result);
        } else {
            answer_request(ctx, p, result, Some((queue, times)));
        }
    }
    Ok(())
}

/// One request's answer after `execute`.
pub(super) struct Answer {
    pub(super) p: Pending,
    pub(super) result: Result<InferResponse, InferError>,
    /// The model answered it: statistics count it as a success even when its classification
    /// is refused, as Triton's do (its frontends classify after the core has counted).
    pub(super) served: bool,
}

/// Step 1: copies each request's inputs into the stub's shared memory. Requests whose client
/// went away, or whose inputs do not fit, are answered at once and left out.
pub(super) fn place_inputs(ctx: &VersionContext, stub: &Stub, batch: Vec<Pending>) -> Placed {
    let mut placed = Placed { requests: Vec::with_capacity(batch.len()), ..Default::default() };
    forget_dead_regions(stub);
    let mut adjacent = place_adjacent(ctx, stub, &batch).into_iter();
    for p in batch {
        let pre = adjacent.next().unwrap_or_default();
        if p.tx.is_closed() {
            // The client went away while the request waited (a dropped HTTP connection, a
            // cancelled gRPC call): do not spend the model's time on it.
            free_adjacent(stub, &pre);
            answer_request(ctx, p, Err(InferError::new(ErrorKind::Cancelled, CANCELLED)), None);
            continue;
        }
        let inputs = match place_request(ctx, stub, &p, &pre) {
            Ok(inputs) => inputs,
            Err(e) => {
                answer_request(ctx, p, Err(e.into()), None);
                continue;
            }
        };
        if let Some(Err(e)) =
            p.outputs.iter().filter_map(|o| o.shm.as_ref()).map(|t| t.check_size()).find(Result::is_err)
        {
            free_inputs(stub, &inputs);
            answer_request(ctx, p, Err(e), None);
            continue;
        }
        let output_regions = match output_regions(stub, &p.outputs) {
            Ok(regions) => regions,
            Err(source) => {
                let e = RequestError::Placement { input: "(an output's shared memory region)".into(), source };
                free_inputs(stub, &inputs);
                answer_request(ctx, p, Err(e.into()), None);
                continue;
            }
        };
        let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
        placed.batch_size += p.batch_size.max(1);
        placed.requests.push(Request {
            id,
            request_id: p.req.id.clone(),
            correlation_id: p.req.correlation_id.clone(),
            flags: p.req.flags,
            timeout_us: p.req.timeout_us,
            parameters: p.req.parameters.clone(),
            inputs,
            requested_outputs: p.outputs.iter().map(|o| o.name.clone()).collect(),
            trace: p.trace.as_ref().and_then(|t| t.model_context()).unwrap_or_default(),
            output_regions,
        });
        placed.waiting.insert(id, p);
    }
    placed
}

/// One request's inputs in shared memory, with those [`place_adjacent`] already copied (`pre`,
/// by position); on failure the blocks already placed are freed.
pub(super) fn place_request(
    ctx: &VersionContext,
    stub: &Stub,
    p: &Pending,
    pre: &[Option<Descriptor>],
) -> Result<Vec<tritium_ipc::Tensor>, RequestError> {
    let mut inputs = Vec::with_capacity(p.req.inputs.len());
    for (position, t) in p.req.inputs.iter().enumerate() {
        // The client may have shrunk its region while the request was queued: the request fails
        // alone, and the stub never maps a file shorter than the registration.
        if let Err(e) = crate::shm::check_input_region(&t.data) {
            free_inputs(stub, &inputs);
            free_adjacent(stub, pre.get(position..).unwrap_or_default());
            return Err(RequestError::Region(e));
        }
        let data = match pre.get(position).copied().flatten() {
            Some(desc) => Ok(TensorData::Shm { desc, writable: true }),
            None => place_input(ctx, stub, &t.data),
        };
        match data {
            Ok(data) => inputs.push(tritium_ipc::Tensor {
                name: t.name.clone(),
                dtype: t.datatype,
                shape: t.shape.clone(),
                data,
            }),
            Err(source) => {
                free_inputs(stub, &inputs);
                free_adjacent(stub, pre.get(position..).unwrap_or_default());
                return Err(RequestError::Placement { input: t.name.clone(), source });
            }
        }
    }
    Ok(inputs)
}

/// Where one input's bytes reach the stub, and whether the model may write to them: bytes that
/// lie in a client's registered region are passed as they are (no copy, read-only); bytes from a
/// client's CUDA region, for a model that asks for GPU inputs, as the region's IPC handle (the
/// stub opens it; no copy on the way to the model); any others are copied into a block of the
/// stub's arena that belongs to this request alone.
pub(super) fn place_input(ctx: &VersionContext, stub: &Stub, data: &[u8]) -> Result<TensorData, Box<HostError>> {
    if let Some((region, offset)) = crate::shm::lookup(data.as_ptr(), data.len()) {
        map_region(stub, &region, false)?;
        let desc = Descriptor { segment: region.id(), offset, len: data.len() as u64 };
        return Ok(TensorData::Shm { desc, writable: false });
    }
    if ctx.gpu_inputs && !data.is_empty() {
        if let Some(cuda) = crate::shm::lookup_cuda(data.as_ptr(), data.len()) {
            return Ok(cuda);
        }
    }
    Ok(TensorData::Shm { desc: stub.input(data)?, writable: true })
}

/// Frees the blocks of inputs placed for a request that is not sent (a client region's need
/// nothing: `free_own` leaves them alone).
pub(super) fn free_inputs(stub: &Stub, inputs: &[tritium_ipc::Tensor]) {
    for t in inputs {
        if let TensorData::Shm { desc, .. } = t.data {
            let _ = stub.channel().free_own(desc);
        }
    }
}

/// Maps a client's region into the stub, once per stub and use (system shared memory): for
/// inputs read-only, under the region's id, from a read-only descriptor (model code can neither
/// write nor truncate the client's file); for outputs the stub writes there, read-write, under
/// the region's output id.
pub(super) fn map_region(stub: &Stub, region: &crate::shm::Region, output: bool) -> Result<(), Box<HostError>> {
    let channel = stub.channel();
    let (id, fd) = if output { (region.output_id(), region.fd()) } else { (region.id(), region.read_only_fd()) };
    if channel.has_region(id) {
        return Ok(());
    }
    channel
        .add_region(id, fd, region.file_offset(), region.byte_size())
        .map_err(|source| Box::new(HostError::Ipc { instance: stub.instance().to_string(), source }))
}

/// The outputs a request wants written into client regions, as descriptors for the stub.
pub(super) fn output_regions(
    stub: &Stub,
    outputs: &[RequestedOutput],
) -> Result<Vec<(String, Descriptor)>, Box<HostError>> {
    let mut regions = Vec::new();
    // Outputs in CUDA regions come back through the arena: the server copies them to the device.
    for o in outputs {
        if let Some((region, desc)) = o.shm.as_ref().and_then(|target| target.system()) {
            map_region(stub, region, true)?;
            regions.push((o.name.clone(), desc));
        }
    }
    Ok(regions)
}

/// Unmaps from the stub the client regions that are gone from the server (unregistered, and
/// their last request ended): called before each batch.
pub(super) fn forget_dead_regions(stub: &Stub) {
    let channel = stub.channel();
    for id in channel.region_ids() {
        if !crate::shm::is_live(id) {
            let _ = channel.remove_region(id);
        }
    }
}

/// A batch whose `Execute` message does not fit the ring, as its clients see it.
pub(super) fn too_large_batch(model: &str, len: usize, capacity: usize, per_request: usize) -> String {
    format!(
        "the batch's request metadata for model '{model}' (request ids, parameters, tensor names) encodes to {len} bytes, \
         more than the {capacity} bytes the message ring to the model's stub holds; nothing was sent to the model. \
         Send less metadata per request (each request may carry at most {per_request} bytes of id and parameters: \
         server flag --max-request-metadata-bytes)"
    )
}

/// Step 2's failure as the batch's clients see it.
pub(super) fn execute_failure(model: &str, instance: &str, e: &HostError) -> String {
    match e {
        HostError::Timeout { after, .. } => format!(
            "model '{model}' instance '{instance}' did not finish execute within {}s (parameters {{ key: \"execute_timeout_secs\" }}); the instance was killed and is restarting",
            after.as_secs_f64()
        ),
        other => other.to_string(),
    }
}

/// Step 3: turns the stub's responses into answers; a request without a response gets the
/// batch's error, or says that the model sent none. A response the model sent before `execute`
/// raised stands, as in Triton (its L0_backend_python response_sender tests): the request had
/// completed, and the error is only logged by the stub. Every output descriptor is checked against
/// its tensor's shape and type first: a mismatch is the stub breaking the protocol (its own code
/// writes both from one array), so the whole batch fails and the error is returned for the
/// supervisor to restart the stub. Responses over `--max-output-bytes` fail alone.
pub(super) fn collect_responses(
    ctx: &VersionContext,
    stub: &Stub,
    responses: &[tritium_ipc::Response],
    batch_error: Option<String>,
    mut waiting: HashMap<u64, Pending>,
) -> Result<Vec<Answer>, HostError> {
    let limit = ctx.settings.max_output_bytes;
    let mut sizes = Vec::with_capacity(responses.len());
    for resp in responses {
        match output_bytes(resp) {
            Ok(bytes) => sizes.push(bytes),
            Err(why) => {
                for r in responses {
                    stub.release_outputs(r);
                }
                let e = HostError::Protocol { instance: stub.instance().to_string(), message: why };
                let message = e.to_string();
                for (_, p) in waiting.drain() {
                    answer_request(ctx, p, Err(InferError::internal(message.clone())), None);
                }
                return Err(e);
            }
        }
    }
    let mut answers = Vec::with_capacity(responses.len());
    for (resp, bytes) in responses.iter().zip(sizes) {
        let Some(p) = waiting.remove(&resp.request) else {
            stub.release_outputs(resp);
            continue;
        };
        let (result, served) = match &resp.error {
            Some(e) => (Err(InferError::new(ErrorKind::from_triton_code(e.code), e.message.clone())), false),
            None if bytes > limit => (Err(RequestError::OutputTooLarge { bytes, limit }.into()), false),
            None => match read_outputs(stub, resp, &p.outputs) {
                Err(e) => (Err(e.into()), false),
                Ok(outputs) => {
                    let response =
                        shape_outputs(outputs, &p.outputs, &ctx.reshapes, &ctx.classes).map(|outputs| InferResponse {
                            model: ctx.model.clone(),
                            version: ctx.version,
                            id: p.req.id.clone(),
                            outputs,
                            parameters: resp.parameters.clone(),
                        });
                    (response.map_err(InferError::from), true)
                }
            },
        };
        stub.release_outputs(resp);
        answers.push(Answer { p, result, served });
    }
    let fallback = batch_error.unwrap_or_else(|| "the model sent no response for this request".to_string());
    for (_, p) in waiting.drain() {
        answers.push(Answer { p, result: Err(InferError::internal(fallback.clone())), served: false });
    }
    Ok(answers)
}

/// The bytes of a response's outputs, after checking that each fixed-size output's descriptor
/// holds exactly shape × element size bytes (and every shape is a real one). The error is the
/// protocol violation, in words.
pub(super) fn output_bytes(resp: &tritium_ipc::Response) -> Result<u64, String> {
    let mut total = 0u64;
    for t in &resp.outputs {
        let len = match &t.data {
            TensorData::Shm { desc, .. } => desc.len,
            TensorData::Cuda { .. } => 0,
        };
        let dims = validate::dims(&t.shape);
        let elements = t
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| u64::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
            .ok_or_else(|| format!("output '{}' has shape {dims}, which no tensor has", t.name))?;
        if let Some(size) = t.dtype.element_size() {
            let expected = elements.checked_mul(size as u64);
            if expected != Some(len) {
                return Err(format!(
                    "output '{}' of type {} and shape {dims} needs {} bytes, but its descriptor holds {len}",
                    t.name,
                    t.dtype.wire_name(),
                    expected.map_or_else(|| "more than 2^64".to_string(), |e| e.to_string()),
                ));
            }
        }
        total = total.saturating_add(len);
    }
    Ok(total)
}

/// A response's output tensors, copied out of the stub's shared memory. An output the stub
/// wrote into the client's region comes back without bytes, after checking that it lies in the
/// range the request gave for it.
pub(super) fn read_outputs(
    stub: &Stub,
    resp: &tritium_ipc::Response,
    requested: &[RequestedOutput],
) -> Result<Vec<OutputTensor>, RequestError> {
    resp.outputs
        .iter()
        .map(|t| {
            if let TensorData::Shm { desc, .. } = &t.data {
                if desc.in_client_region() {
                    let target = requested.iter().find(|r| r.name == t.name).and_then(|r| r.shm.as_ref());
                    let fits = target.and_then(|target| target.system()).is_some_and(|(_, want)| {
                        want.segment == desc.segment && want.offset == desc.offset && desc.len <= want.len
                    });
                    if !fits {
                        return Err(RequestError::Output(Box::new(HostError::Protocol {
                            instance: stub.instance().to_string(),
                            message: format!(
                                "output '{}' names a client shared memory range the request did not give it",
                                t.name
                            ),
                        })));
                    }
                    return Ok(OutputTensor {
                        name: t.name.clone(),
                        datatype: t.dtype,
                        shape: t.shape.clone(),
                        data: Vec::new(),
                    });
                }
            }
            let view = stub.output(&t.data).map_err(|e| RequestError::Output(Box::new(e)))?;
            Ok(OutputTensor { name: t.name.clone(), datatype: t.dtype, shape: t.shape.clone(), data: view.to_vec() })
        })
        .collect()
}

/// The outputs in the order the client asked for them, in their `dims` shape where the config
/// reshapes them, those asked for as classes replaced by their top classes.
pub(super) fn shape_outputs(
    mut outputs: Vec<OutputTensor>,
    requested: &[RequestedOutput],
    reshapes: &crate::reshape::Reshapes,
    classes: &Classes,
) -> Result<Vec<OutputTensor>, RequestError> {
    outputs.sort_by_key(|o| requested.iter().position(|r| r.name == o.name).unwrap_or(usize::MAX));
    for o in &mut outputs {
        reshapes.output(&o.name, &mut o.shape);
        if let Some(k) = requested.iter().find(|r| r.name == o.name).and_then(|r| r.classification) {
            *o = classes.classify(o, k)?;
        }
    }
    Ok(outputs)
}

/// Sends `result` to one request's client and counts it in the statistics: a success only
/// when it is `Ok` and comes with the `timing` of the batch it ran in.
pub(super) fn answer_request(
    ctx: &VersionContext,
    p: Pending,
    result: Result<InferResponse, InferError>,
    timing: Option<(Duration, ExecTimes)>,
) {
    if p.tx.discards() {
        return;
    }
    let total = p.enqueued.elapsed();
    match (&result, timing) {
        (Ok(_), Some((queue, times))) => ctx.stats.request_success(&p.req, p.batch_size, total, queue, times),
        (Err(e), timing) => ctx.stats.failure(total, e.kind, timing.is_some() || e.kind == ErrorKind::Internal),
        (Ok(_), None) => ctx.stats.failure(total, ErrorKind::Internal, true),
    }
    p.tx.send(result);
}
