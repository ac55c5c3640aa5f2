//! The stub's router, without Python: it routes the server's replies and BLS responses to the
//! threads waiting for them, records cancellations and credits, keeps other messages for the
//! main loop, and paces the heartbeat thread's pumping.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tritium_ipc::{CallOp, CallResult, Descriptor, IpcError, Response, StubChannel, TensorData, ToServer, ToStub};
use tritium_sync::Locked;

/// Routes the server's replies and BLS responses to the threads waiting for them, and records
/// cancellations. Whoever holds `receiving` pumps the ring: the main loop in `recv`, a thread
/// waiting for its reply, or the heartbeat thread (which only tries the lock and never waits for
/// a message). Other messages are kept for the main loop.
#[derive(Default)]
pub(crate) struct Router {
    pub(crate) receiving: Mutex<()>,
    pub(crate) pending: Mutex<VecDeque<ToStub>>,
    pub(crate) replies: Mutex<HashMap<u64, Result<CallResult, String>>>,
    /// The responses of each BLS call in flight, not yet taken.
    pub(crate) bls: Mutex<HashMap<u64, VecDeque<Response>>>,
    /// The requests between their `Execute` and their end, with their cancellation and credit.
    pub(crate) requests: Mutex<Requests>,
    /// The client shared memory regions (system shared memory) each request uses, by request id,
    /// from its `Execute` until its final response; requests that use none are not listed.
    pub(crate) client_regions: Mutex<HashMap<u64, ClientRegions>>,
    /// A decoupled request's window ([`tritium_ipc::Initialize::max_inflight_responses`]; 0: none).
    pub(crate) window: AtomicU64,
    /// Bumped (and `woken` notified) whenever a reply or a BLS response arrives.
    pub(crate) generation: Mutex<u64>,
    pub(crate) woken: Condvar,
    pub(crate) next_call: AtomicU64,
    /// Metrics requests (`CollectMetrics` seqs) for the Python thread that answers them.
    pub(crate) metrics: Mutex<VecDeque<u64>>,
    pub(crate) metrics_asked: Condvar,
    /// The heartbeat thread sleeps its long beat (another thread was receiving, so nothing
    /// needed pumping); whoever stops receiving wakes it ([`Router::quicken_beat`]).
    pub(crate) beat_slow: AtomicBool,
    /// Messages handed to the main loop so far ([`Router::next`]): the heartbeat thread takes
    /// its long beat only when none came during its last one, so a busy stub's main thread
    /// does not wake it on every request.
    pub(crate) handed: AtomicU64,
    pub(crate) beat_lock: Mutex<()>,
    pub(crate) beat_woken: Condvar,
}

/// Most metrics requests kept for the answering thread; older ones are dropped (the server
/// has stopped waiting for them).
pub(crate) const METRICS_QUEUE: usize = 4;

/// What the server told the stub about one request: whether its client went away, and how
/// many of its responses the client has taken.
#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct Tracked {
    pub(crate) cancelled: bool,
    pub(crate) consumed: u64,
}

/// The requests the stub is serving, from the `Execute` that brings them until they end (the
/// final response sent, or the `execute` of a model that is not decoupled returned), so a
/// cancellation or credit that arrives after the end is dropped instead of kept for ever.
#[derive(Default, Debug)]
pub(crate) struct Requests(HashMap<u64, Tracked>);

impl Requests {
    pub(crate) fn open(&mut self, request: u64) {
        self.0.entry(request).or_default();
    }

    pub(crate) fn cancel(&mut self, request: u64) {
        if let Some(t) = self.0.get_mut(&request) {
            t.cancelled = true;
        }
    }

    pub(crate) fn credit(&mut self, request: u64, consumed: u64) {
        if let Some(t) = self.0.get_mut(&request) {
            t.consumed = t.consumed.max(consumed);
        }
    }

    pub(crate) fn end(&mut self, request: u64) {
        self.0.remove(&request);
    }

