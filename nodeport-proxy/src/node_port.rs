//! NodePort listeners: one per exposed node port, opened and closed as the
//! routing table changes. Closing a listener leaves its connections to the
//! route's drain.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use daemon::listen::{AcceptOptions, accept_loop};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::forward::{Active, ByteCounters, Shared, forward};
use crate::metrics::ListenerStats;

/// Runs until the drain starts, keeping one listener per node port in the table.
pub async fn manage(shared: Arc<Shared>, prebound: Vec<TcpListener>) {
    let mut prebound: HashMap<u16, TcpListener> = prebound
        .into_iter()
        .filter_map(|l| l.local_addr().ok().map(|a| (a.port(), l)))
        .collect();
    let mut running: BTreeMap<u16, CancellationToken> = BTreeMap::new();
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
        for port in table.node_ports.keys() {
            if running.contains_key(port) {
                continue;
            }
            let listener = match prebound.remove(port) {
                Some(l) => l,
                None => {
                    let addr = SocketAddr::new(shared.config.node_port_bind_address, *port);
                    match daemon::listen::bind_tcp(&addr.ip().to_string(), *port).await {
                        Ok(l) => l,
                        Err(e) => {
                            // Retried on the next table change.
                            tracing::error!(%addr, error = %e, "cannot bind NodePort listener");
                            continue;
                        }
                    }
                }
            };
            let stop = CancellationToken::new();
            running.insert(*port, stop.clone());
            tokio::spawn(serve(listener, *port, shared.clone(), stop));
        }
        drop(table);
        tokio::select! {
            r = status.changed() => if r.is_err() { break },
            _ = shared.drain.draining() => break,
        }
    }
    for stop in running.values() {
        stop.cancel();
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
    let handler = move |io: TcpStream, _peer, permit| {
        let shared = shared.clone();
        let stats = stats.clone();
        async move {
            let _permit = permit;
            handle(io, port, shared, stats).await;
        }
    };
    tokio::select! {
        _ = accept_loop(listener, "nodeport", drain, options, handler) => {}
        _ = stop.cancelled() => {}
    }
}

async fn handle(client: TcpStream, port: u16, shared: Arc<Shared>, listener: ListenerStats) {
    listener.downstream_cx_total.increment(1);
    let _active = Active::new(&listener.downstream_cx_active);
    shared.metrics.tcp.downstream_cx_total.increment(1);
    if let Err(e) = shared.config.connection.downstream_keepalive.apply(&client) {
        tracing::debug!(error = %e, "client keepalive not set");
    }
    let Some(route) = shared.table.current().node_ports.get(&port).cloned() else {
        // The port left the table between accept and lookup.
        listener.reject("no_route");
        shared.metrics.tcp.downstream_cx_no_route.increment(1);
        return;
    };
    let (upstream, endpoint) = match crate::upstream::connect(&route.cluster, &shared.connect).await
    {
        Ok(c) => c,
        Err(e) => {
            listener.reject("upstream_unavailable");
            tracing::warn!(port, error = %e, "NodePort connection closed");
            return;
        }
    };
    let tcp = &shared.metrics.tcp;
    let counters = ByteCounters {
        downstream_rx: tcp.downstream_cx_rx_bytes_total.clone(),
        downstream_tx: tcp.downstream_cx_tx_bytes_total.clone(),
        upstream_tx: route.cluster.stats.upstream_cx_tx_bytes_total.clone(),
        upstream_rx: route.cluster.stats.upstream_cx_rx_bytes_total.clone(),
    };
    let end = forward(
        client,
        &[],
        &route,
        upstream,
        endpoint,
        shared.config.node_port_idle_timeout,
        &counters,
        &shared,
    )
    .await;
    if matches!(end, daemon::relay::RelayEnd::Idle) {
        tcp.idle_timeout.increment(1);
    }
}
