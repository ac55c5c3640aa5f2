//! Conversions between the `inference` protobuf messages and `tritium_server`'s types, with
//! Triton's checks and error texts (`src/grpc/infer_handler.cc` and `src/grpc/grpc_utils.{h,cc}` in
//! `triton-inference-server/server`). Classification outputs arrive classified from the core.
//!
//! Everything here is a plain function of its arguments, so the whole wire mapping is unit-tested
//! without a network; the service only moves messages in and out.

use std::collections::HashMap;

use bytes::Bytes;
use prost::Message;
use tonic::{Code, Status};
use tritium_proto::inference::infer_parameter::ParameterChoice;
use tritium_proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use tritium_proto::inference::model_infer_response::InferOutputTensor;
use tritium_proto::inference::model_metadata_response::TensorMetadata as ProtoTensorMetadata;
use tritium_proto::inference::model_repository_parameter::ParameterChoice as RepoParam;
use tritium_proto::inference::repository_index_response::ModelIndex;
use tritium_proto::inference::{
    InferBatchStatistics, InferParameter, InferStatistics, InferTensorContents, ModelInferRequest, ModelInferResponse,
    ModelMetadataResponse, ModelRepositoryParameter, ModelStatistics, RepositoryIndexResponse, ServerMetadataResponse,
    StatisticDuration,
};
use tritium_server::{
    parse_version, CorrelationId, DataType, ErrorKind, IndexEntry, InferError, InferRequest, InferResponse,
    InputTensor, ModelMetadata, ModelStats, ParamValue, RequestedOutput, ServerMetadata, StatDuration, TensorMetadata,
    FLAG_SEQUENCE_END, FLAG_SEQUENCE_START,
};

/// The largest message Triton's gRPC server sends or accepts (`MAX_GRPC_MESSAGE_SIZE`, `INT32_MAX`).
pub const MAX_GRPC_MESSAGE_SIZE: usize = i32::MAX as usize;
/// Request parameters starting with `triton_` that Triton accepts (`TRITON_RESERVED_REQUEST_PARAMS`).
const TRITON_RESERVED_REQUEST_PARAMS: &[&str] = &["triton_enable_empty_final_response"];

/// The gRPC status code for an error kind, as Triton's `GrpcStatusUtil::CodeToStatus`
/// (`src/grpc/grpc_utils.cc`) maps `TRITONSERVER_Error_Code`s.
pub fn code_for(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::Unknown => Code::Unknown,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::InvalidArg => Code::InvalidArgument,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::Cancelled => Code::Cancelled,
    }
}

/// The gRPC status for an error: Triton's code, the message unchanged.
pub fn to_status(e: InferError) -> Status {
    Status::new(code_for(e.kind), e.message)
}

/// What the reserved request parameters set, and the rest for the model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestParams {
    /// Parameters passed to the model, sorted by name (a protobuf map has no order).
    pub parameters: Vec<(String, ParamValue)>,
    /// From `sequence_id`.
    pub correlation_id: CorrelationId,
    /// From `sequence_start` and `sequence_end`.
    pub flags: u32,
    /// From `timeout`, in microseconds.
    pub timeout_us: u64,
    /// From `priority`.
    pub priority: u64,
}

fn invalid(message: impl Into<String>) -> InferError {
    InferError::invalid(message)
}

