//! Request validation against a model's config, with Triton's checks, order and error texts.

use std::collections::HashSet;

use tritium_config::proto::{DataType as ConfigType, ModelConfig, ModelInput};

use crate::types::{DataType, ErrorKind, InferError, InferRequest, InputTensor, RequestedOutput};

/// What validation learned about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Validated {
    /// The batch size (first dimension) for batching models; 0 for non-batching ones.
    pub batch_size: u64,
    /// The outputs to return, in the order the client asked (all outputs if it asked none).
    pub outputs: Vec<RequestedOutput>,
}

/// Maps a config data type to the wire type; `None` for `TYPE_INVALID`.
pub(crate) fn wire_type(t: i32) -> Option<DataType> {
    Some(match ConfigType::try_from(t).ok()? {
        ConfigType::TypeInvalid => return None,
        ConfigType::TypeBool => DataType::Bool,
        ConfigType::TypeUint8 => DataType::Uint8,
        ConfigType::TypeUint16 => DataType::Uint16,
        ConfigType::TypeUint32 => DataType::Uint32,
        ConfigType::TypeUint64 => DataType::Uint64,
        ConfigType::TypeInt8 => DataType::Int8,
        ConfigType::TypeInt16 => DataType::Int16,
        ConfigType::TypeInt32 => DataType::Int32,
        ConfigType::TypeInt64 => DataType::Int64,
        ConfigType::TypeFp16 => DataType::Fp16,
        ConfigType::TypeFp32 => DataType::Fp32,
        ConfigType::TypeFp64 => DataType::Fp64,
        ConfigType::TypeString => DataType::Bytes,
        ConfigType::TypeBf16 => DataType::Bf16,
    })
}

/// Triton's `DimsListToString`: `[1,16]`.
pub(crate) fn dims(d: &[i64]) -> String {
    format!("[{}]", d.iter().map(i64::to_string).collect::<Vec<_>>().join(","))
}

fn quoted_list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    format!("[{}]", names.map(|n| format!("'{n}'")).collect::<Vec<_>>().join(","))
}

/// Why a request does not fit its model's config; each text is Triton's. `log` is the
/// `[request id: ...] ` prefix Triton puts on most of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Reason {
    /// An output the model does not have.
    #[error("unexpected inference output '{output}' for model '{model}'")]
    UnexpectedOutput { output: String, model: String },
    /// The same input twice.
    #[error("{log}input '{input}' already exists in request")]
    DuplicateInput { log: String, input: String },
    /// Too few or too many inputs.
    #[error(
        "{log}{expected} but got {got} inputs for model '{model}'. Got input(s) {names}, but missing required input(s) {missing}. Please provide all required input(s)."
    )]
    InputCount { log: String, expected: String, got: usize, model: String, names: String, missing: String },
    /// An input the model does not have.
    #[error("unexpected inference input '{input}' for model '{model}'")]
    UnexpectedInput { input: String, model: String },
    /// A batching model's input without a shape.
    #[error("{log}input '{input}' has no shape but model requires batch dimension for '{model}'")]
    NoBatchDimension { log: String, input: String, model: String },
    /// Inputs with different batch sizes.
    #[error("{log}input '{input}' batch size does not match other inputs for '{model}'")]
    BatchMismatch { log: String, input: String, model: String },
    /// A batch larger than `max_batch_size`.
    #[error("{log}inference request batch-size must be <= {max} for '{model}'")]
    BatchTooLarge { log: String, max: i32, model: String },
    /// An input of the wrong type.
    #[error("{log}inference input '{input}' data-type is '{got}', but model '{model}' expects '{expected}'")]
    DataType { log: String, input: String, got: &'static str, model: String, expected: &'static str },
    /// A `-1` in a request shape.
    #[error("{log}All input dimensions should be specified for input '{input}' for model '{model}', got {shape}")]
    UnspecifiedDimension { log: String, input: String, model: String, shape: String },
    /// A shape the config does not allow.
    #[error("{log}unexpected shape for input '{input}' for model '{model}'. Expected {expected}, got {got}. {note}")]
    Shape { log: String, input: String, model: String, expected: String, got: String, note: &'static str },
    /// A shape whose element count overflows.
    #[error("{log}shape {shape} of input '{input}' is too large")]
    ShapeTooLarge { log: String, shape: String, input: String },
    /// Fixed-size data of the wrong length.
    #[error("{log}input byte size mismatch for input '{input}' for model '{model}'. Expected {expected}, got {got}")]
    ByteSize { log: String, input: String, model: String, expected: u64, got: usize },
    /// A `BYTES` length prefix cut short.
    #[error(
        "{log}incomplete string length indicator for inference input '{input}' for model '{model}', expecting 4 bytes but only {available} bytes available. Please make sure the string length indicator is in one buffer."
    )]
    StringLength { log: String, input: String, model: String, available: usize },
    /// A `BYTES` element cut short.
    #[error(
        "{log}incomplete string data for inference input '{input}' for model '{model}', expecting string of length {len} but only {available} bytes available."
    )]
    StringData { log: String, input: String, model: String, len: usize, available: usize },
    /// A `BYTES` tensor with the wrong number of elements.
    #[error("{log}expected {expected} string elements for inference input '{input}' for model '{model}', got {got}")]
    StringCount { log: String, expected: u64, input: String, model: String, got: u64 },
}

