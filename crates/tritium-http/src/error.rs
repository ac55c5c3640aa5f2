//! HTTP errors: Triton's status for each error kind and its `{"error": "<message>"}` body.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tritium_server::{ErrorKind, InferError};

/// The HTTP status Triton's `HttpCodeFromError` (`src/http_server.cc`) gives an error code.
pub fn status_for(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        ErrorKind::Unknown | ErrorKind::InvalidArg | ErrorKind::AlreadyExists | ErrorKind::Cancelled => {
            StatusCode::BAD_REQUEST
        }
    }
}

/// The JSON body of an error response, `{"error":"<message>"}`.
pub fn error_body(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

/// An error answered as `{"error": "<message>"}` with a status.
#[derive(Debug)]
pub(crate) struct HttpError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) extra_header: Option<(HeaderName, HeaderValue)>,
}

impl HttpError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), extra_header: None }
    }

    /// Triton's answer for an unknown path.
    pub(crate) fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not Found")
    }

    /// Triton's answer for a known path with the wrong method.
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
    }
}

impl From<InferError> for HttpError {
    fn from(e: InferError) -> Self {
        Self::new(status_for(e.kind), e.message)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut resp =
            (self.status, [(header::CONTENT_TYPE, "application/json")], error_body(&self.message)).into_response();
        if let Some((name, value)) = self.extra_header {
            resp.headers_mut().insert(name, value);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_status_mapping() {
        assert_eq!(status_for(ErrorKind::Internal), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(status_for(ErrorKind::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(status_for(ErrorKind::Unavailable), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status_for(ErrorKind::Unsupported), StatusCode::NOT_IMPLEMENTED);
        for k in [ErrorKind::Unknown, ErrorKind::InvalidArg, ErrorKind::AlreadyExists, ErrorKind::Cancelled] {
            assert_eq!(status_for(k), StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn body_escapes() {
        assert_eq!(error_body("a \"b\"\n"), r#"{"error":"a \"b\"\n"}"#);
    }
}
