//! Real stub processes driven through the IPC crate alone: dtypes, strings, in-place writes,
//! errors with tracebacks, logging, and Triton's `initialize` arguments.

mod common;

use std::time::Duration;

use common::*;
use tritium_host::{HostError, StubExit};
use tritium_ipc::DataType;

const IDENTITY: &str = r#"
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outs = [pb_utils.Tensor("OUT_" + t.name(), t.as_numpy()) for t in request.inputs()]
            responses.append(pb_utils.InferenceResponse(output_tensors=outs))
        return responses
"#;

fn sample_bytes(dtype: DataType, n: usize) -> Vec<u8> {
    let size = dtype.element_size().expect("fixed size");
    (0..n * size)
        .map(|i| match dtype {
            // numpy bools must be 0 or 1.
            DataType::Bool => (i % 3 == 0) as u8,
            _ => (i * 37 + 11) as u8,
        })
        .collect()
}

#[test]
fn every_fixed_size_dtype_round_trips_through_numpy() {
    let model = Model::new("identity", IDENTITY);
    let stub = model.start();
    for (i, dtype) in DataType::ALL.into_iter().enumerate() {
        if matches!(dtype, DataType::Bytes | DataType::Bf16) {
            continue;
        }
        let bytes = sample_bytes(dtype, 6);
        let req = request(i as u64, vec![input(&stub, "IN", dtype, &[2, 3], &bytes, true)]);
        let outs = run_one(&stub, req).unwrap_or_else(|e| panic!("{dtype:?}: {e}"));
        assert_eq!(outs, vec![("OUT_IN".to_string(), dtype, vec![2, 3], bytes)], "{dtype:?}");
    }
    assert_eq!(stub.channel().live_blocks(), 0, "every input block was released by the stub");
}

#[test]
fn bytes_tensors_keep_empty_variable_and_non_ascii_elements() {
    let model = Model::new(
        "strings",
        r#"
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            s = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()
            assert s.dtype == np.object_, s.dtype
            rev = np.array([x[::-1] for x in s.flat], dtype=np.object_).reshape(s.shape)
            lens = np.array([len(x) for x in s.flat], dtype=np.int32).reshape(s.shape)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("REV", rev), pb_utils.Tensor("LEN", lens)]))
        return out
"#,
    );
    let stub = model.start();
    let items: [&[u8]; 4] = [b"", b"hello", "grüße, 世界".as_bytes(), &[0u8, 255, 7]];
    let req = request(1, vec![input(&stub, "TEXT", DataType::Bytes, &[2, 2], &serialize_bytes(&items), false)]);
    let outs = run_one(&stub, req).expect("run");
    let reversed: Vec<Vec<u8>> = items.iter().map(|i| i.iter().rev().copied().collect()).collect();
    let reversed: Vec<&[u8]> = reversed.iter().map(Vec::as_slice).collect();
    assert_eq!(outs[0], ("REV".into(), DataType::Bytes, vec![2, 2], serialize_bytes(&reversed)));
    let lens: Vec<u8> = items.iter().flat_map(|i| (i.len() as i32).to_le_bytes()).collect();
    assert_eq!(outs[1], ("LEN".into(), DataType::Int32, vec![2, 2], lens));
}

#[test]
fn outputs_may_be_views_transposes_and_scalars() {
    let model = Model::new(
        "shapes",
        r#"
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = r.inputs()[0].as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("T", x.T),
                pb_utils.Tensor("COL", x[:, 1]),
                pb_utils.Tensor("SUM", np.array(x.sum(), dtype=np.float32)),
                pb_utils.Tensor("EMPTY", np.zeros((0, 3), dtype=np.float32)),
            ]))
        return out
