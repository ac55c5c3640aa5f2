//! `cargo xtask bench serve`: perf_analyzer against tritium and Triton's own server.
//!
//! Both servers serve the same temporary repository holding copies of `examples/models/add_sub`
//! (one instance, no batching) and `examples/models/batched_scale` (dynamic batching with
//! `max_queue_delay_microseconds: 2000`, two instances). Triton 2.51 with its Python backend comes
//! from the `nvidia-pytriton` wheel, installed on demand into `.venv-triton` (the wheel bundles
//! `tritonserver` and its Python backend: the only Triton that installs from a package registry,
//! without Docker). Both run for the whole benchmark, with their default flags unless
//! `cargo xtask bench serve FLAGS` gives tritium some (e.g. `--stub-spin-us 0 --runtime-spin-us 0`,
//! to see what tritium does where nothing spins).
//!
//! For each case (add_sub at concurrency 1, 2, 4, 8, batched_scale at 16 and 64, and at 1 a copy
//! of it whose batch delay is 100 us, over gRPC and HTTP) perf_analyzer measures the two servers
//! in the order A B B A (which one is A alternates), and each server's two results are averaged,
//! so that drift on a noisy machine hits both alike;
//! only the ratios are meaningful, and only when nothing else runs (the load average is printed).
//! Besides throughput and p50/p99 latency, each measurement reads the CPU time of the server
//! process and of its stub processes from /proc, divided by the requests the model served
//! meanwhile (its statistics), and perf_analyzer's own CPU time (it runs on the same CPUs). Where
//! the CPUs are the limit, throughput is their number over the CPU one request costs the whole
//! machine, client included, and the "2x needs" column is the server + stub CPU per request at
//! which tritium would reach twice Triton's throughput (the client's share is not the server's to
//! cut). The targets (issue 12): at every case twice Triton's throughput
//! and a lower p99; for add_sub at concurrency 1 and 4, server + stub CPU per request at most half
//! of Triton's.
//!
//! Then the equal-load rows (issue 34): perf_analyzer `--request-rate-range R:R` offers the same
//! requests per second (1,000 and 2,500) to both servers, on both protocols, for add_sub and
//! batched_scale. Their CPU per request is sampled from /proc every [`SAMPLE_EVERY`] while
//! perf_analyzer runs, and counted only over the steady part of the run (from a second after the
//! model's request count starts to rise until its last rise): perf_analyzer's start-up, its
//! metadata calls and its wind-down are left out. Target: server + stub CPU per request at most
//! half of Triton's at the same offered load.
//!
//! `TRITIUM_BENCH_PARTS` (comma-separated `throughput`, `add_sub` (its throughput rows only),
//! `rates`; default `throughput,rates`) runs some parts only.

use std::fmt::Write as _;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::procstat::{inference_count, reaped_children_ticks, ticks_per_request_us, TreeCpu};
use crate::servers::{
    copy_dir, free_ports, load_average, tail, tritium_command, triton_command, triton_env, Server, TempDir,
};
use crate::{root, target_dir};

