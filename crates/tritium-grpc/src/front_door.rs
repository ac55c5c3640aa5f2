//! Who may call what, and over what: restricted protocols (`--grpc-restricted-protocol`, a
//! layer that refuses a call of a restricted group without its `triton-grpc-protocol-<key>`
//! header, with Triton's status and text) and TLS (`--grpc-use-ssl`, `--grpc-use-ssl-mutual`)
//! through tonic's rustls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::Status;
use tower::{Layer, Service};
use tritium_server::restricted::{ApiGroup, Restrictions};

/// The group of a gRPC method, from the request's path (`/<service>/<method>`), as Triton's
/// `grpc_server.cc` assigns them; `admin` holds tritium's own service.
pub fn group_of(path: &str) -> Option<ApiGroup> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    match service {
        "grpc.health.v1.Health" => Some(ApiGroup::Health),
        "tritium.admin.Admin" => Some(ApiGroup::Admin),
        "inference.GRPCInferenceService" => Some(match method {
            "ServerLive" | "ServerReady" | "ModelReady" => ApiGroup::Health,
            "ServerMetadata" | "ModelMetadata" => ApiGroup::Metadata,
            "ModelInfer" | "ModelStreamInfer" => ApiGroup::Inference,
            "ModelConfig" => ApiGroup::ModelConfig,
            "ModelStatistics" => ApiGroup::Statistics,
            "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => ApiGroup::ModelRepository,
            "TraceSetting" => ApiGroup::Trace,
            "LogSettings" => ApiGroup::Logging,
            m if m.starts_with("SystemSharedMemory") || m.starts_with("CudaSharedMemory") => ApiGroup::SharedMemory,
            _ => return None,
        }),
        _ => None,
    }
}

/// Triton's refusal of a call without its group's header (`CommonCallData::Execute`).
pub fn refusal(header: &str) -> Status {
    Status::unavailable(format!("This protocol is restricted, expecting header '{header}'"))
}

/// The layer that applies [`Restrictions`] to every call before it reaches a service.
#[derive(Clone, Debug)]
pub struct RestrictLayer(Arc<Restrictions>);

impl RestrictLayer {
    /// A layer enforcing `restrictions`.
    pub fn new(restrictions: Arc<Restrictions>) -> Self {
        Self(restrictions)
    }
}

impl<S> Layer<S> for RestrictLayer {
    type Service = Restrict<S>;
    fn layer(&self, inner: S) -> Restrict<S> {
        Restrict { inner, restrictions: self.0.clone() }
    }
}

/// The service [`RestrictLayer`] makes.
#[derive(Clone, Debug)]
pub struct Restrict<S> {
    inner: S,
    restrictions: Arc<Restrictions>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Restrict<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if let Some(group) = group_of(req.uri().path()) {
            let header = self.restrictions.get(group).map(|r| r.header.as_str());
            let found = header.and_then(|h| req.headers().get(h)).map(|v| v.as_bytes());
            if let Err(header) = self.restrictions.check(group, found) {
                tracing::debug!(path = req.uri().path(), "refused: {group} is restricted");
                let resp = refusal(header).into_http();
                return Box::pin(async move { Ok(resp) });
            }
        }
        Box::pin(self.inner.call(req))
    }
}

/// gRPC over TLS: PEM contents read from the flags' files.
#[derive(Clone, Debug)]
pub struct Tls {
    /// `--grpc-server-cert`: the server's certificate chain.
    pub cert: Vec<u8>,
    /// `--grpc-server-key`: the server's private key.
    pub key: Vec<u8>,
    /// `--grpc-root-cert`: the CA that signs client certificates (used with mutual TLS).
    pub root: Option<Vec<u8>>,
    /// `--grpc-use-ssl-mutual`: clients must present a certificate signed by `root`.
    pub mutual: bool,
}

/// Why [`Tls::config`] failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file has no block of the kind its flag needs.
    #[error("{flag}: the file has no PEM {what} (-----BEGIN {what}-----)")]
    NotPem {
        /// The flag.
        flag: &'static str,
        /// What was looked for.
        what: &'static str,
    },
    /// Mutual TLS without a root certificate.
    #[error("--grpc-use-ssl-mutual needs --grpc-root-cert: the CA certificate that signs the clients' certificates")]
    NoRoot,
    /// rustls refused the certificate or key.
    #[error("--grpc-server-cert/--grpc-server-key: the certificate or key is not usable: {0}")]
    Rejected(String),
}

