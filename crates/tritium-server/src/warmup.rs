//! Model warmup (`model_warmup [ { name, batch_size, inputs { ... }, count } ]`), as Triton's
//! `TritonModelInstance::GenerateWarmupData` and `WarmUp` do it: each sample becomes
//! `batch_size` requests (batch dimension 1 on batching models) executed together, `count`
//! times (at least once), on every instance after `initialize` and before it is ready. A sample
//! with `batch_size: 0` is skipped. Data is zeros, random bytes (zeros for `TYPE_STRING`), or
//! the bytes of `<model directory>/warmup/<input_data_file>`.
//!
//! Warmup requests go straight to the instance's stub, never through the queue, so they are not
//! in the model's statistics. A response error fails the instance with Triton's text
//! (`"failed to run warmup sample '<name>': <error>; "`), which fails the load.

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use tritium_config::proto::model_warmup::input::InputDataType;
use tritium_config::ModelConfig;
use tritium_host::Stub;
use tritium_ipc::{DataType, Request, TensorData};

use crate::confine::PathPolicy;
use crate::validate::wire_type;

/// Triton's `kWarmupDataFolder`.
const WARMUP_DATA_FOLDER: &str = "warmup";

/// One input of a warmup request.
#[derive(Debug, Clone)]
pub(crate) struct WarmupInput {
    name: String,
    dtype: DataType,
    shape: Vec<i64>,
    data: Bytes,
}

/// One `model_warmup` entry, ready to run.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    name: String,
    count: u32,
    batch_size: u32,
    inputs: Vec<WarmupInput>,
}

/// The warmup samples of a model, with their data; an error names what is wrong (Triton's
/// texts). The config's sizes were checked against the server's limits before
/// ([`crate::config_limits`]); an `input_data_file` must be a regular file inside
/// `<model directory>/warmup` (or a directory `paths` allows) of at most `max_bytes`.
pub(crate) fn samples(
    config: &ModelConfig,
    model_dir: &Path,
    paths: &PathPolicy,
    max_bytes: u64,
) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    // A sample is normalized as a client's request is: its inputs reach the model reshaped.
    let reshapes = crate::reshape::Reshapes::new(config);
    for setting in &config.model_warmup {
        if setting.batch_size == 0 {
            tracing::debug!("Skipping batch 0 warmup sample '{}'", setting.name);
            continue;
        }
        let mut names: Vec<&String> = setting.inputs.keys().collect();
        names.sort();
        let mut inputs = Vec::with_capacity(names.len());
        for name in names {
            let meta = &setting.inputs[name];
            let dtype = wire_type(meta.data_type)
                .ok_or_else(|| format!("warmup setting expects input '{name}' to have a valid data_type"))?;
            if meta.dims.iter().any(|&d| d < 0) {
                return Err(format!(
                    "warmup setting expects all variable-size dimensions are specified for input '{name}'"
                ));
            }
            // TYPE_STRING elements are serialized: 4 length bytes each (zero: empty strings).
            let byte_size = crate::config_limits::warmup_input_bytes(meta)
                .filter(|&n| n <= max_bytes)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    format!(
                        "warmup sample '{}' input '{name}' is larger than --max-warmup-bytes ({max_bytes})",
                        setting.name
                    )
                })?;
            let data = match &meta.input_data_type {
                Some(InputDataType::ZeroData(_)) => Bytes::from(vec![0u8; byte_size]),
                Some(InputDataType::RandomData(_)) if dtype == DataType::Bytes => Bytes::from(vec![0u8; byte_size]),
                Some(InputDataType::RandomData(_)) => Bytes::from(random_bytes(byte_size, &mut seed)),
                Some(InputDataType::InputDataFile(file)) => {
                    let mut data = read_data_file(model_dir, file, paths, max_bytes)?;
                    if dtype != DataType::Bytes {
                        if byte_size > data.len() {
                            return Err(format!(
                                "warmup setting expects {byte_size} bytes, but the data provided from {file}only has {} bytes",
                                data.len()
                            ));
                        }
                        data.truncate(byte_size);
                    }
                    Bytes::from(data)
                }
                None => return Err(format!("warmup setting expects input '{name}' to have input_data_type set")),
            };
            let is_model_input = config.input.iter().any(|i| &i.name == name);
            let mut shape = Vec::with_capacity(meta.dims.len() + 1);
            if config.max_batch_size != 0 && is_model_input {
                shape.push(1);
            }
            shape.extend_from_slice(&meta.dims);
            reshapes.input(name, &mut shape);
            inputs.push(WarmupInput { name: name.clone(), dtype, shape, data });
        }
        check_required(config, &inputs)?;
        out.push(Sample {
            name: setting.name.clone(),
            count: setting.count.max(1),
            batch_size: setting.batch_size,
            inputs,
        });
    }
    Ok(out)
}

