//! Request validation against a model's config, with Triton's checks, order and error texts.

use std::collections::HashSet;

use tritium_proto::inference::{DataType as ConfigType, ModelConfig};

use crate::types::{DataType, InferError, InferRequest, RequestedOutput};

/// What validation learned about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Validated {
    /// The batch size (first dimension) for batching models; 0 for non-batching ones.
    pub batch_size: u64,
    /// The outputs to return, in the order the client asked (all outputs if it asked none).
    pub outputs: Vec<RequestedOutput>,
}

/// Maps a config data type to the wire type; `None` for `TYPE_INVALID`.
pub(crate) fn wire_type(t: i32) -> Option<DataType> {
    Some(match ConfigType::try_from(t).ok()? {
        ConfigType::TypeInvalid => return None,
        ConfigType::TypeBool => DataType::Bool,
        ConfigType::TypeUint8 => DataType::Uint8,
        ConfigType::TypeUint16 => DataType::Uint16,
        ConfigType::TypeUint32 => DataType::Uint32,
        ConfigType::TypeUint64 => DataType::Uint64,
        ConfigType::TypeInt8 => DataType::Int8,
        ConfigType::TypeInt16 => DataType::Int16,
        ConfigType::TypeInt32 => DataType::Int32,
        ConfigType::TypeInt64 => DataType::Int64,
        ConfigType::TypeFp16 => DataType::Fp16,
        ConfigType::TypeFp32 => DataType::Fp32,
        ConfigType::TypeFp64 => DataType::Fp64,
        ConfigType::TypeString => DataType::Bytes,
        ConfigType::TypeBf16 => DataType::Bf16,
    })
}

/// Triton's `DimsListToString`: `[1,16]`.
pub(crate) fn dims(d: &[i64]) -> String {
    format!("[{}]", d.iter().map(i64::to_string).collect::<Vec<_>>().join(","))
}

fn quoted_list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    format!("[{}]", names.map(|n| format!("'{n}'")).collect::<Vec<_>>().join(","))
}

/// Counts the elements of a serialized BYTES tensor, checking every length prefix.
fn check_bytes(data: &[u8], expected: u64, log: &str, input: &str, model: &str) -> Result<(), InferError> {
    let mut rest = data;
    let mut count = 0u64;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err(InferError::invalid(format!(
                "{log}incomplete string length indicator for inference input '{input}' for model '{model}', expecting 4 bytes but only {} bytes available. Please make sure the string length indicator is in one buffer.",
                rest.len()
            )));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        rest = &rest[4..];
        if rest.len() < len {
            return Err(InferError::invalid(format!(
                "{log}incomplete string data for inference input '{input}' for model '{model}', expecting string of length {len} but only {} bytes available.",
                rest.len()
            )));
        }
        rest = &rest[len..];
        count += 1;
    }
    if count != expected {
        return Err(InferError::invalid(format!(
            "{log}expected {expected} string elements for inference input '{input}' for model '{model}', got {count}"
        )));
    }
    Ok(())
}