const PROTOCOLS: [&str; 2] = ["grpc", "http"];
/// One model at some concurrencies; `shape` is perf_analyzer's `--shape` for variable dims.
struct Case {
    model: &'static str,
    /// The example it is a copy of, with its config's `max_queue_delay_microseconds` set to this
    /// (and its name changed); `None`: the example `model` as it is.
    variant_of: Option<(&'static str, u64)>,
    concurrencies: &'static [u32],
    shape: Option<&'static str>,
    /// The concurrencies at which the CPU target applies.
    cpu_target_at: &'static [u32],
}
const CASES: [Case; 3] = [
    Case { model: "add_sub", variant_of: None, concurrencies: &[1, 2, 4, 8], shape: None, cpu_target_at: &[1, 4] },
    Case {
        model: "batched_scale",
        variant_of: None,
        concurrencies: &[16, 64],
        shape: Some("INPUT:16"),
        cpu_target_at: &[],
    },
    // A batch delay shorter than a millisecond (Triton's docs use 100 us), alone: each request
    // waits the whole delay, so this shows how precisely the server keeps it.
    Case {
        model: "batched_scale_100us",
        variant_of: Some(("batched_scale", 100)),
        concurrencies: &[1],
        shape: Some("INPUT:16"),
        cpu_target_at: &[],
    },
];
/// The equal-load cases: model, perf_analyzer `--shape`, offered requests per second.
const RATE_MODELS: [(&str, Option<&str>); 2] = [("add_sub", None), ("batched_scale", Some("INPUT:16"))];
const RATES: [u32; 2] = [1000, 2500];
/// How often the CPU time and request count are sampled during an equal-load run.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// How much of a run's start is skipped once requests are being served (connections, warm-up).
const RATE_WARMUP: Duration = Duration::from_secs(1);
const THROUGHPUT_TARGET: f64 = 2.0;
const CPU_TARGET: f64 = 0.5;
/// perf_analyzer's window. Its stability rule (3 windows within 10% of each other) rarely holds on
/// a small, busy machine, and then it prints no result at all; so the rule is switched off
/// (`STABILITY_PERCENT`) and each measurement is the merge of its first 3 windows, about 7 s.
const MEASUREMENT_MS: u32 = 2000;
const STABILITY_PERCENT: u32 = 1000;

/// Runs the benchmark; `setup()` and `build()` have run. `flags` are added to `tritium serve`'s
/// command line (Triton always runs with its defaults).
pub(crate) fn bench_serve(flags: &[String]) -> Result<()> {
    let started = Instant::now();
    let root = root();
    let target = target_dir();
    let tritium = target.join("release/tritium");
    let perf_analyzer = root.join(".venv/bin/perf_analyzer");
    if !perf_analyzer.exists() {
        bail!("{} is missing (perf_analyzer needs libb64-0d; see `cargo xtask setup`)", perf_analyzer.display());
    }
    let triton = triton_env(&root)?;

    let repo = TempDir::new("tritium-bench-serve")?;
    for case in &CASES {
        let dir = repo.0.join(case.model);
        match case.variant_of {
            None => copy_dir(&root.join("examples/models").join(case.model), &dir)?,
            Some((example, delay_us)) => {
                copy_dir(&root.join("examples/models").join(example), &dir)?;
                let config = dir.join("config.pbtxt");
                let text = std::fs::read_to_string(&config)?;
                let delay = set_value(&text, "max_queue_delay_microseconds:", &format!(" {delay_us}"))
                    .with_context(|| format!("{example}'s config sets no max_queue_delay_microseconds"))?;
                let named = delay.replace(&format!("name: \"{example}\""), &format!("name: \"{}\"", case.model));
                std::fs::write(&config, named)?;
            }
        }
    }
    let logs = target.join("bench-serve");
    std::fs::create_dir_all(&logs)?;

    let [t_http, t_grpc, t_metrics, n_http, n_grpc, n_metrics] = free_ports::<6>()?;
    let mut tritium_cmd = tritium_command(&root, &tritium, &repo.0, [t_http, t_grpc, t_metrics]);
    tritium_cmd.args(flags);
    let triton_cmd = triton_command(&root, &triton, &repo.0, [n_http, n_grpc, n_metrics]);

    // Both start before either is measured; the idle one sleeps in its event loop meanwhile.
    let mut servers = [
        Server::start("tritium", tritium_cmd, &logs.join("tritium.log"), t_http, t_grpc)?,
        Server::start("Triton", triton_cmd, &logs.join("triton.log"), n_http, n_grpc)?,
    ];
    for s in &mut servers {
        s.wait_ready()?;
    }
    eprintln!("xtask: both servers ready after {:.0?}", started.elapsed());

    let load_before = load_average();
    if load_before.parse::<f64>().is_ok_and(|l| l > 1.5) {
        eprintln!(
            "xtask: load average {load_before} before measuring: something else is running, the numbers will be noisy"
        );
    }
    let parts = std::env::var("TRITIUM_BENCH_PARTS").unwrap_or_else(|_| "throughput,rates".into());
    let part = |name: &str| parts.split(',').any(|p| p.trim() == name);
    let mut rows = Vec::new();
    let runs = CASES
        .iter()
        .filter(|case| part("throughput") || (part("add_sub") && case.model == "add_sub"))
        .flat_map(|case| PROTOCOLS.iter().flat_map(move |p| case.concurrencies.iter().map(move |c| (case, *p, *c))));
    for (i, (case, protocol, concurrency)) in runs.enumerate() {
        let order: [usize; 4] = if i % 2 == 0 { [0, 1, 1, 0] } else { [1, 0, 0, 1] };
        let mut results: [Vec<Measurement>; 2] = Default::default();
        for k in order {
            let s = &mut servers[k];
            s.check_alive()?;
            let m = measure(&perf_analyzer, s, case, protocol, concurrency)
                .with_context(|| format!("measuring {}", s.name()))?;
            eprintln!(
                "xtask: {:<7} {:<13} {protocol:<4} c{concurrency:<3} {:>7.1}/s  p50 {:>6} us  p99 {:>6} us  CPU/request: server {:>5.0} us, stubs {:>5.0} us, client {:>5.0} us",
                s.name(), case.model, m.throughput, m.p50_us, m.p99_us, m.server_us, m.stubs_us, m.client_us
            );
            results[k].push(m);
        }
        rows.push(Row {
            model: case.model,
            protocol,
            concurrency,
            cpu_target: case.cpu_target_at.contains(&concurrency),
            tritium: Measurement::mean(&results[0]),
            triton: Measurement::mean(&results[1]),
        });
    }
    let mut rate_rows = Vec::new();
    let rate_runs = RATE_MODELS
        .iter()
        .filter(|_| part("rates"))
        .flat_map(|m| PROTOCOLS.iter().flat_map(move |p| RATES.iter().map(move |r| (*m, *p, *r))));
    for (i, ((model, shape), protocol, rate)) in rate_runs.enumerate() {
        let order: [usize; 4] = if i % 2 == 0 { [0, 1, 1, 0] } else { [1, 0, 0, 1] };
        let mut results: [Vec<RateMeasurement>; 2] = Default::default();
        for k in order {
            let s = &mut servers[k];
            s.check_alive()?;
            let m = measure_rate(&perf_analyzer, s, model, shape, protocol, rate)
                .with_context(|| format!("measuring {} at {rate}/s", s.name()))?;
            eprintln!(
                "xtask: {:<7} {model:<13} {protocol:<4} {rate:>5}/s offered, {:>7.1}/s served  CPU/request: server {:>5.0} us, stubs {:>5.0} us (over {:.1} s)",
                s.name(), m.served_per_s, m.server_us, m.stubs_us, m.window_s
            );
            results[k].push(m);
        }
        rate_rows.push(RateRow {
            model,
            protocol,
            rate,
            tritium: RateMeasurement::mean(&results[0]),
            triton: RateMeasurement::mean(&results[1]),
        });
    }
    for s in &mut servers {
        s.check_alive()?;
    }
    drop(servers);

    if !flags.is_empty() {
        println!("tritium ran with {}", flags.join(" "));
    }
    if !rows.is_empty() {
        println!("{}", table(&rows));
    }
    if !rate_rows.is_empty() {
        println!("{}", rate_table(&rate_rows));
    }
    let missed: Vec<String> =
        rows.iter().flat_map(Row::missed).chain(rate_rows.iter().filter_map(RateRow::missed)).collect();
    if missed.is_empty() {
        println!("all targets met");
    } else {
        println!(
            "targets missed ({} of {}): {}",
            missed.len(),
            rows.iter().map(Row::targets).sum::<usize>() + rate_rows.len(),
            missed.join("; ")
        );
    }
    let bounded: Vec<String> = rows
        .iter()
        .filter(|r| r.cpu_needed_us() <= 0.0)
        .map(|r| format!("{} {} c{}", r.model, r.protocol, r.concurrency))
        .collect();
    if !bounded.is_empty() {
        println!(
            "out of reach while perf_analyzer shares these CPUs (its own CPU per request leaves no room for a \
             server to reach {THROUGHPUT_TARGET}x): {}",
            bounded.join("; ")
        );
    }
    println!(
        "took {:.0?}; load average {load_before} before measuring, {} after (server logs in {})",
        started.elapsed(),
        load_average(),
        logs.display()
    );
    Ok(())
}

/// One perf_analyzer run, and the CPU the server's processes spent per request served meanwhile.
#[derive(Clone, Copy)]
struct Measurement {
    throughput: f64,
    p50_us: u64,
    p99_us: u64,
    /// CPU microseconds per request of the server process.
    server_us: f64,
    /// CPU microseconds per request of its stub processes, all together.
    stubs_us: f64,
    /// CPU microseconds per request of perf_analyzer, which shares the machine's CPUs.
    client_us: f64,
}

impl Measurement {
    /// The mean of each figure (for percentiles an approximation, good enough for two runs).
    fn mean(all: &[Self]) -> Self {
        let n = all.len().max(1) as f64;
        let avg = |f: fn(&Self) -> f64| all.iter().map(f).sum::<f64>() / n;
        Self {
            throughput: avg(|m| m.throughput),
            p50_us: avg(|m| m.p50_us as f64).round() as u64,
            p99_us: avg(|m| m.p99_us as f64).round() as u64,
            server_us: avg(|m| m.server_us),
            stubs_us: avg(|m| m.stubs_us),
            client_us: avg(|m| m.client_us),
        }
    }