/// Request parameters as Triton's `SetInferenceRequestMetadata` reads them: the sequence
/// parameters, `priority` and `timeout` are consumed (checked with Triton's texts); keys with the
/// `triton_` prefix are refused unless Triton reserves them; every other parameter goes to the
/// model as a bool, int64, string or double (`uint64_param` only counts for `priority`).
pub fn request_parameters(params: &HashMap<String, InferParameter>) -> Result<RequestParams, InferError> {
    let mut entries: Vec<(&String, &InferParameter)> = params.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = RequestParams::default();
    for (key, param) in entries {
        let choice = param.parameter_choice.as_ref();
        match key.as_str() {
            "sequence_id" => {
                out.correlation_id = match choice {
                    Some(ParameterChoice::Int64Param(0)) => CorrelationId::None,
                    // Triton passes the int64 to `TRITONSERVER_InferenceRequestSetCorrelationId(uint64_t)`.
                    Some(ParameterChoice::Int64Param(v)) => CorrelationId::U64(*v as u64),
                    Some(ParameterChoice::StringParam(s)) if s.is_empty() => CorrelationId::None,
                    Some(ParameterChoice::StringParam(s)) => CorrelationId::Str(s.clone()),
                    _ => {
                        return Err(invalid(
                            "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
                        ))
                    }
                }
            }
            "sequence_start" | "sequence_end" => {
                let Some(ParameterChoice::BoolParam(b)) = choice else {
                    return Err(invalid(format!("invalid value type for '{key}' parameter, expected bool_param.")));
                };
                if *b {
                    out.flags |= if key == "sequence_start" { FLAG_SEQUENCE_START } else { FLAG_SEQUENCE_END };
                }
            }
            "priority" => match choice {
                Some(ParameterChoice::Int64Param(v)) if *v < 0 => {
                    return Err(invalid("invalid value for 'priority', expected value >= 0."))
                }
                // Triton consumes the priority itself: it never reaches the model's parameters.
                Some(ParameterChoice::Int64Param(v)) => out.priority = u64::try_from(*v).unwrap_or(0),
                Some(ParameterChoice::Uint64Param(v)) => out.priority = *v,
                _ => {
                    return Err(invalid(
                        "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
                    ))
                }
            },
            "timeout" => {
                let Some(ParameterChoice::Int64Param(v)) = choice else {
                    return Err(invalid("invalid value type for 'timeout' parameter, expected int64_param."));
                };
                // Triton casts to uint64_t, so a negative timeout is a practically infinite one:
                // the same as none.
                out.timeout_us = u64::try_from(*v).unwrap_or(0);
            }
            k if k.starts_with("triton_") => {
                if !TRITON_RESERVED_REQUEST_PARAMS.contains(&k) {
                    return Err(invalid(format!(
                        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with 'triton_' are allowed: {}",
                        TRITON_RESERVED_REQUEST_PARAMS.join(" ")
                    )));
                }
                // `triton_enable_empty_final_response` only matters for decoupled models, which
                // answer over a stream; it is checked and not passed to the model.
                if !matches!(choice, Some(ParameterChoice::BoolParam(_))) {
                    return Err(invalid(format!("invalid value type for '{k}' parameter, expected bool_param.")));
                }
            }
            _ => {
                let value = match choice {
                    Some(ParameterChoice::Int64Param(v)) => ParamValue::Int(*v),
                    Some(ParameterChoice::BoolParam(v)) => ParamValue::Bool(*v),
                    Some(ParameterChoice::StringParam(v)) => ParamValue::Str(v.clone()),
                    Some(ParameterChoice::DoubleParam(v)) => ParamValue::Double(*v),
                    Some(ParameterChoice::Uint64Param(_)) | None => {
                        return Err(invalid(format!(
                        "invalid value type for '{key}' parameter, expected int64_param, bool_param, or string_param."
                    )))
                    }
                };
                out.parameters.push((key.clone(), value));
            }
        }
    }
    Ok(out)
}

/// Model parameters as protobuf parameters (response parameters).
pub fn parameters_to_proto(params: &[(String, ParamValue)]) -> HashMap<String, InferParameter> {
    params
        .iter()
        .map(|(k, v)| {
            let choice = match v {
                ParamValue::Bool(b) => ParameterChoice::BoolParam(*b),
                ParamValue::Int(i) => ParameterChoice::Int64Param(*i),
                ParamValue::Double(d) => ParameterChoice::DoubleParam(*d),
                ParamValue::Str(s) => ParameterChoice::StringParam(s.clone()),
            };
            (k.clone(), InferParameter { parameter_choice: Some(choice) })
        })
        .collect()
}

/// Where a tensor's data lives in client shared memory, per the `shared_memory_*` tensor
/// parameters (Triton's `ParseSharedMemoryParams`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRef {
    /// `shared_memory_region`.
    pub region: String,
    /// `shared_memory_offset` (0 when absent).
    pub offset: i64,
    /// `shared_memory_byte_size`.
    pub byte_size: i64,
}

