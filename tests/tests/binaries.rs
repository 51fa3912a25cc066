//! The `proxy-server` and `proxy-agent` binaries: upstream's flag spellings,
//! clear errors with exit code 2, the Unix socket's mode, health endpoints,
//! the signal sequence (the first SIGTERM drains, the agent exits once no
//! connection is left or its grace period is over, a second SIGTERM exits)
//! and nodeport-proxy's refusal to start without a routing source.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

use integration_tests::certs::Pki;
use integration_tests::procs::{Proc, loopback, run, server_on_socket};
use integration_tests::{http_get, http_get_as};

#[tokio::test]
async fn unknown_and_invalid_flags_exit_1_with_a_reason() {
    for (bin, args, want) in [
        (
            "proxy-server",
            vec!["--no-such-flag=1"],
            "unknown flag: --no-such-flag=1",
        ),
        (
            "proxy-server",
            vec!["--keepalive-time=10"],
            "invalid duration",
        ),
        (
            "proxy-server",
            vec!["--mode=tcp"],
            "mode must be set to either 'grpc' or 'http-connect'",
        ),
        (
            "proxy-server",
            vec!["--server-port=0", "--uds-name=/tmp/x"],
            "cluster-cert",
        ),
        (
            "proxy-server",
            vec!["--proxy-strategies=nearest"],
            "unknown proxy strategy",
        ),
        (
            "proxy-agent",
            vec!["--agent-identifiers=zone=a"],
            "--ca-cert",
        ),
        (
            "proxy-agent",
            vec!["--sync-interval=notaduration"],
            "invalid duration",
        ),
        (
            "proxy-agent",
            vec!["stray-positional"],
            "unexpected argument",
        ),
    ] {
        let (code, out) = run(bin, &args).await;
        // Upstream's cobra commands exit 1 on a bad command line.
        assert_eq!(code, Some(1), "{bin} {args:?}: {out}");
        assert!(out.contains(want), "{bin} {args:?}: want {want:?} in {out}");
    }
    let (code, out) = run("proxy-server", &["--help"]).await;
    assert_eq!(code, Some(0));
    assert!(out.contains("--backend-dial-timeout duration"), "{out}");
}

#[tokio::test]
async fn agent_validates_identifier_keys() {
    let pki = Pki::new();
    let ca = format!("--ca-cert={}", pki.ca().display());
    let (code, out) = run(
        "proxy-agent",
        &[&ca, "--agent-identifiers=ipv4=1.2.3.4&zone=a"],
    )
    .await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("unknown address type: zone"), "{out}");
}

