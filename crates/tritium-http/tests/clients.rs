//! The real clients against the HTTP frontend (over the echo mock): `tritonclient.http` and
//! `perf_analyzer -i http` from the project's `.venv` (made by `cargo xtask setup`). Each test
//! is skipped, saying so, when its client is not installed.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Mock;
use tritium_http::Options;

fn venv_bin(name: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin").join(name);
    p.exists().then_some(p)
}

fn python_with_tritonclient() -> Option<PathBuf> {
    let py = std::env::var_os("TRITIUM_PYTHON").map(PathBuf::from).or_else(|| venv_bin("python"))?;
    let ok = Command::new(&py).args(["-c", "import tritonclient.http, numpy"]).output().ok()?.status.success();
    ok.then_some(py)
}

/// Runs the frontend on an ephemeral port for the duration of `f`.
fn with_server<T>(f: impl FnOnce(u16) -> T) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(tritium_http::serve_with(listener, Arc::new(Mock::default()), Options::default(), async {
        let _ = rx.await;
    }));
    let out = f(port);
    tx.send(()).unwrap();
    rt.block_on(server).unwrap().unwrap();
    out
}

/// Runs a command with a deadline, killing it when the deadline passes.
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn tritonclient_http() {
    let Some(py) = python_with_tritonclient() else {
        skip_unless_required("no Python with tritonclient (run `cargo xtask setup`)");
        return;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/tritonclient_check.py");
    let out = with_server(|port| run(Command::new(py).arg(script).arg(port.to_string()), Duration::from_secs(120)));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("OK"), "{}", show(&out));
}

#[test]
fn perf_analyzer_http() {
    let Some(perf) = venv_bin("perf_analyzer") else {
        skip_unless_required("no perf_analyzer (run `cargo xtask setup`)");
        return;
    };
    let out = with_server(|port| {
        run(
            Command::new(perf).args([
                "-m",
                "perf",
                "-u",
                &format!("127.0.0.1:{port}"),
                "-i",
                "http",
                "-b",
                "2",
                "--shape",
                "IN:16",
                "--concurrency-range",
                "2",
                "--measurement-mode",
                "count_windows",
                "--measurement-request-count",
                "100",
                "--stability-percentage",
                "1000",
                "--max-trials",
                "10",
            ]),
            Duration::from_secs(120),
        )
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("Throughput"), "{}", show(&out));
    // The server-side section comes from the statistics extension.
    assert!(stdout.contains("Server:") && stdout.contains("Inference count:"), "{}", show(&out));
    eprintln!("{stdout}");
}

/// Skips a test whose prerequisite is missing, or fails it when `TRITIUM_REQUIRE_ALL` is set (as
/// in CI), so a missing prerequisite there is never counted as a pass.
fn skip_unless_required(why: &str) {
    assert!(std::env::var_os("TRITIUM_REQUIRE_ALL").is_none(), "prerequisite missing: {why}");
    eprintln!("skipped: {why}");
}
