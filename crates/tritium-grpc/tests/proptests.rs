//! Property tests of the gRPC request conversion: arbitrary `ModelInferRequest`s (shapes, typed
//! and raw contents, parameters) and arbitrary protobuf bytes never panic
//! `decode_infer_request`; `BYTES` contents serialize to 4-byte little-endian length-prefixed
//! elements that parse back to the same elements.

use std::collections::HashMap;

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;
use tritium_grpc::convert::{decode_infer_request, serialize_bytes, typed_contents};
use tritium_proto::inference::infer_parameter::ParameterChoice;
use tritium_proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use tritium_proto::inference::{InferParameter, InferTensorContents, ModelInferRequest};
use tritium_server::DataType;

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() }
}

/// Splits Triton's serialized `BYTES` form back into elements, or `None` if it is malformed.
fn parse_bytes(mut data: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let (len, rest) = data.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return None;
        }
        out.push(rest[..len].to_vec());
        data = &rest[len..];
    }
    Some(out)
}

fn datatype() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(DataType::ALL.iter().map(|d| d.wire_name().to_string()).collect::<Vec<_>>()),
        "[A-Z0-9]{0,6}",
    ]
}

fn parameter() -> impl Strategy<Value = InferParameter> {
    let choice = prop_oneof![
        any::<bool>().prop_map(ParameterChoice::BoolParam),
        any::<i64>().prop_map(ParameterChoice::Int64Param),
        ".{0,8}".prop_map(ParameterChoice::StringParam),
        any::<f64>().prop_map(ParameterChoice::DoubleParam),
        any::<u64>().prop_map(ParameterChoice::Uint64Param),
    ];
    prop::option::of(choice).prop_map(|parameter_choice| InferParameter { parameter_choice })
}

fn parameters() -> impl Strategy<Value = HashMap<String, InferParameter>> {
    let key = prop_oneof![
        Just("sequence_id".to_string()),
        Just("sequence_start".to_string()),
        Just("priority".to_string()),
        Just("timeout".to_string()),
        Just("classification".to_string()),
        Just("shared_memory_region".to_string()),
        Just("shared_memory_byte_size".to_string()),
        Just("binary_data_size".to_string()),
        "[a-z_]{0,10}",
    ];
    prop::collection::hash_map(key, parameter(), 0..4)
}

fn contents() -> impl Strategy<Value = InferTensorContents> {
    let n = 0..6usize;
    (
        prop::collection::vec(any::<bool>(), n.clone()),
        prop::collection::vec(any::<i32>(), n.clone()),
        prop::collection::vec(any::<i64>(), n.clone()),
        prop::collection::vec(any::<u32>(), n.clone()),
        prop::collection::vec(any::<f32>(), n.clone()),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..8).prop_map(Bytes::from), n),
    )
        .prop_map(|(b, i, i64s, u, f, s)| InferTensorContents {
            bool_contents: b,
            int_contents: i,
            int64_contents: i64s,
            uint_contents: u,
            fp32_contents: f,
            bytes_contents: s,
            ..Default::default()
        })
}

fn input() -> impl Strategy<Value = InferInputTensor> {
    (
        "[A-Z0-9_]{0,6}",
        datatype(),
        prop::collection::vec(any::<i64>(), 0..4),
        prop::option::of(contents()),
        parameters(),
    )
        .prop_map(|(name, datatype, shape, contents, parameters)| InferInputTensor {
            name,
            datatype,
            shape,
            parameters,
            contents,
        })
}

fn request() -> impl Strategy<Value = ModelInferRequest> {
    (
        "[a-z]{0,4}",
        "[0-9a-z-]{0,3}",
        parameters(),
        prop::collection::vec(input(), 0..5),
        prop::collection::vec(("[A-Z0-9_]{0,6}", parameters()), 0..3),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..32), 0..4),
    )
        .prop_map(|(model_name, model_version, parameters, inputs, outputs, raw)| ModelInferRequest {
            model_name,
            model_version,
            id: "r".into(),
            parameters,
            inputs,
            outputs: outputs
                .into_iter()
                .map(|(name, parameters)| InferRequestedOutputTensor { name, parameters })
                .collect(),
            raw_input_contents: raw.into_iter().map(Bytes::from).collect(),
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_requests_never_panic(msg in request()) {
        let _ = decode_infer_request(msg);
    }

    #[test]
    fn arbitrary_protobuf_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(msg) = ModelInferRequest::decode(&data[..]) {
            let _ = decode_infer_request(msg);
        }
    }

    #[test]
    fn requests_survive_the_wire(msg in request()) {
        // What a client encodes is what the server decodes, and converts the same way.
        let back = ModelInferRequest::decode(msg.encode_to_vec().as_slice()).expect("decodes");
        prop_assert_eq!(decode_infer_request(back).is_ok(), decode_infer_request(msg).is_ok());
    }

    #[test]
    fn bytes_round_trip(elements in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..16)) {
        let data = serialize_bytes("I", &elements).expect("serializes");
        prop_assert_eq!(data.len(), elements.iter().map(|e| e.len() + 4).sum::<usize>());
        prop_assert_eq!(parse_bytes(&data), Some(elements.clone()));
        let contents = InferTensorContents {
            bytes_contents: elements.iter().cloned().map(Bytes::from).collect(),
            ..Default::default()
        };
        prop_assert_eq!(typed_contents("I", "m", DataType::Bytes, &contents).expect("typed"), data);
    }

    #[test]
    fn arbitrary_bytes_never_over_allocate(data in prop::collection::vec(any::<u8>(), 0..256)) {
        // A length prefix larger than what follows is refused, never trusted.
        if let Some(elements) = parse_bytes(&data) {
            prop_assert_eq!(serialize_bytes("I", &elements).expect("serializes"), data);
        }
    }
}
