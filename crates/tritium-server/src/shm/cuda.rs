//! A CUDA region: a client's device allocation, open in this process through its CUDA IPC
//! handle ([`CudaRegion`]), and the host copies of the inputs read from one ([`STAGED`]), by
//! which a stub is told where the bytes are in the client's device memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tritium_ipc::TensorData;
use tritium_sync::Locked;

use super::region::containing;
use crate::error::InferError;

/// One CUDA registration: a client's device allocation, open in this process.
pub struct CudaRegion {
    pub(super) id: u32,
    pub(super) status: CudaRegionStatus,
    /// The client's IPC handle, which a stub opens for itself (a model with GPU inputs).
    pub(super) handle: [u8; tritium_cuda::IPC_HANDLE_BYTES],
    pub(super) mapping: tritium_cuda::IpcMapping,
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

/// The host copies of inputs in CUDA regions, by address: [`lookup_cuda`] finds the region an
/// input's bytes came from, so the worker can hand a model that asks for GPU inputs
/// (`FORCE_CPU_ONLY_INPUT_TENSORS: "no"`) the client's device memory instead.
pub(super) static STAGED: Mutex<BTreeMap<usize, (usize, Staged)>> = Mutex::new(BTreeMap::new());

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
pub(super) fn staged(region: Arc<CudaRegion>, offset: u64, len: u64) -> Result<Bytes, InferError> {
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
