//! Compiles the .proto files with protox (no system protoc) and generates prost messages plus
//! tonic server and client code; also writes the encoded FileDescriptorSet for prost-reflect.
//!
//! `model_config.proto` belongs to tritium-config, which generates its messages: it is found
//! through the include directory tritium-config publishes (`DEP_TRITIUM_CONFIG_PROTO_DIR`), and
//! every type it defines is an `extern_path` into `::tritium_config::proto`.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &["proto/grpc_service.proto", "proto/health.proto", "proto/tritium_admin.proto"];

/// The file that tritium-config compiles, as grpc_service.proto imports it.
const MODEL_CONFIG: &str = "model_config.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo::rerun-if-changed={proto}");
    }
    let config_dir = PathBuf::from(env::var("DEP_TRITIUM_CONFIG_PROTO_DIR")?);
    println!("cargo::rerun-if-changed={}", config_dir.join(MODEL_CONFIG).display());

    let fds = protox::compile(PROTOS, [PathBuf::from("proto"), config_dir])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("file_descriptor_set.bin"), fds.encode_to_vec())?;

    let mut builder = tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Tensor payloads decode as zero-copy slices of the received buffer.
        .bytes(".");
    let model_config =
        fds.file.iter().find(|file| file.name() == MODEL_CONFIG).ok_or("model_config.proto not imported")?;
    let names =
        model_config.message_type.iter().map(|m| m.name()).chain(model_config.enum_type.iter().map(|e| e.name()));
    for name in names {
        // Nested types follow their parent: `.inference.ModelInput.Format` becomes
        // `::tritium_config::proto::model_input::Format`.
        builder = builder.extern_path(format!(".inference.{name}"), format!("::tritium_config::proto::{name}"));
    }
    builder.compile_fds(fds)?;
    Ok(())
}
