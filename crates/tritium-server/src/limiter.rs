//! Triton's rate limiter (`--rate-limit execution_count`): an instance runs a batch only once it
//! holds the resources its `instance_group { rate_limiter { resources priority } }` names, across
//! every model the server has loaded.
//!
//! It follows Triton's `rate_limiter.cc`:
//! - A resource counts per device (the instance's device; CPU instances are device 0) unless the
//!   config marks it `global`, when one count serves every device. A resource named both ways is
//!   refused ("present as both global and device-specific").
//! - A resource's count is the most any loaded instance needs, or what `--rate-limit-resource
//!   NAME:COUNT[:DEVICE]` says (no device: every device); an explicit count below what an instance
//!   needs fails that model's load with Triton's text.
//! - Instances with a batch in hand wait in one list. The one with the lowest *scaled priority*
//!   (executions so far × `priority`, 0 counting as 1) is the only one that may take resources
//!   next: an instance with priority 2 gets half the turns of one with priority 1, and nothing
//!   jumps the head of the list, not even an instance that needs nothing. Ties go in arrival order.
//! - Resources are held while the model's `execute` runs (a decoupled model's responses may still
//!   be streaming after it), and given back when it returns.
//!
//! A batch is taken from the queue first and then waits for resources (Triton forms its payload
//! before the rate limiter schedules it too), so its requests' queue time includes the wait. An
//! instance counts its waits and their total time (`tritium_rate_limiter_*` on `/metrics`), and
//! the log says at debug level each time one waited.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tritium_config::proto::ModelRateLimiter;
use tritium_sync::Locked;

/// Where a resource counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Device {
    /// One count for the whole server (`global: true`).
    Global,
    /// Each device has its own count.
    Id(i32),
}

/// A resource: where it counts, and its name.
type Key = (Device, String);

/// Why a rate limiter setting is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A `--rate-limit-resource` value that is not `NAME:COUNT[:DEVICE]`.
    #[error(
        "invalid --rate-limit-resource {0:?}: expected <name>:<count> or <name>:<count>:<device>, \
         with a whole count and a device id (e.g. R1:10 or R2:5:0)"
    )]
    Flag(String),
    /// A resource one instance needs globally and another per device (Triton's text).
    #[error("Resource \"{0}\" is present as both global and device-specific resource in the model configuration.")]
    GlobalAndDevice(String),
    /// An explicit count below what an instance needs (Triton's text).
    #[error(
        "Resource count for \"{name}\" is limited to {limit} which will prevent scheduling of one or more model \
         instances, the minimum required count is {needed}"
    )]
    TooLow {
        /// The resource.
        name: String,
        /// Its count.
        limit: u64,
        /// What one instance needs of it.
        needed: u64,
    },
}

/// The counts `--rate-limit-resource` gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceLimits {
    /// `NAME:COUNT`: on every device.
    every_device: BTreeMap<String, u64>,
    /// `NAME:COUNT:DEVICE`.
    on_device: BTreeMap<(i32, String), u64>,
}

impl ResourceLimits {
    /// Parses the `--rate-limit-resource` values (each `NAME:COUNT[:DEVICE]`).
    pub fn parse(values: &[String]) -> Result<Self, LimitError> {
        let mut limits = Self::default();
        for value in values {
            let bad = || LimitError::Flag(value.clone());
            let parts: Vec<&str> = value.split(':').collect();
            let (name, count, device) = match parts.as_slice() {
                [name, count] => (*name, *count, None),
                [name, count, device] => (*name, *count, Some(*device)),
                _ => return Err(bad()),
            };
            let count: u64 = count.trim().parse().map_err(|_| bad())?;
            if name.is_empty() {
                return Err(bad());
            }
            match device {
                None => limits.every_device.insert(name.to_string(), count),
                Some(d) => limits.on_device.insert((d.trim().parse().map_err(|_| bad())?, name.to_string()), count),
            };
        }
        Ok(limits)
    }

