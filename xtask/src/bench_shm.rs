//! `cargo xtask bench shm`: perf_analyzer with `--shared-memory system` against tritium and
//! Triton 2.51 (from `.venv-triton`, as `bench serve` sets it up) on a model with two 4 MiB FP32
//! inputs and two 4 MiB FP32 outputs that it computes as new arrays, as real models do
//! (`OUT0 = IN0 + IN1`, `OUT1 = IN0 - IN1`): a model that returned its inputs would hide what
//! fresh output memory costs.
//!
//! Both servers run for the whole benchmark; for each protocol and concurrency (1, 2)
//! perf_analyzer measures them in the order A B B A and averages each server's two results, as
//! `bench serve` does. Besides throughput it prints the CPU time per request of each server's
//! whole process tree (server and stubs, from /proc), the minor page faults per request of the
//! server and of its stubs (target: under 10 each in steady state; tritium starts stubs with
//! glibc allocator settings for that, see `tritium_host::STUB_MALLOC_DEFAULTS`; run the
//! benchmark with any `MALLOC_*` variable set, e.g. `MALLOC_ARENA_MAX=8`, to see glibc's own
//! defaults instead), and the bytes copied per request by
//! design: tritium hands the inputs to the model without a copy and the stub writes each output
//! once into the client's region (8 MiB: the model's own result, nothing more); Triton copies
//! each input from the region into its Python backend's memory and each output twice (stub to
//! Triton, Triton to the region), 24 MiB. The target: at least 5x Triton's throughput.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::procstat::{inference_count, TreeCpu};
use crate::servers::{free_ports, load_average, tail, tritium_command, triton_command, triton_env, Server, TempDir};
use crate::{root, target_dir};

const MODEL: &str = "shm_passthrough";
/// Elements per tensor: 4 MiB of FP32.
const ELEMENTS: usize = 1 << 20;
const TENSOR_BYTES: u64 = (ELEMENTS * 4) as u64;
const CONCURRENCIES: [u32; 2] = [1, 2];
const PROTOCOLS: [&str; 2] = ["grpc", "http"];
const MEASUREMENT_MS: u32 = 2000;
const TARGET_RATIO: f64 = 5.0;
/// The target with the tensors in the request and response bodies.
const BODY_TARGET_RATIO: f64 = 2.0;
/// How the tensors travel: in system shared memory, or in the bodies.
const TRANSPORTS: [bool; 2] = [true, false];
/// Minor page faults per request, each of the server and its stubs, in steady state.
const FAULT_TARGET: f64 = 10.0;

