//! Triton mode: the JSON trace file (`--trace-config triton,file=...`), as Triton writes it
//! (`TraceManager::TraceFile`, `TraceActivity`): each trace is an object naming the model,
//! version, request id and parent, then one object per timestamp, all in one JSON array.
//! With a log frequency N, every N traces go to `<file>.<index>`; with 0, everything goes to
//! `<file>` at shutdown; when the trace count runs out, what was collected goes to the next
//! indexed file.

use std::sync::{Mutex, MutexGuard};

use serde_json::json;
use tritium_sync::Locked;

use crate::{ActiveTrace, Clock};

/// One trace's objects, comma-separated, without the enclosing brackets.
pub(crate) fn trace_json(t: &ActiveTrace, clock: &Clock) -> String {
    let mut head = json!({ "id": t.id, "model_name": t.model, "model_version": t.version });
    if !t.request_id.is_empty() {
        head["request_id"] = json!(t.request_id);
    }
    let mut parts = vec![head.to_string()];
    let mut events = t.events.clone();
    events.sort_by_key(|(_, at)| *at);
    for (activity, at) in events {
        parts.push(
            json!({ "id": t.id, "timestamps": [{ "name": activity.name(), "ns": clock.monotonic(at) }] }).to_string(),
        );
    }
    parts.join(",")
}

#[derive(Default)]
struct FileState {
    /// Traces not written yet, comma-separated.
    buffer: String,
    in_buffer: u32,
    /// The next indexed file.
    index: u32,
}

/// The trace file and the traces waiting for it.
pub(crate) struct TraceFile {
    path: String,
    state: Mutex<FileState>,
}

impl TraceFile {
    pub(crate) fn new(path: String) -> TraceFile {
        TraceFile { path, state: Mutex::new(FileState::default()) }
    }

    fn state(&self) -> MutexGuard<'_, FileState> {
        self.state.locked()
    }

    /// Adds one trace; writes the indexed file when `log_frequency` traces are waiting, or
    /// when the count ran out (`done`).
    pub(crate) fn append(&self, trace: &str, log_frequency: u32, done: bool) {
        if self.path.is_empty() {
            return;
        }
        let mut s = self.state();
        if s.in_buffer != 0 {
            s.buffer.push(',');
        }
        s.buffer.push_str(trace);
        s.in_buffer += 1;
        if done || (log_frequency != 0 && s.in_buffer >= log_frequency) {
            self.write_indexed(&mut s);
        }
    }

    fn write_indexed(&self, s: &mut FileState) {
        let path = format!("{}.{}", self.path, s.index);
        s.index += 1;
        let text = format!("[{}]", std::mem::take(&mut s.buffer));
        s.in_buffer = 0;
        if let Err(e) = std::fs::write(&path, text) {
            tracing::error!("failed creating trace file {path:?}: {e}");
        }
    }

    /// At shutdown: what is waiting goes to the next indexed file (log frequency set) or to
    /// the file itself.
    pub(crate) fn flush(&self, log_frequency: u32) {
        let mut s = self.state();
        if s.in_buffer == 0 || self.path.is_empty() {
            return;
        }
        if log_frequency != 0 {
            self.write_indexed(&mut s);
            return;
        }
        let text = format!("[{}]", std::mem::take(&mut s.buffer));
        s.in_buffer = 0;
        if let Err(e) = std::fs::write(&self.path, text) {
            tracing::error!("failed creating trace file {:?}: {e}", self.path);
        }
    }
}