"#,
    );
    let stub = model.start();
    let x: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let outs =
        run_one(&stub, request(1, vec![input(&stub, "X", DataType::Fp32, &[2, 3], &bytes, false)])).expect("run");
    let f32s = |b: &[u8]| b.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>();
    assert_eq!((outs[0].2.clone(), f32s(&outs[0].3)), (vec![3, 2], vec![0., 3., 1., 4., 2., 5.]));
    assert_eq!((outs[1].2.clone(), f32s(&outs[1].3)), (vec![2], vec![1., 4.]));
    assert_eq!((outs[2].2.clone(), f32s(&outs[2].3)), (vec![], vec![15.]));
    assert_eq!((outs[3].2.clone(), outs[3].3.len()), (vec![0, 3], 0));
}

#[test]
fn private_inputs_are_writable_in_place_and_shared_ones_are_not() {
    let model = Model::new(
        "inplace",
        r#"
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            img = r.inputs()[0].as_numpy()
            img /= 2.0
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", img)]))
        return out
"#,
    );
    let stub = model.start();
    let bytes: Vec<u8> = [4.0f32, 8.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let outs =
        run_one(&stub, request(1, vec![input(&stub, "IMG", DataType::Fp32, &[2], &bytes, true)])).expect("writable");
    let halved: Vec<u8> = [2.0f32, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(outs[0].3, halved);
    let err = run_one(&stub, request(2, vec![input(&stub, "IMG", DataType::Fp32, &[2], &bytes, false)]))
        .expect_err("read-only");
    assert!(err.contains("read-only"), "{err}");
    assert!(err.contains("Failed to process the request(s) for model 'inplace_0_0'"), "{err}");
}

#[test]
fn initialize_gets_tritons_args() {
    let model = Model::new(
        "args",
        r#"
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args
    def execute(self, requests):
        blob = json.dumps(self.args, sort_keys=True).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", np.array([blob], dtype=np.object_))]) for _ in requests]
"#,
    );
    let stub = model.start();
    let outs = run_one(&stub, request(1, vec![])).expect("run");
    let text = String::from_utf8_lossy(&outs[0].3[4..]).to_string();
    for key in [
        "\"model_config\"",
        "\"model_instance_kind\": \"CPU\"",
        "\"model_instance_name\": \"args_0_0\"",
        "\"model_instance_device_id\": \"0\"",
        "\"model_version\": \"1\"",
        "\"model_name\": \"args\"",
    ] {
        assert!(text.contains(key), "{key} missing from {text}");
    }
    let repo = model.dir.path().join("args").display().to_string();
    assert!(text.contains(&format!("\"model_repository\": \"{repo}\"")), "{text}");
}

#[test]
fn execute_exception_carries_the_traceback() {
    let model = Model::new(
        "raises",
        r#"
class TritonPythonModel:
    def execute(self, requests):
        return self.helper()
    def helper(self):
        return 1 / 0
"#,
    );
    let stub = model.start();
    let err = run_one(&stub, request(1, vec![])).expect_err("must fail");
    assert!(
        err.contains(
            "Failed to process the request(s) for model 'raises_0_0', message: ZeroDivisionError: division by zero"
        ),
        "{err}"
    );
    assert!(err.contains("model.py(6): helper"), "{err}");
    // The stub survives and serves the next batch.
    assert!(run_one(&stub, request(2, vec![])).is_err());
    // A failed batch's inputs are released by the time it ends, as a good one's are (neither a
    // variable of the stub's nor the exception's frames keep them).
    let bytes = sample_bytes(DataType::Fp32, 4);
    let req = request(3, vec![input(&stub, "IN", DataType::Fp32, &[4], &bytes, true)]);
    assert!(run_one(&stub, req).is_err());
    assert_eq!(stub.channel().live_blocks(), 0, "the failed batch's input block was released by the stub");
}

#[test]
fn wrong_responses_are_clear_errors() {
    let cases = [
        ("return []", "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0"),
        (
            "return ['x']",
            "Expected an 'InferenceResponse' object in the execute function return list, found type '<class 'str'>'",
        ),
        ("return (1,)", "Expected a list in the execute return, found type '<class 'tuple'>'"),
    ];
    for (body, expected) in cases {
        let model = Model::new(
            "wrong",
            &format!("class TritonPythonModel:\n    def execute(self, requests):\n        {body}\n"),
        );
        let stub = model.start();
        let err = run_one(&stub, request(1, vec![])).expect_err(body);
        assert!(err.contains(expected), "{body}: {err}");
    }
}

#[test]
fn error_responses_keep_their_code_and_other_requests_succeed() {
    let model = Model::new(
        "partial",
        r#"
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            if r.request_id() == "req-2":
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("no good", pb_utils.TritonError.INVALID_ARG)))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([1], dtype=np.int8))]))
        return out