impl Tls {
    /// tonic's TLS configuration, checked now so that a bad file stops the start.
    pub fn config(&self) -> Result<ServerTlsConfig, TlsError> {
        let has = |pem: &[u8], what: &str| {
            let text = String::from_utf8_lossy(pem);
            text.lines().any(|l| l.starts_with("-----BEGIN ") && l.contains(what))
        };
        if !has(&self.cert, "CERTIFICATE") {
            return Err(TlsError::NotPem { flag: "--grpc-server-cert", what: "CERTIFICATE" });
        }
        if !has(&self.key, "PRIVATE KEY") {
            return Err(TlsError::NotPem { flag: "--grpc-server-key", what: "PRIVATE KEY" });
        }
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(&self.cert, &self.key));
        if self.mutual {
            let root = self.root.as_ref().ok_or(TlsError::NoRoot)?;
            if !has(root, "CERTIFICATE") {
                return Err(TlsError::NotPem { flag: "--grpc-root-cert", what: "CERTIFICATE" });
            }
            config = config.client_ca_root(Certificate::from_pem(root)).client_auth_optional(false);
        }
        // Building the acceptor is where rustls parses and checks the files.
        tonic::transport::Server::builder()
            .tls_config(config.clone())
            .map_err(|e| TlsError::Rejected(error_chain(&e)))?;
        Ok(config)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_fall_in_tritons_groups() {
        let svc = |m: &str| group_of(&format!("/inference.GRPCInferenceService/{m}"));
        assert_eq!(svc("ModelInfer"), Some(ApiGroup::Inference));
        assert_eq!(svc("ModelStreamInfer"), Some(ApiGroup::Inference));
        assert_eq!(svc("ServerLive"), Some(ApiGroup::Health));
        assert_eq!(svc("ModelReady"), Some(ApiGroup::Health));
        assert_eq!(svc("ModelMetadata"), Some(ApiGroup::Metadata));
        assert_eq!(svc("ModelConfig"), Some(ApiGroup::ModelConfig));
        assert_eq!(svc("ModelStatistics"), Some(ApiGroup::Statistics));
        assert_eq!(svc("RepositoryModelLoad"), Some(ApiGroup::ModelRepository));
        assert_eq!(svc("TraceSetting"), Some(ApiGroup::Trace));
        assert_eq!(svc("LogSettings"), Some(ApiGroup::Logging));
        assert_eq!(svc("CudaSharedMemoryRegister"), Some(ApiGroup::SharedMemory));
        assert_eq!(svc("SystemSharedMemoryStatus"), Some(ApiGroup::SharedMemory));
        assert_eq!(svc("Nope"), None);
        assert_eq!(group_of("/grpc.health.v1.Health/Check"), Some(ApiGroup::Health));
        assert_eq!(group_of("/tritium.admin.Admin/Restart"), Some(ApiGroup::Admin));
        assert_eq!(group_of("/other.Service/Call"), None);
        assert_eq!(group_of("nonsense"), None);
    }

    #[test]
    fn refusal_is_tritons() {
        let s = refusal("triton-grpc-protocol-key");
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert_eq!(s.message(), "This protocol is restricted, expecting header 'triton-grpc-protocol-key'");
    }

    #[test]
    fn tls_files_are_checked_by_flag() {
        let tls = |cert: &str, key: &str, root: Option<&str>, mutual| Tls {
            cert: cert.as_bytes().to_vec(),
            key: key.as_bytes().to_vec(),
            root: root.map(|r| r.as_bytes().to_vec()),
            mutual,
        };
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        let e = tls("junk", key, None, false).config().expect_err("no cert");
        assert!(e.to_string().starts_with("--grpc-server-cert:"), "{e}");
        let e = tls(cert, "junk", None, false).config().expect_err("no key");
        assert!(e.to_string().starts_with("--grpc-server-key:"), "{e}");
        let e = tls(cert, key, None, true).config().expect_err("no root");
        assert!(e.to_string().contains("--grpc-root-cert"), "{e}");
        let e = tls(cert, key, Some("junk"), true).config().expect_err("bad root");
        assert!(e.to_string().starts_with("--grpc-root-cert:"), "{e}");
        let e = tls(cert, key, None, false).config().expect_err("not a real certificate");
        assert!(matches!(e, TlsError::Rejected(_)), "{e}");
    }
}
