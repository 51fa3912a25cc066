//! The health port (`/healthz`, `/readyz`, `/ready`, `/metrics`) and the admin
//! port (`/metrics`), with upstream's bodies and status codes; the admin port
//! (loopback by default) also lists tunnels at `/debug/connections` (ours).

use std::sync::Arc;

use daemon::endpoints::{Handler, Reply};
use http::StatusCode;

use crate::core::Core;

pub fn health_handler(core: Arc<Core>) -> Handler {
    Arc::new(move |head| match head.path {
        "/healthz" => Reply::ok(),
        "/readyz" | "/ready" => {
            if core.backends.ready() {
                Reply::ok()
            } else {
                Reply::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "no connection to any proxy agent",
                )
            }
        }
        "/metrics" => Reply::go_metrics(core.metrics.render()),
        _ => Reply::not_found(),
    })
}

pub fn admin_handler(core: Arc<Core>) -> Handler {
    Arc::new(move |head| match head.path {
        "/metrics" => Reply::go_metrics(core.metrics.render()),
        "/debug/connections" => core.debug.reply_local(head),
        _ => Reply::not_found(),
    })
}
