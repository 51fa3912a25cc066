//! The tunneling listener with real clients: curl's HTTP/1.1 CONNECT, many
//! HTTP/2 CONNECT streams on one connection, exact-authority routing (404),
//! unreachable upstreams (503), early data, malformed requests and slow
//! clients.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::dest;
use integration_tests::nodeport::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SVC_HOST: &str = "web.cluster-a.svc.cluster.local";
const ECHO: &str = "echo.cluster-a.svc.cluster.local:7000";
const DEAD: &str = "dead.cluster-a.svc.cluster.local:9";

struct Setup {
    p: Proxy,
    pki: Pki,
    _refused: socket2::Socket,
}

async fn setup() -> Setup {
    setup_with(&[], |_| {}).await
}

/// The web, echo and dead Services, plus `extra` (name, port, backend)
/// ones of cluster-a; `tune` adjusts the proxy's flags.
async fn setup_with(
    extra: &[(&str, u16, std::net::SocketAddr)],
    tune: impl FnOnce(&mut nodeport_proxy::config::ProxyConfig),
) -> Setup {
    let pki = Pki::new();
    let web = tls_named(&pki, "web", &[SVC_HOST]).await;
    let echo = dest::echo().await;
    let (refused_sock, refused) = dest::refused();
    let mut backends = vec![
        ("web", "https", 8080, web),
        ("echo", "tcp", 7000, echo),
        ("dead", "tcp", 9, refused),
    ];
    backends.extend(
        extra
            .iter()
            .map(|&(name, port, addr)| (name, "tcp", port, addr)),
    );
    let inv = inventory(
        backends
            .iter()
            .map(|&(name, port_name, port, _)| {
                service(
                    "cluster-a",
                    name,
                    "Tunneling",
                    "ClusterIP",
                    &[(port_name, port, 0)],
                )
            })
            .collect(),
        backends
            .iter()
            .map(|&(name, port_name, _, addr)| {
                slices("cluster-a", name, port_name, &[(addr, true)])
            })
            .collect(),
    );
    let mut cfg = test_config();
    cfg.request_header_timeout = Duration::from_millis(500);
    tune(&mut cfg);
    Setup {
        p: start_proxy(&inv, vec![], cfg).await,
        pki,
        _refused: refused_sock,
    }
}

#[tokio::test]
async fn curl_http1_connect_reaches_tls_service() {
    let s = setup().await;
    let proxy = format!("http://127.0.0.1:{}", s.p.tunnel.port());
    let ca = s.pki.ca();
    let url = format!("https://{SVC_HOST}:8080/");
    let (ok, body, err) = curl(&["--proxy", &proxy, "--cacert", ca.to_str().unwrap(), &url]).await;
    assert!(ok, "curl through CONNECT failed: {err}");
    assert_eq!(body, "web");
    // The same path with a port nobody exposes is a 404 from the proxy.
    let url = format!("https://{SVC_HOST}:8443/");
    let (ok, _, err) = curl(&["--proxy", &proxy, "--cacert", ca.to_str().unwrap(), &url]).await;
    assert!(!ok);
    assert!(err.contains("404"), "{err}");
}

