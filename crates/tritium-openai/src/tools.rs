//! Tool calls: the request's `tools` and `tool_choice`, and the parsers that turn a model's text
//! into `tool_calls` as Triton's OpenAI frontend does with `--tool-call-parser llama3|mistral`.
//!
//! A llama3 answer is `<|python_tag|>` (optional) and JSON objects `{"name": ..., "arguments":
//! {...}}` (or `"parameters"`) separated by `;`; a mistral answer is `[TOOL_CALLS]` (optional) and
//! a JSON list of such objects. Any other answer is plain content.
//!
//! Unlike Triton's frontend, which re-parses the whole accumulated text on every chunk, the
//! [`Parser`] reads each byte once: it scans the structure as it arrives, sends a call's name as
//! soon as the name string is complete and streams the raw text of its arguments as it comes, and
//! checks each call object with a real JSON parse when the object closes. The whole answer
//! ([`parse_whole`]) runs the same parser, so streamed and whole results agree. Text that turns
//! out not to be valid tool-call JSON is returned as plain content, never an error.

use serde_json::Value;

use crate::error::ApiError;

/// `--max-tool-call-parse-bytes`' default, as Triton's (128 KiB).
pub const DEFAULT_MAX_PARSE_BYTES: usize = 128 * 1024;

/// Which parser `--tool-call-parser` picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Llama 3's JSON tool calls (`<|python_tag|>`).
    Llama3,
    /// Mistral's `[TOOL_CALLS]` list.
    Mistral,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "llama3" => Ok(Format::Llama3),
            "mistral" => Ok(Format::Mistral),
            other => Err(format!("unknown tool-call parser {other:?}: choose llama3 or mistral")),
        }
    }
}

impl Format {
    fn marker(self) -> &'static str {
        match self {
            Format::Llama3 => "<|python_tag|>",
            Format::Mistral => "[TOOL_CALLS]",
        }
    }

    fn opening(self) -> char {
        match self {
            Format::Llama3 => '{',
            Format::Mistral => '[',
        }
    }

    /// A call id: Triton's llama3 parser uses `cmpl-<uuid>`, its mistral one nine alphanumerics.
    fn call_id(self, seed: u64, index: usize) -> String {
        let mut x = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        match self {
            Format::Llama3 => format!("cmpl-{x:016x}{index:x}"),
            Format::Mistral => {
                const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
                (0..9)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        char::from(ALNUM[(x % ALNUM.len() as u64) as usize])
                    })
                    .collect()
            }
        }
    }
}

/// What the request asks for with `tools` and `tool_choice`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolRequest {
    /// `tools`, as sent (each `{"type": "function", "function": {...}}`), for the chat template.
    pub tools: Option<Vec<Value>>,
    /// How the answer is read.
    pub choice: Choice,
}

/// `tool_choice`, resolved.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Choice {
    /// No tools, or `"none"`: the answer is content.
    #[default]
    None,
    /// `"auto"` (the default with tools): the parser decides.
    Auto,
    /// A named function (or `"required"`: the first tool, as Triton does): the whole answer is
    /// that function's arguments.
    Named {
        /// The function's name.
        name: String,
        /// Its `parameters` JSON schema, for guided decoding.
        schema: Option<Value>,
    },
}

fn tool_name(i: usize, tool: &Value) -> Result<&str, ApiError> {
    let param = format!("tools[{i}]");
    if tool.get("type").and_then(Value::as_str).is_some_and(|t| t != "function") {
        return Err(ApiError::invalid(Some(&param), "only tools of type \"function\" are supported"));
    }
    tool.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(Some(&param), "each tool needs {\"type\": \"function\", \"function\": {\"name\": ...}}")
    })
}

