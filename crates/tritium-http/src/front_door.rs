//! Restricted APIs (`--http-restricted-api`): the API group of each route, as Triton's
//! `HTTPAPIServer` handlers check them (`RETURN_AND_RESPOND_IF_RESTRICTED` in
//! `src/http_server.cc`), and the middleware that answers a request of a restricted group
//! without its header with Triton's 403 and text, before routing (so before the method check,
//! as Triton).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tritium_server::restricted::{ApiGroup, Restrictions};

use crate::error::HttpError;

/// The group of a request path, or `None` for a path that is in none (an unknown one).
pub fn group_of(path: &str) -> Option<ApiGroup> {
    let rest = path.strip_prefix("/v2")?;
    if rest.is_empty() {
        return Some(ApiGroup::Metadata);
    }
    let mut segments = rest.strip_prefix('/')?.split('/');
    match segments.next()? {
        "health" => Some(ApiGroup::Health),
        "logging" => Some(ApiGroup::Logging),
        "trace" => Some(ApiGroup::Trace),
        "repository" => Some(ApiGroup::ModelRepository),
        "systemsharedmemory" | "cudasharedmemory" => Some(ApiGroup::SharedMemory),
        "models" => {
            let segments: Vec<&str> = segments.collect();
            let tail = match segments.as_slice() {
                ["stats"] => return Some(ApiGroup::Statistics),
                [_, "versions", _, tail @ ..] => tail,
                [_, tail @ ..] => tail,
                [] => return None,
            };
            match tail {
                [] => Some(ApiGroup::Metadata),
                ["ready"] => Some(ApiGroup::Health),
                ["config"] => Some(ApiGroup::ModelConfig),
                ["stats"] => Some(ApiGroup::Statistics),
                ["infer" | "generate" | "generate_stream"] => Some(ApiGroup::Inference),
                ["trace", "setting"] => Some(ApiGroup::Trace),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Triton's answer to a request of a restricted group without the header (`RespondIfRestricted`).
pub(crate) fn refusal(header: &str) -> HttpError {
    HttpError::new(StatusCode::FORBIDDEN, format!("This API is restricted, expecting header '{header}'"))
}

/// The middleware: refuses a request of a restricted group whose header is missing or wrong.
pub(crate) async fn restrict(State(restrictions): State<Arc<Restrictions>>, req: Request, next: Next) -> Response {
    if let Some(group) = group_of(req.uri().path()) {
        if let Err(header) = restrictions.check_headers(group, |h| req.headers().get(h).map(|v| v.as_bytes())) {
            tracing::debug!(path = req.uri().path(), "refused: {group} is restricted");
            return refusal(header).into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_fall_in_tritons_groups() {
        for (path, group) in [
            ("/v2", Some(ApiGroup::Metadata)),
            ("/v2/health/live", Some(ApiGroup::Health)),
            ("/v2/health/ready", Some(ApiGroup::Health)),
            ("/v2/models/m", Some(ApiGroup::Metadata)),
            ("/v2/models/m/versions/2", Some(ApiGroup::Metadata)),
            ("/v2/models/m/ready", Some(ApiGroup::Health)),
            ("/v2/models/m/versions/1/ready", Some(ApiGroup::Health)),
            ("/v2/models/m/config", Some(ApiGroup::ModelConfig)),
            ("/v2/models/stats", Some(ApiGroup::Statistics)),
            ("/v2/models/m/stats", Some(ApiGroup::Statistics)),
            ("/v2/models/m/infer", Some(ApiGroup::Inference)),
            ("/v2/models/m/versions/1/infer", Some(ApiGroup::Inference)),
            ("/v2/models/m/generate", Some(ApiGroup::Inference)),
            ("/v2/models/m/generate_stream", Some(ApiGroup::Inference)),
            ("/v2/models/m/trace/setting", Some(ApiGroup::Trace)),
            ("/v2/trace/setting", Some(ApiGroup::Trace)),
            ("/v2/logging", Some(ApiGroup::Logging)),
            ("/v2/repository/index", Some(ApiGroup::ModelRepository)),
            ("/v2/repository/models/m/load", Some(ApiGroup::ModelRepository)),
            ("/v2/systemsharedmemory/status", Some(ApiGroup::SharedMemory)),
            ("/v2/cudasharedmemory/region/r/register", Some(ApiGroup::SharedMemory)),
            ("/v2/models/m/unknown", None),
            ("/v3", None),
            ("/metrics", None),
        ] {
            assert_eq!(group_of(path), group, "{path}");
        }
    }

    #[test]
    fn refusal_is_tritons() {
        let e = refusal("admin-key");
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert_eq!(e.message, "This API is restricted, expecting header 'admin-key'");
    }
}