/// Reads a tensor's `shared_memory_*` parameters with Triton's checks and texts.
pub fn shared_memory_params(
    tensor: &str,
    params: &HashMap<String, InferParameter>,
) -> Result<Option<ShmRef>, InferError> {
    let choice = |key: &str| params.get(key).map(|p| p.parameter_choice.as_ref());
    let region = match choice("shared_memory_region") {
        None => None,
        Some(Some(ParameterChoice::StringParam(s))) => Some(s.clone()),
        Some(_) => {
            return Err(invalid(format!(
                "invalid value type for 'shared_memory_region' parameter for tensor '{tensor}', expected string_param."
            )))
        }
    };
    let int_param = |key: &str| -> Result<Option<i64>, InferError> {
        match choice(key) {
            None => Ok(None),
            Some(_) if region.is_none() => Err(invalid(format!(
                "'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{tensor}'"
            ))),
            Some(Some(ParameterChoice::Int64Param(v))) => Ok(Some(*v)),
            Some(_) => Err(invalid(format!(
                "invalid value type for '{key}' parameter for tensor '{tensor}', expected int64_param."
            ))),
        }
    };
    let offset = int_param("shared_memory_offset")?;
    let byte_size = int_param("shared_memory_byte_size")?;
    let Some(region) = region else { return Ok(None) };
    let Some(byte_size) = byte_size else {
        return Err(invalid(format!(
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor '{tensor}'"
        )));
    };
    Ok(Some(ShmRef { region, offset: offset.unwrap_or(0), byte_size }))
}

/// The registered regions a request's `shared_memory_*` tensors resolve against; without one
/// (a conversion with no server) every region is unknown.
type Regions<'a> = Option<&'a tritium_server::shm::ShmRegistry>;

fn unknown_region(shm: &ShmRef) -> InferError {
    InferError::not_found(format!("Unable to find shared memory region: '{}'", shm.region))
}

/// An input's bytes in a registered region (no copy). Triton keeps offset and size in
/// `size_t`s, so a negative one becomes huge and fails its bounds checks; so does it here.
fn shm_input(regions: Regions<'_>, shm: &ShmRef) -> Result<Bytes, InferError> {
    regions.ok_or_else(|| unknown_region(shm))?.input(&shm.region, shm.offset as u64, shm.byte_size as u64)
}

fn shm_output(regions: Regions<'_>, shm: &ShmRef) -> Result<tritium_server::shm::ShmTarget, InferError> {
    regions.ok_or_else(|| unknown_region(shm))?.output(&shm.region, shm.offset as u64, shm.byte_size as u64)
}

/// Parses a KServe datatype name.
pub fn parse_datatype(input: &str, name: &str) -> Result<DataType, InferError> {
    DataType::from_wire_name(name).ok_or_else(|| {
        invalid(format!(
            "invalid datatype for input '{input}': '{name}' is not one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16, BYTES"
        ))
    })
}

/// Triton's `InferGRPCToInputHelper`: one typed-contents field may supply the data, and only for
/// the datatype it carries.
fn check_typed(input: &str, model: &str, field: DataType, dtype: DataType, supplied: bool) -> Result<(), InferError> {
    if supplied {
        return Err(invalid(format!(
            "unexpected explicit tensor data for input tensor '{input}' for model '{model}', binary data was already supplied."
        )));
    }
    if field != dtype {
        return Err(invalid(format!(
            "unexpected explicit tensor data for input tensor '{input}' for model '{model}' of type '{}', expected datatype '{}'",
            field.wire_name(),
            dtype.wire_name()
        )));
    }
    Ok(())
}

/// Little-endian bytes of every element, each cut to `width` bytes (Triton keeps the low bytes
/// of an `int_contents`/`uint_contents` element for 8- and 16-bit types).
fn le_bytes<T: Copy, const N: usize>(values: &[T], width: usize, to_le: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    let width = width.min(N);
    let mut out = Vec::with_capacity(values.len().saturating_mul(width));
    for v in values {
        out.extend_from_slice(&to_le(*v)[..width]);
    }
    out
}

/// Serializes strings as Triton's `BYTES` tensors carry them: a little-endian `u32` length
/// before each element.
pub fn serialize_bytes<B: AsRef<[u8]>>(input: &str, elements: &[B]) -> Result<Vec<u8>, InferError> {
    let total = elements.iter().map(|e| e.as_ref().len().saturating_add(4)).fold(0usize, usize::saturating_add);
    let mut out = Vec::with_capacity(total);
    for e in elements {
        let e = e.as_ref();
        let len = u32::try_from(e.len()).map_err(|_| {
            invalid(format!("element of input '{input}' is {} bytes, more than a BYTES element can hold", e.len()))
        })?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(e);
    }
    Ok(out)
}

