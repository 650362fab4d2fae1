//! Compiles the trimmed Envoy protos in `proto/` with protox (pure Rust, so no system
//! `protoc` is needed) and generates tonic client and server code from the result.
//! The encoded descriptor set is also written out for gRPC reflection and protojson.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler
        .include_imports(true)
        .include_source_info(false)
        .open_file("envoy/service/ratelimit/v3/rls.proto")?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("tollgate_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
