//! Issue 5, tests 4–6 against a real kube-apiserver:
//! nodeport-proxy's Kubernetes source (Services with the expose annotation
//! and their Ready EndpointSlice endpoints; changes applied within a second;
//! live connections on unchanged routes survive; an identity with only
//! get/list/watch on services and endpointslices), lb-updater (KKP's port
//! names, kept node ports), and the reverse path: kubectl through the SNI
//! listener, through tunnel-agent → CONNECT, and through a NodePort, to the
//! real apiserver.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use integration_tests::k8s::{
    Child, Cluster, ClusterOpts, TestNet, eventually, free_port, kubectl_with, logged_addr, ours,
};
use integration_tests::watchdog;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const EXPOSE: &str = "nodeport-proxy.k8s.io/expose";
/// What KKP's deploy/ RBAC grants nodeport-proxy (deploy/nodeport-proxy).
const RBAC: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: nodeport-proxy\nrules:\n- apiGroups: [\"\"]\n  resources: [services]\n  verbs: [get, list, watch]\n- apiGroups: [discovery.k8s.io]\n  resources: [endpointslices]\n  verbs: [get, list, watch]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: nodeport-proxy\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: nodeport-proxy\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: nodeport-proxy\n";

fn service(
    ns: &str,
    name: &str,
    ty: &str,
    annotations: &[(&str, &str)],
    port_name: &str,
    port: u16,
) -> String {
    let ann: String = annotations
        .iter()
        .map(|(k, v)| format!("    {k}: '{v}'\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n  annotations:\n{ann}    harness: 'yes'\nspec:\n  type: {ty}\n  ports:\n  - name: {port_name}\n    port: {port}\n    protocol: TCP\n"
    )
}

fn slice(
    ns: &str,
    name: &str,
    svc: &str,
    port_name: &str,
    endpoints: &[(SocketAddr, bool)],
) -> String {
    let port = endpoints.first().map_or(1, |(a, _)| a.port());
    let eps: String = endpoints
        .iter()
        .map(|(a, ready)| {
            format!(
                "- addresses: ['{}']\n  conditions: {{ready: {ready}}}\n",
                a.ip()
            )
        })
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    kubernetes.io/service-name: {svc}\naddressType: IPv4\nports:\n- name: {port_name}\n  port: {port}\n  protocol: TCP\nendpoints:\n{eps}"
    )
}

async fn node_port(cluster: &Cluster, ns: &str, name: &str) -> u16 {
    cluster
        .kubectl_ok(&[
            "-n",
            ns,
            "get",
            "service",
            name,
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ])
        .await
        .parse()
        .unwrap()
}

async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> bool {
    if s.write_all(msg).await.is_err() {
        return false;
    }
    let mut got = vec![0u8; msg.len()];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got)).await,
        Ok(Ok(_))
    ) && got == msg
}

async fn echoes(port: u16) -> bool {
    match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(mut s) => roundtrip(&mut s, b"ping").await,
        Err(_) => false,
    }
}

async fn refused(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).await.is_err()
}

