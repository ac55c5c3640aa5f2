//! Messages over the rings: sending (waking the peer or not, or only if nothing needs waiting),
//! receiving with control frames handled on the way, the doorbell an event loop waits on, and the
//! peer's blocks released in `Release` frames that never make a receive wait for room.

use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tritium_sync::Locked;

use super::{Channel, Rx, Tx};
use crate::error::IpcError;
use crate::protocol::Control;
use crate::ring::{FRAME_APP, FRAME_CONTROL};

/// Descriptors in one `Release` frame: a few slots each, well inside the ring.
const RELEASES_PER_FRAME: usize = 512;

impl<S: Serialize, R: DeserializeOwned> Channel<S, R> {
    /// Sends one message, waking the peer if it sleeps. Pending releases go first.
    pub fn send(&self, msg: &S) -> Result<(), IpcError> {
        self.send_waking(msg, true)
    }

    /// Sends one message without waking the peer: it reads it with the next message sent by
    /// [`Self::send`] (or when it next looks). For messages the peer has no use for before a
    /// later one, such as a batch's responses ahead of its `ExecuteDone`: the peer then wakes
    /// once for the batch instead of once per message.
    pub fn send_lazy(&self, msg: &S) -> Result<(), IpcError> {
        self.send_waking(msg, false)
    }

    fn send_waking(&self, msg: &S, wake: bool) -> Result<(), IpcError> {
        let mut tx = self.tx.locked();
        self.flush_releases_locked(&mut tx)?;
        let Tx { producer, buf } = &mut *tx;
        buf.clear();
        postcard::to_io(msg, &mut *buf).map_err(|e| IpcError::Protocol(format!("encoding a message: {e}")))?;
        producer.send(FRAME_APP, buf, wake, self.config.send_timeout)
    }

    /// Sends one message only if that needs no waiting: false when another thread of this side
    /// is sending or the ring has no room for it now (a peer that does not read). For requests
    /// that must never hold up their sender (a `/metrics` scrape, an event loop). A message
    /// larger than the whole ring is `IpcError::TooLarge`, as with [`Self::send`].
    pub fn try_send(&self, msg: &S) -> Result<bool, IpcError> {
        let mut tx = match self.tx.try_lock() {
            Ok(tx) => tx,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
        };
        let Tx { producer, buf } = &mut *tx;
        buf.clear();
        postcard::to_io(msg, &mut *buf).map_err(|e| IpcError::Protocol(format!("encoding a message: {e}")))?;
        let need = producer.slots_for(buf.len());
        // A message that could never fit goes on to `send`, which refuses it.
        if need <= producer.slot_count() && producer.free_slots() < need {
            return Ok(false);
        }
        producer.send(FRAME_APP, buf, true, Duration::ZERO)?;
        Ok(true)
    }

    pub(super) fn send_control_locked(&self, tx: &mut Tx, msg: &Control, wake: bool) -> Result<(), IpcError> {
        let Tx { producer, buf } = tx;
        buf.clear();
        postcard::to_io(msg, &mut *buf).map_err(|e| IpcError::Protocol(format!("encoding a control frame: {e}")))?;
        producer.send(FRAME_CONTROL, buf, wake, self.config.send_timeout)
    }

    fn flush_releases_locked(&self, tx: &mut Tx) -> Result<(), IpcError> {
        let pending = std::mem::take(&mut *self.pending_release.locked());
        if pending.is_empty() {
            return Ok(());
        }
        // Keep each frame well inside the ring.
        for chunk in pending.chunks(RELEASES_PER_FRAME) {
            self.send_control_locked(tx, &Control::Release(chunk.to_vec()), false)?;
        }
        Ok(())
    }

    /// Sends pending releases only while they fit in the ring now with half of it left free,
    /// never waiting for room; the rest stay pending. On the receive path the peer may not read
    /// for a long time (a stub's main thread in `execute` sending many responses, each of whose
    /// output blocks this side releases): waiting for room there, while the peer waits for this
    /// side to read its full ring, would deadlock both.
    fn flush_releases_with_room(&self, tx: &mut Tx) -> Result<(), IpcError> {
        let mut pending = std::mem::take(&mut *self.pending_release.locked());
        let reserve = tx.producer.slot_count() / 2;
        while !pending.is_empty() {
            let n = pending.len().min(RELEASES_PER_FRAME);
            let frame = Control::Release(pending[pending.len() - n..].to_vec());
            let Tx { producer, buf } = &mut *tx;
            buf.clear();
            postcard::to_io(&frame, &mut *buf)
                .map_err(|e| IpcError::Protocol(format!("encoding a control frame: {e}")))?;
            if producer.free_slots() < producer.slots_for(buf.len()).saturating_add(reserve) {
                break;
            }
            producer.send(FRAME_CONTROL, buf, false, self.config.send_timeout)?;
            pending.truncate(pending.len() - n);
        }
        if !pending.is_empty() {
            self.pending_release.locked().extend(pending);
        }
        Ok(())
    }