/// Reads `tools` and `tool_choice` (`parser` is `--tool-call-parser`, when given).
pub fn parse_request(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    parser: Option<Format>,
) -> Result<ToolRequest, ApiError> {
    let tools = match tools {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(list.clone()),
        Some(_) => return Err(ApiError::invalid(Some("tools"), "'tools' must be a list of function tools")),
    };
    let names: Vec<&str> = match &tools {
        Some(list) => list.iter().enumerate().map(|(i, t)| tool_name(i, t)).collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let has_tools = !names.is_empty();
    let named = |name: &str| -> Result<Choice, ApiError> {
        let Some(i) = names.iter().position(|n| *n == name) else {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                format!("Tool '{name}' has not been passed in `tools`."),
            ));
        };
        let schema = tools.as_ref().and_then(|t| t[i].get("function")).and_then(|f| f.get("parameters")).cloned();
        Ok(Choice::Named { name: name.to_owned(), schema })
    };
    let no_parser = |what: &str| {
        ApiError::invalid(
            Some("tool_choice"),
            format!("{what} requires the server to be started with --tool-call-parser (llama3 or mistral)"),
        )
    };
    let choice = match tool_choice {
        None | Some(Value::Null) => match (has_tools, parser) {
            (false, _) => Choice::None,
            (true, Some(_)) => Choice::Auto,
            (true, None) => return Err(no_parser("having tools in the request")),
        },
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" if parser.is_none() => return Err(no_parser("\"auto\" tool choice")),
            "auto" if has_tools => Choice::Auto,
            "auto" => Choice::None,
            "required" if has_tools => named(names[0])?,
            "required" => {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    "\"required\" tool choice requires 'tools' to be provided",
                ))
            }
            other => {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    format!("unknown tool_choice {other:?}: use none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                ))
            }
        },
        Some(v) => {
            let Some(name) = v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) else {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            };
            if !has_tools {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    "Named tool choice requires 'tools' to be provided",
                ));
            }
            named(name)?
        }
    };
    Ok(ToolRequest { tools, choice })
}

/// What the parser makes of the text it is fed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Plain content.
    Content(String),
    /// A tool call begins: its index, id and function name.
    Start {
        /// Its index among the answer's calls.
        index: usize,
        /// Its id.
        id: String,
        /// The function's name.
        name: String,
    },
    /// More text of the call's `arguments` (JSON text).
    Args {
        /// The call's index.
        index: usize,
        /// The text.
        text: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the first non-blank text: is it a tool call?
    Detect,
    /// Between call objects (after the marker or the opening `[`).
    Between,
    /// Inside a call object.
    Object,
    /// After a mistral list closed: only blanks may follow.
    Closed,
    /// The text is content (never a tool call, or the tool-call JSON broke).
    Content,
}

/// The incremental tool-call parser for one answer.
#[derive(Debug)]
pub struct Parser {
    format: Format,
    seed: u64,
    phase: Phase,
    /// Everything fed while no call has been sent, given back as content if the JSON breaks.
    held: String,
    /// Bytes fed while reading tool calls (`--max-tool-call-parse-bytes` bounds them).
    tool_bytes: usize,
    /// Mistral: the opening `[` was read.
    list_open: bool,
    /// Mistral: a `,` was read after the last object.
    comma: bool,
    calls: usize,
    completed: usize,
    obj: ObjectScan,
    events: Vec<Event>,
}

/// The scan of one call object.
#[derive(Debug, Default)]
struct ObjectScan {
    text: String,
    depth: usize,
    in_str: bool,
    esc: bool,
    /// At depth 1: the key string being read, or the last key read (waiting for its `:`).
    key: Option<String>,
    reading_key: bool,
    /// The key whose value is being read at depth 1.
    value_of: Option<String>,
    value_started: bool,
    /// The raw text of the `name` string value.
    name_raw: Option<String>,
    name_done: bool,
    started: bool,
    in_args: bool,
    args_seen: bool,
    /// Arguments text read before the name was known.
    args_pending: String,
    /// Blanks inside the arguments, sent only when more arguments text follows them.
    blanks: String,
}

impl Parser {
    /// A parser for `format`; `seed` varies the call ids.
    pub fn new(format: Format, seed: u64) -> Self {
        Self {
            format,
            seed,
            phase: Phase::Detect,
            held: String::new(),
            tool_bytes: 0,
            list_open: false,
            comma: false,
            calls: 0,
            completed: 0,
            obj: ObjectScan::default(),
            events: Vec::new(),
        }
    }

    /// Bytes this parser has read as (possible) tool calls: what `--max-tool-call-parse-bytes`
    /// bounds. Content passes through and is not counted.
    pub fn tool_bytes(&self) -> usize {
        self.tool_bytes
    }

    /// Whether the parser reads plain content (no tool call, or the tool-call JSON broke).
    pub fn is_content(&self) -> bool {
        self.phase == Phase::Content
    }

    /// The number of calls whose JSON object was read whole and checked.
    pub fn completed_calls(&self) -> usize {
        self.completed
    }

