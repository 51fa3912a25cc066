//! KKP's lb-updater: the ports of one LoadBalancer Service (`-lb-name` in
//! `-lb-namespace`) follow the exposed NodePort Services, so a cloud load
//! balancer forwards every node port nodeport-proxy listens on.
//!
//! Desired ports: `healthz` 8002, `sni-listener` and `tunneling-listener`
//! when their ports are set, and for every port with a node port N of a
//! Service whose expose annotation is exactly `true` or `NodePort` (and
//! which has a cluster IP) a port N→N. Names follow KKP: an existing port
//! named `<ns>-<svc>-<N>`, the old `<ns>-<svc>-<servicePort>-<N>` or the
//! fixed name keeps its name and the node port the LB already has
//! (re-allocating it would rotate cloud LB targets, KKP #4210); new ones are
//! named `<ns>-<svc>-<N>` with node port 0 for Kubernetes to allocate.

use go_compat::flags::{FlagSet, Given, KkpLogging};
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub const HEALTHZ_PORT: i32 = 8002;

go_compat::typed_flags! {
    /// KKP's lb-updater flags (single dash works), plus `-kubeconfig`.
    pub struct Flags = (FlagSet::new(
        "lb-updater",
        "Keeps the ports of a LoadBalancer Service in step with the NodePort Services exposed by nodeport-proxy.",
    )
    .compatible_with("KKP nodeport-proxy lb-updater")) {
        #[flag("lb-name", "nodeport-lb", "name of the LoadBalancer Service to manage")]
        lb_name: String,
        #[flag("lb-namespace", "nodeport-proxy", "namespace of the LoadBalancer Service")]
        lb_namespace: String,
        #[flag("namespaced", false, "only watch Services in -lb-namespace")]
        namespaced: bool,
        #[flag("expose-annotation-key", "nodeport-proxy.k8s.io/expose", "annotation that marks exposed Services (value true or NodePort)")]
        expose_annotation_key: String,
        #[flag("envoy-sni-port", 0, "adds the LB port sni-listener (0: none)")]
        envoy_sni_port: Given<i64>,
        #[flag("envoy-tunneling-port", 0, "adds the LB port tunneling-listener (0: none)")]
        envoy_tunneling_port: Given<i64>,
        #[flag("kubeconfig", "", "kubeconfig (empty: in-cluster configuration)")]
        kubeconfig: Given<String>,
        #[embed(with_kkp_logging())]
        log: KkpLogging,
    }
}

/// The flags as `--help` lists them.
pub fn flags() -> FlagSet {
    Flags::flag_set()
}

#[derive(Debug, Clone)]
pub struct Options {
    pub lb_name: String,
    pub lb_namespace: String,
    pub namespaced: bool,
    pub expose_annotation_key: String,
    /// 0: no `sni-listener` port.
    pub sni_port: i32,
    /// 0: no `tunneling-listener` port.
    pub tunneling_port: i32,
}

/// One wanted port before names are settled.
struct Wanted {
    /// Fixed name, or `<ns>-<svc>` for Service ports.
    base: String,
    fixed: bool,
    port: i32,
    service_port: i32,
}

fn fixed(name: &str, port: i32) -> Wanted {
    Wanted {
        base: name.to_string(),
        fixed: true,
        port,
        service_port: port,
    }
}

/// Whether lb-updater adds this Service's node ports: the annotation must be
/// exactly `true` or `NodePort` and the Service must have a cluster IP.
pub fn qualifies(svc: &Service, key: &str) -> bool {
    let exposed = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == "true" || v == "NodePort");
    let cluster_ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty());
    exposed && cluster_ip
}