/// The raw bytes of an input given as typed `contents`, exactly as Triton's `InferGRPCToInput`
/// builds them: little-endian elements, `BOOL` as one byte, `INT8`/`INT16` from `int_contents`
/// and `UINT8`/`UINT16` from `uint_contents`, `BYTES` serialized with length prefixes. `FP16` and
/// `BF16` have no typed field and must come as raw contents.
pub fn typed_contents(
    input: &str,
    model: &str,
    dtype: DataType,
    c: &InferTensorContents,
) -> Result<Vec<u8>, InferError> {
    let mut data: Option<Vec<u8>> = None;
    if !c.bool_contents.is_empty() {
        check_typed(input, model, DataType::Bool, dtype, data.is_some())?;
        data = Some(c.bool_contents.iter().map(|&b| u8::from(b)).collect());
    }
    if !c.int_contents.is_empty() {
        let (field, width) = match dtype {
            DataType::Int8 => (DataType::Int8, 1),
            DataType::Int16 => (DataType::Int16, 2),
            _ => (DataType::Int32, 4),
        };
        check_typed(input, model, field, dtype, data.is_some())?;
        data = Some(le_bytes(&c.int_contents, width, i32::to_le_bytes));
    }
    if !c.int64_contents.is_empty() {
        check_typed(input, model, DataType::Int64, dtype, data.is_some())?;
        data = Some(le_bytes(&c.int64_contents, 8, i64::to_le_bytes));
    }
    if !c.uint_contents.is_empty() {
        let (field, width) = match dtype {
            DataType::Uint8 => (DataType::Uint8, 1),
            DataType::Uint16 => (DataType::Uint16, 2),
            _ => (DataType::Uint32, 4),
        };
        check_typed(input, model, field, dtype, data.is_some())?;
        data = Some(le_bytes(&c.uint_contents, width, u32::to_le_bytes));
    }
    if !c.uint64_contents.is_empty() {
        check_typed(input, model, DataType::Uint64, dtype, data.is_some())?;
        data = Some(le_bytes(&c.uint64_contents, 8, u64::to_le_bytes));
    }
    if !c.fp32_contents.is_empty() {
        check_typed(input, model, DataType::Fp32, dtype, data.is_some())?;
        data = Some(le_bytes(&c.fp32_contents, 4, f32::to_le_bytes));
    }
    if !c.fp64_contents.is_empty() {
        check_typed(input, model, DataType::Fp64, dtype, data.is_some())?;
        data = Some(le_bytes(&c.fp64_contents, 8, f64::to_le_bytes));
    }
    if !c.bytes_contents.is_empty() {
        check_typed(input, model, DataType::Bytes, dtype, data.is_some())?;
        data = Some(serialize_bytes(input, &c.bytes_contents)?);
    }
    // Present but empty contents supply an empty tensor, as in Triton.
    Ok(data.unwrap_or_default())
}

/// The inputs of a request with their data, taken from typed `contents` or, in order, from
/// `raw_input_contents` (Triton's `InferGRPCToInput`). Raw contents beyond the inputs that use
/// them are ignored, as Triton ignores them.
pub fn decode_inputs(
    model: &str,
    inputs: Vec<InferInputTensor>,
    raw: &[Bytes],
    regions: Regions<'_>,
) -> Result<Vec<InputTensor>, InferError> {
    // Triton adds every input (name, datatype, shape) before it reads any data.
    let dtypes = inputs.iter().map(|io| parse_datatype(&io.name, &io.datatype)).collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::with_capacity(inputs.len());
    let mut raw_index = 0usize;
    for (io, datatype) in inputs.into_iter().zip(dtypes) {
        let name = io.name;
        if let Some(shm) = shared_memory_params(&name, &io.parameters)? {
            if io.contents.is_some() {
                return Err(invalid(format!(
                    "unexpected 'content' provided when using shared memory for input tensor '{name}' for model '{model}'"
                )));
            }
            let data = shm_input(regions, &shm)?;
            out.push(InputTensor { name, datatype, shape: io.shape, data });
            continue;
        }
        let data = match &io.contents {
            Some(_) if !raw.is_empty() => {
                return Err(invalid(format!(
                "contents field must not be specified when using raw_input_contents for '{name}' for model '{model}'"
            )))
            }
            Some(contents) => Bytes::from(typed_contents(&name, model, datatype, contents)?),
            None => match raw.get(raw_index) {
                Some(bytes) => {
                    raw_index += 1;
                    bytes.clone()
                }
                None => {
                    return Err(invalid(format!(
                        "unable to find data for input tensor '{name}' for model '{model}' in request."
                    )))
                }
            },
        };
        out.push(InputTensor { name, datatype, shape: io.shape, data });
    }
    Ok(out)
}

