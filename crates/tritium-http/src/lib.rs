//! tritium's KServe v2 HTTP/REST frontend, compatible with Triton's HTTP server as
//! `tritonclient.http` and `perf_analyzer -i http` use it: health, metadata, config, inference
//! (JSON and the binary tensor data extension, gzip/deflate bodies), statistics, the model
//! repository extension, the system shared memory extension, the trace extension, and
//! placeholders for the CUDA shared-memory extension.
//!
//! [`router`] builds the axum router over a [`tritium_server::Server`]; [`serve`] runs it on a
//! listener until a shutdown future completes. The wire codec lives in [`codec`] as plain
//! functions.

use std::future::Future;
use std::sync::Arc;

use tritium_server::forward::HeaderForward;
use tritium_server::restricted::Restrictions;
use tritium_server::trace::UpdateValue;
use tritium_server::{
    ErrorKind, IndexEntry, InferError, InferRequest, InferResponse, InstanceStacks, LogSettings, LogSettingsUpdate,
    ModelMetadata, ModelStats, ResponseStream, Server, ServerMetadata, Streamed, TraceSettingsView,
};

mod body;
pub mod codec;
pub mod compression;
mod error;
pub mod front_door;
pub mod generate;
mod json_out;
pub mod limits;
mod routes;

pub use error::{error_body, status_for};

pub use limits::DEFAULT_MAX_INPUT_SIZE;

/// Frontend options.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--http-max-input-size`: the largest request body accepted (JSON header and binary data
    /// together), before and after decompression.
    pub max_input_size: usize,
    /// `--http-restricted-api`: the groups whose requests need a header.
    pub restrictions: Arc<Restrictions>,
    /// `--http-header-forward-pattern`: headers of `/infer` requests forwarded to the model as
    /// request parameters.
    pub header_forward: Option<HeaderForward>,
    /// `--admin-token`: lets peers that are not on loopback use the admin endpoints (a stub's
    /// live stacks) when they send it as `authorization: Bearer <token>`.
    pub admin_token: Option<Arc<str>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_input_size: DEFAULT_MAX_INPUT_SIZE,
            restrictions: Arc::default(),
            header_forward: None,
            admin_token: None,
        }
    }
}

