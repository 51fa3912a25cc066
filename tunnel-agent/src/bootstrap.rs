//! The Envoy v3 bootstrap KKP renders into the `envoy-agent` ConfigMap
//! (`--config-path /etc/envoy/envoy.yaml`), read as Envoy reads it, so a
//! newer KKP's template cannot stop the agent:
//!
//! 1. the file is checked against Envoy's own schema ([`crate::schema`],
//!    generated from Envoy's data-plane API): a field Envoy does not know, a
//!    value of the wrong type, or one its validation refuses is an error
//!    naming it, as Envoy's is;
//! 2. every field present is sorted ([`POLICY`]): the agent acts on the ones
//!    it implements; one whose meaning it cannot honour safely (a TLS
//!    transport socket to the seed it would not speak, a filter chain match
//!    it would not apply, xDS) refuses the file, naming it and why; every
//!    other field Envoy knows is ignored and reported (a log line and
//!    `tunnel_agent_static_ignored_fields_total`) at start and on each
//!    reload, and never stops the agent;
//! 3. what the fields mean for the agent is read from the checked tree.
//!
//! What it means for the agent:
//! * each listener with a `tcp_proxy` filter and `tunneling_config.hostname`
//!   is a tunnel listener: its connections become CONNECT streams with that
//!   authority;
//! * the cluster those filters name is the seed: its one endpoint (resolved
//!   again on every connect for `LOGICAL_DNS`), its `connect_timeout`, and its
//!   HTTP/2 options: `connection_keepalive` (PING interval and timeout),
//!   `max_concurrent_streams`, and the common options' `idle_timeout` and
//!   `max_requests_per_connection` (the seed connection pool). It must be
//!   HTTP/2: Envoy would fall back to HTTP/1.1 CONNECT, which the seed side
//!   here does not need and the agent does not speak;
//! * a listener with an HTTP connection manager whose routes go to the admin
//!   address is the stats listener: those path prefixes (KKP: `/stats`) are
//!   answered there (`/stats`, `/stats/prometheus`) without an admin port.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use daemon::authority::ConnectAuthority;

use crate::limits::{MAX_CONFIG_BYTES, MAX_FLOW_DEPTH, MAX_LISTENERS};
use crate::schema::{self, Checked};
use crate::tree::{self, Node};

const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const HTTP_OPTIONS_KEY: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const HTTP_OPTIONS: &str =
    "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootstrapError {
    #[error("larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge,
    #[error("brackets or braces nested deeper than {MAX_FLOW_DEPTH}")]
    TooDeep,
    #[error("{0}")]
    Syntax(String),
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

fn invalid(path: impl Into<String>, message: impl Into<String>) -> BootstrapError {
    BootstrapError::Invalid {
        path: path.into(),
        message: message.into(),
    }
}

/// A listener whose connections are tunneled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelListener {
    pub name: String,
    pub addr: SocketAddr,
    pub authority: ConnectAuthority,
}

/// The listener serving stats (KKP: `service_stats` on 0.0.0.0:8002).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsListener {
    pub name: String,
    pub addr: SocketAddr,
    /// Path prefixes routed to the admin interface (KKP: `/stats`).
    pub prefixes: Vec<String>,
}

/// The seed's tunneling endpoint (KKP: `proxy_cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedCluster {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub connect_timeout: Duration,
    /// HTTP/2 PING interval and timeout, when configured (an interval left
    /// out is the agent's default, 30 s: Envoy would send no interval PING).
    pub keepalive: Option<(Duration, Duration)>,
    /// `http2_protocol_options.max_concurrent_streams`.
    pub max_concurrent_streams: Option<u32>,
    /// `common_http_protocol_options.max_requests_per_connection` (or the
    /// cluster's deprecated field of that name).
    pub max_requests_per_connection: Option<u32>,
    /// `common_http_protocol_options.idle_timeout` (0: never).
    pub idle_timeout: Option<Duration>,
}

/// What the agent reports about a bootstrap it accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notes {
    /// Fields Envoy knows that the agent does not act on, by place
    /// (`static_resources.clusters[0].dns_lookup_family`); a field inside
    /// one of these is not listed again.
    pub ignored: Vec<String>,
    /// Fields Envoy's schema does not know, let through by
    /// `--allow-unknown-static-fields`.
    pub unknown: Vec<String>,
    /// How many messages held such fields (Envoy's
    /// `server.static_unknown_fields` counts so).
    pub unknown_messages: usize,
    /// Deprecated fields in use (Envoy warns about each).
    pub deprecated: Vec<String>,
}

/// What the bootstrap asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub admin: Option<SocketAddr>,
    pub stats: Option<StatsListener>,
    pub tunnels: Vec<TunnelListener>,
    pub seed: SeedCluster,
    /// `tcp_proxy.idle_timeout` of the tunnel listeners (one for all).
    pub idle_timeout: Option<Duration>,
    pub notes: Notes,
}

