//! Issue 5, test 2: agents authenticate with ServiceAccount tokens; the
//! server asks the real kube-apiserver (TokenReview with
//! `--authentication-audience`) using an identity that has only
//! `system:auth-delegator`. Good tokens connect; garbage, wrong-account,
//! wrong-audience and expired tokens are refused; reviews are cached per
//! token, so reconnecting agents cost one TokenReview, not one each
//! (kubernetes #102784), and a refused token is not re-reviewed on every
//! retry either.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use integration_tests::k8s::{Cluster, ClusterOpts, ProxyAgent, ProxyServer, metric_sum};
use integration_tests::watchdog;

const AUDIENCE: &str = "system:konnectivity-server";

fn write_token(dir: &Path, name: &str, token: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, token).unwrap();
    p
}

async fn reviews(cluster: &Cluster) -> f64 {
    metric_sum(
        &cluster.apiserver_metrics().await,
        "apiserver_request_total",
        &["resource=\"tokenreviews\"", "verb=\"POST\""],
    )
}

async fn agent_with_token(name: &str, server: &ProxyServer, ca: &Path, token: &Path) -> ProxyAgent {
    ProxyAgent::start(
        name,
        server.agent_addr,
        ca,
        &[format!("--service-account-token-path={}", token.display())],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_are_reviewed_and_cached() {
    // Build (or find) the harness before the clock starts.
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(600));
    let cluster = Cluster::start(ClusterOpts::default()).await;
    cluster
        .kubectl_ok(&[
            "-n",
            "kube-system",
            "create",
            "serviceaccount",
            "konnectivity-agent",
        ])
        .await;
    cluster
        .kubectl_ok(&["-n", "kube-system", "create", "serviceaccount", "other"])
        .await;
    // The server's own identity may only review tokens.
    let server_kc = cluster.kubeconfig_for(
        "konnectivity-server-client",
        "system:konnectivity-server",
        &[],
        None,
        None,
    );
    cluster
        .kubectl_ok(&[
            "create",
            "clusterrolebinding",
            "konnectivity-server-auth",
            "--clusterrole=system:auth-delegator",
            "--user=system:konnectivity-server",
        ])
        .await;

    let dir = tempfile::tempdir().unwrap();
    let certs = cluster.konnectivity_certs();
    let ca = cluster.pki.ca();
    let mut server = ProxyServer::start(
        dir.path(),
        "s1",
        "grpc",
        &certs.server,
        &[
            "--agent-namespace=kube-system".into(),
            "--agent-service-account=konnectivity-agent".into(),
            format!("--authentication-audience={AUDIENCE}"),
            format!("--kubeconfig={}", server_kc.display()),
        ],
    )
    .await;

    // Three agents and a reconnect with one token: one TokenReview.
    let good = cluster
        .token("kube-system", "konnectivity-agent", AUDIENCE)
        .await;
    let good = write_token(dir.path(), "good", &good);
    let before = reviews(&cluster).await;
    let mut agents = Vec::new();
    for i in 0..3 {
        let a = agent_with_token(&format!("good-{i}"), &server, &ca, &good).await;
        agents.push(a);
    }
    for a in &agents {
        a.wait_servers(1, Duration::from_secs(30)).await;
    }
    agents[0].stop().await;
    agents[0] = agent_with_token("good-0-again", &server, &ca, &good).await;
    agents[0].wait_servers(1, Duration::from_secs(30)).await;
    let after = reviews(&cluster).await;
    assert_eq!(
        after - before,
        1.0,
        "reviews for one token: {}",
        after - before
    );

    // Garbage: refused, and retries within the negative TTL are not re-reviewed.
    let garbage = write_token(dir.path(), "garbage", "not-a-jwt");
    let mut bad = agent_with_token("garbage", &server, &ca, &garbage).await;
    for _ in 0..3 {
        bad.child
            .wait_line("Failed to validate authentication token")
            .await;
    }
    let l = server.child.wait_line("client authentication failed").await;
    assert!(l.contains("garbage"), "{l}");
    let after_bad = reviews(&cluster).await;
    assert_eq!(
        after_bad - after,
        1.0,
        "reviews for a refused token retried 3 times"
    );
    assert_eq!(
        bad.metric("konnectivity_network_proxy_agent_open_server_connections")
            .await,
        0.0
    );
    bad.stop().await;

    // Another account of the same namespace.
    let other = cluster.token("kube-system", "other", AUDIENCE).await;
    let other = write_token(dir.path(), "other", &other);
    let mut a = agent_with_token("other", &server, &ca, &other).await;
    let l = a
        .child
        .wait_line("Failed to validate authentication token")
        .await;
    assert!(
        l.contains("\\\"other\\\" service account") || l.contains("\"other\" service account"),
        "{l}"
    );
    a.stop().await;

    // The right account, but a token for another audience.
    let wrong_aud = cluster
        .token("kube-system", "konnectivity-agent", "some-other-audience")
        .await;
    let wrong_aud = write_token(dir.path(), "wrong-aud", &wrong_aud);
    let mut a = agent_with_token("wrong-audience", &server, &ca, &wrong_aud).await;
    a.child
        .wait_line("Failed to validate authentication token")
        .await;
    a.stop().await;

    // The right account and audience, expired two minutes ago (beyond the
    // apiserver's leeway), signed with the cluster's key.
    let uid = cluster
        .kubectl_ok(&[
            "-n",
            "kube-system",
            "get",
            "serviceaccount",
            "konnectivity-agent",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expired = cluster.sign_token(&serde_json::json!({
        "iss": cluster.issuer,
        "aud": [AUDIENCE],
        "sub": "system:serviceaccount:kube-system:konnectivity-agent",
        "iat": now - 3600,
        "nbf": now - 3600,
        "exp": now - 120,
        "kubernetes.io": {
            "namespace": "kube-system",
            "serviceaccount": {"name": "konnectivity-agent", "uid": uid},
        },
    }));
    // The same claims, still valid: proves the hand-made token is otherwise right.
    let fresh = cluster.sign_token(&serde_json::json!({
        "iss": cluster.issuer,
        "aud": [AUDIENCE],
        "sub": "system:serviceaccount:kube-system:konnectivity-agent",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + 600,
        "kubernetes.io": {
            "namespace": "kube-system",
            "serviceaccount": {"name": "konnectivity-agent", "uid": uid},
        },
    }));
    let expired = write_token(dir.path(), "expired", &expired);
    let mut a = agent_with_token("expired", &server, &ca, &expired).await;
    a.child
        .wait_line("Failed to validate authentication token")
        .await;
    a.stop().await;
    let fresh = write_token(dir.path(), "fresh", &fresh);
    let mut a = agent_with_token("fresh", &server, &ca, &fresh).await;
    a.wait_servers(1, Duration::from_secs(30)).await;
    a.stop().await;

    for a in &mut agents {
        a.stop().await;
    }
    assert_eq!(server.child.stop().await, Some(0));
    cluster.stop().await;
}
