//! The Kubernetes source (what envoy-manager's controller did): watch
//! Services and EndpointSlices (label `kubernetes.io/service-name`) through
//! the apiserver with kube-rs, in `-namespace` or everywhere, and hand every
//! added, changed or deleted object to the proxy as one change; the proxy's
//! index re-evaluates only what the change touches. Changes that arrive
//! while the previous ones are being applied are applied together. After
//! a (re)list, objects not listed any more are deleted. Objects are not kept
//! here: only what the plan reads is, in the index. Needs get/list/watch on
//! services and discovery.k8s.io endpointslices, nothing else.
//!
//! Whether each watch is in sync goes to the proxy's [`SourceSync`]
//! (`/ready`): out of sync from a failed list or watch request or a watch
//! error on, in sync again at its next answered request or event. The
//! requests are seen by a layer of the client's HTTP stack, because the
//! watcher resumes a broken watch silently when nothing changed meanwhile.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::health::readiness::SourceSync;
use crate::routing::index::ObjKey;
use crate::routing::model::{
    self, Endpoint, EndpointConditions, EndpointPort, ObjectMeta, Protocol, SERVICE_NAME_LABEL,
    ServicePort, ServiceSpec, ServiceType, Timestamp,
};
use crate::routing::store::Change;

/// The two watches, as `/ready` names them.
const SERVICES: &str = "services watch";
const SLICES: &str = "endpointslices watch";

/// Changes applied in one go at most: a relist of a large seed is applied
/// in slices of this, so one batch never holds everything twice.
const MAX_BATCH: usize = 4096;

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
    let config = config(kubeconfig).await?;
    kube::Client::try_from(config).map_err(|e| KubeError::Config(e.to_string()))
}

/// A client whose list and watch requests for Services and EndpointSlices
/// report to `sync`: answered (2xx) puts that watch in sync, anything else
/// (an error status, no answer) out of it.
pub async fn watch_client(
    kubeconfig: Option<&std::path::Path>,
    sync: Arc<SourceSync>,
) -> Result<kube::Client, KubeError> {
    let config = config(kubeconfig).await?;
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| KubeError::Config(e.to_string()))?;
    Ok(builder.with_layer(&ObserveWatches { sync }).build())
}

async fn config(kubeconfig: Option<&std::path::Path>) -> Result<kube::Config, KubeError> {
    Ok(match kubeconfig {
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
    })
}

struct ObserveWatches {
    sync: Arc<SourceSync>,
}

impl<S> tower::Layer<S> for ObserveWatches {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            sync: self.sync.clone(),
        }
    }
}

pub struct Observed<S> {
    inner: S,
    sync: Arc<SourceSync>,
}

/// Which watch a request belongs to: a GET of the Services or
/// EndpointSlices collection (all namespaces or one), list or watch.
fn watch_of<B>(req: &http::Request<B>) -> Option<&'static str> {
    if req.method() != http::Method::GET {
        return None;
    }
    match req.uri().path().rsplit('/').next()? {
        "services" => Some(SERVICES),
        "endpointslices" => Some(SLICES),
        _ => None,
    }
}

impl<S, ReqB, B> tower::Service<http::Request<ReqB>> for Observed<S>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let part = watch_of(&req);
        let what = format!("GET {}", req.uri().path());
        let sync = self.sync.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            if let Some(part) = part {
                match &result {
                    Ok(rsp) if rsp.status().is_success() => sync.in_sync(part),
                    Ok(rsp) => sync.failing(part, format!("{what}: {}", rsp.status())),
                    Err(e) => sync.failing(part, format!("{what}: {e}")),
                }
            }
            result
        })
    }
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

/// One watch event of either kind.
enum Event {
    Service(Box<watcher::Event<core::Service>>),
    Slice(Box<watcher::Event<discovery::EndpointSlice>>),
}

/// Where one kind's watch is: the names a (re)list under way has listed so
/// far, to delete those it no longer lists when it ends. Between lists
/// nothing is kept per object: the index knows what it holds.
#[derive(Default)]
struct Known {
    relisting: Option<HashSet<ObjKey>>,
    /// Objects the last list ended with.
    listed: usize,
    synced: bool,
}

