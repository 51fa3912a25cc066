//! X.509 v1 client certificates (issue 13.4), made the way operators make
//! them: `openssl x509 -req` without an extensions file. Go accepts them;
//! so do we, on the agent listener and the mTLS frontend, over TLS 1.2 and
//! 1.3, and only when a configured CA signed them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use integration_tests::procs::{Proc, loopback};
use rustls::pki_types::ServerName;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`name.crt`, `name.key`), as `openssl req -x509` makes one.
fn ca(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (crt, key) = (format!("{name}.crt"), format!("{name}.key"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    (dir.join(crt), dir.join(key))
}

/// A leaf signed by `ca` with `openssl x509 -req`: v1 without `ext`, v3
/// with the extensions in `ext`.
fn leaf(dir: &Path, ca: &(PathBuf, PathBuf), name: &str, ext: Option<&str>) -> (PathBuf, PathBuf) {
    let (crt, key, csr) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("{name}.csr"),
    );
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    let (ca_crt, ca_key) = (ca.0.display().to_string(), ca.1.display().to_string());
    let mut args = vec![
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "1",
        "-out",
        &crt,
    ];
    let extfile = format!("{name}.ext");
    if let Some(e) = ext {
        std::fs::write(dir.join(&extfile), e).unwrap();
        args.extend(["-extfile", &extfile]);
    }
    openssl(dir, &args);
    let text = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in", &crt])
        .current_dir(dir)
        .output()
        .unwrap();
    let want = if ext.is_some() {
        "Version: 3"
    } else {
        "Version: 1"
    };
    assert!(
        String::from_utf8_lossy(&text.stdout).contains(want),
        "{name} is not {want}"
    );
    (dir.join(crt), dir.join(key))
}

const SERVER_EXT: &str = "subjectAltName=IP:127.0.0.1,DNS:localhost\n";

/// A proxy-agent whose client certificate is v1 connects to a proxy-server
/// that requires client certificates from that CA; one signed by another
/// CA is refused.
#[tokio::test]
async fn an_agent_with_a_v1_client_certificate_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = ca(d, "ca");
    let other = ca(d, "other-ca");
    let server = leaf(d, &root, "server", Some(SERVER_EXT));
    let agent_v1 = leaf(d, &root, "agent", None);
    let stranger_v1 = leaf(d, &other, "stranger", None);
    let mut srv = Proc::spawn(
        "proxy-server",
        &[
            format!("--uds-name={}", d.join("s.sock").display()),
            format!("--cluster-cert={}", server.0.display()),
            format!("--cluster-key={}", server.1.display()),
            format!("--cluster-ca-cert={}", root.0.display()),
            "--server-port=0".into(),
            "--agent-port=0".into(),
            "--admin-port=0".into(),
            "--health-port=0".into(),
            "--agent-bind-address=127.0.0.1".into(),
            "--health-bind-address=127.0.0.1".into(),
        ],
    );
    let addrs = srv.listening(4).await;
    let port = loopback(&addrs["agent"]).port();
    let agent_args = |cert: &(PathBuf, PathBuf)| -> Vec<String> {
        vec![
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={port}"),
            format!("--ca-cert={}", root.0.display()),
            format!("--agent-cert={}", cert.0.display()),
            format!("--agent-key={}", cert.1.display()),
            "--health-server-port=0".into(),
            "--admin-server-port=0".into(),
        ]
    };
    let mut agent = Proc::spawn("proxy-agent", &agent_args(&agent_v1));
    agent.wait_line("connected to proxy server").await;
    let mut stranger = Proc::spawn("proxy-agent", &agent_args(&stranger_v1));
    stranger.wait_line("cannot connect to proxy server").await;
    srv.wait_line("TLS handshake failed").await;
}

/// The server side of a handshake with a v1 client certificate, over TLS
/// 1.2 and 1.3 (each signs the handshake its own way), as the mTLS
/// frontend and the agent listener both configure it.
#[tokio::test]
async fn v1_client_certificates_complete_tls12_and_tls13_handshakes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = ca(d, "ca");
    let server = leaf(d, &root, "server", Some(SERVER_EXT));
    let client = leaf(d, &root, "kube-apiserver", None);
    let server_config = daemon::tls::server_config(
        &server.0,
        &server.1,
        Some(&root.0),
        &daemon::tls::TlsPolicy::default(),
        &[],
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let config =
            daemon::tls::client_config_for(&root.0, Some((&client.0, &client.1)), &[], &[version])
                .unwrap();
        let (a, b) = tokio::io::duplex(1 << 16);
        let acceptor = acceptor.clone();
        let server_side = tokio::spawn(async move { acceptor.accept(b).await.map(|_| ()) });
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let client_side = connector.connect(name, a).await;
        let server_result = server_side.await.unwrap();
        assert!(
            client_side.is_ok() && server_result.is_ok(),
            "{version:?}: client {:?}, server {:?}",
            client_side.err(),
            server_result.err()
        );
    }
}

