//! `proxy-agent` flags: upstream's names, defaults and Go value syntax, and
//! their validation into a [`Config`]; the binary exits 1 on any error, as
//! upstream's (cobra) does.

use std::sync::Arc;
use std::time::Duration;

use go_compat::flags::{FlagSet, Given, Klog, Values};
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

go_compat::typed_flags! {
    /// proxy-agent's flags, in `--help` order.
    pub struct Flags = (FlagSet::new("proxy-agent", "Konnectivity proxy agent: connects out to proxy servers and dials destinations for them.")
        .compatible_with(konnectivity_proto::UPSTREAM)
        .usage_exit(1)) {
        #[flag("agent-cert", "", "If non-empty secure communication with this cert.")]
        agent_cert: Given<String>,
        #[flag("agent-key", "", "If non-empty secure communication with this key.")]
        agent_key: Given<String>,
        #[flag("ca-cert", "", "If non-empty the CAs we use to validate clients.")]
        ca_cert: Given<String>,
        #[flag("proxy-server-host", "127.0.0.1", "The hostname to use to connect to the proxy-server.")]
        proxy_server_host: String,
        #[flag("proxy-server-http-proxy", "", "Ours: reach the proxy servers through this HTTP CONNECT proxy: http://[user:password@]host:port, or https://… for a proxy spoken to over TLS; direct: never; empty: HTTPS_PROXY / https_proxy unless NO_PROXY / no_proxy names the server or it is loopback (Go's rules, as upstream's agent reads them).")]
        proxy_server_http_proxy: String,
        #[flag("proxy-server-http-proxy-ca", "", "Ours: CA bundle (PEM) an https:// proxy's certificate is checked against (empty: /etc/ssl/certs/ca-certificates.crt).")]
        proxy_server_http_proxy_ca: String,
        #[flag("proxy-server-port", 8091, "The port the proxy server is listening on.")]
        proxy_server_port: Given<i64>,
        #[flag("resolve-proxy-server-host", false, "Ours: hold a stream to every address each --proxy-server-host name resolves to (re-resolved every --proxy-server-resolve-interval), so HA servers need no load balancer in front. --proxy-server-host may also be a comma-separated list of host[:port].")]
        resolve_proxy_server_host: bool,
        #[flag("proxy-server-resolve-interval", crate::servers::RESOLVE_INTERVAL, "Ours: how often --resolve-proxy-server-host resolves the names again.")]
        proxy_server_resolve_interval: Duration,
        #[flag("alpn-proto", Vec::new(), "Additional ALPN protocols to be presented when connecting to the server. Useful to distinguish between network proxy and apiserver connections that share the same destination address.")]
        alpn_proto: Vec<String>,
        #[flag("health-server-host", "", "The host address to listen on, without port.")]
        health_server_host: String,
        #[flag("health-server-port", 8093, "The port the health server is listening on.")]
        health_server_port: Given<i64>,
        #[flag("admin-server-port", 8094, "The port the admin server is listening on.")]
        admin_server_port: Given<i64>,
        #[flag("admin-bind-address", "127.0.0.1", "Bind address for admin connections. If empty, we will bind to all interfaces.")]
        admin_bind_address: String,
        #[flag("enable-profiling", false, "enable pprof at host:admin-port/debug/pprof (CPU profiles; see docs/konnectivity.md)")]
        enable_profiling: bool,
        #[flag("enable-contention-profiling", false, "Accepted for compatibility: Go's block profile has no counterpart here.")]
        enable_contention_profiling: bool,
        #[flag("agent-id", "", "The unique ID of this agent. Can also be set by the 'PROXY_AGENT_ID' environment variable. Default to a generated uuid if not set.")]
        agent_id: String,
        #[flag("sync-interval", Duration::from_secs(1), "The initial interval by which the agent periodically checks if it has connections to all instances of the proxy server.")]
        sync_interval: Duration,
        #[flag("probe-interval", Duration::from_secs(1), "Accepted for compatibility: a lost stream is noticed when it ends or HTTP/2 keepalive fails.")]
        probe_interval: Duration,
        #[flag("sync-interval-cap", Duration::from_secs(10), "The maximum interval for the SyncInterval to back off to when unable to connect to the proxy server")]
        sync_interval_cap: Duration,
        #[flag("keepalive-time", KEEPALIVE_TIME, "Time for gRPC agent server keepalive.")]
        keepalive_time: Duration,
        #[flag("keepalive-timeout", KEEPALIVE_TIMEOUT, "How long a keepalive PING to a server may stay unanswered before its stream is closed (ours).")]
        keepalive_timeout: Duration,
        #[flag("keepalive-min-interval", crate::connect::MIN_PING_GAP, "Ours: the least time between two keepalive PINGs to a server (a PING goes once the server has been quiet for --keepalive-time). Upstream's server closes connections that PING more often than every 30 s; lower it only with servers of this project.")]
        keepalive_min_interval: Duration,
        #[flag("service-account-token-path", "", "If non-empty proxy agent uses this token to prove its identity to the proxy server.")]
        service_account_token_path: Given<String>,
        #[flag("agent-identifiers", "", "Identifiers of the agent that will be used by the server when choosing agent. N.B. the list of identifiers must be in URL encoded format. e.g.,host=localhost&host=node1.mydomain.com&cidr=127.0.0.1/16&ipv4=1.2.3.4&ipv4=5.6.7.8&ipv6=:::::&default-route=true")]
        agent_identifiers: String,
        #[flag("warn-on-channel-limit", false, "Accepted for compatibility.")]
        warn_on_channel_limit: bool,
        #[flag("sync-forever", false, "If true, the agent continues syncing, in order to support server count changes.")]
        sync_forever: bool,
        #[flag("xfr-channel-size", 150, "Packets queued per destination connection.")]
        xfr_channel_size: i64,
        #[flag("destination-stall-timeout", Duration::from_secs(10), "How long a destination may leave its queue full before only its connection is closed (protects the shared stream).")]
        destination_stall_timeout: Duration,
        #[flag("allow-expired-certificates", false, "Ours: start even if --agent-cert holds a certificate that is expired or not yet valid (or --ca-cert none that is valid now), with a warning; without it that is a start-up error. Hot reloads refuse such files either way.")]
        allow_expired_certificates: bool,
        #[flag("otlp-traces-endpoint", "", "Ours: an OTLP/HTTP receiver (http://host:port, e.g. an OpenTelemetry collector's 4318) to send one span per dial to; empty (the default) traces nothing. See docs/konnectivity.md.")]
        otlp_traces_endpoint: String,
        #[flag("allowed-destinations", "", "Ours: comma-separated CIDRs the agent may dial for its servers, each optionally with :PORT or :FIRST-LAST (IPv6 with ports: [CIDR]:PORT). Empty allows every destination, as upstream.")]
        allowed_destinations: String,
        #[flag("graceful-shutdown-timeout", GRACEFUL_SHUTDOWN_TIMEOUT, "Ours: after the first SIGTERM (DRAIN sent), how long the agent keeps serving (open connections, and dials servers still route to it as their last resort) before it closes what is left and exits; a second SIGTERM exits at once. Keep it below the pod's terminationGracePeriodSeconds.")]
        graceful_shutdown_timeout: Duration,
        #[flag("flow-control-window", link::flow::DEFAULT_INITIAL_WINDOW, "Ours: initial per-connection flow-control window (bytes) with servers of this project; windows grow with the link up to --flow-control-max-window. 0 turns flow control off. Upstream servers ignore the offer.")]
        flow_control_window: Given<i64>,
        #[flag("flow-control-max-window", link::flow::DEFAULT_MAX_WINDOW, "Ours: largest per-connection flow-control window (bytes), per direction.")]
        flow_control_max_window: Given<i64>,
        #[flag("flow-control-server-budget", link::flow::DEFAULT_LINK_BUDGET, "Ours: bytes the connections of one server stream may have in flight towards this agent together; windows stop growing when it is used.")]
        flow_control_server_budget: Given<i64>,
        #[flag("flow-control-budget", link::flow::DEFAULT_PROCESS_BUDGET, "Ours: bytes the connections of all server streams may have in flight towards this agent together, HTTP/2 windows of the server streams included.")]
        flow_control_budget: Given<i64>,
        #[flag("http2-max-window", i64::from(link::flow::DEFAULT_HTTP2_MAX_WINDOW), "Ours: largest HTTP/2 receive window (bytes) of one server connection; it grows from 1 MiB as the link needs (as grpc-go's BDP estimator does, up to 16 MiB there).")]
        http2_max_window: Given<i64>,
        #[flag("count-server-leases", false, "Enables lease counting system to determine the number of proxy servers to connect to.")]
        count_server_leases: bool,
        #[flag("lease-namespace", "kube-system", "Namespace where lease objects are managed.")]
        lease_namespace: String,
        #[flag("lease-label-selector", "k8s-app=konnectivity-server", "Label selector for leases to take into account when counting servers.")]
        lease_label_selector: Given<String>,
        #[flag("lease-label", "k8s-app=konnectivity-server", "", deprecated("Use --lease-label-selector instead"), hidden)]
        lease_label: Given<String>,
        #[flag("server-count-source", "default", "Defines how the server counts from lease and from server responses are combined. Possible values: 'default' to use only one source (server or leases depending on other flags), 'max' to take the larger value.")]
        server_count_source: String,
        #[flag("kubeconfig", "", "Path to the kubeconfig file")]
        kubeconfig: Given<String>,
        #[flag("kube-api-content-type", "application/vnd.kubernetes.protobuf", "Content type of requests sent to apiserver.")]
        kube_api_content_type: String,
        #[embed(with_klog(4))]
        log: Klog,
    }
}

