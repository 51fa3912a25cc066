//! tunnel-agent reaching the seed's 8088 through a real forward proxy
//! (tinyproxy, Debian's package; KKP #7122): with basic authentication from
//! `-http-proxy`, refused with wrong credentials, over TLS (tinyproxy behind
//! a TLS terminator, as a TLS-speaking corporate proxy), from `HTTPS_PROXY`,
//! and bypassed when `NO_PROXY` names the seed or the seed is loopback.
//! tinyproxy needs a fixed port, so everything runs in a network namespace
//! of the test's own.
//!
//! Needs tinyproxy: scripts/test installs it with benches/install-deps.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use integration_tests::certs::Pki;
use integration_tests::netns::Netns;
use integration_tests::procs::{Proc, binary};

const AUTHORITY: &str = "echo.proxied.svc.cluster.local:7000";

fn tinyproxy() -> PathBuf {
    ["/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "tinyproxy is not installed: run benches/install-deps.sh (apt-get install -y tinyproxy) \
                 or scripts/test, which does"
            )
        })
}

/// A TLS terminator in front of tinyproxy: TLS on 127.0.0.1:3129, relayed
/// to 127.0.0.1:3128.
const TLS_RELAY: &str = r#"
import socket, ssl, sys, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 3129))
s.listen(16)
print('tls relay ready', flush=True)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except Exception:
        pass
    for x in (a, b):
        try:
            x.close()
        except Exception:
            pass
while True:
    c, _ = s.accept()
    try:
        t = ctx.wrap_socket(c, server_side=True)
    except Exception:
        continue
    u = socket.create_connection(('127.0.0.1', 3128))
    threading.Thread(target=pipe, args=(t, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, t), daemon=True).start()
"#;

/// A tunnel-agent in `ns` listening on 127.0.0.1:`port`, with `env` set
/// and `extra` flags.
fn agent(ns: &Netns, port: u16, env: &[&str], extra: &[String]) -> Proc {
    let mut args: Vec<String> = env.iter().map(|s| s.to_string()).collect();
    args.push(binary("tunnel-agent").display().to_string());
    args.extend(
        [
            "-proxy-host=127.0.0.1",
            "-proxy-port=8088",
            "-stats-port=0",
            "-admin-address=none",
            "-connect-timeout=2s",
        ]
        .map(String::from),
    );
    args.push(format!("-listener=127.0.0.1:{port}={AUTHORITY}"));
    args.extend(extra.iter().cloned());
    // `env -i`: nothing from the test's environment (a CI's own proxy
    // variables) reaches the agent but what the case sets.
    let mut all = vec!["-i".to_string()];
    all.extend(args);
    ns.spawn(Path::new("env"), &all)
}

/// Bytes through the agent's listener come back from the echo destination.
fn echoes_through(ns: &Netns, port: u16) -> bool {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; printf hello-through-proxy >&3; timeout 5 head -c 19 <&3"
    );
    let (ok, out) = ns.run(&["bash", "-c", &script]);
    ok && out == "hello-through-proxy"
}

