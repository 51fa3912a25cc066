//! Reaching a peer through a corporate egress proxy: an HTTP/1.1 CONNECT
//! tunnel opened on a forward proxy, plain or over TLS, with basic
//! authentication, and the connection to the peer inside it. tunnel-agent
//! reaches the seed this way (`-http-proxy`, KKP #7122), proxy-agent its
//! proxy servers (`--proxy-server-http-proxy`, apiserver-network-proxy #127).
//!
//! Without the flag the proxy comes from the environment, read as Go's
//! `net/http.ProxyFromEnvironment` reads it (what upstream's agent does
//! through grpc-go, and what operators of the Go originals know):
//! `HTTPS_PROXY`, else `https_proxy`; `NO_PROXY`, else `no_proxy`;
//! `localhost` and loopback addresses never go through the proxy.
//!
//! The proxy's answer is parsed by `httparse`; this file bounds how much of
//! it is read and keeps what the peer sent right after it.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::limits::{MAX_NO_PROXY, MAX_PROXY_RESPONSE_HEAD};
use crate::prefixed::PrefixedIo;

/// Where the system keeps its trusted CAs (Debian, Ubuntu, Alpine,
/// distroless); a TLS proxy is checked against it unless the binary's CA
/// flag names another bundle.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The environment variables [`EgressProxy::from_settings`] reads, in
/// Go's order of precedence (the first set and not empty wins).
pub const HTTPS_PROXY_VARS: [&str; 2] = ["HTTPS_PROXY", "https_proxy"];
pub const NO_PROXY_VARS: [&str; 2] = ["NO_PROXY", "no_proxy"];

/// How a binary reaches its peers: directly, through the proxy its flag
/// names, or through the environment's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum EgressProxy {
    /// No proxy: the flag says `direct`, or the environment names none.
    #[default]
    Direct,
    /// The flag's proxy, for every peer (the environment is not read).
    Flag(HttpProxy),
    /// `HTTPS_PROXY`'s proxy, except for peers `NO_PROXY` names and
    /// loopback ones.
    Environment {
        proxy: HttpProxy,
        /// Which variable named it (for messages).
        var: &'static str,
        no_proxy: String,
    },
}

impl EgressProxy {
    /// From the binary's flag (`flag` is its name, for messages): empty
    /// reads the environment through `env`, `direct` is no proxy, anything
    /// else is the proxy's URL. `ca` is the CA flag's bundle, if given.
    pub fn from_settings(
        flag: &str,
        value: &str,
        ca: Option<PathBuf>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<EgressProxy, String> {
        match value.trim() {
            "direct" => Ok(EgressProxy::Direct),
            "" => {
                let var = |names: [&'static str; 2]| {
                    names
                        .into_iter()
                        .find_map(|n| env(n).filter(|v| !v.is_empty()).map(|v| (n, v)))
                };
                let Some((name, value)) = var(HTTPS_PROXY_VARS) else {
                    return Ok(EgressProxy::Direct);
                };
                let proxy = HttpProxy::parse(&value, ca).map_err(|e| format!("{name}: {e}"))?;
                Ok(EgressProxy::Environment {
                    proxy,
                    var: name,
                    no_proxy: var(NO_PROXY_VARS).map(|(_, v)| v).unwrap_or_default(),
                })
            }
            url => HttpProxy::parse(url, ca)
                .map(EgressProxy::Flag)
                .map_err(|e| format!("{flag}: {e}")),
        }
    }

    /// The proxy a peer named `host` (at `addr` when the name was resolved
    /// here) on `port` is reached through, or `None`: directly. With the
    /// environment's proxy, a peer is reached directly when `NO_PROXY`
    /// names its host or its address, or when either is loopback (Go's
    /// rules).
    pub fn proxy_for(&self, host: &str, addr: Option<IpAddr>, port: u16) -> Option<&HttpProxy> {
        match self {
            EgressProxy::Direct => None,
            EgressProxy::Flag(p) => Some(p),
            EgressProxy::Environment {
                proxy, no_proxy, ..
            } => {
                let host = host.trim_matches(['[', ']']);
                let loopback = host.eq_ignore_ascii_case("localhost")
                    || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
                    || addr.is_some_and(|ip| ip.is_loopback());
                let exempt = bypass(no_proxy, host, port)
                    || addr.is_some_and(|ip| bypass(no_proxy, &ip.to_string(), port));
                (!loopback && !exempt).then_some(proxy)
            }
        }
    }

    /// The proxy, whatever peers it is used for.
    pub fn proxy(&self) -> Option<&HttpProxy> {
        match self {
            EgressProxy::Direct => None,
            EgressProxy::Flag(p) | EgressProxy::Environment { proxy: p, .. } => Some(p),
        }
    }

    /// Whether a TLS proxy's CA bundle can be used: a start-up error names
    /// the CA flag (`ca_flag`, without dashes) rather than failing every
    /// connection later.
    pub fn check_ca(&self, ca_flag: &'static str) -> Result<(), String> {
        let flags = crate::tls::FileFlags {
            cert: "",
            key: "",
            ca: ca_flag,
        };
        match self.proxy().filter(|p| p.tls) {
            Some(p) => crate::tls::load_roots(&p.ca).map(|_| ()).map_err(|e| {
                format!(
                    "the HTTP proxy {p} is spoken to over TLS, but its CA bundle cannot be used: {}",
                    e.naming(flags)
                )
            }),
            None => Ok(()),
        }
    }
}

impl std::fmt::Display for EgressProxy {
    /// For the start-up log line; never the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EgressProxy::Direct => f.write_str("direct"),
            EgressProxy::Flag(p) => write!(f, "{p}"),
            EgressProxy::Environment {
                proxy,
                var,
                no_proxy,
            } if no_proxy.is_empty() => write!(f, "{proxy} (from {var})"),
            EgressProxy::Environment {
                proxy,
                var,
                no_proxy,
            } => {
                let shown: String = no_proxy.chars().take(200).collect();
                let more = if shown.len() < no_proxy.len() {
                    "…"
                } else {
                    ""
                };
                write!(f, "{proxy} (from {var}; NO_PROXY {shown:?}{more})")
            }
        }
    }
}

