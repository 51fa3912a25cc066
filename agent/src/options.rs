//! `proxy-agent` flags: upstream's names, defaults and Go value syntax, and
//! their validation into a [`Config`]; the binary exits 1 on any error, as
//! upstream's (cobra) does.

use std::sync::Arc;
use std::time::Duration;

use go_compat::flags::{FlagSet, Values};
use konnectivity_proto::ids::AgentId;

use crate::Config;
use crate::clientset::SyncConfig;
use crate::connect::Connector;
use crate::session::SessionConfig;

/// A frozen server is noticed within `KEEPALIVE_TIME + KEEPALIVE_TIMEOUT` of
/// last hearing from it (upstream: 1 h + 20 s): a PING goes once it has been
/// quiet that long. Our servers PING an idle agent every 15 s, so a frozen
/// one is left within 29 s (a second inside the 30 s aim for the timers'
/// slack). Upstream's server stays quiet for its 1 h
/// keepalive and tolerates no PINGs closer than 30 s
/// ([`crate::connect::MIN_PING_GAP`]): against it, within 36 s.
pub const KEEPALIVE_TIME: Duration = Duration::from_secs(24);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Upstream's agent waits for a second signal (or SIGKILL) however idle it
/// is; ours leaves once its connections are gone, and by this long after the
/// first signal at most: inside Kubernetes' default 30 s grace period.
pub const GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

