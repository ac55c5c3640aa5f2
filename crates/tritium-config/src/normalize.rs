//! Completing and validating a model configuration the way Triton does for the Python backend
//! (core `model_config_utils.cc`: AutoCompleteBackendFields, NormalizeModelConfig,
//! NormalizeInstanceGroup, ValidateModelConfig, ValidateModelIOConfig, ValidateInstanceGroup).
//! Error texts are Triton's wherever Triton has one, so that users can search for them.

use std::collections::HashSet;

use crate::{
    framework::Framework,
    proto::{
        model_config::SchedulingChoice,
        model_input::Format,
        model_instance_group::Kind,
        model_optimization_policy::PinnedMemoryBuffer,
        model_queue_policy::TimeoutAction,
        model_sequence_batching::StrategyChoice,
        model_version_policy::{Latest, PolicyChoice},
        DataType, ModelConfig, ModelInstanceGroup, ModelOptimizationPolicy, ModelVersionPolicy,
    },
    ConfigError,
};

const PYTHON_BACKEND: &str = "python";
const PYTHON_FILENAME: &str = "model.py";
const ENSEMBLE_PLATFORM: &str = "ensemble";
/// Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS.
const SEQUENCE_IDLE_DEFAULT_MICROSECONDS: u64 = 1_000_000;
/// Triton's WILDCARD_DIM.
const WILDCARD_DIM: i64 = -1;

/// Completes `config` with Triton's defaults and checks it against Triton's rules, for the
/// model in directory `model_name`.
///
/// Defaults: `name` (the directory name), `backend` ("python" when neither backend nor
/// platform is given), `default_model_filename` ("model.py"), `version_policy`
/// (`latest { num_versions: 1 }`), dynamic batching's `preferred_batch_size`
/// (`[max_batch_size]`), sequence batching's idle time (1 s), pinned input and output memory,
/// and instance groups: one group named after the model when there is none, `<model>_<index>`
/// for unnamed groups, `count` 1. The device kind is left as written (`KIND_AUTO` for the
/// default group); [`resolve_instance_groups`] settles it once the GPUs are known.
///
/// Ensembles (`platform: "ensemble"`) get no instance groups or optimization, as in Triton.
pub fn normalize(config: &mut ModelConfig, model_name: &str) -> Result<(), ConfigError> {
    if config.name.is_empty() {
        config.name = model_name.to_owned();
    } else if config.name != model_name {
        return Err(ConfigError::Invalid(format!(
            "unexpected directory name '{model_name}' for model '{}', directory name must \
             equal model name",
            config.name
        )));
    }
    let is_ensemble = check_backend(config)?;
    if !is_ensemble && config.default_model_filename.is_empty() {
        config.default_model_filename = PYTHON_FILENAME.to_owned();
    }

    // NormalizeModelConfig
    if config.version_policy.is_none() {
        config.version_policy =
            Some(ModelVersionPolicy { policy_choice: Some(PolicyChoice::Latest(Latest { num_versions: 1 })) });
    }
    let max_batch_size = config.max_batch_size;
    match &mut config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(batching))
            if batching.preferred_batch_size.is_empty() && max_batch_size > 0 =>
        {
            batching.preferred_batch_size.push(max_batch_size);
        }
        Some(SchedulingChoice::SequenceBatching(batching)) => {
            if batching.max_sequence_idle_microseconds == 0 {
                batching.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS;
            }
            if let Some(StrategyChoice::Oldest(oldest)) = &mut batching.strategy_choice {
                if oldest.preferred_batch_size.is_empty() && max_batch_size > 0 {
                    oldest.preferred_batch_size.push(max_batch_size);
                }
            }
        }
        _ => {}
    }
    if !is_ensemble {
        let optimization = config.optimization.get_or_insert_with(ModelOptimizationPolicy::default);
        optimization.input_pinned_memory.get_or_insert(PinnedMemoryBuffer { enable: true });
        optimization.output_pinned_memory.get_or_insert(PinnedMemoryBuffer { enable: true });
    }

    validate_config(config, is_ensemble)?;
    validate_io(config)?;

    if !is_ensemble {
        // NormalizeInstanceGroup, the device-independent part. The Python backend's
        // preferred group carries no count, so every count defaults to 1.
        if config.instance_group.is_empty() {
            config.instance_group.push(ModelInstanceGroup {
                name: config.name.clone(),
                kind: Kind::Auto as i32,
                ..Default::default()
            });
        }
        for (index, group) in config.instance_group.iter_mut().enumerate() {
            if group.name.is_empty() {
                group.name = format!("{}_{index}", config.name);
            }
            if group.count < 1 {
                group.count = 1;
            }
        }
    }
    Ok(())
}

