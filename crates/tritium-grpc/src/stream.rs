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
//!
//! Every answer of a queued request carries the `triton_final_response` bool parameter (true for
//! a model that is not decoupled), and a failed one the request's id, model and version, as
//! Triton's `StreamInferResponseComplete` writes them; an answer refused before queueing carries
//! the request's id alone.
//!
//! A request to a decoupled model gets its responses as the model sends them, each with the
//! `triton_final_response` bool parameter, written by a task of its own as they come (so
//! responses of requests running together interleave, as in Triton's decoupled stream handler).
//! A final flag sent without a response is written only when the request set
//! `triton_enable_empty_final_response: true`; a model error is an `error_message` and the stream
//! stays open.

use std::future::Future;
use std::task::Poll;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tritium_proto::inference::infer_parameter::ParameterChoice;
use tritium_proto::inference::{InferParameter, ModelInferRequest, ModelInferResponse, ModelStreamInferResponse};
use tritium_server::trace::TraceParent;
use tritium_server::{ErrorKind, InferError, ParamValue, ResponseStream, Server, Streamed};

use crate::convert::{self, to_status};
use crate::infer::{run, Shutdown};

/// Requests of one stream read ahead of the oldest unanswered one.
const MAX_PENDING: usize = 4096;
/// Answers waiting for the client to take them.
const MAX_UNSENT: usize = 16;

type Outcome = Result<ModelInferResponse, InferError>;

/// One request's outcome, in stream order.
enum Item {
    /// Settled when read. `queued` tells whether an error came from inference rather than
    /// from the checks before the request was queued.
    Done { who: Who, outcome: Outcome, queued: bool },
    /// Queued and running.
    Running { who: Who, task: Task },
    /// Queued on a decoupled model: its responses, as they come.
    Stream(DecoupledStream),
    /// The stream ends with this status after the answers before it.
    End(Status),
}

/// The request an answer is for, as the client named it (Triton's failed responses and empty
/// final responses carry these).
struct Who {
    id: String,
    model: String,
    version: String,
}

impl Who {
    /// A response with no outputs for this request: its id, model and version, and
    /// `triton_final_response`.
    fn bare_response(&self, last: bool) -> ModelInferResponse {
        ModelInferResponse {
            model_name: self.model.clone(),
            model_version: self.version.clone(),
            id: self.id.clone(),
            parameters: final_parameter(last),
            ..Default::default()
        }
    }
}

