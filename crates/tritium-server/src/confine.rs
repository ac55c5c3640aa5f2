//! Paths named by a model config, kept inside the model's directory.
//!
//! A config can come from a client (a load request's `config` override, `pb_utils.load_model`)
//! as well as from the repository, so every file it names (`EXECUTION_ENV_PATH`, the
//! `requirements` parameter, `default_model_filename`, `label_filename`, a warmup sample's
//! `input_data_file`) is resolved here: `$$TRITON_MODEL_DIRECTORY` expanded, a relative path
//! taken from its base directory, and the result, with every symlink followed, must lie inside
//! the model's directory or inside a directory the operator allowed with `--allow-config-path`.
//! An error never says what a refused path holds, only that it is outside.

use std::path::{Component, Path, PathBuf};

/// What `$$TRITON_MODEL_DIRECTORY` stands for in a config's paths: the model's directory.
pub const MODEL_DIRECTORY: &str = "$$TRITON_MODEL_DIRECTORY";

/// Directories outside model directories that config paths may name (`--allow-config-path`).
#[derive(Debug, Clone, Default)]
pub struct PathPolicy {
    /// Each allowed directory (itself and everything below it).
    pub allowed: Vec<PathBuf>,
}

/// Why a config's path was refused.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The path leaves the model's directory (lexically, or through a symlink).
    #[error(
        "{what} '{value}' is outside the model's directory: a model config may name only files inside its model \
         directory (start the server with --allow-config-path DIR to allow another directory)"
    )]
    Outside {
        /// What named it (`parameter EXECUTION_ENV_PATH`, `label_filename of output 'X'`).
        what: String,
        /// The path as the config wrote it.
        value: String,
    },
    /// The path names nothing.
    #[error("{what} '{value}' does not exist in the model's directory")]
    Missing {
        /// What named it.
        what: String,
        /// The path as the config wrote it.
        value: String,
    },
}

impl PathPolicy {
    /// `value` (from `what` in the config of the model in `model_dir`) resolved against `base`
    /// (the model directory or one below it), or why it may not be used. The path must exist.
    pub fn resolve(&self, what: &str, value: &str, model_dir: &Path, base: &Path) -> Result<PathBuf, PathError> {
        let outside = || PathError::Outside { what: what.to_string(), value: value.to_string() };
        let expanded = value.replace(MODEL_DIRECTORY, &model_dir.display().to_string());
        let joined = base.join(&expanded);
        let lexical = normalize(&joined).ok_or_else(outside)?;
        let model_dir_lexical = normalize(model_dir).ok_or_else(outside)?;
        let allowed_lexical: Vec<PathBuf> = self.allowed.iter().filter_map(|d| normalize(d)).collect();
        let inside = |p: &Path, root: &Path, allowed: &[PathBuf]| {
            p.starts_with(root) || allowed.iter().any(|d| p.starts_with(d))
        };
        // First without touching the file system, so a refused path's existence is not revealed.
        if !inside(&lexical, &model_dir_lexical, &allowed_lexical) {
            return Err(outside());
        }
        let real = std::fs::canonicalize(&lexical)
            .map_err(|_| PathError::Missing { what: what.to_string(), value: value.to_string() })?;
        let model_dir_real = std::fs::canonicalize(model_dir).unwrap_or(model_dir_lexical);
        let allowed_real: Vec<PathBuf> =
            self.allowed.iter().map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone())).collect();
        if !inside(&real, &model_dir_real, &allowed_real) {
            return Err(outside());
        }
        Ok(real)
    }
}

