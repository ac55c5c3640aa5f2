//! `cargo xtask compat`: Triton's own Python-backend test models against tritium (the cases and
//! their checks are `xtask/compat.py`). The upstream repositories are not vendored: the command
//! takes local copies and says how to get them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};

use crate::{build, root, run, target_dir, venv_python};

const USAGE: &str = "usage: cargo xtask compat --triton-server DIR --python-backend DIR [--keep] [CASE...]\n\
  DIR: a checkout (or a bare mirror) of each repository, e.g.\n    \
  git clone --depth 1 https://github.com/triton-inference-server/server /tmp/triton-server\n    \
  git clone --depth 1 https://github.com/triton-inference-server/python_backend /tmp/python_backend\n  \
  (or set TRITIUM_TRITON_SERVER and TRITIUM_PYTHON_BACKEND). The models are copied into a temporary\n  \
  repository at run time; none of them is kept in this repository.";

/// Runs the compatibility harness; `args` are the words after `compat`.
pub(crate) fn compat(args: &[String]) -> Result<()> {
    let mut server = std::env::var_os("TRITIUM_TRITON_SERVER").map(PathBuf::from);
    let mut backend = std::env::var_os("TRITIUM_PYTHON_BACKEND").map(PathBuf::from);
    let mut rest = Vec::new();
    let mut words = args.iter();
    while let Some(word) = words.next() {
        match word.as_str() {
            "--triton-server" => server = words.next().map(PathBuf::from),
            "--python-backend" => backend = words.next().map(PathBuf::from),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => rest.push(other.to_string()),
        }
    }
    let (Some(server), Some(backend)) = (server, backend) else {
        bail!("compat needs both upstream repositories.\n{USAGE}");
    };
    for (dir, name) in [(&server, "triton-inference-server/server"), (&backend, "python_backend")] {
        if !dir.is_dir() {
            bail!("{} is not a directory (a copy of {name} expected).\n{USAGE}", dir.display());
        }
    }
    let py = venv_python();
    if !py.exists() {
        bail!("{} does not exist: run `cargo xtask setup` first (the harness needs tritonclient)", py.display());
    }
    build()?;
    run(Command::new(&py)
        .current_dir(root())
        .arg(root().join("xtask/compat.py"))
        .arg("--triton-server")
        .arg(absolute(&server))
        .arg("--python-backend")
        .arg(absolute(&backend))
        .arg("--tritium")
        .arg(target_dir().join("release/tritium"))
        .arg("--python")
        .arg(&py)
        .args(rest))
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}
