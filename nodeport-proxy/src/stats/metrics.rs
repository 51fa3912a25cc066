//! Every metric this crate exports, described once. Names and labels follow
//! Envoy's Prometheus output, because KKP's dashboards and federation rules
//! read those (`envoy_cluster_*` by `envoy_cluster_name`, `envoy_http_*` by
//! `envoy_http_conn_manager_prefix="ingress_http"`, `envoy_listener_*` by
//! `envoy_listener_address`); ours are prefixed `nodeport_proxy_`. The
//! `envoy_*` series tunnel-agent exports too are declared in
//! [`daemon::envoy_stats`].

use std::sync::Arc;

use std::fmt::Write as _;

use daemon::envoy_stats::{self as envoy, ServerStats, TcpHelp};
use daemon::metrics::Registry;
use metrics::{Counter, Gauge};

use crate::routing::names::ClusterName;
use crate::stats::cluster_stats::ClusterSet;
pub use crate::stats::cluster_stats::ClusterStats;

/// The tcp_proxy stat prefix KKP's NodePort and SNI chains use.
pub const TCP_PREFIX: &str = "ingress_tcp";
/// The HTTP connection manager prefix of the tunneling listener.
pub const HTTP_PREFIX: &str = "ingress_http";

pub struct Metrics {
    registry: Arc<Registry>,
    clusters: ClusterSet,
    server: ServerStats,
    pub server_live: Gauge,
    memory_allocated: Gauge,
    memory_heap: Gauge,
    pub tcp: TcpStats,
    pub http: HttpStats,
    reloads_applied: Counter,
    reloads_unchanged: Counter,
    reloads_failed: Counter,
    last_reload_success: Gauge,
    pub source_synced: Gauge,
    /// Brings `source_synced` up to date before a scrape (readiness.rs).
    sync_probe: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    pub node_ports_unbound: Gauge,
    pub node_port_bind_failures: Counter,
    pub access_log_dropped: Counter,
    /// Ours: tunneling connections sent away for a control-frame flood.
    pub tunneling_floods: Counter,
    /// Ours: new tunneling connections that waited because their address
    /// flooded (`-tunneling-flood-penalty`).
    pub flood_penalty_delayed: Counter,
    /// Ours: SNI connections taken from the slow lane, and the client
    /// addresses it holds (`-sni-overflow-slow-lane`).
    pub slow_lane_accepted: Counter,
    pub slow_lane_clients: Gauge,
    routes_node_port: Gauge,
    routes_sni: Gauge,
    routes_tunnel: Gauge,
    pub draining_routes: Gauge,
    /// Ours: the tunneling listener's HTTP/2 windows and their budget.
    windows: link::h2window::PoolGauges,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// Envoy `tcp.<prefix>.*`.
pub struct TcpStats {
    pub downstream_cx_total: Counter,
    pub downstream_cx_rx_bytes_total: Counter,
    pub downstream_cx_tx_bytes_total: Counter,
    pub downstream_cx_no_route: Counter,
    pub idle_timeout: Counter,
}

/// Envoy `http.<prefix>.*`.
pub struct HttpStats {
    pub downstream_cx_total: Counter,
    pub downstream_cx_active: Gauge,
    pub downstream_cx_http1_active: Gauge,
    pub downstream_cx_http2_active: Gauge,
    pub downstream_cx_rx_bytes_total: Counter,
    pub downstream_cx_tx_bytes_total: Counter,
    pub downstream_rq_total: Counter,
    pub downstream_rq_active: Gauge,
    pub downstream_rq_2xx: Counter,
    pub downstream_rq_4xx: Counter,
    pub downstream_rq_5xx: Counter,
    pub no_route: Counter,
    pub downstream_rq_header_timeout: Counter,
    pub downstream_cx_protocol_error: Counter,
}

/// Envoy `listener.<address>.*`, plus our rejection counter.
#[derive(Clone)]
pub struct ListenerStats {
    pub downstream_cx_total: Counter,
    pub downstream_cx_active: Gauge,
    rejected: Rejections,
}

impl ListenerStats {
    /// Counts a connection closed before it reached an upstream, by reason.
    pub fn reject(&self, reason: &'static str) {
        self.rejected.count(reason);
    }

