//! Parses an HTTP/1.1 request head on the tunneling port and decides what to
//! answer if it is not a usable CONNECT. The head must fit in a fixed buffer;
//! what follows it is early tunnel data.

pub use crate::limits::MAX_CONNECT_HEAD as MAX_HEAD;
use crate::limits::MAX_CONNECT_HEADERS as MAX_HEADERS;
use crate::routing::names::ConnectAuthority;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectHead {
    pub authority: ConnectAuthority,
    /// Bytes of the head; anything after it in the buffer is tunnel data.
    pub head_len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Incomplete,
    Connect(ConnectHead),
}

/// Why a request head was refused; each maps to one status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("malformed request head: {0}")]
    Malformed(String),
    #[error("request head larger than {MAX_HEAD} bytes")]
    TooLarge,
    /// Envoy answers these 404: KKP's routes match CONNECT only, so no
    /// route matches anything else.
    #[error("no route for method {0}; only CONNECT is routed")]
    NotConnect(String),
    #[error("CONNECT target {0:?} is not host:port")]
    BadTarget(String),
    #[error("unsupported HTTP version")]
    Version,
}

impl RequestError {
    pub fn status(&self) -> u16 {
        match self {
            RequestError::Malformed(_) | RequestError::BadTarget(_) => 400,
            RequestError::TooLarge => 431,
            RequestError::NotConnect(_) => 404,
            RequestError::Version => 505,
        }
    }
}

/// Parses the head at the start of `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, RequestError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let status = match req.parse(buf) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooLarge),
        Err(httparse::Error::Version) => return Err(RequestError::Version),
        Err(e) => return Err(RequestError::Malformed(e.to_string())),
    };
    let head_len = match status {
        httparse::Status::Partial => {
            if buf.len() >= MAX_HEAD {
                return Err(RequestError::TooLarge);
            }
            return Ok(Parsed::Incomplete);
        }
        httparse::Status::Complete(n) => n,
    };
    if head_len > MAX_HEAD {
        return Err(RequestError::TooLarge);
    }
    let method = req.method.unwrap_or_default();
    if method != "CONNECT" {
        return Err(RequestError::NotConnect(method.chars().take(32).collect()));
    }
    let target = req.path.unwrap_or_default();
    let authority = ConnectAuthority::parse(target)
        .map_err(|_| RequestError::BadTarget(target.chars().take(256).collect()))?;
    Ok(Parsed::Connect(ConnectHead {
        authority,
        head_len,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_connect_and_keeps_early_data() {
        let buf = b"CONNECT svc.ns.svc.cluster.local:443 HTTP/1.1\r\nHost: svc.ns.svc.cluster.local:443\r\n\r\nearly";
        let Ok(Parsed::Connect(head)) = parse(buf) else {
            panic!("{:?}", parse(buf));
        };
        assert_eq!(head.authority.to_string(), "svc.ns.svc.cluster.local:443");
        assert_eq!(&buf[head.head_len..], b"early");
        for n in 0..buf.len() - 5 {
            assert_eq!(parse(&buf[..n]), Ok(Parsed::Incomplete), "prefix {n}");
        }
    }

    #[test]
    fn refusals_have_clear_statuses() {
        let status = |b: &[u8]| parse(b).err().map(|e| e.status());
        assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), Some(404));
        assert_eq!(status(b"CONNECT /path HTTP/1.1\r\n\r\n"), Some(400));
        assert_eq!(status(b"CONNECT host HTTP/1.1\r\n\r\n"), Some(400));
        assert_eq!(status(b"CONNECT host:80 HTTP/9.9\r\n\r\n"), Some(505));
        assert_eq!(status(b"\x00\x01\x02garbage\r\n\r\n"), Some(400));
        assert_eq!(
            status(b"CONNECT a:1 HTTP/1.1\r\nbad header\r\n\r\n"),
            Some(400)
        );
        let long = vec![b'A'; MAX_HEAD];
        assert_eq!(status(&long), Some(431));
        let mut many = b"CONNECT a:1 HTTP/1.1\r\n".to_vec();
        for i in 0..100 {
            many.extend_from_slice(format!("x{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(status(&many), Some(431));
    }
}
