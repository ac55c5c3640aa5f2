//! Compiles the .proto files with protox (no system protoc) and generates prost messages plus
//! tonic server and client code; also writes the encoded FileDescriptorSet for prost-reflect.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] =
    &["proto/grpc_service.proto", "proto/model_config.proto", "proto/health.proto", "proto/tritium_admin.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("file_descriptor_set.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Tensor payloads decode as zero-copy slices of the received buffer.
        .bytes(".")
        .compile_fds(fds)?;
    Ok(())
}
