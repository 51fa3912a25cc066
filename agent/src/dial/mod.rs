//! Dialing destinations, with errors worded as Go's `net.Dial` words them:
//! servers (ours and upstream's) map the text to HTTP statuses by substring,
//! and operators grep for it.

pub mod destination;
pub(crate) mod endpoint;
pub mod policy;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::dial::policy::DestinationPolicy;
use crate::limits::MAX_DIAL_ADDRESS;

/// Upstream's fixed agent dial timeout.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// A failed dial: the Go-style text, and whether it was a timeout (the
/// `endpoint_dial_failure_total` reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DialError {
    pub text: String,
    pub timeout: bool,
    /// Refused by `--allowed-destinations`.
    pub denied: bool,
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn err(text: String, timeout: bool) -> DialError {
    DialError {
        text,
        timeout,
        denied: false,
    }
}

/// Go's wording for an errno (`syscall.Errno.Error()`), else Rust's text
/// without the "(os error N)" suffix.
pub fn errno_text(e: &io::Error) -> String {
    let known = match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => Some("connection refused"),
        Some(libc::ECONNRESET) => Some("connection reset by peer"),
        Some(libc::ENETUNREACH) => Some("network is unreachable"),
        Some(libc::EHOSTUNREACH) => Some("no route to host"),
        Some(libc::ENETDOWN) => Some("network is down"),
        Some(libc::ETIMEDOUT) => Some("connection timed out"),
        Some(libc::EMFILE) => Some("too many open files"),
        Some(libc::ENFILE) => Some("too many open files in system"),
        Some(libc::EADDRNOTAVAIL) => Some("cannot assign requested address"),
        Some(libc::EADDRINUSE) => Some("address already in use"),
        Some(libc::EACCES) => Some("permission denied"),
        Some(libc::EPERM) => Some("operation not permitted"),
        Some(libc::EAFNOSUPPORT) => Some("address family not supported by protocol"),
        Some(libc::ENOBUFS) => Some("no buffer space available"),
        _ => None,
    };
    if let Some(k) = known {
        return k.to_string();
    }
    let s = e.to_string();
    let s = s.split(" (os error").next().unwrap_or(&s);
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => s.to_string(),
    }
}

/// Splits `host:port` like Go's `net.SplitHostPort` and reads the port as
/// Go's dialer does (empty is 0). Errors are Go's texts after `dial tcp: `.
fn split_host_port(address: &str) -> Result<(&str, u16), String> {
    if address.is_empty() {
        return Err("missing address".into());
    }
    let missing = || format!("address {address}: missing port in address");
    let (host, port) = if let Some(rest) = address.strip_prefix('[') {
        let (h, p) = rest
            .split_once(']')
            .ok_or_else(|| format!("address {address}: missing ']' in address"))?;
        (h, p.strip_prefix(':').ok_or_else(missing)?)
    } else {
        let (h, p) = address.rsplit_once(':').ok_or_else(missing)?;
        if h.contains(':') {
            return Err(format!("address {address}: too many colons in address"));
        }
        (h, p)
    };
    if port.is_empty() {
        return Ok((host, 0));
    }
    // Go would look a service name up in /etc/services; we take numbers only.
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("address {port}: invalid port"))?;
    Ok((host, port))
}

/// Resolves `host`. Names under `.invalid` never resolve (RFC 6761 §6.4), so
/// no lookup leaves the machine for them.
async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let lower = host.trim_end_matches('.').to_ascii_lowercase();
    if lower == "invalid" || lower.ends_with(".invalid") {
        return Err(format!("lookup {host}: no such host"));
    }
    match tokio::net::lookup_host((host, port)).await {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            if addrs.is_empty() {
                Err(format!("lookup {host}: no such host"))
            } else {
                Ok(addrs)
            }
        }
        Err(e) => {
            let text = e.to_string();
            // getaddrinfo's messages (glibc, musl) for "the name does not exist".
            let nxdomain = [
                "Name or service not known",
                "No address associated with hostname",
                "Name does not resolve",
                "not known",
            ];
            if nxdomain.iter().any(|n| text.contains(n)) {
                Err(format!("lookup {host}: no such host"))
            } else if text.contains("Temporary failure") {
                Err(format!(
                    "lookup {host}: temporary failure in name resolution"
                ))
            } else {
                Err(format!(
                    "lookup {host}: {}",
                    text.trim_start_matches("failed to lookup address information: ")
                ))
            }
        }
    }
}