impl PathPolicy {
    /// The bytes of the file `value` names (resolved as [`PathPolicy::resolve`] does), which must
    /// be a regular file (not a device or a fifo that never ends) of at most `max` bytes; `limit`
    /// names that limit in the error. The error says why, for the caller to prefix.
    pub fn read_bounded(
        &self,
        what: &str,
        value: &str,
        model_dir: &Path,
        base: &Path,
        max: u64,
        limit: &str,
    ) -> Result<Vec<u8>, String> {
        let path = self.resolve(what, value, model_dir, base).map_err(|e| e.to_string())?;
        let file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
        let meta = file.metadata().map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err("not a regular file".into());
        }
        if meta.len() > max {
            return Err(format!("{} bytes, more than {limit} ({max})", meta.len()));
        }
        let mut data = Vec::with_capacity(meta.len() as usize);
        // The file may grow after the check: never read past the limit.
        std::io::Read::read_to_end(&mut std::io::Read::take(file, max + 1), &mut data).map_err(|e| e.to_string())?;
        if data.len() as u64 > max {
            return Err(format!("more than {limit} ({max})"));
        }
        Ok(data)
    }
}

/// `path` made absolute (from the current directory) with `.` and `..` resolved lexically;
/// None when `..` would climb above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let absolute = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir().ok()?.join(path) };
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => out.push(c.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
            Component::Normal(n) => out.push(n),
        }
    }
    Some(out)
}

/// Whether `name` is one plain file name: no separator, not `.` or `..`, not empty.
pub(crate) fn is_plain_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!((components.next(), components.next()), (Some(Component::Normal(_)), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tmp(PathBuf);

    impl Tmp {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("tritium-confine-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("repo/m/1")).expect("mkdir");
            std::fs::create_dir_all(dir.join("shared")).expect("mkdir");
            std::fs::write(dir.join("repo/m/requirements.txt"), "six\n").expect("write");
            std::fs::write(dir.join("repo/m/1/model.py"), "").expect("write");
            std::fs::write(dir.join("shared/env.tar.gz"), "").expect("write");
            std::fs::write(dir.join("secret"), "root:x:0:0\n").expect("write");
            std::os::unix::fs::symlink(dir.join("secret"), dir.join("repo/m/link")).expect("symlink");
            Self(dir)
        }
    }

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn paths_stay_inside_the_model_directory_unless_allowed() {
        let tmp = Tmp::new("inside");
        let m = tmp.0.join("repo/m");
        let none = PathPolicy::default();
        let ok = |p: &PathPolicy, v: &str| p.resolve("parameter requirements", v, &m, &m);
        assert!(ok(&none, "requirements.txt").expect("relative").ends_with("repo/m/requirements.txt"));
        assert!(ok(&none, "$$TRITON_MODEL_DIRECTORY/requirements.txt").is_ok());
        assert!(ok(&none, "./1/../requirements.txt").is_ok());
        let secret = tmp.0.join("secret").display().to_string();
        for refused in [secret.as_str(), "../../secret", "/etc/passwd", "/proc/self/environ", "link", "../m/link"] {
            let e = ok(&none, refused).expect_err(refused);
            assert!(matches!(e, PathError::Outside { .. }), "{refused}: {e}");
            assert!(e.to_string().contains("--allow-config-path"), "{e}");
            assert!(!e.to_string().contains("root:x"), "{e}");
        }
        // A missing file outside is "outside", never "does not exist": no probing the host.
        assert!(matches!(ok(&none, "/nonexistent/x").expect_err("outside"), PathError::Outside { .. }));
        assert!(matches!(ok(&none, "absent.txt").expect_err("missing"), PathError::Missing { .. }));
        let shared = PathPolicy { allowed: vec![tmp.0.join("shared")] };
        let env = tmp.0.join("shared/env.tar.gz").display().to_string();
        assert!(ok(&shared, &env).is_ok());
        assert!(ok(&none, &env).is_err());
        assert!(ok(&shared, &secret).is_err());
    }

    #[test]
    fn plain_names_have_one_component() {
        assert!(is_plain_name("model.py") && is_plain_name("model.onnx"));
        for bad in ["", ".", "..", "../model.py", "/etc/passwd", "a/b"] {
            assert!(!is_plain_name(bad), "{bad}");
        }
    }
}
