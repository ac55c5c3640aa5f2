//! The KServe v2 inference codec: an HTTP request body (JSON, or JSON followed by binary tensor
//! data) to an [`InferRequest`], and an [`InferResponse`] to a response body, following Triton's
//! HTTP server (`src/http_server.cc`) field by field. Plain functions, no I/O.
//!
//! Request body: the first `Inference-Header-Content-Length` bytes (all of it when the header is
//! absent) are the JSON header; the binary data of the inputs that carry
//! `parameters.binary_data_size` follows, in input order. An explicit header length of 0 makes
//! the whole body the raw data of the model's only input ([`decode_raw_request`]).
//!
//! Response body: the JSON header, then the bytes of each output returned in binary form (in
//! output order, those of size 0 omitted). Outputs are binary when the request's `outputs` entry
//! says `parameters.binary_data: true`, or, for outputs the request did not list,
//! when the request has `parameters.binary_data_output: true`.

use bytes::Bytes;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tritium_server::{
    CorrelationId, DataType, InferError, InferRequest, InferResponse, InputTensor, ModelMetadata, ParamValue,
    RequestedOutput, FLAG_SEQUENCE_END, FLAG_SEQUENCE_START,
};

use crate::json_out;

mod encode;
mod json_data;
mod raw;

pub(crate) use encode::write_output_data;
pub use encode::{encode_infer_response, serialize_bytes};
use json_data::json_input_data;
pub(crate) use json_data::leaf_writer;
pub use raw::{decode_raw_request, max_batch_size, raw_input_spec, RawInputSpec};

/// Triton's `HTTP_MAX_JSON_NESTING_DEPTH`.
pub const MAX_JSON_DEPTH: usize = 100;

/// How one output is to be returned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputFormat {
    /// As binary data after the JSON header, rather than as a JSON `data` array.
    pub binary: bool,
    /// In the client's shared memory (system shared memory extension): the response names the
    /// output without data, as Triton's does.
    pub shm: bool,
}

/// How the outputs of a request are to be returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputSpecs {
    /// The format of outputs the request did not list (`binary_data_output`).
    pub default_binary: bool,
    /// The outputs the request listed, with their formats.
    pub requested: Vec<(String, OutputFormat)>,
}

impl OutputSpecs {
    /// The format for output `name`.
    pub fn format_for(&self, name: &str) -> OutputFormat {
        self.requested
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| *f)
            .unwrap_or(OutputFormat { binary: self.default_binary, shm: false })
    }
}

/// A decoded inference request and how its outputs are to be returned.
#[derive(Debug, Clone)]
pub struct DecodedRequest {
    /// The request for the server.
    pub request: InferRequest,
    /// Output formats for [`encode_infer_response`].
    pub outputs: OutputSpecs,
    /// Inputs and outputs in registered shared memory, to resolve with [`resolve_shm`].
    pub shm: Vec<ShmRef>,
}

/// An input's or output's `shared_memory_*` parameters, as the request gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRef {
    /// Whether it is an output (else an input).
    pub output: bool,
    /// Its index in the request's inputs or outputs.
    pub index: usize,
    /// `shared_memory_region`.
    pub region: String,
    /// `shared_memory_offset` (0 when absent).
    pub offset: u64,
    /// `shared_memory_byte_size` (0 when absent, as in Triton's HTTP frontend).
    pub byte_size: u64,
}

/// Resolves a request's shared-memory inputs and outputs against the registered regions: an
/// input's bytes become the region's (no copy), an output gets its target.
pub fn resolve_shm(decoded: &mut DecodedRequest, shm: &tritium_server::shm::ShmRegistry) -> Result<(), InferError> {
    for r in std::mem::take(&mut decoded.shm) {
        if r.output {
            if let Some(o) = decoded.request.outputs.get_mut(r.index) {
                o.shm = Some(shm.output(&r.region, r.offset, r.byte_size)?);
            }
        } else if let Some(i) = decoded.request.inputs.get_mut(r.index) {
            i.data = shm.input(&r.region, r.offset, r.byte_size)?;
        }
    }
    Ok(())
}