    /// Sends pending releases now (lazily: the peer picks them up when it next wakes).
    pub fn flush_releases(&self) -> Result<(), IpcError> {
        let mut tx = self.tx.locked();
        self.flush_releases_locked(&mut tx)
    }

    /// Sends pending releases unless another thread is sending: a sender waiting for room
    /// holds the producer until the peer reads, and the peer may itself be waiting for this side
    /// to read. Waiting here for that sender would deadlock both; its next send (or this side's
    /// next receive) takes the releases along instead. For the same reason only what fits now
    /// goes ([`Self::flush_releases_with_room`]).
    fn try_flush_releases(&self) -> Result<(), IpcError> {
        let mut tx = match self.tx.try_lock() {
            Ok(tx) => tx,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
        };
        self.flush_releases_with_room(&mut tx)
    }

    /// Receives the next application message, handling control frames on the way. Returns
    /// `Ok(None)` if nothing arrived within `timeout`. Never waits for a sender of this side.
    pub fn recv(&self, timeout: Duration) -> Result<Option<R>, IpcError> {
        self.try_flush_releases()?;
        let started = Instant::now();
        let deadline = started + timeout;
        let mut rx = self.rx.locked();
        // Whether this wait spins depends on how long the last wait for an application message
        // took, not on the control frames taken on the way: the peer's releases come right after
        // each answer, and counting them made a model that gets a request every few milliseconds
        // spin its whole budget after each one.
        let hot = rx.consumer.hot();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Rx { consumer, buf } = &mut *rx;
            consumer.set_hot(hot);
            let kind = match consumer.recv(buf, left) {
                Ok(kind) => kind,
                Err(IpcError::Timeout(_)) => return Ok(None),
                Err(e) => return Err(e),
            };
            if let Some(msg) = self.frame(kind, buf)? {
                let within = started.elapsed() <= consumer.spin_budget();
                consumer.set_hot(within);
                return Ok(Some(msg));
            }
        }
    }

    /// Receives the next application message if one is there now, handling control frames on
    /// the way; never waits or spins (for an event loop, with [`Channel::arm_doorbell`]).
    pub fn try_recv(&self) -> Result<Option<R>, IpcError> {
        self.try_flush_releases()?;
        let mut rx = self.rx.locked();
        loop {
            let Rx { consumer, buf } = &mut *rx;
            let Some(kind) = consumer.try_recv(buf)? else { return Ok(None) };
            if let Some(msg) = self.frame(kind, buf)? {
                return Ok(Some(msg));
            }
        }
    }

    /// Asks the peer to ring this side's doorbell when it next sends (or closes its ring), for a
    /// receiver about to wait on the doorbell's eventfd instead of in [`Channel::recv`]. False
    /// when something is there already (the request is withdrawn): receive it first.
    pub fn arm_doorbell(&self) -> bool {
        self.rx.locked().consumer.arm_doorbell()
    }

    /// Whether a message (or the peer's close) is there to receive now, without taking it.
    pub fn ready(&self) -> bool {
        self.rx.locked().consumer.ready()
    }

    /// Withdraws [`Channel::arm_doorbell`]'s request once the receiver is awake.
    pub fn disarm_doorbell(&self) {
        self.rx.locked().consumer.disarm_doorbell()
    }

    /// An application message out of a received frame; `None` for a control frame, handled here.
    fn frame(&self, kind: u16, buf: &[u8]) -> Result<Option<R>, IpcError> {
        match kind {
            FRAME_APP => {
                postcard::from_bytes(buf).map(Some).map_err(|e| IpcError::Protocol(format!("undecodable message: {e}")))
            }
            FRAME_CONTROL => {
                let ctl: Control = postcard::from_bytes(buf)
                    .map_err(|e| IpcError::Protocol(format!("undecodable control frame: {e}")))?;
                self.handle_control(ctl)?;
                Ok(None)
            }
            other => Err(IpcError::Protocol(format!("unknown frame kind {other}"))),
        }
    }

    /// Closes this end's sending ring, waking the peer.
    pub fn close(&self) {
        self.tx.locked().producer.close();
    }

    /// True when the peer closed its ring and everything it sent has been received.
    pub fn peer_closed(&self) -> bool {
        self.rx.locked().consumer.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::channel::testing::{pair, T};
    use crate::channel::{ChannelConfig, ServerChannel, StubChannel};
    use crate::protocol::{Request, ToServer, ToStub};
    use crate::ring::WaitPolicy;

    #[test]
    fn messages_and_tensor_bytes_cross_in_both_directions() {
        let (server, stub) = pair();
        assert_eq!(server.stub_pid(), std::process::id());
        let block = server.alloc(5).expect("alloc");
        block.copy_from(b"hello");
        server
            .send(&ToStub::Execute { batch: 1, requests: vec![Request { id: 7, ..Default::default() }] })
            .expect("send");
        // The segment announcement travels ahead of the message, so the stub can resolve the block.
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Execute { batch: 1, .. })));
        assert_eq!(stub.view(block.desc).expect("view").to_vec(), b"hello");
        stub.release(block.desc);
        stub.send(&ToServer::ExecuteDone { batch: 1, error: None }).expect("done");
        assert_eq!(server.live_blocks(), 1);
        assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::ExecuteDone { batch: 1, error: None })));
        assert_eq!(server.live_blocks(), 0, "the release arrived before the message");
    }

    #[test]
    fn only_the_wait_for_messages_decides_whether_a_receiver_spins() {
        // A model that gets a request every few milliseconds: after each answer the server's
        // releases reach the stub at once, and the next request comes much later than the spin
        // budget. The release must not make the stub spin through its budget waiting for it.
        let policy = WaitPolicy { spin: Duration::from_millis(20), slice: Duration::from_millis(100) };
        let config = ChannelConfig { arena_segment: 2 << 20, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, policy, 2 << 20).expect("connect");
        let ping_after = |gap: Duration| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(gap);
                    server.send(&ToStub::Ping { seq: 1 }).expect("ping");
                });
                assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
            });
        };
        let spun = || stub.rx.locked().consumer.spun;

        // A wait longer than the budget leaves the stub cold.
        ping_after(Duration::from_millis(60));
        // An answer's block, read by the server, whose release the server sends at its next
        // receive: it is in the stub's ring before the stub waits.
        let block = stub.alloc(64).expect("alloc");
        stub.send(&ToServer::Pong { seq: 1 }).expect("pong");
        assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::Pong { seq: 1 })));
        server.release(block.desc);
        assert!(server.recv(Duration::from_millis(1)).expect("flush").is_none());
        let before = spun();
        ping_after(Duration::from_millis(60));
        assert_eq!(stub.live_blocks(), 0, "the release was taken on the way");
        assert_eq!(spun(), before, "a release taken at once made the wait for the next message spin");

        // A message that was there at once makes the next wait spin.
        server.send(&ToStub::Ping { seq: 1 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
        ping_after(Duration::from_millis(200));
        assert_eq!(spun(), before + 1, "a hot receiver waited without spinning");
    }

    #[test]
    fn a_receive_that_only_looks_leaves_the_next_wait_spinning() {
        // The stub's heartbeat thread pumps the ring with a zero timeout while the model runs.
        // Finding nothing there says nothing about how soon the next request comes, so the main
        // loop's next wait must still spin.
        let policy = WaitPolicy { spin: Duration::from_millis(20), slice: Duration::from_millis(100) };
        let config = ChannelConfig { arena_segment: 2 << 20, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, policy, 2 << 20).expect("connect");
        let spun = || stub.rx.locked().consumer.spun;
        // A message that was there at once: the receiver is hot.
        server.send(&ToStub::Ping { seq: 1 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
        // The heartbeat's look at an empty ring.
        assert!(stub.recv(Duration::ZERO).expect("poll").is_none());
        let before = spun();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                server.send(&ToStub::Ping { seq: 2 }).expect("ping");
            });
            assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 2 })));
        });
        assert_eq!(spun(), before + 1, "a zero-timeout receive made the next wait skip its spin");
    }

    #[test]
    fn a_receive_does_not_wait_for_a_sender_waiting_for_room() {
        // A model thread fills the stub's ring and waits for room while the stub's main thread,
        // with releases pending, receives: the receive must not wait for that thread, because
        // the server may be waiting (to send its own frames) for the stub to read.
        let (server, stub) = pair();
        let stub = Arc::new(stub);
        let block = server.alloc(8).expect("alloc");
        server.send(&ToStub::Ping { seq: 0 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 0 })));
        let slots = ChannelConfig::default().geometry.slot_count as u64;
        for seq in 0..slots {
            stub.send(&ToServer::Pong { seq }).expect("room for one slot each");
        }
        let sender = {
            let stub = stub.clone();
            std::thread::spawn(move || stub.send(&ToServer::Pong { seq: slots }))
        };
        std::thread::sleep(Duration::from_millis(100));
        stub.release(block.desc);
        let started = Instant::now();
        assert!(stub.recv(Duration::from_millis(50)).expect("recv").is_none());
        assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
        // The server reads: the waiting sender goes on, and the release left pending goes with
        // the stub's next receive.
        for seq in 0..=slots {
            assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::Pong { seq: s }) if s == seq));
        }
        sender.join().expect("sender thread").expect("sent");
        assert_eq!(server.live_blocks(), 1);
        assert!(stub.recv(Duration::ZERO).expect("recv").is_none());
        assert!(server.recv(Duration::from_millis(50)).expect("recv").is_none());
        assert_eq!(server.live_blocks(), 0);
    }

    #[test]
    fn a_receive_never_waits_for_room_to_send_releases() {
        // A stub sends many responses from `execute` without reading: the server receives each
        // and releases its block. Releases must not fill the server's ring and block the
        // receive, or the server stops reading while the stub waits for it to.
        let (server, stub) = pair();
        let slots = ChannelConfig::default().geometry.slot_count as u64;
        for seq in 0..4 * slots {
            let block = stub.alloc(4).expect("alloc");
            stub.send(&ToServer::Pong { seq }).expect("room: the server reads as we go");
            let started = Instant::now();
            assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::Pong { seq: s }) if s == seq));
            assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
            server.release(block.desc);
        }
        assert_eq!(stub.live_blocks(), 4 * slots as usize);
        // The stub reads: the releases (batched in few frames) free its blocks.
        server.send(&ToStub::Ping { seq: 1 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
        assert_eq!(stub.live_blocks(), 0);
    }

    #[test]
    fn the_stub_rings_the_doorbell_only_while_the_server_waits_for_it() {
        let (server, stub) = pair();
        let bell = server.doorbell().expect("the server has a doorbell").clone();
        assert!(matches!(server.try_recv(), Ok(None)), "nothing sent yet");
        // Not armed: a send wakes nobody through the doorbell.
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        assert!(!bell.clear(), "rung without being armed");
        assert!(!server.arm_doorbell(), "a message is waiting: arming refuses");
        assert!(matches!(server.try_recv(), Ok(Some(ToServer::Pong { seq: 1 }))));
        // Armed: the next waking send rings it, a lazy one does not.
        assert!(server.arm_doorbell(), "the ring is empty");
        stub.send_lazy(&ToServer::Pong { seq: 2 }).expect("lazy send");
        assert!(!bell.clear(), "a lazy send rang the doorbell");
        stub.send(&ToServer::Pong { seq: 3 }).expect("send");
        assert!(bell.clear(), "a waking send to an armed server rings the doorbell");
        server.disarm_doorbell();
        assert!(matches!(server.try_recv(), Ok(Some(ToServer::Pong { seq: 2 }))));
        assert!(matches!(server.try_recv(), Ok(Some(ToServer::Pong { seq: 3 }))));
        assert!(matches!(server.try_recv(), Ok(None)));
        // The stub closing its ring, and the interrupter, ring it too.
        assert!(server.arm_doorbell());
        stub.close();
        assert!(bell.clear(), "closing rings an armed doorbell");
        assert!(matches!(server.try_recv(), Err(IpcError::Closed)), "empty and closed");
        server.interrupter().interrupt();
        assert!(bell.clear(), "the interrupter rings the doorbell");
    }

    #[test]
    fn try_send_refuses_what_could_never_fit_and_waits_for_nothing() {
        let (server, stub) = pair();
        assert!(server.try_send(&ToStub::Ping { seq: 0 }).expect("room"), "a small message goes");
        let big = ToServer::Log(crate::protocol::LogRecord {
            level: crate::protocol::LogLevel::Info,
            logger: String::new(),
            file: String::new(),
            line: 0,
            message: "x".repeat(1 << 20),
        });
        let err = stub.try_send(&big).expect_err("larger than the ring");
        assert!(matches!(err, IpcError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn close_wakes_the_peer() {
        let (server, stub) = pair();
        let t = std::thread::spawn(move || stub.recv(Duration::from_secs(30)).map(|m| m.is_some()));
        std::thread::sleep(Duration::from_millis(50));
        server.close();
        assert!(matches!(t.join().expect("thread"), Err(IpcError::Closed)));
    }
}