/// The flags as `--help` lists them.
pub fn flags() -> FlagSet {
    Flags::flag_set()
}

/// The process arguments parsed (for [`parse`] and its companions) and as
/// the typed flags; see [`FlagSet::parse_env_or_exit`].
pub fn parse_env_or_exit() -> (Values, Flags) {
    Flags::parse_env_or_exit_with_values()
}

/// `--count-server-leases` and its companions (`None` when off).
pub fn lease_counting(v: &Values) -> Result<Option<crate::servers::leases::LeaseCounting>, String> {
    lease_settings(&Flags::from_values(v))
}

fn lease_settings(f: &Flags) -> Result<Option<crate::servers::leases::LeaseCounting>, String> {
    let kubeconfig = f.kubeconfig.existing_file()?;
    // Upstream after v0.36.0 (#868): `--lease-label-selector` takes a full
    // label selector and `--lease-label` (v0.36's, now deprecated) sets the
    // same selector, so whichever comes last on the command line counts.
    // Checked whether or not leases are counted, as upstream parses it.
    let flag = if f.lease_label.given_after(&f.lease_label_selector) {
        &f.lease_label
    } else {
        &f.lease_label_selector
    };
    let selector = flag.value.trim().to_string();
    crate::servers::label_selector::validate(&selector).map_err(|e| {
        format!(
            "--{} {selector:?} is not a valid label selector: {e}",
            flag.name()
        )
    })?;
    if !f.count_server_leases {
        return Ok(None);
    }
    Ok(Some(crate::servers::leases::LeaseCounting {
        namespace: f.lease_namespace.clone(),
        selector,
        kubeconfig,
        max_with_header: f.server_count_source == "max",
    }))
}

