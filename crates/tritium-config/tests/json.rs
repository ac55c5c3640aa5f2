//! Triton's JSON form of a model configuration.

use std::path::Path;

use serde_json::json;
use tritium_config::proto::{model_config::SchedulingChoice, DataType};
use tritium_config::{
    from_json, load_config, normalize, parse_config, resolve_instance_groups, to_json, ConfigError, ModelConfig,
};

mod common;
use common::FIXTURES;

fn fixture(name: &str) -> ModelConfig {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    match load_config(&dir) {
        Ok(Some(config)) => config,
        other => panic!("fixture {name}: {other:?}"),
    }
}

/// add_sub as Triton completes it on a machine without GPUs, and the JSON Triton prints for
/// it: every field without presence, enums by name, 64-bit integers as numbers, unset messages
/// (reshape, model_transaction_policy, ...) left out.
#[test]
fn add_sub_prints_as_triton_prints_it() {
    let mut config = fixture("add_sub");
    normalize(&mut config, "add_sub").expect("valid");
    resolve_instance_groups(&mut config, &[]).expect("valid");
    let input = |name: &str| {
        json!({
            "name": name, "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [4],
            "is_shape_tensor": false, "allow_ragged_batch": false, "optional": false,
            "is_non_linear_format_io": false
        })
    };
    let output = |name: &str| {
        json!({
            "name": name, "data_type": "TYPE_FP32", "dims": [4], "label_filename": "",
            "is_shape_tensor": false, "is_non_linear_format_io": false
        })
    };
    let expected = json!({
        "name": "add_sub",
        "platform": "",
        "backend": "python",
        "runtime": "",
        "version_policy": { "latest": { "num_versions": 1 } },
        "max_batch_size": 0,
        "input": [input("INPUT0"), input("INPUT1")],
        "output": [output("OUTPUT0"), output("OUTPUT1")],
        "batch_input": [],
        "batch_output": [],
        "optimization": {
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": { "enable": true },
            "output_pinned_memory": { "enable": true },
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": false
        },
        "instance_group": [{
            "name": "add_sub_0", "kind": "KIND_CPU", "count": 1, "gpus": [],
            "secondary_devices": [], "profile": [], "passive": false, "host_policy": ""
        }],
        "default_model_filename": "model.py",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": []
    });
    assert_eq!(to_json(&config), expected);
}

#[test]
fn sixty_four_bit_integers_are_numbers_and_maps_are_objects() {
    let config = parse_config(
        r#"
        max_batch_size: 8
        input [ { name: "X" data_type: TYPE_INT64 dims: [ -1, 9007199254740993 ] } ]
        version_policy { specific { versions: [ 1, 3 ] } }
        dynamic_batching {
          max_queue_delay_microseconds: 18446744073709551615
          priority_levels: 2
          default_priority_level: 1
          priority_queue_policy { key: 2 value: { default_timeout_microseconds: 10 } }
        }
        parameters { key: "k" value: { string_value: "v" } }
        "#,
        Path::new("c"),
    )
    .expect("parses");
    let json = to_json(&config);
    assert_eq!(json["input"][0]["dims"], json!([-1, 9_007_199_254_740_993_i64]));
    assert_eq!(json["version_policy"], json!({ "specific": { "versions": [1, 3] } }));
    let batching = &json["dynamic_batching"];
    assert_eq!(batching["max_queue_delay_microseconds"], json!(u64::MAX));
    assert_eq!(batching["priority_levels"], json!(2));
    assert_eq!(batching["preferred_batch_size"], json!([]));
    // JSON object keys are strings, also for map<uint64, ...>.
    assert_eq!(batching["priority_queue_policy"]["2"]["default_timeout_microseconds"], json!(10));
    assert_eq!(json["parameters"], json!({ "k": { "string_value": "v" } }));
    // Unset oneof members and messages are left out.
    assert!(json.get("sequence_batching").is_none());
    assert!(json.get("ensemble_scheduling").is_none());
    assert!(json.get("model_transaction_policy").is_none());
    assert!(json["input"][0].get("reshape").is_none());
}

#[test]
fn every_fixture_round_trips_through_json() {
    for &name in FIXTURES {
        let config = fixture(name);
        let back = from_json(&to_json(&config)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, config, "{name}");
    }
}

/// What a model's auto_complete_config hands back: only some fields, 64-bit integers possibly
/// as strings, camelCase names accepted as protobuf's JSON mapping allows.
#[test]
fn from_json_reads_auto_complete_output() {
    let config = from_json(&json!({
        "max_batch_size": 4,
        "input": [{ "name": "IN", "data_type": "TYPE_FP32", "dims": ["-1", 3] }],
        "output": [{ "name": "OUT", "dataType": "TYPE_INT8", "dims": [3] }],
        "dynamic_batching": { "preferred_batch_size": [2, 4], "max_queue_delay_microseconds": "500" },
        "model_transaction_policy": { "decoupled": true }
    }))
    .expect("valid");
    assert_eq!(config.max_batch_size, 4);
    assert_eq!(config.input[0].dims, [-1, 3]);
    assert_eq!(config.input[0].data_type(), DataType::TypeFp32);
    assert_eq!(config.output[0].data_type(), DataType::TypeInt8);
    assert!(matches!(
        config.scheduling_choice,
        Some(SchedulingChoice::DynamicBatching(ref b))
            if b.preferred_batch_size == [2, 4] && b.max_queue_delay_microseconds == 500
    ));
    assert_eq!(config.model_transaction_policy.map(|p| p.decoupled), Some(true));
}

#[test]
fn from_json_refuses_what_triton_refuses() {
    for (json, reason) in [
        (json!({ "max_batch_size": 1, "bogus": true }), "bogus"),
        (json!({ "input": [{ "name": "X", "data_type": "FP32" }] }), "input[0].data_type: "),
        (json!({ "max_batch_size": "eight" }), "max_batch_size: "),
        (json!({ "input": { "name": "X" } }), "input"),
        (json!([1, 2]), ""),
    ] {
        let err = from_json(&json).expect_err(&json.to_string());
        assert!(matches!(err, ConfigError::Json(_)), "{err:?}");
        assert!(err.to_string().contains(reason), "{json}: {err}");
    }
}

#[test]
fn from_json_errors_say_where() {
    let err =
        from_json(&json!({ "output": [{ "name": "A" }, { "name": "B", "dims": [1, "x"] }] })).expect_err("bad dims");
    assert!(err.to_string().starts_with("invalid JSON model configuration: output[1].dims[1]: "), "{err}");
}
