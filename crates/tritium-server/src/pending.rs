//! A request waiting for an instance ([`Pending`]), where its answer goes ([`Reply`]), and
//! what the schedulers say to workers and to the server ([`Next`], [`Refused`]): the types the
//! version's queue and the sequence batcher share.

use std::time::Instant;

use tokio::sync::oneshot;

use crate::types::{InferError, InferRequest, InferResponse, RequestedOutput, StreamTx, Streamed};

/// The answer of a request whose client went away before it ran (Triton answers such a request
/// with a `CANCELLED` status and counts it as failed, reason `CANCELED`); usually nobody reads it.
pub(crate) const CANCELLED: &str = "the client cancelled the request";

/// A request waiting for an instance.
pub(crate) struct Pending {
    /// The request.
    pub req: InferRequest,
    /// Its batch size (0 for non-batching models).
    pub batch_size: u64,
    /// Outputs to return.
    pub outputs: Vec<RequestedOutput>,
    /// When it was queued.
    pub enqueued: Instant,
    /// Where the answer goes.
    pub tx: Reply,
    /// Its trace, when it is traced (recorded when the request is dropped, after its answer).
    pub trace: Option<Box<tritium_trace::ActiveTrace>>,
}

/// Where a request's answer goes: one answer, or a stream of them for a decoupled model.
pub(crate) enum Reply {
    /// The one answer of a request to a model that is not decoupled.
    Unary(oneshot::Sender<Result<InferResponse, InferError>>),
    /// The responses of a request to a decoupled model, as they come. The channel never blocks
    /// the worker that forwards them; what bounds it is the stub, which waits for credit
    /// ([`StreamTx::taken`]) once `--max-inflight-responses` are sent and not taken.
    Stream(StreamTx),
    /// Nobody waits: a sequence batch's null request (the sequence batcher), whose answer is
    /// dropped and not counted in the statistics.
    Discard,
}

impl Reply {
    /// Sends the request's final answer (on a stream: as its last message). A client that went
    /// away is not an error.
    pub(crate) fn send(self, result: Result<InferResponse, InferError>) {
        match self {
            Reply::Unary(tx) => {
                let _ = tx.send(result);
            }
            Reply::Stream(tx) => {
                tx.send(Streamed::Response { result, last: true });
            }
            Reply::Discard => {}
        }
    }

    /// Sends one message of a decoupled request's stream (nothing for a unary request).
    pub(crate) fn stream(&self, message: Streamed) {
        if let Reply::Stream(tx) = self {
            tx.send(message);
        }
    }

    /// Whether the client stopped waiting.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            Reply::Unary(tx) => tx.is_closed(),
            Reply::Stream(tx) => tx.is_closed(),
            Reply::Discard => false,
        }
    }

    /// Whether the answer is dropped and the request not counted (a null request).
    pub(crate) fn discards(&self) -> bool {
        matches!(self, Reply::Discard)
    }
}

/// What a worker gets from the queue.
pub(crate) enum Next {
    /// Requests to execute together.
    Batch(Vec<Pending>),
    /// The queue is closed and empty.
    Closed,
    /// The worker's interruption condition holds.
    Interrupted,
    /// Nothing came within the idle period.
    Idle,
}

/// Why a queue refused a request (`Queue::push`).
#[derive(Debug)]
pub(crate) enum Refused {
    /// The queue is closed (the version is unloading).
    Closed,
    /// The request's level is full; the error carries Triton's text and names the limit.
    Full(InferError),
    /// The request breaks a rule of the model's scheduler (a sequence model's correlation id
    /// or START flag); the error carries Triton's text.
    Invalid(InferError),
}
