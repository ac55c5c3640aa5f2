//! One `execute` on the stub: input blocks placed in the server's arena, a batch sent whole
//! ([`Stub::execute`]) or submitted and completed in turn ([`Stub::submit`], [`Stub::complete`],
//! the event loop's [`Stub::try_message`]), a decoupled model's responses as they come
//! ([`Stub::execute_decoupled`]), cancellations and credit, and the output blocks read and
//! released.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tritium_ipc::{Descriptor, Request, Response, StubError, TensorData, ToServer, ToStub, View};
use tritium_sync::Locked;

use super::{HostError, OnResponse, Stub, POLL_CHUNK, WATCH_SLICE};

/// The outcome of one `execute` call.
#[derive(Debug)]
pub struct Executed {
    /// The responses, in the order the stub sent them.
    pub responses: Vec<Response>,
    /// Set when `execute` itself failed; requests without a final response share this error.
    pub error: Option<StubError>,
}

/// The responses of one `execute` of a model that is not decoupled: at most one per request of
/// the batch (Triton's python_backend likewise takes exactly one response per request, returned
/// from `execute` or sent once through the request's response sender). The stub's own code sends
/// at most one per request, so anything else means the stub's side of the protocol was
/// subverted. Decoupled models go through [`Stub::execute_decoupled`] instead.
struct Collected {
    waiting: HashSet<u64>,
    responses: Vec<Response>,
}

impl Collected {
    fn new(ids: impl Iterator<Item = u64>) -> Self {
        let waiting: HashSet<u64> = ids.collect();
        Self { responses: Vec::with_capacity(waiting.len()), waiting }
    }

    /// Keeps `r`, or hands it back with why the protocol does not allow it (its blocks are the
    /// caller's to release).
    fn accept(&mut self, r: Response) -> Result<(), Box<(Response, String)>> {
        if self.waiting.remove(&r.request) {
            self.responses.push(r);
            return Ok(());
        }
        let why = if self.responses.iter().any(|k| k.request == r.request) {
            format!(
                "sent a second response for request {}; a model that is not decoupled sends exactly one response per request",
                r.request
            )
        } else {
            format!("responded to unknown request {}", r.request)
        };
        Err(Box::new((r, why)))
    }
}

/// A batch sent to the stub ([`Stub::submit`]) whose answers are still to be read
/// ([`Stub::complete`]).
pub struct Submitted {
    batch: u64,
    collected: Collected,
    /// Set by its `ExecuteDone`: the error `execute` raised, if it did.
    ended: Option<Option<StubError>>,
}

impl Stub {
    /// Copies `bytes` into a new block of the server's arena, for use as an input tensor.
    pub fn input(&self, bytes: &[u8]) -> Result<Descriptor, HostError> {
        let view = self.channel.alloc(bytes.len() as u64).map_err(|e| self.ipc(e))?;
        view.copy_from(bytes);
        Ok(view.desc)
    }

    /// Copies each of `inputs` into its own block of the server's arena, the blocks back to back
    /// in this order ([`tritium_ipc::Channel::alloc_run`]), so that the stub can view them as one
    /// array; `None` when one is empty (place them one by one then).
    pub fn input_run(&self, inputs: &[&[u8]]) -> Result<Option<Vec<Descriptor>>, HostError> {
        let lens: Vec<u64> = inputs.iter().map(|b| b.len() as u64).collect();
        let Some(views) = self.channel.alloc_run(&lens).map_err(|e| self.ipc(e))? else {
            return Ok(None);
        };
        Ok(Some(
            views
                .into_iter()
                .zip(inputs)
                .map(|(view, bytes)| {
                    view.copy_from(bytes);
                    view.desc
                })
                .collect(),
        ))
    }

    /// Allocates an uninitialised input block of `len` bytes for the caller to fill.
    pub fn input_block(&self, len: u64) -> Result<View, HostError> {
        self.channel.alloc(len).map_err(|e| self.ipc(e))
    }

    /// Runs one `execute` on `requests` and collects the responses until the stub says it is
    /// done. Input blocks are freed as the stub releases them; output tensors must be read with
    /// [`Stub::output`] and then released with [`Stub::release_outputs`].
    pub fn execute(&self, requests: Vec<Request>, timeout: Option<Duration>) -> Result<Executed, HostError> {
        self.execute_watching(requests, timeout, None)
    }

