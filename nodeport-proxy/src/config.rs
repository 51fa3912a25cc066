//! Runtime configuration of a proxy instance, as plain values with units in
//! their types. `cli.rs` fills it from KKP's flags; tests build it directly.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use daemon::keepalive::TcpKeepalive;

use crate::routing::model::Inventory;

/// Where the routing table comes from.
#[derive(Debug, Clone)]
pub enum TableSource {
    /// A YAML or JSON file, watched for changes and re-read on reload.
    File(PathBuf),
    /// A fixed inventory (tests, embedding); reload re-applies it.
    Inline(Inventory),
    /// Fed from outside by a Kubernetes watch (`kube::follow` into
    /// [`crate::NodePortProxy::apply_changes`]): no table until its first
    /// batch, which is when the proxy becomes ready; reload does nothing.
    Kubernetes,
}

impl TableSource {
    /// The source, as `/ready` names it.
    pub fn describe(&self) -> &'static str {
        match self {
            TableSource::File(_) => "the table file (-config)",
            TableSource::Inline(_) => "the inline table",
            TableSource::Kubernetes => "the Kubernetes watch",
        }
    }
}

/// KKP's nine connection settings (Seed `connectionSettings`). Where KKP
/// leaves one at 0, Envoy's default applies, as it did under KKP.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionSettings {
    /// `-sni-listener-idle-timeout`.
    pub sni_idle_timeout: Duration,
    /// `-tunneling-connection-idle-timeout`: an HTTP/2 connection without streams.
    pub tunneling_connection_idle_timeout: Duration,
    /// `-tunneling-stream-idle-timeout`: a CONNECT tunnel without traffic.
    pub tunneling_stream_idle_timeout: Duration,
    /// `-downstream-tcp-keepalive-{time,interval,probes}`.
    pub downstream_keepalive: TcpKeepalive,
    /// `-upstream-tcp-keepalive-{time,interval,probes}`.
    pub upstream_keepalive: TcpKeepalive,
}

impl Default for ConnectionSettings {
    /// Envoy's defaults: tcp_proxy idle timeout 1 h, HTTP connection manager
    /// idle timeout 1 h, stream idle timeout 5 min, no TCP keepalive.
    fn default() -> Self {
        ConnectionSettings {
            sni_idle_timeout: Duration::from_secs(3600),
            tunneling_connection_idle_timeout: Duration::from_secs(3600),
            tunneling_stream_idle_timeout: Duration::from_secs(300),
            downstream_keepalive: TcpKeepalive::default(),
            upstream_keepalive: TcpKeepalive::default(),
        }
    }
}

/// Listeners whose clients must start with a PROXY protocol header
/// (`-accept-proxy-protocol`): a load balancer that sends one sits in front.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcceptProxyProtocol {
    pub sni: bool,
    pub tunneling: bool,
    pub node_ports: bool,
}

impl std::str::FromStr for AcceptProxyProtocol {
    type Err = String;

