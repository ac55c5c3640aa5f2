//! The one seam between an instance and the rest of the server: [`ModelCalls`], what model
//! code's BLS requests and model-control calls go through, and [`BlsCalls`], the BLS calls an
//! instance's stub has in flight (what deadlock detection reads).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;
use tritium_host::BlsHandler;
use tritium_ipc::{CallOp, CallResult, ServerChannel};
use tritium_sync::Locked;

use super::{Instance, VersionContext};

/// What an instance needs from outside: a handler for its stub's BLS requests, and model
/// control (`pb_utils.is_model_ready`, `load_model`, `unload_model`). The version context holds
/// one; an instance never holds the server.
pub(crate) trait ModelCalls: Send + Sync {
    /// The handler of the BLS requests of one stub of `instance` (of version `caller`), which
    /// answers on `channel`. It must not block the worker that calls it.
    fn bls_handler(
        &self,
        caller: &Arc<VersionContext>,
        instance: &Arc<Instance>,
        channel: &Arc<ServerChannel>,
    ) -> BlsHandler;

    /// Answers one model-control call of model code of `caller`; the error is the text the
    /// model sees.
    fn model_control(&self, caller: &str, op: CallOp) -> Result<CallResult, String>;
}

/// Model calls for versions that make none: ensembles, and instances in unit tests.
pub(crate) struct NoModelCalls;

impl ModelCalls for NoModelCalls {
    fn bls_handler(&self, _: &Arc<VersionContext>, _: &Arc<Instance>, _: &Arc<ServerChannel>) -> BlsHandler {
        Arc::new(|_| {})
    }

    fn model_control(&self, _: &str, op: CallOp) -> Result<CallResult, String> {
        Err(format!("{op:?} is not served here"))
    }
}

/// One BLS call in flight: the version it went to and what cancels it.
pub(crate) struct BlsCall {
    /// The version the call waits on.
    pub target: Weak<VersionContext>,
    /// Notified when the caller cancels the call.
    pub cancel: Arc<Notify>,
}

/// The BLS calls an instance's stub has in flight, by stub channel and call id.
#[derive(Default)]
pub(crate) struct BlsCalls(Mutex<HashMap<(usize, u64), BlsCall>>);

impl BlsCalls {
    /// The calls, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<(usize, u64), BlsCall>> {
        self.0.locked()
    }

    /// The versions the calls in flight wait on.
    pub(crate) fn targets(&self) -> Vec<Arc<VersionContext>> {
        self.lock().values().filter_map(|c| c.target.upgrade()).collect()
    }
}