    /// [`Stub::execute`], calling `watch` every few milliseconds while `execute` runs (the
    /// server looks there for requests whose client went away, and sends their `Cancel`).
    pub fn execute_watching(
        &self,
        requests: Vec<Request>,
        timeout: Option<Duration>,
        watch: Option<&mut dyn FnMut(&Stub)>,
    ) -> Result<Executed, HostError> {
        let submitted = self.submit(requests)?;
        self.complete(submitted, timeout, watch)
    }

    /// Sends one `execute` of a model that is not decoupled, without waiting for it: the stub
    /// runs its batches one after the other, so a batch submitted while another runs is in the
    /// ring when that one ends. Read its answers with [`Stub::complete`], in submission order.
    pub fn submit(&self, requests: Vec<Request>) -> Result<Submitted, HostError> {
        let (msg, submitted) = self.prepare_execute(requests);
        self.send(&msg)?;
        Ok(submitted)
    }

    /// The `Execute` message of a batch and its [`Submitted`], for a caller that sends it itself
    /// ([`Stub::try_send`], from an event loop that must not wait for room in the ring).
    pub fn prepare_execute(&self, requests: Vec<Request>) -> (ToStub, Submitted) {
        let batch = self.next_batch_number();
        let collected = Collected::new(requests.iter().map(|r| r.id));
        (ToStub::Execute { batch, requests }, Submitted { batch, collected, ended: None })
    }

    /// The number of the next batch sent to the stub.
    fn next_batch_number(&self) -> u64 {
        let mut b = self.next_batch.locked();
        *b += 1;
        *b
    }

    /// Sends `msg` only if the ring has room for it now: false when it has not (or another
    /// thread is sending), for an event loop that retries later instead of waiting.
    pub fn try_send(&self, msg: &ToStub) -> Result<bool, HostError> {
        self.channel.try_send(msg).map_err(|e| self.ipc_now(e))
    }

    /// The next message the stub sent, if one is there now, after handling what it sends
    /// unasked (logs, calls, BLS requests); never waits. For an event loop that waits on the
    /// channel's doorbell between calls. At most [`POLL_CHUNK`] unasked messages are handled in
    /// one call, so that a model thread that logs without pause cannot hold the loop: `None`
    /// then, with more to read.
    pub fn try_message(&self) -> Result<Option<ToServer>, HostError> {
        for _ in 0..POLL_CHUNK {
            let Some(msg) = self.channel.try_recv().map_err(|e| self.ipc_now(e))? else { break };
            if let Some(msg) = self.unasked(msg)? {
                return Ok(Some(msg));
            }
        }
        Ok(None)
    }

    /// Fails with [`HostError::Exiting`] if its process has ended (what it sent before is taken
    /// first by whoever reads the channel; [`Stub::settle`] then tells how it ended).
    pub fn check_alive(&self) -> Result<(), HostError> {
        match self.try_exit() {
            Some(_) => Err(HostError::Exiting { instance: self.instance.clone() }),
            None => Ok(()),
        }
    }

    /// Takes one message of a submitted batch's answer: true once it ended the batch. A message
    /// that cannot be part of it is a protocol error.
    pub fn batch_message(&self, submitted: &mut Submitted, msg: ToServer) -> Result<bool, HostError> {
        match msg {
            ToServer::Response(r) => match submitted.collected.accept(r) {
                Ok(()) => Ok(false),
                Err(refused) => {
                    let (dropped, why) = *refused;
                    self.release_outputs(&dropped);
                    Err(self.protocol_error(why))
                }
            },
            ToServer::ExecuteDone { batch, error } if batch == submitted.batch => {
                submitted.ended = Some(error);
                Ok(true)
            }
            other => Err(self.protocol_error(format!("sent {other:?} during execute"))),
        }
    }

    /// The answers of a batch that ended (its `ExecuteDone` came); a batch abandoned before it
    /// ended hands its gathered responses' blocks back and gives nothing.
    pub fn executed(&self, submitted: Submitted) -> Option<Executed> {
        match submitted.ended {
            Some(error) => Some(Executed { responses: submitted.collected.responses, error }),
            None => {
                for r in &submitted.collected.responses {
                    self.release_outputs(r);
                }
                None
            }
        }
    }

