//! Surviving a client that truncates its shared-memory region under a mapping.
//!
//! A stub maps a client's system shared-memory region to read inputs and write outputs without
//! a copy. The client owns that file: if it shrinks it while a model reads or writes the mapping,
//! the access past the new end raises `SIGBUS`, which would kill the stub and fail every request
//! of its batch, other clients' included.
//!
//! [`guard`] registers a mapping's address range in a fixed table read by a `SIGBUS` handler.
//! The handler, for a fault inside a registered range, maps zero-filled private pages over the
//! range from the faulting page to its end (`mmap` with `MAP_FIXED`, which Linux runs safely in
//! a signal handler) and marks the range faulted; the access is retried and reads zeros (or
//! writes to memory nobody reads). The stub then fails the requests that used the region
//! ([`Guard::faulted`]); the process and its other requests carry on. A fault anywhere else
//! goes to the handler that was installed before (or kills the process as `SIGBUS` does by
//! default), so real bugs still crash as before.
//!
//! The table has [`SLOTS`] entries; a mapping that finds none free is refused
//! ([`IpcError::Protocol`]), so no region is ever mapped unguarded.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::error::IpcError;

/// How many guarded ranges a process can have at once.
pub const SLOTS: usize = 1024;

struct Slot {
    /// Claimed by a live [`Guard`].
    taken: AtomicBool,
    /// The range; `len` is 0 while it is being set or cleared.
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    taken: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];

/// The page size, and the disposition of `SIGBUS` before ours, set once before the handler is
/// installed and only read after.
struct Installed {
    page: usize,
    previous: libc::sigaction,
}

static INSTALLED: OnceLock<Result<Installed, String>> = OnceLock::new();

/// A registered range; dropping it unregisters the range (before or after the mapping goes).
#[derive(Debug)]
pub struct Guard {
    slot: usize,
}

impl Guard {
    /// Whether an access to the range faulted (its file shrank): its contents are zeros from the
    /// faulting page on, and what was written there is lost.
    pub fn faulted(&self) -> bool {
        TABLE[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let slot = &TABLE[self.slot];
        slot.len.store(0, Ordering::Release);
        slot.start.store(0, Ordering::Release);
        slot.faulted.store(false, Ordering::Release);
        slot.taken.store(false, Ordering::Release);
    }
}

/// Registers `[ptr, ptr + len)`, the whole of a mapping of a file someone else may shrink,
/// installing the `SIGBUS` handler on first use.
pub fn guard(ptr: *const u8, len: usize) -> Result<Guard, IpcError> {
    install()?;
    let Some(index) =
        TABLE.iter().position(|s| s.taken.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok())
    else {
        return Err(IpcError::Protocol(format!(
            "this process maps {SLOTS} client shared memory regions already; unregister some before registering more"
        )));
    };
    let slot = &TABLE[index];
    slot.faulted.store(false, Ordering::Release);
    slot.start.store(ptr as usize, Ordering::Release);
    slot.len.store(len, Ordering::Release);
    Ok(Guard { slot: index })
}

fn install() -> Result<(), IpcError> {
    let installed = INSTALLED.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = usize::try_from(page).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096);
        // SAFETY: a zeroed sigaction is a valid value; the fields that matter are set below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: sigemptyset on a sigset we own.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: as above; sigaction(2) overwrites it with the disposition ours replaces.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: installs a handler that touches only atomics and calls mmap and sigaction.
        // Until `INSTALLED` is set the handler returns at once, and a fault in that window is
        // retried until it is.
        if unsafe { libc::sigaction(libc::SIGBUS, &action, &mut previous) } != 0 {
            return Err(format!("installing the SIGBUS handler: {}", std::io::Error::last_os_error()));
        }
        Ok(Installed { page, previous })
    });
    installed.as_ref().map(|_| ()).map_err(|e| IpcError::Protocol(e.clone()))
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let Some(Ok(installed)) = INSTALLED.get() else { return };
    if sent_by_this_process(info) {
        // Not a fault but `raise(SIGBUS)`: what Python's `faulthandler` does once model code has
        // enabled it in front of this handler. It prints the stacks, puts this handler back and
        // raises the signal to hand it on. Returning retries the faulting access, whose fault
        // then comes here with its address and is treated like any other.
        return;
    }
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in &TABLE {
        let len = slot.len.load(Ordering::Acquire);
        let start = slot.start.load(Ordering::Acquire);
        if len == 0 || addr < start || addr - start >= len {
            continue;
        }
        let page = installed.page;
        let from = addr & !(page - 1);
        let to = (start + len + page - 1) & !(page - 1);
        // SAFETY: replaces pages of a mapping this process made and registered (the range is
        // still mapped: a guard is dropped only with its mapping); MAP_FIXED over them is what
        // the handler exists to do.
        let mapped = unsafe {
            libc::mmap(
                from as *mut libc::c_void,
                to - from,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            slot.faulted.store(true, Ordering::Release);
            return;
        }
        break;
    }
    chain(installed, sig, info, context);
}

