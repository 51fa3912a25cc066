//! The `envoy_*` series nodeport-proxy and tunnel-agent both export,
//! declared once: names, label keys and types as Envoy's Prometheus output
//! spells them (KKP's dashboards read them). Each binary registers its own
//! extra series beside these, and words the HELP text for what it is (a
//! proxy's TCP connections are not an agent's), so each keeps its own.

use std::time::Instant;

use metrics::{Counter, Gauge};

use crate::metrics::Registry;

/// Envoy `server.live`.
pub const SERVER_LIVE: &str = "envoy_server_live";
/// Envoy `server.uptime`.
pub const SERVER_UPTIME: &str = "envoy_server_uptime";

/// The label of `tcp.<prefix>.*`.
pub const TCP_PREFIX_LABEL: &str = "envoy_tcp_prefix";
pub const TCP_DOWNSTREAM_CX_TOTAL: &str = "envoy_tcp_downstream_cx_total";
pub const TCP_DOWNSTREAM_CX_RX_BYTES: &str = "envoy_tcp_downstream_cx_rx_bytes_total";
pub const TCP_DOWNSTREAM_CX_TX_BYTES: &str = "envoy_tcp_downstream_cx_tx_bytes_total";

/// The label of `listener.<address>.*`.
pub const LISTENER_ADDRESS_LABEL: &str = "envoy_listener_address";
pub const LISTENER_DOWNSTREAM_CX_TOTAL: &str = "envoy_listener_downstream_cx_total";
pub const LISTENER_DOWNSTREAM_CX_ACTIVE: &str = "envoy_listener_downstream_cx_active";

/// The label of `cluster.<name>.*`.
pub const CLUSTER_NAME_LABEL: &str = "envoy_cluster_name";
pub const CLUSTER_UPSTREAM_CX_TOTAL: &str = "envoy_cluster_upstream_cx_total";
pub const CLUSTER_UPSTREAM_CX_ACTIVE: &str = "envoy_cluster_upstream_cx_active";
pub const CLUSTER_UPSTREAM_CX_CONNECT_FAIL: &str = "envoy_cluster_upstream_cx_connect_fail";
pub const CLUSTER_UPSTREAM_CX_RX_BYTES: &str = "envoy_cluster_upstream_cx_rx_bytes_total";
pub const CLUSTER_UPSTREAM_CX_TX_BYTES: &str = "envoy_cluster_upstream_cx_tx_bytes_total";
pub const CLUSTER_UPSTREAM_RQ_TOTAL: &str = "envoy_cluster_upstream_rq_total";
pub const CLUSTER_UPSTREAM_RQ_ACTIVE: &str = "envoy_cluster_upstream_rq_active";

/// Envoy `server.*`: live from the start, uptime brought up to date by
/// [`ServerStats::update`] before each scrape.
pub struct ServerStats {
    started: Instant,
    live: Gauge,
    uptime: Gauge,
}

impl ServerStats {
    /// `what` serves ("proxy", "agent"), for the HELP text.
    pub fn new(r: &Registry, what: &str) -> ServerStats {
        r.describe_gauge(SERVER_LIVE, format!("1 while the {what} is serving."));
        r.describe_gauge(SERVER_UPTIME, format!("Seconds since the {what} started."));
        let s = ServerStats {
            started: Instant::now(),
            live: r.gauge(SERVER_LIVE, &[]),
            uptime: r.gauge(SERVER_UPTIME, &[]),
        };
        s.live.set(1.0);
        s
    }

    /// `envoy_server_live`, set to 0 when shutdown begins.
    pub fn live(&self) -> Gauge {
        self.live.clone()
    }

    pub fn update(&self) {
        self.uptime.set(self.started.elapsed().as_secs() as f64);
    }
}

/// Envoy `tcp.<prefix>.*` that both binaries count.
pub struct TcpStats {
    pub downstream_cx_total: Counter,
    pub downstream_cx_rx_bytes_total: Counter,
    pub downstream_cx_tx_bytes_total: Counter,
}

