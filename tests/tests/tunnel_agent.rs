//! tunnel-agent → nodeport-proxy → destination, end to end: many local
//! connections share one HTTP/2 connection; TLS to the destination works
//! through it; the agent reconnects when the proxy comes back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use daemon::authority::ConnectAuthority;
use integration_tests::certs::Pki;
use integration_tests::dest;
use integration_tests::nodeport::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tunnel_agent::{AgentConfig, AgentListeners, ListenerSpec, TunnelAgent};

const API_HOST: &str = "apiserver-external.cluster-a.svc.cluster.local";

fn spec(l: &TcpListener, authority: &str) -> ListenerSpec {
    let a = l.local_addr().unwrap();
    ListenerSpec {
        bind_address: a.ip(),
        bind_port: a.port(),
        authority: ConnectAuthority::parse(authority).unwrap(),
    }
}

/// cluster-a's openvpn-server, exposed for tunneling only, served by `echo`.
fn openvpn_to(echo: std::net::SocketAddr) -> serde_json::Value {
    inventory(
        vec![service(
            "cluster-a",
            "openvpn-server",
            "Tunneling",
            "ClusterIP",
            &[("secure", 1194, 0)],
        )],
        vec![slices(
            "cluster-a",
            "openvpn-server",
            "secure",
            &[(echo, true)],
        )],
    )
}

