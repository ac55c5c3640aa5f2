//! A system region: one read-only mapping of a client's file over a registered range
//! ([`Region`]), the table of every live mapping by address ([`LIVE`]) that finds which region an
//! input's bytes lie in, and the reads and writes that go through the file (`pread`, `pwrite`)
//! so that a client that shrinks it fails its own request.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use tritium_ipc::REGION_BIT;
use tritium_sync::Locked;

use crate::error::InferError;

/// Region ids: [`REGION_BIT`] plus a counter, never reused while the process lives.
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// One mapping of a client's file over a registered range, shared by every name registered
/// over the same range of the same file (the same key, offset and size).
pub struct Region {
    /// The segment id stubs map it by for inputs (read-only).
    pub(super) id: u32,
    /// The segment id stubs map it by for outputs they write (read-write).
    pub(super) output_id: u32,
    /// The key it was first opened by (for messages).
    key: String,
    pub(super) offset: u64,
    pub(super) byte_size: u64,
    fd: OwnedFd,
    /// The same file opened read-only (through `/proc/self/fd`): the descriptor stubs get, so
    /// model code can map and read the region but not truncate or write the client's file.
    read_only: OwnedFd,
    map: MmapRaw,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("key", &self.key)
            .field("offset", &self.offset)
            .field("byte_size", &self.byte_size)
            .finish()
    }
}

impl Region {
    /// The segment id the stubs know this region by (has [`REGION_BIT`]).
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// The segment id stubs map it by read-write, to write outputs (has [`REGION_BIT`]).
    pub(crate) fn output_id(&self) -> u32 {
        self.output_id
    }

    /// The client's file, read-write: what a stub that writes an output there gets.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The client's file, opened read-only: what a stub that reads an input there gets.
    pub(crate) fn read_only_fd(&self) -> BorrowedFd<'_> {
        self.read_only.as_fd()
    }

    /// Offset of the registered range in the file.
    pub(crate) fn file_offset(&self) -> u64 {
        self.offset
    }

    /// Length of the registered range.
    pub(crate) fn byte_size(&self) -> u64 {
        self.byte_size
    }

    fn base(&self) -> usize {
        self.map.as_ptr() as usize
    }

    /// Checks, on every use, that the client has not shrunk its file under the registration
    /// `name` (one of the names sharing this mapping).
    pub(super) fn check_file(&self, name: &str) -> Result<(), InferError> {
        let size = nix::sys::stat::fstat(self.fd.as_raw_fd()).map(|s| s.st_size.max(0) as u64).unwrap_or(0);
        if size < self.offset.saturating_add(self.byte_size) {
            return Err(InferError::invalid(format!(
                "shared memory region '{name}' (key '{}') is no longer valid: its file has {size} bytes, fewer than the \
                 {} bytes registered at offset {}; unregister it and register it again",
                self.key, self.byte_size, self.offset
            )));
        }
        Ok(())
    }

    /// Checks, right before a stub is given the region, that the client has not shrunk its file
    /// (a request queued before the shrink fails alone, and the stub never maps a short file).
    pub(crate) fn check_size(&self) -> Result<(), InferError> {
        self.check_file(&self.key)
    }

    /// `[offset, offset + len)` of the registered range, read with `pread`: a client that
    /// shrinks its file makes this fail (a short read), never fault.
    fn pread(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>, InferError> {
        self.check_file(name)?;
        let len = usize::try_from(len).map_err(|_| InferError::invalid("input too large"))?;
        let mut data = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let at = self.offset.saturating_add(offset).saturating_add(done as u64);
            let at = libc::off_t::try_from(at).map_err(|_| InferError::invalid("offset too large"))?;
            match nix::sys::uio::pread(&self.fd, &mut data[done..], at) {
                Ok(0) => return Err(self.check_file(name).err().unwrap_or_else(|| self.short(name))),
                Ok(n) => done += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    return Err(InferError::internal(format!(
                        "failed to read shared memory region '{name}' (key '{}'): {e}",
                        self.key
                    )))
                }
            }
        }
        Ok(data)
    }

    /// Writes `data` at `offset` of the registered range with `pwrite` (a shrunk file makes
    /// it fail or grow the file again, never fault).
    pub(super) fn pwrite(&self, name: &str, offset: u64, data: &[u8]) -> Result<(), InferError> {
        self.check_file(name)?;
        let mut done = 0;
        while done < data.len() {
            let at = self.offset.saturating_add(offset).saturating_add(done as u64);
            let at = libc::off_t::try_from(at).map_err(|_| InferError::invalid("offset too large"))?;
            match nix::sys::uio::pwrite(&self.fd, &data[done..], at) {
                Ok(0) => return Err(self.short(name)),
                Ok(n) => done += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    return Err(InferError::internal(format!(
                        "failed to write shared memory region '{name}' (key '{}'): {e}",
                        self.key
                    )))
                }
            }
        }
        Ok(())
    }

    fn short(&self, name: &str) -> InferError {
        InferError::invalid(format!(
            "shared memory region '{name}' (key '{}') is no longer valid: its file shrank while it was used; \
             unregister it and register it again",
            self.key
        ))
    }

    /// The live mapping of `[offset, offset + len)` of the registered range; callers checked the bounds.
    fn slice(&self, offset: u64, len: u64) -> &[u8] {
        debug_assert!(offset.saturating_add(len) <= self.byte_size);
        // SAFETY: the range lies inside the mapping (checked by `resolve` against byte_size, the
        // mapping's length), which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset as usize), len as usize) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let mut live = LIVE.locked();
        if live.get(&self.base()).is_some_and(|(_, e)| std::ptr::eq(e.region.as_ptr(), self)) {
            live.remove(&self.base());
        }
    }
}

