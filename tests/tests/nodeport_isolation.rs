//! Per-cluster fault isolation (issue 38, KKP #15962): one cluster whose
//! apiserver is blackholed (connects never answered) and one whose apiserver
//! is stalled (accepts, never reads) are flooded while a third keeps
//! working. Each faulty cluster stops at its circuit breakers — pending
//! connects, open connections, buffered bytes — and refuses the rest at
//! once (SNI: closed; CONNECT: 503) with the reason in the access log and
//! Envoy's per-cluster counters; the third never notices.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use integration_tests::dest;
use integration_tests::konnectivity::metric;
use integration_tests::nodeport::*;
use nodeport_proxy::relay::admission::ClusterLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOLE: &str = "hole.seed.example.com";
const STALL: &str = "stall.seed.example.com";
const ECHO: &str = "echo.seed.example.com";
const HOLE_AUTHORITY: &str = "hole.cluster-b.svc.cluster.local:6443";

fn inventory3(hole: SocketAddr, stall: SocketAddr, echo: SocketAddr) -> serde_json::Value {
    inventory(
        vec![
            with_mapping(
                service(
                    "cluster-b",
                    "hole",
                    "SNI,Tunneling",
                    "ClusterIP",
                    &[("https", 6443, 0)],
                ),
                &[("https", HOLE)],
            ),
            with_mapping(
                service(
                    "cluster-c",
                    "stall",
                    "SNI",
                    "ClusterIP",
                    &[("https", 6443, 0)],
                ),
                &[("https", STALL)],
            ),
            with_mapping(
                service(
                    "cluster-a",
                    "echo",
                    "SNI",
                    "ClusterIP",
                    &[("https", 6443, 0)],
                ),
                &[("https", ECHO)],
            ),
        ],
        vec![
            slices("cluster-b", "hole", "https", &[(hole, true)]),
            slices("cluster-c", "stall", "https", &[(stall, true)]),
            slices("cluster-a", "echo", "https", &[(echo, true)]),
        ],
    )
}

/// One of a cluster's series on the stats port.
async fn cluster_metric(p: &Proxy, name: &str, cluster: &str) -> f64 {
    let (_, text) = p.stats_get("/stats/prometheus").await;
    metric(
        &text,
        &format!("{name}{{envoy_cluster_name=\"{cluster}\"}}"),
    )
}

/// Polls a cluster's series until `want` holds (bounded: a hang guard, not
/// a timing assertion).
async fn wait_metric(p: &Proxy, name: &str, cluster: &str, want: impl Fn(f64) -> bool) -> f64 {
    let what = format!("{name}{{{cluster}}} to reach the expected value");
    integration_tests::eventually_some(&what, Duration::from_secs(30), || {
        let v = cluster_metric(p, name, cluster);
        let want = &want;
        async move {
            let v = v.await;
            want(v).then_some(v)
        }
    })
    .await
}

/// An SNI client for `host` that sends its ClientHello (and `extra` bytes
/// after it) and counts itself in `closed` once the proxy closes it.
fn flood_one(
    p: SocketAddr,
    host: &'static str,
    extra: usize,
    closed: &Arc<AtomicUsize>,
    got_bytes: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    flood_gated(p, host, extra, None, closed, got_bytes)
}

