//! Metric names, labels and HELP texts as upstream exposes them: dashboards,
//! alerts and upstream's own test helpers compare them literally.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::client::grpc_dial;
use integration_tests::dest;
use integration_tests::konnectivity::{ServerOpts, Stack, http_get, metric};

#[tokio::test]
async fn server_and_agent_expose_upstream_metrics() {
    let stack = Stack::start(ServerOpts::default()).await;
    let echo = dest::echo().await;
    let mut t = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    t.write(b"m").await;
    t.read_exact(1).await;
    let (_keep, refused) = dest::refused();
    grpc_dial(&stack.server.frontend, &refused.to_string())
        .await
        .err()
        .unwrap();

    let (status, server) = http_get(stack.server.health_addr, "/metrics").await;
    assert_eq!(status, 200);
    let (_, admin) = http_get(stack.server.admin_addr, "/metrics").await;
    assert!(admin.contains("konnectivity_network_proxy_server_established_connections"));
    for help in [
        "# HELP konnectivity_network_proxy_server_dial_duration_seconds Latency of dial to the remote endpoint in seconds",
        "# HELP konnectivity_network_proxy_server_frontend_write_duration_seconds Latency of write to the frontend in seconds",
        "# HELP konnectivity_network_proxy_server_grpc_connections Number of current grpc connections, partitioned by service method.",
        "# HELP konnectivity_network_proxy_server_http_connections Number of current HTTP CONNECT connections",
        "# HELP konnectivity_network_proxy_server_ready_backend_connections Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
        "# HELP konnectivity_network_proxy_server_ready_backends Number of konnectivity agent connected to the proxy server",
        "# HELP konnectivity_network_proxy_server_pending_backend_dials Current number of pending backend dial requests",
        "# HELP konnectivity_network_proxy_server_established_connections Current number of established end-to-end connections (post-dial).",
        "# HELP konnectivity_network_proxy_server_dial_failure_count Number of dial failures observed. Multiple failures can occur for a single dial request.",
        "# HELP konnectivity_network_proxy_server_stream_packets_total Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)",
    ] {
        assert!(
            server.lines().any(|l| l == help),
            "missing {help:?} in\n{server}"
        );
    }
    // Labels as upstream names them, and values that moved.
    assert_eq!(
        metric(
            &server,
            "konnectivity_network_proxy_server_grpc_connections{service_method=\"Connect\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &server,
            "konnectivity_network_proxy_server_established_connections "
        ),
        1.0
    );
    assert_eq!(
        metric(
            &server,
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"error_response\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &server,
            "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &server,
            "konnectivity_network_proxy_server_dial_duration_seconds_count"
        ),
        1.0
    );
    assert!(
        metric(
            &server,
            "konnectivity_network_proxy_server_stream_packets_total{packet_type=\"DIAL_REQ\",segment=\"from_client\"}"
        ) >= 2.0,
        "{server}"
    );
    assert!(
        server.contains(
            "konnectivity_network_proxy_server_dial_duration_seconds_bucket{le=\"0.005\"}"
        ),
        "upstream's buckets:\n{server}"
    );
    // Go spells bucket bounds as strconv.FormatFloat(f, 'g', -1, 64).
    assert!(
        server.contains(
            "konnectivity_network_proxy_server_dial_duration_seconds_bucket{le=\"1e-06\"}"
        ),
        "{server}"
    );
    // As client_golang: a labelled series exists once it moved, so what never
    // happened is absent rather than 0; the process collector's families are
    // there, Go's runtime ones are not.
    for absent in [
        "konnectivity_network_proxy_server_dial_failure_count{reason=\"no_agent\"}",
        "konnectivity_network_proxy_server_full_receive_channels",
        "konnectivity_network_proxy_server_lease_list_total",
        "go_goroutines",
    ] {
        assert!(!server.contains(absent), "{absent} in\n{server}");
    }
    for present in [
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE process_start_time_seconds gauge",
        "promhttp_metric_handler_requests_total{code=\"200\"}",
    ] {
        assert!(server.contains(present), "{present} missing in\n{server}");
    }

    let (_, agent) = http_get(stack.agent.health_addr, "/metrics").await;
    for help in [
        "# HELP konnectivity_network_proxy_agent_dial_duration_seconds Latency of dial to the remote endpoint in seconds",
        "# HELP konnectivity_network_proxy_agent_endpoint_dial_failure_total Number of failures dialing the remote endpoint, by reason (example: timeout).",
        "# HELP konnectivity_network_proxy_agent_open_server_connections Current number of open server connections.",
        "# HELP konnectivity_network_proxy_agent_known_server_count Current number of servers agent is trying to connect to.",
        "# HELP konnectivity_network_proxy_agent_open_endpoint_connections Current number of open endpoint connections.",
    ] {
        assert!(
            agent.lines().any(|l| l == help),
            "missing {help:?} in\n{agent}"
        );
    }
    assert_eq!(
        metric(
            &agent,
            "konnectivity_network_proxy_agent_open_server_connections "
        ),
        1.0
    );
    assert_eq!(
        metric(
            &agent,
            "konnectivity_network_proxy_agent_open_endpoint_connections "
        ),
        1.0
    );
    assert_eq!(
        metric(
            &agent,
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"unknown\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &agent,
            "konnectivity_network_proxy_agent_known_server_count "
        ),
        1.0
    );
    assert!(
        !agent.contains(
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"timeout\"}"
        ),
        "no dial timed out:\n{agent}"
    );
}

