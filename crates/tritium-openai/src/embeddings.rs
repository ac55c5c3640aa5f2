//! `POST /v1/embeddings`, mapped as Triton's OpenAI frontend maps it: a vLLM-shaped embedding
//! model (one that takes a BYTES `embedding_request` and answers `text_output`) gets the JSON
//! string `{"input": ..., "pooling_params": {"dimensions": [N]}}` and answers the embedding as a
//! JSON list of floats in `text_output`, with `num_input_tokens` for the usage. TensorRT-LLM-
//! shaped models are refused (400), as Triton's frontend refuses them.
//!
//! `input` may be a string, a list of token ids, or a list of either; each item is one inference
//! (run concurrently) and one entry of `data`, in order.

use base64_lite::encode;
use serde_json::{json, Value};
use tritium_server::{ModelMetadata, Streamed};

use crate::error::ApiError;
use crate::shape::{read_embedding, Builder};

/// Whether `meta` is an embedding model in the vLLM shape.
pub fn is_embedding(meta: &ModelMetadata) -> bool {
    meta.inputs.iter().any(|t| t.name == "embedding_request" && t.datatype == "BYTES")
        && meta.outputs.iter().any(|t| t.name == "text_output" && t.datatype == "BYTES")
}

/// A parsed `/v1/embeddings` request.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingRequest {
    /// The model's name, as the client sent it.
    pub model: String,
    /// Each input: a string or a list of token ids.
    pub inputs: Vec<Value>,
    /// `encoding_format` is `base64`.
    pub base64: bool,
    /// `dimensions`.
    pub dimensions: Option<u64>,
}

fn is_tokens(v: &Value) -> bool {
    v.as_array().is_some_and(|a| !a.is_empty() && a.iter().all(|t| t.as_u64().is_some_and(|n| n <= u32::MAX.into())))
}

/// Parses and checks an embeddings request body.
pub fn parse(body: &[u8]) -> Result<EmbeddingRequest, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(fields) = v else {
        return Err(ApiError::invalid(None, "the request body must be a JSON object"));
    };
    for key in fields.keys() {
        if !matches!(key.as_str(), "model" | "input" | "encoding_format" | "dimensions" | "user") {
            return Err(ApiError::invalid(
                Some(key),
                format!("unknown field '{key}': embeddings take model, input, encoding_format, dimensions and user"),
            ));
        }
    }
    let model = fields
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(Some("model"), "'model' (a string) is required"))?
        .to_owned();
    let bad_input = || {
        ApiError::invalid(
            Some("input"),
            "'input' must be a non-empty string, a list of token ids, or a non-empty list of either",
        )
    };
    let inputs = match fields.get("input") {
        Some(Value::String(s)) if !s.is_empty() => vec![Value::String(s.clone())],
        Some(v) if is_tokens(v) => vec![v.clone()],
        Some(Value::Array(items)) if !items.is_empty() => {
            if !items.iter().all(|i| i.as_str().is_some_and(|s| !s.is_empty()) || is_tokens(i)) {
                return Err(bad_input());
            }
            items.clone()
        }
        _ => return Err(bad_input()),
    };
    let base64 = match fields.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(v) if v == "float" => false,
        Some(v) if v == "base64" => true,
        Some(_) => {
            return Err(ApiError::invalid(Some("encoding_format"), "'encoding_format' must be \"float\" or \"base64\""))
        }
    };
    let dimensions = match fields.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().filter(|n| *n >= 1) {
            Some(n) => Some(n),
            None => return Err(ApiError::invalid(Some("dimensions"), "'dimensions' must be a positive integer")),
        },
    };
    Ok(EmbeddingRequest { model, inputs, base64, dimensions })
}