    fn cpu_us(&self) -> f64 {
        self.server_us + self.stubs_us
    }

    /// Everything one request cost the machine: server, stubs and the client.
    fn machine_us(&self) -> f64 {
        self.cpu_us() + self.client_us
    }
}

struct Row {
    model: &'static str,
    protocol: &'static str,
    concurrency: u32,
    /// Whether the CPU target applies here.
    cpu_target: bool,
    tritium: Measurement,
    triton: Measurement,
}

impl Row {
    fn throughput_ratio(&self) -> f64 {
        self.tritium.throughput / self.triton.throughput
    }
    fn cpu_ratio(&self) -> f64 {
        self.tritium.cpu_us() / self.triton.cpu_us()
    }
    fn throughput_met(&self) -> bool {
        self.throughput_ratio() >= THROUGHPUT_TARGET
    }
    fn p99_met(&self) -> bool {
        self.tritium.p99_us < self.triton.p99_us
    }
    fn cpu_met(&self) -> bool {
        self.cpu_ratio() <= CPU_TARGET
    }
    /// The server + stub CPU per request at which tritium would reach the throughput target when
    /// the machine's CPUs are the limit: throughput is then the number of CPUs over what one
    /// request costs the whole machine, the client included, so tritium's whole cost must be
    /// Triton's over the target, and the client's share of it is not the server's to cut.
    /// Negative where even a server costing nothing could not reach the target.
    fn cpu_needed_us(&self) -> f64 {
        self.triton.machine_us() / THROUGHPUT_TARGET - self.tritium.client_us
    }
    fn targets(&self) -> usize {
        2 + usize::from(self.cpu_target)
    }
    /// The targets this row misses, each named.
    fn missed(&self) -> Vec<String> {
        let at = format!("{} {} c{}", self.model, self.protocol, self.concurrency);
        let mut out = Vec::new();
        if !self.throughput_met() {
            out.push(format!("{at} throughput {:.2}x", self.throughput_ratio()));
        }
        if !self.p99_met() {
            out.push(format!("{at} p99 {} vs {} us", self.tritium.p99_us, self.triton.p99_us));
        }
        if self.cpu_target && !self.cpu_met() {
            out.push(format!("{at} CPU {:.2}x", self.cpu_ratio()));
        }
        out
    }
}

fn table(rows: &[Row]) -> String {
    let yes_no = |b: bool| if b { "yes" } else { "NO" };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<13} {:<5} {:>4} | {:>9} {:>9} {:>6} | {:>15} {:>15} | {:>15} {:>15} {:>6} | {:>13} {:>8} | {:<5} {:<4} {:<4}",
        "model",
        "proto",
        "conc",
        "tritium/s",
        "Triton/s",
        "ratio",
        "tritium p50/99",
        "Triton p50/99",
        "tritium CPU/rq",
        "Triton CPU/rq",
        "ratio",
        "client CPU/rq",
        "2x needs",
        ">=2x",
        "p99",
        "CPU"
    );
    let _ = writeln!(
        out,
        "{:<62}  (CPU/rq: server + stubs, microseconds per request; client: perf_analyzer's, tritium / Triton; \
         2x needs: the server + stubs CPU/rq at which tritium reaches 2x while the CPUs are the limit)",
        ""
    );
    let _ = writeln!(out, "{}", "-".repeat(174));
    for r in rows {
        let (t, n) = (r.tritium, r.triton);
        let cpu = |m: &Measurement| format!("{:.0} + {:.0}", m.server_us, m.stubs_us);
        let _ = writeln!(
            out,
            "{:<13} {:<5} {:>4} | {:>9.1} {:>9.1} {:>5.2}x | {:>15} {:>15} | {:>15} {:>15} {:>5.2}x | {:>13} {:>8.0} | {:<5} {:<4} {:<4}",
            r.model,
            r.protocol,
            r.concurrency,
            t.throughput,
            n.throughput,
            r.throughput_ratio(),
            format!("{}/{} us", t.p50_us, t.p99_us),
            format!("{}/{} us", n.p50_us, n.p99_us),
            cpu(&t),
            cpu(&n),
            r.cpu_ratio(),
            format!("{:.0} / {:.0}", t.client_us, n.client_us),
            r.cpu_needed_us(),
            yes_no(r.throughput_met()),
            yes_no(r.p99_met()),
            if r.cpu_target { yes_no(r.cpu_met()) } else { "-" },
        );
    }
    out
}

