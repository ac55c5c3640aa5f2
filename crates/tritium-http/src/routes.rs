//! The routes of Triton's HTTP API (`HTTPAPIServer::Handle` in `src/http_server.cc`), their
//! handlers, and the JSON shapes of their answers.

use base64::Engine as _;
use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use tritium_server::trace::{SpanContext, TraceParent, UpdateValue};
use tritium_server::{
    parse_version, ErrorKind, InferError, LogSettings, LogSettingsUpdate, ModelStats, StatDuration, TraceSettingsView,
};

use crate::body::{ChunkBody, EventBody};
use crate::codec;
use crate::compression::{self, Encoding};
use crate::error::{status_for, HttpError};
use crate::limits::{BodyKind, TooLarge};
use crate::{Backend, Options};

mod admin;
mod settings;
mod shm;
mod stats;

use settings::{logging_get, logging_post, not_supported, trace_get, trace_parent, trace_post};
use shm::{
    cuda_shm_register, cuda_shm_status, cuda_shm_unregister, system_shm, system_shm_register, system_shm_status,
    system_shm_unregister,
};
use stats::{all_stats, model_stats};

/// JSON work larger than this runs on the blocking pool rather than on a runtime thread.
const BLOCKING_THRESHOLD: usize = 256 << 10;

const INFERENCE_HEADER_CONTENT_LENGTH: HeaderName = HeaderName::from_static("inference-header-content-length");

pub(crate) struct AppState<B> {
    pub(crate) backend: Arc<B>,
    pub(crate) options: Options,
}

impl<B> Clone for AppState<B> {
    fn clone(&self) -> Self {
        Self { backend: self.backend.clone(), options: self.options.clone() }
    }
}

type St<B> = State<AppState<B>>;
type HttpResult = Result<Response, HttpError>;

pub(crate) fn build<B: Backend>(backend: Arc<B>, options: Options) -> Router {
    fn with_405<B: Backend>(m: MethodRouter<AppState<B>>) -> MethodRouter<AppState<B>> {
        m.fallback(|| async { HttpError::method_not_allowed() })
    }
    let get_only = |h| with_405::<B>(h);

    let mut r: Router<AppState<B>> = Router::new()
        .route("/v2", get_only(get(server_metadata::<B>)))
        .route("/v2/health/live", get_only(get(health_live::<B>)))
        .route("/v2/health/ready", get_only(get(health_ready::<B>)))
        .route("/v2/models/stats", get_only(get(all_stats::<B>)))
        .route("/v2/logging", with_405(get(logging_get::<B>).post(logging_post::<B>)))
        .route("/v2/trace/setting", with_405(get(trace_get::<B>).post(trace_post::<B>)))
        .route("/v2/repository/index", with_405(post(repository_index::<B>)))
        .route("/v2/repository/{repo}/index", with_405(post(repository_index::<B>)))
        .route("/v2/repository/models/{model}/{action}", with_405(post(repository_control::<B>)))
        .route("/v2/repository/{repo}/models/{model}/{action}", with_405(post(repository_control::<B>)));
    for prefix in ["/v2/models/{model}", "/v2/models/{model}/versions/{version}"] {
        r = r
            .route(prefix, with_405(get(model_metadata::<B>)))
            .route(&format!("{prefix}/ready"), with_405(get(model_ready::<B>)))
            .route(&format!("{prefix}/config"), with_405(get(model_config::<B>)))
            .route(&format!("{prefix}/stats"), with_405(get(model_stats::<B>)))
            .route(&format!("{prefix}/infer"), with_405(post(infer::<B>)))
            .route(&format!("{prefix}/generate"), with_405(post(generate::<B>)))
            .route(&format!("{prefix}/generate_stream"), with_405(post(generate_stream::<B>)));
    }
    r = r.route("/tritium/models/{model}/stacks", get_only(get(admin::stacks::<B>)));
    r = r.route("/v2/models/{model}/trace/setting", with_405(get(trace_get::<B>).post(trace_post::<B>)));
    for prefix in ["/v2/systemsharedmemory", "/v2/systemsharedmemory/region/{region}"] {
        r = r
            .route(&format!("{prefix}/status"), with_405(get(system_shm_status::<B>)))
            .route(&format!("{prefix}/register"), with_405(post(system_shm_register::<B>)))
            .route(&format!("{prefix}/unregister"), with_405(post(system_shm_unregister::<B>)));
    }
    for prefix in ["/v2/cudasharedmemory", "/v2/cudasharedmemory/region/{region}"] {
        r = r
            .route(&format!("{prefix}/status"), with_405(get(cuda_shm_status::<B>)))
            .route(&format!("{prefix}/register"), with_405(post(cuda_shm_register::<B>)))
            .route(&format!("{prefix}/unregister"), with_405(post(cuda_shm_unregister::<B>)));
    }
    let restrictions = options.restrictions.clone();
    let r = r.fallback(|| async { HttpError::not_found() }).with_state(AppState { backend, options });
    if restrictions.is_empty() {
        return r;
    }
    r.layer(axum::middleware::from_fn_with_state(restrictions, crate::front_door::restrict))
}

