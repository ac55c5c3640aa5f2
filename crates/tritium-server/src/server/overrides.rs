//! A load request's model files (Triton's `file:<path>` load parameters, and the `files` of
//! `pb_utils.load_model`): written into a fresh private directory that stands for the model's
//! directory while any version loaded from it lives, then removed.
//!
//! As in Triton, files need a `config` override (the directory has no `config.pbtxt` of its own),
//! a model loaded with files need not exist in the repository, and every path must stay inside
//! the model's directory. Paths are checked lexically before anything is written: a path is
//! always taken from the model directory (a leading `/` too, as Triton's `JoinPath` does), no
//! `..` may climb out, no name may be empty or hold a NUL. The directory is new and only this
//! module writes into it, so no symlink can redirect a write.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

use crate::types::{InferError, ModelFile, FILE_PREFIX};

/// Most files one load request may carry.
pub(crate) const MAX_LOAD_FILES: usize = 4096;
/// Most bytes of one file (Triton's limit: `INT_MAX`).
pub(crate) const MAX_LOAD_FILE_BYTES: usize = i32::MAX as usize;
/// Most bytes of all of one load request's files together.
pub(crate) const MAX_LOAD_FILES_BYTES: u64 = 4 << 30;

/// A model directory written from a load request's files; removed when dropped (when the last
/// version loaded from it is gone).
#[derive(Debug)]
pub(crate) struct OverrideDir {
    path: PathBuf,
}

impl OverrideDir {
    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for OverrideDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            warn!(dir = %self.path.display(), "cannot remove a model directory written from a load request: {e}");
        }
    }
}

/// Checks `files` (for model `name`, with or without a `config` override) and writes them into
/// a new directory under the system's temporary directory. Errors carry Triton's texts.
pub(crate) fn write(name: &str, has_config: bool, files: Vec<ModelFile>) -> Result<OverrideDir, InferError> {
    if !has_config {
        // Triton logs the reason and answers that the model could not be polled.
        return Err(InferError::invalid(format!(
            "failed to load '{name}', failed to poll from model repository: Load parameter 'config' must be \
             specified for model file override"
        )));
    }
    if files.len() > MAX_LOAD_FILES {
        return Err(InferError::invalid(format!(
            "failed to load '{name}': the request has {} files, over the limit of {MAX_LOAD_FILES} files per load",
            files.len()
        )));
    }
    let mut total = 0u64;
    for f in &files {
        if f.contents.len() > MAX_LOAD_FILE_BYTES {
            return Err(InferError::invalid(format!(
                "'{FILE_PREFIX}{}' exceeds the maximum allowed data size limit INT_MAX",
                f.path
            )));
        }
        total += f.contents.len() as u64;
    }
    if total > MAX_LOAD_FILES_BYTES {
        return Err(InferError::invalid(format!(
            "failed to load '{name}': its files hold {total} bytes, over the limit of {MAX_LOAD_FILES_BYTES} bytes \
             per load"
        )));
    }
    let dir = OverrideDir { path: create_private_dir(name)? };
    for f in &files {
        let relative = confined(&f.path).ok_or_else(|| {
            let shown = lexical_join(dir.path(), &f.path);
            InferError::invalid(format!(
                "Invalid file parameter '{FILE_PREFIX}{}' with normalized path '{}' must stay within model directory.",
                f.path,
                shown.display()
            ))
        })?;
        let target = dir.path().join(&relative);
        if let Some(parent) = target.parent() {
            if parent.exists() && !parent.is_dir() {
                return Err(InferError::invalid(format!(
                    "Invalid file parameter '{FILE_PREFIX}{}', directory has been created as a file",
                    f.path
                )));
            }
            std::fs::create_dir_all(parent).map_err(|e| write_error(&f.path, &e))?;
        }
        if target.is_dir() {
            return Err(InferError::invalid(format!(
                "Invalid file parameter '{FILE_PREFIX}{}': a directory of that name was created for another file",
                f.path
            )));
        }
        std::fs::write(&target, &f.contents).map_err(|e| write_error(&f.path, &e))?;
    }
    Ok(dir)
}

fn write_error(path: &str, e: &std::io::Error) -> InferError {
    InferError::internal(format!("failed to write model file '{FILE_PREFIX}{path}': {e}"))
}

/// `path` as a relative path that stays inside the directory it is joined to, or None: not
/// empty, no NUL, and no `..` that climbs above the start. A leading `/` is dropped (Triton
/// joins the path to the model directory as it is), and `.` and inner `..` are resolved
/// lexically, as Triton's `weakly_canonical` does.
fn confined(path: &str) -> Option<PathBuf> {
    if path.is_empty() || path.contains('\0') {
        return None;
    }
    let mut out = PathBuf::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir => {}
            Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// `dir` joined with `path` and normalized lexically, for an error message.
fn lexical_join(dir: &Path, path: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in dir.join(path.replace('\0', "").trim_start_matches('/')).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// A new directory only this user can read, under the system's temporary directory.
fn create_private_dir(name: &str) -> Result<PathBuf, InferError> {
    use std::os::unix::fs::DirBuilderExt;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let mut last = None;
    for _ in 0..16 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let path = base.join(format!("tritium-model-{}-{name}-{n}-{nanos:x}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(InferError::internal(format!(
                    "failed to load '{name}': cannot create a directory for its files under {}: {e}",
                    base.display()
                )))
            }
        }
    }
    Err(InferError::internal(format!(
        "failed to load '{name}': cannot create a directory for its files under {}: {}",
        base.display(),
        last.map_or_else(String::new, |e| e.to_string())
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, contents: &[u8]) -> ModelFile {
        ModelFile { path: path.into(), contents: contents.to_vec() }
    }

    #[test]
    fn paths_stay_inside_the_model_directory() {
        assert_eq!(confined("1/model.py"), Some(PathBuf::from("1/model.py")));
        assert_eq!(confined("./1/../1/model.py"), Some(PathBuf::from("1/model.py")));
        assert_eq!(confined("/1/model.py"), Some(PathBuf::from("1/model.py")));
        for bad in ["", "/", "../x", "/../x", "1/../../x", ".", "1/..", "a\0b"] {
            assert_eq!(confined(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn files_are_written_and_removed_with_the_directory() {
        let dir = write("m", true, vec![file("1/model.py", b"x = 1\n"), file("labels.txt", b"a\n")]).expect("write");
        let path = dir.path().to_path_buf();
        assert_eq!(std::fs::read(path.join("1/model.py")).expect("model.py"), b"x = 1\n");
        assert_eq!(std::fs::read(path.join("labels.txt")).expect("labels"), b"a\n");
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn refusals_carry_tritons_texts() {
        let e = write("m", false, vec![file("1/model.py", b"")]).expect_err("no config");
        assert!(e.message.contains("failed to load 'm', failed to poll from model repository"), "{}", e.message);
        assert!(e.message.contains("Load parameter 'config' must be specified for model file override"));
        let e = write("m", true, vec![file("../escape.py", b"")]).expect_err("escape");
        assert!(e.message.starts_with("Invalid file parameter 'file:../escape.py' with normalized path '"));
        assert!(e.message.ends_with("' must stay within model directory."), "{}", e.message);
        let e = write("m", true, vec![file("1", b""), file("1/model.py", b"")]).expect_err("file as dir");
        assert!(e.message.contains("directory has been created as a file"), "{}", e.message);
        let many = (0..=MAX_LOAD_FILES).map(|i| file(&format!("f{i}"), b"")).collect();
        assert!(write("m", true, many).is_err());
    }
}
