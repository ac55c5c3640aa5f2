//! Triton's generate extension (`/generate`, `/generate_stream`): the JSON object of a generate
//! request to an [`InferRequest`], and a response to the generate JSON object, following
//! `HTTPAPIServer::GenerateRequestClass` in Triton's `src/http_server.cc`. Plain functions, no I/O.
//!
//! Request: each top-level key that names a model input becomes that input (a scalar is one
//! element, an array its elements; the shape comes from the model's metadata: fixed dimensions
//! take their share of the elements, the innermost variable one the rest, other variable ones
//! 1); every other key becomes a request parameter (string, integer, boolean or number). The
//! `parameters` object is mapped the same way, key by key. `id` is also the request's id.
//!
//! Response: one JSON object whose keys are `id` (when not empty), `model_name`,
//! `model_version`, each response parameter and each output (a single element as a scalar,
//! anything else as a flat array), written in byte order of the keys as Triton's `std::map`
//! does; a parameter named like an output hides it. `/generate_stream` sends each as a
//! server-sent event, `data: <json>\n\n`.

use bytes::Bytes;
use serde_json::Value;
use tritium_server::{
    DataType, InferError, InferRequest, InferResponse, InputTensor, ModelMetadata, ParamValue, Streamed,
};

use crate::codec::{self, OrderedObject};
use crate::json_out;

/// Triton's text when `/generate` gets other than one response.
pub const NOT_ONE_RESPONSE: &str = "generate expects model to produce exactly 1 response, use generate stream for model that generates various number of responses";

/// The parameter that asks a decoupled model's stream for its empty final response (gRPC only
/// sends one; an SSE stream has nothing to send for it). Checked and not passed to the model.
const EMPTY_FINAL: &str = "triton_enable_empty_final_response";

/// Decodes a generate request body (empty means `{}`) for `model` with metadata `meta`;
/// `max_input_size` bounds the total size of the inputs (`--http-max-input-size`).
pub fn decode_generate_request(
    model: &str,
    version: Option<i64>,
    body: &[u8],
    meta: &ModelMetadata,
    max_input_size: usize,
) -> Result<InferRequest, InferError> {
    let top = if body.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        serde_json::from_slice::<OrderedObject>(body)
            .map_err(|e| InferError::invalid(format!("failed to parse the request JSON buffer: {e}")))?
            .0
    };
    let mut d = Decoder {
        meta,
        max_input_size,
        consumed: 0,
        request: InferRequest { model: model.to_string(), version, ..Default::default() },
    };
    if let Some((_, id)) = top.iter().find(|(k, _)| k == "id") {
        match id {
            Value::String(s) => d.request.id = s.clone(),
            other => {
                return Err(InferError::invalid(format!(
                    "Unable to parse 'id': attempt to access JSON non-string as string, got {}",
                    codec::describe(other)
                )))
            }
        }
    }
    for (key, value) in top {
        if key == "parameters" {
            if d.input(&key).is_some() {
                return Err(InferError::invalid(format!(
                    "Keyword '{key}' for nested schema also given as input tensor name"
                )));
            }
            let Value::Object(nested) = value else {
                return Err(InferError::invalid(format!(
                    "Expected JSON object for keyword: '{key}': expected an object, got {}",
                    codec::describe(&value)
                )));
            };
            for (k, v) in nested {
                d.exact(k, v).map_err(|e| InferError::new(e.kind, format!("Converting keyword: '{key}': {e}")))?;
            }
        } else {
            d.exact(key, value)?;
        }
    }
    Ok(d.request)
}

/// The state of one request's decoding.
struct Decoder<'a> {
    meta: &'a ModelMetadata,
    max_input_size: usize,
    /// Bytes of the inputs decoded so far.
    consumed: usize,
    request: InferRequest,
}

impl Decoder<'_> {
    fn input(&self, name: &str) -> Option<&tritium_server::TensorMetadata> {
        self.meta.inputs.iter().find(|i| i.name == name)
    }

    /// Triton's `ExactMappingInput`: an input when the key names one, else a parameter.
    fn exact(&mut self, name: String, value: Value) -> Result<(), InferError> {
        let Some(meta) = self.input(&name) else {
            return self.parameter(name, value);
        };
        let (wire, shape) = (meta.datatype.clone(), meta.shape.clone());
        let tensor = input_tensor(&name, &wire, &shape, &value, &mut self.consumed, self.max_input_size)?;
        self.request.inputs.push(tensor);
        Ok(())
    }

    /// Triton's `SetTritonParameterFromJsonParameter`.
    fn parameter(&mut self, name: String, value: Value) -> Result<(), InferError> {
        if name == EMPTY_FINAL {
            // As gRPC checks it (`SetStateParameterFromTritonParameter`).
            return match value {
                Value::Bool(_) => Ok(()),
                _ => {
                    Err(InferError::invalid(format!("invalid value type for '{name}' parameter, expected bool_param.")))
                }
            };
        }
        let v = codec::param_value(&name, &value)?;
        self.request.parameters.push((name, v));
        Ok(())
    }
}

