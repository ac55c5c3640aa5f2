//! Spawning stub processes: the only place in tritium that starts a child process.
//!
//! A stub inherits exactly two extra fds (the control segment at fd 3, the segment socket at
//! fd 4), runs in its own process group, and gets `SIGKILL` when the server dies
//! (`PR_SET_PDEATHSIG`; the stub also checks its parent pid on every wait timeout). Its stdout and
//! stderr are read line by line into the server's log; the last lines of stderr are kept for
//! error messages. [`ChildGuard`] kills and reaps the process when dropped.
//!
//! **Fork servers.** With [`set_fork_server`] on (`--stub-fork-server`, the default), a stub is
//! forked from a fork server (`python -m tritium.forkserver`) instead: one per interpreter,
//! `PYTHONPATH` and extra environment, started like a stub (so everything read at process start,
//! `MALLOC_*` above all, is the stub's), that has imported what stubs import and started no
//! thread. It gets requests on a `SOCK_SEQPACKET` socket (the five fds with `SCM_RIGHTS`) and
//! forks twice: the stub is reparented to the server, which is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), and only then sets `PR_SET_PDEATHSIG` (a parent-death signal fires
//! on every change of parent, so set earlier it would fire when the intermediate child exits),
//! then checks that its parent is the server. Why this rather than leaving the stub the fork
//! server's child, with a pidfd and the exit status relayed by the fork server: the server keeps
//! supervising every stub the same way (`waitpid` gives the exact exit status, a pidfd kills it,
//! its parent-death signal is the server's death, the stub's own check of its parent pid holds),
//! and a fork server that dies takes no stub with it and loses no exit status. The cost: orphaned
//! descendants of the stubs (processes model code leaves behind) become the server's children
//! too; [`reap_orphans`] reaps those no [`ChildGuard`] or [`run_tool`] owns (every child this
//! module starts is registered as owned while it is started). A fork server that is not safe to
//! fork from (more than one thread) or cannot start turns its stubs into plain starts, with one
//! log line; one that died is replaced at the next start. A model opts out with
//! [`NO_FORK_SERVER_ENV`] in its stub's environment (its config's `FORK_SERVER: "false"`).
//!
//! Every child (a stub, an installer, an interpreter probe) gets the server's environment
//! without the server's own settings: no `TRITIUM_*` variable reaches it unless the server sets
//! it for that child. Among those settings are secrets (`TRITIUM_ADMIN_TOKEN`) and paths a model
//! has no business with (TLS keys); model code and the packages an installer runs are untrusted.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::Span;
use tritium_sync::Locked;

pub use crate::orphans::reap_orphans;
use crate::orphans::{lock_owned, spawn_owned, SUBREAPER};
pub use crate::output::StderrTail;

/// How long a stub gets after SIGTERM before SIGKILL.
const TERM_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// What is needed to start one stub.
#[derive(Debug, Clone)]
pub struct StubCommand {
    /// The Python interpreter.
    pub python: PathBuf,
    /// Directory holding the `tritium` package (with `_native`) and `triton_python_backend_utils`.
    pub python_path: PathBuf,
    /// Extra environment variables for the stub.
    pub env: Vec<(OsString, OsString)>,
    /// Longest busy-poll, in microseconds, before a wait sleeps (both sides; adaptive, see
    /// `tritium_ipc::WaitPolicy`).
    pub spin: u32,
}

/// How a stub process ended. Its `Display` is the wording of error messages: `exit code 1`,
/// `killed by signal 9 (SIGKILL)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StubExit {
    /// It exited by itself with this code.
    Code(i32),
    /// A signal ended it.
    Signal {
        /// The signal number.
        signal: i32,
        /// Its name (`SIGKILL`), or `unknown` for a number this platform does not name.
        name: &'static str,
    },
    /// No exit status could be had (the process could not be started or reaped): what happened
    /// instead.
    Other(String),
}

