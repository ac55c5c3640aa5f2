//! The crate map as a test: which workspace crates may depend on which, and which wire-format
//! libraries each layer must never reach, checked over `cargo metadata` (normal dependencies,
//! transitively; build and dev dependencies do not ship in the crate and are not followed).

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::process::Command;

    use serde_json::Value;

    /// Each workspace crate and the workspace crates it may depend on directly.
    const ALLOWED: &[(&str, &[&str])] = &[
        ("tritium-sync", &[]),
        ("tritium-ipc", &["tritium-sync"]),
        ("tritium-cuda", &[]),
        ("tritium-host", &["tritium-ipc", "tritium-sync"]),
        ("tritium-config", &[]),
        ("tritium-metrics", &["tritium-sync"]),
        ("tritium-trace", &["tritium-sync"]),
        ("tritium-proto", &["tritium-config"]),
        (
            "tritium-server",
            &[
                "tritium-ipc",
                "tritium-host",
                "tritium-config",
                "tritium-metrics",
                "tritium-trace",
                "tritium-cuda",
                "tritium-sync",
            ],
        ),
        ("tritium-http", &["tritium-server"]),
        ("tritium-grpc", &["tritium-server", "tritium-proto"]),
        ("tritium-openai", &["tritium-server", "tritium-sync"]),
        ("tritium-native", &["tritium-ipc", "tritium-cuda", "tritium-sync"]),
    ];

    /// Libraries that a crate must not reach through any chain of normal dependencies.
    const FORBIDDEN: &[(&str, &[&str])] = &[
        ("tritium-sync", &["tokio", "tonic", "axum", "hyper", "serde_json", "prost"]),
        ("tritium-ipc", &["tokio", "tonic", "axum", "hyper", "serde_json", "prost"]),
        ("tritium-cuda", &["tokio", "tonic", "axum", "hyper", "serde_json", "prost"]),
        ("tritium-host", &["tokio", "tonic", "axum", "hyper", "serde_json"]),
        ("tritium-config", &["tonic", "axum", "hyper", "tokio"]),
        ("tritium-metrics", &["tonic", "axum", "hyper", "tokio"]),
        ("tritium-trace", &["tonic", "axum", "hyper", "h2", "tower"]),
        ("tritium-server", &["tonic", "axum", "hyper", "h2", "tower"]),
        ("tritium-native", &["tokio", "tonic", "axum", "hyper", "serde_json"]),
    ];

    /// Libraries a crate must not depend on directly (it may still reach them through a crate
    /// that owns the format: the core reaches serde_json only through tritium-config, which
    /// renders Triton's JSON form of a model config for `initialize(args)`).
    const FORBIDDEN_DIRECT: &[(&str, &[&str])] = &[("tritium-server", &["serde_json", "prost", "prost-reflect"])];

    struct Graph {
        /// Package id to name.
        names: BTreeMap<String, String>,
        /// Package id to the ids of its normal dependencies.
        normal: BTreeMap<String, Vec<String>>,
    }

    fn graph() -> Graph {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--filter-platform", "x86_64-unknown-linux-gnu"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo metadata runs");
        assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
        let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
        let mut names = BTreeMap::new();
        for p in meta["packages"].as_array().expect("packages") {
            names.insert(p["id"].as_str().expect("id").to_owned(), p["name"].as_str().expect("name").to_owned());
        }
        let mut normal = BTreeMap::new();
        for node in meta["resolve"]["nodes"].as_array().expect("resolve.nodes") {
            let deps = node["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .filter(|d| d["dep_kinds"].as_array().is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null())))
                .map(|d| d["pkg"].as_str().expect("pkg").to_owned())
                .collect();
            normal.insert(node["id"].as_str().expect("id").to_owned(), deps);
        }
        Graph { names, normal }
    }

    impl Graph {
        fn id(&self, name: &str) -> &str {
            self.names.iter().find(|(_, n)| *n == name).map(|(id, _)| id.as_str()).expect("crate is in the workspace")
        }

        fn direct(&self, name: &str) -> BTreeSet<&str> {
            self.normal[self.id(name)].iter().map(|id| self.names[id].as_str()).collect()
        }

        /// Every crate reachable from `name`, each with one chain that reaches it.
        fn reach(&self, name: &str) -> BTreeMap<&str, String> {
            let mut seen = BTreeMap::new();
            let mut stack = vec![(self.id(name), name.to_owned())];
            while let Some((id, path)) = stack.pop() {
                for dep in &self.normal[id] {
                    let dep_name = self.names[dep].as_str();
                    if !seen.contains_key(dep_name) {
                        let chain = format!("{path} -> {dep_name}");
                        seen.insert(dep_name, chain.clone());
                        stack.push((dep.as_str(), chain));
                    }
                }
            }
            seen
        }
    }

    #[test]
    fn workspace_crates_depend_only_downwards() {
        let g = graph();
        let mut bad = Vec::new();
        for (krate, allowed) in ALLOWED {
            for dep in g.direct(krate) {
                if dep.starts_with("tritium") && !allowed.contains(&dep) {
                    bad.push(format!("{krate} depends on {dep}; allowed: {allowed:?}"));
                }
            }
        }
        assert!(bad.is_empty(), "crate map violated (see ARCHITECTURE.md):\n{}", bad.join("\n"));
    }

    #[test]
    fn lower_layers_know_no_wire_format() {
        let g = graph();
        let mut bad = Vec::new();
        for (krate, forbidden) in FORBIDDEN {
            let reach = g.reach(krate);
            for lib in *forbidden {
                if let Some(chain) = reach.get(lib) {
                    bad.push(chain.clone());
                }
            }
        }
        for (krate, forbidden) in FORBIDDEN_DIRECT {
            let direct = g.direct(krate);
            for lib in *forbidden {
                if direct.contains(lib) {
                    bad.push(format!("{krate} -> {lib} (direct)"));
                }
            }
        }
        assert!(bad.is_empty(), "layering violated (see ARCHITECTURE.md, Invariants):\n{}", bad.join("\n"));
    }

    #[test]
    fn every_workspace_crate_is_placed_on_the_map() {
        let g = graph();
        let mapped: BTreeSet<&str> = ALLOWED.iter().map(|(k, _)| *k).collect();
        let unmapped: Vec<&str> = g
            .names
            .values()
            .map(String::as_str)
            .filter(|n| n.starts_with("tritium") && *n != "tritium" && !mapped.contains(n))
            .collect();
        assert!(unmapped.is_empty(), "add these crates to the crate map in xtask/src/layering.rs: {unmapped:?}");
    }
}
