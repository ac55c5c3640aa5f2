//! One shared-memory segment: a sealed-size memfd mapped read-write into this process.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};

use crate::error::IpcError;

/// A memfd-backed shared-memory segment mapped into this process.
///
/// The mapping lives exactly as long as this value. Pages are allocated by the kernel on first
/// touch, so a large segment costs address space, not memory, until it is used.
#[derive(Debug)]
pub struct Segment {
    fd: OwnedFd,
    map: MmapRaw,
    /// A client's region: its range is guarded against the client shrinking the file
    /// ([`crate::fault`]).
    guard: Option<crate::fault::Guard>,
}

impl Segment {
    /// Creates a new memfd of `len` bytes named `name` (visible in `/proc/PID/fd`) and maps it.
    pub fn create(name: &str, len: u64) -> Result<Self, IpcError> {
        if len == 0 {
            return Err(IpcError::Protocol("a segment cannot be empty".into()));
        }
        let cname =
            CString::new(name.replace('\0', "_")).map_err(|_| IpcError::Protocol("segment name with NUL".into()))?;
        // The fd is close-on-exec; the spawner hands it to the stub explicitly.
        let fd = memfd_create(&cname, MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING)
            .map_err(|e| IpcError::os("memfd_create", e))?;
        nix::unistd::ftruncate(&fd, len as libc::off_t).map_err(|e| IpcError::os("ftruncate", e))?;
        // Seal the size so that neither side can shrink the file under the other's mapping
        // (a truncated memfd turns reads of the mapping into SIGBUS).
        // SAFETY: plain fcntl on an fd we own.
        let rc = unsafe {
            libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL)
        };
        if rc == -1 {
            return Err(IpcError::Io("sealing a memfd".into(), std::io::Error::last_os_error()));
        }
        Self::map(fd, len)
    }

    /// Maps a segment received from the peer, checking that the file is at least `len` bytes and
    /// sealed against shrinking, so the mapping can never fault.
    ///
    /// The seals are checked before the size: once `F_SEAL_SHRINK` is set nobody can remove it,
    /// so the size read afterwards stays true for the life of the mapping. (Checked the other way
    /// round, a peer could shrink the file between the two checks and seal it afterwards.)
    pub fn open(fd: OwnedFd, len: u64) -> Result<Self, IpcError> {
        // SAFETY: plain fcntl on an fd we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals == -1 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(IpcError::Protocol("peer sent a segment that is not sealed against shrinking".into()));
        }
        let stat = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| IpcError::os("fstat", e))?;
        if (stat.st_size as u64) < len {
            return Err(IpcError::Protocol(format!(
                "peer announced a segment of {len} bytes backed by a file of {} bytes",
                stat.st_size
            )));
        }
        Self::map(fd, len)
    }

    /// Maps `len` bytes from `offset` of a client's registered shared-memory file (the system
    /// shared memory extension; `shm_open`ed by the server), read-write if `fd` was opened so
    /// (a region outputs are written into), read-only otherwise (the server sends inputs'
    /// regions as read-only descriptors). Such a file is the client's and cannot be sealed: the
    /// size is checked now (and by the server right before each request that uses it), and a
    /// client that truncates it while a model reads it still makes the reads past the new end
    /// fault in the stub.
    pub fn open_region(fd: OwnedFd, offset: u64, len: u64) -> Result<Self, IpcError> {
        if len == 0 {
            return Err(IpcError::Protocol("a shared memory region cannot be empty".into()));
        }
        let stat = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| IpcError::os("fstat", e))?;
        let end = offset.checked_add(len).ok_or_else(|| IpcError::Protocol("region range overflows".into()))?;
        if (stat.st_size as u64) < end {
            return Err(IpcError::Protocol(format!(
                "a shared memory region of {len} bytes at offset {offset} needs a file of {end} bytes, but the file has {}",
                stat.st_size
            )));
        }
        let len_usize = usize::try_from(len).map_err(|_| IpcError::Protocol("region too large".into()))?;
        // SAFETY: plain fcntl on an fd we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags == -1 {
            return Err(IpcError::Io("fcntl of a shared memory region".into(), std::io::Error::last_os_error()));
        }
        let mut options = MmapOptions::new();
        // memmap2 aligns the file offset down to a page and returns the pointer to `offset`.
        options.offset(offset).len(len_usize);
        let map =
            if flags & libc::O_ACCMODE == libc::O_RDWR { options.map_raw(&fd) } else { options.map_raw_read_only(&fd) };
        let map = map.map_err(|e| IpcError::Io("mmap of a shared memory region".into(), e))?;
        let guard = crate::fault::guard(map.as_ptr(), len_usize)?;
        Ok(Self { fd, map, guard: Some(guard) })
    }

    fn map(fd: OwnedFd, len: u64) -> Result<Self, IpcError> {
        let len_usize = usize::try_from(len).map_err(|_| IpcError::Protocol("segment too large".into()))?;
        let map =
            MmapOptions::new().len(len_usize).map_raw(&fd).map_err(|e| IpcError::Io("mmap of a segment".into(), e))?;
        Ok(Self { fd, map, guard: None })
    }

    /// Whether this is a client's region whose file shrank under an access to it: from the
    /// faulting page on it reads zeros, and writes there are lost ([`crate::fault`]).
    pub fn faulted(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.faulted())
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Bytes of memory the segment really uses: the pages written so far (a memfd allocates
    /// pages on first touch), as the kernel counts them.
    pub fn allocated_bytes(&self) -> u64 {
        nix::sys::stat::fstat(self.fd.as_raw_fd()).map(|st| st.st_blocks as u64 * 512).unwrap_or(0)
    }

    /// Always false: segments are never empty.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The memfd behind the mapping.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Returns the pointer to `[offset, offset + len)` if that range lies inside the segment.
    pub fn range(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // SAFETY: offset <= end <= mapping length, so the result stays inside the mapping.
        Some(unsafe { self.as_ptr().add(offset as usize) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_map_and_reopen_share_bytes() {
        let a = Segment::create("test", 8192).expect("create");
        // SAFETY: in bounds of a fresh private mapping.
        unsafe { a.as_ptr().add(100).write(42) };
        let fd = a.fd().try_clone_to_owned().expect("dup");
        let b = Segment::open(fd, 8192).expect("open");
        assert_eq!(b.allocated_bytes(), 4096, "only the touched page is allocated");
        // SAFETY: in bounds.
        assert_eq!(unsafe { b.as_ptr().add(100).read() }, 42);
        assert!(b.range(8000, 192).is_some());
        assert!(b.range(8000, 193).is_none());
        assert!(b.range(u64::MAX, 2).is_none());
    }

    /// A memfd that allows sealing, of `len` bytes, with no seals yet.
    fn unsealed(len: i64) -> OwnedFd {
        let fd = memfd_create(c"unsealed", MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING)
            .expect("memfd");
        nix::unistd::ftruncate(&fd, len).expect("ftruncate");
        fd
    }

    fn add_seals(fd: &OwnedFd, seals: libc::c_int) {
        // SAFETY: plain fcntl on an fd we own.
        assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }, 0);
    }

    #[test]
    fn open_refuses_an_unsealed_file() {
        let err = Segment::open(unsealed(8192), 8192).expect_err("unsealed");
        assert!(err.to_string().contains("not sealed against shrinking"), "{err}");
    }

    #[test]
    fn a_file_shrunk_and_then_sealed_is_refused() {
        // The attack: announce 1 MiB, shrink the file to one page, seal it. The size check must
        // see the sealed (final) size, never a stale one.
        let fd = unsealed(1 << 20);
        nix::unistd::ftruncate(&fd, 4096).expect("shrink");
        add_seals(&fd, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
        let err = Segment::open(fd, 1 << 20).expect_err("shorter than announced");
        assert!(err.to_string().contains("backed by a file of 4096 bytes"), "{err}");
    }

    #[test]
    fn open_refuses_a_file_shorter_than_announced() {
        let a = Segment::create("short", 4096).expect("create");
        let fd = a.fd().try_clone_to_owned().expect("dup");
        assert!(Segment::open(fd, 8192).is_err());
    }
}
