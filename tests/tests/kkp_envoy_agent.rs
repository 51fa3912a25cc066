//! KKP's envoy-agent DaemonSet with only the image swapped: tunnel-agent
//! started exactly as KKP starts envoy-agent (`--config-path
//! /etc/envoy/envoy.yaml --use-dynamic-base-id`) on the bootstrap KKP's own
//! template renders (tunnel-agent/testdata, loopback addresses), with no more
//! privilege than KKP grants that container (a non-root user, capabilities
//! CHOWN, SETGID, SETUID and NET_BIND_SERVICE at most), tunneling to
//! nodeport-proxy started with KKP's seed flags; curl is the client.
//!
//! The rendered configuration has fixed ports (6443, 8002, 8088), so all of
//! it runs in a network namespace of the test's own. Seed and agent share it
//! here while KKP runs them on different machines, so the seed's stats port
//! moves to 9002 and its SNI listener (whose 6443 the agent's listener takes)
//! stays off.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use integration_tests::netns::Netns;
use integration_tests::procs::binary;

const FIXTURE: &str = "tunnel-agent/testdata/kkp-envoy-agent.yaml";

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(FIXTURE)
}

/// The bitmask of capabilities KKP adds to the envoy-agent container.
const KKP_CAPS: u64 = (1 << 0) | (1 << 6) | (1 << 7) | (1 << 10); // CHOWN SETGID SETUID NET_BIND_SERVICE

fn cap_field(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

#[tokio::test]
async fn envoy_agent_daemonset_runs_tunnel_agent_unchanged_but_for_the_image() {
    let ns = Netns::loopback_only();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("version"), "apiserver answered\n").unwrap();
    // The "apiserver pod" behind apiserver-external.cluster-abc.
    let mut api = ns.spawn(
        Path::new("python3"),
        &[
            "-u".into(),
            "-m".into(),
            "http.server".into(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--directory".into(),
            dir.path().display().to_string(),
            "16443".into(),
        ],
    );
    api.wait_line("Serving HTTP").await;
    let table = dir.path().join("table.yaml");
    std::fs::write(
        &table,
        r#"services:
- metadata:
    namespace: cluster-abc
    name: apiserver-external
    annotations:
      nodeport-proxy.k8s.io/expose: "SNI,Tunneling"
      nodeport-proxy.k8s.io/port-mapping: '{"secure": "abc.seed.example.com"}'
  spec:
    type: ClusterIP
    ports: [{name: secure, port: 443, protocol: TCP}]
endpointSlices:
- metadata:
    namespace: cluster-abc
    name: apiserver-external-1
    labels: {kubernetes.io/service-name: apiserver-external}
  ports: [{name: secure, port: 16443, protocol: TCP}]
  endpoints: [{addresses: ["127.0.0.1"], conditions: {ready: true}}]
"#,
    )
    .unwrap();
    // The seed's nodeport-proxy with KKP's seed arguments (see the header
    // for the two ports that move).
    let mut seed = ns.spawn(
        &binary("nodeport-proxy"),
        &[
            format!("-config={}", table.display()),
            "-listen-address=:8001".into(),
            "-envoy-node-name=kube".into(),
            "-envoy-admin-port=9001".into(),
            "-envoy-stats-port=9002".into(),
            "-envoy-sni-port=0".into(),
            "-envoy-tunneling-port=8088".into(),
            "-sni-listener-idle-timeout=0s".into(),
            "-tunneling-connection-idle-timeout=0s".into(),
            "-tunneling-stream-idle-timeout=0s".into(),
            "-downstream-tcp-keepalive-time=0s".into(),
            "-downstream-tcp-keepalive-interval=0s".into(),
            "-downstream-tcp-keepalive-probes=0".into(),
            "-upstream-tcp-keepalive-time=0s".into(),
            "-upstream-tcp-keepalive-interval=0s".into(),
            "-upstream-tcp-keepalive-probes=0".into(),
        ],
    );
    seed.wait_line("serving tunneling listener").await;
    // envoy-agent's container: KKP's arguments, a non-root user, KKP's
    // capabilities as the bounding set and none effective.
    let fixture = fixture();
    let mut agent = ns.spawn(
        Path::new("setpriv"),
        &[
            "--reuid=65532".into(),
            "--regid=65532".into(),
            "--clear-groups".into(),
            "--inh-caps=-all".into(),
            "--bounding-set=-all,+chown,+setgid,+setuid,+net_bind_service".into(),
            "--no-new-privs".into(),
            "--pdeathsig=KILL".into(),
            "--".into(),
            binary("tunnel-agent").display().to_string(),
            "--config-path".into(),
            fixture.display().to_string(),
            "--use-dynamic-base-id".into(),
        ],
    );
    agent.wait_line("connected to seed proxy").await;
    let pid = agent.child.id().unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap()
            .trim(),
        "tunnel-agent"
    );
    assert_eq!(cap_field(pid, "CapEff"), 0, "effective capabilities");
    assert_eq!(
        cap_field(pid, "CapBnd") & !KKP_CAPS,
        0,
        "bounding set beyond KKP's"
    );

    // A pod reaching the apiserver through the agent IP's listener.
    let (ok, body) = ns.run(&[
        "curl",
        "-sS",
        "--max-time",
        "10",
        "http://127.0.0.1:6443/version",
    ]);
    assert!(
        ok,
        "curl through the agent failed: {body}\n{}",
        agent.log.join("\n")
    );
    assert_eq!(body, "apiserver answered\n");
    // KKP's Prometheus scrapes :8002/stats/prometheus (pod annotation).
    let (ok, stats) = ns.run(&[
        "curl",
        "-sS",
        "--max-time",
        "10",
        "http://127.0.0.1:8002/stats/prometheus",
    ]);
    assert!(ok, "{stats}");
    assert!(
        stats.contains("envoy_cluster_upstream_rq_total{envoy_cluster_name=\"proxy_cluster\"} 1\n"),
        "{stats}"
    );
    assert!(stats.contains("envoy_server_live 1\n"), "{stats}");
    let (ok, plain) = ns.run(&[
        "curl",
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://127.0.0.1:8002/stats",
    ]);
    assert!(ok && plain == "200", "{plain}");
    // The seed saw one HTTP/2 connection carrying the CONNECT.
    let (ok, seed_stats) = ns.run(&[
        "curl",
        "-sS",
        "--max-time",
        "10",
        "http://127.0.0.1:9002/stats/prometheus",
    ]);
    assert!(ok, "{seed_stats}");
    assert!(
        seed_stats.contains(
            "envoy_http_downstream_cx_total{envoy_http_conn_manager_prefix=\"ingress_http\"} 1\n"
        ),
        "{seed_stats}"
    );
    drop(agent);
    drop(seed);
    drop(api);
}