/// How to read a bootstrap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Envoy's `--allow-unknown-static-fields`: fields Envoy's schema does
    /// not know are reported and counted instead of refusing the file.
    pub allow_unknown_fields: bool,
}

/// What the agent does with a field Envoy's schema knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Read and acted on, or a name the agent shows; its fields are sorted
    /// in turn.
    Acts,
    /// Refuses the file: the agent cannot honour what the field asks for.
    Refuses(&'static str),
}

const REFUSE_XDS: Use = Use::Refuses(
    "configuration from a management server (xDS) is not supported: the agent reads static resources only",
);
const REFUSE_TLS: Use = Use::Refuses(
    "a transport socket (TLS) is not spoken: ignoring it would send or accept in plain text what is meant to be encrypted",
);
const REFUSE_MATCH: Use = Use::Refuses(
    "it narrows which connections a listener takes or where they go; ignoring it would route traffic it excludes",
);
const REFUSE_ADDRESS: Use = Use::Refuses(
    "only TCP socket addresses are supported; ignoring it would leave clients of that address with nothing",
);
const REFUSE_UPSTREAM: Use = Use::Refuses(
    "it changes how the connection to the seed is made or what it carries, which the agent does not do",
);
const REFUSE_ROUTE: Use =
    Use::Refuses("the stats listener serves path-prefix routes to the admin address only");