/// A v1 *server* certificate has no subjectAltName, so no client that
/// checks the server's name can accept it: upstream's Go agent refuses it
/// ("x509: certificate relies on legacy Common Name field, use SANs
/// instead"; tests/interop checks that against the real binary). Ours
/// refuses it too, in a sentence that names the cause and the remedy
/// instead of webpki's `UnsupportedCertVersion`; the server, which serves
/// it as upstream's does, warns at start.
#[tokio::test]
async fn a_v1_server_certificate_is_refused_with_the_reason_as_go_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = ca(d, "ca");
    let server_v1 = leaf(d, &root, "127.0.0.1", None);
    let agent = leaf(d, &root, "agent", Some("extendedKeyUsage=clientAuth\n"));
    let mut srv = Proc::spawn(
        "proxy-server",
        &[
            format!("--uds-name={}", d.join("s.sock").display()),
            format!("--cluster-cert={}", server_v1.0.display()),
            format!("--cluster-key={}", server_v1.1.display()),
            format!("--cluster-ca-cert={}", root.0.display()),
            "--server-port=0".into(),
            "--agent-port=0".into(),
            "--admin-port=0".into(),
            "--health-port=0".into(),
            "--agent-bind-address=127.0.0.1".into(),
            "--health-bind-address=127.0.0.1".into(),
        ],
    );
    let warning = srv.wait_line("X.509 v1").await;
    assert!(
        warning.contains("subjectAltName") && warning.contains("127.0.0.1.crt"),
        "{warning}"
    );
    let addrs = srv.listening(4).await;
    let port = loopback(&addrs["agent"]).port();
    let mut a = Proc::spawn(
        "proxy-agent",
        &[
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={port}"),
            format!("--ca-cert={}", root.0.display()),
            format!("--agent-cert={}", agent.0.display()),
            format!("--agent-key={}", agent.1.display()),
            "--health-server-port=0".into(),
            "--admin-server-port=0".into(),
        ],
    );
    let line = a.wait_line("cannot connect to proxy server").await;
    for want in [
        "X.509 v1",
        "no subjectAltName",
        "legacy Common Name field",
        "reissue it as v3",
        "127.0.0.1",
    ] {
        assert!(line.contains(want), "want {want:?} in {line}");
    }
    assert!(
        !line.contains("UnsupportedCertVersion") && !line.contains("Other("),
        "{line}"
    );
}

/// The client side of the same refusal, in process: the verifier the
/// agent uses refuses a v1 server certificate over TLS 1.2 and 1.3 and a
/// v3 one from the same CA passes, so the refusal is about the version.
#[tokio::test]
async fn the_agent_verifier_refuses_v1_server_certificates_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = ca(d, "ca");
    for (name, ext, ok) in [("v1", None, false), ("v3", Some(SERVER_EXT), true)] {
        let server = leaf(d, &root, name, ext);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(
            daemon::tls::server_config(
                &server.0,
                &server.1,
                None,
                &daemon::tls::TlsPolicy::default(),
                &[],
            )
            .unwrap(),
        ));
        for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
            let config = daemon::tls::client_config_for(&root.0, None, &[], &[version]).unwrap();
            let (a, b) = tokio::io::duplex(1 << 16);
            let acceptor = acceptor.clone();
            let server_side = tokio::spawn(async move { acceptor.accept(b).await.map(|_| ()) });
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let result = connector
                .connect(ServerName::try_from("127.0.0.1").unwrap(), a)
                .await;
            let _ = server_side.await;
            match result {
                Ok(_) => assert!(ok, "{name} {version:?} was accepted"),
                Err(e) => {
                    assert!(!ok, "{name} {version:?}: {e}");
                    let why = daemon::tls::find_rustls_error(&e)
                        .map(daemon::tls::explain)
                        .unwrap_or_default();
                    assert!(why.contains("X.509 v1"), "{name} {version:?}: {why}");
                }
            }
        }
    }
}
