//! Chat templates: Hugging Face's `chat_template` (from `tokenizer_config.json` in the model's
//! directory or its version directory, or `--chat-template FILE`), rendered with minijinja under
//! Hugging Face's conventions: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! `raise_exception(...)`, trimmed blocks, and Python's string methods (`.strip()`, ...).
//!
//! [`Templates`] keeps each file's compiled template until the file changes and renders on
//! blocking threads under [`RenderLimits`]: fuel (template instructions), the prompt's size, and
//! a timeout. The async runtime never runs a template.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use minijinja::{Environment, ErrorKind as JinjaErrorKind};
use serde_json::Value;
use tokio::sync::Semaphore;
use tritium_sync::Locked;

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

fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(JinjaErrorKind::InvalidOperation, message))
}

/// Default of `--chat-template-fuel`: the most minijinja instructions one render may run. A
/// chat template spends tens per message, so this covers hundreds of thousands of messages
/// (more than a 16 MiB body holds) and bounds a template whose loops grow with the input to
/// under a second of one CPU (about 30 million instructions a second were measured).
pub const DEFAULT_FUEL: u64 = 20_000_000;

/// Default of `--chat-template-timeout-ms`: how long a request waits for its prompt, including
/// the wait for a free render slot.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// Default of `--chat-template-max-bytes`: the largest rendered prompt, twice the largest
/// request body (a template adds a few bytes per message).
pub const DEFAULT_MAX_PROMPT_BYTES: usize = 32 << 20;

/// Limits on rendering chat templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderLimits {
    /// `--chat-template-fuel`: the most template instructions one render may run.
    pub fuel: u64,
    /// `--chat-template-timeout-ms`: how long a request waits for its rendered prompt.
    pub timeout: Duration,
    /// `--chat-template-max-bytes`: the largest rendered prompt.
    pub max_bytes: usize,
}

impl Default for RenderLimits {
    fn default() -> Self {
        Self {
            fuel: DEFAULT_FUEL,
            timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
            max_bytes: DEFAULT_MAX_PROMPT_BYTES,
        }
    }
}

/// A chat template compiled once, with the special tokens it is rendered with.
pub struct Compiled {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    origin: String,
    max_bytes: usize,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled").field("origin", &self.origin).finish_non_exhaustive()
    }
}

/// A `Write` that refuses to grow past a limit, so an oversized prompt stops the render
/// instead of filling memory first.
struct Capped {
    out: Vec<u8>,
    max: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len().saturating_add(buf.len()) > self.max {
            self.over = true;
            return Err(std::io::Error::other("the rendered prompt is over the limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Compiled {
    /// Compiles `template` under Hugging Face's conventions, to run at most `limits.fuel`
    /// instructions and write at most `limits.max_bytes` per render.
    pub fn new(template: &ChatTemplate, limits: RenderLimits) -> Result<Self, ApiError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.set_fuel(Some(limits.fuel));
        env.add_template_owned("chat", template.source.clone()).map_err(|e| {
            ApiError::internal(format!("the chat template from {} does not compile: {e}", template.origin))
        })?;
        Ok(Self {
            env,
            bos_token: template.bos_token.clone(),
            eos_token: template.eos_token.clone(),
            origin: template.origin.clone(),
            max_bytes: limits.max_bytes,
        })
    }

    /// Renders the template over `messages` with the generation prompt added.
    pub fn render(&self, messages: &[Value]) -> Result<String, ApiError> {
        self.render_with_tools(messages, None)
    }

    /// Renders the template over `messages` and the request's `tools` (a list of
    /// `{"type": "function", "function": {...}}`, as Hugging Face templates take them).
    pub fn render_with_tools(&self, messages: &[Value], tools: Option<&Value>) -> Result<String, ApiError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ApiError::internal(format!("the chat template from {} does not compile: {e}", self.origin)))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            // As Hugging Face renders them when a request has none.
            tools => tools.map(minijinja::Value::from_serialize).unwrap_or(minijinja::Value::from(())),
            documents => minijinja::Value::from(()),
        };
        let mut out = Capped { out: Vec::new(), max: self.max_bytes, over: false };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(captured) => {
                if let Some((used, _)) = captured.state().fuel_levels() {
                    tracing::debug!(origin = %self.origin, fuel = used, bytes = out.out.len(), "rendered a chat template");
                }
            }
            Err(_) if out.over => {
                return Err(ApiError::invalid(
                    Some("messages"),
                    format!(
                        "the chat prompt rendered from these messages is larger than the limit of {} bytes (server flag --chat-template-max-bytes); send fewer or shorter messages",
                        self.max_bytes
                    ),
                ))
            }
            Err(e) if e.kind() == JinjaErrorKind::OutOfFuel => {
                let fuel = self.env.fuel().unwrap_or_default();
                return Err(ApiError::invalid(
                    Some("messages"),
                    format!(
                        "rendering the chat template from {} over these messages took more than the limit of {fuel} template steps (server flag --chat-template-fuel); send fewer or shorter messages",
                        self.origin
                    ),
                ));
            }
            // raise_exception: the template refuses these messages.
            Err(e) if e.kind() == JinjaErrorKind::InvalidOperation => {
                return Err(ApiError::invalid(
                    Some("messages"),
                    format!("the chat template refused the messages: {}", e.detail().unwrap_or("(no reason)")),
                ))
            }
            Err(e) => {
                return Err(ApiError::internal(format!("rendering the chat template from {} failed: {e}", self.origin)))
            }
        }
        String::from_utf8(out.out)
            .map_err(|_| ApiError::internal(format!("the chat template from {} rendered invalid UTF-8", self.origin)))
    }
}

