//! What `/healthz` and `/ready` say. `/healthz` (liveness) fails (503) only
//! while shutting down, so load balancers drain this instance first;
//! problems that leave it serving (a table file that does not load, a node
//! port that cannot be bound) keep it at 200 and are listed in the body, one
//! line each. `/ready` also fails until the source's first table is applied
//! and while the source is out of sync past its limit (readiness.rs).

pub mod readiness;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::health::readiness::Readiness;
use crate::routing::store::TableStatus;

pub struct Health {
    /// Set once shutdown begins.
    pub failing: AtomicBool,
    table: watch::Receiver<TableStatus>,
    pub readiness: std::sync::Arc<Readiness>,
    /// Node ports in the table without a listener, and why.
    unbound: Mutex<BTreeMap<u16, String>>,
}

impl Health {
    pub fn new(table: watch::Receiver<TableStatus>, readiness: std::sync::Arc<Readiness>) -> Self {
        Health {
            failing: AtomicBool::new(false),
            table,
            readiness,
            unbound: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn set_unbound(&self, port: u16, why: Option<String>) {
        let mut u = self.unbound.lock();
        match why {
            Some(w) => u.insert(port, w),
            None => u.remove(&port),
        };
    }

    /// The status and body `/healthz` answers with.
    pub fn report(&self) -> (bool, String) {
        let ok = !self.failing.load(Ordering::Relaxed);
        let mut body = String::from(if ok { "ok\n" } else { "draining\n" });
        let status = self.table.borrow().clone();
        if let Some(e) = &status.last_error {
            let since = status
                .last_success
                .map(|t| {
                    format!(
                        "; serving table version {} loaded {} ago",
                        status.version,
                        ago(t)
                    )
                })
                .unwrap_or_default();
            body.push_str(&format!("routing table: last reload failed: {e}{since}\n"));
        }
        for (port, why) in self.unbound.lock().iter() {
            body.push_str(&format!("node port {port}: not listening: {why}\n"));
        }
        (ok, body)
    }

    /// The status and body `/ready` answers with.
    pub fn ready(&self) -> (bool, String) {
        self.readiness.report(self.failing.load(Ordering::Relaxed))
    }
}

fn ago(t: SystemTime) -> String {
    let secs = t.elapsed().map(|d| d.as_secs()).unwrap_or(0);
    format!("{secs}s")
}
