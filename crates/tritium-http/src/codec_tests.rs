//! Unit tests of the inference codec: every dtype in JSON and binary, nested lists, BYTES,
//! mixed outputs, wrong counts and sizes, parameters, the classification parameter, raw requests.

#![allow(clippy::unwrap_used)]

use super::json_data::{convert_leaves, expected_elements, JsonDataError};
use super::*;
use serde_json::json;
use tritium_server::{ErrorKind, OutputTensor, TensorMetadata, FLAG_SEQUENCE_END, FLAG_SEQUENCE_START};

fn decode_json(v: Value) -> Result<DecodedRequest, InferError> {
    decode_infer_request("m", None, Bytes::from(v.to_string()), None)
}

fn decode_ok(v: Value) -> DecodedRequest {
    match decode_json(v) {
        Ok(d) => d,
        Err(e) => panic!("decode failed: {}", e.message),
    }
}

fn decode_err(v: Value) -> InferError {
    match decode_json(v) {
        Ok(_) => panic!("decode unexpectedly succeeded"),
        Err(e) => e,
    }
}

/// A body of `header` JSON followed by `blobs`, and the header length.
fn binary_body(header: Value, blobs: &[&[u8]]) -> (Bytes, usize) {
    let mut body = header.to_string().into_bytes();
    let len = body.len();
    for b in blobs {
        body.extend_from_slice(b);
    }
    (Bytes::from(body), len)
}

fn one_input(datatype: &str, shape: Value, data: Value) -> Value {
    json!({"inputs": [{"name": "IN", "datatype": datatype, "shape": shape, "data": data}]})
}

fn input_bytes(datatype: &str, shape: Value, data: Value) -> Vec<u8> {
    decode_ok(one_input(datatype, shape, data)).request.inputs[0].data.to_vec()
}

fn le<T, const N: usize>(values: &[T], f: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(f).collect()
}

#[test]
fn json_inputs_of_every_dtype() {
    assert_eq!(input_bytes("BOOL", json!([3]), json!([true, false, true])), vec![1, 0, 1]);
    assert_eq!(input_bytes("UINT8", json!([2]), json!([0, 255])), vec![0, 255]);
    assert_eq!(input_bytes("UINT16", json!([2]), json!([1, 65535])), le(&[1u16, 65535], |v| v.to_le_bytes()));
    assert_eq!(
        input_bytes("UINT32", json!([2]), json!([7, 4294967295u64])),
        le(&[7u32, u32::MAX], |v| v.to_le_bytes())
    );
    assert_eq!(input_bytes("UINT64", json!([1]), json!([u64::MAX])), u64::MAX.to_le_bytes().to_vec());
    assert_eq!(input_bytes("INT8", json!([2]), json!([-128, 127])), le(&[-128i8, 127], |v| v.to_le_bytes()));
    assert_eq!(input_bytes("INT16", json!([2]), json!([-32768, 5])), le(&[-32768i16, 5], |v| v.to_le_bytes()));
    assert_eq!(input_bytes("INT32", json!([2]), json!([-1, 2147483647])), le(&[-1i32, i32::MAX], |v| v.to_le_bytes()));
    assert_eq!(input_bytes("INT64", json!([2]), json!([i64::MIN, 3])), le(&[i64::MIN, 3], |v| v.to_le_bytes()));
    assert_eq!(input_bytes("FP32", json!([3]), json!([1.5, -2, 0.1])), le(&[1.5f32, -2.0, 0.1], |v| v.to_le_bytes()));
    assert_eq!(input_bytes("FP64", json!([2]), json!([0.1, 3])), le(&[0.1f64, 3.0], |v| v.to_le_bytes()));
    assert_eq!(
        input_bytes("BYTES", json!([3]), json!(["héllo", "", "日本語 😀"])),
        serialize_bytes(["héllo", "", "日本語 😀"])
    );
}

#[test]
fn nested_lists_are_flattened_in_row_major_order() {
    let nested = input_bytes("INT32", json!([2, 3]), json!([[1, 2, 3], [4, 5, 6]]));
    let flat = input_bytes("INT32", json!([2, 3]), json!([1, 2, 3, 4, 5, 6]));
    assert_eq!(nested, flat);
    assert_eq!(nested, le(&[1i32, 2, 3, 4, 5, 6], |v| v.to_le_bytes()));
    // As Triton, only the leaf count is checked, not the nesting.
    assert_eq!(input_bytes("INT32", json!([2, 3]), json!([[1], [2, 3, [4, 5]], 6])), flat);
    assert_eq!(input_bytes("BYTES", json!([2, 1]), json!([["a"], ["ü"]])), serialize_bytes(["a", "ü"]));
}