/// Every field of Envoy's schema the agent does not simply ignore, by its
/// qualified name. A field not listed here, or one inside a field not
/// acted on, is ignored and reported. docs/nodeport-proxy.md lists the
/// refusals and why.
pub const POLICY: &[(&str, Use)] = &[
    // The bootstrap.
    ("envoy.config.bootstrap.v3.Bootstrap.admin", Use::Acts),
    (
        "envoy.config.bootstrap.v3.Bootstrap.static_resources",
        Use::Acts,
    ),
    (
        "envoy.config.bootstrap.v3.Bootstrap.dynamic_resources",
        REFUSE_XDS,
    ),
    ("envoy.config.bootstrap.v3.Admin.address", Use::Acts),
    // KKP's template writes it; the admin listener logs no requests.
    ("envoy.config.bootstrap.v3.Admin.access_log_path", Use::Acts),
    (
        "envoy.config.bootstrap.v3.Bootstrap.StaticResources.listeners",
        Use::Acts,
    ),
    (
        "envoy.config.bootstrap.v3.Bootstrap.StaticResources.clusters",
        Use::Acts,
    ),
    // Addresses.
    ("envoy.config.core.v3.Address.socket_address", Use::Acts),
    ("envoy.config.core.v3.Address.pipe", REFUSE_ADDRESS),
    (
        "envoy.config.core.v3.Address.envoy_internal_address",
        REFUSE_ADDRESS,
    ),
    ("envoy.config.core.v3.SocketAddress.protocol", Use::Acts),
    ("envoy.config.core.v3.SocketAddress.address", Use::Acts),
    ("envoy.config.core.v3.SocketAddress.port_value", Use::Acts),
    (
        "envoy.config.core.v3.SocketAddress.named_port",
        REFUSE_ADDRESS,
    ),
    (
        "envoy.config.core.v3.SocketAddress.resolver_name",
        Use::Refuses(
            "a custom address resolver is not supported; the agent would resolve the name itself",
        ),
    ),
    (
        "envoy.config.core.v3.SocketAddress.network_namespace_filepath",
        Use::Refuses(
            "binding in another network namespace is not supported; the agent would bind in its own",
        ),
    ),
    // Listeners.
    ("envoy.config.listener.v3.Listener.name", Use::Acts),
    ("envoy.config.listener.v3.Listener.address", Use::Acts),
    ("envoy.config.listener.v3.Listener.filter_chains", Use::Acts),
    (
        "envoy.config.listener.v3.Listener.additional_addresses",
        REFUSE_ADDRESS,
    ),
    (
        "envoy.config.listener.v3.Listener.filter_chain_matcher",
        REFUSE_MATCH,
    ),
    (
        "envoy.config.listener.v3.Listener.default_filter_chain",
        REFUSE_MATCH,
    ),
    ("envoy.config.listener.v3.Listener.fcds_config", REFUSE_XDS),
    (
        "envoy.config.listener.v3.Listener.use_original_dst",
        REFUSE_MATCH,
    ),
    (
        "envoy.config.listener.v3.Listener.listener_filters",
        Use::Refuses(
            "listener filters (TLS inspector, PROXY protocol, …) read or change a connection's first bytes; the agent runs none",
        ),
    ),
    (
        "envoy.config.listener.v3.Listener.transparent",
        REFUSE_MATCH,
    ),
    (
        "envoy.config.listener.v3.Listener.udp_listener_config",
        REFUSE_ADDRESS,
    ),
    (
        "envoy.config.listener.v3.Listener.api_listener",
        REFUSE_ADDRESS,
    ),
    (
        "envoy.config.listener.v3.Listener.internal_listener",
        REFUSE_ADDRESS,
    ),
    (
        "envoy.config.listener.v3.Listener.bind_to_port",
        Use::Refuses(
            "a listener that does not bind its port is not supported; the agent binds every listener",
        ),
    ),
    ("envoy.config.listener.v3.FilterChain.filters", Use::Acts),
    ("envoy.config.listener.v3.FilterChain.name", Use::Acts),
    (
        "envoy.config.listener.v3.FilterChain.filter_chain_match",
        REFUSE_MATCH,
    ),
    (
        "envoy.config.listener.v3.FilterChain.transport_socket",
        REFUSE_TLS,
    ),
    (
        "envoy.config.listener.v3.FilterChain.use_proxy_proto",
        Use::Refuses(
            "connections would have to start with a PROXY protocol header, which the agent does not read",
        ),
    ),
    ("envoy.config.listener.v3.Filter.name", Use::Acts),
    ("envoy.config.listener.v3.Filter.typed_config", Use::Acts),
    (
        "envoy.config.listener.v3.Filter.config_discovery",
        REFUSE_XDS,
    ),
    // tcp_proxy.
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.stat_prefix",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.cluster",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.tunneling_config",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.idle_timeout",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.weighted_clusters",
        REFUSE_MATCH,
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.on_demand",
        REFUSE_XDS,
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.TunnelingConfig.hostname",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.TunnelingConfig.use_post",
        Use::Refuses(
            "tunnels are CONNECT streams; a POST tunnel is not spoken and the seed would not take it",
        ),
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.TunnelingConfig.post_path",
        Use::Refuses(
            "tunnels are CONNECT streams; a POST tunnel is not spoken and the seed would not take it",
        ),
    ),
    (
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.TunnelingConfig.headers_to_add",
        Use::Refuses("headers the seed may need (credentials, routing) would not be sent"),
    ),
    // The stats listener's HTTP connection manager.
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.stat_prefix",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.route_config",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.http_filters",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.rds",
        REFUSE_XDS,
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.scoped_routes",
        REFUSE_XDS,
    ),
    ("envoy.config.route.v3.RouteConfiguration.name", Use::Acts),
    (
        "envoy.config.route.v3.RouteConfiguration.virtual_hosts",
        Use::Acts,
    ),
    ("envoy.config.route.v3.RouteConfiguration.vhds", REFUSE_XDS),
    ("envoy.config.route.v3.VirtualHost.name", Use::Acts),
    ("envoy.config.route.v3.VirtualHost.domains", Use::Acts),
    ("envoy.config.route.v3.VirtualHost.routes", Use::Acts),
    ("envoy.config.route.v3.Route.name", Use::Acts),
    ("envoy.config.route.v3.Route.match", Use::Acts),
    ("envoy.config.route.v3.Route.route", Use::Acts),
    ("envoy.config.route.v3.Route.redirect", REFUSE_ROUTE),
    ("envoy.config.route.v3.Route.direct_response", REFUSE_ROUTE),
    ("envoy.config.route.v3.Route.filter_action", REFUSE_ROUTE),
    (
        "envoy.config.route.v3.Route.non_forwarding_action",
        REFUSE_ROUTE,
    ),
    ("envoy.config.route.v3.RouteMatch.prefix", Use::Acts),
    ("envoy.config.route.v3.RouteMatch.path", REFUSE_ROUTE),
    ("envoy.config.route.v3.RouteMatch.safe_regex", REFUSE_ROUTE),
    (
        "envoy.config.route.v3.RouteMatch.connect_matcher",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteMatch.path_separated_prefix",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteMatch.path_match_policy",
        REFUSE_ROUTE,
    ),
    ("envoy.config.route.v3.RouteMatch.headers", REFUSE_ROUTE),
    (
        "envoy.config.route.v3.RouteMatch.query_parameters",
        REFUSE_ROUTE,
    ),
    ("envoy.config.route.v3.RouteMatch.cookies", REFUSE_ROUTE),
    (
        "envoy.config.route.v3.RouteMatch.dynamic_metadata",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteMatch.filter_state",
        REFUSE_ROUTE,
    ),
    ("envoy.config.route.v3.RouteAction.cluster", Use::Acts),
    (
        "envoy.config.route.v3.RouteAction.cluster_header",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteAction.weighted_clusters",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteAction.cluster_specifier_plugin",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteAction.inline_cluster_specifier_plugin",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteAction.prefix_rewrite",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteAction.regex_rewrite",
        REFUSE_ROUTE,
    ),
    (
        "envoy.config.route.v3.RouteAction.path_rewrite_policy",
        REFUSE_ROUTE,
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter.name",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter.typed_config",
        Use::Acts,
    ),
    (
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter.config_discovery",
        REFUSE_XDS,
    ),
    // Clusters.
    ("envoy.config.cluster.v3.Cluster.name", Use::Acts),
    ("envoy.config.cluster.v3.Cluster.type", Use::Acts),
    ("envoy.config.cluster.v3.Cluster.connect_timeout", Use::Acts),
    ("envoy.config.cluster.v3.Cluster.load_assignment", Use::Acts),
    (
        "envoy.config.cluster.v3.Cluster.typed_extension_protocol_options",
        Use::Acts,
    ),
    (
        "envoy.config.cluster.v3.Cluster.max_requests_per_connection",
        Use::Acts,
    ),
    (
        "envoy.config.cluster.v3.Cluster.cluster_type",
        Use::Refuses(
            "a custom cluster type is not supported; the seed is one endpoint, STATIC, STRICT_DNS or LOGICAL_DNS",
        ),
    ),
    (
        "envoy.config.cluster.v3.Cluster.eds_cluster_config",
        REFUSE_XDS,
    ),
    (
        "envoy.config.cluster.v3.Cluster.transport_socket",
        REFUSE_TLS,
    ),
    (
        "envoy.config.cluster.v3.Cluster.transport_socket_matches",
        REFUSE_TLS,
    ),
    (
        "envoy.config.cluster.v3.Cluster.transport_socket_matcher",
        REFUSE_TLS,
    ),
    (
        "envoy.config.cluster.v3.Cluster.upstream_bind_config",
        Use::Refuses(
            "connections to the seed would not come from the source address it names, which firewalls may expect",
        ),
    ),
    ("envoy.config.cluster.v3.Cluster.filters", REFUSE_UPSTREAM),
    (
        "envoy.config.cluster.v3.Cluster.upstream_config",
        REFUSE_UPSTREAM,
    ),
    (
        "envoy.config.cluster.v3.Cluster.http_protocol_options",
        Use::Refuses(
            "HTTP/1.1 CONNECT to the seed is not spoken; tunnels are HTTP/2 CONNECT streams",
        ),
    ),
    (
        "envoy.config.endpoint.v3.ClusterLoadAssignment.cluster_name",
        Use::Acts,
    ),
    (
        "envoy.config.endpoint.v3.ClusterLoadAssignment.endpoints",
        Use::Acts,
    ),
    (
        "envoy.config.endpoint.v3.LocalityLbEndpoints.lb_endpoints",
        Use::Acts,
    ),
    (
        "envoy.config.endpoint.v3.LocalityLbEndpoints.leds_cluster_locality_config",
        REFUSE_XDS,
    ),
    ("envoy.config.endpoint.v3.LbEndpoint.endpoint", Use::Acts),
    (
        "envoy.config.endpoint.v3.LbEndpoint.endpoint_name",
        REFUSE_ADDRESS,
    ),
    ("envoy.config.endpoint.v3.Endpoint.address", Use::Acts),
    (
        "envoy.config.endpoint.v3.Endpoint.additional_addresses",
        REFUSE_ADDRESS,
    ),
    // The seed's HTTP/2 options.
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.explicit_http_config",
        Use::Acts,
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.common_http_protocol_options",
        Use::Acts,
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.use_downstream_protocol_config",
        Use::Refuses(
            "the protocol to the seed would not be fixed to HTTP/2, the only one tunnels are spoken in here",
        ),
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.auto_config",
        Use::Refuses(
            "the protocol to the seed would not be fixed to HTTP/2, the only one tunnels are spoken in here",
        ),
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.http_filters",
        REFUSE_UPSTREAM,
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.ExplicitHttpConfig.http2_protocol_options",
        Use::Acts,
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.ExplicitHttpConfig.http_protocol_options",
        Use::Refuses(
            "HTTP/1.1 CONNECT to the seed is not spoken; tunnels are HTTP/2 CONNECT streams",
        ),
    ),
    (
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions.ExplicitHttpConfig.http3_protocol_options",
        Use::Refuses("HTTP/3 to the seed is not spoken; tunnels are HTTP/2 CONNECT streams"),
    ),
    (
        "envoy.config.core.v3.Http2ProtocolOptions.connection_keepalive",
        Use::Acts,
    ),
    (
        "envoy.config.core.v3.Http2ProtocolOptions.max_concurrent_streams",
        Use::Acts,
    ),
    ("envoy.config.core.v3.KeepaliveSettings.interval", Use::Acts),
    ("envoy.config.core.v3.KeepaliveSettings.timeout", Use::Acts),
    (
        "envoy.config.core.v3.HttpProtocolOptions.idle_timeout",
        Use::Acts,
    ),
    (
        "envoy.config.core.v3.HttpProtocolOptions.max_requests_per_connection",
        Use::Acts,
    ),
];

