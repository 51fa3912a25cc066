//! envoy-manager's command line (single-dash Go flags, same names and
//! meanings), plus this proxy's own settings, turned into a [`ProxyConfig`].

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use daemon::keepalive::TcpKeepalive;
use go_compat::flags::{FlagSet, Given, KkpLogging, Values};

use crate::config::{ConnectionSettings, ProxyConfig, TableSource};
use crate::sources::source;

/// The command line, parsed and validated.
#[derive(Debug, Clone)]
pub struct Cli {
    pub config: ProxyConfig,
    /// Address of the stats, SNI and tunneling listeners.
    pub bind_address: IpAddr,
    pub stats_port: u16,
    /// `/debug/connections`; 0: off.
    pub admin_port: u16,
    pub admin_address: IpAddr,
    /// 0: disabled.
    pub sni_port: u16,
    /// 0: disabled.
    pub tunneling_port: u16,
    /// Tokio worker threads; 0 means one per available core.
    pub worker_threads: usize,
    /// Services and EndpointSlices come from the apiserver (`None`: from
    /// the table file or the embedded demo).
    pub kubernetes: Option<crate::sources::kube::KubeSource>,
}

go_compat::typed_flags! {
    /// nodeport-proxy's flags (envoy-manager's and ours), in `--help` order.
    pub struct Flags = (FlagSet::new(
        "nodeport-proxy",
        "Exposes Services annotated nodeport-proxy.k8s.io/expose on NodePort, SNI and HTTP CONNECT listeners.",
        )
        .compatible_with("KKP nodeport-proxy (envoy-manager and Envoy)")) {
        #[flag("listen-address", ":8001", "accepted for envoy-manager compatibility; no xDS is served")]
        listen_address: String,
        #[flag("envoy-node-name", "kube", "accepted for envoy-manager compatibility")]
        envoy_node_name: String,
        #[flag("envoy-admin-port", 9001, "port of the admin listener serving /debug/connections, on -admin-address (Envoy's admin port in KKP; 0: off)")]
        envoy_admin_port: Given<i64>,
        #[flag("admin-address", "127.0.0.1", "address of the admin listener (loopback: only processes on the node, or kubectl port-forward, reach it)")]
        admin_address: String,
        #[flag("envoy-stats-port", 8002, "port of /healthz and /stats/prometheus")]
        envoy_stats_port: Given<i64>,
        #[flag("envoy-sni-port", 0, "SNI passthrough listener port (KKP seed: 6443); 0 disables SNI")]
        envoy_sni_port: Given<i64>,
        #[flag("envoy-tunneling-port", 0, "HTTP CONNECT tunneling listener port (KKP seed: 8088); 0 disables tunneling")]
        envoy_tunneling_port: Given<i64>,
        #[flag("sni-listener-idle-timeout", Duration::ZERO, "close SNI connections idle this long (0: Envoy's default, 1h)")]
        sni_listener_idle_timeout: Given<Duration>,
        #[flag("tunneling-connection-idle-timeout", Duration::ZERO, "close tunneling connections without open tunnels this long (0: Envoy's default, 1h)")]
        tunneling_connection_idle_timeout: Given<Duration>,
        #[flag("tunneling-stream-idle-timeout", Duration::ZERO, "close CONNECT tunnels idle this long (0: Envoy's default, 5m)")]
        tunneling_stream_idle_timeout: Given<Duration>,
        #[flag("downstream-tcp-keepalive-time", Duration::ZERO, "client socket keepalive idle time (0: unset; keepalive is on only when one of the three is set)")]
        downstream_tcp_keepalive_time: Given<Duration>,
        #[flag("downstream-tcp-keepalive-interval", Duration::ZERO, "client socket keepalive probe interval (0: unset)")]
        downstream_tcp_keepalive_interval: Given<Duration>,
        #[flag("downstream-tcp-keepalive-probes", 0, "client socket keepalive probes (0: unset)")]
        downstream_tcp_keepalive_probes: Given<i64>,
        #[flag("upstream-tcp-keepalive-time", Duration::ZERO, "upstream socket keepalive idle time (0: unset; keepalive is on only when one of the three is set)")]
        upstream_tcp_keepalive_time: Given<Duration>,
        #[flag("upstream-tcp-keepalive-interval", Duration::ZERO, "upstream socket keepalive probe interval (0: unset)")]
        upstream_tcp_keepalive_interval: Given<Duration>,
        #[flag("upstream-tcp-keepalive-probes", 0, "upstream socket keepalive probes (0: unset)")]
        upstream_tcp_keepalive_probes: Given<i64>,
        #[flag("namespace", "", "only expose Services in this namespace (empty: all)")]
        namespace: String,
        #[flag("expose-annotation-key", crate::routing::expose::DEFAULT_EXPOSE_ANNOTATION_KEY, "annotation that marks exposed Services")]
        expose_annotation_key: String,
        #[flag("config", "", "YAML/JSON file of Services and EndpointSlices, watched and re-read on SIGHUP (needed outside a cluster unless -kubeconfig or -source=demo is given)")]
        config: String,
        #[flag("source", "", "where Services and EndpointSlices come from: kubernetes (watch the apiserver), file (-config) or demo; empty: file with -config, else kubernetes with -kubeconfig or inside a cluster, else an error (demo is only ever chosen by name)")]
        source: String,
        #[flag("kubeconfig", "", "kubeconfig for the kubernetes source (empty: in-cluster configuration)")]
        kubeconfig: Given<String>,
        #[flag("bind-address", "::", "address every listener binds (::, the default: every interface, IPv4 and IPv6)")]
        bind_address: String,
        #[flag("node-port-idle-timeout", defaults().node_port_idle_timeout, "close NodePort connections idle this long")]
        node_port_idle_timeout: Duration,
        #[flag("sni-client-hello-timeout", defaults().client_hello_timeout, "close SNI clients that have not sent a ClientHello within this")]
        sni_client_hello_timeout: Duration,
        #[flag("tunneling-request-header-timeout", defaults().request_header_timeout, "close tunneling clients that have not sent a request head within this")]
        tunneling_request_header_timeout: Duration,
        #[flag("upstream-connect-timeout", defaults().upstream_connect_timeout, "per-endpoint upstream connect timeout")]
        upstream_connect_timeout: Duration,
        #[flag("upstream-connect-attempts", defaults().upstream_connect_attempts as i64, "endpoints tried in round-robin order before a connection is refused (Envoy's tcp_proxy: 1)")]
        upstream_connect_attempts: Given<i64>,
        #[flag("route-drain-timeout", defaults().route_drain_timeout, "how long connections on a removed route (Service gone or without a ready endpoint) may continue; Envoy's --drain-time-s")]
        route_drain_timeout: Duration,
        #[flag("drain-timeout", defaults().drain_timeout, "after SIGTERM, how long connections may continue")]
        drain_timeout: Duration,
        #[flag("shutdown-delay", defaults().shutdown_delay, "after SIGTERM, how long /healthz fails while traffic is still served")]
        shutdown_delay: Duration,
        #[flag("ready-out-of-sync-limit", defaults().ready_out_of_sync_limit, "/ready fails once the routing source (Kubernetes watch or table file) has been out of sync this long; before its first table it fails anyway (0: only that)")]
        ready_out_of_sync_limit: Duration,
        #[flag("max-connections-per-listener", defaults().max_connections_per_listener as i64, "open connections (tunnels on the tunneling listener) per listener; when full, the oldest connection without a ClientHello or request head yet is closed for a newcomer")]
        max_connections_per_listener: Given<i64>,
        #[flag("max-pending-connections-per-ip", defaults().max_pending_connections_per_ip as i64, "connections one client IP may hold on the SNI and tunneling listeners before sending a ClientHello or request head; past it, its oldest is closed (0: no limit). Behind -accept-proxy-protocol, the client IP the PROXY header names")]
        max_pending_connections_per_ip: i64,
        #[flag("buffer-size", defaults().buffer_size as i64, "bytes per direction buffered for each proxied connection")]
        buffer_size: Given<i64>,
        #[flag("splice", defaults().splice, "relay NodePort and SNI connections kernel to kernel with splice(2), a pipe (2 file descriptors) per direction while data moves; false: copy through a -buffer-size buffer as the tunnels do")]
        splice: bool,
        #[flag("tunneling-max-concurrent-streams", i64::from(defaults().max_streams_per_connection), "CONNECT streams per HTTP/2 connection")]
        tunneling_max_concurrent_streams: Given<i64>,
        #[flag("access-log", "", "write one access-log line per connection (per CONNECT stream) to this file; /dev/stdout or - for standard output; empty: off")]
        access_log: String,
        #[flag("access-log-format", "json", "access-log lines as json (fields named after Envoy's command operators) or envoy (Envoy's default text format, plus listener, SNI host and close reason)")]
        access_log_format: String,
        #[flag("accept-proxy-protocol", "", "listeners whose clients must start with a PROXY protocol v1 or v2 header, a comma list of sni, tunneling, nodeport (a load balancer sending one is in front; source allow-lists then see the real client); empty: none")]
        accept_proxy_protocol: String,
        #[flag("proxy-protocol-timeout", defaults().proxy_protocol_timeout, "close clients of such a listener that have not sent a complete PROXY header within this")]
        proxy_protocol_timeout: Duration,
        #[flag("tunneling-max-stream-window", i64::from(defaults().tunnel_windows.max), "largest HTTP/2 stream window (bytes) of a tunneling connection; windows start at 256 KiB and grow as the link needs (Envoy: fixed 256 MiB)")]
        tunneling_max_stream_window: Given<i64>,
        #[flag("tunneling-connection-budget", defaults().tunnel_windows.connection_budget, "bytes one HTTP/2 tunneling connection may have in flight to this proxy, its stalled streams included")]
        tunneling_connection_budget: Given<i64>,
        #[flag("tunneling-memory-budget", defaults().tunnel_memory_budget, "bytes all HTTP/2 tunneling connections together may have in flight to this proxy")]
        tunneling_memory_budget: Given<i64>,
        #[flag("max-connections-per-cluster", defaults().cluster_limits.max_connections as i64, "upstream connections one cluster (exposed Service port) may have open or opening, on all listeners; past it a new connection to that cluster fails at once (SNI and NodePort: closed, CONNECT: 503; reason upstream_cx_overflow); Envoy's circuit-breaker max_connections is 1024, ours is what one node's tunnel-agent may send (0: no limit)")]
        max_connections_per_cluster: i64,
        #[flag("max-pending-connects-per-cluster", defaults().cluster_limits.max_pending as i64, "upstream connects one cluster may have unanswered (each within -upstream-connect-timeout); past it a new connection fails at once (reason upstream_rq_pending_overflow); Envoy's circuit-breaker max_pending_requests (0: no limit)")]
        max_pending_connects_per_cluster: i64,
        #[flag("max-buffered-bytes-per-cluster", defaults().cluster_limits.max_buffered as i64, "bytes one cluster's connections may hold in this proxy's buffers (read from one side, not yet written to the other); past it the cluster admits no new connection until it drains (reason upstream_buffer_overflow; 0: no limit)")]
        max_buffered_bytes_per_cluster: i64,
        #[flag("tunneling-flood-penalty", defaults().tunneling_flood_penalty, "after a tunneling connection is closed for an HTTP/2 control-frame flood (GOAWAY ENHANCE_YOUR_CALM), new connections from its client address (IPv6: its /64) start at most 10 a second for this long after its last flood; the rest wait (up to 10 s) or are closed (reason flood_penalty); behind -accept-proxy-protocol, the address the PROXY header names (0: off)")]
        tunneling_flood_penalty: Duration,
        #[flag("sni-overflow-slow-lane", defaults().sni_overflow_slow_lane, "after an SNI connection is refused by a cluster's bound (upstream_cx_overflow, upstream_rq_pending_overflow, upstream_buffer_overflow), the kernel sends its client address's (IPv6: /64's) new SNI connections to a listening socket of their own, accepted 10 a second, for this long after its last refusal (or failed connection); past 64 waiting there it drops their SYNs and the clients retry; it needs the clients' own addresses: not with -accept-proxy-protocol=sni, nor behind a load balancer or kube-proxy that hides them (externalTrafficPolicy: Cluster) (0: off)")]
        sni_overflow_slow_lane: Duration,
        #[flag("worker-threads", 0, "runtime worker threads (0: one per core)")]
        worker_threads: i64,
        #[embed(with_kkp_logging())]
        log: KkpLogging,
    }
}

