//! The agent: local listeners whose connections become CONNECT streams on the
//! shared seed connection, plus health and stats. A new configuration is
//! applied without a restart: listeners that appear are bound, listeners that
//! go stop accepting (their tunnels run on), a changed authority applies to
//! new connections, a changed seed gets a new connection.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use daemon::authority::ConnectAuthority;
use daemon::drain::Drain;
use daemon::endpoints::{Handler, Reply};
use daemon::listen::{AcceptOptions, accept_loop};
use http::{Method, Request, StatusCode};
use link::debug_connections::{Both, CloseReason, Connections, Tracked};
use link::duplex::Plain;
use link::h2io::H2Io;
use link::relay::{RelayOptions, relay};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{AgentConfig, ConfigError, ListenerSpec};
use crate::metrics::{AgentMetrics, ListenerStats};
use crate::seed::{self, Lease, SeedPool};

/// Sockets for the agent. `tunnels` match `config.listeners` by position; when
/// empty the agent binds each listener's own address.
#[derive(Debug, Default)]
pub struct AgentListeners {
    pub tunnels: Vec<TcpListener>,
    pub stats: Option<TcpListener>,
    /// `/debug/connections`.
    pub admin: Option<TcpListener>,
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
    #[error("no connection to the seed proxy with room for another tunnel within {0:?}")]
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

impl TunnelError {
    /// Why the local connection ends, as counted.
    fn cause(&self) -> CloseReason {
        match self {
            TunnelError::NoSeed(_) => CloseReason::Overloaded,
            TunnelError::Open(_) | TunnelError::Answer(_) => CloseReason::UpstreamLost,
            TunnelError::AnswerTimeout(_) => CloseReason::DialTimeout,
            TunnelError::Refused(..) => CloseReason::DialRefused,
        }
    }

