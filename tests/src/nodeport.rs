//! Support for the nodeport-proxy and tunnel-agent tests: inventories built
//! as JSON (the file format the proxy reads), a proxy on port-0 listeners fed
//! from a temp file, TLS and plain HTTP destinations that say who answered,
//! and a curl runner.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nodeport_proxy::{Listeners, NodePortProxy, ProxyConfig, TableSource};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::certs::Pki;

/// A Service object. `ports`: (name, port, nodePort).
pub fn service(ns: &str, name: &str, expose: &str, ty: &str, ports: &[(&str, u16, u16)]) -> Value {
    json!({
        "metadata": {
            "namespace": ns, "name": name, "uid": format!("{ns}/{name}"),
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "annotations": {"nodeport-proxy.k8s.io/expose": expose},
        },
        "spec": {
            "type": ty,
            "ports": ports.iter().map(|(n, p, np)| json!({"name": n, "port": p, "nodePort": np, "protocol": "TCP"})).collect::<Vec<_>>(),
        }
    })
}

/// Adds the SNI port mapping annotation.
pub fn with_mapping(mut svc: Value, mapping: &[(&str, &str)]) -> Value {
    let m: serde_json::Map<String, Value> = mapping
        .iter()
        .map(|(k, v)| ((*k).to_string(), json!(v)))
        .collect();
    svc["metadata"]["annotations"]["nodeport-proxy.k8s.io/port-mapping"] =
        json!(Value::Object(m).to_string());
    svc
}

/// An EndpointSlice for `svc` whose port `port_name` resolves per endpoint:
/// every address is 127.0.0.1 here, so each endpoint gets its own slice port.
pub fn slices(
    ns: &str,
    svc: &str,
    port_name: &str,
    endpoints: &[(SocketAddr, bool)],
) -> Vec<Value> {
    endpoints
        .iter()
        .enumerate()
        .map(|(i, (addr, ready))| {
            json!({
                "metadata": {"namespace": ns, "name": format!("{svc}-{i}"), "labels": {"kubernetes.io/service-name": svc}},
                "ports": [{"name": port_name, "port": addr.port(), "protocol": "TCP"}],
                "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": ready}}],
            })
        })
        .collect()
}

/// A minimal TLS 1.3 ClientHello naming `sni`, in one record.
pub fn client_hello(sni: &str) -> Vec<u8> {
    client_hello_records(sni, 16 << 10)
}

/// The same ClientHello, its handshake message split into records of at
/// most `record` bytes.
pub fn client_hello_records(sni: &str, record: usize) -> Vec<u8> {
    let mut list = vec![0u8];
    list.extend_from_slice(&(sni.len() as u16).to_be_bytes());
    list.extend_from_slice(sni.as_bytes());
    let mut ext = (list.len() as u16).to_be_bytes().to_vec();
    ext.extend_from_slice(&list);
    let mut exts = vec![0, 0];
    exts.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    exts.extend_from_slice(&ext);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[1u8; 32]);
    body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut out = Vec::new();
    for chunk in hs.chunks(record.max(1)) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

pub fn inventory(services: Vec<Value>, slices: Vec<Vec<Value>>) -> Value {
    json!({"services": services, "endpointSlices": slices.into_iter().flatten().collect::<Vec<_>>()})
}

/// The CONNECT authority of [`tunneling_echo`]'s Service.
pub const TUNNELED_ECHO: &str = "echo.cluster-a.svc.cluster.local:7000";

/// An inventory of one Service, `cluster-a/echo`, exposed for tunneling only
/// on port 7000 and served by `echo`: a CONNECT to [`TUNNELED_ECHO`] reaches it.
pub fn tunneling_echo(echo: SocketAddr) -> Value {
    inventory(
        vec![service(
            "cluster-a",
            "echo",
            "Tunneling",
            "ClusterIP",
            &[("raw", 7000, 0)],
        )],
        vec![slices("cluster-a", "echo", "raw", &[(echo, true)])],
    )
}

pub async fn loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