/// A proxy serving `inv` from a file on the tunneling listener `l` only (a
/// proxy back on its port, a new pod on the old one's address); the file's
/// directory lives as long as the returned guard.
async fn tunneling_proxy_on(
    l: TcpListener,
    inv: &serde_json::Value,
) -> (nodeport_proxy::NodePortProxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.json");
    std::fs::write(&file, inv.to_string()).unwrap();
    let mut cfg = test_config();
    cfg.source = nodeport_proxy::TableSource::File(file);
    let p = nodeport_proxy::NodePortProxy::start(
        cfg,
        nodeport_proxy::Listeners {
            tunneling: Some(l),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    (p, dir)
}

/// An agent with its one listener bound already, without stats.
async fn agent_on(config: AgentConfig, local: TcpListener) -> TunnelAgent {
    TunnelAgent::start(
        config,
        AgentListeners {
            tunnels: vec![local],
            stats: None,
            admin: None,
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn agent_tunnels_through_proxy_over_one_connection_and_reconnects() {
    let pki = Pki::new();
    let api = tls_named(&pki, "apiserver", &[API_HOST, "127.0.0.1"]).await;
    let echo = dest::echo().await;
    let inv = inventory(
        vec![
            service(
                "cluster-a",
                "apiserver-external",
                "SNI,Tunneling",
                "ClusterIP",
                &[("secure", 443, 0)],
            ),
            service(
                "cluster-a",
                "openvpn-server",
                "Tunneling",
                "ClusterIP",
                &[("secure", 1194, 0)],
            ),
        ],
        vec![
            slices("cluster-a", "apiserver-external", "secure", &[(api, true)]),
            slices("cluster-a", "openvpn-server", "secure", &[(echo, true)]),
        ],
    );
    let p = start_proxy(&inv, vec![], test_config()).await;
    let (api_l, vpn_l, stats_l) = (loopback().await, loopback().await, loopback().await);
    let stats = stats_l.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "localhost".into(),
        proxy_port: p.tunnel.port(),
        listeners: vec![
            spec(&api_l, &format!("{API_HOST}:443")),
            spec(&vpn_l, "openvpn-server.cluster-a.svc.cluster.local:1194"),
        ],
        drain_timeout: Duration::from_secs(5),
        ..AgentConfig::default()
    };
    let (api_addr, vpn_addr) = (api_l.local_addr().unwrap(), vpn_l.local_addr().unwrap());
    let agent = TunnelAgent::start(
        config,
        AgentListeners {
            tunnels: vec![api_l, vpn_l],
            stats: Some(stats_l),
            admin: None,
        },
    )
    .await
    .unwrap();
    // TLS end to end through the agent, as pods reach the apiserver via 100.64.30.10:6443.
    let resolve = format!("{API_HOST}:{}:127.0.0.1", api_addr.port());
    let ca = pki.ca();
    let url = format!("https://{API_HOST}:{}/", api_addr.port());
    let (ok, body, err) = curl(&[
        "--resolve",
        &resolve,
        "--cacert",
        ca.to_str().unwrap(),
        &url,
    ])
    .await;
    assert!(ok, "{err}");
    assert_eq!(body, "apiserver");
    // Thirty concurrent connections on the other listener.
    let mut tasks = Vec::new();
    for i in 0..30 {
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(vpn_addr).await.unwrap();
            let msg = format!("conn {i} ").repeat(500);
            s.write_all(msg.as_bytes()).await.unwrap();
            let mut back = vec![0u8; msg.len()];
            s.read_exact(&mut back).await.unwrap();
            assert_eq!(back, msg.as_bytes());
            s
        }));
    }
    let mut open = Vec::new();
    for t in tasks {
        open.push(t.await.unwrap());
    }
    let (_, metrics) = p.stats_get("/stats/prometheus").await;
    assert!(
        metrics.contains(
            "envoy_http_downstream_cx_total{envoy_http_conn_manager_prefix=\"ingress_http\"} 1\n"
        ),
        "all tunnels must share one connection: {metrics}"
    );
    assert!(
        metrics.contains(
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"ingress_http\"} 31"
        ),
        "{metrics}"
    );
    drop(open);
    let (code, agent_metrics) = http_get(stats, "/stats/prometheus").await;
    assert_eq!(code, 200);
    assert!(
        agent_metrics
            .contains("envoy_cluster_upstream_rq_total{envoy_cluster_name=\"proxy_cluster\"} 31"),
        "{agent_metrics}"
    );
    assert_eq!(http_get(stats, "/ready").await.0, 200);

    // The proxy goes away and comes back on the same port.
    let tunnel_port = p.tunnel.port();
    p.proxy.shutdown().await;
    let again = TcpListener::bind(("127.0.0.1", tunnel_port)).await.unwrap();
    let (_p2, _dir) = tunneling_proxy_on(again, &inv).await;
    let mut s = TcpStream::connect(vpn_addr).await.unwrap();
    s.write_all(b"after reconnect").await.unwrap();
    let mut back = [0u8; 15];
    tokio::time::timeout(Duration::from_secs(15), s.read_exact(&mut back))
        .await
        .expect("no answer after reconnect")
        .unwrap();
    assert_eq!(&back, b"after reconnect");
    assert!(agent.is_connected());
    drop(s);
    assert!(
        agent.shutdown().await,
        "tunnels did not end within the drain timeout"
    );
}

/// A seed that speaks just enough HTTP/2 by hand to answer the agent's
/// first PING, then goes silent (reads on, answers nothing), as a half-open
/// connection after a load balancer failover does. Sends `()` on `dialled`
/// for every connection accepted.
async fn seed_silent_after_first_pong(seed: TcpListener, dialled: tokio::sync::mpsc::Sender<()>) {
    use integration_tests::h2raw;
    while let Ok((mut io, _)) = seed.accept().await {
        let _ = dialled.send(()).await;
        tokio::spawn(async move {
            let mut preface = [0u8; 24];
            if io.read_exact(&mut preface).await.is_err() || preface != h2raw::PREFACE {
                return;
            }
            if io
                .write_all(&h2raw::frame(h2raw::SETTINGS, 0, 0, &[]))
                .await
                .is_err()
            {
                return;
            }
            let mut answered = false;
            while let Ok((kind, flags, _, payload)) = h2raw::read_frame(&mut io).await {
                let reply = match (kind, flags & 1) {
                    (h2raw::SETTINGS, 0) if !answered => h2raw::frame(h2raw::SETTINGS, 1, 0, &[]),
                    (6, 0) if !answered => {
                        answered = true;
                        h2raw::frame(6, 1, 0, &payload)
                    }
                    _ => continue,
                };
                if io.write_all(&reply).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[tokio::test]
async fn unanswered_ping_drops_the_connection_and_redials() {
    let seed = loopback().await;
    let seed_port = seed.local_addr().unwrap().port();
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(seed_silent_after_first_pong(seed, tx));
    let local = loopback().await;
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: seed_port,
        listeners: vec![spec(&local, "x.ns.svc.cluster.local:1")],
        keepalive_interval: Duration::from_millis(200),
        keepalive_timeout: Duration::from_millis(300),
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("agent never dialled")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), agent.connected())
        .await
        .expect("the first PING was answered, yet the connection was not taken");
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("agent did not notice the dead connection and redial")
        .unwrap();
    assert!(
        agent.metrics_text().contains("envoy_cluster_upstream_cx_destroy_with_active_rq{envoy_cluster_name=\"proxy_cluster\"} 1"),
        "{}",
        agent.metrics_text()
    );
    agent.shutdown().await;
}

/// Reads one counter or gauge value from a Prometheus text body.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn idle_agent_keeps_one_connection_past_the_head_deadline() {
    // Scaled down: a 300 ms request-head deadline on the proxy (the old code
    // closed an idle agent connection when it passed) and a 100 ms PING
    // interval; the pair then idles for 2 s, more than six deadlines and
    // twenty PINGs. The real-time check with KKP's settings (≥ 60 s) is in
    // scripts/soak (section kkp).
    let inv = openvpn_to(dest::echo().await);
    let mut cfg = test_config();
    cfg.request_header_timeout = Duration::from_millis(300);
    let p = start_proxy(&inv, vec![], cfg).await;
    let local = loopback().await;
    let local_addr = local.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: p.tunnel.port(),
        listeners: vec![spec(
            &local,
            "openvpn-server.cluster-a.svc.cluster.local:1194",
        )],
        keepalive_interval: Duration::from_millis(100),
        keepalive_timeout: Duration::from_secs(1),
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    tokio::time::timeout(Duration::from_secs(5), agent.connected())
        .await
        .expect("agent never connected");
    // The idle period is what is under test, not a wait for readiness.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut s = TcpStream::connect(local_addr).await.unwrap();
    s.write_all(b"still here").await.unwrap();
    let mut back = [0u8; 10];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
        .await
        .expect("no answer after idling")
        .unwrap();
    assert_eq!(&back, b"still here");
    let proxy = p.proxy.metrics_text();
    let prefix = "{envoy_http_conn_manager_prefix=\"ingress_http\"}";
    assert_eq!(
        sample(&proxy, &format!("envoy_http_downstream_cx_total{prefix}")),
        Some(1.0),
        "the proxy saw more than one agent connection: {proxy}"
    );
    assert_eq!(
        sample(
            &proxy,
            &format!("envoy_http_downstream_rq_header_timeout{prefix}")
        ),
        Some(0.0),
        "{proxy}"
    );
    let text = agent.metrics_text();
    let cluster = "{envoy_cluster_name=\"proxy_cluster\"}";
    assert_eq!(
        sample(&text, &format!("envoy_cluster_upstream_cx_total{cluster}")),
        Some(1.0),
        "{text}"
    );
    drop(s);
    agent.shutdown().await;
}

#[tokio::test]
async fn a_seed_that_drops_every_connection_is_retried_with_growing_backoff() {
    // Accepts, completes the HTTP/2 handshake, then closes at once: never a
    // healthy connection, so the back-off (100 ms doubling, jitter ±20 %)
    // must keep growing instead of resetting after every dial.
    let seed = loopback().await;
    let seed_port = seed.local_addr().unwrap().port();
    let dials = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = dials.clone();
    tokio::spawn(async move {
        while let Ok((io, _)) = seed.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Ok(mut conn) = h2::server::handshake(io).await {
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                let _ = futures::future::poll_fn(|cx| conn.poll_closed(cx)).await;
            }
        }
    });
    let local = loopback().await;
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: seed_port,
        listeners: vec![spec(&local, "x.ns.svc.cluster.local:1")],
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let n = dials.load(std::sync::atomic::Ordering::Relaxed);
    // Dials at 0 and after ≥ 80, 240, 560 and 1200 ms: at most 5 in 1.5 s
    // (a reset after each dial would give about 15).
    assert!((2..=5).contains(&n), "{n} dials in 1.5 s");
    agent.shutdown().await;
}

/// KKP's rendered bootstrap (tunnel-agent/testdata) with the listener moved
/// to `listener`, the seed to 127.0.0.1:`seed_port` and the tunnel to
/// `authority`.
fn kkp_bootstrap(listener: std::net::SocketAddr, seed_port: u16, authority: &str) -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tunnel-agent/testdata/kkp-envoy-agent.yaml"),
    )
    .unwrap();
    let replace = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "fixture lacks {from:?}");
        text.replacen(from, to, 1)
    };
    let text = replace(
        text,
        "        address: 127.0.0.1\n        port_value: 6443",
        &format!(
            "        address: 127.0.0.1\n        port_value: {}",
            listener.port()
        ),
    );
    let text = replace(
        text,
        "address: localhost\n                      port_value: 8088",
        &format!("address: 127.0.0.1\n                      port_value: {seed_port}"),
    );
    replace(
        text,
        "apiserver-external.cluster-abc.svc.cluster.local:443",
        authority,
    )
}