/// [`flood_one`] that sends its `extra` bytes only once it gets a permit
/// from `gate`.
fn flood_gated(
    p: SocketAddr,
    host: &'static str,
    extra: usize,
    gate: Option<Arc<tokio::sync::Semaphore>>,
    closed: &Arc<AtomicUsize>,
    got_bytes: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let closed = closed.clone();
    let got_bytes = got_bytes.clone();
    tokio::spawn(async move {
        let Ok(mut s) = TcpStream::connect(p).await else {
            return;
        };
        let (mut r, mut w) = s.split();
        let send = async {
            let _ = w.write_all(&client_hello(host)).await;
            if let Some(gate) = &gate {
                let _ = gate.acquire().await.map(|p| p.forget());
            }
            let _ = w.write_all(&vec![0u8; extra]).await;
            std::future::pending::<()>().await;
        };
        let read = async {
            let mut b = [0u8; 1024];
            loop {
                match r.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        got_bytes.fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
        };
        tokio::select! {
            _ = send => {}
            _ = read => {}
        }
        closed.fetch_add(1, Ordering::Relaxed);
    })
}

async fn wait_count(c: &AtomicUsize, want: usize) {
    integration_tests::eventually(&format!("{want} counted"), Duration::from_secs(30), || {
        let n = c.load(Ordering::Relaxed);
        async move { n >= want }
    })
    .await
}

/// The working cluster answers, through a fresh connection.
async fn echo_works(p: &Proxy) {
    echo_from(p, [127, 0, 0, 1]).await;
}

async fn access_log_lines(path: &std::path::Path, want: usize) -> Vec<serde_json::Value> {
    let what = format!("{want} access-log lines");
    integration_tests::eventually_some(&what, Duration::from_secs(10), || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        async move { (lines.len() >= want).then_some(lines) }
    })
    .await
}

