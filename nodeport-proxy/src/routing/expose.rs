//! KKP's annotations: which ways a Service is exposed, and which SNI host
//! names its ports answer to.

use std::collections::{BTreeMap, BTreeSet};

use crate::routing::model::{Protocol, Service, ServicePort};
use crate::routing::names::SniHost;

/// `nodeport-proxy.k8s.io/expose`, the default of `-expose-annotation-key`.
pub const DEFAULT_EXPOSE_ANNOTATION_KEY: &str = "nodeport-proxy.k8s.io/expose";
/// The key the per-cluster (LoadBalancer strategy) instance is run with.
pub const EXPOSE_NAMESPACED_ANNOTATION_KEY: &str = "nodeport-proxy.k8s.io/expose-namespaced";
/// JSON `{"<servicePortName>": "<SNI host>"}`.
pub const PORT_MAPPING_ANNOTATION_KEY: &str = "nodeport-proxy.k8s.io/port-mapping";

/// The set of expose types named by an annotation value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExposeTypes {
    pub node_port: bool,
    pub sni: bool,
    pub tunneling: bool,
}

impl ExposeTypes {
    pub const NODE_PORT: ExposeTypes = ExposeTypes {
        node_port: true,
        sni: false,
        tunneling: false,
    };

    pub fn any(&self) -> bool {
        self.node_port || self.sni || self.tunneling
    }
}

/// Parses an expose annotation value: the legacy `true` means NodePort;
/// otherwise a comma list of `NodePort`, `SNI`, `Tunneling`, each trimmed and
/// case-sensitive. One unknown (or empty) item and the Service is not exposed.
pub fn parse_expose(value: &str) -> Option<ExposeTypes> {
    if value == "true" {
        return Some(ExposeTypes::NODE_PORT);
    }
    let mut types = ExposeTypes::default();
    for item in value.split(',') {
        match item.trim() {
            "NodePort" => types.node_port = true,
            "SNI" => types.sni = true,
            "Tunneling" => types.tunneling = true,
            _ => return None,
        }
    }
    types.any().then_some(types)
}