/// The LB's ports as they should be, sorted by name.
pub fn desired_ports(lb: &Service, services: &[Service], opts: &Options) -> Vec<ServicePort> {
    let mut wanted = vec![fixed("healthz", HEALTHZ_PORT)];
    if opts.sni_port > 0 {
        wanted.push(fixed("sni-listener", opts.sni_port));
    }
    if opts.tunneling_port > 0 {
        wanted.push(fixed("tunneling-listener", opts.tunneling_port));
    }
    for svc in services {
        if opts.namespaced && svc.metadata.namespace.as_deref() != Some(opts.lb_namespace.as_str())
        {
            continue;
        }
        if !qualifies(svc, &opts.expose_annotation_key) {
            continue;
        }
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        for p in svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(n) = p.node_port.filter(|n| *n != 0) else {
                continue;
            };
            wanted.push(Wanted {
                base: format!("{ns}-{name}"),
                fixed: false,
                port: n,
                service_port: p.port,
            });
        }
    }
    let existing: Vec<ServicePort> = lb
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    let mut out: Vec<ServicePort> = wanted
        .into_iter()
        .map(|w| {
            let new_name = if w.fixed {
                w.base.clone()
            } else {
                format!("{}-{}", w.base, w.port)
            };
            let old_name = format!("{}-{}-{}", w.base, w.service_port, w.port);
            let keep = existing.iter().find(|e| {
                e.name
                    .as_deref()
                    .is_some_and(|n| n == new_name || (!w.fixed && n == old_name))
            });
            ServicePort {
                name: Some(keep.and_then(|e| e.name.clone()).unwrap_or(new_name)),
                port: w.port,
                target_port: Some(IntOrString::Int(w.port)),
                node_port: keep.and_then(|e| e.node_port).filter(|n| *n != 0),
                protocol: Some("TCP".into()),
                ..Default::default()
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

/// Whether two port lists differ in anything lb-updater sets (an unset
/// node port on our side means "whatever was allocated").
pub fn differs(current: &[ServicePort], desired: &[ServicePort]) -> bool {
    let mut current = current.to_vec();
    current.sort_by(|a, b| a.name.cmp(&b.name));
    current.len() != desired.len()
        || current.iter().zip(desired).any(|(c, d)| {
            c.name != d.name
                || c.port != d.port
                || c.target_port != d.target_port
                || c.protocol.as_deref().unwrap_or("TCP") != d.protocol.as_deref().unwrap_or("TCP")
                || (d.node_port.is_some() && c.node_port != d.node_port)
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn svc(
        ns: &str,
        name: &str,
        ann: Option<&str>,
        cluster_ip: &str,
        ports: &[(i32, i32)],
    ) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name,
                "annotations": ann.map(|a| serde_json::json!({"nodeport-proxy.k8s.io/expose": a})).unwrap_or(serde_json::json!({}))},
            "spec": {"clusterIP": cluster_ip, "type": "NodePort",
                "ports": ports.iter().map(|(p, n)| serde_json::json!({"port": p, "nodePort": n})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    fn lb(ports: &[(&str, i32, i32)]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "nodeport-proxy", "name": "nodeport-lb"},
            "spec": {"type": "LoadBalancer",
                "ports": ports.iter().map(|(n, p, np)| serde_json::json!({"name": n, "port": p, "targetPort": p, "nodePort": np})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    fn opts(sni: i32, tunnel: i32) -> Options {
        Options {
            lb_name: "nodeport-lb".into(),
            lb_namespace: "nodeport-proxy".into(),
            namespaced: false,
            expose_annotation_key: "nodeport-proxy.k8s.io/expose".into(),
            sni_port: sni,
            tunneling_port: tunnel,
        }
    }

    fn names(ports: &[ServicePort]) -> Vec<(String, i32, Option<i32>)> {
        ports
            .iter()
            .map(|p| (p.name.clone().unwrap(), p.port, p.node_port))
            .collect()
    }

    #[test]
    fn ignored_without_annotation_cluster_ip_or_node_port() {
        for s in [
            svc("ns", "a", None, "10.0.0.1", &[(443, 30443)]),
            svc("ns", "a", Some("true"), "", &[(443, 30443)]),
            svc("ns", "a", Some("true"), "10.0.0.1", &[(443, 0)]),
            svc("ns", "a", Some("SNI"), "10.0.0.1", &[(443, 30443)]),
            svc("ns", "a", Some("NodePort,SNI"), "10.0.0.1", &[(443, 30443)]),
        ] {
            let got = desired_ports(&lb(&[]), &[s], &opts(0, 0));
            assert_eq!(names(&got), vec![("healthz".into(), 8002, None)]);
        }
    }

    #[test]
    fn new_names_and_kept_node_ports() {
        let services = [
            svc(
                "cluster-a",
                "apiserver",
                Some("NodePort"),
                "10.0.0.1",
                &[(443, 30443)],
            ),
            svc(
                "cluster-b",
                "apiserver",
                Some("true"),
                "10.0.0.2",
                &[(443, 30444)],
            ),
            svc(
                "cluster-c",
                "apiserver",
                Some("true"),
                "10.0.0.3",
                &[(443, 30445)],
            ),
        ];
        let existing = lb(&[
            ("healthz", 8002, 31002),
            // old schema: kept with its name and LB node port
            ("cluster-b-apiserver-443-30444", 30444, 32001),
            // new schema: kept
            ("cluster-c-apiserver-30445", 30445, 32002),
            // gone
            ("cluster-z-apiserver-30999", 30999, 32003),
        ]);
        let got = desired_ports(&existing, &services, &opts(6443, 8088));
        assert_eq!(
            names(&got),
            vec![
                ("cluster-a-apiserver-30443".into(), 30443, None),
                ("cluster-b-apiserver-443-30444".into(), 30444, Some(32001)),
                ("cluster-c-apiserver-30445".into(), 30445, Some(32002)),
                ("healthz".into(), 8002, Some(31002)),
                ("sni-listener".into(), 6443, None),
                ("tunneling-listener".into(), 8088, None),
            ]
        );
        assert!(differs(
            existing.spec.as_ref().unwrap().ports.as_ref().unwrap(),
            &got
        ));
        // Once applied (the apiserver fills in node ports), nothing differs.
        let mut applied = got.clone();
        for (i, p) in applied.iter_mut().enumerate() {
            p.node_port.get_or_insert(31500 + i as i32);
        }
        assert!(!differs(&applied, &got));
    }

    #[test]
    fn namespaced_only_sees_its_namespace() {
        let services = [
            svc(
                "nodeport-proxy",
                "a",
                Some("true"),
                "10.0.0.1",
                &[(443, 30443)],
            ),
            svc("other", "b", Some("true"), "10.0.0.2", &[(443, 30444)]),
        ];
        let mut o = opts(0, 0);
        o.namespaced = true;
        let got = desired_ports(&lb(&[]), &services, &o);
        assert_eq!(
            names(&got),
            vec![
                ("healthz".into(), 8002, None),
                ("nodeport-proxy-a-30443".into(), 30443, None)
            ]
        );
    }
}