async fn wait_metric(agent: &TunnelAgent, series: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = agent.metrics_text();
        if sample(&text, series) == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} never reached {want}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_broken_config_is_reported_once_per_change_and_the_last_good_one_kept() {
    let (a, b) = (dest::greeter(b"A").await, dest::greeter(b"B").await);
    let inv = inventory(
        vec![
            service("cluster-x", "a", "Tunneling", "ClusterIP", &[("tcp", 1, 0)]),
            service("cluster-x", "b", "Tunneling", "ClusterIP", &[("tcp", 1, 0)]),
        ],
        vec![
            slices("cluster-x", "a", "tcp", &[(a, true)]),
            slices("cluster-x", "b", "tcp", &[(b, true)]),
        ],
    );
    let (p1, p2) = (
        start_proxy(&inv, vec![], test_config()).await,
        start_proxy(&inv, vec![], test_config()).await,
    );
    let local = loopback().await;
    let local_addr = local.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.yaml");
    let write = |text: &str| {
        let tmp = dir.path().join("envoy.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    let good = kkp_bootstrap(
        local_addr,
        p1.tunnel.port(),
        "a.cluster-x.svc.cluster.local:1",
    );
    write(&good);
    let flags = tunnel_agent::cli::FlagSettings::default();
    let (config, _) = flags
        .resolve(Some(&tunnel_agent::bootstrap::load(&path).unwrap()))
        .unwrap();
    let stats_l = loopback().await;
    let stats = stats_l.local_addr().unwrap();
    let agent = std::sync::Arc::new(
        TunnelAgent::start(
            config,
            AgentListeners {
                tunnels: vec![local],
                stats: Some(stats_l),
                admin: None,
            },
        )
        .await
        .unwrap(),
    );
    // Watching from here on: what the test writes next is seen.
    let follow = tunnel_agent::reload::Follow::new(
        agent.clone(),
        path.clone(),
        good.clone().into_bytes(),
        flags,
        None,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let follower = tokio::spawn(follow.run(None, async move {
        let _ = stopped.await;
    }));
    let greet = |want: &'static [u8]| async move {
        let mut s = TcpStream::connect(local_addr).await.unwrap();
        let mut got = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
            .await
            .expect("no greeting")
            .unwrap();
        assert_eq!(&got, want);
        s
    };
    let mut first = greet(b"A").await;

    let failed = "tunnel_agent_config_reloads_total{result=\"failed\"}";
    let applied = "tunnel_agent_config_reloads_total{result=\"applied\"}";
    let broken = good.replace("admin:\n", "admin:\n  profile_pathx: /x\n");
    write(&broken);
    wait_metric(&agent, failed, 1.0).await;
    // Still serving on the last good configuration, and saying why not the new one.
    drop(greet(b"A").await);
    let (code, health) = http_get(stats, "/healthz").await;
    assert_eq!(code, 200);
    assert!(
        health.contains("envoy.yaml") && health.contains("profile_path"),
        "{health}"
    );
    let other_broken = good.replace("connect_timeout: 5s", "connect_timeout: soon");
    write(&other_broken);
    wait_metric(&agent, failed, 2.0).await;
    // The same broken file written again is no new change: nothing logged
    // or counted (the old code logged an error every 50 ms).
    write(&other_broken);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A good file naming another seed and another authority applies
    // without a restart.
    write(&kkp_bootstrap(
        local_addr,
        p2.tunnel.port(),
        "b.cluster-x.svc.cluster.local:1",
    ));
    wait_metric(&agent, applied, 1.0).await;
    assert_eq!(sample(&agent.metrics_text(), failed), Some(2.0));
    assert_eq!(http_get(stats, "/healthz").await.1, "ok");
    let mut second = greet(b"B").await;
    // The tunnel opened before runs on over the old seed connection.
    first.write_all(b"old").await.unwrap();
    let mut back = [0u8; 3];
    first.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"old");
    second.write_all(b"new").await.unwrap();
    second.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"new");
    let prefix = "{envoy_http_conn_manager_prefix=\"ingress_http\"}";
    assert_eq!(
        sample(
            &p2.proxy.metrics_text(),
            &format!("envoy_http_downstream_cx_total{prefix}")
        ),
        Some(1.0)
    );
    drop((first, second));
    let _ = stop.send(());
    follower.await.unwrap();
    agent.shutdown().await;
}

