//! Dials that fail: what the frontend is told, in both modes, and the metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::client::{ConnectReply, Frontend, grpc_dial, http_connect};
use integration_tests::dest;
use integration_tests::konnectivity::{
    RawAgent, ServerOpts, Stack, http_get, init_logging, metric, raw_agent, start_server,
};
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use proxy_server::Mode;
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn refused_port_grpc_reports_go_error_text() {
    let stack = Stack::start(ServerOpts::default()).await;
    let (_keep, addr) = dest::refused();
    let err = grpc_dial(&stack.server.frontend, &addr.to_string())
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.0,
        format!("dial tcp {addr}: connect: connection refused")
    );
    let m = stack.server.handle.metrics();
    assert_eq!(
        metric(
            &m,
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"error_response\"}"
        ),
        1.0,
        "{m}"
    );
    let am = stack.agent.handle.metrics();
    assert_eq!(
        metric(
            &am,
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"unknown\"}"
        ),
        1.0,
        "{am}"
    );
    assert_eq!(stack.server.handle.pending_dials(), 0);
}

#[tokio::test]
async fn refused_port_http_connect_is_502() {
    let stack = Stack::start(ServerOpts {
        mode: Mode::HttpConnect,
        ..Default::default()
    })
    .await;
    let (_keep, addr) = dest::refused();
    let r = http_connect(&stack.server.frontend, &addr.to_string()).await;
    assert_eq!(r.status, 502, "{}", r.head);
    assert_eq!(
        r.head,
        "HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
    );
    assert_eq!(
        r.body,
        format!("dial tcp {addr}: connect: connection refused")
    );
}

#[tokio::test]
async fn dns_failure_http_connect_is_502_no_such_host() {
    let stack = Stack::start(ServerOpts {
        mode: Mode::HttpConnect,
        ..Default::default()
    })
    .await;
    let r = http_connect(&stack.server.frontend, "konnectivity-test.invalid:443").await;
    assert_eq!(r.status, 502);
    assert!(r.body.contains("no such host"), "{}", r.body);
}

#[tokio::test]
async fn never_answering_destination_times_out_504() {
    let stack = Stack::start(ServerOpts {
        mode: Mode::HttpConnect,
        ..Default::default()
    })
    .await;
    let hole = dest::blackhole().await;
    let r = http_connect(&stack.server.frontend, &hole.addr.to_string()).await;
    assert_eq!(r.status, 504, "{} {}", r.head, r.body);
    assert_eq!(r.body, format!("dial tcp {}: i/o timeout", hole.addr));
    let am = stack.agent.handle.metrics();
    assert_eq!(
        metric(
            &am,
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"timeout\"}"
        ),
        1.0,
        "{am}"
    );
}

#[tokio::test]
async fn never_answering_destination_times_out_grpc() {
    let stack = Stack::start(ServerOpts::default()).await;
    let hole = dest::blackhole().await;
    let err = grpc_dial(&stack.server.frontend, &hole.addr.to_string())
        .await
        .err()
        .unwrap();
    assert_eq!(err.0, format!("dial tcp {}: i/o timeout", hole.addr));
}

#[tokio::test]
async fn no_agent_grpc_and_http_connect() {
    init_logging();
    let pki = Pki::new();
    let grpc = start_server(&pki, ServerOpts::default()).await;
    let err = grpc_dial(&grpc.frontend, "127.0.0.1:1")
        .await
        .err()
        .unwrap();
    assert_eq!(err.0, "No agent available");
    let m = grpc.handle.metrics();
    assert_eq!(
        metric(
            &m,
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"no_agent\"}"
        ),
        1.0
    );
    let (status, body) = http_get(grpc.health_addr, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (500, "no connection to any proxy agent")
    );

    let hc = start_server(
        &pki,
        ServerOpts {
            mode: Mode::HttpConnect,
            ..Default::default()
        },
    )
    .await;
    let r = http_connect(&hc.frontend, "127.0.0.1:1").await;
    assert_eq!(
        r.head,
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\n"
    );
    assert_eq!(r.body, "currently no tunnels available: No agent available");
}

#[tokio::test]
async fn http_connect_rejects_other_methods_with_405() {
    let stack = Stack::start(ServerOpts {
        mode: Mode::HttpConnect,
        ..Default::default()
    })
    .await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = stack.server.frontend.connect().await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(
        out.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{out}"
    );
    assert!(
        out.ends_with("\r\n\r\nthis proxy only supports CONNECT passthrough\n"),
        "{out}"
    );
}

