//! The error type of this crate.

use std::path::PathBuf;

/// Why a model configuration or model directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// `config.pbtxt` is not valid protobuf text format for `inference.ModelConfig`.
    #[error("{}:{line}:{column}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in characters) of the error.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A JSON model configuration does not match `inference.ModelConfig`.
    #[error("invalid JSON model configuration: {0}")]
    Json(String),
    /// The model asks for a platform or backend tritium does not serve.
    #[error("model '{model}' asks for {requested}, which tritium does not serve; {}", crate::SERVED)]
    UnsupportedBackend {
        /// The model.
        model: String,
        /// What it asks for, e.g. `backend 'onnxruntime'` or `platform 'tensorrt_plan'`.
        requested: String,
    },
    /// The configuration breaks one of Triton's rules; the text is Triton's where it has one.
    #[error("{0}")]
    Invalid(String),
    /// The version policy selects version directories that are not there.
    #[error("{0}")]
    Version(String),
}
