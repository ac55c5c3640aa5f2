//! The shared memory extensions' registry: regions that clients register by name, with
//! Triton's checks and error texts, and the handles requests hold on them. System regions are a
//! client's POSIX shared memory object (`shm_open` of their key, then `mmap` of `byte_size`
//! bytes from `offset`); CUDA regions are a client's device allocation, opened from its CUDA IPC
//! handle. Both kinds share one namespace, as in Triton: a name is registered once, as one kind.
//!
//! CUDA regions are staged through the host: an input in one is copied device-to-host when the
//! request is decoded (the model gets a CPU tensor, as Triton's python backend gives it by
//! default, `FORCE_CPU_ONLY_INPUT_TENSORS`), and an output asked for in one is copied
//! host-to-device when the response is ready.
//!
//! Lifetime: a registration is an `Arc<Region>`. The registry holds one reference, and every
//! request that names the region holds another (its input bytes are a [`Bytes`] whose owner is
//! the region, its shared-memory outputs a [`ShmTarget`]). Unregistering removes the *name* at
//! once (it can be registered again straight away); the mapping and the file descriptor live
//! until the last request using them ends, so a running request never loses its memory. Triton
//! (since 24.x) instead keeps an in-use region under its name, marked "awaiting unregister",
//! and removes it when its last request completes.
//!
//! Zero copy: the instance worker asks [`lookup`] whether an input's bytes lie in a region; if
//! so it maps that region into the stub once (its fd over the stub's socket) and hands the model
//! a descriptor into it instead of copying the bytes.
//!
//! Trust: a client's file cannot be sealed, so a client that truncates it under a registration
//! would make accesses past the new end fault. So the server never touches a region through its
//! mapping (which is read-only, and serves only to find which region an input's bytes lie in):
//! what it reads itself (BYTES inputs, cache keys) is copied out with `pread`
//! ([`pread_copy`]), and outputs are written with `pwrite` ([`ShmTarget::write`]); a shrunk
//! file fails the request. The size is checked at registration, when a request names the
//! region, and right before a request's inputs are handed to a stub ([`check_input_region`]).
//! Stubs get a region they read inputs from as a read-only descriptor (reopened through
//! `/proc/self/fd`) mapped read-only under the region's id, so model code cannot truncate a
//! client's file under another model's stub through it; a region a stub writes outputs into is
//! mapped read-write under a second id ([`Region::output_id`]). The stub guards each region it
//! maps against `SIGBUS` (`tritium_ipc::fault`): a client that shrinks its file while a model
//! reads or writes it fails its own request, and the stub lives. A stub killed by `SIGBUS`
//! anyway while a region it mapped is short died of the client's truncation: [`shrunk_region`]
//! tells the supervisor, which does not count that crash. Registrations of one range of one file (by
//! device and inode) share one mapping, and at most `--max-shm-regions` names are registered at
//! once.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use tritium_ipc::{Descriptor, TensorData, REGION_BIT};
use tritium_sync::Locked;

use crate::error::{ErrorKind, InferError};

/// The key prefix Triton reserves for the shared memory of its own Python backend.
const RESERVED_PREFIX: &str = "triton_python_backend_shm_region_";

/// Region ids: [`REGION_BIT`] plus a counter, never reused while the process lives.
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// What a status request reports of one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    /// The name it was registered under.
    pub name: String,
    /// The `shm_open` key.
    pub key: String,
    /// Offset of the registered range in the file.
    pub offset: u64,
    /// Length of the registered range.
    pub byte_size: u64,
}