/// Triton's `CheckSharedMemoryData`: the `shared_memory_*` parameters of an input or output.
fn shm_params(
    params: Option<&serde_json::Map<String, Value>>,
    output: bool,
    index: usize,
) -> Result<Option<ShmRef>, InferError> {
    let Some(p) = params else { return Ok(None) };
    let Some(region) = p.get("shared_memory_region") else { return Ok(None) };
    let region = region.as_str().ok_or_else(|| InferError::invalid("Unable to parse 'shared_memory_region'"))?;
    let uint = |key: &str| -> Result<u64, InferError> {
        match p.get(key) {
            None => Ok(0),
            Some(v) => v.as_u64().ok_or_else(|| InferError::invalid(format!("Unable to parse '{key}'"))),
        }
    };
    let offset = uint("shared_memory_offset")?;
    let byte_size = uint("shared_memory_byte_size")?;
    Ok(Some(ShmRef { output, index, region: region.to_string(), offset, byte_size }))
}

/// An encoded inference response: the JSON header and the binary output data that follows it.
#[derive(Debug, Clone, Default)]
pub struct EncodedResponse {
    /// The JSON header.
    pub json: Vec<u8>,
    /// Binary output data, in order, to send after the header.
    pub binary: Vec<Bytes>,
}

impl EncodedResponse {
    /// Whether binary data follows the header: the response then has
    /// `Content-Type: application/octet-stream` and `Inference-Header-Content-Length`.
    pub fn has_binary(&self) -> bool {
        !self.binary.is_empty()
    }

    /// The `Content-Type` Triton sets.
    pub fn content_type(&self) -> &'static str {
        if self.has_binary() {
            "application/octet-stream"
        } else {
            "application/json"
        }
    }

    /// The body length.
    pub fn len(&self) -> usize {
        self.json.len() + self.binary.iter().map(Bytes::len).sum::<usize>()
    }

    /// Whether the body is empty (never, for a real response).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole body in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.json);
        for b in &self.binary {
            v.extend_from_slice(b);
        }
        v
    }
}

/// Parses an `Inference-Header-Content-Length` value against the body length, with Triton's
/// errors.
pub fn parse_header_length(value: &str, body_len: usize) -> Result<usize, InferError> {
    let n: i64 = value.trim().parse().map_err(|_| {
        InferError::invalid(format!(
            "Unable to parse Inference-Header-Content-Length, got: {value}; it must be the byte length of the JSON header at the start of the body"
        ))
    })?;
    match usize::try_from(n) {
        Ok(n) if n <= body_len => Ok(n),
        _ => {
            Err(InferError::invalid(format!("inference header size should be in range (0, {body_len}), got: {value}")))
        }
    }
}

/// Request parameters in the order the client wrote them.
pub(crate) struct OrderedObject(pub(crate) Vec<(String, Value)>);

impl<'de> Deserialize<'de> for OrderedObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of parameters")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedObject, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = map.next_entry::<String, Value>()? {
                    v.push((k, val));
                }
                Ok(OrderedObject(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// The top level of a request's JSON header.
#[derive(Deserialize)]
struct RequestHeader {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    parameters: Option<OrderedObject>,
    #[serde(default)]
    inputs: Option<Inputs>,
    #[serde(default)]
    outputs: Option<Value>,
}

/// The scalar visits of a visitor whose other shapes become a `Value` wrapped in `$wrap`.
macro_rules! other_json_visits {
    ($wrap:expr) => {
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Ok($wrap(Value::Bool(v)))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok($wrap(Value::from(v)))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok($wrap(Value::from(v)))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok($wrap(Value::from(v)))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok($wrap(Value::String(v.to_owned())))
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok($wrap(Value::String(v)))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($wrap(Value::Null))
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($wrap(Value::Null))
        }
    };
}

/// The request's `inputs`: an array of inputs, or whatever else was sent (for the error).
enum Inputs {
    Array(Vec<InputEntry>),
    Other(Value),
}

impl<'de> Deserialize<'de> for Inputs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Inputs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of inputs")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Inputs, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = seq.next_element::<InputEntry>()? {
                    v.push(e);
                }
                Ok(Inputs::Array(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Inputs, A::Error> {
                Value::deserialize(MapAccessDeserializer::new(map)).map(Inputs::Other)
            }
            other_json_visits!(Inputs::Other);
        }
        d.deserialize_any(V)
    }
}