impl Known {
    /// Turns one event into changes, given how to make one for an object
    /// (`Some`) or a deletion (`None`), and what a list's end is.
    fn changes<K: kube::Resource>(
        &mut self,
        ev: watcher::Event<K>,
        change: impl Fn(ObjKey, Option<&K>) -> Change,
        listed: impl Fn(HashSet<ObjKey>) -> Change,
        out: &mut Vec<Change>,
    ) {
        let key_of = |o: &K| {
            ObjKey::new(
                o.meta().namespace.as_deref().unwrap_or(""),
                o.meta().name.as_deref().unwrap_or(""),
            )
        };
        match ev {
            watcher::Event::Apply(o) => out.push(change(key_of(&o), Some(&o))),
            watcher::Event::Delete(o) => out.push(change(key_of(&o), None)),
            watcher::Event::Init => self.relisting = Some(HashSet::new()),
            watcher::Event::InitApply(o) => {
                let k = key_of(&o);
                self.relisting.get_or_insert_default().insert(k.clone());
                out.push(change(k, Some(&o)));
            }
            watcher::Event::InitDone => {
                let keys = self.relisting.take().unwrap_or_default();
                self.listed = keys.len();
                out.push(listed(keys));
                self.synced = true;
            }
        }
    }
}

/// Follows Services and EndpointSlices and hands every change to `apply`
/// (the proxy's [`crate::NodePortProxy::apply_changes`]), waiting for one
/// batch to be applied before the next, until the returned future is
/// dropped. The first batch waits until both kinds are listed. Each watch's
/// errors and events go to `sync`.
pub async fn follow<F, Fut>(
    client: kube::Client,
    source: KubeSource,
    sync: Arc<SourceSync>,
    apply: F,
) where
    F: Fn(Vec<Change>) -> Fut,
    Fut: Future<Output = bool>,
{
    let ns = source.namespace.as_deref();
    let services = watcher(
        api::<core::Service>(client.clone(), ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .map(|e| (SERVICES, e.map(|e| Event::Service(Box::new(e)))));
    let slices = watcher(
        api::<discovery::EndpointSlice>(client, ns),
        watcher::Config::default().labels(SERVICE_NAME_LABEL),
    )
    .default_backoff()
    .map(|e| (SLICES, e.map(|e| Event::Slice(Box::new(e)))));
    let events = futures::stream::select(services, slices);
    run(events, &source.expose_annotation_key, &sync, apply).await;
}

async fn run<S, F, Fut>(events: S, key: &str, sync: &SourceSync, apply: F)
where
    S: Stream<Item = (&'static str, Result<Event, watcher::Error>)>,
    F: Fn(Vec<Change>) -> Fut,
    Fut: Future<Output = bool>,
{
    tokio::pin!(events);
    let (mut svcs, mut slices) = (Known::default(), Known::default());
    let service_change = |k: ObjKey, s: Option<&core::Service>| {
        // Only exposed Services matter; one that lost the annotation is gone.
        let s = s.filter(|s| {
            s.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(key))
        });
        Change::Service(k, s.map(service))
    };
    let slice_change =
        |k: ObjKey, s: Option<&discovery::EndpointSlice>| Change::Slice(k, s.map(endpoint_slice));
    let mut pending = Vec::new();
    let mut announced = false;
    loop {
        // Wait for one event, then take whatever else is ready.
        let Some(first) = events.next().await else {
            tracing::error!("kubernetes watches ended");
            return;
        };
        let mut next = Some(first);
        while let Some((part, ev)) = next.take() {
            match &ev {
                // Init comes before the list is requested: it proves nothing.
                Ok(Event::Service(e)) if matches!(**e, watcher::Event::Init) => {}
                Ok(Event::Slice(e)) if matches!(**e, watcher::Event::Init) => {}
                Ok(_) => sync.in_sync(part),
                Err(e) => sync.failing(part, e.to_string()),
            }
            match ev {
                Ok(Event::Service(e)) => {
                    svcs.changes(*e, service_change, Change::ServicesListed, &mut pending)
                }
                Ok(Event::Slice(e)) => {
                    slices.changes(*e, slice_change, Change::SlicesListed, &mut pending)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watching services and endpointslices; retrying")
                }
            }
            if pending.len() >= MAX_BATCH {
                break;
            }
            next = events.next().now_or_never().flatten();
        }
        if !(svcs.synced && slices.synced) || pending.is_empty() {
            continue;
        }
        if !announced {
            announced = true;
            tracing::info!(
                services = svcs.listed,
                endpoint_slices = slices.listed,
                "kubernetes source synced"
            );
        }
        let batch = std::mem::take(&mut pending);
        let n = batch.len();
        if apply(batch).await {
            tracing::debug!(changes = n, "applied kubernetes changes");
        }
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
        // Optional since Kubernetes 1.36's API (an empty slice may omit it).
        endpoints: s
            .endpoints
            .iter()
            .flatten()
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

    /// A relist deletes what it no longer lists, though the source keeps no
    /// key of its own: the index's are the ones compared.
    #[tokio::test]
    async fn a_relist_deletes_what_it_no_longer_lists() {
        use std::sync::Arc;
        let svc = |name: &str| -> core::Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "ns", "name": name,
                    "annotations": {"nodeport-proxy.k8s.io/expose": "Tunneling"}},
                "spec": {"ports": [{"name": "https", "port": 443}]}
            }))
            .unwrap()
        };
        let slice = |name: &str| -> discovery::EndpointSlice {
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "ns", "name": format!("{name}-1"),
                    "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "https", "port": 6443}],
                "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}]
            }))
            .unwrap()
        };
        type Item = (&'static str, Result<Event, watcher::Error>);
        let s = |e: watcher::Event<core::Service>| -> Item {
            (SERVICES, Ok(Event::Service(Box::new(e))))
        };
        let e = |e: watcher::Event<discovery::EndpointSlice>| -> Item {
            (SLICES, Ok(Event::Slice(Box::new(e))))
        };
        let events = vec![
            s(watcher::Event::Init),
            s(watcher::Event::InitApply(svc("a"))),
            s(watcher::Event::InitApply(svc("b"))),
            s(watcher::Event::InitDone),
            e(watcher::Event::Init),
            e(watcher::Event::InitApply(slice("a"))),
            e(watcher::Event::InitApply(slice("b"))),
            e(watcher::Event::InitDone),
            // The slices' watch restarted: b's slice went meanwhile.
            e(watcher::Event::Init),
            e(watcher::Event::InitApply(slice("a"))),
            e(watcher::Event::InitDone),
            e(watcher::Event::Apply(slice("b"))),
            // The Services' watch restarted: b went meanwhile.
            s(watcher::Event::Init),
            s(watcher::Event::InitApply(svc("a"))),
            s(watcher::Event::InitDone),
        ];
        // Each event its own batch: the table after each is seen.
        let events = futures::stream::iter(events).then(|ev| async move {
            tokio::task::yield_now().await;
            ev
        });
        let store = Arc::new(crate::routing::store::TableStore::new(
            crate::routing::plan::PlanOptions::default(),
            std::time::Duration::from_secs(1),
            daemon::drain::Drain::new(),
            crate::stats::metrics::Metrics::new(),
        ));
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (st, sn) = (store.clone(), seen.clone());
        run(
            events,
            crate::routing::expose::DEFAULT_EXPOSE_ANNOTATION_KEY,
            &SourceSync::default(),
            move |changes| {
                let (st, sn) = (st.clone(), sn.clone());
                async move {
                    let changed = st.apply_changes(changes);
                    let t = st.current();
                    let mut routes: Vec<String> = t.tunnels.keys().map(|a| a.to_string()).collect();
                    routes.sort();
                    sn.lock().push(routes);
                    changed
                }
            },
        )
        .await;
        let mut states = seen.lock().clone();
        states.dedup();
        let (a, b) = (
            "a.ns.svc.cluster.local:443".to_string(),
            "b.ns.svc.cluster.local:443".to_string(),
        );
        let both = vec![a.clone(), b];
        assert_eq!(
            states,
            vec![both.clone(), vec![a.clone()], both, vec![a]],
            "tunnel routes after each batch"
        );
    }
}