/// Every flag upstream's test framework and example manifests pass, in Go's
/// value syntax, starts a server and an agent that work together.
#[tokio::test]
async fn upstream_flag_spellings_start_a_working_pair() {
    let pki = Pki::new();
    let server_cert = pki.server("server", &[]);
    let agent_cert = pki.client("agent");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("konnectivity-server.socket");
    let server_args: Vec<String> = [
        "--logtostderr=true".to_string(),
        "--log-file-max-size=0".into(),
        "-v=2".into(),
        format!("--uds-name={}", sock.display()),
        "--delete-existing-uds-file".into(),
        format!("--cluster-cert={}", server_cert.cert.display()),
        format!("--cluster-key={}", server_cert.key.display()),
        format!("--cluster-ca-cert={}", pki.ca().display()),
        "--mode=grpc".into(),
        "--server-port=0".into(),
        "--agent-port=0".into(),
        "--admin-port=0".into(),
        "--health-port=0".into(),
        "--agent-bind-address=127.0.0.1".into(),
        "--health-bind-address=127.0.0.1".into(),
        "--keepalive-time=1h0m0s".into(),
        "--frontend-keepalive-time=1h0m0s".into(),
        "--server-id=server-a".into(),
        "--server-count=1".into(),
        "--proxy-strategies=destHost,default".into(),
        "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into(),
        "--tls-min-version=VersionTLS12".into(),
        "--xfr-channel-size=10".into(),
        "--graceful-shutdown-timeout=0s".into(),
        "--backend-dial-timeout=10s".into(),
        "--warn-on-channel-limit=true".into(),
        "--enable-profiling=false".into(),
        "--kube-api-content-type=application/vnd.kubernetes.protobuf".into(),
    ]
    .into();
    let mut server = Proc::spawn("proxy-server", &server_args);
    let addrs = server.listening(4).await;
    let meta = std::fs::metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o770,
        "socket mode must be srwxrwx---"
    );
    let agent_port = loopback(&addrs["agent"]).port();

    // The argument list upstream's ExternalAgentRunner builds: every agent
    // flag as --name=value in Go's formatting.
    let agent_args: Vec<String> = [
        format!("--agent-cert={}", agent_cert.cert.display()),
        format!("--agent-key={}", agent_cert.key.display()),
        format!("--ca-cert={}", pki.ca().display()),
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={agent_port}"),
        "--alpn-proto=[]".into(),
        "--health-server-host=127.0.0.1".into(),
        "--health-server-port=0".into(),
        "--admin-server-port=0".into(),
        "--admin-bind-address=127.0.0.1".into(),
        "--enable-profiling=false".into(),
        "--enable-contention-profiling=false".into(),
        "--agent-id=agent-a".into(),
        "--sync-interval=100ms".into(),
        "--probe-interval=100ms".into(),
        "--sync-interval-cap=1s".into(),
        "--keepalive-time=1h0m0s".into(),
        "--service-account-token-path=".into(),
        "--agent-identifiers=ipv4=127.0.0.1&host=localhost".into(),
        "--warn-on-channel-limit=false".into(),
        "--sync-forever=false".into(),
        "--xfr-channel-size=150".into(),
        "--count-server-leases=false".into(),
        "--lease-namespace=kube-system".into(),
        "--lease-label=k8s-app=konnectivity-server".into(),
        "--server-count-source=default".into(),
        "--kubeconfig=".into(),
        "--kube-api-content-type=application/vnd.kubernetes.protobuf".into(),
        "--v=4".into(),
    ]
    .into();
    let mut agent = Proc::spawn("proxy-agent", &agent_args);
    let agent_addrs = agent.listening(2).await;
    agent.wait_line("connected to proxy server").await;
    let agent_health = loopback(&agent_addrs["health"]);
    let (status, body) = http_get(agent_health, "/readyz?verbose").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "[+]ping ok\n[+]server-connected ok\ncheck passed\n")
    );
    assert_eq!(
        http_get(agent_health, "/healthz").await,
        (200, "ok".to_string())
    );
    // The agent's admin /metrics redirects to its health port: the one it
    // bound, since the flag said 0, at the address the client reached (never
    // the Host header the client sent).
    let redirect = http_get_as(
        loopback(&agent_addrs["admin"]),
        "/metrics?x=1",
        "evil.example:80",
    )
    .await;
    assert!(redirect.starts_with("HTTP/1.1 301 "), "{redirect}");
    let location = redirect
        .lines()
        .filter_map(|l| l.split_once(": "))
        .find_map(|(k, v)| k.eq_ignore_ascii_case("location").then_some(v))
        .unwrap_or_default();
    assert_eq!(
        location,
        format!("http://127.0.0.1:{}/metrics?x=1", agent_health.port()),
        "{redirect}"
    );
    let (status, metrics) = http_get(agent_health, "/metrics").await;
    assert_eq!(status, 200);
    // No dial yet: as upstream's, the dial histogram is not there until one.
    assert!(
        metrics.contains("konnectivity_network_proxy_agent_known_server_count 1\n")
            && !metrics.contains("konnectivity_network_proxy_agent_dial_duration_seconds"),
        "{metrics}"
    );

    let server_health = loopback(&addrs["health"]);
    assert_eq!(
        http_get(server_health, "/readyz").await,
        (200, "ok".to_string())
    );
    let (_, metrics) = http_get(server_health, "/metrics").await;
    assert!(metrics.contains("# HELP konnectivity_network_proxy_server_ready_backends Number of konnectivity agent connected to the proxy server"), "{metrics}");
    assert!(
        metrics.contains(
            "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"destHost\"} 2"
        ),
        "{metrics}"
    );

    // SIGTERM: with no connection to wait for, the agent exits at once
    // (its DRAIN may or may not reach the server first); the server sees
    // the stream go.
    agent.signal(15);
    assert_eq!(agent.wait_exit().await, Some(0));
    server.wait_line("agent stream closed").await;
    assert_eq!(
        http_get(server_health, "/readyz").await,
        (500, "no connection to any proxy agent".to_string())
    );

    server.signal(15);
    assert_eq!(server.wait_exit().await, Some(0));
    assert!(!sock.exists(), "the socket is removed on shutdown");
}

