//! `cargo xtask`: setting up the Python environment, building the stub's native module, running
//! the whole test suite, and the benchmarks.
//!
//! - `cargo xtask setup`: creates `.venv` (from `$TRITIUM_BASE_PYTHON` or `python3`) with the
//!   packages in `python/requirements-dev.txt`.
//! - `cargo xtask build`: builds `tritium._native` (release) into `python/tritium/`.
//! - `cargo xtask test`: setup, build, `cargo test --workspace`, then the Python tests.
//! - `cargo xtask bench ipc`: the IPC benchmark (floor, stub round trips, memcpy).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn venv_python() -> PathBuf {
    root().join(".venv/bin/python")
}

/// Creates `.venv` if needed and installs the requirements into it.
fn setup() -> Result<()> {
    let py = venv_python();
    if !py.exists() {
        let base = std::env::var("TRITIUM_BASE_PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(&base).args(["-m", "venv"]).arg(root().join(".venv")))?;
    }
    let stamp = root().join(".venv/.tritium-requirements");
    let req = root().join("python/requirements-dev.txt");
    let wanted = std::fs::read_to_string(&req).with_context(|| format!("reading {}", req.display()))?;
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        run(Command::new(&py).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"]).arg(&req))?;
        std::fs::write(&stamp, wanted)?;
    }
    Ok(())
}

/// Builds the stub's native module and places it next to the `tritium` package.
fn build() -> Result<()> {
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--release", "-p", "tritium-native"]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    let built = target.join("release/libtritium_native.so");
    let dest = root().join("python/tritium/_native.abi3.so");
    // Replace rather than overwrite: a running stub may have the old file mapped.
    let tmp = dest.with_extension("so.tmp");
    std::fs::copy(&built, &tmp).with_context(|| format!("copying {}", built.display()))?;
    std::fs::rename(&tmp, &dest)?;
    Ok(())
}

fn test() -> Result<()> {
    setup()?;
    build()?;
    let py = venv_python();
    run(Command::new(env!("CARGO")).current_dir(root()).env("TRITIUM_PYTHON", &py).args(["test", "--workspace", "--release"]))?;
    run(Command::new(&py).current_dir(root().join("python")).args(["-m", "pytest", "-q", "tests"]))?;
    Ok(())
}

fn bench(what: &str) -> Result<()> {
    setup()?;
    build()?;
    match what {
        "ipc" => run(Command::new(env!("CARGO"))
            .current_dir(root())
            .env("TRITIUM_PYTHON", venv_python())
            .args(["bench", "-p", "tritium-host", "--bench", "ipc"])),
        other => bail!("unknown benchmark {other:?}; known: ipc"),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["setup"] => setup(),
        ["build"] => build(),
        ["test"] => test(),
        ["bench", what] => bench(what),
        ["bench"] => bench("ipc"),
        _ => bail!("usage: cargo xtask setup | build | test | bench ipc"),
    }
}
