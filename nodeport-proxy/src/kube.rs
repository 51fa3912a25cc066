//! The Kubernetes source (what envoy-manager's controller did): watch
//! Services and EndpointSlices (label `kubernetes.io/service-name`) through
//! the apiserver with kube-rs, in `-namespace` or everywhere, and apply the
//! whole picture to the proxy after every change (a short debounce merges
//! bursts). Only Services carrying the expose annotation, and the slices of
//! those Services, go into the inventory; the plan keeps Ready endpoints only.
//! Needs get/list/watch on services and discovery.k8s.io endpointslices,
//! nothing else.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;

use crate::model::{
    self, Endpoint, EndpointConditions, EndpointPort, Inventory, ObjectMeta, Protocol,
    SERVICE_NAME_LABEL, ServicePort, ServiceSpec, ServiceType, Timestamp,
};

/// Changes arriving within this are applied together.
const DEBOUNCE: Duration = Duration::from_millis(30);

#[derive(Debug, Clone)]
pub struct KubeSource {
    /// Empty: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    pub namespace: Option<String>,
    pub expose_annotation_key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubernetes client configuration: {0}")]
    Config(String),
}

pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| KubeError::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Config(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| KubeError::Config(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| KubeError::Config(e.to_string()))
}

fn api<K>(client: kube::Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

/// Runs one reflector; notifies `changed` on every event and `ready` once
/// the first list is in.
async fn reflect<K>(
    api: Api<K>,
    cfg: watcher::Config,
    writer: reflector::store::Writer<K>,
    changed: Arc<Notify>,
    what: &'static str,
) where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    <K as kube::Resource>::DynamicType: Clone + Eq + std::hash::Hash + Default,
{
    let events = watcher(api, cfg).default_backoff().reflect(writer);
    tokio::pin!(events);
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Ok(_) => changed.notify_one(),
            Err(e) => tracing::warn!(error = %e, "watching {what}; retrying"),
        }
    }
}

/// Follows Services and EndpointSlices and applies every change with
/// `apply` (the proxy's [`crate::NodePortProxy::apply`]) until the returned
/// future is dropped.
pub async fn follow(client: kube::Client, source: KubeSource, apply: impl Fn(&Inventory) -> bool) {
    let ns = source.namespace.as_deref();
    let (services, svc_writer) = reflector::store::<core::Service>();
    let (slices, slice_writer) = reflector::store::<discovery::EndpointSlice>();
    let changed = Arc::new(Notify::new());
    let svc_task = tokio::spawn(reflect(
        api::<core::Service>(client.clone(), ns),
        watcher::Config::default(),
        svc_writer,
        changed.clone(),
        "services",
    ));
    let slice_task = tokio::spawn(reflect(
        api::<discovery::EndpointSlice>(client, ns),
        watcher::Config::default().labels(SERVICE_NAME_LABEL),
        slice_writer,
        changed.clone(),
        "endpointslices",
    ));
    // Abort the watchers when this future is dropped.
    struct Abort(Vec<tokio::task::JoinHandle<()>>);
    impl Drop for Abort {
        fn drop(&mut self) {
            for t in &self.0 {
                t.abort();
            }
        }
    }
    let _abort = Abort(vec![svc_task, slice_task]);

    if services.wait_until_ready().await.is_err() || slices.wait_until_ready().await.is_err() {
        tracing::error!("kubernetes watches ended before their first list");
        return;
    }
    let inv = inventory(&services, &slices, &source.expose_annotation_key);
    tracing::info!(
        services = inv.services.len(),
        endpoint_slices = inv.endpoint_slices.len(),
        "kubernetes source synced"
    );
    apply(&inv);
    loop {
        changed.notified().await;
        tokio::time::sleep(DEBOUNCE).await;
        let inv = inventory(&services, &slices, &source.expose_annotation_key);
        if apply(&inv) {
            tracing::debug!(services = inv.services.len(), "applied a kubernetes change");
        }
    }
}