    /// Waits up to `timeout` for the responses and the end of a submitted batch (the oldest
    /// one not completed yet), calling `watch` every few milliseconds meanwhile.
    pub fn complete(
        &self,
        mut submitted: Submitted,
        timeout: Option<Duration>,
        mut watch: Option<&mut dyn FnMut(&Stub)>,
    ) -> Result<Executed, HostError> {
        let result = loop {
            let w = watch.as_mut().map(|w| &mut **w as &mut dyn FnMut(&Stub));
            match self.recv_watching(timeout, "finish execute", w) {
                Ok(msg) => match self.batch_message(&mut submitted, msg) {
                    Ok(true) => break Ok(()),
                    Ok(false) => {}
                    Err(e) => break Err(e),
                },
                Err(e) => break Err(e),
            }
        };
        // Nobody will read the responses gathered so far on an error: `executed` hands their
        // blocks back.
        match (result, self.executed(submitted)) {
            (Ok(()), Some(done)) => Ok(done),
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(self.protocol_error("ended a batch it never ended".into())),
        }
    }

    /// The `Execute` message of a decoupled model's batch and the batch's number (its
    /// `ExecuteDone` names it), for a caller that sends it and reads what comes back itself
    /// (an event loop: [`Stub::try_send`], [`Stub::try_message`]).
    pub fn prepare_decoupled_execute(&self, requests: Vec<Request>) -> (u64, ToStub) {
        let batch = self.next_batch_number();
        (batch, ToStub::Execute { batch, requests })
    }

    /// Runs one `execute` of a decoupled model on `requests`: each response goes to
    /// `on_response` as it arrives (it may also come after this returns, through
    /// [`Stub::poll`]), and `watch` is called every few milliseconds, whether responses come or
    /// not (the server sends cancellations and credit from there). Returns the error `execute`
    /// raised, if it did.
    pub fn execute_decoupled(
        &self,
        requests: Vec<Request>,
        timeout: Option<Duration>,
        on_response: &mut OnResponse<'_>,
        watch: &mut dyn FnMut(&Stub),
    ) -> Result<Option<StubError>, HostError> {
        let (batch, msg) = self.prepare_decoupled_execute(requests);
        self.send(&msg)?;
        let mut watched = Instant::now();
        loop {
            match self.recv_watching(timeout, "finish execute", Some(&mut *watch))? {
                ToServer::Response(r) => {
                    on_response(r).map_err(|why| self.protocol_error(why))?;
                    // Responses that keep coming must not starve the watch.
                    if watched.elapsed() >= WATCH_SLICE {
                        watch(self);
                        watched = Instant::now();
                    }
                }
                ToServer::ExecuteDone { batch: done, error } if done == batch => return Ok(error),
                other => return Err(self.protocol_error(format!("sent {other:?} during execute"))),
            }
        }
    }

    /// Tells the stub that the client of `request` went away (`is_cancelled()` turns true).
    pub fn cancel(&self, request: u64) -> Result<(), HostError> {
        self.send(&ToStub::Cancel { request })
    }

    /// Tells the stub that the client of decoupled request `request` has taken `consumed` of
    /// its responses, so a model waiting for room in the request's window may send again.
    pub fn credit(&self, request: u64, consumed: u64) -> Result<(), HostError> {
        self.send(&ToStub::Credit { request, consumed })
    }

    /// Resolves an output tensor's bytes (bounds-checked against the stub's segments).
    pub fn output(&self, data: &TensorData) -> Result<View, HostError> {
        match data {
            TensorData::Shm { desc, .. } => self.channel.view(*desc).map_err(|e| self.ipc(e)),
            TensorData::Cuda { .. } => {
                Err(self.protocol_error("sent a GPU tensor, which this server does not take yet".into()))
            }
        }
    }

    /// Hands the output blocks of `response` back to the stub's arena.
    pub fn release_outputs(&self, response: &Response) {
        for t in &response.outputs {
            if let TensorData::Shm { desc, .. } = t.data {
                self.channel.release(desc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(request: u64) -> Response {
        Response {
            request,
            outputs: Vec::new(),
            error: None,
            parameters: Vec::new(),
            final_response: true,
            flag_only: false,
        }
    }

    #[test]
    fn one_response_per_request_and_no_strangers() {
        let mut c = Collected::new([1, 2].into_iter());
        assert!(c.accept(response(1)).is_ok());
        let (dropped, why) = *c.accept(response(1)).expect_err("a second response");
        assert_eq!(dropped.request, 1);
        assert!(why.contains("second response for request 1"), "{why}");
        let (_, why) = *c.accept(response(9)).expect_err("unknown");
        assert_eq!(why, "responded to unknown request 9");
        assert!(c.accept(response(2)).is_ok());
        assert_eq!(c.responses.iter().map(|r| r.request).collect::<Vec<_>>(), [1, 2]);
    }
}
