//! What a hostile or broken peer can make the real binaries spend: memory
//! bounds and counts asserted on the processes themselves (issue 14).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::h2raw;
use integration_tests::procs::{Proc, loopback, status_kib};
use tokio::io::AsyncWriteExt;

/// A proxy-server on a Unix socket in `dir`, with every port on loopback,
/// and its listeners' addresses by name.
async fn uds_server(pki: &Pki, dir: &Path, extra: &[&str]) -> (Proc, HashMap<String, SocketAddr>) {
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
    let addrs = server
        .listening(4)
        .await
        .into_iter()
        .filter(|(_, v)| !v.starts_with('/'))
        .map(|(k, v)| (k, loopback(&v)))
        .collect();
    (server, addrs)
}

/// Four connections each send a header block that decodes to about 110 MB
/// (and four more a block twice our buffering bound): the server answers
/// each with GOAWAY and its peak memory grows by a few MiB, not by what
/// the blocks expand to (it grew by 449 MiB before the fix).
#[tokio::test]
async fn header_bombs_cost_the_server_no_memory() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = uds_server(&pki, dir.path(), &[]).await;
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

/// `(soft, hard)` open-files limit of a process.
fn open_files_limit(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_string();
    let mut f = line.split_whitespace().skip(3);
    (f.next().unwrap().into(), f.next().unwrap().into())
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The soft open-files limit is raised to the hard one and logged; 1,500
/// idle connections to each of the health and admin ports hold at most
/// their listeners' limit of descriptors, and the health port, the admin
/// port and the frontend still answer.
#[tokio::test]
async fn endpoint_floods_take_no_descriptors_from_the_data_path() {
    daemon::process::raise_open_files_limit();
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (server, addrs) = uds_server(&pki, dir.path(), &[]).await;
    let pid = server.child.id().unwrap();
    let (soft, hard) = open_files_limit(pid);
    assert_eq!(soft, hard, "soft limit not raised");
    let logged = server
        .log
        .iter()
        .find(|l| l.contains("open files limit"))
        .unwrap_or_else(|| panic!("not logged:\n{}", server.log.join("\n")));
    assert!(logged.contains(&hard) || hard == "unlimited", "{logged}");

    let before = open_fds(pid);
    let mut flood = Vec::new();
    for name in ["health", "admin"] {
        for _ in 0..1500 {
            flood.push(tokio::net::TcpStream::connect(addrs[name]).await.unwrap());
        }
    }
    for (name, path) in [("health", "/healthz"), ("admin", "/metrics")] {
        let (status, _) = integration_tests::http_get(addrs[name], path).await;
        assert_eq!(status, 200, "{path} during the flood");
    }
    // Shed connections close as their tasks run: wait for that, bounded.
    let bound = 2 * daemon::limits::ENDPOINT_MAX_CONNECTIONS + 8;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut held = open_fds(pid) - before;
    while held > bound && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = open_fds(pid) - before;
    }
    assert!(held <= bound, "{held} descriptors held by the flood");
    // The frontend still completes an HTTP/2 handshake.
    let mut s = tokio::net::UnixStream::connect(dir.path().join("s.sock"))
        .await
        .unwrap();
    h2raw::start(&mut s).await.unwrap();
    let (kind, _, _, _) = tokio::time::timeout(Duration::from_secs(30), h2raw::read_frame(&mut s))
        .await
        .expect("frontend silent during the flood")
        .unwrap();
    assert_eq!(kind, h2raw::SETTINGS);
}

