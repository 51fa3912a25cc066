//! 10,000 connections opened and closed in every way they can end — client
//! close, destination close, client vanishing, refused dial, dial cancelled,
//! dial timed out at the server, agent killed, server restarted — leave
//! nothing behind: empty pending and established tables on both sides, task
//! counts at their steady state, gauges at 0, and, once everything is
//! stopped, every descriptor the test process opened closed again. The only
//! test in its binary, so descriptor counts are this test's own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::StreamExt;
use integration_tests::client::{Frontend, grpc_dial, http_connect, start_dial};
use integration_tests::dest::{self, Counted};
use integration_tests::konnectivity::{
    AgentOpts, RunningAgent, RunningServer, ServerOpts, init_logging, metric, start_agent,
    start_server,
};
use konnectivity_proto::{Packet, PacketExt};
use proxy_server::Mode;
use tokio::io::AsyncReadExt;

/// What each open descriptor points at.
fn open_fds() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|t| t.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[derive(Clone, Copy)]
struct Dests {
    echo: std::net::SocketAddr,
    closer: std::net::SocketAddr,
    refused: std::net::SocketAddr,
    hole: std::net::SocketAddr,
}

/// One connection, ended the `i`-th way.
async fn one(i: usize, gfe: Frontend, hfe: Frontend, d: Dests) {
    match i % 10 {
        // Client closes with CLOSE_REQ.
        0..=2 => {
            let mut t = grpc_dial(&gfe, &d.echo.to_string()).await.unwrap();
            t.write(b"x").await;
            t.read_exact(1).await;
            assert_eq!(t.close().await, Some(String::new()));
        }
        // Destination closes first.
        3 => {
            let mut t = grpc_dial(&gfe, &d.closer.to_string()).await.unwrap();
            assert_eq!(t.read_exact(3).await, b"bye");
            assert!(t.read().await.is_none());
            t.finish().await;
        }
        // Client vanishes without a word.
        4 => {
            let t = grpc_dial(&gfe, &d.echo.to_string()).await.unwrap();
            t.finish().await;
        }
        // Dial refused by the destination.
        5 => {
            grpc_dial(&gfe, &d.refused.to_string()).await.err().unwrap();
        }
        // Dial cancelled (DIAL_CLS) while the agent is still dialing.
        6 => {
            let t = start_dial(&gfe, &d.hole.to_string()).await;
            t.tx.send(Packet::close_dial(t.dial_id)).await.unwrap();
            t.finish().await;
        }
        // HTTP CONNECT, client closes.
        7 | 8 => {
            let mut r = http_connect(&hfe, &d.echo.to_string()).await;
            assert_eq!(r.status, 200);
            assert_eq!(dest::roundtrip(&mut r.stream, b"hc").await, b"hc");
        }
        // HTTP CONNECT, destination closes.
        _ => {
            let mut r = http_connect(&hfe, &d.closer.to_string()).await;
            assert_eq!(r.status, 200);
            let mut out = Vec::new();
            r.stream.read_to_end(&mut out).await.unwrap();
            assert_eq!(out, b"bye");
        }
    }
}

/// Runs `n` connections, `width` at a time.
async fn many(n: usize, width: usize, gfe: &Frontend, hfe: &Frontend, d: Dests) {
    futures::stream::iter(0..n)
        .for_each_concurrent(width, |i| one(i, gfe.clone(), hfe.clone(), d))
        .await;
}

/// Opens `n` connections through `fe` and keeps them, proven live by an echo.
async fn live(
    n: usize,
    fe: &Frontend,
    echo: std::net::SocketAddr,
) -> Vec<integration_tests::client::GrpcTunnel> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut t = grpc_dial(fe, &echo.to_string()).await.unwrap();
        t.write(b"l").await;
        t.read_exact(1).await;
        out.push(t);
    }
    out
}

async fn assert_empty(s: &RunningServer) {
    s.handle
        .wait_until(|h| h.established() == 0 && h.pending_dials() == 0)
        .await;
    // A client connection's gauge is lowered once its task has ended the
    // connection, a moment after its tunnel left the table.
    let gauges = [
        "konnectivity_network_proxy_server_established_connections ",
        "konnectivity_network_proxy_server_pending_backend_dials ",
        "konnectivity_network_proxy_server_http_connections ",
    ];
    let h = s.handle.clone();
    integration_tests::eventually(
        "the connection gauges back at 0",
        Duration::from_secs(30),
        || {
            let m = h.metrics();
            async move { gauges.iter().all(|g| metric(&m, g) == 0.0) }
        },
    )
    .await;
}

