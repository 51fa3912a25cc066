//! Names that must not be mixed up: the SNI host a ClientHello asks for, the
//! cluster (upstream set) a route points at, and the key a route is found by.

use std::fmt;
use std::sync::Arc;

pub use daemon::authority::ConnectAuthority;

/// A TLS server name, lower-cased (DNS names compare case-insensitively).
/// Shared, not copied, by the index, the table and its routes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SniHost(Arc<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid SNI host name {0:?}")]
pub struct InvalidSniHost(pub String);

impl SniHost {
    /// Accepts what can appear in a ClientHello's host_name: non-empty printable
    /// ASCII without spaces, at most 255 bytes.
    pub fn new(s: &str) -> Result<Self, InvalidSniHost> {
        let ok = !s.is_empty() && s.len() <= 255 && s.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            return Err(InvalidSniHost(s.to_string()));
        }
        Ok(SniHost(s.to_ascii_lowercase().into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SniHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// KKP's cluster name `<ns>/<svc>-<portName>` (or `<ns>/<svc>` for an unnamed
/// port); dashboards read it as `envoy_cluster_name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterName(Arc<str>);

impl ClusterName {
    pub fn for_port(namespace: &str, service: &str, port_name: &str) -> Self {
        if port_name.is_empty() {
            ClusterName(format!("{namespace}/{service}").into())
        } else {
            ClusterName(format!("{namespace}/{service}-{port_name}").into())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a connection found its route.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKey {
    NodePort(u16),
    Sni(SniHost),
    Tunnel(ConnectAuthority),
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteKey::NodePort(p) => write!(f, "nodeport {p}"),
            RouteKey::Sni(h) => write!(f, "sni {h}"),
            RouteKey::Tunnel(a) => write!(f, "tunnel {a}"),
        }
    }
}

/// The authority a tunneled Service port answers to:
/// `<svc>.<ns>.svc.cluster.local:<port>`.
pub fn tunnel_authority(
    namespace: &str,
    service: &str,
    port: u16,
) -> Result<ConnectAuthority, daemon::authority::AuthorityError> {
    ConnectAuthority::new(&format!("{service}.{namespace}.svc.cluster.local"), port)
}
