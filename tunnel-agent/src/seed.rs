//! The one HTTP/2 (h2c) connection to the seed proxy that every tunnel shares:
//! kept however long it idles, declared dead when a PING goes unanswered,
//! resolved and dialled again after every loss with exponential back-off and
//! jitter. A new configuration naming another seed (or other PING or window
//! settings) starts a new connection; tunnels on the old one run on until
//! they end. So does a GOAWAY from the seed (a nodeport-proxy pod draining
//! in a rolling update): h2's client shows it only as an error when the next
//! stream is opened, and the connection stays open while its streams run, so
//! the first tunnel to meet the error asks for a new connection (Envoy's
//! connection pool does the same on GOAWAY). Its receive windows follow the
//! link (`daemon::h2window`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use daemon::drain::Drain;
use daemon::h2window::{Action, Controller, Keepalive, Meter, Pool, Start};
use h2::client::SendRequest;
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};

use crate::config::AgentConfig;
use crate::http_proxy::{HttpProxy, ProxyError, SeedIo};
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
    #[error(transparent)]
    HttpProxy(#[from] ProxyError),
}

/// A connection to the seed: where tunnels open streams, and what their
/// readers report to its window controller.
#[derive(Clone)]
pub struct Seed {
    pub send: SendRequest<Bytes>,
    pub meter: Arc<Meter>,
    going_away: Arc<Notify>,
}

impl Seed {
    /// This connection takes no new streams (the seed sent GOAWAY): new
    /// tunnels get a new connection while open ones finish on this one.
    pub fn going_away(&self) {
        self.going_away.notify_one();
    }
}

/// The current connection, if any; tunnels wait on it.
pub type Current = watch::Receiver<Option<Seed>>;

type Connection = h2::client::Connection<SeedIo, Bytes>;

