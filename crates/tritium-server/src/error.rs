//! The errors the core answers to clients: [`InferError`] and its Triton [`ErrorKind`], with
//! the mapping between kinds and Triton's numeric codes in both directions.

/// Triton's error codes, which the frontends map to HTTP statuses and gRPC codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Anything else.
    Unknown,
    /// A server-side failure (model code raised, a stub crashed).
    Internal,
    /// Unknown model, version or tensor.
    NotFound,
    /// The request is malformed: wrong dtype, shape, size, missing input.
    InvalidArg,
    /// The model exists but cannot serve now (loading, failed, unloading).
    Unavailable,
    /// The feature is not supported.
    Unsupported,
    /// Already exists.
    AlreadyExists,
    /// The request was cancelled.
    Cancelled,
}

impl ErrorKind {
    /// Triton's `TRITONSERVER_Error_Code` number (`pb_utils.TritonError` codes), the inverse of
    /// [`ErrorKind::from_triton_code`].
    pub fn triton_code(self) -> u32 {
        match self {
            ErrorKind::Unknown => 0,
            ErrorKind::Internal => 1,
            ErrorKind::NotFound => 2,
            ErrorKind::InvalidArg => 3,
            ErrorKind::Unavailable => 4,
            ErrorKind::Unsupported => 5,
            ErrorKind::AlreadyExists => 6,
            ErrorKind::Cancelled => 7,
        }
    }

    /// The kind of a numeric `pb_utils.TritonError` code.
    pub fn from_triton_code(code: u32) -> Self {
        match code {
            1 => ErrorKind::Internal,
            2 => ErrorKind::NotFound,
            3 => ErrorKind::InvalidArg,
            4 => ErrorKind::Unavailable,
            5 => ErrorKind::Unsupported,
            6 => ErrorKind::AlreadyExists,
            7 => ErrorKind::Cancelled,
            _ => ErrorKind::Unknown,
        }
    }
}

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InferError {
    /// The class of error.
    pub kind: ErrorKind,
    /// What went wrong and, where it helps, what to do.
    pub message: String,
}

impl InferError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// `InvalidArg`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArg, message)
    }

    /// `NotFound`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// `Unavailable`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// `Internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_codes_map_both_ways() {
        let all = [
            ErrorKind::Unknown,
            ErrorKind::Internal,
            ErrorKind::NotFound,
            ErrorKind::InvalidArg,
            ErrorKind::Unavailable,
            ErrorKind::Unsupported,
            ErrorKind::AlreadyExists,
            ErrorKind::Cancelled,
        ];
        for kind in all {
            assert_eq!(ErrorKind::from_triton_code(kind.triton_code()), kind);
        }
        assert_eq!(ErrorKind::Cancelled.triton_code(), 7);
    }
}