/// Every binary answers --version with its version, the commit it was
/// built from and what it replaces; KKP's Go binaries exit 2 on a bad flag
/// (Go's flag package), as ours do.
#[tokio::test]
async fn every_binary_answers_version_and_bad_flags_as_its_original() {
    for (bin, compat, bad_flag_exit) in [
        ("proxy-server", "apiserver-network-proxy v0.36.0", 1),
        ("proxy-agent", "apiserver-network-proxy v0.36.0", 1),
        ("nodeport-proxy", "KKP nodeport-proxy", 2),
        ("tunnel-agent", "KKP envoy-agent", 2),
        ("lb-updater", "KKP nodeport-proxy lb-updater", 2),
    ] {
        let (code, out) = run(bin, &["--version"]).await;
        assert_eq!(code, Some(0), "{bin} --version: {out}");
        let line = out.trim();
        assert!(
            line.starts_with(&format!("{bin} {} (commit ", env!("CARGO_PKG_VERSION")))
                && line.contains(compat)
                && !line.contains("commit unknown"),
            "{bin} --version: {line}"
        );
        let (code, out) = run(bin, &["--no-such-flag"]).await;
        assert_eq!(code, Some(bad_flag_exit), "{bin} --no-such-flag: {out}");
    }
}

fn agent_args(pki: &Pki, port: u16, grace: &str) -> Vec<String> {
    vec![
        format!("--ca-cert={}", pki.ca().display()),
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={port}"),
        "--health-server-host=127.0.0.1".into(),
        "--health-server-port=0".into(),
        "--admin-server-port=0".into(),
        "--sync-interval=100ms".into(),
        format!("--graceful-shutdown-timeout={grace}"),
    ]
}

/// An agent whose server cannot be reached has nothing to drain: one
/// SIGTERM ends it, long before its (hour-long) grace period.
#[tokio::test]
async fn agent_without_a_server_exits_on_one_sigterm() {
    let pki = Pki::new();
    let (_refusing, addr) = integration_tests::dest::refused();
    let mut agent = Proc::spawn("proxy-agent", &agent_args(&pki, addr.port(), "1h"));
    agent.listening(2).await;
    agent.wait_line("cannot connect to proxy server").await;
    agent.signal(15);
    assert_eq!(agent.wait_exit().await, Some(0));
    assert!(
        agent.log.iter().all(|l| !l.contains("second termination")),
        "{:?}",
        agent.log
    );
}

