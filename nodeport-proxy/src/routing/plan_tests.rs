//! KKP's `TestSync` scenarios, on the plan instead of Envoy resources.

use super::*;
use crate::routing::index::build;
use crate::routing::model::*;
use std::collections::BTreeMap;

fn svc(ns: &str, name: &str, created: i64, expose: Option<&str>, ty: ServiceType) -> Service {
    let mut annotations = BTreeMap::new();
    if let Some(e) = expose {
        annotations.insert(
            crate::routing::expose::DEFAULT_EXPOSE_ANNOTATION_KEY.to_string(),
            e.to_string(),
        );
    }
    Service {
        metadata: ObjectMeta {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("{ns}-{name}"),
            creation_timestamp: Some(Timestamp::from_unix_seconds(created)),
            annotations,
            ..Default::default()
        },
        spec: ServiceSpec {
            service_type: ty,
            ports: vec![],
        },
    }
}

fn port(name: &str, port: u16, node_port: u16, protocol: Protocol) -> ServicePort {
    ServicePort {
        name: name.into(),
        port,
        node_port,
        protocol,
    }
}

fn slice(
    ns: &str,
    svc: &str,
    ports: &[(&str, u16)],
    eps: &[(&str, Option<bool>)],
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: ns.into(),
            name: format!("{svc}-x"),
            labels: [(SERVICE_NAME_LABEL.to_string(), svc.to_string())].into(),
            ..Default::default()
        },
        ports: ports
            .iter()
            .map(|(n, p)| EndpointPort {
                name: Some((*n).into()),
                port: Some(*p),
                protocol: Protocol::Tcp,
            })
            .collect(),
        endpoints: eps
            .iter()
            .map(|(a, ready)| Endpoint {
                addresses: vec![a.parse().unwrap_or_else(|e| panic!("{e}"))],
                conditions: EndpointConditions { ready: *ready },
            })
            .collect(),
    }
}