pub fn flags() -> FlagSet {
    FlagSet::new("proxy-agent", "Konnectivity proxy agent: connects out to proxy servers and dials destinations for them.")
        .compatible_with(konnectivity_proto::UPSTREAM)
        .usage_exit(1)
        .string("agent-cert", "", "If non-empty secure communication with this cert.")
        .string("agent-key", "", "If non-empty secure communication with this key.")
        .string("ca-cert", "", "If non-empty the CAs we use to validate clients.")
        .string("proxy-server-host", "127.0.0.1", "The hostname to use to connect to the proxy-server.")
        .string("proxy-server-http-proxy", "", "Ours: reach the proxy servers through this HTTP CONNECT proxy: http://[user:password@]host:port, or https://… for a proxy spoken to over TLS; direct: never; empty: HTTPS_PROXY / https_proxy unless NO_PROXY / no_proxy names the server or it is loopback (Go's rules, as upstream's agent reads them).")
        .string("proxy-server-http-proxy-ca", "", "Ours: CA bundle (PEM) an https:// proxy's certificate is checked against (empty: /etc/ssl/certs/ca-certificates.crt).")
        .int("proxy-server-port", 8091, "The port the proxy server is listening on.")
        .bool("resolve-proxy-server-host", false, "Ours: hold a stream to every address each --proxy-server-host name resolves to (re-resolved every --proxy-server-resolve-interval), so HA servers need no load balancer in front. --proxy-server-host may also be a comma-separated list of host[:port].")
        .duration("proxy-server-resolve-interval", crate::servers::RESOLVE_INTERVAL, "Ours: how often --resolve-proxy-server-host resolves the names again.")
        .strings("alpn-proto", &[], "Additional ALPN protocols to be presented when connecting to the server. Useful to distinguish between network proxy and apiserver connections that share the same destination address.")
        .string("health-server-host", "", "The host address to listen on, without port.")
        .int("health-server-port", 8093, "The port the health server is listening on.")
        .int("admin-server-port", 8094, "The port the admin server is listening on.")
        .string("admin-bind-address", "127.0.0.1", "Bind address for admin connections. If empty, we will bind to all interfaces.")
        .bool("enable-profiling", false, "enable pprof at host:admin-port/debug/pprof (CPU profiles; see docs/konnectivity.md)")
        .bool("enable-contention-profiling", false, "Accepted for compatibility: Go's block profile has no counterpart here.")
        .string("agent-id", "", "The unique ID of this agent. Can also be set by the 'PROXY_AGENT_ID' environment variable. Default to a generated uuid if not set.")
        .duration("sync-interval", Duration::from_secs(1), "The initial interval by which the agent periodically checks if it has connections to all instances of the proxy server.")
        .duration("probe-interval", Duration::from_secs(1), "Accepted for compatibility: a lost stream is noticed when it ends or HTTP/2 keepalive fails.")
        .duration("sync-interval-cap", Duration::from_secs(10), "The maximum interval for the SyncInterval to back off to when unable to connect to the proxy server")
        .duration("keepalive-time", KEEPALIVE_TIME, "Time for gRPC agent server keepalive.")
        .duration("keepalive-timeout", KEEPALIVE_TIMEOUT, "How long a keepalive PING to a server may stay unanswered before its stream is closed (ours).")
        .duration("keepalive-min-interval", crate::connect::MIN_PING_GAP, "Ours: the least time between two keepalive PINGs to a server (a PING goes once the server has been quiet for --keepalive-time). Upstream's server closes connections that PING more often than every 30 s; lower it only with servers of this project.")
        .string("service-account-token-path", "", "If non-empty proxy agent uses this token to prove its identity to the proxy server.")
        .string("agent-identifiers", "", "Identifiers of the agent that will be used by the server when choosing agent. N.B. the list of identifiers must be in URL encoded format. e.g.,host=localhost&host=node1.mydomain.com&cidr=127.0.0.1/16&ipv4=1.2.3.4&ipv4=5.6.7.8&ipv6=:::::&default-route=true")
        .bool("warn-on-channel-limit", false, "Accepted for compatibility.")
        .bool("sync-forever", false, "If true, the agent continues syncing, in order to support server count changes.")
        .int("xfr-channel-size", 150, "Packets queued per destination connection.")
        .duration("destination-stall-timeout", Duration::from_secs(10), "How long a destination may leave its queue full before only its connection is closed (protects the shared stream).")
        .bool("allow-expired-certificates", false, "Ours: start even if --agent-cert holds a certificate that is expired or not yet valid (or --ca-cert none that is valid now), with a warning; without it that is a start-up error. Hot reloads refuse such files either way.")
        .string("allowed-destinations", "", "Ours: comma-separated CIDRs the agent may dial for its servers, each optionally with :PORT or :FIRST-LAST (IPv6 with ports: [CIDR]:PORT). Empty allows every destination, as upstream.")
        .duration("graceful-shutdown-timeout", GRACEFUL_SHUTDOWN_TIMEOUT, "Ours: after the first SIGTERM (DRAIN sent), how long the agent keeps serving (open connections, and dials servers still route to it as their last resort) before it closes what is left and exits; a second SIGTERM exits at once. Keep it below the pod's terminationGracePeriodSeconds.")
        .int("flow-control-window", link::flow::DEFAULT_INITIAL_WINDOW, "Ours: initial per-connection flow-control window (bytes) with servers of this project; windows grow with the link up to --flow-control-max-window. 0 turns flow control off. Upstream servers ignore the offer.")
        .int("flow-control-max-window", link::flow::DEFAULT_MAX_WINDOW, "Ours: largest per-connection flow-control window (bytes), per direction.")
        .int("flow-control-server-budget", link::flow::DEFAULT_LINK_BUDGET, "Ours: bytes the connections of one server stream may have in flight towards this agent together; windows stop growing when it is used.")
        .int("flow-control-budget", link::flow::DEFAULT_PROCESS_BUDGET, "Ours: bytes the connections of all server streams may have in flight towards this agent together, HTTP/2 windows of the server streams included.")
        .int("http2-max-window", i64::from(link::flow::DEFAULT_HTTP2_MAX_WINDOW), "Ours: largest HTTP/2 receive window (bytes) of one server connection; it grows from 1 MiB as the link needs (as grpc-go's BDP estimator does, up to 16 MiB there).")
        .bool("count-server-leases", false, "Enables lease counting system to determine the number of proxy servers to connect to.")
        .string("lease-namespace", "kube-system", "Namespace where lease objects are managed.")
        .string("lease-label-selector", "k8s-app=konnectivity-server", "Label selector for leases to take into account when counting servers.")
        .string("lease-label", "k8s-app=konnectivity-server", "")
        .deprecated("Use --lease-label-selector instead")
        .hidden()
        .string("server-count-source", "default", "Defines how the server counts from lease and from server responses are combined. Possible values: 'default' to use only one source (server or leases depending on other flags), 'max' to take the larger value.")
        .string("kubeconfig", "", "Path to the kubeconfig file")
        .string("kube-api-content-type", "application/vnd.kubernetes.protobuf", "Content type of requests sent to apiserver.")
        .with_klog(4)
}