/// With a tunnel open, the first SIGTERM drains: the tunnel keeps working,
/// and once it is closed the agent still serves new dials (the only agent
/// is the server's last resort, as with upstream) until a second SIGTERM;
/// a tunnel that outlives --graceful-shutdown-timeout is closed and the
/// agent exits then.
#[tokio::test]
async fn agent_drains_its_tunnels_within_the_grace_period() {
    use integration_tests::client::{Frontend, grpc_dial};
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (mut server, sock, addrs) = server_on_socket(&pki, dir.path(), &[]).await;
    let port = loopback(&addrs["agent"]).port();
    let frontend = Frontend::Uds(sock);
    let echo = integration_tests::dest::echo().await.to_string();

    // Grace of an hour: only the tunnel's end lets the agent go.
    let mut agent = Proc::spawn("proxy-agent", &agent_args(&pki, port, "1h"));
    let health = loopback(&agent.listening(2).await["health"]);
    agent.wait_line("connected to proxy server").await;
    let mut tunnel = grpc_dial(&frontend, &echo).await.unwrap();
    agent.signal(15);
    server.wait_line("agent is draining").await;
    tunnel.write(b"still here").await;
    assert_eq!(tunnel.read_exact(10).await, b"still here");
    assert_eq!(
        http_get(health, "/healthz").await.0,
        200,
        "agent left early"
    );
    assert_eq!(tunnel.close().await.as_deref(), Some(""));
    // Idle and draining, it is still the only agent: dials go to it.
    let mut again = grpc_dial(&frontend, &echo).await.unwrap();
    again.write(b"last resort").await;
    assert_eq!(again.read_exact(11).await, b"last resort");
    assert_eq!(again.close().await.as_deref(), Some(""));
    assert_eq!(
        http_get(health, "/healthz").await.0,
        200,
        "agent left while it could still serve"
    );
    agent.signal(15);
    assert_eq!(agent.wait_exit().await, Some(0));
    agent.wait_line("second termination signal").await;
    server.wait_line("agent stream closed").await;

    // A tunnel that stays open is closed when the grace period ends.
    let mut agent = Proc::spawn("proxy-agent", &agent_args(&pki, port, "300ms"));
    agent.listening(2).await;
    agent.wait_line("connected to proxy server").await;
    let mut tunnel = grpc_dial(&frontend, &echo).await.unwrap();
    tunnel.write(b"ping").await;
    assert_eq!(tunnel.read_exact(4).await, b"ping");
    agent.signal(15);
    assert_eq!(agent.wait_exit().await, Some(0));
    agent
        .wait_line("--graceful-shutdown-timeout (300ms) is over")
        .await;
    assert_eq!(tunnel.read().await, None, "the tunnel ends with the agent");

    server.signal(15);
    assert_eq!(server.wait_exit().await, Some(0));
}

/// nodeport-proxy outside a cluster with neither -config nor -kubeconfig
/// refuses to start, naming the flags, and opens no listener (the demo
/// table by name: `cli::tests::demo_only_by_name`).
#[tokio::test]
async fn nodeport_proxy_without_a_routing_source_refuses_to_start() {
    let out = tokio::process::Command::new(integration_tests::procs::binary("nodeport-proxy"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    for flag in ["-config=FILE", "-kubeconfig=FILE", "-source=demo"] {
        assert!(text.contains(flag), "want {flag} in: {text}");
    }
    assert!(!text.contains("listening"), "{text}");
}

/// The flags a binary's `--help` lists (`  --name type` / `  -v, --v int`).
fn help_flags(usage: &str) -> Vec<String> {
    usage
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("--")))
        .map(|n| n.trim_end_matches(',').to_string())
        .collect()
}