/// Runs perf_analyzer on one case against `server` and parses its client-side summary.
fn measure(
    perf_analyzer: &Path,
    server: &Server,
    case: &Case,
    protocol: &str,
    concurrency: u32,
) -> Result<Measurement> {
    let port = if protocol == "grpc" { server.grpc_port() } else { server.http_port() };
    let mut cmd = Command::new(perf_analyzer);
    cmd.args(["-m", case.model, "-i", protocol, "-u", &format!("127.0.0.1:{port}")])
        .arg("--concurrency-range")
        .arg(concurrency.to_string())
        .arg("--measurement-interval")
        .arg(MEASUREMENT_MS.to_string())
        .arg("--stability-percentage")
        .arg(STABILITY_PERCENT.to_string());
    if let Some(shape) = case.shape {
        cmd.args(["--shape", shape]);
    }
    let (cpu0, served0) = (TreeCpu::of(server.pid()), inference_count(server.http_port(), case.model));
    let client0 = reaped_children_ticks();
    let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
    let client = reaped_children_ticks().saturating_sub(client0);
    let (cpu1, served1) = (TreeCpu::of(server.pid()), inference_count(server.http_port(), case.model));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed = parse_perf(&stdout);
    match (out.status.success(), parsed) {
        (true, Some((throughput, p50_us, p99_us))) => {
            let served = match (served0, served1) {
                (Some(a), Some(b)) => b.saturating_sub(a),
                _ => 0,
            };
            let (server_us, stubs_us) = cpu0.per_request_us(&cpu1, served);
            let client_us = ticks_per_request_us(client, served);
            Ok(Measurement { throughput, p50_us, p99_us, server_us, stubs_us, client_us })
        }
        _ => bail!(
            "{cmd:?} failed with {}:\n{}\n{}",
            out.status,
            tail(&stdout, 30),
            tail(&String::from_utf8_lossy(&out.stderr), 30)
        ),
    }
}

