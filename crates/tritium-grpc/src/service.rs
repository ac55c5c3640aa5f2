//! The `inference.GRPCInferenceService` and `grpc.health.v1.Health` implementations over a
//! [`tritium_server::Server`]: each RPC decodes with [`crate::convert`], calls the server, and
//! encodes the answer or the error (Triton's code, the message unchanged).

use std::collections::HashMap;

use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tritium_proto::health::health_check_response::ServingStatus;
use tritium_proto::health::health_server::Health;
use tritium_proto::health::{HealthCheckRequest, HealthCheckResponse};
use tritium_proto::inference::grpc_inference_service_server::GrpcInferenceService;
use tritium_proto::inference::*;
use tritium_server::forward::HeaderForward;
use tritium_server::trace::{SpanContext, TraceParent, UpdateValue};
use tritium_server::{parse_version, ErrorKind, InferError, ParamValue, Server};

use crate::convert::{self, to_status};
use crate::infer::{run, Shutdown};
use crate::stream;

/// When the request arrived, recorded by [`arrival_layer`] before tonic decodes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrived(pub(crate) std::time::Instant);

/// Records each request's arrival (for [`deadline`]); it runs just inside tonic's own
/// `grpc-timeout` timer.
pub(crate) fn arrival_layer<B>(mut req: http::Request<B>) -> http::Request<B> {
    req.extensions_mut().insert(Arrived(std::time::Instant::now()));
    req
}

/// How much earlier than tonic's own timer a call's deadline fires, so the answer is gRPC's
/// `DEADLINE_EXCEEDED` and not tonic's `CANCELLED` "Timeout expired".
const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_millis(2);

/// The deadline of a call from its `grpc-timeout` header (`<up to 8 digits><H|M|S|m|u|n>`),
/// counted from its arrival; `None` without one (or with one tonic does not read either).
fn deadline<T>(req: &Request<T>) -> Option<std::time::Instant> {
    let timeout = parse_grpc_timeout(req.metadata().get("grpc-timeout")?.to_str().ok()?)?;
    let arrived = req.extensions().get::<Arrived>().map_or_else(std::time::Instant::now, |a| a.0);
    Some(arrived + timeout.saturating_sub(DEADLINE_MARGIN))
}

/// A `grpc-timeout` value as a duration.
pub(crate) fn parse_grpc_timeout(v: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn version(s: &str) -> Result<Option<i64>, Status> {
    parse_version(s).map_err(to_status)
}

/// `inference.GRPCInferenceService` over a [`Server`].
#[derive(Clone)]
pub struct InferenceService {
    server: Server,
    shutdown: Shutdown,
    forward: Option<HeaderForward>,
}

impl InferenceService {
    /// A service answering from `server`.
    pub fn new(server: Server) -> Self {
        Self { server, shutdown: Shutdown::default(), forward: None }
    }

    pub(crate) fn with_shutdown(server: Server, shutdown: Shutdown, forward: Option<HeaderForward>) -> Self {
        Self { server, shutdown, forward }
    }

    /// The request parameters `--grpc-header-forward-pattern` makes of a call's metadata.
    fn forwarded(&self, metadata: &tonic::metadata::MetadataMap) -> Result<Vec<(String, ParamValue)>, Status> {
        let Some(forward) = &self.forward else { return Ok(Vec::new()) };
        let headers = metadata.as_ref();
        forward.parameters(headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()))).map_err(to_status)
    }
}

