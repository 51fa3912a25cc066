//! The `host:port` target of an HTTP CONNECT request (authority-form, RFC 9112
//! §3.2.3), normalised so it can be compared exactly: the host in lower case,
//! the port always present.

use std::fmt;

/// The host is shared, not copied, by clones (a seed's routing table holds
/// each authority in several places).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectAuthority {
    host: std::sync::Arc<str>,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    #[error("authority {0:?} has no port")]
    NoPort(String),
    #[error("authority {0:?} has an invalid port")]
    BadPort(String),
    #[error("authority {0:?} has an empty or invalid host")]
    BadHost(String),
}

impl ConnectAuthority {
    pub fn new(host: &str, port: u16) -> Result<Self, AuthorityError> {
        let valid = !host.is_empty()
            && host.len() <= 253
            && port != 0
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
        // A colon is only allowed inside a bracketed IPv6 literal.
        let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
        if !(valid || bracketed && port != 0) {
            return Err(AuthorityError::BadHost(format!("{host}:{port}")));
        }
        if host.contains(':') && !bracketed {
            return Err(AuthorityError::BadHost(format!("{host}:{port}")));
        }
        if bracketed
            && host[1..host.len() - 1]
                .parse::<std::net::Ipv6Addr>()
                .is_err()
        {
            return Err(AuthorityError::BadHost(format!("{host}:{port}")));
        }
        Ok(ConnectAuthority {
            host: host.to_ascii_lowercase().into(),
            port,
        })
    }

    pub fn parse(s: &str) -> Result<Self, AuthorityError> {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| AuthorityError::NoPort(s.to_string()))?;
        if host.contains(':') && !host.starts_with('[') {
            return Err(AuthorityError::NoPort(s.to_string()));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| AuthorityError::BadPort(s.to_string()))?;
        if port == 0 || !port_is_canonical(s) {
            return Err(AuthorityError::BadPort(s.to_string()));
        }
        Self::new(host, port)
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// `+443` and `0443` parse as numbers but are not how a port is written.
fn port_is_canonical(s: &str) -> bool {
    s.rsplit_once(':')
        .map(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !p.starts_with('0'))
        .unwrap_or(false)
}

impl fmt::Display for ConnectAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl std::str::FromStr for ConnectAuthority {
    type Err = AuthorityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalises() {
        let a = ConnectAuthority::parse("Apiserver-External.Cluster-X.svc.cluster.local:443");
        assert_eq!(
            a.map(|a| a.to_string()).ok().as_deref(),
            Some("apiserver-external.cluster-x.svc.cluster.local:443")
        );
        assert_eq!(
            ConnectAuthority::parse("[::1]:80").map(|a| a.port()).ok(),
            Some(80)
        );
    }

    #[test]
    fn rejects_bad_forms() {
        for bad in [
            "host",
            "host:",
            ":80",
            "host:0",
            "host:99999",
            "host:+80",
            "host:080",
            "a b:80",
            "/path:80",
            "::1:80",
            "[zz]:80",
            "user@host:80",
        ] {
            assert!(
                ConnectAuthority::parse(bad).is_err(),
                "{bad} must be rejected"
            );
        }
    }
}