/// A model name and version from the path, as Triton's model regex takes them: the version, when
/// present, must be digits (anything else is not a route, 404).
struct ModelRef {
    name: String,
    version: Option<i64>,
}

/// Path parameters, percent-decoded.
struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        match Path::<HashMap<String, String>>::from_request_parts(parts, state).await {
            Ok(Path(p)) => Ok(Params(p)),
            Err(e) => Err(HttpError::new(StatusCode::BAD_REQUEST, format!("invalid request path: {e}"))),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ModelRef {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let Params(mut p) = Params::from_request_parts(parts, state).await?;
        let name = p.remove("model").unwrap_or_default();
        let version = match p.remove("version") {
            None => None,
            Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => parse_version(&v)?,
            Some(_) => return Err(HttpError::not_found()),
        };
        Ok(ModelRef { name, version })
    }
}

fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.into()).into_response()
}

pub(crate) fn json_ok<T: Serialize>(value: &T) -> HttpResult {
    let body = serde_json::to_vec(value)
        .map_err(|e| HttpError::from(InferError::internal(format!("failed to write JSON: {e}"))))?;
    Ok(json_response(StatusCode::OK, body))
}

/// Runs CPU-heavy work on the blocking pool when it is large.
async fn cpu<T, F>(heavy: bool, f: F) -> Result<T, HttpError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if heavy {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| HttpError::from(InferError::internal(format!("request processing task failed: {e}"))))
    } else {
        Ok(f())
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, HttpError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| HttpError::new(StatusCode::BAD_REQUEST, format!("header {name} is not valid ASCII"))),
    }
}

