//! `cargo xtask`: setting up the Python environment, building the stub's native module, running
//! the whole test suite, and the benchmarks.
//!
//! - `cargo xtask setup`: creates `.venv` (from `$TRITIUM_BASE_PYTHON` or `python3`) with the
//!   packages in `python/requirements-dev.txt` and `python/requirements-frameworks.txt` (onnx,
//!   onnxruntime, torch), and perf_analyzer (for `test` and `bench`).
//! - `cargo xtask build`: builds the `tritium` binary and `tritium._native` (release), placing the
//!   native module into `python/tritium/`.
//! - `cargo xtask serve [FLAGS]`: `.venv` with what serving needs (`python/requirements-serve.txt`:
//!   numpy, and tritonclient for the example clients; no perf_analyzer or CUDA runtime), build,
//!   then `tritium serve` on `examples/models`.
//! - `cargo xtask lint`: `cargo fmt --check`, clippy with `-D warnings`, `ruff check` and
//!   `ruff format --check`.
//! - `cargo xtask test`: setup, lint, build, `cargo test --workspace`, then the Python tests.
//! - `cargo xtask bench ipc`: the IPC benchmark (floor, stub round trips, memcpy).
//! - `cargo xtask bench serve [FLAGS]`: perf_analyzer against tritium and Triton 2.51 serving add_sub
//!   (FLAGS go to `tritium serve`, e.g. `--stub-spin-us 0 --runtime-spin-us 0`).
//! - `cargo xtask bench stream`: decoupled streams of 1,000 responses, tritium against Triton 2.51.
//! - `cargo xtask bench shm`: perf_analyzer `--shared-memory system` with two 4 MiB inputs and
//!   outputs, tritium against Triton 2.51.
//! - `cargo xtask compare`: tritium and Triton 2.51 side by side on one repository, every answer
//!   that differs printed (`compare.rs`, `xtask/compare_triton.py`).
//! - `cargo xtask compat --triton-server DIR --python-backend DIR [MODEL...]`: Triton's own
//!   Python-backend test models (from local checkouts of triton-inference-server/server and
//!   /python_backend, copied at run time, never committed) run against tritium, each checked as
//!   its upstream test checks it; PASS or FAIL per model and a summary (`compat.rs`,
//!   `xtask/compat.py`).
//! - `cargo xtask gpu-check [--bundle]`: the GPU path end to end on a machine with a GPU, or a
//!   bundle to run it on one without cargo (`gpu_check.rs`, `xtask/gpu_check.sh`).
//! - `cargo xtask bench openai`: time to first token and tokens/s of the OpenAI frontend
//!   (examples/clients/openai_bench.py on tiny_llm with 1, 8 and 32 streams), and embeddings
//!   requests/s at concurrency 1 and 16 (tests/models/openai_embed).
//! - `cargo xtask bench fork [FLAGS]`: restart to ready, 16 instances to ready, PSS per
//!   instance, idle wake-ups, and the server's threads and PSS with 48 models (`bench_fork.rs`).
//! - `cargo xtask bench frameworks`: an ONNX MLP (512 -> 2048 -> 512) served by tritium's
//!   onnxruntime backend over gRPC at concurrency 1 and 16, against the same session in a loop
//!   and against Triton 2.51's Python backend running it from a `model.py` (`bench_frameworks.rs`,
//!   `xtask/bench_frameworks.py`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

mod layering;
mod module_dag;
mod tidy;

use anyhow::{bail, Context, Result};

mod bench_fork;
mod bench_frameworks;
mod bench_serve;
mod bench_shm;
mod bench_stream;
mod compare;
mod compat;
mod gpu_check;
mod procstat;
mod servers;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Cargo's target directory.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"))
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    check_program(cmd)?;
    let started = Instant::now();
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    TIMES.lock().unwrap_or_else(PoisonError::into_inner).push((label(cmd), started.elapsed()));
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// How long each command [`run`] ran took, in order: `cargo xtask test` prints them at its end,
/// so a slow CI run shows where its time went.
static TIMES: Mutex<Vec<(String, Duration)>> = Mutex::new(Vec::new());

/// A command's program name and its first words that are not paths or flags' values, e.g.
/// `cargo clippy`, `python -m pytest`.
fn label(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program()).file_name().unwrap_or_default().to_string_lossy().into_owned();
    let words = cmd.get_args().map(|a| a.to_string_lossy()).filter(|a| !a.contains('/')).take(3);
    std::iter::once(program.into()).chain(words).collect::<Vec<std::borrow::Cow<'_, str>>>().join(" ")
}

