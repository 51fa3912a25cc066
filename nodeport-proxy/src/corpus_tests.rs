//! Replays the committed fuzz corpus through both parsers on every `cargo
//! test`. Files named `sni-<host>.bin` are real ClientHellos (OpenSSL's, TLS
//! 1.2 and 1.3, one re-cut into 10-byte records) that must yield `<host>`, and
//! every one of their prefixes must ask for more bytes; `ok-*` requests must
//! parse as CONNECT.

use std::path::PathBuf;

use crate::relay::client_hello::{self, Hello};
use crate::relay::connect_request::{self, Parsed};

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(e.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, bytes)
        })
        .collect();
    files.sort();
    assert!(files.len() >= 5, "corpus for {target} is missing");
    files
}

#[test]
fn client_hello_corpus() {
    let mut checked = 0;
    for (name, bytes) in corpus("client_hello") {
        let result = client_hello::parse(&bytes);
        if let Some(host) = name
            .strip_prefix("sni-")
            .and_then(|n| n.strip_suffix(".bin"))
        {
            let sni = match &result {
                Ok(Hello::Complete { sni }) => sni.as_ref().map(|s| s.to_string()),
                other => panic!("{name}: {other:?}"),
            };
            assert_eq!(sni.as_deref(), Some(host), "{name}");
            for n in 0..bytes.len() {
                assert_eq!(
                    client_hello::parse(&bytes[..n]),
                    Ok(Hello::Incomplete),
                    "{name} prefix {n}"
                );
            }
            checked += 1;
        }
        if name.starts_with("nosni-") {
            assert_eq!(result, Ok(Hello::Complete { sni: None }), "{name}");
        }
    }
    assert!(checked >= 3, "real ClientHellos missing from the corpus");
}

#[test]
fn connect_request_corpus() {
    for (name, bytes) in corpus("connect_request") {
        let result = connect_request::parse(&bytes);
        if name.starts_with("ok-") {
            assert!(
                matches!(result, Ok(Parsed::Connect(_))),
                "{name}: {result:?}"
            );
        }
        if let Err(e) = result {
            assert!((400..600).contains(&e.status()), "{name}");
        }
    }
}

/// Every committed input of the entry points in `fuzzing.rs`, which check
/// their own invariants; `ok-*` table files must parse and `bad-*` ones (a
/// typo, an out-of-range port, a YAML alias bomb, JSON nested too deep)
/// must not.
#[test]
fn table_file_corpus() {
    for (name, bytes) in corpus("table_file") {
        crate::fuzzing::table_file(&bytes);
        let (_, text) = bytes.split_first().unwrap_or((&0, &[]));
        let parsed = crate::sources::source::parse_file(std::path::Path::new(&name), text);
        if name.starts_with("ok-") {
            assert!(parsed.is_ok(), "{name}: {parsed:?}");
        }
        if name.starts_with("bad-") {
            assert!(parsed.is_err(), "{name} parsed");
        }
    }
}

#[test]
fn annotations_corpus() {
    for (_, bytes) in corpus("annotations") {
        crate::fuzzing::annotations(&bytes);
    }
}

/// `ok-*` inputs are complete headers (the real shapes: v1 TCP4/TCP6/UNKNOWN,
/// v2 IPv4/IPv6/LOCAL, an AWS-style TLV) and every prefix of one asks for
/// more; `bad-*` are refused, `truncated-*` wait for more.
#[test]
fn proxy_header_corpus() {
    use crate::relay::proxy_protocol::parse;
    for (name, bytes) in corpus("proxy_header") {
        crate::fuzzing::proxy_header(&bytes);
        let result = parse(&bytes);
        if name.starts_with("ok-") {
            let h = match result {
                Ok(Some(h)) => h,
                other => panic!("{name}: {other:?}"),
            };
            for n in 0..h.len {
                assert!(matches!(parse(&bytes[..n]), Ok(None)), "{name} prefix {n}");
            }
        }
        if name.starts_with("bad-") || name.starts_with("too-long") {
            assert!(result.is_err(), "{name}: {result:?}");
        }
        if name.starts_with("truncated-") {
            assert_eq!(result, Ok(None), "{name}");
        }
    }
}