/// A [`Reason`], boxed: the error path is cold and the reasons are large.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub(crate) struct Invalid(Box<Reason>);

impl Invalid {
    /// Why.
    #[cfg(test)]
    fn reason(&self) -> &Reason {
        &self.0
    }
}

impl From<Reason> for Invalid {
    fn from(r: Reason) -> Self {
        Self(Box::new(r))
    }
}

impl From<Invalid> for InferError {
    fn from(e: Invalid) -> Self {
        InferError::invalid(e.to_string())
    }
}

/// The request's log prefix and model name, which most texts carry.
struct Context<'a> {
    log: String,
    model: &'a str,
}

impl Context<'_> {
    fn log(&self) -> String {
        self.log.clone()
    }

    fn model(&self) -> String {
        self.model.to_string()
    }
}

const BATCH_NOTE: &str = "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size.";

/// Counts the elements of a serialized BYTES tensor, checking every length prefix.
fn check_bytes(cx: &Context<'_>, input: &str, data: &[u8], expected: u64) -> Result<(), Invalid> {
    let mut rest = data;
    let mut count = 0u64;
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(Reason::StringLength {
                log: cx.log(),
                input: input.to_string(),
                model: cx.model(),
                available: rest.len(),
            }
            .into());
        };
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(Reason::StringData {
                log: cx.log(),
                input: input.to_string(),
                model: cx.model(),
                len,
                available: tail.len(),
            }
            .into());
        }
        rest = &tail[len..];
        count += 1;
    }
    if count != expected {
        return Err(Reason::StringCount {
            log: cx.log(),
            expected,
            input: input.to_string(),
            model: cx.model(),
            got: count,
        }
        .into());
    }
    Ok(())
}

/// The bytes of a request's metadata that travel to the stub besides its tensors: its id, a
/// string sequence id, and its parameters' keys and string values (other values count 8 bytes).
pub(crate) fn metadata_bytes(req: &InferRequest) -> usize {
    let sequence_id = match &req.correlation_id {
        crate::types::CorrelationId::Str(s) => s.len(),
        _ => 0,
    };
    req.parameters.iter().fold(req.id.len().saturating_add(sequence_id), |acc, (k, v)| {
        let value = match v {
            crate::types::ParamValue::Str(s) => s.len(),
            _ => 8,
        };
        acc.saturating_add(k.len()).saturating_add(value)
    })
}

/// tritium's own check, made before Triton's: a request's id, string sequence id and parameters
/// must fit in `limit` bytes (`--max-request-metadata-bytes`). The ids are not quoted: they may be
/// the problem.
pub(crate) fn check_metadata(req: &InferRequest, model: &str, limit: usize) -> Result<(), InferError> {
    let bytes = metadata_bytes(req);
    if bytes > limit {
        return Err(InferError::invalid(format!(
            "request for model '{model}' carries {bytes} bytes of request id, sequence id and parameters, more than the limit of \
             {limit} bytes (server flag --max-request-metadata-bytes)"
        )));
    }
    Ok(())
}