/// Reads a body of at most `limit` bytes (`--http-max-input-size`); `kind` picks Triton's text
/// for one over it. A `Content-Length` over the limit is refused before any of the body is
/// read. As in Triton, a JSON header followed by binary tensor data ([`BodyKind::Request`]) is
/// limited in its header only (checked by the caller), not in its binary data, which costs
/// memory equal to its own size. A body that arrives in one chunk is kept as is; one that
/// arrives in several is gathered into a single buffer, reserved from `Content-Length` but never
/// more than `limit` ahead of the bytes that really arrived.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize, kind: BodyKind) -> Result<Bytes, HttpError> {
    use http_body_util::BodyExt;

    let too_large = |n: Option<u64>| HttpError::from(InferError::from(TooLarge::body(kind, n, limit)));
    let enforce = kind != BodyKind::Request;
    let declared = header_str(headers, &header::CONTENT_LENGTH)?
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or_else(|| http_body::Body::size_hint(&body).exact());
    if let Some(len) = declared {
        if enforce && len > limit as u64 {
            drain(body).await;
            return Err(too_large(Some(len)));
        }
    }
    // A declared length is only a claim: reserve at most `limit` up front and grow with the data.
    let declared = declared.and_then(|d| usize::try_from(d).ok()).unwrap_or(0).min(limit);
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut gathered: Option<bytes::BytesMut> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| HttpError::new(StatusCode::BAD_REQUEST, format!("failed to read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        total = total.saturating_add(data.len());
        if enforce && total > limit {
            drain(body).await;
            return Err(too_large(None));
        }
        if let Some(buf) = gathered.as_mut() {
            buf.extend_from_slice(&data);
        } else if let Some(f) = first.take() {
            let mut buf = bytes::BytesMut::with_capacity(declared.max(f.len() + data.len()));
            buf.extend_from_slice(&f);
            buf.extend_from_slice(&data);
            gathered = Some(buf);
        } else {
            first = Some(data);
        }
    }
    Ok(match gathered {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// How much of a refused body is read and thrown away so that the client, still sending it,
/// reads the answer instead of a broken pipe (Triton reads whole bodies before answering).
/// Past this the connection is closed.
const DRAIN_MAX: u64 = 64 << 20;

/// Reads and discards up to [`DRAIN_MAX`] bytes of a refused body, holding none of it.
async fn drain(mut body: Body) {
    use http_body_util::BodyExt;

    let mut left = DRAIN_MAX;
    while let Some(Ok(frame)) = body.frame().await {
        let n = frame.data_ref().map_or(0, |d| d.len() as u64);
        if n >= left {
            break;
        }
        left -= n;
    }
}

// ---- health and metadata ----

async fn health_live<B: Backend>(State(s): St<B>) -> StatusCode {
    if s.backend.live() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

async fn health_ready<B: Backend>(State(s): St<B>) -> StatusCode {
    if s.backend.ready() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

#[derive(Serialize)]
struct ServerMetadataJson<'a> {
    name: &'a str,
    version: &'a str,
    extensions: &'a [String],
}

async fn server_metadata<B: Backend>(State(s): St<B>) -> HttpResult {
    let m = s.backend.metadata();
    json_ok(&ServerMetadataJson { name: &m.name, version: &m.version, extensions: &m.extensions })
}

#[derive(Serialize)]
struct TensorMetadataJson<'a> {
    name: &'a str,
    datatype: &'a str,
    shape: &'a [i64],
}

#[derive(Serialize)]
struct ModelMetadataJson<'a> {
    name: &'a str,
    versions: &'a [String],
    platform: &'a str,
    inputs: Vec<TensorMetadataJson<'a>>,
    outputs: Vec<TensorMetadataJson<'a>>,
}

async fn model_metadata<B: Backend>(State(s): St<B>, m: ModelRef) -> HttpResult {
    if m.name.is_empty() {
        return Err(HttpError::new(StatusCode::BAD_REQUEST, "Missing model name in ModelMetadata request"));
    }
    let md = s.backend.model_metadata(&m.name, m.version)?;
    fn tensors(v: &[tritium_server::TensorMetadata]) -> Vec<TensorMetadataJson<'_>> {
        v.iter().map(|t| TensorMetadataJson { name: &t.name, datatype: &t.datatype, shape: &t.shape }).collect()
    }
    json_ok(&ModelMetadataJson {
        name: &md.name,
        versions: &md.versions,
        platform: &md.platform,
        inputs: tensors(&md.inputs),
        outputs: tensors(&md.outputs),
    })
}

async fn model_ready<B: Backend>(State(s): St<B>, m: ModelRef) -> HttpResult {
    if m.name.is_empty() {
        return Err(HttpError::new(StatusCode::BAD_REQUEST, "Missing model name in ModelReady request"));
    }
    if s.backend.model_ready(&m.name, m.version) {
        Ok(StatusCode::OK.into_response())
    } else {
        Err(HttpError::new(StatusCode::BAD_REQUEST, "Model version not ready"))
    }
}

async fn model_config<B: Backend>(State(s): St<B>, m: ModelRef) -> HttpResult {
    if m.name.is_empty() {
        return Err(HttpError::new(StatusCode::BAD_REQUEST, "Missing model name in ModelConfig request"));
    }
    let config = s.backend.model_config_json(&m.name, m.version)?;
    Ok(json_response(StatusCode::OK, config))
}

// ---- model repository ----

#[derive(Serialize)]
struct IndexEntryJson<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    state: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    /// tritium's own (clients that read Triton's keys ignore it): the stubs' interpreter.
    #[serde(skip_serializing_if = "str::is_empty")]
    tritium_python: &'a str,
    /// tritium's own: the model's own Python environment, when it has one.
    #[serde(skip_serializing_if = "str::is_empty")]
    tritium_environment: &'a str,
}

