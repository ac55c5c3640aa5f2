//! `cargo xtask compare`: tritium and Triton 2.51 (from `.venv-triton`, as the benchmarks set it
//! up) serve the same repository side by side, and `xtask/compare_triton.py` sends both the same
//! HTTP and gRPC requests (metadata, configs, good and malformed inferences, sequences, decoupled
//! and ensemble models, statistics, extensions) and prints every answer that differs. A report
//! for people, not a test: it always finishes with the number of differences, some of them
//! deliberate (README says which).

use std::process::Command;

use anyhow::Result;

use crate::servers::{free_ports, tritium_command, triton_command, triton_env, Server, TempDir};
use crate::{root, run, target_dir, venv_python};

/// The models both servers load: (directory under the checkout, model).
const MODELS: [(&str, &str); 18] = [
    ("examples/models", "add_sub"),
    ("examples/models", "batched_scale"),
    ("examples/models", "stream_words"),
    ("examples/models", "sequence_accumulate"),
    ("examples/models", "ensemble_pipeline"),
    ("examples/models", "preprocess"),
    ("examples/models", "caption"),
    ("tests/models", "echo"),
    ("tests/models", "broken_init"),
    ("tests/models", "broken_config"),
    // Behaviour no example shows: config reshapes, and the ways an `execute` fails.
    ("xtask/compare_models", "reshaped"),
    ("tests/models", "misbehaving"),
    // What model code sees: initialize's args, the completed config, request metadata, inputs.
    ("xtask/compare_models", "introspect"),
    // What clients receive: every dtype, each error code, responses that break the config.
    ("xtask/compare_models", "outputs"),
    // What BLS calls return to model code, and what a stream client gets from response senders.
    ("xtask/compare_models", "bls_probe"),
    ("xtask/compare_models", "sender_probe"),
    // A config that `auto_complete_config` completes: compared key by key with the others.
    ("xtask/compare_models", "auto_probe"),
    // The response cache: hits, misses and what the statistics count.
    ("xtask/compare_models", "cached"),
];

/// Runs the comparison; `setup()` and `build()` have run.
pub(crate) fn compare() -> Result<()> {
    let root = root();
    let target = target_dir();
    let triton = triton_env(&root)?;
    let repo = TempDir::new("tritium-compare")?;
    for (dir, model) in MODELS {
        run(Command::new("cp").arg("-a").arg(root.join(dir).join(model)).arg(repo.0.join(model)))?;
    }
    let logs = target.join("compare");
    std::fs::create_dir_all(&logs)?;
    let [t_http, t_grpc, t_metrics, n_http, n_grpc, n_metrics] = free_ports::<6>()?;
    // Two models are broken on purpose: neither server may stop or stay unready for them.
    let mut tritium_cmd = tritium_command(&root, &target.join("release/tritium"), &repo.0, [t_http, t_grpc, t_metrics]);
    // Both have a response cache, for the `cached` model.
    let cache = "--cache-config=local,size=1048576";
    tritium_cmd.args(["--strict-readiness=false", cache]);
    let mut triton_cmd = triton_command(&root, &triton, &repo.0, [n_http, n_grpc, n_metrics]);
    triton_cmd.args(["--strict-readiness=false", "--exit-on-error=false", cache]);
    let mut servers = [
        Server::start("tritium", tritium_cmd, &logs.join("tritium.log"), t_http, t_grpc)?,
        Server::start("Triton", triton_cmd, &logs.join("triton.log"), n_http, n_grpc)?,
    ];
    for s in &mut servers {
        s.wait_ready()?;
    }
    let url = |port: u16| format!("127.0.0.1:{port}");
    run(Command::new(venv_python())
        .current_dir(&root)
        .arg(root.join("xtask/compare_triton.py"))
        .args(["--triton-http", &url(n_http), "--triton-grpc", &url(n_grpc)])
        .args(["--tritium-http", &url(t_http), "--tritium-grpc", &url(t_grpc)])
        .args(["--triton-metrics", &url(n_metrics), "--tritium-metrics", &url(t_metrics)]))?;
    eprintln!("xtask: logs in {}", logs.display());
    Ok(())
}
