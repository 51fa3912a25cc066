//! The routing table connections look routes up in. It is an immutable
//! snapshot built from a [`Plan`]; a new one replaces it atomically. Routes
//! that survive a rebuild keep their [`Lifetime`], so their connections never
//! notice; routes that disappear are retired and their connections get the
//! route drain timeout to finish. Each route has its own lifetime, so a change
//! to one Service never touches another's connections. Endpoints have none:
//! as with Envoy's tcp_proxy, a connection to an endpoint that left its
//! cluster (not ready any more) runs on until it ends.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use crate::metrics::{ClusterStats, Metrics};
use crate::names::{ClusterName, ConnectAuthority, RouteKey, SniHost};
use crate::plan::Plan;

/// Whether a route is still in the table. `retired` fires when it
/// leaves the table, `expired` when its connections must end.
#[derive(Debug, Default)]
pub struct Lifetime {
    retired: CancellationToken,
    expired: CancellationToken,
}

impl Lifetime {
    pub fn is_retired(&self) -> bool {
        self.retired.is_cancelled()
    }

    /// Resolves once connections on this route/endpoint must close.
    pub async fn expired(&self) {
        self.expired.cancelled().await
    }

    pub(crate) fn retire(&self) {
        self.retired.cancel();
    }

    pub(crate) fn expire(&self) {
        self.expired.cancel();
    }
}

#[derive(Debug)]
pub struct UpstreamEndpoint {
    pub addr: SocketAddr,
}

pub struct Cluster {
    pub name: ClusterName,
    pub endpoints: Vec<Arc<UpstreamEndpoint>>,
    /// Shared with the cluster of the same name in later tables, so round
    /// robin carries on across reloads.
    next: Arc<AtomicUsize>,
    pub stats: ClusterStats,
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
    /// The endpoints in round-robin order starting at the next one.
    pub fn round_robin(&self) -> impl Iterator<Item = &Arc<UpstreamEndpoint>> {
        let n = self.endpoints.len();
        let start = if n == 0 {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed) % n
        };
        (0..n).filter_map(move |i| self.endpoints.get((start + i) % n))
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
    pub plan: Plan,
    pub node_ports: BTreeMap<u16, Arc<Route>>,
    pub sni: HashMap<SniHost, Arc<Route>>,
    pub tunnels: HashMap<ConnectAuthority, Arc<Route>>,
    pub clusters: BTreeMap<ClusterName, Arc<Cluster>>,
}

impl RoutingTable {
    /// Builds the table for `plan`, reusing `previous`'s lifetimes (and round
    /// robin positions) for whatever is unchanged.
    pub fn assemble(plan: Plan, previous: &RoutingTable, metrics: &Metrics) -> RoutingTable {
        let mut clusters = BTreeMap::new();
        for (name, addrs) in &plan.clusters {
            let old = previous.clusters.get(name);
            let endpoints = addrs
                .iter()
                .map(|addr| Arc::new(UpstreamEndpoint { addr: *addr }))
                .collect::<Vec<_>>();
            let stats = old
                .map(|c| c.stats.clone())
                .unwrap_or_else(|| metrics.cluster(name.as_str()));
            stats.membership_total.set(endpoints.len() as f64);
            stats.membership_healthy.set(endpoints.len() as f64);
            let cluster = Cluster {
                name: name.clone(),
                endpoints,
                next: old.map(|c| c.next.clone()).unwrap_or_default(),
                stats,
            };
            clusters.insert(name.clone(), Arc::new(cluster));
        }
        let route = |key: RouteKey, cluster: &ClusterName, old: Option<&Arc<Route>>| {
            let c = clusters.get(cluster)?.clone();
            let life = old
                .filter(|r| r.cluster.name == *cluster)
                .map(|r| r.life.clone())
                .unwrap_or_default();
            Some(Arc::new(Route {
                key,
                cluster: c,
                life,
            }))
        };
        let node_ports = plan
            .node_ports
            .iter()
            .filter_map(|(p, c)| {
                route(RouteKey::NodePort(*p), c, previous.node_ports.get(p)).map(|r| (*p, r))
            })
            .collect();
        let sni = plan
            .sni
            .iter()
            .filter_map(|(h, c)| {
                route(RouteKey::Sni(h.clone()), c, previous.sni.get(h)).map(|r| (h.clone(), r))
            })
            .collect();
        let tunnels = plan
            .tunnels
            .iter()
            .filter_map(|(a, c)| {
                route(RouteKey::Tunnel(a.clone()), c, previous.tunnels.get(a))
                    .map(|r| (a.clone(), r))
            })
            .collect();
        RoutingTable {
            version: previous.version + 1,
            plan,
            node_ports,
            sni,
            tunnels,
            clusters,
        }
    }

    fn lifetimes(&self) -> impl Iterator<Item = &Arc<Lifetime>> {
        self.node_ports
            .values()
            .chain(self.sni.values())
            .chain(self.tunnels.values())
            .map(|r| &r.life)
    }

    /// Lifetimes in `self` that `next` no longer carries.
    pub fn retired_by(&self, next: &RoutingTable) -> Vec<Arc<Lifetime>> {
        let kept: std::collections::HashSet<*const Lifetime> =
            next.lifetimes().map(Arc::as_ptr).collect();
        let mut gone: Vec<Arc<Lifetime>> = self
            .lifetimes()
            .filter(|l| !kept.contains(&Arc::as_ptr(l)))
            .cloned()
            .collect();
        // A lifetime can be listed twice (two routes never share one, but be safe).
        gone.sort_by_key(|l| Arc::as_ptr(l) as usize);
        gone.dedup_by_key(|l| Arc::as_ptr(l) as usize);
        gone
    }
}
