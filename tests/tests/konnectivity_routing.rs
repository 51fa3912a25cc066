//! Which agent a dial goes to: destHost, defaultRoute, default, DRAIN.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use integration_tests::certs::Pki;
use integration_tests::client::grpc_dial;
use integration_tests::dest;
use integration_tests::konnectivity::{
    AgentOpts, ServerOpts, agent_dials, init_logging, start_agent, start_routed, start_server,
};
use proxy_server::Strategy;

async fn dial_echo(fe: &integration_tests::client::Frontend, addr: SocketAddr) {
    let mut t = grpc_dial(fe, &addr.to_string()).await.unwrap();
    t.write(b"x").await;
    assert_eq!(t.read_exact(1).await, b"x");
    t.close().await;
}

#[tokio::test]
async fn dest_host_routes_by_identifier_then_falls_back_to_default() {
    init_logging();
    let pki = Pki::new();
    let (server, [a, b]) = start_routed(
        &pki,
        vec![Strategy::DestHost, Strategy::Default],
        ["ipv4=127.0.0.2", "ipv4=127.0.0.3&host=node-b"],
    )
    .await;
    let (ea, eb, e1) = (
        dest::echo_on("127.0.0.2").await,
        dest::echo_on("127.0.0.3").await,
        dest::echo_on("127.0.0.1").await,
    );
    for _ in 0..5 {
        dial_echo(&server.frontend, ea).await;
    }
    assert_eq!((agent_dials(&a.handle), agent_dials(&b.handle)), (5.0, 0.0));
    for _ in 0..5 {
        dial_echo(&server.frontend, eb).await;
    }
    assert_eq!((agent_dials(&a.handle), agent_dials(&b.handle)), (5.0, 5.0));
    // No identifier matches 127.0.0.1: `default` picks either agent.
    for _ in 0..10 {
        dial_echo(&server.frontend, e1).await;
    }
    assert_eq!(agent_dials(&a.handle) + agent_dials(&b.handle), 20.0);
}

#[tokio::test]
async fn default_route_takes_what_dest_host_does_not_match() {
    init_logging();
    let pki = Pki::new();
    let (server, [a, gw]) = start_routed(
        &pki,
        vec![Strategy::DestHost, Strategy::DefaultRoute],
        ["ipv4=127.0.0.2", "default-route=true"],
    )
    .await;
    let (ea, e1) = (
        dest::echo_on("127.0.0.2").await,
        dest::echo_on("127.0.0.1").await,
    );
    dial_echo(&server.frontend, ea).await;
    for _ in 0..5 {
        dial_echo(&server.frontend, e1).await;
    }
    assert_eq!(
        (agent_dials(&a.handle), agent_dials(&gw.handle)),
        (1.0, 5.0)
    );
}

#[tokio::test]
async fn dest_host_alone_refuses_unknown_hosts() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, ServerOpts::strategies(vec![Strategy::DestHost])).await;
    let _a = start_agent(
        &pki,
        server.agent_addr,
        AgentOpts::identifiers("ipv4=127.0.0.2"),
    )
    .await;
    server.handle.wait_for_agents(1).await;
    let e1 = dest::echo_on("127.0.0.1").await;
    let err = grpc_dial(&server.frontend, &e1.to_string())
        .await
        .err()
        .unwrap();
    assert_eq!(err.0, "No agent available");
}

#[tokio::test]
async fn drain_steers_new_dials_to_the_other_agent() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, ServerOpts::default()).await;
    let mut a = start_agent(&pki, server.agent_addr, AgentOpts::default()).await;
    let b = start_agent(&pki, server.agent_addr, AgentOpts::default()).await;
    server.handle.wait_until(|h| h.agent_streams() == 2).await;
    let echo = dest::echo_on("127.0.0.1").await;
    // A connection through `a` that must survive the drain.
    let mut kept = loop {
        let before = agent_dials(&a.handle);
        let t = grpc_dial(&server.frontend, &echo.to_string())
            .await
            .unwrap();
        if agent_dials(&a.handle) > before {
            break t;
        }
        t.close().await;
    };
    a.drain();
    server.handle.wait_until(|h| h.draining_agents() == 1).await;
    let (a_before, b_before) = (agent_dials(&a.handle), agent_dials(&b.handle));
    for _ in 0..20 {
        dial_echo(&server.frontend, echo).await;
    }
    assert_eq!(
        agent_dials(&a.handle),
        a_before,
        "a draining agent gets no new dials while another can serve"
    );
    assert_eq!(agent_dials(&b.handle), b_before + 20.0);
    kept.write(b"still here").await;
    assert_eq!(kept.read_exact(10).await, b"still here");
    // With only draining agents left, they still serve.
    b.stop().await;
    server.handle.wait_until(|h| h.agent_streams() == 1).await;
    dial_echo(&server.frontend, echo).await;
}