    /// Whether no count was given.
    pub fn is_empty(&self) -> bool {
        self.every_device.is_empty() && self.on_device.is_empty()
    }

    /// The explicit count of `key`: for a global resource the largest count given for its name
    /// anywhere, for a device's the larger of its own and the every-device one; 0 when none
    /// names it (as in Triton: a resource left out of explicit counts is not available).
    fn count(&self, (device, name): &Key) -> u64 {
        match device {
            Device::Global => self
                .every_device
                .get(name)
                .copied()
                .into_iter()
                .chain(self.on_device.iter().filter(|((_, n), _)| n == name).map(|(_, c)| *c))
                .max()
                .unwrap_or(0),
            Device::Id(d) => {
                let own = self.on_device.get(&(*d, name.clone())).copied().unwrap_or(0);
                own.max(self.every_device.get(name).copied().unwrap_or(0))
            }
        }
    }
}

/// The server's rate limiter, shared by every loaded model version.
#[derive(Debug)]
pub struct RateLimiter {
    explicit: ResourceLimits,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    next_seq: u64,
    members: HashMap<u64, MemberState>,
    /// How many of each resource there are.
    capacity: BTreeMap<Key, u64>,
    /// How many are held now.
    held: BTreeMap<Key, u64>,
    /// Instances with a batch in hand, waiting for their resources.
    staged: Vec<Staged>,
}

#[derive(Debug)]
struct MemberState {
    needs: Vec<(Key, u64)>,
    /// `priority`, 0 counting as 1.
    priority: u64,
    /// Executions so far.
    executions: u64,
}

#[derive(Debug)]
struct Staged {
    member: u64,
    seq: u64,
    grant: Arc<Grant>,
}

/// Set when a staged instance is given its resources; the thread or task waiting for it is woken.
#[derive(Debug, Default)]
struct Grant {
    given: Mutex<bool>,
    cv: Condvar,
    notify: tokio::sync::Notify,
}

impl Grant {
    fn give(&self) {
        *self.given.locked() = true;
        self.cv.notify_all();
        self.notify.notify_one();
    }

    fn given(&self) -> bool {
        *self.given.locked()
    }
}

/// What an instance needs, from its group's `rate_limiter`, on its device.
fn needs_of(config: &ModelRateLimiter, device_id: i32) -> Vec<(Key, u64)> {
    let mut needs: BTreeMap<Key, u64> = BTreeMap::new();
    for r in &config.resources {
        let device = if r.global { Device::Global } else { Device::Id(device_id) };
        let n = needs.entry((device, r.name.clone())).or_insert(0);
        *n = (*n).max(u64::from(r.count));
    }
    needs.into_iter().filter(|(_, n)| *n > 0).collect()
}

impl State {
    /// The counts with `extra` (a member being added) among the members: the most any instance
    /// needs, or the explicit counts, which must cover every need.
    fn capacity_with(&self, explicit: &ResourceLimits, extra: &[(Key, u64)]) -> Result<BTreeMap<Key, u64>, LimitError> {
        let mut most: BTreeMap<Key, u64> = BTreeMap::new();
        for (key, n) in self.members.values().flat_map(|m| m.needs.iter()).chain(extra.iter()) {
            let m = most.entry(key.clone()).or_insert(0);
            *m = (*m).max(*n);
        }
        let globals: Vec<&String> = most.keys().filter(|(d, _)| *d == Device::Global).map(|(_, n)| n).collect();
        if let Some(name) = globals.iter().find(|g| most.keys().any(|(d, n)| *d != Device::Global && n == **g)) {
            return Err(LimitError::GlobalAndDevice((*name).clone()));
        }
        if explicit.is_empty() {
            return Ok(most);
        }
        let mut capacity = BTreeMap::new();
        for (key, needed) in most {
            let limit = explicit.count(&key);
            if limit < needed {
                return Err(LimitError::TooLow { name: key.1, limit, needed });
            }
            capacity.insert(key, limit);
        }
        Ok(capacity)
    }