/// Prints [`TIMES`]: each command's seconds and the total.
fn print_times() {
    let times = TIMES.lock().unwrap_or_else(PoisonError::into_inner);
    let total: Duration = times.iter().map(|(_, d)| *d).sum();
    eprintln!("xtask: time per command ({:.0} s in all):", total.as_secs_f64());
    for (what, took) in times.iter() {
        eprintln!("xtask: {:>7.1} s  {what}", took.as_secs_f64());
    }
}

fn venv_python() -> PathBuf {
    root().join(".venv/bin/python")
}

/// Fails with what to run first when `cmd`'s program is a path that does not exist (a tool in
/// `.venv` on a fresh clone, a binary not built yet), instead of the spawn's bare "No such file
/// or directory".
fn check_program(cmd: &Command) -> Result<()> {
    let program = Path::new(cmd.get_program());
    if program.components().count() < 2 || program.exists() {
        return Ok(());
    }
    bail!("{}", missing_program(&root(), program))
}

/// The message for a program path that does not exist, saying which command makes it.
fn missing_program(root: &Path, program: &Path) -> String {
    let shown = program.strip_prefix(root).unwrap_or(program).display().to_string();
    let what = if program.starts_with(root.join(".venv")) {
        "run `cargo xtask setup` first: it creates .venv with the Python packages and tools the tests need"
    } else if program.starts_with(target_dir()) {
        "run `cargo xtask build` first"
    } else {
        "install it, or check the path"
    };
    format!("{shown} does not exist; {what}")
}

/// The interpreter for xtask's own scripts that need only the standard library (`dist_wheel.py`):
/// `.venv`'s when it exists, else `$TRITIUM_BASE_PYTHON` or `python3`, so they work on a fresh
/// clone.
fn script_python(root: &Path) -> PathBuf {
    let venv = root.join(".venv/bin/python");
    if venv.exists() {
        return venv;
    }
    std::env::var_os("TRITIUM_BASE_PYTHON").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("python3"))
}

/// Creates `.venv` if needed (from `$TRITIUM_BASE_PYTHON` or `python3`).
fn venv() -> Result<PathBuf> {
    let py = venv_python();
    if !py.exists() {
        let base = std::env::var("TRITIUM_BASE_PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(&base).args(["-m", "venv"]).arg(root().join(".venv")))?;
    }
    Ok(py)
}

/// Installs `python/<file>` into `.venv` unless the stamp says that exact text is installed; a
/// file named `*-nodeps.txt` is installed without its packages' dependencies.
fn install_requirements(py: &Path, file: &str, stamp: &str) -> Result<()> {
    let stamp = root().join(".venv").join(stamp);
    let req = root().join("python").join(file);
    let wanted = std::fs::read_to_string(&req).with_context(|| format!("reading {}", req.display()))?;
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        let mut cmd = Command::new(py);
        cmd.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]);
        if file.ends_with("-nodeps.txt") {
            cmd.arg("--no-deps");
        }
        run(cmd.arg("-r").arg(&req))?;
        std::fs::write(&stamp, wanted)?;
    }
    Ok(())
}

/// What `cargo xtask serve` needs: `.venv` with `python/requirements-serve.txt` (numpy, and
/// tritonclient for the example clients). No test tools: no perf_analyzer, no CUDA runtime.
fn setup_serve() -> Result<()> {
    let py = venv()?;
    install_requirements(&py, "requirements-serve.txt", ".tritium-requirements-serve")
}

/// Everything the tests and benchmarks need: `.venv` with `python/requirements-dev.txt` and
/// `python/requirements-frameworks.txt`, and perf_analyzer.
fn setup() -> Result<()> {
    let py = venv()?;
    install_requirements(&py, "requirements-dev.txt", ".tritium-requirements")?;
    install_requirements(&py, "requirements-nodeps.txt", ".tritium-requirements-nodeps")?;
    install_requirements(&py, "requirements-frameworks.txt", ".tritium-requirements-frameworks")?;
    setup_perf_analyzer(&py)
}