/// Triton's `ParseClassificationParams`: the number of classes asked for, if any.
pub fn classification_count(output: &InferRequestedOutputTensor) -> Result<Option<u32>, InferError> {
    let Some(param) = output.parameters.get("classification") else { return Ok(None) };
    let Some(ParameterChoice::Int64Param(count)) = param.parameter_choice else {
        return Err(invalid("invalid value type for 'classification' parameter, expected int64_param"));
    };
    if count <= 0 {
        return Err(invalid("invalid value for 'classification' parameter, expected >= 0"));
    }
    // Triton stores the count in a uint32_t.
    Ok(Some(u32::try_from(count).unwrap_or(u32::MAX)))
}

/// The outputs a request asks for, in its order, with their classification counts (Triton's
/// `InferAllocatorPayload`), and the registered region of those asked for in shared memory.
pub fn decode_outputs(
    outputs: &[InferRequestedOutputTensor],
    regions: Regions<'_>,
) -> Result<Vec<RequestedOutput>, InferError> {
    outputs
        .iter()
        .map(|o| {
            let shm = shared_memory_params(&o.name, &o.parameters)?;
            let classification = classification_count(o)?;
            if shm.is_some() && classification.is_some() {
                return Err(invalid("output can't set both 'shared_memory_region' and 'classification'"));
            }
            let shm = shm.map(|shm| shm_output(regions, &shm)).transpose()?;
            Ok(RequestedOutput { name: o.name.clone(), classification, shm })
        })
        .collect()
}

/// The most inputs, outputs or parameters (each) one `ModelInferRequest` may carry. A request
/// can only name inputs and outputs its model has (Triton refuses any other), and no model
/// configuration comes near a thousand of either; the cap turns a message of a million empty
/// entries into one cheap `INVALID_ARGUMENT` before any of them is converted. (prost has decoded
/// the message by then: `--grpc-max-message-size` bounds that.)
pub const MAX_REQUEST_ENTRIES: usize = 1024;

/// Refuses a request with more than [`MAX_REQUEST_ENTRIES`] inputs, outputs, parameters, raw
/// input contents, or parameters on one tensor.
pub fn check_request_counts(msg: &ModelInferRequest) -> Result<(), InferError> {
    let too_many = |what: &str, n: usize| {
        invalid(format!("the request has {n} {what}, more than the {MAX_REQUEST_ENTRIES} a request may have"))
    };
    let counts = [
        ("inputs", msg.inputs.len()),
        ("outputs", msg.outputs.len()),
        ("parameters", msg.parameters.len()),
        ("raw_input_contents", msg.raw_input_contents.len()),
    ];
    if let Some((what, n)) = counts.into_iter().find(|&(_, n)| n > MAX_REQUEST_ENTRIES) {
        return Err(too_many(what, n));
    }
    let tensor_params = msg.inputs.iter().map(|i| (&i.name, i.parameters.len()));
    let tensor_params = tensor_params.chain(msg.outputs.iter().map(|o| (&o.name, o.parameters.len())));
    for (name, n) in tensor_params {
        if n > MAX_REQUEST_ENTRIES {
            return Err(too_many(&format!("parameters on tensor {name:?}"), n));
        }
    }
    Ok(())
}

/// Decodes a `ModelInferRequest`, in Triton's order: version, request parameters, input
/// datatypes, input data, output parameters; the entry counts are checked first.
pub fn decode_infer_request(msg: ModelInferRequest) -> Result<InferRequest, InferError> {
    decode_infer_request_with(msg, None)
}

/// [`decode_infer_request`] with the server's registered shared memory regions, against which
/// `shared_memory_*` inputs and outputs are resolved (inputs without a copy).
pub fn decode_infer_request_with(msg: ModelInferRequest, regions: Regions<'_>) -> Result<InferRequest, InferError> {
    check_request_counts(&msg)?;
    let ModelInferRequest { model_name, model_version, id, parameters, inputs, outputs, raw_input_contents } = msg;
    let version = parse_version(&model_version)?;
    let params = request_parameters(&parameters)?;
    let inputs = decode_inputs(&model_name, inputs, &raw_input_contents, regions)?;
    let outputs = decode_outputs(&outputs, regions)?;
    Ok(InferRequest {
        model: model_name,
        version,
        id,
        inputs,
        outputs,
        parameters: params.parameters,
        correlation_id: params.correlation_id,
        flags: params.flags,
        timeout_us: params.timeout_us,
        priority: params.priority,
        trace: None,
        compute_tally: None,
    })
}

