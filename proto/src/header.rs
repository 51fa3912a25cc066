//! gRPC metadata keys and the agent-identifier encoding shared by server and agent.
//!
//! grpc-go lower-cases metadata keys on the wire, so these are the on-wire names.

/// Agent → server: the agent's id (exactly one value).
pub const AGENT_ID: &str = "agentid";
/// Agent → server: URL-query encoded identifiers (`ipv4=…&host=…`).
pub const AGENT_IDENTIFIERS: &str = "agentidentifiers";
/// Agent → server: `Bearer <token>` when token authentication is used.
pub const AUTHORIZATION: &str = "authorization";
/// Server → agent response header: the server's id.
pub const SERVER_ID: &str = "serverid";
/// Server → agent response header: how many servers the agent should hold.
pub const SERVER_COUNT: &str = "servercount";
/// Not upstream: both directions announce per-connection flow control and the
/// largest window (bytes) they grant one connection; see `link::flow`.
/// Upstream ignores it. (Builds before adaptive windows used
/// `konnectivity-flow-window`; they and we see each other as upstream peers.)
pub const FLOW_CONTROL: &str = "konnectivity-flow-control";

/// The kinds of identifier an agent can advertise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdentifierKind {
    Ipv4,
    Ipv6,
    Host,
    Cidr,
    DefaultRoute,
}

impl IdentifierKind {
    pub const ALL: [IdentifierKind; 5] = [
        IdentifierKind::Ipv4,
        IdentifierKind::Ipv6,
        IdentifierKind::Host,
        IdentifierKind::Cidr,
        IdentifierKind::DefaultRoute,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IdentifierKind::Ipv4 => "ipv4",
            IdentifierKind::Ipv6 => "ipv6",
            IdentifierKind::Host => "host",
            IdentifierKind::Cidr => "cidr",
            IdentifierKind::DefaultRoute => "default-route",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// Parsed `agentidentifiers`. Unknown keys are dropped (the server must tolerate
/// newer agents); the agent validates keys separately with [`validate_identifiers`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentIdentifiers {
    pub ipv4: Vec<String>,
    pub ipv6: Vec<String>,
    pub host: Vec<String>,
    pub cidr: Vec<String>,
    pub default_route: bool,
}

/// Errors from decoding the identifiers header.
#[derive(Debug, thiserror::Error)]
pub enum IdentifierError {
    #[error("unknown address type: {0}")]
    UnknownKey(String),
    #[error("invalid default-route value {0:?}")]
    BadBool(String),
    /// Go's `url.ParseQuery` error text.
    #[error("{0}")]
    BadEncoding(String),
}

/// Splits a URL query string into decoded key/value pairs (`+` is a space, `%XX`
/// escapes), the same way Go's `url.ParseQuery` does.
pub fn parse_query(s: &str) -> Result<Vec<(String, String)>, IdentifierError> {
    let mut out = Vec::new();
    for part in s.split('&').filter(|p| !p.is_empty()) {
        if part.contains(';') {
            return Err(IdentifierError::BadEncoding(
                "invalid semicolon separator in query".into(),
            ));
        }
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        out.push((unescape(k)?, unescape(v)?));
    }
    Ok(out)
}

fn unescape(s: &str) -> Result<String, IdentifierError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        // Go quotes the bad escape: '%' and up to two bytes.
                        let bad = String::from_utf8_lossy(&bytes[i..bytes.len().min(i + 3)]);
                        IdentifierError::BadEncoding(format!("invalid URL escape {bad:?}"))
                    })?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    // Go keeps bytes that are not UTF-8; they never match an identifier.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Parses Go's `strconv.ParseBool` spellings.
pub fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

