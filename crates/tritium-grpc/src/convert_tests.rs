//! Tests of the wire mapping: every dtype through raw and typed contents, `BYTES`, request
//! parameters (sequence ones included), raw/typed mixing and count mismatches, outputs and
//! the classification parameter, responses, statistics and the error-code mapping.

use std::collections::HashMap;

use bytes::Bytes;
use tonic::Code;
use tritium_proto::inference::infer_parameter::ParameterChoice as P;
use tritium_proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use tritium_proto::inference::model_repository_parameter::ParameterChoice as R;
use tritium_proto::inference::{InferParameter, InferTensorContents, ModelInferRequest, ModelRepositoryParameter};
use tritium_server::testing::model_stats;
use tritium_server::{
    CorrelationId, DataType, ErrorKind, IndexEntry, InferError, InferResponse, OutputTensor, ParamValue,
    RequestedOutput, FLAG_SEQUENCE_END, FLAG_SEQUENCE_START,
};

use super::*;

fn param(p: P) -> InferParameter {
    InferParameter { parameter_choice: Some(p) }
}

fn params(list: &[(&str, P)]) -> HashMap<String, InferParameter> {
    list.iter().map(|(k, p)| (k.to_string(), param(p.clone()))).collect()
}

fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
    InferInputTensor { name: name.into(), datatype: datatype.into(), shape: shape.to_vec(), ..Default::default() }
}

fn typed(name: &str, datatype: &str, shape: &[i64], contents: InferTensorContents) -> InferInputTensor {
    InferInputTensor { contents: Some(contents), ..input(name, datatype, shape) }
}

fn request(inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "m".into(),
        id: "req-1".into(),
        inputs,
        raw_input_contents: raw.into_iter().map(Bytes::from).collect(),
        ..Default::default()
    }
}

fn decode(req: ModelInferRequest) -> Result<InferRequest, InferError> {
    decode_infer_request(req)
}

fn err_of<T: std::fmt::Debug>(r: Result<T, InferError>) -> InferError {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}

fn assert_invalid<T: std::fmt::Debug>(r: Result<T, InferError>, message: &str) {
    let e = err_of(r);
    assert_eq!(e.kind, ErrorKind::InvalidArg, "{}", e.message);
    assert_eq!(e.message, message);
}

fn lens_prefixed(items: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::new();
    for i in items {
        v.extend_from_slice(&(i.len() as u32).to_le_bytes());
        v.extend_from_slice(i);
    }
    v
}

// ---------------------------------------------------------------- error mapping

#[test]
fn error_codes_follow_triton_code_to_status() {
    let cases = [
        (ErrorKind::Unknown, Code::Unknown),
        (ErrorKind::Internal, Code::Internal),
        (ErrorKind::NotFound, Code::NotFound),
        (ErrorKind::InvalidArg, Code::InvalidArgument),
        (ErrorKind::Unavailable, Code::Unavailable),
        (ErrorKind::Unsupported, Code::Unimplemented),
        (ErrorKind::AlreadyExists, Code::AlreadyExists),
        (ErrorKind::Cancelled, Code::Cancelled),
    ];
    for (kind, code) in cases {
        assert_eq!(code_for(kind), code, "{kind:?}");
        let s = to_status(InferError::new(kind, "exact text: 'x' \"y\"\nz"));
        assert_eq!(s.code(), code);
        assert_eq!(s.message(), "exact text: 'x' \"y\"\nz");
    }
}

// ---------------------------------------------------------------- raw contents

#[test]
fn raw_contents_every_dtype_used_as_is() {
    for dt in DataType::ALL {
        let bytes: Vec<u8> = (0u8..16).collect();
        let d = decode(request(vec![input("x", dt.wire_name(), &[1])], vec![bytes.clone()])).expect("decodes");
        let i = &d.inputs[0];
        assert_eq!(i.datatype, dt);
        assert_eq!(i.shape, vec![1]);
        assert_eq!(&i.data[..], &bytes[..], "{dt:?}");
    }
}

#[test]
fn raw_bytes_is_already_serialized() {
    let data = lens_prefixed(&[b"ab", b"", b"\xff\x00"]);
    let d = decode(request(vec![input("s", "BYTES", &[3])], vec![data.clone()])).expect("decodes");
    assert_eq!(&d.inputs[0].data[..], &data[..]);
}