/// A forward proxy a peer connection goes through.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpProxy {
    /// `https://`: TLS to the proxy itself.
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// `Proxy-Authorization` value (`Basic …`), from the URL's user info.
    authorization: Option<String>,
    /// CA bundle a TLS proxy's certificate is checked against.
    pub ca: PathBuf,
}

impl std::fmt::Debug for HttpProxy {
    /// Never the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl std::fmt::Display for HttpProxy {
    /// `http[s]://host:port`, without credentials (for logs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

impl HttpProxy {
    /// Parses `http://[user:password@]host[:port]` or `https://…` (port
    /// defaults 80 and 443; a bare `host:port` is taken as `http://`, as
    /// curl and Go do). User and password are percent-decoded.
    pub fn parse(s: &str, ca: Option<PathBuf>) -> Result<HttpProxy, String> {
        let with_scheme = if s.contains("://") {
            s.to_string()
        } else {
            format!("http://{s}")
        };
        let url = url::Url::parse(&with_scheme).map_err(|e| format!("{e}"))?;
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            other => return Err(format!("scheme {other:?} is not http or https")),
        };
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or("no host")?
            .trim_matches(['[', ']'])
            .to_string();
        if url.path() != "/" && !url.path().is_empty() || url.query().is_some() {
            return Err("a proxy URL has no path or query".into());
        }
        let port = url.port().unwrap_or(if tls { 443 } else { 80 });
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| "user info is not UTF-8".to_string())
        };
        let authorization = if url.username().is_empty() && url.password().is_none() {
            None
        } else {
            let user = decode(url.username())?;
            let password = decode(url.password().unwrap_or(""))?;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            Some(format!("Basic {token}"))
        };
        Ok(HttpProxy {
            tls,
            host,
            port,
            authorization,
            ca: ca.unwrap_or_else(|| PathBuf::from(SYSTEM_CA_BUNDLE)),
        })
    }

    /// Opens a tunnel to `host:port` through the proxy; what the peer sent
    /// in the same reads as the proxy's answer is replayed first.
    pub async fn connect(&self, host: &str, port: u16) -> Result<ProxiedIo, ProxyError> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|e| ProxyError::Resolve(self.to_string(), e))?
            .collect();
        let mut tcp = None;
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some((addr, e)),
            }
        }
        let tcp = match (tcp, last) {
            (Some(t), _) => t,
            (None, Some((addr, e))) => return Err(ProxyError::Connect(self.to_string(), addr, e)),
            (None, None) => return Err(ProxyError::NoAddress(self.to_string())),
        };
        let _ = tcp.set_nodelay(true);
        if !self.tls {
            return self.tunnel(tcp, host, port).await;
        }
        let config = crate::tls::client_config(&self.ca, None, &[])
            .map_err(|e| ProxyError::Tls(self.to_string(), e.to_string()))?;
        let name = rustls::pki_types::ServerName::try_from(self.host.clone())
            .map_err(|e| ProxyError::Tls(self.to_string(), e.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| ProxyError::Tls(self.to_string(), explain(&e)))?;
        self.tunnel(tls, host, port).await
    }

    async fn tunnel<T>(&self, mut io: T, host: &str, port: u16) -> Result<ProxiedIo, ProxyError>
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let target = match host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
            _ => format!("{host}:{port}"),
        };
        let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(a) = &self.authorization {
            head.push_str(&format!("Proxy-Authorization: {a}\r\n"));
        }
        head.push_str("\r\n");
        io.write_all(head.as_bytes())
            .await
            .map_err(|e| ProxyError::Io(self.to_string(), e))?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        let (status, len) = loop {
            if let Some(done) = parse_response(&buf).map_err(|e| self.bad(e))? {
                break done;
            }
            let want = (MAX_PROXY_RESPONSE_HEAD - buf.len()).min(chunk.len());
            let n = io
                .read(&mut chunk[..want])
                .await
                .map_err(|e| ProxyError::Io(self.to_string(), e))?;
            if n == 0 {
                return Err(self.bad("closed the connection before answering".into()));
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        if !(200..=299).contains(&status) {
            return Err(ProxyError::Refused {
                proxy: self.to_string(),
                status,
                reason: http::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or(""),
                target,
                why: refusal(status, self.authorization.is_some()),
            });
        }
        let rest = Bytes::copy_from_slice(&buf[len..]);
        Ok(Box::new(PrefixedIo::new(rest, io)))
    }

    fn bad(&self, why: String) -> ProxyError {
        ProxyError::BadAnswer(self.to_string(), why)
    }
}

