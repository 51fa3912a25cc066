//! A certificate that is expired or not yet valid is refused like any other
//! bad file (issue 33.3): at start-up an error naming the flag unless
//! `--allow-expired-certificates`; on a hot reload a warning naming the
//! flag, a failed reload counted, and the material loaded before kept (new
//! agents still get in), on proxy-server and on proxy-agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use integration_tests::certs::{Identity, Pki};
use integration_tests::procs::{Proc, loopback, run};

/// The `Error: ...` line of a failed start.
fn error_line(out: &str) -> String {
    out.lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or_else(|| panic!("no Error: line in {out}"))
        .to_string()
}

/// `tls.crt` and `tls.key` in `dir`, symlinks through `..data` to a
/// version directory, as kubelet lays out a Secret volume.
fn secret_volume(dir: &Path, version: &str, id: &Identity) -> (String, String) {
    let v = dir.join(version);
    std::fs::create_dir_all(&v).unwrap();
    std::fs::copy(&id.cert, v.join("tls.crt")).unwrap();
    std::fs::copy(&id.key, v.join("tls.key")).unwrap();
    if !dir.join("..data").exists() {
        std::os::unix::fs::symlink(version, dir.join("..data")).unwrap();
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
    }
    (
        dir.join("tls.crt").display().to_string(),
        dir.join("tls.key").display().to_string(),
    )
}

/// Points `..data` at `version` at once, as kubelet does.
fn swap(dir: &Path, version: &str) {
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

/// Waits until `/metrics` at `addr` has a line starting with `line`.
async fn metric_line(addr: std::net::SocketAddr, line: &str) {
    for _ in 0..600 {
        let (_, body) = integration_tests::http_get(addr, "/metrics").await;
        if body.lines().any(|l| l.starts_with(line)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, body) = integration_tests::http_get(addr, "/metrics").await;
    panic!("no {line} in:\n{body}");
}

fn agent_args(pki: &Pki, port: u16, id: (&str, &str)) -> Vec<String> {
    vec![
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={port}"),
        format!("--ca-cert={}", pki.ca().display()),
        format!("--agent-cert={}", id.0),
        format!("--agent-key={}", id.1),
        "--health-server-port=0".into(),
        "--admin-server-port=0".into(),
        "--health-server-host=127.0.0.1".into(),
    ]
}

#[tokio::test]
async fn outdated_certificates_are_a_start_up_error_unless_allowed() {
    let pki = Pki::new();
    let expired = pki.outdated("old-server", true, false);
    let future = pki.outdated("new-server", true, true);
    let socket = pki.dir().join("s.sock");
    for (id, want) in [(&expired, "expired at"), (&future, "is not valid before")] {
        let args = pki.local_server_args(
            &socket,
            &[
                format!("--cluster-cert={}", id.cert.display()),
                format!("--cluster-key={}", id.key.display()),
            ],
        );
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out) = run("proxy-server", &refs).await;
        assert_eq!(code, Some(1), "{out}");
        let line = error_line(&out);
        for w in ["--cluster-cert", want, "--allow-expired-certificates"] {
            assert!(line.contains(w), "want {w:?} in {line}");
        }
    }
    // Allowed: it starts, and says why peers will refuse it.
    let mut args = pki.local_server_args(
        &socket,
        &[
            format!("--cluster-cert={}", expired.cert.display()),
            format!("--cluster-key={}", expired.key.display()),
        ],
    );
    args.push("--allow-expired-certificates".into());
    let mut server = Proc::spawn("proxy-server", &args);
    server.listening(4).await;
    let warned = server
        .log
        .iter()
        .any(|l| l.contains("outside its validity period") && l.contains("--cluster-cert"));
    assert!(warned, "{}", server.log.join("\n"));

    let old_agent = pki.outdated("old-agent", false, false);
    let id = (
        old_agent.cert.to_str().unwrap(),
        old_agent.key.to_str().unwrap(),
    );
    let args = agent_args(&pki, 1, id);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out) = run("proxy-agent", &refs).await;
    assert_eq!(code, Some(1), "{out}");
    let line = error_line(&out);
    assert!(
        line.contains("--agent-cert") && line.contains("expired at"),
        "{line}"
    );
    let mut args = agent_args(&pki, 1, id);
    args.push("--allow-expired-certificates".into());
    let mut agent = Proc::spawn("proxy-agent", &args);
    agent.listening(2).await;
}

/// Both ends running; their certificate files are swapped (Secret-volume
/// style) to an expired pair: each logs a warning naming the flag, counts a
/// failed reload and keeps its material, so a new agent still connects.
#[tokio::test]
async fn an_expired_certificate_is_refused_on_reload_and_the_old_one_kept() {
    let pki = Pki::new();
    let vol = tempfile::tempdir().unwrap();
    let server_dir = vol.path().join("server");
    let agent_dir = vol.path().join("agent");
    std::fs::create_dir_all(&server_dir).unwrap();
    std::fs::create_dir_all(&agent_dir).unwrap();
    let (cert, key) = secret_volume(&server_dir, "v1", &pki.server("server", &[]));
    secret_volume(&server_dir, "v2", &pki.outdated("old-server", true, false));
    let args = pki.local_server_args(
        &pki.dir().join("s.sock"),
        &[
            format!("--cluster-cert={cert}"),
            format!("--cluster-key={key}"),
        ],
    );
    let mut server = Proc::spawn("proxy-server", &args);
    let addrs = server.listening(4).await;
    let (agent_port, health) = (loopback(&addrs["agent"]).port(), loopback(&addrs["health"]));

    let (acert, akey) = secret_volume(&agent_dir, "v1", &pki.client("agent"));
    secret_volume(&agent_dir, "v2", &pki.outdated("old-agent", false, false));
    let mut agent = Proc::spawn(
        "proxy-agent",
        &agent_args(&pki, agent_port, (&acert, &akey)),
    );
    let agent_addrs = agent.listening(2).await;
    agent.wait_line("connected to proxy server").await;
    let agent_health = loopback(&agent_addrs["health"]);

    swap(&server_dir, "v2");
    metric_line(
        health,
        r#"konnectivity_network_proxy_server_tls_reloads_total{result="failure",tls="agent"} 1"#,
    )
    .await;
    let warning = server
        .wait_line("TLS files changed but cannot be loaded")
        .await;
    assert!(
        warning.contains("--cluster-cert") && warning.contains("expired at"),
        "{warning}"
    );

    swap(&agent_dir, "v2");
    metric_line(
        agent_health,
        r#"konnectivity_network_proxy_agent_tls_reloads_total{result="failure",tls="server"} 1"#,
    )
    .await;
    let warning = agent
        .wait_line("TLS files changed but cannot be loaded")
        .await;
    assert!(
        warning.contains("--agent-cert") && warning.contains("expired at"),
        "{warning}"
    );

    // The server still presents its valid certificate: a new agent (with
    // a valid one of its own) connects.
    let fresh = pki.client("agent-2");
    let id = (fresh.cert.to_str().unwrap(), fresh.key.to_str().unwrap());
    let mut second = Proc::spawn("proxy-agent", &agent_args(&pki, agent_port, id));
    second.listening(2).await;
    second.wait_line("connected to proxy server").await;
}
