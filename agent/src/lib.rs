//! Konnectivity proxy agent, wire-compatible with apiserver-network-proxy
//! v0.36: connects out to every proxy server, dials destinations on their
//! behalf and moves the bytes.
//!
//! `main.rs` parses flags into a [`Config`], binds the health and admin
//! ports and calls [`Agent::run`]; tests do the same with port 0.
//!
//! The server side, then the destination side:
//! - `servers/`: where the proxy servers are and how many to hold streams
//!   to (the count the servers announce, or Leases with
//!   `--count-server-leases`);
//! - `clientset`: keeps one stream to each server, reconnecting with
//!   back-off; `connect`: one connection attempt (TCP or through an egress
//!   proxy, TLS, HTTP/2);
//! - `session`: one agent stream, its packets in and out, flow control;
//! - `dial/`: which destinations may be dialed (`policy`), dialing them,
//!   and one task per destination connection (`endpoint`).

mod clientset;
pub mod connect;
#[cfg(test)]
mod corpus_tests;
pub mod dial;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod health;
#[cfg(test)]
mod legacy_tests;
pub mod limits;
pub mod metrics;
pub mod options;
mod otlp;
pub mod servers;
mod session;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use daemon::drain::Drain;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use crate::clientset::SyncConfig;
pub use crate::connect::Connector;
pub use crate::session::SessionConfig;

use crate::clientset::ClientSet;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct Config {
    pub connector: Connector,
    pub sync: SyncConfig,
    pub session: SessionConfig,
}

/// The agent's sockets, bound before [`Agent::run`].
pub struct Listeners {
    pub health: TcpListener,
    pub admin: TcpListener,
}

pub struct Agent {
    config: Config,
    metrics: Arc<Metrics>,
    clients: Arc<ClientSet>,
    drain: Drain,
    lease_counting: Option<servers::leases::LeaseCounting>,
    profiling: bool,
}

/// A view of a running agent, for tests and the demo.
#[derive(Clone)]
pub struct AgentHandle {
    clients: Arc<ClientSet>,
    metrics: Arc<Metrics>,
    drain: Drain,
}

impl AgentHandle {
    /// Servers this agent holds a stream to.
    pub fn connected_servers(&self) -> usize {
        self.clients.connected()
    }

    pub fn watch_connected(&self) -> watch::Receiver<usize> {
        self.clients.watch_connected()
    }

