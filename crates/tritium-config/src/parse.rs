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
    let message = DynamicMessage::parse_text_format(model_config_descriptor(), prepared.text())
        .map_err(|e| parse_error(&e, &prepared, text, file))?;
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
    ConfigError::Parse { path: PathBuf::from(file), line, column, message: error.to_string() }
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
    use super::line_column;

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
