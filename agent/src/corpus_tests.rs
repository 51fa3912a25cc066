//! Replays the committed fuzz corpus (agent/fuzz/corpus) through the fuzz
//! entry point on every `cargo test`.

use std::path::PathBuf;

#[test]
fn packets_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/packets");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        crate::fuzzing::packets(&bytes);
        n += 1;
    }
    assert!(n >= 4, "corpus is missing");
}