/// Encodes an inference response: every output with its raw contents (Triton always answers
/// with `raw_output_contents`).
pub fn encode_infer_response(resp: InferResponse) -> Result<ModelInferResponse, InferError> {
    let mut out = ModelInferResponse {
        model_name: resp.model,
        model_version: resp.version.to_string(),
        id: resp.id,
        parameters: parameters_to_proto(&resp.parameters),
        outputs: Vec::with_capacity(resp.outputs.len()),
        raw_output_contents: Vec::with_capacity(resp.outputs.len()),
    };
    for output in resp.outputs {
        out.outputs.push(InferOutputTensor {
            name: output.name,
            datatype: output.datatype.wire_name().to_string(),
            shape: output.shape,
            parameters: HashMap::new(),
            contents: None,
        });
        out.raw_output_contents.push(Bytes::from(output.data));
    }
    check_response_size(out.encoded_len())?;
    Ok(out)
}

/// Triton refuses a response larger than gRPC's message limit, with this text.
pub fn check_response_size(size: usize) -> Result<(), InferError> {
    if size > MAX_GRPC_MESSAGE_SIZE {
        return Err(invalid(format!(
            "Response has byte size {size} which exceeds gRPC's byte size limit {MAX_GRPC_MESSAGE_SIZE}."
        )));
    }
    Ok(())
}

/// An error answer on a stream, as Triton writes it: the message in `error_message` and an
/// otherwise empty `infer_response` carrying the request's id.
pub fn stream_error(id: String, e: &InferError) -> tritium_proto::inference::ModelStreamInferResponse {
    tritium_proto::inference::ModelStreamInferResponse {
        error_message: e.message.clone(),
        infer_response: Some(ModelInferResponse { id, ..Default::default() }),
    }
}

fn duration(d: StatDuration) -> Option<StatisticDuration> {
    Some(StatisticDuration { count: d.count, ns: d.ns })
}

/// One model version's statistics in Triton's `ModelStatistics` shape.
pub fn statistics_to_proto(s: ModelStats) -> ModelStatistics {
    ModelStatistics {
        name: s.name,
        version: s.version,
        last_inference: s.last_inference,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(InferStatistics {
            success: duration(s.success),
            fail: duration(s.fail),
            queue: duration(s.queue),
            compute_input: duration(s.compute_input),
            compute_infer: duration(s.compute_infer),
            compute_output: duration(s.compute_output),
            cache_hit: duration(s.cache_hit),
            cache_miss: duration(s.cache_miss),
        }),
        batch_stats: s
            .batch_stats
            .iter()
            .map(|b| InferBatchStatistics {
                batch_size: b.batch_size,
                compute_input: duration(b.compute_input),
                compute_infer: duration(b.compute_infer),
                compute_output: duration(b.compute_output),
            })
            .collect(),
        memory_usage: Vec::new(),
        response_stats: HashMap::new(),
    }
}

/// The repository index.
pub fn index_to_proto(entries: Vec<IndexEntry>) -> RepositoryIndexResponse {
    RepositoryIndexResponse {
        models: entries
            .into_iter()
            .map(|e| ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state,
                reason: e.reason,
                tritium_python: e.python,
                tritium_environment: e.environment,
            })
            .collect(),
    }
}

fn tensor_metadata(t: TensorMetadata) -> ProtoTensorMetadata {
    ProtoTensorMetadata { name: t.name, datatype: t.datatype, shape: t.shape }
}

/// A model's metadata.
pub fn model_metadata_to_proto(m: ModelMetadata) -> ModelMetadataResponse {
    ModelMetadataResponse {
        name: m.name,
        versions: m.versions,
        platform: m.platform,
        inputs: m.inputs.into_iter().map(tensor_metadata).collect(),
        outputs: m.outputs.into_iter().map(tensor_metadata).collect(),
    }
}

/// The server's metadata.
pub fn server_metadata_to_proto(m: ServerMetadata) -> ServerMetadataResponse {
    ServerMetadataResponse { name: m.name, version: m.version, extensions: m.extensions }
}

