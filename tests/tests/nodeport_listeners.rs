//! NodePort listeners (round robin, readiness), health and shutdown order,
//! and the access log of every listener.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use integration_tests::dest;
use integration_tests::nodeport::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn node_port_round_robin_reaches_every_endpoint() {
    let eps = [
        http_named("a").await,
        http_named("b").await,
        http_named("c").await,
    ];
    let np = loopback().await;
    let port = np.local_addr().unwrap().port();
    let inv = inventory(
        vec![service(
            "cluster-a",
            "web",
            "NodePort",
            "NodePort",
            &[("http", 80, port)],
        )],
        vec![slices("cluster-a", "web", "http", &eps.map(|e| (e, true)))],
    );
    let p = start_proxy(&inv, vec![np], test_config()).await;
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let (ok, body, err) = curl(&[&format!("http://127.0.0.1:{port}/")]).await;
        assert!(ok, "{err}");
        seen.insert(body);
    }
    assert_eq!(
        seen,
        BTreeSet::from(["a".to_string(), "b".to_string(), "c".to_string()])
    );
    let (_, metrics) = p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains(
            "envoy_cluster_membership_healthy{envoy_cluster_name=\"cluster-a/web-http\"} 3"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn service_without_ready_endpoints_is_not_exposed_until_ready() {
    let ep = http_named("late").await;
    let (np, other) = (loopback().await, loopback().await);
    let (port, other_port) = (
        np.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    let echo = dest::echo().await;
    let services = vec![
        service(
            "cluster-a",
            "late",
            "NodePort",
            "NodePort",
            &[("http", 80, port)],
        ),
        service(
            "cluster-a",
            "echo",
            "NodePort",
            "NodePort",
            &[("tcp", 7, other_port)],
        ),
    ];
    let unready = inventory(
        services.clone(),
        vec![
            slices("cluster-a", "late", "http", &[(ep, false)]),
            slices("cluster-a", "echo", "tcp", &[(echo, true)]),
        ],
    );
    let p = start_proxy(&unready, vec![np, other], test_config()).await;
    let table = p.proxy.table();
    assert!(
        !table.node_ports.contains_key(&port),
        "a Service without ready endpoints must not be exposed"
    );
    assert!(table.node_ports.contains_key(&other_port));
    assert!(table.clusters.keys().all(|c| !c.as_str().contains("late")));
    let mut c = TcpStream::connect(("127.0.0.1", other_port)).await.unwrap();
    c.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    c.read_exact(&mut b).await.unwrap();
    // Ready now: the same (pre-bound) port starts serving.
    let ready = inventory(
        services,
        vec![
            slices("cluster-a", "late", "http", &[(ep, true)]),
            slices("cluster-a", "echo", "tcp", &[(echo, true)]),
        ],
    );
    p.rewrite(&ready).await;
    let (ok, body, err) = curl(&[&format!("http://127.0.0.1:{port}/")]).await;
    assert!(ok, "{err}");
    assert_eq!(body, "late");
}

#[tokio::test]
async fn shutdown_fails_health_first_then_drains() {
    let echo = dest::echo().await;
    let inv = inventory(
        vec![service(
            "cluster-a",
            "echo",
            "Tunneling",
            "ClusterIP",
            &[("tcp", 7000, 0)],
        )],
        vec![slices("cluster-a", "echo", "tcp", &[(echo, true)])],
    );
    let mut cfg = test_config();
    cfg.shutdown_delay = Duration::from_millis(800);
    cfg.drain_timeout = Duration::from_secs(10);
    let p = start_proxy(&inv, vec![], cfg).await;
    assert_eq!(p.stats_get("/healthz").await.0, 200);
    let authority = "echo.cluster-a.svc.cluster.local:7000";
    let (code, mut live) = connect_h1(p.tunnel, authority).await;
    assert_eq!(code, 200);
    let Proxy {
        proxy,
        tunnel,
        stats,
        ..
    } = p;
    let proxy = std::sync::Arc::new(proxy);
    let stopping = {
        let proxy = proxy.clone();
        tokio::spawn(async move { proxy.shutdown().await })
    };
    // Health fails as soon as shutdown starts ...
    let mut health = 0;
    for _ in 0..100 {
        health = http_get(stats, "/healthz").await.0;
        if health == 503 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(health, 503);
    // ... while new tunnels are still accepted during the delay.
    let (code, _second) = connect_h1(tunnel, authority).await;
    assert_eq!(
        code, 200,
        "traffic must still be served during the shutdown delay"
    );
    // The live tunnel keeps working through the drain; closing it ends shutdown cleanly.
    live.write_all(b"drain").await.unwrap();
    let mut b = [0u8; 5];
    live.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"drain");
    drop(live);
    drop(_second);
    assert!(
        stopping.await.unwrap(),
        "connections did not end within the drain timeout"
    );
    assert!(
        TcpStream::connect(tunnel).await.is_err(),
        "listener must be closed after shutdown"
    );
}

#[tokio::test]
async fn access_log_has_one_line_per_routed_connection_and_request() {
    const WEB: &str = "web.seed.example.com";
    const WEB_TUNNEL: &str = "web.cluster-a.svc.cluster.local";
    let pki = integration_tests::certs::Pki::new();
    let web = tls_named(&pki, "web", &[WEB, WEB_TUNNEL]).await;
    let echo = dest::echo().await;
    let np = loopback().await;
    let port = np.local_addr().unwrap().port();
    let inv = inventory(
        vec![
            with_mapping(
                service(
                    "cluster-a",
                    "web",
                    "SNI,Tunneling",
                    "ClusterIP",
                    &[("https", 443, 0)],
                ),
                &[("https", WEB)],
            ),
            service(
                "cluster-a",
                "echo",
                "NodePort",
                "NodePort",
                &[("tcp", 7000, port)],
            ),
        ],
        vec![
            slices("cluster-a", "web", "https", &[(web, true)]),
            slices("cluster-a", "echo", "tcp", &[(echo, true)]),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let mut cfg = test_config();
    cfg.access_log = Some(nodeport_proxy::relay::access_log::AccessLogConfig {
        path: log.display().to_string(),
        format: nodeport_proxy::relay::access_log::Format::Json,
    });
    let p = start_proxy(&inv, vec![np], cfg).await;
    // Not routed: no line (Envoy logs only connections that reach a route).
    let mut unrouted = TcpStream::connect(p.sni).await.unwrap();
    unrouted
        .write_all(&client_hello("nobody.seed.example.com"))
        .await
        .unwrap();
    assert!(
        read_until_closed(&mut unrouted, Duration::from_secs(5))
            .await
            .1
    );
    let ca = pki.ca();
    let resolve = format!("{WEB}:{}:127.0.0.1", p.sni.port());
    let url = format!("https://{WEB}:{}/", p.sni.port());
    let (ok, body, err) = curl(&[
        "--resolve",
        &resolve,
        "--cacert",
        ca.to_str().unwrap(),
        &url,
    ])
    .await;
    assert!(ok && body == "web", "{err}");
    let proxy = format!("http://127.0.0.1:{}", p.tunnel.port());
    let url = format!("https://{WEB_TUNNEL}:443/");
    let (ok, body, err) = curl(&["--proxy", &proxy, "--cacert", ca.to_str().unwrap(), &url]).await;
    assert!(ok && body == "web", "{err}");
    assert_eq!(
        connect_h1(p.tunnel, "nope.cluster-a.svc.cluster.local:1")
            .await
            .0,
        404
    );
    let h2 = h2_client(p.tunnel).await;
    let (code, stream) = connect_h2(&h2, &format!("{WEB_TUNNEL}:443")).await;
    assert_eq!(code, 200);
    drop((stream, h2));
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"hi").await.unwrap();
    let mut back = [0u8; 2];
    s.read_exact(&mut back).await.unwrap();
    drop(s);
    // Lines come from a writer thread as connections end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 5 || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let entries: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(entries.len(), 5, "{lines}");
    let find = |pred: &dyn Fn(&serde_json::Value) -> bool| {
        entries
            .iter()
            .find(|e| pred(e))
            .unwrap_or_else(|| panic!("no such line in {lines}"))
            .clone()
    };
    let sni = find(&|e| e["requested_server_name"] == WEB);
    assert_eq!(sni["protocol"], "-");
    assert_eq!(sni["upstream_host"], web.to_string());
    assert_eq!(sni["upstream_cluster"], "cluster-a/web-https");
    assert_eq!(sni["downstream_local_address"], p.sni.to_string());
    assert_eq!(sni["connection_termination_details"], "closed");
    assert!(sni["bytes_received"].as_u64().unwrap() > 200, "{sni}");
    assert!(sni["bytes_sent"].as_u64().unwrap() > 200, "{sni}");
    let stream = find(&|e| e["protocol"] == "HTTP/2");
    assert_eq!(stream["response_code"], 200);
    assert_eq!(stream["authority"], format!("{WEB_TUNNEL}:443"));
    let tunnel = find(&|e| e["response_code"] == 200 && e["protocol"] == "HTTP/1.1");
    assert_eq!(tunnel["method"], "CONNECT");
    assert_eq!(tunnel["protocol"], "HTTP/1.1");
    assert_eq!(tunnel["authority"], format!("{WEB_TUNNEL}:443"));
    assert_eq!(tunnel["upstream_host"], web.to_string());
    let refused = find(&|e| e["response_code"] == 404);
    assert_eq!(refused["response_flags"], "NR");
    assert_eq!(refused["authority"], "nope.cluster-a.svc.cluster.local:1");
    assert_eq!(refused["upstream_host"], "-");
    let node_port = find(&|e| e["upstream_host"] == echo.to_string());
    assert_eq!(node_port["bytes_received"], 2);
    assert_eq!(node_port["bytes_sent"], 2);
    assert_eq!(
        node_port["downstream_local_address"],
        format!("127.0.0.1:{port}")
    );
}

/// `ss -tno` lines of established connections whose local (field 2) or
/// peer (field 3) address is `addr`.
fn ss_lines(field: usize, addr: &str) -> Vec<String> {
    let out = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(field) == Some(addr))
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn tcp_keepalive_only_when_a_keepalive_flag_is_set() {
    // KKP's seed passes every keepalive setting as 0: Envoy then sets no
    // tcp_keepalive on either side. A setting > 0 turns keepalive on for
    // that side, with only the fields given.
    for (label, keepalive) in [
        ("unset", daemon::keepalive::TcpKeepalive::default()),
        (
            "time 30s",
            daemon::keepalive::TcpKeepalive {
                time: Some(Duration::from_secs(30)),
                ..Default::default()
            },
        ),
    ] {
        let echo = dest::echo().await;
        let np = loopback().await;
        let port = np.local_addr().unwrap().port();
        let inv = inventory(
            vec![service(
                "k",
                "echo",
                "NodePort",
                "NodePort",
                &[("tcp", 7000, port)],
            )],
            vec![slices("k", "echo", "tcp", &[(echo, true)])],
        );
        let mut cfg = test_config();
        cfg.connection.downstream_keepalive = keepalive;
        cfg.connection.upstream_keepalive = keepalive;
        let _p = start_proxy(&inv, vec![np], cfg).await;
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"k").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        // The proxy's two sockets: accepted on `port`, and dialled to `echo`.
        let accepted = ss_lines(2, &format!("127.0.0.1:{port}"));
        let dialled = ss_lines(3, &echo.to_string());
        assert_eq!(
            (accepted.len(), dialled.len()),
            (1, 1),
            "{label}: {accepted:?} {dialled:?}"
        );
        for line in accepted.iter().chain(&dialled) {
            assert_eq!(
                line.contains("timer:(keepalive"),
                keepalive.is_set(),
                "{label}: {line}"
            );
        }
    }
}
