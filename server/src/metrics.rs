//! The server's metrics: upstream's names, labels, buckets and HELP text
//! (`konnectivity_network_proxy_server_*`), registered once per server
//! instance, each series appearing when upstream's would (see
//! [`go_compat::gometrics`]); with `process_*` and promhttp's families.

use std::sync::Arc;

use go_compat::gometrics::Registry;
use link::debug_connections::CloseReason;
use link::flow::FlowPool;
use link::flow::metrics::{FlowGaugeNames, FlowGauges};
use link::stream_metrics::StreamStats;
use metrics::{Counter, Gauge, Histogram};

const LATENCY_BUCKETS: &[f64] = &[0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];
/// Upstream's (after v0.36.0, #899): 1 s to 24 h.
const CONNECTION_DURATION_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

const DIAL_DURATION: &str = "konnectivity_network_proxy_server_dial_duration_seconds";
const FRONTEND_WRITE_DURATION: &str =
    "konnectivity_network_proxy_server_frontend_write_duration_seconds";
const CONNECTION_DURATION: &str = "konnectivity_network_proxy_server_connection_duration_seconds";
const GRPC_CONNECTIONS: &str = "konnectivity_network_proxy_server_grpc_connections";
const HTTP_CONNECTIONS: &str = "konnectivity_network_proxy_server_http_connections";
const READY_BACKEND_CONNECTIONS: &str =
    "konnectivity_network_proxy_server_ready_backend_connections";
const READY_BACKENDS: &str = "konnectivity_network_proxy_server_ready_backends";
const PENDING_DIALS: &str = "konnectivity_network_proxy_server_pending_backend_dials";
const ESTABLISHED: &str = "konnectivity_network_proxy_server_established_connections";
const FULL_RECV_CHANNELS: &str = "konnectivity_network_proxy_server_full_receive_channels";
const DIAL_FAILURES: &str = "konnectivity_network_proxy_server_dial_failure_count";
const CULLED_LEASES: &str = "konnectivity_network_proxy_server_culled_leases_count";
/// Ours (issue 38.1): dials moved to another agent.
const DIALS_RESENT: &str = "konnectivity_network_proxy_server_dials_resent_total";
/// Ours (issue 33): agent connections that waited for `--agent-accept-rate`.
const AGENT_ACCEPTS_DELAYED: &str = "konnectivity_network_proxy_server_agent_accepts_delayed_total";
/// Ours (issue 33): gRPC frontend connections sent away for a flood, and
/// the new connections of a client that flooded, delayed or closed.
const FRONTEND_FLOODS: &str = "konnectivity_network_proxy_server_frontend_floods_total";
const FRONTEND_FLOOD_PENALTY: &str =
    "konnectivity_network_proxy_server_frontend_flood_penalty_connections_total";
/// Ours (issue 38.4): tunnels closed, by frontend kind and [`CloseReason`].
const CONNECTIONS_CLOSED: &str = "konnectivity_network_proxy_server_connections_closed_total";
/// Ours (issue 17.5): loaded certificates' expiry, and TLS file reloads.
pub const TLS: daemon::tls::reload::MetricNames =
    daemon::tls_metric_names!("konnectivity_network_proxy_server");
const LEASE_DELETE_LATENCY: &str = "konnectivity_network_proxy_server_lease_delete_latency_seconds";
const LEASE_DELETES: &str = "konnectivity_network_proxy_server_lease_delete_total";
const LEASE_LIST_LATENCY: &str = "konnectivity_network_proxy_server_lease_list_latency_seconds";
const LEASE_LISTS: &str = "konnectivity_network_proxy_server_lease_list_total";

/// Why a dial failed, as upstream labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialFailure {
    NoAgent,
    ErrorResponse,
    UnrecognizedResponse,
    SendResponse,
    BackendClose,
    BackendDialTimeout,
    FrontendClose,
}

