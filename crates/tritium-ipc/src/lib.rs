//! Shared-memory IPC between the tritium server and its Python stubs.
//!
//! This crate is the only implementation of the wire format; the server and the stub's native
//! module both use it. See ARCHITECTURE.md for the layout and the invariants.
//!
//! - [`segment`]: memfd-backed shared segments.
//! - [`ring`]: single-producer/single-consumer rings with futex doorbells.
//! - [`arena`]: allocation of tensor bytes in a side's own segments; bounds-checked descriptors.
//! - [`protocol`]: the messages of the stub protocol and the dtype table.
//! - [`spin`]: the spin budget, from the measured cost of a wake-up.
//! - [`copy`]: copies of tensor bytes for another process to read (streaming stores when large).
//! - [`fault`]: surviving a client that truncates its region under a mapping (`SIGBUS`).
//! - [`channel`]: one stub's rings, segments, fd socket and arena, behind `send`/`recv`.

pub mod arena;
pub mod channel;
pub mod copy;
pub mod error;
pub mod fault;
mod futex;
pub mod protocol;
pub mod ring;
pub mod segment;
pub mod spin;

pub use arena::{Descriptor, Side};
pub use channel::{Channel, ChannelConfig, ChannelLimits, Interrupter, PeerFds, ServerChannel, StubChannel, View};
pub use error::IpcError;
pub use protocol::*;
pub use ring::{Doorbell, RingGeometry, WaitPolicy};
