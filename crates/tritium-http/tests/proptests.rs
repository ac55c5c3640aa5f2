//! Property tests of the HTTP codec: arbitrary bodies and header lengths never panic the
//! inference-request decoder (JSON and binary tensor data); requests built from random tensors
//! decode to exactly their bytes; `BYTES` tensors (4-byte little-endian length before each
//! element) survive encode and decode, and arbitrary bytes given as `BYTES` never panic.

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{json, Value};
use tritium_http::codec::{decode_infer_request, encode_infer_response, serialize_bytes, OutputSpecs};
use tritium_server::{DataType, InferResponse, OutputTensor};

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() }
}

/// A random tensor: its JSON `data` elements and its raw little-endian bytes.
#[derive(Debug, Clone)]
struct Tensor {
    dtype: DataType,
    json: Vec<Value>,
    raw: Vec<u8>,
}

fn tensor() -> impl Strategy<Value = Tensor> {
    let n = 0..24usize;
    prop_oneof![
        prop::collection::vec(any::<bool>(), n.clone()).prop_map(|v| Tensor {
            dtype: DataType::Bool,
            json: v.iter().map(|b| json!(b)).collect(),
            raw: v.iter().map(|&b| u8::from(b)).collect(),
        }),
        prop::collection::vec(any::<u8>(), n.clone()).prop_map(|v| Tensor {
            dtype: DataType::Uint8,
            json: v.iter().map(|b| json!(b)).collect(),
            raw: v.clone(),
        }),
        prop::collection::vec(any::<i16>(), n.clone()).prop_map(|v| Tensor {
            dtype: DataType::Int16,
            json: v.iter().map(|b| json!(b)).collect(),
            raw: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }),
        prop::collection::vec(any::<u32>(), n.clone()).prop_map(|v| Tensor {
            dtype: DataType::Uint32,
            json: v.iter().map(|b| json!(b)).collect(),
            raw: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }),
        prop::collection::vec(any::<i64>(), n.clone()).prop_map(|v| Tensor {
            dtype: DataType::Int64,
            json: v.iter().map(|b| json!(b)).collect(),
            raw: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }),
        prop::collection::vec(any::<u64>(), n.clone()).prop_map(|v| Tensor {
            dtype: DataType::Uint64,
            json: v.iter().map(|b| json!(b)).collect(),
            raw: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }),
        prop::collection::vec(-1.0e6f32..1.0e6, n.clone()).prop_map(|v| Tensor {
            dtype: DataType::Fp32,
            json: v.iter().map(|b| json!(b)).collect(),
            raw: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }),
        prop::collection::vec(any::<f64>().prop_filter("finite", |f| f.is_finite()), n.clone()).prop_map(|v| {
            Tensor {
                dtype: DataType::Fp64,
                json: v.iter().map(|b| json!(b)).collect(),
                raw: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            }
        }),
        prop::collection::vec(".{0,12}", n).prop_map(|v| Tensor {
            dtype: DataType::Bytes,
            json: v.iter().map(|s| json!(s)).collect(),
            raw: serialize_bytes(&v),
        }),
    ]
}

/// A request of random tensors, each sent as JSON data or as binary data; returns the body,
/// the header length (when binary data follows) and the expected bytes of each input.
fn build(tensors: &[(Tensor, bool, bool)]) -> (Vec<u8>, Option<usize>) {
    let mut binary = Vec::new();
    let mut inputs = Vec::new();
    for (i, (t, as_binary, nested)) in tensors.iter().enumerate() {
        let n = t.json.len();
        let mut input = json!({"name": format!("IN{i}"), "datatype": t.dtype.wire_name(), "shape": [n]});
        if *as_binary {
            input["parameters"] = json!({"binary_data_size": t.raw.len()});
            binary.extend_from_slice(&t.raw);
        } else if *nested && n % 2 == 0 && n > 0 {
            // Triton accepts nested arrays and flattens them in order.
            input["shape"] = json!([n / 2, 2]);
            input["data"] = Value::Array(t.json.chunks(2).map(|c| Value::Array(c.to_vec())).collect());
        } else {
            input["data"] = Value::Array(t.json.clone());
        }
        inputs.push(input);
    }
    let header = serde_json::to_vec(&json!({"inputs": inputs})).expect("json");
    let header_len = (!binary.is_empty()).then_some(header.len());
    let mut body = header;
    body.extend_from_slice(&binary);
    (body, header_len)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..512), header in prop::option::of(0usize..600)) {
        let header = header.map(|h| h.min(body.len()));
        let _ = decode_infer_request("m", None, Bytes::from(body), header);
    }

    #[test]
    fn json_like_bodies_never_panic(
        prefix in r#"\{"inputs":\[\{"name":"I","datatype":"(INT8|UINT64|FP32|BYTES|BOOL|FP16)","shape":\[[0-9,]{0,8}\],"#,
        tail in r#"("data":[\[\]0-9,.eE"a-z\-]{0,40}|"parameters":\{"binary_data_size":[0-9]{1,3}\})\}\]\}"#,
        binary in prop::collection::vec(any::<u8>(), 0..64),
        with_header in any::<bool>(),
    ) {
        let mut body = format!("{prefix}{tail}").into_bytes();
        let header = with_header.then_some(body.len());
        body.extend_from_slice(&binary);
        let _ = decode_infer_request("m", None, Bytes::from(body), header);
    }

    #[test]
    fn random_tensors_round_trip(tensors in prop::collection::vec((tensor(), any::<bool>(), any::<bool>()), 1..6)) {
        let (body, header_len) = build(&tensors);
        let decoded = decode_infer_request("m", Some(1), Bytes::from(body), header_len).expect("a valid request");
        prop_assert_eq!(decoded.request.inputs.len(), tensors.len());
        for (input, (t, _, _)) in decoded.request.inputs.iter().zip(&tensors) {
            prop_assert_eq!(input.datatype, t.dtype);
            prop_assert_eq!(&input.data[..], &t.raw[..], "input {}", input.name);
        }
    }

    #[test]
    fn bytes_tensors_round_trip(elements in prop::collection::vec(".{0,16}", 0..16)) {
        let data = serialize_bytes(&elements);
        prop_assert_eq!(data.len(), elements.iter().map(|e| e.len() + 4).sum::<usize>());
        let response = InferResponse {
            model: "m".into(),
            version: 1,
            id: String::new(),
            outputs: vec![OutputTensor { name: "O".into(), datatype: DataType::Bytes, shape: vec![elements.len() as i64], data }],
            parameters: Vec::new(),
        };
        let encoded = encode_infer_response(response, &OutputSpecs::default()).expect("encodes");
        let v: Value = serde_json::from_slice(&encoded.json).expect("valid JSON");
        let back: Vec<String> =
            v["outputs"][0]["data"].as_array().expect("data").iter().map(|s| s.as_str().expect("a string").to_string()).collect();
        prop_assert_eq!(back, elements);
    }

    #[test]
    fn arbitrary_bytes_as_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..256), count in 0i64..64) {
        let response = InferResponse {
            model: "m".into(),
            version: 1,
            id: String::new(),
            outputs: vec![OutputTensor { name: "O".into(), datatype: DataType::Bytes, shape: vec![count], data: data.clone() }],
            parameters: Vec::new(),
        };
        if let Ok(encoded) = encode_infer_response(response, &OutputSpecs::default()) {
            // Never more JSON than escaping every byte could take.
            prop_assert!(encoded.json.len() <= 256 + data.len() * 6 + count as usize * 3);
        }
    }
}
