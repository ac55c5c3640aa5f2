//! Live Python stacks: a native thread that answers the server's stack requests without the GIL.
//!
//! The server holds one end of a `SOCK_SEQPACKET` socketpair (`--stacks-fd`); each request is a
//! sequence number (8 bytes, little endian). The thread ([`serve_stacks`]) raises the signal
//! that `faulthandler` is registered for on itself: the handler runs on this thread before
//! `raise` returns and writes the traceback of every Python thread into a memfd, reading the
//! threads' frames without the GIL (so it works while model code is stuck in C holding it).
//! Then, for at most [`GIL_WAIT`], a helper thread tries to take the GIL and call the Python
//! side's `extra()` (thread names, asyncio tasks); a stub whose GIL is held that long answers
//! without them. The reply is one message: the sequence number, then the text.

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// How long a stack request waits for the GIL for the parts that need it.
const GIL_WAIT: Duration = Duration::from_secs(1);

/// The largest reply: a `SOCK_SEQPACKET` message must fit the socket's send buffer.
const MAX_REPLY: usize = 160 << 10;

/// The signal `faulthandler` is registered for: a real-time signal that nothing else in a stub
/// uses.
#[pyfunction]
pub(crate) fn stack_signal() -> i32 {
    libc::SIGRTMIN() + 6
}

/// Starts the thread that answers stack requests on `socket_fd`, dumping through `dump_fd` (the
/// memfd `faulthandler` writes to on [`stack_signal`]) and calling `extra` with the GIL.
#[pyfunction]
pub(crate) fn serve_stacks(socket_fd: i32, dump_fd: i32, extra: Py<PyAny>) -> PyResult<()> {
    if socket_fd < 0 || dump_fd < 0 {
        return Err(PyValueError::new_err("file descriptors must be non-negative"));
    }
    // SAFETY: the server hands the socket to the stub at spawn for this use alone; the memfd was
    // created by the caller, which gives this thread a duplicate of it.
    let socket = UnixDatagram::from(unsafe { OwnedFd::from_raw_fd(socket_fd) });
    // SAFETY: `dup` of an fd the caller keeps open; the duplicate is owned here.
    let dup = unsafe { libc::fcntl(dump_fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(PyValueError::new_err(format!(
            "cannot duplicate the dump fd: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `dup` is a fresh fd owned by nothing else.
    let dump = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(dup) });
    let extra = Arc::new(extra);
    std::thread::Builder::new()
        .name("tritium-stacks".into())
        .spawn(move || answer(socket, dump, extra))
        .map_err(|e| PyValueError::new_err(format!("cannot start the stacks thread: {e}")))?;
    Ok(())
}

fn answer(socket: UnixDatagram, mut dump: std::fs::File, extra: Arc<Py<PyAny>>) {
    // One helper waiting for the GIL at a time: a stub stuck holding it gets no pile of them.
    let helper_busy = Arc::new(AtomicBool::new(false));
    let mut request = [0u8; 8];
    loop {
        match socket.recv(&mut request) {
            Ok(8) => {}
            // The server closed its end (or sent something else): stop.
            _ => return,
        }
        let mut text = faulthandler_dump(&mut dump);
        text.push_str(&extra_with_gil(&extra, &helper_busy));
        let mut reply = request.to_vec();
        let body = text.as_bytes();
        if body.len() > MAX_REPLY - 8 {
            let mut cut = MAX_REPLY - 64;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            reply.extend_from_slice(&body[..cut]);
            reply.extend_from_slice(b"\n... (cut: too long)\n");
        } else {
            reply.extend_from_slice(body);
        }
        if socket.send(&reply).is_err() {
            return;
        }
    }
}

/// Every Python thread's stack, as `faulthandler` writes them on [`stack_signal`].
fn faulthandler_dump(dump: &mut std::fs::File) -> String {
    if dump.set_len(0).is_err() || dump.seek(SeekFrom::Start(0)).is_err() {
        return "(cannot reset the stack dump file)\n".into();
    }
    // SAFETY: raising a signal on this thread; faulthandler's handler for it is async-signal-safe
    // and returns before `raise` does.
    if unsafe { libc::raise(stack_signal()) } != 0 {
        return format!("(cannot raise the stack signal: {})\n", std::io::Error::last_os_error());
    }
    let mut bytes = Vec::new();
    if dump.seek(SeekFrom::Start(0)).is_err() || dump.read_to_end(&mut bytes).is_err() {
        return "(cannot read the stack dump file)\n".into();
    }
    if bytes.is_empty() {
        return "(faulthandler wrote nothing: is it registered?)\n".into();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What `extra()` returns, taken with the GIL by a helper thread within [`GIL_WAIT`].
fn extra_with_gil(extra: &Arc<Py<PyAny>>, busy: &Arc<AtomicBool>) -> String {
    let waited = format!(
        "\n(thread names and asyncio tasks left out: the GIL was not released within {}s; \
         the stacks above were read without it)\n",
        GIL_WAIT.as_secs_f64()
    );
    if busy.swap(true, Ordering::AcqRel) {
        return waited;
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let (extra, flag) = (extra.clone(), busy.clone());
    let spawned = std::thread::Builder::new().name("tritium-stacks-gil".into()).spawn(move || {
        let text = Python::attach(|py| match extra.call0(py).and_then(|v| v.extract::<String>(py)) {
            Ok(text) => text,
            Err(e) => format!("\n(thread names and asyncio tasks: {e})\n"),
        });
        flag.store(false, Ordering::Release);
        let _ = tx.send(text);
    });
    if spawned.is_err() {
        busy.store(false, Ordering::Release);
        return "\n(cannot start a thread to take the GIL)\n".into();
    }
    rx.recv_timeout(GIL_WAIT).unwrap_or(waited)
}