#[tokio::test]
async fn http2_connect_many_streams_on_one_connection() {
    let s = setup().await;
    let client = h2_client(s.p.tunnel).await;
    let mut tasks = Vec::new();
    for i in 0..16u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let (code, io) = connect_h2(&client, ECHO).await;
            assert_eq!(code, 200);
            let mut io = io.unwrap();
            let msg = format!("stream {i} payload").repeat(1000);
            io.write_all(msg.as_bytes()).await.unwrap();
            let mut back = vec![0u8; msg.len()];
            io.read_exact(&mut back).await.unwrap();
            assert_eq!(back, msg.as_bytes());
            io
        }));
    }
    // All sixteen are open at the same time before any is closed.
    let mut open = Vec::new();
    for t in tasks {
        open.push(t.await.unwrap());
    }
    let (_, metrics) = s.p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains(
            "envoy_http_downstream_cx_total{envoy_http_conn_manager_prefix=\"ingress_http\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "envoy_http_downstream_rq_active{envoy_http_conn_manager_prefix=\"ingress_http\"} 16"
        ),
        "{metrics}"
    );
    drop(open);
    // Unknown authority and unreachable upstream on the same connection.
    assert_eq!(
        connect_h2(&client, "nope.cluster-a.svc.cluster.local:7000")
            .await
            .0,
        404
    );
    assert_eq!(
        connect_h2(&client, "echo.cluster-a.svc.cluster.local:7001")
            .await
            .0,
        404
    );
    assert_eq!(connect_h2(&client, DEAD).await.0, 503);
    // The connection still carries new tunnels.
    assert_eq!(connect_h2(&client, ECHO).await.0, 200);
}

/// The tunnels-per-replica cap (`-max-connections-per-listener` on the
/// tunneling listener, issue 15.5): a CONNECT beyond it gets 503 and counts
/// as `reason="overloaded"`; a tunnel that closes makes room again.
#[tokio::test]
async fn tunnels_beyond_the_cap_get_503_and_are_counted() {
    const CAP: usize = 4;
    let s = setup_with(&[], |c| c.max_connections_per_listener = CAP).await;
    let client = h2_client(s.p.tunnel).await;
    let mut open = Vec::new();
    for _ in 0..CAP {
        let (code, io) = connect_h2(&client, ECHO).await;
        assert_eq!(code, 200);
        open.push(io.unwrap());
    }
    assert_eq!(connect_h2(&client, ECHO).await.0, 503);
    // The cap counts tunnels, whichever protocol carries them.
    assert_eq!(connect_h1(s.p.tunnel, ECHO).await.0, 503);
    let overloaded = format!(
        "nodeport_proxy_rejected_connections_total{{envoy_listener_address=\"127.0.0.1_{}\",reason=\"overloaded\"}}",
        s.p.tunnel.port()
    );
    let (_, m) = s.p.stats_get("/stats/prometheus").await;
    assert_eq!(
        integration_tests::konnectivity::metric(&m, &overloaded),
        2.0,
        "{m}"
    );
    // The open tunnels still carry data.
    for io in &mut open {
        io.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        io.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
    }
    // One closes: its permit comes back once the proxy has seen the end.
    let mut gone = open.pop().unwrap();
    gone.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), gone.read_to_end(&mut rest)).await;
    drop(gone);
    let io = integration_tests::eventually_some(
        "the closed tunnel's permit to come back",
        Duration::from_secs(10),
        || async {
            let (code, io) = connect_h2(&client, ECHO).await;
            assert!(code == 200 || code == 503, "{code}");
            io
        },
    )
    .await;
    open.push(io);
}

#[tokio::test]
async fn http1_statuses_and_early_data() {
    let s = setup().await;
    assert_eq!(
        connect_h1(s.p.tunnel, "nope.cluster-a.svc.cluster.local:1")
            .await
            .0,
        404
    );
    assert_eq!(connect_h1(s.p.tunnel, DEAD).await.0, 503);
    // Data sent right behind the request head, before the 200, is delivered.
    let mut c = TcpStream::connect(s.p.tunnel).await.unwrap();
    c.write_all(format!("CONNECT {ECHO} HTTP/1.1\r\nHost: {ECHO}\r\n\r\nearly-bytes").as_bytes())
        .await
        .unwrap();
    let want = b"HTTP/1.1 200 OK\r\n\r\nearly-bytes";
    let mut got = vec![0u8; want.len()];
    c.read_exact(&mut got).await.unwrap();
    assert_eq!(got, want);
}

