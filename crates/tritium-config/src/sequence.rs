//! `sequence_batching`'s control inputs, read and checked as Triton's
//! `GetBooleanSequenceControlProperties` / `GetTypedSequenceControlProperties`
//! (`model_config_utils.cc`) do, with Triton's error texts; and what tritium refuses of it.

use crate::{
    proto::{
        model_sequence_batching::{control::Kind, Control},
        DataType, ModelSequenceBatching,
    },
    ConfigError,
};

/// A boolean control (`CONTROL_SEQUENCE_START`, `_END`, `_READY`): the input's name, its type
/// and the little-endian bytes of one element for false and for true.
#[derive(Debug, Clone, PartialEq)]
pub struct BoolControl {
    /// The input the model reads.
    pub name: String,
    /// `TYPE_INT32`, `TYPE_FP32` or `TYPE_BOOL`, from which `*_false_true` the config gives.
    pub data_type: DataType,
    /// One element meaning false.
    pub false_bytes: Vec<u8>,
    /// One element meaning true.
    pub true_bytes: Vec<u8>,
}

/// The control inputs a sequence model asks for; each is optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SequenceControls {
    /// `CONTROL_SEQUENCE_START`.
    pub start: Option<BoolControl>,
    /// `CONTROL_SEQUENCE_END`.
    pub end: Option<BoolControl>,
    /// `CONTROL_SEQUENCE_READY`.
    pub ready: Option<BoolControl>,
    /// `CONTROL_SEQUENCE_CORRID`: its input's name and `data_type` (`TYPE_UINT64`, `TYPE_INT64`,
    /// `TYPE_UINT32`, `TYPE_INT32` or `TYPE_STRING`).
    pub corrid: Option<(String, DataType)>,
}

fn kind_name(kind: Kind) -> &'static str {
    kind.as_str_name()
}

/// The controls of `batching` for model `model`, checked with Triton's rules and texts: every
/// control input named, no tensor for two kinds, no kind twice, exactly one two-entry
/// `*_false_true` for the boolean kinds and none for CORRID, CORRID of an integer or string type.
pub fn sequence_controls(batching: &ModelSequenceBatching, model: &str) -> Result<SequenceControls, ConfigError> {
    let invalid = |message: String| Err(ConfigError::Invalid(message));
    let mut seen_tensors = std::collections::HashSet::new();
    for input in &batching.control_input {
        if input.name.is_empty() {
            return invalid(format!("sequence batching control tensor must have a name for {model}"));
        }
        if !seen_tensors.insert(input.name.as_str()) {
            return invalid(format!(
                "sequence batching control tensor '{}' is specified for multiple control kinds for {model}",
                input.name
            ));
        }
    }
    let mut controls = SequenceControls::default();
    for kind in [Kind::ControlSequenceStart, Kind::ControlSequenceEnd, Kind::ControlSequenceReady] {
        let found = find(batching, kind, model)?;
        let control = match found {
            None => None,
            Some((name, c)) => Some(boolean(name, c, kind, model)?),
        };
        match kind {
            Kind::ControlSequenceStart => controls.start = control,
            Kind::ControlSequenceEnd => controls.end = control,
            _ => controls.ready = control,
        }
    }
    if let Some((name, c)) = find(batching, Kind::ControlSequenceCorrid, model)? {
        let corrid = kind_name(Kind::ControlSequenceCorrid);
        if !c.int32_false_true.is_empty() || !c.fp32_false_true.is_empty() || !c.bool_false_true.is_empty() {
            return invalid(format!(
                "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or \
                 'bool_false_true' for {corrid} for {model}"
            ));
        }
        let data_type = c.data_type();
        if !matches!(
            data_type,
            DataType::TypeUint64
                | DataType::TypeInt64
                | DataType::TypeUint32
                | DataType::TypeInt32
                | DataType::TypeString
        ) {
            return invalid(format!(
                "unexpected data type for control {corrid} for {model}. Allowed data types are TYPE_UINT64, \
                 TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
            ));
        }
        controls.corrid = Some((name.to_owned(), data_type));
    }
    Ok(controls)
}

