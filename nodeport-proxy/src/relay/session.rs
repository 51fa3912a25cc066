//! The part every listener shares: [`Shared`], the client as [`Downstream`],
//! and the [`Session`] a listener builds once a route is chosen, which
//! carries the connection through admission, the upstream connect and the
//! relay (replay what the client already sent, relay until either side
//! ends, the connection idles out, its route expires after removal, or the
//! process stops). An endpoint leaving its cluster ends nothing (Envoy keeps
//! such connections too).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use daemon::drain::Drain;
use link::debug_connections::{Both, Connections, Tracked};
use link::duplex::{Duplex, Plain};
use link::relay::{RelayBytes, RelayEnd, RelayOptions, Tally, relay};
use metrics::{Counter, Gauge};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::config::ProxyConfig;
use crate::relay::access_log::Access;
use crate::relay::admission::Metered;
use crate::relay::upstream::{ConnectOptions, UpstreamError};
use crate::routing::store::TableStore;
use crate::routing::table::Route;
use crate::stats::metrics::Metrics;

/// What every connection handler needs.
pub struct Shared {
    pub config: ProxyConfig,
    pub health: Arc<crate::health::Health>,
    pub table: Arc<TableStore>,
    pub metrics: Arc<Metrics>,
    pub drain: Drain,
    pub connect: ConnectOptions,
    /// `-access-log`; `None` when off.
    pub access_log: Option<Arc<crate::relay::access_log::AccessLog>>,
    /// What `/debug/connections` on the admin port lists.
    pub connections: Connections,
    /// The budget and totals of the tunneling connections' HTTP/2 windows.
    pub windows: Arc<link::h2window::Pool>,
    /// Where an SNI client refused by a cluster's bound is flagged
    /// (`-sni-overflow-slow-lane`); `None` when off.
    pub slow_lane: Option<Arc<daemon::slow_lane::Steering>>,
}

/// The client as allow-lists, logs and upstreams see it: the connection's
/// own addresses, or those a PROXY protocol header named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Downstream {
    pub source: SocketAddr,
    pub local: SocketAddr,
}

impl Downstream {
    /// The connection's addresses (`peer` as the accept returned it, when
    /// it did: one `getpeername` fewer per connection), then, when the
    /// listener expects a PROXY header, the header's (read within the PROXY
    /// timeout), with the bytes the client sent after it.
    pub async fn of(
        client: &TcpStream,
        peer: Option<SocketAddr>,
        expect_proxy_header: bool,
        shared: &Shared,
    ) -> Result<(Downstream, Vec<u8>), crate::relay::proxy_protocol::ProxyHeaderError> {
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        let mut d = Downstream {
            source: peer
                .or_else(|| client.peer_addr().ok())
                .unwrap_or(unspecified),
            local: client.local_addr().unwrap_or(unspecified),
        };
        if !expect_proxy_header {
            return Ok((d, Vec::new()));
        }
        let got = crate::relay::proxy_protocol::read(client, shared.config.proxy_protocol_timeout)
            .await?;
        if let Some((source, local)) = got.header.addresses {
            d = Downstream { source, local };
        }
        // The per-IP limit counts the client, not the load balancer.
        daemon::listen::attribute(d.source.ip());
        Ok((d, got.rest))
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

/// Which listener a connection came in on: it picks the downstream counters,
/// the idle timeout and the label of a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    NodePort,
    Sni,
    /// A CONNECT tunnel, over HTTP/1.1 or an HTTP/2 stream.
    Tunnel,
}

impl Listener {
    /// The `kind` label of a refusal.
    fn label(self) -> &'static str {
        match self {
            Listener::NodePort => "nodeport",
            Listener::Sni => "sni",
            Listener::Tunnel => "tunnel",
        }
    }
}

/// The upstream side once connected.
pub struct Upstream {
    pub stream: TcpStream,
    pub endpoint: SocketAddr,
    /// Its place in the cluster's circuit breakers, held until it closes.
    pub slot: crate::relay::admission::Slot,
}