/// `/debug/connections` on the agent's admin listener: a live tunnel with
/// its source, authority, seed, state and bytes; a refused one closed with
/// the seed's answer as its reason; not served on the stats port.
#[tokio::test]
async fn debug_connections_lists_live_and_closed_tunnels() {
    let echo = dest::echo().await;
    let inv = tunneling_echo(echo);
    let p = start_proxy(&inv, vec![], test_config()).await;
    let (ok_l, bad_l, stats_l, admin_l) = (
        loopback().await,
        loopback().await,
        loopback().await,
        loopback().await,
    );
    let (ok_addr, bad_addr) = (ok_l.local_addr().unwrap(), bad_l.local_addr().unwrap());
    let (stats, admin) = (stats_l.local_addr().unwrap(), admin_l.local_addr().unwrap());
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: p.tunnel.port(),
        listeners: vec![
            spec(&ok_l, TUNNELED_ECHO),
            spec(&bad_l, "missing.cluster-a.svc.cluster.local:7000"),
        ],
        ..AgentConfig::default()
    };
    let agent = TunnelAgent::start(
        config,
        AgentListeners {
            tunnels: vec![ok_l, bad_l],
            stats: Some(stats_l),
            admin: Some(admin_l),
        },
    )
    .await
    .unwrap();
    agent.connected().await;
    let mut c = TcpStream::connect(ok_addr).await.unwrap();
    let data = vec![1u8; 5000];
    assert_eq!(dest::roundtrip(&mut c, &data).await, data);
    let mut refused = TcpStream::connect(bad_addr).await.unwrap();
    let mut rest = Vec::new();
    let _ = refused.read_to_end(&mut rest).await;
    let mut doc = serde_json::Value::Null;
    for _ in 0..200 {
        let (code, body) = integration_tests::http_get(admin, "/debug/connections").await;
        assert_eq!(code, 200, "{body}");
        doc = serde_json::from_str(&body).unwrap();
        let live_done = doc["live"][0]["bytes_from_upstream"] == 5000;
        if live_done && doc["closed"].as_array().is_some_and(|c| !c.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let live = &doc["live"][0];
    assert_eq!(doc["live_total"], 1, "{doc:#}");
    assert_eq!(live["kind"], "tunnel");
    assert_eq!(live["source"], c.local_addr().unwrap().to_string());
    assert_eq!(live["target"], TUNNELED_ECHO);
    assert_eq!(live["upstream"], format!("127.0.0.1:{}", p.tunnel.port()));
    assert_eq!(live["listener"], ok_addr.to_string());
    assert_eq!(live["state"], "established");
    assert_eq!(live["bytes_from_client"], 5000);
    let closed = &doc["closed"][0];
    assert_eq!(closed["target"], "missing.cluster-a.svc.cluster.local:7000");
    assert!(
        closed["close_reason"]
            .as_str()
            .is_some_and(|r| r.contains("404")),
        "{doc:#}"
    );
    let (code, _) = integration_tests::http_get(stats, "/debug/connections").await;
    assert_eq!(code, 404);
    // Issue 38.4: closes are counted by reason, as listed (`close_cause`).
    assert_eq!(closed["close_cause"], "dial_refused", "{doc:#}");
    wait_metric(
        &agent,
        "tunnel_agent_connections_closed_total{kind=\"tunnel\",reason=\"dial_refused\"}",
        1.0,
    )
    .await;
    c.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest).await;
    drop(c);
    wait_metric(
        &agent,
        "tunnel_agent_connections_closed_total{kind=\"tunnel\",reason=\"closed\"}",
        1.0,
    )
    .await;
    agent.shutdown().await;
}

