//! The axum routes: model discovery, and the two generation endpoints driving the model's
//! response stream into a whole answer or server-sent events; restricted API groups are
//! checked before routing.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tritium_server::restricted::{ApiGroup, Restrictions};
use tritium_server::ResponseStream;
use tritium_server::{ErrorKind, ModelMetadata, Server, Streamed};
use tritium_sync::Locked;

use crate::answer::{self, Reader, Truncated};
use crate::embeddings;
use crate::error::ApiError;
use crate::lora;
use crate::metrics::{Metrics, Tracker};
use crate::request::{parse, Endpoint, Generate};
use crate::shape::{build, read, Shape};
use crate::sse::{error_end, Completion};
use crate::template::{self, Templates};
use crate::tools::{self, Choice, ToolRequest};
use crate::Options;

/// The largest request body (a long chat history fits; a flood does not).
const MAX_BODY_BYTES: usize = 16 << 20;

/// Bodies larger than this are parsed on a blocking thread: a 10 MB `messages` list of small
/// messages takes the best part of a second to parse, and the async runtime (every frontend's
/// health checks) must not wait for it.
const PARSE_INLINE_BYTES: usize = 256 << 10;

struct Frontend {
    server: Server,
    options: Options,
    templates: Arc<Templates>,
    metrics: Arc<Metrics>,
    created: u64,
    next_id: AtomicU64,
    /// TensorRT-LLM adapters whose weights went to their model (model, adapter).
    registered: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn build_router(server: Server, options: Options) -> (Router, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let templates = Arc::new(Templates::new(options.chat_template.as_ref(), options.template_limits));
    let restrictions = options.restrictions.clone();
    let f = Arc::new(Frontend {
        server,
        options,
        templates,
        metrics: metrics.clone(),
        created: now_secs(),
        next_id: AtomicU64::new(0),
        registered: std::sync::Mutex::default(),
    });
    let router = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/models/{*model}", get(get_model))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .fallback(not_found)
        .with_state(f);
    if restrictions.is_empty() {
        return (router, metrics);
    }
    (router.layer(axum::middleware::from_fn_with_state(restrictions, restrict)), metrics)
}

/// The API group of an OpenAI path (`--http-restricted-api`), or `None` for an unknown one.
fn group_of(path: &str) -> Option<ApiGroup> {
    match path {
        "/v1/models" => Some(ApiGroup::Metadata),
        "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" => Some(ApiGroup::Inference),
        p if p.starts_with("/v1/models/") => Some(ApiGroup::Metadata),
        _ => None,
    }
}

/// Refuses a request of a restricted group whose header is missing or wrong, with Triton's
/// text in an OpenAI error (403).
async fn restrict(State(restrictions): State<Arc<Restrictions>>, req: Request, next: Next) -> Response {
    if let Some(group) = group_of(req.uri().path()) {
        if let Err(header) = restrictions.check_headers(group, |h| req.headers().get(h).map(|v| v.as_bytes())) {
            tracing::debug!(path = req.uri().path(), "refused: {group} is restricted");
            let mut e = ApiError::invalid(None, format!("This API is restricted, expecting header '{header}'"));
            e.status = StatusCode::FORBIDDEN;
            e.kind = "permission_error";
            return e.into_response();
        }
    }
    next.run(req).await
}

async fn not_found() -> Response {
    let mut e = ApiError::invalid(
        None,
        "no such endpoint: this server answers /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/models",
    );
    e.status = StatusCode::NOT_FOUND;
    e.into_response()
}

impl Frontend {
    /// The model's metadata and shape, or the 404 a client gets for it.
    fn resolve(&self, model: &str) -> Result<(ModelMetadata, Shape), ApiError> {
        let meta = self.server.model_metadata(model, None).map_err(|e| match e.kind {
            ErrorKind::NotFound => ApiError::model_not_found(model, "no such model is loaded"),
            _ => ApiError::from(e),
        })?;
        let shape = Shape::of(&meta).ok_or_else(|| {
            ApiError::model_not_found(
                model,
                "it is loaded but is not an LLM this frontend can drive (it needs a BYTES input text_input and a BYTES output text_output, plus a sampling_parameters input as vLLM's or a max_tokens input as TensorRT-LLM's)",
            )
        })?;
        Ok((meta, shape))
    }

