//! What the stub sends without being asked: log records (re-emitted through `tracing` in the
//! stub's span), model code's calls on the server ([`CallHandler`]) and its requests to other
//! models ([`BlsHandler`]), and, through [`Stub::poll`], a decoupled model's responses that come
//! while no `execute` waits for them.

use std::sync::Arc;
use std::time::Duration;

use tritium_ipc::{CallOp, CallResult, LogLevel, Request, Response, StubError, TensorData, ToServer, ToStub};
use tritium_sync::Locked;

use super::{HostError, OnResponse, Stub, POLL_CHUNK};

/// Answers the calls model code makes on the server (custom metrics).
pub type CallHandler = Arc<dyn Fn(CallOp) -> Result<CallResult, String> + Send + Sync>;

/// What model code asks of other models (BLS), handed to the [`BlsHandler`].
// Each event is built once and moved once into the handler; boxing the request would buy
// nothing but an allocation per call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum BlsEvent {
    /// `InferenceRequest.exec()`: run `request` on `model` and answer with `BlsResponse`s.
    Request {
        /// The stub's call id.
        call: u64,
        /// Target model.
        model: String,
        /// Target version (-1 for the policy's choice).
        version: i64,
        /// The caller takes a stream of responses.
        decoupled: bool,
        /// The request; its inputs are blocks of the stub's arena, the handler's to release.
        request: Request,
    },
    /// The call was cancelled by model code.
    Cancel {
        /// The stub's call id.
        call: u64,
    },
}

/// Takes model code's BLS calls. It must not block the worker: it dispatches and returns, and
/// answers later through the stub's channel.
pub type BlsHandler = Arc<dyn Fn(BlsEvent) + Send + Sync>;

impl Stub {
    /// Sets what answers model code's calls.
    pub fn set_call_handler(&self, handler: CallHandler) {
        *self.calls.locked() = Some(handler);
    }

    /// Sets what takes model code's BLS calls.
    pub fn set_bls_handler(&self, handler: BlsHandler) {
        *self.bls.locked() = Some(handler);
    }

    fn bls(&self, event: BlsEvent) -> Result<(), HostError> {
        let handler = self.bls.locked().clone();
        match (handler, event) {
            (Some(h), event) => h(event),
            (None, BlsEvent::Request { call, request, .. }) => {
                for t in &request.inputs {
                    if let TensorData::Shm { desc, .. } = t.data {
                        self.channel.release(desc);
                    }
                }
                let error = StubError {
                    message: "this server does not take BLS requests here".into(),
                    code: 1,
                    traceback: None,
                };
                let response = Response {
                    request: 0,
                    outputs: Vec::new(),
                    error: Some(error),
                    parameters: Vec::new(),
                    final_response: true,
                    flag_only: false,
                };
                self.send(&ToStub::BlsResponse { call, response })?;
            }
            (None, BlsEvent::Cancel { .. }) => {}
        }
        Ok(())
    }

    fn answer(&self, call: u64, op: CallOp) -> Result<(), HostError> {
        let handler = self.calls.locked().clone();
        let result = match handler {
            Some(h) => h(op),
            None => Err("this server does not take calls from model code here".to_string()),
        };
        if call != 0 {
            self.send(&ToStub::Reply { call, result })?;
        }
        Ok(())
    }

    /// Handles what the stub sent while nobody waited for it (log records, calls from model
    /// threads, and the responses of a decoupled model's open requests, which go to
    /// `on_response`), at most [`POLL_CHUNK`] messages at a time: true when it stopped at that
    /// bound (more may be waiting), so the caller gets to look at its queue between chunks. The
    /// first message is waited for up to `wait`, the rest are taken only if already there.
    /// `on_response` refuses a response it has no open request for (with why, after releasing
    /// its blocks): a protocol error, as is any other message.
    pub fn poll(&self, wait: Duration, on_response: &mut OnResponse<'_>) -> Result<bool, HostError> {
        let mut wait = wait;
        for _ in 0..POLL_CHUNK {
            let Some(msg) = self.channel.recv(wait).map_err(|e| self.ipc(e))? else {
                return Ok(false);
            };
            wait = Duration::ZERO;
            match self.unasked(msg)? {
                None => {}
                Some(ToServer::Response(r)) => on_response(r).map_err(|why| self.protocol_error(why))?,
                Some(other) => return Err(self.protocol_error(format!("sent {other:?} while idle"))),
            }
        }
        Ok(true)
    }

    /// Handles what the stub sends unasked (log records, calls and BLS requests from model code) and hands back
    /// anything else.
    pub(super) fn unasked(&self, msg: ToServer) -> Result<Option<ToServer>, HostError> {
        match msg {
            ToServer::Log(record) => self.emit_log(&record),
            ToServer::Call { call, op } => self.answer(call, op)?,
            ToServer::BlsRequest { call, model, version, decoupled, request } => {
                self.bls(BlsEvent::Request { call, model, version, decoupled, request })?
            }
            ToServer::BlsCancel { call } => self.bls(BlsEvent::Cancel { call })?,
            ToServer::ClientMetrics { seq, families } => self.probe.deliver(seq, families),
            other => return Ok(Some(other)),
        }
        Ok(None)
    }

    fn emit_log(&self, r: &tritium_ipc::LogRecord) {
        let _enter = self.span.enter();
        let line = ModelLogLine(r);
        match r.level {
            LogLevel::Error => tracing::error!(target: "tritium::model", "{line}"),
            LogLevel::Warning => tracing::warn!(target: "tritium::model", "{line}"),
            LogLevel::Info => tracing::info!(target: "tritium::model", "{line}"),
            LogLevel::Verbose => tracing::debug!(target: "tritium::model", "{line}"),
        }
    }
}

/// A model's log record as the server prints it: `file:line] message`, or
/// `file:line] logger: message` for a record from Python's `logging` module. Formatted only when
/// the record's level is enabled.
struct ModelLogLine<'a>(&'a tritium_ipc::LogRecord);

impl std::fmt::Display for ModelLogLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.0;
        if r.logger.is_empty() {
            write!(f, "{}:{}] {}", r.file, r.line, r.message)
        } else {
            write!(f, "{}:{}] {}: {}", r.file, r.line, r.logger, r.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ModelLogLine;
    use tritium_ipc::{LogLevel, LogRecord};

    fn record(logger: &str) -> LogRecord {
        LogRecord {
            level: LogLevel::Info,
            logger: logger.into(),
            file: "/m/1/model.py".into(),
            line: 12,
            message: "hello".into(),
        }
    }

    #[test]
    fn logging_records_name_their_logger_and_pb_utils_records_do_not() {
        assert_eq!(ModelLogLine(&record("my.model")).to_string(), "/m/1/model.py:12] my.model: hello");
        assert_eq!(ModelLogLine(&record("")).to_string(), "/m/1/model.py:12] hello");
    }
}
