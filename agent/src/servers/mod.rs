//! Where the proxy servers are: one `--proxy-server-host` (upstream: a load
//! balancer in front of the servers), a comma-separated list of them, and,
//! with `--resolve-proxy-server-host`, every address each name resolves to,
//! re-resolved periodically. Each resulting endpoint gets its own stream, so
//! HA servers need no load balancer in front of them (ANP #394). How many
//! streams the agent wants is still the server count's (or the Leases')
//! business, in [`crate::clientset`].

pub mod label_selector;
pub(crate) mod lease_calls;
pub mod leases;

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Our default for `--proxy-server-resolve-interval`.
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(30);

/// Most endpoints kept from one resolution (a name with more addresses
/// than this is cut, with a warning).
pub const MAX_ENDPOINTS: usize = 64;

/// Turns a host name and port into addresses (the system resolver unless a
/// test installs another).
pub type Resolver = Arc<
    dyn Fn(String, u16) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>
        + Send
        + Sync,
>;

/// The system resolver (`getaddrinfo`: /etc/hosts, then DNS).
pub fn system_resolver() -> Resolver {
    Arc::new(|host, port| {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    })
}

/// The servers named by the flags.
#[derive(Clone, Default)]
pub struct Servers {
    /// `host`, `port` pairs; empty: the connector's own host and port only.
    pub hosts: Vec<(String, u16)>,
    /// Resolve every name to all its addresses, this often.
    pub resolve_every: Option<Duration>,
    /// `None`: [`system_resolver`].
    pub resolver: Option<Resolver>,
}

impl fmt::Debug for Servers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Servers")
            .field("hosts", &self.hosts)
            .field("resolve_every", &self.resolve_every)
            .finish()
    }
}

/// One place to hold a stream to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The name given (also the TLS server name).
    pub host: String,
    pub port: u16,
    /// Connect here rather than resolving `host` at each attempt.
    pub addr: Option<SocketAddr>,
}

impl Endpoint {
    /// Identifies the endpoint among the others.
    pub fn key(&self) -> String {
        match self.addr {
            Some(a) => a.to_string(),
            None => join(&self.host, self.port),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            Some(a) if a.ip().to_string() != self.host => {
                write!(f, "{} ({a})", join(&self.host, self.port))
            }
            _ => f.write_str(&join(&self.host, self.port)),
        }
    }
}

fn join(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `--proxy-server-host`: comma-separated `host`, `host:port`, `[v6]:port`
/// or a bare IPv6 address; entries without a port take `default_port`.
pub fn parse_hosts(value: &str, default_port: u16) -> Result<Vec<(String, u16)>, String> {
    let mut out = Vec::new();
    for entry in value.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(format!("--proxy-server-host {value:?} has an empty entry"));
        }
        let bad = |why: &str| format!("--proxy-server-host entry {entry:?}: {why}");
        let (host, port) = if entry.parse::<IpAddr>().is_ok() {
            (entry.to_string(), default_port)
        } else if let Some(rest) = entry.strip_prefix('[') {
            let (h, p) = rest
                .split_once("]:")
                .ok_or_else(|| bad("write an IPv6 address with a port as [address]:port"))?;
            h.parse::<std::net::Ipv6Addr>()
                .map_err(|_| bad("not an IPv6 address in brackets"))?;
            (h.to_string(), p.parse().map_err(|_| bad("invalid port"))?)
        } else if let Some((h, p)) = entry.rsplit_once(':') {
            (h.to_string(), p.parse().map_err(|_| bad("invalid port"))?)
        } else {
            (entry.to_string(), default_port)
        };
        if host.is_empty() || port == 0 {
            return Err(bad("needs a host and a port from 1 to 65535"));
        }
        if !out.contains(&(host.clone(), port)) {
            out.push((host, port));
        }
    }
    if out.len() > MAX_ENDPOINTS {
        return Err(format!(
            "--proxy-server-host names {} servers; at most {MAX_ENDPOINTS}",
            out.len()
        ));
    }
    Ok(out)
}

/// The endpoints now; a task keeps them current when names are resolved.
pub fn follow(
    servers: &Servers,
    default: (String, u16),
    drain: &daemon::drain::Drain,
) -> watch::Receiver<Vec<Endpoint>> {
    let hosts = if servers.hosts.is_empty() {
        vec![default]
    } else {
        servers.hosts.clone()
    };
    let plain: Vec<Endpoint> = hosts
        .iter()
        .map(|(host, port)| Endpoint {
            host: host.clone(),
            port: *port,
            addr: None,
        })
        .collect();
    let Some(every) = servers.resolve_every else {
        return watch::channel(plain).1;
    };
    let (tx, rx) = watch::channel(plain);
    let resolver = servers.resolver.clone().unwrap_or_else(system_resolver);
    let d = drain.clone();
    drain.spawn(async move {
        loop {
            let current = tx.borrow().clone();
            let next = resolve_all(&hosts, &resolver, &current).await;
            tx.send_if_modified(|eps| {
                if *eps == next {
                    return false;
                }
                tracing::info!(servers = %list(&next), "proxy server addresses resolved");
                *eps = next;
                true
            });
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = d.draining() => return,
            }
        }
    });
    rx
}