const CONFIG: &str = r#"name: "shm_passthrough"
backend: "python"
max_batch_size: 0
input [
  { name: "IN0" data_type: TYPE_FP32 dims: [ 1048576 ] },
  { name: "IN1" data_type: TYPE_FP32 dims: [ 1048576 ] }
]
output [
  { name: "OUT0" data_type: TYPE_FP32 dims: [ 1048576 ] },
  { name: "OUT1" data_type: TYPE_FP32 dims: [ 1048576 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
"#;

const MODEL_PY: &str = r#"import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "IN1").as_numpy()
            out0, out1 = a + b, a - b
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT0", out0), pb_utils.Tensor("OUT1", out1)]))
        return responses
"#;

/// One perf_analyzer measurement and what the server's processes spent on it.
#[derive(Clone, Copy, Default)]
struct Measurement {
    throughput: f64,
    p50_us: u64,
    /// CPU milliseconds of the server's process tree per request served.
    cpu_ms_per_request: f64,
    /// Minor page faults per request of the server process and of its stubs.
    server_faults: f64,
    stub_faults: f64,
}

impl Measurement {
    fn mean(all: &[Self]) -> Self {
        let n = all.len().max(1) as f64;
        let avg = |f: fn(&Self) -> f64| all.iter().map(f).sum::<f64>() / n;
        Self {
            throughput: avg(|m| m.throughput),
            p50_us: avg(|m| m.p50_us as f64).round() as u64,
            cpu_ms_per_request: avg(|m| m.cpu_ms_per_request),
            server_faults: avg(|m| m.server_faults),
            stub_faults: avg(|m| m.stub_faults),
        }
    }
}

/// Runs the benchmark; `setup()` and `build()` have run.
pub(crate) fn bench_shm() -> Result<()> {
    let started = Instant::now();
    let root = root();
    let target = target_dir();
    let perf_analyzer = root.join(".venv/bin/perf_analyzer");
    if !perf_analyzer.exists() {
        bail!("{} is missing (see `cargo xtask setup`)", perf_analyzer.display());
    }
    let triton = triton_env(&root)?;
    let repo = TempDir::new("tritium-bench-shm")?;
    let dir = repo.0.join(MODEL);
    std::fs::create_dir_all(dir.join("1"))?;
    std::fs::write(dir.join("config.pbtxt"), CONFIG)?;
    std::fs::write(dir.join("1/model.py"), MODEL_PY)?;
    let logs = target.join("bench-shm");
    std::fs::create_dir_all(&logs)?;

    let [t_http, t_grpc, t_metrics, n_http, n_grpc, n_metrics] = free_ports::<6>()?;
    let tritium_cmd = tritium_command(&root, &target.join("release/tritium"), &repo.0, [t_http, t_grpc, t_metrics]);
    let triton_cmd = triton_command(&root, &triton, &repo.0, [n_http, n_grpc, n_metrics]);
    let mut servers = [
        Server::start("tritium", tritium_cmd, &logs.join("tritium.log"), t_http, t_grpc)?,
        Server::start("Triton", triton_cmd, &logs.join("triton.log"), n_http, n_grpc)?,
    ];
    for s in &mut servers {
        s.wait_ready()?;
    }
    let http_ports = [t_http, n_http];
    let load_before = load_average();
    let mut rows = Vec::new();
    let cases = TRANSPORTS
        .iter()
        .flat_map(|&shm| PROTOCOLS.iter().flat_map(move |p| CONCURRENCIES.iter().map(move |c| (shm, *p, *c))));
    for (i, (shm, protocol, concurrency)) in cases.enumerate() {
        let order: [usize; 4] = if i % 2 == 0 { [0, 1, 1, 0] } else { [1, 0, 0, 1] };
        let mut results: [Vec<Measurement>; 2] = Default::default();
        for k in order {
            let s = &mut servers[k];
            s.check_alive()?;
            let port = if protocol == "grpc" { s.grpc_port() } else { http_ports[k] };
            let url = format!("127.0.0.1:{port}");
            let m = measure(&perf_analyzer, protocol, &url, concurrency, shm, s.pid(), http_ports[k])
                .with_context(|| format!("measuring {}", s.name()))?;
            eprintln!(
                "xtask: {:<7} {protocol:<4} {:<6} concurrency {concurrency}: {:>6.1}/s  p50 {:>6} us  {:>6.2} CPU ms/request  \
                 faults/request: server {:.1}, stubs {:.1}",
                s.name(),
                via(shm),
                m.throughput,
                m.p50_us,
                m.cpu_ms_per_request,
                m.server_faults,
                m.stub_faults
            );
            results[k].push(m);
        }
        rows.push((shm, protocol, concurrency, Measurement::mean(&results[0]), Measurement::mean(&results[1])));
    }
    for s in &mut servers {
        s.check_alive()?;
    }
    drop(servers);

    for shm in TRANSPORTS {
        println!("tensors in {}:", if shm { "system shared memory" } else { "the request and response bodies" });
        println!("{}", table(&rows, shm));
    }
    println!("{}", faults_table(&rows));
    for shm in TRANSPORTS {
        let target = if shm { TARGET_RATIO } else { BODY_TARGET_RATIO };
        let ours: Vec<_> = rows.iter().filter(|r| r.0 == shm).collect();
        let missed = ours.iter().filter(|(_, _, _, t, n)| t.throughput < target * n.throughput).count();
        let what = format!("at least {target}x Triton's throughput with the tensors in {}", via(shm));
        if missed == 0 {
            println!("target met: {what}, everywhere");
        } else {
            println!("target missed in {missed} of {} configurations ({what})", ours.len());
        }
    }
    println!(
        "bytes copied per request by design: tritium {} MiB (inputs: none, the model's arrays are the client's \
         region; outputs: one write each, stub to region), Triton {} MiB (inputs into its backend's memory, \
         outputs stub to Triton and Triton to the region)",
        (2 * TENSOR_BYTES) >> 20,
        (6 * TENSOR_BYTES) >> 20
    );
    println!(
        "took {:.0?}; load average {load_before} before measuring, {} after (logs in {})",
        started.elapsed(),
        load_average(),
        logs.display()
    );
    Ok(())
}

/// Where the tensors travel, in a word.
fn via(shm: bool) -> &'static str {
    if shm {
        "shm"
    } else {
        "bodies"
    }
}

/// A run's rows, as the benchmark collects them: transport (shared memory?), protocol,
/// concurrency, tritium's and Triton's measurements.
type Row<'a> = (bool, &'a str, u32, Measurement, Measurement);

/// Throughput, latency and CPU per request of the rows with the tensors in shared memory
/// (`shm`) or in the bodies, against that transport's target.
fn table(rows: &[Row<'_>], shm: bool) -> String {
    let target = if shm { TARGET_RATIO } else { BODY_TARGET_RATIO };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5} {:>4} | {:>10} {:>10} {:>7} | {:>12} {:>12} | {:>14} {:>14} | {:<6}",
        "proto",
        "conc",
        "tritium/s",
        "Triton/s",
        "ratio",
        "tritium p50",
        "Triton p50",
        "tritium CPU/rq",
        "Triton CPU/rq",
        format!("{target}x")
    );
    let _ = writeln!(out, "{}", "-".repeat(112));
    for (_, protocol, concurrency, t, n) in rows.iter().filter(|r| r.0 == shm) {
        let ratio = t.throughput / n.throughput;
        let _ = writeln!(
            out,
            "{protocol:<5} {concurrency:>4} | {:>10.1} {:>10.1} {:>6.2}x | {:>9} us {:>9} us | {:>11.2} ms {:>11.2} ms | {:<6}",
            t.throughput,
            n.throughput,
            ratio,
            t.p50_us,
            n.p50_us,
            t.cpu_ms_per_request,
            n.cpu_ms_per_request,
            if ratio >= target { "yes" } else { "NO" }
        );
    }
    out
}

