//! KKP's `sync()`: from Services and EndpointSlices to what should be served.
//! Pure and deterministic, so the same inventory always yields an equal plan
//! and an unchanged plan is never re-applied.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use crate::expose::{port_mapping, service_expose};
use crate::model::{EndpointSlice, Inventory, Protocol, Service, ServicePort, ServiceType};
use crate::names::{ClusterName, ConnectAuthority, SniHost, tunnel_authority};

/// What the routing table is built from besides the inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    pub expose_annotation_key: String,
    /// Only Services in this namespace; `None` for all.
    pub namespace: Option<String>,
    /// KKP builds SNI routes only when an SNI port is configured.
    pub sni: bool,
    /// Likewise for tunneling routes.
    pub tunneling: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            expose_annotation_key: crate::expose::DEFAULT_EXPOSE_ANNOTATION_KEY.to_string(),
            namespace: None,
            sni: true,
            tunneling: true,
        }
    }
}

/// Routes and the endpoints of every cluster they use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub node_ports: BTreeMap<u16, ClusterName>,
    pub sni: BTreeMap<SniHost, ClusterName>,
    pub tunnels: BTreeMap<ConnectAuthority, ClusterName>,
    /// Sorted, de-duplicated `address:targetPort` of Ready endpoints.
    pub clusters: BTreeMap<ClusterName, Vec<SocketAddr>>,
}

impl Plan {
    pub fn route_count(&self) -> usize {
        self.node_ports.len() + self.sni.len() + self.tunnels.len()
    }
}

/// Builds the plan and returns, besides it, one line per thing skipped
/// (for the log: KKP warns about the same cases).
pub fn build(inventory: &Inventory, options: &PlanOptions) -> (Plan, Vec<String>) {
    let mut warnings = Vec::new();
    let mut services: Vec<&Service> = inventory
        .services
        .iter()
        .filter(|s| {
            options
                .namespace
                .as_deref()
                .is_none_or(|ns| s.metadata.namespace == ns)
        })
        .filter(|s| service_expose(s, &options.expose_annotation_key).is_some())
        .collect();
    // Oldest first, so the older Service wins an SNI host conflict.
    services.sort_by(|a, b| {
        (a.metadata.creation_timestamp, &a.metadata.uid)
            .cmp(&(b.metadata.creation_timestamp, &b.metadata.uid))
    });
    let mut plan = Plan::default();
    for svc in services {
        let name = format!("{}/{}", svc.metadata.namespace, svc.metadata.name);
        let slices: Vec<&EndpointSlice> = inventory
            .endpoint_slices
            .iter()
            .filter(|e| {
                e.metadata.namespace == svc.metadata.namespace
                    && e.service_name() == Some(svc.metadata.name.as_str())
            })
            .collect();
        if slices.is_empty() {
            warnings.push(format!("{name}: no EndpointSlices, skipped"));
            continue;
        }
        let any_ready = slices
            .iter()
            .flat_map(|s| &s.endpoints)
            .any(|e| e.conditions.ready == Some(true) && !e.addresses.is_empty());
        if !any_ready {
            warnings.push(format!("{name}: no ready endpoints, skipped"));
            continue;
        }
        let Some(types) = service_expose(svc, &options.expose_annotation_key) else {
            continue;
        };
        // Indices into the Service's ports; clusters exist only for ports in use.
        let mut used: BTreeSet<usize> = BTreeSet::new();
        let tcp_ports = || {
            svc.spec
                .ports
                .iter()
                .enumerate()
                .filter(|(_, p)| p.protocol == Protocol::Tcp)
        };
        let cluster = |p: &ServicePort| {
            ClusterName::for_port(&svc.metadata.namespace, &svc.metadata.name, &p.name)
        };
        if types.node_port {
            if svc.spec.service_type != ServiceType::NodePort {
                warnings.push(format!(
                    "{name}: exposed as NodePort but of type {:?}, NodePort listeners skipped",
                    svc.spec.service_type
                ));
            } else {
                for (i, p) in tcp_ports().filter(|(_, p)| p.node_port != 0) {
                    if let Some(owner) = plan.node_ports.get(&p.node_port) {
                        warnings.push(format!(
                            "{name}: node port {} already served for {owner}, skipped",
                            p.node_port
                        ));
                        continue;
                    }
                    plan.node_ports.insert(p.node_port, cluster(p));
                    used.insert(i);
                }
            }
        }
        if types.sni && options.sni {
            match port_mapping(svc) {
                Err(e) => warnings.push(format!("{name}: SNI skipped: {e}")),
                Ok(mapping) => {
                    // As KKP's envoy-manager: one host already taken by an
                    // older Service skips every SNI route of this one.
                    if let Some((host, owner)) = mapping
                        .values()
                        .find_map(|h| plan.sni.get(h).map(|o| (h, o)))
                    {
                        warnings.push(format!(
                            "{name}: SNI skipped: host {host} already belongs to older {owner}"
                        ));
                    } else {
                        for (port_name, host) in mapping {
                            let Some((i, p)) = tcp_ports().find(|(_, p)| p.name == port_name)
                            else {
                                continue;
                            };
                            plan.sni.insert(host, cluster(p));
                            used.insert(i);
                        }
                    }
                }
            }
        }
        if types.tunneling && options.tunneling {
            for (i, p) in tcp_ports() {
                match tunnel_authority(&svc.metadata.namespace, &svc.metadata.name, p.port) {
                    Ok(a) => {
                        plan.tunnels.entry(a).or_insert_with(|| cluster(p));
                        used.insert(i);
                    }
                    Err(e) => warnings.push(format!("{name}: tunneling skipped: {e}")),
                }
            }
        }
        for p in used.into_iter().filter_map(|i| svc.spec.ports.get(i)) {
            plan.clusters.insert(cluster(p), endpoints(p, &slices));
        }
    }
    (plan, warnings)
}

/// Ready `address:port` for one Service port: slice ports (TCP) matched by the
/// Service port's name, or every slice port when the Service port is unnamed.
fn endpoints(port: &ServicePort, slices: &[&EndpointSlice]) -> Vec<SocketAddr> {
    let mut out = BTreeSet::new();
    for slice in slices {
        let target_ports = slice
            .ports
            .iter()
            .filter(|sp| sp.protocol == Protocol::Tcp)
            .filter(|sp| port.name.is_empty() || sp.name.as_deref().unwrap_or("") == port.name)
            .filter_map(|sp| sp.port.filter(|p| *p != 0));
        for target in target_ports {
            for ep in slice
                .endpoints
                .iter()
                .filter(|e| e.conditions.ready == Some(true))
            {
                for addr in &ep.addresses {
                    out.insert(SocketAddr::new(*addr, target));
                }
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
