//! Triton's defaults and validation rules (normalize, resolve_instance_groups).

use std::path::Path;

use tritium_config::proto::{
    model_config::SchedulingChoice,
    model_instance_group::Kind,
    model_sequence_batching::StrategyChoice,
    model_version_policy::{Latest, PolicyChoice},
    ModelConfig,
};
use tritium_config::{load_config, normalize, parse_config, resolve_instance_groups, ConfigError};

fn parse(text: &str) -> ModelConfig {
    parse_config(text, Path::new("config.pbtxt")).unwrap_or_else(|e| panic!("{e}"))
}

fn normalized(text: &str, model: &str) -> Result<ModelConfig, ConfigError> {
    let mut config = parse(text);
    normalize(&mut config, model).map(|()| config)
}

mod common;
use common::FIXTURES;

fn fixture(name: &str) -> ModelConfig {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    match load_config(&dir) {
        Ok(Some(config)) => config,
        other => panic!("fixture {name}: {other:?}"),
    }
}

const IO: &str = r#"
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"#;

#[test]
fn defaults_for_a_minimal_python_model() {
    let config = normalized(IO, "m").expect("valid");
    assert_eq!(config.name, "m");
    assert_eq!(config.backend, "python");
    assert_eq!(config.default_model_filename, "model.py");
    assert_eq!(
        config.version_policy.and_then(|p| p.policy_choice),
        Some(PolicyChoice::Latest(Latest { num_versions: 1 }))
    );
    let optimization = config.optimization.expect("optimization");
    assert_eq!(optimization.input_pinned_memory.map(|m| m.enable), Some(true));
    assert_eq!(optimization.output_pinned_memory.map(|m| m.enable), Some(true));
    // Triton names the group it adds after the model itself; its kind is settled by
    // resolve_instance_groups.
    assert_eq!(config.instance_group.len(), 1);
    let group = &config.instance_group[0];
    assert_eq!((group.name.as_str(), group.kind(), group.count), ("m", Kind::Auto, 1));
}

#[test]
fn onnx_and_pytorch_platforms_and_backends_fill_each_other() {
    for (text, backend, platform, file) in [
        ("platform: \"onnxruntime_onnx\"", "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ("backend: \"onnxruntime\"", "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ("platform: \"pytorch_libtorch\"", "pytorch", "pytorch_libtorch", "model.pt"),
        ("backend: \"pytorch\" default_model_filename: \"net.pt2\"", "pytorch", "pytorch_libtorch", "net.pt2"),
    ] {
        let config = normalized(&format!("{text} {IO}"), "m").unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            (config.backend.as_str(), config.platform.as_str(), config.default_model_filename.as_str()),
            (backend, platform, file),
            "{text}"
        );
    }
    let mismatch = normalized(&format!("platform: \"onnxruntime_onnx\" backend: \"pytorch\" {IO}"), "m");
    assert_eq!(
        mismatch.map_err(|e| e.to_string()).err().as_deref(),
        Some("unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, pytorch")
    );
}

#[test]
fn written_values_are_kept() {
    let mut config = fixture("batched_gpu");
    normalize(&mut config, "batched_gpu").expect("valid");
    let Some(SchedulingChoice::DynamicBatching(batching)) = &config.scheduling_choice else {
        panic!("dynamic batching");
    };
    assert_eq!(batching.preferred_batch_size, [4, 8]);
    let optimization = config.optimization.expect("optimization");
    assert_eq!(optimization.input_pinned_memory.map(|m| m.enable), Some(false));
    assert_eq!(optimization.output_pinned_memory.map(|m| m.enable), Some(true));
    let groups: Vec<_> = config.instance_group.iter().map(|g| (g.name.as_str(), g.kind(), g.count)).collect();
    assert_eq!(groups, [("batched_gpu_0", Kind::Gpu, 2), ("spare", Kind::Cpu, 1)]);

    let mut config = fixture("decoupled_streaming");
    normalize(&mut config, "decoupled_streaming").expect("valid");
    assert_eq!(config.default_model_filename, "streamer.py");
    assert_eq!(
        config.version_policy.and_then(|p| p.policy_choice),
        Some(PolicyChoice::Latest(Latest { num_versions: 2 }))
    );
}