/// One input from its JSON value, its datatype and its metadata shape.
fn input_tensor(
    name: &str,
    wire: &str,
    meta_shape: &[i64],
    value: &Value,
    consumed: &mut usize,
    max_input_size: usize,
) -> Result<InputTensor, InferError> {
    let Some(dtype) = DataType::from_wire_name(wire) else {
        return Err(InferError::invalid(format!("input '{name}' has unsupported datatype {wire}")));
    };
    let elements: Vec<&Value> = match value {
        Value::Array(a) => a.iter().collect(),
        v => vec![v],
    };
    let byte_size = match dtype.element_size() {
        None => bytes_size(value).map_err(|m| InferError::invalid(format!("Unable to parse JSON bytes array: {m}")))?,
        Some(size) => elements
            .len()
            .checked_mul(size)
            .ok_or_else(|| InferError::invalid(format!("input '{name}' has too many elements of datatype {wire}")))?,
    };
    if byte_size == 0 {
        // As Triton: an input without data is added without a shape.
        return Ok(InputTensor { name: name.to_string(), datatype: dtype, shape: Vec::new(), data: Bytes::new() });
    }
    match byte_size.checked_add(*consumed) {
        Some(total) if total <= max_input_size => {}
        _ => {
            return Err(InferError::invalid(format!(
                "request size of {} bytes with input '{name}' of size {byte_size} bytes exceeds the maximum allowed input size of {max_input_size}. Use --http-max-input-size to increase the limit.",
                *consumed
            )))
        }
    }
    *consumed += byte_size;
    let shape = shape_for(name, meta_shape, elements.len())?;
    let write = codec::leaf_writer(name, dtype, "[").map_err(InferError::from)?;
    let mut data = Vec::with_capacity(byte_size);
    for (index, element) in elements.into_iter().enumerate() {
        if element.is_array() {
            return Err(InferError::internal(
                "Unable to parse 'data': Shape does not match true shape of 'data' field",
            ));
        }
        write(element, &mut data).map_err(|m| {
            InferError::invalid(format!("Unable to parse 'data' of input '{name}': element {index}: {m}"))
        })?;
    }
    Ok(InputTensor { name: name.to_string(), datatype: dtype, shape, data: Bytes::from(data) })
}

/// The serialized size of a `BYTES` value (strings at any depth of arrays), or why it has none.
fn bytes_size(value: &Value) -> Result<usize, String> {
    match value {
        Value::Array(a) => a.iter().try_fold(0usize, |acc, v| Ok(acc.saturating_add(bytes_size(v)?))),
        Value::String(s) => Ok(s.len().saturating_add(4)),
        other => Err(format!("attempt to access JSON non-string as string, got {}", codec::describe(other))),
    }
}

/// Triton's two passes from an element count to a shape: the fixed dimensions (innermost first)
/// divide the count, then the innermost variable dimension takes what is left and the others 1.
pub fn shape_for(name: &str, meta_shape: &[i64], elements: usize) -> Result<Vec<i64>, InferError> {
    let bad = || InferError::invalid(format!("The schema can not convert input '{name}' to tensor with proper shape"));
    let mut left = elements as u64;
    for &d in meta_shape.iter().rev() {
        if d != -1 {
            let d = u64::try_from(d).ok().filter(|&d| d > 0).ok_or_else(bad)?;
            if !left.is_multiple_of(d) {
                return Err(bad());
            }
            left /= d;
        }
    }
    let mut shape = meta_shape.to_vec();
    for d in shape.iter_mut().rev() {
        if *d == -1 {
            *d = i64::try_from(left).map_err(|_| bad())?;
            left = 1;
        }
    }
    if left != 1 {
        return Err(bad());
    }
    Ok(shape)
}

