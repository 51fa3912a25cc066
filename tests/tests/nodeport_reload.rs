//! Table changes: 200 live connections across NodePort, SNI and tunneling
//! listeners survive a reload; connections on removed routes drain until the
//! route drain timeout while new ones are refused; an endpoint going not
//! ready closes nothing; a change to one Service never touches another's
//! connections, even on the same HTTP/2 connection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration_tests::dest;
use integration_tests::konnectivity::metric;
use integration_tests::nodeport::*;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const SNI_HOST: &str = "echo.seed.example.com";
const AUTHORITY: &str = "echo-t.cluster-a.svc.cluster.local:7000";

/// NodePort, SNI and tunneling routes to echo servers, plus `extra` services.
fn table(node_port: u16, echoes: &[std::net::SocketAddr], extra: bool) -> Value {
    let ready: Vec<_> = echoes.iter().map(|e| (*e, true)).collect();
    let mut services = vec![
        service(
            "cluster-a",
            "echo-np",
            "NodePort",
            "NodePort",
            &[("tcp", 7000, node_port)],
        ),
        with_mapping(
            service(
                "cluster-a",
                "echo-sni",
                "SNI",
                "ClusterIP",
                &[("tcp", 7000, 0)],
            ),
            &[("tcp", SNI_HOST)],
        ),
        service(
            "cluster-a",
            "echo-t",
            "Tunneling",
            "ClusterIP",
            &[("tcp", 7000, 0)],
        ),
    ];
    let mut slice_list = vec![
        slices("cluster-a", "echo-np", "tcp", &ready),
        slices("cluster-a", "echo-sni", "tcp", &ready),
        slices("cluster-a", "echo-t", "tcp", &ready),
    ];
    if extra {
        services.push(service(
            "cluster-b",
            "other",
            "Tunneling",
            "ClusterIP",
            &[("tcp", 1, 0)],
        ));
        slice_list.push(slices("cluster-b", "other", "tcp", &[(echoes[0], true)]));
    }
    inventory(services, slice_list)
}

enum Conn {
    Tcp(TcpStream),
    H2(link::h2io::H2Io),
}

async fn echo_once<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, msg: &[u8]) -> bool {
    if s.write_all(msg).await.is_err() {
        return false;
    }
    let mut back = vec![0u8; msg.len()];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back)).await,
        Ok(Ok(_))
    ) && back == msg
}

impl Conn {
    async fn echo(&mut self, msg: &[u8]) -> bool {
        match self {
            Conn::Tcp(s) => echo_once(s, msg).await,
            Conn::H2(s) => echo_once(s, msg).await,
        }
    }
}

async fn open_node_port(port: u16) -> Conn {
    Conn::Tcp(TcpStream::connect(("127.0.0.1", port)).await.unwrap())
}

async fn open_sni(p: &Proxy) -> Conn {
    let mut s = TcpStream::connect(p.sni).await.unwrap();
    let hello = client_hello(SNI_HOST);
    s.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    s.read_exact(&mut back).await.unwrap();
    Conn::Tcp(s)
}

#[tokio::test]
async fn reload_keeps_200_live_connections() {
    let echoes = [dest::echo().await, dest::echo().await];
    let np = loopback().await;
    let port = np.local_addr().unwrap().port();
    let p = start_proxy(&table(port, &echoes[..1], false), vec![np], test_config()).await;
    let h2 = h2_client(p.tunnel).await;
    let mut conns = Vec::new();
    for i in 0..200 {
        let c = match i % 4 {
            0 => open_node_port(port).await,
            1 => open_sni(&p).await,
            2 => {
                let (code, s) = connect_h1(p.tunnel, AUTHORITY).await;
                assert_eq!(code, 200);
                Conn::Tcp(s)
            }
            _ => {
                let (code, io) = connect_h2(&h2, AUTHORITY).await;
                assert_eq!(code, 200);
                Conn::H2(io.unwrap())
            }
        };
        conns.push(c);
    }
    for (i, c) in conns.iter_mut().enumerate() {
        assert!(
            c.echo(format!("before {i}").as_bytes()).await,
            "connection {i} broken before reload"
        );
    }
    let v1 = p.proxy.table().version;
    // Every cluster gains an endpoint and an unrelated service appears.
    p.rewrite(&table(port, &echoes, true)).await;
    assert!(p.proxy.table().version > v1);
    let mut dropped = 0;
    for (i, c) in conns.iter_mut().enumerate() {
        if !c.echo(format!("after {i}").as_bytes()).await {
            dropped += 1;
        }
    }
    assert_eq!(dropped, 0, "connections dropped by the reload");
    // A reload that changes nothing does not bump the version.
    let before = p.proxy.status().borrow().clone();
    p.proxy.reload();
    let mut status = p.proxy.status();
    status.wait_for(|s| s.loads > before.loads).await.unwrap();
    assert_eq!(p.proxy.table().version, before.version);
    // A broken file keeps the table and reports the error.
    std::fs::write(&p.file, "{not json").unwrap();
    p.proxy.reload();
    let loads = status.borrow().loads;
    let failed = status
        .wait_for(|s| s.loads > loads && s.last_error.is_some())
        .await
        .unwrap()
        .clone();
    assert_eq!(failed.version, before.version);
    assert!(conns[0].echo(b"still").await);
}

