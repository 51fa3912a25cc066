//! Issue 5, test 1: a real kube-apiserver whose `cluster` egress goes
//! through our proxy-server (Unix socket; GRPC and HTTPConnect), our
//! proxy-agent connected by mTLS, and a kubelet stand-in on 127.0.0.2 that
//! only the agent is told about. The real kubectl's logs, logs -f, exec
//! (stdin, exit code, 10 MiB) and port-forward work through the tunnel; the
//! server's and agent's dial counters prove it, and with the agent gone the
//! same request fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration_tests::k8s::{
    Child, Cluster, ClusterOpts, Egress, KUBELET_IP, Kubelet, ProxyAgent, ProxyServer, assert_gone,
    bins, eventually,
};
use integration_tests::watchdog;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_through_grpc_tunnel() {
    egress("grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_through_http_connect_tunnel() {
    egress("http-connect").await;
}

async fn egress(mode: &str) {
    // Build (or find) the harness before the clock starts.
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(600));
    let sockets = tempfile::tempdir().unwrap();
    let uds = sockets.path().join("konnectivity-s1.socket");
    let cluster = Cluster::start(ClusterOpts {
        egress: if mode == "grpc" {
            Egress::Grpc(uds.clone())
        } else {
            Egress::HttpConnect(uds.clone())
        },
        ..Default::default()
    })
    .await;
    // The version matrix (tests/k8s/matrix.sh) names the release it runs:
    // the cell must really be that kube-apiserver and kubectl.
    if let Ok(want) = std::env::var("K8S_APISERVER_VERSION") {
        let out = cluster.kubectl_ok(&["version", "-o", "json"]).await;
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["serverVersion"]["gitVersion"], want.as_str(), "{out}");
        assert_eq!(v["clientVersion"]["gitVersion"], want.as_str(), "{out}");
    }
    let certs = cluster.konnectivity_certs();
    let ca = cluster.pki.ca();
    let mut server = ProxyServer::start(
        sockets.path(),
        "s1",
        mode,
        &certs.server,
        &[
            format!("--cluster-ca-cert={}", ca.display()),
            // Only dials to an address an agent advertises are routed.
            "--proxy-strategies=destHost".into(),
        ],
    )
    .await;
    assert_eq!(server.uds, uds);
    let mut agent = ProxyAgent::start(
        "agent-1",
        server.agent_addr,
        &ca,
        &[
            format!("--agent-cert={}", certs.agent.cert.display()),
            format!("--agent-key={}", certs.agent.key.display()),
            format!("--agent-identifiers=ipv4={KUBELET_IP}"),
        ],
    )
    .await;
    agent.wait_servers(1, Duration::from_secs(30)).await;
    let mut kubelet = Kubelet::start(&cluster, "node-1").await;
    kubelet.pod(&cluster, "default", "web").await;

    // kubectl logs
    let out = cluster.kubectl_ok(&["logs", "web"]).await;
    assert_eq!(
        out,
        "log line 1 from default/web/main\nlog line 2 from default/web/main\nlog line 3 from default/web/main\n"
    );
    let server_dials = server
        .metric(
            "konnectivity_network_proxy_server_dial_duration_seconds_count",
            &[],
        )
        .await;
    let agent_dials = agent
        .metric("konnectivity_network_proxy_agent_dial_duration_seconds_count")
        .await;
    assert!(
        server_dials >= 1.0 && agent_dials >= 1.0,
        "kube-apiserver did not dial through the tunnel: server {server_dials}, agent {agent_dials}"
    );

    // kubectl logs -f: streams, then stops when kubectl is interrupted.
    let mut follow = Child::spawn(
        "kubectl logs -f",
        &bins().kubectl,
        &[
            format!("--kubeconfig={}", cluster.admin_kubeconfig.display()),
            "logs".into(),
            "-f".into(),
            "web".into(),
        ],
    );
    follow.wait_line("log line 3").await;
    follow.wait_line("tick 5").await;
    follow.signal("INT");
    assert!(
        follow.wait_exit(Duration::from_secs(10)).await.is_none()
            || !integration_tests::k8s::alive(follow.pid()),
    );
    kubelet
        .child
        .wait_line("event: logs follow ended default/web/main")
        .await;

    // kubectl exec -i: stdin echoed back.
    let (code, out, err) = cluster
        .kubectl_stdin(
            &["exec", "-i", "web", "--", "cat"],
            Some(b"hello through the tunnel\n"),
        )
        .await;
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "hello through the tunnel\n"),
        "{err}"
    );

    // Exit code propagated.
    let (code, _, err) = cluster.kubectl(&["exec", "web", "--", "exit", "3"]).await;
    assert_eq!(code, Some(3), "{err}");

    // 10 MiB of stdin, hashed on the other side.
    let data: Vec<u8> = (0..10 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let want = ring::digest::digest(&ring::digest::SHA256, &data);
    let want: String = want.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let (code, out, err) = cluster
        .kubectl_stdin(&["exec", "-i", "web", "--", "sha256"], Some(&data))
        .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), format!("{want} {}", data.len()));

    // kubectl port-forward to a TCP echo "in the pod".
    let echo = integration_tests::dest::echo().await;
    let mut pf = Child::spawn(
        "kubectl port-forward",
        &bins().kubectl,
        &[
            format!("--kubeconfig={}", cluster.admin_kubeconfig.display()),
            "port-forward".into(),
            "--address=127.0.0.1".into(),
            "pod/web".into(),
            format!(":{}", echo.port()),
        ],
    );
    let line = pf.wait_line("Forwarding from 127.0.0.1:").await;
    let local: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    for round in 0..3 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .unwrap();
        let msg = format!("port-forward round {round}").into_bytes();
        s.write_all(&msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, msg);
    }
    pf.stop().await;

    // Without the agent there is no way to the kubelet.
    let before = server
        .metric(
            "konnectivity_network_proxy_server_dial_duration_seconds_count",
            &[],
        )
        .await;
    assert!(before > server_dials);
    agent.stop().await;
    eventually(
        "server notices the agent left",
        Duration::from_secs(10),
        || async {
            server
                .metric("konnectivity_network_proxy_server_ready_backends", &[])
                .await
                == 0.0
        },
    )
    .await;
    let (code, _, err) = cluster.kubectl(&["logs", "web"]).await;
    assert_ne!(code, Some(0), "logs worked without the agent: {err}");

    let pids = vec![
        ("proxy-server".to_string(), server.child.pid()),
        ("proxy-agent".to_string(), agent.child.pid()),
        ("kubelet".to_string(), kubelet.child.pid()),
        ("kubectl port-forward".to_string(), pf.pid()),
    ];
    kubelet.child.stop().await;
    assert_eq!(server.child.stop().await, Some(0));
    cluster.stop().await;
    assert_gone(&pids);
}