/// The blackholed cluster holds at most its pending connects, the stalled
/// one at most its open connections; everything past them is refused at
/// once, counted and logged, and the third cluster is served throughout.
#[tokio::test]
async fn a_blackholed_and_a_stalled_cluster_stop_at_their_bounds() {
    const PENDING: usize = 16;
    const OPEN: usize = 48;
    const HOLE_FLOOD: usize = 200;
    const STALL_FLOOD: usize = 150;
    const ROUND: usize = 10;
    let hole = dest::blackhole().await;
    let stall = dest::stalled().await;
    let echo = dest::echo().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let mut cfg = test_config();
    // Pending connects stay pending for the whole test.
    cfg.upstream_connect_timeout = Duration::from_secs(120);
    cfg.cluster_limits = ClusterLimits {
        max_connections: OPEN,
        max_pending: PENDING,
        max_buffered: 0,
    };
    cfg.access_log = Some(nodeport_proxy::relay::access_log::AccessLogConfig {
        path: log.display().to_string(),
        format: nodeport_proxy::relay::access_log::Format::Json,
    });
    let p = start_proxy(&inventory3(hole.addr, stall.addr, echo), vec![], cfg).await;
    echo_works(&p).await;

    // Blackholed: PENDING connects wait, the rest are closed at once with
    // no byte sent.
    let closed = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicUsize::new(0));
    let mut clients: Vec<_> = (0..HOLE_FLOOD)
        .map(|_| flood_one(p.sni, HOLE, 0, &closed, &bytes))
        .collect();
    let hole_cluster = "cluster-b/hole-https";
    let overflow = HOLE_FLOOD - PENDING;
    wait_metric(
        &p,
        "envoy_cluster_upstream_rq_pending_overflow",
        hole_cluster,
        |v| v >= overflow as f64,
    )
    .await;
    wait_count(&closed, overflow).await;
    echo_works(&p).await;
    let m = |name| cluster_metric(&p, name, hole_cluster);
    assert_eq!(
        m("envoy_cluster_upstream_rq_pending_overflow").await,
        overflow as f64
    );
    assert_eq!(
        m("envoy_cluster_upstream_rq_pending_active").await,
        PENDING as f64
    );
    assert_eq!(
        m("envoy_cluster_circuit_breakers_default_rq_pending_open").await,
        1.0
    );
    assert_eq!(
        m("envoy_cluster_circuit_breakers_default_remaining_pending").await,
        0.0
    );
    assert_eq!(
        m("envoy_cluster_circuit_breakers_default_remaining_cx").await,
        (OPEN - PENDING) as f64
    );
    assert_eq!(closed.load(Ordering::Relaxed), overflow);
    assert_eq!(bytes.load(Ordering::Relaxed), 0);
    // A CONNECT to the same cluster is refused with 503 at once.
    let (code, _) = connect_h1(p.tunnel, HOLE_AUTHORITY).await;
    assert_eq!(code, 503);

    // Stalled: OPEN connections are relayed (their ClientHellos reach the
    // destination, which never reads), the rest closed at once.
    // In rounds smaller than the pending bound: each connect here is
    // answered at once, so only the open connections' bound is reached.
    let closed_stall = Arc::new(AtomicUsize::new(0));
    let stall_cluster = "cluster-c/stall-https";
    let refused = STALL_FLOOD - OPEN;
    for round in 1..=STALL_FLOOD / ROUND {
        clients.extend((0..ROUND).map(|_| flood_one(p.sni, STALL, 0, &closed_stall, &bytes)));
        let target = (round * ROUND) as f64;
        let (decided, text) = integration_tests::eventually_some(
            "each connection admitted or refused",
            Duration::from_secs(30),
            || {
                let p = &p;
                async move {
                    let (_, text) = p.stats_get("/stats/prometheus").await;
                    let m = |name: &str| {
                        metric(
                            &text,
                            &format!("{name}{{envoy_cluster_name=\"{stall_cluster}\"}}"),
                        )
                    };
                    let decided = m("envoy_cluster_upstream_cx_total")
                        + m("envoy_cluster_upstream_cx_overflow");
                    (decided >= target).then_some((decided, text))
                }
            },
        )
        .await;
        assert_eq!(decided, target, "{text}");
    }
    wait_count(&closed_stall, refused).await;
    echo_works(&p).await;
    let m = |name| cluster_metric(&p, name, stall_cluster);
    assert_eq!(
        m("envoy_cluster_upstream_cx_overflow").await,
        refused as f64
    );
    assert_eq!(m("envoy_cluster_upstream_cx_active").await, OPEN as f64);
    assert_eq!(
        m("envoy_cluster_circuit_breakers_default_cx_open").await,
        1.0
    );
    assert_eq!(
        m("envoy_cluster_circuit_breakers_default_remaining_cx").await,
        0.0
    );
    assert_eq!(m("envoy_cluster_upstream_rq_pending_overflow").await, 0.0);
    assert_eq!(closed_stall.load(Ordering::Relaxed), refused);

    // The working cluster was never refused.
    let m = |name| cluster_metric(&p, name, "cluster-a/echo-https");
    assert_eq!(m("envoy_cluster_upstream_cx_overflow").await, 0.0);
    assert_eq!(m("envoy_cluster_upstream_rq_pending_overflow").await, 0.0);
    assert_eq!(m("envoy_cluster_upstream_cx_total").await, 3.0);

    // Each refusal has its line: flag UO and the bound that refused it.
    let lines = access_log_lines(&log, overflow + refused + 1).await;
    let count = |reason: &str| {
        lines
            .iter()
            .filter(|l| l["connection_termination_details"] == reason)
            .inspect(|l| assert_eq!(l["response_flags"], "UO", "{l}"))
            .count()
    };
    // The CONNECT's line is one of the pending refusals.
    assert_eq!(count("upstream_rq_pending_overflow"), overflow + 1);
    assert_eq!(count("upstream_cx_overflow"), refused);
    let (_, text) = p.stats_get("/stats/prometheus").await;
    assert!(
        text.contains("reason=\"upstream_rq_pending_overflow\"} "),
        "no rejected_connections_total for the pending overflow"
    );

    // Once the stalled destination goes away its slots come back.
    drop(stall);
    wait_metric(&p, "envoy_cluster_upstream_cx_active", stall_cluster, |v| {
        v == 0.0
    })
    .await;
    assert_eq!(
        cluster_metric(
            &p,
            "envoy_cluster_circuit_breakers_default_remaining_cx",
            stall_cluster
        )
        .await,
        OPEN as f64
    );
    for c in clients {
        c.abort();
    }
}

