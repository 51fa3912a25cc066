//! IPv6-only and dual-stack (KKP #10872): every role on `::1`, and the
//! Konnectivity pair inside a network namespace that has no IPv4 at all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use daemon::authority::ConnectAuthority;
use integration_tests::certs::Pki;
use integration_tests::client::{Frontend, grpc_dial, http_connect};
use integration_tests::netns::Netns;
use integration_tests::nodeport::{connect_h1, inventory, service, slices, test_config};
use integration_tests::procs::{Proc, binary};
use integration_tests::{dest, nodeport};
use nodeport_proxy::{Listeners, NodePortProxy, TableSource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tunnel_agent::{AgentConfig, AgentListeners, ListenerSpec, TunnelAgent};

fn server_args(pki: &Pki, dir: &Path, mode: &str, bind: &str) -> Vec<String> {
    let cert = pki.server("server", &[]);
    vec![
        format!("--mode={mode}"),
        format!("--uds-name={}", dir.join("s.sock").display()),
        format!("--cluster-cert={}", cert.cert.display()),
        format!("--cluster-key={}", cert.key.display()),
        format!("--cluster-ca-cert={}", pki.ca().display()),
        "--server-port=0".into(),
        "--agent-port=0".into(),
        "--admin-port=0".into(),
        "--health-port=0".into(),
        format!("--agent-bind-address={bind}"),
        format!("--health-bind-address={bind}"),
        format!("--admin-bind-address={bind}"),
        // Route by the destination's address: the agent announces ::1.
        "--proxy-strategies=destHost".into(),
    ]
}

fn agent_args(pki: &Pki, server_host: &str, agent_port: u16, bind: &str) -> Vec<String> {
    let cert = pki.client("agent");
    vec![
        format!("--proxy-server-host={server_host}"),
        format!("--proxy-server-port={agent_port}"),
        format!("--ca-cert={}", pki.ca().display()),
        format!("--agent-cert={}", cert.cert.display()),
        format!("--agent-key={}", cert.key.display()),
        "--health-server-port=0".into(),
        "--admin-server-port=0".into(),
        format!("--health-server-host={bind}"),
        format!("--admin-bind-address={bind}"),
        "--agent-identifiers=ipv6=::1&host=localhost".into(),
    ]
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap()
}

async fn roundtrip_connect(fe: &Frontend, target: &str) {
    let mut r = http_connect(fe, target).await;
    assert_eq!(r.status, 200, "CONNECT {target}: {} {}", r.head, r.body);
    r.stream.write_all(b"over v6").await.unwrap();
    let mut back = [0u8; 7];
    r.stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"over v6");
}

async fn roundtrip_grpc(fe: &Frontend, target: &str) {
    let mut t = grpc_dial(fe, target)
        .await
        .unwrap_or_else(|e| panic!("dial {target}: {e:?}"));
    t.write(b"grpc v6").await;
    assert_eq!(t.read_exact(7).await, b"grpc v6");
}

/// Server and agent bound to `::1` only, the agent identified by `ipv6=::1`
/// and chosen for `[::1]` destinations by the destHost strategy; both
/// frontends dial an IPv6 destination.
#[tokio::test]
async fn konnectivity_on_ipv6_loopback() {
    let pki = Pki::new();
    let echo = dest::echo_on("::1").await;
    for mode in ["grpc", "http-connect"] {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Proc::spawn("proxy-server", &server_args(&pki, dir.path(), mode, "::1"));
        let addrs = server.listening(4).await;
        for l in ["agent", "health", "admin"] {
            assert!(addrs[l].starts_with("[::1]:"), "{l} on {}", addrs[l]);
        }
        let mut agent = Proc::spawn(
            "proxy-agent",
            &agent_args(&pki, "::1", port_of(&addrs["agent"]), "::1"),
        );
        let agent_addrs = agent.listening(2).await;
        assert!(agent_addrs["health"].starts_with("[::1]:"));
        agent.wait_line("connected to proxy server").await;
        let fe = Frontend::Uds(dir.path().join("s.sock"));
        let target = format!("[::1]:{}", echo.port());
        if mode == "grpc" {
            roundtrip_grpc(&fe, &target).await;
        } else {
            roundtrip_connect(&fe, &target).await;
        }
        let health: SocketAddr = addrs["health"].parse().unwrap();
        assert_eq!(integration_tests::http_get(health, "/readyz").await.0, 200);
    }
}