/// The bytes of a warmup data file: `<model directory>/warmup/<file>`, which must stay inside
/// the model directory, be a regular file (not a device or a fifo that never ends) and hold at
/// most `max_bytes`.
fn read_data_file(model_dir: &Path, file: &str, paths: &PathPolicy, max_bytes: u64) -> Result<Vec<u8>, String> {
    let base = model_dir.join(WARMUP_DATA_FOLDER);
    paths
        .read_bounded("warmup input_data_file", file, model_dir, &base, max_bytes, "--max-warmup-bytes")
        .map_err(|why| format!("failed to open text file for read {}: {why}", base.join(file).display()))
}

/// A sample must give every required input of the model, as a request must: Triton refuses
/// the model with its request validation's text (the sample's other inputs do not count).
fn check_required(config: &ModelConfig, inputs: &[WarmupInput]) -> Result<(), String> {
    let given: Vec<&str> =
        inputs.iter().map(|i| i.name.as_str()).filter(|n| config.input.iter().any(|c| c.name == *n)).collect();
    if config.input.iter().all(|i| i.optional || given.contains(&i.name.as_str())) {
        return Ok(());
    }
    let log = "[request id: <id_unknown>] ".to_string();
    Err(crate::validate::input_count(log, config.name.clone(), config, &given).to_string())
}

