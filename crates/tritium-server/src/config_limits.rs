//! Limits on what a model config may make the server allocate, checked before a load commits
//! any memory or starts any process.
//!
//! A config can come from a client (a load request's `config` override, `pb_utils.load_model`),
//! and its numbers size things directly: a warmup sample's `dims` and `batch_size` are bytes the
//! server fills, `instance_group.count` is processes, `max_batch_size` and
//! `max_candidate_sequences` are sequence slots per instance. Each is computed with checked
//! arithmetic and compared with a limit the operator sets by a flag; an overflow is over every
//! limit. The error names the config field, the limit and the flag.

use tritium_config::proto::model_config::SchedulingChoice;
use tritium_config::proto::model_instance_group::Kind;
use tritium_config::proto::model_sequence_batching::StrategyChoice;
use tritium_config::ModelConfig;

use crate::validate::wire_type;

/// Default of `--max-warmup-bytes`: 256 MiB of warmup data per sample (inputs times
/// `batch_size`); warmup samples are small by design, and they stay in memory for restarts.
pub const DEFAULT_MAX_WARMUP_BYTES: u64 = 256 << 20;
/// Default of `--max-model-instances`: stub processes one model version may start.
pub const DEFAULT_MAX_MODEL_INSTANCES: u64 = 256;
/// Default of `--max-sequence-slots`: sequence slots (concurrent sequences) per instance.
pub const DEFAULT_MAX_SEQUENCE_SLOTS: u64 = 65_536;

/// The limits on sizes a config sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigLimits {
    /// Most bytes of one warmup sample: its inputs' data times its `batch_size`.
    pub max_warmup_bytes: u64,
    /// Most instances (stubs) of one model version, over all of its instance groups.
    pub max_model_instances: u64,
    /// Most sequence slots per instance (`max_candidate_sequences`, or `max_batch_size`).
    pub max_sequence_slots: u64,
}

impl Default for ConfigLimits {
    fn default() -> Self {
        Self {
            max_warmup_bytes: DEFAULT_MAX_WARMUP_BYTES,
            max_model_instances: DEFAULT_MAX_MODEL_INSTANCES,
            max_sequence_slots: DEFAULT_MAX_SEQUENCE_SLOTS,
        }
    }
}

/// A config asks for more than a limit allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "model '{model}': {what} is {}, over the server's limit of {limit} (set by {flag}); lower it in the \
     config, or raise the limit when the server starts",
    .value.map_or_else(|| "beyond 2^64".to_string(), |v| v.to_string())
)]
pub struct LimitError {
    /// The model.
    pub model: String,
    /// What was counted, naming the config field.
    pub what: String,
    /// The amount, None when it overflows 64 bits.
    pub value: Option<u64>,
    /// The limit.
    pub limit: u64,
    /// The flag that sets the limit.
    pub flag: &'static str,
}

impl ConfigLimits {
    /// Checks every size `config` (normalized, instance groups resolved) sets.
    pub fn check(&self, config: &ModelConfig) -> Result<(), LimitError> {
        let model = &config.name;
        let over = |what: String, value: Option<u64>, limit: u64, flag: &'static str| {
            if value.is_some_and(|v| v <= limit) {
                return Ok(());
            }
            Err(LimitError { model: model.clone(), what, value, limit, flag })
        };
        over(
            "the instance count (instance_group)".into(),
            instance_count(config),
            self.max_model_instances,
            "--max-model-instances",
        )?;
        if let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice {
            let (field, slots) = match &sb.strategy_choice {
                Some(StrategyChoice::Oldest(o)) if o.max_candidate_sequences > 0 => {
                    ("sequence_batching.oldest.max_candidate_sequences", i64::from(o.max_candidate_sequences))
                }
                _ => ("max_batch_size (the sequence slots of each instance)", i64::from(config.max_batch_size)),
            };
            over(field.into(), u64::try_from(slots).ok(), self.max_sequence_slots, "--max-sequence-slots")?;
        }
        for sample in &config.model_warmup {
            let what =
                format!("the data of warmup sample '{}' in bytes (its inputs' dims times batch_size)", sample.name);
            over(what, warmup_bytes(sample), self.max_warmup_bytes, "--max-warmup-bytes")?;
        }
        Ok(())
    }
}

