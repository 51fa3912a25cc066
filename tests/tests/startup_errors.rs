//! Errors a newcomer meets when starting proxy-server and proxy-agent with
//! a wrong file, a port already taken or a certificate the other side
//! refuses: each is one sentence naming the flag, the path or address and
//! the cause, and a bad start exits 1 as upstream's commands do (issue 13.5).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::certs::Pki;
use integration_tests::procs::{Proc, loopback, run};

/// The `Error: ...` line of a failed start; it must be the only line that
/// says anything about the failure.
fn error_line(out: &str) -> &str {
    let errors: Vec<&str> = out.lines().filter(|l| l.starts_with("Error: ")).collect();
    assert_eq!(errors.len(), 1, "want one Error: line in {out}");
    errors[0]
}

fn server_args(pki: &Pki, extra: &[String]) -> Vec<String> {
    pki.local_server_args(&pki.dir().join("s.sock"), extra)
}

async fn fails(bin: &str, args: &[String], want: &[&str]) {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out) = run(bin, &refs).await;
    assert_eq!(code, Some(1), "{bin} {args:?}: {out}");
    let line = error_line(&out);
    for w in want {
        assert!(line.contains(w), "{bin}: want {w:?} in {line:?}");
    }
    assert!(
        !line.contains("os error") && !line.contains("Os {") && !line.contains("kind:"),
        "{bin}: {line:?} carries a debug rendering"
    );
}

#[tokio::test]
async fn a_directory_given_as_a_file_names_the_flag() {
    let pki = Pki::new();
    let dir = pki.dir().display().to_string();
    fails(
        "proxy-server",
        &server_args(&pki, &[format!("--cluster-cert={dir}")]),
        &["--cluster-cert", &dir, "is a directory"],
    )
    .await;
    fails(
        "proxy-server",
        &server_args(&pki, &[format!("--cluster-ca-cert={dir}")]),
        &["--cluster-ca-cert", &dir, "is a directory"],
    )
    .await;
    fails(
        "proxy-agent",
        &[format!("--ca-cert={dir}")],
        &["--ca-cert", &dir, "is a directory"],
    )
    .await;
    let missing = pki.dir().join("nope.pem").display().to_string();
    fails(
        "proxy-agent",
        &[format!("--ca-cert={missing}")],
        &["--ca-cert", &missing, "no such file or directory"],
    )
    .await;
}

#[tokio::test]
async fn a_key_that_does_not_match_its_certificate_names_both_flags() {
    let pki = Pki::new();
    let server = pki.server("server", &[]);
    let other = pki.client("other");
    fails(
        "proxy-server",
        &server_args(&pki, &[format!("--cluster-key={}", other.key.display())]),
        &[
            &format!("--cluster-key {}", other.key.display()),
            "is not the private key of the certificate in",
            &format!("--cluster-cert {}", server.cert.display()),
        ],
    )
    .await;
    let agent = pki.client("agent");
    fails(
        "proxy-agent",
        &[
            format!("--ca-cert={}", pki.ca().display()),
            format!("--agent-cert={}", agent.cert.display()),
            format!("--agent-key={}", other.key.display()),
        ],
        &[
            "--agent-key",
            "is not the private key of the certificate in",
            "--agent-cert",
        ],
    )
    .await;
    // A certificate file given as the key.
    fails(
        "proxy-server",
        &server_args(&pki, &[format!("--cluster-key={}", server.cert.display())]),
        &["--cluster-key", "holds no PEM private key"],
    )
    .await;
}

#[tokio::test]
async fn a_port_in_use_names_the_address_and_the_flags() {
    let pki = Pki::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    fails(
        "proxy-server",
        &server_args(&pki, &[format!("--agent-port={port}")]),
        &[
            &format!("cannot listen on 127.0.0.1:{port}"),
            "--agent-bind-address, --agent-port",
            "address already in use",
        ],
    )
    .await;
    fails(
        "proxy-server",
        &server_args(&pki, &[format!("--health-port={port}")]),
        &[
            &format!("127.0.0.1:{port}"),
            "--health-port",
            "address already in use",
        ],
    )
    .await;
    fails(
        "proxy-agent",
        &[
            format!("--ca-cert={}", pki.ca().display()),
            "--health-server-host=127.0.0.1".into(),
            format!("--health-server-port={port}"),
            "--admin-server-port=0".into(),
        ],
        &[
            &format!("cannot listen on 127.0.0.1:{port}"),
            "--health-server-host, --health-server-port",
            "address already in use",
        ],
    )
    .await;
    fails(
        "proxy-agent",
        &[
            format!("--ca-cert={}", pki.ca().display()),
            "--health-server-port=0".into(),
            format!("--admin-server-port={port}"),
        ],
        &[
            &format!("127.0.0.1:{port}"),
            "--admin-server-port",
            "address already in use",
        ],
    )
    .await;
}

/// The agent's TLS failures say what was refused, by whom, in words:
/// a server certificate from another CA, and (TLS 1.3, where the server
/// says so only after the handshake) no client certificate for a server
/// that requires one.
#[tokio::test]
async fn agent_tls_failures_are_sentences_not_debug_structs() {
    let pki = Pki::new();
    let mut srv = Proc::spawn("proxy-server", &server_args(&pki, &[]));
    let port = loopback(&srv.listening(4).await["agent"]).port();
    let other = Pki::new();
    let agent = pki.client("agent");
    for (ca, identity, want) in [
        (
            other.ca(),
            Some(&agent),
            "the peer's certificate was refused: it is not signed by a trusted CA",
        ),
        (
            pki.ca(),
            None,
            "the peer refused our certificate (TLS alert: certificate required)",
        ),
    ] {
        let mut args = vec![
            "--proxy-server-host=127.0.0.1".to_string(),
            format!("--proxy-server-port={port}"),
            format!("--ca-cert={}", ca.display()),
            "--health-server-port=0".into(),
            "--admin-server-port=0".into(),
        ];
        if let Some(id) = identity {
            args.push(format!("--agent-cert={}", id.cert.display()));
            args.push(format!("--agent-key={}", id.key.display()));
        }
        let mut a = Proc::spawn("proxy-agent", &args);
        let line = a.wait_line("cannot connect to proxy server").await;
        assert!(line.contains(want), "want {want:?} in {line}");
        assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
        assert!(
            !line.contains("Other(") && !line.contains("Error(") && !line.contains("{ "),
            "{line}"
        );
    }
    srv.wait_line("TLS handshake failed").await;
}
