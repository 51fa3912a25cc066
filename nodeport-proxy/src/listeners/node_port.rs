//! NodePort listeners: one per exposed node port, opened and closed as the
//! routing table changes. Closing a listener leaves its connections to the
//! route's drain.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use daemon::listen::{AcceptOptions, accept_loop};
use link::debug_connections::CloseReason;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::relay::access_log::Access;
use crate::relay::session::{Active, Downstream, Listener, Session, Shared};
use crate::stats::metrics::ListenerStats;

/// First wait before binding a node port again, doubled per failure up to
/// [`BIND_RETRY_MAX`].
const BIND_RETRY_FIRST: Duration = Duration::from_secs(1);
const BIND_RETRY_MAX: Duration = Duration::from_secs(30);

/// A node port in the table that could not be bound.
struct Unbound {
    failures: u32,
    retry_at: Instant,
    error: String,
}

/// Runs until the drain starts, keeping one listener per node port in the
/// table. A port that cannot be bound (taken by another process, say) is
/// retried with back-off, listed in `/healthz` and counted in metrics, and
/// logged as an error once per distinct cause.
pub async fn manage(shared: Arc<Shared>, prebound: Vec<TcpListener>) {
    let mut prebound: HashMap<u16, TcpListener> = prebound
        .into_iter()
        .filter_map(|l| l.local_addr().ok().map(|a| (a.port(), l)))
        .collect();
    let mut running: BTreeMap<u16, CancellationToken> = BTreeMap::new();
    let mut unbound: BTreeMap<u16, Unbound> = BTreeMap::new();
    let mut status = shared.table.subscribe();
    loop {
        let table = shared.table.current();
        running.retain(|port, stop| {
            let keep = table.node_ports.contains_key(port);
            if !keep {
                tracing::info!(port, "closing NodePort listener");
                stop.cancel();
            }
            keep
        });
        unbound.retain(|port, _| {
            let keep = table.node_ports.contains_key(port);
            if !keep {
                shared.health.set_unbound(*port, None);
            }
            keep
        });
        let now = Instant::now();
        for port in table.node_ports.keys() {
            if running.contains_key(port) || unbound.get(port).is_some_and(|u| u.retry_at > now) {
                continue;
            }
            let addr = SocketAddr::new(shared.config.node_port_bind_address, *port);
            let bound = match prebound.remove(port) {
                Some(l) => Ok(l),
                None => daemon::listen::bind_tcp(&addr.ip().to_string(), *port).await,
            };
            match bound {
                Ok(listener) => {
                    if let Some(u) = unbound.remove(port) {
                        tracing::info!(%addr, failures = u.failures, "NodePort listener bound after earlier failures");
                        shared.health.set_unbound(*port, None);
                    }
                    let stop = CancellationToken::new();
                    running.insert(*port, stop.clone());
                    tokio::spawn(serve(listener, *port, shared.clone(), stop));
                }
                Err(e) => {
                    shared.metrics.node_port_bind_failures.increment(1);
                    let u = unbound.entry(*port).or_insert(Unbound {
                        failures: 0,
                        retry_at: now,
                        error: String::new(),
                    });
                    u.failures += 1;
                    let wait = BIND_RETRY_FIRST
                        .saturating_mul(1 << (u.failures - 1).min(10))
                        .min(BIND_RETRY_MAX);
                    u.retry_at = now + wait;
                    let error = e.to_string();
                    if u.error != error {
                        tracing::error!(%addr, %error, retry_in = ?wait, "cannot bind NodePort listener; retrying with back-off");
                    } else {
                        tracing::debug!(%addr, %error, retry_in = ?wait, failures = u.failures, "NodePort listener still not bound");
                    }
                    shared.health.set_unbound(
                        *port,
                        Some(format!(
                            "binding {addr}: {error} ({} attempts so far; retrying)",
                            u.failures
                        )),
                    );
                    u.error = error;
                }
            }
        }
        shared.metrics.node_ports_unbound.set(unbound.len() as f64);
        let retry = unbound.values().map(|u| u.retry_at).min();
        drop(table);
        tokio::select! {
            r = status.changed() => if r.is_err() { break },
            _ = shared.drain.draining() => break,
            _ = sleep_until(retry), if retry.is_some() => {}
        }
    }
    for stop in running.values() {
        stop.cancel();
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

async fn serve(listener: TcpListener, port: u16, shared: Arc<Shared>, stop: CancellationToken) {
    let addr = listener
        .local_addr()
        .map(|a| format!("{}_{}", a.ip(), a.port()))
        .unwrap_or_else(|_| port.to_string());
    tracing::info!(port, "serving NodePort listener");
    let stats = shared.metrics.listener(&addr);
    let options = AcceptOptions {
        max_connections: Some(Arc::new(Semaphore::new(
            shared.config.max_connections_per_listener,
        ))),
        ..AcceptOptions::default()
    };
    let drain = shared.drain.clone();
    let handler = move |io: TcpStream, peer: String, permit| {
        handle(
            io,
            peer.parse().ok(),
            port,
            shared.clone(),
            stats.clone(),
            permit,
        )
    };
    tokio::select! {
        _ = accept_loop(listener, "nodeport", drain, options, handler) => {}
        _ = stop.cancelled() => {}
    }
}

/// One NodePort connection from `peer` (the address the accept returned),
/// holding `permit` (its place under the listener's connection limit)
/// until it ends.
///
/// Not an `async fn`: one keeps its parameters twice (as passed and as moved
/// into its body), and this future is most of what a held connection costs
/// (`a_nodeport_connection_is_a_small_task`).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its parameters twice"
)]
fn handle(
    client: TcpStream,
    peer: Option<SocketAddr>,
    port: u16,
    shared: Arc<Shared>,
    listener: ListenerStats,
    permit: Option<OwnedSemaphorePermit>,
) -> impl Future<Output = ()> + Send {
    async move {
        // Held (in the future, not copied out of it) until the end.
        let _permit = &permit;
        listener.downstream_cx_total.increment(1);
        let _active = Active::new(&listener.downstream_cx_active);
        shared.metrics.tcp.downstream_cx_total.increment(1);
        if let Err(e) = shared.config.connection.downstream_keepalive.apply(&client) {
            tracing::debug!(error = %e, "client keepalive not set");
        }
        let expect = shared.config.accept_proxy_protocol.node_ports;
        let peer = peer.or_else(|| client.peer_addr().ok());
        let conn = shared.connections.open("nodeport", peer);
        conn.set_target(format_args!("node port {port}"));
        let (downstream, early) = match Downstream::of(&client, peer, expect, &shared).await {
            Ok(d) => d,
            Err(e) => {
                conn.set_close(e.cause(), e.reason());
                listener.reject(e.reason());
                tracing::debug!(port, error = %e, "NodePort connection closed");
                return;
            }
        };
        conn.set_source(downstream.source);
        let mut access = Access::start(
            shared.access_log.as_ref(),
            Some(downstream.local),
            Some(downstream.source),
        );
        let Some(route) = shared.table.current().node_ports.get(&port).cloned() else {
            // The port left the table between accept and lookup.
            access.answer(0, "NR", "no_route");
            conn.set_close(CloseReason::DialRefused, "no_route");
            listener.reject("no_route");
            shared.metrics.tcp.downstream_cx_no_route.increment(1);
            return;
        };
        let mut session = Session {
            shared: &shared,
            listener: Listener::NodePort,
            downstream,
            route,
            conn: &conn,
            access: &mut access,
        };
        if !session.admitted() {
            session.access.cluster(session.route.cluster.name.as_str());
            session.access.answer(0, "RBAC", "source_denied");
            conn.set_close(CloseReason::DialRefused, "source_denied");
            listener.reject("source_denied");
            return;
        }
        let upstream = match session.connect(early.len()).await {
            Ok(u) => u,
            Err(e) => {
                conn.set_close(e.cause(), e.reason());
                listener.reject(e.reason());
                tracing::warn!(port, error = %e, "NodePort connection closed");
                return;
            }
        };
        session
            .relay(link::duplex::Plain(client), early.into(), upstream)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a held NodePort connection costs in task state: tokio allocates
    /// the whole future once per connection, for its life, relay included.
    /// 1,808 bytes in a debug build, 1,752 in release (1,880 while the
    /// relay also waited on the drain itself; 2,912 while this
    /// function, `Session::relay` and `link::splice::relay` were `async fn`s
    /// keeping their parameters twice and the relay waited with
    /// `readable()`): with tokio's task header the allocation is then 2,048
    /// bytes, an allocator size class below 2,560.
    #[tokio::test]
    async fn a_nodeport_connection_is_a_small_task() {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let shared = crate::relay::session::test_shared();
        let stats = shared.metrics.listener("test");
        let client = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let size = size_of_val(&handle(client, None, addr.port(), shared, stats, None));
        eprintln!("NodePort connection future: {size} bytes");
        assert!(size <= 1984, "NodePort connection future: {size} bytes");
    }
}
