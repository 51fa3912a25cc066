//! The agent's metrics, described once; Envoy names as envoy-agent exported
//! them (`proxy_cluster` for the seed connection, `tcp_stats` for listeners).
//! The `envoy_*` series nodeport-proxy exports too are declared in
//! [`daemon::envoy_stats`].

use std::sync::Arc;

use daemon::envoy_stats::{self as envoy, ServerStats, TcpHelp};
use daemon::metrics::Registry;
use metrics::{Counter, Gauge};

pub use daemon::envoy_stats::ListenerStats;

pub const CLUSTER: &str = "proxy_cluster";
pub const TCP_PREFIX: &str = "tcp_stats";

pub struct AgentMetrics {
    registry: Arc<Registry>,
    /// Ours: the seed connection's HTTP/2 windows and their budget.
    windows: link::h2window::PoolGauges,
    server: ServerStats,
    pub live: Gauge,
    pub cx_total: Counter,
    pub cx_active: Gauge,
    pub cx_connect_fail: Counter,
    pub cx_overflow: Counter,
    pub cx_destroy_keepalive: Counter,
    pub rq_total: Counter,
    pub rq_retry: Counter,
    pub rq_active: Gauge,
    pub rq_failed: Counter,
    pub upstream_rx_bytes: Counter,
    pub upstream_tx_bytes: Counter,
    pub downstream_cx_total: Counter,
    pub downstream_rx_bytes: Counter,
    pub downstream_tx_bytes: Counter,
    /// Envoy's `server.static_unknown_fields`.
    pub static_unknown_fields: Counter,
    /// Ours: fields Envoy knows that the agent ignores, per load.
    pub static_ignored_fields: Counter,
    reloads_applied: Counter,
    reloads_unchanged: Counter,
    reloads_failed: Counter,
    last_reload_success: Gauge,
}

/// What a configuration reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    Applied,
    Unchanged,
    Failed,
}

impl AgentMetrics {
    pub fn new() -> Arc<AgentMetrics> {
        let r = Registry::new();
        let server = ServerStats::new(&r, "agent");
        let tcp = envoy::TcpStats::new(
            &r,
            TCP_PREFIX,
            TcpHelp {
                downstream_cx_total: "Local connections accepted.",
                downstream_cx_rx_bytes_total: "Bytes received from local clients.",
                downstream_cx_tx_bytes_total: "Bytes sent to local clients.",
            },
        );
        envoy::ListenerStats::describe(&r);
        r.describe_counter(
            envoy::CLUSTER_UPSTREAM_CX_TOTAL,
            "HTTP/2 connections opened to the seed proxy.",
        );
        r.describe_gauge(
            envoy::CLUSTER_UPSTREAM_CX_ACTIVE,
            "Open HTTP/2 connections to the seed proxy: 1, more while each is full of streams (up to -max-seed-connections) or while replaced ones finish their tunnels.",
        );
        r.describe_counter(
            "envoy_cluster_upstream_cx_overflow",
            "Times tunnels waited with every seed connection full and the pool at -max-seed-connections.",
        );
        r.describe_counter(
            envoy::CLUSTER_UPSTREAM_CX_CONNECT_FAIL,
            "Failed attempts to connect to the seed proxy.",
        );
        r.describe_counter(
            "envoy_cluster_upstream_cx_destroy_with_active_rq",
            "Seed connections dropped by the PING keepalive.",
        );
        r.describe_counter(envoy::CLUSTER_UPSTREAM_RQ_TOTAL, "CONNECT streams opened.");
        r.describe_counter(
            "envoy_cluster_upstream_rq_retry",
            "CONNECT streams opened again because the seed refused or did not process them (GOAWAY, REFUSED_STREAM).",
        );
        r.describe_gauge(envoy::CLUSTER_UPSTREAM_RQ_ACTIVE, "Open CONNECT streams.");
        r.describe_counter(
            "envoy_cluster_upstream_rq_pending_failure_eject",
            "Connections closed because no tunnel could be opened.",
        );
        r.describe_counter(
            envoy::CLUSTER_UPSTREAM_CX_RX_BYTES,
            "Bytes received through tunnels.",
        );
        r.describe_counter(
            envoy::CLUSTER_UPSTREAM_CX_TX_BYTES,
            "Bytes sent through tunnels.",
        );
        r.describe_counter(
            "envoy_server_static_unknown_fields",
            "Messages in the bootstrap with fields Envoy's schema does not know, counted at each load let through by --allow-unknown-static-fields (Envoy's server.static_unknown_fields).",
        );
        r.describe_counter(
            "tunnel_agent_connections_closed_total",
            "Local connections closed, by reason (the close_cause of /debug/connections).",
        );
        r.describe_counter(
            "tunnel_agent_static_ignored_fields_total",
            "Bootstrap fields Envoy's schema knows that the agent does not act on, counted at start and at each reload that loads the file.",
        );
        r.describe_counter(
            "tunnel_agent_config_reloads_total",
            "Configuration file reloads, by result (applied, unchanged, failed).",
        );
        r.describe_gauge(
            "tunnel_agent_config_last_reload_success_timestamp_seconds",
            "When the configuration in use was loaded (Unix time).",
        );
        let c = [(envoy::CLUSTER_NAME_LABEL, CLUSTER)];
        let m = AgentMetrics {
            windows: link::h2window::PoolGauges::new(
                &r,
                link::h2window::PoolGaugeNames {
                    stream_windows: "tunnel_agent_http2_stream_window_bytes",
                    connection_windows: "tunnel_agent_http2_connection_window_bytes",
                    held: "tunnel_agent_http2_held_bytes",
                    reserved: "tunnel_agent_memory_reserved_bytes",
                    budget: "tunnel_agent_memory_budget_bytes",
                },
                "Twice -connection-budget, shared by every seed connection, in bytes.",
            ),
            live: server.live(),
            server,
            cx_total: r.counter(envoy::CLUSTER_UPSTREAM_CX_TOTAL, &c),
            cx_active: r.gauge(envoy::CLUSTER_UPSTREAM_CX_ACTIVE, &c),
            cx_connect_fail: r.counter(envoy::CLUSTER_UPSTREAM_CX_CONNECT_FAIL, &c),
            cx_overflow: r.counter("envoy_cluster_upstream_cx_overflow", &c),
            cx_destroy_keepalive: r.counter("envoy_cluster_upstream_cx_destroy_with_active_rq", &c),
            rq_total: r.counter(envoy::CLUSTER_UPSTREAM_RQ_TOTAL, &c),
            rq_retry: r.counter("envoy_cluster_upstream_rq_retry", &c),
            rq_active: r.gauge(envoy::CLUSTER_UPSTREAM_RQ_ACTIVE, &c),
            rq_failed: r.counter("envoy_cluster_upstream_rq_pending_failure_eject", &c),
            upstream_rx_bytes: r.counter(envoy::CLUSTER_UPSTREAM_CX_RX_BYTES, &c),
            upstream_tx_bytes: r.counter(envoy::CLUSTER_UPSTREAM_CX_TX_BYTES, &c),
            downstream_cx_total: tcp.downstream_cx_total,
            downstream_rx_bytes: tcp.downstream_cx_rx_bytes_total,
            downstream_tx_bytes: tcp.downstream_cx_tx_bytes_total,
            static_unknown_fields: r.counter("envoy_server_static_unknown_fields", &[]),
            static_ignored_fields: r.counter("tunnel_agent_static_ignored_fields_total", &[]),
            reloads_applied: r.counter(
                "tunnel_agent_config_reloads_total",
                &[("result", "applied")],
            ),
            reloads_unchanged: r.counter(
                "tunnel_agent_config_reloads_total",
                &[("result", "unchanged")],
            ),
            reloads_failed: r.counter("tunnel_agent_config_reloads_total", &[("result", "failed")]),
            last_reload_success: r.gauge(
                "tunnel_agent_config_last_reload_success_timestamp_seconds",
                &[],
            ),
            registry: Arc::new(r),
        };
        m.loaded_now();
        Arc::new(m)
    }

