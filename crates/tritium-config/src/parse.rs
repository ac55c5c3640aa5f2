//! Reading `config.pbtxt` (protobuf text format) into `ModelConfig` through prost-reflect.

use std::{
    io,
    path::{Path, PathBuf},
};

use miette::Diagnostic;
use prost_reflect::{text_format::ParseError, DynamicMessage};

use crate::{
    model_config_descriptor,
    pbtxt_prepass::{self, Prepared},
    proto::ModelConfig,
    ConfigError,
};

/// The name of a model's configuration file inside its directory.
pub const CONFIG_FILE: &str = "config.pbtxt";

/// Reads `<model_dir>/config.pbtxt`; `Ok(None)` when the model has none (the server then
/// asks the model's `auto_complete_config` for one).
pub fn load_config(model_dir: &Path) -> Result<Option<ModelConfig>, ConfigError> {
    load_config_named(model_dir, None)
}

/// The file a model's config is read from: with a config name (`--model-config-name`),
/// `<model_dir>/configs/<name>.pbtxt` when it exists, else `<model_dir>/config.pbtxt`, as
/// Triton chooses.
pub fn config_path(model_dir: &Path, name: Option<&str>) -> std::path::PathBuf {
    if let Some(name) = name.filter(|n| !n.is_empty()) {
        let custom = model_dir.join("configs").join(format!("{name}.pbtxt"));
        if custom.is_file() {
            return custom;
        }
    }
    model_dir.join(CONFIG_FILE)
}

/// [`load_config`] with a config name: the file [`config_path`] picks.
pub fn load_config_named(model_dir: &Path, name: Option<&str>) -> Result<Option<ModelConfig>, ConfigError> {
    let path = config_path(model_dir, name);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_config(&text, &path).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigError::Io { path, source }),
    }
}

/// Parses the text of a config.pbtxt; `file` only names it in errors.
pub fn parse_config(text: &str, file: &Path) -> Result<ModelConfig, ConfigError> {
    // prost-reflect needs a colon before a list of messages (`input: [ {...} ]`); Triton's
    // configs leave it out.
    let prepared = pbtxt_prepass::prepare(text);
    let message = DynamicMessage::parse_text_format(model_config_descriptor(), prepared.text()).map_err(|e| {
        // A guide's `model_metrics { enable ... counters [...] }` may fail earlier than at its
        // unknown field (`counters [ "a" ]` lacks the colon a scalar list needs): name it anyway.
        match guide_model_metrics(text) {
            Some((field, offset)) => {
                let (line, column) = line_column(text, offset);
                let message = model_metrics_hint(&format!("{UNKNOWN_FIELD}{field}{OF_MODEL_METRICS}"))
                    .unwrap_or_else(|| e.to_string());
                ConfigError::Parse { path: PathBuf::from(file), line, column, message }
            }
            None => parse_error(&e, &prepared, text, file),
        }
    })?;
    message.transcode_to::<ModelConfig>().map_err(|e| ConfigError::Invalid(format!("{}: {e}", file.display())))
}

fn parse_error(error: &ParseError, prepared: &Prepared<'_>, text: &str, file: &Path) -> ConfigError {
    // The parser reports where through its miette labels, as offsets into the prepared text;
    // errors without one (end of input) are at the end of the text.
    let offset = error
        .labels()
        .and_then(|mut labels| labels.next())
        .map_or(text.len(), |label| prepared.original_offset(label.offset()));
    let (line, column) = line_column(text, offset);
    let message = error.to_string();
    let message = model_metrics_hint(&message).unwrap_or(message);
    ConfigError::Parse { path: PathBuf::from(file), line, column, message }
}