fn policy(qualified: &str) -> Option<Use> {
    POLICY
        .iter()
        .find(|(q, _)| *q == qualified)
        .map(|(_, u)| *u)
}

/// Sorts every field present (parents first): refuses the file at the
/// first field the agent cannot honour, and lists the ones it ignores.
fn sort_fields(checked: &Checked) -> Result<Notes, BootstrapError> {
    let mut acts = vec![false; checked.present.len()];
    let mut notes = Notes {
        unknown: checked.unknown.clone(),
        unknown_messages: checked.unknown_messages,
        ..Notes::default()
    };
    for (i, p) in checked.present.iter().enumerate() {
        if p.parent.is_some_and(|parent| !acts[parent]) {
            continue;
        }
        let field = p.qualified.rsplit('.').next().unwrap_or(&p.qualified);
        if p.deprecated {
            notes.deprecated.push(p.path.clone());
        }
        match policy(&p.qualified) {
            Some(Use::Acts) => acts[i] = true,
            Some(Use::Refuses(why)) => {
                let why = if p.qualified == "envoy.config.bootstrap.v3.Bootstrap.dynamic_resources"
                {
                    format!("{why} ({XDS_HINT})")
                } else {
                    why.to_string()
                };
                return Err(invalid(
                    &p.path,
                    format!("`{field}` cannot be honoured safely, so the file is refused: {why}"),
                ));
            }
            None => notes.ignored.push(p.path.clone()),
        }
    }
    Ok(notes)
}