async fn start_nodeport_proxy(kubeconfig: &Path, extra: &[String]) -> Child {
    let mut args = vec![
        "-source=kubernetes".to_string(),
        format!("-kubeconfig={}", kubeconfig.display()),
        "-bind-address=127.0.0.1".into(),
        "-envoy-stats-port=0".into(),
        "-upstream-connect-timeout=1s".into(),
    ];
    args.extend_from_slice(extra);
    let mut np = Child::spawn_env(
        "nodeport-proxy",
        &ours("nodeport-proxy"),
        &args,
        &[("RUST_LOG", "info")],
    );
    np.wait_line("kubernetes source synced").await;
    np
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodeport_proxy_follows_services_and_endpointslices() {
    // Build (or find) the harness before the clock starts.
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(600));
    let cluster = Cluster::start(ClusterOpts::default()).await;
    cluster.apply(RBAC).await;
    let kc = cluster.kubeconfig_for("nodeport-proxy", "nodeport-proxy", &[], None, None);
    for (verb, resource, want) in [
        ("watch", "services", "yes"),
        ("list", "endpointslices.discovery.k8s.io", "yes"),
        ("create", "services", "no"),
        ("get", "secrets", "no"),
        ("list", "pods", "no"),
    ] {
        let (_, out, _) = cluster
            .kubectl(&["auth", "can-i", verb, resource, "--as=nodeport-proxy", "-A"])
            .await;
        assert_eq!(out.trim(), want, "{verb} {resource}");
    }
    let mut np = start_nodeport_proxy(&kc, &[]).await;
    let net = TestNet::create();
    let ip = net.host_ip.to_string();
    let (e1, e2, e3) = (
        integration_tests::dest::echo_on(&ip).await,
        integration_tests::dest::echo_on(&ip).await,
        integration_tests::dest::echo_on(&ip).await,
    );

    // Create: Service + Ready slice → a NodePort listener within a second.
    cluster
        .apply(&service(
            "default",
            "echo",
            "NodePort",
            &[(EXPOSE, "NodePort")],
            "tcp",
            7000,
        ))
        .await;
    cluster
        .apply(&slice("default", "echo-1", "echo", "tcp", &[(e1, true)]))
        .await;
    let t0 = Instant::now();
    let n_echo = node_port(&cluster, "default", "echo").await;
    eventually("echo listener", Duration::from_secs(1), || echoes(n_echo)).await;
    let created = t0.elapsed();
    let mut live = TcpStream::connect(("127.0.0.1", n_echo)).await.unwrap();
    assert!(roundtrip(&mut live, b"live 1").await);

    // A Service without the annotation is ignored; one with only a
    // not-ready endpoint gets nothing either.
    cluster
        .apply(&service("default", "hidden", "NodePort", &[], "tcp", 7001))
        .await;
    cluster
        .apply(&slice(
            "default",
            "hidden-1",
            "hidden",
            "tcp",
            &[(e3, true)],
        ))
        .await;
    cluster
        .apply(&service(
            "default",
            "unready",
            "NodePort",
            &[(EXPOSE, "true")],
            "tcp",
            7002,
        ))
        .await;
    cluster
        .apply(&slice(
            "default",
            "unready-1",
            "unready",
            "tcp",
            &[(e3, false)],
        ))
        .await;
    // Another exposed Service: once it is served, the ones above were seen.
    cluster
        .apply(&service(
            "default",
            "other",
            "NodePort",
            &[(EXPOSE, "NodePort")],
            "tcp",
            7003,
        ))
        .await;
    cluster
        .apply(&slice("default", "other-1", "other", "tcp", &[(e2, true)]))
        .await;
    let t1 = Instant::now();
    let n_other = node_port(&cluster, "default", "other").await;
    eventually("other listener", Duration::from_secs(1), || echoes(n_other)).await;
    let added = t1.elapsed();
    assert!(refused(node_port(&cluster, "default", "hidden").await).await);
    assert!(refused(node_port(&cluster, "default", "unready").await).await);
    assert!(
        roundtrip(&mut live, b"live 2").await,
        "live connection dropped by an unrelated change"
    );

    // Change the route's endpoints (a second slice): the live connection stays.
    cluster
        .apply(&slice("default", "echo-2", "echo", "tcp", &[(e3, true)]))
        .await;
    cluster
        .apply(&slice(
            "default",
            "unready-1",
            "unready",
            "tcp",
            &[(e3, true)],
        ))
        .await;
    let n_unready = node_port(&cluster, "default", "unready").await;
    eventually("unready becomes ready", Duration::from_secs(1), || {
        echoes(n_unready)
    })
    .await;
    assert!(
        roundtrip(&mut live, b"live 3").await,
        "live connection dropped by an endpoint change"
    );
    for _ in 0..4 {
        assert!(echoes(n_echo).await);
    }

    // Endpoint goes not-ready: its Service disappears within a second.
    cluster
        .apply(&slice("default", "other-1", "other", "tcp", &[(e2, false)]))
        .await;
    eventually("other listener closed", Duration::from_secs(1), || {
        refused(n_other)
    })
    .await;
    // Delete: the listener closes.
    cluster.kubectl_ok(&["delete", "service", "unready"]).await;
    eventually("unready listener closed", Duration::from_secs(1), || {
        refused(n_unready)
    })
    .await;
    assert!(roundtrip(&mut live, b"live 4").await);
    eprintln!("create applied in {created:?}, add in {added:?}");

    let pid = np.pid();
    np.stop().await;
    integration_tests::k8s::assert_gone(&[("nodeport-proxy".into(), pid)]);
    cluster.stop().await;
}

