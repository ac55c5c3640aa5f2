//! `ModelStreamInfer`: the requests of one stream run concurrently and are answered in the
//! order they came, as Triton answers a stream for a non-decoupled model (its
//! `EnqueueForResponse` / `WriteResponseIfReady` in `src/grpc/stream_infer_handler.cc` and
//! `infer_handler.h`).
//!
//! A reader task takes requests off the stream. For each it polls the inference once, right
//! there: [`tritium_server::Server::infer`] validates and queues a request before its first
//! await, so requests reach the model's queue in stream order (which sequence models rely on);
//! what is still pending then continues in a task of its own. The reader hands each request's
//! outcome, in order, to a writer task, which waits for them one after the other and sends the
//! answers. Errors go in `error_message` and the stream stays open; in `triton_grpc_error` mode
//! an error from inference ends the stream with its status instead, while an error found before
//! the request was queued (decoding, unknown model, validation) still goes in `error_message`, as
//! in Triton. Bounded channels carry back-pressure from a slow client down to the reading of
//! requests.

use std::future::Future;
use std::task::Poll;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tritium_proto::inference::{ModelInferRequest, ModelInferResponse, ModelStreamInferResponse};
use tritium_server::{ErrorKind, InferError, Server};

use crate::convert::{self, to_status};
use crate::service::{run, Shutdown};

/// Requests of one stream read ahead of the oldest unanswered one.
const MAX_PENDING: usize = 4096;
/// Answers waiting for the client to take them.
const MAX_UNSENT: usize = 16;

type Outcome = Result<ModelInferResponse, InferError>;

/// One request's outcome, in stream order.
enum Item {
    /// Settled when read. `queued` tells whether an error came from inference rather than
    /// from the checks before the request was queued.
    Done { id: String, outcome: Outcome, queued: bool },
    /// Queued and running.
    Running { id: String, task: JoinHandle<Outcome> },
    /// The stream ends with this status after the answers before it.
    End(Status),
}

/// Starts serving one stream; returns the stream of answers.
pub(crate) fn start(
    server: Server,
    inbound: Streaming<ModelInferRequest>,
    grpc_error_mode: bool,
    shutdown: Shutdown,
) -> ReceiverStream<Result<ModelStreamInferResponse, Status>> {
    let (items_tx, items_rx) = mpsc::channel(MAX_PENDING);
    let (out_tx, out_rx) = mpsc::channel(MAX_UNSENT);
    tokio::spawn(read(server, inbound, items_tx, shutdown));
    tokio::spawn(write(items_rx, out_tx, grpc_error_mode));
    ReceiverStream::new(out_rx)
}

async fn read(
    server: Server,
    mut inbound: Streaming<ModelInferRequest>,
    items: mpsc::Sender<Item>,
    shutdown: Shutdown,
) {
    loop {
        let next = tokio::select! {
            biased;
            // The writer stopped (the client went away, or the stream ended on an error).
            _ = items.closed() => return,
            _ = shutdown.wait() => {
                let status = Status::unavailable("GRPC server is shutting down and has stopped accepting new requests.");
                let _ = items.send(Item::End(status)).await;
                return;
            }
            next = inbound.message() => next,
        };
        let item = match next {
            Ok(Some(msg)) => issue(&server, msg).await,
            // The client closed its side: the answers still due are written, then the stream ends.
            Ok(None) => return,
            Err(status) => Item::End(status),
        };
        let end = matches!(item, Item::End(_));
        if items.send(item).await.is_err() || end {
            return;
        }
    }
}

/// Decodes a request and starts it, queuing it before returning.
async fn issue(server: &Server, msg: ModelInferRequest) -> Item {
    let id = msg.id.clone();
    let decoded = match convert::decode_infer_request(msg) {
        Ok(d) => d,
        Err(e) => return Item::Done { id, outcome: Err(e), queued: false },
    };
    let mut infer = Box::pin(run(server.clone(), decoded));
    // Poll once with this task's context: the request is queued (or refused) before the next
    // one is read. A spurious wake-up of the reader later is harmless.
    match std::future::poll_fn(|cx| Poll::Ready(infer.as_mut().poll(cx))).await {
        Poll::Ready(outcome) => {
            let queued = outcome.as_ref().is_err_and(|e| !refused_before_queueing(e));
            Item::Done { id, outcome, queued }
        }
        Poll::Pending => Item::Running { id, task: tokio::spawn(infer) },
    }
}

/// Whether an error that came at the first poll is one of the server's checks before queueing
/// (unknown model or version, invalid request, model unloading) rather than an answer from the
/// model, which can come that fast when this thread is descheduled right after queueing. The
/// server's API does not say which it was; these kinds are what its checks return.
fn refused_before_queueing(e: &InferError) -> bool {
    matches!(e.kind, ErrorKind::InvalidArg | ErrorKind::NotFound | ErrorKind::Unavailable)
}

async fn write(
    mut items: mpsc::Receiver<Item>,
    out: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
    grpc_error_mode: bool,
) {
    while let Some(item) = items.recv().await {
        let (id, outcome, queued) = match item {
            Item::Done { id, outcome, queued } => (id, outcome, queued),
            Item::Running { id, task } => {
                let outcome =
                    task.await.unwrap_or_else(|e| Err(InferError::internal(format!("the inference task failed: {e}"))));
                (id, outcome, true)
            }
            Item::End(status) => {
                let _ = out.send(Err(status)).await;
                return;
            }
        };
        let answer = match outcome {
            Ok(resp) => Ok(ModelStreamInferResponse { error_message: String::new(), infer_response: Some(resp) }),
            Err(e) if grpc_error_mode && queued => {
                let _ = out.send(Err(to_status(e))).await;
                return;
            }
            Err(e) => Ok(convert::stream_error(id, &e)),
        };
        if out.send(answer).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_of_the_checks_before_queueing() {
        for kind in [ErrorKind::InvalidArg, ErrorKind::NotFound, ErrorKind::Unavailable] {
            assert!(refused_before_queueing(&InferError::new(kind, "x")), "{kind:?}");
        }
        for kind in [
            ErrorKind::Internal,
            ErrorKind::Unknown,
            ErrorKind::Unsupported,
            ErrorKind::AlreadyExists,
            ErrorKind::Cancelled,
        ] {
            assert!(!refused_before_queueing(&InferError::new(kind, "x")), "{kind:?}");
        }
    }
}
