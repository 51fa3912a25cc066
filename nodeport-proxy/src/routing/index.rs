//! KKP's `sync()` kept up to date change by change. Services and
//! EndpointSlices are held by name, slices also by the Service they belong
//! to, and every route key (node port, SNI host, tunnel authority) and
//! cluster by the Services that claim it. A change to one Service or slice
//! re-evaluates that Service and the keys it claims or claimed, and reports
//! which keys changed; nothing scans the whole inventory. Rebuilding from
//! scratch is applying every object to an empty index, so both paths share
//! one implementation (tests compare it with a direct transcription of the
//! rules, `routing/plan_tests.rs`).
//!
//! The rules (KKP's envoy-manager): Services are taken oldest first
//! (creation time, then UID, then namespace/name); a node port or tunnel
//! authority goes to its oldest claimant; a Service's SNI hosts go to it
//! only if none is owned by an older Service that got its hosts (one
//! conflict skips its whole mapping); a cluster exists for every Service
//! port some route of its Service uses, and every tunneled port, with the
//! Ready endpoints of the Service's slices; two ports naming the same
//! cluster leave it the newest.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::routing::expose::{ExposeTypes, port_mapping_of, service_expose};
use crate::routing::model::{
    EndpointSlice, Inventory, ObjectMeta, Protocol, Service, ServicePort, ServiceType, Timestamp,
};
use crate::routing::names::{ClusterName, ConnectAuthority, RouteKey, SniHost, tunnel_authority};
use crate::routing::plan::{Plan, PlanOptions};
use crate::routing::policy::ServicePolicy;

/// A Service or EndpointSlice: namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl ObjKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        ObjKey {
            namespace: shared_name(namespace),
            name: name.into(),
        }
    }

    fn of(m: &ObjectMeta) -> Self {
        Self::new(&m.namespace, &m.name)
    }
}

impl std::fmt::Display for ObjKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One copy of each namespace's (and slice port's) name in the process: a
/// seed has one namespace per user cluster with several Services and slices
/// in it, their ports are named alike, and each key (the index's, the
/// sources') would otherwise carry a copy of its own (issue 21: memory per
/// route). Names nothing holds any more are dropped whenever the set has
/// doubled since the last sweep.
fn shared_name(namespace: &str) -> Arc<str> {
    struct Names {
        set: BTreeSet<Arc<str>>,
        live_at_sweep: usize,
    }
    static NAMES: parking_lot::Mutex<Names> = parking_lot::const_mutex(Names {
        set: BTreeSet::new(),
        live_at_sweep: 0,
    });
    let mut names = NAMES.lock();
    if let Some(n) = names.set.get(namespace) {
        return n.clone();
    }
    if names.set.len() >= 2 * names.live_at_sweep + 64 {
        names.set.retain(|n| Arc::strong_count(n) > 1);
        names.live_at_sweep = names.set.len();
    }
    let n: Arc<str> = namespace.into();
    names.set.insert(n.clone());
    n
}

/// Which of two Services is older: the older one wins conflicts. Shared by
/// every claim of its Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Order(Arc<Age>);

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Age {
    created: Option<Timestamp>,
    uid: Box<str>,
    key: ObjKey,
}

impl std::ops::Deref for Order {
    type Target = Age;
    fn deref(&self) -> &Age {
        &self.0
    }
}

/// A small map kept as a sorted vector: most keys have one claimant, and a
/// B-tree node would cost a kilobyte for it.
#[derive(Debug, Clone)]
struct Sorted<K, V>(Vec<(K, V)>);

impl<K, V> Default for Sorted<K, V> {
    fn default() -> Self {
        Sorted(Vec::new())
    }
}

impl<K: Ord, V> Sorted<K, V> {
    fn insert(&mut self, k: K, v: V) {
        match self.0.binary_search_by(|(x, _)| x.cmp(&k)) {
            Ok(i) => self.0[i].1 = v,
            Err(i) => self.0.insert(i, (k, v)),
        }
    }

    fn remove(&mut self, k: &K) {
        if let Ok(i) = self.0.binary_search_by(|(x, _)| x.cmp(k)) {
            self.0.remove(i);
        }
        if self.0.capacity() > 2 * self.0.len() + 1 {
            self.0.shrink_to_fit();
        }
    }