    fn fits(&self, needs: &[(Key, u64)]) -> bool {
        needs.iter().all(|(key, n)| {
            let held = self.held.get(key).copied().unwrap_or(0);
            held + n <= self.capacity.get(key).copied().unwrap_or(0)
        })
    }

    /// Gives resources to the head of the staged list while they fit: the staged instance with
    /// the lowest scaled priority (arrival order among equals), as Triton's `AttemptAllocation`.
    fn allocate(&mut self) {
        loop {
            let head = self
                .staged
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| {
                    let score = self.members.get(&s.member).map_or(0, |m| m.executions.saturating_mul(m.priority));
                    (score, s.seq)
                })
                .map(|(i, _)| i);
            let Some(i) = head else { return };
            let needs = self.members.get(&self.staged[i].member).map(|m| m.needs.clone()).unwrap_or_default();
            if !self.fits(&needs) {
                return;
            }
            for (key, n) in &needs {
                *self.held.entry(key.clone()).or_insert(0) += n;
            }
            self.staged.remove(i).grant.give();
        }
    }

    fn give_back(&mut self, needs: &[(Key, u64)]) {
        for (key, n) in needs {
            if let Some(h) = self.held.get_mut(key) {
                *h = h.saturating_sub(*n);
            }
        }
    }
}

impl RateLimiter {
    /// A rate limiter with the `--rate-limit-resource` counts `explicit` (empty: each count is
    /// the most any registered instance needs).
    pub fn new(explicit: ResourceLimits) -> Arc<Self> {
        Arc::new(Self { explicit, state: Mutex::new(State::default()) })
    }

    /// Registers an instance on `device_id` with its group's `rate_limiter` (none: it needs no
    /// resources and has priority 1). Fails, registering nothing, when the resources it needs
    /// cannot be had.
    pub fn register(self: &Arc<Self>, config: Option<&ModelRateLimiter>, device_id: i32) -> Result<Member, LimitError> {
        let needs = config.map(|c| needs_of(c, device_id)).unwrap_or_default();
        let priority = u64::from(config.map_or(1, |c| c.priority.max(1)));
        let mut st = self.state.locked();
        st.capacity = st.capacity_with(&self.explicit, &needs)?;
        let id = st.next_id;
        st.next_id += 1;
        st.members.insert(id, MemberState { needs, priority, executions: 0 });
        Ok(Member { limiter: self.clone(), id, counts: Arc::default() })
    }

    /// How many of each resource there are, for the log and tests.
    pub fn capacity(&self) -> BTreeMap<(Device, String), u64> {
        self.state.locked().capacity.clone()
    }
}

/// One instance's place in the rate limiter; leaving it (drop) unregisters the instance.
#[derive(Debug)]
pub struct Member {
    limiter: Arc<RateLimiter>,
    id: u64,
    counts: Arc<WaitCounts>,
}

/// How often, and how long in all, an instance waited for its resources.
#[derive(Debug, Default)]
pub struct WaitCounts {
    /// Executions that waited.
    pub waits: AtomicU64,
    /// Their total wait, in microseconds.
    pub waited_us: AtomicU64,
}

/// The resources one execution holds; dropping it gives them back and counts the execution.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<RateLimiter>,
    member: u64,
    needs: Vec<(Key, u64)>,
    /// How long the instance waited for it.
    pub waited: Duration,
}

impl Permit {
    /// Says in the log (debug level) that instance `instance` of `model` waited, if it did.
    pub fn logged(self, model: &str, version: i64, instance: &str) -> Self {
        if !self.waited.is_zero() {
            tracing::debug!(
                model,
                version,
                instance,
                waited_us = self.waited.as_micros() as u64,
                "the instance waited for its rate limiter resources"
            );
        }
        self
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut st = self.limiter.state.locked();
        st.give_back(&self.needs);
        if let Some(m) = st.members.get_mut(&self.member) {
            m.executions += 1;
        }
        st.allocate();
    }
}

