//! Shared helpers for the stub integration tests: locating Python, writing model files, starting
//! stubs, and building requests.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tritium_host::{Stub, StubCommand};
use tritium_ipc::{DataType, Initialize, Request, Tensor, TensorData};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// The interpreter (`$TRITIUM_PYTHON`, else the repo's `.venv`) and the python/ dir with the
/// native module built into it. Panics with the command that fixes a missing piece.
pub fn stub_command() -> StubCommand {
    let python =
        std::env::var_os("TRITIUM_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo_root().join(".venv/bin/python"));
    assert!(python.exists(), "no Python at {}: run `cargo xtask setup` or set TRITIUM_PYTHON", python.display());
    let python_path = repo_root().join("python");
    assert!(
        python_path.join("tritium/_native.abi3.so").exists(),
        "tritium._native is not built: run `cargo xtask build` (or use `cargo xtask test`)"
    );
    init_logging();
    StubCommand { python, python_path, env: Vec::new(), spin: 500 }
}

/// Everything logged by any test, for tests that look for a model's log lines.
pub fn log_text() -> String {
    String::from_utf8_lossy(&LOG.get().expect("logging").lock().expect("log").clone()).into_owned()
}

static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn init_logging() {
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let capture = Capture(buf.clone());
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || capture.clone())
            .try_init();
        buf
    });
}

/// A model repository in a temp dir holding one model, `<name>/1/model.py`.
pub struct Model {
    pub dir: tempfile::TempDir,
    pub name: String,
}

impl Model {
    pub fn new(name: &str, source: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let version = dir.path().join(name).join("1");
        std::fs::create_dir_all(&version).expect("mkdir");
        std::fs::write(version.join("model.py"), source).expect("write model");
        Self { dir, name: name.to_string() }
    }

    pub fn file(&self) -> String {
        self.dir.path().join(&self.name).join("1/model.py").display().to_string()
    }

    pub fn init(&self, config_json: &str) -> Initialize {
        let model_dir = self.dir.path().join(&self.name).display().to_string();
        let args = [
            ("model_config", config_json.to_string()),
            ("model_instance_kind", "CPU".to_string()),
            ("model_instance_name", format!("{}_0_0", self.name)),
            ("model_instance_device_id", "0".to_string()),
            ("model_repository", model_dir),
            ("model_version", "1".to_string()),
            ("model_name", self.name.clone()),
        ];
        Initialize {
            model_file: self.file(),
            args: args.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            max_inflight_responses: 0,
        }
    }

    /// Spawns a stub and initializes the model in it.
    pub fn start(&self) -> Stub {
        let stub = self.spawn();
        stub.initialize(self.init(&format!(r#"{{"name": "{}"}}"#, self.name)), Duration::from_secs(60))
            .expect("initialize");
        stub
    }

    pub fn spawn(&self) -> Stub {
        Stub::spawn(&stub_command(), &format!("{}_0_0", self.name), Duration::from_secs(60)).expect("spawn")
    }
}

/// An input tensor whose bytes are copied into the stub's channel.
pub fn input(stub: &Stub, name: &str, dtype: DataType, shape: &[i64], bytes: &[u8], writable: bool) -> Tensor {
    let desc = stub.input(bytes).expect("input");
    Tensor { name: name.into(), dtype, shape: shape.to_vec(), data: TensorData::Shm { desc, writable } }
}

pub fn request(id: u64, inputs: Vec<Tensor>) -> Request {
    Request { id, request_id: format!("req-{id}"), inputs, ..Default::default() }
}

/// Triton's serialized BYTES form.
pub fn serialize_bytes(items: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for it in items {
        out.extend_from_slice(&(it.len() as u32).to_le_bytes());
        out.extend_from_slice(it);
    }
    out
}

/// Runs one request and returns (name, dtype, shape, bytes) of every output, releasing them.
/// An output as the tests compare it: name, dtype, shape, bytes.
pub type Output = (String, DataType, Vec<i64>, Vec<u8>);

pub fn run_one(stub: &Stub, req: Request) -> Result<Vec<Output>, String> {
    let mut done = stub.execute(vec![req], Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
    if let Some(e) = done.error {
        return Err(e.to_string());
    }
    assert_eq!(done.responses.len(), 1, "one response per request");
    let resp = done.responses.remove(0);
    assert!(resp.final_response);
    let result = match &resp.error {
        Some(e) => Err(e.to_string()),
        None => Ok(resp
            .outputs
            .iter()
            .map(|t| (t.name.clone(), t.dtype, t.shape.clone(), stub.output(&t.data).expect("output").to_vec()))
            .collect()),
    };
    stub.release_outputs(&resp);
    result
}