#[test]
fn request_fields() {
    // Written out by hand: `json!` would sort the keys, and the order is what is checked.
    let body = r#"{
        "id": "req-7",
        "parameters": {
            "sequence_id": 42, "sequence_start": true, "sequence_end": false,
            "timeout": 1500, "priority": 2, "binary_data_output": true,
            "zeta": "s", "alpha": 3, "flag": true, "ratio": 0.5, "big": 18446744073709551615
        },
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}],
        "outputs": [{"name": "A"}, {"name": "B", "parameters": {"binary_data": false}}, {"name": "C", "parameters": {"classification": 3}}]
    }"#;
    let d = decode_infer_request("m", None, Bytes::from(body), None).unwrap();
    let r = &d.request;
    assert_eq!(r.model, "m");
    assert_eq!(r.id, "req-7");
    assert_eq!(r.correlation_id, CorrelationId::U64(42));
    assert_eq!(r.flags, FLAG_SEQUENCE_START);
    assert_eq!((r.timeout_us, r.priority), (1500, 2));
    assert_eq!(
        r.outputs,
        vec![
            RequestedOutput::named("A"),
            RequestedOutput::named("B"),
            RequestedOutput { name: "C".into(), classification: Some(3), shm: None }
        ]
    );
    // The frontend's own parameters are removed; the rest keep the client's order.
    let names: Vec<&str> = r.parameters.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, vec!["zeta", "alpha", "flag", "ratio", "big"]);
    assert_eq!(r.parameters[0].1, ParamValue::Str("s".into()));
    assert_eq!(r.parameters[1].1, ParamValue::Int(3));
    assert_eq!(r.parameters[2].1, ParamValue::Bool(true));
    assert_eq!(r.parameters[3].1, ParamValue::Double(0.5));
    assert_eq!(r.parameters[4].1, ParamValue::Double(u64::MAX as f64));
    assert!(d.outputs.default_binary);
    // Listed outputs use their own setting, unlisted ones the request default.
    assert_eq!(d.outputs.format_for("A"), OutputFormat { binary: false, shm: false });
    assert_eq!(d.outputs.format_for("B"), OutputFormat { binary: false, shm: false });
    assert_eq!(d.outputs.format_for("C"), OutputFormat { binary: false, shm: false });
    assert_eq!(d.outputs.format_for("other"), OutputFormat { binary: true, shm: false });
}

#[test]
fn sequence_ids_and_flags() {
    let with = |params: Value| {
        let mut req = one_input("INT32", json!([1]), json!([1]));
        req["parameters"] = params;
        decode_ok(req).request
    };
    let r = with(json!({"sequence_id": "abc", "sequence_start": false, "sequence_end": true}));
    assert_eq!(r.correlation_id, CorrelationId::Str("abc".into()));
    assert_eq!(r.flags, FLAG_SEQUENCE_END);
    let r = with(json!({"sequence_id": 0, "sequence_start": true, "sequence_end": true}));
    assert_eq!(r.correlation_id, CorrelationId::None);
    assert_eq!(r.flags, FLAG_SEQUENCE_START | FLAG_SEQUENCE_END);
    let r = with(json!({}));
    assert_eq!((r.correlation_id, r.flags, r.timeout_us), (CorrelationId::None, 0, 0));

    let bad = |params: Value| {
        let mut req = one_input("INT32", json!([1]), json!([1]));
        req["parameters"] = params;
        decode_err(req).message
    };
    assert!(bad(json!({"sequence_id": -1})).starts_with("Unable to parse 'sequence_id'"));
    assert!(bad(json!({"sequence_start": 1})).starts_with("Unable to parse 'sequence_start'"));
    assert!(bad(json!({"timeout": "10"})).starts_with("Unable to parse 'timeout'"));
    assert!(bad(json!({"binary_data_output": "yes"})).starts_with("Unable to parse 'binary_data_output'"));
    assert_eq!(
        bad(json!({"triton_enable_empty_final_response": true})),
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
    );
    assert_eq!(
        bad(json!({"obj": {"a": 1}})),
        "parameter 'obj' has invalid type. It should be either 'int', 'bool', or 'string'."
    );
    assert!(bad(json!([1, 2])).starts_with("failed to parse the request JSON buffer"));
}

