//! Per-model Python environments: which interpreter runs a model's stubs.
//!
//! A model runs on the server's interpreter (`--python`) unless its directory says otherwise:
//!
//! - `parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }`
//!   (Triton's parameter; `$$TRITON_MODEL_DIRECTORY` is the model's directory, and a relative
//!   path is taken from there too; the path must stay inside the model directory unless
//!   `--allow-config-path` allows more, see `confine.rs`): a packed environment (a conda-pack or venv tarball,
//!   `.tar.gz`), unpacked once into `<cache>/packed/<sha256 of the archive>`, or a directory
//!   used as it is. Its `bin/python` runs the stub.
//! - `requirements.txt` in the model directory (or a `requirements` parameter naming a file):
//!   a virtual environment built from it with `uv` (or `python -m venv` and pip when `uv` is not
//!   on `PATH`) on the model's interpreter (the packed environment's when there is one), cached in
//!   `<cache>/venvs/<sha256 of interpreter, requirements and wheelhouse>` and shared by every model
//!   with the same requirements. numpy is added when the requirements do not name it: the stub
//!   needs it, and the environment does not see the base interpreter's packages.
//!
//! Each cache entry is built at most once at a time (an exclusive `flock` on `<entry>.lock`,
//! which also serializes servers sharing the cache), in place, and is used only once its
//! `.tritium-complete` marker exists; a half-built entry (a crash, a timeout) is removed and built
//! again. Unpacking refuses any entry that would land outside the entry's directory (an
//! absolute path, `..`, a hard link out, a path through a symlink) and fails the load with the
//! entry's name. An environment whose Python is older than 3.9 or lacks numpy fails the load
//! with a message naming the environment.
//!
//! The stub is started as Triton's activation would leave it: the environment's `bin` first on
//! `PATH`, its `lib` first on `LD_LIBRARY_PATH`, `VIRTUAL_ENV` set; unlike Triton, `bin/activate`
//! is not sourced (and not required).

use std::ffi::OsString;
use std::fs::File;
use std::io::BufReader;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tritium_config::ModelConfig;
use tritium_host::StubCommand;

use crate::confine::{PathError, PathPolicy};

/// Triton's parameter naming a packed environment.
pub const EXECUTION_ENV_PATH: &str = "EXECUTION_ENV_PATH";
/// The parameter naming a requirements file (default: `requirements.txt` in the model directory).
pub const REQUIREMENTS: &str = "requirements";
/// Present in a cache entry once it is complete.
const COMPLETE: &str = ".tritium-complete";
/// Lines of an installer's output kept for the load error.
const ERROR_TAIL: usize = 12;
/// How long the interpreter check may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// Where environments are cached and how they are built (`--env-cache-dir`, `--wheelhouse`,
/// `--env-build-timeout-secs`).
#[derive(Debug, Clone)]
pub struct EnvOptions {
    /// The cache of unpacked and built environments.
    pub cache_dir: PathBuf,
    /// Install requirements only from this directory of wheels (`--no-index --find-links`).
    pub wheelhouse: Option<PathBuf>,
    /// Longest time building one environment may take (apart from `stub_init_timeout_secs`).
    pub build_timeout: Duration,
    /// Where build progress goes, besides the log (the server sets it: a loading model's
    /// reason in the repository index).
    pub progress: Progress,
}

impl Default for EnvOptions {
    fn default() -> Self {
        Self {
            cache_dir: default_cache_dir(),
            wheelhouse: None,
            build_timeout: Duration::from_secs(900),
            progress: Progress::default(),
        }
    }
}

/// Takes `(model, line)` for each step of an environment being prepared (the installer's own
/// output goes to the log only); the default drops them.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<ProgressSink>>);

/// The sink behind a [`Progress`]: `(model, line)`.
type ProgressSink = dyn Fn(&str, &str) + Send + Sync;

impl Progress {
    /// Progress handed to `sink`.
    pub fn new(sink: impl Fn(&str, &str) + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(sink)))
    }

    fn report(&self, model: &str, line: &str) {
        if let Some(sink) = &self.0 {
            sink(model, line);
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Progress(sink)" } else { "Progress(none)" })
    }
}

/// `$XDG_CACHE_HOME/tritium/envs`, else `~/.cache/tritium/envs`, else
/// `<temp dir>/tritium-<uid>/envs` (made private by [`ensure_private`] before use).
pub fn default_cache_dir() -> PathBuf {
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".cache")));
    match home {
        Some(base) => base.join("tritium").join("envs"),
        None => {
            let uid = effective_uid().map_or_else(|| "unknown".to_string(), |u| u.to_string());
            std::env::temp_dir().join(format!("tritium-{uid}")).join("envs")
        }
    }
}

