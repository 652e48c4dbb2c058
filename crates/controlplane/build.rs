//! Generates the control plane's gRPC code from `proto/` with a pure-Rust
//! protobuf compiler, so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = "../../proto";
    let file = "controlplane/v1/controlplane.proto";
    println!("cargo:rerun-if-changed={proto_root}/{file}");
    let descriptors = protox::compile([file], [proto_root])?;
    // A message that does not decode is InvalidArgument (see codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::codec::Codec")
        // Every watcher of a version is sent the same encoded snapshot:
        // shared, not copied per delivery.
        .bytes(".sless.controlplane.v1.SnapshotDelivery.payload")
        .compile_fds(descriptors)?;
    Ok(())
}
