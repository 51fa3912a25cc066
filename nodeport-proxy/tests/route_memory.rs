//! What a route costs in memory, counted by the allocator: the bytes in use
//! (jemalloc's `stats.allocated`) that a table of N Services adds, from the
//! table file and from Kubernetes objects, divided by its routes (an SNI
//! host and a tunneling route per Service, as P11 of BENCHMARKS.md has
//! them). Issue 21 asks for at most 2 KiB per route of resident memory;
//! the bound here leaves room under it for what the allocator's pages add.
//!
//! Its own test binary, and one test in it: the count is the whole
//! process's, so nothing may allocate beside it.
#![cfg(feature = "jemalloc")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use nodeport_proxy::routing::plan::PlanOptions;
use nodeport_proxy::routing::store::{Change, TableStore};
use nodeport_proxy::sources::source::{ItemCache, load_items};
use nodeport_proxy::stats::metrics::Metrics;

/// Services per table: enough that fixed costs (256 empty shards per map,
/// the metrics registry) weigh a few bytes per route.
const SERVICES: usize = 5_000;

/// Allocated bytes per route at most (resident memory adds the allocator's
/// partly used pages: about 10 % in P11). Measured: 1,649 (file) and
/// 1,548 (Kubernetes) at 5,000 Services.
const MAX_BYTES_PER_ROUTE: f64 = 1_700.0;

fn allocated() -> f64 {
    daemon::process::allocator_bytes()
        .map(|(allocated, _)| allocated as f64)
        .unwrap_or(0.0)
}

fn table_yaml(n: usize) -> String {
    let ns = "seed-ns";
    let mut s = String::from("services:\n");
    for i in 0..n {
        let _ = write!(
            s,
            "- metadata:\n    namespace: {ns}\n    name: apiserver-{i}\n    uid: uid-{i}\n    creationTimestamp: \"2024-01-01T00:00:00Z\"\n    annotations:\n      nodeport-proxy.k8s.io/expose: \"SNI, Tunneling\"\n      nodeport-proxy.k8s.io/port-mapping: '{{\"https\": \"apiserver-{i}.{ns}.seed.example\"}}'\n  spec:\n    ports:\n    - {{name: https, port: 443, protocol: TCP}}\n"
        );
    }
    s.push_str("endpointSlices:\n");
    for i in 0..n {
        let _ = write!(
            s,
            "- metadata:\n    namespace: {ns}\n    name: apiserver-{i}-1\n    labels: {{kubernetes.io/service-name: apiserver-{i}}}\n  ports: [{{name: https, port: 6443, protocol: TCP}}]\n  endpoints:\n  - addresses: [\"10.0.{}.{}\"]\n    conditions: {{ready: true}}\n",
            i / 250,
            i % 250 + 1
        );
    }
    s
}

/// The changes a Kubernetes watch's initial list makes, converted as the
/// Kubernetes source converts them.
fn kube_changes(n: usize) -> Vec<Change> {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use nodeport_proxy::routing::index::ObjKey;
    let ns = "seed-ns";
    let mut out = Vec::new();
    for i in 0..n {
        let name = format!("apiserver-{i}");
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{i}"),
                "creationTimestamp": "2024-01-01T00:00:00Z",
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
                "annotations": {
                    "nodeport-proxy.k8s.io/expose": "SNI, Tunneling",
                    "nodeport-proxy.k8s.io/port-mapping": format!("{{\"https\": \"{name}.{ns}.seed.example\"}}"),
                }},
            "spec": {"clusterIP": "None", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}
        }))
        .unwrap();
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{name}-1"), "namespace": ns,
                "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
            "endpoints": [{"addresses": [format!("10.0.{}.{}", i / 250, i % 250 + 1)], "conditions": {"ready": true}}]
        }))
        .unwrap();
        out.push(Change::Slice(
            ObjKey::new(ns, &format!("{name}-1")),
            Some(nodeport_proxy::sources::kube::endpoint_slice(&slice)),
        ));
        out.push(Change::Service(
            ObjKey::new(ns, &name),
            Some(nodeport_proxy::sources::kube::service(&svc)),
        ));
    }
    out
}

fn store() -> TableStore {
    TableStore::new(
        PlanOptions::default(),
        Duration::from_secs(1),
        daemon::drain::Drain::new(),
        Metrics::new(),
    )
}

/// Bytes in use per route that `build` leaves behind, run on a thread of
/// its own (its exit hands back what the thread's cache held).
fn per_route<T: Send + 'static>(build: impl FnOnce() -> T + Send + 'static) -> (f64, T) {
    let before = allocated();
    let kept = std::thread::spawn(build).join().unwrap();
    let bytes = allocated() - before;
    (bytes / (2 * SERVICES) as f64, kept)
}

#[test]
fn a_route_costs_at_most_the_bound_from_either_source() {
    // Whatever the first use of each piece allocates once per process.
    let warm = store();
    let mut cache = ItemCache::default();
    load_items(Path::new("t.yaml"), table_yaml(2).as_bytes(), &mut cache)
        .unwrap()
        .apply(&warm);
    warm.apply_changes(kube_changes(2));
    drop((warm, cache));

    let (file, kept_file) = per_route(|| {
        let store = store();
        let mut cache = ItemCache::default();
        let text = table_yaml(SERVICES);
        load_items(Path::new("table.yaml"), text.as_bytes(), &mut cache)
            .unwrap()
            .apply(&store);
        assert_eq!(store.current().route_count(), 2 * SERVICES);
        (store, cache)
    });
    drop(kept_file);
    let (kube, kept_kube) = per_route(|| {
        let store = store();
        let changes = kube_changes(SERVICES);
        for batch in changes.chunks(4096) {
            store.apply_changes(batch.to_vec());
        }
        assert_eq!(store.current().route_count(), 2 * SERVICES);
        store
    });
    drop(kept_kube);
    eprintln!("bytes in use per route: file {file:.0}, kubernetes {kube:.0}");
    assert!(
        file <= MAX_BYTES_PER_ROUTE && kube <= MAX_BYTES_PER_ROUTE,
        "a route costs {file:.0} B (file) and {kube:.0} B (kubernetes), more than {MAX_BYTES_PER_ROUTE} B"
    );
}
