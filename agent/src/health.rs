//! Health port (`/healthz`, `/readyz`, `/ready`, `/metrics`) and admin port
//! (`/metrics` redirects to the health port), as upstream's agent serves them.

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
        "/metrics" => Reply::metrics(metrics.render()),
        _ => Reply::not_found(),
    })
}

pub fn admin_handler(health_port: u16) -> Handler {
    Arc::new(move |head| match head.path {
        "/metrics" => {
            let host = head.host.unwrap_or("127.0.0.1");
            // Strip a port, keeping IPv6 brackets.
            let host = match host.rsplit_once(':') {
                Some((h, p))
                    if p.chars().all(|c| c.is_ascii_digit())
                        && (!h.contains(':') || h.ends_with(']')) =>
                {
                    h
                }
                _ => host,
            };
            let query = head.query.map(|q| format!("?{q}")).unwrap_or_default();
            Reply::redirect(format!("http://{host}:{health_port}/metrics{query}"))
        }
        _ => Reply::not_found(),
    })
}