impl AgentIdentifiers {
    /// Server-side decoding: unknown keys are ignored for version skew.
    pub fn parse_lenient(s: &str) -> Result<Self, IdentifierError> {
        let mut ids = AgentIdentifiers::default();
        let mut seen_default_route = false;
        for (k, v) in parse_query(s)? {
            match IdentifierKind::parse(&k) {
                Some(IdentifierKind::Ipv4) => ids.ipv4.push(v),
                Some(IdentifierKind::Ipv6) => ids.ipv6.push(v),
                Some(IdentifierKind::Host) => ids.host.push(v),
                Some(IdentifierKind::Cidr) => ids.cidr.push(v),
                // Only the first value counts, as upstream reads it; one
                // that is not a Go bool is ignored, as upstream ignores it.
                Some(IdentifierKind::DefaultRoute) if !seen_default_route => {
                    seen_default_route = true;
                    ids.default_route = parse_go_bool(&v).unwrap_or(false);
                }
                Some(IdentifierKind::DefaultRoute) => {}
                None => {}
            }
        }
        Ok(ids)
    }

    /// All addresses that `destHost` routing may match on.
    pub fn dest_hosts(&self) -> impl Iterator<Item = &str> {
        self.ipv4
            .iter()
            .chain(&self.ipv6)
            .chain(&self.host)
            .map(String::as_str)
    }
}

/// Agent-side validation: every key must be a known identifier type.
pub fn validate_identifiers(s: &str) -> Result<(), IdentifierError> {
    for (k, v) in parse_query(s)? {
        match IdentifierKind::parse(&k) {
            None => return Err(IdentifierError::UnknownKey(k)),
            Some(IdentifierKind::DefaultRoute) if parse_go_bool(&v).is_none() => {
                return Err(IdentifierError::BadBool(v));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_example() {
        let s = "host=localhost&host=node1.mydomain.com&cidr=127.0.0.1/16&ipv4=1.2.3.4&ipv4=5.6.7.8&ipv6=:::::&default-route=true";
        let ids = AgentIdentifiers::parse_lenient(s).unwrap_or_default();
        assert_eq!(ids.host, ["localhost", "node1.mydomain.com"]);
        assert_eq!(ids.ipv4, ["1.2.3.4", "5.6.7.8"]);
        assert_eq!(ids.ipv6, [":::::"]);
        assert_eq!(ids.cidr, ["127.0.0.1/16"]);
        assert!(ids.default_route);
        assert!(validate_identifiers(s).is_ok());
    }

    #[test]
    fn server_ignores_unknown_keys_agent_rejects_them() {
        let s = "ipv4=1.2.3.4&zone=a";
        assert_eq!(
            AgentIdentifiers::parse_lenient(s).map(|i| i.ipv4).ok(),
            Some(vec!["1.2.3.4".to_string()])
        );
        assert!(matches!(
            validate_identifiers(s),
            Err(IdentifierError::UnknownKey(k)) if k == "zone"
        ));
    }

    #[test]
    fn decodes_escapes_and_rejects_bad_ones() {
        let ids = AgentIdentifiers::parse_lenient("host=a%2Eb&ipv6=%3A%3A1").unwrap_or_default();
        assert_eq!(ids.host, ["a.b"]);
        assert_eq!(ids.ipv6, ["::1"]);
        // Go's url.ParseQuery texts, which upstream's server sends back.
        let text = |s| {
            AgentIdentifiers::parse_lenient(s)
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(
            text("host=%zz").as_deref(),
            Some("invalid URL escape \"%zz\"")
        );
        assert_eq!(
            text("host=a%2").as_deref(),
            Some("invalid URL escape \"%2\"")
        );
        assert_eq!(
            text("host=a;host=b").as_deref(),
            Some("invalid semicolon separator in query")
        );
        // A default-route that is not a Go bool is ignored, as upstream does.
        assert!(
            AgentIdentifiers::parse_lenient("default-route=maybe").is_ok_and(|i| !i.default_route)
        );
        assert!(
            AgentIdentifiers::parse_lenient("").is_ok_and(|i| i == AgentIdentifiers::default())
        );
    }
}