/// A proxy serving stats, SNI and tunneling listeners on loopback port 0,
/// reading its table from a temp file.
pub struct Proxy {
    pub proxy: NodePortProxy,
    pub sni: SocketAddr,
    pub tunnel: SocketAddr,
    pub stats: SocketAddr,
    /// `/debug/connections`.
    pub admin: SocketAddr,
    pub file: PathBuf,
    _dir: tempfile::TempDir,
}

pub fn test_config() -> ProxyConfig {
    ProxyConfig {
        node_port_bind_address: [127, 0, 0, 1].into(),
        shutdown_delay: Duration::ZERO,
        route_drain_timeout: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(5),
        ..ProxyConfig::default()
    }
}

pub async fn start_proxy(
    inventory: &Value,
    node_ports: Vec<TcpListener>,
    config: ProxyConfig,
) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("table.json");
    std::fs::write(&file, inventory.to_string()).unwrap();
    let (stats, tunnel) = (loopback().await, loopback().await);
    // With -sni-overflow-slow-lane the SNI listener comes with its lane, as
    // the binary binds it.
    let (sni, sni_slow_lane) = if config.sni_overflow_slow_lane.is_zero() {
        (loopback().await, None)
    } else {
        let (l, lane) = daemon::slow_lane::bind("127.0.0.1", 0, config.sni_overflow_slow_lane)
            .await
            .unwrap();
        (l, Some(lane))
    };
    let admin = loopback().await;
    let admin_addr = admin.local_addr().unwrap();
    let addrs = (
        stats.local_addr().unwrap(),
        sni.local_addr().unwrap(),
        tunnel.local_addr().unwrap(),
    );
    let config = ProxyConfig {
        source: TableSource::File(file.clone()),
        ..config
    };
    let listeners = Listeners {
        admin: Some(admin),
        stats: Some(stats),
        sni: Some(sni),
        sni_slow_lane,
        tunneling: Some(tunnel),
        node_ports,
    };
    let proxy = NodePortProxy::start(config, listeners).await.unwrap();
    Proxy {
        proxy,
        stats: addrs.0,
        admin: admin_addr,
        sni: addrs.1,
        tunnel: addrs.2,
        file,
        _dir: dir,
    }
}

impl Proxy {
    /// Replaces the table file (write + rename, as editors and ConfigMaps do),
    /// asks for a reload, and waits until the new table is served.
    pub async fn rewrite(&self, inventory: &Value) {
        let before = self.proxy.status().borrow().version;
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, inventory.to_string()).unwrap();
        std::fs::rename(&tmp, &self.file).unwrap();
        self.proxy.reload();
        let mut status = self.proxy.status();
        tokio::time::timeout(
            Duration::from_secs(10),
            status.wait_for(|s| s.version > before),
        )
        .await
        .expect("new table not applied within 10s")
        .unwrap();
    }

    /// A GET on the stats port: (status code, body).
    pub async fn stats_get(&self, path: &str) -> (u16, String) {
        http_get(self.stats, path).await
    }
}

pub use crate::http_get;

async fn answer_http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    body: &str,
) {
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// A plain HTTP server answering every request with `name`.
pub async fn http_named(name: &'static str) -> SocketAddr {
    let l = loopback().await;
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(answer_http(s, name));
        }
    });
    addr
}

/// A TLS server (certificate for `hosts`) answering every HTTP request with `name`.
pub async fn tls_named(pki: &Pki, name: &'static str, hosts: &[&str]) -> SocketAddr {
    let id = pki.server(name, hosts);
    let cfg = daemon::tls::server_config(
        &id.cert,
        &id.key,
        None,
        &daemon::tls::TlsPolicy::default(),
        &[b"http/1.1"],
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = loopback().await;
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    answer_http(tls, name).await;
                }
            });
        }
    });
    addr
}

