//! Runs proxy-server and proxy-agent in-process on loopback (port 0, temp
//! Unix sockets), the way `main.rs` does, and hands back handles to wait on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use konnectivity_proto::ids::{AgentId, ServerId};
use proxy_agent::{Agent, AgentHandle, Connector, SessionConfig, SyncConfig};
use proxy_server::{
    Config, CoreConfig, FrontendListener, Listeners, Mode, Server, ServerHandle, Strategy,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::certs::Pki;
use crate::client::Frontend;

/// Installs a test log subscriber once (RUST_LOG controls it).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// How a test server is set up.
#[derive(Clone)]
pub struct ServerOpts {
    pub mode: Mode,
    /// Frontend on TCP with mTLS instead of a Unix socket.
    pub tcp_frontend: bool,
    pub strategies: Vec<Strategy>,
    pub server_id: String,
    pub server_count: u32,
    pub dial_timeout: Duration,
    pub stall_timeout: Duration,
    pub frontend_queue: usize,
    /// Require client certificates from agents.
    pub agent_mtls: bool,
    pub grace: Duration,
    /// Reuse this agent port (server restarts).
    pub agent_port: u16,
    /// The loopback address the agent port is bound to (several servers on
    /// one port, as behind one DNS name).
    pub agent_host: &'static str,
    /// Offer per-connection flow control to agents that ask.
    pub flow_control: bool,
    /// `--otlp-traces-endpoint`.
    pub otlp_traces: Option<String>,
    /// `--agent-accept-rate`.
    pub agent_accept_rate: f64,
    /// `--frontend-flood-penalty`.
    pub frontend_flood_penalty: Duration,
    /// `--resend-unanswered-dials`.
    pub resend_dials: bool,
    /// `--max-pending-dials-per-agent`, `--max-pending-dials-per-destination`.
    pub max_pending_per_agent: usize,
    pub max_pending_per_destination: usize,
}

impl ServerOpts {
    /// A server choosing agents by `strategies`, defaults otherwise.
    pub fn strategies(strategies: Vec<Strategy>) -> Self {
        ServerOpts {
            strategies,
            ..Default::default()
        }
    }
}

impl Default for ServerOpts {
    fn default() -> Self {
        ServerOpts {
            mode: Mode::Grpc,
            tcp_frontend: false,
            strategies: vec![Strategy::Default],
            server_id: String::new(),
            server_count: 1,
            dial_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(10),
            frontend_queue: 10,
            agent_mtls: true,
            grace: Duration::ZERO,
            agent_port: 0,
            agent_host: "127.0.0.1",
            flow_control: true,
            otlp_traces: None,
            agent_accept_rate: proxy_server::options::DEFAULT_AGENT_ACCEPT_RATE,
            frontend_flood_penalty: proxy_server::options::DEFAULT_FRONTEND_FLOOD_PENALTY,
            resend_dials: true,
            max_pending_per_agent: proxy_server::limits::DEFAULT_MAX_PENDING_DIALS_PER_AGENT,
            max_pending_per_destination:
                proxy_server::limits::DEFAULT_MAX_PENDING_DIALS_PER_DESTINATION,
        }
    }
}

/// A name test servers' certificates are valid for, to be resolved by a
/// test resolver to several loopback addresses.
pub const SERVERS_NAME: &str = "konnectivity-servers.test";

pub struct RunningServer {
    pub handle: ServerHandle,
    _watchdog: crate::Watchdog,
    pub frontend: Frontend,
    pub agent_addr: SocketAddr,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub uds: Option<PathBuf>,
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl RunningServer {
    /// Stops the server and waits until it has released everything.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(j) = self.join.take() {
            let _ = j.await;
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

pub async fn start_server(pki: &Pki, opts: ServerOpts) -> RunningServer {
    let dir = tempfile::tempdir().unwrap();
    let server_cert = pki.server("proxy-server", &["127.0.0.2", "127.0.0.3", SERVERS_NAME]);
    let policy = daemon::tls::TlsPolicy::default();
    let agent_ca = opts.agent_mtls.then(|| pki.ca());
    let agent_tls = daemon::tls::server_config(
        &server_cert.cert,
        &server_cert.key,
        agent_ca.as_deref(),
        &policy,
        &[b"h2"],
    )
    .unwrap();
    let alpn: &[&[u8]] = match opts.mode {
        Mode::Grpc => &[b"h2"],
        Mode::HttpConnect => &[b"http/1.1"],
    };
    let (frontend_listener, frontend, frontend_tls, uds) = if opts.tcp_frontend {
        let tls = daemon::tls::server_config(
            &server_cert.cert,
            &server_cert.key,
            Some(&pki.ca()),
            &policy,
            alpn,
        )
        .unwrap();
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let client = pki.client("kube-apiserver");
        let client_tls = daemon::tls::client_config(
            &pki.ca(),
            Some((&client.cert, &client.key)),
            &[alpn[0].to_vec()],
        )
        .unwrap();
        (
            FrontendListener::Tcp(l),
            Frontend::Tcp {
                addr,
                tls: Arc::new(client_tls),
            },
            Some(Arc::new(tls).into()),
            None,
        )
    } else {
        let path = dir.path().join("konnectivity-server.socket");
        let l = daemon::listen::bind_unix(&path, true).unwrap();
        (
            FrontendListener::Unix(l),
            Frontend::Uds(path.clone()),
            None,
            Some(path),
        )
    };
    let agent = daemon::listen::bind_tcp(opts.agent_host, opts.agent_port)
        .await
        .unwrap();
    let health = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (agent_addr, health_addr, admin_addr) = (
        agent.local_addr().unwrap(),
        health.local_addr().unwrap(),
        admin.local_addr().unwrap(),
    );
    let server_id = if opts.server_id.is_empty() {
        format!("server-{}", agent_addr.port())
    } else {
        opts.server_id.clone()
    };
    let config = Config {
        mode: opts.mode,
        frontend_tls,
        agent_tls: Arc::new(agent_tls).into(),
        server_id: ServerId(server_id),
        server_count: opts.server_count,
        strategies: opts.strategies.clone(),
        core: CoreConfig {
            dial_timeout: opts.dial_timeout,
            stall_timeout: opts.stall_timeout,
            frontend_queue: opts.frontend_queue,
            agent_queue: 64,
            flow: link::flow::FlowSettings {
                enabled: opts.flow_control,
                ..Default::default()
            },
            max_pending_per_agent: opts.max_pending_per_agent,
            max_pending_per_destination: opts.max_pending_per_destination,
            resend_dials: opts.resend_dials,
        },
        keepalive_time: proxy_server::options::KEEPALIVE_TIME,
        keepalive_timeout: proxy_server::options::KEEPALIVE_TIMEOUT,
        frontend_keepalive_time: Duration::from_secs(3600),
        graceful_shutdown_timeout: opts.grace,
        agent_accept_rate: opts.agent_accept_rate,
        frontend_flood_penalty: opts.frontend_flood_penalty,
    };
    let server = Server::new(config).with_otlp_traces(
        opts.otlp_traces
            .as_deref()
            .map(|e| proxy_server::otlp::Endpoint::parse(e).unwrap()),
    );
    let handle = server.handle();
    let (stop, stop_rx) = oneshot::channel::<()>();
    let listeners = Listeners {
        frontend: frontend_listener,
        agent,
        health,
        admin,
    };
    let join = tokio::spawn(async move {
        let _ = server
            .run(listeners, async {
                let _ = stop_rx.await;
            })
            .await;
    });
    RunningServer {
        handle,
        _watchdog: crate::watchdog(Duration::from_secs(180)),
        frontend,
        agent_addr,
        health_addr,
        admin_addr,
        uds,
        stop: Some(stop),
        join: Some(join),
        _dir: dir,
    }
}

/// How a test agent is set up.
#[derive(Clone)]
pub struct AgentOpts {
    pub id: String,
    pub identifiers: String,
    /// Present a client certificate.
    pub client_cert: bool,
    pub sync_interval: Duration,
    pub conn_queue: usize,
    pub stall_timeout: Duration,
    /// Offer per-connection flow control to the server.
    pub flow_control: bool,
    /// `--allowed-destinations`.
    pub policy: proxy_agent::dial::policy::DestinationPolicy,
    /// Several servers (a list, or a name resolved to many addresses); the
    /// first host is the connector's. Empty: the `server` address only.
    pub servers: proxy_agent::servers::Servers,
    /// `--otlp-traces-endpoint`.
    pub otlp_traces: Option<String>,
}

impl AgentOpts {
    /// An agent announcing `identifiers` (URL-query form), defaults otherwise.
    pub fn identifiers(identifiers: &str) -> Self {
        AgentOpts {
            identifiers: identifiers.into(),
            ..Default::default()
        }
    }
}

impl Default for AgentOpts {
    fn default() -> Self {
        AgentOpts {
            id: String::new(),
            identifiers: String::new(),
            client_cert: true,
            sync_interval: Duration::from_millis(100),
            conn_queue: 150,
            stall_timeout: Duration::from_secs(10),
            flow_control: true,
            policy: Default::default(),
            servers: Default::default(),
            otlp_traces: None,
        }
    }
}

pub struct RunningAgent {
    pub handle: AgentHandle,
    pub health_addr: SocketAddr,
    /// Serves `/debug/connections`.
    pub admin_addr: SocketAddr,
    drain: Option<oneshot::Sender<()>>,
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<()>>,
}

impl RunningAgent {
    /// First SIGTERM: DRAIN on every stream, keep serving.
    pub fn drain(&mut self) {
        if let Some(tx) = self.drain.take() {
            let _ = tx.send(());
        }
    }

    /// Stops the agent and waits until its streams and connections are gone.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(j) = self.join.take() {
            let _ = j.await;
        }
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A server routing by `strategies` and one agent per entry of `identifiers`
/// (`--agent-identifiers` values), returned once every agent's stream is up.
pub async fn start_routed<const N: usize>(
    pki: &Pki,
    strategies: Vec<Strategy>,
    identifiers: [&str; N],
) -> (RunningServer, [RunningAgent; N]) {
    let server = start_server(pki, ServerOpts::strategies(strategies)).await;
    let mut agents = Vec::with_capacity(N);
    for ids in identifiers {
        agents.push(start_agent(pki, server.agent_addr, AgentOpts::identifiers(ids)).await);
    }
    server.handle.wait_until(|h| h.agent_streams() == N).await;
    match agents.try_into() {
        Ok(agents) => (server, agents),
        Err(_) => unreachable!("one agent per identifier"),
    }
}

pub async fn start_agent(pki: &Pki, server: SocketAddr, opts: AgentOpts) -> RunningAgent {
    let id = if opts.id.is_empty() {
        format!("agent-{}", rand_suffix())
    } else {
        opts.id.clone()
    };
    let identity = opts.client_cert.then(|| pki.client(&id));
    let tls = daemon::tls::client_config(
        &pki.ca(),
        identity
            .as_ref()
            .map(|i| (i.cert.as_path(), i.key.as_path())),
        &[b"h2".to_vec()],
    )
    .unwrap();
    let health = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health_addr = health.local_addr().unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let (host, port) = opts
        .servers
        .hosts
        .first()
        .cloned()
        .unwrap_or_else(|| (server.ip().to_string(), server.port()));
    let flow = link::flow::FlowPool::new(link::flow::FlowSettings {
        enabled: opts.flow_control,
        ..Default::default()
    });
    let config = proxy_agent::Config {
        connector: Connector {
            host,
            port,
            addr: None,
            tls: Arc::new(tls).into(),
            agent_id: AgentId(id),
            identifiers: opts.identifiers.clone(),
            token_path: None,
            keepalive: proxy_agent::options::KEEPALIVE_TIME,
            keepalive_timeout: proxy_agent::options::KEEPALIVE_TIMEOUT,
            keepalive_min_interval: proxy_agent::connect::MIN_PING_GAP,
            flow: flow.clone(),
            egress: Default::default(),
        },
        sync: SyncConfig {
            interval: opts.sync_interval,
            interval_cap: opts.sync_interval * 10,
            forever: false,
            servers: opts.servers.clone(),
        },
        session: SessionConfig {
            dial_timeout: proxy_agent::dial::DIAL_TIMEOUT,
            conn_queue: opts.conn_queue,
            stall_timeout: opts.stall_timeout,
            policy: Arc::new(opts.policy.clone()),
            flow,
            dialer: Default::default(),
            otlp: opts.otlp_traces.as_deref().map(|e| {
                Arc::new(daemon::otlp::Exporter::new(
                    daemon::otlp::Endpoint::parse(e).unwrap(),
                    "proxy-agent",
                ))
            }),
        },
    };
    let agent = Agent::new(config);
    let handle = agent.handle();
    let (drain_tx, drain_rx) = oneshot::channel::<()>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let join = tokio::spawn(agent.run(
        proxy_agent::Listeners { health, admin },
        async {
            if drain_rx.await.is_err() {
                std::future::pending::<()>().await
            }
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    RunningAgent {
        handle,
        health_addr,
        admin_addr,
        drain: Some(drain_tx),
        stop: Some(stop_tx),
        join: Some(join),
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A server and one connected agent.
pub struct Stack {
    pub pki: Pki,
    pub server: RunningServer,
    pub agent: RunningAgent,
}

impl Stack {
    pub async fn start(opts: ServerOpts) -> Stack {
        init_logging();
        let pki = Pki::new();
        let server = start_server(&pki, opts).await;
        let agent = start_agent(&pki, server.agent_addr, AgentOpts::default()).await;
        agent.handle.wait_connected(1).await;
        server.handle.wait_for_agents(1).await;
        Stack { pki, server, agent }
    }
}

pub use crate::http_get;

/// A hand-driven agent stream: the test sends and receives the packets, to
/// play an agent that misbehaves (never answers, sends odd ids).
pub struct RawAgent {
    pub tx: tokio::sync::mpsc::Sender<konnectivity_proto::Packet>,
    pub rx: tonic::Streaming<konnectivity_proto::Packet>,
    pub server_id: String,
    pub server_count: u32,
}

/// Opens an agent stream with a client certificate named `id`.
pub async fn raw_agent(pki: &Pki, server: SocketAddr, id: &str, identifiers: &str) -> RawAgent {
    let identity = pki.client(id);
    let tls = daemon::tls::client_config(
        &pki.ca(),
        Some((&identity.cert, &identity.key)),
        &[b"h2".to_vec()],
    )
    .unwrap();
    let connector = Connector {
        host: server.ip().to_string(),
        port: server.port(),
        addr: None,
        tls: Arc::new(tls).into(),
        agent_id: AgentId(id.to_string()),
        identifiers: identifiers.to_string(),
        token_path: None,
        keepalive: proxy_agent::options::KEEPALIVE_TIME,
        keepalive_timeout: proxy_agent::options::KEEPALIVE_TIMEOUT,
        keepalive_min_interval: proxy_agent::connect::MIN_PING_GAP,
        flow: link::flow::FlowPool::new(link::flow::FlowSettings {
            enabled: false,
            ..Default::default()
        }),
        egress: Default::default(),
    };
    let c = connector.connect(64).await.unwrap();
    RawAgent {
        tx: c.outbound,
        rx: c.inbound,
        server_id: c.server_id.0,
        server_count: c.server_count,
    }
}

/// An agent that connects and never answers anything.
pub async fn silent_agent(pki: &Pki, server: SocketAddr) -> RawAgent {
    raw_agent(pki, server, &format!("silent-{}", rand_suffix()), "").await
}

/// A TCP load balancer on loopback that sends each new connection to the
/// next backend in turn, like the Service in front of HA proxy servers.
pub async fn round_robin(backends: Vec<SocketAddr>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut i = 0usize;
        while let Ok((mut inbound, _)) = l.accept().await {
            let target = backends[i % backends.len()];
            i += 1;
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    addr
}

/// The value of the first sample whose line starts with `prefix`.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Dials an agent has completed successfully (its dial-latency sample count).
pub fn agent_dials(agent: &AgentHandle) -> f64 {
    metric(
        &agent.metrics(),
        "konnectivity_network_proxy_agent_dial_duration_seconds_count",
    )
}