/// What the HTTP frontend needs from the core. [`Server`] implements it; tests and embedders
/// may supply their own.
pub trait Backend: Send + Sync + 'static {
    /// Runs one inference.
    fn infer(&self, req: InferRequest) -> impl Future<Output = Result<InferResponse, InferError>> + Send;
    /// Starts one inference on any model (the generate extension): its responses come on the
    /// stream, the last one final; one response for a model that is not decoupled. An error
    /// returned here happened before the request was queued. Dropping the receiver cancels
    /// the request. Unsupported unless implemented.
    fn infer_stream(&self, _req: InferRequest) -> Result<ResponseStream, InferError> {
        Err(InferError::new(ErrorKind::Unsupported, "the generate extension is not supported by this server"))
    }
    /// Liveness.
    fn live(&self) -> bool;
    /// Readiness.
    fn ready(&self) -> bool;
    /// Server metadata.
    fn metadata(&self) -> ServerMetadata;
    /// A model's metadata.
    fn model_metadata(&self, name: &str, version: Option<i64>) -> Result<ModelMetadata, InferError>;
    /// A model's config as Triton's JSON.
    fn model_config_json(&self, name: &str, version: Option<i64>) -> Result<String, InferError>;
    /// A model's `max_batch_size` (read from its JSON config unless implemented).
    fn model_max_batch_size(&self, name: &str, version: Option<i64>) -> Result<i64, InferError> {
        self.model_config_json(name, version).map(|c| codec::max_batch_size(&c))
    }
    /// Whether a model (version) is decoupled, which `/infer` refuses (false unless implemented);
    /// an error for a model or version the server does not have.
    fn model_decoupled(&self, _name: &str, _version: Option<i64>) -> Result<bool, InferError> {
        Ok(false)
    }
    /// Whether a model (version) is ready.
    fn model_ready(&self, name: &str, version: Option<i64>) -> bool;
    /// The repository index.
    fn repository_index(&self, ready_only: bool) -> Vec<IndexEntry>;
    /// Loads (or reloads) a model.
    fn load_model(&self, name: &str) -> impl Future<Output = Result<(), InferError>> + Send;
    /// Loads (or reloads) a model with `config` (JSON) instead of its config in the repository
    /// (the `config` load parameter); refused unless implemented.
    fn load_model_with_config(&self, name: &str, _config: &str) -> impl Future<Output = Result<(), InferError>> + Send {
        let text = format!("loading '{name}' with a 'config' parameter is not supported by this server");
        async move { Err(InferError::new(ErrorKind::Unsupported, text)) }
    }
    /// Loads (or reloads) a model with an optional `config` (JSON) and `file:<path>` files (the
    /// load parameters), from a directory holding the files; refused unless implemented.
    fn load_model_with_files(
        &self,
        name: &str,
        _config: Option<&str>,
        _files: Vec<tritium_server::ModelFile>,
    ) -> impl Future<Output = Result<(), InferError>> + Send {
        let text = format!("loading '{name}' with 'file:' parameters is not supported by this server");
        async move { Err(InferError::new(ErrorKind::Unsupported, text)) }
    }
    /// Unloads a model.
    fn unload_model(&self, name: &str) -> impl Future<Output = Result<(), InferError>> + Send;
    /// Unloads a model and, for an ensemble, the step models nothing else uses
    /// (`unload_dependents`); without ensembles, the same as [`Backend::unload_model`].
    fn unload_model_and_dependents(&self, name: &str) -> impl Future<Output = Result<(), InferError>> + Send {
        self.unload_model(name)
    }
    /// Statistics for one model (and version) or all.
    fn statistics(&self, name: Option<&str>, version: Option<i64>) -> Result<Vec<ModelStats>, InferError>;
    /// The log settings (the logging extension); unsupported unless implemented.
    fn log_settings(&self) -> Result<LogSettings, InferError> {
        Err(InferError::unavailable("the server does not support dynamic logging"))
    }
    /// Changes log settings.
    fn update_log_settings(&self, _update: LogSettingsUpdate) -> Result<LogSettings, InferError> {
        Err(InferError::unavailable("the server does not support dynamic logging"))
    }
    /// The trace settings of a model, or the global ones (the trace extension); unavailable
    /// unless implemented.
    fn trace_settings(&self, _model: Option<&str>) -> Result<TraceSettingsView, InferError> {
        Err(InferError::unavailable("the server does not support tracing"))
    }
    /// Updates trace settings from the request's named values.
    fn update_trace_settings(
        &self,
        _model: Option<&str>,
        _values: &[(String, UpdateValue)],
    ) -> Result<TraceSettingsView, InferError> {
        Err(InferError::unavailable("the server does not support tracing"))
    }
    /// The system shared memory extension's regions; `None` (unsupported) unless implemented.
    fn system_shm(&self) -> Option<&tritium_server::shm::ShmRegistry> {
        None
    }
    /// Whether `caller` may use the admin endpoint `what`; the refusal's text otherwise.
    /// Refused unless implemented.
    fn authorize_admin(&self, what: &str, _caller: AdminCaller<'_>) -> Result<(), String> {
        Err(format!("{what} is not available on this server"))
    }
    /// The live Python stacks of a model's stubs (tritium's `/tritium/models/{model}/stacks`);
    /// unsupported unless implemented.
    fn stacks(
        &self,
        _model: &str,
        _instance: Option<&str>,
    ) -> impl Future<Output = Result<Vec<InstanceStacks>, InferError>> + Send {
        async { Err(InferError::new(ErrorKind::Unsupported, "this server has no stacks endpoint")) }
    }
}

/// Who calls an admin endpoint: their address, the `authorization` header they sent, and the
/// server's admin token.
#[derive(Debug, Clone, Copy)]
pub struct AdminCaller<'a> {
    /// The peer's address, when known.
    pub peer: Option<std::net::SocketAddr>,
    /// The `authorization` header's value.
    pub authorization: Option<&'a [u8]>,
    /// `--admin-token`.
    pub token: Option<&'a str>,
}

