//! The SNI listener (`-envoy-sni-port`, 6443): read the ClientHello without
//! terminating TLS, pick the route by exact server name, and pass every byte
//! through untouched. Anything that is not a routable ClientHello within the
//! time and size limits is closed.

use std::net::SocketAddr;
use std::sync::Arc;

use link::debug_connections::{CloseReason, Tracked};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::Instrument;

use crate::limits::MAX_SNI_PREFIX;
use crate::relay::access_log::Access;
use crate::relay::client_hello::{self, Hello, HelloError};
use crate::relay::first_bytes;
use crate::relay::session::{Active, Downstream, Listener, Session, Shared};
use crate::relay::upstream::UpstreamError;
use crate::routing::names::SniHost;
use crate::routing::table::Route;
use crate::stats::metrics::{ListenerStats, Rejections};

/// Why an SNI connection was closed before reaching an upstream.
#[derive(Debug, thiserror::Error)]
pub enum SniError {
    #[error("client sent no complete ClientHello within the timeout")]
    Timeout,
    #[error("client closed before a complete ClientHello")]
    ClientClosed,
    #[error("client read failed: {0}")]
    ClientIo(std::io::Error),
    #[error("client: {0}")]
    Hello(#[from] HelloError),
    #[error("client sent no server name")]
    NoServerName,
    #[error("no route for server name {0}")]
    NoRoute(String),
    #[error(transparent)]
    ProxyHeader(#[from] crate::relay::proxy_protocol::ProxyHeaderError),
    #[error("client {0} is not in the allow-list of server name {1}")]
    Denied(SocketAddr, String),
    #[error(transparent)]
    Upstream(#[from] crate::relay::upstream::UpstreamError),
}

impl SniError {
    fn cause(&self) -> CloseReason {
        match self {
            SniError::Timeout => CloseReason::ClientTimeout,
            SniError::ClientClosed => CloseReason::ClientClosed,
            SniError::ClientIo(_) => CloseReason::ClientLost,
            SniError::Hello(_) | SniError::NoServerName => CloseReason::ProtocolError,
            SniError::NoRoute(_) | SniError::Denied(..) => CloseReason::DialRefused,
            SniError::ProxyHeader(e) => e.cause(),
            SniError::Upstream(e) => e.cause(),
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            SniError::Timeout => "client_hello_timeout",
            SniError::ClientClosed | SniError::ClientIo(_) => "client_closed",
            SniError::Hello(HelloError::NotTls) => "not_tls",
            SniError::Hello(HelloError::TooLarge(_)) => "client_hello_too_large",
            SniError::Hello(_) => "client_hello_malformed",
            SniError::NoServerName => "no_server_name",
            SniError::NoRoute(_) => "no_route",
            SniError::ProxyHeader(e) => e.reason(),
            SniError::Denied(..) => "source_denied",
            SniError::Upstream(e) => e.reason(),
        }
    }
}

/// A fatal TLS alert record, access_denied (49): what a refused client's TLS
/// library reports ("tlsv1 alert access denied") instead of a bare reset. It
/// is plaintext, as alerts before the ServerHello are.
const ACCESS_DENIED_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49];

/// One SNI connection from `peer` (the address the accept returned).
pub async fn handle(
    client: TcpStream,
    peer: Option<SocketAddr>,
    shared: Arc<Shared>,
    listener: ListenerStats,
) {
    listener.downstream_cx_total.increment(1);
    let active = Active::new(&listener.downstream_cx_active);
    shared.metrics.tcp.downstream_cx_total.increment(1);
    if let Err(e) = shared.config.connection.downstream_keepalive.apply(&client) {
        tracing::debug!(error = %e, "client keepalive not set");
    }
    let peer = peer.or_else(|| client.peer_addr().ok());
    let conn = shared.connections.open("sni", peer);
    conn.set_state("handshake");
    match serve(client, peer, &shared, &conn).await {
        // The routed connection goes on in a task of its own, and this one
        // ends: a held connection costs that task's memory alone, and a
        // silent one, not yet routed, only this task's smaller one.
        Ok(routed) => {
            let drain = shared.drain.clone();
            let held = Held {
                shared,
                conn,
                rejected: listener.rejections(),
                _active: active,
                _slot: daemon::listen::hand_off(),
            };
            drain.spawn(routed_task(held, routed).instrument(tracing::Span::current()));
        }
        Err(e) => closed(e, &shared, &conn, &listener.rejections()),
    }
}

/// Counts, records and logs why a connection closed before its relay.
fn closed(e: SniError, shared: &Shared, conn: &Tracked, rejected: &Rejections) {
    conn.set_close(e.cause(), e.reason());
    rejected.count(e.reason());
    if matches!(e, SniError::NoRoute(_) | SniError::NoServerName) {
        shared.metrics.tcp.downstream_cx_no_route.increment(1);
    }
    match &e {
        SniError::Upstream(_) => tracing::warn!(error = %e, "SNI connection closed"),
        _ => tracing::debug!(error = %e, "SNI connection closed"),
    }
}

/// A connection whose ClientHello named a route.
pub(crate) struct Routed {
    client: TcpStream,
    hello: Vec<u8>,
    host: SniHost,
    downstream: Downstream,
    route: Arc<Route>,
}

/// What a routed connection's task owns besides the connection.
pub(crate) struct Held {
    shared: Arc<Shared>,
    conn: Tracked,
    rejected: Rejections,
    _active: Active,
    /// Its place in the listener's connection limit.
    _slot: daemon::listen::SlotHandle,
}

async fn serve(
    client: TcpStream,
    peer: Option<SocketAddr>,
    shared: &Shared,
    conn: &Tracked,
) -> Result<Routed, SniError> {
    let (downstream, mut buf) = Box::pin(Downstream::of(
        &client,
        peer,
        shared.config.accept_proxy_protocol.sni,
        shared,
    ))
    .await?;
    conn.set_source(downstream.source);
    // Nothing is buffered until the client sends, and its bytes are parsed
    // only once enough have come for the ClientHello to be complete.
    let mut parse_at = 1;
    let host = tokio::time::timeout(shared.config.client_hello_timeout, async {
        loop {
            if buf.len() >= parse_at {
                match client_hello::parse(&buf)? {
                    Hello::Complete { sni: Some(host) } => return Ok(host),
                    Hello::Complete { sni: None } => return Err(SniError::NoServerName),
                    Hello::Incomplete => {}
                }
                parse_at = client_hello::min_complete_len(&buf).max(buf.len() + 1);
            }
            if buf.len() >= MAX_SNI_PREFIX {
                return Err(SniError::Hello(HelloError::TooLarge(buf.len())));
            }
            match first_bytes::read_some(&client, &mut buf, MAX_SNI_PREFIX).await {
                Ok(0) => return Err(SniError::ClientClosed),
                Ok(_) => {}
                Err(e) => return Err(SniError::ClientIo(e)),
            }
        }
    })
    .await
    .map_err(|_| SniError::Timeout)??;
    daemon::listen::settle();
    conn.set_target(&host);
    let table = shared.table.current();
    let route = table
        .sni
        .get(&host)
        .cloned()
        .ok_or_else(|| SniError::NoRoute(host.to_string()))?;
    drop(table);
    Ok(Routed {
        client,
        hello: buf,
        host,
        downstream,
        route,
    })
}

/// The routed connection's task: admission, the upstream connect and the
/// relay.
///
/// Not an `async fn`: one keeps its parameters twice (as passed and as
/// moved into its body) for the connection's life; the fields of `r` are
/// used in place for the same reason.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its parameters twice"
)]
pub(crate) fn routed_task(held: Held, mut r: Routed) -> impl Future<Output = ()> + Send + 'static {
    async move {
        // The whole of `held` is captured (its guards live as long as the
        // task), not only the fields used.
        let held = &held;
        let (shared, conn) = (&*held.shared, &held.conn);
        // Envoy logs only connections that reached a filter chain (a route)
        // and were admitted: a refused one has its line off until then.
        let mut access = Access::start(None, None, None);
        let mut session = Session {
            shared,
            listener: Listener::Sni,
            downstream: r.downstream,
            route: r.route,
            conn,
            access: &mut access,
        };
        if !session.admitted() {
            let _ = r.client.write_all(&ACCESS_DENIED_ALERT).await;
            let e = SniError::Denied(session.downstream.source, r.host.to_string());
            return closed(e, shared, conn, &held.rejected);
        }
        *session.access = Access::start(
            shared.access_log.as_ref(),
            Some(session.downstream.local),
            Some(session.downstream.source),
        );
        session.access.sni(r.host.as_str());
        conn.set_state("connecting");
        // Not matched around the relay: the match would keep the result for
        // the connection's life.
        let upstream = match session.connect(r.hello.len()).await {
            Ok(upstream) => upstream,
            Err(e) => {
                // A bound's refusal flags the client; any other failure
                // keeps a flagged client flagged (on its lane it no longer
                // reaches the bound).
                if let Some(lane) = &shared.slow_lane {
                    let ip = session.downstream.source.ip();
                    match e {
                        UpstreamError::Overflow { .. } => {
                            lane.flag(ip);
                            let clients = &shared.metrics.slow_lane_clients;
                            clients.set(lane.flagged() as f64);
                        }
                        _ => lane.extend(ip),
                    }
                }
                return closed(e.into(), shared, conn, &held.rejected);
            }
        };
        session
            .relay(link::duplex::Plain(r.client), r.hello.into(), upstream)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size_of_output<F, Fut>(_: F) -> usize
    where
        F: FnOnce(Held, Routed) -> Fut,
    {
        size_of::<Fut>()
    }

    /// What a held SNI connection costs in task state: once routed, the
    /// connection is this future's task alone (the handler's task, which
    /// read the ClientHello, has ended). 1,880 bytes in a debug build, 1,824
    /// in release: with tokio's task header and the span, the allocation is
    /// 2,048 bytes, an allocator size class below 2,560, with 40 bytes to
    /// spare (until issue 39 it was the 1,280-byte handler task plus a boxed
    /// 1,848-byte future in a 2,048-byte one).
    #[test]
    fn a_routed_sni_connection_is_one_small_task() {
        let size = size_of_output(routed_task);
        eprintln!("routed SNI connection future: {size} bytes");
        assert!(size <= 1920, "routed SNI connection future: {size} bytes");
    }
}
