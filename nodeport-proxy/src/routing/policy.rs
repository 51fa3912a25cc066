//! Per-Service connection policy read from annotations (beyond KKP): which
//! client addresses may reach the Service through any shared listener, and
//! whether its backends want a PROXY protocol v2 header first.
//!
//! `nodeport-proxy.k8s.io/source-ranges`: a comma- or space-separated list
//! of CIDRs or single addresses, IPv4 and IPv6, the format of
//! `service.beta.kubernetes.io/load-balancer-source-ranges`. Absent or empty:
//! every client may connect. One entry that does not parse and the Service
//! refuses every client (fail closed: a typo must not open a cluster to the
//! world) until it is fixed; the index logs why.
//!
//! `nodeport-proxy.k8s.io/upstream-proxy-protocol: v2`: the upstream
//! connection starts with a PROXY v2 header naming the real client.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::limits::{MAX_SOURCE_RANGES, MAX_SOURCE_RANGES_ANNOTATION};
use crate::routing::model::Service;

pub const SOURCE_RANGES_ANNOTATION_KEY: &str = "nodeport-proxy.k8s.io/source-ranges";
pub const UPSTREAM_PROXY_PROTOCOL_ANNOTATION_KEY: &str =
    "nodeport-proxy.k8s.io/upstream-proxy-protocol";

/// Who may connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SourceRanges {
    /// No allow-list: everyone.
    #[default]
    Any,
    /// Only addresses inside one of these.
    Only(Box<[IpNet]>),
    /// The annotation is invalid: no one, with the reason.
    Invalid(Box<str>),
}

impl SourceRanges {
    pub fn allows(&self, ip: IpAddr) -> bool {
        // A v4 client reaching a dual-stack socket shows up as ::ffff:a.b.c.d.
        let ip = ip.to_canonical();
        match self {
            SourceRanges::Any => true,
            SourceRanges::Only(nets) => nets.iter().any(|n| n.contains(&ip)),
            SourceRanges::Invalid(_) => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceRangesError {
    #[error(
        "{SOURCE_RANGES_ANNOTATION_KEY}: {0} bytes, more than the {MAX_SOURCE_RANGES_ANNOTATION} allowed"
    )]
    TooLong(usize),
    #[error("{SOURCE_RANGES_ANNOTATION_KEY}: more than {MAX_SOURCE_RANGES} ranges")]
    TooMany,
    #[error("{SOURCE_RANGES_ANNOTATION_KEY}: {0:?} is neither a CIDR nor an IP address")]
    Invalid(String),
}

/// Parses the allow-list annotation's value.
pub fn parse_source_ranges(value: &str) -> Result<SourceRanges, SourceRangesError> {
    if value.len() > MAX_SOURCE_RANGES_ANNOTATION {
        return Err(SourceRangesError::TooLong(value.len()));
    }
    let mut nets = Vec::new();
    for item in value
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .filter(|s| !s.is_empty())
    {
        if nets.len() == MAX_SOURCE_RANGES {
            return Err(SourceRangesError::TooMany);
        }
        let net = match item.parse::<IpNet>() {
            Ok(n) => n.trunc(),
            Err(_) => match item.parse::<IpAddr>() {
                Ok(ip) => IpNet::from(ip),
                Err(_) => return Err(SourceRangesError::Invalid(item.to_string())),
            },
        };
        // ::ffff:0:0/96 ranges are matched as the v4 ranges they are.
        let net = match net {
            IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
                Some(v4) => IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).unwrap_or(net),
                None => net,
            },
            other => other,
        };
        nets.push(net);
    }
    if nets.is_empty() {
        return Ok(SourceRanges::Any);
    }
    nets.sort_unstable();
    nets.dedup();
    Ok(SourceRanges::Only(nets.into()))
}

/// What a Service's annotations ask of every connection to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServicePolicy {
    pub source_ranges: SourceRanges,
    /// Send a PROXY v2 header to the upstream first.
    pub upstream_proxy_protocol: bool,
    /// Lines for the log about annotations that were not understood.
    pub problems: Vec<String>,
}

