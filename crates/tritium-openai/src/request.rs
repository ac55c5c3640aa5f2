//! The OpenAI request bodies (`/v1/chat/completions`, `/v1/completions`) parsed into one
//! [`Generate`]: the prompt source and the generation fields, each checked with a 400 naming
//! the field at fault.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// `max_tokens` when a request sets none (Triton's frontend default, `--default-max-tokens`).
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// Fields of the request that are not sampling parameters and so never go into a vLLM-shaped
/// model's `sampling_parameters` (as Triton's frontend excludes them).
const NOT_SAMPLING: &[&str] = &[
    "model",
    "stream",
    "messages",
    "prompt",
    "echo",
    "store",
    "metadata",
    "response_format",
    "service_tier",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "function_call",
    "functions",
    "suffix",
    "max_completion_tokens",
    "max_tokens",
    "chat_template_kwargs",
    "logprobs",
    "top_logprobs",
    "best_of",
];

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop sequence.
    One(String),
    /// Up to four.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the request's `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields both endpoints share, typed; everything else stays in `extra`.
#[derive(Debug, Deserialize)]
struct Common {
    model: String,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    frequency_penalty: Option<f64>,
    #[serde(default)]
    presence_penalty: Option<f64>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    messages: Option<Vec<Value>>,
    #[serde(default)]
    prompt: Option<Value>,
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Generate {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// The model's name.
    pub model: String,
    /// Stream as server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `max_tokens` (or `max_completion_tokens`), or [`DEFAULT_MAX_TOKENS`].
    pub max_tokens: u32,
    /// Stop sequences (empty for none).
    pub stop: Vec<String>,
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `seed`.
    pub seed: Option<i64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `echo` (completions): include the prompt in the output.
    pub echo: bool,
    /// Chat messages, each normalized to `{role, content: string, ...}`.
    pub messages: Vec<Value>,
    /// The completion prompt.
    pub prompt: String,
    /// `tools`, as sent (chat).
    pub tools: Option<Value>,
    /// `tool_choice`, as sent (chat).
    pub tool_choice: Option<Value>,
    /// How many top log probabilities per token the client asked for (`logprobs: true` with
    /// `top_logprobs`, or a completion's `logprobs: N`); `None` when it asked for none.
    pub logprobs: Option<u32>,
    /// The JSON schema a named tool choice asks the model to decode to (TensorRT-LLM-shaped
    /// models get it as `guided_decoding_guide`, when they declare it).
    pub guided_json: Option<String>,
    /// The request's sampling parameters as a vLLM-shaped model takes them (a JSON object):
    /// every field that is not one of [`NOT_SAMPLING`], `max_tokens` set.
    pub sampling_parameters: Map<String, Value>,
}

fn check_range(param: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<(), ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => {
            Err(ApiError::invalid(Some(param), format!("'{param}' must be between {lo} and {hi}; got {x}")))
        }
        _ => Ok(()),
    }
}

/// Joins a message's `content` (a string, or a list of `{"type": "text", "text": ...}` parts)
/// into one string, as Triton's frontend does before rendering the template.
fn content_text(i: usize, content: &Value) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            Some(&param),
                            format!(
                                "content part of type {} is not supported: only text parts ({{\"type\": \"text\", \"text\": ...}}) are",
                                kind.unwrap_or("(missing)")
                            ),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid(Some(&param), "'content' must be a string or a list of text parts")),
    }
}

fn normalize_messages(messages: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "'messages' must hold at least one message"));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(mut m) = m else {
                return Err(ApiError::invalid(Some(&format!("messages[{i}]")), "each message must be an object"));
            };
            if !m.get("role").is_some_and(Value::is_string) {
                return Err(ApiError::invalid(
                    Some(&format!("messages[{i}].role")),
                    "each message needs a 'role' string (system, user, assistant, ...)",
                ));
            }
            let text = content_text(i, m.get("content").unwrap_or(&Value::Null))?;
            m.insert("content".into(), Value::String(text));
            Ok(Value::Object(m))
        })
        .collect()
}

