//! `cargo xtask bench serve`: perf_analyzer against tritium and Triton's own server on `add_sub`.
//!
//! Both servers serve the same temporary repository holding a copy of `examples/models/add_sub`.
//! Triton 2.51 with its Python backend comes from the `nvidia-pytriton` wheel, installed on demand
//! into `.venv-triton` (the wheel bundles `tritonserver` and its Python backend: the only Triton
//! that installs from a package registry, without Docker). Both run for the whole benchmark. For each protocol (gRPC, HTTP) and concurrency
//! (1, 2, 4, 8) perf_analyzer measures them in the order A B B A (which one is A alternates), and
//! each server's two results are averaged, so that drift on a noisy machine hits both alike; only
//! the ratios are meaningful, and only when nothing else runs (the load average is printed). The
//! targets: at concurrency 1 at least twice Triton's throughput, and at every concurrency more
//! throughput and a lower p99 latency.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{root, run, target_dir};

/// What `.venv-triton` gets; changing it reinstalls.
const TRITON_PACKAGES: &[&str] = &["nvidia-pytriton==0.7.0", "numpy"];
const MODEL: &str = "add_sub";
const CONCURRENCIES: [u32; 4] = [1, 2, 4, 8];
const PROTOCOLS: [&str; 2] = ["grpc", "http"];
/// perf_analyzer's window. Its stability rule (3 windows within 10% of each other) rarely holds on
/// a small, busy machine, and then it prints no result at all; so the rule is switched off
/// (`STABILITY_PERCENT`) and each measurement is the merge of its first 3 windows, about 7 s.
const MEASUREMENT_MS: u32 = 2000;
const STABILITY_PERCENT: u32 = 1000;
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs the benchmark; `setup()` and `build()` have run.
pub(crate) fn bench_serve() -> Result<()> {
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
    copy_dir(&root.join("examples/models").join(MODEL), &repo.0.join(MODEL))?;
    let logs = target.join("bench-serve");
    std::fs::create_dir_all(&logs)?;

    let [t_http, t_grpc, t_metrics, n_http, n_grpc, n_metrics] = free_ports::<6>()?;
    let tritium_cmd = tritium_command(&root, &tritium, &repo.0, [t_http, t_grpc, t_metrics]);
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
    let mut rows = Vec::new();
    for (i, (protocol, concurrency)) in
        PROTOCOLS.iter().flat_map(|p| CONCURRENCIES.iter().map(move |c| (*p, *c))).enumerate()
    {
        let order: [usize; 4] = if i % 2 == 0 { [0, 1, 1, 0] } else { [1, 0, 0, 1] };
        let mut results: [Vec<Measurement>; 2] = Default::default();
        for k in order {
            let s = &mut servers[k];
            s.check_alive()?;
            let url = format!("127.0.0.1:{}", if protocol == "grpc" { s.grpc_port } else { s.http_port });
            let m =
                perf(&perf_analyzer, protocol, &url, concurrency).with_context(|| format!("measuring {}", s.name))?;
            eprintln!(
                "xtask: {:<7} {protocol:<4} concurrency {concurrency}: {:>7.1}/s  p50 {:>5} us  p99 {:>6} us",
                s.name, m.throughput, m.p50_us, m.p99_us
            );
            results[k].push(m);
        }
        rows.push(Row {
            protocol,
            concurrency,
            tritium: Measurement::mean(&results[0]),
            triton: Measurement::mean(&results[1]),
        });
    }
    for s in &mut servers {
        s.check_alive()?;
    }
    drop(servers);

    println!("{}", table(&rows));
    let missed = rows.iter().filter(|r| !r.throughput_met() || !r.p99_met()).count();
    if missed == 0 {
        println!("all targets met");
    } else {
        println!("targets missed in {missed} of {} configurations", rows.len());
    }
    println!(
        "took {:.0?}; load average {load_before} before measuring, {} after (server logs in {})",
        started.elapsed(),
        load_average(),
        logs.display()
    );
    Ok(())
}

