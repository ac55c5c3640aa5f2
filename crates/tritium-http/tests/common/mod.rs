//! A mock [`Backend`] shared by the integration tests: it echoes every input back as output
//! `OUT_<name>`, fails on request for models named `err_<kind>`, says that the model named
//! `decoupled` is decoupled, and records what it was asked.

#![allow(clippy::unwrap_used, dead_code, missing_docs, unreachable_pub)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tritium_http::Backend;
use tritium_server::testing::{classify, growing_stats, model_stats};
use tritium_server::{
    ErrorKind, IndexEntry, InferError, InferRequest, InferResponse, ModelMetadata, ModelStats, OutputTensor,
    ParamValue, ServerMetadata, TensorMetadata,
};

#[derive(Default)]
pub struct Mock {
    pub not_ready: AtomicBool,
    pub last_request: Mutex<Option<InferRequest>>,
    pub last_index_ready: Mutex<Option<bool>>,
    pub loads: Mutex<Vec<String>>,
    pub infers: std::sync::atomic::AtomicU64,
    pub shm: tritium_server::shm::ShmRegistry,
}

impl Backend for Mock {
    fn system_shm(&self) -> Option<&tritium_server::shm::ShmRegistry> {
        Some(&self.shm)
    }

    /// Echoes every input as output `OUT_<name>`; model names `err_<kind>` fail with that kind.
    async fn infer(&self, req: InferRequest) -> Result<InferResponse, InferError> {
        *self.last_request.lock().unwrap() = Some(req.clone());
        self.infers.fetch_add(1, Ordering::SeqCst);
        if let Some(kind) = req.model.strip_prefix("err_") {
            let kind = match kind {
                "notfound" => ErrorKind::NotFound,
                "unavailable" => ErrorKind::Unavailable,
                "unsupported" => ErrorKind::Unsupported,
                "internal" => ErrorKind::Internal,
                _ => ErrorKind::InvalidArg,
            };
            return Err(InferError::new(kind, format!("model failed: {kind:?}")));
        }
        let mut outputs = Vec::new();
        for i in &req.inputs {
            let name = format!("OUT_{}", i.name);
            let requested = req.outputs.iter().find(|r| r.name == name);
            if !req.outputs.is_empty() && requested.is_none() {
                continue;
            }
            let o = OutputTensor { name, datatype: i.datatype, shape: i.shape.clone(), data: i.data.to_vec() };
            // Classification is the core's; the mock model batches (max_batch_size 4).
            outputs.push(match requested.and_then(|r| r.classification) {
                Some(k) => classify(&o, k, true)?,
                None => o,
            });
        }
        Ok(InferResponse {
            model: req.model.clone(),
            version: req.version.unwrap_or(1),
            id: req.id.clone(),
            outputs,
            parameters: vec![("echo".into(), ParamValue::Bool(true))],
        })
    }
    fn live(&self) -> bool {
        true
    }
    fn ready(&self) -> bool {
        !self.not_ready.load(Ordering::SeqCst)
    }
    fn metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: "triton".into(),
            version: "2.50.0".into(),
            extensions: vec!["binary_tensor_data".into(), "statistics".into()],
        }
    }
    fn model_metadata(&self, name: &str, version: Option<i64>) -> Result<ModelMetadata, InferError> {
        if name == "missing" {
            return Err(InferError::not_found(format!("Request for unknown model: '{name}' is not found")));
        }
        Ok(ModelMetadata {
            name: name.into(),
            versions: vec![version.unwrap_or(1).to_string()],
            platform: "python".into(),
            inputs: vec![TensorMetadata { name: "IN".into(), datatype: "FP32".into(), shape: vec![-1, -1] }],
            outputs: vec![TensorMetadata { name: "OUT_IN".into(), datatype: "FP32".into(), shape: vec![-1, -1] }],
        })
    }
    fn model_config_json(&self, name: &str, _version: Option<i64>) -> Result<String, InferError> {
        if name == "missing" {
            return Err(InferError::not_found("no such model"));
        }
        Ok(format!(
            r#"{{"name":"{name}","platform":"","backend":"python","version_policy":{{"latest":{{"num_versions":1}}}},"max_batch_size":4,"input":[{{"name":"IN","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":["-1"],"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false}}],"output":[{{"name":"OUT_IN","data_type":"TYPE_FP32","dims":["-1"],"label_filename":"","is_shape_tensor":false}}],"batch_input":[],"batch_output":[],"optimization":{{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{{"enable":true}},"output_pinned_memory":{{"enable":true}}}},"dynamic_batching":{{}},"instance_group":[{{"name":"{name}_0","kind":"KIND_CPU","count":1,"gpus":[],"profile":[],"passive":false,"host_policy":""}}],"default_model_filename":"model.py","cc_model_filenames":{{}},"metric_tags":{{}},"parameters":{{}},"model_warmup":[]}}"#
        ))
    }
    fn model_decoupled(&self, name: &str, _version: Option<i64>) -> Result<bool, InferError> {
        Ok(name == "decoupled")
    }
    fn model_ready(&self, name: &str, _version: Option<i64>) -> bool {
        name != "missing"
    }
    fn repository_index(&self, ready_only: bool) -> Vec<IndexEntry> {
        *self.last_index_ready.lock().unwrap() = Some(ready_only);
        vec![
            IndexEntry {
                name: "a".into(),
                version: "1".into(),
                state: "READY".into(),
                python: "/e/bin/python".into(),
                environment: "/e".into(),
                ..IndexEntry::default()
            },
            IndexEntry {
                name: "b".into(),
                state: "UNAVAILABLE".into(),
                reason: "unloaded".into(),
                ..IndexEntry::default()
            },
        ]
    }
    async fn load_model(&self, name: &str) -> Result<(), InferError> {
        self.loads.lock().unwrap().push(format!("load {name}"));
        if name == "missing" {
            return Err(InferError::invalid("failed to load 'missing', failed to poll from model repository"));
        }
        Ok(())
    }
    async fn load_model_with_config(&self, name: &str, config: &str) -> Result<(), InferError> {
        self.loads.lock().unwrap().push(format!("load {name} with {config}"));
        Ok(())
    }
    async fn load_model_with_files(
        &self,
        name: &str,
        config: Option<&str>,
        files: Vec<tritium_server::ModelFile>,
    ) -> Result<(), InferError> {
        let files: Vec<String> =
            files.iter().map(|f| format!("{}={}", f.path, String::from_utf8_lossy(&f.contents))).collect();
        self.loads.lock().unwrap().push(format!("load {name} with {config:?} and {files:?}"));
        Ok(())
    }
    async fn unload_model(&self, name: &str) -> Result<(), InferError> {
        self.loads.lock().unwrap().push(format!("unload {name}"));
        Ok(())
    }
    fn statistics(&self, name: Option<&str>, _version: Option<i64>) -> Result<Vec<ModelStats>, InferError> {
        if name == Some("missing") {
            return Err(InferError::invalid("requested model 'missing' is not available"));
        }
        if name == Some("perf") {
            // Numbers that grow with the inferences served, as perf_analyzer expects.
            return Ok(vec![growing_stats("perf", self.infers.load(Ordering::SeqCst))]);
        }
        Ok(vec![model_stats(name.unwrap_or("a"))])
    }
}
