//! The routing table connections look routes up in. It is an immutable
//! snapshot; the next one is built from it and the keys the [`Index`]
//! reports changed, sharing everything else, and replaces it atomically. Routes
//! that survive a rebuild keep their [`Lifetime`], so their connections never
//! notice; routes that disappear are retired and their connections get the
//! route drain timeout to finish. Each route has its own lifetime, so a change
//! to one Service never touches another's connections. Endpoints have none:
//! as with Envoy's tcp_proxy, a connection to an endpoint that left its
//! cluster (not ready any more) runs on until it ends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::routing::index::{Delta, Index};
use crate::routing::names::{ClusterName, ConnectAuthority, RouteKey, SniHost};
use crate::routing::shards::Shards;
use crate::stats::metrics::{ClusterStats, Metrics};

/// Whether a route is still in the table: retired when it leaves the table,
/// expired when its connections must end. One atomic and one `Notify`:
/// a seed holds one per route.
#[derive(Debug, Default)]
pub struct Lifetime {
    state: AtomicU8,
    expired: Notify,
}

const RETIRED: u8 = 1;
const EXPIRED: u8 = 2;

impl Lifetime {
    pub fn is_retired(&self) -> bool {
        self.state.load(Ordering::Acquire) >= RETIRED
    }

    /// Resolves once connections on this route must close.
    pub async fn expired(&self) {
        loop {
            // Registered before the check, so an expiry in between is seen.
            let notified = self.expired.notified();
            if self.state.load(Ordering::Acquire) >= EXPIRED {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn retire(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                Some(s.max(RETIRED))
            });
    }

    pub(crate) fn expire(&self) {
        self.state.store(EXPIRED, Ordering::Release);
        self.expired.notify_waiters();
    }
}

pub struct Cluster {
    pub name: ClusterName,
    /// Shared with the index (one copy per cluster, issue 21).
    pub endpoints: Arc<[SocketAddr]>,
    /// Shared with the cluster of the same name in later tables, so round
    /// robin carries on across reloads.
    next: Arc<AtomicUsize>,
    pub stats: ClusterStats,
    /// Its Service's source allow-list and upstream PROXY header; `None`:
    /// open to all, nothing sent first.
    pub policy: Option<Arc<crate::routing::policy::ServicePolicy>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

impl Cluster {
    /// Whether `source` may connect through any listener.
    pub fn admits(&self, source: std::net::IpAddr) -> bool {
        self.policy
            .as_ref()
            .is_none_or(|p| p.source_ranges.allows(source))
    }

    pub fn upstream_proxy_protocol(&self) -> bool {
        self.policy
            .as_ref()
            .is_some_and(|p| p.upstream_proxy_protocol)
    }