impl DialFailure {
    const ALL: [DialFailure; 7] = [
        DialFailure::NoAgent,
        DialFailure::ErrorResponse,
        DialFailure::UnrecognizedResponse,
        DialFailure::SendResponse,
        DialFailure::BackendClose,
        DialFailure::BackendDialTimeout,
        DialFailure::FrontendClose,
    ];

    fn label(self) -> &'static str {
        match self {
            DialFailure::NoAgent => "no_agent",
            DialFailure::ErrorResponse => "error_response",
            DialFailure::UnrecognizedResponse => "unrecognized_response",
            DialFailure::SendResponse => "send_rsp",
            DialFailure::BackendClose => "backend_close",
            DialFailure::BackendDialTimeout => "backend_dial_timeout",
            DialFailure::FrontendClose => "frontend_close",
        }
    }
}

/// The four legs a packet can travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    FromClient,
    ToClient,
    FromAgent,
    ToAgent,
}

impl Segment {
    const ALL: [Segment; 4] = [
        Segment::FromClient,
        Segment::ToClient,
        Segment::FromAgent,
        Segment::ToAgent,
    ];

    fn label(self) -> &'static str {
        match self {
            Segment::FromClient => "from_client",
            Segment::ToClient => "to_client",
            Segment::FromAgent => "from_agent",
            Segment::ToAgent => "to_agent",
        }
    }
}

/// Which gRPC service a connection gauge counts.
#[derive(Debug, Clone, Copy)]
pub enum Service {
    Proxy,
    Connect,
}

// Ours, not upstream's: per-connection flow control and the HTTP/2 windows
// of the agent streams (docs/konnectivity.md, "Windows that follow the link").
const FLOW: FlowGaugeNames = link::flow_gauge_names!(
    prefix: "konnectivity_network_proxy_server",
    peers: "agents",
    on_to: "frontends",
    http2_flag: "--agent-http2-max-window",
);