/// What [`LIVE`] knows of one mapping: its segment id, readable without upgrading (an upgrade
/// under the lock could end up dropping the last reference there, and [`Region`]'s `Drop`
/// takes the lock), and the region.
struct LiveEntry {
    id: u32,
    output_id: u32,
    region: Weak<Region>,
}

/// Every live region mapping in this process by start address, for [`lookup`].
static LIVE: Mutex<BTreeMap<usize, (usize, LiveEntry)>> = Mutex::new(BTreeMap::new());

/// The region whose mapping holds `[ptr, ptr + len)`, and the offset of `ptr` in it.
pub(crate) fn lookup(ptr: *const u8, len: usize) -> Option<(Arc<Region>, u64)> {
    let live = LIVE.locked();
    let (entry, offset) = containing(&live, ptr, len)?;
    let region = entry.region.upgrade()?;
    // Returned, never dropped, under the lock.
    Some((region, offset))
}

/// The entry of an address table (start address -> length and value: [`LIVE`], [`STAGED`](super::cuda::STAGED))
/// whose range holds `[ptr, ptr + len)`, and the offset of `ptr` in it.
pub(super) fn containing<V>(table: &BTreeMap<usize, (usize, V)>, ptr: *const u8, len: usize) -> Option<(&V, u64)> {
    let addr = ptr as usize;
    let (&start, (size, value)) = table.range(..=addr).next_back()?;
    if addr.checked_add(len)? > start + size {
        return None;
    }
    Some((value, (addr - start) as u64))
}

/// Whether the region with segment id `id` is still mapped in this process (registered, or
/// still used by a request). Compares ids without upgrading: a temporary `Arc` dropped under
/// the lock could be the last one, and `Region::drop` locks [`LIVE`] again.
pub(crate) fn is_live(id: u32) -> bool {
    LIVE.locked().values().any(|(_, e)| (e.id == id || e.output_id == id) && e.region.strong_count() > 0)
}

/// The key of a region among segment ids `ids` (a dead stub's) whose client has shrunk its file
/// below the registered range, if any: that stub's `SIGBUS` was the client's doing.
pub(crate) fn shrunk_region(ids: &[u32]) -> Option<String> {
    let regions: Vec<Arc<Region>> = LIVE
        .locked()
        .values()
        .filter(|(_, e)| ids.contains(&e.id) || ids.contains(&e.output_id))
        .filter_map(|(_, e)| e.region.upgrade())
        .collect();
    // Checked, and the references dropped, after `LIVE` is unlocked (see `is_live`).
    regions.iter().find(|r| r.check_size().is_err()).map(|r| r.key.clone())
}

