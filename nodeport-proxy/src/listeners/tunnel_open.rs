//! What both CONNECT listeners (HTTP/1.1 in [`crate::listeners::tunnel`], HTTP/2 in
//! [`crate::listeners::tunnel_h2`]) share between a valid request and the 200: the
//! tunnel permit, the route, the upstream connection, and how a refusal is
//! counted and logged.

use std::sync::Arc;

use link::debug_connections::{CloseReason, Tracked};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::relay::access_log::Access;
use crate::relay::connect_request::RequestError;
use crate::relay::session::{Downstream, Listener, Session, Shared, Upstream};
use crate::routing::names::ConnectAuthority;
use crate::stats::metrics::ListenerStats;

/// Why a tunnel was not opened; each has one status.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("client: {0}")]
    Request(#[from] RequestError),
    #[error("client sent no complete request head within the timeout")]
    HeaderTimeout,
    #[error("no route for authority {0}")]
    NoRoute(ConnectAuthority),
    #[error("too many open tunnels")]
    Overloaded,
    #[error("client {0} is not in the allow-list of {1}")]
    Denied(std::net::SocketAddr, ConnectAuthority),
    #[error(transparent)]
    Upstream(#[from] crate::relay::upstream::UpstreamError),
}

impl TunnelError {
    pub fn status(&self) -> u16 {
        match self {
            TunnelError::Request(e) => e.status(),
            TunnelError::HeaderTimeout => 408,
            TunnelError::NoRoute(_) => 404,
            TunnelError::Denied(..) => 403,
            TunnelError::Overloaded | TunnelError::Upstream(_) => 503,
        }
    }

    /// Envoy's response flag for this refusal.
    fn flags(&self) -> &'static str {
        match self {
            TunnelError::Request(RequestError::NotConnect(_)) | TunnelError::NoRoute(_) => "NR",
            TunnelError::Request(_) => "DPE",
            TunnelError::HeaderTimeout => "-",
            TunnelError::Overloaded => "UO",
            TunnelError::Denied(..) => "RBAC",
            TunnelError::Upstream(e) => e.flags(),
        }
    }

    /// Why the tunnel ends, as counted.
    pub(crate) fn cause(&self) -> CloseReason {
        match self {
            TunnelError::Request(_) => CloseReason::ProtocolError,
            TunnelError::HeaderTimeout => CloseReason::ClientTimeout,
            TunnelError::NoRoute(_) | TunnelError::Denied(..) => CloseReason::DialRefused,
            TunnelError::Overloaded => CloseReason::Overloaded,
            TunnelError::Upstream(e) => e.cause(),
        }
    }

    pub(crate) fn reason(&self) -> &'static str {
        match self {
            TunnelError::Request(RequestError::NotConnect(_)) => "not_connect",
            TunnelError::Request(RequestError::TooLarge) => "request_too_large",
            TunnelError::Request(_) => "bad_request",
            TunnelError::HeaderTimeout => "request_header_timeout",
            TunnelError::NoRoute(_) => "no_route",
            TunnelError::Overloaded => "overloaded",
            TunnelError::Denied(..) => "source_denied",
            TunnelError::Upstream(e) => e.reason(),
        }
    }
}

/// Per-listener state shared by its connections.
pub struct TunnelListener {
    pub shared: Arc<Shared>,
    pub stats: ListenerStats,
    /// Open tunnels (HTTP/1.1 connections and HTTP/2 streams) on this listener.
    pub tunnels: Arc<Semaphore>,
    /// Client addresses that flooded, slowed (`-tunneling-flood-penalty`).
    pub penalty: Option<Arc<daemon::flood_penalty::FloodPenalty>>,
}

/// Everything between a valid CONNECT and the 200: the tunnel permit, the
/// route, admission, the upstream connection; the session carries them on.
pub(crate) async fn open<'a>(
    authority: &ConnectAuthority,
    l: &'a TunnelListener,
    downstream: Downstream,
    conn: &'a Tracked,
    access: &'a mut Access,
) -> Result<(Session<'a>, Upstream, OwnedSemaphorePermit), TunnelError> {
    let permit = l
        .tunnels
        .clone()
        .try_acquire_owned()
        .map_err(|_| TunnelError::Overloaded)?;
    let route = l
        .shared
        .table
        .current()
        .tunnels
        .get(authority)
        .cloned()
        .ok_or_else(|| TunnelError::NoRoute(authority.clone()))?;
    let mut session = Session {
        shared: &l.shared,
        listener: Listener::Tunnel,
        downstream,
        route,
        conn,
        access,
    };
    if !session.admitted() {
        return Err(TunnelError::Denied(downstream.source, authority.clone()));
    }
    let upstream = session.connect(0).await?;
    Ok((session, upstream, permit))
}

/// Counts a refused request and logs it at a level matching whose fault it is.
pub(crate) fn record_refusal(e: &TunnelError, l: &TunnelListener, access: &mut Access) {
    let http = &l.shared.metrics.http;
    access.answer(e.status(), e.flags(), e.reason());
    l.stats.reject(e.reason());
    if matches!(e, TunnelError::NoRoute(_)) {
        http.no_route.increment(1);
    }
    if e.status() >= 500 {
        http.downstream_rq_5xx.increment(1);
        tracing::warn!(error = %e, status = e.status(), "CONNECT refused");
    } else {
        http.downstream_rq_4xx.increment(1);
        tracing::debug!(error = %e, status = e.status(), "CONNECT refused");
    }
}
