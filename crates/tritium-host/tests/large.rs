//! A tensor larger than the default arena segment, which makes both sides grow their regions.

mod common;

use std::time::Duration;

use common::*;
use tritium_ipc::DataType;

#[test]
fn a_one_gib_tensor_round_trips_through_new_segments() {
    let model = Model::new(
        "big",
        r#"
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = r.inputs()[0].as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x[::-1]), pb_utils.Tensor("N", np.array([x.size], dtype=np.int64))]))
        return out
"#,
    );
    let stub = model.start();
    let len: usize = (1 << 30) + 4096;
    let block = stub.input_block(len as u64).expect("1 GiB input block");
    // Fill in place: the input is written once, straight into shared memory.
    // SAFETY: the block is ours, `len` bytes long, and not yet sent.
    let data = unsafe { std::slice::from_raw_parts_mut(block.as_ptr(), len) };
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let server_shm = stub.channel().own_shm_bytes();
    assert!(server_shm > 1 << 30, "the server grew its region: {server_shm}");
    let tensor = tritium_ipc::Tensor {
        name: "X".into(),
        dtype: DataType::Uint8,
        shape: vec![len as i64],
        data: tritium_ipc::TensorData::Shm { desc: block.desc, writable: true },
    };
    let mut done = stub.execute(vec![request(1, vec![tensor])], Some(Duration::from_secs(120))).expect("execute");
    assert!(done.error.is_none(), "{:?}", done.error);
    let resp = done.responses.remove(0);
    assert!(resp.error.is_none(), "{:?}", resp.error);
    let out = stub.output(&resp.outputs[0].data).expect("output view");
    assert_eq!(out.len(), len);
    assert!(out.desc.segment & tritium_ipc::arena::STUB_OWNED != 0, "the output lives in a stub segment");
    // SAFETY: the view is bounds-checked and stays mapped while `out` lives.
    let got = unsafe { std::slice::from_raw_parts(out.as_ptr(), len) };
    assert!(got.iter().enumerate().all(|(i, &b)| b == ((len - 1 - i) % 251) as u8), "reversed bytes");
    let n = stub.output(&resp.outputs[1].data).expect("n").to_vec();
    assert_eq!(n, (len as i64).to_le_bytes());
    drop(out);
    stub.release_outputs(&resp);
    // The stub released the input; a later message delivers the release, and the server retires
    // the oversized segment.
    let small = input(&stub, "X", DataType::Uint8, &[1], &[1], true);
    run_one(&stub, request(2, vec![small])).expect("small request after the big one");
    assert!(stub.channel().own_shm_bytes() < 1 << 30, "the 1 GiB segment was retired");
}
