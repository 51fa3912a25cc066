//! `/debug/connections` (and the pprof endpoints when enabled) are answered
//! only to clients on a loopback address, on every binary and whatever the
//! admin listener is bound to (issue 33.2): each binary runs in a network
//! namespace of the test's own with its admin listener on `::` (IPv4 clients
//! arrive as `::ffff:127.0.0.1`) or `0.0.0.0`; clients inside the namespace
//! on its loopback get the document, clients reaching it over a veth pair
//! get 403.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use integration_tests::certs::Pki;
use integration_tests::netns::Netns;
use integration_tests::procs::{Proc, binary};

/// The status code of GET `url` from inside the namespace (curl there).
async fn inside(ns: &std::sync::Arc<Netns>, url: String) -> u16 {
    let ns = ns.clone();
    tokio::task::spawn_blocking(move || {
        let (ok, out) = ns.run(&[
            "curl",
            "-g",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "30",
            &url,
        ]);
        assert!(ok, "curl {url} failed: {out}");
        out.trim().parse().unwrap()
    })
    .await
    .unwrap()
}

fn spawn(ns: &Netns, name: &str, args: &[String]) -> Proc {
    ns.spawn(&binary(name), args)
}

#[tokio::test]
async fn debug_endpoints_answer_loopback_clients_only_on_every_binary() {
    let (ns, veth) = Netns::with_veth();
    let ns = std::sync::Arc::new(ns);
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let cert = pki.server("server", &[]);

    let mut server = spawn(
        &ns,
        "proxy-server",
        &[
            format!("--uds-name={}", dir.path().join("s.sock").display()),
            format!("--cluster-cert={}", cert.cert.display()),
            format!("--cluster-key={}", cert.key.display()),
            "--server-port=0".into(),
            "--agent-port=0".into(),
            "--health-port=0".into(),
            "--admin-port=8095".into(),
            "--admin-bind-address=::".into(),
            "--enable-profiling".into(),
        ],
    );
    let addrs = server.listening(4).await;
    let agent_port = addrs["agent"].rsplit(':').next().unwrap().to_string();
    let agent_cert = pki.client("agent");
    let mut agent = spawn(
        &ns,
        "proxy-agent",
        &[
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={agent_port}"),
            format!("--ca-cert={}", pki.ca().display()),
            format!("--agent-cert={}", agent_cert.cert.display()),
            format!("--agent-key={}", agent_cert.key.display()),
            "--health-server-port=0".into(),
            "--admin-server-port=8094".into(),
            "--admin-bind-address=::".into(),
            "--enable-profiling".into(),
        ],
    );
    agent.listening(2).await;
    let mut nodeport = spawn(
        &ns,
        "nodeport-proxy",
        &[
            "-source=demo".into(),
            "-bind-address=127.0.0.1".into(),
            "-envoy-stats-port=0".into(),
            "-envoy-tunneling-port=0".into(),
            "-admin-address=::".into(),
            "-envoy-admin-port=9001".into(),
        ],
    );
    nodeport.wait_line("serving /debug/connections").await;
    let mut tunnel_agents = Vec::new();
    for admin in ["[::]:9902", "0.0.0.0:9903"] {
        let mut t = spawn(
            &ns,
            "tunnel-agent",
            &[
                "-proxy-host=127.0.0.1".into(),
                "-proxy-port=1".into(),
                "-listener=127.0.0.1:0=x:443".into(),
                "-stats-port=0".into(),
                format!("--admin-address={admin}"),
            ],
        );
        t.wait_line(r#""listener":"admin""#).await;
        tunnel_agents.push(t);
    }

    // (binary, admin port, listening on `::`, paths served to loopback only)
    let cases: [(&str, u16, bool, &[&str]); 5] = [
        (
            "proxy-server",
            8095,
            true,
            &["/debug/connections", "/debug/pprof/"],
        ),
        (
            "proxy-agent",
            8094,
            true,
            &["/debug/connections", "/debug/pprof/"],
        ),
        ("nodeport-proxy", 9001, true, &["/debug/connections"]),
        ("tunnel-agent on ::", 9902, true, &["/debug/connections"]),
        (
            "tunnel-agent on 0.0.0.0",
            9903,
            false,
            &["/debug/connections"],
        ),
    ];
    for (name, port, dual, paths) in cases {
        for path in paths {
            // On the namespace's loopback: IPv4 (mapped, on `::`) and IPv6.
            let v4 = inside(&ns, format!("http://127.0.0.1:{port}{path}")).await;
            assert_eq!(v4, 200, "{name}: {path} over 127.0.0.1");
            if dual {
                let v6 = inside(&ns, format!("http://[::1]:{port}{path}")).await;
                assert_eq!(v6, 200, "{name}: {path} over [::1]");
            }
            // From outside the namespace, over the veth pair.
            let mut remote = vec![SocketAddr::from((veth.inner, port))];
            if dual {
                remote.push(SocketAddr::from((veth.inner6, port)));
            }
            for addr in remote {
                let (code, body) = integration_tests::http_get(addr, path).await;
                assert_eq!(code, 403, "{name}: {path} from {} to {addr}", veth.host);
                assert!(body.contains("loopback addresses only"), "{name}: {body}");
            }
        }
    }
    // The metrics stay served to everyone (Prometheus scrapes the pod IP).
    let (code, _) =
        integration_tests::http_get(SocketAddr::from((veth.inner, 8095)), "/metrics").await;
    assert_eq!(code, 200);
    drop((server, agent, nodeport, tunnel_agents));
}
