//! The gRPC frontend over a real socket with tonic's client: every RPC against a server without
//! models, and, where the Python environment is built (`.venv` and `python/tritium/_native`),
//! inference through real stubs: raw and typed inputs, classification, sequence parameters,
//! model errors, stream order under out-of-order completion, and `triton_grpc_error` mode.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use tonic::{Code, Request};
use tritium_host::StubCommand;
use tritium_proto::admin::admin_client::AdminClient;
use tritium_proto::admin::{RestartRequest, StubsRequest};
use tritium_proto::health::health_check_response::ServingStatus;
use tritium_proto::health::health_client::HealthClient;
use tritium_proto::health::HealthCheckRequest;
use tritium_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tritium_proto::inference::infer_parameter::ParameterChoice as P;
use tritium_proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use tritium_proto::inference::*;
use tritium_server::{Server, ServerOptions};

type Client = GrpcInferenceServiceClient<Channel>;

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh directory under the system temp dir.
fn temp_repo() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tritium-grpc-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp repository");
    dir
}

/// The stub command (`$TRITIUM_PYTHON`, else the repo's `.venv`), if the Python side is built.
fn stub_command() -> Option<StubCommand> {
    let python =
        std::env::var_os("TRITIUM_PYTHON").map(PathBuf::from).unwrap_or_else(|| root().join(".venv/bin/python"));
    let python_path = root().join("python");
    let native = std::fs::read_dir(python_path.join("tritium"))
        .ok()?
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("_native"));
    (python.is_file() && native).then(|| StubCommand { python, python_path, env: Vec::new(), spin: 0 })
}

fn options(repository: PathBuf, stub: StubCommand, strict_readiness: bool) -> ServerOptions {
    ServerOptions {
        repository,
        stub,
        instance_settings: tritium_server::InstanceSettings {
            init_timeout: Duration::from_secs(60),
            ..Default::default()
        },
        auto_complete: false,
        strict_readiness,
        explicit_control: true,
        max_queue_size: 0,
        server_id: "tritium".into(),
        load_threads: 4,
        load_retries: 0,
        backend_directory: PathBuf::new(),
        envs: tritium_server::EnvOptions::default(),
        config_name: None,
        metrics: tritium_server::MetricsOptions::default(),
        gpus: Vec::new(),
        paths: Default::default(),
        limits: Default::default(),
        rate_limiter: None,
    }
}

fn no_stub() -> StubCommand {
    StubCommand { python: "python3".into(), python_path: root().join("python"), env: Vec::new(), spin: 0 }
}

struct Running {
    addr: std::net::SocketAddr,
    client: Client,
    health: HealthClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    async fn start(server: Server) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tritium_grpc::serve(listener, server, None, async move {
            let _ = stopped.await;
        }));
        let channel = Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
        let client = GrpcInferenceServiceClient::new(channel.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        Self { addr, client, health: HealthClient::new(channel), stop: Some(stop), task }
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let done =
            tokio::time::timeout(Duration::from_secs(20), self.task).await.expect("serve returns after shutdown");
        done.expect("serve task").expect("serve result");
    }
}

fn param(p: P) -> InferParameter {
    InferParameter { parameter_choice: Some(p) }
}

fn raw_input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
    InferInputTensor { name: name.into(), datatype: datatype.into(), shape: shape.to_vec(), ..Default::default() }
}

fn i32s(v: &[i32]) -> Bytes {
    v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into()
}

fn f32s(v: &[f32]) -> Bytes {
    v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into()
}

fn to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn to_i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn strings(data: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 4 {
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        out.push(String::from_utf8_lossy(&rest[4..4 + len]).into_owned());
        rest = &rest[4 + len..];
    }
    out
}

/// The raw contents of output `name`.
fn output<'a>(r: &'a ModelInferResponse, name: &str) -> (&'a model_infer_response::InferOutputTensor, &'a [u8]) {
    let i = r.outputs.iter().position(|o| o.name == name).unwrap_or_else(|| panic!("no output {name} in {r:?}"));
    (&r.outputs[i], &r.raw_output_contents[i])
}

