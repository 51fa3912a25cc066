//! The NodePort and SNI relays on both of their paths, kernel to kernel
//! (`-splice`, the default) and copying through user space
//! (`-splice=false`): bytes arrive whole with half-closes kept, the first
//! bytes (the ClientHello) go first, byte counters, `/debug/connections` and
//! access-log lines agree, a stalled upstream stalls its client, and the idle
//! timeout and the drain end connections.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use integration_tests::dest;
use integration_tests::konnectivity::metric;
use integration_tests::nodeport::*;
use nodeport_proxy::ProxyConfig;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOST: &str = "echo.seed.example.com";

/// Splicing on, then off.
const PATHS: [bool; 2] = [true, false];

/// A proxy with a NodePort and an SNI route to `dest`.
async fn setup(dest: SocketAddr, config: ProxyConfig) -> (Proxy, SocketAddr) {
    let np = loopback().await;
    let node_port = np.local_addr().unwrap().port();
    let inv = inventory(
        vec![
            service(
                "c",
                "np",
                "NodePort",
                "NodePort",
                &[("raw", 7000, node_port)],
            ),
            with_mapping(
                service("c", "sni", "SNI", "ClusterIP", &[("tls", 443, 0)]),
                &[("tls", HOST)],
            ),
        ],
        vec![
            slices("c", "np", "raw", &[(dest, true)]),
            slices("c", "sni", "tls", &[(dest, true)]),
        ],
    );
    let p = start_proxy(&inv, vec![np], config).await;
    (p, SocketAddr::from(([127, 0, 0, 1], node_port)))
}

fn config(splice: bool) -> ProxyConfig {
    ProxyConfig {
        splice,
        ..test_config()
    }
}

/// Writes `data` and half-closes while reading what comes back to EOF.
async fn exchange(s: TcpStream, data: &[u8]) -> Vec<u8> {
    let (mut r, mut w) = s.into_split();
    let write = async {
        w.write_all(data).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let mut back = Vec::new();
    let (_, read) = tokio::join!(write, r.read_to_end(&mut back));
    read.unwrap();
    back
}

async fn prometheus(p: &Proxy) -> String {
    p.stats_get("/stats/prometheus").await.1
}

#[tokio::test]
async fn bytes_half_closes_and_counters_on_both_paths() {
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    for splice in PATHS {
        let echo = dest::echo().await;
        let (p, node_port) = setup(echo, config(splice)).await;
        // NodePort: megabytes through, the client's half-close passed on
        // while the echo keeps answering.
        let back = exchange(TcpStream::connect(node_port).await.unwrap(), &data).await;
        assert!(back == data, "splice={splice}: NodePort bytes differ");
        // SNI: the ClientHello read to route goes first, then the rest.
        let mut sent = client_hello(HOST);
        sent.extend_from_slice(&data[..1 << 20]);
        let back = exchange(TcpStream::connect(p.sni).await.unwrap(), &sent).await;
        assert!(back == sent, "splice={splice}: SNI bytes differ");
        let total = (data.len() + sent.len()) as f64;
        integration_tests::eventually("the byte counters", Duration::from_secs(30), || async {
            let m = prometheus(&p).await;
            metric(&m, "envoy_tcp_downstream_cx_rx_bytes_total") == total
                && metric(&m, "envoy_tcp_downstream_cx_tx_bytes_total") == total
        })
        .await;
        let (_, body) = http_get(p.admin, "/debug/connections").await;
        let doc: Value = serde_json::from_str(&body).unwrap();
        let closed = doc["closed"].as_array().unwrap();
        for (kind, len) in [("nodeport", data.len()), ("sni", sent.len())] {
            let e = closed
                .iter()
                .find(|e| e["kind"] == kind)
                .unwrap_or_else(|| panic!("splice={splice}: no closed {kind}: {doc:#}"));
            assert_eq!(e["close_reason"], "closed", "splice={splice}: {e}");
            assert_eq!(e["bytes_from_client"], len, "splice={splice}: {e}");
            assert_eq!(e["bytes_from_upstream"], len, "splice={splice}: {e}");
        }
    }
}

/// An upstream that stops reading stops its client: the relay holds at
/// most a pipe (or a buffer) per direction, the kernel's socket buffers the
/// rest, so a client writing 256 MiB stalls long before.
#[tokio::test]
async fn a_stalled_upstream_stalls_its_client_on_both_paths() {
    const OFFER: usize = 256 << 20;
    for splice in PATHS {
        let sink = dest::sink().await;
        let (_p, node_port) = setup(sink, config(splice)).await;
        let mut s = TcpStream::connect(node_port).await.unwrap();
        let written = Arc::new(AtomicUsize::new(0));
        let w = written.clone();
        let writer = tokio::spawn(async move {
            let chunk = vec![7u8; 64 << 10];
            while w.load(Ordering::Relaxed) < OFFER && s.write_all(&chunk).await.is_ok() {
                w.fetch_add(chunk.len(), Ordering::Relaxed);
            }
        });
        let mut last = usize::MAX;
        integration_tests::eventually("the writer to stall", Duration::from_secs(60), || {
            let now = written.load(Ordering::Relaxed);
            let stalled = now == last;
            last = now;
            async move {
                if !stalled {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                stalled
            }
        })
        .await;
        let held = written.load(Ordering::Relaxed);
        assert!(
            held < 64 << 20 && !writer.is_finished(),
            "splice={splice}: {held} bytes went into a destination that reads nothing"
        );
        writer.abort();
    }
}

#[tokio::test]
async fn idle_timeout_and_drain_end_relays_on_both_paths() {
    for splice in PATHS {
        let echo = dest::echo().await;
        let mut cfg = config(splice);
        cfg.node_port_idle_timeout = Duration::from_millis(300);
        let (p, node_port) = setup(echo, cfg).await;
        let mut s = TcpStream::connect(node_port).await.unwrap();
        assert_eq!(dest::roundtrip(&mut s, b"x").await, b"x");
        let (_, closed) = read_until_closed(&mut s, Duration::from_secs(30)).await;
        assert!(closed, "splice={splice}: an idle connection stayed open");
        integration_tests::eventually("the idle counter", Duration::from_secs(30), || async {
            metric(&prometheus(&p).await, "envoy_tcp_idle_timeout") == 1.0
        })
        .await;

        let mut cfg = config(splice);
        cfg.drain_timeout = Duration::from_millis(300);
        let (p, node_port) = setup(echo, cfg).await;
        let mut s = TcpStream::connect(node_port).await.unwrap();
        assert_eq!(dest::roundtrip(&mut s, b"y").await, b"y");
        let mut sni = TcpStream::connect(p.sni).await.unwrap();
        let hello = client_hello(HOST);
        assert_eq!(dest::roundtrip(&mut sni, &hello).await, hello);
        p.proxy.shutdown().await;
        for c in [&mut s, &mut sni] {
            let (_, closed) = read_until_closed(c, Duration::from_secs(30)).await;
            assert!(closed, "splice={splice}: the drain left a connection open");
        }
    }
}
