//! Triton-compatible protobuf types and gRPC code generated from `proto/`: the KServe v2
//! `inference` package (with Triton's model configuration) and `grpc.health.v1`.

/// Messages of Triton's `inference` package, with the `GRPCInferenceService` server
/// (`grpc_inference_service_server`) and client (`grpc_inference_service_client`).
pub mod inference {
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms)]
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

/// The standard gRPC health service (`grpc.health.v1.Health`): messages, server
/// (`health_server`) and client (`health_client`).
pub mod health {
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms)]
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}

/// The encoded `google.protobuf.FileDescriptorSet` of every .proto file above, for
/// `prost_reflect::DescriptorPool::decode`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));
