//! The part every listener shares once a route is chosen: connect upstream,
//! replay what the client already sent, relay until either side ends, the
//! connection idles out, its route expires after removal, or the process
//! stops. An endpoint leaving its cluster ends nothing (Envoy keeps such
//! connections too).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use daemon::drain::Drain;
use link::debug_connections::{Both, Connections, Tracked};
use link::duplex::{Duplex, Plain};
use link::relay::{RelayBytes, RelayEnd, RelayOptions, Tally, relay};
use metrics::{Counter, Gauge};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::access_log::Access;
use crate::config::ProxyConfig;
use crate::metrics::Metrics;
use crate::store::TableStore;
use crate::table::Route;
use crate::upstream::ConnectOptions;

/// What every connection handler needs.
pub struct Shared {
    pub config: ProxyConfig,
    pub health: Arc<crate::health::Health>,
    pub table: Arc<TableStore>,
    pub metrics: Arc<Metrics>,
    pub drain: Drain,
    pub connect: ConnectOptions,
    /// `-access-log`; `None` when off.
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// What `/debug/connections` on the admin port lists.
    pub connections: Connections,
    /// The budget and totals of the tunneling connections' HTTP/2 windows.
    pub windows: Arc<link::h2window::Pool>,
}

/// The client as allow-lists, logs and upstreams see it: the connection's
/// own addresses, or those a PROXY protocol header named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Downstream {
    pub source: SocketAddr,
    pub local: SocketAddr,
}

impl Downstream {
    /// The connection's addresses, then, when the listener expects a PROXY
    /// header, the header's (read within the PROXY timeout), with the bytes
    /// the client sent after it.
    pub async fn of(
        client: &TcpStream,
        expect_proxy_header: bool,
        shared: &Shared,
    ) -> Result<(Downstream, Vec<u8>), crate::proxy_protocol::ProxyHeaderError> {
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        let mut d = Downstream {
            source: client.peer_addr().unwrap_or(unspecified),
            local: client.local_addr().unwrap_or(unspecified),
        };
        if !expect_proxy_header {
            return Ok((d, Vec::new()));
        }
        let got = crate::proxy_protocol::read(client, shared.config.proxy_protocol_timeout).await?;
        if let Some((source, local)) = got.header.addresses {
            d = Downstream { source, local };
        }
        // The per-IP limit counts the client, not the load balancer.
        daemon::listen::attribute(d.source.ip());
        Ok((d, got.rest))
    }

    /// Whether `route`'s Service admits this client; counts and logs a
    /// refusal (`kind`: nodeport, sni or tunnel).
    pub fn admitted(&self, route: &Route, shared: &Shared, kind: &'static str) -> bool {
        if route.cluster.admits(self.source.ip()) {
            return true;
        }
        shared.metrics.source_denied(&route.cluster.name, kind);
        tracing::info!(
            client = %self.source,
            route = %route.key,
            cluster = %route.cluster.name,
            "refused: client address not in the Service's {}",
            crate::policy::SOURCE_RANGES_ANNOTATION_KEY
        );
        false
    }
}

/// Increments a gauge now and decrements it when dropped.
pub struct Active(Gauge);