/// A rolling update of nodeport-proxy: the old pod drains (GOAWAY, its
/// long-lived tunnels run on for the drain period) while a new pod serves
/// the same address. New local connections must go to the new pod at once,
/// as Envoy's connection pool does after a GOAWAY, not wait out the old
/// pod's drain on a connection that takes no new streams.
#[tokio::test]
async fn a_draining_seed_is_replaced_for_new_tunnels_while_old_ones_run_on() {
    let inv = openvpn_to(dest::echo().await);
    let mut old_cfg = test_config();
    // Longer than this test waits for the new pod to serve.
    old_cfg.drain_timeout = Duration::from_secs(60);
    let old = start_proxy(&inv, vec![], old_cfg).await;
    let local = loopback().await;
    let addr = local.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: old.tunnel.port(),
        listeners: vec![spec(
            &local,
            "openvpn-server.cluster-a.svc.cluster.local:1194",
        )],
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    async fn exchange(s: &mut TcpStream, msg: &[u8]) {
        s.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(15), s.read_exact(&mut back))
            .await
            .expect("no echo within 15 s")
            .unwrap();
        assert_eq!(back, msg);
    }
    let mut held = TcpStream::connect(addr).await.unwrap();
    exchange(&mut held, b"held open").await;

    // The old pod starts draining; once its listener is gone, the new pod
    // takes the address.
    let tunnel_port = old.tunnel.port();
    let old = std::sync::Arc::new(old);
    let draining = {
        let old = old.clone();
        tokio::spawn(async move { old.proxy.shutdown().await })
    };
    let again = integration_tests::eventually_some(
        "the old pod's tunnel listener closed",
        Duration::from_secs(10),
        || async { TcpListener::bind(("127.0.0.1", tunnel_port)).await.ok() },
    )
    .await;
    let (new, _dir) = tunneling_proxy_on(again, &inv).await;

    // A new connection is served by the new pod, well before the old pod's
    // drain ends.
    let mut fresh = TcpStream::connect(addr).await.unwrap();
    exchange(&mut fresh, b"served by the new pod").await;
    assert!(
        !draining.is_finished(),
        "the old pod stopped draining early"
    );
    let served = new.metrics_text();
    assert!(
        served.contains(
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"ingress_http\"} 1\n"
        ),
        "the new pod must have served the new tunnel: {served}"
    );
    // The tunnel opened before the drain runs on, on the old pod.
    exchange(&mut held, b"still served by the old pod").await;
    drop((held, fresh));
    assert!(
        draining.await.unwrap(),
        "the old pod's drain did not end cleanly"
    );
    assert!(agent.shutdown().await);
    new.shutdown().await;
}

/// Echoes a CONNECT stream's bytes back, ending its answer when the
/// request ends.
fn echo_stream(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
) {
    tokio::spawn(async move {
        let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
            return;
        };
        let mut body = req.into_body();
        while let Some(Ok(data)) = body.data().await {
            let _ = body.flow_control().release_capacity(data.len());
            send.reserve_capacity(data.len());
            if send.send_data(data, false).is_err() {
                return;
            }
        }
        let _ = send.send_data(bytes::Bytes::new(), true);
    });
}

/// A hand-made seed: on each connection it accepts, `refuse(connection
/// index, stream index on it)` says whether a CONNECT stream is refused
/// with REFUSED_STREAM; the others are echoed. Counts streams per
/// connection.
fn refusing_seed(
    seed: TcpListener,
    refuse: fn(usize, usize) -> bool,
) -> std::sync::Arc<std::sync::Mutex<Vec<usize>>> {
    let streams = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let counts = streams.clone();
    tokio::spawn(async move {
        while let Ok((io, _)) = seed.accept().await {
            let index = {
                let mut c = counts.lock().unwrap();
                c.push(0);
                c.len() - 1
            };
            let counts = counts.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(io).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let n = {
                        let mut c = counts.lock().unwrap();
                        c[index] += 1;
                        c[index]
                    };
                    if refuse(index, n) {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                    } else {
                        echo_stream(req, respond);
                    }
                }
            });
        }
    });
    streams
}

async fn echo_once(addr: std::net::SocketAddr, msg: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(15), s.read_exact(&mut back))
        .await
        .expect("no echo within 15 s")
        .unwrap();
    assert_eq!(back, msg);
    s
}

/// A stream the seed refuses with REFUSED_STREAM (it did not process it) is
/// opened once more; refused on a connection that carries nothing else, it
/// is opened on a new connection that replaces it.
#[tokio::test]
async fn a_refused_stream_is_opened_again() {
    let seed = loopback().await;
    let seed_port = seed.local_addr().unwrap().port();
    let streams = refusing_seed(seed, |conn, stream| conn == 0 && stream == 1);
    let local = loopback().await;
    let addr = local.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: seed_port,
        listeners: vec![spec(&local, "x.ns.svc.cluster.local:1")],
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    let s = echo_once(addr, b"once more").await;
    let metrics = agent.metrics_text();
    for series in [
        "envoy_cluster_upstream_rq_retry{envoy_cluster_name=\"proxy_cluster\"} 1\n",
        "envoy_cluster_upstream_rq_total{envoy_cluster_name=\"proxy_cluster\"} 2\n",
        "envoy_cluster_upstream_cx_total{envoy_cluster_name=\"proxy_cluster\"} 2\n",
    ] {
        assert!(metrics.contains(series), "{series}: {metrics}");
    }
    assert_eq!(*streams.lock().unwrap(), [1, 1]);
    drop(s);
    agent.shutdown().await;
}

/// Envoy's pool: a connection that refuses a stream while it carries
/// others takes no new stream until one of those ends; the refused one and
/// the next go to another connection, dialled for them. Once a tunnel on
/// the first ends, it takes streams again.
#[tokio::test]
async fn a_connection_that_refuses_a_stream_is_relieved_by_another() {
    let seed = loopback().await;
    let seed_port = seed.local_addr().unwrap().port();
    let streams = refusing_seed(seed, |conn, stream| conn == 0 && stream == 2);
    let local = loopback().await;
    let addr = local.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: seed_port,
        listeners: vec![spec(&local, "x.ns.svc.cluster.local:1")],
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    let a = echo_once(addr, b"first").await;
    let b = echo_once(addr, b"refused on the first, served on a second").await;
    assert_eq!(*streams.lock().unwrap(), [2, 1]);
    let c = echo_once(addr, b"the first is still full").await;
    assert_eq!(*streams.lock().unwrap(), [2, 2]);
    assert_eq!(agent.seed_connections(), 2);
    drop(a);
    let cluster = "{envoy_cluster_name=\"proxy_cluster\"}";
    wait_metric(
        &agent,
        &format!("envoy_cluster_upstream_rq_active{cluster}"),
        2.0,
    )
    .await;
    let d = echo_once(addr, b"room again on the first").await;
    assert_eq!(*streams.lock().unwrap(), [3, 2]);
    let metrics = agent.metrics_text();
    assert_eq!(
        sample(
            &metrics,
            &format!("envoy_cluster_upstream_cx_total{cluster}")
        ),
        Some(2.0),
        "{metrics}"
    );
    drop((b, c, d));
    agent.shutdown().await;
}

