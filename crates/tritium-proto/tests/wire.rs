//! The generated code and descriptors keep Triton's wire contract: service and method names,
//! streaming flags, field numbers; and the descriptor set covers tritium's admin API too.

use prost::Message;
use prost_reflect::DescriptorPool;
use tritium_proto::{admin, health, inference, FILE_DESCRIPTOR_SET};

fn pool() -> DescriptorPool {
    DescriptorPool::decode(FILE_DESCRIPTOR_SET).expect("descriptor set decodes")
}

#[test]
fn services_and_methods() {
    let pool = pool();
    let service = pool.get_service_by_name("inference.GRPCInferenceService").expect("inference service");
    let methods: Vec<(String, bool, bool)> =
        service.methods().map(|m| (m.name().to_owned(), m.is_client_streaming(), m.is_server_streaming())).collect();
    let unary = |name: &str| (name.to_owned(), false, false);
    let expected = vec![
        unary("ServerLive"),
        unary("ServerReady"),
        unary("ModelReady"),
        unary("ServerMetadata"),
        unary("ModelMetadata"),
        unary("ModelInfer"),
        ("ModelStreamInfer".to_owned(), true, true),
        unary("ModelConfig"),
        unary("ModelStatistics"),
        unary("RepositoryIndex"),
        unary("RepositoryModelLoad"),
        unary("RepositoryModelUnload"),
        unary("SystemSharedMemoryStatus"),
        unary("SystemSharedMemoryRegister"),
        unary("SystemSharedMemoryUnregister"),
        unary("CudaSharedMemoryStatus"),
        unary("CudaSharedMemoryRegister"),
        unary("CudaSharedMemoryUnregister"),
        unary("TraceSetting"),
        unary("LogSettings"),
    ];
    assert_eq!(methods, expected);

    let health = pool.get_service_by_name("grpc.health.v1.Health").expect("health");
    let methods: Vec<(String, bool)> =
        health.methods().map(|m| (m.name().to_owned(), m.is_server_streaming())).collect();
    assert_eq!(methods, [("Check".to_owned(), false), ("Watch".to_owned(), true)]);

    assert_eq!(inference::grpc_inference_service_server::SERVICE_NAME, "inference.GRPCInferenceService");
    assert_eq!(health::health_server::SERVICE_NAME, "grpc.health.v1.Health");
}

#[test]
fn field_numbers_that_clients_depend_on() {
    let pool = pool();
    for (message, field, number) in [
        ("inference.ModelInferRequest", "raw_input_contents", 7),
        ("inference.ModelInferRequest", "parameters", 4),
        ("inference.ModelInferResponse", "raw_output_contents", 6),
        ("inference.ModelStreamInferResponse", "infer_response", 2),
        ("inference.InferParameter", "uint64_param", 5),
        ("inference.ModelStatistics", "response_stats", 9),
        ("inference.CudaSharedMemoryRegisterRequest", "raw_handle", 2),
        ("inference.ModelConfig", "backend", 17),
        ("inference.ModelConfig", "runtime", 25),
        ("inference.ModelConfig", "response_cache", 24),
        ("inference.ModelConfig", "model_metrics", 26),
        ("inference.ModelConfig", "dynamic_batching", 11),
        ("inference.ModelInstanceGroup", "kind", 4),
        ("inference.ModelInput", "optional", 8),
        ("inference.ModelOutput", "reshape", 5),
    ] {
        let desc = pool.get_message_by_name(message).expect(message);
        let got = desc.get_field_by_name(field).map(|f| f.number());
        assert_eq!(got, Some(number), "{message}.{field}");
    }
    let data_type = pool.get_enum_by_name("inference.DataType").expect("DataType");
    assert_eq!(data_type.get_value_by_name("TYPE_BF16").map(|v| v.number()), Some(14));
}

#[test]
fn raw_contents_encode_as_bytes_fields() {
    let request = inference::ModelInferRequest {
        model_name: "m".into(),
        raw_input_contents: vec![prost::bytes::Bytes::from_static(b"ab")],
        ..Default::default()
    };
    // field 1 (model_name, len 1), field 7 (raw_input_contents, len 2)
    assert_eq!(request.encode_to_vec(), [0x0a, 1, b'm', 0x3a, 2, b'a', b'b']);
}

#[test]
fn admin_service_is_in_the_descriptor_set() {
    let pool = pool();
    let admin_service = pool.get_service_by_name("tritium.admin.Admin").expect("admin service");
    let methods: Vec<String> = admin_service.methods().map(|m| m.name().to_owned()).collect();
    assert_eq!(methods, ["Stubs", "Restart", "Stacks"]);
    assert_eq!(admin::admin_server::SERVICE_NAME, "tritium.admin.Admin");
    let stub = pool.get_message_by_name("tritium.admin.StubInfo").expect("StubInfo");
    let fields: Vec<(String, u32)> = stub.fields().map(|f| (f.name().to_owned(), f.number())).collect();
    let numbers: Vec<u32> = fields.iter().map(|(_, n)| *n).collect();
    assert_eq!(
        numbers,
        [1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
        "8 and 9 stay reserved"
    );
    assert_eq!(fields[12], ("last_exit".to_owned(), 15));
    assert_eq!(fields[13], ("impossible_transitions".to_owned(), 16));
}