/// Settles each instance group's device kind and GPUs for a machine whose usable GPUs are
/// `gpus` (CUDA device ids), then checks them, as Triton's NormalizeInstanceGroup and
/// ValidateInstanceGroup do. Call after [`normalize`].
///
/// - `KIND_AUTO` (also the default group when the config has none) becomes `KIND_GPU` on
///   every GPU when there are GPUs and the group lists none that are missing, else `KIND_CPU`.
///   That is what Triton does for the Python backend, whose preferred group is `KIND_GPU` in
///   GPU builds: a model without `instance_group` gets one instance per GPU on a GPU machine.
/// - `KIND_GPU` without `gpus` runs on every GPU. On a machine with no GPU it is refused
///   ("... has kind KIND_GPU but no GPUs are available"): Triton does not fall back to CPU
///   for an explicit `KIND_GPU`; only `KIND_AUTO` falls back.
pub fn resolve_instance_groups(config: &mut ModelConfig, gpus: &[i32]) -> Result<(), ConfigError> {
    if is_ensemble_config(config) {
        return Ok(());
    }
    if config.instance_group.is_empty() {
        return Err(ConfigError::Invalid(format!("must specify one or more 'instance group's for {}", config.name)));
    }
    let model = &config.name;
    for group in &mut config.instance_group {
        if group.kind == Kind::Auto as i32 {
            let all_present = group.gpus.iter().all(|gpu| gpus.contains(gpu));
            let kind = if gpus.is_empty() || !all_present { Kind::Cpu } else { Kind::Gpu };
            group.set_kind(kind);
        }
        if group.kind == Kind::Gpu as i32 && group.gpus.is_empty() {
            group.gpus = gpus.to_vec();
        }

        let prefix = format!("instance group {} of model {model}", group.name);
        match Kind::try_from(group.kind) {
            Ok(Kind::Model) if !group.gpus.is_empty() => {
                return Err(ConfigError::Invalid(format!(
                    "{prefix} has kind KIND_MODEL but specifies one or more GPUs"
                )));
            }
            Ok(Kind::Cpu) if !group.gpus.is_empty() => {
                return Err(ConfigError::Invalid(format!("{prefix} has kind KIND_CPU but specifies one or more GPUs")));
            }
            Ok(Kind::Gpu) if group.gpus.is_empty() => {
                return Err(ConfigError::Invalid(format!("{prefix} has kind KIND_GPU but no GPUs are available")));
            }
            Ok(Kind::Gpu) => {
                if let Some(gpu) = group.gpus.iter().find(|gpu| !gpus.contains(gpu)) {
                    let available: Vec<String> = gpus.iter().map(i32::to_string).collect();
                    return Err(ConfigError::Invalid(format!(
                        "{prefix} specifies invalid or unsupported gpu id {gpu}. Available \
                         GPUs are: {}",
                        available.join(", ")
                    )));
                }
            }
            Ok(Kind::Model | Kind::Cpu) => {}
            Ok(Kind::Auto) | Err(_) => {
                return Err(ConfigError::Invalid(format!("{prefix} has unexpected kind {}", group.kind)));
            }
        }
        if !group.profile.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "{prefix} and platform {} specifies profile field which is only supported \
                 for TensorRT models",
                config.platform
            )));
        }
    }
    Ok(())
}

