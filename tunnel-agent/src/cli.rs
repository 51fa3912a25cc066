//! Command line: envoy-agent's (`--config-path /etc/envoy/envoy.yaml
//! --use-dynamic-base-id`, the Envoy bootstrap KKP renders), and this agent's
//! own flags, which can give the same settings or override the file's.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use go_compat::flags::{FlagSet, Given, KkpLogging, Values};

use crate::bootstrap::Bootstrap;
use crate::config::{AgentConfig, DEFAULT_AGENT_IP, ListenerSpec};

/// The stats port KKP reserves (envoy-agent's `StatsPort`).
pub const DEFAULT_STATS_PORT: u16 = 8002;
/// Envoy's admin port in KKP's envoy-agent bootstrap (on 127.0.0.1).
pub const DEFAULT_ADMIN_PORT: u16 = 9902;

#[derive(Debug, Clone)]
pub struct Cli {
    pub config: AgentConfig,
    /// Where `/healthz`, `/ready` and the stats are served; `None`: nowhere.
    pub stats: Option<SocketAddr>,
    /// Where `/debug/connections` is served (the bootstrap's admin address,
    /// KKP: 127.0.0.1:9902); `None`: nowhere.
    pub admin: Option<SocketAddr>,
    pub worker_threads: usize,
    /// The bootstrap file, followed for changes.
    pub config_path: Option<PathBuf>,
    /// What that file held when it was read, so a follower knows it.
    pub config_bytes: Vec<u8>,
    /// The flags, to lay over the file again when it changes.
    pub flags: FlagSettings,
    /// What the bootstrap (when one was read) sets that the agent ignores,
    /// to report once it runs.
    pub notes: Option<crate::bootstrap::Notes>,
    /// Envoy's `--mode validate`: check the configuration and exit.
    pub validate_only: bool,
    /// The bootstrap declares nothing and no flag names a listener: serve
    /// nothing, wait for termination. This is the `envoy` container of KKP's
    /// nodeport-proxy pod, whose traffic nodeport-proxy serves from the
    /// envoy-manager container beside it.
    pub idle: bool,
}

