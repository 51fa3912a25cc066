//! The HTTP/2 (h2c) connections to the seed proxy that every tunnel shares:
//! a pool, as Envoy's HTTP/2 connection pool is. One connection carries every
//! tunnel while it has room; when each has as many streams open as the seed
//! allows (its SETTINGS_MAX_CONCURRENT_STREAMS, nodeport-proxy: 1,024) or
//! refuses streams (MAX_CONCURRENT_STREAMS=0, REFUSED_STREAM), a tunnel that
//! waits makes the pool dial another, up to `max_seed_connections`.
//! Connections beyond the first that carried nothing for the pool's idle
//! timeout are closed. The first one is kept however long it idles.
//!
//! A connection takes streams only once the seed answered a first PING: the
//! seed's SETTINGS come before that answer (HTTP/2 preface order, and h2
//! applies them before reading on), so its stream limit is known before a
//! stream is opened and no stream waits unseen inside h2 behind a limit of 0.
//!
//! Each connection is declared dead when a keepalive PING goes unanswered;
//! the pool dials again after a loss with exponential back-off and jitter,
//! resolving the seed's name again. A new configuration naming another seed
//! (or other PING or window settings) retires every connection: tunnels on
//! them run on until they end, new ones get a new connection. So does a
//! GOAWAY from the seed (a nodeport-proxy pod draining in a rolling update):
//! h2's client shows it only as an error when the next stream is opened, and
//! the connection stays open while its streams run, so the first tunnel to
//! meet the error retires it (Envoy's connection pool does the same on
//! GOAWAY). Receive windows follow the link (`link::h2window`), reserved
//! from one budget all connections share.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use daemon::drain::Drain;
use daemon::egress_proxy::{HttpProxy, ProxiedIo, ProxyError};
use h2::client::SendRequest;
use h2::{Ping, PingPong};
use link::h2window::{Action, Controller, Keepalive, Meter, Start};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::config::AgentConfig;
use crate::limits;
use crate::metrics::AgentMetrics;

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("resolving {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("{host} resolved to no address")]
    NoAddress { host: String },
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("connecting to the seed proxy {host}:{port} timed out")]
    Timeout { host: String, port: u16 },
    #[error("HTTP/2 handshake with the seed proxy: {0}")]
    Handshake(h2::Error),
    #[error("the seed proxy did not answer the first PING within {0:?}")]
    NoPong(Duration),
    #[error("the seed proxy closed the connection before answering the first PING: {0}")]
    ClosedEarly(String),
    #[error(transparent)]
    HttpProxy(#[from] ProxyError),
}

/// One connection to the seed, as the pool and the tunnels on it see it.
pub struct Conn {
    send: SendRequest<Bytes>,
    pub meter: Arc<Meter>,
    /// Streams of ours open on it (leases not yet dropped).
    open: AtomicUsize,
    /// Streams opened on it in all (for `max_requests_per_connection`).
    opened: AtomicU64,
    /// Takes no new streams: the seed sent GOAWAY, the configuration
    /// changed, it reached its request limit or idled out.
    closing: AtomicBool,
    /// After the seed refused a stream: no more streams than this until one
    /// of those open ends (`usize::MAX`: no such limit).
    refused_cap: AtomicUsize,
    /// Most streams we open on it (Envoy's `max_concurrent_streams`).
    max_streams: usize,
    /// Streams it carries in all before it is retired (0: unlimited).
    max_requests: u64,
    /// Wakes the connection's driver: retired, or its stream count changed.
    wake: Notify,
    /// Why it was retired, for the log.
    retired_for: parking_lot::Mutex<Option<&'static str>>,
}

impl Conn {
    /// The most streams it may have open now: the seed's limit, ours, and
    /// after a refusal the streams that were open then.
    fn limit(&self) -> usize {
        self.send
            .current_max_send_streams()
            .min(self.max_streams)
            .min(self.refused_cap.load(Ordering::Acquire))
    }

    /// Takes a stream slot if it has room.
    fn try_take(&self) -> bool {
        if self.closing.load(Ordering::Acquire) {
            return false;
        }
        let limit = self.limit();
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok();
        if taken {
            let opened = self.opened.fetch_add(1, Ordering::AcqRel) + 1;
            if self.max_requests != 0 && opened >= self.max_requests {
                self.retire("it carried max_requests_per_connection streams");
            }
            self.wake.notify_one();
        }
        taken
    }

    fn has_room(&self) -> bool {
        !self.closing.load(Ordering::Acquire) && self.open.load(Ordering::Acquire) < self.limit()
    }