/// Dials `protocol` `address` within `timeout` (DNS included), trying each
/// resolved address in turn like Go does.
pub async fn dial(
    protocol: &str,
    address: &str,
    timeout: Duration,
    policy: &DestinationPolicy,
) -> Result<TcpStream, DialError> {
    dial_via(protocol, address, timeout, policy, |a| async move {
        let s = TcpStream::connect(a).await?;
        let _ = s.set_nodelay(true);
        Ok(s)
    })
    .await
}

/// [`dial`] with `connect` in place of TCP's: the same checks, policy,
/// deadline and wording whatever the transport.
pub(crate) async fn dial_via<S, F, Fut>(
    protocol: &str,
    address: &str,
    timeout: Duration,
    policy: &DestinationPolicy,
    connect: F,
) -> Result<S, DialError>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = io::Result<S>>,
{
    let deadline = Instant::now() + timeout;
    let addrs = allowed_addresses(protocol, address, deadline, policy).await?;
    connect_first(protocol, address, &addrs, deadline, connect).await
}

/// What a dial may try, in order: the network and address checked, the host
/// resolved before `deadline`, and what `policy` refuses taken out.
async fn allowed_addresses(
    protocol: &str,
    address: &str,
    deadline: Instant,
    policy: &DestinationPolicy,
) -> Result<Vec<SocketAddr>, DialError> {
    if !matches!(protocol, "tcp" | "tcp4" | "tcp6") {
        let protocol: String = protocol.chars().take(32).collect();
        // Go's OpError: "dial" and the network, if any, then the cause.
        let op = if protocol.is_empty() {
            "dial".to_string()
        } else {
            format!("dial {protocol}")
        };
        return Err(err(format!("{op}: unknown network {protocol}"), false));
    }
    if address.len() > MAX_DIAL_ADDRESS {
        return Err(err(
            format!(
                "dial {protocol}: address of {} bytes is too long",
                address.len()
            ),
            false,
        ));
    }
    let (host, port) =
        split_host_port(address).map_err(|e| err(format!("dial {protocol}: {e}"), false))?;
    let addrs = match tokio::time::timeout_at(deadline, resolve(host, port)).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return Err(err(format!("dial {protocol}: {e}"), false)),
        Err(_) => {
            return Err(err(
                format!("dial {protocol}: lookup {host}: i/o timeout"),
                true,
            ));
        }
    };
    let addrs: Vec<_> = addrs
        .into_iter()
        .filter(|a| match protocol {
            "tcp4" => a.is_ipv4(),
            "tcp6" => a.is_ipv6(),
            _ => true,
        })
        .collect();
    let (addrs, denied): (Vec<_>, Vec<_>) = addrs.into_iter().partition(|a| policy.allows(*a));
    if let (true, Some(addr)) = (addrs.is_empty(), denied.first()) {
        return Err(DialError {
            text: format!(
                "dial {protocol} {addr}: destination not allowed by the agent's --allowed-destinations"
            ),
            timeout: false,
            denied: true,
        });
    }
    Ok(addrs)
}