    fn get(&self, k: &K) -> Option<&V> {
        let i = self.0.binary_search_by(|(x, _)| x.cmp(k)).ok()?;
        Some(&self.0[i].1)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn keys(&self) -> impl DoubleEndedIterator<Item = &K> {
        self.0.iter().map(|(k, _)| k)
    }

    fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

/// A Service's claim on a key through one of its ports (by index).
type Claim = (Order, usize);

/// A cluster as one Service port's claim holds it: its Ready endpoints and
/// the Service's connection policy (`None`: none, the common case).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClusterEntry {
    endpoints: Arc<[SocketAddr]>,
    policy: Option<Arc<ServicePolicy>>,
}

/// What changed since the last [`Index::take_delta`]: the keys whose route
/// (or cluster endpoints) must be looked up again.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Delta {
    pub node_ports: BTreeSet<u16>,
    pub sni: HashSet<SniHost>,
    pub tunnels: HashSet<ConnectAuthority>,
    pub clusters: HashSet<ClusterName>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.node_ports.is_empty()
            && self.sni.is_empty()
            && self.tunnels.is_empty()
            && self.clusters.is_empty()
    }
}

/// What a Service asks for when it is eligible at all, before conflicts.
#[derive(Debug, Default, Clone)]
struct Candidates {
    node_ports: Vec<(u16, usize, ClusterName)>,
    /// All or none: one host owned by an older Service drops every one.
    sni: Vec<(SniHost, usize, ClusterName)>,
    tunnels: Vec<(ConnectAuthority, usize, ClusterName)>,
}

/// What a held Service currently contributes: its candidates and the
/// claims filed for them.
struct Applied {
    order: Order,
    candidates: Candidates,
    sni_owner: bool,
    /// The cluster claims this Service holds (ports some route of it uses).
    used: Vec<(ClusterName, usize)>,
}

/// The part of an EndpointSlice the plan reads.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SliceEntry {
    service: Option<Arc<str>>,
    /// TCP ports with a number: name (empty when unnamed) and port.
    ports: Vec<(Arc<str>, u16)>,
    /// Addresses of endpoints whose Ready condition is explicitly true.
    ready: Vec<std::net::IpAddr>,
}

impl SliceEntry {
    fn from(s: &EndpointSlice) -> Self {
        let mut ready: Vec<_> = s
            .endpoints
            .iter()
            .filter(|e| e.conditions.ready == Some(true))
            .flat_map(|e| e.addresses.iter().copied())
            .collect();
        ready.sort_unstable();
        ready.dedup();
        SliceEntry {
            service: s.service_name().map(Arc::from),
            ports: s
                .ports
                .iter()
                .filter(|p| p.protocol == Protocol::Tcp)
                .filter_map(|p| {
                    let port = p.port.filter(|n| *n != 0)?;
                    Some((shared_name(p.name.as_deref().unwrap_or("")), port))
                })
                .collect(),
            ready,
        }
    }
}

#[derive(Default)]
struct SniClaims {
    /// Every eligible Service whose mapping names the host, with the
    /// cluster it would route to.
    claimants: Sorted<Order, ClusterName>,
    owner: Option<Order>,
}

/// The values keys had before a refresh touched them, to tell what changed.
#[derive(Default)]
struct Touched {
    node_ports: BTreeMap<u16, Option<(Claim, ClusterName)>>,
    tunnels: HashMap<ConnectAuthority, Option<(Claim, ClusterName)>>,
    sni: HashMap<SniHost, Option<ClusterName>>,
    clusters: HashMap<ClusterName, Option<ClusterEntry>>,
}

pub struct Index {
    options: PlanOptions,
    /// The Services held (exposed, in the namespace), reduced to what the
    /// plan reads.
    models: HashMap<ObjKey, Inputs>,
    applied: HashMap<ObjKey, Applied>,
    slices: HashMap<ObjKey, SliceEntry>,
    /// Slice names by the Service (namespace and name) they belong to.
    by_service: HashMap<ObjKey, Vec<Arc<str>>>,
    node_ports: BTreeMap<u16, Sorted<Claim, ClusterName>>,
    tunnels: HashMap<ConnectAuthority, Sorted<Claim, ClusterName>>,
    sni: HashMap<SniHost, SniClaims>,
    clusters: HashMap<ClusterName, Sorted<Claim, ClusterEntry>>,
    delta: Delta,
    warnings: Vec<String>,
    /// Services whose conflicts may have changed in the operation under way.
    reevaluated: BTreeSet<ObjKey>,
}