/// `tritium serve` on `repo` at the HTTP, gRPC and metrics `ports`.
pub(crate) fn tritium_command(root: &Path, tritium: &Path, repo: &Path, ports: [u16; 3]) -> Command {
    let [http, grpc, metrics] = ports;
    let mut cmd = Command::new(tritium);
    cmd.current_dir(root).arg("serve").arg("--model-repository").arg(repo).args([
        "--http-port",
        &http.to_string(),
        "--grpc-port",
        &grpc.to_string(),
        "--metrics-port",
        &metrics.to_string(),
    ]);
    cmd
}

/// Triton's `tritonserver` from `.venv-triton` on `repo` at the HTTP, gRPC and metrics `ports`.
pub(crate) fn triton_command(root: &Path, triton: &TritonEnv, repo: &Path, ports: [u16; 3]) -> Command {
    let [http, grpc, metrics] = ports;
    let mut cmd = Command::new(triton.tree.join("bin/tritonserver"));
    cmd.current_dir(root)
        .env(
            "LD_LIBRARY_PATH",
            join_paths(
                [triton.libs.as_os_str(), triton.python_libdir.as_os_str()],
                std::env::var_os("LD_LIBRARY_PATH"),
            ),
        )
        .env("PATH", join_paths([triton.venv_bin.as_os_str()], std::env::var_os("PATH")))
        .arg(format!("--model-repository={}", repo.display()))
        .arg(format!("--backend-directory={}", triton.tree.join("backends").display()))
        .arg(format!("--cache-directory={}", triton.tree.join("caches").display()))
        .args(["--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"])
        .arg(format!("--http-port={http}"))
        .arg(format!("--grpc-port={grpc}"))
        .arg(format!("--metrics-port={metrics}"));
    cmd
}

/// One perf_analyzer measurement.
#[derive(Clone, Copy)]
struct Measurement {
    throughput: f64,
    p50_us: u64,
    p99_us: u64,
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
        }
    }
}

struct Row {
    protocol: &'static str,
    concurrency: u32,
    tritium: Measurement,
    triton: Measurement,
}

impl Row {
    fn throughput_ratio(&self) -> f64 {
        self.tritium.throughput / self.triton.throughput
    }
    fn p99_ratio(&self) -> f64 {
        self.tritium.p99_us as f64 / self.triton.p99_us as f64
    }
    /// At concurrency 1 tritium must reach twice Triton's throughput, elsewhere exceed it.
    fn throughput_met(&self) -> bool {
        let ratio = self.throughput_ratio();
        if self.concurrency == 1 {
            ratio >= 2.0
        } else {
            ratio > 1.0
        }
    }
    fn p99_met(&self) -> bool {
        self.tritium.p99_us < self.triton.p99_us
    }
}

fn table(rows: &[Row]) -> String {
    let yes_no = |b: bool| if b { "yes" } else { "NO" };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5} {:>4} | {:>10} {:>10} {:>6} | {:>15} {:>15} {:>6} | {:<12} {:<8}",
        "proto",
        "conc",
        "tritium/s",
        "Triton/s",
        "ratio",
        "tritium p50/99",
        "Triton p50/99",
        "p99 x",
        "thr target",
        "p99 < Triton"
    );
    let _ = writeln!(out, "{}", "-".repeat(112));
    for r in rows {
        let (t, n) = (r.tritium, r.triton);
        let target = if r.concurrency == 1 { ">=2x" } else { ">1x" };
        let _ = writeln!(
            out,
            "{:<5} {:>4} | {:>10.1} {:>10.1} {:>5.2}x | {:>15} {:>15} {:>5.2}x | {:<12} {:<8}",
            r.protocol,
            r.concurrency,
            t.throughput,
            n.throughput,
            r.throughput_ratio(),
            format!("{}/{} us", t.p50_us, t.p99_us),
            format!("{}/{} us", n.p50_us, n.p99_us),
            r.p99_ratio(),
            format!("{target} {}", yes_no(r.throughput_met())),
            yes_no(r.p99_met()),
        );
    }
    out
}