/// A seed whose first connection advertises SETTINGS_MAX_CONCURRENT_STREAMS
/// = 0 and answers PINGs: new local connections are served on a second
/// connection (the real nodeport-proxy behind it) instead of waiting on the
/// first until they time out, while the first stays up.
#[tokio::test]
async fn a_seed_connection_allowing_no_streams_does_not_wedge_new_tunnels() {
    let inv = openvpn_to(dest::echo().await);
    let p = start_proxy(&inv, vec![], test_config()).await;
    let real = p.tunnel;
    let front = loopback().await;
    let front_port = front.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut io, _)) = front.accept().await {
            if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::Builder::new()
                        .max_concurrent_streams(0)
                        .handshake::<_, bytes::Bytes>(io)
                        .await
                    else {
                        return;
                    };
                    // Answers SETTINGS and PINGs for as long as it is kept.
                    while let Some(Ok((_, mut respond))) = conn.accept().await {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                    }
                });
            } else {
                tokio::spawn(async move {
                    let mut up = TcpStream::connect(real).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut io, &mut up).await;
                });
            }
        }
    });
    let local = loopback().await;
    let addr = local.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: front_port,
        listeners: vec![spec(
            &local,
            "openvpn-server.cluster-a.svc.cluster.local:1194",
        )],
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    agent.connected().await;
    let mut open = Vec::new();
    for i in 0..5 {
        open.push(echo_once(addr, format!("tunnel {i}").as_bytes()).await);
    }
    let metrics = agent.metrics_text();
    let cluster = "{envoy_cluster_name=\"proxy_cluster\"}";
    for (series, want) in [
        ("envoy_cluster_upstream_cx_total", 2.0),
        ("envoy_cluster_upstream_cx_active", 2.0),
        ("envoy_cluster_upstream_rq_total", 5.0),
        ("envoy_cluster_upstream_rq_pending_failure_eject", 0.0),
    ] {
        assert_eq!(
            sample(&metrics, &format!("{series}{cluster}")),
            Some(want),
            "{series}: {metrics}"
        );
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    let proxy = p.proxy.metrics_text();
    assert_eq!(
        sample(
            &proxy,
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"ingress_http\"}"
        ),
        Some(5.0),
        "{proxy}"
    );
    drop(open);
    agent.shutdown().await;
}

/// KKP's scale case (issue 33): 1,100 tunnels from one node, all open at
/// once, through the real nodeport-proxy, which allows 1,024 streams per
/// connection: the agent opens a second connection for the last 76 (it
/// used to queue them on the first until they timed out), and no more.
#[tokio::test]
async fn eleven_hundred_tunnels_open_through_a_seed_allowing_1024_per_connection() {
    const TUNNELS: usize = 1100;
    daemon::process::raise_open_files_limit();
    let inv = openvpn_to(dest::echo().await);
    let p = start_proxy(&inv, vec![], test_config()).await;
    let local = loopback().await;
    let addr = local.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: p.tunnel.port(),
        listeners: vec![spec(
            &local,
            "openvpn-server.cluster-a.svc.cluster.local:1194",
        )],
        drain_timeout: Duration::from_secs(5),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    agent.connected().await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..TUNNELS {
        tasks.spawn(async move { echo_once(addr, format!("tunnel {i:04}").as_bytes()).await });
    }
    let mut open = Vec::with_capacity(TUNNELS);
    while let Some(s) = tasks.join_next().await {
        open.push(s.unwrap());
    }
    assert_eq!(open.len(), TUNNELS);
    let cluster = "{envoy_cluster_name=\"proxy_cluster\"}";
    let metrics = agent.metrics_text();
    for (series, want) in [
        ("envoy_cluster_upstream_rq_active", TUNNELS as f64),
        ("envoy_cluster_upstream_cx_total", 2.0),
        ("envoy_cluster_upstream_rq_pending_failure_eject", 0.0),
    ] {
        assert_eq!(
            sample(&metrics, &format!("{series}{cluster}")),
            Some(want),
            "{series}: {metrics}"
        );
    }
    let proxy = p.proxy.metrics_text();
    let prefix = "{envoy_http_conn_manager_prefix=\"ingress_http\"}";
    assert_eq!(
        sample(&proxy, &format!("envoy_http_downstream_cx_total{prefix}")),
        Some(2.0),
        "{proxy}"
    );
    drop(open);
    wait_metric(
        &agent,
        &format!("envoy_cluster_upstream_rq_active{cluster}"),
        0.0,
    )
    .await;
    assert!(agent.shutdown().await);
}

