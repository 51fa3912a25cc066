//! What the agent tunnels where, and how: from the Envoy bootstrap KKP
//! renders (`bootstrap.rs`) and from flags (`cli.rs`).

use std::net::IpAddr;
use std::time::Duration;

use daemon::authority::ConnectAuthority;

/// KKP's default tunneling agent IP (`DefaultTunnelingAgentIP`).
pub const DEFAULT_AGENT_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(100, 64, 30, 10));
/// KKP's kube-apiserver secure port under the Tunneling strategy.
pub const DEFAULT_KAS_PORT: u16 = 6443;

/// One local listener and the authority its connections are tunneled to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    pub bind_address: IpAddr,
    pub bind_port: u16,
    pub authority: ConnectAuthority,
}

impl ListenerSpec {
    /// KKP's default listener for a user cluster:
    /// `100.64.30.10:6443` → `apiserver-external.cluster-<id>.svc.cluster.local:443`.
    pub fn kkp_default(cluster_id: &str) -> Result<Self, ConfigError> {
        let authority = ConnectAuthority::new(
            &format!("apiserver-external.cluster-{cluster_id}.svc.cluster.local"),
            443,
        )
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        Ok(ListenerSpec {
            bind_address: DEFAULT_AGENT_IP,
            bind_port: DEFAULT_KAS_PORT,
            authority,
        })
    }