#[test]
fn raw_contents_are_taken_in_input_order() {
    let d = decode(request(
        vec![input("a", "INT32", &[1]), input("b", "FP32", &[1]), input("c", "UINT8", &[2])],
        vec![vec![1, 0, 0, 0], vec![0, 0, 128, 63], vec![7, 8]],
    ))
    .expect("decodes");
    let got: Vec<(&str, &[u8])> = d.inputs.iter().map(|i| (i.name.as_str(), &i.data[..])).collect();
    assert_eq!(got, vec![("a", &[1u8, 0, 0, 0][..]), ("b", &[0, 0, 128, 63][..]), ("c", &[7, 8][..])]);
}

#[test]
fn raw_contents_are_not_copied() {
    let raw = Bytes::from(vec![1u8, 2, 3, 4]);
    let mut req = request(vec![input("a", "INT32", &[1])], vec![]);
    req.raw_input_contents = vec![raw.clone()];
    let d = decode(req).expect("decodes");
    assert_eq!(d.inputs[0].data.as_ptr(), raw.as_ptr());
}

#[test]
fn too_few_raw_contents() {
    assert_invalid(
        decode(request(vec![input("a", "INT32", &[1]), input("b", "INT32", &[1])], vec![vec![0; 4]])),
        "unable to find data for input tensor 'b' for model 'm' in request.",
    );
    assert_invalid(
        decode(request(vec![input("a", "INT32", &[1])], vec![])),
        "unable to find data for input tensor 'a' for model 'm' in request.",
    );
}

#[test]
fn extra_raw_contents_are_ignored_as_triton_does() {
    let d = decode(request(vec![input("a", "INT32", &[1])], vec![vec![0; 4], vec![9; 4]])).expect("decodes");
    assert_eq!(d.inputs.len(), 1);
    assert_eq!(&d.inputs[0].data[..], &[0; 4]);
}

#[test]
fn mixing_raw_and_typed_is_refused() {
    let c = InferTensorContents { int_contents: vec![1], ..Default::default() };
    assert_invalid(
        decode(request(vec![typed("a", "INT32", &[1], c.clone()), input("b", "INT32", &[1])], vec![vec![0; 4]])),
        "contents field must not be specified when using raw_input_contents for 'a' for model 'm'",
    );
    // Present-but-empty contents count as contents, as `has_contents()` does in Triton.
    assert_invalid(
        decode(request(
            vec![input("b", "INT32", &[1]), typed("a", "INT32", &[1], Default::default())],
            vec![vec![0; 4]],
        )),
        "contents field must not be specified when using raw_input_contents for 'a' for model 'm'",
    );
}

#[test]
fn empty_typed_contents_give_an_empty_tensor() {
    let d = decode(request(vec![typed("a", "FP32", &[0], Default::default())], vec![])).expect("decodes");
    assert!(d.inputs[0].data.is_empty());
}

#[test]
fn unknown_datatype_is_refused() {
    let e = err_of(decode(request(vec![input("a", "FLOAT", &[1])], vec![vec![0; 4]])));
    assert_eq!(e.kind, ErrorKind::InvalidArg);
    assert!(e.message.starts_with("invalid datatype for input 'a': 'FLOAT' is not one of"), "{}", e.message);
}

// ---------------------------------------------------------------- typed contents

fn typed_data(dt: &str, c: InferTensorContents) -> Vec<u8> {
    let d = decode(request(vec![typed("x", dt, &[2], c)], vec![])).expect("decodes");
    d.inputs[0].data.to_vec()
}

