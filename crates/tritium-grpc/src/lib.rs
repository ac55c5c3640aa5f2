//! tritium's gRPC frontend: KServe v2 `inference.GRPCInferenceService` (every RPC, with
//! `ModelStreamInfer`) and `grpc.health.v1.Health`, answering as Triton's gRPC server does
//! (`src/grpc/` in `triton-inference-server/server`), so `tritonclient.grpc` and
//! `perf_analyzer -i grpc` work unchanged.
//!
//! [`service`] builds the two tonic services over a [`tritium_server::Server`]; [`serve`] runs
//! them on a listener until a shutdown signal. [`convert`] holds the wire mapping (requests,
//! responses, parameters, statistics, error codes) as plain functions.

pub mod convert;
mod service;
mod stream;

use std::future::Future;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::TcpIncoming;
use tritium_proto::health::health_server::HealthServer;
use tritium_proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use tritium_server::Server;

pub use convert::{code_for, to_status, MAX_GRPC_MESSAGE_SIZE};
pub use service::{HealthService, InferenceService};

/// The two services of the gRPC frontend over `server`, configured as Triton's: messages up to
/// 2 GiB each way (tonic's default is 4 MiB) and gzip or deflate compressed requests accepted
/// (answers are sent uncompressed, as Triton's default).
pub fn service(server: Server) -> (GrpcInferenceServiceServer<InferenceService>, HealthServer<HealthService>) {
    build(InferenceService::new(server.clone()), HealthService::new(server))
}

fn build(
    inference: InferenceService,
    health: HealthService,
) -> (GrpcInferenceServiceServer<InferenceService>, HealthServer<HealthService>) {
    let inference = GrpcInferenceServiceServer::new(inference)
        .max_decoding_message_size(MAX_GRPC_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_GRPC_MESSAGE_SIZE)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    let health = HealthServer::new(health)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    (inference, health)
}

/// Serves the gRPC frontend on `listener` until `shutdown` resolves. Then no connection is
/// accepted, each open `ModelStreamInfer` stream writes the answers it owes and ends with
/// `UNAVAILABLE` ("GRPC server is shutting down ..."), and calls in flight finish before this
/// returns. Accepted sockets get `TCP_NODELAY`, as gRPC servers set it.
pub async fn serve(
    listener: TcpListener,
    server: Server,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (down_tx, down_rx) = watch::channel(false);
    let signal = service::Shutdown::new(down_rx);
    let (inference, health) =
        build(InferenceService::with_shutdown(server.clone(), signal), HealthService::new(server));
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let tonic_signal = async move {
        shutdown.await;
        let _ = down_tx.send(true);
    };
    tonic::transport::Server::builder()
        // gRPC's C++ core sizes HTTP/2 flow-control windows by BDP probing, so large tensors
        // are not throttled by the 64 KiB default window; hyper's adaptive window does the same.
        .http2_adaptive_window(Some(true))
        .add_service(inference)
        .add_service(health)
        .serve_with_incoming_shutdown(incoming, tonic_signal)
        .await
}