    /// New streams go elsewhere; open ones run on.
    fn retire(&self, why: &'static str) {
        self.retired_for.lock().get_or_insert(why);
        self.closing.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

/// A stream slot on one connection, held for the life of a tunnel.
pub struct Lease {
    conn: Arc<Conn>,
    pool: Arc<SeedPool>,
}

impl Lease {
    pub fn send(&self) -> SendRequest<Bytes> {
        self.conn.send.clone()
    }

    pub fn meter(&self) -> &Arc<Meter> {
        &self.conn.meter
    }

    /// The seed sent GOAWAY: this connection takes no new streams.
    pub fn going_away(&self) {
        self.conn.retire("the seed proxy sent GOAWAY");
        self.pool.bump();
    }

    /// The seed refused this stream (REFUSED_STREAM): the connection takes
    /// no new stream until one of those open on it ends; alone on it, the
    /// connection is retired (nothing would ever end to make room).
    pub fn refused(&self) {
        let others = self.conn.open.load(Ordering::Acquire).saturating_sub(1);
        if others == 0 {
            self.conn
                .retire("the seed proxy refused a stream on a connection that carried no other");
        } else {
            self.conn.refused_cap.store(others, Ordering::Release);
        }
        self.pool.bump();
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let left = self.conn.open.fetch_sub(1, Ordering::AcqRel) - 1;
        if left < self.conn.refused_cap.load(Ordering::Acquire) {
            self.conn.refused_cap.store(usize::MAX, Ordering::Release);
        }
        self.conn.wake.notify_one();
        self.pool.bump();
    }
}

/// What a connection's driver tells the pool's keeper when it ends.
struct Ended {
    /// It failed (not retired, not stopped by the drain).
    lost: bool,
    reason: String,
}

/// The connections, and what tunnels wait on.
pub struct SeedPool {
    conns: parking_lot::Mutex<Vec<Arc<Conn>>>,
    /// Bumped whenever a connection may have room it had not: tunnels
    /// waiting for a slot look again.
    version: watch::Sender<u64>,
    /// Tunnels waiting for a slot.
    waiting: AtomicUsize,
    /// Tells the keeper a tunnel found no room.
    demand: Notify,
    /// Why the last dial failed or the last connection was lost, while no
    /// connection takes streams (for `/ready`).
    last_error: parking_lot::Mutex<Option<String>>,
}

impl SeedPool {
    pub fn new() -> Arc<SeedPool> {
        Arc::new(SeedPool {
            conns: parking_lot::Mutex::new(Vec::new()),
            version: watch::channel(0).0,
            waiting: AtomicUsize::new(0),
            demand: Notify::new(),
            last_error: parking_lot::Mutex::new(None),
        })
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Connections that take new streams.
    pub fn usable(&self) -> usize {
        self.conns.lock().iter().filter(|c| !c.is_closing()).count()
    }

    /// All connections open, retired ones finishing their tunnels included.
    pub fn open(&self) -> usize {
        self.conns.lock().len()
    }

    /// Why no connection takes streams, if none does.
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.usable() > 0 {
            return None;
        }
        Some(
            self.last_error
                .lock()
                .clone()
                .unwrap_or_else(|| "no connection to the seed proxy yet".into()),
        )
    }

    /// Resolves once a connection takes streams.
    pub async fn connected(&self) {
        let mut rx = self.version.subscribe();
        loop {
            if self.usable() > 0 {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    fn try_lease(self: &Arc<Self>) -> Option<Lease> {
        let conns = self.conns.lock();
        let conn = conns.iter().find(|c| c.try_take())?.clone();
        Some(Lease {
            conn,
            pool: self.clone(),
        })
    }

    fn any_room(&self) -> bool {
        self.conns.lock().iter().any(|c| c.has_room())
    }

    /// A stream slot on a connection with room, waiting up to `timeout` for
    /// one (the pool dials another connection while tunnels wait).
    pub async fn acquire(self: &Arc<Self>, timeout: Duration) -> Option<Lease> {
        let mut rx = self.version.subscribe();
        rx.borrow_and_update();
        if let Some(l) = self.try_lease() {
            return Some(l);
        }
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.waiting);
        let deadline = Instant::now() + timeout;
        loop {
            self.demand.notify_one();
            tokio::select! {
                r = rx.changed() => if r.is_err() { return None },
                _ = tokio::time::sleep_until(deadline) => return None,
            }
            rx.borrow_and_update();
            if let Some(l) = self.try_lease() {
                return Some(l);
            }
        }
    }

    fn add(&self, conn: Arc<Conn>) {
        self.conns.lock().push(conn);
        *self.last_error.lock() = None;
        self.bump();
    }

    fn remove(&self, conn: &Arc<Conn>) {
        self.conns.lock().retain(|c| !Arc::ptr_eq(c, conn));
        self.bump();
    }

    /// Retires `conn` for idling, unless it is the last that takes streams.
    fn retire_idle(&self, conn: &Arc<Conn>) -> bool {
        let conns = self.conns.lock();
        let others = conns
            .iter()
            .any(|c| !Arc::ptr_eq(c, conn) && !c.is_closing());
        if others && conn.open.load(Ordering::Acquire) == 0 {
            conn.retire("idle");
            true
        } else {
            false
        }
    }

    fn retire_all(&self) {
        for c in self.conns.lock().iter() {
            c.retire("seed settings changed");
        }
        self.bump();
    }

    fn set_error(&self, e: String) {
        *self.last_error.lock() = Some(e);
        self.bump();
    }
}

type Connection = h2::client::Connection<ProxiedIo, Bytes>;

/// What a seed connection is dialled and kept with; a change means new ones.
fn target(
    c: &AgentConfig,
) -> (
    &str,
    u16,
    Duration,
    Duration,
    Option<&HttpProxy>,
    link::h2window::WindowSettings,
) {
    (
        c.proxy_host.as_str(),
        c.proxy_port,
        c.keepalive_interval,
        c.keepalive_timeout,
        c.http_proxy.as_ref(),
        c.windows,
    )
}

/// Whether the keeper should dial another connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    No,
    Yes,
    /// Tunnels wait and every connection is full, but the pool is at its
    /// bound (Envoy counts this as `upstream_cx_overflow`).
    Capped,
}

fn wanted(pool: &SeedPool, cfg: &AgentConfig) -> Want {
    let usable = pool.usable();
    if usable == 0 {
        return Want::Yes;
    }
    if pool.waiting.load(Ordering::Acquire) == 0 || pool.any_room() {
        return Want::No;
    }
    if usable >= cfg.max_seed_connections {
        return Want::Capped;
    }
    Want::Yes
}

/// Keeps the pool's connections up until the drain stops the agent,
/// following configuration changes.
pub async fn maintain(
    mut config: watch::Receiver<Arc<AgentConfig>>,
    pool: Arc<SeedPool>,
    metrics: Arc<AgentMetrics>,
    drain: Drain,
) {
    let mut cfg = config.borrow_and_update().clone();
    let mut backoff = cfg.backoff_initial;
    let mut not_before = Instant::now();
    // Every connection's windows are reserved from one budget: twice one
    // connection's, so a connection and one being replaced both fit.
    let windows = link::h2window::Pool::new(cfg.windows.connection_budget.saturating_mul(2));
    metrics.watch_windows(windows.clone());
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<Ended>();
    let mut capped = false;
    loop {
        // Wait until another connection is wanted and may be dialled.
        loop {
            let w = wanted(&pool, &cfg);
            if w == Want::Capped && !capped {
                metrics.cx_overflow.increment(1);
                tracing::warn!(
                    connections = pool.usable(),
                    "every seed proxy connection is full and the pool is at its bound (-max-seed-connections): new tunnels wait for a stream to end"
                );
            }
            capped = w == Want::Capped;
            let want = w == Want::Yes;
            if want && Instant::now() >= not_before {
                break;
            }
            tokio::select! {
                _ = pool.demand.notified() => {}
                Some(e) = ended.recv() => {
                    if e.lost {
                        // Back off before dialling again, so a seed that
                        // accepts and then drops every connection is not
                        // hammered.
                        not_before = Instant::now() + backoff.mul_f64(rand::random_range(0.8..1.2));
                        backoff = (backoff * 2).min(cfg.backoff_max);
                        if pool.usable() == 0 {
                            pool.set_error(format!("seed proxy connection lost: {}", e.reason));
                            tracing::warn!(reason = %e.reason, retry_in = ?not_before.saturating_duration_since(Instant::now()), "seed proxy connection lost; reconnecting");
                        } else {
                            tracing::info!(reason = %e.reason, "a seed proxy connection was lost; the others carry new tunnels");
                        }
                    }
                }
                _ = tokio::time::sleep_until(not_before), if want => {}
                r = config.changed() => {
                    if r.is_err() {
                        return;
                    }
                    let new = config.borrow_and_update().clone();
                    if target(&new) != target(&cfg) {
                        pool.retire_all();
                        // A new seed is tried at once.
                        backoff = new.backoff_initial;
                        not_before = Instant::now();
                    }
                    cfg = new;
                }
                _ = drain.stopping() => return,
            }
        }
        let start = windows.start(cfg.windows);
        let dialled = tokio::select! {
            r = establish(&cfg, start) => r,
            _ = drain.stopping() => return,
        };
        match dialled {
            Ok(up) => {
                metrics.cx_total.increment(1);
                metrics.cx_active.increment(1.0);
                match &cfg.http_proxy {
                    None => {
                        tracing::info!(proxy = %cfg.proxy_host, port = cfg.proxy_port, connections = pool.usable() + 1, "connected to seed proxy")
                    }
                    Some(via) => {
                        tracing::info!(proxy = %cfg.proxy_host, port = cfg.proxy_port, %via, connections = pool.usable() + 1, "connected to seed proxy through the HTTP proxy")
                    }
                }
                let conn = Arc::new(Conn {
                    send: up.send,
                    meter: Meter::new(),
                    open: AtomicUsize::new(0),
                    opened: AtomicU64::new(0),
                    closing: AtomicBool::new(false),
                    refused_cap: AtomicUsize::new(usize::MAX),
                    max_streams: cfg.max_streams_per_connection,
                    max_requests: cfg.max_requests_per_connection,
                    wake: Notify::new(),
                    retired_for: parking_lot::Mutex::new(None),
                });
                pool.add(conn.clone());
                tokio::spawn(drive(
                    up.conn,
                    up.pings,
                    up.start,
                    conn,
                    pool.clone(),
                    cfg.clone(),
                    metrics.clone(),
                    drain.clone(),
                    ended_tx.clone(),
                ));
                backoff = cfg.backoff_initial;
            }
            Err(e) => {
                metrics.cx_connect_fail.increment(1);
                let wait = backoff.mul_f64(rand::random_range(0.8..1.2));
                tracing::warn!(error = %e, retry_in = ?wait, "seed proxy unreachable");
                if pool.usable() == 0 {
                    pool.set_error(format!("seed proxy unreachable: {e}"));
                }
                not_before = Instant::now() + wait;
                backoff = (backoff * 2).min(cfg.backoff_max);
            }
        }
    }
}

/// A connection that answered its first PING.
struct Established {
    send: SendRequest<Bytes>,
    conn: Connection,
    pings: PingPong,
    start: Start,
}

async fn handshake(
    io: ProxiedIo,
    config: &AgentConfig,
    start: &Start,
) -> Result<(SendRequest<Bytes>, Connection), SeedError> {
    h2::client::Builder::new()
        .initial_window_size(start.stream())
        .initial_connection_window_size(start.connection())
        .max_send_buffer_size(config.buffer_size)
        .max_header_list_size(limits::MAX_HEADER_LIST_SIZE)
        .max_pending_accept_reset_streams(limits::MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(Some(limits::MAX_LOCAL_ERROR_RESET_STREAMS))
        .handshake(io)
        .await
        .map_err(SeedError::Handshake)
}

/// Dials, shakes hands, and waits for the answer to a first PING (within
/// the keepalive timeout), by which the seed's SETTINGS are applied.
async fn establish(config: &AgentConfig, start: Start) -> Result<Established, SeedError> {
    let (send, mut conn) = dial(config, &start).await?;
    let Some(mut pings) = conn.ping_pong() else {
        return Err(SeedError::ClosedEarly("PING handle unavailable".into()));
    };
    let first = async {
        tokio::select! {
            r = &mut conn => Err(SeedError::ClosedEarly(match r {
                Ok(()) => "closed".into(),
                Err(e) => e.to_string(),
            })),
            r = pings.ping(Ping::opaque()) => r.map_err(|e| SeedError::ClosedEarly(e.to_string())),
        }
    };
    match tokio::time::timeout(config.keepalive_timeout, first).await {
        Ok(Ok(_)) => Ok(Established {
            send,
            conn,
            pings,
            start,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(SeedError::NoPong(config.keepalive_timeout)),
    }
}

async fn dial(
    config: &AgentConfig,
    start: &Start,
) -> Result<(SendRequest<Bytes>, Connection), SeedError> {
    let attempt = async {
        let host = config.proxy_host.trim_matches(['[', ']']);
        if let Some(via) = &config.http_proxy {
            // The proxy resolves the seed's name, as it does for browsers.
            let io = via.connect(host, config.proxy_port).await?;
            return handshake(io, config, start).await;
        }
        let addrs: Vec<_> = tokio::net::lookup_host((host, config.proxy_port))
            .await
            .map_err(|source| SeedError::Resolve {
                host: host.to_string(),
                source,
            })?
            .collect();
        let mut last = SeedError::NoAddress {
            host: host.to_string(),
        };
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(io) => {
                    let _ = io.set_nodelay(true);
                    return handshake(Box::new(io), config, start).await;
                }
                Err(source) => last = SeedError::Connect { addr, source },
            }
        }
        Err(last)
    };
    tokio::time::timeout(config.connect_timeout, attempt)
        .await
        .map_err(|_| SeedError::Timeout {
            host: config.proxy_host.clone(),
            port: config.proxy_port,
        })?
}

/// Polls the connection once, and tells waiting tunnels when the seed's
/// stream limit changed (a SETTINGS frame).
fn poll_conn(
    conn: &mut Connection,
    c: &Conn,
    pool: &SeedPool,
    last_limit: &mut usize,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<Result<(), h2::Error>> {
    let r = std::pin::Pin::new(conn).poll(cx);
    let now = c.send.current_max_send_streams();
    if now != *last_limit {
        *last_limit = now;
        pool.bump();
    }
    r
}

/// Runs one connection until it fails, a PING times out, it is retired or
/// idles out, or the agent stops; a retired one runs on until its last
/// tunnel ends. PINGs (keepalive, and to size the windows) and window
/// changes are driven here.
#[allow(clippy::too_many_arguments)]
async fn drive(
    mut conn: Connection,
    pings: PingPong,
    start: Start,
    c: Arc<Conn>,
    pool: Arc<SeedPool>,
    cfg: Arc<AgentConfig>,
    metrics: Arc<AgentMetrics>,
    drain: Drain,
    ended: mpsc::UnboundedSender<Ended>,
) {
    // Envoy's connection_keepalive: a PING every interval whatever arrives
    // (this socket is not counted, so the peer is never "heard").
    let keepalive = Keepalive {
        interval: cfg.keepalive_interval,
        timeout: cfg.keepalive_timeout,
        min_gap: cfg.keepalive_interval,
    };
    let mut ctl = Controller::new(pings, start, Some(keepalive), c.meter.clone());
    let mut last_limit = c.send.current_max_send_streams();
    let idle_timeout = cfg.pool_idle_timeout;
    let mut idle_since = Some(Instant::now());
    let (reason, lost, retired) = loop {
        if c.open.load(Ordering::Acquire) > 0 {
            idle_since = None;
        } else if idle_since.is_none() {
            idle_since = Some(Instant::now());
        }
        // Envoy's idle_timeout 0: never.
        let idle_at = idle_since
            .filter(|_| !idle_timeout.is_zero())
            .map(|t| t + idle_timeout);
        tokio::select! {
            r = std::future::poll_fn(|cx| poll_conn(&mut conn, &c, &pool, &mut last_limit, cx)) => break (match r {
                Ok(()) => "closed by the seed proxy".into(),
                Err(e) => e.to_string(),
            }, true, false),
            a = ctl.next() => match a {
                Action::KeepaliveTimedOut => {
                    metrics.cx_destroy_keepalive.increment(1);
                    break (format!("PING unanswered for {:?}", cfg.keepalive_timeout), true, false);
                }
                Action::Resize { stream, connection } => {
                    conn.set_target_window_size(connection);
                    if stream.is_some_and(|s| conn.set_initial_window_size(s).is_err()) {
                        ctl.retry(a);
                    }
                }
            },
            _ = c.wake.notified() => {
                if c.is_closing() {
                    let why = c.retired_for.lock().unwrap_or("retired");
                    tracing::info!(
                        reason = why,
                        "new tunnels use a new connection to the seed proxy, open ones finish on the old"
                    );
                    break (why.into(), false, true);
                }
            }
            _ = async {
                match idle_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => {
                if pool.retire_idle(&c) {
                    tracing::info!(idle = ?idle_timeout, "closing a seed proxy connection that carried no tunnel (others remain)");
                    break ("idle".into(), false, true);
                }
                idle_since = Some(Instant::now());
            }
            _ = drain.stopping() => break ("agent stopping".into(), false, false),
        }
    };
    c.retire("ended");
    pool.remove(&c);
    // The leases of its open tunnels hold the last references to its
    // request handle; h2 ends the connection once they and their streams
    // are gone.
    drop(c);
    if retired {
        // Open tunnels finish on it; h2 closes it after the last.
        tokio::select! {
            _ = std::future::poll_fn(|cx| std::pin::Pin::new(&mut conn).poll(cx)) => {}
            _ = drain.stopping() => {}
        }
    }
    drop(conn);
    metrics.cx_active.decrement(1.0);
    let _ = ended.send(Ended { lost, reason });
}
