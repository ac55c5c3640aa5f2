//! Starts one stub for a model file, initializes it, prints the stub's pid, then waits.
//!
//! `cargo run -p tritium-host --example serve_one -- <repo>/<model>/1/model.py`
//!
//! The fault tests use it as a parent process to kill: its stub must exit on its own.

use std::path::PathBuf;
use std::time::Duration;

use tritium_host::{Stub, StubCommand};
use tritium_ipc::Initialize;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model_file = args.next().ok_or("usage: serve_one MODEL_FILE [PYTHON] [PYTHON_PATH]")?;
    let python = args.next().map(PathBuf::from).unwrap_or_else(|| "python3".into());
    let python_path = args.next().map(PathBuf::from).unwrap_or_else(|| "python".into());
    let cmd = StubCommand { python, python_path, env: Vec::new(), spin: 0 };
    let stub = Stub::spawn(&cmd, "serve_one_0_0", Duration::from_secs(60))?;
    stub.initialize(Initialize { model_file, args: Vec::new(), max_inflight_responses: 0 }, Duration::from_secs(60))?;
    println!("{}", stub.pid());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
