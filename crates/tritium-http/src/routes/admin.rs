//! tritium's own admin endpoints over HTTP, beside Triton's API: `GET
//! /tritium/models/{model}/stacks[?instance=N]`, the live Python stacks of a model's stubs as
//! JSON, allowed as the gRPC admin calls are (loopback peers that are not a model's processes,
//! or the server's admin token as `authorization: Bearer <token>`).

use std::net::SocketAddr;

use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;

use super::{json_ok, AppState};
use crate::error::HttpError;
use crate::{AdminCaller, Backend};

#[derive(Serialize)]
struct StacksJson {
    model: String,
    version: String,
    instance: String,
    pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stacks: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `GET /tritium/models/{model}/stacks[?instance=N]`: `{"stacks": [{model, version, instance,
/// pid, stacks | error}]}`.
pub(crate) async fn stacks<B: Backend>(
    State(s): State<AppState<B>>,
    Path(model): Path<String>,
    parts: Parts,
) -> Result<Response, HttpError> {
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let caller = AdminCaller {
        peer,
        authorization: parts.headers.get("authorization").map(|v| v.as_bytes()),
        token: s.options.admin_token.as_deref(),
    };
    s.backend.authorize_admin("Stacks", caller).map_err(|why| HttpError::new(StatusCode::FORBIDDEN, why))?;
    let instance = query_value(parts.uri.query().unwrap_or(""), "instance")?.filter(|i| !i.is_empty());
    let stacks = s.backend.stacks(&model, instance.as_deref()).await?;
    let stacks: Vec<StacksJson> = stacks
        .into_iter()
        .map(|i| {
            let (stacks, error) = match i.stacks {
                Ok(text) => (Some(text), None),
                Err(why) => (None, Some(why)),
            };
            StacksJson {
                model: i.model,
                version: i.version.to_string(),
                instance: i.instance,
                pid: i.pid,
                stacks,
                error,
            }
        })
        .collect();
    json_ok(&serde_json::json!({ "stacks": stacks }))
}

/// The value of `key` in a query string, percent-decoded (`+` is a space).
fn query_value(query: &str, key: &str) -> Result<Option<String>, HttpError> {
    let bad =
        || HttpError::new(StatusCode::BAD_REQUEST, format!("the query's '{key}' is not valid percent-encoded UTF-8"));
    let Some(raw) = query.split('&').find_map(|pair| pair.strip_prefix(key)?.strip_prefix('=')) else {
        return Ok(None);
    };
    let mut bytes = Vec::with_capacity(raw.len());
    let mut it = raw.bytes();
    while let Some(b) = it.next() {
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = [it.next().ok_or_else(bad)?, it.next().ok_or_else(bad)?];
                let hex = std::str::from_utf8(&hex).map_err(|_| bad())?;
                bytes.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            }
            b => bytes.push(b),
        }
    }
    String::from_utf8(bytes).map(Some).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_found_and_decoded() {
        assert_eq!(query_value("instance=m_0_1", "instance").ok().flatten().as_deref(), Some("m_0_1"));
        assert_eq!(query_value("a=1&instance=a%20b+c", "instance").ok().flatten().as_deref(), Some("a b c"));
        assert_eq!(query_value("instances=1", "instance").ok().flatten(), None);
        assert!(query_value("instance=%zz", "instance").is_err());
    }
}
