//! The tensor arena: first-fit allocation of tensor bytes inside this side's own segments.
//!
//! Each side allocates only in segments it created (server-owned ids have the top bit clear,
//! stub-owned ids have it set), so no lock is ever shared between processes. A block is freed when
//! the peer says it is done with it (a `Release` control frame) or, if it was never handed over,
//! by its owner. Releases for blocks that were never allocated are refused, so a buggy peer cannot
//! corrupt the free lists.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::IpcError;
use crate::segment::Segment;

/// Where a tensor's bytes live: a range of one shared segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Descriptor {
    /// Segment id; the top bit tells which side owns it (see [`STUB_OWNED`]).
    pub segment: u32,
    /// Byte offset inside the segment.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Descriptor {
    /// Whether the block lies in a client's registered region ([`REGION_BIT`]), which
    /// no arena owns: freeing or releasing it is nothing to do.
    pub fn in_client_region(&self) -> bool {
        self.segment & REGION_BIT != 0
    }
}

/// Top bit of a segment id owned (created and allocated in) by the stub.
pub const STUB_OWNED: u32 = 1 << 31;

/// The bit that marks a segment id as a client's registered region (system shared memory)
/// rather than an arena segment. Region ids are the server's (top bit clear); neither arena
/// allocates or frees in them, and releases of their blocks are ignored.
pub const REGION_BIT: u32 = 1 << 30;
/// Alignment of every block: a cache line, enough for any dtype and for vectorised copies.
pub const BLOCK_ALIGN: u64 = 64;

/// Which end of a channel this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The tritium server.
    Server,
    /// A Python stub process.
    Stub,
}

impl Side {
    /// The bit that this side's segment ids carry.
    pub fn id_bit(self) -> u32 {
        match self {
            Side::Server => 0,
            Side::Stub => STUB_OWNED,
        }
    }
}

/// Free space of one segment: offset -> length, coalesced.
#[derive(Debug)]
struct FreeList {
    free: BTreeMap<u64, u64>,
}

impl FreeList {
    fn new(len: u64) -> Self {
        Self { free: BTreeMap::from([(0, len)]) }
    }

    fn alloc(&mut self, len: u64) -> Option<u64> {
        let (&off, &avail) = self.free.iter().find(|(_, &avail)| avail >= len)?;
        self.free.remove(&off);
        if avail > len {
            self.free.insert(off + len, avail - len);
        }
        Some(off)
    }

    fn free(&mut self, mut off: u64, mut len: u64) {
        if let Some((&prev, &plen)) = self.free.range(..off).next_back() {
            if prev + plen == off {
                self.free.remove(&prev);
                off = prev;
                len += plen;
            }
        }
        if let Some(&nlen) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nlen;
        }
        self.free.insert(off, len);
    }

    fn is_all_free(&self, total: u64) -> bool {
        self.free.get(&0) == Some(&total)
    }
}

#[derive(Debug)]
struct OwnSegment {
    seg: Arc<Segment>,
    free: FreeList,
    /// Live blocks: offset -> rounded length.
    live: HashMap<u64, u64>,
}

/// What an allocation did besides carving a block.
#[derive(Debug)]
pub struct Allocation {
    /// The block.
    pub desc: Descriptor,
    /// The segment it lives in.
    pub segment: Arc<Segment>,
    /// A segment created for this allocation, which must be announced to the peer before the
    /// block is referenced in any message.
    pub created: Option<(u32, Arc<Segment>)>,
}

/// This side's allocator over its own segments.
#[derive(Debug)]
pub struct Arena {
    side: Side,
    name: String,
    default_size: u64,
    /// Most bytes of segments this arena may hold at once.
    max_bytes: u64,
    next_id: u32,
    segments: BTreeMap<u32, OwnSegment>,
}

fn round_up(v: u64, to: u64) -> Option<u64> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

impl Arena {
    /// An empty arena; segments of `default_size` bytes (or larger, for one large block) are
    /// created on demand. `name` shows up in `/proc/PID/fd` for the memfds.
    pub fn new(side: Side, name: &str, default_size: u64) -> Self {
        Self {
            side,
            name: name.to_string(),
            default_size: round_up(default_size.max(1 << 20), 2 << 20).unwrap_or(2 << 20),
            max_bytes: u64::MAX,
            next_id: 1,
            segments: BTreeMap::new(),
        }
    }

    /// Caps the bytes of segments this arena may hold at once. A peer that never releases what
    /// it was sent then makes allocations fail (`OutOfMemory`) instead of growing memory without
    /// bound.
    pub fn set_max_bytes(&mut self, max_bytes: u64) {
        self.max_bytes = max_bytes;
    }