/// perf_analyzer for the tests and benchmarks: the `tritonclient==2.44.0` wheel is the last one
/// whose `perf_analyzer` runs on glibc 2.36; it needs `libb64.so.0d` (Debian's libb64-0d) and
/// `libcudart.so.12` (the `nvidia-cuda-runtime-cu12` wheel). Installed under `.venv/perf`, with a
/// wrapper at `.venv/bin/perf_analyzer`.
fn setup_perf_analyzer(py: &Path) -> Result<()> {
    let perf = root().join(".venv/perf");
    let wrapper = root().join(".venv/bin/perf_analyzer");
    if wrapper.exists() {
        return Ok(());
    }
    if !Path::new("/lib/x86_64-linux-gnu/libb64.so.0d").exists()
        && !Path::new("/usr/lib/x86_64-linux-gnu/libb64.so.0d").exists()
    {
        let install = || {
            Command::new("apt-get")
                .args(["install", "-y", "-q", "libb64-0d"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        if !install() {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
            if !install() {
                if require_all() {
                    bail!("cannot install libb64-0d (apt-get as root), which perf_analyzer needs");
                }
                eprintln!("xtask: cannot install libb64-0d (apt-get as root); perf_analyzer tests will be skipped");
                return Ok(());
            }
        }
    }
    let dl = perf.join("download");
    run(Command::new(py)
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(&dl)
        .arg("tritonclient==2.44.0"))?;
    run(Command::new(py)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target"])
        .arg(perf.join("cudart"))
        .arg("nvidia-cuda-runtime-cu12==12.9.79"))?;
    let extract = r#"
import pathlib, sys, zipfile
dl, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(dl.glob("tritonclient-2.44.0-*.whl"))
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/bin/perf_analyzer"))
    out.write_bytes(z.read(name))
out.chmod(0o755)
"#;
    run(Command::new(py).args(["-c", extract]).arg(&dl).arg(perf.join("perf_analyzer")))?;
    let script = format!(
        "#!/bin/sh\nLD_LIBRARY_PATH=\"{}:$LD_LIBRARY_PATH\" exec \"{}\" \"$@\"\n",
        perf.join("cudart/nvidia/cuda_runtime/lib").display(),
        perf.join("perf_analyzer").display()
    );
    std::fs::write(&wrapper, script)?;
    run(Command::new("chmod").arg("755").arg(&wrapper))?;
    Ok(())
}

/// Builds the stub's native module and places it next to the `tritium` package.
fn build() -> Result<()> {
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "tritium-native",
        "-p",
        "tritium",
    ]))?;
    let target = target_dir();
    let built = target.join("release/libtritium_native.so");
    let dest = root().join("python/tritium/_native.abi3.so");
    // Replace rather than overwrite: a running stub may have the old file mapped.
    let tmp = dest.with_extension("so.tmp");
    std::fs::copy(&built, &tmp).with_context(|| format!("copying {}", built.display()))?;
    std::fs::rename(&tmp, &dest)?;
    Ok(())
}

/// Builds the wheel `target/dist/tritium-<version>-py3-none-linux_<arch>.whl`: the `tritium`
/// package with its abi3 native module, `triton_python_backend_utils`, and the `tritium` binary
/// (without debug info) as a script, so `pip install` of it gives a `tritium` command that finds
/// its Python package in the same environment. Assembled with the standard library
/// (`dist_wheel.py`), not maturin: the wheel holds a binary and an extension module from two
/// crates.
fn dist() -> Result<()> {
    build()?;
    let target = target_dir();
    let stripped = target.join("dist/tritium.stripped");
    std::fs::create_dir_all(target.join("dist"))?;
    run(Command::new("objcopy").arg("--strip-debug").arg(target.join("release/tritium")).arg(&stripped))?;
    let script = target.join("dist/dist_wheel.py");
    std::fs::write(&script, include_str!("dist_wheel.py"))?;
    run(Command::new(script_python(&root()))
        .arg(&script)
        .arg(root())
        .arg(&stripped)
        .arg(target.join("dist"))
        .arg(env!("CARGO_PKG_VERSION")))
}

/// Builds everything and runs the server on the examples until Ctrl-C.
fn serve(extra: &[String]) -> Result<()> {
    setup_serve()?;
    build()?;
    let target = target_dir();
    let mut cmd = Command::new(target.join("release/tritium"));
    cmd.arg("serve").arg("--model-repository").arg(root().join("examples/models")).args(extra);
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().context("starting tritium")?;
    if !status.success() {
        bail!("tritium exited with {status}");
    }
    Ok(())
}

/// Whether every prerequisite must be present (`TRITIUM_REQUIRE_ALL`, set by `.ci/run`): then a
/// missing tool fails the run instead of skipping the tests that need it.
fn require_all() -> bool {
    std::env::var_os("TRITIUM_REQUIRE_ALL").is_some()
}

