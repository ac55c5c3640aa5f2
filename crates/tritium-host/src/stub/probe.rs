//! [`MetricsProbe`]: asking a stub, from any thread, for its model code's `prometheus_client`
//! metrics, and the one request a stub has open ([`ProbeState`]), answered through whichever
//! thread reads the stub's messages.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tritium_ipc::{ClientFamily, ServerChannel, ToStub};
use tritium_sync::Locked;

use super::Stub;

/// What a stub answered to a metrics request: its `prometheus_client` families, or why not.
pub type ClientMetrics = Result<Vec<ClientFamily>, String>;

/// A metrics request not answered yet.
struct Asked {
    seq: u64,
    at: Instant,
    answer: std::sync::mpsc::SyncSender<ClientMetrics>,
}

/// The metrics request a stub has open (at most one).
#[derive(Default)]
pub(super) struct ProbeState {
    next: std::sync::atomic::AtomicU64,
    asked: Mutex<Option<Asked>>,
}

impl ProbeState {
    /// Hands the answer to `seq` to whoever asked; an answer nobody waits for any more (late, or
    /// never asked for) is dropped.
    pub(super) fn deliver(&self, seq: u64, families: ClientMetrics) {
        let mut asked = self.asked.locked();
        if asked.as_ref().is_some_and(|a| a.seq == seq) {
            if let Some(a) = asked.take() {
                let _ = a.answer.try_send(families);
            }
        }
    }
}

/// How long an unanswered metrics request keeps a stub from being asked again.
const PROBE_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Asks a stub, from any thread, for the metrics its model code registered with
/// `prometheus_client` (the answer comes through whichever thread reads the stub's messages).
/// Asking never waits: a stub whose ring is full, or that has not answered the previous request
/// (for up to 30 s), is not asked.
#[derive(Clone)]
pub struct MetricsProbe {
    channel: Arc<ServerChannel>,
    state: Arc<ProbeState>,
}

impl MetricsProbe {
    /// Sends a request; the answer comes on the returned receiver. None when the stub was not
    /// asked (see above) or its channel failed.
    pub fn ask(&self) -> Option<std::sync::mpsc::Receiver<ClientMetrics>> {
        let mut asked = self.state.asked.locked();
        if asked.as_ref().is_some_and(|a| a.at.elapsed() < PROBE_RETRY_AFTER) {
            return None;
        }
        let seq = self.state.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let (answer, receiver) = std::sync::mpsc::sync_channel(1);
        match self.channel.try_send(&ToStub::CollectMetrics { seq }) {
            Ok(true) => {
                *asked = Some(Asked { seq, at: Instant::now(), answer });
                Some(receiver)
            }
            Ok(false) | Err(_) => None,
        }
    }
}

impl Stub {
    /// Asks this stub for its `prometheus_client` metrics from other threads.
    pub fn metrics_probe(&self) -> MetricsProbe {
        MetricsProbe { channel: self.channel.clone(), state: self.probe.clone() }
    }
}