/// `port_value` as a port (PGV already bounded it to 65535).
fn port(path: &str, v: Option<&Node>) -> Result<u16, BootstrapError> {
    match v {
        None => Ok(0),
        Some(n) => number(n)
            .and_then(|v| u16::try_from(v).ok())
            .ok_or_else(|| invalid(path, "port_value is not a port")),
    }
}

/// A listener's port. Envoy binds port 0 to a port the kernel picks; here
/// a bootstrap listener is where pods (tunnels) or Prometheus and probes
/// (stats) reach the agent, at a port they know, and a reload would move
/// it: refused (docs/nodeport-proxy.md, differences).
fn listener_port(path: &str, v: u16) -> Result<u16, BootstrapError> {
    match v {
        0 => Err(invalid(
            path,
            "port_value 0 (a port the kernel picks) is refused for a listener: clients reach it at a fixed port",
        )),
        p => Ok(p),
    }
}

/// An integer the schema accepted (a number, or a string holding one).
fn number(n: &Node) -> Option<u64> {
    match n {
        Node::Int(i) => u64::try_from(*i).ok(),
        Node::Float(f) if f.fract() == 0.0 && *f >= 0.0 => Some(*f as u64),
        Node::Str(s) => s
            .parse()
            .ok()
            .or_else(|| s.parse::<f64>().ok().map(|f| f as u64)),
        _ => None,
    }
}

/// Whether an enum field holds `name` (or its `number`; absent is 0).
fn enum_is(v: Option<&Node>, name: &str, number: i128) -> bool {
    match v {
        None => number == 0,
        Some(Node::Str(s)) => s == name,
        Some(Node::Int(i)) => *i == number,
        Some(_) => false,
    }
}

fn duration_of(v: Option<&Node>) -> Option<Duration> {
    v.and_then(Node::as_str)
        .and_then(|s| crate::envoy_rules::parse_duration(s).ok())
}

fn string_of(v: Option<&Node>) -> String {
    v.and_then(Node::as_str).unwrap_or_default().to_string()
}

/// An `Address` that must be a TCP socket address.
fn socket_address<'a>(path: &str, a: Option<&'a Node>) -> Result<&'a Node, BootstrapError> {
    let sa = a
        .and_then(|a| a.get("socket_address"))
        .ok_or_else(|| invalid(path, "a socket_address is required"))?;
    if !enum_is(sa.get("protocol"), "TCP", 0) {
        return Err(invalid(path, "protocol UDP: only TCP is supported"));
    }
    Ok(sa)
}

/// A bind address: an IP, as Envoy requires.
fn bind_addr(path: &str, a: Option<&Node>) -> Result<SocketAddr, BootstrapError> {
    let sa = socket_address(path, a)?;
    let address = string_of(sa.get("address"));
    let ip: IpAddr = address
        .parse()
        .map_err(|_| invalid(path, format!("address {address:?} is not an IP address")))?;
    Ok(SocketAddr::new(ip, port(path, sa.get("port_value"))?))
}

/// A listener's bind address (port 0 refused, [`listener_port`]).
fn listener_addr(path: &str, a: Option<&Node>) -> Result<SocketAddr, BootstrapError> {
    let addr = bind_addr(path, a)?;
    listener_port(path, addr.port())?;
    Ok(addr)
}

