//! The children this process owns, and the reaping of those it does not: once the server is a
//! child subreaper (it is when a fork server runs), orphaned descendants become its children.

use std::collections::BTreeSet;
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