/// `--proxy-server-http-proxy` (and its CA), else the environment's
/// `HTTPS_PROXY`/`NO_PROXY` (read through `env`).
pub fn egress_proxy(
    f: &Flags,
    env: impl Fn(&str) -> Option<String>,
) -> Result<daemon::egress_proxy::EgressProxy, String> {
    let ca = Some(f.proxy_server_http_proxy_ca.clone())
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from);
    let egress = daemon::egress_proxy::EgressProxy::from_settings(
        "--proxy-server-http-proxy",
        &f.proxy_server_http_proxy,
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
    let f = Flags::from_values(v);
    let cert = f.agent_cert.existing_file()?;
    let key = f.agent_key.existing_file()?;
    if cert.is_some() != key.is_some() {
        return Err("--agent-cert and --agent-key must be set together".into());
    }
    let Some(ca) = f.ca_cert.existing_file()? else {
        return Err("--ca-cert is required to verify the proxy server".into());
    };
    let token_path = f.service_account_token_path.existing_file()?;
    let mut alpn: Vec<Vec<u8>> = f
        .alpn_proto
        .clone()
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
    let at_start = if f.allow_expired_certificates {
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

    let identifiers = f.agent_identifiers.clone();
    konnectivity_proto::header::validate_identifiers(&identifiers)
        .map_err(|e| format!("--agent-identifiers: {e}"))?;
    let xfr = f.xfr_channel_size;
    if xfr <= 0 {
        return Err(format!(
            "--xfr-channel-size must be greater than 0, got {xfr}"
        ));
    }
    let (interval, cap) = (f.sync_interval, f.sync_interval_cap);
    if interval > cap {
        return Err(format!(
            "--sync-interval ({}) must not be greater than --sync-interval-cap ({})",
            go_compat::duration::format(interval),
            go_compat::duration::format(cap)
        ));
    }
    if f.enable_contention_profiling && !f.enable_profiling {
        return Err(
            "if --enable-contention-profiling is set, --enable-profiling must also be set".into(),
        );
    }
    if f.enable_profiling && !daemon::endpoints::PROFILER_BUILT_IN {
        tracing::warn!("{}", daemon::endpoints::NO_PROFILER);
    }
    match f.server_count_source.as_str() {
        "" | "default" | "max" => {}
        other => {
            return Err(format!(
                "--server-count-source must be 'default' or 'max', got {other:?}"
            ));
        }
    }
    lease_settings(&f)?;
    let agent_id = match f.agent_id.clone() {
        s if !s.is_empty() => s,
        _ => std::env::var("PROXY_AGENT_ID")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
    };
    let health_port = f.health_server_port.port()?;
    let port = f.proxy_server_port.port()?;
    let hosts = crate::servers::parse_hosts(&f.proxy_server_host, port)?;
    let resolve_every = f.resolve_proxy_server_host.then(|| {
        f.proxy_server_resolve_interval
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
    let flow_flags = [
        &f.flow_control_window,
        &f.flow_control_max_window,
        &f.flow_control_server_budget,
        &f.flow_control_budget,
    ];
    let mut settings =
        link::flow::settings_from_flags(flow_flags.map(|f| f.value), flow_flags.map(|f| f.name()))?;
    settings.http2_max_window =
        link::flow::http2_window_from_flag(f.http2_max_window.value, f.http2_max_window.name())?;
    let flow = link::flow::FlowPool::new(settings);
    let egress = egress_proxy(&f, |name| std::env::var(name).ok())?;
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
            keepalive: f.keepalive_time.max(Duration::from_secs(10)),
            keepalive_timeout: f.keepalive_timeout,
            keepalive_min_interval: f.keepalive_min_interval,
            flow: flow.clone(),
            egress: Arc::new(egress),
        },
        sync: SyncConfig {
            interval,
            interval_cap: cap,
            forever: f.sync_forever,
            servers,
        },
        session: SessionConfig {
            dial_timeout: crate::dial::DIAL_TIMEOUT,
            conn_queue: usize::try_from(xfr)
                .map_err(|_| "--xfr-channel-size is too large".to_string())?,
            stall_timeout: f.destination_stall_timeout.max(Duration::from_millis(100)),
            policy: Arc::new(
                crate::dial::policy::DestinationPolicy::parse(&f.allowed_destinations)
                    .map_err(|e| format!("--allowed-destinations: {e}"))?,
            ),
            flow,
            dialer: Default::default(),
            otlp: match f.otlp_traces_endpoint.as_str() {
                "" => None,
                s => Some(Arc::new(daemon::otlp::Exporter::new(
                    daemon::otlp::Endpoint::parse(s)?,
                    "proxy-agent",
                ))),
            },
        },
    };
    let addrs = Addresses {
        health: (f.health_server_host.clone(), health_port),
        admin: (f.admin_bind_address.clone(), f.admin_server_port.port()?),
    };
    Ok((config, addrs))
}
