//! `cargo xtask bench frameworks`: runs `xtask/bench_frameworks.py`, with Triton 2.51 (from
//! `.venv-triton`, as `bench serve` installs it, plus onnxruntime for its Python backend's
//! `model.py`) as the second reference: its command line goes to the script in `TRITON_COMMAND`
//! (JSON: program, args and environment; the script adds the model repository and ports).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::servers::{triton_command, triton_env};
use crate::{root, run, venv_python};

/// What `.venv-triton` gets on top of `bench serve`'s packages, for the reference's `model.py`;
/// changing it reinstalls.
const TRITON_EXTRA_PACKAGES: &[&str] = &["onnxruntime"];

/// The flags the script sets itself; they are left out of `TRITON_COMMAND`.
const SET_BY_SCRIPT: &[&str] = &["--model-repository=", "--http-port=", "--grpc-port=", "--metrics-port="];

pub(crate) fn bench_frameworks() -> Result<()> {
    let root = root();
    let triton = triton_env(&root)?;
    let venv = root.join(".venv-triton");
    let stamp = venv.join(".tritium-bench-frameworks-packages");
    let wanted = TRITON_EXTRA_PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        run(Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(TRITON_EXTRA_PACKAGES))?;
        std::fs::write(&stamp, &wanted)?;
    }
    let cmd = triton_command(&root, &triton, Path::new(""), [0, 0, 0]);
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .filter(|a| !SET_BY_SCRIPT.iter().any(|flag| a.starts_with(flag)))
        .collect();
    let env: serde_json::Map<String, serde_json::Value> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_string_lossy().into_owned(), v?.to_string_lossy().into_owned().into())))
        .collect();
    let command = serde_json::json!({
        "program": cmd.get_program().to_string_lossy(),
        "args": args,
        "env": env,
    });
    run(Command::new(venv_python())
        .current_dir(&root)
        .env("TRITON_COMMAND", serde_json::to_string(&command).context("encoding Triton's command")?)
        .args(["xtask/bench_frameworks.py"]))
}