/// A proxy-agent connected to the server listening at `agent_addr`, with its
/// health port; `extra` flags appended.
async fn agent(pki: &Pki, agent_addr: SocketAddr, extra: &[&str]) -> (Proc, SocketAddr) {
    let cert = pki.client("agent");
    let mut args: Vec<String> = vec![
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={}", agent_addr.port()),
        format!("--ca-cert={}", pki.ca().display()),
        format!("--agent-cert={}", cert.cert.display()),
        format!("--agent-key={}", cert.key.display()),
        "--health-server-port=0".into(),
        "--admin-server-port=0".into(),
        "--health-server-host=127.0.0.1".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut agent = Proc::spawn("proxy-agent", &args);
    let addrs = agent.listening(2).await;
    agent.wait_line("connected to proxy server").await;
    (agent, loopback(&addrs["health"]))
}

const SIGSTOP: i32 = 19;

/// An agent that stops answering (SIGSTOP: its kernel still acknowledges
/// TCP, only HTTP/2 PINGs go unanswered) is found out by the server's
/// keepalive: its tunnel is closed for the frontend with an error and the
/// server is no longer ready. Short flags here; the defaults (15 s + 15 s)
/// are checked by a unit test.
#[tokio::test]
async fn a_frozen_agent_is_dropped_and_its_tunnels_closed() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (_server, addrs) = uds_server(
        &pki,
        dir.path(),
        &[
            &format!("--cluster-ca-cert={}", pki.ca().display()),
            "--keepalive-time=1s",
            "--keepalive-timeout=1s",
        ],
    )
    .await;
    let (agent, _) = agent(&pki, addrs["agent"], &[]).await;
    let frontend = integration_tests::client::Frontend::Uds(dir.path().join("s.sock"));
    let echo = integration_tests::dest::echo().await;
    let mut t = integration_tests::client::grpc_dial(&frontend, &echo.to_string())
        .await
        .unwrap();
    t.write(b"ping").await;
    assert_eq!(t.read_exact(4).await, b"ping");
    agent.signal(SIGSTOP);
    // The tunnel ends (CLOSE_RSP naming the cause) without the frontend
    // doing anything.
    let ended = tokio::time::timeout(Duration::from_secs(60), t.closed_by_server()).await;
    assert_eq!(
        ended.expect("tunnel still open"),
        Some(proxy_server::AGENT_LOST.to_string())
    );
    assert_eq!(
        integration_tests::http_get(addrs["health"], "/readyz")
            .await
            .0,
        500,
        "the server still counts the frozen agent"
    );
}

/// The same from the agent's side: a stopped server is found out by the
/// agent's keepalive, which reports not ready and logs the lost stream.
#[tokio::test]
async fn a_frozen_server_is_dropped_by_the_agent() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (server, addrs) = uds_server(&pki, dir.path(), &[]).await;
    let (mut agent, health) = agent(
        &pki,
        addrs["agent"],
        &[
            "--keepalive-time=1s",
            "--keepalive-timeout=1s",
            "--keepalive-min-interval=0s",
        ],
    )
    .await;
    assert_eq!(integration_tests::http_get(health, "/readyz").await.0, 200);
    server.signal(SIGSTOP);
    agent.wait_line("disconnected from proxy server").await;
    assert_ne!(integration_tests::http_get(health, "/readyz").await.0, 200);
}

/// `--frontend-flood-penalty` (issue 33) is on by default for 30 s, and 0
/// turns it off.
#[test]
fn the_frontend_flood_penalty_defaults_to_30s_and_zero_turns_it_off() {
    let pki = Pki::new();
    let cert = pki.server("server", &[]);
    let penalty = |extra: &[&str]| {
        let mut args = vec![
            format!("--cluster-cert={}", cert.cert.display()),
            format!("--cluster-key={}", cert.key.display()),
            "--uds-name=/tmp/unused.sock".into(),
            "--server-port=0".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let values = proxy_server::options::flags().parse(&args).unwrap();
        proxy_server::options::parse(&values)
            .unwrap()
            .0
            .frontend_flood_penalty
    };
    assert_eq!(penalty(&[]), Duration::from_secs(30));
    assert_eq!(penalty(&["--frontend-flood-penalty=0"]), Duration::ZERO);
    assert_eq!(
        penalty(&["--frontend-flood-penalty=2m"]),
        Duration::from_secs(120)
    );
}

/// By default a frozen peer is found out within 30 s on both sides (each
/// PINGs once the other has been quiet for its keepalive time; our server
/// PINGs an idle agent every 15 s, so our agent hears from it), and our agent
/// pings no more often than upstream's server allows (grpc-go's keepalive
/// enforcement there: MinTime 30 s, else GOAWAY `too_many_pings`).
#[test]
fn keepalive_defaults() {
    let pki = Pki::new();
    let cert = pki.server("server", &[]);
    let args = [
        format!("--cluster-cert={}", cert.cert.display()),
        format!("--cluster-key={}", cert.key.display()),
        "--uds-name=/tmp/unused.sock".into(),
        "--server-port=0".into(),
    ];
    let values = proxy_server::options::flags().parse(&args).unwrap();
    let (server, _) = proxy_server::options::parse(&values).unwrap();
    assert!(server.keepalive_time + server.keepalive_timeout <= Duration::from_secs(30));
    let args = [format!("--ca-cert={}", pki.ca().display())];
    let values = proxy_agent::options::flags().parse(&args).unwrap();
    let (agent, _) = proxy_agent::options::parse(&values).unwrap();
    assert!(
        agent.connector.keepalive + agent.connector.keepalive_timeout <= Duration::from_secs(30)
    );
    assert!(server.keepalive_time < agent.connector.keepalive);
    assert!(proxy_agent::connect::MIN_PING_GAP > Duration::from_secs(30));
}
