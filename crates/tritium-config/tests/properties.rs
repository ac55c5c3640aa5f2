//! Property tests of config.pbtxt reading: the colon pre-pass and the parser never panic, keep
//! the user's text, agree on both spellings of a list of messages, and report errors where the
//! user wrote them.

use std::{collections::BTreeMap, path::Path};

use proptest::prelude::*;
use tritium_config::{
    parse_config,
    proto::{
        model_config::SchedulingChoice, model_instance_group::Kind, model_rate_limiter::Resource, DataType,
        ModelDynamicBatching, ModelInput, ModelInstanceGroup, ModelOutput, ModelParameter, ModelRateLimiter,
    },
    ConfigError, ModelConfig,
};

// The pre-pass is crate-private; compiling its file into this test reaches it without making it
// part of the crate's API. (Its own unit tests run here a second time.)
#[path = "../src/pbtxt_prepass.rs"]
mod pbtxt_prepass;

const CASES: u32 = 512;

fn config() -> ProptestConfig {
    ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------------
// Text that looks like protobuf text format, to get past the tokenizer more often than random
// text does.

fn pbtxt_like() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("input".to_owned()),
        Just("output".to_owned()),
        Just("instance_group".to_owned()),
        Just("name".to_owned()),
        Just("dims".to_owned()),
        Just("parameters".to_owned()),
        Just("key".to_owned()),
        Just("value".to_owned()),
        Just("[ext.x]".to_owned()),
        Just(":".to_owned()),
        Just("-".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("<".to_owned()),
        Just(">".to_owned()),
        Just(",".to_owned()),
        Just(";".to_owned()),
        Just("\"s [ {\"".to_owned()),
        Just("'q\\' ['".to_owned()),
        Just("\"unterminated".to_owned()),
        Just("\"\\".to_owned()),
        Just("# c [ {\n".to_owned()),
        Just("#".to_owned()),
        Just("1.5e-3".to_owned()),
        Just("0x1F".to_owned()),
        Just(".5".to_owned()),
        Just("é".to_owned()),
        Just("\n".to_owned()),
        Just(" ".to_owned()),
        "[a-z_]{1,6}",
        "[0-9]{1,3}",
    ];
    prop::collection::vec((token, prop_oneof![Just(""), Just(" "), Just("\n"), Just("\t")]), 0..40)
        .prop_map(|tokens| tokens.into_iter().map(|(token, space)| token + space).collect())
}

/// Any text: random characters, random bytes read as lossy UTF-8, or text-format-like tokens.
fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(any::<u8>(), 0..200).prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        pbtxt_like(),
    ]
}

