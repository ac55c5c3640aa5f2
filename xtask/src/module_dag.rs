//! The module maps as tests: the top-level modules of `crates/tritium-server/src`, and of every
//! other crate's `src` (a file
//! `x.rs` and its directory `x/` are one module) must form a DAG, read from their `crate::`
//! paths (`use crate::x::...`, `crate::x::f()`, `use crate::{x, y::z}`) and from `super::` paths
//! that climb out of a nested file to the crate root. A cycle fails the test, named with one
//! place where each of its edges is written.
//!
//! Comments are skipped; `lib.rs` is the crate root, not a module, and re-exports what it likes.
//! A top-level file's `super::` is not followed (in its `mod tests` it names the file itself):
//! reach another module from there through `crate::`.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// Module -> the modules it uses, each with one place (file:line) that uses it.
    type Graph = BTreeMap<String, BTreeMap<String, String>>;

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/tritium-server/src")
    }

    /// The `src` directory of every crate of the workspace but the core (which has its own test)
    /// and xtask: `crates/*/src` and the stub's.
    fn other_crates() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("src"))
            .filter(|p| p.is_dir() && !p.ends_with("tritium-server/src"))
            .collect();
        dirs.push(root.join("stub/src"));
        dirs.sort();
        dirs
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    fn is_ident(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_'
    }

    /// The identifier at the start of `s`.
    fn ident(s: &str) -> &str {
        let end = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
        &s[..end]
    }

    /// The first segments of the paths a `use` group names: `{a, b::c, d::{e}}` -> a, b, d.
    fn group_heads(s: &str) -> Vec<&str> {
        let mut heads = Vec::new();
        let mut depth = 0;
        let mut at_head = true;
        for (i, c) in s.char_indices() {
            match c {
                '{' => {
                    depth += 1;
                    at_head = depth == 1;
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => at_head = true,
                c if at_head && depth == 1 && is_ident(c) => {
                    heads.push(ident(&s[i..]));
                    at_head = false;
                }
                _ => {}
            }
        }
        heads
    }

    /// The modules `line` names through paths that reach the crate root, for a file `depth`
    /// directories below `src`.
    fn named_modules(line: &str, depth: usize) -> Vec<&str> {
        let code = line.split("//").next().unwrap_or("");
        let mut out = Vec::new();
        let mut from = 0;
        while let Some(found) = code[from..].find(['c', 's']) {
            let pos = from + found;
            from = pos + 1;
            if code[..pos].ends_with(is_ident) {
                continue;
            }
            let tail = &code[pos..];
            let after = if let Some(t) = tail.strip_prefix("crate::") {
                Some(t)
            } else if tail.starts_with("super::") && depth > 0 {
                // `super::` climbs one directory from a nested file; reaching the root takes
                // one more than the file's depth (`src/x/y.rs`: `super::super::`).
                let mut t = tail;
                let mut climbs = 0;
                while let Some(next) = t.strip_prefix("super::") {
                    t = next;
                    climbs += 1;
                }
                (climbs > depth).then_some(t)
            } else {
                None
            };
            match after {
                Some(t) if t.starts_with('{') => out.extend(group_heads(t)),
                Some(t) => out.push(ident(t)),
                None => {}
            }
        }
        out
    }

    fn graph(src: &Path) -> Graph {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        files.sort();
        let module_of = |p: &Path| -> Option<String> {
            let rel = p.strip_prefix(src).ok()?;
            let first = rel.components().next()?.as_os_str().to_str()?;
            let name = first.strip_suffix(".rs").unwrap_or(first);
            (name != "lib").then(|| name.to_string())
        };
        let modules: BTreeSet<String> = files.iter().filter_map(|p| module_of(p)).collect();
        let mut graph: Graph = modules.iter().map(|m| (m.clone(), BTreeMap::new())).collect();
        for file in &files {
            let Some(from) = module_of(file) else { continue };
            let depth = file.strip_prefix(src).map_or(0, |r| r.components().count() - 1);
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for to in named_modules(line, depth) {
                    if to != from && modules.contains(to) {
                        let place = format!("{}:{}", file.strip_prefix(src).unwrap_or(file).display(), n + 1);
                        graph.entry(from.clone()).or_default().entry(to.to_string()).or_insert(place);
                    }
                }
            }
        }
        graph
    }

    /// One cycle of `graph`, as the modules along it (the first repeated at the end).
    fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
        fn visit(
            node: &str,
            graph: &Graph,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| p == node) {
                let mut cycle = path[i..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            if done.contains(node) {
                return None;
            }
            path.push(node.to_string());
            for next in graph.get(node).map(|e| e.keys()).into_iter().flatten() {
                if let Some(cycle) = visit(next, graph, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            done.insert(node.to_string());
            None
        }
        let mut done = BTreeSet::new();
        graph.keys().find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
    }

    #[test]
    fn paths_are_read_from_uses_groups_and_nested_files() {
        assert_eq!(named_modules("use crate::scheduler::{Pending, Queue};", 0), ["scheduler"]);
        assert_eq!(
            named_modules("use crate::{stats::Stats, types::{A, B}, off_runtime};", 0),
            ["stats", "types", "off_runtime"]
        );
        assert_eq!(named_modules("let x = crate::validate::wire_type(t); // crate::shm", 0), ["validate"]);
        assert_eq!(named_modules("use super::super::cache::Lookup;", 1), ["cache"]);
        assert!(named_modules("use super::Version;", 1).is_empty());
        assert!(named_modules("use super::*;", 0).is_empty());
        assert!(named_modules("fn supercrate::x()", 0).is_empty());
        assert!(named_modules("scrate::x", 0).is_empty());
        let g: Graph = [("a", &["b"][..]), ("b", &["c"]), ("c", &["a"]), ("d", &["a"])]
            .iter()
            .map(|(m, to)| (m.to_string(), to.iter().map(|t| (t.to_string(), String::new())).collect()))
            .collect();
        assert_eq!(find_cycle(&g), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
        let dag: Graph = [("a", &["b"][..]), ("b", &[]), ("c", &["a", "b"])]
            .iter()
            .map(|(m, to)| (m.to_string(), to.iter().map(|t| (t.to_string(), String::new())).collect()))
            .collect();
        assert_eq!(find_cycle(&dag), None);
    }

    /// The cycle of `src`'s module graph, described with one place per edge, if it has one.
    fn cycle_in(src: &Path) -> Option<String> {
        let graph = graph(src);
        let cycle = find_cycle(&graph)?;
        let edges: Vec<String> =
            cycle.windows(2).map(|w| format!("  {} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]])).collect();
        Some(format!("the modules of {} form a cycle: {}\n{}", src.display(), cycle.join(" -> "), edges.join("\n")))
    }

    #[test]
    fn the_core_modules_form_a_dag() {
        let graph = graph(&src());
        assert!(graph.len() > 10, "found only {} modules in {}", graph.len(), src().display());
        if let Some(cycle) = cycle_in(&src()) {
            panic!(
                "{cycle}\n(see ARCHITECTURE.md: move what both sides need into a leaf module, or call back \
                 through a trait)"
            );
        }
    }

    #[test]
    fn every_crates_modules_form_a_dag() {
        let crates = other_crates();
        assert!(crates.len() > 8, "found only {} crates", crates.len());
        let cycles: Vec<String> = crates.iter().filter_map(|src| cycle_in(src)).collect();
        assert!(
            cycles.is_empty(),
            "{}\n(move what both sides need into a leaf module, such as error.rs or types.rs)",
            cycles.join("\n")
        );
    }
}
