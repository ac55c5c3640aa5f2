//! config.pbtxt parsing: realistic Triton configs (tests/fixtures) and parse errors.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use tritium_config::proto::{
    model_config::SchedulingChoice,
    model_ensembling::Step,
    model_input::Format,
    model_instance_group::Kind,
    model_queue_policy::TimeoutAction,
    model_sequence_batching::{control, StrategyChoice},
    model_version_policy::{Latest, PolicyChoice, Specific},
    model_warmup::input::InputDataType,
    DataType, ModelInput, ModelOutput, ModelParameter, ModelTensorReshape,
};
use tritium_config::{load_config, parse_config, ConfigError, ModelConfig};

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn fixture(name: &str) -> ModelConfig {
    match load_config(&fixture_dir(name)) {
        Ok(Some(config)) => config,
        other => panic!("fixture {name}: {other:?}"),
    }
}

fn input(name: &str, data_type: DataType, dims: &[i64]) -> ModelInput {
    ModelInput { name: name.into(), data_type: data_type as i32, dims: dims.to_vec(), ..Default::default() }
}

fn output(name: &str, data_type: DataType, dims: &[i64]) -> ModelOutput {
    ModelOutput { name: name.into(), data_type: data_type as i32, dims: dims.to_vec(), ..Default::default() }
}

#[test]
fn add_sub_lists_of_messages_without_colon() {
    let config = fixture("add_sub");
    assert_eq!(config.name, "add_sub");
    assert_eq!(config.backend, "python");
    assert_eq!(config.input, [input("INPUT0", DataType::TypeFp32, &[4]), input("INPUT1", DataType::TypeFp32, &[4]),]);
    assert_eq!(
        config.output,
        [output("OUTPUT0", DataType::TypeFp32, &[4]), output("OUTPUT1", DataType::TypeFp32, &[4]),]
    );
    assert_eq!(config.instance_group.len(), 1);
    assert_eq!(config.instance_group[0].kind(), Kind::Cpu);
    assert_eq!(config.version_policy, None, "nothing is defaulted while parsing");
}

#[test]
fn batched_gpu_dynamic_batching_and_instance_groups() {
    let config = fixture("batched_gpu");
    assert_eq!(config.max_batch_size, 8);
    assert_eq!(config.input[0].format(), Format::Nhwc);
    assert_eq!(config.input[0].dims, [224, 224, 3]);
    assert_eq!(config.input[1].data_type(), DataType::TypeString);
    assert_eq!(config.input[1].dims, [-1]);
    assert!(config.input[1].allow_ragged_batch);
    assert_eq!(config.input[2].reshape, Some(ModelTensorReshape { shape: vec![] }));
    assert!(config.input[2].optional);
    assert_eq!(config.output[0].label_filename, "labels.txt");
    assert_eq!(config.output[0].data_type(), DataType::TypeFp16);

    let Some(SchedulingChoice::DynamicBatching(batching)) = &config.scheduling_choice else {
        panic!("dynamic_batching expected: {:?}", config.scheduling_choice);
    };
    assert_eq!(batching.preferred_batch_size, [4, 8]);
    assert_eq!(batching.max_queue_delay_microseconds, 100);
    let policy = batching.default_queue_policy.as_ref().expect("queue policy");
    assert_eq!(policy.timeout_action(), TimeoutAction::Delay);
    assert_eq!(policy.default_timeout_microseconds, 5_000_000);
    assert_eq!(policy.max_queue_size, 64);

    let groups = &config.instance_group;
    assert_eq!(groups.len(), 2);
    assert_eq!(
        (groups[0].name.as_str(), groups[0].kind(), groups[0].count, groups[0].gpus.as_slice()),
        ("", Kind::Gpu, 2, &[0, 1][..])
    );
    assert_eq!((groups[1].name.as_str(), groups[1].kind(), groups[1].count), ("spare", Kind::Cpu, 1));
    let optimization = config.optimization.as_ref().expect("optimization");
    assert_eq!(optimization.input_pinned_memory.map(|m| m.enable), Some(false));
    assert_eq!(optimization.output_pinned_memory, None);
}