/// One routed connection (or CONNECT stream): what its listener gathered
/// (the client as [`Downstream`], the route, the access-log record) carried
/// through admission, the upstream connect and the relay. A listener builds
/// it once the route is known and hands it on.
pub struct Session<'a> {
    pub shared: &'a Shared,
    pub listener: Listener,
    pub downstream: Downstream,
    pub route: Arc<Route>,
    /// What `/debug/connections` shows of it.
    pub conn: &'a Tracked,
    pub access: &'a mut Access,
}

impl Session<'_> {
    /// Whether the route's Service admits this client; counts and logs a
    /// refusal.
    pub fn admitted(&self) -> bool {
        let route = &self.route;
        if route.cluster.admits(self.downstream.source.ip()) {
            return true;
        }
        self.shared
            .metrics
            .source_denied(&route.cluster.name, self.listener.label());
        tracing::info!(
            client = %self.downstream.source,
            route = %route.key,
            cluster = %route.cluster.name,
            "refused: client address not in the Service's {}",
            crate::routing::policy::SOURCE_RANGES_ANNOTATION_KEY
        );
        false
    }

    /// Connects to the route's cluster if its circuit breakers admit one
    /// more connection holding `early` bytes meanwhile. A tunnel counts the
    /// request and its connect time; a plain TCP connection that finds no
    /// upstream has its access-log line say so.
    pub async fn connect(&mut self, early: usize) -> Result<Upstream, UpstreamError> {
        let cluster = &self.route.cluster;
        let tunnel = self.listener == Listener::Tunnel;
        if tunnel {
            cluster.stats.upstream_rq_total().increment(1);
        }
        let started = std::time::Instant::now();
        let limits = &self.shared.config.cluster_limits;
        let admitted =
            crate::relay::admission::admit(&cluster.stats, limits, early).map_err(|bound| {
                UpstreamError::Overflow {
                    cluster: cluster.name.to_string(),
                    bound,
                }
            });
        let connected = match admitted {
            Ok(mut slot) => {
                let c = crate::relay::upstream::connect(cluster, &self.shared.connect).await;
                slot.connected();
                c.map(|c| (c, slot))
            }
            Err(e) => Err(e),
        };
        match connected {
            Ok(((stream, endpoint), slot)) => {
                if tunnel {
                    cluster
                        .stats
                        .upstream_rq_time()
                        .record(started.elapsed().as_secs_f64() * 1000.0);
                }
                Ok(Upstream {
                    stream,
                    endpoint,
                    slot,
                })
            }
            Err(e) => {
                if !tunnel {
                    self.access.cluster(cluster.name.as_str());
                    self.access.answer(0, e.flags(), e.reason());
                }
                Err(e)
            }
        }
    }

    /// Relays `client` and `upstream` after writing `early` (bytes the client
    /// sent while the route was chosen, given up once written), until either
    /// side ends, the connection idles out, its route expires after removal,
    /// or the process stops.
    ///
    /// Not an `async fn`: one keeps its parameters twice (as passed and as
    /// moved into its body) for the connection's life, and a held idle
    /// connection's task is mostly this future (`node_port.rs` asserts its
    /// size).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its parameters twice"
    )]
    pub fn relay<C>(
        &mut self,
        client: C,
        early: Bytes,
        mut upstream: Upstream,
    ) -> impl Future<Output = RelayEnd> + '_
    where
        C: Duplex + 'static,
    {
        async move {
            let shared = self.shared;
            let route = &*self.route;
            let conn = self.conn;
            let stats = &route.cluster.stats;
            let tunnel = self.listener == Listener::Tunnel;
            let (downstream_rx, downstream_tx, idle) = match self.listener {
                Listener::NodePort => (
                    &shared.metrics.tcp.downstream_cx_rx_bytes_total,
                    &shared.metrics.tcp.downstream_cx_tx_bytes_total,
                    shared.config.node_port_idle_timeout,
                ),
                Listener::Sni => (
                    &shared.metrics.tcp.downstream_cx_rx_bytes_total,
                    &shared.metrics.tcp.downstream_cx_tx_bytes_total,
                    shared.config.connection.sni_idle_timeout,
                ),
                Listener::Tunnel => (
                    &shared.metrics.http.downstream_cx_rx_bytes_total,
                    &shared.metrics.http.downstream_cx_tx_bytes_total,
                    shared.config.connection.tunneling_stream_idle_timeout,
                ),
            };
            let bytes = ByteCounters {
                downstream_rx: downstream_rx.clone(),
                downstream_tx: downstream_tx.clone(),
                upstream_tx: stats.upstream_cx_tx_bytes_total(),
                upstream_rx: stats.upstream_cx_rx_bytes_total(),
            };
            let access = &mut *self.access;
            let _active = Active::new(&stats.upstream_cx_active());
            access.cluster(route.cluster.name.as_str());
            access.upstream(upstream.endpoint);
            conn.set_upstream(upstream.endpoint);
            conn.set("cluster", &route.cluster.name);
            conn.set_state("established");
            if route.cluster.upstream_proxy_protocol() {
                let header = crate::relay::proxy_protocol::v2_header(
                    self.downstream.source,
                    self.downstream.local,
                );
                if let Err(e) = upstream.stream.write_all(&header).await {
                    let end = RelayEnd::UpstreamError(e);
                    conn.set_close((&end).into(), end.reason());
                    access.ended(&end, RelayBytes::default());
                    return end;
                }
            }
            let early_len = early.len() as u64;
            if !early.is_empty() {
                if let Err(e) = upstream.stream.write_all(&early).await {
                    let end = RelayEnd::UpstreamError(e);
                    conn.set_close((&end).into(), end.reason());
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
            // Pinned here and lent to the relay, which would otherwise keep a
            // second copy of it for the connection's life. The route's
            // lifetime alone: every route expires when the process stops
            // (`TableStore::expire_when_stopping`).
            let mut stop = std::pin::pin!(route.life.expired());
            let tally = Both(&bytes, conn);
            // NodePort and SNI bytes go kernel to kernel when both ends are
            // plain TCP; tunnels (HTTP/2 streams, TLS) keep the copying relay.
            // A spliced connection holds its bytes in its pipes (at most one
            // pipe's worth a direction, in the kernel), not in buffers of ours:
            // only the copying relay's count against the cluster's byte budget.
            let mut client = Some(client);
            let spliced = (shared.config.splice && !tunnel)
                .then(|| link::splice::take_tcp(&mut client))
                .flatten();
            let (end, moved) = if let Some(tcp) = spliced {
                let pipes = &link::splice::PIPES;
                link::splice::relay(tcp, upstream.stream, options, &tally, pipes, stop.as_mut())
                    .await
            } else if let Some(client) = client.take() {
                let meter = upstream.slot.meter();
                let (client, upstream) = (
                    Metered::client(client, &meter),
                    Metered::upstream(Plain(upstream.stream), &meter),
                );
                // Boxed: the task keeps one relay's state for its life, and
                // NodePort's default path is the spliced one (its task size
                // is asserted in listeners/node_port.rs).
                Box::pin(relay(client, upstream, options, &tally, stop.as_mut())).await
            } else {
                // take_tcp empties `client` only when it returns the stream.
                (RelayEnd::Closed, RelayBytes::default())
            };
            drop(upstream.slot);
            conn.set_close((&end).into(), end.reason());
            tracing::debug!(
                route = %route.key,
                upstream = %upstream.endpoint,
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
            if !tunnel && matches!(end, RelayEnd::Idle) {
                shared.metrics.tcp.idle_timeout.increment(1);
            }
            end
        }
    }
}

#[cfg(test)]
pub(crate) fn test_shared() -> Arc<Shared> {
    let config = ProxyConfig::default();
    let metrics = Metrics::new();
    let drain = Drain::new();
    let table = Arc::new(TableStore::new(
        crate::routing::plan::PlanOptions::default(),
        config.drain_timeout,
        drain.clone(),
        metrics.clone(),
    ));
    Arc::new(Shared {
        health: Arc::new(crate::health::Health::new(
            table.subscribe(),
            Arc::new(crate::health::readiness::Readiness::new(
                table.subscribe(),
                crate::health::readiness::SourceSync::new(),
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
        slow_lane: None,
    })
}
