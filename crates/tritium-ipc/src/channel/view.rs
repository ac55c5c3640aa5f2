//! [`View`]: a range of bytes in a shared segment, bounds-checked when it was made, that keeps
//! its segment mapped while it lives. A leaf: it imports nothing of the other `channel` modules.

use std::sync::Arc;

use crate::arena::Descriptor;
use crate::segment::Segment;

/// A received view of bytes in a shared segment. Holding it keeps the mapping alive.
#[derive(Debug, Clone)]
pub struct View {
    /// Where the bytes are.
    pub desc: Descriptor,
    pub(super) segment: Arc<Segment>,
    pub(super) ptr: *mut u8,
}

// SAFETY: `ptr` points into `segment`, which the Arc keeps mapped; a View is only a capability to
// access that range, which any thread may use.
unsafe impl Send for View {}
// SAFETY: as above.
unsafe impl Sync for View {}

impl View {
    /// Start of the bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.desc.len as usize
    }

    /// True for a zero-length view.
    pub fn is_empty(&self) -> bool {
        self.desc.len == 0
    }

    /// Copies the bytes out. The peer may still write to shared memory, so the bytes are copied
    /// rather than borrowed. The vector is not zeroed first, and a large copy streams
    /// ([`crate::copy`]): what reads it next is a socket write or a client, not this thread's
    /// caches.
    pub fn to_vec(&self) -> Vec<u8> {
        let len = self.len();
        let mut out = Vec::with_capacity(len);
        // SAFETY: the view's range was bounds-checked against the live mapping when it was made;
        // `out` has room for `len` bytes, all of which the copy writes before `set_len`.
        unsafe {
            crate::copy::copy_for_peer_raw(self.ptr, out.as_mut_ptr(), len);
            out.set_len(len);
        }
        out
    }

    /// Copies the bytes into `dst`, which must have the view's length.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len(), "destination length");
        // SAFETY: the range was bounds-checked against the live mapping when the view was made.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, dst.as_mut_ptr(), dst.len()) };
    }

    /// Copies `src` into the bytes, which must have the view's length; the peer reads them next,
    /// so a large copy streams ([`crate::copy`]).
    pub fn copy_from(&self, src: &[u8]) {
        assert_eq!(src.len(), self.len(), "source length");
        // SAFETY: as in `copy_to`; `src` is this process's memory, not the view's.
        unsafe { crate::copy::copy_for_peer_raw(src.as_ptr(), self.ptr, src.len()) };
    }

    /// The segment, for keeping it mapped.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }
}