/// An agent that accepts DIAL_REQ and never answers: the server's
/// `--backend-dial-timeout` ends the dial (504 / DIAL_RSP error) instead of
/// leaking it.
#[tokio::test]
async fn backend_dial_timeout_ends_pending_dials() {
    use integration_tests::konnectivity::silent_agent;
    init_logging();
    let pki = Pki::new();
    let opts = ServerOpts {
        dial_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let server = start_server(&pki, opts).await;
    let _agent = silent_agent(&pki, server.agent_addr).await;
    server.handle.wait_for_agents(1).await;
    let err = grpc_dial(&server.frontend, "127.0.0.1:9")
        .await
        .err()
        .unwrap();
    assert_eq!(err.0, "timed out waiting for backend dial");
    assert_eq!(server.handle.pending_dials(), 0);
    let m = server.handle.metrics();
    assert_eq!(
        metric(
            &m,
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"backend_dial_timeout\"}"
        ),
        1.0
    );

    let hc = start_server(
        &pki,
        ServerOpts {
            mode: Mode::HttpConnect,
            dial_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    let _agent2 = silent_agent(&pki, hc.agent_addr).await;
    hc.handle.wait_for_agents(1).await;
    let r = http_connect(&hc.frontend, "127.0.0.1:9").await;
    assert_eq!(r.status, 504, "{}", r.head);
    assert_eq!(
        r.body,
        "Backend dial timeout: timed out waiting for backend dial\r\n"
    );
    assert_eq!(hc.handle.pending_dials(), 0);
}

/// Opens an HTTP CONNECT tunnel whose dial `agent` answers with `connect`,
/// and has the agent send `hello` through it.
async fn tunnel_via(frontend: &Frontend, agent: &mut RawAgent, connect: i64) -> ConnectReply {
    let fe = frontend.clone();
    let client = tokio::spawn(async move { http_connect(&fe, "127.0.0.1:9").await });
    let req = agent.rx.message().await.unwrap().unwrap();
    let Some(Payload::DialRequest(d)) = req.payload else {
        panic!("expected a DIAL_REQ, got {req:?}");
    };
    agent
        .tx
        .send(Packet::dial_response(d.random, connect, String::new()))
        .await
        .unwrap();
    let mut reply = client.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    agent
        .tx
        .send(Packet::data_copy(connect, b"hello"))
        .await
        .unwrap();
    let mut buf = [0u8; 5];
    reply.stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");
    reply
}

/// What the client reads next: the end of the stream, or the error kind.
async fn next_read(reply: &mut ConnectReply) -> Result<usize, std::io::ErrorKind> {
    let mut buf = [0u8; 64];
    tokio::time::timeout(Duration::from_secs(30), reply.stream.read(&mut buf))
        .await
        .expect("the tunnel stayed open")
        .map_err(|e| e.kind())
}

/// Issue 14.6: when its agent is lost, an HTTP CONNECT client (TCP with
/// mTLS, as kube-apiserver) reads a connection reset, not a clean end it
/// could take for a complete response; a tunnel the agent closes normally
/// still ends cleanly, TLS close_notify included. Upstream ends both cleanly.
#[tokio::test]
async fn http_connect_client_is_reset_when_its_agent_is_lost() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(
        &pki,
        ServerOpts {
            mode: Mode::HttpConnect,
            tcp_frontend: true,
            ..Default::default()
        },
    )
    .await;
    let mut agent = raw_agent(&pki, server.agent_addr, "raw", "").await;
    server.handle.wait_for_agents(1).await;

    let mut done = tunnel_via(&server.frontend, &mut agent, 1).await;
    agent
        .tx
        .send(Packet::close_response(1, String::new()))
        .await
        .unwrap();
    assert_eq!(next_read(&mut done).await, Ok(0));

    let mut cut = tunnel_via(&server.frontend, &mut agent, 2).await;
    drop(agent);
    assert_eq!(
        next_read(&mut cut).await,
        Err(std::io::ErrorKind::ConnectionReset)
    );
    server.handle.wait_until(|h| h.agent_streams() == 0).await;
}

/// Upstream after v0.36.0, #888: when one stream of an agent goes (an agent
/// reached twice, e.g. through two paths of a load balancer), only that
/// stream's connections end; upstream v0.36.0 dropped every connection of
/// the agent id from its table, so the other stream's never got their
/// CLOSE_RSP and leaked. Here the two streams even use the same connection
/// ID (connections are keyed by stream, upstream #462).
#[tokio::test]
async fn losing_one_stream_of_an_agent_keeps_its_other_streams_connections() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(
        &pki,
        ServerOpts {
            mode: Mode::HttpConnect,
            ..Default::default()
        },
    )
    .await;
    let mut first = raw_agent(&pki, server.agent_addr, "ha", "").await;
    server.handle.wait_for_agents(1).await;
    let mut on_first = tunnel_via(&server.frontend, &mut first, 1).await;
    let mut second = raw_agent(&pki, server.agent_addr, "ha", "").await;
    server.handle.wait_until(|h| h.agent_streams() == 2).await;
    // A dial goes to the newest stream of an agent.
    let mut on_second = tunnel_via(&server.frontend, &mut second, 1).await;
    assert_eq!(server.handle.established(), 2);

    drop(first);
    assert!(
        next_read(&mut on_first).await != Ok(5),
        "the lost stream's connection ends"
    );
    server.handle.wait_until(|h| h.agent_streams() == 1).await;
    assert_eq!(server.handle.established(), 1, "the other stream's stays");
    // Both ways still work on it, and it ends with its own CLOSE_RSP.
    use tokio::io::AsyncWriteExt;
    on_second.stream.write_all(b"ping").await.unwrap();
    loop {
        let p = second.rx.message().await.unwrap().unwrap();
        if let Some(Payload::Data(d)) = p.payload {
            assert_eq!((d.connect_id, &d.data[..]), (1, &b"ping"[..]));
            break;
        }
    }
    second
        .tx
        .send(Packet::data_copy(1, b"still"))
        .await
        .unwrap();
    let mut buf = [0u8; 5];
    on_second.stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"still");
    second
        .tx
        .send(Packet::close_response(1, String::new()))
        .await
        .unwrap();
    assert_eq!(next_read(&mut on_second).await, Ok(0));
    server.handle.wait_until(|h| h.established() == 0).await;
}

