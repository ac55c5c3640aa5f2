//! How a chat answer's text becomes the client's message: plain content; tool calls found by
//! the `--tool-call-parser` (`tool_choice` `auto`); or, for a named function (or `required`),
//! the whole text as that function's arguments, as Triton's frontend answers. Streamed, the
//! [`Reader`] turns each piece of text into OpenAI's deltas: a tool call's first delta carries
//! its index, id, type and name, the next ones pieces of its arguments.

use serde_json::{json, Value};

use crate::tools::{self, Call, Choice, Event, Format, Parser};

/// The tool-call parse passed `--max-tool-call-parse-bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

/// Reads one streamed chat answer.
#[derive(Debug)]
pub enum Reader {
    /// Content only.
    Plain,
    /// Tool calls parsed as they come.
    Auto {
        /// The parser.
        parser: Box<Parser>,
        /// `--max-tool-call-parse-bytes`.
        limit: usize,
    },
    /// The whole text is the arguments of one named function.
    Named {
        /// The function.
        name: String,
        /// The call's id.
        id: String,
        /// Whether its first delta went out.
        started: bool,
    },
}

impl Reader {
    /// The reader for a request's tool choice.
    pub fn new(choice: &Choice, format: Option<Format>, seed: u64, limit: usize, id: &str) -> Self {
        match (choice, format) {
            (Choice::Auto, Some(format)) => Reader::Auto { parser: Box::new(Parser::new(format, seed)), limit },
            (Choice::Named { name, .. }, _) => Reader::Named { name: name.clone(), id: id.to_owned(), started: false },
            _ => Reader::Plain,
        }
    }

    /// Whether the answer is plain content.
    pub fn is_plain(&self) -> bool {
        matches!(self, Reader::Plain)
    }

    /// The deltas for the next piece of text; `Err` when the tool-call parse would pass its limit
    /// (the piece is not read).
    pub fn step(&mut self, text: &str) -> Result<Vec<Value>, Truncated> {
        match self {
            Reader::Plain => Ok(if text.is_empty() { Vec::new() } else { vec![json!({"content": text})] }),
            Reader::Auto { parser, limit } => {
                if !parser.is_content() && parser.tool_bytes().saturating_add(text.len()) > *limit {
                    return Err(Truncated);
                }
                Ok(deltas(parser.feed(text)))
            }
            Reader::Named { name, id, started } => {
                if !*started {
                    *started = true;
                    return Ok(vec![json!({"tool_calls": [{
                        "index": 0, "id": id, "type": "function",
                        "function": {"name": name, "arguments": text},
                    }]})]);
                }
                if text.is_empty() {
                    return Ok(Vec::new());
                }
                Ok(vec![json!({"tool_calls": [{"index": 0, "function": {"arguments": text}}]})])
            }
        }
    }

    /// The last deltas, when the answer ends.
    pub fn end(&mut self) -> Vec<Value> {
        match self {
            Reader::Auto { parser, .. } => deltas(parser.finish()),
            _ => Vec::new(),
        }
    }

    /// `tool_calls` when the parser found calls; else the model's own reason stands.
    pub fn finish_reason(&self) -> Option<&'static str> {
        match self {
            Reader::Auto { parser, .. } if parser.completed_calls() > 0 => Some("tool_calls"),
            _ => None,
        }
    }
}

/// OpenAI's deltas for parser events: a call's start and the arguments that follow it in the
/// same piece share one delta.
fn deltas(events: Vec<Event>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut last_start: Option<usize> = None;
    for e in events {
        match e {
            Event::Content(s) => {
                last_start = None;
                out.push(json!({"content": s}));
            }
            Event::Start { index, id, name } => {
                last_start = Some(index);
                out.push(json!({"tool_calls": [{
                    "index": index, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]}));
            }
            Event::Args { index, text } => {
                if last_start == Some(index) {
                    if let Some(args) = out.last_mut().and_then(|d| d["tool_calls"][0]["function"].get_mut("arguments"))
                    {
                        *args = Value::String(text);
                        last_start = None;
                        continue;
                    }
                }
                last_start = None;
                out.push(json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]}));
            }
        }
    }
    out
}

fn call_value(c: &Call) -> Value {
    json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

/// The message of a whole chat answer and the finish reason it sets, if any.
pub fn whole(
    choice: &Choice,
    format: Option<Format>,
    seed: u64,
    id: &str,
    text: &str,
) -> (Value, Option<&'static str>) {
    match (choice, format) {
        (Choice::Auto, Some(format)) => match tools::parse_whole(format, seed, text) {
            Some(calls) => (
                json!({"role": "assistant", "content": null, "tool_calls": calls.iter().map(call_value).collect::<Vec<_>>()}),
                Some("tool_calls"),
            ),
            None => (json!({"role": "assistant", "content": text}), None),
        },
        (Choice::Named { name, .. }, _) => {
            let call = Call { id: id.to_owned(), name: name.clone(), arguments: text.to_owned() };
            (json!({"role": "assistant", "content": null, "tool_calls": [call_value(&call)]}), None)
        }
        _ => (json!({"role": "assistant", "content": text}), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_deltas_are_chunked_as_openai() {
        let mut r = Reader::new(&Choice::Auto, Some(Format::Llama3), 1, 1 << 20, "x");
        let d = r.step(r#"{"name": "f", "arguments": {"a""#).expect("under the limit");
        assert_eq!(d.len(), 1, "{d:?}");
        let call = &d[0]["tool_calls"][0];
        assert_eq!((call["index"].as_u64(), call["type"].as_str()), (Some(0), Some("function")));
        assert_eq!(call["function"], json!({"name": "f", "arguments": "{\"a\""}));
        assert!(call["id"].is_string());
        let d = r.step(": 1}}").expect("under the limit");
        assert_eq!(d, vec![json!({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]})]);
        assert!(r.end().is_empty());
        assert_eq!(r.finish_reason(), Some("tool_calls"));
    }

    #[test]
    fn the_parse_limit_truncates_tool_calls_only() {
        let mut r = Reader::new(&Choice::Auto, Some(Format::Mistral), 1, 20, "x");
        assert!(r.step("[TOOL_CALLS]").is_ok());
        assert_eq!(r.step("[{\"name\": \"f\""), Err(Truncated));
        let mut r = Reader::new(&Choice::Auto, Some(Format::Mistral), 1, 10, "x");
        assert_eq!(r.step("plain").expect("content").len(), 1);
        assert!(r.step(" text, longer than the limit").is_ok(), "content is not held, so not counted");
    }

    #[test]
    fn named_choice_wraps_the_text() {
        let choice = Choice::Named { name: "f".into(), schema: None };
        let mut r = Reader::new(&choice, None, 1, 10, "id-1");
        let d = r.step("{\"a\"").expect("no limit");
        assert_eq!(d[0]["tool_calls"][0]["function"], json!({"name": "f", "arguments": "{\"a\""}));
        assert_eq!(d[0]["tool_calls"][0]["id"], "id-1");
        let d = r.step(": 1}").expect("no limit");
        assert_eq!(d[0], json!({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}));
        let (m, finish) = whole(&choice, None, 1, "id-1", "{}");
        assert_eq!(m["tool_calls"][0]["function"], json!({"name": "f", "arguments": "{}"}));
        assert_eq!(finish, None);
        let (m, finish) = whole(&Choice::Auto, Some(Format::Llama3), 1, "id", "{\"name\": oops}");
        assert_eq!((m["content"].as_str(), finish), (Some("{\"name\": oops}"), None));
    }
}