#[tokio::test]
async fn removed_routes_drain_then_close() {
    let echo = dest::echo().await;
    let np = loopback().await;
    let port = np.local_addr().unwrap().port();
    let mut cfg = test_config();
    cfg.route_drain_timeout = Duration::from_secs(2);
    let p = start_proxy(&table(port, &[echo], false), vec![np], cfg).await;
    let mut live = vec![open_node_port(port).await, open_sni(&p).await];
    let (code, s) = connect_h1(p.tunnel, AUTHORITY).await;
    assert_eq!(code, 200);
    live.push(Conn::Tcp(s));
    for c in live.iter_mut() {
        assert!(c.echo(b"up").await);
    }
    // Only the unrelated service remains.
    let only_other = inventory(
        vec![service(
            "cluster-b",
            "other",
            "Tunneling",
            "ClusterIP",
            &[("tcp", 1, 0)],
        )],
        vec![slices("cluster-b", "other", "tcp", &[(echo, true)])],
    );
    p.rewrite(&only_other).await;
    let started = tokio::time::Instant::now();
    // Draining connections still work ...
    for (i, c) in live.iter_mut().enumerate() {
        assert!(
            c.echo(b"draining").await,
            "connection {i} cut before the drain timeout"
        );
    }
    // ... new ones are refused ...
    assert_eq!(connect_h1(p.tunnel, AUTHORITY).await.0, 404);
    let mut sni = TcpStream::connect(p.sni).await.unwrap();
    sni.write_all(&client_hello(SNI_HOST)).await.unwrap();
    assert!(read_until_closed(&mut sni, Duration::from_secs(5)).await.1);
    // The listener task reacts to the new table on its own, after the swap
    // the test waited for: a busy machine may run it a little later.
    integration_tests::eventually(
        "the removed NodePort's listener to close",
        Duration::from_secs(5),
        || async { TcpStream::connect(("127.0.0.1", port)).await.is_err() },
    )
    .await;
    // ... and the old ones close once the drain timeout passes.
    for (i, c) in live.into_iter().enumerate() {
        let Conn::Tcp(mut s) = c else { unreachable!() };
        let (_, closed) = read_until_closed(&mut s, Duration::from_secs(10)).await;
        assert!(closed, "connection {i} not closed after the drain timeout");
    }
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "closed before the drain timeout"
    );
}

/// A Service `name` tunneled on port 7000 with one slice per endpoint.
fn tunneled(name: &str, endpoints: &[(std::net::SocketAddr, bool)]) -> (Value, Vec<Value>) {
    (
        service(
            "cluster-a",
            name,
            "Tunneling",
            "ClusterIP",
            &[("tcp", 7000, 0)],
        ),
        slices("cluster-a", name, "tcp", endpoints),
    )
}

fn authority(name: &str) -> String {
    format!("{name}.cluster-a.svc.cluster.local:7000")
}

