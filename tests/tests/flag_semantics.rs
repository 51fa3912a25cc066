//! Flags whose meaning goes beyond parsing (issue 13.3): `--enable-profiling`
//! serves CPU profiles that `go tool pprof` reads, on the admin port of both
//! binaries; edge values upstream accepts are accepted here too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::procs::{Proc, loopback, run};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn server_args(pki: &Pki, dir: &std::path::Path, extra: &[&str]) -> Vec<String> {
    pki.local_server_args(&dir.join("s.sock"), extra)
}

/// Status, headers and body of one GET.
async fn get(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(out.len());
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = out.get(split + 4..).unwrap_or_default().to_vec();
    (status, head, body)
}

/// Takes a 2 s CPU profile from `admin` while keeping the process busy
/// (bounded: at most 5,000 scrapes of `busy`), then reads it with `go tool
/// pprof`, as an operator would.
async fn profile_reads_with_go_tool_pprof(admin: SocketAddr, busy: SocketAddr, who: &str) {
    let load = tokio::spawn(async move {
        for _ in 0..5_000 {
            let _ = get(busy, "/metrics").await;
        }
    });
    let (status, head, body) = get(admin, "/debug/pprof/profile?seconds=2").await;
    load.abort();
    assert_eq!(status, 200, "{who}: {head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/octet-stream"),
        "{who}: {head}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cpu.pb");
    std::fs::write(&file, &body).unwrap();
    let out = tokio::process::Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=20"])
        .arg(&file)
        .output()
        .await
        .expect("go is needed (scripts/test requires it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{who}: go tool pprof: {text}");
    assert!(text.contains("Type: cpu"), "{who}: {text}");
    assert!(
        !text.contains("Total samples = 0 "),
        "{who}: no samples while busy: {text}"
    );
    assert!(text.contains("::"), "{who}: no Rust function in {text}");
}

#[tokio::test]
async fn enable_profiling_serves_cpu_profiles_go_tool_pprof_reads() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Proc::spawn(
        "proxy-server",
        &server_args(&pki, dir.path(), &["--enable-profiling"]),
    );
    let addrs = srv.listening(4).await;
    let admin = loopback(&addrs["admin"]);
    let health = loopback(&addrs["health"]);
    // Upstream's routes: the bare path redirects, the index lists what is
    // there, an unknown profile is 404.
    let (status, head, _) = get(admin, "/debug/pprof").await;
    assert_eq!(status, 301, "{head}");
    assert!(head.contains("location: /debug/pprof/"), "{head}");
    let (status, _, body) = get(admin, "/debug/pprof/").await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("href='profile'"));
    let (status, _, body) = get(admin, "/debug/pprof/goroutine").await;
    assert_eq!((status, body.as_slice()), (404, &b"Unknown profile\n"[..]));
    profile_reads_with_go_tool_pprof(admin, health, "proxy-server").await;

    let port = loopback(&addrs["agent"]).port();
    let mut agent = Proc::spawn(
        "proxy-agent",
        &[
            format!("--ca-cert={}", pki.ca().display()),
            format!("--proxy-server-port={port}"),
            "--health-server-host=127.0.0.1".into(),
            "--health-server-port=0".into(),
            "--admin-server-port=0".into(),
            "--enable-profiling".into(),
            "--enable-contention-profiling".into(),
            // upstream accepts 0 (and then retries without a pause)
            "--sync-interval=0".into(),
        ],
    );
    let a = agent.listening(2).await;
    profile_reads_with_go_tool_pprof(loopback(&a["admin"]), loopback(&a["health"]), "proxy-agent")
        .await;
}

#[tokio::test]
async fn without_enable_profiling_there_is_no_pprof() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Proc::spawn("proxy-server", &server_args(&pki, dir.path(), &[]));
    let admin = loopback(&srv.listening(4).await["admin"]);
    for path in ["/debug/pprof/", "/debug/pprof/profile?seconds=1"] {
        let (status, _, _) = get(admin, path).await;
        assert_eq!(status, 404, "{path}");
    }
}

#[tokio::test]
async fn contention_profiling_needs_profiling_as_upstream_says() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let args = server_args(&pki, dir.path(), &["--enable-contention-profiling"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out) = run("proxy-server", &refs).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "if --enable-contention-profiling is set, --enable-profiling must also be set"
        ),
        "{out}"
    );
    let ca = format!("--ca-cert={}", pki.ca().display());
    let (code, out) = run("proxy-agent", &[&ca, "--enable-contention-profiling"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("--enable-profiling must also be set"), "{out}");
}

/// Values upstream takes without complaint start a working pair here too:
/// `--sync-interval=0`, `--keepalive-time=0` (grpc-go: the server's two-hour
/// default; the agent's 10 s minimum), `--frontend-keepalive-time=0`.
#[tokio::test]
async fn zero_intervals_upstream_accepts_start_a_working_pair() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Proc::spawn(
        "proxy-server",
        &server_args(
            &pki,
            dir.path(),
            &["--keepalive-time=0", "--frontend-keepalive-time=0"],
        ),
    );
    let port = loopback(&srv.listening(4).await["agent"]).port();
    let agent_cert = pki.client("agent");
    let mut agent = Proc::spawn(
        "proxy-agent",
        &[
            format!("--ca-cert={}", pki.ca().display()),
            format!("--agent-cert={}", agent_cert.cert.display()),
            format!("--agent-key={}", agent_cert.key.display()),
            format!("--proxy-server-port={port}"),
            "--health-server-port=0".into(),
            "--admin-server-port=0".into(),
            "--sync-interval=0".into(),
            "--keepalive-time=0".into(),
            "--probe-interval=0".into(),
        ],
    );
    tokio::time::timeout(
        Duration::from_secs(30),
        agent.wait_line("connected to proxy server"),
    )
    .await
    .unwrap();
    srv.wait_line("agent connected").await;
}
