//! Style checks that `cargo test` enforces: every Rust file says what lives in it (a `//!` first
//! line), every Python module of the package has a docstring, no source file uses `unsafe`
//! without a `// SAFETY:` comment next to it, and every crate the build links is under a licence
//! on `ALLOWED_LICENCES` (read from `cargo metadata` for this machine's platform).

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

    /// The licences a dependency may have (SPDX ids): permissive ones, and MPL-2.0 (file-level
    /// copyleft, which a dependency used unmodified does not reach).
    const ALLOWED_LICENCES: &[&str] = &[
        "MIT",
        "Apache-2.0",
        "Apache-2.0 WITH LLVM-exception",
        "BSD-2-Clause",
        "BSD-3-Clause",
        "ISC",
        "Zlib",
        "0BSD",
        "Unlicense",
        "BSL-1.0",
        "CC0-1.0",
        "Unicode-3.0",
        "Unicode-DFS-2016",
        "MPL-2.0",
    ];

    /// Whether an SPDX expression (`A OR B`, `A AND B`, parentheses, `X WITH Y`, and the old
    /// `A/B` for OR) can be met with allowed licences only.
    fn licence_allowed(expr: &str) -> bool {
        let spaced = expr.replace('(', " ( ").replace(')', " ) ").replace('/', " OR ");
        let tokens: Vec<&str> = spaced.split_whitespace().collect();
        let mut at = 0;
        let ok = or_expr(&tokens, &mut at);
        ok && at == tokens.len()
    }

    fn or_expr(t: &[&str], at: &mut usize) -> bool {
        let mut ok = and_expr(t, at);
        while t.get(*at) == Some(&"OR") {
            *at += 1;
            ok |= and_expr(t, at);
        }
        ok
    }

    fn and_expr(t: &[&str], at: &mut usize) -> bool {
        let mut ok = term(t, at);
        while t.get(*at) == Some(&"AND") {
            *at += 1;
            ok &= term(t, at);
        }
        ok
    }

    fn term(t: &[&str], at: &mut usize) -> bool {
        if t.get(*at) == Some(&"(") {
            *at += 1;
            let ok = or_expr(t, at);
            if t.get(*at) == Some(&")") {
                *at += 1;
                return ok;
            }
            return false;
        }
        let Some(id) = t.get(*at) else { return false };
        *at += 1;
        let mut licence = id.to_string();
        if t.get(*at) == Some(&"WITH") {
            let Some(exception) = t.get(*at + 1) else { return false };
            licence = format!("{licence} WITH {exception}");
            *at += 2;
        }
        ALLOWED_LICENCES.contains(&licence.as_str())
    }

    #[test]
    fn licence_expressions_are_read_as_spdx() {
        assert!(licence_allowed("MIT OR Apache-2.0"));
        assert!(licence_allowed("MIT/Apache-2.0"));
        assert!(licence_allowed("(MIT OR Apache-2.0) AND Unicode-3.0"));
        assert!(licence_allowed("Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT"));
        assert!(licence_allowed("MIT OR Apache-2.0 OR LGPL-2.1-or-later"));
        assert!(!licence_allowed("GPL-3.0-only"));
        assert!(!licence_allowed("MIT AND GPL-2.0-only"));
        assert!(!licence_allowed("(MIT"));
        assert!(!licence_allowed(""));
    }

    #[test]
    fn every_dependency_has_an_allowed_licence() {
        let platform = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
        let out = std::process::Command::new(env!("CARGO"))
            .current_dir(root())
            .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", &platform])
            .output()
            .expect("cargo metadata");
        assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
        let mut bad = Vec::new();
        for p in meta["packages"].as_array().expect("packages") {
            let name = p["name"].as_str().unwrap_or("?");
            match p["license"].as_str() {
                Some(expr) if licence_allowed(expr) => {}
                Some(expr) => bad.push(format!("{name}: {expr}")),
                None => bad.push(format!("{name}: no licence field")),
            }
        }
        assert!(bad.is_empty(), "dependencies whose licence is not on ALLOWED_LICENCES: {bad:?}");
    }
}
