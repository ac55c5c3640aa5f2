//! Chat templates: Hugging Face's `chat_template` (from `tokenizer_config.json` in the model's
//! directory or its version directory, or `--chat-template FILE`), rendered with minijinja under
//! Hugging Face's conventions: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! `raise_exception(...)`, trimmed blocks, and Python's string methods (`.strip()`, ...).

use std::path::{Path, PathBuf};

use minijinja::{Environment, ErrorKind as JinjaErrorKind};
use serde_json::Value;

use crate::error::ApiError;

/// A template and the special tokens it is rendered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The Jinja source.
    pub source: String,
    /// `bos_token`.
    pub bos_token: String,
    /// `eos_token`.
    pub eos_token: String,
    /// Where it came from, for errors.
    pub origin: String,
}

/// A special token as `tokenizer_config.json` holds it: a string or `{"content": ...}`.
fn token(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or_default().to_owned(),
        _ => String::new(),
    }
}

/// Reads a `tokenizer_config.json`; `Ok(None)` when it has no `chat_template`.
pub fn from_tokenizer_config(path: &Path) -> Result<Option<ChatTemplate>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let config: Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
    let source = match config.get("chat_template") {
        Some(Value::String(s)) => s.clone(),
        // A list of named templates: the one named "default", else the first.
        Some(Value::Array(list)) => {
            let named = |n: &str| list.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(n));
            match named("default").or_else(|| list.first()).and_then(|t| t.get("template")).and_then(Value::as_str) {
                Some(s) => s.to_owned(),
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(ChatTemplate {
        source,
        bos_token: token(config.get("bos_token")),
        eos_token: token(config.get("eos_token")),
        origin: path.display().to_string(),
    }))
}

/// The places a model's `tokenizer_config.json` is looked for: the model's directory, then each
/// version directory (newest first).
pub fn candidates(model_dir: &Path, versions: &[String]) -> Vec<PathBuf> {
    let mut out = vec![model_dir.join("tokenizer_config.json")];
    let mut versions: Vec<i64> = versions.iter().filter_map(|v| v.parse().ok()).collect();
    versions.sort_unstable_by(|a, b| b.cmp(a));
    out.extend(versions.into_iter().map(|v| model_dir.join(v.to_string()).join("tokenizer_config.json")));
    out
}

/// Finds the template for a model: `--chat-template` when given, else the first
/// `tokenizer_config.json` with a `chat_template` among `candidates`; the error names where
/// tritium looked.
pub fn find(
    override_template: Option<&ChatTemplate>,
    model: &str,
    places: &[PathBuf],
) -> Result<ChatTemplate, ApiError> {
    if let Some(t) = override_template {
        return Ok(t.clone());
    }
    for p in places {
        if !p.is_file() {
            continue;
        }
        match from_tokenizer_config(p) {
            Ok(Some(t)) => return Ok(t),
            Ok(None) => {}
            Err(e) => return Err(ApiError::internal(format!("model '{model}' has a broken chat template: {e}"))),
        }
    }
    let looked: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
    Err(ApiError::invalid(
        Some("messages"),
        format!(
            "model '{model}' has no chat template: tritium looked for a \"chat_template\" in {}; add a tokenizer_config.json with one, start the server with --chat-template FILE, or use /v1/completions",
            looked.join(", ")
        ),
    ))
}

fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(JinjaErrorKind::InvalidOperation, message))
}

/// Renders `template` over `messages` with the generation prompt added.
pub fn render(template: &ChatTemplate, messages: &[Value]) -> Result<String, ApiError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    let broken = |e: minijinja::Error| {
        ApiError::internal(format!("the chat template from {} does not compile: {e}", template.origin))
    };
    env.add_template("chat", &template.source).map_err(broken)?;
    let tmpl = env.get_template("chat").map_err(broken)?;
    let ctx = minijinja::context! {
        messages => messages,
        add_generation_prompt => true,
        bos_token => template.bos_token,
        eos_token => template.eos_token,
        // As Hugging Face renders them when a request has neither.
        tools => minijinja::Value::from(()),
        documents => minijinja::Value::from(()),
    };
    tmpl.render(ctx).map_err(|e| {
        if e.kind() == JinjaErrorKind::InvalidOperation {
            // raise_exception: the template refuses these messages.
            ApiError::invalid(
                Some("messages"),
                format!("the chat template refused the messages: {}", e.detail().unwrap_or("(no reason)")),
            )
        } else {
            ApiError::internal(format!("rendering the chat template from {} failed: {e}", template.origin))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tmpl(source: &str) -> ChatTemplate {
        ChatTemplate { source: source.into(), bos_token: "<s>".into(), eos_token: "</s>".into(), origin: "test".into() }
    }

    #[test]
    fn hf_conventions_render() {
        let t = tmpl(
            "{{ bos_token }}{% for m in messages %}\n{% if m['role'] == 'system' and not loop.first %}{{ raise_exception('system first') }}{% endif %}\n<|{{ m['role'] }}|>{{ m['content'].strip() }}{{ eos_token }}{% endfor %}\n{% if add_generation_prompt %}<|assistant|>{% endif %}",
        );
        let out = render(&t, &[json!({"role": "user", "content": "  hi  "})]).expect("renders");
        assert_eq!(out, "<s><|user|>hi</s><|assistant|>");
        let e = render(&t, &[json!({"role": "user", "content": "a"}), json!({"role": "system", "content": "b"})])
            .expect_err("raises");
        assert!(e.message.contains("system first"), "{}", e.message);
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn a_chatml_style_template_with_namespace_and_tools_check() {
        let t = tmpl(concat!(
            "{%- set ns = namespace(system=false) %}",
            "{%- if tools is not none %}{{ raise_exception('no tools') }}{%- endif %}",
            "{%- for message in messages %}",
            "{%- if message.role == 'system' %}{%- set ns.system = true %}{%- endif %}",
            "{{- '<|im_start|>' + message.role + '\n' + message['content'] | trim + '<|im_end|>\n' }}",
            "{%- if loop.last and add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}",
            "{%- endfor %}",
            "{%- if not ns.system %}{{- '(no system) ' + messages | length | string }}{%- endif %}",
        ));
        let out = render(&t, &[json!({"role": "user", "content": " hi "})]).expect("renders");
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n(no system) 1");
    }

    #[test]
    fn tokenizer_config_forms() {
        let dir = std::env::temp_dir().join(format!("tritium-openai-tmpl-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("3")).expect("dir");
        let cfg = dir.join("3/tokenizer_config.json");
        std::fs::write(
            &cfg,
            json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}], "bos_token": {"content": "<b>"}})
                .to_string(),
        )
        .expect("write");
        let places = candidates(&dir, &["1".into(), "3".into()]);
        assert_eq!(places[0], dir.join("tokenizer_config.json"));
        assert_eq!(places[1], cfg);
        let t = find(None, "m", &places).expect("found in the version directory");
        assert_eq!(t.source, "D");
        assert_eq!(t.bos_token, "<b>");
        std::fs::remove_file(&cfg).expect("rm");
        let e = find(None, "m", &places).expect_err("none");
        assert!(e.message.contains(&cfg.display().to_string()), "{}", e.message);
        assert!(e.message.contains("--chat-template"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