/// Runs curl with a time limit; returns (exit success, stdout, stderr).
pub async fn curl(args: &[&str]) -> (bool, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("/usr/bin/curl")
            .args(["--silent", "--show-error", "--max-time", "20"])
            .args(args)
            .output(),
    )
    .await
    .expect("curl hung")
    .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Reads until EOF or error within `limit`; returns what arrived and whether
/// the peer closed (EOF or reset) in time.
pub async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    limit: Duration,
) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let closed = tokio::time::timeout(limit, async {
        let mut b = [0u8; 4096];
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
    })
    .await
    .is_ok();
    (got, closed)
}

/// Sends an HTTP/1.1 CONNECT and returns the status line's code and the stream.
pub async fn connect_h1(proxy: SocketAddr, authority: &str) -> (u16, tokio::net::TcpStream) {
    try_connect_h1(proxy, authority)
        .await
        .unwrap_or_else(|| panic!("CONNECT {authority} through {proxy} got no answer"))
}

/// [`connect_h1`] that says `None` instead of panicking when the proxy
/// refuses the connection or closes before a whole response head (status 0:
/// not a status line).
pub async fn try_connect_h1(
    proxy: SocketAddr,
    authority: &str,
) -> Option<(u16, tokio::net::TcpStream)> {
    let mut s = tokio::net::TcpStream::connect(proxy).await.ok()?;
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => break,
            Ok(_) => head.push(b[0]),
        }
    }
    if head.is_empty() {
        return None;
    }
    let code = std::str::from_utf8(&head)
        .ok()
        .and_then(|h| h.get(9..12))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Some((code, s))
}

/// An HTTP/2 (h2c) client connection to the tunneling port.
pub async fn h2_client(proxy: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    h2_client_over(tokio::net::TcpStream::connect(proxy).await.unwrap()).await
}

/// A TCP connection to `to` from the loopback address `from` (any of
/// 127.0.0.0/8), for a test that needs a second client address.
pub async fn connect_from(from: std::net::IpAddr, to: SocketAddr) -> tokio::net::TcpStream {
    try_connect_from(from, to).await.unwrap()
}

/// [`connect_from`] that hands back its error (a flood's connections may
/// fail).
pub async fn try_connect_from(
    from: std::net::IpAddr,
    to: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = match from {
        std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// An HTTP/2 client on `io` with Nagle's algorithm off, as tunnel-agent
/// opens its seed connections: with it on, a CONNECT's small frames may
/// wait 40 ms for a delayed ACK.
pub async fn h2_client_over(io: tokio::net::TcpStream) -> h2::client::SendRequest<bytes::Bytes> {
    io.set_nodelay(true).unwrap();
    let (send, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// Opens a CONNECT stream; returns the status and, on 200, the stream as a byte pipe.
pub async fn connect_h2(
    send: &h2::client::SendRequest<bytes::Bytes>,
    authority: &str,
) -> (u16, Option<link::h2io::H2Io>) {
    let mut send = send.clone().ready().await.unwrap();
    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(authority)
        .body(())
        .unwrap();
    let (resp, stream) = send.send_request(req, false).unwrap();
    let resp = resp.await.unwrap();
    let code = resp.status().as_u16();
    if code != 200 {
        return (code, None);
    }
    (code, Some(link::h2io::H2Io::new(stream, resp.into_body())))
}

/// A loopback listener on a port below the kernel's ephemeral range, as a
/// real node port (30000-32767) is: a test that frees it to watch a retry
/// bind it must not see another connection's source port take it first
/// (a port from `bind(0)` comes from that range; a loopback connection's
/// source port, or its TIME_WAIT, holding it is the likeliest reason the
/// soak once waited 60 s for a freed port to be bound).
pub fn listener_below_ephemeral_ports() -> std::net::TcpListener {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let first = 10_000u16.min(low.saturating_sub(1));
    let span = low.saturating_sub(first).max(1);
    // Start where another test process likely does not.
    let start = u16::try_from(std::process::id() % u32::from(span)).unwrap_or(0);
    for i in 0..span {
        let port = first + (start + i) % span;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l;
        }
    }
    panic!("no free loopback port between {first} and {low}");
}