#[test]
fn typed_contents_every_dtype() {
    let c = |f: fn(&mut InferTensorContents)| {
        let mut c = InferTensorContents::default();
        f(&mut c);
        c
    };
    assert_eq!(typed_data("BOOL", c(|c| c.bool_contents = vec![true, false])), vec![1, 0]);
    assert_eq!(typed_data("INT8", c(|c| c.int_contents = vec![-1, 127])), vec![0xff, 0x7f]);
    assert_eq!(typed_data("INT16", c(|c| c.int_contents = vec![-2, 0x1234])), vec![0xfe, 0xff, 0x34, 0x12]);
    assert_eq!(
        typed_data("INT32", c(|c| c.int_contents = vec![-1, 0x01020304])),
        [(-1i32).to_le_bytes(), 0x01020304i32.to_le_bytes()].concat()
    );
    assert_eq!(
        typed_data("INT64", c(|c| c.int64_contents = vec![i64::MIN, 5])),
        [i64::MIN.to_le_bytes(), 5i64.to_le_bytes()].concat()
    );
    assert_eq!(typed_data("UINT8", c(|c| c.uint_contents = vec![255, 1])), vec![255, 1]);
    assert_eq!(typed_data("UINT16", c(|c| c.uint_contents = vec![0xbeef, 2])), vec![0xef, 0xbe, 2, 0]);
    assert_eq!(
        typed_data("UINT32", c(|c| c.uint_contents = vec![u32::MAX, 3])),
        [u32::MAX.to_le_bytes(), 3u32.to_le_bytes()].concat()
    );
    assert_eq!(
        typed_data("UINT64", c(|c| c.uint64_contents = vec![u64::MAX, 4])),
        [u64::MAX.to_le_bytes(), 4u64.to_le_bytes()].concat()
    );
    assert_eq!(
        typed_data("FP32", c(|c| c.fp32_contents = vec![1.5, -0.0])),
        [1.5f32.to_le_bytes(), (-0.0f32).to_le_bytes()].concat()
    );
    assert_eq!(
        typed_data("FP64", c(|c| c.fp64_contents = vec![f64::MAX, 2.25])),
        [f64::MAX.to_le_bytes(), 2.25f64.to_le_bytes()].concat()
    );
}

#[test]
fn typed_bytes_are_length_prefixed() {
    let c = InferTensorContents {
        bytes_contents: vec![Bytes::from_static(b"hello"), Bytes::new(), Bytes::from_static(b"\x00\xff")],
        ..Default::default()
    };
    assert_eq!(typed_data("BYTES", c), lens_prefixed(&[b"hello", b"", b"\x00\xff"]));
}

#[test]
fn typed_contents_of_the_wrong_type() {
    let fp32 = InferTensorContents { fp32_contents: vec![1.0], ..Default::default() };
    assert_invalid(
        decode(request(vec![typed("x", "FP16", &[1], fp32.clone())], vec![])),
        "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'FP32', expected datatype 'FP16'",
    );
    assert_invalid(
        decode(request(vec![typed("x", "BF16", &[1], fp32)], vec![])),
        "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'FP32', expected datatype 'BF16'",
    );
    let ints = InferTensorContents { int_contents: vec![1], ..Default::default() };
    assert_invalid(
        decode(request(vec![typed("x", "FP32", &[1], ints)], vec![])),
        "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'INT32', expected datatype 'FP32'",
    );
    let uints = InferTensorContents { uint_contents: vec![1], ..Default::default() };
    assert_invalid(
        decode(request(vec![typed("x", "INT8", &[1], uints)], vec![])),
        "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'UINT32', expected datatype 'INT8'",
    );
    let bytes = InferTensorContents { bytes_contents: vec![Bytes::from_static(b"a")], ..Default::default() };
    assert_invalid(
        decode(request(vec![typed("x", "UINT8", &[1], bytes)], vec![])),
        "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'BYTES', expected datatype 'UINT8'",
    );
    let bools = InferTensorContents { bool_contents: vec![true], ..Default::default() };
    assert_invalid(
        decode(request(vec![typed("x", "INT64", &[1], bools)], vec![])),
        "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'BOOL', expected datatype 'INT64'",
    );
}

#[test]
fn two_typed_fields_are_refused() {
    let c = InferTensorContents { fp32_contents: vec![1.0], int_contents: vec![1], ..Default::default() };
    assert_invalid(
        decode(request(vec![typed("x", "INT32", &[1], c)], vec![])),
        "unexpected explicit tensor data for input tensor 'x' for model 'm', binary data was already supplied.",
    );
}

#[test]
fn typed_element_count_is_left_to_the_server() {
    // Triton checks the byte size against the shape in its core, as tritium's server does.
    let c = InferTensorContents { fp32_contents: vec![1.0, 2.0, 3.0], ..Default::default() };
    let d = decode(request(vec![typed("x", "FP32", &[2], c)], vec![])).expect("decodes");
    assert_eq!(d.inputs[0].data.len(), 12);
}

// ---------------------------------------------------------------- shared memory