/// What a seed connection is dialled and kept with; a change means a new one.
fn target(
    c: &AgentConfig,
) -> (
    &str,
    u16,
    Duration,
    Duration,
    Option<&HttpProxy>,
    daemon::h2window::WindowSettings,
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

/// Keeps a connection up until the drain stops the agent, following
/// configuration changes.
pub async fn maintain(
    mut config: watch::Receiver<Arc<AgentConfig>>,
    current: watch::Sender<Option<Seed>>,
    metrics: Arc<AgentMetrics>,
    drain: Drain,
) {
    let mut backoff = config.borrow().backoff_initial;
    // The current connection and one being replaced may each hold their budget.
    let pool = Pool::new(config.borrow().windows.connection_budget.saturating_mul(2));
    metrics.watch_windows(pool.clone());
    loop {
        let cfg = config.borrow_and_update().clone();
        let start = pool.start(cfg.windows);
        match dial(&cfg, &start).await {
            Ok((send, conn)) => {
                metrics.cx_total.increment(1);
                metrics.cx_active.increment(1.0);
                match &cfg.http_proxy {
                    None => {
                        tracing::info!(proxy = %cfg.proxy_host, port = cfg.proxy_port, "connected to seed proxy")
                    }
                    Some(via) => {
                        tracing::info!(proxy = %cfg.proxy_host, port = cfg.proxy_port, %via, "connected to seed proxy through the HTTP proxy")
                    }
                }
                let meter = Meter::new();
                let going_away = Arc::new(Notify::new());
                current.send_replace(Some(Seed {
                    send,
                    meter: meter.clone(),
                    going_away: going_away.clone(),
                }));
                let end = drive(
                    conn,
                    meter,
                    &going_away,
                    start,
                    &cfg,
                    &mut config,
                    &metrics,
                    &drain,
                )
                .await;
                current.send_replace(None);
                if drain.is_stopping() {
                    metrics.cx_active.decrement(1.0);
                    return;
                }
                match end.retired {
                    Some(conn) => {
                        tracing::info!(
                            reason = %end.reason,
                            "new tunnels use a new connection to the seed proxy, open ones finish on the old"
                        );
                        tokio::spawn(retire(conn, metrics.clone(), drain.clone()));
                        backoff = cfg.backoff_initial;
                        continue;
                    }
                    None => metrics.cx_active.decrement(1.0),
                }
                // Only a connection that proved healthy (a PING answered)
                // resets the back-off: a seed that accepts and then drops
                // every connection is retried ever more slowly, not in a loop.
                if end.healthy {
                    backoff = cfg.backoff_initial;
                }
                tracing::warn!(reason = %end.reason, retry_in = ?backoff, "seed proxy connection lost; reconnecting");
            }
            Err(e) => {
                metrics.cx_connect_fail.increment(1);
                tracing::warn!(error = %e, retry_in = ?backoff, "seed proxy unreachable");
            }
        }
        let jitter = rand::random_range(0.8..1.2);
        tokio::select! {
            _ = tokio::time::sleep(backoff.mul_f64(jitter)) => {}
            // A new seed is tried at once.
            r = config.changed() => if r.is_err() { return },
            _ = drain.stopping() => return,
        }
        backoff = (backoff * 2).min(cfg.backoff_max);
    }
}

/// Runs a replaced connection until its last tunnel ends.
async fn retire(conn: Connection, metrics: Arc<AgentMetrics>, drain: Drain) {
    tokio::select! {
        _ = conn => {}
        _ = drain.stopping() => {}
    }
    metrics.cx_active.decrement(1.0);
}

async fn handshake(
    io: SeedIo,
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

/// How a seed connection ended.
struct End {
    reason: String,
    /// At least one PING was answered on it.
    healthy: bool,
    /// Still open, replaced after a configuration change.
    retired: Option<Connection>,
}

/// Runs the connection until it fails, a PING times out, the seed settings
/// change, or the agent stops. However long it idles, it is kept. PINGs
/// (keepalive, and to size the windows) and window changes are driven here.
#[allow(clippy::too_many_arguments)]
async fn drive(
    mut conn: Connection,
    meter: Arc<Meter>,
    going_away: &Notify,
    start: Start,
    cfg: &AgentConfig,
    config: &mut watch::Receiver<Arc<AgentConfig>>,
    metrics: &AgentMetrics,
    drain: &Drain,
) -> End {
    let Some(pings) = conn.ping_pong() else {
        return End {
            reason: "PING handle unavailable".into(),
            healthy: false,
            retired: None,
        };
    };
    // Envoy's connection_keepalive: a PING every interval whatever arrives
    // (this socket is not counted, so the peer is never "heard").
    let keepalive = Keepalive {
        interval: cfg.keepalive_interval,
        timeout: cfg.keepalive_timeout,
        min_gap: cfg.keepalive_interval,
    };
    let mut ctl = Controller::new(pings, start, Some(keepalive), meter);
    let replaced = async {
        loop {
            if config.changed().await.is_err() {
                return std::future::pending().await;
            }
            if target(&config.borrow()) != target(cfg) {
                return;
            }
        }
    };
    tokio::pin!(replaced);
    let (reason, retire) = loop {
        tokio::select! {
            r = &mut conn => break (match r {
                Ok(()) => "closed by the seed proxy".into(),
                Err(e) => e.to_string(),
            }, false),
            a = ctl.next() => match a {
                Action::KeepaliveTimedOut => {
                    metrics.cx_destroy_keepalive.increment(1);
                    break (format!("PING unanswered for {:?}", cfg.keepalive_timeout), false);
                }
                Action::Resize { stream, connection } => {
                    conn.set_target_window_size(connection);
                    if stream.is_some_and(|s| conn.set_initial_window_size(s).is_err()) {
                        ctl.retry(a);
                    }
                }
            },
            _ = &mut replaced => break ("seed settings changed".into(), true),
            _ = going_away.notified() => break ("the seed proxy sent GOAWAY".into(), true),
            _ = drain.stopping() => break ("agent stopping".into(), false),
        }
    };
    End {
        reason,
        healthy: ctl.pongs() > 0,
        retired: retire.then_some(conn),
    }
}

/// Waits up to `timeout` for a connection with room for another stream.
pub async fn ready(current: &mut Current, timeout: Duration) -> Option<Seed> {
    tokio::time::timeout(timeout, async {
        loop {
            let Seed {
                send,
                meter,
                going_away,
            } = current.wait_for(Option::is_some).await.ok()?.clone()?;
            match send.ready().await {
                Ok(send) => {
                    return Some(Seed {
                        send,
                        meter,
                        going_away,
                    });
                }
                // This connection takes no new streams; wait for the next.
                Err(e) => {
                    if e.is_go_away() {
                        going_away.notify_one();
                    }
                    let _ = current.changed().await;
                }
            }
        }
    })
    .await
    .ok()
    .flatten()
}
