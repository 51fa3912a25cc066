//! Konnectivity proxy server, wire-compatible with apiserver-network-proxy
//! v0.36: kube-apiserver dials through it (gRPC `Proxy` or HTTP CONNECT, on a
//! Unix socket or mTLS TCP) and agents connect out to it (`AgentService`).
//!
//! `main.rs` parses flags into a [`Config`], binds every socket, and calls
//! [`Server::run`]; tests do the same with sockets bound to port 0.

mod agents;
pub mod auth;
mod backend;
mod core;
#[cfg(test)]
mod corpus_tests;
mod frontend;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod health;
pub mod leases;
pub mod limits;
pub mod metrics;
pub mod options;
pub mod otlp;
use link::traceparent;
mod transport;
mod tunnel;

use daemon::flood_penalty::{FloodPenalty, Penalty, Source};
use link::h2flood::FloodGuard;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use daemon::drain::Drain;
use daemon::listen::{AcceptOptions, Listener, accept_loop};
use daemon::tls::reload::Reloading;
use konnectivity_proto::agent_service_server::AgentServiceServer;
use konnectivity_proto::ids::ServerId;
use konnectivity_proto::proxy_service_server::ProxyServiceServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

pub use crate::backend::Strategy;
pub use crate::core::{AGENT_LOST, CoreConfig};
pub use crate::frontend::connect_head::{ConnectAuthority, Head, HeadError, parse_head};
pub use crate::frontend::http_connect::status_for_dial_error;

use crate::agents::AgentSvc;
use crate::backend::Backends;
use crate::core::Core;
use crate::frontend::grpc::ProxySvc;
use crate::metrics::Metrics;
use crate::transport::{H2Settings, acceptor, serve_h2, tls_handshake};

/// How kube-apiserver talks to the frontend listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Grpc,
    HttpConnect,
}

/// Everything the server needs besides its sockets.
#[derive(Clone)]
pub struct Config {
    pub mode: Mode,
    /// TLS for a TCP frontend (client certificates required); `None` for a
    /// Unix socket. Reloaded when its files change, as `agent_tls` is.
    pub frontend_tls: Option<Reloading<rustls::ServerConfig>>,
    pub agent_tls: Reloading<rustls::ServerConfig>,
    pub server_id: ServerId,
    pub server_count: u32,
    pub strategies: Vec<Strategy>,
    pub core: CoreConfig,
    pub keepalive_time: Duration,
    pub keepalive_timeout: Duration,
    pub frontend_keepalive_time: Duration,
    pub graceful_shutdown_timeout: Duration,
    /// New agent connections a second at most (`--agent-accept-rate`); 0
    /// for no limit.
    pub agent_accept_rate: f64,
    /// How long a gRPC frontend client (address, or Unix socket peer
    /// process) that flooded stays slowed (`--frontend-flood-penalty`); zero
    /// for never.
    pub frontend_flood_penalty: Duration,
}

