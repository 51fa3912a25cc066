//! The index against a direct transcription of KKP's rules, over random
//! sequences of changes: after every change the incrementally kept plan
//! equals the plan built from scratch, and the keys reported changed are
//! exactly enough to bring a copy kept from deltas alone up to date.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::routing::expose::{PORT_MAPPING_ANNOTATION_KEY, port_mapping, service_expose};
use crate::routing::model::*;
use crate::routing::names::tunnel_authority;
use crate::routing::plan::{Plan, PlanOptions};

/// The rules as plainly as they can be written: every Service, oldest
/// first, against everything older. Quadratic, which is why the index
/// exists.
fn reference(inventory: &Inventory, options: &PlanOptions) -> Plan {
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
    services.sort_by(|a, b| {
        let key = |s: &Service| {
            (
                s.metadata.creation_timestamp,
                s.metadata.uid.clone(),
                s.metadata.namespace.clone(),
                s.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut plan = Plan::default();
    for svc in services {
        let slices: Vec<&EndpointSlice> = inventory
            .endpoint_slices
            .iter()
            .filter(|e| {
                e.metadata.namespace == svc.metadata.namespace
                    && e.service_name() == Some(svc.metadata.name.as_str())
            })
            .collect();
        let any_ready = slices
            .iter()
            .flat_map(|s| &s.endpoints)
            .any(|e| e.conditions.ready == Some(true) && !e.addresses.is_empty());
        if slices.is_empty() || !any_ready {
            continue;
        }
        let Some(types) = service_expose(svc, &options.expose_annotation_key) else {
            continue;
        };
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
        if types.node_port && svc.spec.service_type == ServiceType::NodePort {
            for (i, p) in tcp_ports().filter(|(_, p)| p.node_port != 0) {
                if plan.node_ports.contains_key(&p.node_port) {
                    continue;
                }
                plan.node_ports.insert(p.node_port, cluster(p));
                used.insert(i);
            }
        }
        if types.sni
            && options.sni
            && let Ok(mapping) = port_mapping(svc)
            && !mapping.values().any(|h| plan.sni.contains_key(h))
        {
            for (port_name, host) in mapping {
                if let Some((i, p)) = tcp_ports().find(|(_, p)| p.name == port_name) {
                    plan.sni.insert(host, cluster(p));
                    used.insert(i);
                }
            }
        }
        if types.tunneling && options.tunneling {
            for (i, p) in tcp_ports() {
                if let Ok(a) = tunnel_authority(&svc.metadata.namespace, &svc.metadata.name, p.port)
                {
                    plan.tunnels.entry(a).or_insert_with(|| cluster(p));
                    used.insert(i);
                }
            }
        }
        for i in used {
            let p = &svc.spec.ports[i];
            let mut out = BTreeSet::new();
            for slice in &slices {
                for sp in slice.ports.iter().filter(|sp| sp.protocol == Protocol::Tcp) {
                    if !p.name.is_empty() && sp.name.as_deref().unwrap_or("") != p.name {
                        continue;
                    }
                    let Some(target) = sp.port.filter(|n| *n != 0) else {
                        continue;
                    };
                    for ep in slice
                        .endpoints
                        .iter()
                        .filter(|e| e.conditions.ready == Some(true))
                    {
                        for a in &ep.addresses {
                            out.insert(SocketAddr::new(*a, target));
                        }
                    }
                }
            }
            plan.clusters.insert(cluster(p), out.into_iter().collect());
        }
    }
    plan
}

const NAMESPACES: [&str; 2] = ["a", "b"];
const NAMES: [&str; 5] = ["s0", "s1", "s2", "s3", "s4"];
const PORT_NAMES: [&str; 4] = ["", "http", "https", "x"];
const HOSTS: [&str; 4] = ["h1.example", "h2.example", "H1.example", "h3.example"];

fn pick<'a, T>(rng: &mut StdRng, from: &'a [T]) -> &'a T {
    &from[rng.random_range(0..from.len())]
}

fn random_service(rng: &mut StdRng) -> Service {
    let mut annotations = BTreeMap::new();
    let expose = [
        Some("NodePort"),
        Some("SNI"),
        Some("Tunneling"),
        Some("SNI, Tunneling"),
        Some("NodePort,SNI,Tunneling"),
        Some("true"),
        Some("bogus"),
        None,
    ];
    if let Some(e) = pick(rng, &expose) {
        annotations.insert(
            crate::routing::expose::DEFAULT_EXPOSE_ANNOTATION_KEY.to_string(),
            (*e).to_string(),
        );
    }
    let ports: Vec<ServicePort> = (0..rng.random_range(0..4))
        .map(|_| ServicePort {
            name: (*pick(rng, &PORT_NAMES)).into(),
            port: *pick(rng, &[80u16, 443, 7000]),
            node_port: *pick(rng, &[0u16, 30000, 30001]),
            protocol: if rng.random_bool(0.9) {
                Protocol::Tcp
            } else {
                Protocol::Udp
            },
        })
        .collect();
    if rng.random_bool(0.7) {
        let mut m = serde_json::Map::new();
        for _ in 0..rng.random_range(0..3) {
            m.insert(
                (*pick(rng, &PORT_NAMES)).to_string(),
                serde_json::Value::from(*pick(rng, &HOSTS)),
            );
        }
        let text = if rng.random_bool(0.05) {
            "{broken".to_string()
        } else {
            serde_json::Value::Object(m).to_string()
        };
        annotations.insert(PORT_MAPPING_ANNOTATION_KEY.to_string(), text);
    }
    Service {
        metadata: ObjectMeta {
            namespace: (*pick(rng, &NAMESPACES)).into(),
            name: (*pick(rng, &NAMES)).into(),
            uid: (*pick(rng, &["", "u1", "u2"])).into(),
            creation_timestamp: *pick(
                rng,
                &[
                    None,
                    Some(Timestamp::from_unix_seconds(1)),
                    Some(Timestamp::from_unix_seconds(2)),
                    Some(Timestamp::from_unix_seconds(3)),
                ],
            ),
            annotations,
            labels: BTreeMap::new(),
        },
        spec: ServiceSpec {
            service_type: if rng.random_bool(0.6) {
                ServiceType::NodePort
            } else {
                ServiceType::ClusterIP
            },
            ports,
        },
    }
}

fn random_slice(rng: &mut StdRng) -> EndpointSlice {
    let mut labels = BTreeMap::new();
    if rng.random_bool(0.9) {
        labels.insert(
            SERVICE_NAME_LABEL.to_string(),
            (*pick(rng, &NAMES)).to_string(),
        );
    }
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: (*pick(rng, &NAMESPACES)).into(),
            name: (*pick(rng, &["x0", "x1", "x2", "x3"])).into(),
            labels,
            ..ObjectMeta::default()
        },
        ports: (0..rng.random_range(0..3))
            .map(|_| EndpointPort {
                name: pick(rng, &[None, Some("http"), Some("https"), Some("x")]).map(String::from),
                port: *pick(rng, &[None, Some(0), Some(8080), Some(8443)]),
                protocol: if rng.random_bool(0.9) {
                    Protocol::Tcp
                } else {
                    Protocol::Sctp
                },
            })
            .collect(),
        endpoints: (0..rng.random_range(0..3))
            .map(|_| Endpoint {
                addresses: (0..rng.random_range(0..3))
                    .map(|_| {
                        pick(rng, &["10.0.0.1", "10.0.0.2", "fd00::1"])
                            .parse()
                            .unwrap_or_else(|e| panic!("{e}"))
                    })
                    .collect(),
                conditions: EndpointConditions {
                    ready: *pick(rng, &[Some(true), Some(true), Some(false), None]),
                },
            })
            .collect(),
    }
}

