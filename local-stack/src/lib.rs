//! The whole data path on one machine, all on loopback, from an embedded
//! default: proxy-server (HTTP-CONNECT over mTLS TCP, which curl can speak;
//! kube-apiserver's Unix-socket frontend is covered by the tests), proxy-agent, nodeport-proxy (NodePort, SNI and tunneling
//! listeners on unprivileged ports, routes from its embedded demo table),
//! tunnel-agent, and two destinations. Each component runs from its library,
//! exactly as its binary would.

pub mod destinations;
pub mod pki;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use daemon::drain::Drain;
use konnectivity_proto::ids::{AgentId, ServerId};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The SNI name and tunneling authority of the demo cluster (see
/// nodeport-proxy's embedded table).
pub const DEMO_SNI_HOST: &str = "demo.seed.example.com";
pub const DEMO_AUTHORITY_HOST: &str = "apiserver-external.cluster-demo.svc.cluster.local";
/// The demo echo Service's tunneling authority host; its port is 7000.
pub const DEMO_ECHO_AUTHORITY_HOST: &str = "echo.cluster-demo.svc.cluster.local";

/// Ports the demo listens on. The destinations and node ports are the ones
/// in nodeport-proxy's embedded table.
#[derive(Debug, Clone)]
pub struct Ports {
    pub apiserver: u16,
    pub echo: u16,
    pub konnectivity: u16,
    pub sni: u16,
    pub tunneling: u16,
    pub stats: u16,
    /// nodeport-proxy's admin port (`/debug/connections`).
    pub admin: u16,
    pub tunnel_agent: u16,
    /// tunnel-agent's admin port (`/debug/connections`).
    pub tunnel_agent_admin: u16,
    pub node_port_tls: u16,
    pub node_port_echo: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            apiserver: 16443,
            echo: 17000,
            konnectivity: 8090,
            sni: 8443,
            tunneling: 8088,
            stats: 8002,
            admin: 9001,
            tunnel_agent: 16444,
            tunnel_agent_admin: 9902,
            node_port_tls: 30443,
            node_port_echo: 30700,
        }
    }
}

pub struct Running {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    /// Client certificate for the Konnectivity frontend (kube-apiserver's role).
    pub frontend_client: pki::Identity,
    pub ports: Ports,
    pub server_health: SocketAddr,
    /// Admin ports (`/debug/connections`).
    pub server_admin: SocketAddr,
    pub agent_admin: SocketAddr,
    pub agent: proxy_agent::AgentHandle,
    server_stop: Option<oneshot::Sender<()>>,
    agent_stop: Option<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
    nodeport: nodeport_proxy::NodePortProxy,
    tunnel: tunnel_agent::TunnelAgent,
    destinations: Drain,
}

async fn bind(port: u16, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("binding 127.0.0.1:{port} for {what} (is another copy running?)"))
}

/// The directory the keys go in: readable by its owner only (0700).
fn private_dir() -> anyhow::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt as _;
    tempfile::Builder::new()
        .prefix("local-stack-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("creating a private temporary directory for the keys")
}

