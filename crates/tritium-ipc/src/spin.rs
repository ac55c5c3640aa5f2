//! Whether waiters should spin on this machine, decided by measuring what a sleep costs here.
//!
//! A thread that waits for its peer can spin (burning CPU) or sleep on the futex and pay, when
//! the peer answers, for the wake-up. Where waking a thread whose CPU went idle is cheap (a few
//! microseconds: bare metal, or a hypervisor that polls before it halts an idle CPU) spinning buys
//! nothing and burns a core, so tritium does not spin. Where it is dear (tens of microseconds: a
//! virtual CPU that halts when idle, and every hop of a request pays it again) spinning is what
//! keeps a request's round trip short: on the 2-CPU virtual machines tritium is developed on, a
//! 45 us wake-up made add_sub at concurrency 1 take 340 us per request without spinning and 85 us
//! with it, and the server and stub spent less CPU per request, not more, since they no longer
//! went through the scheduler on every hop.
//!
//! A fixed budget of the cost itself (the ski-rental rule, "spin as long as a sleep costs") was
//! measured too and does not work here: the stub waits about 70 us between requests, so a 45 us
//! budget never catches one, and the pipeline pays the wake-up on every hop anyway (3,300
//! requests/s instead of 8,600). So the budget is all or nothing: [`SPIN_BUDGET`] where a
//! wake-up costs at least [`SPIN_THRESHOLD`], none below. Spinning stays adaptive per waiter on
//! top of that (`ring::WaitPolicy`): only while the peer answers within the budget.
//!
//! The budget, 150 us, is what tells a client that waits for each answer from one that sends on
//! its own clock. The first comes back about 70 us after an answer (perf_analyzer at concurrency
//! 1, on these VMs), well within it, and the wake-up the spin saves is on the path of its next
//! request. The second leaves the stub idle as long as its rate allows (about 300 us between
//! add_sub requests at an offered 2,500/s), which the 500 us budget before spun through on every
//! request for that request's latency only. The measurements are in ARCHITECTURE.md ("Closed
//! loop or offered load").

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::futex;

/// The spin budget where a wake-up is dear.
pub const SPIN_BUDGET: Duration = Duration::from_micros(150);

/// A wake-up at least this costly makes waiters spin.
pub const SPIN_THRESHOLD: Duration = Duration::from_micros(20);

