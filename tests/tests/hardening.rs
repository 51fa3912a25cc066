//! What a hostile or broken peer can make the real binaries spend: memory
//! bounds and counts asserted on the processes themselves (issue 14).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::h2raw;
use integration_tests::procs::{Proc, status_kib};
use tokio::io::AsyncWriteExt;

/// A proxy-server on a Unix socket in `dir`, with every port on loopback.
async fn uds_server(pki: &Pki, dir: &Path, extra: &[&str]) -> Proc {
    let cert = pki.server("server", &[]);
    let mut args: Vec<String> = vec![
        format!("--uds-name={}", dir.join("s.sock").display()),
        format!("--cluster-cert={}", cert.cert.display()),
        format!("--cluster-key={}", cert.key.display()),
        "--server-port=0".into(),
        "--agent-port=0".into(),
        "--admin-port=0".into(),
        "--health-port=0".into(),
        "--agent-bind-address=127.0.0.1".into(),
        "--health-bind-address=127.0.0.1".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut server = Proc::spawn("proxy-server", &args);
    server.listening(4).await;
    server
}

/// Four connections each send a header block that decodes to about 110 MB
/// (and four more a block twice our buffering bound): the server answers
/// each with GOAWAY and its peak memory grows by a few MiB, not by what
/// the blocks expand to (it grew by 449 MiB before the fix).
#[tokio::test]
async fn header_bombs_cost_the_server_no_memory() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let server = uds_server(&pki, dir.path(), &[]).await;
    let pid = server.child.id().unwrap();
    let before = status_kib(pid, "VmRSS");
    let mut held = Vec::new();
    for (authority, refs) in [
        ("localhost", 27_000),
        ("/tmp/s.sock", 27_000),
        ("localhost", 60_000),
        ("/tmp/s.sock", 60_000),
    ] {
        for _ in 0..2 {
            let mut s = tokio::net::UnixStream::connect(dir.path().join("s.sock"))
                .await
                .unwrap();
            h2raw::start(&mut s).await.unwrap();
            s.write_all(&h2raw::header_bomb(1, authority, refs))
                .await
                .unwrap();
            loop {
                let (kind, _, _, payload) =
                    tokio::time::timeout(Duration::from_secs(30), h2raw::read_frame(&mut s))
                        .await
                        .expect("server went silent")
                        .unwrap();
                if kind == h2raw::GOAWAY {
                    assert_eq!(payload[4..8], [0, 0, 0, 0xb], "ENHANCE_YOUR_CALM");
                    break;
                }
            }
            held.push(s);
        }
    }
    let peak = status_kib(pid, "VmHWM");
    eprintln!("before {before} KiB, peak {peak} KiB");
    assert!(
        peak < before + 16 * 1024,
        "peak RSS {peak} KiB after starting at {before} KiB"
    );
}
