//! Where a request wants an output: [`ShmTarget`], a range of a registered region of either
//! kind, written by a stub (a system region, mapped read-write in it) or by the server (with
//! `pwrite`, or a host-to-device copy into a CUDA region).

use std::sync::Arc;

use tritium_ipc::Descriptor;

use super::cuda::CudaRegion;
use super::region::Region;
use crate::error::InferError;

/// A registered region of either kind, as a request names it (an input's, or where an output goes).
#[derive(Debug, Clone)]
pub(super) enum TargetRegion {
    System(Arc<Region>),
    Cuda(Arc<CudaRegion>),
}

/// Where a request wants one output: a range of a registered region.
#[derive(Debug, Clone)]
pub struct ShmTarget {
    pub(super) region: TargetRegion,
    /// The name the request gave (several names may share one system region's mapping).
    pub(super) name: Arc<str>,
    pub(super) offset: u64,
    pub(super) byte_size: u64,
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

/// Triton's error for an output larger than its shared-memory target.
pub fn check_fits(output: &str, available: u64, needed: u64) -> Result<(), InferError> {
    if needed > available {
        return Err(InferError::internal(tritium_ipc::output_too_small(output, available, needed)));
    }
    Ok(())
}