/// One entry of `inputs`: an object whose `data` is kept as JSON text (converted to tensor bytes
/// later, element by element, never as a tree of values), or whatever else was sent.
enum InputEntry {
    Object { fields: serde_json::Map<String, Value>, data: Option<Box<RawValue>> },
    Other(Value),
}

impl<'de> Deserialize<'de> for InputEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = InputEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an input object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<InputEntry, A::Error> {
                let mut fields = serde_json::Map::new();
                let mut data = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "data" {
                        data = Some(map.next_value::<Box<RawValue>>()?);
                        // The key stays, so the content checks see it.
                        fields.insert(key, Value::Null);
                    } else {
                        let value = map.next_value::<Value>()?;
                        fields.insert(key, value);
                    }
                }
                Ok(InputEntry::Object { fields, data })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<InputEntry, A::Error> {
                Value::deserialize(SeqAccessDeserializer::new(seq)).map(InputEntry::Other)
            }
            other_json_visits!(InputEntry::Other);
        }
        d.deserialize_any(V)
    }
}

/// Marks a non-finite number literal (`NaN`, `Infinity`, `-Infinity`, which Triton's JSON
/// parser and Python's `json`/`rapidjson` accept) that was turned into a string for serde_json.
const NON_FINITE_MARK: char = '\u{0}';