async fn lb_ports(cluster: &Cluster) -> Vec<(String, u16, u16)> {
    let out = cluster
        .kubectl_ok(&[
            "-n",
            "nodeport-proxy",
            "get",
            "service",
            "nodeport-lb",
            "-o",
            "json",
        ])
        .await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut ports: Vec<_> = v["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["port"].as_u64().unwrap() as u16,
                p["nodePort"].as_u64().unwrap_or(0) as u16,
            )
        })
        .collect();
    ports.sort();
    ports
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lb_updater_keeps_the_load_balancer_in_step() {
    // Build (or find) the harness before the clock starts.
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(600));
    let cluster = Cluster::start(ClusterOpts::default()).await;
    for ns in ["nodeport-proxy", "cluster-a", "cluster-b", "cluster-c"] {
        cluster.kubectl_ok(&["create", "namespace", ns]).await;
    }
    cluster
        .apply(&service(
            "cluster-b",
            "apiserver",
            "NodePort",
            &[(EXPOSE, "true")],
            "secure",
            443,
        ))
        .await;
    let nb = node_port(&cluster, "cluster-b", "apiserver").await;
    // The LB already carries b's port under KKP's old name, with a node port
    // of its own that must survive.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: nodeport-lb\n  namespace: nodeport-proxy\nspec:\n  type: LoadBalancer\n  selector: {{app: nodeport-proxy}}\n  ports:\n  - {{name: healthz, port: 8002, targetPort: 8002, protocol: TCP}}\n  - {{name: cluster-b-apiserver-443-{nb}, port: {nb}, targetPort: {nb}, protocol: TCP}}\n"
        ))
        .await;
    let before = lb_ports(&cluster).await;
    let kept =
        |ports: &[(String, u16, u16)], name: &str| ports.iter().find(|p| p.0 == name).map(|p| p.2);
    let healthz_np = kept(&before, "healthz").unwrap();
    let b_np = kept(&before, &format!("cluster-b-apiserver-443-{nb}")).unwrap();

    cluster
        .apply(&service(
            "cluster-a",
            "apiserver",
            "NodePort",
            &[(EXPOSE, "NodePort")],
            "secure",
            443,
        ))
        .await;
    cluster
        .apply(&service(
            "cluster-c",
            "apiserver",
            "NodePort",
            &[],
            "secure",
            443,
        ))
        .await;
    let na = node_port(&cluster, "cluster-a", "apiserver").await;
    let mut updater = Child::spawn_env(
        "lb-updater",
        &ours("lb-updater"),
        &[
            "-lb-name=nodeport-lb".into(),
            "-lb-namespace=nodeport-proxy".into(),
            "-envoy-sni-port=6443".into(),
            "-envoy-tunneling-port=8088".into(),
            format!("-kubeconfig={}", cluster.admin_kubeconfig.display()),
        ],
        &[("RUST_LOG", "info")],
    );
    updater.wait_line("updated load balancer ports").await;
    let names =
        |ports: &[(String, u16, u16)]| ports.iter().map(|p| (p.0.clone(), p.1)).collect::<Vec<_>>();
    let mut want = vec![
        (format!("cluster-a-apiserver-{na}"), na),
        (format!("cluster-b-apiserver-443-{nb}"), nb),
        ("healthz".to_string(), 8002),
        ("sni-listener".to_string(), 6443),
        ("tunneling-listener".to_string(), 8088),
    ];
    want.sort();
    let now = lb_ports(&cluster).await;
    assert_eq!(names(&now), want);
    assert_eq!(
        kept(&now, "healthz"),
        Some(healthz_np),
        "healthz node port rotated"
    );
    assert_eq!(
        kept(&now, &format!("cluster-b-apiserver-443-{nb}")),
        Some(b_np),
        "node port rotated"
    );

    // Removing a's annotation... (lb-updater follows deletes and edits).
    cluster
        .kubectl_ok(&["-n", "cluster-a", "delete", "service", "apiserver"])
        .await;
    updater.wait_line("updated load balancer ports").await;
    let after = lb_ports(&cluster).await;
    assert!(
        after.iter().all(|p| !p.0.starts_with("cluster-a-")),
        "{after:?}"
    );
    assert_eq!(kept(&after, "healthz"), Some(healthz_np));
    assert_eq!(
        kept(&after, &format!("cluster-b-apiserver-443-{nb}")),
        Some(b_np)
    );

    updater.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reaches_the_apiserver_through_sni_tunnel_and_node_port() {
    // Build (or find) the harness before the clock starts.
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(600));
    let host = "cluster-x.seed.example.test";
    let cluster = Cluster::start(ClusterOpts {
        apiserver_names: vec![host.into()],
        ..Default::default()
    })
    .await;
    cluster.apply(RBAC).await;
    cluster
        .kubectl_ok(&["create", "namespace", "cluster-x"])
        .await;
    let net = TestNet::create();
    let apiserver = net.forward_to(([127, 0, 0, 1], cluster.port).into()).await;
    // KKP's Tunneling strategy Service, and a NodePort one.
    cluster
        .apply(&service(
            "cluster-x",
            "apiserver-external",
            "ClusterIP",
            &[
                (EXPOSE, "SNI, Tunneling"),
                (
                    "nodeport-proxy.k8s.io/port-mapping",
                    &format!("{{\"secure\": \"{host}\"}}"),
                ),
            ],
            "secure",
            443,
        ))
        .await;
    cluster
        .apply(&slice(
            "cluster-x",
            "apiserver-external-1",
            "apiserver-external",
            "secure",
            &[(apiserver, true)],
        ))
        .await;
    cluster
        .apply(&service(
            "cluster-x",
            "apiserver-np",
            "NodePort",
            &[(EXPOSE, "NodePort")],
            "secure",
            443,
        ))
        .await;
    cluster
        .apply(&slice(
            "cluster-x",
            "apiserver-np-1",
            "apiserver-np",
            "secure",
            &[(apiserver, true)],
        ))
        .await;
    let (sni, tunnel) = (free_port(), free_port());
    let kc = cluster.kubeconfig_for("nodeport-proxy", "nodeport-proxy", &[], None, None);
    let mut np = start_nodeport_proxy(
        &kc,
        &[
            format!("-envoy-sni-port={sni}"),
            format!("-envoy-tunneling-port={tunnel}"),
        ],
    )
    .await;

    // SNI: the kubeconfig's server name picks the route; TLS is end to end.
    let via_sni =
        cluster.admin_kubeconfig_at("via-sni", &format!("https://127.0.0.1:{sni}"), Some(host));
    eventually("kubectl through SNI", Duration::from_secs(5), || {
        let via_sni = via_sni.clone();
        async move {
            kubectl_with(&via_sni, &["get", "namespace", "cluster-x"], None)
                .await
                .0
                == Some(0)
        }
    })
    .await;
    let (_, out, _) = kubectl_with(
        &via_sni,
        &["get", "namespace", "cluster-x", "-o", "name"],
        None,
    )
    .await;
    assert_eq!(out.trim(), "namespace/cluster-x");
    let (code, version, err) = kubectl_with(&via_sni, &["version", "-o", "json"], None).await;
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(v["serverVersion"]["gitVersion"], "v1.36.1");

    // tunnel-agent → CONNECT on the tunneling port → apiserver (KKP's
    // expose-strategy e2e, "kubectl version" through the agent).
    let mut agent = Child::spawn_env(
        "tunnel-agent",
        &ours("tunnel-agent"),
        &[
            "-proxy-host=127.0.0.1".into(),
            format!("-proxy-port={tunnel}"),
            "-listener=127.0.0.1:0=apiserver-external.cluster-x.svc.cluster.local:443".into(),
            "-stats-port=0".into(),
        ],
        &[("RUST_LOG", "info")],
    );
    let local = logged_addr(&agent.wait_line("tunneling listener").await);
    let via_tunnel = cluster.admin_kubeconfig_at("via-tunnel", &format!("https://{local}"), None);
    let (code, version, err) = kubectl_with(&via_tunnel, &["version", "-o", "json"], None).await;
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(v["serverVersion"]["major"], "1");
    assert_eq!(v["serverVersion"]["minor"], "36");

    // NodePort-exposed apiserver.
    let n = node_port(&cluster, "cluster-x", "apiserver-np").await;
    let via_np = cluster.admin_kubeconfig_at("via-np", &format!("https://127.0.0.1:{n}"), None);
    let (code, out, err) = kubectl_with(
        &via_np,
        &["get", "namespace", "cluster-x", "-o", "name"],
        None,
    )
    .await;
    assert_eq!(
        (code, out.trim()),
        (Some(0), "namespace/cluster-x"),
        "{err}"
    );

    agent.stop().await;
    np.stop().await;
    cluster.stop().await;
}