    /// The rejection counter alone, for what outlives the rest (a third of
    /// the size).
    pub fn rejections(&self) -> Rejections {
        self.rejected.clone()
    }
}

/// A listener's `nodeport_proxy_rejected_connections_total`, by reason.
#[derive(Clone)]
pub struct Rejections(Arc<dyn Fn(&'static str) -> Counter + Send + Sync>);

impl Rejections {
    pub fn count(&self, reason: &'static str) {
        (self.0)(reason).increment(1);
    }
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let r = Registry::new();
        describe(&r);
        let server = ServerStats::new(&r, "proxy");
        let tcp = envoy::TcpStats::new(
            &r,
            TCP_PREFIX,
            TcpHelp {
                downstream_cx_total: "TCP proxy connections (NodePort and SNI).",
                downstream_cx_rx_bytes_total: "Bytes received from TCP proxy clients.",
                downstream_cx_tx_bytes_total: "Bytes sent to TCP proxy clients.",
            },
        );
        let tcp_l = [(envoy::TCP_PREFIX_LABEL, TCP_PREFIX)];
        let http_l = [("envoy_http_conn_manager_prefix", HTTP_PREFIX)];
        let class = |c: &'static str| {
            r.counter(
                "envoy_http_downstream_rq_xx",
                &[
                    ("envoy_http_conn_manager_prefix", HTTP_PREFIX),
                    ("envoy_response_code_class", c),
                ],
            )
        };
        let m = Metrics {
            windows: link::h2window::PoolGauges::new(
                &r,
                link::h2window::PoolGaugeNames {
                    stream_windows: "nodeport_proxy_tunneling_http2_stream_window_bytes",
                    connection_windows: "nodeport_proxy_tunneling_http2_connection_window_bytes",
                    held: "nodeport_proxy_tunneling_http2_held_bytes",
                    reserved: "nodeport_proxy_tunneling_memory_reserved_bytes",
                    budget: "nodeport_proxy_tunneling_memory_budget_bytes",
                },
                "-tunneling-memory-budget in bytes.",
            ),
            server_live: server.live(),
            server,
            memory_allocated: r.gauge("envoy_server_memory_allocated", &[]),
            memory_heap: r.gauge("envoy_server_memory_heap_size", &[]),
            tcp: TcpStats {
                downstream_cx_total: tcp.downstream_cx_total,
                downstream_cx_rx_bytes_total: tcp.downstream_cx_rx_bytes_total,
                downstream_cx_tx_bytes_total: tcp.downstream_cx_tx_bytes_total,
                downstream_cx_no_route: r.counter("envoy_tcp_downstream_cx_no_route", &tcp_l),
                idle_timeout: r.counter("envoy_tcp_idle_timeout", &tcp_l),
            },
            http: HttpStats {
                downstream_cx_total: r.counter("envoy_http_downstream_cx_total", &http_l),
                downstream_cx_active: r.gauge("envoy_http_downstream_cx_active", &http_l),
                downstream_cx_http1_active: r
                    .gauge("envoy_http_downstream_cx_http1_active", &http_l),
                downstream_cx_http2_active: r
                    .gauge("envoy_http_downstream_cx_http2_active", &http_l),
                downstream_cx_rx_bytes_total: r
                    .counter("envoy_http_downstream_cx_rx_bytes_total", &http_l),
                downstream_cx_tx_bytes_total: r
                    .counter("envoy_http_downstream_cx_tx_bytes_total", &http_l),
                downstream_rq_total: r.counter("envoy_http_downstream_rq_total", &http_l),
                downstream_rq_active: r.gauge("envoy_http_downstream_rq_active", &http_l),
                downstream_rq_2xx: class("2"),
                downstream_rq_4xx: class("4"),
                downstream_rq_5xx: class("5"),
                no_route: r.counter("envoy_http_no_route", &http_l),
                downstream_rq_header_timeout: r
                    .counter("envoy_http_downstream_rq_header_timeout", &http_l),
                downstream_cx_protocol_error: r
                    .counter("envoy_http_downstream_cx_protocol_error", &http_l),
            },
            reloads_applied: r.counter(
                "nodeport_proxy_table_reloads_total",
                &[("result", "applied")],
            ),
            reloads_unchanged: r.counter(
                "nodeport_proxy_table_reloads_total",
                &[("result", "unchanged")],
            ),
            reloads_failed: r.counter(
                "nodeport_proxy_table_reloads_total",
                &[("result", "failed")],
            ),
            last_reload_success: r.gauge(
                "nodeport_proxy_table_last_reload_success_timestamp_seconds",
                &[],
            ),
            source_synced: r.gauge("nodeport_proxy_source_synced", &[]),
            sync_probe: std::sync::OnceLock::new(),
            node_ports_unbound: r.gauge("nodeport_proxy_node_ports_unbound", &[]),
            node_port_bind_failures: r.counter("nodeport_proxy_node_port_bind_failures_total", &[]),
            access_log_dropped: r.counter("nodeport_proxy_access_log_dropped_total", &[]),
            tunneling_floods: r.counter("nodeport_proxy_tunneling_floods_total", &[]),
            flood_penalty_delayed: r.counter("nodeport_proxy_flood_penalty_delayed_total", &[]),
            slow_lane_accepted: r.counter("nodeport_proxy_slow_lane_accepted_total", &[]),
            slow_lane_clients: r.gauge("nodeport_proxy_slow_lane_clients", &[]),
            routes_node_port: r.gauge("nodeport_proxy_routes", &[("kind", "nodeport")]),
            routes_sni: r.gauge("nodeport_proxy_routes", &[("kind", "sni")]),
            routes_tunnel: r.gauge("nodeport_proxy_routes", &[("kind", "tunnel")]),
            draining_routes: r.gauge("nodeport_proxy_draining_routes", &[]),
            registry: Arc::new(r),
            clusters: ClusterSet::default(),
        };
        Arc::new(m)
    }

    pub fn listener(&self, address: &str) -> ListenerStats {
        let r = self.registry.clone();
        let addr = address.to_string();
        let envoy::ListenerStats {
            downstream_cx_total,
            downstream_cx_active,
        } = envoy::ListenerStats::new(&r, address);
        ListenerStats {
            downstream_cx_total,
            downstream_cx_active,
            rejected: Rejections(Arc::new(move |reason| {
                r.counter(
                    "nodeport_proxy_rejected_connections_total",
                    &[(envoy::LISTENER_ADDRESS_LABEL, &addr), ("reason", reason)],
                )
            })),
        }
    }

    /// The stats of a cluster entering the table.
    pub fn cluster(&self, name: &ClusterName) -> ClusterStats {
        self.clusters.add(name)
    }

    /// Counts a connection or CONNECT refused because its client is not in
    /// the Service's `source-ranges`; `kind`: nodeport, sni or tunnel.
    pub fn source_denied(&self, cluster: &ClusterName, kind: &'static str) {
        self.registry
            .counter(
                "nodeport_proxy_source_denied_total",
                &[
                    (envoy::CLUSTER_NAME_LABEL, cluster.as_str()),
                    ("kind", kind),
                ],
            )
            .increment(1);
    }

    /// A connection or tunnel closed (told by `/debug/connections`' close
    /// hook), by listener kind and reason.
    pub fn connection_closed(
        &self,
        kind: &'static str,
        reason: link::debug_connections::CloseReason,
    ) {
        self.registry
            .counter(
                "nodeport_proxy_connections_closed_total",
                &[("kind", kind), ("reason", reason.label())],
            )
            .increment(1);
    }

    /// Drops the series of a cluster that left the table.
    pub fn remove_cluster(&self, name: &ClusterName) {
        self.clusters.remove(name);
    }

    pub fn reload(&self, result: ReloadResult) {
        match result {
            ReloadResult::Applied => self.reloads_applied.increment(1),
            ReloadResult::Unchanged => self.reloads_unchanged.increment(1),
            ReloadResult::Failed => self.reloads_failed.increment(1),
        }
        if !matches!(result, ReloadResult::Failed) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            self.last_reload_success.set(now.as_secs_f64());
        }
    }