/// Renders `template` over `messages` once, compiling it first (tests and one-off callers;
/// the frontend keeps compiled templates in [`Templates`]).
pub fn render(template: &ChatTemplate, messages: &[Value]) -> Result<String, ApiError> {
    Compiled::new(template, RenderLimits::default())?.render(messages)
}

/// What identifies one version of a file: a change of its contents or a replacement changes
/// at least one of these (`ctime` moves on every write and rename, and cannot be set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// What a `tokenizer_config.json` held when it was last read: a compiled template, none, or
/// why it could not be used.
type Entry = Result<Option<Arc<Compiled>>, ApiError>;

/// Most files the cache remembers; past it, it starts over (a repository has one or a few per
/// model).
const MAX_CACHED_FILES: usize = 4096;

/// The frontend's compiled chat templates: `--chat-template` compiled once at start, and each
/// model's `tokenizer_config.json` compiled when first used and again only when the file
/// changes (a model reload that brings a new file brings a new stamp), so a request costs a
/// `stat` per place looked at, not a read, a JSON parse and a compilation.
#[derive(Debug)]
pub struct Templates {
    override_template: Option<Result<Arc<Compiled>, ApiError>>,
    files: Mutex<HashMap<PathBuf, (Stamp, Entry)>>,
    limits: RenderLimits,
    /// Renders running at once (each on a blocking thread): half the CPUs, at least one, so
    /// runaway templates leave CPUs to the runtime and the stubs.
    slots: Arc<Semaphore>,
}

impl Templates {
    /// The cache, with `--chat-template` (if any) compiled now.
    pub fn new(override_template: Option<&ChatTemplate>, limits: RenderLimits) -> Self {
        let slots = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
        Self {
            override_template: override_template.map(|t| Compiled::new(t, limits).map(Arc::new)),
            files: Mutex::new(HashMap::new()),
            limits,
            slots: Arc::new(Semaphore::new(slots)),
        }
    }

