//! The stats/health listener (`-envoy-stats-port`, 8002): `/healthz` answers
//! 200 until shutdown begins and 503 after, so probes and load balancers stop
//! sending traffic before listeners close; `/stats/prometheus` (and `/stats`)
//! serve the metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use daemon::drain::Drain;
use daemon::endpoints::{Handler, Reply, serve};
use http::StatusCode;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

pub async fn run(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    failing: Arc<AtomicBool>,
    drain: Drain,
) {
    let handler: Handler = Arc::new(move |head| match head.path {
        "/healthz" | "/ready" => {
            if failing.load(Ordering::Relaxed) {
                Reply::text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
            } else {
                Reply::text(StatusCode::OK, "ok\n")
            }
        }
        "/stats/prometheus" | "/stats" | "/metrics" => Reply::metrics(metrics.render()),
        _ => Reply::not_found(),
    });
    serve(listener, "stats", handler, drain).await
}
