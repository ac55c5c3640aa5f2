//! End-to-end tests of the HTTP frontend over a mock backend: routes, statuses, headers, bodies,
//! binary data, compression, statistics, the repository extension, and a real TCP listener.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use common::Mock;
use serde_json::{json, Value};
use tower::ServiceExt;
use tritium_http::codec::serialize_bytes;
use tritium_http::compression::{compress, decompress, Encoding};
use tritium_http::{router_with, Options};
use tritium_server::{DataType, ParamValue};

fn app() -> (Arc<Mock>, Router) {
    let mock = Arc::new(Mock::default());
    (mock.clone(), router_with(mock, Options::default()))
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Bytes,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    fn error(&self) -> String {
        assert_eq!(self.header("content-type"), Some("application/json"));
        self.json()["error"].as_str().unwrap().to_string()
    }
}

async fn send(app: &Router, method: Method, uri: &str, headers: &[(&str, &str)], body: impl Into<Body>) -> Resp {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = app.clone().oneshot(req.body(body.into()).unwrap()).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    Resp { status, headers, body }
}

async fn get(app: &Router, uri: &str) -> Resp {
    send(app, Method::GET, uri, &[], Body::empty()).await
}

#[tokio::test]
async fn health_and_server_metadata() {
    let (mock, app) = app();
    let r = get(&app, "/v2/health/live").await;
    assert_eq!((r.status, r.body.len()), (StatusCode::OK, 0));
    assert_eq!(get(&app, "/v2/health/ready").await.status, StatusCode::OK);
    mock.not_ready.store(true, Ordering::SeqCst);
    let r = get(&app, "/v2/health/ready").await;
    assert_eq!((r.status, r.body.len()), (StatusCode::BAD_REQUEST, 0));

    let r = get(&app, "/v2").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        &r.body[..],
        br#"{"name":"triton","version":"2.50.0","extensions":["binary_tensor_data","statistics"]}"#
    );
}