    /// The endpoints in round-robin order starting at the next one.
    pub fn round_robin(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        let n = self.endpoints.len();
        let start = if n == 0 {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed) % n
        };
        (0..n).filter_map(move |i| self.endpoints.get((start + i) % n).copied())
    }
}

#[derive(Debug)]
pub struct Route {
    pub key: RouteKey,
    pub cluster: Arc<Cluster>,
    pub life: Arc<Lifetime>,
}

#[derive(Debug, Default)]
pub struct RoutingTable {
    /// Bumped on every applied change.
    pub version: u64,
    pub node_ports: BTreeMap<u16, Arc<Route>>,
    pub sni: Shards<SniHost, Arc<Route>>,
    pub tunnels: Shards<ConnectAuthority, Arc<Route>>,
    pub clusters: Shards<ClusterName, Arc<Cluster>>,
}

impl RoutingTable {
    /// The next table: `self` with the keys `delta` names looked up again in
    /// `index`. Everything else is shared with `self`; routes whose key and
    /// cluster stay keep their [`Lifetime`], clusters their stats and round
    /// robin position. Also returns the lifetimes of the routes that left.
    pub fn update(
        &self,
        index: &Index,
        delta: &Delta,
        metrics: &Metrics,
    ) -> (RoutingTable, Vec<Arc<Lifetime>>) {
        let mut cluster_changes = Vec::new();
        let mut keys: BTreeSet<RouteKey> = BTreeSet::new();
        for name in &delta.clusters {
            let old = self.clusters.get(name);
            let new = index.cluster(name).map(|addrs| {
                let endpoints = addrs.clone();
                let stats = old
                    .map(|c| c.stats.clone())
                    .unwrap_or_else(|| metrics.cluster(name));
                stats.membership_total().set(endpoints.len() as f64);
                stats.membership_healthy().set(endpoints.len() as f64);
                Arc::new(Cluster {
                    name: name.clone(),
                    endpoints,
                    next: old.map(|c| c.next.clone()).unwrap_or_default(),
                    stats,
                    policy: index.cluster_policy(name).cloned(),
                })
            });
            if new.is_none() {
                metrics.remove_cluster(name);
            }
            // Routes hold their cluster: those of a changed one are renewed.
            keys.extend(index.routes_of(name));
            cluster_changes.push((name.clone(), new));
        }
        let clusters = self.clusters.with_changes(cluster_changes);
        keys.extend(delta.node_ports.iter().map(|p| RouteKey::NodePort(*p)));
        keys.extend(delta.sni.iter().map(|h| RouteKey::Sni(h.clone())));
        keys.extend(delta.tunnels.iter().map(|a| RouteKey::Tunnel(a.clone())));
        let mut retired = Vec::new();
        let mut node_ports = None;
        let (mut sni, mut tunnels) = (Vec::new(), Vec::new());
        for key in keys {
            let (old, target) = match &key {
                RouteKey::NodePort(p) => (self.node_ports.get(p), index.node_port(*p)),
                RouteKey::Sni(h) => (self.sni.get(h), index.sni_host(h)),
                RouteKey::Tunnel(a) => (self.tunnels.get(a), index.tunnel(a)),
            };
            let cluster = target.and_then(|c| clusters.get(c));
            let route = cluster.map(|c| {
                let life = old
                    .filter(|r| r.cluster.name == c.name)
                    .map(|r| r.life.clone())
                    .unwrap_or_default();
                Arc::new(Route {
                    key: key.clone(),
                    cluster: c.clone(),
                    life,
                })
            });
            if let Some(old) = old
                && route
                    .as_ref()
                    .is_none_or(|r| !Arc::ptr_eq(&r.life, &old.life))
            {
                retired.push(old.life.clone());
            }
            match key {
                RouteKey::NodePort(p) => {
                    let np = node_ports.get_or_insert_with(|| self.node_ports.clone());
                    match route {
                        Some(r) => np.insert(p, r),
                        None => np.remove(&p),
                    };
                }
                RouteKey::Sni(h) => sni.push((h, route)),
                RouteKey::Tunnel(a) => tunnels.push((a, route)),
            }
        }
        let next = RoutingTable {
            version: self.version + 1,
            node_ports: node_ports.unwrap_or_else(|| self.node_ports.clone()),
            sni: self.sni.with_changes(sni),
            tunnels: self.tunnels.with_changes(tunnels),
            clusters,
        };
        (next, retired)
    }

    pub fn route_count(&self) -> usize {
        self.node_ports.len() + self.sni.len() + self.tunnels.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn expiry_reaches_every_waiter_before_and_after_it() {
        let life = Arc::new(Lifetime::default());
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let l = life.clone();
                tokio::spawn(async move { l.expired().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(!life.is_retired());
        life.retire();
        assert!(life.is_retired());
        life.expire();
        for w in waiting {
            tokio::time::timeout(std::time::Duration::from_secs(5), w)
                .await
                .unwrap_or_else(|_| panic!("a waiter missed the expiry"))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // Asked after the fact: at once.
        tokio::time::timeout(std::time::Duration::from_secs(5), life.expired())
            .await
            .unwrap_or_else(|_| panic!("expired() after expiry must not wait"));
        assert!(life.is_retired());
    }
}
