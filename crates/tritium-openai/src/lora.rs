//! LoRA adapters (`--lora-separator SEP`), as Triton's OpenAI frontend serves them: a model
//! named `<model><SEP><adapter>` selects the adapter `<adapter>` of `<model>`, listed in the
//! `multi_lora.json` (`{"name": "path", ...}`) of the model's newest version directory. A
//! vLLM-shaped model lists its adapters only when its `model.json` sets `enable_lora`; the
//! adapter then reaches it as `lora_name` in the sampling parameters. A TensorRT-LLM-shaped model
//! gets `lora_task_id` (the adapter's place in the list, from 1), and with the adapter's first
//! request `lora_weights` and `lora_config`, read from `model.lora_weights.npy` and
//! `model.lora_config.npy` in the adapter's directory (a path relative to the model repository,
//! which must stay inside it).

use std::path::{Path, PathBuf};

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;
use tritium_server::DataType;

/// `multi_lora.json`'s entries in file order.
struct Ordered(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of adapter names to paths")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, String>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(V)
    }
}

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
    entries(&dir).map(|e| e.into_iter().map(|(name, _)| name).collect())
}

/// The entries of the `multi_lora.json` in `dir`, in order (a list that cannot be read is logged).
fn entries(dir: &Path) -> Option<Vec<(String, String)>> {
    let path = dir.join("multi_lora.json");
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str::<Ordered>(&text) {
        Ok(Ordered(list)) => Some(list),
        Err(e) => {
            tracing::warn!(path = %path.display(), "multi_lora.json is not a JSON object of adapter names to paths: {e}");
            None
        }
    }
}

/// A TensorRT-LLM adapter: its task id and directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrtAdapter {
    /// `lora_task_id`: the adapter's place in `multi_lora.json`, from 1.
    pub task_id: u64,
    /// Its directory, inside the repository.
    pub dir: PathBuf,
}

/// Finds adapter `name` of the TensorRT-LLM-shaped model in `model_dir` and checks its path as
/// Triton does: relative, inside `repository`, a directory holding both `.npy` files. Errors
/// name the path as written, never the real one.
pub fn trtllm_adapter(
    repository: &Path,
    model_dir: &Path,
    versions: &[String],
    name: &str,
) -> Result<TrtAdapter, String> {
    let list = version_dir(model_dir, versions).and_then(|d| entries(&d)).unwrap_or_default();
    let (index, (_, path)) =
        list.iter().enumerate().find(|(_, (n, _))| n == name).ok_or_else(|| format!("Unknown LoRA: {name}"))?;
    if Path::new(path).is_absolute() {
        return Err(format!("LoRA path '{path}' for '{name}' must be a relative path inside its model repository"));
    }
    let repo = repository.canonicalize().map_err(|_| "the model repository cannot be read".to_owned())?;
    let dir = repo
        .join(path)
        .canonicalize()
        .map_err(|_| format!("LoRA directory '{path}' not found for '{name}' in its model repository"))?;
    if !dir.starts_with(&repo) {
        return Err(format!("LoRA path '{path}' for '{name}' must be inside its model repository"));
    }
    for file in ["model.lora_weights.npy", "model.lora_config.npy"] {
        if !dir.join(file).is_file() {
            return Err(format!("LoRA file '{file}' not found for '{name}' in '{path}'"));
        }
    }
    Ok(TrtAdapter { task_id: index as u64 + 1, dir })
}

/// A tensor read from a `.npy` file.
#[derive(Debug, Clone, PartialEq)]
pub struct Npy {
    /// Its type.
    pub datatype: DataType,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its bytes (little-endian, C order).
    pub data: Vec<u8>,
}