fn order_of(key: &ObjKey, s: &Service) -> Order {
    Order(Arc::new(Age {
        created: s.metadata.creation_timestamp,
        uid: s.metadata.uid.as_str().into(),
        key: key.clone(),
    }))
}

/// A Service reduced to what the plan reads: other annotations (often
/// large, such as kubectl's last-applied-configuration) and labels are not
/// kept.
#[derive(Debug, PartialEq)]
struct Inputs {
    order: Order,
    expose: ExposeTypes,
    service_type: ServiceType,
    ports: Box<[ServicePort]>,
    /// The port-mapping annotation as written.
    mapping: Option<Box<str>>,
    policy: Option<Arc<ServicePolicy>>,
}

impl Inputs {
    fn of(key: &ObjKey, s: &Service, expose: ExposeTypes) -> Self {
        Inputs {
            order: order_of(key, s),
            expose,
            service_type: s.spec.service_type,
            ports: s.spec.ports.clone().into(),
            mapping: s
                .metadata
                .annotations
                .get(crate::routing::expose::PORT_MAPPING_ANNOTATION_KEY)
                .map(|m| m.as_str().into()),
            policy: Some(ServicePolicy::of(s))
                .filter(|p| !p.is_open())
                .map(Arc::new),
        }
    }
}

impl Index {
    pub fn new(options: PlanOptions) -> Self {
        Index {
            options,
            models: HashMap::new(),
            applied: HashMap::new(),
            slices: HashMap::new(),
            by_service: HashMap::new(),
            node_ports: BTreeMap::new(),
            tunnels: HashMap::new(),
            sni: HashMap::new(),
            clusters: HashMap::new(),
            delta: Delta::default(),
            warnings: Vec::new(),
            reevaluated: BTreeSet::new(),
        }
    }