/// The frontend listener.
pub enum FrontendListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// Every socket the server serves, bound before [`Server::run`].
pub struct Listeners {
    pub frontend: FrontendListener,
    pub agent: TcpListener,
    pub health: TcpListener,
    pub admin: TcpListener,
}

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Bind(#[from] daemon::listen::BindError),
    #[error("{0}")]
    Kubernetes(#[from] auth::AuthError),
}

/// Binds every listener named by the flags.
pub async fn bind(addrs: &options::Addresses) -> Result<Listeners, ServerError> {
    use daemon::listen::{bind_tcp_for, bind_unix_for};
    let frontend = match &addrs.frontend {
        options::FrontendAddr::Unix {
            path,
            delete_existing,
        } => FrontendListener::Unix(bind_unix_for(path, *delete_existing, "--uds-name")?),
        options::FrontendAddr::Tcp { host, port } => FrontendListener::Tcp(
            bind_tcp_for(host, *port, "--server-bind-address, --server-port").await?,
        ),
    };
    let (agent, health, admin) = (&addrs.agent, &addrs.health, &addrs.admin);
    Ok(Listeners {
        frontend,
        agent: bind_tcp_for(&agent.0, agent.1, "--agent-bind-address, --agent-port").await?,
        health: bind_tcp_for(&health.0, health.1, "--health-bind-address, --health-port").await?,
        admin: bind_tcp_for(&admin.0, admin.1, "--admin-bind-address, --admin-port").await?,
    })
}

/// A running or ready-to-run server.
pub struct Server {
    config: Config,
    core: Arc<Core>,
    drain: Drain,
    kubernetes: options::Kubernetes,
    profiling: bool,
}

/// A view of a server's state, for tests and the demo.
#[derive(Clone)]
pub struct ServerHandle {
    core: Arc<Core>,
    drain: Drain,
}

impl ServerHandle {
    /// Dials waiting for the agent's DIAL_RSP.
    pub fn pending_dials(&self) -> usize {
        self.core.pending_count()
    }

    /// Connections established through agents.
    pub fn established(&self) -> usize {
        self.core.established_count()
    }

    /// Agent streams currently connected.
    pub fn agent_streams(&self) -> usize {
        self.core.backends.len()
    }

    /// Number of agents the first proxy strategy can route to; `/readyz` is
    /// OK when it is above zero.
    pub fn watch_ready(&self) -> watch::Receiver<usize> {
        self.core.backends.watch_ready()
    }

    /// Waits until `n` agent streams are connected (counted by agent id for
    /// the first strategy).
    pub async fn wait_for_agents(&self, n: usize) {
        let mut rx = self.watch_ready();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// Agent streams that negotiated per-connection flow control.
    pub fn flow_controlled_agents(&self) -> usize {
        self.core
            .backends
            .snapshot()
            .iter()
            .filter(|b| b.flow().is_some())
            .count()
    }

    /// Agent streams that sent DRAIN.
    pub fn draining_agents(&self) -> usize {
        self.core
            .backends
            .snapshot()
            .iter()
            .filter(|b| b.is_draining())
            .count()
    }

    /// Waits until `cond` holds; re-checked whenever an agent stream is added,
    /// removed or starts draining.
    pub async fn wait_until(&self, cond: impl Fn(&ServerHandle) -> bool) {
        let mut rx = self.core.backends.watch_changes();
        while !cond(self) {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Tasks still running (frontends, agent streams, accept loops).
    pub fn live_tasks(&self) -> usize {
        self.drain.live_tasks()
    }

    /// Waits until at most `n` tracked tasks are running.
    pub async fn wait_tasks_at_most(&self, n: usize) {
        self.drain.wait_tasks_at_most(n).await
    }

    /// The Prometheus exposition text.
    pub fn metrics(&self) -> String {
        self.core.metrics.render()
    }
}

impl Server {
    pub fn new(config: Config) -> Server {
        let metrics = Arc::new(Metrics::new());
        let backends = Backends::new(config.strategies.clone(), metrics.clone());
        let core = Arc::new(Core::new(backends, metrics, config.core.clone()));
        Server {
            config,
            core,
            drain: Drain::new(),
            kubernetes: options::Kubernetes::default(),
            profiling: false,
        }
    }

    /// Serves `/debug/pprof/` on the admin port (`--enable-profiling`).
    pub fn with_profiling(mut self, on: bool) -> Server {
        self.profiling = on;
        self
    }

    /// Sends a span per dial to the OTLP/HTTP receiver at `endpoint`
    /// (`--otlp-traces-endpoint`); without one nothing is traced.
    pub fn with_otlp_traces(self, endpoint: Option<otlp::Endpoint>) -> Server {
        if let Some(e) = endpoint {
            tracing::info!(endpoint = %e.authority, path = %e.path, "dials are traced (OTLP/HTTP)");
            let _ = self
                .core
                .otlp
                .set(Arc::new(otlp::Exporter::new(e, "proxy-server")));
        }
        self
    }

    /// Turns on token authentication and/or the lease controller (see
    /// [`options::kubernetes`]); both start with [`Server::run`].
    pub fn with_kubernetes(mut self, kubernetes: options::Kubernetes) -> Server {
        self.kubernetes = kubernetes;
        self
    }

    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            core: self.core.clone(),
            drain: self.drain.clone(),
        }
    }

    /// Serves until `shutdown` resolves, then drains for the configured grace
    /// period and returns.
    pub async fn run(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServerError> {
        let Server {
            config,
            core,
            drain,
            kubernetes,
            profiling,
        } = self;
        let auth = match &kubernetes.token_auth {
            Some(cfg) => {
                tracing::info!(namespace = %cfg.namespace, service_account = %cfg.service_account, audience = %cfg.audience, "agents authenticate with service account tokens (TokenReview)");
                Some(Arc::new(auth::TokenAuthenticator::from_config(cfg).await?))
            }
            None => None,
        };
        let leases = match &kubernetes.leases {
            Some(cfg) => {
                let client = auth::kube_client(cfg.kubeconfig.as_deref()).await?;
                Some(leases::LeaseController::start(
                    client,
                    cfg.clone(),
                    &config.server_id.0,
                    core.metrics.clone(),
                ))
            }
            None => None,
        };
        // The lease goes as soon as shutdown starts, so agents counting
        // leases stop looking for this server while it drains.
        let shutdown = async move {
            shutdown.await;
            if let Some(l) = leases {
                l.release().await;
            }
        };
        log_bound("agent", &listeners.agent);
        log_bound("health", &listeners.health);
        log_bound("admin", &listeners.admin);
        match &listeners.frontend {
            FrontendListener::Unix(l) => log_bound("frontend", l),
            FrontendListener::Tcp(l) => log_bound("frontend", l),
        }

        if let Some(e) = core.otlp.get() {
            e.spawn();
        }
        let registry = core.metrics.registry().clone();
        for tls in config.frontend_tls.iter().chain([&config.agent_tls]) {
            drain.spawn(
                tls.clone()
                    .follow(registry.clone(), metrics::TLS, drain.clone()),
            );
        }
        drain.spawn(daemon::endpoints::serve(
            listeners.health,
            "health",
            health::health_handler(core.clone()),
            drain.clone(),
        ));
        drain.spawn(daemon::endpoints::serve_with(
            listeners.admin,
            "admin",
            health::admin_handler(core.clone()),
            profiling,
            drain.clone(),
        ));
        drain.spawn(serve_agents(
            listeners.agent,
            &config,
            auth,
            core.clone(),
            drain.clone(),
        ));
        match listeners.frontend {
            FrontendListener::Unix(l) => {
                let path = l
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(PathBuf::from));
                drain.spawn(serve_frontend(
                    l,
                    None,
                    &config,
                    core.clone(),
                    drain.clone(),
                ));
                shutdown.await;
                finish(&drain, config.graceful_shutdown_timeout).await;
                if let Some(p) = path {
                    let _ = std::fs::remove_file(p);
                }
            }
            FrontendListener::Tcp(l) => {
                drain.spawn(serve_frontend(
                    l,
                    config.frontend_tls.clone(),
                    &config,
                    core.clone(),
                    drain.clone(),
                ));
                shutdown.await;
                finish(&drain, config.graceful_shutdown_timeout).await;
            }
        }
        Ok(())
    }
}

fn log_bound<L: Listener>(name: &str, l: &L) {
    tracing::info!(listener = name, addr = %l.local(), "listening");
}

async fn finish(drain: &Drain, grace: Duration) {
    tracing::info!(grace = %go_compat::duration::format(grace), "shutting down");
    if !drain.shutdown(grace).await && !grace.is_zero() {
        tracing::info!("grace period over; remaining tunnels were closed");
    }
}

/// The burst `--agent-accept-rate` allows, in seconds of its rate.
const AGENT_ACCEPT_BURST_SECONDS: f64 = 1.0;

fn serve_agents(
    listener: TcpListener,
    config: &Config,
    auth: Option<Arc<auth::TokenAuthenticator>>,
    core: Arc<Core>,
    drain: Drain,
) -> impl Future<Output = ()> + Send + use<> {
    let settings = transport::agent_h2(config.keepalive_time, config.keepalive_timeout, &core);
    let metrics = core.metrics.clone();
    let svc = AgentServiceServer::new(AgentSvc {
        core,
        drain: drain.clone(),
        server_id: config.server_id.clone(),
        server_count: config.server_count,
        auth,
    })
    .max_decoding_message_size(limits::MAX_GRPC_MESSAGE);
    let tls = config.agent_tls.clone();
    let d = drain.clone();
    let rate = config.agent_accept_rate;
    let options = AcceptOptions {
        rate: (rate > 0.0).then(|| {
            Arc::new(
                daemon::accept_rate::AcceptRate::new(rate, rate * AGENT_ACCEPT_BURST_SECONDS)
                    .on_wait(move |spell| {
                        metrics.agent_accept_delayed();
                        if spell {
                            tracing::warn!(
                                limit = rate,
                                "new agent connections past --agent-accept-rate wait in the listen backlog"
                            )
                        }
                    }),
            )
        }),
        ..AcceptOptions::default()
    };
    accept_loop(listener, "agent", drain, options, move |io, _, _| {
        // Each handshake takes the material in use now (it may have been reloaded).
        let (svc, settings, tls, d) = (
            svc.clone(),
            settings.clone(),
            acceptor(tls.current()),
            d.clone(),
        );
        async move {
            if let Some(io) = tls_handshake(&tls, daemon::tls::read_buffered(io)).await {
                link::h2grpc::serve(io, svc, &settings, &d).await;
            }
        }
    })
}

fn serve_frontend<L: Listener>(
    listener: L,
    tls: Option<Reloading<rustls::ServerConfig>>,
    config: &Config,
    core: Arc<Core>,
    drain: Drain,
) -> impl Future<Output = ()> + Send + use<L> {
    let mode = config.mode;
    let settings = H2Settings::frontend(config.frontend_keepalive_time);
    let penalty = (mode == Mode::Grpc && !config.frontend_flood_penalty.is_zero()).then(|| {
        Arc::new(FloodPenalty::new(Penalty {
            period: config.frontend_flood_penalty,
            rate: limits::FRONTEND_FLOOD_PENALTY_RATE,
        }))
    });
    let d = drain.clone();
    accept_loop(
        listener,
        "frontend",
        drain,
        AcceptOptions::default(),
        move |io, peer, _| {
            let source = peer.parse().ok();
            // Per connection, so each tunnel knows its frontend's address.
            let svc = ProxyServiceServer::new(ProxySvc {
                core: core.clone(),
                drain: d.clone(),
                source,
            })
            .max_decoding_message_size(limits::MAX_GRPC_MESSAGE);
            let (svc, settings, tls, d, core) = (
                svc,
                settings.clone(),
                tls.as_ref().map(|t| acceptor(t.current())),
                d.clone(),
                core.clone(),
            );
            let penalty = penalty
                .clone()
                .and_then(|p| Some((p, L::penalty_source(&io)?)));
            // Each kind's connection future is boxed (`serve_h2` boxes its
            // own): inline, every connection's task would be as large as the
            // largest kind's, whichever kind it serves (16 KiB per idle gRPC
            // tunnel; BENCHMARKS.md, P5).
            async move {
                if let Some((p, source)) = &penalty
                    && !Box::pin(admitted(p, *source, &core.metrics)).await
                {
                    return;
                }
                // A gRPC connection sent away for a flood, by the guard or by
                // h2: counted, and its client slowed.
                let flooded = {
                    let metrics = core.metrics.clone();
                    move || {
                        metrics.frontend_flooded();
                        if let Some((p, source)) = &penalty {
                            p.flag(*source);
                        }
                    }
                };
                match (mode, tls) {
                    (Mode::Grpc, None) => {
                        let io = FloodGuard::server(io).on_flood(flooded.clone());
                        let io = frontend::FixAuthority::new(frontend::HoldPreface::new(io));
                        if serve_h2(io, svc, &settings, &d).await {
                            flooded();
                        }
                    }
                    // `let … else`, not `if let`: a TLS stream (1.2 KiB)
                    // kept by the condition across the await would sit in
                    // every connection's task.
                    (Mode::Grpc, Some(tls)) => {
                        let Some(io) = Box::pin(tls_handshake(&tls, io)).await else {
                            return;
                        };
                        let io = FloodGuard::server(io).on_flood(flooded.clone());
                        let io = frontend::HoldPreface::new(io);
                        if serve_h2(io, svc, &settings, &d).await {
                            flooded();
                        }
                    }
                    (Mode::HttpConnect, None) => {
                        Box::pin(frontend::http_connect::serve_conn(core, io, source, d)).await
                    }
                    (Mode::HttpConnect, Some(tls)) => {
                        let Some(io) = Box::pin(tls_handshake(&tls, io)).await else {
                            return;
                        };
                        Box::pin(frontend::http_connect::serve_conn(core, io, source, d)).await
                    }
                }
            }
        },
    )
}

/// A new gRPC frontend connection from a client that flooded waits for its
/// turn (`--frontend-flood-penalty`); false if it is to be closed instead.
async fn admitted(p: &FloodPenalty, source: Source, metrics: &metrics::Metrics) -> bool {
    let waited = p.admit(source, |wait| {
        metrics.frontend_flood_penalty(false);
        tracing::debug!(
            ?wait,
            "client flooded recently: this connection waits for its turn"
        );
    });
    match waited.await {
        Ok(()) => true,
        Err(e) => {
            metrics.frontend_flood_penalty(true);
            tracing::debug!(error = %e, "frontend connection closed");
            false
        }
    }
}