/// An instance in the staged list; dropped before its grant is claimed, it leaves the list (or
/// gives back what it was granted).
struct Staging<'a> {
    member: &'a Member,
    seq: u64,
    grant: Arc<Grant>,
    needs: Vec<(Key, u64)>,
    start: Instant,
    /// The resources were given as it joined the list: it did not wait.
    at_once: bool,
    claimed: bool,
}

impl Staging<'_> {
    fn claim(mut self) -> Permit {
        self.claimed = true;
        let waited = if self.at_once { Duration::ZERO } else { self.start.elapsed() };
        let counts = &self.member.counts;
        if !self.at_once {
            counts.waits.fetch_add(1, Ordering::Relaxed);
            counts.waited_us.fetch_add(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
        Permit {
            limiter: self.member.limiter.clone(),
            member: self.member.id,
            needs: std::mem::take(&mut self.needs),
            waited,
        }
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if self.claimed {
            return;
        }
        let mut st = self.member.limiter.state.locked();
        match st.staged.iter().position(|s| s.seq == self.seq) {
            Some(i) => {
                st.staged.remove(i);
            }
            None => st.give_back(&self.needs),
        }
        st.allocate();
    }
}

impl Member {
    /// Joins the staged list; the resources may be given at once.
    fn stage(&self) -> Staging<'_> {
        let grant = Arc::new(Grant::default());
        let mut st = self.limiter.state.locked();
        let seq = st.next_seq;
        st.next_seq += 1;
        let needs = st.members.get(&self.id).map(|m| m.needs.clone()).unwrap_or_default();
        st.staged.push(Staged { member: self.id, seq, grant: grant.clone() });
        st.allocate();
        let at_once = grant.given();
        Staging { member: self, seq, grant, needs, start: Instant::now(), at_once, claimed: false }
    }

    /// Waits on this thread for the instance's resources, looking at `give_up` every 50 ms;
    /// `None` when it gave up.
    pub fn acquire_blocking(&self, give_up: &dyn Fn() -> bool) -> Option<Permit> {
        let staging = self.stage();
        let mut given = staging.grant.given.locked();
        while !*given {
            if give_up() {
                drop(given);
                return None;
            }
            given = staging
                .grant
                .cv
                .wait_timeout(given, Duration::from_millis(50))
                .map_or_else(|p| p.into_inner().0, |r| r.0);
        }
        drop(given);
        Some(staging.claim())
    }

    /// Waits on the runtime for the instance's resources. Dropping the future gives up its place.
    pub async fn acquire(&self) -> Permit {
        let staging = self.stage();
        while !staging.grant.given() {
            staging.grant.notify.notified().await;
        }
        staging.claim()
    }

    /// How often and how long this instance waited.
    pub fn counts(&self) -> &WaitCounts {
        &self.counts
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut st = self.limiter.state.locked();
        st.members.remove(&self.id);
        st.staged.retain(|s| s.member != self.id);
        // Fewer instances may need fewer resources; the counts cannot fail to cover fewer needs.
        if let Ok(capacity) = st.capacity_with(&self.limiter.explicit, &[]) {
            st.capacity = capacity;
        }
        st.allocate();
    }
}

/// The rate limiter's members of one model version, by instance name; empty when the rate
/// limiter is off.
#[derive(Debug, Default)]
pub struct Members(HashMap<String, Member>);

impl Members {
    /// The members of a version's instances, by instance name.
    pub fn new(members: HashMap<String, Member>) -> Self {
        Self(members)
    }

    /// Whether executions of this version wait for the rate limiter.
    pub fn is_limited(&self) -> bool {
        !self.0.is_empty()
    }