/// The caller's trace from its W3C `traceparent` metadata, if it sent a valid one.
fn trace_parent(metadata: &tonic::metadata::MetadataMap) -> Option<TraceParent> {
    let value = metadata.get("traceparent")?.to_str().ok()?;
    SpanContext::from_traceparent(value).map(TraceParent::Remote)
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: self.server.live() }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.server.ready() }))
    }

    async fn model_ready(&self, req: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let req = req.into_inner();
        let v = version(&req.version)?;
        Ok(Response::new(ModelReadyResponse { ready: self.server.model_ready(&req.name, v) }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(convert::server_metadata_to_proto(self.server.metadata())))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let req = req.into_inner();
        let v = version(&req.version)?;
        let meta = self.server.model_metadata(&req.name, v).map_err(to_status)?;
        Ok(Response::new(convert::model_metadata_to_proto(meta)))
    }

    async fn model_infer(&self, req: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let deadline = deadline(&req);
        let forwarded = self.forwarded(req.metadata())?;
        let trace = trace_parent(req.metadata());
        let mut decoded =
            convert::decode_infer_request_with(req.into_inner(), Some(self.server.shm())).map_err(to_status)?;
        decoded.parameters.extend(forwarded);
        decoded.trace = trace;
        if self.server.is_decoupled(&decoded.model, decoded.version).unwrap_or(false) {
            // Triton's text and code (`src/grpc/infer_handler.cc`).
            return Err(to_status(InferError::new(
                ErrorKind::Unsupported,
                "ModelInfer RPC doesn't support models with decoupled transaction policy",
            )));
        }
        let infer = run(self.server.clone(), decoded);
        // Past its deadline the call fails as gRPC's C++ core fails it, and dropping `infer`
        // cancels the request (never executed if still queued; the model told if running).
        let resp = match deadline {
            Some(at) => tokio::time::timeout_at(at.into(), infer)
                .await
                .map_err(|_| Status::deadline_exceeded("Deadline Exceeded"))?,
            None => infer.await,
        };
        Ok(Response::new(resp.map_err(to_status)?))
    }

    type ModelStreamInferStream = ReceiverStream<Result<ModelStreamInferResponse, Status>>;

    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        // Triton's `triton_grpc_error` mode: the client asks, with this header, for an inference
        // error to end the stream with its gRPC status instead of an `error_message`.
        let grpc_error_mode = req.metadata().get("triton_grpc_error").is_some_and(|v| v.as_bytes() == b"true");
        let forwarded = self.forwarded(req.metadata())?;
        let trace = trace_parent(req.metadata());
        let responses = stream::start(
            self.server.clone(),
            req.into_inner(),
            grpc_error_mode,
            self.shutdown.clone(),
            forwarded,
            trace,
        );
        Ok(Response::new(responses))
    }

    async fn model_config(&self, req: Request<ModelConfigRequest>) -> Result<Response<ModelConfigResponse>, Status> {
        let req = req.into_inner();
        let v = version(&req.version)?;
        let config = self.server.model_config(&req.name, v).map_err(to_status)?;
        Ok(Response::new(ModelConfigResponse { config: Some(config) }))
    }

    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let req = req.into_inner();
        let v = version(&req.version)?;
        let name = (!req.name.is_empty()).then_some(req.name.as_str());
        let stats = self.server.statistics(name, v).map_err(to_status)?;
        Ok(Response::new(ModelStatisticsResponse {
            model_stats: stats.into_iter().map(convert::statistics_to_proto).collect(),
        }))
    }

    async fn repository_index(
        &self,
        req: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let req = req.into_inner();
        if !req.repository_name.is_empty() {
            return Err(repository_name_unsupported());
        }
        Ok(Response::new(convert::index_to_proto(self.server.repository_index(req.ready))))
    }

    async fn repository_model_load(
        &self,
        req: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        let req = req.into_inner();
        if !req.repository_name.is_empty() {
            return Err(repository_name_unsupported());
        }
        match convert::load_parameters(&req.parameters).map_err(to_status)? {
            (None, files) if files.is_empty() => self.server.load_model(&req.model_name).await,
            (config, files) => self.server.load_model_with_files(&req.model_name, config.as_deref(), files).await,
        }
        .map_err(to_status)?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        req: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        let req = req.into_inner();
        if !req.repository_name.is_empty() {
            return Err(repository_name_unsupported());
        }
        if convert::unload_parameters(&req.parameters).map_err(to_status)? {
            self.server.unload_model_and_dependents(&req.model_name).await.map_err(to_status)?;
        } else {
            self.server.unload_model(&req.model_name).await.map_err(to_status)?;
        }
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        req: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        let name = req.into_inner().name;
        let regions = self.server.shm().status(&name).map_err(to_status)?;
        let regions = regions
            .into_iter()
            .map(|r| {
                let status = system_shared_memory_status_response::RegionStatus {
                    name: r.name.clone(),
                    key: r.key,
                    offset: r.offset,
                    byte_size: r.byte_size,
                };
                (r.name, status)
            })
            .collect::<HashMap<_, _>>();
        Ok(Response::new(SystemSharedMemoryStatusResponse { regions }))
    }

    async fn system_shared_memory_register(
        &self,
        req: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        let req = req.into_inner();
        self.server.shm().register(&req.name, &req.key, req.offset, req.byte_size).map_err(to_status)?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        req: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        // Triton answers success for a region that is not registered; an empty name is "all".
        let name = req.into_inner().name;
        if name.is_empty() {
            self.server.shm().unregister_all();
        } else {
            self.server.shm().unregister(&name);
        }
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        req: Request<CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<CudaSharedMemoryStatusResponse>, Status> {
        let name = req.into_inner().name;
        let regions = self.server.shm().cuda_status(&name).map_err(to_status)?;
        let regions = regions
            .into_iter()
            .map(|r| {
                let status = cuda_shared_memory_status_response::RegionStatus {
                    name: r.name.clone(),
                    device_id: r.device_id,
                    byte_size: r.byte_size,
                };
                (r.name, status)
            })
            .collect::<HashMap<_, _>>();
        Ok(Response::new(CudaSharedMemoryStatusResponse { regions }))
    }

    async fn cuda_shared_memory_register(
        &self,
        req: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<CudaSharedMemoryRegisterResponse>, Status> {
        let req = req.into_inner();
        self.server.shm().register_cuda(&req.name, &req.raw_handle, req.device_id, req.byte_size).map_err(to_status)?;
        Ok(Response::new(CudaSharedMemoryRegisterResponse {}))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        req: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<CudaSharedMemoryUnregisterResponse>, Status> {
        // As for system regions: an unknown name is success, an empty one is "all".
        let name = req.into_inner().name;
        if name.is_empty() {
            self.server.shm().unregister_all_cuda();
        } else {
            self.server.shm().unregister_cuda(&name);
        }
        Ok(Response::new(CudaSharedMemoryUnregisterResponse {}))
    }

    async fn trace_setting(
        &self,
        request: Request<TraceSettingRequest>,
    ) -> Result<Response<TraceSettingResponse>, Status> {
        let req = request.into_inner();
        let model = (!req.model_name.is_empty()).then_some(req.model_name.as_str());
        let mut view = self.server.trace_settings(model).map_err(to_status)?;
        if !req.settings.is_empty() {
            let values: Vec<(String, UpdateValue)> = req
                .settings
                .into_iter()
                .map(|(k, v)| {
                    let v = if v.value.is_empty() { UpdateValue::Clear } else { UpdateValue::Values(v.value) };
                    (k, v)
                })
                .collect();
            view = self.server.update_trace_settings(model, &values).map_err(to_status)?;
        }
        let settings = view.into_iter().map(|(k, value)| (k, trace_setting_response::SettingValue { value })).collect();
        Ok(Response::new(TraceSettingResponse { settings }))
    }

    async fn log_settings(
        &self,
        request: Request<LogSettingsRequest>,
    ) -> Result<Response<LogSettingsResponse>, Status> {
        let update = convert::log_update(&request.into_inner()).map_err(to_status)?;
        let settings = if update == tritium_server::LogSettingsUpdate::default() {
            self.server.log_settings()
        } else {
            self.server.update_log_settings(update)
        }
        .map_err(to_status)?;
        Ok(Response::new(convert::log_response(&settings)))
    }
}

fn repository_name_unsupported() -> Status {
    to_status(InferError::new(ErrorKind::Unsupported, "'repository_name' specification is not supported"))
}

/// `grpc.health.v1.Health` over a [`Server`]: `SERVING` when the server is ready, as Triton's
/// `Check` answers (whatever `service` names); `Watch` is not implemented, as in Triton.
#[derive(Clone)]
pub struct HealthService {
    server: Server,
}

impl HealthService {
    /// A health service answering from `server`.
    pub fn new(server: Server) -> Self {
        Self { server }
    }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(&self, _: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let status = if self.server.ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
        Ok(Response::new(HealthCheckResponse { status: status as i32 }))
    }

    type WatchStream = ReceiverStream<Result<HealthCheckResponse, Status>>;

    async fn watch(&self, _: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("grpc.health.v1.Health/Watch is not supported by tritium yet; use Check"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("500m"), Some(Duration::from_millis(500)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "S", "123456789S", "1x", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_deadline_counts_from_arrival_and_fires_before_tonics() {
        let mut req = Request::new(());
        assert!(deadline(&req).is_none());
        let arrived = std::time::Instant::now();
        req.extensions_mut().insert(Arrived(arrived));
        req.metadata_mut().insert("grpc-timeout", "100m".parse().expect("value"));
        assert_eq!(deadline(&req), Some(arrived + Duration::from_millis(100) - DEADLINE_MARGIN));
    }
}
