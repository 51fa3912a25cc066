//! Reaching a peer through a corporate egress proxy: an HTTP/1.1 CONNECT
//! tunnel opened on a forward proxy, plain or over TLS, with basic
//! authentication, and the connection to the peer inside it. tunnel-agent
//! reaches the seed this way (KKP #7122). The proxy comes from the binary's flag or,
//! without it, from `HTTPS_PROXY`/`https_proxy` unless `NO_PROXY`/`no_proxy`
//! names the peer.
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

    /// The proxy the environment names for `peer_host`: `HTTPS_PROXY` (or
    /// `https_proxy`), unless `NO_PROXY` (or `no_proxy`) matches the peer.
    pub fn from_env(
        get: impl Fn(&str) -> Option<String>,
        peer_host: &str,
        peer_port: u16,
        ca: Option<PathBuf>,
    ) -> Result<Option<HttpProxy>, String> {
        let var = |names: [&'static str; 2]| {
            names
                .into_iter()
                .find_map(|n| get(n).filter(|v| !v.is_empty()).map(|v| (n, v)))
        };
        let Some((name, value)) = var(["HTTPS_PROXY", "https_proxy"]) else {
            return Ok(None);
        };
        if let Some((_, no)) = var(["NO_PROXY", "no_proxy"])
            && bypass(&no, peer_host, peer_port)
        {
            return Ok(None);
        }
        HttpProxy::parse(&value, ca)
            .map(Some)
            .map_err(|e| format!("{name}: {e}"))
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
        match status {
            200..=299 => {}
            401 | 407 => {
                return Err(ProxyError::Refused(
                    self.to_string(),
                    status,
                    if self.authorization.is_some() {
                        "the proxy refused the credentials in the proxy URL"
                    } else {
                        "the proxy wants credentials: give them in the proxy URL (http://user:password@host:port)"
                    },
                ));
            }
            _ => {
                return Err(ProxyError::Refused(
                    self.to_string(),
                    status,
                    "the proxy refused the CONNECT",
                ));
            }
        }
        let rest = Bytes::copy_from_slice(&buf[len..]);
        Ok(Box::new(PrefixedIo::new(rest, io)))
    }

    fn bad(&self, why: String) -> ProxyError {
        ProxyError::BadAnswer(self.to_string(), why)
    }
}

fn explain(e: &std::io::Error) -> String {
    match crate::tls::find_rustls_error(e) {
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
    #[error("the HTTP proxy {0} answered {1}: {2}")]
    Refused(String, u16, &'static str),
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

/// Whether `NO_PROXY` (curl's and Go's reading) exempts `host:port`: `*`
/// exempts everything; an entry is a domain (`example.com` and
/// `.example.com` match it and its subdomains), an IP address, or a CIDR,
/// optionally with `:port`. Longer than [`MAX_NO_PROXY`]: ignored whole.
pub fn bypass(no_proxy: &str, host: &str, port: u16) -> bool {
    if no_proxy.len() > MAX_NO_PROXY {
        return false;
    }
    let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
    let ip = host.parse::<IpAddr>().ok();
    for entry in no_proxy.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if entry == "*" {
            return true;
        }
        let entry = entry.to_ascii_lowercase();
        // A port, unless the entry is a bare IPv6 address or CIDR.
        let (name, entry_port) = match entry.rsplit_once(':') {
            Some((n, p)) if !n.contains(':') || n.ends_with(']') => {
                (n.trim_matches(['[', ']']), p.parse::<u16>().ok())
            }
            _ => (entry.trim_matches(['[', ']']), None),
        };
        if entry_port.is_some_and(|p| p != port) {
            continue;
        }
        if let Some(ip) = ip {
            if let Ok(net) = name.parse::<ipnet::IpNet>()
                && net.contains(&ip)
            {
                return true;
            }
            if name.parse::<IpAddr>().ok() == Some(ip) {
                return true;
            }
            continue;
        }
        let domain = name.trim_start_matches("*.").trim_start_matches('.');
        if domain.is_empty() {
            continue;
        }
        if host == domain || host.ends_with(&format!(".{domain}")) {
            return true;
        }
    }
    false
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
    fn environment_and_no_proxy() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let p = HttpProxy::from_env(
            env(&[("https_proxy", "http://p:1")]),
            "seed.example",
            8088,
            None,
        );
        assert_eq!(p.ok().flatten().map(|p| p.port), Some(1));
        let p = HttpProxy::from_env(
            env(&[("HTTPS_PROXY", "http://p:1"), ("NO_PROXY", "example")]),
            "seed.example",
            8088,
            None,
        );
        assert_eq!(p, Ok(None));
        let p = HttpProxy::from_env(env(&[("HTTPS_PROXY", "ftp://p")]), "s", 1, None);
        assert!(p.is_err_and(|e| e.starts_with("HTTPS_PROXY: ")));
        assert_eq!(HttpProxy::from_env(env(&[]), "s", 1, None), Ok(None));

        assert!(bypass("*", "anything", 1));
        assert!(bypass("foo, .example.com", "seed.example.com", 8088));
        assert!(bypass("example.com", "example.com", 8088));
        assert!(bypass("*.example.com", "a.b.example.com", 8088));
        assert!(!bypass("example.com", "notexample.com", 8088));
        assert!(bypass("example.com:8088", "seed.example.com", 8088));
        assert!(!bypass("example.com:443", "seed.example.com", 8088));
        assert!(bypass("10.0.0.0/8", "10.1.2.3", 8088));
        assert!(bypass("10.1.2.3", "10.1.2.3", 8088));
        assert!(!bypass("10.0.0.0/8", "11.1.2.3", 8088));
        assert!(bypass("2001:db8::/32", "[2001:db8::5]", 8088));
        assert!(bypass("[2001:db8::5]:8088", "2001:db8::5", 8088));
        assert!(bypass("::1", "::1", 8088));
        assert!(!bypass("", "seed", 8088));
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