/// The pair in a namespace with no IPv4 at all: default binds (all
/// interfaces), the agent told `localhost` (its IPv4 address fails, ::1
/// works), destinations reached by `[::1]` and by `localhost`.
#[tokio::test]
async fn konnectivity_in_an_ipv6_only_namespace() {
    let ns = Netns::ipv6_only();
    let pki = Pki::new();
    let (_echo, echo_port) = ns.echo().await;
    for mode in ["grpc", "http-connect"] {
        let dir = tempfile::tempdir().unwrap();
        let mut server = ns.spawn(
            &binary("proxy-server"),
            &server_args(&pki, dir.path(), mode, ""),
        );
        let addrs = server.listening(4).await;
        assert!(addrs["agent"].starts_with("[::]:"), "{}", addrs["agent"]);
        let mut agent = ns.spawn(
            &binary("proxy-agent"),
            &agent_args(&pki, "localhost", port_of(&addrs["agent"]), ""),
        );
        agent.wait_line("connected to proxy server").await;
        let fe = Frontend::Uds(dir.path().join("s.sock"));
        for target in [
            format!("[::1]:{echo_port}"),
            format!("localhost:{echo_port}"),
        ] {
            if mode == "grpc" {
                roundtrip_grpc(&fe, &target).await;
            } else {
                roundtrip_connect(&fe, &target).await;
            }
        }
        let url = format!("http://[::1]:{}/readyz", port_of(&addrs["health"]));
        let (ok, body) = ns.run(&["curl", "-sf", &url]);
        assert!(ok, "{url} inside the namespace: {body}");
    }
}

