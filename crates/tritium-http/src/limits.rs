//! The request-size limit, `--http-max-input-size`, and Triton's texts for a request over it.
//!
//! As in Triton, the limit covers a body that is all JSON, a raw binary body, and the JSON header
//! of a request with binary tensor data (not the binary data itself), and it counts the
//! decompressed bytes of a `gzip`/`deflate` body; decompression stops at the limit.
//! Every answer is HTTP 400 (Triton's `INVALID_ARG`) and names the flag.

use tritium_server::InferError;

/// Triton's default `--http-max-input-size` (`HTTP_DEFAULT_MAX_INPUT_SIZE` in `src/common.h`).
pub const DEFAULT_MAX_INPUT_SIZE: usize = 1 << 26;

/// What kind of body went over the limit, which picks Triton's text for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// A body that is all JSON (no `Inference-Header-Content-Length`, or a control request).
    Json,
    /// A raw binary body (`Inference-Header-Content-Length: 0`).
    Raw,
    /// A JSON header followed by binary tensor data.
    Request,
}

impl BodyKind {
    /// The kind of an inference body from its `Inference-Header-Content-Length` value.
    pub fn of_infer(header_length: Option<&str>) -> Self {
        match header_length.map(|v| v.trim().parse::<i64>()) {
            None => BodyKind::Json,
            Some(Ok(0)) => BodyKind::Raw,
            Some(_) => BodyKind::Request,
        }
    }
}

/// A body larger than `--http-max-input-size`. `size` is the byte count when known (from
/// `Content-Length`), otherwise "more than `<limit>`".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooLarge {
    /// Triton's `EVBufferToJson` text.
    #[error(
        "request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. Use --http-max-input-size to increase the limit."
    )]
    Json {
        /// The body size.
        size: String,
        /// The limit.
        limit: usize,
    },
    /// Triton's `EVBufferToRawInput` text.
    #[error(
        "Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of {limit} bytes. Use --http-max-input-size to increase the limit."
    )]
    Raw {
        /// The body size.
        size: String,
        /// The limit.
        limit: usize,
    },
    /// Triton's `DataCompressor::DecompressData` text.
    #[error(
        "Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use --http-max-input-size to increase the limit."
    )]
    Decompressed {
        /// The limit.
        limit: usize,
    },
}

impl TooLarge {
    /// The error for a body of `size` bytes (`None`: unknown, more than `limit`).
    pub fn body(kind: BodyKind, size: Option<u64>, limit: usize) -> Self {
        let size = match size {
            Some(n) => n.to_string(),
            None => format!("more than {limit}"),
        };
        match kind {
            // A request with binary data is limited in its JSON header only.
            BodyKind::Json | BodyKind::Request => TooLarge::Json { size, limit },
            BodyKind::Raw => TooLarge::Raw { size, limit },
        }
    }
}

impl From<TooLarge> for InferError {
    fn from(e: TooLarge) -> Self {
        InferError::invalid(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_texts() {
        assert_eq!(
            TooLarge::body(BodyKind::Json, Some(10), 8).to_string(),
            "request JSON size of 10 bytes exceeds the maximum allowed input size of 8 bytes. Use --http-max-input-size to increase the limit."
        );
        assert_eq!(
            TooLarge::body(BodyKind::Raw, Some(10), 8).to_string(),
            "Raw input has a byte_size (10 bytes) that exceeds the maximum allowed value of 8 bytes. Use --http-max-input-size to increase the limit."
        );
        assert_eq!(
            TooLarge::body(BodyKind::Request, None, 8).to_string(),
            "request JSON size of more than 8 bytes exceeds the maximum allowed input size of 8 bytes. Use --http-max-input-size to increase the limit."
        );
        assert_eq!(
            TooLarge::Decompressed { limit: 8 }.to_string(),
            "Decompressed data size exceeds the maximum allowed value of 8 bytes. Use --http-max-input-size to increase the limit."
        );
    }

    #[test]
    fn kinds() {
        assert_eq!(BodyKind::of_infer(None), BodyKind::Json);
        assert_eq!(BodyKind::of_infer(Some(" 0")), BodyKind::Raw);
        assert_eq!(BodyKind::of_infer(Some("12")), BodyKind::Request);
        assert_eq!(BodyKind::of_infer(Some("x")), BodyKind::Request);
    }
}
