//! Triton-compatible protobuf types and gRPC code generated from `proto/`: the KServe v2
//! `inference` package, `grpc.health.v1`, and tritium's own `tritium.admin` (the API the
//! `tritium` CLI uses). The model-configuration messages of the `inference` package are
//! tritium-config's (`tritium_config::proto`), re-exported here.

/// Messages of Triton's `inference` package, with the `GRPCInferenceService` server
/// (`grpc_inference_service_server`) and client (`grpc_inference_service_client`), and the
/// model-configuration messages (`ModelConfig`, `DataType`, ...) of `tritium_config::proto`.
pub mod inference {
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms, rustdoc::invalid_html_tags)]
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
    pub use tritium_config::proto::*;
}

/// The standard gRPC health service (`grpc.health.v1.Health`): messages, server
/// (`health_server`) and client (`health_client`).
pub mod health {
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms)]
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}

/// tritium's admin API (`tritium.admin.Admin`: stubs, restart): messages, server
/// (`admin_server`) and client (`admin_client`).
pub mod admin {
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms)]
    include!(concat!(env!("OUT_DIR"), "/tritium.admin.rs"));
}

/// The encoded `google.protobuf.FileDescriptorSet` of every .proto file above (model_config.proto
/// included), for
/// `prost_reflect::DescriptorPool::decode`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));