    pub fn routes(&self, node_ports: usize, sni: usize, tunnels: usize) {
        self.routes_node_port.set(node_ports as f64);
        self.routes_sni.set(sni as f64);
        self.routes_tunnel.set(tunnels as f64);
    }

    /// The exposition text, with the server gauges brought up to date;
    /// `used_only`: per-cluster series of clusters that never carried
    /// traffic are left out, but their membership (see cluster_stats.rs).
    /// Takes a while at seed scale: call it off the runtime's workers.
    /// Shows the tunneling connections' windows from now on.
    pub fn watch_windows(&self, pool: Arc<link::h2window::Pool>) {
        self.windows.watch(pool);
    }

    /// Runs `probe` before every scrape from now on (the first caller wins).
    pub fn watch_sync(&self, probe: impl Fn() + Send + Sync + 'static) {
        let _ = self.sync_probe.set(Box::new(probe));
    }

    pub fn render(&self, used_only: bool) -> String {
        let mut text = String::new();
        self.render_to(used_only, &mut |chunk| {
            text.push_str(&String::from_utf8_lossy(&chunk));
            true
        });
        text
    }

    /// [`Self::render`] handed to `sink` in chunks as it is written, so a
    /// scrape of every series at seed scale (100 MB and more) is never held
    /// whole; stops when `sink` refuses a chunk (the client left).
    pub fn render_to(&self, used_only: bool, sink: daemon::endpoints::Sink<'_>) {
        self.windows.update();
        if let Some(probe) = self.sync_probe.get() {
            probe();
        }
        self.server.update();
        if let Some((allocated, heap)) = daemon::process::allocator_bytes() {
            // Envoy's meaning: bytes in use, and the heap holding them.
            self.memory_allocated.set(allocated as f64);
            self.memory_heap.set(heap as f64);
        } else if let Some(rss) = resident_bytes() {
            // Without the allocator's figures, resident memory stands in.
            self.memory_allocated.set(rss as f64);
            self.memory_heap.set(rss as f64);
        }
        let mut out = daemon::endpoints::ChunkWriter::new(sink);
        let written = out
            .write_str(&self.registry.render())
            .and_then(|()| self.clusters.render(used_only, &mut out));
        if written.is_ok() {
            let _ = out.finish();
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub enum ReloadResult {
    Applied,
    Unchanged,
    Failed,
}

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn describe(r: &Registry) {
    r.describe_gauge(
        "envoy_server_memory_allocated",
        "Bytes allocated and in use (resident memory without jemalloc).",
    );
    r.describe_gauge(
        "envoy_server_memory_heap_size",
        "Bytes of the allocator's resident pages (resident memory without jemalloc).",
    );
    r.describe_counter(
        "envoy_tcp_downstream_cx_no_route",
        "TCP proxy connections that matched no route.",
    );
    r.describe_counter(
        "envoy_tcp_idle_timeout",
        "TCP proxy connections closed by the idle timeout.",
    );
    r.describe_counter(
        "envoy_http_downstream_cx_total",
        "Connections to the tunneling listener.",
    );
    r.describe_gauge(
        "envoy_http_downstream_cx_active",
        "Open connections to the tunneling listener.",
    );
    r.describe_gauge(
        "envoy_http_downstream_cx_http1_active",
        "Open HTTP/1.1 tunneling connections.",
    );
    r.describe_gauge(
        "envoy_http_downstream_cx_http2_active",
        "Open HTTP/2 tunneling connections.",
    );
    r.describe_counter(
        "envoy_http_downstream_cx_rx_bytes_total",
        "Tunneled bytes received from clients.",
    );
    r.describe_counter(
        "envoy_http_downstream_cx_tx_bytes_total",
        "Tunneled bytes sent to clients.",
    );
    r.describe_counter(
        "envoy_http_downstream_rq_total",
        "CONNECT requests (HTTP/1.1 requests and HTTP/2 streams).",
    );
    r.describe_gauge("envoy_http_downstream_rq_active", "Open CONNECT tunnels.");
    r.describe_counter(
        "envoy_http_downstream_rq_xx",
        "CONNECT responses by status class.",
    );
    r.describe_counter(
        "envoy_http_no_route",
        "CONNECT requests for an unknown authority (404).",
    );
    r.describe_counter(
        "envoy_http_downstream_rq_header_timeout",
        "Connections closed before a complete request head arrived.",
    );
    r.describe_counter(
        "envoy_http_downstream_cx_protocol_error",
        "Connections closed for a protocol error.",
    );
    envoy::ListenerStats::describe(r);
    r.describe_counter(
        "nodeport_proxy_connections_closed_total",
        "Connections and tunnels closed, by listener kind and reason (the close_cause of /debug/connections).",
    );
    r.describe_counter(
        "nodeport_proxy_table_reloads_total",
        "Routing table loads, by result.",
    );
    r.describe_gauge(
        "nodeport_proxy_table_last_reload_success_timestamp_seconds",
        "When the routing table source was last loaded successfully (Unix seconds), changed or not.",
    );
    r.describe_gauge(
        "nodeport_proxy_source_synced",
        "1 while the routing table is the source's (its first table applied, no load or watch failing since); 0 before and while out of sync.",
    );
    r.describe_gauge(
        "nodeport_proxy_node_ports_unbound",
        "Node ports in the routing table whose listener could not be bound (retried with back-off).",
    );
    r.describe_counter(
        "nodeport_proxy_node_port_bind_failures_total",
        "Failed attempts to bind a NodePort listener.",
    );
    r.describe_counter(
        "nodeport_proxy_access_log_dropped_total",
        "Access-log lines dropped because the writer fell behind (-access-log).",
    );
    r.describe_counter(
        "nodeport_proxy_tunneling_floods_total",
        "Tunneling connections closed with GOAWAY ENHANCE_YOUR_CALM for an HTTP/2 control-frame flood (each slows its client address's new connections for -tunneling-flood-penalty).",
    );
    r.describe_counter(
        "nodeport_proxy_flood_penalty_delayed_total",
        "New tunneling connections that waited for their turn because their client address flooded within -tunneling-flood-penalty.",
    );
    r.describe_counter(
        "nodeport_proxy_slow_lane_accepted_total",
        "SNI connections taken from the slow lane, where the kernel sends the new connections of client addresses refused by a cluster's bound within -sni-overflow-slow-lane.",
    );
    r.describe_gauge(
        "nodeport_proxy_slow_lane_clients",
        "Client addresses (IPv6: /64s) whose new SNI connections the kernel sends to the slow lane now (-sni-overflow-slow-lane).",
    );
    r.describe_gauge(
        "nodeport_proxy_routes",
        "Routes in the current table, by kind.",
    );
    r.describe_gauge(
        "nodeport_proxy_draining_routes",
        "Removed routes whose connections are draining.",
    );
    r.describe_counter(
        "nodeport_proxy_source_denied_total",
        "Connections and CONNECT requests refused because the client address is outside the Service's nodeport-proxy.k8s.io/source-ranges, by cluster and route kind.",
    );
    r.describe_counter(
        "nodeport_proxy_rejected_connections_total",
        "Connections closed before reaching an upstream, by reason.",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family once, its HELP and TYPE before its samples: the
    /// registry's series and the per-cluster ones are written by one path,
    /// and the series shared with tunnel-agent keep the proxy's wording.
    #[test]
    fn each_family_is_declared_once_with_the_proxys_help() {
        let m = Metrics::new();
        let c = m.cluster(&ClusterName::for_port("ns", "svc", ""));
        c.upstream_cx_total().increment(1);
        m.listener("127.0.0.1_80").reject("not_tls");
        m.source_denied(&ClusterName::for_port("ns", "svc", ""), "sni");
        let text = m.render(true);
        let mut typed = std::collections::HashSet::new();
        let mut current = "";
        for line in text.lines().filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap_or_default();
                assert!(typed.insert(name), "{name} typed twice in\n{text}");
                current = name;
            } else if !line.starts_with("# HELP ") {
                assert!(line.starts_with(current), "{line} outside {current}");
            }
        }
        for line in [
            "# HELP envoy_server_live 1 while the proxy is serving.\n",
            "# HELP envoy_tcp_downstream_cx_total TCP proxy connections (NodePort and SNI).\n",
            "# HELP envoy_listener_downstream_cx_total Connections accepted, per listener.\n",
            "# HELP envoy_cluster_upstream_cx_total Upstream connections opened.\n",
            "envoy_server_live 1\n",
            "envoy_cluster_upstream_cx_total{envoy_cluster_name=\"ns/svc\"} 1\n",
            "nodeport_proxy_rejected_connections_total{envoy_listener_address=\"127.0.0.1_80\",reason=\"not_tls\"} 1\n",
            "nodeport_proxy_source_denied_total{envoy_cluster_name=\"ns/svc\",kind=\"sni\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert_eq!(text.matches("# HELP ").count(), typed.len(), "{text}");
    }
}
