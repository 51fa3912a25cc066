//! HTTP/2 control-frame floods (SETTINGS, PING, WINDOW_UPDATE, PRIORITY,
//! RST_STREAM on a reset stream, empty DATA) on every HTTP/2 listener:
//! proxy-server's agent port (TLS) and gRPC frontend, nodeport-proxy's
//! HTTP/2 CONNECT listener. Each flood ends in GOAWAY `ENHANCE_YOUR_CALM`
//! (link::h2flood), and a tunnel opened before the floods, and one
//! opened after, keep working (issue 33.4). Latency under a flood is a soak
//! figure (scripts/soak, section `floods`), not asserted here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use integration_tests::client::grpc_dial;
use integration_tests::dest;
use integration_tests::h2raw::{self, frame, hpack_literal};
use integration_tests::k8s::metric_sum;
use integration_tests::konnectivity::{ServerOpts, Stack};
use integration_tests::nodeport::{
    Proxy, TUNNELED_ECHO as ECHO, connect_from, connect_h2, h2_client, h2_client_over, start_proxy,
    test_config, tunneling_echo,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

const PING: u8 = 6;
const PRIORITY: u8 = 2;
const WINDOW_UPDATE: u8 = 8;
/// More than any budget allows: a flood that gets this far was not stopped.
const MAX_FRAMES: usize = 200_000;

/// A request HEADERS frame (END_HEADERS) with these fields.
fn headers(stream: u32, fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (k, v) in fields {
        hpack_literal(&mut block, k, v);
    }
    frame(h2raw::HEADERS, 0x4, stream, &block)
}

/// The kinds of flood: (name, frames opening it, the frame repeated).
fn floods(open: &[u8]) -> Vec<(&'static str, Vec<u8>, Vec<u8>)> {
    vec![
        ("SETTINGS", vec![], frame(h2raw::SETTINGS, 0, 0, &[])),
        ("PING", vec![], frame(PING, 0, 0, &[7; 8])),
        (
            "WINDOW_UPDATE",
            vec![],
            frame(WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes()),
        ),
        (
            "PRIORITY",
            vec![],
            frame(PRIORITY, 0, 101, &[0, 0, 0, 0, 16]),
        ),
        ("empty DATA", open.to_vec(), frame(h2raw::DATA, 0, 1, &[])),
        (
            "RST_STREAM on a reset stream",
            [open, &frame(h2raw::RST_STREAM, 0, 1, &[0, 0, 0, 8])].concat(),
            frame(h2raw::RST_STREAM, 0, 1, &[0, 0, 0, 8]),
        ),
    ]
}

/// TLS to the agent port with an agent's certificate named `name`.
fn agent_tls(stack: &Stack, name: &str) -> Arc<rustls::ClientConfig> {
    let identity = stack.pki.client(name);
    Arc::new(
        daemon::tls::client_config(
            &stack.pki.ca(),
            Some((&identity.cert, &identity.key)),
            &[b"h2".to_vec()],
        )
        .unwrap(),
    )
}

/// A TLS connection to the agent port at `addr`.
async fn agent_port(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
}

/// Sends `open` and then `one` over and over on a new connection; returns
/// the error code of the GOAWAY the server ends it with.
async fn flood<S>(mut s: S, open: &[u8], one: &[u8]) -> u32
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    h2raw::start(&mut s).await.unwrap();
    s.write_all(open).await.unwrap();
    let (mut rd, mut wr) = tokio::io::split(s);
    let batch: Vec<u8> = one.repeat(100);
    let writer = tokio::spawn(async move {
        for _ in 0..MAX_FRAMES / 100 {
            if wr.write_all(&batch).await.is_err() {
                return;
            }
        }
    });
    let code = loop {
        let read = tokio::time::timeout(Duration::from_secs(60), h2raw::read_frame(&mut rd));
        match read.await {
            Ok(Ok((h2raw::GOAWAY, _, _, payload))) => {
                break u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
            }
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => panic!("connection ended without GOAWAY: {e}"),
            Err(_) => panic!("server silent"),
        }
    };
    writer.abort();
    code
}