    fn model_object(&self, name: &str, shape: &str) -> Value {
        json!({"id": name, "object": "model", "created": self.created, "owned_by": "tritium", "tritium_shape": shape})
    }

    /// The adapters of a model (`--lora-separator` set and a `multi_lora.json`).
    fn adapters(&self, meta: &ModelMetadata, shape: Shape) -> Option<Vec<String>> {
        self.options.lora_separator.as_ref()?;
        lora::adapters(&self.options.repository.join(&meta.name), &meta.versions, shape == Shape::Vllm)
    }

    /// Resolves a requested name that may select a LoRA adapter (`<model><SEP><adapter>`): the
    /// model, its shape and the adapter. An adapter the model does not list is a 404.
    fn resolve_named(&self, requested: &str) -> Result<(ModelMetadata, Shape, Option<String>), ApiError> {
        let (model, adapter) = lora::split(requested, self.options.lora_separator.as_deref());
        // A model whose own name holds the separator is that model, not an adapter.
        let adapter = adapter.filter(|_| self.server.model_metadata(requested, None).is_err());
        let Some(adapter) = adapter else {
            let (meta, shape) = self.resolve(requested)?;
            return Ok((meta, shape, None));
        };
        let (meta, shape) = self.resolve(model).map_err(|e| match e.code {
            Some("model_not_found") => ApiError::model_not_found(requested, "no such model is loaded"),
            _ => e,
        })?;
        match self.adapters(&meta, shape) {
            Some(list) if list.iter().any(|a| a == adapter) => Ok((meta, shape, Some(adapter.to_owned()))),
            _ => Err(ApiError::model_not_found(
                requested,
                &format!("Unknown LoRA: {adapter}; for model: {model} (its multi_lora.json does not list it)"),
            )),
        }
    }

    /// Adds a TensorRT-LLM adapter's inputs as Triton's frontend does: `lora_task_id`, and with
    /// the adapter's first request `lora_weights` and `lora_config` from its `.npy` files (the
    /// model caches the adapter by task id).
    async fn add_trtllm_lora(
        &self,
        meta: &ModelMetadata,
        adapter: &str,
        req: &mut tritium_server::InferRequest,
    ) -> Result<(), ApiError> {
        let Some(declared) = meta.inputs.iter().find(|t| t.name == "lora_task_id") else {
            return Err(ApiError::invalid(
                Some("model"),
                format!("model '{}' takes no LoRA adapters (it declares no lora_task_id input)", meta.name),
            ));
        };
        let repository = self.options.repository.clone();
        let model_dir = repository.join(&meta.name);
        let a = lora::trtllm_adapter(&repository, &model_dir, &meta.versions, adapter).map_err(ApiError::internal)?;
        req.inputs.push(tritium_server::InputTensor {
            name: "lora_task_id".into(),
            datatype: tritium_server::DataType::Uint64,
            shape: crate::shape::unit_shape(declared),
            data: a.task_id.to_le_bytes().to_vec().into(),
        });
        let key = (meta.name.clone(), adapter.to_owned());
        if self.registered.locked().contains(&key) {
            return Ok(());
        }
        let dir = a.dir.clone();
        let tensors = tokio::task::spawn_blocking(move || {
            ["lora_weights", "lora_config"]
                .into_iter()
                .map(|name| lora::read_npy(&dir.join(format!("model.{name}.npy"))).map(|t| (name, t)))
                .collect::<Result<Vec<_>, String>>()
        })
        .await
        .map_err(|e| ApiError::internal(format!("reading the LoRA adapter failed: {e}")))?
        .map_err(|e| ApiError::internal(format!("LoRA adapter '{adapter}': {e}")))?;
        for (name, t) in tensors {
            req.inputs.push(tritium_server::InputTensor {
                name: name.into(),
                datatype: t.datatype,
                shape: t.shape,
                data: t.data.into(),
            });
        }
        self.registered.locked().insert(key);
        Ok(())
    }

