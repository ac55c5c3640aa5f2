//! `Stub::execute_watching`: the watcher runs while `execute` does, and may send `Cancel` then;
//! the stub takes it and goes on serving.

mod common;

use std::time::Duration;

use common::{request, run_one, Model};
use tritium_host::Stub;

#[test]
fn the_watcher_runs_while_execute_runs_and_may_cancel() {
    let model = Model::new(
        "sleeper",
        r#"
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.3)
        return [pb_utils.InferenceResponse([]) for _ in requests]
"#,
    );
    let stub = model.start();
    let mut calls = 0;
    let mut watch = |s: &Stub| {
        calls += 1;
        if calls == 1 {
            s.cancel(1).expect("cancel");
        }
    };
    let done = stub
        .execute_watching(vec![request(1, vec![])], Some(Duration::from_secs(60)), Some(&mut watch))
        .expect("execute");
    assert!(done.error.is_none(), "{:?}", done.error);
    assert_eq!(done.responses.len(), 1);
    for r in &done.responses {
        stub.release_outputs(r);
    }
    assert!(calls >= 1, "the watcher never ran during a 300 ms execute");
    assert!(run_one(&stub, request(2, vec![])).expect("the stub still serves").is_empty());
}
