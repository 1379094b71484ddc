//! Compiles the kubelet gRPC interfaces (and the CRI subset the plugin reads) in `proto/` with protox (a protobuf compiler written in
//! Rust), so a fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/pluginregistration/api.proto",
        "proto/drahealth/v1alpha1/api.proto",
        "proto/drahealth/v1/api.proto",
        "proto/cri/v1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
