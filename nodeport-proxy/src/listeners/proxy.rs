//! One proxy instance: loads the table, serves every listener, follows the
//! source, and shuts down in KKP's intended order (fail health, keep serving
//! briefly, stop accepting, drain, exit).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use daemon::drain::Drain;
use daemon::listen::{AcceptOptions, Slots, accept_loop};
use metrics::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, watch};

use crate::config::ProxyConfig;
use crate::health::Health;
use crate::health::readiness::{Readiness, SourceSync};
use crate::listeners::tunnel_open::TunnelListener;
use crate::relay::session::Shared;
use crate::relay::upstream::ConnectOptions;
use crate::routing::model::Inventory;
use crate::routing::plan::PlanOptions;
use crate::routing::store::{Change, TableStatus, TableStore};
use crate::routing::table::RoutingTable;
use crate::sources::source::{self, SourceError};
use crate::stats::metrics::{ListenerStats, Metrics};

/// Sockets bound by the caller (port 0 in tests, flags in the binary). A
/// listener left `None` is disabled, like KKP's port 0; for SNI and tunneling
/// that also means their routes are not built.
#[derive(Debug, Default)]
pub struct Listeners {
    pub stats: Option<TcpListener>,
    /// `/debug/connections` (Envoy's admin port, on loopback).
    pub admin: Option<TcpListener>,
    pub sni: Option<TcpListener>,
    /// The SNI listener's slow lane (`-sni-overflow-slow-lane`), bound
    /// with it by `daemon::slow_lane::bind`.
    pub sni_slow_lane: Option<daemon::slow_lane::SlowLane>,
    pub tunneling: Option<TcpListener>,
    /// Used for the node ports they are bound to; other node ports are bound
    /// on `node_port_bind_address` when they appear in the table.
    pub node_ports: Vec<TcpListener>,
}

/// Where the fixed listeners ended up.
#[derive(Debug, Clone, Copy, Default)]
pub struct BoundAddrs {
    pub stats: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub sni: Option<SocketAddr>,
    pub tunneling: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    // Not `#[from]`: the cause is already in the message, and a chain
    // printed with `{:#}` would say it twice.
    #[error("initial routing table: {0}")]
    Source(SourceError),
    #[error("listener: {0}")]
    Listener(#[from] std::io::Error),
    #[error(
        "-sni-overflow-slow-lane is on, but the SNI listener was not bound with its slow lane (daemon::slow_lane::bind)"
    )]
    NoSlowLane,
    #[error("-access-log {path}: {source}")]
    AccessLog {
        path: String,
        source: std::io::Error,
    },
}

pub struct NodePortProxy {
    shared: Arc<Shared>,
    /// What a Kubernetes source reports about its watches.
    sync: Arc<SourceSync>,
    reload: Arc<Notify>,
    stats_drain: Drain,
    addrs: BoundAddrs,
}

fn listener_address(l: &TcpListener) -> String {
    l.local_addr()
        .map(|a| format!("{}_{}", a.ip(), a.port()))
        .unwrap_or_default()
}

/// Lets flagged addresses whose period has passed back onto the SNI
/// listener, until the drain starts; `clients` follows how many are left.
async fn prune_every_second(
    steering: Arc<daemon::slow_lane::Steering>,
    clients: Gauge,
    drain: Drain,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = drain.draining() => return,
            _ = tick.tick() => {
                steering.prune();
                clients.set(steering.flagged() as f64);
            }
        }
    }
}