#[tokio::test]
async fn control_frame_floods_end_in_enhance_your_calm_on_the_konnectivity_listeners() {
    let stack = Stack::start(ServerOpts::default()).await;
    let echo = dest::echo().await;
    let frontend = stack.server.frontend.clone();
    // A tunnel opened before the floods.
    let mut before = grpc_dial(&frontend, &echo.to_string()).await.unwrap();
    before.write(b"before").await;
    assert_eq!(before.read_exact(6).await, b"before");

    // The agent port, over TLS with an agent's certificate.
    let tls = agent_tls(&stack, "flooder");
    let agent_open = headers(
        1,
        &[
            (":method", "POST"),
            (":scheme", "https"),
            (":path", "/agent.AgentService/Connect"),
            (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("agentid", "flooder"),
        ],
    );
    for (name, open, one) in floods(&agent_open) {
        let s = agent_port(stack.server.agent_addr, tls.clone())
            .await
            .unwrap();
        let code = flood(s, &open, &one).await;
        assert_eq!(code, 0xb, "agent port, {name}: GOAWAY ENHANCE_YOUR_CALM");
    }

    // The gRPC frontend (Unix socket).
    let frontend_open = h2raw::grpc_headers(1, "/konnectivity.ProxyService/Proxy", "localhost");
    for (name, open, one) in floods(&frontend_open) {
        let s = frontend.connect().await.unwrap();
        let code = flood(s, &open, &one).await;
        assert_eq!(code, 0xb, "gRPC frontend, {name}: GOAWAY ENHANCE_YOUR_CALM");
    }
    // Each counted, whether the guard or h2 itself sent it away.
    let m = server_metrics(&stack).await;
    assert_eq!(
        metric_sum(&m, FRONTEND_FLOODS, &[]),
        floods(&frontend_open).len() as f64
    );

    // Other connections kept working: the tunnel from before, and a new one.
    before.write(b"after").await;
    assert_eq!(before.read_exact(5).await, b"after");
    let mut after = grpc_dial(&frontend, &echo.to_string()).await.unwrap();
    after.write(b"new").await;
    assert_eq!(after.read_exact(3).await, b"new");
}

/// nodeport-proxy with `config`, routing the tunneling authority
/// [`ECHO`] to a loopback echo.
async fn tunneling_proxy(config: nodeport_proxy::ProxyConfig) -> Proxy {
    start_proxy(&tunneling_echo(dest::echo().await), vec![], config).await
}

#[tokio::test]
async fn control_frame_floods_end_in_enhance_your_calm_on_the_tunneling_listener() {
    let p = tunneling_proxy(test_config()).await;
    let legit = h2_client(p.tunnel).await;
    let (code, stream) = connect_h2(&legit, ECHO).await;
    assert_eq!(code, 200);
    let mut before = stream.unwrap();
    assert_eq!(dest::roundtrip(&mut before, b"before").await, b"before");

    let open = headers(1, &[(":method", "CONNECT"), (":authority", ECHO)]);
    let kinds = floods(&open);
    for (name, open, one) in &kinds {
        let s = tokio::net::TcpStream::connect(p.tunnel).await.unwrap();
        let code = flood(s, open, one).await;
        assert_eq!(
            code, 0xb,
            "tunneling listener, {name}: GOAWAY ENHANCE_YOUR_CALM"
        );
    }
    let m = p.proxy.metrics_text();
    assert_eq!(
        metric_sum(&m, "nodeport_proxy_tunneling_floods_total", &[]),
        kinds.len() as f64
    );

    assert_eq!(dest::roundtrip(&mut before, b"after").await, b"after");
    let (code, stream) = connect_h2(&legit, ECHO).await;
    assert_eq!(code, 200);
    assert_eq!(dest::roundtrip(&mut stream.unwrap(), b"new").await, b"new");
}

/// Opens a connection from `from` and sends the HTTP/2 preface.
async fn preface_from(from: std::net::IpAddr, to: std::net::SocketAddr) -> tokio::net::TcpStream {
    let mut s = connect_from(from, to).await;
    // One the penalty refuses may be closed before the preface is written.
    let _ = h2raw::start(&mut s).await;
    s
}

/// Whether the server answered the preface with its SETTINGS (took the
/// connection on) or closed it.
async fn answered_settings(s: &mut tokio::net::TcpStream) -> bool {
    match tokio::time::timeout(Duration::from_secs(30), h2raw::read_frame(s)).await {
        Ok(Ok((kind, ..))) => kind == h2raw::SETTINGS,
        Ok(Err(_)) => false,
        Err(_) => panic!("neither served nor closed within 30 s"),
    }
}

/// `-tunneling-flood-penalty` (issue 33): once a connection from an address
/// is sent away for a flood, that address's new connections start 10 a
/// second with at most 10 s of queue, the rest closed at once; another
/// address, and the connections already open, are not slowed.
#[tokio::test]
async fn a_flooding_address_waits_for_its_turn_and_nobody_else() {
    let (flooder, other): (std::net::IpAddr, std::net::IpAddr) =
        ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
    let p = tunneling_proxy(test_config()).await;
    let legit = h2_client_over(connect_from(flooder, p.tunnel).await).await;
    let (code, stream) = connect_h2(&legit, ECHO).await;
    assert_eq!(code, 200);
    let mut before = stream.unwrap();

    let open = headers(1, &[(":method", "CONNECT"), (":authority", ECHO)]);
    let ping = h2raw::frame(PING, 0, 0, &[0; 8]);
    assert_eq!(
        flood(connect_from(flooder, p.tunnel).await, &open, &ping).await,
        0xb
    );

    // 10 s of queue at 10 a second is 101 connections: of 120 opened at
    // once, the last are closed without a word.
    let mut queued = Vec::new();
    for _ in 0..120 {
        queued.push(preface_from(flooder, p.tunnel).await);
    }
    let settled = || {
        let m = p.proxy.metrics_text();
        (
            metric_sum(&m, "nodeport_proxy_flood_penalty_delayed_total", &[]),
            metric_sum(
                &m,
                "nodeport_proxy_rejected_connections_total",
                &["reason=\"flood_penalty\""],
            ),
        )
    };
    integration_tests::eventually(
        "every queued connection admitted or refused",
        Duration::from_secs(30),
        || async {
            let (delayed, refused) = settled();
            delayed + refused >= 119.0
        },
    )
    .await;
    let (delayed, refused) = settled();
    assert!(
        refused >= 1.0 && delayed + refused == 119.0,
        "one at once, {delayed} waiting, {refused} refused"
    );
    let last = queued.last_mut().unwrap();
    assert!(!answered_settings(last).await, "the last one was closed");
    // The first is served at once, the second 1/10 s later.
    for s in queued.iter_mut().take(2) {
        assert!(
            answered_settings(s).await,
            "a queued connection is served in its turn"
        );
    }

    // Meanwhile the tunnel open before the flood, a new stream on the
    // flooder's open connection and a new connection from another address
    // go on at once.
    assert_eq!(dest::roundtrip(&mut before, b"before").await, b"before");
    let (code, stream) = connect_h2(&legit, ECHO).await;
    assert_eq!(code, 200);
    assert_eq!(
        dest::roundtrip(&mut stream.unwrap(), b"stream").await,
        b"stream"
    );
    let elsewhere = h2_client_over(connect_from(other, p.tunnel).await).await;
    let (code, stream) = connect_h2(&elsewhere, ECHO).await;
    assert_eq!(code, 200);
    assert_eq!(
        dest::roundtrip(&mut stream.unwrap(), b"other").await,
        b"other"
    );
    assert_eq!(settled().0, delayed, "the other address did not wait");
}

/// `-tunneling-flood-penalty=0` turns it off: after a flood, the address's
/// new connections are taken on as before.
#[tokio::test]
async fn without_the_flood_penalty_a_flooder_comes_back_at_once() {
    let p = tunneling_proxy(nodeport_proxy::ProxyConfig {
        tunneling_flood_penalty: Duration::ZERO,
        ..test_config()
    })
    .await;
    let open = headers(1, &[(":method", "CONNECT"), (":authority", ECHO)]);
    let ping = h2raw::frame(PING, 0, 0, &[0; 8]);
    let loopback: std::net::IpAddr = [127, 0, 0, 1].into();
    assert_eq!(
        flood(connect_from(loopback, p.tunnel).await, &open, &ping).await,
        0xb
    );
    for _ in 0..20 {
        let mut s = preface_from(loopback, p.tunnel).await;
        assert!(answered_settings(&mut s).await);
    }
    let m = p.proxy.metrics_text();
    assert_eq!(
        metric_sum(&m, "nodeport_proxy_tunneling_floods_total", &[]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "nodeport_proxy_flood_penalty_delayed_total", &[]),
        0.0
    );
}

/// `--agent-accept-rate` (issue 33): past its burst a new agent-port
/// connection waits before its TLS handshake, counted in
/// `agent_accepts_delayed_total`, while tunnels already open keep working.
/// (That it is taken on once the rate allows is the token bucket's own unit
/// test, `daemon::accept_rate`.)
#[tokio::test]
async fn agent_connections_past_the_accept_rate_wait_before_their_handshake() {
    // 0.01 a second: the burst (one) goes to the stack's own agent, and the
    // next newcomer waits 100 s, far longer than this test.
    let stack = Stack::start(ServerOpts {
        agent_accept_rate: 0.01,
        ..Default::default()
    })
    .await;
    let echo = dest::echo().await;
    let frontend = stack.server.frontend.clone();
    let mut before = grpc_dial(&frontend, &echo.to_string()).await.unwrap();
    before.write(b"before").await;
    assert_eq!(before.read_exact(6).await, b"before");

    let tls = agent_tls(&stack, "newcomer");
    let handshake = tokio::spawn(agent_port(stack.server.agent_addr, tls));
    let metrics = stack.server.health_addr;
    integration_tests::eventually(
        "the newcomer counted as waiting for the accept rate",
        Duration::from_secs(30),
        || async {
            let (_, body) = integration_tests::http_get(metrics, "/metrics").await;
            body.lines()
                .any(|l| l == "konnectivity_network_proxy_server_agent_accepts_delayed_total 1")
        },
    )
    .await;
    assert!(
        !handshake.is_finished(),
        "the newcomer's TLS handshake must wait for the accept rate"
    );
    // The tunnel opened before, and a new one through the connected agent,
    // are not held up.
    before.write(b"after").await;
    assert_eq!(before.read_exact(5).await, b"after");
    let mut after = grpc_dial(&frontend, &echo.to_string()).await.unwrap();
    after.write(b"new").await;
    assert_eq!(after.read_exact(3).await, b"new");
    handshake.abort();
}

/// PING ACKs the server answers to `pings` PINGs written at once on a new
/// connection, and the error code of its GOAWAY if it sends one first.
async fn answers_to_pings<S>(mut s: S, pings: usize) -> (usize, Option<u32>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    h2raw::start(&mut s).await.unwrap();
    s.write_all(&frame(PING, 0, 0, &[7; 8]).repeat(pings))
        .await
        .unwrap();
    let mut acks = 0;
    while acks < pings {
        let read = tokio::time::timeout(Duration::from_secs(60), h2raw::read_frame(&mut s));
        match read.await.expect("server silent").unwrap() {
            (h2raw::GOAWAY, _, _, p) => {
                return (acks, Some(u32::from_be_bytes([p[4], p[5], p[6], p[7]])));
            }
            (PING, flags, _, _) if flags & 0x1 != 0 => acks += 1,
            _ => {}
        }
    }
    (acks, None)
}

/// The agent port's control-frame burst is a fifth of the frontends'
/// (`proxy_server::limits::AGENT_H2_CONTROL_BURST`; `--agent-accept-rate`
/// bounds how often a flooding agent comes back, so a flood costs the burst
/// times that rate): PINGs written at once, between the two bursts, end an
/// agent connection with GOAWAY ENHANCE_YOUR_CALM and are all answered on
/// the gRPC frontend.
#[tokio::test]
async fn the_agent_port_sends_a_control_frame_burst_away_that_a_frontend_takes() {
    let agent_burst = proxy_server::limits::AGENT_H2_CONTROL_BURST;
    let frontend_burst = link::h2flood::Limits::default().burst;
    assert!(agent_burst < frontend_burst);
    let pings = ((agent_burst + frontend_burst) / 2.0) as usize;
    let stack = Stack::start(ServerOpts::default()).await;

    let tls = agent_tls(&stack, "bursty");
    let s = agent_port(stack.server.agent_addr, tls).await.unwrap();
    let (acks, goaway) = answers_to_pings(s, pings).await;
    assert_eq!(
        goaway,
        Some(0xb),
        "agent port: {pings} PINGs at once end in ENHANCE_YOUR_CALM"
    );
    assert!(
        acks <= agent_burst as usize,
        "agent port answered {acks} PINGs"
    );

    let s = stack.server.frontend.connect().await.unwrap();
    assert_eq!(
        answers_to_pings(s, pings).await,
        (pings, None),
        "gRPC frontend: {pings} PINGs at once are all answered"
    );
}

/// The proxy-server's metrics text.
async fn server_metrics(stack: &Stack) -> String {
    integration_tests::http_get(stack.server.health_addr, "/metrics")
        .await
        .1
}

const FRONTEND_FLOODS: &str = "konnectivity_network_proxy_server_frontend_floods_total";
const FRONTEND_PENALTY: &str =
    "konnectivity_network_proxy_server_frontend_flood_penalty_connections_total";

/// `--frontend-flood-penalty` on the mTLS frontend (issue 33): once a
/// connection from an address is sent away for a flood, that address's new
/// connections wait for their turn (10 a second, before their TLS
/// handshake) or, past 10 s of queue, are closed; a kube-apiserver on
/// another address, and the tunnels already open, are not slowed.
#[tokio::test]
async fn a_flooding_frontend_address_waits_for_its_turn_and_nobody_else() {
    let stack = Stack::start(ServerOpts {
        tcp_frontend: true,
        ..Default::default()
    })
    .await;
    let echo = dest::echo().await;
    let frontend = stack.server.frontend.clone();
    let integration_tests::client::Frontend::Tcp { addr, tls } = &frontend else {
        unreachable!("a TCP frontend")
    };
    let tls_from = |s: tokio::net::TcpStream| {
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        tokio_rustls::TlsConnector::from(tls.clone()).connect(name, s)
    };
    // The legitimate client is 127.0.0.1, the flooder 127.0.0.2.
    let mut before = grpc_dial(&frontend, &echo.to_string()).await.unwrap();
    let flooder: std::net::IpAddr = [127, 0, 0, 2].into();
    let s = tls_from(connect_from(flooder, *addr).await).await.unwrap();
    let ping = frame(PING, 0, 0, &[0; 8]);
    assert_eq!(flood(s, &[], &ping).await, 0xb);

    // 10 s of queue at 10 a second is 101 connections: of 120 opened at
    // once, the last are closed before their handshake.
    let mut queued = Vec::new();
    for _ in 0..120 {
        queued.push(connect_from(flooder, *addr).await);
    }
    let settled = |m: &str| {
        (
            metric_sum(m, FRONTEND_PENALTY, &["result=\"delayed\""]),
            metric_sum(m, FRONTEND_PENALTY, &["result=\"refused\""]),
        )
    };
    integration_tests::eventually(
        "every queued connection admitted or refused",
        Duration::from_secs(30),
        || async {
            let (delayed, refused) = settled(&server_metrics(&stack).await);
            delayed + refused >= 119.0
        },
    )
    .await;
    let m = server_metrics(&stack).await;
    let (delayed, refused) = settled(&m);
    assert!(
        refused >= 1.0 && delayed + refused == 119.0,
        "one at once, {delayed} waiting, {refused} refused"
    );
    assert_eq!(metric_sum(&m, FRONTEND_FLOODS, &[]), 1.0);
    // The last was closed unanswered; the second is served in its turn.
    let mut last = queued.pop().unwrap();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::AsyncReadExt::read(&mut last, &mut buf),
    );
    assert!(
        matches!(read.await, Ok(Ok(0) | Err(_))),
        "the last one was closed"
    );
    let second = queued.swap_remove(1);
    let mut served = tls_from(second).await.unwrap();
    let (acks, goaway) = answers_to_pings(&mut served, 1).await;
    assert_eq!((acks, goaway), (1, None), "a queued connection is served");

    // Meanwhile the tunnel open before the flood and a new dial from the
    // legitimate address go on at once.
    before.write(b"before").await;
    assert_eq!(before.read_exact(6).await, b"before");
    let mut after = grpc_dial(&frontend, &echo.to_string()).await.unwrap();
    after.write(b"after").await;
    assert_eq!(after.read_exact(5).await, b"after");
    let m = server_metrics(&stack).await;
    assert_eq!(settled(&m).0, delayed, "the other address did not wait");
}

