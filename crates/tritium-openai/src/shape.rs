//! Which models the frontend serves and how a request maps onto them, as Triton's OpenAI
//! frontend does: a vLLM-shaped model takes `text_input`, `stream` and `sampling_parameters`
//! (a JSON string), plus `exclude_input_in_output`, `return_num_input_tokens` and
//! `return_num_output_tokens` when it declares them; a TensorRT-LLM-shaped model takes
//! `text_input`, `max_tokens` and `stream`, plus the sampling inputs it declares (`temperature`,
//! `top_p`, `seed`, `stop_words`, ...). Both answer `text_output`.

use serde_json::Value;
use tritium_server::{DataType, InferRequest, InferResponse, InputTensor, ModelMetadata, OutputTensor, TensorMetadata};

use crate::error::ApiError;
use crate::request::{Endpoint, Generate};

/// How a model takes a generation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Triton's vLLM backend's inputs.
    Vllm,
    /// TensorRT-LLM's (the `tensorrt_llm` / ensemble / BLS models') inputs.
    TensorRtLlm,
}

impl Shape {
    /// The name `/v1/models` reports.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Vllm => "vllm",
            Shape::TensorRtLlm => "tensorrt_llm",
        }
    }

    /// The model's shape, or `None` when it is not an LLM this frontend can drive.
    pub fn of(meta: &ModelMetadata) -> Option<Shape> {
        let has_in = |name: &str, dtype: &str| meta.inputs.iter().any(|t| t.name == name && t.datatype == dtype);
        let has_out = meta.outputs.iter().any(|t| t.name == "text_output" && t.datatype == "BYTES");
        if !has_in("text_input", "BYTES") || !has_out {
            return None;
        }
        if has_in("sampling_parameters", "BYTES") {
            Some(Shape::Vllm)
        } else if meta.inputs.iter().any(|t| t.name == "max_tokens") {
            Some(Shape::TensorRtLlm)
        } else {
            None
        }
    }
}

/// Triton's serialized form of `BYTES` elements.
pub fn bytes_elements<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    let mut out = Vec::new();
    for s in items {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    out
}

/// The shape a one-element input gets: the model's declared shape with each variable dimension
/// (and the batch dimension) set to 1.
pub(crate) fn unit_shape(t: &TensorMetadata) -> Vec<i64> {
    if t.shape.is_empty() {
        return vec![1];
    }
    t.shape.iter().map(|&d| if d < 0 { 1 } else { d }).collect()
}

/// A number as the bytes of `dtype`, for scalar inputs.
fn number_bytes(dtype: DataType, v: f64) -> Option<Vec<u8>> {
    Some(match dtype {
        DataType::Bool => vec![u8::from(v != 0.0)],
        DataType::Int8 => (v as i8).to_le_bytes().to_vec(),
        DataType::Int16 => (v as i16).to_le_bytes().to_vec(),
        DataType::Int32 => (v as i32).to_le_bytes().to_vec(),
        DataType::Int64 => (v as i64).to_le_bytes().to_vec(),
        DataType::Uint8 => (v as u8).to_le_bytes().to_vec(),
        DataType::Uint16 => (v as u16).to_le_bytes().to_vec(),
        DataType::Uint32 => (v as u32).to_le_bytes().to_vec(),
        DataType::Uint64 => (v as u64).to_le_bytes().to_vec(),
        DataType::Fp32 => (v as f32).to_le_bytes().to_vec(),
        DataType::Fp64 => v.to_le_bytes().to_vec(),
        DataType::Fp16 | DataType::Bf16 | DataType::Bytes => return None,
    })
}

pub(crate) struct Builder<'a> {
    pub(crate) meta: &'a ModelMetadata,
    pub(crate) inputs: Vec<InputTensor>,
}