impl Active {
    pub fn new(g: &Gauge) -> Self {
        g.increment(1.0);
        Active(g.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Byte counts to the downstream (listener-kind) and cluster counters.
pub struct ByteCounters {
    pub downstream_rx: Counter,
    pub downstream_tx: Counter,
    pub upstream_tx: Counter,
    pub upstream_rx: Counter,
}

impl Tally for ByteCounters {
    fn client_bytes(&self, n: u64) {
        self.downstream_rx.increment(n);
        self.upstream_tx.increment(n);
    }

    fn upstream_bytes(&self, n: u64) {
        self.upstream_rx.increment(n);
        self.downstream_tx.increment(n);
    }
}

/// Relays `client` and `upstream` (already connected to `endpoint`) after
/// writing `early` (bytes the client sent while the route was chosen, given
/// up once written).
#[allow(clippy::too_many_arguments)]
pub async fn forward<C>(
    client: C,
    early: Bytes,
    route: &Route,
    downstream: &Downstream,
    conn: &Tracked,
    mut upstream: TcpStream,
    endpoint: std::net::SocketAddr,
    idle: Duration,
    bytes: &ByteCounters,
    shared: &Shared,
    access: &mut Access,
) -> RelayEnd
where
    C: Duplex,
{
    let _active = Active::new(&route.cluster.stats.upstream_cx_active());
    access.cluster(route.cluster.name.as_str());
    access.upstream(endpoint);
    conn.set_upstream(endpoint);
    conn.set("cluster", &route.cluster.name);
    conn.set_state("established");
    if route.cluster.upstream_proxy_protocol() {
        let header = crate::proxy_protocol::v2_header(downstream.source, downstream.local);
        if let Err(e) = upstream.write_all(&header).await {
            let end = RelayEnd::UpstreamError(e);
            conn.set_close_reason(end.reason());
            access.ended(&end, RelayBytes::default());
            return end;
        }
    }
    let early_len = early.len() as u64;
    if !early.is_empty() {
        if let Err(e) = upstream.write_all(&early).await {
            let end = RelayEnd::UpstreamError(e);
            conn.set_close_reason(end.reason());
            access.ended(&end, RelayBytes::default());
            return end;
        }
        bytes.client_bytes(early_len);
        conn.client_bytes(early_len);
    }
    drop(early);
    let options = RelayOptions {
        buffer_size: shared.config.buffer_size,
        idle_timeout: Some(idle).filter(|d| !d.is_zero()),
    };
    let stop = async {
        tokio::select! {
            _ = route.life.expired() => {}
            _ = shared.drain.stopping() => {}
        }
    };
    let (end, moved) = relay(client, Plain(upstream), options, &Both(bytes, conn), stop).await;
    conn.set_close_reason(end.reason());
    tracing::debug!(
        route = %route.key,
        upstream = %endpoint,
        reason = end.reason(),
        from_client = moved.from_client,
        from_upstream = moved.from_upstream,
        "connection closed"
    );
    access.ended(
        &end,
        RelayBytes {
            from_client: moved.from_client + early_len,
            from_upstream: moved.from_upstream,
        },
    );
    end
}

#[cfg(test)]
pub(crate) fn test_shared() -> Arc<Shared> {
    let config = ProxyConfig::default();
    let metrics = Metrics::new();
    let drain = Drain::new();
    let table = Arc::new(TableStore::new(
        crate::plan::PlanOptions::default(),
        config.drain_timeout,
        drain.clone(),
        metrics.clone(),
    ));
    Arc::new(Shared {
        health: Arc::new(crate::health::Health::new(
            table.subscribe(),
            Arc::new(crate::readiness::Readiness::new(
                table.subscribe(),
                crate::readiness::SourceSync::new(),
                config.ready_out_of_sync_limit,
                config.source.describe(),
            )),
        )),
        connect: ConnectOptions {
            timeout: config.upstream_connect_timeout,
            attempts: config.upstream_connect_attempts,
            keepalive: config.connection.upstream_keepalive,
        },
        windows: link::h2window::Pool::new(config.tunnel_memory_budget),
        config,
        table,
        metrics,
        drain,
        access_log: None,
        connections: Connections::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a connection that has not sent its first byte costs in task
    /// state: a listener holds up to -max-connections-per-listener of them.
    #[tokio::test]
    async fn a_silent_connection_is_a_small_task() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let shared = test_shared();
        let stats = shared.metrics.listener("test");
        let sni = crate::sni::handle(
            TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            shared.clone(),
            stats.clone(),
        );
        let tl = Arc::new(crate::tunnel::TunnelListener {
            shared: shared.clone(),
            stats,
            tunnels: Arc::new(tokio::sync::Semaphore::new(1)),
        });
        let tunnel = crate::tunnel::handle(
            TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            tl,
        );
        let (sni, tunnel) = (size_of_val(&sni), size_of_val(&tunnel));
        eprintln!("SNI {sni} bytes, tunneling {tunnel} bytes");
        assert!(sni <= 1024, "SNI connection future: {sni} bytes");
        assert!(
            tunnel <= 1024,
            "tunneling connection future: {tunnel} bytes"
        );
    }
}
