//! Issue 5, test 3: HA. Servers with `--enable-lease-controller` publish
//! `konnectivity-proxy-server-<id>` Leases (30 s, renewed, labelled) in the
//! real apiserver, garbage-collect expired ones and delete their own on
//! shutdown; an agent behind a load balancer with `--count-server-leases`
//! connects to every server, notices a server added and one removed, with
//! no restarts. Each component uses its own identity with only the RBAC it
//! needs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use integration_tests::k8s::{
    Cluster, ClusterOpts, LoadBalancer, ProxyAgent, ProxyServer, eventually,
};
use integration_tests::watchdog;

async fn lease_json(cluster: &Cluster, name: &str) -> Option<serde_json::Value> {
    let (code, out, _) = cluster
        .kubectl(&["-n", "kube-system", "get", "lease", name, "-o", "json"])
        .await;
    (code == Some(0)).then(|| serde_json::from_str(&out).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_publish_leases_and_agents_count_them() {
    // Build (or find) the harness before the clock starts.
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(600));
    let cluster = Cluster::start(ClusterOpts::default()).await;
    let server_kc = cluster.kubeconfig_for(
        "server-client",
        "system:konnectivity-server",
        &[],
        None,
        None,
    );
    let agent_kc =
        cluster.kubeconfig_for("agent-client", "system:konnectivity-agent", &[], None, None);
    for args in [
        &[
            "-n",
            "kube-system",
            "create",
            "role",
            "konnectivity-server-leases",
            "--verb=get,list,watch,create,update,delete",
            "--resource=leases.coordination.k8s.io",
        ][..],
        &[
            "-n",
            "kube-system",
            "create",
            "rolebinding",
            "konnectivity-server-leases",
            "--role=konnectivity-server-leases",
            "--user=system:konnectivity-server",
        ],
        &[
            "-n",
            "kube-system",
            "create",
            "role",
            "konnectivity-agent-leases",
            "--verb=get,list,watch",
            "--resource=leases.coordination.k8s.io",
        ],
        &[
            "-n",
            "kube-system",
            "create",
            "rolebinding",
            "konnectivity-agent-leases",
            "--role=konnectivity-agent-leases",
            "--user=system:konnectivity-agent",
        ],
    ] {
        cluster.kubectl_ok(args).await;
    }
    // A lease of a server that died long ago: collected by the first GC.
    cluster
        .apply(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: konnectivity-proxy-server-ghost\n  namespace: kube-system\n  labels: {k8s-app: konnectivity-server}\nspec:\n  holderIdentity: ghost\n  leaseDurationSeconds: 30\n  renewTime: \"2020-01-01T00:00:00.000000Z\"\n",
        )
        .await;
    // A valid lease without our label is not ours to touch or count.
    cluster
        .apply(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: something-else\n  namespace: kube-system\nspec:\n  holderIdentity: x\n  leaseDurationSeconds: 30\n  renewTime: \"2020-01-01T00:00:00.000000Z\"\n",
        )
        .await;

    let dir = tempfile::tempdir().unwrap();
    let certs = cluster.konnectivity_certs();
    let ca = cluster.pki.ca();
    let server_flags = vec![
        "--enable-lease-controller".to_string(),
        format!("--kubeconfig={}", server_kc.display()),
        format!("--cluster-ca-cert={}", ca.display()),
        // The static count is deliberately wrong: agents must use leases.
        "--server-count=1".into(),
    ];
    let mut servers = Vec::new();
    for id in ["s1", "s2"] {
        servers
            .push(ProxyServer::start(dir.path(), id, "grpc", &certs.server, &server_flags).await);
    }
    for id in ["s1", "s2"] {
        let name = format!("konnectivity-proxy-server-{id}");
        eventually(
            &format!("lease {name}"),
            Duration::from_secs(10),
            || async { lease_json(&cluster, &name).await.is_some() },
        )
        .await;
        let l = lease_json(&cluster, &name).await.unwrap();
        assert_eq!(l["spec"]["holderIdentity"], id);
        assert_eq!(l["spec"]["leaseDurationSeconds"], 30);
        assert_eq!(l["metadata"]["labels"]["k8s-app"], "konnectivity-server");
    }
    eventually(
        "expired lease collected",
        Duration::from_secs(10),
        || async {
            lease_json(&cluster, "konnectivity-proxy-server-ghost")
                .await
                .is_none()
        },
    )
    .await;
    assert!(lease_json(&cluster, "something-else").await.is_some());
    let mut culled = 0.0;
    for s in &servers {
        culled += s
            .metric("konnectivity_network_proxy_server_culled_leases_count", &[])
            .await;
    }
    assert_eq!(culled, 1.0);

    let lb = LoadBalancer::start(servers.iter().map(|s| s.agent_addr).collect()).await;
    // An agent counting leases with the identity of `kubeconfig`.
    let counting_agent = |id: &'static str, kubeconfig: std::path::PathBuf| {
        let flags = [
            format!("--agent-cert={}", certs.agent.cert.display()),
            format!("--agent-key={}", certs.agent.key.display()),
            "--count-server-leases".into(),
            // Upstream's selector syntax after v0.36.0 (#868), set-based
            // too, through the real API server's parser.
            "--lease-label-selector=k8s-app in (konnectivity-server),tier!=canary".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
        ];
        let (addr, ca) = (lb.addr, ca.clone());
        async move { ProxyAgent::start(id, addr, &ca, &flags).await }
    };
    let mut agent = counting_agent("agent-1", agent_kc.clone()).await;
    agent.wait_servers(2, Duration::from_secs(30)).await;
    assert_eq!(
        agent
            .metric("konnectivity_network_proxy_agent_known_server_count")
            .await,
        2.0
    );
    // Its initial list is one streaming watch (sendInitialEvents), as
    // upstream's client-go informer makes it, counted into lease_lists_total
    // as upstream counts watches; no plain list, so no list latency either.
    let ok = ["http_response_code=\"200\"", "reason=\"\""];
    eventually(
        "agent counted its lease watch",
        Duration::from_secs(10),
        || async {
            agent
                .metric_with("konnectivity_network_proxy_agent_lease_lists_total", &ok)
                .await
                >= 1.0
        },
    )
    .await;
    assert_eq!(
        agent
            .metric_with(
                "konnectivity_network_proxy_agent_lease_list_latency_seconds_count",
                &["http_response_code=\"200\""],
            )
            .await,
        0.0
    );
    // An agent whose identity may not list leases: each refused call is
    // counted with the apiserver's reason, and it keeps its last count (1).
    let nobody_kc = cluster.kubeconfig_for("nobody-client", "system:nobody", &[], None, None);
    let mut refused = counting_agent("agent-refused", nobody_kc).await;
    eventually(
        "refused lease list counted",
        Duration::from_secs(10),
        || async {
            refused
                .metric_with(
                    "konnectivity_network_proxy_agent_lease_lists_total",
                    &["http_response_code=\"403\"", "reason=\"Forbidden\""],
                )
                .await
                >= 1.0
        },
    )
    .await;
    assert_eq!(
        refused
            .metric("konnectivity_network_proxy_agent_known_server_count")
            .await,
        1.0
    );
    refused.stop().await;

    // A third server appears behind the load balancer.
    servers.push(ProxyServer::start(dir.path(), "s3", "grpc", &certs.server, &server_flags).await);
    lb.set(servers.iter().map(|s| s.agent_addr).collect());
    agent.wait_servers(3, Duration::from_secs(30)).await;
    for s in &servers {
        eventually(
            &format!("{} has the agent", s.id),
            Duration::from_secs(10),
            || async {
                s.metric("konnectivity_network_proxy_server_ready_backends", &[])
                    .await
                    == 1.0
            },
        )
        .await;
    }

    // One leaves: its lease is deleted at shutdown and the agent wants 2.
    let mut s2 = servers.remove(1);
    lb.set(servers.iter().map(|s| s.agent_addr).collect());
    assert_eq!(s2.child.stop().await, Some(0));
    s2.child.wait_exit(Duration::from_secs(1)).await;
    assert!(
        lease_json(&cluster, "konnectivity-proxy-server-s2")
            .await
            .is_none()
    );
    eventually(
        "agent counts 2 servers",
        Duration::from_secs(10),
        || async {
            agent
                .metric("konnectivity_network_proxy_agent_known_server_count")
                .await
                == 2.0
        },
    )
    .await;
    agent.wait_servers(2, Duration::from_secs(10)).await;

    // Leases are renewed (every 15 s).
    let first = lease_json(&cluster, "konnectivity-proxy-server-s1")
        .await
        .unwrap()["spec"]["renewTime"]
        .clone();
    eventually("lease renewed", Duration::from_secs(25), || async {
        lease_json(&cluster, "konnectivity-proxy-server-s1")
            .await
            .unwrap()["spec"]["renewTime"]
            != first
    })
    .await;

    agent.stop().await;
    for s in &mut servers {
        assert_eq!(s.child.stop().await, Some(0));
    }
    for id in ["s1", "s3"] {
        assert!(
            lease_json(&cluster, &format!("konnectivity-proxy-server-{id}"))
                .await
                .is_none()
        );
    }
    cluster.stop().await;
}