/// The process's effective uid (the second field of `Uid:` in `/proc/self/status`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Makes sure the cache root `dir` is the server's own: created with mode 0700 when missing,
/// else owned by the server's user and writable by nobody else. A cache anyone else can write
/// could hold an environment with a completion marker that runs their code in every model.
fn ensure_private(dir: &Path) -> Result<(), EnvError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let refuse = |why: String| EnvError::Cache {
        dir: dir.display().to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{why}; choose a private directory with --env-cache-dir"),
        ),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| EnvError::Cache { dir: dir.display().to_string(), source })?;
    }
    let meta = std::fs::metadata(dir).map_err(|source| EnvError::Cache { dir: dir.display().to_string(), source })?;
    if let Some(uid) = effective_uid() {
        if meta.uid() != uid {
            return Err(refuse(format!("it is owned by uid {}, not by the server's user (uid {uid})", meta.uid())));
        }
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(format!("others may write to it (mode {:o})", meta.mode() & 0o7777)));
    }
    Ok(())
}

/// Why a model's environment cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// `EXECUTION_ENV_PATH` or the requirements file names nothing.
    #[error("parameter {parameter}: {path} does not exist")]
    Missing {
        /// The parameter (or `requirements.txt`).
        parameter: &'static str,
        /// The path, expanded.
        path: String,
    },
    /// The archive cannot be read or unpacked.
    #[error("cannot unpack the Python environment {archive}: {reason}")]
    Unpack {
        /// The archive.
        archive: String,
        /// What went wrong.
        reason: String,
    },
    /// An archive entry would land outside its directory.
    #[error(
        "refusing to unpack the Python environment {archive}: its entry {entry:?} {why}; a packed environment \
         must stay inside its own directory"
    )]
    Unsafe {
        /// The archive.
        archive: String,
        /// The entry's path.
        entry: String,
        /// How it leaves.
        why: String,
    },
    /// The environment has no `bin/python`.
    #[error("the Python environment {env} has no bin/python (nor bin/python3)")]
    NoPython {
        /// The environment's directory.
        env: String,
    },
    /// The interpreter is too old, lacks numpy, or does not start.
    #[error("the Python environment {env} cannot run tritium's stub: {reason}")]
    Unusable {
        /// The environment (its archive or directory, and the interpreter).
        env: String,
        /// What the check said.
        reason: String,
    },
    /// Building the requirements' environment failed.
    #[error(
        "cannot build the Python environment for {requirements}: {step} failed ({exit}); the installer's output is \
         in the server log"
    )]
    Build {
        /// The requirements file.
        requirements: String,
        /// The command that failed.
        step: String,
        /// How it ended.
        exit: String,
        /// The installer's last lines: for the server log only, never for a client (they can
        /// quote the files the installer read).
        tail: String,
    },
    /// A path the config names leaves the model's directory, or names nothing.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The cache cannot be written or locked.
    #[error("the Python environment cache {dir}: {source}")]
    Cache {
        /// The entry or directory.
        dir: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The stub command for a model: `base` (the server's interpreter), or one running in the
/// environment its directory and parameters ask for, made ready first. Logs the choice.
pub(crate) fn stub_for(
    base: &StubCommand,
    opts: &EnvOptions,
    paths: &PathPolicy,
    model: &str,
    model_dir: &Path,
    config: &ModelConfig,
) -> Result<StubCommand, EnvError> {
    let confined = |parameter: &'static str, value: &str| {
        paths.resolve(&format!("parameter {parameter}"), value, model_dir, model_dir).map_err(EnvError::Path)
    };
    let packed = parameter(config, EXECUTION_ENV_PATH).map(|p| confined(EXECUTION_ENV_PATH, &p)).transpose()?;
    let requirements = match parameter(config, REQUIREMENTS) {
        Some(p) => {
            let path = confined(REQUIREMENTS, &p)?;
            if !path.is_file() {
                return Err(EnvError::Missing { parameter: REQUIREMENTS, path: p });
            }
            Some(path)
        }
        // The default file, when it is there: a symlink out of the model directory is refused.
        None => match confined(REQUIREMENTS, "requirements.txt") {
            Ok(path) => Some(path).filter(|p| p.is_file()),
            Err(EnvError::Path(PathError::Missing { .. })) => None,
            Err(e) => return Err(e),
        },
    };
    if packed.is_none() && requirements.is_none() {
        return Ok(base.clone());
    }
    let mut stub = base.clone();
    let mut described = Vec::new();
    if let Some(path) = packed {
        opts.progress.report(model, &format!("preparing the Python environment {}", path.display()));
        let root = packed_env(opts, &path)?;
        stub.python = python_in(&root)?;
        activate(&mut stub, &root);
        probe(&stub, &format!("{} (unpacked in {})", path.display(), root.display()))?;
        described.push(format!("{} ({})", path.display(), root.display()));
    }
    if let Some(file) = requirements {
        let root = requirements_env(opts, &stub, &file, model)?;
        stub.python = root.join("bin").join("python");
        activate(&mut stub, &root);
        probe(&stub, &format!("{} built from {}", root.display(), file.display()))?;
        described.push(format!("{} from {}", root.display(), file.display()));
    }
    tracing::info!(model, python = %stub.python.display(), env = %described.join(" + "), "the model runs in its own Python environment");
    Ok(stub)
}

/// A string parameter of the config, if set and not blank.
fn parameter(config: &ModelConfig, key: &str) -> Option<String> {
    config.parameters.get(key).map(|p| p.string_value.trim().to_string()).filter(|s| !s.is_empty())
}

/// The environment's interpreter.
fn python_in(root: &Path) -> Result<PathBuf, EnvError> {
    ["python", "python3"]
        .iter()
        .map(|n| root.join("bin").join(n))
        .find(|p| p.exists())
        .ok_or_else(|| EnvError::NoPython { env: root.display().to_string() })
}

/// Sets what activating the environment at `root` sets.
fn activate(stub: &mut StubCommand, root: &Path) {
    let prepend = |stub: &mut StubCommand, key: &str, dir: PathBuf| {
        let current = stub
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var_os(key))
            .filter(|v| !v.is_empty());
        let mut value = OsString::from(dir.as_os_str());
        if let Some(current) = current {
            value.push(":");
            value.push(current);
        }
        stub.env.retain(|(k, _)| k != key);
        stub.env.push((key.into(), value));
    };
    prepend(stub, "PATH", root.join("bin"));
    prepend(stub, "LD_LIBRARY_PATH", root.join("lib"));
    stub.env.retain(|(k, _)| k != "VIRTUAL_ENV");
    stub.env.push(("VIRTUAL_ENV".into(), root.into()));
}