/// The exposed Services and their slices, in the model's shape.
pub fn inventory(
    services: &Store<core::Service>,
    slices: &Store<discovery::EndpointSlice>,
    key: &str,
) -> Inventory {
    let services: Vec<model::Service> = services
        .state()
        .iter()
        .filter(|s| {
            s.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(key))
        })
        .map(|s| service(s))
        .collect();
    let wanted: HashSet<(&str, &str)> = services
        .iter()
        .map(|s| (s.metadata.namespace.as_str(), s.metadata.name.as_str()))
        .collect();
    let endpoint_slices = slices
        .state()
        .iter()
        .map(|s| endpoint_slice(s))
        .filter(|s| {
            s.service_name()
                .is_some_and(|n| wanted.contains(&(s.metadata.namespace.as_str(), n)))
        })
        .collect();
    Inventory {
        services,
        endpoint_slices,
    }
}

fn meta(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        namespace: m.namespace.clone().unwrap_or_default(),
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        creation_timestamp: m
            .creation_timestamp
            .as_ref()
            .map(|t| Timestamp::from_unix_seconds(t.0.as_second())),
        annotations: m.annotations.clone().unwrap_or_default(),
        labels: m.labels.clone().unwrap_or_default(),
    }
}

fn protocol(p: Option<&str>) -> Protocol {
    match p {
        Some("UDP") => Protocol::Udp,
        Some("SCTP") => Protocol::Sctp,
        _ => Protocol::Tcp,
    }
}

fn port(n: i32) -> u16 {
    u16::try_from(n).unwrap_or(0)
}

pub fn service(s: &core::Service) -> model::Service {
    let spec = s.spec.clone().unwrap_or_default();
    model::Service {
        metadata: meta(&s.metadata),
        spec: ServiceSpec {
            service_type: match spec.type_.as_deref() {
                Some("NodePort") => ServiceType::NodePort,
                Some("LoadBalancer") => ServiceType::LoadBalancer,
                Some("ExternalName") => ServiceType::ExternalName,
                _ => ServiceType::ClusterIP,
            },
            ports: spec
                .ports
                .unwrap_or_default()
                .iter()
                .map(|p| ServicePort {
                    name: p.name.clone().unwrap_or_default(),
                    port: port(p.port),
                    node_port: p.node_port.map(port).unwrap_or(0),
                    protocol: protocol(p.protocol.as_deref()),
                })
                .collect(),
        },
    }
}

pub fn endpoint_slice(s: &discovery::EndpointSlice) -> model::EndpointSlice {
    model::EndpointSlice {
        metadata: meta(&s.metadata),
        ports: s
            .ports
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|p| EndpointPort {
                name: p.name.clone(),
                port: p.port.map(port),
                protocol: protocol(p.protocol.as_deref()),
            })
            .collect(),
        endpoints: s
            .endpoints
            .iter()
            .map(|e| Endpoint {
                addresses: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                conditions: EndpointConditions {
                    ready: e.conditions.as_ref().and_then(|c| c.ready),
                },
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn converts_services_and_slices() {
        let svc: core::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "a", "uid": "u1",
                "creationTimestamp": "2024-01-01T00:00:00Z",
                "annotations": {"nodeport-proxy.k8s.io/expose": "NodePort"}},
            "spec": {"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]}
        }))
        .unwrap();
        let m = service(&svc);
        assert_eq!(m.spec.service_type, ServiceType::NodePort);
        assert_eq!(m.spec.ports[0].node_port, 30080);
        assert_eq!(
            m.metadata.creation_timestamp,
            Some(Timestamp::parse("2024-01-01T00:00:00Z").unwrap())
        );
        let slice: discovery::EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "a-1", "labels": {"kubernetes.io/service-name": "a"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                {"addresses": ["not-an-ip"]}
            ]
        }))
        .unwrap();
        let m = endpoint_slice(&slice);
        assert_eq!(m.service_name(), Some("a"));
        assert_eq!(m.ports[0].port, Some(8080));
        assert_eq!(m.endpoints[0].conditions.ready, Some(true));
        assert_eq!(m.endpoints[1].conditions.ready, Some(false));
        assert!(m.endpoints[2].addresses.is_empty());
    }
}