#[tokio::test]
async fn an_endpoint_going_not_ready_keeps_its_connections() {
    let (a, b) = (dest::echo().await, dest::echo().await);
    let mut cfg = test_config();
    cfg.route_drain_timeout = Duration::from_millis(300);
    let (svc, sl) = tunneled("pair", &[(a, true), (b, true)]);
    let p = start_proxy(&inventory(vec![svc], vec![sl]), vec![], cfg).await;
    // Round robin: two tunnels on each endpoint.
    let mut live = Vec::new();
    for _ in 0..4 {
        let (code, s) = connect_h1(p.tunnel, &authority("pair")).await;
        assert_eq!(code, 200);
        live.push(Conn::Tcp(s));
    }
    let (svc, sl) = tunneled("pair", &[(a, false), (b, true)]);
    p.rewrite(&inventory(vec![svc], vec![sl])).await;
    // Well past the route drain timeout, every tunnel still works, the two
    // on the endpoint that left included (Envoy keeps them as well).
    tokio::time::sleep(Duration::from_millis(900)).await;
    for (i, c) in live.iter_mut().enumerate() {
        assert!(c.echo(b"kept").await, "tunnel {i} closed");
    }
    // New tunnels go to the ready endpoint only, and work.
    let (code, mut s) = connect_h1(p.tunnel, &authority("pair")).await;
    assert_eq!(code, 200);
    s.write_all(b"x").await.unwrap();
    let mut one = [0u8; 1];
    s.read_exact(&mut one).await.unwrap();
    let (_, metrics) = p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains(
            "envoy_cluster_membership_healthy{envoy_cluster_name=\"cluster-a/pair-tcp\"} 1\n"
        ),
        "{metrics}"
    );
    // The last ready endpoint going away removes the route: its tunnels
    // drain for the route drain timeout, then close.
    let (svc, sl) = tunneled("pair", &[(a, false), (b, false)]);
    p.rewrite(&inventory(vec![svc], vec![sl])).await;
    assert_eq!(connect_h1(p.tunnel, &authority("pair")).await.0, 404);
    live.push(Conn::Tcp(s));
    for (i, c) in live.into_iter().enumerate() {
        let Conn::Tcp(mut s) = c else { unreachable!() };
        let (_, closed) = read_until_closed(&mut s, Duration::from_secs(10)).await;
        assert!(
            closed,
            "tunnel {i} not closed after the route drain timeout"
        );
    }
}

#[tokio::test]
async fn a_change_to_one_service_never_touches_another() {
    // KKP's Envoy puts every tunneled Service in one filter chain, so any
    // change drains every 8088 connection; here each route drains alone,
    // even when both tunnels share one HTTP/2 connection.
    let echo = dest::echo().await;
    let mut cfg = test_config();
    cfg.route_drain_timeout = Duration::from_millis(300);
    let (sa, la) = tunneled("stay", &[(echo, true)]);
    let (sb, lb) = tunneled("go", &[(echo, true)]);
    let p = start_proxy(
        &inventory(vec![sa.clone(), sb], vec![la.clone(), lb]),
        vec![],
        cfg,
    )
    .await;
    let client = h2_client(p.tunnel).await;
    let (code, stay_h2) = connect_h2(&client, &authority("stay")).await;
    assert_eq!(code, 200);
    let (code, go_h2) = connect_h2(&client, &authority("go")).await;
    assert_eq!(code, 200);
    let (code, stay_h1) = connect_h1(p.tunnel, &authority("stay")).await;
    assert_eq!(code, 200);
    let mut go_h2 = go_h2.unwrap();
    let mut stay = [Conn::H2(stay_h2.unwrap()), Conn::Tcp(stay_h1)];
    // Service "go" is deleted; "stay" is changed too (a second endpoint).
    let other = dest::echo().await;
    let (sa2, la2) = tunneled("stay", &[(echo, true), (other, true)]);
    p.rewrite(&inventory(vec![sa2], vec![la2])).await;
    let (_, closed) = read_until_closed(&mut go_h2, Duration::from_secs(10)).await;
    assert!(closed, "the removed Service's tunnel did not end");
    // Past its drain, "stay"'s tunnels, on the same HTTP/2 connection and
    // on their own, are untouched.
    for (i, c) in stay.iter_mut().enumerate() {
        assert!(
            c.echo(b"untouched").await,
            "tunnel {i} of the other Service"
        );
    }
    assert_eq!(connect_h2(&client, &authority("stay")).await.0, 200);
    drop((sa, la));
}

