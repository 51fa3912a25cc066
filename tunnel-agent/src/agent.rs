//! The agent: local listeners whose connections become CONNECT streams on the
//! shared seed connection, plus health and stats.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use daemon::authority::ConnectAuthority;
use daemon::drain::Drain;
use daemon::endpoints::{Handler, Reply};
use daemon::h2io::H2Io;
use daemon::listen::{AcceptOptions, accept_loop};
use daemon::relay::{RelayOptions, relay};
use http::{Method, Request, StatusCode};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::config::{AgentConfig, ConfigError};
use crate::metrics::{AgentMetrics, ListenerStats};
use crate::seed::{self, Current};

/// Sockets for the agent. `tunnels` match `config.listeners` by position; when
/// empty the agent binds each listener's own address.
#[derive(Debug, Default)]
pub struct AgentListeners {
    pub tunnels: Vec<TcpListener>,
    pub stats: Option<TcpListener>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
enum TunnelError {
    #[error("no connection to the seed proxy within {0:?}")]
    NoSeed(std::time::Duration),
    #[error("upstream: opening the CONNECT stream: {0}")]
    Open(h2::Error),
    #[error("upstream: no CONNECT answer within {0:?}")]
    AnswerTimeout(std::time::Duration),
    #[error("upstream: CONNECT stream failed: {0}")]
    Answer(h2::Error),
    #[error("upstream: seed proxy answered {0} for {1}")]
    Refused(StatusCode, ConnectAuthority),
}

pub struct TunnelAgent {
    config: Arc<AgentConfig>,
    drain: Drain,
    stats_drain: Drain,
    failing: Arc<AtomicBool>,
    connected: Current,
    metrics: Arc<AgentMetrics>,
    addrs: Vec<SocketAddr>,
}

struct Ctx {
    config: Arc<AgentConfig>,
    metrics: Arc<AgentMetrics>,
    current: Current,
    drain: Drain,
}

impl TunnelAgent {
    pub async fn start(config: AgentConfig, listeners: AgentListeners) -> Result<Self, AgentError> {
        config.validate()?;
        let config = Arc::new(config);
        let mut tunnels = listeners.tunnels;
        if tunnels.is_empty() {
            for l in &config.listeners {
                let addr = SocketAddr::new(l.bind_address, l.bind_port);
                let bound = daemon::listen::bind_tcp(&l.bind_address.to_string(), l.bind_port)
                    .await
                    .map_err(|source| AgentError::Bind { addr, source })?;
                tunnels.push(bound);
            }
        }
        if tunnels.len() != config.listeners.len() {
            return Err(ConfigError::Invalid(format!(
                "{} listeners configured but {} sockets given",
                config.listeners.len(),
                tunnels.len()
            ))
            .into());
        }
        let metrics = AgentMetrics::new();
        let drain = Drain::new();
        let stats_drain = Drain::new();
        let failing = Arc::new(AtomicBool::new(false));
        let (tx, current) = watch::channel(None);
        tokio::spawn(seed::maintain(
            config.clone(),
            tx,
            metrics.clone(),
            drain.clone(),
        ));
        tokio::spawn(metrics.registry().run_upkeep(stats_drain.clone()));
        if let Some(l) = listeners.stats {
            let (m, f, c) = (metrics.clone(), failing.clone(), current.clone());
            let handler: Handler = Arc::new(move |head| match head.path {
                "/healthz" if f.load(Ordering::Relaxed) => {
                    Reply::text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
                }
                "/healthz" => Reply::ok(),
                "/ready" if c.borrow().is_some() => Reply::ok(),
                "/ready" => Reply::text(StatusCode::SERVICE_UNAVAILABLE, "not connected\n"),
                "/stats/prometheus" | "/stats" | "/metrics" => Reply::metrics(m.render()),
                _ => Reply::not_found(),
            });
            tokio::spawn(daemon::endpoints::serve(
                l,
                "stats",
                handler,
                stats_drain.clone(),
            ));
        }
        let ctx = Arc::new(Ctx {
            config: config.clone(),
            metrics: metrics.clone(),
            current: current.clone(),
            drain: drain.clone(),
        });
        let mut addrs = Vec::new();
        for (spec, l) in config.listeners.iter().zip(tunnels) {
            let local = l.local_addr().ok();
            addrs.extend(local);
            let name = local
                .map(|a| format!("{}_{}", a.ip(), a.port()))
                .unwrap_or_default();
            let stats = metrics.listener(&name);
            let addr = local.map(|a| a.to_string()).unwrap_or_default();
            tracing::info!(addr = %addr, authority = %spec.authority, "tunneling listener");
            let options = AcceptOptions {
                max_connections: Some(Arc::new(Semaphore::new(
                    config.max_connections_per_listener,
                ))),
                ..AcceptOptions::default()
            };
            let (ctx, authority) = (ctx.clone(), spec.authority.clone());
            tokio::spawn(accept_loop(
                l,
                "tunnel",
                drain.clone(),
                options,
                move |io: TcpStream, _, permit| {
                    let (ctx, authority, stats) = (ctx.clone(), authority.clone(), stats.clone());
                    async move {
                        let _permit = permit;
                        handle(io, &authority, &ctx, &stats).await;
                    }
                },
            ));
        }
        Ok(TunnelAgent {
            config,
            drain,
            stats_drain,
            failing,
            connected: current,
            metrics,
            addrs,
        })
    }