#[test]
fn input_shared_memory_is_checked_then_resolved() {
    let shm = |list: &[(&str, P)]| InferInputTensor { parameters: params(list), ..input("x", "FP32", &[1]) };
    let e = err_of(decode(request(
        vec![shm(&[
            ("shared_memory_region", P::StringParam("r".into())),
            ("shared_memory_byte_size", P::Int64Param(4)),
        ])],
        vec![],
    )));
    // No registry, so no region: Triton's text and code for an unregistered one.
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::NotFound, "Unable to find shared memory region: 'r'"));

    assert_invalid(
        decode(request(vec![shm(&[("shared_memory_region", P::Int64Param(1))])], vec![])),
        "invalid value type for 'shared_memory_region' parameter for tensor 'x', expected string_param.",
    );
    assert_invalid(
        decode(request(vec![shm(&[("shared_memory_offset", P::Int64Param(0))])], vec![vec![0; 4]])),
        "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'x'",
    );
    assert_invalid(
        decode(request(vec![shm(&[("shared_memory_byte_size", P::Int64Param(4))])], vec![vec![0; 4]])),
        "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'x'",
    );
    assert_invalid(
        decode(request(vec![shm(&[("shared_memory_region", P::StringParam("r".into()))])], vec![])),
        "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'x'",
    );
    assert_invalid(
        decode(request(
            vec![shm(&[
                ("shared_memory_region", P::StringParam("r".into())),
                ("shared_memory_offset", P::StringParam("0".into())),
            ])],
            vec![],
        )),
        "invalid value type for 'shared_memory_offset' parameter for tensor 'x', expected int64_param.",
    );
    let mut with_contents =
        shm(&[("shared_memory_region", P::StringParam("r".into())), ("shared_memory_byte_size", P::Int64Param(4))]);
    with_contents.contents = Some(InferTensorContents { fp32_contents: vec![1.0], ..Default::default() });
    assert_invalid(
        decode(request(vec![with_contents], vec![])),
        "unexpected 'content' provided when using shared memory for input tensor 'x' for model 'm'",
    );
}

#[test]
fn ref_parsing_reads_offset() {
    let p = params(&[
        ("shared_memory_region", P::StringParam("r".into())),
        ("shared_memory_offset", P::Int64Param(16)),
        ("shared_memory_byte_size", P::Int64Param(64)),
    ]);
    assert_eq!(
        shared_memory_params("t", &p).expect("parses"),
        Some(ShmRef { region: "r".into(), offset: 16, byte_size: 64 })
    );
    assert_eq!(shared_memory_params("t", &HashMap::new()).expect("parses"), None);
}

// ---------------------------------------------------------------- request parameters

#[test]
fn sequence_parameters() {
    let p = request_parameters(&params(&[
        ("sequence_id", P::Int64Param(42)),
        ("sequence_start", P::BoolParam(true)),
        ("sequence_end", P::BoolParam(false)),
    ]))
    .expect("parses");
    assert_eq!(p.correlation_id, CorrelationId::U64(42));
    assert_eq!(p.flags, FLAG_SEQUENCE_START);
    assert!(p.parameters.is_empty(), "reserved parameters do not reach the model: {:?}", p.parameters);

    let p = request_parameters(&params(&[
        ("sequence_id", P::StringParam("abc".into())),
        ("sequence_start", P::BoolParam(true)),
        ("sequence_end", P::BoolParam(true)),
    ]))
    .expect("parses");
    assert_eq!(p.correlation_id, CorrelationId::Str("abc".into()));
    assert_eq!(p.flags, FLAG_SEQUENCE_START | FLAG_SEQUENCE_END);

    let p = request_parameters(&params(&[("sequence_id", P::Int64Param(0)), ("sequence_end", P::BoolParam(true))]))
        .expect("parses");
    assert_eq!(p.correlation_id, CorrelationId::None);
    assert_eq!(p.flags, FLAG_SEQUENCE_END);

    let p = request_parameters(&params(&[("sequence_id", P::StringParam(String::new()))])).expect("parses");
    assert_eq!(p.correlation_id, CorrelationId::None);

    // Triton hands the int64 to a uint64 setter.
    let p = request_parameters(&params(&[("sequence_id", P::Int64Param(-1))])).expect("parses");
    assert_eq!(p.correlation_id, CorrelationId::U64(u64::MAX));
}