#[test]
fn wrong_element_counts() {
    for (shape, data, got) in [
        (json!([2, 3]), json!([1, 2, 3, 4, 5]), 5),
        (json!([2, 2]), json!([[1, 2], [3, 4], [5]]), 5),
        (json!([4]), json!([]), 0),
    ] {
        let e = decode_err(one_input("FP32", shape.clone(), data));
        assert_eq!(e.kind, ErrorKind::InvalidArg);
        assert!(e.message.contains("shape does not match true shape of 'data' field"), "{}", e.message);
        assert!(e.message.contains(&format!("but 'data' has {got}")), "{}", e.message);
    }
    let e = decode_err(one_input("BYTES", json!([3]), json!(["a", "b"])));
    assert!(e.message.contains("shape [3] has 3 elements, but 'data' has 2"), "{}", e.message);
    // A tensor with no elements ignores 'data', as Triton does.
    assert!(input_bytes("FP32", json!([0, 3]), json!([1.0])).is_empty());
    // A scalar (empty shape) has one element.
    assert_eq!(input_bytes("INT64", json!([]), json!([9])), 9i64.to_le_bytes().to_vec());
}

#[test]
fn wrong_element_types_and_ranges() {
    let msg = |dtype: &str, data: Value| decode_err(one_input(dtype, json!([1]), data)).message;
    assert!(msg("BOOL", json!([1])).contains("expected a boolean for BOOL, got 1"));
    assert!(msg("INT32", json!([1.5])).contains("expected a signed integer for INT32, got 1.5"));
    assert!(msg("INT8", json!([128])).contains("128 is out of range for INT8"));
    assert!(msg("UINT8", json!([-1])).contains("expected an unsigned integer for UINT8, got -1"));
    assert!(msg("UINT16", json!([70000])).contains("out of range for UINT16"));
    assert!(msg("FP32", json!(["x"])).contains("expected a number for FP32"));
    assert!(msg("BYTES", json!([5])).contains("expected a string for BYTES, got 5"));
    assert!(msg("INT32", json!(5)).contains("Unable to parse 'data' of input 'IN': expected an array"));
    assert!(msg("INT32", json!([null])).contains("element 0"));
    assert_eq!(
        msg("FP16", json!([1.0])),
        "receiving FP16 data via JSON is not supported. Please use the binary data format for input IN"
    );
    assert_eq!(
        msg("BF16", json!([1.0])),
        "receiving BF16 data via JSON is not supported. Please use the binary data format for input IN"
    );
    assert!(msg("FLOAT", json!([1.0])).starts_with("invalid datatype for input 'IN': 'FLOAT'"));
}

#[test]
fn malformed_requests() {
    let e = decode_infer_request("m", None, Bytes::from_static(b"{not json"), None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArg);
    assert!(e.message.starts_with("failed to parse the request JSON buffer: "), "{}", e.message);
    let e = decode_infer_request("m", None, Bytes::new(), None).unwrap_err();
    assert!(e.message.contains("request body is empty"), "{}", e.message);

    assert!(decode_err(json!({})).message.contains("no 'inputs' array"));
    assert!(decode_err(json!({"inputs": {}})).message.starts_with("Unable to parse 'inputs'"));
    assert!(decode_err(json!({"id": 5, "inputs": []})).message.starts_with("Unable to parse 'id'"));
    let e = decode_err(json!({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1]}]}));
    assert_eq!(
        e.message,
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set"
    );
    let e = decode_err(
        json!({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1], "parameters": {"binary_data_size": 4}}]}),
    );
    assert!(e.message.ends_with("But set 'data' 'binary_data_size'"), "{}", e.message);
    let e = decode_err(json!({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [-1], "data": [1]}]}));
    assert!(e.message.starts_with("Unable to parse 'shape' of input 'IN'"), "{}", e.message);
    let e = decode_err(json!({"inputs": [{"datatype": "INT32", "shape": [1], "data": [1]}]}));
    assert!(e.message.starts_with("Unable to parse 'name'"), "{}", e.message);
    let e = decode_err(
        json!({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [4294967296u64, 4294967296u64], "data": [1]}]}),
    );
    assert!(e.message.contains("causes total element count to exceed maximum size"), "{}", e.message);

    let mut deep = json!([1]);
    for _ in 0..MAX_JSON_DEPTH {
        deep = json!([deep]);
    }
    // serde_json refuses documents nested deeper than 128 levels; 100 is Triton's data limit.
    let e = decode_err(one_input("INT32", json!([1]), deep));
    assert!(e.message.contains("nesting depth exceeds maximum allowed limit (100)"), "{}", e.message);
}

