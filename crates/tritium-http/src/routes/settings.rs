//! `/v2/logging` and `/v2/trace/setting`: the logging and trace extensions, and what tritium does not support.

use super::*;

// ---- not supported (yet) ----

pub(super) fn not_supported(what: &str) -> HttpError {
    HttpError::new(StatusCode::BAD_REQUEST, format!("{what} is not supported by tritium yet"))
}

fn log_settings_json(s: &LogSettings) -> Value {
    serde_json::json!({
        "log_file": s.log_file,
        "log_info": s.log_info,
        "log_warning": s.log_warning,
        "log_error": s.log_error,
        "log_verbose_level": s.log_verbose_level,
        "log_format": s.log_format,
    })
}

pub(super) async fn logging_get<B: Backend>(State(s): St<B>) -> HttpResult {
    json_ok(&log_settings_json(&s.backend.log_settings()?))
}

/// Parses a `/v2/logging` POST body: a JSON object with any of the settings, each of its type.
pub(crate) fn parse_log_update(body: &Value) -> Result<LogSettingsUpdate, HttpError> {
    let obj = body
        .as_object()
        .ok_or_else(|| HttpError::new(StatusCode::BAD_REQUEST, "log settings must be a JSON object"))?;
    let bad = |key: &str, want: &str| HttpError::new(StatusCode::BAD_REQUEST, format!("expect {want} for '{key}'"));
    let mut u = LogSettingsUpdate::default();
    for (key, value) in obj {
        match key.as_str() {
            "log_file" => return Err(tritium_server::log_file_refused().into()),
            "log_info" => u.log_info = Some(value.as_bool().ok_or_else(|| bad(key, "boolean"))?),
            "log_warning" => u.log_warning = Some(value.as_bool().ok_or_else(|| bad(key, "boolean"))?),
            "log_error" => u.log_error = Some(value.as_bool().ok_or_else(|| bad(key, "boolean"))?),
            "log_verbose_level" => {
                let v =
                    value.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| bad(key, "unsigned integer"))?;
                u.log_verbose_level = Some(v);
            }
            "log_format" => u.log_format = Some(value.as_str().ok_or_else(|| bad(key, "string"))?.to_string()),
            other => {
                return Err(HttpError::new(StatusCode::BAD_REQUEST, format!("Logging setting '{other}' is unknown")));
            }
        }
    }
    Ok(u)
}

pub(super) async fn logging_post<B: Backend>(State(s): St<B>, headers: HeaderMap, body: Body) -> HttpResult {
    let body = read_body(&headers, body, s.options.max_input_size, BodyKind::Json).await?;
    let update = match optional_json(&body)? {
        Some(v) => parse_log_update(&v)?,
        None => LogSettingsUpdate::default(),
    };
    json_ok(&log_settings_json(&s.backend.update_log_settings(update)?))
}

/// The trace settings as Triton's JSON: `trace_level` a list of strings, every other setting a
/// string.
fn trace_settings_json(view: TraceSettingsView) -> Value {
    let map = view
        .into_iter()
        .map(|(k, v)| {
            let value = if k == "trace_level" { Value::from(v) } else { Value::from(v.concat()) };
            (k, value)
        })
        .collect::<serde_json::Map<_, _>>();
    Value::Object(map)
}

/// The model a trace route names (`None` for the global settings).
fn trace_model(p: &HashMap<String, String>) -> Option<&str> {
    p.get("model").map(String::as_str).filter(|m| !m.is_empty())
}

pub(super) async fn trace_get<B: Backend>(State(s): St<B>, Params(p): Params) -> HttpResult {
    json_ok(&trace_settings_json(s.backend.trace_settings(trace_model(&p))?))
}

/// Parses a trace settings POST body as Triton reads it: `null` clears a setting, `trace_level`
/// is a list of strings and every other setting a string.
pub(crate) fn parse_trace_update(body: &Value) -> Result<Vec<(String, UpdateValue)>, HttpError> {
    let obj = body
        .as_object()
        .ok_or_else(|| HttpError::new(StatusCode::BAD_REQUEST, "trace settings must be a JSON object"))?;
    let bad = |key: &str, want: &str| HttpError::new(StatusCode::BAD_REQUEST, format!("expect {want} for '{key}'"));
    let mut values = Vec::with_capacity(obj.len());
    for (key, value) in obj {
        let v = match value {
            Value::Null => UpdateValue::Clear,
            _ if key == "trace_level" => {
                let items = value.as_array().ok_or_else(|| bad(key, "an array of strings"))?;
                let levels = items
                    .iter()
                    .map(|l| l.as_str().map(str::to_string).ok_or_else(|| bad(key, "an array of strings")))
                    .collect::<Result<Vec<_>, _>>()?;
                UpdateValue::Values(levels)
            }
            Value::String(v) => UpdateValue::Values(vec![v.clone()]),
            _ => return Err(bad(key, "a string")),
        };
        values.push((key.clone(), v));
    }
    Ok(values)
}

pub(super) async fn trace_post<B: Backend>(
    State(s): St<B>,
    Params(p): Params,
    headers: HeaderMap,
    body: Body,
) -> HttpResult {
    let body = read_body(&headers, body, s.options.max_input_size, BodyKind::Json).await?;
    let model = trace_model(&p);
    let view = match optional_json(&body)? {
        Some(v) => {
            // Triton checks the model before reading the settings.
            s.backend.trace_settings(model)?;
            s.backend.update_trace_settings(model, &parse_trace_update(&v)?)?
        }
        None => s.backend.trace_settings(model)?,
    };
    json_ok(&trace_settings_json(view))
}

/// The caller's trace from its W3C `traceparent` header, if it sent a valid one.
pub(super) fn trace_parent(headers: &HeaderMap) -> Option<TraceParent> {
    let value = headers.get("traceparent")?.to_str().ok()?;
    SpanContext::from_traceparent(value).map(TraceParent::Remote)
}