#[tokio::test]
async fn malformed_requests_get_clear_statuses() {
    let s = setup().await;
    let mut many = format!("CONNECT {ECHO} HTTP/1.1\r\n");
    for i in 0..100 {
        many.push_str(&format!("x-{i}: y\r\n"));
    }
    many.push_str("\r\n");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        // Envoy: no route matches anything but CONNECT.
        ("GET", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "404"),
        (
            "no port",
            b"CONNECT echo.cluster-a.svc.cluster.local HTTP/1.1\r\n\r\n".to_vec(),
            "400",
        ),
        (
            "path target",
            b"CONNECT /x HTTP/1.1\r\n\r\n".to_vec(),
            "400",
        ),
        (
            "bad header",
            format!("CONNECT {ECHO} HTTP/1.1\r\nno colon here\r\n\r\n").into_bytes(),
            "400",
        ),
        ("garbage", b"\x16\x03\x01garbage\r\n\r\n".to_vec(), "400"),
        ("too many headers", many.into_bytes(), "431"),
        ("huge line", vec![b'C'; 9000], "431"),
    ];
    for (name, bytes, want) in cases {
        let mut c = TcpStream::connect(s.p.tunnel).await.unwrap();
        c.write_all(&bytes).await.unwrap();
        let (got, closed) = read_until_closed(&mut c, Duration::from_secs(5)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {want} ")),
            "{name}: {text}"
        );
        assert!(closed, "{name}: not closed");
    }
}

#[tokio::test]
async fn slow_and_broken_clients_do_not_disturb_others() {
    let s = setup().await;
    // Never finishes its request head.
    let mut slow_h1 = TcpStream::connect(s.p.tunnel).await.unwrap();
    slow_h1.write_all(b"CONNECT echo.cluster-a").await.unwrap();
    // Sends the HTTP/2 preface, then nothing.
    let mut slow_h2 = TcpStream::connect(s.p.tunnel).await.unwrap();
    slow_h2
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // Sends a broken HTTP/2 preface.
    let mut broken_h2 = TcpStream::connect(s.p.tunnel).await.unwrap();
    broken_h2
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\xff\xff")
        .await
        .unwrap();
    // Connects and sends nothing at all.
    let mut silent = TcpStream::connect(s.p.tunnel).await.unwrap();

    let (code, mut tunnel) = connect_h1(s.p.tunnel, ECHO).await;
    assert_eq!(code, 200);
    tunnel.write_all(b"still fine").await.unwrap();
    let mut back = [0u8; 10];
    tunnel.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still fine");

    let (got, closed) = read_until_closed(&mut slow_h1, Duration::from_secs(5)).await;
    assert!(closed, "slow HTTP/1.1 client not closed");
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 408 "),
        "{}",
        String::from_utf8_lossy(&got)
    );
    for (name, c) in [
        ("slow h2", &mut slow_h2),
        ("broken h2", &mut broken_h2),
        ("silent", &mut silent),
    ] {
        let (_, closed) = read_until_closed(c, Duration::from_secs(5)).await;
        assert!(closed, "{name} not closed");
    }
    // The tunnel opened before them still works.
    tunnel.write_all(b"and after").await.unwrap();
    let mut back = [0u8; 9];
    tunnel.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"and after");
}

#[tokio::test]
async fn one_connect_attempt_per_tunnel_as_envoy() {
    // Two endpoints, one refusing: round robin sends every other tunnel to
    // it, and (Envoy's tcp_proxy default, max_connect_attempts 1) that
    // tunnel gets 503 instead of a silent retry on the other endpoint.
    let echo = dest::echo().await;
    let (_refused_sock, refused) = dest::refused();
    let inv = inventory(
        vec![service(
            "cluster-a",
            "half",
            "Tunneling",
            "ClusterIP",
            &[("tcp", 7000, 0)],
        )],
        vec![slices(
            "cluster-a",
            "half",
            "tcp",
            &[(echo, true), (refused, true)],
        )],
    );
    let p = start_proxy(&inv, vec![], test_config()).await;
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(
            connect_h1(p.tunnel, "half.cluster-a.svc.cluster.local:7000")
                .await
                .0,
        );
    }
    codes.sort_unstable();
    assert_eq!(codes, [200, 200, 200, 503, 503, 503]);
    let (_, metrics) = p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains(
            "envoy_cluster_upstream_cx_connect_fail{envoy_cluster_name=\"cluster-a/half-tcp\"} 3\n"
        ),
        "{metrics}"
    );
}