/// Reloads are held to what Envoy's bootstrap validation refuses (PGV
/// bounds, protobuf's and Envoy's duration ranges) and to ours (a listener
/// on a kernel-picked port): each is refused, counted, named on /healthz,
/// and the previous bootstrap keeps serving on the same listener.
#[tokio::test]
async fn a_reload_envoy_would_refuse_keeps_the_previous_bootstrap_serving() {
    let echo = dest::greeter(b"G").await;
    let inv = inventory(
        vec![service(
            "cluster-x",
            "g",
            "Tunneling",
            "ClusterIP",
            &[("tcp", 1, 0)],
        )],
        vec![slices("cluster-x", "g", "tcp", &[(echo, true)])],
    );
    let p = start_proxy(&inv, vec![], test_config()).await;
    let local = loopback().await;
    let local_addr = local.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.yaml");
    let write = |text: &str| {
        let tmp = dir.path().join("envoy.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    let good = kkp_bootstrap(
        local_addr,
        p.tunnel.port(),
        "g.cluster-x.svc.cluster.local:1",
    );
    write(&good);
    let flags = tunnel_agent::cli::FlagSettings::default();
    let (config, _) = flags
        .resolve(Some(&tunnel_agent::bootstrap::load(&path).unwrap()))
        .unwrap();
    let stats_l = loopback().await;
    let stats = stats_l.local_addr().unwrap();
    let agent = std::sync::Arc::new(
        TunnelAgent::start(
            config,
            AgentListeners {
                tunnels: vec![local],
                stats: Some(stats_l),
                admin: None,
            },
        )
        .await
        .unwrap(),
    );
    let follow = tunnel_agent::reload::Follow::new(
        agent.clone(),
        path.clone(),
        good.clone().into_bytes(),
        flags,
        None,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let follower = tokio::spawn(follow.run(None, async move {
        let _ = stopped.await;
    }));
    let greet = || async move {
        let mut s = TcpStream::connect(local_addr).await.unwrap();
        let mut got = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
            .await
            .expect("no greeting")
            .unwrap();
        assert_eq!(&got, b"G");
    };
    greet().await;
    let failed = "tunnel_agent_config_reloads_total{result=\"failed\"}";
    let listener = format!(
        "        address: 127.0.0.1\n        port_value: {}",
        local_addr.port()
    );
    let cases = [
        (
            "interval: 30s",
            "interval: 0.000000001s".to_string(),
            "connection_keepalive.interval",
        ),
        (
            "connect_timeout: 5s",
            "connect_timeout: 100000000000000000s".to_string(),
            "connect_timeout",
        ),
        (
            "connect_timeout: 5s",
            "connect_timeout: 0s".to_string(),
            "greater than 0s",
        ),
        (
            listener.as_str(),
            "        address: 127.0.0.1\n        port_value: 0".to_string(),
            "port_value 0",
        ),
    ];
    for (i, (anchor, replacement, want)) in cases.iter().enumerate() {
        assert!(good.contains(anchor), "fixture lacks {anchor:?}");
        write(&good.replacen(anchor, replacement, 1));
        wait_metric(&agent, failed, (i + 1) as f64).await;
        let (code, health) = http_get(stats, "/healthz").await;
        assert_eq!(code, 200);
        assert!(health.contains(want), "{want}: {health}");
        assert_eq!(agent.local_addrs(), [local_addr]);
        assert_eq!(agent.config().connect_timeout, Duration::from_secs(5));
        greet().await;
    }
    // A good file again, with a longer PING interval: applied.
    write(&good.replacen("interval: 30s", "interval: 7s", 1));
    wait_metric(
        &agent,
        "tunnel_agent_config_reloads_total{result=\"applied\"}",
        1.0,
    )
    .await;
    assert_eq!(agent.config().keepalive_interval, Duration::from_secs(7));
    greet().await;
    let _ = stop.send(());
    follower.await.unwrap();
    agent.shutdown().await;
}

/// The pool grows with the streams the seed allows per connection and
/// shrinks back when the load ends: with nodeport-proxy allowing 2 streams
/// per connection, 5 tunnels take 3 connections; once they end, the
/// connections beyond the first close after the pool's idle timeout.
#[tokio::test]
async fn extra_seed_connections_open_under_load_and_close_when_it_ends() {
    let inv = openvpn_to(dest::echo().await);
    let mut cfg = test_config();
    cfg.max_streams_per_connection = 2;
    let p = start_proxy(&inv, vec![], cfg).await;
    let local = loopback().await;
    let addr = local.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: p.tunnel.port(),
        listeners: vec![spec(
            &local,
            "openvpn-server.cluster-a.svc.cluster.local:1194",
        )],
        pool_idle_timeout: Duration::from_millis(200),
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    let mut open = Vec::new();
    for i in 0..5 {
        open.push(echo_once(addr, format!("tunnel {i}").as_bytes()).await);
    }
    assert_eq!(agent.seed_connections(), 3);
    let cluster = "{envoy_cluster_name=\"proxy_cluster\"}";
    assert_eq!(
        sample(
            &agent.metrics_text(),
            &format!("envoy_cluster_upstream_cx_active{cluster}")
        ),
        Some(3.0)
    );
    drop(open);
    wait_metric(
        &agent,
        &format!("envoy_cluster_upstream_cx_active{cluster}"),
        1.0,
    )
    .await;
    assert_eq!(agent.seed_connections(), 1);
    assert!(agent.is_connected());
    // The one left still serves, and the pool grows again when needed.
    let mut again = Vec::new();
    for i in 0..3 {
        again.push(echo_once(addr, format!("again {i}").as_bytes()).await);
    }
    assert_eq!(agent.seed_connections(), 2);
    drop(again);
    agent.shutdown().await;
}

/// The pool's bound: with 2 streams per connection and at most 2
/// connections, a fifth tunnel waits (counted as an overflow) and fails
/// after the connect timeout without a third connection; once a tunnel
/// ends, the next one is served.
#[tokio::test]
async fn the_pool_stops_at_max_seed_connections() {
    let inv = openvpn_to(dest::echo().await);
    let mut cfg = test_config();
    cfg.max_streams_per_connection = 2;
    let p = start_proxy(&inv, vec![], cfg).await;
    let local = loopback().await;
    let addr = local.local_addr().unwrap();
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: p.tunnel.port(),
        listeners: vec![spec(
            &local,
            "openvpn-server.cluster-a.svc.cluster.local:1194",
        )],
        max_seed_connections: 2,
        connect_timeout: Duration::from_millis(500),
        drain_timeout: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let agent = agent_on(config, local).await;
    let mut open = Vec::new();
    for i in 0..4 {
        open.push(echo_once(addr, format!("tunnel {i}").as_bytes()).await);
    }
    let mut fifth = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), fifth.read_to_end(&mut rest))
        .await
        .expect("the fifth tunnel was neither served nor closed");
    assert!(rest.is_empty());
    let cluster = "{envoy_cluster_name=\"proxy_cluster\"}";
    let metrics = agent.metrics_text();
    for (series, want) in [
        ("envoy_cluster_upstream_cx_total", 2.0),
        ("envoy_cluster_upstream_cx_overflow", 1.0),
        ("envoy_cluster_upstream_rq_pending_failure_eject", 1.0),
    ] {
        assert_eq!(
            sample(&metrics, &format!("{series}{cluster}")),
            Some(want),
            "{series}: {metrics}"
        );
    }
    drop(open.pop());
    wait_metric(
        &agent,
        &format!("envoy_cluster_upstream_rq_active{cluster}"),
        3.0,
    )
    .await;
    open.push(echo_once(addr, b"room again").await);
    assert_eq!(agent.seed_connections(), 2);
    drop(open);
    agent.shutdown().await;
}