"#,
    );
    let stub = model.start();
    let done = stub
        .execute(vec![request(1, vec![]), request(2, vec![]), request(3, vec![])], Some(Duration::from_secs(30)))
        .expect("execute");
    assert!(done.error.is_none());
    assert_eq!(done.responses.len(), 3);
    for r in &done.responses {
        match r.request {
            2 => {
                let e = r.error.as_ref().expect("error");
                assert_eq!((e.message.as_str(), e.code), ("no good", 3));
            }
            _ => assert!(r.error.is_none() && r.outputs.len() == 1),
        }
        stub.release_outputs(r);
    }
}

#[test]
fn initialize_exception_is_reported_with_its_traceback() {
    let model = Model::new(
        "badinit",
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('weights missing')\n",
    );
    let stub = model.spawn();
    let err = stub.initialize(model.init("{}"), Duration::from_secs(30)).expect_err("must fail");
    let text = err.to_string();
    assert!(matches!(err, HostError::Model(_)), "{text}");
    assert!(text.contains("RuntimeError: weights missing") && text.contains("model.py(3): initialize"), "{text}");
}

#[test]
fn missing_model_file_and_import_errors_are_reported() {
    let model = Model::new("noimport", "import not_a_module_anywhere\n");
    let stub = model.spawn();
    let err = stub.initialize(model.init("{}"), Duration::from_secs(30)).expect_err("import error").to_string();
    assert!(err.contains("No module named 'not_a_module_anywhere'"), "{err}");
    let mut init = model.init("{}");
    init.model_file = "/nonexistent/1/model.py".into();
    let err = stub.initialize(init, Duration::from_secs(30)).expect_err("missing").to_string();
    assert!(err.contains("Python model file not found in '/nonexistent/1/model.py'"), "{err}");
}

#[test]
fn print_stderr_and_logger_reach_the_server_log() {
    let model = Model::new(
        "logs",
        r#"
import sys
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        print("marker-stdout-7f3a")
        print("marker-stderr-9c1d", file=sys.stderr)
        pb_utils.Logger.log_warn("marker-logger-4b2e")
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"#,
    );
    let stub = model.start();
    // Output readers are threads; give them a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let all_there =
        || ["marker-stdout-7f3a", "marker-stderr-9c1d", "marker-logger-4b2e"].iter().all(|m| log_text().contains(m));
    while !all_there() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = log_text();
    assert!(log.contains("marker-stdout-7f3a"), "{log}");
    assert!(log.contains("marker-stderr-9c1d"));
    let line = log.lines().find(|l| l.contains("marker-logger-4b2e")).expect("logger line");
    assert!(line.contains("WARN") && line.contains("model.py:9]") && line.contains("logs_0_0"), "{line}");
    assert!(stub.stderr_tail().contains("marker-stderr-9c1d"));
}

#[test]
fn bf16_inputs_follow_triton() {
    let model = Model::new(
        "bf16",
        r#"
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = r.inputs()[0]
            try:
                t.as_numpy()
                msg = b"converted"
            except pb_utils.TritonModelException as e:
                msg = str(e).encode()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("MSG", np.array([msg], dtype=np.object_)),
                pb_utils.Tensor("DTYPE", np.array([t.triton_dtype()], dtype=np.int32)),
                pb_utils.Tensor("SHAPE", np.array(t.shape(), dtype=np.int64)),
            ]))
        return out