#[test]
fn sequence_parameters_of_the_wrong_type() {
    assert_invalid(
        request_parameters(&params(&[("sequence_id", P::Uint64Param(3))])),
        "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
    );
    assert_invalid(
        request_parameters(&params(&[("sequence_id", P::BoolParam(true))])),
        "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
    );
    assert_invalid(
        request_parameters(&params(&[("sequence_start", P::Int64Param(1))])),
        "invalid value type for 'sequence_start' parameter, expected bool_param.",
    );
    assert_invalid(
        request_parameters(&params(&[("sequence_end", P::StringParam("true".into()))])),
        "invalid value type for 'sequence_end' parameter, expected bool_param.",
    );
    let unset: HashMap<String, InferParameter> = [("sequence_start".to_string(), InferParameter::default())].into();
    assert_invalid(
        request_parameters(&unset),
        "invalid value type for 'sequence_start' parameter, expected bool_param.",
    );
}

#[test]
fn priority_and_timeout() {
    let p = request_parameters(&params(&[("priority", P::Uint64Param(2)), ("timeout", P::Int64Param(1500))]))
        .expect("parses");
    assert_eq!((p.timeout_us, p.priority), (1500, 2));
    assert!(p.parameters.is_empty());
    let p =
        request_parameters(&params(&[("priority", P::Int64Param(0)), ("timeout", P::Int64Param(-5))])).expect("parses");
    assert_eq!((p.timeout_us, p.priority), (0, 0));
    let p = request_parameters(&params(&[("priority", P::Int64Param(3))])).expect("parses");
    assert_eq!(p.priority, 3);
    assert_invalid(
        request_parameters(&params(&[("priority", P::Int64Param(-1))])),
        "invalid value for 'priority', expected value >= 0.",
    );
    assert_invalid(
        request_parameters(&params(&[("priority", P::DoubleParam(1.0))])),
        "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
    );
    assert_invalid(
        request_parameters(&params(&[("timeout", P::Uint64Param(10))])),
        "invalid value type for 'timeout' parameter, expected int64_param.",
    );
}

#[test]
fn model_parameters_pass_through_sorted() {
    let p = request_parameters(&params(&[
        ("z_int", P::Int64Param(-7)),
        ("b_bool", P::BoolParam(true)),
        ("s_str", P::StringParam("v".into())),
        ("d_double", P::DoubleParam(0.5)),
        // HTTP-only in Triton: over gRPC it is an ordinary parameter.
        ("binary_data_output", P::BoolParam(true)),
    ]))
    .expect("parses");
    assert_eq!(
        p.parameters,
        vec![
            ("b_bool".to_string(), ParamValue::Bool(true)),
            ("binary_data_output".to_string(), ParamValue::Bool(true)),
            ("d_double".to_string(), ParamValue::Double(0.5)),
            ("s_str".to_string(), ParamValue::Str("v".into())),
            ("z_int".to_string(), ParamValue::Int(-7)),
        ]
    );
    assert_eq!(p.flags, 0);
    assert_eq!(p.correlation_id, CorrelationId::None);
}

#[test]
fn model_parameters_of_unsupported_types() {
    assert_invalid(
        request_parameters(&params(&[("k", P::Uint64Param(1))])),
        "invalid value type for 'k' parameter, expected int64_param, bool_param, or string_param.",
    );
    let unset: HashMap<String, InferParameter> = [("k".to_string(), InferParameter::default())].into();
    assert_invalid(
        request_parameters(&unset),
        "invalid value type for 'k' parameter, expected int64_param, bool_param, or string_param.",
    );
}

#[test]
fn triton_prefixed_parameters() {
    assert_invalid(
        request_parameters(&params(&[("triton_x", P::BoolParam(true))])),
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with 'triton_' are allowed: triton_enable_empty_final_response",
    );
    let p = request_parameters(&params(&[("triton_enable_empty_final_response", P::BoolParam(true))])).expect("parses");
    assert!(p.parameters.is_empty());
    assert_invalid(
        request_parameters(&params(&[("triton_enable_empty_final_response", P::Int64Param(1))])),
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param.",
    );
}

