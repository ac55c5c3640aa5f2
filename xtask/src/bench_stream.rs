//! `cargo xtask bench stream`: decoupled streaming, tritium against Triton 2.51.
//!
//! Both servers serve the same temporary repository holding one decoupled model, `bench_stream`,
//! which answers a request with N small responses (one INT32 each, N = 1,000) sent from `execute`,
//! then the final flag alone. The client (`xtask/bench_stream_client.py`, tritonclient's gRPC
//! stream) sends one request at a time and timestamps each response as it reaches its callback.
//! Triton is the one `bench serve` runs (the `nvidia-pytriton` wheel in `.venv-triton`), and its
//! machinery is reused. The servers are measured in the order A B B A, and the figures of each
//! server's rounds are pooled: time to first response (median, p99), the gap between consecutive
//! responses (median, p99), the time of a whole 1,000-response stream (median), and the CPU time
//! per response of the server process and of its stub processes (all its descendants), read from
//! `/proc` before and after each round. The client is the same Python for both, so its share of
//! each latency is the same; only the ratios are meaningful, and only when nothing else runs.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::servers::{free_ports, load_average, tail, tritium_command, triton_command, triton_env, Server, TempDir};
use crate::{root, target_dir};

const MODEL: &str = "bench_stream";
const RESPONSES: u32 = 1000;
/// Measured streams per round; each server has two rounds.
const STREAMS: u32 = 10;
const WARMUP: u32 = 2;

const MODEL_PY: &str = r#"import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                out = pb_utils.Tensor("I", np.array([i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"#;

const CONFIG: &str = r#"name: "bench_stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"#;

/// Runs the benchmark; `setup()` and `build()` have run.
pub(crate) fn bench_stream() -> Result<()> {
    let started = Instant::now();
    let root = root();
    let target = target_dir();
    let python = root.join(".venv/bin/python");
    let client = root.join("xtask/bench_stream_client.py");
    let triton = triton_env(&root)?;

    let repo = TempDir::new("tritium-bench-stream")?;
    std::fs::create_dir_all(repo.0.join(MODEL).join("1"))?;
    std::fs::write(repo.0.join(MODEL).join("config.pbtxt"), CONFIG)?;
    std::fs::write(repo.0.join(MODEL).join("1/model.py"), MODEL_PY)?;
    let logs = target.join("bench-stream");
    std::fs::create_dir_all(&logs)?;

    let [t_http, t_grpc, t_metrics, n_http, n_grpc, n_metrics] = free_ports::<6>()?;
    let tritium = tritium_command(&root, &target.join("release/tritium"), &repo.0, [t_http, t_grpc, t_metrics]);
    let triton = triton_command(&root, &triton, &repo.0, [n_http, n_grpc, n_metrics]);
    let mut servers = [
        Server::start("tritium", tritium, &logs.join("tritium.log"), t_http, t_grpc)?,
        Server::start("Triton", triton, &logs.join("triton.log"), n_http, n_grpc)?,
    ];
    for s in &mut servers {
        s.wait_ready()?;
    }
    eprintln!("xtask: both servers ready after {:.0?}", started.elapsed());
    let tick_us = 1e6 / clock_ticks_per_second()?;

    let load_before = load_average();
    let mut pooled: [Pooled; 2] = Default::default();
    for k in [0, 1, 1, 0] {
        let s = &mut servers[k];
        s.check_alive()?;
        let before = cpu_ticks(s.pid());
        let run = run_client(&python, &client, s.grpc_port()).with_context(|| format!("measuring {}", s.name()))?;
        let after = cpu_ticks(s.pid());
        let p = &mut pooled[k];
        p.server_ticks += after.0.saturating_sub(before.0);
        p.stub_ticks += after.1.saturating_sub(before.1);
        p.responses += u64::from(STREAMS) * u64::from(RESPONSES);
        for stream in run {
            p.ttfr_us.push(stream.ttfr_us);
            p.total_us.push(stream.total_us);
            p.gaps_us.extend(stream.gaps_us);
        }
        eprintln!("xtask: {} round done", s.name());
    }
    for s in &mut servers {
        s.check_alive()?;
    }
    drop(servers);

    let [t, n] = pooled.map(|p| p.summary(tick_us));
    println!("{}", table(&t, &n));
    println!(
        "{} streams of {RESPONSES} responses per server; took {:.0?}; load average {load_before} before measuring, {} after (server logs in {})",
        2 * STREAMS,
        started.elapsed(),
        load_average(),
        logs.display()
    );
    Ok(())
}

/// One measured stream, as the client prints it.
struct Stream {
    ttfr_us: f64,
    gaps_us: Vec<f64>,
    total_us: f64,
}

/// Runs the client against the gRPC port and parses its JSON.
fn run_client(python: &Path, client: &Path, grpc_port: u16) -> Result<Vec<Stream>> {
    let mut cmd = Command::new(python);
    cmd.arg(client)
        .arg("--url")
        .arg(format!("127.0.0.1:{grpc_port}"))
        .args(["--model", MODEL])
        .arg("--streams")
        .arg(STREAMS.to_string())
        .arg("--responses")
        .arg(RESPONSES.to_string())
        .arg("--warmup")
        .arg(WARMUP.to_string());
    let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed with {}:\n{}", out.status, tail(&String::from_utf8_lossy(&out.stderr), 30));
    }
    parse_client(&String::from_utf8_lossy(&out.stdout))
}

