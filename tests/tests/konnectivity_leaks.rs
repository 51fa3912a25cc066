//! After 1,000 connections opened and closed in every way a frontend or
//! destination can end them, the server and agent hold nothing: no pending
//! dials, no established connections, no extra tasks, no extra descriptors,
//! and the gauges say 0. The only test in its binary, so descriptor counts
//! are this test's own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::client::{grpc_dial, http_connect, start_dial};
use integration_tests::dest::{self, Counted};
use integration_tests::konnectivity::{
    AgentOpts, ServerOpts, init_logging, metric, start_agent, start_server,
};
use konnectivity_proto::{Packet, PacketExt};
use proxy_server::Mode;
use tokio::io::AsyncReadExt;

/// What each open descriptor points at (`socket:[…]`, `anon_inode:[eventpoll]`, …).
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

/// For failure messages: what a `socket:[inode]` is, from /proc/net.
fn describe(fd: &str) -> String {
    let Some(inode) = fd
        .strip_prefix("socket:[")
        .and_then(|s| s.strip_suffix(']'))
    else {
        return fd.to_string();
    };
    for table in ["tcp", "tcp6", "unix"] {
        let text = std::fs::read_to_string(format!("/proc/net/{table}")).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == inode))
        {
            return format!("{fd} {table}: {}", line.trim());
        }
    }
    fd.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_leave_nothing_behind() {
    init_logging();
    let pki = integration_tests::certs::Pki::new();
    let grpc = start_server(&pki, ServerOpts::default()).await;
    let hc = start_server(
        &pki,
        ServerOpts {
            mode: Mode::HttpConnect,
            ..Default::default()
        },
    )
    .await;
    let agent = start_agent(&pki, grpc.agent_addr, AgentOpts::default()).await;
    let agent2 = start_agent(&pki, hc.agent_addr, AgentOpts::default()).await;
    agent.handle.wait_connected(1).await;
    agent2.handle.wait_connected(1).await;
    grpc.handle.wait_for_agents(1).await;
    hc.handle.wait_for_agents(1).await;
    let dests = Counted::default();
    let (echo, closer) = (dests.echo().await, dests.closer().await);
    let (_refused_keep, refused) = dest::refused();
    let hole = dest::blackhole().await;

    // The steady state: listeners, agent streams, nothing in flight.
    let tasks = (
        grpc.handle.live_tasks(),
        hc.handle.live_tasks(),
        agent.handle.live_tasks(),
        agent2.handle.live_tasks(),
    );
    // One full round trip, so lazily created state exists in the baseline;
    // then wait until its tasks are gone before counting descriptors.
    let t = grpc_dial(&grpc.frontend, &echo.to_string()).await.unwrap();
    t.close().await;
    dests.wait_idle().await;
    grpc.handle.wait_tasks_at_most(tasks.0).await;
    agent.handle.wait_tasks_at_most(tasks.2).await;
    let fds = open_fds();

    let mut jobs = Vec::new();
    for i in 0..1000usize {
        let (gfe, hfe) = (grpc.frontend.clone(), hc.frontend.clone());
        jobs.push(tokio::spawn(async move {
            match i % 10 {
                // Client closes with CLOSE_REQ.
                0..=2 => {
                    let mut t = grpc_dial(&gfe, &echo.to_string()).await.unwrap();
                    t.write(b"x").await;
                    t.read_exact(1).await;
                    assert_eq!(t.close().await, Some(String::new()));
                }
                // Destination closes first.
                3 | 4 => {
                    let mut t = grpc_dial(&gfe, &closer.to_string()).await.unwrap();
                    assert_eq!(t.read_exact(3).await, b"bye");
                    assert!(t.read().await.is_none());
                    t.finish().await;
                }
                // Client vanishes without a word.
                5 => {
                    let t = grpc_dial(&gfe, &echo.to_string()).await.unwrap();
                    t.finish().await;
                }
                // Dial refused by the destination.
                6 => {
                    grpc_dial(&gfe, &refused.to_string()).await.err().unwrap();
                }
                // Dial cancelled (DIAL_CLS) while the agent is still dialing.
                7 => {
                    let t = start_dial(&gfe, &hole.addr.to_string()).await;
                    t.tx.send(Packet::close_dial(t.dial_id)).await.unwrap();
                    t.finish().await;
                }
                // HTTP CONNECT, client closes.
                8 => {
                    let mut r = http_connect(&hfe, &echo.to_string()).await;
                    assert_eq!(r.status, 200);
                    assert_eq!(dest::roundtrip(&mut r.stream, b"hc").await, b"hc");
                }
                // HTTP CONNECT, destination closes.
                _ => {
                    let mut r = http_connect(&hfe, &closer.to_string()).await;
                    assert_eq!(r.status, 200);
                    let mut out = Vec::new();
                    r.stream.read_to_end(&mut out).await.unwrap();
                    assert_eq!(out, b"bye");
                }
            }
        }));
    }
    for j in jobs {
        j.await.unwrap();
    }

    for s in [&grpc, &hc] {
        s.handle
            .wait_until(|h| h.established() == 0 && h.pending_dials() == 0)
            .await;
    }
    grpc.handle.wait_tasks_at_most(tasks.0).await;
    hc.handle.wait_tasks_at_most(tasks.1).await;
    agent.handle.wait_tasks_at_most(tasks.2).await;
    agent2.handle.wait_tasks_at_most(tasks.3).await;
    dests.wait_idle().await;
    assert_eq!(
        (
            agent.handle.open_connections(),
            agent.handle.pending_dials()
        ),
        (0, 0)
    );
    assert_eq!(
        (
            agent2.handle.open_connections(),
            agent2.handle.pending_dials()
        ),
        (0, 0)
    );
    let after = open_fds();
    let gone: Vec<_> = fds
        .iter()
        .filter(|f| !after.contains(f))
        .map(|f| describe(f))
        .collect();
    let new: Vec<_> = after
        .iter()
        .filter(|f| !fds.contains(f))
        .map(|f| describe(f))
        .collect();
    // Nothing may stay open; a descriptor that was still closing when the
    // baseline was read may be gone.
    assert!(
        new.is_empty(),
        "descriptors opened and not closed: {new:?} (closed since: {gone:?})"
    );
    assert!(
        after.len() <= fds.len(),
        "more descriptors than before: {after:?} vs {fds:?}"
    );
    for s in [&grpc, &hc] {
        let m = s.handle.metrics();
        assert_eq!(
            metric(
                &m,
                "konnectivity_network_proxy_server_established_connections "
            ),
            0.0,
            "{m}"
        );
        assert_eq!(
            metric(
                &m,
                "konnectivity_network_proxy_server_pending_backend_dials "
            ),
            0.0,
            "{m}"
        );
        assert_eq!(
            metric(&m, "konnectivity_network_proxy_server_http_connections "),
            0.0,
            "{m}"
        );
    }
    let m = agent.handle.metrics();
    assert_eq!(
        metric(
            &m,
            "konnectivity_network_proxy_agent_open_endpoint_connections "
        ),
        0.0,
        "{m}"
    );
}
