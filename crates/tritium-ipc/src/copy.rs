//! Copying tensor bytes into memory another process reads next (arena blocks, clients' shared
//! memory regions).
//!
//! A large copy with ordinary stores first reads every destination line into this core's caches
//! (read for ownership) and then leaves them there, evicting what the copying process needs, for
//! a reader on another core or in another process that fetches them again anyway. Non-temporal
//! (streaming) stores write whole lines to memory without reading them. glibc's `memcpy` makes
//! the same choice above `glibc.cpu.x86_non_temporal_threshold`, but derives that threshold
//! from the cache sizes CPUID reports, and virtual machines report odd ones: on the 2-CPU VMs
//! tritium is developed on it came out at 240 MiB, so a 4 MiB output never streamed, and
//! `cargo xtask bench shm` (two 4 MiB outputs copied into the client's region per request) ran
//! at 890-990 requests/s with glibc's choice and 1,450-1,650 with streaming stores. So copies of
//! at least [`STREAM_THRESHOLD`] bytes stream here, whatever the CPU reports.
//!
//! Below it the reader is better served by the caches: streamed bytes must come back from
//! memory. Timed on that VM (a copy between buffers rotated over four, so as hot as a pipeline's
//! are): 1 MiB took 38 us either way, 2 MiB 133 us with glibc and 80 us streamed, 4 MiB 540 and
//! 215 us; and `cargo xtask bench ipc`'s 1 MiB execute round trip (the stub copies its output into
//! its arena and the server reads it) took 93-115 us with a 1 MiB threshold and 43-62 us with
//! 2 MiB.

/// Copies of at least this many bytes use non-temporal stores (on x86_64).
pub const STREAM_THRESHOLD: usize = 2 << 20;

/// Copies `src` into `dst` (of the same length), streaming when the copy is large.
///
/// # Panics
/// When the lengths differ.
pub fn copy_for_peer(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_for_peer: lengths differ");
    // SAFETY: both slices are valid for their (equal) length and cannot overlap (one is `&mut`).
    unsafe { copy_for_peer_raw(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// [`copy_for_peer`] on raw pointers, for memory no slice can describe (a peer's mapping).
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the two ranges must not
/// overlap.
pub unsafe fn copy_for_peer_raw(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAM_THRESHOLD {
        // SAFETY: guaranteed by the caller.
        unsafe { stream_copy(src, dst, len) };
        return;
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Ordinary copies up to the first 16-byte aligned destination address, 64 bytes per step with
/// SSE2 streaming stores (every x86_64 CPU has SSE2), an ordinary copy of the rest, and a store
/// fence, so that the bytes are visible to other cores before whatever the caller publishes next
/// (the ring's release store of the message that names them).
///
/// # Safety
/// As [`copy_for_peer_raw`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = dst.align_offset(16).min(len);
    // SAFETY: within the ranges the caller vouches for.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut off = head;
    while len - off >= 64 {
        // SAFETY: `off + 64 <= len`; the loads are unaligned, the stores go to a 16-byte aligned
        // address (`dst + head` is aligned and `off - head` is a multiple of 64).
        unsafe {
            let s = src.add(off) as *const __m128i;
            let d = dst.add(off) as *mut __m128i;
            let (a, b, c, e) =
                (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)), _mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        off += 64;
    }
    // SAFETY: the rest of the ranges; the fence orders the streaming stores before later ones.
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 31 + seed * 7) % 251) as u8).collect()
    }

    #[test]
    fn every_length_and_alignment_copies_exactly_its_bytes() {
        // Around the threshold (streamed and not), with every destination misalignment, and
        // lengths that leave a tail shorter than one 64-byte step.
        for len in [0, 1, 63, 4096, STREAM_THRESHOLD - 1, STREAM_THRESHOLD, STREAM_THRESHOLD + 77] {
            for shift in [0usize, 1, 7, 15, 16, 33] {
                let src = pattern(len + 3, len + shift);
                let mut dst = vec![0xAAu8; len + shift + 8];
                copy_for_peer(&mut dst[shift..shift + len], &src[3..3 + len]);
                assert!(
                    dst[..shift].iter().all(|&b| b == 0xAA),
                    "bytes before the destination, len {len} shift {shift}"
                );
                assert_eq!(&dst[shift..shift + len], &src[3..3 + len], "len {len} shift {shift}");
                assert!(
                    dst[shift + len..].iter().all(|&b| b == 0xAA),
                    "bytes after the destination, len {len} shift {shift}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn different_lengths_are_refused() {
        copy_for_peer(&mut [0u8; 4], &[1u8; 5]);
    }
}
