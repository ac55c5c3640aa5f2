//! tritium's OpenAI-compatible frontend, served natively next to KServe v2: `POST
//! /v1/chat/completions`, `POST /v1/completions` (streamed as server-sent events or answered
//! whole), `GET /v1/models` and `GET /v1/models/{model}`, over the repository's vLLM-shaped and
//! TensorRT-LLM-shaped models ([`shape`]), mapped as Triton's OpenAI frontend maps them.
//!
//! [`start`] binds the listener and serves until a shutdown future completes; [`router`] builds
//! the axum router. Chat prompts come from the model's Hugging Face chat template
//! ([`template`]), compiled once per file and rendered off the async runtime under limits. A
//! client that disconnects drops the request's response stream, which the model sees as
//! `is_cancelled()`. `--http-restricted-api` applies here too: `/v1/models` is the `metadata`
//! group, completions and chat the `inference` group.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tritium_server::restricted::Restrictions;
use tritium_server::Server;

pub mod answer;
pub mod embeddings;
mod error;
pub mod logprobs;
pub mod lora;
pub mod metrics;
pub mod request;
mod routes;
pub mod shape;
pub mod sse;
pub mod template;
pub mod tools;

pub use error::ApiError;
pub use metrics::Metrics;
pub use template::{ChatTemplate, RenderLimits};

/// The port Triton's OpenAI frontend listens on by default (tritium serves OpenAI only when
/// `--openai-port` is given).
pub const TRITON_DEFAULT_PORT: u16 = 9000;

/// Why the frontend could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiError {
    /// `--chat-template` names a file that cannot be read.
    #[error("cannot read the chat template {path}: {source}")]
    Template {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The address is not valid.
    #[error("invalid --host {0:?} for the OpenAI frontend")]
    Address(String),
    /// The port is taken or not allowed.
    #[error("cannot listen for the OpenAI frontend on {addr}: {source}; is another server using the port? (choose another with --openai-port)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Frontend options.
#[derive(Debug, Clone)]
pub struct Options {
    /// The model repository, where each model's `tokenizer_config.json` is looked for.
    pub repository: PathBuf,
    /// `--chat-template`: a template for every model, overriding theirs.
    pub chat_template: Option<ChatTemplate>,
    /// `--chat-template-fuel`, `--chat-template-timeout-ms`, `--chat-template-max-bytes`.
    pub template_limits: RenderLimits,
    /// `--http-restricted-api`: `/v1/models` is the `metadata` group, the generation endpoints
    /// the `inference` group.
    pub restrictions: Arc<Restrictions>,
    /// `--max-output-bytes`: the most text a whole (not streamed) answer collects.
    pub max_output_bytes: u64,
    /// `--tool-call-parser`: how chat answers are read for tool calls (`tool_choice` `auto`).
    pub tool_call_parser: Option<tools::Format>,
    /// `--max-tool-call-parse-bytes`: the most text a streamed tool-call parse holds.
    pub max_tool_call_parse_bytes: usize,
    /// `--lora-separator`: `<model><SEP><adapter>` selects a LoRA adapter of the model.
    pub lora_separator: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            repository: PathBuf::new(),
            chat_template: None,
            template_limits: RenderLimits::default(),
            restrictions: Arc::default(),
            max_output_bytes: tritium_server::DEFAULT_MAX_OUTPUT_BYTES,
            tool_call_parser: None,
            max_tool_call_parse_bytes: tools::DEFAULT_MAX_PARSE_BYTES,
            lora_separator: None,
        }
    }
}

impl Options {
    /// Options for `repository`, reading the `--chat-template` file when one is given (a Jinja
    /// file, or a `tokenizer_config.json` holding a `chat_template`).
    pub fn new(repository: &Path, chat_template: Option<&Path>) -> Result<Self, OpenAiError> {
        let chat_template = match chat_template {
            None => None,
            Some(path) => {
                let source = std::fs::read_to_string(path)
                    .map_err(|source| OpenAiError::Template { path: path.to_owned(), source })?;
                let from_config = path
                    .extension()
                    .is_some_and(|e| e == "json")
                    .then(|| template::from_tokenizer_config(path).ok().flatten())
                    .flatten();
                Some(from_config.unwrap_or(ChatTemplate {
                    source,
                    bos_token: String::new(),
                    eos_token: String::new(),
                    origin: path.display().to_string(),
                }))
            }
        };
        Ok(Self { repository: repository.to_owned(), chat_template, ..Self::default() })
    }
}

/// The router over `server`, and the metrics it records.
pub fn router(server: Server, options: Options) -> (axum::Router, Arc<Metrics>) {
    routes::build_router(server, options)
}

/// A started frontend.
pub struct Started {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its metrics, for the `/metrics` page.
    pub metrics: Arc<Metrics>,
    /// The serving task; it ends after `shutdown` completes and the requests in flight finish.
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Binds the frontend's listener.
async fn bind(host: &str, port: u16) -> Result<(tokio::net::TcpListener, SocketAddr), OpenAiError> {
    let addr: SocketAddr = format!("{host}:{port}").parse().map_err(|_| OpenAiError::Address(host.to_owned()))?;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| OpenAiError::Bind { addr, source })?;
    let addr = listener.local_addr().map_err(|source| OpenAiError::Bind { addr, source })?;
    Ok((listener, addr))
}

/// Binds `host:port` and serves the OpenAI frontend over `server` until `shutdown` completes.
pub async fn start(
    host: &str,
    port: u16,
    server: Server,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Started, OpenAiError> {
    let (listener, addr) = bind(host, port).await?;
    let (app, metrics) = router(server, options);
    let task = tokio::spawn(async move {
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("could not set TCP_NODELAY: {e}");
            }
        });
        axum::serve(listener, app).with_graceful_shutdown(shutdown).await
    });
    Ok(Started { addr, metrics, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_template_flag_reads_jinja_or_tokenizer_config() {
        let dir = std::env::temp_dir().join(format!("tritium-openai-opts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let jinja = dir.join("t.jinja");
        std::fs::write(&jinja, "{{ messages[0].content }}").expect("write");
        let o = Options::new(&dir, Some(&jinja)).expect("reads");
        assert_eq!(o.chat_template.as_ref().map(|t| t.source.as_str()), Some("{{ messages[0].content }}"));
        let cfg = dir.join("tokenizer_config.json");
        std::fs::write(&cfg, r#"{"chat_template": "C", "eos_token": "</s>"}"#).expect("write");
        let o = Options::new(&dir, Some(&cfg)).expect("reads");
        let t = o.chat_template.expect("template");
        assert_eq!((t.source.as_str(), t.eos_token.as_str()), ("C", "</s>"));
        let missing = Options::new(&dir, Some(&dir.join("nope"))).expect_err("missing file");
        assert!(missing.to_string().contains("nope"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_taken_port_is_a_clear_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let e = bind("127.0.0.1", port).await.expect_err("the port is taken");
        assert!(e.to_string().contains("--openai-port"), "{e}");
        let e = bind("not a host", 1).await.expect_err("bad host");
        assert!(e.to_string().contains("--host"), "{e}");
    }
}