enum Role {
    Tunnel {
        cluster: String,
        authority: ConnectAuthority,
        idle_timeout: Option<Duration>,
    },
    Stats {
        routes: Vec<(String, String)>,
    },
}

fn listener_role(path: &str, l: &Node) -> Result<Role, BootstrapError> {
    let [chain] = l.get("filter_chains").map(Node::items).unwrap_or_default() else {
        return Err(invalid(path, "exactly one filter chain is supported"));
    };
    let [filter] = chain.get("filters").map(Node::items).unwrap_or_default() else {
        return Err(invalid(path, "exactly one filter is supported"));
    };
    let path = format!("{path}.filter_chains[0].filters[0].typed_config");
    let c = filter
        .get("typed_config")
        .ok_or_else(|| invalid(&path, "a typed_config is required"))?;
    let kind = c
        .get("@type")
        .and_then(Node::as_str)
        .ok_or_else(|| invalid(&path, "no \"@type\""))?;
    let missing = |f: &str| invalid(&path, format!("missing field `{f}`"));
    match kind {
        TCP_PROXY => {
            let cluster = c
                .get("cluster")
                .and_then(Node::as_str)
                .ok_or_else(|| missing("cluster"))?;
            let hostname = c
                .get("tunneling_config")
                .and_then(|t| t.get("hostname"))
                .and_then(Node::as_str)
                .ok_or_else(|| missing("tunneling_config"))?;
            let authority = ConnectAuthority::parse(hostname)
                .map_err(|e| invalid(format!("{path}.tunneling_config.hostname"), e.to_string()))?;
            Ok(Role::Tunnel {
                cluster: cluster.to_string(),
                authority,
                idle_timeout: duration_of(c.get("idle_timeout")),
            })
        }
        HCM => {
            let route_config = c
                .get("route_config")
                .ok_or_else(|| missing("route_config"))?;
            match c.get("http_filters").map(Node::items).unwrap_or_default() {
                [f] if f
                    .get("typed_config")
                    .and_then(|t| t.get("@type"))
                    .and_then(Node::as_str)
                    == Some(ROUTER) => {}
                _ => {
                    return Err(invalid(
                        format!("{path}.http_filters"),
                        "only the router filter is supported",
                    ));
                }
            }
            let mut routes = Vec::new();
            let vhosts = route_config
                .get("virtual_hosts")
                .map(Node::items)
                .unwrap_or_default();
            for (i, vh) in vhosts.iter().enumerate() {
                let domains = vh.get("domains").map(Node::items).unwrap_or_default();
                if domains.iter().all(|d| d.as_str() != Some("*")) {
                    return Err(invalid(
                        format!("{path}.route_config.virtual_hosts[{i}].domains"),
                        "only the domain \"*\" is supported",
                    ));
                }
                for (j, r) in vh
                    .get("routes")
                    .map(Node::items)
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                {
                    let at = format!("{path}.route_config.virtual_hosts[{i}].routes[{j}]");
                    let prefix = r
                        .get("match")
                        .and_then(|m| m.get("prefix"))
                        .and_then(Node::as_str)
                        .ok_or_else(|| invalid(&at, "only prefix matches are supported"))?;
                    let cluster = r
                        .get("route")
                        .and_then(|a| a.get("cluster"))
                        .and_then(Node::as_str)
                        .ok_or_else(|| invalid(&at, "only routes to a cluster are supported"))?;
                    routes.push((prefix.to_string(), cluster.to_string()));
                }
            }
            Ok(Role::Stats { routes })
        }
        other => Err(invalid(
            format!("{path}.@type"),
            format!(
                "{other}: only tcp_proxy (tunneling) and the stats HTTP connection manager are supported"
            ),
        )),
    }
}

/// The one endpoint of a cluster.
fn endpoint<'a>(path: &str, c: &'a Node) -> Result<&'a Node, BootstrapError> {
    let all: Vec<&Node> = c
        .get("load_assignment")
        .and_then(|l| l.get("endpoints"))
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .flat_map(|l| l.get("lb_endpoints").map(Node::items).unwrap_or_default())
        .filter_map(|e| e.get("endpoint"))
        .collect();
    match all.as_slice() {
        [one] => socket_address(path, one.get("address")),
        _ => Err(invalid(
            format!("{path}.load_assignment"),
            "exactly one endpoint is supported",
        )),
    }
}

fn cluster_type(path: &str, c: &Node) -> Result<(), BootstrapError> {
    let t = c.get("type");
    if ["STATIC", "STRICT_DNS", "LOGICAL_DNS"]
        .iter()
        .zip(0..)
        .any(|(name, n)| enum_is(t, name, n))
    {
        return Ok(());
    }
    let shown = match t {
        Some(Node::Str(s)) => s.clone(),
        Some(Node::Int(i)) => i.to_string(),
        _ => String::new(),
    };
    Err(invalid(
        format!("{path}.type"),
        format!("{shown}: LOGICAL_DNS, STRICT_DNS or STATIC expected"),
    ))
}