/// A stalled cluster's connections hold what they read in the proxy's
/// buffers; past the cluster's byte budget it admits no new connection, the
/// bytes it holds stay within the budget plus one buffer per direction of
/// each connection admitted before, and all of it is given back when the
/// connections end.
#[tokio::test]
async fn a_stalled_cluster_stops_at_its_buffered_bytes() {
    // One full 64 KiB chunk per connection: two of them pass the budget.
    const BUFFER: usize = 64 << 10;
    const BUDGET: usize = BUFFER;
    const CONNS: usize = 3;
    let stall = dest::stalled().await;
    let hole = dest::blackhole().await;
    let echo = dest::echo().await;
    let mut cfg = test_config();
    cfg.buffer_size = BUFFER;
    // The budget counts the copying relay's buffers; a spliced connection
    // holds its bytes in kernel pipes instead.
    cfg.splice = false;
    cfg.cluster_limits = ClusterLimits {
        max_buffered: BUDGET,
        ..ClusterLimits::default()
    };
    let p = start_proxy(&inventory3(hole.addr, stall.addr, echo), vec![], cfg).await;
    let stall_cluster = "cluster-c/stall-https";
    let closed = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicUsize::new(0));
    // Each sends 8 MiB after its ClientHello: more than the kernel buffers
    // between the proxy and the stalled destination take (the proxy's send
    // buffer grows up to tcp_wmem's 4 MiB), so the proxy's relay ends up
    // holding a chunk it cannot write.
    // They send only once all are admitted: a connection whose chunk
    // filled the budget first would have the others refused, and the
    // budget never passed.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut clients: Vec<_> = (0..CONNS)
        .map(|_| flood_gated(p.sni, STALL, 8 << 20, Some(gate.clone()), &closed, &bytes))
        .collect();
    wait_metric(&p, "envoy_cluster_upstream_cx_active", stall_cluster, |v| {
        v == CONNS as f64
    })
    .await;
    gate.add_permits(CONNS);
    let held = wait_metric(
        &p,
        "envoy_cluster_upstream_cx_tx_bytes_buffered",
        stall_cluster,
        |v| v > BUDGET as f64,
    )
    .await;
    // Past the budget: a newcomer is refused at once.
    let late = Arc::new(AtomicUsize::new(0));
    clients.push(flood_one(p.sni, STALL, 0, &late, &bytes));
    wait_count(&late, 1).await;
    echo_works(&p).await;
    let admitted = cluster_metric(&p, "envoy_cluster_upstream_cx_active", stall_cluster).await;
    assert!(admitted <= CONNS as f64);
    assert!(cluster_metric(&p, "envoy_cluster_upstream_cx_overflow", stall_cluster).await >= 1.0);
    // The bound holds at every instant; two samples of it.
    let held_now = cluster_metric(
        &p,
        "envoy_cluster_upstream_cx_tx_bytes_buffered",
        stall_cluster,
    )
    .await;
    let bound = BUDGET as f64 + admitted * 2.0 * BUFFER as f64;
    assert!(
        held <= bound && held_now <= bound,
        "{held} / {held_now} bytes held, bound {bound}"
    );
    assert_eq!(
        cluster_metric(
            &p,
            "envoy_cluster_upstream_cx_tx_bytes_buffered",
            "cluster-a/echo-https"
        )
        .await,
        0.0
    );
    // The stalled destination goes away: everything is given back.
    drop(stall);
    wait_metric(&p, "envoy_cluster_upstream_cx_active", stall_cluster, |v| {
        v == 0.0
    })
    .await;
    assert_eq!(
        cluster_metric(
            &p,
            "envoy_cluster_upstream_cx_tx_bytes_buffered",
            stall_cluster
        )
        .await,
        0.0
    );
    assert_eq!(
        cluster_metric(
            &p,
            "envoy_cluster_upstream_cx_rx_bytes_buffered",
            stall_cluster
        )
        .await,
        0.0
    );
    // And the cluster admits again (its destination is gone now, so the
    // connect fails, but it is attempted, not refused).
    let before = cluster_metric(&p, "envoy_cluster_upstream_cx_overflow", stall_cluster).await;
    let again = Arc::new(AtomicUsize::new(0));
    clients.push(flood_one(p.sni, STALL, 0, &again, &bytes));
    wait_count(&again, 1).await;
    assert_eq!(
        cluster_metric(&p, "envoy_cluster_upstream_cx_overflow", stall_cluster).await,
        before
    );
    for c in clients {
        c.abort();
    }
}

