//! Random config overrides through the public load path (`Server::load_model_with_config`, what
//! a client's load request and `pb_utils.load_model(config=...)` reach): `model_warmup`,
//! `sequence_batching`, `instance_group` and `parameters` blocks with sizes from 0 to 2^63 and
//! paths in and out of the model directory. Whatever the override, the load answers (success or
//! a clear error), the process never aborts on an allocation, and no answer quotes a file outside
//! the model's directory. `PROPTEST_CASES` runs more cases (the default keeps `cargo test`
//! quick); stubs are `/bin/false`, so a config that passes every check fails at its first start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};
use tritium_host::StubCommand;
use tritium_server::{InstanceSettings, Server, ServerOptions};

/// What the secret file outside the repository holds; no answer may contain it.
const SECRET: &str = "root:x:0:0:fuzz-secret-line";

fn repository() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tritium-config-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let model = dir.join("repo/m");
    std::fs::create_dir_all(model.join("1")).expect("mkdir");
    std::fs::create_dir_all(model.join("warmup")).expect("mkdir");
    std::fs::write(model.join("1/model.py"), "").expect("model.py");
    std::fs::write(model.join("warmup/in.bin"), [1u8; 64]).expect("in.bin");
    std::fs::write(model.join("requirements.txt"), "numpy\n").expect("requirements");
    std::fs::write(dir.join("secret"), SECRET).expect("secret");
    std::os::unix::fs::symlink(dir.join("secret"), model.join("warmup/link")).expect("symlink");
    std::os::unix::fs::symlink(dir.join("secret"), model.join("link.txt")).expect("symlink");
    dir
}

fn server(dir: &Path) -> Server {
    Server::new(ServerOptions {
        repository: dir.join("repo"),
        stub: StubCommand { python: "/bin/false".into(), python_path: PathBuf::new(), env: Vec::new(), spin: 0 },
        instance_settings: InstanceSettings {
            init_timeout: Duration::from_secs(5),
            restart_limit: 0,
            backoff_initial: Duration::from_millis(1),
            ..InstanceSettings::default()
        },
        auto_complete: false,
        strict_readiness: true,
        explicit_control: true,
        max_queue_size: 0,
        server_id: "fuzz".into(),
        load_threads: 2,
        load_retries: 0,
        backend_directory: dir.join("backends"),
        envs: tritium_server::EnvOptions { cache_dir: dir.join("cache"), ..Default::default() },
        config_name: None,
        metrics: Default::default(),
        gpus: Vec::new(),
        paths: Default::default(),
        limits: Default::default(),
        rate_limiter: None,
    })
}

fn size() -> impl Strategy<Value = i64> {
    prop_oneof![4 => 0i64..6, 1 => Just(-1i64), 1 => Just(35_184_372_088_832i64), 1 => Just(1i64 << 32), 1 => Just(i64::MAX), 1 => any::<i64>()]
}

fn count() -> impl Strategy<Value = i64> {
    prop_oneof![4 => 0i64..3, 1 => Just(i64::from(i32::MAX)), 1 => any::<i32>().prop_map(i64::from), 1 => Just(u32::MAX.into())]
}

fn path() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "in.bin",
        "link",
        "link.txt",
        "requirements.txt",
        "../requirements.txt",
        "../../secret",
        "../../../secret",
        "/etc/passwd",
        "/dev/zero",
        "/proc/self/environ",
        "$$TRITON_MODEL_DIRECTORY/../../secret",
        "",
        ".",
        "a/b/../../in.bin",
    ])
    .prop_map(str::to_string)
}

fn dtype() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "TYPE_FP32",
        "TYPE_STRING",
        "TYPE_UINT8",
        "TYPE_BOOL",
        "TYPE_FP64",
        "TYPE_BF16",
        "TYPE_INVALID",
    ])
}

fn warmup_input() -> impl Strategy<Value = Value> {
    let data = prop_oneof![
        Just(json!({"zero_data": true})),
        Just(json!({"random_data": true})),
        path().prop_map(|p| json!({ "input_data_file": p })),
    ];
    (dtype(), prop::collection::vec(size(), 0..4), data).prop_map(|(t, dims, data)| {
        let mut input = json!({"data_type": t, "dims": dims});
        if let (Some(i), Some(d)) = (input.as_object_mut(), data.as_object()) {
            i.extend(d.clone());
        }
        input
    })
}

fn warmup() -> impl Strategy<Value = Value> {
    let sample = (prop::sample::select(vec!["X", "NOPE"]), warmup_input(), count(), 0u32..3).prop_map(
        |(name, input, batch, count)| {
            json!({"name": "s", "batch_size": batch.clamp(0, i64::from(u32::MAX)), "count": count, "inputs": {name: input}})
        },
    );
    prop::collection::vec(sample, 0..3).prop_map(Value::from)
}

fn sequence_batching() -> impl Strategy<Value = Option<Value>> {
    let strategy = prop_oneof![
        Just(json!({})),
        Just(json!({"direct": {}})),
        count().prop_map(|n| json!({"oldest": {"max_candidate_sequences": n.clamp(i32::MIN.into(), i32::MAX.into())}})),
    ];
    prop::option::of((strategy, any::<u32>()).prop_map(|(mut s, idle)| {
        if let Some(o) = s.as_object_mut() {
            o.insert("max_sequence_idle_microseconds".into(), json!(idle));
        }
        s
    }))
}

fn parameters() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(vec!["requirements", "EXECUTION_ENV_PATH", "other"]), path()), 0..3)
        .prop_map(|pairs| {
            let map: serde_json::Map<String, Value> =
                pairs.into_iter().map(|(k, v)| (k.to_string(), json!({ "string_value": v }))).collect();
            Value::Object(map)
        })
}

fn config() -> impl Strategy<Value = String> {
    (warmup(), sequence_batching(), count(), count(), parameters(), prop::option::of(path())).prop_map(
        |(warmup, sequence, max_batch, instances, parameters, label)| {
            let mut output = json!({"name": "Y", "data_type": "TYPE_FP32", "dims": [1]});
            if let (Some(o), Some(label)) = (output.as_object_mut(), label) {
                o.insert("label_filename".into(), json!(label));
            }
            let mut c = json!({
                "name": "m",
                "backend": "python",
                "max_batch_size": max_batch.clamp(0, i32::MAX.into()),
                "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
                "output": [output],
                "instance_group": [{"kind": "KIND_CPU", "count": instances.clamp(i32::MIN.into(), i32::MAX.into())}],
                "model_warmup": warmup,
                "parameters": parameters,
            });
            if let (Some(o), Some(s)) = (c.as_object_mut(), sequence) {
                o.insert("sequence_batching".into(), s);
            }
            c.to_string()
        },
    )
}

#[test]
fn random_config_overrides_never_abort_the_server_nor_leak_files() {
    let dir = repository();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let server = server(&dir);
    let cases = ProptestConfig { failure_persistence: None, ..ProptestConfig::default() };
    proptest!(cases, |(json in config())| {
        let answer = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), server.load_model_with_config("m", &json)).await
        });
        let answer = answer.map_err(|_| TestCaseError::fail(format!("no answer within 60 s to {json}")))?;
        if let Err(e) = answer {
            prop_assert!(!e.message.contains("fuzz-secret-line"), "{} quotes the secret file", e.message);
        }
    });
    runtime.block_on(server.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}