#[test]
fn shared_memory_parameters_are_parsed_with_tritons_checks() {
    let d = decode_ok(json!({
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "parameters": {"shared_memory_region": "r0", "shared_memory_offset": 8, "shared_memory_byte_size": 4}}],
        "outputs": [{"name": "O", "parameters": {"shared_memory_region": "r1", "shared_memory_byte_size": 16}}, {"name": "P"}]
    }));
    assert_eq!(
        d.shm,
        [
            ShmRef { output: false, index: 0, region: "r0".into(), offset: 8, byte_size: 4 },
            ShmRef { output: true, index: 0, region: "r1".into(), offset: 0, byte_size: 16 },
        ]
    );
    assert!(d.request.inputs[0].data.is_empty(), "resolved later, against the registry");
    assert_eq!(d.outputs.format_for("O"), OutputFormat { binary: false, shm: true });
    assert_eq!(d.outputs.format_for("P"), OutputFormat { binary: false, shm: false });
    let e = decode_err(
        json!({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "parameters": {"shared_memory_region": 3}}]}),
    );
    assert_eq!(e.message, "Unable to parse 'shared_memory_region'");
    let e = decode_err(
        json!({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "parameters": {"shared_memory_region": "r", "shared_memory_offset": -1}}]}),
    );
    assert_eq!(e.message, "Unable to parse 'shared_memory_offset'");
    let mut req = one_input("INT32", json!([1]), json!([1]));
    req["outputs"] =
        json!([{"name": "O", "parameters": {"shared_memory_region": "r1", "shared_memory_byte_size": "4"}}]);
    assert_eq!(decode_err(req.clone()).message, "Unable to parse 'shared_memory_byte_size'");
    req["outputs"] = json!([{"name": "O", "parameters": {"shared_memory_region": "r1", "classification": 2}}]);
    assert_eq!(decode_err(req.clone()).message, "Output can't set both 'shared_memory_region' and 'classification'");
    req["outputs"] = json!([{"name": "O", "parameters": {"shared_memory_region": "r1", "binary_data": true}}]);
    assert_eq!(decode_err(req).message, "Output can't set both 'shared_memory_region' and 'binary_data'");
}

#[test]
fn outputs_in_shared_memory_are_named_without_data() {
    let resp = InferResponse {
        model: "m".into(),
        version: 1,
        id: String::new(),
        outputs: vec![OutputTensor { name: "O".into(), datatype: DataType::Fp32, shape: vec![2], data: Vec::new() }],
        parameters: Vec::new(),
    };
    let specs =
        OutputSpecs { default_binary: false, requested: vec![("O".into(), OutputFormat { binary: false, shm: true })] };
    let encoded = encode_infer_response(resp, &specs).expect("encode");
    assert!(!encoded.has_binary());
    assert_eq!(
        String::from_utf8(encoded.json).expect("utf8"),
        r#"{"model_name":"m","model_version":"1","outputs":[{"name":"O","datatype":"FP32","shape":[2]}]}"#
    );
}

#[test]
fn output_spec_errors() {
    let mut req = one_input("INT32", json!([1]), json!([1]));
    req["outputs"] = json!([{"name": "O", "parameters": {"binary_data": 1}}]);
    assert!(decode_err(req.clone()).message.starts_with("Unable to parse 'binary_data' of output 'O'"));
    req["outputs"] = json!([{"name": "O", "parameters": {"classification": -2}}]);
    assert!(decode_err(req.clone()).message.starts_with("Unable to set 'classification' of output 'O'"));
    req["outputs"] = json!({"name": "O"});
    assert!(decode_err(req.clone()).message.starts_with("Unable to parse 'outputs'"));
    req["outputs"] = json!([{"parameters": {}}]);
    assert!(decode_err(req).message.starts_with("Unable to parse 'name'"));
}

#[test]
fn non_finite_json_numbers() {
    let mut body = one_input("FP32", json!([3]), json!([0])).to_string();
    body = body.replace("[0]", "[NaN, Infinity, -Infinity]");
    let d = decode_infer_request("m", None, Bytes::from(body), None).unwrap();
    let v: Vec<f32> =
        d.request.inputs[0].data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert!(v[0].is_nan());
    assert_eq!(&v[1..], &[f32::INFINITY, f32::NEG_INFINITY]);
    // Inside strings the words are left alone; for integer types they are an error.
    let body = r#"{"inputs":[{"name":"NaN Infinity","datatype":"INT32","shape":[1],"data":[NaN]}]}"#;
    let e = decode_infer_request("m", None, Bytes::from(body), None).unwrap_err();
    assert!(e.message.contains("input 'NaN Infinity'") && e.message.contains("got NaN"), "{}", e.message);
}

