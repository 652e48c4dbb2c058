//! Generates the plugin protocol's gRPC code from `proto/` with a pure-Rust
//! protobuf compiler, so building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../proto";
    let files = [
        "tfplugin6/tfplugin6.proto",
        "plugin/plugin.proto",
        "grpc/health/v1/health.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={root}/{f}");
    }
    let descriptors = protox::compile(files, [root])?;
    tonic_prost_build::configure()
        .build_client(false)
        .compile_fds(descriptors)?;
    Ok(())
}
