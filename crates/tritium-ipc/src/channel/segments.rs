//! The segment table: segments and client regions announced over the fd socket (their fds go
//! ahead of the ring frame that names them) and checked against
//! [`ChannelLimits`](super::ChannelLimits) before they are mapped, this side's arena,
//! descriptors resolved into [`View`]s, and blocks released.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tritium_sync::{Locked, RwLocked};

use super::{Channel, View};
use crate::arena::{Descriptor, Side};
use crate::error::IpcError;
use crate::protocol::{Control, REGION_BIT};
use crate::segment::Segment;

/// Sends `fd` over the fd socket, tagged with `id` (what the receiver's `recv_fd` checks).
pub(super) fn send_fd(socket: RawFd, id: u32, fd: RawFd, what: &str) -> Result<(), IpcError> {
    let data = id.to_le_bytes();
    let iov = [IoSlice::new(&data)];
    let fds = [fd];
    sendmsg::<()>(socket, &iov, &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)
        .map_err(|e| IpcError::os(what, e))?;
    Ok(())
}

impl<S: Serialize, R: DeserializeOwned> Channel<S, R> {
    pub(super) fn handle_control(&self, ctl: Control) -> Result<(), IpcError> {
        let peer_bit = match self.side {
            Side::Server => Side::Stub.id_bit(),
            Side::Stub => Side::Server.id_bit(),
        };
        match ctl {
            Control::SegmentAdded { id, len } => {
                if id & crate::arena::STUB_OWNED != peer_bit {
                    return Err(IpcError::Protocol(format!("peer announced segment {id} with our owner bit")));
                }
                // Take the fd off the socket first, so a refused announcement leaves no fd queued.
                let fd = self.recv_fd(id)?;
                self.check_peer_segment(peer_bit, id, len)?;
                let seg = Arc::new(Segment::open(fd, len)?);
                self.segments.write_locked().insert(id, seg);
            }
            Control::SegmentRemoved { id } => {
                if id & crate::arena::STUB_OWNED != peer_bit {
                    return Err(IpcError::Protocol(format!("peer removed segment {id}, which is not its own")));
                }
                // Views still holding the Arc keep the mapping until they drop.
                self.segments.write_locked().remove(&id);
            }
            Control::RegionAdded { id, offset, len } => {
                if self.side != Side::Stub || id & REGION_BIT == 0 || id & crate::arena::STUB_OWNED != 0 {
                    return Err(IpcError::Protocol(format!(
                        "peer announced client region {id}, which is not a region id"
                    )));
                }
                let fd = self.recv_fd(id)?;
                self.check_peer_segment(peer_bit, id, len)?;
                let seg = Arc::new(Segment::open_region(fd, offset, len)?);
                self.segments.write_locked().insert(id, seg);
            }
            Control::Release(blocks) => {
                let mut retired = Vec::new();
                {
                    let mut arena = self.arena.locked();
                    // Blocks of client regions belong to no arena: the region outlives them (a
                    // peer's release of one is ignored, as `release` never sends one).
                    for desc in blocks.into_iter().filter(|d| !d.in_client_region()) {
                        if let Some(id) = arena.free(desc)? {
                            retired.push(id);
                        }
                    }
                }
                self.retire(&retired)?;
            }
        }
        Ok(())
    }

    /// Checks a peer's new segment against [`ChannelLimits`](super::ChannelLimits) before it is mapped.
    fn check_peer_segment(&self, peer_bit: u32, id: u32, len: u64) -> Result<(), IpcError> {
        let limits = self.config.limits;
        if len > limits.max_peer_segment_bytes {
            return Err(IpcError::Protocol(format!(
                "peer announced segment {id} of {len} bytes; the limit is {} bytes",
                limits.max_peer_segment_bytes
            )));
        }
        let segs = self.segments.read_locked();
        let peer: Vec<&Arc<Segment>> = segs
            .iter()
            .filter(|(&seg_id, _)| seg_id & crate::arena::STUB_OWNED == peer_bit && seg_id != id)
            .map(|(_, seg)| seg)
            .collect();
        if peer.len() >= limits.max_peer_segments {
            return Err(IpcError::Protocol(format!(
                "peer announced more than {} segments at once",
                limits.max_peer_segments
            )));
        }
        let mapped: u64 = peer.iter().map(|seg| seg.len()).sum();
        if mapped.saturating_add(len) > limits.max_peer_mapped_bytes {
            return Err(IpcError::Protocol(format!(
                "peer segments would reach {} bytes; the limit is {} bytes",
                mapped.saturating_add(len),
                limits.max_peer_mapped_bytes
            )));
        }
        Ok(())
    }