    /// How many requests are open.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_cancelled(&self, request: u64) -> bool {
        self.0.get(&request).is_some_and(|t| t.cancelled)
    }

    /// Whether the response after the first `sent` may go now: the request's client has taken
    /// enough of them, or went away (its responses are dropped by the server as they come), or
    /// the request is not tracked (a protocol error the server reports), or there is no window.
    /// The window grows from [`tritium_ipc::INITIAL_WINDOW`] as the client takes responses
    /// ([`tritium_ipc::window_now`]).
    pub(crate) fn has_room(&self, request: u64, sent: u64, window: u64) -> bool {
        match self.0.get(&request) {
            Some(t) if window > 0 && !t.cancelled => {
                sent < t.consumed.saturating_add(tritium_ipc::window_now(window, t.consumed))
            }
            _ => true,
        }
    }
}

/// What one request has in clients' shared memory regions.
#[derive(Clone, Default)]
pub(crate) struct ClientRegions {
    /// Outputs to write straight into a region, by name.
    pub(crate) outputs: Vec<(String, Descriptor)>,
    /// The regions its inputs lie in.
    pub(crate) inputs: Vec<u32>,
}

impl ClientRegions {
    /// The ids of every region the request reads or writes.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.inputs.iter().copied().chain(self.outputs.iter().map(|(_, d)| d.segment))
    }
}

/// How long a call waits for the server's reply.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Most messages the heartbeat thread takes off the ring per beat.
pub(crate) const PUMP_CHUNK: usize = 64;
/// The heartbeat thread's pace while nobody else receives (model code runs): it pumps the ring,
/// so a cancellation or a credit is seen within this.
pub(crate) const BEAT: Duration = Duration::from_millis(20);
/// Its pace while another thread receives (an idle stub waits for its next request): it only
/// beats, well within the shortest heartbeat timeout (1 s), and an idle stub wakes up a few times
/// a second instead of fifty.
pub(crate) const IDLE_BEAT: Duration = Duration::from_millis(250);

impl Router {
    pub(crate) fn wake(&self) {
        *self.generation.locked() += 1;
        self.woken.notify_all();
    }

    pub(crate) fn deliver(&self, call: u64, result: Result<CallResult, String>) {
        self.replies.locked().insert(call, result);
        self.wake();
    }

    /// Takes what the router handles itself (replies, BLS responses, cancellations) and hands
    /// back anything else, for the main loop.
    pub(crate) fn dispatch(&self, channel: &StubChannel, msg: ToStub) -> Option<ToStub> {
        match msg {
            ToStub::Reply { call, result } => self.deliver(call, result),
            ToStub::BlsResponse { call, response } => {
                let mut bls = self.bls.locked();
                match bls.get_mut(&call) {
                    Some(queue) => {
                        queue.push_back(response);
                        drop(bls);
                        self.wake();
                    }
                    // Nobody waits for this call any more: its outputs go back at once.
                    None => release_outputs(channel, &response),
                }
            }
            ToStub::Cancel { request } => {
                self.requests.locked().cancel(request);
                // A send waiting for room stops waiting.
                self.wake();
            }
            ToStub::Credit { request, consumed } => {
                self.requests.locked().credit(request, consumed);
                self.wake();
            }
            ToStub::Execute { batch, requests } => {
                let mut tracked = self.requests.locked();
                for r in &requests {
                    tracked.open(r.id);
                }
                let mut regions = self.client_regions.locked();
                for r in &requests {
                    let inputs: Vec<u32> = r
                        .inputs
                        .iter()
                        .filter_map(|t| match &t.data {
                            TensorData::Shm { desc, .. } if desc.in_client_region() => Some(desc.segment),
                            _ => None,
                        })
                        .collect();
                    if !inputs.is_empty() || !r.output_regions.is_empty() {
                        regions.insert(r.id, ClientRegions { outputs: r.output_regions.clone(), inputs });
                    }
                }
                return Some(ToStub::Execute { batch, requests });
            }
            ToStub::CollectMetrics { seq } => {
                let mut queue = self.metrics.locked();
                if queue.len() >= METRICS_QUEUE {
                    queue.pop_front();
                }
                queue.push_back(seq);
                self.metrics_asked.notify_all();
            }
            ToStub::Initialize(init) => {
                self.window.store(u64::from(init.max_inflight_responses), Ordering::Release);
                return Some(ToStub::Initialize(init));
            }
            other => return Some(other),
        }
        None
    }

