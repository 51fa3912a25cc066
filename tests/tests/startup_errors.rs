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

/// `--lease-label-selector` (upstream after v0.36.0, #868) takes a full
/// label selector, and v0.36's `--lease-label`, now deprecated, sets the
/// same one: a malformed selector fails at start naming the flag and the
/// cause, whether or not leases are counted (upstream parses the flag);
/// the deprecated one says so and still works.
#[tokio::test]
async fn a_malformed_lease_label_selector_names_the_flag() {
    let pki = Pki::new();
    let base = |extra: &str| {
        vec![
            format!("--ca-cert={}", pki.ca().display()),
            "--proxy-server-host=127.0.0.1".to_string(),
            "--proxy-server-port=1".to_string(),
            "--health-server-port=0".to_string(),
            "--admin-server-port=0".to_string(),
            extra.to_string(),
        ]
    };
    fails(
        "proxy-agent",
        &base("--lease-label-selector=k8s-app in (konnectivity-server,"),
        &[
            "--lease-label-selector \"k8s-app in (konnectivity-server,\" is not a valid label selector",
            "the value list has no ')'",
        ],
    )
    .await;
    fails(
        "proxy-agent",
        &base("--lease-label=k8s-app=a=b"),
        &["--lease-label \"k8s-app=a=b\" is not a valid label selector"],
    )
    .await;
    // The full syntax is accepted; the deprecated flag warns and starts.
    let mut ok = Proc::spawn(
        "proxy-agent",
        &base("--lease-label-selector=k8s-app in (konnectivity-server),tier!=canary"),
    );
    ok.listening(2).await;
    let mut old = Proc::spawn(
        "proxy-agent",
        &base("--lease-label=k8s-app=konnectivity-server"),
    );
    old.wait_line("Flag --lease-label has been deprecated, Use --lease-label-selector instead")
        .await;
    old.listening(2).await;
}

/// `--frontend-write-channel-size` (upstream after v0.36.0, #896/#918):
/// a negative size is refused naming the flag; 0, upstream's synchronous
/// writes, starts (ours keeps a queue of one packet: docs/konnectivity.md).
#[tokio::test]
async fn frontend_write_channel_size_is_accepted_as_upstreams() {
    let pki = Pki::new();
    let with = |size: &str| {
        server_args(
            &pki,
            &[
                "--mode=http-connect".to_string(),
                format!("--frontend-write-channel-size={size}"),
            ],
        )
    };
    fails(
        "proxy-server",
        &with("-1"),
        &["--frontend-write-channel-size must not be negative, got -1"],
    )
    .await;
    for size in ["0", "10", "150"] {
        let mut s = Proc::spawn("proxy-server", &with(size));
        s.listening(4).await;
    }
}

/// A CA bundle with a CERTIFICATE block that is not a certificate is
/// refused at start naming the flag and the block, as upstream after
/// v0.36.0 does (#902; v0.36.0 loaded the rest), by the agent and the
/// server alike.
#[tokio::test]
async fn a_ca_bundle_with_a_malformed_certificate_block_names_the_flag() {
    let pki = Pki::new();
    let bundle = pki.dir().join("bundle.crt");
    let mut text = std::fs::read_to_string(pki.ca()).unwrap();
    // base64 of "not a DER-encoded certificate"
    text.push_str("-----BEGIN CERTIFICATE-----\nbm90IGEgREVSLWVuY29kZWQgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n");
    std::fs::write(&bundle, text).unwrap();
    let want = format!(
        "{}: invalid CA certificate: CERTIFICATE block 2 of 2 is not an X.509 certificate",
        bundle.display()
    );
    fails(
        "proxy-agent",
        &[
            format!("--ca-cert={}", bundle.display()),
            "--proxy-server-port=1".into(),
            "--health-server-port=0".into(),
            "--admin-server-port=0".into(),
        ],
        &["--ca-cert", &want],
    )
    .await;
    let mut args = server_args(&pki, &[]);
    for a in args.iter_mut() {
        if a.starts_with("--cluster-ca-cert=") {
            *a = format!("--cluster-ca-cert={}", bundle.display());
        }
    }
    fails("proxy-server", &args, &["--cluster-ca-cert", &want]).await;
}

/// `--proxy-server-http-proxy` (or `HTTPS_PROXY`) that cannot be used
/// stops the agent at start, naming the flag and the cause, never the
/// password.
#[tokio::test]
async fn an_unusable_egress_proxy_names_its_flag() {
    let pki = Pki::new();
    let ca = format!("--ca-cert={}", pki.ca().display());
    let socks = "--proxy-server-http-proxy=socks5://user:hunter2@proxy:1080";
    fails(
        "proxy-agent",
        &[ca.clone(), socks.into()],
        &[
            "--proxy-server-http-proxy",
            "\"socks5\" is not http or https",
        ],
    )
    .await;
    let (_, out) = run("proxy-agent", &[ca.as_str(), socks]).await;
    assert!(!out.contains("hunter2"), "{out}");
    let missing = pki.dir().join("nope.pem").display().to_string();
    fails(
        "proxy-agent",
        &[
            ca,
            "--proxy-server-http-proxy=https://proxy.corp:3128".into(),
            format!("--proxy-server-http-proxy-ca={missing}"),
        ],
        &[
            "https://proxy.corp:3128",
            "--proxy-server-http-proxy-ca",
            &missing,
        ],
    )
    .await;
}
