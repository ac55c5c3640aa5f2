//! The server's side of a stub: spawning one Python stub process per model instance, handing it
//! its shared-memory channel, and driving the stub protocol (hello, auto-complete, initialize,
//! execute, finalize) with the stub's liveness checked on every wait.
//!
//! - [`process`]: the one place that spawns processes; children are killed and reaped on drop.
//! - [`output`]: a stub's stdout and stderr into bounded, lossless-where-possible log lines,
//!   read for every stub by one thread (`poller`).
//! - [`stub`]: [`Stub`], a running stub and its protocol calls.
//! - [`stacks`]: [`StackProbe`], a stub's live Python stacks, read without its GIL.

mod orphans;
pub mod output;
pub mod peer;
mod poller;
pub mod process;
pub mod stacks;
pub mod stub;

pub use process::{
    hide_from_same_user, reap_orphans, run_tool, set_fork_server, OnLine, ProcessWatch, StubCommand, StubExit,
    ToolOutcome, NO_FORK_SERVER_ENV, STUB_MALLOC_DEFAULTS,
};
pub use stacks::{StackError, StackProbe};
pub use stub::{
    BlsEvent, BlsHandler, CallHandler, ClientMetrics, Executed, HostError, MetricsProbe, OnResponse, Stub, StubInfo,
    Submitted, LIVENESS_SLICE, POLL_CHUNK, STACKS_BEFORE_KILL, WATCH_SLICE,
};
pub use tritium_ipc::{spin, ChannelLimits};
