//! The one HTTP/2 (h2c) connection to the seed proxy that every tunnel shares:
//! resolved and dialled again after every loss, with exponential back-off and
//! jitter, and declared dead when a PING goes unanswered.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use daemon::drain::Drain;
use h2::client::SendRequest;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::AgentConfig;
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
    #[error("connecting to the seed proxy timed out")]
    Timeout,
    #[error("HTTP/2 handshake with the seed proxy: {0}")]
    Handshake(h2::Error),
}

/// The current connection, if any; tunnels wait on it.
pub type Current = watch::Receiver<Option<SendRequest<Bytes>>>;

/// Keeps a connection up until the drain stops the agent.
pub async fn maintain(
    config: Arc<AgentConfig>,
    current: watch::Sender<Option<SendRequest<Bytes>>>,
    metrics: Arc<AgentMetrics>,
    drain: Drain,
) {
    let mut backoff = config.backoff_initial;
    loop {
        match dial(&config).await {
            Ok((send, conn)) => {
                metrics.cx_total.increment(1);
                metrics.cx_active.set(1.0);
                tracing::info!(proxy = %config.proxy_host, "connected to seed proxy");
                current.send_replace(Some(send));
                let end = drive(conn, &config, &metrics, &drain).await;
                current.send_replace(None);
                metrics.cx_active.set(0.0);
                if drain.is_stopping() {
                    return;
                }
                // Only a connection that proved healthy (a PING answered)
                // resets the back-off: a seed that accepts and then drops
                // every connection is retried ever more slowly, not in a loop.
                if end.healthy {
                    backoff = config.backoff_initial;
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
            _ = drain.stopping() => return,
        }
        backoff = (backoff * 2).min(config.backoff_max);
    }
}

async fn dial(
    config: &AgentConfig,
) -> Result<(SendRequest<Bytes>, h2::client::Connection<TcpStream, Bytes>), SeedError> {
    let attempt = async {
        let host = config.proxy_host.trim_matches(['[', ']']);
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
                    let (send, conn) = h2::client::Builder::new()
                        .initial_window_size(STREAM_WINDOW)
                        .initial_connection_window_size(CONNECTION_WINDOW)
                        .max_send_buffer_size(config.buffer_size)
                        .max_header_list_size(limits::MAX_HEADER_LIST_SIZE)
                        .max_pending_accept_reset_streams(limits::MAX_PENDING_ACCEPT_RESET_STREAMS)
                        .max_local_error_reset_streams(Some(limits::MAX_LOCAL_ERROR_RESET_STREAMS))
                        .handshake(io)
                        .await
                        .map_err(SeedError::Handshake)?;
                    return Ok((send, conn));
                }
                Err(source) => last = SeedError::Connect { addr, source },
            }
        }
        Err(last)
    };
    tokio::time::timeout(config.connect_timeout, attempt)
        .await
        .map_err(|_| SeedError::Timeout)?
}

/// How a seed connection ended.
struct End {
    reason: String,
    /// At least one PING was answered on it.
    healthy: bool,
}

/// Runs the connection until it fails, a PING times out, or the agent stops.
/// The connection is kept however long it idles: only a failure ends it.
async fn drive(
    mut conn: h2::client::Connection<TcpStream, Bytes>,
    config: &AgentConfig,
    metrics: &AgentMetrics,
    drain: &Drain,
) -> End {
    let Some(mut pings) = conn.ping_pong() else {
        return End {
            reason: "PING handle unavailable".into(),
            healthy: false,
        };
    };
    let healthy = std::sync::atomic::AtomicBool::new(false);
    let keepalive = async {
        loop {
            tokio::time::sleep(config.keepalive_interval).await;
            match tokio::time::timeout(config.keepalive_timeout, pings.ping(h2::Ping::opaque()))
                .await
            {
                Ok(Ok(_)) => healthy.store(true, std::sync::atomic::Ordering::Relaxed),
                Ok(Err(e)) => return format!("PING failed: {e}"),
                Err(_) => {
                    metrics.cx_destroy_keepalive.increment(1);
                    return format!("PING unanswered for {:?}", config.keepalive_timeout);
                }
            }
        }
    };
    let reason = tokio::select! {
        r = &mut conn => match r {
            Ok(()) => "closed by the seed proxy".into(),
            Err(e) => e.to_string(),
        },
        why = keepalive => why,
        _ = drain.stopping() => "agent stopping".into(),
    };
    End {
        reason,
        healthy: healthy.load(std::sync::atomic::Ordering::Relaxed),
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
