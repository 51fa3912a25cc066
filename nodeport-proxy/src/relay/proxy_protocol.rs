//! The PROXY protocol (HAProxy's, v1 text and v2 binary) on both ends, beyond
//! KKP: read from clients on listeners given `-accept-proxy-protocol` (a cloud
//! load balancer in front then reports the real client, which the source
//! allow-lists check), and written (v2) to upstreams whose Service asks.
//!
//! Parsing is the `ppp` crate's; this file bounds what is read before the
//! header must be complete, requires it to be the first bytes (no sniffing:
//! a listener that expects it refuses a connection without it), and keeps
//! what the client sent after it.

use std::net::SocketAddr;
use std::time::Duration;

use ppp::{HeaderResult, PartialResult, v1, v2};
use tokio::net::TcpStream;

use crate::limits::MAX_PROXY_HEADER;
use crate::relay::first_bytes;

/// Why a connection's PROXY header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHeaderError {
    #[error("client sent no PROXY protocol header (the listener requires one)")]
    Missing,
    #[error("client's PROXY protocol header is invalid: {0}")]
    Invalid(String),
    #[error("client's PROXY protocol header is longer than {MAX_PROXY_HEADER} bytes")]
    TooLarge,
    #[error("client's PROXY protocol header names a {0} connection, not TCP")]
    NotTcp(&'static str),
    #[error("client sent no complete PROXY protocol header within {0:?}")]
    Timeout(Duration),
    #[error("client closed before a complete PROXY protocol header")]
    Closed,
}

impl ProxyHeaderError {
    /// Why the connection ends, as counted.
    pub fn cause(&self) -> link::debug_connections::CloseReason {
        use link::debug_connections::CloseReason;
        match self {
            ProxyHeaderError::Timeout(_) => CloseReason::ClientTimeout,
            ProxyHeaderError::Closed => CloseReason::ClientClosed,
            _ => CloseReason::ProtocolError,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            ProxyHeaderError::Timeout(_) => "proxy_protocol_timeout",
            ProxyHeaderError::Closed => "client_closed",
            _ => "proxy_protocol_invalid",
        }
    }
}

/// A complete header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes the header took.
    pub len: usize,
    /// The client and the address it connected to, as the sender saw them;
    /// `None` for a LOCAL (health check) or UNKNOWN header, where the
    /// connection's own addresses stand.
    pub addresses: Option<(SocketAddr, SocketAddr)>,
}

/// Parses the start of `buf`: `Ok(None)` while more bytes could complete it.
pub fn parse(buf: &[u8]) -> Result<Option<Header>, ProxyHeaderError> {
    // The v2 length field is known from byte 16: refuse a long header before
    // waiting for it.
    if buf.len() >= 16 && buf.starts_with(V2_SIGNATURE) {
        let len = 16 + usize::from(u16::from_be_bytes([buf[14], buf[15]]));
        if len > MAX_PROXY_HEADER {
            return Err(ProxyHeaderError::TooLarge);
        }
    }
    // ppp refuses some prefixes of a valid v1 line (a port cut short), so
    // the line is handed over only once it has ended.
    if starts_like(buf, V1_SIGNATURE) && !buf.contains(&b'\n') {
        return if buf.len() >= V1_MAX {
            Err(ProxyHeaderError::Invalid(format!(
                "v1 line longer than {V1_MAX} bytes"
            )))
        } else {
            Ok(None)
        };
    }
    let result = HeaderResult::parse(buf);
    if result.is_incomplete() {
        if buf.len() >= MAX_PROXY_HEADER {
            return Err(ProxyHeaderError::TooLarge);
        }
        if !could_start_header(buf) {
            return Err(ProxyHeaderError::Missing);
        }
        return Ok(None);
    }
    match result {
        HeaderResult::V2(Ok(h)) => {
            let len = h.len();
            let addresses = match (h.command, h.addresses) {
                (v2::Command::Local, _) => None,
                (_, _) if h.protocol != v2::Protocol::Stream => {
                    return Err(ProxyHeaderError::NotTcp("datagram or unspecified"));
                }
                (_, v2::Addresses::IPv4(a)) => Some((
                    SocketAddr::from((a.source_address, a.source_port)),
                    SocketAddr::from((a.destination_address, a.destination_port)),
                )),
                (_, v2::Addresses::IPv6(a)) => Some((
                    SocketAddr::from((a.source_address, a.source_port)),
                    SocketAddr::from((a.destination_address, a.destination_port)),
                )),
                (_, v2::Addresses::Unix(_)) => return Err(ProxyHeaderError::NotTcp("Unix")),
                (_, v2::Addresses::Unspecified) => None,
            };
            Ok(Some(Header { len, addresses }))
        }
        HeaderResult::V1(Ok(h)) => {
            let len = h.header.len();
            let addresses = match h.addresses {
                v1::Addresses::Tcp4(a) => Some((
                    SocketAddr::from((a.source_address, a.source_port)),
                    SocketAddr::from((a.destination_address, a.destination_port)),
                )),
                v1::Addresses::Tcp6(a) => Some((
                    SocketAddr::from((a.source_address, a.source_port)),
                    SocketAddr::from((a.destination_address, a.destination_port)),
                )),
                v1::Addresses::Unknown => None,
            };
            Ok(Some(Header { len, addresses }))
        }
        HeaderResult::V2(Err(e)) => Err(if could_start_header(buf) {
            ProxyHeaderError::Invalid(e.to_string())
        } else {
            ProxyHeaderError::Missing
        }),
        HeaderResult::V1(Err(e)) => Err(if could_start_header(buf) {
            ProxyHeaderError::Invalid(e.to_string())
        } else {
            ProxyHeaderError::Missing
        }),
    }
}