/// One key of the response object and what it holds.
enum Entry<'a> {
    Reserved(String),
    Parameter(&'a ParamValue),
    Output(&'a tritium_server::OutputTensor),
}

/// Encodes one response as the generate JSON object.
pub fn encode_generate_response(resp: &InferResponse) -> Result<Vec<u8>, InferError> {
    let mut entries: std::collections::BTreeMap<&str, Entry<'_>> = std::collections::BTreeMap::new();
    if !resp.id.is_empty() {
        entries.insert("id", Entry::Reserved(resp.id.clone()));
    }
    entries.insert("model_name", Entry::Reserved(resp.model.clone()));
    entries.insert("model_version", Entry::Reserved(resp.version.to_string()));
    // The first of a name wins, as `std::map::emplace`.
    for (name, value) in &resp.parameters {
        entries.entry(name.as_str()).or_insert(Entry::Parameter(value));
    }
    for output in &resp.outputs {
        entries.entry(output.name.as_str()).or_insert(Entry::Output(output));
    }
    let mut j = Vec::with_capacity(256);
    j.push(b'{');
    for (i, (key, entry)) in entries.into_iter().enumerate() {
        if i > 0 {
            j.push(b',');
        }
        json_out::key(&mut j, key);
        match entry {
            Entry::Reserved(s) => json_out::string(&mut j, s.as_bytes()),
            Entry::Parameter(ParamValue::Bool(b)) => json_out::boolean(&mut j, *b),
            Entry::Parameter(ParamValue::Int(n)) => json_out::int(&mut j, *n),
            Entry::Parameter(ParamValue::Double(d)) => json_out::double(&mut j, *d),
            Entry::Parameter(ParamValue::Str(s)) => json_out::string(&mut j, s.as_bytes()),
            Entry::Output(o) => {
                let count = codec::element_count(&o.shape).ok_or_else(|| {
                    InferError::internal(format!("output '{}' has an invalid shape {:?}", o.name, o.shape))
                })?;
                let start = j.len();
                codec::write_output_data(&mut j, &o.name, o.datatype, &o.data, count)?;
                if count == 1 {
                    // One element: the array is stripped, as Triton does.
                    let inner = j[start + 1..j.len() - 1].to_vec();
                    j.truncate(start);
                    j.extend_from_slice(&inner);
                }
            }
        }
    }
    j.push(b'}');
    Ok(j)
}

/// An error as the generate endpoints write it, `{"error":"<message>"}`.
pub fn error_json(message: &str) -> Vec<u8> {
    crate::error::error_body(message).into_bytes()
}

/// One message of a response stream as its JSON (the response, or the error JSON when the
/// model failed or the response cannot be written) and its error, if it is one; `None` for a
/// final flag without a response, for which Triton writes nothing.
pub fn message_json(message: Streamed) -> Option<(Vec<u8>, Option<InferError>)> {
    let Streamed::Response { result, .. } = message else { return None };
    match result.and_then(|r| encode_generate_response(&r)) {
        Ok(json) => Some((json, None)),
        Err(e) => Some((error_json(&e.message), Some(e))),
    }
}

/// One message of a response stream as its server-sent event, if it has one.
pub(crate) fn event_of(message: Streamed) -> Option<Bytes> {
    message_json(message).map(|(json, _)| sse_event(&json))
}

/// One server-sent event carrying `json`: `data: <json>\n\n`.
pub fn sse_event(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tritium_server::{OutputTensor, TensorMetadata};

    fn meta(inputs: &[(&str, &str, &[i64])]) -> ModelMetadata {
        ModelMetadata {
            name: "m".into(),
            versions: vec!["1".into()],
            platform: "python".into(),
            inputs: inputs
                .iter()
                .map(|(n, t, s)| TensorMetadata { name: (*n).into(), datatype: (*t).into(), shape: s.to_vec() })
                .collect(),
            outputs: Vec::new(),
        }
    }

    fn decode(body: Value, m: &ModelMetadata) -> Result<InferRequest, InferError> {
        decode_generate_request("m", None, body.to_string().as_bytes(), m, 1 << 20)
    }

    #[test]
    fn inputs_take_their_shape_from_the_metadata_and_other_keys_are_parameters() {
        let m = meta(&[("INPUT0", "FP32", &[4]), ("TEXT", "BYTES", &[-1, 1]), ("N", "INT32", &[-1, -1])]);
        // Keys are taken in the order written (nested `parameters` in key order).
        let body = r#"{"id": "7", "INPUT0": [1, 2, 3, 4], "TEXT": "hi", "N": [5, 6], "temperature": 0.5,
                       "parameters": {"stream": false, "max_tokens": 3}}"#;
        let r = decode_generate_request("m", None, body.as_bytes(), &m, 1 << 20).expect("decodes");
        assert_eq!(r.id, "7");
        let shapes: Vec<(&str, &[i64])> = r.inputs.iter().map(|i| (i.name.as_str(), &i.shape[..])).collect();
        assert_eq!(shapes, vec![("INPUT0", &[4][..]), ("TEXT", &[1, 1][..]), ("N", &[1, 2][..])]);
        assert_eq!(&r.inputs[0].data[..4], &1f32.to_le_bytes());
        assert_eq!(&r.inputs[1].data[..], &codec::serialize_bytes(["hi"])[..]);
        assert_eq!(
            r.parameters,
            vec![
                ("id".to_string(), ParamValue::Str("7".into())),
                ("temperature".to_string(), ParamValue::Double(0.5)),
                ("max_tokens".to_string(), ParamValue::Int(3)),
                ("stream".to_string(), ParamValue::Bool(false)),
            ]
        );
    }

    #[test]
    fn a_key_inside_parameters_that_names_an_input_is_that_input() {
        let m = meta(&[("X", "INT64", &[1])]);
        let r = decode(json!({"parameters": {"X": 9}}), &m).expect("decodes");
        assert_eq!(r.inputs[0].shape, vec![1]);
        assert!(r.parameters.is_empty());
    }

    #[test]
    fn errors_have_tritons_texts() {
        let m = meta(&[("INPUT0", "FP32", &[4]), ("parameters", "INT32", &[1])]);
        let err = |body: Value| decode(body, &m).expect_err("refused").message;
        assert_eq!(
            err(json!({"INPUT0": [1, 2, 3]})),
            "The schema can not convert input 'INPUT0' to tensor with proper shape"
        );
        assert_eq!(
            err(json!({"parameters": {}})),
            "Keyword 'parameters' for nested schema also given as input tensor name"
        );
        assert_eq!(
            err(json!({"x": [1]})),
            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."
        );
        assert!(err(json!({"id": 5})).starts_with("Unable to parse 'id'"));
        assert!(
            err(json!({"INPUT0": ["a", 2, 3, 4]})).starts_with("Unable to parse 'data' of input 'INPUT0': element 0")
        );
        let m2 = meta(&[]);
        let e = decode(json!({"parameters": 3}), &m2).expect_err("refused");
        assert!(e.message.starts_with("Expected JSON object for keyword: 'parameters'"), "{}", e.message);
        let e = decode(json!({"parameters": {"bad": {}}}), &m2).expect_err("refused");
        assert_eq!(
            e.message,
            "Converting keyword: 'parameters': parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."
        );
        let e = decode_generate_request("m", None, b"{", &m2, 10).expect_err("refused");
        assert!(e.message.starts_with("failed to parse the request JSON buffer"));
        let big = meta(&[("B", "INT64", &[-1])]);
        let e = decode_generate_request("m", None, br#"{"B":[1,2]}"#, &big, 10).expect_err("refused");
        assert_eq!(
            e.message,
            "request size of 0 bytes with input 'B' of size 16 bytes exceeds the maximum allowed input size of 10. Use --http-max-input-size to increase the limit."
        );
    }

    #[test]
    fn the_empty_final_parameter_is_checked_and_not_passed_on() {
        let m = meta(&[]);
        let r = decode(json!({"triton_enable_empty_final_response": true}), &m).expect("decodes");
        assert!(r.parameters.is_empty());
        let e = decode(json!({"triton_enable_empty_final_response": 1}), &m).expect_err("refused");
        assert_eq!(
            e.message,
            "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."
        );
    }

    #[test]
    fn empty_body_is_an_empty_request() {
        let r = decode_generate_request("m", Some(2), b"", &meta(&[]), 10).expect("decodes");
        assert_eq!((r.inputs.len(), r.parameters.len(), r.version), (0, 0, Some(2)));
    }

    #[test]
    fn shapes_follow_tritons_two_passes() {
        assert_eq!(shape_for("x", &[-1, 2], 6).expect("ok"), vec![3, 2]);
        assert_eq!(shape_for("x", &[-1, -1, 3], 6).expect("ok"), vec![1, 2, 3]);
        assert_eq!(shape_for("x", &[2, 3], 6).expect("ok"), vec![2, 3]);
        assert!(shape_for("x", &[4], 6).is_err());
        assert!(shape_for("x", &[0], 6).is_err());
    }

    #[test]
    fn responses_strip_single_elements_and_sort_keys() {
        let resp = InferResponse {
            model: "m".into(),
            version: 1,
            id: "42".into(),
            outputs: vec![
                OutputTensor {
                    name: "text_output".into(),
                    datatype: DataType::Bytes,
                    shape: vec![1],
                    data: codec::serialize_bytes(["hello"]),
                },
                OutputTensor {
                    name: "OUT".into(),
                    datatype: DataType::Int32,
                    shape: vec![2],
                    data: [1i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect(),
                },
                OutputTensor { name: "E".into(), datatype: DataType::Fp32, shape: vec![0], data: Vec::new() },
            ],
            parameters: vec![("done".into(), ParamValue::Bool(true))],
        };
        let json = String::from_utf8(encode_generate_response(&resp).expect("encodes")).expect("utf-8");
        assert_eq!(
            json,
            r#"{"E":[],"OUT":[1,2],"done":true,"id":"42","model_name":"m","model_version":"1","text_output":"hello"}"#
        );
        assert_eq!(&sse_event(b"{}")[..], b"data: {}\n\n");
    }
}