    /// Feeds the next text; returns the events it completes.
    pub fn feed(&mut self, text: &str) -> Vec<Event> {
        if self.phase == Phase::Content {
            if !text.is_empty() {
                self.push(Event::Content(text.to_owned()));
            }
            return std::mem::take(&mut self.events);
        }
        self.tool_bytes = self.tool_bytes.saturating_add(text.len());
        if self.calls == 0 {
            self.held.push_str(text);
        }
        let mut rest = text;
        while !rest.is_empty() {
            if self.phase == Phase::Content {
                if self.calls > 0 {
                    self.push(Event::Content(rest.to_owned()));
                }
                break;
            }
            if self.phase == Phase::Detect {
                rest = self.detect(rest);
                continue;
            }
            let Some(c) = rest.chars().next() else { break };
            rest = &rest[c.len_utf8()..];
            match self.phase {
                Phase::Between => self.between(c),
                Phase::Object => self.object(c),
                Phase::Closed if !c.is_whitespace() => self.fail_at(c),
                _ => {}
            }
        }
        std::mem::take(&mut self.events)
    }

    /// Ends the answer; returns the last events. An unfinished call is broken JSON.
    pub fn finish(&mut self) -> Vec<Event> {
        let unfinished = match self.phase {
            Phase::Content | Phase::Closed => false,
            Phase::Detect | Phase::Object => true,
            Phase::Between => self.format == Format::Mistral || self.completed == 0,
        };
        if unfinished || self.calls == 0 {
            self.fail();
        }
        std::mem::take(&mut self.events)
    }

    fn push(&mut self, e: Event) {
        match (self.events.last_mut(), &e) {
            (Some(Event::Content(a)), Event::Content(b)) => a.push_str(b),
            (Some(Event::Args { index: i, text: a }), Event::Args { index: j, text: b }) if i == j => a.push_str(b),
            _ => self.events.push(e),
        }
    }

    /// The JSON broke: what no call has claimed is content from here on.
    fn fail(&mut self) {
        if self.phase == Phase::Content {
            return;
        }
        self.phase = Phase::Content;
        if self.calls == 0 {
            let held = std::mem::take(&mut self.held);
            if !held.is_empty() {
                self.push(Event::Content(held));
            }
        } else {
            let text = std::mem::take(&mut self.obj.text);
            if !text.is_empty() {
                self.push(Event::Content(text));
            }
        }
    }