/// The one control of `kind`, with the name of its input; Triton's error when two inputs have it.
fn find<'a>(
    batching: &'a ModelSequenceBatching,
    kind: Kind,
    model: &str,
) -> Result<Option<(&'a str, &'a Control)>, ConfigError> {
    let mut found = None;
    for input in &batching.control_input {
        for c in &input.control {
            if c.kind() != kind {
                continue;
            }
            if found.is_some() {
                return Err(ConfigError::Invalid(format!(
                    "sequence batching specifies multiple {} tensors for {model}",
                    kind_name(kind)
                )));
            }
            found = Some((input.name.as_str(), c));
        }
    }
    Ok(found)
}

fn boolean(name: &str, c: &Control, kind: Kind, model: &str) -> Result<BoolControl, ConfigError> {
    let kind = kind_name(kind);
    let given = [!c.int32_false_true.is_empty(), !c.fp32_false_true.is_empty(), !c.bool_false_true.is_empty()];
    let count = given.iter().filter(|g| **g).count();
    if count == 0 {
        return Err(ConfigError::Invalid(format!(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' \
             for {kind} for {model}"
        )));
    }
    if count > 1 {
        return Err(ConfigError::Invalid(format!(
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and \
             'bool_false_true' for {kind} for {model}"
        )));
    }
    let two = |field: &str, len: usize| {
        if len == 2 {
            Ok(())
        } else {
            Err(ConfigError::Invalid(format!(
                "sequence batching control '{field}' must have exactly 2 entries for {kind} for {model}"
            )))
        }
    };
    let (data_type, false_bytes, true_bytes) = if !c.int32_false_true.is_empty() {
        two("int32_false_true", c.int32_false_true.len())?;
        let v = &c.int32_false_true;
        (DataType::TypeInt32, v[0].to_le_bytes().to_vec(), v[1].to_le_bytes().to_vec())
    } else if !c.fp32_false_true.is_empty() {
        two("fp32_false_true", c.fp32_false_true.len())?;
        let v = &c.fp32_false_true;
        (DataType::TypeFp32, v[0].to_le_bytes().to_vec(), v[1].to_le_bytes().to_vec())
    } else {
        two("bool_false_true", c.bool_false_true.len())?;
        let v = &c.bool_false_true;
        (DataType::TypeBool, vec![u8::from(v[0])], vec![u8::from(v[1])])
    };
    Ok(BoolControl { name: name.to_owned(), data_type, false_bytes, true_bytes })
}

