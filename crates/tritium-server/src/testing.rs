//! Fixtures shared by the frontends' tests (the `testing` feature); not part of the API.

use crate::types::{BatchStats, InferError, ModelStats, OutputTensor, StatDuration};

/// Statistics of model `name` version 1 with small distinct numbers in every field, so that a
/// test can tell each field from the others on the wire.
pub fn model_stats(name: &str) -> ModelStats {
    let d = |count, ns| StatDuration { count, ns };
    ModelStats {
        name: name.into(),
        version: "1".into(),
        last_inference: 1_700_000_000_000,
        inference_count: 10,
        execution_count: 4,
        success: d(5, 500),
        fail: d(1, 10),
        fail_reasons: Default::default(),
        queue: d(5, 50),
        compute_input: d(4, 40),
        compute_infer: d(4, 400),
        compute_output: d(4, 4),
        cache_hit: d(0, 0),
        cache_miss: d(0, 0),
        batch_stats: vec![BatchStats {
            batch_size: 2,
            compute_input: d(2, 20),
            compute_infer: d(2, 200),
            compute_output: d(2, 2),
        }],
    }
}

/// Statistics that grow with `n` inferences served, as `perf_analyzer` expects between its
/// measurements.
pub fn growing_stats(name: &str, n: u64) -> ModelStats {
    let d = |count, ns| StatDuration { count, ns };
    ModelStats {
        name: name.into(),
        version: "1".into(),
        last_inference: 1_700_000_000_000 + n,
        inference_count: 2 * n,
        execution_count: n,
        success: d(n, 1000 * n),
        queue: d(n, 100 * n),
        compute_input: d(n, 10 * n),
        compute_infer: d(n, 800 * n),
        compute_output: d(n, 10 * n),
        batch_stats: vec![BatchStats {
            batch_size: 2,
            compute_input: d(n, 10 * n),
            compute_infer: d(n, 800 * n),
            compute_output: d(n, 10 * n),
        }],
        ..Default::default()
    }
}

/// The core's classification of `output` (top `k`, no labels), for mock backends that stand in
/// for [`crate::Server`].
pub fn classify(output: &OutputTensor, k: u32, batching: bool) -> Result<OutputTensor, InferError> {
    crate::classify::classify(output, k, batching, None).map_err(InferError::from)
}
