//! Compiles `proto/model_config.proto` with protox (no system protoc) into prost messages only
//! (no gRPC code), and writes its encoded FileDescriptorSet for prost-reflect.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTO: &str = "proto/model_config.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo::rerun-if-changed={PROTO}");
    // Crates that import model_config.proto (tritium-proto) find it through
    // `DEP_TRITIUM_CONFIG_PROTO_DIR`.
    let proto_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!("cargo::metadata=proto_dir={}", proto_dir.display());

    let fds = protox::compile([PROTO], ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("model_config_descriptor_set.bin"), fds.encode_to_vec())?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