impl StubExit {
    /// The exit for a signal number, named as this platform names it.
    pub fn signal(signal: i32) -> Self {
        let name = nix::sys::signal::Signal::try_from(signal).map_or("unknown", |s| s.as_str());
        StubExit::Signal { signal, name }
    }
}

impl std::fmt::Display for StubExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StubExit::Code(code) => write!(f, "exit code {code}"),
            StubExit::Signal { signal, name } => write!(f, "killed by signal {signal} ({name})"),
            StubExit::Other(what) => f.write_str(what),
        }
    }
}

impl From<ExitStatus> for StubExit {
    fn from(s: ExitStatus) -> Self {
        if let Some(code) = s.code() {
            StubExit::Code(code)
        } else if let Some(sig) = s.signal() {
            StubExit::signal(sig)
        } else {
            StubExit::Other(s.to_string())
        }
    }
}

/// The process behind a [`ChildGuard`].
#[derive(Debug)]
enum Proc {
    /// Started by [`Command::spawn`].
    Spawned(Child),
    /// Forked by a fork server and reparented to this process (a child subreaper): waited for
    /// with `waitpid`, killed through its pidfd.
    Adopted { pid: u32, pidfd: OwnedFd },
}

/// A child process that is killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    proc: Proc,
    exit: Option<StubExit>,
}

impl ChildGuard {
    fn spawned(child: Child) -> Self {
        Self { proc: Proc::Spawned(child), exit: None }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        match &self.proc {
            Proc::Spawned(child) => child.id(),
            Proc::Adopted { pid, .. } => *pid,
        }
    }

    /// Whether a fork server forked it.
    pub fn forked(&self) -> bool {
        matches!(self.proc, Proc::Adopted { .. })
    }

    fn reaped(&mut self, exit: StubExit) -> StubExit {
        lock_owned().remove(&self.pid());
        self.exit = Some(exit.clone());
        exit
    }

    /// Returns how the process ended, if it has; reaps it.
    pub fn try_exit(&mut self) -> Option<StubExit> {
        if self.exit.is_none() {
            let exit = match &mut self.proc {
                Proc::Spawned(child) => match child.try_wait() {
                    Ok(Some(status)) => Some(status.into()),
                    _ => None,
                },
                Proc::Adopted { pid, .. } => wait_pid(*pid, libc::WNOHANG),
            };
            if let Some(exit) = exit {
                self.reaped(exit);
            }
        }
        self.exit.clone()
    }

    /// Waits for the process to end by itself for up to `timeout`, then sends SIGTERM and waits
    /// a short grace period, then kills it.
    pub fn wait_or_kill(&mut self, timeout: std::time::Duration) -> StubExit {
        if let Some(e) = self.wait_for(timeout) {
            return e;
        }
        tracing::warn!(pid = self.pid(), "stub did not exit in {timeout:?}; sending SIGTERM");
        // SAFETY: plain kill of our own, not yet reaped, child.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGTERM) };
        if let Some(e) = self.wait_for(TERM_GRACE) {
            return e;
        }
        tracing::warn!(pid = self.pid(), "stub ignored SIGTERM; killing it");
        self.kill()
    }

