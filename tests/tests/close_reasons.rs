//! Issue 38.4, every close explained: proxy-server and proxy-agent count
//! closed tunnels by a fixed set of reasons, from the same place that fills
//! `/debug/connections`' closed ring, so a scrape and a listing agree; a
//! frontend's W3C `traceparent` names its tunnel there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::client::{grpc_dial, grpc_dial_with, http_connect_headers};
use integration_tests::dest;
use integration_tests::eventually;
use integration_tests::konnectivity::{
    ServerOpts, Stack, http_get, init_logging, metric, start_server,
};
use proxy_server::Mode;

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

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The live entry of `admin`'s `/debug/connections` whose target is `target`.
async fn live_entry(admin: SocketAddr, target: &str) -> serde_json::Value {
    let (code, body) = http_get(admin, "/debug/connections").await;
    assert_eq!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    doc["live"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["target"] == target)
        .cloned()
        .unwrap_or_else(|| panic!("no live entry for {target}: {doc:#}"))
}

/// A W3C `traceparent` from the frontend (gRPC metadata) names the tunnel in
/// the server's `/debug/connections`, and the dial id ties that entry to
/// the agent's: one `kubectl exec` can be followed from the server to the
/// destination.
#[tokio::test]
async fn a_traceparent_in_grpc_metadata_names_the_tunnel_on_the_server() {
    let stack = Stack::start(ServerOpts::default()).await;
    let echo = dest::echo().await;
    let target = echo.to_string();
    let t = grpc_dial_with(
        &stack.server.frontend,
        &target,
        &[("traceparent", TRACEPARENT)],
    )
    .await
    .unwrap();
    let s = live_entry(stack.server.admin_addr, &target).await;
    assert_eq!(s["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{s:#}");
    assert_eq!(s["parent_span_id"], "00f067aa0ba902b7", "{s:#}");
    assert_eq!(s["dial_id"], t.dial_id.to_string(), "{s:#}");
    let a = live_entry(stack.agent.admin_addr, &target).await;
    assert_eq!(a["dial_id"], s["dial_id"], "{a:#}");
    // A malformed one is ignored, as the recommendation asks.
    let u = grpc_dial_with(
        &stack.server.frontend,
        &target,
        &[(
            "traceparent",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        )],
    )
    .await
    .unwrap();
    let (_, body) = http_get(stack.server.admin_addr, "/debug/connections").await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let want = u.dial_id.to_string();
    let other = doc["live"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["dial_id"] == want.as_str())
        .unwrap();
    assert!(other.get("trace_id").is_none(), "{other:#}");
    drop((t, u));
}

/// The same from an HTTP CONNECT header.
#[tokio::test]
async fn a_traceparent_header_on_http_connect_names_the_tunnel_on_the_server() {
    let stack = Stack::start(ServerOpts {
        mode: Mode::HttpConnect,
        ..Default::default()
    })
    .await;
    let echo = dest::echo().await;
    let target = echo.to_string();
    let s = stack.server.frontend.connect().await.unwrap();
    let r = http_connect_headers(s, &target, &format!("Traceparent: {TRACEPARENT}\r\n"), b"").await;
    assert_eq!(r.status, 200, "{}", r.head);
    let e = live_entry(stack.server.admin_addr, &target).await;
    assert_eq!(e["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{e:#}");
    assert_eq!(e["parent_span_id"], "00f067aa0ba902b7", "{e:#}");
    drop(r);
}