    /// Parses `address:port=authority`, e.g.
    /// `100.64.30.10:6443=apiserver-external.cluster-x.svc.cluster.local:443`.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let bad = |why: &str| ConfigError::Invalid(format!("listener {s:?}: {why}"));
        let (bind, authority) = s
            .split_once('=')
            .ok_or_else(|| bad("expected address:port=authority"))?;
        let bind: std::net::SocketAddr = bind.parse().map_err(|_| bad("bad bind address:port"))?;
        let authority = ConnectAuthority::parse(authority).map_err(|e| bad(&e.to_string()))?;
        Ok(ListenerSpec {
            bind_address: bind.ip(),
            bind_port: bind.port(),
            authority,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// The seed's nodeport-proxy tunneling endpoint; resolved again on every
    /// reconnect.
    pub proxy_host: String,
    pub proxy_port: u16,
    pub listeners: Vec<ListenerSpec>,
    /// HTTP/2 PING interval on the shared connection (KKP PR #15062: 30 s).
    pub keepalive_interval: Duration,
    /// A PING unanswered this long marks the connection dead (5 s).
    pub keepalive_timeout: Duration,
    /// TCP connect + HTTP/2 handshake to the proxy; also how long an accepted
    /// connection waits for the shared connection and its CONNECT answer.
    pub connect_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Tunnels idle this long are closed.
    pub idle_timeout: Duration,
    pub max_connections_per_listener: usize,
    /// Each direction of each tunnel has one buffer of this size.
    pub buffer_size: usize,
    /// How long open tunnels may continue after shutdown begins.
    pub drain_timeout: Duration,
    /// A forward proxy the seed connection goes through (`-http-proxy`,
    /// `HTTPS_PROXY`); `None`: direct.
    pub http_proxy: Option<daemon::egress_proxy::HttpProxy>,
    /// How the seed connection's HTTP/2 windows grow with the link
    /// (`link::h2window`) and what they may hold.
    pub windows: link::h2window::WindowSettings,
    /// Most connections to the seed that take new streams: another is
    /// dialled only while every one is full (Envoy's circuit breaker
    /// `max_connections`, 1,024 by default; ours is smaller, see
    /// [`DEFAULT_MAX_SEED_CONNECTIONS`]).
    pub max_seed_connections: usize,
    /// Most streams opened on one connection, whatever the seed allows
    /// (Envoy's `http2_protocol_options.max_concurrent_streams`).
    pub max_streams_per_connection: usize,
    /// Streams one connection carries in all before it is retired (Envoy's
    /// `common_http_protocol_options.max_requests_per_connection`); 0:
    /// unlimited, Envoy's default.
    pub max_requests_per_connection: u64,
    /// A connection beyond the first that carried no tunnel this long is
    /// closed (Envoy's `common_http_protocol_options.idle_timeout`, 1 h).
    pub pool_idle_timeout: Duration,
}

/// Seed connections the pool may hold. Sixteen carry 16,384 tunnels at
/// nodeport-proxy's 1,024 streams per connection: four listeners at
/// `-max-connections-per-listener` (KKP renders two). Envoy's default
/// (`max_connections`: 1,024) would let a seed that refuses every stream
/// make the agent open a thousand connections to it.
pub const DEFAULT_MAX_SEED_CONNECTIONS: usize = 16;

/// Envoy's default `max_concurrent_streams` for HTTP/2 (2^31 - 1).
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: usize = (1 << 31) - 1;

/// Windows start as before (256 KiB per stream, 1 MiB per connection) and
/// grow as the link needs: a 16 MiB stream window carries 160 MB/s over a
/// 100 ms round trip. What the seed may send us ahead of our readers is
/// 64 MiB per connection (a replaced connection finishing its tunnels may
/// hold as much again).
pub const DEFAULT_WINDOWS: link::h2window::WindowSettings = link::h2window::WindowSettings {
    initial: 256 << 10,
    max: 16 << 20,
    connection_budget: 64 << 20,
    idle: Duration::from_secs(5),
    single_stream: false,
};

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            proxy_host: String::new(),
            proxy_port: 8088,
            listeners: Vec::new(),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(3600),
            max_connections_per_listener: 4096,
            buffer_size: 16 * 1024,
            drain_timeout: Duration::from_secs(30),
            http_proxy: None,
            windows: DEFAULT_WINDOWS,
            max_seed_connections: DEFAULT_MAX_SEED_CONNECTIONS,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            max_requests_per_connection: 0,
            pool_idle_timeout: Duration::from_secs(3600),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl AgentConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.proxy_host.is_empty() {
            return Err(ConfigError::Invalid("the proxy host is required".into()));
        }
        if self.proxy_port == 0 {
            return Err(ConfigError::Invalid("the proxy port must not be 0".into()));
        }
        if self.listeners.is_empty() {
            return Err(ConfigError::Invalid(
                "at least one listener is required".into(),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for l in &self.listeners {
            if !seen.insert((l.bind_address, l.bind_port)) {
                return Err(ConfigError::Invalid(format!(
                    "two listeners on {}",
                    std::net::SocketAddr::new(l.bind_address, l.bind_port)
                )));
            }
        }
        if let Some(p) = self.http_proxy.as_ref().filter(|p| p.tls)
            && let Err(e) = daemon::tls::load_roots(&p.ca)
        {
            return Err(ConfigError::Invalid(format!(
                "-http-proxy {p} is spoken to over TLS, but its CA bundle cannot be used (-http-proxy-ca): {e}"
            )));
        }
        // Envoy's rules for the values it shares with the bootstrap
        // (crate::envoy_rules), whichever set them: file or flag.
        let rule = |what: &str, r: Result<(), String>| {
            r.map_err(|e| ConfigError::Invalid(format!("{what}: {e}")))
        };
        use crate::envoy_rules::{check_envoy_bound, check_keepalive, check_positive};
        rule(
            "keepalive interval (-keepalive-interval or the bootstrap's connection_keepalive.interval)",
            check_keepalive(self.keepalive_interval),
        )?;
        rule(
            "keepalive timeout (-keepalive-timeout or the bootstrap's connection_keepalive.timeout)",
            check_keepalive(self.keepalive_timeout),
        )?;
        rule(
            "connect timeout (-connect-timeout or the bootstrap's connect_timeout)",
            check_positive(self.connect_timeout),
        )?;
        for (what, d) in [
            ("keepalive interval", self.keepalive_interval),
            ("keepalive timeout", self.keepalive_timeout),
            ("connect timeout", self.connect_timeout),
            ("-idle-timeout", self.idle_timeout),
            ("-drain-timeout", self.drain_timeout),
            ("back-off", self.backoff_max),
            ("seed connection idle timeout", self.pool_idle_timeout),
        ] {
            rule(what, check_envoy_bound(d))?;
        }
        if self.max_seed_connections == 0 || self.max_streams_per_connection == 0 {
            return Err(ConfigError::Invalid(
                "-max-seed-connections and the streams per seed connection must be at least 1"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kkp_default_listener() {
        let l = ListenerSpec::kkp_default("abc").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.bind_address.to_string(), "100.64.30.10");
        assert_eq!(l.bind_port, 6443);
        assert_eq!(
            l.authority.to_string(),
            "apiserver-external.cluster-abc.svc.cluster.local:443"
        );
    }

    #[test]
    fn listener_flag_form() {
        let l =
            ListenerSpec::parse("127.0.0.1:1194=openvpn-server.cluster-x.svc.cluster.local:1194")
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.bind_port, 1194);
        for bad in ["127.0.0.1:1194", "nowhere:1=a:1", "127.0.0.1:1=noport"] {
            assert!(ListenerSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