    /// Reads blanks and the marker or opening character; returns the text left.
    fn detect<'a>(&mut self, text: &'a str) -> &'a str {
        let trimmed = text.trim_start();
        if trimmed.is_empty() {
            return "";
        }
        // `held` ends with `text`: what it holds after its leading blanks was seen so far.
        let seen = self.held.trim_start().to_owned();
        let before = seen.len() - trimmed.len();
        let marker = self.format.marker();
        if seen.starts_with(marker) {
            self.phase = Phase::Between;
            return &trimmed[marker.len() - before..];
        }
        if marker.starts_with(seen.as_str()) {
            return "";
        }
        if seen.starts_with(self.format.opening()) {
            self.phase = Phase::Between;
            for c in seen[..before].chars() {
                self.between(c);
            }
            return trimmed;
        }
        self.fail();
        ""
    }

    fn between(&mut self, c: char) {
        if c.is_whitespace() {
            return;
        }
        match (self.format, c) {
            (Format::Mistral, '[') if !self.list_open => self.list_open = true,
            (Format::Mistral, '{') if self.list_open && (self.completed == 0 || self.comma) => self.open(),
            (Format::Mistral, ',') if self.completed > 0 && !self.comma => self.comma = true,
            (Format::Mistral, ']') if self.list_open && !self.comma => self.phase = Phase::Closed,
            (Format::Llama3, '{') => self.open(),
            (Format::Llama3, ';') if self.completed > 0 && !self.comma => self.comma = true,
            _ => self.fail_at(c),
        }
    }

    /// The JSON broke at `c`, which is not part of any object.
    fn fail_at(&mut self, c: char) {
        self.fail();
        if self.calls > 0 {
            self.push(Event::Content(c.to_string()));
        }
    }

    fn open(&mut self) {
        self.comma = false;
        self.obj = ObjectScan { text: "{".into(), depth: 1, ..ObjectScan::default() };
        self.phase = Phase::Object;
    }

    fn object(&mut self, c: char) {
        self.obj.text.push(c);
        let o = &mut self.obj;
        let mut emit: Option<String> = None;
        if o.in_str {
            if o.esc {
                o.esc = false;
            } else if c == '\\' {
                o.esc = true;
            } else if c == '"' {
                o.in_str = false;
            }
            if o.reading_key {
                if o.in_str {
                    if let Some(k) = o.key.as_mut() {
                        k.push(c);
                    }
                } else {
                    o.reading_key = false;
                }
            } else if o.depth == 1 && o.value_of.as_deref() == Some("name") && !o.name_done {
                if o.in_str {
                    if let Some(n) = o.name_raw.as_mut() {
                        n.push(c);
                    }
                } else {
                    o.name_done = true;
                    o.value_of = None;
                }
            }
            if o.in_args {
                emit = Some(c.to_string());
            }
        } else {
            let at_top = o.depth == 1;
            let is_args = matches!(o.value_of.as_deref(), Some("arguments" | "parameters"));
            if at_top && is_args && !o.value_started && !o.in_args && !c.is_whitespace() {
                o.in_args = true;
            }
            if o.in_args && at_top && (c == ',' || c == '}') {
                o.in_args = false;
                o.blanks.clear();
            }
            if o.in_args {
                if c.is_whitespace() {
                    o.blanks.push(c);
                } else {
                    let mut s = std::mem::take(&mut o.blanks);
                    s.push(c);
                    emit = Some(s);
                }
            }
            match c {
                '"' => {
                    if at_top && o.value_of.is_none() && o.key.is_none() {
                        o.reading_key = true;
                        o.key = Some(String::new());
                    } else if at_top && o.value_of.as_deref() == Some("name") && !o.value_started {
                        o.name_raw = Some(String::new());
                    }
                    if at_top && o.value_of.is_some() {
                        o.value_started = true;
                    }
                    o.in_str = true;
                }
                ':' if at_top && o.key.is_some() && o.value_of.is_none() && !o.reading_key => {
                    let key = o.key.take().unwrap_or_default();
                    o.value_started = false;
                    if key == "arguments" || key == "parameters" {
                        if o.args_seen {
                            self.fail();
                            return;
                        }
                        o.args_seen = true;
                    }
                    o.value_of = Some(key);
                }
                '{' | '[' => {
                    if at_top && o.value_of.is_some() {
                        o.value_started = true;
                    }
                    o.depth += 1;
                }
                '}' | ']' => {
                    o.depth = o.depth.saturating_sub(1);
                    if o.depth == 0 {
                        self.close();
                        return;
                    }
                }
                ',' if at_top => {
                    o.value_of = None;
                    o.key = None;
                }
                _ if !c.is_whitespace() && at_top && o.value_of.is_some() => o.value_started = true,
                _ => {}
            }
        }
        if let Some(s) = emit {
            self.args(s);
        }
        if self.obj.name_done && !self.obj.started {
            self.start();
        }
    }

    fn start(&mut self) {
        let raw = self.obj.name_raw.clone().unwrap_or_default();
        let Ok(name) = serde_json::from_str::<String>(&format!("\"{raw}\"")) else {
            self.fail();
            return;
        };
        let index = self.calls;
        self.calls += 1;
        self.obj.started = true;
        self.held.clear();
        let id = self.format.call_id(self.seed, index);
        self.push(Event::Start { index, id, name });
        let pending = std::mem::take(&mut self.obj.args_pending);
        if !pending.is_empty() {
            self.push(Event::Args { index, text: pending });
        }
    }

    fn args(&mut self, s: String) {
        if self.obj.started {
            let index = self.calls - 1;
            self.push(Event::Args { index, text: s });
        } else {
            self.obj.args_pending.push_str(&s);
        }
    }

    /// The call object closed: check it is valid JSON with a name and arguments.
    fn close(&mut self) {
        let ok = serde_json::from_str::<Value>(&self.obj.text).ok().is_some_and(|v| {
            v.get("name").is_some_and(Value::is_string)
                && (v.get("arguments").is_some() != v.get("parameters").is_some())
        });
        if !ok || !self.obj.name_done {
            self.fail();
            return;
        }
        if !self.obj.started {
            self.start();
        }
        self.completed += 1;
        self.phase = Phase::Between;
        self.obj = ObjectScan::default();
    }
}