/// Parses an optional JSON body (empty means none).
fn optional_json(body: &[u8]) -> Result<Option<Value>, HttpError> {
    if body.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(body)
        .map(Some)
        .map_err(|e| HttpError::new(StatusCode::BAD_REQUEST, format!("failed to parse the request JSON buffer: {e}")))
}

async fn repository_index<B: Backend>(State(s): St<B>, headers: HeaderMap, body: Body) -> HttpResult {
    let body = read_body(&headers, body, s.options.max_input_size, BodyKind::Json).await?;
    let mut ready = false;
    if let Some(v) = optional_json(&body)?.as_ref().and_then(|j| j.get("ready")) {
        ready = v
            .as_bool()
            .ok_or_else(|| HttpError::new(StatusCode::BAD_REQUEST, "Invalid value for 'ready': expected a boolean"))?;
    }
    let index = s.backend.repository_index(ready);
    let entries: Vec<IndexEntryJson<'_>> = index
        .iter()
        .map(|e| IndexEntryJson {
            name: &e.name,
            version: &e.version,
            state: &e.state,
            reason: &e.reason,
            tritium_python: &e.python,
            tritium_environment: &e.environment,
        })
        .collect();
    json_ok(&entries)
}

async fn repository_control<B: Backend>(
    State(s): St<B>,
    Params(p): Params,
    headers: HeaderMap,
    body: Body,
) -> HttpResult {
    let action = p.get("action").map(String::as_str).unwrap_or_default();
    if action != "load" && action != "unload" {
        return Err(HttpError::not_found());
    }
    if p.contains_key("repo") {
        return Err(InferError::new(ErrorKind::Unsupported, "'repository_name' specification is not supported").into());
    }
    let model = p.get("model").cloned().unwrap_or_default();
    let body = read_body(&headers, body, s.options.max_input_size, BodyKind::Json).await?;
    let request = optional_json(&body)?;
    let params = request.as_ref().and_then(|r| r.get("parameters")).and_then(Value::as_object);
    if action == "load" {
        // Triton accepts only string parameters, 'config' (the model's config as JSON) and
        // 'file:<path>' (a file of the model, base64).
        let mut config = None;
        let mut files = Vec::new();
        for (key, value) in params.into_iter().flatten() {
            let Some(value) = value.as_str() else {
                return Err(HttpError::new(
                    StatusCode::BAD_REQUEST,
                    format!("load parameter '{key}' must be a string"),
                ));
            };
            if key == "config" {
                config = Some(value);
            } else if key.starts_with(tritium_server::FILE_PREFIX) {
                files.push(load_file(key, value)?);
            } else {
                return Err(HttpError::new(
                    StatusCode::BAD_REQUEST,
                    format!("unknown load parameter '{key}': the defined ones are 'config' and 'file:<path>'"),
                ));
            }
        }
        match (config, files.is_empty()) {
            (None, true) => s.backend.load_model(&model).await?,
            (Some(config), true) => s.backend.load_model_with_config(&model, config).await?,
            (config, false) => s.backend.load_model_with_files(&model, config, files).await?,
        }
    } else {
        let mut dependents = false;
        if let Some(v) = params.and_then(|p| p.get("unload_dependents")) {
            dependents = v.as_bool().ok_or_else(|| {
                HttpError::new(StatusCode::BAD_REQUEST, "Unable to parse 'unload_dependents': expected a boolean")
            })?;
        }
        if dependents {
            s.backend.unload_model_and_dependents(&model).await?;
        } else {
            s.backend.unload_model(&model).await?;
        }
    }
    Ok(json_response(StatusCode::OK, Body::empty()))
}

