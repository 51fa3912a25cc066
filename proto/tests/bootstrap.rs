//! Regenerates the checked-in protobuf code with a pure-Rust compiler (protox)
//! and fails if it differs, so `src/gen/` can never drift from `proto/`.
//! Run with `KONNECTIVITY_PROTO_BLESS=1` to rewrite the checked-in files.

use std::path::{Path, PathBuf};

fn generate(out_dir: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let include = root.join("proto");
    let files = [
        include.join("konnectivity-client/proto/client/client.proto"),
        include.join("proto/agent/agent.proto"),
    ];
    let fds = protox::compile(files, [include]).unwrap_or_else(|e| panic!("protox: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The transport helper `connect()` would clash with the `Connect` rpc.
        .build_transport(false)
        .codec_path("crate::codec::PacketCodec")
        // DATA payloads are handed between tasks without copying.
        .bytes(".")
        .out_dir(out_dir)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("codegen: {e}"));
}

#[test]
fn generated_code_is_up_to_date() {
    let checked_in: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gen");
    if std::env::var_os("KONNECTIVITY_PROTO_BLESS").is_some() {
        generate(&checked_in);
        return;
    }
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    generate(tmp.path());
    let mut names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap_or_else(|e| panic!("read_dir: {e}"))
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "generator produced no files");
    for name in names {
        let fresh = std::fs::read_to_string(tmp.path().join(&name)).unwrap_or_default();
        let old = std::fs::read_to_string(checked_in.join(&name)).unwrap_or_default();
        assert!(
            fresh == old,
            "src/gen/{} is stale; rerun with KONNECTIVITY_PROTO_BLESS=1",
            name.to_string_lossy()
        );
    }
}