/// Validates `req` for `config` as Triton's `InferenceRequest::Normalize` does, in its order:
/// requested outputs, input names and count, batch size, then each input's type, shape and size.
pub(crate) fn validate(req: &InferRequest, config: &ModelConfig) -> Result<Validated, InferError> {
    let cx = Context {
        log: format!("[request id: {}] ", if req.id.is_empty() { "<id_unknown>" } else { &req.id }),
        model: config.name.as_str(),
    };
    let outputs = requested_outputs(&cx, req, config)?;
    check_input_names(&cx, req, config)?;
    let batch_size = batch_size(&cx, req, config)?;
    for input in &req.inputs {
        if let Some(cfg) = config.input.iter().find(|c| c.name == input.name) {
            check_input(&cx, input, cfg, config.max_batch_size > 0)?;
        }
    }
    Ok(Validated { batch_size, outputs })
}

/// Step 1: the outputs to return; every one the client names must exist.
fn requested_outputs(
    cx: &Context<'_>,
    req: &InferRequest,
    config: &ModelConfig,
) -> Result<Vec<RequestedOutput>, Invalid> {
    if req.outputs.is_empty() {
        return Ok(config.output.iter().map(|o| RequestedOutput::named(&o.name)).collect());
    }
    if let Some(o) = req.outputs.iter().find(|o| !config.output.iter().any(|c| c.name == o.name)) {
        return Err(Reason::UnexpectedOutput { output: o.name.clone(), model: cx.model() }.into());
    }
    Ok(req.outputs.clone())
}

/// Step 2: no input twice, and as many inputs as the config requires and allows.
fn check_input_names(cx: &Context<'_>, req: &InferRequest, config: &ModelConfig) -> Result<(), Invalid> {
    let mut seen = HashSet::new();
    for input in &req.inputs {
        if !seen.insert(input.name.as_str()) {
            return Err(Reason::DuplicateInput { log: cx.log(), input: input.name.clone() }.into());
        }
    }
    let required = config.input.iter().filter(|i| !i.optional).count();
    if req.inputs.len() <= config.input.len() && req.inputs.len() >= required {
        return Ok(());
    }
    let given: Vec<&str> = req.inputs.iter().map(|i| i.name.as_str()).collect();
    Err(input_count(cx.log(), cx.model(), config, &given).into())
}

/// Triton's text for inputs `given` (by name, in order) that are too few or too many for
/// `config`: what it expects, what came and which required inputs are missing.
pub(crate) fn input_count(log: String, model: String, config: &ModelConfig, given: &[&str]) -> Reason {
    let required = config.input.iter().filter(|i| !i.optional).count();
    let expected = if required == config.input.len() {
        format!("expected {} inputs", config.input.len())
    } else {
        format!("expected number of inputs between {required} and {}", config.input.len())
    };
    let missing = quoted_list(
        config.input.iter().filter(|i| !i.optional && !given.contains(&i.name.as_str())).map(|i| i.name.as_str()),
    );
    Reason::InputCount { log, expected, got: given.len(), model, names: quoted_list(given.iter().copied()), missing }
}

/// Step 3: every input is the model's, and for a batching model all share a first dimension
/// within `max_batch_size`; 0 for a non-batching model.
fn batch_size(cx: &Context<'_>, req: &InferRequest, config: &ModelConfig) -> Result<u64, Invalid> {
    let batching = config.max_batch_size > 0;
    let mut batch_size: u64 = 0;
    for input in &req.inputs {
        if !config.input.iter().any(|c| c.name == input.name) {
            return Err(Reason::UnexpectedInput { input: input.name.clone(), model: cx.model() }.into());
        }
        if !batching {
            continue;
        }
        let Some(&first) = input.shape.first() else {
            return Err(Reason::NoBatchDimension { log: cx.log(), input: input.name.clone(), model: cx.model() }.into());
        };
        let first = u64::try_from(first).unwrap_or(u64::MAX);
        if batch_size == 0 {
            batch_size = first;
        } else if first != batch_size {
            return Err(Reason::BatchMismatch { log: cx.log(), input: input.name.clone(), model: cx.model() }.into());
        }
    }
    if batch_size > config.max_batch_size as u64 {
        return Err(Reason::BatchTooLarge { log: cx.log(), max: config.max_batch_size, model: cx.model() }.into());
    }
    Ok(batch_size)
}

