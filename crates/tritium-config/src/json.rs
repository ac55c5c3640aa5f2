//! Triton's JSON form of a model configuration (`initialize(args)["model_config"]`,
//! `GET /v2/models/{m}/config`, `auto_complete_config`), through prost-reflect's serde support.
//!
//! Triton prints protobuf's JSON mapping with proto field names and every field without
//! presence (scalars, enums by name, repeated fields as `[]`, maps as `{}`); unset message
//! fields and unset oneof members are left out. It then rewrites the 64-bit integers, which
//! protobuf prints as strings, into numbers. We print every 64-bit integer as a number; Triton
//! misses three (`instance_group.secondary_devices.device_id`, the CUDA graph spec dims and,
//! through a lookup bug, `sequence_batching.state.initial_state.dims`), which it leaves as strings.

use prost_reflect::{DeserializeOptions, DynamicMessage, SerializeOptions};
use serde_json::Value;

use crate::{model_config_descriptor, proto::ModelConfig, ConfigError};

/// The JSON form of `config`, shaped as Triton prints it.
pub fn to_json(config: &ModelConfig) -> Value {
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(false)
        .stringify_64_bit_integers(false)
        .use_enum_numbers(false);
    let mut message = DynamicMessage::new(model_config_descriptor());
    message.transcode_from(config).expect("ModelConfig and its descriptor come from the same .proto");
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("a ModelConfig always serializes to a serde_json::Value (map keys are strings)")
}

/// Reads a JSON model configuration. Field names may be proto or lowerCamelCase names,
/// 64-bit integers numbers or strings, enums names or numbers; unknown fields are refused,
/// as Triton refuses them.
pub fn from_json(json: &Value) -> Result<ModelConfig, ConfigError> {
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let mut track = serde_path_to_error::Track::new();
    let deserializer = serde_path_to_error::Deserializer::new(json, &mut track);
    let message =
        DynamicMessage::deserialize_with_options(model_config_descriptor(), deserializer, &options).map_err(|e| {
            let path = track.path().to_string();
            ConfigError::Json(if path == "." { e.to_string() } else { format!("{path}: {e}") })
        })?;
    message.transcode_to::<ModelConfig>().map_err(|e| ConfigError::Json(e.to_string()))
}

/// Reads a JSON model configuration from its text (what `auto_complete_config` returns), as
/// [`from_json`] does; text that is not JSON at all is a [`ConfigError::Json`] too.
pub fn from_json_str(text: &str) -> Result<ModelConfig, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(format!("not JSON: {e}")))?;
    from_json(&value)
}
