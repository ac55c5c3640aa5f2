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

/// Why reading a JSON `data` array stopped.
enum DataError {
    TooDeep,
    TooMany,
    Bad { index: u64, message: String },
}

/// The JSON text of an input's `data`, walked once, in order: each leaf (an element, at any
/// depth of nesting) is read as a scalar and handed to the type's writer, so memory stays about
/// the tensor's size, whatever the length of the array.
struct Walk<'a> {
    count: u64,
    expected: u64,
    out: &'a mut Vec<u8>,
    write: LeafWriter,
    /// Why the walk stopped, when it did.
    stop: Option<DataError>,
}

impl Walk<'_> {
    fn leaf<E: serde::de::Error>(&mut self, v: Value) -> Result<(), E> {
        if self.count >= self.expected {
            return self.fail(DataError::TooMany);
        }
        if let Err(message) = (self.write)(&v, self.out) {
            return self.fail(DataError::Bad { index: self.count, message });
        }
        self.count += 1;
        Ok(())
    }

    fn fail<E: serde::de::Error>(&mut self, e: DataError) -> Result<(), E> {
        self.stop = Some(e);
        Err(E::custom("stopped"))
    }
}

/// One value of the walk at `depth` (the `data` array itself is at depth 0).
struct WalkAt<'w, 'a> {
    walk: &'w mut Walk<'a>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for WalkAt<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.depth >= MAX_JSON_DEPTH {
            return self.walk.fail(DataError::TooDeep);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WalkAt<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tensor data")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let depth = self.depth + 1;
        while seq.next_element_seed(WalkAt { walk: &mut *self.walk, depth })?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<(), A::Error> {
        // No type takes an object: the writer says so, naming the element.
        self.walk.leaf(Value::Object(serde_json::Map::new()))
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.walk.leaf(Value::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.walk.leaf(Value::from(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.walk.leaf(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        self.walk.leaf(Value::from(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.walk.leaf(Value::String(v.to_owned()))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.walk.leaf(Value::Null)
    }
}

/// Walks the JSON text `data`, writing up to `expected` leaves into `out`; returns the leaves
/// written and why the walk stopped early, if it did.
fn walk(data: &str, expected: u64, out: &mut Vec<u8>, write: LeafWriter) -> (u64, Option<DataError>) {
    let mut walk = Walk { count: 0, expected, out, write, stop: None };
    let mut de = serde_json::Deserializer::from_str(data);
    let res = WalkAt { walk: &mut walk, depth: 0 }.deserialize(&mut de);
    match (res, walk.stop) {
        (_, Some(stop)) => (walk.count, Some(stop)),
        (Ok(()), None) => (walk.count, None),
        // The text was checked as JSON already; anything else is reported at the element.
        (Err(e), None) => (walk.count, Some(DataError::Bad { index: walk.count, message: e.to_string() })),
    }
}

/// Counts the leaves of a nested array (for error messages), without converting them.
fn count_leaves(data: &str) -> u64 {
    let mut scratch = Vec::new();
    walk(data, u64::MAX, &mut scratch, |_, _| Ok(())).0
}

/// The JSON text as a value, for describing what it is in an error.
fn text_value(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or(Value::Null)
}

fn int_in<T: TryFrom<i64>>(v: &Value, what: &str) -> Result<T, String> {
    let i = v.as_i64().ok_or_else(|| format!("expected a signed integer for {what}, got {}", describe(v)))?;
    T::try_from(i).map_err(|_| format!("{i} is out of range for {what}"))
}

fn uint_in<T: TryFrom<u64>>(v: &Value, what: &str) -> Result<T, String> {
    let u = v.as_u64().ok_or_else(|| format!("expected an unsigned integer for {what}, got {}", describe(v)))?;
    T::try_from(u).map_err(|_| format!("{u} is out of range for {what}"))
}

fn float_of(v: &Value, what: &str) -> Result<f64, String> {
    v.as_f64().or_else(|| non_finite(v)).ok_or_else(|| format!("expected a number for {what}, got {}", describe(v)))
}

/// Why an input's JSON `data` cannot become tensor bytes (every one is `INVALID_ARGUMENT`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JsonDataError {
    /// The shape's element count overflows.
    #[error(
        "invalid shape for input '{name}': shape {shape} causes total element count to exceed maximum size of {}",
        i64::MAX
    )]
    ShapeTooLarge { name: String, shape: String },
    /// `data` is not an array.
    #[error("Unable to parse 'data' of input '{name}': expected an array, got {got}")]
    NotAnArray { name: String, got: String },
    /// FP16 and BF16 have no JSON form in Triton.
    #[error("receiving {dtype} data via JSON is not supported. Please use the binary data format for input {name}")]
    NoJsonForm { name: String, dtype: &'static str },
    /// The shape and the number of elements disagree.
    #[error(
        "Unable to parse 'data' of input '{name}': shape does not match true shape of 'data' field: shape {shape} has {expected} elements, but 'data' has {got}; make 'shape' and 'data' agree"
    )]
    CountMismatch { name: String, shape: String, expected: u64, got: u64 },
    /// Arrays nest deeper than Triton's limit.
    #[error(
        "Unable to parse 'data' of input '{name}': JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"
    )]
    TooDeep { name: String },
    /// An element is not of the input's type or out of its range.
    #[error("Unable to parse 'data' of input '{name}': element {index}: {message}")]
    BadElement { name: String, index: u64, message: String },
}

impl From<JsonDataError> for InferError {
    fn from(e: JsonDataError) -> Self {
        InferError::invalid(e.to_string())
    }
}

/// Converts an input's JSON `data` to its raw bytes (Triton's serialized form for `BYTES`), in
/// three steps: the element count from the shape, the checks on `data` as a whole, and the
/// conversion of each element.
fn json_input_data(
    name: &str,
    dtype: DataType,
    shape: &[i64],
    data: Option<&RawValue>,
) -> Result<Vec<u8>, JsonDataError> {
    let expected = expected_elements(name, shape)?;
    if expected == 0 {
        // As Triton: a tensor with no elements has no data, whatever 'data' holds.
        return Ok(Vec::new());
    }
    let data = data.map_or("null", RawValue::get);
    let write = leaf_writer(name, dtype, data)?;
    convert_leaves(name, shape, dtype, data, expected, write)
}

/// Step 1: the number of elements `shape` holds.
fn expected_elements(name: &str, shape: &[i64]) -> Result<u64, JsonDataError> {
    element_count(shape)
        .ok_or_else(|| JsonDataError::ShapeTooLarge { name: name.to_string(), shape: shape_string(shape) })
}

/// Writes one JSON element as tensor bytes, or says why it cannot.
pub(crate) type LeafWriter = fn(&Value, &mut Vec<u8>) -> Result<(), String>;

/// Step 2: checks `data` as a whole, and picks the writer of the type's elements.
pub(crate) fn leaf_writer(name: &str, dtype: DataType, data: &str) -> Result<LeafWriter, JsonDataError> {
    if !data.trim_start().starts_with('[') {
        return Err(JsonDataError::NotAnArray { name: name.to_string(), got: describe(&text_value(data)) });
    }
    Ok(match dtype {
        DataType::Fp16 | DataType::Bf16 => {
            return Err(JsonDataError::NoJsonForm { name: name.to_string(), dtype: dtype.wire_name() })
        }
        DataType::Bool => |v, o| {
            let b = v.as_bool().ok_or_else(|| format!("expected a boolean for BOOL, got {}", describe(v)))?;
            o.push(u8::from(b));
            Ok(())
        },
        DataType::Uint8 => |v, o| {
            o.push(uint_in::<u8>(v, "UINT8")?);
            Ok(())
        },
        DataType::Uint16 => |v, o| {
            o.extend_from_slice(&uint_in::<u16>(v, "UINT16")?.to_le_bytes());
            Ok(())
        },
        DataType::Uint32 => |v, o| {
            o.extend_from_slice(&uint_in::<u32>(v, "UINT32")?.to_le_bytes());
            Ok(())
        },
        DataType::Uint64 => |v, o| {
            o.extend_from_slice(&uint_in::<u64>(v, "UINT64")?.to_le_bytes());
            Ok(())
        },
        DataType::Int8 => |v, o| {
            o.extend_from_slice(&int_in::<i8>(v, "INT8")?.to_le_bytes());
            Ok(())
        },
        DataType::Int16 => |v, o| {
            o.extend_from_slice(&int_in::<i16>(v, "INT16")?.to_le_bytes());
            Ok(())
        },
        DataType::Int32 => |v, o| {
            o.extend_from_slice(&int_in::<i32>(v, "INT32")?.to_le_bytes());
            Ok(())
        },
        DataType::Int64 => |v, o| {
            o.extend_from_slice(&int_in::<i64>(v, "INT64")?.to_le_bytes());
            Ok(())
        },
        DataType::Fp32 => |v, o| {
            // As Triton: the double is narrowed to float (out-of-range values become infinite).
            o.extend_from_slice(&(float_of(v, "FP32")? as f32).to_le_bytes());
            Ok(())
        },
        DataType::Fp64 => |v, o| {
            o.extend_from_slice(&float_of(v, "FP64")?.to_le_bytes());
            Ok(())
        },
        DataType::Bytes => |v, o| {
            let s = match v {
                Value::String(s) if non_finite(v).is_none() => s,
                _ => return Err(format!("expected a string for BYTES, got {}", describe(v))),
            };
            let len = u32::try_from(s.len()).map_err(|_| "a BYTES element is longer than 4 GiB".to_string())?;
            o.extend_from_slice(&len.to_le_bytes());
            o.extend_from_slice(s.as_bytes());
            Ok(())
        },
    })
}

/// Step 3: converts the `expected` elements of the JSON text `data` (nested arrays, flattened
/// in order), streaming: no tree of values is built.
fn convert_leaves(
    name: &str,
    shape: &[i64],
    dtype: DataType,
    data: &str,
    expected: u64,
    write: LeafWriter,
) -> Result<Vec<u8>, JsonDataError> {
    // Every leaf takes at least one byte of JSON text and a separator, so this never reserves
    // more than the body could fill, whatever the shape claims.
    let leaves_bound = expected.min(data.len() as u64 / 2 + 1);
    let size = dtype.element_size().unwrap_or(8) as u64;
    let mut out = Vec::with_capacity(usize::try_from(leaves_bound.saturating_mul(size)).unwrap_or(0));
    let (count, stop) = walk(data, expected, &mut out, write);
    let mismatch =
        |got| JsonDataError::CountMismatch { name: name.to_string(), shape: shape_string(shape), expected, got };
    match stop {
        None if count == expected => Ok(out),
        None => Err(mismatch(count)),
        Some(DataError::TooMany) => Err(mismatch(count_leaves(data))),
        Some(DataError::TooDeep) => Err(JsonDataError::TooDeep { name: name.to_string() }),
        Some(DataError::Bad { index, message }) => {
            Err(JsonDataError::BadElement { name: name.to_string(), index, message })
        }
    }
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

/// Encodes an inference response (outputs asked for as classifications arrive classified from
/// the core).
pub fn encode_infer_response(resp: InferResponse, specs: &OutputSpecs) -> Result<EncodedResponse, InferError> {
    let mut j = Vec::with_capacity(256);
    let mut binary = Vec::new();
    j.push(b'{');
    if !resp.id.is_empty() {
        json_out::key(&mut j, "id");
        json_out::string(&mut j, resp.id.as_bytes());
        j.push(b',');
    }
    json_out::key(&mut j, "model_name");
    json_out::string(&mut j, resp.model.as_bytes());
    j.push(b',');
    json_out::key(&mut j, "model_version");
    json_out::string(&mut j, resp.version.to_string().as_bytes());
    if !resp.parameters.is_empty() {
        j.push(b',');
        json_out::key(&mut j, "parameters");
        write_parameters(&mut j, &resp.parameters);
    }
    j.push(b',');
    json_out::key(&mut j, "outputs");
    j.push(b'[');
    for (i, output) in resp.outputs.into_iter().enumerate() {
        if i > 0 {
            j.push(b',');
        }
        let format = specs.format_for(&output.name);
        let (name, datatype, shape, data) = (output.name, output.datatype, output.shape, output.data);
        j.push(b'{');
        json_out::key(&mut j, "name");
        json_out::string(&mut j, name.as_bytes());
        j.push(b',');
        json_out::key(&mut j, "datatype");
        json_out::string(&mut j, datatype.wire_name().as_bytes());
        j.push(b',');
        json_out::key(&mut j, "shape");
        j.push(b'[');
        for (k, d) in shape.iter().enumerate() {
            if k > 0 {
                j.push(b',');
            }
            json_out::int(&mut j, *d);
        }
        j.push(b']');
        if format.shm {
            // The bytes are in the client's region already; Triton names the output only.
            j.push(b'}');
            continue;
        }
        j.push(b',');
        if format.binary {
            json_out::key(&mut j, "parameters");
            j.push(b'{');
            json_out::key(&mut j, "binary_data_size");
            json_out::uint(&mut j, data.len() as u64);
            j.push(b'}');
            if !data.is_empty() {
                binary.push(Bytes::from(data));
            }
        } else {
            let Some(count) = element_count(&shape) else {
                return Err(InferError::internal(format!(
                    "output '{name}' has an invalid shape {}",
                    shape_string(&shape)
                )));
            };
            json_out::key(&mut j, "data");
            write_output_data(&mut j, &name, datatype, &data, count)?;
        }
        j.push(b'}');
    }
    j.extend_from_slice(b"]}");
    Ok(EncodedResponse { json: j, binary })
}

fn write_parameters(j: &mut Vec<u8>, params: &[(String, ParamValue)]) {
    j.push(b'{');
    for (i, (k, v)) in params.iter().enumerate() {
        if i > 0 {
            j.push(b',');
        }
        json_out::key(j, k);
        match v {
            ParamValue::Bool(b) => json_out::boolean(j, *b),
            ParamValue::Int(n) => json_out::int(j, *n),
            ParamValue::Double(d) => json_out::double(j, *d),
            ParamValue::Str(s) => json_out::string(j, s.as_bytes()),
        }
    }
    j.push(b'}');
}

fn size_mismatch(name: &str) -> InferError {
    InferError::internal(format!(
        "Failed to write 'data' field: output tensor shape does not match size of output for '{name}'"
    ))
}

/// Writes `count` elements as a JSON array, checking the size first.
pub(crate) fn write_output_data(
    j: &mut Vec<u8>,
    name: &str,
    dtype: DataType,
    data: &[u8],
    count: u64,
) -> Result<(), InferError> {
    match dtype {
        DataType::Fp16 => {
            return Err(InferError::invalid(
                "sending FP16 data via JSON is not supported. Please use the binary data format for output",
            ))
        }
        DataType::Bf16 => {
            return Err(InferError::invalid(
                "sending BF16 data via JSON is not supported. Please use the binary data format for output",
            ))
        }
        _ => {}
    }
    if let Some(size) = dtype.element_size() {
        if count.checked_mul(size as u64) != Some(data.len() as u64) {
            return Err(size_mismatch(name));
        }
        j.reserve(data.len() / size * 4 + 2);
    }
    j.push(b'[');
    fn each<const N: usize>(j: &mut Vec<u8>, data: &[u8], mut f: impl FnMut(&mut Vec<u8>, [u8; N])) {
        for (i, c) in data.chunks_exact(N).enumerate() {
            if i > 0 {
                j.push(b',');
            }
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(j, a);
        }
    }
    match dtype {
        DataType::Bool => each::<1>(j, data, |j, a| json_out::boolean(j, a[0] != 0)),
        DataType::Uint8 => each::<1>(j, data, |j, a| json_out::uint(j, u64::from(a[0]))),
        DataType::Uint16 => each::<2>(j, data, |j, a| json_out::uint(j, u64::from(u16::from_le_bytes(a)))),
        DataType::Uint32 => each::<4>(j, data, |j, a| json_out::uint(j, u64::from(u32::from_le_bytes(a)))),
        DataType::Uint64 => each::<8>(j, data, |j, a| json_out::uint(j, u64::from_le_bytes(a))),
        DataType::Int8 => each::<1>(j, data, |j, a| json_out::int(j, i64::from(i8::from_le_bytes(a)))),
        DataType::Int16 => each::<2>(j, data, |j, a| json_out::int(j, i64::from(i16::from_le_bytes(a)))),
        DataType::Int32 => each::<4>(j, data, |j, a| json_out::int(j, i64::from(i32::from_le_bytes(a)))),
        DataType::Int64 => each::<8>(j, data, |j, a| json_out::int(j, i64::from_le_bytes(a))),
        DataType::Fp32 => each::<4>(j, data, |j, a| json_out::double(j, f64::from(f32::from_le_bytes(a)))),
        DataType::Fp64 => each::<8>(j, data, |j, a| json_out::double(j, f64::from_le_bytes(a))),
        DataType::Bytes => {
            let mut rest = data;
            for i in 0..count {
                if i > 0 {
                    j.push(b',');
                }
                let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(|| size_mismatch(name))?;
                let len = u32::from_le_bytes(*len) as usize;
                if tail.len() < len {
                    return Err(size_mismatch(name));
                }
                let (s, tail) = tail.split_at(len);
                // As Triton: the bytes go into the JSON string unchanged, UTF-8 or not.
                json_out::string(j, s);
                rest = tail;
            }
        }
        DataType::Fp16 | DataType::Bf16 => {}
    }
    j.push(b']');
    Ok(())
}

/// Serializes strings into Triton's `BYTES` form (a little-endian `u32` length before each).
pub fn serialize_bytes<I, T>(elements: I) -> Vec<u8>
where
    I: IntoIterator<Item = T>,
    T: AsRef<[u8]>,
{
    let mut out = Vec::new();
    for e in elements {
        let e = e.as_ref();
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    out
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
