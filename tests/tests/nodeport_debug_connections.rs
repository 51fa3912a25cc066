//! `/debug/connections` on nodeport-proxy's admin listener: live SNI,
//! tunneling (HTTP/1.1 and each HTTP/2 stream) and NodePort connections with
//! source, target, upstream, state and bytes each way; closed ones with their
//! reason; a bounded listing; nothing of it on the stats port.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use integration_tests::dest;
use integration_tests::nodeport::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TUN: &str = "echo.cluster-a.svc.cluster.local:7000";

async fn debug(p: &Proxy, query: &str) -> Value {
    let (code, body) = http_get(p.admin, &format!("/debug/connections{query}")).await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Polls until `pred` holds for the listing (counters are updated as bytes
/// move, a moment after the peer sees them).
async fn until(p: &Proxy, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let doc = debug(p, "").await;
        if pred(&doc) {
            return doc;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let doc = debug(p, "").await;
    panic!("listing never matched: {doc:#}");
}

fn entries<'a>(doc: &'a Value, list: &str, kind: &str) -> Vec<&'a Value> {
    doc[list]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .collect()
}

#[tokio::test]
async fn live_and_closed_connections_are_listed_on_the_admin_port_only() {
    let echo = dest::echo().await;
    let np = loopback().await;
    let node_port = np.local_addr().unwrap().port();
    let inv = inventory(
        vec![
            service(
                "cluster-a",
                "echo",
                "Tunneling",
                "ClusterIP",
                &[("raw", 7000, 0)],
            ),
            service(
                "cluster-a",
                "np",
                "NodePort",
                "NodePort",
                &[("raw", 7000, node_port)],
            ),
        ],
        vec![
            slices("cluster-a", "echo", "raw", &[(echo, true)]),
            slices("cluster-a", "np", "raw", &[(echo, true)]),
        ],
    );
    let p = start_proxy(&inv, vec![np], test_config()).await;

    // HTTP/1.1 tunnel with 1000 bytes each way.
    let (code, mut h1) = connect_h1(p.tunnel, TUN).await;
    assert_eq!(code, 200);
    let data = vec![7u8; 1000];
    assert_eq!(dest::roundtrip(&mut h1, &data).await, data);
    let h1_port = h1.local_addr().unwrap().port();
    // An HTTP/2 stream.
    let send = h2_client(p.tunnel).await;
    let (code, io) = connect_h2(&send, TUN).await;
    assert_eq!(code, 200);
    let mut h2s = io.unwrap();
    assert_eq!(dest::roundtrip(&mut h2s, b"hi").await, b"hi");
    // A NodePort connection, and a silent one on the SNI port.
    let mut npc = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], node_port)))
        .await
        .unwrap();
    assert_eq!(dest::roundtrip(&mut npc, b"abc").await, b"abc");
    let silent = TcpStream::connect(p.sni).await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();

    let doc = until(&p, |d| {
        entries(d, "live", "tunneling")
            .iter()
            .any(|e| e["bytes_from_upstream"] == 1000)
            && entries(d, "live", "sni").len() == 1
    })
    .await;
    let t = entries(&doc, "live", "tunneling")
        .into_iter()
        .find(|e| e["source"] == format!("127.0.0.1:{h1_port}"))
        .unwrap();
    assert_eq!(t["target"], TUN);
    assert_eq!(t["upstream"], echo.to_string());
    assert_eq!(t["state"], "established");
    assert_eq!(t["cluster"], "cluster-a/echo-raw");
    assert_eq!(t["bytes_from_client"], 1000);
    assert!(t["age_seconds"].as_f64().unwrap() >= 0.0);
    // The HTTP/2 connection, and its stream pointing at it.
    let h2conn = entries(&doc, "live", "tunneling")
        .into_iter()
        .find(|e| e["state"] == "http2")
        .unwrap();
    let stream = &entries(&doc, "live", "tunneling-stream")[0];
    assert_eq!(stream["connection"], h2conn["id"].to_string());
    assert_eq!(stream["target"], TUN);
    assert_eq!(stream["state"], "established");
    let n = &entries(&doc, "live", "nodeport")[0];
    assert_eq!(n["target"], format!("node port {node_port}"));
    assert_eq!(n["upstream"], echo.to_string());
    let s = &entries(&doc, "live", "sni")[0];
    assert_eq!(s["state"], "handshake");
    assert_eq!(s["source"], format!("127.0.0.1:{silent_port}"));
    assert_eq!(doc["live_total"], 5);

    // Bounded listing.
    let one = debug(&p, "?limit=1").await;
    assert_eq!(one["live_total"], 5);
    assert_eq!(one["live"].as_array().unwrap().len(), 1);

    // Closed: the HTTP/1.1 tunnel (the client closed) and a refused CONNECT.
    h1.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = h1.read_to_end(&mut rest).await;
    drop(h1);
    let (code, _) = connect_h1(p.tunnel, "nowhere.cluster-a.svc.cluster.local:1").await;
    assert_eq!(code, 404);
    let doc = until(&p, |d| entries(d, "closed", "tunneling").len() >= 2).await;
    let closed = entries(&doc, "closed", "tunneling");
    assert!(
        closed
            .iter()
            .any(|e| e["close_reason"] == "closed" && e["bytes_from_client"] == 1000),
        "{doc:#}"
    );
    assert!(
        closed.iter().any(|e| e["close_reason"] == "no_route"
            && e["target"] == "nowhere.cluster-a.svc.cluster.local:1"),
        "{doc:#}"
    );
    assert!(
        closed
            .iter()
            .all(|e| e["state"] == "closed" && e["duration_seconds"].as_f64().is_some())
    );

    // Not on the stats port, which is not loopback-only in a seed.
    let (code, _) = p.stats_get("/debug/connections").await;
    assert_eq!(code, 404);
    drop((silent, npc, h2s));
}