fn prompt_text(prompt: Option<Value>) -> Result<String, ApiError> {
    match prompt {
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            Ok(items[0].as_str().unwrap_or_default().to_owned())
        }
        Some(Value::Array(_)) => Err(ApiError::invalid(
            Some("prompt"),
            "only one prompt per request is supported: send a string (or a list holding one string); token ids are not supported",
        )),
        None => Err(ApiError::invalid(Some("prompt"), "'prompt' is required")),
        Some(_) => Err(ApiError::invalid(Some("prompt"), "'prompt' must be a string")),
    }
}

/// Parses and checks a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Generate, ApiError> {
    let raw: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(fields) = raw else {
        return Err(ApiError::invalid(None, "the request body must be a JSON object"));
    };
    let common: Common = serde_path_to_error::deserialize(Value::Object(fields.clone())).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let inner = e.into_inner();
        let message = match &param {
            Some(p) => format!("invalid value for '{p}': {inner}"),
            None => format!("invalid request: {inner}"),
        };
        ApiError::invalid(param.as_deref(), message)
    })?;
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(Some("n"), "only n=1 is supported: send one request per choice"));
    }
    if fields.get("best_of").is_some_and(|v| !v.is_null() && v != &Value::from(1)) {
        return Err(ApiError::invalid(Some("best_of"), "'best_of' is not supported by this server"));
    }
    let logprobs = logprobs_of(endpoint, &fields)?;
    let (tools, tool_choice) = match endpoint {
        Endpoint::Chat => (
            fields.get("tools").filter(|v| !v.is_null()).cloned(),
            fields.get("tool_choice").filter(|v| !v.is_null()).cloned(),
        ),
        Endpoint::Completion => {
            if fields.get("tools").is_some_and(|v| !v.is_null()) {
                return Err(ApiError::invalid(Some("tools"), "'tools' belongs to /v1/chat/completions"));
            }
            (None, None)
        }
    };
    check_range("temperature", common.temperature, 0.0, 2.0)?;
    check_range("top_p", common.top_p, 0.0, 1.0)?;
    check_range("frequency_penalty", common.frequency_penalty, -2.0, 2.0)?;
    check_range("presence_penalty", common.presence_penalty, -2.0, 2.0)?;
    let stop = match common.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > 4 {
        return Err(ApiError::invalid(Some("stop"), "at most 4 stop sequences are allowed"));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(Some("stop"), "stop sequences must not be empty"));
    }
    let (messages, prompt) = match endpoint {
        Endpoint::Chat => {
            if fields.contains_key("prompt") {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    "'prompt' belongs to /v1/completions; chat requests send 'messages'",
                ));
            }
            let Some(messages) = common.messages else {
                return Err(ApiError::invalid(Some("messages"), "'messages' is required"));
            };
            (normalize_messages(messages)?, String::new())
        }
        Endpoint::Completion => {
            if fields.contains_key("messages") {
                return Err(ApiError::invalid(
                    Some("messages"),
                    "'messages' belongs to /v1/chat/completions; completion requests send 'prompt'",
                ));
            }
            (Vec::new(), prompt_text(common.prompt)?)
        }
    };
    if common.echo.is_some() && endpoint == Endpoint::Chat {
        return Err(ApiError::invalid(Some("echo"), "'echo' belongs to /v1/completions"));
    }
    let max_tokens = match endpoint {
        Endpoint::Chat => common.max_completion_tokens.or(common.max_tokens),
        Endpoint::Completion => common.max_tokens,
    }
    .unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 {
        return Err(ApiError::invalid(Some("max_tokens"), "'max_tokens' must be at least 1"));
    }
    let stream = common.stream.unwrap_or(false);
    if common.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            Some("stream_options"),
            "'stream_options' is only allowed when 'stream' is true",
        ));
    }
    let mut sampling_parameters: Map<String, Value> =
        fields.into_iter().filter(|(k, v)| !v.is_null() && !NOT_SAMPLING.contains(&k.as_str())).collect();
    sampling_parameters.insert("max_tokens".into(), Value::from(max_tokens));
    if let Some(n) = logprobs {
        // As Triton asks vLLM: the number of top log probabilities per token.
        sampling_parameters.insert("logprobs".into(), Value::from(n));
    }
    Ok(Generate {
        endpoint,
        model: common.model,
        stream,
        include_usage: common.stream_options.is_some_and(|o| o.include_usage),
        max_tokens,
        stop,
        temperature: common.temperature,
        top_p: common.top_p,
        seed: common.seed,
        frequency_penalty: common.frequency_penalty,
        presence_penalty: common.presence_penalty,
        echo: common.echo.unwrap_or(false),
        messages,
        prompt,
        tools,
        tool_choice,
        logprobs,
        guided_json: None,
        sampling_parameters,
    })
}