/// The flags as `--help` lists them.
pub fn flag_set() -> FlagSet {
    Flags::flag_set()
}

/// The defaults the flags' defaults come from.
fn defaults() -> ProxyConfig {
    ProxyConfig::default()
}

/// The HTTP/2 window flags of the tunneling listener.
fn tunnel_windows(f: &Flags, p: &ProxyConfig) -> Result<link::h2window::WindowSettings, String> {
    let initial = p.tunnel_windows.initial;
    let max = at_least(&f.tunneling_max_stream_window, i64::from(initial))?;
    let max = u32::try_from(max.min((1 << 31) - 1)).unwrap_or(u32::MAX);
    let budget = at_least(
        &f.tunneling_connection_budget,
        i64::from(p.tunnel_windows.initial_connection()),
    )?;
    Ok(link::h2window::WindowSettings {
        max,
        connection_budget: budget,
        ..p.tunnel_windows
    })
}

/// A byte count flag that must be at least `min`.
fn at_least(flag: &Given<i64>, min: i64) -> Result<i64, String> {
    match flag.value {
        n if n >= min => Ok(n),
        n => Err(format!(
            "-{} must be at least {min} bytes, got {n}",
            flag.name()
        )),
    }
}

/// KKP accepts 0 (meaning "default") or at least one second for these.
fn setting(flag: &Given<Duration>, default: Duration) -> Result<Duration, String> {
    match flag.value {
        d if d.is_zero() => Ok(default),
        d if d < Duration::from_secs(1) => {
            Err(format!("-{}: must be 0 or at least 1s", flag.name()))
        }
        d => Ok(d),
    }
}

