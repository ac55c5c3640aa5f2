//! Models calling models: BLS (model code's `InferenceRequest.exec` and its model-control calls,
//! [`bls`]) and ensembles ([`ensemble`]). Both drive other models through one trait, [`Router`],
//! which the server implements; nothing here knows the server, its repository or its locks.
//!
//! [`RoutedCalls`] is the server's side of the instances' seam ([`ModelCalls`]): it reaches the
//! router weakly, so an instance never keeps the server alive.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use tracing::warn;
use tritium_host::BlsHandler;
use tritium_ipc::{CallOp, CallResult, ServerChannel};

use crate::instance::{Instance, ModelCalls, VersionContext};
use crate::types::{InferError, InferRequest, InferResponse, ResponseStream, StreamTx};

pub(crate) mod bls;
pub(crate) mod ensemble;

pub(crate) use ensemble::Ensemble;

/// A boxed future: what [`Router`] hands out, so that it can be a trait object.
pub(crate) type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What BLS and ensembles need from the server: a ready target, the queueing path, inference of
/// both kinds, and model control. Methods that start work the caller does not wait for take the
/// router by `Arc`, so the work can hold it.
pub(crate) trait Router: Send + Sync {
    /// The version a call to `model` (`version`, or the default one) goes to, when it is loaded
    /// and has an instance ready to serve (an ensemble is ready once loaded).
    fn ready_target(&self, model: &str, version: Option<i64>) -> Option<Arc<VersionContext>>;

    /// Routes, validates and queues a request whose answers come on `tx`, whichever kind of
    /// model it is for (one final message from a model that is not decoupled), through the
    /// clients' path. Must run inside the runtime.
    fn enqueue(self: Arc<Self>, req: InferRequest, tx: StreamTx) -> Result<(), InferError>;

    /// Runs one inference on a model that is not decoupled.
    fn infer(self: Arc<Self>, req: InferRequest) -> Boxed<Result<InferResponse, InferError>>;

    /// Starts one inference on a decoupled model; its responses come on the stream.
    fn infer_decoupled(self: Arc<Self>, req: InferRequest) -> Result<ResponseStream, InferError>;

    /// Loading model `name`, with `config_json` (Triton's JSON form) instead of its config file
    /// when given, and from a directory holding `files` (which need a config) instead of the
    /// repository's when there are any. Refused before anything starts unless model control is
    /// explicit.
    fn load(
        self: Arc<Self>,
        name: &str,
        config_json: Option<String>,
        files: Vec<crate::types::ModelFile>,
    ) -> Result<Boxed<Result<(), InferError>>, InferError>;

    /// Unloading model `name` and, with `dependents`, the step models of an ensemble that no
    /// other loaded ensemble uses. Refused before anything starts unless model control is
    /// explicit.
    fn unload(self: Arc<Self>, name: &str, dependents: bool) -> Result<Boxed<Result<(), InferError>>, InferError>;
}

/// The instances' [`ModelCalls`], answered through a [`Router`] held weakly, with tasks on the
/// server's runtime.
pub(crate) struct RoutedCalls {
    router: Weak<dyn Router>,
    runtime: Option<tokio::runtime::Handle>,
}

impl RoutedCalls {
    /// Calls through `router`, with tasks on `runtime` (none outside one, as in unit tests: then
    /// every call is refused as if the server were shutting down).
    pub(crate) fn new(router: Weak<dyn Router>, runtime: Option<tokio::runtime::Handle>) -> Self {
        Self { router, runtime }
    }

    /// The router and the runtime, unless the server is going away.
    fn reach(&self) -> Option<(Arc<dyn Router>, tokio::runtime::Handle)> {
        Some((self.router.upgrade()?, self.runtime.clone()?))
    }
}

impl ModelCalls for RoutedCalls {
    fn bls_handler(
        &self,
        caller: &Arc<VersionContext>,
        instance: &Arc<Instance>,
        channel: &Arc<ServerChannel>,
    ) -> BlsHandler {
        bls::handler(self.router.clone(), self.runtime.clone(), caller, instance, channel)
    }

    fn model_control(&self, caller: &str, op: CallOp) -> Result<CallResult, String> {
        let Some((router, runtime)) = self.reach() else {
            return Err("the server is shutting down".into());
        };
        model_control(router, &runtime, caller, op)
    }
}

/// Answers `pb_utils.is_model_ready`, `load_model` and `unload_model` for model code of
/// `caller`. Loading blocks the calling instance's worker until the model is loaded (the caller
/// waits for it anyway, as in Triton), so a model cannot reload itself (the reload would wait for
/// that worker to drain); unloading is started and not waited for (Triton's unload does not wait
/// either), so a model may unload itself.
fn model_control(
    router: Arc<dyn Router>,
    runtime: &tokio::runtime::Handle,
    caller: &str,
    op: CallOp,
) -> Result<CallResult, String> {
    match op {
        CallOp::ModelReady { name, version } => {
            let version = crate::types::parse_version(&version).map_err(|e| e.message)?;
            Ok(CallResult::Ready(router.ready_target(&name, version).is_some()))
        }
        CallOp::ModelLoad { name, config, files } => {
            let files = model_files(&name, files)?;
            let load = router.load(&name, (!config.is_empty()).then_some(config), files).map_err(|e| e.message)?;
            if name == caller {
                return Err(format!(
                    "model '{name}' cannot load itself from its own code: the reload would wait for the instance that \
                     asks for it; load it from another model or with the repository API"
                ));
            }
            let loaded = crate::off_runtime(|| runtime.block_on(load));
            loaded.map(|()| CallResult::Done).map_err(|e| e.message)
        }
        CallOp::ModelUnload { name, unload_dependents } => {
            let unload = router.unload(&name, unload_dependents).map_err(|e| e.message)?;
            runtime.spawn(async move {
                if let Err(e) = unload.await {
                    warn!(model = %name, "unload_model: {e}");
                }
            });
            Ok(CallResult::Done)
        }
        other => Err(format!("{other:?} is not a model-control call")),
    }
}

/// `pb_utils.load_model`'s `files` (keyed `file:<path>`, as Triton's load parameters) as model
/// files; a key without the prefix is refused with Triton's text.
fn model_files(name: &str, files: Vec<(String, Vec<u8>)>) -> Result<Vec<crate::types::ModelFile>, String> {
    files
        .into_iter()
        .map(|(key, contents)| {
            crate::types::ModelFile::from_parameter(&key, contents).ok_or_else(|| {
                format!("failed to load '{name}': Unrecognized load parameter '{key}' with type 'BYTES'")
            })
        })
        .collect()
}