    /// The member of instance `instance`; `None` when the rate limiter is off.
    pub fn get(&self, instance: &str) -> Option<&Member> {
        self.0.get(instance)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tritium_config::proto::model_rate_limiter::Resource;

    fn config(resources: &[(&str, bool, u32)], priority: u32) -> ModelRateLimiter {
        ModelRateLimiter {
            resources: resources
                .iter()
                .map(|(name, global, count)| Resource { name: name.to_string(), global: *global, count: *count })
                .collect(),
            priority,
        }
    }

    fn flags(values: &[&str]) -> ResourceLimits {
        ResourceLimits::parse(&values.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn counts_default_to_the_most_any_instance_needs() {
        // Triton's documented example: A [R1:4 R2:4], B [R2:5 R3:10 R4:5], C [R1:1 R3:7 R4:2].
        let limiter = RateLimiter::new(ResourceLimits::default());
        let _a = limiter.register(Some(&config(&[("R1", false, 4), ("R2", false, 4)], 0)), 0).unwrap();
        let _b =
            limiter.register(Some(&config(&[("R2", false, 5), ("R3", false, 10), ("R4", false, 5)], 0)), 0).unwrap();
        let _c =
            limiter.register(Some(&config(&[("R1", false, 1), ("R3", false, 7), ("R4", false, 2)], 0)), 0).unwrap();
        let counts: Vec<(String, u64)> = limiter.capacity().into_iter().map(|((_, n), c)| (n, c)).collect();
        assert_eq!(counts, [("R1".into(), 4), ("R2".into(), 5), ("R3".into(), 10), ("R4".into(), 5)]);
    }

    #[test]
    fn explicit_counts_follow_tritons_example_and_refuse_too_few() {
        // --rate-limit-resource=R1:10 R2:5:0 R2:8:1 R3:2, R3 global in a model.
        let explicit = flags(&["R1:10", "R2:5:0", "R2:8:1", "R3:2"]);
        let limiter = RateLimiter::new(explicit.clone());
        let _g = limiter.register(Some(&config(&[("R3", true, 2)], 0)), 0).unwrap();
        let _d0 = limiter.register(Some(&config(&[("R1", false, 1), ("R2", false, 1)], 0)), 0).unwrap();
        let _d1 = limiter.register(Some(&config(&[("R1", false, 1), ("R2", false, 1)], 0)), 1).unwrap();
        let cap = limiter.capacity();
        assert_eq!(cap[&(Device::Global, "R3".into())], 2);
        assert_eq!(cap[&(Device::Id(0), "R1".into())], 10);
        assert_eq!(cap[&(Device::Id(0), "R2".into())], 5);
        assert_eq!(cap[&(Device::Id(1), "R2".into())], 8);
        let err = limiter.register(Some(&config(&[("R2", false, 6)], 0)), 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Resource count for \"R2\" is limited to 5 which will prevent scheduling of one or more model instances, \
             the minimum required count is 6"
        );
        // The refused instance left nothing behind.
        assert_eq!(limiter.capacity(), cap);
        let unnamed = limiter.register(Some(&config(&[("R9", false, 1)], 0)), 0).unwrap_err();
        assert!(matches!(unnamed, LimitError::TooLow { limit: 0, needed: 1, .. }), "{unnamed}");
    }

    #[test]
    fn a_resource_both_global_and_per_device_is_refused() {
        let limiter = RateLimiter::new(ResourceLimits::default());
        let _a = limiter.register(Some(&config(&[("R", true, 1)], 0)), 0).unwrap();
        let err = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Resource \"R\" is present as both global and device-specific resource in the model configuration."
        );
    }

    #[test]
    fn bad_flags_are_refused_with_the_expected_form() {
        for bad in ["R1", "R1:x", ":3", "R1:3:gpu", "R1:1:2:3", "R1:-1"] {
            let err = ResourceLimits::parse(&[bad.to_string()]).unwrap_err();
            assert!(err.to_string().contains("expected <name>:<count>"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_instance_waits_until_the_holder_gives_its_resources_back() {
        let limiter = RateLimiter::new(ResourceLimits::default());
        let a = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap();
        let b = Arc::new(limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap());
        let held = a.acquire_blocking(&|| false).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || {
                let permit = b.acquire_blocking(&|| false).unwrap();
                tx.send(()).unwrap();
                drop(permit);
            })
        };
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "b ran while a held R");
        drop(held);
        rx.recv_timeout(Duration::from_secs(10)).expect("b runs once a gives R back");
        waiter.join().unwrap();
        assert_eq!(b.counts().waits.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn giving_up_leaves_the_list_and_lets_the_next_one_run() {
        let limiter = RateLimiter::new(ResourceLimits::default());
        let a = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap();
        let b = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap();
        let held = a.acquire_blocking(&|| false).unwrap();
        assert!(b.acquire_blocking(&|| true).is_none());
        assert!(limiter.state.locked().staged.is_empty());
        drop(held);
        assert!(b.acquire_blocking(&|| false).is_some());
    }

    /// Which of the instances (indexes into `members`) a contended resource goes to, for `turns`
    /// turns in which every instance is waiting.
    fn turns(members: &[Member], turns: usize) -> Vec<usize> {
        let mut order = Vec::new();
        // Everyone waits while the resource is held by a blocker.
        let limiter = &members[0].limiter;
        let blocker = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap();
        for _ in 0..turns {
            let held = blocker.acquire_blocking(&|| false).unwrap();
            let staged: Vec<Staging<'_>> = members.iter().map(|m| m.stage()).collect();
            drop(held);
            // The executions of the blocker do not matter to the others' order: it is done.
            let (first, rest): (Vec<_>, Vec<_>) = staged.into_iter().partition(|s| s.grant.given());
            assert_eq!(first.len(), 1, "exactly one instance gets the resource");
            let winner = members.iter().position(|m| m.id == first[0].member.id).unwrap();
            order.push(winner);
            drop(rest);
            drop(first.into_iter().next().unwrap().claim());
        }
        order
    }

    #[test]
    fn priority_two_gets_half_the_turns_of_priority_one() {
        let limiter = RateLimiter::new(ResourceLimits::default());
        let one = limiter.register(Some(&config(&[("R", false, 1)], 1)), 0).unwrap();
        let two = limiter.register(Some(&config(&[("R", false, 1)], 2)), 0).unwrap();
        let order = turns(&[one, two], 30);
        let ones = order.iter().filter(|i| **i == 0).count();
        assert_eq!((ones, 30 - ones), (20, 10), "{order:?}");
    }

    #[test]
    fn the_head_of_the_list_is_not_overtaken() {
        // a holds R; b (needs R) waits first; c needs nothing but came later with the same
        // scaled priority: as in Triton, c waits behind b.
        let limiter = RateLimiter::new(ResourceLimits::default());
        let a = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap();
        let b = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap();
        let c = limiter.register(None, 0).unwrap();
        let held = a.acquire_blocking(&|| false).unwrap();
        let sb = b.stage();
        let sc = c.stage();
        assert!(!sb.grant.given() && !sc.grant.given());
        drop(held);
        assert!(sb.grant.given() && sc.grant.given());
    }

    #[test]
    fn unregistering_the_largest_need_lowers_the_count() {
        let limiter = RateLimiter::new(ResourceLimits::default());
        let small = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap();
        let big = limiter.register(Some(&config(&[("R", false, 3)], 0)), 0).unwrap();
        assert_eq!(limiter.capacity()[&(Device::Id(0), "R".into())], 3);
        drop(big);
        assert_eq!(limiter.capacity()[&(Device::Id(0), "R".into())], 1);
        drop(small);
        assert!(limiter.capacity().is_empty());
    }

    #[tokio::test]
    async fn a_task_waits_and_a_dropped_wait_leaves_the_list() {
        let limiter = RateLimiter::new(ResourceLimits::default());
        let a = limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap();
        let b = Arc::new(limiter.register(Some(&config(&[("R", false, 1)], 0)), 0).unwrap());
        let held = a.acquire().await;
        let timed_out = tokio::time::timeout(Duration::from_millis(50), b.acquire()).await;
        assert!(timed_out.is_err());
        assert!(limiter.state.locked().staged.is_empty(), "the dropped wait left the list");
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire().await.waited })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        let waited = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap();
        assert!(!waited.is_zero());
    }
}
