//! `proxy-server` flags: upstream's names, defaults and Go value syntax, and
//! their validation into a [`Config`]. Invalid input is reported as a message;
//! the binary prints it and exits 1, as upstream's (cobra) does.

use std::path::PathBuf;
use std::time::Duration;

use daemon::tls::reload::{AtStart, Files, Reloading};
use daemon::tls::{self, FileFlags, TlsPolicy};
use go_compat::flags::{FlagSet, Given, Klog, Values};
use konnectivity_proto::ids::ServerId;

use crate::backend::Strategy;
use crate::core::CoreConfig;
use crate::{Config, Mode};

/// Our default for `--backend-dial-timeout` (upstream: 0, off). Longer than
/// the agent's own 5 s dial timeout, shorter than kube-apiserver's 30 s
/// backstop, so a lost DIAL_RSP is noticed here first.
pub const DEFAULT_BACKEND_DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Applied when `--backend-dial-timeout=0` asks for no limit: dials still end.
pub const MAX_BACKEND_DIAL_TIMEOUT: Duration = Duration::from_secs(60);

/// A frozen agent (stopped process, dead NAT path) is noticed within
/// `KEEPALIVE_TIME + KEEPALIVE_TIMEOUT` (upstream: 1 h + 20 s).
/// `--agent-accept-rate`: well above what agents need (1,000 agents that
/// reconnect at once are all taken on within 4 s), well below what one core spends on a
/// flooder that reconnects as fast as it can (1,256-1,537 a second,
/// RELIABILITY.md "Floods").
pub const DEFAULT_AGENT_ACCEPT_RATE: f64 = 250.0;

/// `--frontend-flood-penalty`: as nodeport-proxy's `-tunneling-flood-penalty`.
/// A frontend client that floods is an attacker or a broken client; a
/// kube-apiserver never sends a control-frame burst its data does not earn.
pub const DEFAULT_FRONTEND_FLOOD_PENALTY: Duration = Duration::from_secs(30);

pub const KEEPALIVE_TIME: Duration = Duration::from_secs(15);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(15);