impl NodePortProxy {
    /// Loads the table (failing if the source is unreadable at start), then
    /// serves every listener in the background.
    pub async fn start(config: ProxyConfig, listeners: Listeners) -> Result<Self, ProxyError> {
        let metrics = Metrics::new();
        let drain = Drain::new();
        let options = PlanOptions {
            expose_annotation_key: config.expose_annotation_key.clone(),
            namespace: config.namespace.clone().filter(|n| !n.is_empty()),
            sni: listeners.sni.is_some(),
            tunneling: listeners.tunneling.is_some(),
        };
        let store = Arc::new(TableStore::new(
            options,
            config.route_drain_timeout,
            drain.clone(),
            metrics.clone(),
        ));
        tokio::spawn(store.clone().expire_when_stopping());
        let (follower, first) = source::Follower::start(config.source.clone());
        // At seed scale the first table takes a while: not on a worker.
        if let Some(loaded) = first.map_err(ProxyError::Source)? {
            let s = store.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || loaded.apply(&s)).await {
                return Err(ProxyError::Listener(std::io::Error::other(e)));
            }
        }
        let addrs = BoundAddrs {
            stats: listeners.stats.as_ref().and_then(|l| l.local_addr().ok()),
            admin: listeners.admin.as_ref().and_then(|l| l.local_addr().ok()),
            sni: listeners.sni.as_ref().and_then(|l| l.local_addr().ok()),
            tunneling: listeners
                .tunneling
                .as_ref()
                .and_then(|l| l.local_addr().ok()),
        };
        // No lane without the flag, nor without an SNI listener (port 0).
        let lane = match (
            listeners.sni_slow_lane,
            config.sni_overflow_slow_lane.is_zero() || listeners.sni.is_none(),
        ) {
            (_, true) => None,
            (None, false) => return Err(ProxyError::NoSlowLane),
            (Some(lane), false) => Some(lane),
        };
        let sync = SourceSync::new();
        let readiness = Arc::new(Readiness::new(
            store.subscribe(),
            sync.clone(),
            config.ready_out_of_sync_limit,
            config.source.describe(),
        ));
        metrics.watch_sync(crate::health::readiness::gauge_probe(
            readiness.clone(),
            metrics.source_synced.clone(),
        ));
        let health = Arc::new(Health::new(store.subscribe(), readiness));
        let access_log = match &config.access_log {
            None => None,
            Some(c) => Some(
                crate::relay::access_log::AccessLog::open(c, metrics.access_log_dropped.clone())
                    .map_err(|source| ProxyError::AccessLog {
                        path: c.path.clone(),
                        source,
                    })?,
            ),
        };
        let shared = Arc::new(Shared {
            access_log,
            health: health.clone(),
            connect: ConnectOptions {
                timeout: config.upstream_connect_timeout,
                attempts: config.upstream_connect_attempts,
                keepalive: config.connection.upstream_keepalive,
            },
            slow_lane: lane.as_ref().map(|l| l.steering.clone()),
            windows: {
                let pool = link::h2window::Pool::new(config.tunnel_memory_budget);
                metrics.watch_windows(pool.clone());
                pool
            },
            config,
            table: store,
            metrics: metrics.clone(),
            drain: drain.clone(),
            connections: {
                let c = link::debug_connections::Connections::new();
                let m = metrics.clone();
                c.on_close(move |kind, reason, _| m.connection_closed(kind, reason));
                c
            },
        });
        let stats_drain = Drain::new();
        if let Some(l) = listeners.admin {
            tracing::info!(addr = ?addrs.admin, "serving /debug/connections");
            let connections = shared.connections.clone();
            let handler: daemon::endpoints::Handler = Arc::new(move |head| match head.path {
                "/debug/connections" => connections.reply_local(head),
                _ => daemon::endpoints::Reply::not_found(),
            });
            tokio::spawn(daemon::endpoints::serve(
                l,
                "admin",
                handler,
                stats_drain.clone(),
            ));
        }
        if let Some(l) = listeners.stats {
            tracing::info!(addr = ?addrs.stats, "serving stats and health");
            tokio::spawn(crate::stats::run(
                l,
                metrics.clone(),
                health,
                stats_drain.clone(),
            ));
        }
        let reload = Arc::new(Notify::new());
        tokio::spawn(follower.run(shared.table.clone(), reload.clone(), drain.clone()));
        tokio::spawn(crate::listeners::node_port::manage(
            shared.clone(),
            listeners.node_ports,
        ));
        // When full, a newcomer closes the oldest connection that has not
        // sent its ClientHello or request head yet (a flood of half-open
        // connections cannot keep clients out), not itself.
        // Behind a load balancer sending PROXY headers the per-IP limit
        // counts the header's client (`forward::Downstream::of`).
        let limit = |stats: &ListenerStats, proxy_header: bool| {
            let stats = stats.clone();
            AcceptOptions {
                shed_oldest: Some(Slots::with(
                    shared.config.max_connections_per_listener,
                    Some(shared.config.max_pending_connections_per_ip),
                    Some(Box::new(move || stats.reject("shed_unrouted"))),
                )),
                source_named_later: proxy_header,
                ..AcceptOptions::default()
            }
        };
        if let Some(l) = listeners.sni {
            tracing::info!(addr = ?addrs.sni, "serving SNI listener");
            let stats = metrics.listener(&listener_address(&l));
            let options = limit(&stats, shared.config.accept_proxy_protocol.sni);
            let handler = {
                let s = shared.clone();
                move |io: TcpStream, peer: String, permit| {
                    let (s, stats) = (s.clone(), stats.clone());
                    async move {
                        let _permit = permit;
                        crate::listeners::sni::handle(io, peer.parse().ok(), s, stats).await;
                    }
                }
            };
            if let Some(lane) = lane {
                // The lane shares the listener's connection limit, and takes
                // its connections at a rate of its own.
                let m = metrics.clone();
                let lane_options = AcceptOptions {
                    rate: Some(Arc::new(daemon::accept_rate::AcceptRate::new(
                        crate::limits::SLOW_LANE_RATE,
                        1.0,
                    ))),
                    ..options.clone()
                };
                let h = handler.clone();
                tokio::spawn(accept_loop(
                    lane.listener,
                    "sni-slow-lane",
                    drain.clone(),
                    lane_options,
                    move |io: TcpStream, peer: String, permit| {
                        m.slow_lane_accepted.increment(1);
                        h(io, peer, permit)
                    },
                ));
                tokio::spawn(prune_every_second(
                    lane.steering,
                    metrics.slow_lane_clients.clone(),
                    drain.clone(),
                ));
            }
            tokio::spawn(accept_loop(l, "sni", drain.clone(), options, handler));
        }
        if let Some(l) = listeners.tunneling {
            tracing::info!(addr = ?addrs.tunneling, "serving tunneling listener");
            let stats = metrics.listener(&listener_address(&l));
            let options = limit(&stats, shared.config.accept_proxy_protocol.tunneling);
            let tl = Arc::new(TunnelListener {
                shared: shared.clone(),
                stats,
                tunnels: Arc::new(Semaphore::new(shared.config.max_connections_per_listener)),
                penalty: (!shared.config.tunneling_flood_penalty.is_zero()).then(|| {
                    Arc::new(daemon::flood_penalty::FloodPenalty::new(
                        daemon::flood_penalty::Penalty {
                            period: shared.config.tunneling_flood_penalty,
                            rate: crate::limits::FLOOD_PENALTY_RATE,
                        },
                    ))
                }),
            });
            tokio::spawn(accept_loop(
                l,
                "tunneling",
                drain.clone(),
                options,
                move |io: TcpStream, _, permit| {
                    let tl = tl.clone();
                    async move {
                        let _permit = permit;
                        crate::listeners::tunnel::handle(io, tl).await;
                    }
                },
            ));
        }
        Ok(NodePortProxy {
            shared,
            sync,
            reload,
            stats_drain,
            addrs,
        })
    }

    pub fn addrs(&self) -> BoundAddrs {
        self.addrs
    }

    /// The table being served now.
    pub fn table(&self) -> Arc<RoutingTable> {
        self.shared.table.current()
    }

    /// Where a Kubernetes source reports its watches' failures and
    /// recoveries (`kube::follow`, `kube::watch_client`).
    pub fn source_sync(&self) -> Arc<SourceSync> {
        self.sync.clone()
    }

    /// What `/ready` answers now: whether it is 200, and the body.
    pub fn ready(&self) -> (bool, String) {
        self.shared.health.ready()
    }

    /// Table version and load results, updated on every load attempt.
    pub fn status(&self) -> watch::Receiver<TableStatus> {
        self.shared.table.subscribe()
    }

    /// Re-reads the source (what SIGHUP does).
    pub fn reload(&self) {
        self.reload.notify_one();
    }

    /// Makes the table serve exactly `inventory`, on the calling thread
    /// (tests, embedding; large inventories want [`Self::apply_changes`]'s
    /// blocking thread).
    pub fn apply(&self, inventory: &Inventory) -> bool {
        self.shared.table.apply(inventory)
    }

    /// Applies individual changes (a Kubernetes watch's) on a blocking
    /// thread, off the runtime's workers. Resolves to whether the table
    /// changed.
    pub fn apply_changes(
        &self,
        changes: Vec<Change>,
    ) -> impl Future<Output = bool> + Send + 'static {
        let store = self.shared.table.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                // A (re)list's batch: the decoded objects and the list's
                // names are free once it is applied; back to the OS now, as
                // after a file load, not after jemalloc's 10 s decay.
                let large = changes.len() >= crate::limits::PURGE_AFTER_CHANGES;
                let changed = store.apply_changes(changes);
                if large {
                    daemon::process::purge_freed_memory();
                }
                changed
            })
            .await
            .unwrap_or(false)
        }
    }

    pub fn metrics_text(&self) -> String {
        self.shared.metrics.render(false)
    }

    /// Tracked connections and tunnels still running.
    pub fn live_connections(&self) -> usize {
        self.shared.drain.live_tasks()
    }

    /// Fails `/healthz`, keeps serving for the shutdown delay, stops
    /// accepting, gives connections the drain timeout, then stops the rest.
    /// Returns whether every connection ended within the drain timeout.
    pub async fn shutdown(&self) -> bool {
        self.shared.health.failing.store(true, Ordering::Relaxed);
        tracing::info!(delay = ?self.shared.config.shutdown_delay, "health failing; still serving");
        tokio::time::sleep(self.shared.config.shutdown_delay).await;
        tracing::info!("stopped accepting; draining connections");
        let clean = self
            .shared
            .drain
            .shutdown(self.shared.config.drain_timeout)
            .await;
        self.shared.metrics.server_live.set(0.0);
        self.stats_drain.start();
        tracing::info!(clean, "shut down");
        clean
    }
}