/// KKP's nodeport-proxy pod with the kkp-nodeport-proxy and kkp-envoy images
/// (deploy/docker/Dockerfile): the init container's `/bin/cp /envoy.yaml
/// /etc/envoy/envoy.yaml` is nodeport-proxy invoked as `cp`; the `envoy`
/// container, tunnel-agent with KKP's arguments, finds a bootstrap that
/// declares nothing and waits without serving; given KKP's own xDS bootstrap
/// instead (only half of the pod swapped) it refuses to start, saying so.
#[tokio::test]
async fn nodeport_proxy_pod_runs_the_kkp_layout_images_with_kkps_commands() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().unwrap();
    let cp = dir.path().join("cp");
    std::os::unix::fs::symlink(binary("nodeport-proxy"), &cp).unwrap();
    let etc_envoy = dir.path().join("etc-envoy");
    std::fs::create_dir(&etc_envoy).unwrap();
    let marker = repo.join("deploy/docker/kkp-envoy.yaml");
    let out = std::process::Command::new(&cp)
        .arg(&marker)
        .arg(etc_envoy.join("envoy.yaml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(etc_envoy.join("envoy.yaml")).unwrap(),
        std::fs::read(&marker).unwrap()
    );
    let out = std::process::Command::new(&cp)
        .arg(dir.path().join("missing.yaml"))
        .arg(&etc_envoy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.yaml"));

    let config = etc_envoy.join("envoy.yaml").display().to_string();
    let kkp_args = |config: &str| -> Vec<String> {
        [
            "-c",
            config,
            "--service-cluster",
            "cluster0",
            "--service-node",
            "kube",
        ]
        .map(String::from)
        .to_vec()
    };
    let mut envoy = integration_tests::procs::Proc::spawn("tunnel-agent", &kkp_args(&config));
    envoy.wait_line("nothing to serve here").await;
    envoy.signal(15);
    assert_eq!(envoy.wait_exit().await, Some(0));

    let xds = repo.join("tunnel-agent/testdata/kkp-nodeport-proxy-envoy.yaml");
    let (code, text) = integration_tests::procs::run(
        "tunnel-agent",
        &kkp_args(&xds.display().to_string())
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .await;
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("dynamic_resources") && text.contains("docs/kkp.md"),
        "{text}"
    );
}

/// Fields that Envoy's API gained after 1.32, added to KKP's rendered
/// template as a newer KKP might render them: every one is known to
/// Envoy's schema and ignored here.
const NEWER_FIELDS: [(&str, &str); 4] = [
    // Admin.allow_paths (go-control-plane envoy v1.37.0).
    ("admin:\n", "admin:\n  allow_paths: [{prefix: /stats}]\n"),
    // Bootstrap.enable_worker_cpu_affinity (v1.40.0).
    (
        "static_resources:\n",
        "enable_worker_cpu_affinity: false\nstatic_resources:\n",
    ),
    // TcpProxy.upstream_connect_mode, max_early_data_bytes (v1.37.0).
    (
        "          stat_prefix: tcp_stats\n",
        "          stat_prefix: tcp_stats\n          upstream_connect_mode: IMMEDIATE\n          max_early_data_bytes: 0\n",
    ),
    // Http2ProtocolOptions.max_header_field_size_kb, disallow_obs_text
    // (v1.38.0).
    (
        "            http2_protocol_options:\n",
        "            http2_protocol_options:\n              max_header_field_size_kb: 64\n              disallow_obs_text: true\n",
    ),
];

/// A newer KKP (issue 34.3): tunnel-agent started as KKP starts envoy-agent
/// on KKP's template plus fields of newer Envoy versions runs, reports the
/// six fields it ignores once at start (a log line naming each, and
/// `tunnel_agent_static_ignored_fields_total` on KKP's stats port) and again
/// on each reload; a reload adding a field it cannot honour is refused, the
/// previous bootstrap serving on; one adding a field Envoy does not know is
/// refused too.
#[tokio::test]
async fn a_newer_kkp_template_runs_and_its_unknown_to_us_fields_are_reported() {
    let ns = Netns::loopback_only();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.yaml");
    let write = |text: &str| {
        let tmp = dir.path().join("envoy.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    let mut text = std::fs::read_to_string(fixture()).unwrap();
    for (anchor, replacement) in NEWER_FIELDS {
        assert!(text.contains(anchor), "fixture lacks {anchor:?}");
        text = text.replacen(anchor, replacement, 1);
    }
    write(&text);
    let mut agent = ns.spawn(
        &binary("tunnel-agent"),
        &[
            "--config-path".into(),
            path.display().to_string(),
            "--use-dynamic-base-id".into(),
        ],
    );
    agent.wait_line("tunneling listener").await;
    let line = agent.wait_line("does not act on").await;
    for field in [
        "admin.allow_paths",
        "enable_worker_cpu_affinity",
        "upstream_connect_mode",
        "max_early_data_bytes",
        "max_header_field_size_kb",
        "disallow_obs_text",
    ] {
        assert!(line.contains(field), "{field}: {line}");
    }
    let counter = |ns: &Netns| {
        let (ok, stats) = ns.run(&[
            "curl",
            "-sS",
            "--max-time",
            "10",
            "http://127.0.0.1:8002/stats/prometheus",
        ]);
        assert!(ok, "{stats}");
        stats
            .lines()
            .find_map(|l| l.strip_prefix("tunnel_agent_static_ignored_fields_total "))
            .map(str::to_string)
            .unwrap_or_default()
    };
    integration_tests::eventually(
        "the stats listener answers",
        std::time::Duration::from_secs(10),
        || async {
            ns.run(&[
                "curl",
                "-sS",
                "--max-time",
                "2",
                "http://127.0.0.1:8002/stats",
            ])
            .0
        },
    )
    .await;
    assert_eq!(counter(&ns), "6");
    // A reload with one more ignored field: reported again, all seven.
    write(&text.replacen(
        "      connect_timeout: 5s\n",
        "      connect_timeout: 5s\n      dns_lookup_family: V4_ONLY\n",
        1,
    ));
    let line = agent.wait_line("does not act on").await;
    assert!(line.contains("dns_lookup_family"), "{line}");
    integration_tests::eventually(
        "the reload counted",
        std::time::Duration::from_secs(10),
        || async { counter(&ns) == "13" },
    )
    .await;
    // A TLS transport socket to the seed cannot be honoured: refused, the
    // previous bootstrap serving on, nothing counted.
    write(&text.replacen(
        "      connect_timeout: 5s\n",
        "      connect_timeout: 5s\n      transport_socket: {name: envoy.transport_sockets.tls, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext}}\n",
        1,
    ));
    let line = agent.wait_line("configuration not reloaded").await;
    assert!(
        line.contains("transport_socket") && line.contains("cannot be honoured"),
        "{line}"
    );
    // A field Envoy does not know either.
    write(&text.replacen("admin:\n", "admin:\n  profile_pathx: /x\n", 1));
    let line = agent.wait_line("configuration not reloaded").await;
    assert!(
        line.contains("profile_pathx") && line.contains("unknown field"),
        "{line}"
    );
    assert_eq!(counter(&ns), "13");
    let (ok, health) = ns.run(&["curl", "-sS", "http://127.0.0.1:8002/healthz"]);
    assert!(ok && health.contains("profile_pathx"), "{health}");
    drop(agent);
}

/// Envoy's `--mode validate`: the verdict and exit 0 or 1, nothing bound;
/// the ignored fields are named in the log; with
/// `--allow-unknown-static-fields`, so are the ones Envoy does not know.
#[tokio::test]
async fn mode_validate_gives_envoys_verdict_without_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = std::fs::read_to_string(fixture()).unwrap();
    for (anchor, replacement) in NEWER_FIELDS {
        text = text.replacen(anchor, replacement, 1);
    }
    let newer = dir.path().join("newer.yaml");
    std::fs::write(&newer, &text).unwrap();
    let newer = newer.display().to_string();
    let (code, out) =
        integration_tests::procs::run("tunnel-agent", &["--mode", "validate", "-c", &newer]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("configuration '{newer}' OK")),
        "{out}"
    );
    assert!(
        out.contains("does not act on") && out.contains("disallow_obs_text"),
        "{out}"
    );
    let unknown = dir.path().join("unknown.yaml");
    std::fs::write(
        &unknown,
        text.replacen("admin:\n", "admin:\n  profile_pathx: /x\n", 1),
    )
    .unwrap();
    let unknown = unknown.display().to_string();
    let (code, out) =
        integration_tests::procs::run("tunnel-agent", &["--mode", "validate", "-c", &unknown])
            .await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("profile_pathx") && !out.contains("OK"),
        "{out}"
    );
    let (code, out) = integration_tests::procs::run(
        "tunnel-agent",
        &[
            "--mode",
            "validate",
            "--allow-unknown-static-fields",
            "-c",
            &unknown,
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("Envoy's schema does not know") && out.contains("profile_pathx"),
        "{out}"
    );
}

/// argv of a container of a KKP Deployment, `$(VAR)` replaced as the
/// kubelet does from `env`.
fn container_argv(c: &serde_json::Value, env: &[(&str, &str)]) -> Vec<String> {
    c["command"]
        .as_array()
        .into_iter()
        .chain(c["args"].as_array())
        .flatten()
        .map(|a| {
            let mut a = a.as_str().unwrap().to_string();
            for (k, v) in env {
                a = a.replace(&format!("$({k})"), v);
            }
            a
        })
        .collect()
}

/// The URL the kubelet's HTTP probe requests on a pod at 127.0.0.1: the
/// path gets its leading slash (KKP's per-cluster probe says `healthz`).
fn probe_url(probe: &serde_json::Value) -> String {
    let get = &probe["httpGet"];
    assert_eq!(get["scheme"].as_str().unwrap_or("HTTP"), "HTTP");
    let path = get["path"].as_str().unwrap_or("/");
    let slash = if path.starts_with('/') { "" } else { "/" };
    format!("http://127.0.0.1:{}{slash}{path}", get["port"])
}

/// KKP's probes, on KKP's own Deployments with our images (tests/kkp: the
/// per-cluster one KKP's tests generate, the seed one its operator makes),
/// reach the process that carries the traffic. The probes sit on the
/// `envoy` container, which with the kkp-envoy image is tunnel-agent idling
/// on a bootstrap that declares nothing (it binds no port); an HTTP probe
/// is a request to the pod's address, and the pod's containers share one
/// network, so the port the probe names (8002) is nodeport-proxy's, in the
/// `envoy-manager` container. Each container runs with its command from
/// the Deployment (`/bin/cp` and `/envoy-manager` are nodeport-proxy,
/// `/usr/local/bin/envoy` tunnel-agent; nodeport-proxy reads a table file
/// here, where a pod would watch its apiserver). Every probe answers 200
/// while nodeport-proxy serves, 503 once it is shutting down, and fails
/// once it is gone, while tunnel-agent in `envoy` runs on throughout.
#[tokio::test]
async fn kkp_probes_reach_the_process_that_carries_traffic() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (fixture, kind) in [
        ("nodeport-proxy-envoy-seed.yaml", "livenessProbe"),
        ("nodeport-proxy-envoy-cluster.yaml", "readinessProbe"),
    ] {
        let text = std::fs::read_to_string(repo.join("tests/kkp").join(fixture)).unwrap();
        let deployment: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        let spec = &deployment["spec"]["template"]["spec"];
        let containers = spec["containers"].as_array().unwrap();
        let named = |name: &str| containers.iter().find(|c| c["name"] == name).unwrap();
        // The premise: KKP probes the envoy container, and only it.
        let probes: Vec<(String, &str, String)> = containers
            .iter()
            .flat_map(|c| {
                ["livenessProbe", "readinessProbe", "startupProbe"]
                    .into_iter()
                    .filter(|k| !c[*k].is_null())
                    .map(|k| (c["name"].as_str().unwrap().to_string(), k, probe_url(&c[k])))
            })
            .collect();
        assert_eq!(
            probes,
            vec![(
                "envoy".to_string(),
                kind,
                "http://127.0.0.1:8002/healthz".to_string()
            )],
            "{fixture}"
        );

        let ns = Netns::loopback_only();
        let dir = tempfile::tempdir().unwrap();
        let etc_envoy = dir.path().join("etc-envoy");
        std::fs::create_dir(&etc_envoy).unwrap();
        let cp = dir.path().join("cp");
        std::os::unix::fs::symlink(binary("nodeport-proxy"), &cp).unwrap();
        let table = dir.path().join("table.yaml");
        std::fs::write(&table, "services: []\nendpointSlices: []\n").unwrap();
        let env = [
            ("PODNAME", "nodeport-proxy-envoy-0"),
            ("PODNAMESPACE", "cluster-abc"),
        ];
        // The image's paths, here.
        let local = |a: String| -> String {
            let marker = repo.join("deploy/docker/kkp-envoy.yaml");
            match a.as_str() {
                "/envoy.yaml" => marker.display().to_string(),
                _ => a.replace("/etc/envoy", &etc_envoy.display().to_string()),
            }
        };
        let init = &spec["initContainers"][0];
        let argv: Vec<String> = container_argv(init, &env).into_iter().map(local).collect();
        assert_eq!(argv[0], "/bin/cp", "{fixture}");
        let out = std::process::Command::new(&cp)
            .args(&argv[1..])
            .output()
            .unwrap();
        assert!(out.status.success(), "{fixture}: {out:?}");

        let manager = container_argv(named("envoy-manager"), &env);
        assert_eq!(manager[0], "/envoy-manager", "{fixture}");
        let mut args: Vec<String> = manager[1..].to_vec();
        args.push(format!("-config={}", table.display()));
        let mut proxy = ns.spawn(&binary("nodeport-proxy"), &args);
        proxy.wait_line("serving stats and health").await;
        let envoy = container_argv(named("envoy"), &env);
        assert_eq!(envoy[0], "/usr/local/bin/envoy", "{fixture}");
        let args: Vec<String> = envoy[1..].iter().cloned().map(local).collect();
        let mut idle = ns.spawn(&binary("tunnel-agent"), &args);
        idle.wait_line("nothing to serve here").await;

        let probe = |url: String| {
            let (_, code) = ns.run(&[
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "1",
                &url,
            ]);
            code
        };
        let url = probes[0].2.clone();
        assert_eq!(probe(url.clone()), "200", "{fixture}: {kind} while serving");
        // nodeport-proxy shutting down: the probe fails (503) at once,
        // while its listeners still serve for -shutdown-delay (5s).
        proxy.signal(15);
        proxy.wait_line("health failing; still serving").await;
        assert_eq!(
            probe(url.clone()),
            "503",
            "{fixture}: {kind} while draining"
        );
        assert_eq!(proxy.wait_exit().await, Some(0), "{fixture}");
        // Gone: nothing answers on 8002, though envoy's process runs on.
        assert_eq!(probe(url.clone()), "000", "{fixture}: {kind} after exit");
        let pid = idle.child.id().unwrap();
        assert!(
            std::fs::metadata(format!("/proc/{pid}")).is_ok(),
            "{fixture}: the envoy container's process ended"
        );
        idle.signal(15);
        assert_eq!(idle.wait_exit().await, Some(0), "{fixture}");
    }
}