/// Upstream's `connection_duration_seconds` (after v0.36.0, #899): one
/// observation per established connection when it ends, upstream's HELP
/// and buckets (1 s to 24 h, spelled as Go spells them); absent until a
/// connection ended, as client_golang's histogram vector.
#[tokio::test]
async fn connection_duration_is_observed_when_an_established_connection_ends() {
    const FAMILY: &str = "konnectivity_network_proxy_server_connection_duration_seconds";
    let stack = Stack::start(ServerOpts::default()).await;
    let echo = dest::echo().await;
    let mut t = grpc_dial(&stack.server.frontend, &echo.to_string())
        .await
        .unwrap();
    t.write(b"d").await;
    t.read_exact(1).await;
    let (_, before) = http_get(stack.server.admin_addr, "/metrics").await;
    assert!(
        !before.contains(FAMILY),
        "observed before any ended:\n{before}"
    );
    // A failed dial establishes nothing and observes nothing.
    let (_keep, refused) = dest::refused();
    grpc_dial(&stack.server.frontend, &refused.to_string())
        .await
        .err()
        .unwrap();
    assert_eq!(t.close().await.as_deref(), Some(""));
    stack
        .server
        .handle
        .wait_until(|h| h.established() == 0)
        .await;
    let (_, after) = http_get(stack.server.admin_addr, "/metrics").await;
    let help = format!(
        "# HELP {FAMILY} Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed."
    );
    assert!(
        after.lines().any(|l| l == help),
        "{help:?} missing in\n{after}"
    );
    assert!(
        after
            .lines()
            .any(|l| l == format!("# TYPE {FAMILY} histogram"))
    );
    let bounds: Vec<&str> = after
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{FAMILY}_bucket{{le=\"")))
        .filter_map(|l| l.split('"').next())
        .collect();
    assert_eq!(
        bounds,
        [
            "1", "5", "15", "30", "60", "300", "900", "1800", "3600", "14400", "43200", "86400",
            "+Inf"
        ],
        "{after}"
    );
    assert_eq!(metric(&after, &format!("{FAMILY}_count ")), 1.0, "{after}");
    assert_eq!(
        metric(&after, &format!("{FAMILY}_bucket{{le=\"86400\"}}")),
        1.0
    );
}
