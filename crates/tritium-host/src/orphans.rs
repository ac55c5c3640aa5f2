//! The children this process owns (started from one launcher thread, registered as owned), and
//! the reaping of those it does not: once the server is a child subreaper (it is when a fork
//! server runs), orphaned descendants become its children.

use std::collections::BTreeSet;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tritium_sync::Locked;

/// The pids of this process's children that their owners (a `ChildGuard`, `run_tool`) wait
/// for; any other child that exits is an orphan reparented to the server, reaped by
/// [`reap_orphans`]. Held while a child is started and registered, so that an orphan reaper
/// never takes a child before it is registered.
pub(crate) static OWNED: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
/// Set once this process is a child subreaper.
pub(crate) static SUBREAPER: AtomicBool = AtomicBool::new(false);

pub(crate) fn lock_owned() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    OWNED.locked()
}

/// `command.spawn()` on the [`launcher`] thread, its pid registered as owned.
pub(crate) fn spawn_owned(command: Command) -> std::io::Result<Child> {
    let mut owned = lock_owned();
    let child = launch(command)?;
    owned.insert(child.id());
    Ok(child)
}

/// A command for the launcher, and where its outcome goes.
type Launch = (Command, std::sync::mpsc::SyncSender<std::io::Result<Child>>);

/// The thread every child is started from. A child's `PR_SET_PDEATHSIG` fires when the *thread*
/// that forked it ends, not only when the process does; instances start their stubs from the
/// runtime's blocking pool, whose threads end after a while idle, and a stub (or a fork server)
/// started from one would be killed with it. This thread lives as long as the server. `None`
/// when it could not be started: children are then started by their callers' threads.
fn launcher() -> Option<&'static std::sync::mpsc::Sender<Launch>> {
    static LAUNCHER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Launch>>> = std::sync::OnceLock::new();
    LAUNCHER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Launch>();
            let started = std::thread::Builder::new().name("launcher".into()).spawn(move || {
                for (mut command, outcome) in rx {
                    let _ = outcome.send(command.spawn());
                }
            });
            match started {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(
                        "cannot start the launcher thread ({e}): children start from their callers' threads, and \
                         a stub whose starting thread ends is killed with it"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// Starts `command` from the [`launcher`] thread.
fn launch(mut command: Command) -> std::io::Result<Child> {
    let Some(launcher) = launcher() else { return command.spawn() };
    let (outcome, answer) = std::sync::mpsc::sync_channel(1);
    if let Err(std::sync::mpsc::SendError((mut command, _))) = launcher.send((command, outcome)) {
        return command.spawn();
    }
    answer.recv().unwrap_or_else(|_| Err(std::io::Error::other("the launcher thread ended")))
}

/// Reaps the children that nobody waits for: once the server is a child subreaper (it is when a
/// fork server runs), every orphaned descendant (a process a model started and left behind, a
/// stub's grandchild) becomes its child. Stops at the first exited child that has an owner (it
/// is its owner's to reap) and returns at once when another thread is starting a child.
pub fn reap_orphans() {
    if !SUBREAPER.load(Ordering::Acquire) {
        return;
    }
    let Ok(owned) = OWNED.try_lock() else { return };
    loop {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with a valid siginfo pointer; WNOWAIT leaves the child waitable.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
        // SAFETY: waitid filled `info` for a child (or left it zeroed: pid 0).
        let pid = unsafe { info.si_pid() };
        if rc != 0 || pid <= 0 || owned.contains(&(pid as u32)) {
            return;
        }
        // SAFETY: reaps the orphan just seen exited.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        tracing::debug!(pid, "reaped an orphaned process");
    }
}