/// `logprobs` / `top_logprobs`: chat sends `logprobs: true` and `top_logprobs: 0..=20`, a
/// completion `logprobs: 0..=5`. Returns how many top log probabilities per token to ask for
/// (at least 1, as Triton asks vLLM), or `None`.
fn logprobs_of(endpoint: Endpoint, fields: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    let lp = fields.get("logprobs").filter(|v| !v.is_null());
    let top = fields.get("top_logprobs").filter(|v| !v.is_null());
    match endpoint {
        Endpoint::Chat => {
            let on = match lp {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(ApiError::invalid(Some("logprobs"), "'logprobs' must be true or false")),
            };
            let top = match top {
                None => None,
                Some(v) => match v.as_u64().filter(|n| *n <= 20) {
                    Some(n) => Some(n as u32),
                    None => {
                        return Err(ApiError::invalid(
                            Some("top_logprobs"),
                            "'top_logprobs' must be an integer from 0 to 20",
                        ))
                    }
                },
            };
            if top.is_some() && !on {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "`top_logprobs` can only be used when `logprobs` is True",
                ));
            }
            Ok(on.then(|| top.unwrap_or(1).max(1)))
        }
        Endpoint::Completion => match lp {
            None => Ok(None),
            Some(v) => match v.as_u64().filter(|n| *n <= 5) {
                Some(0) => Ok(None),
                Some(n) => Ok(Some(n as u32)),
                None => Err(ApiError::invalid(Some("logprobs"), "'logprobs' must be an integer from 0 to 5")),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(body: Value) -> Result<Generate, ApiError> {
        parse(Endpoint::Chat, body.to_string().as_bytes())
    }

    fn completion(body: Value) -> Result<Generate, ApiError> {
        parse(Endpoint::Completion, body.to_string().as_bytes())
    }

    #[test]
    fn chat_fields_are_parsed_and_sampling_parameters_exclude_the_rest() {
        let g = chat(json!({
            "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "stream": true, "stream_options": {"include_usage": true}, "max_completion_tokens": 7, "stop": "x",
            "temperature": 0.5, "seed": 3, "top_k": 4, "user": "u"
        }))
        .expect("valid");
        assert!(g.stream && g.include_usage);
        assert_eq!(g.max_tokens, 7);
        assert_eq!(g.stop, vec!["x".to_owned()]);
        assert_eq!(g.messages[0]["content"], "ab");
        let expected: Map<String, Value> =
            serde_json::from_value(json!({"stop": "x", "temperature": 0.5, "seed": 3, "top_k": 4, "max_tokens": 7}))
                .expect("map");
        assert_eq!(g.sampling_parameters, expected);
    }

    #[test]
    fn max_tokens_defaults_like_triton() {
        let g = completion(json!({"model": "m", "prompt": "hi"})).expect("valid");
        assert_eq!(g.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(g.sampling_parameters["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(g.prompt, "hi");
    }

    #[test]
    fn bad_fields_name_the_param() {
        let e = chat(json!({"model": "m", "messages": [], "n": 2})).expect_err("n=2");
        assert_eq!(e.param.as_deref(), Some("n"));
        let e = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "lots"}))
            .expect_err("type");
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.message.contains("max_tokens"), "{}", e.message);
        let e = chat(json!({"model": "m", "messages": [{"content": "x"}]})).expect_err("role");
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 9}))
            .expect_err("range");
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = completion(json!({"model": "m"})).expect_err("prompt");
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = completion(json!({"prompt": "x"})).expect_err("model");
        assert!(e.message.contains("model"), "{}", e.message);
        let e = parse(Endpoint::Chat, b"{not json").expect_err("json");
        assert!(e.message.contains("not valid JSON"));
        let e = completion(json!({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]})).expect_err("stop");
        assert_eq!(e.param.as_deref(), Some("stop"));
        let e = completion(json!({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}}))
            .expect_err("stream_options");
        assert_eq!(e.param.as_deref(), Some("stream_options"));
    }
}
