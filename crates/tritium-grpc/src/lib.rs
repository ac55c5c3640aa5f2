//! tritium's gRPC frontend: KServe v2 `inference.GRPCInferenceService` (every RPC, with
//! `ModelStreamInfer`) and `grpc.health.v1.Health`, answering as Triton's gRPC server does
//! (`src/grpc/` in `triton-inference-server/server`), so `tritonclient.grpc` and
//! `perf_analyzer -i grpc` work unchanged.
//!
//! Next to them runs tritium's own `tritium.admin.Admin` ([`admin`]), which the `tritium` CLI
//! uses to list stubs and restart them.
//!
//! [`service()`] builds the three tonic services over a [`tritium_server::Server`]; [`serve`] runs
//! them on a listener until a shutdown signal. [`convert`] holds the wire mapping (requests,
//! responses, parameters, statistics, error codes) as plain functions.

pub mod admin;
pub mod convert;
pub mod front_door;
mod infer;
mod limits;
mod service;
mod stream;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::TcpIncoming;
use tritium_proto::admin::admin_server::AdminServer;
use tritium_proto::health::health_server::HealthServer;
use tritium_proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use tritium_server::forward::HeaderForward;
use tritium_server::restricted::Restrictions;
use tritium_server::Server;

pub use admin::AdminService;
pub use convert::{code_for, to_status, MAX_GRPC_MESSAGE_SIZE, MAX_REQUEST_ENTRIES};
pub use service::{HealthService, InferenceService};

/// Frontend options.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--grpc-max-message-size`: the largest message received or sent, in bytes (a compressed
    /// request counts decompressed).
    pub max_message_size: usize,
    /// `--grpc-keepalive-time`: how often an HTTP/2 ping checks an idle connection.
    pub keepalive_interval: Duration,
    /// `--grpc-keepalive-timeout`: how long a ping waits for its answer before the connection
    /// is closed.
    pub keepalive_timeout: Duration,
    /// `--grpc-max-connection-age`: how long a connection may live (None: for ever).
    pub max_connection_age: Option<Duration>,
    /// `--grpc-max-connection-age-grace`: how long an aged connection gets to finish its calls.
    pub max_connection_age_grace: Option<Duration>,
    /// `--grpc-infer-response-compression-level` other than `none`: answers are compressed
    /// with an algorithm the client accepts (gzip or deflate).
    pub compress_responses: bool,
    /// `--grpc-restricted-protocol`: the groups whose calls need a header.
    pub restrictions: Arc<Restrictions>,
    /// `--grpc-header-forward-pattern`: metadata of inference calls forwarded to the model as
    /// request parameters.
    pub header_forward: Option<HeaderForward>,
    /// `--grpc-use-ssl` / `--grpc-use-ssl-mutual`: TLS, checked by [`front_door::Tls::config`].
    pub tls: Option<tonic::transport::ServerTlsConfig>,
}

impl Default for Options {
    /// Triton's defaults.
    fn default() -> Self {
        Self {
            max_message_size: MAX_GRPC_MESSAGE_SIZE,
            keepalive_interval: Duration::from_millis(7_200_000),
            keepalive_timeout: Duration::from_millis(20_000),
            max_connection_age: None,
            max_connection_age_grace: None,
            compress_responses: false,
            restrictions: Arc::default(),
            header_forward: None,
            tls: None,
        }
    }
}

/// The services of the gRPC frontend.
pub type Services =
    (GrpcInferenceServiceServer<InferenceService>, HealthServer<HealthService>, AdminServer<AdminService>);

/// The services of the gRPC frontend over `server`, configured as Triton's: messages up to
/// 2 GiB each way (tonic's default is 4 MiB) and gzip or deflate compressed requests accepted
/// (answers are sent uncompressed, as Triton's default). `admin_token` lets peers other than
/// loopback restart stubs (see [`admin::check_peer`]).
pub fn service(server: Server, admin_token: Option<String>) -> Services {
    build(
        InferenceService::new(server.clone()),
        HealthService::new(server.clone()),
        AdminService::new(server, admin_token),
        &Options::default(),
    )
}

fn build(inference: InferenceService, health: HealthService, admin: AdminService, options: &Options) -> Services {
    let mut inference = GrpcInferenceServiceServer::new(inference)
        .max_decoding_message_size(options.max_message_size)
        .max_encoding_message_size(options.max_message_size)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    if options.compress_responses {
        inference = inference.send_compressed(CompressionEncoding::Gzip).send_compressed(CompressionEncoding::Deflate);
    }
    let health = HealthServer::new(health)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    let admin = AdminServer::new(admin)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    (inference, health, admin)
}

/// Serves the gRPC frontend on `listener` until `shutdown` resolves. Then no connection is
/// accepted, each open `ModelStreamInfer` stream writes the answers it owes and ends with
/// `UNAVAILABLE` ("GRPC server is shutting down ..."), and calls in flight finish before this
/// returns. Accepted sockets get `TCP_NODELAY`, as gRPC servers set it. `admin_token` is as in
/// [`service()`].
pub async fn serve(
    listener: TcpListener,
    server: Server,
    admin_token: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    serve_with(listener, server, admin_token, Options::default(), shutdown).await
}

/// [`serve`] with options.
pub async fn serve_with(
    listener: TcpListener,
    server: Server,
    admin_token: Option<String>,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (down_tx, down_rx) = watch::channel(false);
    let signal = infer::Shutdown::new(down_rx);
    let (inference, health, admin) = build(
        InferenceService::with_shutdown(server.clone(), signal, options.header_forward.clone()),
        HealthService::new(server.clone()),
        AdminService::new(server, admin_token),
        &options,
    );
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let tonic_signal = async move {
        shutdown.await;
        let _ = down_tx.send(true);
    };
    let mut builder = tonic::transport::Server::builder()
        // gRPC's C++ core sizes HTTP/2 flow-control windows by BDP probing, so large tensors
        // are not throttled by the 64 KiB default window; hyper's adaptive window does the same.
        .http2_adaptive_window(Some(true))
        .http2_keepalive_interval(Some(options.keepalive_interval))
        .http2_keepalive_timeout(Some(options.keepalive_timeout));
    if let Some(age) = options.max_connection_age {
        builder = builder.max_connection_age(age);
    }
    if let Some(grace) = options.max_connection_age_grace {
        builder = builder.max_connection_age_grace(grace);
    }
    if let Some(tls) = options.tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .layer(tower::util::MapResponseLayer::new(limits::name_the_flag))
        .layer(front_door::RestrictLayer::new(options.restrictions))
        .layer(tower::util::MapRequestLayer::new(service::arrival_layer))
        .add_service(inference)
        .add_service(health)
        .add_service(admin)
        .serve_with_incoming_shutdown(incoming, tonic_signal)
        .await
}
