//! What should be served: the routes and clusters KKP's `sync()` derives from
//! Services and EndpointSlices. A function of the inventory, so the same
//! inventory always yields an equal plan.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::routing::names::{ClusterName, ConnectAuthority, SniHost};

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
            expose_annotation_key: crate::routing::expose::DEFAULT_EXPOSE_ANNOTATION_KEY
                .to_string(),
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

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