#[tokio::test]
async fn agent_reaches_the_seed_through_tinyproxy_plain_tls_and_from_the_environment() {
    let tinyproxy = tinyproxy();
    let ns = Netns::loopback_only();
    let dir = tempfile::tempdir().unwrap();
    let (_echo, echo_port) = ns.echo().await;
    let table = dir.path().join("table.yaml");
    std::fs::write(
        &table,
        format!(
            r#"services:
- metadata:
    namespace: proxied
    name: echo
    annotations: {{nodeport-proxy.k8s.io/expose: Tunneling}}
  spec:
    ports: [{{name: raw, port: 7000, protocol: TCP}}]
endpointSlices:
- metadata:
    namespace: proxied
    name: echo-1
    labels: {{kubernetes.io/service-name: echo}}
  ports: [{{name: raw, port: {echo_port}, protocol: TCP}}]
  endpoints: [{{addresses: ["::1"], conditions: {{ready: true}}}}]
"#
        ),
    )
    .unwrap();
    let mut seed = ns.spawn(
        &binary("nodeport-proxy"),
        &[
            format!("-config={}", table.display()),
            "-envoy-tunneling-port=8088".into(),
            "-envoy-stats-port=9002".into(),
            "-envoy-admin-port=0".into(),
        ],
    );
    seed.wait_line("serving tunneling listener").await;
    let conf = dir.path().join("tinyproxy.conf");
    std::fs::write(
        &conf,
        "Port 3128\nListen 127.0.0.1\nTimeout 600\nLogLevel Connect\nBasicAuth alice s3cret\nUser nobody\nGroup nogroup\n",
    )
    .unwrap();
    let mut proxy = ns.spawn(
        &tinyproxy,
        &["-d".into(), "-c".into(), conf.display().to_string()],
    );
    proxy.wait_line("Reloading config file finished").await;
    let pki = Pki::new();
    let id = pki.server("proxy", &["localhost"]);
    let mut relay = ns.spawn(
        Path::new("python3"),
        &[
            "-u".into(),
            "-c".into(),
            TLS_RELAY.into(),
            id.cert.display().to_string(),
            id.key.display().to_string(),
        ],
    );
    relay.wait_line("tls relay ready").await;

    // Basic auth from the flag.
    let mut plain = agent(
        &ns,
        16443,
        &[],
        &["-http-proxy=http://alice:s3cret@127.0.0.1:3128".into()],
    );
    let line = plain
        .wait_line("connected to seed proxy through the HTTP proxy")
        .await;
    assert!(
        line.contains("http://127.0.0.1:3128") && !line.contains("s3cret"),
        "{line}"
    );
    assert!(echoes_through(&ns, 16443), "{}", plain.log.join("\n"));
    proxy.wait_line("CONNECT 127.0.0.1:8088").await;

    // Wrong credentials: refused by the proxy, said so, nothing tunneled.
    let mut wrong = agent(
        &ns,
        16444,
        &[],
        &["-http-proxy=http://alice:nope@127.0.0.1:3128".into()],
    );
    let line = wrong.wait_line("seed proxy unreachable").await;
    assert!(
        line.contains("http://127.0.0.1:3128") && line.contains("credentials"),
        "{line}"
    );
    assert!(!echoes_through(&ns, 16444));

    // A proxy spoken to over TLS, its CA given.
    let mut tls = agent(
        &ns,
        16445,
        &[],
        &[
            "-http-proxy=https://alice:s3cret@localhost:3129".into(),
            format!("-http-proxy-ca={}", pki.ca().display()),
        ],
    );
    tls.wait_line("connected to seed proxy through the HTTP proxy")
        .await;
    assert!(echoes_through(&ns, 16445), "{}", tls.log.join("\n"));
    // ...and refused when its certificate is not trusted.
    let other = Pki::new();
    let mut untrusted = agent(
        &ns,
        16446,
        &[],
        &[
            "-http-proxy=https://alice:s3cret@localhost:3129".into(),
            format!("-http-proxy-ca={}", other.ca().display()),
        ],
    );
    let line = untrusted.wait_line("seed proxy unreachable").await;
    assert!(
        line.contains("TLS to the HTTP proxy https://localhost:3129"),
        "{line}"
    );

    // From the environment, for a seed named by a name that is not
    // `localhost` (Go's rules, which these follow, never send loopback
    // addresses or `localhost` through the environment's proxy).
    ns.add_host("127.0.0.1", "seed.test");
    let mut env = agent(
        &ns,
        16447,
        &["HTTPS_PROXY=http://alice:s3cret@127.0.0.1:3128"],
        &["-proxy-host=seed.test".into()],
    );
    env.wait_line("connected to seed proxy through the HTTP proxy")
        .await;
    assert!(echoes_through(&ns, 16447), "{}", env.log.join("\n"));
    proxy.wait_line("CONNECT seed.test:8088").await;
    // NO_PROXY naming the seed: direct, although the proxy named would not
    // answer.
    let mut direct = agent(
        &ns,
        16448,
        &["https_proxy=http://127.0.0.1:1", "no_proxy=localhost,.test"],
        &["-proxy-host=seed.test".into()],
    );
    let line = direct.wait_line("connected to seed proxy").await;
    assert!(!line.contains("HTTP proxy"), "{line}");
    assert!(echoes_through(&ns, 16448), "{}", direct.log.join("\n"));
    // A loopback seed: direct too.
    let mut lo = agent(&ns, 16449, &["HTTPS_PROXY=http://127.0.0.1:1"], &[]);
    let line = lo.wait_line("connected to seed proxy").await;
    assert!(!line.contains("HTTP proxy"), "{line}");
    drop((
        plain, wrong, tls, untrusted, env, direct, lo, relay, proxy, seed,
    ));
}
