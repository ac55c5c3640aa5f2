//! OpenAI's response objects (`chat.completion`, `text_completion` and their stream chunks)
//! built from the model's responses, and their server-sent-event framing: each chunk is
//! `data: {json}\n\n`, the stream ends with `data: [DONE]\n\n`, and an error mid-stream is a
//! `data: {"error": {...}}` event before the end.

use serde_json::{json, Value};

use crate::logprobs;
use crate::request::{Endpoint, Generate};
use crate::shape::Piece;

/// The event that ends a stream.
pub const DONE: &str = "data: [DONE]\n\n";

/// One server-sent event carrying `v`.
pub fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// One completion being answered: its identity and what the model has said so far.
#[derive(Debug, Clone)]
pub struct Completion {
    /// `chatcmpl-...` or `cmpl-...`.
    pub id: String,
    /// Seconds since the epoch.
    pub created: u64,
    /// The model, as the client named it.
    pub model: String,
    /// Which endpoint.
    pub endpoint: Endpoint,
    include_usage: bool,
    max_tokens: u32,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    finish_reason: Option<String>,
    /// A finish reason the frontend decided (`tool_calls`, or `length` when the tool-call parse
    /// limit cut the stream), over the model's.
    pub finish_override: Option<&'static str>,
    /// The `logprobs` of each choice so far (chat: `{"content": [...]}`, completions: the four
    /// lists), when the client asked for them.
    pub logprobs: Option<Value>,
    want_logprobs: bool,
    logprob_offset: usize,
    last_logprobs: Option<Value>,
}

impl Completion {
    /// A completion for request `g`.
    pub fn new(id: String, created: u64, g: &Generate) -> Self {
        Self {
            id,
            created,
            model: g.model.clone(),
            endpoint: g.endpoint,
            include_usage: g.include_usage,
            max_tokens: g.max_tokens,
            prompt_tokens: None,
            completion_tokens: None,
            finish_reason: None,
            finish_override: None,
            logprobs: None,
            want_logprobs: g.logprobs.is_some(),
            logprob_offset: 0,
            last_logprobs: None,
        }
    }

    /// Takes a response's token counts and finish reason: `num_input_tokens` once (every
    /// response repeats it), `num_output_tokens` summed (each streamed response counts its own).
    pub fn absorb(&mut self, p: &Piece) {
        if self.prompt_tokens.is_none() {
            self.prompt_tokens = p.input_tokens;
        }
        if let Some(n) = p.output_tokens {
            self.completion_tokens = Some(self.completion_tokens.unwrap_or(0) + n);
        }
        if p.finish_reason.is_some() {
            self.finish_reason = p.finish_reason.clone();
        }
        if let (true, Some(raw)) = (self.want_logprobs, &p.logprobs) {
            let chunk = match self.endpoint {
                Endpoint::Chat => {
                    let entries = logprobs::chat_entries(raw);
                    let acc = self.logprobs.get_or_insert_with(|| json!({"content": []}));
                    if let Some(list) = acc["content"].as_array_mut() {
                        list.extend(entries.iter().cloned());
                    }
                    json!({"content": entries})
                }
                Endpoint::Completion => {
                    let (lists, end) = logprobs::completion_lists(raw, self.logprob_offset);
                    self.logprob_offset = end;
                    match self.logprobs.as_mut() {
                        Some(acc) => logprobs::extend_lists(acc, &lists),
                        None => self.logprobs = Some(lists.clone()),
                    }
                    lists
                }
            };
            self.last_logprobs = Some(chunk);
        }
    }

    /// The `logprobs` of the last absorbed response, for its streamed chunk.
    pub fn take_last_logprobs(&mut self) -> Option<Value> {
        self.last_logprobs.take()
    }