/// Serves until `shutdown` resolves, then shuts down gracefully.
pub async fn run(
    config: ProxyConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ProxyError> {
    let proxy = NodePortProxy::start(config, listeners).await?;
    shutdown.await;
    proxy.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::config::TableSource;
    use crate::routing::model::*;

    fn tunneled(name: &str, echo: SocketAddr) -> (Service, EndpointSlice) {
        let svc = Service {
            metadata: ObjectMeta {
                namespace: "ns".into(),
                name: name.into(),
                annotations: [(
                    crate::routing::expose::DEFAULT_EXPOSE_ANNOTATION_KEY.to_string(),
                    "Tunneling".to_string(),
                )]
                .into(),
                ..ObjectMeta::default()
            },
            spec: ServiceSpec {
                ports: vec![ServicePort {
                    name: "tcp".into(),
                    port: 7000,
                    ..ServicePort::default()
                }],
                ..ServiceSpec::default()
            },
        };
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                namespace: "ns".into(),
                name: format!("{name}-1"),
                labels: [(SERVICE_NAME_LABEL.to_string(), name.to_string())].into(),
                ..ObjectMeta::default()
            },
            ports: vec![EndpointPort {
                name: Some("tcp".into()),
                port: Some(echo.port()),
                protocol: Protocol::Tcp,
            }],
            endpoints: vec![Endpoint {
                addresses: vec![echo.ip()],
                conditions: EndpointConditions { ready: Some(true) },
            }],
        };
        (svc, slice)
    }

    /// The slow lane is required only where there is an SNI listener.
    #[tokio::test]
    async fn the_slow_lane_needs_the_sni_listener_to_come_with_it() {
        let config = ProxyConfig {
            sni_overflow_slow_lane: Duration::from_secs(30),
            ..ProxyConfig::default()
        };
        let no_sni = NodePortProxy::start(config.clone(), Listeners::default()).await;
        assert!(no_sni.is_ok(), "no SNI listener, no lane needed");
        let sni = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let alone = Listeners {
            sni: Some(sni),
            ..Listeners::default()
        };
        let Err(e) = NodePortProxy::start(config, alone).await else {
            panic!("an SNI listener without its lane was taken");
        };
        assert!(e.to_string().contains("-sni-overflow-slow-lane"), "{e}");
    }

    /// With a single runtime worker (a one-CPU pod), a connection that
    /// arrives while a table is being rebuilt is served: the rebuild runs on
    /// a blocking thread. Here the rebuild is held until the connection has
    /// been served; if it ran on the worker, nothing would be.
    #[test]
    fn a_connection_is_served_during_a_slow_rebuild_on_one_worker() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(async {
            let echo = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let echo_addr = echo.local_addr().unwrap_or_else(|e| panic!("{e}"));
            tokio::spawn(async move {
                while let Ok((mut s, _)) = echo.accept().await {
                    tokio::spawn(async move {
                        let (mut r, mut w) = s.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                    });
                }
            });
            let (svc, slice) = tunneled("echo", echo_addr);
            let config = ProxyConfig {
                source: TableSource::Inline(Inventory {
                    services: vec![svc],
                    endpoint_slices: vec![slice],
                }),
                ..ProxyConfig::default()
            };
            let tunnel = TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let addr = tunnel.local_addr().unwrap_or_else(|e| panic!("{e}"));
            let proxy = NodePortProxy::start(
                config,
                Listeners {
                    tunneling: Some(tunnel),
                    ..Listeners::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            let (started_tx, started) = mpsc::channel::<()>();
            let (release, released) = mpsc::channel::<()>();
            let released = parking_lot::Mutex::new(released);
            *proxy.shared.table.before_apply.lock() = Some(Box::new(move || {
                let _ = started_tx.send(());
                let _ = released.lock().recv_timeout(Duration::from_secs(30));
            }));
            let version = proxy.table().version;
            proxy.reload();
            // The rebuild has begun and is held.
            let started =
                tokio::task::spawn_blocking(move || started.recv_timeout(Duration::from_secs(30)));
            assert!(
                matches!(started.await, Ok(Ok(()))),
                "the rebuild never started"
            );
            let served = tokio::time::timeout(Duration::from_secs(10), async {
                let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
                s.write_all(b"CONNECT echo.ns.svc.cluster.local:7000 HTTP/1.1\r\n\r\n")
                    .await
                    .ok()?;
                let mut head = [0u8; 19];
                s.read_exact(&mut head).await.ok()?;
                s.write_all(b"ping").await.ok()?;
                let mut back = [0u8; 4];
                s.read_exact(&mut back).await.ok()?;
                Some((head, back))
            })
            .await;
            let _ = release.send(());
            let (head, back) = served
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("no connection was served while the table was rebuilt"));
            assert_eq!(&head, b"HTTP/1.1 200 OK\r\n\r\n");
            assert_eq!(&back, b"ping");
            // The rebuild then completes (it changed nothing: same version).
            let mut status = proxy.status();
            let loads = status.borrow().loads;
            let _ = tokio::time::timeout(
                Duration::from_secs(30),
                status.wait_for(|s| s.loads > loads),
            )
            .await;
            assert_eq!(proxy.table().version, version);
        });
    }
}

/// What a silent connection costs each listener kind.
#[cfg(test)]
mod task_size {
    use super::*;
    use crate::relay::session::test_shared;

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
        let sni = crate::listeners::sni::handle(
            TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            None,
            shared.clone(),
            stats.clone(),
        );
        let tl = Arc::new(TunnelListener {
            shared: shared.clone(),
            stats,
            tunnels: Arc::new(tokio::sync::Semaphore::new(1)),
            penalty: None,
        });
        let tunnel = crate::listeners::tunnel::handle(
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