/// 1-based line and column (in characters) of a byte offset, computed independently of the crate.
fn position(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset];
    let line = before.chars().filter(|&c| c == '\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

/// Whether a 1-based line and column lie in `text` (a column may be one past its line's end).
fn inside(text: &str, line: usize, column: usize) -> bool {
    let lines: Vec<&str> = text.split('\n').collect();
    line >= 1 && column >= 1 && lines.get(line - 1).is_some_and(|l| column <= l.chars().count() + 1)
}

/// The pre-pass's output with its inserted colons removed.
fn without_insertions(prepared: &pbtxt_prepass::Prepared<'_>, insertions: &[usize]) -> String {
    let mut text = prepared.text().to_owned();
    // Insertion `i` (ascending, user offsets) is at `at + i` of the prepared text.
    for (i, &at) in insertions.iter().enumerate().rev() {
        assert_eq!(text.as_bytes()[at + i], b':', "an inserted byte is a colon");
        text.remove(at + i);
    }
    text
}

/// The user offsets where the pre-pass inserted a colon, recovered through the public offset map.
fn insertions_of(prepared: &pbtxt_prepass::Prepared<'_>) -> Vec<usize> {
    let text = prepared.text();
    let mut insertions = Vec::new();
    // A prepared offset maps to the same user offset as the byte after it exactly when it was
    // inserted.
    for offset in 0..text.len() {
        if is_inserted(prepared, offset) {
            insertions.push(prepared.original_offset(offset));
        }
    }
    insertions
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_never_panics_and_errors_lie_inside_it(text in any_text()) {
        let prepared = pbtxt_prepass::prepare(&text);
        prop_assert!(prepared.original_offset(prepared.text().len()) == text.len());
        match parse_config(&text, Path::new("c")) {
            Err(ConfigError::Parse { line, column, .. }) => {
                prop_assert!(inside(&text, line, column), "{line}:{column} outside {text:?}");
            }
            Ok(_) | Err(ConfigError::Invalid(_)) => {}
            Err(other) => prop_assert!(false, "unexpected error {other:?}"),
        }
    }

    #[test]
    fn prepass_only_inserts_colons(text in any_text()) {
        let prepared = pbtxt_prepass::prepare(&text);
        let insertions = insertions_of(&prepared);
        prop_assert_eq!(prepared.text().len(), text.len() + insertions.len());
        prop_assert_eq!(without_insertions(&prepared, &insertions), text.clone());
        // Every other byte is the user's, found where the map says.
        for (offset, byte) in prepared.text().bytes().enumerate() {
            let mapped = prepared.original_offset(offset);
            if !is_inserted(&prepared, offset) {
                prop_assert_eq!(text.as_bytes()[mapped], byte);
            }
        }
    }

    #[test]
    fn prepass_is_the_identity_without_colon_less_lists(text in any_text()) {
        // Its own output has a colon before every list of messages.
        let once = pbtxt_prepass::prepare(&text);
        let twice = pbtxt_prepass::prepare(once.text());
        prop_assert_eq!(twice.text(), once.text());
        // So has text without a list.
        let no_list: String = text.chars().filter(|&c| c != '[').collect();
        prop_assert_eq!(pbtxt_prepass::prepare(&no_list).text().to_owned(), no_list);
    }

    #[test]
    fn both_spellings_parse_to_the_generated_config(
        (model, layout) in (model_config(), layout()),
    ) {
        let colon = Printer::new(Spelling::Colon, &layout).print(&model);
        let bare = Printer::new(Spelling::ColonLess, &layout).print(&model);
        // The spelling with colons needs no pre-pass.
        prop_assert_eq!(pbtxt_prepass::prepare(&colon.text).text().to_owned(), colon.text.clone());
        for printed in [&colon, &bare] {
            match parse_config(&printed.text, Path::new("c")) {
                Ok(parsed) => prop_assert_eq!(&parsed, &model, "{}", printed.text),
                Err(e) => prop_assert!(false, "{e}\n{}", printed.text),
            }
        }
    }

    #[test]
    fn injected_errors_are_reported_where_injected(
        (model, layout, slot, kind) in (model_config(), layout(), any::<prop::sample::Index>(), 0..2_usize),
    ) {
        for spelling in [Spelling::Colon, Spelling::ColonLess] {
            let mut printer = Printer::new(spelling, &layout);
            printer.inject = Some((slot, if kind == 0 { Injection::UnknownField } else { Injection::UnknownEnum }));
            let printed = printer.print(&model);
            let offset = printed.injected.expect("every config has a slot for a field");
            let expected = position(&printed.text, offset);
            match parse_config(&printed.text, Path::new("c")) {
                Err(ConfigError::Parse { line, column, message, .. }) => {
                    prop_assert_eq!((line, column), expected, "{}\n{}", message, printed.text);
                    prop_assert!(message.contains("bogus_"), "{}", message);
                }
                other => prop_assert!(false, "{other:?}\n{}", printed.text),
            }
        }
    }
}

/// Whether prepared byte `offset` is an inserted colon.
fn is_inserted(prepared: &pbtxt_prepass::Prepared<'_>, offset: usize) -> bool {
    prepared.original_offset(offset) == prepared.original_offset(offset + 1)
}

// ---------------------------------------------------------------------------------------------
// Generated configs.

/// Strings with the characters that trouble a tokenizer: brackets, quotes, escapes, `#`, non-ASCII.
fn text_value() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_ \\[\\]{}<>\"'\\\\#:,é\n\t]{0,12}"
}

