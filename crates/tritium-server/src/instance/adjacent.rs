//! Adjacent inputs: the inputs of a batch's requests, copied back to back into the stub's arena,
//! so that a backend that joins the batch along the first dimension (the built-in ONNX Runtime
//! and PyTorch backends) views them as one array instead of copying them
//! (`tritium._native.join_inputs`).
//!
//! Each request still gets a block of its own for each input (released on its own, writable by
//! the model, as any copied input): only where the blocks lie changes. Only bytes that would be
//! copied anyway are: an input in a client's registered region or CUDA memory stays where it is,
//! and so does the input of a position where the requests differ in name or data type, or that
//! is `BYTES` (the stub deserializes those).

use super::*;

/// Per request of `batch` (in order), per input position: the block its input was copied to,
/// or `None` where the input is to be placed alone ([`place_input`]). Empty when the batch has
/// fewer than two requests whose client is still there.
pub(super) fn place_adjacent(ctx: &VersionContext, stub: &Stub, batch: &[Pending]) -> Vec<Vec<Option<Descriptor>>> {
    let mut placed: Vec<Vec<Option<Descriptor>>> = batch.iter().map(|p| vec![None; p.req.inputs.len()]).collect();
    let live: Vec<usize> = (0..batch.len()).filter(|&i| !batch[i].tx.is_closed()).collect();
    if live.len() < 2 {
        return Vec::new();
    }
    let first = &batch[live[0]].req.inputs;
    for (position, input) in first.iter().enumerate() {
        let mut bytes = Vec::with_capacity(live.len());
        for &i in &live {
            match batch[i].req.inputs.get(position) {
                Some(t) if t.name == input.name && t.datatype == input.datatype && copied(ctx, t) => {
                    bytes.push(&t.data[..])
                }
                _ => break,
            }
        }
        if bytes.len() != live.len() {
            continue;
        }
        // A run that cannot be allocated leaves these inputs to be placed one by one, which
        // reports the error of any that cannot be placed at all.
        if let Ok(Some(blocks)) = stub.input_run(&bytes) {
            for (&i, desc) in live.iter().zip(blocks) {
                placed[i][position] = Some(desc);
            }
        }
    }
    placed
}

/// Whether [`place_input`] would copy this input into the stub's arena.
fn copied(ctx: &VersionContext, t: &crate::types::InputTensor) -> bool {
    t.datatype != tritium_ipc::DataType::Bytes
        && !t.data.is_empty()
        && crate::shm::lookup(t.data.as_ptr(), t.data.len()).is_none()
        && !(ctx.gpu_inputs && crate::shm::lookup_cuda(t.data.as_ptr(), t.data.len()).is_some())
}

/// Frees the blocks [`place_adjacent`] placed for one request that is not sent.
pub(super) fn free_adjacent(stub: &Stub, blocks: &[Option<Descriptor>]) {
    for desc in blocks.iter().flatten() {
        let _ = stub.channel().free_own(*desc);
    }
}