/// Step 4: one input's type, shape and data size against its config.
fn check_input(cx: &Context<'_>, input: &InputTensor, cfg: &ModelInput, batching: bool) -> Result<(), Invalid> {
    let expected_type = wire_type(cfg.data_type);
    if expected_type != Some(input.datatype) {
        return Err(Reason::DataType {
            log: cx.log(),
            input: input.name.clone(),
            got: input.datatype.wire_name(),
            model: cx.model(),
            expected: expected_type.map_or("INVALID", DataType::wire_name),
        }
        .into());
    }
    check_shape(cx, input, cfg, batching)?;
    let Some(elements) = input.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64)) else {
        return Err(
            Reason::ShapeTooLarge { log: cx.log(), shape: dims(&input.shape), input: input.name.clone() }.into()
        );
    };
    match input.datatype.element_size() {
        None => check_bytes(cx, &input.name, &input.data, elements),
        Some(size) => {
            let expected = elements.saturating_mul(size as u64);
            if expected == input.data.len() as u64 {
                return Ok(());
            }
            Err(Reason::ByteSize {
                log: cx.log(),
                input: input.name.clone(),
                model: cx.model(),
                expected,
                got: input.data.len(),
            }
            .into())
        }
    }
}

/// The shape against the config's dims (after the batch dimension of a batching model).
fn check_shape(cx: &Context<'_>, input: &InputTensor, cfg: &ModelInput, batching: bool) -> Result<(), Invalid> {
    let shape = if batching && !cfg.is_shape_tensor { &input.shape[1..] } else { &input.shape[..] };
    let mut matches = cfg.dims.len() == shape.len();
    if matches {
        for (c, &d) in cfg.dims.iter().zip(shape) {
            if d == -1 {
                return Err(Reason::UnspecifiedDimension {
                    log: cx.log(),
                    input: input.name.clone(),
                    model: cx.model(),
                    shape: dims(&input.shape),
                }
                .into());
            }
            if *c != -1 && *c != d {
                matches = false;
                break;
            }
        }
    }
    if matches && shape.iter().all(|&d| d >= 0) {
        return Ok(());
    }
    let mut full = Vec::with_capacity(cfg.dims.len() + 1);
    if batching {
        full.push(-1);
    }
    full.extend_from_slice(&cfg.dims);
    Err(Reason::Shape {
        log: cx.log(),
        input: input.name.clone(),
        model: cx.model(),
        expected: dims(&full),
        got: dims(&input.shape),
        note: if batching { BATCH_NOTE } else { "" },
    }
    .into())
}

