//! Holds the current routing table, swaps in new ones atomically, and retires
//! what a swap removed: connections on a removed route or endpoint keep
//! running until they end or the drain timeout passes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use daemon::drain::Drain;
use tokio::sync::watch;

use crate::metrics::{Metrics, ReloadResult};
use crate::model::Inventory;
use crate::plan::{PlanOptions, build};
use crate::table::RoutingTable;

/// What watchers of the table see.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableStatus {
    /// Version of the table being served (0: nothing loaded yet).
    pub version: u64,
    /// Load attempts so far, successful or not.
    pub loads: u64,
    /// Why the last load failed, if it did; the previous table stays.
    pub last_error: Option<String>,
    /// When the source last loaded, changed or not.
    pub last_success: Option<SystemTime>,
}

pub struct TableStore {
    current: ArcSwap<RoutingTable>,
    status: watch::Sender<TableStatus>,
    options: PlanOptions,
    drain_timeout: Duration,
    drain: Drain,
    metrics: Arc<Metrics>,
}

impl TableStore {
    pub fn new(
        options: PlanOptions,
        drain_timeout: Duration,
        drain: Drain,
        metrics: Arc<Metrics>,
    ) -> Self {
        TableStore {
            current: ArcSwap::from_pointee(RoutingTable::default()),
            status: watch::Sender::new(TableStatus::default()),
            options,
            drain_timeout,
            drain,
            metrics,
        }
    }

    pub fn current(&self) -> Arc<RoutingTable> {
        self.current.load_full()
    }

    pub fn subscribe(&self) -> watch::Receiver<TableStatus> {
        self.status.subscribe()
    }

    /// Builds a table from `inventory` and swaps it in if it differs from the
    /// current one. Returns whether it was swapped.
    pub fn apply(&self, inventory: &Inventory) -> bool {
        let (plan, warnings) = build(inventory, &self.options);
        for w in &warnings {
            tracing::warn!("{w}");
        }
        let old = self.current.load_full();
        let changed = old.version == 0 || old.plan != plan;
        if changed {
            let next = Arc::new(RoutingTable::assemble(plan, &old, &self.metrics));
            self.current.store(next.clone());
            self.metrics
                .routes(next.node_ports.len(), next.sni.len(), next.tunnels.len());
            tracing::info!(
                version = next.version,
                node_ports = next.node_ports.len(),
                sni = next.sni.len(),
                tunnels = next.tunnels.len(),
                clusters = next.clusters.len(),
                "routing table applied"
            );
            self.retire(old.retired_by(&next));
            self.metrics.reload(ReloadResult::Applied);
        } else {
            self.metrics.reload(ReloadResult::Unchanged);
        }
        let version = self.current.load().version;
        self.status.send_modify(|s| {
            s.version = version;
            s.loads += 1;
            s.last_error = None;
            s.last_success = Some(SystemTime::now());
        });
        changed
    }

    /// Records a load that failed; the current table stays in place. The
    /// caller reports each failure once (the file source only on a change).
    pub fn failed(&self, error: String) {
        tracing::error!(%error, "routing table not reloaded; keeping the current one");
        self.metrics.reload(ReloadResult::Failed);
        self.status.send_modify(|s| {
            s.loads += 1;
            s.last_error = Some(error);
        });
    }

    fn retire(&self, gone: Vec<Arc<crate::table::Lifetime>>) {
        if gone.is_empty() {
            return;
        }
        for l in &gone {
            l.retire();
        }
        let timeout = self.drain_timeout;
        let stopping = self.drain.clone();
        let gauge = self.metrics.draining_routes.clone();
        gauge.increment(gone.len() as f64);
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(timeout) => {}
                _ = stopping.stopping() => {}
            }
            gauge.decrement(gone.len() as f64);
            for l in gone {
                l.expire();
            }
        });
    }
}