    pub(super) fn recv_fd(&self, id: u32) -> Result<OwnedFd, IpcError> {
        let mut data = [0u8; 4];
        let mut iov = [IoSliceMut::new(&mut data)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        // The fd was sent before the ring frame that announced it, so it is already queued.
        let msg = recvmsg::<()>(
            self.socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| IpcError::os("recvmsg of a segment fd", e))?;
        let mut fd = None;
        for cmsg in msg.cmsgs().map_err(|e| IpcError::os("reading control messages", e))? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for raw in fds {
                    // SAFETY: SCM_RIGHTS installed this fd in our table just now; we own it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
        let got = u32::from_le_bytes(data);
        if got != id {
            return Err(IpcError::Protocol(format!("segment {id} announced but fd for segment {got} received")));
        }
        fd.ok_or_else(|| IpcError::Protocol(format!("segment {id} announced without an fd")))
    }

    fn announce(&self, id: u32, seg: &Segment) -> Result<(), IpcError> {
        let mut tx = self.tx.locked();
        send_fd(self.socket.as_raw_fd(), id, seg.fd().as_raw_fd(), "sendmsg of a segment fd")?;
        self.send_control_locked(&mut tx, &Control::SegmentAdded { id, len: seg.len() }, false)
    }

    /// Maps `len` bytes from `offset` of a client's registered shared-memory file into the stub
    /// as segment `id` (which must have [`REGION_BIT`] set), so descriptors into it reach the
    /// model without a copy. Done once per region and stub ([`Channel::has_region`]); the fd
    /// goes over the socket first, as for arena segments.
    pub fn add_region(&self, id: u32, fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), IpcError> {
        if id & REGION_BIT == 0 || id & crate::arena::STUB_OWNED != 0 {
            return Err(IpcError::Protocol(format!("{id} is not a client region id")));
        }
        let mut tx = self.tx.locked();
        send_fd(self.socket.as_raw_fd(), id, fd.as_raw_fd(), "sendmsg of a region fd")?;
        self.send_control_locked(&mut tx, &Control::RegionAdded { id, offset, len }, false)?;
        self.regions.locked().insert(id);
        Ok(())
    }

    /// Whether client region `id` was announced to the peer.
    pub fn has_region(&self, id: u32) -> bool {
        self.regions.locked().contains(&id)
    }

    /// The client regions announced to the peer.
    pub fn region_ids(&self) -> Vec<u32> {
        self.regions.locked().iter().copied().collect()
    }

    /// Tells the peer to unmap client region `id` (arrays over it keep their mapping until
    /// they are dropped).
    pub fn remove_region(&self, id: u32) -> Result<(), IpcError> {
        if !self.regions.locked().remove(&id) {
            return Ok(());
        }
        let mut tx = self.tx.locked();
        self.send_control_locked(&mut tx, &Control::SegmentRemoved { id }, false)
    }

    /// Allocates `len` bytes in this side's arena, announcing a new segment to the peer if one
    /// was needed. The block belongs to this side until it is sent; free it with
    /// [`Channel::free_own`] if it never is.
    pub fn alloc(&self, len: u64) -> Result<View, IpcError> {
        let a = self.arena.locked().alloc(len)?;
        if let Some((id, seg)) = &a.created {
            self.segments.write_locked().insert(*id, seg.clone());
            self.announce(*id, seg)?;
        }
        let ptr = a
            .segment
            .range(a.desc.offset, a.desc.len)
            .ok_or_else(|| IpcError::Protocol("allocator returned an out-of-range block".into()))?;
        Ok(View { desc: a.desc, segment: a.segment, ptr })
    }

    /// Allocates adjacent blocks of `lens` bytes
    /// ([`Arena::alloc_run`](crate::arena::Arena::alloc_run)), announcing a new segment to the
    /// peer if one was needed; `None` when `lens` is empty or holds a 0.
    pub fn alloc_run(&self, lens: &[u64]) -> Result<Option<Vec<View>>, IpcError> {
        let Some(run) = self.arena.locked().alloc_run(lens)? else {
            return Ok(None);
        };
        let mut views = Vec::with_capacity(run.len());
        for a in run {
            if let Some((id, seg)) = &a.created {
                self.segments.write_locked().insert(*id, seg.clone());
                self.announce(*id, seg)?;
            }
            let ptr = a
                .segment
                .range(a.desc.offset, a.desc.len)
                .ok_or_else(|| IpcError::Protocol("allocator returned an out-of-range block".into()))?;
            views.push(View { desc: a.desc, segment: a.segment, ptr });
        }
        Ok(Some(views))
    }

    /// Frees a block of this side's that was never handed to the peer; a block of a client's
    /// region belongs to no arena, and freeing it does nothing.
    pub fn free_own(&self, desc: Descriptor) -> Result<(), IpcError> {
        if desc.in_client_region() {
            return Ok(());
        }
        let retired = self.arena.locked().free(desc)?;
        self.retire(retired.as_slice())
    }

    /// Unmaps segments of this side's that the arena retired and tells the peer to unmap them.
    fn retire(&self, ids: &[u32]) -> Result<(), IpcError> {
        if ids.is_empty() {
            return Ok(());
        }
        {
            let mut segs = self.segments.write_locked();
            for id in ids {
                segs.remove(id);
            }
        }
        let mut tx = self.tx.locked();
        for &id in ids {
            self.send_control_locked(&mut tx, &Control::SegmentRemoved { id }, false)?;
        }
        Ok(())
    }

    /// Whether client region `id` is mapped here and its client shrank it under an access
    /// ([`Segment::faulted`]): what the model read from it or wrote to it is not the client's.
    pub fn region_faulted(&self, id: u32) -> bool {
        let segs = self.segments.read_locked();
        segs.get(&id).is_some_and(|s| s.faulted())
    }

    /// Resolves a descriptor received from the peer, checking that it lies inside a known segment.
    pub fn view(&self, desc: Descriptor) -> Result<View, IpcError> {
        let segs = self.segments.read_locked();
        let segment = segs
            .get(&desc.segment)
            .ok_or_else(|| IpcError::Protocol(format!("descriptor names unknown segment {}", desc.segment)))?
            .clone();
        let ptr = segment.range(desc.offset, desc.len).ok_or_else(|| {
            IpcError::Protocol(format!(
                "descriptor {}+{} is outside segment {} of {} bytes",
                desc.offset,
                desc.len,
                desc.segment,
                segment.len()
            ))
        })?;
        Ok(View { desc, segment, ptr })
    }

    /// Queues a block of the peer's for release; it is sent with the next message or wait. A
    /// block of a client's region is nobody's to release and is not queued.
    pub fn release(&self, desc: Descriptor) {
        if !desc.in_client_region() {
            self.pending_release.locked().push(desc);
        }
    }

    /// Bytes of shared memory in this side's arena segments plus the control segment.
    pub fn own_shm_bytes(&self) -> u64 {
        let own = self.arena.locked().mapped_bytes();
        own + if self.side == Side::Server { self.control.len() } else { 0 }
    }

    /// Bytes of shared memory this channel really uses (pages touched so far) across the
    /// control segment and every arena segment of both sides. Mapped address space is larger:
    /// arena segments are reserved at 256 MiB and filled on demand.
    pub fn shm_bytes(&self) -> u64 {
        let segs = self.segments.read_locked();
        // Client regions are the client's memory, not the channel's.
        self.control.allocated_bytes()
            + segs.iter().filter(|(id, _)| *id & REGION_BIT == 0).map(|(_, s)| s.allocated_bytes()).sum::<u64>()
    }

    /// Live blocks in this side's arena (allocated, not yet released).
    pub fn live_blocks(&self) -> usize {
        self.arena.locked().live_blocks()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::channel::testing::{pair, pair_with, T};
    use crate::channel::ChannelLimits;
    use crate::protocol::{StubError, ToServer, ToStub};

    #[test]
    fn a_run_of_blocks_is_one_range_in_the_peer_and_is_released_block_by_block() {
        let (server, stub) = pair();
        let run = server.alloc_run(&[8, 4, 8]).expect("alloc_run").expect("a run");
        for (view, bytes) in run.iter().zip([&b"abcdefgh"[..], b"ijkl", b"mnopqrst"]) {
            view.copy_from(bytes);
        }
        server.send(&ToStub::Execute { batch: 1, requests: vec![] }).expect("send");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Execute { batch: 1, .. })));
        let views: Vec<View> = run.iter().map(|v| stub.view(v.desc).expect("view")).collect();
        for pair in views.windows(2) {
            assert_eq!(pair[0].as_ptr().wrapping_add(pair[0].len()), pair[1].as_ptr(), "adjacent in the stub");
        }
        // SAFETY: the three blocks are adjacent in one mapping (checked above), 20 bytes in all.
        let joined = unsafe { std::slice::from_raw_parts(views[0].as_ptr(), 20) };
        assert_eq!(joined, b"abcdefghijklmnopqrst");
        for v in &views {
            stub.release(v.desc);
        }
        stub.send(&ToServer::ExecuteDone { batch: 1, error: None }).expect("done");
        assert_eq!(server.live_blocks(), 3);
        assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::ExecuteDone { .. })));
        assert_eq!(server.live_blocks(), 0);
        assert!(server.alloc_run(&[8, 0]).expect("a zero").is_none());
    }

    /// A plain (unsealable) file of `len` bytes, like a client's `/dev/shm` object.
    fn client_file(len: u64) -> OwnedFd {
        let file = tempfile_in_tmp();
        file.set_len(len).expect("set_len");
        OwnedFd::from(file)
    }

    fn tempfile_in_tmp() -> std::fs::File {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "tritium-region-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("create file");
        std::fs::remove_file(&path).expect("unlink");
        file
    }

    #[test]
    fn a_client_region_is_mapped_in_the_stub_and_never_freed_by_a_release() {
        let (server, stub) = pair();
        let fd = client_file(3 * 4096);
        // Offsets need not be page-aligned: the stub's view starts exactly at `offset`.
        nix::sys::uio::pwrite(&fd, b"region bytes", 100 + 7).expect("pwrite");
        let id = REGION_BIT | 3;
        assert!(server.add_region(1, std::os::fd::AsFd::as_fd(&fd), 0, 8).is_err(), "not a region id");
        server.add_region(id, std::os::fd::AsFd::as_fd(&fd), 100, 4096).expect("add");
        assert!(server.has_region(id));
        server.send(&ToStub::Ping { seq: 1 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
        let view = stub.view(Descriptor { segment: id, offset: 7, len: 12 }).expect("view");
        assert_eq!(view.to_vec(), b"region bytes");
        // Bounds are the registered range, not the file.
        assert!(stub.view(Descriptor { segment: id, offset: 4090, len: 7 }).is_err());
        // The stub writes an output straight into a region it got read-write.
        stub.view(Descriptor { segment: id, offset: 0, len: 3 }).expect("view").copy_from(b"out");
        let mut back = [0u8; 3];
        nix::sys::uio::pread(&fd, &mut back, 100).expect("pread");
        assert_eq!(&back, b"out");
        // A region sent as a read-only descriptor is mapped read-only: model code can read it,
        // never write it.
        let read_only = nix::fcntl::open(
            format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .expect("reopen");
        // SAFETY: `open` just returned this descriptor, and nothing else owns it.
        let read_only = unsafe { OwnedFd::from_raw_fd(read_only) };
        let ro_id = REGION_BIT | 4;
        server.add_region(ro_id, std::os::fd::AsFd::as_fd(&read_only), 100, 4096).expect("add");
        server.send(&ToStub::Ping { seq: 9 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 9 })));
        let ro_view = stub.view(Descriptor { segment: ro_id, offset: 0, len: 3 }).expect("view");
        assert_eq!(ro_view.to_vec(), b"out");
        let addr = ro_view.as_ptr() as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let perms = maps
            .lines()
            .find_map(|line| {
                let (range, rest) = line.split_once(' ')?;
                let (start, end) = range.split_once('-')?;
                let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
                (start <= addr && addr < end).then(|| rest[..4].to_string())
            })
            .expect("mapped");
        assert_eq!(perms, "r--s", "a read-only shared mapping");
        // A region block is not released (no arena owns it), and one a peer releases anyway is
        // ignored, not a protocol error.
        stub.release(view.desc);
        assert!(stub.pending_release.locked().is_empty());
        assert!(stub.free_own(view.desc).is_ok());
        stub.pending_release.locked().push(view.desc);
        stub.send(&ToServer::Pong { seq: 2 }).expect("pong");
        assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::Pong { seq: 2 })));
        // Removal unmaps it for new descriptors; the view taken before keeps its mapping.
        server.remove_region(id).expect("remove");
        assert!(!server.has_region(id));
        server.send(&ToStub::Ping { seq: 3 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 3 })));
        assert!(stub.view(Descriptor { segment: id, offset: 7, len: 12 }).is_err());
        assert_eq!(view.to_vec(), b"region bytes");
    }

    #[test]
    fn a_region_past_the_end_of_its_file_is_refused() {
        let fd = client_file(4096);
        let err = Segment::open_region(fd, 4000, 200).expect_err("past the end");
        assert!(err.to_string().contains("needs a file of 4200 bytes"), "{err}");
    }

    #[test]
    fn bad_descriptors_are_refused_not_followed() {
        let (server, stub) = pair();
        let block = stub.alloc(64).expect("alloc");
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        server.recv(T).expect("recv");
        assert!(server.view(block.desc).is_ok());
        let cases = [
            Descriptor { len: 3 << 20, ..block.desc },
            Descriptor { offset: u64::MAX - 1, ..block.desc },
            Descriptor { segment: 12345, ..block.desc },
        ];
        for bad in cases {
            assert!(matches!(server.view(bad), Err(IpcError::Protocol(_))), "{bad:?}");
        }
    }

    #[test]
    fn a_bogus_release_is_a_protocol_error() {
        let (server, stub) = pair();
        stub.release(Descriptor { segment: 1, offset: 4096, len: 8 });
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        assert!(matches!(server.recv(T), Err(IpcError::Protocol(_))));
    }

    #[test]
    fn a_peer_announcing_too_many_segments_is_refused() {
        let (server, stub) = pair_with(ChannelLimits { max_peer_segments: 2, ..ChannelLimits::default() });
        // Each block larger than the default segment gets a segment of its own.
        let _blocks: Vec<View> = (0..3).map(|_| stub.alloc(3 << 20).expect("alloc")).collect();
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        let err = server.recv(T).expect_err("third segment refused");
        assert!(err.to_string().contains("more than 2 segments"), "{err}");
    }

    #[test]
    fn a_peer_segment_over_the_size_or_mapped_limit_is_refused() {
        let (server, stub) = pair_with(ChannelLimits { max_peer_segment_bytes: 4 << 20, ..ChannelLimits::default() });
        let _big = stub.alloc(6 << 20).expect("alloc");
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        let err = server.recv(T).expect_err("too large");
        assert!(err.to_string().contains("the limit is 4194304 bytes"), "{err}");

        let (server, stub) = pair_with(ChannelLimits { max_peer_mapped_bytes: 5 << 20, ..ChannelLimits::default() });
        let _a = stub.alloc(1).expect("first segment, 2 MiB");
        let _b = stub.alloc(3 << 20).expect("second segment, 4 MiB");
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        let err = server.recv(T).expect_err("mapped bytes over the limit");
        assert!(err.to_string().contains("would reach 6291456 bytes"), "{err}");
    }

    #[test]
    fn an_arena_stops_growing_at_its_limit() {
        let (server, _stub) = pair_with(ChannelLimits { max_own_bytes: 4 << 20, ..ChannelLimits::default() });
        let _a = server.alloc(2 << 20).expect("first 2 MiB segment");
        let _b = server.alloc(2 << 20).expect("second 2 MiB segment");
        let err = server.alloc(1).expect_err("a third segment is over the limit");
        assert!(matches!(err, IpcError::OutOfMemory(..)), "{err}");
        assert!(err.to_string().contains("its limit is 4194304 bytes"), "{err}");
    }

    #[test]
    fn large_blocks_grow_and_retire_segments() {
        let (server, stub) = pair();
        let big = server.alloc(8 << 20).expect("big");
        assert!(server.own_shm_bytes() >= 8 << 20);
        // Large enough that both copies stream (`copy::STREAM_THRESHOLD`), and odd-sized.
        let bytes: Vec<u8> = (0..(8 << 20) - 5).map(|i: usize| (i % 253) as u8).collect();
        let block = server.view(Descriptor { len: bytes.len() as u64, ..big.desc }).expect("view");
        block.copy_from(&bytes);
        server.send(&ToStub::Ping { seq: 1 }).expect("send");
        stub.recv(T).expect("recv");
        let seen = stub.view(Descriptor { len: bytes.len() as u64, ..big.desc }).expect("stub maps the new segment");
        assert!(seen.to_vec() == bytes, "the stub reads exactly the bytes the server copied in");
        drop((block, seen));
        stub.view(big.desc).expect("stub maps the new segment");
        stub.release(big.desc);
        stub.send(&ToServer::InitializeDone(Err(StubError { message: "x".into(), code: 1, traceback: None })))
            .expect("send");
        server.recv(T).expect("recv");
        assert!(server.own_shm_bytes() < 8 << 20, "the oversized segment was retired");
        server.send(&ToStub::Ping { seq: 2 }).expect("send");
        stub.recv(T).expect("recv");
        assert!(stub.view(big.desc).is_err(), "the stub unmapped it too");
    }
}