/// The inventory as a map, so changes replace objects by name.
#[derive(Default, Clone)]
struct World {
    services: BTreeMap<(String, String), Service>,
    slices: BTreeMap<(String, String), EndpointSlice>,
}

impl World {
    fn inventory(&self) -> Inventory {
        Inventory {
            services: self.services.values().cloned().collect(),
            endpoint_slices: self.slices.values().cloned().collect(),
        }
    }
}

fn meta_key(m: &ObjectMeta) -> (String, String) {
    (m.namespace.clone(), m.name.clone())
}

/// Applies `delta` to `mirror` using only lookups of the changed keys.
fn follow(mirror: &mut Plan, index: &Index, delta: &Delta) {
    for p in &delta.node_ports {
        match index.node_port(*p) {
            Some(c) => mirror.node_ports.insert(*p, c.clone()),
            None => mirror.node_ports.remove(p),
        };
    }
    for h in &delta.sni {
        match index.sni_host(h) {
            Some(c) => mirror.sni.insert(h.clone(), c.clone()),
            None => mirror.sni.remove(h),
        };
    }
    for a in &delta.tunnels {
        match index.tunnel(a) {
            Some(c) => mirror.tunnels.insert(a.clone(), c.clone()),
            None => mirror.tunnels.remove(a),
        };
    }
    for c in &delta.clusters {
        match index.cluster(c) {
            Some(e) => mirror.clusters.insert(c.clone(), e.to_vec()),
            None => mirror.clusters.remove(c),
        };
    }
}