fn unknown_model_request(id: &str) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "nope".into(),
        id: id.into(),
        inputs: vec![raw_input("X", "FP32", &[1])],
        raw_input_contents: vec![f32s(&[1.0])],
        ..Default::default()
    }
}

// ------------------------------------------------------------------------------------------
// Without models
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metadata_and_repository_without_models() {
    let repo = temp_repo();
    let running = Running::start(Server::new(options(repo.clone(), no_stub(), false))).await;
    let mut c = running.client.clone();

    assert!(c.server_live(ServerLiveRequest {}).await.expect("live").into_inner().live);
    assert!(c.server_ready(ServerReadyRequest {}).await.expect("ready").into_inner().ready);
    let mut h = running.health.clone();
    let check = h.check(HealthCheckRequest { service: String::new() }).await.expect("check").into_inner();
    assert_eq!(check.status, ServingStatus::Serving as i32);
    let watch = h.watch(HealthCheckRequest { service: String::new() }).await.expect_err("watch is not implemented");
    assert_eq!(watch.code(), Code::Unimplemented);

    let meta = c.server_metadata(ServerMetadataRequest {}).await.expect("metadata").into_inner();
    assert_eq!(meta.name, "tritium");
    assert!(meta.extensions.iter().any(|e| e == "statistics"), "{:?}", meta.extensions);

    let ready =
        c.model_ready(ModelReadyRequest { name: "nope".into(), version: String::new() }).await.expect("model ready");
    assert!(!ready.into_inner().ready);
    let bad =
        c.model_ready(ModelReadyRequest { name: "nope".into(), version: "x".into() }).await.expect_err("bad version");
    assert_eq!(bad.code(), Code::InvalidArgument);

    let e = c
        .model_metadata(ModelMetadataRequest { name: "nope".into(), version: String::new() })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "Request for unknown model: 'nope' is not found");
    let e =
        c.model_config(ModelConfigRequest { name: "nope".into(), version: String::new() }).await.expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);

    let index = c.repository_index(RepositoryIndexRequest::default()).await.expect("index").into_inner();
    assert!(index.models.is_empty());
    let e = c
        .repository_index(RepositoryIndexRequest { repository_name: "r".into(), ready: false })
        .await
        .expect_err("repository_name");
    assert_eq!((e.code(), e.message()), (Code::Unimplemented, "'repository_name' specification is not supported"));

    let e = c
        .repository_model_load(RepositoryModelLoadRequest { model_name: "missing".into(), ..Default::default() })
        .await
        .expect_err("no such model directory");
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    // An unknown name is already unloaded: that succeeds, as in Triton 2.51.
    c.repository_model_unload(RepositoryModelUnloadRequest { model_name: "never_loaded".into(), ..Default::default() })
        .await
        .expect("unloading an unknown model succeeds");

    let all = c.model_statistics(ModelStatisticsRequest::default()).await.expect("statistics").into_inner();
    assert!(all.model_stats.is_empty());
    let e = c
        .model_statistics(ModelStatisticsRequest { name: "nope".into(), version: String::new() })
        .await
        .expect_err("unknown model");
    // Triton's code and text.
    assert_eq!((e.code(), e.message()), (Code::InvalidArgument, "requested model 'nope' is not available"));

    running.shutdown().await;
    let _ = std::fs::remove_dir_all(repo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_stubs_and_restart_without_models() {
    let repo = temp_repo();
    std::fs::create_dir_all(repo.join("on_disk")).expect("model directory");
    let running = Running::start(Server::new(options(repo.clone(), no_stub(), false))).await;
    let channel =
        Channel::from_shared(format!("http://{}", running.addr)).expect("uri").connect().await.expect("connect");
    let mut admin = AdminClient::new(channel);

    let all = admin.stubs(StubsRequest::default()).await.expect("stubs").into_inner();
    assert!(all.stubs.is_empty());
    // A model of the repository that is not loaded has no stubs; an unknown name is an error.
    let none = admin.stubs(StubsRequest { model: "on_disk".into() }).await.expect("stubs of an unloaded model");
    assert!(none.into_inner().stubs.is_empty());
    let e = admin.stubs(StubsRequest { model: "nope".into() }).await.expect_err("unknown model");
    assert_eq!((e.code(), e.message()), (Code::NotFound, "Request for unknown model: 'nope' is not found"));

    // The test client is on loopback, so Restart is allowed and reaches the server.
    let e = admin.restart(RestartRequest { model: "nope".into(), instance: String::new() }).await.expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    let e = admin.restart(RestartRequest::default()).await.expect_err("no model");
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());

    running.shutdown().await;
    let _ = std::fs::remove_dir_all(repo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_trace_and_log_rpcs() {
    let repo = temp_repo();
    let running = Running::start(Server::new(options(repo.clone(), no_stub(), false))).await;
    let mut c = running.client.clone();

    let s = c.system_shared_memory_status(SystemSharedMemoryStatusRequest::default()).await.expect("status");
    assert!(s.into_inner().regions.is_empty());
    let e = c
        .system_shared_memory_status(SystemSharedMemoryStatusRequest { name: "r".into() })
        .await
        .expect_err("unknown region");
    assert_eq!((e.code(), e.message()), (Code::NotFound, "Unable to find system shared memory region: 'r'"));
    let e = c
        .system_shared_memory_register(SystemSharedMemoryRegisterRequest {
            name: "r".into(),
            key: "/no-such-tritium-key".into(),
            offset: 0,
            byte_size: 64,
        })
        .await
        .expect_err("register");
    assert_eq!(
        (e.code(), e.message()),
        (Code::Internal, "Unable to open shared memory region: '/no-such-tritium-key'")
    );
    c.system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest::default()).await.expect("unregister all");
    c.system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest { name: "r".into() })
        .await
        .expect("unregister");

    let s = c.cuda_shared_memory_status(CudaSharedMemoryStatusRequest::default()).await.expect("status");
    assert!(s.into_inner().regions.is_empty());
    let e = c
        .cuda_shared_memory_register(CudaSharedMemoryRegisterRequest { name: "g".into(), ..Default::default() })
        .await
        .expect_err("register");
    assert_eq!(
        (e.code(), e.message()),
        (Code::InvalidArgument, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    );
    let register = CudaSharedMemoryRegisterRequest {
        name: "g".into(),
        raw_handle: vec![0u8; 64].into(),
        device_id: 0,
        byte_size: 64,
    };
    let e = c.cuda_shared_memory_register(register).await.expect_err("register");
    assert_eq!(e.code(), Code::InvalidArgument);
    match tritium_cuda::cuda() {
        Err(why) => assert_eq!(
            e.message(),
            format!("failed to register CUDA shared memory region: 'g', GPUs not supported ({why})")
        ),
        Ok(_) => {
            assert!(e.message().starts_with("failed to register shared memory region: invalid args"), "{}", e.message())
        }
    }
    let e = c
        .cuda_shared_memory_status(CudaSharedMemoryStatusRequest { name: "g".into() })
        .await
        .expect_err("not registered");
    assert_eq!((e.code(), e.message()), (Code::NotFound, "Unable to find cuda shared memory region: 'g'"));
    c.cuda_shared_memory_unregister(CudaSharedMemoryUnregisterRequest::default()).await.expect("unregister");

    let e = c.trace_setting(TraceSettingRequest::default()).await.expect_err("trace");
    assert_eq!(e.code(), Code::Unavailable);
    let e = c.log_settings(LogSettingsRequest::default()).await.expect_err("log");
    assert_eq!(e.code(), Code::Unavailable);

    running.shutdown().await;
    let _ = std::fs::remove_dir_all(repo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_errors_large_and_compressed_messages() {
    let repo = temp_repo();
    let running = Running::start(Server::new(options(repo.clone(), no_stub(), false))).await;
    let mut c = running.client.clone();

    let e = c.model_infer(unknown_model_request("a")).await.expect_err("unknown model");
    assert_eq!((e.code(), e.message()), (Code::NotFound, "Request for unknown model: 'nope' is not found"));

    // 64 MiB: far over tonic's 4 MiB default, which Triton's 2 GiB limit allows.
    let mut big = unknown_model_request("big");
    big.inputs[0].shape = vec![16 << 20];
    big.raw_input_contents = vec![Bytes::from(vec![0u8; 64 << 20])];
    let e = c.model_infer(big).await.expect_err("unknown model");
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());

    let mut gz = c.clone().send_compressed(CompressionEncoding::Gzip);
    let e = gz.model_infer(unknown_model_request("gz")).await.expect_err("unknown model");
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    let mut deflate = c.clone().send_compressed(CompressionEncoding::Deflate);
    let e = deflate.model_infer(unknown_model_request("df")).await.expect_err("unknown model");
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());

    let mut mixed = unknown_model_request("m");
    mixed.inputs.push(InferInputTensor {
        contents: Some(InferTensorContents { fp32_contents: vec![1.0], ..Default::default() }),
        ..raw_input("Y", "FP32", &[1])
    });
    let e = c.model_infer(mixed).await.expect_err("mixed contents");
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::InvalidArgument,
            "contents field must not be specified when using raw_input_contents for 'Y' for model 'nope'"
        )
    );

    let mut version = unknown_model_request("v");
    version.model_version = "one".into();
    let e = c.model_infer(version).await.expect_err("bad version");
    assert_eq!(e.code(), Code::InvalidArgument);

    running.shutdown().await;
    let _ = std::fs::remove_dir_all(repo);
}