#[test]
fn batching_defaults() {
    let config = normalized(&format!("max_batch_size: 16 dynamic_batching {{}} {IO}"), "m").expect("valid");
    assert!(matches!(
        config.scheduling_choice,
        Some(SchedulingChoice::DynamicBatching(ref b)) if b.preferred_batch_size == [16]
    ));

    // Triton accepts a dynamic batcher on a non-batching model (it queues, batch size 1);
    // nothing is added to preferred_batch_size then.
    let config = normalized(&format!("dynamic_batching {{}} {IO}"), "m").expect("valid");
    assert!(matches!(
        config.scheduling_choice,
        Some(SchedulingChoice::DynamicBatching(ref b)) if b.preferred_batch_size.is_empty()
    ));

    let mut config = fixture("sequence_bls");
    normalize(&mut config, "sequence_bls").expect("valid");
    let Some(SchedulingChoice::SequenceBatching(batching)) = &config.scheduling_choice else {
        panic!("sequence batching");
    };
    assert_eq!(batching.max_sequence_idle_microseconds, 1_000_000);
    assert!(matches!(
        batching.strategy_choice,
        Some(StrategyChoice::Oldest(ref o)) if o.preferred_batch_size == [4]
    ));
}

#[test]
fn ensembles_get_no_instance_groups() {
    let mut config = fixture("ensemble");
    normalize(&mut config, "ensemble").expect("valid");
    assert!(config.instance_group.is_empty());
    assert!(config.optimization.is_none());
    assert_eq!(config.backend, "");
    assert_eq!(config.default_model_filename, "");
    resolve_instance_groups(&mut config, &[0]).expect("nothing to resolve");
    assert!(config.instance_group.is_empty());
}