/// A `file:<path>` load parameter: its base64 text decoded (Triton's size limit first).
fn load_file(key: &str, value: &str) -> Result<tritium_server::ModelFile, HttpError> {
    if value.len() > i32::MAX as usize {
        return Err(InferError::invalid(format!("'{key}' exceeds the maximum allowed data size limit INT_MAX")).into());
    }
    let contents = base64::engine::general_purpose::STANDARD.decode(value.trim()).map_err(|e| {
        HttpError::new(StatusCode::BAD_REQUEST, format!("load parameter '{key}' is not valid base64: {e}"))
    })?;
    tritium_server::ModelFile::from_parameter(key, contents)
        .ok_or_else(|| HttpError::new(StatusCode::BAD_REQUEST, format!("unknown load parameter '{key}'")))
}

// ---- inference ----

async fn infer<B: Backend>(State(s): St<B>, m: ModelRef, headers: HeaderMap, body: Body) -> Response {
    match infer_inner(s, m, headers, body).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(status = %e.status, "infer failed: {}", e.message);
            e.into_response()
        }
    }
}

/// An inference in five steps: read the request's encodings, read and decompress its body,
/// decode it, run it, and encode the answer (compressed if the client accepts it).
async fn infer_inner<B: Backend>(s: AppState<B>, m: ModelRef, headers: HeaderMap, body: Body) -> HttpResult {
    // As Triton, which finds the model when it creates the request: an unknown model or version
    // is the answer whatever the body holds.
    let decoupled = match s.backend.model_decoupled(&m.name, m.version) {
        Ok(decoupled) => decoupled,
        Err(e) => {
            drain(body).await;
            return Err(e.into());
        }
    };
    if decoupled {
        drain(body).await;
        // Triton's text and code (`src/http_server.cc`).
        let text = "HTTP end point doesn't support models with decoupled transaction policy";
        return Err(InferError::new(ErrorKind::Unsupported, text).into());
    }
    let encodings = Encodings::of(&headers)?;
    let kind = BodyKind::of_infer(encodings.header_length.as_deref());
    if let Some(header) = oversized_header(encodings.header_length.as_deref(), s.options.max_input_size) {
        drain(body).await;
        return Err(InferError::from(TooLarge::body(BodyKind::Json, Some(header), s.options.max_input_size)).into());
    }
    let body = read_infer_body(&headers, body, encodings.request, s.options.max_input_size, kind).await?;
    let mut decoded = decode_infer(&*s.backend, m, body, encodings.header_length.as_deref()).await?;
    if !decoded.shm.is_empty() {
        codec::resolve_shm(&mut decoded, system_shm(&*s.backend)?)?;
    }
    if let Some(forward) = &s.options.header_forward {
        // Triton forwards after the request is built, so its own errors come first.
        let headers = headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()));
        decoded.request.parameters.extend(forward.parameters(headers)?);
    }
    decoded.request.trace = trace_parent(&headers);
    let specs = decoded.outputs;
    let response = s.backend.infer(decoded.request).await?;
    let json_outputs: usize =
        response.outputs.iter().filter(|o| !specs.format_for(&o.name).binary).map(|o| o.data.len()).sum();
    let encoded =
        cpu(json_outputs > BLOCKING_THRESHOLD / 4, move || codec::encode_infer_response(response, &specs)).await??;
    respond(encoded, encodings.response).await
}

