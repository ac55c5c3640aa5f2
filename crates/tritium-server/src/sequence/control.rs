//! What the sequence batcher adds to a batch: a direct batch's null requests for slots without
//! one, and the control tensors' bytes.

use super::*;

/// A direct batch's stand-in for a slot without a request.
pub(super) struct NullRequest {
    pub(super) req: InferRequest,
    pub(super) batch_size: u64,
}

impl NullRequest {
    pub(super) fn duplicate(&self) -> Pending {
        Pending {
            req: self.req.clone(),
            batch_size: self.batch_size,
            outputs: Vec::new(),
            enqueued: Instant::now(),
            tx: Reply::Discard,
            trace: None,
        }
    }
}

pub(super) fn zeros(len: usize) -> Bytes {
    Bytes::from(vec![0u8; len])
}

/// The CORRID control's one element: the id in the control's type (Triton copies the low bytes
/// of the u64), or a serialized string.
pub(super) fn corrid_bytes(id: &CorrelationId, dtype: DataType) -> Bytes {
    match (id, dtype) {
        (CorrelationId::Str(s), DataType::Bytes) => {
            let mut out = (s.len() as u32).to_le_bytes().to_vec();
            out.extend_from_slice(s.as_bytes());
            Bytes::from(out)
        }
        (_, DataType::Bytes) => zeros(4),
        (CorrelationId::U64(v), t) => Bytes::copy_from_slice(&v.to_le_bytes()[..t.element_size().unwrap_or(8).min(8)]),
        (_, t) => zeros(t.element_size().unwrap_or(8)),
    }
}