/// Whether `text` names `-name` or `--name` as a whole flag.
fn names_flag(text: &str, name: &str) -> bool {
    let needle = format!("-{name}");
    text.match_indices(&needle).any(|(i, _)| {
        let after = text[i + needle.len()..].chars().next();
        !matches!(after, Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

/// Metric names a crate registers: string literals or `const` strings
/// passed to `describe_*`, `.counter(`, `.gauge(` or `.histogram(`.
/// The families the name macros (`daemon::tls_metric_names!`,
/// `link::stream_metric_names!`, `link::flow_gauge_names!`) make from a
/// binary's prefix.
fn named_by_macros(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (call, suffixes) in [
        (
            "tls_metric_names!(\"",
            &[
                "_certificate_expiration_timestamp_seconds",
                "_tls_reloads_total",
            ][..],
        ),
        (
            "stream_metric_names!(\"",
            &["_stream_packets_total", "_stream_errors_total"][..],
        ),
        (
            "prefix: \"",
            &[
                "_flow_control_window_bytes",
                "_flow_control_parked_bytes",
                "_flow_control_reserved_bytes",
                "_flow_control_budget_bytes",
                "_http2_window_bytes",
            ][..],
        ),
    ] {
        for (i, _) in source.match_indices(call) {
            let prefix = source[i + call.len()..]
                .split('"')
                .next()
                .unwrap_or_default();
            for s in suffixes {
                out.insert(format!("{prefix}{s}"));
            }
        }
    }
    out
}

fn registered_metrics(source: &str) -> BTreeSet<String> {
    let consts: std::collections::HashMap<&str, &str> = source
        .match_indices("const ")
        .filter_map(|(i, _)| {
            let rest = &source[i + 6..];
            let (name, rest) = rest.split_once(": &str =")?;
            let lit = rest.trim_start().strip_prefix('"')?;
            Some((name.trim(), lit.split('"').next()?))
        })
        .collect();
    let mut out = BTreeSet::new();
    for call in [
        "describe_counter(",
        "describe_gauge(",
        "describe_histogram(",
        ".counter(",
        ".gauge(",
        ".histogram(",
    ] {
        for (i, _) in source.match_indices(call) {
            let arg = source[i + call.len()..]
                .split([',', ')'])
                .next()
                .unwrap_or_default()
                .trim();
            let name = match arg.strip_prefix('"') {
                Some(lit) => lit.trim_end_matches('"'),
                None => consts.get(arg).copied().unwrap_or_default(),
            };
            if name.contains('_') && name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// docs/operations.md's promise: every flag a binary's --help prints is named
/// there or in README.md, and every metric a crate registers is named there,
/// so flags and metrics added later cannot go undocumented.
#[test]
fn every_flag_and_metric_is_documented() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let ops = read("docs/operations.md");
    let docs = format!("{}\n{ops}", read("README.md"));
    let mut missing = Vec::new();
    for (bin, flags) in [
        ("proxy-server", proxy_server::options::flags()),
        ("proxy-agent", proxy_agent::options::flags()),
        ("nodeport-proxy", nodeport_proxy::cli::flag_set()),
        ("tunnel-agent", tunnel_agent::cli::flag_set()),
        ("lb-updater", lb_updater::flags()),
    ] {
        let names = help_flags(&flags.usage());
        assert!(names.len() > 5, "{bin}: {names:?}");
        for n in names {
            if !names_flag(&docs, &n) {
                missing.push(format!("{bin} --{n}"));
            }
        }
    }
    let mut metrics = BTreeSet::new();
    // The binaries' crates, folders included, and the shared `envoy_*`
    // series (the runtime's other files hold only test registries).
    let mut files = vec![root.join("daemon/src/envoy_stats.rs")];
    let mut dirs: Vec<_> = [
        "server/src",
        "agent/src",
        "nodeport-proxy/src",
        "tunnel-agent/src",
    ]
    .iter()
    .map(|d| root.join(d))
    .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    for path in files {
        let source = std::fs::read_to_string(path).unwrap();
        metrics.extend(registered_metrics(&source));
        metrics.extend(named_by_macros(&source));
    }
    assert!(metrics.len() > 40, "{metrics:?}");
    for m in metrics {
        if !ops.contains(&format!("`{m}`")) {
            missing.push(format!("metric {m}"));
        }
    }
    assert!(
        missing.is_empty(),
        "not in README.md or docs/operations.md: {missing:#?}"
    );
}

#[test]
fn doc_checks_see_flags_and_metrics() {
    assert!(names_flag("`-v`, `--log-file`", "v"));
    assert!(!names_flag("`--version`", "v"));
    assert!(!names_flag("--config-file", "config"));
    assert_eq!(
        help_flags("Flags:\n  --mode string\n        x\n  -v, --v int\n"),
        ["mode", "v"]
    );
    let src =
        "const A: &str = \"x_total\";\nr.describe_counter(A, \"h\");\nr.gauge(\"y_active\", &[]);";
    assert_eq!(
        registered_metrics(src),
        BTreeSet::from(["x_total".to_string(), "y_active".to_string()])
    );
}
