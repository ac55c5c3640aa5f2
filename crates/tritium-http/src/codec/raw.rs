//! Raw requests (`Inference-Header-Content-Length: 0`): the whole body is the raw data of the
//! model's only input.

use super::*;

/// What a raw (header length 0) request needs to know of the model's only input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawInputSpec {
    /// Input name.
    pub name: String,
    /// Input type.
    pub datatype: DataType,
    /// The configured dims, without the batch dimension.
    pub dims: Vec<i64>,
    /// Whether the model batches (`max_batch_size > 0`): the request then gets batch size 1.
    pub batching: bool,
}

/// The raw-input spec from a model's metadata and `max_batch_size`, with Triton's errors.
pub fn raw_input_spec(model: &str, meta: &ModelMetadata, max_batch_size: i64) -> Result<RawInputSpec, InferError> {
    let [input] = meta.inputs.as_slice() else {
        return Err(InferError::invalid(format!(
            "Raw request must only have 1 input (found 1) to be deduced but got {} inputs in '{model}' model configuration",
            meta.inputs.len()
        )));
    };
    let datatype = DataType::from_wire_name(&input.datatype).ok_or_else(|| {
        InferError::internal(format!(
            "input '{}' of model '{model}' has unknown datatype '{}'",
            input.name, input.datatype
        ))
    })?;
    let batching = max_batch_size > 0;
    let dims = if batching { input.shape.get(1..).unwrap_or_default().to_vec() } else { input.shape.clone() };
    Ok(RawInputSpec { name: input.name.clone(), datatype, dims, batching })
}

/// Decodes a raw binary request (`Inference-Header-Content-Length: 0`): the whole body is the
/// data of the model's only input, whose shape is deduced as Triton does (one variable dimension
/// at most; `BYTES` only for shape `[1]`, the body being one element). Outputs default to binary.
pub fn decode_raw_request(
    model: &str,
    version: Option<i64>,
    body: Bytes,
    spec: &RawInputSpec,
) -> Result<DecodedRequest, InferError> {
    let mut shape = Vec::with_capacity(spec.dims.len() + 1);
    if spec.batching {
        shape.push(1);
    }
    let mut dynamic_axis = None;
    let mut fixed: u64 = 1;
    for &d in &spec.dims {
        if d < 0 {
            if dynamic_axis.is_some() {
                return Err(InferError::invalid(format!(
                    "The shape of the raw input '{}' can not be deduced because there are more than one variable-sized dimension",
                    spec.name
                )));
            }
            dynamic_axis = Some(shape.len());
        } else {
            fixed = fixed.saturating_mul(d as u64);
        }
        shape.push(d);
    }
    let data = match spec.datatype.element_size() {
        None => {
            if dynamic_axis.is_some() || fixed != 1 {
                return Err(InferError::invalid(format!(
                    "For BYTE datatype raw input '{}', the model must have input shape [1]",
                    spec.name
                )));
            }
            let len = u32::try_from(body.len())
                .map_err(|_| InferError::invalid("a raw BYTES input is limited to 4 GiB (one element)"))?;
            let mut v = Vec::with_capacity(body.len() + 4);
            v.extend_from_slice(&len.to_le_bytes());
            v.extend_from_slice(&body);
            Bytes::from(v)
        }
        Some(size) => {
            if let Some(axis) = dynamic_axis {
                let per = fixed.saturating_mul(size as u64).max(1);
                shape[axis] = i64::try_from(body.len() as u64 / per).unwrap_or(i64::MAX);
            }
            body
        }
    };
    let request = InferRequest {
        model: model.to_string(),
        version,
        inputs: vec![InputTensor { name: spec.name.clone(), datatype: spec.datatype, shape, data }],
        ..Default::default()
    };
    Ok(DecodedRequest {
        request,
        outputs: OutputSpecs { default_binary: true, requested: Vec::new() },
        shm: Vec::new(),
    })
}

/// `max_batch_size` from a model config in Triton's JSON form (0 when absent).
pub fn max_batch_size(config_json: &str) -> i64 {
    let Ok(v) = serde_json::from_str::<Value>(config_json) else { return 0 };
    match v.get("max_batch_size") {
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        _ => 0,
    }
}
