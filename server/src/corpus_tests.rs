//! Replays the committed fuzz corpora (server/fuzz/corpus) through the fuzz
//! entry points on every `cargo test`: inputs that once crashed or hung stay
//! fixed, and the seeds prove each entry point runs.

use std::path::PathBuf;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        run(&bytes);
        n += 1;
    }
    assert!(n >= 4, "corpus for {target} is missing");
}

#[test]
fn connect_head_corpus() {
    replay("connect_head", crate::fuzzing::connect_head);
}

#[test]
fn fix_authority_corpus() {
    replay("fix_authority", crate::fuzzing::fix_authority);
}

#[test]
fn hpack_corpus() {
    replay("hpack", crate::fuzzing::hpack);
}

#[test]
fn traceparent_corpus() {
    replay("traceparent", crate::fuzzing::traceparent);
}

#[test]
fn packets_corpus() {
    replay("packets", crate::fuzzing::packets);
}
