//! Per-Service source allow-lists (`nodeport-proxy.k8s.io/source-ranges`) on
//! every shared listener, PROXY protocol from clients (curl's and hand-made
//! v1/v2 headers) and PROXY v2 to upstreams (read back with the `ppp` crate).
//! Clients come from 127.0.0.1 (outside every list here) and 127.0.0.2
//! (inside), both loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::dest;
use integration_tests::nodeport::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const HOST: &str = "api.cluster-a.seed.example.com";
const OPEN_HOST: &str = "open.cluster-b.seed.example.com";
const TUN: &str = "tun.cluster-a.svc.cluster.local:7000";
const PP: &str = "pp.cluster-a.svc.cluster.local:7001";
const ALLOWED: &str = "127.0.0.2";

fn allow(mut svc: Value, ranges: &str) -> Value {
    svc["metadata"]["annotations"]["nodeport-proxy.k8s.io/source-ranges"] = json!(ranges);
    svc
}

async fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{source}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// A backend that expects a PROXY header and answers with the client
/// address it names, then echoes.
async fn proxy_header_reader() -> SocketAddr {
    let l = loopback().await;
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 512];
                let source = loop {
                    let n = s.read(&mut b).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&b[..n]);
                    match ppp::v2::Header::try_from(buf.as_slice()) {
                        Ok(h) => match h.addresses {
                            ppp::v2::Addresses::IPv4(a) => break a.source_address.to_string(),
                            other => break format!("{other:?}"),
                        },
                        Err(
                            ppp::v2::ParseError::Incomplete(_) | ppp::v2::ParseError::Partial(..),
                        ) => {}
                        Err(e) => break format!("bad header: {e}"),
                    }
                };
                let _ = s.write_all(format!("{source}\n").as_bytes()).await;
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn echoes(c: &mut TcpStream, len: usize) {
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    assert_eq!(dest::roundtrip(c, &data).await, data);
}