#[tokio::test]
async fn unknown_routes_and_methods() {
    let (_, app) = app();
    for uri in [
        "/v2/nothing",
        "/v2/",
        "/v3",
        "/v2/models/m/versions/abc",
        "/v2/models/m/versions/1/trace/setting",
        "/v2/models/m/bogus",
    ] {
        let r = get(&app, uri).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}");
        assert_eq!(r.error(), "Not Found");
    }
    let r = get(&app, "/v2/models/m/infer").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.error(), "Method Not Allowed");
    let r = send(&app, Method::POST, "/v2/health/live", &[], Body::empty()).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    let r = send(&app, Method::DELETE, "/v2/repository/index", &[], Body::empty()).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn model_metadata_ready_config() {
    let (_, app) = app();
    let r = get(&app, "/v2/models/simple").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        String::from_utf8(r.body.to_vec()).unwrap(),
        r#"{"name":"simple","versions":["1"],"platform":"python","inputs":[{"name":"IN","datatype":"FP32","shape":[-1,-1]}],"outputs":[{"name":"OUT_IN","datatype":"FP32","shape":[-1,-1]}]}"#
    );
    assert_eq!(get(&app, "/v2/models/simple/versions/7").await.json()["versions"], json!(["7"]));
    // Percent-encoded names are decoded.
    assert_eq!(get(&app, "/v2/models/my%20model").await.json()["name"], "my model");
    let r = get(&app, "/v2/models/missing").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.error().contains("unknown model"));
    let r = get(&app, "/v2/models/m/versions/99999999999999999999").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let r = get(&app, "/v2/models/simple/ready").await;
    assert_eq!((r.status, r.body.len()), (StatusCode::OK, 0));
    let r = get(&app, "/v2/models/missing/versions/1/ready").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error(), "Model version not ready");

    let r = get(&app, "/v2/models/simple/config").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["max_batch_size"], 4);
    assert_eq!(get(&app, "/v2/models/missing/versions/2/config").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn statistics() {
    let (_, app) = app();
    for uri in ["/v2/models/stats", "/v2/models/a/stats", "/v2/models/a/versions/1/stats"] {
        let r = get(&app, uri).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}");
        let v = r.json();
        let s = &v["model_stats"][0];
        assert_eq!(s["name"], "a");
        assert_eq!(s["version"], "1");
        assert_eq!(s["last_inference"], 1_700_000_000_000u64);
        assert_eq!(s["inference_count"], 10);
        assert_eq!(s["execution_count"], 4);
        assert_eq!(s["inference_stats"]["success"], json!({"count": 5, "ns": 500}));
        assert_eq!(s["inference_stats"]["compute_infer"], json!({"count": 4, "ns": 400}));
        assert_eq!(s["inference_stats"]["cache_miss"], json!({"count": 0, "ns": 0}));
        assert_eq!(
            s["batch_stats"],
            json!([{"batch_size": 2, "compute_input": {"count": 2, "ns": 20}, "compute_infer": {"count": 2, "ns": 200}, "compute_output": {"count": 2, "ns": 2}}])
        );
        assert_eq!(s["response_stats"], json!({}));
        assert_eq!(s["memory_usage"], json!([]));
    }
    let body = get(&app, "/v2/models/stats").await.body;
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.starts_with(r#"{"model_stats":[{"name":"a","version":"1","last_inference":1700000000000,"inference_count":10,"execution_count":4,"inference_stats":{"success":{"count":5,"ns":500},"fail""#), "{text}");
    let r = get(&app, "/v2/models/missing/stats").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn repository_extension() {
    let (mock, app) = app();
    let r = send(&app, Method::POST, "/v2/repository/index", &[], Body::empty()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        String::from_utf8(r.body.to_vec()).unwrap(),
        r#"[{"name":"a","version":"1","state":"READY","tritium_python":"/e/bin/python","tritium_environment":"/e"},{"name":"b","state":"UNAVAILABLE","reason":"unloaded"}]"#
    );
    assert_eq!(*mock.last_index_ready.lock().unwrap(), Some(false));
    send(&app, Method::POST, "/v2/repository/index", &[], r#"{"ready": true}"#).await;
    assert_eq!(*mock.last_index_ready.lock().unwrap(), Some(true));
    let r = send(&app, Method::POST, "/v2/repository/index", &[], r#"{"ready": "yes"}"#).await;
    assert_eq!(
        (r.status, r.error()),
        (StatusCode::BAD_REQUEST, "Invalid value for 'ready': expected a boolean".into())
    );
    let r = send(&app, Method::POST, "/v2/repository/index", &[], "{bad").await;
    assert!(r.error().starts_with("failed to parse the request JSON buffer"));

    let r = send(&app, Method::POST, "/v2/repository/models/a/load", &[], Body::empty()).await;
    assert_eq!((r.status, r.body.len()), (StatusCode::OK, 0));
    let r =
        send(&app, Method::POST, "/v2/repository/models/a/unload", &[], r#"{"parameters":{"unload_dependents":true}}"#)
            .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = send(&app, Method::POST, "/v2/repository/models/missing/load", &[], Body::empty()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().starts_with("failed to load 'missing'"));
    assert_eq!(*mock.loads.lock().unwrap(), vec!["load a", "unload a", "load missing"]);

    let r = send(&app, Method::POST, "/v2/repository/models/a/load", &[], r#"{"parameters":{"config":"{}"}}"#).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(mock.loads.lock().unwrap().last().map(String::as_str), Some("load a with {}"));
    let r =
        send(&app, Method::POST, "/v2/repository/models/a/load", &[], r#"{"parameters":{"file:1/model.py":"eA=="}}"#)
            .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(mock.loads.lock().unwrap().last().map(String::as_str), Some(r#"load a with None and ["1/model.py=x"]"#));
    let r = send(&app, Method::POST, "/v2/repository/models/a/load", &[], r#"{"parameters":{"file:1/model.py":"%%"}}"#)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().starts_with("load parameter 'file:1/model.py' is not valid base64"), "{}", r.error());
    let r = send(&app, Method::POST, "/v2/repository/models/a/load", &[], r#"{"parameters":{"config":1}}"#).await;
    assert_eq!(r.error(), "load parameter 'config' must be a string");
    let r =
        send(&app, Method::POST, "/v2/repository/models/a/unload", &[], r#"{"parameters":{"unload_dependents":1}}"#)
            .await;
    assert_eq!(r.error(), "Unable to parse 'unload_dependents': expected a boolean");
    let r = send(&app, Method::POST, "/v2/repository/myrepo/models/a/load", &[], Body::empty()).await;
    assert_eq!(
        (r.status, r.error()),
        (StatusCode::NOT_IMPLEMENTED, "'repository_name' specification is not supported".into())
    );
    let r = send(&app, Method::POST, "/v2/repository/models/a/reload", &[], Body::empty()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn unsupported_extensions() {
    let (_, app) = app();
    // System shared memory: Triton's texts for unknown regions, missing fields and missing keys.
    let r = get(&app, "/v2/systemsharedmemory/status").await;
    assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"[]"[..]));
    let r = get(&app, "/v2/systemsharedmemory/region/r0/status").await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (StatusCode::NOT_FOUND, "Unable to find system shared memory region: 'r0'")
    );
    let register =
        |body: &'static str| send(&app, Method::POST, "/v2/systemsharedmemory/region/r0/register", &[], body);
    let r = register(r#"{"key":"/no-such-tritium-key","byte_size":8}"#).await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, "Unable to open shared memory region: '/no-such-tritium-key'")
    );
    let r = register(r#"{"byte_size":8}"#).await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (StatusCode::BAD_REQUEST, "Shared memory register request has no 'key' field")
    );
    let r = register(r#"{"key":"/k"}"#).await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (StatusCode::BAD_REQUEST, "Shared memory register request has no 'byte_size' field")
    );
    let r = send(&app, Method::POST, "/v2/systemsharedmemory/register", &[], r#"{"key":"/k","byte_size":8}"#).await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (StatusCode::BAD_REQUEST, "'region name' is necessary to register system shared memory region")
    );
    for uri in ["/v2/systemsharedmemory/unregister", "/v2/systemsharedmemory/region/r0/unregister"] {
        assert_eq!(send(&app, Method::POST, uri, &[], Body::empty()).await.status, StatusCode::OK);
    }
    assert_eq!(
        send(&app, Method::GET, "/v2/systemsharedmemory/register", &[], Body::empty()).await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    // CUDA shared memory: the same registry (one namespace), Triton's texts for each field.
    let r = get(&app, "/v2/cudasharedmemory/status").await;
    assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"[]"[..]));
    let r = get(&app, "/v2/cudasharedmemory/region/r0/status").await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (StatusCode::NOT_FOUND, "Unable to find cuda shared memory region: 'r0'")
    );
    let register = |body: String| send(&app, Method::POST, "/v2/cudasharedmemory/region/r0/register", &[], body);
    let handle = format!(r#"{{"b64":"{}"}}"#, "A".repeat(86) + "==");
    let r = register(format!(r#"{{"raw_handle":{handle},"device_id":0,"byte_size":64}}"#)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    match tritium_cuda::cuda() {
        Err(e) => assert_eq!(
            r.error(),
            format!("failed to register CUDA shared memory region: 'r0', GPUs not supported ({e})")
        ),
        // A handle of zeros opens nothing.
        Ok(_) => {
            assert!(r.error().starts_with("failed to register shared memory region: invalid args"), "{}", r.error())
        }
    }
    let r = register(r#"{"device_id":0,"byte_size":64}"#.into()).await;
    assert_eq!(r.error(), "Shared memory register request has no 'raw_handle' field");
    let r = register(format!(r#"{{"raw_handle":{handle},"device_id":0}}"#)).await;
    assert_eq!(r.error(), "Shared memory register request has no 'byte_size' field");
    let r = register(format!(r#"{{"raw_handle":{handle},"byte_size":64}}"#)).await;
    assert_eq!(r.error(), "Shared memory register request has no 'device_id' field");
    for short in [r#"{"b64":"AAAA"}"#, r#"{"b64":"not base64!"}"#] {
        let r = register(format!(r#"{{"raw_handle":{short},"device_id":0,"byte_size":64}}"#)).await;
        assert_eq!(
            (r.status, r.error().as_str()),
            (StatusCode::BAD_REQUEST, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        );
    }
    let r = send(&app, Method::POST, "/v2/cudasharedmemory/register", &[], Body::empty()).await;
    assert_eq!(r.error(), "'region name' is necessary to register cuda shared memory region");
    for uri in ["/v2/cudasharedmemory/unregister", "/v2/cudasharedmemory/region/r0/unregister"] {
        assert_eq!(send(&app, Method::POST, uri, &[], Body::empty()).await.status, StatusCode::OK);
    }
    assert_eq!(
        send(&app, Method::GET, "/v2/cudasharedmemory/register", &[], Body::empty()).await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    // A backend without log control answers the logging extension as Triton built without it.
    let r = send(&app, Method::GET, "/v2/logging", &[], Body::empty()).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.error().contains("does not support dynamic logging"), "{}", r.error());
    // A backend without tracing answers the trace extension the same way.
    for (method, uri) in [(Method::POST, "/v2/trace/setting"), (Method::GET, "/v2/models/m/trace/setting")] {
        let r = send(&app, method, uri, &[], Body::empty()).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert!(r.error().contains("does not support tracing"), "{}", r.error());
    }
    // A backend without response streams refuses the generate extension after decoding.
    let r = send(&app, Method::POST, "/v2/models/simple/generate", &[], r#"{"IN": [1, 2]}"#).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(r.error(), "the generate extension is not supported by this server");
    let r = send(&app, Method::POST, "/v2/models/simple/generate_stream", &[], r#"{"IN": "x"}"#).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().starts_with("Unable to parse 'data' of input 'IN'"), "{}", r.error());
}

/// A request the way `tritonclient.http` builds one with binary inputs.
fn binary_request(header: Value, blobs: &[&[u8]]) -> (Vec<u8>, String) {
    let mut body = header.to_string().into_bytes();
    let len = body.len().to_string();
    for b in blobs {
        body.extend_from_slice(b);
    }
    (body, len)
}

/// Splits a binary response into its JSON header and binary part.
fn split(r: &Resp) -> (Value, Bytes) {
    let len: usize = r.header("inference-header-content-length").expect("header length").parse().unwrap();
    (serde_json::from_slice(&r.body[..len]).unwrap(), r.body.slice(len..))
}

#[tokio::test]
async fn infer_json() {
    let (mock, app) = app();
    let body = json!({
        "id": "abc",
        "parameters": {"sequence_id": 5, "sequence_start": true, "custom": "x"},
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [[1.5, 2.5]]},
                   {"name": "S", "datatype": "BYTES", "shape": [1], "data": ["ünï"]}]
    });
    let r = send(
        &app,
        Method::POST,
        "/v2/models/simple/versions/2/infer",
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.header("inference-header-content-length").is_none());
    assert_eq!(r.header("content-length"), Some(r.body.len().to_string().as_str()));
    assert_eq!(
        r.json(),
        json!({"id": "abc", "model_name": "simple", "model_version": "2", "parameters": {"echo": true}, "outputs": [
            {"name": "OUT_IN", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]},
            {"name": "OUT_S", "datatype": "BYTES", "shape": [1], "data": ["ünï"]}
        ]})
    );
    let req = mock.last_request.lock().unwrap().clone().unwrap();
    assert_eq!(req.version, Some(2));
    assert_eq!(req.flags, 1);
    assert_eq!(req.parameters, vec![("custom".to_string(), ParamValue::Str("x".into()))]);
    assert_eq!(&req.inputs[1].data[..], &serialize_bytes(["ünï"])[..]);
}

#[tokio::test]
async fn infer_binary_like_tritonclient() {
    let (_, app) = app();
    let a: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let s = serialize_bytes([&b"\x00\xffbin"[..], "é".as_bytes()]);
    let header = json!({
        "inputs": [
            {"name": "A", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": a.len()}},
            {"name": "S", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": s.len()}},
            {"name": "J", "datatype": "INT64", "shape": [1], "data": [9]}
        ],
        "outputs": [
            {"name": "OUT_A", "parameters": {"binary_data": true}},
            {"name": "OUT_S", "parameters": {"binary_data": true}},
            {"name": "OUT_J", "parameters": {"binary_data": false}}
        ]
    });
    let (body, len) = binary_request(header, &[&a, &s]);
    let r = send(
        &app,
        Method::POST,
        "/v2/models/simple/infer",
        &[("inference-header-content-length", &len), ("content-type", "application/octet-stream")],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    let (json, binary) = split(&r);
    assert_eq!(
        json["outputs"][0],
        json!({"name": "OUT_A", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}})
    );
    assert_eq!(json["outputs"][1]["parameters"]["binary_data_size"], s.len());
    assert_eq!(json["outputs"][2], json!({"name": "OUT_J", "datatype": "INT64", "shape": [1], "data": [9]}));
    assert_eq!(&binary[..], &[a, s].concat()[..]);
    assert!(json.get("id").is_none());

    // binary_data_output applies to outputs the request did not list.
    let header = json!({"parameters": {"binary_data_output": true}, "inputs": [{"name": "X", "datatype": "INT8", "shape": [3], "data": [1, -2, 3]}]});
    let r = send(&app, Method::POST, "/v2/models/simple/infer", &[], header.to_string()).await;
    let (json, binary) = split(&r);
    assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], 3);
    assert_eq!(&binary[..], &[1u8, 0xfe, 3][..]);
}

#[tokio::test]
async fn infer_compressed_bodies() {
    let (_, app) = app();
    let a: Vec<u8> = (0..4096u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let header = json!({"inputs": [{"name": "A", "datatype": "FP32", "shape": [4096], "parameters": {"binary_data_size": a.len()}}],
                        "outputs": [{"name": "OUT_A", "parameters": {"binary_data": true}}]});
    let (plain, len) = binary_request(header, &[&a]);
    for enc in [Encoding::Gzip, Encoding::Deflate] {
        let packed = compress(enc, &[&plain]).unwrap();
        let r = send(
            &app,
            Method::POST,
            "/v2/models/simple/infer",
            &[
                ("inference-header-content-length", &len),
                ("content-encoding", enc.as_str()),
                ("accept-encoding", enc.as_str()),
            ],
            packed,
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(r.header("content-encoding"), Some(enc.as_str()));
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
        // The header length counts the uncompressed JSON, as Triton (and its clients) have it.
        let hlen: usize = r.header("inference-header-content-length").unwrap().parse().unwrap();
        let body = decompress(enc, &r.body, 1 << 30).unwrap();
        let json: Value = serde_json::from_slice(&body[..hlen]).unwrap();
        assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], a.len());
        assert_eq!(&body[hlen..], &a[..]);
    }
    // JSON responses are compressed too; without Accept-Encoding nothing is.
    let req = json!({"inputs": [{"name": "I", "datatype": "INT32", "shape": [1], "data": [1]}]}).to_string();
    let r = send(&app, Method::POST, "/v2/models/simple/infer", &[("accept-encoding", "br, gzip;q=0.5")], req.clone())
        .await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: Value = serde_json::from_slice(&decompress(Encoding::Gzip, &r.body, 1 << 20).unwrap()).unwrap();
    assert_eq!(v["outputs"][0]["data"], json!([1]));
    let r = send(&app, Method::POST, "/v2/models/simple/infer", &[], req.clone()).await;
    assert!(r.header("content-encoding").is_none());

    let r = send(&app, Method::POST, "/v2/models/simple/infer", &[("content-encoding", "br")], req).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(r.header("accept-encoding"), Some("gzip, deflate"));
    assert_eq!(r.error(), "Unsupported compression type");
    let r = send(&app, Method::POST, "/v2/models/simple/infer", &[("content-encoding", "gzip")], "not gzip").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().starts_with("failed to decompress"));
}

#[tokio::test]
async fn infer_errors() {
    let (_, app) = app();
    let req = json!({"inputs": [{"name": "I", "datatype": "INT32", "shape": [1], "data": [1]}]}).to_string();
    for (model, status) in [
        ("err_notfound", StatusCode::NOT_FOUND),
        ("err_unavailable", StatusCode::SERVICE_UNAVAILABLE),
        ("err_unsupported", StatusCode::NOT_IMPLEMENTED),
        ("err_internal", StatusCode::INTERNAL_SERVER_ERROR),
        ("err_invalid", StatusCode::BAD_REQUEST),
    ] {
        let r =
            send(&app, Method::POST, &format!("/v2/models/{model}/infer"), &[("accept-encoding", "gzip")], req.clone())
                .await;
        assert_eq!(r.status, status, "{model}");
        assert!(r.error().starts_with("model failed"));
        assert!(r.header("content-encoding").is_none(), "errors are not compressed");
    }
    let bad = json!({"inputs": [{"name": "I", "datatype": "INT32", "shape": [3], "data": [1]}]}).to_string();
    let r = send(&app, Method::POST, "/v2/models/m/infer", &[], bad).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().contains("shape does not match true shape"));
    let r = send(&app, Method::POST, "/v2/models/m/infer", &[("inference-header-content-length", "999")], req.clone())
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().starts_with("inference header size should be in range (0, "));
    let r = send(&app, Method::POST, "/v2/models/m/infer", &[], Body::empty()).await;
    assert!(r.error().contains("request body is empty"));
}

#[tokio::test]
async fn infer_refuses_decoupled_models_with_tritons_text_before_reading_the_body() {
    let (mock, app) = app();
    let req = json!({"inputs": [{"name": "I", "datatype": "INT32", "shape": [1], "data": [1]}]}).to_string();
    let r = send(&app, Method::POST, "/v2/models/decoupled/infer", &[], req).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(r.error(), "HTTP end point doesn't support models with decoupled transaction policy");
    assert_eq!(mock.infers.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn infer_raw_binary() {
    let (mock, app) = app();
    let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let r =
        send(&app, Method::POST, "/v2/models/simple/infer", &[("inference-header-content-length", "0")], data.clone())
            .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let (json, binary) = split(&r);
    assert_eq!(json["outputs"][0]["shape"], json!([1, 3]));
    assert_eq!(&binary[..], &data[..]);
    let req = mock.last_request.lock().unwrap().clone().unwrap();
    assert_eq!((req.inputs[0].name.as_str(), req.inputs[0].datatype), ("IN", DataType::Fp32));
}

#[tokio::test]
async fn body_limit() {
    let mock = Arc::new(Mock::default());
    let app = router_with(mock, Options { max_input_size: 200, ..Options::default() });
    let flag = "Use --http-max-input-size to increase the limit.";
    let req = json!({"inputs": [{"name": "I", "datatype": "INT32", "shape": [100], "data": vec![0; 100]}]}).to_string();
    let r = send(&app, Method::POST, "/v2/models/m/infer", &[], req.clone()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.error(),
        format!("request JSON size of {} bytes exceeds the maximum allowed input size of 200 bytes. {flag}", req.len())
    );
    // As in Triton, binary data after a JSON header does not count; the header does.
    let header = r#"{"inputs":[{"name":"I","datatype":"UINT8","shape":[190],"parameters":{"binary_data_size":190}}]}"#;
    let mut body = header.as_bytes().to_vec();
    body.extend_from_slice(&[0u8; 190]);
    let hl = header.len().to_string();
    let r = send(&app, Method::POST, "/v2/models/m/infer", &[("inference-header-content-length", &hl)], body).await;
    assert_ne!(r.status, StatusCode::BAD_REQUEST, "{}", r.error());
    let r =
        send(&app, Method::POST, "/v2/models/m/infer", &[("inference-header-content-length", "201")], vec![b' '; 250])
            .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.error(),
        format!("request JSON size of 201 bytes exceeds the maximum allowed input size of 200 bytes. {flag}")
    );
    let r = send(&app, Method::POST, "/v2/models/m/infer", &[("inference-header-content-length", "0")], vec![0u8; 201])
        .await;
    assert_eq!(
        r.error(),
        format!("Raw input has a byte_size (201 bytes) that exceeds the maximum allowed value of 200 bytes. {flag}")
    );
    // Decompressed size counts too.
    let packed = compress(Encoding::Gzip, &[req.as_bytes()]).unwrap();
    assert!(packed.len() <= 200);
    let r = send(&app, Method::POST, "/v2/models/m/infer", &[("content-encoding", "gzip")], packed).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error(), format!("Decompressed data size exceeds the maximum allowed value of 200 bytes. {flag}"));
    // Control requests have the same limit.
    let r = send(&app, Method::POST, "/v2/repository/index", &[], vec![b' '; 201]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().starts_with("request JSON size of 201 bytes"), "{}", r.error());
}

#[tokio::test]
async fn content_length_over_the_limit_is_refused_before_the_body() {
    let app = router_with(Arc::new(Mock::default()), Options { max_input_size: 1 << 20, ..Options::default() });
    // A body that never ends: the declared length is refused at once, and only a bounded
    // amount of the body is read (and thrown away) before the answer.
    let req = Request::builder()
        .method(Method::POST)
        .uri("/v2/models/m/infer")
        .header("content-length", (4u64 << 30).to_string())
        .body(Body::new(Endless))
        .unwrap();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(5), app.oneshot(req))
        .await
        .expect("answered without reading the body")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

/// A request body of zeros that never ends.
struct Endless;

static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(&ZEROS)))))
    }
}

#[test]
fn serves_over_tcp_and_shuts_down() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = rt.spawn(tritium_http::serve_with(listener, Arc::new(Mock::default()), Options::default(), async {
        let _ = rx.await;
    }));

    let a: Vec<u8> = [7i32, 8].iter().flat_map(|v| v.to_le_bytes()).collect();
    let header =
        json!({"inputs": [{"name": "A", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}}]});
    let (body, len) = binary_request(header, &[&a]);
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: {len}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream.write_all(&body).unwrap();
    let mut resp = Vec::new();
    stream.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8_lossy(&resp).to_lowercase();
    assert!(text.starts_with("http/1.1 200 ok"), "{text}");
    assert!(text.contains("content-type: application/json"), "{text}");

    tx.send(()).unwrap();
    rt.block_on(server).unwrap().unwrap();
}

#[test]
fn large_binary_bodies_over_tcp() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = rt.spawn(tritium_http::serve_with(listener, Arc::new(Mock::default()), Options::default(), async {
        let _ = rx.await;
    }));

    // 48 MiB in, 48 MiB back: the body arrives in many chunks and leaves as header + tensor.
    let n = 12 << 20;
    let a: Vec<u8> = (0..n as u32).flat_map(|v| v.wrapping_mul(2_654_435_761).to_le_bytes()).collect();
    let header = json!({"inputs": [{"name": "A", "datatype": "UINT32", "shape": [n], "parameters": {"binary_data_size": a.len()}}],
                        "parameters": {"binary_data_output": true}});
    let (body, len) = binary_request(header, &[&a]);
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let head = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: {len}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let sender = std::thread::spawn(move || {
        writer.write_all(head.as_bytes()).unwrap();
        for chunk in body.chunks(1 << 20) {
            writer.write_all(chunk).unwrap();
        }
    });
    let mut resp = Vec::new();
    stream.read_to_end(&mut resp).unwrap();
    sender.join().unwrap();
    let split_at = resp.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&resp[..split_at]).to_lowercase();
    assert!(head.starts_with("http/1.1 200 ok"), "{head}");
    assert!(head.contains("content-type: application/octet-stream"), "{head}");
    let hlen: usize =
        head.split("inference-header-content-length: ").nth(1).unwrap().split("\r\n").next().unwrap().parse().unwrap();
    assert!(head.contains(&format!("content-length: {}", hlen + a.len())), "{head}");
    let payload = &resp[split_at..];
    let json: Value = serde_json::from_slice(&payload[..hlen]).unwrap();
    assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], a.len());
    assert!(payload[hlen..] == a[..], "binary output differs");

    tx.send(()).unwrap();
    rt.block_on(server).unwrap().unwrap();
}