"#,
    );
    let stub = model.start();
    let outs =
        run_one(&stub, request(1, vec![input(&stub, "X", DataType::Bf16, &[3], &[0u8; 6], false)])).expect("run");
    assert!(String::from_utf8_lossy(&outs[0].3).contains("Tensor dtype is BF16 and cannot be converted to NumPy"));
    assert_eq!(outs[1].3, 14i32.to_le_bytes());
    assert_eq!(outs[2].3, 3i64.to_le_bytes());
}

#[test]
fn finalize_is_called_and_the_stub_exits() {
    let model = Model::new(
        "fin",
        "import sys\nclass TritonPythonModel:\n    def finalize(self):\n        print('finalized-8e1f', file=sys.stderr)\n",
    );
    let stub = model.start();
    stub.finalize(Duration::from_secs(10)).expect("finalize");
    std::thread::sleep(Duration::from_millis(50));
    assert!(stub.stderr_tail().contains("finalized-8e1f"));
    assert_eq!(stub.try_exit(), Some(StubExit::Code(0)));
}

#[test]
fn a_crashing_stub_is_an_error_with_status_and_stderr() {
    let model = Model::new(
        "crash",
        "import os, sys\nclass TritonPythonModel:\n    def execute(self, requests):\n        print('about to die', file=sys.stderr)\n        os._exit(3)\n",
    );
    let stub = model.start();
    let err = stub.execute(vec![request(1, vec![])], Some(Duration::from_secs(30))).expect_err("crash");
    let text = err.to_string();
    assert!(matches!(err, HostError::Exited { status: StubExit::Code(3), killed: None, .. }), "{text}");
    assert!(text.contains("exit code 3") && text.contains("about to die"), "{text}");
}