/// A region's bytes as the owner of a [`Bytes`]: the request that holds them holds the region.
struct RegionBytes {
    region: Arc<Region>,
    offset: u64,
    len: u64,
}

impl AsRef<[u8]> for RegionBytes {
    fn as_ref(&self) -> &[u8] {
        self.region.slice(self.offset, self.len)
    }
}

/// Checks, right before an input is handed to a stub, that the region its bytes lie in (if
/// any) still has the registered size: a client that shrank its file while the request was
/// queued fails that request alone.
pub(crate) fn check_input_region(data: &[u8]) -> Result<(), InferError> {
    match lookup(data.as_ptr(), data.len()) {
        Some((region, _)) => region.check_size(),
        None => Ok(()),
    }
}

/// A copy of `data`, read by `pread`, when it lies in a system region: the server reads the
/// bytes of a client's region only from such a copy (BYTES validation, response-cache keys), so
/// a client that shrinks its file fails its own request, not the server. None when `data` is not
/// in a region.
pub(crate) fn pread_copy(data: &[u8]) -> Result<Option<Bytes>, InferError> {
    match lookup(data.as_ptr(), data.len()) {
        Some((region, offset)) => Ok(Some(Bytes::from(region.pread(&region.key, offset, data.len() as u64)?))),
        None => Ok(None),
    }
}

/// The file behind `fd` opened anew, read-only (`/proc/self/fd/N`): unlike a `dup`, the new
/// descriptor cannot be used to write or truncate the file.
fn reopen_read_only(fd: &OwnedFd) -> nix::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let raw = nix::fcntl::open(path.as_str(), OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    // SAFETY: `open` just returned this descriptor, and nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

/// A new region id: [`REGION_BIT`] plus the next value of [`NEXT_ID`].
pub(super) fn next_id() -> u32 {
    REGION_BIT | (NEXT_ID.fetch_add(1, Ordering::Relaxed) & (REGION_BIT - 1))
}

/// Maps `byte_size` bytes from `offset` of the client's file `fd` (opened by `key`, registered
/// as `name`) read-only, opens the file again read-only for stubs, and lists the mapping in
/// [`LIVE`]: a new [`Region`] with ids of its own.
pub(super) fn map(name: &str, key: &str, fd: OwnedFd, offset: u64, byte_size: u64) -> Result<Arc<Region>, InferError> {
    let mapped = usize::try_from(byte_size)
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
        .and_then(|len| MmapOptions::new().offset(offset).len(len).map_raw_read_only(&fd));
    let map = mapped.map_err(|e| {
        // Triton's text, which glues strerror to "address space" without a space.
        let errno = e.raw_os_error().unwrap_or(libc::EINVAL);
        InferError::invalid(format!(
            "failed to register shared memory region '{name}': unable to process address space{}",
            nix::errno::Errno::from_raw(errno).desc()
        ))
    })?;
    let read_only = reopen_read_only(&fd).map_err(|e| {
        InferError::internal(format!("failed to register shared memory region '{name}': reopening it read-only: {e}"))
    })?;
    let region = Arc::new(Region {
        id: next_id(),
        output_id: next_id(),
        key: key.to_string(),
        offset,
        byte_size,
        fd,
        read_only,
        map,
    });
    if byte_size > 0 {
        let entry = LiveEntry { id: region.id, output_id: region.output_id, region: Arc::downgrade(&region) };
        LIVE.locked().insert(region.base(), (byte_size as usize, entry));
    }
    Ok(region)
}

/// `[offset, offset + len)` of a system region as input bytes, without a copy: the [`Bytes`]
/// holds the region.
pub(super) fn region_bytes(region: Arc<Region>, offset: u64, len: u64) -> Bytes {
    Bytes::from_owner(RegionBytes { region, offset, len })
}