/// Sends `preamble` and a CONNECT for `authority`; expects 200.
async fn tunnel_opens(c: &mut TcpStream, preamble: &str, authority: &str) {
    c.write_all(format!("{preamble}CONNECT {authority} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 19];
    c.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 OK\r\n\r\n");
}

struct Setup {
    p: Proxy,
    node_port: u16,
    pki: Pki,
    inventory: Value,
}

async fn setup(accept_proxy: bool) -> Setup {
    let pki = Pki::new();
    let tls = tls_named(&pki, "apiserver", &[HOST]).await;
    let open_tls = tls_named(&pki, "open", &[OPEN_HOST]).await;
    let echo = dest::echo().await;
    let pp = proxy_header_reader().await;
    let np = loopback().await;
    let node_port = np.local_addr().unwrap().port();
    let ranges = format!("{ALLOWED}/32, 2001:db8::/32");
    let services = vec![
        allow(
            with_mapping(
                service(
                    "cluster-a",
                    "api",
                    "SNI",
                    "ClusterIP",
                    &[("secure", 443, 0)],
                ),
                &[("secure", HOST)],
            ),
            &ranges,
        ),
        with_mapping(
            service(
                "cluster-b",
                "open",
                "SNI",
                "ClusterIP",
                &[("secure", 443, 0)],
            ),
            &[("secure", OPEN_HOST)],
        ),
        allow(
            service(
                "cluster-a",
                "tun",
                "Tunneling",
                "ClusterIP",
                &[("raw", 7000, 0)],
            ),
            ALLOWED,
        ),
        allow(
            service(
                "cluster-a",
                "np",
                "NodePort",
                "NodePort",
                &[("raw", 7000, node_port)],
            ),
            ALLOWED,
        ),
        {
            let mut s = service(
                "cluster-a",
                "pp",
                "Tunneling",
                "ClusterIP",
                &[("raw", 7001, 0)],
            );
            s["metadata"]["annotations"]["nodeport-proxy.k8s.io/upstream-proxy-protocol"] =
                json!("v2");
            s
        },
    ];
    let inv = inventory(
        services,
        vec![
            slices("cluster-a", "api", "secure", &[(tls, true)]),
            slices("cluster-b", "open", "secure", &[(open_tls, true)]),
            slices("cluster-a", "tun", "raw", &[(echo, true)]),
            slices("cluster-a", "np", "raw", &[(echo, true)]),
            slices("cluster-a", "pp", "raw", &[(pp, true)]),
        ],
    );
    let mut cfg = test_config();
    if accept_proxy {
        cfg.accept_proxy_protocol = "sni,tunneling,nodeport".parse().unwrap();
        cfg.proxy_protocol_timeout = Duration::from_millis(500);
    }
    let p = start_proxy(&inv, vec![np], cfg).await;
    Setup {
        p,
        node_port,
        pki,
        inventory: inv,
    }
}

async fn curl_sni(s: &Setup, host: &str, extra: &[&str]) -> (bool, String, String) {
    let port = s.p.sni.port();
    let resolve = format!("{host}:{port}:127.0.0.1");
    let url = format!("https://{host}:{port}/");
    let ca = s.pki.ca();
    let mut args = vec!["--resolve", &resolve, "--cacert", ca.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(&url);
    curl(&args).await
}

#[tokio::test]
async fn sni_clients_outside_the_list_get_an_access_denied_alert() {
    let s = setup(false).await;
    let (ok, body, err) = curl_sni(&s, HOST, &["--interface", ALLOWED]).await;
    assert!(ok, "allowed client: {err}");
    assert_eq!(body, "apiserver");
    let (ok, _, err) = curl_sni(&s, HOST, &[]).await;
    assert!(!ok);
    assert!(err.contains("access denied"), "curl said: {err}");
    // A Service without a list is open to the same client.
    let (ok, body, err) = curl_sni(&s, OPEN_HOST, &[]).await;
    assert!(ok && body == "open", "{err}");
    // The refusal on the wire: one fatal access_denied alert, then the close.
    let mut c = connect_from("127.0.0.1", s.p.sni).await;
    c.write_all(&client_hello(HOST)).await.unwrap();
    let (got, closed) = read_until_closed(&mut c, Duration::from_secs(5)).await;
    assert!(closed);
    assert_eq!(got, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49]);
    let (_, metrics) = s.p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains(
            "nodeport_proxy_source_denied_total{envoy_cluster_name=\"cluster-a/api-secure\",kind=\"sni\"} 2"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn connect_from_outside_the_list_is_403_on_http1_and_http2() {
    let s = setup(false).await;
    let (code, _) = connect_h1(s.p.tunnel, TUN).await;
    assert_eq!(code, 403);
    let send = h2_client(s.p.tunnel).await;
    let (code, _) = connect_h2(&send, TUN).await;
    assert_eq!(code, 403);
    // From inside: the tunnel works.
    let mut c = connect_from(ALLOWED, s.p.tunnel).await;
    tunnel_opens(&mut c, "", TUN).await;
    echoes(&mut c, 64 << 10).await;
    let (_, metrics) = s.p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains(
            "nodeport_proxy_source_denied_total{envoy_cluster_name=\"cluster-a/tun-raw\",kind=\"tunnel\"} 2"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn node_port_clients_outside_the_list_are_closed_unserved() {
    let s = setup(false).await;
    let to = SocketAddr::from(([127, 0, 0, 1], s.node_port));
    let mut denied = connect_from("127.0.0.1", to).await;
    let _ = denied.write_all(b"hello").await;
    let (got, closed) = read_until_closed(&mut denied, Duration::from_secs(5)).await;
    assert!(closed && got.is_empty(), "{got:?}");
    let mut c = connect_from(ALLOWED, to).await;
    echoes(&mut c, 64 << 10).await;
}

#[tokio::test]
async fn a_changed_list_applies_to_new_connections() {
    let s = setup(false).await;
    let (code, _) = connect_h1(s.p.tunnel, TUN).await;
    assert_eq!(code, 403);
    let mut inv = s.inventory.clone();
    for svc in inv["services"].as_array_mut().unwrap() {
        if svc["metadata"]["name"] == "tun" {
            svc["metadata"]["annotations"]["nodeport-proxy.k8s.io/source-ranges"] =
                json!("127.0.0.0/8");
        }
    }
    s.p.rewrite(&inv).await;
    let (code, _) = connect_h1(s.p.tunnel, TUN).await;
    assert_eq!(code, 200);
    // A list that does not parse shuts everyone out (fail closed).
    for svc in inv["services"].as_array_mut().unwrap() {
        if svc["metadata"]["name"] == "tun" {
            svc["metadata"]["annotations"]["nodeport-proxy.k8s.io/source-ranges"] =
                json!("127.0.0.0/8, 10.0.0.0/40");
        }
    }
    s.p.rewrite(&inv).await;
    let (code, _) = connect_h1(s.p.tunnel, TUN).await;
    assert_eq!(code, 403);
}

#[tokio::test]
async fn proxy_protocol_headers_name_the_client_the_list_checks() {
    let s = setup(true).await;
    // curl sends a v1 header naming its own address: allowed from 127.0.0.2.
    let (ok, body, err) = curl_sni(&s, HOST, &["--haproxy-protocol", "--interface", ALLOWED]).await;
    assert!(ok, "{err}");
    assert_eq!(body, "apiserver");
    let (ok, _, err) = curl_sni(&s, HOST, &["--haproxy-protocol"]).await;
    assert!(!ok && err.contains("access denied"), "{err}");
    // Without a header the listener refuses the connection.
    let (ok, _, _) = curl_sni(&s, OPEN_HOST, &[]).await;
    assert!(!ok);
    // A hand-made v1 header from 127.0.0.1 naming an allowed client.
    let mut c = TcpStream::connect(s.p.tunnel).await.unwrap();
    let v1 = format!("PROXY TCP4 {ALLOWED} 10.0.0.1 40000 8088\r\n");
    tunnel_opens(&mut c, &v1, TUN).await;
    echoes(&mut c, 4096).await;
    // A v2 header (IPv6 client inside 2001:db8::/32), then the ClientHello.
    let mut c = TcpStream::connect(s.p.sni).await.unwrap();
    let mut hdr = nodeport_proxy::relay::proxy_protocol::v2_header(
        "[2001:db8::5]:40000".parse().unwrap(),
        "[2001:db8::1]:6443".parse().unwrap(),
    );
    hdr.extend_from_slice(&client_hello(HOST));
    c.write_all(&hdr).await.unwrap();
    // The backend (rustls) answers this minimal hello with an alert of its
    // own, not access_denied: the connection got through.
    let (got, _) = read_until_closed(&mut c, Duration::from_secs(5)).await;
    assert!(got.len() >= 7 && got[0] == 0x15 && got[6] != 49, "{got:?}");
    // NodePort: a v2 LOCAL header (a load balancer's health check) leaves the
    // connection's own address, 127.0.0.1: refused.
    let to = SocketAddr::from(([127, 0, 0, 1], s.node_port));
    let mut local = TcpStream::connect(to).await.unwrap();
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
    local.write_all(&h).await.unwrap();
    let (got, closed) = read_until_closed(&mut local, Duration::from_secs(5)).await;
    assert!(closed && got.is_empty());
    // Garbage where the header belongs, or silence, is closed unserved.
    let mut bad = TcpStream::connect(s.p.tunnel).await.unwrap();
    bad.write_all(format!("CONNECT {TUN} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (got, closed) = read_until_closed(&mut bad, Duration::from_secs(5)).await;
    assert!(
        closed && got.is_empty(),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let mut silent = TcpStream::connect(to).await.unwrap();
    let (got, closed) = read_until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(closed && got.is_empty());
    let (_, metrics) = s.p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains("reason=\"proxy_protocol_invalid\"")
            && metrics.contains("reason=\"proxy_protocol_timeout\""),
        "{metrics}"
    );
}

#[tokio::test]
async fn upstreams_that_ask_get_a_proxy_v2_header_naming_the_client() {
    let s = setup(false).await;
    let mut c = connect_from(ALLOWED, s.p.tunnel).await;
    tunnel_opens(&mut c, "", PP).await;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\n") {
        c.read_exact(&mut b).await.unwrap();
        line.push(b[0]);
    }
    assert_eq!(line, format!("{ALLOWED}\n").as_bytes());
    echoes(&mut c, 64 << 10).await;
}