/// Reads a `.npy` file (format 1.0 to 3.0, C order, little-endian numbers or booleans).
pub fn read_npy(path: &Path) -> Result<Npy, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let bad = |why: &str| format!("{} is not a .npy file this server reads: {why}", path.display());
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("no NUMPY magic"));
    }
    let (len, start) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        _ => return Err(bad("unknown version")),
    };
    let header = bytes.get(start..start + len).ok_or_else(|| bad("truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| bad("header is not text"))?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}':"))? + key.len() + 3;
        Some(header[at..].trim_start())
    };
    let descr = field("descr")
        .and_then(|d| d.strip_prefix('\''))
        .and_then(|d| d.split('\'').next())
        .ok_or_else(|| bad("no descr"))?;
    if field("fortran_order").is_some_and(|f| f.starts_with("True")) {
        return Err(bad("Fortran order"));
    }
    let datatype = match descr {
        "<f2" => DataType::Fp16,
        "<f4" => DataType::Fp32,
        "<f8" => DataType::Fp64,
        "<i4" => DataType::Int32,
        "<i8" => DataType::Int64,
        "<u8" => DataType::Uint64,
        "|i1" => DataType::Int8,
        "|u1" => DataType::Uint8,
        "|b1" => DataType::Bool,
        other => return Err(bad(&format!("dtype {other}"))),
    };
    let shape_text = field("shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let shape: Vec<i64> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i64>().map_err(|_| bad("bad shape")))
        .collect::<Result<_, _>>()?;
    let data = bytes[start + len..].to_vec();
    let elements: i64 = shape.iter().product();
    let size = match datatype {
        DataType::Fp16 => 2,
        DataType::Fp32 | DataType::Int32 => 4,
        DataType::Fp64 | DataType::Int64 | DataType::Uint64 => 8,
        _ => 1,
    };
    if usize::try_from(elements).ok().and_then(|n| n.checked_mul(size)) != Some(data.len()) {
        return Err(bad("the data does not match the shape"));
    }
    Ok(Npy { datatype, shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn npy_files_are_read() {
        let dir = std::env::temp_dir().join(format!("tritium-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join("a.npy");
        std::fs::write(&p, npy("<i4", "(1, 2, 3)", &[0u8; 24])).expect("write");
        let t = read_npy(&p).expect("reads");
        assert_eq!((t.datatype, t.shape.clone(), t.data.len()), (DataType::Int32, vec![1, 2, 3], 24));
        std::fs::write(&p, npy("<f2", "(4,)", &[0u8; 8])).expect("write");
        assert_eq!(read_npy(&p).expect("reads").shape, vec![4]);
        std::fs::write(&p, npy("<f2", "(5,)", &[0u8; 8])).expect("write");
        assert!(read_npy(&p).expect_err("short").contains("does not match"));
        std::fs::write(&p, b"nope").expect("write");
        assert!(read_npy(&p).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn trtllm_adapters_stay_inside_the_repository() {
        let repo = std::env::temp_dir().join(format!("tritium-trt-lora-{}", std::process::id()));
        let model = repo.join("m");
        std::fs::create_dir_all(model.join("1")).expect("dir");
        std::fs::create_dir_all(repo.join("loras/b")).expect("dir");
        for f in ["model.lora_weights.npy", "model.lora_config.npy"] {
            std::fs::write(repo.join("loras/b").join(f), b"x").expect("write");
        }
        let list = r#"{"z": "loras/missing", "b": "loras/b", "abs": "/etc", "out": "../.."}"#;
        std::fs::write(model.join("1/multi_lora.json"), list).expect("write");
        let a = trtllm_adapter(&repo, &model, &["1".into()], "b").expect("found");
        assert_eq!(a.task_id, 2, "file order, from 1");
        assert!(trtllm_adapter(&repo, &model, &[], "z").expect_err("missing").contains("not found"));
        assert!(trtllm_adapter(&repo, &model, &[], "abs").expect_err("absolute").contains("relative"));
        assert!(trtllm_adapter(&repo, &model, &[], "out").expect_err("outside").contains("inside"));
        assert!(trtllm_adapter(&repo, &model, &[], "nope").expect_err("unknown").contains("Unknown LoRA"));
        assert_eq!(adapters(&model, &[], false).expect("listed"), vec!["z", "b", "abs", "out"]);
        let _ = std::fs::remove_dir_all(&repo);
    }

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