fn cn(s: &str) -> ClusterName {
    let (ns, rest) = s.split_once('/').unwrap_or_else(|| panic!("{s}"));
    match rest.split_once('-') {
        Some((svc, port)) => ClusterName::for_port(ns, svc, port),
        None => ClusterName::for_port(ns, rest, ""),
    }
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter()
        .map(|a| a.parse().unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn host(h: &str) -> SniHost {
    SniHost::new(h).unwrap_or_else(|e| panic!("{e}"))
}

fn authority(a: &str) -> ConnectAuthority {
    ConnectAuthority::parse(a).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn node_port_named_and_unnamed_ports_skip_not_ready() {
    let mut s = svc("test", "svc", 0, Some("true"), ServiceType::NodePort);
    s.spec.ports = vec![
        port("https", 443, 30443, Protocol::Tcp),
        port("", 80, 30080, Protocol::Tcp),
    ];
    let mut named = slice(
        "test",
        "svc",
        &[("https", 8443)],
        &[
            ("10.0.0.1", Some(true)),
            ("10.0.0.2", Some(true)),
            ("10.0.0.3", Some(false)),
            ("10.0.0.4", None),
        ],
    );
    // A terminating endpoint is not ready.
    named.endpoints.push(Endpoint {
        addresses: addrs(&["10.0.0.5:0"]).iter().map(|a| a.ip()).collect(),
        conditions: EndpointConditions { ready: Some(false) },
    });
    let inv = Inventory {
        services: vec![s],
        endpoint_slices: vec![named],
    };
    let (plan, _) = build(&inv, &PlanOptions::default());
    assert_eq!(plan.node_ports.get(&30443), Some(&cn("test/svc-https")));
    assert_eq!(plan.node_ports.get(&30080), Some(&cn("test/svc")));
    assert_eq!(
        plan.clusters.get(&cn("test/svc-https")),
        Some(&addrs(&["10.0.0.1:8443", "10.0.0.2:8443"]))
    );
    // The unnamed Service port takes every slice port.
    assert_eq!(
        plan.clusters.get(&cn("test/svc")),
        Some(&addrs(&["10.0.0.1:8443", "10.0.0.2:8443"]))
    );
    assert!(plan.sni.is_empty() && plan.tunnels.is_empty());
}

#[test]
fn unexposed_unready_and_wrong_type_services_produce_nothing() {
    let mut plain = svc("t", "plain", 0, None, ServiceType::NodePort);
    plain.spec.ports = vec![port("p", 1, 30001, Protocol::Tcp)];
    let mut bad = svc("t", "bad", 0, Some("True"), ServiceType::NodePort);
    bad.spec.ports = vec![port("p", 1, 30002, Protocol::Tcp)];
    let mut unready = svc("t", "unready", 0, Some("NodePort"), ServiceType::NodePort);
    unready.spec.ports = vec![port("p", 1, 30003, Protocol::Tcp)];
    let mut noslices = svc("t", "noslices", 0, Some("NodePort"), ServiceType::NodePort);
    noslices.spec.ports = vec![port("p", 1, 30004, Protocol::Tcp)];
    let mut clusterip = svc("t", "cip", 0, Some("NodePort"), ServiceType::ClusterIP);
    clusterip.spec.ports = vec![port("p", 1, 30005, Protocol::Tcp)];
    let mut udp = svc("t", "udp", 0, Some("NodePort"), ServiceType::NodePort);
    udp.spec.ports = vec![port("p", 1, 30006, Protocol::Udp)];
    let inv = Inventory {
        services: vec![plain, bad, unready, noslices, clusterip, udp],
        endpoint_slices: vec![
            slice("t", "plain", &[("p", 1)], &[("10.0.0.1", Some(true))]),
            slice("t", "bad", &[("p", 1)], &[("10.0.0.1", Some(true))]),
            slice("t", "unready", &[("p", 1)], &[("10.0.0.1", Some(false))]),
            slice("t", "cip", &[("p", 1)], &[("10.0.0.1", Some(true))]),
            slice("t", "udp", &[("p", 1)], &[("10.0.0.1", Some(true))]),
            // Same name, other namespace: not this Service's slice.
            slice(
                "other",
                "noslices",
                &[("p", 1)],
                &[("10.0.0.1", Some(true))],
            ),
        ],
    };
    let (plan, warnings) = build(&inv, &PlanOptions::default());
    assert_eq!(plan, Plan::default(), "{warnings:?}");
}

fn sni_svc(name: &str, created: i64, mapping: &str) -> (Service, EndpointSlice) {
    let mut s = svc("t", name, created, Some("SNI"), ServiceType::ClusterIP);
    s.metadata.annotations.insert(
        crate::routing::expose::PORT_MAPPING_ANNOTATION_KEY.into(),
        mapping.into(),
    );
    s.spec.ports = vec![
        port("https", 443, 0, Protocol::Tcp),
        port("http", 80, 0, Protocol::Tcp),
        port("dns", 53, 0, Protocol::Udp),
    ];
    let e = slice(
        "t",
        name,
        &[("https", 6443), ("http", 8080)],
        &[("10.0.0.9", Some(true))],
    );
    (s, e)
}

#[test]
fn sni_one_and_two_mapped_ports() {
    let (s, e) = sni_svc("one", 0, r#"{"https":"one.example.com"}"#);
    let (s2, e2) = sni_svc(
        "two",
        0,
        r#"{"https":"a.example.com","http":"b.example.com"}"#,
    );
    let inv = Inventory {
        services: vec![s, s2],
        endpoint_slices: vec![e, e2],
    };
    let (plan, _) = build(&inv, &PlanOptions::default());
    assert_eq!(
        plan.sni.get(&host("one.example.com")),
        Some(&cn("t/one-https"))
    );
    assert_eq!(
        plan.sni.get(&host("a.example.com")),
        Some(&cn("t/two-https"))
    );
    assert_eq!(
        plan.sni.get(&host("b.example.com")),
        Some(&cn("t/two-http"))
    );
    // Only mapped ports get clusters.
    assert!(!plan.clusters.contains_key(&cn("t/one-http")));
    assert_eq!(
        plan.clusters.get(&cn("t/one-https")),
        Some(&addrs(&["10.0.0.9:6443"]))
    );
}

#[test]
fn sni_disabled_udp_mapping_and_invalid_mapping() {
    let (s, e) = sni_svc("one", 0, r#"{"https":"one.example.com"}"#);
    let inv = Inventory {
        services: vec![s],
        endpoint_slices: vec![e],
    };
    let off = PlanOptions {
        sni: false,
        ..PlanOptions::default()
    };
    assert_eq!(build(&inv, &off).0, Plan::default());
    let (udp, e) = sni_svc("udp", 0, r#"{"dns":"dns.example.com"}"#);
    let inv = Inventory {
        services: vec![udp],
        endpoint_slices: vec![e],
    };
    assert!(build(&inv, &PlanOptions::default()).0.sni.is_empty());
}

#[test]
fn older_service_wins_sni_conflict() {
    let (newer, e1) = sni_svc("newer", 200, r#"{"https":"same.example.com"}"#);
    let (older, e2) = sni_svc("older", 100, r#"{"https":"same.example.com"}"#);
    let inv = Inventory {
        services: vec![newer, older],
        endpoint_slices: vec![e1, e2],
    };
    let (plan, warnings) = build(&inv, &PlanOptions::default());
    assert_eq!(
        plan.sni.get(&host("same.example.com")),
        Some(&cn("t/older-https"))
    );
    assert!(
        warnings.iter().any(|w| w.contains("t/newer")),
        "{warnings:?}"
    );
    assert!(!plan.clusters.contains_key(&cn("t/newer-https")));
}

#[test]
fn one_conflicting_host_skips_every_sni_route_of_the_newer_service() {
    // KKP's envoy-manager skips the newer Service's whole SNI mapping, not
    // only the host in conflict.
    let (older, e1) = sni_svc("older", 100, r#"{"https":"same.example.com"}"#);
    let (newer, e2) = sni_svc(
        "newer",
        200,
        r#"{"https":"same.example.com","http":"free.example.com"}"#,
    );
    let inv = Inventory {
        services: vec![newer, older],
        endpoint_slices: vec![e1, e2],
    };
    let (plan, warnings) = build(&inv, &PlanOptions::default());
    assert_eq!(plan.sni.len(), 1, "{:?}", plan.sni);
    assert!(!plan.sni.contains_key(&host("free.example.com")));
    assert!(!plan.clusters.contains_key(&cn("t/newer-http")));
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("t/newer") && w.contains("same.example.com")),
        "{warnings:?}"
    );
}

#[test]
fn tunneling_every_tcp_port_and_with_sni() {
    let mut s = svc(
        "cluster-x",
        "apiserver-external",
        0,
        Some("SNI,Tunneling"),
        ServiceType::ClusterIP,
    );
    s.metadata.annotations.insert(
        crate::routing::expose::PORT_MAPPING_ANNOTATION_KEY.into(),
        r#"{"secure":"x.seed.example.com"}"#.into(),
    );
    s.spec.ports = vec![
        port("secure", 443, 0, Protocol::Tcp),
        port("other", 8080, 0, Protocol::Tcp),
        port("u", 53, 0, Protocol::Udp),
    ];
    let e = slice(
        "cluster-x",
        "apiserver-external",
        &[("secure", 6443), ("other", 8081)],
        &[("10.1.0.1", Some(true))],
    );
    let inv = Inventory {
        services: vec![s.clone()],
        endpoint_slices: vec![e.clone()],
    };
    let (plan, _) = build(&inv, &PlanOptions::default());
    assert_eq!(
        plan.tunnels.get(&authority(
            "apiserver-external.cluster-x.svc.cluster.local:443"
        )),
        Some(&cn("cluster-x/apiserver-external-secure"))
    );
    assert_eq!(
        plan.tunnels.get(&authority(
            "apiserver-external.cluster-x.svc.cluster.local:8080"
        )),
        Some(&cn("cluster-x/apiserver-external-other"))
    );
    assert_eq!(plan.tunnels.len(), 2);
    assert_eq!(plan.sni.len(), 1);
    // An invalid mapping drops SNI but keeps the tunnel.
    let mut broken = s;
    broken.metadata.annotations.insert(
        crate::routing::expose::PORT_MAPPING_ANNOTATION_KEY.into(),
        r#"{"missing":"h"}"#.into(),
    );
    let (plan, _) = build(
        &Inventory {
            services: vec![broken],
            endpoint_slices: vec![e],
        },
        &PlanOptions::default(),
    );
    assert!(plan.sni.is_empty());
    assert_eq!(plan.tunnels.len(), 2);
}

#[test]
fn namespace_and_annotation_key_filters() {
    let mut a = svc("ns-a", "s", 0, None, ServiceType::NodePort);
    a.metadata.annotations.insert(
        crate::routing::expose::EXPOSE_NAMESPACED_ANNOTATION_KEY.into(),
        "true".into(),
    );
    a.spec.ports = vec![port("p", 1, 31001, Protocol::Tcp)];
    let mut b = a.clone();
    b.metadata.namespace = "ns-b".into();
    b.spec.ports = vec![port("p", 1, 31002, Protocol::Tcp)];
    let inv = Inventory {
        services: vec![a, b],
        endpoint_slices: vec![
            slice("ns-a", "s", &[("p", 1)], &[("10.0.0.1", Some(true))]),
            slice("ns-b", "s", &[("p", 1)], &[("10.0.0.1", Some(true))]),
        ],
    };
    assert_eq!(build(&inv, &PlanOptions::default()).0, Plan::default());
    let opts = PlanOptions {
        expose_annotation_key: crate::routing::expose::EXPOSE_NAMESPACED_ANNOTATION_KEY.into(),
        namespace: Some("ns-b".into()),
        ..PlanOptions::default()
    };
    let (plan, _) = build(&inv, &opts);
    assert_eq!(
        plan.node_ports.keys().copied().collect::<Vec<_>>(),
        vec![31002]
    );
}

#[test]
fn same_inventory_same_plan() {
    let (s, e) = sni_svc("one", 0, r#"{"https":"one.example.com"}"#);
    let inv = Inventory {
        services: vec![s],
        endpoint_slices: vec![e],
    };
    assert_eq!(
        build(&inv, &PlanOptions::default()).0,
        build(&inv, &PlanOptions::default()).0
    );
}