/// An HTTP/2 CONNECT whose headers pass the advertised header-list bound is
/// refused with 431 (nodeport_proxy::limits::MAX_HEADER_LIST_SIZE) and the
/// connection keeps serving.
#[tokio::test]
async fn oversize_http2_headers_are_refused_and_the_connection_serves_on() {
    let s = setup().await;
    let send = h2_client(s.p.tunnel).await;
    let mut ready = send.clone().ready().await.unwrap();
    let big = "x".repeat(nodeport_proxy::limits::MAX_HEADER_LIST_SIZE as usize);
    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(ECHO)
        .header("x-padding", big)
        .body(())
        .unwrap();
    let (resp, _stream) = ready.send_request(req, false).unwrap();
    let status = resp.await.map(|r| r.status().as_u16());
    assert_eq!(status.ok(), Some(431));
    let (code, io) = connect_h2(&send, ECHO).await;
    assert_eq!(code, 200);
    let mut io = io.unwrap();
    io.write_all(b"after").await.unwrap();
    let mut back = [0u8; 5];
    io.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"after");
}

/// Streams whose destinations stop reading keep their stream windows of the
/// connection window until they read again; the connection window follows
/// what they hold (`nodeport_proxy_tunneling_http2_held_bytes`), so a stream
/// beside them on the same HTTP/2 connection still moves. (With the fixed
/// 256 KiB stream and 1 MiB connection windows, four stalled streams
/// stopped every other stream of their connection.)
#[tokio::test]
async fn stalled_streams_do_not_stop_the_others_on_their_connection() {
    const STALLED: &str = "stalled.cluster-a.svc.cluster.local:7001";
    let sink = dest::sink().await;
    // Isolation holds while the connection's budget has room (64 MiB by
    // default): past it, stalled streams stop their connection's others by
    // design. A stream window, once grown, stays, and the uploads fill the
    // sink's socket fast enough for their windows to grow to 8 MiB each
    // first in some runs (8 x 8 MiB held = the whole budget; it failed about
    // one run in ten). So their windows stay at most 4 MiB here: 32 MiB held.
    let s = setup_with(&[("stalled", 7001, sink)], |c| {
        c.tunnel_windows.max = 4 << 20;
    })
    .await;
    let p = &s.p;
    let send = h2_client(p.tunnel).await;
    // Eight uploads into the sink: each stops once the sink's socket and
    // its stream window are full.
    let mut writers = Vec::new();
    for _ in 0..8 {
        writers.push(upload_forever(&send, STALLED).await);
    }
    // They hold more than the 1 MiB connection window the connection
    // started with (only the metrics show it).
    integration_tests::eventually(
        "the stalled streams to hold more than 1 MiB",
        Duration::from_secs(60),
        || async {
            let (_, body) = p.stats_get("/stats/prometheus").await;
            gauge(&body, "nodeport_proxy_tunneling_http2_held_bytes") > f64::from(1u32 << 20)
        },
    )
    .await;
    let (code, io) = connect_h2(&send, ECHO).await;
    assert_eq!(code, 200);
    let mut io = io.unwrap();
    let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 253) as u8).collect();
    let back = tokio::time::timeout(Duration::from_secs(60), dest::roundtrip(&mut io, &data))
        .await
        .expect("a stream beside stalled ones on the same connection stopped");
    assert!(back == data);
    let (_, body) = p.stats_get("/stats/prometheus").await;
    let budget = gauge(&body, "nodeport_proxy_tunneling_memory_budget_bytes");
    let reserved = gauge(&body, "nodeport_proxy_tunneling_memory_reserved_bytes");
    assert!(
        reserved > 0.0 && reserved <= budget,
        "reserved {reserved} of {budget}"
    );
    for w in writers {
        w.abort();
    }
}