/// What a refusal most likely means, for the operator.
fn refusal(status: u16, sent_credentials: bool) -> &'static str {
    match status {
        401 | 407 if sent_credentials => "the proxy refused the credentials in the proxy URL",
        401 | 407 => {
            "the proxy wants credentials: give them in the proxy URL (http://user:password@host:port)"
        }
        403 => "the proxy's rules do not allow a tunnel to this address and port",
        502..=504 => "the proxy could not reach it",
        500..=599 => "the proxy failed to open the tunnel (it may not reach the address)",
        _ => "the proxy refused the tunnel",
    }
}

/// Why TLS to the proxy failed. A proxy that answers TLS in plain HTTP is
/// most often one written `https://` in `HTTPS_PROXY` that speaks plain
/// HTTP: upstream's agent (grpc-go) ignores the scheme and works with it.
fn explain(e: &std::io::Error) -> String {
    match crate::tls::find_rustls_error(e) {
        Some(r @ rustls::Error::InvalidMessage(_)) => format!(
            "{}; an https:// proxy URL means TLS to the proxy: write http:// for a proxy that speaks plain HTTP",
            crate::tls::explain(r)
        ),
        Some(r) => crate::tls::explain(r),
        None => e.to_string(),
    }
}

/// A connection to a peer, direct or through a proxy.
pub trait ProxiedStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> ProxiedStream for T {}
pub type ProxiedIo = Box<dyn ProxiedStream>;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("resolving the HTTP proxy {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("the HTTP proxy {0} resolved to no address")]
    NoAddress(String),
    #[error("connecting to the HTTP proxy {0} at {1}: {2}")]
    Connect(String, SocketAddr, std::io::Error),
    #[error("TLS to the HTTP proxy {0}: {1}")]
    Tls(String, String),
    #[error("talking to the HTTP proxy {0}: {1}")]
    Io(String, std::io::Error),
    #[error("the HTTP proxy {proxy} answered {status} {reason} to CONNECT {target}: {why}")]
    Refused {
        proxy: String,
        status: u16,
        /// The status's standard reason phrase (never the proxy's text).
        reason: &'static str,
        target: String,
        why: &'static str,
    },
    #[error("the HTTP proxy {0} sent a bad answer: {1}")]
    BadAnswer(String, String),
}