/// A running request's task, aborted when dropped unawaited (the stream ended, its client went
/// away): that drops the request's reply, which cancels it in the core.
struct Task(JoinHandle<Outcome>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A decoupled request's responses and what writing them needs.
struct DecoupledStream {
    /// The request, for a final flag without a response and for errors.
    who: Who,
    /// `triton_enable_empty_final_response`.
    empty_final: bool,
    responses: ResponseStream,
}

/// Starts serving one stream; returns the stream of answers.
pub(crate) fn start(
    server: Server,
    inbound: Streaming<ModelInferRequest>,
    grpc_error_mode: bool,
    shutdown: Shutdown,
    forwarded: Vec<(String, ParamValue)>,
    trace: Option<TraceParent>,
) -> ReceiverStream<Result<ModelStreamInferResponse, Status>> {
    let (items_tx, items_rx) = mpsc::channel(MAX_PENDING);
    let (out_tx, out_rx) = mpsc::channel(MAX_UNSENT);
    tokio::spawn(read(server, inbound, items_tx, shutdown, forwarded, trace));
    tokio::spawn(write(items_rx, out_tx, grpc_error_mode));
    ReceiverStream::new(out_rx)
}

async fn read(
    server: Server,
    mut inbound: Streaming<ModelInferRequest>,
    items: mpsc::Sender<Item>,
    shutdown: Shutdown,
    forwarded: Vec<(String, ParamValue)>,
    trace: Option<TraceParent>,
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
            Ok(Some(msg)) => issue(&server, msg, &forwarded, trace).await,
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
async fn issue(
    server: &Server,
    msg: ModelInferRequest,
    forwarded: &[(String, ParamValue)],
    trace: Option<TraceParent>,
) -> Item {
    let id = msg.id.clone();
    let empty_final = msg
        .parameters
        .get("triton_enable_empty_final_response")
        .is_some_and(|p| matches!(p, InferParameter { parameter_choice: Some(ParameterChoice::BoolParam(true)) }));
    let who = Who { id, model: msg.model_name.clone(), version: msg.model_version.clone() };
    let mut decoded = match convert::decode_infer_request_with(msg, Some(server.shm())) {
        Ok(d) => d,
        Err(e) => return Item::Done { who, outcome: Err(e), queued: false },
    };
    decoded.parameters.extend_from_slice(forwarded);
    // The stream's `traceparent` puts each of its requests in the caller's trace.
    decoded.trace = trace;
    if server.is_decoupled(&decoded.model, decoded.version).unwrap_or(false) {
        // Routed, validated and queued before the next request is read.
        return match server.infer_decoupled(decoded) {
            Ok(responses) => Item::Stream(DecoupledStream { who, empty_final, responses }),
            Err(e) => Item::Done { who, outcome: Err(e), queued: false },
        };
    }
    let mut infer = Box::pin(run(server.clone(), decoded));
    // Poll once with this task's context: the request is queued (or refused) before the next
    // one is read. A spurious wake-up of the reader later is harmless.
    match std::future::poll_fn(|cx| Poll::Ready(infer.as_mut().poll(cx))).await {
        Poll::Ready(outcome) => {
            let queued = outcome.as_ref().is_err_and(|e| !refused_before_queueing(e));
            Item::Done { who, outcome, queued }
        }
        Poll::Pending => Item::Running { who, task: Task(tokio::spawn(infer)) },
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
        let (who, outcome, queued) = match item {
            Item::Done { who, outcome, queued } => (who, outcome, queued),
            Item::Running { who, mut task } => {
                let joined = tokio::select! {
                    joined = &mut task.0 => joined,
                    // The client went away: dropping the items (and `task`) cancels the requests.
                    () = out.closed() => return,
                };
                let outcome =
                    joined.unwrap_or_else(|e| Err(InferError::internal(format!("the inference task failed: {e}"))));
                (who, outcome, true)
            }
            Item::End(status) => {
                let _ = out.send(Err(status)).await;
                return;
            }
            Item::Stream(stream) => {
                tokio::spawn(forward(stream, out.clone(), grpc_error_mode));
                continue;
            }
        };
        // As Triton's: every answer of a queued request says it is the final one, a failed one
        // also which model it came from; a request refused before it was queued has its id alone.
        let answer = match outcome {
            Ok(mut resp) => {
                resp.parameters.extend(final_parameter(true));
                Ok(ModelStreamInferResponse { error_message: String::new(), infer_response: Some(resp) })
            }
            Err(e) if grpc_error_mode && queued => {
                let _ = out.send(Err(to_status(e))).await;
                return;
            }
            Err(e) if queued => Ok(failed(&who, &e, true)),
            Err(e) => Ok(convert::stream_error(who.id, &e)),
        };
        if out.send(answer).await.is_err() {
            return;
        }
    }
}

/// Writes a decoupled request's responses as they come, until its final one.
async fn forward(
    mut stream: DecoupledStream,
    out: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
    grpc_error_mode: bool,
) {
    loop {
        let message = tokio::select! {
            message = stream.responses.recv() => message,
            // The client went away: dropping the responses' receiver cancels the request, even
            // one still queued that has sent nothing yet.
            () = out.closed() => return,
        };
        let Some(message) = message else { break };
        let last = message.is_last();
        let answer = match message {
            Streamed::Final if !stream.empty_final => return,
            Streamed::Final => Ok(ModelStreamInferResponse {
                error_message: String::new(),
                infer_response: Some(stream.who.bare_response(true)),
            }),
            Streamed::Response { result: Ok(resp), last } => match convert::encode_infer_response(resp) {
                Ok(mut resp) => {
                    resp.parameters.extend(final_parameter(last));
                    Ok(ModelStreamInferResponse { error_message: String::new(), infer_response: Some(resp) })
                }
                Err(e) => Ok(convert::stream_error(stream.who.id.clone(), &e)),
            },
            Streamed::Response { result: Err(e), .. } if grpc_error_mode => {
                let _ = out.send(Err(to_status(e))).await;
                return;
            }
            Streamed::Response { result: Err(e), last } => Ok(failed(&stream.who, &e, last)),
        };
        if out.send(answer).await.is_err() || last {
            return;
        }
    }
    // The server never drops a stream without its final message; if it did, say so.
    let e = InferError::internal("the server dropped the request before its final response");
    let _ = out.send(Ok(convert::stream_error(stream.who.id, &e))).await;
}

/// A failed response of a queued request, as Triton's stream handler writes it: the error, and
/// the request's id, model and version (as the client named them) with `triton_final_response`.
fn failed(who: &Who, e: &InferError, last: bool) -> ModelStreamInferResponse {
    ModelStreamInferResponse { error_message: e.message.clone(), infer_response: Some(who.bare_response(last)) }
}

/// The `triton_final_response` parameter Triton puts on each response of a stream.
fn final_parameter(last: bool) -> std::collections::HashMap<String, InferParameter> {
    [("triton_final_response".to_string(), InferParameter { parameter_choice: Some(ParameterChoice::BoolParam(last)) })]
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(empty_final: bool, messages: Vec<Streamed>) -> DecoupledStream {
        let (tx, responses) = tritium_server::response_stream();
        for m in messages {
            assert!(tx.send(m));
        }
        DecoupledStream { who: who(), empty_final, responses }
    }

    fn who() -> Who {
        Who { id: "r".into(), model: "m".into(), version: String::new() }
    }

    fn response(last: bool) -> Streamed {
        let resp = tritium_server::InferResponse {
            model: "m".into(),
            version: 1,
            id: "r".into(),
            outputs: Vec::new(),
            parameters: Vec::new(),
        };
        Streamed::Response { result: Ok(resp), last }
    }

    /// What `forward` writes: per answer, its error message or its `triton_final_response`.
    async fn written(s: DecoupledStream) -> Vec<Result<bool, String>> {
        let (out, mut rx) = mpsc::channel(16);
        forward(s, out, false).await;
        let mut got = Vec::new();
        while let Ok(answer) = rx.try_recv() {
            let answer = answer.expect("no status");
            got.push(if answer.error_message.is_empty() {
                let p = &answer.infer_response.expect("response").parameters["triton_final_response"];
                Ok(matches!(p.parameter_choice, Some(ParameterChoice::BoolParam(true))))
            } else {
                Err(answer.error_message)
            });
        }
        got
    }

    #[tokio::test]
    async fn decoupled_responses_carry_the_final_flag_and_the_empty_final_only_when_asked() {
        let msgs = || vec![response(false), response(false), Streamed::Final];
        assert_eq!(written(stream(true, msgs())).await, [Ok(false), Ok(false), Ok(true)]);
        assert_eq!(written(stream(false, msgs())).await, [Ok(false), Ok(false)]);
        assert_eq!(written(stream(false, vec![response(true), response(false)])).await, [Ok(true)]);
    }

    #[tokio::test]
    async fn an_error_ends_the_request_and_a_lost_stream_says_so() {
        let error = Streamed::Response { result: Err(InferError::internal("boom")), last: true };
        assert_eq!(written(stream(true, vec![error, response(false)])).await, [Err("boom".to_string())]);
        let (tx, responses) = tritium_server::response_stream();
        assert!(tx.send(response(false)));
        drop(tx);
        let lost = DecoupledStream { who: who(), empty_final: true, responses };
        assert_eq!(
            written(lost).await,
            [Ok(false), Err("the server dropped the request before its final response".to_string())]
        );
    }

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