/// `--count-server-leases` and its companions (`None` when off).
pub fn lease_counting(v: &Values) -> Result<Option<crate::servers::leases::LeaseCounting>, String> {
    let kubeconfig = v.existing_file("kubeconfig")?;
    // Upstream after v0.36.0 (#868): `--lease-label-selector` takes a full
    // label selector and `--lease-label` (v0.36's, now deprecated) sets the
    // same selector, so whichever comes last on the command line counts.
    // Checked whether or not leases are counted, as upstream parses it.
    let flag = v
        .last_given(&["lease-label", "lease-label-selector"])
        .unwrap_or("lease-label-selector");
    let selector = v.string(flag).trim().to_string();
    crate::servers::label_selector::validate(&selector)
        .map_err(|e| format!("--{flag} {selector:?} is not a valid label selector: {e}"))?;
    if !v.bool("count-server-leases") {
        return Ok(None);
    }
    Ok(Some(crate::servers::leases::LeaseCounting {
        namespace: v.string("lease-namespace"),
        selector,
        kubeconfig,
        max_with_header: v.string("server-count-source") == "max",
    }))
}

/// `--proxy-server-http-proxy` (and its CA), else the environment's
/// `HTTPS_PROXY`/`NO_PROXY` (read through `env`).
pub fn egress_proxy(
    v: &Values,
    env: impl Fn(&str) -> Option<String>,
) -> Result<daemon::egress_proxy::EgressProxy, String> {
    let ca = Some(v.string("proxy-server-http-proxy-ca"))
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from);
    let egress = daemon::egress_proxy::EgressProxy::from_settings(
        "--proxy-server-http-proxy",
        &v.string("proxy-server-http-proxy"),
        ca,
        env,
    )?;
    egress.check_ca("proxy-server-http-proxy-ca")?;
    if egress.proxy().is_some() {
        tracing::info!(proxy = %egress, "reaching proxy servers through an HTTP proxy");
    }
    Ok(egress)
}

/// Listening addresses from the flags.
#[derive(Debug, Clone)]
pub struct Addresses {
    pub health: (String, u16),
    pub admin: (String, u16),
}