/// Checks that the interpreter is CPython >= 3.9 with numpy.
fn probe(stub: &StubCommand, env: &str) -> Result<(), EnvError> {
    const CHECK: &str = "import sys\n\
        if sys.version_info < (3, 9):\n    \
            sys.exit('its Python ' + sys.version.split()[0] + ' is too old: tritium needs CPython >= 3.9')\n\
        try:\n    import numpy\n\
        except Exception as e:\n    \
            sys.exit('it has no usable numpy (' + repr(e) + '); the stub needs numpy: install it into the environment')\n";
    let span = tracing::info_span!("env_check", python = %stub.python.display());
    let args = [OsString::from("-c"), OsString::from(CHECK)];
    let unusable =
        |reason: String| EnvError::Unusable { env: format!("{env}, interpreter {}", stub.python.display()), reason };
    let outcome = tritium_host::run_tool(&stub.python, &args, &stub.env, PROBE_TIMEOUT, 4, span, None)
        .map_err(|e| unusable(format!("cannot start it: {e}")))?;
    if outcome.success() {
        return Ok(());
    }
    let said = outcome.tail.last().cloned().unwrap_or_default();
    Err(unusable(if said.is_empty() { format!("the check ended with {}", outcome.exit) } else { said }))
}

/// The unpacked directory of the packed environment at `path` (a directory is used as it is).
fn packed_env(opts: &EnvOptions, path: &Path) -> Result<PathBuf, EnvError> {
    let meta = std::fs::metadata(path)
        .map_err(|_| EnvError::Missing { parameter: EXECUTION_ENV_PATH, path: path.display().to_string() })?;
    if meta.is_dir() {
        return Ok(path.to_path_buf());
    }
    let archive = path.display().to_string();
    let unreadable = |e: std::io::Error| EnvError::Unpack { archive: archive.clone(), reason: e.to_string() };
    let mut hasher = Sha256::new();
    let mut file = File::open(path).map_err(unreadable)?;
    std::io::copy(&mut file, &mut hasher).map_err(unreadable)?;
    ensure_private(&opts.cache_dir)?;
    let entry = opts.cache_dir.join("packed").join(hex(&hasher.finalize()));
    once(&entry, |dir| {
        tracing::info!(archive = %path.display(), into = %dir.display(), "unpacking a Python environment");
        unpack(path, dir)
    })?;
    Ok(entry)
}