/// The refusal of a unary call of a decoupled model (`decoupled` false), or of a streamed call
/// of a model that is not decoupled.
pub(crate) fn transaction_mismatch(model: &str, decoupled: bool) -> InferError {
    let message = if decoupled {
        format!("model '{model}' is not decoupled; use a unary inference")
    } else {
        format!("model '{model}' uses the decoupled transaction policy; its responses come over a stream only")
    };
    InferError::new(ErrorKind::Unsupported, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tritium_config::proto::ModelOutput;

    fn config(max_batch_size: i32) -> ModelConfig {
        let input = |name: &str, t: ConfigType, dims: Vec<i64>, optional| ModelInput {
            name: name.into(),
            data_type: t as i32,
            dims,
            optional,
            ..Default::default()
        };
        ModelConfig {
            name: "m".into(),
            max_batch_size,
            input: vec![
                input("A", ConfigType::TypeFp32, vec![4], false),
                input("B", ConfigType::TypeString, vec![-1], false),
                input("C", ConfigType::TypeInt8, vec![2], true),
            ],
            output: vec![
                ModelOutput {
                    name: "X".into(),
                    data_type: ConfigType::TypeFp32 as i32,
                    dims: vec![4],
                    ..Default::default()
                },
                ModelOutput {
                    name: "Y".into(),
                    data_type: ConfigType::TypeFp32 as i32,
                    dims: vec![4],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn t(name: &str, datatype: DataType, shape: &[i64], data: &[u8]) -> InputTensor {
        InputTensor { name: name.into(), datatype, shape: shape.to_vec(), data: bytes::Bytes::copy_from_slice(data) }
    }

    fn strings(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                let mut v = 1u32.to_le_bytes().to_vec();
                v.push(b'a' + i as u8);
                v
            })
            .collect()
    }

    fn req(inputs: Vec<InputTensor>) -> InferRequest {
        InferRequest { model: "m".into(), inputs, ..Default::default() }
    }

    #[test]
    fn good_requests_pass_with_batch_size_and_outputs() {
        let ok = validate(
            &req(vec![t("A", DataType::Fp32, &[4], &[0; 16]), t("B", DataType::Bytes, &[3], &strings(3))]),
            &config(0),
        )
        .expect("valid");
        assert_eq!(
            ok,
            Validated { batch_size: 0, outputs: vec![RequestedOutput::named("X"), RequestedOutput::named("Y")] }
        );
        let mut r = req(vec![t("A", DataType::Fp32, &[2, 4], &[0; 32]), t("B", DataType::Bytes, &[2, 1], &strings(2))]);
        r.outputs = vec![RequestedOutput { name: "Y".into(), classification: Some(2), shm: None }];
        assert_eq!(validate(&r, &config(8)).expect("valid"), Validated { batch_size: 2, outputs: r.outputs.clone() });
    }

    #[test]
    fn bad_requests_get_tritons_messages() {
        let a = || t("A", DataType::Fp32, &[4], &[0; 16]);
        let b = || t("B", DataType::Bytes, &[1], &strings(1));
        let cases: Vec<(InferRequest, i32, &str)> = vec![
            (req(vec![a()]), 0, "[request id: <id_unknown>] expected number of inputs between 2 and 3 but got 1 inputs for model 'm'. Got input(s) ['A'], but missing required input(s) ['B']. Please provide all required input(s)."),
            (req(vec![a(), t("Z", DataType::Fp32, &[4], &[0; 16])]), 0, "unexpected inference output"),
            (req(vec![t("A", DataType::Fp64, &[4], &[0; 32]), b()]), 0, "inference input 'A' data-type is 'FP64', but model 'm' expects 'FP32'"),
            (req(vec![t("A", DataType::Fp32, &[3], &[0; 12]), b()]), 0, "unexpected shape for input 'A' for model 'm'. Expected [4], got [3]. "),
            (req(vec![t("A", DataType::Fp32, &[4], &[0; 12]), b()]), 0, "input byte size mismatch for input 'A' for model 'm'. Expected 16, got 12"),
            (req(vec![a(), t("B", DataType::Bytes, &[2], &strings(1))]), 0, "expected 2 string elements for inference input 'B' for model 'm', got 1"),
            (req(vec![a(), t("B", DataType::Bytes, &[1], &[9, 0, 0, 0, b'x'])]), 0, "incomplete string data"),
            (req(vec![t("A", DataType::Fp32, &[9, 4], &[0; 144]), t("B", DataType::Bytes, &[9, 1], &strings(9))]), 8, "inference request batch-size must be <= 8 for 'm'"),
            (req(vec![t("A", DataType::Fp32, &[2, 4], &[0; 32]), t("B", DataType::Bytes, &[3, 1], &strings(3))]), 8, "input 'B' batch size does not match other inputs for 'm'"),
            (req(vec![t("A", DataType::Fp32, &[4], &[0; 16]), t("B", DataType::Bytes, &[4, 1], &strings(4))]), 8, "Expected [-1,4], got [4]. NOTE: Setting a non-zero max_batch_size"),
            (req(vec![a(), a()]), 0, "input 'A' already exists in request"),
            (req(vec![a(), t("B", DataType::Bytes, &[-1], &[])]), 0, "All input dimensions should be specified for input 'B'"),
        ];
        for (i, (mut r, mbs, expected)) in cases.into_iter().enumerate() {
            if i == 1 {
                r.inputs.push(b());
                r.inputs.remove(1);
                r.outputs = vec![RequestedOutput::named("Q")];
            }
            let err = validate(&r, &config(mbs)).expect_err(expected);
            assert!(err.message.contains(expected), "case {i}: {}", err.message);
            assert_eq!(err.kind, crate::types::ErrorKind::InvalidArg);
        }
    }

    #[test]
    fn request_metadata_over_the_limit_is_refused_without_quoting_it() {
        let mut r = req(vec![]);
        r.id = "x".repeat(1000);
        r.parameters = vec![
            ("key".into(), crate::types::ParamValue::Str("v".repeat(100))),
            ("n".into(), crate::types::ParamValue::Int(1)),
        ];
        assert_eq!(metadata_bytes(&r), 1000 + 3 + 100 + 1 + 8);
        assert!(check_metadata(&r, "m", 1112).is_ok());
        let e = check_metadata(&r, "m", 1111).expect_err("over");
        assert_eq!(e.kind, crate::types::ErrorKind::InvalidArg);
        assert_eq!(
            e.message,
            "request for model 'm' carries 1112 bytes of request id, sequence id and parameters, more than the limit of 1111 bytes (server flag --max-request-metadata-bytes)"
        );
    }

    #[test]
    fn a_string_sequence_id_counts_against_the_metadata_limit() {
        let mut r = req(vec![]);
        r.id = "id".into();
        r.correlation_id = crate::types::CorrelationId::Str("s".repeat(300 * 1024));
        assert_eq!(metadata_bytes(&r), 2 + 300 * 1024);
        let e = check_metadata(&r, "m", 64 * 1024).expect_err("a 300 KiB sequence id is over a 64 KiB limit");
        assert!(e.message.contains("307202 bytes of request id, sequence id and parameters"), "{}", e.message);
        assert!(!e.message.contains("sss"), "the id is not quoted: {}", e.message);
        r.correlation_id = crate::types::CorrelationId::U64(u64::MAX);
        assert_eq!(metadata_bytes(&r), 2, "an integer id is fixed-size");
    }

    #[test]
    fn request_ids_appear_in_messages() {
        let mut r = req(vec![]);
        r.id = "abc".into();
        assert!(validate(&r, &config(0)).expect_err("missing").message.starts_with("[request id: abc] expected"));
    }
}

#[cfg(test)]
mod step_tests {
    use super::*;

    fn cx() -> Context<'static> {
        Context { log: "[request id: r] ".into(), model: "m" }
    }

    fn input(name: &str, datatype: DataType, shape: &[i64], data: Vec<u8>) -> InputTensor {
        InputTensor { name: name.into(), datatype, shape: shape.to_vec(), data: bytes::Bytes::from(data) }
    }

    fn cfg(dims: &[i64], t: ConfigType) -> ModelInput {
        ModelInput { name: "A".into(), data_type: t as i32, dims: dims.to_vec(), ..Default::default() }
    }

    #[test]
    fn bytes_elements_are_counted_and_checked() {
        let one = [&3u32.to_le_bytes()[..], b"abc"].concat();
        assert_eq!(check_bytes(&cx(), "A", &one, 1), Ok(()));
        let reason = |r: Result<(), Invalid>| r.expect_err("invalid").reason().clone();
        assert!(matches!(reason(check_bytes(&cx(), "A", &one, 2)), Reason::StringCount { got: 1, .. }));
        assert!(matches!(reason(check_bytes(&cx(), "A", &one[..2], 1)), Reason::StringLength { available: 2, .. }));
        assert!(matches!(
            reason(check_bytes(&cx(), "A", &one[..5], 1)),
            Reason::StringData { len: 3, available: 1, .. }
        ));
    }

    #[test]
    fn shapes_follow_the_config_after_the_batch_dimension() {
        let fp32 = cfg(&[-1, 2], ConfigType::TypeFp32);
        assert_eq!(check_shape(&cx(), &input("A", DataType::Fp32, &[4, 3, 2], vec![]), &fp32, true), Ok(()));
        let e = check_shape(&cx(), &input("A", DataType::Fp32, &[3, 2], vec![]), &fp32, true).expect_err("no batch");
        assert!(
            matches!(e.reason(), Reason::Shape { expected, note, .. } if expected == "[-1,-1,2]" && *note == BATCH_NOTE)
        );
        let e = check_shape(&cx(), &input("A", DataType::Fp32, &[3, 3], vec![]), &fp32, false).expect_err("dim");
        assert!(matches!(e.reason(), Reason::Shape { note: "", .. }));
        let e = check_shape(&cx(), &input("A", DataType::Fp32, &[-1, 2], vec![]), &fp32, false).expect_err("-1");
        assert!(matches!(e.reason(), Reason::UnspecifiedDimension { .. }));
    }

    #[test]
    fn inputs_are_checked_for_type_then_size() {
        let fp32 = cfg(&[2], ConfigType::TypeFp32);
        assert_eq!(check_input(&cx(), &input("A", DataType::Fp32, &[2], vec![0; 8]), &fp32, false), Ok(()));
        let e = check_input(&cx(), &input("A", DataType::Int32, &[2], vec![0; 8]), &fp32, false).expect_err("type");
        assert_eq!(
            e.to_string(),
            "[request id: r] inference input 'A' data-type is 'INT32', but model 'm' expects 'FP32'"
        );
        let e = check_input(&cx(), &input("A", DataType::Fp32, &[2], vec![0; 7]), &fp32, false).expect_err("size");
        assert!(matches!(e.reason(), Reason::ByteSize { expected: 8, got: 7, .. }));
        assert_eq!(InferError::from(e).kind, crate::types::ErrorKind::InvalidArg);
    }
}