/// The first field of a `model_metrics { ... }` block that Triton's `ModelMetrics` does not have
/// (anything but `metric_control`), and its byte offset. Strings and `#` comments are skipped.
fn guide_model_metrics(text: &str) -> Option<(String, usize)> {
    let bytes = text.as_bytes();
    let ident = |i: usize| {
        let end =
            bytes[i..].iter().position(|b| !(b.is_ascii_alphanumeric() || *b == b'_')).map_or(text.len(), |n| i + n);
        &text[i..end]
    };
    let (mut i, mut depth, mut inside) = (0usize, 0usize, None::<usize>);
    while i < bytes.len() {
        match bytes[i] {
            b'#' => i = bytes[i..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| i + n),
            q @ (b'"' | b'\'') => {
                i += 1;
                while i < bytes.len() && bytes[i] != q {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'<' => depth += 1,
            b'}' | b'>' => {
                depth = depth.saturating_sub(1);
                if inside.is_some_and(|d| depth < d) {
                    inside = None;
                }
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                let word = ident(i);
                let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
                if starts_word {
                    if inside == Some(depth) && word != "metric_control" {
                        return Some((word.to_string(), i));
                    }
                    if inside.is_none() && depth == 0 && word == "model_metrics" {
                        inside = Some(1);
                    }
                }
                i += word.len();
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The prefix of prost-reflect's error for an unknown field of `model_metrics`.
const UNKNOWN_FIELD: &str = "field '";
const OF_MODEL_METRICS: &str = "' not found for message 'inference.ModelMetrics'";

/// A `model_metrics { enable: true counters [...] gauges [...] }` block, which guides show but
/// Triton has never accepted (its `model_metrics` only holds `metric_control`, the histogram
/// buckets of Triton's own metrics): the error names the field and the two ways model code
/// exports metrics, which need no configuration.
fn model_metrics_hint(message: &str) -> Option<String> {
    let field = message.strip_prefix(UNKNOWN_FIELD)?.strip_suffix(OF_MODEL_METRICS)?;
    Some(format!(
        "field '{field}' not found for message 'inference.ModelMetrics': `model_metrics {{ enable: ... counters [...] \
         gauges [...] }}` is not part of Triton's model configuration (its `model_metrics` holds only \
         `metric_control`, the histogram buckets of Triton's own metrics). Metrics from model code need no \
         configuration: create them in model.py with pb_utils.MetricFamily (Triton's custom metrics API), or \
         register them with prometheus_client (tritium gathers its default registry at each scrape); both \
         appear on /metrics. Remove the model_metrics block."
    ))
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    (line, before[line_start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::{guide_model_metrics, line_column};

    #[test]
    fn guide_model_metrics_finds_the_first_foreign_field_only_in_the_block() {
        fn found(t: &str) -> Option<(String, &str)> {
            guide_model_metrics(t).map(|(f, at)| (f, &t[at..]))
        }
        assert_eq!(
            found("name: \"m\"\nmodel_metrics: {\n  counters [ \"a\" ] }"),
            Some(("counters".into(), "counters [ \"a\" ] }"))
        );
        assert_eq!(found("model_metrics { metric_control [ { metric_identifier { family: \"f\" } } ] }"), None);
        assert_eq!(found("# model_metrics { enable: true }\nname: \"model_metrics { enable }\""), None);
        assert_eq!(found("parameters { key: \"model_metrics\" value { string_value: \"x\" } }"), None);
        assert_eq!(found("x_model_metrics { enable: true }"), None);
        assert_eq!(found("model_metrics { metric_control [ ] } max_batch_size: 1e5"), None);
    }

    #[test]
    fn line_column_counts_from_one_in_characters() {
        let text = "ab\ncdé\nf";
        for (offset, expected) in [
            (0, (1, 1)),
            (2, (1, 3)),
            (3, (2, 1)),
            (5, (2, 3)),
            (7, (2, 4)),
            (8, (3, 1)),
            (9, (3, 2)),
            (100, (3, 2)),
            (6, (2, 3)), // inside 'é': snapped back to its start
        ] {
            assert_eq!(line_column(text, offset), expected, "offset {offset}");
        }
    }
}