/// Minor page faults per request, server and stubs, against the target of fewer than 10 each.
fn faults_table(rows: &[Row<'_>]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<6} {:<5} {:>4} | {:>14} {:>14} | {:>14} {:>14} | {:<6}",
        "via", "proto", "conc", "tritium server", "tritium stubs", "Triton server", "Triton stubs", "<10"
    );
    let _ = writeln!(out, "{}", "-".repeat(89));
    for (shm, protocol, concurrency, t, n) in rows {
        let met = t.server_faults < FAULT_TARGET && t.stub_faults < FAULT_TARGET;
        let _ = writeln!(
            out,
            "{:<6} {protocol:<5} {concurrency:>4} | {:>14.1} {:>14.1} | {:>14.1} {:>14.1} | {:<6}",
            via(*shm),
            t.server_faults,
            t.stub_faults,
            n.server_faults,
            n.stub_faults,
            if met { "yes" } else { "NO" }
        );
    }
    out
}

/// One perf_analyzer run with the inputs and outputs in system shared memory (`shm`) or in the
/// request and response bodies, with the CPU time of the server's process tree and the requests
/// it served (from its statistics).
fn measure(
    perf_analyzer: &Path,
    protocol: &str,
    url: &str,
    concurrency: u32,
    shm: bool,
    pid: u32,
    http_port: u16,
) -> Result<Measurement> {
    let (cpu0, served0) = (TreeCpu::of(pid), inference_count(http_port, MODEL));
    let mut cmd = Command::new(perf_analyzer);
    cmd.args(["-m", MODEL, "-i", protocol, "-u", url]);
    if shm {
        cmd.args(["--shared-memory", "system"]).arg("--output-shared-memory-size").arg(TENSOR_BYTES.to_string());
    }
    cmd.arg("--concurrency-range")
        .arg(concurrency.to_string())
        .arg("--measurement-interval")
        .arg(MEASUREMENT_MS.to_string())
        .args(["--stability-percentage", "1000"]);
    let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
    let (cpu1, served1) = (TreeCpu::of(pid), inference_count(http_port, MODEL));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed = parse_perf(&stdout);
    let Some((throughput, p50_us)) = parsed.filter(|_| out.status.success()) else {
        bail!(
            "{cmd:?} failed with {}:\n{}\n{}",
            out.status,
            tail(&stdout, 30),
            tail(&String::from_utf8_lossy(&out.stderr), 30)
        );
    };
    let served = match (served0, served1) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let (server_us, stubs_us) = cpu0.per_request_us(&cpu1, served);
    let cpu_ms_per_request = (server_us + stubs_us) / 1000.0;
    let (server_faults, stub_faults) = cpu0.faults_per_request(&cpu1, served);
    Ok(Measurement { throughput, p50_us, cpu_ms_per_request, server_faults, stub_faults })
}

/// Throughput and p50 latency from perf_analyzer's first `Client:` block.
fn parse_perf(stdout: &str) -> Option<(f64, u64)> {
    let client = &stdout[stdout.find("Client:")?..];
    let value = |key: &str| -> Option<f64> {
        let line = client.lines().find(|l| l.trim_start().starts_with(key))?;
        line.trim_start()[key.len()..].split_whitespace().next()?.parse().ok()
    };
    Some((value("Throughput:")?, value("p50 latency:")? as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perf_analyzer() {
        let out = "Request concurrency: 1\n  Client: \n    Request count: 20\n    Throughput: 71.5 infer/sec\n    p50 latency: 13000 usec\n";
        assert_eq!(parse_perf(out), Some((71.5, 13000)));
        assert!(parse_perf("nothing").is_none());
    }
}
