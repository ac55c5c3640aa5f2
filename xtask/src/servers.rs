//! The servers the benchmarks and `cargo xtask compare` run side by side: the command lines of
//! `tritium serve` and of Triton 2.51 (`.venv-triton`, made here from the `nvidia-pytriton`
//! wheel), a started server that stops with its whole process group when dropped, free ports, a
//! temporary directory, and the load average printed beside every figure.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::run;

/// What `.venv-triton` gets; changing it reinstalls.
const TRITON_PACKAGES: &[&str] = &["nvidia-pytriton==0.7.0", "numpy"];

/// How long a server may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

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
        // A process group of its own, which `drop` sweeps: a server stopped while it still loads
        // (Triton, when the other server failed to start) can leave its stubs behind, and they
        // would skew every later measurement on the machine.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
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

    /// Its HTTP port.
    pub(crate) fn http_port(&self) -> u16 {
        self.http_port
    }

    fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 20)
    }

    /// SIGTERM, then SIGKILL if it has not exited within 15 s.
    fn stop(&mut self) {
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

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        // Whatever is left of its process group (stubs of a server stopped mid-start).
        let _ =
            Command::new("kill").args(["-KILL", "--", &format!("-{}", self.child.id())]).stderr(Stdio::null()).status();
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

pub(crate) fn copy_dir(from: &Path, to: &Path) -> Result<()> {
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