/// Rewrites bare `NaN`, `Infinity` and `-Infinity` outside strings into marked strings, or
/// returns `None` when there are none.
fn mark_non_finite(json: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(json.len() + 64);
    let mut in_string = false;
    let mut escaped = false;
    let mut changed = false;
    let mut i = 0;
    while i < json.len() {
        let b = json[i];
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else {
            let token: Option<&[u8]> =
                [&b"NaN"[..], b"Infinity", b"-Infinity"].into_iter().find(|t| json[i..].starts_with(t));
            if let Some(t) = token {
                out.extend_from_slice(b"\"\\u0000");
                out.extend_from_slice(t);
                out.push(b'"');
                i += t.len();
                changed = true;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    changed.then_some(out)
}

/// A request parameter's JSON value as Triton takes it (`SetTritonParameterFromJsonParameter`):
/// a string, a bool, an integer, or another number as a double; anything else is refused with
/// Triton's text naming the parameter.
pub(crate) fn param_value(name: &str, value: &Value) -> Result<ParamValue, InferError> {
    match value {
        Value::String(s) => Ok(ParamValue::Str(s.clone())),
        Value::Bool(b) => Ok(ParamValue::Bool(*b)),
        Value::Number(n) => Ok(match n.as_i64() {
            Some(i) => ParamValue::Int(i),
            None => ParamValue::Double(n.as_f64().unwrap_or(f64::NAN)),
        }),
        _ => Err(InferError::invalid(format!(
            "parameter '{name}' has invalid type. It should be either 'int', 'bool', or 'string'."
        ))),
    }
}

/// The value of a marked non-finite literal.
pub(crate) fn non_finite(v: &Value) -> Option<f64> {
    match v.as_str()?.strip_prefix(NON_FINITE_MARK)? {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

fn parse_header(json: &[u8]) -> Result<RequestHeader, InferError> {
    match serde_json::from_slice(json) {
        Ok(h) => Ok(h),
        Err(e) => {
            if let Some(marked) = mark_non_finite(json) {
                if let Ok(h) = serde_json::from_slice(&marked) {
                    return Ok(h);
                }
            }
            Err(InferError::invalid(format!("failed to parse the request JSON buffer: {e}")))
        }
    }
}

/// A short description of a JSON value for error messages.
pub(crate) fn describe(v: &Value) -> String {
    if non_finite(v).is_some() {
        return v.as_str().unwrap_or_default().trim_start_matches(NON_FINITE_MARK).to_string();
    }
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) if s.chars().count() <= 32 => format!("the string {s:?}"),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn shape_string(shape: &[i64]) -> String {
    let parts: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", parts.join(","))
}

/// Decodes an inference request body. `header_length` is the `Inference-Header-Content-Length`
/// value (already checked against the body with [`parse_header_length`]), `None` when the header
/// is absent and the whole body is JSON. Binary inputs become zero-copy slices of `body`.
pub fn decode_infer_request(
    model: &str,
    version: Option<i64>,
    body: Bytes,
    header_length: Option<usize>,
) -> Result<DecodedRequest, InferError> {
    let json_len = header_length.unwrap_or(body.len());
    if json_len == 0 || json_len > body.len() {
        return Err(InferError::invalid(if body.is_empty() {
            "the request body is empty: send the inference request JSON (and any binary input data after it)"
                .to_string()
        } else {
            format!("inference header size should be in range (0, {}), got: {json_len}", body.len())
        }));
    }
    let header = parse_header(&body[..json_len])?;
    let binary = body.slice(json_len..);

    let mut request = InferRequest { model: model.to_string(), version, ..Default::default() };
    if let Some(id) = header.id {
        match id {
            Value::String(s) => request.id = s,
            other => {
                return Err(InferError::invalid(format!(
                    "Unable to parse 'id': expected a string, got {}",
                    describe(&other)
                )));
            }
        }
    }

    let mut outputs = OutputSpecs::default();
    if let Some(params) = header.parameters {
        parse_request_parameters(params.0, &mut request, &mut outputs)?;
    }

    let mut shm = Vec::new();
    parse_inputs(model, header.inputs, &binary, header_length.is_some(), &mut request, &mut shm)?;
    if let Some(out) = header.outputs {
        parse_outputs(out, &mut request, &mut outputs, &mut shm)?;
    }
    Ok(DecodedRequest { request, outputs, shm })
}

fn parse_request_parameters(
    params: Vec<(String, Value)>,
    request: &mut InferRequest,
    outputs: &mut OutputSpecs,
) -> Result<(), InferError> {
    let mut flags = 0;
    for (key, value) in params {
        match key.as_str() {
            "sequence_id" => {
                request.correlation_id = match &value {
                    Value::Number(n) if n.as_u64().is_some() => match n.as_u64() {
                        Some(0) | None => CorrelationId::None,
                        Some(id) => CorrelationId::U64(id),
                    },
                    Value::String(s) if non_finite(&value).is_none() => {
                        if s.is_empty() {
                            CorrelationId::None
                        } else {
                            CorrelationId::Str(s.clone())
                        }
                    }
                    other => {
                        return Err(InferError::invalid(format!(
                            "Unable to parse 'sequence_id': expected an unsigned integer or a string, got {}",
                            describe(other)
                        )))
                    }
                }
            }
            "sequence_start" | "sequence_end" | "binary_data_output" => {
                let Some(b) = value.as_bool() else {
                    return Err(InferError::invalid(format!(
                        "Unable to parse '{key}': expected a boolean, got {}",
                        describe(&value)
                    )));
                };
                match key.as_str() {
                    "sequence_start" if b => flags |= FLAG_SEQUENCE_START,
                    "sequence_end" if b => flags |= FLAG_SEQUENCE_END,
                    "binary_data_output" => outputs.default_binary = b,
                    _ => {}
                }
            }
            "priority" | "timeout" => {
                let Some(n) = value.as_u64() else {
                    return Err(InferError::invalid(format!(
                        "Unable to parse '{key}': expected an unsigned integer, got {}",
                        describe(&value)
                    )));
                };
                // Triton consumes both itself: they never reach the model's parameters.
                if key == "timeout" {
                    request.timeout_us = n;
                } else {
                    request.priority = n;
                }
            }
            k if k.starts_with("triton_") => {
                return Err(InferError::invalid(
                    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.",
                ));
            }
            _ => {
                let v = match non_finite(&value) {
                    Some(f) => ParamValue::Double(f),
                    None => param_value(&key, &value)?,
                };
                request.parameters.push((key, v));
            }
        }
    }
    request.flags = flags;
    Ok(())
}

/// The object's `parameters` member, if it is an object.
fn params_of(obj: &serde_json::Map<String, Value>) -> Option<&serde_json::Map<String, Value>> {
    obj.get("parameters").and_then(Value::as_object)
}

fn member_str<'a>(obj: &'a serde_json::Map<String, Value>, field: &str, what: &str) -> Result<&'a str, InferError> {
    match obj.get(field) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(InferError::invalid(format!(
            "Unable to parse '{field}': expected a string for the {what}, got {}",
            describe(other)
        ))),
        None => Err(InferError::invalid(format!("Unable to parse '{field}': the {what} has no '{field}' field"))),
    }
}

/// Triton's `ValidateInputContentType`.
fn validate_input_content(obj: &serde_json::Map<String, Value>) -> Result<(), InferError> {
    let has_data = obj.contains_key("data");
    let params = params_of(obj);
    let has_binary = params.is_some_and(|p| p.contains_key("binary_data_size"));
    let has_shm = params.is_some_and(|p| p.contains_key("shared_memory_region"));
    let set = usize::from(has_data) + usize::from(has_binary) + usize::from(has_shm);
    if set == 1 {
        return Ok(());
    }
    let mut msg = String::from(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But",
    );
    if set == 0 {
        msg.push_str(" no field is set");
    } else {
        msg.push_str(" set");
        if has_data {
            msg.push_str(" 'data'");
        }
        if has_binary {
            msg.push_str(" 'binary_data_size'");
        }
        if has_shm {
            msg.push_str(" 'shared_memory_region'");
        }
    }
    Err(InferError::invalid(msg))
}

fn parse_inputs(
    model: &str,
    inputs: Option<Inputs>,
    binary: &Bytes,
    has_header_length: bool,
    request: &mut InferRequest,
    shm: &mut Vec<ShmRef>,
) -> Result<(), InferError> {
    let inputs = match inputs {
        Some(Inputs::Array(a)) => a,
        Some(Inputs::Other(other)) => {
            return Err(InferError::invalid(format!(
                "Unable to parse 'inputs': expected an array, got {}",
                describe(&other)
            )))
        }
        None => return Err(InferError::invalid("Unable to parse 'inputs': the request has no 'inputs' array")),
    };
    let mut cursor = 0usize;
    request.inputs.reserve(inputs.len());
    for input in &inputs {
        let (obj, raw_data) = match input {
            InputEntry::Object { fields, data } => (fields, data.as_deref()),
            InputEntry::Other(other) => {
                return Err(InferError::invalid(format!(
                    "Unable to parse 'inputs': expected an object per input, got {}",
                    describe(other)
                )));
            }
        };
        validate_input_content(obj)?;
        let name = member_str(obj, "name", "input")?;
        let dtype_name = member_str(obj, "datatype", "input")?;
        let datatype = DataType::from_wire_name(dtype_name).ok_or_else(|| {
            InferError::invalid(format!(
                "invalid datatype for input '{name}': '{dtype_name}' is not one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16, BYTES"
            ))
        })?;
        let shape = parse_shape(obj, name)?;
        let params = params_of(obj);

        let data = if let Some(size) = params.and_then(|p| p.get("binary_data_size")) {
            let Some(size) = size.as_u64() else {
                return Err(InferError::invalid(format!(
                    "Unable to parse 'binary_data_size' of input '{name}': expected an unsigned integer, got {}",
                    describe(size)
                )));
            };
            if size == 0 {
                Bytes::new()
            } else {
                if !has_header_length {
                    return Err(InferError::invalid(format!(
                        "input '{name}' has 'binary_data_size' {size}, but the request has no Inference-Header-Content-Length header: \
                         binary input data must follow a JSON header whose length that header gives"
                    )));
                }
                let available = binary.len() - cursor;
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                if size > available {
                    return Err(InferError::invalid(format!(
                        "unexpected size for input '{name}', expecting {} additional bytes for model '{model}'",
                        size - available
                    )));
                }
                let slice = binary.slice(cursor..cursor + size);
                cursor += size;
                slice
            }
        } else if let Some(r) = shm_params(params, false, request.inputs.len())? {
            // Resolved against the registered regions by `resolve_shm`.
            shm.push(r);
            Bytes::new()
        } else {
            Bytes::from(json_input_data(name, datatype, &shape, raw_data)?)
        };
        request.inputs.push(InputTensor { name: name.to_string(), datatype, shape, data });
    }
    if cursor != binary.len() {
        return Err(InferError::invalid(format!(
            "unexpected additional input data for model '{model}': {} bytes after the JSON header are not claimed by any input's 'binary_data_size'",
            binary.len() - cursor
        )));
    }
    Ok(())
}

fn parse_shape(obj: &serde_json::Map<String, Value>, name: &str) -> Result<Vec<i64>, InferError> {
    let Some(Value::Array(dims)) = obj.get("shape") else {
        return Err(InferError::invalid(format!("Unable to parse 'shape': input '{name}' has no 'shape' array")));
    };
    dims.iter()
        .map(|d| {
            d.as_u64().and_then(|d| i64::try_from(d).ok()).ok_or_else(|| {
                InferError::invalid(format!(
                    "Unable to parse 'shape' of input '{name}': dimensions must be non-negative integers, got {}",
                    describe(d)
                ))
            })
        })
        .collect()
}

/// The element count of a shape; an empty shape (a scalar) has one element.
pub(crate) fn element_count(shape: &[i64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
}

fn parse_outputs(
    outputs: Value,
    request: &mut InferRequest,
    specs: &mut OutputSpecs,
    shm: &mut Vec<ShmRef>,
) -> Result<(), InferError> {
    let Value::Array(outputs) = outputs else {
        return Err(InferError::invalid(format!(
            "Unable to parse 'outputs': expected an array, got {}",
            describe(&outputs)
        )));
    };
    for output in &outputs {
        let Some(obj) = output.as_object() else {
            return Err(InferError::invalid(format!(
                "Unable to parse 'outputs': expected an object per output, got {}",
                describe(output)
            )));
        };
        let params = params_of(obj);
        // Triton's ValidateOutputParameter.
        if let Some(p) = params.filter(|p| p.contains_key("shared_memory_region")) {
            if p.contains_key("classification") {
                return Err(InferError::invalid("Output can't set both 'shared_memory_region' and 'classification'"));
            }
            if p.get("binary_data").and_then(Value::as_bool) == Some(true) {
                return Err(InferError::invalid("Output can't set both 'shared_memory_region' and 'binary_data'"));
            }
        }
        let name = member_str(obj, "name", "output")?;
        let mut format = OutputFormat::default();
        let mut classification = None;
        if let Some(c) = params.and_then(|p| p.get("classification")) {
            let k = c.as_u64().ok_or_else(|| {
                InferError::invalid(format!(
                    "Unable to set 'classification' of output '{name}': expected an unsigned integer, got {}",
                    describe(c)
                ))
            })?;
            // 0 asks for the tensor itself; Triton keeps the count in a `uint32_t`.
            classification = (k > 0).then(|| u32::try_from(k).unwrap_or(u32::MAX));
        }
        if let Some(r) = shm_params(params, true, request.outputs.len())? {
            shm.push(r);
            format.shm = true;
        }
        if let Some(b) = params.and_then(|p| p.get("binary_data")) {
            format.binary = b.as_bool().ok_or_else(|| {
                InferError::invalid(format!(
                    "Unable to parse 'binary_data' of output '{name}': expected a boolean, got {}",
                    describe(b)
                ))
            })?;
        }
        request.outputs.push(RequestedOutput { name: name.to_string(), classification, shm: None });
        specs.requested.push((name.to_string(), format));
    }
    Ok(())
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