/// The status and length of a complete response head at the start of
/// `buf`; `None` while more bytes could complete it.
pub fn parse_response(buf: &[u8]) -> Result<Option<(u16, usize)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            let status = resp.code.ok_or("no status")?;
            if status < 100 {
                return Err(format!("{status:03} is not an HTTP status"));
            }
            Ok(Some((status, len)))
        }
        Ok(httparse::Status::Partial) if buf.len() >= MAX_PROXY_RESPONSE_HEAD => Err(format!(
            "response head longer than {MAX_PROXY_RESPONSE_HEAD} bytes"
        )),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether `NO_PROXY` exempts `host:port`, read as Go's
/// `golang.org/x/net/http/httpproxy` reads it: entries are comma-separated;
/// `*` exempts everything; a CIDR (`10.0.0.0/8`, `fd00::/8`) exempts the
/// addresses in it; an IP address exempts itself; a domain `example.com`
/// exempts it and its subdomains, `.example.com` (or `*.example.com`) only
/// its subdomains; domains never match an address. An IP address or a
/// domain may carry `:port` (IPv6 as `[addr]:port`), and then exempts only
/// that port. Longer than [`MAX_NO_PROXY`]: ignored whole.
pub fn bypass(no_proxy: &str, host: &str, port: u16) -> bool {
    if no_proxy.len() > MAX_NO_PROXY {
        return false;
    }
    let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
    let ip = host.parse::<IpAddr>().ok();
    let port = port.to_string();
    for entry in no_proxy.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let entry = entry.to_ascii_lowercase();
        if entry == "*" {
            return true;
        }
        if let Ok(net) = entry.parse::<ipnet::IpNet>() {
            if ip.is_some_and(|ip| net.contains(&ip)) {
                return true;
            }
            continue;
        }
        let (name, entry_port) = split_host_port(&entry).unwrap_or((entry.as_str(), ""));
        if name.is_empty() || !entry_port.is_empty() && entry_port != port {
            continue;
        }
        if let Ok(entry_ip) = name.parse::<IpAddr>() {
            if ip == Some(entry_ip) {
                return true;
            }
            continue;
        }
        if ip.is_some() {
            continue;
        }
        let name = name
            .strip_prefix('*')
            .filter(|n| n.starts_with('.'))
            .unwrap_or(name);
        let matched = match name.strip_prefix('.') {
            // `.example.com`: subdomains only.
            Some(domain) => !domain.is_empty() && host.ends_with(name),
            None => host == name || host.strip_suffix(name).is_some_and(|h| h.ends_with('.')),
        };
        if matched {
            return true;
        }
    }
    false
}

/// `host:port` or `[v6]:port` as Go's `net.SplitHostPort` splits it; `None`
/// where it would fail (no port, or a bare IPv6 address).
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, port) = rest.split_once("]:")?;
        return (!host.contains(['[', ']']) && !port.contains([':', '[', ']']))
            .then_some((host, port));
    }
    let (host, port) = s.split_once(':')?;
    (!port.contains(':') && !host.contains(['[', ']'])).then_some((host, port))
}

