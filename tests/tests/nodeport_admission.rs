//! Fair admission (issue 14.4): a listener full of half-open connections
//! (no ClientHello, no request head) admits a newcomer by closing the oldest
//! of them, never one already routed; with a per-IP limit, a flooding
//! address displaces only its own connections.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use integration_tests::dest;
use integration_tests::konnectivity::metric;
use integration_tests::nodeport::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOST: &str = "echo.seed.example.com";
const AUTHORITY: &str = "echo-t.cluster-a.svc.cluster.local:7000";
const LIMIT: usize = 40;

async fn setup(per_ip: usize) -> Proxy {
    setup_with(per_ip, false).await
}

async fn setup_with(per_ip: usize, proxy_header: bool) -> Proxy {
    let echo = dest::echo().await;
    let inv = inventory(
        vec![
            with_mapping(
                service("cluster-a", "echo", "SNI", "ClusterIP", &[("raw", 7000, 0)]),
                &[("raw", HOST)],
            ),
            service(
                "cluster-a",
                "echo-t",
                "Tunneling",
                "ClusterIP",
                &[("tcp", 7000, 0)],
            ),
        ],
        vec![
            slices("cluster-a", "echo", "raw", &[(echo, true)]),
            slices("cluster-a", "echo-t", "tcp", &[(echo, true)]),
        ],
    );
    let mut cfg = test_config();
    cfg.max_connections_per_listener = LIMIT;
    cfg.max_pending_connections_per_ip = per_ip;
    cfg.accept_proxy_protocol.sni = proxy_header;
    // Long enough that nothing here ends by the head timeout.
    cfg.client_hello_timeout = Duration::from_secs(120);
    cfg.request_header_timeout = Duration::from_secs(120);
    start_proxy(&inv, vec![], cfg).await
}

async fn connect_from(src: [u8; 4], to: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from((src, 0))).unwrap();
    sock.connect(to).await.unwrap()
}

/// A routed SNI connection from `src`, proven by an echo through it.
async fn routed_sni(src: [u8; 4], p: &Proxy) -> TcpStream {
    let mut s = connect_from(src, p.sni).await;
    let hello = client_hello(HOST);
    s.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut back))
        .await
        .expect("a newcomer was not served while the listener was full")
        .unwrap();
    s
}

async fn is_closed(s: &mut TcpStream) -> bool {
    read_until_closed(s, Duration::from_secs(10)).await.1
}

async fn shed(p: &Proxy, listener: SocketAddr) -> f64 {
    let (_, m) = p.stats_get("/stats/prometheus").await;
    metric(
        &m,
        &format!(
            "nodeport_proxy_rejected_connections_total{{envoy_listener_address=\"{}_{}\",reason=\"shed_unrouted\"}}",
            listener.ip(),
            listener.port()
        ),
    )
}

#[tokio::test]
async fn a_full_sni_listener_sheds_its_oldest_half_open_connection() {
    let p = setup(0).await;
    let mut routed = routed_sni([127, 0, 0, 1], &p).await;
    let mut silent = Vec::new();
    for _ in 1..LIMIT {
        silent.push(TcpStream::connect(p.sni).await.unwrap());
    }
    // The listener is full; every newcomer is served and displaces the
    // oldest silent connection, never the routed one.
    let mut newcomers = Vec::new();
    for _ in 0..3 {
        newcomers.push(routed_sni([127, 0, 0, 1], &p).await);
    }
    for (i, s) in silent.iter_mut().take(3).enumerate() {
        assert!(is_closed(s).await, "silent connection {i} not shed");
    }
    assert_eq!(shed(&p, p.sni).await, 3.0);
    let hello = client_hello(HOST);
    routed.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    routed.read_exact(&mut back).await.unwrap();
}

