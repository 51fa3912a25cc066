//! The one HTTP/2 (h2c) connection to the seed proxy that every tunnel shares:
//! kept however long it idles, declared dead when a PING goes unanswered,
//! resolved and dialled again after every loss with exponential back-off and
//! jitter. A new configuration naming another seed (or other PING settings)
//! starts a new connection; tunnels on the old one run on until they end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use daemon::drain::Drain;
use h2::client::SendRequest;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::AgentConfig;
use crate::http_proxy::{HttpProxy, ProxyError, SeedIo};
use crate::limits;
use crate::metrics::AgentMetrics;

const STREAM_WINDOW: u32 = 256 * 1024;
const CONNECTION_WINDOW: u32 = 1024 * 1024;

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

/// The current connection, if any; tunnels wait on it.
pub type Current = watch::Receiver<Option<SendRequest<Bytes>>>;

type Connection = h2::client::Connection<SeedIo, Bytes>;

/// What a seed connection is dialled and kept with; a change means a new one.
fn target(c: &AgentConfig) -> (&str, u16, Duration, Duration, Option<&HttpProxy>) {
    (
        c.proxy_host.as_str(),
        c.proxy_port,
        c.keepalive_interval,
        c.keepalive_timeout,
        c.http_proxy.as_ref(),
    )
}

/// Keeps a connection up until the drain stops the agent, following
/// configuration changes.
pub async fn maintain(
    mut config: watch::Receiver<Arc<AgentConfig>>,
    current: watch::Sender<Option<SendRequest<Bytes>>>,
    metrics: Arc<AgentMetrics>,
    drain: Drain,
) {
    let mut backoff = config.borrow().backoff_initial;
    loop {
        let cfg = config.borrow_and_update().clone();
        match dial(&cfg).await {
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
                current.send_replace(Some(send));
                let end = drive(conn, &cfg, &mut config, &metrics, &drain).await;
                current.send_replace(None);
                if drain.is_stopping() {
                    metrics.cx_active.decrement(1.0);
                    return;
                }
                match end.retired {
                    Some(conn) => {
                        tracing::info!(
                            "seed proxy settings changed; new tunnels use a new connection, open ones finish on the old"
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
) -> Result<(SendRequest<Bytes>, Connection), SeedError> {
    h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buffer_size(config.buffer_size)
        .max_header_list_size(limits::MAX_HEADER_LIST_SIZE)
        .max_pending_accept_reset_streams(limits::MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(Some(limits::MAX_LOCAL_ERROR_RESET_STREAMS))
        .handshake(io)
        .await
        .map_err(SeedError::Handshake)
}

async fn dial(config: &AgentConfig) -> Result<(SendRequest<Bytes>, Connection), SeedError> {
    let attempt = async {
        let host = config.proxy_host.trim_matches(['[', ']']);
        if let Some(via) = &config.http_proxy {
            // The proxy resolves the seed's name, as it does for browsers.
            let io = via.connect(host, config.proxy_port).await?;
            return handshake(io, config).await;
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
                    return handshake(Box::new(io), config).await;
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
/// change, or the agent stops. However long it idles, it is kept.
async fn drive(
    mut conn: Connection,
    cfg: &AgentConfig,
    config: &mut watch::Receiver<Arc<AgentConfig>>,
    metrics: &AgentMetrics,
    drain: &Drain,
) -> End {
    let Some(mut pings) = conn.ping_pong() else {
        return End {
            reason: "PING handle unavailable".into(),
            healthy: false,
            retired: None,
        };
    };
    let healthy = AtomicBool::new(false);
    let keepalive = async {
        loop {
            tokio::time::sleep(cfg.keepalive_interval).await;
            match tokio::time::timeout(cfg.keepalive_timeout, pings.ping(h2::Ping::opaque())).await
            {
                Ok(Ok(_)) => healthy.store(true, Ordering::Relaxed),
                Ok(Err(e)) => return format!("PING failed: {e}"),
                Err(_) => {
                    metrics.cx_destroy_keepalive.increment(1);
                    return format!("PING unanswered for {:?}", cfg.keepalive_timeout);
                }
            }
        }
    };
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
    let (reason, retire) = tokio::select! {
        r = &mut conn => (match r {
            Ok(()) => "closed by the seed proxy".into(),
            Err(e) => e.to_string(),
        }, false),
        why = keepalive => (why, false),
        _ = replaced => ("seed settings changed".into(), true),
        _ = drain.stopping() => ("agent stopping".into(), false),
    };
    End {
        reason,
        healthy: healthy.load(Ordering::Relaxed),
        retired: retire.then_some(conn),
    }
}

/// Waits up to `timeout` for a connection with room for another stream.
pub async fn ready(current: &mut Current, timeout: Duration) -> Option<SendRequest<Bytes>> {
    tokio::time::timeout(timeout, async {
        loop {
            let send = current.wait_for(Option::is_some).await.ok()?.clone()?;
            match send.ready().await {
                Ok(s) => return Some(s),
                // This connection is going away; wait for the next one.
                Err(_) => {
                    let _ = current.changed().await;
                }
            }
        }
    })
    .await
    .ok()
    .flatten()
}