/// A client of the Unix-socket frontend that floods, in a process of its
/// own: sends the preface and PINGs until it is sent away, prints the
/// GOAWAY's error code, then opens `again` connections at once and waits
/// for each one's SETTINGS.
const UDS_FLOODER: &str = r#"
import socket, struct, sys
def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")
def read_frame(s):
    head = b""
    while len(head) < 9:
        more = s.recv(9 - len(head))
        if not more:
            return None
        head += more
    n = int.from_bytes(head[:3], "big")
    body = b""
    while len(body) < n:
        more = s.recv(n - len(body))
        if not more:
            return None
        body += more
    return head[3], body
path, again = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.sendall(PREFACE)
pings = frame(6, 0, 0, bytes(8)) * 100
try:
    for _ in range(2000):
        s.sendall(pings)
except OSError:
    pass
code = None
while True:
    f = read_frame(s)
    if f is None:
        break
    if f[0] == 7:
        code = int.from_bytes(f[1][4:8], "big")
print("goaway", code, flush=True)
conns = []
for _ in range(again):
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    c.sendall(PREFACE)
    conns.append(c)
served = sum(1 for c in conns if (read_frame(c) or (None,))[0] == 4)
print("served", served, flush=True)
"#;

/// `--frontend-flood-penalty` on the Unix-socket frontend (issue 33): its
/// clients are told apart by process (`SO_PEERCRED`). A process that flooded
/// has its new connections served in their turn, one after another; this
/// test's own process (the kube-apiserver here) is not slowed.
#[tokio::test]
async fn a_flooding_frontend_process_waits_for_its_turn_and_nobody_else() {
    let stack = Stack::start(ServerOpts::default()).await;
    let echo = dest::echo().await;
    let frontend = stack.server.frontend.clone();
    let integration_tests::client::Frontend::Uds(path) = &frontend else {
        unreachable!("a Unix-socket frontend")
    };
    let mut before = grpc_dial(&frontend, &echo.to_string()).await.unwrap();
    let again = 5;
    let out = tokio::process::Command::new("python3")
        .args([
            "-c",
            UDS_FLOODER,
            &path.display().to_string(),
            &again.to_string(),
        ])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the flooding process ends")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("goaway 11\n"), "{stdout}");
    assert!(
        stdout.contains(&format!("served {again}\n")),
        "every later connection served in its turn: {stdout}"
    );
    let m = server_metrics(&stack).await;
    assert_eq!(metric_sum(&m, FRONTEND_FLOODS, &[]), 1.0);
    let delayed = metric_sum(&m, FRONTEND_PENALTY, &["result=\"delayed\""]);
    assert!(
        delayed >= 1.0 && delayed < again as f64,
        "the first at once, then in turn: {delayed} delayed"
    );

    // This process was not charged for the other's flood.
    before.write(b"before").await;
    assert_eq!(before.read_exact(6).await, b"before");
    for _ in 0..5 {
        let mut t = grpc_dial(&frontend, &echo.to_string()).await.unwrap();
        t.write(b"after").await;
        assert_eq!(t.read_exact(5).await, b"after");
    }
    let m = server_metrics(&stack).await;
    assert_eq!(
        metric_sum(&m, FRONTEND_PENALTY, &["result=\"delayed\""]),
        delayed,
        "another process did not wait"
    );
}

/// `--frontend-flood-penalty=0` turns it off: after a flood, the client's
/// new connections are taken on as before.
#[tokio::test]
async fn without_the_frontend_flood_penalty_a_flooder_comes_back_at_once() {
    let stack = Stack::start(ServerOpts {
        frontend_flood_penalty: Duration::ZERO,
        ..Default::default()
    })
    .await;
    let ping = frame(PING, 0, 0, &[0; 8]);
    let s = stack.server.frontend.connect().await.unwrap();
    assert_eq!(flood(s, &[], &ping).await, 0xb);
    for _ in 0..20 {
        let s = stack.server.frontend.connect().await.unwrap();
        assert_eq!(answers_to_pings(s, 1).await, (1, None));
    }
    let m = server_metrics(&stack).await;
    assert_eq!(metric_sum(&m, FRONTEND_FLOODS, &[]), 1.0);
    assert_eq!(
        metric_sum(&m, FRONTEND_PENALTY, &["result=\"delayed\""]),
        0.0
    );
}
