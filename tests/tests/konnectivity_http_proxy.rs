//! proxy-agent reaching its proxy servers through a real forward proxy
//! (apiserver-network-proxy #127): tinyproxy (Debian's) with basic
//! authentication from `--proxy-server-http-proxy`, the same tinyproxy
//! behind HAProxy terminating TLS (a proxy spoken to over TLS), from
//! `HTTPS_PROXY`, bypassed by `NO_PROXY` and for loopback servers as Go
//! does; with two servers (`--server-count=2`) both reached through the
//! proxy, a server restart reconnected through it, and every refusal (407,
//! 403, 502 from tinyproxy itself) logged with the proxy and the cause.
//!
//! tinyproxy and HAProxy need fixed ports, so everything runs in a network
//! namespace of the test's own, where the servers are named
//! `konnectivity.test` (a loopback address that is not `localhost`: Go's
//! rules send such a name through the environment's proxy).
//!
//! Needs tinyproxy and HAProxy: scripts/test installs them with
//! benches/install-deps.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use integration_tests::certs::Pki;
use integration_tests::client::{Frontend, http_connect};
use integration_tests::netns::Netns;
use integration_tests::procs::{Proc, binary};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAME: &str = "konnectivity.test";

fn installed(names: &[&str], package: &str) -> PathBuf {
    names
        .iter()
        .flat_map(|n| [format!("/usr/bin/{n}"), format!("/usr/sbin/{n}")])
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{package} is not installed: run benches/install-deps.sh (apt-get install -y {package}) \
                 or scripts/test, which does"
            )
        })
}

/// A tinyproxy in `ns` on 127.0.0.1:`port` with `extra` configuration lines.
async fn tinyproxy(ns: &Netns, dir: &Path, port: u16, extra: &str) -> Proc {
    let conf = dir.join(format!("tinyproxy-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 600\nLogLevel Connect\nUser nobody\nGroup nogroup\n{extra}"
        ),
    )
    .unwrap();
    let mut p = ns.spawn(
        &installed(&["tinyproxy"], "tinyproxy"),
        &["-d".into(), "-c".into(), conf.display().to_string()],
    );
    p.wait_line("Reloading config file finished").await;
    p
}

/// HAProxy in `ns` terminating TLS on 127.0.0.1:3129 (certificate for
/// `localhost`) in front of the tinyproxy on 3128.
async fn tls_terminator(ns: &Netns, dir: &Path, pki: &Pki) -> Proc {
    let id = pki.server("egress-proxy", &[]);
    let pem = dir.join("haproxy.pem");
    let mut both = std::fs::read(&id.cert).unwrap();
    both.extend(std::fs::read(&id.key).unwrap());
    std::fs::write(&pem, both).unwrap();
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  maxconn 64\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1m\n  timeout server 1m\n\
             frontend tls\n  bind 127.0.0.1:3129 ssl crt {}\n  default_backend plain\n\
             backend plain\n  server tinyproxy 127.0.0.1:3128\n",
            pem.display()
        ),
    )
    .unwrap();
    let mut p = ns.spawn(
        &installed(&["haproxy"], "haproxy"),
        &[
            "-db".into(),
            "-V".into(),
            "-f".into(),
            cfg.display().to_string(),
        ],
    );
    // Printed once the listeners are bound, as the event loop starts.
    p.wait_line("as the polling mechanism").await;
    p
}

/// Our proxy-server in `ns`: agent port `agent_port` on 127.0.0.1 with a
/// certificate for `konnectivity.test`, HTTP-CONNECT frontend on a Unix
/// socket in `dir`.
async fn server(
    ns: &Netns,
    dir: &Path,
    pki: &Pki,
    agent_port: u16,
    count: u32,
    generation: u32,
) -> (Proc, Frontend) {
    let id = pki.server("server", &[NAME]);
    let sock = dir.join(format!("server-{agent_port}-{generation}.sock"));
    let mut p = ns.spawn(
        &binary("proxy-server"),
        &[
            "--mode=http-connect".into(),
            format!("--uds-name={}", sock.display()),
            "--server-port=0".into(),
            format!("--cluster-cert={}", id.cert.display()),
            format!("--cluster-key={}", id.key.display()),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--agent-port={agent_port}"),
            "--health-bind-address=127.0.0.1".into(),
            "--health-port=0".into(),
            "--admin-port=0".into(),
            format!("--server-count={count}"),
            format!("--server-id=server-{agent_port}"),
        ],
    );
    p.listening(4).await;
    (p, Frontend::Uds(sock))
}

