//! The supervisor's state machine: what happens to an instance ([`Event`]), the legal
//! transitions as one `(state, event)` table ([`transition`]), and the [`Status`] that changes
//! only through [`Status::on`], which logs, counts and publishes each change.

use super::*;

/// What happens to an instance; fed to [`Status::on`].
pub(super) enum Event {
    /// A stub process is being started.
    Spawn,
    /// The process started and said hello.
    Spawned {
        /// Its pid.
        pid: u32,
        /// Its channel, for reporting its shared memory.
        channel: Arc<tritium_ipc::ServerChannel>,
    },
    /// `initialize` returned.
    Initialized,
    /// `initialize` raised or timed out: a deterministic failure, not retried.
    InitFailed(String),
    /// The stub exited, was killed, hung, or broke the protocol: why, and how its process ended.
    Died(String, StubExit),
    /// The crash is counted and the restart delay begins.
    BackOff,
    /// An operator asked for a restart; the stub finishes its batch and is finalized.
    RestartRequested,
    /// A stub over its memory or request limit was replaced by a fresh one, started and ready
    /// before the old one drained: the instance stays ready throughout.
    Recycled {
        /// The new stub's pid.
        pid: u32,
        /// The new stub's channel.
        channel: Arc<tritium_ipc::ServerChannel>,
    },
    /// Too many crashes in the window.
    GaveUp(String),
    /// The version is being unloaded or the server stops.
    Stop,
    /// The stub is gone for good.
    Stopped,
}

impl Event {
    /// The event's name, for logs and errors.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Event::Spawn => "Spawn",
            Event::Spawned { .. } => "Spawned",
            Event::Initialized => "Initialized",
            Event::InitFailed(_) => "InitFailed",
            Event::Died(..) => "Died",
            Event::BackOff => "BackOff",
            Event::RestartRequested => "RestartRequested",
            Event::Recycled { .. } => "Recycled",
            Event::GaveUp(_) => "GaveUp",
            Event::Stop => "Stop",
            Event::Stopped => "Stopped",
        }
    }
}

/// An event that cannot happen in the state the instance is in: a supervisor bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("impossible instance transition: {event} in state {}", from.as_str())]
pub(crate) struct ImpossibleTransition {
    /// The state the instance was in (and stays in).
    pub from: InstanceState,
    /// The event's name.
    pub event: &'static str,
}

/// The supervisor's state machine: the state `event` leads to from `from`, or why it cannot
/// happen. Every legal transition is a row of this table (ARCHITECTURE.md draws it).
pub(super) fn transition(from: InstanceState, event: &Event) -> Result<InstanceState, ImpossibleTransition> {
    use Event as E;
    use InstanceState as S;
    Ok(match (from, event) {
        // The first start, a restart after the backoff, and a requested restart.
        (S::Starting | S::BackingOff | S::Draining, E::Spawn) => S::Starting,
        (S::Starting, E::Spawned { .. }) => S::Initializing,
        (S::Initializing, E::Initialized) => S::Ready,
        (S::Starting | S::Initializing, E::InitFailed(_)) => S::Failed,
        (S::Starting | S::Initializing | S::Ready, E::Died(..)) => S::Crashed,
        (S::Crashed, E::BackOff) => S::BackingOff,
        (S::Crashed, E::GaveUp(_)) => S::Failed,
        (S::Ready, E::RestartRequested) => S::Draining,
        (S::Ready, E::Recycled { .. }) => S::Ready,
        (S::Ready | S::Crashed | S::BackingOff, E::Stop) => S::Stopping,
        (S::Stopping, E::Stopped) => S::Stopped,
        (from, event) => return Err(ImpossibleTransition { from, event: event.name() }),
    })
}

/// What waiters see of an instance through its watch channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StateView {
    /// The current state.
    pub state: InstanceState,
    /// Restarts so far (crashes and requested restarts).
    pub restarts: u64,
}

