//! The bound on unanswered dials per agent stream, in all and per
//! destination (issue 38.2, proxy-server): an agent whose destinations
//! never answer makes the server hold each dial until its deadline
//! (upstream has no bound); past ours a new dial goes to another agent, or
//! fails at once with a clear answer, and the dials held stay bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::certs::Pki;
use integration_tests::client::{http_connect, start_dial};
use integration_tests::eventually;
use integration_tests::konnectivity::{
    RawAgent, ServerOpts, init_logging, metric, raw_agent, start_server,
};
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use proxy_server::Mode;

const PER_AGENT: usize = 6;
const PER_DESTINATION: usize = 3;
const OVERLOADED: &str = "konnectivity_network_proxy_server_connections_closed_total{frontend=\"grpc\",reason=\"overloaded\"} ";

fn bounded(mode: Mode) -> ServerOpts {
    ServerOpts {
        mode,
        max_pending_per_agent: PER_AGENT,
        max_pending_per_destination: PER_DESTINATION,
        // The held dials must outlast the test on a loaded machine.
        dial_timeout: std::time::Duration::from_secs(60),
        ..Default::default()
    }
}

/// The next DIAL_REQ the agent is sent: its dial id and address.
async fn next_dial_request(agent: &mut RawAgent) -> (i64, String) {
    let p = agent.rx.message().await.unwrap().unwrap();
    match p.payload {
        Some(Payload::DialRequest(r)) => (r.random, r.address),
        other => panic!("expected a DIAL_REQ, got {other:?}"),
    }
}

/// A DIAL_RSP on a gRPC tunnel: its error text.
async fn dial_error(t: &mut integration_tests::client::GrpcTunnel) -> String {
    let p = t.rx.message().await.unwrap().unwrap();
    match p.payload {
        Some(Payload::DialResponse(r)) => r.error,
        other => panic!("expected a DIAL_RSP, got {other:?}"),
    }
}

/// One agent that never answers (its destinations blackhole every
/// connect): a flood of 200 dials to one address holds only
/// PER_DESTINATION of them and the rest fail at once with a DIAL_RSP
/// naming the flag; dials to other addresses still reach the agent until
/// PER_AGENT are held, then fail too. A second agent that answers then
/// serves every new dial, including those the first would have been
/// picked for. Pending dials never exceed the bound, and each refusal is
/// counted as an `overloaded` close.
#[tokio::test]
async fn dials_past_the_pending_bound_fail_at_once_and_others_are_served() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, bounded(Mode::Grpc)).await;
    let mut silent = raw_agent(&pki, server.agent_addr, "silent", "").await;
    server.handle.wait_until(|h| h.agent_streams() == 1).await;

    let blackholed = "127.0.0.1:9";
    let mut held = Vec::new();
    for _ in 0..PER_DESTINATION {
        held.push(start_dial(&server.frontend, blackholed).await);
        let (_, address) = next_dial_request(&mut silent).await;
        assert_eq!(address, blackholed);
    }
    const FLOOD: usize = 200;
    for _ in 0..FLOOD {
        let mut t = start_dial(&server.frontend, blackholed).await;
        let e = dial_error(&mut t).await;
        assert_eq!(
            e,
            format!(
                "too many dials pending on agent silent to {blackholed}: {PER_DESTINATION} unanswered (--max-pending-dials-per-destination)"
            )
        );
    }
    assert_eq!(server.handle.pending_dials(), PER_DESTINATION);

    // Other destinations behind the same agent are still dialled...
    for port in 1..=(PER_AGENT - PER_DESTINATION) {
        let address = format!("127.0.0.2:{port}");
        held.push(start_dial(&server.frontend, &address).await);
        // ...the next request the agent sees is this one, not one of the
        // flood's.
        assert_eq!(next_dial_request(&mut silent).await.1, address);
    }
    // ...up to the agent's bound.
    let mut t = start_dial(&server.frontend, "127.0.0.3:80").await;
    assert_eq!(
        dial_error(&mut t).await,
        format!(
            "too many dials pending on agent silent: {PER_AGENT} unanswered (--max-pending-dials-per-agent)"
        )
    );
    drop(t);
    assert_eq!(server.handle.pending_dials(), PER_AGENT);

    // Another agent, which answers: every dial goes to it, to the
    // blackholed address too.
    let mut live = raw_agent(&pki, server.agent_addr, "live", "").await;
    server.handle.wait_until(|h| h.agent_streams() == 2).await;
    let mut served = Vec::new();
    for (i, address) in ["127.0.0.3:80", blackholed, "127.0.0.4:443"]
        .iter()
        .cycle()
        .take(12)
        .enumerate()
    {
        let mut t = start_dial(&server.frontend, address).await;
        let (dial, to) = next_dial_request(&mut live).await;
        assert_eq!((dial, to.as_str()), (t.dial_id, *address));
        let connect = 100 + i as i64;
        live.tx
            .send(Packet::dial_response(dial, connect, String::new()))
            .await
            .unwrap();
        let p = t.rx.message().await.unwrap().unwrap();
        assert!(
            matches!(&p.payload, Some(Payload::DialResponse(r)) if r.error.is_empty() && r.connect_id == connect),
            "{p:?}"
        );
        served.push(t);
    }
    assert_eq!(server.handle.pending_dials(), PER_AGENT);
    // Each refusal is counted once its tunnel has closed.
    eventually(
        "every refusal counted",
        std::time::Duration::from_secs(30),
        || async { metric(&server.handle.metrics(), OVERLOADED) == (FLOOD + 1) as f64 },
    )
    .await;
    let m = server.handle.metrics();
    assert!(
        !m.contains("konnectivity_network_proxy_server_dial_failure_count{"),
        "a refusal by the bound is not one of upstream's dial failures: {m}"
    );
    drop((held, served));
}

/// On the HTTP-CONNECT frontend the refusal is a 503 whose body names the
/// bound, and the dials held by the agent are answered as usual.
#[tokio::test]
async fn http_connect_past_the_pending_bound_is_503() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, bounded(Mode::HttpConnect)).await;
    let mut silent = raw_agent(&pki, server.agent_addr, "silent", "").await;
    server.handle.wait_until(|h| h.agent_streams() == 1).await;
    let blackholed = "127.0.0.1:9";
    let mut held = Vec::new();
    for _ in 0..PER_DESTINATION {
        let f = server.frontend.clone();
        held.push(tokio::spawn(async move {
            http_connect(&f, blackholed).await.status
        }));
        next_dial_request(&mut silent).await;
    }
    for _ in 0..20 {
        let r = http_connect(&server.frontend, blackholed).await;
        assert_eq!(r.status, 503, "{}", r.head);
        assert_eq!(
            r.body,
            format!(
                "Failed to tunnel dial request: too many dials pending on agent silent to {blackholed}: {PER_DESTINATION} unanswered (--max-pending-dials-per-destination)\r\n"
            )
        );
    }
    assert_eq!(server.handle.pending_dials(), PER_DESTINATION);
    // The held dials fail as their agent's do.
    drop(silent);
    for h in held {
        assert_eq!(h.await.unwrap(), 502);
    }
    assert_eq!(server.handle.pending_dials(), 0);
}