    /// `usage`: the model's counts, or `null` when the model does not report both.
    pub fn usage(&self) -> Value {
        match (self.prompt_tokens, self.completion_tokens) {
            (Some(p), Some(c)) => json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}),
            _ => Value::Null,
        }
    }

    /// The model's finish reason; else `length` when it produced `max_tokens` tokens; else `stop`.
    pub fn finish_reason(&self) -> String {
        if let Some(r) = self.finish_override {
            return r.into();
        }
        if let Some(r) = &self.finish_reason {
            return r.clone();
        }
        match self.completion_tokens {
            Some(n) if n >= u64::from(self.max_tokens) => "length".into(),
            _ => "stop".into(),
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn chunk(&self, choices: Value) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn choice(&self, text: &str, role: bool, finish: Option<String>) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let delta = match (role, finish.is_some()) {
                    (true, _) => json!({"role": "assistant", "content": text}),
                    (false, true) => json!({}),
                    (false, false) => json!({"content": text}),
                };
                json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}])
            }
            Endpoint::Completion => json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]),
        }
    }

    /// The first chunk of a chat stream (the role, no text); none for completions.
    pub fn opening(&self) -> Option<String> {
        (self.endpoint == Endpoint::Chat).then(|| event(&self.chunk(self.choice("", true, None))))
    }

    /// A chunk with new text.
    pub fn delta(&self, text: &str) -> String {
        self.delta_with_logprobs(text, None)
    }

    /// A chunk with new text and that text's `logprobs`.
    pub fn delta_with_logprobs(&self, text: &str, logprobs: Option<Value>) -> String {
        let mut choices = self.choice(text, false, None);
        if let Some(lp) = logprobs {
            choices[0]["logprobs"] = lp;
        }
        event(&self.chunk(choices))
    }

    /// A chat chunk with `delta` (tool-call deltas).
    pub fn delta_value(&self, delta: Value) -> String {
        event(&self.chunk(json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}])))
    }

    /// The chunks that end a successful stream: the finish reason, the usage (when asked for)
    /// and `[DONE]`.
    pub fn closing(&self) -> String {
        let mut out = event(&self.chunk(self.choice("", false, Some(self.finish_reason()))));
        if self.include_usage {
            let mut last = self.chunk(json!([]));
            last["usage"] = self.usage();
            out.push_str(&event(&last));
        }
        out.push_str(DONE);
        out
    }

    /// The whole (non-streamed) answer with `text`.
    pub fn whole(&self, text: &str) -> Value {
        self.whole_message(json!({"role": "assistant", "content": text}), text)
    }

    /// The whole answer: a chat's `message`, or a completion's `text`.
    pub fn whole_message(&self, message: Value, text: &str) -> Value {
        let logprobs = self.logprobs.clone().unwrap_or(Value::Null);
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": self.finish_reason(),
            }),
            Endpoint::Completion => json!({
                "index": 0, "text": text, "logprobs": logprobs, "finish_reason": self.finish_reason(),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [choice],
            "usage": self.usage(),
        })
    }
}

/// The events that end a stream with an error.
pub fn error_end(body: &Value) -> String {
    let mut out = event(body);
    out.push_str(DONE);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    fn completion(endpoint: Endpoint, body: &str) -> Completion {
        Completion::new("id-1".into(), 7, &parse(endpoint, body.as_bytes()).expect("valid"))
    }

    fn data(events: &str) -> Vec<Value> {
        assert!(events.ends_with("\n\n"), "{events:?}");
        events
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let payload = e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data line: {e:?}"));
                if payload == "[DONE]" {
                    Value::String("[DONE]".into())
                } else {
                    serde_json::from_str(payload).expect("json")
                }
            })
            .collect()
    }

    #[test]
    fn chat_stream_framing_and_usage() {
        let mut c = completion(
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":2}"#,
        );
        let open = data(&c.opening().expect("chat opens"));
        assert_eq!(open[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(open[0]["object"], "chat.completion.chunk");
        assert!(open[0]["usage"].is_null() && open[0].as_object().is_some_and(|o| o.contains_key("usage")));
        c.absorb(&Piece {
            text: "a".into(),
            input_tokens: Some(4),
            output_tokens: Some(1),
            finish_reason: None,
            logprobs: None,
        });
        c.absorb(&Piece {
            text: "b".into(),
            input_tokens: Some(4),
            output_tokens: Some(1),
            finish_reason: None,
            logprobs: None,
        });
        let d = data(&c.delta("a"));
        assert_eq!(d[0]["choices"][0]["delta"], json!({"content": "a"}));
        let end = data(&c.closing());
        assert_eq!(end.len(), 3);
        assert_eq!(end[0]["choices"][0]["finish_reason"], "length");
        assert_eq!(end[0]["choices"][0]["delta"], json!({}));
        assert_eq!(end[1]["choices"], json!([]));
        assert_eq!(end[1]["usage"], json!({"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}));
        assert_eq!(end[2], "[DONE]");
    }

    #[test]
    fn completion_whole_and_unknown_usage() {
        let mut c = completion(Endpoint::Completion, r#"{"model":"m","prompt":"p","max_tokens":5}"#);
        assert!(c.opening().is_none());
        c.absorb(&Piece { text: "t".into(), ..Piece::default() });
        let w = c.whole("t");
        assert_eq!(w["object"], "text_completion");
        assert_eq!(w["choices"][0]["text"], "t");
        assert_eq!(w["choices"][0]["finish_reason"], "stop");
        assert!(w["usage"].is_null());
        let end = data(&c.closing());
        assert_eq!(end.len(), 2, "no usage chunk unless asked");
        assert!(end[0].get("usage").is_none());
    }

    #[test]
    fn errors_end_the_stream() {
        let body = json!({"error": {"message": "boom", "type": "server_error", "param": null, "code": null}});
        let e = data(&error_end(&body));
        assert_eq!(e, vec![body, Value::String("[DONE]".into())]);
    }
}