/// Checks `RepositoryModelLoad` parameters as Triton does (`config` must be a string and
/// `file:<path>` keys bytes; any other key is refused) and returns the `config` override (the
/// model's config as JSON) and the files.
pub fn load_parameters(
    params: &HashMap<String, ModelRepositoryParameter>,
) -> Result<(Option<String>, Vec<tritium_server::ModelFile>), InferError> {
    let mut entries: Vec<(&String, &ModelRepositoryParameter)> = params.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    let mut config = None;
    let mut files = Vec::new();
    for (key, param) in entries {
        let choice = param.parameter_choice.as_ref();
        if key == "config" {
            let Some(RepoParam::StringParam(text)) = choice else {
                return Err(invalid(format!("invalid value type for load parameter '{key}', expected string_param.")));
            };
            config = Some(text.clone());
        } else if key.starts_with(tritium_server::FILE_PREFIX) {
            let Some(RepoParam::BytesParam(bytes)) = choice else {
                return Err(invalid(format!("invalid value type for load parameter '{key}', expected bytes_param.")));
            };
            files.extend(tritium_server::ModelFile::from_parameter(key, bytes.to_vec()));
        } else {
            return Err(invalid(format!("unrecognized load parameter '{key}'.")));
        }
    }
    Ok((config, files))
}

/// Reads `RepositoryModelUnload` parameters as Triton does: `unload_dependents` (a bool; whether
/// an ensemble's step models go too) is returned, others are ignored.
pub fn unload_parameters(params: &HashMap<String, ModelRepositoryParameter>) -> Result<bool, InferError> {
    match params.get("unload_dependents").map(|p| p.parameter_choice.as_ref()) {
        None => Ok(false),
        Some(Some(RepoParam::BoolParam(b))) => Ok(*b),
        Some(_) => Err(invalid("invalid value type for 'unload_dependents' parameter, expected bool_param.")),
    }
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;

/// The settings a `LogSettings` request changes (none: a read).
pub fn log_update(
    req: &tritium_proto::inference::LogSettingsRequest,
) -> Result<tritium_server::LogSettingsUpdate, InferError> {
    use tritium_proto::inference::log_settings_request::setting_value::ParameterChoice as P;
    let mut u = tritium_server::LogSettingsUpdate::default();
    for (key, value) in &req.settings {
        let bad = |want: &str| InferError::invalid(format!("expect {want} for '{key}'"));
        let choice = value.parameter_choice.as_ref();
        match (key.as_str(), choice) {
            ("log_file", _) => return Err(tritium_server::log_file_refused()),
            ("log_format", Some(P::StringParam(v))) => u.log_format = Some(v.clone()),
            ("log_info", Some(P::BoolParam(v))) => u.log_info = Some(*v),
            ("log_warning", Some(P::BoolParam(v))) => u.log_warning = Some(*v),
            ("log_error", Some(P::BoolParam(v))) => u.log_error = Some(*v),
            ("log_verbose_level", Some(P::Uint32Param(v))) => u.log_verbose_level = Some(*v),
            ("log_format", _) => return Err(bad("string")),
            ("log_info" | "log_warning" | "log_error", _) => return Err(bad("boolean")),
            ("log_verbose_level", _) => return Err(bad("unsigned integer")),
            (other, _) => return Err(InferError::invalid(format!("Logging setting '{other}' is unknown"))),
        }
    }
    Ok(u)
}

/// The settings as a `LogSettings` response.
pub fn log_response(s: &tritium_server::LogSettings) -> tritium_proto::inference::LogSettingsResponse {
    use tritium_proto::inference::log_settings_response::setting_value::ParameterChoice as P;
    use tritium_proto::inference::log_settings_response::SettingValue;
    let entry = |k: &str, p: P| (k.to_string(), SettingValue { parameter_choice: Some(p) });
    tritium_proto::inference::LogSettingsResponse {
        settings: [
            entry("log_file", P::StringParam(s.log_file.clone())),
            entry("log_info", P::BoolParam(s.log_info)),
            entry("log_warning", P::BoolParam(s.log_warning)),
            entry("log_error", P::BoolParam(s.log_error)),
            entry("log_verbose_level", P::Uint32Param(s.log_verbose_level)),
            entry("log_format", P::StringParam(s.log_format.clone())),
        ]
        .into_iter()
        .collect(),
    }
}