#[test]
fn request_fields_reach_the_server_request() {
    let mut req = request(vec![input("a", "INT32", &[2, 1])], vec![vec![0; 8]]);
    req.model_version = "3".into();
    req.parameters =
        params(&[("sequence_id", P::Int64Param(9)), ("sequence_start", P::BoolParam(true)), ("p", P::Int64Param(1))]);
    req.outputs = vec![
        InferRequestedOutputTensor { name: "B".into(), ..Default::default() },
        InferRequestedOutputTensor { name: "A".into(), ..Default::default() },
    ];
    let r = decode(req).expect("decodes");
    assert_eq!((r.model.as_str(), r.version, r.id.as_str()), ("m", Some(3), "req-1"));
    assert_eq!(r.inputs[0].shape, vec![2, 1]);
    assert_eq!(r.outputs, vec![RequestedOutput::named("B"), RequestedOutput::named("A")]);
    assert_eq!(r.correlation_id, CorrelationId::U64(9));
    assert_eq!(r.flags, FLAG_SEQUENCE_START);
    assert_eq!(r.parameters, vec![("p".to_string(), ParamValue::Int(1))]);

    let mut req = request(vec![], vec![]);
    req.model_version = "x".into();
    assert_eq!(err_of(decode(req)).kind, ErrorKind::InvalidArg);
}

// ---------------------------------------------------------------- outputs

fn out(name: &str, list: &[(&str, P)]) -> InferRequestedOutputTensor {
    InferRequestedOutputTensor { name: name.into(), parameters: params(list) }
}

#[test]
fn output_parameters() {
    let outputs = decode_outputs(
        &[out("A", &[("classification", P::Int64Param(3))]), out("B", &[("binary_data", P::BoolParam(true))])],
        None,
    )
    .expect("parses");
    assert_eq!(
        outputs,
        vec![RequestedOutput { name: "A".into(), classification: Some(3), shm: None }, RequestedOutput::named("B")]
    );
    assert_invalid(
        decode_outputs(&[out("A", &[("classification", P::Uint64Param(3))])], None),
        "invalid value type for 'classification' parameter, expected int64_param",
    );
    assert_invalid(
        decode_outputs(&[out("A", &[("classification", P::Int64Param(0))])], None),
        "invalid value for 'classification' parameter, expected >= 0",
    );
    assert_invalid(
        decode_outputs(
            &[out(
                "A",
                &[
                    ("classification", P::Int64Param(1)),
                    ("shared_memory_region", P::StringParam("r".into())),
                    ("shared_memory_byte_size", P::Int64Param(4)),
                ],
            )],
            None,
        ),
        "output can't set both 'shared_memory_region' and 'classification'",
    );
    let e = err_of(decode_outputs(
        &[out(
            "A",
            &[("shared_memory_region", P::StringParam("r".into())), ("shared_memory_byte_size", P::Int64Param(4))],
        )],
        None,
    ));
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::NotFound, "Unable to find shared memory region: 'r'"));
}

// ---------------------------------------------------------------- responses

fn response(outputs: Vec<OutputTensor>) -> InferResponse {
    InferResponse {
        model: "m".into(),
        version: 2,
        id: "req-1".into(),
        outputs,
        parameters: vec![("n".into(), ParamValue::Int(1)), ("s".into(), ParamValue::Str("x".into()))],
    }
}

fn tensor(name: &str, datatype: DataType, shape: &[i64], data: Vec<u8>) -> OutputTensor {
    OutputTensor { name: name.into(), datatype, shape: shape.to_vec(), data }
}