/// One mapping of a client's file over a registered range, shared by every name registered
/// over the same range of the same file (the same key, offset and size).
pub struct Region {
    /// The segment id stubs map it by for inputs (read-only).
    id: u32,
    /// The segment id stubs map it by for outputs they write (read-write).
    output_id: u32,
    /// The key it was first opened by (for messages).
    key: String,
    offset: u64,
    byte_size: u64,
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
    fn check_file(&self, name: &str) -> Result<(), InferError> {
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
    fn pwrite(&self, name: &str, offset: u64, data: &[u8]) -> Result<(), InferError> {
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

/// The entry of an address table (start address -> length and value: [`LIVE`], [`STAGED`])
/// whose range holds `[ptr, ptr + len)`, and the offset of `ptr` in it.
fn containing<V>(table: &BTreeMap<usize, (usize, V)>, ptr: *const u8, len: usize) -> Option<(&V, u64)> {
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

/// One CUDA registration: a client's device allocation, open in this process.
pub struct CudaRegion {
    id: u32,
    status: CudaRegionStatus,
    /// The client's IPC handle, which a stub opens for itself (a model with GPU inputs).
    handle: [u8; tritium_cuda::IPC_HANDLE_BYTES],
    mapping: tritium_cuda::IpcMapping,
}

impl std::fmt::Debug for CudaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRegion").field("id", &self.id).field("status", &self.status).finish()
    }
}

impl CudaRegion {
    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, InferError> {
        let mut data = vec![0u8; usize::try_from(len).map_err(|_| InferError::invalid("input too large"))?];
        self.mapping.read(offset, &mut data).map_err(|e| {
            InferError::internal(format!(
                "failed to read {len} bytes from CUDA shared memory region '{}': {e}",
                self.status.name
            ))
        })?;
        Ok(data)
    }
}

/// What a status request reports of one CUDA region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaRegionStatus {
    /// The name it was registered under.
    pub name: String,
    /// The CUDA device the allocation lives on.
    pub device_id: u64,
    /// Length of the registered range.
    pub byte_size: u64,
}

/// A registered region of either kind, as a request names it (an input's, or where an output goes).
#[derive(Debug, Clone)]
enum TargetRegion {
    System(Arc<Region>),
    Cuda(Arc<CudaRegion>),
}

/// The host copies of inputs in CUDA regions, by address: [`lookup_cuda`] finds the region an
/// input's bytes came from, so the worker can hand a model that asks for GPU inputs
/// (`FORCE_CPU_ONLY_INPUT_TENSORS: "no"`) the client's device memory instead.
static STAGED: Mutex<BTreeMap<usize, (usize, Staged)>> = Mutex::new(BTreeMap::new());

/// What [`STAGED`] knows of one host copy (besides its length): its region, and the offset in
/// it the copy was made from.
type Staged = (Weak<CudaRegion>, u64);

/// An input's bytes copied from a CUDA region, listed in [`STAGED`] while they live.
struct StagedBytes {
    data: Vec<u8>,
    _region: Arc<CudaRegion>,
}

impl AsRef<[u8]> for StagedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for StagedBytes {
    fn drop(&mut self) {
        STAGED.locked().remove(&(self.data.as_ptr() as usize));
    }
}

/// `[offset, offset + len)` of a CUDA region copied to the host (`len` > 0), as input bytes.
fn staged(region: Arc<CudaRegion>, offset: u64, len: u64) -> Result<Bytes, InferError> {
    let data = region.read(offset, len)?;
    STAGED.locked().insert(data.as_ptr() as usize, (data.len(), (Arc::downgrade(&region), offset)));
    Ok(Bytes::from_owner(StagedBytes { data, _region: region }))
}

/// How a stub finds `[ptr, ptr + len)` in the client's device memory, when those bytes are the
/// host copy of a CUDA region's: the client's IPC handle of the allocation, its device, and
/// where the bytes are in it.
pub(crate) fn lookup_cuda(ptr: *const u8, len: usize) -> Option<TensorData> {
    let staged = STAGED.locked();
    let ((region, copied_from), offset) = containing(&staged, ptr, len)?;
    let region = region.upgrade()?;
    Some(TensorData::Cuda {
        handle: region.handle.to_vec(),
        device: region.mapping.device(),
        offset: copied_from + offset,
        len: len as u64,
    })
}

/// Where a request wants one output: a range of a registered region.
#[derive(Debug, Clone)]
pub struct ShmTarget {
    region: TargetRegion,
    /// The name the request gave (several names may share one system region's mapping).
    name: Arc<str>,
    offset: u64,
    byte_size: u64,
}

impl PartialEq for ShmTarget {
    fn eq(&self, other: &Self) -> bool {
        let same = match (&self.region, &other.region) {
            (TargetRegion::System(a), TargetRegion::System(b)) => a.id == b.id,
            (TargetRegion::Cuda(a), TargetRegion::Cuda(b)) => a.id == b.id,
            _ => false,
        };
        same && self.offset == other.offset && self.byte_size == other.byte_size
    }
}

impl Eq for ShmTarget {}

impl ShmTarget {
    /// The region's name.
    pub fn region_name(&self) -> &str {
        &self.name
    }

