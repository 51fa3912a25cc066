//! The stats/health listener (`-envoy-stats-port`, 8002): `/healthz` answers
//! 200 until shutdown begins and 503 after, so probes and load balancers stop
//! sending traffic before listeners close, and lists problems that leave the
//! proxy serving (see [`Health`]); `/ready` answers 200 only while the proxy
//! serves its source's table (readiness.rs); `/stats/prometheus` (and
//! `/stats`) serve the metrics.

pub mod cluster_stats;
pub mod metrics;

use std::sync::Arc;

use daemon::drain::Drain;
use daemon::endpoints::{Handler, Reply, serve};
use http::StatusCode;
use tokio::net::TcpListener;

use crate::health::Health;
use crate::stats::metrics::Metrics;

pub async fn run(listener: TcpListener, metrics: Arc<Metrics>, health: Arc<Health>, drain: Drain) {
    let handler: Handler = Arc::new(move |head| match head.path {
        "/healthz" | "/ready" => {
            let (ok, body) = if head.path == "/ready" {
                health.ready()
            } else {
                health.report()
            };
            let status = if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            Reply::text(status, body)
        }
        "/stats/prometheus" | "/stats" | "/metrics" => {
            // Envoy's `usedonly`, the default here: `?usedonly=false` adds
            // the series of clusters that never carried traffic.
            let used_only = !head
                .query
                .is_some_and(|q| q.split('&').any(|p| p == "usedonly=false"));
            let metrics = metrics.clone();
            Reply::metrics_streamed(move |sink| metrics.render_to(used_only, sink))
        }
        _ => Reply::not_found(),
    });
    serve(listener, "stats", handler, drain).await
}