/// A proxy-agent in `ns` with only `env` in its environment (nothing from
/// the test's, such as a CI's own proxy variables) and `extra` flags after
/// the defaults (later flags win).
fn agent(ns: &Netns, pki: &Pki, env: &[&str], extra: &[String]) -> Proc {
    let mut args = vec!["-i".to_string()];
    args.extend(env.iter().map(|s| s.to_string()));
    args.push(binary("proxy-agent").display().to_string());
    args.extend([
        format!("--ca-cert={}", pki.ca().display()),
        format!("--proxy-server-host={NAME}"),
        "--proxy-server-port=8091".into(),
        "--health-server-host=127.0.0.1".into(),
        "--health-server-port=0".into(),
        "--admin-server-port=0".into(),
        "--sync-interval=100ms".into(),
        "--sync-interval-cap=1s".into(),
    ]);
    args.extend(extra.iter().cloned());
    ns.spawn(Path::new("env"), &args)
}

/// Bytes sent through the server's frontend to the echo destination (an
/// address inside the namespace, dialed by the agent) come back.
async fn echoes_through(frontend: &Frontend, echo_port: u16, what: &str) {
    let reply = http_connect(frontend, &format!("[::1]:{echo_port}")).await;
    assert_eq!(reply.status, 200, "{what}: {} {}", reply.head, reply.body);
    let mut s = reply.stream;
    s.write_all(what.as_bytes()).await.unwrap();
    let mut back = vec![0u8; what.len()];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(back, what.as_bytes());
}

const THROUGH: &str = "tunnel to the proxy server opened through the HTTP proxy";

#[tokio::test]
async fn agent_reaches_every_server_through_tinyproxy_plain_tls_and_from_the_environment() {
    let ns = Netns::loopback_only();
    ns.add_host("127.0.0.1", NAME);
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let (_echo, echo_port) = ns.echo().await;
    let (s1, front1) = server(&ns, dir.path(), &pki, 8091, 2, 0).await;
    let (_s2, front2) = server(&ns, dir.path(), &pki, 8092, 2, 0).await;
    let mut proxy = tinyproxy(&ns, dir.path(), 3128, "BasicAuth alice s3cret\n").await;

    // The flag, with basic auth: both servers (the server count says two)
    // through the proxy, which resolves the name.
    let mut a = agent(
        &ns,
        &pki,
        &[],
        &[
            format!("--proxy-server-host={NAME}:8091,{NAME}:8092"),
            "--proxy-server-http-proxy=http://alice:s3cret@127.0.0.1:3128".into(),
        ],
    );
    let line = a
        .wait_line("reaching proxy servers through an HTTP proxy")
        .await;
    assert!(
        line.contains("http://127.0.0.1:3128") && !line.contains("s3cret"),
        "{line}"
    );
    for _ in 0..2 {
        a.wait_line("connected to proxy server").await;
    }
    let mut targets = Vec::new();
    while targets.len() < 2 {
        let line = proxy.wait_line(&format!("CONNECT {NAME}:")).await;
        targets.push(
            line.rsplit_once("CONNECT ")
                .and_then(|(_, t)| t.split_whitespace().next())
                .unwrap_or_default()
                .to_string(),
        );
    }
    targets.sort();
    assert_eq!(targets, [format!("{NAME}:8091"), format!("{NAME}:8092")]);
    echoes_through(&front1, echo_port, "through server one").await;
    echoes_through(&front2, echo_port, "through server two").await;
    assert!(
        a.log.iter().all(|l| !l.contains("s3cret")),
        "{}",
        a.log.join("\n")
    );

    // Server one restarts on its port: the agent comes back to it through
    // the proxy.
    drop(s1);
    a.wait_line("disconnected from proxy server").await;
    let (_s1, front1) = server(&ns, dir.path(), &pki, 8091, 2, 1).await;
    let line = a.wait_line(THROUGH).await;
    assert!(line.contains(&format!("{NAME}:8091")), "{line}");
    a.wait_line("connected to proxy server").await;
    proxy.wait_line(&format!("CONNECT {NAME}:8091")).await;
    echoes_through(&front1, echo_port, "through the restarted server").await;

    // TLS to the proxy (HAProxy in front of tinyproxy), its CA given...
    let _tls = tls_terminator(&ns, dir.path(), &pki).await;
    let mut t = agent(
        &ns,
        &pki,
        &[],
        &[
            "--proxy-server-http-proxy=https://alice:s3cret@localhost:3129".into(),
            format!("--proxy-server-http-proxy-ca={}", pki.ca().display()),
        ],
    );
    let line = t.wait_line(THROUGH).await;
    assert!(line.contains("https://localhost:3129"), "{line}");
    t.wait_line("connected to proxy server").await;
    // ...and refused when its certificate is not trusted.
    let other = Pki::new();
    let mut u = agent(
        &ns,
        &pki,
        &[],
        &[
            "--proxy-server-http-proxy=https://alice:s3cret@localhost:3129".into(),
            format!("--proxy-server-http-proxy-ca={}", other.ca().display()),
        ],
    );
    let line = u.wait_line("cannot connect to proxy server").await;
    assert!(
        line.contains("TLS to the HTTP proxy https://localhost:3129"),
        "{line}"
    );

    // From the environment (lower case too, Go's precedence).
    let mut e = agent(
        &ns,
        &pki,
        &[
            "HTTPS_PROXY=http://alice:s3cret@127.0.0.1:3128",
            "https_proxy=http://127.0.0.1:1",
        ],
        &[],
    );
    let line = e.wait_line(THROUGH).await;
    assert!(line.contains("http://127.0.0.1:3128"), "{line}");
    e.wait_line("connected to proxy server").await;

    // NO_PROXY naming the server, and a loopback server address, go
    // direct, although the proxy named would not answer.
    let mut n = agent(
        &ns,
        &pki,
        &[
            "https_proxy=http://127.0.0.1:1",
            "no_proxy=example.com,.test",
        ],
        &[],
    );
    n.wait_line("connected to proxy server").await;
    let mut lo = agent(
        &ns,
        &pki,
        &["HTTPS_PROXY=http://127.0.0.1:1"],
        &["--proxy-server-host=127.0.0.1".into()],
    );
    lo.wait_line("connected to proxy server").await;
    // `direct` ignores the environment.
    let mut d = agent(
        &ns,
        &pki,
        &["HTTPS_PROXY=http://127.0.0.1:1"],
        &["--proxy-server-http-proxy=direct".into()],
    );
    d.wait_line("connected to proxy server").await;
    for p in [&mut n, &mut lo, &mut d] {
        p.lines_so_far();
        assert!(
            p.log.iter().all(|l| !l.contains(THROUGH)),
            "{}",
            p.log.join("\n")
        );
    }
}

