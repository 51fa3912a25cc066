//! Holds the current routing table, swaps in new ones atomically, and retires
//! what a swap removed: connections on a removed route or endpoint keep
//! running until they end or the drain timeout passes.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use daemon::drain::Drain;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::routing::index::{Index, ObjKey};
use crate::routing::model::{EndpointSlice, Inventory, Service};
use crate::routing::plan::PlanOptions;
use crate::routing::table::RoutingTable;
use crate::stats::metrics::{Metrics, ReloadResult};

/// One object added, changed (`Some`) or deleted (`None`), or the end of
/// a list of every object of a kind.
#[derive(Debug, Clone)]
pub enum Change {
    Service(ObjKey, Option<Service>),
    Slice(ObjKey, Option<EndpointSlice>),
    /// A (re)list of every Service ended: those held and not listed are
    /// deleted. The index, not the watch, knows what is held, so a source
    /// keeps no second copy of every key (issue 21: memory per route).
    ServicesListed(HashSet<ObjKey>),
    /// Likewise for EndpointSlices.
    SlicesListed(HashSet<ObjKey>),
}

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
    /// Since when loads have been failing (the first failure after the
    /// last success); `None` while the last load succeeded.
    pub failing_since: Option<std::time::Instant>,
}

pub struct TableStore {
    current: ArcSwap<RoutingTable>,
    status: watch::Sender<TableStatus>,
    /// What the table is derived from; changes are applied to it one at a
    /// time, each followed by a table built from the keys it changed.
    index: Mutex<Index>,
    drain_timeout: Duration,
    drain: Drain,
    /// Set (under the index lock) once the process stops: every route then
    /// expires, those of tables published later at once.
    stopped: std::sync::atomic::AtomicBool,
    metrics: Arc<Metrics>,
    /// Runs at the start of every whole-inventory apply (tests make it
    /// slow, to show nothing waits for it).
    #[cfg(test)]
    pub(crate) before_apply: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
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
            index: Mutex::new(Index::new(options)),
            drain_timeout,
            drain,
            stopped: std::sync::atomic::AtomicBool::new(false),
            metrics,
            #[cfg(test)]
            before_apply: Mutex::new(None),
        }
    }

    /// Ends every route's connections once the process stops, including
    /// routes of tables published after that: a relay then waits on its
    /// route's lifetime alone, one future less for each held connection
    /// (issue 39).
    pub async fn expire_when_stopping(self: Arc<Self>) {
        self.drain.stopping().await;
        // Off the workers: a publish at seed scale holds the index lock for
        // a while.
        let _ = tokio::task::spawn_blocking(move || {
            let _index = self.index.lock();
            self.stopped
                .store(true, std::sync::atomic::Ordering::Release);
            expire_all(&self.current());
        })
        .await;
    }

    pub fn current(&self) -> Arc<RoutingTable> {
        self.current.load_full()
    }

    pub fn subscribe(&self) -> watch::Receiver<TableStatus> {
        self.status.subscribe()
    }

    /// Makes the table serve exactly `inventory` (a whole file, say),
    /// re-evaluating only what differs from the current one. Returns
    /// whether the table changed. Takes long at seed scale: call it off the
    /// runtime's workers (`spawn_blocking`).
    pub fn apply(&self, inventory: &Inventory) -> bool {
        #[cfg(test)]
        if let Some(hook) = self.before_apply.lock().as_ref() {
            hook();
        }
        let mut index = self.index.lock();
        index.replace_all(inventory);
        self.publish(&mut index)
    }

    /// Applies individual changes (a Kubernetes watch's events) and then
    /// the table they lead to. Returns whether the table changed.
    pub fn apply_changes(&self, changes: Vec<Change>) -> bool {
        let mut index = self.index.lock();
        for c in &changes {
            // The index keeps its keys for as long as the object lives: copied
            // here, on the applying thread, rather than shared with the
            // caller's, which a Kubernetes watch allocates among the decoded
            // objects it frees at once (a page holding one kept key among
            // freed ones cannot be given back).
            match c {
                Change::Service(key, s) => {
                    index.service(&ObjKey::new(&key.namespace, &key.name), s.as_ref())
                }
                Change::Slice(key, s) => {
                    index.slice(&ObjKey::new(&key.namespace, &key.name), s.as_ref())
                }
                Change::ServicesListed(listed) => {
                    for key in index.service_keys_not_in(listed) {
                        index.service(&key, None);
                    }
                }
                Change::SlicesListed(listed) => {
                    for key in index.slice_keys_not_in(listed) {
                        index.slice(&key, None);
                    }
                }
            }
        }
        self.publish(&mut index)
    }

    /// Swaps in the table the index's changes lead to, if any.
    fn publish(&self, index: &mut Index) -> bool {
        for w in index.take_warnings() {
            tracing::warn!("{w}");
        }
        let delta = index.take_delta();
        let old = self.current.load_full();
        let changed = old.version == 0 || !delta.is_empty();
        if changed {
            let (next, retired) = old.update(index, &delta, &self.metrics);
            let next = Arc::new(next);
            if self.stopped.load(std::sync::atomic::Ordering::Acquire) {
                expire_all(&next);
            }
            self.current.store(next.clone());
            self.metrics
                .routes(next.node_ports.len(), next.sni.len(), next.tunnels.len());
            tracing::info!(
                version = next.version,
                node_ports = next.node_ports.len(),
                sni = next.sni.len(),
                tunnels = next.tunnels.len(),
                clusters = next.clusters.len(),
                services = index.service_count(),
                "routing table applied"
            );
            self.retire(retired);
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
            s.failing_since = None;
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
            s.failing_since.get_or_insert_with(std::time::Instant::now);
        });
    }

    fn retire(&self, gone: Vec<Arc<crate::routing::table::Lifetime>>) {
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

fn expire_all(table: &RoutingTable) {
    let routes = table
        .node_ports
        .values()
        .chain(table.sni.values())
        .chain(table.tunnels.values());
    for r in routes {
        r.life.expire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of Tunneling Services named `names`, each served by one
    /// loopback endpoint.
    fn inventory(names: &[&str]) -> Inventory {
        let services: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    r#"{{"metadata": {{"namespace": "ns", "name": "{n}", "uid": "{n}", "creationTimestamp": "2024-01-01T00:00:00Z", "annotations": {{"nodeport-proxy.k8s.io/expose": "Tunneling"}}}}, "spec": {{"type": "ClusterIP", "ports": [{{"name": "p", "port": 80, "protocol": "TCP"}}]}}}}"#
                )
            })
            .collect();
        let slices: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    r#"{{"metadata": {{"namespace": "ns", "name": "{n}-0", "labels": {{"kubernetes.io/service-name": "{n}"}}}}, "ports": [{{"name": "p", "port": 8080, "protocol": "TCP"}}], "endpoints": [{{"addresses": ["127.0.0.1"], "conditions": {{"ready": true}}}}]}}"#
                )
            })
            .collect();
        let text = format!(
            r#"{{"services": [{}], "endpointSlices": [{}]}}"#,
            services.join(","),
            slices.join(",")
        );
        crate::sources::source::parse(&text, true).unwrap_or_else(|e| panic!("{e}"))
    }

    fn lives(store: &TableStore) -> Vec<Arc<crate::routing::table::Lifetime>> {
        store
            .current()
            .tunnels
            .values()
            .map(|r| r.life.clone())
            .collect()
    }

    /// Relays wait on their route's lifetime alone (issue 39), so every
    /// route must expire when the process stops: those of the table in
    /// place, and those of a table published afterwards, at once.
    #[tokio::test]
    async fn every_route_expires_when_the_process_stops() {
        let drain = Drain::new();
        let store = Arc::new(TableStore::new(
            PlanOptions::default(),
            Duration::from_secs(600),
            drain.clone(),
            Metrics::new(),
        ));
        assert!(store.apply(&inventory(&["a", "b"])));
        let before = lives(&store);
        assert_eq!(before.len(), 2);
        tokio::spawn(store.clone().expire_when_stopping());
        let waiting = tokio::spawn({
            let l = before[0].clone();
            async move { l.expired().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "expired before the stop");
        assert!(drain.shutdown(Duration::ZERO).await);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap_or_else(|e| panic!("the relay's wait did not end: {e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        for l in &before {
            tokio::time::timeout(Duration::from_secs(5), l.expired())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // A table published after the stop: its new route is expired too.
        assert!(store.apply(&inventory(&["a", "b", "c"])));
        let after = lives(&store);
        assert_eq!(after.len(), 3);
        for l in &after {
            tokio::time::timeout(Duration::from_millis(100), l.expired())
                .await
                .unwrap_or_else(|e| panic!("a route published after the stop: {e}"));
        }
    }
}