/// Runs perf_analyzer at one concurrency and parses its client-side summary.
fn perf(perf_analyzer: &Path, protocol: &str, url: &str, concurrency: u32) -> Result<Measurement> {
    let mut cmd = Command::new(perf_analyzer);
    cmd.args(["-m", MODEL, "-i", protocol, "-u", url])
        .arg("--concurrency-range")
        .arg(concurrency.to_string())
        .arg("--measurement-interval")
        .arg(MEASUREMENT_MS.to_string())
        .arg("--stability-percentage")
        .arg(STABILITY_PERCENT.to_string());
    let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed = parse_perf(&stdout);
    match (out.status.success(), parsed) {
        (true, Some(m)) => Ok(m),
        _ => bail!(
            "{cmd:?} failed with {}:\n{}\n{}",
            out.status,
            tail(&stdout, 30),
            tail(&String::from_utf8_lossy(&out.stderr), 30)
        ),
    }
}

/// Reads throughput and p50/p99 latency from the first `Client:` block.
fn parse_perf(stdout: &str) -> Option<Measurement> {
    let client = &stdout[stdout.find("Client:")?..];
    let value = |key: &str| -> Option<f64> {
        let line = client.lines().find(|l| l.trim_start().starts_with(key))?;
        line.trim_start()[key.len()..].split_whitespace().next()?.parse().ok()
    };
    Some(Measurement {
        throughput: value("Throughput:")?,
        p50_us: value("p50 latency:")? as u64,
        p99_us: value("p99 latency:")? as u64,
    })
}

/// The 1-minute load average: anything else running skews the numbers of both servers.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A server started for the benchmark; dropping it stops it (SIGTERM, then SIGKILL) and reaps it.
pub(crate) struct Server {
    name: &'static str,
    child: Child,
    log: PathBuf,
    http_port: u16,
    grpc_port: u16,
}

impl Server {
    pub(crate) fn start(
        name: &'static str,
        mut cmd: Command,
        log: &Path,
        http_port: u16,
        grpc_port: u16,
    ) -> Result<Self> {
        let file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
        eprintln!("xtask: {cmd:?}");
        let child = cmd.spawn().with_context(|| format!("cannot start {name}: {cmd:?}"))?;
        Ok(Self { name, child, log: log.to_owned(), http_port, grpc_port })
    }

    pub(crate) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited with {status}; last lines of {}:\n{}", self.name, self.log.display(), self.log_tail());
        }
        Ok(())
    }

    pub(crate) fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            if http_status(self.http_port, "/v2/health/ready") == Some(200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not ready after {READY_TIMEOUT:?}; last lines of {}:\n{}",
                    self.name,
                    self.log.display(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its name, as printed.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Its gRPC port.
    pub(crate) fn grpc_port(&self) -> u16 {
        self.grpc_port
    }

    fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 20)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("xtask: {} did not stop within 15 s of SIGTERM; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status code of a plain HTTP/1.0 GET, or `None` when there is no answer yet.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").ok()?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match s.read(&mut buf[n..]).ok()? {
            0 => break,
            k => n += k,
        }
    }
    std::str::from_utf8(&buf[..n]).ok()?.split_whitespace().nth(1)?.parse().ok()
}

/// `N` distinct free ports on 127.0.0.1 (all listeners are held until every port is picked).
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (p, l) in ports.iter_mut().zip(&listeners) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

fn join_paths<'a>(
    first: impl IntoIterator<Item = &'a std::ffi::OsStr>,
    rest: Option<std::ffi::OsString>,
) -> std::ffi::OsString {
    let mut parts: Vec<PathBuf> = first.into_iter().map(PathBuf::from).collect();
    if let Some(rest) = rest {
        parts.extend(std::env::split_paths(&rest));
    }
    std::env::join_paths(parts).unwrap_or_default()
}