fn list(eps: &[Endpoint]) -> String {
    eps.iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every address of every host. A name that does not resolve keeps the
/// addresses it had (or, never resolved, is tried by name).
async fn resolve_all(
    hosts: &[(String, u16)],
    resolver: &Resolver,
    current: &[Endpoint],
) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = Vec::new();
    for (host, port) in hosts {
        let of_host = |e: &&Endpoint| e.host == *host && e.port == *port;
        let found = match host.parse::<IpAddr>() {
            Ok(ip) => Ok(vec![SocketAddr::new(ip, *port)]),
            Err(_) => tokio::time::timeout(Duration::from_secs(10), resolver(host.clone(), *port))
                .await
                .unwrap_or_else(|_| Err(io::Error::other("timed out after 10s"))),
        };
        match found {
            Ok(addrs) if !addrs.is_empty() => {
                for a in addrs {
                    let e = Endpoint {
                        host: host.clone(),
                        port: *port,
                        addr: Some(a),
                    };
                    if !out.contains(&e) {
                        out.push(e);
                    }
                }
            }
            other => {
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(_) => "no addresses".into(),
                };
                tracing::warn!(host = %host, error = %why, "cannot resolve --proxy-server-host; keeping its last addresses");
                let kept: Vec<Endpoint> = current.iter().filter(of_host).cloned().collect();
                if kept.is_empty() {
                    out.push(Endpoint {
                        host: host.clone(),
                        port: *port,
                        addr: None,
                    });
                } else {
                    out.extend(kept);
                }
            }
        }
    }
    if out.len() > MAX_ENDPOINTS {
        tracing::warn!(
            count = out.len(),
            kept = MAX_ENDPOINTS,
            "more proxy server addresses than the agent holds streams to; the rest are ignored"
        );
        out.truncate(MAX_ENDPOINTS);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_lists() {
        let p = |v| parse_hosts(v, 8091);
        assert_eq!(p("a.example"), Ok(vec![("a.example".into(), 8091)]));
        assert_eq!(
            p("127.0.0.1, 127.0.0.2:9000,[::1]:9001,::1,b:1"),
            Ok(vec![
                ("127.0.0.1".into(), 8091),
                ("127.0.0.2".into(), 9000),
                ("::1".into(), 9001),
                ("::1".into(), 8091),
                ("b".into(), 1)
            ])
        );
        assert!(p("a,,b").is_err());
        assert!(p("a:x").is_err());
        assert!(p("a:0").is_err());
        assert!(p("[::1]").is_err());
        assert!(p(":80").is_err());
        let many = (0..=MAX_ENDPOINTS)
            .map(|i| format!("h{i}"))
            .collect::<Vec<_>>();
        assert!(p(&many.join(",")).is_err());
    }

    #[tokio::test]
    async fn a_name_that_stops_resolving_keeps_its_addresses() {
        let answers = Arc::new(parking_lot::Mutex::new(Some(vec![
            SocketAddr::from(([127, 0, 0, 2], 1)),
            SocketAddr::from(([127, 0, 0, 3], 1)),
        ])));
        let a = answers.clone();
        let resolver: Resolver = Arc::new(move |_, _| {
            let r = a.lock().clone();
            Box::pin(async move { r.ok_or_else(|| io::Error::other("SERVFAIL")) })
        });
        let hosts = vec![
            ("servers.test".to_string(), 1),
            ("127.0.0.9".to_string(), 1),
        ];
        let first = resolve_all(&hosts, &resolver, &[]).await;
        let keys: Vec<String> = first.iter().map(Endpoint::key).collect();
        assert_eq!(keys, ["127.0.0.2:1", "127.0.0.3:1", "127.0.0.9:1"]);
        *answers.lock() = None;
        assert_eq!(resolve_all(&hosts, &resolver, &first).await, first);
        // Never resolved: tried by name.
        let by_name = resolve_all(&hosts, &resolver, &[]).await;
        assert_eq!(by_name[0].key(), "servers.test:1");
        assert_eq!(by_name[0].addr, None);
    }
}
