//! `cargo xtask gpu-check`: the GPU path end to end on a machine with a GPU, in one run
//! (`xtask/gpu_check.sh` says what it covers).
//!
//! - `cargo xtask gpu-check`: builds, then runs the script here. Without a usable CUDA driver it
//!   says why and exits with status 2: nothing was checked, which must never read as a pass.
//! - `cargo xtask gpu-check --bundle`: builds and writes `.gpu/` for a GPU machine that has no
//!   Rust toolchain and no network: the `tritium` binary and tritium-cuda's test binary
//!   (without debug info), the native module, and the wheels of tritonclient and its
//!   dependencies for CPython 3.12. There, `xtask/gpu_check.sh .gpu` runs the same checks.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{build, root, run, target_dir, venv_python};

/// What tritonclient needs beyond what a CUDA machine's Python with torch usually has (numpy,
/// grpcio, protobuf, aiohttp, urllib3, cuda-bindings), at the versions of the dev environment.
const WHEELS: &[&str] = &[
    "tritonclient",
    "python-rapidjson",
    "geventhttpclient",
    "gevent",
    "greenlet",
    "zope.event",
    "zope.interface",
    "brotli",
];

/// Runs the checks here, or writes the bundle for another machine.
pub(crate) fn gpu_check(args: &[String]) -> Result<()> {
    match args {
        [] => check_here(),
        [flag] if flag == "--bundle" => bundle(),
        _ => bail!("usage: cargo xtask gpu-check [--bundle]"),
    }
}

fn check_here() -> Result<()> {
    if let Err(e) = tritium_cuda::cuda() {
        eprintln!("gpu-check: {e}");
        eprintln!("gpu-check: the GPU path was NOT checked on this machine (README: GPU status)");
        std::process::exit(2);
    }
    build()?;
    let tests = cuda_test_binary()?;
    run(Command::new(&tests).arg("--test-threads").arg("1"))?;
    let python = std::env::var_os("TRITIUM_GPU_PYTHON").map(PathBuf::from).unwrap_or_else(venv_python);
    run(Command::new(root().join("xtask/gpu_check.sh")).current_dir(root()).env("TRITIUM_GPU_PYTHON", python))
}

/// Builds tritium-cuda's unit tests (release) and returns the test binary.
fn cuda_test_binary() -> Result<PathBuf> {
    let out = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["test", "--release", "-p", "tritium-cuda", "--no-run", "--message-format=json"])
        .output()
        .context("building tritium-cuda's tests")?;
    if !out.status.success() {
        bail!("building tritium-cuda's tests failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if let Some(exe) = message.get("executable").and_then(|e| e.as_str()) {
            return Ok(PathBuf::from(exe));
        }
    }
    bail!("cargo built no test binary for tritium-cuda")
}

fn strip(from: &Path, to: &Path) -> Result<()> {
    run(Command::new("objcopy").arg("--strip-debug").arg(from).arg(to))
}

fn bundle() -> Result<()> {
    build()?;
    let dir = root().join(".gpu");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir.join("bin"))?;
    strip(&target_dir().join("release/tritium"), &dir.join("bin/tritium"))?;
    strip(&cuda_test_binary()?, &dir.join("bin/tritium-cuda-tests"))?;
    strip(&root().join("python/tritium/_native.abi3.so"), &dir.join("_native.abi3.so"))?;
    let pinned = WHEELS.iter().map(|name| pinned(name)).collect::<Result<Vec<_>>>()?;
    let mut pip = Command::new(venv_python());
    pip.args(["-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]);
    pip.args(["--implementation", "cp"]);
    for platform in [
        "manylinux_2_28_x86_64",
        "manylinux_2_27_x86_64",
        "manylinux_2_24_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
    ] {
        pip.args(["--platform", platform]);
    }
    run(pip.arg("-d").arg(dir.join("wheels")).args(&pinned))?;
    let size: u64 = walk(&dir)?.iter().map(|p| p.metadata().map(|m| m.len()).unwrap_or(0)).sum();
    eprintln!(
        "gpu-check: wrote {} ({:.1} MiB). On the GPU machine, from the repository root, with .gpu carried:\n  \
         bash xtask/gpu_check.sh .gpu",
        dir.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// `name==version` as installed in `.venv`.
fn pinned(name: &str) -> Result<String> {
    let mut show = Command::new(venv_python());
    crate::check_program(show.args(["-m", "pip", "show", name]))?;
    let out = show.output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .with_context(|| format!("{name} is not installed in .venv: run `cargo xtask setup`"))?;
    Ok(format!("{name}=={}", version.trim()))
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(walk(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}