impl Builder<'_> {
    pub(crate) fn declared(&self, name: &str) -> Option<&TensorMetadata> {
        self.meta.inputs.iter().find(|t| t.name == name)
    }

    pub(crate) fn text(&mut self, name: &str, value: &str) {
        if let Some(t) = self.declared(name) {
            let shape = unit_shape(t);
            self.inputs.push(InputTensor {
                name: name.into(),
                datatype: DataType::Bytes,
                shape,
                data: bytes_elements([value]).into(),
            });
        }
    }

    fn number(&mut self, name: &str, value: f64) -> Result<(), ApiError> {
        let Some(t) = self.declared(name) else { return Ok(()) };
        let dtype = DataType::from_wire_name(&t.datatype).unwrap_or(DataType::Fp32);
        let Some(data) = number_bytes(dtype, value) else {
            return Err(ApiError::internal(format!(
                "model '{}' declares input '{name}' as {}, which this frontend cannot fill",
                self.meta.name, t.datatype
            )));
        };
        let shape = unit_shape(t);
        self.inputs.push(InputTensor { name: name.into(), datatype: dtype, shape, data: data.into() });
        Ok(())
    }

    pub(crate) fn flag(&mut self, name: &str, value: bool) -> Result<(), ApiError> {
        self.number(name, if value { 1.0 } else { 0.0 })
    }
}

/// The inference request for `g` on a model of `shape` (`prompt` is the rendered chat template
/// or the completion prompt). Only inputs the model declares are sent.
pub fn build(shape: Shape, meta: &ModelMetadata, g: &Generate, prompt: &str) -> Result<InferRequest, ApiError> {
    let mut b = Builder { meta, inputs: Vec::new() };
    b.text("text_input", prompt);
    b.flag("stream", g.stream)?;
    match shape {
        Shape::Vllm => {
            let params = Value::Object(g.sampling_parameters.clone()).to_string();
            b.text("sampling_parameters", &params);
            b.flag("exclude_input_in_output", !(g.endpoint == Endpoint::Completion && g.echo))?;
            b.flag("return_num_input_tokens", true)?;
            b.flag("return_num_output_tokens", true)?;
            b.flag("return_logprobs", g.logprobs.is_some())?;
        }
        Shape::TensorRtLlm => {
            if g.echo {
                return Err(ApiError::invalid(
                    Some("echo"),
                    "'echo' is not supported for TensorRT-LLM-shaped models (it is set when the model is built)",
                ));
            }
            b.number("max_tokens", f64::from(g.max_tokens))?;
            for (name, v) in [
                ("temperature", g.temperature),
                ("top_p", g.top_p),
                ("frequency_penalty", g.frequency_penalty),
                ("presence_penalty", g.presence_penalty),
                ("seed", g.seed.map(|s| s as f64)),
            ] {
                if let Some(v) = v {
                    b.number(name, v)?;
                }
            }
            if let Some(schema) = &g.guided_json {
                // As Triton's frontend asks TensorRT-LLM for guided decoding.
                b.text("guided_decoding_guide_type", "json_schema");
                b.text("guided_decoding_guide", schema);
            }
            if !g.stop.is_empty() {
                if let Some(t) = b.declared("stop_words") {
                    let mut shape = unit_shape(t);
                    if let Some(last) = shape.last_mut() {
                        *last = g.stop.len() as i64;
                    }
                    let data = bytes_elements(g.stop.iter().map(String::as_str));
                    b.inputs.push(InputTensor {
                        name: "stop_words".into(),
                        datatype: DataType::Bytes,
                        shape,
                        data: data.into(),
                    });
                }
            }
        }
    }
    Ok(InferRequest { model: meta.name.clone(), inputs: b.inputs, ..InferRequest::default() })
}

/// What one model response carries for the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Piece {
    /// The text (a delta when streaming).
    pub text: String,
    /// `num_input_tokens`, when the model sent it.
    pub input_tokens: Option<u64>,
    /// `num_output_tokens`, when the model sent it.
    pub output_tokens: Option<u64>,
    /// `finish_reason`, when the model sent one.
    pub finish_reason: Option<String>,
    /// The `logprobs` output (vLLM's JSON), when the model sent it.
    pub logprobs: Option<String>,
}

fn first_string(t: &OutputTensor) -> Result<String, String> {
    if t.datatype != DataType::Bytes {
        return Err(format!("output '{}' is {}, expected BYTES", t.name, t.datatype.wire_name()));
    }
    let Some(len) = t.data.get(..4) else { return Ok(String::new()) };
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let bytes = t.data.get(4..4 + len).ok_or_else(|| format!("output '{}' is truncated", t.name))?;
    String::from_utf8(bytes.to_vec()).map_err(|_| format!("output '{}' is not UTF-8 text", t.name))
}

