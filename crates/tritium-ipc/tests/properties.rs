//! Property tests over the channel's untrusted inputs: whatever a peer writes into shared memory
//! (ring headers, slot headers, payloads, descriptors), the receiving side returns a message or an
//! `IpcError`, and never panics, hangs or touches memory outside a mapping. The number of cases is
//! bounded (`PROPTEST_CASES` overrides it), so `.ci/run` runs them on every change.

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use proptest::prelude::*;
use tritium_ipc::segment::Segment;
use tritium_ipc::{
    ChannelConfig, Descriptor, IpcError, LogLevel, LogRecord, RingGeometry, ServerChannel, StubChannel, ToServer,
    ToStub, WaitPolicy,
};

const SHORT: Duration = Duration::from_millis(20);

/// A connected pair with small rings (so multi-slot messages and wrap-around happen often) and
/// a second mapping of the control segment for scribbling over it, as a broken peer would.
fn pair() -> (ServerChannel, StubChannel, Segment) {
    let config = ChannelConfig {
        geometry: RingGeometry { slot_size: 128, slot_count: 8 },
        arena_segment: 2 << 20,
        send_timeout: SHORT,
        wait: WaitPolicy { spin: Duration::ZERO, slice: Duration::from_millis(5) },
        ..ChannelConfig::default()
    };
    let (server, fds) = ServerChannel::create("prop", config).expect("create");
    let control_len = nix::sys::stat::fstat(fds.control.as_raw_fd()).expect("fstat").st_size as u64;
    let scribble = Segment::open(fds.control.as_fd().try_clone_to_owned().expect("dup"), control_len).expect("map");
    let stub = StubChannel::connect(fds.control, fds.socket, config.wait, 2 << 20).expect("connect");
    (server, stub, scribble)
}

fn log(message: String) -> ToServer {
    ToServer::Log(LogRecord { level: LogLevel::Info, logger: String::new(), file: "model.py".into(), line: 1, message })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Messages of any length up to the ring's capacity arrive whole and in order, across
    /// wrap-around of the free-running counters.
    #[test]
    fn messages_round_trip_in_order(lengths in proptest::collection::vec(0usize..900, 1..24)) {
        let (server, stub, _scribble) = pair();
        for (i, len) in lengths.iter().enumerate() {
            let text: String = std::iter::repeat_n(char::from(b'a' + (i % 26) as u8), *len).collect();
            match stub.send(&log(text.clone())) {
                Ok(()) => {}
                // Larger than the ring even when empty: refused up front, never half-sent.
                Err(IpcError::TooLarge { .. }) => continue,
                Err(e) => return Err(TestCaseError::fail(format!("send: {e}"))),
            }
            match server.recv(Duration::from_secs(2)) {
                Ok(Some(ToServer::Log(record))) => prop_assert_eq!(record.message, text),
                other => return Err(TestCaseError::fail(format!("recv: {other:?}"))),
            }
        }
    }

    /// Random bytes written anywhere in the ring area of the control segment (headers, slot
    /// headers, payloads) make `recv` return a message or an error, and never panic or hang.
    #[test]
    fn scribbled_rings_never_crash_the_receiver(
        sent in 0usize..6,
        writes in proptest::collection::vec((4096usize..8192 + 2 * 1024, any::<u64>()), 1..16),
    ) {
        let (server, stub, scribble) = pair();
        for i in 0..sent {
            let _ = stub.send(&log(format!("message {i} {}", "x".repeat(i * 40))));
        }
        for (offset, value) in writes {
            let offset = offset.min(scribble.len() as usize - 8);
            // SAFETY: offset + 8 <= mapping length; concurrent readers only ever copy bytes out.
            unsafe { (scribble.as_ptr().add(offset) as *mut u64).write_unaligned(value) };
        }
        for _ in 0..sent + 2 {
            match server.recv(SHORT) {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        // The sending side facing a scribbled ring also fails cleanly.
        let _ = server.send(&ToStub::Ping { seq: 1 });
        let _ = stub.recv(SHORT);
    }

    /// A descriptor resolves only when it lies inside a segment this side knows; everything else
    /// is a protocol error.
    #[test]
    fn descriptors_resolve_or_are_refused(
        segment in prop_oneof![Just(1u32 << 31 | 1), any::<u32>()],
        offset in prop_oneof![0u64..(4 << 20), any::<u64>()],
        len in prop_oneof![0u64..(4 << 20), any::<u64>()],
    ) {
        let (server, stub, _scribble) = pair();
        let block = stub.alloc(64).expect("alloc");
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        server.recv(Duration::from_secs(2)).expect("recv announcement");
        let known_len = block.segment().len();
        let desc = Descriptor { segment, offset, len };
        let inside = segment == block.desc.segment && offset.checked_add(len).is_some_and(|end| end <= known_len);
        match server.view(desc) {
            Ok(view) => {
                prop_assert!(inside, "{:?} resolved outside segment of {} bytes", desc, known_len);
                prop_assert_eq!(view.len() as u64, len);
            }
            Err(IpcError::Protocol(_)) => prop_assert!(!inside, "{:?} refused though inside", desc),
            Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
        }
    }

    /// Arbitrary bytes never decode into a panic: every message type either decodes or is an
    /// error.
    #[test]
    fn arbitrary_bytes_decode_or_fail(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = postcard::from_bytes::<ToServer>(&bytes);
        let _ = postcard::from_bytes::<ToStub>(&bytes);
    }
}