/// The style gates: rustfmt, clippy with warnings denied, cargo doc with warnings denied, ruff
/// (lint and format) and mypy over the Python code.
fn lint() -> Result<()> {
    let cargo = env!("CARGO");
    run(Command::new(cargo).current_dir(root()).args(["fmt", "--all", "--check"]))?;
    run(Command::new(cargo).current_dir(root()).args([
        "clippy",
        "--release",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Every doc comment's links resolve and its text is well-formed (private items documented:
    // the docs are for the people working on tritium).
    run(Command::new(cargo)
        .current_dir(root())
        .env("RUSTDOCFLAGS", "-D warnings -A rustdoc::private_intra_doc_links")
        .args(["doc", "--release", "--no-deps", "--workspace", "--document-private-items"]))?;
    let ruff = root().join(".venv/bin/ruff");
    let paths = ["python", "tests", "examples", "xtask"];
    run(Command::new(&ruff).current_dir(root()).arg("check").args(paths))?;
    run(Command::new(&ruff).current_dir(root()).args(["format", "--check"]).args(paths))?;
    // The Python side's types (mypy.ini: python/tritium with the native module's stubs).
    run(Command::new(root().join(".venv/bin/mypy")).current_dir(root()))?;
    Ok(())
}

fn test() -> Result<()> {
    let started = Instant::now();
    let outcome = test_steps();
    print_times();
    eprintln!("xtask: `cargo xtask test` took {:.0} s", started.elapsed().as_secs_f64());
    outcome
}

/// The steps of [`test()`].
fn test_steps() -> Result<()> {
    setup()?;
    lint()?;
    build()?;
    let py = venv_python();
    run(Command::new(env!("CARGO")).current_dir(root()).env("TRITIUM_PYTHON", &py).args([
        "test",
        "--workspace",
        "--release",
        "--no-fail-fast",
    ]))?;
    // The pure-Python tests, then the end-to-end tests: the real server, real stubs, tritonclient
    // and perf_analyzer. Three pytest workers, each taking whole files (their servers are
    // module fixtures): the end-to-end tests mostly wait on servers and stubs, so three of them
    // share two CPUs well (7 minutes down to under 3 here).
    run(Command::new(&py).current_dir(root()).args([
        "-m",
        "pytest",
        "-q",
        "-n",
        "3",
        "--dist",
        "loadfile",
        "--durations=15",
        "python/tests",
        "tests",
    ]))?;
    Ok(())
}

/// Runs benchmark `what`; `flags` go to `tritium serve` (bench serve only).
fn bench(what: &str, flags: &[String]) -> Result<()> {
    if !flags.is_empty() && !matches!(what, "serve" | "fork") {
        bail!("only `bench serve` and `bench fork` take tritium flags (got {flags:?} for bench {what})");
    }
    setup()?;
    build()?;
    match what {
        "ipc" => run(Command::new(env!("CARGO")).current_dir(root()).env("TRITIUM_PYTHON", venv_python()).args([
            "bench",
            "-p",
            "tritium-host",
            "--bench",
            "ipc",
        ])),
        "serve" => bench_serve::bench_serve(flags),
        "stream" => bench_stream::bench_stream(),
        "shm" => bench_shm::bench_shm(),
        "openai" => run(Command::new(venv_python()).current_dir(root()).args(["examples/clients/openai_bench.py"])),
        "frameworks" => bench_frameworks::bench_frameworks(),
        "fork" => bench_fork::bench_fork(flags),
        other => bail!("unknown benchmark {other:?}; known: ipc, serve, stream, shm, openai, frameworks, fork"),
    }
}

/// The command line's words after a subcommand, for the functions that take them.
fn owned(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["setup"] => setup(),
        ["build"] => build(),
        ["dist"] => dist(),
        ["lint"] => setup().and_then(|()| lint()),
        ["test"] => test(),
        ["bench", what, flags @ ..] => bench(what, &owned(flags)),
        ["bench"] => bench("ipc", &[]),
        ["compare"] => setup().and_then(|()| build()).and_then(|()| compare::compare()),
        ["compat", rest @ ..] => compat::compat(&owned(rest)),
        ["gpu-check", rest @ ..] => gpu_check::gpu_check(&owned(rest)),
        ["serve", extra @ ..] => serve(&owned(extra)),
        _ => bail!(
            "usage: cargo xtask setup | build | dist | lint | serve [FLAGS] | test | bench ipc | bench serve [FLAGS] | bench stream \
             | bench shm | bench openai | compare | compat --triton-server DIR --python-backend DIR [MODEL...] \
             | gpu-check [--bundle]"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_run_on_a_fresh_clone_without_a_venv() -> Result<()> {
        let fresh = std::env::temp_dir().join(format!("tritium-fresh-clone-{}", std::process::id()));
        std::fs::create_dir_all(&fresh)?;
        let python = script_python(&fresh);
        assert!(!python.starts_with(&fresh), "{}", python.display());
        let out = Command::new(&python).args(["-c", "import zipfile, hashlib, base64"]).output()?;
        assert!(out.status.success(), "{} cannot run the wheel script's imports", python.display());
        std::fs::remove_dir_all(&fresh)?;
        Ok(())
    }

    #[test]
    fn a_missing_venv_tool_says_to_run_setup() {
        let root = Path::new("/clone");
        let msg = missing_program(root, &root.join(".venv/bin/ruff"));
        assert_eq!(
            msg,
            ".venv/bin/ruff does not exist; run `cargo xtask setup` first: it creates .venv with the Python \
             packages and tools the tests need"
        );
    }
}