fn parse_client(stdout: &str) -> Result<Vec<Stream>> {
    let value: serde_json::Value = serde_json::from_str(stdout.trim()).context("the client's JSON")?;
    let streams = value["streams"].as_array().context("no \"streams\" in the client's JSON")?;
    let number = |v: &serde_json::Value, key: &str| v[key].as_f64().with_context(|| format!("no {key:?}"));
    streams
        .iter()
        .map(|s| {
            let gaps = s["gaps_us"].as_array().context("no \"gaps_us\"")?;
            Ok(Stream {
                ttfr_us: number(s, "ttfr_us")?,
                gaps_us: gaps.iter().filter_map(serde_json::Value::as_f64).collect(),
                total_us: number(s, "total_us")?,
            })
        })
        .collect()
}

/// Everything one server's rounds measured.
#[derive(Default)]
struct Pooled {
    ttfr_us: Vec<f64>,
    gaps_us: Vec<f64>,
    total_us: Vec<f64>,
    server_ticks: u64,
    stub_ticks: u64,
    responses: u64,
}

/// One server's figures.
struct Summary {
    ttfr_p50: f64,
    ttfr_p99: f64,
    gap_p50: f64,
    gap_p99: f64,
    total_p50: f64,
    server_cpu_us: f64,
    stub_cpu_us: f64,
}

impl Pooled {
    fn summary(mut self, tick_us: f64) -> Summary {
        let per_response = |ticks: u64| ticks as f64 * tick_us / self.responses.max(1) as f64;
        Summary {
            ttfr_p50: percentile(&mut self.ttfr_us, 50.0),
            ttfr_p99: percentile(&mut self.ttfr_us, 99.0),
            gap_p50: percentile(&mut self.gaps_us, 50.0),
            gap_p99: percentile(&mut self.gaps_us, 99.0),
            total_p50: percentile(&mut self.total_us, 50.0),
            server_cpu_us: per_response(self.server_ticks),
            stub_cpu_us: per_response(self.stub_ticks),
        }
    }
}

/// The nearest-rank percentile `p` of `values` (sorted in place); NaN when empty.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

fn table(t: &Summary, n: &Summary) -> String {
    let rows: [(&str, f64, f64); 7] = [
        ("time to first response p50 (us)", t.ttfr_p50, n.ttfr_p50),
        ("time to first response p99 (us)", t.ttfr_p99, n.ttfr_p99),
        ("inter-response p50 (us)", t.gap_p50, n.gap_p50),
        ("inter-response p99 (us)", t.gap_p99, n.gap_p99),
        ("1,000-response stream p50 (us)", t.total_p50, n.total_p50),
        ("server CPU per response (us)", t.server_cpu_us, n.server_cpu_us),
        ("stub CPU per response (us)", t.stub_cpu_us, n.stub_cpu_us),
    ];
    let mut out = String::new();
    let _ = writeln!(out, "{:<34} {:>12} {:>12} {:>16}", "", "tritium", "Triton", "tritium/Triton");
    let _ = writeln!(out, "{}", "-".repeat(77));
    for (name, a, b) in rows {
        let _ = writeln!(out, "{name:<34} {a:>12.1} {b:>12.1} {:>15.2}x", a / b);
    }
    out
}

/// `getconf CLK_TCK`: the unit of the CPU times in `/proc/<pid>/stat`.
fn clock_ticks_per_second() -> Result<f64> {
    let out = Command::new("getconf").arg("CLK_TCK").output().context("running getconf CLK_TCK")?;
    String::from_utf8_lossy(&out.stdout).trim().parse().context("parsing getconf CLK_TCK")
}

/// CPU ticks (user + system) used so far by process `pid` itself and by all its living
/// descendants (the stubs).
fn cpu_ticks(pid: u32) -> (u64, u64) {
    let mut procs = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Some((ppid, ticks)) = std::fs::read_to_string(format!("/proc/{p}/stat")).ok().and_then(|s| stat(&s))
            {
                procs.push((p, ppid, ticks));
            }
        }
    }
    let own = procs.iter().find(|(p, ..)| *p == pid).map_or(0, |(.., t)| *t);
    let mut parents = vec![pid];
    let mut descendants = 0;
    while let Some(parent) = parents.pop() {
        for (p, ppid, ticks) in &procs {
            if *ppid == parent {
                descendants += ticks;
                parents.push(*p);
            }
        }
    }
    (own, descendants)
}

/// (ppid, utime + stime) from the text of `/proc/<pid>/stat`.
fn stat(text: &str) -> Option<(u32, u64)> {
    // The command name is in parentheses and may hold spaces: fields are counted after it.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_stat_with_spaces_in_the_name() {
        let text = "4242 (python -m x) S 4000 4242 4000 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 3 0 1 1 1";
        assert_eq!(stat(text), Some((4000, 281)));
        assert!(stat("garbage").is_none());
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), 50.0);
        assert_eq!(percentile(&mut v, 99.0), 99.0);
        assert!(percentile(&mut [], 50.0).is_nan());
    }

    #[test]
    fn parses_the_client_json() {
        let s =
            parse_client(r#"{"streams": [{"ttfr_us": 5.0, "gaps_us": [1.0, 2.0], "total_us": 9.5}]}"#).expect("parsed");
        assert_eq!((s[0].ttfr_us, s[0].gaps_us.clone(), s[0].total_us), (5.0, vec![1.0, 2.0], 9.5));
        assert!(parse_client("{}").is_err());
    }
}