/// Validates `req` for `config` as Triton's `InferenceRequest::Normalize` does.
pub(crate) fn validate(req: &InferRequest, config: &ModelConfig) -> Result<Validated, InferError> {
    let model = config.name.as_str();
    let log = format!("[request id: {}] ", if req.id.is_empty() { "<id_unknown>" } else { &req.id });

    let outputs = if req.outputs.is_empty() {
        config.output.iter().map(|o| RequestedOutput::named(&o.name)).collect()
    } else {
        for o in &req.outputs {
            if !config.output.iter().any(|c| c.name == o.name) {
                let name = &o.name;
                return Err(InferError::invalid(format!("unexpected inference output '{name}' for model '{model}'")));
            }
        }
        req.outputs.clone()
    };

    let mut seen = HashSet::new();
    for input in &req.inputs {
        if !seen.insert(input.name.as_str()) {
            return Err(InferError::invalid(format!("{log}input '{}' already exists in request", input.name)));
        }
    }
    let required = config.input.iter().filter(|i| !i.optional).count();
    if req.inputs.len() > config.input.len() || req.inputs.len() < required {
        let missing = quoted_list(
            config.input.iter().filter(|i| !i.optional && !seen.contains(i.name.as_str())).map(|i| i.name.as_str()),
        );
        let got = quoted_list(req.inputs.iter().map(|i| i.name.as_str()));
        let expected = if required == config.input.len() {
            format!("expected {} inputs", config.input.len())
        } else {
            format!("expected number of inputs between {required} and {}", config.input.len())
        };
        return Err(InferError::invalid(format!(
            "{log}{expected} but got {} inputs for model '{model}'. Got input(s) {got}, but missing required input(s) {missing}. Please provide all required input(s).",
            req.inputs.len()
        )));
    }

    let batching = config.max_batch_size > 0;
    let mut batch_size: u64 = 0;
    for input in &req.inputs {
        if !config.input.iter().any(|c| c.name == input.name) {
            return Err(InferError::invalid(format!(
                "unexpected inference input '{}' for model '{model}'",
                input.name
            )));
        }
        if batching {
            let Some(&first) = input.shape.first() else {
                return Err(InferError::invalid(format!(
                    "{log}input '{}' has no shape but model requires batch dimension for '{model}'",
                    input.name
                )));
            };
            let first = u64::try_from(first).unwrap_or(u64::MAX);
            if batch_size == 0 {
                batch_size = first;
            } else if first != batch_size {
                return Err(InferError::invalid(format!(
                    "{log}input '{}' batch size does not match other inputs for '{model}'",
                    input.name
                )));
            }
        }
    }
    if batch_size > config.max_batch_size as u64 {
        return Err(InferError::invalid(format!(
            "{log}inference request batch-size must be <= {} for '{model}'",
            config.max_batch_size
        )));
    }

    for input in &req.inputs {
        let Some(cfg) = config.input.iter().find(|c| c.name == input.name) else { continue };
        let expected_type = wire_type(cfg.data_type);
        if expected_type != Some(input.datatype) {
            return Err(InferError::invalid(format!(
                "{log}inference input '{}' data-type is '{}', but model '{model}' expects '{}'",
                input.name,
                input.datatype.wire_name(),
                expected_type.map_or("INVALID", DataType::wire_name)
            )));
        }
        let shape = if batching && !cfg.is_shape_tensor { &input.shape[1..] } else { &input.shape[..] };
        let mut matches = cfg.dims.len() == shape.len();
        if matches {
            for (c, &d) in cfg.dims.iter().zip(shape) {
                if d == -1 {
                    return Err(InferError::invalid(format!(
                        "{log}All input dimensions should be specified for input '{}' for model '{model}', got {}",
                        input.name,
                        dims(&input.shape)
                    )));
                }
                if *c != -1 && *c != d {
                    matches = false;
                    break;
                }
            }
        }
        if shape.iter().any(|&d| d < 0) {
            matches = false;
        }
        if !matches {
            let mut full = Vec::new();
            let mut note = "";
            if batching {
                full.push(-1);
                note = "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size.";
            }
            full.extend_from_slice(&cfg.dims);
            return Err(InferError::invalid(format!(
                "{log}unexpected shape for input '{}' for model '{model}'. Expected {}, got {}. {note}",
                input.name,
                dims(&full),
                dims(&input.shape)
            )));
        }
        let elements = input.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        let Some(elements) = elements else {
            return Err(InferError::invalid(format!(
                "{log}shape {} of input '{}' is too large",
                dims(&input.shape),
                input.name
            )));
        };
        match input.datatype.element_size() {
            None => check_bytes(&input.data, elements, &log, &input.name, model)?,
            Some(size) => {
                let expected = elements.saturating_mul(size as u64);
                if expected != input.data.len() as u64 {
                    return Err(InferError::invalid(format!(
                        "{log}input byte size mismatch for input '{}' for model '{model}'. Expected {expected}, got {}",
                        input.name,
                        input.data.len()
                    )));
                }
            }
        }
    }
    Ok(Validated { batch_size, outputs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::InputTensor;
    use tritium_proto::inference::{ModelInput, ModelOutput};

    fn config(max_batch_size: i32) -> ModelConfig {
        let input = |name: &str, t: ConfigType, dims: Vec<i64>, optional| ModelInput {
            name: name.into(),
            data_type: t as i32,
            dims,
            optional,
            ..Default::default()
        };
        ModelConfig {
            name: "m".into(),
            max_batch_size,
            input: vec![
                input("A", ConfigType::TypeFp32, vec![4], false),
                input("B", ConfigType::TypeString, vec![-1], false),
                input("C", ConfigType::TypeInt8, vec![2], true),
            ],
            output: vec![
                ModelOutput {
                    name: "X".into(),
                    data_type: ConfigType::TypeFp32 as i32,
                    dims: vec![4],
                    ..Default::default()
                },
                ModelOutput {
                    name: "Y".into(),
                    data_type: ConfigType::TypeFp32 as i32,
                    dims: vec![4],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn t(name: &str, datatype: DataType, shape: &[i64], data: &[u8]) -> InputTensor {
        InputTensor { name: name.into(), datatype, shape: shape.to_vec(), data: bytes::Bytes::copy_from_slice(data) }
    }

    fn strings(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                let mut v = 1u32.to_le_bytes().to_vec();
                v.push(b'a' + i as u8);
                v
            })
            .collect()
    }

    fn req(inputs: Vec<InputTensor>) -> InferRequest {
        InferRequest { model: "m".into(), inputs, ..Default::default() }
    }

    #[test]
    fn good_requests_pass_with_batch_size_and_outputs() {
        let ok = validate(
            &req(vec![t("A", DataType::Fp32, &[4], &[0; 16]), t("B", DataType::Bytes, &[3], &strings(3))]),
            &config(0),
        )
        .expect("valid");
        assert_eq!(
            ok,
            Validated { batch_size: 0, outputs: vec![RequestedOutput::named("X"), RequestedOutput::named("Y")] }
        );
        let mut r = req(vec![t("A", DataType::Fp32, &[2, 4], &[0; 32]), t("B", DataType::Bytes, &[2, 1], &strings(2))]);
        r.outputs = vec![RequestedOutput { name: "Y".into(), classification: Some(2) }];
        assert_eq!(validate(&r, &config(8)).expect("valid"), Validated { batch_size: 2, outputs: r.outputs.clone() });
    }

    #[test]
    fn bad_requests_get_tritons_messages() {
        let a = || t("A", DataType::Fp32, &[4], &[0; 16]);
        let b = || t("B", DataType::Bytes, &[1], &strings(1));
        let cases: Vec<(InferRequest, i32, &str)> = vec![
            (req(vec![a()]), 0, "[request id: <id_unknown>] expected number of inputs between 2 and 3 but got 1 inputs for model 'm'. Got input(s) ['A'], but missing required input(s) ['B']. Please provide all required input(s)."),
            (req(vec![a(), t("Z", DataType::Fp32, &[4], &[0; 16])]), 0, "unexpected inference output"),
            (req(vec![t("A", DataType::Fp64, &[4], &[0; 32]), b()]), 0, "inference input 'A' data-type is 'FP64', but model 'm' expects 'FP32'"),
            (req(vec![t("A", DataType::Fp32, &[3], &[0; 12]), b()]), 0, "unexpected shape for input 'A' for model 'm'. Expected [4], got [3]. "),
            (req(vec![t("A", DataType::Fp32, &[4], &[0; 12]), b()]), 0, "input byte size mismatch for input 'A' for model 'm'. Expected 16, got 12"),
            (req(vec![a(), t("B", DataType::Bytes, &[2], &strings(1))]), 0, "expected 2 string elements for inference input 'B' for model 'm', got 1"),
            (req(vec![a(), t("B", DataType::Bytes, &[1], &[9, 0, 0, 0, b'x'])]), 0, "incomplete string data"),
            (req(vec![t("A", DataType::Fp32, &[9, 4], &[0; 144]), t("B", DataType::Bytes, &[9, 1], &strings(9))]), 8, "inference request batch-size must be <= 8 for 'm'"),
            (req(vec![t("A", DataType::Fp32, &[2, 4], &[0; 32]), t("B", DataType::Bytes, &[3, 1], &strings(3))]), 8, "input 'B' batch size does not match other inputs for 'm'"),
            (req(vec![t("A", DataType::Fp32, &[4], &[0; 16]), t("B", DataType::Bytes, &[4, 1], &strings(4))]), 8, "Expected [-1,4], got [4]. NOTE: Setting a non-zero max_batch_size"),
            (req(vec![a(), a()]), 0, "input 'A' already exists in request"),
            (req(vec![a(), t("B", DataType::Bytes, &[-1], &[])]), 0, "All input dimensions should be specified for input 'B'"),
        ];
        for (i, (mut r, mbs, expected)) in cases.into_iter().enumerate() {
            if i == 1 {
                r.inputs.push(b());
                r.inputs.remove(1);
                r.outputs = vec![RequestedOutput::named("Q")];
            }
            let err = validate(&r, &config(mbs)).expect_err(expected);
            assert!(err.message.contains(expected), "case {i}: {}", err.message);
            assert_eq!(err.kind, crate::types::ErrorKind::InvalidArg);
        }
    }

    #[test]
    fn request_ids_appear_in_messages() {
        let mut r = req(vec![]);
        r.id = "abc".into();
        assert!(validate(&r, &config(0)).expect_err("missing").message.starts_with("[request id: abc] expected"));
    }
}
