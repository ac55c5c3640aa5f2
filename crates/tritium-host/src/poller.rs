//! One thread, `stub-output`, reads the stdout and stderr of every stub (and fork server) into
//! the log and watches every stub's process: an epoll set of their pipes, each read without
//! blocking when it has something and split into lines as [`crate::output::read_lines`] does,
//! and of their pidfds, readable once the process ended; every [`TICK`] while a stub is watched
//! it also checks their heartbeats and reaps orphans. The server's thread count then does not
//! grow with its stubs (two reader threads and a watcher thread per stub before).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use tracing::Span;
use tritium_sync::Locked;

use crate::output::{Lines, StderrTail, MAX_LINE};

/// A pipe being read: where its lines go.
struct Pipe {
    fd: OwnedFd,
    span: Span,
    /// Stderr: its lines are warnings and its last ones are kept; else stdout.
    stderr: Option<StderrTail>,
    lines: Lines,
}

impl Pipe {
    fn emit(&mut self, bytes: Option<&[u8]>) {
        let Pipe { span, stderr, lines, .. } = self;
        let _enter = span.enter();
        let mut emit = |line: String| match stderr {
            Some(tail) => {
                tracing::warn!(target: "tritium::stub", "{line}");
                tail.push(line);
            }
            None => tracing::info!(target: "tritium::stub", "{line}"),
        };
        match bytes {
            Some(b) => lines.push(b, &mut emit),
            None => lines.finish(&mut emit),
        }
    }
}

/// How often watched stubs' heartbeats are checked.
pub(crate) const TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// Tokens of watched pidfds have this bit; pipes' do not.
const WATCH_BIT: u64 = 1 << 63;
/// The token of the eventfd that wakes the shared thread.
const WAKE: u64 = WATCH_BIT - 1;

/// A stub's process being watched.
pub(crate) struct Watch {
    /// Its pidfd.
    pub pidfd: OwnedFd,
    /// Set when nobody wants to hear of its exit any more: dropped without calling `on_exit`.
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Runs once when the process ended (on the shared thread: it must not block).
    pub on_exit: Box<dyn FnOnce() + Send>,
    /// Runs every [`TICK`] (on the shared thread: it must not block).
    pub tick: Box<dyn FnMut(&OwnedFd) + Send>,
}

struct Poller {
    epoll: OwnedFd,
    wake: OwnedFd,
    pipes: Mutex<HashMap<u64, Pipe>>,
    watches: Mutex<HashMap<u64, Watch>>,
    next: std::sync::atomic::AtomicU64,
}

static POLLER: OnceLock<Result<Poller, String>> = OnceLock::new();

fn poller() -> Result<&'static Poller, String> {
    POLLER
        .get_or_init(|| {
            // SAFETY: epoll_create1 returns a new fd or -1.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return Err(format!("epoll_create1: {}", std::io::Error::last_os_error()));
            }
            // SAFETY: epoll_create1 just returned this fd to us.
            let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: eventfd returns a new fd or -1.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
            }
            // SAFETY: eventfd just returned this fd to us.
            let wake = unsafe { OwnedFd::from_raw_fd(fd) };
            let mut event = libc::epoll_event { events: libc::EPOLLIN as u32, u64: WAKE };
            // SAFETY: adds our eventfd to our epoll set.
            if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, wake.as_raw_fd(), &mut event) } < 0 {
                return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()));
            }
            std::thread::Builder::new().name("stub-output".into()).spawn(run).map_err(|e| e.to_string())?;
            Ok(Poller {
                epoll,
                wake,
                pipes: Mutex::new(HashMap::new()),
                watches: Mutex::new(HashMap::new()),
                next: 0.into(),
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Reads `fd` (a pipe's read end) to its end on the shared thread: each line is logged in `span`,
/// at warning level and kept in `stderr` for a stub's stderr, at info level otherwise.
pub(crate) fn forward(fd: OwnedFd, span: Span, stderr: Option<StderrTail>) {
    let p = match poller() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("cannot read stub output: {e}");
            return;
        }
    };
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    let token = p.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let raw = fd.as_raw_fd();
    let mut pipes = p.pipes.locked();
    pipes.insert(token, Pipe { fd, span, stderr, lines: Lines::new(MAX_LINE) });
    let mut event = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32, u64: token };
    // SAFETY: adds an fd we hold (in `pipes`) to our epoll set.
    if unsafe { libc::epoll_ctl(p.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, raw, &mut event) } < 0 {
        tracing::error!("cannot read stub output: epoll_ctl: {}", std::io::Error::last_os_error());
        pipes.remove(&token);
    }
}