#[tokio::test]
async fn a_proxy_that_refuses_is_named_with_its_answer_and_the_cause() {
    let ns = Netns::loopback_only();
    ns.add_host("127.0.0.1", NAME);
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let (_s, _front) = server(&ns, dir.path(), &pki, 8091, 1, 0).await;
    let _auth = tinyproxy(&ns, dir.path(), 3128, "BasicAuth alice s3cret\n").await;
    // Tunnels to port 443 only: 8091 is an access violation.
    let _ports = tinyproxy(&ns, dir.path(), 3130, "ConnectPort 443\n").await;
    // Chained to an upstream proxy that is not there: a bad gateway.
    let _chained = tinyproxy(&ns, dir.path(), 3131, "Upstream http 127.0.0.1:1\n").await;

    let cases = [
        (
            "http://127.0.0.1:3128",
            "407 Proxy Authentication Required",
            "the proxy wants credentials",
        ),
        // tinyproxy answers wrong credentials with 401.
        (
            "http://alice:wrong-secret@127.0.0.1:3128",
            "401 Unauthorized",
            "the proxy refused the credentials in the proxy URL",
        ),
        (
            "http://127.0.0.1:3130",
            "403 Forbidden",
            "the proxy's rules do not allow a tunnel",
        ),
        (
            "http://127.0.0.1:3131",
            "502 Bad Gateway",
            "the proxy could not reach it",
        ),
    ];
    for (url, status, cause) in cases {
        let mut a = agent(
            &ns,
            &pki,
            &[],
            &[format!("--proxy-server-http-proxy={url}")],
        );
        let line = a.wait_line("cannot connect to proxy server").await;
        let shown = url.replace("alice:wrong-secret@", "");
        let want = format!("the HTTP proxy {shown} answered {status} to CONNECT {NAME}:8091");
        assert!(
            line.contains(&want) && line.contains(cause),
            "{want}: {line}"
        );
        assert!(!line.contains("wrong-secret"), "{line}");
        // It keeps trying (with its back-off), and never connects.
        a.wait_line("cannot connect to proxy server").await;
        assert!(
            a.log
                .iter()
                .all(|l| !l.contains("connected to proxy server")),
            "{}",
            a.log.join("\n")
        );
    }

    // An unusable HTTPS_PROXY stops the agent at start, naming the
    // variable and never the password.
    let mut a = agent(
        &ns,
        &pki,
        &["HTTPS_PROXY=socks5://u:hunter2@proxy:1080"],
        &[],
    );
    let line = a.wait_line("Error: ").await;
    assert!(
        line.contains("HTTPS_PROXY: scheme \"socks5\" is not http or https")
            && !line.contains("hunter2"),
        "{line}"
    );
}