/// A parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Its id.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// Folds events into content and calls.
pub fn merge(events: impl IntoIterator<Item = Event>) -> (String, Vec<Call>) {
    let mut content = String::new();
    let mut calls: Vec<Call> = Vec::new();
    for e in events {
        match e {
            Event::Content(s) => content.push_str(&s),
            Event::Start { id, name, .. } => calls.push(Call { id, name, arguments: String::new() }),
            Event::Args { index, text } => {
                if let Some(c) = calls.get_mut(index) {
                    c.arguments.push_str(&text);
                }
            }
        }
    }
    (content, calls)
}

/// Parses a whole answer: its tool calls, or `None` when it holds none or its tool-call JSON is
/// broken (the answer is then plain content).
pub fn parse_whole(format: Format, seed: u64, text: &str) -> Option<Vec<Call>> {
    let mut p = Parser::new(format, seed);
    let mut events = p.feed(text);
    events.extend(p.finish());
    let (content, calls) = merge(events);
    (!p.is_content() && content.is_empty() && !calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn whole(format: Format, text: &str) -> Option<Vec<(String, Value)>> {
        parse_whole(format, 1, text).map(|calls| {
            calls
                .into_iter()
                .map(|c| (c.name, serde_json::from_str(&c.arguments).expect("arguments are JSON")))
                .collect()
        })
    }

    /// Feeds `text` in pieces cut at `cuts` (char boundaries) and merges the events.
    fn streamed(format: Format, text: &str, cuts: &[usize]) -> (String, Vec<Call>) {
        let mut p = Parser::new(format, 1);
        let mut events = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain([text.len()].iter()) {
            events.extend(p.feed(&text[at..cut]));
            at = cut;
        }
        events.extend(p.finish());
        merge(events)
    }

    const LLAMA: &[&str] = &[
        r#"{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}"#,
        r#"<|python_tag|>{"name": "a", "parameters": {"x": "{}\"é"}}; {"name": "b", "arguments": {}}"#,
        "  {\"arguments\" : { \"k\" : 1 } , \"name\":\"late\"}  ",
        r#"{"name": "s", "arguments": "just a string"}"#,
        "Hello, no tools here.",
        r#"{"name": get_weather}"#,
        r#"{"name": "cut", "arguments": {"city": "Par"#,
        r#"{"name": "x", "arguments": {}} trailing"#,
        "<|python",
        "{\"name\": \"n\\u0041\", \"arguments\": {\"a\":\n  1\n}\n}",
    ];

    const MISTRAL: &[&str] = &[
        r#"[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "t", "arguments": {"u": null}}]"#,
        r#"[{"name": "x", "arguments": {"a": [1, {"b": "]"}]}}]"#,
        "[1, 2, 3]",
        r#"[TOOL_CALLS][{"name": "x", "arguments": {}}"#,
        "plain [TOOL_CALLS] text",
        "[TOOL_CALL",
    ];

    #[test]
    fn whole_answers_parse_like_triton() {
        assert_eq!(
            whole(Format::Llama3, LLAMA[0]),
            Some(vec![("get_weather".into(), json!({"city": "Paris", "days": [1, 2]}))])
        );
        assert_eq!(
            whole(Format::Llama3, LLAMA[1]),
            Some(vec![("a".into(), json!({"x": "{}\"é"})), ("b".into(), json!({}))])
        );
        assert_eq!(whole(Format::Llama3, LLAMA[2]), Some(vec![("late".into(), json!({"k": 1}))]));
        assert_eq!(whole(Format::Llama3, LLAMA[3]), Some(vec![("s".into(), json!("just a string"))]));
        assert_eq!(whole(Format::Llama3, LLAMA[9]), Some(vec![("nA".into(), json!({"a": 1}))]));
        for broken in [LLAMA[4], LLAMA[5], LLAMA[6], LLAMA[7], LLAMA[8]] {
            assert_eq!(whole(Format::Llama3, broken), None, "{broken}");
        }
        assert_eq!(
            whole(Format::Mistral, MISTRAL[0]),
            Some(vec![("get_weather".into(), json!({"city": "Paris"})), ("t".into(), json!({"u": null}))])
        );
        assert_eq!(whole(Format::Mistral, MISTRAL[1]), Some(vec![("x".into(), json!({"a": [1, {"b": "]"}]}))]));
        for broken in &MISTRAL[2..] {
            assert_eq!(whole(Format::Mistral, broken), None, "{broken}");
        }
    }

    #[test]
    fn raw_arguments_are_kept_as_written() {
        let calls = parse_whole(Format::Llama3, 1, LLAMA[2]).expect("calls");
        assert_eq!(calls[0].arguments, "{ \"k\" : 1 }");
    }

    /// Every way of cutting the text in two or three pieces, and one char at a time, gives the
    /// same content and calls as one piece; and for valid answers, the whole parse's calls.
    #[test]
    fn streaming_at_every_split_equals_one_piece() {
        for (format, cases) in [(Format::Llama3, LLAMA), (Format::Mistral, MISTRAL)] {
            for text in cases {
                let one = streamed(format, text, &[]);
                let bounds: Vec<usize> = (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
                for &i in &bounds {
                    assert_eq!(streamed(format, text, &[i]), one, "{text:?} cut at {i}");
                    for &j in bounds.iter().filter(|&&j| j > i).step_by(3) {
                        assert_eq!(streamed(format, text, &[i, j]), one, "{text:?} cut at {i}, {j}");
                    }
                }
                assert_eq!(streamed(format, text, &bounds), one, "{text:?} char by char");
                if let Some(calls) = parse_whole(format, 1, text) {
                    assert_eq!(one, (String::new(), calls), "{text:?}");
                } else if one.1.is_empty() {
                    assert_eq!(one.0, *text, "not a tool call: all content");
                }
            }
        }
    }

    #[test]
    fn the_name_is_sent_before_the_arguments_end() {
        let mut p = Parser::new(Format::Llama3, 1);
        let e = p.feed(r#"{"name": "get_weather", "arguments": {"ci"#);
        assert!(matches!(&e[0], Event::Start { index: 0, name, .. } if name == "get_weather"), "{e:?}");
        assert_eq!(e[1], Event::Args { index: 0, text: "{\"ci".into() });
        assert_eq!(p.feed("ty\": 1}}"), vec![Event::Args { index: 0, text: "ty\": 1}".into() }]);
        assert!(p.finish().is_empty());
        assert_eq!(p.completed_calls(), 1);
    }

    #[test]
    fn content_passes_through_uncounted() {
        let mut p = Parser::new(Format::Mistral, 1);
        assert_eq!(p.feed("Sure"), vec![Event::Content("Sure".into())]);
        assert_eq!(p.feed(" thing"), vec![Event::Content(" thing".into())]);
        assert!(p.is_content());
        assert_eq!(p.tool_bytes(), 4);
    }

    #[test]
    fn mistral_ids_are_nine_alphanumerics() {
        let id = Format::Mistral.call_id(42, 0);
        assert_eq!(id.len(), 9);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(id, Format::Mistral.call_id(42, 1));
    }

    #[test]
    fn tool_choice_is_resolved() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let r = parse_request(Some(&tools), None, Some(Format::Llama3)).expect("auto");
        assert_eq!(r.choice, Choice::Auto);
        let e = parse_request(Some(&tools), None, None).expect_err("no parser");
        assert!(e.message.contains("--tool-call-parser"), "{}", e.message);
        let r = parse_request(Some(&tools), Some(&json!("none")), None).expect("none");
        assert_eq!(r.choice, Choice::None);
        assert!(r.tools.is_some(), "tools still reach the template");
        let named = json!({"type": "function", "function": {"name": "f"}});
        let r = parse_request(Some(&tools), Some(&named), None).expect("named");
        assert_eq!(r.choice, Choice::Named { name: "f".into(), schema: Some(json!({"type": "object"})) });
        let r = parse_request(Some(&tools), Some(&json!("required")), None).expect("required");
        assert!(matches!(r.choice, Choice::Named { ref name, .. } if name == "f"));
        let e = parse_request(Some(&tools), Some(&json!({"type": "function", "function": {"name": "g"}})), None)
            .expect_err("unknown");
        assert!(e.message.contains("'g'"), "{}", e.message);
        let e = parse_request(None, Some(&json!("required")), None).expect_err("no tools");
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = parse_request(Some(&json!([{"type": "function"}])), None, None).expect_err("bad tool");
        assert_eq!(e.param.as_deref(), Some("tools[0]"));
    }
}