/// Watches a stub's process on the shared thread (see [`Watch`]).
pub(crate) fn watch(w: Watch) -> std::io::Result<()> {
    let p = poller().map_err(std::io::Error::other)?;
    let token = p.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) | WATCH_BIT;
    let raw = w.pidfd.as_raw_fd();
    let mut watches = p.watches.locked();
    watches.insert(token, w);
    let mut event = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
    // SAFETY: adds an fd we hold (in `watches`) to our epoll set.
    if unsafe { libc::epoll_ctl(p.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, raw, &mut event) } < 0 {
        let e = std::io::Error::last_os_error();
        watches.remove(&token);
        return Err(e);
    }
    drop(watches);
    // The shared thread may be waiting without a timeout (nothing was watched): wake it for the
    // ticks.
    let one: u64 = 1;
    // SAFETY: writes 8 bytes to our eventfd.
    unsafe { libc::write(p.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    Ok(())
}

/// The shared thread: waits for pipes with something to read, reads each until it would block,
/// and drops those that ended.
fn run() {
    let p = loop {
        // The poller is set once this thread's spawner returns.
        if let Some(Ok(p)) = POLLER.get() {
            break p;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_tick = std::time::Instant::now();
    loop {
        // Without a watched stub, no ticks: the thread sleeps until output comes.
        let watching = !p.watches.locked().is_empty();
        let timeout = if watching { TICK.saturating_sub(last_tick.elapsed()).as_millis() as i32 } else { -1 };
        // SAFETY: waits on our epoll fd into a buffer of `events.len()` entries.
        let n = unsafe { libc::epoll_wait(p.epoll.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, timeout) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("stub output poller: epoll_wait: {e}");
            return;
        }
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token == WAKE {
                let mut count = 0u64;
                // SAFETY: reads 8 bytes from our eventfd.
                unsafe { libc::read(p.wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            } else if token & WATCH_BIT != 0 {
                let ended = p.watches.locked().remove(&token);
                if let Some(w) = ended {
                    if !w.stop.load(std::sync::atomic::Ordering::Acquire) {
                        (w.on_exit)();
                    }
                }
            }
        }
        if last_tick.elapsed() >= TICK {
            last_tick = std::time::Instant::now();
            let mut watches = p.watches.locked();
            watches.retain(|_, w| !w.stop.load(std::sync::atomic::Ordering::Acquire));
            for w in watches.values_mut() {
                (w.tick)(&w.pidfd);
            }
            drop(watches);
            // Orphans reparented to the server (a child subreaper once a fork server runs).
            crate::orphans::reap_orphans();
        }
        let mut pipes = p.pipes.locked();
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token & WATCH_BIT != 0 || token == WAKE {
                continue;
            }
            let Some(pipe) = pipes.get_mut(&token) else { continue };
            // At most 16 reads before the other pipes' turn (epoll reports it again).
            let mut reads = 0;
            let ended = loop {
                reads += 1;
                if reads > 16 {
                    break false;
                }
                // SAFETY: reads into our buffer from a pipe we hold.
                let r = unsafe { libc::read(pipe.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if r > 0 {
                    pipe.emit(Some(&buf[..r as usize]));
                    continue;
                }
                if r == 0 {
                    break true;
                }
                match std::io::Error::last_os_error().kind() {
                    std::io::ErrorKind::Interrupted => continue,
                    std::io::ErrorKind::WouldBlock => break false,
                    _ => break true,
                }
            };
            if ended {
                pipe.emit(None);
                // Closing the fd (dropping it) takes it out of the epoll set.
                pipes.remove(&token);
            }
        }
    }
}