    /// The template for a model: `--chat-template` when given, else the first
    /// `tokenizer_config.json` with a `chat_template` among `places`; the error names where
    /// tritium looked. Blocking (it reads files): call it off the async runtime.
    pub fn find(&self, model: &str, places: &[PathBuf]) -> Result<Arc<Compiled>, ApiError> {
        if let Some(t) = &self.override_template {
            return t.clone();
        }
        for p in places {
            let Ok(meta) = std::fs::metadata(p) else { continue };
            if !meta.is_file() {
                continue;
            }
            let stamp = Stamp::of(&meta);
            let cached = self.lock().get(p).filter(|(s, _)| *s == stamp).map(|(_, e)| e.clone());
            let entry = match cached {
                Some(entry) => entry,
                None => {
                    let entry = self.load(model, p);
                    let mut files = self.lock();
                    if files.len() >= MAX_CACHED_FILES {
                        files.clear();
                    }
                    files.insert(p.clone(), (stamp, entry.clone()));
                    entry
                }
            };
            if let Some(t) = entry? {
                return Ok(t);
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

    /// Reads and compiles one `tokenizer_config.json`.
    fn load(&self, model: &str, path: &Path) -> Entry {
        match from_tokenizer_config(path) {
            Ok(Some(t)) => Ok(Some(Arc::new(Compiled::new(&t, self.limits)?))),
            Ok(None) => Ok(None),
            Err(e) => Err(ApiError::internal(format!("model '{model}' has a broken chat template: {e}"))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, (Stamp, Entry)>> {
        self.files.locked()
    }

    /// Finds the model's template and renders `messages` with it on a blocking thread, one
    /// render per two CPUs at once, answering within `--chat-template-timeout-ms`: the async
    /// runtime (every frontend and health check) never waits for a template. A render that
    /// outlives the timeout keeps its slot until its fuel runs out.
    pub async fn render(
        self: &Arc<Self>,
        model: &str,
        places: Vec<PathBuf>,
        messages: Vec<Value>,
        tools: Option<Value>,
    ) -> Result<String, ApiError> {
        let deadline = tokio::time::Instant::now() + self.limits.timeout;
        let timed_out = || {
            let mut e = ApiError::internal(format!(
                "rendering the chat template of model '{model}' took more than the limit of {} ms (server flag --chat-template-timeout-ms); retry later, or send fewer or shorter messages",
                self.limits.timeout.as_millis()
            ));
            e.status = StatusCode::SERVICE_UNAVAILABLE;
            e
        };
        let permit = match tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(ApiError::internal("the chat template renderer is closed")),
            Err(_) => return Err(timed_out()),
        };
        let this = self.clone();
        let name = model.to_owned();
        let job = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            this.find(&name, &places)?.render_with_tools(&messages, tools.as_ref())
        });
        match tokio::time::timeout_at(deadline, job).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => {
                Err(ApiError::internal(format!("rendering the chat template of model '{model}' failed: {e}")))
            }
            Err(_) => Err(timed_out()),
        }
    }
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

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tritium-openai-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn tokenizer_config_forms() {
        let dir = temp_dir("tmpl");
        std::fs::create_dir_all(dir.join("3")).expect("dir");
        let cfg = dir.join("3/tokenizer_config.json");
        std::fs::write(
            &cfg,
            json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ bos_token }}"}], "bos_token": {"content": "<b>"}})
                .to_string(),
        )
        .expect("write");
        let places = candidates(&dir, &["1".into(), "3".into()]);
        assert_eq!(places[0], dir.join("tokenizer_config.json"));
        assert_eq!(places[1], cfg);
        let templates = Templates::new(None, RenderLimits::default());
        let t = templates.find("m", &places).expect("found in the version directory");
        assert_eq!(t.render(&[]).expect("renders"), "D<b>");
        std::fs::remove_file(&cfg).expect("rm");
        let e = templates.find("m", &places).expect_err("none");
        assert!(e.message.contains(&cfg.display().to_string()), "{}", e.message);
        assert!(e.message.contains("--chat-template"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compiled_templates_are_kept_until_their_file_changes() {
        let dir = temp_dir("cache");
        let cfg = dir.join("tokenizer_config.json");
        let write = |source: &str| {
            std::fs::write(&cfg, json!({ "chat_template": source }).to_string()).expect("write");
        };
        write("one");
        let places = candidates(&dir, &[]);
        let templates = Templates::new(None, RenderLimits::default());
        let first = templates.find("m", &places).expect("found");
        let again = templates.find("m", &places).expect("found");
        assert!(Arc::ptr_eq(&first, &again), "the second request reuses the compiled template");
        // A new file (as a model update brings) is read and compiled again, even with the
        // same length.
        write("two");
        let changed = templates.find("m", &places).expect("found");
        assert!(!Arc::ptr_eq(&first, &changed));
        assert_eq!(changed.render(&[]).expect("renders"), "two");
        // A broken file is an error, remembered until the file changes.
        std::fs::write(&cfg, "{not json").expect("write");
        let e = templates.find("m", &places).expect_err("broken");
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert_eq!(templates.find("m", &places).expect_err("still broken"), e);
        write("{% for %}");
        let e = templates.find("m", &places).expect_err("does not compile");
        assert!(e.message.contains("does not compile"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_override_wins_and_is_compiled_once() {
        let t = tmpl("{{ messages | length }}");
        let templates = Templates::new(Some(&t), RenderLimits::default());
        let a = templates.find("m", &[]).expect("override");
        let b = templates.find("other", &[]).expect("override");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.render(&[json!({"role": "user", "content": "x"})]).expect("renders"), "1");
    }

    /// A template whose work grows with the square of the messages.
    const QUADRATIC: &str = "{% for a in messages %}{% for b in messages %}{{ a.content }}{% endfor %}{% endfor %}";

    fn messages(n: usize, content: &str) -> Vec<Value> {
        (0..n).map(|_| json!({"role": "user", "content": content})).collect()
    }

    #[test]
    fn fuel_stops_a_runaway_template_with_a_400_naming_the_flag() {
        let limits = RenderLimits { fuel: 100_000, ..RenderLimits::default() };
        let t = Compiled::new(&tmpl(QUADRATIC), limits).expect("compiles");
        assert_eq!(t.render(&messages(3, "x")).expect("small input renders"), "xxxxxxxxx");
        let e = t.render(&messages(1000, "x")).expect_err("out of fuel");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("100000 template steps"), "{}", e.message);
        assert!(e.message.contains("--chat-template-fuel"), "{}", e.message);
    }

    #[test]
    fn the_rendered_size_is_capped_while_rendering() {
        let limits = RenderLimits { max_bytes: 1000, ..RenderLimits::default() };
        let t = Compiled::new(&tmpl("{% for m in messages %}{{ m.content }}{% endfor %}"), limits).expect("compiles");
        assert_eq!(t.render(&messages(10, &"x".repeat(100))).expect("exactly the limit").len(), 1000);
        let e = t.render(&messages(11, &"x".repeat(100))).expect_err("over the limit");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("1000 bytes"), "{}", e.message);
        assert!(e.message.contains("--chat-template-max-bytes"), "{}", e.message);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn renders_run_off_the_runtime_and_time_out() {
        // Fuel for about a second of work (which the runtime waits for when it is dropped at
        // the end of the test), and a shorter timeout.
        let limits = RenderLimits { fuel: 30_000_000, timeout: Duration::from_millis(200), ..RenderLimits::default() };
        let silent = "{% for a in messages %}{% for b in messages %}{% endfor %}{% endfor %}";
        let templates = Arc::new(Templates::new(Some(&tmpl(silent)), limits));
        let started = std::time::Instant::now();
        // The runtime's one worker keeps ticking while the render runs.
        let ticker = tokio::spawn(async move {
            let mut ticks = 0u32;
            while started.elapsed() < Duration::from_millis(150) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks += 1;
            }
            ticks
        });
        let e = templates.render("m", Vec::new(), messages(20_000, "x"), None).await.expect_err("times out");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.message.contains("200 ms"), "{}", e.message);
        assert!(e.message.contains("--chat-template-timeout-ms"), "{}", e.message);
        assert!(ticker.await.expect("ticker") >= 5, "the runtime was not blocked");
    }
}