/// Opens a stream fed from the returned sender.
async fn open_stream(
    c: &mut Client,
    grpc_error_mode: bool,
) -> (mpsc::Sender<ModelInferRequest>, tonic::Streaming<ModelStreamInferResponse>) {
    let (tx, rx) = mpsc::channel(1024);
    let mut req = Request::new(ReceiverStream::new(rx));
    if grpc_error_mode {
        req.metadata_mut().insert("triton_grpc_error", "true".parse().expect("metadata value"));
    }
    let responses = c.model_stream_infer(req).await.expect("stream opens").into_inner();
    (tx, responses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_errors_stay_in_order_and_keep_the_stream_open() {
    let repo = temp_repo();
    let running = Running::start(Server::new(options(repo.clone(), no_stub(), false))).await;
    let mut c = running.client.clone();

    for grpc_error_mode in [false, true] {
        let (tx, mut responses) = open_stream(&mut c, grpc_error_mode).await;
        let mut bad = unknown_model_request("bad-decode");
        bad.raw_input_contents.clear();
        for req in [unknown_model_request("first"), bad, unknown_model_request("third")] {
            tx.send(req).await.expect("send");
        }
        drop(tx);
        let mut got = Vec::new();
        while let Some(r) = responses.message().await.expect("errors before queueing never end the stream") {
            got.push((r.infer_response.map(|i| i.id).unwrap_or_default(), r.error_message));
        }
        assert_eq!(
            got,
            vec![
                ("first".to_string(), "Request for unknown model: 'nope' is not found".to_string()),
                (
                    "bad-decode".to_string(),
                    "unable to find data for input tensor 'X' for model 'nope' in request.".to_string()
                ),
                ("third".to_string(), "Request for unknown model: 'nope' is not found".to_string()),
            ],
            "grpc_error_mode {grpc_error_mode}"
        );
    }

    running.shutdown().await;
    let _ = std::fs::remove_dir_all(repo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams() {
    let repo = temp_repo();
    let running = Running::start(Server::new(options(repo.clone(), no_stub(), false))).await;
    let mut c = running.client.clone();
    let (tx, mut responses) = open_stream(&mut c, false).await;
    tx.send(unknown_model_request("before")).await.expect("send");
    let first = responses.message().await.expect("answer").expect("one answer");
    assert_eq!(first.infer_response.map(|r| r.id), Some("before".to_string()));

    let shutdown = tokio::spawn(running.shutdown());
    let end = tokio::time::timeout(Duration::from_secs(10), responses.message()).await.expect("the stream ends");
    let status = end.expect_err("the stream ends with a status");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "GRPC server is shutting down and has stopped accepting new requests.");
    drop(tx);
    tokio::time::timeout(Duration::from_secs(20), shutdown).await.expect("serve returns").expect("shutdown task");
    let _ = std::fs::remove_dir_all(repo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_when_not_ready() {
    let repo = temp_repo();
    // A model directory without any version: its load fails, so a strict server is not ready.
    std::fs::create_dir_all(repo.join("broken")).expect("model dir");
    std::fs::write(repo.join("broken/config.pbtxt"), "backend: \"python\"\n").expect("config");
    let server = Server::new(options(repo.clone(), no_stub(), true));
    let _ = server.load_model("broken").await;
    let running = Running::start(server).await;
    let mut h = running.health.clone();
    let check = h.check(HealthCheckRequest { service: String::new() }).await.expect("check").into_inner();
    assert_eq!(check.status, ServingStatus::NotServing as i32);
    let mut c = running.client.clone();
    assert!(!c.server_ready(ServerReadyRequest {}).await.expect("ready").into_inner().ready);
    let index = c.repository_index(RepositoryIndexRequest::default()).await.expect("index").into_inner();
    assert_eq!(index.models.len(), 1);
    assert_eq!((index.models[0].name.as_str(), index.models[0].state.as_str()), ("broken", "UNAVAILABLE"));
    assert!(!index.models[0].reason.is_empty());
    let ready_only = c.repository_index(RepositoryIndexRequest { repository_name: String::new(), ready: true }).await;
    assert!(ready_only.expect("index").into_inner().models.is_empty());
    running.shutdown().await;
    let _ = std::fs::remove_dir_all(repo);
}

// ------------------------------------------------------------------------------------------
// With models (real stubs)
// ------------------------------------------------------------------------------------------

const PROBE_CONFIG: &str = r#"
name: "probe"
backend: "python"
max_batch_size: 0
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU, count: 4 } ]
"#;

const PROBE_MODEL: &str = r#"
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0])
            time.sleep(delay / 1000.0)
            if int(x[0]) < 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input {}".format(int(x[0])))))
                continue
            info = json.dumps({
                "corr": request.correlation_id(),
                "flags": request.flags(),
                "timeout": request.timeout(),
                "params": json.loads(request.parameters()),
            })
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("OUT", x.astype(np.int32)),
                    pb_utils.Tensor("INFO", np.array([info.encode()], dtype=np.object_)),
                ],
                parameters={"echo": int(x[0])},
            ))
        return responses