/// Instances over all groups: each group's count times its devices (one for CPU groups).
fn instance_count(config: &ModelConfig) -> Option<u64> {
    config.instance_group.iter().try_fold(0u64, |total, g| {
        let devices = if g.kind == Kind::Gpu as i32 { g.gpus.len().max(1) as u64 } else { 1 };
        let count = u64::try_from(g.count.max(1)).ok()?;
        total.checked_add(count.checked_mul(devices)?)
    })
}

/// The bytes one warmup sample's data takes: each input's elements times its element size (4
/// per `TYPE_STRING` element, its length prefix), summed, times `batch_size`. None on overflow
/// or a negative dimension (which the warmup reports with Triton's text).
pub(crate) fn warmup_bytes(sample: &tritium_config::proto::ModelWarmup) -> Option<u64> {
    let mut per_request = 0u64;
    for input in sample.inputs.values() {
        per_request = per_request.checked_add(warmup_input_bytes(input)?)?;
    }
    per_request.checked_mul(u64::from(sample.batch_size))
}

/// The bytes of one warmup input's data for one request: its elements times the element size
/// (4 per `TYPE_STRING` element, its length prefix). None on overflow or a negative dimension.
pub(crate) fn warmup_input_bytes(input: &tritium_config::proto::model_warmup::Input) -> Option<u64> {
    let element = wire_type(input.data_type).and_then(|t| t.element_size()).unwrap_or(4) as u64;
    input.dims.iter().try_fold(element, |n, &d| n.checked_mul(u64::try_from(d).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> ModelConfig {
        tritium_config::parse_config(text, std::path::Path::new("config.pbtxt")).expect("config parses")
    }

    #[test]
    fn sizes_within_the_limits_pass_and_beyond_them_name_field_limit_and_flag() {
        let limits = ConfigLimits::default();
        let fine = config(
            r#"name: "m" backend: "python" max_batch_size: 8
            instance_group [ { count: 4 kind: KIND_CPU } ]
            model_warmup [ { name: "w" batch_size: 2 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } } } ]"#,
        );
        assert_eq!(limits.check(&fine), Ok(()));
        let cases = [
            (
                r#"name: "m" backend: "python" model_warmup [ { name: "huge" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_UINT8 dims: [ 35184372088832 ] zero_data: true } } } ]"#,
                "--max-warmup-bytes",
                "warmup sample 'huge'",
            ),
            (
                r#"name: "m" backend: "python" model_warmup [ { name: "wrap" batch_size: 4 inputs { key: "A" value: { data_type: TYPE_FP64 dims: [ 4294967296, 4294967296 ] zero_data: true } } } ]"#,
                "beyond 2^64",
                "warmup sample 'wrap'",
            ),
            (
                r#"name: "m" backend: "python" model_warmup [ { name: "many" batch_size: 4294967295 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 1024 ] zero_data: true } } } ]"#,
                "--max-warmup-bytes",
                "warmup sample 'many'",
            ),
            (
                r#"name: "m" backend: "python" instance_group [ { count: 1000000 kind: KIND_CPU } ]"#,
                "--max-model-instances",
                "instance count",
            ),
            (
                r#"name: "m" backend: "python" max_batch_size: 2147483647 sequence_batching { }"#,
                "--max-sequence-slots",
                "max_batch_size",
            ),
            (
                r#"name: "m" backend: "python" max_batch_size: 4 sequence_batching { oldest { max_candidate_sequences: 2147483647 } }"#,
                "--max-sequence-slots",
                "max_candidate_sequences",
            ),
        ];
        for (text, needle, what) in cases {
            let e = limits.check(&config(text)).expect_err(text).to_string();
            assert!(e.contains(needle) && e.contains(what) && e.starts_with("model 'm': "), "{e}");
        }
    }

    #[test]
    fn gpu_groups_count_each_device() {
        let c =
            config(r#"name: "m" backend: "python" instance_group [ { count: 100 kind: KIND_GPU gpus: [ 0, 1, 2 ] } ]"#);
        assert_eq!(instance_count(&c), Some(300));
        let e = ConfigLimits::default().check(&c).expect_err("300 > 256");
        assert_eq!(e.value, Some(300));
    }
}
