//! Dials that fail: what the frontend is told, in both modes, and the metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::client::{grpc_dial, http_connect};
use integration_tests::dest;
use integration_tests::konnectivity::{
    ServerOpts, Stack, http_get, init_logging, metric, start_server,
};
use proxy_server::Mode;

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