#[test]
fn every_fixture_is_valid() {
    for &name in FIXTURES {
        let mut config = fixture(name);
        normalize(&mut config, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        resolve_instance_groups(&mut config, &[0, 1]).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn refusals_with_triton_texts() {
    let io = IO;
    let cases: &[(&str, String, &str)] = &[
        // (model directory, config, error)
        (
            "m",
            format!("name: \"other\" {io}"),
            "unexpected directory name 'm' for model 'other', directory name must equal model name",
        ),
        (
            "m",
            format!("platform: \"tensorrt_plan\" {io}"),
            "model 'm' asks for platform 'tensorrt_plan', which tritium does not serve; tritium serves the python \
             backend (model.py), Python-based backends (<backend-directory>/<name>/model.py), ensembles, ONNX \
             Runtime models (platform 'onnxruntime_onnx' or backend 'onnxruntime', model.onnx) and PyTorch \
             models (platform 'pytorch_libtorch' or backend 'pytorch', a TorchScript model.pt or a \
             torch.export model.pt2)",
        ),
        (
            "m",
            format!("max_batch_size: -1 {io}"),
            "'max_batch_size' must be non-negative value for m",
        ),
        (
            "m",
            format!("max_batch_size: 4 dynamic_batching {{ preferred_batch_size: [ 2, 8 ] }} {io}"),
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            "m",
            format!("dynamic_batching {{ preferred_batch_size: [ 1 ] }} {io}"),
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            "m",
            format!("max_batch_size: 4 dynamic_batching {{ preferred_batch_size: [ 0 ] }} {io}"),
            "dynamic batching preferred size must be positive for m",
        ),
        (
            "m",
            format!(
                "max_batch_size: 4 dynamic_batching {{ priority_levels: 2 default_priority_level: 3 }} {io}"
            ),
            "default priority level must be in range [1, 2] for m",
        ),
        (
            "m",
            format!(
                "max_batch_size: 4 dynamic_batching {{ preserve_ordering: true default_queue_policy \
                 {{ timeout_action: DELAY default_timeout_microseconds: 5 }} }} {io}"
            ),
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
        ),
        (
            "m",
            format!("model_transaction_policy {{ decoupled: true }} response_cache {{ enable: true }} {io}"),
            "Response Cache does not currently support model m with 'decoupled' transaction policy",
        ),
        (
            "m",
            "input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]".to_owned(),
            "model input must specify 'name' for m",
        ),
        (
            "m",
            "input [ { name: \"IN\" dims: [ 1 ] } ]".to_owned(),
            "model input 'IN' must specify 'data_type' for m",
        ),
        (
            "m",
            "output [ { name: \"OUT\" data_type: TYPE_FP32 } ]".to_owned(),
            "model output 'OUT' must specify 'dims' for m",
        ),
        (
            "m",
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 0 ] } ]".to_owned(),
            "model input 'IN' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m",
        ),
        (
            "m",
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape { shape: [ 5 ] } } ]"
                .to_owned(),
            "model input 'IN' has different size for dims and reshape for m",
        ),
        (
            "m",
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ -1, 2 ] reshape { shape: [ -1, 2, -1 ] } } ]"
                .to_owned(),
            "model input 'IN' has different number of variable-size dimensions for dims and reshape for m",
        ),
        (
            "m",
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ -1 ] reshape { shape: [ 4 ] } } ]"
                .to_owned(),
            "model input 'IN' has different size for dims and reshape for m",
        ),
        (
            "m",
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]"
                .to_owned(),
            "model input 'IN' cannot have empty reshape for non-batching model as scalar tensors are not supported for m",
        ),
        (
            "m",
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 4 ] }, { name: \"IN\" data_type: TYPE_INT8 dims: [ 1 ] } ]"
                .to_owned(),
            "model 'm' has more than one input named 'IN'",
        ),
        (
            "m",
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 4 ] format: FORMAT_NCHW } ]".to_owned(),
            "model input NHWC/NCHW require 3 dims for m",
        ),
        (
            "m",
            "input [ { name: \"IN\" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true } ]".to_owned(),
            "shape tensors are only supported for TensorRT platform for m",
        ),
        (
            "e",
            "platform: \"ensemble\" backend: \"python\"".to_owned(),
            "Ensemble model 'e' must have platform type 'ensemble' and empty backend type",
        ),
        (
            "e",
            "platform: \"ensemble\"".to_owned(),
            "ensemble scheduling must be set for ensemble e whose platform is ensemble",
        ),
        (
            "m",
            format!("ensemble_scheduling {{ step [ {{ model_name: \"a\" }} ] }} {io}"),
            "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
        ),
        (
            "e",
            "platform: \"ensemble\" instance_group [ { kind: KIND_CPU } ] ensemble_scheduling { step [ { model_name: \"a\" } ] }"
                .to_owned(),
            "instance group should not be specified for ensemble 'e'",
        ),
        (
            "e",
            "platform: \"ensemble\" ensemble_scheduling { step [ { model_name: \"a\" output_map { key: \"x\" value: \"y\" } } ] }"
                .to_owned(),
            "must specify 'input_map' in step 0 of ensemble 'e'",
        ),
    ];
    for (model, text, expected) in cases {
        let err = normalized(text, model).expect_err(text);
        assert!(err.to_string().contains(expected), "{text}\n got: {err}\nwant: {expected}");
    }
}

#[test]
fn valid_reshapes() {
    for (dims, reshape, max_batch_size) in [
        ("[ 2, 4, -1, 6 ]", "[ 8, -1, 1, 6 ]", 0),
        ("[ 1 ]", "[ ]", 8),
        ("[ 1, 1 ]", "[ ]", 8),
        ("[ 6 ]", "[ 2, 3 ]", 0),
        ("[ -1 ]", "[ -1, 1 ]", 0),
    ] {
        let text = format!(
            "max_batch_size: {max_batch_size} \
             input [ {{ name: \"IN\" data_type: TYPE_FP32 dims: {dims} reshape {{ shape: {reshape} }} }} ]"
        );
        normalized(&text, "m").unwrap_or_else(|e| panic!("{dims} -> {reshape}: {e}"));
    }
}