/// What the command line sets, laid over the bootstrap at start and on every
/// reload: a flag given explicitly wins over the file. The default is no
/// flag given.
#[derive(Debug, Clone)]
pub struct FlagSettings {
    proxy_host: Option<String>,
    proxy_port: Option<u16>,
    listeners: Vec<ListenerSpec>,
    /// The KKP default listener, used when nothing else names one.
    default_listener: Option<ListenerSpec>,
    stats_address: Option<IpAddr>,
    stats_port: Option<u16>,
    keepalive_interval: Option<Duration>,
    keepalive_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    /// `-idle-timeout` when given; else the bootstrap's tcp_proxy
    /// `idle_timeout`, else Envoy's 1 h.
    idle_timeout: Option<Duration>,
    drain_timeout: Duration,
    max_connections_per_listener: usize,
    max_seed_connections: usize,
    /// `-http-proxy`: a URL, `direct`, or empty (the environment decides).
    http_proxy: String,
    http_proxy_ca: Option<PathBuf>,
    /// `HTTPS_PROXY`/`https_proxy` and `NO_PROXY`/`no_proxy` as they were at
    /// start.
    proxy_env: Vec<(&'static str, String)>,
    windows: link::h2window::WindowSettings,
    /// Envoy's `--allow-unknown-static-fields`.
    allow_unknown_fields: bool,
}

/// The proxy variables read (in this order of preference).
const PROXY_ENV: [&str; 4] = ["HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"];

impl Default for FlagSettings {
    fn default() -> Self {
        let d = AgentConfig::default();
        FlagSettings {
            proxy_host: None,
            proxy_port: None,
            listeners: Vec::new(),
            default_listener: None,
            stats_address: None,
            stats_port: None,
            keepalive_interval: None,
            keepalive_timeout: None,
            connect_timeout: None,
            idle_timeout: None,
            drain_timeout: d.drain_timeout,
            max_connections_per_listener: d.max_connections_per_listener,
            max_seed_connections: d.max_seed_connections,
            http_proxy: String::new(),
            http_proxy_ca: None,
            proxy_env: Vec::new(),
            windows: d.windows,
            allow_unknown_fields: false,
        }
    }
}

/// `-max-stream-window` and `-connection-budget`.
fn windows(f: &Flags) -> Result<link::h2window::WindowSettings, String> {
    let d = crate::config::DEFAULT_WINDOWS;
    let max = f.max_stream_window;
    if max < i64::from(d.initial) || max >= 1 << 31 {
        return Err(format!(
            "-max-stream-window must be between {} and {} bytes, got {max}",
            d.initial,
            (1u32 << 31) - 1
        ));
    }
    let budget = f.connection_budget;
    if budget < i64::from(d.initial_connection()) {
        return Err(format!(
            "-connection-budget must be at least {} bytes, got {budget}",
            d.initial_connection()
        ));
    }
    Ok(link::h2window::WindowSettings {
        max: u32::try_from(max).unwrap_or(d.max),
        connection_budget: budget,
        ..d
    })
}

go_compat::typed_flags! {
    /// tunnel-agent's flags (Envoy's and ours), in `--help` order.
    pub struct Flags = (FlagSet::new(
        "tunnel-agent",
        "Tunnels local TCP listeners to the seed nodeport-proxy as HTTP/2 CONNECT streams over one connection.",
        )
        .compatible_with("KKP envoy-agent (Envoy with the bootstrap KKP renders)")) {
        #[flag("config-path", "", "Envoy v3 bootstrap YAML as KKP's envoy-agent ConfigMap holds it (/etc/envoy/envoy.yaml); followed for changes", short('c'))]
        config_path: String,
        #[flag("config", "", "same as --config-path", deprecated("use --config-path"))]
        config: String,
        #[flag("use-dynamic-base-id", false, "accepted for Envoy compatibility; no shared memory is used")]
        use_dynamic_base_id: bool,
        #[flag("base-id", 0, "accepted for Envoy compatibility; no shared memory is used")]
        base_id: i64,
        #[flag("mode", "serve", "Envoy's: serve, or validate (check the configuration, print whether it is OK, exit 0 or 1)")]
        mode: String,
        #[flag("allow-unknown-static-fields", false, "Envoy's: a bootstrap field Envoy's schema does not know is logged and counted (envoy_server_static_unknown_fields) instead of refusing the file")]
        allow_unknown_static_fields: bool,
        #[flag("service-cluster", "", "accepted for Envoy compatibility (KKP's nodeport-proxy pod passes it); unused")]
        service_cluster: String,
        #[flag("service-node", "", "accepted for Envoy compatibility (KKP's nodeport-proxy pod passes it); unused")]
        service_node: String,
        #[flag("proxy-host", "", "seed proxy host (KKP: the cluster URL's host); overrides the bootstrap's cluster")]
        proxy_host: String,
        #[flag("proxy-port", i64::from(defaults().proxy_port), "seed proxy tunneling port; overrides the bootstrap's cluster")]
        proxy_port: Given<i64>,
        #[flag("listener", Vec::new(), "address:port=authority; repeatable; added to the bootstrap's listeners")]
        listener: Vec<String>,
        #[flag("cluster-id", "", "without listeners: tunnel <tunneling-agent-ip>:6443 to apiserver-external.cluster-<id>.svc.cluster.local:443")]
        cluster_id: String,
        #[flag("tunneling-agent-ip", &DEFAULT_AGENT_IP.to_string(), "bind address of the default listener")]
        tunneling_agent_ip: String,
        #[flag("stats-address", "::", "address of the health and stats listener (::, the default: every interface, IPv4 and IPv6); overrides the bootstrap's")]
        stats_address: Given<String>,
        #[flag("stats-port", i64::from(DEFAULT_STATS_PORT), "port of /healthz, /ready and /stats/prometheus (0: off); overrides the bootstrap's")]
        stats_port: Given<i64>,
        #[flag("keepalive-interval", defaults().keepalive_interval, "HTTP/2 PING interval on the seed connection; overrides the bootstrap's connection_keepalive")]
        keepalive_interval: Given<Duration>,
        #[flag("keepalive-timeout", defaults().keepalive_timeout, "an unanswered PING after this drops the seed connection")]
        keepalive_timeout: Given<Duration>,
        #[flag("connect-timeout", defaults().connect_timeout, "seed connect and CONNECT answer timeout; overrides the bootstrap's connect_timeout")]
        connect_timeout: Given<Duration>,
        #[flag("idle-timeout", defaults().idle_timeout, "close tunnels idle this long (0: never); overrides the bootstrap's tcp_proxy idle_timeout (Envoy's default: 1h)")]
        idle_timeout: Given<Duration>,
        #[flag("drain-timeout", defaults().drain_timeout, "how long tunnels may continue after SIGTERM")]
        drain_timeout: Duration,
        #[flag("max-connections-per-listener", defaults().max_connections_per_listener as i64, "open connections per listener")]
        max_connections_per_listener: i64,
        #[flag("max-seed-connections", defaults().max_seed_connections as i64, "ours: most HTTP/2 connections to the seed proxy that take new tunnels; another is opened only while every one is full of streams or refuses them (Envoy: circuit breaker max_connections, 1024)")]
        max_seed_connections: i64,
        #[flag("admin-address", "", "address:port of the admin listener serving /debug/connections (empty: the bootstrap's admin address, else 127.0.0.1:9902; none: off)")]
        admin_address: String,
        #[flag("http-proxy", "", "reach the seed through this HTTP CONNECT proxy: http://[user:password@]host:port, or https://… for a proxy spoken to over TLS; direct: never; empty: HTTPS_PROXY / https_proxy unless NO_PROXY / no_proxy names the seed host or it is loopback (Go's rules)")]
        http_proxy: String,
        #[flag("http-proxy-ca", "", "CA bundle (PEM) a TLS (https://) proxy's certificate is checked against (empty: /etc/ssl/certs/ca-certificates.crt)")]
        http_proxy_ca: String,
        #[flag("max-stream-window", i64::from(defaults().windows.max), "ours: largest HTTP/2 stream window (bytes) on the seed connection; windows start at 256 KiB and grow as the link needs (Envoy: fixed 256 MiB)")]
        max_stream_window: i64,
        #[flag("connection-budget", defaults().windows.connection_budget, "ours: bytes the seed may have in flight to this agent on one connection, stalled tunnels included")]
        connection_budget: i64,
        #[flag("worker-threads", 1, "runtime worker threads; fixed so memory and threads do not grow with the core count")]
        worker_threads: i64,
        #[embed(with_kkp_logging())]
        log: KkpLogging,
    }
}

/// The flags as `--help` lists them.
pub fn flag_set() -> FlagSet {
    Flags::flag_set()
}

/// The defaults the flags' defaults come from.
fn defaults() -> AgentConfig {
    AgentConfig::default()
}

pub fn from_values(v: &Values) -> Result<Cli, String> {
    let f = Flags::from_values(v);
    let mut listeners = Vec::new();
    for l in &f.listener {
        listeners.push(ListenerSpec::parse(l).map_err(|e| format!("-listener: {e}"))?);
    }
    let cluster = &f.cluster_id;
    let default_listener = if cluster.is_empty() {
        None
    } else {
        let mut l = ListenerSpec::kkp_default(cluster).map_err(|e| format!("-cluster-id: {e}"))?;
        l.bind_address = f
            .tunneling_agent_ip
            .parse()
            .map_err(|e| format!("-tunneling-agent-ip: {e}"))?;
        Some(l)
    };
    let flags = FlagSettings {
        proxy_host: Some(f.proxy_host.clone()).filter(|h| !h.is_empty()),
        proxy_port: f
            .proxy_port
            .if_set()
            .map(|_| f.proxy_port.port())
            .transpose()?,
        listeners,
        default_listener,
        stats_address: f
            .stats_address
            .if_set()
            .map(|a| a.parse().map_err(|e| format!("-stats-address: {e}")))
            .transpose()?,
        stats_port: f
            .stats_port
            .if_set()
            .map(|_| f.stats_port.port())
            .transpose()?,
        keepalive_interval: f.keepalive_interval.if_set().copied(),
        keepalive_timeout: f.keepalive_timeout.if_set().copied(),
        connect_timeout: f.connect_timeout.if_set().copied(),
        idle_timeout: f.idle_timeout.if_set().copied(),
        drain_timeout: f.drain_timeout,
        max_connections_per_listener: usize::try_from(f.max_connections_per_listener)
            .ok()
            .filter(|n| *n > 0)
            .ok_or("-max-connections-per-listener must be positive")?,
        max_seed_connections: usize::try_from(f.max_seed_connections)
            .ok()
            .filter(|n| *n > 0)
            .ok_or("-max-seed-connections must be positive")?,
        http_proxy: f.http_proxy.clone(),
        http_proxy_ca: Some(f.http_proxy_ca.clone())
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        proxy_env: PROXY_ENV
            .iter()
            .filter_map(|n| std::env::var(n).ok().map(|v| (*n, v)))
            .collect(),
        windows: windows(&f)?,
        allow_unknown_fields: f.allow_unknown_static_fields,
    };
    let validate_only = match f.mode.as_str() {
        "serve" => false,
        "validate" => true,
        other => {
            return Err(format!(
                "--mode {other:?}: serve or validate (Envoy's init_only is not supported)"
            ));
        }
    };
    let path = [f.config_path.clone(), f.config.clone()]
        .into_iter()
        .find(|p| !p.is_empty())
        .map(PathBuf::from);
    let mut config_bytes = Vec::new();
    let bootstrap = match &path {
        Some(p) => {
            config_bytes = crate::bootstrap::read(p)?;
            crate::bootstrap::parse_any_with(&config_bytes, flags.bootstrap_options())
                .map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => None,
    };
    let worker_threads = usize::try_from(f.worker_threads)
        .ok()
        .filter(|n| *n > 0)
        .ok_or("-worker-threads must be positive")?;
    if path.is_some()
        && bootstrap.is_none()
        && flags.listeners.is_empty()
        && flags.default_listener.is_none()
    {
        return Ok(Cli {
            config: AgentConfig::default(),
            stats: None,
            admin: None,
            worker_threads,
            config_path: path,
            config_bytes,
            flags,
            notes: None,
            validate_only,
            idle: true,
        });
    }
    let (config, stats) = flags.resolve(bootstrap.as_ref())?;
    let admin = match f.admin_address.as_str() {
        "none" => None,
        "" => Some(
            bootstrap
                .as_ref()
                .and_then(|b| b.admin)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], DEFAULT_ADMIN_PORT))),
        ),
        a => Some(
            a.parse()
                .map_err(|e| format!("-admin-address: {a:?}: {e}"))?,
        ),
    };
    Ok(Cli {
        config,
        stats,
        admin,
        worker_threads,
        config_path: path,
        config_bytes,
        flags,
        notes: bootstrap.map(|b| b.notes),
        validate_only,
        idle: false,
    })
}