/// The expose types a Service asks for under `key`, if it is exposed at all.
pub fn service_expose(service: &Service, key: &str) -> Option<ExposeTypes> {
    service
        .metadata
        .annotations
        .get(key)
        .and_then(|v| parse_expose(v))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortMappingError {
    #[error("port mapping annotation is not a JSON object of strings: {0}")]
    InvalidJson(String),
    #[error("port mapping names host {0:?} more than once")]
    DuplicateHost(String),
    #[error("port mapping names {0:?}, which is not a TCP port of the service")]
    UnknownPort(String),
    #[error(transparent)]
    InvalidHost(#[from] crate::routing::names::InvalidSniHost),
}

/// Service port name → SNI host, validated as KKP does: valid JSON, no host
/// twice, every key the name of a TCP port. A missing annotation is an empty
/// mapping. Host names KKP leaves unchecked must here at least be usable as an
/// SNI value (non-empty, no spaces).
pub fn port_mapping(service: &Service) -> Result<BTreeMap<String, SniHost>, PortMappingError> {
    port_mapping_of(
        service
            .metadata
            .annotations
            .get(PORT_MAPPING_ANNOTATION_KEY)
            .map(String::as_str),
        &service.spec.ports,
    )
}

/// [`port_mapping`] from the annotation's text (`None`: absent) and the
/// Service's ports.
pub fn port_mapping_of(
    raw: Option<&str>,
    ports: &[ServicePort],
) -> Result<BTreeMap<String, SniHost>, PortMappingError> {
    let Some(raw) = raw else {
        return Ok(BTreeMap::new());
    };
    let parsed: BTreeMap<String, String> =
        serde_json::from_str(raw).map_err(|e| PortMappingError::InvalidJson(e.to_string()))?;
    let mut seen = BTreeSet::new();
    for host in parsed.values() {
        if !seen.insert(host.as_str()) {
            return Err(PortMappingError::DuplicateHost(host.clone()));
        }
    }
    let tcp_ports: BTreeSet<&str> = ports
        .iter()
        .filter(|p| p.protocol == Protocol::Tcp)
        .map(|p| p.name.as_str())
        .collect();
    let mut out = BTreeMap::new();
    // SNI names compare without case: "A.example" and "a.example" are one
    // host, and two ports answering to it would be two routes for one name.
    let mut names = BTreeSet::new();
    for (port, host) in parsed {
        if !tcp_ports.contains(port.as_str()) {
            return Err(PortMappingError::UnknownPort(port));
        }
        let name = SniHost::new(&host)?;
        if !names.insert(name.clone()) {
            return Err(PortMappingError::DuplicateHost(host));
        }
        out.insert(port, name);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::model::{ObjectMeta, ServicePort, ServiceSpec};

    #[test]
    fn expose_values_as_kkp_reads_them() {
        let nt = |n, s, t| {
            Some(ExposeTypes {
                node_port: n,
                sni: s,
                tunneling: t,
            })
        };
        assert_eq!(parse_expose("true"), nt(true, false, false));
        assert_eq!(parse_expose("NodePort"), nt(true, false, false));
        assert_eq!(parse_expose("Tunneling, SNI"), nt(false, true, true));
        assert_eq!(parse_expose("Tunneling,SNI"), nt(false, true, true));
        assert_eq!(
            parse_expose(" SNI ,NodePort,Tunneling "),
            nt(true, true, true)
        );
        for bad in [
            "",
            "True",
            "false",
            "Tunneling SNI",
            "sni",
            "NodePort,",
            "NodePort,Bogus",
            ",",
        ] {
            assert_eq!(parse_expose(bad), None, "{bad:?} must not expose");
        }
    }

    fn svc(mapping: Option<&str>, ports: &[(&str, Protocol)]) -> Service {
        let mut annotations = BTreeMap::new();
        if let Some(m) = mapping {
            annotations.insert(PORT_MAPPING_ANNOTATION_KEY.to_string(), m.to_string());
        }
        Service {
            metadata: ObjectMeta {
                namespace: "ns".into(),
                name: "svc".into(),
                annotations,
                ..Default::default()
            },
            spec: ServiceSpec {
                ports: ports
                    .iter()
                    .map(|(n, p)| ServicePort {
                        name: (*n).into(),
                        port: 443,
                        node_port: 0,
                        protocol: *p,
                    })
                    .collect(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn port_mapping_validation() {
        let tcp = [("https", Protocol::Tcp), ("dns", Protocol::Udp)];
        let ok = port_mapping(&svc(Some(r#"{"https":"A.example.com"}"#), &tcp));
        assert_eq!(
            ok.ok().and_then(|m| m.get("https").map(|h| h.to_string())),
            Some("a.example.com".to_string())
        );
        assert_eq!(port_mapping(&svc(None, &tcp)).map(|m| m.len()), Ok(0));
        assert!(matches!(
            port_mapping(&svc(Some("{not json"), &tcp)),
            Err(PortMappingError::InvalidJson(_))
        ));
        assert!(matches!(
            port_mapping(&svc(Some(r#"["https"]"#), &tcp)),
            Err(PortMappingError::InvalidJson(_))
        ));
        assert!(matches!(
            port_mapping(&svc(
                Some(r#"{"https":"h","other":"h"}"#),
                &[("https", Protocol::Tcp), ("other", Protocol::Tcp)]
            )),
            Err(PortMappingError::DuplicateHost(_))
        ));
        // Names that differ only in case are one SNI host.
        assert!(matches!(
            port_mapping(&svc(
                Some(r#"{"https":"A.Example","other":"a.example"}"#),
                &[("https", Protocol::Tcp), ("other", Protocol::Tcp)]
            )),
            Err(PortMappingError::DuplicateHost(_))
        ));
        assert_eq!(
            port_mapping(&svc(Some(r#"{"dns":"h"}"#), &tcp)),
            Err(PortMappingError::UnknownPort("dns".into()))
        );
        assert_eq!(
            port_mapping(&svc(Some(r#"{"missing":"h"}"#), &tcp)),
            Err(PortMappingError::UnknownPort("missing".into()))
        );
        assert!(matches!(
            port_mapping(&svc(Some(r#"{"https":""}"#), &tcp)),
            Err(PortMappingError::InvalidHost(_))
        ));
    }
}
