//! Request tracing in the core: each request queued through [`Server::enqueue`] asks the
//! server's [`Tracer`] whether it is traced (`REQUEST_START` when the server took it,
//! `QUEUE_START` when it is queued); the instance worker stamps the compute activities and
//! hands the model its trace context; the trace is recorded when the request is dropped,
//! after its answer. The trace extension reads and updates the settings here, with Triton's
//! texts.

use std::sync::Arc;
use std::time::Instant;

use tritium_trace::{ActiveTrace, Activity, Tracer, UpdateValue};

use super::Server;
use crate::instance::VersionContext;
use crate::types::{InferError, InferRequest};

/// A trace setting as the trace extension lists it: names and values, `trace_level` a list,
/// every other value one string.
pub type TraceSettingsView = Vec<(String, Vec<String>)>;

impl Server {
    /// Gives the server its tracer (`--trace-config`); only the first call counts.
    pub fn set_tracer(&self, tracer: Tracer) {
        let _ = self.core.tracer.set(tracer);
    }

    /// The server's tracer, if it has one.
    pub fn tracer(&self) -> Option<&Tracer> {
        self.core.tracer.get()
    }

    /// Starts the trace of a request that is about to be queued, if it is sampled.
    pub(crate) fn start_trace(
        &self,
        req: &InferRequest,
        ctx: &Arc<VersionContext>,
        started: Instant,
    ) -> Option<Box<ActiveTrace>> {
        let mut trace = self.core.tracer.get()?.start(&req.model, req.trace, started)?;
        trace.identify(ctx.version, &req.id);
        trace.stamp(Activity::QueueStart, Instant::now());
        Some(Box::new(trace))
    }

    fn trace_target(&self, model: Option<&str>) -> Result<&Tracer, InferError> {
        let tracer =
            self.core.tracer.get().ok_or_else(|| InferError::unavailable("the server does not support tracing"))?;
        if let Some(m) = model {
            if !self.model_ready(m, None) {
                return Err(InferError::invalid(format!("Request for unknown model : {m}")));
            }
        }
        Ok(tracer)
    }

    /// The trace settings of `model` (the global ones for `None`), as the trace extension
    /// answers them.
    pub fn trace_settings(&self, model: Option<&str>) -> Result<TraceSettingsView, InferError> {
        Ok(self.trace_target(model)?.settings(model).view())
    }

    /// Updates the trace settings of `model` (the global ones for `None`) from the named
    /// values of a trace extension request, and answers the settings now in force.
    pub fn update_trace_settings(
        &self,
        model: Option<&str>,
        values: &[(String, UpdateValue)],
    ) -> Result<TraceSettingsView, InferError> {
        let tracer = self.trace_target(model)?;
        let update = tritium_trace::parse_update(values).map_err(setting_error)?;
        Ok(tracer.update(model, &update).map_err(setting_error)?.view())
    }
}

fn setting_error(e: tritium_trace::SettingError) -> InferError {
    match e {
        tritium_trace::SettingError::Unsupported(m) => InferError::new(crate::types::ErrorKind::Unsupported, m),
        tritium_trace::SettingError::Invalid(m) => InferError::invalid(m),
    }
}