    fn wait_for(&mut self, timeout: std::time::Duration) -> Option<StubExit> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_exit() {
                return Some(e);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> StubExit {
        if let Some(e) = self.try_exit() {
            return e;
        }
        let desc = match &mut self.proc {
            Proc::Spawned(child) => {
                let _ = child.kill();
                match child.wait() {
                    Ok(status) => status.into(),
                    Err(e) => StubExit::Other(format!("unknown ({e})")),
                }
            }
            Proc::Adopted { pid, pidfd } => {
                if let Err(e) = pidfd_kill(std::os::fd::AsFd::as_fd(pidfd)) {
                    tracing::warn!(pid = *pid, "cannot kill the stub: {e}");
                }
                wait_pid(*pid, 0).unwrap_or_else(|| StubExit::Other("unknown (not reaped)".into()))
            }
        };
        self.reaped(desc)
    }
}

/// `waitpid(pid, flags)`: how it ended, if it has (or could not be waited for at all).
fn wait_pid(pid: u32, flags: libc::c_int) -> Option<StubExit> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waitpid on a pid with a valid status pointer.
        let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, flags) };
        if rc == pid as libc::pid_t {
            return Some(ExitStatus::from_raw(status).into());
        }
        if rc == 0 {
            return None;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Some(StubExit::Other(format!("unknown ({e})")));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends SIGKILL to the process `pidfd` refers to. Unlike `kill(pid)`, this cannot reach
/// another process that was given the same pid after ours exited and was reaped.
pub fn pidfd_kill(pidfd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal takes a pidfd, a signal, a null siginfo and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Opens a pidfd for `pid`.
pub fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as libc::c_int;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_open just returned this fd to us.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// A look at whether one process still runs, cheap enough for every readiness check: a pidfd,
/// which turns readable when its process exits, before anyone reaps it. So an exited child
/// that its supervisor has not waited for yet (a zombie) counts as ended, which `kill(pid, 0)`
/// would not see, and a later process given the same pid is never mistaken for it.
#[derive(Debug)]
pub struct ProcessWatch(OwnedFd);

impl ProcessWatch {
    /// Watches `pid`, which must be a process that has not been reaped (a child of ours).
    pub fn open(pid: u32) -> std::io::Result<Self> {
        pidfd_open(pid).map(Self)
    }

    /// Whether the process has ended.
    pub fn exited(&self) -> bool {
        let mut p = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd and a zero timeout: poll only reads the fd's readiness.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
    }
}

/// The prefix of the server's own environment variables, none of which a child inherits.
const SERVER_SETTINGS_PREFIX: &str = "TRITIUM_";

/// Removes the server's own settings (`TRITIUM_*`) from what `command` inherits; what the caller
/// sets explicitly afterwards (`.env`) still reaches the child.
fn without_server_settings(command: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        if key.as_encoded_bytes().starts_with(SERVER_SETTINGS_PREFIX.as_bytes()) {
            command.env_remove(key);
        }
    }
    command
}

/// glibc's allocator settings a stub starts with unless the server's environment sets the
/// allocator itself (any `MALLOC_*` variable, or `GLIBC_TUNABLES`): allocations under 128 MiB come
/// from the heap rather than from fresh `mmap`s, the heap keeps up to 512 MiB of freed memory
/// instead of handing it back at once, and it grows 64 MiB at a time. A model that makes new
/// multi-MiB arrays per request (its outputs, numpy temporaries) then reuses the same pages
/// instead of faulting in fresh ones from the kernel on every request (issue 34 measured ~1,300
/// minor faults per request with glibc's defaults on two 4 MiB inputs and outputs).
pub const STUB_MALLOC_DEFAULTS: [(&str, &str); 3] =
    [("MALLOC_MMAP_THRESHOLD_", "134217728"), ("MALLOC_TRIM_THRESHOLD_", "536870912"), ("MALLOC_TOP_PAD_", "67108864")];

/// Whether `vars` (an environment) sets glibc's allocator itself.
fn sets_allocator(mut vars: impl Iterator<Item = OsString>) -> bool {
    vars.any(|k| {
        let k = k.as_encoded_bytes();
        k.starts_with(b"MALLOC_") || k == b"GLIBC_TUNABLES"
    })
}

/// Gives `command` [`STUB_MALLOC_DEFAULTS`] unless the server's environment or `explicit` (what
/// the caller sets for this child) configures the allocator.
fn with_allocator_defaults<'a>(command: &'a mut Command, explicit: &[(OsString, OsString)]) -> &'a mut Command {
    let own = std::env::vars_os().map(|(k, _)| k);
    if !sets_allocator(own.chain(explicit.iter().map(|(k, _)| k.clone()))) {
        command.envs(STUB_MALLOC_DEFAULTS);
    }
    command
}