/// Every route's cluster must be in the plan, and `routes_of` must name
/// exactly the routes pointing at each cluster.
fn check_reverse(index: &Index, plan: &Plan, seed: u64, step: usize) {
    let mut expected: BTreeMap<ClusterName, Vec<RouteKey>> = BTreeMap::new();
    for (p, c) in &plan.node_ports {
        expected
            .entry(c.clone())
            .or_default()
            .push(RouteKey::NodePort(*p));
    }
    for (h, c) in &plan.sni {
        expected
            .entry(c.clone())
            .or_default()
            .push(RouteKey::Sni(h.clone()));
    }
    for (a, c) in &plan.tunnels {
        expected
            .entry(c.clone())
            .or_default()
            .push(RouteKey::Tunnel(a.clone()));
    }
    for (c, mut keys) in expected {
        assert!(
            plan.clusters.contains_key(&c),
            "seed {seed} step {step}: {c} missing"
        );
        keys.sort();
        assert_eq!(
            index.routes_of(&c),
            keys,
            "seed {seed} step {step}: routes of {c}"
        );
    }
}

#[test]
fn incremental_equals_from_scratch_for_random_changes() {
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let options = PlanOptions {
            namespace: rng.random_bool(0.2).then(|| "a".to_string()),
            sni: rng.random_bool(0.85),
            tunneling: rng.random_bool(0.85),
            ..PlanOptions::default()
        };
        let mut world = World::default();
        let mut index = Index::new(options.clone());
        let mut mirror = Plan::default();
        for step in 0..60 {
            match rng.random_range(0..10) {
                0..=2 => {
                    let s = random_service(&mut rng);
                    index.service(&ObjKey::of(&s.metadata), Some(&s));
                    world.services.insert(meta_key(&s.metadata), s);
                }
                3 => {
                    if let Some(k) = world.services.keys().nth(rng.random_range(0..5)).cloned() {
                        world.services.remove(&k);
                        index.service(&ObjKey::new(&k.0, &k.1), None);
                    }
                }
                4..=6 => {
                    let s = random_slice(&mut rng);
                    index.slice(&ObjKey::of(&s.metadata), Some(&s));
                    world.slices.insert(meta_key(&s.metadata), s);
                }
                7 => {
                    if let Some(k) = world.slices.keys().nth(rng.random_range(0..5)).cloned() {
                        world.slices.remove(&k);
                        index.slice(&ObjKey::new(&k.0, &k.1), None);
                    }
                }
                _ => {
                    // A whole new inventory, as a file reload: some of the
                    // old objects, changed and new ones.
                    let mut next = World::default();
                    for (k, s) in &world.services {
                        if rng.random_bool(0.7) {
                            next.services.insert(k.clone(), s.clone());
                        }
                    }
                    for (k, s) in &world.slices {
                        if rng.random_bool(0.7) {
                            next.slices.insert(k.clone(), s.clone());
                        }
                    }
                    for _ in 0..rng.random_range(0..4) {
                        let s = random_service(&mut rng);
                        next.services.insert(meta_key(&s.metadata), s);
                        let e = random_slice(&mut rng);
                        next.slices.insert(meta_key(&e.metadata), e);
                    }
                    world = next;
                    index.replace_all(&world.inventory());
                }
            }
            let plan = index.plan();
            let want = reference(&world.inventory(), &options);
            assert_eq!(
                plan, want,
                "seed {seed} step {step}: incremental plan differs"
            );
            let delta = index.take_delta();
            follow(&mut mirror, &index, &delta);
            assert_eq!(
                mirror, want,
                "seed {seed} step {step}: deltas missed a change"
            );
            check_reverse(&index, &plan, seed, step);
        }
    }
}