/// Random bytes (xorshift64*: warmup data needs no quality, only no dependency).
fn random_bytes(len: usize, seed: &mut u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        *seed ^= *seed >> 12;
        *seed ^= *seed << 25;
        *seed ^= *seed >> 27;
        out.extend_from_slice(&seed.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Runs every sample on `stub` (an instance that has just initialized); the first sample with
/// an error ends the warmup with Triton's text. `decoupled` models answer through their
/// response stream, which is read until every request has its final response.
pub(crate) fn run(
    stub: &Stub,
    samples: &[Sample],
    decoupled: bool,
    timeout: Option<Duration>,
    next_id: &dyn Fn() -> u64,
) -> Result<(), String> {
    for sample in samples {
        for iteration in 1..=sample.count {
            tracing::debug!("running warmup sample '{}' for iteration {iteration}", sample.name);
            let mut requests = Vec::with_capacity(sample.batch_size as usize);
            for _ in 0..sample.batch_size {
                let mut inputs = Vec::with_capacity(sample.inputs.len());
                for input in &sample.inputs {
                    let desc = stub
                        .input(&input.data)
                        .map_err(|e| format!("failed to run warmup sample '{}': {e}; ", sample.name))?;
                    inputs.push(tritium_ipc::Tensor {
                        name: input.name.clone(),
                        dtype: input.dtype,
                        shape: input.shape.clone(),
                        data: TensorData::Shm { desc, writable: true },
                    });
                }
                requests.push(Request { id: next_id(), inputs, ..Default::default() });
            }
            let errors =
                if decoupled { execute_decoupled(stub, requests, timeout) } else { execute(stub, requests, timeout) };
            let errors = errors.map_err(|e| format!("failed to run warmup sample '{}': {e}; ", sample.name))?;
            if !errors.is_empty() {
                let mut text = format!("failed to run warmup sample '{}': ", sample.name);
                for e in errors {
                    text.push_str(&e);
                    text.push_str("; ");
                }
                return Err(text);
            }
        }
    }
    Ok(())
}

/// One `execute` of a model that is not decoupled: the errors of its responses.
fn execute(stub: &Stub, requests: Vec<Request>, timeout: Option<Duration>) -> Result<Vec<String>, String> {
    let ids: Vec<u64> = requests.iter().map(|r| r.id).collect();
    let executed = stub.execute(requests, timeout).map_err(|e| e.to_string())?;
    let mut errors = Vec::new();
    for r in &executed.responses {
        stub.release_outputs(r);
        if let Some(e) = &r.error {
            errors.push(e.message.clone());
        }
    }
    if let Some(e) = executed.error {
        // Requests without a response share the batch's error.
        let answered = executed.responses.len();
        for _ in answered..ids.len() {
            errors.push(e.message.clone());
        }
    }
    Ok(errors)
}

/// One `execute` of a decoupled model, reading responses until each request has its final.
fn execute_decoupled(stub: &Stub, requests: Vec<Request>, timeout: Option<Duration>) -> Result<Vec<String>, String> {
    let open: RefCell<HashSet<u64>> = RefCell::new(requests.iter().map(|r| r.id).collect());
    let errors = RefCell::new(Vec::new());
    let taken: RefCell<std::collections::HashMap<u64, u64>> = RefCell::default();
    let mut on_response = |r: tritium_ipc::Response| {
        stub.release_outputs(&r);
        let mut open = open.borrow_mut();
        if !open.contains(&r.request) {
            return Err(format!("sent a response for request {} that is not open", r.request));
        }
        // Warmup takes each response at once: credit it, so a model streaming more than
        // `--max-inflight-responses` never waits for a client that is not there.
        let mut taken = taken.borrow_mut();
        let n = taken.entry(r.request).or_insert(0);
        *n += 1;
        let _ = stub.credit(r.request, *n);
        if let Some(e) = &r.error {
            errors.borrow_mut().push(e.message.clone());
        }
        if r.final_response {
            open.remove(&r.request);
        }
        Ok(())
    };
    let batch_error =
        stub.execute_decoupled(requests, timeout, &mut on_response, &mut |_| {}).map_err(|e| e.to_string())?;
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    while !open.borrow().is_empty() {
        if let Some(e) = &batch_error {
            errors.borrow_mut().push(e.message.clone());
            break;
        }
        if deadline.is_some_and(|d| std::time::Instant::now() > d) {
            errors.borrow_mut().push("the warmup requests got no final response in time".to_string());
            break;
        }
        stub.poll(Duration::from_millis(10), &mut on_response).map_err(|e| e.to_string())?;
    }
    Ok(errors.into_inner())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LIMIT: u64 = crate::config_limits::DEFAULT_MAX_WARMUP_BYTES;

    fn config(text: &str) -> ModelConfig {
        tritium_config::parse_config(text, Path::new("config.pbtxt")).unwrap()
    }

    #[test]
    fn data_files_stay_inside_the_model_directory_and_their_limit() {
        let dir = std::env::temp_dir().join(format!("tritium-warmup-files-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("m/warmup")).unwrap();
        std::fs::write(dir.join("secret"), "root:x:0:0").unwrap();
        std::fs::write(dir.join("m/warmup/big.bin"), [7u8; 64]).unwrap();
        let _ = std::os::unix::fs::symlink(dir.join("secret"), dir.join("m/warmup/link.bin"));
        let model = dir.join("m");
        let with_file = |file: &str| {
            config(&format!(
                r#"name: "m" max_batch_size: 0 input [ {{ name: "A" data_type: TYPE_UINT8 dims: [ 4 ] }} ]
                model_warmup [ {{ name: "s" batch_size: 1 inputs {{ key: "A" value: {{ data_type: TYPE_UINT8 dims: [ 4 ] input_data_file: "{file}" }} }} }} ]"#
            ))
        };
        for file in ["../../secret", "/etc/passwd", "/dev/zero", "link.bin", "/proc/self/environ"] {
            let e = samples(&with_file(file), &model, &PathPolicy::default(), LIMIT).unwrap_err();
            assert!(e.contains("is outside the model's directory") && !e.contains("root:x"), "{file}: {e}");
        }
        let e = samples(&with_file("big.bin"), &model, &PathPolicy::default(), 16).unwrap_err();
        assert!(e.contains("64 bytes, more than --max-warmup-bytes (16)"), "{e}");
        let s = samples(&with_file("big.bin"), &model, &PathPolicy::default(), LIMIT).unwrap();
        assert_eq!(s[0].inputs[0].data.as_ref(), &[7u8; 4]);
        let huge = config(
            r#"name: "m" max_batch_size: 0 input [ { name: "A" data_type: TYPE_UINT8 dims: [ 35184372088832 ] } ]
            model_warmup [ { name: "s" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_UINT8 dims: [ 35184372088832 ] zero_data: true } } } ]"#,
        );
        let e = samples(&huge, &model, &PathPolicy::default(), LIMIT).unwrap_err();
        assert!(e.contains("larger than --max-warmup-bytes"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn samples_have_tritons_shapes_data_and_counts() {
        let dir = std::env::temp_dir().join(format!("tritium-warmup-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("warmup")).unwrap();
        std::fs::write(dir.join("warmup").join("in.bin"), [1u8, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
        let c = config(
            r#"name: "m" max_batch_size: 8
            input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_STRING dims: [ 3 ] } ]
            model_warmup [
              { name: "zero" batch_size: 2 count: 3
                inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }
                inputs { key: "B" value: { data_type: TYPE_STRING dims: [ 3 ] random_data: true } } },
              { name: "skipped" batch_size: 0 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } },
              { name: "file" batch_size: 1
                inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "in.bin" } }
                inputs { key: "B" value: { data_type: TYPE_STRING dims: [ 3 ] zero_data: true } } }
            ]"#,
        );
        let s = samples(&c, &dir, &PathPolicy::default(), LIMIT).unwrap();
        assert_eq!(s.len(), 2, "batch size 0 is skipped");
        assert_eq!((s[0].count, s[0].batch_size), (3, 2));
        assert_eq!(s[0].inputs[0].shape, vec![1, 2]);
        assert_eq!(s[0].inputs[0].data.as_ref(), &[0u8; 8]);
        assert_eq!(s[0].inputs[1].data.as_ref(), &[0u8; 12], "random strings are zeros (empty strings)");
        assert_eq!(s[1].count, 1, "count 0 runs once");
        assert_eq!(s[1].inputs[0].data.as_ref(), &[1u8, 2, 3, 4, 5, 6, 7, 8]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_samples_are_refused_with_tritons_texts() {
        let dir = std::env::temp_dir();
        let var = config(
            r#"name: "m" max_batch_size: 0 input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] } ]
            model_warmup [ { name: "s" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } } } ]"#,
        );
        assert_eq!(
            samples(&var, &dir, &PathPolicy::default(), LIMIT).unwrap_err(),
            "warmup setting expects all variable-size dimensions are specified for input 'A'"
        );
        let missing = config(
            r#"name: "m" max_batch_size: 0 input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]
            model_warmup [ { name: "s" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 1 ] input_data_file: "nope.bin" } } } ]"#,
        );
        assert!(samples(&missing, &dir, &PathPolicy::default(), LIMIT)
            .unwrap_err()
            .starts_with("failed to open text file for read "));
        let unknown = config(
            r#"name: "m" max_batch_size: 0 input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]
            model_warmup [ { name: "s" batch_size: 1 inputs { key: "NOPE" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]"#,
        );
        assert_eq!(
            samples(&unknown, &dir, &PathPolicy::default(), LIMIT).unwrap_err(),
            "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'm'. Got input(s) [], but \
             missing required input(s) ['A']. Please provide all required input(s)."
        );
    }
}