fn seed_cluster(path: &str, c: &Node) -> Result<SeedCluster, BootstrapError> {
    cluster_type(path, c)?;
    // Envoy's default is 5 s, as the agent's.
    let connect_timeout = duration_of(c.get("connect_timeout"))
        .unwrap_or(crate::config::AgentConfig::default().connect_timeout);
    let extensions = c
        .get("typed_extension_protocol_options")
        .map(Node::entries)
        .unwrap_or_default();
    let options = extensions
        .iter()
        .find(|(k, _)| k == HTTP_OPTIONS_KEY)
        .map(|(_, v)| v)
        .ok_or_else(|| {
            invalid(
                path,
                "tunneling needs typed_extension_protocol_options with explicit_http_config.http2_protocol_options (HTTP/1.1 CONNECT is not supported)",
            )
        })?;
    let kind = options
        .get("@type")
        .and_then(Node::as_str)
        .unwrap_or_default();
    if kind != HTTP_OPTIONS {
        return Err(invalid(
            format!("{path}.typed_extension_protocol_options"),
            format!("\"@type\" {kind} is not {HTTP_OPTIONS}"),
        ));
    }
    let h2 = options
        .get("explicit_http_config")
        .and_then(|e| e.get("http2_protocol_options"))
        .ok_or_else(|| {
            invalid(
                format!("{path}.typed_extension_protocol_options"),
                "tunneling needs explicit_http_config.http2_protocol_options (HTTP/1.1 CONNECT is not supported)",
            )
        })?;
    let keepalive = h2.get("connection_keepalive").map(|k| {
        (
            duration_of(k.get("interval"))
                .unwrap_or(crate::config::AgentConfig::default().keepalive_interval),
            // PGV requires the timeout.
            duration_of(k.get("timeout")).unwrap_or_default(),
        )
    });
    let common = options.get("common_http_protocol_options");
    let max_requests = common
        .and_then(|c| c.get("max_requests_per_connection"))
        .or(c.get("max_requests_per_connection"))
        .and_then(number)
        .and_then(|n| u32::try_from(n).ok());
    let ep = endpoint(path, c)?;
    let host = string_of(ep.get("address"));
    if host.is_empty() {
        return Err(invalid(path, "the endpoint has no address"));
    }
    let port = match port(path, ep.get("port_value"))? {
        0 => return Err(invalid(path, "the endpoint's port_value is 0")),
        p => p,
    };
    Ok(SeedCluster {
        name: string_of(c.get("name")),
        host,
        port,
        connect_timeout,
        keepalive,
        max_concurrent_streams: h2
            .get("max_concurrent_streams")
            .and_then(number)
            .and_then(|n| u32::try_from(n).ok()),
        max_requests_per_connection: max_requests,
        idle_timeout: duration_of(common.and_then(|c| c.get("idle_timeout"))),
    })
}