async fn assert_agent_empty(a: &RunningAgent, steady_tasks: usize) {
    a.handle.wait_tasks_at_most(steady_tasks).await;
    assert_eq!(
        (a.handle.open_connections(), a.handle.pending_dials()),
        (0, 0)
    );
    // A stream that ended takes its connections out of the count at once;
    // each connection's own task then ends and lowers the gauge.
    let gauge = "konnectivity_network_proxy_agent_open_endpoint_connections ";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while metric(&a.handle.metrics(), gauge) != 0.0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let m = a.handle.metrics();
    assert_eq!(
        metric(
            &m,
            "konnectivity_network_proxy_agent_open_endpoint_connections "
        ),
        0.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_leave_nothing_behind() {
    init_logging();
    let dests = Counted::default();
    let (echo, closer) = (dests.echo().await, dests.closer().await);
    let (_refused_keep, refused) = dest::refused();
    let hole = dest::blackhole().await;
    let d = Dests {
        echo,
        closer,
        refused,
        hole: hole.addr,
    };
    let pki = integration_tests::certs::Pki::new();
    // Everything from here on must be closed again by the end.
    let fds = open_fds();

    // The gRPC server gives up on a dial after 1 s, so dials to the
    // never-answering destination end by the server's deadline (the agent's
    // own is 5 s) — the "dial timed out" case.
    let grpc_opts = ServerOpts {
        dial_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let mut grpc = start_server(&pki, grpc_opts.clone()).await;
    let hc = start_server(
        &pki,
        ServerOpts {
            mode: Mode::HttpConnect,
            ..Default::default()
        },
    )
    .await;
    let mut agent = start_agent(&pki, grpc.agent_addr, AgentOpts::default()).await;
    let agent2 = start_agent(&pki, hc.agent_addr, AgentOpts::default()).await;
    agent.handle.wait_connected(1).await;
    agent2.handle.wait_connected(1).await;
    grpc.handle.wait_for_agents(1).await;
    hc.handle.wait_for_agents(1).await;
    let steady = (
        grpc.handle.live_tasks(),
        hc.handle.live_tasks(),
        agent.handle.live_tasks(),
        agent2.handle.live_tasks(),
    );

    // 7,000 connections ended every ordinary way.
    many(7000, 100, &grpc.frontend, &hc.frontend, d).await;

    // 200 dials the server times out (the agent is still dialing).
    let timed_out = futures::stream::iter(0..200)
        .map(|_| {
            let fe = grpc.frontend.clone();
            async move {
                grpc_dial(&fe, &hole.addr.to_string())
                    .await
                    .err()
                    .map(|e| e.0)
            }
        })
        .buffer_unordered(100)
        .collect::<Vec<_>>()
        .await;
    assert!(
        timed_out
            .iter()
            .all(|e| e.as_deref() == Some("timed out waiting for backend dial")),
        "{timed_out:?}"
    );

    for s in [&grpc, &hc] {
        assert_empty(s).await;
    }
    grpc.handle.wait_tasks_at_most(steady.0).await;
    hc.handle.wait_tasks_at_most(steady.1).await;
    assert_agent_empty(&agent, steady.2).await;
    assert_agent_empty(&agent2, steady.3).await;

    // The agent is killed with 400 connections open: each ends.
    let open = live(400, &grpc.frontend, echo).await;
    assert_eq!(grpc.handle.established(), 400);
    agent.stop().await;
    for mut t in open {
        while t.read().await.is_some() {}
        t.finish().await;
    }
    assert_empty(&grpc).await;
    agent = start_agent(&pki, grpc.agent_addr, AgentOpts::default()).await;
    agent.handle.wait_connected(1).await;
    grpc.handle.wait_for_agents(1).await;
    many(1000, 100, &grpc.frontend, &hc.frontend, d).await;

    // The server restarts with 400 connections open: each ends, and the
    // agent comes back to the new server on the same port.
    let open = live(400, &grpc.frontend, echo).await;
    let port = grpc.agent_addr.port();
    let mut connected = agent.handle.watch_connected();
    grpc.stop().await;
    for mut t in open {
        while t.read().await.is_some() {}
        t.finish().await;
    }
    connected.wait_for(|n| *n == 0).await.unwrap();
    assert_agent_empty(&agent, steady.2).await;
    grpc = start_server(
        &pki,
        ServerOpts {
            agent_port: port,
            ..grpc_opts
        },
    )
    .await;
    connected.wait_for(|n| *n == 1).await.unwrap();
    grpc.handle.wait_for_agents(1).await;
    many(1000, 100, &grpc.frontend, &hc.frontend, d).await;

    // 7,000 + 200 + 400 + 1,000 + 400 + 1,000 = 10,000.
    for s in [&grpc, &hc] {
        assert_empty(s).await;
    }
    grpc.handle.wait_tasks_at_most(steady.0).await;
    hc.handle.wait_tasks_at_most(steady.1).await;
    assert_agent_empty(&agent, steady.2).await;
    assert_agent_empty(&agent2, steady.3).await;
    dests.wait_idle().await;

    // Stop everything; every descriptor opened since the start is closed.
    let agents = [agent, agent2];
    for a in agents {
        a.stop().await;
    }
    for s in [grpc, hc] {
        s.stop().await;
    }
    let after = open_fds();
    let opened: Vec<_> = after.iter().filter(|f| !fds.contains(f)).collect();
    assert!(opened.is_empty(), "descriptors left open: {opened:?}");
}