/// The first 32 hex digits of a digest.
fn hex(digest: &[u8]) -> String {
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Makes the cache entry `dir` with `build` unless it is complete, holding its lock meanwhile.
fn once(dir: &Path, build: impl FnOnce(&Path) -> Result<(), EnvError>) -> Result<(), EnvError> {
    let marker = dir.join(COMPLETE);
    if marker.is_file() {
        return Ok(());
    }
    let cache = |source: std::io::Error| EnvError::Cache { dir: dir.display().to_string(), source };
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(cache)?;
    }
    let lock_file = File::create(dir.with_extension("lock")).map_err(cache)?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| cache(std::io::Error::from(errno)))?;
    if marker.is_file() {
        return Ok(());
    }
    if dir.exists() {
        tracing::info!(dir = %dir.display(), "removing a half-built Python environment");
        std::fs::remove_dir_all(dir).map_err(cache)?;
    }
    std::fs::create_dir_all(dir).map_err(cache)?;
    match build(dir) {
        Ok(()) => std::fs::write(&marker, b"").map_err(cache),
        Err(e) => {
            let _ = std::fs::remove_dir_all(dir);
            Err(e)
        }
    }
}

/// Whether `path` stays below the directory it is joined to: relative, without `..`.
fn stays_inside(path: &Path) -> bool {
    path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Unpacks the gzipped tar `archive` into `dest`, refusing entries that leave it.
fn unpack(archive: &Path, dest: &Path) -> Result<(), EnvError> {
    let name = archive.display().to_string();
    let failed = |what: String| EnvError::Unpack { archive: name.clone(), reason: what };
    let unsafe_entry = |entry: &Path, why: &str| EnvError::Unsafe {
        archive: name.clone(),
        entry: entry.display().to_string(),
        why: why.to_string(),
    };
    let file = File::open(archive).map_err(|e| failed(e.to_string()))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(BufReader::new(file)));
    tar.set_preserve_permissions(true);
    tar.set_overwrite(true);
    let entries = tar.entries().map_err(|e| failed(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| failed(format!("not a gzipped tar archive, or a damaged one: {e}")))?;
        let path = entry.path().map_err(|e| failed(e.to_string()))?.into_owned();
        if !stays_inside(&path) {
            return Err(unsafe_entry(&path, "is an absolute path or climbs out with '..'"));
        }
        use tar::EntryType as T;
        match entry.header().entry_type() {
            T::Link => {
                let target = entry.link_name().map_err(|e| failed(e.to_string()))?.unwrap_or_default().into_owned();
                if !stays_inside(&target) {
                    return Err(unsafe_entry(&path, &format!("is a hard link to {}", target.display())));
                }
            }
            T::Char | T::Block | T::Fifo => return Err(unsafe_entry(&path, "is a device or a fifo")),
            _ => {}
        }
        // `unpack_in` also refuses to write through a symlink unpacked earlier that points out.
        match entry.unpack_in(dest) {
            Ok(true) => {}
            Ok(false) => return Err(unsafe_entry(&path, "would be written outside the directory")),
            Err(e) => {
                return Err(unsafe_entry(&path, &format!("cannot be unpacked inside the directory ({e})")));
            }
        }
    }
    Ok(())
}

/// The virtual environment for the requirements file `file`, on `stub`'s interpreter.
fn requirements_env(opts: &EnvOptions, stub: &StubCommand, file: &Path, model: &str) -> Result<PathBuf, EnvError> {
    let text = std::fs::read_to_string(file)
        .map_err(|_| EnvError::Missing { parameter: REQUIREMENTS, path: file.display().to_string() })?;
    let python = std::fs::canonicalize(&stub.python).unwrap_or_else(|_| stub.python.clone());
    let mut hasher = Sha256::new();
    for part in [
        stub.python.as_os_str().as_encoded_bytes(),
        python.as_os_str().as_encoded_bytes(),
        text.as_bytes(),
        opts.wheelhouse.as_deref().map(|w| w.as_os_str().as_encoded_bytes()).unwrap_or_default(),
    ] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    ensure_private(&opts.cache_dir)?;
    let entry = opts.cache_dir.join("venvs").join(hex(&hasher.finalize()));
    once(&entry, |dir| build_venv(opts, stub, file, &text, dir, model))?;
    Ok(entry)
}