    /// Waits until the agent holds streams to `n` servers.
    pub async fn wait_connected(&self, n: usize) {
        let mut rx = self.watch_connected();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// Open destination connections across all streams.
    pub fn open_connections(&self) -> usize {
        self.clients
            .sessions()
            .iter()
            .map(|s| s.connections())
            .sum()
    }

    /// The flow-control window negotiated with each connected server
    /// (`None`: an upstream server, no flow control).
    pub fn flow_windows(&self) -> Vec<Option<i64>> {
        self.clients
            .sessions()
            .iter()
            .map(|s| s.flow_max())
            .collect()
    }

    /// Dials in progress across all streams.
    pub fn pending_dials(&self) -> usize {
        self.clients
            .sessions()
            .iter()
            .map(|s| s.pending_dials())
            .sum()
    }

    pub fn live_tasks(&self) -> usize {
        self.drain.live_tasks()
    }

    /// Resolves once no destination connection and no dial is left on any
    /// stream. Only shutdown waits on it, so it looks every 50 ms rather
    /// than taking a notification on every connection's path.
    pub async fn idle(&self) {
        while self.open_connections() + self.pending_dials() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Resolves once this agent holds no stream to any server and no
    /// connection or dial is left on any: nobody can reach it any more.
    /// While it holds a stream, a server may still route a dial to it (a
    /// draining agent is the last resort when no other agent serves the
    /// destination, as upstream's server does).
    pub async fn unreachable(&self) {
        let mut streams = self.watch_connected();
        loop {
            let _ = streams.wait_for(|n| *n == 0).await;
            self.idle().await;
            if self.connected_servers() == 0 {
                return;
            }
        }
    }

    /// Waits until at most `n` tracked tasks are running.
    pub async fn wait_tasks_at_most(&self, n: usize) {
        self.drain.wait_tasks_at_most(n).await
    }

    pub fn metrics(&self) -> String {
        self.metrics.render()
    }
}

/// Binds the health and admin ports named by the flags.
pub async fn bind(addrs: &options::Addresses) -> Result<Listeners, daemon::listen::BindError> {
    use daemon::listen::bind_tcp_for;
    let (health, admin) = (&addrs.health, &addrs.admin);
    Ok(Listeners {
        health: bind_tcp_for(
            &health.0,
            health.1,
            "--health-server-host, --health-server-port",
        )
        .await?,
        admin: bind_tcp_for(
            &admin.0,
            admin.1,
            "--admin-bind-address, --admin-server-port",
        )
        .await?,
    })
}

impl Agent {
    pub fn new(config: Config) -> Agent {
        let metrics = Arc::new(Metrics::new());
        metrics.watch_flow(config.session.flow.clone());
        let drain = Drain::new();
        let clients = ClientSet::new(metrics.clone(), config.session.clone(), drain.clone());
        Agent {
            config,
            metrics,
            clients,
            drain,
            lease_counting: None,
            profiling: false,
        }
    }

    /// Serves `/debug/pprof/` on the admin port (`--enable-profiling`).
    pub fn with_profiling(mut self, on: bool) -> Agent {
        self.profiling = on;
        self
    }

    /// Takes the number of servers from their Leases (`--count-server-leases`).
    pub fn with_lease_counting(
        mut self,
        counting: Option<servers::leases::LeaseCounting>,
    ) -> Agent {
        self.lease_counting = counting;
        self
    }

    pub fn handle(&self) -> AgentHandle {
        AgentHandle {
            clients: self.clients.clone(),
            metrics: self.metrics.clone(),
            drain: self.drain.clone(),
        }
    }

    /// Runs until `stop` resolves. When `drain` resolves first, the agent
    /// stops connecting to new servers and sends DRAIN on every stream, but
    /// keeps serving the connections it has.
    pub async fn run(
        self,
        listeners: Listeners,
        drain: impl Future<Output = ()>,
        stop: impl Future<Output = ()>,
    ) {
        let Agent {
            config,
            metrics,
            clients,
            drain: tasks,
            lease_counting,
            profiling,
        } = self;
        if let Some(e) = &config.session.otlp {
            e.spawn();
        }
        let stop_counting = tokio_util::sync::CancellationToken::new();
        if let Some(counting) = lease_counting {
            tracing::info!(namespace = %counting.namespace, selector = %counting.selector, "counting proxy servers by their leases");
            let count = servers::leases::LeaseCount::new(counting.max_with_header);
            clients.count_leases(count.clone());
            tasks.spawn(servers::leases::run(
                counting,
                count,
                metrics.clone(),
                stop_counting.clone(),
            ));
        }
        for (name, l) in [("health", &listeners.health), ("admin", &listeners.admin)] {
            tracing::info!(listener = name, addr = %daemon::listen::Listener::local(l), "listening");
        }
        // The redirect names the address the health listener got (its port
        // is not the flag's value when that is 0).
        let health_addr = listeners
            .health
            .local_addr()
            .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        tasks.spawn(config.connector.tls.clone().follow(
            metrics.registry().clone(),
            metrics::TLS,
            tasks.clone(),
        ));
        tasks.spawn(daemon::endpoints::serve(
            listeners.health,
            "health",
            health::health_handler(clients.clone(), metrics.clone()),
            tasks.clone(),
        ));
        tasks.spawn(daemon::endpoints::serve_with(
            listeners.admin,
            "admin",
            health::admin_handler(health_addr, clients.debug.clone()),
            profiling,
            tasks.clone(),
        ));
        tasks.spawn(
            clients
                .clone()
                .sync(config.connector.clone(), config.sync.clone()),
        );

        tokio::pin!(drain, stop);
        let stopped_first = tokio::select! {
            // A `stop` that follows the drain signal must not skip the DRAIN.
            biased;
            _ = &mut drain => false,
            _ = &mut stop => true,
        };
        // `drain` and `stop` may wait on the same signal, which another
        // worker can deliver between the two polls above: a `stop` that won
        // that race still owes the servers the DRAIN the signal asked for.
        if !stopped_first || futures::FutureExt::now_or_never(&mut drain).is_some() {
            tracing::info!(
                "draining: no new servers; telling connected servers to route new dials elsewhere"
            );
            clients.drain_all().await;
        }
        if !stopped_first {
            stop.await;
        }
        tracing::info!("stopping");
        stop_counting.cancel();
        clients.close_all();
        tasks.shutdown(Duration::ZERO).await;
    }
}