"#;

fn model_repo() -> PathBuf {
    let repo = temp_repo();
    let add_sub = root().join("examples/models/add_sub");
    std::fs::create_dir_all(repo.join("add_sub/1")).expect("add_sub dir");
    std::fs::copy(add_sub.join("config.pbtxt"), repo.join("add_sub/config.pbtxt")).expect("copy config");
    std::fs::copy(add_sub.join("1/model.py"), repo.join("add_sub/1/model.py")).expect("copy model");
    std::fs::create_dir_all(repo.join("probe/1")).expect("probe dir");
    std::fs::write(repo.join("probe/config.pbtxt"), PROBE_CONFIG).expect("probe config");
    std::fs::write(repo.join("probe/1/model.py"), PROBE_MODEL).expect("probe model");
    repo
}

fn probe_request(id: &str, value: i32, delay_ms: i32) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "probe".into(),
        id: id.into(),
        inputs: vec![raw_input("IN", "INT32", &[1]), raw_input("DELAY_MS", "INT32", &[1])],
        raw_input_contents: vec![i32s(&[value]), i32s(&[delay_ms])],
        ..Default::default()
    }
}

fn add_sub_request(typed: bool) -> ModelInferRequest {
    let a = [1.0f32, 2.0, 3.0, 4.0];
    let b = [0.5f32, 0.5, 0.5, 5.0];
    let mut req = ModelInferRequest { model_name: "add_sub".into(), id: "as".into(), ..Default::default() };
    for (name, v) in [("INPUT0", a), ("INPUT1", b)] {
        let mut input = raw_input(name, "FP32", &[4]);
        if typed {
            input.contents = Some(InferTensorContents { fp32_contents: v.to_vec(), ..Default::default() });
        } else {
            req.raw_input_contents.push(f32s(&v));
        }
        req.inputs.push(input);
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inference_through_real_stubs() {
    let Some(stub) = stub_command() else {
        skip_unless_required("the Python environment is not built (cargo xtask setup && cargo xtask build)");
        return;
    };
    let repo = model_repo();
    let server = Server::new(options(repo.clone(), stub, false));
    server.load_model("add_sub").await.expect("add_sub loads");
    server.load_model("probe").await.expect("probe loads");
    let running = Running::start(server.clone()).await;
    let mut c = running.client.clone();

    // Raw and typed inputs give the same answer, always as raw contents.
    for typed in [false, true] {
        let r = c.model_infer(add_sub_request(typed)).await.expect("infer").into_inner();
        assert_eq!((r.model_name.as_str(), r.model_version.as_str(), r.id.as_str()), ("add_sub", "1", "as"));
        let (o0, d0) = output(&r, "OUTPUT0");
        assert_eq!((o0.datatype.as_str(), &o0.shape[..]), ("FP32", &[4i64][..]));
        assert_eq!(to_f32s(d0), vec![1.5, 2.5, 3.5, 9.0]);
        assert_eq!(to_f32s(output(&r, "OUTPUT1").1), vec![0.5, 1.5, 2.5, -1.0]);
    }

    // Requested outputs, one of them as a classification.
    let mut req = add_sub_request(false);
    req.outputs = vec![InferRequestedOutputTensor {
        name: "OUTPUT0".into(),
        parameters: [("classification".to_string(), param(P::Int64Param(2)))].into(),
    }];
    let r = c.model_infer(req).await.expect("classification").into_inner();
    assert_eq!(r.outputs.len(), 1);
    let (o, d) = output(&r, "OUTPUT0");
    assert_eq!((o.datatype.as_str(), &o.shape[..]), ("BYTES", &[2i64][..]));
    assert_eq!(strings(d), vec!["9.000000:3", "3.500000:2"]);

    // Sequence and custom parameters reach the model; its response parameters come back.
    let mut req = probe_request("p1", 7, 0);
    req.parameters = [
        ("sequence_id".to_string(), param(P::Int64Param(99))),
        ("sequence_start".to_string(), param(P::BoolParam(true))),
        ("sequence_end".to_string(), param(P::BoolParam(false))),
        ("timeout".to_string(), param(P::Int64Param(5_000_000))),
        ("custom".to_string(), param(P::StringParam("v".into()))),
    ]
    .into();
    let r = c.model_infer(req).await.expect("probe").into_inner();
    assert_eq!(to_i32s(output(&r, "OUT").1), vec![7]);
    let (info_meta, info) = output(&r, "INFO");
    assert_eq!(info_meta.datatype, "BYTES");
    let info = strings(info);
    assert_eq!(info.len(), 1);
    assert!(info[0].contains("\"corr\": 99"), "{}", info[0]);
    assert!(info[0].contains("\"flags\": 1"), "{}", info[0]);
    assert!(info[0].contains("\"timeout\": 5000000"), "{}", info[0]);
    assert!(info[0].contains("\"custom\": \"v\""), "{}", info[0]);
    assert!(!info[0].contains("sequence_id"), "reserved parameters are consumed: {}", info[0]);
    assert_eq!(r.parameters.get("echo"), Some(&param(P::Int64Param(7))));

    // A model error keeps its message.
    let e = c.model_infer(probe_request("neg", -3, 0)).await.expect_err("model error");
    assert!(e.message().contains("negative input -3"), "{e:?}");

    // Statistics, config and metadata of a served model.
    let stats = c
        .model_statistics(ModelStatisticsRequest { name: "add_sub".into(), version: String::new() })
        .await
        .expect("statistics")
        .into_inner();
    assert_eq!(stats.model_stats.len(), 1);
    let s = &stats.model_stats[0];
    assert_eq!((s.name.as_str(), s.version.as_str()), ("add_sub", "1"));
    assert!(s.inference_stats.as_ref().and_then(|i| i.success).is_some_and(|d| d.count >= 3), "{s:?}");
    let config =
        c.model_config(ModelConfigRequest { name: "add_sub".into(), version: String::new() }).await.expect("config");
    assert_eq!(config.into_inner().config.map(|c| c.name), Some("add_sub".to_string()));
    let meta =
        c.model_metadata(ModelMetadataRequest { name: "probe".into(), version: "1".into() }).await.expect("metadata");
    let meta = meta.into_inner();
    assert_eq!(meta.versions, vec!["1"]);
    assert_eq!(meta.outputs.iter().map(|o| o.datatype.as_str()).collect::<Vec<_>>(), vec!["INT32", "BYTES"]);

    // Unload through the RPC.
    c.repository_model_unload(RepositoryModelUnloadRequest { model_name: "add_sub".into(), ..Default::default() })
        .await
        .expect("unload");
    let ready =
        c.model_ready(ModelReadyRequest { name: "add_sub".into(), version: String::new() }).await.expect("ready");
    assert!(!ready.into_inner().ready);

    running.shutdown().await;
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(repo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_answers_in_request_order() {
    let Some(stub) = stub_command() else {
        skip_unless_required("the Python environment is not built (cargo xtask setup && cargo xtask build)");
        return;
    };
    let repo = model_repo();
    let server = Server::new(options(repo.clone(), stub, false));
    server.load_model("probe").await.expect("probe loads");
    let running = Running::start(server.clone()).await;
    let mut c = running.client.clone();

    // Four instances run these concurrently; the early ones take longest, so they complete in
    // reverse. Request 5 fails in the model: its error keeps its place and the stream goes on.
    let (tx, mut responses) = open_stream(&mut c, false).await;
    let n = 12;
    for i in 0..n {
        let value = if i == 5 { -5 } else { i };
        tx.send(probe_request(&format!("r{i}"), value, (n - i) * 25)).await.expect("send");
    }
    drop(tx);
    let mut got = Vec::new();
    while let Some(r) = responses.message().await.expect("stream") {
        let resp = r.infer_response.unwrap_or_default();
        if r.error_message.is_empty() {
            assert_eq!(to_i32s(output(&resp, "OUT").1), vec![got.len() as i32]);
        } else {
            assert!(r.error_message.contains("negative input -5"), "{}", r.error_message);
        }
        got.push(resp.id);
    }
    let want: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    assert_eq!(got, want);

    // In `triton_grpc_error` mode an error from the model ends the stream with its status.
    let (tx, mut responses) = open_stream(&mut c, true).await;
    tx.send(probe_request("ok", 1, 0)).await.expect("send");
    tx.send(probe_request("fails", -1, 0)).await.expect("send");
    tx.send(probe_request("never", 2, 0)).await.expect("send");
    let first = responses.message().await.expect("first answer").expect("an answer");
    assert_eq!(first.infer_response.map(|r| r.id), Some("ok".to_string()));
    let status = responses.message().await.expect_err("the error ends the stream");
    assert!(status.message().contains("negative input -1"), "{status:?}");
    assert_ne!(status.code(), Code::Ok);
    drop(tx);

    running.shutdown().await;
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(repo);
}

/// Skips a test whose prerequisite is missing, or fails it when `TRITIUM_REQUIRE_ALL` is set (as
/// in CI), so a missing prerequisite there is never counted as a pass.
fn skip_unless_required(why: &str) {
    assert!(std::env::var_os("TRITIUM_REQUIRE_ALL").is_none(), "prerequisite missing: {why}");
    eprintln!("skipped: {why}");
}
