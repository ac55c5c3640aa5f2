//! The host's CPU and memory gauges, as Triton's core reports them: `nv_cpu_utilization` (the
//! share of CPU time spent busy since the previous sample, from the aggregate `cpu` line of
//! `/proc/stat`), `nv_cpu_memory_total_bytes` and `nv_cpu_memory_used_bytes` (`MemTotal`, and
//! `MemTotal - MemAvailable`, from `/proc/meminfo`).
//!
//! Triton samples on a thread every half `--metrics-interval-ms`; [`HostSampler`] samples when
//! `/metrics` is scraped instead, at most once per half interval (a scrape sooner than that
//! sees the last sample), so utilization covers the time since the previous sample as in
//! Triton, without a thread.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tritium_sync::Locked;

/// What the host gauges read at one scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostSnapshot {
    /// Busy share of all CPUs since the previous sample, 0.0 to 1.0.
    pub cpu_utilization: f64,
    /// `MemTotal` in bytes.
    pub memory_total_bytes: u64,
    /// `MemTotal - MemAvailable` in bytes.
    pub memory_used_bytes: u64,
}

/// The aggregate CPU times of `/proc/stat`, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CpuTimes {
    busy: u64,
    idle: u64,
}

/// Samples the host gauges at most once per `period` (half the metrics interval).
#[derive(Debug)]
pub struct HostSampler {
    period: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    cpu: Option<CpuTimes>,
    taken: Instant,
    last: HostSnapshot,
}

impl HostSampler {
    /// A sampler for `--metrics-interval-ms` `interval`; it reads the CPU times once now, the
    /// baseline of the first utilization.
    pub fn new(interval: Duration) -> Self {
        let cpu = read_cpu();
        let last = HostSnapshot { cpu_utilization: 0.0, ..read_memory() };
        Self { period: interval / 2, state: Mutex::new(State { cpu, taken: Instant::now(), last }) }
    }

    /// The gauges now: sampled again when the last sample is at least half an interval old.
    pub fn sample(&self) -> HostSnapshot {
        let mut state = self.state.locked();
        if state.taken.elapsed() < self.period {
            return state.last;
        }
        let cpu = read_cpu();
        let cpu_utilization = match (cpu, state.cpu) {
            (Some(new), Some(old)) => utilization(new, old),
            _ => 0.0,
        };
        state.cpu = cpu.or(state.cpu);
        state.taken = Instant::now();
        state.last = HostSnapshot { cpu_utilization, ..read_memory() };
        state.last
    }
}

fn read_cpu() -> Option<CpuTimes> {
    parse_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Total and used memory; zeros when `/proc/meminfo` cannot be read (as Triton reports then).
fn read_memory() -> HostSnapshot {
    let (memory_total_bytes, memory_used_bytes) =
        std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| parse_memory(&text)).unwrap_or((0, 0));
    HostSnapshot { cpu_utilization: 0.0, memory_total_bytes, memory_used_bytes }
}

/// The aggregate `cpu` line: busy is user + nice + system + irq + softirq + steal, idle is
/// idle + iowait (Triton's split).
fn parse_cpu(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = v[..] else { return None };
    Some(CpuTimes { busy: user + nice + system + irq + softirq + steal, idle: idle + iowait })
}

/// `(MemTotal, MemTotal - MemAvailable)` in bytes.
fn parse_memory(meminfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok().map(|kb| kb * 1024)
        })
    };
    let (total, available) = (field("MemTotal")?, field("MemAvailable")?);
    (available <= total).then(|| (total, total - available))
}

/// The busy share of the time between two samples (0 when no time passed or a counter went
/// backwards).
fn utilization(new: CpuTimes, old: CpuTimes) -> f64 {
    let busy = new.busy.saturating_sub(old.busy);
    let idle = new.idle.saturating_sub(old.idle);
    if busy + idle == 0 {
        0.0
    } else {
        busy as f64 / (busy + idle) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_split_busy_and_idle_as_triton_does() {
        let stat = "cpu  100 5 50 1000 20 3 2 7 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n";
        assert_eq!(parse_cpu(stat), Some(CpuTimes { busy: 100 + 5 + 50 + 3 + 2 + 7, idle: 1020 }));
        assert_eq!(parse_cpu("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_cpu("cpu 1 2 x\n"), None);
    }

    #[test]
    fn utilization_is_the_busy_share_between_samples() {
        let old = CpuTimes { busy: 100, idle: 900 };
        assert_eq!(utilization(CpuTimes { busy: 130, idle: 970 }, old), 0.3);
        assert_eq!(utilization(old, old), 0.0);
        assert_eq!(utilization(CpuTimes { busy: 50, idle: 950 }, old), 0.0);
    }

    #[test]
    fn used_memory_is_total_minus_available() {
        let meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n";
        assert_eq!(parse_memory(meminfo), Some((1000 * 1024, 750 * 1024)));
        assert_eq!(parse_memory("MemTotal: 10 kB\n"), None);
        assert_eq!(parse_memory("MemTotal: 10 kB\nMemAvailable: 20 kB\n"), None);
    }

    #[test]
    fn this_host_has_memory_and_a_utilization_between_zero_and_one() {
        let sampler = HostSampler::new(Duration::ZERO);
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        let s = sampler.sample();
        assert!(s.memory_total_bytes > 0 && s.memory_used_bytes <= s.memory_total_bytes, "{s:?}");
        assert!((0.0..=1.0).contains(&s.cpu_utilization), "{s:?}");
    }
}
