//! The part every listener shares once a route is chosen: connect upstream,
//! replay what the client already sent, relay until either side ends, the
//! connection idles out, its route expires after removal, or the process
//! stops. An endpoint leaving its cluster ends nothing (Envoy keeps such
//! connections too).

use std::sync::Arc;
use std::time::Duration;

use daemon::drain::Drain;
use daemon::relay::{RelayEnd, RelayOptions, Tally, relay};
use metrics::{Counter, Gauge};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::ProxyConfig;
use crate::metrics::Metrics;
use crate::store::TableStore;
use crate::table::{Route, UpstreamEndpoint};
use crate::upstream::ConnectOptions;

/// What every connection handler needs.
pub struct Shared {
    pub config: ProxyConfig,
    pub table: Arc<TableStore>,
    pub metrics: Arc<Metrics>,
    pub drain: Drain,
    pub connect: ConnectOptions,
}

/// Increments a gauge now and decrements it when dropped.
pub struct Active(Gauge);

impl Active {
    pub fn new(g: &Gauge) -> Self {
        g.increment(1.0);
        Active(g.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Byte counts to the downstream (listener-kind) and cluster counters.
pub struct ByteCounters {
    pub downstream_rx: Counter,
    pub downstream_tx: Counter,
    pub upstream_tx: Counter,
    pub upstream_rx: Counter,
}

impl Tally for ByteCounters {
    fn client_bytes(&self, n: u64) {
        self.downstream_rx.increment(n);
        self.upstream_tx.increment(n);
    }

    fn upstream_bytes(&self, n: u64) {
        self.upstream_rx.increment(n);
        self.downstream_tx.increment(n);
    }
}

/// Relays `client` and `upstream` (already connected to `endpoint`) after
/// writing `early` (bytes the client sent while the route was chosen).
#[allow(clippy::too_many_arguments)]
pub async fn forward<C>(
    client: C,
    early: &[u8],
    route: &Route,
    mut upstream: TcpStream,
    endpoint: Arc<UpstreamEndpoint>,
    idle: Duration,
    bytes: &ByteCounters,
    shared: &Shared,
) -> RelayEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let _active = Active::new(&route.cluster.stats.upstream_cx_active);
    if !early.is_empty() {
        if let Err(e) = upstream.write_all(early).await {
            return RelayEnd::UpstreamError(e);
        }
        bytes.client_bytes(early.len() as u64);
    }
    let options = RelayOptions {
        buffer_size: shared.config.buffer_size,
        idle_timeout: Some(idle).filter(|d| !d.is_zero()),
    };
    let stop = async {
        tokio::select! {
            _ = route.life.expired() => {}
            _ = shared.drain.stopping() => {}
        }
    };
    let (end, moved) = relay(client, upstream, options, bytes, stop).await;
    tracing::debug!(
        route = %route.key,
        upstream = %endpoint.addr,
        reason = end.reason(),
        from_client = moved.from_client,
        from_upstream = moved.from_upstream,
        "connection closed"
    );
    end
}