/// The median time from waking a thread that sleeps on a futex until it runs, over `samples`
/// wake-ups, each after both threads stayed idle for `gap` (long enough for an idle CPU to enter
/// its idle state, which is the cost spinning avoids). The two threads are pinned to two
/// different CPUs this process may use, as a worker and its stub run in parallel; with fewer than
/// two CPUs the peer cannot run while a waiter spins, so spinning never pays: zero.
pub fn wake_cost(samples: usize, gap: Duration) -> Duration {
    let Some((cpu_a, cpu_b)) = two_cpus() else { return Duration::ZERO };
    if cgroup_cpus().is_some_and(|cpus| cpus < 2.0) {
        // A CPU quota below two CPUs (a container's limit): a spinning waiter spends the quota
        // its peer needs.
        return Duration::ZERO;
    }
    let samples = samples.max(1);
    let word = Arc::new(AtomicU32::new(0));
    let woke_ns = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let waiter = {
        let (word, woke_ns) = (word.clone(), woke_ns.clone());
        std::thread::Builder::new().name("tritium-wake-probe".into()).spawn(move || {
            pin_to(cpu_a);
            for i in 0..samples as u32 {
                while word.load(Ordering::Acquire) == 2 * i {
                    futex::wait(&word, 2 * i, Duration::from_secs(1));
                }
                woke_ns.store(epoch.elapsed().as_nanos() as u64, Ordering::Release);
                word.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    let Ok(waiter) = waiter else { return Duration::ZERO };
    // The waking side runs on a thread of its own too, so that the caller's CPU mask stays as is.
    let waker = std::thread::Builder::new().name("tritium-wake-probe".into()).spawn(move || {
        pin_to(cpu_b);
        let mut costs = Vec::with_capacity(samples);
        for i in 0..samples as u32 {
            // Both threads sleep for `gap` (the waiter on the futex, this one here).
            std::thread::sleep(gap);
            let sent = epoch.elapsed().as_nanos() as u64;
            word.store(2 * i + 1, Ordering::Release);
            futex::wake(&word, 1);
            // Stay busy until the waiter runs, as a stub that goes on computing does.
            let deadline = Instant::now() + Duration::from_secs(1);
            while word.load(Ordering::Acquire) != 2 * i + 2 && Instant::now() < deadline {
                std::hint::spin_loop();
            }
            if word.load(Ordering::Acquire) != 2 * i + 2 {
                // The waiter is stuck (it cannot be on a sane machine): let it go, measure nothing.
                word.store(u32::MAX, Ordering::Release);
                futex::wake(&word, 1);
                return None;
            }
            costs.push(Duration::from_nanos(woke_ns.load(Ordering::Acquire).saturating_sub(sent)));
        }
        costs.sort();
        Some(costs[costs.len() / 2])
    });
    let cost = waker.ok().and_then(|w| w.join().ok().flatten());
    let _ = waiter.join();
    cost.unwrap_or(Duration::ZERO)
}

/// Two distinct CPUs of this thread's affinity mask, or `None` when it has fewer than two.
fn two_cpus() -> Option<(usize, usize)> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads the set for indices below CPU_SETSIZE.
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some((cpus.next()?, cpus.next()?))
}

/// The CPU quota of this process's cgroup (v2 `cpu.max`, or v1 `cpu.cfs_quota_us` over
/// `cpu.cfs_period_us`) in CPUs, `None` when there is none.
fn cgroup_cpus() -> Option<f64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let ratio = |quota: &str, period: &str| -> Option<f64> {
        let (q, p) = (quota.trim().parse::<f64>().ok()?, period.trim().parse::<f64>().ok()?);
        (q > 0.0 && p > 0.0).then(|| q / p)
    };
    if let Some(max) = read("/sys/fs/cgroup/cpu.max") {
        let mut parts = max.split_whitespace();
        return ratio(parts.next()?, parts.next()?);
    }
    ratio(&read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")?, &read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")?)
}

/// Pins the calling thread to `cpu` (best effort: the measurement is only less exact without it).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` came from this process's own mask, so it is below CPU_SETSIZE; `set` is a
    // valid cpu_set_t of the size passed, and pid 0 is the calling thread.
    unsafe {
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The longest a runtime worker about to park spins for a stub's answer
/// ([`runtime_budget_for`]).
pub const RUNTIME_SPIN_MAX: Duration = Duration::from_micros(100);

/// How long a runtime worker about to park spins for the stub executing a batch: the measured
/// wake-up cost itself (ski rental), at most [`RUNTIME_SPIN_MAX`], where it is at least
/// [`SPIN_THRESHOLD`]; none below. Unlike the stub's wait for its next request (unbounded: it
/// depends on the client), this wait is the model's execute, which for small models takes less
/// than a wake-up: so spinning as long as a sleep would cost catches it.
pub fn runtime_budget_for(wake_cost: Duration) -> Duration {
    if wake_cost >= SPIN_THRESHOLD {
        wake_cost.min(RUNTIME_SPIN_MAX)
    } else {
        Duration::ZERO
    }
}

/// The spin budget for a measured wake-up cost: [`SPIN_BUDGET`] from [`SPIN_THRESHOLD`] on,
/// none below.
pub fn budget_for(wake_cost: Duration) -> Duration {
    if wake_cost >= SPIN_THRESHOLD {
        SPIN_BUDGET
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_spins_as_long_as_a_wake_up_costs_and_never_long() {
        assert_eq!(runtime_budget_for(Duration::from_micros(5)), Duration::ZERO);
        assert_eq!(runtime_budget_for(Duration::from_micros(45)), Duration::from_micros(45));
        assert_eq!(runtime_budget_for(Duration::from_millis(3)), RUNTIME_SPIN_MAX);
    }

    #[test]
    fn waiters_spin_only_where_a_wake_up_is_dear() {
        assert_eq!(budget_for(Duration::from_micros(2)), Duration::ZERO);
        assert_eq!(budget_for(SPIN_THRESHOLD - Duration::from_nanos(1)), Duration::ZERO);
        assert_eq!(budget_for(SPIN_THRESHOLD), SPIN_BUDGET);
        assert_eq!(budget_for(Duration::from_millis(3)), SPIN_BUDGET);
    }

    #[test]
    fn a_wake_up_is_measured_as_taking_some_time_but_not_ages() {
        let cost = wake_cost(5, Duration::from_millis(1));
        assert!(cost > Duration::ZERO, "{cost:?}");
        // Generous: a loaded CI machine can be slow, but a futex wake-up within a second is sure.
        assert!(cost < Duration::from_secs(1), "{cost:?}");
    }
}