    /// Takes what is on the ring without waiting, unless another thread is receiving (false then).
    pub(crate) fn pump(&self, channel: &StubChannel) -> Result<bool, IpcError> {
        let Ok(_receiving) = self.receiving.try_lock() else { return Ok(false) };
        for _ in 0..PUMP_CHUNK {
            match channel.recv(Duration::ZERO)? {
                Some(m) => {
                    if let Some(m) = self.dispatch(channel, m) {
                        self.pending.locked().push_back(m);
                    }
                }
                None => break,
            }
        }
        Ok(true)
    }

    /// The heartbeat thread's sleep between beats: [`BEAT`] while it pumped the ring or while
    /// the main loop has been taking messages since the last beat (`seen`: [`Router::handed`]
    /// then); while another thread was receiving and nothing came, [`IDLE_BEAT`] or until
    /// [`Router::quicken_beat`].
    ///
    /// Only an idle stub takes the long beat, so only its first request after an idle spell
    /// wakes the heartbeat thread. A stub that executes request after request keeps the short
    /// one, which needs no waking: when its main thread went back to model code after every
    /// request to find the heartbeat thread in its long beat, it woke it every time (a futex
    /// wake and a context switch per request, and the woken thread's pump then held the receive
    /// lock the main thread was coming back for).
    pub(crate) fn sleep_between_beats(&self, pumped: bool, seen: &mut u64) {
        let handed = self.handed.load(Ordering::Relaxed);
        let busy = std::mem::replace(seen, handed) != handed;
        if pumped || busy {
            std::thread::sleep(BEAT);
            return;
        }
        let lock = self.beat_lock.locked();
        self.beat_slow.store(true, Ordering::Release);
        let (_lock, _) = self
            .beat_woken
            .wait_timeout_while(lock, IDLE_BEAT, |_| self.beat_slow.load(Ordering::Acquire))
            .unwrap_or_else(|p| p.into_inner());
        self.beat_slow.store(false, Ordering::Release);
    }

    /// Called by a receiver going back to model code: a heartbeat thread asleep for its long
    /// beat returns to pumping at once (one load when it is not).
    pub(crate) fn quicken_beat(&self) {
        if self.beat_slow.load(Ordering::Acquire) && self.beat_slow.swap(false, Ordering::AcqRel) {
            let _lock = self.beat_lock.locked();
            self.beat_woken.notify_one();
        }
    }

    /// Waits until `done` holds or `deadline` passes (false then), pumping the ring when no
    /// other thread does.
    pub(crate) fn wait_until(
        &self,
        channel: &StubChannel,
        deadline: Option<Instant>,
        mut done: impl FnMut() -> bool,
    ) -> Result<bool, IpcError> {
        loop {
            if done() {
                self.quicken_beat();
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.quicken_beat();
                return Ok(false);
            }
            match self.receiving.try_lock() {
                Ok(_receiving) => {
                    if let Some(m) = channel.recv(Duration::from_millis(10))? {
                        if let Some(m) = self.dispatch(channel, m) {
                            self.pending.locked().push_back(m);
                        }
                    }
                }
                Err(_) => {
                    let generation = self.generation.locked();
                    if !done() {
                        let _ = self.woken.wait_timeout(generation, Duration::from_millis(10));
                    }
                }
            }
        }
    }

