//! Opening the upstream side of a connection: round robin over the cluster's
//! endpoints, a connect timeout per attempt, keepalive on the socket.

use std::io;
use std::time::{Duration, Instant};

use daemon::keepalive::TcpKeepalive;
use link::debug_connections::CloseReason;
use tokio::net::TcpStream;

use crate::routing::table::Cluster;

#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions {
    pub timeout: Duration,
    pub attempts: usize,
    pub keepalive: TcpKeepalive,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream cluster {0} has no ready endpoint")]
    NoEndpoints(String),
    #[error("upstream {addr} did not answer within {timeout:?}")]
    Timeout {
        addr: std::net::SocketAddr,
        timeout: Duration,
    },
    #[error("upstream {addr}: {source}")]
    Connect {
        addr: std::net::SocketAddr,
        source: io::Error,
    },
    #[error("upstream cluster {cluster} refused by its circuit breaker: {bound}")]
    Overflow {
        cluster: String,
        bound: crate::relay::admission::Overflow,
    },
}

impl UpstreamError {
    /// Why the connection ends, as counted.
    pub fn cause(&self) -> CloseReason {
        match self {
            UpstreamError::NoEndpoints(_) => CloseReason::DialRefused,
            UpstreamError::Timeout { .. } => CloseReason::DialTimeout,
            UpstreamError::Connect { .. } => CloseReason::DialFailed,
            UpstreamError::Overflow { .. } => CloseReason::Overloaded,
        }
    }

    /// Envoy's response flag for this failure.
    pub fn flags(&self) -> &'static str {
        match self {
            UpstreamError::NoEndpoints(_) => "UH",
            UpstreamError::Timeout { .. } | UpstreamError::Connect { .. } => "UF",
            UpstreamError::Overflow { .. } => "UO",
        }
    }

    /// The close reason of a connection that ended here.
    pub fn reason(&self) -> &'static str {
        match self {
            UpstreamError::Overflow { bound, .. } => bound.reason(),
            _ => "upstream_unavailable",
        }
    }
}

/// Connects to the next endpoints of `cluster` in turn until one answers.
pub async fn connect(
    cluster: &Cluster,
    options: &ConnectOptions,
) -> Result<(TcpStream, std::net::SocketAddr), UpstreamError> {
    let stats = &cluster.stats;
    if cluster.endpoints.is_empty() {
        stats.upstream_cx_none_healthy().increment(1);
        return Err(UpstreamError::NoEndpoints(cluster.name.to_string()));
    }
    let mut last = None;
    for ep in cluster.round_robin().take(options.attempts.max(1)) {
        let started = Instant::now();
        match tokio::time::timeout(options.timeout, TcpStream::connect(ep)).await {
            Ok(Ok(stream)) => {
                stats
                    .upstream_cx_connect_ms()
                    .record(started.elapsed().as_secs_f64() * 1000.0);
                stats.upstream_cx_total().increment(1);
                let _ = stream.set_nodelay(true);
                if let Err(e) = options.keepalive.apply(&stream) {
                    tracing::debug!(error = %e, "upstream keepalive not set");
                }
                return Ok((stream, ep));
            }
            Ok(Err(e)) => {
                stats.upstream_cx_connect_fail().increment(1);
                tracing::debug!(upstream = %ep, error = %e, "upstream connect failed");
                last = Some(UpstreamError::Connect {
                    addr: ep,
                    source: e,
                });
            }
            Err(_) => {
                stats.upstream_cx_connect_timeout().increment(1);
                tracing::debug!(upstream = %ep, "upstream connect timed out");
                last = Some(UpstreamError::Timeout {
                    addr: ep,
                    timeout: options.timeout,
                });
            }
        }
    }
    Err(last.unwrap_or_else(|| UpstreamError::NoEndpoints(cluster.name.to_string())))
}