#[tokio::test]
async fn a_full_tunneling_listener_sheds_half_open_http1_and_http2_connections() {
    let p = setup(0).await;
    // An HTTP/2 connection that has sent its preface and SETTINGS but no
    // request is as half-open as a silent one, and older.
    let mut preface = TcpStream::connect(p.tunnel).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let (code, mut tunnel) = connect_h1(p.tunnel, AUTHORITY).await;
    assert_eq!(code, 200);
    let mut silent = Vec::new();
    for _ in 2..LIMIT {
        silent.push(TcpStream::connect(p.tunnel).await.unwrap());
    }
    let (code, mut newcomer) =
        tokio::time::timeout(Duration::from_secs(30), connect_h1(p.tunnel, AUTHORITY))
            .await
            .expect("a newcomer was not served while the listener was full");
    assert_eq!(code, 200);
    assert!(
        is_closed(&mut preface).await,
        "the idle HTTP/2 connection was not shed"
    );
    for s in [&mut tunnel, &mut newcomer] {
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
    }
    assert_eq!(shed(&p, p.tunnel).await, 1.0);
}

#[tokio::test]
async fn a_flooding_address_displaces_only_its_own_connections() {
    let p = setup(5).await;
    // Another client's half-open connections, older than the flood.
    let mut other = Vec::new();
    for _ in 0..3 {
        other.push(connect_from([127, 0, 0, 3], p.sni).await);
    }
    let mut flood = Vec::new();
    for _ in 0..20 {
        flood.push(connect_from([127, 0, 0, 2], p.sni).await);
    }
    // The flooder's newest connection gets served ...
    let _served = routed_sni([127, 0, 0, 2], &p).await;
    // ... and only its own older ones were closed to make room.
    for (i, s) in flood.iter_mut().take(15).enumerate() {
        assert!(is_closed(s).await, "flood connection {i} kept");
    }
    for (i, s) in other.iter_mut().enumerate() {
        s.write_all(&client_hello(HOST)).await.unwrap();
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut b)).await;
        assert!(
            matches!(r, Ok(Ok(_))),
            "the other address's connection {i} was shed"
        );
    }
}

/// Behind a load balancer that sends PROXY headers, the per-IP limit counts
/// the client each header names, not the load balancer's address: six
/// half-open connections from one balancer for four clients, one of which
/// opens three, cost exactly that client's oldest.
#[tokio::test]
async fn behind_a_proxy_protocol_balancer_the_per_ip_limit_counts_each_client() {
    let p = setup_with(2, true).await;
    let balancer = [127, 0, 0, 2];
    async fn via_balancer(from: [u8; 4], client: [u8; 4], p: &Proxy) -> TcpStream {
        let mut s = connect_from(from, p.sni).await;
        let header = nodeport_proxy::relay::proxy_protocol::v2_header(
            SocketAddr::from((client, 40000)),
            p.sni,
        );
        s.write_all(&header).await.unwrap();
        s
    }
    let mut single = Vec::new();
    for c in [[10, 0, 0, 1], [10, 0, 0, 2], [10, 0, 0, 3]] {
        single.push(via_balancer(balancer, c, &p).await);
    }
    let mut busy = Vec::new();
    for _ in 0..3 {
        busy.push(via_balancer(balancer, [10, 0, 0, 9], &p).await);
    }
    // The busy client's third connection sheds one of its own (which one
    // depends on the order their headers were read).
    integration_tests::eventually("one connection shed", Duration::from_secs(30), || async {
        shed(&p, p.sni).await >= 1.0
    })
    .await;
    let hello = client_hello(HOST);
    let mut served = 0;
    for s in &mut busy {
        let _ = s.write_all(&hello).await;
        let mut back = vec![0u8; hello.len()];
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back)).await
        {
            served += 1;
        }
    }
    assert_eq!(served, 2, "the busy client kept {served} of 3 connections");
    for (i, s) in single.iter_mut().enumerate() {
        s.write_all(&hello).await.unwrap();
        let mut back = vec![0u8; hello.len()];
        let r = tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back)).await;
        assert!(
            matches!(r, Ok(Ok(_))),
            "client {i}'s only connection was shed (the balancer's address was counted)"
        );
    }
    assert_eq!(shed(&p, p.sni).await, 1.0);
}