    /// Where the tunnel listeners are bound, in configuration order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Resolves once the shared connection to the seed proxy is up.
    pub async fn connected(&self) {
        let mut c = self.connected.clone();
        let _ = c.wait_for(Option::is_some).await;
    }

    pub fn is_connected(&self) -> bool {
        self.connected.borrow().is_some()
    }

    pub fn metrics_text(&self) -> String {
        self.metrics.render()
    }

    /// Fails health, stops accepting, lets tunnels finish within the drain
    /// timeout, then closes the seed connection.
    pub async fn shutdown(&self) -> bool {
        self.failing.store(true, Ordering::Relaxed);
        let clean = self.drain.shutdown(self.config.drain_timeout).await;
        self.metrics.live.set(0.0);
        self.stats_drain.start();
        clean
    }
}

async fn handle(client: TcpStream, authority: &ConnectAuthority, ctx: &Ctx, stats: &ListenerStats) {
    stats.downstream_cx_total.increment(1);
    stats.downstream_cx_active.increment(1.0);
    ctx.metrics.downstream_cx_total.increment(1);
    if let Err(e) = tunnel(client, authority, ctx).await {
        ctx.metrics.rq_failed.increment(1);
        tracing::warn!(%authority, error = %e, "local connection closed");
    }
    stats.downstream_cx_active.decrement(1.0);
}

async fn tunnel(
    client: TcpStream,
    authority: &ConnectAuthority,
    ctx: &Ctx,
) -> Result<(), TunnelError> {
    let timeout = ctx.config.connect_timeout;
    let mut current = ctx.current.clone();
    let mut send = seed::ready(&mut current, timeout)
        .await
        .ok_or(TunnelError::NoSeed(timeout))?;
    let mut req = Request::new(());
    *req.method_mut() = Method::CONNECT;
    *req.uri_mut() = http::Uri::try_from(authority.to_string())
        .map_err(|_| TunnelError::Refused(StatusCode::BAD_REQUEST, authority.clone()))?;
    let (answer, stream) = send.send_request(req, false).map_err(TunnelError::Open)?;
    ctx.metrics.rq_total.increment(1);
    let resp = tokio::time::timeout(timeout, answer)
        .await
        .map_err(|_| TunnelError::AnswerTimeout(timeout))?
        .map_err(TunnelError::Answer)?;
    if resp.status() != StatusCode::OK {
        return Err(TunnelError::Refused(resp.status(), authority.clone()));
    }
    ctx.metrics.rq_active.increment(1.0);
    let io = H2Io::new(stream, resp.into_body());
    let options = RelayOptions {
        buffer_size: ctx.config.buffer_size,
        idle_timeout: Some(ctx.config.idle_timeout).filter(|d| !d.is_zero()),
    };
    let (end, bytes) = relay(
        client,
        io,
        options,
        ctx.metrics.as_ref(),
        ctx.drain.stopping(),
    )
    .await;
    ctx.metrics.rq_active.decrement(1.0);
    tracing::debug!(%authority, reason = end.reason(), from_client = bytes.from_client, from_upstream = bytes.from_upstream, "tunnel closed");
    Ok(())
}

/// Serves until `shutdown` resolves, then shuts down gracefully.
pub async fn run(
    config: AgentConfig,
    listeners: AgentListeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let agent = TunnelAgent::start(config, listeners).await?;
    shutdown.await;
    agent.shutdown().await;
    Ok(())
}
