//! Style checks that `cargo test` enforces: every Rust file says what lives in it (a `//!` first
//! line), every Python module of the package has a docstring, and no source file uses `unsafe`
//! without a `// SAFETY:` comment next to it.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if name == "target" || name == ".venv" || name == ".git" || name == "__pycache__" {
                continue;
            }
            if p.is_dir() {
                files(&p, ext, out);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn rust_files_start_with_a_module_doc() {
        let mut all = Vec::new();
        for d in ["crates", "stub", "xtask"] {
            files(&root().join(d), "rs", &mut all);
        }
        assert!(all.len() > 20, "found only {} files", all.len());
        let bad: Vec<_> =
            all.iter().filter(|p| !std::fs::read_to_string(p).unwrap_or_default().starts_with("//!")).collect();
        assert!(bad.is_empty(), "files without a `//!` first line: {bad:?}");
    }

    #[test]
    fn python_modules_have_docstrings() {
        let mut all = Vec::new();
        files(&root().join("python/tritium"), "py", &mut all);
        all.push(root().join("python/triton_python_backend_utils.py"));
        let bad: Vec<_> =
            all.iter().filter(|p| !std::fs::read_to_string(p).unwrap_or_default().starts_with("\"\"\"")).collect();
        assert!(bad.is_empty(), "modules without a docstring: {bad:?}");
    }

    #[test]
    fn unsafe_blocks_carry_a_safety_comment() {
        let mut all = Vec::new();
        for d in ["crates", "stub"] {
            files(&root().join(d), "rs", &mut all);
        }
        let mut bad = Vec::new();
        for p in &all {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if !(code.contains("unsafe {") || code.contains("unsafe{")) {
                    continue;
                }
                let window = &lines[i.saturating_sub(8)..=i];
                if !window.iter().any(|l| l.contains("SAFETY:")) {
                    bad.push(format!("{}:{}", p.display(), i + 1));
                }
            }
        }
        assert!(bad.is_empty(), "unsafe blocks without a nearby `// SAFETY:` comment: {bad:?}");
    }
}