/// One equal-load run: the CPU per request over its steady part.
#[derive(Clone, Copy, Default)]
struct RateMeasurement {
    /// Requests per second the model served over the steady part.
    served_per_s: f64,
    server_us: f64,
    stubs_us: f64,
    /// The steady part's length, in seconds.
    window_s: f64,
}

impl RateMeasurement {
    fn mean(all: &[Self]) -> Self {
        let n = all.len().max(1) as f64;
        let avg = |f: fn(&Self) -> f64| all.iter().map(f).sum::<f64>() / n;
        Self {
            served_per_s: avg(|m| m.served_per_s),
            server_us: avg(|m| m.server_us),
            stubs_us: avg(|m| m.stubs_us),
            window_s: avg(|m| m.window_s),
        }
    }

    fn cpu_us(&self) -> f64 {
        self.server_us + self.stubs_us
    }
}

struct RateRow {
    model: &'static str,
    protocol: &'static str,
    rate: u32,
    tritium: RateMeasurement,
    triton: RateMeasurement,
}

impl RateRow {
    fn cpu_ratio(&self) -> f64 {
        self.tritium.cpu_us() / self.triton.cpu_us()
    }
    fn met(&self) -> bool {
        self.cpu_ratio() <= CPU_TARGET
    }
    fn missed(&self) -> Option<String> {
        (!self.met()).then(|| format!("{} {} {}/s CPU {:.2}x", self.model, self.protocol, self.rate, self.cpu_ratio()))
    }
}