/// A broken table file is one failure, however busy its directory is; the
/// proxy keeps its table, says why in /healthz (still 200) and in metrics,
/// and takes the repaired file. /ready fails once the file has been broken
/// longer than -ready-out-of-sync-limit (1 ms here) and is 200 again with
/// the repaired file; nodeport_proxy_source_synced follows.
#[tokio::test]
async fn a_broken_file_is_reported_once_and_shown_in_health() {
    let echo = dest::echo().await;
    let np = loopback().await;
    let port = np.local_addr().unwrap().port();
    let config = nodeport_proxy::ProxyConfig {
        ready_out_of_sync_limit: Duration::from_millis(1),
        ..test_config()
    };
    let p = start_proxy(&table(port, &[echo], false), vec![np], config).await;
    let (code, body) = p.stats_get("/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    assert_eq!(p.stats_get("/ready").await, (200, "ok\n".to_string()));
    let synced = |m: &str| {
        assert!(m.contains("\nnodeport_proxy_source_synced "), "{m}");
        metric(m, "nodeport_proxy_source_synced ")
    };
    assert_eq!(synced(&p.stats_get("/stats/prometheus").await.1), 1.0);
    let before = p.proxy.status().borrow().clone();
    let mut status = p.proxy.status();
    let tmp = p.file.with_extension("tmp");
    std::fs::write(&tmp, "{\"services\": [").unwrap();
    std::fs::rename(&tmp, &p.file).unwrap();
    status
        .wait_for(|s| s.loads > before.loads && s.last_error.is_some())
        .await
        .unwrap();
    let (code, body) = p.stats_get("/healthz").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("routing table: last reload failed: parsing")
            && body.contains(p.file.to_str().unwrap()),
        "{body}"
    );
    let body = integration_tests::eventually_some(
        "/ready failing past the limit",
        Duration::from_secs(10),
        || async {
            let (code, body) = p.stats_get("/ready").await;
            (code == 503).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("table file (-config) out of sync for")
            && body.contains("-ready-out-of-sync-limit")
            && body.contains("last load failed: parsing"),
        "{body}"
    );
    assert_eq!(synced(&p.stats_get("/stats/prometheus").await.1), 0.0);
    // A busy directory (a log written next to the file) is not a reload.
    let log = p.file.with_file_name("proxy.log");
    for i in 0..50 {
        std::fs::write(&log, format!("line {i}\n")).unwrap();
    }
    // Nor is the same broken content written again.
    std::fs::write(&p.file, "{\"services\": [").unwrap();
    // The repaired file is taken.
    let v = p.proxy.table().version;
    p.rewrite(&table(port, &[echo], true)).await;
    assert!(p.proxy.table().version > v);
    let (_, m) = p.stats_get("/stats/prometheus").await;
    assert_eq!(
        metric(&m, "nodeport_proxy_table_reloads_total{result=\"failed\"} "),
        1.0,
        "{m}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let last = metric(
        &m,
        "nodeport_proxy_table_last_reload_success_timestamp_seconds ",
    );
    assert!((now - last).abs() < 60.0, "{last} vs {now}");
    assert_eq!(synced(&m), 1.0);
    assert_eq!(p.stats_get("/healthz").await.1, "ok\n");
    assert_eq!(p.stats_get("/ready").await, (200, "ok\n".to_string()));
}

/// A node port that another process holds is retried with back-off, shown
/// in /healthz and metrics, and served once it is free.
#[tokio::test]
async fn a_taken_node_port_is_retried_and_shown() {
    let echo = dest::echo().await;
    let blocker = integration_tests::nodeport::listener_below_ephemeral_ports();
    let port = blocker.local_addr().unwrap().port();
    let p = start_proxy(&table(port, &[echo], false), Vec::new(), test_config()).await;
    let unbound = |m: &str| metric(m, "nodeport_proxy_node_ports_unbound ");
    let wait_metric = |want: f64| {
        let stats = p.stats;
        async move {
            tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    let (_, m) = http_get(stats, "/stats/prometheus").await;
                    if unbound(&m) == want {
                        return m;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("node port state not reached")
        }
    };
    let m = wait_metric(1.0).await;
    assert!(metric(&m, "nodeport_proxy_node_port_bind_failures_total ") >= 1.0);
    let (code, body) = p.stats_get("/healthz").await;
    assert_eq!(code, 200);
    assert!(
        body.contains(&format!(
            "node port {port}: not listening: binding 127.0.0.1:{port}"
        )),
        "{body}"
    );
    // Freed: the retry binds it and connections are served.
    drop(blocker);
    wait_metric(0.0).await;
    let mut c = open_node_port(port).await;
    assert!(c.echo(b"bound at last").await);
    assert_eq!(p.stats_get("/healthz").await.1, "ok\n");
}