impl Backend for Server {
    fn infer(&self, req: InferRequest) -> impl Future<Output = Result<InferResponse, InferError>> + Send {
        Server::infer(self, req)
    }
    fn infer_stream(&self, req: InferRequest) -> Result<ResponseStream, InferError> {
        if Server::is_decoupled(self, &req.model, req.version).unwrap_or(false) {
            return Server::infer_decoupled(self, req);
        }
        let answer = Server::infer_queued(self, req)?;
        let (tx, rx) = tritium_server::response_stream();
        tokio::spawn(async move {
            // A receiver dropped before the answer (the client went away) drops the wait, and
            // with it the request's reply, which the core takes as its cancellation.
            tokio::select! {
                result = answer => {
                    tx.send(Streamed::Response { result, last: true });
                }
                () = tx.closed() => {}
            }
        });
        Ok(rx)
    }
    fn live(&self) -> bool {
        Server::live(self)
    }
    fn ready(&self) -> bool {
        Server::ready(self)
    }
    fn metadata(&self) -> ServerMetadata {
        Server::metadata(self)
    }
    fn model_metadata(&self, name: &str, version: Option<i64>) -> Result<ModelMetadata, InferError> {
        Server::model_metadata(self, name, version)
    }
    fn model_config_json(&self, name: &str, version: Option<i64>) -> Result<String, InferError> {
        Server::model_config_json(self, name, version)
    }
    fn model_max_batch_size(&self, name: &str, version: Option<i64>) -> Result<i64, InferError> {
        Server::model_max_batch_size(self, name, version)
    }
    fn model_decoupled(&self, name: &str, version: Option<i64>) -> Result<bool, InferError> {
        Server::is_decoupled(self, name, version)
    }
    fn model_ready(&self, name: &str, version: Option<i64>) -> bool {
        Server::model_ready(self, name, version)
    }
    fn repository_index(&self, ready_only: bool) -> Vec<IndexEntry> {
        Server::repository_index(self, ready_only)
    }
    fn load_model(&self, name: &str) -> impl Future<Output = Result<(), InferError>> + Send {
        Server::load_model(self, name)
    }
    fn load_model_with_config(&self, name: &str, config: &str) -> impl Future<Output = Result<(), InferError>> + Send {
        Server::load_model_with_config(self, name, config)
    }
    fn load_model_with_files(
        &self,
        name: &str,
        config: Option<&str>,
        files: Vec<tritium_server::ModelFile>,
    ) -> impl Future<Output = Result<(), InferError>> + Send {
        Server::load_model_with_files(self, name, config, files)
    }
    fn unload_model(&self, name: &str) -> impl Future<Output = Result<(), InferError>> + Send {
        Server::unload_model(self, name)
    }
    fn unload_model_and_dependents(&self, name: &str) -> impl Future<Output = Result<(), InferError>> + Send {
        Server::unload_model_and_dependents(self, name)
    }
    fn statistics(&self, name: Option<&str>, version: Option<i64>) -> Result<Vec<ModelStats>, InferError> {
        Server::statistics(self, name, version)
    }
    fn log_settings(&self) -> Result<LogSettings, InferError> {
        Server::log_settings(self)
    }
    fn update_log_settings(&self, update: LogSettingsUpdate) -> Result<LogSettings, InferError> {
        Server::update_log_settings(self, update)
    }
    fn trace_settings(&self, model: Option<&str>) -> Result<TraceSettingsView, InferError> {
        Server::trace_settings(self, model)
    }
    fn update_trace_settings(
        &self,
        model: Option<&str>,
        values: &[(String, UpdateValue)],
    ) -> Result<TraceSettingsView, InferError> {
        Server::update_trace_settings(self, model, values)
    }
    fn system_shm(&self) -> Option<&tritium_server::shm::ShmRegistry> {
        Some(Server::shm(self))
    }
    fn authorize_admin(&self, what: &str, caller: AdminCaller<'_>) -> Result<(), String> {
        tritium_server::admin_access::authorize(self, what, caller.peer, caller.authorization, caller.token)
    }
    fn stacks(
        &self,
        model: &str,
        instance: Option<&str>,
    ) -> impl Future<Output = Result<Vec<InstanceStacks>, InferError>> + Send {
        let (server, model, instance) = (self.clone(), model.to_string(), instance.map(str::to_string));
        async move { server.stacks(&model, instance.as_deref()).await }
    }
}

/// The HTTP router over `server`, with default [`Options`].
pub fn router(server: Arc<Server>) -> axum::Router {
    routes::build(server, Options::default())
}

/// The HTTP router over any [`Backend`].
pub fn router_with<B: Backend>(backend: Arc<B>, options: Options) -> axum::Router {
    routes::build(backend, options)
}

/// Serves the HTTP frontend on `listener` (with `TCP_NODELAY`, as Triton) until `shutdown`
/// completes, then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: Arc<Server>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, server, Options::default(), shutdown).await
}

/// [`serve`] for any [`Backend`], with options.
pub async fn serve_with<B: Backend>(
    listener: tokio::net::TcpListener,
    backend: Arc<B>,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("could not set TCP_NODELAY: {e}");
        }
    });
    // The peer's address reaches the handlers (admin endpoints allow loopback peers).
    let app = routes::build(backend, options).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