    /// A local connection closed (told by `/debug/connections`' close
    /// hook), by reason.
    pub fn connection_closed(
        &self,
        kind: &'static str,
        reason: link::debug_connections::CloseReason,
    ) {
        self.registry
            .counter(
                "tunnel_agent_connections_closed_total",
                &[("kind", kind), ("reason", reason.label())],
            )
            .increment(1);
    }

    pub fn listener(&self, address: &str) -> ListenerStats {
        ListenerStats::new(&self.registry, address)
    }

    pub fn reload(&self, result: ReloadResult) {
        match result {
            ReloadResult::Applied => self.reloads_applied.increment(1),
            ReloadResult::Unchanged => self.reloads_unchanged.increment(1),
            ReloadResult::Failed => self.reloads_failed.increment(1),
        }
        if result != ReloadResult::Failed {
            self.loaded_now();
        }
    }

    fn loaded_now(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.last_reload_success.set(now);
    }

    /// Shows the seed connections' windows from now on.
    pub fn watch_windows(&self, pool: Arc<link::h2window::Pool>) {
        self.windows.watch(pool);
    }

    pub fn render(&self) -> String {
        self.windows.update();
        self.server.update();
        self.registry.render()
    }
}

impl link::relay::Tally for AgentMetrics {
    fn client_bytes(&self, n: u64) {
        self.downstream_rx_bytes.increment(n);
        self.upstream_tx_bytes.increment(n);
    }

    fn upstream_bytes(&self, n: u64) {
        self.upstream_rx_bytes.increment(n);
        self.downstream_tx_bytes.increment(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family once with HELP and TYPE, the series shared with
    /// nodeport-proxy in the agent's wording.
    #[test]
    fn each_family_is_declared_once_with_the_agents_help() {
        let m = AgentMetrics::new();
        m.listener("127.0.0.1_6443")
            .downstream_cx_total
            .increment(1);
        link::relay::Tally::client_bytes(&*m, 5);
        let text = m.render();
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let unique: std::collections::HashSet<&&str> = types.iter().collect();
        assert_eq!(types.len(), unique.len(), "{text}");
        assert_eq!(text.matches("# HELP ").count(), types.len(), "{text}");
        for line in [
            "# HELP envoy_server_live 1 while the agent is serving.\n",
            "# HELP envoy_server_uptime Seconds since the agent started.\n",
            "# HELP envoy_tcp_downstream_cx_total Local connections accepted.\n",
            "envoy_tcp_downstream_cx_rx_bytes_total{envoy_tcp_prefix=\"tcp_stats\"} 5\n",
            "envoy_cluster_upstream_cx_tx_bytes_total{envoy_cluster_name=\"proxy_cluster\"} 5\n",
            "envoy_listener_downstream_cx_total{envoy_listener_address=\"127.0.0.1_6443\"} 1\n",
            "envoy_server_live 1\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