/// The HELP texts of [`TcpStats`]' series, in field order.
pub struct TcpHelp {
    pub downstream_cx_total: &'static str,
    pub downstream_cx_rx_bytes_total: &'static str,
    pub downstream_cx_tx_bytes_total: &'static str,
}

impl TcpStats {
    pub fn new(r: &Registry, prefix: &str, help: TcpHelp) -> TcpStats {
        r.describe_counter(TCP_DOWNSTREAM_CX_TOTAL, help.downstream_cx_total);
        r.describe_counter(
            TCP_DOWNSTREAM_CX_RX_BYTES,
            help.downstream_cx_rx_bytes_total,
        );
        r.describe_counter(
            TCP_DOWNSTREAM_CX_TX_BYTES,
            help.downstream_cx_tx_bytes_total,
        );
        let l = [(TCP_PREFIX_LABEL, prefix)];
        TcpStats {
            downstream_cx_total: r.counter(TCP_DOWNSTREAM_CX_TOTAL, &l),
            downstream_cx_rx_bytes_total: r.counter(TCP_DOWNSTREAM_CX_RX_BYTES, &l),
            downstream_cx_tx_bytes_total: r.counter(TCP_DOWNSTREAM_CX_TX_BYTES, &l),
        }
    }
}

/// Envoy `listener.<address>.*`.
#[derive(Clone)]
pub struct ListenerStats {
    pub downstream_cx_total: Counter,
    pub downstream_cx_active: Gauge,
}

impl ListenerStats {
    /// Describes the series; once per registry, before any [`ListenerStats::new`].
    pub fn describe(r: &Registry) {
        r.describe_counter(
            LISTENER_DOWNSTREAM_CX_TOTAL,
            "Connections accepted, per listener.",
        );
        r.describe_gauge(
            LISTENER_DOWNSTREAM_CX_ACTIVE,
            "Open connections, per listener.",
        );
    }

    /// The series of the listener on `address` (the same ones for the
    /// same address).
    pub fn new(r: &Registry, address: &str) -> ListenerStats {
        let l = [(LISTENER_ADDRESS_LABEL, address)];
        ListenerStats {
            downstream_cx_total: r.counter(LISTENER_DOWNSTREAM_CX_TOTAL, &l),
            downstream_cx_active: r.gauge(LISTENER_DOWNSTREAM_CX_ACTIVE, &l),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_series_render_with_the_binarys_help() {
        let r = Registry::new();
        let server = ServerStats::new(&r, "agent");
        let tcp = TcpStats::new(
            &r,
            "tcp_stats",
            TcpHelp {
                downstream_cx_total: "Local connections accepted.",
                downstream_cx_rx_bytes_total: "rx",
                downstream_cx_tx_bytes_total: "tx",
            },
        );
        ListenerStats::describe(&r);
        let l = ListenerStats::new(&r, "127.0.0.1:80");
        ListenerStats::new(&r, "127.0.0.1:80")
            .downstream_cx_total
            .increment(1);
        l.downstream_cx_total.increment(1);
        tcp.downstream_cx_rx_bytes_total.increment(7);
        server.live().set(0.0);
        let text = r.render();
        for line in [
            "# HELP envoy_server_live 1 while the agent is serving.\n# TYPE envoy_server_live gauge\nenvoy_server_live 0\n",
            "# HELP envoy_tcp_downstream_cx_total Local connections accepted.\n",
            "envoy_tcp_downstream_cx_rx_bytes_total{envoy_tcp_prefix=\"tcp_stats\"} 7\n",
            "envoy_listener_downstream_cx_total{envoy_listener_address=\"127.0.0.1:80\"} 2\n",
            "envoy_listener_downstream_cx_active{envoy_listener_address=\"127.0.0.1:80\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
