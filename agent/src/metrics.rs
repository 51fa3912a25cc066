//! The agent's metrics: upstream's names, labels, buckets and HELP text
//! (`konnectivity_network_proxy_agent_*`), registered once per agent
//! instance, each series appearing when upstream's would (see
//! [`go_compat::gometrics`]); with `process_*` and promhttp's families.

use std::sync::Arc;

use go_compat::gometrics::Registry;
use link::debug_connections::CloseReason;
use link::flow::FlowPool;
use link::flow::metrics::{FlowGaugeNames, FlowGauges};
use link::stream_metrics::StreamStats;
use metrics::{Counter, Gauge, Histogram};

const LATENCY_BUCKETS: &[f64] = &[0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0];
/// The server's `connection_duration_seconds` buckets (upstream's, after
/// v0.36.0, #899): 1 s to 24 h.
const CONNECTION_DURATION_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

const DIAL_DURATION: &str = "konnectivity_network_proxy_agent_dial_duration_seconds";
const SERVER_CONNECTION_FAILURES: &str =
    "konnectivity_network_proxy_agent_server_connection_failure_count";
const ENDPOINT_DIAL_FAILURES: &str = "konnectivity_network_proxy_agent_endpoint_dial_failure_total";
const OPEN_SERVER_CONNECTIONS: &str = "konnectivity_network_proxy_agent_open_server_connections";
const KNOWN_SERVER_COUNT: &str = "konnectivity_network_proxy_agent_known_server_count";
const OPEN_ENDPOINT_CONNECTIONS: &str =
    "konnectivity_network_proxy_agent_open_endpoint_connections";
const LEASE_LISTS: &str = "konnectivity_network_proxy_agent_lease_lists_total";
const LEASE_WATCHES: &str = "konnectivity_network_proxy_agent_lease_watches_total";
const LEASE_LIST_LATENCY: &str = "konnectivity_network_proxy_agent_lease_list_latency_seconds";
/// Ours: dials refused by `--allowed-destinations` (not in upstream's
/// `endpoint_dial_failure_total`, whose series stay as upstream's).
const DIALS_DENIED: &str = "konnectivity_network_proxy_agent_dials_denied_total";
/// Ours (issue 38.4): upstream has the server's only; the agent's has the
/// server's buckets and meaning, seen from the destination's side.
const CONNECTION_DURATION: &str = "konnectivity_network_proxy_agent_connection_duration_seconds";
/// Ours (issue 38.4): destination connections closed, by [`CloseReason`].
const CONNECTIONS_CLOSED: &str = "konnectivity_network_proxy_agent_connections_closed_total";

/// Packets sent to the server (`from_agent`) or received from it (`to_agent`).
#[derive(Debug, Clone, Copy)]
pub enum Segment {
    FromAgent = 0,
    ToAgent = 1,
}

/// Ours (issue 17.5): loaded certificates' expiry, and TLS file reloads.
pub const TLS: daemon::tls::reload::MetricNames =
    daemon::tls_metric_names!("konnectivity_network_proxy_agent");
// Ours, not upstream's: per-connection flow control and the HTTP/2 windows
// of the server streams (docs/konnectivity.md, "Windows that follow the link").
const FLOW: FlowGaugeNames = link::flow_gauge_names!(
    prefix: "konnectivity_network_proxy_agent",
    peers: "servers",
    on_to: "destinations",
    http2_flag: "--http2-max-window",
);