fn rate_table(rows: &[RateRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<13} {:<5} {:>6} | {:>17} | {:>15} {:>15} {:>6} | {:<9}",
        "model", "proto", "rate/s", "served tri/Tri", "tritium CPU/rq", "Triton CPU/rq", "ratio", "<=0.5x"
    );
    let _ = writeln!(
        out,
        "{:<28}  (equal offered load; CPU/rq: server + stubs, microseconds per request, steady part only)",
        ""
    );
    let _ = writeln!(out, "{}", "-".repeat(96));
    for r in rows {
        let (t, n) = (r.tritium, r.triton);
        let cpu = |m: &RateMeasurement| format!("{:.0} + {:.0}", m.server_us, m.stubs_us);
        let _ = writeln!(
            out,
            "{:<13} {:<5} {:>6} | {:>17} | {:>15} {:>15} {:>5.2}x | {:<9}",
            r.model,
            r.protocol,
            r.rate,
            format!("{:.0} / {:.0}", t.served_per_s, n.served_per_s),
            cpu(&t),
            cpu(&n),
            r.cpu_ratio(),
            if r.met() { "met" } else { "MISSED" },
        );
    }
    out
}

/// One sample of an equal-load run.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    cpu: TreeCpu,
    served: u64,
}

/// The steady part of an equal-load run: the samples from [`RATE_WARMUP`] after the request
/// count first rose to its last rise (indices into `samples`); `None` when there is too little.
fn steady_part(samples: &[Sample], warmup: Duration) -> Option<(usize, usize)> {
    let rising = |i: &usize| samples[*i].served > samples[*i - 1].served;
    let first = (1..samples.len()).find(rising)?;
    let last = (1..samples.len()).rev().find(rising)?;
    // The sample before the first rise is when serving began, at the latest.
    let begun = samples[first - 1].at;
    let start = (first..=last).find(|&i| samples[i].at >= begun + warmup)?;
    (last > start).then_some((start, last))
}