fn keepalive(
    time: &Given<Duration>,
    interval: &Given<Duration>,
    probes: &Given<i64>,
) -> Result<TcpKeepalive, String> {
    let dur = |flag: &Given<Duration>| -> Result<Option<Duration>, String> {
        match flag.value {
            d if d.is_zero() => Ok(None),
            d if d < Duration::from_secs(1) => {
                Err(format!("-{}: must be 0 or at least 1s", flag.name()))
            }
            d => Ok(Some(d)),
        }
    };
    let n = probes.value;
    let n = u32::try_from(n).map_err(|_| format!("-{}: {n} is not valid", probes.name()))?;
    // As KKP's envoy-manager: only the fields given are set (no backfill),
    // and with none given keepalive stays off.
    Ok(TcpKeepalive {
        time: dur(time)?,
        interval: dur(interval)?,
        probes: Some(n).filter(|p| *p > 0),
    })
}

fn positive(flag: &Given<i64>) -> Result<usize, String> {
    let n = flag.value;
    usize::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("-{}: {n} must be positive", flag.name()))
}

fn not_negative(n: i64, flag: &str) -> Result<usize, String> {
    usize::try_from(n).map_err(|_| format!("{flag}: {n} must not be negative (0: no limit)"))
}

pub fn from_values(v: &Values) -> Result<Cli, String> {
    let f = Flags::from_values(v);
    let d = ConnectionSettings::default();
    let p = ProxyConfig::default();
    let connection = ConnectionSettings {
        sni_idle_timeout: setting(&f.sni_listener_idle_timeout, d.sni_idle_timeout)?,
        tunneling_connection_idle_timeout: setting(
            &f.tunneling_connection_idle_timeout,
            d.tunneling_connection_idle_timeout,
        )?,
        tunneling_stream_idle_timeout: setting(
            &f.tunneling_stream_idle_timeout,
            d.tunneling_stream_idle_timeout,
        )?,
        downstream_keepalive: keepalive(
            &f.downstream_tcp_keepalive_time,
            &f.downstream_tcp_keepalive_interval,
            &f.downstream_tcp_keepalive_probes,
        )?,
        upstream_keepalive: keepalive(
            &f.upstream_tcp_keepalive_time,
            &f.upstream_tcp_keepalive_interval,
            &f.upstream_tcp_keepalive_probes,
        )?,
    };
    let config_path = f.config.clone();
    let kubeconfig = f.kubeconfig.existing_file()?;
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let source_flag = f.source.clone();
    let kind = match source_flag.as_str() {
        "" if !config_path.is_empty() => "file",
        "" if kubeconfig.is_some() || in_cluster => "kubernetes",
        "" => {
            return Err(
                "no routing source: pass -config=FILE (a table of Services and EndpointSlices), \
                 -kubeconfig=FILE or run inside a cluster (-source=kubernetes); \
                 -source=demo serves the embedded demo table"
                    .into(),
            );
        }
        k @ ("file" | "kubernetes" | "demo") => k,
        other => {
            return Err(format!(
                "-source must be kubernetes, file or demo, got {other:?}"
            ));
        }
    };
    let source = match kind {
        "file" if config_path.is_empty() => return Err("-source=file needs -config".into()),
        "file" => TableSource::File(PathBuf::from(&config_path)),
        // The watch feeds the table; there is none until its first batch.
        "kubernetes" => TableSource::Kubernetes,
        _ => TableSource::Inline(source::embedded_default()),
    };
    let bind_address: IpAddr = f
        .bind_address
        .parse()
        .map_err(|e| format!("-bind-address: {e}"))?;
    let namespace = Some(f.namespace.clone()).filter(|n| !n.is_empty());
    let nonzero = |d: Duration, default: Duration| -> Duration {
        Some(d).filter(|d| !d.is_zero()).unwrap_or(default)
    };
    let access_log_format: crate::relay::access_log::Format = f
        .access_log_format
        .parse()
        .map_err(|e| format!("-access-log-format: {e}"))?;
    let config = ProxyConfig {
        source,
        expose_annotation_key: f.expose_annotation_key.clone(),
        namespace,
        node_port_bind_address: bind_address,
        connection,
        node_port_idle_timeout: nonzero(f.node_port_idle_timeout, p.node_port_idle_timeout),
        client_hello_timeout: nonzero(f.sni_client_hello_timeout, p.client_hello_timeout),
        request_header_timeout: nonzero(
            f.tunneling_request_header_timeout,
            p.request_header_timeout,
        ),
        upstream_connect_timeout: nonzero(f.upstream_connect_timeout, p.upstream_connect_timeout),
        upstream_connect_attempts: positive(&f.upstream_connect_attempts)?,
        route_drain_timeout: f.route_drain_timeout,
        drain_timeout: f.drain_timeout,
        shutdown_delay: f.shutdown_delay,
        ready_out_of_sync_limit: f.ready_out_of_sync_limit,
        max_connections_per_listener: positive(&f.max_connections_per_listener)?,
        max_pending_connections_per_ip: usize::try_from(f.max_pending_connections_per_ip)
            .map_err(|_| "-max-pending-connections-per-ip must not be negative".to_string())?,
        buffer_size: positive(&f.buffer_size)?.clamp(1024, 1 << 20),
        splice: f.splice,
        max_streams_per_connection: u32::try_from(positive(&f.tunneling_max_concurrent_streams)?)
            .unwrap_or(u32::MAX),
        accept_proxy_protocol: f
            .accept_proxy_protocol
            .parse()
            .map_err(|e| format!("-accept-proxy-protocol: {e}"))?,
        proxy_protocol_timeout: nonzero(f.proxy_protocol_timeout, p.proxy_protocol_timeout),
        access_log: match (f.access_log.clone(), access_log_format) {
            (p, _) if p.is_empty() => None,
            (path, format) => Some(crate::relay::access_log::AccessLogConfig { path, format }),
        },
        tunnel_windows: tunnel_windows(&f, &p)?,
        tunnel_memory_budget: at_least(&f.tunneling_memory_budget, 1 << 20)?,
        tunneling_flood_penalty: f.tunneling_flood_penalty,
        sni_overflow_slow_lane: f.sni_overflow_slow_lane,
        cluster_limits: crate::relay::admission::ClusterLimits {
            max_connections: not_negative(
                f.max_connections_per_cluster,
                "-max-connections-per-cluster",
            )?,
            max_pending: not_negative(
                f.max_pending_connects_per_cluster,
                "-max-pending-connects-per-cluster",
            )?,
            max_buffered: not_negative(
                f.max_buffered_bytes_per_cluster,
                "-max-buffered-bytes-per-cluster",
            )?,
        },
    };
    if config.expose_annotation_key.is_empty() {
        return Err("-expose-annotation-key must not be empty".into());
    }
    if !config.sni_overflow_slow_lane.is_zero() && config.accept_proxy_protocol.sni {
        return Err(
            "-sni-overflow-slow-lane cannot be used with -accept-proxy-protocol=sni: the kernel \
             steers by the address that connects, which is then the load balancer's"
                .into(),
        );
    }
    let kubernetes = (kind == "kubernetes").then(|| crate::sources::kube::KubeSource {
        kubeconfig,
        namespace: config.namespace.clone(),
        expose_annotation_key: config.expose_annotation_key.clone(),
    });
    Ok(Cli {
        kubernetes,
        config,
        bind_address,
        stats_port: f.envoy_stats_port.port()?,
        admin_port: f.envoy_admin_port.port()?,
        admin_address: f
            .admin_address
            .parse()
            .map_err(|e| format!("-admin-address: {e}"))?,
        sni_port: f.envoy_sni_port.port()?,
        tunneling_port: f.envoy_tunneling_port.port()?,
        worker_threads: usize::try_from(f.worker_threads)
            .map_err(|_| "-worker-threads must not be negative".to_string())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_raw(args: &[&str]) -> Result<Cli, String> {
        let v = flag_set()
            .parse(args.iter().copied())
            .map_err(|e| e.to_string())?;
        from_values(&v)
    }

    /// With a routing source (the demo), which these tests are not about.
    fn parse(args: &[&str]) -> Result<Cli, String> {
        parse_raw(&[&["-source=demo"], args].concat())
    }

    #[test]
    fn kkp_seed_command_line_is_accepted() {
        let cli = parse(&[
            "-listen-address=:8001",
            "-envoy-node-name=kube",
            "-envoy-admin-port=9001",
            "-envoy-stats-port=8002",
            "-envoy-sni-port=6443",
            "-envoy-tunneling-port=8088",
            "-sni-listener-idle-timeout=10m",
            "-tunneling-connection-idle-timeout=0s",
            "-tunneling-stream-idle-timeout=2m",
            "-downstream-tcp-keepalive-time=30s",
            "-downstream-tcp-keepalive-interval=0s",
            "-downstream-tcp-keepalive-probes=3",
            "-upstream-tcp-keepalive-time=0s",
            "-upstream-tcp-keepalive-interval=0s",
            "-upstream-tcp-keepalive-probes=0",
            "-namespace=cluster-abc",
            "-expose-annotation-key=nodeport-proxy.k8s.io/expose-namespaced",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (cli.stats_port, cli.sni_port, cli.tunneling_port),
            (8002, 6443, 8088)
        );
        let c = &cli.config.connection;
        assert_eq!(c.sni_idle_timeout, Duration::from_secs(600));
        assert_eq!(
            c.tunneling_connection_idle_timeout,
            ConnectionSettings::default().tunneling_connection_idle_timeout
        );
        assert_eq!(c.tunneling_stream_idle_timeout, Duration::from_secs(120));
        // A partial setting is not back-filled (KKP's TestConnectionSettings).
        assert_eq!(
            c.downstream_keepalive,
            TcpKeepalive {
                time: Some(Duration::from_secs(30)),
                interval: None,
                probes: Some(3),
            }
        );
        assert!(!c.upstream_keepalive.is_set());
        assert_eq!(cli.config.namespace.as_deref(), Some("cluster-abc"));
        assert_eq!(
            cli.config.expose_annotation_key,
            "nodeport-proxy.k8s.io/expose-namespaced"
        );
    }

    #[test]
    fn unset_settings_take_envoys_defaults() {
        let cli = parse(&[]).unwrap_or_else(|e| panic!("{e}"));
        let c = &cli.config.connection;
        assert_eq!(c.sni_idle_timeout, Duration::from_secs(3600));
        assert_eq!(
            c.tunneling_connection_idle_timeout,
            Duration::from_secs(3600)
        );
        assert_eq!(c.tunneling_stream_idle_timeout, Duration::from_secs(300));
        assert!(!c.downstream_keepalive.is_set() && !c.upstream_keepalive.is_set());
        assert_eq!(cli.config.upstream_connect_timeout, Duration::from_secs(1));
        assert_eq!(cli.config.upstream_connect_attempts, 1);
        assert_eq!(cli.config.client_hello_timeout, Duration::from_secs(15));
        assert_eq!((cli.sni_port, cli.tunneling_port), (0, 0));
        // KKP's seed passes every setting as 0; that means the same.
        let zeros = parse(&[
            "-sni-listener-idle-timeout=0s",
            "-tunneling-connection-idle-timeout=0s",
            "-tunneling-stream-idle-timeout=0s",
            "-downstream-tcp-keepalive-time=0s",
            "-downstream-tcp-keepalive-interval=0s",
            "-downstream-tcp-keepalive-probes=0",
            "-upstream-tcp-keepalive-time=0s",
            "-upstream-tcp-keepalive-interval=0s",
            "-upstream-tcp-keepalive-probes=0",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(zeros.config.connection, cli.config.connection);
    }

    #[test]
    fn cluster_bounds_default_to_envoys_and_zero_turns_one_off() {
        let cli = parse(&[]).unwrap_or_else(|e| panic!("{e}"));
        let l = cli.config.cluster_limits;
        assert_eq!((l.max_connections, l.max_pending), (4096, 1024));
        assert_eq!(l.max_buffered, 16 << 20);
        let off = parse(&[
            "-max-connections-per-cluster=0",
            "-max-pending-connects-per-cluster=7",
            "-max-buffered-bytes-per-cluster=0",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let l = off.config.cluster_limits;
        assert_eq!(
            (l.max_connections, l.max_pending, l.max_buffered),
            (0, 7, 0)
        );
        let e = parse(&["-max-pending-connects-per-cluster=-1"])
            .err()
            .unwrap_or_default();
        assert!(e.contains("-max-pending-connects-per-cluster"), "{e}");
    }

    #[test]
    fn the_slow_lane_is_off_by_default_and_refused_behind_proxy_headers() {
        let cli = parse(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.config.sni_overflow_slow_lane, Duration::ZERO);
        let on = parse(&["-sni-overflow-slow-lane=30s"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(on.config.sni_overflow_slow_lane, Duration::from_secs(30));
        let Err(e) = parse(&["-sni-overflow-slow-lane=30s", "-accept-proxy-protocol=sni"]) else {
            panic!("the slow lane was taken behind PROXY headers");
        };
        assert!(e.contains("-accept-proxy-protocol=sni"), "{e}");
    }

    #[test]
    fn the_flood_penalty_defaults_to_30s_and_zero_turns_it_off() {
        let cli = parse(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.config.tunneling_flood_penalty, Duration::from_secs(30));
        let off = parse(&["-tunneling-flood-penalty=0s"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(off.config.tunneling_flood_penalty, Duration::ZERO);
    }

    #[test]
    fn rejects_sub_second_settings_and_bad_values() {
        // KKP's Seed validation: 0 or at least 1s.
        assert!(parse(&["-sni-listener-idle-timeout=500ms"]).is_err());
        assert!(parse(&["-tunneling-stream-idle-timeout=999ms"]).is_err());
        assert!(parse(&["-tunneling-stream-idle-timeout=1s"]).is_ok());
        assert!(parse(&["-upstream-tcp-keepalive-interval=10ms"]).is_err());
        assert!(parse(&["-downstream-tcp-keepalive-probes=-1"]).is_err());
        assert!(parse(&["-envoy-sni-port=70000"]).is_err());
        assert!(parse(&["-max-connections-per-listener=0"]).is_err());
        assert!(parse(&["-bind-address=nowhere"]).is_err());
        let e = parse(&["-accept-proxy-protocol=sni,http"])
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("-accept-proxy-protocol") && e.contains("\"http\""),
            "{e}"
        );
        let ok = parse(&["-accept-proxy-protocol=sni, nodeport"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            ok.config.accept_proxy_protocol,
            crate::config::AcceptProxyProtocol {
                sni: true,
                tunneling: false,
                node_ports: true
            }
        );
    }

    #[test]
    fn demo_only_by_name() {
        let demo = parse(&["-source=demo"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(demo.kubernetes.is_none());
        assert!(
            matches!(&demo.config.source, TableSource::Inline(inv) if *inv != crate::routing::model::Inventory::default()),
            "-source=demo serves the embedded table"
        );
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
            let e = parse_raw(&[]).err().unwrap_or_default();
            assert!(
                e.contains("-config=FILE") && e.contains("-source=demo"),
                "{e}"
            );
        }
    }
}