/// Starts everything; returns once every component is listening and the
/// agents are connected.
pub async fn start(ports: Ports) -> anyhow::Result<Running> {
    let dir = private_dir()?;
    let pki = pki::Pki::create(dir.path())?;
    let apiserver_cert = pki.server("demo-apiserver", &[DEMO_SNI_HOST, DEMO_AUTHORITY_HOST])?;
    let server_cert = pki.server("proxy-server", &[])?;
    let agent_cert = pki.client("proxy-agent")?;
    let frontend_client = pki.client("kube-apiserver")?;
    let destinations = Drain::new();

    // Destinations.
    let tls = daemon::tls::server_config(
        &apiserver_cert.cert,
        &apiserver_cert.key,
        None,
        &Default::default(),
        &[b"http/1.1"],
    )?;
    let mut tasks = vec![
        tokio::spawn(destinations::apiserver(
            bind(ports.apiserver, "the demo apiserver").await?,
            Arc::new(tls),
            destinations.clone(),
        )),
        tokio::spawn(destinations::echo(
            bind(ports.echo, "the demo echo").await?,
            destinations.clone(),
        )),
    ];

    // Konnectivity: HTTP-CONNECT frontend over mTLS TCP, agent over mTLS.
    let frontend_tls = daemon::tls::server_config(
        &server_cert.cert,
        &server_cert.key,
        Some(&pki.ca()),
        &Default::default(),
        &[b"http/1.1"],
    )?;
    let agent_tls = daemon::tls::server_config(
        &server_cert.cert,
        &server_cert.key,
        Some(&pki.ca()),
        &Default::default(),
        &[b"h2"],
    )?;
    let agent_listener = bind(0, "the agent port").await?;
    let server_health_listener = bind(0, "the server health port").await?;
    let agent_addr = agent_listener.local_addr()?;
    let server_health = server_health_listener.local_addr()?;
    let listeners = proxy_server::Listeners {
        frontend: proxy_server::FrontendListener::Tcp(
            bind(ports.konnectivity, "the Konnectivity frontend").await?,
        ),
        agent: agent_listener,
        health: server_health_listener,
        admin: bind(0, "the server admin port").await?,
    };
    let server_admin = listeners.admin.local_addr()?;
    let server = proxy_server::Server::new(proxy_server::Config {
        mode: proxy_server::Mode::HttpConnect,
        frontend_tls: Some(Arc::new(frontend_tls).into()),
        agent_tls: Arc::new(agent_tls).into(),
        server_id: ServerId("local-stack".into()),
        server_count: 1,
        strategies: vec![proxy_server::Strategy::Default],
        core: proxy_server::CoreConfig {
            dial_timeout: proxy_server::options::DEFAULT_BACKEND_DIAL_TIMEOUT,
            stall_timeout: Duration::from_secs(10),
            frontend_queue: 10,
            agent_queue: 64,
            flow: link::flow::FlowSettings::default(),
            max_pending_per_agent: proxy_server::limits::DEFAULT_MAX_PENDING_DIALS_PER_AGENT,
            max_pending_per_destination:
                proxy_server::limits::DEFAULT_MAX_PENDING_DIALS_PER_DESTINATION,
            resend_dials: true,
        },
        keepalive_time: proxy_server::options::KEEPALIVE_TIME,
        keepalive_timeout: proxy_server::options::KEEPALIVE_TIMEOUT,
        frontend_keepalive_time: Duration::from_secs(3600),
        graceful_shutdown_timeout: Duration::from_secs(1),
        agent_accept_rate: proxy_server::options::DEFAULT_AGENT_ACCEPT_RATE,
        frontend_flood_penalty: proxy_server::options::DEFAULT_FRONTEND_FLOOD_PENALTY,
    });
    let server_handle = server.handle();
    let (server_stop, stop_rx) = oneshot::channel::<()>();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = server
            .run(listeners, async {
                let _ = stop_rx.await;
            })
            .await
        {
            tracing::error!(error = %e, "proxy-server stopped");
        }
    }));

    let client_tls = daemon::tls::client_config(
        &pki.ca(),
        Some((&agent_cert.cert, &agent_cert.key)),
        &[b"h2".to_vec()],
    )?;
    let agent_health = bind(0, "the agent health port").await?;
    let flow = link::flow::FlowPool::new(link::flow::FlowSettings::default());
    let agent = proxy_agent::Agent::new(proxy_agent::Config {
        connector: proxy_agent::Connector {
            host: "127.0.0.1".into(),
            port: agent_addr.port(),
            addr: None,
            tls: Arc::new(client_tls).into(),
            agent_id: AgentId("local-stack-agent".into()),
            identifiers: String::new(),
            token_path: None,
            keepalive: proxy_agent::options::KEEPALIVE_TIME,
            keepalive_timeout: proxy_agent::options::KEEPALIVE_TIMEOUT,
            keepalive_min_interval: proxy_agent::connect::MIN_PING_GAP,
            flow: flow.clone(),
            egress: Default::default(),
        },
        sync: proxy_agent::SyncConfig {
            interval: Duration::from_secs(1),
            interval_cap: Duration::from_secs(10),
            forever: false,
            servers: Default::default(),
        },
        session: proxy_agent::SessionConfig {
            dial_timeout: proxy_agent::dial::DIAL_TIMEOUT,
            conn_queue: 150,
            stall_timeout: Duration::from_secs(10),
            policy: Default::default(),
            flow,
            dialer: Default::default(),
            otlp: None,
        },
    });
    let agent_handle = agent.handle();
    let (agent_stop, agent_stop_rx) = oneshot::channel::<()>();
    let agent_listeners = proxy_agent::Listeners {
        health: agent_health,
        admin: bind(0, "the agent admin port").await?,
    };
    let agent_admin = agent_listeners.admin.local_addr()?;
    tasks.push(tokio::spawn(agent.run(
        agent_listeners,
        std::future::pending(),
        async {
            let _ = agent_stop_rx.await;
        },
    )));

    // nodeport-proxy with its embedded table, and tunnel-agent in front of it.
    let nodeport = nodeport_proxy::NodePortProxy::start(
        nodeport_proxy::ProxyConfig {
            source: nodeport_proxy::TableSource::Inline(
                nodeport_proxy::sources::source::embedded_default(),
            ),
            node_port_bind_address: std::net::IpAddr::from([127, 0, 0, 1]),
            shutdown_delay: Duration::ZERO,
            drain_timeout: Duration::from_secs(1),
            ..Default::default()
        },
        nodeport_proxy::Listeners {
            stats: Some(bind(ports.stats, "nodeport-proxy stats").await?),
            admin: Some(bind(ports.admin, "nodeport-proxy admin").await?),
            sni: Some(bind(ports.sni, "nodeport-proxy SNI").await?),
            sni_slow_lane: None,
            tunneling: Some(bind(ports.tunneling, "nodeport-proxy tunneling").await?),
            node_ports: vec![
                bind(ports.node_port_tls, "a node port").await?,
                bind(ports.node_port_echo, "a node port").await?,
            ],
        },
    )
    .await?;
    let spec = tunnel_agent::ListenerSpec::parse(&format!(
        "127.0.0.1:{}={DEMO_AUTHORITY_HOST}:443",
        ports.tunnel_agent
    ))?;
    let tunnel = tunnel_agent::TunnelAgent::start(
        tunnel_agent::AgentConfig {
            proxy_host: "127.0.0.1".into(),
            proxy_port: ports.tunneling,
            listeners: vec![spec],
            drain_timeout: Duration::from_secs(1),
            ..Default::default()
        },
        tunnel_agent::AgentListeners {
            tunnels: vec![bind(ports.tunnel_agent, "tunnel-agent").await?],
            stats: None,
            admin: Some(bind(ports.tunnel_agent_admin, "tunnel-agent admin").await?),
        },
    )
    .await?;

    agent_handle.wait_connected(1).await;
    server_handle.wait_for_agents(1).await;
    tunnel.connected().await;
    Ok(Running {
        ca: pki.ca(),
        dir,
        frontend_client,
        ports,
        server_health,
        server_admin,
        agent_admin,
        agent: agent_handle,
        server_stop: Some(server_stop),
        agent_stop: Some(agent_stop),
        tasks,
        nodeport,
        tunnel,
        destinations,
    })
}