/// The supervisor's view of one instance.
pub(super) struct Status {
    pub(super) state: InstanceState,
    pub(super) pid: Option<u32>,
    pub(super) started: Option<(Instant, SystemTime)>,
    pub(super) restarts: u64,
    pub(super) last_exit: Option<(StubExit, SystemTime)>,
    pub(super) reason: String,
    pub(super) transitions: BTreeMap<&'static str, u64>,
    /// Events refused as impossible (supervisor bugs).
    pub(super) impossible: u64,
    /// The running stub's channel, for reporting its shared memory when asked.
    pub(super) channel: Option<Arc<tritium_ipc::ServerChannel>>,
    /// Whether the running stub's process still runs, as the kernel knows it now: the
    /// supervisor hears of a death a moment later (from the watcher thread), and a readiness
    /// check in that moment must not call a dead stub ready.
    pub(super) process: Option<tritium_host::ProcessWatch>,
    /// Publishes every state change.
    pub(super) watch: watch::Sender<StateView>,
}

impl Status {
    pub(super) fn new() -> Self {
        let state = InstanceState::Starting;
        Self {
            state,
            pid: None,
            started: None,
            restarts: 0,
            last_exit: None,
            reason: String::new(),
            transitions: BTreeMap::new(),
            impossible: 0,
            channel: None,
            process: None,
            watch: watch::Sender::new(StateView { state, restarts: 0 }),
        }
    }

    /// The one place where anything about the instance's state changes: the table decides the
    /// next state, then the event's data is recorded, the change logged, counted and published.
    pub(super) fn on(&mut self, event: Event) -> Result<InstanceState, ImpossibleTransition> {
        let from = self.state;
        let to = match transition(from, &event) {
            Ok(to) => to,
            Err(e) => {
                self.impossible += 1;
                error!("{e}");
                return Err(e);
            }
        };
        match event {
            Event::Spawn => self.channel = None,
            Event::Spawned { pid, channel } => self.new_stub(pid, channel),
            Event::Initialized => self.reason.clear(),
            Event::InitFailed(why) | Event::GaveUp(why) => self.reason = why,
            Event::Died(why, exit) => {
                self.last_exit = Some((exit, SystemTime::now()));
                self.reason = why;
                self.forget_stub();
            }
            Event::BackOff | Event::RestartRequested => self.restarts += 1,
            Event::Recycled { pid, channel } => {
                self.restarts += 1;
                self.new_stub(pid, channel);
            }
            Event::Stop => {}
            Event::Stopped => self.forget_stub(),
        }
        *self.transitions.entry(to.as_str()).or_default() += 1;
        self.state = to;
        match to {
            InstanceState::Failed | InstanceState::Crashed => {
                error!(from = from.as_str(), to = to.as_str(), reason = %self.reason, "instance state")
            }
            _ => info!(from = from.as_str(), to = to.as_str(), "instance state"),
        }
        self.watch.send_replace(StateView { state: to, restarts: self.restarts });
        Ok(to)
    }

    fn new_stub(&mut self, pid: u32, channel: Arc<tritium_ipc::ServerChannel>) {
        self.pid = Some(pid);
        self.started = Some((Instant::now(), SystemTime::now()));
        self.channel = Some(channel);
        // The stub is the server's child and nobody has reaped it: its pid is still its own.
        self.process = match tritium_host::ProcessWatch::open(pid) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(pid, error = %e, "cannot watch the stub's process; readiness follows the supervisor alone");
                None
            }
        };
    }

    pub(super) fn forget_stub(&mut self) {
        self.pid = None;
        self.channel = None;
        self.started = None;
        self.process = None;
    }

    /// The state as reported to clients and operators: a ready instance whose stub has already
    /// exited is crashed, whether or not the supervisor has heard of it yet.
    pub(super) fn reported(&self) -> InstanceState {
        if self.state == InstanceState::Ready && self.process.as_ref().is_some_and(|p| p.exited()) {
            InstanceState::Crashed
        } else {
            self.state
        }
    }
}