const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";
const V1_SIGNATURE: &[u8] = b"PROXY ";

/// The longest v1 line, CRLF included (the specification's bound).
const V1_MAX: usize = 107;

/// Whether `buf` starts like (or is the start of) `sig`.
fn starts_like(buf: &[u8], sig: &[u8]) -> bool {
    let n = buf.len().min(sig.len());
    buf[..n] == sig[..n]
}

/// Whether `buf` starts like (or is the start of) either signature.
fn could_start_header(buf: &[u8]) -> bool {
    starts_like(buf, V2_SIGNATURE) || starts_like(buf, V1_SIGNATURE)
}

/// What a connection's first bytes said.
#[derive(Debug)]
pub struct Received {
    pub header: Header,
    /// What the client sent after the header, in the same reads.
    pub rest: Vec<u8>,
}

/// Reads the header from `io` within `timeout`.
pub async fn read(io: &TcpStream, timeout: Duration) -> Result<Received, ProxyHeaderError> {
    let mut buf = Vec::new();
    let read = async {
        loop {
            match first_bytes::read_some(io, &mut buf, MAX_PROXY_HEADER).await {
                Ok(0) | Err(_) => return Err(ProxyHeaderError::Closed),
                Ok(_) => {}
            }
            if let Some(h) = parse(&buf)? {
                return Ok(h);
            }
        }
    };
    let header = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| ProxyHeaderError::Timeout(timeout))??;
    buf.drain(..header.len);
    buf.shrink_to_fit();
    Ok(Received { header, rest: buf })
}

/// A PROXY v2 header for a TCP connection from `source` to `destination`
/// (mixed families are sent as IPv6, v4 addresses mapped).
pub fn v2_header(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let (source, destination) = match (source, destination) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) | (SocketAddr::V6(_), SocketAddr::V6(_)) => {
            (source, destination)
        }
        _ => (to_v6(source), to_v6(destination)),
    };
    let addresses = v2::Addresses::from((source, destination));
    v2::Builder::with_addresses(
        v2::Version::Two | v2::Command::Proxy,
        v2::Protocol::Stream,
        addresses,
    )
    .build()
    // Only a header over 64 KiB fails to build; two addresses cannot.
    .unwrap_or_default()
}

fn to_v6(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V4(v4) => SocketAddr::from((v4.ip().to_ipv6_mapped(), v4.port())),
        v6 => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn v1_and_v2_headers_name_the_client_and_keep_what_follows() {
        let v1 = b"PROXY TCP4 203.0.113.7 10.0.0.1 51000 6443\r\n\x16\x03\x01";
        let h = parse(v1)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("incomplete"));
        assert_eq!(h.len, v1.len() - 3);
        assert_eq!(
            h.addresses,
            Some((sa("203.0.113.7:51000"), sa("10.0.0.1:6443")))
        );
        for n in 0..h.len {
            assert_eq!(parse(&v1[..n]), Ok(None), "v1 prefix {n}");
        }
        let v6 = b"PROXY TCP6 2001:db8::7 2001:db8::1 51000 8088\r\n";
        let h = parse(v6)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("incomplete"));
        assert_eq!(h.addresses.map(|a| a.0), Some(sa("[2001:db8::7]:51000")));
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n").map(|h| h.map(|h| h.addresses)),
            Ok(Some(None))
        );
        for (src, dst) in [
            ("198.51.100.1:1234", "10.0.0.2:443"),
            ("[2001:db8::9]:1234", "[2001:db8::1]:443"),
            ("198.51.100.1:1234", "[2001:db8::1]:443"),
        ] {
            let mut bytes = v2_header(sa(src), sa(dst));
            let len = bytes.len();
            bytes.extend_from_slice(b"GET");
            let h = parse(&bytes)
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("incomplete"));
            assert_eq!(h.len, len);
            let (s, _) = h.addresses.unwrap_or_else(|| panic!("no addresses"));
            assert_eq!(s.ip().to_canonical(), sa(src).ip());
            // Every prefix asks for more.
            for n in 0..len {
                assert_eq!(parse(&bytes[..n]), Ok(None), "prefix {n}");
            }
        }
    }

    #[test]
    fn anything_else_is_refused_at_once() {
        assert_eq!(
            parse(b"\x16\x03\x01\x02\x00"),
            Err(ProxyHeaderError::Missing)
        );
        assert_eq!(
            parse(b"CONNECT a:1 HTTP/1.1\r\n"),
            Err(ProxyHeaderError::Missing)
        );
        assert_eq!(parse(b"G"), Err(ProxyHeaderError::Missing));
        assert!(matches!(
            parse(b"PROXY TCP4 1.2.3.4 nope 1 2\r\n"),
            Err(ProxyHeaderError::Invalid(_))
        ));
        // A v2 header announcing more than the bound is refused from its
        // first 16 bytes.
        let mut long = V2_SIGNATURE.to_vec();
        long.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert_eq!(parse(&long), Err(ProxyHeaderError::TooLarge));
        // A v1 line without its end stops at 107 bytes.
        let mut v1 = b"PROXY TCP4 ".to_vec();
        v1.extend(std::iter::repeat_n(b'1', 95));
        assert_eq!(parse(&v1), Ok(None));
        v1.push(b'1');
        assert!(parse(&v1).is_err());
    }
}