    /// Whether the seed left the stream unprocessed, so that opening it
    /// again is safe: `Some(true)` when the connection is going away
    /// (GOAWAY), `Some(false)` when only the stream was refused.
    fn unprocessed(&self) -> Option<bool> {
        let (Self::Open(e) | Self::Answer(e)) = self else {
            return None;
        };
        if e.is_go_away() && e.is_remote() {
            Some(true)
        } else if e.is_remote() && e.reason() == Some(h2::Reason::REFUSED_STREAM) {
            Some(false)
        } else {
            None
        }
    }
}

/// One running tunnel listener.
struct Running {
    authority: watch::Sender<ConnectAuthority>,
    stop: CancellationToken,
}

struct Inner {
    config: watch::Sender<Arc<AgentConfig>>,
    metrics: Arc<AgentMetrics>,
    pool: Arc<SeedPool>,
    drain: Drain,
    /// By configured address.
    listeners: tokio::sync::Mutex<BTreeMap<SocketAddr, Running>>,
    /// Bound addresses, in configuration order.
    addrs: Mutex<Vec<SocketAddr>>,
    /// Why the last configuration reload failed, while it stands.
    reload_error: Mutex<Option<String>>,
    connections: Connections,
}

pub struct TunnelAgent {
    inner: Arc<Inner>,
    stats_drain: Drain,
    failing: Arc<AtomicBool>,
}

fn key(l: &ListenerSpec) -> SocketAddr {
    SocketAddr::new(l.bind_address, l.bind_port)
}

async fn bind(l: &ListenerSpec) -> Result<TcpListener, AgentError> {
    let addr = key(l);
    daemon::listen::bind_tcp(&l.bind_address.to_string(), l.bind_port)
        .await
        .map_err(|source| AgentError::Bind { addr, source })
}

impl TunnelAgent {
    pub async fn start(config: AgentConfig, listeners: AgentListeners) -> Result<Self, AgentError> {
        config.validate()?;
        let mut tunnels = listeners.tunnels;
        if tunnels.is_empty() {
            for l in &config.listeners {
                tunnels.push(bind(l).await?);
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
        let pool = SeedPool::new();
        let specs = config.listeners.clone();
        let (config_tx, config_rx) = watch::channel(Arc::new(config));
        tokio::spawn(seed::maintain(
            config_rx,
            pool.clone(),
            metrics.clone(),
            drain.clone(),
        ));
        let inner = Arc::new(Inner {
            config: config_tx,
            metrics: metrics.clone(),
            pool,
            drain,
            listeners: tokio::sync::Mutex::new(BTreeMap::new()),
            addrs: Mutex::new(Vec::new()),
            reload_error: Mutex::new(None),
            connections: {
                let c = Connections::new();
                let m = metrics.clone();
                c.on_close(move |kind, reason, _| m.connection_closed(kind, reason));
                c
            },
        });
        if let Some(l) = listeners.admin {
            let connections = inner.connections.clone();
            let handler: Handler = Arc::new(move |head| match head.path {
                "/debug/connections" => connections.reply_local(head),
                _ => Reply::not_found(),
            });
            tokio::spawn(daemon::endpoints::serve(
                l,
                "admin",
                handler,
                stats_drain.clone(),
            ));
        }
        if let Some(l) = listeners.stats {
            tokio::spawn(daemon::endpoints::serve(
                l,
                "stats",
                stats_handler(inner.clone(), failing.clone()),
                stats_drain.clone(),
            ));
        }
        {
            let mut running = inner.listeners.lock().await;
            for (spec, l) in specs.iter().zip(tunnels) {
                running.insert(key(spec), serve_listener(&inner, spec, l));
            }
        }
        Ok(TunnelAgent {
            inner,
            stats_drain,
            failing,
        })
    }

    /// Where the tunnel listeners are bound, in the order they were opened.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.inner
            .addrs
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default()
    }

    /// Resolves once a connection to the seed proxy takes tunnels.
    pub async fn connected(&self) {
        self.inner.pool.connected().await;
    }

    pub fn is_connected(&self) -> bool {
        self.inner.pool.usable() > 0
    }

    /// Connections to the seed proxy open now, retired ones finishing
    /// their tunnels included.
    pub fn seed_connections(&self) -> usize {
        self.inner.pool.open()
    }

    pub fn metrics_text(&self) -> String {
        self.inner.metrics.render()
    }

    pub fn config(&self) -> Arc<AgentConfig> {
        self.inner.config.borrow().clone()
    }

    /// Applies a new configuration. Returns whether anything changed. On an
    /// error (invalid, or a new listener cannot be bound) the running
    /// configuration stays as it was.
    pub async fn apply(&self, config: AgentConfig) -> Result<bool, AgentError> {
        config.validate()?;
        let inner = &self.inner;
        let mut running = inner.listeners.lock().await;
        let old = inner.config.borrow().clone();
        if *old == config {
            return Ok(false);
        }
        let wanted: BTreeMap<SocketAddr, ListenerSpec> = config
            .listeners
            .iter()
            .map(|l| (key(l), l.clone()))
            .collect();
        // Bind every new listener first, so a failure changes nothing.
        let mut fresh = Vec::new();
        for (addr, spec) in &wanted {
            if !running.contains_key(addr) {
                fresh.push((spec, bind(spec).await?));
            }
        }
        running.retain(|addr, r| {
            let keep = wanted.contains_key(addr);
            if !keep {
                tracing::info!(%addr, "tunneling listener removed; its open tunnels run on");
                r.stop.cancel();
            }
            keep
        });
        for (addr, r) in running.iter() {
            if let Some(spec) = wanted.get(addr)
                && *r.authority.borrow() != spec.authority
            {
                tracing::info!(%addr, authority = %spec.authority, "tunneling listener now tunnels to a new authority");
                r.authority.send_replace(spec.authority.clone());
            }
        }
        inner.config.send_replace(Arc::new(config));
        for (spec, l) in fresh {
            running.insert(key(spec), serve_listener(inner, spec, l));
        }
        Ok(true)
    }

    /// Reports what a bootstrap just loaded from `file` sets that the agent
    /// ignores (Envoy fields it does not act on; fields Envoy does not know,
    /// let through by `--allow-unknown-static-fields`; deprecated ones): a
    /// log line each, and the counters.
    pub fn note_bootstrap(&self, file: &str, notes: &crate::bootstrap::Notes) {
        report_notes(file, notes);
        let m = &self.inner.metrics;
        m.static_ignored_fields
            .increment(notes.ignored.len() as u64);
        m.static_unknown_fields
            .increment(notes.unknown_messages as u64);
    }

    /// Records the outcome of a configuration reload for `/healthz`.
    pub fn set_reload_error(&self, error: Option<String>) {
        if let Ok(mut e) = self.inner.reload_error.lock() {
            *e = error;
        }
    }

    pub(crate) fn metrics(&self) -> &Arc<AgentMetrics> {
        &self.inner.metrics
    }

    /// Fails health, stops accepting, lets tunnels finish within the drain
    /// timeout, then closes the seed connection.
    pub async fn shutdown(&self) -> bool {
        self.failing.store(true, Ordering::Relaxed);
        let timeout = self.inner.config.borrow().drain_timeout;
        let clean = self.inner.drain.shutdown(timeout).await;
        self.inner.metrics.live.set(0.0);
        self.stats_drain.start();
        clean
    }
}

/// Logs what [`TunnelAgent::note_bootstrap`] reports.
pub fn report_notes(file: &str, notes: &crate::bootstrap::Notes) {
    if !notes.ignored.is_empty() {
        tracing::warn!(
            config = file,
            fields = %notes.ignored.join(", "),
            "the bootstrap sets fields Envoy knows that tunnel-agent does not act on; they are ignored (docs/nodeport-proxy.md)"
        );
    }
    if !notes.unknown.is_empty() {
        tracing::warn!(
            config = file,
            fields = %notes.unknown.join(", "),
            "the bootstrap sets fields Envoy's schema does not know; ignored (--allow-unknown-static-fields)"
        );
    }
    if !notes.deprecated.is_empty() {
        // Envoy warns about each; KKP's own template uses one
        // (admin.access_log_path), so this is not a warning here.
        tracing::info!(
            config = file,
            fields = %notes.deprecated.join(", "),
            "the bootstrap uses fields Envoy deprecates"
        );
    }
}

fn stats_handler(inner: Arc<Inner>, failing: Arc<AtomicBool>) -> Handler {
    Arc::new(move |head| match head.path {
        "/healthz" if failing.load(Ordering::Relaxed) => {
            Reply::text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        }
        "/healthz" => match inner.reload_error.lock().ok().and_then(|e| e.clone()) {
            // Still serving, on the last good configuration.
            Some(e) => Reply::text(
                StatusCode::OK,
                format!("ok\nconfiguration reload failed, serving the previous one: {e}\n"),
            ),
            None => Reply::ok(),
        },
        "/ready" if failing.load(Ordering::Relaxed) => {
            Reply::text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        }
        "/ready" => match inner.pool.not_ready_reason() {
            None => Reply::ok(),
            Some(why) => Reply::text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        "/stats/prometheus" | "/stats" | "/metrics" => Reply::metrics(inner.metrics.render()),
        _ => Reply::not_found(),
    })
}

/// Starts accepting on `l` for `spec`.
fn serve_listener(inner: &Arc<Inner>, spec: &ListenerSpec, l: TcpListener) -> Running {
    let local = l.local_addr().ok();
    if let (Some(a), Ok(mut addrs)) = (local, inner.addrs.lock()) {
        addrs.push(a);
    }
    let name = local
        .map(|a| format!("{}_{}", a.ip(), a.port()))
        .unwrap_or_default();
    let stats = inner.metrics.listener(&name);
    let shown = local.map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(addr = %shown, authority = %spec.authority, "tunneling listener");
    let limit = inner.config.borrow().max_connections_per_listener;
    let options = AcceptOptions {
        max_connections: Some(Arc::new(Semaphore::new(limit))),
        ..AcceptOptions::default()
    };
    let (authority, authority_rx) = watch::channel(spec.authority.clone());
    let stop = CancellationToken::new();
    let (inner2, inner3, stop2) = (inner.clone(), inner.clone(), stop.clone());
    let drain = inner.drain.clone();
    tokio::spawn(async move {
        let accepting = accept_loop(
            l,
            "tunnel",
            drain,
            options,
            move |io: TcpStream, _, permit| {
                let (inner, stats) = (inner2.clone(), stats.clone());
                let authority = authority_rx.borrow().clone();
                async move {
                    let _permit = permit;
                    handle(io, &authority, &inner, &stats).await;
                }
            },
        );
        tokio::select! {
            _ = accepting => {}
            _ = stop2.cancelled() => {}
        }
        if let (Some(a), Ok(mut addrs)) = (local, inner3.addrs.lock()) {
            addrs.retain(|x| *x != a);
        }
    });
    Running { authority, stop }
}

async fn handle(
    client: TcpStream,
    authority: &ConnectAuthority,
    inner: &Inner,
    stats: &ListenerStats,
) {
    stats.downstream_cx_total.increment(1);
    stats.downstream_cx_active.increment(1.0);
    inner.metrics.downstream_cx_total.increment(1);
    let conn = inner.connections.open("tunnel", client.peer_addr().ok());
    conn.set_target(authority);
    if let Ok(a) = client.local_addr() {
        conn.set("listener", a);
    }
    conn.set_state("connecting");
    if let Err(e) = tunnel(client, authority, inner, &conn).await {
        conn.set_close(e.cause(), &e);
        inner.metrics.rq_failed.increment(1);
        tracing::warn!(%authority, error = %e, "local connection closed");
    }
    stats.downstream_cx_active.decrement(1.0);
}

async fn tunnel(
    client: TcpStream,
    authority: &ConnectAuthority,
    inner: &Inner,
    conn: &Tracked,
) -> Result<(), TunnelError> {
    let config = inner.config.borrow().clone();
    match &config.http_proxy {
        None => conn.set_upstream(format_args!("{}:{}", config.proxy_host, config.proxy_port)),
        Some(via) => conn.set_upstream(format_args!(
            "{}:{} via {via}",
            config.proxy_host, config.proxy_port
        )),
    }
    let timeout = config.connect_timeout;
    let uri = http::Uri::try_from(authority.to_string())
        .map_err(|_| TunnelError::Refused(StatusCode::BAD_REQUEST, authority.clone()))?;
    // A stream the seed did not process (opened after its GOAWAY, or
    // refused with REFUSED_STREAM) is opened once more, on another
    // connection (that one takes no new streams for now), as Envoy retries
    // such streams. Anything else fails the local connection.
    let mut retried = false;
    let (resp, stream, lease) = loop {
        let lease = inner
            .pool
            .acquire(timeout)
            .await
            .ok_or(TunnelError::NoSeed(timeout))?;
        match open(&lease, uri.clone(), timeout, inner).await {
            Ok((resp, stream)) => break (resp, stream, lease),
            Err(e) => match e.unprocessed() {
                Some(go_away) if !retried => {
                    if go_away {
                        lease.going_away();
                    } else {
                        lease.refused();
                    }
                    retried = true;
                    inner.metrics.rq_retry.increment(1);
                    tracing::debug!(%authority, error = %e, "opening the CONNECT stream again");
                }
                _ => return Err(e),
            },
        }
    };
    if resp.status() != StatusCode::OK {
        return Err(TunnelError::Refused(resp.status(), authority.clone()));
    }
    inner.metrics.rq_active.increment(1.0);
    conn.set_state("established");
    let io = H2Io::metered(stream, resp.into_body(), lease.meter());
    let options = RelayOptions {
        buffer_size: config.buffer_size,
        idle_timeout: Some(config.idle_timeout).filter(|d| !d.is_zero()),
    };
    let (end, bytes) = relay(
        Plain(client),
        io,
        options,
        &Both(inner.metrics.as_ref(), conn),
        inner.drain.stopping(),
    )
    .await;
    conn.set_close((&end).into(), end.reason());
    inner.metrics.rq_active.decrement(1.0);
    drop(lease);
    tracing::debug!(%authority, reason = end.reason(), from_client = bytes.from_client, from_upstream = bytes.from_upstream, "tunnel closed");
    Ok(())
}

/// Opens one CONNECT stream on `seed` and waits up to `timeout` for its
/// answer.
async fn open(
    seed: &Lease,
    uri: http::Uri,
    timeout: std::time::Duration,
    inner: &Inner,
) -> Result<(http::Response<h2::RecvStream>, h2::SendStream<bytes::Bytes>), TunnelError> {
    let mut req = Request::new(());
    *req.method_mut() = Method::CONNECT;
    *req.uri_mut() = uri;
    let (answer, stream) = seed
        .send()
        .send_request(req, false)
        .map_err(TunnelError::Open)?;
    inner.metrics.rq_total.increment(1);
    let resp = tokio::time::timeout(timeout, answer)
        .await
        .map_err(|_| TunnelError::AnswerTimeout(timeout))?
        .map_err(TunnelError::Answer)?;
    Ok((resp, stream))
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
