//! Command line: a config file in envoy-agent's shape, or the same settings
//! as flags.

use std::net::IpAddr;
use std::path::Path;

use daemon::flags::{FlagSet, Values};

use crate::config::{AgentConfig, DEFAULT_AGENT_IP, ListenerSpec, load_file};

#[derive(Debug, Clone)]
pub struct Cli {
    pub config: AgentConfig,
    pub stats_address: IpAddr,
    /// 0 disables the stats listener.
    pub stats_port: u16,
    pub worker_threads: usize,
}

pub fn flag_set() -> FlagSet {
    let d = AgentConfig::default();
    FlagSet::new(
        "tunnel-agent",
        "Tunnels local TCP listeners to the seed nodeport-proxy as HTTP/2 CONNECT streams over one connection.",
    )
    .compatible_with("KKP envoy-agent")
    .string("config", "", "YAML file in envoy-agent's shape (proxyHost, proxyPort, listeners[{bindAddress, bindPort, authority}])")
    .string("proxy-host", "", "seed proxy host (KKP: the cluster URL's host)")
    .int("proxy-port", i64::from(d.proxy_port), "seed proxy tunneling port")
    .strings("listener", &[], "address:port=authority; repeatable")
    .string("cluster-id", "", "without listeners: tunnel <tunneling-agent-ip>:6443 to apiserver-external.cluster-<id>.svc.cluster.local:443")
    .string("tunneling-agent-ip", &DEFAULT_AGENT_IP.to_string(), "bind address of the default listener")
    .string("stats-address", "::", "address of the health and stats listener (::, the default: every interface, IPv4 and IPv6)")
    .int("stats-port", 8002, "port of /healthz, /ready and /stats/prometheus (0: off)")
    .duration("keepalive-interval", d.keepalive_interval, "HTTP/2 PING interval on the seed connection")
    .duration("keepalive-timeout", d.keepalive_timeout, "an unanswered PING after this drops the seed connection")
    .duration("connect-timeout", d.connect_timeout, "seed connect and CONNECT answer timeout")
    .duration("idle-timeout", d.idle_timeout, "close tunnels idle this long")
    .duration("drain-timeout", d.drain_timeout, "how long tunnels may continue after SIGTERM")
    .int("max-connections-per-listener", d.max_connections_per_listener as i64, "open connections per listener")
    .int("worker-threads", 1, "runtime worker threads; fixed so memory and threads do not grow with the core count")
    .with_klog(0)
}

pub fn from_values(v: &Values) -> Result<Cli, String> {
    let mut config = AgentConfig::default();
    let mut stats_port = v.port("stats-port")?;
    let file = v.string("config");
    let file_stats_port = if file.is_empty() {
        None
    } else {
        load_file(Path::new(&file), &mut config).map_err(|e| e.to_string())?
    };
    if let Some(p) = file_stats_port.filter(|_| !v.is_set("stats-port")) {
        stats_port = p;
    }
    if !v.string("proxy-host").is_empty() {
        config.proxy_host = v.string("proxy-host");
    }
    if file.is_empty() || v.is_set("proxy-port") {
        config.proxy_port = v.port("proxy-port")?;
    }
    for l in v.strings("listener") {
        config
            .listeners
            .push(ListenerSpec::parse(&l).map_err(|e| e.to_string())?);
    }
    let cluster = v.string("cluster-id");
    if config.listeners.is_empty() && !cluster.is_empty() {
        let mut l = ListenerSpec::kkp_default(&cluster).map_err(|e| e.to_string())?;
        l.bind_address = v
            .string("tunneling-agent-ip")
            .parse()
            .map_err(|e| format!("-tunneling-agent-ip: {e}"))?;
        config.listeners.push(l);
    }
    config.keepalive_interval = v.duration("keepalive-interval");
    config.keepalive_timeout = v.duration("keepalive-timeout");
    config.connect_timeout = v.duration("connect-timeout");
    config.idle_timeout = v.duration("idle-timeout");
    config.drain_timeout = v.duration("drain-timeout");
    config.max_connections_per_listener = usize::try_from(v.int("max-connections-per-listener"))
        .ok()
        .filter(|n| *n > 0)
        .ok_or("-max-connections-per-listener must be positive")?;
    config.validate().map_err(|e| e.to_string())?;
    if stats_port != 0 && config.listeners.iter().any(|l| l.bind_port == stats_port) {
        // KKP reserves the stats port for the same reason.
        return Err(format!(
            "listener port {stats_port} collides with the stats port"
        ));
    }
    Ok(Cli {
        config,
        stats_address: v
            .string("stats-address")
            .parse()
            .map_err(|e| format!("-stats-address: {e}"))?,
        stats_port,
        worker_threads: usize::try_from(v.int("worker-threads"))
            .ok()
            .filter(|n| *n > 0)
            .ok_or("-worker-threads must be positive")?,
    })
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
    }

    #[test]
    fn rejects_incomplete_or_colliding_config() {
        assert!(parse(&["-cluster-id=abc"]).is_err(), "proxy host required");
        assert!(parse(&["-proxy-host=x"]).is_err(), "a listener required");
        assert!(parse(&["-proxy-host=x", "-listener=127.0.0.1:8002=a.b:1"]).is_err());
        assert!(parse(&["-proxy-host=x", "-cluster-id=a", "-worker-threads=0"]).is_err());
    }
}