pub struct Metrics {
    registry: Arc<Registry>,
    flow: FlowGauges,
    pub dial_duration: Histogram,
    pub frontend_write_duration: Histogram,
    /// How long each established connection lived, observed when it ends.
    pub connection_duration: Histogram,
    grpc_proxy: Gauge,
    grpc_connect: Gauge,
    pub http_connections: Gauge,
    pub ready_backend_connections: Gauge,
    pub pending_dials: Gauge,
    pub established: Gauge,
    full_recv_proxy: Gauge,
    full_recv_connect: Gauge,
    /// Registered like upstream's (always present); moves once leases exist.
    pub culled_leases: Counter,
    dial_failures: Vec<Counter>,
    dials_resent: Counter,
    agent_accepts_delayed: Counter,
    frontend_floods: Counter,
    frontend_flood_delayed: Counter,
    frontend_flood_refused: Counter,
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
                (FRONTEND_WRITE_DURATION, LATENCY_BUCKETS),
                (CONNECTION_DURATION, CONNECTION_DURATION_BUCKETS),
            ])
            .with_go_defaults(),
        );
        r.describe_histogram(
            DIAL_DURATION,
            "Latency of dial to the remote endpoint in seconds",
        );
        r.describe_histogram(
            FRONTEND_WRITE_DURATION,
            "Latency of write to the frontend in seconds",
        );
        r.describe_histogram(
            CONNECTION_DURATION,
            "Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed.",
        );
        r.describe_gauge(
            GRPC_CONNECTIONS,
            "Number of current grpc connections, partitioned by service method.",
        );
        r.describe_gauge(
            HTTP_CONNECTIONS,
            "Number of current HTTP CONNECT connections",
        );
        r.describe_gauge(
            READY_BACKEND_CONNECTIONS,
            "Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
        );
        r.describe_gauge(
            READY_BACKENDS,
            "Number of konnectivity agent connected to the proxy server",
        );
        r.describe_gauge(
            PENDING_DIALS,
            "Current number of pending backend dial requests",
        );
        r.describe_gauge(
            ESTABLISHED,
            "Current number of established end-to-end connections (post-dial).",
        );
        r.describe_gauge(
            FULL_RECV_CHANNELS,
            "Number of current connections blocked by a full receive channel, partitioned by service method.",
        );
        r.describe_counter(
            DIAL_FAILURES,
            "Number of dial failures observed. Multiple failures can occur for a single dial request.",
        );
        r.describe_counter(
            DIALS_RESENT,
            "Ours: dials sent to another agent because the agent they were sent to disconnected or started draining before answering.",
        );
        r.describe_counter(
            AGENT_ACCEPTS_DELAYED,
            "Ours: new agent connections that waited in the listen backlog because --agent-accept-rate was reached.",
        );
        r.describe_counter(
            FRONTEND_FLOODS,
            "Ours: gRPC frontend connections closed with GOAWAY ENHANCE_YOUR_CALM for an HTTP/2 control-frame flood (each slows its client's new connections for --frontend-flood-penalty).",
        );
        r.describe_counter(
            FRONTEND_FLOOD_PENALTY,
            "Ours: new gRPC frontend connections from a client that flooded within --frontend-flood-penalty, by result: delayed (waited for their turn) or refused (closed, the queue was full).",
        );
        r.describe_counter(
            CONNECTIONS_CLOSED,
            "Ours: frontend connections (tunnels) closed, by frontend (grpc, http-connect) and reason; the reasons /debug/connections gives as close_cause.",
        );
        r.describe_counter(
            CULLED_LEASES,
            "Count of expired leases that the lease garbage collection controller has culled.",
        );
        r.describe_histogram(
            LEASE_DELETE_LATENCY,
            "Latency of lease deletion calls by the garbage collection controller in seconds.",
        );
        r.describe_counter(
            LEASE_DELETES,
            "Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.",
        );
        r.describe_histogram(
            LEASE_LIST_LATENCY,
            "Latency of lease list calls by the garbage collection controller in seconds.",
        );
        r.describe_counter(
            LEASE_LISTS,
            "Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason.",
        );
        Metrics {
            flow: FlowGauges::new(&r, &FLOW),
            dial_duration: r.histogram(DIAL_DURATION, &[]),
            frontend_write_duration: r.histogram(FRONTEND_WRITE_DURATION, &[]),
            connection_duration: r.histogram(CONNECTION_DURATION, &[]),
            grpc_proxy: r.gauge(GRPC_CONNECTIONS, &[("service_method", "Proxy")]),
            grpc_connect: r.gauge(GRPC_CONNECTIONS, &[("service_method", "Connect")]),
            http_connections: r.gauge_always(HTTP_CONNECTIONS, &[]),
            ready_backend_connections: r.gauge(READY_BACKEND_CONNECTIONS, &[]),
            pending_dials: r.gauge(PENDING_DIALS, &[]),
            established: r.gauge(ESTABLISHED, &[]),
            full_recv_proxy: r.gauge(FULL_RECV_CHANNELS, &[("service_method", "Proxy")]),
            full_recv_connect: r.gauge(FULL_RECV_CHANNELS, &[("service_method", "Connect")]),
            culled_leases: r.counter_always(CULLED_LEASES, &[]),
            dial_failures: DialFailure::ALL
                .iter()
                .map(|f| r.counter(DIAL_FAILURES, &[("reason", f.label())]))
                .collect(),
            dials_resent: r.counter(DIALS_RESENT, &[]),
            agent_accepts_delayed: r.counter(AGENT_ACCEPTS_DELAYED, &[]),
            frontend_floods: r.counter(FRONTEND_FLOODS, &[]),
            frontend_flood_delayed: r.counter(FRONTEND_FLOOD_PENALTY, &[("result", "delayed")]),
            frontend_flood_refused: r.counter(FRONTEND_FLOOD_PENALTY, &[("result", "refused")]),
            stream: StreamStats::new(
                &r,
                link::stream_metric_names!("konnectivity_network_proxy_server"),
                &Segment::ALL.map(Segment::label),
                &konnectivity_proto::PACKET_TYPE_LABELS,
                konnectivity_proto::counted_packet_type,
            ),
            registry: r,
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn dial_failure(&self, reason: DialFailure) {
        if let Some(c) = DialFailure::ALL
            .iter()
            .position(|r| *r == reason)
            .and_then(|i| self.dial_failures.get(i))
        {
            c.increment(1);
        }
    }

    /// A tunnel closed (told by `/debug/connections`' close hook); a series
    /// appears with its first close.
    pub fn connection_closed(&self, kind: &'static str, reason: CloseReason) {
        self.registry
            .counter(
                CONNECTIONS_CLOSED,
                &[("frontend", kind), ("reason", reason.label())],
            )
            .increment(1);
    }

    pub fn dial_resent(&self) {
        self.dials_resent.increment(1);
    }

    pub fn agent_accept_delayed(&self) {
        self.agent_accepts_delayed.increment(1);
    }

    pub fn frontend_flooded(&self) {
        self.frontend_floods.increment(1);
    }

    /// A new frontend connection from a client that flooded: `refused` if
    /// it was closed, else it waited.
    pub fn frontend_flood_penalty(&self, refused: bool) {
        match refused {
            true => self.frontend_flood_refused.increment(1),
            false => self.frontend_flood_delayed.increment(1),
        }
    }

    pub fn grpc_connections(&self, service: Service) -> &Gauge {
        match service {
            Service::Proxy => &self.grpc_proxy,
            Service::Connect => &self.grpc_connect,
        }
    }

    pub fn full_receive_channels(&self, service: Service) -> &Gauge {
        match service {
            Service::Proxy => &self.full_recv_proxy,
            Service::Connect => &self.full_recv_connect,
        }
    }

    pub fn ready_backends(&self, strategy: &str, count: usize) {
        // Strategy names are few and fixed; registering on use is cheap and
        // keeps the label set to the configured strategies.
        self.registry
            .gauge(READY_BACKENDS, &[("proxy_strategy", strategy)])
            .set(count as f64);
    }

    /// One lease list call of the garbage collection: its HTTP status and
    /// reason (200 and "" when it worked) and how long it took.
    pub fn lease_list(&self, code: u16, reason: &str, latency: std::time::Duration) {
        let code = code.to_string();
        self.registry
            .counter(
                LEASE_LISTS,
                &[("http_status_code", &code), ("reason", reason)],
            )
            .increment(1);
        self.registry
            .histogram(LEASE_LIST_LATENCY, &[("http_status_code", &code)])
            .record(latency.as_secs_f64());
    }

    /// One lease delete call of the garbage collection, as [`Metrics::lease_list`].
    pub fn lease_delete(&self, code: u16, reason: &str, latency: std::time::Duration) {
        let code = code.to_string();
        self.registry
            .counter(
                LEASE_DELETES,
                &[("http_status_code", &code), ("reason", reason)],
            )
            .increment(1);
        self.registry
            .histogram(LEASE_DELETE_LATENCY, &[("http_status_code", &code)])
            .record(latency.as_secs_f64());
    }

    /// Counts one packet of raw type `packet_type` on `segment`. Upstream
    /// never sends WINDOW_UPDATE (our flow control between our server and
    /// agent); it is left out so the family's series stay upstream's.
    pub fn packet(&self, segment: Segment, packet_type: i32) {
        self.stream.packet(segment as usize, packet_type);
    }

    pub fn stream_error(&self, segment: Segment, code: tonic::Code, packet_type: &'static str) {
        self.stream.error(
            segment.label(),
            konnectivity_proto::code_name(code),
            packet_type,
        );
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