/// Tries `connect` on each address until one answers or `deadline` passes;
/// a failure is worded after the first address that failed, as Go does.
async fn connect_first<S, F, Fut>(
    protocol: &str,
    address: &str,
    addrs: &[SocketAddr],
    deadline: Instant,
    connect: F,
) -> Result<S, DialError>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = io::Result<S>>,
{
    let mut first: Option<DialError> = None;
    for addr in addrs {
        match tokio::time::timeout_at(deadline, connect(*addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => {
                first.get_or_insert_with(|| {
                    err(
                        format!("dial {protocol} {addr}: connect: {}", errno_text(&e)),
                        false,
                    )
                });
            }
            Err(_) => {
                return Err(first
                    .unwrap_or_else(|| err(format!("dial {protocol} {addr}: i/o timeout"), true)));
            }
        }
    }
    Err(first.unwrap_or_else(|| {
        err(
            format!("dial {protocol}: no suitable address found for {address}"),
            false,
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_destination_outside_the_policy_is_refused_before_connecting() {
        // The listener would accept: only the policy stops the dial.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let policy = DestinationPolicy::parse("127.0.0.1/32:1-1024").unwrap_or_default();
        let e = dial("tcp", &addr.to_string(), DIAL_TIMEOUT, &policy)
            .await
            .err();
        assert_eq!(
            e,
            Some(DialError {
                text: format!(
                    "dial tcp {addr}: destination not allowed by the agent's --allowed-destinations"
                ),
                timeout: false,
                denied: true,
            })
        );
        let open =
            DestinationPolicy::parse(&format!("127.0.0.1/32:{}", addr.port())).unwrap_or_default();
        assert!(
            dial("tcp", &addr.to_string(), DIAL_TIMEOUT, &open)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn an_overlong_address_is_refused_without_a_lookup_or_an_echo() {
        let long = format!("{}.invalid:80", "a".repeat(4 << 20));
        let e = dial("tcp", &long, DIAL_TIMEOUT, &DestinationPolicy::default())
            .await
            .err();
        let text = e.map(|e| e.text).unwrap_or_default();
        assert!(
            text.ends_with("is too long"),
            "{}",
            &text[..text.len().min(200)]
        );
        assert!(text.len() < 100);
        let e = dial(
            &"x".repeat(1000),
            &long,
            DIAL_TIMEOUT,
            &DestinationPolicy::default(),
        )
        .await
        .err();
        let text = e.map(|e| e.text).unwrap_or_default();
        assert!(text.len() < 2 * MAX_DIAL_ADDRESS, "{} bytes", text.len());
    }

    #[tokio::test]
    async fn refused_reads_like_go() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        drop(l);
        let e = dial(
            "tcp",
            &addr.to_string(),
            DIAL_TIMEOUT,
            &DestinationPolicy::default(),
        )
        .await
        .err();
        assert_eq!(
            e,
            Some(DialError {
                denied: false,
                text: format!("dial tcp {addr}: connect: connection refused"),
                timeout: false
            })
        );
    }

    #[tokio::test]
    async fn invalid_names_never_resolve() {
        let e = dial(
            "tcp",
            "nothing.invalid:80",
            DIAL_TIMEOUT,
            &DestinationPolicy::default(),
        )
        .await
        .err();
        assert_eq!(
            e.map(|e| e.text),
            Some("dial tcp: lookup nothing.invalid: no such host".into())
        );
    }

    #[tokio::test]
    async fn bad_addresses_are_reported() {
        let e = dial(
            "tcp",
            "no-port",
            DIAL_TIMEOUT,
            &DestinationPolicy::default(),
        )
        .await
        .err()
        .map(|e| e.text);
        assert_eq!(
            e.as_deref(),
            Some("dial tcp: address no-port: missing port in address")
        );
        let e = dial(
            "udp",
            "127.0.0.1:1",
            DIAL_TIMEOUT,
            &DestinationPolicy::default(),
        )
        .await
        .err()
        .map(|e| e.text);
        assert_eq!(e.as_deref(), Some("dial udp: unknown network udp"));
    }

    #[test]
    fn splits_like_go() {
        // Texts as Go 1.26's net.Dial("tcp", …) prints them after "dial tcp: ".
        assert_eq!(split_host_port("[::1]:80"), Ok(("::1", 80)));
        assert_eq!(split_host_port("a:1"), Ok(("a", 1)));
        assert_eq!(split_host_port("a:"), Ok(("a", 0)));
        let e = |a| split_host_port(a).err().unwrap_or_default();
        assert_eq!(e("127.0.0.1"), "address 127.0.0.1: missing port in address");
        assert_eq!(e("[::1]"), "address [::1]: missing port in address");
        assert_eq!(e("a:99999"), "address 99999: invalid port");
        assert_eq!(e("a:-1"), "address -1: invalid port");
        assert_eq!(e("::1:80"), "address ::1:80: too many colons in address");
        assert_eq!(e("[::1:80"), "address [::1:80: missing ']' in address");
        assert_eq!(e(""), "missing address");
    }
}