/// Makes the calling process (the server) non-dumpable: its `/proc/<pid>` entries (`environ`,
/// `mem`, `fd`) become unreadable to other processes of the same user that lack
/// `CAP_SYS_PTRACE`, models among them, and it writes no core dump. The server does this when it
/// holds a secret (an admin token); `/proc/<pid>/cmdline` stays readable, so a secret belongs in
/// the environment, never on the command line.
pub fn hide_from_same_user() -> std::io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(std::io::Error::from)
}

/// A [`Command`] running `cmd.python` with a stub's environment: the server's without its own
/// settings, the allocator defaults, `PYTHONPATH` leading to tritium, `cmd.env`; stdin from
/// `/dev/null`, stdout and stderr piped. In its own process group with `PR_SET_PDEATHSIG`, and
/// `fds` placed at 3, 4, 5... in the child.
fn python_command(cmd: &StubCommand, fds: &[&OwnedFd]) -> Command {
    let mut pythonpath = OsString::from(cmd.python_path.as_os_str());
    if let Some(existing) = std::env::var_os("PYTHONPATH") {
        pythonpath.push(":");
        pythonpath.push(existing);
    }
    let mut command = Command::new(&cmd.python);
    with_allocator_defaults(without_server_settings(&mut command), &cmd.env)
        .env("PYTHONPATH", pythonpath)
        .env("PYTHONUNBUFFERED", "1")
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let raw: Vec<libc::c_int> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls (fcntl, dup2, close, setpgid, prctl, getppid, _exit) on fds that stay open
    // until then; `raw` was allocated before the fork.
    unsafe {
        command.pre_exec(move || {
            // Move the fds above the targets first, so that placing one cannot clobber another.
            let mut moved = [0; 8];
            for (m, &fd) in moved.iter_mut().zip(&raw) {
                *m = libc::fcntl(fd, libc::F_DUPFD, 10);
                if *m < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (target, &m) in (3..).zip(moved.iter().take(raw.len())) {
                if libc::dup2(m, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(m);
            }
            // Own process group: a Ctrl-C on the server's terminal reaches the server, which then
            // shuts its stubs down in order.
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    command
}

/// Starts a stub for the channel whose fds are `control`, `socket` and `stacks` (3, 4 and 5 in
/// the stub): forked from the fork server of its interpreter and environment where that is on
/// and works, else as `python -m tritium.stub`.
pub(crate) fn spawn(
    cmd: &StubCommand,
    control: OwnedFd,
    socket: OwnedFd,
    stacks: OwnedFd,
    span: Span,
) -> std::io::Result<(ChildGuard, StderrTail)> {
    if fork_server_wanted(cmd) {
        match fork::spawn(cmd, [&control, &socket, &stacks]) {
            Ok(Some((guard, out, err))) => {
                drop((control, socket, stacks));
                let stderr = StderrTail::default();
                crate::poller::forward(out, span.clone(), None);
                crate::poller::forward(err, span, Some(stderr.clone()));
                return Ok((guard, stderr));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(parent: &span, "cannot fork the stub from the fork server ({e}); starting it plainly")
            }
        }
    }
    let mut command = python_command(cmd, &[&control, &socket, &stacks]);
    command
        .args(["-m", "tritium.stub", "--control-fd", "3", "--socket-fd", "4", "--stacks-fd", "5", "--spin-us"])
        .arg(cmd.spin.to_string());
    let mut child = spawn_owned(command)?;
    drop((control, socket, stacks));
    let stderr = StderrTail::default();
    if let Some(out) = child.stdout.take() {
        crate::poller::forward(out.into(), span.clone(), None);
    }
    if let Some(err) = child.stderr.take() {
        crate::poller::forward(err.into(), span, Some(stderr.clone()));
    }
    Ok((ChildGuard::spawned(child), stderr))
}

/// Whether stubs are forked from fork servers at all (`--stub-fork-server`).
static FORK_SERVER: AtomicBool = AtomicBool::new(false);

/// Turns forking stubs from fork servers on or off for every stub started afterwards (the server's
/// `--stub-fork-server`; off unless turned on).
pub fn set_fork_server(on: bool) {
    FORK_SERVER.store(on, Ordering::Relaxed);
}

/// The variable in [`StubCommand::env`] that keeps a model's stubs from the fork server (its
/// config's `parameters { key: "FORK_SERVER" value: { string_value: "false" } }`): set to `1`.
pub const NO_FORK_SERVER_ENV: &str = "TRITIUM_NO_FORK_SERVER";

fn fork_server_wanted(cmd: &StubCommand) -> bool {
    FORK_SERVER.load(Ordering::Relaxed) && !cmd.env.iter().any(|(k, v)| k == NO_FORK_SERVER_ENV && v == "1")
}

/// Fork servers: one per interpreter and environment, forking stubs on request.
mod fork {
    use std::collections::HashMap;
    use std::ffi::OsString;
    use std::io::IoSlice;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::path::PathBuf;
    use std::sync::atomic::Ordering;
    use std::sync::Mutex;
    use std::time::Duration;

    use nix::sys::socket::{self, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};
    use tritium_sync::Locked;

    use super::{lock_owned, pidfd_open, python_command, spawn_owned, ChildGuard, Proc, StubCommand};

    /// How long a fork server may take to import what stubs import.
    const START_TIMEOUT: Duration = Duration::from_secs(60);
    /// How long one fork may take.
    const FORK_TIMEOUT: Duration = Duration::from_secs(10);

    /// What tells fork servers apart: a stub's interpreter, its `PYTHONPATH` directory and its
    /// extra environment (which the fork server gets at its own start, so that everything read
    /// at process start, `MALLOC_*` and `LD_LIBRARY_PATH` among them, is the stub's).
    type Key = (PathBuf, PathBuf, Vec<(OsString, OsString)>);

    enum Slot {
        Running {
            child: ChildGuard,
            sock: OwnedFd,
        },
        /// It could not be started, or is not safe to fork: stubs of this key start plainly.
        Off,
    }

    static SERVERS: Mutex<Option<HashMap<Key, Slot>>> = Mutex::new(None);

    /// Forks a stub with `fds` (control, socket, stacks) from the fork server of `cmd`, starting
    /// that first if needed: the stub's guard and its stdout and stderr pipes, or `None` for a
    /// plain start (why is logged).
    pub(super) fn spawn(
        cmd: &StubCommand,
        fds: [&OwnedFd; 3],
    ) -> std::io::Result<Option<(ChildGuard, OwnedFd, OwnedFd)>> {
        let key: Key = (cmd.python.clone(), cmd.python_path.clone(), cmd.env.clone());
        let mut servers = SERVERS.locked();
        let servers = servers.get_or_insert_with(HashMap::new);
        // A fork server that ended is replaced.
        if let Some(Slot::Running { child, .. }) = servers.get_mut(&key) {
            if let Some(exit) = child.try_exit() {
                tracing::warn!(python = %cmd.python.display(), "the fork server ended ({exit}); starting a new one");
                servers.remove(&key);
            }
        }
        if !servers.contains_key(&key) {
            let slot = start(cmd).unwrap_or_else(|e| {
                tracing::warn!(python = %cmd.python.display(), "cannot start a fork server ({e}); stubs start plainly");
                Slot::Off
            });
            servers.insert(key.clone(), slot);
        }
        let Some(Slot::Running { sock, .. }) = servers.get_mut(&key) else { return Ok(None) };
        let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let raw = [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
        let request = format!("spawn {}", cmd.spin);
        // Held until the stub's pid is registered: the orphan reaper must not take it first.
        let mut owned = lock_owned();
        let answer = socket::sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(request.as_bytes())],
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(std::io::Error::from)
        .and_then(|_| receive(sock, FORK_TIMEOUT));
        drop((out_w, err_w));
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                drop(owned);
                servers.remove(&key);
                return Err(e);
            }
        };
        match answer.split_once(' ') {
            Some(("ok", pid)) => {
                let pid: u32 =
                    pid.trim().parse().map_err(|_| std::io::Error::other(format!("bad answer {answer:?}")))?;
                let pidfd = pidfd_open(pid)?;
                owned.insert(pid);
                Ok(Some((ChildGuard { proc: Proc::Adopted { pid, pidfd }, exit: None }, out_r, err_r)))
            }
            _ => {
                tracing::info!("the fork server did not fork the stub ({answer}); starting it plainly");
                Ok(None)
            }
        }
    }

    /// One message from `sock` within `timeout`, as text.
    fn receive(sock: &OwnedFd, timeout: Duration) -> std::io::Result<String> {
        let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer within {timeout:?}")));
        }
        let mut buf = [0u8; 512];
        let len = nix::sys::socket::recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        if len == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the fork server is gone"));
        }
        Ok(String::from_utf8_lossy(&buf[..len]).into_owned())
    }

    /// Starts the fork server of `cmd` and waits for its `ready`.
    fn start(cmd: &StubCommand) -> std::io::Result<Slot> {
        become_subreaper()?;
        let (ours, theirs) =
            socket::socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
        let mut command = python_command(cmd, &[&theirs]);
        command
            .args(["-m", "tritium.forkserver", "--socket-fd", "3", "--server-pid"])
            .arg(std::process::id().to_string());
        // numpy's OpenBLAS starts a thread per CPU at import, which would make forking unsafe: one
        // thread in the fork server, its default given back in each stub.
        let blas_set = std::env::var_os("OPENBLAS_NUM_THREADS").is_some()
            || std::env::var_os("OMP_NUM_THREADS").is_some()
            || cmd.env.iter().any(|(k, _)| k == "OPENBLAS_NUM_THREADS" || k == "OMP_NUM_THREADS");
        if !blas_set {
            command.env("OPENBLAS_NUM_THREADS", "1").arg("--reset-blas-threads");
        }
        let mut child = spawn_owned(command)?;
        drop(theirs);
        let span = tracing::info_span!("fork_server", pid = child.id());
        if let Some(out) = child.stdout.take() {
            crate::poller::forward(out.into(), span.clone(), None);
        }
        if let Some(err) = child.stderr.take() {
            crate::poller::forward(err.into(), span.clone(), None);
        }
        let mut child = ChildGuard::spawned(child);
        let ready = receive(&ours, START_TIMEOUT).map_err(|e| match child.try_exit() {
            Some(exit) => std::io::Error::other(format!("it exited ({exit})")),
            None => e,
        })?;
        match ready.split_once(' ') {
            Some(("ready", "1")) => {
                tracing::info!(parent: &span, python = %cmd.python.display(), "fork server ready");
                Ok(Slot::Running { child, sock: ours })
            }
            _ => {
                tracing::warn!(
                    parent: &span,
                    "the fork server is not safe to fork from ({ready}: threads after its imports); stubs of {} start plainly",
                    cmd.python.display()
                );
                Ok(Slot::Off)
            }
        }
    }

    /// Makes this process a child subreaper: a stub forked by a fork server is reparented to
    /// it when the fork server's intermediate child exits.
    fn become_subreaper() -> std::io::Result<()> {
        if super::SUBREAPER.load(Ordering::Acquire) {
            return Ok(());
        }
        // SAFETY: prctl with an integer argument.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        super::SUBREAPER.store(true, Ordering::Release);
        Ok(())
    }
}

/// How a tool run by [`run_tool`] ended.
#[derive(Debug, Clone)]
pub struct ToolOutcome {
    /// How the process ended (killed by SIGKILL when it ran past its time).
    pub exit: StubExit,
    /// Whether it ran past its time and was killed.
    pub timed_out: bool,
    /// Its last lines of output (stdout and stderr together), oldest first.
    pub tail: Vec<String>,
}

impl ToolOutcome {
    /// Whether it exited by itself with code 0.
    pub fn success(&self) -> bool {
        !self.timed_out && self.exit == StubExit::Code(0)
    }
}

/// What [`run_tool`] hands each line its program prints.
pub type OnLine = Arc<dyn Fn(&str) + Send + Sync>;

/// Runs a helper program to completion (building a model's Python environment: `python -m
/// venv`, `pip`, `uv`; probing an interpreter) in its own process group, with `env` added to
/// the server's environment. Each line it prints is logged at info level in `span` (progress in
/// the log) and handed to `on_line` if given (progress elsewhere), the last `tail` lines are
/// kept, and a run longer than `timeout` has its whole process group killed. The child also gets
/// `PR_SET_PDEATHSIG`, like a stub.
pub fn run_tool(
    program: &std::path::Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
    timeout: std::time::Duration,
    tail: usize,
    span: Span,
    on_line: Option<OnLine>,
) -> std::io::Result<ToolOutcome> {
    let mut command = Command::new(program);
    without_server_settings(&mut command)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls (setpgid, prctl).
    unsafe {
        command.pre_exec(|| {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
    let mut child = spawn_owned(command)?;
    let lines = StderrTail::default();
    let mut readers = Vec::new();
    let outputs: [Option<Box<dyn Read + Send>>; 2] = [
        child.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>),
        child.stderr.take().map(|e| Box::new(e) as Box<dyn Read + Send>),
    ];
    for reader in outputs.into_iter().flatten() {
        let (span, lines, on_line) = (span.clone(), lines.clone(), on_line.clone());
        readers.push(std::thread::Builder::new().name("tool-output".into()).spawn(move || {
            let _enter = span.enter();
            crate::output::read_lines(reader, crate::output::MAX_LINE, |line| {
                tracing::info!(target: "tritium::env", "{line}");
                if let Some(on_line) = &on_line {
                    on_line(&line);
                }
                let mut l = lines.0.locked();
                if l.len() == tail.max(1) {
                    l.pop_front();
                }
                l.push_back(line);
            });
        })?);
    }
    let deadline = std::time::Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            timed_out = true;
            // The whole group: pip and uv start children of their own.
            // SAFETY: kill takes a process group id (our child's own group) and a signal.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            break child.wait()?;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    lock_owned().remove(&child.id());
    for r in readers {
        let _ = r.join();
    }
    let tail = lines.0.locked().iter().cloned().collect();
    Ok(ToolOutcome { exit: StubExit::from(status), timed_out, tail })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn exits_in_words() {
        assert_eq!(StubExit::Code(1).to_string(), "exit code 1");
        assert_eq!(StubExit::Code(-3).to_string(), "exit code -3");
        assert_eq!(StubExit::signal(9), StubExit::Signal { signal: 9, name: "SIGKILL" });
        assert_eq!(StubExit::signal(9).to_string(), "killed by signal 9 (SIGKILL)");
        assert_eq!(StubExit::signal(64).to_string(), "killed by signal 64 (unknown)");
        assert_eq!(StubExit::Other("unknown (no child)".into()).to_string(), "unknown (no child)");
    }

    #[test]
    fn the_allocator_defaults_yield_to_any_setting_of_the_allocator() {
        let vars = |names: &[&str]| names.iter().map(OsString::from).collect::<Vec<_>>().into_iter();
        assert!(!sets_allocator(vars(&["PATH", "HOME", "PYTHONPATH", "MALLOCX"])));
        assert!(sets_allocator(vars(&["PATH", "MALLOC_ARENA_MAX"])));
        assert!(sets_allocator(vars(&["GLIBC_TUNABLES"])));
        let sh = |explicit: &[(OsString, OsString)]| {
            let mut command = Command::new("sh");
            with_allocator_defaults(&mut command, explicit).args(["-c", "echo ${MALLOC_TRIM_THRESHOLD_-unset}"]);
            String::from_utf8(command.output().expect("sh").stdout).expect("utf-8").trim().to_string()
        };
        // (The test process's own environment sets no allocator variable.)
        if !sets_allocator(std::env::vars_os().map(|(k, _)| k)) {
            assert_eq!(sh(&[]), "536870912");
        }
        assert_eq!(sh(&[(OsString::from("MALLOC_ARENA_MAX"), OsString::from("2"))]), "unset");
    }

    #[test]
    fn a_pidfd_kill_reaches_its_process() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        let pidfd = pidfd_open(child.id()).expect("pidfd_open");
        pidfd_kill(std::os::fd::AsFd::as_fd(&pidfd)).expect("pidfd_send_signal");
        let status = child.wait().expect("wait");
        assert_eq!(StubExit::from(status), StubExit::signal(libc::SIGKILL));
        // Once reaped, the pidfd refers to no process: the signal goes nowhere (ESRCH), it
        // cannot hit a process that reused the pid.
        let again = pidfd_kill(std::os::fd::AsFd::as_fd(&pidfd)).expect_err("reaped");
        assert_eq!(again.raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn a_process_watch_sees_an_exit_before_the_child_is_reaped() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        let watch = ProcessWatch::open(child.id()).expect("pidfd_open");
        assert!(!watch.exited());
        // SAFETY: kill with a pid of our own unreaped child and a signal.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) }, 0);
        // Dead but not waited for (a zombie): already ended. The kernel marks the pidfd when the
        // exit completes, a moment after the signal.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !watch.exited() {
            assert!(std::time::Instant::now() < deadline, "the pidfd never turned readable");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        child.wait().expect("wait");
        assert!(watch.exited());
    }

    #[test]
    fn a_tool_keeps_its_last_lines_and_is_killed_past_its_time() {
        let sh = std::path::Path::new("/bin/sh");
        let args = |s: &str| vec![OsString::from("-c"), OsString::from(s)];
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let on_line: OnLine = Arc::new(move |l: &str| sink.locked().push(l.to_string()));
        let done = run_tool(
            sh,
            &args("echo one; echo two; echo three; exit 3"),
            &[],
            std::time::Duration::from_secs(60),
            2,
            Span::none(),
            Some(on_line),
        )
        .expect("sh");
        assert_eq!(done.exit, StubExit::Code(3));
        assert!(!done.success() && !done.timed_out);
        assert_eq!(done.tail.len(), 2);
        assert_eq!(done.tail.last().map(String::as_str), Some("three"));
        assert_eq!(*seen.locked(), ["one", "two", "three"], "every line, in order");
        let slow =
            run_tool(sh, &args("sleep 30 & wait"), &[], std::time::Duration::from_millis(200), 2, Span::none(), None)
                .expect("sh");
        assert!(slow.timed_out);
        assert_eq!(slow.exit, StubExit::signal(libc::SIGKILL));
    }

    #[test]
    fn children_inherit_no_server_setting_unless_it_is_set_for_them() {
        // A name no other test uses: the variable stays set for the rest of the test process.
        std::env::set_var("TRITIUM_SCRUB_PROBE_SECRET", "hunter2");
        std::env::set_var("SCRUB_PROBE_OTHER", "kept");
        let sh = std::path::Path::new("/bin/sh");
        let script =
            "echo \"${TRITIUM_SCRUB_PROBE_SECRET-unset} ${SCRUB_PROBE_OTHER-unset} ${TRITIUM_SCRUB_PROBE_MINE-unset}\"";
        let args = vec![OsString::from("-c"), OsString::from(script)];
        let env = [(OsString::from("TRITIUM_SCRUB_PROBE_MINE"), OsString::from("given"))];
        let done = run_tool(sh, &args, &env, std::time::Duration::from_secs(60), 1, Span::none(), None).expect("sh");
        assert_eq!(done.tail, ["unset kept given"]);
    }

    #[test]
    fn exits_from_wait_statuses() {
        // Raw wait statuses: the code in the high byte, or the signal in the low bits.
        assert_eq!(StubExit::from(ExitStatus::from_raw(3 << 8)), StubExit::Code(3));
        assert_eq!(StubExit::from(ExitStatus::from_raw(libc::SIGSEGV)), StubExit::signal(libc::SIGSEGV));
        assert_eq!(StubExit::signal(libc::SIGSEGV).to_string(), "killed by signal 11 (SIGSEGV)");
    }
}