    /// Makes the index hold exactly `inventory`, re-evaluating only what
    /// differs from what it holds.
    pub fn replace_all(&mut self, inventory: &Inventory) {
        let mut dirty = BTreeSet::new();
        let mut seen = HashSet::new();
        for s in &inventory.services {
            let key = ObjKey::of(&s.metadata);
            if self.set_service(&key, Some(s)) {
                dirty.insert(key.clone());
            }
            seen.insert(key);
        }
        let gone: Vec<ObjKey> = self
            .models
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.set_service(&key, None);
            dirty.insert(key);
        }
        let mut seen = HashSet::new();
        for s in &inventory.endpoint_slices {
            let key = ObjKey::of(&s.metadata);
            dirty.extend(self.set_slice(&key, Some(s)));
            seen.insert(key);
        }
        let gone: Vec<ObjKey> = self
            .slices
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            dirty.extend(self.set_slice(&key, None));
        }
        for key in dirty {
            self.refresh(&key);
        }
        self.conflict_warnings();
    }

    /// Applies one Service added, changed (`Some`) or deleted (`None`).
    pub fn service(&mut self, key: &ObjKey, service: Option<&Service>) {
        if self.set_service(key, service) {
            self.refresh(key);
        }
        self.conflict_warnings();
    }

    /// Applies one EndpointSlice added, changed (`Some`) or deleted (`None`).
    pub fn slice(&mut self, key: &ObjKey, slice: Option<&EndpointSlice>) {
        for s in self.set_slice(key, slice) {
            self.refresh(&s);
        }
        self.conflict_warnings();
    }

    /// The keys changed since the last call.
    pub fn take_delta(&mut self) -> Delta {
        std::mem::take(&mut self.delta)
    }

    /// Lines about what was skipped since the last call (KKP warns about
    /// the same cases), for the Services that changed.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// The Services held whose keys `listed` lacks.
    pub fn service_keys_not_in(&self, listed: &HashSet<ObjKey>) -> Vec<ObjKey> {
        let held = self.models.keys();
        held.filter(|k| !listed.contains(*k)).cloned().collect()
    }

    /// The EndpointSlices held whose keys `listed` lacks.
    pub fn slice_keys_not_in(&self, listed: &HashSet<ObjKey>) -> Vec<ObjKey> {
        let held = self.slices.keys();
        held.filter(|k| !listed.contains(*k)).cloned().collect()
    }

    /// Services held.
    pub fn service_count(&self) -> usize {
        self.models.len()
    }

    pub fn node_port(&self, port: u16) -> Option<&ClusterName> {
        self.node_ports.get(&port)?.values().next()
    }

    pub fn tunnel(&self, authority: &ConnectAuthority) -> Option<&ClusterName> {
        self.tunnels.get(authority)?.values().next()
    }

    pub fn sni_host(&self, host: &SniHost) -> Option<&ClusterName> {
        let c = self.sni.get(host)?;
        c.claimants.get(c.owner.as_ref()?)
    }

    /// A cluster's Ready endpoints, sorted; `None` when no route uses it.
    pub fn cluster(&self, name: &ClusterName) -> Option<&Arc<[SocketAddr]>> {
        self.cluster_entry(name).map(|e| &e.endpoints)
    }

    /// The connection policy of a cluster's Service; `None`: open to all.
    pub fn cluster_policy(&self, name: &ClusterName) -> Option<&Arc<ServicePolicy>> {
        self.cluster_entry(name)?.policy.as_ref()
    }

    fn cluster_entry(&self, name: &ClusterName) -> Option<&ClusterEntry> {
        self.clusters.get(name)?.values().next_back()
    }

    /// The route keys whose cluster is `name`.
    pub fn routes_of(&self, name: &ClusterName) -> Vec<RouteKey> {
        let mut out = Vec::new();
        for (order, _) in self.clusters.get(name).into_iter().flat_map(|m| m.keys()) {
            let Some(a) = self.applied.get(&order.key) else {
                continue;
            };
            for (p, i, c) in &a.candidates.node_ports {
                if c == name && first_claim(self.node_ports.get(p)) == Some((order, *i)) {
                    out.push(RouteKey::NodePort(*p));
                }
            }
            for (t, i, c) in &a.candidates.tunnels {
                if c == name && first_claim(self.tunnels.get(t)) == Some((order, *i)) {
                    out.push(RouteKey::Tunnel(t.clone()));
                }
            }
            if a.sni_owner {
                for (h, _, c) in &a.candidates.sni {
                    if c == name {
                        out.push(RouteKey::Sni(h.clone()));
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The whole plan, as [`build`] returns it.
    pub fn plan(&self) -> Plan {
        let mut plan = Plan::default();
        for p in self.node_ports.keys() {
            if let Some(c) = self.node_port(*p) {
                plan.node_ports.insert(*p, c.clone());
            }
        }
        for a in self.tunnels.keys() {
            if let Some(c) = self.tunnel(a) {
                plan.tunnels.insert(a.clone(), c.clone());
            }
        }
        for h in self.sni.keys() {
            if let Some(c) = self.sni_host(h) {
                plan.sni.insert(h.clone(), c.clone());
            }
        }
        for name in self.clusters.keys() {
            if let Some(e) = self.cluster(name) {
                plan.clusters.insert(name.clone(), e.to_vec());
            }
        }
        plan
    }

    /// Stores (or drops) a Service; returns whether that differs from what
    /// was held. Only exposed Services in the namespace are held.
    fn set_service(&mut self, key: &ObjKey, service: Option<&Service>) -> bool {
        let kept = service
            .filter(|s| {
                self.options
                    .namespace
                    .as_deref()
                    .is_none_or(|ns| s.metadata.namespace == ns)
            })
            .and_then(|s| {
                let expose = service_expose(s, &self.options.expose_annotation_key)?;
                Some(Inputs::of(key, s, expose))
            });
        match kept {
            None => self.models.remove(key).is_some(),
            Some(s) => {
                if self.models.get(key) == Some(&s) {
                    return false;
                }
                self.models.insert(key.clone(), s);
                true
            }
        }
    }

    /// Stores (or drops) a slice; returns the Services whose endpoints it
    /// may have changed.
    fn set_slice(&mut self, key: &ObjKey, slice: Option<&EndpointSlice>) -> Vec<ObjKey> {
        let new = slice.map(SliceEntry::from);
        let old = self.slices.get(key);
        if old == new.as_ref() {
            return Vec::new();
        }
        // Shares the slice's copy of the Service's name.
        let owner = |e: &SliceEntry| {
            e.service.as_ref().map(|svc| ObjKey {
                namespace: key.namespace.clone(),
                name: svc.clone(),
            })
        };
        let mut affected = Vec::new();
        if let Some(svc) = old.and_then(owner) {
            if let Some(names) = self.by_service.get_mut(&svc) {
                names.retain(|n| *n != key.name);
                if names.is_empty() {
                    self.by_service.remove(&svc);
                }
            }
            affected.push(svc);
        }
        match new {
            Some(e) => {
                if let Some(svc) = owner(&e) {
                    let names = self.by_service.entry(svc.clone()).or_default();
                    if !names.contains(&key.name) {
                        names.push(key.name.clone());
                    }
                    if !affected.contains(&svc) {
                        affected.push(svc);
                    }
                }
                self.slices.insert(key.clone(), e);
            }
            None => {
                self.slices.remove(key);
            }
        }
        affected
    }

    /// Re-evaluates one Service after it or its slices changed: its
    /// candidates, the winners of every key it claims or claimed (an SNI
    /// host: of every host linked to it through shared claimants), and the
    /// clusters of every Service whose routes changed.
    fn refresh(&mut self, key: &ObjKey) {
        let mut warnings = Vec::new();
        let (candidates, order) = match self.models.get(key) {
            Some(s) => (
                self.candidates(key, s, &mut warnings),
                Some(s.order.clone()),
            ),
            None => (Candidates::default(), None),
        };
        let old = self.applied.remove(key);
        if old.is_none() && order.is_none() {
            return;
        }
        let mut t = Touched::default();
        let mut hosts = Vec::new();
        for c in old.iter().map(|a| &a.candidates).chain([&candidates]) {
            for (p, _, _) in &c.node_ports {
                let before = self.np_winner(*p);
                t.node_ports.entry(*p).or_insert(before);
            }
            for (a, _, _) in &c.tunnels {
                let before = self.tunnel_winner(a);
                t.tunnels.entry(a.clone()).or_insert(before);
            }
            for (h, _, _) in &c.sni {
                let before = self.sni_host(h).cloned();
                t.sni.entry(h.clone()).or_insert(before);
                hosts.push(h.clone());
            }
        }
        if let Some(old) = &old {
            for (p, i, _) in &old.candidates.node_ports {
                self.node_ports.remove_claim(p, &(old.order.clone(), *i));
            }
            for (a, i, _) in &old.candidates.tunnels {
                self.tunnels.remove_claim(a, &(old.order.clone(), *i));
            }
            for (h, _, _) in &old.candidates.sni {
                if let Some(c) = self.sni.get_mut(h) {
                    c.claimants.remove(&old.order);
                }
            }
            for (name, i) in &old.used {
                self.release_cluster(name, &(old.order.clone(), *i), &mut t);
            }
        }
        if let Some(order) = order {
            for (p, i, c) in &candidates.node_ports {
                self.node_ports
                    .entry(*p)
                    .or_default()
                    .insert((order.clone(), *i), c.clone());
            }
            for (a, i, c) in &candidates.tunnels {
                self.tunnels
                    .entry(a.clone())
                    .or_default()
                    .insert((order.clone(), *i), c.clone());
            }
            for (h, _, c) in &candidates.sni {
                self.sni
                    .entry(h.clone())
                    .or_default()
                    .claimants
                    .insert(order.clone(), c.clone());
            }
            self.applied.insert(
                key.clone(),
                Applied {
                    order,
                    candidates,
                    sni_owner: false,
                    used: Vec::new(),
                },
            );
        }
        let mut dirty: BTreeSet<ObjKey> = BTreeSet::new();
        dirty.insert(key.clone());
        for (p, before) in &t.node_ports {
            let after = self.np_winner(*p);
            if before.as_ref().map(|b| &b.0) != after.as_ref().map(|a| &a.0) {
                dirty.extend(
                    before
                        .iter()
                        .chain(after.iter())
                        .map(|(c, _)| c.0.key.clone()),
                );
            }
        }
        for (a, before) in &t.tunnels {
            let after = self.tunnel_winner(a);
            if before.as_ref().map(|b| &b.0) != after.as_ref().map(|a| &a.0) {
                dirty.extend(
                    before
                        .iter()
                        .chain(after.iter())
                        .map(|(c, _)| c.0.key.clone()),
                );
            }
        }
        self.resolve_sni(hosts, &mut t, &mut dirty);
        for d in &dirty {
            self.recompute_used(d, &mut t);
        }
        self.finish(t);
        self.reevaluated.extend(dirty);
        self.warnings.extend(warnings);
    }

    fn np_winner(&self, port: u16) -> Option<(Claim, ClusterName)> {
        let (c, n) = self.node_ports.get(&port)?.iter().next()?;
        Some((c.clone(), n.clone()))
    }

    fn tunnel_winner(&self, a: &ConnectAuthority) -> Option<(Claim, ClusterName)> {
        let (c, n) = self.tunnels.get(a)?.iter().next()?;
        Some((c.clone(), n.clone()))
    }

    /// Re-runs the oldest-first SNI rule over every Service linked to
    /// `seeds` through shared hosts (no other Service's outcome can change).
    fn resolve_sni(&mut self, seeds: Vec<SniHost>, t: &mut Touched, dirty: &mut BTreeSet<ObjKey>) {
        let mut queue: VecDeque<SniHost> = seeds.into();
        let mut hosts: HashSet<SniHost> = HashSet::new();
        let mut services: BTreeSet<Order> = BTreeSet::new();
        while let Some(h) = queue.pop_front() {
            if !hosts.insert(h.clone()) {
                continue;
            }
            let Some(c) = self.sni.get(&h) else {
                continue;
            };
            for o in c.claimants.keys() {
                if services.insert(o.clone())
                    && let Some(a) = self.applied.get(&o.key)
                {
                    queue.extend(a.candidates.sni.iter().map(|(h, _, _)| h.clone()));
                }
            }
        }
        for h in &hosts {
            let before = self.sni_host(h).cloned();
            t.sni.entry(h.clone()).or_insert(before);
        }
        let mut owned: HashMap<SniHost, Order> = HashMap::new();
        for o in &services {
            let Some(a) = self.applied.get_mut(&o.key) else {
                continue;
            };
            let wins = !a.candidates.sni.is_empty()
                && a.candidates
                    .sni
                    .iter()
                    .all(|(h, _, _)| !owned.contains_key(h));
            if wins {
                for (h, _, _) in &a.candidates.sni {
                    owned.insert(h.clone(), o.clone());
                }
            }
            if a.sni_owner != wins {
                a.sni_owner = wins;
                dirty.insert(o.key.clone());
            }
        }
        for h in &hosts {
            let empty = match self.sni.get_mut(h) {
                Some(c) => {
                    c.owner = owned.get(h).cloned();
                    c.claimants.is_empty()
                }
                None => false,
            };
            if empty {
                self.sni.remove(h);
            }
        }
    }

    /// Files the cluster claims of `key`'s ports that some route of it uses
    /// now, in place of those it held.
    fn recompute_used(&mut self, key: &ObjKey, t: &mut Touched) {
        let Some(a) = self.applied.get(key) else {
            return;
        };
        let order = a.order.clone();
        let old_used = a.used.clone();
        let mut ports: BTreeMap<usize, ClusterName> = BTreeMap::new();
        for (p, i, c) in &a.candidates.node_ports {
            if first_claim(self.node_ports.get(p)) == Some((&order, *i)) {
                ports.insert(*i, c.clone());
            }
        }
        // Every tunneled port has its cluster, routed or not (a port number
        // used twice routes to the first port only), as KKP's rules have it.
        for (_, i, c) in &a.candidates.tunnels {
            ports.insert(*i, c.clone());
        }
        if a.sni_owner {
            for (_, i, c) in &a.candidates.sni {
                ports.insert(*i, c.clone());
            }
        }
        let new_used: Vec<(ClusterName, usize)> = ports.into_iter().map(|(i, c)| (c, i)).collect();
        for (name, i) in &old_used {
            self.release_cluster(name, &(order.clone(), *i), t);
        }
        let policy = self.models.get(key).and_then(|s| s.policy.clone());
        let endpoints: Vec<ClusterEntry> = new_used
            .iter()
            .map(|(_, i)| ClusterEntry {
                endpoints: self.endpoints(key, *i),
                policy: policy.clone(),
            })
            .collect();
        for ((name, i), eps) in new_used.iter().zip(endpoints) {
            let before = self.cluster_entry(name).cloned();
            t.clusters.entry(name.clone()).or_insert(before);
            self.clusters
                .entry(name.clone())
                .or_default()
                .insert((order.clone(), *i), eps);
        }
        if let Some(a) = self.applied.get_mut(key) {
            a.used = new_used;
        }
    }

    fn release_cluster(&mut self, name: &ClusterName, claim: &Claim, t: &mut Touched) {
        let before = self.cluster_entry(name).cloned();
        t.clusters.entry(name.clone()).or_insert(before);
        self.clusters.remove_claim(name, claim);
    }

    /// Records in the delta every touched key whose value changed.
    fn finish(&mut self, t: Touched) {
        for (p, before) in t.node_ports {
            if self.node_port(p) != before.as_ref().map(|b| &b.1) {
                self.delta.node_ports.insert(p);
            }
        }
        for (a, before) in t.tunnels {
            if self.tunnel(&a) != before.as_ref().map(|b| &b.1) {
                self.delta.tunnels.insert(a);
            }
        }
        for (h, before) in t.sni {
            if self.sni_host(&h) != before.as_ref() {
                self.delta.sni.insert(h);
            }
        }
        for (c, before) in t.clusters {
            if self.cluster_entry(&c) != before.as_ref() {
                self.delta.clusters.insert(c);
            }
        }
    }

    /// Ready `address:port` for one Service port: slice ports (TCP) matched
    /// by the Service port's name, or every slice port when it is unnamed.
    fn endpoints(&self, key: &ObjKey, port_index: usize) -> Arc<[SocketAddr]> {
        let Some(port) = self.models.get(key).and_then(|s| s.ports.get(port_index)) else {
            return Arc::from([]);
        };
        let mut out = BTreeSet::new();
        for slice in self.slices_of(key) {
            for (name, target) in &slice.ports {
                if !port.name.is_empty() && **name != *port.name {
                    continue;
                }
                for addr in &slice.ready {
                    out.insert(SocketAddr::new(*addr, *target));
                }
            }
        }
        out.into_iter().collect()
    }

    fn slices_of<'a>(&'a self, key: &ObjKey) -> impl Iterator<Item = &'a SliceEntry> + 'a {
        let ns = key.namespace.clone();
        self.by_service
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(move |name| {
                self.slices.get(&ObjKey {
                    namespace: ns.clone(),
                    name: name.clone(),
                })
            })
    }

    /// What `service` asks for, if it is eligible at all (it has slices,
    /// one of them a Ready endpoint), before conflicts with others.
    fn candidates(&self, key: &ObjKey, svc: &Inputs, warnings: &mut Vec<String>) -> Candidates {
        let mut out = Candidates::default();
        let name = key.to_string();
        let mut slices = self.slices_of(key).peekable();
        if slices.peek().is_none() {
            warnings.push(format!("{name}: no EndpointSlices, skipped"));
            return out;
        }
        if !slices.any(|s| !s.ready.is_empty()) {
            warnings.push(format!("{name}: no ready endpoints, skipped"));
            return out;
        }
        for p in svc.policy.iter().flat_map(|p| &p.problems) {
            warnings.push(format!("{name}: {p}"));
        }
        let types = svc.expose;
        let tcp_ports = || {
            svc.ports
                .iter()
                .enumerate()
                .filter(|(_, p)| p.protocol == Protocol::Tcp)
        };
        // One name per port, shared by every claim and table entry.
        let clusters: Vec<ClusterName> = svc
            .ports
            .iter()
            .map(|p| ClusterName::for_port(&key.namespace, &key.name, &p.name))
            .collect();
        let cluster = |i: usize| clusters[i].clone();
        if types.node_port {
            if svc.service_type != ServiceType::NodePort {
                warnings.push(format!(
                    "{name}: exposed as NodePort but of type {:?}, NodePort listeners skipped",
                    svc.service_type
                ));
            } else {
                for (i, p) in tcp_ports().filter(|(_, p)| p.node_port != 0) {
                    out.node_ports.push((p.node_port, i, cluster(i)));
                }
            }
        }
        if types.sni && self.options.sni {
            match port_mapping_of(svc.mapping.as_deref(), &svc.ports) {
                Err(e) => warnings.push(format!("{name}: SNI skipped: {e}")),
                Ok(mapping) => {
                    for (port_name, host) in mapping {
                        if let Some((i, _)) = tcp_ports().find(|(_, p)| p.name == port_name) {
                            out.sni.push((host, i, cluster(i)));
                        }
                    }
                }
            }
        }
        if types.tunneling && self.options.tunneling {
            for (i, p) in tcp_ports() {
                match tunnel_authority(&key.namespace, &key.name, p.port) {
                    Ok(a) => out.tunnels.push((a, i, cluster(i))),
                    Err(e) => warnings.push(format!("{name}: tunneling skipped: {e}")),
                }
            }
        }
        out
    }

    /// Warnings for what the Services re-evaluated by the last operation
    /// lost to older ones.
    fn conflict_warnings(&mut self) {
        let keys = std::mem::take(&mut self.reevaluated);
        let mut warnings = Vec::new();
        for key in &keys {
            self.conflicts_of(key, &mut warnings);
        }
        self.warnings.extend(warnings);
    }

    fn conflicts_of(&self, key: &ObjKey, warnings: &mut Vec<String>) {
        let Some(a) = self.applied.get(key) else {
            return;
        };
        for (p, i, _) in &a.candidates.node_ports {
            if let Some(((owner, j), _)) = self.np_winner(*p)
                && (owner != a.order || j != *i)
            {
                warnings.push(format!(
                    "{key}: node port {p} already served for {}, skipped",
                    owner.key
                ));
            }
        }
        if !a.sni_owner
            && let Some((host, owner)) = a.candidates.sni.iter().find_map(|(h, _, _)| {
                let o = self.sni.get(h)?.owner.as_ref()?;
                Some((h, o))
            })
        {
            warnings.push(format!(
                "{key}: SNI skipped: host {host} already belongs to older {}",
                owner.key
            ));
        }
    }
}

fn first_claim(claims: Option<&Sorted<Claim, ClusterName>>) -> Option<(&Order, usize)> {
    claims?.keys().next().map(|(o, i)| (o, *i))
}

/// The two kinds of map claims are filed in.
trait ClaimMap<K, V> {
    fn remove_claim(&mut self, key: &K, claim: &Claim);
}

impl<K: Ord, V> ClaimMap<K, V> for BTreeMap<K, Sorted<Claim, V>> {
    fn remove_claim(&mut self, key: &K, claim: &Claim) {
        if let Some(m) = self.get_mut(key) {
            m.remove(claim);
            if m.is_empty() {
                self.remove(key);
            }
        }
    }
}

impl<K: std::hash::Hash + Eq, V> ClaimMap<K, V> for HashMap<K, Sorted<Claim, V>> {
    fn remove_claim(&mut self, key: &K, claim: &Claim) {
        if let Some(m) = self.get_mut(key) {
            m.remove(claim);
            if m.is_empty() {
                self.remove(key);
            }
        }
    }
}

/// Builds the plan from scratch and returns, besides it, one line per thing
/// skipped (for the log: KKP warns about the same cases). The rules are
/// [`Index`]'s, which also keeps a plan up to date change by change.
pub fn build(inventory: &Inventory, options: &PlanOptions) -> (Plan, Vec<String>) {
    let mut index = Index::new(options.clone());
    index.replace_all(inventory);
    (index.plan(), index.take_warnings())
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