impl FlagSettings {
    /// How the bootstrap is read.
    pub fn bootstrap_options(&self) -> crate::bootstrap::Options {
        crate::bootstrap::Options {
            allow_unknown_fields: self.allow_unknown_fields,
        }
    }

    /// The forward proxy for the seed `host:port`: `-http-proxy`, else the
    /// environment's.
    fn http_proxy_for(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Option<daemon::egress_proxy::HttpProxy>, String> {
        let egress = daemon::egress_proxy::EgressProxy::from_settings(
            "-http-proxy",
            &self.http_proxy,
            self.http_proxy_ca.clone(),
            |name| {
                self.proxy_env
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.clone())
            },
        )?;
        Ok(egress.proxy_for(host, None, port).cloned())
    }

    /// The configuration and stats address that the bootstrap (if any) and
    /// these flags give together.
    pub fn resolve(
        &self,
        bootstrap: Option<&Bootstrap>,
    ) -> Result<(AgentConfig, Option<SocketAddr>), String> {
        let mut c = AgentConfig::default();
        let mut stats = Some(SocketAddr::new(
            IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED),
            DEFAULT_STATS_PORT,
        ));
        if let Some(b) = bootstrap {
            c.proxy_host = b.seed.host.clone();
            c.proxy_port = b.seed.port;
            c.connect_timeout = b.seed.connect_timeout;
            if let Some((interval, timeout)) = b.seed.keepalive {
                c.keepalive_interval = interval;
                c.keepalive_timeout = timeout;
            }
            if let Some(n) = b.seed.max_concurrent_streams {
                c.max_streams_per_connection = n as usize;
            }
            if let Some(n) = b.seed.max_requests_per_connection {
                c.max_requests_per_connection = u64::from(n);
            }
            if let Some(d) = b.seed.idle_timeout {
                c.pool_idle_timeout = d;
            }
            if let Some(d) = b.idle_timeout {
                c.idle_timeout = d;
            }
            c.listeners = b
                .tunnels
                .iter()
                .map(|t| ListenerSpec {
                    bind_address: t.addr.ip(),
                    bind_port: t.addr.port(),
                    authority: t.authority.clone(),
                })
                .collect();
            // Envoy serves no stats without a stats listener.
            stats = b.stats.as_ref().map(|s| s.addr);
        }
        if let Some(h) = &self.proxy_host {
            c.proxy_host = h.clone();
        }
        if let Some(p) = self.proxy_port {
            c.proxy_port = p;
        }
        c.listeners.extend(self.listeners.iter().cloned());
        if c.listeners.is_empty() {
            c.listeners.extend(self.default_listener.clone());
        }
        if let Some(d) = self.keepalive_interval {
            c.keepalive_interval = d;
        }
        if let Some(d) = self.keepalive_timeout {
            c.keepalive_timeout = d;
        }
        if let Some(d) = self.connect_timeout {
            c.connect_timeout = d;
        }
        c.http_proxy = self.http_proxy_for(&c.proxy_host, c.proxy_port)?;
        if let Some(d) = self.idle_timeout {
            c.idle_timeout = d;
        }
        c.drain_timeout = self.drain_timeout;
        c.max_connections_per_listener = self.max_connections_per_listener;
        c.max_seed_connections = self.max_seed_connections;
        c.windows = self.windows;
        match (self.stats_port, self.stats_address) {
            (Some(0), _) => stats = None,
            (port, address) if port.is_some() || address.is_some() => {
                let base = stats.unwrap_or(SocketAddr::new(
                    IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED),
                    DEFAULT_STATS_PORT,
                ));
                stats = Some(SocketAddr::new(
                    address.unwrap_or(base.ip()),
                    port.unwrap_or(base.port()),
                ));
            }
            _ => {}
        }
        c.validate().map_err(|e| e.to_string())?;
        if let Some(s) = stats
            && c.listeners.iter().any(|l| l.bind_port == s.port())
        {
            // KKP reserves the stats port for the same reason.
            return Err(format!(
                "listener port {} collides with the stats port",
                s.port()
            ));
        }
        Ok((c, stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        from_values(
            &flag_set()
                .parse(args.iter().copied())
                .map_err(|e| e.to_string())?,
        )
    }

    fn fixture(name: &str) -> String {
        format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn cluster_id_gives_kkp_default_listener() {
        let cli = parse(&["-proxy-host=x.seed.example.com", "-cluster-id=abc"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.config.proxy_port, 8088);
        assert_eq!(
            cli.config.listeners,
            vec![ListenerSpec::kkp_default("abc").unwrap_or_else(|e| panic!("{e}"))]
        );
        assert_eq!(cli.worker_threads, 1);
        assert_eq!(
            cli.stats.map(|s| s.to_string()).as_deref(),
            Some("[::]:8002")
        );
    }

    #[test]
    fn kkp_command_line_reads_the_rendered_bootstrap() {
        let path = fixture("kkp-envoy-agent-openvpn.yaml");
        let cli = parse(&["--config-path", &path, "--use-dynamic-base-id"])
            .unwrap_or_else(|e| panic!("{e}"));
        let c = &cli.config;
        assert_eq!((c.proxy_host.as_str(), c.proxy_port), ("localhost", 8088));
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(
            (c.keepalive_interval, c.keepalive_timeout),
            (Duration::from_secs(30), Duration::from_secs(5))
        );
        assert_eq!(c.listeners.len(), 2);
        assert_eq!(
            cli.stats.map(|s| s.to_string()).as_deref(),
            Some("0.0.0.0:8002")
        );
        assert_eq!(
            cli.config_path.as_deref(),
            Some(std::path::Path::new(&path))
        );
        // Envoy's short form, and flags given explicitly win over the file.
        let cli = parse(&[
            "-c",
            &path,
            "-proxy-port=9999",
            "-stats-port=0",
            "-keepalive-interval=7s",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.config.proxy_port, 9999);
        assert_eq!(cli.config.keepalive_interval, Duration::from_secs(7));
        assert_eq!(cli.config.keepalive_timeout, Duration::from_secs(5));
        assert_eq!(cli.stats, None);
    }

    #[test]
    fn a_bad_bootstrap_names_the_file_and_the_field() {
        let dir = tempfile_dir();
        let path = dir.join("envoy.yaml");
        let text = std::fs::read_to_string(fixture("kkp-envoy-agent.yaml"))
            .unwrap_or_else(|e| panic!("{e}"))
            .replace("admin:\n", "admin:\n  profile_pathx: /x\n");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        let e = parse(&["--config-path", path.to_str().unwrap_or_default()])
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("envoy.yaml") && e.contains("profile_pathx"),
            "{e}"
        );
        let e = parse(&["--config-path", "/nonexistent/envoy.yaml"])
            .err()
            .unwrap_or_default();
        assert!(e.contains("/nonexistent/envoy.yaml"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tunnel-agent-cli-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::create_dir_all(&d);
        d
    }

    #[test]
    fn rejects_incomplete_or_colliding_config() {
        assert!(parse(&["-cluster-id=abc"]).is_err(), "proxy host required");
        assert!(parse(&["-proxy-host=x"]).is_err(), "a listener required");
        assert!(parse(&["-proxy-host=x", "-listener=127.0.0.1:8002=a.b:1"]).is_err());
        assert!(
            parse(&[
                "-proxy-host=x",
                "-listener=127.0.0.1:1=a.b:1",
                "-listener=127.0.0.1:1=a.b:2"
            ])
            .is_err()
        );
        assert!(parse(&["-proxy-host=x", "-cluster-id=a", "-worker-threads=0"]).is_err());
        assert!(parse(&["-proxy-host=x", "-cluster-id=a", "-max-seed-connections=0"]).is_err());
    }

    /// The flags that set what the bootstrap's durations set are held to
    /// the same rules (Envoy's PGV bounds), naming the flag.
    #[test]
    fn flag_durations_follow_envoys_rules() {
        let base = ["-proxy-host=x", "-cluster-id=a"];
        for (flag, want) in [
            ("-keepalive-interval=1ns", "-keepalive-interval"),
            ("-keepalive-interval=999us", "shorter than 1ms"),
            ("-keepalive-timeout=0s", "-keepalive-timeout"),
            ("-connect-timeout=0s", "-connect-timeout"),
        ] {
            let e = parse(&[base[0], base[1], flag]).err().unwrap_or_default();
            assert!(e.contains(want), "{flag}: {e}");
        }
        let cli = parse(&[
            base[0],
            base[1],
            "-keepalive-interval=1ms",
            "-max-seed-connections=3",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.config.keepalive_interval, Duration::from_millis(1));
        assert_eq!(cli.config.max_seed_connections, 3);
    }
}