    /// The main loop takes a message back to model code: counted for the heartbeat thread's pace,
    /// which resumes pumping if it slept its long beat.
    fn hand_over(&self) {
        self.handed.fetch_add(1, Ordering::Relaxed);
        self.quicken_beat();
    }

    /// The next message for the main loop, or None after `timeout`.
    pub(crate) fn next(&self, channel: &StubChannel, timeout: Duration) -> Result<Option<ToStub>, IpcError> {
        let deadline = Instant::now() + timeout;
        let _receiving = self.receiving.locked();
        loop {
            if let Some(m) = self.pending.locked().pop_front() {
                self.hand_over();
                return Ok(Some(m));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match channel.recv(left)? {
                Some(m) => {
                    if let Some(m) = self.dispatch(channel, m) {
                        self.hand_over();
                        return Ok(Some(m));
                    }
                }
                None => return Ok(None),
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// Sends a call and waits for its reply, at most [`CALL_TIMEOUT`] (for ever for a model
    /// load, which takes as long as the model's `initialize`).
    pub(crate) fn call(&self, channel: &StubChannel, op: CallOp) -> Result<CallResult, String> {
        let id = self.new_call();
        let patient = matches!(op, CallOp::ModelLoad { .. });
        channel.send(&ToServer::Call { call: id, op }).map_err(|e| e.to_string())?;
        let deadline = (!patient).then(|| Instant::now() + CALL_TIMEOUT);
        let mut reply = None;
        let done = self
            .wait_until(channel, deadline, || {
                reply = self.replies.locked().remove(&id);
                reply.is_some()
            })
            .map_err(|e| e.to_string())?;
        match reply {
            Some(r) if done => r,
            _ => Err(format!("the server did not answer within {CALL_TIMEOUT:?}")),
        }
    }

    /// A new call id (BLS calls and server calls share the numbering).
    pub(crate) fn new_call(&self) -> u64 {
        self.next_call.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Stops routing a BLS call's responses: those queued and any that come later are released.
    pub(crate) fn forget(&self, channel: &StubChannel, call: u64) {
        let queued = self.bls.locked().remove(&call);
        for r in queued.into_iter().flatten() {
            release_outputs(channel, &r);
        }
    }
}

/// Hands the server's output blocks of a BLS response back to it.
pub(crate) fn release_outputs(channel: &StubChannel, response: &Response) {
    for t in &response.outputs {
        if let TensorData::Shm { desc, .. } = t.data {
            channel.release(desc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tritium_ipc::{ChannelConfig, Request, ServerChannel, WaitPolicy};

    const T: Duration = Duration::from_secs(5);

    fn pair() -> (ServerChannel, Arc<StubChannel>) {
        let config = ChannelConfig { arena_segment: 2 << 20, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("router-test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, WaitPolicy::default(), 2 << 20).expect("connect");
        (server, Arc::new(stub))
    }

    #[test]
    fn requests_track_cancellation_and_credit_until_they_end() {
        let mut r = Requests::default();
        r.open(1);
        // A window of 2: two responses may go before the client has taken any.
        assert!(r.has_room(1, 1, 2));
        assert!(!r.has_room(1, 2, 2));
        r.credit(1, 3);
        assert!(r.has_room(1, 4, 2));
        // A credit never goes back.
        r.credit(1, 1);
        assert!(r.has_room(1, 4, 2));
        // A window of 64 starts at INITIAL_WINDOW and grows by one per response taken.
        r.open(3);
        assert!(r.has_room(3, 7, 64) && !r.has_room(3, 8, 64));
        r.credit(3, 4);
        assert!(r.has_room(3, 15, 64) && !r.has_room(3, 16, 64));
        r.credit(3, 100);
        assert!(r.has_room(3, 163, 64) && !r.has_room(3, 164, 64), "grown to the configured window");
        r.end(3);
        r.cancel(1);
        assert!(r.is_cancelled(1));
        assert!(r.has_room(1, 100, 2), "a cancelled request's sends never wait");
        r.end(1);
        assert_eq!(r.len(), 0);
        // What comes for an ended (or unknown) request is dropped, not kept.
        r.cancel(1);
        r.credit(1, 5);
        assert_eq!(r.len(), 0);
        assert!(!r.is_cancelled(1));
        assert!(r.has_room(2, 1000, 1), "an untracked request is not held back");
    }

    #[test]
    fn the_router_takes_replies_bls_cancels_and_metrics_and_hands_on_the_rest() {
        let (server, stub) = pair();
        let router = Router::default();
        router.bls.locked().insert(7, VecDeque::new());
        let execute = ToStub::Execute { batch: 1, requests: vec![Request { id: 42, ..Request::default() }] };
        let msgs = vec![
            ToStub::Reply { call: 1, result: Ok(CallResult::Id(9)) },
            ToStub::BlsResponse { call: 7, response: Response::final_flag(0) },
            // Nobody waits for call 8: its response is released, not kept.
            ToStub::BlsResponse { call: 8, response: Response::final_flag(0) },
            execute,
            ToStub::Cancel { request: 42 },
            ToStub::CollectMetrics { seq: 1 },
            ToStub::CollectMetrics { seq: 2 },
            ToStub::CollectMetrics { seq: 3 },
            ToStub::CollectMetrics { seq: 4 },
            ToStub::CollectMetrics { seq: 5 },
            ToStub::Ping { seq: 11 },
        ];
        for m in &msgs {
            server.send(m).expect("send");
        }
        match router.next(&stub, T).expect("next") {
            Some(ToStub::Execute { batch: 1, requests }) => assert_eq!(requests[0].id, 42),
            other => panic!("expected the execute, got {other:?}"),
        }
        assert!(matches!(router.next(&stub, T).expect("next"), Some(ToStub::Ping { seq: 11 })));
        assert_eq!(router.replies.locked().remove(&1), Some(Ok(CallResult::Id(9))));
        assert_eq!(router.bls.locked().get(&7).map(VecDeque::len), Some(1));
        assert!(!router.bls.locked().contains_key(&8));
        assert!(router.requests.locked().is_cancelled(42), "the execute opened request 42, the cancel marked it");
        // The metrics queue keeps only the newest requests.
        assert_eq!(router.metrics.locked().iter().copied().collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        assert!(router.next(&stub, Duration::from_millis(20)).expect("next").is_none());
    }

    #[test]
    fn a_call_waits_for_its_own_reply_while_others_are_kept() {
        let (server, stub) = pair();
        let router = Arc::new(Router::default());
        let caller = {
            let (router, stub) = (router.clone(), stub.clone());
            std::thread::spawn(move || router.call(&stub, CallOp::MetricFamilyDrop { id: 3 }))
        };
        let call = match server.recv(T).expect("recv") {
            Some(ToServer::Call { call, op: CallOp::MetricFamilyDrop { id: 3 } }) => call,
            other => panic!("expected the call, got {other:?}"),
        };
        // A message for the main loop arrives first: the waiting caller keeps it for the loop.
        server.send(&ToStub::Ping { seq: 5 }).expect("send");
        server.send(&ToStub::Reply { call, result: Ok(CallResult::Done) }).expect("send");
        assert_eq!(caller.join().expect("join"), Ok(CallResult::Done));
        assert!(matches!(router.next(&stub, T).expect("next"), Some(ToStub::Ping { seq: 5 })));
    }

    #[test]
    fn client_regions_list_every_region_a_request_touches() {
        let desc = Descriptor { segment: 5, offset: 0, len: 4 };
        let regions = ClientRegions { outputs: vec![("OUT".into(), desc)], inputs: vec![3, 4] };
        assert_eq!(regions.ids().collect::<Vec<_>>(), vec![3, 4, 5]);
    }
}