fn data_type() -> impl Strategy<Value = i32> {
    (1..=14_i32).prop_map(|t| DataType::try_from(t).map_or(DataType::TypeFp32 as i32, |t| t as i32))
}

fn dims() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(prop_oneof![Just(-1_i64), 1..4096_i64], 0..4)
}

fn model_config() -> impl Strategy<Value = ModelConfig> {
    let input = (text_value(), data_type(), dims()).prop_map(|(name, data_type, dims)| ModelInput {
        name,
        data_type,
        dims,
        ..Default::default()
    });
    let output = (text_value(), data_type(), dims()).prop_map(|(name, data_type, dims)| ModelOutput {
        name,
        data_type,
        dims,
        ..Default::default()
    });
    let kind = prop_oneof![Just(Kind::Auto), Just(Kind::Gpu), Just(Kind::Cpu), Just(Kind::Model)];
    // A rate limiter nests a list of messages in a list of messages.
    let resource =
        (text_value(), any::<bool>(), 0..4_u32).prop_map(|(name, global, count)| Resource { name, global, count });
    let rate_limiter = prop::option::of((prop::collection::vec(resource, 0..3), 0..4_u32))
        .prop_map(|r| r.map(|(resources, priority)| ModelRateLimiter { resources, priority }));
    let group = (text_value(), kind, 0..8_i32, prop::collection::vec(0..8_i32, 0..3), rate_limiter).prop_map(
        |(name, kind, count, gpus, rate_limiter)| ModelInstanceGroup {
            name,
            kind: kind as i32,
            count,
            gpus,
            rate_limiter,
            ..Default::default()
        },
    );
    let batching = prop::option::of((prop::collection::vec(1..64_i32, 0..3), 0..10_000_u64)).prop_map(|b| {
        b.map(|(preferred_batch_size, max_queue_delay_microseconds)| {
            SchedulingChoice::DynamicBatching(ModelDynamicBatching {
                preferred_batch_size,
                max_queue_delay_microseconds,
                ..Default::default()
            })
        })
    });
    let parameters = prop::collection::btree_map(text_value(), text_value(), 0..3);
    (
        text_value(),
        0..64_i32,
        prop::collection::vec(input, 0..3),
        prop::collection::vec(output, 0..3),
        prop::collection::vec(group, 0..3),
        parameters,
        batching,
    )
        .prop_map(|(name, max_batch_size, input, output, instance_group, parameters, scheduling_choice)| {
            ModelConfig {
                name,
                max_batch_size,
                input,
                output,
                instance_group,
                parameters: parameters
                    .into_iter()
                    .map(|(k, v): (String, String)| (k, ModelParameter { string_value: v }))
                    .collect(),
                scheduling_choice,
                ..Default::default()
            }
        })
}

/// How a generated config is laid out: the blanks between its tokens (cycled), and choices that
/// do not change its meaning.
#[derive(Clone, Debug)]
struct Layout {
    blanks: Vec<&'static str>,
    choices: Vec<bool>,
}

