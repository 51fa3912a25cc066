//! Agents and servers coming and going: what survives, what is closed, and
//! who reconnects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::certs::Pki;
use integration_tests::client::grpc_dial;
use integration_tests::dest;
use integration_tests::konnectivity::{
    AgentOpts, ServerOpts, agent_dials, init_logging, round_robin, start_agent, start_routed,
    start_server,
};
use proxy_server::Strategy;

#[tokio::test]
async fn killed_agent_closes_exactly_its_frontends() {
    init_logging();
    let pki = Pki::new();
    let (server, [a, b]) = start_routed(
        &pki,
        vec![Strategy::DestHost],
        ["ipv4=127.0.0.2", "ipv4=127.0.0.3"],
    )
    .await;
    let (ea, eb) = (
        dest::echo_on("127.0.0.2").await,
        dest::echo_on("127.0.0.3").await,
    );
    let mut on_a = Vec::new();
    for _ in 0..3 {
        on_a.push(grpc_dial(&server.frontend, &ea.to_string()).await.unwrap());
    }
    let mut on_b = grpc_dial(&server.frontend, &eb.to_string()).await.unwrap();
    // Mid-transfer on `a`.
    on_a[0].write(&[7u8; 100_000]).await;
    assert_eq!(server.handle.established(), 4);

    a.stop().await;
    for t in &mut on_a {
        // Whatever was in flight may still arrive; then the close.
        while t.read().await.is_some() {}
    }
    server.handle.wait_until(|h| h.agent_streams() == 1).await;
    assert_eq!(server.handle.established(), 1);
    on_b.write(b"unaffected").await;
    assert_eq!(on_b.read_exact(10).await, b"unaffected");
    assert_eq!(agent_dials(&b.handle), 1.0);
}

#[tokio::test]
async fn agent_reconnects_after_server_restart() {
    init_logging();
    let pki = Pki::new();
    let first = start_server(&pki, ServerOpts::default()).await;
    let port = first.agent_addr.port();
    let agent = start_agent(&pki, first.agent_addr, AgentOpts::default()).await;
    agent.handle.wait_connected(1).await;
    let echo = dest::echo().await;
    let mut t = grpc_dial(&first.frontend, &echo.to_string()).await.unwrap();
    t.write(b"a").await;
    assert_eq!(t.read_exact(1).await, b"a");

    let mut connected = agent.handle.watch_connected();
    first.stop().await;
    connected.wait_for(|n| *n == 0).await.unwrap();
    // The tunnel through the old server is gone.
    assert!(t.read().await.is_none());

    let second = start_server(
        &pki,
        ServerOpts {
            agent_port: port,
            ..Default::default()
        },
    )
    .await;
    connected.wait_for(|n| *n == 1).await.unwrap();
    second.handle.wait_for_agents(1).await;
    let mut t = grpc_dial(&second.frontend, &echo.to_string())
        .await
        .unwrap();
    t.write(b"b").await;
    assert_eq!(t.read_exact(1).await, b"b");
}

#[tokio::test]
async fn agent_holds_one_stream_to_each_of_two_servers() {
    init_logging();
    let pki = Pki::new();
    let opts = |id: &str| ServerOpts {
        server_id: id.into(),
        server_count: 2,
        ..Default::default()
    };
    let s1 = start_server(&pki, opts("one")).await;
    let s2 = start_server(&pki, opts("two")).await;
    let lb = round_robin(vec![s1.agent_addr, s2.agent_addr]).await;
    let agent = start_agent(&pki, lb, AgentOpts::default()).await;
    agent.handle.wait_connected(2).await;
    s1.handle.wait_until(|h| h.agent_streams() == 1).await;
    s2.handle.wait_until(|h| h.agent_streams() == 1).await;
    assert_eq!(agent.handle.connected_servers(), 2);
    let echo = dest::echo().await;
    for s in [&s1, &s2] {
        let mut t = grpc_dial(&s.frontend, &echo.to_string()).await.unwrap();
        t.write(b"ha").await;
        assert_eq!(t.read_exact(2).await, b"ha");
    }
}

#[tokio::test]
async fn agent_without_client_certificate_is_rejected_under_mtls() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, ServerOpts::default()).await;
    let tls = daemon::tls::client_config(&pki.ca(), None, &[b"h2".to_vec()]).unwrap();
    let connector = proxy_agent::Connector {
        host: "127.0.0.1".into(),
        port: server.agent_addr.port(),
        addr: None,
        tls: std::sync::Arc::new(tls).into(),
        agent_id: konnectivity_proto::ids::AgentId("no-cert".into()),
        identifiers: String::new(),
        token_path: None,
        keepalive: proxy_agent::options::KEEPALIVE_TIME,
        keepalive_timeout: proxy_agent::options::KEEPALIVE_TIMEOUT,
        keepalive_min_interval: proxy_agent::connect::MIN_PING_GAP,
        flow: link::flow::FlowPool::new(link::flow::FlowSettings {
            enabled: false,
            ..Default::default()
        }),
        egress: Default::default(),
    };
    let err = connector
        .connect(8)
        .await
        .err()
        .expect("a stream without a client certificate must fail");
    let text = err.to_string();
    assert!(
        text.to_lowercase().contains("certificate"),
        "the error should say why: {text}"
    );
    assert_eq!(server.handle.agent_streams(), 0);

    // Without --cluster-ca-cert the same agent is accepted (TLS only).
    let open = start_server(
        &pki,
        ServerOpts {
            agent_mtls: false,
            ..Default::default()
        },
    )
    .await;
    let agent = start_agent(
        &pki,
        open.agent_addr,
        AgentOpts {
            client_cert: false,
            ..Default::default()
        },
    )
    .await;
    agent.handle.wait_connected(1).await;
}

#[tokio::test]
async fn frontend_without_client_certificate_is_rejected_on_tcp() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(
        &pki,
        ServerOpts {
            tcp_frontend: true,
            ..Default::default()
        },
    )
    .await;
    let addr = match &server.frontend {
        integration_tests::client::Frontend::Tcp { addr, .. } => *addr,
        _ => unreachable!(),
    };
    let tls = daemon::tls::client_config(&pki.ca(), None, &[b"h2".to_vec()]).unwrap();
    let fe = integration_tests::client::Frontend::Tcp {
        addr,
        tls: std::sync::Arc::new(tls),
    };
    // TLS 1.3 may report the missing certificate only after the handshake,
    // so the failure can surface at connect or at the first request.
    let attempt = async {
        let (mut c, _conn) = fe.grpc_client().await?;
        let (_tx, rx) = tokio::sync::mpsc::channel(1);
        c.proxy(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(std::io::Error::other)
    };
    assert!(
        attempt.await.is_err(),
        "a frontend without a client certificate must be refused"
    );
}