/// Opens a tunnel to `authority` on `send`'s connection and writes into it
/// as fast as its windows allow until the task is aborted.
async fn upload_forever(
    send: &h2::client::SendRequest<bytes::Bytes>,
    authority: &str,
) -> tokio::task::JoinHandle<()> {
    let (code, io) = connect_h2(send, authority).await;
    assert_eq!(code, 200);
    let mut io = io.unwrap();
    tokio::spawn(async move {
        let chunk = vec![7u8; 64 << 10];
        while io.write_all(&chunk).await.is_ok() {}
    })
}

/// One unlabelled gauge of a Prometheus text.
fn gauge(text: &str, name: &str) -> f64 {
    integration_tests::konnectivity::metric(text, &format!("{name} "))
}

/// The memory budget covers the windows HTTP/2 tunneling connections start
/// with, not only what they grow by (issue 14): with a 1 MiB budget, eight
/// connections of two tunnels each, all pushing into destinations that
/// never read, park at most the budget plus HTTP/2's own 65,535-byte window
/// per connection (granted before we can say anything, so owed past the
/// budget), where each used to be given 1 MiB whatever the budget. What
/// they reserved comes back when they close.
#[tokio::test]
async fn the_memory_budget_covers_every_connections_windows() {
    const STALLED: &str = "stalled.cluster-a.svc.cluster.local:7001";
    const BUDGET: i64 = 1 << 20;
    const CONNECTIONS: i64 = 8;
    /// HTTP/2's initial window (RFC 9113 §6.9.2), per connection.
    const SLACK_PER_CONNECTION: i64 = 65_535;
    let bound = (BUDGET + CONNECTIONS * SLACK_PER_CONNECTION) as f64;
    let sink = dest::sink().await;
    let s = setup_with(&[("stalled", 7001, sink)], |c| {
        c.tunnel_memory_budget = BUDGET;
    })
    .await;
    let p = &s.p;
    let mut writers = Vec::new();
    for _ in 0..CONNECTIONS {
        let send = h2_client(p.tunnel).await;
        for _ in 0..2 {
            writers.push(upload_forever(&send, STALLED).await);
        }
    }
    // Under pressure and never past the bound meanwhile: the first
    // connection's two 256 KiB stream windows three quarters full at least.
    // What a stream's forwarder has taken to write is not held (32 KiB in
    // some runs), and so may be most of another connection's 64 KiB: a
    // threshold counting on every window full failed about one run in three
    // when the test binary ran whole.
    let pressure = f64::from(384u32 << 10);
    integration_tests::eventually(
        "the stalled tunnels to fill their windows",
        Duration::from_secs(60),
        || async {
            let (_, body) = p.stats_get("/stats/prometheus").await;
            let reserved = gauge(&body, "nodeport_proxy_tunneling_memory_reserved_bytes");
            let held = gauge(&body, "nodeport_proxy_tunneling_http2_held_bytes");
            assert!(reserved <= bound, "windows of {reserved} B, bound {bound}");
            assert!(held <= bound, "{held} B parked, bound {bound}");
            let done = held >= pressure;
            if done {
                eprintln!("windows {reserved} B, parked {held} B, bound {bound} B");
            }
            done
        },
    )
    .await;
    for w in &writers {
        w.abort();
    }
    for w in writers {
        let _ = w.await;
    }
    integration_tests::eventually(
        "the closed connections to give their windows back",
        Duration::from_secs(30),
        || async {
            let (_, body) = p.stats_get("/stats/prometheus").await;
            gauge(&body, "nodeport_proxy_tunneling_memory_reserved_bytes") == 0.0
                && gauge(&body, "nodeport_proxy_tunneling_http2_held_bytes") == 0.0
                && gauge(
                    &body,
                    "nodeport_proxy_tunneling_http2_connection_window_bytes",
                ) == 0.0
        },
    )
    .await;
}