/// The length of a JSON header (`Inference-Header-Content-Length`) over `limit`, if it is: the
/// header is JSON, and JSON is what `--http-max-input-size` limits.
fn oversized_header(header_length: Option<&str>, limit: usize) -> Option<u64> {
    header_length.and_then(|v| v.trim().parse::<u64>().ok()).filter(|&n| n > limit as u64)
}

/// What an inference request's headers say about its body and the answer's.
struct Encodings {
    /// The body's `Content-Encoding`.
    request: Encoding,
    /// The answer's encoding, from `Accept-Encoding`.
    response: Encoding,
    /// The `Inference-Header-Content-Length` value, if any.
    header_length: Option<String>,
}

impl Encodings {
    /// Step 1: reads the headers; an unsupported `Content-Encoding` names the ones accepted.
    fn of(headers: &HeaderMap) -> Result<Self, HttpError> {
        let request = compression::request_encoding(header_str(headers, &header::CONTENT_ENCODING)?).map_err(|e| {
            let mut err = HttpError::from(e);
            err.extra_header = Some((header::ACCEPT_ENCODING, HeaderValue::from_static("gzip, deflate")));
            err
        })?;
        let response = compression::response_encoding(header_str(headers, &header::ACCEPT_ENCODING)?);
        let header_length = header_str(headers, &INFERENCE_HEADER_CONTENT_LENGTH)?.map(str::to_owned);
        Ok(Self { request, response, header_length })
    }
}

/// Step 2: the whole body, decompressed (both within `limit`).
async fn read_infer_body(
    headers: &HeaderMap,
    body: Body,
    encoding: Encoding,
    limit: usize,
    kind: BodyKind,
) -> Result<Bytes, HttpError> {
    let body = read_body(headers, body, limit, kind).await?;
    if encoding == Encoding::Identity {
        return Ok(body);
    }
    let decompressed =
        cpu(body.len() > BLOCKING_THRESHOLD, move || compression::decompress(encoding, &body, limit)).await??;
    Ok(decompressed.into())
}

/// Step 3: the body as a request: raw (`Inference-Header-Content-Length: 0`, the whole body is
/// the model's only input) or a JSON header with optional binary data.
async fn decode_infer<B: Backend>(
    backend: &B,
    m: ModelRef,
    body: Bytes,
    header_length: Option<&str>,
) -> Result<codec::DecodedRequest, HttpError> {
    let header_length = header_length.map(|v| codec::parse_header_length(v, body.len())).transpose()?;
    let (name, version) = (m.name, m.version);
    if header_length == Some(0) {
        let meta = backend.model_metadata(&name, version)?;
        let max_batch = backend.model_max_batch_size(&name, version).unwrap_or(0);
        let spec = codec::raw_input_spec(&name, &meta, max_batch)?;
        return Ok(codec::decode_raw_request(&name, version, body, &spec)?);
    }
    let json_len = header_length.unwrap_or(body.len());
    Ok(cpu(json_len > BLOCKING_THRESHOLD, move || codec::decode_infer_request(&name, version, body, header_length))
        .await??)
}

/// Step 5: the HTTP response for an encoded answer; one that cannot be compressed goes out
/// uncompressed, as in Triton.
async fn respond(encoded: codec::EncodedResponse, encoding: Encoding) -> HttpResult {
    let mut builder = Response::builder().status(StatusCode::OK).header(header::CONTENT_TYPE, encoded.content_type());
    if encoded.has_binary() {
        builder = builder.header(INFERENCE_HEADER_CONTENT_LENGTH, encoded.json.len());
    }
    let body = if encoding == Encoding::Identity {
        Body::new(ChunkBody::new(std::iter::once(Bytes::from(encoded.json)).chain(encoded.binary)))
    } else {
        let heavy = encoded.len() > BLOCKING_THRESHOLD;
        let (compressed, encoded) = cpu(heavy, move || {
            let mut parts: Vec<&[u8]> = vec![&encoded.json];
            parts.extend(encoded.binary.iter().map(|b| &b[..]));
            let compressed = compression::compress(encoding, &parts);
            (compressed, encoded)
        })
        .await?;
        match compressed {
            Ok(c) => {
                builder = builder.header(header::CONTENT_ENCODING, encoding.as_str());
                Body::from(c)
            }
            Err(e) => {
                tracing::debug!("unable to compress response: {e}");
                Body::new(ChunkBody::new(std::iter::once(Bytes::from(encoded.json)).chain(encoded.binary)))
            }
        }
    };
    builder.body(body).map_err(|e| HttpError::from(InferError::internal(format!("failed to build the response: {e}"))))
}