pub struct Metrics {
    registry: Arc<Registry>,
    flow: FlowGauges,
    pub dial_duration: Histogram,
    /// How long each established destination connection lived.
    pub connection_duration: Histogram,
    dial_timeout: Counter,
    dial_unknown: Counter,
    pub server_failure_to: Counter,
    pub server_failure_from: Counter,
    pub open_server_connections: Gauge,
    pub known_server_count: Gauge,
    pub open_endpoint_connections: Gauge,
    /// Segment × packet type: the data path counts every packet.
    stream: StreamStats,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Self {
        let r = Arc::new(
            Registry::new(&[
                (DIAL_DURATION, LATENCY_BUCKETS),
                (LEASE_LIST_LATENCY, LATENCY_BUCKETS),
                (CONNECTION_DURATION, CONNECTION_DURATION_BUCKETS),
            ])
            .with_go_defaults(),
        );
        r.describe_histogram(
            DIAL_DURATION,
            "Latency of dial to the remote endpoint in seconds",
        );
        r.describe_counter(
            SERVER_CONNECTION_FAILURES,
            "Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_events_error_total",
        );
        r.describe_counter(
            ENDPOINT_DIAL_FAILURES,
            "Number of failures dialing the remote endpoint, by reason (example: timeout).",
        );
        r.describe_gauge(
            OPEN_SERVER_CONNECTIONS,
            "Current number of open server connections.",
        );
        r.describe_gauge(
            KNOWN_SERVER_COUNT,
            "Current number of servers agent is trying to connect to.",
        );
        r.describe_gauge(
            OPEN_ENDPOINT_CONNECTIONS,
            "Current number of open endpoint connections.",
        );
        r.describe_counter(
            LEASE_LISTS,
            "Count of server lease list calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
        );
        // Described but, as upstream's, never incremented: watch outcomes go
        // to LEASE_LISTS (see lease_calls.rs).
        r.describe_counter(
            LEASE_WATCHES,
            "Count of server lease watch calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
        );
        r.describe_histogram(
            LEASE_LIST_LATENCY,
            "Latency of server lease listing in seconds",
        );
        r.describe_counter(
            DIALS_DENIED,
            "Dials refused because the destination is outside --allowed-destinations",
        );
        r.describe_histogram(
            CONNECTION_DURATION,
            "Ours: duration in seconds a destination connection was established (post-dial) before being closed.",
        );
        r.describe_counter(
            CONNECTIONS_CLOSED,
            "Ours: destination connections (and dials) closed, by reason; the reasons /debug/connections gives as close_cause.",
        );
        Metrics {
            flow: FlowGauges::new(&r, &FLOW),
            dial_duration: r.histogram(DIAL_DURATION, &[]),
            connection_duration: r.histogram(CONNECTION_DURATION, &[]),
            dial_timeout: r.counter(ENDPOINT_DIAL_FAILURES, &[("reason", "timeout")]),
            dial_unknown: r.counter(ENDPOINT_DIAL_FAILURES, &[("reason", "unknown")]),
            server_failure_to: r.counter(SERVER_CONNECTION_FAILURES, &[("direction", "to_server")]),
            server_failure_from: r
                .counter(SERVER_CONNECTION_FAILURES, &[("direction", "from_server")]),
            // From the start, at 0 (upstream's appears with the first
            // server stream): an agent that never reaches a server shows 0,
            // so `open < known` alerts fire, and a scrape right after
            // /healthz answers finds it (upstream's own test suite reads it
            // then). docs/konnectivity.md, differences.
            open_server_connections: r.gauge_always(OPEN_SERVER_CONNECTIONS, &[]),
            known_server_count: r.gauge_always(KNOWN_SERVER_COUNT, &[]),
            open_endpoint_connections: r.gauge(OPEN_ENDPOINT_CONNECTIONS, &[]),
            stream: StreamStats::new(
                &r,
                link::stream_metric_names!("konnectivity_network_proxy_agent"),
                &["from_agent", "to_agent"],
                &konnectivity_proto::PACKET_TYPE_LABELS,
                konnectivity_proto::counted_packet_type,
            ),
            registry: r,
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// A dial refused by the destination policy; the series appears on the
    /// first one.
    pub fn dial_denied(&self) {
        self.registry.counter(DIALS_DENIED, &[]).increment(1);
    }

    /// A connection or dial closed (told by `/debug/connections`' close
    /// hook); a series appears with its first close.
    pub fn connection_closed(&self, reason: CloseReason) {
        self.registry
            .counter(CONNECTIONS_CLOSED, &[("reason", reason.label())])
            .increment(1);
    }

    pub fn dial_failure(&self, timeout: bool) {
        if timeout {
            self.dial_timeout.increment(1)
        } else {
            self.dial_unknown.increment(1)
        }
    }

    /// A lease list or watch call answered with `code` (0: no response).
    pub fn lease_call(&self, code: u16, reason: &str) {
        self.registry
            .counter(
                LEASE_LISTS,
                &[
                    ("http_response_code", &code.to_string()),
                    ("reason", reason),
                ],
            )
            .increment(1);
    }

    pub fn lease_list_latency(&self, code: u16, latency: std::time::Duration) {
        self.registry
            .histogram(
                LEASE_LIST_LATENCY,
                &[("http_response_code", &code.to_string())],
            )
            .record(latency.as_secs_f64());
    }

    /// Counts one packet; WINDOW_UPDATE (ours only, see the server's) is
    /// left out so the family's series stay upstream's.
    pub fn packet(&self, segment: Segment, packet_type: i32) {
        self.stream.packet(segment as usize, packet_type);
    }

    pub fn stream_error(&self, segment: Segment, code: &'static str, packet_type: &'static str) {
        let seg = match segment {
            Segment::FromAgent => "from_agent",
            Segment::ToAgent => "to_agent",
        };
        self.stream.error(seg, code, packet_type);
    }

    /// Shows `pool`'s windows and budget from now on.
    pub fn watch_flow(&self, pool: Arc<FlowPool>) {
        self.flow.watch(pool);
    }

    /// The exposition, as one scrape of `/metrics` (promhttp's counters move).
    pub fn render(&self) -> String {
        self.flow.update();
        self.registry.scrape()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