    /// A comma list of `sni`, `tunneling`, `nodeport`; empty: none.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut a = AcceptProxyProtocol::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item {
                "sni" => a.sni = true,
                "tunneling" => a.tunneling = true,
                "nodeport" => a.node_ports = true,
                other => {
                    return Err(format!(
                        "{other:?} is not a listener (sni, tunneling or nodeport)"
                    ));
                }
            }
        }
        Ok(a)
    }
}

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub source: TableSource,
    /// `-expose-annotation-key`.
    pub expose_annotation_key: String,
    /// `-namespace`; `None` watches all namespaces.
    pub namespace: Option<String>,
    /// Address NodePort listeners bind (KKP: 0.0.0.0).
    pub node_port_bind_address: IpAddr,
    pub connection: ConnectionSettings,
    /// NodePort connections idle this long are closed (Envoy's tcp_proxy default).
    pub node_port_idle_timeout: Duration,
    /// A client on the SNI port must send its whole ClientHello within this
    /// (Envoy's listener-filter timeout, 15 s).
    pub client_hello_timeout: Duration,
    /// A client on the tunneling port must send its request head (or the
    /// HTTP/2 preface and first request) within this.
    pub request_header_timeout: Duration,
    /// KKP clusters: 1 s.
    pub upstream_connect_timeout: Duration,
    /// Endpoints tried per connection before giving up (round robin);
    /// Envoy's tcp_proxy makes one attempt.
    pub upstream_connect_attempts: usize,
    /// How long connections on a removed route (its Service gone, or
    /// without a ready endpoint) keep running: Envoy's `--drain-time-s`.
    pub route_drain_timeout: Duration,
    /// At shutdown, how long all connections may keep running.
    pub drain_timeout: Duration,
    /// After SIGTERM, how long `/healthz` fails while traffic is still served,
    /// so load balancers stop sending new connections first.
    pub shutdown_delay: Duration,
    /// `/ready` fails once the source has been out of sync this long
    /// (zero: never, once the first table is applied).
    pub ready_out_of_sync_limit: Duration,
    /// Open connections per listener (CONNECT streams count on the tunneling
    /// listener); further ones wait in the kernel backlog.
    pub max_connections_per_listener: usize,
    /// Connections one client IP address may hold on the SNI or tunneling
    /// listener before sending its ClientHello or request head; past it,
    /// that address's oldest such connection is closed. 0: no limit.
    pub max_pending_connections_per_ip: usize,
    /// Each direction of each proxied connection has one buffer of this size.
    pub buffer_size: usize,
    /// `-splice`: NodePort and SNI connections relay kernel to kernel
    /// (splice(2) through a pipe per direction) instead of copying.
    pub splice: bool,
    /// `-access-log`: one line per connection or stream; `None`: off.
    pub access_log: Option<crate::relay::access_log::AccessLogConfig>,
    /// Concurrent CONNECT streams per HTTP/2 connection.
    pub max_streams_per_connection: u32,
    /// `-accept-proxy-protocol`.
    pub accept_proxy_protocol: AcceptProxyProtocol,
    /// A client on such a listener must send its PROXY header within this
    /// (Envoy's listener-filter timeout, 15 s).
    pub proxy_protocol_timeout: Duration,
    /// How the windows of HTTP/2 tunneling connections grow and shrink.
    pub tunnel_windows: link::h2window::WindowSettings,
    /// What all HTTP/2 tunneling connections together may have in flight
    /// to us (their connection windows).
    pub tunnel_memory_budget: i64,
    /// Per-cluster circuit breakers (`-max-*-per-cluster`).
    pub cluster_limits: crate::relay::admission::ClusterLimits,
    /// `-tunneling-flood-penalty`: after a tunneling connection is sent away
    /// for a control-frame flood, its client address's new connections start
    /// at most `limits::FLOOD_PENALTY_RATE` a second for this long; zero:
    /// off.
    pub tunneling_flood_penalty: Duration,
    /// `-sni-overflow-slow-lane`: after an SNI connection is refused by a
    /// cluster's bound, its client address's new SNI connections take the
    /// listener's slow lane (`daemon::slow_lane`) for this long; zero: off.
    /// The SNI listener must then come with its lane
    /// ([`crate::Listeners::sni_slow_lane`]).
    pub sni_overflow_slow_lane: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            source: TableSource::Inline(Inventory::default()),
            expose_annotation_key: crate::routing::expose::DEFAULT_EXPOSE_ANNOTATION_KEY
                .to_string(),
            namespace: None,
            node_port_bind_address: IpAddr::from([0, 0, 0, 0]),
            connection: ConnectionSettings::default(),
            node_port_idle_timeout: Duration::from_secs(3600),
            client_hello_timeout: Duration::from_secs(15),
            request_header_timeout: Duration::from_secs(10),
            upstream_connect_timeout: Duration::from_secs(1),
            upstream_connect_attempts: 1,
            route_drain_timeout: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(30),
            shutdown_delay: Duration::from_secs(5),
            ready_out_of_sync_limit: crate::health::readiness::DEFAULT_OUT_OF_SYNC_LIMIT,
            max_connections_per_listener: 10_000,
            max_pending_connections_per_ip: 0,
            buffer_size: 16 * 1024,
            splice: true,
            access_log: None,
            max_streams_per_connection: 1024,
            accept_proxy_protocol: AcceptProxyProtocol::default(),
            proxy_protocol_timeout: Duration::from_secs(15),
            tunnel_windows: link::h2window::WindowSettings {
                initial: crate::limits::STREAM_WINDOW,
                max: crate::limits::DEFAULT_MAX_STREAM_WINDOW,
                connection_budget: crate::limits::DEFAULT_CONNECTION_BUDGET,
                idle: crate::limits::WINDOW_IDLE,
                single_stream: false,
            },
            tunnel_memory_budget: crate::limits::DEFAULT_MEMORY_BUDGET,
            cluster_limits: crate::relay::admission::ClusterLimits::default(),
            tunneling_flood_penalty: crate::limits::DEFAULT_FLOOD_PENALTY,
            sni_overflow_slow_lane: Duration::ZERO,
        }
    }
}
