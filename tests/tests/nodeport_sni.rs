//! The SNI listener with real clients: curl to a TLS destination by server
//! name; unknown names, non-TLS clients and broken or slow ClientHellos are
//! closed while other connections keep working; bytes pass through untouched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::dest;
use integration_tests::nodeport::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOST: &str = "demo.seed.example.com";
const ECHO_HOST: &str = "echo.seed.example.com";

async fn setup(pki: &Pki) -> Proxy {
    let tls = tls_named(pki, "apiserver", &[HOST]).await;
    let echo = dest::echo().await;
    let api = with_mapping(
        service(
            "cluster-a",
            "apiserver-external",
            "SNI",
            "ClusterIP",
            &[("secure", 443, 0)],
        ),
        &[("secure", HOST)],
    );
    let raw = with_mapping(
        service("cluster-a", "echo", "SNI", "ClusterIP", &[("raw", 7000, 0)]),
        &[("raw", ECHO_HOST)],
    );
    let inv = inventory(
        vec![api, raw],
        vec![
            slices("cluster-a", "apiserver-external", "secure", &[(tls, true)]),
            slices("cluster-a", "echo", "raw", &[(echo, true)]),
        ],
    );
    let mut cfg = test_config();
    cfg.client_hello_timeout = Duration::from_millis(500);
    start_proxy(&inv, vec![], cfg).await
}

#[tokio::test]
async fn curl_reaches_tls_destination_by_server_name() {
    let pki = Pki::new();
    let p = setup(&pki).await;
    let port = p.sni.port().to_string();
    let url = format!("https://{HOST}:{port}/");
    let resolve = format!("{HOST}:{port}:127.0.0.1");
    let ca = pki.ca();
    let (ok, body, err) = curl(&[
        "--resolve",
        &resolve,
        "--cacert",
        ca.to_str().unwrap(),
        &url,
    ])
    .await;
    assert!(ok, "curl failed: {err}");
    assert_eq!(body, "apiserver");
    let (code, metrics) = p.stats_get("/stats/prometheus").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("envoy_cluster_upstream_cx_total{envoy_cluster_name=\"cluster-a/apiserver-external-secure\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn unknown_server_name_and_plain_http_are_closed() {
    let pki = Pki::new();
    let p = setup(&pki).await;
    let port = p.sni.port().to_string();
    let resolve = format!("unknown.example.com:{port}:127.0.0.1");
    let ca = pki.ca();
    let url = format!("https://unknown.example.com:{port}/");
    let (ok, _, err) = curl(&[
        "--resolve",
        &resolve,
        "--cacert",
        ca.to_str().unwrap(),
        &url,
    ])
    .await;
    assert!(!ok, "unknown SNI must not connect");
    assert!(
        !err.contains("timed out"),
        "must be closed, not left hanging: {err}"
    );
    let (ok, _, _) = curl(&[&format!("http://127.0.0.1:{port}/")]).await;
    assert!(!ok, "plain HTTP must be closed");
    let (_, metrics) = p.stats_get("/stats/prometheus").await;
    assert!(metrics.contains("reason=\"no_route\""), "{metrics}");
    assert!(metrics.contains("reason=\"not_tls\""), "{metrics}");
}

#[tokio::test]
async fn client_hello_split_across_segments_and_records_passes_untouched() {
    let pki = Pki::new();
    let p = setup(&pki).await;
    for record in [7, 40, 16384] {
        let hello = client_hello_records(ECHO_HOST, record);
        let mut s = TcpStream::connect(p.sni).await.unwrap();
        s.set_nodelay(true).unwrap();
        // One byte per write; nodelay makes most of them separate segments.
        for b in &hello {
            s.write_all(std::slice::from_ref(b)).await.unwrap();
            tokio::task::yield_now().await;
        }
        s.write_all(b"after-hello").await.unwrap();
        let mut back = vec![0u8; hello.len() + 11];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(
            &back[..hello.len()],
            &hello[..],
            "records of {record}: bytes changed in transit"
        );
        assert_eq!(&back[hello.len()..], b"after-hello");
    }
}

#[tokio::test]
async fn bad_client_hellos_are_closed_and_others_unaffected() {
    let pki = Pki::new();
    let p = setup(&pki).await;
    // A slow client holds its connection open while the others are tested.
    let mut slow = TcpStream::connect(p.sni).await.unwrap();
    slow.write_all(&client_hello_records(ECHO_HOST, 16384)[..20])
        .await
        .unwrap();
    let mut oversize = vec![22, 3, 1, 0, 4, 1, 0x01, 0, 0];
    oversize.extend(std::iter::repeat_n(0u8, 100));
    let truncated = client_hello_records(ECHO_HOST, 16384)[..30].to_vec();
    let mut interleaved = client_hello_records(ECHO_HOST, 10)[..30].to_vec();
    interleaved.extend_from_slice(&[21, 3, 3, 0, 2, 2, 40]);
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("oversize", oversize, false),
        ("garbage", b"\x00\xffgarbage\r\n\r\n".to_vec(), false),
        ("interleaved alert", interleaved, false),
        ("truncated then EOF", truncated, true),
    ];
    for (name, bytes, half_close) in cases {
        let mut s = TcpStream::connect(p.sni).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        if half_close {
            s.shutdown().await.unwrap();
        }
        let (got, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
        assert!(closed, "{name}: connection left open");
        assert!(got.is_empty(), "{name}: got bytes back");
    }
    // Meanwhile a good client works.
    let hello = client_hello_records(ECHO_HOST, 16384);
    let mut good = TcpStream::connect(p.sni).await.unwrap();
    good.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    good.read_exact(&mut back).await.unwrap();
    assert_eq!(back, hello);
    // The slow client is closed by the ClientHello timeout.
    let (got, closed) = read_until_closed(&mut slow, Duration::from_secs(5)).await;
    assert!(
        closed && got.is_empty(),
        "slow client not closed by the ClientHello timeout"
    );
    let (_, metrics) = p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains("reason=\"client_hello_timeout\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("reason=\"client_hello_too_large\""),
        "{metrics}"
    );
}
