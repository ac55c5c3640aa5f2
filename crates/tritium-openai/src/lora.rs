//! LoRA adapters (`--lora-separator SEP`), as Triton's OpenAI frontend serves them: a model
//! named `<model><SEP><adapter>` selects the adapter `<adapter>` of `<model>`, listed in the
//! `multi_lora.json` (`{"name": "path", ...}`) of the model's newest version directory. A
//! vLLM-shaped model lists its adapters only when its `model.json` sets `enable_lora`; the
//! adapter then reaches it as `lora_name` in the sampling parameters.

use std::path::Path;

use serde_json::Value;

/// Splits a requested model name into the model and the adapter, as Triton's frontend does:
/// only a name with exactly one separator names an adapter.
pub fn split<'a>(name: &'a str, separator: Option<&str>) -> (&'a str, Option<&'a str>) {
    let Some(sep) = separator.filter(|s| !s.is_empty()) else { return (name, None) };
    let mut parts = name.split(sep);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(model), Some(adapter), None) => (model, Some(adapter)),
        _ => (name, None),
    }
}

/// The newest numeric version directory of `model_dir` among `versions` (or on disk).
fn version_dir(model_dir: &Path, versions: &[String]) -> Option<std::path::PathBuf> {
    let newest = versions.iter().filter_map(|v| v.parse::<u64>().ok()).max().or_else(|| {
        std::fs::read_dir(model_dir).ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok()).max()
    })?;
    Some(model_dir.join(newest.to_string()))
}

/// The adapters of the model in `model_dir`, in `multi_lora.json` order, or `None` when it has
/// none (no list, LoRA not enabled for a vLLM-shaped model, or a list that cannot be read, which
/// is logged).
pub fn adapters(model_dir: &Path, versions: &[String], vllm: bool) -> Option<Vec<String>> {
    let dir = version_dir(model_dir, versions)?;
    if vllm {
        let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).ok()?).ok()?;
        let enabled = match config.get("enable_lora") {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
            _ => false,
        };
        if !enabled {
            return None;
        }
    }
    let path = dir.join("multi_lora.json");
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str::<serde_json::Map<String, Value>>(&text) {
        Ok(map) => Some(map.keys().cloned().collect()),
        Err(e) => {
            tracing::warn!(path = %path.display(), "multi_lora.json is not a JSON object of adapter names to paths: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_on_exactly_one_separator() {
        assert_eq!(split("m_lora_a", Some("_lora_")), ("m", Some("a")));
        assert_eq!(split("m", Some("_lora_")), ("m", None));
        assert_eq!(split("a_lora_b_lora_c", Some("_lora_")), ("a_lora_b_lora_c", None));
        assert_eq!(split("m:x", None), ("m:x", None));
        assert_eq!(split("m:x", Some("")), ("m:x", None));
    }

    #[test]
    fn adapters_come_from_multi_lora_json_when_enabled() {
        let dir = std::env::temp_dir().join(format!("tritium-lora-{}", std::process::id()));
        let v = dir.join("2");
        std::fs::create_dir_all(&v).expect("dir");
        std::fs::create_dir_all(dir.join("1")).expect("dir");
        std::fs::write(v.join("multi_lora.json"), r#"{"doc": "/a", "sql": "/b"}"#).expect("write");
        assert_eq!(adapters(&dir, &[], false), Some(vec!["doc".to_owned(), "sql".to_owned()]));
        assert_eq!(adapters(&dir, &["2".into()], true), None, "vLLM needs enable_lora");
        std::fs::write(v.join("model.json"), r#"{"enable_lora": "true"}"#).expect("write");
        assert_eq!(adapters(&dir, &["2".into()], true).map(|a| a.len()), Some(2));
        assert_eq!(adapters(&dir, &["1".into()], false), None, "version 1 has no list");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