/// nodeport-proxy with its stats, SNI, tunneling and NodePort listeners on
/// `::1` and IPv6 endpoints, and tunnel-agent on `::1` tunneling to it.
#[tokio::test]
async fn nodeport_proxy_and_tunnel_agent_on_ipv6_loopback() {
    let echo = dest::echo_on("::1").await;
    let node_port = TcpListener::bind("[::1]:0").await.unwrap();
    let np = node_port.local_addr().unwrap().port();
    let inv = inventory(
        vec![service(
            "cluster-a",
            "apiserver-external",
            "NodePort,Tunneling",
            "NodePort",
            &[("secure", 443, np)],
        )],
        vec![slices(
            "cluster-a",
            "apiserver-external",
            "secure",
            &[(echo, true)],
        )],
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("table.json");
    std::fs::write(&file, inv.to_string()).unwrap();
    let bind = || TcpListener::bind("[::1]:0");
    let (stats, sni, tunnel) = (
        bind().await.unwrap(),
        bind().await.unwrap(),
        bind().await.unwrap(),
    );
    let (stats_addr, tunnel_addr) = (stats.local_addr().unwrap(), tunnel.local_addr().unwrap());
    let node_port_addr = node_port.local_addr().unwrap();
    let config = nodeport_proxy::ProxyConfig {
        source: TableSource::File(file),
        node_port_bind_address: "::1".parse().unwrap(),
        ..test_config()
    };
    let _proxy = NodePortProxy::start(
        config,
        Listeners {
            stats: Some(stats),
            sni: Some(sni),
            tunneling: Some(tunnel),
            node_ports: vec![node_port],
            admin: None,
            sni_slow_lane: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(nodeport::http_get(stats_addr, "/healthz").await.0, 200);

    // The NodePort listener on ::1 to an IPv6 endpoint.
    let mut c = tokio::net::TcpStream::connect(node_port_addr)
        .await
        .unwrap();
    assert_eq!(
        dest::roundtrip(&mut c, b"nodeport v6").await,
        b"nodeport v6"
    );

    // HTTP/1.1 CONNECT on the tunneling listener.
    let authority = "apiserver-external.cluster-a.svc.cluster.local:443";
    let (status, mut s) = connect_h1(tunnel_addr, authority).await;
    assert_eq!(status, 200);
    assert_eq!(dest::roundtrip(&mut s, b"tunnel v6").await, b"tunnel v6");

    // tunnel-agent listening on ::1, its seed at [::1].
    let local = bind().await.unwrap();
    let local_addr = local.local_addr().unwrap();
    let agent = TunnelAgent::start(
        AgentConfig {
            proxy_host: "::1".into(),
            proxy_port: tunnel_addr.port(),
            listeners: vec![ListenerSpec {
                bind_address: local_addr.ip(),
                bind_port: local_addr.port(),
                authority: ConnectAuthority::parse(authority).unwrap(),
            }],
            drain_timeout: Duration::from_secs(5),
            ..AgentConfig::default()
        },
        AgentListeners {
            tunnels: vec![local],
            stats: None,
            admin: None,
        },
    )
    .await
    .unwrap();
    let mut c = tokio::net::TcpStream::connect(local_addr).await.unwrap();
    assert_eq!(dest::roundtrip(&mut c, b"agent v6").await, b"agent v6");
    drop(agent);
}

/// Connects to `[::1]:port` inside `ns`, sends `msg` and returns the echo.
fn roundtrip_in(ns: &Netns, port: u16, msg: &str) -> String {
    let script = format!(
        "import socket\ns = socket.create_connection(('::1', {port}), timeout=20)\ns.sendall(b'{msg}')\nb = b''\nwhile len(b) < {}:\n    b += s.recv(64)\nprint(b.decode())",
        msg.len()
    );
    let (ok, out) = ns.run(&["python3", "-c", &script]);
    assert!(ok, "roundtrip to [::1]:{port} failed: {out}");
    out.trim().to_string()
}

/// nodeport-proxy and tunnel-agent, the binaries with their default bind
/// addresses, in a namespace without IPv4: a NodePort, the tunneling
/// listener and a tunnel-agent listener all reach an IPv6 endpoint.
#[tokio::test]
async fn nodeport_proxy_and_tunnel_agent_in_an_ipv6_only_namespace() {
    let ns = Netns::ipv6_only();
    let (_echo, echo_port) = ns.echo().await;
    let echo: SocketAddr = format!("[::1]:{echo_port}").parse().unwrap();
    let inv = inventory(
        vec![service(
            "cluster-a",
            "apiserver-external",
            "NodePort,Tunneling",
            "NodePort",
            &[("secure", 443, 30443)],
        )],
        vec![slices(
            "cluster-a",
            "apiserver-external",
            "secure",
            &[(echo, true)],
        )],
    );
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table.json");
    std::fs::write(&table, inv.to_string()).unwrap();
    // An empty namespace: the usual ports are free.
    let mut proxy = ns.spawn(
        &binary("nodeport-proxy"),
        &[
            format!("-config={}", table.display()),
            "-envoy-stats-port=8002".into(),
            "-envoy-tunneling-port=8088".into(),
        ],
    );
    proxy.wait_line("serving NodePort listener").await;
    assert_eq!(roundtrip_in(&ns, 30443, "nodeport"), "nodeport");
    let mut agent = ns.spawn(
        &binary("tunnel-agent"),
        &[
            "-proxy-host=localhost".into(),
            "-proxy-port=8088".into(),
            "-listener=[::1]:7443=apiserver-external.cluster-a.svc.cluster.local:443".into(),
            "-stats-port=8003".into(),
        ],
    );
    agent.wait_line("tunneling listener").await;
    assert_eq!(
        roundtrip_in(&ns, 7443, "through the tunnel"),
        "through the tunnel"
    );
    let (ok, body) = ns.run(&["curl", "-sf", "http://[::1]:8002/healthz"]);
    assert!(ok, "nodeport-proxy /healthz inside the namespace: {body}");
    let (ok, body) = ns.run(&["curl", "-sf", "http://[::1]:8003/healthz"]);
    assert!(ok, "tunnel-agent /healthz inside the namespace: {body}");
}