/// The inference request for one input of `r`.
pub fn build(
    meta: &ModelMetadata,
    r: &EmbeddingRequest,
    input: &Value,
) -> Result<tritium_server::InferRequest, ApiError> {
    let mut pooling = serde_json::Map::new();
    if let Some(d) = r.dimensions {
        // As Triton's frontend passes it to vLLM.
        pooling.insert("dimensions".into(), json!([d]));
    }
    let body = json!({"input": input, "pooling_params": pooling}).to_string();
    let mut b = Builder { meta, inputs: Vec::new() };
    b.text("embedding_request", &body);
    b.flag("return_num_input_tokens", true)?;
    b.flag("return_num_output_tokens", true)?;
    Ok(tritium_server::InferRequest { model: meta.name.clone(), inputs: b.inputs, ..Default::default() })
}

/// One embedding as the client asked for it: floats, or base64 of little-endian `f32`s.
pub fn encode_embedding(values: &[f64], base64: bool) -> Value {
    if !base64 {
        return json!(values);
    }
    let bytes: Vec<u8> = values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
    Value::String(encode(&bytes))
}

/// One input's embedding and its `num_input_tokens`.
pub type Answer = (Vec<f64>, Option<u64>);

/// Reads one input's answer: the vector and `num_input_tokens`.
pub fn read_answer(model: &str, msg: Streamed) -> Result<Option<Answer>, ApiError> {
    match msg {
        Streamed::Response { result: Ok(resp), .. } => read_embedding(&resp)
            .map(Some)
            .map_err(|e| ApiError::internal(format!("embedding model '{model}' answered badly: {e}"))),
        Streamed::Response { result: Err(e), .. } => Err(e.into()),
        Streamed::Final => Ok(None),
    }
}

/// The response object.
pub fn response(model: &str, data: Vec<Value>, prompt_tokens: Option<u64>) -> Value {
    let data: Vec<Value> =
        data.into_iter().enumerate().map(|(i, e)| json!({"object": "embedding", "index": i, "embedding": e})).collect();
    let usage = prompt_tokens.map_or(Value::Null, |p| json!({"prompt_tokens": p, "total_tokens": p}));
    json!({"object": "list", "data": data, "model": model, "usage": usage})
}

/// Standard base64 (with padding), enough for embeddings.
mod base64_lite {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub(super) fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(encode(b""), "");
        assert_eq!(encode(b"f"), "Zg==");
        assert_eq!(encode(b"fo"), "Zm8=");
        assert_eq!(encode(b"foo"), "Zm9v");
        assert_eq!(encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(encode_embedding(&[1.0], true), json!("AACAPw=="));
        assert_eq!(encode_embedding(&[0.5, -2.0], false), json!([0.5, -2.0]));
    }

    #[test]
    fn inputs_are_checked() {
        let p = |v: Value| parse(v.to_string().as_bytes());
        assert_eq!(p(json!({"model": "m", "input": "hi"})).expect("one").inputs, vec![json!("hi")]);
        assert_eq!(p(json!({"model": "m", "input": [1, 2]})).expect("tokens").inputs, vec![json!([1, 2])]);
        assert_eq!(p(json!({"model": "m", "input": ["a", [3]]})).expect("many").inputs.len(), 2);
        let r = p(json!({"model": "m", "input": "x", "encoding_format": "base64", "dimensions": 4})).expect("ok");
        assert!(r.base64 && r.dimensions == Some(4));
        for bad in [json!(""), json!([]), json!([""]), json!([-1]), json!({"a": 1})] {
            let e = p(json!({"model": "m", "input": bad})).expect_err("bad input");
            assert_eq!(e.param.as_deref(), Some("input"));
        }
        assert_eq!(
            p(json!({"model": "m", "input": "x", "dimensions": 0})).expect_err("dims").param.as_deref(),
            Some("dimensions")
        );
        assert_eq!(
            p(json!({"model": "m", "input": "x", "encoding_format": "int8"})).expect_err("format").param.as_deref(),
            Some("encoding_format")
        );
        assert_eq!(
            p(json!({"model": "m", "input": "x", "extra": 1})).expect_err("extra").param.as_deref(),
            Some("extra")
        );
    }
}