/// The deepest nesting of `[` and `{`, counted before the YAML scanner (whose
/// time grows faster than linearly with it) sees the file. Brackets inside
/// scalars count too: that only over-counts, and no bootstrap nests deep.
fn flow_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for b in bytes {
        match b {
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Parses and checks a bootstrap; `bytes` is the whole file.
pub fn parse(bytes: &[u8]) -> Result<Bootstrap, BootstrapError> {
    parse_with(bytes, Options::default())
}

/// [`parse`] with options.
pub fn parse_with(bytes: &[u8], options: Options) -> Result<Bootstrap, BootstrapError> {
    parse_any_with(bytes, options)?
        .ok_or_else(|| invalid("static_resources.listeners", "no tunneling listener"))
}

/// KKP's nodeport-proxy pods run Envoy with a bootstrap that fetches
/// everything from envoy-manager over xDS; named in the error when that file
/// is given, since it means only half of that pod was swapped.
const XDS_HINT: &str = "this is the xDS bootstrap of KKP's nodeport-proxy pod, which needs KKP's envoy-manager; with nodeport-proxy's KKP image as the envoy-manager image, /etc/envoy/envoy.yaml declares nothing and this container only waits (docs/kkp.md)";

/// Like [`parse`], but a bootstrap that declares no listener and no cluster
/// at all is `None`: nothing to serve (the `envoy` container of KKP's
/// nodeport-proxy pod, whose traffic nodeport-proxy serves from the
/// envoy-manager container).
pub fn parse_any(bytes: &[u8]) -> Result<Option<Bootstrap>, BootstrapError> {
    parse_any_with(bytes, Options::default())
}

/// [`parse_any`] with options.
pub fn parse_any_with(bytes: &[u8], options: Options) -> Result<Option<Bootstrap>, BootstrapError> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(BootstrapError::TooLarge);
    }
    if flow_depth(bytes) > MAX_FLOW_DEPTH {
        return Err(BootstrapError::TooDeep);
    }
    let node = tree::parse(bytes).map_err(BootstrapError::Syntax)?;
    let (file, checked) = schema::check(&node, options.allow_unknown_fields)
        .map_err(|e| invalid(e.path, e.message))?;
    let notes = sort_fields(&checked)?;
    let admin = match file.get("admin").and_then(|a| a.get("address")) {
        Some(a) => Some(bind_addr("admin.address", Some(a))?),
        None => None,
    };
    let resources = file.get("static_resources");
    let listeners = resources
        .and_then(|r| r.get("listeners"))
        .map(Node::items)
        .unwrap_or_default();
    let clusters = resources
        .and_then(|r| r.get("clusters"))
        .map(Node::items)
        .unwrap_or_default();
    if listeners.is_empty() && clusters.is_empty() {
        return Ok(None);
    }
    if listeners.len() > MAX_LISTENERS {
        return Err(invalid(
            "static_resources.listeners",
            format!("more than {MAX_LISTENERS} listeners"),
        ));
    }
    let cluster_named = |name: &str| {
        clusters
            .iter()
            .find(|c| c.get("name").and_then(Node::as_str) == Some(name))
    };
    let mut stats = None;
    let mut tunnels = Vec::new();
    let mut seed_name: Option<String> = None;
    let mut idle_timeout: Option<Option<Duration>> = None;
    for (i, l) in listeners.iter().enumerate() {
        let name = string_of(l.get("name"));
        let path = format!("static_resources.listeners[{i}] ({name})");
        let addr = listener_addr(&format!("{path}.address"), l.get("address"))?;
        match listener_role(&path, l)? {
            Role::Tunnel {
                cluster,
                authority,
                idle_timeout: idle,
            } => {
                match &seed_name {
                    Some(s) if *s != cluster => {
                        return Err(invalid(
                            path,
                            format!(
                                "uses cluster {cluster}, but an earlier listener uses {s}: every listener must tunnel through one cluster"
                            ),
                        ));
                    }
                    _ => seed_name = Some(cluster),
                }
                match idle_timeout {
                    Some(before) if before != idle => {
                        return Err(invalid(
                            path,
                            "its tcp_proxy idle_timeout differs from an earlier listener's: one idle timeout for every listener is supported",
                        ));
                    }
                    _ => idle_timeout = Some(idle),
                }
                tunnels.push(TunnelListener {
                    name,
                    addr,
                    authority,
                });
            }
            Role::Stats { routes } => {
                if stats.is_some() {
                    return Err(invalid(path, "a second stats listener"));
                }
                let mut prefixes = Vec::new();
                for (prefix, cluster) in routes {
                    let c = cluster_named(&cluster).ok_or_else(|| {
                        invalid(&path, format!("route to unknown cluster {cluster}"))
                    })?;
                    let cpath = format!("static_resources.clusters ({cluster})");
                    let ep = endpoint(&cpath, c)?;
                    let target: Option<SocketAddr> = string_of(ep.get("address"))
                        .parse::<IpAddr>()
                        .ok()
                        .and_then(|ip| {
                            port(&cpath, ep.get("port_value"))
                                .ok()
                                .map(|p| SocketAddr::new(ip, p))
                        });
                    if admin.is_none() || target != admin {
                        return Err(invalid(
                            cpath,
                            "only routes to the admin address are served (stats)",
                        ));
                    }
                    prefixes.push(prefix);
                }
                stats = Some(StatsListener {
                    name,
                    addr,
                    prefixes,
                });
            }
        }
    }
    let seed_name =
        seed_name.ok_or_else(|| invalid("static_resources.listeners", "no tunneling listener"))?;
    let seed = cluster_named(&seed_name).ok_or_else(|| {
        invalid(
            "static_resources.clusters",
            format!("no cluster {seed_name}"),
        )
    })?;
    let seed = seed_cluster(&format!("static_resources.clusters ({seed_name})"), seed)?;
    // Clusters nothing uses must still be ones this file can describe.
    for c in clusters {
        let name = string_of(c.get("name"));
        if name != seed.name {
            let path = format!("static_resources.clusters ({name})");
            cluster_type(&path, c)?;
            endpoint(&path, c)?;
        }
    }
    Ok(Some(Bootstrap {
        admin,
        stats,
        tunnels,
        seed,
        idle_timeout: idle_timeout.flatten(),
        notes,
    }))
}

/// The file's bytes, at most [`MAX_CONFIG_BYTES`] of them.
pub fn read(path: &std::path::Path) -> Result<Vec<u8>, String> {
    daemon::file_watch::read_bounded(path, MAX_CONFIG_BYTES as u64)
        .map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Reads and parses the file at `path`.
pub fn load(path: &std::path::Path) -> Result<Bootstrap, String> {
    parse(&read(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod tests;
