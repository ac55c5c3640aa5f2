//! What the integration tests of tritium-config share: the list of fixture configs.

/// Every config in tests/fixtures.
pub(crate) const FIXTURES: &[&str] = &[
    "add_sub",
    "batched_gpu",
    "decoupled_streaming",
    "specific_versions",
    "ensemble",
    "sequence_bls",
    "priority_batching",
    "ensemble_pipeline",
    "warmup_inputs",
];