fn first_count(t: &OutputTensor) -> Option<u64> {
    let d = &t.data;
    let le = |n: usize| d.get(..n).map(|b| b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)));
    match t.datatype {
        DataType::Uint8 | DataType::Int8 => le(1),
        DataType::Uint16 | DataType::Int16 => le(2),
        DataType::Uint32 => le(4),
        DataType::Int32 => le(4).map(|v| u64::from((v as u32 as i32).max(0) as u32)),
        DataType::Uint64 => le(8),
        DataType::Int64 => le(8).map(|v| (v as i64).max(0) as u64),
        _ => None,
    }
}

/// Reads one response's text and token counts.
pub fn read(resp: &InferResponse) -> Result<Piece, String> {
    let mut p = Piece::default();
    for t in &resp.outputs {
        match t.name.as_str() {
            "text_output" => p.text = first_string(t)?,
            "num_input_tokens" => p.input_tokens = first_count(t),
            "num_output_tokens" => p.output_tokens = first_count(t),
            "finish_reason" => p.finish_reason = first_string(t).ok().filter(|s| !s.is_empty()),
            "logprobs" => p.logprobs = first_string(t).ok(),
            _ => {}
        }
    }
    Ok(p)
}

/// Reads an embedding model's answer: `text_output` as a JSON list of numbers, and
/// `num_input_tokens`.
pub fn read_embedding(resp: &InferResponse) -> Result<(Vec<f64>, Option<u64>), String> {
    let mut vector = None;
    let mut tokens = None;
    for t in &resp.outputs {
        match t.name.as_str() {
            "text_output" => {
                let text = first_string(t)?;
                let v: Vec<f64> = serde_json::from_str(&text)
                    .map_err(|e| format!("text_output is not a JSON list of numbers ({e})"))?;
                vector = Some(v);
            }
            "num_input_tokens" => tokens = first_count(t),
            _ => {}
        }
    }
    Ok((vector.ok_or("it sent no text_output")?, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    fn tensor(name: &str, datatype: &str, shape: Vec<i64>) -> TensorMetadata {
        TensorMetadata { name: name.into(), datatype: datatype.into(), shape }
    }

    fn vllm() -> ModelMetadata {
        ModelMetadata {
            name: "v".into(),
            versions: vec!["1".into()],
            platform: "python".into(),
            inputs: vec![
                tensor("text_input", "BYTES", vec![1]),
                tensor("stream", "BOOL", vec![1]),
                tensor("sampling_parameters", "BYTES", vec![1]),
                tensor("exclude_input_in_output", "BOOL", vec![1]),
                tensor("return_num_output_tokens", "BOOL", vec![1]),
            ],
            outputs: vec![tensor("text_output", "BYTES", vec![-1]), tensor("num_output_tokens", "UINT32", vec![-1])],
        }
    }

    fn trtllm() -> ModelMetadata {
        ModelMetadata {
            name: "t".into(),
            versions: vec!["1".into()],
            platform: "ensemble".into(),
            inputs: vec![
                tensor("text_input", "BYTES", vec![-1, 1]),
                tensor("max_tokens", "INT32", vec![-1, 1]),
                tensor("stream", "BOOL", vec![-1, 1]),
                tensor("temperature", "FP32", vec![-1, 1]),
                tensor("seed", "UINT64", vec![-1, 1]),
                tensor("stop_words", "BYTES", vec![-1, -1]),
            ],
            outputs: vec![tensor("text_output", "BYTES", vec![-1, -1])],
        }
    }

    #[test]
    fn shapes_are_recognized() {
        assert_eq!(Shape::of(&vllm()), Some(Shape::Vllm));
        assert_eq!(Shape::of(&trtllm()), Some(Shape::TensorRtLlm));
        let mut other = vllm();
        other.outputs.clear();
        assert_eq!(Shape::of(&other), None);
        let mut other = trtllm();
        other.inputs.retain(|t| t.name != "max_tokens");
        assert_eq!(Shape::of(&other), None);
    }

    fn input<'a>(r: &'a InferRequest, name: &str) -> &'a InputTensor {
        r.inputs.iter().find(|i| i.name == name).unwrap_or_else(|| panic!("input {name} missing"))
    }

    #[test]
    fn vllm_request_carries_sampling_parameters_as_json() {
        let g = parse(
            Endpoint::Completion,
            br#"{"model":"v","prompt":"hi","max_tokens":5,"temperature":0.5,"stream":true,"echo":true}"#,
        )
        .expect("valid");
        let r = build(Shape::Vllm, &vllm(), &g, "hi").expect("built");
        assert_eq!(input(&r, "text_input").data.as_ref(), bytes_elements(["hi"]).as_slice());
        assert_eq!(input(&r, "stream").data.as_ref(), &[1]);
        assert_eq!(input(&r, "exclude_input_in_output").data.as_ref(), &[0], "echo keeps the prompt");
        let params = &input(&r, "sampling_parameters").data;
        let json: Value = serde_json::from_slice(&params[4..]).expect("json");
        assert_eq!(json, serde_json::json!({"max_tokens": 5, "temperature": 0.5}));
        assert_eq!(input(&r, "return_num_output_tokens").data.as_ref(), &[1]);
        assert!(r.inputs.iter().all(|i| i.name != "return_num_input_tokens"), "undeclared inputs are not sent");
    }

    #[test]
    fn trtllm_request_fills_declared_inputs_in_their_dtypes() {
        let g = parse(
            Endpoint::Chat,
            br#"{"model":"t","messages":[{"role":"user","content":"x"}],"max_tokens":9,"temperature":0.25,"seed":7,"top_p":0.5,"stop":["a","bc"]}"#,
        )
        .expect("valid");
        let r = build(Shape::TensorRtLlm, &trtllm(), &g, "p").expect("built");
        assert_eq!(input(&r, "text_input").shape, vec![1, 1]);
        assert_eq!(input(&r, "max_tokens").data.as_ref(), &9i32.to_le_bytes());
        assert_eq!(input(&r, "temperature").data.as_ref(), &0.25f32.to_le_bytes());
        assert_eq!(input(&r, "seed").data.as_ref(), &7u64.to_le_bytes());
        let stop = input(&r, "stop_words");
        assert_eq!(stop.shape, vec![1, 2]);
        assert_eq!(stop.data.as_ref(), bytes_elements(["a", "bc"]).as_slice());
        assert!(r.inputs.iter().all(|i| i.name != "top_p"), "top_p is not declared");
    }

    #[test]
    fn trtllm_guided_decoding_goes_to_the_declared_inputs() {
        let mut g =
            parse(Endpoint::Chat, br#"{"model":"t","messages":[{"role":"user","content":"x"}]}"#).expect("valid");
        g.guided_json = Some(r#"{"type":"object"}"#.into());
        let mut meta = trtllm();
        let r = build(Shape::TensorRtLlm, &meta, &g, "p").expect("built");
        assert!(r.inputs.iter().all(|i| !i.name.starts_with("guided")), "not declared, not sent");
        meta.inputs.push(tensor("guided_decoding_guide_type", "BYTES", vec![-1, 1]));
        meta.inputs.push(tensor("guided_decoding_guide", "BYTES", vec![-1, 1]));
        let r = build(Shape::TensorRtLlm, &meta, &g, "p").expect("built");
        assert_eq!(input(&r, "guided_decoding_guide_type").data.as_ref(), bytes_elements(["json_schema"]).as_slice());
        assert_eq!(
            input(&r, "guided_decoding_guide").data.as_ref(),
            bytes_elements([r#"{"type":"object"}"#]).as_slice()
        );
    }

    #[test]
    fn responses_are_read() {
        let resp = InferResponse {
            model: "v".into(),
            version: 1,
            id: String::new(),
            outputs: vec![
                OutputTensor {
                    name: "text_output".into(),
                    datatype: DataType::Bytes,
                    shape: vec![1],
                    data: bytes_elements(["héllo"]),
                },
                OutputTensor {
                    name: "num_output_tokens".into(),
                    datatype: DataType::Uint32,
                    shape: vec![1],
                    data: 3u32.to_le_bytes().to_vec(),
                },
            ],
            parameters: Vec::new(),
        };
        let p = read(&resp).expect("read");
        assert_eq!(p.text, "héllo");
        assert_eq!(p.output_tokens, Some(3));
        assert_eq!(p.input_tokens, None);
    }
}