impl Running {
    /// Ready-to-paste commands that send traffic through each path.
    pub fn instructions(&self) -> String {
        let p = &self.ports;
        let ca = self.ca.display();
        let (cert, key) = (
            self.frontend_client.cert.display(),
            self.frontend_client.key.display(),
        );
        format!(
            "Local stack is up. Try:\n\n\
             # Konnectivity: HTTP-CONNECT over mTLS -> proxy-server -> proxy-agent -> echo, and -> TLS apiserver\n\
             curl -p --proxy https://127.0.0.1:{kon} --proxy-cacert {ca} --proxy-cert {cert} --proxy-key {key} http://127.0.0.1:{echo}/hello\n\
             curl -p --proxy https://127.0.0.1:{kon} --proxy-cacert {ca} --proxy-cert {cert} --proxy-key {key} --cacert {ca} https://localhost:{api}/version\n\n\
             # nodeport-proxy SNI passthrough -> TLS apiserver\n\
             curl --cacert {ca} --resolve {sni}:{sni_port}:127.0.0.1 https://{sni}:{sni_port}/version\n\n\
             # nodeport-proxy HTTP/1.1 CONNECT tunneling -> TLS apiserver\n\
             curl --cacert {ca} -p -x http://127.0.0.1:{tunneling} https://{auth}:443/version\n\n\
             # nodeport-proxy HTTP/2 CONNECT via tunnel-agent -> TLS apiserver\n\
             curl --cacert {ca} --resolve {auth}:{ta}:127.0.0.1 https://{auth}:{ta}/version\n\n\
             # nodeport-proxy NodePort listeners -> TLS apiserver, and -> echo\n\
             curl --cacert {ca} --resolve {sni}:{npt}:127.0.0.1 https://{sni}:{npt}/version\n\
             curl http://127.0.0.1:{npe}/hello\n\n\
             # Source allow-list: the echo Service admits only 127.0.0.1/32 and ::1\n\
             # (annotation nodeport-proxy.k8s.io/source-ranges); from 127.0.0.2 the\n\
             # CONNECT gets 403 and the node port closes unserved; each refusal is counted\n\
             curl -s -o /dev/null -w '%{{http_connect}}\\n' -p -x http://127.0.0.1:{tunneling} --interface 127.0.0.2 http://{echo_auth}:7000/\n\
             curl --interface 127.0.0.2 http://127.0.0.1:{npe}/hello\n\
             curl -s http://127.0.0.1:{stats}/stats/prometheus | grep source_denied\n\n\
             # nodeport-proxy and tunnel-agent connections now and the last closed, with why (admin ports, loopback only)\n\
             curl -s http://127.0.0.1:{admin}/debug/connections\n\
             curl -s http://127.0.0.1:{ta_admin}/debug/connections\n\n\
             # Health and metrics\n\
             curl http://{health}/readyz ; curl -s http://{health}/metrics | grep konnectivity_network_proxy_server\n\
             curl -s http://127.0.0.1:{stats}/stats/prometheus | head\n\n\
             # Konnectivity tunnels open now and the last closed, with why (admin ports, loopback only)\n\
             curl -s http://{server_admin}/debug/connections\n\
             curl -s http://{agent_admin}/debug/connections\n\n\
             Press Ctrl-C to stop everything.\n",
            echo = p.echo,
            kon = p.konnectivity,
            api = p.apiserver,
            sni = DEMO_SNI_HOST,
            sni_port = p.sni,
            tunneling = p.tunneling,
            auth = DEMO_AUTHORITY_HOST,
            echo_auth = DEMO_ECHO_AUTHORITY_HOST,
            ta = p.tunnel_agent,
            npt = p.node_port_tls,
            npe = p.node_port_echo,
            health = self.server_health,
            server_admin = self.server_admin,
            agent_admin = self.agent_admin,
            stats = p.stats,
            admin = p.admin,
            ta_admin = p.tunnel_agent_admin,
        )
    }

    /// Stops every component and waits for them.
    pub async fn stop(mut self) {
        let _ = self.tunnel.shutdown().await;
        let _ = self.nodeport.shutdown().await;
        if let Some(tx) = self.agent_stop.take() {
            let _ = tx.send(());
        }
        if let Some(tx) = self.server_stop.take() {
            let _ = tx.send(());
        }
        self.destinations.start();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    /// Keys and certificates are written 0600 into a 0700 directory.
    #[test]
    fn keys_are_private() -> anyhow::Result<()> {
        let dir = super::private_dir()?;
        let mode = |p: &std::path::Path| -> anyhow::Result<u32> {
            Ok(std::fs::metadata(p)?.permissions().mode() & 0o777)
        };
        assert_eq!(mode(dir.path())?, 0o700);
        let pki = super::pki::Pki::create(dir.path())?;
        let id = pki.server("s", &[])?;
        for f in [pki.ca(), id.cert, id.key] {
            assert_eq!(mode(&f)?, 0o600, "{}", f.display());
        }
        Ok(())
    }
}