/// A directory removed (with its contents) on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(prefix: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies a directory tree of plain files, skipping Python caches.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "__pycache__" {
            continue;
        }
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &to.join(&name))?;
        } else {
            std::fs::copy(entry.path(), to.join(&name))
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Where the pieces of Triton live once `.venv-triton` is set up.
pub(crate) struct TritonEnv {
    /// `bin/tritonserver`, `backends/python` (with the stub for this Python), `caches`.
    tree: PathBuf,
    /// `site-packages/nvidia_pytriton.libs`: the shared libraries tritonserver needs.
    libs: PathBuf,
    /// The interpreter's `LIBDIR`, so that the stub loads this Python's libpython.
    python_libdir: PathBuf,
    /// The venv's `bin`, first on the stub's `PATH` so that it imports numpy from the venv.
    venv_bin: PathBuf,
}

/// Creates `.venv-triton` with nvidia-pytriton if needed and assembles the server tree.
pub(crate) fn triton_env(root: &Path) -> Result<TritonEnv> {
    let venv = root.join(".venv-triton");
    let py = venv.join("bin/python");
    if !py.exists() {
        let base = std::env::var("TRITIUM_BASE_PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(&base).args(["-m", "venv"]).arg(&venv))?;
    }
    let stamp = venv.join(".tritium-bench-packages");
    let wanted = TRITON_PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        run(Command::new(&py)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(TRITON_PACKAGES))?;
        std::fs::write(&stamp, &wanted)?;
    }
    // Locates pytriton without importing it (its import pulls in much more than the server).
    let probe = r#"
import importlib.util, sys, sysconfig
print(importlib.util.find_spec("pytriton").submodule_search_locations[0])
print(sysconfig.get_config_var("LIBDIR"))
print(f"{sys.version_info[0]}.{sys.version_info[1]}")
"#;
    let out = Command::new(&py).args(["-c", probe]).output().context("running .venv-triton's python")?;
    if !out.status.success() {
        bail!("locating pytriton in {} failed: {}", venv.display(), String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    let [pytriton, libdir, version] = text.lines().collect::<Vec<_>>()[..] else {
        bail!("unexpected probe output {text:?}")
    };
    let pytriton = PathBuf::from(pytriton);
    let server = pytriton.join("tritonserver");
    let libs = pytriton.parent().context("pytriton has no parent directory")?.join("nvidia_pytriton.libs");
    let stub = server.join("python_backend_stubs").join(version).join("triton_python_backend_stub");
    if !stub.exists() {
        bail!("nvidia-pytriton has no Python backend stub for Python {version} ({} is missing)", stub.display());
    }

    let tree = venv.join("tree");
    if !tree.join("backends/python/triton_python_backend_stub").exists() {
        let tmp = venv.join("tree.tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        for part in ["bin", "backends", "caches"] {
            run(Command::new("cp").arg("-a").arg(server.join(part)).arg(tmp.join(part)))?;
        }
        std::fs::copy(&stub, tmp.join("backends/python/triton_python_backend_stub"))
            .context("copying the Python backend stub")?;
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::rename(&tmp, &tree)?;
    }
    Ok(TritonEnv { tree, libs, python_libdir: PathBuf::from(libdir), venv_bin: venv.join("bin") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perf_analyzer_summary() {
        let out = "*** Measurement Settings ***\n\nRequest concurrency: 2\n  Client: \n    Request count: 2046\n    Throughput: 340.967 infer/sec\n    p50 latency: 5432 usec\n    p90 latency: 6000 usec\n    p95 latency: 6100 usec\n    p99 latency: 7001 usec\n  Server: \n    Inference count: 2046\n";
        let m = parse_perf(out).expect("parsed");
        assert_eq!((m.throughput, m.p50_us, m.p99_us), (340.967, 5432, 7001));
        assert!(parse_perf("no summary").is_none());
    }
}