/// Upstream after v0.36.0, #889: closing an HTTP-CONNECT tunnel twice
/// panicked upstream's server (close of a closed channel), ending every
/// tunnel. Here every side closes one tunnel at once (the agent's CLOSE_RSP
/// twice and DATA after it, the client's socket, then the agent's stream):
/// it ends once (one `connection_duration_seconds` observation, the
/// gauges back to 0) and the server serves the next tunnel.
#[tokio::test]
async fn an_http_connect_tunnel_closed_from_every_side_at_once_ends_once() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(
        &pki,
        ServerOpts {
            mode: Mode::HttpConnect,
            ..Default::default()
        },
    )
    .await;
    let mut agent = raw_agent(&pki, server.agent_addr, "raw", "").await;
    server.handle.wait_for_agents(1).await;
    let reply = tunnel_via(&server.frontend, &mut agent, 7).await;
    for p in [
        Packet::close_response(7, String::new()),
        Packet::close_response(7, "again".into()),
        Packet::data_copy(7, b"late"),
    ] {
        agent.tx.send(p).await.unwrap();
    }
    drop(reply);
    drop(agent);
    server
        .handle
        .wait_until(|h| h.agent_streams() == 0 && h.established() == 0)
        .await;
    let m = server.handle.metrics();
    assert_eq!(
        metric(
            &m,
            "konnectivity_network_proxy_server_connection_duration_seconds_count"
        ),
        1.0,
        "{m}"
    );
    let mut next = raw_agent(&pki, server.agent_addr, "next", "").await;
    server.handle.wait_for_agents(1).await;
    let mut again = tunnel_via(&server.frontend, &mut next, 1).await;
    next.tx
        .send(Packet::close_response(1, String::new()))
        .await
        .unwrap();
    assert_eq!(next_read(&mut again).await, Ok(0));
    let h = server.handle.clone();
    integration_tests::eventually(
        "no HTTP-CONNECT connection left",
        Duration::from_secs(10),
        || {
            let m = h.metrics();
            async move {
                metric(&m, "konnectivity_network_proxy_server_http_connections ") == 0.0
                    && metric(
                        &m,
                        "konnectivity_network_proxy_server_established_connections ",
                    ) == 0.0
            }
        },
    )
    .await;
}