#[test]
fn decoupled_parameters_in_every_spelling() {
    let config = fixture("decoupled_streaming");
    assert_eq!(config.name, "", "no name in the file");
    assert_eq!(config.default_model_filename, "streamer.py");
    assert_eq!(config.model_transaction_policy.map(|p| p.decoupled), Some(true));
    assert_eq!(config.input[1], {
        let mut max_tokens = input("MAX_TOKENS", DataType::TypeInt32, &[1]);
        max_tokens.optional = true;
        max_tokens
    });
    assert_eq!(config.output, [output("TOKEN", DataType::TypeString, &[-1])]);
    let expected: HashMap<String, ModelParameter> = [
        ("EXECUTION_ENV_PATH", "$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
        ("temperature", "0.7"),
        ("top_k", "40"),
        ("top_p", "0.9"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ModelParameter { string_value: v.to_owned() }))
    .collect();
    assert_eq!(config.parameters, expected);
    assert_eq!(
        config.version_policy.and_then(|p| p.policy_choice),
        Some(PolicyChoice::Latest(Latest { num_versions: 2 }))
    );
    assert_eq!(config.response_cache.map(|c| c.enable), Some(false));
}

#[test]
fn specific_versions_reshape_and_warmup() {
    let config = fixture("specific_versions");
    assert_eq!(
        config.version_policy.and_then(|p| p.policy_choice),
        Some(PolicyChoice::Specific(Specific { versions: vec![1, 3] }))
    );
    assert_eq!(config.input[0].dims, [-1, 2]);
    assert_eq!(config.input[0].reshape, Some(ModelTensorReshape { shape: vec![-1, 1, 2] }));
    assert!(matches!(
        &config.scheduling_choice,
        Some(SchedulingChoice::DynamicBatching(b)) if b.preferred_batch_size.is_empty()
    ));
    let warmup = &config.model_warmup[0];
    assert_eq!((warmup.name.as_str(), warmup.batch_size), ("zeros", 4));
    let x = &warmup.inputs["X"];
    assert_eq!(x.dims, [3, 2]);
    assert_eq!(x.input_data_type, Some(InputDataType::ZeroData(true)));
}

#[test]
fn ensemble_steps_with_map_fields() {
    let config = fixture("ensemble");
    assert_eq!(config.platform, "ensemble");
    let Some(SchedulingChoice::EnsembleScheduling(ensemble)) = &config.scheduling_choice else {
        panic!("ensemble_scheduling expected");
    };
    let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect()
    };
    let expected = [
        Step {
            model_name: "tokenizer".into(),
            model_version: -1,
            input_map: map(&[("RAW", "TEXT")]),
            output_map: map(&[("IDS", "ids"), ("MASK", "mask")]),
            model_namespace: String::new(),
        },
        Step {
            model_name: "classifier".into(),
            model_version: 2,
            input_map: map(&[("INPUT_IDS", "ids"), ("ATTENTION_MASK", "mask")]),
            output_map: map(&[("LOGITS", "logits")]),
            model_namespace: String::new(),
        },
        Step {
            model_name: "detokenizer".into(),
            model_version: -1,
            input_map: map(&[("LOGITS", "logits")]),
            output_map: map(&[("LABEL", "LABEL")]),
            model_namespace: String::new(),
        },
    ];
    assert_eq!(ensemble.step, expected);
}

#[test]
fn sequence_batching_controls_and_state() {
    let config = fixture("sequence_bls");
    let Some(SchedulingChoice::SequenceBatching(batching)) = &config.scheduling_choice else {
        panic!("sequence_batching expected");
    };
    assert!(matches!(
        batching.strategy_choice,
        Some(StrategyChoice::Oldest(ref o)) if o.max_candidate_sequences == 4
    ));
    let start = &batching.control_input[0];
    assert_eq!(start.name, "START");
    assert_eq!(start.control[0].kind(), control::Kind::ControlSequenceStart);
    assert_eq!(start.control[0].fp32_false_true, [0.0, 1.0]);
    let corrid = &batching.control_input[1].control[0];
    assert_eq!(corrid.kind(), control::Kind::ControlSequenceCorrid);
    assert_eq!(corrid.data_type(), DataType::TypeUint64);
    let state = &batching.state[0];
    assert_eq!((state.input_name.as_str(), state.output_name.as_str()), ("STATE_IN", "STATE_OUT"));
    assert_eq!(state.initial_state[0].name, "zeros");
}