/// Issue 38.4: every close is counted under a fixed reason, from the same
/// place as the listing's closed ring, so the two agree: a tunnel to no
/// route (`dial_refused`), a tunnel both sides closed (`closed`), a NodePort
/// connection left idle (`idle_timeout`), an SNI client that never sends
/// its hello (`client_timeout`).
#[tokio::test]
async fn closes_are_counted_by_reason_as_the_listing_shows_them() {
    let echo = dest::echo().await;
    let np = loopback().await;
    let node_port = np.local_addr().unwrap().port();
    let inv = inventory(
        vec![
            service(
                "cluster-a",
                "echo",
                "Tunneling",
                "ClusterIP",
                &[("raw", 7000, 0)],
            ),
            service(
                "cluster-a",
                "np",
                "NodePort",
                "NodePort",
                &[("raw", 7000, node_port)],
            ),
        ],
        vec![
            slices("cluster-a", "echo", "raw", &[(echo, true)]),
            slices("cluster-a", "np", "raw", &[(echo, true)]),
        ],
    );
    let mut config = test_config();
    config.node_port_idle_timeout = Duration::from_millis(200);
    config.client_hello_timeout = Duration::from_millis(200);
    let p = start_proxy(&inv, vec![np], config).await;

    let (code, _) = connect_h1(p.tunnel, "nowhere.cluster-a.svc.cluster.local:1").await;
    assert_eq!(code, 404);
    let (code, mut h1) = connect_h1(p.tunnel, TUN).await;
    assert_eq!(code, 200);
    assert_eq!(dest::roundtrip(&mut h1, b"abc").await, b"abc");
    h1.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = h1.read_to_end(&mut rest).await;
    let mut idle = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], node_port)))
        .await
        .unwrap();
    assert_eq!(dest::roundtrip(&mut idle, b"x").await, b"x");
    let mut silent = TcpStream::connect(p.sni).await.unwrap();
    // Both end on their own: read to the proxy's close.
    let _ = idle.read_to_end(&mut rest).await;
    let _ = silent.read_to_end(&mut rest).await;

    let doc = until(&p, |d| d["closed"].as_array().is_some_and(|c| c.len() >= 4)).await;
    let cause = |kind: &str, cause: &str| {
        entries(&doc, "closed", kind)
            .iter()
            .filter(|e| e["close_cause"] == cause)
            .count() as f64
    };
    assert_eq!(cause("tunneling", "dial_refused"), 1.0, "{doc:#}");
    assert_eq!(cause("tunneling", "closed"), 1.0, "{doc:#}");
    assert_eq!(cause("nodeport", "idle_timeout"), 1.0, "{doc:#}");
    assert_eq!(cause("sni", "client_timeout"), 1.0, "{doc:#}");
    let (code, text) = p.stats_get("/stats/prometheus").await;
    assert_eq!(code, 200);
    let series = |kind: &str, reason: &str| {
        let name = format!(
            "nodeport_proxy_connections_closed_total{{kind=\"{kind}\",reason=\"{reason}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    for (kind, reason) in [
        ("tunneling", "dial_refused"),
        ("tunneling", "closed"),
        ("nodeport", "idle_timeout"),
        ("sni", "client_timeout"),
    ] {
        assert_eq!(
            series(kind, reason),
            cause(kind, reason),
            "{kind} {reason}\n{text}"
        );
    }
    let counted: usize = text
        .lines()
        .filter(|l| l.starts_with("nodeport_proxy_connections_closed_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as usize)
        .sum();
    assert_eq!(counted, doc["closed"].as_array().unwrap().len(), "{text}");
}