    /// Allocates `len` bytes (at least one aligned unit), creating a segment if none has room.
    pub fn alloc(&mut self, len: u64) -> Result<Allocation, IpcError> {
        let rounded = round_up(len.max(1), BLOCK_ALIGN).ok_or(IpcError::OutOfMemory(len, "size overflows".into()))?;
        for (&id, own) in self.segments.iter_mut() {
            if let Some(off) = own.free.alloc(rounded) {
                own.live.insert(off, rounded);
                return Ok(Allocation {
                    desc: Descriptor { segment: id, offset: off, len },
                    segment: own.seg.clone(),
                    created: None,
                });
            }
        }
        let size = round_up(rounded, 2 << 20)
            .ok_or(IpcError::OutOfMemory(len, "size overflows".into()))?
            .max(self.default_size);
        let mapped = self.mapped_bytes();
        if mapped.checked_add(size).is_none_or(|total| total > self.max_bytes) {
            return Err(IpcError::OutOfMemory(
                len,
                format!(
                    "this channel already holds {mapped} bytes of segments and its limit is {} bytes \
                     (blocks the peer has not released yet count against it)",
                    self.max_bytes
                ),
            ));
        }
        let id = self.next_id | self.side.id_bit();
        self.next_id += 1;
        let seg = Arc::new(
            Segment::create(&format!("{}-{}", self.name, id & !STUB_OWNED), size)
                .map_err(|e| IpcError::OutOfMemory(len, e.to_string()))?,
        );
        let mut free = FreeList::new(size);
        let off = free.alloc(rounded).ok_or(IpcError::OutOfMemory(len, "fresh segment too small".into()))?;
        let mut live = HashMap::new();
        live.insert(off, rounded);
        self.segments.insert(id, OwnSegment { seg: seg.clone(), free, live });
        Ok(Allocation {
            desc: Descriptor { segment: id, offset: off, len },
            segment: seg.clone(),
            created: Some((id, seg)),
        })
    }

    /// Allocates one block for each of `lens`, back to back in one segment and in this order:
    /// block `i + 1` starts where block `i` ends, so that the peer can view them as one range
    /// (the requests of a batch, joined along their first dimension without a copy). Each is a
    /// block of its own, released and freed on its own. The first starts at [`BLOCK_ALIGN`]; the
    /// others are aligned only as far as the lengths before them are. `None` when `lens` is empty
    /// or holds a 0 (an empty block has no bytes to be adjacent with): allocate them one by one.
    pub fn alloc_run(&mut self, lens: &[u64]) -> Result<Option<Vec<Allocation>>, IpcError> {
        if lens.is_empty() || lens.contains(&0) {
            return Ok(None);
        }
        let total = lens
            .iter()
            .try_fold(0u64, |acc, &len| acc.checked_add(len))
            .ok_or(IpcError::OutOfMemory(u64::MAX, "size overflows".into()))?;
        let whole = self.alloc(total)?;
        let own = self
            .segments
            .get_mut(&whole.desc.segment)
            .ok_or_else(|| IpcError::Protocol("allocator lost the segment it allocated in".into()))?;
        let rounded = own
            .live
            .remove(&whole.desc.offset)
            .ok_or_else(|| IpcError::Protocol("allocator lost the block it allocated".into()))?;
        let mut created = whole.created;
        let mut pieces = Vec::with_capacity(lens.len());
        let mut offset = whole.desc.offset;
        for (i, &len) in lens.iter().enumerate() {
            // The last block keeps the whole run's rounding, so that freeing every block frees
            // exactly what was carved.
            let span = if i + 1 == lens.len() { whole.desc.offset + rounded - offset } else { len };
            own.live.insert(offset, span);
            pieces.push(Allocation {
                desc: Descriptor { segment: whole.desc.segment, offset, len },
                segment: whole.segment.clone(),
                created: created.take(),
            });
            offset += len;
        }
        Ok(Some(pieces))
    }

    /// Frees a block of this arena. Returns the id of a segment that became empty and should be
    /// retired (an oversized one created for a single large block), if any.
    pub fn free(&mut self, desc: Descriptor) -> Result<Option<u32>, IpcError> {
        let own = self
            .segments
            .get_mut(&desc.segment)
            .ok_or_else(|| IpcError::Protocol(format!("release of a block in unknown segment {}", desc.segment)))?;
        let rounded = own
            .live
            .remove(&desc.offset)
            .ok_or_else(|| IpcError::Protocol(format!("release of a block that is not allocated: {desc:?}")))?;
        own.free.free(desc.offset, rounded);
        let total = own.seg.len();
        if total > self.default_size && own.free.is_all_free(total) {
            self.segments.remove(&desc.segment);
            return Ok(Some(desc.segment));
        }
        Ok(None)
    }