fn is_ensemble_config(config: &ModelConfig) -> bool {
    config.platform == ENSEMBLE_PLATFORM
}

/// Fills in the backend a platform stands for (and the platform a built-in backend stands for,
/// as Triton's AutoCompleteBackendFields does) and refuses platforms tritium does not serve;
/// returns whether this is an ensemble. A `backend` other than a built-in one passes: the server
/// looks for it among its Python-based backends.
fn check_backend(config: &mut ModelConfig) -> Result<bool, ConfigError> {
    let unsupported = |requested: String| ConfigError::UnsupportedBackend { model: config.name.clone(), requested };
    if is_ensemble_config(config) {
        if !config.backend.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "Ensemble model '{}' must have platform type '{}' and empty backend type",
                config.name, config.platform
            )));
        }
        return Ok(true);
    }
    if !config.platform.is_empty() {
        match Framework::of_platform(&config.platform) {
            Some(framework) if config.backend.is_empty() => config.backend = framework.backend().to_owned(),
            Some(framework) if config.backend != framework.backend() => {
                return Err(ConfigError::Invalid(format!(
                    "unexpected 'platform' and 'backend' pair, got:{}, {}",
                    config.platform, config.backend
                )));
            }
            Some(_) => {}
            None if config.backend.is_empty() => return Err(unsupported(format!("platform '{}'", config.platform))),
            // A platform beside an explicit backend is the backend's business (as before).
            None => {}
        }
    }
    if config.backend.is_empty() {
        config.backend = PYTHON_BACKEND.to_owned();
    }
    if let Some(framework) = Framework::of_backend(&config.backend) {
        if config.platform.is_empty() {
            config.platform = framework.platform().to_owned();
        }
        if config.default_model_filename.is_empty() {
            config.default_model_filename = framework.default_filename().to_owned();
        }
    }
    Ok(false)
}