#[test]
fn priority_queue_policies_rate_limiter_and_angle_brackets() {
    let config = fixture("priority_batching");
    let Some(SchedulingChoice::DynamicBatching(batching)) = &config.scheduling_choice else {
        panic!("dynamic_batching expected: {:?}", config.scheduling_choice);
    };
    assert_eq!(batching.preferred_batch_size, [8, 16, 32]);
    assert_eq!((batching.priority_levels, batching.default_priority_level), (3, 2));
    assert_eq!(batching.default_queue_policy.as_ref().map(|p| p.max_queue_size), Some(128));
    let mut levels: Vec<u64> = batching.priority_queue_policy.keys().copied().collect();
    levels.sort_unstable();
    assert_eq!(levels, [1, 3]);
    let first = &batching.priority_queue_policy[&1];
    assert_eq!(
        (
            first.timeout_action(),
            first.default_timeout_microseconds,
            first.allow_timeout_override,
            first.max_queue_size
        ),
        (TimeoutAction::Reject, 100_000, true, 16)
    );
    let third = &batching.priority_queue_policy[&3];
    assert_eq!((third.timeout_action(), third.default_timeout_microseconds), (TimeoutAction::Delay, 10_000_000));

    let groups = &config.instance_group;
    assert_eq!(groups.len(), 2);
    assert_eq!((groups[0].name.as_str(), groups[0].count, groups[0].kind()), ("embed_gpu", 2, Kind::Gpu));
    let limiter = groups[0].rate_limiter.as_ref().expect("rate_limiter");
    let resources: Vec<(&str, bool, u32)> =
        limiter.resources.iter().map(|r| (r.name.as_str(), r.global, r.count)).collect();
    assert_eq!(resources, [("R1", false, 4), ("SHARED", true, 1)]);
    assert_eq!(limiter.priority, 2);
    assert_eq!((groups[1].count, groups[1].kind()), (1, Kind::Cpu));

    assert_eq!(config.parameters["pooling"].string_value, "mean");
    assert_eq!(config.parameters["prefix"].string_value, "query: [ {", "strings are left as written");
}

#[test]
fn ensemble_pipeline_with_map_lists() {
    let config = fixture("ensemble_pipeline");
    assert_eq!(config.output.len(), 2);
    let Some(SchedulingChoice::EnsembleScheduling(ensemble)) = &config.scheduling_choice else {
        panic!("ensemble_scheduling expected");
    };
    let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect()
    };
    let step = |model_name: &str, model_version: i64, input_map, output_map| Step {
        model_name: model_name.into(),
        model_version,
        input_map,
        output_map,
        model_namespace: String::new(),
    };
    let expected = [
        step(
            "preprocess",
            -1,
            map(&[("RAW", "IMAGE_BYTES")]),
            map(&[("PIXELS", "preprocessed_image"), ("SIZE", "original_size")]),
        ),
        step("resnet50", 1, map(&[("input", "preprocessed_image")]), map(&[("logits", "logits")])),
        step(
            "postprocess",
            -1,
            map(&[("LOGITS", "logits"), ("SIZE", "original_size")]),
            map(&[("LABEL", "CLASS"), ("PROBS", "SCORES")]),
        ),
    ];
    assert_eq!(ensemble.step, expected);
}

#[test]
fn warmup_inputs_as_map_lists_and_entries() {
    let config = fixture("warmup_inputs");
    assert_eq!(config.input.len(), 2);
    assert_eq!(config.input[0].dims, [3, 640, 640]);
    assert_eq!(config.instance_group.len(), 1);
    let [zeros, random] = config.model_warmup.as_slice() else {
        panic!("two warmups expected: {:?}", config.model_warmup);
    };
    assert_eq!((zeros.name.as_str(), zeros.batch_size, zeros.inputs.len()), ("zeros", 1, 2));
    assert_eq!(zeros.inputs["IMAGE"].dims, [3, 640, 640]);
    assert_eq!(zeros.inputs["SCALE"].input_data_type, Some(InputDataType::ZeroData(true)));
    assert_eq!((random.name.as_str(), random.batch_size, random.count), ("random", 4, 2));
    assert_eq!(random.inputs["IMAGE"].input_data_type, Some(InputDataType::RandomData(true)));
    assert_eq!(
        random.inputs["SCALE"].input_data_type,
        Some(InputDataType::InputDataFile("scale [ {1} ].bin".to_owned()))
    );
}

#[test]
fn empty_lists_without_colon() {
    let config = parse_config("input [ ]\ninstance_group [\n  # none yet\n]\n", Path::new("c")).expect("parses");
    assert!(config.input.is_empty() && config.instance_group.is_empty());
}

#[test]
fn missing_config_is_none_and_unreadable_config_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(matches!(load_config(dir.path()), Ok(None)));

    // A directory where the file should be: reading it fails with something else than
    // NotFound, which must be reported, not mistaken for "no config".
    std::fs::create_dir(dir.path().join("config.pbtxt")).expect("mkdir");
    let err = load_config(dir.path()).expect_err("a directory is not a config");
    assert!(matches!(err, ConfigError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("config.pbtxt"), "{err}");
}

