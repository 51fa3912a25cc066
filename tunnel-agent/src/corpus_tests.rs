//! Replays the committed fuzz corpus (fuzz/corpus/bootstrap) on every `cargo
//! test`: files named `ok-*` are bootstraps KKP's template rendered (loopback,
//! default and IPv6 agent IPs, with and without the OpenVPN listener) and
//! must load into a valid configuration; `bad-*` ones (unknown fields, bad
//! durations and ports, HTTP/1.1 CONNECT, truncation, an alias bomb, deep
//! nesting, garbage) must be refused with an error, quickly and without a
//! panic; entries a fuzz run added must not panic.

use std::path::PathBuf;

use crate::bootstrap::parse;
use crate::cli::FlagSettings;

#[test]
fn bootstrap_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/bootstrap");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    let (mut ok, mut bad) = (0, 0);
    for path in files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let result = parse(&bytes);
        if name.starts_with("ok-") {
            let b = result.unwrap_or_else(|e| panic!("{name}: {e}"));
            let (config, stats) = FlagSettings::default()
                .resolve(Some(&b))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(stats.map(|s| s.port()), Some(8002), "{name}");
            assert_eq!(config.proxy_port, 8088, "{name}");
            ok += 1;
        } else if name.starts_with("bad-") {
            let e = result.err().unwrap_or_else(|| panic!("{name} accepted"));
            assert!(!e.to_string().is_empty(), "{name}");
            bad += 1;
        }
    }
    assert!(
        ok >= 4 && bad >= 10,
        "corpus incomplete: {ok} ok, {bad} bad"
    );
}