/// Readiness that means serving (issue 34.1): `/ready` on the stats
/// listener answers 200 only while a seed connection takes tunnels, and 503
/// with the reason otherwise: before the seed answers, after its connection
/// is lost, and while the agent drains. `/healthz` stays the liveness
/// answer (200 until the drain).
#[tokio::test]
async fn ready_only_while_a_seed_connection_is_up_with_the_reason_otherwise() {
    let inv = openvpn_to(dest::echo().await);
    // The seed's port, bound but not served yet: the agent's dial is
    // accepted by the kernel and its first PING goes unanswered.
    let seed_l = loopback().await;
    let seed_port = seed_l.local_addr().unwrap().port();
    let (local, stats_l) = (loopback().await, loopback().await);
    let (addr, stats) = (local.local_addr().unwrap(), stats_l.local_addr().unwrap());
    let config = AgentConfig {
        proxy_host: "127.0.0.1".into(),
        proxy_port: seed_port,
        listeners: vec![spec(
            &local,
            "openvpn-server.cluster-a.svc.cluster.local:1194",
        )],
        keepalive_timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_millis(500),
        backoff_max: Duration::from_millis(200),
        drain_timeout: Duration::from_secs(10),
        ..AgentConfig::default()
    };
    let agent = std::sync::Arc::new(
        TunnelAgent::start(
            config,
            AgentListeners {
                tunnels: vec![local],
                stats: Some(stats_l),
                admin: None,
            },
        )
        .await
        .unwrap(),
    );
    let (code, body) = http_get(stats, "/ready").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("seed proxy"), "{body}");
    let body = integration_tests::eventually_some(
        "the failed dial named on /ready",
        Duration::from_secs(10),
        || async {
            let (code, body) = http_get(stats, "/ready").await;
            (code == 503 && body.contains("seed proxy unreachable")).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("PING") || body.contains("timed out"),
        "{body}"
    );
    assert_eq!(http_get(stats, "/healthz").await.0, 200);

    // The seed serves: ready.
    let (p, _dir) = tunneling_proxy_on(seed_l, &inv).await;
    integration_tests::eventually("/ready 200", Duration::from_secs(10), || async {
        http_get(stats, "/ready").await == (200, "ok".to_string())
    })
    .await;

    // The seed goes away: not ready, saying why.
    p.shutdown().await;
    let body = integration_tests::eventually_some(
        "/ready 503 after the seed left",
        Duration::from_secs(10),
        || async {
            let (code, body) = http_get(stats, "/ready").await;
            (code == 503).then_some(body)
        },
    )
    .await;
    assert!(body.contains("seed proxy"), "{body}");
    assert_eq!(http_get(stats, "/healthz").await.0, 200);

    // Back on its port: ready again; then draining is not ready.
    let again = TcpListener::bind(("127.0.0.1", seed_port)).await.unwrap();
    let (_p2, _dir2) = tunneling_proxy_on(again, &inv).await;
    integration_tests::eventually("/ready 200 again", Duration::from_secs(10), || async {
        http_get(stats, "/ready").await.0 == 200
    })
    .await;
    let held = echo_once(addr, b"held through the drain").await;
    let draining = {
        let agent = agent.clone();
        tokio::spawn(async move { agent.shutdown().await })
    };
    integration_tests::eventually("/ready 503 draining", Duration::from_secs(10), || async {
        http_get(stats, "/ready").await == (503, "draining\n".to_string())
    })
    .await;
    assert_eq!(http_get(stats, "/healthz").await.0, 503);
    drop(held);
    assert!(draining.await.unwrap());
}