/// Whether the signal came from this process's own `raise` or `kill` rather than from the
/// hardware (a fault has a positive `si_code`).
fn sent_by_this_process(info: *const libc::siginfo_t) -> bool {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; `si_pid` is set for
    // the user-sent codes checked first.
    unsafe {
        matches!((*info).si_code, libc::SI_USER | libc::SI_TKILL | libc::SI_QUEUE) && (*info).si_pid() == libc::getpid()
    }
}

/// Hands a fault that is not a guarded region's to the disposition before ours.
fn chain(installed: &Installed, sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = &installed.previous;
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Back to the default: returning retries the access, which faults again and ends the
        // process with SIGBUS, as it would have without this handler.
        // SAFETY: a zeroed sigaction with SIG_DFL is the default disposition.
        let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
        default.sa_sigaction = libc::SIG_DFL;
        // SAFETY: sigaction is async-signal-safe.
        unsafe { libc::sigaction(sig, &default, std::ptr::null_mut()) };
        return;
    }
    if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this signature.
        let f = unsafe {
            std::mem::transmute::<usize, extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)>(handler)
        };
        f(sig, info, context);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO takes the signal number only.
        let f = unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(handler) };
        f(sig);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A file of `pages` pages mapped shared, as a client's region is.
    fn mapped_file(pages: usize) -> (std::fs::File, *mut u8, usize) {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let file = tempfile_in_shm();
        file.set_len((pages * page) as u64).unwrap();
        // SAFETY: maps a file we own, shared, for the test.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        (file, ptr.cast(), pages * page)
    }

    fn tempfile_in_shm() -> std::fs::File {
        let name = format!("/dev/shm/tritium-fault-test-{}-{}", std::process::id(), rand_suffix());
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&name).unwrap();
        std::fs::remove_file(&name).unwrap();
        file
    }

    fn rand_suffix() -> u64 {
        use std::time::{SystemTime, UNIX_EPOCH};
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
    }

    #[test]
    fn a_read_past_a_shrunk_file_reads_zeros_and_marks_the_guard() {
        let (file, ptr, len) = mapped_file(4);
        // SAFETY: in-bounds writes to our mapping.
        unsafe { std::ptr::write_bytes(ptr, 7, len) };
        let guard = guard(ptr, len).unwrap();
        assert!(!guard.faulted());
        file.set_len(0).unwrap();
        // SAFETY: in-bounds reads of our mapping; the pages past the file's end fault, and the
        // handler maps zeros over them.
        let last = unsafe { std::ptr::read_volatile(ptr.add(len - 1)) };
        assert_eq!(last, 0);
        assert!(guard.faulted());
        // Writes land in private memory and do not fault either.
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(ptr.add(len - 2), 9) };
        drop(guard);
        // SAFETY: unmaps the test's mapping.
        unsafe { libc::munmap(ptr.cast(), len) };
    }

    /// The handler Python's `faulthandler.enable()` puts in front of ours: it restores the
    /// disposition it found (ours) and raises the signal again.
    extern "C" fn faulthandler_like(sig: libc::c_int) {
        let previous = FAULTHANDLER_PREVIOUS.get().expect("saved before installing");
        // SAFETY: sigaction and raise are async-signal-safe; `previous` is a valid sigaction.
        unsafe {
            libc::sigaction(sig, &previous.0, std::ptr::null_mut());
            libc::raise(sig);
        }
    }

    struct SavedAction(libc::sigaction);
    // SAFETY: a plain C struct, only read after it is set.
    unsafe impl Sync for SavedAction {}
    unsafe impl Send for SavedAction {}
    static FAULTHANDLER_PREVIOUS: OnceLock<SavedAction> = OnceLock::new();

    #[test]
    fn a_fault_survives_a_faulthandler_installed_in_front_of_the_guard() {
        let (file, ptr, len) = mapped_file(2);
        let guard = guard(ptr, len).unwrap();
        // SAFETY: as in faulthandler's own enable(): SA_NODEFER, so its raise() reaches the
        // restored handler at once.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = faulthandler_like as *const () as usize;
            action.sa_flags = libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(libc::SIGBUS, &action, &mut previous), 0);
            assert!(FAULTHANDLER_PREVIOUS.set(SavedAction(previous)).is_ok());
        }
        file.set_len(0).unwrap();
        // SAFETY: faults: first into the faulthandler-like handler, which hands the signal on
        // with raise(); the retried access then faults into ours.
        let last = unsafe { std::ptr::read_volatile(ptr.add(len - 1)) };
        assert_eq!(last, 0);
        assert!(guard.faulted());
        drop(guard);
        // SAFETY: unmaps the test's mapping.
        unsafe { libc::munmap(ptr.cast(), len) };
    }

    #[test]
    fn a_slot_is_reused_clean_after_its_guard_is_dropped() {
        let (file, ptr, len) = mapped_file(1);
        let first = guard(ptr, len).unwrap();
        file.set_len(0).unwrap();
        // SAFETY: faults into the handler, as above.
        let _ = unsafe { std::ptr::read_volatile(ptr) };
        assert!(first.faulted());
        let slot = first.slot;
        drop(first);
        assert!(!TABLE[slot].faulted.load(Ordering::Acquire));
        assert_eq!(TABLE[slot].len.load(Ordering::Acquire), 0);
        // SAFETY: unmaps the test's mapping.
        unsafe { libc::munmap(ptr.cast(), len) };
    }
}