#[test]
fn an_empty_config_parses_to_defaults() {
    let config = parse_config("# nothing but a comment\n", Path::new("c")).expect("parses");
    assert_eq!(config, ModelConfig::default());
}

#[test]
fn model_metrics_from_guides_is_refused_naming_the_field_line_and_the_supported_ways() {
    let file = Path::new("/repo/m/config.pbtxt");
    let text = "name: \"m\"\nbackend: \"python\"\nmodel_metrics {\n  enable: true\n  counters [ \"requests\" ]\n  gauges [ \"load\" ]\n}\n";
    let err = parse_config(text, file).expect_err("not Triton syntax");
    let ConfigError::Parse { line, column, message, .. } = &err else { panic!("not a parse error: {err:?}") };
    assert_eq!((*line, *column), (4, 3), "{err}");
    assert!(message.starts_with("field 'enable' not found for message 'inference.ModelMetrics': "), "{message}");
    for needle in ["pb_utils.MetricFamily", "prometheus_client", "Remove the model_metrics block"] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    assert!(err.to_string().starts_with("/repo/m/config.pbtxt:4:3: field 'enable'"), "{err}");
    // Whichever field comes first is the one named.
    let err = parse_config("model_metrics { counters [ \"a\" ] }", file).expect_err("counters");
    assert!(err.to_string().contains("field 'counters' not found for message 'inference.ModelMetrics': "), "{err}");
    // Triton's own model_metrics still parses.
    let ok = "model_metrics { metric_control [ { metric_identifier { family: \"nv_inference_first_response_histogram_ms\" } histogram_options { buckets: [ 1, 10 ] } } ] }";
    parse_config(ok, file).expect("Triton's model_metrics");
    // Other unknown fields keep prost-reflect's text alone.
    let err = parse_config("bogus: 1", file).expect_err("bogus");
    assert!(!err.to_string().contains("prometheus_client"), "{err}");
}

#[test]
fn parse_errors_name_file_line_column_and_reason() {
    let file = Path::new("/repo/m/config.pbtxt");
    let cases = [
        // (text, line, column, reason)
        (
            "name: \"m\"\nmax_batch_size: 8\n  bogus: 1\n",
            3,
            3,
            "field 'bogus' not found for message 'inference.ModelConfig'",
        ),
        // A scalar list still needs its colon, as in protobuf's own parser.
        ("input [\n  {\n    name: \"x\"\n    dims [ 4 ]\n  }\n]\n", 4, 10, "expected ':' or a message value, but found '['"),
        // Errors after one or more colon-less lists on the same line are where the user wrote them.
        (
            "input [ { name: \"x\" } ] output [ { name: \"y\" bogus: 1 } ]",
            1,
            46,
            "field 'bogus' not found for message 'inference.ModelOutput'",
        ),
        (
            "sequence_batching { control_input [ { name: \"S\" control [ { kind: BAD } ] } ] }",
            1,
            67,
            "value 'BAD' was not found for enum",
        ),
        (
            "input [\n  { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] }\n]\noutput [ { name: \"y\" data_type: FP64 } ]",
            4,
            33,
            "value 'FP64' was not found for enum 'inference.DataType'",
        ),
        (
            "input [ { name: \"x\" } ]  # input [ {\ninstance_group [ { kind: KIND_GPU count: 1.5 } ]",
            2,
            42,
            "expected an integer, but found '1.5'",
        ),
        (
            "input [ { name: \"x\" data_type: FP32 } ]",
            1,
            32,
            "value 'FP32' was not found for enum 'inference.DataType'",
        ),
        ("max_batch_size: 8\nmax_batch_size: 4\n", 2, 17, "'max_batch_size' is already set"),
        ("max_batch_size: -1.5", 1, 18, "expected an integer, but found '1.5'"),
        // Unterminated: reported at the end of the input.
        ("input [ {\n  name: \"x\"\n", 3, 1, "expected"),
        ("name: \"é\" é", 1, 11, "invalid token"),
    ];
    for (text, line, column, reason) in cases {
        let err = parse_config(text, file).expect_err(text);
        let ConfigError::Parse { path, line: l, column: c, message } = &err else {
            panic!("{text:?}: not a parse error: {err:?}");
        };
        assert_eq!((path.as_path(), *l, *c), (file, line, column), "{text:?}: {err}");
        assert!(message.contains(reason), "{text:?}: {message}");
        assert!(err.to_string().starts_with(&format!("/repo/m/config.pbtxt:{line}:{column}: ")), "{err}");
    }
}