/// What tritium does not serve of `sequence_batching`, refused at load with why: implicit state
/// (`state`, which Triton's Python backend does not support either) and `iterative_sequence`
/// (which needs request rescheduling). Not part of [`crate::normalize()`], which accepts what
/// Triton's config rules accept.
pub fn check_supported(batching: &ModelSequenceBatching, model: &str) -> Result<(), ConfigError> {
    if let Some(state) = batching.state.first() {
        return Err(ConfigError::Invalid(format!(
            "sequence_batching.state (implicit state, here input '{}' / output '{}') is not supported for \
             model '{model}': Triton's Python backend does not support implicit state either. Keep a \
             sequence's state in the model, keyed by request.correlation_id(), and reset it on the \
             CONTROL_SEQUENCE_START control input",
            state.input_name, state.output_name
        )));
    }
    if batching.iterative_sequence {
        return Err(ConfigError::Invalid(format!(
            "sequence_batching.iterative_sequence is not supported for model '{model}': tritium does not \
             reschedule requests; remove it and send each step of the sequence as a request"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batching(text: &str) -> ModelSequenceBatching {
        let config = format!("name: \"m\" backend: \"python\" max_batch_size: 4 sequence_batching {{ {text} }}");
        let config = crate::parse_config(&config, std::path::Path::new("config.pbtxt")).expect("config parses");
        match config.scheduling_choice {
            Some(crate::proto::model_config::SchedulingChoice::SequenceBatching(b)) => b,
            other => panic!("not sequence batching: {other:?}"),
        }
    }

    fn error(text: &str) -> String {
        match sequence_controls(&batching(text), "m") {
            Err(e) => e.to_string(),
            Ok(c) => panic!("accepted: {c:?}"),
        }
    }

    #[test]
    fn each_form_of_boolean_control_gives_its_bytes() {
        let c = sequence_controls(
            &batching(
                "control_input [ \
                   { name: \"S\" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] }, \
                   { name: \"E\" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 5, 7 ] } ] }, \
                   { name: \"R\" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] }, \
                   { name: \"C\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]",
            ),
            "m",
        )
        .expect("valid");
        let start = c.start.expect("start");
        assert_eq!((start.name.as_str(), start.data_type), ("S", DataType::TypeFp32));
        assert_eq!((start.false_bytes, start.true_bytes), (0f32.to_le_bytes().to_vec(), 1f32.to_le_bytes().to_vec()));
        let end = c.end.expect("end");
        assert_eq!(
            (end.data_type, end.false_bytes, end.true_bytes),
            (DataType::TypeInt32, vec![5, 0, 0, 0], vec![7, 0, 0, 0])
        );
        let ready = c.ready.expect("ready");
        assert_eq!((ready.data_type, ready.false_bytes, ready.true_bytes), (DataType::TypeBool, vec![0], vec![1]));
        assert_eq!(c.corrid, Some(("C".to_string(), DataType::TypeString)));
        assert_eq!(sequence_controls(&batching(""), "m").expect("no controls"), SequenceControls::default());
    }

    #[test]
    fn bad_controls_get_tritons_texts() {
        let cases = [
            (
                "control_input [ { control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]",
                "sequence batching control tensor must have a name for m",
            ),
            (
                "control_input [ { name: \"A\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, \
                 { name: \"A\" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]",
                "sequence batching control tensor 'A' is specified for multiple control kinds for m",
            ),
            (
                "control_input [ { name: \"A\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, \
                 { name: \"B\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]",
                "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
            ),
            (
                "control_input [ { name: \"A\" control [ { kind: CONTROL_SEQUENCE_END } ] } ]",
                "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' \
                 for CONTROL_SEQUENCE_END for m",
            ),
            (
                "control_input [ { name: \"A\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] \
                 fp32_false_true: [ 0, 1 ] } ] } ]",
                "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and \
                 'bool_false_true' for CONTROL_SEQUENCE_READY for m",
            ),
            (
                "control_input [ { name: \"A\" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 1 ] } ] } ]",
                "sequence batching control 'fp32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m",
            ),
            (
                "control_input [ { name: \"A\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]",
                "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are TYPE_UINT64, \
                 TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
            ),
            (
                "control_input [ { name: \"A\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 \
                 int32_false_true: [ 0, 1 ] } ] } ]",
                "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or \
                 'bool_false_true' for CONTROL_SEQUENCE_CORRID for m",
            ),
        ];
        for (text, expected) in cases {
            assert!(error(text).ends_with(expected), "{text}: {}", error(text));
        }
    }

    #[test]
    fn implicit_state_and_iterative_sequences_are_refused_with_why() {
        let state = batching(
            "state [ { input_name: \"IN_STATE\" output_name: \"OUT_STATE\" data_type: TYPE_FP32 dims: [ 1 ] } ]",
        );
        let text = check_supported(&state, "m").expect_err("refused").to_string();
        assert!(text.contains("sequence_batching.state") && text.contains("'IN_STATE'"), "{text}");
        assert!(text.contains("correlation_id()"), "{text}");
        let text = check_supported(&batching("iterative_sequence: true"), "m").expect_err("refused").to_string();
        assert!(text.contains("iterative_sequence is not supported"), "{text}");
        assert!(check_supported(&batching("max_sequence_idle_microseconds: 5"), "m").is_ok());
    }
}