// ---- the generate extension ----

async fn generate<B: Backend>(State(s): St<B>, m: ModelRef, headers: HeaderMap, body: Body) -> Response {
    generate_any(s, m, headers, body, false).await
}

async fn generate_stream<B: Backend>(State(s): St<B>, m: ModelRef, headers: HeaderMap, body: Body) -> Response {
    generate_any(s, m, headers, body, true).await
}

async fn generate_any<B: Backend>(
    s: AppState<B>,
    m: ModelRef,
    headers: HeaderMap,
    body: Body,
    streaming: bool,
) -> Response {
    match generate_inner(s, m, headers, body, streaming).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(status = %e.status, "generate failed: {}", e.message);
            e.into_response()
        }
    }
}

/// Triton's `HandleGenerate`: an error before the request is queued is a plain JSON error; after
/// that, the first response sets the status (its error's, or 200), and `/generate` answers the
/// one response (Triton's error when there is not exactly one), `/generate_stream` each
/// response as an event.
async fn generate_inner<B: Backend>(
    s: AppState<B>,
    m: ModelRef,
    headers: HeaderMap,
    body: Body,
    streaming: bool,
) -> HttpResult {
    let meta = match s.backend.model_metadata(&m.name, m.version) {
        Ok(meta) => meta,
        Err(e) => {
            drain(body).await;
            return Err(e.into());
        }
    };
    if !matches!(
        compression::request_encoding(header_str(&headers, &header::CONTENT_ENCODING)?),
        Ok(Encoding::Identity)
    ) {
        drain(body).await;
        return Err(InferError::invalid("Unsupported content-encoding, only 'identity' is supported.").into());
    }
    let body = read_body(&headers, body, s.options.max_input_size, BodyKind::Json).await?;
    let (name, version, limit) = (m.name, m.version, s.options.max_input_size);
    let mut request = cpu(body.len() > BLOCKING_THRESHOLD, move || {
        crate::generate::decode_generate_request(&name, version, &body, &meta, limit)
    })
    .await??;
    request.trace = trace_parent(&headers);
    let mut rx = s.backend.infer_stream(request)?;
    // Until the first message nothing is sent: it sets the status.
    let first = rx.recv().await.ok_or_else(|| HttpError::from(InferError::internal(LOST)))?;
    let mut last = first.is_last();
    let first = crate::generate::message_json(first);
    let status = first.as_ref().and_then(|(_, e)| e.as_ref()).map_or(StatusCode::OK, |e| status_for(e.kind));
    if streaming {
        let first = first.map(|(json, _)| crate::generate::sse_event(&json));
        let body = EventBody::new(first, (!last).then_some(rx));
        return Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .body(Body::new(body))
            .map_err(|e| HttpError::from(InferError::internal(format!("failed to build the response: {e}"))));
    }
    let mut responses: Vec<Vec<u8>> = first.into_iter().map(|(json, _)| json).collect();
    while !last {
        let Some(message) = rx.recv().await else { break };
        last = message.is_last();
        responses.extend(crate::generate::message_json(message).map(|(json, _)| json));
    }
    let body = match (responses.pop(), responses.is_empty()) {
        (Some(json), true) => json,
        _ => crate::generate::error_json(crate::generate::NOT_ONE_RESPONSE),
    };
    Ok(json_response(status, body))
}

/// A response stream that ended without its final message (the server lost the request).
const LOST: &str = "the server ended the request's responses without a final response";