#[test]
fn response_has_raw_contents_for_every_output() {
    let resp = response(vec![
        tensor("A", DataType::Fp32, &[2], [1.0f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat()),
        tensor("S", DataType::Bytes, &[1], lens_prefixed(&[b"hi"])),
        tensor("E", DataType::Int8, &[0], vec![]),
    ]);
    let p = encode_infer_response(resp).expect("encodes");
    assert_eq!((p.model_name.as_str(), p.model_version.as_str(), p.id.as_str()), ("m", "2", "req-1"));
    let outs: Vec<(&str, &str, &[i64])> =
        p.outputs.iter().map(|o| (o.name.as_str(), o.datatype.as_str(), &o.shape[..])).collect();
    assert_eq!(outs, vec![("A", "FP32", &[2i64][..]), ("S", "BYTES", &[1][..]), ("E", "INT8", &[0][..])]);
    assert!(p.outputs.iter().all(|o| o.contents.is_none() && o.parameters.is_empty()));
    assert_eq!(p.raw_output_contents.len(), 3);
    assert_eq!(&p.raw_output_contents[1][..], &lens_prefixed(&[b"hi"])[..]);
    assert!(p.raw_output_contents[2].is_empty());
    assert_eq!(p.parameters.get("n"), Some(&param(P::Int64Param(1))));
    assert_eq!(p.parameters.get("s"), Some(&param(P::StringParam("x".into()))));
}

#[test]
fn parameters_to_proto_every_type() {
    let p = parameters_to_proto(&[
        ("b".into(), ParamValue::Bool(true)),
        ("i".into(), ParamValue::Int(-3)),
        ("d".into(), ParamValue::Double(1.25)),
        ("s".into(), ParamValue::Str("v".into())),
    ]);
    assert_eq!(p["b"], param(P::BoolParam(true)));
    assert_eq!(p["i"], param(P::Int64Param(-3)));
    assert_eq!(p["d"], param(P::DoubleParam(1.25)));
    assert_eq!(p["s"], param(P::StringParam("v".into())));
}

#[test]
fn stream_error_carries_the_id() {
    let r = stream_error("id-7".into(), &InferError::invalid("bad"));
    assert_eq!(r.error_message, "bad");
    assert_eq!(r.infer_response.map(|i| i.id), Some("id-7".to_string()));
}

// ---------------------------------------------------------------- statistics, index, metadata

#[test]
fn statistics_in_triton_shape() {
    let mut s = model_stats("m");
    s.last_inference = 123;
    let p = statistics_to_proto(s);
    assert_eq!((p.name.as_str(), p.version.as_str()), ("m", "1"));
    assert_eq!((p.last_inference, p.inference_count, p.execution_count), (123, 10, 4));
    let i = p.inference_stats.expect("inference_stats");
    let pair = |x: Option<StatisticDuration>| x.map(|x| (x.count, x.ns));
    assert_eq!(pair(i.success), Some((5, 500)));
    assert_eq!(pair(i.fail), Some((1, 10)));
    assert_eq!(pair(i.queue), Some((5, 50)));
    assert_eq!(pair(i.compute_input), Some((4, 40)));
    assert_eq!(pair(i.compute_infer), Some((4, 400)));
    assert_eq!(pair(i.compute_output), Some((4, 4)));
    assert_eq!(pair(i.cache_hit), Some((0, 0)));
    assert_eq!(pair(i.cache_miss), Some((0, 0)));
    assert_eq!(p.batch_stats.len(), 1);
    let b = &p.batch_stats[0];
    assert_eq!(b.batch_size, 2);
    assert_eq!(
        (pair(b.compute_input), pair(b.compute_infer), pair(b.compute_output)),
        (Some((2, 20)), Some((2, 200)), Some((2, 2)))
    );
}

#[test]
fn index_rows() {
    let p = index_to_proto(vec![
        IndexEntry {
            name: "a".into(),
            version: "1".into(),
            state: "READY".into(),
            python: "/env/bin/python".into(),
            environment: "/env".into(),
            ..IndexEntry::default()
        },
        IndexEntry { name: "b".into(), state: "UNAVAILABLE".into(), reason: "boom".into(), ..IndexEntry::default() },
    ]);
    let rows: Vec<_> =
        p.models.iter().map(|m| (m.name.as_str(), m.version.as_str(), m.state.as_str(), m.reason.as_str())).collect();
    assert_eq!(rows, vec![("a", "1", "READY", ""), ("b", "", "UNAVAILABLE", "boom")]);
    assert_eq!(
        (p.models[0].tritium_python.as_str(), p.models[0].tritium_environment.as_str()),
        ("/env/bin/python", "/env")
    );
}

#[test]
fn metadata() {
    let m = model_metadata_to_proto(tritium_server::ModelMetadata {
        name: "m".into(),
        versions: vec!["1".into(), "2".into()],
        platform: "python".into(),
        inputs: vec![tritium_server::TensorMetadata { name: "I".into(), datatype: "FP32".into(), shape: vec![-1, 4] }],
        outputs: vec![tritium_server::TensorMetadata { name: "O".into(), datatype: "BYTES".into(), shape: vec![1] }],
    });
    assert_eq!(m.versions, vec!["1", "2"]);
    assert_eq!(m.platform, "python");
    assert_eq!(
        (m.inputs[0].name.as_str(), m.inputs[0].datatype.as_str(), &m.inputs[0].shape[..]),
        ("I", "FP32", &[-1i64, 4][..])
    );
    assert_eq!(m.outputs[0].datatype, "BYTES");
    let s = server_metadata_to_proto(tritium_server::ServerMetadata {
        name: "tritium".into(),
        version: "0.1.0".into(),
        extensions: vec!["statistics".into()],
    });
    assert_eq!(
        (s.name.as_str(), s.version.as_str(), &s.extensions[..]),
        ("tritium", "0.1.0", &["statistics".to_string()][..])
    );
}

// ---------------------------------------------------------------- repository parameters

fn repo_params(list: &[(&str, R)]) -> HashMap<String, ModelRepositoryParameter> {
    list.iter().map(|(k, p)| (k.to_string(), ModelRepositoryParameter { parameter_choice: Some(p.clone()) })).collect()
}

#[test]
fn load_parameters_checked_as_triton() {
    assert_eq!(load_parameters(&HashMap::new()).ok(), Some((None, Vec::new())));
    assert_invalid(load_parameters(&repo_params(&[("x", R::BoolParam(true))])), "unrecognized load parameter 'x'.");
    assert_invalid(
        load_parameters(&repo_params(&[("config", R::BytesParam(Bytes::new()))])),
        "invalid value type for load parameter 'config', expected string_param.",
    );
    assert_invalid(
        load_parameters(&repo_params(&[("file:1/model.py", R::StringParam("x".into()))])),
        "invalid value type for load parameter 'file:1/model.py', expected bytes_param.",
    );
    let config = load_parameters(&repo_params(&[("config", R::StringParam("{}".into()))]));
    assert_eq!(config.ok(), Some((Some("{}".to_string()), Vec::new())));
    let (config, files) = load_parameters(&repo_params(&[
        ("config", R::StringParam("{}".into())),
        ("file:1/model.py", R::BytesParam(Bytes::from_static(b"x"))),
    ]))
    .expect("config and a file");
    assert_eq!(config.as_deref(), Some("{}"));
    assert_eq!(files, vec![tritium_server::ModelFile { path: "1/model.py".into(), contents: b"x".to_vec() }]);
}

#[test]
fn unload_parameters_checked_as_triton() {
    assert_eq!(unload_parameters(&HashMap::new()).ok(), Some(false));
    assert_eq!(unload_parameters(&repo_params(&[("unload_dependents", R::BoolParam(true))])).ok(), Some(true));
    assert_eq!(unload_parameters(&repo_params(&[("unload_dependents", R::BoolParam(false))])).ok(), Some(false));
    assert_eq!(unload_parameters(&repo_params(&[("other", R::Int64Param(1))])).ok(), Some(false));
    assert_invalid(
        unload_parameters(&repo_params(&[("unload_dependents", R::StringParam("yes".into()))])),
        "invalid value type for 'unload_dependents' parameter, expected bool_param.",
    );
}

#[test]
fn oversized_response_is_refused() {
    assert!(check_response_size(MAX_GRPC_MESSAGE_SIZE).is_ok());
    assert_invalid(
        check_response_size(MAX_GRPC_MESSAGE_SIZE + 1),
        "Response has byte size 2147483648 which exceeds gRPC's byte size limit 2147483647.",
    );
}

#[test]
fn entry_counts_are_capped_before_conversion() {
    let at_cap = request(vec![InferInputTensor::default(); MAX_REQUEST_ENTRIES], vec![]);
    assert!(check_request_counts(&at_cap).is_ok());
    let e = decode_infer_request(request(vec![InferInputTensor::default(); 1_000_000], vec![])).expect_err("too many");
    assert_eq!(e.kind, ErrorKind::InvalidArg);
    assert_eq!(e.message, "the request has 1000000 inputs, more than the 1024 a request may have");
    let mut r = request(vec![], vec![]);
    r.outputs = vec![InferRequestedOutputTensor::default(); MAX_REQUEST_ENTRIES + 1];
    assert!(decode_infer_request(r).expect_err("outputs").message.contains("1025 outputs"));
    let mut r = request(vec![], vec![vec![]; MAX_REQUEST_ENTRIES + 1]);
    r.parameters = (0..2000).map(|i| (format!("p{i}"), param(P::BoolParam(true)))).collect();
    assert!(decode_infer_request(r).expect_err("parameters").message.contains("2000 parameters"));
    let mut big = input("I", "INT32", &[1]);
    big.parameters = (0..1025).map(|i| (format!("p{i}"), param(P::BoolParam(true)))).collect();
    let e = decode_infer_request(request(vec![big], vec![])).expect_err("tensor parameters");
    assert!(e.message.contains("1025 parameters on tensor \"I\""), "{}", e.message);
}