fn layout() -> impl Strategy<Value = Layout> {
    let blank = prop_oneof![
        Just(""),
        Just(" "),
        Just("\n"),
        Just("\t  "),
        Just("\r\n"),
        Just(" # input [ { \"x\" 'y\n"),
        Just("\n# é ] }\n  "),
    ];
    (prop::collection::vec(blank, 1..16), prop::collection::vec(any::<bool>(), 1..16))
        .prop_map(|(blanks, choices)| Layout { blanks, choices })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spelling {
    /// `input: [ {..} ]`
    Colon,
    /// `input [ {..} ]`, as Triton's configs write it.
    ColonLess,
}

#[derive(Clone, Copy, Debug)]
enum Injection {
    /// `bogus_field: 1` where a field may start.
    UnknownField,
    /// An enum value replaced by `bogus_value`, reported at the value.
    UnknownEnum,
}

/// A printed config, and where the injected error starts.
struct Printed {
    text: String,
    injected: Option<usize>,
}

/// Prints a `ModelConfig` as tokens, then lays them out with the layout's blanks.
struct Printer<'a> {
    spelling: Spelling,
    layout: &'a Layout,
    tokens: Vec<String>,
    /// Token indices where a field may start (a possible place for an error).
    slots: Vec<usize>,
    /// Token indices of enum values.
    enums: Vec<usize>,
    choice: usize,
    inject: Option<(prop::sample::Index, Injection)>,
}

impl<'a> Printer<'a> {
    fn new(spelling: Spelling, layout: &'a Layout) -> Self {
        Printer { spelling, layout, tokens: Vec::new(), slots: Vec::new(), enums: Vec::new(), choice: 0, inject: None }
    }

    fn choose(&mut self) -> bool {
        let choice = self.layout.choices[self.choice % self.layout.choices.len()];
        self.choice += 1;
        choice
    }

    fn token(&mut self, token: impl Into<String>) {
        self.tokens.push(token.into());
    }

    fn slot(&mut self) {
        self.slots.push(self.tokens.len());
    }

    fn string(&mut self, value: &str) {
        let quote = if self.choose() { '"' } else { '\'' };
        let mut token = String::from(quote);
        for c in value.chars() {
            match c {
                '\\' => token.push_str("\\\\"),
                '\n' => token.push_str("\\n"),
                '\t' => token.push_str("\\t"),
                '"' | '\'' if c == quote => {
                    token.push('\\');
                    token.push(c);
                }
                _ => token.push(c),
            }
        }
        token.push(quote);
        self.tokens.push(token);
    }

    fn scalar(&mut self, field: &str, value: impl ToString) {
        self.slot();
        self.token(field);
        self.token(":");
        self.token(value.to_string());
        self.separator();
    }

    /// Sometimes `,` or `;` after a field, as the text format allows.
    fn separator(&mut self) {
        if self.choose() {
            let separator = if self.choose() { "," } else { ";" };
            self.token(separator);
        }
    }

    fn enum_field(&mut self, field: &str, value: &str) {
        self.slot();
        self.token(field);
        self.token(":");
        self.enums.push(self.tokens.len());
        self.token(value);
        self.separator();
    }

    fn string_field(&mut self, field: &str, value: &str) {
        self.slot();
        self.token(field);
        self.token(":");
        self.string(value);
        self.separator();
    }