/// ValidateModelConfig, the parts that apply to Python models and ensembles.
fn validate_config(config: &ModelConfig, is_ensemble: bool) -> Result<(), ConfigError> {
    let name = &config.name;
    let invalid = |message: String| Err(ConfigError::Invalid(message));
    if config.max_batch_size < 0 {
        return invalid(format!("'max_batch_size' must be non-negative value for {name}"));
    }
    let response_cache = config.response_cache.as_ref().is_some_and(|c| c.enable);
    match &config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(batching)) => {
            for &size in &batching.preferred_batch_size {
                if size <= 0 {
                    return invalid(format!("dynamic batching preferred size must be positive for {name}"));
                }
                if size > config.max_batch_size {
                    return invalid(format!("dynamic batching preferred size must be <= max batch size for {name}"));
                }
            }
            let levels = batching.priority_levels;
            if levels != 0 {
                if batching.default_priority_level == 0 || batching.default_priority_level > levels {
                    return invalid(format!("default priority level must be in range [1, {levels}] for {name}"));
                }
                if batching.priority_queue_policy.keys().any(|&level| level == 0 || level > levels) {
                    return invalid(format!(
                        "priority queue policy must have priority level in range [1, {levels}] \
                         for {name}"
                    ));
                }
            }
            if batching.preserve_ordering {
                if levels > 1 {
                    return invalid(format!(
                        "Only one priority level is allowed when 'preserve_ordering' is true \
                         for {name}"
                    ));
                }
                let delays =
                    batching.default_queue_policy.iter().chain(batching.priority_queue_policy.values()).any(|policy| {
                        policy.default_timeout_microseconds != 0 && policy.timeout_action() == TimeoutAction::Delay
                    });
                if delays {
                    return invalid(format!(
                        "Queue policy can not have DELAY as timeout action when \
                         'preserve_ordering' is true for {name}"
                    ));
                }
            }
        }
        Some(SchedulingChoice::SequenceBatching(batching)) => {
            if response_cache {
                return invalid(format!(
                    "Response Cache does not currently support model {name} with sequence \
                     batching scheduler. Please disable the response cache."
                ));
            }
            match &batching.strategy_choice {
                Some(StrategyChoice::Oldest(oldest)) => {
                    for &size in &oldest.preferred_batch_size {
                        if size <= 0 {
                            return invalid(format!(
                                "sequence batching preferred batch size must be positive for \
                                 {name}"
                            ));
                        }
                        if size > config.max_batch_size {
                            return invalid(format!(
                                "sequence batching preferred batch size must be <= max batch \
                                 size for {name}"
                            ));
                        }
                    }
                }
                Some(StrategyChoice::Direct(direct)) if !(0.0..=1.0).contains(&direct.minimum_slot_utilization) => {
                    return invalid(format!(
                        "sequence batching minimum slot utilization must be in range \
                         (0.0, 1.0] for {name}"
                    ));
                }
                Some(StrategyChoice::Direct(_)) | None => {}
            }
            crate::sequence::sequence_controls(batching, name)?;
        }
        Some(SchedulingChoice::EnsembleScheduling(ensemble)) => {
            if !is_ensemble {
                return invalid(format!(
                    "ensemble scheduling cannot be set for model '{name}' whose platform is \
                     not {ENSEMBLE_PLATFORM}"
                ));
            }
            if !config.instance_group.is_empty() {
                return invalid(format!("instance group should not be specified for ensemble '{name}'"));
            }
            if config.optimization.is_some() {
                return invalid(format!("optimization should not be specified for ensemble '{name}'"));
            }
            if !config.model_warmup.is_empty() {
                return invalid(format!("model_warmup can not be specified for ensemble '{name}'"));
            }
            if ensemble.step.is_empty() {
                return invalid(format!("must specify 'step' for ensemble '{name}'"));
            }
            for (index, step) in ensemble.step.iter().enumerate() {
                let missing = if step.model_name.is_empty() {
                    "model_name"
                } else if step.input_map.is_empty() {
                    "input_map"
                } else if step.output_map.is_empty() {
                    "output_map"
                } else {
                    continue;
                };
                return invalid(format!("must specify '{missing}' in step {index} of ensemble '{name}'"));
            }
            crate::ensemble::check_data_flow(config, ensemble)?;
        }
        None => {}
    }
    if is_ensemble && !matches!(config.scheduling_choice, Some(SchedulingChoice::EnsembleScheduling(_))) {
        return invalid(format!(
            "ensemble scheduling must be set for ensemble {name} whose platform is \
             {ENSEMBLE_PLATFORM}"
        ));
    }
    let decoupled = config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled);
    if decoupled && response_cache {
        return invalid(format!(
            "Response Cache does not currently support model {name} with 'decoupled' \
             transaction policy. Please disable the response cache."
        ));
    }
    Ok(())
}

/// What ValidateIOShape looks at in a ModelInput or ModelOutput.
struct Io<'a> {
    direction: &'static str,
    name: &'a str,
    data_type: i32,
    dims: &'a [i64],
    reshape: Option<&'a [i64]>,
    is_shape_tensor: bool,
}

/// ValidateModelIOConfig (Triton's texts, `" for <model>"` appended), plus unique names.
fn validate_io(config: &ModelConfig) -> Result<(), ConfigError> {
    let inputs = config.input.iter().map(|io| {
        let format_ok = io.format() == Format::None || io.dims.len() == 3;
        let view = Io {
            direction: "input",
            name: &io.name,
            data_type: io.data_type,
            dims: &io.dims,
            reshape: io.reshape.as_ref().map(|r| r.shape.as_slice()),
            is_shape_tensor: io.is_shape_tensor,
        };
        (view, format_ok)
    });
    let outputs = config.output.iter().map(|io| {
        let view = Io {
            direction: "output",
            name: &io.name,
            data_type: io.data_type,
            dims: &io.dims,
            reshape: io.reshape.as_ref().map(|r| r.shape.as_slice()),
            is_shape_tensor: io.is_shape_tensor,
        };
        (view, true)
    });
    let mut seen = HashSet::new();
    for (io, format_ok) in inputs.chain(outputs) {
        let for_model = |message: String| ConfigError::Invalid(format!("{message} for {}", config.name));
        validate_shape(&io, config.max_batch_size).map_err(for_model)?;
        if !format_ok {
            return Err(for_model("model input NHWC/NCHW require 3 dims".to_owned()));
        }
        if io.is_shape_tensor {
            return Err(for_model("shape tensors are only supported for TensorRT platform".to_owned()));
        }
        if !seen.insert((io.direction, io.name)) {
            return Err(ConfigError::Invalid(format!(
                "model '{}' has more than one {} named '{}'",
                config.name, io.direction, io.name
            )));
        }
    }
    Ok(())
}