pub fn parse(v: &Values) -> Result<(Config, Addresses), String> {
    let cert = v.existing_file("agent-cert")?;
    let key = v.existing_file("agent-key")?;
    if cert.is_some() != key.is_some() {
        return Err("--agent-cert and --agent-key must be set together".into());
    }
    let Some(ca) = v.existing_file("ca-cert")? else {
        return Err("--ca-cert is required to verify the proxy server".into());
    };
    let token_path = v.existing_file("service-account-token-path")?;
    let mut alpn: Vec<Vec<u8>> = v
        .strings("alpn-proto")
        .into_iter()
        .map(String::into_bytes)
        .collect();
    if !alpn.iter().any(|p| p == b"h2") {
        alpn.push(b"h2".to_vec());
    }
    let files = daemon::tls::Files {
        cert,
        key,
        ca: Some(ca),
    };
    let flags = daemon::tls::FileFlags {
        cert: "agent-cert",
        key: "agent-key",
        ca: "ca-cert",
    };
    let at_start = if v.bool("allow-expired-certificates") {
        daemon::tls::reload::AtStart::Warn
    } else {
        daemon::tls::reload::AtStart::Refuse
    };
    let tls =
        daemon::tls::reload::Reloading::from_files("server", flags, files, at_start, move |f| {
            let identity = f.cert.as_deref().zip(f.key.as_deref());
            match &f.ca {
                Some(ca) => daemon::tls::client_config(ca, identity, &alpn),
                None => Err(daemon::tls::TlsError::Verifier("no CA".into())),
            }
        })?;

    let identifiers = v.string("agent-identifiers");
    konnectivity_proto::header::validate_identifiers(&identifiers)
        .map_err(|e| format!("--agent-identifiers: {e}"))?;
    let xfr = v.int("xfr-channel-size");
    if xfr <= 0 {
        return Err(format!(
            "--xfr-channel-size must be greater than 0, got {xfr}"
        ));
    }
    let (interval, cap) = (v.duration("sync-interval"), v.duration("sync-interval-cap"));
    if interval > cap {
        return Err(format!(
            "--sync-interval ({}) must not be greater than --sync-interval-cap ({})",
            go_compat::duration::format(interval),
            go_compat::duration::format(cap)
        ));
    }
    if v.bool("enable-contention-profiling") && !v.bool("enable-profiling") {
        return Err(
            "if --enable-contention-profiling is set, --enable-profiling must also be set".into(),
        );
    }
    if v.bool("enable-profiling") && !daemon::endpoints::PROFILER_BUILT_IN {
        tracing::warn!("{}", daemon::endpoints::NO_PROFILER);
    }
    match v.string("server-count-source").as_str() {
        "" | "default" | "max" => {}
        other => {
            return Err(format!(
                "--server-count-source must be 'default' or 'max', got {other:?}"
            ));
        }
    }
    lease_counting(v)?;
    let agent_id = match v.string("agent-id") {
        s if !s.is_empty() => s,
        _ => std::env::var("PROXY_AGENT_ID")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
    };
    let health_port = v.port("health-server-port")?;
    let port = v.port("proxy-server-port")?;
    let hosts = crate::servers::parse_hosts(&v.string("proxy-server-host"), port)?;
    let resolve_every = v.bool("resolve-proxy-server-host").then(|| {
        v.duration("proxy-server-resolve-interval")
            .max(std::time::Duration::from_secs(1))
    });
    let (host, port) = hosts.first().cloned().unwrap_or_default();
    let servers = crate::servers::Servers {
        // One name and no resolving: exactly upstream's agent.
        hosts: if hosts.len() > 1 || resolve_every.is_some() {
            hosts
        } else {
            Vec::new()
        },
        resolve_every,
        resolver: None,
    };
    let names = [
        "flow-control-window",
        "flow-control-max-window",
        "flow-control-server-budget",
        "flow-control-budget",
    ];
    let mut settings = link::flow::settings_from_flags(names.map(|n| v.int(n)), names)?;
    settings.http2_max_window =
        link::flow::http2_window_from_flag(v.int("http2-max-window"), "http2-max-window")?;
    let flow = link::flow::FlowPool::new(settings);
    let egress = egress_proxy(v, |name| std::env::var(name).ok())?;
    let config = Config {
        connector: Connector {
            host,
            port,
            addr: None,
            tls,
            agent_id: AgentId(agent_id),
            identifiers,
            token_path,
            // grpc-go's client raises anything below 10 s to 10 s.
            keepalive: v.duration("keepalive-time").max(Duration::from_secs(10)),
            keepalive_timeout: v.duration("keepalive-timeout"),
            keepalive_min_interval: v.duration("keepalive-min-interval"),
            flow: flow.clone(),
            egress: Arc::new(egress),
        },
        sync: SyncConfig {
            interval,
            interval_cap: cap,
            forever: v.bool("sync-forever"),
            servers,
        },
        session: SessionConfig {
            dial_timeout: crate::dial::DIAL_TIMEOUT,
            conn_queue: usize::try_from(xfr)
                .map_err(|_| "--xfr-channel-size is too large".to_string())?,
            stall_timeout: v
                .duration("destination-stall-timeout")
                .max(Duration::from_millis(100)),
            policy: Arc::new(
                crate::dial::policy::DestinationPolicy::parse(&v.string("allowed-destinations"))
                    .map_err(|e| format!("--allowed-destinations: {e}"))?,
            ),
            flow,
            dialer: Default::default(),
        },
    };
    let addrs = Addresses {
        health: (v.string("health-server-host"), health_port),
        admin: (v.string("admin-bind-address"), v.port("admin-server-port")?),
    };
    Ok((config, addrs))
}