#[test]
fn auto_complete_config_fills_the_config() {
    let model = Model::new(
        "auto",
        r#"
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
        config.set_max_batch_size(8)
        config.set_dynamic_batching()
        return config
"#,
    );
    let stub = model.spawn();
    let json =
        stub.auto_complete(&model.file(), r#"{"name": "auto"}"#, Duration::from_secs(30)).expect("auto-complete");
    for part in ["\"max_batch_size\": 8", "\"name\": \"IN\"", "\"name\": \"OUT\"", "\"dynamic_batching\""] {
        assert!(json.contains(part), "{part} missing in {json}");
    }
}

#[test]
fn parameters_reach_the_model_and_come_back() {
    let model = Model::new(
        "params",
        r#"
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            p = json.loads(r.parameters())
            out.append(pb_utils.InferenceResponse([], parameters={"echo": p["s"], "n": p["n"] + 1, "flag": not p["b"]}))
        return out
"#,
    );
    let stub = model.start();
    let mut req = request(1, vec![]);
    req.parameters = vec![
        ("s".into(), tritium_ipc::Param::Str("x".into())),
        ("n".into(), tritium_ipc::Param::Int(41)),
        ("b".into(), tritium_ipc::Param::Bool(true)),
    ];
    let mut done = stub.execute(vec![req], Some(Duration::from_secs(30))).expect("execute");
    let resp = done.responses.remove(0);
    assert!(resp.error.is_none(), "{:?}", resp.error);
    assert_eq!(
        resp.parameters,
        vec![
            ("echo".to_string(), tritium_ipc::Param::Str("x".into())),
            ("n".to_string(), tritium_ipc::Param::Int(42)),
            ("flag".to_string(), tritium_ipc::Param::Bool(false)),
        ]
    );
}

/// An input the server sends as a client's CUDA IPC handle (a model asking for GPU inputs) that
/// the stub cannot open (no CUDA here; elsewhere, a handle of zeros opens nothing) fails its
/// batch with a message that names the input, and the stub goes on serving.
#[test]
fn a_gpu_input_the_stub_cannot_open_fails_its_batch_and_not_the_stub() {
    let model = Model::new("gpu_in", IDENTITY);
    let stub = model.start();
    let gpu = tritium_ipc::Tensor {
        name: "G".into(),
        dtype: DataType::Fp32,
        shape: vec![4],
        data: tritium_ipc::TensorData::Cuda { handle: vec![0; 64], device: 0, offset: 0, len: 16 },
    };
    let err = run_one(&stub, request(1, vec![gpu])).expect_err("cannot be opened");
    assert!(err.contains("input 'G' is in the client's CUDA shared memory, which this stub cannot open"), "{err}");
    let cpu = input(&stub, "X", DataType::Fp32, &[2], &[0u8; 8], true);
    let outputs = run_one(&stub, request(2, vec![cpu])).expect("the stub still serves");
    assert_eq!(outputs.len(), 1);
}

#[test]
fn check_alive_reports_an_exit_the_event_loop_never_read() {
    let model = Model::new(
        "exits",
        "import os, threading\nclass TritonPythonModel:\n    def initialize(self, args):\n        threading.Timer(0.1, os._exit, [5]).start()\n    def execute(self, requests):\n        return []\n",
    );
    let stub = model.start();
    // Once the process has ended this must answer (it once deadlocked on its own lock).
    let err = first_error(|| stub.check_alive());
    // It never waits: how the process ended is for `settle`, off the event loop.
    assert!(matches!(err, HostError::Exiting { .. }), "{err}");
    let err = stub.settle(err);
    assert!(matches!(err, HostError::Exited { status: StubExit::Code(5), .. }), "{err}");
}

#[test]
fn an_event_loop_sees_a_watched_stub_exit_without_waiting_for_it() {
    let model = Model::new(
        "exits_watched",
        "import os, threading\nclass TritonPythonModel:\n    def initialize(self, args):\n        threading.Timer(0.1, os._exit, [7]).start()\n    def execute(self, requests):\n        return []\n",
    );
    let stub = model.start();
    stub.watch(None, || {}).expect("watch");
    // The watcher closes the channel when the process ends; the calls that never wait say the
    // stub is exiting and leave how it ended to `settle`.
    let err = first_error(|| stub.try_message());
    assert!(matches!(err, HostError::Exiting { .. }), "{err}");
    let err = stub.settle(err);
    assert!(matches!(err, HostError::Exited { status: StubExit::Code(7), .. }), "{err}");
}

/// Calls `poll` every 10 ms until it fails (within 30 s: the stub must exit by then).
fn first_error<T>(mut poll: impl FnMut() -> Result<T, HostError>) -> HostError {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match poll() {
            Err(e) => return e,
            Ok(_) => assert!(std::time::Instant::now() < deadline, "the stub never exited"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn stacks_are_read_from_an_idle_stub_and_from_one_stuck_in_c_holding_the_gil() {
    let model = Model::new(
        "stuck",
        r#"
import ctypes
import threading
import time

LIBC = ctypes.PyDLL(None)


def sleeps_in_its_own_thread():
    while True:
        time.sleep(0.05)


class TritonPythonModel:
    def initialize(self, args):
        threading.Thread(target=sleeps_in_its_own_thread, name="model-thread", daemon=True).start()

    def execute(self, requests):
        LIBC.sleep(3)
        return []
"#,
    );
    let stub = model.start();
    let probe = stub.stack_probe();
    let idle = probe.stacks(Duration::from_secs(10)).expect("stacks of an idle stub");
    assert!(idle.contains("sleeps_in_its_own_thread") && idle.contains("model-thread"), "{idle}");
    assert!(idle.contains("asyncio tasks: none"), "{idle}");
    // Stuck in libc's sleep, holding the GIL: the stacks still come, without what needs the GIL.
    let stuck = std::thread::spawn({
        let probe = probe.clone();
        move || {
            std::thread::sleep(Duration::from_millis(500));
            probe.stacks(Duration::from_secs(10))
        }
    });
    let _ = run_one(&stub, request(1, Vec::new()));
    let text = stuck.join().expect("asker").expect("stacks of a stuck stub");
    assert!(text.contains("in execute"), "{text}");
    assert!(text.contains("the GIL was not released within"), "{text}");
}