    /// Bytes of shared memory this arena holds (mapped segment sizes).
    pub fn mapped_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.seg.len()).sum()
    }

    /// Number of live blocks.
    pub fn live_blocks(&self) -> usize {
        self.segments.values().map(|s| s.live.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_list_coalesces_both_sides() {
        let mut f = FreeList::new(1000);
        let a = f.alloc(100).expect("a");
        let b = f.alloc(100).expect("b");
        let c = f.alloc(100).expect("c");
        f.free(a, 100);
        f.free(c, 100);
        f.free(b, 100);
        assert!(f.is_all_free(1000));
    }

    #[test]
    fn blocks_are_aligned_and_disjoint_and_reused() {
        let mut a = Arena::new(Side::Server, "t", 1 << 20);
        let x = a.alloc(10).expect("x");
        let y = a.alloc(100).expect("y");
        assert!(x.created.is_some());
        assert!(y.created.is_none());
        assert_eq!(x.desc.offset % BLOCK_ALIGN, 0);
        assert_eq!(y.desc.offset % BLOCK_ALIGN, 0);
        assert!(y.desc.offset >= x.desc.offset + 64);
        a.free(x.desc).expect("free x");
        let z = a.alloc(64).expect("z");
        assert_eq!(z.desc.offset, x.desc.offset);
        assert_eq!(a.live_blocks(), 2);
    }

    #[test]
    fn large_block_gets_its_own_segment_which_is_retired() {
        let mut a = Arena::new(Side::Stub, "t", 1 << 20);
        let small = a.alloc(1).expect("small");
        let big = a.alloc(5 << 20).expect("big");
        assert_ne!(small.desc.segment, big.desc.segment);
        assert_eq!(big.desc.segment & STUB_OWNED, STUB_OWNED);
        assert!(big.segment.len() >= 5 << 20);
        assert_eq!(a.free(big.desc).expect("free"), Some(big.desc.segment));
        assert_eq!(a.free(small.desc).expect("free"), None, "the default segment stays");
    }

    #[test]
    fn a_run_is_adjacent_blocks_each_freed_on_its_own() {
        let mut a = Arena::new(Side::Server, "t", 1 << 20);
        let before = a.alloc(10).expect("before");
        let run = a.alloc_run(&[2048, 100, 2048]).expect("run").expect("some");
        assert!(run[0].created.is_none(), "fits in the existing segment");
        assert_eq!(run[0].desc.offset % BLOCK_ALIGN, 0);
        for pair in run.windows(2) {
            assert_eq!(pair[0].desc.segment, pair[1].desc.segment);
            assert_eq!(pair[0].desc.offset + pair[0].desc.len, pair[1].desc.offset, "adjacent");
        }
        assert_eq!(run.iter().map(|b| b.desc.len).collect::<Vec<_>>(), [2048, 100, 2048]);
        assert_eq!(a.live_blocks(), 4);
        // Freed in any order, the run's space comes back whole: a block of its total size goes
        // where it was.
        a.free(run[1].desc).expect("free middle");
        a.free(run[2].desc).expect("free last");
        a.free(run[0].desc).expect("free first");
        assert!(a.free(run[0].desc).is_err(), "double free");
        let again = a.alloc(2048 + 100 + 2048).expect("again");
        assert_eq!(again.desc.offset, run[0].desc.offset);
        a.free(again.desc).expect("free again");
        a.free(before.desc).expect("free before");
        assert_eq!(a.live_blocks(), 0);
        assert!(a.alloc_run(&[]).expect("empty").is_none());
        assert!(a.alloc_run(&[64, 0]).expect("zero").is_none());
    }

    #[test]
    fn a_large_run_gets_its_own_segment_which_is_retired_with_its_last_block() {
        let mut a = Arena::new(Side::Stub, "t", 1 << 20);
        let run = a.alloc_run(&[3 << 20, 3 << 20]).expect("run").expect("some");
        assert!(run[0].created.is_some(), "announced once, with the first block");
        assert!(run[1].created.is_none());
        assert_eq!(a.free(run[0].desc).expect("free"), None);
        assert_eq!(a.free(run[1].desc).expect("free"), Some(run[1].desc.segment));
    }

    #[test]
    fn bogus_releases_are_refused() {
        let mut a = Arena::new(Side::Server, "t", 1 << 20);
        let x = a.alloc(128).expect("x");
        assert!(a.free(Descriptor { offset: x.desc.offset + 64, ..x.desc }).is_err());
        assert!(a.free(Descriptor { segment: 99, ..x.desc }).is_err());
        a.free(x.desc).expect("first free");
        assert!(a.free(x.desc).is_err(), "double free");
    }
}
