//! What the unary and streaming handlers share: running one inference to its encoded answer,
//! and the frontend's shutdown signal.

use tokio::sync::watch;
use tritium_proto::inference::ModelInferResponse;
use tritium_server::{InferError, InferRequest, Server};

use crate::convert;

/// Resolves when the frontend shuts down; never, for a service built without a shutdown signal.
#[derive(Clone, Default)]
pub(crate) struct Shutdown(Option<watch::Receiver<bool>>);

impl Shutdown {
    pub(crate) fn new(rx: watch::Receiver<bool>) -> Self {
        Self(Some(rx))
    }

    pub(crate) async fn wait(&self) {
        match &self.0 {
            None => std::future::pending().await,
            Some(rx) => {
                let mut rx = rx.clone();
                // A dropped sender means the frontend is gone: that is a shutdown too.
                let _ = rx.wait_for(|down| *down).await;
            }
        }
    }
}

/// Runs a decoded request and encodes the answer. Before its first await, [`Server::infer`]
/// routes, validates and queues the request; the stream handler relies on that to keep the
/// order of a stream's requests (see [`crate::stream`]).
pub(crate) async fn run(server: Server, request: InferRequest) -> Result<ModelInferResponse, InferError> {
    let resp = server.infer(request).await?;
    convert::encode_infer_response(resp)
}