/// A connection from `source` to the SNI listener.
async fn sni_from(p: &Proxy, source: [u8; 4]) -> TcpStream {
    connect_from(source.into(), p.sni).await
}

/// The working cluster answers a fresh connection from `source`.
async fn echo_from(p: &Proxy, source: [u8; 4]) {
    let mut s = sni_from(p, source).await;
    let hello = client_hello(ECHO);
    s.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut back))
        .await
        .expect("the working cluster stopped answering")
        .unwrap();
    assert_eq!(back, hello);
}

async fn proxy_metric(p: &Proxy, name: &str) -> f64 {
    let (_, text) = p.stats_get("/stats/prometheus").await;
    metric(&text, &format!("{name} "))
}

/// With `-sni-overflow-slow-lane`, a client refused by a cluster's bound
/// is flagged, and the kernel sends its next connections to the slow lane
/// (they are still served, and counted as taken from it) while other
/// clients' connections reach the listener as before. Off (the default),
/// the same refusal flags nobody.
#[tokio::test]
async fn a_client_refused_by_a_bound_takes_the_slow_lane() {
    const OPEN: usize = 2;
    const FLOODER: [u8; 4] = [127, 0, 0, 2];
    const WORKER: [u8; 4] = [127, 0, 0, 1];
    for on in [true, false] {
        let hole = dest::blackhole().await;
        let stall = dest::stalled().await;
        let echo = dest::echo().await;
        let mut cfg = test_config();
        cfg.cluster_limits = ClusterLimits {
            max_connections: OPEN,
            max_pending: 0,
            max_buffered: 0,
        };
        if on {
            cfg.sni_overflow_slow_lane = Duration::from_secs(600);
        }
        let p = start_proxy(&inventory3(hole.addr, stall.addr, echo), vec![], cfg).await;
        let stall_cluster = "cluster-c/stall-https";
        // The stalled cluster's bound, taken by the flooder's connections.
        let mut held = Vec::new();
        for _ in 0..OPEN {
            let mut s = sni_from(&p, FLOODER).await;
            s.write_all(&client_hello(STALL)).await.unwrap();
            held.push(s);
        }
        wait_metric(&p, "envoy_cluster_upstream_cx_active", stall_cluster, |v| {
            v >= OPEN as f64
        })
        .await;
        assert_eq!(
            proxy_metric(&p, "nodeport_proxy_slow_lane_clients").await,
            0.0
        );
        // One more is refused at once.
        let mut refused = sni_from(&p, FLOODER).await;
        refused.write_all(&client_hello(STALL)).await.unwrap();
        let mut b = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(30), refused.read(&mut b))
            .await
            .expect("the refused connection was not closed");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        assert_eq!(
            cluster_metric(&p, "envoy_cluster_upstream_cx_overflow", stall_cluster).await,
            1.0
        );
        let flagged = if on { 1.0 } else { 0.0 };
        assert_eq!(
            proxy_metric(&p, "nodeport_proxy_slow_lane_clients").await,
            flagged
        );
        // Another client is not slowed: its connection reaches the listener.
        echo_from(&p, WORKER).await;
        assert_eq!(
            proxy_metric(&p, "nodeport_proxy_slow_lane_accepted_total").await,
            0.0
        );
        // The flagged client still reaches a working cluster, by the lane.
        echo_from(&p, FLOODER).await;
        assert_eq!(
            proxy_metric(&p, "nodeport_proxy_slow_lane_accepted_total").await,
            flagged,
            "slow lane {}",
            if on { "on" } else { "off" }
        );
        drop(held);
    }
}