#[test]
fn binary_inputs_of_every_dtype_are_zero_copy_slices() {
    let dtypes = [
        ("BOOL", 1),
        ("UINT8", 1),
        ("UINT16", 2),
        ("UINT32", 4),
        ("UINT64", 8),
        ("INT8", 1),
        ("INT16", 2),
        ("INT32", 4),
        ("INT64", 8),
        ("FP16", 2),
        ("BF16", 2),
        ("FP32", 4),
        ("FP64", 8),
    ];
    let mut inputs = Vec::new();
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    for (i, (dt, size)) in dtypes.iter().enumerate() {
        let blob: Vec<u8> = (0..3 * size).map(|b| (b + i) as u8).collect();
        inputs.push(json!({"name": format!("I{i}"), "datatype": dt, "shape": [3], "parameters": {"binary_data_size": blob.len()}}));
        blobs.push(blob);
    }
    let strings = serialize_bytes([&b"\xff\x00raw"[..], b"", "ü".as_bytes()]);
    inputs.push(
        json!({"name": "S", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": strings.len()}}),
    );
    blobs.push(strings);
    // A JSON input in between binary ones does not consume binary data.
    inputs.insert(3, json!({"name": "J", "datatype": "INT16", "shape": [1], "data": [7]}));
    let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    let (body, hlen) = binary_body(json!({"inputs": inputs}), &refs);
    let range = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
    let d = decode_infer_request("m", Some(2), body.clone(), Some(hlen)).unwrap();
    assert_eq!(d.request.version, Some(2));
    let binary: Vec<&InputTensor> = d.request.inputs.iter().filter(|i| i.name != "J").collect();
    assert_eq!(binary.len(), blobs.len());
    for (input, blob) in binary.iter().zip(&blobs) {
        assert_eq!(&input.data[..], &blob[..], "{}", input.name);
        assert!(range.contains(&(input.data.as_ptr() as usize)), "{} was copied", input.name);
    }
    assert_eq!(d.request.inputs[3].name, "J");
    assert_eq!(&d.request.inputs[3].data[..], &7i16.to_le_bytes());
    assert_eq!(d.request.inputs.last().unwrap().datatype, DataType::Bytes);
}

#[test]
fn binary_sizes_must_match_the_body() {
    let header = json!({"inputs": [
        {"name": "A", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
        {"name": "B", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}
    ]});
    let (body, hlen) = binary_body(header.clone(), &[&[0; 10]]);
    let e = decode_infer_request("m", None, body, Some(hlen)).unwrap_err();
    assert_eq!(e.message, "unexpected size for input 'B', expecting 2 additional bytes for model 'm'");
    let (body, hlen) = binary_body(header.clone(), &[&[0; 13]]);
    let e = decode_infer_request("m", None, body, Some(hlen)).unwrap_err();
    assert!(e.message.starts_with("unexpected additional input data for model 'm'"), "{}", e.message);
    // Binary data sizes without the header length: the JSON would swallow the data.
    let e = decode_json(header).unwrap_err();
    assert!(e.message.contains("has no Inference-Header-Content-Length header"), "{}", e.message);
    // binary_data_size 0 needs neither.
    let d = decode_ok(
        json!({"inputs": [{"name": "E", "datatype": "FP32", "shape": [0], "parameters": {"binary_data_size": 0}}]}),
    );
    assert!(d.request.inputs[0].data.is_empty());
    let e = decode_err(
        json!({"inputs": [{"name": "E", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": "4"}}]}),
    );
    assert!(e.message.starts_with("Unable to parse 'binary_data_size' of input 'E'"), "{}", e.message);
}

#[test]
fn header_length_parsing() {
    assert_eq!(parse_header_length("12", 20).unwrap(), 12);
    assert_eq!(parse_header_length(" 20 ", 20).unwrap(), 20);
    assert_eq!(parse_header_length("0", 20).unwrap(), 0);
    let e = parse_header_length("abc", 20).unwrap_err();
    assert!(e.message.starts_with("Unable to parse Inference-Header-Content-Length, got: abc"), "{}", e.message);
    assert_eq!(
        parse_header_length("21", 20).unwrap_err().message,
        "inference header size should be in range (0, 20), got: 21"
    );
    assert_eq!(
        parse_header_length("-1", 20).unwrap_err().message,
        "inference header size should be in range (0, 20), got: -1"
    );
    // A header length that cuts the JSON short is a JSON error.
    let (body, hlen) = binary_body(one_input("INT32", json!([1]), json!([1])), &[]);
    let e = decode_infer_request("m", None, body, Some(hlen - 3)).unwrap_err();
    assert!(e.message.starts_with("failed to parse the request JSON buffer"), "{}", e.message);
}

#[test]
fn gzip_and_deflate_bodies() {
    use crate::compression::{compress, decompress, Encoding};
    let header = json!({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}},
        {"name": "B", "datatype": "BYTES", "shape": [1], "data": ["çà"]}
    ]});
    let (plain, hlen) = binary_body(header, &[&le(&[5i32, -5], |v| v.to_le_bytes())]);
    for enc in [Encoding::Gzip, Encoding::Deflate] {
        let packed = compress(enc, &[&plain]).unwrap();
        let body = Bytes::from(decompress(enc, &packed, 1 << 20).unwrap());
        let d = decode_infer_request("m", None, body, Some(hlen)).unwrap();
        assert_eq!(&d.request.inputs[0].data[..], &le(&[5i32, -5], |v| v.to_le_bytes())[..]);
        assert_eq!(&d.request.inputs[1].data[..], &serialize_bytes(["çà"])[..]);
    }
}

fn out(name: &str, datatype: DataType, shape: Vec<i64>, data: Vec<u8>) -> OutputTensor {
    OutputTensor { name: name.into(), datatype, shape, data }
}

fn response(outputs: Vec<OutputTensor>) -> InferResponse {
    InferResponse { model: "m".into(), version: 3, id: String::new(), outputs, parameters: Vec::new() }
}

fn encode_json(outputs: Vec<OutputTensor>) -> Value {
    let enc = encode_infer_response(response(outputs), &OutputSpecs::default()).unwrap();
    assert!(!enc.has_binary());
    assert_eq!(enc.content_type(), "application/json");
    serde_json::from_slice(&enc.json).unwrap()
}

#[test]
fn json_outputs_of_every_dtype() {
    let v = encode_json(vec![
        out("bool", DataType::Bool, vec![2], vec![1, 0]),
        out("u8", DataType::Uint8, vec![2], vec![0, 255]),
        out("u16", DataType::Uint16, vec![1], le(&[65535u16], |v| v.to_le_bytes())),
        out("u32", DataType::Uint32, vec![1], le(&[u32::MAX], |v| v.to_le_bytes())),
        out("u64", DataType::Uint64, vec![1], le(&[u64::MAX], |v| v.to_le_bytes())),
        out("i8", DataType::Int8, vec![2], le(&[-128i8, 127], |v| v.to_le_bytes())),
        out("i16", DataType::Int16, vec![1], le(&[-300i16], |v| v.to_le_bytes())),
        out("i32", DataType::Int32, vec![2, 1], le(&[-1i32, 7], |v| v.to_le_bytes())),
        out("i64", DataType::Int64, vec![1], le(&[i64::MIN], |v| v.to_le_bytes())),
        out("f32", DataType::Fp32, vec![2], le(&[0.5f32, -3.25], |v| v.to_le_bytes())),
        out("f64", DataType::Fp64, vec![1], le(&[0.1f64], |v| v.to_le_bytes())),
        out("s", DataType::Bytes, vec![2], serialize_bytes(["a\"b", "ñ"])),
        out("empty", DataType::Fp32, vec![0, 4], vec![]),
    ]);
    assert_eq!(v["model_name"], "m");
    assert_eq!(v["model_version"], "3");
    assert!(v.get("id").is_none(), "an empty id is omitted");
    assert!(v.get("parameters").is_none());
    let o = &v["outputs"];
    assert_eq!(o[0], json!({"name": "bool", "datatype": "BOOL", "shape": [2], "data": [true, false]}));
    assert_eq!(o[1]["data"], json!([0, 255]));
    assert_eq!(o[2]["data"], json!([65535]));
    assert_eq!(o[3]["data"], json!([4294967295u64]));
    assert_eq!(o[4]["data"], json!([u64::MAX]));
    assert_eq!(o[5]["data"], json!([-128, 127]));
    assert_eq!(o[6]["data"], json!([-300]));
    assert_eq!(o[7], json!({"name": "i32", "datatype": "INT32", "shape": [2, 1], "data": [-1, 7]}));
    assert_eq!(o[8]["data"], json!([i64::MIN]));
    assert_eq!(o[9]["data"], json!([0.5, -3.25]));
    assert_eq!(o[10]["data"], json!([0.1]));
    assert_eq!(o[11], json!({"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a\"b", "ñ"]}));
    assert_eq!(o[12]["data"], json!([]));
}

#[test]
fn response_header_fields_and_order() {
    let mut resp = response(vec![out("O", DataType::Int32, vec![1], le(&[4i32], |v| v.to_le_bytes()))]);
    resp.id = "r1".into();
    resp.parameters = vec![
        ("s".into(), ParamValue::Str("x".into())),
        ("i".into(), ParamValue::Int(-2)),
        ("b".into(), ParamValue::Bool(true)),
        ("d".into(), ParamValue::Double(1.5)),
    ];
    let enc = encode_infer_response(resp, &OutputSpecs::default()).unwrap();
    assert_eq!(
        String::from_utf8(enc.json).unwrap(),
        r#"{"id":"r1","model_name":"m","model_version":"3","parameters":{"s":"x","i":-2,"b":true,"d":1.5},"outputs":[{"name":"O","datatype":"INT32","shape":[1],"data":[4]}]}"#
    );
}

#[test]
fn binary_and_json_outputs_mixed() {
    let a = le(&[1.0f32, 2.0], |v| v.to_le_bytes());
    let c = serialize_bytes([&b"\xfe\xff"[..], b"x"]);
    let specs = OutputSpecs {
        default_binary: false,
        requested: vec![
            ("A".into(), OutputFormat { binary: true, shm: false }),
            ("B".into(), OutputFormat { binary: false, shm: false }),
            ("C".into(), OutputFormat { binary: true, shm: false }),
            ("Z".into(), OutputFormat { binary: true, shm: false }),
        ],
    };
    let enc = encode_infer_response(
        response(vec![
            out("A", DataType::Fp32, vec![2], a.clone()),
            out("B", DataType::Int8, vec![1], vec![0xff]),
            out("Z", DataType::Fp16, vec![0], vec![]),
            out("C", DataType::Bytes, vec![2], c.clone()),
        ]),
        &specs,
    )
    .unwrap();
    assert!(enc.has_binary());
    assert_eq!(enc.content_type(), "application/octet-stream");
    // Zero-size binary outputs report their size but add no buffer.
    assert_eq!(enc.binary, vec![Bytes::from(a.clone()), Bytes::from(c.clone())]);
    let v: Value = serde_json::from_slice(&enc.json).unwrap();
    assert_eq!(
        v["outputs"][0],
        json!({"name": "A", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}})
    );
    assert_eq!(v["outputs"][1], json!({"name": "B", "datatype": "INT8", "shape": [1], "data": [-1]}));
    assert_eq!(v["outputs"][2]["parameters"]["binary_data_size"], 0);
    assert_eq!(v["outputs"][3]["parameters"]["binary_data_size"], c.len());
    let body = enc.to_vec();
    assert_eq!(body.len(), enc.len());
    assert_eq!(&body[enc.json.len()..], &[a, c].concat()[..]);

    // Only zero-size binary outputs: a plain JSON response.
    let specs = OutputSpecs { default_binary: true, requested: vec![] };
    let enc = encode_infer_response(response(vec![out("Z", DataType::Fp32, vec![0], vec![])]), &specs).unwrap();
    assert!(!enc.has_binary());
    assert_eq!(enc.content_type(), "application/json");
}

#[test]
fn output_edge_cases() {
    // FP16/BF16 cannot be JSON (Triton's error); binary is fine.
    let half = || response(vec![out("H", DataType::Fp16, vec![1], vec![0, 0x3c])]);
    let e = encode_infer_response(half(), &OutputSpecs::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArg);
    assert_eq!(e.message, "sending FP16 data via JSON is not supported. Please use the binary data format for output");
    let e =
        encode_infer_response(response(vec![out("H", DataType::Bf16, vec![1], vec![0, 0])]), &OutputSpecs::default())
            .unwrap_err();
    assert!(e.message.starts_with("sending BF16 data via JSON is not supported"));
    let specs = OutputSpecs { default_binary: true, requested: vec![] };
    assert!(encode_infer_response(half(), &specs).unwrap().has_binary());

    // Sizes that disagree with the shape are a server error.
    let e =
        encode_infer_response(response(vec![out("O", DataType::Fp32, vec![2], vec![0; 4])]), &OutputSpecs::default())
            .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Internal);
    assert_eq!(e.message, "Failed to write 'data' field: output tensor shape does not match size of output for 'O'");
    let e = encode_infer_response(
        response(vec![out("S", DataType::Bytes, vec![2], serialize_bytes(["a"]))]),
        &OutputSpecs::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Internal);

    // Non-UTF-8 BYTES go into the JSON unchanged, as Triton writes them.
    let enc = encode_infer_response(
        response(vec![out("S", DataType::Bytes, vec![1], serialize_bytes([&b"\xff\x01"[..]]))]),
        &OutputSpecs::default(),
    )
    .unwrap();
    let needle = b"\"data\":[\"\xff\\u0001\"]";
    assert!(enc.json.windows(needle.len()).any(|w| w == needle), "{:?}", String::from_utf8_lossy(&enc.json));

    // Non-finite floats use rapidjson's tokens.
    let enc = encode_infer_response(
        response(vec![out(
            "F",
            DataType::Fp32,
            vec![3],
            le(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY], |v| v.to_le_bytes()),
        )]),
        &OutputSpecs::default(),
    )
    .unwrap();
    assert!(String::from_utf8(enc.json).unwrap().contains(r#""data":[NaN,Infinity,-Infinity]"#));
}

#[test]
fn json_data_steps_fail_with_typed_errors() {
    assert_eq!(expected_elements("x", &[2, 3]), Ok(6));
    assert!(matches!(expected_elements("x", &[i64::MAX, 4]), Err(JsonDataError::ShapeTooLarge { .. })));
    assert!(matches!(leaf_writer("x", DataType::Int8, "1"), Err(JsonDataError::NotAnArray { .. })));
    assert_eq!(
        leaf_writer("x", DataType::Bf16, "[1]").err(),
        Some(JsonDataError::NoJsonForm { name: "x".into(), dtype: "BF16" })
    );
    let write = leaf_writer("x", DataType::Int16, "[1]").unwrap();
    let mut out = Vec::new();
    write(&json!(-2), &mut out).unwrap();
    assert_eq!(out, (-2i16).to_le_bytes());
    assert_eq!(write(&json!(70000), &mut out).unwrap_err(), "70000 is out of range for INT16");
    assert_eq!(
        convert_leaves("x", &[2, 2], DataType::Int16, "[[1, 2], [3]]", 4, write),
        Err(JsonDataError::CountMismatch { name: "x".into(), shape: "[2,2]".into(), expected: 4, got: 3 })
    );
    let e = convert_leaves("x", &[2], DataType::Int16, r#"[1, "a"]"#, 2, write).unwrap_err();
    assert_eq!(
        InferError::from(e).message,
        "Unable to parse 'data' of input 'x': element 1: expected a signed integer for INT16, got the string \"a\""
    );
}

#[test]
fn classification_counts_reach_the_core() {
    let count = |c: Value| {
        decode_ok(json!({"inputs": [], "outputs": [{"name": "P", "parameters": {"classification": c}}]}))
            .request
            .outputs[0]
            .classification
    };
    assert_eq!(count(json!(2)), Some(2));
    // 0 asks for the tensor itself; counts past u32 saturate (Triton keeps a `uint32_t`).
    assert_eq!(count(json!(0)), None);
    assert_eq!(count(json!(u64::MAX)), Some(u32::MAX));
}

fn meta(inputs: Vec<(&str, &str, Vec<i64>)>) -> ModelMetadata {
    ModelMetadata {
        name: "m".into(),
        versions: vec!["1".into()],
        platform: "python".into(),
        inputs: inputs
            .into_iter()
            .map(|(n, d, s)| TensorMetadata { name: n.into(), datatype: d.into(), shape: s })
            .collect(),
        outputs: vec![],
    }
}

#[test]
fn raw_binary_requests() {
    // Batching model with one variable dimension: batch 1, the dimension from the body size.
    let spec = raw_input_spec("m", &meta(vec![("IN", "FP32", vec![-1, -1, 2])]), 8).unwrap();
    assert_eq!(spec, RawInputSpec { name: "IN".into(), datatype: DataType::Fp32, dims: vec![-1, 2], batching: true });
    let body = Bytes::from(vec![0u8; 24]);
    let d = decode_raw_request("m", None, body.clone(), &spec).unwrap();
    assert_eq!(d.request.inputs[0].shape, vec![1, 3, 2]);
    assert_eq!(d.request.inputs[0].data.as_ptr(), body.as_ptr(), "raw data is not copied");
    assert!(d.outputs.default_binary);

    // BYTES: one element, length-prefixed.
    let spec = raw_input_spec("m", &meta(vec![("T", "BYTES", vec![1])]), 0).unwrap();
    let d = decode_raw_request("m", None, Bytes::from_static(b"\xffhello"), &spec).unwrap();
    assert_eq!(d.request.inputs[0].shape, vec![1]);
    assert_eq!(&d.request.inputs[0].data[..], &serialize_bytes([&b"\xffhello"[..]])[..]);

    let spec = raw_input_spec("m", &meta(vec![("T", "BYTES", vec![2])]), 0).unwrap();
    let e = decode_raw_request("m", None, Bytes::new(), &spec).unwrap_err();
    assert_eq!(e.message, "For BYTE datatype raw input 'T', the model must have input shape [1]");
    let spec = raw_input_spec("m", &meta(vec![("X", "INT8", vec![-1, -1])]), 0).unwrap();
    let e = decode_raw_request("m", None, Bytes::new(), &spec).unwrap_err();
    assert!(e.message.contains("more than one variable-sized dimension"), "{}", e.message);
    let e = raw_input_spec("m", &meta(vec![("A", "INT8", vec![1]), ("B", "INT8", vec![1])]), 0).unwrap_err();
    assert_eq!(
        e.message,
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' model configuration"
    );
}

#[test]
fn max_batch_size_from_config() {
    assert_eq!(max_batch_size(r#"{"name":"m","max_batch_size":8}"#), 8);
    assert_eq!(max_batch_size(r#"{"max_batch_size":"4"}"#), 4);
    assert_eq!(max_batch_size(r#"{"name":"m"}"#), 0);
    assert_eq!(max_batch_size("not json"), 0);
}