    /// Offset in the registered range.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes available for the output.
    pub fn byte_size(&self) -> u64 {
        self.byte_size
    }

    /// The system region and the descriptor a stub writes the output through (under the
    /// region's output id, mapped read-write); `None` for a CUDA region, which the server writes.
    pub(crate) fn system(&self) -> Option<(&Arc<Region>, Descriptor)> {
        match &self.region {
            TargetRegion::System(r) => {
                Some((r, Descriptor { segment: r.output_id, offset: self.offset, len: self.byte_size }))
            }
            TargetRegion::Cuda(_) => None,
        }
    }

    /// Checks, right before a stub is given the target, that the client has not shrunk a system
    /// region's file (a request queued before the shrink fails alone).
    pub(crate) fn check_size(&self) -> Result<(), InferError> {
        match &self.region {
            TargetRegion::System(region) => region.check_file(&self.name),
            TargetRegion::Cuda(_) => Ok(()),
        }
    }

    /// Copies an output the server holds into the target (ensembles, cached responses: where no
    /// stub wrote it), with `pwrite`, and Triton's error when it does not fit.
    pub fn write(&self, output: &str, data: &[u8]) -> Result<(), InferError> {
        check_fits(output, self.byte_size, data.len() as u64)?;
        let region = match &self.region {
            TargetRegion::System(region) => region,
            TargetRegion::Cuda(region) => {
                return region.mapping.write(self.offset, data).map_err(|e| {
                    InferError::internal(format!(
                        "failed to write output '{output}' into CUDA shared memory region '{}': {e}",
                        region.status.name
                    ))
                });
            }
        };
        region.pwrite(&self.name, self.offset, data)
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

/// Triton's error for an output larger than its shared-memory target.
pub fn check_fits(output: &str, available: u64, needed: u64) -> Result<(), InferError> {
    if needed > available {
        return Err(InferError::internal(tritium_ipc::output_too_small(output, available, needed)));
    }
    Ok(())
}

/// Triton's text for a registration while client shared memory is off (`--allow-client-shm`).
pub const CLIENT_SHM_DISABLED: &str =
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.";

/// The default of `--max-shm-regions`: registered regions of both kinds at once. Each distinct
/// range of a file holds a descriptor and a mapping in the server (and in every stub that reads
/// it), and each one is scanned before every batch, so the count must stay well below the
/// process's descriptor limit (often 1024).
pub const DEFAULT_MAX_SHM_REGIONS: usize = 256;

/// The registered shared-memory regions of both kinds, by name.
#[derive(Debug)]
pub struct ShmRegistry {
    regions: Mutex<Regions>,
    /// `--allow-client-shm=false`: registrations are refused (status and unregister still answer).
    disabled: AtomicBool,
    /// `--max-shm-regions`: registered names of both kinds at once.
    max_regions: AtomicUsize,
}

impl Default for ShmRegistry {
    fn default() -> Self {
        Self {
            regions: Mutex::default(),
            disabled: AtomicBool::new(false),
            max_regions: AtomicUsize::new(DEFAULT_MAX_SHM_REGIONS),
        }
    }
}

/// One registered system region: the key it was registered with, and the (shared) mapping.
#[derive(Debug)]
struct Named {
    key: String,
    region: Arc<Region>,
}

/// The two kinds' names, under one lock: a name is registered as one kind at a time.
#[derive(Debug, Default)]
struct Regions {
    system: BTreeMap<String, Named>,
    cuda: BTreeMap<String, Arc<CudaRegion>>,
    /// The system mappings by file identity and range, so registrations of one range of one
    /// file share a descriptor and a mapping (entries whose region is gone are replaced).
    mappings: HashMap<((u64, u64), u64, u64), Weak<Region>>,
}

impl Regions {
    fn check_free(&self, name: &str, max: usize) -> Result<(), InferError> {
        if self.system.contains_key(name) || self.cuda.contains_key(name) {
            return Err(InferError::new(
                ErrorKind::AlreadyExists,
                format!("shared memory region '{name}' already in manager"),
            ));
        }
        if self.system.len() + self.cuda.len() >= max {
            return Err(InferError::new(
                ErrorKind::Unavailable,
                format!(
                    "cannot register shared memory region '{name}': {max} regions are registered, the limit \
                     (server flag --max-shm-regions); unregister regions that are no longer used"
                ),
            ));
        }
        Ok(())
    }
}

impl ShmRegistry {
    /// Whether clients may register regions (`--allow-client-shm`; on unless turned off, as in
    /// Triton 2.51; later Triton releases turn it off by default).
    pub fn set_allowed(&self, allowed: bool) {
        self.disabled.store(!allowed, Ordering::Relaxed);
    }

    /// At most `max` regions (of both kinds) registered at once (`--max-shm-regions`).
    pub fn set_max_regions(&self, max: usize) {
        self.max_regions.store(max, Ordering::Relaxed);
    }

    /// Checks that clients may register regions, before anything else about a registration (as
    /// Triton does, over both protocols).
    pub fn check_allowed(&self) -> Result<(), InferError> {
        if self.disabled.load(Ordering::Relaxed) {
            return Err(InferError::new(ErrorKind::Unsupported, CLIENT_SHM_DISABLED));
        }
        Ok(())
    }

    /// Registers `byte_size` bytes from `offset` of the POSIX shared memory object `key` as
    /// `name` (Triton's `RegisterSystemSharedMemory`, with its checks and texts).
    pub fn register(&self, name: &str, key: &str, offset: u64, byte_size: u64) -> Result<(), InferError> {
        self.check_allowed()?;
        validate_key(name, key)?;
        let mut regions = self.regions.locked();
        regions.check_free(name, self.max_regions.load(Ordering::Relaxed))?;
        let fd = nix::sys::mman::shm_open(key, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::S_IRUSR | Mode::S_IWUSR)
            .map_err(|_| InferError::internal(format!("Unable to open shared memory region: '{key}'")))?;
        let stat = nix::sys::stat::fstat(fd.as_raw_fd())
            .map_err(|_| InferError::internal(format!("Invalid shared memory region: '{key}'")))?;
        let size = u64::try_from(stat.st_size)
            .map_err(|_| InferError::internal(format!("Invalid shared memory region: '{key}'")))?;
        if offset.checked_add(byte_size).is_none_or(|end| end > size) {
            return Err(InferError::invalid(format!("failed to register shared memory region '{name}': invalid args")));
        }
        // The same range of the same file (not merely the same key: a client may have replaced
        // the object under it) shares the mapping already open; the new descriptor is closed.
        let share_key = ((stat.st_dev as u64, stat.st_ino as u64), offset, byte_size);
        if let Some(region) = regions.mappings.get(&share_key).and_then(Weak::upgrade) {
            regions.system.insert(name.to_string(), Named { key: key.to_string(), region });
            return Ok(());
        }
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
            InferError::internal(format!(
                "failed to register shared memory region '{name}': reopening it read-only: {e}"
            ))
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
        regions.mappings.retain(|_, w| w.strong_count() > 0);
        regions.mappings.insert(share_key, Arc::downgrade(&region));
        regions.system.insert(name.to_string(), Named { key: key.to_string(), region });
        Ok(())
    }

    /// Registers `byte_size` bytes of the device allocation whose CUDA IPC handle is
    /// `raw_handle`, on CUDA device `device_id`, as `name` (Triton's
    /// `RegisterCUDASharedMemory`, with its checks and texts, and what went wrong after them).
    pub fn register_cuda(
        &self,
        name: &str,
        raw_handle: &[u8],
        device_id: i64,
        byte_size: u64,
    ) -> Result<(), InferError> {
        self.check_allowed()?;
        let mut regions = self.regions.locked();
        regions.check_free(name, self.max_regions.load(Ordering::Relaxed))?;
        if raw_handle.len() != tritium_cuda::IPC_HANDLE_BYTES {
            return Err(InferError::invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"));
        }
        let cuda = tritium_cuda::cuda().map_err(|e| {
            InferError::invalid(format!(
                "failed to register CUDA shared memory region: '{name}', GPUs not supported ({e})"
            ))
        })?;
        let device = i32::try_from(device_id).unwrap_or(i32::MAX);
        let mapping = cuda.open_ipc(device, raw_handle).map_err(|e| {
            InferError::invalid(format!(
                "failed to register shared memory region: invalid args (opening the CUDA IPC handle on device {device_id}: {e})"
            ))
        })?;
        if byte_size > mapping.size() {
            return Err(InferError::invalid(format!(
                "failed to register shared memory region '{name}': invalid args (byte_size {byte_size} is more than the {} bytes of the allocation)",
                mapping.size()
            )));
        }
        let status = CudaRegionStatus { name: name.to_string(), device_id: device_id as u64, byte_size };
        let mut handle = [0u8; tritium_cuda::IPC_HANDLE_BYTES];
        handle.copy_from_slice(raw_handle);
        regions.cuda.insert(name.to_string(), Arc::new(CudaRegion { id: next_id(), status, handle, mapping }));
        Ok(())
    }

    /// Unregisters the system region `name`; a name that is not registered as one is no error
    /// (as in Triton). Requests already using the region keep it until they end.
    pub fn unregister(&self, name: &str) {
        self.regions.locked().system.remove(name);
    }

    /// Unregisters every system region.
    pub fn unregister_all(&self) {
        self.regions.locked().system.clear();
    }

    /// Unregisters the CUDA region `name` (none is no error); requests using it keep it open
    /// until they end.
    pub fn unregister_cuda(&self, name: &str) {
        self.regions.locked().cuda.remove(name);
    }

    /// Unregisters every CUDA region.
    pub fn unregister_all_cuda(&self) {
        self.regions.locked().cuda.clear();
    }

    /// The status of system region `name`, or of every one (by name) when `name` is empty.
    pub fn status(&self, name: &str) -> Result<Vec<RegionStatus>, InferError> {
        let regions = self.regions.locked();
        let status = |(name, n): (&String, &Named)| RegionStatus {
            name: name.clone(),
            key: n.key.clone(),
            offset: n.region.offset,
            byte_size: n.region.byte_size,
        };
        if name.is_empty() {
            return Ok(regions.system.iter().map(status).collect());
        }
        match regions.system.get_key_value(name) {
            Some(r) => Ok(vec![status(r)]),
            None if regions.cuda.contains_key(name) => Err(InferError::not_found(format!(
                "The region named '{name}' is registered as CUDA shared memory, not system shared memory"
            ))),
            None => Err(InferError::not_found(format!("Unable to find system shared memory region: '{name}'"))),
        }
    }

    /// The status of CUDA region `name`, or of every one (by name) when `name` is empty.
    pub fn cuda_status(&self, name: &str) -> Result<Vec<CudaRegionStatus>, InferError> {
        let regions = self.regions.locked();
        if name.is_empty() {
            return Ok(regions.cuda.values().map(|r| r.status.clone()).collect());
        }
        match regions.cuda.get(name) {
            Some(r) => Ok(vec![r.status.clone()]),
            None if regions.system.contains_key(name) => Err(InferError::not_found(format!(
                "The region named '{name}' is registered as system shared memory, not CUDA shared memory"
            ))),
            None => Err(InferError::not_found(format!("Unable to find cuda shared memory region: '{name}'"))),
        }
    }

    /// The input bytes `[offset, offset + byte_size)` of region `name`: without a copy from a
    /// system region (the returned `Bytes` holds the region), copied to the host from a CUDA one.
    pub fn input(&self, name: &str, offset: u64, byte_size: u64) -> Result<Bytes, InferError> {
        let (found, offset) = self.resolve(name, offset, byte_size)?;
        if byte_size == 0 {
            return Ok(Bytes::new());
        }
        match found {
            TargetRegion::System(region) => Ok(Bytes::from_owner(RegionBytes { region, offset, len: byte_size })),
            TargetRegion::Cuda(region) => Ok(staged(region, offset, byte_size)?),
        }
    }

    /// Where an output asked for in region `name` goes.
    pub fn output(&self, name: &str, offset: u64, byte_size: u64) -> Result<ShmTarget, InferError> {
        let (region, offset) = self.resolve(name, offset, byte_size)?;
        Ok(ShmTarget { region, name: name.into(), offset, byte_size })
    }

    /// Triton's `GetMemoryInfo` checks, in its order and with its texts, and the file check.
    fn resolve(&self, name: &str, offset: u64, byte_size: u64) -> Result<(TargetRegion, u64), InferError> {
        let found = {
            let regions = self.regions.locked();
            match (regions.system.get(name), regions.cuda.get(name)) {
                (Some(r), _) => TargetRegion::System(r.region.clone()),
                (None, Some(r)) => TargetRegion::Cuda(r.clone()),
                (None, None) => {
                    return Err(InferError::not_found(format!("Unable to find shared memory region: '{name}'")));
                }
            }
        };
        match &found {
            TargetRegion::System(region) => {
                check_range(name, region.byte_size, offset, byte_size)?;
                region.check_file(name)?;
            }
            TargetRegion::Cuda(region) => check_range(name, region.status.byte_size, offset, byte_size)?,
        }
        Ok((found, offset))
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

fn next_id() -> u32 {
    REGION_BIT | (NEXT_ID.fetch_add(1, Ordering::Relaxed) & (REGION_BIT - 1))
}

/// Triton's bounds checks of a range of a region of `size` bytes.
fn check_range(name: &str, size: u64, offset: u64, byte_size: u64) -> Result<(), InferError> {
    if offset >= size {
        return Err(InferError::invalid(format!("Invalid offset for shared memory region: '{name}'")));
    }
    let Some(end) = offset.checked_add(byte_size) else {
        return Err(InferError::invalid(format!(
            "Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value ({}) for region '{name}'",
            u64::MAX
        )));
    };
    if end > size {
        return Err(InferError::invalid(format!("Invalid offset + byte size for shared memory region: '{name}'")));
    }
    Ok(())
}

/// Triton's `ValidateSharedMemoryKey`.
fn validate_key(name: &str, key: &str) -> Result<(), InferError> {
    let rest = key.trim_start_matches('/');
    if rest.is_empty() {
        return Err(InferError::invalid(format!(
            "cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )));
    }
    if rest.starts_with(RESERVED_PREFIX) {
        return Err(InferError::invalid(format!(
            "cannot register shared memory region '{name}' with key '{key}' as the key contains the reserved prefix '{RESERVED_PREFIX}'"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "shm_tests.rs"]
mod tests;