/// A TCP relay on loopback to the apiserver that a test can cut (every
/// connection through it closed, new ones closed at once) and restore.
struct Relay {
    addr: SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Relay {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (cut, _) = tokio::sync::watch::channel(false);
        let cuts = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                let mut cut = cuts.subscribe();
                if *cut.borrow() {
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                        _ = cut.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Relay { addr, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Readiness that means serving, against a real apiserver: a
/// nodeport-proxy whose identity may not list Services or EndpointSlices
/// yet stays unready (/ready 503 naming the refusal, /healthz 200,
/// nodeport_proxy_source_synced 0); once RBAC allows it, the watcher's next
/// attempt lists and the first table flips /ready to 200. Cut off from the
/// apiserver for longer than -ready-out-of-sync-limit it is unready again,
/// serving the last table; reconnected, it is ready once its watches are
/// answered, though nothing changed meanwhile (no event arrives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodeport_proxy_is_ready_once_its_watch_serves_a_table() {
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(600));
    let cluster = Cluster::start(ClusterOpts::default()).await;
    let relay = Relay::start(SocketAddr::from(([127, 0, 0, 1], cluster.port))).await;
    let kc = cluster.kubeconfig_for(
        "nodeport-proxy",
        "nodeport-proxy",
        &[],
        Some(&format!("https://{}", relay.addr)),
        None,
    );
    let stats = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut np = Child::spawn_env(
        "nodeport-proxy",
        &ours("nodeport-proxy"),
        &[
            "-source=kubernetes".to_string(),
            format!("-kubeconfig={}", kc.display()),
            "-bind-address=127.0.0.1".into(),
            format!("-envoy-stats-port={}", stats.port()),
            "-envoy-admin-port=0".into(),
            "-ready-out-of-sync-limit=2s".into(),
            "-shutdown-delay=0s".into(),
        ],
        &[("RUST_LOG", "info")],
    );
    np.wait_line("serving stats and health").await;
    let get = |path: &'static str| integration_tests::http_get(stats, path);
    // The gauge's value; it must be there, whatever it says.
    let synced = |m: String| {
        assert!(m.contains("\nnodeport_proxy_source_synced "), "{m}");
        integration_tests::k8s::metric_sum(&m, "nodeport_proxy_source_synced", &[])
    };

    // No RBAC: every list is refused; /ready says so, for as long as it is.
    let body = integration_tests::eventually_some(
        "/ready naming the refused list",
        Duration::from_secs(60),
        || async {
            let (code, body) = get("/ready").await;
            (code == 503 && body.contains("403")).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("no routing table from the Kubernetes watch yet"),
        "{body}"
    );
    assert_eq!(get("/healthz").await.0, 200);
    let m = get("/stats/prometheus").await.1;
    assert!(
        m.contains("\nnodeport_proxy_table_last_reload_success_timestamp_seconds 0\n"),
        "no table yet: {m}"
    );
    assert_eq!(synced(m), 0.0);
    np.wait_line("routing source out of sync").await;
    assert_eq!(get("/ready").await.0, 503, "still no table");

    // RBAC granted: the watcher's next attempt (back-off up to 30 s) lists.
    cluster.apply(RBAC).await;
    np.wait_line_within("kubernetes source synced", Duration::from_secs(90))
        .await;
    eventually("/ready 200", Duration::from_secs(10), || async {
        get("/ready").await == (200, "ok\n".to_string())
    })
    .await;
    assert_eq!(synced(get("/stats/prometheus").await.1), 1.0);

    // Cut off: past the limit, unready with the last table still served.
    relay.set_cut(true);
    let body = integration_tests::eventually_some(
        "/ready failing once cut off",
        Duration::from_secs(60),
        || async {
            let (code, body) = get("/ready").await;
            (code == 503).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("the Kubernetes watch out of sync for")
            && body.contains("serving the last table"),
        "{body}"
    );
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(synced(get("/stats/prometheus").await.1), 0.0);

    // Reconnected: nothing changed, so no event; the answered watch
    // requests put it back in sync.
    relay.set_cut(false);
    eventually(
        "/ready 200 after reconnecting",
        Duration::from_secs(90),
        || async { get("/ready").await == (200, "ok\n".to_string()) },
    )
    .await;
    assert_eq!(synced(get("/stats/prometheus").await.1), 1.0);

    let pid = ("nodeport-proxy".to_string(), np.pid());
    np.stop().await;
    integration_tests::k8s::assert_gone(&[pid]);
    cluster.stop().await;
}
