//! Health port (`/healthz`, `/readyz`, `/ready`, `/metrics`) and admin port
//! (`/metrics` redirects to the health port), as upstream's agent serves them;
//! the admin port (loopback by default) also lists connections at
//! `/debug/connections` (ours).

use std::net::SocketAddr;
use std::sync::Arc;

use daemon::endpoints::{Handler, Reply};
use http::StatusCode;

use crate::clientset::ClientSet;
use crate::metrics::Metrics;

pub fn health_handler(clients: Arc<ClientSet>, metrics: Arc<Metrics>) -> Handler {
    Arc::new(move |head| match head.path {
        "/healthz" => Reply::ok(),
        "/readyz" | "/ready" => {
            let connected = clients.connected() > 0;
            let mut body = String::from("[+]ping ok\n");
            if connected {
                body.push_str("[+]server-connected ok\n");
            } else {
                body.push_str("[-]server-connected failed: no servers connected\n");
                return Reply::text(StatusCode::SERVICE_UNAVAILABLE, body);
            }
            let verbose = head.query.is_some_and(|q| {
                q.split('&')
                    .any(|kv| kv == "verbose" || kv.starts_with("verbose="))
            });
            if verbose {
                body.push_str("check passed\n");
                Reply::text(StatusCode::OK, body)
            } else {
                Reply::ok()
            }
        }
        "/metrics" => Reply::go_metrics(metrics.render()),
        _ => Reply::not_found(),
    })
}

/// The admin port's `/metrics` sends clients to the health listener: at its
/// own address when it is bound to one, else at the address the client
/// reached the admin port on (never the client's `Host` header, which it
/// controls).
pub fn admin_handler(health: SocketAddr, debug: link::debug_connections::Connections) -> Handler {
    Arc::new(move |head| match head.path {
        "/debug/connections" => debug.reply_local(head),
        "/metrics" => {
            let ip = if health.ip().is_unspecified() {
                head.local.map_or(health.ip(), |a| a.ip())
            } else {
                health.ip()
            };
            let to = SocketAddr::new(ip, health.port());
            let query = head.query.map(|q| format!("?{q}")).unwrap_or_default();
            Reply::redirect(format!("http://{to}/metrics{query}"))
        }
        _ => Reply::not_found(),
    })
}