go_compat::typed_flags! {
    /// proxy-server's flags, in `--help` order.
    pub struct Flags = (FlagSet::new("proxy-server", "Konnectivity proxy server: kube-apiserver dials through it to agents in the cluster.")
        .compatible_with(konnectivity_proto::UPSTREAM)
        .usage_exit(1)) {
        #[flag("server-cert", "", "If non-empty secure communication with this cert.")]
        server_cert: Given<String>,
        #[flag("server-key", "", "If non-empty secure communication with this key.")]
        server_key: Given<String>,
        #[flag("server-ca-cert", "", "If non-empty the CA we use to validate KAS clients.")]
        server_ca_cert: Given<String>,
        #[flag("cluster-cert", "", "If non-empty secure communication with this cert.")]
        cluster_cert: Given<String>,
        #[flag("cluster-key", "", "If non-empty secure communication with this key.")]
        cluster_key: Given<String>,
        #[flag("cluster-ca-cert", "", "If non-empty the CA we use to validate Agent clients.")]
        cluster_ca_cert: Given<String>,
        #[flag("mode", "grpc", "mode can be either 'grpc' or 'http-connect'.")]
        mode: String,
        #[flag("uds-name", "", "uds-name should be empty for TCP traffic. For UDS set to its name.")]
        uds_name: String,
        #[flag("delete-existing-uds-file", true, "If true and if file UdsName already exists, delete the file before listen on that UDS file.")]
        delete_existing_uds_file: bool,
        #[flag("server-port", 8090, "Port we listen for server connections on. Set to 0 for UDS.")]
        server_port: Given<i64>,
        #[flag("server-bind-address", "", "Bind address for server connections. If empty, we will bind to all interfaces.")]
        server_bind_address: String,
        #[flag("agent-port", 8091, "Port we listen for agent connections on.")]
        agent_port: Given<i64>,
        #[flag("agent-bind-address", "", "Bind address for agent connections. If empty, we will bind to all interfaces.")]
        agent_bind_address: String,
        #[flag("agent-accept-rate", DEFAULT_AGENT_ACCEPT_RATE, "Ours: new agent connections accepted per second at most, after a burst of one second's worth; newcomers past it wait in the listen backlog, so an agent that floods and reconnects costs the server little. 0 means no limit.")]
        agent_accept_rate: f64,
        #[flag("admin-port", 8095, "Port we listen for admin connections on.")]
        admin_port: Given<i64>,
        #[flag("admin-bind-address", "127.0.0.1", "Bind address for admin connections. If empty, we will bind to localhost.")]
        admin_bind_address: String,
        #[flag("health-port", 8092, "Port we listen for health connections on.")]
        health_port: Given<i64>,
        #[flag("health-bind-address", "", "Bind address for health connections. If empty, we will bind to all interfaces.")]
        health_bind_address: String,
        #[flag("keepalive-time", KEEPALIVE_TIME, "Time for gRPC agent server keepalive.")]
        keepalive_time: Duration,
        #[flag("keepalive-timeout", KEEPALIVE_TIMEOUT, "How long a keepalive PING to an agent may stay unanswered before its connection is closed and its tunnels fail (ours).")]
        keepalive_timeout: Duration,
        #[flag("frontend-keepalive-time", Duration::from_secs(3600), "Time for gRPC frontend server keepalive.")]
        frontend_keepalive_time: Duration,
        #[flag("frontend-flood-penalty", DEFAULT_FRONTEND_FLOOD_PENALTY, "Ours: after a gRPC frontend connection is closed for an HTTP/2 control-frame flood (GOAWAY ENHANCE_YOUR_CALM), new gRPC frontend connections from its client (on TCP its address, IPv6 its /64; on the Unix socket its process) start at most 10 a second for this long after its last flood; the rest wait (up to 10s) or are closed. 0 turns it off.")]
        frontend_flood_penalty: Duration,
        #[flag("enable-profiling", false, "enable pprof at host:admin-port/debug/pprof (CPU profiles; see docs/konnectivity.md)")]
        enable_profiling: bool,
        #[flag("otlp-traces-endpoint", "", "Ours: an OTLP/HTTP receiver (http://host:port, e.g. an OpenTelemetry collector's 4318) to send one span per dial to; empty (the default) traces nothing. See docs/konnectivity.md.")]
        otlp_traces_endpoint: String,
        #[flag("enable-contention-profiling", false, "Accepted for compatibility: Go's block profile has no counterpart here.")]
        enable_contention_profiling: bool,
        #[flag("server-id", "", "The unique ID of this server. Can also be set by the 'PROXY_SERVER_ID' environment variable.")]
        server_id: String,
        #[flag("server-count", 1, "The number of proxy server instances, should be 1 unless it is an HA server.")]
        server_count: i64,
        #[flag("agent-namespace", "", "Expected agent's namespace during agent authentication (used with agent-service-account, authentication-audience, kubeconfig).")]
        agent_namespace: String,
        #[flag("agent-service-account", "", "Expected agent's service account during agent authentication (used with agent-namespace, authentication-audience, kubeconfig).")]
        agent_service_account: String,
        #[flag("kubeconfig", "", "absolute path to the kubeconfig file (used with agent-namespace, agent-service-account, authentication-audience).")]
        kubeconfig: Given<String>,
        #[flag("kubeconfig-qps", 0.0, "Maximum client QPS (proxy server uses this client to authenticate agent tokens).")]
        kubeconfig_qps: f64,
        #[flag("kubeconfig-burst", 0, "Maximum client burst (proxy server uses this client to authenticate agent tokens).")]
        kubeconfig_burst: i64,
        #[flag("kube-api-content-type", "application/vnd.kubernetes.protobuf", "Content type of requests sent to apiserver.")]
        kube_api_content_type: String,
        #[flag("authentication-audience", "", "Expected agent's token authentication audience (used with agent-namespace, agent-service-account, kubeconfig).")]
        authentication_audience: String,
        #[flag("proxy-strategies", "default", "The list of proxy strategies used by the server to pick an agent/tunnel, available strategies are: default, destHost, defaultRoute.")]
        proxy_strategies: String,
        #[flag("cipher-suites", Vec::new(), "The comma separated list of allowed cipher suites. Has no effect on TLS1.3. Empty means allow default list.")]
        cipher_suites: Vec<String>,
        #[flag("tls-min-version", "", "Minimum TLS version for server connections. Accepted values: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13. Empty defaults to VersionTLS12.")]
        tls_min_version: String,
        #[flag("allow-expired-certificates", false, "Ours: start even if a certificate file holds a certificate that is expired or not yet valid (or a CA file none that is valid now), with a warning; without it that is a start-up error. Hot reloads refuse such files either way.")]
        allow_expired_certificates: bool,
        #[flag("xfr-channel-size", 10, "Packets queued per frontend connection towards kube-apiserver (gRPC mode; and, at least 16, per agent stream).")]
        xfr_channel_size: i64,
        #[flag("frontend-write-channel-size", 10, "Packets queued per HTTP-CONNECT frontend connection towards kube-apiserver (upstream after v0.36.0); one blocked frontend never stalls the others. Upstream's 0 (synchronous writes, which let one blocked frontend stall its agent stream) is taken as 1.")]
        frontend_write_channel_size: i64,
        #[flag("enable-lease-controller", false, "Enable lease controller to publish and garbage collect proxy server leases.")]
        enable_lease_controller: bool,
        #[flag("lease-namespace", "kube-system", "The namespace where lease objects are managed by the controller.")]
        lease_namespace: String,
        #[flag("lease-label", "k8s-app=konnectivity-server", "The labels on which the lease objects are managed.")]
        lease_label: String,
        #[flag("graceful-shutdown-timeout", Duration::ZERO, "How long live tunnels may continue after SIGTERM before they are cut. 0 stops at once.")]
        graceful_shutdown_timeout: Duration,
        #[flag("backend-dial-timeout", DEFAULT_BACKEND_DIAL_TIMEOUT, "Deadline for sending DIAL_REQ to an agent and receiving its DIAL_RSP. 0 means the 60s maximum.")]
        backend_dial_timeout: Duration,
        #[flag("max-pending-dials-per-agent", crate::limits::DEFAULT_MAX_PENDING_DIALS_PER_AGENT as i64, "Ours: unanswered dials one agent stream may hold; past it a new dial goes to another agent that serves its address, or fails at once (HTTP 503, or a DIAL_RSP error). 0 for no bound (upstream).")]
        max_pending_dials_per_agent: i64,
        #[flag("resend-unanswered-dials", true, "Ours: a dial not yet answered whose agent disconnects or starts draining is sent once to another agent that serves its address, within its deadline. false fails it (agent lost) or leaves it with the draining agent, as upstream does.")]
        resend_unanswered_dials: bool,
        #[flag("max-pending-dials-per-destination", crate::limits::DEFAULT_MAX_PENDING_DIALS_PER_DESTINATION as i64, "Ours: unanswered dials one agent stream may hold to one address (host:port), so one destination that never answers cannot take the whole --max-pending-dials-per-agent. 0 for no bound (upstream).")]
        max_pending_dials_per_destination: i64,
        #[flag("frontend-stall-timeout", Duration::from_secs(10), "How long a frontend may leave its queue full before only its connection is closed (protects the shared agent stream).")]
        frontend_stall_timeout: Duration,
        #[flag("flow-control-window", link::flow::DEFAULT_INITIAL_WINDOW, "Ours: initial per-connection flow-control window (bytes) with agents of this project; windows grow with the link up to --flow-control-max-window. 0 turns flow control off. Upstream agents never ask for it.")]
        flow_control_window: Given<i64>,
        #[flag("flow-control-max-window", link::flow::DEFAULT_MAX_WINDOW, "Ours: largest per-connection flow-control window (bytes), per direction.")]
        flow_control_max_window: Given<i64>,
        #[flag("flow-control-agent-budget", link::flow::DEFAULT_LINK_BUDGET, "Ours: bytes the connections of one agent stream may have in flight towards this server together; windows stop growing when it is used.")]
        flow_control_agent_budget: Given<i64>,
        #[flag("flow-control-budget", link::flow::DEFAULT_PROCESS_BUDGET, "Ours: bytes the connections of all agent streams may have in flight towards this server together, HTTP/2 windows of the agent streams included.")]
        flow_control_budget: Given<i64>,
        #[flag("agent-http2-max-window", i64::from(link::flow::DEFAULT_HTTP2_MAX_WINDOW), "Ours: largest HTTP/2 receive window (bytes) of one agent connection; it grows from 1 MiB as the link needs (as grpc-go's BDP estimator does, up to 16 MiB there).")]
        agent_http2_max_window: Given<i64>,
        #[flag("warn-on-channel-limit", true, "Deprecated no-op.", deprecated("This behavior is now thread safe and always on. This flag will be removed in a future release."))]
        warn_on_channel_limit: bool,
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

/// The Kubernetes-facing features the flags turn on (token authentication,
/// the lease controller); both need a kube client.
#[derive(Debug, Clone, Default)]
pub struct Kubernetes {
    pub token_auth: Option<crate::auth::TokenAuthConfig>,
    pub leases: Option<crate::leases::LeaseConfig>,
}

impl Kubernetes {
    pub fn is_empty(&self) -> bool {
        self.token_auth.is_none() && self.leases.is_none()
    }
}

/// `--otlp-traces-endpoint`, when given.
pub fn otlp_traces(f: &Flags) -> Result<Option<crate::otlp::Endpoint>, String> {
    match f.otlp_traces_endpoint.as_str() {
        "" => Ok(None),
        s => crate::otlp::Endpoint::parse(s).map(Some),
    }
}

/// Reads the token-authentication and lease flags (validated by [`parse`]).
pub fn kubernetes(v: &Values) -> Result<Kubernetes, String> {
    let f = Flags::from_values(v);
    let kubeconfig = f.kubeconfig.existing_file()?;
    let content_type = f.kube_api_content_type;
    let token_auth = if f.agent_namespace.is_empty() {
        None
    } else {
        let qps = f.kubeconfig_qps;
        if qps < 0.0 {
            return Err(format!("--kubeconfig-qps must not be negative, got {qps}"));
        }
        let burst = u32::try_from(f.kubeconfig_burst)
            .map_err(|_| "--kubeconfig-burst must not be negative".to_string())?;
        Some(crate::auth::TokenAuthConfig {
            namespace: f.agent_namespace,
            service_account: f.agent_service_account,
            audience: f.authentication_audience,
            kubeconfig: kubeconfig.clone(),
            qps,
            burst,
        })
    };
    let leases = if f.enable_lease_controller {
        Some(crate::leases::LeaseConfig {
            namespace: f.lease_namespace,
            labels: crate::leases::parse_labels(&f.lease_label)?,
            kubeconfig: kubeconfig.clone(),
            duration: crate::leases::LEASE_DURATION,
            renew_interval: crate::leases::RENEW_INTERVAL,
            gc_interval: crate::leases::GC_INTERVAL,
        })
    } else {
        None
    };
    let k = Kubernetes { token_auth, leases };
    if !k.is_empty() && content_type != "application/json" {
        tracing::debug!(%content_type, "--kube-api-content-type: requests are sent as application/json");
    }
    Ok(k)
}

/// Where the frontend listens, from the flags.
#[derive(Debug, Clone)]
pub enum FrontendAddr {
    Unix {
        path: PathBuf,
        delete_existing: bool,
    },
    Tcp {
        host: String,
        port: u16,
    },
}

/// Every listening address, from the flags.
#[derive(Debug, Clone)]
pub struct Addresses {
    pub frontend: FrontendAddr,
    pub agent: (String, u16),
    pub health: (String, u16),
    pub admin: (String, u16),
}

const FRONTEND_FILES: FileFlags = FileFlags {
    cert: "server-cert",
    key: "server-key",
    ca: "server-ca-cert",
};
const AGENT_FILES: FileFlags = FileFlags {
    cert: "cluster-cert",
    key: "cluster-key",
    ca: "cluster-ca-cert",
};

/// A listener's TLS configuration, rebuilt when its files change.
fn reloading_server_config(
    name: &'static str,
    flags: FileFlags,
    files: Files,
    policy: &TlsPolicy,
    alpn: &[&[u8]],
    at_start: AtStart,
) -> Result<Reloading<rustls::ServerConfig>, String> {
    let policy = policy.clone();
    let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
    Reloading::from_files(name, flags, files, at_start, move |f| {
        let alpn: Vec<&[u8]> = alpn.iter().map(Vec::as_slice).collect();
        match (&f.cert, &f.key) {
            (Some(cert), Some(key)) => {
                tls::server_config(cert, key, f.ca.as_deref(), &policy, &alpn)
            }
            _ => Err(tls::TlsError::Verifier(
                "a listener needs a certificate and key".into(),
            )),
        }
    })
}

fn port(flag: &Given<i64>) -> Result<u16, String> {
    let p = flag.value;
    // 0 picks a free port (tests, local runs); otherwise upstream's range.
    if p == 0 || (1024..=49151).contains(&p) {
        Ok(p as u16)
    } else {
        Err(format!(
            "please do not try to use reserved port {p} for --{}; use 1024-49151, or 0 for any free port",
            flag.name()
        ))
    }
}

fn pair(cert: &Given<String>, key: &Given<String>) -> Result<Option<(PathBuf, PathBuf)>, String> {
    match (cert.existing_file()?, key.existing_file()?) {
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (None, None) => Ok(None),
        _ => Err(format!(
            "--{} and --{} must be set together",
            cert.name(),
            key.name()
        )),
    }
}

/// The flow-control flags (`--flow-control-window=0` turns it off).
pub fn flow(v: &Values) -> Result<link::flow::FlowSettings, String> {
    flow_settings(&Flags::from_values(v))
}

fn flow_settings(f: &Flags) -> Result<link::flow::FlowSettings, String> {
    let flags = [
        &f.flow_control_window,
        &f.flow_control_max_window,
        &f.flow_control_agent_budget,
        &f.flow_control_budget,
    ];
    let mut s = link::flow::settings_from_flags(flags.map(|f| f.value), flags.map(|f| f.name()))?;
    s.http2_max_window = link::flow::http2_window_from_flag(
        f.agent_http2_max_window.value,
        f.agent_http2_max_window.name(),
    )?;
    Ok(s)
}

/// A keepalive time as grpc-go's server applies it: 0 is its default of two
/// hours, anything shorter than 1 s is raised to 1 s.
pub fn grpc_server_keepalive(d: Duration) -> Duration {
    if d.is_zero() {
        Duration::from_secs(2 * 3600)
    } else {
        d.max(Duration::from_secs(1))
    }
}

/// Validates the flags into the server configuration and its addresses.
pub fn parse(v: &Values) -> Result<(Config, Addresses), String> {
    let f = Flags::from_values(v);
    let mode = match f.mode.as_str() {
        "grpc" => Mode::Grpc,
        "http-connect" => Mode::HttpConnect,
        other => {
            return Err(format!(
                "mode must be set to either 'grpc' or 'http-connect', got {other:?}"
            ));
        }
    };
    // Plain value checks first, so their errors are not hidden behind file ones.
    let strategies = Strategy::parse_list(&f.proxy_strategies)?;
    let at_start = if f.allow_expired_certificates {
        AtStart::Warn
    } else {
        AtStart::Refuse
    };
    let policy =
        TlsPolicy::from_flags(&f.tls_min_version, &f.cipher_suites).map_err(|e| e.to_string())?;

    let uds = f.uds_name.clone();
    let server_pair = pair(&f.server_cert, &f.server_key)?;
    let server_ca = f.server_ca_cert.existing_file()?;
    let alpn: &[&[u8]] = match mode {
        Mode::Grpc => &[b"h2"],
        Mode::HttpConnect => &[b"http/1.1"],
    };
    let (frontend, frontend_tls) = if uds.is_empty() {
        let Some((cert, key)) = server_pair else {
            return Err(
                "a TCP frontend needs --server-cert and --server-key (or set --uds-name)".into(),
            );
        };
        let Some(ca) = server_ca else {
            return Err("a TCP frontend needs --server-ca-cert: kube-apiserver clients must present certificates".into());
        };
        let files = Files {
            cert: Some(cert),
            key: Some(key),
            ca: Some(ca),
        };
        let tls =
            reloading_server_config("frontend", FRONTEND_FILES, files, &policy, alpn, at_start)?;
        let host = f.server_bind_address.clone();
        (
            FrontendAddr::Tcp {
                host,
                port: port(&f.server_port)?,
            },
            Some(tls),
        )
    } else {
        if f.server_port.value != 0 {
            return Err("--server-port must be 0 when --uds-name is set".into());
        }
        if server_pair.is_some() || server_ca.is_some() {
            return Err(
                "--server-cert, --server-key and --server-ca-cert must not be set with --uds-name"
                    .into(),
            );
        }
        (
            FrontendAddr::Unix {
                path: PathBuf::from(uds),
                delete_existing: f.delete_existing_uds_file,
            },
            None,
        )
    };

    let Some((cluster_cert, cluster_key)) = pair(&f.cluster_cert, &f.cluster_key)? else {
        return Err(
            "--cluster-cert and --cluster-key are required: the agent listener always uses TLS"
                .into(),
        );
    };
    let cluster_ca = f.cluster_ca_cert.existing_file()?;

    let token_flags = [
        &f.agent_namespace,
        &f.agent_service_account,
        &f.authentication_audience,
    ];
    if token_flags.iter().any(|f| !f.is_empty()) {
        if token_flags.iter().any(|f| f.is_empty()) {
            return Err("token authentication needs all of --agent-namespace, --agent-service-account and --authentication-audience".into());
        }
        if cluster_ca.is_some() {
            return Err("--cluster-ca-cert cannot be used with agent token authentication".into());
        }
    }
    f.kubeconfig.existing_file()?;
    if f.enable_lease_controller {
        crate::leases::parse_labels(&f.lease_label)?;
    }

    let files = Files {
        cert: Some(cluster_cert),
        key: Some(cluster_key),
        ca: cluster_ca,
    };
    let agent_tls =
        reloading_server_config("agent", AGENT_FILES, files, &policy, &[b"h2"], at_start)?;
    let xfr = f.xfr_channel_size;
    if xfr <= 0 {
        return Err(format!(
            "--xfr-channel-size must be greater than 0, got {xfr}"
        ));
    }
    let xfr = usize::try_from(xfr).map_err(|_| "--xfr-channel-size is too large".to_string())?;
    let write_queue = f.frontend_write_channel_size;
    if write_queue < 0 {
        return Err(format!(
            "--frontend-write-channel-size must not be negative, got {write_queue}"
        ));
    }
    // Upstream's 0 writes synchronously from the agent stream's loop; ours
    // never does, so 0 is a queue of one packet.
    let write_queue = usize::try_from(write_queue.max(1))
        .map_err(|_| "--frontend-write-channel-size is too large".to_string())?;
    let server_count = u32::try_from(f.server_count)
        .map_err(|_| "--server-count must be a non-negative count".to_string())?;
    let mut dial_timeout = f.backend_dial_timeout;
    if dial_timeout.is_zero() || dial_timeout > MAX_BACKEND_DIAL_TIMEOUT {
        tracing::warn!(
            requested = %go_compat::duration::format(dial_timeout),
            applied = %go_compat::duration::format(MAX_BACKEND_DIAL_TIMEOUT),
            "--backend-dial-timeout capped: pending dials always get a deadline"
        );
        dial_timeout = MAX_BACKEND_DIAL_TIMEOUT;
    }
    let pending_bound = |name: &str, v: i64| {
        usize::try_from(v)
            .map_err(|_| format!("--{name} must be a non-negative count (0 for no bound), got {v}"))
    };
    let max_pending_per_agent =
        pending_bound("max-pending-dials-per-agent", f.max_pending_dials_per_agent)?;
    let max_pending_per_destination = pending_bound(
        "max-pending-dials-per-destination",
        f.max_pending_dials_per_destination,
    )?;
    let server_id = match f.server_id.clone() {
        s if !s.is_empty() => s,
        _ => std::env::var("PROXY_SERVER_ID")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
    };
    if f.enable_contention_profiling && !f.enable_profiling {
        return Err(
            "if --enable-contention-profiling is set, --enable-profiling must also be set".into(),
        );
    }
    if f.enable_profiling && !daemon::endpoints::PROFILER_BUILT_IN {
        tracing::warn!("{}", daemon::endpoints::NO_PROFILER);
    }
    if f.enable_contention_profiling {
        tracing::warn!(
            "--enable-contention-profiling has no effect: Go's block profile has no counterpart here"
        );
    }

    if !(f.agent_accept_rate >= 0.0 && f.agent_accept_rate.is_finite()) {
        return Err(format!(
            "--agent-accept-rate must be a number of connections per second, 0 or more, got {}",
            f.agent_accept_rate
        ));
    }

    let config = Config {
        mode,
        frontend_tls,
        agent_tls,
        server_id: ServerId(server_id),
        server_count,
        strategies,
        core: CoreConfig {
            dial_timeout,
            stall_timeout: f.frontend_stall_timeout.max(Duration::from_millis(100)),
            // Per frontend connection: upstream sizes gRPC frontends' queues
            // with --xfr-channel-size and HTTP-CONNECT ones' with
            // --frontend-write-channel-size.
            frontend_queue: match mode {
                Mode::Grpc => xfr,
                Mode::HttpConnect => write_queue,
            },
            agent_queue: xfr.max(16),
            flow: flow_settings(&f)?,
            max_pending_per_agent,
            max_pending_per_destination,
            resend_dials: f.resend_unanswered_dials,
        },
        keepalive_time: grpc_server_keepalive(f.keepalive_time),
        keepalive_timeout: f.keepalive_timeout,
        frontend_keepalive_time: grpc_server_keepalive(f.frontend_keepalive_time),
        graceful_shutdown_timeout: f.graceful_shutdown_timeout,
        agent_accept_rate: f.agent_accept_rate,
        frontend_flood_penalty: f.frontend_flood_penalty,
    };
    let addrs = Addresses {
        frontend,
        agent: (f.agent_bind_address.clone(), port(&f.agent_port)?),
        health: (f.health_bind_address.clone(), port(&f.health_port)?),
        admin: (
            Some(f.admin_bind_address.clone())
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| "127.0.0.1".into()),
            port(&f.admin_port)?,
        ),
    };
    Ok((config, addrs))
}
