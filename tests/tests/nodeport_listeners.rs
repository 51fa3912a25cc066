//! NodePort listeners (round robin, readiness), health and shutdown order.
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
