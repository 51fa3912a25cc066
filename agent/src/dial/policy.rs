//! Which destinations the agent dials for its servers
//! (`--allowed-destinations`): upstream's agent dials whatever a server asks
//! for, so one compromised control plane reaches every address the user
//! cluster can. Names are resolved first and each address is checked, so a
//! DNS answer cannot lead around the list.

use std::net::SocketAddr;
use std::ops::RangeInclusive;

use ipnet::IpNet;

/// One allowed CIDR with its ports (all ports when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    net: IpNet,
    ports: Option<RangeInclusive<u16>>,
}

/// The allowed destinations; empty allows every destination (upstream's
/// behaviour, the default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationPolicy {
    rules: Vec<Rule>,
}

impl DestinationPolicy {
    /// Parses a comma-separated list of `CIDR`, `CIDR:PORT` or
    /// `CIDR:FIRST-LAST`; an IPv6 CIDR with ports is bracketed:
    /// `[fd00::/8]:443`. A bare address is a /32 or /128.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut rules = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            rules.push(parse_rule(item).map_err(|why| format!("{item:?}: {why}"))?);
        }
        Ok(DestinationPolicy { rules })
    }

    pub fn allows_all(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn allows(&self, addr: SocketAddr) -> bool {
        self.allows_all()
            || self.rules.iter().any(|r| {
                r.net.contains(&addr.ip())
                    && r.ports.as_ref().is_none_or(|p| p.contains(&addr.port()))
            })
    }
}

fn parse_rule(item: &str) -> Result<Rule, String> {
    let (net, ports) = if let Some(rest) = item.strip_prefix('[') {
        let (net, after) = rest.split_once(']').ok_or("missing ']'")?;
        let ports = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("expected ':' after ']'")?),
        };
        (net, ports)
    } else {
        match item.matches(':').count() {
            0 => (item, None),
            1 => {
                let (n, p) = item.split_once(':').ok_or("bad port")?;
                (n, Some(p))
            }
            // An IPv6 CIDR without ports.
            _ => (item, None),
        }
    };
    let net = match net.parse::<IpNet>() {
        Ok(n) => n.trunc(),
        Err(_) => IpNet::from(
            net.parse::<std::net::IpAddr>()
                .map_err(|_| "not a CIDR or an IP address".to_string())?,
        ),
    };
    let ports = ports.map(parse_ports).transpose()?;
    Ok(Rule { net, ports })
}

fn parse_ports(p: &str) -> Result<RangeInclusive<u16>, String> {
    let port = |s: &str| {
        s.parse::<u16>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{s:?} is not a port"))
    };
    match p.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (port(a)?, port(b)?);
            if a > b {
                return Err(format!("port range {a}-{b} is empty"));
            }
            Ok(a..=b)
        }
        None => {
            let n = port(p)?;
            Ok(n..=n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn cidrs_with_and_without_ports() {
        let p = DestinationPolicy::parse(
            "10.0.0.0/16:10250, 10.244.0.0/16,10.96.0.0/12:8000-8999,[fd00:10::/64]:443,fd00:20::/64,192.0.2.7",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(p.allows(a("10.0.3.4:10250")));
        assert!(!p.allows(a("10.0.3.4:22")), "node CIDR: kubelet port only");
        assert!(p.allows(a("10.244.9.9:22")), "pod CIDR: any port");
        assert!(p.allows(a("10.100.0.1:8080")));
        assert!(!p.allows(a("10.100.0.1:9000")));
        assert!(p.allows(a("[fd00:10::5]:443")));
        assert!(!p.allows(a("[fd00:10::5]:444")));
        assert!(p.allows(a("[fd00:20::5]:1")));
        assert!(p.allows(a("192.0.2.7:80")));
        assert!(!p.allows(a("192.0.2.8:80")));
        assert!(
            !p.allows(a("169.254.169.254:80")),
            "cloud metadata stays out"
        );
        assert!(!p.allows(a("127.0.0.1:10250")));
    }

    #[test]
    fn empty_allows_everything_and_bad_entries_say_why() {
        assert!(
            DestinationPolicy::parse("")
                .unwrap_or_default()
                .allows(a("203.0.113.1:1"))
        );
        for (bad, why) in [
            ("10.0.0.0/33", "not a CIDR"),
            ("10.0.0.0/8:0", "not a port"),
            ("10.0.0.0/8:99999", "not a port"),
            ("10.0.0.0/8:20-10", "empty"),
            ("[fd00::/8:443", "missing ']'"),
            ("nodes", "not a CIDR"),
        ] {
            let e = DestinationPolicy::parse(bad).err().unwrap_or_default();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
    }
}