/// Whether the requirements name numpy.
fn names_numpy(requirements: &str) -> bool {
    requirements.lines().any(|line| {
        let name: String =
            line.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).collect();
        name.to_ascii_lowercase().replace(['_', '.'], "-") == "numpy"
    })
}

/// Finds `program` on `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

/// Creates the virtual environment `dir` and installs the requirements into it.
fn build_venv(
    opts: &EnvOptions,
    stub: &StubCommand,
    file: &Path,
    text: &str,
    dir: &Path,
    model: &str,
) -> Result<(), EnvError> {
    let span = tracing::info_span!("env_build", model, requirements = %file.display());
    let deadline = Instant::now() + opts.build_timeout;
    let venv_python = dir.join("bin").join("python");
    let os = |s: &str| OsString::from(s);
    let mut install: Vec<OsString> = vec![os("-r"), file.into()];
    if !names_numpy(text) {
        install.push(os("numpy"));
    }
    if let Some(wheelhouse) = &opts.wheelhouse {
        install.extend([os("--no-index"), os("--find-links"), wheelhouse.into()]);
    }
    let steps: Vec<(PathBuf, Vec<OsString>)> = match which("uv") {
        Some(uv) => {
            span.in_scope(
                || tracing::info!(uv = %uv.display(), into = %dir.display(), "building a Python environment with uv"),
            );
            let mut pip = vec![os("pip"), os("install"), os("--python"), venv_python.clone().into()];
            pip.extend(install);
            vec![(uv.clone(), vec![os("venv"), os("--python"), stub.python.clone().into(), dir.into()]), (uv, pip)]
        }
        None => {
            span.in_scope(|| {
                tracing::info!(into = %dir.display(), "uv is not on PATH: building a Python environment with python -m venv and pip")
            });
            let mut pip = vec![os("-m"), os("pip"), os("install"), os("--disable-pip-version-check"), os("--no-input")];
            pip.extend(install);
            vec![(stub.python.clone(), vec![os("-m"), os("venv"), dir.into()]), (venv_python.clone(), pip)]
        }
    };
    for (program, args) in steps {
        let step = std::iter::once(program.display().to_string())
            .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" ");
        let left = deadline.saturating_duration_since(Instant::now());
        let failed = |exit: String, tail: Vec<String>| EnvError::Build {
            requirements: file.display().to_string(),
            step: step.clone(),
            exit,
            tail: tail.join("\n"),
        };
        // The installer's lines go to the log only: the index and load errors are read by clients.
        opts.progress.report(model, &format!("building the Python environment of {}: {step}", file.display()));
        let outcome = tritium_host::run_tool(&program, &args, &stub.env, left, ERROR_TAIL, span.clone(), None)
            .map_err(|e| failed(format!("cannot start it: {e}"), Vec::new()))?;
        if !outcome.success() {
            span.in_scope(|| {
                tracing::error!(step = %step, exit = %outcome.exit, output = %outcome.tail.join("\n"), "building a Python environment failed")
            });
        }
        if outcome.timed_out {
            let limit = opts.build_timeout.as_secs();
            return Err(failed(
                format!("it ran past --env-build-timeout-secs ({limit} s) and was killed"),
                outcome.tail,
            ));
        }
        if !outcome.success() {
            return Err(failed(outcome.exit.to_string(), outcome.tail));
        }
    }
    span.in_scope(|| tracing::info!("the Python environment is ready"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_root_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = Tmp::new("private");
        let fresh = tmp.0.join("a/b/envs");
        ensure_private(&fresh).expect("created");
        assert_eq!(std::fs::metadata(&fresh).expect("meta").permissions().mode() & 0o777, 0o700);
        let open = tmp.0.join("open");
        std::fs::create_dir_all(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = ensure_private(&open).expect_err("world-writable").to_string();
        assert!(e.contains("others may write to it (mode 777)") && e.contains("--env-cache-dir"), "{e}");
        assert!(effective_uid().is_some());
    }

    #[test]
    fn numpy_is_seen_however_it_is_pinned() {
        assert!(names_numpy("six\nnumpy==1.26\n"));
        assert!(names_numpy("NumPy>=1"));
        assert!(names_numpy("  numpy ; python_version>'3'"));
        assert!(!names_numpy("numpyro\nsix"));
        assert!(!names_numpy("# numpy\n"));
    }

    #[test]
    fn only_relative_paths_without_dotdot_stay_inside() {
        assert!(stays_inside(Path::new("bin/python")));
        assert!(stays_inside(Path::new("./lib/x.py")));
        assert!(!stays_inside(Path::new("../evil")));
        assert!(!stays_inside(Path::new("lib/../../evil")));
        assert!(!stays_inside(Path::new("/etc/passwd")));
    }

    /// A temporary directory removed on drop.
    struct Tmp(PathBuf);

    impl Tmp {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("tritium-envs-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("tmp");
            Self(dir)
        }
    }

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A gzipped tar with the given raw entries (path, type, link target, data).
    fn archive(path: &Path, entries: &[(&str, tar::EntryType, &str, &[u8])]) {
        let gz = flate2::write::GzEncoder::new(File::create(path).expect("archive"), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (name, kind, link, data) in entries {
            let mut h = tar::Header::new_gnu();
            // Written raw: `set_path` refuses `..`, and these tests need it.
            let bytes = name.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_entry_type(*kind);
            h.set_mode(0o755);
            h.set_size(data.len() as u64);
            if !link.is_empty() {
                h.set_link_name(link).expect("link");
            }
            h.set_cksum();
            b.append(&h, *data).expect("append");
        }
        b.into_inner().expect("finish").finish().expect("gzip");
    }

    #[test]
    fn an_archive_unpacks_once_into_its_hash() {
        let tmp = Tmp::new("once");
        let tgz = tmp.0.join("env.tar.gz");
        archive(
            &tgz,
            &[
                ("bin", tar::EntryType::Directory, "", b""),
                ("bin/python", tar::EntryType::Regular, "", b"#!/bin/sh\n"),
                ("bin/python3", tar::EntryType::Symlink, "python", b""),
            ],
        );
        let opts = EnvOptions { cache_dir: tmp.0.join("cache"), ..EnvOptions::default() };
        let root = packed_env(&opts, &tgz).expect("unpacked");
        assert!(root.starts_with(tmp.0.join("cache/packed")));
        assert!(root.join(COMPLETE).is_file());
        assert_eq!(python_in(&root).expect("python"), root.join("bin/python"));
        // A second load finds it complete and unpacks nothing.
        std::fs::remove_file(root.join("bin/python")).expect("rm");
        assert_eq!(packed_env(&opts, &tgz).expect("cached"), root);
        assert!(!root.join("bin/python").exists());
    }

    /// A tarball to build (name; entries of path, type, link target, bytes) and the error it must give.
    type EscapeCase<'a> = (&'a str, &'a [(&'a str, tar::EntryType, &'a str, &'a [u8])], &'a str);

    #[test]
    fn entries_leaving_the_directory_are_refused() {
        let tmp = Tmp::new("escape");
        let opts = EnvOptions { cache_dir: tmp.0.join("cache"), ..EnvOptions::default() };
        let cases: [EscapeCase<'_>; 3] = [
            ("dotdot", &[("../evil", tar::EntryType::Regular, "", b"x")], "climbs out"),
            (
                "symlink",
                &[("out", tar::EntryType::Symlink, "../../..", b""), ("out/evil", tar::EntryType::Regular, "", b"x")],
                "cannot be unpacked inside",
            ),
            ("hardlink", &[("h", tar::EntryType::Link, "../../etc/passwd", b"")], "hard link"),
        ];
        for (tag, entries, why) in cases {
            let tgz = tmp.0.join(format!("{tag}.tar.gz"));
            archive(&tgz, entries);
            let err = packed_env(&opts, &tgz).expect_err(tag).to_string();
            assert!(err.contains("refusing to unpack") && err.contains(why), "{tag}: {err}");
            assert!(err.contains(&tgz.display().to_string()), "{tag}: {err}");
        }
        assert!(!tmp.0.join("evil").exists(), "written through the symlink");
        // Nothing half-unpacked is left to be taken for complete.
        let packed = tmp.0.join("cache/packed");
        for e in std::fs::read_dir(&packed).expect("cache").flatten() {
            assert!(!e.path().join(COMPLETE).exists(), "{}", e.path().display());
        }
    }

    #[test]
    fn a_missing_archive_names_the_parameter() {
        let tmp = Tmp::new("missing");
        let opts = EnvOptions { cache_dir: tmp.0.join("cache"), ..EnvOptions::default() };
        let err = packed_env(&opts, &tmp.0.join("nope.tar.gz")).expect_err("missing").to_string();
        assert!(err.starts_with("parameter EXECUTION_ENV_PATH: ") && err.contains("nope.tar.gz"), "{err}");
    }
}