    fn scalar_list<T: ToString>(&mut self, field: &str, values: &[T]) {
        self.slot();
        self.token(field);
        self.token(":");
        self.token("[");
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                self.token(",");
            }
            self.token(value.to_string());
        }
        self.token("]");
        self.separator();
    }

    /// `field { ... }` or `field: { ... }`.
    fn message(&mut self, field: &str, body: impl FnOnce(&mut Self)) {
        self.slot();
        self.token(field);
        if self.choose() {
            self.token(":");
        }
        self.braces(body);
    }

    /// `{ ... }` or `< ... >`.
    fn braces(&mut self, body: impl FnOnce(&mut Self)) {
        let (open, close) = if self.choose() { ("{", "}") } else { ("<", ">") };
        self.token(open);
        body(self);
        self.slot();
        self.token(close);
    }

    /// `field: [ {..}, {..} ]` or `field [ {..}, {..} ]`; an empty list is sometimes left out.
    fn message_list<T>(&mut self, field: &str, items: &[T], mut item: impl FnMut(&mut Self, &T)) {
        if items.is_empty() && self.choose() {
            return;
        }
        self.slot();
        self.token(field);
        if self.spelling == Spelling::Colon {
            self.token(":");
        }
        self.token("[");
        for (i, value) in items.iter().enumerate() {
            if i > 0 {
                self.token(",");
            }
            self.braces(|p| item(p, value));
        }
        self.token("]");
    }

    fn print(mut self, model: &ModelConfig) -> Printed {
        self.string_field("name", &model.name);
        self.scalar("max_batch_size", model.max_batch_size);
        self.message_list("input", &model.input, |p, input| {
            p.string_field("name", &input.name);
            p.enum_field("data_type", input.data_type().as_str_name());
            p.scalar_list("dims", &input.dims);
        });
        self.message_list("output", &model.output, |p, output| {
            p.string_field("name", &output.name);
            p.enum_field("data_type", output.data_type().as_str_name());
            p.scalar_list("dims", &output.dims);
        });
        self.message_list("instance_group", &model.instance_group, |p, group| {
            p.string_field("name", &group.name);
            p.enum_field("kind", group.kind().as_str_name());
            p.scalar("count", group.count);
            p.scalar_list("gpus", &group.gpus);
            if let Some(limiter) = &group.rate_limiter {
                p.message("rate_limiter", |p| {
                    p.message_list("resources", &limiter.resources, |p, resource| {
                        p.string_field("name", &resource.name);
                        p.scalar("global", resource.global);
                        p.scalar("count", resource.count);
                    });
                    p.scalar("priority", limiter.priority);
                });
            }
        });
        let parameters: BTreeMap<&String, &ModelParameter> = model.parameters.iter().collect();
        let parameters: Vec<(&String, &ModelParameter)> = parameters.into_iter().collect();
        // A map is a list of entries too: half the time one entry per field.
        if self.choose() {
            self.message_list("parameters", &parameters, |p, (key, value)| {
                p.string_field("key", key);
                p.message("value", |p| p.string_field("string_value", &value.string_value));
            });
        } else {
            for (key, value) in &parameters {
                self.message("parameters", |p| {
                    p.string_field("key", key);
                    p.message("value", |p| p.string_field("string_value", &value.string_value));
                });
            }
        }
        if let Some(SchedulingChoice::DynamicBatching(batching)) = &model.scheduling_choice {
            self.message("dynamic_batching", |p| {
                p.scalar_list("preferred_batch_size", &batching.preferred_batch_size);
                p.scalar("max_queue_delay_microseconds", batching.max_queue_delay_microseconds);
            });
        }
        self.slot();
        self.layout()
    }

    /// Joins the tokens with the layout's blanks, injecting the error if asked.
    fn layout(mut self) -> Printed {
        let mut injected_at = None;
        match self.inject {
            Some((index, Injection::UnknownEnum)) if !self.enums.is_empty() => {
                let at = self.enums[index.index(self.enums.len())];
                self.tokens[at] = "bogus_value".to_owned();
                injected_at = Some(at);
            }
            Some((index, _)) => {
                let at = self.slots[index.index(self.slots.len())];
                for (i, token) in ["bogus_field", ":", "1"].into_iter().enumerate() {
                    self.tokens.insert(at + i, token.to_owned());
                }
                injected_at = Some(at);
            }
            None => {}
        }
        let mut text = String::new();
        let mut injected = None;
        for (i, token) in self.tokens.iter().enumerate() {
            if i > 0 {
                let blank = self.layout.blanks[i % self.layout.blanks.len()];
                let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || "_-.\"'".contains(c));
                if blank.is_empty() && word(text.chars().next_back()) && word(token.chars().next()) {
                    text.push(' ');
                } else {
                    text.push_str(blank);
                }
            }
            if injected_at == Some(i) {
                injected = Some(text.len());
            }
            text.push_str(token);
        }
        Printed { text, injected }
    }
}