/// The fuzz target's check (daemon/fuzz/fuzz_targets/proxy_answer.rs; its corpus
/// replays in `cargo test`): the input up to the first NUL is a proxy's
/// answer, the rest a `NO_PROXY` value. A complete head lies within the
/// input and the bound and parses the same from exactly its own bytes; an
/// unfinished one is shorter than the bound.
pub fn fuzz_one(data: &[u8]) {
    let split = data.iter().position(|b| *b == 0).unwrap_or(data.len());
    let (answer, no_proxy) = data.split_at(split);
    match parse_response(answer) {
        Ok(Some((status, len))) => {
            assert!(len <= answer.len() && len <= MAX_PROXY_RESPONSE_HEAD);
            assert!((100..1000).contains(&status));
            assert_eq!(parse_response(&answer[..len]), Ok(Some((status, len))));
        }
        Ok(None) => assert!(answer.len() < MAX_PROXY_RESPONSE_HEAD),
        Err(e) => assert!(!e.is_empty()),
    }
    let no_proxy = String::from_utf8_lossy(no_proxy);
    for host in ["seed.example.com", "10.1.2.3", "2001:db8::5"] {
        let _ = bypass(&no_proxy, host, 8088);
    }
    if no_proxy.len() <= MAX_NO_PROXY && no_proxy.split(',').any(|e| e.trim() == "*") {
        assert!(bypass(&no_proxy, "anything", 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls() {
        let p = HttpProxy::parse("http://al%40ice:s3cr%3Aet@proxy.corp:3128", None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.tls);
        assert_eq!((p.host.as_str(), p.port), ("proxy.corp", 3128));
        let token = base64::engine::general_purpose::STANDARD.encode("al@ice:s3cr:et");
        assert_eq!(p.authorization, Some(format!("Basic {token}")));
        assert_eq!(p.to_string(), "http://proxy.corp:3128");
        assert!(!format!("{p:?}").contains("s3cr"));
        let p = HttpProxy::parse("https://[2001:db8::1]", None).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.tls);
        assert_eq!((p.host.as_str(), p.port), ("2001:db8::1", 443));
        assert_eq!(p.ca, PathBuf::from(SYSTEM_CA_BUNDLE));
        let p = HttpProxy::parse("10.0.0.1:8080", None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.host.as_str(), p.port, p.tls), ("10.0.0.1", 8080, false));
        for bad in [
            "socks5://x:1",
            "http://",
            "http://x:1/path",
            "http://x:99999",
        ] {
            assert!(HttpProxy::parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn environment_flag_and_direct() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let from = |flag: &str, vars| EgressProxy::from_settings("--f", flag, None, env(vars));
        // Go's precedence: upper case first, an empty value is unset.
        let e = from(
            "",
            &[
                ("HTTPS_PROXY", ""),
                ("https_proxy", "http://lower:1"),
                ("NO_PROXY", "a.test"),
                ("no_proxy", "b.test"),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.proxy().map(|p| p.host.as_str()), Some("lower"));
        assert!(e.proxy_for("x.a.test", None, 1).is_none());
        assert!(e.proxy_for("x.b.test", None, 1).is_some());
        let e = from(
            "",
            &[
                ("HTTPS_PROXY", "upper:2"),
                ("https_proxy", "http://lower:1"),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            e.proxy().map(|p| (p.host.as_str(), p.port)),
            Some(("upper", 2))
        );
        // HTTP_PROXY is for http:// URLs, not for CONNECT: not read.
        assert_eq!(
            from("", &[("HTTP_PROXY", "http://p:1")]),
            Ok(EgressProxy::Direct)
        );
        assert_eq!(from("", &[]), Ok(EgressProxy::Direct));
        let bad = from("", &[("HTTPS_PROXY", "ftp://p")]);
        assert!(bad.is_err_and(|e| e.starts_with("HTTPS_PROXY: ")));

        // Loopback and localhost never go through the environment's proxy,
        // by name or by the address a name resolved to.
        let e = from("", &[("HTTPS_PROXY", "http://p:1")]).unwrap_or_else(|e| panic!("{e}"));
        for host in ["localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"] {
            assert!(e.proxy_for(host, None, 8091).is_none(), "{host}");
        }
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        assert!(e.proxy_for("server.test", lo, 8091).is_none());
        assert!(e.proxy_for("server.test", None, 8091).is_some());
        let other = Some(IpAddr::from([10, 0, 0, 5]));
        assert!(e.proxy_for("server.test", other, 8091).is_some());
        // NO_PROXY names the host or the address it resolved to.
        let e = from(
            "",
            &[("HTTPS_PROXY", "http://p:1"), ("no_proxy", "10.0.0.0/8")],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(e.proxy_for("server.test", other, 8091).is_none());
        assert!(e.proxy_for("server.test", None, 8091).is_some());

        // The flag: every peer, loopback too; the environment not read.
        let e = from("http://u:pw@flag:3", &[("NO_PROXY", "*")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.proxy_for("127.0.0.1", None, 1).map(|p| p.port), Some(3));
        assert_eq!(e.to_string(), "http://flag:3");
        assert_eq!(
            from("direct", &[("HTTPS_PROXY", "http://p:1")]),
            Ok(EgressProxy::Direct)
        );
        let bad = from("http://u:secret@p:99999", &[]);
        assert!(bad.is_err_and(|e| e.starts_with("--f: ") && !e.contains("secret")));
    }

    /// A proxy written `https://` that speaks plain HTTP (answering the
    /// ClientHello as a bad request): the error says what the scheme means.
    #[tokio::test]
    #[allow(clippy::unwrap_used)]
    async fn tls_to_a_plain_proxy_says_what_https_means() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let plain = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut hello = [0u8; 64];
            let _ = s.read(&mut hello).await;
            let _ = s
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
        });
        let proxy = HttpProxy::parse(&format!("https://127.0.0.1:{port}"), None).unwrap();
        let err = match proxy.connect("server.test", 8091).await {
            Ok(_) => panic!("TLS to a plain proxy succeeded"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.starts_with(&format!(
                "TLS to the HTTP proxy https://127.0.0.1:{port}: the peer does not speak TLS"
            )) && err.ends_with("write http:// for a proxy that speaks plain HTTP"),
            "{err}"
        );
        plain.await.unwrap();
    }

    /// Go's reading of NO_PROXY: every expectation here is what
    /// `golang.org/x/net/http/httpproxy` (Go 1.26) answers for an https://
    /// URL to the same host and port.
    #[test]
    fn no_proxy_as_go_reads_it() {
        let cases: &[(&str, &str, u16, bool)] = &[
            ("*", "anything", 1, true),
            ("a, *", "anything", 1, true),
            ("foo, .example.com", "seed.example.com", 8088, true),
            (".example.com", "example.com", 8088, false),
            ("example.com", "example.com", 8088, true),
            ("EXAMPLE.com", "Seed.Example.COM", 8088, true),
            ("*.example.com", "a.b.example.com", 8088, true),
            ("*.example.com", "example.com", 8088, false),
            ("example.com", "notexample.com", 8088, false),
            ("example.com:8088", "seed.example.com", 8088, true),
            ("example.com:443", "seed.example.com", 8088, false),
            ("example.com:x", "seed.example.com", 8088, false),
            ("10.0.0.0/8", "10.1.2.3", 8088, true),
            ("10.1.2.3", "10.1.2.3", 8088, true),
            ("10.1.2.3:8088", "10.1.2.3", 8088, true),
            ("10.1.2.3:443", "10.1.2.3", 8088, false),
            ("10.0.0.0/8", "11.1.2.3", 8088, false),
            ("10.0.0.0/8:8088", "10.1.2.3", 8088, false),
            ("10.1.2.3", "host.10.1.2.3", 8088, false),
            ("1.2.3", "10.1.2.3", 8088, false),
            ("2001:db8::/32", "[2001:db8::5]", 8088, true),
            ("[2001:db8::5]:8088", "2001:db8::5", 8088, true),
            ("[2001:db8::5]:443", "2001:db8::5", 8088, false),
            ("2001:db8::5", "2001:db8::5", 8088, true),
            ("::1", "::1", 8088, true),
            (":8088", "seed", 8088, false),
            ("", "seed", 8088, false),
            (" , seed ,", "seed", 8088, true),
        ];
        for (no_proxy, host, port, want) in cases {
            assert_eq!(
                bypass(no_proxy, host, *port),
                *want,
                "NO_PROXY={no_proxy:?} for {host}:{port}"
            );
        }
        assert!(!bypass(&"x,".repeat(MAX_NO_PROXY), "x", 1));
    }

    /// Replays daemon/fuzz/corpus/proxy_answer.
    #[test]
    fn proxy_answer_corpus() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/proxy_answer");
        let mut n = 0;
        for e in std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(Result::ok)
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(e.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
            fuzz_one(&bytes);
            let answer = bytes.split(|b| *b == 0).next().unwrap_or_default();
            if name.starts_with("ok-") {
                assert!(matches!(parse_response(answer), Ok(Some(_))), "{name}");
            }
            if name.starts_with("bad-") {
                assert!(parse_response(answer).is_err(), "{name}");
            }
            n += 1;
        }
        assert!(n >= 6, "corpus incomplete");
    }

    #[test]
    fn proxy_answers() {
        assert_eq!(
            parse_response(b"HTTP/1.1 200 Connection established\r\n\r\nSETTINGS"),
            Ok(Some((200, 39)))
        );
        assert_eq!(parse_response(b"HTTP/1.0 407 Proxy Auth"), Ok(None));
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n").is_err());
        let long = format!(
            "HTTP/1.1 200 OK\r\nX: {}",
            "a".repeat(MAX_PROXY_RESPONSE_HEAD)
        );
        assert!(parse_response(long.as_bytes()).is_err());
    }
}