impl ServicePolicy {
    /// Whether it differs from no policy at all; most Services have none and
    /// share nothing for it.
    pub fn is_open(&self) -> bool {
        *self == ServicePolicy::default()
    }

    pub fn of(service: &Service) -> Self {
        let a = &service.metadata.annotations;
        let mut problems = Vec::new();
        let source_ranges = match a.get(SOURCE_RANGES_ANNOTATION_KEY) {
            None => SourceRanges::Any,
            Some(v) => parse_source_ranges(v).unwrap_or_else(|e| {
                let e = e.to_string();
                problems.push(format!("{e}; refusing every client until it is fixed"));
                SourceRanges::Invalid(e.into())
            }),
        };
        let upstream_proxy_protocol = match a.get(UPSTREAM_PROXY_PROTOCOL_ANNOTATION_KEY) {
            None => false,
            Some(v) if v.trim() == "v2" => true,
            Some(v) => {
                problems.push(format!(
                    "{UPSTREAM_PROXY_PROTOCOL_ANNOTATION_KEY}: {v:?} is not \"v2\"; no PROXY header is sent"
                ));
                false
            }
        };
        ServicePolicy {
            source_ranges,
            upstream_proxy_protocol,
            problems,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn ranges_of_both_families_and_single_addresses() {
        let r = parse_source_ranges(" 10.0.0.0/8, 192.168.1.7 2001:db8::/32\t::1,")
            .unwrap_or_else(|e| panic!("{e}"));
        for allowed in [
            "10.1.2.3",
            "192.168.1.7",
            "2001:db8::5",
            "::1",
            "::ffff:10.9.9.9",
        ] {
            assert!(r.allows(ip(allowed)), "{allowed}");
        }
        for denied in ["11.0.0.1", "192.168.1.8", "2001:db9::1", "::2", "127.0.0.1"] {
            assert!(!r.allows(ip(denied)), "{denied}");
        }
        // Host bits are ignored, as Kubernetes' validation would reject them.
        let r = parse_source_ranges("10.1.2.3/8").unwrap_or_else(|e| panic!("{e}"));
        assert!(r.allows(ip("10.200.0.1")));
        // A v4-mapped v6 range is its v4 range.
        let r = parse_source_ranges("::ffff:127.0.0.0/104").unwrap_or_else(|e| panic!("{e}"));
        assert!(r.allows(ip("127.0.0.1")) && !r.allows(ip("128.0.0.1")));
    }

    #[test]
    fn empty_allows_everyone_and_garbage_allows_no_one() {
        assert_eq!(parse_source_ranges(""), Ok(SourceRanges::Any));
        assert_eq!(parse_source_ranges(" , "), Ok(SourceRanges::Any));
        assert!(matches!(
            parse_source_ranges("10.0.0.0/8,10.0.0.0/33"),
            Err(SourceRangesError::Invalid(s)) if s == "10.0.0.0/33"
        ));
        let many = vec!["10.0.0.1"; MAX_SOURCE_RANGES + 1].join(",");
        assert_eq!(parse_source_ranges(&many), Err(SourceRangesError::TooMany));
        let long = "1".repeat(MAX_SOURCE_RANGES_ANNOTATION + 1);
        assert!(matches!(
            parse_source_ranges(&long),
            Err(SourceRangesError::TooLong(_))
        ));
        let mut svc = Service::default();
        svc.metadata.annotations.insert(
            SOURCE_RANGES_ANNOTATION_KEY.into(),
            "10.0.0.0/8,nope".into(),
        );
        svc.metadata
            .annotations
            .insert(UPSTREAM_PROXY_PROTOCOL_ANNOTATION_KEY.into(), "v1".into());
        let p = ServicePolicy::of(&svc);
        assert!(!p.source_ranges.allows(ip("10.0.0.1")));
        assert!(!p.upstream_proxy_protocol);
        assert_eq!(p.problems.len(), 2, "{:?}", p.problems);
        assert!(ServicePolicy::of(&Service::default()).is_open());
    }
}