    /// The prompt: a completion's own, or the chat messages rendered with the model's template
    /// (off the async runtime; the messages are taken out of `g`).
    async fn prompt(&self, g: &mut Generate, meta: &ModelMetadata, tools: &ToolRequest) -> Result<String, ApiError> {
        match g.endpoint {
            Endpoint::Completion => Ok(std::mem::take(&mut g.prompt)),
            Endpoint::Chat => {
                let places = template::candidates(&self.options.repository.join(&meta.name), &meta.versions);
                let tools = tools.tools.clone().map(Value::Array);
                self.templates.render(&meta.name, places, std::mem::take(&mut g.messages), tools).await
            }
        }
    }

    /// Starts the inference: the model's responses, on a decoupled model's stream or as the one
    /// answer of another.
    fn start(&self, req: tritium_server::InferRequest) -> Result<ResponseStream, ApiError> {
        if self.server.is_decoupled(&req.model, None)? {
            return Ok(self.server.infer_decoupled(req)?);
        }
        let (tx, rx) = tritium_server::response_stream();
        let server = self.server.clone();
        tokio::spawn(async move {
            let result = server.infer(req).await;
            tx.send(Streamed::Response { result, last: true });
        });
        Ok(rx)
    }
}

/// The ids `/v1/models` lists for one model: the model and each of its adapters, or an
/// embedding model.
fn model_ids(f: &Frontend, meta: &ModelMetadata) -> Vec<Value> {
    if let Some(shape) = Shape::of(meta) {
        let mut out = vec![f.model_object(&meta.name, shape.name())];
        if let (Some(sep), Some(list)) = (&f.options.lora_separator, f.adapters(meta, shape)) {
            out.extend(list.iter().map(|a| f.model_object(&format!("{}{sep}{a}", meta.name), shape.name())));
        }
        return out;
    }
    if embeddings::is_embedding(meta) {
        return vec![f.model_object(&meta.name, "vllm_embedding")];
    }
    Vec::new()
}

async fn list_models(State(f): State<Arc<Frontend>>) -> Response {
    let mut names: Vec<String> = f.server.repository_index(true).into_iter().map(|e| e.name).collect();
    names.dedup();
    let data: Vec<Value> = names
        .iter()
        .filter_map(|n| f.server.model_metadata(n, None).ok())
        .flat_map(|meta| model_ids(&f, &meta))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn get_model(State(f): State<Arc<Frontend>>, Path(model): Path<String>) -> Response {
    if let Ok(meta) = f.server.model_metadata(&model, None) {
        if embeddings::is_embedding(&meta) && Shape::of(&meta).is_none() {
            return Json(f.model_object(&model, "vllm_embedding")).into_response();
        }
    }
    match f.resolve_named(&model) {
        Ok((_, shape, _)) => Json(f.model_object(&model, shape.name())).into_response(),
        Err(e) => e.into_response(),
    }
}

/// How much of a refused body is read and thrown away so that the client, still sending it,
/// reads the 413 instead of a broken pipe (as the HTTP frontend does). Past this the connection
/// is closed.
const DRAIN_MAX: usize = 64 << 20;

fn too_large() -> ApiError {
    let mut e = ApiError::invalid(
        None,
        format!("the request body is larger than the limit of {MAX_BODY_BYTES} bytes of the OpenAI frontend"),
    );
    e.status = StatusCode::PAYLOAD_TOO_LARGE;
    e
}

/// Reads and discards up to [`DRAIN_MAX`] bytes of a refused body, holding none of it.
async fn drain(mut body: axum::body::BodyDataStream) {
    use futures_util::StreamExt;

    let mut left = DRAIN_MAX;
    while let Some(Ok(data)) = body.next().await {
        if data.len() >= left {
            break;
        }
        left -= data.len();
    }
}

/// Reads a request's body up to [`MAX_BODY_BYTES`]; a longer one (by its `Content-Length`, or
/// once the bytes pass the limit) is drained and answered 413.
async fn read_body(req: Request) -> Result<Bytes, ApiError> {
    use futures_util::StreamExt;

    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let mut body = req.into_body().into_data_stream();
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        drain(body).await;
        return Err(too_large());
    }
    // A declared length is only a claim: reserve at most the limit, and grow with the data.
    let reserve = declared.and_then(|n| usize::try_from(n).ok()).unwrap_or(0).min(MAX_BODY_BYTES);
    let mut buf = bytes::BytesMut::with_capacity(reserve);
    while let Some(data) = body.next().await {
        let data = data.map_err(|e| ApiError::invalid(None, format!("cannot read the request body: {e}")))?;
        if buf.len().saturating_add(data.len()) > MAX_BODY_BYTES {
            drain(body).await;
            return Err(too_large());
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

async fn chat(State(f): State<Arc<Frontend>>, req: Request) -> Response {
    match read_body(req).await {
        Ok(body) => generate(f, Endpoint::Chat, body).await.unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    }
}

async fn embeddings(State(f): State<Arc<Frontend>>, req: Request) -> Response {
    match read_body(req).await {
        Ok(body) => embed(f, body).await.unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    }
}

/// `/v1/embeddings`: one inference per input, run concurrently.
async fn embed(f: Arc<Frontend>, body: Bytes) -> Result<Response, ApiError> {
    let start = Instant::now();
    let r = embeddings::parse(&body)?;
    // As Triton's frontend, an adapter suffix is ignored for embeddings.
    let (base, _) = lora::split(&r.model, f.options.lora_separator.as_deref());
    let meta = f.server.model_metadata(&r.model, None).or_else(|_| f.server.model_metadata(base, None));
    let meta = meta.map_err(|e| match e.kind {
        ErrorKind::NotFound => ApiError::model_not_found(&r.model, "no such model is loaded"),
        _ => ApiError::from(e),
    })?;
    if !embeddings::is_embedding(&meta) {
        return Err(match Shape::of(&meta) {
            Some(Shape::TensorRtLlm) => ApiError::invalid(
                Some("model"),
                format!("model '{}' is TensorRT-LLM-shaped: TRT-LLM backend and Python backend do not support embedding requests", r.model),
            ),
            _ => ApiError::invalid(
                Some("model"),
                format!("model '{}' is not an embedding model (it needs a BYTES input embedding_request and a BYTES output text_output, as vLLM's embedding models)", r.model),
            ),
        });
    }
    let mut tracker = Tracker::new(f.metrics.clone(), &meta.name, "embeddings", start);
    tracker.finish("error");
    let jobs = r.inputs.iter().map(|input| {
        let f = f.clone();
        let meta = &meta;
        let r = &r;
        async move {
            let mut rx = f.start(embeddings::build(meta, r, input)?)?;
            let mut answer = None;
            while let Some(msg) = rx.recv().await {
                let last = msg.is_last();
                if let Some(a) = embeddings::read_answer(&r.model, msg)? {
                    answer.get_or_insert(a);
                }
                if last {
                    break;
                }
            }
            answer.ok_or_else(|| ApiError::internal(format!("embedding model '{}' sent no embedding", r.model)))
        }
    });
    let answers = futures_util::future::try_join_all(jobs).await?;
    tracker.response();
    let mut tokens = Some(0u64);
    let data = answers
        .into_iter()
        .map(|(vector, n)| {
            tokens = tokens.zip(n).map(|(a, b)| a + b);
            embeddings::encode_embedding(&vector, r.base64)
        })
        .collect();
    tracker.finish("success");
    Ok(Json(embeddings::response(&r.model, data, tokens)).into_response())
}

async fn completions(State(f): State<Arc<Frontend>>, req: Request) -> Response {
    match read_body(req).await {
        Ok(body) => generate(f, Endpoint::Completion, body).await.unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    }
}

/// A whole answer that grew past `--max-output-bytes`.
fn too_long(model: &str, limit: u64) -> ApiError {
    ApiError::internal(format!(
        "model '{model}' answered with more than the limit of {limit} bytes of text for one whole answer (server flag --max-output-bytes); ask for fewer tokens (max_tokens), or stream the answer (\"stream\": true), which has no such limit"
    ))
}

fn lost() -> ApiError {
    ApiError::internal("the server lost the request's responses; retry it")
}

async fn generate(f: Arc<Frontend>, endpoint: Endpoint, body: Bytes) -> Result<Response, ApiError> {
    let start = Instant::now();
    let mut g = if body.len() > PARSE_INLINE_BYTES {
        tokio::task::spawn_blocking(move || parse(endpoint, &body))
            .await
            .map_err(|e| ApiError::internal(format!("parsing the request failed: {e}")))??
    } else {
        parse(endpoint, &body)?
    };
    let (meta, shape, adapter) = f.resolve_named(&g.model)?;
    let mut trtllm_adapter = None;
    match (adapter, shape) {
        (Some(adapter), Shape::Vllm) => {
            g.sampling_parameters.insert("lora_name".into(), Value::String(adapter));
        }
        (Some(adapter), Shape::TensorRtLlm) => trtllm_adapter = Some(adapter),
        (None, _) => {}
    }
    if g.logprobs.is_some() {
        let declared = meta.inputs.iter().any(|t| t.name == "return_logprobs");
        if shape != Shape::Vllm || !declared {
            return Err(ApiError::invalid(
                Some("logprobs"),
                format!("model '{}' cannot return logprobs: they are available only for vLLM-shaped models that declare a return_logprobs input (this one is {}{})", g.model, shape.name(), if declared { "" } else { ", without return_logprobs" }),
            ));
        }
    }
    let label = match endpoint {
        Endpoint::Chat => "chat",
        Endpoint::Completion => "completions",
    };
    let mut tracker = Tracker::new(f.metrics.clone(), &meta.name, label, start);
    tracker.finish("error");
    let tool_request = match endpoint {
        Endpoint::Chat => tools::parse_request(g.tools.as_ref(), g.tool_choice.as_ref(), f.options.tool_call_parser)?,
        Endpoint::Completion => ToolRequest::default(),
    };
    if let Choice::Named { schema: Some(schema), .. } = &tool_request.choice {
        // Guided decoding to the function's parameters, as Triton asks vLLM and TensorRT-LLM.
        if shape == Shape::Vllm {
            let guided = json!({"json": schema.to_string()}).to_string();
            g.sampling_parameters.insert("structured_outputs".into(), Value::String(guided));
        }
        g.guided_json = Some(schema.to_string());
    }
    let prompt = f.prompt(&mut g, &meta, &tool_request).await?;
    let mut req = build(shape, &meta, &g, &prompt)?;
    if let Some(adapter) = trtllm_adapter {
        f.add_trtllm_lora(&meta, &adapter, &mut req).await?;
    }
    let mut rx = f.start(req)?;
    let n = f.next_id.fetch_add(1, Ordering::Relaxed);
    let created = now_secs();
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let mut c = Completion::new(format!("{prefix}-{created:x}{n:06x}"), created, &g);
    let seed = created.rotate_left(20) ^ n;
    let call_id = format!("call-{created:x}{n:06x}");
    let reader = Reader::new(
        &tool_request.choice,
        f.options.tool_call_parser,
        seed,
        f.options.max_tool_call_parse_bytes,
        &call_id,
    );
    // The first message decides the status: an error before any text is an HTTP error.
    let first = rx.recv().await.ok_or_else(lost)?;
    tracker.response();
    if let Streamed::Response { result: Err(e), .. } = first {
        return Err(e.into());
    }
    if g.stream {
        tracker.finish("cancelled");
        let stream = futures_util::stream::unfold(
            StreamState { c, rx, pending: Some(first), opened: false, done: false, tracker, reader },
            next_events,
        );
        return Ok((
            [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
            Body::from_stream(stream),
        )
            .into_response());
    }
    let mut text = String::new();
    let mut msg = first;
    loop {
        let last = msg.is_last();
        match msg {
            Streamed::Response { result: Ok(resp), .. } => {
                let piece = read(&resp)
                    .map_err(|e| ApiError::internal(format!("model '{}' answered badly: {e}", meta.name)))?;
                let bytes = text.len().saturating_add(piece.text.len());
                if u64::try_from(bytes).unwrap_or(u64::MAX) > f.options.max_output_bytes {
                    // Returning drops the stream, which cancels the request in the model.
                    return Err(too_long(&meta.name, f.options.max_output_bytes));
                }
                text.push_str(&piece.text);
                c.absorb(&piece);
            }
            Streamed::Response { result: Err(e), .. } => return Err(e.into()),
            Streamed::Final => {}
        }
        if last {
            break;
        }
        msg = rx.recv().await.ok_or_else(lost)?;
        tracker.response();
    }
    tracker.finish("success");
    if endpoint == Endpoint::Chat {
        let (message, finish) = answer::whole(&tool_request.choice, f.options.tool_call_parser, seed, &call_id, &text);
        c.finish_override = finish;
        return Ok(Json(c.whole_message(message, &text)).into_response());
    }
    Ok(Json(c.whole(&text)).into_response())
}

struct StreamState {
    c: Completion,
    rx: ResponseStream,
    pending: Option<Streamed>,
    opened: bool,
    done: bool,
    tracker: Tracker,
    reader: Reader,
}

/// The events for the next model message (the chat opening chunk before the first).
async fn next_events(mut s: StreamState) -> Option<(Result<Bytes, Infallible>, StreamState)> {
    if s.done {
        return None;
    }
    let mut out = String::new();
    if !s.opened {
        s.opened = true;
        if let Some(open) = s.c.opening() {
            out.push_str(&open);
        }
    }
    let msg = match s.pending.take() {
        Some(m) => Some(m),
        None => {
            let m = s.rx.recv().await;
            if m.is_some() {
                s.tracker.response();
            }
            m
        }
    };
    let fail = |out: &mut String, s: &mut StreamState, e: ApiError| {
        out.push_str(&error_end(&e.body()));
        s.done = true;
        s.tracker.finish("error");
    };
    match msg {
        None => fail(&mut out, &mut s, lost()),
        Some(msg) => {
            let last = msg.is_last();
            match msg {
                Streamed::Response { result: Ok(resp), .. } => match read(&resp) {
                    Ok(piece) => {
                        s.c.absorb(&piece);
                        if s.reader.is_plain() {
                            let lp = s.c.take_last_logprobs();
                            if !piece.text.is_empty() || lp.is_some() {
                                out.push_str(&s.c.delta_with_logprobs(&piece.text, lp));
                            }
                        } else {
                            match s.reader.step(&piece.text) {
                                Ok(deltas) => deltas.into_iter().for_each(|d| out.push_str(&s.c.delta_value(d))),
                                Err(Truncated) => {
                                    // Past --max-tool-call-parse-bytes: end with "length" and
                                    // cancel the generation (dropping its stream), as Triton does.
                                    tracing::warn!(model = %s.c.model, "a streamed tool-call parse passed --max-tool-call-parse-bytes; the answer is cut");
                                    s.c.finish_override = Some("length");
                                    out.push_str(&s.c.closing());
                                    s.done = true;
                                    s.tracker.finish("success");
                                    let (_tx, closed) = tritium_server::response_stream();
                                    s.rx = closed;
                                    return Some((Ok(Bytes::from(out)), s));
                                }
                            }
                        }
                    }
                    Err(e) => {
                        let e = ApiError::internal(format!("model '{}' answered badly: {e}", s.c.model));
                        fail(&mut out, &mut s, e);
                    }
                },
                Streamed::Response { result: Err(e), .. } => fail(&mut out, &mut s, e.into()),
                Streamed::Final => {}
            }
            if last && !s.done {
                for d in s.reader.end() {
                    out.push_str(&s.c.delta_value(d));
                }
                if let Some(reason) = s.reader.finish_reason() {
                    s.c.finish_override = Some(reason);
                }
                out.push_str(&s.c.closing());
                s.done = true;
                s.tracker.finish("success");
            }
        }
    }
    Some((Ok(Bytes::from(out)), s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tritium_server::{DataType, InferError, InferResponse, OutputTensor};

    fn text(s: &str) -> Streamed {
        let resp = InferResponse {
            model: "m".into(),
            version: 1,
            id: String::new(),
            outputs: vec![OutputTensor {
                name: "text_output".into(),
                datatype: DataType::Bytes,
                shape: vec![1],
                data: crate::shape::bytes_elements([s]),
            }],
            parameters: Vec::new(),
        };
        Streamed::Response { result: Ok(resp), last: false }
    }

    async fn run(body: &str, messages: Vec<Streamed>) -> (Vec<String>, String) {
        let g = parse(Endpoint::Completion, body.as_bytes()).expect("valid");
        let (tx, rx) = tritium_server::response_stream();
        let mut messages = messages.into_iter();
        let first = messages.next().expect("a first message");
        for m in messages {
            assert!(tx.send(m));
        }
        drop(tx);
        let metrics = Arc::new(Metrics::default());
        let tracker = Tracker::new(metrics.clone(), "m", "completions", Instant::now());
        let state = StreamState {
            c: Completion::new("id".into(), 1, &g),
            rx,
            pending: Some(first),
            opened: false,
            done: false,
            tracker,
            reader: Reader::Plain,
        };
        let chunks: Vec<String> = futures_util::stream::unfold(state, next_events)
            .map(|b| String::from_utf8(b.expect("infallible").to_vec()).expect("utf-8"))
            .collect()
            .await;
        let events = chunks.concat().split("\n\n").filter(|e| !e.is_empty()).map(str::to_owned).collect();
        (events, metrics.render())
    }

    #[tokio::test]
    async fn streams_deltas_then_finish_and_done() {
        let (events, metrics) =
            run(r#"{"model":"m","prompt":"p","stream":true}"#, vec![text("a"), text(""), text("b"), Streamed::Final])
                .await;
        assert_eq!(events.len(), 4, "{events:?}");
        assert!(events[0].contains(r#""text":"a""#) && events[1].contains(r#""text":"b""#), "{events:?}");
        assert!(events[2].contains(r#""finish_reason":"stop""#), "{events:?}");
        assert_eq!(events[3], "data: [DONE]");
        assert!(metrics.contains(r#"outcome="success"} 1"#), "{metrics}");
    }

    #[tokio::test]
    async fn a_model_error_mid_stream_is_an_error_event() {
        let err = Streamed::Response { result: Err(InferError::internal("boom")), last: true };
        let (events, metrics) = run(r#"{"model":"m","prompt":"p","stream":true}"#, vec![text("a"), err]).await;
        assert_eq!(events.len(), 3, "{events:?}");
        let body: Value = serde_json::from_str(events[1].trim_start_matches("data: ")).expect("json");
        assert_eq!(body["error"]["message"], "boom");
        assert_eq!(body["error"]["type"], "server_error");
        assert_eq!(events[2], "data: [DONE]");
        assert!(metrics.contains(r#"outcome="error"} 1"#), "{metrics}");
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_413_and_drained() {
        let request = |body: Body, length: Option<usize>| {
            let mut r = axum::http::Request::builder().method("POST").uri("/v1/completions");
            if let Some(n) = length {
                r = r.header(header::CONTENT_LENGTH, n);
            }
            r.body(body).expect("request")
        };
        let small = read_body(request(Body::from("{}"), Some(2))).await.expect("read");
        assert_eq!(&small[..], b"{}");
        let big = vec![b'x'; MAX_BODY_BYTES + 1];
        let e = read_body(request(Body::from(big.clone()), Some(big.len()))).await.expect_err("declared too large");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(e.message.contains(&MAX_BODY_BYTES.to_string()), "{}", e.message);
        // Without a length, in pieces: refused once the bytes pass the limit.
        let pieces = futures_util::stream::iter(
            big.chunks(1 << 20).map(|c| Ok::<_, std::io::Error>(Bytes::copy_from_slice(c))).collect::<Vec<_>>(),
        );
        let e = read_body(request(Body::from_stream(pieces), None)).await.expect_err("streamed too large");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn paths_fall_in_tritons_groups() {
        for (path, group) in [
            ("/v1/models", Some(ApiGroup::Metadata)),
            ("/v1/models/tiny_llm", Some(ApiGroup::Metadata)),
            ("/v1/models/org/model", Some(ApiGroup::Metadata)),
            ("/v1/chat/completions", Some(ApiGroup::Inference)),
            ("/v1/completions", Some(ApiGroup::Inference)),
            ("/v1/embeddings", Some(ApiGroup::Inference)),
            ("/v1/modelsx", None),
            ("/v2/health/live", None),
        ] {
            assert_eq!(group_of(path), group, "{path}");
        }
    }

    #[tokio::test]
    async fn restricted_groups_are_refused_before_the_handler() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let mut restrictions = Restrictions::default();
        restrictions.add("inference:infer-key=s3cret", "http-restricted-api", "", "api").expect("valid");
        let app = Router::new()
            .route("/v1/completions", post(|| async { "ran" }))
            .route("/v1/models", get(|| async { "listed" }))
            .layer(axum::middleware::from_fn_with_state(Arc::new(restrictions), restrict));
        let call = |path: &'static str, key: Option<&'static str>| {
            let app = app.clone();
            async move {
                let mut req = axum::http::Request::builder().uri(path);
                req = req.method(if path == "/v1/models" { "GET" } else { "POST" });
                if let Some(k) = key {
                    req = req.header("Infer-Key", k);
                }
                let resp = app.oneshot(req.body(Body::empty()).expect("request")).await.expect("infallible");
                let status = resp.status();
                let body = resp.into_body().collect().await.expect("body").to_bytes();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };
        let (status, body) = call("/v1/completions", None).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let body: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(body["error"]["message"], "This API is restricted, expecting header 'infer-key'");
        assert_eq!(body["error"]["type"], "permission_error");
        assert_eq!(call("/v1/completions", Some("wrong")).await.0, StatusCode::FORBIDDEN);
        assert_eq!(call("/v1/completions", Some("s3cret")).await, (StatusCode::OK, "ran".into()));
        assert_eq!(call("/v1/models", None).await, (StatusCode::OK, "listed".into()), "metadata is open");
    }

    #[tokio::test]
    async fn a_stream_lost_without_final_is_an_error_not_a_hang() {
        let (events, _) = run(r#"{"model":"m","prompt":"p","stream":true}"#, vec![text("a")]).await;
        assert!(events[1].contains("lost the request"), "{events:?}");
        assert_eq!(events.last().map(String::as_str), Some("data: [DONE]"));
    }
}