#[test]
fn device_kinds_follow_triton() {
    // (instance_group, GPUs on the machine) -> (kind, gpus) of each group, or an error.
    type Expected = Result<Vec<(Kind, Vec<i32>)>, &'static str>;
    let cases: &[(&str, &[i32], Expected)] = &[
        // No instance_group: CPU without GPUs, one instance per GPU with them (the Python
        // backend's preferred group is KIND_GPU in Triton's GPU builds).
        ("", &[], Ok(vec![(Kind::Cpu, vec![])])),
        ("", &[0, 1], Ok(vec![(Kind::Gpu, vec![0, 1])])),
        ("instance_group [ { kind: KIND_AUTO } ]", &[], Ok(vec![(Kind::Cpu, vec![])])),
        ("instance_group [ { kind: KIND_AUTO gpus: [ 1 ] } ]", &[0, 1], Ok(vec![(Kind::Gpu, vec![1])])),
        (
            "instance_group [ { kind: KIND_AUTO gpus: [ 3 ] } ]",
            &[0, 1],
            Err("instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
        ),
        ("instance_group [ { kind: KIND_GPU } ]", &[0, 2], Ok(vec![(Kind::Gpu, vec![0, 2])])),
        ("instance_group [ { kind: KIND_GPU gpus: [ 2 ] } ]", &[0, 2], Ok(vec![(Kind::Gpu, vec![2])])),
        // An explicit KIND_GPU never falls back to CPU.
        (
            "instance_group [ { kind: KIND_GPU } ]",
            &[],
            Err("instance group m_0 of model m has kind KIND_GPU but no GPUs are available"),
        ),
        (
            "instance_group [ { kind: KIND_GPU gpus: [ 0, 5 ] } ]",
            &[0, 1],
            Err("instance group m_0 of model m specifies invalid or unsupported gpu id 5. Available GPUs are: 0, 1"),
        ),
        ("instance_group [ { kind: KIND_CPU } ]", &[0], Ok(vec![(Kind::Cpu, vec![])])),
        (
            "instance_group [ { name: \"c\" kind: KIND_CPU gpus: [ 0 ] } ]",
            &[0],
            Err("instance group c of model m has kind KIND_CPU but specifies one or more GPUs"),
        ),
        ("instance_group [ { kind: KIND_MODEL } ]", &[0], Ok(vec![(Kind::Model, vec![])])),
        (
            "instance_group [ { kind: KIND_MODEL gpus: [ 0 ] } ]",
            &[0],
            Err("instance group m_0 of model m has kind KIND_MODEL but specifies one or more GPUs"),
        ),
        (
            "instance_group [ { kind: KIND_CPU profile: [ \"0\" ] } ]",
            &[],
            Err("specifies profile field which is only supported for TensorRT models"),
        ),
        (
            "instance_group [ { kind: KIND_CPU }, { kind: KIND_AUTO } ]",
            &[0],
            Ok(vec![(Kind::Cpu, vec![]), (Kind::Gpu, vec![0])]),
        ),
    ];
    for (groups, gpus, expected) in cases {
        let mut config = normalized(&format!("{groups} {IO}"), "m").expect(groups);
        let got = resolve_instance_groups(&mut config, gpus)
            .map(|()| config.instance_group.iter().map(|g| (g.kind(), g.gpus.clone())).collect::<Vec<_>>());
        match (got, expected) {
            (Ok(got), Ok(expected)) => assert_eq!(&got, expected, "{groups} on {gpus:?}"),
            (Err(err), Err(expected)) => {
                assert!(err.to_string().contains(expected), "{groups} on {gpus:?}: {err}")
            }
            (got, expected) => panic!("{groups} on {gpus:?}: got {got:?}, want {expected:?}"),
        }
    }
}

#[test]
fn resolve_refuses_a_config_without_groups() {
    let mut config = parse(IO);
    config.name = "m".into();
    let err = resolve_instance_groups(&mut config, &[]).expect_err("no groups");
    assert_eq!(err.to_string(), "must specify one or more 'instance group's for m");
}
