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
//!
//! - [`region`]: a system region, its mapping and the table of live mappings.
//! - [`cuda`]: a CUDA region and the host copies of its inputs.
//! - [`target`]: [`ShmTarget`], where an output goes.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use tritium_sync::Locked;

use crate::error::{ErrorKind, InferError};

mod cuda;
mod region;
mod target;

pub(crate) use cuda::lookup_cuda;
use cuda::staged;
pub use cuda::{CudaRegion, CudaRegionStatus};
pub use region::Region;
pub(crate) use region::{check_input_region, is_live, lookup, pread_copy, shrunk_region};
use region::{next_id, region_bytes};
use target::TargetRegion;
pub use target::{check_fits, ShmTarget};

/// The key prefix Triton reserves for the shared memory of its own Python backend.
const RESERVED_PREFIX: &str = "triton_python_backend_shm_region_";

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
        let region = region::map(name, key, fd, offset, byte_size)?;
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
            TargetRegion::System(region) => Ok(region_bytes(region, offset, byte_size)),
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
