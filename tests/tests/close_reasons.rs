//! Issue 38.4, every close explained: proxy-server and proxy-agent count
//! closed tunnels by a fixed set of reasons, from the same place that fills
//! `/debug/connections`' closed ring, so a scrape and a listing agree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::client::grpc_dial;
use integration_tests::dest;
use integration_tests::eventually;
use integration_tests::konnectivity::{
    ServerOpts, Stack, http_get, init_logging, metric, start_server,
};

const SERVER: &str = "konnectivity_network_proxy_server_connections_closed_total";
const AGENT: &str = "konnectivity_network_proxy_agent_connections_closed_total";

fn server_series(reason: &str) -> String {
    format!("{SERVER}{{frontend=\"grpc\",reason=\"{reason}\"}} ")
}

fn agent_series(reason: &str) -> String {
    format!("{AGENT}{{reason=\"{reason}\"}} ")
}

/// `close_cause` → how many closed records carry it.
async fn listed_causes(admin: SocketAddr) -> HashMap<String, usize> {
    let (code, body) = http_get(admin, "/debug/connections").await;
    assert_eq!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut by = HashMap::new();
    for c in doc["closed"].as_array().unwrap() {
        *by.entry(c["close_cause"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    by
}

/// Waits until `series` reads `want` in `scrape()`.
async fn counted(scrape: impl Fn() -> String, series: &str, want: f64) {
    eventually(
        &format!("{series}= {want}"),
        Duration::from_secs(10),
        || {
            let v = metric(&scrape(), series);
            async move { v == want }
        },
    )
    .await;
}

/// A refused destination, a tunnel the frontend closes, one the destination
/// closes, and one whose agent goes away: each counted once under its reason
/// on the server (and the agent's side of the first three on the agent),
/// the listing's `close_cause`s add up to the counters, and the agent's
/// `connection_duration_seconds` saw the two established connections.
#[tokio::test]
async fn closes_are_counted_by_reason_as_debug_connections_lists_them() {
    let stack = Stack::start(ServerOpts::default()).await;
    let server = stack.server.handle.clone();
    let agent = stack.agent.handle.clone();
    let smetrics = || server.metrics();
    let ametrics = || agent.metrics();

    // Dial refused by the destination.
    let (_keep, refused) = dest::refused();
    grpc_dial(&stack.server.frontend, &refused.to_string())
        .await
        .err()
        .unwrap();
    counted(smetrics, &server_series("dial_failed"), 1.0).await;
    counted(ametrics, &agent_series("dial_failed"), 1.0).await;

    // Closed by the frontend (CLOSE_REQ).
    let echo = dest::echo().await;
    let mut t = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    t.write(b"x").await;
    t.read_exact(1).await;
    assert_eq!(t.close().await.as_deref(), Some(""));
    counted(smetrics, &server_series("client_closed"), 1.0).await;
    counted(ametrics, &agent_series("client_closed"), 1.0).await;

    // Closed by the destination.
    let closer = dest::Counted::default().closer().await;
    let mut t = grpc_dial(&stack.server.frontend, &closer.to_string())
        .await
        .unwrap();
    assert_eq!(t.read_exact(3).await, b"bye");
    assert!(t.closed_by_server().await.is_some());
    // The tunnel is over once the frontend's stream is (the server lingers
    // for it as konnectivity-client does).
    t.finish().await;
    counted(smetrics, &server_series("upstream_closed"), 1.0).await;
    counted(ametrics, &agent_series("upstream_closed"), 1.0).await;
    counted(
        ametrics,
        "konnectivity_network_proxy_agent_connection_duration_seconds_count ",
        2.0,
    )
    .await;

    // The agent goes away under an established tunnel.
    let mut t = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    t.write(b"y").await;
    t.read_exact(1).await;
    let admin = stack.agent.admin_addr;
    let agent_listed = listed_causes(admin).await;
    stack.agent.stop().await;
    assert!(t.closed_by_server().await.is_some());
    t.finish().await;
    counted(smetrics, &server_series("upstream_lost"), 1.0).await;

    let text = server.metrics();
    assert!(text.contains(&format!("# TYPE {SERVER} counter")), "{text}");
    let listed = listed_causes(stack.server.admin_addr).await;
    let total: usize = listed.values().sum();
    assert_eq!(total, 4, "{listed:?}");
    for (cause, n) in &listed {
        assert_eq!(
            metric(&text, &server_series(cause)),
            *n as f64,
            "{cause}: {listed:?}\n{text}"
        );
    }
    // The agent's ring, read before it stopped, agrees with its counters.
    assert_eq!(agent_listed.values().sum::<usize>(), 3, "{agent_listed:?}");
    let atext = agent.metrics();
    for (cause, n) in &agent_listed {
        assert_eq!(metric(&atext, &agent_series(cause)), *n as f64, "{cause}");
    }
}

/// Without an agent the dial is refused by the server itself; a bounded
/// reason, not the error text, labels it.
#[tokio::test]
async fn a_dial_with_no_agent_is_counted_as_refused() {
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, ServerOpts::default()).await;
    let err = grpc_dial(&server.frontend, "127.0.0.1:1")
        .await
        .err()
        .unwrap();
    assert!(err.0.contains("No agent available"), "{}", err.0);
    let h = server.handle.clone();
    counted(|| h.metrics(), &server_series("dial_refused"), 1.0).await;
    let text = h.metrics();
    assert!(
        text.lines()
            .filter(|l| l.starts_with(SERVER))
            .all(|l| !l.contains("No agent")),
        "{text}"
    );
}
