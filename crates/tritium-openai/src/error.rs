//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status
//! OpenAI answers for each class, and the mapping from the core's [`ErrorKind`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tritium_server::{ErrorKind, InferError};

/// An error answered to an OpenAI client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's error `type` (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    /// What went wrong and what to do.
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// OpenAI's machine-readable `code` (`model_not_found`), when one applies.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// A 404 `model_not_found` for `model`, with `why` (the listing explains which models are
    /// served).
    pub fn model_not_found(model: &str, why: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            message: format!("The model '{model}' does not exist: {why}. GET /v1/models lists the models served here."),
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// A 500 `server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// The error as OpenAI's JSON object.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<InferError> for ApiError {
    fn from(e: InferError) -> Self {
        let (status, kind) = match e.kind {
            ErrorKind::InvalidArg | ErrorKind::Unsupported | ErrorKind::AlreadyExists => {
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            }
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "invalid_request_error"),
            ErrorKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
            ErrorKind::Cancelled => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            ErrorKind::Internal | ErrorKind::Unknown => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        Self { status, kind, message: e.message, param: None, code: None }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::model_not_found("nope", "no such model");
        let b = e.body();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["param"], "model");
        assert_eq!(b["error"]["code"], "model_not_found");
        assert!(b["error"]["message"].as_str().is_some_and(|m| m.contains("'nope'")));
    }

    #[test]
    fn core_kinds_map_to_statuses() {
        let s = |k| ApiError::from(InferError::new(k, "x")).status;
        assert_eq!(s(ErrorKind::InvalidArg), StatusCode::BAD_REQUEST);
        assert_eq!(s(ErrorKind::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(s(ErrorKind::Unavailable), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(s(ErrorKind::Internal), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