/// Runs perf_analyzer at a fixed request rate against `server` and measures the CPU its processes
/// spend per request over the steady part of the run.
fn measure_rate(
    perf_analyzer: &Path,
    server: &Server,
    model: &str,
    shape: Option<&str>,
    protocol: &str,
    rate: u32,
) -> Result<RateMeasurement> {
    let port = if protocol == "grpc" { server.grpc_port() } else { server.http_port() };
    let mut cmd = Command::new(perf_analyzer);
    cmd.args(["-m", model, "-i", protocol, "-u", &format!("127.0.0.1:{port}")])
        .arg("--request-rate-range")
        .arg(format!("{rate}:{rate}"))
        .arg("--measurement-interval")
        .arg(MEASUREMENT_MS.to_string())
        .arg("--stability-percentage")
        .arg(STABILITY_PERCENT.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(shape) = shape {
        cmd.args(["--shape", shape]);
    }
    let sample = || Sample {
        at: Instant::now(),
        cpu: TreeCpu::of(server.pid()),
        served: inference_count(server.http_port(), model).unwrap_or(0),
    };
    let mut child = cmd.spawn().with_context(|| format!("cannot run {cmd:?}"))?;
    // Its output is small; read it on threads so that a full pipe never stalls it.
    let mut stdout = child.stdout.take().context("perf_analyzer's stdout")?;
    let mut stderr = child.stderr.take().context("perf_analyzer's stderr")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut samples = vec![sample()];
    let status = loop {
        std::thread::sleep(SAMPLE_EVERY);
        samples.push(sample());
        if let Some(status) = child.try_wait()? {
            break status;
        }
    };
    let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    if !status.success() {
        bail!("{cmd:?} failed with {status}:\n{}\n{}", tail(&stdout, 30), tail(&stderr, 30));
    }
    let (a, b) = steady_part(&samples, RATE_WARMUP)
        .with_context(|| format!("no steady part in the run of {cmd:?}:\n{}", tail(&stdout, 30)))?;
    let (first, last) = (samples[a], samples[b]);
    let served = last.served - first.served;
    let window = last.at - first.at;
    let (server_us, stubs_us) = first.cpu.per_request_us(&last.cpu, served);
    Ok(RateMeasurement {
        served_per_s: served as f64 / window.as_secs_f64(),
        server_us,
        stubs_us,
        window_s: window.as_secs_f64(),
    })
}

/// Reads throughput and p50/p99 latency from the first `Client:` block.
fn parse_perf(stdout: &str) -> Option<(f64, u64, u64)> {
    let client = &stdout[stdout.find("Client:")?..];
    let value = |key: &str| -> Option<f64> {
        let line = client.lines().find(|l| l.trim_start().starts_with(key))?;
        line.trim_start()[key.len()..].split_whitespace().next()?.parse().ok()
    };
    Some((value("Throughput:")?, value("p50 latency:")? as u64, value("p99 latency:")? as u64))
}

/// Copies a directory tree of plain files, skipping Python caches.
/// `text` with the value after `key` (up to the end of its line) replaced by `value`; `None`
/// when `key` is not there.
fn set_value(text: &str, key: &str, value: &str) -> Option<String> {
    let start = text.find(key)? + key.len();
    let end = text[start..].find('\n').map_or(text.len(), |e| start + e);
    Some(format!("{}{value}{}", &text[..start], &text[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_part_starts_after_the_warm_up_and_ends_at_the_last_request() {
        let t0 = Instant::now();
        let at = |ms: u64, served: u64| Sample { at: t0 + Duration::from_millis(ms), cpu: TreeCpu::default(), served };
        // Idle, then serving from about 500 ms until 3,000 ms, then idle.
        let samples =
            [at(0, 0), at(250, 0), at(500, 0), at(750, 50), at(1000, 100), at(1500, 200), at(2000, 300), at(2500, 400)];
        let tail = [at(3000, 500), at(3250, 500), at(3500, 500)];
        let all: Vec<Sample> = samples.iter().chain(&tail).copied().collect();
        // Serving began by 500 ms; a second later is the sample at 1,500 ms; the last rise at 3,000.
        assert_eq!(steady_part(&all, Duration::from_secs(1)), Some((5, 8)));
        // Too short a run has no steady part.
        assert_eq!(steady_part(&all[..6], Duration::from_secs(1)), None);
        assert_eq!(steady_part(&all[..2], Duration::from_secs(1)), None);
    }

    #[test]
    fn parses_perf_analyzer_summary() {
        let out = "*** Measurement Settings ***\n\nRequest concurrency: 2\n  Client: \n    Request count: 2046\n    Throughput: 340.967 infer/sec\n    p50 latency: 5432 usec\n    p90 latency: 6000 usec\n    p95 latency: 6100 usec\n    p99 latency: 7001 usec\n  Server: \n    Inference count: 2046\n";
        assert_eq!(parse_perf(out), Some((340.967, 5432, 7001)));
        assert!(parse_perf("no summary").is_none());
    }

    #[test]
    fn sets_a_config_value_to_the_end_of_its_line() {
        let config = "dynamic_batching {\n  max_queue_delay_microseconds: 2000\n}\n";
        assert_eq!(
            set_value(config, "max_queue_delay_microseconds:", " 100").as_deref(),
            Some("dynamic_batching {\n  max_queue_delay_microseconds: 100\n}\n")
        );
        assert_eq!(set_value("x: 1", "x:", " 2").as_deref(), Some("x: 2"));
        assert!(set_value(config, "preferred_batch_size:", " 4").is_none());
    }
}