/// ValidateIOShape.
fn validate_shape(io: &Io<'_>, max_batch_size: i32) -> Result<(), String> {
    let direction = io.direction;
    if io.name.is_empty() {
        return Err(format!("model {direction} must specify 'name'"));
    }
    let prefix = format!("model {direction} '{}'", io.name);
    if io.data_type == DataType::TypeInvalid as i32 || DataType::try_from(io.data_type).is_err() {
        return Err(format!("{prefix} must specify 'data_type'"));
    }
    if io.dims.is_empty() {
        return Err(format!("{prefix} must specify 'dims'"));
    }
    if io.reshape.is_some_and(<[i64]>::is_empty) && max_batch_size == 0 {
        return Err(format!(
            "{prefix} cannot have empty reshape for non-batching model as scalar tensors are \
             not supported"
        ));
    }
    let valid_dim = |&dim: &i64| dim >= 1 || dim == WILDCARD_DIM;
    if !io.dims.iter().all(valid_dim) {
        return Err(format!(
            "{prefix} dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a \
             variable-size dimension"
        ));
    }
    let Some(reshape) = io.reshape else {
        return Ok(());
    };
    if !reshape.iter().all(valid_dim) {
        return Err(format!(
            "{prefix} reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to indicate \
             a variable-size dimension"
        ));
    }
    // dims and reshape must hold the same number of elements; with variable-size dimensions
    // on both sides, the runs between them must match ([2, 4, -1, 6] -> [8, -1, 1, 6] is
    // valid). An empty reshape (a scalar) needs dims of one element.
    let different_size = || Err(format!("{prefix} has different size for dims and reshape"));
    match (io.dims.contains(&WILDCARD_DIM), reshape.contains(&WILDCARD_DIM)) {
        (true, true) => {
            let (dims, reshape) = (trunks(io.dims), trunks(reshape));
            if dims.len() != reshape.len() {
                return Err(format!(
                    "{prefix} has different number of variable-size dimensions for dims and \
                     reshape"
                ));
            }
            if dims != reshape {
                return different_size();
            }
        }
        (false, false) => {
            let dims = trunks(io.dims);
            let scalar = reshape.is_empty() && dims == [Some(1)];
            if !scalar && dims != trunks(reshape) {
                return different_size();
            }
        }
        _ => return different_size(),
    }
    Ok(())
}

/// Element counts of the runs of fixed dimensions between wildcards (`None` on overflow).
fn trunks(dims: &[i64]) -> Vec<Option<i64>> {
    dims.split(|&dim| dim == WILDCARD_DIM)
        .map(|run| run.iter().try_fold(1_i64, |count, &dim| count.checked_mul(dim)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::trunks;

    #[test]
    fn trunks_split_at_wildcards() {
        assert_eq!(trunks(&[2, 4, -1, 6]), [Some(8), Some(6)]);
        assert_eq!(trunks(&[8, -1, 1, 6]), [Some(8), Some(6)]);
        assert_eq!(trunks(&[-1]), [Some(1), Some(1)]);
        assert_eq!(trunks(&[]), [Some(1)]);
        assert_eq!(trunks(&[i64::MAX, 2]), [None]);
    }
}
